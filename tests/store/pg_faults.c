/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg_faults.c — the PostgreSQL store under errors the server raises by
 * itself: serialization failures and deadlocks, which postgres.c answers by
 * running the whole batch again (at most RETRIES_MAX times), and a job's own
 * refused data, which fails that job alone.
 *
 *   pg_faults POSTGRES_URL
 *
 * The errors are real PostgreSQL errors, raised inside the batch's
 * transaction by a trigger the test puts on idem_record: its first N firings
 * raise the SQLSTATE under test. The count lives in a sequence, which a
 * rollback does not undo, so every attempt of the batch uses one up. Records
 * live in PostgreSQL; tokens and locks (not under test) in memory.
 *
 * And the store's connections ended by the server while they idle
 * (pg_terminate_backend, what a restart does to each), which must cost no
 * call a failure; and batches whose COMMIT got no answer in time, whose
 * outcome postgres.c finds out rather than report unknown.
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store/store.h"
#include "testlib.h"

static const char *postgres_url;

static void sql(const char *text)
{
    PGconn *c = PQconnectdb(postgres_url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("PostgreSQL: %s", PQerrorMessage(c));
    PGresult *r = PQexec(c, text);
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", text, PQerrorMessage(c));
    PQclear(r);
    PQfinish(c);
}

/* The first value of the first row of a query, as a number. */
static long sql_number(const char *text)
{
    PGconn *c = PQconnectdb(postgres_url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("PostgreSQL: %s", PQerrorMessage(c));
    PGresult *r = PQexec(c, text);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        fail_msg("%s: %s", text, PQerrorMessage(c));
    long v = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(c);
    return v;
}

/* From now on, the first n inserts or updates of idem_record raise sqlstate
 * (each attempt of a batch is one firing: the batch's first write fails). */
static void inject(int n, const char *sqlstate)
{
    char text[1024];
    snprintf(text, sizeof text,
             "DROP TRIGGER IF EXISTS fault ON idem_record;"
             "DROP SEQUENCE IF EXISTS fault_seq;"
             "CREATE SEQUENCE fault_seq;"
             "CREATE OR REPLACE FUNCTION fault() RETURNS trigger AS $$ BEGIN"
             "  IF nextval('fault_seq') <= %d THEN"
             "    RAISE EXCEPTION 'injected by pg_faults' USING ERRCODE = '%s';"
             "  END IF;"
             "  RETURN NEW;"
             " END $$ LANGUAGE plpgsql;"
             "CREATE TRIGGER fault BEFORE INSERT OR UPDATE ON idem_record"
             " FOR EACH ROW EXECUTE FUNCTION fault()",
             n, sqlstate);
    sql(text);
}

/* How many times the trigger fired: the attempts the store made. */
static long firings(void)
{
    return sql_number("SELECT last_value - CASE WHEN is_called THEN 0 ELSE 1 END"
                      " FROM fault_seq");
}

static long rows(void)
{
    return sql_number("SELECT count(*) FROM idem_record");
}

static int setup(void **state)
{
    test_wipe_servers(NULL, postgres_url);
    idem_options o;
    idem_options_init(&o);
    o.postgres_url = postgres_url;
    idem *h = NULL;
    assert_idem_ok(idem__open_parts(&o, "memory", "postgres", &h));
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    idem_close(*state);
    return 0;
}

/* A conflict the server reports is retried: the caller sees one success,
 * and there is one row. */
static void retried(idem *h, const char *sqlstate)
{
    inject(3, sqlstate);
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(h, "refund", "R-1", NULL, "w1", 30000, &o, &rec));
    assert_int_equal(o, IDEM_NEW);
    assert_int_equal(firings(), 4); /* three refused attempts, then the one that held */
    assert_int_equal(rows(), 1);
    /* The claim is a normal one: it completes, and a begin replays. */
    idem_outcome done;
    assert_idem_ok(idem_record_complete(h, "refund", "R-1", rec.epoch, "ok", 2, 0, &done));
    assert_int_equal(done, IDEM_COMPLETED);
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_begin(h, "refund", "R-1", NULL, "w2", 30000, &o, &rec));
    assert_int_equal(o, IDEM_DONE);
    assert_int_equal(rec.result_len, 2);
    assert_memory_equal(rec.result, "ok", 2);
    idem_record_clear(&rec);
}

static void test_serialization_failure_retried(void **state)
{
    retried(*state, "40001");
}

static void test_deadlock_retried(void **state)
{
    retried(*state, "40P01");
}

/* Past RETRIES_MAX the caller is told, and nothing was written. */
static void test_retries_run_out(void **state)
{
    idem *h = *state;
    inject(1000, "40001");
    idem_outcome o;
    idem_rc rc = idem_record_begin(h, "refund", "R-2", NULL, "w1", 30000, &o, NULL);
    assert_int_equal(rc, IDEM_ESTORE);
    assert_non_null(strstr(idem_errdetail(), "40001"));
    long tried = firings();
    assert_true(tried >= 2 && tried <= 8); /* retried, and bounded (RETRIES_MAX) */
    assert_int_equal(rows(), 0);
    /* Once the server stops refusing, the same key is claimed normally. */
    sql("DROP TRIGGER fault ON idem_record");
    assert_idem_ok(idem_record_begin(h, "refund", "R-2", NULL, "w1", 30000, &o, NULL));
    assert_int_equal(o, IDEM_NEW);
    assert_int_equal(rows(), 1);
}

/* 64 callers race for one key while the server refuses the first attempts
 * of their batches: the retries still make exactly one claim. */
struct race {
    idem *h;
    idem_outcome o[64];
    idem_rc rc[64];
};

static void race_begin(void *arg, int i)
{
    struct race *r = arg;
    char owner[16];
    snprintf(owner, sizeof owner, "w%d", i);
    r->rc[i] = idem_record_begin(r->h, "refund", "R-3", NULL, owner, 30000, &r->o[i], NULL);
}

static void test_race_under_retries(void **state)
{
    struct race *r = calloc(1, sizeof *r);
    r->h = *state;
    inject(4, "40001");
    test_run_threads(64, race_begin, r);
    int news = 0;
    for (int i = 0; i < 64; i++) {
        assert_idem_ok(r->rc[i]);
        news += r->o[i] == IDEM_NEW;
        if (r->o[i] != IDEM_NEW)
            assert_int_equal(r->o[i], IDEM_IN_PROGRESS);
    }
    assert_int_equal(news, 1);
    assert_int_equal(rows(), 1);
    assert_true(firings() > 4); /* the refusals happened, and were retried */
    free(r);
}

/* Data the server refuses (class 23, a constraint) fails that job alone:
 * the other jobs of its batch are written. 32 callers at once, every other
 * one with a key the constraint refuses, share batches. */
static void mixed_begin(void *arg, int i)
{
    struct race *r = arg;
    char key[16];
    snprintf(key, sizeof key, "%s-%d", i % 2 ? "GOOD" : "BAD", i);
    r->rc[i] = idem_record_begin(r->h, "refund", key, NULL, "w", 30000, &r->o[i], NULL);
}

struct held_run {
    struct race *r;
    pthread_t t;
};

static void *run_mixed(void *arg)
{
    test_run_threads(32, mixed_begin, ((struct held_run *)arg)->r);
    return NULL;
}

static void test_own_refusal_fails_alone(void **state)
{
    struct race *r = calloc(1, sizeof *r);
    r->h = *state;
    sql("ALTER TABLE idem_record ADD CONSTRAINT no_bad_keys CHECK (key NOT LIKE 'BAD-%')");
    /* The table is locked while the 32 callers queue up, so that what is
     * queued goes in shared batches once it is released. */
    PGconn *c = PQconnectdb(postgres_url);
    assert_int_equal(PQstatus(c), CONNECTION_OK);
    PQclear(PQexec(c, "BEGIN; LOCK TABLE idem_record IN EXCLUSIVE MODE"));
    struct held_run run = {.r = r};
    pthread_create(&run.t, NULL, run_mixed, &run);
    struct timespec ts = {0, 300 * 1000000L};
    nanosleep(&ts, NULL);
    PQclear(PQexec(c, "COMMIT"));
    PQfinish(c);
    pthread_join(run.t, NULL);
    idem_stats st;
    idem_get_stats(r->h, &st);
    assert_int_equal(st.committed_ops, 16);
    assert_true(st.commits <= 4); /* the good ones were not written alone */
    for (int i = 0; i < 32; i++) {
        if (i % 2) {
            assert_idem_ok(r->rc[i]);
            assert_int_equal(r->o[i], IDEM_NEW);
        } else {
            assert_int_equal(r->rc[i], IDEM_ESTORE);
        }
    }
    assert_int_equal(rows(), 16);
    idem_outcome o;
    assert_int_equal(idem_record_begin(r->h, "refund", "BAD-x", NULL, "w", 30000, &o, NULL),
                     IDEM_ESTORE);
    assert_non_null(strstr(idem_errdetail(), "no_bad_keys"));
    free(r);
}

/* The server ends every session of the store while it idles, as a restart
 * does (a FATAL error, then the close): each connection is found dead before
 * it is used again and replaced, and no call fails. Several calls in a row,
 * so that both writers and a reader meet theirs. */
static void test_idle_connections_ended(void **state)
{
    idem *h = *state;
    idem_outcome o;
    idem_record rec;
    char key[32];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "R-before-%d", i);
        assert_idem_ok(idem_record_begin(h, "refund", key, NULL, "w", 30000, &o, &rec));
        assert_idem_ok(idem_record_complete(h, "refund", key, rec.epoch, "ok", 2, 0, &o));
        idem_record_clear(&rec);
        assert_idem_ok(idem_record_get(h, "refund", key, &o, &rec));
        idem_record_clear(&rec);
    }
    const char *sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                           "'idem'";
    assert_true(sql_number(sessions) >= 3); /* two writers, a reader */
    sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'idem'");
    for (int i = 0; i < 500 && sql_number(sessions) > 0; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(sql_number(sessions), 0);
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "R-after-%d", i);
        assert_idem_ok(idem_record_begin(h, "refund", key, NULL, "w", 30000, &o, &rec));
        assert_int_equal(o, IDEM_NEW);
        assert_idem_ok(idem_record_complete(h, "refund", key, rec.epoch, "ok", 2, 0, &o));
        assert_int_equal(o, IDEM_COMPLETED);
        idem_record_clear(&rec);
        assert_idem_ok(idem_record_get(h, "refund", key, &o, &rec));
        assert_int_equal(o, IDEM_FOUND);
        assert_string_equal(rec.state, IDEM_STATE_SUCCEEDED);
        idem_record_clear(&rec);
    }
    assert_int_equal(rows(), 12);
}

static idem *open_timeout(int64_t timeout_ms)
{
    idem_options o;
    idem_options_init(&o);
    o.postgres_url = postgres_url;
    o.timeout_ms = timeout_ms;
    idem *h = NULL;
    assert_idem_ok(idem__open_parts(&o, "memory", "postgres", &h));
    return h;
}

/* The batch's COMMIT outlasts the timeout (a deferred trigger sleeps in it,
 * the first time only) and its session is still running it: the store ends
 * that session, finds the claim not there, and claims again. Before, the
 * caller got ETIMEDOUT, "it may have happened". */
static void test_commit_in_doubt_rolled_back(void **state)
{
    (void)state;
    idem *h = open_timeout(500);
    sql("DROP SEQUENCE IF EXISTS fault_seq;"
        "CREATE SEQUENCE fault_seq;"
        "CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger AS $$ BEGIN"
        "  IF nextval('fault_seq') = 1 THEN PERFORM pg_sleep(30); END IF;"
        "  RETURN NEW;"
        " END $$ LANGUAGE plpgsql;"
        "CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON idem_record"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()");
    idem_outcome o;
    idem_record rec;
    int64_t t0 = test_mono_ms();
    assert_idem_ok(idem_record_begin(h, "refund", "R-doubt", NULL, "w1", 30000, &o, &rec));
    assert_int_equal(o, IDEM_NEW);
    assert_true(test_mono_ms() - t0 < 10000); /* not the 30 s sleep: the session was ended */
    assert_int_equal(firings(), 2);       /* the first try, ended; the one that held */
    assert_int_equal(rows(), 1);
    assert_int_equal(sql_number("SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
                                "'%pg_sleep(30)%' AND pid <> pg_backend_pid()"), 0);
    idem_outcome done;
    assert_idem_ok(idem_record_complete(h, "refund", "R-doubt", rec.epoch, "ok", 2, 0, &done));
    assert_int_equal(done, IDEM_COMPLETED);
    idem_record_clear(&rec);
    idem_close(h);
}

struct begin_call {
    idem *h;
    idem_rc rc;
    idem_outcome o;
    char detail[256];
    atomic_int over;
};

static void *begin_main(void *arg)
{
    struct begin_call *b = arg;
    idem_record rec;
    b->rc = idem_record_begin(b->h, "refund", "R-unsynced", NULL, "w1", 30000, &b->o, &rec);
    if (b->rc == IDEM_OK)
        idem_record_clear(&rec);
    snprintf(b->detail, sizeof b->detail, "%s", b->rc == IDEM_OK ? "" : idem_errdetail());
    atomic_store(&b->over, 1);
    return NULL;
}

/* The claim commits on the server, and the answer never comes: the server
 * waits for a synchronous standby that is not there. The store must neither
 * answer before the commit is where it was asked to be (the standby's) nor
 * give up on it: it ends the waiting session, and waits in its turn, while
 * the standby is missing; once the server no longer asks for one, it finds
 * the claim made and answers it as made (NEW), with one row. */
static void test_commit_in_doubt_committed(void **state)
{
    (void)state;
    idem *h = open_timeout(500);
    sql("ALTER SYSTEM SET synchronous_standby_names = 'idem_test_missing_standby'");
    sql("SELECT pg_reload_conf()");
    struct begin_call b = {.h = h};
    pthread_t t;
    pthread_create(&t, NULL, begin_main, &b);
    struct timespec ts = {2, 0}; /* four timeouts */
    nanosleep(&ts, NULL);
    int early = atomic_load(&b.over);
    long committed = rows(); /* committed locally: seen by others already */
    sql("ALTER SYSTEM RESET synchronous_standby_names");
    sql("SELECT pg_reload_conf()");
    pthread_join(t, NULL);
    if (early)
        fail_msg("answered while the commit waited for its standby: %s (%s)", idem_errname(b.rc),
                 b.detail);
    assert_int_equal(committed, 1);
    assert_idem_ok(b.rc);
    assert_int_equal(b.o, IDEM_NEW);
    assert_int_equal(rows(), 1);
    idem_close(h);
}

static int teardown_sync(void **state)
{
    sql("ALTER SYSTEM RESET synchronous_standby_names");
    sql("SELECT pg_reload_conf()");
    return teardown(state);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s POSTGRES_URL\n", argv[0]);
        return 2;
    }
    postgres_url = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_serialization_failure_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadlock_retried, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retries_run_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_race_under_retries, setup, teardown),
        cmocka_unit_test_setup_teardown(test_own_refusal_fails_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idle_connections_ended, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_in_doubt_rolled_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_commit_in_doubt_committed, setup, teardown_sync),
    };
    return cmocka_run_group_tests_name("pg_faults", tests, NULL, NULL);
}
