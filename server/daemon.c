/*
 * daemon.c — what every request of idem serve passes through (daemon): the
 * current configuration and its references, the answer, the store's write
 * health, and daemon_handle(), which sends each request where it goes —
 * the admin listener's key check and JSON API, the main listener's public
 * endpoints (health, token issuance under its rate limits), a route's
 * gateway, or the pass-through.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/admin.h"
#include "idem/libevent.h"
#include "admin/console.h"
#include "daemon.h"
#include "gateway/gateway.h"
#include "admin/metrics.h"
#include "mono.h"
#include "http/rate.h"
#include "gateway/request_key.h"
#include "gateway/router.h"
#include "workers.h"

/* ---- the configuration, answers, write health ---- */

struct live_config *daemon_config_get(struct daemon *d)
{
    pthread_mutex_lock(&d->cfg_mu);
    struct live_config *lc = d->live;
    atomic_fetch_add(&lc->refs, 1);
    pthread_mutex_unlock(&d->cfg_mu);
    return lc;
}

void daemon_config_put(struct live_config *lc)
{
    if (lc && atomic_fetch_sub(&lc->refs, 1) == 1) {
        config_free(lc->c);
        free(lc);
    }
}

struct live_config *daemon_config_ref(struct live_config *lc)
{
    atomic_fetch_add(&lc->refs, 1);
    return lc;
}

void daemon_answer(struct live_config *lc, struct front_request *req, struct http_response *r)
{
    daemon_config_put(lc);
    req->resp = r;
    front_answer(req);
}

void daemon_loop_settle(struct daemon_loop *l)
{
    if (!l->iloop)
        return;
    idem_loop_detach(l->d->h, l->iloop);
    idem_libevent_drain(l->iloop);
}

void daemon_write_ok(struct daemon *d)
{
    /* A load first: every request passes here, and the flag rarely changes. */
    if (atomic_load_explicit(&d->writes_failing, memory_order_relaxed))
        atomic_store(&d->writes_failing, 0);
}

void daemon_write_failed(struct daemon *d, idem_rc rc)
{
    /* Not the request's fault (too big, invalid): the store's. */
    if (rc == IDEM_ESTORE || rc == IDEM_ETIMEDOUT || rc == IDEM_EUNAVAILABLE)
        atomic_store(&d->writes_failing, 1);
}

/* ---- where a request goes ---- */

/* The JSON API calls the blocking primitives: on a worker. */
static void api_on_worker(struct front_request *req);
static void api_answer(struct front_request *req);

/* The JSON API for req (its endpoint checked by the caller), which keeps
 * lc: memory-only answers on the loop, the rest on a worker. */
static void to_api(struct daemon *d, struct live_config *lc, struct front_request *req,
                   const char *path)
{
    if (req->admin && strcmp(path, "/_idem/v1/metrics") == 0 &&
        (strcmp(req->msg->method, "GET") == 0 || strcmp(req->msg->method, "HEAD") == 0)) {
        /* Memory only: answered here, not behind workers a store holds up. */
        daemon_answer(lc, req, metrics_render(d));
        return;
    }
    req->state = lc;
    /* The record endpoints (a service finishing its own claims among
     * them) on the pool that Redis calls cannot hold up (daemon.h). */
    static const char records[] = "/_idem/v1/records/";
    struct workers *ws =
        strncmp(path, records, sizeof records - 1) == 0 ? d->record_workers : NULL;
    if (front_work_in(req, ws, api_on_worker, api_answer) != 0) {
        req->resp = problem(503, "shutting_down", "the server is shutting down");
        api_answer(req);
    }
}

/* A token issued on the main listener takes one from its subject's bucket
 * and one from its client address's (limits.token_rate_subject and
 * token_rate_peer, each a second's worth at most at once): a client that
 * varies its subject header still has one address, and what it can hold
 * at once is bounded by its rate times token_ttl_max. NULL, or the 429. */
static struct http_response *issue_rate_refusal(struct daemon *d, const struct server_config *cfg,
                                                struct front_request *req)
{
    const char *subject = http_msg_header(req->msg, cfg->subject_header);
    int64_t now = mono_us(), wait;
    const char *by = "client address";
    double peer_rate = (double)cfg->limits.token_rate_peer;
    double subject_rate = (double)cfg->limits.token_rate_subject;
    wait = rate_take(d->issued_by_peer, req->peer, front_peer_host(req->peer), peer_rate,
                     peer_rate, now);
    if (wait == 0 && subject) {
        by = "subject";
        wait = rate_take(d->issued_by_subject, subject, strlen(subject), subject_rate,
                         subject_rate, now);
    }
    if (wait == 0)
        return NULL;
    atomic_fetch_add(&d->tokens_refused, 1);
    struct http_response *r =
        problem(429, "too_many_tokens",
                "tokens are issued here at most %zu a second per %s: retry in %lld ms",
                by[0] == 's' ? cfg->limits.token_rate_subject : cfg->limits.token_rate_peer, by,
                (long long)wait);
    char secs[24];
    snprintf(secs, sizeof secs, "%lld", (long long)(wait + 999) / 1000);
    if (r)
        response_add_header(r, "Retry-After", secs);
    return r;
}

/* A request on the admin listener: the console's files (the same for
 * everyone, no data in them), else its key first (admin_door), then the
 * JSON API. */
static void admin_handle(struct daemon *d, struct live_config *lc, struct front_request *req,
                         const char *path, int api)
{
    if (console_answer(lc, req, path) || admin_door(d, lc, req, path))
        return;
    /* Where Prometheus looks by default: the same as /_idem/v1/metrics. */
    if (strcmp(path, "/metrics") == 0 &&
        (strcmp(req->msg->method, "GET") == 0 || strcmp(req->msg->method, "HEAD") == 0)) {
        daemon_answer(lc, req, metrics_render(d));
        return;
    }
    if (!api) {
        daemon_answer(lc, req, problem(404, "no_such_endpoint",
                                       "this is the admin listener: it serves the JSON API "
                                       "under /_idem/v1/, the metrics at /metrics and the "
                                       "operator console at /"));
        return;
    }
    to_api(d, lc, req, path);
}

static void api_on_worker(struct front_request *req)
{
    struct daemon_loop *loop = req->loop_ctx;
    struct live_config *lc = req->state;
    api_handle(loop->d, lc->c, req);
}

static void api_answer(struct front_request *req)
{
    /* A token issued, on either listener: counted for the metrics. */
    if (req->resp && req->resp->status == 201 && strcmp(req->msg->method, "POST") == 0) {
        char path[64];
        request_path(req->msg->target, path, sizeof path);
        if (strcmp(path, "/_idem/v1/tokens") == 0) {
            struct daemon_loop *loop = req->loop_ctx;
            atomic_fetch_add(&loop->d->tokens_issued, 1);
        }
    }
    daemon_config_put(req->state);
    front_answer(req);
}

void daemon_handle(void *arg, struct front_request *req)
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
    int api = strcmp(path, "/_idem/v1") == 0 || strncmp(path, "/_idem/v1/", 10) == 0;
    if (req->admin) {
        admin_handle(d, lc, req, path, api);
        return;
    }
    if (api) {
        const char *rest = path + (path[9] == '/' ? 10 : 9);
        if (!api_public_endpoint(rest)) {
            daemon_answer(lc, req,
                          problem(404, "no_such_endpoint",
                                  "%s is not served on this listener: clients get health and "
                                  "POST /_idem/v1/tokens here; the rest of the JSON API is on "
                                  "the admin listener (admin_listen), behind an API key",
                                  path));
            return;
        }
        if (strcmp(rest, "tokens") == 0 && strcmp(req->msg->method, "POST") == 0) {
            struct http_response *r = issue_rate_refusal(d, cfg, req);
            if (r) {
                daemon_answer(lc, req, r);
                return;
            }
        }
        to_api(d, lc, req, path);
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

