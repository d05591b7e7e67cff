/* SPDX-License-Identifier: Apache-2.0 */
/*
 * front.h — the daemon's HTTP front end: accepts connections on a libevent
 * loop, reads requests through the strict parser under the configured
 * limits, hands each complete request to the handler on the loop, and
 * writes its answer.
 */
#ifndef IDEM_SERVER_FRONT_H
#define IDEM_SERVER_FRONT_H

#include <event2/event.h>
#include <stdatomic.h>
#include <stdint.h>

#include "config.h"
#include "http/http_parser.h"
#include "http/response.h"

struct conn;
struct route_counts;
struct front_request;

/* A step of a request's handling, run on its loop thread. */
typedef void (*front_step_fn)(struct front_request *req);

/* One request, from its parsing to its answer. The handler owns it from
 * the moment it is called until it calls front_answer(). */
struct front_request {
    struct http_msg *msg;       /* the request, parsed */
    char peer[64];              /* "127.0.0.1:53211" */
    struct http_response *resp; /* the answer; NULL at front_answer() means OOM (503) */
    void *loop_ctx;             /* the loop's own data, from front_new() */
    int admin;                  /* it came in on the admin listener */
    int tls;                    /* it came in over TLS */
    void *state;                /* the handler's */
    /* Set by the handler while the request waits on the loop's own events
     * (an upstream exchange, a timer): called instead of a step if the loop
     * is torn down first, to free what those events hold. */
    front_step_fn on_abort;
    /* What the handler made of it, for whoever reads the answer besides
     * the client (a consumer; counters): one of enum gw_outcome (daemon.h),
     * and for a claim the attempt it was and its epoch. */
    int outcome;
    /* The problem's type, static, when idem answered with its own for a
     * refusal (GW_KEY_INVALID ...) or for an executed request whose
     * answer was too big to keep; NULL otherwise. */
    const char *outcome_type;
    unsigned attempt;
    uint64_t epoch;
    /* Set by a consumer for a message a redrive put back: the epoch its
     * key's record had then. The claims before it are not counted in the
     * message's attempts (gateway.c, "attempts"); 0: none. */
    uint64_t attempt_base;
    /* For the access log, set by the handler: the route's name and the
     * record key ("" for none), the upstream's status (0: not asked) and
     * how long it took. Copies: the request outlives the route's config. */
    char log_route[65];
    char log_key[260];
    const char *log_outcome;    /* the front's own verdict ("overloaded"), or NULL */
    int upstream_status;
    int64_t upstream_us;
    int upstream_result;        /* the upstream call's enum upstream_result */
    /* The route's counters (struct route_counts), for the metrics as
     * the answer goes out; NULL: on no route. */
    struct route_counts *route_n;
    int64_t start_us;           /* mono_us() when the request was whole */
    /* Its X-Request-Id: the client's (request_id_own 0; cut to fit), or
     * one the front made for it (24 hex digits, request_id_own 1), which
     * the gateway passes on to the upstream; "" for none (injected). */
    char request_id[80];
    int request_id_own;
    size_t bytes_out;           /* the answer's body bytes, for the access log */
    struct conn *conn;          /* private to front.c: NULL when injected */
    struct front *front;        /* private to front.c */
};

/* Runs on the loop thread for every request, and must not block: it either
 * answers at once or parks the request (an asynchronous call of the
 * library's, whose callback comes to this loop, or events of its own on the
 * loop) and answers later. Either way it ends with exactly
 * one front_answer(). */
typedef void (*front_handler_fn)(void *arg, struct front_request *req);

/* The answer is req->resp (freed by the front end): written to the client,
 * or dropped if the client left. Loop thread only; the request is gone
 * after this call. */
void front_answer(struct front_request *req);

/* An answer already serialized, for a kept-alive connection: allowed when
 * front_can_answer_raw() says so (not a HEAD request; the connection stays
 * open after it). The bytes are copied or sent at once. Loop thread only;
 * the request is gone after this call. */
int front_can_answer_raw(const struct front_request *req);
void front_answer_raw(struct front_request *req, const void *bytes, size_t len);

/* A request made on the loop by the daemon itself (a consumer's message),
 * with no connection: msg is taken over, peer is "" (nothing to forward
 * as X-Forwarded-For). It counts as in flight on f (front_drain waits for
 * it) but not against the listeners' limits. Hand it to a handler as the
 * front would; its front_answer() calls answered(owner, req), which reads
 * req->resp (the front frees it, the message and req after). NULL when f
 * drains or on OOM (msg is freed). Loop thread only. */
typedef void (*front_answered_fn)(void *owner, struct front_request *req);
struct front_request *front_inject(struct front *f, struct http_msg *msg,
                                   front_answered_fn answered, void *owner);

/* Called on the loop for each request of the main listener as its answer
 * (of this status) goes out: the access log. */
typedef void (*front_log_fn)(void *arg, const struct front_request *req, int status);
void front_set_log(struct front *f, front_log_fn fn, void *arg);

/* 1 when the loop is being torn down: a step that sees it must free what it
 * holds and front_answer() without starting anything new. */
int front_closing(const struct front_request *req);

struct front;

/* loop_ctx is handed to every request of this loop (req->loop_ctx). */
struct front *front_new(struct event_base *base, const struct server_limits *limits,
                        front_handler_fn fn, void *arg, void *loop_ctx);

/* What the limits count, over the fronts of all loops. */
struct front_counts {
    atomic_size_t connections;       /* main listener: against connections_max */
    atomic_size_t admin_connections; /* admin listener: admin_connections_max */
    atomic_size_t in_flight;         /* main listener's requests: in_flight_max */
    struct peer_table *peers;        /* main listener's, by client address: the
                                        _per_peer limits (NULL: none counted) */
};

void front_counts_init(struct front_counts *n);

/* Several loops, one limit each: count in *counts, shared by the fronts of
 * all loops (a front counts on its own until this is called). */
void front_share_counts(struct front *f, struct front_counts *counts);

/* How much of a request's peer ("127.0.0.1:5311", "::1:5311", "unix") is
 * the client's address, without the port: what per-address limits count. */
size_t front_peer_host(const char *peer);

/* Whether host:port is free of other processes' listeners, before the
 * loops listen there: SO_REUSEPORT would let a second daemon (of the same
 * user) bind the port too, and the kernel would split the clients between
 * the two. 0, or -1 with err filled. */
int front_address_free(const char *host, int port, char *err, size_t errlen);

/* Listen on host:port (SO_REUSEPORT: every loop listens on the same port
 * and the kernel spreads connections). A front has up to two listeners: the
 * main one, and with admin set the admin one, whose requests carry
 * req->admin. With tls (which must outlive the front), every connection
 * speaks TLS. 0, or -1 with err filled ("127.0.0.1:8080: Address already
 * in use"). */
struct tls_server;
int front_listen(struct front *f, const char *host, int port, int admin, struct tls_server *tls,
                 char *err, size_t errlen);

/* The admin listener on a Unix socket at path, mode 0600, on this front
 * only (the kernel spreads no connections of a Unix socket over several
 * listeners: one loop takes them all). A socket file left by a daemon that
 * died is replaced; one that a live process listens on, or a file that is
 * not a socket, is refused. The caller unlinks it at exit. 0, or -1 with err
 * filled. */
int front_listen_unix(struct front *f, const char *path, char *err, size_t errlen);

/* The port actually bound (for port 0), of the main or the admin listener. */
int front_port(const struct front *f, int admin);

/* Graceful stop: stop accepting, close idle connections, let requests in
 * flight finish and be answered, then exit the loop — or exit it after
 * timeout_ms with requests still running. */
void front_drain(struct front *f, int64_t timeout_ms);

/* Requests being handled right now (not yet answered). */
size_t front_in_flight(struct front *f);

/* Requests parked on this loop's own events are aborted (on_abort), and
 * the front is closing from then on (front_closing): call after the loop
 * stopped, before the event base and the store close. */
void front_abort_parked(struct front *f);

/* Free the front end, once nothing may answer a request any more: every
 * asynchronous call made on the loop has called back (daemon_loop_settle).
 * NULL: no-op. */
void front_free(struct front *f);

#endif
