/*
 * kv_async.h — what the token and lock layers share with their
 * asynchronous calls (kv_async.c): the argument checks, so that a call and
 * its _async form refuse exactly the same input.
 */
#ifndef IDEM_KV_ASYNC_H
#define IDEM_KV_ASYNC_H

#include "idem.h"

/* idem_token_issue's checks but the out-parameter's (token.c). */
idem_rc idem__token_check_issue(idem *h, const char *subject, const char *scene,
                                int64_t ttl_ms);
/* A fresh token, as idem_token_issue draws it. */
idem_rc idem__token_draw(char token[IDEM_TOKEN_LEN + 1]);

/* idem_token_consume's and idem_token_give_back's checks but the
 * out-parameter's (token.c). */
idem_rc idem__token_check_spend(idem *h, const char *subject, const char *scene,
                                const char *token, const char *biz_key);

/* The lock calls' checks but the out-parameter's and the TTL's (lock.c). */
idem_rc idem__lock_check(idem *h, const char *space, const char *key, const char *owner);

#endif
