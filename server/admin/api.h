/* SPDX-License-Identifier: Apache-2.0 */
/*
 * api.h — the JSON API under /_idem/v1/ (api.c): one table of its
 * endpoints (method, path, listener, body fields, handler), which routes
 * every request, says what a 404 or a 405 offers instead, and which the
 * documentation's check reads.
 */
#ifndef IDEM_SERVER_API_H
#define IDEM_SERVER_API_H

#include "daemon.h"
#include "http/front.h"

/* A request for PREFIX/rest (rest: the path after "/_idem/v1/", or "" for
 * the prefix alone) on either listener; the admin listener's has been
 * through the admin door. Takes over lc; answers req, at once or from the
 * library's callback. Loop thread. */
void api_handle(struct daemon *d, struct live_config *lc, struct front_request *req,
                const char *rest);

#endif
