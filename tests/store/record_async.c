/* SPDX-License-Identifier: Apache-2.0 */
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
 * The operators' calls too: transition (one APPLIED of 100 at once, the
 * rest ALREADY), delete (one APPLIED of 100 at one epoch), list (pages and
 * their cursors), purge (its count).
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
#include <unistd.h>

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
    int applied, already, conflicts, not_found;
    char last_current[IDEM_NAME_MAX + 1];
    uint64_t last_current_epoch;
    idem_record_page page;  /* the last page listed, kept */
    unsigned last_count;
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
    idem_record_page_clear(&f->page);
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

static void tally(struct fixture *f, idem_outcome out)
{
    f->applied += out == IDEM_APPLIED;
    f->already += out == IDEM_ALREADY;
    f->conflicts += out == IDEM_CONFLICT;
    f->not_found += out == IDEM_NOT_FOUND;
}

static void on_transition(void *arg, idem_rc rc, idem_outcome out, const char *current,
                          const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, out, detail);
    tally(f, out);
    snprintf(f->last_current, sizeof f->last_current, "%s", current ? current : "(null)");
}

static void on_delete(void *arg, idem_rc rc, idem_outcome out, const char *current,
                      uint64_t current_epoch, const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, out, detail);
    tally(f, out);
    snprintf(f->last_current, sizeof f->last_current, "%s", current ? current : "(null)");
    f->last_current_epoch = current_epoch;
}

static void on_page(void *arg, idem_rc rc, idem_record_page *page, const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, IDEM_NONE, detail);
    idem_record_page_clear(&f->page);
    f->page = *page; /* kept: zeroed, so the library frees nothing */
    memset(page, 0, sizeof *page);
}

static void on_count(void *arg, idem_rc rc, unsigned count, const char *detail)
{
    struct fixture *f = arg;
    answered(f, rc, IDEM_NONE, detail);
    f->last_count = count;
}

/* A finished record (space, key), made by the blocking calls: its epoch. */
static uint64_t finished(struct fixture *f, const char *space, const char *key,
                         int64_t retention_ms)
{
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(f->h, space, key, NULL, "maker", 30000, &o, &rec));
    assert_int_equal(o, IDEM_NEW);
    uint64_t epoch = rec.epoch;
    idem_record_clear(&rec);
    assert_idem_ok(idem_record_complete(f->h, space, key, epoch, "ok", 2, retention_ms, &o));
    assert_int_equal(o, IDEM_COMPLETED);
    return epoch;
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

/* An operator's action on a claim as it read it (fail_seen): a claim that
 * moved on since is CONFLICT, as a plain fail's is, but not counted among
 * the conflicts the alerts watch; a delete fenced on the version read is
 * refused once the record is written again, and goes at the version that
 * stands. */
static void test_seen_actions(void **state)
{
    struct fixture *f = *state;
    uint64_t epoch = finished(f, "pay", "seen-1", 0);
    idem_stats before, after;
    idem_get_stats(f->h, &before);
    assert_idem_ok(idem_record_fail_seen_async(f->h, f->loop, "pay", "seen-1", epoch,
                                               IDEM_FAIL_RETRYABLE, NULL, 0, 0, on_outcome, f));
    f->calls_returned++;
    run_until(f, 1);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    idem_get_stats(f->h, &after);
    assert_int_equal(after.conflicts, before.conflicts);
    assert_idem_ok(idem_record_fail_async(f->h, f->loop, "pay", "seen-1", epoch,
                                          IDEM_FAIL_RETRYABLE, NULL, 0, 0, on_outcome, f));
    f->calls_returned++;
    run_until(f, 2);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    idem_get_stats(f->h, &after);
    assert_int_equal(after.conflicts, before.conflicts + 1);

    /* Read at one version, written since at the same epoch: not deleted. */
    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_get(f->h, "pay", "seen-1", &o, &rec));
    int64_t seen = rec.updated_ms;
    idem_record_clear(&rec);
    assert_int_equal(idem_record_delete_seen_async(f->h, f->loop, "pay", "seen-1", epoch, 0,
                                                   on_delete, f),
                     IDEM_EINVAL);
    usleep(2000);
    assert_idem_ok(idem_record_transition(f->h, "pay", "seen-1", IDEM_STATE_SUCCEEDED, "SHIPPED",
                                          &o, NULL));
    assert_int_equal(o, IDEM_APPLIED);
    assert_idem_ok(idem_record_delete_seen_async(f->h, f->loop, "pay", "seen-1", epoch, seen,
                                                 on_delete, f));
    f->calls_returned++;
    run_until(f, 3);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    assert_string_equal(f->last_current, "SHIPPED");
    assert_idem_ok(idem_record_get(f->h, "pay", "seen-1", &o, &rec));
    assert_int_equal(o, IDEM_FOUND);
    assert_idem_ok(idem_record_delete_seen_async(f->h, f->loop, "pay", "seen-1", epoch,
                                                 rec.updated_ms, on_delete, f));
    idem_record_clear(&rec);
    f->calls_returned++;
    run_until(f, 4);
    assert_int_equal(f->last_out, IDEM_APPLIED);
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


/* ---- the operators' calls ---- */

static void transition(struct fixture *f, const char *key, const char *from, const char *to)
{
    char copy[3][IDEM_KEY_MAX + 1];
    snprintf(copy[0], sizeof copy[0], "%s", key);
    snprintf(copy[1], sizeof copy[1], "%s", from);
    snprintf(copy[2], sizeof copy[2], "%s", to);
    assert_idem_ok(idem_record_transition_async(f->h, f->loop, "ship", copy[0], copy[1],
                                                copy[2], on_transition, f));
    f->calls_returned++;
    memset(copy, 'x', sizeof copy); /* the call copied them */
}

/* APPLIED, then ALREADY; CONFLICT naming the state that refused it;
 * NOT_FOUND; and 100 at once from one state to another: one APPLIED, 99
 * ALREADY. */
static void test_transition(void **state)
{
    struct fixture *f = *state;
    finished(f, "ship", "o-1", 0);
    transition(f, "o-1", IDEM_STATE_SUCCEEDED, "SHIPPED");
    run_until(f, 1);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->last_out, IDEM_APPLIED);
    assert_string_equal(f->last_current, "");
    transition(f, "o-1", IDEM_STATE_SUCCEEDED, "SHIPPED");
    run_until(f, 2);
    assert_int_equal(f->last_out, IDEM_ALREADY);
    assert_string_equal(f->last_current, "");
    transition(f, "o-1", "PAID", "REFUNDED");
    run_until(f, 3);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    assert_string_equal(f->last_current, "SHIPPED");
    transition(f, "none", "PAID", "REFUNDED");
    run_until(f, 4);
    assert_int_equal(f->last_out, IDEM_NOT_FOUND);
    assert_string_equal(f->last_current, "");

    f->answered = f->calls_returned = f->applied = f->already = f->conflicts = 0;
    for (int i = 0; i < N; i++)
        transition(f, "o-1", "SHIPPED", "DELIVERED");
    run_until(f, N);
    assert_int_equal(f->applied, 1);
    assert_int_equal(f->already, N - 1);
    assert_int_equal(f->conflicts, 0);

    /* The blocking call sees the same record. */
    idem_outcome o;
    char current[IDEM_NAME_MAX + 1];
    assert_idem_ok(idem_record_transition(f->h, "ship", "o-1", "SHIPPED", "DELIVERED", &o,
                                          current));
    assert_int_equal(o, IDEM_ALREADY);
}

static void delete(struct fixture *f, const char *key, uint64_t epoch)
{
    assert_idem_ok(idem_record_delete_async(f->h, f->loop, "ship", key, epoch, on_delete, f));
    f->calls_returned++;
}

/* CONFLICT at another epoch, or while PROCESSING, naming what stands;
 * APPLIED at the record's epoch; NOT_FOUND after; and of 100 at one epoch
 * at once, one APPLIED. */
static void test_delete(void **state)
{
    struct fixture *f = *state;
    uint64_t epoch = finished(f, "ship", "d-1", 0);
    delete(f, "d-1", epoch + 1);
    run_until(f, 1);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    assert_string_equal(f->last_current, IDEM_STATE_SUCCEEDED);
    assert_true(f->last_current_epoch == epoch);
    delete(f, "d-1", epoch);
    run_until(f, 2);
    assert_int_equal(f->last_out, IDEM_APPLIED);
    assert_string_equal(f->last_current, "");
    assert_true(f->last_current_epoch == 0);
    delete(f, "d-1", epoch);
    run_until(f, 3);
    assert_int_equal(f->last_out, IDEM_NOT_FOUND);

    idem_outcome o;
    idem_record rec;
    assert_idem_ok(idem_record_begin(f->h, "ship", "d-2", NULL, "w", 30000, &o, &rec));
    delete(f, "d-2", rec.epoch);
    run_until(f, 4);
    assert_int_equal(f->last_out, IDEM_CONFLICT);
    assert_string_equal(f->last_current, IDEM_STATE_PROCESSING);
    assert_true(f->last_current_epoch == rec.epoch);
    idem_record_clear(&rec);

    epoch = finished(f, "ship", "d-3", 0);
    f->answered = f->calls_returned = f->applied = f->conflicts = f->not_found = 0;
    for (int i = 0; i < N; i++)
        delete(f, "d-3", epoch);
    run_until(f, N);
    assert_int_equal(f->applied, 1);
    assert_int_equal(f->not_found, N - 1);
    assert_idem_ok(idem_record_get(f->h, "ship", "d-3", &o, NULL));
    assert_int_equal(o, IDEM_NOT_FOUND);
}

/* Pages of a listing follow one another by their cursors, newest first,
 * each row once; the query's strings are copied; the blocking call lists
 * the same. */
static void test_list(void **state)
{
    struct fixture *f = *state;
    enum { ROWS = 7 };
    for (int i = 0; i < ROWS; i++) {
        char key[16];
        snprintf(key, sizeof key, "l-%d", i);
        finished(f, "ls", key, 0);
    }
    finished(f, "ls", "other", 0);
    char seen[ROWS] = {0};
    char cursor[IDEM_CURSOR_MAX + 1] = "";
    int pages = 0;
    do {
        char space[8] = "ls", prefix[8] = "l-", st[16] = IDEM_STATE_SUCCEEDED;
        char cur[IDEM_CURSOR_MAX + 1];
        snprintf(cur, sizeof cur, "%s", cursor);
        idem_record_query q = {.space = space, .key_prefix = prefix, .state = st, .limit = 3,
                               .cursor = cur};
        assert_idem_ok(idem_record_list_async(f->h, f->loop, &q, on_page, f));
        f->calls_returned++;
        memset(space, 'x', sizeof space - 1);
        memset(prefix, 'x', sizeof prefix - 1);
        memset(st, 'x', sizeof st - 1);
        memset(cur, 'x', sizeof cur - 1);
        memset(&q, 0, sizeof q);
        run_until(f, ++pages);
        assert_idem_ok(f->last_rc);
        assert_string_equal(f->last_detail, "");
        assert_int_equal(f->page.count, pages < 3 ? 3 : 1);
        for (size_t i = 0; i < f->page.count; i++) {
            const idem_record_item *it = &f->page.items[i];
            int n = -1;
            assert_int_equal(sscanf(it->key, "l-%d", &n), 1);
            assert_true(n >= 0 && n < ROWS);
            assert_false(seen[n]);
            seen[n] = 1;
            assert_string_equal(it->state, IDEM_STATE_SUCCEEDED);
            assert_int_equal(it->result_len, 2);
            if (i > 0) {
                const idem_record_item *prev = &f->page.items[i - 1];
                assert_true(prev->created_ms > it->created_ms ||
                            (prev->created_ms == it->created_ms &&
                             strcmp(prev->key, it->key) > 0));
            }
        }
        snprintf(cursor, sizeof cursor, "%s", f->page.next_cursor);
    } while (*cursor && pages < 10);
    assert_int_equal(pages, 3);
    for (int i = 0; i < ROWS; i++)
        assert_true(seen[i]);

    /* The first page, as the blocking call lists it. */
    idem_record_query q = {.space = "ls", .key_prefix = "l-", .limit = 3};
    idem_record_page page;
    assert_idem_ok(idem_record_list(f->h, &q, &page));
    assert_idem_ok(idem_record_list_async(f->h, f->loop, &q, on_page, f));
    f->calls_returned++;
    run_until(f, 4);
    assert_int_equal(f->page.count, page.count);
    for (size_t i = 0; i < page.count; i++)
        assert_string_equal(f->page.items[i].key, page.items[i].key);
    assert_string_equal(f->page.next_cursor, page.next_cursor);
    idem_record_page_clear(&page);

    /* A space with nothing in it: an empty last page. */
    q = (idem_record_query){.space = "empty"};
    assert_idem_ok(idem_record_list_async(f->h, f->loop, &q, on_page, f));
    f->calls_returned++;
    run_until(f, 5);
    assert_idem_ok(f->last_rc);
    assert_int_equal(f->page.count, 0);
    assert_string_equal(f->page.next_cursor, "");
}

/* Records whose retention ran out go, counted; limit bounds a purge;
 * limit 0 purges nothing and is still answered. */
static void test_purge(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i < 5; i++) {
        char key[16];
        snprintf(key, sizeof key, "p-%d", i);
        finished(f, "pg", key, 1);
    }
    finished(f, "pg", "kept", 0);
    usleep(20000); /* past their 1 ms */
    unsigned limits[] = {0, 3, 100, 100};
    unsigned want[] = {0, 3, 2, 0};
    for (int i = 0; i < 4; i++) {
        assert_idem_ok(idem_record_purge_async(f->h, f->loop, limits[i], on_count, f));
        f->calls_returned++;
        run_until(f, i + 1);
        assert_idem_ok(f->last_rc);
        assert_int_equal(f->last_count, want[i]);
    }
    idem_outcome o;
    assert_idem_ok(idem_record_get(f->h, "pg", "kept", &o, NULL));
    assert_int_equal(o, IDEM_FOUND);
}

/* Input the blocking calls refuse is refused at once, and no callback
 * ever comes. */
static void test_admin_refused_without_callback(void **state)
{
    struct fixture *f = *state;
#define REFUSED(call, what)                                                       \
    do {                                                                          \
        assert_int_equal(call, IDEM_EINVAL);                                      \
        if (!strstr(idem_errdetail(), what))                                      \
            fail_msg("%s: detail %s", #call, idem_errdetail());                   \
    } while (0)
    REFUSED(idem_record_transition_async(f->h, f->loop, "ship", "k", IDEM_STATE_PROCESSING,
                                         "X", on_transition, f),
            "PROCESSING");
    REFUSED(idem_record_transition_async(f->h, f->loop, "ship", "k", "A", "B C",
                                         on_transition, f),
            "to");
    REFUSED(idem_record_transition_async(f->h, f->loop, "ship", "k", "A", "B", NULL, f), "cb");
    REFUSED(idem_record_transition_async(f->h, NULL, "ship", "k", "A", "B", on_transition, f),
            "loop");
    REFUSED(idem_record_delete_async(f->h, f->loop, "ship", "k", 0, on_delete, f), "epoch");
    REFUSED(idem_record_delete_async(f->h, f->loop, "ship", "", 1, on_delete, f), "key");
    REFUSED(idem_record_delete_async(NULL, f->loop, "ship", "k", 1, on_delete, f), "handle");
    REFUSED(idem_record_delete_async(f->h, f->loop, "ship", "k", 1, NULL, f), "cb");
    idem_record_query q = {.space = "ship", .cursor = "c1.12.zz"};
    REFUSED(idem_record_list_async(f->h, f->loop, &q, on_page, f), "cursor");
    q = (idem_record_query){.space = "ship", .cursor = "not-a-cursor"};
    REFUSED(idem_record_list_async(f->h, f->loop, &q, on_page, f), "cursor");
    q = (idem_record_query){.space = "ship", .limit = IDEM_LIST_LIMIT_MAX + 1};
    REFUSED(idem_record_list_async(f->h, f->loop, &q, on_page, f), "limit");
    q = (idem_record_query){.space = NULL};
    REFUSED(idem_record_list_async(f->h, f->loop, &q, on_page, f), "space");
    REFUSED(idem_record_list_async(f->h, f->loop, NULL, on_page, f), "query");
    q = (idem_record_query){.space = "ship"};
    REFUSED(idem_record_list_async(f->h, f->loop, &q, NULL, f), "cb");
    REFUSED(idem_record_purge_async(NULL, f->loop, 10, on_count, f), "handle");
    REFUSED(idem_record_purge_async(f->h, f->loop, 10, NULL, f), "cb");
    REFUSED(idem_record_purge_async(f->h, NULL, 10, on_count, f), "loop");
#undef REFUSED
    /* The blocking forms refuse the same. */
    idem_outcome o;
    idem_record_page page;
    q = (idem_record_query){.space = "ship", .cursor = "c1.12.zz"};
    assert_int_equal(idem_record_list(f->h, &q, &page), IDEM_EINVAL);
    assert_int_equal(idem_record_delete(f->h, "ship", "k", 0, &o, NULL, NULL), IDEM_EINVAL);
    struct timeval tv = {0, 100000};
    event_base_loopexit(f->base, &tv);
    event_base_dispatch(f->base);
    assert_int_equal(f->answered, 0);
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
        cmocka_unit_test_setup_teardown(test_seen_actions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_without_callback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_detach_with_calls_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transition, setup, teardown),
        cmocka_unit_test_setup_teardown(test_delete, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_purge, setup, teardown),
        cmocka_unit_test_setup_teardown(test_admin_refused_without_callback, setup, teardown),
    };
    int failed = cmocka_run_group_tests_name(store, tests, NULL, NULL);
    test_rmdir(tmpdir);
    return failed;
}
