/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox.c — the message inbox with retries, in Idem's own store (inbox
 * layer).
 *
 * A consumer of an at-least-once queue records each message id before it
 * acts, and marks it DONE after. The states, every transition made here:
 *
 *   (absent) ─receive─► RECEIVED ─begin─► PROCESSING(a) ─done(a)─► DONE
 *   (absent) ─begin──────────────────────► PROCESSING(1)
 *   PROCESSING(a) ─fail(a), a < max─► FAILED ─begin─► PROCESSING(a+1)
 *   PROCESSING(a) ─fail(a), a = max─► DEAD
 *   PROCESSING(a), lease ran out ─begin─► PROCESSING(a+1), or DEAD if a = max
 *
 * `a` is the attempt number; done and fail must name the attempt they
 * finish, so a consumer whose lease ran out cannot finish its successor's
 * attempt (CONFLICT, counted). As with records, the insert's unique key and
 * the update's conditions decide, and a refused step is decided again on the
 * row read in the same atomic step.
 */
#include <string.h>

#include "core/check.h"
#include "core/error.h"
#include "store/store.h"

#define ROUNDS_MAX 16

static idem_rc check_msg(idem *h, const char *group, const char *msg_id,
                         idem_outcome *out)
{
    idem_rc rc;
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if ((rc = idem__check_name(group, "group")) != IDEM_OK ||
        (rc = idem__check_key(msg_id, "msg_id", 0)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return IDEM_OK;
}

static idem_rc check_biz_type(const char *biz_type)
{
    return biz_type ? idem__check_name(biz_type, "biz_type") : IDEM_OK;
}

IDEM_EXTERN idem_rc idem_inbox_receive(idem *h, const char *group,
                                       const char *msg_id, const char *biz_type,
                                       idem_outcome *out, idem_inbox_entry *entry)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_msg(h, group, msg_id, out)) != IDEM_OK ||
        (rc = check_biz_type(biz_type)) != IDEM_OK)
        return rc;
    int inserted = 0;
    idem_inbox_entry cur;
    memset(&cur, 0, sizeof cur);
    rc = h->db_ops->inbox_insert(h->db, group, msg_id, biz_type, "RECEIVED", 0, 0,
                                 idem__now(h), &inserted, &cur);
    if (rc != IDEM_OK)
        return rc;
    *out = inserted ? IDEM_CLAIMED : IDEM_DUPLICATE;
    if (entry)
        *entry = cur;
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_inbox_begin(idem *h, const char *group,
                                     const char *msg_id, const char *biz_type,
                                     int64_t lease_ms, unsigned max_attempts,
                                     idem_outcome *out, idem_inbox_entry *entry)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_msg(h, group, msg_id, out)) != IDEM_OK ||
        (rc = check_biz_type(biz_type)) != IDEM_OK ||
        (rc = idem__check_ms(lease_ms, 1, IDEM_DAY_MS, "lease_ms")) != IDEM_OK)
        return rc;
    if (max_attempts < 1 || max_attempts > 1000)
        return idem__fail(IDEM_EINVAL, "max_attempts: %u, must be 1..1000", max_attempts);
    int64_t now = idem__now(h);
    int inserted = 0, changed = 0, found = 1;
    idem_inbox_entry cur;
    memset(&cur, 0, sizeof cur);
    rc = h->db_ops->inbox_insert(h->db, group, msg_id, biz_type, "PROCESSING", 1,
                                 now + lease_ms, now, &inserted, &cur);
    if (rc != IDEM_OK)
        return rc;
    *out = IDEM_PROCESS;
    for (int round = 0; !inserted && round < ROUNDS_MAX; round++) {
        if (!found)
            return idem__fail(IDEM_ESTORE, "inbox: %s/%s vanished", group, msg_id);
        int processing = strcmp(cur.state, "PROCESSING") == 0;
        if (strcmp(cur.state, "DONE") == 0) {
            *out = IDEM_DUPLICATE;
            break;
        }
        if (strcmp(cur.state, "DEAD") == 0) {
            *out = IDEM_DEAD;
            break;
        }
        if (processing && cur.lease_until_ms > now) {
            *out = IDEM_IN_PROGRESS;
            break;
        }
        /* RECEIVED, FAILED, or PROCESSING abandoned: a new attempt, if any
         * is left. */
        char expect[IDEM_NAME_MAX + 1];
        strcpy(expect, cur.state);
        int exhausted = cur.attempts >= max_attempts;
        struct idem__inbox_cas c = {
            .group = group, .msg_id = msg_id,
            .expect_state = expect, .expect_attempts = cur.attempts,
            .lease_expired_at = processing ? now : 0,
            .state = exhausted ? "DEAD" : "PROCESSING",
            .attempts = exhausted ? cur.attempts : cur.attempts + 1,
            .lease_until = exhausted ? 0 : now + lease_ms,
            .now = now,
        };
        rc = h->db_ops->inbox_cas(h->db, &c, &changed, &found, &cur);
        if (rc != IDEM_OK)
            return rc;
        if (changed) {
            *out = exhausted ? IDEM_DEAD : IDEM_PROCESS;
            break;
        }
    }
    if (*out == IDEM_PROCESS && !inserted && !changed)
        return idem__fail(IDEM_ESTORE, "inbox: %s/%s changed %d times during one call",
                          group, msg_id, ROUNDS_MAX);
    if (entry)
        *entry = cur;
    return IDEM_OK;
}

static idem_rc finish(idem *h, const char *group, const char *msg_id,
                      unsigned attempt, const char *state, idem_outcome done_as,
                      idem_outcome *out)
{
    int changed = 0, found = 0;
    idem_inbox_entry cur;
    memset(&cur, 0, sizeof cur);
    struct idem__inbox_cas c = {
        .group = group, .msg_id = msg_id, .expect_state = "PROCESSING",
        .expect_attempts = attempt, .state = state, .attempts = attempt,
        .now = idem__now(h),
    };
    idem_rc rc = h->db_ops->inbox_cas(h->db, &c, &changed, &found, &cur);
    if (rc != IDEM_OK)
        return rc;
    *out = changed ? done_as : found ? IDEM_CONFLICT : IDEM_NOT_FOUND;
    if (*out == IDEM_CONFLICT) {
        atomic_fetch_add(&h->conflicts, 1);
        idem__log(h, IDEM_LOG_ALERT,
                  "inbox %s/%s: finishing attempt %u refused: it is %s at attempt %u",
                  group, msg_id, attempt, cur.state, cur.attempts);
    }
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_inbox_done(idem *h, const char *group,
                                    const char *msg_id, unsigned attempt,
                                    idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_msg(h, group, msg_id, out)) != IDEM_OK)
        return rc;
    if (attempt == 0)
        return idem__fail(IDEM_EINVAL, "attempt: 0 is never an attempt");
    return finish(h, group, msg_id, attempt, "DONE", IDEM_COMPLETED, out);
}

IDEM_EXTERN idem_rc idem_inbox_fail(idem *h, const char *group,
                                    const char *msg_id, unsigned attempt,
                                    unsigned max_attempts, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_msg(h, group, msg_id, out)) != IDEM_OK)
        return rc;
    if (attempt == 0)
        return idem__fail(IDEM_EINVAL, "attempt: 0 is never an attempt");
    if (max_attempts < 1 || max_attempts > 1000)
        return idem__fail(IDEM_EINVAL, "max_attempts: %u, must be 1..1000", max_attempts);
    int dead = attempt >= max_attempts;
    return finish(h, group, msg_id, attempt, dead ? "DEAD" : "FAILED",
                  dead ? IDEM_DEAD : IDEM_RETRY_LATER, out);
}
