/*
 * console.h — the operator console (daemon): its page on the admin
 * listener, and the two read endpoints it asks (whoami, spaces).
 */
#ifndef IDEM_SERVER_CONSOLE_H
#define IDEM_SERVER_CONSOLE_H

#include "config.h"
#include "daemon.h"

/* The console's files for a GET or HEAD of path on the admin listener,
 * before the admin door: 1 with req answered (lc given up with it), 0
 * when path is none of them. On the loop; memory only. */
int console_answer(struct live_config *lc, struct front_request *req, const char *path);

/* GET whoami and GET spaces, for a request of the admin listener whose
 * path is /_idem/v1/rest: 1 with req->resp set when rest is one of them,
 * 0 to leave it to the rest of the JSON API. */
int console_api_handle(const struct server_config *cfg, struct front_request *req,
                       const char *rest);

#endif
