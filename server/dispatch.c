/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dispatch.c — where each request of idem serve goes: on the admin
 * listener, the console's files, else the admin door (the API key), then
 * the JSON API (admin/api.c) or the metrics at Prometheus's default path;
 * on the main listener, the JSON API's endpoints for clients, a route's
 * gateway, or, on no route, the pass-through. The top of the daemon: it
 * reads from every room and no room reads from it.
 */
#include "dispatch.h"

#include <string.h>

#include "admin/admin.h"
#include "admin/api.h"
#include "admin/console.h"
#include "daemon.h"
#include "gateway/gateway.h"
#include "gateway/request_key.h"
#include "gateway/router.h"

#define API_PATH "/_idem/v1"

/* The path under the JSON API's prefix ("" for the prefix alone), or NULL
 * when path is not the JSON API's. */
static const char *api_rest(const char *path)
{
    size_t n = sizeof API_PATH - 1;
    if (strncmp(path, API_PATH, n) != 0 || (path[n] != '\0' && path[n] != '/'))
        return NULL;
    return path[n] == '/' ? path + n + 1 : path + n;
}

static void admin_request(struct daemon *d, struct live_config *lc, struct front_request *req,
                          const char *path)
{
    if (console_answer(lc, req, path) || admin_door(d, lc, req, path))
        return;
    const char *rest = api_rest(path);
    /* Where Prometheus looks by default: the JSON API's metrics. */
    if (!rest && strcmp(path, "/metrics") == 0)
        rest = "metrics";
    if (!rest) {
        daemon_answer(lc, req, problem(404, "no_such_endpoint",
                                       "this is the admin listener: it serves the JSON API "
                                       "under /_idem/v1/, the metrics at /metrics and the "
                                       "operator console at /"));
        return;
    }
    api_handle(d, lc, req, rest);
}

void dispatch_request(void *arg, struct front_request *req)
{
    struct daemon *d = arg;
    struct live_config *lc = daemon_config_get(d);
    const struct server_config *cfg = lc->c;
    /* Routes, keys and the path checks all read the path from here: one
     * longer than this buffer is refused, never cut (a cut path would be
     * keyed and routed as another request than the one forwarded). */
    char path[8192];
    if (request_path(req->msg->target, path, sizeof path) >= sizeof path) {
        daemon_answer(lc, req,
                      problem(414, "path_too_long",
                              "the request's path (the target before any '?') is longer than "
                              "%zu bytes; a longer query is allowed, up to request_line_max",
                              sizeof path - 1));
        return;
    }
    if (req->admin) {
        admin_request(d, lc, req, path);
        return;
    }
    const char *rest = api_rest(path);
    if (rest) {
        api_handle(d, lc, req, rest);
        return;
    }
    struct http_response *refused = NULL;
    const struct route *rt = router_match(cfg, req->msg, path, &refused);
    if (refused) {
        daemon_answer(lc, req, refused);
        return;
    }
    if (rt) {
        req->route_n = rt->n; /* for the metrics, as the answer goes out */
        gateway_start(d, lc, rt, req); /* it keeps lc */
        return;
    }
    passthrough_start(d, cfg, req);
    daemon_config_put(lc);
}
