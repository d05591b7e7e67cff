/* SPDX-License-Identifier: Apache-2.0 */
/*
 * record.c — layer 3, unique records (record layer).
 *
 * Each public call validates its input, then runs the loop that every record
 * operation shares: ask the state machine (record_state.c) what to do, have
 * the db backend try it atomically, and if the store's constraint or
 * condition refused, decide again on the row the backend read in that same
 * atomic step. The loop ends in a few rounds: a round only repeats when
 * another caller changed the row in between, and each such change moves the
 * row forward.
 *
 * The asynchronous forms (idem/loop.h) run the same loop with each step a
 * _start operation of the backend's, resumed where the backend completes
 * it; the operators' calls (delete, list, purge) are one step each.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/check.h"
#include "core/error.h"
#include "core/str.h"
#include "record_state.h"
#include "store/row.h"
#include "store/store.h"

#define ROUNDS_MAX 16
#define RETENTION_MAX (3650 * IDEM_DAY_MS)

/* The store layer's definitions (store/row.h), which its backends use too. */
IDEM_EXTERN void idem_record_clear(idem_record *rec)
{
    idem__row_clear(rec);
}

IDEM_EXTERN int idem_record_finished(const char *state)
{
    return idem__state_finished(state);
}

static idem_rc check_target(idem *h, const char *space, const char *key)
{
    idem_rc rc;
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if ((rc = idem__check_name(space, "space")) != IDEM_OK)
        return rc;
    return idem__check_key(key, "key", 0);
}

static void log_conflict(idem *h, const struct idem__rec_event_args *ev,
                         const idem_record *cur)
{
    if (ev->seen)
        idem__log(h, IDEM_LOG_INFO,
                  "record %s/%s: an action on epoch %llu as the caller read it refused: it is "
                  "%s at epoch %llu, changed since it was read",
                  ev->space, ev->key, (unsigned long long)ev->epoch, cur->state,
                  (unsigned long long)cur->epoch);
    else if (ev->kind == IDEM__EV_EXTEND)
        idem__log(h, IDEM_LOG_ALERT,
                  "record %s/%s: extending epoch %llu refused: it is %s at epoch %llu "
                  "(owner %s)",
                  ev->space, ev->key, (unsigned long long)ev->epoch, cur->state,
                  (unsigned long long)cur->epoch, cur->owner);
    else if (ev->kind == IDEM__EV_STEP)
        /* The business's alert branch: the caller answers and alerts. */
        idem__log(h, IDEM_LOG_INFO, "record %s/%s: step to %s refused: it is %s", ev->space,
                  ev->key, ev->to, cur->state);
    else if (ev->kind == IDEM__EV_STEP_COMPLETE || ev->kind == IDEM__EV_STEP_RELEASE)
        idem__log(h, IDEM_LOG_ALERT,
                  "record %s/%s: finishing the step claimed at epoch %llu refused: it is %s "
                  "at epoch %llu (owner %s); the claim was taken over or already finished",
                  ev->space, ev->key, (unsigned long long)ev->epoch, cur->state,
                  (unsigned long long)cur->epoch, cur->owner);
    else if (ev->kind == IDEM__EV_TRANSITION)
        /* A business answer (a refund of a cancelled order), not a fault. */
        idem__log(h, IDEM_LOG_INFO, "record %s/%s: transition %s -> %s refused: it is %s",
                  ev->space, ev->key, ev->from, ev->to, cur->state);
    else if (cur->epoch == ev->epoch &&
             strcmp(cur->state, ev->kind == IDEM__EV_COMPLETE    ? IDEM_STATE_SUCCEEDED
                                : ev->kind == IDEM__EV_FAIL_FINAL ? IDEM_STATE_FAILED
                                                                  : IDEM_STATE_RELEASED) == 0)
        /* The same claim finishing again as it did (a retried call):
         * nothing lost. Finishing otherwise stays an ALERT below (a
         * complete after the claim was released: the next begin executes
         * again). */
        idem__log(h, IDEM_LOG_INFO,
                  "record %s/%s: finishing epoch %llu again refused: it is already %s",
                  ev->space, ev->key, (unsigned long long)ev->epoch, cur->state);
    else
        idem__log(h, IDEM_LOG_ALERT,
                  "record %s/%s: finishing epoch %llu refused: it is %s at epoch %llu "
                  "(owner %s); the caller's claim was taken over or already finished",
                  ev->space, ev->key, (unsigned long long)ev->epoch, cur->state,
                  (unsigned long long)cur->epoch, cur->owner);
}

/* One event being driven to its answer (drive_run), kept between its store
 * steps. A blocking call keeps it on its stack, and each step runs at once;
 * an asynchronous one on the heap, and each step is a job of the backend's
 * (its _start operation), whose done resumes the drive on the backend's
 * thread. Either way the decisions are the same code. */
struct drive {
    idem *h;
    struct idem__rec_event_args ev;
    int async;           /* the steps are the backend's _start operations */
    void (*over)(struct drive *dr); /* async: called once the drive ends */

    idem_rc rc;          /* the drive's: IDEM_OK, or why it failed */
    idem_outcome out;
    idem_record cur;     /* the row the answer was based on */
    char current[IDEM_NAME_MAX + 1]; /* transition: the state that refused it */
    char detail[256];    /* async: rc's detail */

    int have, found, round;
    struct idem__rec_decision d;
    char expect[IDEM_NAME_MAX + 1];
    int hit;             /* the step's write was made */
    idem_record next;    /* a refused update, or a read: the row as it stands */
    void *doc;           /* a step's composed result (the decision's) */
    struct idem__call call;
    /* An asynchronous step ends twice: its start returns, and its done
     * runs (on the writer's thread, maybe first). Each adds one; the second
     * to arrive goes on with the drive. */
    atomic_int meet;
    idem_rc step_rc;
};

static void drive_end(struct drive *dr, idem_rc rc, const char *detail)
{
    dr->rc = rc;
    idem_record_clear(&dr->next);
    idem__free(dr->doc);
    dr->doc = NULL;
    if (rc != IDEM_OK) {
        idem_record_clear(&dr->cur);
        if (dr->async && detail != dr->detail)
            snprintf(dr->detail, sizeof dr->detail, "%s", detail);
    }
    if (dr->async)
        dr->over(dr);
}

/* The answer, once a write was made. */
static void made(struct drive *dr)
{
    const struct idem__rec_event_args *ev = &dr->ev;
    idem_record *cur = &dr->cur;
    dr->out = dr->d.outcome;
    if (dr->d.action == IDEM__ACT_INSERT) {
        /* The row as inserted, without another read. */
        idem_record_clear(cur);
        strcpy(cur->state, IDEM_STATE_PROCESSING);
        cur->epoch = dr->d.insert.epoch;
        idem__copy(cur->owner, sizeof cur->owner, ev->owner);
        cur->lease_until_ms = dr->d.insert.lease_until;
        cur->created_ms = cur->updated_ms = ev->now;
        if (ev->fingerprint) {
            cur->has_fingerprint = 1;
            memcpy(cur->fingerprint, ev->fingerprint, IDEM_FINGERPRINT_LEN);
        }
        return;
    }
    if (dr->d.outcome == IDEM_TAKEN_OVER) {
        atomic_fetch_add(&dr->h->takeovers, 1);
        idem__log(dr->h, IDEM_LOG_WARN,
                  "record %s/%s taken over by %s from %s at epoch %llu: its lease ran out",
                  ev->space, ev->key, ev->owner, cur->owner, (unsigned long long)cur->epoch);
    }
    if (ev->kind == IDEM__EV_BEGIN || ev->kind == IDEM__EV_STEP) {
        /* The claim as made: cur with the new claim's fields (a step's
         * keeps its document: the state it moves from). */
        const struct idem__rec_cas *c = &dr->d.cas;
        cur->epoch = c->epoch;
        strcpy(cur->state, IDEM_STATE_PROCESSING);
        idem__copy(cur->owner, sizeof cur->owner, ev->owner);
        cur->lease_until_ms = c->lease_until;
        cur->updated_ms = ev->now;
        cur->expires_ms = 0;
        if (c->fingerprint) {
            cur->has_fingerprint = 1;
            memcpy(cur->fingerprint, c->fingerprint, IDEM_FINGERPRINT_LEN);
        }
        if (c->set_result) {
            idem__free(cur->result);
            cur->result = NULL;
            cur->result_len = 0;
        }
    }
}

/* What a step said: 1 to decide again, 0 when the drive has ended. */
static int stepped(struct drive *dr, idem_rc rc, const char *detail)
{
    if (rc != IDEM_OK) {
        drive_end(dr, rc, detail);
        return 0;
    }
    if (dr->hit) {
        made(dr);
        drive_end(dr, IDEM_OK, "");
        return 0;
    }
    if (dr->d.action == IDEM__ACT_INSERT) {
        dr->have = dr->found = 1; /* the backend read the row it met into cur */
    } else {
        idem_record_clear(&dr->cur);
        dr->cur = dr->next;
        memset(&dr->next, 0, sizeof dr->next);
        dr->have = 1;
    }
    return 1;
}

static void on_step(struct idem__call *c, idem_rc rc, const char *detail);

/* The decision's write. Blocking: made, and its result. Asynchronous:
 * started (on_step has its result), or the start's error. */
static idem_rc step(struct drive *dr)
{
    idem *h = dr->h;
    dr->hit = 0;
    if (dr->d.action == IDEM__ACT_READ) {
        memset(&dr->next, 0, sizeof dr->next);
        if (!dr->async)
            return h->db_ops->rec_get(h->db, dr->ev.space, dr->ev.key, &dr->found, &dr->next);
        return h->db_ops->rec_get_start(h->db, dr->ev.space, dr->ev.key, &dr->found,
                                        &dr->next, &dr->call);
    }
    if (dr->d.action == IDEM__ACT_INSERT) {
        idem_record_clear(&dr->cur);
        if (!dr->async)
            return h->db_ops->rec_insert(h->db, &dr->d.insert, &dr->hit, &dr->cur);
        return h->db_ops->rec_insert_start(h->db, &dr->d.insert, &dr->hit, &dr->cur, &dr->call);
    }
    /* IDEM__ACT_CAS: the expected state may point into cur, which the
     * backend overwrites with the row it reads when the update fails. */
    if (dr->d.cas.expect_state) {
        idem__copy(dr->expect, sizeof dr->expect, dr->d.cas.expect_state);
        dr->d.cas.expect_state = dr->expect;
    }
    memset(&dr->next, 0, sizeof dr->next);
    if (!dr->async)
        return h->db_ops->rec_cas(h->db, &dr->d.cas, &dr->hit, &dr->found, &dr->next);
    return h->db_ops->rec_cas_start(h->db, &dr->d.cas, &dr->hit, &dr->found, &dr->next,
                                    &dr->call);
}

/* Decide, write, and decide again on the row the write met, until an
 * answer; returns when the drive has ended or waits for a step. */
static void drive_run(struct drive *dr)
{
    const struct idem__rec_event_args *ev = &dr->ev;
    for (; dr->round < ROUNDS_MAX; dr->round++) {
        idem__record_decide(ev, dr->have ? &dr->cur : NULL, dr->found, &dr->d);
        if (dr->d.action == IDEM__ACT_ANSWER) {
            dr->out = dr->d.outcome;
            if (dr->out == IDEM_CONFLICT) {
                if (!ev->seen)
                    atomic_fetch_add(&dr->h->conflicts, 1);
                log_conflict(dr->h, ev, &dr->cur);
            }
            strcpy(dr->current, dr->found ? dr->cur.state : "");
            drive_end(dr, IDEM_OK, "");
            return;
        }
        if (dr->d.compose) {
            size_t len = 0;
            idem__free(dr->doc);
            dr->doc = NULL;
            if (idem__steps_compose(&dr->cur, ev->to, ev->now, ev->epoch, ev->result,
                                    ev->result_len, &dr->doc, &len) != IDEM_OK) {
                drive_end(dr, IDEM_ENOMEM, idem_errdetail());
                return;
            }
            dr->d.cas.result = dr->doc;
            dr->d.cas.result_len = len;
        }
        if (!dr->async) {
            idem_rc rc = step(dr);
            if (!stepped(dr, rc, idem_errdetail()))
                return;
            continue;
        }
        atomic_store(&dr->meet, 0);
        idem_rc rc = step(dr);
        if (rc != IDEM_OK) { /* no done will come */
            drive_end(dr, rc, idem_errdetail());
            return;
        }
        if (atomic_fetch_add(&dr->meet, 1) == 0)
            return; /* done has not run: it goes on */
        if (!stepped(dr, dr->step_rc, dr->detail))
            return;
    }
    idem__fail(IDEM_ESTORE, "records: %s/%s changed %d times during one call", ev->space,
               ev->key, ROUNDS_MAX);
    drive_end(dr, IDEM_ESTORE, idem_errdetail());
}

static void on_step(struct idem__call *c, idem_rc rc, const char *detail)
{
    struct drive *dr = (struct drive *)((char *)c - offsetof(struct drive, call));
    dr->step_rc = rc;
    if (rc != IDEM_OK)
        snprintf(dr->detail, sizeof dr->detail, "%s", detail);
    if (atomic_fetch_add(&dr->meet, 1) == 0)
        return; /* its start has not returned: drive_run goes on */
    if (stepped(dr, rc, dr->detail)) {
        dr->round++;
        drive_run(dr);
    }
}

static void drive_init(struct drive *dr, idem *h, const struct idem__rec_event_args *ev)
{
    memset(dr, 0, sizeof *dr);
    dr->h = h;
    dr->ev = *ev;
    dr->call.done = on_step;
}

/* A finished record stays finished: a read that finds one may answer a
 * begin (DONE, or MISMATCH) without writing. Anything else — no record,
 * PROCESSING, RELEASED — is decided by the store's constraint and
 * conditions, never by this read. A blocking drive's first look. */
static void peek_first(struct drive *dr)
{
    idem *h = dr->h;
    if (dr->ev.kind != IDEM__EV_BEGIN || !h->db_ops->rec_peek)
        return;
    /* Only a hint: a peek that fails leaves the decision to the write. */
    if (h->db_ops->rec_peek(h->db, dr->ev.space, dr->ev.key, &dr->found, &dr->cur) != IDEM_OK)
        dr->found = 0;
    if (dr->found && idem_record_finished(dr->cur.state))
        dr->have = 1;
    else
        idem_record_clear(&dr->cur), dr->found = 0;
}

/* Drive one event to its answer, blocking. rec, when not NULL, receives
 * the row the answer was based on (begin) and owns its result. */
static idem_rc drive(idem *h, const struct idem__rec_event_args *ev,
                     idem_outcome *out, idem_record *rec, char *current)
{
    struct drive dr;
    drive_init(&dr, h, ev);
    peek_first(&dr);
    drive_run(&dr);
    if (dr.rc != IDEM_OK)
        return dr.rc; /* the detail is the thread's: each step ran on it */
    *out = dr.out;
    if (current)
        strcpy(current, dr.current);
    if (rec)
        *rec = dr.cur;
    else
        idem_record_clear(&dr.cur);
    return IDEM_OK;
}

/* The checks and the event of each call, shared by its blocking and its
 * asynchronous form. */
static idem_rc begin_event(idem *h, const char *space, const char *key,
                           const uint8_t *fingerprint, const char *owner, int64_t lease_ms,
                           struct idem__rec_event_args *ev)
{
    idem_rc rc;
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_key(owner, "owner", 0)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK)
        return rc;
    *ev = (struct idem__rec_event_args){
        .kind = IDEM__EV_BEGIN, .space = space, .key = key, .now = idem__now(h),
        .fingerprint = fingerprint, .owner = owner, .lease_ms = lease_ms,
    };
    return IDEM_OK;
}

static idem_rc finish_event(idem *h, enum idem__rec_event kind, const char *space,
                            const char *key, uint64_t epoch, const void *result, size_t len,
                            int64_t retention_ms, struct idem__rec_event_args *ev)
{
    idem_rc rc;
    if ((rc = check_target(h, space, key)) != IDEM_OK)
        return rc;
    if (epoch == 0)
        return idem__fail(IDEM_EINVAL, "epoch: 0 is never a claim's epoch");
    if (!result && len)
        return idem__fail(IDEM_EINVAL, "result: NULL with length %zu", len);
    if (len > h->result_max)
        return idem__fail(IDEM_ETOOBIG, "result: %zu bytes, the limit is %zu", len,
                          h->result_max);
    if ((rc = idem__check_ms(retention_ms, 0, RETENTION_MAX, "retention_ms")) != IDEM_OK)
        return rc;
    *ev = (struct idem__rec_event_args){
        .kind = kind, .space = space, .key = key, .now = idem__now(h),
        .epoch = epoch, .result = result, .result_len = len,
        .retention_ms = retention_ms ? retention_ms : h->retention_ms,
    };
    return IDEM_OK;
}

static idem_rc fail_kind(idem_fail_mode mode, enum idem__rec_event *kind)
{
    if (mode != IDEM_FAIL_FINAL && mode != IDEM_FAIL_RETRYABLE)
        return idem__fail(IDEM_EINVAL, "mode: %d is neither FINAL nor RETRYABLE", (int)mode);
    *kind = mode == IDEM_FAIL_FINAL ? IDEM__EV_FAIL_FINAL : IDEM__EV_FAIL_RETRYABLE;
    return IDEM_OK;
}

static idem_rc extend_event(idem *h, const char *space, const char *key, uint64_t epoch,
                            int64_t lease_ms, struct idem__rec_event_args *ev)
{
    idem_rc rc;
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK)
        return rc;
    if (epoch == 0)
        return idem__fail(IDEM_EINVAL, "epoch: 0 is never a claim's epoch");
    *ev = (struct idem__rec_event_args){
        .kind = IDEM__EV_EXTEND, .space = space, .key = key, .now = idem__now(h),
        .epoch = epoch, .lease_ms = lease_ms,
    };
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_record_begin(idem *h, const char *space,
                                      const char *key,
                                      const uint8_t *fingerprint,
                                      const char *owner, int64_t lease_ms,
                                      idem_outcome *out, idem_record *rec)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if (rec)
        memset(rec, 0, sizeof *rec);
    if ((rc = begin_event(h, space, key, fingerprint, owner, lease_ms, &ev)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return drive(h, &ev, out, rec, NULL);
}

static idem_rc finish(idem *h, enum idem__rec_event kind, const char *space,
                      const char *key, uint64_t epoch, const void *result,
                      size_t len, int64_t retention_ms, idem_outcome *out)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if ((rc = finish_event(h, kind, space, key, epoch, result, len, retention_ms, &ev)) !=
        IDEM_OK)
        return rc;
    return drive(h, &ev, out, NULL, NULL);
}

IDEM_EXTERN idem_rc idem_record_complete(idem *h, const char *space,
                                         const char *key, uint64_t epoch,
                                         const void *result, size_t len,
                                         int64_t retention_ms, idem_outcome *out)
{
    idem__clear_detail();
    return finish(h, IDEM__EV_COMPLETE, space, key, epoch, result, len,
                  retention_ms, out);
}

IDEM_EXTERN idem_rc idem_record_fail(idem *h, const char *space,
                                     const char *key, uint64_t epoch,
                                     idem_fail_mode mode, const void *result,
                                     size_t len, int64_t retention_ms,
                                     idem_outcome *out)
{
    enum idem__rec_event kind = IDEM__EV_FAIL_FINAL;
    idem__clear_detail();
    idem_rc rc = fail_kind(mode, &kind);
    return rc != IDEM_OK ? rc
                         : finish(h, kind, space, key, epoch, result, len, retention_ms, out);
}

IDEM_EXTERN idem_rc idem_record_extend(idem *h, const char *space,
                                       const char *key, uint64_t epoch,
                                       int64_t lease_ms, idem_outcome *out)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if ((rc = extend_event(h, space, key, epoch, lease_ms, &ev)) != IDEM_OK)
        return rc;
    return drive(h, &ev, out, NULL, NULL);
}

static idem_rc transition_event(idem *h, const char *space, const char *key, const char *from,
                                const char *to, struct idem__rec_event_args *ev)
{
    idem_rc rc;
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_name(from, "from")) != IDEM_OK ||
        (rc = idem__check_name(to, "to")) != IDEM_OK)
        return rc;
    if (strcmp(from, IDEM_STATE_PROCESSING) == 0 || strcmp(to, IDEM_STATE_PROCESSING) == 0)
        return idem__fail(IDEM_EINVAL,
                          "transition: PROCESSING is entered by begin and left by "
                          "complete/fail with the claim's epoch");
    *ev = (struct idem__rec_event_args){
        .kind = IDEM__EV_TRANSITION, .space = space, .key = key,
        .now = idem__now(h), .from = from, .to = to,
    };
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_record_transition(idem *h, const char *space,
                                           const char *key, const char *from,
                                           const char *to, idem_outcome *out,
                                           char *current)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (current)
        current[0] = '\0';
    if ((rc = transition_event(h, space, key, from, to, &ev)) != IDEM_OK)
        return rc;
    return drive(h, &ev, out, NULL, current);
}

IDEM_EXTERN idem_rc idem_record_get(idem *h, const char *space, const char *key,
                                    idem_outcome *out, idem_record *rec)
{
    idem_rc rc;
    idem__clear_detail();
    if (rec)
        memset(rec, 0, sizeof *rec);
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    int found = 0;
    idem_record cur;
    rc = h->db_ops->rec_get(h->db, space, key, &found, &cur);
    if (rc != IDEM_OK)
        return rc;
    *out = found ? IDEM_FOUND : IDEM_NOT_FOUND;
    if (rec && found)
        *rec = cur;
    else if (found)
        idem_record_clear(&cur);
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_record_purge(idem *h, unsigned limit, unsigned *purged)
{
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if (!purged)
        return idem__fail(IDEM_EINVAL, "purged: NULL out-parameter");
    *purged = 0;
    if (limit == 0)
        return IDEM_OK;
    return h->db_ops->rec_purge(h->db, idem__now(h), limit, purged);
}

/* ---- steps: a machine's events (idem.h) ---- */

static idem_rc step_event(idem *h, const idem_machine *m, const char *space, const char *key,
                          const char *to, const uint8_t *fingerprint, const char *owner,
                          int64_t lease_ms, struct idem__rec_event_args *ev)
{
    idem_rc rc = begin_event(h, space, key, fingerprint, owner, lease_ms, ev);
    if (rc != IDEM_OK)
        return rc;
    const char *initial = idem_machine_initial(m);
    if (idem_machine_relation(m, initial, initial) != IDEM_STEP_SAME)
        return idem__fail(IDEM_EINVAL, "machine: NULL, or not sealed");
    if ((rc = idem__check_step_name(to, "to")) != IDEM_OK)
        return rc;
    if (!idem_machine_has(m, to))
        return idem__fail(IDEM_EINVAL, "to: %s is not a state of the machine", to);
    ev->kind = IDEM__EV_STEP;
    ev->to = to;
    ev->machine = m;
    return IDEM_OK;
}

static idem_rc step_finish_event(idem *h, enum idem__rec_event kind, const char *space,
                                 const char *key, uint64_t epoch, const char *to,
                                 const uint8_t *fingerprint, const void *result, size_t len,
                                 int64_t retention_ms, struct idem__rec_event_args *ev)
{
    idem_rc rc = finish_event(h, kind, space, key, epoch, result, len, retention_ms, ev);
    if (rc != IDEM_OK)
        return rc;
    if (kind == IDEM__EV_STEP_COMPLETE) {
        if ((rc = idem__check_step_name(to, "to")) != IDEM_OK)
            return rc;
        ev->to = to;
        ev->fingerprint = fingerprint;
    }
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_record_step(idem *h, const idem_machine *m, const char *space,
                                     const char *key, const char *to,
                                     const uint8_t *fingerprint, const char *owner,
                                     int64_t lease_ms, idem_outcome *out, idem_record *rec)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if (rec)
        memset(rec, 0, sizeof *rec);
    if ((rc = step_event(h, m, space, key, to, fingerprint, owner, lease_ms, &ev)) !=
            IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return drive(h, &ev, out, rec, NULL);
}

IDEM_EXTERN idem_rc idem_record_step_complete(idem *h, const char *space, const char *key,
                                              uint64_t epoch, const char *to,
                                              const uint8_t *fingerprint, const void *result,
                                              size_t len, int64_t retention_ms,
                                              idem_outcome *out)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if ((rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if ((rc = step_finish_event(h, IDEM__EV_STEP_COMPLETE, space, key, epoch, to, fingerprint,
                                result, len, retention_ms, &ev)) != IDEM_OK)
        return rc;
    return drive(h, &ev, out, NULL, NULL);
}

IDEM_EXTERN idem_rc idem_record_step_release(idem *h, const char *space, const char *key,
                                             uint64_t epoch, int64_t retention_ms,
                                             idem_outcome *out)
{
    idem_rc rc;
    struct idem__rec_event_args ev;
    idem__clear_detail();
    if ((rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if ((rc = step_finish_event(h, IDEM__EV_STEP_RELEASE, space, key, epoch, NULL, NULL, NULL,
                                0, retention_ms, &ev)) != IDEM_OK)
        return rc;
    return drive(h, &ev, out, NULL, NULL);
}

/* ---- asynchronous calls (idem/loop.h) ---- */

/* A record call on a loop: its drive (or get), its arguments copied, and
 * the post that brings its answer to the loop. */
struct rec_async {
    struct drive dr;
    struct idem__loop *l;
    idem_loop_post post;
    int get;                /* a get, not a drive */
    idem_record_fn rec_cb;  /* begin, get */
    idem_transition_fn tr_cb; /* transition */
    idem_outcome_fn out_cb; /* the others */
    void *arg;
    struct idem__call got;  /* a get's step */
    char space[IDEM_NAME_MAX + 1];
    char key[IDEM_KEY_MAX + 1];
    char owner[IDEM_KEY_MAX + 1];
    char from[IDEM_NAME_MAX + 1], to[IDEM_NAME_MAX + 1]; /* transition */
    uint8_t fingerprint[IDEM_FINGERPRINT_LEN];
    void *result;           /* complete, fail: a copy of the result's bytes */
};

/* A call is made and answered on the caller's loop: its block comes from
 * and goes back to that thread's pool (core/alloc.h). */
static void async_free(struct rec_async *a)
{
    idem__free(a->result);
    idem__pool_put(a, sizeof *a);
}

/* On the loop: the answer. */
static void deliver(void *arg)
{
    struct rec_async *a = arg;
    struct drive *dr = &a->dr;
    const char *detail = dr->rc == IDEM_OK ? "" : dr->detail;
    idem_outcome out = dr->rc == IDEM_OK ? dr->out : IDEM_NONE;
    if (a->rec_cb)
        a->rec_cb(a->arg, dr->rc, out, &dr->cur, detail);
    else if (a->tr_cb)
        a->tr_cb(a->arg, dr->rc, out, out == IDEM_CONFLICT ? dr->current : "", detail);
    else
        a->out_cb(a->arg, dr->rc, dr->rc == IDEM_OK ? dr->out : IDEM_NONE, detail);
    idem_record_clear(&dr->cur);
    async_free(a);
}

static void post_answer(struct rec_async *a)
{
    a->post.fn = deliver;
    a->post.arg = a;
    idem__loop_post(a->l, &a->post);
}

static void drive_over(struct drive *dr)
{
    post_answer((struct rec_async *)dr);
}

static void on_got(struct idem__call *c, idem_rc rc, const char *detail)
{
    struct rec_async *a = (struct rec_async *)((char *)c - offsetof(struct rec_async, got));
    a->dr.rc = rc;
    a->dr.out = a->dr.found ? IDEM_FOUND : IDEM_NOT_FOUND;
    if (rc != IDEM_OK) {
        snprintf(a->dr.detail, sizeof a->dr.detail, "%s", detail);
        idem_record_clear(&a->dr.cur);
    }
    post_answer(a);
}

/* The loop and callback of every asynchronous record call. */
static idem_rc check_loop(idem_loop *loop, int has_cb)
{
    if (!loop || !loop->ops || loop->ops->version < IDEM_LOOP_OPS_VERSION)
        return idem__fail(IDEM_EINVAL, "loop: NULL, or not an IDEM_LOOP_OPS_VERSION adapter");
    if (!has_cb)
        return idem__fail(IDEM_EINVAL, "cb: NULL");
    return IDEM_OK;
}

static idem_rc async_new(idem *h, idem_loop *loop, const char *space, const char *key,
                         size_t result_len, void *arg, struct rec_async **out)
{
    idem_rc rc = check_loop(loop, 1); /* the callback: checked by each call */
    if (rc != IDEM_OK)
        return rc;
    struct rec_async *a = idem__pool_get(sizeof *a);
    if (!a)
        return idem__fail(IDEM_ENOMEM, "records: no memory for an asynchronous call");
    memset(a, 0, sizeof *a);
    if (result_len && !(a->result = idem__malloc(result_len))) {
        async_free(a);
        return idem__fail(IDEM_ENOMEM, "records: no memory for a copy of the result");
    }
    if (!(a->l = idem__loop_of(h, loop))) {
        async_free(a);
        return IDEM_ENOMEM;
    }
    a->arg = arg;
    idem__copy(a->space, sizeof a->space, space);
    idem__copy(a->key, sizeof a->key, key);
    *out = a;
    return IDEM_OK;
}

/* Run a's call on the backend's _start operations. */
static idem_rc async_go(idem *h, struct rec_async *a)
{
    const struct idem__db_ops *db = h->db_ops;
    if (!db->rec_get_start || !db->rec_insert_start || !db->rec_cas_start) {
        async_free(a);
        return idem__fail(IDEM_ENOTSUP, "asynchronous record calls: not offered by the %s store",
                          h->store_name);
    }
    idem__loop_begin(a->l);
    if (a->get) {
        a->got.done = on_got;
        idem_rc rc = db->rec_get_start(h->db, a->space, a->key, &a->dr.found, &a->dr.cur,
                                       &a->got);
        if (rc != IDEM_OK) {
            idem__loop_end(a->l);
            async_free(a);
        }
        return rc;
    }
    a->dr.async = 1;
    a->dr.over = drive_over;
    drive_run(&a->dr); /* its end posts the answer, whatever it is */
    return IDEM_OK;
}

/* A drive of ev on a loop: ev's strings and result copied into a. */
static idem_rc drive_async(idem *h, idem_loop *loop, const struct idem__rec_event_args *ev,
                           idem_record_fn rec_cb, idem_outcome_fn out_cb,
                           idem_transition_fn tr_cb, void *arg)
{
    if (!rec_cb && !out_cb && !tr_cb)
        return idem__fail(IDEM_EINVAL, "cb: NULL");
    struct rec_async *a = NULL;
    idem_rc rc = async_new(h, loop, ev->space, ev->key, ev->result_len, arg, &a);
    if (rc != IDEM_OK)
        return rc;
    a->rec_cb = rec_cb;
    a->out_cb = out_cb;
    a->tr_cb = tr_cb;
    drive_init(&a->dr, h, ev);
    a->dr.ev.space = a->space;
    a->dr.ev.key = a->key;
    if (ev->owner) {
        idem__copy(a->owner, sizeof a->owner, ev->owner);
        a->dr.ev.owner = a->owner;
    }
    if (ev->from) {
        idem__copy(a->from, sizeof a->from, ev->from);
        a->dr.ev.from = a->from;
    }
    if (ev->to) {
        idem__copy(a->to, sizeof a->to, ev->to);
        a->dr.ev.to = a->to;
    }
    if (ev->fingerprint) {
        memcpy(a->fingerprint, ev->fingerprint, IDEM_FINGERPRINT_LEN);
        a->dr.ev.fingerprint = a->fingerprint;
    }
    if (ev->result_len) {
        memcpy(a->result, ev->result, ev->result_len);
        a->dr.ev.result = a->result;
    }
    return async_go(h, a);
}

IDEM_EXTERN idem_rc idem_record_begin_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const uint8_t *fingerprint,
                                            const char *owner, int64_t lease_ms,
                                            idem_record_fn cb, void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = begin_event(h, space, key, fingerprint, owner, lease_ms, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, cb, NULL, NULL, arg);
}

static idem_rc finish_async(idem *h, idem_loop *loop, enum idem__rec_event kind, int seen,
                            const char *space, const char *key, uint64_t epoch,
                            const void *result, size_t len, int64_t retention_ms,
                            idem_outcome_fn cb, void *arg)
{
    struct idem__rec_event_args ev;
    idem_rc rc = finish_event(h, kind, space, key, epoch, result, len, retention_ms, &ev);
    ev.seen = seen;
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, NULL, cb, NULL, arg);
}

IDEM_EXTERN idem_rc idem_record_complete_async(idem *h, idem_loop *loop, const char *space,
                                               const char *key, uint64_t epoch,
                                               const void *result, size_t len,
                                               int64_t retention_ms, idem_outcome_fn cb,
                                               void *arg)
{
    idem__clear_detail();
    return finish_async(h, loop, IDEM__EV_COMPLETE, 0, space, key, epoch, result, len,
                        retention_ms, cb, arg);
}

static idem_rc fail_async(idem *h, idem_loop *loop, int seen, const char *space,
                          const char *key, uint64_t epoch, idem_fail_mode mode,
                          const void *result, size_t len, int64_t retention_ms,
                          idem_outcome_fn cb, void *arg)
{
    enum idem__rec_event kind = IDEM__EV_FAIL_FINAL;
    idem__clear_detail();
    idem_rc rc = fail_kind(mode, &kind);
    return rc != IDEM_OK ? rc
                         : finish_async(h, loop, kind, seen, space, key, epoch, result, len,
                                        retention_ms, cb, arg);
}

IDEM_EXTERN idem_rc idem_record_fail_async(idem *h, idem_loop *loop, const char *space,
                                           const char *key, uint64_t epoch, idem_fail_mode mode,
                                           const void *result, size_t len, int64_t retention_ms,
                                           idem_outcome_fn cb, void *arg)
{
    return fail_async(h, loop, 0, space, key, epoch, mode, result, len, retention_ms, cb, arg);
}

IDEM_EXTERN idem_rc idem_record_fail_seen_async(idem *h, idem_loop *loop, const char *space,
                                                const char *key, uint64_t epoch,
                                                idem_fail_mode mode, const void *result,
                                                size_t len, int64_t retention_ms,
                                                idem_outcome_fn cb, void *arg)
{
    return fail_async(h, loop, 1, space, key, epoch, mode, result, len, retention_ms, cb, arg);
}

IDEM_EXTERN idem_rc idem_record_extend_async(idem *h, idem_loop *loop, const char *space,
                                             const char *key, uint64_t epoch, int64_t lease_ms,
                                             idem_outcome_fn cb, void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = extend_event(h, space, key, epoch, lease_ms, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, NULL, cb, NULL, arg);
}

IDEM_EXTERN idem_rc idem_record_transition_async(idem *h, idem_loop *loop, const char *space,
                                                 const char *key, const char *from,
                                                 const char *to, idem_transition_fn cb,
                                                 void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = transition_event(h, space, key, from, to, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, NULL, NULL, cb, arg);
}

IDEM_EXTERN idem_rc idem_record_step_async(idem *h, idem_loop *loop, const idem_machine *m,
                                           const char *space, const char *key, const char *to,
                                           const uint8_t *fingerprint, const char *owner,
                                           int64_t lease_ms, idem_record_fn cb, void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = step_event(h, m, space, key, to, fingerprint, owner, lease_ms, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, cb, NULL, NULL, arg);
}

IDEM_EXTERN idem_rc idem_record_step_complete_async(idem *h, idem_loop *loop, const char *space,
                                                    const char *key, uint64_t epoch,
                                                    const char *to, const uint8_t *fingerprint,
                                                    const void *result, size_t len,
                                                    int64_t retention_ms, idem_outcome_fn cb,
                                                    void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = step_finish_event(h, IDEM__EV_STEP_COMPLETE, space, key, epoch, to,
                                   fingerprint, result, len, retention_ms, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, NULL, cb, NULL, arg);
}

IDEM_EXTERN idem_rc idem_record_step_release_async(idem *h, idem_loop *loop, const char *space,
                                                   const char *key, uint64_t epoch,
                                                   int64_t retention_ms, idem_outcome_fn cb,
                                                   void *arg)
{
    struct idem__rec_event_args ev;
    idem__clear_detail();
    idem_rc rc = step_finish_event(h, IDEM__EV_STEP_RELEASE, space, key, epoch, NULL, NULL,
                                   NULL, 0, retention_ms, &ev);
    return rc != IDEM_OK ? rc : drive_async(h, loop, &ev, NULL, cb, NULL, arg);
}

IDEM_EXTERN idem_rc idem_record_get_async(idem *h, idem_loop *loop, const char *space,
                                          const char *key, idem_record_fn cb, void *arg)
{
    idem__clear_detail();
    idem_rc rc = check_target(h, space, key);
    if (rc == IDEM_OK && !cb)
        rc = idem__fail(IDEM_EINVAL, "cb: NULL");
    if (rc != IDEM_OK)
        return rc;
    struct rec_async *a = NULL;
    if ((rc = async_new(h, loop, space, key, 0, arg, &a)) != IDEM_OK)
        return rc;
    a->get = 1;
    a->rec_cb = cb;
    return async_go(h, a);
}

static idem_rc delete_check(idem *h, const char *space, const char *key, uint64_t epoch)
{
    idem_rc rc;
    if ((rc = check_target(h, space, key)) != IDEM_OK)
        return rc;
    if (epoch == 0)
        return idem__fail(IDEM_EINVAL, "epoch: 0 is never a claim's epoch");
    return IDEM_OK;
}

/* What a delete's store step said, as the caller is answered. */
static idem_outcome delete_outcome(idem *h, const char *space, const char *key, uint64_t epoch,
                                   int deleted, int found)
{
    if (deleted) {
        idem__log(h, IDEM_LOG_INFO, "record %s/%s deleted at epoch %llu", space, key,
                  (unsigned long long)epoch);
        return IDEM_APPLIED;
    }
    return found ? IDEM_CONFLICT : IDEM_NOT_FOUND;
}

static idem_rc delete_sync(idem *h, const char *space, const char *key, uint64_t epoch,
                           int64_t updated_ms, idem_outcome *out, char *current,
                           uint64_t *current_epoch)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (current)
        current[0] = '\0';
    if (current_epoch)
        *current_epoch = 0;
    if ((rc = delete_check(h, space, key, epoch)) != IDEM_OK)
        return rc;
    if (!h->db_ops->rec_delete)
        return idem__fail(IDEM_ENOTSUP, "deleting records: not offered by the %s store",
                          h->store_name);
    int deleted = 0, found = 0;
    idem_record cur;
    memset(&cur, 0, sizeof cur);
    rc = h->db_ops->rec_delete(h->db, space, key, epoch, updated_ms, &deleted, &found, &cur);
    if (rc != IDEM_OK)
        return rc;
    *out = delete_outcome(h, space, key, epoch, deleted, found);
    if (*out == IDEM_CONFLICT) {
        if (current)
            strcpy(current, cur.state);
        if (current_epoch)
            *current_epoch = cur.epoch;
    }
    idem_record_clear(&cur);
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_record_delete(idem *h, const char *space, const char *key,
                                       uint64_t epoch, idem_outcome *out, char *current,
                                       uint64_t *current_epoch)
{
    return delete_sync(h, space, key, epoch, 0, out, current, current_epoch);
}

IDEM_EXTERN idem_rc idem_record_delete_seen(idem *h, const char *space, const char *key,
                                            uint64_t epoch, int64_t updated_ms,
                                            idem_outcome *out, char *current,
                                            uint64_t *current_epoch)
{
    if (updated_ms <= 0) {
        idem__clear_detail();
        return idem__fail(IDEM_EINVAL, "updated_ms: the record's, as read (> 0)");
    }
    return delete_sync(h, space, key, epoch, updated_ms, out, current, current_epoch);
}

IDEM_EXTERN void idem_record_page_clear(idem_record_page *page)
{
    if (!page)
        return;
    idem__free(page->items);
    memset(page, 0, sizeof *page);
}

/* The least string above every string that starts with prefix, in byte
 * order: its last code point one higher (UTF-8 sorts as code points do),
 * skipping the surrogates, which no key holds; a last U+10FFFF is dropped
 * and the one before it raised instead. "" when there is none (every code
 * point U+10FFFF): no upper bound. Keys are valid UTF-8 (check_key), and so
 * is the bound: PostgreSQL takes it as text. */
static void prefix_upper(const char *prefix, char *out, size_t cap)
{
    size_t n = strlen(prefix);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, prefix, n);
    while (n > 0) {
        size_t start = n - 1;
        while (start > 0 && ((unsigned char)out[start] & 0xc0) == 0x80)
            start--;
        const unsigned char *p = (const unsigned char *)out + start;
        size_t len = n - start;
        uint32_t cp = len == 1   ? p[0]
                      : len == 2 ? (uint32_t)(p[0] & 0x1f) << 6 | (p[1] & 0x3f)
                      : len == 3 ? (uint32_t)(p[0] & 0x0f) << 12 | (uint32_t)(p[1] & 0x3f) << 6 |
                                       (p[2] & 0x3f)
                                 : (uint32_t)(p[0] & 0x07) << 18 | (uint32_t)(p[1] & 0x3f) << 12 |
                                       (uint32_t)(p[2] & 0x3f) << 6 | (p[3] & 0x3f);
        if (cp >= 0x10ffff) {
            n = start;
            continue;
        }
        cp = cp == 0xd7ff ? 0xe000 : cp + 1;
        unsigned char *o = (unsigned char *)out + start;
        if (cp < 0x80) {
            o[0] = (unsigned char)cp;
            n = start + 1;
        } else if (cp < 0x800) {
            o[0] = (unsigned char)(0xc0 | cp >> 6);
            o[1] = (unsigned char)(0x80 | (cp & 0x3f));
            n = start + 2;
        } else if (cp < 0x10000) {
            o[0] = (unsigned char)(0xe0 | cp >> 12);
            o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
            o[2] = (unsigned char)(0x80 | (cp & 0x3f));
            n = start + 3;
        } else {
            o[0] = (unsigned char)(0xf0 | cp >> 18);
            o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
            o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
            o[3] = (unsigned char)(0x80 | (cp & 0x3f));
            n = start + 4;
        }
        break;
    }
    out[n] = '\0';
}

static int hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A cursor: "c1." created_ms "." the key in hex — the last row of a page.
 * Opaque to callers, and decoded strictly: anything else is refused. */
static idem_rc cursor_decode(const char *c, int64_t *created, char *key)
{
    const char *p = c;
    if (strncmp(p, "c1.", 3) != 0)
        return idem__fail(IDEM_EINVAL, "cursor: not one idem_record_list made");
    p += 3;
    int64_t v = 0;
    const char *digits = p;
    while (*p >= '0' && *p <= '9' && p - digits < 18)
        v = v * 10 + (*p++ - '0');
    if (p == digits || *p != '.')
        return idem__fail(IDEM_EINVAL, "cursor: not one idem_record_list made");
    p++;
    size_t n = strlen(p);
    if (n == 0 || n % 2 || n / 2 > IDEM_KEY_MAX)
        return idem__fail(IDEM_EINVAL, "cursor: not one idem_record_list made");
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_digit(p[2 * i]), lo = hex_digit(p[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return idem__fail(IDEM_EINVAL, "cursor: not one idem_record_list made");
        key[i] = (char)(hi << 4 | lo);
    }
    key[n / 2] = '\0';
    if (idem__check_key(key, "cursor", 0) != IDEM_OK)
        return idem__fail(IDEM_EINVAL, "cursor: not one idem_record_list made");
    *created = v;
    return IDEM_OK;
}

static void cursor_encode(const idem_record_item *it, char *out)
{
    static const char hex[] = "0123456789abcdef";
    int n = snprintf(out, IDEM_CURSOR_MAX + 1, "c1.%lld.", (long long)it->created_ms);
    for (const unsigned char *k = (const unsigned char *)it->key; *k; k++) {
        out[n++] = hex[*k >> 4];
        out[n++] = hex[*k & 15];
    }
    out[n] = '\0';
}

/* A listing's query, checked and decoded; the strings of l point into q
 * and into after_key and upper. */
static idem_rc list_query(idem *h, const idem_record_query *q, struct idem__rec_list *l,
                          unsigned *limit, char after_key[IDEM_KEY_MAX + 1],
                          char upper[IDEM_KEY_MAX + 1])
{
    idem_rc rc;
    if ((rc = idem__check_name(q->space, "space")) != IDEM_OK)
        return rc;
    int has_prefix = q->key_prefix && *q->key_prefix;
    if (has_prefix && (rc = idem__check_key(q->key_prefix, "key_prefix", 0)) != IDEM_OK)
        return rc;
    if (q->state && (rc = idem__check_name(q->state, "state")) != IDEM_OK)
        return rc;
    if (q->created_before_ms < 0 || q->created_after_ms < 0 || q->min_lease_span_ms < 0)
        return idem__fail(IDEM_EINVAL, "%s: negative",
                          q->created_before_ms < 0  ? "created_before_ms"
                          : q->created_after_ms < 0 ? "created_after_ms"
                                                    : "min_lease_span_ms");
    if (q->limit > IDEM_LIST_LIMIT_MAX)
        return idem__fail(IDEM_EINVAL, "limit: %u, at most %d", q->limit, IDEM_LIST_LIMIT_MAX);
    *limit = q->limit ? q->limit : IDEM_LIST_LIMIT_DEFAULT;
    *l = (struct idem__rec_list){
        .space = q->space, .prefix = has_prefix ? q->key_prefix : NULL, .state = q->state,
        .created_before = q->created_before_ms, .created_after = q->created_after_ms,
        .min_lease_span = q->min_lease_span_ms, .fetch = *limit + 1,
    };
    if (q->cursor && *q->cursor) {
        if ((rc = cursor_decode(q->cursor, &l->after_created, after_key)) != IDEM_OK)
            return rc;
        l->after_key = after_key;
    }
    if (has_prefix) {
        prefix_upper(q->key_prefix, upper, IDEM_KEY_MAX + 1);
        l->prefix_upper = *upper ? upper : NULL;
    }
    return IDEM_OK;
}

/* The page of the rows a listing fetched: one row more than the page was
 * asked for says whether there is a next. */
static void page_of(idem_record_item *items, size_t count, unsigned limit,
                    idem_record_page *out)
{
    if (count > limit) {
        count = limit;
        cursor_encode(&items[count - 1], out->next_cursor);
    }
    out->items = items;
    out->count = count;
}

IDEM_EXTERN idem_rc idem_record_list(idem *h, const idem_record_query *q,
                                     idem_record_page *out)
{
    idem_rc rc;
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if (!q)
        return idem__fail(IDEM_EINVAL, "query: NULL");
    if ((rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    memset(out, 0, sizeof *out);
    unsigned limit = 0;
    char after_key[IDEM_KEY_MAX + 1], upper[IDEM_KEY_MAX + 1];
    struct idem__rec_list l;
    if ((rc = list_query(h, q, &l, &limit, after_key, upper)) != IDEM_OK)
        return rc;
    if (!h->db_ops->rec_list)
        return idem__fail(IDEM_ENOTSUP, "listing records: not offered by the %s store",
                          h->store_name);
    idem_record_item *items = NULL;
    size_t count = 0;
    if ((rc = h->db_ops->rec_list(h->db, &l, &items, &count)) != IDEM_OK)
        return rc;
    page_of(items, count, limit, out);
    return IDEM_OK;
}

/* ---- the operators' calls on a loop: delete, list, purge ----
 *
 * Each is one store step (a _start operation, version 6), whose done posts
 * the answer to the loop, where the callback gets it as its blocking form
 * would have. The call holds copies of everything the step reads. */

enum admin_kind { ADMIN_DELETE, ADMIN_LIST, ADMIN_PURGE };

struct admin_async {
    struct idem__call call;
    idem_loop_post post;
    struct idem__loop *l;
    idem *h;
    enum admin_kind kind;
    union {
        idem_delete_fn del;
        idem_page_fn page;
        idem_count_fn count;
    } cb;
    void *arg;
    idem_rc rc;
    char detail[256];

    char space[IDEM_NAME_MAX + 1];
    char key[IDEM_KEY_MAX + 1];     /* delete: the key; list: the key prefix */
    uint64_t epoch;                 /* delete */
    int64_t updated_ms;             /* delete: 0, or as the caller read it */
    int deleted, found;
    idem_record cur;

    struct idem__rec_list list;     /* list: its strings point into this call */
    char state[IDEM_NAME_MAX + 1];
    char after_key[IDEM_KEY_MAX + 1], upper[IDEM_KEY_MAX + 1];
    unsigned limit;
    idem_record_item *items;
    size_t count;

    unsigned purged;                /* purge */
};

/* On the loop: the answer, then the call is freed. */
static void admin_deliver(void *arg)
{
    struct admin_async *a = arg;
    const char *detail = a->rc == IDEM_OK ? "" : a->detail;
    switch (a->kind) {
    case ADMIN_DELETE: {
        idem_outcome out = IDEM_NONE;
        if (a->rc == IDEM_OK)
            out = delete_outcome(a->h, a->space, a->key, a->epoch, a->deleted, a->found);
        int conflict = out == IDEM_CONFLICT;
        a->cb.del(a->arg, a->rc, out, conflict ? a->cur.state : "", conflict ? a->cur.epoch : 0,
                  detail);
        idem_record_clear(&a->cur);
        break;
    }
    case ADMIN_LIST: {
        idem_record_page page;
        memset(&page, 0, sizeof page);
        if (a->rc == IDEM_OK)
            page_of(a->items, a->count, a->limit, &page);
        else
            idem__free(a->items);
        a->cb.page(a->arg, a->rc, &page, detail);
        idem_record_page_clear(&page);
        break;
    }
    case ADMIN_PURGE:
        a->cb.count(a->arg, a->rc, a->rc == IDEM_OK ? a->purged : 0, detail);
        break;
    }
    idem__free(a);
}

static void admin_done(struct idem__call *c, idem_rc rc, const char *detail)
{
    struct admin_async *a = (struct admin_async *)c;
    a->rc = rc;
    if (rc != IDEM_OK)
        snprintf(a->detail, sizeof a->detail, "%s", detail ? detail : "");
    a->post.fn = admin_deliver;
    a->post.arg = a;
    idem__loop_post(a->l, &a->post);
}

/* *out: a call of kind on loop. offered: the backend has the step's
 * _start operation. */
static idem_rc admin_new(idem *h, idem_loop *loop, enum admin_kind kind, int offered,
                         const char *what, void *arg, struct admin_async **out)
{
    if (!offered)
        return idem__fail(IDEM_ENOTSUP, "%s asynchronously: not offered by the %s store", what,
                          h->store_name);
    struct admin_async *a = idem__malloc(sizeof *a);
    if (!a)
        return idem__fail(IDEM_ENOMEM, "records: no memory for an asynchronous call");
    memset(a, 0, sizeof *a);
    if (!(a->l = idem__loop_of(h, loop))) {
        idem__free(a);
        return IDEM_ENOMEM;
    }
    a->h = h;
    a->kind = kind;
    a->arg = arg;
    a->call.done = admin_done;
    *out = a;
    return IDEM_OK;
}

/* Hand a's step to the backend: the answer comes through admin_done, or
 * the start's error is returned and a is gone. */
static idem_rc admin_go(struct admin_async *a, idem_rc (*start)(struct admin_async *a))
{
    idem__loop_begin(a->l);
    idem_rc rc = start(a);
    if (rc != IDEM_OK) {
        idem__loop_end(a->l);
        idem__free(a);
    }
    return rc;
}

static idem_rc delete_start(struct admin_async *a)
{
    idem *h = a->h;
    return h->db_ops->rec_delete_start(h->db, a->space, a->key, a->epoch, a->updated_ms,
                                       &a->deleted,
                                       &a->found, &a->cur, &a->call);
}

static idem_rc delete_async(idem *h, idem_loop *loop, const char *space, const char *key,
                            uint64_t epoch, int64_t updated_ms, idem_delete_fn cb, void *arg)
{
    idem_rc rc = delete_check(h, space, key, epoch);
    if (rc == IDEM_OK)
        rc = check_loop(loop, cb != NULL);
    if (rc != IDEM_OK)
        return rc;
    struct admin_async *a = NULL;
    if ((rc = admin_new(h, loop, ADMIN_DELETE, h->db_ops->rec_delete_start != NULL, "deleting records", arg,
                        &a)) != IDEM_OK)
        return rc;
    a->cb.del = cb;
    idem__copy(a->space, sizeof a->space, space);
    idem__copy(a->key, sizeof a->key, key);
    a->epoch = epoch;
    a->updated_ms = updated_ms;
    return admin_go(a, delete_start);
}

IDEM_EXTERN idem_rc idem_record_delete_async(idem *h, idem_loop *loop, const char *space,
                                             const char *key, uint64_t epoch,
                                             idem_delete_fn cb, void *arg)
{
    idem__clear_detail();
    return delete_async(h, loop, space, key, epoch, 0, cb, arg);
}

IDEM_EXTERN idem_rc idem_record_delete_seen_async(idem *h, idem_loop *loop, const char *space,
                                                  const char *key, uint64_t epoch,
                                                  int64_t updated_ms, idem_delete_fn cb,
                                                  void *arg)
{
    idem__clear_detail();
    if (updated_ms <= 0)
        return idem__fail(IDEM_EINVAL, "updated_ms: the record's, as read (> 0)");
    return delete_async(h, loop, space, key, epoch, updated_ms, cb, arg);
}

static idem_rc list_start(struct admin_async *a)
{
    idem *h = a->h;
    return h->db_ops->rec_list_start(h->db, &a->list, &a->items, &a->count, &a->call);
}

IDEM_EXTERN idem_rc idem_record_list_async(idem *h, idem_loop *loop, const idem_record_query *q,
                                           idem_page_fn cb, void *arg)
{
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if (!q)
        return idem__fail(IDEM_EINVAL, "query: NULL");
    unsigned limit = 0;
    char after_key[IDEM_KEY_MAX + 1], upper[IDEM_KEY_MAX + 1];
    struct idem__rec_list l;
    idem_rc rc = list_query(h, q, &l, &limit, after_key, upper);
    if (rc == IDEM_OK)
        rc = check_loop(loop, cb != NULL);
    if (rc != IDEM_OK)
        return rc;
    struct admin_async *a = NULL;
    if ((rc = admin_new(h, loop, ADMIN_LIST, h->db_ops->rec_list_start != NULL, "listing records", arg,
                        &a)) != IDEM_OK)
        return rc;
    a->cb.page = cb;
    a->limit = limit;
    a->list = l;
    /* The query's strings, copied: the listing outlives the call. */
    idem__copy(a->space, sizeof a->space, l.space);
    a->list.space = a->space;
    if (l.prefix) {
        idem__copy(a->key, sizeof a->key, l.prefix);
        a->list.prefix = a->key;
    }
    if (l.prefix_upper) {
        idem__copy(a->upper, sizeof a->upper, l.prefix_upper);
        a->list.prefix_upper = a->upper;
    }
    if (l.state) {
        idem__copy(a->state, sizeof a->state, l.state);
        a->list.state = a->state;
    }
    if (l.after_key) {
        idem__copy(a->after_key, sizeof a->after_key, l.after_key);
        a->list.after_key = a->after_key;
    }
    return admin_go(a, list_start);
}

static idem_rc purge_start(struct admin_async *a)
{
    idem *h = a->h;
    if (a->limit == 0) { /* nothing to ask the store: answered as the blocking call */
        admin_done(&a->call, IDEM_OK, "");
        return IDEM_OK;
    }
    return h->db_ops->rec_purge_start(h->db, idem__now(h), a->limit, &a->purged, &a->call);
}

IDEM_EXTERN idem_rc idem_record_purge_async(idem *h, idem_loop *loop, unsigned limit,
                                            idem_count_fn cb, void *arg)
{
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    idem_rc rc = check_loop(loop, cb != NULL);
    if (rc != IDEM_OK)
        return rc;
    struct admin_async *a = NULL;
    if ((rc = admin_new(h, loop, ADMIN_PURGE, h->db_ops->rec_purge_start != NULL, "purging records", arg,
                        &a)) != IDEM_OK)
        return rc;
    a->cb.count = cb;
    a->limit = limit;
    return admin_go(a, purge_start);
}
