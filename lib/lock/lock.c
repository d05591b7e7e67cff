/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.c — layer 2, business-key locks (lock layer).
 *
 * Validation and dispatch to the kv backend, where acquire, renew and
 * release are each one atomic step on one key: renew and release compare the
 * owner before they act, so a holder whose lease ran out can never extend or
 * delete the lock its successor now holds.
 */
#include "core/check.h"
#include "core/error.h"
#include "lock.h"
#include "store/store.h"

idem_rc idem__lock_check(idem *h, const char *space, const char *key, const char *owner)
{
    idem_rc rc;
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if ((rc = idem__check_name(space, "space")) != IDEM_OK ||
        (rc = idem__check_key(key, "key", 0)) != IDEM_OK)
        return rc;
    return idem__check_key(owner, "owner", 0);
}

static idem_rc check_lock_args(idem *h, const char *space, const char *key,
                               const char *owner, idem_outcome *out)
{
    idem_rc rc;
    if ((rc = idem__lock_check(h, space, key, owner)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return IDEM_OK;
}

idem_rc idem__check_lock_ttl(int64_t ttl_ms)
{
    return idem__check_ms(ttl_ms, 1, IDEM_DAY_MS, "ttl_ms");
}

IDEM_EXTERN idem_rc idem_lock_acquire(idem *h, const char *space,
                                      const char *key, const char *owner,
                                      int64_t ttl_ms, idem_outcome *out,
                                      idem_lock_info *info)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_lock_args(h, space, key, owner, out)) != IDEM_OK ||
        (rc = idem__check_lock_ttl(ttl_ms)) != IDEM_OK)
        return rc;
    return h->kv_ops->lock_acquire(h->kv, space, key, owner, ttl_ms,
                                   idem__now(h), out, info);
}

IDEM_EXTERN idem_rc idem_lock_renew(idem *h, const char *space,
                                    const char *key, const char *owner,
                                    int64_t ttl_ms, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_lock_args(h, space, key, owner, out)) != IDEM_OK ||
        (rc = idem__check_lock_ttl(ttl_ms)) != IDEM_OK)
        return rc;
    return h->kv_ops->lock_renew(h->kv, space, key, owner, ttl_ms,
                                 idem__now(h), out);
}

IDEM_EXTERN idem_rc idem_lock_release(idem *h, const char *space,
                                      const char *key, const char *owner,
                                      idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = check_lock_args(h, space, key, owner, out)) != IDEM_OK)
        return rc;
    return h->kv_ops->lock_release(h->kv, space, key, owner, idem__now(h), out);
}
