/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upstream.h — the daemon's HTTP client for upstreams, with a keep-alive
 * pool per upstream and an answer that says not only "failed" but whether
 * the request can have reached the upstream. That difference decides what
 * the gateway may do: a request that was never sent can be released and
 * retried; one that was sent and not answered may have executed, and must
 * not be run again blindly.
 *
 * The client is non-blocking, on a libevent event_base: the result comes to
 * a callback. Pools are per event loop (struct upstream_loop).
 */
#ifndef IDEM_SERVER_UPSTREAM_H
#define IDEM_SERVER_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "http/http_parser.h"

struct event_base;
typedef struct ssl_ctx_st SSL_CTX;

enum upstream_result {
    UPSTREAM_OK,        /* a whole response: *resp */
    UPSTREAM_NOT_SENT,  /* no byte of the request reached the upstream */
    UPSTREAM_UNKNOWN,   /* sent, then the connection failed or the answer was
                           malformed: the upstream may have executed */
    UPSTREAM_TIMEOUT,   /* sent, no whole answer within the timeout */
    UPSTREAM_TOO_BIG,   /* answered (so executed) with a body over the limit,
                           or a head over the limits below */
};

/* "ok", "not_sent", "unknown", "timeout", "too_big": the metrics' and the
 * access log's names. */
const char *upstream_result_name(enum upstream_result r);

/* The most an upstream's answer head may hold: header fields, and bytes of
 * them. An answer over either is too big (UPSTREAM_TOO_BIG), as is one with
 * a body over the request's response_max. */
#define UPSTREAM_HEAD_FIELDS_MAX 200
#define UPSTREAM_HEAD_BYTES_MAX (64 * 1024)

struct upstream_request {
    const char *method;
    const char *base_path;           /* sent before target; NULL or "" for none */
    const char *target;              /* path and query to send */
    const struct http_msg *original; /* headers and body to forward; hop-by-hop
                                        headers and Host are not forwarded */
    const char *peer;                /* appended to X-Forwarded-For */
    /* The client's scheme ("http", "https"): X-Forwarded-Proto and Host,
     * and an element of Forwarded (RFC 7239) with peer, are sent for it;
     * NULL for a request no client sent (a message, a status query). */
    const char *proto;
    int pass_host;                   /* send the client's Host, not the upstream's */
    const char *const *extra;        /* more "Name: value" headers, NULL-terminated */
    int64_t timeout_ms;              /* the whole exchange, connecting included */
    size_t response_max;             /* response body limit */
};

/* ---- addresses ----------------------------------------------------------- */

/* Where an upstream is: host:port and its addresses, looked up once when a
 * configuration is loaded (at start, by --check, at each SIGHUP), never on
 * an event loop's request path, so that no loop ever waits on DNS. Shared
 * and reference-counted: a call keeps the set it was started with, so a
 * reload may drop it while calls are under way. */
struct upstream_addrs;

/* host:port's addresses, reached with TLS when tls is set (https://). The
 * lookup may block on DNS (a numeric address never does). NULL with detail
 * ("upstream svc:9000: Name or service not known") when the name does not
 * resolve, or on OOM. */
struct upstream_addrs *upstream_resolve(const char *host, int port, int tls, char *detail,
                                        size_t dlen);

/* Another reference to a (returned). */
struct upstream_addrs *upstream_addrs_get(struct upstream_addrs *a);

/* Drop a reference; the last frees the set. NULL is a no-op. */
void upstream_addrs_put(struct upstream_addrs *a);

/* ---- non-blocking, on an event loop -------------------------------------- */

/* One event loop's upstream connections: a keep-alive pool per host:port
 * (at most 64 idle connections each, reused while idle under 2 s, closed as
 * soon as the upstream closes them or sends anything while they idle).
 * Everything below runs on the loop's thread only: not thread-safe. */
struct upstream_loop;

/* NULL on OOM. base must outlive the upstream_loop, and tls (NULL: no
 * https:// upstreams; a call to one is NOT_SENT) too: the context TLS
 * connections are made with, their certificates checked against it and the
 * upstream's host name. */
struct upstream_loop *upstream_loop_new(struct event_base *base, SSL_CTX *tls);
/* Closes the idle connections. Every call must have finished (done ran) or
 * been cancelled. NULL is a no-op. */
void upstream_loop_free(struct upstream_loop *ul);

struct upstream_call;

/* The call's result. resp (UPSTREAM_OK only, else NULL) is the callee's:
 * free it with http_msg_free. detail says what happened otherwise ("" on
 * OK); it lives until done returns. The call is gone once done returns. */
typedef void (*upstream_done_fn)(void *arg, enum upstream_result r, struct http_msg *resp,
                                 const char *detail);

/* Start the exchange with the upstream at `to`, connecting to its
 * addresses in turn when no pooled connection is at hand; the call keeps a
 * reference to `to` until it ends. The request's bytes are built at once
 * from rq: rq and what it points to need not outlive this call. done is
 * called exactly once, later, on the loop's thread: never from inside
 * upstream_call_start, even for a result known at once.
 * NULL on OOM; then done never runs. Nothing here blocks. */
struct upstream_call *upstream_call_start(struct upstream_loop *ul, struct upstream_addrs *to,
                                          const struct upstream_request *rq,
                                          upstream_done_fn done, void *arg);

/* 1 once a byte of the request has gone out: the upstream may have it, and
 * may execute it whatever happens to the call now. */
int upstream_call_sent(const struct upstream_call *c);

/* Abandon a call before done ran: its connection is closed (whatever was
 * sent may have reached the upstream), done never runs, the call is gone.
 * NULL is a no-op. */
void upstream_call_cancel(struct upstream_call *c);

#endif
