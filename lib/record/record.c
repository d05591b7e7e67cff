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
 * idem_record_async() hands a caller's function to the db backend's writer
 * thread (run_async); the calls above, made from it, take the same path and
 * the backend runs them inline in the writer's transaction.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/check.h"
#include "core/error.h"
#include "core/str.h"
#include "record_state.h"
#include "store/store.h"

#define ROUNDS_MAX 16
#define RETENTION_MAX (3650 * IDEM_DAY_MS)

IDEM_EXTERN void idem_record_clear(idem_record *rec)
{
    if (!rec)
        return;
    idem__free(rec->result);
    memset(rec, 0, sizeof *rec);
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
    if (ev->kind == IDEM__EV_EXTEND)
        idem__log(h, IDEM_LOG_ALERT,
                  "record %s/%s: extending epoch %llu refused: it is %s at epoch %llu "
                  "(owner %s)",
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

/* Drive one event to its answer. rec, when not NULL, receives the row the
 * answer was based on (begin) and owns its result. */
static idem_rc drive(idem *h, const struct idem__rec_event_args *ev,
                     idem_outcome *out, idem_record *rec, char *current)
{
    idem_record cur;
    int have = 0, found = 0;
    idem_rc rc = IDEM_OK;
    memset(&cur, 0, sizeof cur);

    /* A finished record stays finished: a read that finds one may answer a
     * begin (DONE, or MISMATCH) without writing. Anything else — no record,
     * PROCESSING, RELEASED — is decided by the store's constraint and
     * conditions below, never by this read. */
    if (ev->kind == IDEM__EV_BEGIN && h->db_ops->rec_peek) {
        /* Only a hint: a peek that fails leaves the decision to the write. */
        if (h->db_ops->rec_peek(h->db, ev->space, ev->key, &found, &cur) != IDEM_OK)
            found = 0;
        if (found && strcmp(cur.state, IDEM_STATE_PROCESSING) != 0 &&
            strcmp(cur.state, IDEM_STATE_RELEASED) != 0)
            have = 1;
        else
            idem_record_clear(&cur), found = 0;
    }

    for (int round = 0; round < ROUNDS_MAX; round++) {
        struct idem__rec_decision d;
        char expect[IDEM_NAME_MAX + 1];
        idem__record_decide(ev, have ? &cur : NULL, found, &d);

        if (d.action == IDEM__ACT_ANSWER) {
            *out = d.outcome;
            if (d.outcome == IDEM_CONFLICT) {
                atomic_fetch_add(&h->conflicts, 1);
                log_conflict(h, ev, &cur);
            }
            if (current)
                strcpy(current, found ? cur.state : "");
            goto answer;
        }
        if (d.action == IDEM__ACT_INSERT) {
            int inserted = 0;
            idem_record_clear(&cur);
            rc = h->db_ops->rec_insert(h->db, &d.insert, &inserted, &cur);
            if (rc != IDEM_OK)
                goto out;
            if (inserted) {
                *out = d.outcome;
                /* The row as inserted, without another read. */
                idem_record_clear(&cur);
                strcpy(cur.state, IDEM_STATE_PROCESSING);
                cur.epoch = d.insert.epoch;
                idem__copy(cur.owner, sizeof cur.owner, ev->owner);
                cur.lease_until_ms = d.insert.lease_until;
                cur.created_ms = cur.updated_ms = ev->now;
                if (ev->fingerprint) {
                    cur.has_fingerprint = 1;
                    memcpy(cur.fingerprint, ev->fingerprint, IDEM_FINGERPRINT_LEN);
                }
                goto answer;
            }
            have = found = 1;
            continue;
        }
        /* IDEM__ACT_CAS: the expected state may point into cur, which the
         * backend overwrites with the row it reads when the update fails. */
        if (d.cas.expect_state) {
            idem__copy(expect, sizeof expect, d.cas.expect_state);
            d.cas.expect_state = expect;
        }
        int changed = 0;
        idem_record next;
        memset(&next, 0, sizeof next);
        rc = h->db_ops->rec_cas(h->db, &d.cas, &changed, &found, &next);
        if (rc != IDEM_OK)
            goto out;
        if (changed) {
            *out = d.outcome;
            if (d.outcome == IDEM_TAKEN_OVER) {
                atomic_fetch_add(&h->takeovers, 1);
                idem__log(h, IDEM_LOG_WARN,
                          "record %s/%s taken over by %s from %s at epoch %llu: "
                          "its lease ran out",
                          ev->space, ev->key, ev->owner, cur.owner,
                          (unsigned long long)cur.epoch);
            }
            if (ev->kind == IDEM__EV_BEGIN) {
                /* The claim as made: cur with the new claim's fields. */
                cur.epoch = d.cas.epoch;
                strcpy(cur.state, IDEM_STATE_PROCESSING);
                idem__copy(cur.owner, sizeof cur.owner, ev->owner);
                cur.lease_until_ms = d.cas.lease_until;
                cur.updated_ms = ev->now;
                cur.expires_ms = 0;
                idem__free(cur.result);
                cur.result = NULL;
                cur.result_len = 0;
            }
            goto answer;
        }
        idem_record_clear(&cur);
        cur = next;
        have = 1;
    }
    rc = idem__fail(IDEM_ESTORE, "records: %s/%s changed %d times during one call",
                    ev->space, ev->key, ROUNDS_MAX);
    goto out;

answer:
    if (rec) {
        *rec = cur;
        memset(&cur, 0, sizeof cur);
    }
out:
    idem_record_clear(&cur);
    return rc;
}

IDEM_EXTERN idem_rc idem_record_begin(idem *h, const char *space,
                                      const char *key,
                                      const uint8_t *fingerprint,
                                      const char *owner, int64_t lease_ms,
                                      idem_outcome *out, idem_record *rec)
{
    idem_rc rc;
    idem__clear_detail();
    if (rec)
        memset(rec, 0, sizeof *rec);
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_key(owner, "owner", 0)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    struct idem__rec_event_args ev = {
        .kind = IDEM__EV_BEGIN, .space = space, .key = key, .now = idem__now(h),
        .fingerprint = fingerprint, .owner = owner, .lease_ms = lease_ms,
    };
    return drive(h, &ev, out, rec, NULL);
}

static idem_rc finish(idem *h, enum idem__rec_event kind, const char *space,
                      const char *key, uint64_t epoch, const void *result,
                      size_t len, int64_t retention_ms, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (epoch == 0)
        return idem__fail(IDEM_EINVAL, "epoch: 0 is never a claim's epoch");
    if (!result && len)
        return idem__fail(IDEM_EINVAL, "result: NULL with length %zu", len);
    if (len > h->result_max)
        return idem__fail(IDEM_ETOOBIG, "result: %zu bytes, the limit is %zu", len,
                          h->result_max);
    if ((rc = idem__check_ms(retention_ms, 0, RETENTION_MAX, "retention_ms")) != IDEM_OK)
        return rc;
    struct idem__rec_event_args ev = {
        .kind = kind, .space = space, .key = key, .now = idem__now(h),
        .epoch = epoch, .result = result, .result_len = len,
        .retention_ms = retention_ms ? retention_ms : h->retention_ms,
    };
    return drive(h, &ev, out, NULL, NULL);
}

IDEM_EXTERN idem_rc idem_record_complete(idem *h, const char *space,
                                         const char *key, uint64_t epoch,
                                         const void *result, size_t len,
                                         int64_t retention_ms, idem_outcome *out)
{
    return finish(h, IDEM__EV_COMPLETE, space, key, epoch, result, len,
                  retention_ms, out);
}

IDEM_EXTERN idem_rc idem_record_fail(idem *h, const char *space,
                                     const char *key, uint64_t epoch,
                                     idem_fail_mode mode, const void *result,
                                     size_t len, int64_t retention_ms,
                                     idem_outcome *out)
{
    if (mode != IDEM_FAIL_FINAL && mode != IDEM_FAIL_RETRYABLE) {
        idem__clear_detail();
        return idem__fail(IDEM_EINVAL, "mode: %d is neither FINAL nor RETRYABLE",
                          (int)mode);
    }
    return finish(h, mode == IDEM_FAIL_FINAL ? IDEM__EV_FAIL_FINAL
                                             : IDEM__EV_FAIL_RETRYABLE,
                  space, key, epoch, result, len, retention_ms, out);
}

IDEM_EXTERN idem_rc idem_record_extend(idem *h, const char *space,
                                       const char *key, uint64_t epoch,
                                       int64_t lease_ms, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (epoch == 0)
        return idem__fail(IDEM_EINVAL, "epoch: 0 is never a claim's epoch");
    struct idem__rec_event_args ev = {
        .kind = IDEM__EV_EXTEND, .space = space, .key = key, .now = idem__now(h),
        .epoch = epoch, .lease_ms = lease_ms,
    };
    return drive(h, &ev, out, NULL, NULL);
}

IDEM_EXTERN idem_rc idem_record_transition(idem *h, const char *space,
                                           const char *key, const char *from,
                                           const char *to, idem_outcome *out,
                                           char *current)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_target(h, space, key)) != IDEM_OK ||
        (rc = idem__check_name(from, "from")) != IDEM_OK ||
        (rc = idem__check_name(to, "to")) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (current)
        current[0] = '\0';
    if (strcmp(from, IDEM_STATE_PROCESSING) == 0 || strcmp(to, IDEM_STATE_PROCESSING) == 0)
        return idem__fail(IDEM_EINVAL,
                          "transition: PROCESSING is entered by begin and left by "
                          "complete/fail with the claim's epoch");
    struct idem__rec_event_args ev = {
        .kind = IDEM__EV_TRANSITION, .space = space, .key = key,
        .now = idem__now(h), .from = from, .to = to,
    };
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

static idem_rc record_async(idem *h, idem_async_fn fn, idem_async_done_fn done, void *arg,
                            int one_call)
{
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if (!fn || !done)
        return idem__fail(IDEM_EINVAL, "%s: NULL callback", fn ? "done" : "fn");
    if (!h->db_ops->run_async)
        return idem__fail(IDEM_ENOTSUP,
                          "async record calls: the %s store has no writer thread to run "
                          "them on; call the blocking functions from a thread of your own",
                          h->store_name);
    return h->db_ops->run_async(h->db, h, fn, done, arg, one_call);
}

IDEM_EXTERN idem_rc idem_record_async(idem *h, idem_async_fn fn,
                                      idem_async_done_fn done, void *arg)
{
    return record_async(h, fn, done, arg, 0);
}

/* Each record call writes once at most, as the last thing it does before
 * it succeeds (drive() answers right after its write): an fn that makes one
 * call and returns its result never fails after a write. */
IDEM_EXTERN idem_rc idem_record_async_one(idem *h, idem_async_fn fn,
                                          idem_async_done_fn done, void *arg)
{
    return record_async(h, fn, done, arg, 1);
}
