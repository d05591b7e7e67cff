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
    IDEM__EV_STEP,          /* idem_record_step: a machine's event */
    IDEM__EV_STEP_COMPLETE, /* the step's claim kept: the key moves */
    IDEM__EV_STEP_RELEASE,  /* the step's claim given up: the key stays */
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
    /* transition (from, to); steps (to, and machine for a step) */
    const char *from, *to;
    const idem_machine *machine;
    /* An action on the claim as the caller read it (an operator's): a
     * CONFLICT is that view gone stale, not a claim taken over from under
     * its owner, and is neither alerted nor counted as a conflict. */
    int seen;
};

enum idem__rec_action {
    IDEM__ACT_ANSWER, /* nothing to write: answer `outcome` */
    IDEM__ACT_INSERT, /* try to create the record (begin) */
    IDEM__ACT_CAS,    /* try the conditional update `cas`; answer `outcome`
                         if it is made, else decide again on the row read */
    IDEM__ACT_READ,   /* read the row, and decide again on it */
};

struct idem__rec_decision {
    enum idem__rec_action action;
    idem_outcome outcome;
    struct idem__rec_new insert;
    struct idem__rec_cas cas;
    /* A step's update: the state it writes (cas.state points here), and
     * whether its result is the row's document with the step to ev->to and
     * ev->result added (idem__steps_compose; the drive makes it). */
    char state[IDEM_NAME_MAX + 1];
    int compose;
};

/* Decide what an event does to a record. cur is the row as last read in one
 * atomic step with a failed insert or update; NULL before any read (the
 * first decision, made without looking, because only the store's constraint
 * and conditions may decide); found says whether that read found a row. */
void idem__record_decide(const struct idem__rec_event_args *ev,
                         const idem_record *cur, int found,
                         struct idem__rec_decision *d);

/* A business state's name (idem.h: IDEM_STEP_NAME_MAX). */
idem_rc idem__check_step_name(const char *s, const char *what);

/* A stepped record's result: its document (the current state, the moves
 * kept) and then the answer kept with the current state (steps.c). The
 * current state of rec as the machine sees it: its document's, or the
 * initial state when it has none. */
const char *idem__steps_current(const idem_record *rec, const idem_machine *m, char *buf);
/* rec's document with the move to `to` at (at_ms, epoch) added, then
 * result: a new allocation (idem__malloc) in *out, *out_len. */
idem_rc idem__steps_compose(const idem_record *rec, const char *to, int64_t at_ms,
                            uint64_t epoch, const void *result, size_t len, void **out,
                            size_t *out_len);

#endif
