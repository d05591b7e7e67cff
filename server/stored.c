/*
 * stored.c — the stored form of a response (daemon).
 *
 *   IDEM1 <status> <header count> <body length>\n
 *   <name>: <value>\n           (header count times)
 *   <body bytes>
 *
 * Header names and values come from the strict parser, so they hold no CR or
 * LF; decoding checks every count and length anyway, because a record may
 * have been written by another program through the JSON API.
 */
#include "stored.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static char *encode(int status, const struct http_header *h, size_t nh,
                    const char *const *keep, size_t nkeep, const char *body, size_t body_len,
                    size_t *len)
{
    size_t cap = 64 + body_len, n = 0;
    for (size_t i = 0; i < nh; i++)
        cap += strlen(h[i].name) + strlen(h[i].value) + 3;
    for (size_t i = 0; i < nh; i++) {
        int kept = !keep;
        for (size_t k = 0; keep && k < nkeep && !kept; k++)
            kept = strcasecmp(h[i].name, keep[k]) == 0;
        n += kept;
    }
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    o += sprintf(o, "IDEM1 %d %zu %zu\n", status, n, body_len);
    for (size_t i = 0; i < nh; i++) {
        int kept = !keep;
        for (size_t k = 0; keep && k < nkeep && !kept; k++)
            kept = strcasecmp(h[i].name, keep[k]) == 0;
        if (kept)
            o += sprintf(o, "%s: %s\n", h[i].name, h[i].value);
    }
    if (body_len)
        memcpy(o, body, body_len);
    *len = (size_t)(o - out) + body_len;
    return out;
}

char *stored_encode(const struct route *rt, int status, const struct http_msg *resp, size_t *len)
{
    return encode(status, resp->headers, resp->header_count,
                  (const char *const *)rt->replay_headers, rt->replay_header_count, resp->body,
                  resp->body_len, len);
}

char *stored_encode_response(const struct http_response *r, size_t *len)
{
    return encode(r->status, r->headers, r->header_count, NULL, 0, r->body, r->body_len, len);
}

struct http_response *stored_decode(const void *bytes, size_t len)
{
    const char *p = bytes, *end = p + len;
    const char *nl = memchr(p, '\n', len);
    if (!nl || nl - p > 64)
        return NULL;
    char head[72];
    memcpy(head, p, (size_t)(nl - p));
    head[nl - p] = '\0';
    int status, used = 0;
    unsigned long nh, body_len;
    char canon[72];
    if (sscanf(head, "IDEM1 %d %lu %lu%n", &status, &nh, &body_len, &used) != 3 ||
        used != nl - p || status < 100 || status > 599 || nh > 1000)
        return NULL;
    /* One spelling only: what stored_encode writes. */
    snprintf(canon, sizeof canon, "IDEM1 %d %lu %lu", status, nh, body_len);
    if (strcmp(canon, head) != 0)
        return NULL;
    struct http_response *r = response_new(status);
    if (!r)
        return NULL;
    p = nl + 1;
    for (unsigned long i = 0; i < nh; i++) {
        nl = memchr(p, '\n', (size_t)(end - p));
        const char *colon = nl ? memchr(p, ':', (size_t)(nl - p)) : NULL;
        if (!colon || colon == p || colon + 1 >= nl || colon[1] != ' ')
            goto bad;
        /* No control byte may reach a header we send: a CR would let
         * whoever wrote the record inject headers into every replay. */
        for (const char *c = p; c < nl; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                goto bad;
        char *name = strndup(p, (size_t)(colon - p));
        char *value = strndup(colon + 2, (size_t)(nl - colon - 2));
        int rc = name && value ? response_add_header(r, name, value) : -1;
        free(name);
        free(value);
        if (rc)
            goto bad;
        p = nl + 1;
    }
    if ((size_t)(end - p) != body_len || response_set_body(r, p, body_len))
        goto bad;
    return r;
bad:
    response_free(r);
    return NULL;
}
