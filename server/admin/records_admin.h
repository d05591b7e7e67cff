/*
 * records_admin.h — what an operator sees of records and does to them, on
 * the admin listener (daemon): listings, the claims in flight and held,
 * recent conflicts and takeovers, and the actions that resolve a claim.
 */
#ifndef IDEM_SERVER_RECORDS_ADMIN_H
#define IDEM_SERVER_RECORDS_ADMIN_H

#include <stdint.h>

#include "config.h"
#include "daemon.h"

/* The endpoints of this file, for a request of the admin listener whose
 * path is PREFIX/rest: 1 with req->resp set when rest is one of them, 0
 * to leave it to the rest of the JSON API. On a worker thread. */
int records_admin_handle(struct daemon *d, const struct server_config *cfg,
                         struct front_request *req, const char *rest);

#endif
