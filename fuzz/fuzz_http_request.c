/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_http_request.c — libFuzzer target for server/http/http_parser.c in request
 * mode (what any client of idem serve can send). fuzz_http_response.c
 * includes this file to run the same driver in response mode.
 *
 * The input is a byte stream from a peer, parsed as many messages as it holds
 * (a reset after each, as the daemon does), then closed. It is parsed several
 * ways: in one piece; in pieces of pseudo-random sizes drawn from a hash of the
 * input; one byte at a time (inputs up to 4 KiB). All must give the same
 * messages and the same final error, status and detail: a parser whose answer
 * depends on how TCP cut the stream can be desynchronised from its upstream,
 * which is the bug this target exists to find, so a difference aborts. One
 * more run fails an allocation chosen by the hash, and must end in a message
 * or a 500, leaking nothing. Each message is checked against the header's
 * promises (NUL-terminated body, versions, statuses, header lookups).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http_parser.h"

#ifndef FUZZ_HTTP_MODE
#define FUZZ_HTTP_MODE HTTP_PARSE_REQUEST
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small, so that inputs of a few hundred bytes reach every limit. */
static const struct http_limits limits = {
    .request_line_max = 128,
    .header_count_max = 12,
    .header_bytes_max = 512,
    .body_max = 1024,
};

#define BYTEWISE_MAX 4096

struct transcript {
    uint64_t hash; /* of every message, in order */
    size_t messages;
    enum http_parse_status rc; /* how the stream ended */
    int error_status;
    char error_detail[160];
};

/* FNV-1a, with a length so that ("ab","c") and ("a","bc") differ. */
static uint64_t mix(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < sizeof n; i++)
        h = (h ^ ((n >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t mix_str(uint64_t h, const char *s)
{
    return s ? mix(h, s, strlen(s)) : mix(h, "", 0) + 1;
}

static uint64_t mix_int(uint64_t h, long long v)
{
    return mix(h, &v, sizeof v);
}

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_http: %s\n", what);
        abort();
    }
}

/* What the header promises about a message; and its fingerprint. */
static uint64_t on_message(uint64_t h, const struct http_msg *m, enum http_parse_mode mode)
{
    check(m != NULL, "HTTP_DONE without a message");
    check(m->body != NULL && m->body[m->body_len] == '\0', "body not NUL-terminated");
    check(m->body_len <= limits.body_max, "body over the limit");
    check(m->version_minor == 0 || m->version_minor == 1, "version");
    check(m->keep_alive == 0 || m->keep_alive == 1, "keep_alive");
    check(m->chunked == 0 || m->chunked == 1, "chunked");
    check(m->header_count <= limits.header_count_max, "too many headers");
    if (mode == HTTP_PARSE_REQUEST) {
        check(m->method && m->method[0] && m->target &&
                  (m->target[0] == '/' || strcmp(m->target, "*") == 0),
              "request line");
    } else {
        check(m->status >= 100 && m->status <= 599 && m->reason, "status line");
    }
    h = mix_str(h, m->method);
    h = mix_str(h, m->target);
    h = mix_int(h, m->status);
    h = mix_str(h, m->reason);
    h = mix_int(h, m->version_minor);
    h = mix_int(h, (long long)m->header_count);
    for (size_t i = 0; i < m->header_count; i++) {
        const struct http_header *f = &m->headers[i];
        check(f->name && f->name[0] && f->value, "header");
        check(http_msg_header(m, f->name) != NULL, "http_msg_header");
        check(http_msg_header_count(m, f->name) >= 1, "http_msg_header_count");
        h = mix_str(h, f->name);
        h = mix_str(h, f->value);
        h = mix_int(h, http_is_hop_by_hop(m, f->name));
    }
    h = mix(h, m->body, m->body_len);
    h = mix_int(h, m->keep_alive);
    return mix_int(h, m->chunked);
}

/* Piece sizes: 0 = all at once, 1 = byte by byte, else pseudo-random. */
static size_t piece(uint64_t *rng, int how, size_t left)
{
    size_t n;
    if (how == 0)
        return left;
    if (how == 1) {
        n = 1;
    } else {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        n = 1 + (size_t)(*rng % ((*rng >> 32) % 8 == 0 ? 512 : 24));
    }
    return n < left ? n : left;
}

static long alloc_count, alloc_fail_at;

static void *failing_realloc(void *ptr, size_t n)
{
    if (++alloc_count == alloc_fail_at)
        return NULL;
    return realloc(ptr, n);
}

static void run(const uint8_t *data, size_t size, int how, uint64_t seed, int head,
                long fail_at, struct transcript *t)
{
    enum http_parse_mode mode = FUZZ_HTTP_MODE;
    struct http_parser p;
    http_parser_init(&p, mode, &limits);
    p.response_to_head = head;
    if (fail_at) {
        p.realloc_fn = failing_realloc;
        alloc_count = 0;
        alloc_fail_at = fail_at;
    }
    *t = (struct transcript){.hash = 0xcbf29ce484222325ull};
    uint64_t rng = seed | 1;
    const char *s = (const char *)data;
    size_t off = 0;
    enum http_parse_status rc = HTTP_NEED_MORE;
    while (off < size) {
        size_t n = piece(&rng, how, size - off), used = (size_t)-1;
        rc = http_parser_feed(&p, s + off, n, &used);
        check(used <= n, "used > len");
        off += used;
        if (rc == HTTP_ERROR)
            break;
        if (rc == HTTP_NEED_MORE) {
            check(used == n, "HTTP_NEED_MORE without consuming everything");
            continue;
        }
        check(used > 0, "HTTP_DONE without consuming");
        struct http_msg *m = http_parser_take(&p);
        check(http_parser_take(&p) == NULL, "a message taken twice");
        t->hash = on_message(t->hash, m, mode);
        t->messages++;
        http_msg_free(m);
        http_parser_reset(&p);
        p.response_to_head = head;
        rc = HTTP_NEED_MORE;
    }
    if (rc == HTTP_NEED_MORE) {
        int in = http_parser_in_message(&p);
        rc = http_parser_eof(&p);
        check(in || rc == HTTP_NEED_MORE, "a close between messages is not clean");
        check(!in || rc != HTTP_NEED_MORE, "a close in a message is clean");
        if (rc == HTTP_DONE) {
            struct http_msg *m = http_parser_take(&p);
            check(m && !m->keep_alive, "a close-delimited message to keep alive");
            t->hash = on_message(t->hash, m, mode);
            t->messages++;
            http_msg_free(m);
        }
    }
    t->rc = rc;
    if (rc == HTTP_ERROR) {
        int st = p.error_status;
        if (mode == HTTP_PARSE_REQUEST)
            check(st == 400 || st == 413 || st == 414 || st == 431 || st == 501 || st == 505 ||
                      st == 500,
                  "request error status");
        else
            check(st == 502 || st == 500 || st == 413 || st == 431, "response error status");
        check(st != 500 || fail_at, "500 without an allocation failure");
        check(p.error_detail[0] != '\0', "an error without a detail");
        t->error_status = st;
        memcpy(t->error_detail, p.error_detail, sizeof t->error_detail);
    }
    http_parser_free(&p);
}

static void same(const struct transcript *a, const struct transcript *b, const char *how)
{
    if (a->hash == b->hash && a->messages == b->messages && a->rc == b->rc &&
        a->error_status == b->error_status && strcmp(a->error_detail, b->error_detail) == 0)
        return;
    fprintf(stderr,
            "fuzz_http: %s differs from one piece:\n"
            "  one piece: %zu messages, rc %d, status %d, \"%s\"\n"
            "  %s: %zu messages, rc %d, status %d, \"%s\"\n",
            how, a->messages, a->rc, a->error_status, a->error_detail, how, b->messages, b->rc,
            b->error_status, b->error_detail);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t seed = mix(0xcbf29ce484222325ull, data, size);
    int head = FUZZ_HTTP_MODE == HTTP_PARSE_RESPONSE && (seed >> 63);
    struct transcript whole, part;

    run(data, size, 0, seed, head, 0, &whole);
    run(data, size, 2, seed, head, 0, &part);
    same(&whole, &part, "random pieces");
    if (size <= BYTEWISE_MAX) {
        run(data, size, 1, seed, head, 0, &part);
        same(&whole, &part, "byte by byte");
    }
    /* Out of memory at one allocation of the first few dozen. */
    run(data, size, 2, seed, head, 1 + (long)((seed >> 40) % 48), &part);
    check(part.rc != HTTP_ERROR || part.error_status == 500 ||
              (whole.rc == HTTP_ERROR && part.error_status == whole.error_status),
          "out of memory turned into another error");
    return 0;
}
