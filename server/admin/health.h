/* SPDX-License-Identifier: Apache-2.0 */
/*
 * health.h — the JSON API's health endpoints (health.c), handlers of the
 * endpoint table (api.c). Loop thread.
 */
#ifndef IDEM_SERVER_HEALTH_H
#define IDEM_SERVER_HEALTH_H

#include "admin/call.h"

void api_health_live(struct api_call *c); /* GET health/live */
void api_health(struct api_call *c);      /* GET health, health/ready */

#endif
