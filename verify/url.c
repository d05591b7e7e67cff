/* SPDX-License-Identifier: Apache-2.0 */
/*
 * url.c — http:// URLs for idem verify: parse, resolve once, and decide
 * whether a URL may be used at all. Every request of a run goes to an
 * address resolved here, at the start, so a name that resolves differently
 * later (DNS rebinding) cannot send the storm somewhere else.
 */
#include "url.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int is_host_char(int ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '-' || ch == '_';
}

static int is_v6_char(int ch)
{
    return (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F') || (ch >= '0' && ch <= '9') ||
           ch == ':' || ch == '.';
}

int vurl_parse(const char *text, struct vurl *u, char *err, size_t errlen)
{
    memset(u, 0, sizeof *u);
    u->port = 80;
    if (strncasecmp(text, "https://", 8) == 0) {
        u->tls = 1;
        u->port = 443;
    } else if (strncasecmp(text, "http://", 7) != 0) {
        snprintf(err, errlen, "%s: not an http:// or https:// URL (expected "
                 "http://host[:port]/path)", text);
        return -1;
    }
    const char *a = text + (u->tls ? 8 : 7);
    size_t alen = strcspn(a, "/?#");
    const char *rest = a + alen;
    if (memchr(a, '@', alen)) {
        snprintf(err, errlen, "%s: user:password@ in a URL is not supported; use -H", text);
        return -1;
    }
    if (memchr(a, '{', alen) || memchr(a, '}', alen)) {
        snprintf(err, errlen, "%s: placeholders may be used in the path and query only", text);
        return -1;
    }
    const char *h = a, *hend, *port = NULL;
    if (*a == '[') {
        const char *close = memchr(a, ']', alen);
        if (!close) {
            snprintf(err, errlen, "%s: an IPv6 address needs its closing ]", text);
            return -1;
        }
        h = a + 1;
        hend = close;
        for (const char *c = h; c < hend; c++)
            if (!is_v6_char((unsigned char)*c)) {
                snprintf(err, errlen, "%s: bad IPv6 address", text);
                return -1;
            }
        if (close + 1 < a + alen) {
            if (close[1] != ':') {
                snprintf(err, errlen, "%s: expected :port after the IPv6 address", text);
                return -1;
            }
            port = close + 2;
        }
    } else {
        const char *colon = memchr(a, ':', alen);
        hend = colon ? colon : a + alen;
        port = colon ? colon + 1 : NULL;
        for (const char *c = h; c < hend; c++)
            if (!is_host_char((unsigned char)*c)) {
                snprintf(err, errlen, "%s: bad character '%c' in the host", text, *c);
                return -1;
            }
    }
    size_t hlen = (size_t)(hend - h);
    if (hlen == 0 || hlen > VURL_HOST_MAX) {
        snprintf(err, errlen, "%s: %s host", text, hlen ? "an over-long" : "no");
        return -1;
    }
    memcpy(u->host, h, hlen);
    u->host[hlen] = '\0';
    if (port) {
        size_t plen = (size_t)(a + alen - port);
        long v = 0;
        if (plen == 0 || plen > 5 || strspn(port, "0123456789") < plen) {
            snprintf(err, errlen, "%s: the port must be a number from 1 to 65535", text);
            return -1;
        }
        for (size_t i = 0; i < plen; i++)
            v = v * 10 + (port[i] - '0');
        if (v < 1 || v > 65535) {
            snprintf(err, errlen, "%s: the port must be a number from 1 to 65535", text);
            return -1;
        }
        u->port = (int)v;
    }
    int v6 = strchr(u->host, ':') != NULL;
    if (u->port == (u->tls ? 443 : 80))
        snprintf(u->authority, sizeof u->authority, v6 ? "[%s]" : "%s", u->host);
    else
        snprintf(u->authority, sizeof u->authority, v6 ? "[%s]:%d" : "%s:%d", u->host, u->port);

    if (strchr(rest, '#')) {
        snprintf(err, errlen, "%s: a #fragment is never sent to a server; remove it", text);
        return -1;
    }
    for (const char *c = rest; *c; c++)
        if ((unsigned char)*c <= ' ' || *c == 0x7f) {
            snprintf(err, errlen,
                     "%s: a space or control character at byte %zu; percent-encode it", text,
                     (size_t)(c - text));
            return -1;
        }
    size_t rlen = strlen(rest);
    u->target = malloc(rlen + 2);
    if (!u->target) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (*rest == '/')
        memcpy(u->target, rest, rlen + 1);
    else
        snprintf(u->target, rlen + 2, "/%s", rest);
    return 0;
}

static int addr_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        return (ntohl(s4->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
        if (IN6_IS_ADDR_LOOPBACK(&s6->sin6_addr))
            return 1;
        return IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr) && s6->sin6_addr.s6_addr[12] == 127;
    }
    return 0;
}

int vurl_resolve(struct vurl *u, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    char port[8];
    snprintf(port, sizeof port, "%d", u->port);
    int rc = getaddrinfo(u->host, port, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "cannot resolve %s: %s", u->host,
                 rc ? gai_strerror(rc) : "no address");
        return -1;
    }
    memcpy(&u->addr, res->ai_addr, res->ai_addrlen);
    u->addrlen = res->ai_addrlen;
    u->loopback = addr_is_loopback(&u->addr);
    freeaddrinfo(res);
    return 0;
}

static int same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return 0;
}

int vurl_allowed(const struct vurl *u, const struct vurl *target)
{
    return strcasecmp(u->host, target->host) == 0 || u->loopback ||
           same_ip(&u->addr, &target->addr);
}

const char *vurl_addr_text(const struct vurl *u, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    if (u->addr.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((const struct sockaddr_in *)&u->addr)->sin_addr, ip, sizeof ip);
        snprintf(buf, len, "%s:%d", ip, u->port);
    } else if (u->addr.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)&u->addr)->sin6_addr, ip, sizeof ip);
        snprintf(buf, len, "[%s]:%d", ip, u->port);
    } else {
        snprintf(buf, len, "%s", u->authority);
    }
    return buf;
}

void vurl_free(struct vurl *u)
{
    free(u->target);
    u->target = NULL;
}
