/* SPDX-License-Identifier: Apache-2.0 */
/*
 * api.c — the JSON API's endpoints, in one table (admin), as redis routes
 * every command through its command table: each row a method, a path under
 * /_idem/v1/, the listeners that serve it, the fields a POST body may
 * hold, and the handler. The router below reads it for every request, and
 * so does what a refusal says: a 404 names the endpoints the listener
 * serves, a 405 the methods the path takes. docs/http-api.md is the
 * normative reference, and tests/docs/test_openapi.py holds docs/openapi.yaml
 * against this table.
 *
 * Handlers run on the request's loop and never block (call.h): those that
 * need the store start the library's asynchronous calls.
 */
#include "admin/api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/call.h"
#include "admin/console.h"
#include "admin/consumers_admin.h"
#include "admin/health.h"
#include "admin/metrics.h"
#include "admin/primitives.h"
#include "admin/records_admin.h"

#define FIELDS_MAX 7

enum listeners {
    ADMIN_ONLY, /* the admin listener, behind an API key (POST: a write key) */
    BOTH,       /* the main listener too: what clients may do there */
};

struct endpoint {
    const char *method; /* "GET" (HEAD too) or "POST" */
    const char *path;   /* under /_idem/v1/; "records/{}" is records/{space}/{key} */
    enum listeners on;
    void (*handler)(struct api_call *c);
    /* A POST's body fields; any other is refused, as the configuration file
     * refuses unknown fields: a misspelt "retention" or "retriable" would
     * otherwise leave its default in force unnoticed. */
    const char *fields[FIELDS_MAX];
};

static const struct endpoint endpoints[] = {
    {"GET", "health", BOTH, api_health, {0}},
    {"GET", "health/ready", BOTH, api_health, {0}},
    {"GET", "health/live", BOTH, api_health_live, {0}},
    {"POST", "tokens", BOTH, api_tokens, {"scene", "ttl_ms"}},
    {"POST", "tokens/consume", ADMIN_ONLY, api_tokens_consume, {"scene", "token", "key"}},
    {"POST", "tokens/give_back", ADMIN_ONLY, api_tokens_give_back, {"scene", "token", "key"}},
    {"POST", "locks/acquire", ADMIN_ONLY, api_locks, {"space", "key", "owner", "ttl_ms"}},
    {"POST", "locks/renew", ADMIN_ONLY, api_locks, {"space", "key", "owner", "ttl_ms"}},
    {"POST", "locks/release", ADMIN_ONLY, api_locks, {"space", "key", "owner"}},
    {"POST", "records/begin", ADMIN_ONLY, api_records_begin,
     {"space", "key", "owner", "lease_ms", "fingerprint"}},
    {"POST", "records/complete", ADMIN_ONLY, api_records_finish,
     {"space", "key", "epoch", "result", "result_base64", "retention_ms"}},
    {"POST", "records/fail", ADMIN_ONLY, api_records_finish,
     {"space", "key", "epoch", "result", "result_base64", "retention_ms", "retryable"}},
    {"POST", "records/transition", ADMIN_ONLY, api_records_transition,
     {"space", "key", "from", "to"}},
    {"GET", "records", ADMIN_ONLY, api_records_list, {0}},
    {"GET", "records/held", ADMIN_ONLY, api_records_held, {0}},
    {"POST", "records/release", ADMIN_ONLY, api_records_act, {"space", "key", "epoch", "force"}},
    {"POST", "records/mark_failed", ADMIN_ONLY, api_records_act,
     {"space", "key", "epoch", "reason", "status", "force"}},
    {"POST", "records/delete", ADMIN_ONLY, api_records_act,
     {"space", "key", "epoch", "updated_ms"}},
    {"GET", "records/{}", ADMIN_ONLY, api_records_get, {0}},
    {"GET", "events", ADMIN_ONLY, api_events, {0}},
    {"GET", "metrics", ADMIN_ONLY, api_metrics, {0}},
    {"GET", "whoami", ADMIN_ONLY, api_whoami, {0}},
    {"GET", "spaces", ADMIN_ONLY, api_spaces, {0}},
    {"GET", "routes", ADMIN_ONLY, api_routes, {0}},
    {"GET", "routes/stats", ADMIN_ONLY, api_route_stats, {0}},
    {"POST", "consumers/{}/redrive", ADMIN_ONLY, api_consumers_redrive, {"limit", "reason"}},
};
#define ENDPOINTS (sizeof endpoints / sizeof endpoints[0])

static int serves(const struct endpoint *e, int admin)
{
    return admin || e->on == BOTH;
}

/* Whether e's path is rest's: its own; for a path ending in "{}", any
 * records/{space}/{key} that is not another endpoint's; for one with
 * "/{}/" inside, any one segment there. */
static int path_is(const struct endpoint *e, const char *rest)
{
    const char *mid = strstr(e->path, "/{}/");
    if (mid) {
        size_t pre = (size_t)(mid - e->path) + 1, post = strlen(mid + 3);
        size_t len = strlen(rest);
        const char *seg = rest + pre;
        return len > pre + post && strncmp(rest, e->path, pre) == 0 &&
               strcmp(rest + len - post, mid + 3) == 0 &&
               memchr(seg, '/', len - pre - post) == NULL;
    }
    size_t n = strlen(e->path);
    if (n < 2 || strcmp(e->path + n - 2, "{}") != 0)
        return strcmp(e->path, rest) == 0;
    n -= 2; /* "records/" */
    if (strncmp(rest, e->path, n) != 0 || !strchr(rest + n, '/'))
        return 0;
    for (size_t i = 0; i < ENDPOINTS; i++)
        if (strcmp(endpoints[i].path, rest) == 0)
            return 0;
    return 1;
}

static int method_is(const struct endpoint *e, const char *method)
{
    return strcmp(e->method, method) == 0 ||
           (strcmp(e->method, "GET") == 0 && strcmp(method, "HEAD") == 0);
}

/* "GET health, ..., POST tokens": the endpoints the listener serves. */
static void list_served(int admin, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < ENDPOINTS && n < cap; i++)
        if (serves(&endpoints[i], admin))
            n += (size_t)snprintf(out + n, cap - n, "%s%s %s", n ? ", " : "",
                                  endpoints[i].method,
                                  strcmp(endpoints[i].path, "records/{}") == 0
                                      ? "records/{space}/{key}"
                                      : endpoints[i].path);
}

/* NULL, or the 400 naming the first field of body e does not take. */
static struct http_response *unknown_field(const struct endpoint *e, json_t *body)
{
    const char *name;
    json_t *v;
    json_object_foreach(body, name, v) {
        size_t k = 0;
        while (k < FIELDS_MAX && e->fields[k] && strcmp(e->fields[k], name) != 0)
            k++;
        if (k < FIELDS_MAX && e->fields[k])
            continue;
        char list[160] = "";
        for (k = 0; k < FIELDS_MAX && e->fields[k]; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                     e->fields[k]);
        return problem(400, "invalid_field", "field %.64s: %s takes no such field (it takes %s)",
                       name, e->path, list);
    }
    return NULL;
}

/* The endpoint for req, or NULL with *refused its 404 or 405. */
static const struct endpoint *route(const struct front_request *req, const char *rest,
                                    struct http_response **refused)
{
    const char *method = req->msg->method;
    char allow[32] = "";
    for (size_t i = 0; i < ENDPOINTS; i++) {
        const struct endpoint *e = &endpoints[i];
        if (!serves(e, req->admin) || !path_is(e, rest))
            continue;
        if (method_is(e, method))
            return e;
        snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s",
                 allow[0] ? ", " : "", strcmp(e->method, "GET") == 0 ? "GET, HEAD" : e->method);
    }
    char served[1024];
    if (allow[0]) {
        *refused = problem(405, "method_not_allowed", "%s %s/%s: this endpoint takes %s",
                           method, API_PREFIX, rest, allow);
        if (*refused)
            response_add_header(*refused, "Allow", allow);
    } else if (req->admin) {
        list_served(1, served, sizeof served);
        *refused = problem(404, "no_such_endpoint",
                           "%s %s/%s is not an endpoint; the JSON API's are %s", method,
                           API_PREFIX, rest, served);
    } else {
        list_served(0, served, sizeof served);
        *refused = problem(404, "no_such_endpoint",
                           "%s/%s is not served on this listener: clients get %s here; the "
                           "rest of the JSON API is on the admin listener (admin_listen), "
                           "behind an API key",
                           API_PREFIX, rest, served);
    }
    return NULL;
}

void api_handle(struct daemon *d, struct live_config *lc, struct front_request *req,
                const char *rest)
{
    struct http_response *refused = NULL;
    const struct endpoint *e = route(req, rest, &refused);
    if (!e) {
        daemon_answer(lc, req, refused);
        return;
    }
    json_t *body = NULL;
    if (strcmp(e->method, "POST") == 0) {
        const struct http_msg *m = req->msg;
        json_error_t jerr;
        body = json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!body || !json_is_object(body)) {
            json_decref(body);
            daemon_answer(lc, req,
                          problem(400, "invalid_json", "the body must be a JSON object%s%s",
                                  body ? "" : ": ", body ? "" : jerr.text));
            return;
        }
        if ((refused = unknown_field(e, body)) != NULL) {
            json_decref(body);
            daemon_answer(lc, req, refused);
            return;
        }
    }
    size_t len = strlen(rest);
    struct api_call *c = calloc(1, sizeof *c + len + 1);
    if (!c) {
        json_decref(body);
        daemon_answer(lc, req, NULL);
        return;
    }
    c->d = d;
    c->lc = lc;
    c->cfg = lc->c;
    c->req = req;
    c->loop = ((struct daemon_loop *)req->loop_ctx)->iloop;
    c->body = body;
    c->subject = "";
    memcpy(c->rest, rest, len + 1);
    e->handler(c);
}
