/* SPDX-License-Identifier: Apache-2.0 */
/*
 * records_admin.h — what an operator sees of records and does to them, on
 * the admin listener (daemon): listings, the claims in flight and held,
 * recent conflicts and takeovers, and the actions that resolve a claim.
 */
#ifndef IDEM_SERVER_RECORDS_ADMIN_H
#define IDEM_SERVER_RECORDS_ADMIN_H

#include <stdint.h>

#include "admin/call.h"

/* The endpoints of records_admin.c, handlers of the endpoint table
 * (api.c). Loop thread. */
void api_records_list(struct api_call *c); /* GET records */
void api_records_held(struct api_call *c); /* GET records/held */
void api_events(struct api_call *c);       /* GET events */
void api_records_act(struct api_call *c);  /* POST records/{release,mark_failed,delete} */

#endif
