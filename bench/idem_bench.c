/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem_bench.c — throughput of Idem's three layers, on the embedded store (and
 * the SQLite rate it is compared with; bench/run.sh adds Redis) or on the
 * distributed one, Redis + PostgreSQL (bench/distributed.sh adds
 * redis-benchmark and pgbench).
 *
 * Each workload runs at each thread count for a fixed time: the threads start
 * together, loop until a stop flag is set after --seconds, and count the
 * operations they finished inside that window; ops/s is that count over the
 * window. One operation is
 *
 *   token            idem_token_issue + idem_token_consume (CONSUMED); each
 *                    thread has its own subject and spends every token it is
 *                    issued on a fresh business key. Spent tokens stay in
 *                    memory for their TTL (30 s), so the handle is opened with
 *                    room for 16M of them (--tokens-max)
 *   token-consume    the two halves apart, in two windows of --seconds each:
 *                    first every thread issues tokens (reported as
 *                    token-issue), each to a subject of its own, as many users
 *                    opening a page; then, after a barrier, every thread
 *                    spends the tokens it was issued, in order, each on a
 *                    fresh key (token-consume, CONSUMED). Should a thread run
 *                    out of tokens, the window ends there
 *   lock             idem_lock_acquire (ACQUIRED) + idem_lock_release
 *                    (RELEASED) on a key of its own (thread, iteration); one
 *                    owner per thread
 *   record           idem_record_begin (NEW) + idem_record_complete
 *                    (COMPLETED) on a unique key, with a SHA-256 fingerprint
 *                    and a small result: two durable writes in the SQLite
 *                    file DIR/bench.db (WAL, synchronous=FULL, group commit)
 *   sqlite-baseline  one autocommit INSERT into a table with a unique key, in
 *                    DIR/baseline.db (WAL, synchronous=FULL): the plain
 *                    "one transaction per insert" rate; one connection per
 *                    thread, busy_timeout for the write lock
 *
 * All threads share one idem handle. Every call must return IDEM_OK (or
 * SQLITE_DONE) with the expected outcome; anything else stops the benchmark
 * with the error and exit status 1. Each (workload, threads) pair gets a fresh
 * handle and fresh files, removed afterwards. Latency per operation (p50,
 * p99) is taken from a log-linear histogram, on every operation of the
 * durable workloads and every 16th of the in-memory ones so the clock reads
 * stay out of the throughput figure.
 *
 * --store distributed --redis URL --postgres URL opens every handle on Redis
 * and PostgreSQL instead (sqlite-baseline does not apply). Their data is not
 * removed between measurements, so every key and subject then carries a
 * prefix drawn once per measurement; every operation is timed, a network
 * round trip dwarfing the clock read. "writes/commit" is then the
 * PostgreSQL backend's batch: writes per transaction it committed.
 *
 * --async N (lock and token-consume only) runs the asynchronous calls
 * instead: each thread runs a libevent loop of its own and keeps N
 * operations in flight on it, starting the next one from the callback of
 * the last (lock: idem_lock_acquire_async, then idem_lock_release_async
 * from its callback; token-consume: the second window's consumes, with
 * idem_token_consume_async, the first window's issues staying blocking, on
 * 32 threads per loop).
 * The lines are named lock-async and token-consume-async, and the
 * latency is that of each operation from its start to its last callback.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"
#include "idem/libevent.h"

enum workload { W_TOKEN, W_LOCK, W_RECORD, W_SQLITE, W_TOKEN_CONSUME, W_TOKEN_FULL, W_COUNT_ };

static const char *const workload_name[W_COUNT_] = {
    [W_TOKEN] = "token", [W_LOCK] = "lock", [W_RECORD] = "record",
    [W_SQLITE] = "sqlite-baseline", [W_TOKEN_CONSUME] = "token-consume",
    [W_TOKEN_FULL] = "token-full",
};

#define THREADS_MAX 1024
#define LEASE_MS 30000
#define SPACE "bench"
#define SCENE "checkout"
#define RESULT "{\"status\":\"ok\"}"
/* Spent tokens are remembered for their TTL, so a run keeps every token it
 * issued: 30 s, the TTL of redis-benchmark's SET ... PX 30000, and room for
 * a few seconds at a few million tokens a second (~200 bytes each). */
#define TOKEN_TTL_MS 30000
#define TOKENS_MAX 16000000

struct config {
    unsigned threads[16];
    size_t nthreads;
    double seconds;
    const char *dir;
    int json;
    int workloads[W_COUNT_]; /* 1: run it */
    int workloads_given;     /* --workloads was on the command line */
    int64_t token_ttl_ms;
    size_t tokens_max;
    const char *store;        /* "embedded" or "distributed" */
    const char *redis_url, *postgres_url;
    unsigned pool_size;       /* 0: the library's default */
    int64_t timeout_ms;       /* 0: the library's default */
    unsigned async;           /* operations in flight per thread's loop; 0: blocking */
};

static int distributed(const struct config *cfg)
{
    return strcmp(cfg->store, "distributed") == 0;
}

/* ---- latency histogram: 16 buckets per power of two, in nanoseconds ---- */

#define SUB_BITS 4
#define SUBS (1u << SUB_BITS)
#define BUCKETS ((64 - SUB_BITS + 1) * SUBS)

struct hist {
    uint64_t n[BUCKETS];
};

static unsigned bucket_of(uint64_t ns)
{
    if (ns < SUBS)
        return (unsigned)ns;
    unsigned k = 63u - (unsigned)__builtin_clzll(ns); /* k >= SUB_BITS */
    unsigned sub = (unsigned)(ns >> (k - SUB_BITS)) & (SUBS - 1);
    return (k - SUB_BITS + 1) * SUBS + sub;
}

/* The middle of bucket b, in nanoseconds. */
static double bucket_mid(unsigned b)
{
    if (b < SUBS)
        return b;
    unsigned octave = b / SUBS, sub = b % SUBS;
    double width = (double)(1ull << (octave - 1));
    return (double)(SUBS + sub) * width + width / 2;
}

static double hist_percentile(const struct hist *h, double p)
{
    uint64_t total = 0, seen = 0;
    for (unsigned b = 0; b < BUCKETS; b++)
        total += h->n[b];
    if (!total)
        return 0;
    uint64_t rank = (uint64_t)(p * (double)total);
    if (rank >= total)
        rank = total - 1;
    for (unsigned b = 0; b < BUCKETS; b++) {
        seen += h->n[b];
        if (seen > rank)
            return bucket_mid(b);
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- one measurement ---- */

struct run {
    enum workload w;
    const struct config *cfg;
    idem *h;
    char db_path[4096];
    char prefix[24];  /* distributed: "r1a2b3c4-" in keys and subjects */
    atomic_int stop;
    atomic_int ran_out; /* token-consume: a thread spent all its tokens */
    unsigned loops;     /* --async: the threads that run a loop (the first ones) */
    pthread_barrier_t start;
    pthread_barrier_t turn; /* token-consume: between the two windows */
};

/* token-consume: the tokens a thread was issued, in order; token i belongs
 * to subject "<prefix>user-<thread>-<i>". */
struct issued {
    char (*token)[IDEM_TOKEN_LEN + 1];
    uint64_t n, cap, next;
};

struct worker {
    _Alignas(64) struct run *run;
    pthread_t thread;
    unsigned id;
    char name[32];    /* subject / owner: "user-7" */
    uint64_t fence;   /* lock: the last fence this thread was handed */
    struct issued issued; /* token-consume */
    sqlite3 *db;      /* sqlite-baseline: this thread's connection */
    sqlite3_stmt *insert;
    uint64_t ops;
    int failed;
    char err[512];
    struct hist lat;
};

__attribute__((format(printf, 2, 3))) static int failf(struct worker *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err, sizeof w->err, fmt, ap);
    va_end(ap);
    w->failed = 1;
    return -1;
}

/* 0 if call returned IDEM_OK with outcome want; else -1 and the error. */
static int check(struct worker *w, const char *call, idem_rc rc, idem_outcome got,
                 idem_outcome want)
{
    if (rc != IDEM_OK)
        return failf(w, "%s returned IDEM_%s (%s): %s", call, idem_errname(rc),
                     idem_strerror(rc), idem_errdetail());
    if (got != want)
        return failf(w, "%s: outcome %s, expected %s", call, idem_outcome_name(got),
                     idem_outcome_name(want));
    return 0;
}

static int op_token(struct worker *w, uint64_t i)
{
    char token[IDEM_TOKEN_LEN + 1], key[64];
    idem_outcome out = IDEM_NONE;
    idem_rc rc = idem_token_issue(w->run->h, w->name, SCENE, w->run->cfg->token_ttl_ms, token);
    if (rc != IDEM_OK)
        return check(w, "idem_token_issue", rc, out, out);
    snprintf(key, sizeof key, "%sorder-%u-%" PRIu64, w->run->prefix, w->id, i);
    rc = idem_token_consume(w->run->h, w->name, SCENE, token, key, &out, NULL);
    return check(w, "idem_token_consume", rc, out, IDEM_CONSUMED);
}

static void subject_of(const struct worker *w, uint64_t i, char *buf, size_t size)
{
    snprintf(buf, size, "%suser-%u-%" PRIu64, w->run->prefix, w->id, i);
}

/* token-consume, first window: issue one more token to a subject of its own. */
static int op_token_issue(struct worker *w, uint64_t i)
{
    struct issued *is = &w->issued;
    char subject[64];
    if (is->n == is->cap) {
        uint64_t cap = is->cap ? 2 * is->cap : 4096;
        void *p = realloc(is->token, cap * sizeof *is->token);
        if (!p)
            return failf(w, "out of memory for %" PRIu64 " tokens", cap);
        is->token = p;
        is->cap = cap;
    }
    subject_of(w, i, subject, sizeof subject);
    idem_rc rc = idem_token_issue(w->run->h, subject, SCENE, w->run->cfg->token_ttl_ms,
                                  is->token[is->n]);
    if (rc != IDEM_OK)
        return check(w, "idem_token_issue", rc, IDEM_NONE, IDEM_NONE);
    is->n++;
    return 0;
}

/* token-consume, second window: spend the next issued token. */
static int op_token_spend(struct worker *w, uint64_t i)
{
    struct issued *is = &w->issued;
    char subject[64], key[64];
    idem_outcome out = IDEM_NONE;
    (void)i;
    if (is->next == is->n) {
        atomic_store(&w->run->ran_out, 1);
        atomic_store(&w->run->stop, 1);
        return 1; /* not an error: the window ends */
    }
    subject_of(w, is->next, subject, sizeof subject);
    snprintf(key, sizeof key, "%sorder-%u-%" PRIu64, w->run->prefix, w->id, is->next);
    idem_rc rc = idem_token_consume(w->run->h, subject, SCENE, is->token[is->next], key,
                                    &out, NULL);
    is->next++;
    return check(w, "idem_token_consume", rc, out, IDEM_CONSUMED);
}

/* token-full: an issue to a new subject while the table is full of tokens
 * that expire after the run: refused (IDEM_EFULL), which is what is timed. */
static int op_token_refused(struct worker *w, uint64_t i)
{
    char subject[64], token[IDEM_TOKEN_LEN + 1];
    subject_of(w, i, subject, sizeof subject);
    idem_rc rc = idem_token_issue(w->run->h, subject, SCENE, w->run->cfg->token_ttl_ms, token);
    if (rc != IDEM_EFULL)
        return failf(w, "idem_token_issue on a full table: IDEM_%s, not IDEM_EFULL",
                     idem_errname(rc));
    return 0;
}

static int op_lock(struct worker *w, uint64_t i)
{
    char key[64];
    idem_outcome out = IDEM_NONE;
    idem_lock_info info;
    snprintf(key, sizeof key, "%sorder-%u-%" PRIu64, w->run->prefix, w->id, i);
    idem_rc rc = idem_lock_acquire(w->run->h, SPACE, key, w->name, LEASE_MS, &out, &info);
    if (check(w, "idem_lock_acquire", rc, out, IDEM_ACQUIRED) != 0)
        return -1;
    if (info.fence <= w->fence)
        return failf(w, "idem_lock_acquire: fence %" PRIu64 " after %" PRIu64, info.fence,
                     w->fence);
    w->fence = info.fence;
    rc = idem_lock_release(w->run->h, SPACE, key, w->name, &out);
    return check(w, "idem_lock_release", rc, out, IDEM_RELEASED);
}

static int op_record(struct worker *w, uint64_t i)
{
    char key[64];
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    idem_outcome out = IDEM_NONE;
    idem_record rec;
    int n = snprintf(key, sizeof key, "%sorder-%u-%" PRIu64, w->run->prefix, w->id, i);
    idem_rc rc = idem_fingerprint(key, (size_t)n, fp);
    if (rc != IDEM_OK)
        return check(w, "idem_fingerprint", rc, out, out);
    rc = idem_record_begin(w->run->h, SPACE, key, fp, w->name, LEASE_MS, &out, &rec);
    if (check(w, "idem_record_begin", rc, out, IDEM_NEW) != 0)
        return -1;
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    /* A new record's first epoch is the clock (ms), never 0. */
    if (epoch == 0)
        return failf(w, "idem_record_begin: NEW with epoch 0");
    rc = idem_record_complete(w->run->h, SPACE, key, epoch, RESULT, sizeof RESULT - 1, 0,
                              &out);
    return check(w, "idem_record_complete", rc, out, IDEM_COMPLETED);
}

static int op_sqlite(struct worker *w, uint64_t i)
{
    char key[64];
    int n = snprintf(key, sizeof key, "order-%u-%" PRIu64, w->id, i);
    sqlite3_bind_text(w->insert, 1, key, n, SQLITE_STATIC);
    int rc = sqlite3_step(w->insert);
    sqlite3_reset(w->insert);
    if (rc != SQLITE_DONE)
        return failf(w, "INSERT: %s (%d)", sqlite3_errmsg(w->db),
                     sqlite3_extended_errcode(w->db));
    return 0;
}

static int (*const op_of[W_COUNT_])(struct worker *, uint64_t) = {
    [W_TOKEN] = op_token, [W_LOCK] = op_lock, [W_RECORD] = op_record,
    [W_SQLITE] = op_sqlite, [W_TOKEN_CONSUME] = op_token_issue,
    [W_TOKEN_FULL] = op_token_refused,
};

/* Open one baseline connection: WAL, synchronous=FULL, a busy timeout long
 * enough that contention for the write lock never fails an insert. */
static int sqlite_connect(struct worker *w, const char *path)
{
    static const char setup[] =
        "PRAGMA journal_mode=WAL;"
        "PRAGMA synchronous=FULL;"
        "CREATE TABLE IF NOT EXISTS bench (k TEXT PRIMARY KEY, v TEXT NOT NULL);";
    if (sqlite3_open(path, &w->db) != SQLITE_OK)
        return failf(w, "opening %s: %s", path, w->db ? sqlite3_errmsg(w->db) : "no memory");
    sqlite3_busy_timeout(w->db, 60000);
    if (sqlite3_exec(w->db, setup, NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(w->db, "INSERT INTO bench (k, v) VALUES (?1, '" RESULT "')", -1,
                           &w->insert, NULL) != SQLITE_OK)
        return failf(w, "setting up %s: %s", path, sqlite3_errmsg(w->db));
    return 0;
}

/* ---- --async: operations in flight on each thread's loop ---- */

#define ASYNC_MAX 4096
#define ISSUERS 32 /* --async token-consume: threads issuing per loop */

struct slot {
    struct worker *w;
    uint64_t i, t0;
    char key[64], subject[64];
};

struct aloop {
    struct event_base *base;
    idem_loop *loop;
    unsigned in_flight;
    uint64_t next;
    unsigned from;    /* token-consume: the issuer whose tokens are spent now */
};

static _Thread_local struct aloop *cur; /* the thread's loop */

static void slot_start(struct slot *s);

/* An operation of the slot's has ended (ok: as it should): count it, and
 * start the next, unless the window is over. */
static void slot_end(struct slot *s, int ok)
{
    struct worker *w = s->w;
    struct run *r = w->run;
    if (!ok)
        atomic_store(&r->stop, 1);
    else if (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        w->ops++;
        w->lat.n[bucket_of(now_ns() - s->t0)]++;
    }
    if (ok && !w->failed && !atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        slot_start(s);
        return;
    }
    if (--cur->in_flight == 0)
        event_base_loopbreak(cur->base);
}

static int check_async(struct worker *w, const char *call, idem_rc rc, idem_outcome got,
                       idem_outcome want, const char *detail)
{
    if (rc != IDEM_OK)
        return failf(w, "%s: IDEM_%s (%s): %s", call, idem_errname(rc), idem_strerror(rc),
                     detail);
    if (got != want)
        return failf(w, "%s: outcome %s, expected %s", call, idem_outcome_name(got),
                     idem_outcome_name(want));
    return 0;
}

static void on_released(void *arg, idem_rc rc, idem_outcome out, const char *detail)
{
    struct slot *s = arg;
    slot_end(s, check_async(s->w, "idem_lock_release_async", rc, out, IDEM_RELEASED,
                            detail) == 0);
}

static void on_acquired(void *arg, idem_rc rc, idem_outcome out, const idem_lock_info *info,
                        const char *detail)
{
    struct slot *s = arg;
    struct worker *w = s->w;
    if (check_async(w, "idem_lock_acquire_async", rc, out, IDEM_ACQUIRED, detail) != 0) {
        slot_end(s, 0);
        return;
    }
    /* One connection per loop answers in order: fences still rise. */
    if (info->fence <= w->fence) {
        failf(w, "idem_lock_acquire_async: fence %" PRIu64 " after %" PRIu64, info->fence,
              w->fence);
        slot_end(s, 0);
        return;
    }
    w->fence = info->fence;
    rc = idem_lock_release_async(w->run->h, cur->loop, SPACE, s->key, w->name, on_released, s);
    if (rc != IDEM_OK) {
        check(w, "idem_lock_release_async", rc, IDEM_NONE, IDEM_NONE);
        slot_end(s, 0);
    }
}

static void on_consumed(void *arg, idem_rc rc, idem_outcome out, const char *spent_key,
                        const char *detail)
{
    struct slot *s = arg;
    (void)spent_key;
    slot_end(s, check_async(s->w, "idem_token_consume_async", rc, out, IDEM_CONSUMED,
                            detail) == 0);
}

static void slot_start(struct slot *s)
{
    struct worker *w = s->w;
    struct run *r = w->run;
    idem_rc rc;
    s->i = cur->next++;
    s->t0 = now_ns();
    if (r->w == W_LOCK) {
        snprintf(s->key, sizeof s->key, "%sorder-%u-%" PRIu64, r->prefix, w->id, s->i);
        rc = idem_lock_acquire_async(r->h, cur->loop, SPACE, s->key, w->name, LEASE_MS,
                                     on_acquired, s);
        if (rc != IDEM_OK)
            check(w, "idem_lock_acquire_async", rc, IDEM_NONE, IDEM_NONE);
    } else {
        /* The tokens of this loop's issuers, one after the other: workers
         * w->id * ISSUERS onwards of the array w is in. */
        struct worker *base = w - w->id, *src = NULL;
        while (cur->from < ISSUERS) {
            src = &base[w->id * ISSUERS + cur->from];
            if (src->issued.next < src->issued.n)
                break;
            cur->from++;
        }
        if (cur->from == ISSUERS) {
            atomic_store(&r->ran_out, 1);
            atomic_store(&r->stop, 1);
            slot_end(s, 0);
            return;
        }
        struct issued *is = &src->issued;
        subject_of(src, is->next, s->subject, sizeof s->subject);
        snprintf(s->key, sizeof s->key, "%sorder-%u-%" PRIu64, r->prefix, src->id, is->next);
        rc = idem_token_consume_async(r->h, cur->loop, s->subject, SCENE, is->token[is->next],
                                      s->key, on_consumed, s);
        is->next++;
        if (rc != IDEM_OK)
            check(w, "idem_token_consume_async", rc, IDEM_NONE, IDEM_NONE);
    }
    if (rc != IDEM_OK)
        slot_end(s, 0);
}

/* The window on the thread's loop, --async operations in flight. */
static void async_loop(struct worker *w)
{
    struct run *r = w->run;
    unsigned n = r->cfg->async;
    struct aloop l = {0};
    struct slot *slots = calloc(n, sizeof *slots);
    if (!slots || !(l.base = event_base_new()) || !(l.loop = idem_libevent_new(l.base))) {
        failf(w, "out of memory for the loop");
        atomic_store(&r->stop, 1);
        free(slots);
        if (l.base)
            event_base_free(l.base);
        return;
    }
    cur = &l;
    l.in_flight = n;
    for (unsigned i = 0; i < n; i++) {
        slots[i].w = w;
        slot_start(&slots[i]);
    }
    if (l.in_flight > 0)
        event_base_dispatch(l.base);
    idem_loop_detach(r->h, l.loop);
    idem_libevent_free(l.loop);
    event_base_free(l.base);
    cur = NULL;
    free(slots);
}

/* Run op until the stop flag is set; count what finished inside the window. */
static void loop(struct worker *w, int (*op)(struct worker *, uint64_t), uint64_t mask)
{
    struct run *r = w->run;
    for (uint64_t i = 0; !w->failed && !atomic_load_explicit(&r->stop, memory_order_relaxed);
         i++) {
        int timed = (i & mask) == 0;
        uint64_t t0 = timed ? now_ns() : 0;
        int rc = op(w, i);
        if (rc != 0) {
            atomic_store(&r->stop, 1);
            break;
        }
        if (timed)
            w->lat.n[bucket_of(now_ns() - t0)]++;
        /* Count what finished inside the window: an op that straddles the
         * stop (a baseline INSERT asleep in its busy handler) is left out. */
        if (!atomic_load_explicit(&r->stop, memory_order_relaxed))
            w->ops++;
    }
}

static void *work(void *arg)
{
    struct worker *w = arg;
    struct run *r = w->run;
    /* Every 16th in-memory op is timed; every durable or remote one. */
    uint64_t mask = (r->w == W_TOKEN || r->w == W_LOCK || r->w == W_TOKEN_CONSUME ||
                     r->w == W_TOKEN_FULL) &&
                            !distributed(r->cfg)
                        ? 15
                        : 0;

    if (r->w == W_SQLITE && sqlite_connect(w, r->db_path) != 0)
        atomic_store(&r->stop, 1);
    pthread_barrier_wait(&r->start);
    if (r->cfg->async && r->w == W_LOCK)
        async_loop(w);
    else
        loop(w, op_of[r->w], mask);
    if (r->w == W_TOKEN_CONSUME) {
        /* The main thread reads the first window's figures, then lets the
         * second one start. */
        pthread_barrier_wait(&r->turn);
        pthread_barrier_wait(&r->turn);
        if (!w->failed && !r->cfg->async)
            loop(w, op_token_spend, mask);
        else if (!w->failed && w->id < r->loops)
            async_loop(w); /* the others only issued: their loop spends */
    }
    sqlite3_finalize(w->insert);
    sqlite3_close(w->db);
    return NULL; /* its tokens are freed once every thread is done (--async: a loop's) */
}

static void remove_files(const char *path)
{
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    char p[4200];
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        snprintf(p, sizeof p, "%s%s", path, suffix[i]);
        if (unlink(p) != 0 && errno != ENOENT)
            fprintf(stderr, "idem-bench: warning: removing %s: %s\n", p, strerror(errno));
    }
}

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("idem-bench: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* Print one result line, and its JSON object. */
static void report(const struct config *cfg, const char *name, unsigned nthreads, uint64_t ops,
                   double elapsed, const struct hist *lat, double batch, const char *note)
{
    static int lines;
    double rate = (double)ops / elapsed, p50 = hist_percentile(lat, 0.50) / 1e3,
           p99 = hist_percentile(lat, 0.99) / 1e3;
    FILE *human = cfg->json ? stderr : stdout;
    fprintf(human, "%-16s threads=%-3u %12.0f ops/s   p50 %9.2f us   p99 %9.2f us", name,
            nthreads, rate, p50, p99);
    if (batch > 0)
        fprintf(human, "   %.1f writes/%s", batch, distributed(cfg) ? "commit" : "fsync");
    if (note)
        fprintf(human, "   (%s)", note);
    fputc('\n', human);
    fflush(human);
    if (cfg->json) {
        printf("%s{\"workload\":\"%s\",\"threads\":%u,\"ops\":%" PRIu64 ",\"elapsed_s\":%.3f,"
               "\"ops_per_s\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"writes_per_commit\":%.2f%s%s%s}",
               lines ? ",\n" : "", name, nthreads, ops, elapsed, rate, p50, p99, batch,
               note ? ",\"note\":\"" : "", note ? note : "", note ? "\"" : "");
        fflush(stdout);
    }
    lines++;
}

/* Let the threads run for --seconds, or until one fails; then stop them.
 * Returns the window's length in seconds. */
static double window(const struct config *cfg, struct run *r)
{
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(cfg->seconds * 1e9);
    /* Wake now and then: a thread that failed stops the run early. */
    for (uint64_t t = t0; t < end && !atomic_load(&r->stop); t = now_ns()) {
        struct timespec nap = {0, (long)(end - t < 50000000u ? end - t : 50000000u)};
        nanosleep(&nap, NULL);
    }
    atomic_store(&r->stop, 1);
    return (double)(now_ns() - t0) / 1e9;
}

/* Sum the threads' counts and histograms, and reset them. The first error
 * any thread met, or NULL. */
static const char *collect(struct worker *ws, unsigned nthreads, uint64_t *ops, struct hist *all)
{
    const char *err = NULL;
    *ops = 0;
    memset(all, 0, sizeof *all);
    for (unsigned i = 0; i < nthreads; i++) {
        *ops += ws[i].ops;
        for (unsigned b = 0; b < BUCKETS; b++)
            all->n[b] += ws[i].lat.n[b];
        ws[i].ops = 0;
        memset(&ws[i].lat, 0, sizeof ws[i].lat);
        if (ws[i].failed && !err)
            err = ws[i].err;
    }
    return err;
}

static void open_handle(const struct config *cfg, struct run *r)
{
    idem_options o;
    idem_options_init(&o);
    o.tokens_max = cfg->tokens_max;
    if (distributed(cfg)) {
        o.store = "distributed";
        o.redis_url = cfg->redis_url;
        o.postgres_url = cfg->postgres_url;
        o.pool_size = cfg->pool_size;
        o.timeout_ms = cfg->timeout_ms;
    } else {
        o.path = r->db_path;
    }
    idem_rc rc = idem_open(&o, &r->h);
    if (rc != IDEM_OK)
        die("idem_open(%s): IDEM_%s: %s", distributed(cfg) ? "distributed" : r->db_path,
            idem_errname(rc), idem_errdetail());
}

/* Run one workload at one thread count on fresh files; print its line
 * (token-consume: two lines, token-issue and token-consume). */
static void measure(const struct config *cfg, enum workload wl, unsigned loops)
{
    /* --async token-consume: ISSUERS threads per loop issue the tokens its
     * loop then spends, so that a loop has about as many to spend as it
     * could in the window. */
    unsigned nthreads = cfg->async && wl == W_TOKEN_CONSUME ? loops * ISSUERS : loops;
    struct run *r = calloc(1, sizeof *r);
    struct worker *ws = aligned_alloc(64, nthreads * sizeof *ws);
    struct hist *all = calloc(1, sizeof *all);
    if (!r || !ws || !all)
        die("out of memory");
    memset(ws, 0, nthreads * sizeof *ws);
    r->w = wl;
    r->cfg = cfg;
    r->loops = loops;
    if (distributed(cfg)) {
        /* Keys and subjects of their own in a store that outlives the run. */
        uint8_t fp[IDEM_FINGERPRINT_LEN];
        char seed[64];
        int n = snprintf(seed, sizeof seed, "%ld-%" PRIu64 "-%d-%u", (long)getpid(), now_ns(),
                         (int)wl, nthreads);
        idem_fingerprint(seed, (size_t)n, fp);
        snprintf(r->prefix, sizeof r->prefix, "r%02x%02x%02x%02x-", fp[0], fp[1], fp[2], fp[3]);
    }
    snprintf(r->db_path, sizeof r->db_path, "%s/%s", cfg->dir,
             wl == W_SQLITE ? "baseline.db" : "bench.db");
    if (!distributed(cfg))
        remove_files(r->db_path);
    if (wl == W_SQLITE) {
        /* Create the file and its table once, before the threads race. */
        struct worker setup = {0};
        if (sqlite_connect(&setup, r->db_path) != 0)
            die("sqlite-baseline: %s", setup.err);
        sqlite3_finalize(setup.insert);
        sqlite3_close(setup.db);
    } else {
        open_handle(cfg, r);
    }
    if (wl == W_TOKEN_FULL) {
        /* The table filled first, one subject a token, with a TTL that
         * outlives the run: what a client varying its subject leaves. */
        char subject[64], token[IDEM_TOKEN_LEN + 1];
        for (size_t i = 0; i < cfg->tokens_max; i++) {
            snprintf(subject, sizeof subject, "filler-%zu", i);
            idem_rc rc = idem_token_issue(r->h, subject, SCENE, 3600000, token);
            if (rc != IDEM_OK)
                die("token-full: filling token %zu of %zu: IDEM_%s: %s", i, cfg->tokens_max,
                    idem_errname(rc), idem_errdetail());
        }
    }

    if (pthread_barrier_init(&r->start, NULL, nthreads + 1) != 0 ||
        pthread_barrier_init(&r->turn, NULL, nthreads + 1) != 0)
        die("pthread_barrier_init failed");
    for (unsigned i = 0; i < nthreads; i++) {
        ws[i].run = r;
        ws[i].id = i;
        snprintf(ws[i].name, sizeof ws[i].name, "user-%u", i);
        int e = pthread_create(&ws[i].thread, NULL, work, &ws[i]);
        if (e != 0)
            die("pthread_create: thread %u of %u: %s", i, nthreads, strerror(e));
    }
    pthread_barrier_wait(&r->start);
    double elapsed = window(cfg, r), issue_elapsed = 0;
    uint64_t ops = 0, issued = 0;
    const char *err = NULL;
    struct hist *issue_lat = NULL;
    if (wl == W_TOKEN_CONSUME) {
        /* Every thread has stopped issuing: take the first window's
         * figures, then start the second one, spending. */
        pthread_barrier_wait(&r->turn);
        issue_lat = calloc(1, sizeof *issue_lat);
        if (!issue_lat)
            die("out of memory");
        err = collect(ws, nthreads, &issued, issue_lat);
        issue_elapsed = elapsed;
        if (!err)
            atomic_store(&r->stop, 0);
        pthread_barrier_wait(&r->turn);
        if (!err)
            elapsed = window(cfg, r);
    }
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(ws[i].thread, NULL);
    for (unsigned i = 0; i < nthreads; i++)
        free(ws[i].issued.token);
    const char *e2 = collect(ws, nthreads, &ops, all);
    if (!err)
        err = e2;
    double batch = 0; /* record: writes per group commit (fsync) */
    if (r->h) {
        idem_stats st;
        idem_get_stats(r->h, &st);
        if (wl == W_RECORD && st.commits)
            batch = (double)st.committed_ops / (double)st.commits;
        idem_close(r->h);
    }
    pthread_barrier_destroy(&r->start);
    pthread_barrier_destroy(&r->turn);
    if (!distributed(cfg))
        remove_files(r->db_path);
    if (err)
        die("%s, %u threads: %s", workload_name[wl], loops, err);

    if (wl == W_TOKEN_CONSUME) {
        report(cfg, "token-issue", nthreads, issued, issue_elapsed, issue_lat, 0, NULL);
        report(cfg, cfg->async ? "token-consume-async" : "token-consume", loops, ops,
               elapsed, all, 0,
               atomic_load(&r->ran_out) ? "a thread ran out of tokens: the window ended early"
                                        : NULL);
    } else {
        report(cfg, cfg->async ? "lock-async" : workload_name[wl], nthreads, ops, elapsed, all,
               batch, NULL);
    }
    free(issue_lat);
    free(all);
    free(ws);
    free(r);
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: idem-bench [--threads 1,8,64] [--seconds 3] [--dir DIR] [--json]\n"
            "                  [--workloads token,lock,record,sqlite-baseline,token-consume,\n"
            "                   token-full]\n"
            "                  [--token-ttl-ms 30000] [--tokens-max 16000000]\n"
            "                  [--store embedded|distributed --redis URL --postgres URL\n"
            "                   [--pool N] [--timeout-ms MS]]\n"
            "                  [--async N]   (lock, token-consume: N calls in flight\n"
            "                                 on each thread's event loop)\n"
            "Measures ops/s of Idem's token, lock and durable record layers and of\n"
            "plain SQLite one-transaction-per-insert. SQLite files go to DIR\n"
            "(default: .): put it on the disk you want measured, not on tmpfs.\n"
            "--store distributed opens every handle on Redis and PostgreSQL instead\n"
            "(default workloads token,lock,record); sqlite-baseline does not apply.\n");
}

static unsigned long parse_ulong(const char *s, const char *what, unsigned long max)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || end == s || *end || v == 0 || v > max || *s == '-')
        die("%s: \"%s\" is not a number in 1..%lu", what, s, max);
    return v;
}

static void parse_list(struct config *cfg, const char *arg, int threads)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", arg);
    if (!threads) {
        memset(cfg->workloads, 0, sizeof cfg->workloads);
        cfg->workloads_given = 1;
    }
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (threads) {
            if (cfg->nthreads == sizeof cfg->threads / sizeof *cfg->threads)
                die("--threads: at most %zu counts", cfg->nthreads);
            cfg->threads[cfg->nthreads++] =
                (unsigned)parse_ulong(tok, "--threads", THREADS_MAX);
            continue;
        }
        int found = 0;
        for (int w = 0; w < W_COUNT_; w++)
            if (strcmp(tok, workload_name[w]) == 0)
                cfg->workloads[w] = found = 1;
        if (!found)
            die("--workloads: unknown workload \"%s\"", tok);
    }
}

static void parse_args(struct config *cfg, int argc, char **argv)
{
    int threads_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--json") == 0) {
            cfg->json = 1;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            usage(stderr);
            die("%s: missing value or unknown option", a);
        }
        i++;
        if (strcmp(a, "--threads") == 0) {
            if (!threads_given)
                cfg->nthreads = 0;
            threads_given = 1;
            parse_list(cfg, v, 1);
        } else if (strcmp(a, "--workloads") == 0) {
            parse_list(cfg, v, 0);
        } else if (strcmp(a, "--seconds") == 0) {
            char *end;
            cfg->seconds = strtod(v, &end);
            if (end == v || *end || !(cfg->seconds > 0 && cfg->seconds <= 3600))
                die("--seconds: \"%s\" is not a duration in (0, 3600]", v);
        } else if (strcmp(a, "--dir") == 0) {
            cfg->dir = v;
        } else if (strcmp(a, "--token-ttl-ms") == 0) {
            cfg->token_ttl_ms = (int64_t)parse_ulong(v, a, 7ul * 24 * 3600 * 1000);
        } else if (strcmp(a, "--tokens-max") == 0) {
            cfg->tokens_max = parse_ulong(v, a, 1ul << 32);
        } else if (strcmp(a, "--store") == 0) {
            if (strcmp(v, "embedded") != 0 && strcmp(v, "distributed") != 0)
                die("--store: \"%s\" is neither embedded nor distributed", v);
            cfg->store = v;
        } else if (strcmp(a, "--redis") == 0) {
            cfg->redis_url = v;
        } else if (strcmp(a, "--postgres") == 0) {
            cfg->postgres_url = v;
        } else if (strcmp(a, "--pool") == 0) {
            cfg->pool_size = (unsigned)parse_ulong(v, a, 1024);
        } else if (strcmp(a, "--async") == 0) {
            cfg->async = (unsigned)parse_ulong(v, a, ASYNC_MAX);
        } else if (strcmp(a, "--timeout-ms") == 0) {
            cfg->timeout_ms = (int64_t)parse_ulong(v, a, 3600ul * 1000);
        } else {
            usage(stderr);
            die("unknown option %s", a);
        }
    }
}

int main(int argc, char **argv)
{
    struct config cfg = {
        .threads = {1, 8, 64}, .nthreads = 3, .seconds = 3, .dir = ".",
        .workloads = {1, 1, 1, 1}, .token_ttl_ms = TOKEN_TTL_MS,
        .tokens_max = TOKENS_MAX, .store = "embedded",
    };
    parse_args(&cfg, argc, argv);
    if (distributed(&cfg)) {
        if (!cfg.redis_url || !cfg.postgres_url)
            die("--store distributed needs --redis URL and --postgres URL");
        if ((cfg.workloads[W_SQLITE] || cfg.workloads[W_TOKEN_FULL]) && cfg.workloads_given)
            die("--workloads: sqlite-baseline and token-full do not apply to --store "
                "distributed");
        cfg.workloads[W_SQLITE] = 0;
    } else if (cfg.redis_url || cfg.postgres_url || cfg.pool_size || cfg.timeout_ms) {
        die("--redis, --postgres, --pool and --timeout-ms are for --store distributed");
    }
    if (cfg.async) {
        for (int wl = 0; wl < W_COUNT_; wl++)
            if (cfg.workloads[wl] && wl != W_LOCK && wl != W_TOKEN_CONSUME) {
                if (cfg.workloads_given)
                    die("--async: only lock and token-consume have asynchronous calls");
                cfg.workloads[wl] = 0;
            }
        evthread_use_pthreads(); /* the stores post callbacks from their threads */
    }
    if (cfg.json)
        printf("{\"bench\":\"idem-bench\",\"idem_version\":\"%s\",\"sqlite_version\":\"%s\","
               "\"store\":\"%s\",\"seconds\":%g,\"results\":[\n",
               idem_version(), sqlite3_libversion(), cfg.store, cfg.seconds);
    for (int wl = 0; wl < W_COUNT_; wl++)
        for (size_t t = 0; cfg.workloads[wl] && t < cfg.nthreads; t++)
            measure(&cfg, (enum workload)wl, cfg.threads[t]);
    if (cfg.json)
        printf("\n]}\n");
    return 0;
}
