/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_key.h — what identifies a request to the gateway: its business key
 * (taken from a header, a JSON field, a query parameter or a path segment,
 * or several of them), scoped to its subject or not, and its fingerprint.
 */
#ifndef IDEM_SERVER_REQUEST_KEY_H
#define IDEM_SERVER_REQUEST_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "http/http_parser.h"
#include "idem.h"

/* The subject: the value of the subject header, NULL if absent. 0, or 400
 * with detail when the header is given more than once: an auth layer that
 * adds its own beside a client's would leave two, and which one is the
 * subject cannot be told. */
int request_subject(const struct http_msg *m, const char *header, const char **subject,
                    char *detail, size_t detail_len);

/* The field at a dotted path ("payer.account") of a parsed JSON body, as
 * text: strings as they are, integers as JSON writes them. 1 found, 0 not
 * (or null), -1 not a string or integer, or too long for cap. What a key
 * part { json: ... } reads when json_scan_field() leaves a body to the full
 * parse (and what fuzz/fuzz_json_scan.c holds the scan to). */
struct json_t;
int request_json_field(struct json_t *root, const char *name, char *out, size_t cap);

/* Build the record key for route rt from request m. subject is the value of
 * the subject header (NULL if absent). Returns 0 and fills key (IDEM_KEY_MAX
 * + 1 bytes), or returns the HTTP status to answer (400) with type and detail
 * filled: "key_missing", "key_invalid", "subject_missing". */
int request_key(const struct route *rt, const struct http_msg *m, const char *subject,
                char *key, const char **type, char *detail, size_t detail_len);

/* The state a request on a route with states names (states.field) into
 * out (cap bytes): 0, or 422 (unknown_state) with detail: missing, or not a
 * state of the route's machine. */
int request_state(const struct route *rt, const struct http_msg *m, char *out, size_t cap,
                  char *detail, size_t dlen);

/* The fingerprint per the route's setting. Returns 0 and sets *has (0 for
 * fingerprint: none), or 400 with detail (body is not JSON, for fields). */
int request_fingerprint(const struct route *rt, const struct http_msg *m,
                        uint8_t fp[IDEM_FINGERPRINT_LEN], int *has, char *detail,
                        size_t detail_len);

/* Percent-decode s[0..n) into out (cap bytes, NUL-terminated); '+' is a
 * space when plus_is_space (query strings). 0, or -1 if it does not fit, a
 * %-escape is broken, or it is %00. */
int request_pct_decode(const char *s, size_t n, char *out, size_t cap, int plus_is_space);

/* s percent-encoded (every byte but the unreserved ones: letters, digits,
 * "-._~") at out + *o, *o moved on and out kept NUL-terminable: 0, or -1
 * when it does not fit in cap. */
int request_pct_encode(const char *s, char *out, size_t cap, size_t *o);

/* The path part of a request target (before '?' or '#'), copied into out
 * (cap bytes), cut to fit. Returns its whole length: cap or more means it
 * was cut. */
size_t request_path(const char *target, char *out, size_t cap);

#endif
