/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox_tx.c — the inbox with attempts in the caller's own database
 * (idem_inbox_attempt_*, _settle_*, _purge_*), on a real SQLite file and on
 * a real PostgreSQL server, each through the caller's own connections:
 *
 *   inbox_tx sqlite                a fresh SQLite file per test in a temp dir
 *   inbox_tx postgres POSTGRES_URL a server of the tests' own (wiped before
 *                                  each test: scripts/services.sh starts it)
 *
 * Written once against a small backend table, so both databases are held
 * to the same promises: attempts outlive the business's rollbacks and end
 * in DEAD, a committed settle makes every redelivery a DUPLICATE, and of
 * many consumers given the same messages at once each message's business
 * commits exactly once.
 */
#include <libpq-fe.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testlib.h"

/* One database's connections, as the consumer holds them. */
struct backend {
    const char *name;
    const char *begin; /* the business transaction's BEGIN */
    void *(*connect)(void);
    void (*disconnect)(void *c);
    /* 0, or -1 with the error in err (err_len bytes). */
    int (*exec)(void *c, const char *sql, char *err, size_t err_len);
    long (*count)(void *c, const char *sql);
    idem_rc (*attempt)(void *c, const char *group, const char *msg_id, unsigned max_attempts,
                       idem_outcome *out, idem_inbox_entry *e);
    idem_rc (*settle)(void *c, const char *group, const char *msg_id, idem_outcome *out,
                      idem_inbox_entry *e);
    idem_rc (*purge)(void *c, int64_t retention_ms, unsigned limit, unsigned *purged);
};

static const struct backend *db;
static char *tmpdir;
static const char *postgres_url;
static char sqlite_path[4200];
static int file_seq;

/* ---- SQLite: a file, WAL, a busy timeout on every connection ---- */

static int sq_exec(void *c, const char *sql, char *err, size_t err_len)
{
    char *msg = NULL;
    if (sqlite3_exec(c, sql, NULL, NULL, &msg) == SQLITE_OK)
        return 0;
    snprintf(err, err_len, "%s: %s", sql, msg ? msg : "?");
    sqlite3_free(msg);
    return -1;
}

static void *sq_connect(void)
{
    sqlite3 *c = NULL;
    char err[256];
    if (sqlite3_open(sqlite_path, &c) != SQLITE_OK)
        fail_msg("opening %s: %s", sqlite_path, sqlite3_errmsg(c));
    sqlite3_busy_timeout(c, 30000);
    if (sq_exec(c, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL", err, sizeof err))
        fail_msg("%s", err);
    return c;
}

static void sq_disconnect(void *c) { sqlite3_close(c); }

static long sq_count(void *c, const char *sql)
{
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(c, sql, -1, &s, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(c));
    long n = sqlite3_step(s) == SQLITE_ROW ? (long)sqlite3_column_int64(s, 0) : -1;
    sqlite3_finalize(s);
    return n;
}

static idem_rc sq_attempt(void *c, const char *group, const char *msg_id, unsigned max,
                          idem_outcome *out, idem_inbox_entry *e)
{
    return idem_inbox_attempt_sqlite(c, group, msg_id, "refund", max, out, e);
}

static idem_rc sq_settle(void *c, const char *group, const char *msg_id, idem_outcome *out,
                         idem_inbox_entry *e)
{
    return idem_inbox_settle_sqlite(c, group, msg_id, "refund", out, e);
}

static idem_rc sq_purge(void *c, int64_t retention_ms, unsigned limit, unsigned *purged)
{
    return idem_inbox_purge_sqlite(c, retention_ms, limit, purged);
}

static const struct backend sqlite_backend = {
    "sqlite", "BEGIN IMMEDIATE", sq_connect, sq_disconnect, sq_exec, sq_count,
    sq_attempt, sq_settle, sq_purge,
};

/* ---- PostgreSQL ---- */

static int pg_exec(void *c, const char *sql, char *err, size_t err_len)
{
    PGresult *r = PQexec(c, sql);
    ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return 0;
    snprintf(err, err_len, "%s: %s", sql, PQerrorMessage(c));
    return -1;
}

static void *pg_connect(void)
{
    PGconn *c = PQconnectdb(postgres_url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("connecting to %s: %s", postgres_url, PQerrorMessage(c));
    return c;
}

static void pg_disconnect(void *c) { PQfinish(c); }

static long pg_count(void *c, const char *sql) { return test_pg_count(c, sql); }

static idem_rc pg_attempt(void *c, const char *group, const char *msg_id, unsigned max,
                          idem_outcome *out, idem_inbox_entry *e)
{
    return idem_inbox_attempt_pg(c, group, msg_id, "refund", max, out, e);
}

static idem_rc pg_settle(void *c, const char *group, const char *msg_id, idem_outcome *out,
                         idem_inbox_entry *e)
{
    return idem_inbox_settle_pg(c, group, msg_id, "refund", out, e);
}

static idem_rc pg_purge(void *c, int64_t retention_ms, unsigned limit, unsigned *purged)
{
    return idem_inbox_purge_pg(c, retention_ms, limit, purged);
}

static const struct backend pg_backend = {
    "postgres", "BEGIN", pg_connect, pg_disconnect, pg_exec, pg_count,
    pg_attempt, pg_settle, pg_purge,
};

/* ---- the consumer's side ---- */

static void sql_ok(void *c, const char *sql)
{
    char err[512];
    if (db->exec(c, sql, err, sizeof err))
        fail_msg("%s", err);
}

static int is_postgres(void) { return db == &pg_backend; }

/* Every connection a test opens, so that one a failed assertion left
 * behind (its transaction open, holding rows) is closed by the teardown
 * instead of blocking the next test's wipe. */
#define CONNS_MAX 64
static void *conns[CONNS_MAX];
static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;

static void *conn_open(void)
{
    void *c = db->connect();
    pthread_mutex_lock(&conns_lock);
    for (int i = 0; i < CONNS_MAX; i++)
        if (!conns[i]) {
            conns[i] = c;
            break;
        }
    pthread_mutex_unlock(&conns_lock);
    return c;
}

static void conn_close(void *c)
{
    pthread_mutex_lock(&conns_lock);
    for (int i = 0; i < CONNS_MAX; i++)
        if (conns[i] == c)
            conns[i] = NULL;
    pthread_mutex_unlock(&conns_lock);
    db->disconnect(c);
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < CONNS_MAX; i++)
        if (conns[i])
            conn_close(conns[i]);
    return 0;
}

static int setup(void **state)
{
    (void)state;
    if (is_postgres())
        test_wipe_servers(NULL, postgres_url);
    else
        snprintf(sqlite_path, sizeof sqlite_path, "%s/inbox%d.db", tmpdir, ++file_seq);
    void *c = conn_open();
    /* No unique key: a message whose business ran twice shows twice. */
    sql_ok(c, "CREATE TABLE refund (msg TEXT NOT NULL, consumer INTEGER NOT NULL)");
    conn_close(c);
    return 0;
}

/* One delivery of msg_id: attempt, then settle and the business write in one
 * transaction that commits unless `fail` (the business failed: ROLLBACK).
 * Returns the attempt's outcome, or the settle's when the attempt said
 * PROCESS; *committed: the business committed. */
static idem_outcome deliver(void *c, const char *msg_id, unsigned max, int fail, int *committed)
{
    idem_outcome o;
    idem_inbox_entry e;
    char sql[512];
    *committed = 0;
    assert_idem_ok(db->attempt(c, "billing", msg_id, max, &o, &e));
    if (o != IDEM_PROCESS)
        return o;
    sql_ok(c, db->begin);
    assert_idem_ok(db->settle(c, "billing", msg_id, &o, NULL));
    if (o == IDEM_CLAIMED) {
        snprintf(sql, sizeof sql, "INSERT INTO refund VALUES ('%s', 0)", msg_id);
        sql_ok(c, sql);
    }
    sql_ok(c, fail || o != IDEM_CLAIMED ? "ROLLBACK" : "COMMIT");
    *committed = !fail && o == IDEM_CLAIMED;
    return o;
}

/* A poison message: its business fails every time. Each delivery counts
 * an attempt that the rollback leaves standing; after max_attempts the
 * next delivery is DEAD, and so is every one after it. */
static void test_poison_goes_dead(void **state)
{
    (void)state;
    void *c = conn_open();
    int committed;
    idem_inbox_entry e;
    idem_outcome o;
    for (unsigned a = 1; a <= 3; a++) {
        assert_idem_ok(db->attempt(c, "billing", "poison", 3, &o, &e));
        assert_outcome(o, IDEM_PROCESS);
        assert_int_equal(e.attempts, a);
        assert_string_equal(e.state, "RECEIVED");
        assert_string_equal(e.biz_type, "refund");
        sql_ok(c, db->begin);
        assert_idem_ok(db->settle(c, "billing", "poison", &o, &e));
        assert_outcome(o, IDEM_CLAIMED);
        assert_string_equal(e.state, "DONE");
        sql_ok(c, "INSERT INTO refund VALUES ('poison', 0)");
        sql_ok(c, "ROLLBACK");
    }
    for (int i = 0; i < 3; i++) {
        assert_idem_ok(db->attempt(c, "billing", "poison", 3, &o, &e));
        assert_outcome(o, IDEM_DEAD);
        assert_string_equal(e.state, "DEAD");
        assert_int_equal(e.attempts, 3);
    }
    /* A delivery already past its attempt when the message went DEAD. */
    sql_ok(c, db->begin);
    assert_idem_ok(db->settle(c, "billing", "poison", &o, NULL));
    assert_outcome(o, IDEM_DEAD);
    sql_ok(c, "ROLLBACK");
    assert_int_equal(db->count(c, "SELECT count(*) FROM refund"), 0);
    assert_int_equal(db->count(c, "SELECT attempts FROM idem_inbox_msg WHERE msg_id = 'poison'"),
                     3);

    /* A message that fails twice, then succeeds on its third attempt. */
    assert_outcome(deliver(c, "flaky", 3, 1, &committed), IDEM_CLAIMED);
    assert_outcome(deliver(c, "flaky", 3, 1, &committed), IDEM_CLAIMED);
    assert_outcome(deliver(c, "flaky", 3, 0, &committed), IDEM_CLAIMED);
    assert_true(committed);
    assert_outcome(deliver(c, "flaky", 3, 0, &committed), IDEM_DUPLICATE);
    /* max_attempts 1: the first failure is final. */
    assert_outcome(deliver(c, "once", 1, 1, &committed), IDEM_CLAIMED);
    assert_outcome(deliver(c, "once", 1, 0, &committed), IDEM_DEAD);
    assert_int_equal(db->count(c, "SELECT count(*) FROM refund"), 1);
    conn_close(c);
}

/* Once the settle commits, every redelivery is a DUPLICATE, on any
 * connection; another group consumes the same message on its own. */
static void test_committed_settle_is_duplicate(void **state)
{
    (void)state;
    void *c = conn_open(), *c2 = conn_open();
    int committed;
    idem_outcome o;
    idem_inbox_entry e;
    assert_outcome(deliver(c, "m-1", 5, 0, &committed), IDEM_CLAIMED);
    assert_true(committed);
    for (int i = 0; i < 4; i++) {
        assert_idem_ok(db->attempt(i % 2 ? c2 : c, "billing", "m-1", 5, &o, &e));
        assert_outcome(o, IDEM_DUPLICATE);
        assert_string_equal(e.state, "DONE");
        assert_int_equal(e.attempts, 1);
    }
    /* A consumer that skipped the attempt still cannot settle it twice. */
    sql_ok(c2, db->begin);
    assert_idem_ok(db->settle(c2, "billing", "m-1", &o, NULL));
    assert_outcome(o, IDEM_DUPLICATE);
    sql_ok(c2, "ROLLBACK");
    /* Settled without an attempt first: its own first attempt. */
    sql_ok(c2, db->begin);
    assert_idem_ok(db->settle(c2, "billing", "m-2", &o, &e));
    assert_outcome(o, IDEM_CLAIMED);
    assert_int_equal(e.attempts, 1);
    sql_ok(c2, "COMMIT");
    assert_idem_ok(db->attempt(c, "billing", "m-2", 5, &o, NULL));
    assert_outcome(o, IDEM_DUPLICATE);
    assert_idem_ok(db->attempt(c, "audit", "m-1", 5, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    assert_int_equal(db->count(c, "SELECT count(*) FROM refund"), 1);
    conn_close(c2);
    conn_close(c);
}

/* A consumer that dies between the calls: its attempt stays counted, the
 * business it had not committed is gone, and the redelivery is the next
 * attempt. */
static void test_crash_between_calls(void **state)
{
    (void)state;
    idem_outcome o;
    idem_inbox_entry e;
    int committed;
    void *c = conn_open();
    assert_idem_ok(db->attempt(c, "billing", "m-1", 3, &o, &e));
    assert_outcome(o, IDEM_PROCESS);
    conn_close(c); /* died before BEGIN */
    c = conn_open();
    assert_idem_ok(db->attempt(c, "billing", "m-1", 3, &o, &e));
    assert_int_equal(e.attempts, 2);
    sql_ok(c, db->begin);
    assert_idem_ok(db->settle(c, "billing", "m-1", &o, NULL));
    assert_outcome(o, IDEM_CLAIMED);
    sql_ok(c, "INSERT INTO refund VALUES ('m-1', 0)");
    conn_close(c); /* died before COMMIT: the database rolls it back */
    c = conn_open();
    assert_int_equal(db->count(c, "SELECT count(*) FROM refund"), 0);
    assert_outcome(deliver(c, "m-1", 3, 0, &committed), IDEM_CLAIMED);
    assert_true(committed);
    assert_int_equal(db->count(c, "SELECT attempts FROM idem_inbox_msg WHERE msg_id = 'm-1'"),
                     3);
    /* Died after COMMIT, before the ack: the redelivery is a DUPLICATE. */
    assert_idem_ok(db->attempt(c, "billing", "m-1", 3, &o, NULL));
    assert_outcome(o, IDEM_DUPLICATE);
    conn_close(c);
}

/* The calls refuse a connection in the wrong state, and bad arguments. */
static void test_bad_calls(void **state)
{
    (void)state;
    idem_outcome o;
    unsigned purged = 7;
    void *c = conn_open();
    assert_int_equal(db->settle(c, "billing", "m-1", &o, NULL), IDEM_ENOTX);
    assert_true(strstr(idem_errdetail(), "BEGIN") != NULL);
    sql_ok(c, db->begin);
    assert_int_equal(db->attempt(c, "billing", "m-1", 3, &o, NULL), IDEM_EINVAL);
    assert_true(strstr(idem_errdetail(), "before BEGIN") != NULL);
    sql_ok(c, "ROLLBACK");
    assert_int_equal(db->attempt(c, "billing", "m-1", 0, &o, NULL), IDEM_EINVAL);
    assert_int_equal(db->attempt(c, "billing", "m-1", 1001, &o, NULL), IDEM_EINVAL);
    assert_int_equal(db->attempt(c, "bad group", "m-1", 3, &o, NULL), IDEM_EINVAL);
    assert_int_equal(db->attempt(c, "billing", "", 3, &o, NULL), IDEM_EINVAL);
    assert_int_equal(db->attempt(c, "billing", "m-1", 3, NULL, NULL), IDEM_EINVAL);
    assert_int_equal(db->purge(c, 0, 10, &purged), IDEM_EINVAL);
    assert_int_equal(purged, 0);
    assert_int_equal(db->purge(c, 1000, 10, NULL), IDEM_EINVAL);
    /* No table yet: nothing to purge. */
    assert_idem_ok(db->purge(c, 1000, 10, &purged));
    assert_int_equal(purged, 0);
    assert_int_equal(idem_inbox_attempt_sqlite(NULL, "billing", "m", NULL, 3, &o, NULL),
                     IDEM_EINVAL);
    assert_int_equal(idem_inbox_settle_pg(NULL, "billing", "m", NULL, &o, NULL), IDEM_EINVAL);
    assert_int_equal(idem_inbox_purge_pg(NULL, 1000, 1, &purged), IDEM_EINVAL);
    if (is_postgres()) {
        /* A fresh database: the settle cannot create the table inside the
         * caller's transaction and says what does. */
        PGconn *fresh = conn_open();
        sql_ok(fresh, "BEGIN");
        assert_int_equal(idem_inbox_settle_pg(fresh, "billing", "m-1", NULL, &o, NULL),
                         IDEM_ESTORE);
        assert_true(strstr(idem_errdetail(), "idem_inbox_attempt_pg") != NULL);
        sql_ok(fresh, "ROLLBACK");
        conn_close(fresh);
    }
    conn_close(c);
}

/* ---- many consumers, the same messages ---- */

#define STORM_THREADS 8
#define STORM_MSGS 200

struct storm {
    atomic_int claimed, duplicates, errors;
    char error[512];
    pthread_mutex_t lock;
};

/* The first failure of any consumer: step ("attempt"), message, detail. */
static void storm_error(struct storm *s, const char *step, const char *msg, const char *detail)
{
    pthread_mutex_lock(&s->lock);
    if (!s->errors)
        snprintf(s->error, sizeof s->error, "%s %s: %s", step, msg, detail);
    s->errors++;
    pthread_mutex_unlock(&s->lock);
}

/* One consumer, on a connection of its own, given every message in the
 * same order as the others, so that they meet on each one. */
static void storm_consumer(void *arg, int t)
{
    struct storm *s = arg;
    void *c = conn_open();
    char msg[32], sql[128], err[512] = "";
    for (int k = 0; k < STORM_MSGS && !atomic_load(&s->errors); k++) {
        snprintf(msg, sizeof msg, "storm-%d", k);
        idem_outcome o;
        if (db->attempt(c, "billing", msg, 50, &o, NULL) != IDEM_OK) {
            storm_error(s, "attempt", msg, idem_errdetail());
            break;
        }
        if (o == IDEM_DUPLICATE) {
            atomic_fetch_add(&s->duplicates, 1);
            continue;
        }
        if (o != IDEM_PROCESS) {
            storm_error(s, "attempt", msg, idem_outcome_name(o));
            break;
        }
        if (db->exec(c, db->begin, err, sizeof err) ||
            db->settle(c, "billing", msg, &o, NULL) != IDEM_OK) {
            storm_error(s, "settle", msg, *err ? err : idem_errdetail());
            break;
        }
        snprintf(sql, sizeof sql, "INSERT INTO refund VALUES ('%s', %d)", msg, t);
        if ((o == IDEM_CLAIMED && db->exec(c, sql, err, sizeof err)) ||
            db->exec(c, o == IDEM_CLAIMED ? "COMMIT" : "ROLLBACK", err, sizeof err)) {
            storm_error(s, "business", msg, err);
            break;
        }
        atomic_fetch_add(o == IDEM_CLAIMED ? &s->claimed : &s->duplicates, 1);
    }
    conn_close(c);
}

static void test_concurrent_consumers(void **state)
{
    (void)state;
    static struct storm s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.lock, NULL);
    void *c = conn_open();
    idem_outcome o;
    /* The table exists before the race (its creation is tested apart). */
    assert_idem_ok(db->attempt(c, "warm-up", "m", 1, &o, NULL));
    test_run_threads(STORM_THREADS, storm_consumer, &s);
    if (s.errors)
        fail_msg("%d consumers failed; the first: %s", s.errors, s.error);
    assert_int_equal(atomic_load(&s.claimed), STORM_MSGS);
    assert_int_equal(atomic_load(&s.claimed) + atomic_load(&s.duplicates),
                     STORM_THREADS * STORM_MSGS);
    assert_int_equal(db->count(c, "SELECT count(*) FROM refund"), STORM_MSGS);
    assert_int_equal(db->count(c, "SELECT count(DISTINCT msg) FROM refund"), STORM_MSGS);
    assert_int_equal(db->count(c, "SELECT count(*) FROM idem_inbox_msg"
                                  " WHERE grp = 'billing' AND state = 'DONE'"),
                     STORM_MSGS);
    conn_close(c);
    pthread_mutex_destroy(&s.lock);
}

/* The first attempts on a database race to create its table. */
static void first_attempt(void *arg, int t)
{
    struct storm *s = arg;
    void *c = conn_open();
    char msg[32];
    snprintf(msg, sizeof msg, "first-%d", t);
    idem_outcome o;
    if (db->attempt(c, "billing", msg, 3, &o, NULL) != IDEM_OK)
        storm_error(s, "attempt", msg, idem_errdetail());
    conn_close(c);
}

static void test_first_attempts_create_the_table(void **state)
{
    (void)state;
    static struct storm s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.lock, NULL);
    test_run_threads(STORM_THREADS, first_attempt, &s);
    if (s.errors)
        fail_msg("%d attempts failed; the first: %s", s.errors, s.error);
    void *c = conn_open();
    assert_int_equal(db->count(c, "SELECT count(*) FROM idem_inbox_msg"), STORM_THREADS);
    conn_close(c);
    pthread_mutex_destroy(&s.lock);
}

/* ---- purge ---- */

static void test_purge_past_retention(void **state)
{
    (void)state;
    void *c = conn_open();
    int committed;
    char msg[32];
    for (int i = 0; i < 10; i++) {
        snprintf(msg, sizeof msg, "m-%d", i);
        /* DONE, RECEIVED (failed once) and DEAD entries, old and new. */
        deliver(c, msg, 1, i % 3 != 0, &committed);
        if (i % 3 == 2)
            deliver(c, msg, 1, 0, &committed);
    }
    assert_int_equal(db->count(c, "SELECT count(*) FROM idem_inbox_msg WHERE state = 'DEAD'"), 3);
    /* Six of them last changed two hours ago. */
    sql_ok(c, "UPDATE idem_inbox_msg SET updated_ms = updated_ms - 7200000"
              " WHERE msg_id IN ('m-0', 'm-1', 'm-2', 'm-3', 'm-4', 'm-5')");
    unsigned purged = 0;
    assert_idem_ok(db->purge(c, 3600000, 0, &purged));
    assert_int_equal(purged, 0);
    if (is_postgres()) {
        /* A row held by an open transaction is left for the next purge. */
        void *holder = conn_open();
        sql_ok(holder, "BEGIN");
        sql_ok(holder, "SELECT 1 FROM idem_inbox_msg WHERE msg_id = 'm-0' FOR UPDATE");
        assert_idem_ok(db->purge(c, 3600000, 100, &purged));
        assert_int_equal(purged, 5);
        sql_ok(holder, "COMMIT");
        conn_close(holder);
        assert_idem_ok(db->purge(c, 3600000, 100, &purged));
        assert_int_equal(purged, 1);
    } else {
        assert_idem_ok(db->purge(c, 3600000, 4, &purged));
        assert_int_equal(purged, 4);
        assert_idem_ok(db->purge(c, 3600000, 4, &purged));
        assert_int_equal(purged, 2);
    }
    assert_idem_ok(db->purge(c, 3600000, 100, &purged));
    assert_int_equal(purged, 0);
    assert_int_equal(db->count(c, "SELECT count(*) FROM idem_inbox_msg"), 4);
    assert_int_equal(db->count(c, "SELECT count(*) FROM idem_inbox_msg WHERE msg_id IN"
                                  " ('m-6', 'm-7', 'm-8', 'm-9')"),
                     4);
    /* A purged DONE message delivered again is processed again: retention
     * must outlast the queue's redeliveries. */
    idem_outcome o;
    assert_idem_ok(db->attempt(c, "billing", "m-0", 1, &o, NULL));
    assert_outcome(o, IDEM_PROCESS);
    conn_close(c);
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s sqlite | postgres POSTGRES_URL\n", argv0);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "sqlite"))
        db = &sqlite_backend;
    else if (argc == 3 && !strcmp(argv[1], "postgres"))
        db = &pg_backend, postgres_url = argv[2];
    else
        return usage(argv[0]);
    tmpdir = test_mkdtemp();
    const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
        T(test_poison_goes_dead),
        T(test_committed_settle_is_duplicate),
        T(test_crash_between_calls),
        T(test_bad_calls),
        T(test_first_attempts_create_the_table),
        T(test_concurrent_consumers),
        T(test_purge_past_retention),
#undef T
    };
    char name[64];
    snprintf(name, sizeof name, "inbox_tx.%s", db->name);
    int failed = cmocka_run_group_tests_name(name, tests, NULL, NULL);
    test_rmdir(tmpdir);
    return failed ? 1 : 0;
}
