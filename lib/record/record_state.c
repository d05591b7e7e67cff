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
 *   A finished record whose expires_ms has passed is claimed by a begin as
 *   RELEASED is (NEW, epoch + 1, the begin's fingerprint): its retention is
 *   over, and the purge that would have deleted it has not come yet.
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
 * Steps (idem_record_step, a machine of the business's own; C is the key's
 * current state: its document's, or the machine's initial one when it has
 * no record, or RELEASED, or a claim that never kept an answer):
 *
 *   (absent), RELEASED ── step(T), T ahead of or equal to initial:
 *                         claim as begin does ──► PROCESSING(e)
 *   state:C(e) ── step(T), T ahead of C: claim, the document kept ──► PROCESSING(e+1)
 *   PROCESSING(e) ── step_complete(e, T) ──► state:T(e), T's answer and the
 *                    move added to the document
 *                 ── step_release(e) ──► state:C(e), or RELEASED when the key
 *                    had kept nothing
 *                 ── its lease ran out, step(T) with T ahead: TAKEN_OVER, e+1
 *
 *   Answers that change nothing: T == C → DONE (MISMATCH with another
 *   fingerprint); C ahead of T → STALE; neither → CONFLICT; a live claim →
 *   IN_PROGRESS. A step only writes on a condition of the row it read
 *   (its state and epoch), so two steps of one key never both move it.
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

#include <stdio.h>
#include <string.h>

static int fingerprint_differs(const struct idem__rec_event_args *ev,
                               const idem_record *cur)
{
    return ev->fingerprint && cur->has_fingerprint &&
           memcmp(ev->fingerprint, cur->fingerprint, IDEM_FINGERPRINT_LEN) != 0;
}

/* A finished record whose retention has run out is gone, as after the
 * purge that has not come yet: its key is new. */
static int past_retention(const struct idem__rec_event_args *ev, const idem_record *cur)
{
    return cur->expires_ms != 0 && cur->expires_ms <= ev->now &&
           strcmp(cur->state, IDEM_STATE_PROCESSING) != 0;
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

/* A claim of a key with no record: a new one, the caller's. (A step's too:
 * a key the machine sees in its initial state.) */
static void insert_claim(const struct idem__rec_event_args *ev, struct idem__rec_decision *d)
{
    d->action = IDEM__ACT_INSERT;
    d->outcome = IDEM_NEW;
    d->insert.space = ev->space;
    d->insert.key = ev->key;
    d->insert.fingerprint = ev->fingerprint;
    d->insert.owner = ev->owner;
    /* A new record's first epoch is the clock, not 1: a record purged
     * after its retention and created again must never hand out an epoch
     * a claimant of the old one (stalled for longer than the retention)
     * still holds. */
    d->insert.epoch = ev->now > 0 ? (uint64_t)ev->now : 1;
    d->insert.lease_until = ev->now + ev->lease_ms;
    d->insert.now = ev->now;
}

static void decide_begin(const struct idem__rec_event_args *ev,
                         const idem_record *cur, struct idem__rec_decision *d)
{
    if (!cur) {
        insert_claim(ev, d);
        return;
    }
    if (strcmp(cur->state, IDEM_STATE_RELEASED) == 0 || past_retention(ev, cur)) {
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

/* The answer for a step whose target does not move the key on from C. */
static void step_answer(const struct idem__rec_event_args *ev, const idem_record *cur,
                        idem_step_relation rel, struct idem__rec_decision *d)
{
    if (rel == IDEM_STEP_SAME)
        d->outcome = fingerprint_differs(ev, cur) ? IDEM_MISMATCH : IDEM_DONE;
    else if (rel == IDEM_STEP_BEHIND)
        d->outcome = IDEM_STALE;
    else
        d->outcome = IDEM_CONFLICT;
}

static int stepped_state(const char *state)
{
    return strncmp(state, IDEM_STEP_PREFIX, sizeof IDEM_STEP_PREFIX - 1) == 0;
}

static void decide_step(const struct idem__rec_event_args *ev, const idem_record *cur,
                        int found, struct idem__rec_decision *d)
{
    const idem_machine *m = ev->machine;
    const char *initial = idem_machine_initial(m);
    if (!cur || !found) {
        /* A key with no record is in the initial state: the first event
         * (even one naming the initial state) claims it; any other is
         * answered from a read, never decided without one. */
        idem_step_relation rel = idem_machine_relation(m, initial, ev->to);
        if (rel == IDEM_STEP_AHEAD || rel == IDEM_STEP_SAME)
            insert_claim(ev, d);
        else if (!cur)
            d->action = IDEM__ACT_READ;
        else
            d->outcome = rel == IDEM_STEP_BEHIND ? IDEM_STALE : IDEM_CONFLICT;
        return;
    }
    char buf[IDEM_NAME_MAX + 1];
    int released = strcmp(cur->state, IDEM_STATE_RELEASED) == 0 || past_retention(ev, cur);
    int processing = strcmp(cur->state, IDEM_STATE_PROCESSING) == 0;
    if (!released && !processing && !stepped_state(cur->state)) {
        d->outcome = IDEM_CONFLICT; /* a record of another kind in the space */
        return;
    }
    const char *c = released ? initial : idem__steps_current(cur, m, buf);
    int kept = !released && cur->result_len > 0; /* C has an answer */
    idem_step_relation rel = idem_machine_relation(m, c, ev->to);
    if (processing && cur->lease_until_ms > ev->now) {
        d->outcome = IDEM_IN_PROGRESS;
        return;
    }
    if (rel != IDEM_STEP_AHEAD && !(rel == IDEM_STEP_SAME && !kept)) {
        step_answer(ev, cur, rel, d);
        return;
    }
    claim(ev, cur, d, processing ? IDEM_TAKEN_OVER : IDEM_NEW);
    if (processing)
        d->cas.lease_expired_at = ev->now;
    if (kept) {
        d->cas.set_result = 0; /* the document stays: the state it moves from */
        d->cas.fingerprint = NULL;
    } else {
        d->cas.fingerprint = ev->fingerprint;
    }
}

/* step_complete and step_release: the claim at ev->epoch, read first (the
 * document the update writes is made from the row's). */
static void decide_step_finish(const struct idem__rec_event_args *ev, const idem_record *cur,
                               int found, struct idem__rec_decision *d)
{
    if (!cur) {
        d->action = IDEM__ACT_READ;
        return;
    }
    if (!found) {
        d->outcome = IDEM_NOT_FOUND;
        return;
    }
    if (strcmp(cur->state, IDEM_STATE_PROCESSING) != 0 || cur->epoch != ev->epoch) {
        d->outcome = IDEM_CONFLICT;
        return;
    }
    d->action = IDEM__ACT_CAS;
    d->cas.expect_state = IDEM_STATE_PROCESSING;
    d->cas.expect_epoch = ev->epoch;
    d->cas.epoch = ev->epoch;
    d->cas.expires_ms = ev->now + ev->retention_ms;
    d->cas.state = d->state;
    if (ev->kind == IDEM__EV_STEP_COMPLETE) {
        d->outcome = IDEM_COMPLETED;
        snprintf(d->state, sizeof d->state, "%s%.*s", IDEM_STEP_PREFIX, IDEM_STEP_NAME_MAX,
                 ev->to);
        d->cas.set_result = 1;
        d->compose = 1;
        d->cas.fingerprint = ev->fingerprint;
        return;
    }
    d->outcome = IDEM_RELEASED;
    idem_step_view v;
    if (cur->result_len && idem_record_steps(cur, &v) == IDEM_OK) {
        snprintf(d->state, sizeof d->state, "%s%.*s", IDEM_STEP_PREFIX, IDEM_STEP_NAME_MAX,
                 v.state);
    } else {
        snprintf(d->state, sizeof d->state, "%s", IDEM_STATE_RELEASED);
        d->cas.set_result = 1; /* nothing kept */
    }
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
    case IDEM__EV_STEP:
        decide_step(ev, cur, found, d);
        break;
    case IDEM__EV_STEP_COMPLETE:
    case IDEM__EV_STEP_RELEASE:
        decide_step_finish(ev, cur, found, d);
        break;
    }
}
