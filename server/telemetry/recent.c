/* SPDX-License-Identifier: Apache-2.0 */
/*
 * recent.c — each route's recent past (recent.h): the ring of samples, and
 * the figures over a span read from it, the percentiles interpolated
 * within a latency bucket as Prometheus's histogram_quantile() does.
 */
#include "telemetry/recent.h"

#include <stdlib.h>
#include <string.h>

/* The counters of n now, as a sample taken at now_ms. */
static void take(const struct route_counts *n, int64_t now_ms, struct recent_sample *s)
{
    s->at_ms = now_ms;
    s->requests = 0;
    for (int v = 0; v < GW_OUTCOMES; v++)
        s->requests += atomic_load(&n->outcomes[v]);
    s->errors = 0;
    for (int code = 500; code < STATUS_MIN + STATUS_CODES; code++)
        s->errors += atomic_load(&n->codes[code - STATUS_MIN]);
    s->executions = atomic_load(&n->executions);
    s->replays = atomic_load(&n->outcomes[GW_REPLAYED]);
    s->conflicts = atomic_load(&n->outcomes[GW_IN_FLIGHT]) +
                   atomic_load(&n->outcomes[GW_MISMATCH]) +
                   atomic_load(&n->outcomes[GW_TOKEN_REFUSED]) +
                   atomic_load(&n->outcomes[GW_TRANSITION_CONFLICT]);
    for (int b = 0; b < LATENCY_BUCKETS; b++)
        s->latency[b] = atomic_load(&n->latency[b]);
}

void recent_sample_all(struct counts *c, int64_t now_ms)
{
    pthread_mutex_lock(&c->mu);
    for (struct named_counts *nc = c->list; nc; nc = nc->next) {
        if (!nc->recent && !(nc->recent = calloc(1, sizeof *nc->recent)))
            continue; /* no past for it: its figures span its whole life */
        struct recent *r = nc->recent;
        const struct recent_sample *last = &r->ring[(r->next + RECENT_FULL - 1) % RECENT_FULL];
        struct recent_sample *s = &r->ring[r->next];
        take(&nc->n, now_ms, s);
        if (last->at_ms) {
            r->step[r->step_next] = (struct recent_step){
                .ms = (uint32_t)(now_ms - last->at_ms),
                .requests = (uint32_t)(s->requests - last->requests),
                .errors = (uint32_t)(s->errors - last->errors),
            };
            r->step_next = (r->step_next + 1) % RECENT_STEPS;
            if (r->steps < RECENT_STEPS)
                r->steps++;
        }
        r->next = (r->next + 1) % RECENT_FULL;
    }
    pthread_mutex_unlock(&c->mu);
}

/* The i-th sample back from the newest (0: the newest), or NULL. */
static const struct recent_sample *back(const struct recent *r, unsigned i)
{
    if (!r || i >= RECENT_FULL)
        return NULL;
    const struct recent_sample *s = &r->ring[(r->next + RECENT_FULL - 1 - i) % RECENT_FULL];
    return s->at_ms ? s : NULL;
}

/* The value below which q of the durations in the bucket counts d fall,
 * in ms: linear within its bucket; in the last (no bound), its lower one. */
static double quantile(const unsigned long *d, unsigned long total, double q)
{
    double want = q * (double)total, seen = 0;
    for (int b = 0; b < LATENCY_BUCKETS; b++) {
        if (seen + (double)d[b] < want || d[b] == 0) {
            seen += (double)d[b];
            continue;
        }
        double lo = b ? (double)latency_bounds_us[b - 1] : 0;
        if (b == LATENCY_BUCKETS - 1)
            return lo / 1000.0;
        double hi = (double)latency_bounds_us[b];
        return (lo + (hi - lo) * (want - seen) / (double)d[b]) / 1000.0;
    }
    return -1;
}

/* The figures over the last span_ms, now's counters less a sample's. */
static void figures(const struct recent *r, const struct recent_sample *now, int64_t span_ms,
                    struct recent_figures *f)
{
    struct recent_sample zero = {0};
    int64_t now_ms = now->at_ms;
    /* The newest sample at least span_ms old, else the oldest there is,
     * else none: since the counters began (zero, at an unknown time). */
    const struct recent_sample *from = NULL, *s;
    for (unsigned i = 0; (s = back(r, i)) != NULL; i++) {
        from = s;
        if (now_ms - s->at_ms >= span_ms)
            break;
    }
    if (!from)
        from = &zero;
    memset(f, 0, sizeof *f);
    f->seconds = from->at_ms ? (double)(now_ms - from->at_ms) / 1000.0 : 0;
    f->requests = now->requests - from->requests;
    f->errors = now->errors - from->errors;
    f->executions = now->executions - from->executions;
    f->replays = now->replays - from->replays;
    f->conflicts = now->conflicts - from->conflicts;
    unsigned long d[LATENCY_BUCKETS], timed = 0;
    for (int b = 0; b < LATENCY_BUCKETS; b++)
        timed += d[b] = now->latency[b] - from->latency[b];
    f->p50_ms = timed ? quantile(d, timed, 0.50) : -1;
    f->p99_ms = timed ? quantile(d, timed, 0.99) : -1;
}

/* The steps of the last hour, into out; how many. */
static unsigned steps_of(const struct recent *r, const struct recent_sample *now,
                         struct recent_step *out)
{
    if (!r)
        return 0;
    /* Now, since the newest sample, when that says something. */
    const struct recent_sample *newest = back(r, 0);
    struct recent_step live = {0};
    int has_live = newest && now->at_ms - newest->at_ms >= RECENT_STEP_MS / 5;
    if (has_live)
        live = (struct recent_step){
            .ms = (uint32_t)(now->at_ms - newest->at_ms),
            .requests = (uint32_t)(now->requests - newest->requests),
            .errors = (uint32_t)(now->errors - newest->errors),
        };
    unsigned kept = r->steps - (has_live && r->steps == RECENT_STEPS);
    unsigned first = (r->step_next + RECENT_STEPS - kept) % RECENT_STEPS;
    for (unsigned i = 0; i < kept; i++)
        out[i] = r->step[(first + i) % RECENT_STEPS];
    if (has_live)
        out[kept++] = live;
    return kept;
}

unsigned recent_read(const struct recent *r, const struct route_counts *n, int64_t now_ms,
                     int64_t span_ms, struct recent_figures *f, struct recent_step *steps)
{
    struct recent_sample now;
    take(n, now_ms, &now);
    if (f)
        figures(r, &now, span_ms, f);
    return steps ? steps_of(r, &now, steps) : 0;
}
