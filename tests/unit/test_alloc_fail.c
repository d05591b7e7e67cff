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
#include <semaphore.h>
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

/* An async begin (of a finished record: reading its result allocates) and
 * complete: a refused allocation fails the call (and done never runs) or, on
 * the writer thread, fn's record call (and done gets its error, once). */
struct async_wait {
    sem_t done;
    atomic_int runs;
    idem_rc rc;
    char detail[256];
};

static idem_rc async_begin_complete(idem *h, void *arg)
{
    (void)arg;
    idem_outcome o;
    idem_record r;
    idem_rc rc = idem_record_begin(h, "s", "k", NULL, "me", 60000, &o, &r);
    if (rc == IDEM_OK)
        rc = idem_record_complete(h, "s", "k", r.epoch, "abc", 3, 0, &o);
    idem_record_clear(&r);
    return rc;
}

static void async_done(void *arg, idem_rc rc, const char *detail)
{
    struct async_wait *w = arg;
    w->rc = rc;
    snprintf(w->detail, sizeof w->detail, "%s", detail);
    atomic_fetch_add(&w->runs, 1);
    sem_post(&w->done);
}

static idem_rc call_async(idem *h)
{
    struct async_wait w = {.rc = IDEM_OK};
    sem_init(&w.done, 0, 0);
    idem_rc rc = idem_record_async(h, async_begin_complete, async_done, &w);
    int queued = rc == IDEM_OK;
    if (queued) {
        while (sem_wait(&w.done) != 0)
            ;
        rc = w.rc;
        if (rc != IDEM_OK) /* the writer's detail, told on this thread */
            rc = idem__fail(rc, "%s", w.detail);
    }
    sem_destroy(&w.done);
    if (atomic_load(&w.runs) != queued)
        fail_msg("record_async: done ran %d times, queued %d", atomic_load(&w.runs), queued);
    return rc;
}

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
    {"record_async_new", prep_none, call_async},
    {"record_async_done", prep_done, call_async},
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
