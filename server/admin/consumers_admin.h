/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumers_admin.h — what an operator does to a consumer on the admin
 * listener: put its dead letters back through the records (the redrive,
 * consume.h).
 */
#ifndef IDEM_SERVER_CONSUMERS_ADMIN_H
#define IDEM_SERVER_CONSUMERS_ADMIN_H

#include "admin/call.h"

#define REDRIVE_LIMIT_DEFAULT 1000
#define REDRIVE_LIMIT_MAX 100000

/* POST consumers/{name}/redrive, a handler of the endpoint table (api.c).
 * Loop thread. */
void api_consumers_redrive(struct api_call *c);

#endif
