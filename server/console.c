/*
 * console.c — what the operator console asks the daemon beside the JSON
 * API's records and counters (daemon), on the admin listener under
 * /_idem/v1/, for any API key:
 *
 *   GET whoami    the key's name and scope, so the console offers actions
 *                 to write keys only (the door refuses the others anyway)
 *   GET spaces    the key spaces the routes and consumers write to
 */
#include "console.h"

#include <jansson.h>
#include <string.h>

#include "admin.h"

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
        if (rt->unknown_hold)
            json_object_set_new(e, "holds", json_true());
    }
    for (size_t i = 0; list && i < cfg->consumer_count; i++) {
        const struct consumer_config *c = &cfg->consumers[i];
        json_t *e = space_entry(list, c->route.space);
        json_array_append_new(json_object_get(e, "consumers"), json_string(c->name));
    }
    return json_response(200, json_pack("{s:o}", "spaces", list));
}

int console_api_handle(const struct server_config *cfg, struct front_request *req,
                       const char *rest)
{
    const struct http_msg *m = req->msg;
    if (!req->admin || (strcmp(rest, "whoami") != 0 && strcmp(rest, "spaces") != 0))
        return 0;
    if (strcmp(m->method, "GET") != 0 && strcmp(m->method, "HEAD") != 0) {
        req->resp = problem(405, "method_not_allowed",
                            "%s /_idem/v1/%s: this endpoint takes GET, HEAD", m->method, rest);
        if (req->resp)
            response_add_header(req->resp, "Allow", "GET, HEAD");
        return 1;
    }
    req->resp = strcmp(rest, "whoami") == 0 ? whoami(cfg, m) : spaces(cfg);
    return 1;
}
