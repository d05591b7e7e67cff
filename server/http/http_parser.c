/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_parser.c — the HTTP/1.1 message parser of idem serve. It turns the
 * bytes of a client connection into requests, and the bytes of an upstream
 * connection into responses, one message at a time, fed in whatever pieces
 * the socket delivers. It sits under the daemon's connection code, knows
 * nothing of sockets or of libidem, and needs only libc.
 *
 * Strict on purpose. Idem stands in front of payment services: if Idem and
 * the upstream could disagree on where a message ends, a client could hide a
 * second request in the first one's body (request smuggling) and have it
 * executed behind Idem's back, without an idempotency check. So every
 * ambiguity that RFC 9112 lets a recipient tolerate is refused instead, with
 * the status to answer: bare CR or LF, line folding, whitespace before a
 * colon, two framings at once, a repeated Content-Length, transfer codings
 * other than chunked, a Transfer-Encoding on HTTP/1.0. A refused message ends
 * the connection; nothing is ever "repaired" and forwarded.
 *
 * Decisions a caller must know:
 *  - Content-Length must appear once, as a single number. Repeated headers
 *    or a list ("5, 5") are refused even when the values agree: the daemon
 *    then never has to decide which copy to forward.
 *  - A Connection header that names Content-Length or Host is refused: it
 *    would make http_is_hop_by_hop() strip the framing when forwarding.
 *  - Requests: exactly one Host on HTTP/1.1, at most one on HTTP/1.0 (RFC
 *    9112 §3.2 makes both a MUST-400).
 *  - 1xx responses come back as messages of their own (no body); the caller
 *    skips them, resets and feeds on. After a 101 the stream is no longer
 *    HTTP and the caller must stop feeding it here.
 *  - In response mode every error is 502 (out of memory stays 500, a body
 *    over body_max stays 413 and a head over the field limits 431, so the
 *    caller can tell "answered, too big" from "answered wrong"): whatever
 *    the upstream got wrong, the client is answered "bad gateway".
 *  - header_bytes_max counts the bytes of all field lines, head and trailers
 *    together, without their CRLFs; header_count_max counts head and trailer
 *    fields together.
 *  - A parsed message owns its memory in a few blocks (m->blocks,
 *    http/blocks.h): the message and its first block are one allocation,
 *    which holds the strings (method, target, reason, each header's name
 *    and value), the header array and a small body of known length of a
 *    typical message; what does not fit goes into further blocks, never
 *    moved, so every pointer stays valid until http_msg_free(). A body
 *    that grows as it arrives (chunked, or delimited by the close) is a
 *    heap block of its own. A message built by hand (blocks NULL) has each
 *    string as a heap block (a header's name the block, its value after
 *    the name's NUL); http_msg_free() frees either kind. A caller changes
 *    neither.
 *  - response_to_head is cleared by http_parser_reset(): set it after the
 *    reset, before feeding the response.
 *
 * The states (p->state) and every transition; all go through enter():
 *
 *   S_START ──start line──► S_HEADERS ──empty line──┬─ no body ──────────────────► S_DONE
 *    ↺ up to 8 empty lines                          ├─ Content-Length ─► S_BODY ──► S_DONE
 *      before a request line                        ├─ chunked ─► S_CHUNK_SIZE ◄─────── LF ──┐
 *                                                   │              │    └─ size 0 ─┐          │
 *                                                   │      size > 0▼               ▼          │
 *                                                   │      S_CHUNK_DATA        S_TRAILERS     │
 *                                                   │              │               └─ empty ──┼─► S_DONE
 *                                                   │   all of it  ▼                          │
 *                                                   │      S_CHUNK_CR ──CR──► S_CHUNK_LF ─────┘
 *                                                   └─ neither (responses only)
 *                                                          ─► S_BODY_EOF ──eof()──► S_DONE
 *   any state ──bad input, a limit, out of memory──► S_ERROR
 *   any state ──http_parser_reset()──► S_START
 *
 * Invariants: in the line states (S_START, S_HEADERS, S_CHUNK_SIZE,
 * S_TRAILERS) p->line holds the current line so far, within the limit of the
 * state, and a CR can only be its last byte (the next byte must be LF).
 * p->msg exists from the start line until it is taken or the parser fails.
 * Errors are decided at the earliest byte that makes the input wrong, so any
 * split of the input into pieces gives the same result.
 */
#include "http/http_parser.h"

#include "http/blocks.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum state {
    S_START,
    S_HEADERS,
    S_BODY,
    S_CHUNK_SIZE,
    S_CHUNK_DATA,
    S_CHUNK_CR,
    S_CHUNK_LF,
    S_TRAILERS,
    S_BODY_EOF,
    S_DONE,
    S_ERROR,
};

/* RFC 9112 §2.2 asks a server to ignore at least one empty line before a
 * request line (old clients sent a CRLF after a POST body); a few more are
 * harmless, an endless stream of them is not. */
#define BLANK_LINES_MAX 8
/* A chunk-size line: 16 hex digits (2^64 - 1) and extensions, which are
 * ignored but must not become a way around the limits. */
#define CHUNK_DIGITS_MAX 16
#define CHUNK_LINE_MAX 4096

#define LINE_CAP_MIN 256
#define HEADERS_CAP_MIN 16
#define BODY_CAP_MIN 1024
/* A message's first block (see "memory"): room for the head and body of a
 * typical request or answer, so that one allocation serves it. */
#define FIRST_BLOCK 1536

static const struct http_limits default_limits = {
    .request_line_max = 8192,
    .header_count_max = 100,
    .header_bytes_max = 65536,
    .body_max = 1024 * 1024,
};

/* ---- states -------------------------------------------------------------- */

#define BIT(s) (1u << (s))
static const unsigned allowed_next[] = {
    [S_START] = BIT(S_HEADERS),
    [S_HEADERS] = BIT(S_BODY) | BIT(S_CHUNK_SIZE) | BIT(S_BODY_EOF) | BIT(S_DONE),
    [S_BODY] = BIT(S_DONE),
    [S_CHUNK_SIZE] = BIT(S_CHUNK_DATA) | BIT(S_TRAILERS),
    [S_CHUNK_DATA] = BIT(S_CHUNK_CR),
    [S_CHUNK_CR] = BIT(S_CHUNK_LF),
    [S_CHUNK_LF] = BIT(S_CHUNK_SIZE),
    [S_TRAILERS] = BIT(S_DONE),
    [S_BODY_EOF] = BIT(S_DONE),
    [S_DONE] = 0,
    [S_ERROR] = 0,
};

static void enter(struct http_parser *p, enum state to)
{
    assert(to == S_START || to == S_ERROR || (allowed_next[p->state] & BIT(to)));
    (void)allowed_next; /* read by the assertion only */
    p->state = (int)to;
}

/* ---- memory -------------------------------------------------------------- */

static void *xrealloc(struct http_parser *p, void *ptr, size_t n)
{
    return p->realloc_fn ? p->realloc_fn(ptr, n) : realloc(ptr, n);
}

/* n bytes of p->msg's blocks (http/blocks.h), aligned to align. */
static void *carve(struct http_parser *p, size_t n, size_t align)
{
    return blocks_carve(&p->msg->blocks, n, align, p->realloc_fn ? p->realloc_fn : realloc);
}

static char *carve_str(struct http_parser *p, const char *s, size_t n)
{
    char *d = n < (size_t)-1 ? carve(p, n + 1, 1) : NULL;
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* The body's buffer of n bytes, in the blocks: for a body whose length is
 * known before it arrives (and the empty body's NUL). */
static int carve_body(struct http_parser *p, size_t n)
{
    struct http_msg *m = p->msg;
    if (!(m->body = carve(p, n, 1)))
        return 0;
    m->blocks->body = 1;
    p->body_cap = n;
    return 1;
}

/* Make a buffer exactly n bytes long. */
static int resize(struct http_parser *p, char **buf, size_t *cap, size_t n)
{
    char *b = xrealloc(p, *buf, n);
    if (!b)
        return 0;
    *buf = b;
    *cap = n;
    return 1;
}

/* Make room for need bytes, at least doubling (and at least min), so that a
 * connection's many lines cost few allocations. */
static int reserve(struct http_parser *p, char **buf, size_t *cap, size_t need, size_t min)
{
    if (need <= *cap)
        return 1;
    size_t n = *cap <= (size_t)-1 / 2 ? *cap * 2 : need;
    if (n < min)
        n = min;
    return resize(p, buf, cap, n > need ? n : need);
}

/* ---- errors -------------------------------------------------------------- */

/* Refuse the message: status to answer, a sentence for the problem detail.
 * Whatever an upstream gets wrong, the client is told 502; a body or a head
 * over the limits stays 413 or 431 (the upstream did answer: its request
 * executed). */
__attribute__((format(printf, 3, 4))) static enum http_parse_status
fail(struct http_parser *p, int status, const char *fmt, ...)
{
    if (p->mode == HTTP_PARSE_RESPONSE && status != 500 && status != 413 && status != 431)
        status = 502;
    p->error_status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->error_detail, sizeof p->error_detail, fmt, ap);
    va_end(ap);
    /* What was read stays until reset, for the log line about the refusal
     * (http_parser_partial); it is never handed out as a message. */
    enter(p, S_ERROR);
    return HTTP_ERROR;
}

static enum http_parse_status oom(struct http_parser *p)
{
    return fail(p, 500, "out of memory while reading the %s",
                p->mode == HTTP_PARSE_REQUEST ? "request" : "response");
}

/* Which line is being read, for details: "header line 3". */
static const char *where(const struct http_parser *p, char *buf, size_t n)
{
    switch ((enum state)p->state) {
    case S_START:
        return p->mode == HTTP_PARSE_REQUEST ? "request line" : "status line";
    case S_HEADERS:
        snprintf(buf, n, "header line %zu", p->field_count + 1);
        return buf;
    case S_TRAILERS:
        snprintf(buf, n, "trailer line %zu", p->field_count - p->msg->header_count + 1);
        return buf;
    case S_CHUNK_SIZE:
        return "chunk-size line";
    default:
        return "message";
    }
}

/* ---- characters ---------------------------------------------------------- */

/* tchar (RFC 9110 §5.6.2): what methods, field names and tokens are made of. */
static int is_tchar(unsigned char c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
        return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

int http_is_token(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!is_tchar((unsigned char)s[i]))
            return 0;
    return len > 0;
}

/* What a line of the head may contain: HTAB, SP, visible ASCII and obs-text.
 * Every other control character (NUL above all, which C code downstream
 * would read as the end of a string) is refused wherever it appears. */
static int is_line_char(unsigned char c)
{
    return c == '\t' || (c >= 0x20 && c != 0x7f);
}

int http_is_field_text(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!is_line_char((unsigned char)s[i]))
            return 0;
    return 1;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t';
}

int http_hex_value(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Does the comma-separated list hold this token (case-insensitively)? */
static int list_has(const char *list, const char *tok, size_t toklen)
{
    const char *s = list;
    while (*s) {
        while (*s == ',' || is_ws(*s))
            s++;
        const char *e = s;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > s && is_ws(t[-1]))
            t--;
        if ((size_t)(t - s) == toklen && strncasecmp(s, tok, toklen) == 0)
            return 1;
        s = e;
    }
    return 0;
}

static int connection_has(const struct http_msg *m, const char *tok)
{
    size_t len = strlen(tok);
    for (size_t i = 0; i < m->header_count; i++)
        if (m->headers[i].name_len == 10 && strcasecmp(m->headers[i].name, "connection") == 0 &&
            list_has(m->headers[i].value, tok, len))
            return 1;
    return 0;
}

/* ---- lines --------------------------------------------------------------- */

/*
 * Add bytes of data, from *pos on, to the line being assembled. 1: a line is
 * complete (in p->line, NUL-terminated, without its CRLF); 0: all input is
 * used and the line goes on; -1: refused.
 *
 * Only CRLF ends a line. A bare LF or a bare CR is refused rather than taken
 * as a line end, because some parsers take it and some do not: a header
 * hidden behind a bare LF is exactly what two parsers read differently.
 */
static int take_line(struct http_parser *p, const char *data, size_t len, size_t *pos)
{
    size_t max;
    switch ((enum state)p->state) {
    case S_START:
        max = p->limits.request_line_max;
        break;
    case S_CHUNK_SIZE:
        max = CHUNK_LINE_MAX;
        break;
    default: /* field lines: what is left of the header budget */
        max = p->limits.header_bytes_max - p->header_bytes;
        break;
    }

    char buf[32];
    size_t i = *pos;
    while (i < len) {
        unsigned char c = (unsigned char)data[i];
        if (p->line_len > 0 && p->line[p->line_len - 1] == '\r') {
            *pos = i + 1;
            if (c != '\n') {
                fail(p, 400, "%s: CR not followed by LF", where(p, buf, sizeof buf));
                return -1;
            }
            p->line[--p->line_len] = '\0';
            return 1;
        }
        size_t j = i;
        while (j < len && is_line_char((unsigned char)data[j]))
            j++;
        if (j > i) {
            size_t n = j - i;
            if (n > max - p->line_len) {
                *pos = i + (max - p->line_len);
                if (p->state == S_START)
                    fail(p, 414, "the %s is longer than %zu bytes",
                         where(p, buf, sizeof buf), max);
                else if (p->state == S_CHUNK_SIZE)
                    fail(p, 400, "a chunk-size line is longer than %d bytes", CHUNK_LINE_MAX);
                else
                    fail(p, 431, "the header fields are larger than %zu bytes",
                         p->limits.header_bytes_max);
                return -1;
            }
            if (!reserve(p, &p->line, &p->line_cap, p->line_len + n + 1, LINE_CAP_MIN)) {
                oom(p);
                return -1;
            }
            memcpy(p->line + p->line_len, data + i, n);
            p->line_len += n;
            i = j;
            continue;
        }
        *pos = i;
        if (c == '\r') {
            if (!reserve(p, &p->line, &p->line_cap, p->line_len + 2, LINE_CAP_MIN)) {
                oom(p);
                return -1;
            }
            p->line[p->line_len++] = '\r';
            i++;
            continue;
        }
        if (c == '\n')
            fail(p, 400, "%s: LF without CR (lines must end in CRLF)", where(p, buf, sizeof buf));
        else if (c == 0)
            fail(p, 400, "%s: NUL byte", where(p, buf, sizeof buf));
        else
            fail(p, 400, "%s: control character 0x%02x", where(p, buf, sizeof buf), c);
        return -1;
    }
    *pos = i;
    return 0;
}

/* ---- the start line ------------------------------------------------------ */

/* "HTTP/1.1" → 1, "HTTP/1.0" → 0; another well-formed version → -2; not a
 * version at all → -1. */
static int parse_version(const char *s, size_t n)
{
    if (n != 8 || memcmp(s, "HTTP/", 5) != 0 || s[6] != '.' || s[5] < '0' || s[5] > '9' ||
        s[7] < '0' || s[7] > '9')
        return -1;
    if (s[5] == '1' && (s[7] == '0' || s[7] == '1'))
        return s[7] - '0';
    return -2;
}

static struct http_msg *new_msg(struct http_parser *p)
{
    struct http_block *first;
    struct http_msg *m = blocks_new(sizeof *m, FIRST_BLOCK, &first,
                                    p->realloc_fn ? p->realloc_fn : realloc);
    if (m)
        m->blocks = first;
    return m;
}

/* METHOD SP request-target SP HTTP-version, with exactly one SP between the
 * parts: a parser that splits on runs of whitespace would read "GET  /a"
 * or "GET /a\t/b" differently from one that does not. */
static enum http_parse_status on_request_line(struct http_parser *p)
{
    const char *s = p->line;
    size_t n = p->line_len;
    const char *sp1 = memchr(s, ' ', n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - s)) : NULL;
    if (!sp2)
        return fail(p, 400, "the request line is not \"METHOD target HTTP/1.1\"");
    size_t mlen = (size_t)(sp1 - s);
    const char *target = sp1 + 1;
    size_t tlen = (size_t)(sp2 - target);
    const char *version = sp2 + 1;
    size_t vlen = n - (size_t)(version - s);

    if (mlen == 0)
        return fail(p, 400, "the request line starts with a space");
    for (size_t i = 0; i < mlen; i++)
        if (!is_tchar((unsigned char)s[i]))
            return fail(p, 400, "the method contains a character that is not allowed");
    if (tlen == 0)
        return fail(p, 400, "the request line has two spaces where one belongs");
    for (size_t i = 0; i < tlen; i++)
        if ((unsigned char)target[i] <= 0x20 || (unsigned char)target[i] >= 0x7f)
            return fail(p, 400, "the request target contains a character that is not allowed");

    int minor = parse_version(version, vlen);
    if (minor == -2)
        return fail(p, 505, "HTTP version %.*s is not supported (HTTP/1.0 and HTTP/1.1 are)",
                    (int)vlen, version);
    if (minor < 0)
        return fail(p, 400, "the request line does not end in an HTTP version");

    /* Only origin-form ("/path?query") and, for OPTIONS, "*". The daemon
     * routes on the path; an absolute-form target would carry a second,
     * possibly different, host. */
    if (target[0] != '/') {
        if (tlen != 1 || target[0] != '*')
            return fail(p, 400, "the request target must be a path starting with '/'");
        if (mlen != 7 || memcmp(s, "OPTIONS", 7) != 0)
            return fail(p, 400, "the request target '*' is only allowed with OPTIONS");
    }

    struct http_msg *m = new_msg(p);
    if (!m)
        return oom(p);
    p->msg = m;
    m->version_minor = minor;
    m->method = carve_str(p, s, mlen);
    m->target = carve_str(p, target, tlen);
    if (!m->method || !m->target)
        return oom(p);
    enter(p, S_HEADERS);
    return HTTP_NEED_MORE;
}

/* HTTP-version SP 3DIGIT SP [reason], also without the second SP when there
 * is no reason ("HTTP/1.1 200"), which servers send. */
static enum http_parse_status on_status_line(struct http_parser *p)
{
    const char *s = p->line;
    size_t n = p->line_len;
    int minor = parse_version(s, n < 8 ? n : 8);
    if (minor == -2)
        return fail(p, 505, "HTTP version %.8s is not supported", s);
    if (minor < 0 || n < 12 || s[8] != ' ')
        return fail(p, 502, "the status line is not \"HTTP/1.1 200 reason\"");
    if (s[9] < '1' || s[9] > '5' || s[10] < '0' || s[10] > '9' || s[11] < '0' || s[11] > '9')
        return fail(p, 502, "the status code is not a number from 100 to 599");
    if (n > 12 && s[12] != ' ')
        return fail(p, 502, "the status code is not followed by a space");
    const char *reason = n > 13 ? s + 13 : s + n;
    size_t rlen = n > 13 ? n - 13 : 0;

    struct http_msg *m = new_msg(p);
    if (!m)
        return oom(p);
    p->msg = m;
    m->version_minor = minor;
    m->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    m->reason = carve_str(p, reason, rlen);
    if (!m->reason)
        return oom(p);
    enter(p, S_HEADERS);
    return HTTP_NEED_MORE;
}

/* ---- header and trailer fields ------------------------------------------- */

/* Content-Length = 1*DIGIT, and here exactly once. No sign, no list, no
 * whitespace inside: every variation is a way for two parsers to disagree. */
static enum http_parse_status on_content_length(struct http_parser *p, const char *v)
{
    if (p->content_length >= 0)
        return fail(p, 400, "Content-Length is given more than once");
    if (*v == '\0')
        return fail(p, 400, "Content-Length is empty");
    int64_t n = 0;
    for (const char *c = v; *c; c++) {
        if (*c < '0' || *c > '9')
            return fail(p, 400, strchr(v, ',') ? "Content-Length is a list, not one number"
                                               : "Content-Length is not a number");
        if (n > (INT64_MAX - (*c - '0')) / 10)
            return fail(p, 400, "Content-Length is too large");
        n = n * 10 + (*c - '0');
    }
    p->content_length = n;
    return HTTP_NEED_MORE;
}

static enum http_parse_status add_header(struct http_parser *p, const char *name, size_t nlen,
                                         const char *value, size_t vlen)
{
    struct http_msg *m = p->msg;
    size_t count = m->header_count;
    /* The array's capacity is implied by the count: 16, then each power of two. */
    if (count == 0 || (count >= HEADERS_CAP_MIN && (count & (count - 1)) == 0)) {
        size_t cap = count ? count * 2 : HEADERS_CAP_MIN;
        struct http_header *h = carve(p, cap * sizeof *h, _Alignof(struct http_header));
        if (!h)
            return oom(p);
        if (count)
            memcpy(h, m->headers, count * sizeof *h);
        m->headers = h;
    }
    /* The name, then the value after the name's NUL. */
    char *n = carve(p, nlen + vlen + 2, 1);
    if (!n)
        return oom(p);
    memcpy(n, name, nlen);
    n[nlen] = '\0';
    char *v = n + nlen + 1;
    memcpy(v, value, vlen);
    v[vlen] = '\0';
    m->headers[count].name = n;
    m->headers[count].value = v;
    m->headers[count].name_len = nlen;
    m->header_count = count + 1;

    if (nlen == 14 && strcasecmp(n, "content-length") == 0)
        return on_content_length(p, v);
    if (nlen == 17 && strcasecmp(n, "transfer-encoding") == 0)
        p->have_te = (p->have_te == 0 && strcasecmp(v, "chunked") == 0) ? 1 : 2;
    return HTTP_NEED_MORE;
}

/* name ":" OWS value OWS. A field line of the head is kept; a trailer line
 * is checked the same way and counted, then dropped. */
static enum http_parse_status on_field_line(struct http_parser *p)
{
    char buf[32];
    const char *s = p->line;
    size_t n = p->line_len;

    /* field_count counts the lines before this one until it passes. */
    if (p->field_count + 1 > p->limits.header_count_max)
        return fail(p, 431, "more than %zu header fields", p->limits.header_count_max);
    p->header_bytes += n;

    /* obs-fold: a continuation line. Some parsers join it to the previous
     * value, some take it as a field of its own. */
    if (is_ws(s[0]))
        return fail(p, 400, "%s: starts with whitespace (obsolete line folding)",
                    where(p, buf, sizeof buf));
    size_t k = 0;
    while (k < n && is_tchar((unsigned char)s[k]))
        k++;
    if (k == n)
        return fail(p, 400, "%s: no colon", where(p, buf, sizeof buf));
    if (is_ws(s[k]))
        return fail(p, 400, "%s: whitespace before the colon", where(p, buf, sizeof buf));
    if (s[k] != ':')
        return fail(p, 400, "%s: the field name contains a character that is not allowed",
                    where(p, buf, sizeof buf));
    if (k == 0)
        return fail(p, 400, "%s: empty field name", where(p, buf, sizeof buf));

    size_t v = k + 1, e = n;
    while (v < e && is_ws(s[v]))
        v++;
    while (e > v && is_ws(s[e - 1]))
        e--;
    p->field_count++;
    if (p->state == S_TRAILERS)
        return HTTP_NEED_MORE;
    return add_header(p, s, k, s + v, e - v);
}

/* ---- body framing -------------------------------------------------------- */

static enum http_parse_status finish(struct http_parser *p)
{
    struct http_msg *m = p->msg;
    /* No body yet: the empty one's NUL, in the blocks. */
    int room = m->body ? reserve(p, &m->body, &p->body_cap, m->body_len + 1, 1) : carve_body(p, 1);
    if (!room)
        return oom(p);
    m->body[m->body_len] = '\0';
    enter(p, S_DONE);
    return HTTP_DONE;
}

/* The head is complete: check what applies to the whole head, then decide
 * how the body is delimited (RFC 9112 §6.3). */
static enum http_parse_status on_head_end(struct http_parser *p)
{
    struct http_msg *m = p->msg;
    int request = p->mode == HTTP_PARSE_REQUEST;

    if (request) {
        size_t hosts = http_msg_header_count(m, "host");
        if (hosts > 1)
            return fail(p, 400, "the Host header is given more than once");
        if (hosts == 0 && m->version_minor == 1)
            return fail(p, 400, "an HTTP/1.1 request without a Host header");
    }
    if (connection_has(m, "content-length") || connection_has(m, "host"))
        return fail(p, 400, "the Connection header names an end-to-end field");

    int close = connection_has(m, "close");
    m->keep_alive = m->version_minor >= 1 ? !close : !close && connection_has(m, "keep-alive");

    /* Two framings: which one the upstream would believe is the question
     * request smuggling asks. Neither is chosen. */
    if (p->have_te && p->content_length >= 0)
        return fail(p, 400, "both Content-Length and Transfer-Encoding are present");
    if (p->have_te && m->version_minor == 0)
        return fail(p, 400, "Transfer-Encoding in an HTTP/1.0 message");
    if (p->have_te > 1)
        return fail(p, 501, "Transfer-Encoding other than \"chunked\" is not supported");

    if (!request && (p->response_to_head || m->status < 200 || m->status == 204 ||
                     m->status == 304))
        return finish(p);
    const char *expect = request && m->version_minor == 1 ? http_msg_header(m, "expect") : NULL;
    int go_on = expect && strcasecmp(expect, "100-continue") == 0; /* once a body follows */
    if (p->have_te) {
        m->chunked = 1;
        p->expect_continue = go_on;
        enter(p, S_CHUNK_SIZE);
        return HTTP_NEED_MORE;
    }
    if (p->content_length >= 0) {
        /* Refused now, before a byte of it arrives. */
        if ((uint64_t)p->content_length > p->limits.body_max)
            return fail(p, 413, "the body (Content-Length %lld) is larger than %zu bytes",
                        (long long)p->content_length, p->limits.body_max);
        if (p->content_length == 0)
            return finish(p);
        if (!carve_body(p, (size_t)p->content_length + 1))
            return oom(p);
        p->expect_continue = go_on;
        enter(p, S_BODY);
        return HTTP_NEED_MORE;
    }
    if (request)
        return finish(p);
    m->keep_alive = 0;
    enter(p, S_BODY_EOF);
    return HTTP_NEED_MORE;
}

/* chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ] ),
 * checked and ignored. Only line characters can be here (take_line). */
static int chunk_ext_ok(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n) {
        while (k < n && is_ws(s[k]))
            k++;
        if (k == n || s[k] != ';')
            return 0;
        k++;
        while (k < n && is_ws(s[k]))
            k++;
        size_t t = k;
        while (k < n && is_tchar((unsigned char)s[k]))
            k++;
        if (k == t)
            return 0;
        size_t j = k;
        while (j < n && is_ws(s[j]))
            j++;
        if (j == n || s[j] != '=')
            continue;
        k = j + 1;
        while (k < n && is_ws(s[k]))
            k++;
        if (k < n && s[k] == '"') {
            for (k++; k < n && s[k] != '"'; k++)
                if (s[k] == '\\' && ++k == n)
                    return 0;
            if (k == n)
                return 0;
            k++;
        } else {
            t = k;
            while (k < n && is_tchar((unsigned char)s[k]))
                k++;
            if (k == t)
                return 0;
        }
    }
    return 1;
}

static enum http_parse_status on_chunk_size_line(struct http_parser *p)
{
    const char *s = p->line;
    size_t n = p->line_len;
    uint64_t size = 0;
    size_t k = 0;
    int d;
    while (k < n && (d = http_hex_value((unsigned char)s[k])) >= 0) {
        if (k == CHUNK_DIGITS_MAX)
            return fail(p, 400, "a chunk size has more than %d hex digits", CHUNK_DIGITS_MAX);
        size = size << 4 | (uint64_t)d;
        k++;
    }
    if (k == 0)
        return fail(p, 400, "a chunk size is not a hex number");
    if (!chunk_ext_ok(s + k, n - k))
        return fail(p, 400, "a chunk size is followed by a malformed chunk extension");
    if (size > p->limits.body_max - p->msg->body_len)
        return fail(p, 413, "the chunked body is larger than %zu bytes", p->limits.body_max);
    if (size == 0) {
        enter(p, S_TRAILERS);
        return HTTP_NEED_MORE;
    }
    p->chunk_left = size;
    enter(p, S_CHUNK_DATA);
    return HTTP_NEED_MORE;
}

static enum http_parse_status on_line(struct http_parser *p)
{
    int empty = p->line_len == 0;
    enum http_parse_status rc;
    switch ((enum state)p->state) {
    case S_START:
        if (!empty)
            rc = p->mode == HTTP_PARSE_REQUEST ? on_request_line(p) : on_status_line(p);
        else if (p->mode == HTTP_PARSE_RESPONSE)
            rc = fail(p, 502, "an empty line where the status line belongs");
        else if (++p->blank_lines > BLANK_LINES_MAX)
            rc = fail(p, 400, "more than %d empty lines before the request line",
                      BLANK_LINES_MAX);
        else
            rc = HTTP_NEED_MORE;
        break;
    case S_HEADERS:
        rc = empty ? on_head_end(p) : on_field_line(p);
        break;
    case S_TRAILERS:
        rc = empty ? finish(p) : on_field_line(p);
        break;
    case S_CHUNK_SIZE:
        rc = on_chunk_size_line(p);
        break;
    default:
        assert(!"on_line outside a line state");
        rc = fail(p, 500, "internal error");
        break;
    }
    p->line_len = 0;
    return rc;
}

/* Append body bytes as they arrive (chunked and close-delimited bodies; a
 * Content-Length body has its whole buffer already). */
static int body_append(struct http_parser *p, const char *data, size_t n)
{
    struct http_msg *m = p->msg;
    size_t need = m->body_len + n + 1;
    if (need > p->body_cap) {
        /* Double, but never past what the limit lets the body become. */
        size_t most = p->limits.body_max < (size_t)-1 ? p->limits.body_max + 1 : (size_t)-1;
        size_t grow = p->body_cap <= most / 2 ? p->body_cap * 2 : most;
        if (grow < BODY_CAP_MIN)
            grow = BODY_CAP_MIN;
        if (grow > most)
            grow = most;
        if (!resize(p, &m->body, &p->body_cap, need > grow ? need : grow))
            return 0;
    }
    memcpy(m->body + m->body_len, data, n);
    m->body_len += n;
    return 1;
}

/* ---- the public functions ------------------------------------------------ */

void http_parser_init(struct http_parser *p, enum http_parse_mode mode,
                      const struct http_limits *limits)
{
    *p = (struct http_parser){0};
    p->mode = mode;
    p->limits = limits ? *limits : default_limits;
    p->content_length = -1;
    p->state = S_START;
}

void http_parser_reset(struct http_parser *p)
{
    http_msg_free(p->msg);
    p->msg = NULL;
    p->error_status = 0;
    p->error_detail[0] = '\0';
    p->response_to_head = 0;
    p->expect_continue = 0;
    p->line_len = 0;
    p->header_bytes = 0;
    p->content_length = -1;
    p->have_te = 0;
    p->chunk_left = 0;
    p->body_cap = 0;
    p->field_count = 0;
    p->blank_lines = 0;
    enter(p, S_START);
}

void http_parser_free(struct http_parser *p)
{
    http_msg_free(p->msg);
    p->msg = NULL;
    free(p->line);
    p->line = NULL;
    p->line_len = p->line_cap = 0;
}

enum http_parse_status http_parser_feed(struct http_parser *p, const char *data, size_t len,
                                        size_t *used)
{
    enum http_parse_status rc = HTTP_NEED_MORE;
    size_t i = 0;
    if (p->state == S_DONE)
        rc = HTTP_DONE;
    else if (p->state == S_ERROR)
        rc = HTTP_ERROR;

    while (i < len && rc == HTTP_NEED_MORE) {
        size_t n = len - i;
        switch ((enum state)p->state) {
        case S_START:
        case S_HEADERS:
        case S_CHUNK_SIZE:
        case S_TRAILERS: {
            int r = take_line(p, data, len, &i);
            if (r < 0)
                rc = HTTP_ERROR;
            else if (r > 0)
                rc = on_line(p);
            break;
        }
        case S_BODY: {
            size_t left = (size_t)p->content_length - p->msg->body_len;
            if (n > left)
                n = left;
            memcpy(p->msg->body + p->msg->body_len, data + i, n);
            p->msg->body_len += n;
            i += n;
            if (n == left)
                rc = finish(p);
            break;
        }
        case S_CHUNK_DATA:
            if (n > p->chunk_left)
                n = (size_t)p->chunk_left;
            if (!body_append(p, data + i, n)) {
                rc = oom(p);
                break;
            }
            i += n;
            p->chunk_left -= n;
            if (p->chunk_left == 0)
                enter(p, S_CHUNK_CR);
            break;
        case S_CHUNK_CR:
        case S_CHUNK_LF:
            /* The CRLF after the data is the only check that the chunk was
             * as long as its size said; without it a short chunk would let
             * the next "size line" come from the attacker's data. */
            if (data[i] != (p->state == S_CHUNK_CR ? '\r' : '\n')) {
                rc = fail(p, 400, "chunk data is not followed by CRLF");
                break;
            }
            i++;
            enter(p, p->state == S_CHUNK_CR ? S_CHUNK_LF : S_CHUNK_SIZE);
            break;
        case S_BODY_EOF:
            if (n > p->limits.body_max - p->msg->body_len) {
                rc = fail(p, 413, "the body is larger than %zu bytes", p->limits.body_max);
                break;
            }
            if (!body_append(p, data + i, n)) {
                rc = oom(p);
                break;
            }
            i += n;
            break;
        case S_DONE:
        case S_ERROR:
            assert(!"feed loop in a final state");
            break;
        }
    }
    *used = i;
    return rc;
}

enum http_parse_status http_parser_eof(struct http_parser *p)
{
    switch ((enum state)p->state) {
    case S_DONE:
        return HTTP_DONE;
    case S_ERROR:
        return HTTP_ERROR;
    case S_BODY_EOF:
        return finish(p);
    case S_START:
        if (p->line_len == 0)
            return HTTP_NEED_MORE;
        break;
    default:
        break;
    }
    return fail(p, 400, "the connection closed in the middle of the %s",
                p->mode == HTTP_PARSE_REQUEST ? "request" : "response");
}

int http_parser_in_body(const struct http_parser *p)
{
    return p->state > S_HEADERS && p->state < S_DONE;
}

int http_parser_in_message(const struct http_parser *p)
{
    switch ((enum state)p->state) {
    case S_START:
        return p->line_len > 0;
    case S_DONE:
    case S_ERROR:
        return 0;
    default:
        return 1;
    }
}

const struct http_msg *http_parser_partial(const struct http_parser *p)
{
    return p->msg;
}

struct http_msg *http_parser_take(struct http_parser *p)
{
    if (p->state != S_DONE)
        return NULL;
    struct http_msg *m = p->msg;
    p->msg = NULL;
    return m;
}

void http_msg_free(struct http_msg *m)
{
    if (!m)
        return;
    if (m->blocks) {
        if (!blocks_hold_body(m->blocks))
            free(m->body);
        blocks_free(m->blocks);
        free(m); /* and the first block with it */
        return;
    }
    free(m->method);
    free(m->target);
    free(m->reason);
    for (size_t i = 0; i < m->header_count; i++)
        free(m->headers[i].name); /* the value is in the same block */
    free(m->headers);
    free(m->body);
    free(m);
}

char *http_msg_take_body(struct http_msg *m, size_t *len)
{
    char *body = m->body;
    if (!body || blocks_hold_body(m->blocks)) {
        /* In the message's blocks (or none): a copy of its own. */
        if (!(body = malloc(m->body_len + 1)))
            return NULL;
        if (m->body_len)
            memcpy(body, m->body, m->body_len);
        body[m->body_len] = '\0';
    }
    *len = m->body_len;
    m->body = NULL;
    m->body_len = 0;
    return body;
}

const char *http_msg_header(const struct http_msg *m, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < m->header_count; i++)
        if (m->headers[i].name_len == len && strcasecmp(m->headers[i].name, name) == 0)
            return m->headers[i].value;
    return NULL;
}

size_t http_msg_header_count(const struct http_msg *m, const char *name)
{
    size_t n = 0, len = strlen(name);
    for (size_t i = 0; i < m->header_count; i++)
        n += m->headers[i].name_len == len && strcasecmp(m->headers[i].name, name) == 0;
    return n;
}

int http_name_alike(const char *a, const char *b)
{
    for (;; a++, b++) {
        int x = (unsigned char)*a, y = (unsigned char)*b;
        x = x == '_' ? '-' : x >= 'A' && x <= 'Z' ? x + 32 : x;
        y = y == '_' ? '-' : y >= 'A' && y <= 'Z' ? y + 32 : y;
        if (x != y)
            return 0;
        if (!x)
            return 1;
    }
}

size_t http_msg_header_alike_count(const struct http_msg *m, const char *name)
{
    size_t n = 0;
    for (size_t i = 0; i < m->header_count; i++)
        n += http_name_alike(m->headers[i].name, name);
    return n;
}

int http_is_replayable_name(const struct http_msg *m, const char *name)
{
    return !http_is_hop_by_hop(m, name) && !http_name_alike(name, "content-length");
}

int http_is_hop_by_hop(const struct http_msg *m, const char *name)
{
    if (!name)
        return 0;
    /* Called for every header forwarded or stored: the name's length
     * picks the one or two names it could be. */
    const char *a = NULL, *b = NULL;
    switch (strlen(name)) {
    case 2: a = "te"; break;
    case 7: a = "trailer", b = "upgrade"; break;
    case 10: a = "connection", b = "keep-alive"; break;
    case 16: a = "proxy-connection"; break;
    case 17: a = "transfer-encoding"; break;
    case 18: a = "proxy-authenticate"; break;
    case 19: a = "proxy-authorization"; break;
    }
    /* Spelt with '_' too (Transfer_Encoding): CGI-style upstreams read it
     * as the same header. */
    if ((a && http_name_alike(name, a)) || (b && http_name_alike(name, b)))
        return 1;
    return m && connection_has(m, name);
}
