/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resolve_config.c — a route's resolve: section (resolve_config.h).
 */
#include "gateway/resolve_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_print.h"
#include "gateway/request_key.h"
#include "http/upstream.h"

void route_resolve_free(struct route_resolve *r)
{
    if (!r)
        return;
    free(r->url.host);
    free(r->url.base_path);
    upstream_addrs_put(r->url.addrs);
    free(r);
}

/* Every {name} in the path is {key} or {space}. */
static const char *bad_placeholder(const char *path)
{
    for (const char *p = strchr(path, '{'); p; p = strchr(p + 1, '{'))
        if (strncmp(p, "{key}", 5) != 0 && strncmp(p, "{space}", 7) != 0)
            return p;
    return NULL;
}

int config_get_resolve(struct config_ctx *c, const yaml_node_t *n, const char *path,
                       struct route_resolve **out)
{
    static const char *const fields[] = {"url",     "after",    "backoff",
                                         "give_up", "executed", "not_executed"};
    char fpath[160];
    const yaml_node_t *v;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping: { url: http://127.0.0.1:9000/"
                           "refunds/{key}, executed: [200], not_executed: [404] }, got %s",
                           config_kind_name(n));
    if (config_check_fields(c, n, path, fields, sizeof fields / sizeof fields[0]))
        return -1;
    struct route_resolve *r = calloc(1, sizeof *r);
    if (!r)
        return config_oom(c);
    *out = r;
    r->after_ms = 1000;
    r->backoff_ms[0] = 1000, r->backoff_ms[1] = 5000, r->backoff_ms[2] = 30000;
    r->backoff_count = 3;
    r->give_up_ms = MS_HOUR;
#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if (!(v = FIELD("url")))
        return config_fail(c, n, path, "url is required: the status query, GET, with {key} "
                           "for the record's key (http://127.0.0.1:9000/refunds/{key})");
    if (config_get_upstream(c, v, fpath, &r->url))
        return -1;
    r->url.line = (unsigned long)v->start_mark.line + 1;
    const char *bad = bad_placeholder(r->url.base_path);
    if (bad)
        return config_fail(c, v, fpath, "%.*s: the URL's path may hold {key} and {space}, "
                           "nothing else in braces", (int)strcspn(bad, "}") + 1, bad);
    if (!strstr(r->url.base_path, "{key}"))
        return config_fail(c, v, fpath, "the URL names no {key}: the status query asks about "
                           "one record's key");
    if ((v = FIELD("after")) && config_get_duration(c, v, fpath, 100, MS_DAY, &r->after_ms))
        return -1;
    if ((v = FIELD("backoff")) &&
        config_get_durations(c, v, fpath, 100, MS_DAY, r->backoff_ms, RESOLVE_BACKOFFS_MAX,
                             &r->backoff_count))
        return -1;
    if ((v = FIELD("give_up")) &&
        config_get_duration(c, v, fpath, MS_SEC, 30 * MS_DAY, &r->give_up_ms))
        return -1;
    if (!(v = FIELD("executed")))
        return config_fail(c, n, path, "executed is required: the status query's answers that "
                           "mean the request executed, like [200]");
    if (config_get_status_set(c, v, fpath, r->executed))
        return -1;
    if (!(v = FIELD("not_executed")))
        return config_fail(c, n, path, "not_executed is required: the answers that mean it did "
                           "not, like [404]");
    if (config_get_status_set(c, v, fpath, r->not_executed))
        return -1;
    for (int st = 100; st <= 599; st++)
        if (status_set_has(r->executed, st) && status_set_has(r->not_executed, st))
            return config_fail(c, v, fpath, "%d is in executed too: an answer means one thing",
                               st);
#undef FIELD
    return 0;
}

void config_print_resolve(struct config_out *o, int indent, const struct route_resolve *r)
{
    config_put_key(o, indent, "resolve");
    config_put_upstream(o, indent + 2, "url", &r->url);
    config_put_duration(o, indent + 2, "after", r->after_ms);
    config_put_durations(o, indent + 2, "backoff", r->backoff_ms, r->backoff_count);
    config_put_duration(o, indent + 2, "give_up", r->give_up_ms);
    config_put_status_set(o, indent + 2, "executed", r->executed);
    config_put_status_set(o, indent + 2, "not_executed", r->not_executed);
}

int resolve_target(const struct route_resolve *r, const char *space, const char *key, char *out,
                   size_t cap)
{
    const char *p = *r->url.base_path ? r->url.base_path : "/";
    size_t o = 0;
    while (*p) {
        if (strncmp(p, "{key}", 5) == 0 || strncmp(p, "{space}", 7) == 0) {
            int is_key = p[1] == 'k';
            if (request_pct_encode(is_key ? key : space, out, cap, &o))
                return -1;
            p += is_key ? 5 : 7;
            continue;
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = *p++;
    }
    out[o] = '\0';
    return 0;
}

int64_t resolve_wait_ms(const struct route_resolve *r, unsigned n)
{
    if (n == 0)
        return r->after_ms;
    return r->backoff_ms[n - 1 < r->backoff_count ? n - 1 : r->backoff_count - 1];
}
