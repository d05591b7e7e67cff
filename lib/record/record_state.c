/* SPDX-License-Identifier: Apache-2.0 */
/*
 * record_state.c — the record state machine (record layer).
 *
 * Every change a record can undergo is decided here, in idem__record_decide(),
 * and nowhere else; the backends only carry out the insert or conditional
 * update it asks for, atomically. The states and every transition:
 *
 *                         begin: insert wins (NEW, epoch = now in ms)
 *            (absent) ───────────────────────────────┐
 *                ▲                                   ▼
 *                │                        ┌───► PROCESSING(e) ───┐ begin after the lease
 *                │                        │      │   │    │  ▲   │ ran out: TAKEN_OVER,
 *                │           begin: NEW,  │      │   │    │  └───┘ epoch e+1
 *                │           epoch e+1    │      │   │    │
 *                │                        │      │   │    │ fail(e, retryable)
 *                │                   RELEASED ◄──┼───┼────┘
 *                │                        ▲      │   │
 *                │     complete(e)        │      │   │ fail(e, final)
 *                │   ┌────────────────────┼──────┘   ▼
 *                │   ▼                    │        FAILED
 *                │ SUCCEEDED              │          │
 *                │   │   transition(from, to): any state but PROCESSING
 *                │   └──────────► user states ◄──────┘ (and RELEASED, to re-run)
 *                │                    │
 *                └── purge ───────────┘  once expires_ms has passed; never
 *                                        PROCESSING, which has no expiry
 *
 *   PROCESSING(e) ─extend(e)─► PROCESSING(e) with a later lease_until: the
 *   claimant is alive and still working.
 *
 *   any state but PROCESSING, at epoch e ─delete(e)─► (absent): an operator
 *   lets the key execute again (idem_record_delete). One conditional DELETE
 *   in the backend, decided by its conditions alone, as purge is.
 *
 * Answers that change nothing:
 *   begin      PROCESSING with a live lease → IN_PROGRESS; SUCCEEDED, FAILED or
 *              a user state → DONE (the stored result); a fingerprint other
 *              than the stored one, in any state but RELEASED → MISMATCH.
 *              RELEASED was not executed, or failed so that it may run
 *              again: a begin with another payload claims it (NEW) and the
 *              record takes that begin's fingerprint — a corrected retry
 *              with the same key is what its client asked for, and the
 *              payload that was refused has no answer kept to protect.
 *   complete,  the record is not PROCESSING at epoch e (taken over, finished)
 *   fail,      → CONFLICT, counted as an alert
 *   extend
 *   transition the record is in `to` → ALREADY; in another state → CONFLICT
 *
 * Invariants:
 *   - PROCESSING(e) means exactly one caller, the one that got epoch e, may
 *     finish the record, and only while nobody has taken it over.
 *   - The epoch never decreases while the record exists; a takeover or a
 *     re-claim of RELEASED always increments it, so a stale owner's epoch
 *     never matches again.
 *   - PROCESSING records have expires_ms 0 and are never purged: a claim in
 *     flight is never forgotten.
 *   - A stored result only changes on the PROCESSING → final step.
 *   - The fingerprint only changes when RELEASED is claimed again, in the
 *     same conditional update as the claim: a record that holds an answer
 *     (or a claim in flight) keeps the payload it was executed with.
 */
#include "record_state.h"

#include <string.h>

static int fingerprint_differs(const struct idem__rec_event_args *ev,
                               const idem_record *cur)
{
    return ev->fingerprint && cur->has_fingerprint &&
           memcmp(ev->fingerprint, cur->fingerprint, IDEM_FINGERPRINT_LEN) != 0;
}

static void claim(const struct idem__rec_event_args *ev, const idem_record *cur,
                  struct idem__rec_decision *d, idem_outcome outcome)
{
    d->action = IDEM__ACT_CAS;
    d->outcome = outcome;
    d->cas.expect_state = cur->state;
    d->cas.expect_epoch = cur->epoch;
    d->cas.state = IDEM_STATE_PROCESSING;
    d->cas.epoch = cur->epoch + 1;
    d->cas.owner = ev->owner;
    d->cas.lease_until = ev->now + ev->lease_ms;
    d->cas.set_result = 1; /* a new claim starts without a result */
    d->cas.expires_ms = 0;
}

static void decide_begin(const struct idem__rec_event_args *ev,
                         const idem_record *cur, struct idem__rec_decision *d)
{
    if (!cur) {
        d->action = IDEM__ACT_INSERT;
        d->outcome = IDEM_NEW;
        d->insert.space = ev->space;
        d->insert.key = ev->key;
        d->insert.fingerprint = ev->fingerprint;
        d->insert.owner = ev->owner;
        /* A new record's first epoch is the clock, not 1: a record purged
         * after its retention and created again must never hand out an
         * epoch a claimant of the old one (stalled for longer than the
         * retention) still holds. */
        d->insert.epoch = ev->now > 0 ? (uint64_t)ev->now : 1;
        d->insert.lease_until = ev->now + ev->lease_ms;
        d->insert.now = ev->now;
        return;
    }
    if (strcmp(cur->state, IDEM_STATE_RELEASED) == 0) {
        claim(ev, cur, d, IDEM_NEW);
        d->cas.fingerprint = ev->fingerprint; /* NULL: the stored one stays */
    } else if (fingerprint_differs(ev, cur)) {
        d->outcome = IDEM_MISMATCH;
    } else if (strcmp(cur->state, IDEM_STATE_PROCESSING) == 0) {
        if (cur->lease_until_ms > ev->now) {
            d->outcome = IDEM_IN_PROGRESS;
        } else {
            claim(ev, cur, d, IDEM_TAKEN_OVER);
            d->cas.lease_expired_at = ev->now;
        }
    } else {
        d->outcome = IDEM_DONE;
    }
}

/* complete, fail and extend: a step of the claim at ev->epoch, which only
 * its holder can take while the record is PROCESSING at that epoch. */
static void decide_claim_step(const struct idem__rec_event_args *ev,
                              const idem_record *cur, int found,
                              struct idem__rec_decision *d)
{
    if (cur) {
        d->outcome = found ? IDEM_CONFLICT : IDEM_NOT_FOUND;
        return;
    }
    d->action = IDEM__ACT_CAS;
    d->cas.expect_state = IDEM_STATE_PROCESSING;
    d->cas.expect_epoch = ev->epoch;
    d->cas.epoch = ev->epoch;
    if (ev->kind == IDEM__EV_EXTEND) {
        d->outcome = IDEM_RENEWED;
        d->cas.state = IDEM_STATE_PROCESSING;
        d->cas.lease_until = ev->now + ev->lease_ms;
        d->cas.expires_ms = 0;
        return;
    }
    d->outcome = IDEM_COMPLETED;
    d->cas.state = ev->kind == IDEM__EV_COMPLETE      ? IDEM_STATE_SUCCEEDED
                   : ev->kind == IDEM__EV_FAIL_FINAL ? IDEM_STATE_FAILED
                                                      : IDEM_STATE_RELEASED;
    d->cas.set_result = 1;
    d->cas.result = ev->result;
    d->cas.result_len = ev->result_len;
    d->cas.expires_ms = ev->now + ev->retention_ms;
}

static void decide_transition(const struct idem__rec_event_args *ev,
                              const idem_record *cur, int found,
                              struct idem__rec_decision *d)
{
    if (cur) {
        d->outcome = !found ? IDEM_NOT_FOUND
                     : strcmp(cur->state, ev->to) == 0 ? IDEM_ALREADY
                                                       : IDEM_CONFLICT;
        return;
    }
    d->action = IDEM__ACT_CAS;
    d->outcome = IDEM_APPLIED;
    d->cas.expect_state = ev->from;
    d->cas.state = ev->to;
    d->cas.expires_ms = -1;
}

void idem__record_decide(const struct idem__rec_event_args *ev,
                         const idem_record *cur, int found,
                         struct idem__rec_decision *d)
{
    memset(d, 0, sizeof *d);
    d->action = IDEM__ACT_ANSWER;
    d->cas.space = ev->space;
    d->cas.key = ev->key;
    d->cas.now = ev->now;
    switch (ev->kind) {
    case IDEM__EV_BEGIN:
        decide_begin(ev, cur, d);
        break;
    case IDEM__EV_COMPLETE:
    case IDEM__EV_FAIL_FINAL:
    case IDEM__EV_FAIL_RETRYABLE:
    case IDEM__EV_EXTEND:
        decide_claim_step(ev, cur, found, d);
        break;
    case IDEM__EV_TRANSITION:
        decide_transition(ev, cur, found, d);
        break;
    }
}
