/*
 * daemon.h — what the pieces of idem serve share: the Idem handle, the
 * current configuration (replaced whole on SIGHUP), counters.
 */
#ifndef IDEM_SERVER_DAEMON_H
#define IDEM_SERVER_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "front.h"
#include "idem.h"

/* A configuration in use. Requests hold a reference for their whole life,
 * so a reload never frees routes a request is still using. */
struct live_config {
    struct server_config *c;
    atomic_int refs;
};

struct daemon_counters {
    atomic_ulong requests;     /* gateway requests */
    atomic_ulong executions;   /* forwarded to the upstream under a claim */
    atomic_ulong replays;      /* answered from a stored result */
    atomic_ulong in_flight_409;
    atomic_ulong mismatches;
    atomic_ulong store_errors;
    atomic_ulong upstream_unknown; /* sent, outcome unknown: left PROCESSING */
    atomic_ulong passthrough;  /* no route: proxied untouched */
    atomic_ulong redis_down_skips; /* token or lock layer skipped: Redis down */
};

struct daemon {
    idem *h;
    pthread_mutex_t cfg_mu;
    struct live_config *live;
    char instance[24];         /* random, names this process in record owners */
    int reads_dont_block;      /* a file store: record reads bypass the writer */
    atomic_ulong seq;
    struct daemon_counters n;
};

struct live_config *daemon_config_get(struct daemon *d);
void daemon_config_put(struct live_config *lc);

/* The handler the front end runs on a worker for every request. */
void daemon_handle(void *arg, struct front_request *req);

/* Gateway and API, in gateway.c and api.c. */
void gateway_handle(struct daemon *d, const struct server_config *cfg, const struct route *rt,
                    struct front_request *req);
/* On the loop thread: a replay of a finished record, when one can be
 * answered without blocking (see front_fast_fn). */
int gateway_fast(struct daemon *d, const struct server_config *cfg, const struct route *rt,
                 struct front_request *req);
int daemon_fast(void *arg, struct front_request *req);
void passthrough_handle(struct daemon *d, const struct server_config *cfg,
                        struct front_request *req);
void api_handle(struct daemon *d, const struct server_config *cfg, struct front_request *req);

/* The problem for a failed Idem call: 400 for bad input, 503 for the store. */
struct http_response *problem_from_idem(idem_rc rc, const char *what);

#endif
