/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_recent.c — each route's recent past (server/telemetry/recent.c):
 * the figures over the last minute are the counters now less the sample a
 * minute old, whatever came before it; the percentiles fall where the
 * requests' durations were; the steps are each 10 s's answers and 5xx,
 * oldest first, an hour of them; rings that went round keep the newest.
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
    recent_read(nc->recent, &nc->n, 61000, 60000, &f, NULL);
    assert_true(f.seconds == 60.0);
    assert_int_equal(f.requests, 600);
    assert_int_equal(f.errors, 6);
    /* Half are in (0.5, 1] ms, linear within it; 1 % in (10, 25] ms. */
    assert_true(f.p50_ms > 0.5 && f.p50_ms <= 1.0);
    assert_true(f.p99_ms > 10.0 && f.p99_ms <= 25.0);
    struct recent_step steps[RECENT_STEPS];
    unsigned n = recent_read(nc->recent, &nc->n, 61000, 60000, NULL, steps);
    assert_int_equal(n, 6);
    for (unsigned i = 0; i < n; i++) {
        assert_int_equal(steps[i].ms, 10000);
        assert_int_equal(steps[i].requests, 100);
        assert_int_equal(steps[i].errors, 1);
    }
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
    recent_read(nc->recent, &nc->n, 5000, 60000, &f, NULL);
    assert_int_equal(f.requests, 3);
    assert_true(f.seconds == 0);
    recent_sample_all(c, 5000);
    /* Nothing since: no percentile to give. */
    recent_read(nc->recent, &nc->n, 9000, 60000, &f, NULL);
    assert_int_equal(f.requests, 0);
    assert_true(f.seconds == 4.0);
    assert_true(f.p50_ms < 0 && f.p99_ms < 0);
    struct recent_step steps[RECENT_STEPS];
    /* Too short a step to say anything. */
    assert_int_equal(recent_read(nc->recent, &nc->n, 5500, 60000, NULL, steps), 0);
    /* Long enough: the step since the sample, as it is now. */
    answer(&nc->n, 2, 201, 800);
    assert_int_equal(recent_read(nc->recent, &nc->n, 8000, 60000, NULL, steps), 1);
    assert_int_equal(steps[0].ms, 3000);
    assert_int_equal(steps[0].requests, 2);
    counts_free(c);
    free(c);
}

static void test_ring_goes_round(void **state)
{
    (void)state;
    struct named_counts *nc;
    struct counts *c = one_route(&nc);
    int64_t t = 0;
    const int samples = 2 * RECENT_STEPS + 7;
    for (int i = 0; i < samples; i++) {
        answer(&nc->n, i % 50, 201, 800); /* i % 50 answers before sample i */
        recent_sample_all(c, t += 10000);
    }
    /* An hour of steps, the newest last: step k ended with sample k. */
    struct recent_step steps[RECENT_STEPS];
    unsigned n = recent_read(nc->recent, &nc->n, t, 60000, NULL, steps);
    assert_int_equal(n, RECENT_STEPS);
    for (unsigned i = 0; i < n; i++)
        assert_int_equal(steps[i].requests, (unsigned)(samples - RECENT_STEPS + (int)i) % 50);
    /* With a live step, the oldest full one makes room for it. */
    answer(&nc->n, 7, 201, 800);
    n = recent_read(nc->recent, &nc->n, t + 5000, 60000, NULL, steps);
    assert_int_equal(n, RECENT_STEPS);
    assert_int_equal(steps[n - 1].requests, 7);
    assert_int_equal(steps[n - 1].ms, 5000);
    assert_int_equal(steps[0].requests, (unsigned)(samples - RECENT_STEPS + 1) % 50);
    /* The last minute: the last six samples' answers, and the live ones. */
    struct recent_figures f;
    recent_read(nc->recent, &nc->n, t + 5000, 60000, &f, NULL);
    unsigned long want = 7;
    for (int i = samples - 6; i < samples; i++)
        want += (unsigned long)(i % 50);
    assert_true(f.seconds == 65.0);
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
