/*
 * upstream.h — the daemon's HTTP client for upstreams: blocking, called from
 * worker threads, with a keep-alive pool per upstream and an answer that
 * says not only "failed" but whether the request can have reached the
 * upstream. That difference decides what the gateway may do: a request that
 * was never sent can be released and retried; one that was sent and not
 * answered may have executed, and must not be run again blindly.
 */
#ifndef IDEM_SERVER_UPSTREAM_H
#define IDEM_SERVER_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "http_parser.h"

enum upstream_result {
    UPSTREAM_OK,        /* a whole response: *resp */
    UPSTREAM_NOT_SENT,  /* no byte of the request reached the upstream */
    UPSTREAM_UNKNOWN,   /* sent, then the connection failed or the answer was
                           malformed: the upstream may have executed */
    UPSTREAM_TIMEOUT,   /* sent, no whole answer within the timeout */
    UPSTREAM_TOO_BIG,   /* answered (so executed) with a body over the limit */
};

struct upstream_pool;

/* The pool for host:port, created on first use; lives until
 * upstream_pools_free(). Thread-safe. NULL on OOM. */
struct upstream_pool *upstream_pool_get(const char *host, int port);
void upstream_pools_free(void);

struct upstream_request {
    const char *method;
    const char *target;              /* path and query to send */
    const struct http_msg *original; /* headers and body to forward; hop-by-hop
                                        headers and Host are not forwarded */
    const char *peer;                /* appended to X-Forwarded-For */
    const char *const *extra;        /* more "Name: value" headers, NULL-terminated */
    int64_t timeout_ms;              /* the whole exchange */
    size_t response_max;             /* response body limit */
    /* Called about every tick_ms while waiting for the answer (to extend a
     * lease). tick may be NULL. */
    void (*tick)(void *arg);
    void *tick_arg;
    int64_t tick_ms;
};

/* Send the request and read the answer. On UPSTREAM_OK *resp is the
 * response (free with http_msg_free). detail says what happened otherwise. */
enum upstream_result upstream_exchange(struct upstream_pool *pool,
                                       const struct upstream_request *rq,
                                       struct http_msg **resp, char *detail,
                                       size_t detail_len);

#endif
