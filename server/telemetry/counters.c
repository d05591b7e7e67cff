/*
 * counters.c — the gateway's counters (daemon.h): each route's, kept by
 * name across reloads, their totals, and how long requests took. Read by
 * the JSON API's health (api.c) and the metrics (metrics.c); counted by the
 * gateway.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "mono.h"

const int64_t daemon_latency_bounds_us[LATENCY_BUCKETS - 1] = {
    500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000,
    5000000, 10000000,
};

void daemon_observe(const struct route *rt, int64_t start_us)
{
    if (!rt || !rt->n)
        return;
    int64_t us = mono_us() - start_us;
    int b = 0;
    while (b < LATENCY_BUCKETS - 1 && us > daemon_latency_bounds_us[b])
        b++;
    atomic_fetch_add(&rt->n->latency[b], 1);
    atomic_fetch_add(&rt->n->latency_sum_us, (unsigned long)(us > 0 ? us : 0));
}

void daemon_count_token(const struct route *rt, idem_rc rc, idem_outcome o)
{
    if (rt && rt->n && rc == IDEM_OK && o == IDEM_CONSUMED)
        atomic_fetch_add(&rt->n->tokens_consumed, 1);
}

void daemon_count_lock(const struct route *rt, idem_rc rc, idem_outcome o)
{
    if (!rt || !rt->n || rc != IDEM_OK)
        return;
    if (o == IDEM_ACQUIRED)
        atomic_fetch_add(&rt->n->locks_acquired, 1);
    else if (o == IDEM_BUSY)
        atomic_fetch_add(&rt->n->locks_busy, 1);
}

unsigned long daemon_total(struct daemon *d, size_t field)
{
    pthread_mutex_lock(&d->routes_mu);
    unsigned long sum = daemon_counter(&d->n_unlisted, field);
    for (const struct route_counters *rc = d->route_n; rc; rc = rc->next)
        sum += daemon_counter(&rc->n, field);
    pthread_mutex_unlock(&d->routes_mu);
    return sum;
}

void daemon_attach_counters(struct daemon *d, struct server_config *cfg)
{
    pthread_mutex_lock(&d->routes_mu);
    /* The consumers' routes count as routes do, by the consumer's name. */
    for (size_t i = 0; i < cfg->route_count + cfg->consumer_count; i++) {
        struct route *rt = i < cfg->route_count ? &cfg->routes[i]
                                                : &cfg->consumers[i - cfg->route_count].route;
        struct route_counters *rc = d->route_n;
        while (rc && strcmp(rc->name, rt->name) != 0)
            rc = rc->next;
        if (!rc && (rc = calloc(1, sizeof *rc)) != NULL) {
            snprintf(rc->name, sizeof rc->name, "%s", rt->name);
            rc->next = d->route_n;
            d->route_n = rc;
        }
        rt->n = rc ? &rc->n : &d->n_unlisted;
    }
    pthread_mutex_unlock(&d->routes_mu);
}
