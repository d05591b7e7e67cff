/* SPDX-License-Identifier: Apache-2.0 */
/*
 * counters.h — what the gateway and the consumers count (telemetry): each
 * route's counters, kept by the route's name across reloads, the verdicts
 * they count, and the latency buckets. The gateway and the consumers write
 * them as each answer goes out; the health endpoint and the metrics read
 * them. Atomics only: no lock on the paths that count.
 */
#ifndef IDEM_SERVER_COUNTERS_H
#define IDEM_SERVER_COUNTERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "idem.h"

struct front_request;
struct recent;

/* How long requests took, from their arrival to their answer (and the
 * upstream's part of it): a count per bucket, each bucket up to its bound
 * in latency_bounds_us (the last has none). */
#define LATENCY_BUCKETS 17
extern const int64_t latency_bounds_us[LATENCY_BUCKETS - 1];

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
    GW_SIGNATURE_REFUSED, /* on a route with signature:, not signed by its
                             secrets, or too long ago: 401, nothing recorded
                             (front_request.outcome_type says which) */
    GW_STALE,             /* on a route with states: an event behind the key's
                             state, out of order: 200, not forwarded */
    GW_TRANSITION_CONFLICT, /* on a route with states: an event that contradicts
                               the key's state: 409, not forwarded */
    GW_KEY_EXPIRED,       /* on a route with tombstone: a key past its retention,
                             within its tombstone: 410, not forwarded */
};

/* The values of enum gw_outcome, of enum upstream_result (http/upstream.h),
 * and the status codes counted (100 to 599): what bounds a route's series
 * in the metrics (metrics.c checks the first two). */
#define GW_OUTCOMES 18
#define UPSTREAM_RESULTS 5
#define STATUS_MIN 100
#define STATUS_CODES 500

/* The verdict's name in the access log and the metrics: "executed" ... */
const char *gw_outcome_name(int outcome);

/* A route's counters (the daemon's totals are their sums). */
struct route_counts {
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
    /* Counted as each answer goes out (counts_answer): by verdict, by
     * status, the upstream's failures by kind ([UPSTREAM_OK] unused) and
     * its time, in the latency buckets. */
    atomic_ulong outcomes[GW_OUTCOMES];
    atomic_ulong codes[STATUS_CODES];
    atomic_ulong upstream_errors[UPSTREAM_RESULTS];
    atomic_ulong upstream_latency[LATENCY_BUCKETS];
    atomic_ulong upstream_latency_sum_us;
    atomic_ulong tokens_consumed; /* the token layer spent the request's token */
    atomic_ulong locks_acquired;  /* the lock layer took the key's lock */
    atomic_ulong locks_busy;      /* the lock layer found it held */
    atomic_ulong resolutions[4];  /* on_unknown_outcome: resolve: the status queries,
                                     by verdict: executed, not_executed, unanswered,
                                     given_up (gateway.c, "resolving") */
    atomic_ulong stale;           /* states: events behind the key's state */
    atomic_ulong transition_conflicts; /* states: events contradicting it */
};

/* A route's counters, by its name, and their recent past (recent.h; made
 * at its first sample). */
struct named_counts {
    struct named_counts *next;
    char name[65];
    struct route_counts n;
    struct recent *recent;
};

/* Every route's counters: made when a configuration is loaded (a reload
 * that keeps a route's name keeps its counts), kept until exit. */
struct counts {
    pthread_mutex_t mu; /* guards the list's growth */
    struct named_counts *list;
    struct route_counts unlisted; /* a route's, when there is no memory for its own */
};

void counts_init(struct counts *c);
void counts_free(struct counts *c);

/* Point each route and consumer of cfg at its counters (made for a new
 * name). Before cfg is live. */
void counts_attach(struct counts *c, struct server_config *cfg);

/* The counter at offset field of struct route_counts (offsetof), in n; and
 * its sum over every route. */
static inline unsigned long counts_read(const struct route_counts *n, size_t field)
{
    return atomic_load((const atomic_ulong *)((const char *)n + field));
}
unsigned long counts_total(struct counts *c, size_t field);

/* One duration in us, counted in buckets (LATENCY_BUCKETS of them) and
 * their sum. */
void counts_latency(atomic_ulong *buckets, atomic_ulong *sum_us, int64_t us);

/* A gateway request that arrived at start_us (mono_us()) is answered now:
 * counted in its route's durations (rt may be NULL: none). */
void counts_observe(const struct route *rt, int64_t start_us);

/* What the token and lock layers' calls said (rc, o) on a route. */
void counts_token(const struct route *rt, idem_rc rc, idem_outcome o);
void counts_lock(const struct route *rt, idem_rc rc, idem_outcome o);

/* A request on a route (n: its counters; NULL: on none, not counted)
 * answered with status: its verdict, status, and the upstream's time and
 * failure. On its loop, as the answer goes out. */
void counts_answer(struct route_counts *n, const struct front_request *req, int status);

#endif
