/* SPDX-License-Identifier: Apache-2.0 */
/*
 * response.c — building, serialising and failing responses (daemon).
 *
 * Every error the daemon answers goes through problem(): one shape
 * (application/problem+json), a stable type a client can switch on, and a
 * detail a person can act on; a failed Idem call becomes one through
 * problem_from_rc(), for the gateway and the JSON API alike; a JSON answer
 * through json_response().
 */
#include "http/response.h"

#include "http/blocks.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "idem.h"
#include "put.h"
#include "utf8.h"

/* Room in the first block (http/blocks.h) for the headers and body of a
 * typical answer: an upstream's, or a problem of Idem's. */
#define FIRST_BLOCK 1024

struct http_response *response_new(int status)
{
    struct http_block *first;
    struct http_response *r = blocks_new(sizeof *r, FIRST_BLOCK, &first, realloc);
    if (r) {
        r->status = status;
        r->blocks = first;
    }
    return r;
}

void response_free(struct http_response *r)
{
    if (!r)
        return;
    blocks_free(r->blocks); /* the body with them: it is always carved */
    free(r);                /* and the first block with it */
}

int response_add_header_n(struct http_response *r, const char *name, size_t nlen,
                         const char *value, size_t vlen)
{
    if (r->header_count == r->header_cap) {
        size_t cap = r->header_cap ? r->header_cap * 2 : 8;
        struct http_header *h =
            blocks_carve(&r->blocks, cap * sizeof *h, _Alignof(struct http_header), realloc);
        if (!h)
            return -1;
        if (r->header_count)
            memcpy(h, r->headers, r->header_count * sizeof *h);
        r->headers = h;
        r->header_cap = cap;
    }
    /* The name, then the value after the name's NUL. */
    if (nlen > (size_t)-1 - 2 - vlen)
        return -1;
    char *n = blocks_carve(&r->blocks, nlen + vlen + 2, 1, realloc);
    if (!n)
        return -1;
    memcpy(n, name, nlen);
    n[nlen] = '\0';
    char *v = n + nlen + 1;
    memcpy(v, value, vlen);
    v[vlen] = '\0';
    r->headers[r->header_count].name = n;
    r->headers[r->header_count].value = v;
    r->headers[r->header_count].name_len = nlen;
    r->header_count++;
    return 0;
}

int response_add_header(struct http_response *r, const char *name, const char *value)
{
    return response_add_header_n(r, name, strlen(name), value, strlen(value));
}

int response_set_body(struct http_response *r, const void *body, size_t len)
{
    /* A body set again (a problem's text given later) leaves the first in
     * the blocks, freed with them. */
    char *b = len < (size_t)-1 ? blocks_carve(&r->blocks, len + 1, 1, realloc) : NULL;
    if (!b)
        return -1;
    if (len)
        memcpy(b, body, len);
    b[len] = '\0';
    r->body = b;
    r->body_len = len;
    return 0;
}

const char *http_reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 204: return "No Content";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    }
    return "";
}

/* An IMF-fixdate (RFC 9110 5.6.7) of t into out (at least 30 bytes), in
 * English whatever the locale; its length. */
static size_t imf_fixdate(time_t t, char *out)
{
    static const char days[] = "SunMonTueWedThuFriSat";
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    struct tm tm;
    if (!gmtime_r(&t, &tm) || tm.tm_year + 1900 > 9999 || tm.tm_year + 1900 < 0) {
        out[0] = '\0';
        return 0;
    }
    return (size_t)snprintf(out, 30, "%.3s, %02d %.3s %04d %02d:%02d:%02d GMT",
                            days + 3 * tm.tm_wday, tm.tm_mday, months + 3 * tm.tm_mon,
                            tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

size_t http_date(int64_t ms, char *out)
{
    return imf_fixdate((time_t)(ms / 1000), out);
}

/* "Date: Wed, 02 Dec 2026 01:36:13 GMT\r\n" for now, formatted once a
 * second per thread. */
static const char *date_field(size_t *len)
{
    static __thread time_t second = (time_t)-1;
    static __thread char field[48];
    static __thread size_t field_len;
    time_t now = time(NULL);
    if (now != second) {
        char *p = put(field, "Date: ", 6);
        p += imf_fixdate(now, p);
        p = put(p, "\r\n", 2);
        field_len = (size_t)(p - field);
        second = now;
    }
    *len = field_len;
    return field;
}

char *response_serialize(const struct http_response *r, int head_request, size_t *len)
{
    const char *reason = http_reason(r->status);
    size_t cap = 128 + strlen(reason) + r->body_len; /* line, length, close, date */
    int has_date = 0;
    for (size_t i = 0; i < r->header_count; i++) {
        cap += strlen(r->headers[i].name) + strlen(r->headers[i].value) + 4;
        has_date |= strcasecmp(r->headers[i].name, "date") == 0;
    }
    char *out = malloc(cap), *p = out;
    if (!out)
        return NULL;
    p = put(p, "HTTP/1.1 ", 9);
    p = put_uint(p, (unsigned)r->status); /* 100..599 */
    *p++ = ' ';
    p = put_str(p, reason);
    p = put(p, "\r\n", 2);
    for (size_t i = 0; i < r->header_count; i++)
        p = put_field(p, r->headers[i].name, r->headers[i].value, "\r\n");
    /* Every answer has its Date (RFC 9110 8.6): an upstream's own, or
     * this one for those Idem makes and the replays, whose stored headers
     * have none. */
    if (!has_date) {
        size_t dlen;
        const char *d = date_field(&dlen);
        p = put(p, d, dlen);
    }
    /* 1xx, 204 and 304 carry no body and no Content-Length. */
    int bodiless = r->status < 200 || r->status == 204 || r->status == 304;
    if (!bodiless && !(head_request && r->upstream_head)) {
        p = put(p, "Content-Length: ", 16);
        p = put_uint(p, r->body_len);
        p = put(p, "\r\n", 2);
    }
    if (r->close)
        p = put(p, "Connection: close\r\n", 19);
    p = put(p, "\r\n", 2);
    if (!head_request && !bodiless && r->body_len)
        p = put(p, r->body, r->body_len);
    *len = (size_t)(p - out);
    return out;
}

/* Each byte of s that is not part of a whole UTF-8 sequence becomes '?':
 * a detail may quote what a client sent, or be cut mid-character by its
 * buffer, and JSON holds UTF-8 only. */
static void utf8_mend(char *s)
{
    unsigned char *p = (unsigned char *)s, *end = p + strlen(s);
    while (p < end) {
        size_t n = *p < 0x80 ? 1 : utf8_seq_len(p, end);
        if (n == 0)
            *p++ = '?';
        else
            p += n;
    }
}

struct http_response *problem(int status, const char *type, const char *fmt, ...)
{
    char detail[512], urn[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    utf8_mend(detail);
    snprintf(urn, sizeof urn, "urn:idem:%s", type);

    struct http_response *r = response_new(status);
    json_t *j = json_pack("{s:s, s:s, s:i, s:s}", "type", urn, "title", http_reason(status),
                          "status", status, "detail", detail);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!r || !body || response_add_header(r, "Content-Type", "application/problem+json") ||
        response_set_body(r, body, strlen(body))) {
        free(body);
        response_free(r);
        return NULL; /* the front end answers its fixed 503 */
    }
    free(body);
    snprintf(r->problem_type, sizeof r->problem_type, "%s", type);
    return r;
}

/* r's problem body with the members of add (taken; NULL: none for want of
 * memory) set over its own. 0, or -1 (the body stays as it was). */
static int problem_add(struct http_response *r, json_t *add)
{
    json_t *j = add ? json_loadb(r->body, r->body_len, 0, NULL) : NULL;
    int bad = !j || json_object_update(j, add) != 0;
    char *body = bad ? NULL : json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    json_decref(add);
    if (!body || response_set_body(r, body, strlen(body))) {
        free(body);
        return -1;
    }
    free(body);
    return 0;
}

int problem_set_instance(struct http_response *r, const char *request_id)
{
    static const char hex[] = "0123456789ABCDEF";
    if (!r || !request_id || !*request_id)
        return 0;
    char uri[17 + 3 * 80 + 1] = "urn:idem-request:";
    size_t o = strlen(uri);
    for (const unsigned char *p = (const unsigned char *)request_id; *p && o + 4 < sizeof uri;
         p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
            *p == '-' || *p == '.' || *p == '_' || *p == '~') {
            uri[o++] = (char)*p;
        } else {
            uri[o++] = '%';
            uri[o++] = hex[*p >> 4];
            uri[o++] = hex[*p & 15];
        }
    }
    uri[o] = '\0';
    return problem_add(r, json_pack("{s:s}", "instance", uri));
}

int problem_set_claim(struct http_response *r, uint64_t epoch, int64_t held_until_ms)
{
    if (!r)
        return -1;
    char until[80] = "";
    time_t secs = (time_t)(held_until_ms / 1000);
    struct tm tm;
    if (held_until_ms > 0 && gmtime_r(&secs, &tm))
        snprintf(until, sizeof until, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (int)(held_until_ms % 1000));
    return problem_add(r, until[0] ? json_pack("{s:I, s:s}", "epoch", (json_int_t)epoch,
                                               "held_until", until)
                                   : json_pack("{s:I}", "epoch", (json_int_t)epoch));
}

int problem_set_text(struct http_response *r, const char *title, const char *detail)
{
    r->problem_type[0] = '\0';
    if (!title && !detail)
        return 0;
    json_t *j = json_loadb(r->body, r->body_len, 0, NULL);
    /* The text is the configuration's, checked as UTF-8 there: set as it is. */
    int bad = !j || (title && json_object_set_new(j, "title", json_string(title))) ||
              (detail && json_object_set_new(j, "detail", json_string(detail)));
    char *body = bad ? NULL : json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!body || response_set_body(r, body, strlen(body))) {
        free(body);
        return -1;
    }
    free(body);
    return 0;
}

struct http_response *problem_from_rc(idem_rc rc, const char *detail, const char *what)
{
    if (rc == IDEM_EINVAL || rc == IDEM_ETOOBIG)
        return problem(400, "invalid_argument", "%s: %s", what, detail);
    if (rc == IDEM_ECLOSING)
        return problem(503, "shutting_down", "%s: the server is shutting down", what);
    return problem(503, "store_unavailable", "%s: the store failed (%s): %s", what,
                   idem_strerror(rc), detail);
}

struct http_response *problem_from_idem(idem_rc rc, const char *what)
{
    return problem_from_rc(rc, idem_errdetail(), what);
}

struct http_response *json_response(int status, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    struct http_response *r = text ? response_new(status) : NULL;
    if (!r || response_add_header(r, "Content-Type", "application/json") ||
        response_set_body(r, text, strlen(text))) {
        response_free(r);
        r = NULL;
    }
    free(text);
    return r;
}
