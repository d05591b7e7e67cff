/* SPDX-License-Identifier: Apache-2.0 */
/*
 * token.h — what the token layer offers the public API layer above it
 * (kv_async.c, the asynchronous token calls): its argument checks, so that
 * a call and its _async form refuse exactly the same input, and the
 * drawing of a token, so that a token is made in one place.
 */
#ifndef IDEM_TOKEN_H
#define IDEM_TOKEN_H

#include <stdint.h>

#include "idem.h"

/* idem_token_issue's checks but the out-parameter's. */
idem_rc idem__token_check_issue(idem *h, const char *subject, const char *scene,
                                int64_t ttl_ms);

/* A fresh token, as idem_token_issue draws it. */
idem_rc idem__token_draw(char token[IDEM_TOKEN_LEN + 1]);

/* idem_token_consume's and idem_token_give_back's checks but the
 * out-parameter's. */
idem_rc idem__token_check_spend(idem *h, const char *subject, const char *scene,
                                const char *token, const char *biz_key);

#endif
