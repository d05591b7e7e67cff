/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kv_async.c — the asynchronous token and lock calls (public API layer;
 * the loop interface and its callback rule are include/idem/loop.h).
 *
 * A call checks its arguments with the blocking call's own checks, copies
 * them into one allocation, and hands the operation to the kv backend: on
 * the loop (its _start operation, Redis) when the backend offers that, or
 * else at once, blocking (memory, whose operations never wait on I/O).
 * Either way the answer lands in the call, whose done posts it to the loop,
 * and the user's callback runs from that post, on the loop's thread, after
 * the call has returned; the call is freed after the callback. The
 * semantics are the backend's one implementation of each operation, the
 * same the blocking calls run.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/check.h"
#include "core/error.h"
#include "lock/lock.h"
#include "store/store.h"
#include "token/token.h"

#define DETAIL_MAX 256 /* as error.c's detail */
/* The strings of most calls fit here, and their block then comes from the
 * thread's pool (core/alloc.h); a call with longer ones is allocated alone. */
#define TEXT_POOLED (3 * (IDEM_KEY_MAX + 1) + IDEM_NAME_MAX + 1)

enum op { ISSUE, CONSUME, GIVE_BACK, ACQUIRE, RENEW, RELEASE };

struct kv_call {
    struct idem__call call;
    idem_loop_post post;
    struct idem__loop *l;
    enum op op;
    union {
        idem_token_fn token;
        idem_spend_fn spend;
        idem_outcome_fn outcome;
        idem_lock_fn lock;
    } cb;
    void *arg;

    /* The arguments, copied into text: subject, scene (and for a spend
     * token, biz_key or NULL), or space, key, owner. */
    const char *s[4];
    int64_t ttl_ms;

    /* The answer. */
    idem_rc rc;
    idem_outcome out;
    idem_lock_info info;
    char token[IDEM_TOKEN_LEN + 1]; /* issue: drawn before the store is asked */
    char spent_key[IDEM_KEY_MAX + 1];
    char detail[DETAIL_MAX];
    int pooled;
    char text[];
};

static void call_free(struct kv_call *k)
{
    if (k->pooled)
        idem__pool_put(k, sizeof *k + TEXT_POOLED);
    else
        idem__free(k);
}

static void run_callback(void *arg)
{
    struct kv_call *k = arg;
    switch (k->op) {
    case ISSUE:
        k->cb.token(k->arg, k->rc, k->token, k->detail);
        break;
    case CONSUME:
        k->cb.spend(k->arg, k->rc, k->out, k->spent_key, k->detail);
        break;
    case ACQUIRE:
        k->cb.lock(k->arg, k->rc, k->out, &k->info, k->detail);
        break;
    default:
        k->cb.outcome(k->arg, k->rc, k->out, k->detail);
        break;
    }
    call_free(k);
}

/* The answer is in: post the callback (any thread; the loop's own when the
 * backend runs on it). */
static void call_done(struct idem__call *c, idem_rc rc, const char *detail)
{
    struct kv_call *k = (struct kv_call *)c;
    k->rc = rc;
    if (rc == IDEM_OK)
        k->detail[0] = '\0';
    else
        snprintf(k->detail, sizeof k->detail, "%s", detail ? detail : "");
    if (rc != IDEM_OK) {
        /* An error answers nothing: no half-filled outcome or info. */
        k->out = IDEM_NONE;
        k->spent_key[0] = '\0';
        k->token[0] = '\0';
        memset(&k->info, 0, sizeof k->info);
    }
    k->post.fn = run_callback;
    k->post.arg = k;
    idem__loop_post(k->l, &k->post);
}

static idem_rc check_loop(idem_loop *loop, int has_cb)
{
    if (!loop)
        return idem__fail(IDEM_EINVAL, "loop: NULL");
    if (!loop->ops || loop->ops->version != IDEM_LOOP_OPS_VERSION)
        return idem__fail(IDEM_EINVAL, "loop: not an idem_loop of IDEM_LOOP_OPS_VERSION %d",
                          IDEM_LOOP_OPS_VERSION);
    if (!has_cb)
        return idem__fail(IDEM_EINVAL, "cb: NULL");
    return IDEM_OK;
}

/* A call with copies of the n strings (a NULL stays NULL). */
static struct kv_call *call_new(enum op op, int n, const char *const *s)
{
    size_t len[4], total = 0;
    for (int i = 0; i < n; i++) {
        len[i] = s[i] ? strlen(s[i]) + 1 : 0;
        total += len[i];
    }
    int pooled = total <= TEXT_POOLED;
    struct kv_call *k = pooled ? idem__pool_get(sizeof *k + TEXT_POOLED)
                               : idem__malloc(sizeof *k + total);
    if (!k) {
        idem__fail(IDEM_ENOMEM, "asynchronous call: no memory for the call");
        return NULL;
    }
    memset(k, 0, sizeof *k);
    k->pooled = pooled;
    k->op = op;
    k->call.done = call_done;
    char *p = k->text;
    for (int i = 0; i < n; i++) {
        if (!s[i])
            continue;
        memcpy(p, s[i], len[i]);
        k->s[i] = p;
        p += len[i];
    }
    return k;
}

/* Run the operation, on the loop through the backend's _start operation
 * when it has one, or else at once; the answer always comes through done. */
static void dispatch(idem *h, struct kv_call *k)
{
    const struct idem__kv_ops *kv = h->kv_ops;
    struct idem__call *c = &k->call;
    const char *const *s = k->s;
    int64_t now = idem__now(h);
    idem_rc rc;
    switch (k->op) {
    case ISSUE:
        /* The token is drawn here, by the token layer, as the blocking
         * call draws it; the store only keeps it. */
        if ((rc = idem__token_draw(k->token)) != IDEM_OK)
            break;
        rc = kv->token_put_start
                 ? kv->token_put_start(h->kv, k->l, s[0], s[1], k->token, k->ttl_ms,
                                       h->tokens_per_scene, now, c)
                 : kv->token_put(h->kv, s[0], s[1], k->token, k->ttl_ms, h->tokens_per_scene,
                                 now);
        if (!kv->token_put_start || rc != IDEM_OK)
            break;
        return;
    case CONSUME:
        rc = kv->token_consume_start
                 ? kv->token_consume_start(h->kv, k->l, s[0], s[1], s[2], s[3], now, &k->out,
                                           k->spent_key, c)
                 : kv->token_consume(h->kv, s[0], s[1], s[2], s[3], now, &k->out,
                                     k->spent_key);
        if (!kv->token_consume_start || rc != IDEM_OK)
            break;
        return;
    case GIVE_BACK:
        rc = kv->token_give_back_start
                 ? kv->token_give_back_start(h->kv, k->l, s[0], s[1], s[2], s[3], now,
                                             &k->out, c)
                 : kv->token_give_back(h->kv, s[0], s[1], s[2], s[3], now, &k->out);
        if (!kv->token_give_back_start || rc != IDEM_OK)
            break;
        return;
    case ACQUIRE:
        rc = kv->lock_acquire_start
                 ? kv->lock_acquire_start(h->kv, k->l, s[0], s[1], s[2], k->ttl_ms, now,
                                          &k->out, &k->info, c)
                 : kv->lock_acquire(h->kv, s[0], s[1], s[2], k->ttl_ms, now, &k->out,
                                    &k->info);
        if (!kv->lock_acquire_start || rc != IDEM_OK)
            break;
        return;
    case RENEW:
        rc = kv->lock_renew_start
                 ? kv->lock_renew_start(h->kv, k->l, s[0], s[1], s[2], k->ttl_ms, now,
                                        &k->out, c)
                 : kv->lock_renew(h->kv, s[0], s[1], s[2], k->ttl_ms, now, &k->out);
        if (!kv->lock_renew_start || rc != IDEM_OK)
            break;
        return;
    case RELEASE:
    default:
        rc = kv->lock_release_start
                 ? kv->lock_release_start(h->kv, k->l, s[0], s[1], s[2], now, &k->out, c)
                 : kv->lock_release(h->kv, s[0], s[1], s[2], now, &k->out);
        if (!kv->lock_release_start || rc != IDEM_OK)
            break;
        return;
    }
    /* Answered here: by the blocking operation, or by a start that could
     * not begin (which never calls done). Posted, so the callback still
     * runs on the loop and after this call has returned. */
    call_done(c, rc, idem_errdetail());
    idem__clear_detail(); /* the call itself succeeded */
}

/* Begin the call on loop and dispatch it; IDEM_ENOMEM (and k freed) when
 * the loop's state cannot be had. */
static idem_rc start(idem *h, idem_loop *loop, struct kv_call *k)
{
    struct idem__loop *l = idem__loop_of(h, loop);
    if (!l) {
        call_free(k);
        return IDEM_ENOMEM;
    }
    k->l = l;
    k->out = IDEM_NONE;
    idem__loop_begin(l);
    dispatch(h, k);
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_token_issue_async(idem *h, idem_loop *loop, const char *subject,
                                           const char *scene, int64_t ttl_ms,
                                           idem_token_fn cb, void *arg)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_issue(h, subject, scene, ttl_ms)) != IDEM_OK ||
        (rc = check_loop(loop, cb != NULL)) != IDEM_OK)
        return rc;
    const char *s[2] = {subject, scene};
    struct kv_call *k = call_new(ISSUE, 2, s);
    if (!k)
        return IDEM_ENOMEM;
    k->ttl_ms = ttl_ms;
    k->cb.token = cb;
    k->arg = arg;
    return start(h, loop, k);
}

IDEM_EXTERN idem_rc idem_token_consume_async(idem *h, idem_loop *loop, const char *subject,
                                             const char *scene, const char *token,
                                             const char *biz_key, idem_spend_fn cb, void *arg)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_spend(h, subject, scene, token, biz_key)) != IDEM_OK ||
        (rc = check_loop(loop, cb != NULL)) != IDEM_OK)
        return rc;
    const char *s[4] = {subject, scene, token, biz_key};
    struct kv_call *k = call_new(CONSUME, 4, s);
    if (!k)
        return IDEM_ENOMEM;
    k->cb.spend = cb;
    k->arg = arg;
    return start(h, loop, k);
}

IDEM_EXTERN idem_rc idem_token_give_back_async(idem *h, idem_loop *loop, const char *subject,
                                               const char *scene, const char *token,
                                               const char *biz_key, idem_outcome_fn cb,
                                               void *arg)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__token_check_spend(h, subject, scene, token, biz_key)) != IDEM_OK ||
        (rc = check_loop(loop, cb != NULL)) != IDEM_OK)
        return rc;
    const char *s[4] = {subject, scene, token, biz_key};
    struct kv_call *k = call_new(GIVE_BACK, 4, s);
    if (!k)
        return IDEM_ENOMEM;
    k->cb.outcome = cb;
    k->arg = arg;
    return start(h, loop, k);
}

/* A lock call: its checks, then the call. */
static idem_rc lock_call(idem *h, idem_loop *loop, enum op op, const char *space,
                         const char *key, const char *owner, int64_t ttl_ms, int has_cb,
                         struct kv_call **out)
{
    idem_rc rc;
    idem__clear_detail();
    if ((rc = idem__lock_check(h, space, key, owner)) != IDEM_OK ||
        (op != RELEASE && (rc = idem__check_lock_ttl(ttl_ms)) != IDEM_OK) ||
        (rc = check_loop(loop, has_cb)) != IDEM_OK)
        return rc;
    const char *s[3] = {space, key, owner};
    if (!(*out = call_new(op, 3, s)))
        return IDEM_ENOMEM;
    (*out)->ttl_ms = ttl_ms;
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_lock_acquire_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const char *owner, int64_t ttl_ms,
                                            idem_lock_fn cb, void *arg)
{
    struct kv_call *k;
    idem_rc rc = lock_call(h, loop, ACQUIRE, space, key, owner, ttl_ms, cb != NULL, &k);
    if (rc != IDEM_OK)
        return rc;
    k->cb.lock = cb;
    k->arg = arg;
    return start(h, loop, k);
}

IDEM_EXTERN idem_rc idem_lock_renew_async(idem *h, idem_loop *loop, const char *space,
                                          const char *key, const char *owner, int64_t ttl_ms,
                                          idem_outcome_fn cb, void *arg)
{
    struct kv_call *k;
    idem_rc rc = lock_call(h, loop, RENEW, space, key, owner, ttl_ms, cb != NULL, &k);
    if (rc != IDEM_OK)
        return rc;
    k->cb.outcome = cb;
    k->arg = arg;
    return start(h, loop, k);
}

IDEM_EXTERN idem_rc idem_lock_release_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const char *owner,
                                            idem_outcome_fn cb, void *arg)
{
    struct kv_call *k;
    idem_rc rc = lock_call(h, loop, RELEASE, space, key, owner, 0, cb != NULL, &k);
    if (rc != IDEM_OK)
        return rc;
    k->cb.outcome = cb;
    k->arg = arg;
    return start(h, loop, k);
}
