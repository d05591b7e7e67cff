/* SPDX-License-Identifier: Apache-2.0 */
/*
 * router.c — which route takes a request (daemon): the first whose method
 * and path pattern match, in file order; none, and the request is passed
 * through to the default upstream. A path an upstream could read as a
 * route's path while this one does not — resolved segments, path
 * parameters, another spelling of the route's path — is refused instead:
 * it would reach the upstream's route unclaimed.
 */
#include "gateway/router.h"

#include <string.h>
#include <strings.h>

/* An escaped '/' (%2F): some servers decode it before they resolve a
 * path (nginx does), so it ends a segment as a '/' does. */
static int escaped_slash(const char *p)
{
    return p[0] == '%' && p[1] == '2' && (p[2] == 'f' || p[2] == 'F');
}

/* A path an upstream may read as another: a "." or ".." segment (also
 * spelt %2e) or an empty one ("//"), segments ending at '/' or %2F, which
 * most servers resolve or merge. Routes match the path as sent, so
 * /x/../refunds (or /x/..%2Frefunds) would miss the refund route and reach
 * the refund handler unclaimed. NULL, or what is wrong. */
static const char *path_not_plain(const char *path)
{
    const char *p = path;
    while (*p == '/' || escaped_slash(p)) {
        p += *p == '/' ? 1 : 3;
        size_t dots = 0, n = 0;
        for (; *p && *p != '/' && !escaped_slash(p); n++) {
            if (*p == '.') {
                dots++;
                p++;
            } else if (p[0] == '%' && p[1] == '2' && (p[2] == 'e' || p[2] == 'E')) {
                dots++;
                p += 3;
            } else {
                p++;
            }
        }
        if (n == 0 && *p)
            return "an empty segment (//)";
        if (n > 0 && dots == n && n <= 2)
            return "a \".\" or \"..\" segment";
    }
    return NULL;
}

/* A route whose path this one is another spelling of (case, a trailing
 * slash, an escaped letter), or NULL: such a request would go past the
 * route to an upstream that may take it for the route's path. */
static const struct route *route_spelt_otherwise(const struct server_config *cfg,
                                                 const struct http_msg *m, const char *path)
{
    char mine[8192];
    config_fold_path(path, mine, sizeof mine);
    for (size_t i = 0; i < cfg->route_count; i++) {
        const struct route *rt = &cfg->routes[i];
        if (rt->method ? strcasecmp(rt->method, m->method) != 0 : strcmp(m->method, "HEAD") == 0)
            continue;
        if (config_path_match(rt->folded_path, rt->prefix, mine))
            return rt;
    }
    return NULL;
}

/* A route without a method takes every method but HEAD, whose answer has
 * no body to store or replay: a HEAD goes past such a route untouched. */
static const struct route *match_route(const struct server_config *cfg, const struct http_msg *m,
                                       const char *path)
{
    for (size_t i = 0; i < cfg->route_count; i++) {
        const struct route *rt = &cfg->routes[i];
        if (rt->method ? strcmp(rt->method, m->method) != 0 : strcmp(m->method, "HEAD") == 0)
            continue;
        if (config_path_match(rt->path, rt->prefix, path))
            return rt;
    }
    return NULL;
}

const struct route *router_match(const struct server_config *cfg, const struct http_msg *m,
                                 const char *path, struct http_response **refused)
{
    *refused = NULL;
    const char *why = path_not_plain(path);
    const struct route *rt = why ? NULL : match_route(cfg, m, path);
    /* Servlet containers (Tomcat, Jetty) drop a segment's path parameters
     * before they map it, others keep them: /orders/O-1;a/refunds may be
     * order O-1 to the upstream, and another key here. */
    if (rt && strchr(path, ';')) {
        rt = NULL;
        why = "a ';' (path parameters, which some servers drop)";
    }
    const struct route *near = why || rt || !cfg->has_upstream
                                   ? NULL
                                   : route_spelt_otherwise(cfg, m, path);
    if (why || near) {
        *refused = why ? problem(400, "path_not_canonical",
                                 "the path holds %s, which servers resolve differently: "
                                 "send the path it stands for",
                                 why)
                       : problem(400, "path_not_canonical",
                                 "%s is another spelling of route %s's path %s%s: send it "
                                 "as that, or the request would reach the upstream "
                                 "unclaimed",
                                 path, near->name, near->path, near->prefix ? "*" : "");
        return NULL;
    }
    return rt;
}
