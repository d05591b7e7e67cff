/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_recent.c — each route's recent past (server/telemetry/recent.c):
 * the figures over the last minute are the counters now less the sample a
 * minute old, whatever came before it; the percentiles fall where the
 * requests' durations were; the steps are each 10 s's rate, oldest first;
 * a ring that went round keeps the newest samples.
 */
#include <stdlib.h>
#include <string.h>

#include "telemetry/counters.h"
#include "telemetry/recent.h"
#include "testlib.h"

/* n requests answered status, each taking us microseconds. */
static void answer(struct route_counts *n, int count, int status, int64_t us)
{
    for (int i = 0; i < count; i++) {
        atomic_fetch_add(&n->outcomes[status >= 500 ? GW_STORE_UNAVAILABLE : GW_EXECUTED], 1);
        atomic_fetch_add(&n->codes[status - STATUS_MIN], 1);
        counts_latency(n->latency, &n->latency_sum_us, us);
    }
}

static struct counts *one_route(struct named_counts **nc)
{
    struct counts *c = malloc(sizeof *c);
    counts_init(c);
    *nc = calloc(1, sizeof **nc);
    strcpy((*nc)->name, "refund");
    c->list = *nc;
    return c;
}

static void test_last_minute_only(void **state)
{
    (void)state;
    struct named_counts *nc;
    struct counts *c = one_route(&nc);
    /* Before the minute: slow failures, which must not count. */
    answer(&nc->n, 50, 503, 2000000);
    recent_sample_all(c, 1000);
    for (int64_t t = 11000; t <= 61000; t += 10000) {
        /* Each step: 90 fast answers, 10 slower, one 5xx. */
        answer(&nc->n, 90, 201, 800);
        answer(&nc->n, 9, 201, 20000);
        answer(&nc->n, 1, 502, 20000);
        recent_sample_all(c, t);
    }
    struct recent_figures f;
    recent_figures(nc->recent, &nc->n, 61000, 60000, &f);
    assert_true(f.seconds == 60.0);
    assert_int_equal(f.requests, 600);
    assert_int_equal(f.errors, 6);
    /* Half are in (0.5, 1] ms, linear within it; 1 % in (10, 25] ms. */
    assert_true(f.p50_ms > 0.5 && f.p50_ms <= 1.0);
    assert_true(f.p99_ms > 10.0 && f.p99_ms <= 25.0);
    double steps[RECENT_STEPS];
    unsigned n = recent_rates(nc->recent, &nc->n, 61000, steps);
    assert_int_equal(n, 6);
    for (unsigned i = 0; i < n; i++)
        assert_true(steps[i] == 10.0);
    counts_free(c);
    free(c);
}

static void test_young_and_empty(void **state)
{
    (void)state;
    struct named_counts *nc;
    struct counts *c = one_route(&nc);
    struct recent_figures f;
    /* No sample yet: since the start, over an unknown span. */
    answer(&nc->n, 3, 201, 800);
    recent_figures(nc->recent, &nc->n, 5000, 60000, &f);
    assert_int_equal(f.requests, 3);
    assert_true(f.seconds == 0);
    recent_sample_all(c, 5000);
    /* Nothing since: no percentile to give. */
    recent_figures(nc->recent, &nc->n, 9000, 60000, &f);
    assert_int_equal(f.requests, 0);
    assert_true(f.seconds == 4.0);
    assert_true(f.p50_ms < 0 && f.p99_ms < 0);
    double steps[RECENT_STEPS];
    assert_int_equal(recent_rates(nc->recent, &nc->n, 5500, steps), 0); /* too short */
    counts_free(c);
    free(c);
}

static void test_ring_goes_round(void **state)
{
    (void)state;
    struct named_counts *nc;
    struct counts *c = one_route(&nc);
    int64_t t = 0;
    for (int i = 0; i < 3 * RECENT_STEPS; i++) {
        answer(&nc->n, i, 201, 800); /* i requests in the step before sample i */
        recent_sample_all(c, t += 10000);
    }
    double steps[RECENT_STEPS];
    unsigned n = recent_rates(nc->recent, &nc->n, t, steps);
    assert_int_equal(n, RECENT_STEPS - 1);
    /* The newest step had 3 * RECENT_STEPS - 1 requests in 10 s. */
    assert_true(steps[n - 1] == (3.0 * RECENT_STEPS - 1) / 10.0);
    assert_true(steps[0] == (3.0 * RECENT_STEPS - RECENT_STEPS + 1) / 10.0);
    struct recent_figures f;
    recent_figures(nc->recent, &nc->n, t, 60000, &f);
    assert_true(f.seconds == 60.0);
    unsigned long want = 0;
    for (int i = 3 * RECENT_STEPS - 6; i < 3 * RECENT_STEPS; i++)
        want += (unsigned long)i;
    assert_int_equal(f.requests, want);
    counts_free(c);
    free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_last_minute_only),
        cmocka_unit_test(test_young_and_empty),
        cmocka_unit_test(test_ring_goes_round),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
