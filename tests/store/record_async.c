/*
 * record_async.c — the asynchronous record calls on a real libevent loop,
 * against a SQLite file or PostgreSQL:
 *
 *   record_async embedded
 *   record_async distributed REDIS_URL POSTGRES_URL
 *
 * What they promise: the blocking calls' answers (one NEW out of 100
 * concurrent begins, the rest IN_PROGRESS; DONE with the stored result
 * after complete), and the callback rule of idem/loop.h — an error returned
 * means no callback, IDEM_OK exactly one, on the loop's thread, after the
 * call returned; a loop detached with calls in flight gets every callback.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "idem.h"
#include "idem/libevent.h"
#include "testlib.h"

#define N 100

static const char *store = "embedded";
static const char *redis_url, *postgres_url;
static char *tmpdir;
static int file_seq;

struct fixture {
    idem *h;
    struct event_base *base;
    idem_loop *loop;
    pthread_t loop_thread;
    int answered, calls_returned;
    int news, in_progress, done, other;
    uint64_t epoch;
    idem_rc last_rc;
    idem_outcome last_out;
    idem_record last_rec;
    char last_detail[256];
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    idem_options o;
    idem_options_init(&o);
    char path[4200];
    if (!strcmp(store, "distributed")) {
        test_wipe_servers(redis_url, postgres_url);
        o.store = "distributed";
        o.redis_url = redis_url;
        o.postgres_url = postgres_url;
    } else {
        snprintf(path, sizeof path, "%s/r%d.db", tmpdir, ++file_seq);
        o.path = path;
    }
    assert_idem_ok(idem_open(&o, &f->h));
    f->base = event_base_new();
    assert_non_null(f->base);
    f->loop = idem_libevent_new(f->base);
    assert_non_null(f->loop);
    f->loop_thread = pthread_self();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    idem_loop_detach(f->h, f->loop);
    idem_libevent_free(f->loop);
    event_base_free(f->base);
    idem_record_clear(&f->last_rec);
    idem_close(f->h);
    free(f);
    return 0;
}

/* Run the loop until `want` callbacks came (or 30 s went). */
static void run_until(struct fixture *f, int want)
{
    for (int i = 0; i < 30000 && f->answered < want; i++) {
        struct timeval tv = {0, 1000};
        event_base_loopexit(f->base, &tv);
        event_base_dispatch(f->base);
    }
    assert_int_equal(f->answered, want);
}

static void answered(struct fixture *f, idem_rc rc, idem_outcome out, const char *detail)
{
    /* On the loop's thread, after the call returned. */
    assert_true(pthread_equal(pthread_self(), f->loop_thread));
    assert_true(f->calls_returned > f->answered);
    f->answered++;
    f->last_rc = rc;
    f->last_out = out;
    snprintf(f->last_detail, sizeof f->last_detail, "%s", detail ? detail : "(null)");
}

static void on_begin(void *arg, idem_rc rc, idem_outcome out, idem_record *rec,
                     const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, out, detail);
    assert_idem_ok(rc);
    if (out == IDEM_NEW) {
        f->news++;
        f->epoch = rec->epoch;
        assert_string_equal(rec->state, IDEM_STATE_PROCESSING);
    } else if (out == IDEM_IN_PROGRESS) {
        f->in_progress++;
        assert_string_equal(rec->owner, "winner");
    } else if (out == IDEM_DONE) {
        f->done++;
        idem_record_clear(&f->last_rec);
        f->last_rec = *rec; /* kept: zeroed, so the library frees nothing */
        memset(rec, 0, sizeof *rec);
    } else {
        f->other++;
    }
}

static void on_outcome(void *arg, idem_rc rc, idem_outcome out, const char *detail)
{
    answered(arg, rc, out, detail);
}

static void on_get(void *arg, idem_rc rc, idem_outcome out, idem_record *rec,
                   const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, out, detail);
    idem_record_clear(&f->last_rec);
    f->last_rec = *rec;
    memset(rec, 0, sizeof *rec);
}

static void begin(struct fixture *f, const char *key, const char *owner)
{
    assert_idem_ok(idem_record_begin_async(f->h, f->loop, "pay", key, NULL, owner, 30000,
                                           on_begin, f));
    f->calls_returned++;
}

/* 100 begins of one key in flight at once: one executes. */
static void test_one_of_100_begins(void **state)
{
    struct fixture *f = *state;
    begin(f, "order-1", "winner");
    run_until(f, 1);
    assert_int_equal(f->news, 1);
    for (int i = 0; i < N - 1; i++) {
        char owner[32];
        snprintf(owner, sizeof owner, "other-%d", i);
        begin(f, "order-1", owner);
    }
    run_until(f, N);
    assert_int_equal(f->news, 1);
    assert_int_equal(f->in_progress, N - 1);
    assert_int_equal(f->other, 0);

    /* And 100 on 100 keys at once: each is new. */
    f->answered = f->calls_returned = f->news = 0;
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "k-%d", i);
        begin(f, key, "winner");
    }
    run_until(f, N);
    assert_int_equal(f->news, N);
}

/* begin, extend, complete, then every begin is DONE with the result, as a
 * blocking call sees it too. */
static void test_claim_life(void **state)
{
    struct fixture *f = *state;
    begin(f, "order-2", "winner");
    run_until(f, 1);
    assert_int_equal(f->news, 1);
    uint64_t epoch = f->epoch;

    assert_idem_ok(idem_record_extend_async(f->h, f->loop, "pay", "order-2", epoch, 60000,
                                            on_outcome, f));
    f->calls_returned++;
    run_until(f, 2);
    assert_int_equal(f->last_out, IDEM_RENEWED);
    assert_idem_ok(idem_record_extend_async(f->h, f->loop, "pay", "order-2", epoch + 7, 60000,
                                            on_outcome, f));
    f->calls_returned++;
    run_until(f, 3);
    assert_int_equal(f->last_out, IDEM_CONFLICT);

    static const char result[] = "{\"refund\":\"r-2\"}";
    char copy[sizeof result];
    memcpy(copy, result, sizeof result);
    assert_idem_ok(idem_record_complete_async(f->h, f->loop, "pay", "order-2", epoch, copy,
                                              sizeof result - 1, 0, on_outcome, f));
    f->calls_returned++;
    memset(copy, 'x', sizeof copy); /* the call copied it */
    run_until(f, 4);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->last_out, IDEM_COMPLETED);

    begin(f, "order-2", "late");
    run_until(f, 5);
    assert_int_equal(f->done, 1);
    assert_string_equal(f->last_rec.state, IDEM_STATE_SUCCEEDED);
    assert_int_equal(f->last_rec.result_len, sizeof result - 1);
    assert_memory_equal(f->last_rec.result, result, sizeof result - 1);

    assert_idem_ok(idem_record_get_async(f->h, f->loop, "pay", "order-2", on_get, f));
    f->calls_returned++;
    run_until(f, 6);
    assert_int_equal(f->last_out, IDEM_FOUND);
    assert_int_equal(f->last_rec.epoch, epoch);
    assert_memory_equal(f->last_rec.result, result, sizeof result - 1);
    assert_idem_ok(idem_record_get_async(f->h, f->loop, "pay", "none", on_get, f));
    f->calls_returned++;
    run_until(f, 7);
    assert_int_equal(f->last_out, IDEM_NOT_FOUND);

    /* The blocking calls see the same record. */
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(f->h, "pay", "order-2", NULL, "blocking", 30000, &o, &rec));
    assert_int_equal(o, IDEM_DONE);
    assert_memory_equal(rec.result, result, sizeof result - 1);
    idem_record_clear(&rec);
}

/* fail(retryable) releases the claim: the next begin executes. */
static void test_fail_releases(void **state)
{
    struct fixture *f = *state;
    begin(f, "order-3", "winner");
    run_until(f, 1);
    assert_idem_ok(idem_record_fail_async(f->h, f->loop, "pay", "order-3", f->epoch,
                                          IDEM_FAIL_RETRYABLE, NULL, 0, 0, on_outcome, f));
    f->calls_returned++;
    run_until(f, 2);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->last_out, IDEM_COMPLETED);
    uint64_t first = f->epoch;
    begin(f, "order-3", "winner");
    run_until(f, 3);
    assert_int_equal(f->news, 2);
    assert_true(f->epoch > first);
}

/* An argument refused: the error at once, and no callback ever. */
static void test_refused_without_callback(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(idem_record_begin_async(f->h, f->loop, "pay", "", NULL, "o", 1000,
                                             on_begin, f),
                     IDEM_EINVAL);
    assert_int_equal(idem_record_begin_async(f->h, f->loop, "pay", "k", NULL, "o", 0, on_begin,
                                             f),
                     IDEM_EINVAL);
    assert_int_equal(idem_record_begin_async(f->h, NULL, "pay", "k", NULL, "o", 1000, on_begin,
                                             f),
                     IDEM_EINVAL);
    assert_int_equal(idem_record_complete_async(f->h, f->loop, "pay", "k", 0, NULL, 0, 0,
                                                on_outcome, f),
                     IDEM_EINVAL);
    assert_int_equal(idem_record_fail_async(f->h, f->loop, "pay", "k", 1, (idem_fail_mode)9,
                                            NULL, 0, 0, on_outcome, f),
                     IDEM_EINVAL);
    assert_int_equal(idem_record_get_async(f->h, f->loop, "pay", "k", NULL, f), IDEM_EINVAL);
    assert_non_null(strstr(idem_errdetail(), "cb"));
    /* Let the loop run a while: nothing comes. */
    struct timeval tv = {0, 100000};
    event_base_loopexit(f->base, &tv);
    event_base_dispatch(f->base);
    assert_int_equal(f->answered, 0);
}

/* Detached with calls in flight: every callback still comes, once. */
static void test_detach_with_calls_in_flight(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "d-%d", i);
        begin(f, key, "winner");
    }
    idem_loop_detach(f->h, f->loop); /* waits for the writers' answers */
    assert_int_equal(f->answered, 0); /* posted, not run */
    idem_libevent_drain(f->loop);
    assert_int_equal(f->answered, N);
    assert_int_equal(f->news, N);
}

int main(int argc, char **argv)
{
    if (argc >= 2)
        store = argv[1];
    if (!strcmp(store, "distributed")) {
        if (argc != 4) {
            fprintf(stderr, "usage: %s embedded | distributed REDIS_URL POSTGRES_URL\n",
                    argv[0]);
            return 2;
        }
        redis_url = argv[2];
        postgres_url = argv[3];
    }
    evthread_use_pthreads();
    tmpdir = test_mkdtemp();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_of_100_begins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claim_life, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fail_releases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_without_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_detach_with_calls_in_flight, setup, teardown),
    };
    int failed = cmocka_run_group_tests_name(store, tests, NULL, NULL);
    test_rmdir(tmpdir);
    return failed;
}
