/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_replay_cache.c — the gateway's cache of finished answers
 * (server/gateway/replay_cache.c): what it answers, for how long, for which payload,
 * within which budget. Time is passed in, so nothing here sleeps.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/replay_cache.h"
#include "testlib.h"

static const uint8_t fp_a[IDEM_FINGERPRINT_LEN] = {1};
static const uint8_t fp_b[IDEM_FINGERPRINT_LEN] = {2};

/* Put the stored form; then, as the first duplicate does, the wire form. */
static void put(struct replay_cache *c, const char *space, const char *key, const uint8_t *fp,
                const char *stored, size_t len, const char *wire, int64_t now, unsigned long gen)
{
    replay_cache_put(c, space, key, fp, stored, len, 0, now, gen);
    struct replay_kept k;
    if (wire && replay_cache_get(c, space, key, fp, now, gen, &k))
        replay_cache_add_wire(c, &k, wire, strlen(wire));
}

static int has(struct replay_cache *c, const char *space, const char *key, const uint8_t *fp,
               int64_t now, unsigned long gen)
{
    struct replay_kept k;
    return replay_cache_get(c, space, key, fp, now, gen, &k);
}

static void test_answers_what_was_put(void **state)
{
    (void)state;
    struct replay_cache *c = replay_cache_new(1 << 20);
    assert_non_null(c);
    struct replay_kept k;
    assert_false(replay_cache_get(c, "refund", "R-1", fp_a, 1000, 0, &k));
    replay_cache_put(c, "refund", "R-1", fp_a, "IDEM1 201 0 2\nok", 16, 86401000, 1000, 0);
    /* Kept without its wire form until a duplicate adds it. */
    assert_true(replay_cache_get(c, "refund", "R-1", fp_a, 1200, 0, &k));
    assert_int_equal(k.wire_len, 0);
    replay_cache_add_wire(c, &k, "HTTP/1.1 201 Created\r\n", 22);
    assert_int_equal(k.wire_len, 22);
    assert_true(replay_cache_get(c, "refund", "R-1", fp_a, 1500, 0, &k));
    assert_int_equal(k.stored_len, 16);
    assert_memory_equal(k.stored, "IDEM1 201 0 2\nok", 16);
    assert_int_equal(k.expires_ms, 86401000); /* the record's, for its header */
    assert_int_equal(k.wire_len, 22);
    assert_memory_equal(k.wire, "HTTP/1.1 201 Created\r\n", 22);
    /* Another key, another space: not this entry ("refund\0R-1" is not
     * "refun\0dR-1"). */
    assert_false(has(c, "refund", "R-2", fp_a, 1500, 0));
    assert_false(has(c, "payment", "R-1", fp_a, 1500, 0));
    assert_false(has(c, "refun", "dR-1", fp_a, 1500, 0));
    /* A put replaces; an entry may have no wire form. */
    put(c, "refund", "R-1", fp_a, "second", 6, NULL, 1600, 0);
    assert_true(replay_cache_get(c, "refund", "R-1", fp_a, 1600, 0, &k));
    assert_int_equal(k.stored_len, 6);
    assert_memory_equal(k.stored, "second", 6);
    assert_int_equal(k.wire_len, 0);
    replay_cache_free(c);
}

static void test_payload_must_match(void **state)
{
    (void)state;
    struct replay_cache *c = replay_cache_new(1 << 20);
    put(c, "s", "k", fp_a, "x", 1, NULL, 0, 0);
    assert_false(has(c, "s", "k", fp_b, 0, 0)); /* the store says MISMATCH */
    assert_true(has(c, "s", "k", NULL, 0, 0));  /* fingerprint: none */
    put(c, "s", "k2", NULL, "y", 1, NULL, 0, 0); /* stored without one */
    assert_true(has(c, "s", "k2", fp_b, 0, 0));
    replay_cache_free(c);
}

static void test_expires_and_generations(void **state)
{
    (void)state;
    struct replay_cache *c = replay_cache_new(1 << 20);
    put(c, "s", "k", NULL, "x", 1, NULL, 5000, 0);
    assert_true(has(c, "s", "k", NULL, 5000 + REPLAY_CACHE_TTL_MS - 1, 0));
    assert_false(has(c, "s", "k", NULL, 5000 + REPLAY_CACHE_TTL_MS, 0));
    /* Gone for good once expired, even if asked at an earlier time. */
    assert_false(has(c, "s", "k", NULL, 5000, 0));
    /* An answer put at generation 3 is not served at 4 (a transition came
     * between), nor the other way round. */
    put(c, "s", "g", NULL, "x", 1, NULL, 0, 3);
    assert_false(has(c, "s", "g", NULL, 0, 4));
    put(c, "s", "g", NULL, "x", 1, NULL, 0, 4);
    assert_true(has(c, "s", "g", NULL, 0, 4));
    replay_cache_clear(c);
    assert_false(has(c, "s", "g", NULL, 0, 4));
    replay_cache_free(c);
}

/* Expired answers leave on the next put, not when the budget is full: on
 * traffic of fresh keys the cache holds about a TTL's worth of answers. */
static void test_expired_leave_on_put(void **state)
{
    (void)state;
    char answer[1000], key[16];
    memset(answer, 'a', sizeof answer);
    struct replay_cache *c = replay_cache_new(1 << 20);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof key, "old%02d", i); /* all one size */
        put(c, "s", key, NULL, answer, sizeof answer, NULL, i, 0);
    }
    size_t hundred = replay_cache_bytes(c);
    assert_true(hundred >= 100 * sizeof answer);
    /* At 50 + TTL the first 51 have expired; one put drops them all. */
    put(c, "s", "new00", NULL, answer, sizeof answer, NULL, 50 + REPLAY_CACHE_TTL_MS, 0);
    assert_int_equal(replay_cache_bytes(c), hundred / 100 * 50);
    assert_false(has(c, "s", "old50", NULL, 50 + REPLAY_CACHE_TTL_MS, 0));
    assert_true(has(c, "s", "old51", NULL, 50 + REPLAY_CACHE_TTL_MS, 0));
    assert_true(has(c, "s", "new00", NULL, 50 + REPLAY_CACHE_TTL_MS, 0));
    replay_cache_free(c);
}

static void test_budget(void **state)
{
    (void)state;
    /* Room for a few 1000-byte answers: the oldest go first. */
    struct replay_cache *c = replay_cache_new(4 * 1200);
    char answer[1000], key[16];
    memset(answer, 'a', sizeof answer);
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%d", i);
        put(c, "s", key, NULL, answer, sizeof answer, NULL, 0, 0);
    }
    int kept = 0;
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof key, "k%d", i);
        kept += has(c, "s", key, NULL, 0, 0);
    }
    assert_true(kept >= 3 && kept <= 4);
    assert_true(has(c, "s", "k9", NULL, 0, 0)); /* the newest stays */
    assert_false(has(c, "s", "k0", NULL, 0, 0));
    /* An answer over REPLAY_CACHE_ENTRY_MAX is not kept at all. */
    char *big = calloc(1, REPLAY_CACHE_ENTRY_MAX + 1);
    struct replay_cache *roomy = replay_cache_new(1 << 24);
    put(roomy, "s", "big", NULL, big, REPLAY_CACHE_ENTRY_MAX + 1, NULL, 0, 0);
    assert_false(has(roomy, "s", "big", NULL, 0, 0));
    free(big);
    /* A wire form counts against the budget too: adding one evicts the
     * oldest answers — never the one it is added to, even when that one is
     * the oldest — and no more than it must. */
    struct replay_cache *tight = replay_cache_new(2 * 1200); /* three of 500 fit */
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "w%d", i);
        replay_cache_put(tight, "s", key, NULL, answer, 500, 0, 0, 0);
    }
    struct replay_kept k;
    assert_true(replay_cache_get(tight, "s", "w0", NULL, 0, 0, &k));
    replay_cache_add_wire(tight, &k, answer, sizeof answer);
    assert_int_equal(k.wire_len, sizeof answer);
    assert_false(has(tight, "s", "w1", NULL, 0, 0));
    assert_true(has(tight, "s", "w2", NULL, 0, 0));
    assert_true(replay_cache_get(tight, "s", "w0", NULL, 0, 0, &k));
    assert_int_equal(k.wire_len, sizeof answer);
    assert_memory_equal(k.wire, answer, sizeof answer);
    /* A wire form that can never fit evicts nothing and is not kept. */
    char *huge = calloc(1, 4000);
    assert_true(replay_cache_get(tight, "s", "w2", NULL, 0, 0, &k));
    replay_cache_add_wire(tight, &k, huge, 4000);
    assert_int_equal(k.wire_len, 0);
    assert_true(has(tight, "s", "w0", NULL, 0, 0));
    assert_true(has(tight, "s", "w2", NULL, 0, 0));
    free(huge);
    replay_cache_free(tight);
    replay_cache_free(roomy);
    replay_cache_free(c);
}

static void test_off(void **state)
{
    (void)state;
    struct replay_cache *c = replay_cache_new(0); /* limits.replay_cache: 0 */
    assert_null(c);
    put(c, "s", "k", NULL, "x", 1, NULL, 0, 0);
    assert_false(has(c, "s", "k", NULL, 0, 0));
    replay_cache_clear(c);
    replay_cache_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_what_was_put),
        cmocka_unit_test(test_payload_must_match),
        cmocka_unit_test(test_expires_and_generations),
        cmocka_unit_test(test_expired_leave_on_put),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
