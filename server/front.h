/*
 * front.h — the daemon's HTTP front end: accepts connections on a libevent
 * loop, reads requests through the strict parser under the configured
 * limits, hands each complete request to a worker, and writes the answer.
 */
#ifndef IDEM_SERVER_FRONT_H
#define IDEM_SERVER_FRONT_H

#include <event2/event.h>
#include <stdatomic.h>
#include <stdint.h>

#include "config.h"
#include "http_parser.h"
#include "response.h"
#include "workers.h"

struct conn;

/* One request on its way through a worker. */
struct front_request {
    struct work work;           /* the worker pool's link */
    struct http_msg *msg;       /* the request, parsed */
    char peer[64];              /* "127.0.0.1:53211" */
    struct http_response *resp; /* set by the handler; NULL means OOM (503) */
    struct conn *conn;          /* private to front.c */
    struct front *front;        /* private to front.c */
};

/* Runs on a worker thread; must set req->resp. */
typedef void (*front_handler_fn)(void *arg, struct front_request *req);

/* Runs on the loop thread first, and must not block: returns 1 with
 * req->resp set when it could answer at once (a replay), else 0 and the
 * request goes to a worker. */
typedef int (*front_fast_fn)(void *arg, struct front_request *req);

struct front;

struct front *front_new(struct event_base *base, const struct server_limits *limits,
                        struct workers *ws, front_handler_fn fn, void *arg);

/* Install the loop thread's fast path (optional). */
void front_set_fast_path(struct front *f, front_fast_fn fn);

/* Several loops, one limit: count connections in *total (shared by the
 * fronts of all loops) against connections_max. */
void front_share_connection_count(struct front *f, atomic_size_t *total);

/* Listen on host:port (SO_REUSEPORT: every loop listens on the same port
 * and the kernel spreads connections). 0, or -1 with err filled
 * ("127.0.0.1:8080: Address already in use"). */
int front_listen(struct front *f, const char *host, int port, char *err, size_t errlen);

/* The port actually bound (for port 0). */
int front_port(const struct front *f);

/* Graceful stop: stop accepting, close idle connections, let requests in
 * flight finish and be answered, then exit the loop — or exit it after
 * timeout_ms with requests still running. */
void front_drain(struct front *f, int64_t timeout_ms);

/* Requests in a worker's hands right now. */
size_t front_in_flight(struct front *f);

/* Free the front end; workers must have been stopped first. NULL: no-op. */
void front_free(struct front *f);

#endif
