/* SPDX-License-Identifier: Apache-2.0 */
/*
 * counters.c — each route's counters (counters.h), kept by name across
 * reloads, their totals, the latency buckets, and the verdicts' names.
 * Counted by the gateway and the consumers; read by the health endpoint
 * and the metrics.
 */
#include "telemetry/counters.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/front.h"
#include "http/upstream.h"
#include "mono.h"

const int64_t latency_bounds_us[LATENCY_BUCKETS - 1] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
    5000000, 10000000, 30000000, 60000000,
};

const char *gw_outcome_name(int outcome)
{
    static const char *const names[] = {
        [GW_UNDECIDED] = "undecided",
        [GW_EXECUTED] = "executed",
        [GW_RELEASED] = "upstream_error",
        [GW_REPLAYED] = "replayed",
        [GW_IN_FLIGHT] = "in_flight",
        [GW_MISMATCH] = "mismatch",
        [GW_TOKEN_REFUSED] = "token_refused",
        [GW_KEY_INVALID] = "key_invalid",
        [GW_STORE_UNAVAILABLE] = "store_unavailable",
        [GW_OUTCOME_UNKNOWN] = "outcome_unknown",
        [GW_HELD] = "held",
        [GW_EXHAUSTED] = "attempts_exhausted",
        [GW_PASSED_THROUGH] = "passed_through",
        [GW_UNKEYED] = "unkeyed",
        [GW_SIGNATURE_REFUSED] = "signature_refused",
        [GW_STALE] = "stale",
        [GW_TRANSITION_CONFLICT] = "conflict",
        [GW_KEY_EXPIRED] = "key_expired",
    };
    return outcome >= 0 && (size_t)outcome < sizeof names / sizeof names[0] && names[outcome]
               ? names[outcome]
               : "undecided";
}

void counts_init(struct counts *c)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
}

void counts_free(struct counts *c)
{
    while (c->list) {
        struct named_counts *dead = c->list;
        c->list = dead->next;
        free(dead->recent);
        free(dead);
    }
    pthread_mutex_destroy(&c->mu);
}

void counts_latency(atomic_ulong *buckets, atomic_ulong *sum_us, int64_t us)
{
    int b = 0;
    while (b < LATENCY_BUCKETS - 1 && us > latency_bounds_us[b])
        b++;
    atomic_fetch_add(&buckets[b], 1);
    atomic_fetch_add(sum_us, (unsigned long)(us > 0 ? us : 0));
}

void counts_observe(const struct route *rt, int64_t start_us)
{
    if (rt && rt->n)
        counts_latency(rt->n->latency, &rt->n->latency_sum_us, mono_us() - start_us);
}

void counts_token(const struct route *rt, idem_rc rc, idem_outcome o)
{
    if (rt && rt->n && rc == IDEM_OK && o == IDEM_CONSUMED)
        atomic_fetch_add(&rt->n->tokens_consumed, 1);
}

void counts_lock(const struct route *rt, idem_rc rc, idem_outcome o)
{
    if (!rt || !rt->n || rc != IDEM_OK)
        return;
    if (o == IDEM_ACQUIRED)
        atomic_fetch_add(&rt->n->locks_acquired, 1);
    else if (o == IDEM_BUSY)
        atomic_fetch_add(&rt->n->locks_busy, 1);
}

void counts_answer(struct route_counts *n, const struct front_request *req, int status)
{
    if (!n)
        return;
    if (req->outcome >= 0 && req->outcome < GW_OUTCOMES)
        atomic_fetch_add(&n->outcomes[req->outcome], 1);
    if (status >= STATUS_MIN && status < STATUS_MIN + STATUS_CODES)
        atomic_fetch_add(&n->codes[status - STATUS_MIN], 1);
    /* The upstream was asked: it answered (a status), or it failed. */
    if (req->upstream_status || req->upstream_us) {
        counts_latency(n->upstream_latency, &n->upstream_latency_sum_us, req->upstream_us);
        if (req->upstream_result > UPSTREAM_OK && req->upstream_result < UPSTREAM_RESULTS)
            atomic_fetch_add(&n->upstream_errors[req->upstream_result], 1);
    }
}

unsigned long counts_total(struct counts *c, size_t field)
{
    pthread_mutex_lock(&c->mu);
    unsigned long sum = counts_read(&c->unlisted, field);
    for (const struct named_counts *nc = c->list; nc; nc = nc->next)
        sum += counts_read(&nc->n, field);
    pthread_mutex_unlock(&c->mu);
    return sum;
}

void counts_attach(struct counts *c, struct server_config *cfg)
{
    pthread_mutex_lock(&c->mu);
    /* The consumers' routes count as routes do, by the consumer's name. */
    for (size_t i = 0; i < cfg->route_count + cfg->consumer_count; i++) {
        struct route *rt = i < cfg->route_count ? &cfg->routes[i]
                                                : &cfg->consumers[i - cfg->route_count].route;
        struct named_counts *nc = c->list;
        while (nc && strcmp(nc->name, rt->name) != 0)
            nc = nc->next;
        if (!nc && (nc = calloc(1, sizeof *nc)) != NULL) {
            snprintf(nc->name, sizeof nc->name, "%s", rt->name);
            nc->next = c->list;
            c->list = nc;
        }
        rt->n = nc ? &nc->n : &c->unlisted;
    }
    pthread_mutex_unlock(&c->mu);
}
