/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_response.c — the answers idem serve builds (server/http/response.c):
 * their fields and body as set, in the blocks of one allocation when they
 * are small and in further blocks when not, and on the wire as built.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/blocks.h"
#include "http/response.h"
#include "testlib.h"

/* A problem answer, its text given after it was made, as the gateway does:
 * the body set twice, the later one kept. */
static void test_problem_text_replaces_the_body(void **state)
{
    (void)state;
    struct http_response *r = problem(409, "in_flight", "a claim holds %s", "R-1");
    assert_non_null(r);
    assert_int_equal(r->status, 409);
    assert_non_null(strstr(r->body, "a claim holds R-1"));
    assert_int_equal(problem_set_text(r, "Busy", "try again in a second"), 0);
    assert_int_equal(r->body_len, strlen(r->body));
    assert_non_null(strstr(r->body, "\"detail\":\"try again in a second\""));
    assert_null(strstr(r->body, "R-1"));
    size_t len;
    char *wire = response_serialize(r, 0, &len);
    assert_non_null(wire);
    assert_true(strncmp(wire, "HTTP/1.1 409 Conflict\r\n", 23) == 0);
    assert_non_null(strstr(wire, "Content-Type: application/problem+json\r\n"));
    assert_memory_equal(wire + len - r->body_len, r->body, r->body_len);
    free(wire);
    response_free(r);
}

/* Fields and a body beyond the first block: all of them on the wire, in
 * order, as set. */
static void test_many_fields_and_a_large_body(void **state)
{
    (void)state;
    enum { FIELDS = 60, VALUE = 200, BODY = 9000 };
    struct http_response *r = response_new(201);
    assert_non_null(r);
    char name[16], value[VALUE + 1];
    for (int f = 0; f < FIELDS; f++) {
        snprintf(name, sizeof name, "X-Field-%02d", f);
        for (int k = 0; k < VALUE; k++)
            value[k] = (char)('a' + (f + k) % 26);
        value[VALUE] = '\0';
        assert_int_equal(response_add_header(r, name, value), 0);
    }
    char *body = malloc(BODY);
    assert_non_null(body);
    for (size_t i = 0; i < BODY; i++)
        body[i] = (char)('0' + i % 10);
    assert_int_equal(response_set_body(r, body, BODY), 0);
    assert_int_equal(response_add_header(r, "X-After-Body", "1"), 0);

    assert_int_equal(r->header_count, FIELDS + 1);
    assert_non_null(r->blocks->next); /* it did go on past the first block */
    size_t len;
    char *wire = response_serialize(r, 0, &len);
    assert_non_null(wire);
    const char *at = wire;
    for (int f = 0; f < FIELDS; f++) {
        snprintf(name, sizeof name, "X-Field-%02d: ", f);
        for (int k = 0; k < VALUE; k++)
            value[k] = (char)('a' + (f + k) % 26);
        const char *h = strstr(at, name);
        assert_non_null(h);
        assert_memory_equal(h + strlen(name), value, VALUE);
        at = h + strlen(name) + VALUE;
    }
    assert_non_null(strstr(at, "X-After-Body: 1\r\n"));
    assert_non_null(strstr(wire, "\r\nContent-Length: 9000\r\n"));
    assert_memory_equal(wire + len - BODY, body, BODY);
    free(wire);
    free(body);
    response_free(r);
}

/* A typical answer, an upstream's passed on with idem's own fields, fits
 * the first block: it is one allocation, the answer itself. */
static void test_typical_answer_is_one_allocation(void **state)
{
    (void)state;
    struct http_response *r = response_new(201);
    assert_non_null(r);
    assert_int_equal(response_add_header(r, "Content-Type", "application/json"), 0);
    assert_int_equal(response_add_header(r, "Date", "Fri, 04 Dec 2026 10:00:00 GMT"), 0);
    assert_int_equal(response_add_header(r, "Location", "/v1/refunds/R-20261204-000123"), 0);
    assert_int_equal(response_add_header(r, "Idempotent-Replayed", "false"), 0);
    assert_int_equal(response_add_header(r, "X-Request-Id", "0b6e8f3c-5a1d-4e2f-9c7b"), 0);
    static const char body[] = "{\"refund_no\":\"R-20261204-000123\",\"status\":\"accepted\"}";
    assert_int_equal(response_set_body(r, body, sizeof body - 1), 0);
    assert_null(r->blocks->next);
    const char *lo = (const char *)r, *hi = (const char *)r->blocks->data + r->blocks->cap;
    for (size_t i = 0; i < r->header_count; i++)
        assert_true(r->headers[i].name > lo && r->headers[i].name < hi);
    assert_true(r->body > lo && r->body + r->body_len < hi);
    response_free(r);
}

/* An empty answer: no body, a Content-Length of 0. */
static void test_no_body(void **state)
{
    (void)state;
    struct http_response *r = response_new(200);
    assert_non_null(r);
    size_t len;
    char *wire = response_serialize(r, 0, &len);
    assert_non_null(wire);
    assert_non_null(strstr(wire, "\r\nContent-Length: 0\r\n\r\n"));
    assert_int_equal(wire[len - 1], '\n');
    free(wire);
    response_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_problem_text_replaces_the_body),
        cmocka_unit_test(test_many_fields_and_a_large_body),
        cmocka_unit_test(test_typical_answer_is_one_allocation),
        cmocka_unit_test(test_no_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
