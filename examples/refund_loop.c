/* SPDX-License-Identifier: Apache-2.0 */
/*
 * refund_loop.c — libidem on an event loop, no thread waiting on a store.
 *
 * The same refund request arrives 100 times at once on one libevent loop.
 * Each begins the refund's record with idem_record_begin_async(); the one
 * that gets NEW "pays out" and completes the record; those that come after
 * are answered from it. Every answer comes back to the loop, the callback
 * rule of idem/loop.h: a call that returns IDEM_OK calls back exactly once,
 * on the loop's thread, after it has returned.
 *
 *   refund_loop [SQLITE-FILE]     default: refund_loop.db in the current dir
 *
 * Build: cc refund_loop.c $(pkg-config --cflags --libs idem libevent_pthreads)
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <stdio.h>
#include <string.h>

#include "idem.h"
#include "idem/libevent.h"

#define REQUESTS 100

static const char refund_no[] = "R-2026-12-0007";

static idem *h;
static idem_loop *loop;
static struct event_base *base;
static int answered, payouts, replays, in_flight, failed;

struct request {
    int n;
    char owner[32];
};
static struct request requests[REQUESTS + 1];

static void on_completed(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    (void)arg;
    if (rc != IDEM_OK || o != IDEM_COMPLETED) {
        fprintf(stderr, "complete: %s %s\n", idem_strerror(rc), detail);
        failed++;
    }
    answered++;
}

static void on_begun(void *arg, idem_rc rc, idem_outcome o, idem_record *rec, const char *detail)
{
    struct request *r = arg;
    if (rc != IDEM_OK) {
        fprintf(stderr, "request %d: %s: %s\n", r->n, idem_strerror(rc), detail);
        failed++;
        answered++;
        return;
    }
    switch (o) {
    case IDEM_NEW:
    case IDEM_TAKEN_OVER: {
        /* The business effect, once; then the record keeps its answer. */
        char receipt[96];
        int len = snprintf(receipt, sizeof receipt, "{\"refund_no\":\"%s\",\"paid\":\"100.00\"}",
                           refund_no);
        payouts++;
        if (idem_record_complete_async(h, loop, "refund", refund_no, rec->epoch, receipt,
                                       (size_t)len, 0, on_completed, r) != IDEM_OK) {
            fprintf(stderr, "complete: %s\n", idem_errdetail());
            failed++;
            answered++;
        }
        return; /* answered once complete calls back */
    }
    case IDEM_DONE:
        replays++; /* rec->result holds the receipt */
        break;
    case IDEM_IN_PROGRESS:
        in_flight++; /* a client would be told 409, and retry */
        break;
    default:
        failed++;
    }
    answered++;
}

static void begin(struct request *r)
{
    if (idem_record_begin_async(h, loop, "refund", refund_no, NULL, r->owner, 30000, on_begun,
                                r) != IDEM_OK) {
        fprintf(stderr, "begin: %s\n", idem_errdetail());
        failed++;
        answered++;
    }
}

static void run_until(int want)
{
    while (answered < want && !failed)
        event_base_loop(base, EVLOOP_ONCE);
}

int main(int argc, char **argv)
{
    idem_options opts;
    idem_options_init(&opts);
    opts.path = argc > 1 ? argv[1] : "refund_loop.db";
    if (idem_open(&opts, &h) != IDEM_OK) {
        fprintf(stderr, "idem_open: %s\n", idem_errdetail());
        return 1;
    }
    evthread_use_pthreads(); /* the store's writer posts to the loop */
    base = event_base_new();
    loop = base ? idem_libevent_new(base) : NULL;
    if (!loop) {
        fprintf(stderr, "no event loop\n");
        return 1;
    }

    /* 100 at once: one pays, the others find it in flight. */
    for (int i = 0; i < REQUESTS; i++) {
        requests[i].n = i;
        snprintf(requests[i].owner, sizeof requests[i].owner, "request-%d", i);
        begin(&requests[i]);
    }
    run_until(REQUESTS);
    /* A late retry, once the refund is done: its stored answer. */
    requests[REQUESTS].n = REQUESTS;
    snprintf(requests[REQUESTS].owner, sizeof requests[REQUESTS].owner, "late-retry");
    begin(&requests[REQUESTS]);
    run_until(REQUESTS + 1);

    printf("requests   %d\npayouts    %d \nin flight  %d\nreplays    %d\nfailed     %d\n",
           REQUESTS + 1, payouts, in_flight, replays, failed);
    idem_loop_detach(h, loop);
    idem_libevent_free(loop);
    event_base_free(base);
    idem_close(h);
    return payouts == 1 && replays == 1 && !failed ? 0 : 1;
}
