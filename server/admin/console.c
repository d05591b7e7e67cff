/* SPDX-License-Identifier: Apache-2.0 */
/*
 * console.c — the operator console (daemon): a web page on the admin
 * listener, at / (and /console), with its script and style sheet beside it
 * (/console.js, /console.css), each embedded in the binary at build time
 * (scripts/mkembed.sh from server/admin/console/). The page is the same for
 * everyone and holds no data: what it shows it fetches from the JSON API
 * with the API key the operator signs in with, so the page itself is
 * served before the admin door asks for a key, and only on the admin
 * listener. docs/console.md is the operator's guide.
 *
 * Two read endpoints under /_idem/v1/ are the console's (any API key):
 *
 *   GET whoami    the key's name and scope, so the page offers actions to
 *                 write keys only (the door refuses the others anyway)
 *   GET spaces    the key spaces the routes and consumers write to
 */
#include "admin/console.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "admin/admin.h"
#include "config_value.h"
#include "gateway/signature.h"
#include "gateway/states_config.h"
#include "console_css.h"
#include "console_html.h"
#include "console_js.h"

/* What a browser is told with each file: nothing but the daemon's own
 * script and style, never in a frame (clickjacking an action), no guessed
 * types, no Referer out, nothing cached (the page changes with the
 * binary; the data is never in it). */
static const char *const strict_headers[][2] = {
    {"Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
     "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"},
    {"X-Frame-Options", "DENY"},
    {"X-Content-Type-Options", "nosniff"},
    {"Referrer-Policy", "no-referrer"},
    {"Cache-Control", "no-store"},
    {"Cross-Origin-Opener-Policy", "same-origin"},
    {"Cross-Origin-Resource-Policy", "same-origin"},
};

static const struct {
    const char *path, *type;
    const unsigned char *body;
    const size_t *len;
} files[] = {
    {"/", "text/html; charset=utf-8", console_html, &console_html_len},
    {"/console", "text/html; charset=utf-8", console_html, &console_html_len},
    {"/console.js", "text/javascript; charset=utf-8", console_js, &console_js_len},
    {"/console.css", "text/css; charset=utf-8", console_css, &console_css_len},
};

int console_answer(struct live_config *lc, struct front_request *req, const char *path)
{
    const char *method = req->msg->method;
    if (!req->admin || (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0))
        return 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        if (strcmp(path, files[i].path) != 0)
            continue;
        struct http_response *r = response_new(200);
        int bad = !r || response_add_header(r, "Content-Type", files[i].type);
        for (size_t h = 0; !bad && h < sizeof strict_headers / sizeof strict_headers[0]; h++)
            bad = response_add_header(r, strict_headers[h][0], strict_headers[h][1]);
        if (bad || response_set_body(r, files[i].body, *files[i].len)) {
            response_free(r);
            r = NULL; /* 503 */
        }
        daemon_answer(lc, req, r);
        return 1;
    }
    return 0;
}

/* GET whoami: the request's key (the door let it in, so there is one). */
static struct http_response *whoami(const struct server_config *cfg, const struct http_msg *m)
{
    const struct api_key *k = admin_key(cfg, m);
    if (!k)
        return problem(401, "unauthorized", "no API key of this daemon");
    return json_response(200, json_pack("{s:s, s:s, s:b}", "name", k->name, "scope",
                                        k->write ? "write" : "read", "write", k->write));
}

/* The entry of spaces for space, made when new. */
static json_t *space_entry(json_t *spaces, const char *space)
{
    size_t i;
    json_t *e;
    json_array_foreach(spaces, i, e)
        if (strcmp(json_string_value(json_object_get(e, "space")), space) == 0)
            return e;
    e = json_pack("{s:s, s:[], s:[], s:b}", "space", space, "routes", "consumers", "holds", 0);
    json_array_append_new(spaces, e);
    return e;
}

/* GET spaces: each space with the routes and consumers on it, and whether
 * one holds its unknown outcomes (records/held takes that space). */
static struct http_response *spaces(const struct server_config *cfg)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < cfg->route_count; i++) {
        const struct route *rt = &cfg->routes[i];
        json_t *e = space_entry(list, rt->space);
        json_array_append_new(json_object_get(e, "routes"), json_string(rt->name));
        if (config_route_holds(rt))
            json_object_set_new(e, "holds", json_true());
    }
    for (size_t i = 0; list && i < cfg->consumer_count; i++) {
        const struct consumer_config *c = &cfg->consumers[i];
        json_t *e = space_entry(list, c->route.space);
        json_array_append_new(json_object_get(e, "consumers"), json_string(c->route.name));
        if (config_route_holds(&c->route))
            json_object_set_new(e, "holds", json_true());
    }
    return json_response(200, json_pack("{s:o}", "spaces", list));
}

/* A key part as the configuration says it: "json refund_no". */
static json_t *part_json(const struct key_part *k)
{
    static const char *const sources[] = {
        [KEY_HEADER] = "header", [KEY_JSON] = "json", [KEY_QUERY] = "query",
        [KEY_PATH_SEGMENT] = "path_segment", [KEY_FORM] = "form",
        [KEY_WECHATPAY_RESOURCE] = "wechatpay_resource",
    };
    char seg[16];
    snprintf(seg, sizeof seg, "%d", k->segment);
    return json_pack("{s:s, s:s}", "source", sources[k->source], "name",
                     k->source == KEY_PATH_SEGMENT ? seg : k->name);
}

/* What a route (or a consumer's) does, for the console's routes view. */
static json_t *route_json(const struct route *rt, int consumer)
{
    json_t *key = json_array(), *layers = json_array();
    for (size_t i = 0; i < rt->key_parts; i++)
        json_array_append_new(key, part_json(&rt->key[i]));
    if (rt->layer_token)
        json_array_append_new(layers, json_string("token"));
    if (rt->layer_lock)
        json_array_append_new(layers, json_string("lock"));
    json_array_append_new(layers, json_string("record"));
    char up[URL_PATH_MAX + 400];
    config_upstream_text(&rt->upstream, up, sizeof up);
    json_t *j = json_pack(
        "{s:s, s:s, s:o, s:o, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:s}", "name", rt->name,
        "kind", consumer ? "consumer" : "route", "key", key, "layers", layers, "space",
        rt->space, "scope", rt->scope_subject ? "subject" : "global", "upstream", up, "lease_ms",
        (json_int_t)rt->lease_ms, "retention_ms", (json_int_t)rt->retention_ms, "tombstone_ms",
        (json_int_t)rt->tombstone_ms, "upstream_timeout_ms", (json_int_t)rt->upstream_timeout_ms,
        "in_flight", rt->in_flight_wait ? "wait" : "reject", "on_unknown_outcome",
        rt->resolve ? "resolve" : rt->unknown_hold ? "hold" : "expire");
    if (!j)
        return NULL;
    if (!consumer) {
        char match[300];
        snprintf(match, sizeof match, "%s %s%s", rt->method ? rt->method : "*", rt->path,
                 rt->prefix ? "*" : "");
        json_object_set_new(j, "match", json_string(match));
    }
    if (rt->states)
        json_object_set_new(j, "states",
                            json_pack("{s:s, s:o}", "initial",
                                      idem_machine_initial(rt->states->machine), "field",
                                      part_json(&rt->states->field)));
    if (rt->signature)
        json_object_set_new(j, "signature",
                            json_string(signature_scheme_name(rt->signature->scheme)));
    return j;
}

/* GET routes: every route and consumer, as configured now. */
static struct http_response *routes(const struct server_config *cfg)
{
    json_t *list = json_array();
    for (size_t i = 0; list && i < cfg->route_count; i++)
        json_array_append_new(list, route_json(&cfg->routes[i], 0));
    for (size_t i = 0; list && i < cfg->consumer_count; i++)
        json_array_append_new(list, route_json(&cfg->consumers[i].route, 1));
    return json_response(200, json_pack("{s:o}", "routes", list));
}

void api_routes(struct api_call *c)
{
    api_answer(c, routes(c->cfg));
}

void api_whoami(struct api_call *c)
{
    api_answer(c, whoami(c->cfg, c->req->msg));
}

void api_spaces(struct api_call *c)
{
    api_answer(c, spaces(c->cfg));
}
