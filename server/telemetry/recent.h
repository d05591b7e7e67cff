/* SPDX-License-Identifier: Apache-2.0 */
/*
 * recent.h — each route's recent past, for "what is wrong now": its
 * counters (counters.h) copied every RECENT_STEP_MS into a ring of
 * RECENT_STEPS samples, so that a rate, an error ratio or a percentile over
 * the last minute is the difference between the counters now and a sample
 * a minute old. Kept in the daemon, by the route's name, so a console that
 * opens late, or a reload, loses nothing: the last minute's every counter,
 * and the last hour's answers and 5xx step by step. Sampled on one loop's timer;
 * read by the JSON API on any loop, under the counters' lock.
 */
#ifndef IDEM_SERVER_RECENT_H
#define IDEM_SERVER_RECENT_H

#include <stdint.h>

#include "telemetry/counters.h"

#define RECENT_STEP_MS 10000
#define RECENT_FULL 7      /* samples of every counter: the last minute, and one */
#define RECENT_STEPS 360   /* an hour of steps: the answers and the 5xx of each */

/* What a route's counters held at one time. */
struct recent_sample {
    int64_t at_ms; /* mono_ms(); 0: not taken yet */
    unsigned long requests, errors, executions, replays, conflicts;
    unsigned long latency[LATENCY_BUCKETS];
};

/* What happened between two samples. */
struct recent_step {
    uint32_t ms, requests, errors;
};

struct recent {
    unsigned next; /* the slot of ring the next sample goes in */
    struct recent_sample ring[RECENT_FULL];
    unsigned steps, step_next; /* steps held (up to RECENT_STEPS), the next's slot */
    struct recent_step step[RECENT_STEPS];
};

/* A route's figures over a span: the counters now, less a sample's. */
struct recent_figures {
    double seconds;          /* the span (shorter than asked when younger) */
    unsigned long requests;  /* answers given in it */
    unsigned long errors;    /* of them, 5xx */
    unsigned long executions, replays;
    unsigned long conflicts; /* 409 and 422: in flight, reused, refused */
    double p50_ms, p99_ms;   /* -1: no request in the span */
};

/* Copy every route's counters into its ring, at now_ms (mono_ms()). Takes
 * the counters' lock. */
void recent_sample_all(struct counts *c, int64_t now_ms);

/* n's live counters read once at now_ms, and from them and its ring r:
 * into f (when not NULL) its figures over the last span_ms; into steps
 * (when not NULL, room for RECENT_STEPS) its steps of the last hour, oldest
 * first, the last one ending now when the newest sample is over a fifth of
 * a step old, and how many (fewer when younger). Under the counters'
 * lock. */
unsigned recent_read(const struct recent *r, const struct route_counts *n, int64_t now_ms,
                     int64_t span_ms, struct recent_figures *f, struct recent_step *steps);

#endif
