/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.h — what the rooms of idem serve share (daemon.c): the Idem
 * handle, the current configuration (replaced whole on SIGHUP) and its
 * references, an event loop's own, the counters, the store's write health.
 * Every room may read it; it reads none of them.
 */
#ifndef IDEM_SERVER_DAEMON_H
#define IDEM_SERVER_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "http/front.h"
#include "telemetry/counters.h"
#include "telemetry/held_census.h"
#include "idem.h"

/* A configuration in use. Requests hold a reference for their whole life,
 * so a reload never frees routes a request is still using. */
struct live_config {
    struct server_config *c;
    atomic_int refs;
};

/* One event loop's own: its base, its upstream connections (every request
 * of the loop gets it as req->loop_ctx). */
struct daemon_loop {
    struct daemon *d;
    struct event_base *base;
    idem_loop *iloop;             /* the base, for Idem's asynchronous calls */
    struct upstream_loop *upstreams;
    struct replay_cache *replays; /* NULL: limits.replay_cache is 0 */
    unsigned long replay_gen;     /* the daemon's replay_gen it was last cleared at */
    struct access_buf *alog;      /* the access log's lines of this loop; NULL: off */
};

/* The main listener's last health answer (api.c, public_health). */
struct daemon_health {
    pthread_mutex_t mu;
    int64_t at_ms; /* mono_ms() of the look; 0: none yet */
    int looking;   /* a request is looking at the store now */
    int status;
    char body[160];
    size_t body_len;
};

struct daemon {
    idem *h;
    pthread_mutex_t cfg_mu;
    struct live_config *live;
    char instance[24];         /* random, names this process in record owners */
    /* The main listener's token issuance, by subject and by client
     * address; the admin listener's failed API keys, by client address. */
    struct rate_table *issued_by_subject, *issued_by_peer, *auth_failures_by_peer;
    atomic_ulong auth_failures; /* 401s on the admin listener */
    atomic_ulong tokens_refused; /* 429s of the token issuance on listen */
    atomic_ulong tokens_issued;  /* 201s of POST /_idem/v1/tokens, either listener */
    /* What the fronts count (serve.c's, set before any request): the main
     * listener's requests being handled, for the metrics. */
    const struct front_counts *front_counts;
    struct daemon_health public_health;
    atomic_ulong seq;
    /* Raised by a transition made through the JSON API: the loops' replay
     * caches drop what they kept before it. */
    atomic_ulong replay_gen;
    atomic_ulong passthrough;  /* requests on no route: proxied untouched */
    atomic_int reload_failed;  /* the last SIGHUP was refused (metrics) */
    atomic_long config_loaded_s; /* wall seconds when the running config was loaded */
    struct consumers *consumers; /* consumers: (consume.h), set before any request */
    /* The gateway's last record write failed (and none has worked since):
     * reads may still work (a full disk, a store gone read-only), so the
     * health check then tries a write of its own. */
    atomic_int writes_failing;
    struct gateway *gateway; /* the gateway's own (gateway/gateway.h) */
    struct counts counts; /* each route's (route->n points into it) */
    struct held_census held; /* the claims held now, per space (admin/held_census.h) */
};

struct live_config *daemon_config_get(struct daemon *d);
void daemon_config_put(struct live_config *lc);
/* Another reference to lc (one the caller holds). */
struct live_config *daemon_config_ref(struct live_config *lc);

/* Answer req with r (NULL: 503) before anything else holds the request,
 * and drop the configuration reference taken for it. */
void daemon_answer(struct live_config *lc, struct front_request *req, struct http_response *r);

/* What became of a record write (a begin or a finish), for the health
 * check. Any thread. */
void daemon_write_ok(struct daemon *d);
void daemon_write_failed(struct daemon *d, idem_rc rc);

/* The loop has stopped, its parked requests aborted: every asynchronous
 * call it made is finished and its callback run (the request, finding the
 * front closing, is abandoned). */
void daemon_loop_settle(struct daemon_loop *l);

#endif
