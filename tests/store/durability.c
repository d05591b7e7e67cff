/* SPDX-License-Identifier: Apache-2.0 */
/*
 * durability.c — no acknowledged write is lost, none is half-written, when
 * the process is killed with SIGKILL at a random moment.
 *
 * A child process runs 8 writer threads against the embedded store (file
 * mode, group commit). After each idem_record_complete() returns IDEM_OK the
 * thread reports the key to the parent through a pipe. The parent kills the
 * child after a random delay, drains the pipe (everything in it was
 * acknowledged before the kill), reopens the store, and checks:
 *   - every acknowledged record is SUCCEEDED with its exact result bytes;
 *   - every record in the file is whole: SUCCEEDED with the right result for
 *     its key, or PROCESSING with no result (begun, not finished);
 *   - SQLite's integrity check passes.
 * 25 rounds accumulate in one file, so later rounds also recover from the
 * earlier kills' WAL.
 *
 * SIGKILL alone loses no write the kernel has, synced or not; what it tests
 * is that an acknowledged write was written and that recovery finds it. A
 * power cut also loses what was never synced: with powerloss, each round
 * then drops every sector written since its file's last sync (in a third of
 * the rounds), or each such sector with probability one half or one tenth.
 * An acknowledgement given before its write was synced, or a WAL the store
 * let SQLite depend on before it was on the disk, fails the checks.
 *
 * And a store whose -wal is unlinked under it, then killed before it could
 * close: what the WAL held was acknowledged, so it must be in the database
 * file by then (the embedded store alone; not with powerloss).
 *
 *   durability                                  the embedded store
 *   durability powerloss                        the embedded store, and the
 *                                               power cut too: what was
 *                                               not synced is lost
 *                                               (powerloss.h), in part or
 *                                               whole, before the file is
 *                                               reopened
 *   durability distributed REDIS_URL POSTGRES_URL
 *                                               the same on the distributed
 *                                               store: the child is the one
 *                                               killed, PostgreSQL keeps
 *                                               running (its rows are read
 *                                               back with libpq)
 */
#include <errno.h>
#include <fcntl.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "powerloss.h"
#include "testlib.h"

#define ROUNDS 25
#define WRITERS 8

static char db_path[4200], undo_path[4200];
static const char *redis_url, *postgres_url; /* distributed: both set */
static int power_cut;                        /* powerloss */

static void store_options(idem_options *o)
{
    idem_options_init(o);
    o->result_max = 4096;
    if (postgres_url) {
        o->store = "distributed";
        o->redis_url = redis_url;
        o->postgres_url = postgres_url;
    } else {
        o->path = db_path;
    }
}

/* The result a key must carry: its own name repeated to a length that
 * depends on the key, 64..4095 bytes, so a torn write cannot pass. */
static size_t expected_result(const char *key, char *buf, size_t cap)
{
    uint32_t h = 2166136261u;
    for (const char *p = key; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    size_t len = 64 + h % 4032, klen = strlen(key);
    if (len > cap)
        len = cap;
    for (size_t i = 0; i < len; i++)
        buf[i] = key[i % klen];
    return len;
}

struct child {
    idem *h;
    int fd;
    int round;
};

struct writer_arg {
    struct child *c;
    int id;
};

static void *writer(void *arg)
{
    struct child *c = ((struct writer_arg *)arg)->c;
    int id = ((struct writer_arg *)arg)->id;
    static _Thread_local char result[4096];
    for (unsigned n = 0;; n++) {
        char key[64], line[80];
        idem_outcome o;
        idem_record rec;
        snprintf(key, sizeof key, "r%d-w%d-%u", c->round, id, n);
        if (idem_record_begin(c->h, "dur", key, NULL, "child", 60000, &o, &rec) != IDEM_OK ||
            o != IDEM_NEW)
            _exit(3);
        size_t len = expected_result(key, result, sizeof result);
        if (idem_record_complete(c->h, "dur", key, rec.epoch, result, len, 0, &o) != IDEM_OK ||
            o != IDEM_COMPLETED)
            _exit(4);
        idem_record_clear(&rec);
        int m = snprintf(line, sizeof line, "%s\n", key);
        if (write(c->fd, line, (size_t)m) != m) /* < PIPE_BUF: atomic */
            _exit(5);
    }
    return NULL;
}

static void run_child(int fd, int round, unsigned long die_at)
{
    idem_options o;
    store_options(&o);
    struct child c = {.fd = fd, .round = round};
    if (power_cut)
        powerloss_record(undo_path, die_at);
    if (idem_open(&o, &c.h) != IDEM_OK)
        _exit(2);
    pthread_t t[WRITERS];
    struct writer_arg w[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i].c = &c;
        w[i].id = i;
        pthread_create(&t[i], NULL, writer, &w[i]);
    }
    for (;;)
        pause();
}

/* Keys the child acknowledged, one per line. */
struct acks {
    char **keys;
    size_t n, cap;
    char partial[128];
    size_t plen;
};

static void take_acks(struct acks *a, const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') {
            assert_true(a->plen < sizeof a->partial - 1);
            a->partial[a->plen++] = buf[i];
            continue;
        }
        a->partial[a->plen] = '\0';
        if (a->n == a->cap) {
            a->cap = a->cap ? a->cap * 2 : 1024;
            a->keys = realloc(a->keys, a->cap * sizeof *a->keys);
            assert_non_null(a->keys);
        }
        a->keys[a->n++] = strdup(a->partial);
        a->plen = 0;
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* How much of the unsynced writes outlives each round's cut. */
static double kept_in_round(int round)
{
    static const double keep[] = {0.0, 0.5, 0.9};
    return keep[round % 3];
}

static void kill_round(int round, struct acks *a, size_t *sectors_lost)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    /* With a power cut, every other round the child dies at one of its
     * first 4000 changes to a file, not at the timer: the timer mostly
     * lands between commits, when everything written is synced. */
    unsigned long die_at = power_cut && round % 2 ? 1 + (unsigned long)(rand() % 4000) : 0;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        run_child(p[1], round, die_at);
    }
    close(p[1]);
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    int delay = 30 + rand() % 250;
    char buf[8192];
    for (int waited = 0; waited < delay; waited += 5) {
        ssize_t n;
        while ((n = read(p[0], buf, sizeof buf)) > 0)
            take_acks(a, buf, (size_t)n);
        sleep_ms(5);
    }
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFSIGNALED(status))
        fail_msg("round %d: the child exited with %d before the kill", round,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    fcntl(p[0], F_SETFL, 0);
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0)
        take_acks(a, buf, (size_t)n);
    close(p[0]);
    if (power_cut) {
        static unsigned seed;
        if (!seed)
            seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        size_t files, logged;
        size_t lost = powerloss_apply(undo_path, kept_in_round(round), &seed, &files, &logged);
        *sectors_lost += lost;
        if (round <= 6)
            print_message("round %d: cut %s after %zu changes and syncs, keeping %.0f%% of "
                          "what was not synced: %zu sectors lost in %zu files\n",
                          round, die_at ? "at a change" : "by the timer", logged,
                          kept_in_round(round) * 100, lost, files);
    }
}

/* Acknowledged keys from index `from` on are all there, whole. */
static void check_acknowledged(const struct acks *a, size_t from)
{
    idem_options o;
    store_options(&o);
    idem *h;
    assert_idem_ok(idem_open(&o, &h));
    char want[4096];
    for (size_t i = from; i < a->n; i++) {
        idem_outcome out;
        idem_record rec;
        assert_idem_ok(idem_record_get(h, "dur", a->keys[i], &out, &rec));
        if (out != IDEM_FOUND)
            fail_msg("acknowledged record %s is lost", a->keys[i]);
        size_t len = expected_result(a->keys[i], want, sizeof want);
        assert_string_equal(rec.state, "SUCCEEDED");
        assert_int_equal(rec.result_len, len);
        assert_memory_equal(rec.result, want, len);
        idem_record_clear(&rec);
    }
    idem_close(h);
}

/* A row, acknowledged or not, is whole: finished with its exact result, or
 * begun and not finished, with none. */
static void check_row(const char *key, const char *state, const void *result, size_t len)
{
    char want[4096];
    if (strcmp(state, "PROCESSING") == 0) {
        assert_int_equal(len, 0);
        return;
    }
    assert_string_equal(state, "SUCCEEDED");
    size_t want_len = expected_result(key, want, sizeof want);
    assert_int_equal(len, want_len);
    assert_memory_equal(result, want, want_len);
}

static void check_no_torn_pg_rows(size_t *rows)
{
    PGconn *c = PQconnectdb(postgres_url);
    if (PQstatus(c) != CONNECTION_OK)
        fail_msg("%s", PQerrorMessage(c));
    PGresult *r = PQexecParams(c, "SELECT key, state, result FROM idem_record WHERE space = 'dur'",
                               0, NULL, NULL, NULL, NULL, 1);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s", PQerrorMessage(c));
    *rows = (size_t)PQntuples(r);
    for (int i = 0; i < PQntuples(r); i++) {
        char key[300], state[80];
        snprintf(key, sizeof key, "%.*s", PQgetlength(r, i, 0), PQgetvalue(r, i, 0));
        snprintf(state, sizeof state, "%.*s", PQgetlength(r, i, 1), PQgetvalue(r, i, 1));
        check_row(key, state, PQgetvalue(r, i, 2),
                  PQgetisnull(r, i, 2) ? 0 : (size_t)PQgetlength(r, i, 2));
    }
    PQclear(r);
    PQfinish(c);
}

/* Every row in the file, acknowledged or not, is whole. */
static void check_no_torn_rows(size_t *rows)
{
    if (postgres_url) {
        check_no_torn_pg_rows(rows);
        return;
    }
    sqlite3 *db;
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    assert_int_equal(sqlite3_prepare_v2(db, "SELECT key, state, result FROM idem_record", -1, &s,
                                        NULL),
                     SQLITE_OK);
    *rows = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        check_row((const char *)sqlite3_column_text(s, 0),
                  (const char *)sqlite3_column_text(s, 1), sqlite3_column_blob(s, 2),
                  (size_t)sqlite3_column_bytes(s, 2));
        (*rows)++;
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
}

static void test_kill_at_random_moments(void **state)
{
    (void)state;
    char *dir = test_mkdtemp();
    snprintf(db_path, sizeof db_path, "%s/durable.db", dir);
    snprintf(undo_path, sizeof undo_path, "%s/undo.log", dir);
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    struct acks a = {0};
    size_t before = 0, rows = 0, sectors_lost = 0;
    /* With power cuts, rounds go on past ROUNDS (up to three times as
     * many) until some cut has lost sectors: which cuts find unsynced
     * writes is chance, and slower builds (the sanitizers) find fewer. */
    int round = 1;
    for (; round <= ROUNDS || (power_cut && sectors_lost == 0 && round <= 3 * ROUNDS); round++) {
        kill_round(round, &a, &sectors_lost);
        check_acknowledged(&a, before);
        check_no_torn_rows(&rows);
        assert_true(rows >= a.n);
        if (round == 1)
            print_message("round 1: %zu acknowledged, %zu rows, all present\n", a.n, rows);
        before = a.n;
    }
    print_message("after %d rounds: %zu acknowledged, %zu rows, all present\n", round - 1, a.n,
                  rows);
    /* After all the kills, every round's acknowledged writes are there. */
    check_acknowledged(&a, 0);
    /* The test means something only if the children got writes through,
     * and with a power cut, only if the cuts lost something. */
    assert_true(a.n > ROUNDS);
    if (power_cut) {
        print_message("the cuts lost %zu sectors in all\n", sectors_lost);
        assert_true(sectors_lost > 0);
    }
    for (size_t i = 0; i < a.n; i++)
        free(a.keys[i]);
    free(a.keys);
    test_rmdir(dir);
}

/* ---- the -wal unlinked, then the kill ---- */

#define WAL_KEYS 100 /* a few hundred WAL frames: none checkpointed yet */

static atomic_int wal_kept;

static void note_kept(void *arg, idem_log_level level, const char *msg)
{
    (void)arg;
    (void)level;
    if (strstr(msg, "checkpointed into it"))
        atomic_store(&wal_kept, 1);
}

/* Write WAL_KEYS records, each reported once acknowledged; unlink the
 * -wal; have the store find out, by a write (the writer) or by reads alone
 * (a reader, the writer idle); give it up to 5 s to say it checkpointed
 * (reported as "+kept"); die without closing. */
static void run_wal_removed_child(int fd, int by_reads)
{
    idem_options o;
    store_options(&o);
    o.log = note_kept;
    idem *h;
    static char result[4096];
    if (idem_open(&o, &h) != IDEM_OK)
        _exit(2);
    for (int n = 0; n < WAL_KEYS; n++) {
        char key[64], line[80];
        idem_outcome out;
        idem_record rec;
        snprintf(key, sizeof key, "wal-%d", n);
        size_t len = expected_result(key, result, sizeof result);
        if (idem_record_begin(h, "dur", key, NULL, "child", 60000, &out, &rec) != IDEM_OK ||
            out != IDEM_NEW ||
            idem_record_complete(h, "dur", key, rec.epoch, result, len, 0, &out) != IDEM_OK)
            _exit(3);
        idem_record_clear(&rec);
        int m = snprintf(line, sizeof line, "%s\n", key);
        if (write(fd, line, (size_t)m) != m)
            _exit(5);
    }
    char wal[sizeof db_path + 8];
    snprintf(wal, sizeof wal, "%s-wal", db_path);
    if (unlink(wal) != 0)
        _exit(6);
    idem_outcome out;
    idem_record rec;
    if (!by_reads) {
        if (idem_record_begin(h, "dur", "after", NULL, "child", 60000, &out, &rec) != IDEM_ESTORE)
            _exit(7); /* the store went on writing */
    } else {
        int n = 0;
        for (; n < 300 && idem_record_get(h, "dur", "wal-0", &out, &rec) == IDEM_OK; n++) {
            idem_record_clear(&rec);
            sleep_ms(10);
        }
        if (n == 300)
            _exit(8); /* the store went on reading */
    }
    for (int n = 0; n < 500 && !atomic_load(&wal_kept); n++)
        sleep_ms(10);
    if (atomic_load(&wal_kept) && write(fd, "+kept\n", 6) != 6)
        _exit(5);
    kill(getpid(), SIGKILL);
    _exit(9);
}

static void test_wal_removed_then_killed(void **state)
{
    (void)state;
    if (postgres_url || power_cut)
        skip();
    for (int by_reads = 0; by_reads < 2; by_reads++) {
        char *dir = test_mkdtemp();
        snprintf(db_path, sizeof db_path, "%s/wal.db", dir);
        int p[2];
        assert_int_equal(pipe(p), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            run_wal_removed_child(p[1], by_reads);
        }
        close(p[1]);
        struct acks a = {0};
        char buf[8192];
        ssize_t n;
        while ((n = read(p[0], buf, sizeof buf)) > 0)
            take_acks(&a, buf, (size_t)n);
        close(p[0]);
        int status;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status))
            fail_msg("found by %s: the child exited with %d", by_reads ? "reads" : "a write",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        int kept = a.n > 0 && strcmp(a.keys[a.n - 1], "+kept") == 0;
        if (kept)
            free(a.keys[--a.n]);
        assert_int_equal(a.n, WAL_KEYS);
        check_acknowledged(&a, 0);
        size_t rows;
        check_no_torn_rows(&rows);
        if (!kept)
            fail_msg("found by %s: the store did not say it kept what the WAL held",
                     by_reads ? "reads" : "a write");
        for (size_t i = 0; i < a.n; i++)
            free(a.keys[i]);
        free(a.keys);
        test_rmdir(dir);
    }
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "distributed")) {
        redis_url = argv[2];
        postgres_url = argv[3];
        test_wipe_servers(redis_url, postgres_url);
    } else if (argc == 2 && !strcmp(argv[1], "powerloss")) {
        /* Before any file is opened: the store's WAL VFS goes on top. */
        power_cut = 1;
        if (powerloss_install() != 0) {
            fprintf(stderr, "%s: cannot install the power-loss VFS\n", argv[0]);
            return 2;
        }
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [powerloss | distributed REDIS_URL POSTGRES_URL]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_at_random_moments),
        cmocka_unit_test(test_wal_removed_then_killed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
