/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_url.c — the one parser of redis:// URLs (core layer; redis_url.h
 * says the form). Strict: every byte is accounted for, and a URL that does
 * not fit is refused with what was wrong, never taken in part. A password
 * that does not fit its buffer is refused, not cut: a cut password would
 * fail AUTH later, far from the cause.
 */
#include "redis_url.h"

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

enum unescaped { UNESCAPED, BAD_ESCAPE, TOO_LONG, CONTROL };

/* Percent-decode [s, s + n) into out (cap bytes with the NUL). */
static enum unescaped unescape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
            int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return BAD_ESCAPE;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c < 0x20 || c == 0x7f)
            return CONTROL;
        if (o + 1 >= cap)
            return TOO_LONG;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return UNESCAPED;
}

/* The detail for a user name or password that did not decode; neither is
 * ever shown. */
static idem_rc credential_fail(enum unescaped u, const char *what, const char *part, size_t max)
{
    switch (u) {
    case BAD_ESCAPE:
        return idem__fail(IDEM_EINVAL, "%s: the %s has a %% not followed by two hex digits",
                          what, part);
    case TOO_LONG:
        return idem__fail(IDEM_EINVAL, "%s: the %s is longer than %zu bytes", what, part, max);
    case CONTROL:
    default:
        return idem__fail(IDEM_EINVAL, "%s: the %s holds a control character", what, part);
    }
}

/* A decimal number in [s, e) within 0..max; -1 otherwise. */
static long number(const char *s, const char *e, long max)
{
    long v = 0;
    if (s == e)
        return -1;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
        if (v > max)
            return -1;
    }
    return v;
}

/* One host[:port] in [p, e): into host (IDEM_REDIS_HOST_MAX + 1 bytes) and
 * *port (port_default when none is written). */
static idem_rc parse_host(const char *p, const char *e, const char *what, const char *usage,
                          char *host_out, int *port, int port_default)
{
    const char *host = p, *host_end;
    if (*p == '[') {
        host = p + 1;
        host_end = memchr(host, ']', (size_t)(e - host));
        if (!host_end)
            return idem__fail(IDEM_EINVAL, "%s: unclosed [ in the host", what);
        p = host_end + 1;
        for (const char *q = host; q < host_end; q++)
            if (hexval(*q) < 0 && *q != ':' && *q != '.')
                return idem__fail(IDEM_EINVAL, "%s: malformed IPv6 address", what);
    } else {
        host_end = memchr(p, ':', (size_t)(e - p));
        if (!host_end)
            host_end = e;
        p = host_end;
        for (const char *q = host; q < host_end; q++)
            if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') ||
                  (*q >= '0' && *q <= '9') || *q == '.' || *q == '-' || *q == '_'))
                return idem__fail(IDEM_EINVAL, "%s: the host may hold letters, digits, '.', "
                                               "'-' and '_'", what);
    }
    if (host == host_end)
        return idem__fail(IDEM_EINVAL, "%s: no host %s", what, usage);
    if ((size_t)(host_end - host) > IDEM_REDIS_HOST_MAX)
        return idem__fail(IDEM_EINVAL, "%s: host longer than %d bytes", what,
                          IDEM_REDIS_HOST_MAX);
    memcpy(host_out, host, (size_t)(host_end - host));
    host_out[host_end - host] = '\0';

    *port = port_default;
    if (p < e && *p == ':') {
        long v = number(p + 1, e, 65535);
        if (v < 1)
            return idem__fail(IDEM_EINVAL, "%s: the port must be 1..65535", what);
        *port = (int)v;
    } else if (p != e) {
        return idem__fail(IDEM_EINVAL, "%s: unexpected text after the host %s", what, usage);
    }
    return IDEM_OK;
}

static int where_of(char *out, size_t cap, const char *host, int port)
{
    return snprintf(out, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

static idem_rc parse(const char *url, const char *what, struct idem__redis_url *u)
{
    static const char usage[] = "(redis://[[user]:password@]host[:port][/db] or "
                                "redis-sentinel://[[user]:password@]host[:port][,host[:port]...]"
                                "/master_name[/db])";
    if (!url)
        return idem__fail(IDEM_EINVAL, "%s: NULL", what);
    int sentinel = strncmp(url, "redis-sentinel://", 17) == 0;
    if (!sentinel && strncmp(url, "redis://", 8) != 0)
        return idem__fail(IDEM_EINVAL, "%s: not a redis:// or redis-sentinel:// URL %s", what,
                          usage);
    const char *p = url + (sentinel ? 17 : 8);
    const char *end = p + strcspn(p, "/");

    /* The last '@' before the path ends the credentials. */
    const char *at = NULL;
    for (const char *q = p; q < end; q++)
        if (*q == '@')
            at = q;
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        enum unescaped r;
        if (!colon)
            return idem__fail(IDEM_EINVAL, "%s: credentials must be user:password or "
                                           ":password %s", what, usage);
        if ((r = unescape(p, (size_t)(colon - p), u->user, sizeof u->user)) != UNESCAPED)
            return credential_fail(r, what, "user name", IDEM_REDIS_USER_MAX);
        if ((r = unescape(colon + 1, (size_t)(at - colon - 1), u->password,
                          sizeof u->password)) != UNESCAPED)
            return credential_fail(r, what, "password", IDEM_REDIS_PASSWORD_MAX);
        if (!u->password[0])
            return idem__fail(IDEM_EINVAL, "%s: empty password", what);
        p = at + 1;
    }

    const char *path = end;
    if (!sentinel) {
        idem_rc rc = parse_host(p, end, what, usage, u->host, &u->port, IDEM_REDIS_PORT_DEFAULT);
        if (rc != IDEM_OK)
            return rc;
        where_of(u->where, sizeof u->where, u->host, u->port);
    } else {
        /* The sentinels, then the master's name as they know it. */
        for (const char *h = p; h <= end; u->sentinels++) {
            const char *e = memchr(h, ',', (size_t)(end - h));
            if (!e)
                e = end;
            if (u->sentinels == IDEM_REDIS_SENTINELS_MAX)
                return idem__fail(IDEM_EINVAL, "%s: more than %d sentinels", what,
                                  IDEM_REDIS_SENTINELS_MAX);
            idem_rc rc = parse_host(h, e, what, usage, u->sentinel[u->sentinels].host,
                                    &u->sentinel[u->sentinels].port,
                                    IDEM_REDIS_SENTINEL_PORT_DEFAULT);
            if (rc != IDEM_OK)
                return rc;
            h = e + 1;
        }
        const char *name = *end == '/' ? end + 1 : end;
        size_t n = strcspn(name, "/");
        if (n == 0)
            return idem__fail(IDEM_EINVAL, "%s: no master name after the sentinels %s", what,
                              usage);
        if (n > IDEM_REDIS_HOST_MAX)
            return idem__fail(IDEM_EINVAL, "%s: master name longer than %d bytes", what,
                              IDEM_REDIS_HOST_MAX);
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)name[i] <= 0x20 || name[i] == 0x7f || name[i] == '%')
                return idem__fail(IDEM_EINVAL, "%s: the master name holds a space, a control "
                                               "character or a %%", what);
        memcpy(u->master, name, n);
        u->master[n] = '\0';
        path = name + n;
        size_t w = (size_t)snprintf(u->where, sizeof u->where, "master %s via ", u->master);
        for (int i = 0; i < u->sentinels && w < sizeof u->where; i++) {
            if (i)
                u->where[w++] = ',';
            if (w < sizeof u->where)
                w += (size_t)where_of(u->where + w, sizeof u->where - w, u->sentinel[i].host,
                                      u->sentinel[i].port);
        }
    }

    u->db = 0;
    if (*path == '/' && path[1]) {
        long db = number(path + 1, path + strlen(path), IDEM_REDIS_DB_MAX);
        if (db < 0)
            return idem__fail(IDEM_EINVAL, "%s: the db must be a number (0..%d) %s", what,
                              IDEM_REDIS_DB_MAX, usage);
        u->db = (int)db;
    }
    return IDEM_OK;
}

idem_rc idem__redis_url_parse(const char *url, const char *what, struct idem__redis_url *out)
{
    memset(out, 0, sizeof *out);
    idem_rc rc = parse(url, what, out);
    if (rc != IDEM_OK)
        idem__redis_url_wipe(out);
    return rc;
}

void idem__redis_url_wipe(struct idem__redis_url *u)
{
    explicit_bzero(u->user, sizeof u->user);
    explicit_bzero(u->password, sizeof u->password);
}

const char *idem__sentinel_master(const struct redisReply *rep, char *host, size_t cap,
                                  int *port)
{
    if (!rep)
        return "no answer";
    if (rep->type == REDIS_REPLY_ERROR)
        return rep->str;
    if (rep->type == REDIS_REPLY_NIL)
        return "no such master";
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
        rep->element[0]->type != REDIS_REPLY_STRING ||
        rep->element[1]->type != REDIS_REPLY_STRING || rep->element[0]->len >= cap)
        return "an answer that is not an address";
    char *end;
    long p = strtol(rep->element[1]->str, &end, 10);
    if (*end || p < 1 || p > 65535)
        return "an answer that is not an address";
    memcpy(host, rep->element[0]->str, rep->element[0]->len + 1);
    *port = (int)p;
    return NULL;
}

int idem__redis_is_master(const struct redisReply *rep)
{
    return rep && rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 &&
           rep->element[0]->type == REDIS_REPLY_STRING && !strcmp(rep->element[0]->str, "master");
}
