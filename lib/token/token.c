/* SPDX-License-Identifier: Apache-2.0 */
/*
 * token.c — layer 1, one-time anti-duplicate tokens (token layer).
 *
 * Validates the caller's input, draws the token from the CSPRNG, and hands
 * the atomic part (store, spend, give back) to the kv backend. The seed's
 * compare-and-delete is extended: a spent token is remembered with the
 * business key it was spent on, so a late retry of the same request is told
 * apart from a second submission.
 */
#include <string.h>

#include "core/check.h"
#include "core/crypto.h"
#include "core/error.h"
#include "store/store.h"
#include "token.h"

#define TOKEN_TTL_MAX (7 * IDEM_DAY_MS)

static idem_rc check_common(idem *h, const char *subject, const char *scene)
{
    idem_rc rc;
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if ((rc = idem__check_key(subject, "subject", 1)) != IDEM_OK)
        return rc;
    return idem__check_name(scene, "scene");
}

static idem_rc check_token_text(const char *token)
{
    if (!token)
        return idem__fail(IDEM_EINVAL, "token: NULL");
    /* Anything else is simply not a token we issued: UNKNOWN, not an error,
     * but it must still be a well-formed string to look up. */
    return idem__check_key(token, "token", 1);
}

idem_rc idem__token_check_spend(idem *h, const char *subject, const char *scene,
                                const char *token, const char *biz_key)
{
    idem_rc rc;
    if ((rc = check_common(h, subject, scene)) != IDEM_OK ||
        (rc = check_token_text(token)) != IDEM_OK)
        return rc;
    return biz_key ? idem__check_key(biz_key, "biz_key", 0) : IDEM_OK;
}

idem_rc idem__token_check_issue(idem *h, const char *subject, const char *scene,
                                int64_t ttl_ms)
{
    idem_rc rc;
    if ((rc = check_common(h, subject, scene)) != IDEM_OK)
        return rc;
    return idem__check_ms(ttl_ms, 1, TOKEN_TTL_MAX, "ttl_ms");
}

idem_rc idem__token_draw(char token[IDEM_TOKEN_LEN + 1])
{
    return idem__random_token(token);
}

IDEM_EXTERN idem_rc idem_token_issue(idem *h, const char *subject,
                                     const char *scene, int64_t ttl_ms,
                                     char token[IDEM_TOKEN_LEN + 1])
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_issue(h, subject, scene, ttl_ms)) != IDEM_OK ||
        (rc = idem__check_out(token, "token")) != IDEM_OK)
        return rc;
    char fresh[IDEM_TOKEN_LEN + 1];
    if ((rc = idem__token_draw(fresh)) != IDEM_OK)
        return rc;
    rc = h->kv_ops->token_put(h->kv, subject, scene, fresh, ttl_ms,
                              h->tokens_per_scene, idem__now(h));
    if (rc == IDEM_OK)
        memcpy(token, fresh, sizeof fresh);
    return rc;
}

IDEM_EXTERN idem_rc idem_token_consume(idem *h, const char *subject,
                                       const char *scene, const char *token,
                                       const char *biz_key, idem_outcome *out,
                                       char *spent_key)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_spend(h, subject, scene, token, biz_key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (spent_key)
        spent_key[0] = '\0';
    return h->kv_ops->token_consume(h->kv, subject, scene, token, biz_key,
                                    idem__now(h), out, spent_key);
}

IDEM_EXTERN idem_rc idem_token_give_back(idem *h, const char *subject,
                                         const char *scene, const char *token,
                                         const char *biz_key, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_spend(h, subject, scene, token, biz_key)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return h->kv_ops->token_give_back(h->kv, subject, scene, token, biz_key,
                                      idem__now(h), out);
}
