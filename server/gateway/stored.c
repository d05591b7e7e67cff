/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stored.c — the stored form of a response (daemon).
 *
 *   IDEM1 <status> <header count> <body length>\n
 *   <name>: <value>\n           (header count times)
 *   <body bytes>
 *
 * Header names and values come from the strict parser, so they hold no CR or
 * LF; decoding checks every count and length anyway, and each header line,
 * because a record may have been written by another program through the
 * JSON API, or by an earlier Idem: what it decodes is sent to clients.
 */
#include "gateway/stored.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "put.h"

/* Header h[i] is stored: one of keep (all, without keep), and not a
 * hop-by-hop header of m's (the names its Connection header lists are, and
 * the client that was answered first did not get them either). */
static int stored_header(const struct http_msg *m, const struct http_header *h,
                         const char *const *keep, size_t nkeep)
{
    int kept = !keep;
    for (size_t k = 0; keep && k < nkeep && !kept; k++)
        kept = strcasecmp(h->name, keep[k]) == 0;
    return kept && http_is_replayable_name(m, h->name);
}

static char *encode(int status, const struct http_msg *m, const struct http_header *h, size_t nh,
                    const char *const *keep, size_t nkeep, const char *body, size_t body_len,
                    size_t *len)
{
    size_t cap = 64 + body_len, n = 0;
    for (size_t i = 0; i < nh; i++)
        cap += strlen(h[i].name) + strlen(h[i].value) + 3;
    for (size_t i = 0; i < nh; i++)
        n += stored_header(m, &h[i], keep, nkeep);
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    o = put(o, "IDEM1 ", 6);
    o = put_uint(o, (unsigned)status); /* 200..599 */
    *o++ = ' ';
    o = put_uint(o, n);
    *o++ = ' ';
    o = put_uint(o, body_len);
    *o++ = '\n';
    for (size_t i = 0; i < nh; i++)
        if (stored_header(m, &h[i], keep, nkeep))
            o = put_field(o, h[i].name, h[i].value, "\n");
    if (body_len)
        memcpy(o, body, body_len);
    *len = (size_t)(o - out) + body_len;
    return out;
}

char *stored_encode(const struct route *rt, int status, const struct http_msg *resp, size_t *len)
{
    return encode(status, resp, resp->headers, resp->header_count,
                  (const char *const *)rt->replay_headers, rt->replay_header_count, resp->body,
                  resp->body_len, len);
}

char *stored_encode_response(const struct http_response *r, size_t *len)
{
    return encode(r->status, NULL, r->headers, r->header_count, NULL, 0, r->body, r->body_len,
                  len);
}

/* A number as stored_encode writes it: decimal digits, no leading zero, at
 * most 18 of them; then the byte stop. Moves *p past the stop. */
static int take_number(const char **p, const char *end, char stop, unsigned long long *out)
{
    const char *s = *p;
    unsigned long long v = 0;
    size_t n = 0;
    while (s + n < end && s[n] >= '0' && s[n] <= '9' && n < 19)
        v = v * 10 + (unsigned)(s[n++] - '0');
    if (n == 0 || n > 18 || (n > 1 && s[0] == '0') || s + n >= end || s[n] != stop)
        return -1;
    *out = v;
    *p = s + n + 1;
    return 0;
}

/* A header line Idem could have stored: what the parser takes, a token for
 * a name and field text for a value (a CR or LF would let whoever wrote the
 * record add headers to every replay, a NUL cut it short). */
static int well_formed(const char *name, size_t name_len, const char *value, size_t value_len)
{
    return http_is_token(name, name_len) && http_is_field_text(value, value_len);
}

/* And one a replay sends: not one that frames the message or belongs to one
 * connection. Content-Length is set for each reply; Transfer-Encoding,
 * Connection and the other hop-by-hop headers would have the client, or a
 * proxy before it, read the reply otherwise than Idem sends it. Such a line
 * (from the JSON API, or an earlier Idem) is left out of the replay. */
static int sent(const char *name, size_t name_len)
{
    char copy[32]; /* NUL-terminated, for the name checks */
    if (name_len >= sizeof copy)
        return 1; /* longer than every name they refuse */
    memcpy(copy, name, name_len);
    copy[name_len] = '\0';
    return http_is_replayable_name(NULL, copy);
}

struct http_response *stored_decode(const void *bytes, size_t len)
{
    const char *p = bytes, *end = p + len;
    unsigned long long status, nh, body_len;
    /* One spelling only: what stored_encode writes. */
    if (len < 6 || memcmp(p, "IDEM1 ", 6) != 0)
        return NULL;
    p += 6;
    if (take_number(&p, end, ' ', &status) || take_number(&p, end, ' ', &nh) ||
        take_number(&p, end, '\n', &body_len) || status < 200 || status > 599 || nh > 1000)
        return NULL;
    struct http_response *r = response_new((int)status);
    if (!r)
        return NULL;
    for (unsigned long long i = 0; i < nh; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *colon = nl ? memchr(p, ':', (size_t)(nl - p)) : NULL;
        if (!colon || colon == p || colon + 1 >= nl || colon[1] != ' ' ||
            !well_formed(p, (size_t)(colon - p), colon + 2, (size_t)(nl - colon - 2)))
            goto bad;
        if (sent(p, (size_t)(colon - p)) &&
            response_add_header_n(r, p, (size_t)(colon - p), colon + 2,
                                  (size_t)(nl - colon - 2)))
            goto bad;
        p = nl + 1;
    }
    if ((unsigned long long)(end - p) != body_len || response_set_body(r, p, (size_t)body_len))
        goto bad;
    return r;
bad:
    response_free(r);
    return NULL;
}
