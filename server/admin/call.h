/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.h — one call of the JSON API under /_idem/v1/ (admin): what an
 * endpoint's handler is given, how it answers, and the body's fields.
 *
 * A handler runs on the request's loop and must not block. It answers at
 * once with api_answer(), or starts one of the library's asynchronous calls
 * on c->loop, whose callback (on the same loop) answers. Either way it ends
 * with exactly one api_answer(), which gives the request its answer and
 * frees the call (and c->own with it).
 */
#ifndef IDEM_SERVER_CALL_H
#define IDEM_SERVER_CALL_H

#include <jansson.h>
#include <stdint.h>

#include "config.h"
#include "daemon.h"
#include "http/front.h"
#include "idem.h"

#define API_PREFIX "/_idem/v1"

struct api_call {
    struct daemon *d;
    struct live_config *lc;     /* held until the answer */
    const struct server_config *cfg;
    struct front_request *req;
    idem_loop *loop;            /* the request's, for the asynchronous calls */
    json_t *body;               /* a POST's body, a JSON object; NULL for GET */
    const char *subject;        /* a POST's subject (subject_header), "" when none */
    struct http_response *err;  /* the first field refused (api_str, api_int) */
    void *own;                  /* the handler's state: free()d with the call */
    char rest[];                /* the path under API_PREFIX/ */
};

/* Answer the call with r and free it. r NULL: the field refused (c->err),
 * or else a 503 (no memory). Loop thread. */
void api_answer(struct api_call *c, struct http_response *r);

/* {"outcome": o's name} and extra's fields (taken, NULL: none), 200. */
struct http_response *api_outcome(idem_outcome o, json_t *extra);

/* The body's field name: a string (NULL when absent or null), an integer
 * (dflt when absent). A required field absent, or a field of another type,
 * sets c->err to the 400 naming it (the first only). */
const char *api_str(struct api_call *c, const char *name, int required);
int64_t api_int(struct api_call *c, const char *name, int required, int64_t dflt);

/* A record as the JSON API shows it. */
json_t *api_record_json(const idem_record *r);

#endif
