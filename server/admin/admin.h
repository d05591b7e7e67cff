/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.h — the admin listener's door (daemon): which API key a request
 * carries, and whether its scope lets it through.
 */
#ifndef IDEM_SERVER_ADMIN_H
#define IDEM_SERVER_ADMIN_H

#include "config.h"
#include "daemon.h"
#include "http/http_parser.h"
#include "http/response.h"

/* The key of cfg that m's "Authorization: Bearer KEY" names, or NULL. Every
 * key is compared, each in constant time, whichever matches: how long a
 * refusal takes says nothing of how close a guess came. */
const struct api_key *admin_key(const struct server_config *cfg, const struct http_msg *m);

/* NULL when key may make request m, else the answer: 401 without a key
 * (key NULL), 403 for a read key asked to change something. */
struct http_response *admin_refusal(const struct server_config *cfg, const struct api_key *key,
                                    const struct http_msg *m);

/* The door of the admin listener, on the loop: req's key checked, refused
 * with 401 (held back a second past ten failures from its address) or 403,
 * or let through with its use logged (once a minute per key). 1 when req
 * is answered (lc given up with it), 0 to go on to the JSON API. */
int admin_door(struct daemon *d, struct live_config *lc, struct front_request *req,
               const char *path);

#endif
