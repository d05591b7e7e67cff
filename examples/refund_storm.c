/* SPDX-License-Identifier: Apache-2.0 */
/*
 * refund_storm.c — what libidem is for, in one program.
 *
 * A refund service receives the same refund request 100 times at once (a
 * double click, a gateway retry, a queue redelivery, all together). Each
 * request runs the three layers: it takes the business-key lock, claims the
 * record, and only the claimant "pays out". Everyone else gets the first
 * result. Then a late retry arrives, after the lock is long gone: the record
 * alone turns it away.
 *
 *   refund_storm [SQLITE-FILE]     default: refund_storm.db in the current dir
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "idem.h"

#define REQUESTS 100

static idem *h;
static atomic_int payouts;           /* executions of the business effect */
static atomic_int answers[8];        /* by outcome class, for the summary */

static const char refund_no[] = "R-2026-11-0042";

/* The business effect that must happen once: money leaves. */
static int pay_out(char *receipt, size_t cap)
{
    int n = atomic_fetch_add(&payouts, 1) + 1;
    return snprintf(receipt, cap, "{\"refund_no\":\"%s\",\"paid\":\"100.00\",\"payout\":%d}",
                    refund_no, n);
}

static void *handle_request(void *arg)
{
    char owner[32], receipt[128];
    idem_outcome o;
    idem_record rec;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    const char body[] = "{\"refund_no\":\"R-2026-11-0042\",\"amount\":\"100.00\"}";
    snprintf(owner, sizeof owner, "request-%d", (int)(intptr_t)arg);
    idem_fingerprint(body, strlen(body), fp);

    /* Layer 2: queue concurrent duplicates on the business key. */
    idem_lock_info lock;
    for (;;) {
        if (idem_lock_acquire(h, "refund", refund_no, owner, 30000, &o, &lock) != IDEM_OK)
            return NULL;
        if (o == IDEM_ACQUIRED)
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL); /* the holder's turn */
    }

    /* Layer 3: the record decides, even when the lock did not help. */
    if (idem_record_begin(h, "refund", refund_no, fp, owner, 30000, &o, &rec) == IDEM_OK) {
        if (o == IDEM_NEW || o == IDEM_TAKEN_OVER) {
            int n = pay_out(receipt, sizeof receipt);
            idem_record_complete(h, "refund", refund_no, rec.epoch, receipt, (size_t)n, 0, &o);
            atomic_fetch_add(&answers[0], 1);
        } else if (o == IDEM_DONE) {
            atomic_fetch_add(&answers[1], 1); /* replayed rec.result */
        } else {
            atomic_fetch_add(&answers[2], 1);
        }
        idem_record_clear(&rec);
    }
    idem_lock_release(h, "refund", refund_no, owner, &o);
    return NULL;
}

int main(int argc, char **argv)
{
    idem_options opts;
    idem_options_init(&opts);
    opts.path = argc > 1 ? argv[1] : "refund_storm.db";
    if (idem_open(&opts, &h) != IDEM_OK) {
        fprintf(stderr, "refund_storm: %s\n", idem_errdetail());
        return 1;
    }
    int before = 0;
    idem_outcome o;
    idem_record rec;
    if (idem_record_get(h, "refund", refund_no, &o, &rec) == IDEM_OK && o == IDEM_FOUND) {
        printf("(%s already holds this refund from an earlier run: every request replays)\n",
               opts.path);
        before = 1;
        idem_record_clear(&rec);
    }

    pthread_t t[REQUESTS];
    for (int i = 0; i < REQUESTS; i++)
        pthread_create(&t[i], NULL, handle_request, (void *)(intptr_t)i);
    for (int i = 0; i < REQUESTS; i++)
        pthread_join(t[i], NULL);

    printf("%d concurrent requests for refund %s:\n", REQUESTS, refund_no);
    printf("  executed   %d\n  replayed   %d\n  other      %d\n", atomic_load(&answers[0]),
           atomic_load(&answers[1]), atomic_load(&answers[2]));
    printf("  payouts    %d  (money left the account this many times)\n",
           atomic_load(&payouts));

    /* A late retry: no lock stands in its way, the record does. */
    if (idem_record_begin(h, "refund", refund_no, NULL, "late-retry", 30000, &o, &rec) == IDEM_OK)
        printf("late retry: %s, replayed %.*s\n", idem_outcome_name(o), (int)rec.result_len,
               (const char *)rec.result);
    idem_record_clear(&rec);
    idem_close(h);
    return atomic_load(&payouts) == (before ? 0 : 1) ? 0 : 1;
}
