/* SPDX-License-Identifier: Apache-2.0 */
/*
 * held_census.c — how many claims are held now (held_census.h).
 *
 * A claim is held when it is PROCESSING, its lease has not run out, and its
 * span (lease_until - updated) is none of the leases of the routes and
 * consumers on its space: a claim in flight is renewed to its route's lease,
 * a held one (on_unknown_outcome: hold, resolve, a held takeover) was
 * extended by its hold or by the wait until its next question. The same rule
 * tells the operators' actions a live claim from a held one
 * (records_admin.c).
 *
 * A round, its steps each one listing on the loop:
 *
 *   start ── no space holds ──────────────────────────► publish (none)
 *     └─► list space i, page by page (IDEM_LIST_LIMIT_MAX) ── error ──► end,
 *           │    the last round's counts stand
 *           └─► count; next page (up to HELD_CENSUS_SCAN_MAX), next space
 *                 └─► publish
 */
#include "telemetry/held_census.h"

#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "gateway/route_config.h"
#include "log.h"
#include "mono.h"

struct scan {
    char space[IDEM_NAME_MAX + 1];
    int64_t *leases; /* of the routes and consumers on the space */
    size_t nleases;
};

struct held_round {
    struct held_census *hc;
    idem *h;
    idem_loop *loop;
    struct scan *spaces;
    size_t n, at;
    struct held_count *counts; /* one per space */
    size_t scanned;            /* of the space at `at` */
    char cursor[IDEM_CURSOR_MAX + 1];
};

void held_census_init(struct held_census *hc)
{
    memset(hc, 0, sizeof *hc);
    pthread_mutex_init(&hc->mu, NULL);
}

static void round_free(struct held_round *r);

void held_census_free(struct held_census *hc)
{
    round_free(hc->round); /* its listing never answered: the store is closed */
    free(hc->counts);
    pthread_mutex_destroy(&hc->mu);
}

static void round_free(struct held_round *r)
{
    for (size_t i = 0; r && i < r->n; i++)
        free(r->spaces[i].leases);
    if (r) {
        free(r->spaces);
        free(r->counts);
    }
    free(r);
}

/* The round ends: its counts (taken) become the census's when whole. */
static void round_end(struct held_round *r, int whole)
{
    struct held_census *hc = r->hc;
    pthread_mutex_lock(&hc->mu);
    if (whole) {
        free(hc->counts);
        hc->counts = r->counts;
        hc->n = r->n;
        hc->at_ms = wall_ms();
        r->counts = NULL;
    }
    hc->running = 0;
    hc->round = NULL;
    pthread_mutex_unlock(&hc->mu);
    round_free(r);
}

/* The spaces of cfg that hold, each with its leases. 0, or -1 on OOM. */
static int plan(struct held_round *r, const struct server_config *cfg)
{
    size_t total = cfg->route_count + cfg->consumer_count;
    if (!(r->spaces = calloc(total ? total : 1, sizeof *r->spaces)) ||
        !(r->counts = calloc(total ? total : 1, sizeof *r->counts)))
        return -1;
    for (size_t i = 0; i < total; i++) {
        const struct route *rt = config_nth_route(cfg, i);
        size_t s = 0;
        while (s < r->n && strcmp(r->spaces[s].space, rt->space) != 0)
            s++;
        if (s == r->n) {
            if (!config_route_holds(rt))
                continue; /* listed once a route on it holds */
            snprintf(r->spaces[s].space, sizeof r->spaces[s].space, "%s", rt->space);
            snprintf(r->counts[s].space, sizeof r->counts[s].space, "%s", rt->space);
            if (!(r->spaces[s].leases = calloc(total, sizeof *r->spaces[s].leases)))
                return -1;
            r->n++;
            /* Every lease on the space, the routes' before this one too. */
            for (size_t j = 0; j < total; j++)
                if (strcmp(config_nth_route(cfg, j)->space, rt->space) == 0)
                    r->spaces[s].leases[r->spaces[s].nleases++] = config_nth_route(cfg, j)->lease_ms;
        }
    }
    return 0;
}

static int is_held(const struct scan *s, const idem_record_item *it, int64_t now)
{
    if (it->lease_until_ms <= now)
        return 0; /* run out: taken over by the next request, not held */
    for (size_t i = 0; i < s->nleases; i++)
        if (it->lease_until_ms - it->updated_ms == s->leases[i])
            return 0; /* in flight, renewed to its lease */
    return 1;
}

static void next_page(struct held_round *r);

static void on_page(void *arg, idem_rc rc, idem_record_page *page, const char *detail)
{
    struct held_round *r = arg;
    if (rc != IDEM_OK) {
        if (rc != IDEM_ECLOSING)
            daemon_logl(LOG_WARN, "counting held claims in space %s: %s: %s",
                        r->spaces[r->at].space, idem_strerror(rc), detail);
        round_end(r, 0);
        return;
    }
    int64_t now = wall_ms();
    struct held_count *c = &r->counts[r->at];
    for (size_t i = 0; i < page->count; i++)
        c->held += (uint64_t)is_held(&r->spaces[r->at], &page->items[i], now);
    r->scanned += page->count;
    if (page->next_cursor[0] && r->scanned < HELD_CENSUS_SCAN_MAX) {
        snprintf(r->cursor, sizeof r->cursor, "%s", page->next_cursor);
    } else {
        c->capped = page->next_cursor[0] != '\0';
        r->at++;
        r->scanned = 0;
        r->cursor[0] = '\0';
    }
    if (r->at == r->n) {
        round_end(r, 1);
        return;
    }
    next_page(r);
}

static void next_page(struct held_round *r)
{
    idem_record_query q = {.space = r->spaces[r->at].space,
                           .state = IDEM_STATE_PROCESSING,
                           .limit = IDEM_LIST_LIMIT_MAX,
                           .cursor = r->cursor[0] ? r->cursor : NULL};
    idem_rc rc = idem_record_list_async(r->h, r->loop, &q, on_page, r);
    if (rc != IDEM_OK) {
        if (rc != IDEM_ECLOSING) /* the daemon stopping: nothing to say */
            daemon_logl(LOG_WARN, "counting held claims in space %s: %s: %s", q.space,
                        idem_strerror(rc), idem_errdetail());
        round_end(r, 0);
    }
}

void held_census_run(struct held_census *hc, idem *h, idem_loop *loop,
                     const struct server_config *cfg)
{
    pthread_mutex_lock(&hc->mu);
    int busy = hc->running;
    hc->running = 1;
    if (!busy)
        hc->pending = 0; /* this round is the one a nudge asked for */
    pthread_mutex_unlock(&hc->mu);
    if (busy)
        return;
    struct held_round *r = calloc(1, sizeof *r);
    if (!r) {
        pthread_mutex_lock(&hc->mu);
        hc->running = 0;
        pthread_mutex_unlock(&hc->mu);
        return;
    }
    r->hc = hc;
    r->h = h;
    r->loop = loop;
    pthread_mutex_lock(&hc->mu);
    hc->round = r;
    pthread_mutex_unlock(&hc->mu);
    if (plan(r, cfg) != 0)
        round_end(r, 0);
    else if (r->n == 0)
        round_end(r, 1); /* no space holds: none held */
    else
        next_page(r);
}

void held_census_nudge(struct held_census *hc, idem *h, idem_loop *loop,
                       const struct server_config *cfg)
{
    struct timeval tv = {0, HELD_CENSUS_NUDGE_MS * 1000};
    pthread_mutex_lock(&hc->mu);
    int recent = hc->running || wall_ms() - hc->at_ms < HELD_CENSUS_NUDGE_MS;
    int later = recent && !hc->pending && hc->later;
    if (later) {
        hc->pending = 1;
        event_add(hc->later, &tv);
    }
    pthread_mutex_unlock(&hc->mu);
    if (!recent)
        held_census_run(hc, h, loop, cfg);
}

struct held_count *held_census_read(struct held_census *hc, size_t *n, int64_t *at_ms)
{
    pthread_mutex_lock(&hc->mu);
    struct held_count *copy = hc->n ? malloc(hc->n * sizeof *copy) : NULL;
    *n = copy ? hc->n : 0;
    *at_ms = hc->at_ms;
    if (copy)
        memcpy(copy, hc->counts, hc->n * sizeof *copy);
    pthread_mutex_unlock(&hc->mu);
    return copy;
}
