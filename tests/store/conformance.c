/* SPDX-License-Identifier: Apache-2.0 */
/*
 * conformance.c — the contract of include/idem.h, written once
 * against the public API and run against every store:
 *
 *   conformance embedded :memory:     records in an in-memory SQLite
 *   conformance embedded file         records in a SQLite file in a temp dir
 *   conformance distributed REDIS_URL POSTGRES_URL
 *                                     Redis and PostgreSQL, both wiped before
 *                                     each test (use servers of the tests' own:
 *                                     scripts/services.sh starts them)
 *
 * and, to work on one distributed backend at a time, with the other half
 * embedded: redis+sqlite REDIS_URL, memory+postgres POSTGRES_URL.
 *
 * Each test opens a fresh handle with the test clock, so lease and TTL
 * expiry are tested by moving the clock, not by sleeping.
 */
#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store.h"
#include "testlib.h"

static const char *kv_kind = "memory", *db_kind = "sqlite";
static const char *store_where = ":memory:"; /* sqlite: ":memory:" or "file" */
static const char *redis_url, *postgres_url;
static char *tmpdir;
static int file_seq;
static char db_path[4200];

static int is_postgres(void) { return strcmp(db_kind, "postgres") == 0; }
static int is_redis(void) { return strcmp(kv_kind, "redis") == 0; }

/* Empty the servers: each test starts from nothing, as on a fresh file. */
static void wipe_servers(void)
{
    test_wipe_servers(is_redis() ? redis_url : NULL, is_postgres() ? postgres_url : NULL);
}

/* Fill o's store fields for the store under test. fresh: a new SQLite file
 * (the servers are wiped by setup, not here). */
static void store_options(idem_options *o, int fresh)
{
    o->redis_url = redis_url;
    o->postgres_url = postgres_url;
    if (strcmp(store_where, "file") == 0) {
        if (fresh)
            snprintf(db_path, sizeof db_path, "%s/t%d.db", tmpdir, ++file_seq);
        o->path = db_path;
    } else {
        o->path = store_where;
    }
}

static idem *open_with(const idem_options *o)
{
    idem *h = NULL;
    assert_idem_ok(idem__open_parts(o, kv_kind, db_kind, &h));
    return h;
}

static idem *open_store(void)
{
    idem_options o;
    idem_options_init(&o);
    store_options(&o, 1);
    o.clock = test_clock;
    o.result_max = 4096;
    return open_with(&o);
}

static int setup(void **state)
{
    test_clock_reset();
    wipe_servers();
    *state = open_store();
    return 0;
}

static int teardown(void **state)
{
    idem_close(*state);
    return 0;
}

static void fp_of(const char *s, uint8_t fp[IDEM_FINGERPRINT_LEN])
{
    assert_idem_ok(idem_fingerprint(s, strlen(s), fp));
}

/* ---- records ---------------------------------------------------------- */

struct storm {
    idem *h;
    const char *space, *key;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    idem_outcome outcome[128];
    idem_rc rc[128];
};

static const char storm_result[] = "{\"refund\":\"R-1\",\"status\":\"ok\"}";

static void begin_and_complete(void *arg, int i)
{
    struct storm *s = arg;
    char owner[32];
    idem_record rec;
    snprintf(owner, sizeof owner, "worker-%d", i);
    s->rc[i] = idem_record_begin(s->h, s->space, s->key, s->fp, owner, 30000,
                                 &s->outcome[i], &rec);
    if (s->rc[i] == IDEM_OK && s->outcome[i] == IDEM_NEW) {
        idem_outcome done;
        s->rc[i] = idem_record_complete(s->h, s->space, s->key, rec.epoch, storm_result,
                                        strlen(storm_result), 0, &done);
        if (done != IDEM_COMPLETED)
            s->rc[i] = IDEM_ESTORE;
    }
    idem_record_clear(&rec);
}

static void test_begin_storm_one_new(void **state)
{
    struct storm *s = calloc(1, sizeof *s);
    s->h = *state;
    s->space = "refund";
    s->key = "R-2026-0001";
    fp_of("POST /refunds {\"refund_no\":\"R-2026-0001\"}", s->fp);
    test_run_threads(100, begin_and_complete, s);

    int new_count = 0, other = 0;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(s->rc[i], IDEM_OK);
        if (s->outcome[i] == IDEM_NEW)
            new_count++;
        else if (s->outcome[i] == IDEM_IN_PROGRESS || s->outcome[i] == IDEM_DONE)
            other++;
    }
    assert_int_equal(new_count, 1);
    assert_int_equal(other, 99);

    /* Every later begin replays the byte-identical result. */
    for (int i = 0; i < 5; i++) {
        idem_outcome o;
        idem_record rec;
        assert_idem_ok(idem_record_begin(s->h, s->space, s->key, s->fp, "late", 30000, &o, &rec));
        assert_outcome(o, IDEM_DONE);
        assert_string_equal(rec.state, IDEM_STATE_SUCCEEDED);
        assert_int_equal(rec.result_len, strlen(storm_result));
        assert_memory_equal(rec.result, storm_result, strlen(storm_result));
        idem_record_clear(&rec);
    }
    free(s);
}

static void test_begin_fields(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fp_of("body", fp);
    assert_idem_ok(idem_record_begin(h, "pay", "k1", fp, "alice", 5000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_string_equal(rec.state, "PROCESSING");
    /* A new record's first epoch is the clock at its creation. */
    uint64_t first_epoch = rec.epoch;
    assert_int_equal(first_epoch, (uint64_t)rec.created_ms);
    assert_string_equal(rec.owner, "alice");
    assert_true(rec.lease_until_ms > test_clock(NULL));
    idem_record_clear(&rec);

    assert_idem_ok(idem_record_begin(h, "pay", "k1", fp, "bob", 5000, &o, &rec));
    assert_outcome(o, IDEM_IN_PROGRESS);
    assert_string_equal(rec.owner, "alice");
    assert_int_equal(rec.epoch, first_epoch);
    idem_record_clear(&rec);

    /* Same key in another space is another record. */
    assert_idem_ok(idem_record_begin(h, "refund", "k1", fp, "bob", 5000, &o, NULL));
    assert_outcome(o, IDEM_NEW);

    assert_idem_ok(idem_record_get(h, "pay", "k1", &o, &rec));
    assert_outcome(o, IDEM_FOUND);
    assert_int_equal(rec.has_fingerprint, 1);
    assert_memory_equal(rec.fingerprint, fp, IDEM_FINGERPRINT_LEN);
    assert_int_equal(rec.expires_ms, 0);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_get(h, "pay", "nope", &o, &rec));
    assert_outcome(o, IDEM_NOT_FOUND);
}

struct takeover {
    idem *h;
    idem_outcome out[3];
    uint64_t epoch[3];
    idem_rc rc[3];
};

static void race_takeover(void *arg, int i)
{
    struct takeover *t = arg;
    char owner[16];
    idem_record rec;
    snprintf(owner, sizeof owner, "new-%d", i);
    t->rc[i] = idem_record_begin(t->h, "pay", "T-1", NULL, owner, 60000, &t->out[i], &rec);
    t->epoch[i] = rec.epoch;
    idem_record_clear(&rec);
}

static void test_lease_takeover(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(h, "pay", "T-1", NULL, "stale", 1000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t stale_epoch = rec.epoch;
    idem_record_clear(&rec);

    /* Within the lease nobody takes over; a live owner extends its lease. */
    assert_idem_ok(idem_record_begin(h, "pay", "T-1", NULL, "early", 1000, &o, NULL));
    assert_outcome(o, IDEM_IN_PROGRESS);
    test_clock_advance(800);
    assert_idem_ok(idem_record_extend(h, "pay", "T-1", stale_epoch, 1000, &o));
    assert_outcome(o, IDEM_RENEWED);
    test_clock_advance(800); /* past the first lease, within the extended one */
    assert_idem_ok(idem_record_begin(h, "pay", "T-1", NULL, "early", 1000, &o, NULL));
    assert_outcome(o, IDEM_IN_PROGRESS);
    assert_int_equal(idem_record_extend(h, "pay", "T-1", 0, 1000, &o), IDEM_EINVAL);
    assert_idem_ok(idem_record_extend(h, "pay", "T-none", 1, 1000, &o));
    assert_outcome(o, IDEM_NOT_FOUND);

    test_clock_advance(1500);
    struct takeover t = {.h = h};
    test_run_threads(3, race_takeover, &t);
    int taken = 0, winner = -1;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(t.rc[i], IDEM_OK);
        if (t.out[i] == IDEM_TAKEN_OVER) {
            taken++;
            winner = i;
        } else {
            assert_outcome(t.out[i], IDEM_IN_PROGRESS);
        }
    }
    assert_int_equal(taken, 1);
    assert_int_equal(t.epoch[winner], stale_epoch + 1);

    /* The stale owner wakes up: its extension and its completion are
     * refused, nothing changes. */
    assert_idem_ok(idem_record_extend(h, "pay", "T-1", stale_epoch, 1000, &o));
    assert_outcome(o, IDEM_CONFLICT);
    idem_stats before, after;
    idem_get_stats(h, &before);
    assert_idem_ok(idem_record_complete(h, "pay", "T-1", stale_epoch, "late", 4, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    idem_get_stats(h, &after);
    assert_int_equal(after.conflicts, before.conflicts + 1);
    assert_true(after.takeovers >= 1);
    assert_idem_ok(idem_record_get(h, "pay", "T-1", &o, &rec));
    assert_string_equal(rec.state, "PROCESSING");
    assert_int_equal(rec.epoch, stale_epoch + 1);
    assert_null(rec.result);
    idem_record_clear(&rec);

    /* The new owner finishes. */
    assert_idem_ok(idem_record_complete(h, "pay", "T-1", stale_epoch + 1, "ok", 2, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_begin(h, "pay", "T-1", NULL, "again", 1000, &o, &rec));
    assert_outcome(o, IDEM_DONE);
    assert_int_equal(rec.result_len, 2);
    assert_memory_equal(rec.result, "ok", 2);
    idem_record_clear(&rec);
}

struct mismatch_storm {
    idem *h;
    uint8_t fp[2][IDEM_FINGERPRINT_LEN];
    idem_outcome out[32];
    idem_rc rc[32];
};

static void race_two_payloads(void *arg, int i)
{
    struct mismatch_storm *m = arg;
    m->rc[i] = idem_record_begin(m->h, "pay", "M-fresh", m->fp[i % 2], "w", 30000,
                                 &m->out[i], NULL);
}

static void test_mismatch_every_path(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    uint8_t a[IDEM_FINGERPRINT_LEN], b[IDEM_FINGERPRINT_LEN];
    fp_of("amount=100", a);
    fp_of("amount=999", b);

    /* Fresh key, two payloads racing: one NEW, the other payload MISMATCH. */
    struct mismatch_storm m = {.h = h};
    memcpy(m.fp[0], a, sizeof a);
    memcpy(m.fp[1], b, sizeof b);
    test_run_threads(32, race_two_payloads, &m);
    int news = 0, winner_parity = -1;
    for (int i = 0; i < 32; i++) {
        assert_int_equal(m.rc[i], IDEM_OK);
        if (m.out[i] == IDEM_NEW) {
            news++;
            winner_parity = i % 2;
        }
    }
    assert_int_equal(news, 1);
    for (int i = 0; i < 32; i++)
        if (m.out[i] != IDEM_NEW)
            assert_outcome(m.out[i], i % 2 == winner_parity ? IDEM_IN_PROGRESS : IDEM_MISMATCH);

    /* IN_PROGRESS path. */
    assert_idem_ok(idem_record_begin(h, "pay", "M-1", a, "first", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_begin(h, "pay", "M-1", b, "second", 30000, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);

    /* DONE path. */
    assert_idem_ok(idem_record_complete(h, "pay", "M-1", epoch, "r", 1, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_begin(h, "pay", "M-1", b, "third", 30000, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);
    /* The same payload still replays; no fingerprint skips the check. */
    assert_idem_ok(idem_record_begin(h, "pay", "M-1", a, "fourth", 30000, &o, NULL));
    assert_outcome(o, IDEM_DONE);
    assert_idem_ok(idem_record_begin(h, "pay", "M-1", NULL, "fifth", 30000, &o, NULL));
    assert_outcome(o, IDEM_DONE);

    /* Expired-lease path: a mismatching payload never takes over. */
    assert_idem_ok(idem_record_begin(h, "pay", "M-2", a, "first", 100, &o, &rec));
    uint64_t m2_epoch = rec.epoch;
    idem_record_clear(&rec);
    test_clock_advance(500);
    assert_idem_ok(idem_record_begin(h, "pay", "M-2", b, "second", 100, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);
    assert_idem_ok(idem_record_get(h, "pay", "M-2", &o, &rec));
    assert_int_equal(rec.epoch, m2_epoch);
    assert_string_equal(rec.owner, "first");
    idem_record_clear(&rec);
}

static void test_fail_modes(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    /* Retryable: the next begin executes again, with a new epoch. */
    assert_idem_ok(idem_record_begin(h, "pay", "F-1", NULL, "a", 30000, &o, &rec));
    uint64_t e1 = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_fail(h, "pay", "F-1", e1, IDEM_FAIL_RETRYABLE, "502", 3, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_begin(h, "pay", "F-1", NULL, "b", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_int_equal(rec.epoch, e1 + 1);
    assert_null(rec.result);
    idem_record_clear(&rec);
    /* The released claim's epoch is dead. */
    assert_idem_ok(idem_record_complete(h, "pay", "F-1", e1, "x", 1, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);

    /* Final: the failure is replayed. */
    assert_idem_ok(idem_record_fail(h, "pay", "F-1", e1 + 1, IDEM_FAIL_FINAL,
                                    "insufficient funds", 18, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_begin(h, "pay", "F-1", NULL, "c", 30000, &o, &rec));
    assert_outcome(o, IDEM_DONE);
    assert_string_equal(rec.state, "FAILED");
    assert_int_equal(rec.result_len, 18);
    assert_memory_equal(rec.result, "insufficient funds", 18);
    assert_true(rec.expires_ms > test_clock(NULL));
    idem_record_clear(&rec);

    /* Finishing what does not exist. */
    assert_idem_ok(idem_record_complete(h, "pay", "F-none", 1, NULL, 0, 0, &o));
    assert_outcome(o, IDEM_NOT_FOUND);
}

/* RELEASED keeps no answer: a begin with another payload (a corrected retry
 * under the same key) claims it, and the record takes the new payload's
 * fingerprint; from then on the old payload is the mismatch. */
static void race_released(void *arg, int i)
{
    struct mismatch_storm *m = arg;
    m->rc[i] = idem_record_begin(m->h, "pay", "R-race", m->fp[i % 2], "w", 30000,
                                 &m->out[i], NULL);
}

static void test_released_takes_another_payload(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    uint8_t a[IDEM_FINGERPRINT_LEN], b[IDEM_FINGERPRINT_LEN];
    fp_of("amount=-1", a);
    fp_of("amount=100", b);

    assert_idem_ok(idem_record_begin(h, "pay", "R-1", a, "first", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t e1 = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_fail(h, "pay", "R-1", e1, IDEM_FAIL_RETRYABLE, "422", 3, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);

    /* The corrected payload executes, at the next epoch, as its own. */
    assert_idem_ok(idem_record_begin(h, "pay", "R-1", b, "second", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_int_equal(rec.epoch, e1 + 1);
    assert_true(rec.has_fingerprint);
    assert_memory_equal(rec.fingerprint, b, sizeof b);
    assert_null(rec.result);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_get(h, "pay", "R-1", &o, &rec));
    assert_string_equal(rec.state, "PROCESSING");
    assert_string_equal(rec.owner, "second");
    assert_memory_equal(rec.fingerprint, b, sizeof b);
    idem_record_clear(&rec);
    /* The refused payload is now the other one, in flight and once done. */
    assert_idem_ok(idem_record_begin(h, "pay", "R-1", a, "third", 30000, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);
    assert_idem_ok(idem_record_complete(h, "pay", "R-1", e1 + 1, "201", 3, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_begin(h, "pay", "R-1", a, "fourth", 30000, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);
    assert_idem_ok(idem_record_begin(h, "pay", "R-1", b, "fifth", 30000, &o, &rec));
    assert_outcome(o, IDEM_DONE);
    assert_memory_equal(rec.result, "201", 3);
    idem_record_clear(&rec);

    /* A begin without a fingerprint claims RELEASED and keeps the stored
     * one: the payload check stays with what the record knows. */
    assert_idem_ok(idem_record_begin(h, "pay", "R-2", a, "first", 30000, &o, &rec));
    uint64_t e2 = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_fail(h, "pay", "R-2", e2, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o));
    assert_idem_ok(idem_record_begin(h, "pay", "R-2", NULL, "second", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_get(h, "pay", "R-2", &o, &rec));
    assert_true(rec.has_fingerprint);
    assert_memory_equal(rec.fingerprint, a, sizeof a);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_begin(h, "pay", "R-2", b, "third", 30000, &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);

    /* Released by an operator (a user transition to RELEASED): the same. */
    assert_idem_ok(idem_record_complete(h, "pay", "R-2", e2 + 1, "ok", 2, 0, &o));
    assert_idem_ok(idem_record_transition(h, "pay", "R-2", "SUCCEEDED", "RELEASED", &o, NULL));
    assert_outcome(o, IDEM_APPLIED);
    assert_idem_ok(idem_record_begin(h, "pay", "R-2", b, "fourth", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_memory_equal(rec.fingerprint, b, sizeof b);
    idem_record_clear(&rec);

    /* Two payloads racing for one released record: one claim; the rest
     * see it in flight (its payload) or mismatching (the other). */
    assert_idem_ok(idem_record_begin(h, "pay", "R-race", a, "first", 30000, &o, &rec));
    uint64_t e3 = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_fail(h, "pay", "R-race", e3, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o));
    struct mismatch_storm m = {.h = h};
    memcpy(m.fp[0], a, sizeof a);
    memcpy(m.fp[1], b, sizeof b);
    test_run_threads(32, race_released, &m);
    int news = 0, winner_parity = -1;
    for (int i = 0; i < 32; i++) {
        assert_int_equal(m.rc[i], IDEM_OK);
        if (m.out[i] == IDEM_NEW) {
            news++;
            winner_parity = i % 2;
        }
    }
    assert_int_equal(news, 1);
    for (int i = 0; i < 32; i++)
        if (m.out[i] != IDEM_NEW)
            assert_outcome(m.out[i], i % 2 == winner_parity ? IDEM_IN_PROGRESS : IDEM_MISMATCH);
    assert_idem_ok(idem_record_get(h, "pay", "R-race", &o, &rec));
    assert_int_equal(rec.epoch, e3 + 1);
    assert_memory_equal(rec.fingerprint, winner_parity ? b : a, sizeof a);
    idem_record_clear(&rec);
}

struct transition_storm {
    idem *h;
    idem_outcome out[32];
    idem_rc rc[32];
};

static void race_transition(void *arg, int i)
{
    struct transition_storm *t = arg;
    t->rc[i] = idem_record_transition(t->h, "order", "O-1", "SUCCEEDED", "REFUNDED",
                                      &t->out[i], NULL);
}

static void test_transition(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    char current[IDEM_NAME_MAX + 1];
    assert_idem_ok(idem_record_begin(h, "order", "O-1", NULL, "a", 30000, &o, &rec));
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);

    /* While PROCESSING, a user transition from SUCCEEDED conflicts. */
    assert_idem_ok(idem_record_transition(h, "order", "O-1", "SUCCEEDED", "REFUNDED", &o, current));
    assert_outcome(o, IDEM_CONFLICT);
    assert_string_equal(current, "PROCESSING");
    assert_idem_ok(idem_record_complete(h, "order", "O-1", epoch, "paid", 4, 0, &o));

    struct transition_storm t = {.h = h};
    test_run_threads(32, race_transition, &t);
    int applied = 0, already = 0;
    for (int i = 0; i < 32; i++) {
        assert_int_equal(t.rc[i], IDEM_OK);
        applied += t.out[i] == IDEM_APPLIED;
        already += t.out[i] == IDEM_ALREADY;
    }
    assert_int_equal(applied, 1);
    assert_int_equal(already, 31);

    /* From another state than the record's: CONFLICT naming the current. */
    assert_idem_ok(idem_record_transition(h, "order", "O-1", "SUCCEEDED", "CANCELLED", &o, current));
    assert_outcome(o, IDEM_CONFLICT);
    assert_string_equal(current, "REFUNDED");
    /* The stored result survives user transitions; a begin replays it. */
    assert_idem_ok(idem_record_begin(h, "order", "O-1", NULL, "b", 30000, &o, &rec));
    assert_outcome(o, IDEM_DONE);
    assert_string_equal(rec.state, "REFUNDED");
    assert_memory_equal(rec.result, "paid", 4);
    idem_record_clear(&rec);

    assert_idem_ok(idem_record_transition(h, "order", "O-none", "A", "B", &o, current));
    assert_outcome(o, IDEM_NOT_FOUND);
    assert_int_equal(idem_record_transition(h, "order", "O-1", "REFUNDED", "PROCESSING", &o, NULL),
                     IDEM_EINVAL);
    /* An operator may release a finished record so that it runs again. */
    assert_idem_ok(idem_record_transition(h, "order", "O-1", "REFUNDED", "RELEASED", &o, NULL));
    assert_outcome(o, IDEM_APPLIED);
    assert_idem_ok(idem_record_begin(h, "order", "O-1", NULL, "c", 30000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_int_equal(rec.epoch, epoch + 1);
    idem_record_clear(&rec);
}

/* ---- steps: the business's own machine ------------------------------- */

static idem_machine *refund_machine(void)
{
    idem_machine *m = NULL;
    assert_idem_ok(idem_machine_new("CREATED", &m));
    const char *moves[][2] = {
        {"CREATED", "PROCESSING"}, {"CREATED", "SUCCESS"},      {"CREATED", "FAILED"},
        {"PROCESSING", "SUCCESS"}, {"PROCESSING", "FAILED"},    {"SUCCESS", "REFUNDED_BACK"},
    };
    for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++)
        assert_idem_ok(idem_machine_allow(m, moves[i][0], moves[i][1]));
    assert_idem_ok(idem_machine_seal(m));
    return m;
}

/* Step to `to` and, when it is ours to execute, keep `answer` with it. */
static idem_outcome step_once(idem *h, const idem_machine *m, const char *key, const char *to,
                              const char *answer, idem_record *rec)
{
    idem_outcome o, done;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fp_of(to, fp);
    assert_idem_ok(idem_record_step(h, m, "refund", key, to, fp, "w", 30000, &o, rec));
    if (o == IDEM_NEW || o == IDEM_TAKEN_OVER) {
        assert_idem_ok(idem_record_step_complete(h, "refund", key, rec->epoch, to, fp, answer,
                                                 strlen(answer), 0, &done));
        assert_outcome(done, IDEM_COMPLETED);
    }
    return o;
}

struct step_storm {
    idem *h;
    const idem_machine *m;
    idem_outcome out[100];
    idem_rc rc[100];
    int executed[100];
};

/* Half the events say SUCCESS, half FAILED; each that claims holds its
 * claim a moment, so that the others meet it in flight. */
static void race_step(void *arg, int i)
{
    struct step_storm *t = arg;
    const char *to = i % 2 ? "FAILED" : "SUCCESS";
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    idem_record rec;
    fp_of(to, fp);
    t->rc[i] = idem_record_step(t->h, t->m, "refund", "RF-storm", to, fp, "w", 30000, &t->out[i],
                                &rec);
    if (t->rc[i] == IDEM_OK && t->out[i] == IDEM_NEW) {
        idem_outcome done;
        t->executed[i] = 1;
        usleep(50 * 1000);
        t->rc[i] = idem_record_step_complete(t->h, "refund", "RF-storm", rec.epoch, to, fp, to,
                                             strlen(to), 0, &done);
        if (done != IDEM_COMPLETED)
            t->rc[i] = IDEM_ESTORE;
    }
    idem_record_clear(&rec);
}

static void test_steps(void **state)
{
    idem *h = *state;
    idem_machine *m = refund_machine();
    idem_record rec;
    idem_step_view v;

    /* In order, out of order, a duplicate, a contradiction. */
    assert_outcome(step_once(h, m, "RF-1", "SUCCESS", "paid", &rec), IDEM_NEW);
    assert_string_equal(rec.state, IDEM_STATE_PROCESSING);
    assert_int_equal(idem_record_steps(&rec, &v), IDEM_EINVAL); /* nothing kept yet */
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "SUCCESS", "again", &rec), IDEM_DONE);
    assert_string_equal(rec.state, IDEM_STEP_PREFIX "SUCCESS");
    assert_idem_ok(idem_record_steps(&rec, &v));
    assert_string_equal(v.state, "SUCCESS");
    assert_int_equal(v.count, 1);
    assert_int_equal(v.result_len, 4);
    assert_memory_equal(v.result, "paid", 4);
    uint64_t first_epoch = rec.epoch;
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "PROCESSING", "x", &rec), IDEM_STALE);
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "CREATED", "x", &rec), IDEM_STALE);
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "FAILED", "x", &rec), IDEM_CONFLICT);
    assert_string_equal(rec.state, IDEM_STEP_PREFIX "SUCCESS");
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "REFUNDED_BACK", "back", &rec), IDEM_NEW);
    assert_int_equal(rec.epoch, first_epoch + 1);
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "SUCCESS", "x", &rec), IDEM_STALE);
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-1", "REFUNDED_BACK", "x", &rec), IDEM_DONE);
    assert_idem_ok(idem_record_steps(&rec, &v));
    assert_int_equal(v.count, 2);
    assert_string_equal(v.steps[0].state, "SUCCESS");
    assert_string_equal(v.steps[1].state, "REFUNDED_BACK");
    assert_int_equal(v.steps[1].epoch, first_epoch + 1);
    assert_memory_equal(v.result, "back", 4);
    idem_record_clear(&rec);

    /* A duplicate with another payload is told so. */
    uint8_t other[IDEM_FINGERPRINT_LEN];
    idem_outcome o;
    fp_of("another body", other);
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-1", "REFUNDED_BACK", other, "w", 30000,
                                    &o, NULL));
    assert_outcome(o, IDEM_MISMATCH);

    /* A key's first event may name the initial state; behind it, nothing. */
    assert_outcome(step_once(h, m, "RF-2", "CREATED", "made", &rec), IDEM_NEW);
    idem_record_clear(&rec);
    assert_outcome(step_once(h, m, "RF-2", "CREATED", "x", &rec), IDEM_DONE);
    idem_record_clear(&rec);

    /* A claim given up leaves the key where it was, answer and all. */
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-2", "PROCESSING", NULL, "w", 30000, &o,
                                    &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t e = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-2", "SUCCESS", NULL, "w", 30000, &o,
                                    NULL));
    assert_outcome(o, IDEM_IN_PROGRESS);
    assert_idem_ok(idem_record_step_release(h, "refund", "RF-2", e, 0, &o));
    assert_outcome(o, IDEM_RELEASED);
    assert_idem_ok(idem_record_step_release(h, "refund", "RF-2", e, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    assert_outcome(step_once(h, m, "RF-2", "CREATED", "x", &rec), IDEM_DONE);
    assert_idem_ok(idem_record_steps(&rec, &v));
    assert_memory_equal(v.result, "made", 4);
    idem_record_clear(&rec);
    /* ... and a key that had kept nothing is new again. */
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-3", "SUCCESS", NULL, "w", 30000, &o,
                                    &rec));
    e = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_step_release(h, "refund", "RF-3", e, 0, &o));
    assert_outcome(o, IDEM_RELEASED);
    assert_outcome(step_once(h, m, "RF-3", "FAILED", "no", &rec), IDEM_NEW);
    assert_int_equal(rec.epoch, e + 1);
    idem_record_clear(&rec);

    /* A step claim whose owner died is taken over once its lease runs
     * out, and the claim still holds the state it moves from: the new
     * owner makes the same move, the dead one can no longer finish it. */
    uint8_t back[IDEM_FINGERPRINT_LEN];
    fp_of("REFUNDED_BACK", back);
    assert_outcome(step_once(h, m, "RF-5", "SUCCESS", "paid", &rec), IDEM_NEW);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-5", "REFUNDED_BACK", back, "dead", 1000,
                                    &o, &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t dead = rec.epoch;
    idem_record_clear(&rec);
    test_clock_advance(500);
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-5", "REFUNDED_BACK", back, "next", 1000,
                                    &o, NULL));
    assert_outcome(o, IDEM_IN_PROGRESS);
    test_clock_advance(1000);
    assert_idem_ok(idem_record_step(h, m, "refund", "RF-5", "REFUNDED_BACK", back, "next", 30000,
                                    &o, &rec));
    assert_outcome(o, IDEM_TAKEN_OVER);
    assert_int_equal(rec.epoch, dead + 1);
    assert_idem_ok(idem_record_steps(&rec, &v));
    assert_string_equal(v.state, "SUCCESS");
    assert_int_equal(v.count, 1);
    assert_memory_equal(v.result, "paid", 4);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_step_complete(h, "refund", "RF-5", dead, "REFUNDED_BACK", back,
                                             "late", 4, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    assert_idem_ok(idem_record_step_complete(h, "refund", "RF-5", dead + 1, "REFUNDED_BACK",
                                             back, "back", 4, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_outcome(step_once(h, m, "RF-5", "REFUNDED_BACK", "x", &rec), IDEM_DONE);
    assert_idem_ok(idem_record_steps(&rec, &v));
    assert_int_equal(v.count, 2);
    assert_string_equal(v.steps[1].state, "REFUNDED_BACK");
    assert_int_equal(v.steps[1].epoch, dead + 1);
    assert_memory_equal(v.result, "back", 4);
    idem_record_clear(&rec);

    /* A key with no record: an event behind the initial state cannot be,
     * and one for an unknown state is refused before the store. */
    assert_int_equal(idem_record_step(h, m, "refund", "RF-4", "NOPE", NULL, "w", 30000, &o,
                                      NULL),
                     IDEM_EINVAL);

    /* 50 SUCCESS and 50 FAILED at once: one executes, and every other
     * is a duplicate of it, in flight, or the alert branch. */
    struct step_storm *t = calloc(1, sizeof *t);
    t->h = h;
    t->m = m;
    test_run_threads(100, race_step, t);
    int executed = 0, winner = -1;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(t->rc[i], IDEM_OK);
        if (t->executed[i])
            executed++, winner = i;
    }
    assert_int_equal(executed, 1);
    for (int i = 0; i < 100; i++) {
        if (i == winner)
            continue;
        if (i % 2 == winner % 2)
            assert_true(t->out[i] == IDEM_DONE || t->out[i] == IDEM_IN_PROGRESS);
        else
            assert_true(t->out[i] == IDEM_CONFLICT || t->out[i] == IDEM_IN_PROGRESS);
    }
    free(t);
    idem_machine_free(m);
}

static void test_machine_checks(void **state)
{
    (void)state;
    idem_machine *m = NULL;
    assert_idem_ok(idem_machine_new("A", &m));
    assert_idem_ok(idem_machine_allow(m, "A", "B"));
    assert_idem_ok(idem_machine_allow(m, "B", "C"));
    assert_idem_ok(idem_machine_allow(m, "C", "A"));
    assert_int_equal(idem_machine_seal(m), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "a cycle, A -> B -> C -> A"));
    idem_machine_free(m);

    assert_idem_ok(idem_machine_new("A", &m));
    assert_idem_ok(idem_machine_allow(m, "A", "B"));
    assert_idem_ok(idem_machine_allow(m, "X", "B"));
    assert_int_equal(idem_machine_seal(m), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "X cannot be reached from the initial state A"));
    idem_machine_free(m);

    assert_idem_ok(idem_machine_new("A", &m));
    assert_int_equal(idem_machine_seal(m), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "A has no move out of it"));
    assert_int_equal(idem_machine_allow(m, "A", "state:B"), IDEM_EINVAL);
    assert_int_equal(idem_machine_allow(m, "A", ""), IDEM_EINVAL);
    idem_machine_free(m);

    idem_machine *a = refund_machine(), *b = refund_machine();
    assert_true(idem_machine_equal(a, b));
    assert_int_equal(idem_machine_relation(a, "CREATED", "REFUNDED_BACK"), IDEM_STEP_AHEAD);
    assert_int_equal(idem_machine_relation(a, "SUCCESS", "PROCESSING"), IDEM_STEP_BEHIND);
    assert_int_equal(idem_machine_relation(a, "SUCCESS", "FAILED"), IDEM_STEP_APART);
    assert_int_equal(idem_machine_relation(a, "SUCCESS", "SUCCESS"), IDEM_STEP_SAME);
    assert_int_equal(idem_machine_relation(a, "SUCCESS", "NOPE"), IDEM_STEP_UNKNOWN);
    assert_int_equal(idem_machine_allow(a, "FAILED", "CREATED"), IDEM_EINVAL); /* sealed */
    idem_machine_free(b);
    assert_idem_ok(idem_machine_new("CREATED", &b));
    assert_idem_ok(idem_machine_allow(b, "CREATED", "SUCCESS"));
    assert_idem_ok(idem_machine_seal(b));
    assert_false(idem_machine_equal(a, b));
    idem_machine_free(a);
    idem_machine_free(b);
}

static void test_purge(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    unsigned purged;
    assert_idem_ok(idem_record_begin(h, "pay", "P-done", NULL, "a", 1000, &o, &rec));
    assert_idem_ok(idem_record_complete(h, "pay", "P-done", rec.epoch, "x", 1, 10000, &o));
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_begin(h, "pay", "P-open", NULL, "a", 1000, &o, NULL));

    assert_idem_ok(idem_record_purge(h, 100, &purged));
    assert_int_equal(purged, 0);
    test_clock_advance(20000);
    assert_idem_ok(idem_record_purge(h, 100, &purged));
    assert_int_equal(purged, 1);
    assert_idem_ok(idem_record_get(h, "pay", "P-done", &o, NULL));
    assert_outcome(o, IDEM_NOT_FOUND);
    /* Created again after the purge: its epoch is none the old record ever
     * handed out, so a claimant of the old one stalled all this time cannot
     * finish the new one. */
    assert_idem_ok(idem_record_begin(h, "pay", "P-stale", NULL, "stale", 1000, &o, &rec));
    uint64_t old_epoch = rec.epoch;
    idem_record_clear(&rec);
    test_clock_advance(1500); /* the stale claimant stalls; its lease runs out */
    assert_idem_ok(idem_record_begin(h, "pay", "P-stale", NULL, "next", 1000, &o, &rec));
    assert_outcome(o, IDEM_TAKEN_OVER);
    assert_idem_ok(idem_record_complete(h, "pay", "P-stale", rec.epoch, "x", 1, 1000, &o));
    idem_record_clear(&rec);
    test_clock_advance(2000);
    assert_idem_ok(idem_record_purge(h, 100, &purged));
    assert_int_equal(purged, 1);
    assert_idem_ok(idem_record_begin(h, "pay", "P-stale", NULL, "fresh", 1000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_true(rec.epoch > old_epoch + 1);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_complete(h, "pay", "P-stale", old_epoch, "stale", 5, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    assert_idem_ok(idem_record_complete(h, "pay", "P-stale", old_epoch + 1, "stale", 5, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    /* Past its retention and not purged yet, a finished record is as
     * good as gone: a begin with any payload claims it anew. */
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    fp_of("first", fp);
    assert_idem_ok(idem_record_begin(h, "pay", "P-late", fp, "a", 1000, &o, &rec));
    assert_idem_ok(idem_record_complete(h, "pay", "P-late", rec.epoch, "x", 1, 1000, &o));
    uint64_t late_epoch = rec.epoch;
    idem_record_clear(&rec);
    fp_of("second", fp);
    assert_idem_ok(idem_record_begin(h, "pay", "P-late", fp, "b", 1000, &o, &rec));
    assert_outcome(o, IDEM_MISMATCH);
    idem_record_clear(&rec);
    test_clock_advance(1001);
    assert_idem_ok(idem_record_begin(h, "pay", "P-late", fp, "b", 1000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_int_equal(rec.epoch, late_epoch + 1);
    idem_record_clear(&rec);
    /* PROCESSING is never purged, however old. */
    test_clock_advance(1000LL * 3600 * 24 * 400);
    assert_idem_ok(idem_record_purge(h, 100, &purged));
    assert_int_equal(purged, 0);
    assert_idem_ok(idem_record_get(h, "pay", "P-open", &o, NULL));
    assert_outcome(o, IDEM_FOUND);
}

static void test_record_bad_input(void **state)
{
    idem *h = *state;
    idem_outcome o;
    char long_key[300];
    memset(long_key, 'k', 256);
    long_key[256] = '\0';
    assert_int_equal(idem_record_begin(h, "pay", "", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "key"));
    assert_int_equal(idem_record_begin(h, "pay", long_key, NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "255"));
    long_key[255] = '\0';
    assert_idem_ok(idem_record_begin(h, "pay", long_key, NULL, "o", 1000, &o, NULL));
    assert_outcome(o, IDEM_NEW);
    assert_int_equal(idem_record_begin(h, "pay", "a\nb", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "control character"));
    assert_int_equal(idem_record_begin(h, "pay", "a\x7f", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, "pay", NULL, NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, NULL, "k", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, "pa y", "k", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, "pay", "k", NULL, NULL, 1000, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, "pay", "k", NULL, "o", 0, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(h, "pay", "k", NULL, "o", 1000, NULL, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_begin(NULL, "pay", "k", NULL, "o", 1000, &o, NULL), IDEM_EINVAL);
    /* None of those stored anything. */
    assert_idem_ok(idem_record_get(h, "pay", "k", &o, NULL));
    assert_outcome(o, IDEM_NOT_FOUND);
    assert_int_equal(idem_record_get(h, "pay", "", &o, NULL), IDEM_EINVAL);

    /* A result over the limit is refused and the claim stays open. */
    idem_record rec;
    assert_idem_ok(idem_record_begin(h, "pay", "big", NULL, "o", 1000, &o, &rec));
    char *big = calloc(1, 4097);
    assert_int_equal(idem_record_complete(h, "pay", "big", rec.epoch, big, 4097, 0, &o), IDEM_ETOOBIG);
    assert_non_null(strstr(idem_errdetail(), "4096"));
    assert_idem_ok(idem_record_complete(h, "pay", "big", rec.epoch, big, 4096, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    idem_record_clear(&rec);
    free(big);
    assert_int_equal(idem_record_complete(h, "pay", "big", 0, NULL, 0, 0, &o), IDEM_EINVAL);
    assert_int_equal(idem_record_complete(h, "pay", "big", 1, NULL, 5, 0, &o), IDEM_EINVAL);
    assert_int_equal(idem_record_fail(h, "pay", "big", 1, (idem_fail_mode)7, NULL, 0, 0, &o),
                     IDEM_EINVAL);
}

/* ---- listing and deleting ---- */

/* The keys of one page, in its order, joined by spaces. */
static void page_keys(const idem_record_page *pg, char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < pg->count; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "", pg->items[i].key);
}

static void list_keys(idem *h, const idem_record_query *q, char *out, size_t cap)
{
    idem_record_page pg;
    assert_idem_ok(idem_record_list(h, q, &pg));
    page_keys(&pg, out, cap);
    idem_record_page_clear(&pg);
}

static uint64_t begin_at(idem *h, const char *space, const char *key)
{
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(h, space, key, NULL, "lister", 1000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    test_clock_advance(10); /* each record its own created_ms */
    return epoch;
}

static void test_record_list(void **state)
{
    idem *h = *state;
    idem_outcome o;
    char keys[2048];
    /* Keys holding LIKE's wildcards, and keys those would match. */
    const char *names[] = {"a%1", "a_1", "ab1", "a%%", "axx", "b1", "\xc3\xa9x", "\xc3\xaay"};
    uint64_t epochs[8];
    for (int i = 0; i < 8; i++)
        epochs[i] = begin_at(h, "pay", names[i]);
    begin_at(h, "other", "a%1");
    assert_idem_ok(idem_record_complete(h, "pay", "a%1", epochs[0], "IDEM1 201 0 0\n", 14, 0, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_record_fail(h, "pay", "b1", epochs[5], IDEM_FAIL_FINAL, "no", 2, 0, &o));

    idem_record_query q = {.space = "pay"};
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "\xc3\xaay \xc3\xa9x b1 axx a%% ab1 a_1 a%1");
    q.key_prefix = "a%";
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "a%% a%1");
    q.key_prefix = "a_";
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "a_1");
    q.key_prefix = "a";
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "axx a%% ab1 a_1 a%1");
    q.key_prefix = "\xc3\xa9"; /* the bound above it is the next code point */
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "\xc3\xa9x");
    q.key_prefix = "zz";
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "");
    q.key_prefix = NULL;

    /* By state; what each item says. */
    q.state = IDEM_STATE_SUCCEEDED;
    idem_record_page pg;
    assert_idem_ok(idem_record_list(h, &q, &pg));
    assert_int_equal(pg.count, 1);
    assert_string_equal(pg.items[0].key, "a%1");
    assert_string_equal(pg.items[0].state, IDEM_STATE_SUCCEEDED);
    assert_int_equal(pg.items[0].epoch, epochs[0]);
    assert_string_equal(pg.items[0].owner, "lister");
    assert_int_equal(pg.items[0].result_len, 14);
    assert_int_equal(pg.items[0].result_head_len, 14);
    assert_memory_equal(pg.items[0].result_head, "IDEM1 201 0 0\n", 14);
    assert_true(pg.items[0].expires_ms > pg.items[0].updated_ms);
    assert_string_equal(pg.next_cursor, "");
    idem_record_page_clear(&pg);
    q.state = IDEM_STATE_PROCESSING;
    assert_idem_ok(idem_record_list(h, &q, &pg));
    assert_int_equal(pg.count, 6);
    for (size_t i = 0; i < pg.count; i++) {
        assert_string_equal(pg.items[i].state, IDEM_STATE_PROCESSING);
        assert_int_equal(pg.items[i].expires_ms, 0);
        assert_int_equal(pg.items[i].result_len, 0);
        assert_true(pg.items[i].lease_until_ms > pg.items[i].updated_ms);
    }
    idem_record_page_clear(&pg);
    q.state = "NO_SUCH";
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "");

    /* A claim extended past its lease, as a held one is, told apart. */
    q.state = IDEM_STATE_PROCESSING;
    q.min_lease_span_ms = 1000;
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "");
    assert_idem_ok(idem_record_extend(h, "pay", "ab1", epochs[2], 3600000, &o));
    assert_outcome(o, IDEM_RENEWED);
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "ab1");
    q.state = NULL;
    q.min_lease_span_ms = 0;

    /* By age: created_ms between bounds, both exclusive. */
    assert_idem_ok(idem_record_list(h, &q, &pg));
    int64_t t_ab1 = pg.items[5].created_ms, t_b1 = pg.items[2].created_ms;
    assert_string_equal(pg.items[5].key, "ab1");
    idem_record_page_clear(&pg);
    q.created_after_ms = t_ab1;
    q.created_before_ms = t_b1;
    list_keys(h, &q, keys, sizeof keys);
    assert_string_equal(keys, "axx a%%");
    q.created_after_ms = q.created_before_ms = 0;

    /* Pages of three, stable while records are created between pages:
     * every record once, the new ones (sorting first) on no page. */
    q.limit = 3;
    char all[4096] = "";
    int pages = 0;
    char cursor[IDEM_CURSOR_MAX + 1] = "";
    do {
        q.cursor = cursor;
        assert_idem_ok(idem_record_list(h, &q, &pg));
        assert_true(pg.count <= 3);
        page_keys(&pg, keys, sizeof keys);
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", *all ? " " : "", keys);
        snprintf(cursor, sizeof cursor, "%s", pg.next_cursor);
        idem_record_page_clear(&pg);
        char fresh[16];
        snprintf(fresh, sizeof fresh, "new%d", pages);
        begin_at(h, "pay", fresh);
        pages++;
    } while (*cursor && pages < 10);
    assert_int_equal(pages, 3);
    assert_string_equal(all, "\xc3\xaay \xc3\xa9x b1 axx a%% ab1 a_1 a%1");
    q.cursor = NULL;
    q.limit = 0;
    assert_idem_ok(idem_record_list(h, &q, &pg));
    assert_int_equal(pg.count, 11);
    idem_record_page_clear(&pg);

    /* Refused, naming what is wrong. */
    q.limit = IDEM_LIST_LIMIT_MAX + 1;
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "limit"));
    q.limit = IDEM_LIST_LIMIT_MAX;
    assert_idem_ok(idem_record_list(h, &q, &pg));
    idem_record_page_clear(&pg);
    q.cursor = "c1.12.zz";
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "cursor"));
    q.cursor = "OFFSET 5";
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    q.cursor = NULL;
    q.space = NULL;
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "space"));
    q.space = "pay";
    q.key_prefix = "a\n";
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "key_prefix"));
    q.key_prefix = NULL;
    q.state = "bad state";
    assert_int_equal(idem_record_list(h, &q, &pg), IDEM_EINVAL);
    assert_int_equal(idem_record_list(h, NULL, &pg), IDEM_EINVAL);
}

static void test_record_delete(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    char current[IDEM_NAME_MAX + 1];
    uint64_t cur_epoch;
    assert_idem_ok(idem_record_begin(h, "pay", "D-1", NULL, "a", 1000, &o, &rec));
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    /* A claim in flight is never deleted. */
    assert_idem_ok(idem_record_delete(h, "pay", "D-1", epoch, &o, current, &cur_epoch));
    assert_outcome(o, IDEM_CONFLICT);
    assert_string_equal(current, IDEM_STATE_PROCESSING);
    assert_int_equal(cur_epoch, epoch);
    assert_idem_ok(idem_record_complete(h, "pay", "D-1", epoch, "done", 4, 0, &o));
    /* Another epoch than the record's: untouched. */
    assert_idem_ok(idem_record_delete(h, "pay", "D-1", epoch + 1, &o, current, &cur_epoch));
    assert_outcome(o, IDEM_CONFLICT);
    assert_string_equal(current, IDEM_STATE_SUCCEEDED);
    assert_int_equal(cur_epoch, epoch);
    /* Fenced on the version read as well: written since at the same epoch,
     * it stays. */
    assert_idem_ok(idem_record_get(h, "pay", "D-1", &o, &rec));
    int64_t seen = rec.updated_ms;
    idem_record_clear(&rec);
    test_clock_advance(5);
    assert_idem_ok(
        idem_record_transition(h, "pay", "D-1", IDEM_STATE_SUCCEEDED, "SHIPPED", &o, NULL));
    assert_outcome(o, IDEM_APPLIED);
    assert_idem_ok(idem_record_delete_seen(h, "pay", "D-1", epoch, seen, &o, current, &cur_epoch));
    assert_outcome(o, IDEM_CONFLICT);
    assert_string_equal(current, "SHIPPED");
    assert_int_equal(cur_epoch, epoch);
    assert_int_equal(idem_record_delete_seen(h, "pay", "D-1", epoch, 0, &o, NULL, NULL),
                     IDEM_EINVAL);
    assert_idem_ok(idem_record_get(h, "pay", "D-1", &o, &rec));
    assert_outcome(o, IDEM_FOUND);
    assert_idem_ok(
        idem_record_delete_seen(h, "pay", "D-1", epoch, rec.updated_ms, &o, NULL, NULL));
    assert_outcome(o, IDEM_APPLIED);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_get(h, "pay", "D-1", &o, NULL));
    assert_outcome(o, IDEM_NOT_FOUND);
    assert_idem_ok(idem_record_begin(h, "pay", "D-1", NULL, "a", 1000, &o, &rec));
    epoch = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_complete(h, "pay", "D-1", epoch, "done", 4, 0, &o));
    assert_idem_ok(idem_record_get(h, "pay", "D-1", &o, NULL));
    assert_outcome(o, IDEM_FOUND);
    assert_idem_ok(idem_record_delete(h, "pay", "D-1", epoch, &o, current, &cur_epoch));
    assert_outcome(o, IDEM_APPLIED);
    assert_idem_ok(idem_record_get(h, "pay", "D-1", &o, NULL));
    assert_outcome(o, IDEM_NOT_FOUND);
    assert_idem_ok(idem_record_delete(h, "pay", "D-1", epoch, &o, NULL, NULL));
    assert_outcome(o, IDEM_NOT_FOUND);
    /* The key executes again, at an epoch the old record never had. */
    test_clock_advance(5);
    assert_idem_ok(idem_record_begin(h, "pay", "D-1", NULL, "b", 1000, &o, &rec));
    assert_outcome(o, IDEM_NEW);
    assert_true(rec.epoch > epoch);
    idem_record_clear(&rec);
    assert_int_equal(idem_record_delete(h, "pay", "D-1", 0, &o, NULL, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_delete(h, "pay", "", 1, &o, NULL, NULL), IDEM_EINVAL);
    assert_int_equal(idem_record_delete(h, "pay", "D-1", 1, NULL, NULL, NULL), IDEM_EINVAL);
}

struct group_commit_load {
    idem *h;
    idem_rc rc[64];
};

static void many_writes(void *arg, int i)
{
    struct group_commit_load *g = arg;
    for (int n = 0; n < 20 && g->rc[i] == IDEM_OK; n++) {
        char key[32];
        idem_outcome o;
        idem_record rec;
        snprintf(key, sizeof key, "gc-%d-%d", i, n);
        g->rc[i] = idem_record_begin(g->h, "pay", key, NULL, "w", 30000, &o, &rec);
        if (g->rc[i] == IDEM_OK)
            g->rc[i] = idem_record_complete(g->h, "pay", key, rec.epoch, key, strlen(key), 0, &o);
        idem_record_clear(&rec);
    }
}

static void test_group_commit_shares_commits(void **state)
{
    idem *h = *state;
    idem_stats before, after;
    idem_commit_times t0, t1;
    idem_commit_batches b0, b1;
    idem_get_stats(h, &before);
    idem_get_commit_times(h, &t0);
    idem_get_commit_batches(h, &b0);
    struct group_commit_load g = {.h = h};
    test_run_threads(64, many_writes, &g);
    for (int i = 0; i < 64; i++)
        assert_int_equal(g.rc[i], IDEM_OK);
    idem_get_stats(h, &after);
    idem_get_commit_times(h, &t1);
    idem_get_commit_batches(h, &b1);
    uint64_t ops = after.committed_ops - before.committed_ops;
    uint64_t commits = after.commits - before.commits;
    assert_int_equal(ops, 64 * 20 * 2);
    /* 64 callers at once: batches carry more than one write each. */
    assert_true(commits < ops);
    /* Each commit was timed, into one bucket, and took some time. */
    uint64_t timed = 0;
    for (unsigned b = 0; b < IDEM_COMMIT_BUCKETS; b++)
        timed += t1.hist[b] - t0.hist[b];
    assert_int_equal(timed, commits);
    assert_int_equal(t1.commits - t0.commits, commits);
    assert_true(t1.us - t0.us >= commits);
    assert_true(idem_commit_bucket_us(IDEM_COMMIT_BUCKETS - 1) == UINT64_MAX);
    /* Each commit's size counted in one bucket, and some carried more than
     * one write (those past the first bucket). */
    uint64_t sized = 0, shared = 0;
    for (unsigned b = 0; b < IDEM_BATCH_BUCKETS; b++) {
        sized += b1.hist[b] - b0.hist[b];
        shared += b ? b1.hist[b] - b0.hist[b] : 0;
    }
    assert_int_equal(sized, commits);
    assert_true(shared >= 1);
    assert_int_equal(b1.ops - b0.ops, ops);
    assert_int_equal(b1.commits - b0.commits, commits);
    assert_true(idem_commit_batch_bound(0) == 1);
    assert_true(idem_commit_batch_bound(IDEM_BATCH_BUCKETS - 1) == UINT64_MAX);
    /* And every write is there. */
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_get(h, "pay", "gc-63-19", &o, &rec));
    assert_outcome(o, IDEM_FOUND);
    assert_string_equal(rec.state, "SUCCEEDED");
    assert_memory_equal(rec.result, "gc-63-19", 8);
    idem_record_clear(&rec);
}

/* The writer checkpoints the WAL as SQLite's automatic checkpoint would, at
 * 1000 frames (after the batch's callers are answered, which this cannot
 * see): one caller's 2000 begins and completes, about 4000 commits of a few
 * pages each, about 40 MB of frames, leave a WAL of about 1000 frames. */
static void test_wal_checkpointed(void **state)
{
    idem *h = *state;
    if (is_postgres() || strcmp(store_where, "file") != 0)
        skip();
    for (int i = 0; i < 2000; i++) {
        char key[32];
        idem_outcome o;
        idem_record rec;
        snprintf(key, sizeof key, "ck-%d", i);
        assert_idem_ok(idem_record_begin(h, "pay", key, NULL, "w", 30000, &o, &rec));
        assert_outcome(o, IDEM_NEW);
        assert_idem_ok(idem_record_complete(h, "pay", key, rec.epoch, key, strlen(key), 0, &o));
        idem_record_clear(&rec);
    }
    char wal[sizeof db_path + 8];
    snprintf(wal, sizeof wal, "%s-wal", db_path);
    struct stat st;
    assert_int_equal(stat(wal, &st), 0);
    if (st.st_size > 6 * 1024 * 1024)
        fail_msg("the WAL is %lld bytes after 4000 commits: not checkpointed",
                 (long long)st.st_size);
}

/* ---- tokens ----------------------------------------------------------- */

struct token_storm {
    idem *h;
    char token[IDEM_TOKEN_LEN + 1];
    idem_outcome out[64];
    idem_rc rc[64];
    char spent[64][IDEM_KEY_MAX + 1];
};

static void race_consume(void *arg, int i)
{
    struct token_storm *t = arg;
    t->rc[i] = idem_token_consume(t->h, "user-1", "refund-form", t->token, "R-77",
                                  &t->out[i], t->spent[i]);
}

static void test_token_storm(void **state)
{
    struct token_storm *t = calloc(1, sizeof *t);
    t->h = *state;
    assert_idem_ok(idem_token_issue(t->h, "user-1", "refund-form", 300000, t->token));
    assert_int_equal(strlen(t->token), IDEM_TOKEN_LEN);
    assert_int_equal(strspn(t->token, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
                     IDEM_TOKEN_LEN);
    test_run_threads(64, race_consume, t);
    int consumed = 0, already = 0;
    for (int i = 0; i < 64; i++) {
        assert_int_equal(t->rc[i], IDEM_OK);
        consumed += t->out[i] == IDEM_CONSUMED;
        if (t->out[i] == IDEM_ALREADY_CONSUMED) {
            already++;
            assert_string_equal(t->spent[i], "R-77");
        }
    }
    assert_int_equal(consumed, 1);
    assert_int_equal(already, 63);

    idem_outcome o;
    char spent[IDEM_KEY_MAX + 1];
    /* A late retry with the same key learns which key the token went to. */
    assert_idem_ok(idem_token_consume(t->h, "user-1", "refund-form", t->token, "R-77", &o, spent));
    assert_outcome(o, IDEM_ALREADY_CONSUMED);
    assert_string_equal(spent, "R-77");
    /* Another subject or scene never sees the token. */
    assert_idem_ok(idem_token_consume(t->h, "user-2", "refund-form", t->token, "R-77", &o, spent));
    assert_outcome(o, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_consume(t->h, "user-1", "pay-form", t->token, "R-77", &o, spent));
    assert_outcome(o, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_consume(t->h, "user-1", "refund-form", "not-a-token", "R-77", &o, spent));
    assert_outcome(o, IDEM_UNKNOWN);
    free(t);
}

static void test_token_give_back_and_expiry(void **state)
{
    idem *h = *state;
    char tok[IDEM_TOKEN_LEN + 1], other[IDEM_TOKEN_LEN + 1];
    idem_outcome o;
    assert_idem_ok(idem_token_issue(h, "", "checkout", 10000, tok));
    assert_idem_ok(idem_token_issue(h, "", "checkout", 10000, other));
    assert_string_not_equal(tok, other);

    assert_idem_ok(idem_token_consume(h, "", "checkout", tok, "O-1", &o, NULL));
    assert_outcome(o, IDEM_CONSUMED);
    /* Given back only for the key it was spent on. */
    assert_idem_ok(idem_token_give_back(h, "", "checkout", tok, "O-2", &o));
    assert_outcome(o, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_give_back(h, "", "checkout", tok, "O-1", &o));
    assert_outcome(o, IDEM_RESTORED);
    assert_idem_ok(idem_token_give_back(h, "", "checkout", tok, "O-1", &o));
    assert_outcome(o, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_consume(h, "", "checkout", tok, "O-1", &o, NULL));
    assert_outcome(o, IDEM_CONSUMED);

    /* Expiry. t = 0 now; all three were issued for 10 s. */
    char third[IDEM_TOKEN_LEN + 1];
    assert_idem_ok(idem_token_issue(h, "", "checkout", 10000, third));
    test_clock_advance(6000);
    assert_idem_ok(idem_token_consume(h, "", "checkout", third, "O-9", &o, NULL));
    assert_outcome(o, IDEM_CONSUMED);
    assert_idem_ok(idem_token_consume(h, "", "checkout", tok, "O-1", &o, NULL));
    assert_outcome(o, IDEM_ALREADY_CONSUMED);
    test_clock_advance(4001); /* t = 10.001 s */
    /* An unspent token is gone after its TTL... */
    assert_idem_ok(idem_token_consume(h, "", "checkout", other, "O-3", &o, NULL));
    assert_outcome(o, IDEM_UNKNOWN);
    /* ...a spent one is remembered for a TTL from its spending: tok was
     * spent at 0 and is gone, third at 6 s and is still known. */
    assert_idem_ok(idem_token_consume(h, "", "checkout", tok, "O-1", &o, NULL));
    assert_outcome(o, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_consume(h, "", "checkout", third, "O-9", &o, NULL));
    assert_outcome(o, IDEM_ALREADY_CONSUMED);
    /* Too late to give it back: its issued life is over. */
    assert_idem_ok(idem_token_give_back(h, "", "checkout", third, "O-9", &o));
    assert_outcome(o, IDEM_UNKNOWN);
    test_clock_advance(6000);
    assert_idem_ok(idem_token_consume(h, "", "checkout", third, "O-9", &o, NULL));
    assert_outcome(o, IDEM_UNKNOWN);
}

static void test_token_cap_per_scene(void **state)
{
    idem *h = *state;
    char tok[20][IDEM_TOKEN_LEN + 1];
    idem_outcome o;
    for (int i = 0; i < 20; i++)
        assert_idem_ok(idem_token_issue(h, "u", "form", 60000, tok[i]));
    /* The default cap is 16 outstanding per subject+scene: the 4 oldest went. */
    for (int i = 0; i < 20; i++) {
        assert_idem_ok(idem_token_consume(h, "u", "form", tok[i], "k", &o, NULL));
        assert_outcome(o, i < 4 ? IDEM_UNKNOWN : IDEM_CONSUMED);
    }
    /* Spent tokens do not count against the cap. */
    for (int i = 0; i < 16; i++)
        assert_idem_ok(idem_token_issue(h, "u", "form", 60000, tok[i]));
    assert_idem_ok(idem_token_consume(h, "u", "form", tok[0], "k", &o, NULL));
    assert_outcome(o, IDEM_CONSUMED);
}

/* The embedded store's token table full: an issue is refused (EFULL)
 * while nothing held can have expired, and takes the room of one that has
 * as soon as the clock passes its TTL; a token spent or given back with a
 * shorter life than what was swept counts too. Locks alike. */
static void test_kv_full(void **state)
{
    (void)state;
    if (is_redis())
        skip(); /* Redis's own memory limit applies there */
    idem_options o;
    idem_options_init(&o);
    store_options(&o, 1);
    o.clock = test_clock;
    o.tokens_max = 200;
    o.locks_max = 200;
    idem *h = open_with(&o);
    char tok[IDEM_TOKEN_LEN + 1], subject[32];
    idem_outcome out;
    for (int i = 0; i < 200; i++) {
        snprintf(subject, sizeof subject, "s-%d", i);
        assert_idem_ok(idem_token_issue(h, subject, "form", i < 100 ? 60000 : 600000, tok));
    }
    for (int i = 0; i < 1000; i++)
        assert_int_equal(idem_token_issue(h, "other", "form", 60000, tok), IDEM_EFULL);
    /* A token issued later with a shorter life lowers the bound: the sweep
     * must not wait for the first ones' minute. */
    test_clock_advance(59000);
    assert_int_equal(idem_token_issue(h, "other", "form", 60000, tok), IDEM_EFULL);
    test_clock_advance(1001); /* the first 100 are gone */
    for (int i = 0; i < 100; i++) {
        snprintf(subject, sizeof subject, "t-%d", i);
        assert_idem_ok(idem_token_issue(h, subject, "form", 1000, tok));
    }
    assert_int_equal(idem_token_issue(h, "other", "form", 60000, tok), IDEM_EFULL);
    test_clock_advance(1000); /* those 100 of a second are gone too */
    assert_idem_ok(idem_token_issue(h, "other", "form", 60000, tok));
    /* Locks: the same bound, lowered by a renewal that shortens one. */
    idem_lock_info info;
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "k-%d", i);
        assert_idem_ok(idem_lock_acquire(h, "acct", key, "w", 60000, &out, &info));
        assert_outcome(out, IDEM_ACQUIRED);
    }
    assert_int_equal(idem_lock_acquire(h, "acct", "more", "w", 60000, &out, &info), IDEM_EFULL);
    assert_idem_ok(idem_lock_renew(h, "acct", "k-7", "w", 10, &out));
    assert_int_equal(idem_lock_acquire(h, "acct", "more", "w", 60000, &out, &info), IDEM_EFULL);
    test_clock_advance(11);
    assert_idem_ok(idem_lock_acquire(h, "acct", "more", "w", 60000, &out, &info));
    assert_outcome(out, IDEM_ACQUIRED);
    idem_close(h);
}

static void test_token_bad_input(void **state)
{
    idem *h = *state;
    char tok[IDEM_TOKEN_LEN + 1];
    idem_outcome o;
    assert_int_equal(idem_token_issue(h, "u", "", 1000, tok), IDEM_EINVAL);
    assert_int_equal(idem_token_issue(h, "u", "a/b", 1000, tok), IDEM_EINVAL);
    assert_int_equal(idem_token_issue(h, "u\r", "form", 1000, tok), IDEM_EINVAL);
    assert_int_equal(idem_token_issue(h, "u", "form", 0, tok), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "ttl_ms"));
    assert_int_equal(idem_token_issue(h, "u", "form", 1000, NULL), IDEM_EINVAL);
    assert_int_equal(idem_token_issue(NULL, "u", "form", 1000, tok), IDEM_EINVAL);
    assert_int_equal(idem_token_consume(h, "u", "form", NULL, "k", &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_token_consume(h, "u", "form", "t", "", &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_token_consume(h, "u", "form", "t", "k", NULL, NULL), IDEM_EINVAL);
}

/* ---- locks ------------------------------------------------------------ */

struct counter_run {
    idem *h;
    long counter; /* deliberately not atomic: the lock must protect it */
    uint64_t fences[16 * 1000];
    int nfences;
    idem_rc rc[16];
};

static void increment_under_lock(void *arg, int i)
{
    struct counter_run *c = arg;
    char owner[16];
    snprintf(owner, sizeof owner, "t%d", i);
    for (int n = 0; n < 1000; n++) {
        idem_outcome o;
        idem_lock_info info;
        do {
            c->rc[i] = idem_lock_acquire(c->h, "acct", "A-1", owner, 10000, &o, &info);
            if (c->rc[i] != IDEM_OK)
                return;
        } while (o != IDEM_ACQUIRED);
        long v = c->counter;
        c->fences[c->nfences++] = info.fence;
        c->counter = v + 1;
        c->rc[i] = idem_lock_release(c->h, "acct", "A-1", owner, &o);
        if (c->rc[i] != IDEM_OK || o != IDEM_RELEASED) {
            c->rc[i] = IDEM_ESTORE;
            return;
        }
    }
}

static void test_lock_counter(void **state)
{
    struct counter_run *c = calloc(1, sizeof *c);
    c->h = *state;
    test_run_threads(16, increment_under_lock, c);
    for (int i = 0; i < 16; i++)
        assert_int_equal(c->rc[i], IDEM_OK);
    assert_int_equal(c->counter, 16000);
    assert_int_equal(c->nfences, 16000);
    for (int i = 1; i < c->nfences; i++)
        if (c->fences[i] <= c->fences[i - 1])
            fail_msg("fence %d: %llu after %llu", i, (unsigned long long)c->fences[i],
                     (unsigned long long)c->fences[i - 1]);
    free(c);
}

static void test_lock_owner_rules(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_lock_info info, again;
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "alice", 5000, &o, &info));
    assert_outcome(o, IDEM_ACQUIRED);
    assert_true(info.fence > 0);

    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "bob", 5000, &o, &again));
    assert_outcome(o, IDEM_BUSY);
    assert_string_equal(again.holder, "alice");
    assert_true(again.ttl_left_ms > 0 && again.ttl_left_ms <= 5000);

    /* Not the owner: release and renew change nothing and say so. */
    assert_idem_ok(idem_lock_release(h, "acct", "L-1", "bob", &o));
    assert_outcome(o, IDEM_NOT_HELD);
    assert_idem_ok(idem_lock_renew(h, "acct", "L-1", "bob", 5000, &o));
    assert_outcome(o, IDEM_NOT_HELD);
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "bob", 5000, &o, NULL));
    assert_outcome(o, IDEM_BUSY);

    /* The owner again: same fence, fresh TTL. */
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "alice", 5000, &o, &again));
    assert_outcome(o, IDEM_ACQUIRED);
    assert_int_equal(again.fence, info.fence);
    assert_idem_ok(idem_lock_renew(h, "acct", "L-1", "alice", 5000, &o));
    assert_outcome(o, IDEM_RENEWED);

    /* Expiry: the lease runs out, someone else takes it, the old owner's
     * release and renew cannot touch the new holder's lock. */
    test_clock_advance(5001);
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "bob", 5000, &o, &again));
    assert_outcome(o, IDEM_ACQUIRED);
    assert_true(again.fence > info.fence);
    assert_idem_ok(idem_lock_renew(h, "acct", "L-1", "alice", 5000, &o));
    assert_outcome(o, IDEM_NOT_HELD);
    assert_idem_ok(idem_lock_release(h, "acct", "L-1", "alice", &o));
    assert_outcome(o, IDEM_NOT_HELD);
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-1", "carol", 5000, &o, NULL));
    assert_outcome(o, IDEM_BUSY);
    assert_idem_ok(idem_lock_release(h, "acct", "L-1", "bob", &o));
    assert_outcome(o, IDEM_RELEASED);
    assert_idem_ok(idem_lock_release(h, "acct", "L-1", "bob", &o));
    assert_outcome(o, IDEM_NOT_HELD);

    /* Fences grow across spaces too (each space's sequence is increasing). */
    idem_lock_info x, y;
    assert_idem_ok(idem_lock_acquire(h, "other", "L-1", "a", 5000, &o, &x));
    assert_idem_ok(idem_lock_acquire(h, "acct", "L-9", "a", 5000, &o, &y));
    assert_true(y.fence > again.fence);

    assert_int_equal(idem_lock_acquire(h, "acct", "k", "a", 0, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_lock_acquire(h, "acct", "k", "", 10, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_lock_acquire(h, "acct", "k", "a", 10, NULL, NULL), IDEM_EINVAL);
}

static atomic_int lost_calls;

static void on_lost(void *arg, const char *space, const char *key)
{
    (void)arg;
    if (strcmp(space, "acct") == 0 && strcmp(key, "W-1") == 0)
        atomic_fetch_add(&lost_calls, 1);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_watchdog(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_watch *w = NULL;
    atomic_store(&lost_calls, 0);
    assert_idem_ok(idem_lock_acquire(h, "acct", "W-1", "worker", 600, &o, NULL));
    assert_idem_ok(idem_watchdog_start(h, "acct", "W-1", "worker", 600, on_lost, NULL, &w));
    /* Four TTLs of real time: without renewals (every 200 ms) the lock would
     * be gone; a renewal may be up to 400 ms late on a loaded machine. */
    for (int i = 0; i < 24; i++) {
        sleep_ms(100);
        assert_idem_ok(idem_lock_acquire(h, "acct", "W-1", "thief", 600, &o, NULL));
        assert_outcome(o, IDEM_BUSY);
    }
    assert_int_equal(atomic_load(&lost_calls), 0);

    /* The process stalls past its lease (the clock jumps) and the thief gets
     * in: the next renewal finds the lock gone and calls back once. */
    test_clock_advance(10000);
    assert_idem_ok(idem_lock_acquire(h, "acct", "W-1", "thief", 60000, &o, NULL));
    assert_outcome(o, IDEM_ACQUIRED);
    for (int i = 0; i < 250 && atomic_load(&lost_calls) == 0; i++)
        sleep_ms(20);
    assert_int_equal(atomic_load(&lost_calls), 1);
    sleep_ms(500);
    assert_int_equal(atomic_load(&lost_calls), 1);
    /* And it did not touch the thief's lock. */
    assert_idem_ok(idem_lock_acquire(h, "acct", "W-1", "worker", 600, &o, NULL));
    assert_outcome(o, IDEM_BUSY);
    idem_watchdog_stop(w);
    idem_watchdog_stop(NULL);

    /* Stopping a healthy watch: renewals stop, and once the lease has run
     * out the lock is free. */
    assert_idem_ok(idem_lock_acquire(h, "acct", "W-2", "worker", 600, &o, NULL));
    assert_idem_ok(idem_watchdog_start(h, "acct", "W-2", "worker", 600, NULL, NULL, &w));
    sleep_ms(300);
    idem_watchdog_stop(w);
    test_clock_advance(1000); /* past any renewal made before the stop */
    assert_idem_ok(idem_lock_acquire(h, "acct", "W-2", "next", 600, &o, NULL));
    assert_outcome(o, IDEM_ACQUIRED);
}

/* The watchdog sleeps until the earliest renewal it knows of. A watch due
 * earlier than that (a shorter TTL) must wake it: here the first watch's
 * renewal is 2 s away, the second's 200 ms, and the second lock must still
 * be renewed in time. */
static void test_watchdog_earlier_watch_wakes_it(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_watch *slow = NULL, *fast = NULL;
    assert_idem_ok(idem_lock_acquire(h, "acct", "S-1", "worker", 6000, &o, NULL));
    assert_idem_ok(idem_watchdog_start(h, "acct", "S-1", "worker", 6000, NULL, NULL, &slow));
    sleep_ms(100); /* the watchdog is asleep until S-1's renewal */
    assert_idem_ok(idem_lock_acquire(h, "acct", "F-1", "worker", 600, &o, NULL));
    assert_idem_ok(idem_watchdog_start(h, "acct", "F-1", "worker", 600, NULL, NULL, &fast));
    for (int i = 0; i < 18; i++) { /* three of F-1's TTLs */
        sleep_ms(100);
        assert_idem_ok(idem_lock_acquire(h, "acct", "F-1", "thief", 600, &o, NULL));
        assert_outcome(o, IDEM_BUSY);
    }
    idem_watchdog_stop(fast);
    idem_watchdog_stop(slow);
}

/* ---- inbox ------------------------------------------------------------ */

static void exec_ok(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err);
}

static int count_rows(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    int n = sqlite3_step(s) == SQLITE_ROW ? sqlite3_column_int(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
}

static void test_inbox_in_callers_transaction(void **state)
{
    (void)state;
    sqlite3 *db;
    idem_outcome o;
    assert_int_equal(sqlite3_open(":memory:", &db), SQLITE_OK);
    exec_ok(db, "CREATE TABLE ledger (msg TEXT, amount INTEGER)");

    /* No transaction open: refused. */
    assert_int_equal(idem_inbox_claim_sqlite(db, "billing", "m-1", "refund", &o), IDEM_ENOTX);

    /* The business rolls back: the claim leaves no trace. */
    exec_ok(db, "BEGIN");
    assert_idem_ok(idem_inbox_claim_sqlite(db, "billing", "m-1", "refund", &o));
    assert_outcome(o, IDEM_CLAIMED);
    exec_ok(db, "INSERT INTO ledger VALUES ('m-1', 100)");
    exec_ok(db, "ROLLBACK");
    exec_ok(db, "BEGIN");
    assert_idem_ok(idem_inbox_claim_sqlite(db, "billing", "m-1", "refund", &o));
    assert_outcome(o, IDEM_CLAIMED);
    exec_ok(db, "INSERT INTO ledger VALUES ('m-1', 100)");
    exec_ok(db, "COMMIT");

    /* Redelivery after commit: DUPLICATE; the consumer skips the effect. */
    for (int i = 0; i < 3; i++) {
        exec_ok(db, "BEGIN");
        assert_idem_ok(idem_inbox_claim_sqlite(db, "billing", "m-1", "refund", &o));
        assert_outcome(o, IDEM_DUPLICATE);
        exec_ok(db, "COMMIT");
    }
    /* Another group consumes the same message independently. */
    exec_ok(db, "BEGIN");
    assert_idem_ok(idem_inbox_claim_sqlite(db, "audit", "m-1", NULL, &o));
    assert_outcome(o, IDEM_CLAIMED);
    exec_ok(db, "COMMIT");
    assert_int_equal(count_rows(db, "SELECT count(*) FROM ledger"), 1);
    assert_int_equal(count_rows(db, "SELECT count(*) FROM idem_inbox_claim"), 2);

    exec_ok(db, "BEGIN");
    assert_int_equal(idem_inbox_claim_sqlite(db, "billing", "", NULL, &o), IDEM_EINVAL);
    assert_int_equal(idem_inbox_claim_sqlite(NULL, "billing", "m", NULL, &o), IDEM_EINVAL);
    exec_ok(db, "ROLLBACK");
    sqlite3_close(db);
}

static void pg_ok(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    PQclear(r);
}

/* The same promise on PostgreSQL, on the caller's own connection. */
static void test_inbox_in_callers_pg_transaction(void **state)
{
    (void)state;
    if (!is_postgres())
        skip();
    idem_outcome o;
    PGconn *c = PQconnectdb(postgres_url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    pg_ok(c, "CREATE TABLE ledger (msg TEXT, amount INTEGER)");

    assert_int_equal(idem_inbox_claim_pg(c, "billing", "m-1", "refund", &o), IDEM_ENOTX);

    /* The business rolls back: the claim leaves no trace. */
    pg_ok(c, "BEGIN");
    assert_idem_ok(idem_inbox_claim_pg(c, "billing", "m-1", "refund", &o));
    assert_outcome(o, IDEM_CLAIMED);
    pg_ok(c, "INSERT INTO ledger VALUES ('m-1', 100)");
    pg_ok(c, "ROLLBACK");
    pg_ok(c, "BEGIN");
    assert_idem_ok(idem_inbox_claim_pg(c, "billing", "m-1", "refund", &o));
    assert_outcome(o, IDEM_CLAIMED);
    pg_ok(c, "INSERT INTO ledger VALUES ('m-1', 100)");
    pg_ok(c, "COMMIT");

    /* Redeliveries after the commit, on another connection too. */
    PGconn *c2 = PQconnectdb(postgres_url);
    assert_int_equal(PQstatus(c2), CONNECTION_OK);
    for (int i = 0; i < 3; i++) {
        PGconn *on = i % 2 ? c2 : c;
        pg_ok(on, "BEGIN");
        assert_idem_ok(idem_inbox_claim_pg(on, "billing", "m-1", "refund", &o));
        assert_outcome(o, IDEM_DUPLICATE);
        pg_ok(on, "COMMIT");
    }
    /* Two transactions race for one message: the second waits for the first
     * and, once it commits, sees a DUPLICATE. */
    pg_ok(c, "BEGIN");
    assert_idem_ok(idem_inbox_claim_pg(c, "audit", "m-1", NULL, &o));
    assert_outcome(o, IDEM_CLAIMED);
    pg_ok(c2, "BEGIN");
    assert_int_equal(PQsendQuery(c2, "SELECT 1"), 1); /* c2 stays usable below */
    PGresult *r;
    while ((r = PQgetResult(c2)))
        PQclear(r);
    pg_ok(c, "COMMIT");
    assert_idem_ok(idem_inbox_claim_pg(c2, "audit", "m-1", NULL, &o));
    assert_outcome(o, IDEM_DUPLICATE);
    pg_ok(c2, "COMMIT");

    assert_int_equal(test_pg_count(c, "SELECT count(*) FROM ledger"), 1);
    assert_int_equal(test_pg_count(c, "SELECT count(*) FROM idem_inbox_claim"), 2);

    pg_ok(c, "BEGIN");
    assert_int_equal(idem_inbox_claim_pg(c, "billing", "", NULL, &o), IDEM_EINVAL);
    assert_int_equal(idem_inbox_claim_pg(NULL, "billing", "m", NULL, &o), IDEM_EINVAL);
    pg_ok(c, "ROLLBACK");
    PQfinish(c2);
    PQfinish(c);
}

/* Fences keep rising when the lock store loses its counter: a Redis that
 * restarts without persistence, a FLUSHDB. (The embedded store's counter
 * starts from the wall clock when the process does: the same promise.) */
static void test_fences_survive_a_lost_counter(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_lock_info a, b;
    assert_idem_ok(idem_lock_acquire(h, "pay", "F-1", "w1", 5000, &o, &a));
    assert_outcome(o, IDEM_ACQUIRED);
    assert_idem_ok(idem_lock_release(h, "pay", "F-1", "w1", &o));
    if (is_redis()) {
        test_wipe_servers(redis_url, NULL);
    } else {
        idem_close(h);
        *state = h = open_store();
    }
    assert_idem_ok(idem_lock_acquire(h, "pay", "F-1", "w2", 5000, &o, &b));
    assert_outcome(o, IDEM_ACQUIRED);
    if (b.fence <= a.fence)
        fail_msg("fence %llu after the counter was lost, %llu before",
                 (unsigned long long)b.fence, (unsigned long long)a.fence);
}

struct opener {
    idem_rc rc[8];
};

static void open_and_close(void *arg, int i)
{
    struct opener *op = arg;
    idem_options o;
    idem_options_init(&o);
    store_options(&o, 0);
    idem *h = NULL;
    op->rc[i] = idem__open_parts(&o, kv_kind, db_kind, &h);
    idem_close(h);
}

/* Several processes starting at once on an empty database take turns at
 * migrating it; a database migrated by a newer Idem is refused, untouched. */
static void test_schema_migrations(void **state)
{
    if (!is_postgres())
        skip();
    idem_close(*state);
    *state = NULL;
    wipe_servers();
    struct opener op;
    test_run_threads(8, open_and_close, &op);
    for (int i = 0; i < 8; i++)
        if (op.rc[i] != IDEM_OK)
            fail_msg("opener %d: %s", i, idem_errname(op.rc[i]));
    PGconn *c = PQconnectdb(postgres_url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    assert_int_equal(test_pg_count(c, "SELECT count(*) FROM idem_schema"), 2);
    /* A database of version 1 (before the listing's indexes) is brought
     * to version 2 at open, its records kept. */
    pg_ok(c, "DROP INDEX idem_record_created; DROP INDEX idem_record_processing;"
             " DELETE FROM idem_schema WHERE version = 2");
    pg_ok(c, "INSERT INTO idem_record (space, key, state, epoch, owner, lease_until,"
             " created_ms, updated_ms) VALUES ('pay', 'old', 'PROCESSING', 1, 'o', 2, 1, 1)");
    idem *up = open_store();
    assert_int_equal(test_pg_count(c, "SELECT count(*) FROM pg_indexes WHERE indexname IN"
                                      " ('idem_record_created', 'idem_record_processing')"),
                     2);
    assert_int_equal(test_pg_count(c, "SELECT max(version) FROM idem_schema"), 2);
    idem_record_query q = {.space = "pay", .state = IDEM_STATE_PROCESSING};
    idem_record_page pg;
    assert_idem_ok(idem_record_list(up, &q, &pg));
    assert_int_equal(pg.count, 1);
    idem_record_page_clear(&pg);
    idem_close(up);
    pg_ok(c, "INSERT INTO idem_schema (version) VALUES (99)");
    idem_options o;
    idem_options_init(&o);
    store_options(&o, 0);
    idem *h = (idem *)&o;
    assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_ESTORE);
    assert_null(h);
    assert_non_null(strstr(idem_errdetail(), "version 99"));
    assert_int_equal(test_pg_count(c, "SELECT count(*) FROM idem_schema"), 3);
    pg_ok(c, "DELETE FROM idem_schema WHERE version = 99");
    PQfinish(c);
    *state = open_store();
}

/* Servers that cannot be reached are named, and a password never is. */
static void test_distributed_open_errors(void **state)
{
    (void)state;
    if (!is_redis() && !is_postgres())
        skip();
    idem_options o;
    idem_options_init(&o);
    store_options(&o, 1);
    o.timeout_ms = 500;
    idem *h = (idem *)&o;
    if (is_redis()) {
        o.redis_url = "redis://:s3cret-pw@127.0.0.1:1/0";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EUNAVAILABLE);
        assert_null(h);
        assert_non_null(strstr(idem_errdetail(), "127.0.0.1:1"));
        assert_null(strstr(idem_errdetail(), "s3cret-pw"));
        /* Passwords holding '?' or '/' unescaped: taken, or refused; never shown. */
        o.redis_url = "redis://:s3cret?pw@127.0.0.1:1/0";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EUNAVAILABLE);
        assert_null(strstr(idem_errdetail(), "s3cret"));
        o.redis_url = "redis://:s3cret/pw@127.0.0.1:1/0";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EINVAL);
        assert_null(strstr(idem_errdetail(), "s3cret"));
        o.redis_url = "http://127.0.0.1:6379";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EINVAL);
        assert_non_null(strstr(idem_errdetail(), "redis_url"));
        o.redis_url = redis_url;
    }
    if (is_postgres()) {
        o.postgres_url = "postgresql://idem:s3cret-pw@127.0.0.1:1/idem";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EUNAVAILABLE);
        assert_null(h);
        assert_null(strstr(idem_errdetail(), "s3cret-pw"));
        /* A password with an unescaped '/' is refused, and not shown. */
        o.postgres_url = "postgresql://idem:s3cret/pw@127.0.0.1:1/idem";
        assert_int_equal(idem__open_parts(&o, kv_kind, db_kind, &h), IDEM_EINVAL);
        assert_non_null(strstr(idem_errdetail(), "percent-encode"));
        assert_null(strstr(idem_errdetail(), "s3cret"));
        o.postgres_url = postgres_url;
    }
    o.store = "distributed";
    o.redis_url = NULL;
    assert_int_equal(idem_open(&o, &h), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "redis_url"));
}

static void test_inbox_retries(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_inbox_entry e;
    assert_idem_ok(idem_inbox_receive(h, "billing", "m-1", "refund", &o, &e));
    assert_outcome(o, IDEM_CLAIMED);
    assert_string_equal(e.state, "RECEIVED");
    assert_idem_ok(idem_inbox_receive(h, "billing", "m-1", "refund", &o, &e));
    assert_outcome(o, IDEM_DUPLICATE);

    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", "refund", 5000, 3, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    assert_int_equal(e.attempts, 1);
    assert_string_equal(e.biz_type, "refund");
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", "refund", 5000, 3, &o, &e));
    assert_outcome(o, IDEM_IN_PROGRESS);
    assert_idem_ok(idem_inbox_fail(h, "billing", "m-1", 1, 3, &o));
    assert_outcome(o, IDEM_RETRY_LATER);

    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", "refund", 5000, 3, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    assert_int_equal(e.attempts, 2);
    /* The consumer of attempt 2 stalls; attempt 3 takes over after the lease. */
    test_clock_advance(6000);
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", "refund", 5000, 3, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    assert_int_equal(e.attempts, 3);
    assert_idem_ok(idem_inbox_done(h, "billing", "m-1", 2, &o));
    assert_outcome(o, IDEM_CONFLICT);
    assert_idem_ok(idem_inbox_fail(h, "billing", "m-1", 3, 3, &o));
    assert_outcome(o, IDEM_DEAD);
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", "refund", 5000, 3, &o, &e));
    assert_outcome(o, IDEM_DEAD);
    assert_string_equal(e.state, "DEAD");

    /* The happy path: done, then every redelivery is a duplicate. */
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-2", NULL, 5000, 3, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    assert_int_equal(e.attempts, 1);
    assert_idem_ok(idem_inbox_done(h, "billing", "m-2", 1, &o));
    assert_outcome(o, IDEM_COMPLETED);
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-2", NULL, 5000, 3, &o, &e));
    assert_outcome(o, IDEM_DUPLICATE);
    assert_idem_ok(idem_inbox_done(h, "billing", "m-none", 1, &o));
    assert_outcome(o, IDEM_NOT_FOUND);

    /* An abandoned last attempt goes DEAD on the next delivery. */
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-3", NULL, 1000, 1, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    test_clock_advance(2000);
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-3", NULL, 1000, 1, &o, &e));
    assert_outcome(o, IDEM_DEAD);

    assert_int_equal(idem_inbox_begin(h, "billing", "m-4", NULL, 1000, 0, &o, &e), IDEM_EINVAL);
    assert_int_equal(idem_inbox_begin(h, "bad group", "m-4", NULL, 1000, 1, &o, &e), IDEM_EINVAL);
}

struct inbox_storm {
    idem *h;
    idem_outcome out[32];
    idem_rc rc[32];
};

static void race_inbox(void *arg, int i)
{
    struct inbox_storm *s = arg;
    s->rc[i] = idem_inbox_begin(s->h, "billing", "storm", NULL, 30000, 5, &s->out[i], NULL);
}

static void test_inbox_storm(void **state)
{
    struct inbox_storm s = {.h = *state};
    test_run_threads(32, race_inbox, &s);
    int process = 0;
    for (int i = 0; i < 32; i++) {
        assert_int_equal(s.rc[i], IDEM_OK);
        if (s.out[i] == IDEM_PROCESS)
            process++;
        else
            assert_outcome(s.out[i], IDEM_IN_PROGRESS);
    }
    assert_int_equal(process, 1);
}

/* ---- handles ---------------------------------------------------------- */

struct log_capture {
    int warns, alerts;
    char first_alert[512], last_alert[512], last_warn[512];
};

static void capture_log(void *arg, idem_log_level level, const char *msg)
{
    struct log_capture *c = arg;
    if (level == IDEM_LOG_WARN) {
        c->warns++;
        snprintf(c->last_warn, sizeof c->last_warn, "%s", msg);
    }
    if (level == IDEM_LOG_ALERT) {
        if (!c->alerts++)
            snprintf(c->first_alert, sizeof c->first_alert, "%s", msg);
        snprintf(c->last_alert, sizeof c->last_alert, "%s", msg);
    }
}

static void test_conflicts_are_logged(void **state)
{
    (void)state;
    struct log_capture cap = {0};
    idem_options opt;
    idem_options_init(&opt);
    store_options(&opt, 1);
    opt.clock = test_clock;
    opt.log = capture_log;
    opt.log_arg = &cap;
    idem_outcome o;
    idem_record rec;
    idem *h = open_with(&opt);
    assert_idem_ok(idem_record_begin(h, "pay", "C-1", NULL, "slow", 100, &o, &rec));
    uint64_t slow = rec.epoch;
    idem_record_clear(&rec);
    test_clock_advance(200);
    assert_idem_ok(idem_record_begin(h, "pay", "C-1", NULL, "fast", 100, &o, &rec));
    assert_outcome(o, IDEM_TAKEN_OVER);
    idem_record_clear(&rec);
    assert_int_equal(cap.warns, 1);
    assert_int_equal(cap.alerts, 0);
    assert_idem_ok(idem_record_complete(h, "pay", "C-1", slow, NULL, 0, 0, &o));
    assert_outcome(o, IDEM_CONFLICT);
    assert_int_equal(cap.alerts, 1);
    assert_non_null(strstr(cap.last_alert, "pay/C-1"));
    char now_at[64];
    snprintf(now_at, sizeof now_at, "epoch %llu", (unsigned long long)slow + 1);
    assert_non_null(strstr(cap.last_alert, now_at));
    idem_close(h);
}

/* ---- the store's files removed or replaced under it (embedded file) ---- */

enum files_fate { ALL_UNLINKED, DB_REPLACED, WAL_UNLINKED, SHM_UNLINKED };

static void store_file_path(char *out, size_t cap, const char *suffix)
{
    snprintf(out, cap, "%s%s", db_path, suffix);
}

static void unlink_store_file(const char *suffix)
{
    char p[sizeof db_path + 8];
    store_file_path(p, sizeof p, suffix);
    if (unlink(p) != 0)
        fail_msg("unlink %s: %s", p, strerror(errno));
}

static void befall(enum files_fate fate)
{
    if (fate == ALL_UNLINKED) {
        unlink_store_file("");
        unlink_store_file("-wal");
        unlink_store_file("-shm");
    } else if (fate == DB_REPLACED) {
        /* Another SQLite file renamed over it: a restore, a deploy. */
        char other[sizeof db_path + 8];
        store_file_path(other, sizeof other, ".new");
        sqlite3 *db = NULL;
        assert_int_equal(sqlite3_open(other, &db), SQLITE_OK);
        assert_int_equal(sqlite3_exec(db, "CREATE TABLE t (x)", NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
        if (rename(other, db_path) != 0)
            fail_msg("rename %s: %s", other, strerror(errno));
    } else {
        unlink_store_file(fate == WAL_UNLINKED ? "-wal" : "-shm");
    }
}

/* The first refused call of a loop of them, within a second: begins of new
 * keys (writes), or reads of a record that is there. IDEM_OK if none was
 * refused in that second. */
static idem_rc first_refusal(idem *h, int writes)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int n = 0;; n++) {
        idem_outcome o;
        idem_record rec;
        char key[32];
        snprintf(key, sizeof key, "after-%d", n);
        idem_rc rc = writes ? idem_record_begin(h, "pay", key, NULL, "w", 30000, &o, &rec)
                            : idem_record_get(h, "pay", "before", &o, &rec);
        if (rc != IDEM_OK)
            return rc;
        idem_record_clear(&rec);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > 1000)
            return IDEM_OK;
        struct timespec pause = {0, 10 * 1000000L};
        nanosleep(&pause, NULL);
    }
}

/* Each fate of the files, on a store that holds a record, a claim and an
 * inbox entry, with a reader open. reads_first: nothing is written after
 * the fate, so the reads find out by themselves (what a health check does
 * on an idle daemon). Then every write and read is refused, and the reason
 * is logged once, naming the file. */
static void files_befall(enum files_fate fate, int reads_first, const char *which)
{
    struct log_capture cap = {0};
    idem_options opt;
    idem_options_init(&opt);
    store_options(&opt, 1);
    opt.clock = test_clock;
    opt.log = capture_log;
    opt.log_arg = &cap;
    idem *h = open_with(&opt);
    idem_outcome o;
    idem_record rec;
    idem_inbox_entry e;
    assert_idem_ok(idem_record_begin(h, "pay", "before", NULL, "a", 30000, &o, &rec));
    assert_idem_ok(idem_record_complete(h, "pay", "before", rec.epoch, "paid", 4, 0, &o));
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_begin(h, "pay", "open", NULL, "a", 30000, &o, &rec));
    uint64_t open_epoch = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_inbox_begin(h, "billing", "m-1", NULL, 30000, 3, &o, &e));
    assert_idem_ok(idem_record_get(h, "pay", "before", &o, &rec)); /* a reader, kept */
    assert_outcome(o, IDEM_FOUND);
    idem_record_clear(&rec);

    befall(fate);
    if (reads_first)
        assert_int_equal(first_refusal(h, 0), IDEM_ESTORE);
    idem_rc rc = first_refusal(h, 1);
    if (rc != IDEM_ESTORE)
        fail_msg("%s: new keys still begun a second later (%s)", which, idem_errname(rc));
    const char *suffix = fate == WAL_UNLINKED ? "-wal" : fate == SHM_UNLINKED ? "-shm" : "";
    char db_file[sizeof db_path + 8], part[64];
    store_file_path(db_file, sizeof db_file, suffix);
    snprintf(part, sizeof part, "the store's %s file was removed or replaced",
             *suffix ? suffix : "database");
    if (!strstr(idem_errdetail(), part))
        fail_msg("%s: the error says \"%s\"", which, idem_errdetail());
    assert_int_equal(idem_record_begin(h, "pay", "again", NULL, "w", 30000, &o, &rec),
                     IDEM_ESTORE);
    assert_int_equal(idem_record_complete(h, "pay", "open", open_epoch, "x", 1, 0, &o),
                     IDEM_ESTORE);
    assert_int_equal(idem_record_fail(h, "pay", "open", open_epoch, IDEM_FAIL_RETRYABLE, NULL,
                                      0, 0, &o),
                     IDEM_ESTORE);
    assert_int_equal(idem_record_transition(h, "pay", "before", "SUCCEEDED", "REFUNDED", &o,
                                            NULL),
                     IDEM_ESTORE);
    assert_int_equal(idem_inbox_done(h, "billing", "m-1", 1, &o), IDEM_ESTORE);
    assert_int_equal(idem_inbox_receive(h, "billing", "m-2", NULL, &o, &e), IDEM_ESTORE);
    assert_int_equal(idem_record_get(h, "pay", "before", &o, &rec), IDEM_ESTORE);
    /* Said once, naming the file (the log only: an error's detail may
     * reach clients). */
    assert_null(strstr(idem_errdetail(), tmpdir));
    assert_int_equal(cap.alerts, fate == DB_REPLACED ? 2 : 1);
    assert_non_null(strstr(cap.first_alert, db_file));
    assert_non_null(strstr(cap.first_alert, "removed or replaced under the running process"));
    /* With the database file in place, what the WAL held was checkpointed
     * into it (after the batch that failed, before the later calls'); with
     * it gone, the open database was written back at its path; with
     * another file there, saved beside it, the file named in the alert. */
    assert_int_equal(cap.warns, fate != DB_REPLACED);
    idem_close(h);
    char saved[sizeof db_path + 64];
    snprintf(saved, sizeof saved, "%s", db_path);
    if (fate == DB_REPLACED) {
        const char *at = strstr(cap.last_alert, "are saved in ");
        assert_non_null(at);
        at += strlen("are saved in ");
        snprintf(saved, sizeof saved, "%.*s", (int)strcspn(at, ";"), at);
    } else if (fate == ALL_UNLINKED) {
        assert_non_null(strstr(cap.last_warn, "written back there"));
    }
    /* Where the records now are, the one finished before is there. */
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_open_v2(saved, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT state FROM idem_record WHERE key = 'before'",
                                        -1, &st, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "SUCCEEDED");
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static void test_files_removed_under_the_store(void **state)
{
    (void)state;
    if (is_postgres() || strcmp(store_where, "file") != 0)
        skip();
    files_befall(ALL_UNLINKED, 0, "the three files unlinked");
    files_befall(ALL_UNLINKED, 1, "the three files unlinked, reads first");
    files_befall(DB_REPLACED, 0, "the database replaced");
    files_befall(DB_REPLACED, 1, "the database replaced, reads first");
    files_befall(WAL_UNLINKED, 0, "the -wal unlinked");
    files_befall(SHM_UNLINKED, 0, "the -shm unlinked");
}

static void test_open_errors(void **state)
{
    (void)state;
    idem_options o;
    idem *h = (idem *)&o;
    idem_options_init(&o);
    assert_int_equal(idem_open(&o, &h), IDEM_EINVAL); /* no path */
    assert_null(h);
    o.path = ":memory:";
    o.store = "cassandra";
    assert_int_equal(idem_open(&o, &h), IDEM_ENOTSUP);
    assert_non_null(strstr(idem_errdetail(), "cassandra"));
    o.store = NULL;
    o.version = 99;
    assert_int_equal(idem_open(&o, &h), IDEM_EINVAL);
    assert_int_equal(idem_open(NULL, &h), IDEM_EINVAL);
    o.version = IDEM_OPTIONS_VERSION;
    o.path = "/nonexistent-dir/x/y.db";
    assert_int_equal(idem_open(&o, &h), IDEM_ESTORE);
    assert_non_null(strstr(idem_errdetail(), "/nonexistent-dir/x/y.db"));
    idem_close(NULL);
    assert_string_equal(idem_strerror(IDEM_ETOOBIG), "value exceeds its size limit");
    assert_string_equal(idem_errname(IDEM_ENOMEM), "ENOMEM");
    assert_string_equal(idem_strerror((idem_rc)-999), "unknown error");
    assert_string_equal(idem_outcome_name(IDEM_TAKEN_OVER), "TAKEN_OVER");
    assert_string_equal(idem_version(), IDEM_VERSION_STRING);
}

static void test_reopen_keeps_records(void **state)
{
    idem *h = *state;
    if (!is_postgres() && strcmp(store_where, "file") != 0)
        skip();
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(h, "pay", "keep", NULL, "a", 1000, &o, &rec));
    assert_idem_ok(idem_record_complete(h, "pay", "keep", rec.epoch, "kept", 4, 0, &o));
    idem_record_clear(&rec);
    idem_close(h);
    sqlite3 *file = NULL;
    if (!is_postgres()) {
        /* A file made before the listing's indexes gains them at open. */
        assert_int_equal(sqlite3_open(db_path, &file), SQLITE_OK);
        exec_ok(file, "DROP INDEX idem_record_created; DROP INDEX idem_record_processing");
    }
    idem_options opt;
    idem_options_init(&opt);
    store_options(&opt, 0);
    h = open_with(&opt);
    *state = h;
    if (file) {
        assert_int_equal(count_rows(file, "SELECT count(*) FROM sqlite_master WHERE name IN"
                                          " ('idem_record_created', 'idem_record_processing')"),
                         2);
        sqlite3_close(file);
    }
    assert_idem_ok(idem_record_begin(h, "pay", "keep", NULL, "b", 1000, &o, &rec));
    assert_outcome(o, IDEM_DONE);
    assert_memory_equal(rec.result, "kept", 4);
    idem_record_clear(&rec);
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s embedded :memory:|file\n"
                    "       %s distributed REDIS_URL POSTGRES_URL\n"
                    "       %s redis+sqlite REDIS_URL\n"
                    "       %s memory+postgres POSTGRES_URL\n",
            argv0, argv0, argv0, argv0);
    return 2;
}

int main(int argc, char **argv)
{
    const char *name = argc > 2 ? argv[2] : "";
    if (argc == 3 && !strcmp(argv[1], "embedded") &&
        (!strcmp(argv[2], ":memory:") || !strcmp(argv[2], "file"))) {
        store_where = argv[2];
    } else if (argc == 4 && !strcmp(argv[1], "distributed")) {
        kv_kind = "redis", db_kind = "postgres";
        redis_url = argv[2], postgres_url = argv[3];
        name = "distributed";
    } else if (argc == 3 && !strcmp(argv[1], "redis+sqlite")) {
        kv_kind = "redis", redis_url = argv[2], name = argv[1];
    } else if (argc == 3 && !strcmp(argv[1], "memory+postgres")) {
        db_kind = "postgres", postgres_url = argv[2], name = argv[1];
    } else {
        return usage(argv[0]);
    }
    tmpdir = test_mkdtemp();
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
        T(test_begin_storm_one_new),
        T(test_begin_fields),
        T(test_lease_takeover),
        T(test_mismatch_every_path),
        T(test_fail_modes),
        T(test_released_takes_another_payload),
        T(test_transition),
        T(test_steps),
        T(test_machine_checks),
        T(test_purge),
        T(test_record_bad_input),
        T(test_record_list),
        T(test_record_delete),
        T(test_group_commit_shares_commits),
        T(test_wal_checkpointed),
        T(test_token_storm),
        T(test_token_give_back_and_expiry),
        T(test_token_cap_per_scene),
        T(test_kv_full),
        T(test_token_bad_input),
        T(test_lock_counter),
        T(test_lock_owner_rules),
        T(test_watchdog),
        T(test_watchdog_earlier_watch_wakes_it),
        T(test_inbox_in_callers_transaction),
        T(test_inbox_in_callers_pg_transaction),
        T(test_inbox_retries),
        T(test_inbox_storm),
        T(test_open_errors),
        T(test_distributed_open_errors),
        T(test_fences_survive_a_lost_counter),
        T(test_schema_migrations),
        T(test_conflicts_are_logged),
        T(test_files_removed_under_the_store),
        T(test_reopen_keeps_records),
#undef T
    };
    int failed = cmocka_run_group_tests_name(name, tests, NULL, NULL);
    test_rmdir(tmpdir);
    return failed;
}
