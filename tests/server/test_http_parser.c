/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_http_parser.c — the HTTP/1.1 parser of idem serve (server/http/http_parser.c).
 *
 * Every message here is parsed several ways: in one piece, one byte at a
 * time, and in pieces of 2, 3 and 7 bytes; all must give the same message or
 * the same error (status and detail), because a parser whose answer depends on
 * how TCP cut the stream is a parser that can be desynchronised. Then the
 * strict rules, each with the status it answers; responses; pipelining; the
 * close of a connection; hop-by-hop headers; and a failed allocation at every
 * allocation the parser makes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "http/blocks.h"
#include "http/http_parser.h"
#include "testlib.h"

static const struct http_limits limits = {
    .request_line_max = 64,
    .header_count_max = 8,
    .header_bytes_max = 256,
    .body_max = 64,
};

#define S(lit) lit, sizeof(lit) - 1

/* ---- parsing one message, several ways ------------------------------------ */

struct outcome {
    enum http_parse_status rc;
    int error_status;
    char detail[160];
    size_t used; /* bytes consumed in all */
    struct http_msg *msg;
};

/* Feed s in pieces of step bytes (0: one piece) until a message is done or
 * refused; then, if asked and nothing was decided, the peer closes. */
static struct outcome feed_in_pieces(enum http_parse_mode mode, int head, const char *s,
                                     size_t len, size_t step, int eof)
{
    struct http_parser p;
    http_parser_init(&p, mode, &limits);
    p.response_to_head = head;
    struct outcome o = {.rc = HTTP_NEED_MORE};
    while (o.used < len && o.rc == HTTP_NEED_MORE) {
        size_t n = step && step < len - o.used ? step : len - o.used;
        size_t used = (size_t)-1;
        o.rc = http_parser_feed(&p, s + o.used, n, &used);
        assert_true(used <= n);
        if (o.rc == HTTP_NEED_MORE)
            assert_int_equal(used, n);
        o.used += used;
    }
    if (o.rc == HTTP_NEED_MORE && eof)
        o.rc = http_parser_eof(&p);
    o.error_status = p.error_status;
    snprintf(o.detail, sizeof o.detail, "%s", p.error_detail);
    if (o.rc == HTTP_DONE)
        o.msg = http_parser_take(&p);
    http_parser_free(&p);
    return o;
}

static void assert_str_or_null_equal(const char *a, const char *b)
{
    if (!a || !b)
        assert_ptr_equal(a, b);
    else
        assert_string_equal(a, b);
}

static void assert_same_msg(const struct http_msg *a, const struct http_msg *b)
{
    if (!a || !b) {
        assert_ptr_equal(a, b);
        return;
    }
    assert_str_or_null_equal(a->method, b->method);
    assert_str_or_null_equal(a->target, b->target);
    assert_int_equal(a->status, b->status);
    assert_str_or_null_equal(a->reason, b->reason);
    assert_int_equal(a->version_minor, b->version_minor);
    assert_int_equal(a->header_count, b->header_count);
    for (size_t i = 0; i < a->header_count; i++) {
        assert_string_equal(a->headers[i].name, b->headers[i].name);
        assert_string_equal(a->headers[i].value, b->headers[i].value);
    }
    assert_int_equal(a->body_len, b->body_len);
    assert_memory_equal(a->body, b->body, a->body_len + 1);
    assert_int_equal(a->keep_alive, b->keep_alive);
    assert_int_equal(a->chunked, b->chunked);
}

static void assert_same(const struct outcome *a, const struct outcome *b, size_t step)
{
    /* After an error, how much was consumed does not matter. */
    if (a->rc != b->rc || a->error_status != b->error_status ||
        (a->rc != HTTP_ERROR && a->used != b->used) || strcmp(a->detail, b->detail) != 0)
        fail_msg("in pieces of %zu: rc %d status %d used %zu \"%s\"; in one piece: "
                 "rc %d status %d used %zu \"%s\"",
                 step, b->rc, b->error_status, b->used, b->detail, a->rc, a->error_status,
                 a->used, a->detail);
    assert_same_msg(a->msg, b->msg);
}

/* Parse s in one piece, then check every other way of cutting it agrees. */
static struct outcome parse_as(enum http_parse_mode mode, int head, const char *s, size_t len,
                               int eof)
{
    struct outcome whole = feed_in_pieces(mode, head, s, len, 0, eof);
    static const size_t steps[] = {1, 2, 3, 7};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        struct outcome part = feed_in_pieces(mode, head, s, len, steps[i], eof);
        assert_same(&whole, &part, steps[i]);
        http_msg_free(part.msg);
    }
    return whole;
}

static struct http_msg *request_ok(const char *s, size_t len)
{
    struct outcome o = parse_as(HTTP_PARSE_REQUEST, 0, s, len, 0);
    if (o.rc != HTTP_DONE)
        fail_msg("expected a request, got rc %d status %d: %s", o.rc, o.error_status,
                 o.detail);
    assert_int_equal(o.used, len);
    assert_non_null(o.msg->body);
    assert_int_equal(o.msg->body[o.msg->body_len], '\0');
    return o.msg;
}

static struct http_msg *response_ok(const char *s, size_t len, int head, int eof)
{
    struct outcome o = parse_as(HTTP_PARSE_RESPONSE, head, s, len, eof);
    if (o.rc != HTTP_DONE)
        fail_msg("expected a response, got rc %d status %d: %s", o.rc, o.error_status,
                 o.detail);
    assert_int_equal(o.used, len);
    assert_int_equal(o.msg->body[o.msg->body_len], '\0');
    return o.msg;
}

static void refused_as(enum http_parse_mode mode, const char *s, size_t len, int eof,
                       int status, const char *detail)
{
    struct outcome o = parse_as(mode, 0, s, len, eof);
    if (o.rc != HTTP_ERROR)
        fail_msg("expected %d, got rc %d for \"%.*s\"", status, o.rc, (int)len, s);
    if (o.error_status != status)
        fail_msg("expected %d, got %d (%s) for \"%.*s\"", status, o.error_status, o.detail,
                 (int)len, s);
    if (detail && !strstr(o.detail, detail))
        fail_msg("detail \"%s\" does not say \"%s\"", o.detail, detail);
    assert_null(o.msg);
}

static void request_refused(const char *s, size_t len, int status, const char *detail)
{
    refused_as(HTTP_PARSE_REQUEST, s, len, 0, status, detail);
}

static void response_refused(const char *s, size_t len, const char *detail)
{
    refused_as(HTTP_PARSE_RESPONSE, s, len, 1, 502, detail);
}

/* ---- requests -------------------------------------------------------------- */

static void get(void **state)
{
    (void)state;
    struct http_msg *m = request_ok(S("GET /refunds?x=1 HTTP/1.1\r\n"
                                      "Host: pay.example\r\n"
                                      "Accept: \t */* \t\r\n"
                                      "X-Empty:\r\n"
                                      "\r\n"));
    assert_string_equal(m->method, "GET");
    assert_string_equal(m->target, "/refunds?x=1");
    assert_int_equal(m->version_minor, 1);
    assert_int_equal(m->header_count, 3);
    assert_string_equal(m->headers[0].name, "Host");
    assert_string_equal(m->headers[0].value, "pay.example");
    assert_string_equal(http_msg_header(m, "accept"), "*/*");
    assert_string_equal(http_msg_header(m, "X-EMPTY"), "");
    assert_null(http_msg_header(m, "Content-Length"));
    assert_int_equal(m->body_len, 0);
    assert_string_equal(m->body, "");
    assert_int_equal(m->keep_alive, 1);
    assert_int_equal(m->chunked, 0);
    http_msg_free(m);
}

static void post_with_content_length(void **state)
{
    (void)state;
    struct http_msg *m = request_ok(S("POST /refunds HTTP/1.1\r\n"
                                      "Host: a\r\n"
                                      "Content-Type: application/json\r\n"
                                      "Content-Length: 12\r\n"
                                      "\r\n"
                                      "{\"a\":\"\0\x01\"}\r\n"));
    assert_string_equal(m->method, "POST");
    assert_int_equal(m->body_len, 12);
    assert_memory_equal(m->body, "{\"a\":\"\0\x01\"}\r\n", 13);
    assert_int_equal(m->chunked, 0);
    http_msg_free(m);

    /* Leading zeros are digits too; a zero length is an empty body. */
    m = request_ok(S("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0003\r\n\r\nabc"));
    assert_string_equal(m->body, "abc");
    http_msg_free(m);
    m = request_ok(S("PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"));
    assert_int_equal(m->body_len, 0);
    http_msg_free(m);
}

static const char chunked_request[] = "POST /refunds HTTP/1.1\r\n"
                                      "Host: a\r\n"
                                      "Transfer-Encoding: ChunKed\r\n"
                                      "\r\n"
                                      "5;name=value;q=\"a \\\" ; b\"\r\n"
                                      "hello\r\n"
                                      "6 ; ext\r\n" /* BWS: RFC 9112 §7.1.1 */
                                      " world\r\n"
                                      "0A\r\n"
                                      "0123456789\r\n"
                                      "0\r\n"
                                      "X-Checksum: abc\r\n"
                                      "X-Other: 1\r\n"
                                      "\r\n";

static void chunked_with_extensions_and_trailers(void **state)
{
    (void)state;
    struct http_msg *m = request_ok(S(chunked_request));
    assert_int_equal(m->chunked, 1);
    assert_int_equal(m->body_len, 21);
    assert_string_equal(m->body, "hello world0123456789");
    /* Trailers are read and dropped. */
    assert_int_equal(m->header_count, 2);
    assert_null(http_msg_header(m, "X-Checksum"));
    http_msg_free(m);

    m = request_ok(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "0\r\n\r\n"));
    assert_int_equal(m->chunked, 1);
    assert_int_equal(m->body_len, 0);
    http_msg_free(m);
}

/* Cut the message in two at every position: each cut gives the same result. */
static void every_split_point(void **state)
{
    (void)state;
    const char *s = chunked_request;
    size_t len = strlen(s);
    struct outcome whole = feed_in_pieces(HTTP_PARSE_REQUEST, 0, s, len, 0, 0);
    assert_int_equal(whole.rc, HTTP_DONE);
    for (size_t cut = 0; cut <= len; cut++) {
        struct http_parser p;
        http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
        size_t used;
        assert_int_equal(http_parser_feed(&p, s, cut, &used), cut == len ? HTTP_DONE
                                                                         : HTTP_NEED_MORE);
        assert_int_equal(used, cut);
        if (cut < len) {
            assert_int_equal(http_parser_feed(&p, s + cut, len - cut, &used), HTTP_DONE);
            assert_int_equal(used, len - cut);
        }
        struct http_msg *m = http_parser_take(&p);
        assert_same_msg(whole.msg, m);
        http_msg_free(m);
        http_parser_free(&p);
    }
    http_msg_free(whole.msg);
}

static void pipelined(void **state)
{
    (void)state;
    const char first[] = "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc";
    const char second[] = "GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    const char third[] = "GET /c HTTP/1.1\r\nHo";
    char buf[256];
    size_t len = (size_t)snprintf(buf, sizeof buf, "%s%s%s", first, second, third);

    /* Whole buffer, then byte by byte across the message boundaries. */
    for (size_t step = 0; step <= 1; step++) {
        struct http_parser p;
        http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
        size_t off = 0, used;
        const char *want[] = {"/a", "/b"};
        for (int k = 0; k < 2; k++) {
            enum http_parse_status rc = HTTP_NEED_MORE;
            while (rc == HTTP_NEED_MORE) {
                size_t n = step ? 1 : len - off;
                rc = http_parser_feed(&p, buf + off, n, &used);
                off += used;
            }
            assert_int_equal(rc, HTTP_DONE);
            assert_int_equal(off, k == 0 ? sizeof first - 1 : sizeof first + sizeof second - 2);
            /* Done is done: more input waits for the reset. */
            assert_int_equal(http_parser_feed(&p, buf + off, len - off, &used), HTTP_DONE);
            assert_int_equal(used, 0);
            assert_int_equal(http_parser_in_message(&p), 0);
            struct http_msg *m = http_parser_take(&p);
            assert_non_null(m);
            assert_null(http_parser_take(&p));
            assert_string_equal(m->target, want[k]);
            assert_int_equal(m->keep_alive, k == 0);
            http_msg_free(m);
            http_parser_reset(&p);
        }
        assert_int_equal(http_parser_feed(&p, buf + off, len - off, &used), HTTP_NEED_MORE);
        assert_int_equal(used, len - off);
        assert_int_equal(http_parser_in_message(&p), 1);
        assert_int_equal(http_parser_eof(&p), HTTP_ERROR);
        assert_int_equal(p.error_status, 400);
        http_parser_free(&p);
    }
}

static void keep_alive_rules(void **state)
{
    (void)state;
    static const struct {
        const char *req;
        int keep_alive;
    } cases[] = {
        {"GET / HTTP/1.1\r\nHost: a\r\n\r\n", 1},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: Keep-Alive, CLOSE\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: x, close\r\n\r\n", 0},
        {"GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n", 1},
        {"GET / HTTP/1.0\r\n\r\n", 0},
        {"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", 1},
        {"GET / HTTP/1.0\r\nConnection: x-foo ,\tKEEP-ALIVE\r\n\r\n", 1},
        {"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n", 0},
        {"GET / HTTP/1.0\r\nKeep-Alive: timeout=5\r\n\r\n", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_msg *m = request_ok(cases[i].req, strlen(cases[i].req));
        if (m->keep_alive != cases[i].keep_alive)
            fail_msg("keep_alive %d, expected %d for %s", m->keep_alive, cases[i].keep_alive,
                     cases[i].req);
        http_msg_free(m);
    }
}

static void request_line_rules(void **state)
{
    (void)state;
    struct http_msg *m = request_ok(S("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_string_equal(m->target, "*");
    http_msg_free(m);
    /* A few empty lines before the request line are skipped. */
    m = request_ok(S("\r\n\r\nDELETE /r/1 HTTP/1.0\r\n\r\n"));
    assert_string_equal(m->method, "DELETE");
    assert_int_equal(m->version_minor, 0);
    http_msg_free(m);
    /* Exactly at the limit (64 bytes) is allowed; one more is 414. */
    m = request_ok(S("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n"
                     "Host: a\r\n\r\n"));
    assert_int_equal(strlen(m->target), 51);
    http_msg_free(m);
    request_refused(S("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa HTTP/1.1\r\n"), 414,
                    "longer than 64");
    /* 414 as soon as the line is too long, before its end arrives. */
    request_refused(S("GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), 414,
                    NULL);

    request_refused(S("GET / HTTP/2.0\r\n\r\n"), 505, "not supported");
    request_refused(S("GET / HTTP/1.2\r\n\r\n"), 505, NULL);
    request_refused(S("GET / HTTP/0.9\r\n\r\n"), 505, NULL);
    request_refused(S("GET / HTTP/1.10\r\n\r\n"), 400, NULL);
    request_refused(S("GET / http/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET / HTTP/1.1 \r\n\r\n"), 400, NULL);
    request_refused(S("GET /\r\n\r\n"), 400, NULL);
    request_refused(S("GET  / HTTP/1.1\r\n\r\n"), 400, "two spaces");
    request_refused(S(" GET / HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET\t/ HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET /a\tb HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET /a b HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET /\xc3\xa9 HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("G(T / HTTP/1.1\r\n\r\n"), 400, "method");
    request_refused(S("GET http://pay.example/ HTTP/1.1\r\n\r\n"), 400, "'/'");
    request_refused(S("CONNECT pay.example:443 HTTP/1.1\r\n\r\n"), 400, NULL);
    request_refused(S("GET * HTTP/1.1\r\n\r\n"), 400, "OPTIONS");
    request_refused(S("\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\n\r\nGET / HTTP/1.1\r\n"), 400,
                    "empty lines");
}

static void line_ending_and_control_rules(void **state)
{
    (void)state;
    request_refused(S("GET / HTTP/1.1\nHost: a\r\n\r\n"), 400, "request line: LF without CR");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\n\r\n"), 400, "header line 1: LF without CR");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\n\n"), 400, "LF without CR");
    request_refused(S("GET / HTTP/1.1\rHost: a\r\n\r\n"), 400, "CR not followed by LF");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"), 400,
                    "header line 2: CR not followed by LF");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n"), 400,
                    "header line 2: NUL byte");
    request_refused(S("GET /\0 HTTP/1.1\r\n"), 400, "request line: NUL");
    request_refused(S("GET / HTTP/1.1\r\nX: \x01\r\n\r\n"), 400, "control character 0x01");
    request_refused(S("GET / HTTP/1.1\r\nX: \x7f\r\n\r\n"), 400, "control character 0x7f");
    request_refused(S("\n"), 400, NULL);
}

static void header_rules(void **state)
{
    (void)state;
    /* HTAB inside a value and obs-text (bytes >= 0x80) are allowed. */
    struct http_msg *m = request_ok(S("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\tb \xc3\xa9\r\n\r\n"));
    assert_string_equal(http_msg_header(m, "x-a"), "a\tb \xc3\xa9");
    http_msg_free(m);

    request_refused(S("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400,
                    "header line 1: whitespace before the colon");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nX-A\t: b\r\n\r\n"), 400,
                    "header line 2: whitespace before the colon");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n  c\r\n\r\n"), 400,
                    "header line 3: starts with whitespace");
    request_refused(S("GET / HTTP/1.1\r\n\tHost: a\r\n\r\n"), 400, "obsolete line folding");
    request_refused(S("GET / HTTP/1.1\r\nHost a\r\n\r\n"), 400, "header line 1");
    request_refused(S("GET / HTTP/1.1\r\nHost\r\n\r\n"), 400, "no colon");
    request_refused(S("GET / HTTP/1.1\r\n: a\r\n\r\n"), 400, "empty field name");
    request_refused(S("GET / HTTP/1.1\r\nX(y): a\r\n\r\n"), 400, "field name");
    request_refused(S("GET / HTTP/1.1\r\nX\xc3\xa9: a\r\n\r\n"), 400, "field name");
    request_refused(S("GET / HTTP/1.1\r\nX: a\r\n\r\n"), 400, "without a Host");
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"), 400, "Host");
    request_refused(S("GET / HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n"), 400, "Host");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n"
                      "Connection: close, Content-Length\r\n\r\nx"),
                    400, "Connection");

    /* 8 fields are allowed, the 9th is 431. */
    m = request_ok(S("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n"
                     "F: 6\r\nG: 7\r\n\r\n"));
    assert_int_equal(m->header_count, 8);
    http_msg_free(m);
    request_refused(S("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n"
                      "F: 6\r\nG: 7\r\nH: 8\r\n\r\n"),
                    431, "more than 8 header fields");
    /* 256 bytes of field lines (CRLFs not counted) are allowed, 257 are 431. */
    char buf[512];
    int n = snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nHost: a\r\nX: %0*d\r\n\r\n", 256 - 7 - 3,
                     0);
    m = request_ok(buf, (size_t)n);
    http_msg_free(m);
    n = snprintf(buf, sizeof buf, "GET / HTTP/1.1\r\nHost: a\r\nX: %0*d\r\n\r\n", 256 - 7 - 2, 0);
    request_refused(buf, (size_t)n, 431, "larger than 256");
}

static void framing_rules(void **state)
{
    (void)state;
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                    400, "both Content-Length and Transfer-Encoding are present");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                      "Content-Length: 3\r\n\r\n0\r\n\r\n"),
                    400, "both Content-Length and Transfer-Encoding are present");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n"
                      "\r\nabcd"),
                    400, "more than once");
    /* Identical repeats are refused too (a documented choice). */
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n"
                      "\r\nabc"),
                    400, "more than once");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\nabcd"), 400,
                    "list");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3,3\r\n\r\nabc"), 400,
                    "list");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc"), 400,
                    "not a number");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3 3\r\n\r\n"), 400, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x3\r\n\r\n"), 400, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n"), 400, "empty");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n"
                      "\r\n"),
                    400, "too large");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 501,
                    "not supported");
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
                    501, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
                    501, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n"),
                    501, NULL);
    request_refused(S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400,
                    "HTTP/1.0");

    /* A request with neither has an empty body: what follows is the next request. */
    struct outcome o = parse_as(HTTP_PARSE_REQUEST, 0, S("POST / HTTP/1.1\r\nHost: a\r\n\r\nxyz"),
                                0);
    assert_int_equal(o.rc, HTTP_DONE);
    assert_int_equal(o.used, strlen("POST / HTTP/1.1\r\nHost: a\r\n\r\n"));
    assert_int_equal(o.msg->body_len, 0);
    http_msg_free(o.msg);
}

static void chunk_rules(void **state)
{
    (void)state;
#define CHUNKED "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    request_refused(S(CHUNKED "3\r\nabcX\r\n0\r\n\r\n"), 400, "not followed by CRLF");
    request_refused(S(CHUNKED "3\r\nabc\rX0\r\n\r\n"), 400, "not followed by CRLF");
    request_refused(S(CHUNKED "3\r\nabcd\r\n0\r\n\r\n"), 400, "not followed by CRLF");
    request_refused(S(CHUNKED "3\nabc\r\n0\r\n\r\n"), 400, "chunk-size line: LF without CR");
    request_refused(S(CHUNKED "x\r\n"), 400, "not a hex number");
    request_refused(S(CHUNKED "-3\r\n"), 400, "not a hex number");
    request_refused(S(CHUNKED " 3\r\n"), 400, NULL);
    request_refused(S(CHUNKED "3 \r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;a=\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;a=\"b\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;a=b c\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3x\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;a=\"b\\\r\n"), 400, "chunk extension");
    request_refused(S(CHUNKED "3;a=b;\r\n"), 400, "chunk extension");
    struct http_msg *m = request_ok(S(CHUNKED "3 ;a = b\t; c=\"\\\"\"\r\nabc\r\n0\r\n\r\n"));
    assert_string_equal(m->body, "abc");
    http_msg_free(m);
    request_refused(S(CHUNKED "00000000000000001\r\n"), 400, "more than 16 hex digits");
    request_refused(S(CHUNKED "fffffffffffffffff\r\n"), 400, "more than 16 hex digits");
    request_refused(S(CHUNKED "0\r\nX : y\r\n\r\n"), 400, "trailer line 1: whitespace");
    request_refused(S(CHUNKED "0\r\nX: y\r\n z\r\n\r\n"), 400, "trailer line 2");

    char buf[8192];
    int n = snprintf(buf, sizeof buf, CHUNKED "1;x=%04100d\r\n", 0);
    request_refused(buf, (size_t)n, 400, "chunk-size line is longer");
    /* Trailers count against the header limits. */
    request_refused(S(CHUNKED "0\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\nF: 6\r\nG: 7\r\n\r\n"),
                    431, NULL);
#undef CHUNKED
}

static void body_limits(void **state)
{
    (void)state;
    char buf[512], body[80];
    memset(body, 'b', sizeof body);

    /* 64 bytes is the limit: exactly that is fine, one more is 413. */
    int n = snprintf(buf, sizeof buf, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 64\r\n\r\n%.64s",
                     body);
    struct http_msg *m = request_ok(buf, (size_t)n);
    assert_int_equal(m->body_len, 64);
    http_msg_free(m);
    /* 413 right after the head: the body has not been sent. */
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\n"), 413,
                    "Content-Length 65");

    n = snprintf(buf, sizeof buf,
                 "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "20\r\n%.32s\r\n20\r\n%.32s\r\n0\r\n\r\n",
                 body, body);
    m = request_ok(buf, (size_t)n);
    assert_int_equal(m->body_len, 64);
    http_msg_free(m);
    /* One chunk over, refused at its size line; many small ones, at the one
     * that goes over. */
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n"),
                    413, "chunked body is larger than 64");
    n = snprintf(buf, sizeof buf,
                 "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "20\r\n%.32s\r\n20\r\n%.32s\r\n1\r\n",
                 body, body);
    request_refused(buf, (size_t)n, 413, NULL);
    request_refused(S("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                      "ffffffffffffffff\r\n"),
                    413, NULL);
}

static void truncated_then_closed(void **state)
{
    (void)state;
    static const char *const cut[] = {
        "G",
        "GET / HTTP/1.1\r",
        "GET / HTTP/1.1\r\nHost: a\r\n",
        "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nabc",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
        "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
    };
    for (size_t i = 0; i < sizeof cut / sizeof cut[0]; i++)
        refused_as(HTTP_PARSE_REQUEST, cut[i], strlen(cut[i]), 1, 400, "closed in the middle");

    /* A close between messages is clean. */
    struct http_parser p;
    http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
    assert_int_equal(http_parser_in_message(&p), 0);
    assert_int_equal(http_parser_eof(&p), HTTP_NEED_MORE);
    http_parser_free(&p);
}

static void after_an_error(void **state)
{
    (void)state;
    struct http_parser p;
    size_t used;
    http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
    assert_int_equal(http_parser_feed(&p, S("GET / HTTP/1.1\r\nX : y\r\n"), &used), HTTP_ERROR);
    assert_int_equal(p.error_status, 400);
    assert_int_equal(http_parser_feed(&p, S("GET / HTTP/1.1\r\n"), &used), HTTP_ERROR);
    assert_int_equal(used, 0);
    assert_null(http_parser_take(&p));
    assert_int_equal(http_parser_eof(&p), HTTP_ERROR);
    /* A reset starts afresh (the daemon closes instead, but it must hold). */
    http_parser_reset(&p);
    assert_int_equal(p.error_status, 0);
    assert_int_equal(http_parser_feed(&p, S("GET / HTTP/1.0\r\n\r\n"), &used), HTTP_DONE);
    http_msg_free(http_parser_take(&p));
    http_parser_free(&p);

    /* No limits given: the defaults. */
    http_parser_init(&p, HTTP_PARSE_REQUEST, NULL);
    assert_true(p.limits.body_max > 0);
    assert_int_equal(http_parser_feed(&p, S("GET / HTTP/1.0\r\n\r\n"), &used), HTTP_DONE);
    http_parser_free(&p);
}

/* ---- responses ------------------------------------------------------------- */

static void response_with_content_length(void **state)
{
    (void)state;
    struct http_msg *m = response_ok(S("HTTP/1.1 201 Created Now\r\nContent-Length: 2\r\n"
                                       "Content-Type: text/plain\r\n\r\nok"),
                                     0, 0);
    assert_int_equal(m->status, 201);
    assert_string_equal(m->reason, "Created Now");
    assert_int_equal(m->version_minor, 1);
    assert_string_equal(m->body, "ok");
    assert_int_equal(m->keep_alive, 1);
    assert_null(m->method);
    http_msg_free(m);

    m = response_ok(S("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"), 0, 0);
    assert_int_equal(m->status, 200);
    assert_string_equal(m->reason, "");
    http_msg_free(m);
    m = response_ok(S("HTTP/1.0 599 \r\nContent-Length: 0\r\n\r\n"), 0, 0);
    assert_int_equal(m->status, 599);
    assert_string_equal(m->reason, "");
    assert_int_equal(m->keep_alive, 0);
    http_msg_free(m);
}

static void response_chunked(void **state)
{
    (void)state;
    struct http_msg *m = response_ok(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                                       "2\r\nok\r\n1;a=b\r\n!\r\n0\r\nT: 1\r\n\r\n"),
                                     0, 0);
    assert_int_equal(m->chunked, 1);
    assert_string_equal(m->body, "ok!");
    assert_int_equal(m->keep_alive, 1);
    http_msg_free(m);
}

static void response_until_close(void **state)
{
    (void)state;
    struct http_msg *m = response_ok(S("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                                       "all of it\r\n\r\nto the end"),
                                     0, 1);
    assert_string_equal(m->body, "all of it\r\n\r\nto the end");
    assert_int_equal(m->keep_alive, 0);
    http_msg_free(m);

    /* Without the close it is not finished, and it is a message in progress. */
    struct http_parser p;
    size_t used;
    http_parser_init(&p, HTTP_PARSE_RESPONSE, &limits);
    assert_int_equal(http_parser_feed(&p, S("HTTP/1.0 200 OK\r\n\r\nabc"), &used), HTTP_NEED_MORE);
    assert_int_equal(http_parser_in_message(&p), 1);
    assert_int_equal(http_parser_eof(&p), HTTP_DONE);
    assert_int_equal(http_parser_eof(&p), HTTP_DONE);
    m = http_parser_take(&p);
    assert_string_equal(m->body, "abc");
    http_msg_free(m);
    http_parser_free(&p);

    /* Past the body limit: 413, which the upstream client tells apart. */
    char buf[256];
    int n = snprintf(buf, sizeof buf, "HTTP/1.1 200 OK\r\n\r\n%065d", 0);
    refused_as(HTTP_PARSE_RESPONSE, buf, (size_t)n, 1, 413, "larger than 64");
}

static void responses_without_body(void **state)
{
    (void)state;
    /* A response to HEAD announces a length but has no body; the next
     * response follows at once. */
    const char head[] = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n";
    const char next[] = "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n";
    struct http_parser p;
    size_t used;
    http_parser_init(&p, HTTP_PARSE_RESPONSE, &limits);
    p.response_to_head = 1;
    char buf[256];
    int n = snprintf(buf, sizeof buf, "%s%s", head, next);
    assert_int_equal(http_parser_feed(&p, buf, (size_t)n, &used), HTTP_DONE);
    assert_int_equal(used, sizeof head - 1);
    struct http_msg *m = http_parser_take(&p);
    assert_int_equal(m->body_len, 0);
    assert_string_equal(http_msg_header(m, "content-length"), "1000");
    http_msg_free(m);
    http_parser_reset(&p);
    assert_int_equal(p.response_to_head, 0);
    http_parser_free(&p);

    m = response_ok(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), 1, 0);
    assert_int_equal(m->body_len, 0);
    http_msg_free(m);

    static const char *const bodiless[] = {
        "HTTP/1.1 204 No Content\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        "HTTP/1.1 100 Continue\r\n\r\n",
        "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof bodiless / sizeof bodiless[0]; i++) {
        struct outcome o = parse_as(HTTP_PARSE_RESPONSE, 0, bodiless[i], strlen(bodiless[i]), 0);
        assert_int_equal(o.rc, HTTP_DONE);
        assert_int_equal(o.used, strlen(bodiless[i]));
        assert_int_equal(o.msg->body_len, 0);
        assert_int_equal(o.msg->keep_alive, 1);
        http_msg_free(o.msg);
    }

    /* A 1xx is a message of its own; the final response follows. */
    http_parser_init(&p, HTTP_PARSE_RESPONSE, &limits);
    n = snprintf(buf, sizeof buf, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
                                  "Content-Length: 2\r\n\r\nok");
    assert_int_equal(http_parser_feed(&p, buf, (size_t)n, &used), HTTP_DONE);
    m = http_parser_take(&p);
    assert_int_equal(m->status, 100);
    http_msg_free(m);
    http_parser_reset(&p);
    size_t off = used;
    assert_int_equal(http_parser_feed(&p, buf + off, (size_t)n - off, &used), HTTP_DONE);
    m = http_parser_take(&p);
    assert_int_equal(m->status, 200);
    assert_string_equal(m->body, "ok");
    http_msg_free(m);
    http_parser_free(&p);
}

static void malformed_responses(void **state)
{
    (void)state;
    response_refused(S("HTTP/1.1 20 OK\r\n\r\n"), "status");
    response_refused(S("HTTP/1.1 600 OK\r\n\r\n"), "status code");
    response_refused(S("HTTP/1.1 099 OK\r\n\r\n"), "status code");
    response_refused(S("HTTP/1.1 2x0 OK\r\n\r\n"), "status code");
    response_refused(S("HTTP/1.1 200OK\r\n\r\n"), "followed by a space");
    response_refused(S("HTTP/1.1  200 OK\r\n\r\n"), NULL);
    response_refused(S("HTTP/2 200 OK\r\n\r\n"), NULL);
    response_refused(S("HTTP/2.0 200 OK\r\n\r\n"), "not supported");
    response_refused(S("HTTP/1.1\r\n\r\n"), NULL);
    response_refused(S("\r\nHTTP/1.1 200 OK\r\n\r\n"), "empty line");
    response_refused(S("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n"), "LF without CR");
    response_refused(S("HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n"), "before the colon");
    response_refused(S("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n"
                       "\r\n0\r\n\r\n"),
                     "both Content-Length and Transfer-Encoding are present");
    response_refused(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc"), "chunked");
    response_refused(S("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
                     "more than once");
    refused_as(HTTP_PARSE_RESPONSE, S("HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n"), 1, 413,
               "larger than 64");
    response_refused(S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc"), "closed in the middle");
    response_refused(S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX"), "CRLF");
    response_refused(S("HTTP/1.1 200 OK\r\nX: \0\r\n\r\n"), "NUL");
    char buf[512];
    int n = snprintf(buf, sizeof buf, "HTTP/1.1 200 %060d\r\n\r\n", 0);
    response_refused(buf, (size_t)n, "status line is longer than 64");
    /* A head over the field limits stays 431, as a body over its limit
     * stays 413: the upstream did answer. */
    refused_as(HTTP_PARSE_RESPONSE,
               S("HTTP/1.1 200 OK\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\nG: 1\r\n"
                 "H: 1\r\nI: 1\r\nContent-Length: 0\r\n\r\n"),
               1, 431, "more than 8 header fields");
    n = snprintf(buf, sizeof buf, "HTTP/1.1 200 OK\r\nX: %0300d\r\nContent-Length: 0\r\n\r\n", 0);
    refused_as(HTTP_PARSE_RESPONSE, buf, (size_t)n, 1, 431, "larger than 256 bytes");
}

/* ---- headers of a message -------------------------------------------------- */

static void hop_by_hop(void **state)
{
    (void)state;
    struct http_msg *m = request_ok(S("GET / HTTP/1.1\r\nHost: a\r\n"
                                      "Connection: keep-alive, X-Internal-Token\r\n"
                                      "connection: x-debug\r\n"
                                      "X-Internal-Token: s\r\nX-Debug: 1\r\n"
                                      "Idempotency-Key: k\r\n\r\n"));
    static const char *const fixed[] = {
        "Connection", "keep-alive", "PROXY-CONNECTION", "TE", "Trailer", "Transfer-Encoding",
        "Upgrade", "Proxy-Authenticate", "Proxy-Authorization",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        assert_true(http_is_hop_by_hop(m, fixed[i]));
        assert_true(http_is_hop_by_hop(NULL, fixed[i]));
    }
    assert_true(http_is_hop_by_hop(m, "X-Internal-Token"));
    assert_true(http_is_hop_by_hop(m, "x-internal-token"));
    assert_true(http_is_hop_by_hop(m, "X-DEBUG"));
    assert_false(http_is_hop_by_hop(NULL, "X-Debug"));
    assert_false(http_is_hop_by_hop(m, "X-Internal"));
    assert_false(http_is_hop_by_hop(m, "Idempotency-Key"));
    assert_false(http_is_hop_by_hop(m, "Host"));
    assert_false(http_is_hop_by_hop(m, "Content-Length"));
    assert_false(http_is_hop_by_hop(m, "Trailers"));
    assert_false(http_is_hop_by_hop(m, NULL));

    assert_int_equal(http_msg_header_count(m, "CONNECTION"), 2);
    assert_int_equal(http_msg_header_count(m, "Cookie"), 0);
    assert_string_equal(http_msg_header(m, "connection"), "keep-alive, X-Internal-Token");
    http_msg_free(m);
}

/* ---- out of memory --------------------------------------------------------- */

static long alloc_count, fail_at;

static void *failing_realloc(void *ptr, size_t n)
{
    if (++alloc_count == fail_at)
        return NULL;
    return realloc(ptr, n);
}

static size_t heap_in_use(void)
{
#ifdef __GLIBC__
    return mallinfo2().uordblks;
#else
    return 0;
#endif
}

/* Fail the n-th allocation, for n = 1, 2, ... until a run needs fewer: each
 * run ends in a message or in 500, and leaves the heap as it found it. */
static void out_of_memory_at_every_allocation(void **state)
{
    (void)state;
    static const struct {
        enum http_parse_mode mode;
        const char *in;
    } cases[] = {
        {HTTP_PARSE_REQUEST, chunked_request},
        {HTTP_PARSE_REQUEST, "POST /r HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n"
                             "Content-Length: 3\r\n\r\nabc"},
        {HTTP_PARSE_REQUEST, "GET /r HTTP/1.0\r\n\r\n"},
        {HTTP_PARSE_RESPONSE, "HTTP/1.1 200 OK\r\nX: 1\r\n\r\nclose-delimited body"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (size_t step = 0; step <= 1; step++) {
            for (fail_at = 1;; fail_at++) {
                size_t before = heap_in_use();
                struct http_parser p;
                http_parser_init(&p, cases[c].mode, &limits);
                p.realloc_fn = failing_realloc;
                alloc_count = 0;
                const char *s = cases[c].in;
                size_t len = strlen(s), off = 0, used;
                enum http_parse_status rc = HTTP_NEED_MORE;
                while (off < len && rc == HTTP_NEED_MORE) {
                    rc = http_parser_feed(&p, s + off, step ? 1 : len - off, &used);
                    off += used;
                }
                if (rc == HTTP_NEED_MORE)
                    rc = http_parser_eof(&p);
                int failed = alloc_count >= fail_at;
                if (failed) {
                    assert_int_equal(rc, HTTP_ERROR);
                    assert_int_equal(p.error_status, 500);
                    assert_non_null(strstr(p.error_detail, "out of memory"));
                } else {
                    assert_int_equal(rc, HTTP_DONE);
                }
                http_msg_free(http_parser_take(&p));
                http_parser_free(&p);
                assert_int_equal(heap_in_use(), before);
                if (!failed)
                    break;
            }
            assert_true(fail_at > 2);
        }
    }
}

/* ---- memory ------------------------------------------------------------------ */

static long allocs;

static void *counting_realloc(void *ptr, size_t n)
{
    allocs++;
    return realloc(ptr, n);
}

/* Parse s twice on one parser with the default limits; the allocations the
 * second message took (the parser's line buffer is grown by then). */
static long allocations_of(enum http_parse_mode mode, const char *s)
{
    struct http_parser p;
    http_parser_init(&p, mode, NULL);
    p.realloc_fn = counting_realloc;
    long n = 0;
    for (int round = 0; round < 2; round++) {
        allocs = 0;
        size_t used;
        assert_int_equal(http_parser_feed(&p, s, strlen(s), &used), HTTP_DONE);
        assert_int_equal(used, strlen(s));
        n = allocs;
        http_msg_free(http_parser_take(&p));
        http_parser_reset(&p);
    }
    http_parser_free(&p);
    return n;
}

/* A typical request or answer, head and body, is one allocation, however
 * many fields it has: the loops parse two per execution. */
static void one_allocation_for_a_typical_message(void **state)
{
    (void)state;
    assert_int_equal(
        allocations_of(HTTP_PARSE_REQUEST,
                       "POST /v1/refunds?debug=0 HTTP/1.1\r\nHost: pay.example\r\n"
                       "User-Agent: refund-client/2.3 (linux; x86_64)\r\n"
                       "Accept: application/json\r\nContent-Type: application/json\r\n"
                       "Authorization: Bearer 9f2c1d0e8b7a6f5e4d3c2b1a09f8e7d6c5b4a392\r\n"
                       "Idempotency-Key: \"refund-20261204-000123\"\r\n"
                       "X-Request-Id: 0b6e8f3c-5a1d-4e2f-9c7b-3d8a1f6e2b40\r\n"
                       "Content-Length: 62\r\n\r\n"
                       "{\"refund_no\":\"R-20261204-000123\",\"amount\":\"12.50\",\"cur\":\"EUR\"}"),
        1);
    assert_int_equal(allocations_of(HTTP_PARSE_RESPONSE,
                                    "HTTP/1.1 201 Created\r\nServer: nginx\r\n"
                                    "Date: Fri, 04 Dec 2026 10:00:00 GMT\r\n"
                                    "Content-Type: application/json\r\nContent-Length: 11\r\n"
                                    "Connection: keep-alive\r\n\r\n{\"ok\":true}"),
                     1);
    assert_int_equal(allocations_of(HTTP_PARSE_REQUEST, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 1);
}

/* A head and a body larger than the first block go on in further blocks:
 * every field reads back as sent, in one piece or byte by byte. (That
 * nothing leaks, the sanitizer run's leak check says: mallinfo counts the
 * chunks glibc caches per thread as in use.) */
static void large_messages_span_blocks(void **state)
{
    (void)state;
    enum { FIELDS = 90, VALUE = 300, BODY = 5000 };
    size_t cap = 64 + FIELDS * (VALUE + 16) + BODY;
    char *in = malloc(cap), *body = malloc(BODY);
    assert_non_null(in);
    assert_non_null(body);
    for (size_t i = 0; i < BODY; i++)
        body[i] = (char)('a' + i % 26);
    size_t n = (size_t)snprintf(in, cap, "POST /big HTTP/1.1\r\nHost: a\r\n");
    for (int f = 0; f < FIELDS; f++) {
        n += (size_t)snprintf(in + n, cap - n, "X-Field-%02d: ", f);
        for (int k = 0; k < VALUE; k++)
            in[n++] = (char)('A' + (f + k) % 26);
        n += (size_t)snprintf(in + n, cap - n, "\r\n");
    }
    n += (size_t)snprintf(in + n, cap - n, "Content-Length: %d\r\n\r\n", BODY);
    memcpy(in + n, body, BODY);
    n += BODY;

    for (size_t step = 0; step <= 1; step++) {
        struct http_parser p;
        http_parser_init(&p, HTTP_PARSE_REQUEST, NULL);
        size_t off = 0, used;
        enum http_parse_status rc = HTTP_NEED_MORE;
        while (off < n && rc == HTTP_NEED_MORE) {
            rc = http_parser_feed(&p, in + off, step ? 1 : n - off, &used);
            off += used;
        }
        assert_int_equal(rc, HTTP_DONE);
        struct http_msg *m = http_parser_take(&p);
        assert_string_equal(m->method, "POST");
        assert_string_equal(m->target, "/big");
        assert_int_equal(m->header_count, FIELDS + 2);
        assert_non_null(m->blocks->next); /* it did go on past the first */
        assert_string_equal(m->headers[0].value, "a");
        for (int f = 0; f < FIELDS; f++) {
            char name[16];
            snprintf(name, sizeof name, "X-Field-%02d", f);
            const struct http_header *h = &m->headers[f + 1];
            assert_string_equal(h->name, name);
            assert_int_equal(strlen(h->value), VALUE);
            for (int k = 0; k < VALUE; k++)
                assert_int_equal(h->value[k], 'A' + (f + k) % 26);
        }
        assert_int_equal(m->body_len, BODY);
        assert_memory_equal(m->body, body, BODY);
        assert_int_equal(m->body[BODY], '\0');
        http_msg_free(m);
        http_parser_free(&p);
    }
    free(in);
    free(body);
}

/* The body taken out of a message is the caller's heap block whichever
 * way it came (a Content-Length body lives in the message's blocks, a
 * chunked one in a block of its own), and the message frees cleanly. */
static void take_the_body(void **state)
{
    (void)state;
    static const char *const in[] = {
        "POST /r HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
        "POST /r HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n",
        "GET /r HTTP/1.1\r\nHost: a\r\n\r\n",
    };
    static const char *const want[] = {"hello", "hello", ""};
    static const int in_blocks[] = {1, 0, 1}; /* the chunked body grew on the heap */
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        struct http_msg *m = request_ok(in[i], strlen(in[i]));
        assert_int_equal(blocks_hold_body(m->blocks), in_blocks[i]);
        size_t len = 99;
        char *body = http_msg_take_body(m, &len);
        assert_non_null(body);
        assert_int_equal(len, strlen(want[i]));
        assert_string_equal(body, want[i]);
        assert_null(m->body);
        assert_int_equal(m->body_len, 0);
        http_msg_free(m);
        assert_string_equal(body, want[i]); /* outlives the message */
        free(body);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(get),
        cmocka_unit_test(post_with_content_length),
        cmocka_unit_test(chunked_with_extensions_and_trailers),
        cmocka_unit_test(every_split_point),
        cmocka_unit_test(pipelined),
        cmocka_unit_test(keep_alive_rules),
        cmocka_unit_test(request_line_rules),
        cmocka_unit_test(line_ending_and_control_rules),
        cmocka_unit_test(header_rules),
        cmocka_unit_test(framing_rules),
        cmocka_unit_test(chunk_rules),
        cmocka_unit_test(body_limits),
        cmocka_unit_test(truncated_then_closed),
        cmocka_unit_test(after_an_error),
        cmocka_unit_test(response_with_content_length),
        cmocka_unit_test(response_chunked),
        cmocka_unit_test(response_until_close),
        cmocka_unit_test(responses_without_body),
        cmocka_unit_test(malformed_responses),
        cmocka_unit_test(hop_by_hop),
        cmocka_unit_test(out_of_memory_at_every_allocation),
        cmocka_unit_test(one_allocation_for_a_typical_message),
        cmocka_unit_test(large_messages_span_blocks),
        cmocka_unit_test(take_the_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
