/* SPDX-License-Identifier: Apache-2.0 */
/*
 * primitives.h — the JSON API's endpoints for libidem's primitives
 * (primitives.c): tokens, locks and records, each a handler of the
 * endpoint table (api.c). Loop thread.
 */
#ifndef IDEM_SERVER_PRIMITIVES_H
#define IDEM_SERVER_PRIMITIVES_H

#include "admin/call.h"

void api_tokens(struct api_call *c);             /* POST tokens */
void api_tokens_consume(struct api_call *c);     /* POST tokens/consume */
void api_tokens_give_back(struct api_call *c);   /* POST tokens/give_back */
void api_locks(struct api_call *c);              /* POST locks/{acquire,renew,release} */
void api_records_begin(struct api_call *c);      /* POST records/begin */
void api_records_finish(struct api_call *c);     /* POST records/{complete,fail} */
void api_records_transition(struct api_call *c); /* POST records/transition */
void api_records_get(struct api_call *c);        /* GET records/{space}/{key} */

#endif
