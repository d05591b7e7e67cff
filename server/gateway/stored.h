/* SPDX-License-Identifier: Apache-2.0 */
/*
 * stored.h — an upstream response as the gateway stores it in a record, and
 * back: status, the route's replay headers, body.
 */
#ifndef IDEM_SERVER_STORED_H
#define IDEM_SERVER_STORED_H

#include <stddef.h>

#include "config.h"
#include "http/http_parser.h"
#include "http/response.h"

/* Encode the upstream response resp for route rt (only rt's replay_headers
 * are kept). malloc'd bytes, *len set; NULL on OOM. */
char *stored_encode(const struct route *rt, int status, const struct http_msg *resp, size_t *len);

/* Encode a response the gateway made itself (a problem). */
char *stored_encode_response(const struct http_response *r, size_t *len);

/* Decode stored bytes into a response; NULL if they are not a stored
 * response (a record written by something else) or on OOM. */
struct http_response *stored_decode(const void *bytes, size_t len);

#endif
