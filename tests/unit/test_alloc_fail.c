/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_alloc_fail.c — every public call survives a failed allocation at each
 * of its allocations: it returns IDEM_ENOMEM (or IDEM_OK where the failure
 * only cost an optimisation, such as a hash table that could not grow) with a
 * detail, does not crash, and leaks nothing: after idem_close() every block
 * Idem allocated has been freed.
 *
 * The allocator installed with idem_set_allocator() counts live blocks and
 * fails the n-th allocation after it is armed; each scenario is run with n =
 * 1, 2, ... until a run makes fewer than n allocations.
 */
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "testlib.h"

static atomic_long live;        /* blocks allocated and not yet freed */
static atomic_long since_armed; /* allocations since arming */
static atomic_long fail_at;     /* 0: never fail */
static atomic_int failed;       /* an allocation was refused */

static void *counting_malloc(size_t n)
{
    long at = atomic_load(&fail_at);
    long k = atomic_fetch_add(&since_armed, 1) + 1;
    if (at && k == at) {
        atomic_store(&failed, 1);
        return NULL;
    }
    void *p = malloc(n);
    if (p)
        atomic_fetch_add(&live, 1);
    return p;
}

static void counting_free(void *p)
{
    if (p)
        atomic_fetch_sub(&live, 1);
    free(p);
}

static void arm(long n)
{
    atomic_store(&since_armed, 0);
    atomic_store(&failed, 0);
    atomic_store(&fail_at, n);
}

static void disarm(void)
{
    atomic_store(&fail_at, 0);
}

static idem *open_mem(void)
{
    idem_options o;
    idem_options_init(&o);
    o.path = ":memory:";
    o.clock = test_clock;
    idem *h = NULL;
    assert_idem_ok(idem_open(&o, &h));
    return h;
}

/* A scenario: prepare state on h (not counted), then the call under test. */
struct scenario {
    const char *name;
    void (*prepare)(idem *h);
    idem_rc (*call)(idem *h);
};

static char tok[IDEM_TOKEN_LEN + 1];
static uint64_t epoch;

static void prep_none(idem *h) { (void)h; }

static void prep_token(idem *h)
{
    assert_idem_ok(idem_token_issue(h, "u", "form", 60000, tok));
}

static void prep_spent_token(idem *h)
{
    idem_outcome o;
    prep_token(h);
    assert_idem_ok(idem_token_consume(h, "u", "form", tok, "K", &o, NULL));
}

static void prep_lock(idem *h)
{
    idem_outcome o;
    assert_idem_ok(idem_lock_acquire(h, "s", "k", "me", 60000, &o, NULL));
}

static void prep_processing(idem *h)
{
    idem_outcome o;
    idem_record r;
    assert_idem_ok(idem_record_begin(h, "s", "k", NULL, "me", 60000, &o, &r));
    epoch = r.epoch;
    idem_record_clear(&r);
}

static void prep_done(idem *h)
{
    idem_outcome o;
    prep_processing(h);
    assert_idem_ok(idem_record_complete(h, "s", "k", epoch, "result-bytes", 12, 0, &o));
}

static idem_rc call_issue(idem *h)
{
    char t[IDEM_TOKEN_LEN + 1];
    return idem_token_issue(h, "u", "form", 60000, t);
}

static idem_rc call_consume(idem *h)
{
    idem_outcome o;
    return idem_token_consume(h, "u", "form", tok, "K", &o, NULL);
}

static idem_rc call_give_back(idem *h)
{
    idem_outcome o;
    return idem_token_give_back(h, "u", "form", tok, "K", &o);
}

static idem_rc call_acquire(idem *h)
{
    idem_outcome o;
    return idem_lock_acquire(h, "s", "k2", "me", 60000, &o, NULL);
}

static idem_rc call_release(idem *h)
{
    idem_outcome o;
    return idem_lock_release(h, "s", "k", "me", &o);
}

static idem_rc call_watchdog(idem *h)
{
    idem_watch *w;
    idem_rc rc = idem_watchdog_start(h, "s", "k", "me", 60000, NULL, NULL, &w);
    if (rc == IDEM_OK)
        idem_watchdog_stop(w);
    return rc;
}

static idem_rc call_begin(idem *h)
{
    idem_outcome o;
    idem_record r;
    idem_rc rc = idem_record_begin(h, "s", "k", NULL, "other", 60000, &o, &r);
    idem_record_clear(&r);
    return rc;
}

static idem_rc call_complete(idem *h)
{
    idem_outcome o;
    return idem_record_complete(h, "s", "k", epoch, "abc", 3, 0, &o);
}

static idem_rc call_get(idem *h)
{
    idem_outcome o;
    idem_record r;
    idem_rc rc = idem_record_get(h, "s", "k", &o, &r);
    idem_record_clear(&r);
    return rc;
}

static idem_rc call_transition(idem *h)
{
    idem_outcome o;
    return idem_record_transition(h, "s", "k", "SUCCEEDED", "REFUNDED", &o, NULL);
}

static idem_rc call_inbox(idem *h)
{
    idem_outcome o;
    idem_inbox_entry e;
    idem_rc rc = idem_inbox_begin(h, "g", "m", NULL, 60000, 3, &o, &e);
    if (rc == IDEM_OK)
        rc = idem_inbox_done(h, "g", "m", e.attempts, &o);
    return rc;
}

static idem_rc call_purge(idem *h)
{
    unsigned n;
    return idem_record_purge(h, 10, &n);
}

/* The asynchronous calls (idem/loop.h) on a loop of the test's own, whose
 * only operation the embedded store uses is post: a refused allocation
 * fails the call (and the callback never runs) or comes to the callback
 * (once). Each runs on a thread of its own, the loop's, which is gone
 * before the blocks are counted: the calls' blocks are pooled per thread
 * (core/alloc.h) and freed when it exits. */
struct tloop {
    idem_loop loop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    idem_loop_post *head, **tail;
};

static void tloop_post(void *arg, idem_loop_post *p)
{
    struct tloop *t = arg;
    pthread_mutex_lock(&t->mu);
    p->next = NULL;
    *t->tail = p;
    t->tail = &p->next;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void *tloop_io_new(void *loop, int fd, idem_loop_io_fn ready, void *arg)
{
    (void)loop, (void)fd, (void)ready, (void)arg;
    return NULL;
}
static int tloop_io_want(void *io, unsigned what) { (void)io, (void)what; return -1; }
static void tloop_io_free(void *io) { (void)io; }
static void *tloop_timer_new(void *loop, idem_loop_fn fire, void *arg)
{
    (void)loop, (void)fire, (void)arg;
    return NULL;
}
static int tloop_timer_set(void *timer, int64_t ms) { (void)timer, (void)ms; return -1; }
static void tloop_timer_free(void *timer) { (void)timer; }

static const struct idem_loop_ops tloop_ops = {
    .version = IDEM_LOOP_OPS_VERSION,
    .io_new = tloop_io_new, .io_want = tloop_io_want, .io_free = tloop_io_free,
    .timer_new = tloop_timer_new, .timer_set = tloop_timer_set, .timer_free = tloop_timer_free,
    .post = tloop_post,
};

/* Run what was posted; wait for a post when wait and there is none. */
static void tloop_run(struct tloop *t, int wait)
{
    pthread_mutex_lock(&t->mu);
    while (wait && !t->head)
        pthread_cond_wait(&t->cv, &t->mu);
    idem_loop_post *p = t->head;
    t->head = NULL;
    t->tail = &t->head;
    pthread_mutex_unlock(&t->mu);
    while (p) {
        idem_loop_post *next = p->next;
        p->fn(p->arg);
        p = next;
    }
}

struct async_case {
    idem *h;
    idem_rc (*start)(idem *h, idem_loop *loop, void *arg); /* the _async call */
    idem_rc call_rc;      /* what the call returned */
    int runs;             /* callbacks run */
    idem_rc rc;           /* what the callback was given */
    char detail[256];
};

static void answered(struct async_case *c, idem_rc rc, const char *detail)
{
    c->runs++;
    c->rc = rc;
    snprintf(c->detail, sizeof c->detail, "%s", detail);
}

static void on_record(void *arg, idem_rc rc, idem_outcome out, idem_record *rec,
                      const char *detail)
{
    (void)out, (void)rec;
    answered(arg, rc, detail);
}
static void on_outcome(void *arg, idem_rc rc, idem_outcome out, const char *detail)
{
    (void)out;
    answered(arg, rc, detail);
}
static void on_spend(void *arg, idem_rc rc, idem_outcome out, const char *spent,
                     const char *detail)
{
    (void)out, (void)spent;
    answered(arg, rc, detail);
}
static void on_token(void *arg, idem_rc rc, const char *token, const char *detail)
{
    (void)token;
    answered(arg, rc, detail);
}
static void on_transition(void *arg, idem_rc rc, idem_outcome out, const char *current,
                          const char *detail)
{
    (void)out, (void)current;
    answered(arg, rc, detail);
}
static void on_delete(void *arg, idem_rc rc, idem_outcome out, const char *current,
                      uint64_t current_epoch, const char *detail)
{
    (void)out, (void)current, (void)current_epoch;
    answered(arg, rc, detail);
}
static void on_page(void *arg, idem_rc rc, idem_record_page *page, const char *detail)
{
    (void)page; /* left to the library to clear */
    answered(arg, rc, detail);
}
static void on_count(void *arg, idem_rc rc, unsigned count, const char *detail)
{
    (void)count;
    answered(arg, rc, detail);
}

static idem_rc start_begin(idem *h, idem_loop *l, void *c)
{
    return idem_record_begin_async(h, l, "s", "k", NULL, "other", 60000, on_record, c);
}
static idem_rc start_complete(idem *h, idem_loop *l, void *c)
{
    return idem_record_complete_async(h, l, "s", "k", epoch, "abc", 3, 0, on_outcome, c);
}
static idem_rc start_get(idem *h, idem_loop *l, void *c)
{
    return idem_record_get_async(h, l, "s", "k", on_record, c);
}
static idem_rc start_transition(idem *h, idem_loop *l, void *c)
{
    return idem_record_transition_async(h, l, "s", "k", "SUCCEEDED", "REFUNDED", on_transition,
                                        c);
}
static idem_rc start_delete(idem *h, idem_loop *l, void *c)
{
    return idem_record_delete_async(h, l, "s", "k", epoch, on_delete, c);
}
static idem_rc start_list(idem *h, idem_loop *l, void *c)
{
    idem_record_query q = {.space = "s", .key_prefix = "k", .limit = 1};
    return idem_record_list_async(h, l, &q, on_page, c);
}
static idem_rc start_purge(idem *h, idem_loop *l, void *c)
{
    return idem_record_purge_async(h, l, 10, on_count, c);
}
static idem_rc start_issue(idem *h, idem_loop *l, void *c)
{
    return idem_token_issue_async(h, l, "u", "form", 60000, on_token, c);
}
static idem_rc start_consume(idem *h, idem_loop *l, void *c)
{
    return idem_token_consume_async(h, l, "u", "form", tok, "K", on_spend, c);
}
static void on_lock(void *arg, idem_rc rc, idem_outcome out, const idem_lock_info *info,
                    const char *detail)
{
    (void)out, (void)info;
    answered(arg, rc, detail);
}
static idem_rc start_acquire(idem *h, idem_loop *l, void *c)
{
    return idem_lock_acquire_async(h, l, "s", "k2", "me", 60000, on_lock, c);
}

/* The loop's thread: the call, its answer, the loop let go. */
static void *async_thread(void *arg)
{
    struct async_case *c = arg;
    struct tloop t = {.loop = {&tloop_ops, NULL}};
    t.loop.loop = &t;
    t.tail = &t.head;
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    c->call_rc = c->start(c->h, &t.loop, c);
    if (c->call_rc != IDEM_OK)
        snprintf(c->detail, sizeof c->detail, "%s", idem_errdetail());
    while (c->call_rc == IDEM_OK && c->runs == 0)
        tloop_run(&t, 1);
    idem_loop_detach(c->h, &t.loop);
    tloop_run(&t, 0);
    pthread_cond_destroy(&t.cv);
    pthread_mutex_destroy(&t.mu);
    return NULL;
}

static idem_rc run_async_case(idem *h, idem_rc (*start)(idem *, idem_loop *, void *))
{
    struct async_case c = {.h = h, .start = start};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, async_thread, &c), 0);
    pthread_join(th, NULL);
    int queued = c.call_rc == IDEM_OK;
    if (c.runs != queued)
        fail_msg("the callback ran %d times, the call returned %s", c.runs,
                 idem_errname(c.call_rc));
    idem_rc rc = queued ? c.rc : c.call_rc;
    /* The detail, on this thread, whichever way it came. */
    return rc == IDEM_OK ? IDEM_OK : idem__fail(rc, "%s", c.detail);
}

#define ASYNC_CALL(name)                                                       \
    static idem_rc call_##name##_async(idem *h) { return run_async_case(h, start_##name); }
ASYNC_CALL(begin)
ASYNC_CALL(complete)
ASYNC_CALL(get)
ASYNC_CALL(transition)
ASYNC_CALL(delete)
ASYNC_CALL(list)
ASYNC_CALL(purge)
ASYNC_CALL(issue)
ASYNC_CALL(consume)
ASYNC_CALL(acquire)
#undef ASYNC_CALL

static const struct scenario scenarios[] = {
    {"token_issue", prep_none, call_issue},
    {"token_consume", prep_token, call_consume},
    {"token_give_back", prep_spent_token, call_give_back},
    {"lock_acquire", prep_none, call_acquire},
    {"lock_release", prep_lock, call_release},
    {"watchdog_start", prep_lock, call_watchdog},
    {"record_begin_new", prep_none, call_begin},
    {"record_begin_in_progress", prep_processing, call_begin},
    {"record_begin_done", prep_done, call_begin},
    {"record_complete", prep_processing, call_complete},
    {"record_get", prep_done, call_get},
    {"record_transition", prep_done, call_transition},
    {"inbox_begin_done", prep_none, call_inbox},
    {"record_purge", prep_done, call_purge},
    {"record_begin_async_new", prep_none, call_begin_async},
    {"record_begin_async_done", prep_done, call_begin_async},
    {"record_complete_async", prep_processing, call_complete_async},
    {"record_get_async", prep_done, call_get_async},
    {"record_transition_async", prep_done, call_transition_async},
    {"record_delete_async", prep_done, call_delete_async},
    {"record_list_async", prep_done, call_list_async},
    {"record_purge_async", prep_done, call_purge_async},
    {"token_issue_async", prep_none, call_issue_async},
    {"token_consume_async", prep_token, call_consume_async},
    {"lock_acquire_async", prep_none, call_acquire_async},
};

static void test_each_allocation_of_each_call(void **state)
{
    (void)state;
    idem_set_allocator(counting_malloc, NULL, counting_free);
    for (size_t s = 0; s < sizeof scenarios / sizeof scenarios[0]; s++) {
        const struct scenario *sc = &scenarios[s];
        int refusals = 0;
        for (long n = 1;; n++) {
            idem *h = open_mem();
            sc->prepare(h);
            arm(n);
            idem_rc rc = sc->call(h);
            disarm();
            int hit = atomic_load(&failed);
            if (rc != IDEM_OK && rc != IDEM_ENOMEM)
                fail_msg("%s, allocation %ld refused: %s (%s)", sc->name, n, idem_errname(rc),
                         idem_errdetail());
            if (rc == IDEM_ENOMEM) {
                if (!hit)
                    fail_msg("%s: ENOMEM without a refused allocation", sc->name);
                if (!*idem_errdetail())
                    fail_msg("%s: ENOMEM without a detail", sc->name);
                refusals++;
            }
            /* The handle still works after the failure. */
            char t[IDEM_TOKEN_LEN + 1];
            assert_idem_ok(idem_token_issue(h, "after", "form", 1000, t));
            idem_close(h);
            if (atomic_load(&live) != 0)
                fail_msg("%s, allocation %ld refused: %ld blocks leaked", sc->name, n,
                         atomic_load(&live));
            if (!hit)
                break; /* the call made fewer than n allocations: all covered */
        }
        print_message("%-26s %d allocation(s) refused one at a time\n", sc->name, refusals);
    }
    idem_set_allocator(NULL, NULL, NULL);
}

static void test_open_under_failure(void **state)
{
    (void)state;
    idem_set_allocator(counting_malloc, NULL, counting_free);
    for (long n = 1;; n++) {
        idem_options o;
        idem_options_init(&o);
        o.path = ":memory:";
        idem *h = NULL;
        arm(n);
        idem_rc rc = idem_open(&o, &h);
        disarm();
        int hit = atomic_load(&failed);
        if (rc == IDEM_OK)
            assert_non_null(h);
        else {
            assert_int_equal(rc, IDEM_ENOMEM);
            assert_null(h);
        }
        idem_close(h);
        assert_int_equal(atomic_load(&live), 0);
        if (!hit)
            break;
    }
    idem_set_allocator(NULL, NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_allocation_of_each_call),
        cmocka_unit_test(test_open_under_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
