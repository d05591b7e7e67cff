/* SPDX-License-Identifier: Apache-2.0 */
/*
 * console.h — the operator console (daemon): its page on the admin
 * listener, and the two read endpoints it asks (whoami, spaces).
 */
#ifndef IDEM_SERVER_CONSOLE_H
#define IDEM_SERVER_CONSOLE_H

#include "admin/call.h"
#include "config.h"
#include "daemon.h"

/* The console's files for a GET or HEAD of path on the admin listener,
 * before the admin door: 1 with req answered (lc given up with it), 0
 * when path is none of them. On the loop; memory only. */
int console_answer(struct live_config *lc, struct front_request *req, const char *path);

/* GET whoami and GET spaces, handlers of the endpoint table (api.c). */
void api_whoami(struct api_call *c);
void api_spaces(struct api_call *c);
/* GET routes: each route and consumer, its match, key, layers and policies. */
void api_routes(struct api_call *c);

#endif
