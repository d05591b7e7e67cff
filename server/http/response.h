/* SPDX-License-Identifier: Apache-2.0 */
/*
 * response.h — a response the daemon builds (from a handler, a replay or an
 * upstream) before the front end writes it, and the problem+json errors of
 * draft-ietf-httpapi-idempotency-key-header.
 */
#ifndef IDEM_SERVER_RESPONSE_H
#define IDEM_SERVER_RESPONSE_H

#include <stddef.h>

#include "http/http_parser.h"
#include "idem.h"

struct http_response {
    int status;
    struct http_header *headers; /* copies: the name, then the value */
    size_t header_count, header_cap;
    char *body;
    struct http_block *blocks;   /* where the above live (http/blocks.h) */
    size_t body_len;
    int close;                   /* send Connection: close and close after */
    int upstream_head;           /* an upstream's answer to HEAD, passed on: its
                                    own Content-Length (the length GET would
                                    have), if it gave one, is among the
                                    headers, and no other is sent */
    char problem_type[40];       /* a problem() of Idem's, not yet given its
                                    configured text: its type; else "" (an
                                    upstream's answer, a replay) */
};

/* A new response with this status and no headers or body; NULL on OOM. */
struct http_response *response_new(int status);
void response_free(struct http_response *r);
/* 0, or -1 on OOM. */
int response_add_header(struct http_response *r, const char *name, const char *value);
/* The same for a name and a value given by length (neither NUL-terminated). */
int response_add_header_n(struct http_response *r, const char *name, size_t nlen,
                          const char *value, size_t vlen);
/* Replace the body with a copy of len bytes. 0, or -1 on OOM. */
int response_set_body(struct http_response *r, const void *body, size_t len);

/* The bytes to send: status line, headers, Content-Length, Connection, body
 * (none for a HEAD request). malloc'd; NULL on OOM. */
char *response_serialize(const struct http_response *r, int head_request, size_t *len);

/* An application/problem+json response: {"type": "urn:idem:<type>", "title",
 * "status", "detail"}. type is the stable machine-readable name
 * ("key_missing"); detail says what exactly was wrong. Never NULL: on OOM a
 * static fallback is built. */
struct http_response *problem(int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The HTTP-date (IMF-fixdate, "Wed, 02 Dec 2026 01:36:13 GMT") of a
 * wall-clock instant in ms, the second it is in, into out (at least 30
 * bytes); its length, 0 for a year past 9999. */
size_t http_date(int64_t ms, char *out);

/* Give the problem r (problem_type set) this title and detail, each NULL to
 * keep its own; its type and status stay. Clears problem_type. 0, or -1 on
 * OOM (the body then keeps Idem's text). */
int problem_set_text(struct http_response *r, const char *title, const char *detail);

/* A problem about a claim (a 504 outcome_unknown, a 409 for a held or
 * running claim): its members epoch and held_until (RFC 3339, UTC, with
 * milliseconds; none when held_until_ms is 0), so that an operator's tool
 * need not read detail. 0, or -1 on OOM (the body stays as it was). */
int problem_set_claim(struct http_response *r, uint64_t epoch, int64_t held_until_ms);

/* The problem r's instance (RFC 9457): "urn:idem-request:" and the
 * request's id (its X-Request-Id, or the one Idem made), percent-encoded,
 * so that a client's report of the problem names the access log's line.
 * 0, or -1 on OOM (the body stays as it was). */
int problem_set_instance(struct http_response *r, const char *request_id);

/* The reason phrase for a status ("Conflict"), "" when unknown. */
const char *http_reason(int status);

/* The problem for a failed Idem call: 400 for bad input, 503 for the
 * store; what says what failed. */
struct http_response *problem_from_idem(idem_rc rc, const char *what);
/* The same with the error's detail given (it was captured on another
 * thread). */
struct http_response *problem_from_rc(idem_rc rc, const char *detail, const char *what);

/* An application/json answer of status, j (taken, NULL allowed) its body;
 * NULL (the caller's 503) when j is NULL or memory runs out. */
struct json_t;
struct http_response *json_response(int status, struct json_t *j);

#endif
