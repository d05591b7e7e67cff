/* SPDX-License-Identifier: Apache-2.0 */
/* The record state machine's one transition function; see record_state.c. */
#ifndef IDEM_RECORD_STATE_H
#define IDEM_RECORD_STATE_H

#include "idem.h"
#include "store/store.h"

enum idem__rec_event {
    IDEM__EV_BEGIN,
    IDEM__EV_COMPLETE,
    IDEM__EV_FAIL_FINAL,
    IDEM__EV_FAIL_RETRYABLE,
    IDEM__EV_TRANSITION,
    IDEM__EV_EXTEND,
};

struct idem__rec_event_args {
    enum idem__rec_event kind;
    const char *space, *key;
    int64_t now;
    /* begin */
    const uint8_t *fingerprint;
    const char *owner;
    int64_t lease_ms;
    /* complete, fail, extend (with lease_ms) */
    uint64_t epoch;
    const void *result;
    size_t result_len;
    int64_t retention_ms;
    /* transition */
    const char *from, *to;
};

enum idem__rec_action {
    IDEM__ACT_ANSWER, /* nothing to write: answer `outcome` */
    IDEM__ACT_INSERT, /* try to create the record (begin) */
    IDEM__ACT_CAS,    /* try the conditional update `cas`; answer `outcome`
                         if it is made, else decide again on the row read */
};

struct idem__rec_decision {
    enum idem__rec_action action;
    idem_outcome outcome;
    struct idem__rec_new insert;
    struct idem__rec_cas cas;
};

/* Decide what an event does to a record. cur is the row as last read in one
 * atomic step with a failed insert or update; NULL before any read (the
 * first decision, made without looking, because only the store's constraint
 * and conditions may decide); found says whether that read found a row. */
void idem__record_decide(const struct idem__rec_event_args *ev,
                         const idem_record *cur, int found,
                         struct idem__rec_decision *d);

#endif
