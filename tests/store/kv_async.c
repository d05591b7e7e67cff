/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kv_async.c — the asynchronous token and lock calls, on a real libevent
 * loop through idem/libevent.h, against a kv backend: "memory" (the calls
 * run at once and their callbacks are posted) or "redis" (commands on the
 * loop's own connection). The callback rule of idem/loop.h, the calls'
 * agreement with the blocking ones, and, on Redis, its faults: a server
 * that stops answering (SIGSTOP), one that is down, the loop let go with
 * commands in flight, the script cache flushed.
 *
 *   kv_async memory
 *   kv_async redis REDIS_URL SERVICES_SH STATE_DIR
 *
 * SERVICES_SH and STATE_DIR are scripts/services.sh and the directory of
 * the servers it started, whose Redis the fault tests stop and start.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "idem/libevent.h"
#include "store/store.h"
#include "testlib.h"

#define N 100

static const char *kv_kind = "memory";
static const char *redis_url, *services_sh, *state_dir;

static int is_redis(void) { return strcmp(kv_kind, "redis") == 0; }

static idem *open_kv(int64_t timeout_ms)
{
    idem_options o;
    idem_options_init(&o);
    o.path = ":memory:";
    o.redis_url = redis_url;
    o.timeout_ms = timeout_ms;
    idem *h = NULL;
    assert_idem_ok(idem__open_parts(&o, kv_kind, "sqlite", &h));
    return h;
}

/* A test's handle and loop. */
struct fix {
    idem *h;
    struct event_base *base;
    idem_loop *loop;
};

static int setup(void **state)
{
    if (is_redis())
        test_wipe_servers(redis_url, NULL);
    struct fix *f = calloc(1, sizeof *f);
    f->h = open_kv(0);
    f->base = event_base_new();
    f->loop = idem_libevent_new(f->base);
    assert_non_null(f->loop);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fix *f = *state;
    if (f->h) {
        idem_loop_detach(f->h, f->loop);
        idem_close(f->h);
    }
    idem_libevent_free(f->loop);
    event_base_free(f->base);
    free(f);
    return 0;
}

/* Run the loop until *count reaches want, or ms have passed. */
static void run_until(struct fix *f, const int *count, int want, int64_t ms)
{
    int64_t end = test_mono_ms() + ms;
    while (*count < want && test_mono_ms() < end) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(f->base, &tv);
        event_base_dispatch(f->base);
    }
}

/* What one call's callback was given, and how often it ran. */
struct answer {
    int *count;
    int calls;       /* times the callback ran */
    int returned;    /* the call had returned by then */
    int early;       /* the callback ran before the call returned */
    idem_rc rc;
    idem_outcome out;
    idem_lock_info info;
    char spent_key[IDEM_KEY_MAX + 1];
    char detail[256];
};

static void note(struct answer *a, idem_rc rc, idem_outcome out, const char *detail)
{
    if (!a->returned)
        a->early = 1;
    a->calls++;
    a->rc = rc;
    a->out = out;
    snprintf(a->detail, sizeof a->detail, "%s", detail ? detail : "(null)");
    (*a->count)++;
}

static void on_outcome(void *arg, idem_rc rc, idem_outcome out, const char *detail)
{
    note(arg, rc, out, detail);
}

static void on_spend(void *arg, idem_rc rc, idem_outcome out, const char *spent_key,
                     const char *detail)
{
    struct answer *a = arg;
    snprintf(a->spent_key, sizeof a->spent_key, "%s", spent_key ? spent_key : "(null)");
    note(a, rc, out, detail);
}

static void on_lock(void *arg, idem_rc rc, idem_outcome out, const idem_lock_info *info,
                    const char *detail)
{
    struct answer *a = arg;
    if (info)
        a->info = *info;
    note(a, rc, out, detail);
}

static void on_token(void *arg, idem_rc rc, const char *token, const char *detail)
{
    struct answer *a = arg;
    /* The token rides in spent_key: both are strings the callback copies. */
    snprintf(a->spent_key, sizeof a->spent_key, "%s", token ? token : "(null)");
    note(a, rc, IDEM_NONE, detail);
}

static void answer_init(struct answer *a, int n, int *count)
{
    memset(a, 0, (size_t)n * sizeof *a);
    for (int i = 0; i < n; i++)
        a[i].count = count;
    *count = 0;
}

/* Each of the n callbacks ran once, after its call returned. */
static void assert_each_once(const struct answer *a, int n)
{
    for (int i = 0; i < n; i++) {
        if (a[i].calls != 1)
            fail_msg("call %d: its callback ran %d times", i, a[i].calls);
        assert_false(a[i].early);
    }
}

/* One asynchronous call made and waited for. */
static struct answer acquire(struct fix *f, const char *key, const char *owner, int64_t ttl)
{
    int count;
    struct answer a;
    answer_init(&a, 1, &count);
    assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", key, owner, ttl, on_lock,
                                           &a));
    a.returned = 1;
    run_until(f, &count, 1, 10000);
    assert_each_once(&a, 1);
    return a;
}

static struct answer renew_or_release(struct fix *f, const char *key, const char *owner,
                                      int64_t ttl)
{
    int count;
    struct answer a;
    answer_init(&a, 1, &count);
    if (ttl)
        assert_idem_ok(idem_lock_renew_async(f->h, f->loop, "orders", key, owner, ttl,
                                             on_outcome, &a));
    else
        assert_idem_ok(idem_lock_release_async(f->h, f->loop, "orders", key, owner,
                                               on_outcome, &a));
    a.returned = 1;
    run_until(f, &count, 1, 10000);
    assert_each_once(&a, 1);
    return a;
}

#define assert_answer(a, want_out)                                                 \
    do {                                                                           \
        if ((a).rc != IDEM_OK)                                                     \
            fail_msg("%s: %s", idem_errname((a).rc), (a).detail);                  \
        assert_outcome((a).out, want_out);                                         \
    } while (0)

/* ---- locks ---- */

/* 100 acquires of one key from one loop, all in flight at once: one is
 * ACQUIRED, the 99 others BUSY and told who holds it. */
static void test_lock_storm(void **state)
{
    struct fix *f = *state;
    static struct answer a[N];
    int count;
    char owner[N][16];
    answer_init(a, N, &count);
    for (int i = 0; i < N; i++) {
        snprintf(owner[i], sizeof owner[i], "worker-%d", i);
        assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", "R-1", owner[i],
                                               30000, on_lock, &a[i]));
        a[i].returned = 1;
    }
    assert_int_equal(count, 0);
    run_until(f, &count, N, 10000);
    assert_each_once(a, N);
    int winner = -1, busy = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(a[i].rc, IDEM_OK);
        if (a[i].out == IDEM_ACQUIRED) {
            assert_int_equal(winner, -1);
            winner = i;
            assert_true(a[i].info.fence > 0);
            assert_int_equal(a[i].info.ttl_left_ms, 30000);
        } else {
            assert_outcome(a[i].out, IDEM_BUSY);
            busy++;
        }
    }
    assert_true(winner >= 0);
    assert_int_equal(busy, N - 1);
    for (int i = 0; i < N; i++)
        if (i != winner) {
            assert_string_equal(a[i].info.holder, owner[winner]);
            assert_true(a[i].info.ttl_left_ms > 0 && a[i].info.ttl_left_ms <= 30000);
        }

    struct answer r = renew_or_release(f, "R-1", owner[winner], 0);
    assert_answer(r, IDEM_RELEASED);
    r = renew_or_release(f, "R-1", owner[winner], 0);
    assert_answer(r, IDEM_NOT_HELD);
}

/* Renew extends the holder's lock only; an acquire by the holder keeps its
 * fence; after a release another owner gets a greater fence. */
static void test_lock_renew(void **state)
{
    struct fix *f = *state;
    struct answer a = acquire(f, "R-2", "alice", 1000);
    assert_answer(a, IDEM_ACQUIRED);
    uint64_t fence = a.info.fence;
    struct answer r = renew_or_release(f, "R-2", "bob", 5000);
    assert_answer(r, IDEM_NOT_HELD);
    r = renew_or_release(f, "R-2", "alice", 60000);
    assert_answer(r, IDEM_RENEWED);
    struct answer b = acquire(f, "R-2", "bob", 1000);
    assert_answer(b, IDEM_BUSY);
    assert_string_equal(b.info.holder, "alice");
    assert_true(b.info.ttl_left_ms > 1000); /* the renewal's 60 s, not the first 1 s */
    a = acquire(f, "R-2", "alice", 1000);
    assert_answer(a, IDEM_ACQUIRED);
    assert_true(a.info.fence == fence);
    r = renew_or_release(f, "R-2", "alice", 0);
    assert_answer(r, IDEM_RELEASED);
    r = renew_or_release(f, "R-2", "alice", 5000);
    assert_answer(r, IDEM_NOT_HELD);
    b = acquire(f, "R-2", "bob", 1000);
    assert_answer(b, IDEM_ACQUIRED);
    assert_true(b.info.fence > fence);
}

/* The blocking and the asynchronous calls act on the same locks. */
static void test_lock_blocking_agrees(void **state)
{
    struct fix *f = *state;
    idem_outcome out;
    idem_lock_info info;
    struct answer a = acquire(f, "R-3", "alice", 30000);
    assert_answer(a, IDEM_ACQUIRED);
    assert_idem_ok(idem_lock_acquire(f->h, "orders", "R-3", "bob", 30000, &out, &info));
    assert_outcome(out, IDEM_BUSY);
    assert_string_equal(info.holder, "alice");
    assert_idem_ok(idem_lock_renew(f->h, "orders", "R-3", "alice", 30000, &out));
    assert_outcome(out, IDEM_RENEWED);
    assert_idem_ok(idem_lock_release(f->h, "orders", "R-3", "alice", &out));
    assert_outcome(out, IDEM_RELEASED);
    struct answer b = acquire(f, "R-3", "bob", 30000);
    assert_answer(b, IDEM_ACQUIRED);
    assert_true(b.info.fence > a.info.fence);
    struct answer r = renew_or_release(f, "R-3", "alice", 0);
    assert_answer(r, IDEM_NOT_HELD);
    assert_idem_ok(idem_lock_acquire(f->h, "orders", "R-3", "bob", 30000, &out, &info));
    assert_outcome(out, IDEM_ACQUIRED);
    assert_true(info.fence == b.info.fence);
}

/* ---- tokens ---- */

/* 100 consumes of one token, each for another business key, in flight at
 * once: one CONSUMED, 99 ALREADY_CONSUMED naming the winner's key. Given
 * back, the token is spent once more, blocking. */
static void test_token_storm(void **state)
{
    struct fix *f = *state;
    char token[IDEM_TOKEN_LEN + 1];
    assert_idem_ok(idem_token_issue(f->h, "user-1", "checkout", 60000, token));
    static struct answer a[N];
    int count;
    char biz[N][16];
    answer_init(a, N, &count);
    for (int i = 0; i < N; i++) {
        snprintf(biz[i], sizeof biz[i], "order-%d", i);
        assert_idem_ok(idem_token_consume_async(f->h, f->loop, "user-1", "checkout", token,
                                                biz[i], on_spend, &a[i]));
        a[i].returned = 1;
    }
    assert_int_equal(count, 0);
    run_until(f, &count, N, 10000);
    assert_each_once(a, N);
    int winner = -1;
    for (int i = 0; i < N; i++) {
        assert_int_equal(a[i].rc, IDEM_OK);
        if (a[i].out == IDEM_CONSUMED) {
            assert_int_equal(winner, -1);
            winner = i;
            assert_string_equal(a[i].spent_key, "");
        }
    }
    assert_true(winner >= 0);
    for (int i = 0; i < N; i++)
        if (i != winner) {
            assert_outcome(a[i].out, IDEM_ALREADY_CONSUMED);
            assert_string_equal(a[i].spent_key, biz[winner]);
        }

    /* Given back for another key: nothing; for the winner's: restored. */
    struct answer g[2];
    answer_init(g, 2, &count);
    assert_idem_ok(idem_token_give_back_async(f->h, f->loop, "user-1", "checkout", token,
                                              biz[(winner + 1) % N], on_outcome, &g[0]));
    g[0].returned = 1;
    assert_idem_ok(idem_token_give_back_async(f->h, f->loop, "user-1", "checkout", token,
                                              biz[winner], on_outcome, &g[1]));
    g[1].returned = 1;
    run_until(f, &count, 2, 10000);
    assert_each_once(g, 2);
    assert_answer(g[0], IDEM_UNKNOWN);
    assert_answer(g[1], IDEM_RESTORED);
    idem_outcome out;
    char spent[IDEM_KEY_MAX + 1];
    assert_idem_ok(idem_token_consume(f->h, "user-1", "checkout", token, "order-again", &out,
                                      spent));
    assert_outcome(out, IDEM_CONSUMED);

    /* A token never issued, or another subject's, is UNKNOWN. */
    struct answer u[2];
    answer_init(u, 2, &count);
    assert_idem_ok(idem_token_consume_async(f->h, f->loop, "user-1", "checkout",
                                            "no-such-token", NULL, on_spend, &u[0]));
    u[0].returned = 1;
    assert_idem_ok(idem_token_consume_async(f->h, f->loop, "user-2", "checkout", token,
                                            NULL, on_spend, &u[1]));
    u[1].returned = 1;
    run_until(f, &count, 2, 10000);
    assert_each_once(u, 2);
    assert_answer(u[0], IDEM_UNKNOWN);
    assert_answer(u[1], IDEM_UNKNOWN);
}

/* Tokens issued on the loop: each one fresh, IDEM_TOKEN_LEN characters,
 * and spent once by the blocking call as any issued token is; a scene's
 * tokens_per_scene (16) newest are kept, so the first of 20 issued is
 * gone. */
static void test_token_issue(void **state)
{
    struct fix *f = *state;
    enum { ISSUED = 20 };
    static struct answer a[ISSUED];
    int count;
    answer_init(a, ISSUED, &count);
    for (int i = 0; i < ISSUED; i++) {
        char subject[16] = "user-9";
        assert_idem_ok(idem_token_issue_async(f->h, f->loop, subject, "checkout", 60000,
                                              on_token, &a[i]));
        a[i].returned = 1;
        memset(subject, 'x', sizeof subject - 1); /* the call copied it */
    }
    assert_int_equal(count, 0);
    run_until(f, &count, ISSUED, 10000);
    assert_each_once(a, ISSUED);
    for (int i = 0; i < ISSUED; i++) {
        assert_idem_ok(a[i].rc);
        assert_string_equal(a[i].detail, "");
        assert_int_equal(strlen(a[i].spent_key), IDEM_TOKEN_LEN);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(a[i].spent_key, a[j].spent_key);
    }
    idem_outcome out;
    assert_idem_ok(idem_token_consume(f->h, "user-9", "checkout", a[ISSUED - 1].spent_key,
                                      NULL, &out, NULL));
    assert_outcome(out, IDEM_CONSUMED);
    assert_idem_ok(idem_token_consume(f->h, "user-9", "checkout", a[ISSUED - 1].spent_key,
                                      NULL, &out, NULL));
    assert_outcome(out, IDEM_ALREADY_CONSUMED);
    assert_idem_ok(idem_token_consume(f->h, "user-9", "checkout", a[0].spent_key, NULL, &out,
                                      NULL));
    assert_outcome(out, IDEM_UNKNOWN);
    assert_idem_ok(idem_token_consume(f->h, "user-2", "checkout", a[ISSUED - 2].spent_key,
                                      NULL, &out, NULL));
    assert_outcome(out, IDEM_UNKNOWN);
}

/* ---- the callback rule ---- */

/* Input the blocking calls refuse is refused here too, with IDEM_EINVAL
 * and its detail, and no callback ever runs; so are a NULL loop or cb. */
static void test_bad_input_no_callback(void **state)
{
    struct fix *f = *state;
    int count;
    struct answer a;
    answer_init(&a, 1, &count);
    idem_loop bad_version = {f->loop->ops, f->loop->loop};
    struct idem_loop_ops ops = *f->loop->ops;
    ops.version = 99;
    bad_version.ops = &ops;
#define REFUSED(call, what)                                                       \
    do {                                                                          \
        assert_int_equal(call, IDEM_EINVAL);                                      \
        if (!strstr(idem_errdetail(), what))                                      \
            fail_msg("%s: detail %s", #call, idem_errdetail());                   \
    } while (0)
    REFUSED(idem_lock_acquire_async(NULL, f->loop, "orders", "k", "o", 1000, on_lock, &a),
            "handle");
    REFUSED(idem_lock_acquire_async(f->h, NULL, "orders", "k", "o", 1000, on_lock, &a),
            "loop");
    REFUSED(idem_lock_acquire_async(f->h, &bad_version, "orders", "k", "o", 1000, on_lock, &a),
            "loop");
    REFUSED(idem_lock_acquire_async(f->h, f->loop, "orders", "k", "o", 1000, NULL, &a), "cb");
    REFUSED(idem_lock_acquire_async(f->h, f->loop, "bad space", "k", "o", 1000, on_lock, &a),
            "space");
    REFUSED(idem_lock_acquire_async(f->h, f->loop, "orders", "k\n", "o", 1000, on_lock, &a),
            "key");
    REFUSED(idem_lock_acquire_async(f->h, f->loop, "orders", "k", "", 1000, on_lock, &a),
            "owner");
    REFUSED(idem_lock_acquire_async(f->h, f->loop, "orders", "k", "o", 0, on_lock, &a),
            "ttl_ms");
    REFUSED(idem_lock_renew_async(f->h, f->loop, "orders", "k", "o", IDEM_DAY_MS + 1,
                                  on_outcome, &a),
            "ttl_ms");
    REFUSED(idem_lock_release_async(f->h, f->loop, "orders", NULL, "o", on_outcome, &a),
            "key");
    REFUSED(idem_token_consume_async(f->h, f->loop, "u\t", "checkout", "t", NULL, on_spend, &a),
            "subject");
    REFUSED(idem_token_consume_async(f->h, f->loop, "u", "checkout", NULL, NULL, on_spend, &a),
            "token");
    REFUSED(idem_token_give_back_async(f->h, f->loop, "u", "check out", "t", "b", on_outcome,
                                       &a),
            "scene");
    REFUSED(idem_token_give_back_async(f->h, f->loop, "u", "checkout", "t", "b\x01",
                                       on_outcome, &a),
            "biz_key");
    REFUSED(idem_token_issue_async(NULL, f->loop, "u", "checkout", 1000, on_token, &a),
            "handle");
    REFUSED(idem_token_issue_async(f->h, f->loop, "u\n", "checkout", 1000, on_token, &a),
            "subject");
    REFUSED(idem_token_issue_async(f->h, f->loop, "u", "check out", 1000, on_token, &a),
            "scene");
    REFUSED(idem_token_issue_async(f->h, f->loop, "u", "checkout", 0, on_token, &a), "ttl_ms");
    REFUSED(idem_token_issue_async(f->h, f->loop, "u", "checkout", 8 * IDEM_DAY_MS, on_token,
                                   &a),
            "ttl_ms");
    REFUSED(idem_token_issue_async(f->h, NULL, "u", "checkout", 1000, on_token, &a), "loop");
    REFUSED(idem_token_issue_async(f->h, f->loop, "u", "checkout", 1000, NULL, &a), "cb");
#undef REFUSED
    run_until(f, &count, 1, 200);
    assert_int_equal(count, 0);
}

/* The arguments are copied: the caller's strings may change at once. Each
 * callback runs once, and not again however long the loop runs on. */
static void test_arguments_copied_callback_once(void **state)
{
    struct fix *f = *state;
    int count;
    struct answer a[2];
    answer_init(a, 2, &count);
    char key[16] = "R-copy", owner[16] = "alice";
    assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", key, owner, 30000, on_lock,
                                           &a[0]));
    a[0].returned = 1;
    memset(key, 'x', sizeof key - 1);
    memset(owner, 'y', sizeof owner - 1);
    assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", "R-copy", "bob", 30000,
                                           on_lock, &a[1]));
    a[1].returned = 1;
    run_until(f, &count, 2, 10000);
    run_until(f, &count, 3, 300);
    assert_int_equal(count, 2);
    assert_each_once(a, 2);
    assert_answer(a[0], IDEM_ACQUIRED);
    assert_answer(a[1], IDEM_BUSY);
    assert_string_equal(a[1].info.holder, "alice");
}

/* Calls from another thread for the test's loop: their callbacks run on
 * the loop's thread. */
struct other {
    struct fix *f;
    struct answer a[N];
    pthread_t loop_thread;
    int wrong_thread;
};

static struct other *other_of;

static void on_lock_check_thread(void *arg, idem_rc rc, idem_outcome out,
                                 const idem_lock_info *info, const char *detail)
{
    if (!pthread_equal(pthread_self(), other_of->loop_thread))
        other_of->wrong_thread = 1;
    on_lock(arg, rc, out, info, detail);
}

static void *other_main(void *arg)
{
    struct other *o = arg;
    char owner[16];
    for (int i = 0; i < N; i++) {
        snprintf(owner, sizeof owner, "t-%d", i);
        idem_rc rc = idem_lock_acquire_async(o->f->h, o->f->loop, "orders", "R-thread", owner,
                                             30000, on_lock_check_thread, &o->a[i]);
        if (rc != IDEM_OK)
            o->a[i].early = 1; /* counted as a failure below */
        o->a[i].returned = 1;
    }
    return NULL;
}

static void test_calls_from_another_thread(void **state)
{
    struct fix *f = *state;
    static struct other o;
    int count;
    memset(&o, 0, sizeof o);
    o.f = f;
    o.loop_thread = pthread_self();
    other_of = &o;
    answer_init(o.a, N, &count);
    /* The answers are marked returned before the loop below runs them:
     * the thread has finished each call before it is joined. */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_main, &o), 0);
    pthread_join(t, NULL);
    run_until(f, &count, N, 10000);
    assert_each_once(o.a, N);
    assert_false(o.wrong_thread);
    int acquired = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(o.a[i].rc, IDEM_OK);
        acquired += o.a[i].out == IDEM_ACQUIRED;
    }
    assert_int_equal(acquired, 1);
}

/* Let go before the loop ever ran: every call still has its callback once,
 * when the adapter runs what was posted. */
static void test_detach_before_running(void **state)
{
    struct fix *f = *state;
    static struct answer a[N];
    int count;
    answer_init(a, N, &count);
    char owner[16];
    for (int i = 0; i < N; i++) {
        snprintf(owner, sizeof owner, "o-%d", i);
        assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", "R-detach", owner,
                                               30000, on_lock, &a[i]));
        a[i].returned = 1;
    }
    idem_loop_detach(f->h, f->loop);
    idem_libevent_drain(f->loop);
    assert_int_equal(count, N);
    assert_each_once(a, N);
    int acquired = 0;
    for (int i = 0; i < N; i++) {
        if (a[i].rc == IDEM_OK)
            acquired += a[i].out == IDEM_ACQUIRED;
        else
            assert_int_equal(a[i].rc, IDEM_ECLOSING); /* Redis: never sent */
    }
    assert_true(acquired <= 1);
    if (!is_redis())
        assert_int_equal(acquired, 1);
}

/* ---- Redis's faults ---- */

static pid_t redis_pid(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/redis/redis.pid", state_dir);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    long pid = 0;
    assert_int_equal(fscanf(fp, "%ld", &pid), 1);
    fclose(fp);
    return (pid_t)pid;
}

static void services(const char *what)
{
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "'%s' %s '%s'", services_sh, what, state_dir);
    assert_int_equal(system(cmd), 0);
}

/* host:port of the test's Redis, as the details name it. */
static const char *redis_where(void)
{
    static char where[128];
    const char *p = strstr(redis_url, "//") + 2;
    snprintf(where, sizeof where, "%.*s", (int)strcspn(p, "/"), p);
    return where;
}

/* A Redis that stops answering: each call in flight answers ETIMEDOUT (it
 * may have run) about timeout_ms after it was sent; once Redis answers
 * again, so do new calls. A call never waits for Redis itself: the token
 * issues among them return at once (run blocking, each would take
 * timeout_ms on the loop's thread). */
static void test_redis_stopped_times_out(void **state)
{
    struct fix *f = *state;
    idem_close(f->h);
    f->h = open_kv(500);
    struct answer a = acquire(f, "R-warm", "alice", 30000); /* the loop's connection */
    assert_answer(a, IDEM_ACQUIRED);

    pid_t pid = redis_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    static struct answer s[10];
    int count;
    answer_init(s, 10, &count);
    int64_t t0 = test_mono_ms();
    for (int i = 0; i < 10; i++) {
        if (i % 2)
            assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", "R-stopped", "bob",
                                                   30000, on_lock, &s[i]));
        else
            assert_idem_ok(idem_token_issue_async(f->h, f->loop, "bob", "checkout", 30000,
                                                  on_token, &s[i]));
        s[i].returned = 1;
    }
    int64_t calls_took = test_mono_ms() - t0;
    if (calls_took > 250)
        fail_msg("the calls took %lld ms to return: one waited for Redis",
                 (long long)calls_took);
    run_until(f, &count, 10, 10000);
    int64_t took = test_mono_ms() - t0;
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_each_once(s, 10);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(s[i].rc, IDEM_ETIMEDOUT);
        assert_non_null(strstr(s[i].detail, "no reply within 500 ms"));
        assert_non_null(strstr(s[i].detail, redis_where()));
        assert_outcome(s[i].out, IDEM_NONE);
        if (i % 2 == 0)
            assert_string_equal(s[i].spent_key, ""); /* no token on an error */
    }
    /* About timeout_ms: not before it, nor many times it. */
    if (took < 450 || took > 5000)
        fail_msg("the calls answered after %lld ms (timeout_ms 500)", (long long)took);

    a = acquire(f, "R-after", "carol", 30000);
    assert_answer(a, IDEM_ACQUIRED);
}

/* A Redis that is down: a call fails at once with EUNAVAILABLE naming
 * host:port and the cause; within the backoff the next fails at once
 * without trying; once Redis is back (and the backoff over), calls work. */
static void test_redis_down_unavailable(void **state)
{
    struct fix *f = *state;
    struct answer a = acquire(f, "R-warm", "alice", 30000);
    assert_answer(a, IDEM_ACQUIRED);
    services("redis-stop");
    a = acquire(f, "R-down", "alice", 30000);
    assert_int_equal(a.rc, IDEM_EUNAVAILABLE);
    assert_non_null(strstr(a.detail, redis_where()));
    assert_non_null(strstr(a.detail, "connecting"));
    struct answer b = acquire(f, "R-down", "alice", 30000);
    assert_int_equal(b.rc, IDEM_EUNAVAILABLE);
    assert_non_null(strstr(b.detail, redis_where()));
    services("redis-start");
    /* The backoff is at most 1 s: within a few, the loop is connected. */
    int64_t end = test_mono_ms() + 5000;
    do {
        usleep(100 * 1000);
        a = acquire(f, "R-back", "alice", 30000);
    } while (a.rc == IDEM_EUNAVAILABLE && test_mono_ms() < end);
    assert_answer(a, IDEM_ACQUIRED);
}

/* The loop let go with commands sent and unanswered (Redis stopped) and
 * more not yet sent: each callback runs once, with ECLOSING. */
static void test_redis_detach_in_flight(void **state)
{
    struct fix *f = *state;
    struct answer w = acquire(f, "R-warm", "alice", 30000);
    assert_answer(w, IDEM_ACQUIRED);
    pid_t pid = redis_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    static struct answer a[40];
    int count;
    answer_init(a, 40, &count);
    for (int i = 0; i < 20; i++) {
        assert_idem_ok(idem_lock_acquire_async(f->h, f->loop, "orders", "R-gone", "bob",
                                               30000, on_lock, &a[i]));
        a[i].returned = 1;
    }
    run_until(f, &count, 1, 100); /* sent, and waiting */
    for (int i = 20; i < 40; i++) {
        assert_idem_ok(idem_token_consume_async(f->h, f->loop, "u", "checkout", "t", NULL,
                                                on_spend, &a[i]));
        a[i].returned = 1;
    }
    assert_int_equal(count, 0);
    idem_loop_detach(f->h, f->loop);
    idem_libevent_drain(f->loop);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_each_once(a, 40);
    for (int i = 0; i < 40; i++) {
        assert_int_equal(a[i].rc, IDEM_ECLOSING);
        assert_non_null(strstr(a[i].detail, redis_where()));
    }
    /* Detached twice: nothing. The loop can be used again afresh. */
    idem_loop_detach(f->h, f->loop);
    struct answer b = acquire(f, "R-again", "alice", 30000);
    assert_answer(b, IDEM_ACQUIRED);
}

/* Closing the handle with commands in flight: the same, ECLOSING each. */
static void test_redis_close_in_flight(void **state)
{
    struct fix *f = *state;
    pid_t pid = redis_pid();
    assert_int_equal(kill(pid, SIGSTOP), 0);
    static struct answer a[10];
    int count;
    answer_init(a, 10, &count);
    for (int i = 0; i < 10; i++) {
        assert_idem_ok(idem_lock_renew_async(f->h, f->loop, "orders", "R-close", "bob", 30000,
                                             on_outcome, &a[i]));
        a[i].returned = 1;
    }
    run_until(f, &count, 1, 100);
    idem_close(f->h);
    f->h = NULL;
    idem_libevent_drain(f->loop);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_each_once(a, 10);
    for (int i = 0; i < 10; i++)
        assert_int_equal(a[i].rc, IDEM_ECLOSING);
}

/* The script cache flushed under the loop's connection: the calls still
 * answer, and right. */
static void test_redis_script_flush(void **state)
{
    struct fix *f = *state;
    struct answer a = acquire(f, "R-flush", "alice", 30000);
    assert_answer(a, IDEM_ACQUIRED);
    test_redis_command(redis_url, "SCRIPT FLUSH");
    struct answer b = acquire(f, "R-flush", "bob", 30000);
    assert_answer(b, IDEM_BUSY);
    assert_string_equal(b.info.holder, "alice");
    struct answer r = renew_or_release(f, "R-flush", "alice", 0);
    assert_answer(r, IDEM_RELEASED);
}

/* A URL naming another database: the loop's connection SELECTs it before
 * its first command, so its locks are that database's, as the blocking
 * calls' are. */
static void test_redis_select_db(void **state)
{
    struct fix *f = *state;
    char url[512];
    snprintf(url, sizeof url, "%.*s/1", (int)(strrchr(redis_url, '/') - redis_url), redis_url);
    test_wipe_servers(url, NULL);
    idem_options o;
    idem_options_init(&o);
    o.path = ":memory:";
    o.redis_url = url;
    idem *h1 = NULL;
    assert_idem_ok(idem__open_parts(&o, "redis", "sqlite", &h1));
    idem *h0 = f->h;
    f->h = h1;
    struct answer a = acquire(f, "R-db", "alice", 30000);
    assert_answer(a, IDEM_ACQUIRED);
    idem_outcome out;
    idem_lock_info info;
    assert_idem_ok(idem_lock_acquire(h1, "orders", "R-db", "bob", 30000, &out, &info));
    assert_outcome(out, IDEM_BUSY);
    assert_string_equal(info.holder, "alice");
    assert_idem_ok(idem_lock_acquire(h0, "orders", "R-db", "bob", 30000, &out, &info));
    assert_outcome(out, IDEM_ACQUIRED); /* database 0 is another store */
    idem_loop_detach(h1, f->loop);
    idem_close(h1);
    f->h = h0;
    test_wipe_servers(url, NULL);
}

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s memory\n"
                    "       %s redis REDIS_URL SERVICES_SH STATE_DIR\n", argv0, argv0);
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "memory")) {
        kv_kind = "memory";
    } else if (argc == 5 && !strcmp(argv[1], "redis")) {
        kv_kind = "redis";
        redis_url = argv[2];
        services_sh = argv[3];
        state_dir = argv[4];
    } else {
        return usage(argv[0]);
    }
    evthread_use_pthreads();
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_lock_storm),
        T(test_lock_renew),
        T(test_lock_blocking_agrees),
        T(test_token_storm),
        T(test_token_issue),
        T(test_bad_input_no_callback),
        T(test_arguments_copied_callback_once),
        T(test_calls_from_another_thread),
        T(test_detach_before_running),
    };
    const struct CMUnitTest redis_tests[] = {
        T(test_redis_stopped_times_out),
        T(test_redis_down_unavailable),
        T(test_redis_detach_in_flight),
        T(test_redis_close_in_flight),
        T(test_redis_script_flush),
        T(test_redis_select_db),
    };
#undef T
    int failed = _cmocka_run_group_tests(kv_kind, tests, sizeof tests / sizeof tests[0],
                                         NULL, NULL);
    if (is_redis())
        failed += _cmocka_run_group_tests("redis faults", redis_tests,
                                          sizeof redis_tests / sizeof redis_tests[0], NULL,
                                          NULL);
    return failed ? 1 : 0;
}
