/*
 * daemon.h — what the pieces of idem serve share: the Idem handle, the
 * current configuration (replaced whole on SIGHUP), counters.
 */
#ifndef IDEM_SERVER_DAEMON_H
#define IDEM_SERVER_DAEMON_H

#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "http/front.h"
#include "idem.h"

/* A configuration in use. Requests hold a reference for their whole life,
 * so a reload never frees routes a request is still using. */
struct live_config {
    struct server_config *c;
    atomic_int refs;
};

/* How long gateway requests took, from their arrival to their answer: a
 * count per bucket, each bucket up to its bound in daemon_latency_bounds_us
 * (the last has none). */
#define LATENCY_BUCKETS 15

/* The values of enum gw_outcome (below), of enum upstream_result
 * (upstream.h), and the status codes counted (100 to 599): what bounds a
 * route's series in the metrics (metrics.c checks the first two). */
#define GW_OUTCOMES 14
#define UPSTREAM_RESULTS 5
#define STATUS_MIN 100
#define STATUS_CODES 500

/* A route's counters (the daemon's totals are their sums). */
struct daemon_counters {
    atomic_ulong requests;     /* gateway requests */
    atomic_ulong executions;   /* forwarded to the upstream under a claim */
    atomic_ulong replays;      /* answered from a stored result */
    atomic_ulong in_flight_409;
    atomic_ulong mismatches;
    atomic_ulong store_errors;
    atomic_ulong upstream_unknown; /* sent, outcome unknown: left PROCESSING */
    atomic_ulong redis_down_skips; /* token or lock layer skipped: Redis down */
    atomic_ulong unkeyed;      /* without the key on a key_required: false route:
                                  forwarded unguarded */
    atomic_ulong latency[LATENCY_BUCKETS];
    atomic_ulong latency_sum_us;
    /* Counted as each answer goes out (metrics_count_request): by verdict,
     * by status, the upstream's failures by kind ([UPSTREAM_OK] unused) and
     * its time, in the latency buckets. */
    atomic_ulong outcomes[GW_OUTCOMES];
    atomic_ulong codes[STATUS_CODES];
    atomic_ulong upstream_errors[UPSTREAM_RESULTS];
    atomic_ulong upstream_latency[LATENCY_BUCKETS];
    atomic_ulong upstream_latency_sum_us;
    atomic_ulong tokens_consumed; /* the token layer spent the request's token */
    atomic_ulong tokens_refused;  /* the token layer refused the request */
    atomic_ulong locks_acquired;  /* the lock layer took the key's lock */
    atomic_ulong locks_busy;      /* the lock layer found it held */
};

extern const int64_t daemon_latency_bounds_us[LATENCY_BUCKETS - 1];

/* A route's counters, by its name: a reload that keeps a route's name keeps
 * its counts. Made when a configuration is loaded, kept until exit. */
struct route_counters {
    struct route_counters *next;
    char name[65];
    struct daemon_counters n;
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
    struct workers *workers;
    /* The JSON API's record endpoints (a service finishing its own claims
     * among them) on the distributed store run on a pool of their own: a
     * Redis that stops answering holds each token call of the API on a
     * worker for up to twice the store's timeout, and must not hold them
     * up. NULL on the embedded store. (The gateway's calls are the
     * library's asynchronous ones, on the loops: no pool at all.) */
    struct workers *record_workers;
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
    /* The loop's read for finished records: how often it found one lately
     * (a score, see worth_reading() in gateway.c). */
    atomic_int read_score;
    atomic_ulong read_tick;
    /* Raised by a transition made through the JSON API: the loops' replay
     * caches drop what they kept before it. */
    atomic_ulong replay_gen;
    atomic_ulong passthrough;  /* requests on no route: proxied untouched */
    struct consumers *consumers; /* consumers: (consume.h), set before any request */
    /* The gateway's last record write failed (and none has worked since):
     * reads may still work (a full disk, a store gone read-only), so the
     * health check then tries a write of its own. */
    atomic_int writes_failing;
    /* The keys claimed by this daemon's requests, from their begin to their
     * answer: no other request for one is begun here meanwhile, whatever
     * its record's lease says. unkept_count: those whose answer the store
     * failed to keep, which write it again until it is (gateway.c, "claims
     * held here"). */
    pthread_mutex_t claims_mu;
    struct gw *claims[1024]; /* by the hash of space and key */
    atomic_ulong unkept_count;
    /* Each route's counters (route->n points into this list), and where
     * a route's go when there is no memory for its own. */
    pthread_mutex_t routes_mu;
    struct route_counters *route_n;
    struct daemon_counters n_unlisted;
};

struct gw;

/* What became of a gateway request (front_request.outcome), as the
 * consumers act on it and the counters see it. */
enum gw_outcome {
    GW_UNDECIDED = 0,     /* answered before a verdict (503 for want of memory, a
                             shutdown): nothing is known to have happened */
    GW_EXECUTED,          /* executed under its claim, its answer durably kept */
    GW_RELEASED,          /* not executed, or failed retryably: its claim released,
                             a retry executes (attempt says which this was) */
    GW_REPLAYED,          /* finished before: its stored answer */
    GW_IN_FLIGHT,         /* another request holds the key: 409 */
    GW_MISMATCH,          /* the key was used with another payload: 422 */
    GW_TOKEN_REFUSED,     /* the token layer said no: 409 or 428 */
    GW_KEY_INVALID,       /* no usable key, subject or fingerprint: 400
                             (front_request.outcome_type says which) */
    GW_STORE_UNAVAILABLE, /* a store call failed: 503, nothing executed */
    GW_OUTCOME_UNKNOWN,   /* sent, and no answer kept: the record stays PROCESSING
                             until its lease ends */
    GW_HELD,              /* held for an operator (on_unknown_outcome: hold) */
    GW_EXHAUSTED,         /* a consumer's message claimed past its max_attempts:
                             not sent again, the record failed for good */
    GW_PASSED_THROUGH,    /* on no route: proxied untouched */
    GW_UNKEYED,           /* on a key_required: false route without the key:
                             forwarded unguarded, nothing recorded */
};

/* The verdict's name in the access log: "executed", "replayed" ... */
const char *gw_outcome_name(int outcome);

struct live_config *daemon_config_get(struct daemon *d);
/* The sum over every route of the counter at offset field of struct
 * daemon_counters (offsetof). */
unsigned long daemon_total(struct daemon *d, size_t field);
/* The counter at offset field of n. */
static inline unsigned long daemon_counter(const struct daemon_counters *n, size_t field)
{
    return atomic_load((const atomic_ulong *)((const char *)n + field));
}

/* Point each route of cfg at its counters (made for a new name). Before
 * cfg is live. */
void daemon_attach_counters(struct daemon *d, struct server_config *cfg);
void daemon_config_put(struct live_config *lc);
/* Another reference to lc (one the caller holds). */
struct live_config *daemon_config_ref(struct live_config *lc);

/* Answer req with r (NULL: 503) before anything else holds the request,
 * and drop the configuration reference taken for it. */
void daemon_answer(struct live_config *lc, struct front_request *req, struct http_response *r);

/* A gateway request that arrived at start_us (mono_us()) is answered now:
 * counted in its route's durations (rt may be NULL: none). */
void daemon_observe(const struct route *rt, int64_t start_us);

/* What became of a record write (a begin or a finish), for the health
 * check. Any thread. */
void daemon_write_ok(struct daemon *d);
void daemon_write_failed(struct daemon *d, idem_rc rc);

/* The loop has stopped, its parked requests aborted: every asynchronous
 * call it made is finished and its callback run (the request, finding the
 * front closing, is abandoned). */
void daemon_loop_settle(struct daemon_loop *l);

/* The handler the front end runs on the loop for every request. */
void daemon_handle(void *arg, struct front_request *req);

/* In gateway.c: a request on a route, and a request on no route (proxied
 * untouched). gateway_start takes over the reference lc. Loop thread. */
void gateway_start(struct daemon *d, struct live_config *lc, const struct route *rt,
                   struct front_request *req);
void passthrough_start(struct daemon *d, const struct server_config *cfg,
                       struct front_request *req);
/* What the token and lock layers' calls said (rc, o) on a route: counted
 * for the metrics. Any thread. */
void daemon_count_token(const struct route *rt, idem_rc rc, idem_outcome o);
void daemon_count_lock(const struct route *rt, idem_rc rc, idem_outcome o);

/* In api.c, on a worker thread: the whole JSON API for a request of the
 * admin listener; for one of the main listener, only what clients may do
 * there (api_public_endpoint). */
void api_handle(struct daemon *d, const struct server_config *cfg, struct front_request *req);
/* 1 for the endpoints of the main listener: health, and token issuance
 * (rest is the path after /_idem/v1/). */
int api_public_endpoint(const char *rest);
/* The record (space, key) read into rec: NULL, or the problem to answer
 * (the store's trouble, or 404 record_not_found), rec then empty. */
struct http_response *api_record_get(struct daemon *d, const char *space, const char *key,
                                     idem_record *rec);


#endif
