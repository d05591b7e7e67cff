/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_group_commit.c — the group-commit writer (lib/store/group_commit.c)
 * over a real SQLite file, driven the way lib/store/sqlite.c drives it.
 *
 * What is tested here is the batch as a unit: when SQLite itself rolls back
 * the batch's transaction in the middle (SQLITE_FULL and SQLITE_IOERR do
 * that; a small max_page_count makes SQLITE_FULL happen on demand), every
 * job of the batch must be told it failed — the jobs that ran before the
 * error lost their writes too — and no job may run on outside a transaction,
 * where its write would be committed on its own. And the batch's bounds: jobs
 * queued while its jobs run join it, up to commit_batch_max; jobs queued
 * while it commits wait for the next one.
 */
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "store/group_commit.h"
#include "testlib.h"

static idem_rc exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK)
        return IDEM_OK;
    idem_rc rc = idem__fail(IDEM_ESTORE, "%s", err ? err : "error");
    sqlite3_free(err);
    return rc;
}

/* When commit_hold is set, the writer's next COMMIT posts commit_entered
 * and waits on commit_hold first: the batch is closed, and what is queued
 * meanwhile goes to the next one. */
static sem_t *commit_hold;
/* Set up once, in main, never destroyed while the writer may still be in
 * its sem_post: the writer posts commit_entered when held in a COMMIT, and
 * job_entered when a job held on its gate starts. */
static sem_t commit_entered, job_entered;
static int fail_next_commit; /* the next COMMIT fails without committing */
static int commits_done; /* COMMITs returned: a job run reads its batch's number */

static idem_rc drv_begin(void *ctx) { return exec(ctx, "BEGIN"); }
static idem_rc drv_commit(void *ctx)
{
    sem_t *hold = commit_hold;
    if (hold) {
        commit_hold = NULL;
        sem_post(&commit_entered);
        while (sem_wait(hold) != 0)
            ;
    }
    if (fail_next_commit) {
        fail_next_commit = 0;
        return idem__fail(IDEM_ESTORE, "the test failed this COMMIT");
    }
    idem_rc rc = exec(ctx, "COMMIT");
    commits_done++;
    return rc;
}
static idem_rc drv_savepoint(void *ctx) { return exec(ctx, "SAVEPOINT job"); }
static idem_rc drv_release(void *ctx) { return exec(ctx, "RELEASE job"); }
static void drv_rollback(void *ctx)
{
    if (!sqlite3_get_autocommit(ctx))
        exec(ctx, "ROLLBACK");
}
static void drv_rollback_to(void *ctx)
{
    exec(ctx, "ROLLBACK TO job");
    exec(ctx, "RELEASE job");
}
static int drv_in_transaction(void *ctx) { return !sqlite3_get_autocommit(ctx); }

/* Batches answered so far (each job's on_done counts itself first), and
 * what after_batch saw when after_batch_ran is set: the answers counted,
 * and whether a transaction was open. */
static atomic_int dones;
static sem_t *after_batch_ran;
static int dones_at_after_batch, in_transaction_at_after_batch;

static void drv_after_batch(void *ctx)
{
    if (!after_batch_ran)
        return;
    dones_at_after_batch = atomic_load(&dones);
    in_transaction_at_after_batch = drv_in_transaction(ctx);
    sem_post(after_batch_ran);
}

static const struct idem__gc_driver driver = {
    .begin = drv_begin,
    .commit = drv_commit,
    .rollback = drv_rollback,
    .savepoint = drv_savepoint,
    .release = drv_release,
    .rollback_to = drv_rollback_to,
    .in_transaction = drv_in_transaction,
    .after_batch = drv_after_batch,
};

struct insert_job {
    struct idem__gc_job job;
    int id;
    int bytes;        /* the row's size: a big one fills the file */
    sem_t *entered;   /* when set, posted as the job starts */
    sem_t *gate;      /* when set, wait on it first (to hold the writer) */
    int batch;        /* the number of the batch it ran in */
    sem_t finished;
};

static idem_rc run_insert(struct idem__gc_job *job, void *ctx)
{
    struct insert_job *j = (struct insert_job *)job;
    if (j->entered)
        sem_post(j->entered);
    if (j->gate)
        while (sem_wait(j->gate) != 0)
            ;
    j->batch = commits_done;
    char sql[128];
    snprintf(sql, sizeof sql, "INSERT INTO t VALUES (%d, zeroblob(%d))", j->id, j->bytes);
    return exec(ctx, sql);
}

static void on_done(struct idem__gc_job *job)
{
    atomic_fetch_add(&dones, 1);
    sem_post(&((struct insert_job *)job)->finished);
}

static int count_rows(const char *path, const char *where)
{
    sqlite3 *db;
    sqlite3_stmt *s;
    char sql[128];
    int n = -1;
    snprintf(sql, sizeof sql, "SELECT count(*) FROM t WHERE %s", where);
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
    if (sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

/* A new SQLite file in WAL mode at path (a mkstemp template), with schema. */
static sqlite3 *open_db(char *path, const char *schema)
{
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    assert_int_equal(exec(db, "PRAGMA journal_mode=WAL"), IDEM_OK);
    assert_int_equal(exec(db, schema), IDEM_OK);
    return db;
}

static void wait_sem(sem_t *s)
{
    while (sem_wait(s) != 0)
        ;
}

/* Queues job and returns once its batch is closed and the writer waits to
 * COMMIT it, until hold is posted. */
static void hold_in_commit(struct idem__gc *gc, struct idem__gc_job *job, sem_t *hold)
{
    commit_hold = hold;
    assert_int_equal(idem__gc_queue(gc, job), IDEM_OK);
    wait_sem(&commit_entered);
}

/* Queue jobs[0], held running until gate is posted, and once it runs,
 * jobs[1..n-1]: queued while a job of the batch runs. */
static void queue_while_first_runs(struct idem__gc *gc, struct insert_job *jobs, int n,
                                   sem_t *gate)
{
    jobs[0].gate = gate;
    jobs[0].entered = &job_entered;
    assert_int_equal(idem__gc_queue(gc, &jobs[0].job), IDEM_OK);
    wait_sem(&job_entered);
    for (int i = 1; i < n; i++)
        assert_int_equal(idem__gc_queue(gc, &jobs[i].job), IDEM_OK);
}

static void remove_db(const char *path)
{
    char side[64];
    snprintf(side, sizeof side, "%s-wal", path);
    unlink(side);
    snprintf(side, sizeof side, "%s-shm", path);
    unlink(side);
    unlink(path);
}

/* jobs[i]: insert row i of 100 bytes, and post finished when done. */
static void init_insert_jobs(struct insert_job *jobs, int n)
{
    memset(jobs, 0, sizeof *jobs * (size_t)n);
    for (int i = 0; i < n; i++) {
        jobs[i].job.run = run_insert;
        jobs[i].job.on_done = on_done;
        jobs[i].id = i;
        jobs[i].bytes = 100;
        jobs[i].batch = -1;
        sem_init(&jobs[i].finished, 0, 0);
    }
}

/* Jobs 1..4 in one batch; job 3 fills the file. */
static void test_batch_rolled_back_by_sqlite(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-gc-XXXXXX";
    sqlite3 *db = open_db(path, "CREATE TABLE t (id INTEGER, v BLOB); PRAGMA max_page_count=40");
    struct idem__gc *gc;
    assert_int_equal(idem__gc_start(&driver, db, 64, &gc), IDEM_OK);

    sem_t gate;
    sem_init(&gate, 0, 0);
    struct insert_job jobs[5];
    init_insert_jobs(jobs, 5);
    jobs[3].bytes = 400000;
    /* Job 0 holds the writer in the COMMIT of a batch of its own while 1..4
     * queue up. */
    hold_in_commit(gc, &jobs[0].job, &gate);
    for (int i = 1; i < 5; i++)
        assert_int_equal(idem__gc_queue(gc, &jobs[i].job), IDEM_OK);
    sem_post(&gate);
    for (int i = 0; i < 5; i++)
        wait_sem(&jobs[i].finished);

    /* Job 4 must not have run after the rollback, outside any transaction
     * (it would have been committed alone, and reported failed). */
    assert_int_equal(count_rows(path, "id = 0"), 1);
    assert_int_equal(count_rows(path, "id > 0"), 0);
    assert_int_equal(jobs[0].job.rc, IDEM_OK);
    for (int i = 1; i < 5; i++) {
        /* Job 1 and 2 ran, and lost their rows with the transaction; 4 never
         * ran: each is told so. */
        assert_int_equal(jobs[i].job.rc, IDEM_ESTORE);
        assert_non_null(strstr(jobs[i].job.detail, "rolled back the whole batch"));
    }
    assert_non_null(strstr(jobs[3].job.detail, "full"));

    /* The writer goes on: a later batch commits. */
    struct insert_job after = {.job = {.run = run_insert, .on_done = on_done}, .id = 9,
                               .bytes = 100};
    sem_init(&after.finished, 0, 0);
    assert_int_equal(idem__gc_queue(gc, &after.job), IDEM_OK);
    wait_sem(&after.finished);
    assert_int_equal(after.job.rc, IDEM_OK);
    assert_int_equal(count_rows(path, "id = 9"), 1);

    idem__gc_stop(gc);
    sqlite3_close(db);
    for (int i = 0; i < 5; i++)
        sem_destroy(&jobs[i].finished);
    sem_destroy(&after.finished);
    sem_destroy(&gate);
    remove_db(path);
}

struct sql_job {
    struct idem__gc_job job;
    const char *sql;
    sem_t finished;
};

static idem_rc run_sql(struct idem__gc_job *job, void *ctx)
{
    return exec(ctx, ((struct sql_job *)job)->sql);
}

static void sql_done(struct idem__gc_job *job)
{
    sem_post(&((struct sql_job *)job)->finished);
}

/* A single_write job runs without a savepoint of its own: a statement that
 * fails halfway (here after two of its three rows) must still leave none of
 * its rows, while the jobs around it in the batch keep theirs. */
static void test_single_write_fails_alone(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-gc-XXXXXX";
    sqlite3 *db = open_db(path, "CREATE TABLE t (id INTEGER NOT NULL, v BLOB)");
    struct idem__gc *gc;
    assert_int_equal(idem__gc_start(&driver, db, 64, &gc), IDEM_OK);

    sem_t gate;
    sem_init(&gate, 0, 0);
    struct insert_job hold = {.job = {.run = run_insert, .on_done = on_done}, .id = 100,
                              .bytes = 10};
    sem_init(&hold.finished, 0, 0);
    struct sql_job jobs[3] = {
        {.job = {.run = run_sql, .on_done = sql_done}, .sql = "INSERT INTO t VALUES (1, NULL)"},
        {.job = {.run = run_sql, .on_done = sql_done, .single_write = 1},
         .sql = "INSERT INTO t VALUES (2, NULL), (3, NULL), (NULL, NULL)"},
        {.job = {.run = run_sql, .on_done = sql_done, .single_write = 1},
         .sql = "INSERT INTO t VALUES (4, NULL)"},
    };
    /* The writer holds job 100's batch while the three queue into one. */
    hold_in_commit(gc, &hold.job, &gate);
    for (int i = 0; i < 3; i++) {
        sem_init(&jobs[i].finished, 0, 0);
        assert_int_equal(idem__gc_queue(gc, &jobs[i].job), IDEM_OK);
    }
    sem_post(&gate);
    wait_sem(&hold.finished);
    for (int i = 0; i < 3; i++)
        wait_sem(&jobs[i].finished);
    assert_int_equal(jobs[0].job.rc, IDEM_OK);
    assert_int_equal(jobs[1].job.rc, IDEM_ESTORE);
    assert_non_null(strstr(jobs[1].job.detail, "NOT NULL"));
    assert_int_equal(jobs[2].job.rc, IDEM_OK);
    assert_int_equal(count_rows(path, "id IN (1, 4, 100)"), 3);
    assert_int_equal(count_rows(path, "id IN (2, 3)"), 0);

    idem__gc_stop(gc);
    sqlite3_close(db);
    for (int i = 0; i < 3; i++)
        sem_destroy(&jobs[i].finished);
    sem_destroy(&hold.finished);
    sem_destroy(&gate);
    remove_db(path);
}

/* Jobs queued while a batch's job runs join that batch, up to batch_max,
 * and share its COMMIT; a job queued while the batch commits goes to the
 * next one. With batch_max 3: job 0 is held running while 1, 2 and 3 queue;
 * 0, 1 and 2 make a batch, and 3 is left for the next; 4, queued while the
 * first batch commits, joins 3. */
static void test_late_joiners(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-gc-XXXXXX";
    sqlite3 *db = open_db(path, "CREATE TABLE t (id INTEGER, v BLOB)");
    struct idem__gc *gc;
    assert_int_equal(idem__gc_start(&driver, db, 3, &gc), IDEM_OK);
    commits_done = 0;

    sem_t gate, commit_gate;
    sem_init(&gate, 0, 0);
    sem_init(&commit_gate, 0, 0);
    struct insert_job jobs[5];
    init_insert_jobs(jobs, 5);
    queue_while_first_runs(gc, jobs, 4, &gate);
    commit_hold = &commit_gate;
    sem_post(&gate);
    wait_sem(&commit_entered); /* the first batch is closed */
    assert_int_equal(idem__gc_queue(gc, &jobs[4].job), IDEM_OK);
    usleep(30 * 1000); /* the first COMMIT takes 30 ms at least */
    sem_post(&commit_gate);
    for (int i = 0; i < 5; i++)
        wait_sem(&jobs[i].finished);

    for (int i = 0; i < 5; i++) {
        assert_int_equal(jobs[i].job.rc, IDEM_OK);
        assert_int_equal(jobs[i].batch, i < 3 ? 0 : 1);
    }
    idem_stats st = {0};
    idem_commit_times ct = {0};
    idem_commit_batches cb = {0};
    idem__gc_stats(gc, &st, &ct, &cb);
    assert_int_equal(st.commits, 2);
    assert_int_equal(st.committed_ops, 5);
    assert_int_equal(ct.commits, 2);
    /* The batches' sizes: 3, in (2, 4], and 2, in (1, 2]. */
    assert_int_equal(cb.commits, 2);
    assert_int_equal(cb.ops, 5);
    assert_int_equal(idem_commit_batch_bound(1), 2);
    assert_int_equal(idem_commit_batch_bound(2), 4);
    for (unsigned b = 0; b < IDEM_BATCH_BUCKETS; b++)
        assert_int_equal(cb.hist[b], b == 1 || b == 2 ? 1 : 0);
    /* Both commits are in the histogram, the held one past 30 ms. */
    uint64_t counted = 0, slow = 0;
    for (unsigned b = 0; b < IDEM_COMMIT_BUCKETS; b++) {
        counted += ct.hist[b];
        if (idem_commit_bucket_us(b) >= 30000) /* (25 ms, 50 ms] and up */
            slow += ct.hist[b];
    }
    assert_int_equal(counted, 2);
    assert_true(slow >= 1);
    assert_true(ct.us >= 30000);
    assert_int_equal(count_rows(path, "id BETWEEN 0 AND 4"), 5);

    idem__gc_stop(gc);
    sqlite3_close(db);
    for (int i = 0; i < 5; i++)
        sem_destroy(&jobs[i].finished);
    sem_destroy(&gate);
    sem_destroy(&commit_gate);
    remove_db(path);
}

/* Late joiners share their batch's fate: its COMMIT fails, and every job
 * of it, those that joined late too, is told so and left nothing. */
static void test_late_joiners_fail_with_their_batch(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-gc-XXXXXX";
    sqlite3 *db = open_db(path, "CREATE TABLE t (id INTEGER, v BLOB)");
    struct idem__gc *gc;
    assert_int_equal(idem__gc_start(&driver, db, 64, &gc), IDEM_OK);
    sem_t gate;
    sem_init(&gate, 0, 0);
    struct insert_job jobs[3];
    init_insert_jobs(jobs, 3);
    queue_while_first_runs(gc, jobs, 3, &gate);
    fail_next_commit = 1;
    sem_post(&gate);
    for (int i = 0; i < 3; i++) {
        wait_sem(&jobs[i].finished);
        assert_int_equal(jobs[i].job.rc, IDEM_ESTORE);
        assert_non_null(strstr(jobs[i].job.detail, "the test failed this COMMIT"));
    }
    assert_int_equal(count_rows(path, "1"), 0);
    idem_stats st = {0};
    idem_commit_times ct = {0};
    idem__gc_stats(gc, &st, &ct, NULL);
    assert_int_equal(st.commits, 0);
    assert_int_equal(ct.us, 0);

    idem__gc_stop(gc);
    sqlite3_close(db);
    for (int i = 0; i < 3; i++)
        sem_destroy(&jobs[i].finished);
    sem_destroy(&gate);
    remove_db(path);
}

/* The driver's after_batch runs once the batch's callers are answered
 * (the store checkpoints there, so that none of them waits for it), and
 * outside any transaction. */
static void test_after_batch_after_answers(void **state)
{
    (void)state;
    char path[] = "/tmp/idem-gc-XXXXXX";
    sqlite3 *db = open_db(path, "CREATE TABLE t (id INTEGER, v BLOB)");
    struct idem__gc *gc;
    assert_int_equal(idem__gc_start(&driver, db, 64, &gc), IDEM_OK);
    sem_t gate, ran;
    sem_init(&gate, 0, 0);
    sem_init(&ran, 0, 0);
    struct insert_job jobs[3];
    init_insert_jobs(jobs, 3);
    atomic_store(&dones, 0);
    after_batch_ran = &ran;
    queue_while_first_runs(gc, jobs, 3, &gate); /* one batch of three */
    sem_post(&gate);
    wait_sem(&ran);
    after_batch_ran = NULL;
    assert_int_equal(dones_at_after_batch, 3);
    assert_int_equal(in_transaction_at_after_batch, 0);
    for (int i = 0; i < 3; i++) {
        wait_sem(&jobs[i].finished);
        assert_int_equal(jobs[i].job.rc, IDEM_OK);
    }

    idem__gc_stop(gc);
    sqlite3_close(db);
    for (int i = 0; i < 3; i++)
        sem_destroy(&jobs[i].finished);
    sem_destroy(&gate);
    sem_destroy(&ran);
    remove_db(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_rolled_back_by_sqlite),
        cmocka_unit_test(test_single_write_fails_alone),
        cmocka_unit_test(test_late_joiners),
        cmocka_unit_test(test_late_joiners_fail_with_their_batch),
        cmocka_unit_test(test_after_batch_after_answers),
    };
    sem_init(&commit_entered, 0, 0);
    sem_init(&job_entered, 0, 0);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
