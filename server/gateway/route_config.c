/* SPDX-License-Identifier: Apache-2.0 */
/*
 * route_config.c — reads routes: (and the global problems:) of idem serve's
 * configuration into struct route (route_config.h): each route's match, its
 * key and key parts, its layers, its record's policy (lease, retention,
 * replay_headers, fingerprint, store_statuses) and its problems' texts,
 * then what no route can see alone (two routes of one token scene in two
 * spaces, one space built two ways, a route shadowed by another). A
 * consumer's route is read with the same parts (consume/consumer_config.c).
 * The values are read with config_value.h; config.c calls in here.
 */
#include "gateway/route_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_print.h"
#include "config_value.h"
#include "gateway/signature.h"
#include "gateway/signature_config.h"
#include "gateway/resolve_config.h"
#include "gateway/states_config.h"
#include "http/http_parser.h"
#include "http/upstream.h"
#include "utf8.h"

#define ROUTES_MAX 1000
#define KEY_PARTS_MAX 8

/* ------------------------------------------------------------------------- */
/* Freeing and defaults. */

void config_problems_free(struct problem_text *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(p[i].type);
        free(p[i].title);
        free(p[i].detail);
    }
    free(p);
}

void config_route_free(struct route *r)
{
    signature_free(r->signature);
    route_states_free(r->states);
    route_resolve_free(r->resolve);
    free(r->name);
    free(r->method);
    free(r->path);
    free(r->folded_path);
    free(r->upstream.host);
    free(r->upstream.base_path);
    upstream_addrs_put(r->upstream.addrs);
    for (size_t i = 0; i < r->key_parts; i++)
        free(r->key[i].name);
    free(r->key);
    free(r->space);
    free(r->token_scene);
    config_free_list(r->replay_headers, r->replay_header_count);
    config_free_list(r->fingerprint_fields, r->fingerprint_field_count);
    config_problems_free(r->problems, r->problem_count);
}


/* A route's defaults, before its fields are read. Strings that default to the
 * name are filled in after. */
int config_route_defaults(struct route *r)
{
    r->wait_timeout_ms = 5 * MS_SEC;
    r->lease_ms = 30 * MS_SEC;
    r->retention_ms = MS_DAY;
    r->upstream_timeout_ms = 30 * MS_SEC;
    r->fails_from = 500;
    r->fingerprint = FINGERPRINT_BODY;
    r->replay_headers = calloc(1, sizeof *r->replay_headers);
    if (!r->replay_headers || !(r->replay_headers[0] = strdup("content-type")))
        return -1;
    r->replay_header_count = 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* A route's parts. */

static int get_match(struct config_ctx *c, const yaml_node_t *n, const char *path,
                     struct route *r)
{
    static const char *const known[] = {"method", "path"};
    char fpath[64];
    const yaml_node_t *v;
    const char *s;
    if (config_check_fields(c, n, path, known, 2))
        return -1;
    if ((v = config_field(c, n, "method"))) {
        config_join(fpath, sizeof fpath, path, "method");
        if (config_scalar(c, v, fpath, "an HTTP method like POST", &s))
            return -1;
        if (!config_is_token(s, 32))
            return config_fail(c, v, fpath, "%s is not an HTTP method", config_quote(c, s));
        char *m = strdup(s);
        if (!m)
            return config_oom(c);
        for (char *p = m; *p; p++)
            if (*p >= 'a' && *p <= 'z')
                *p = (char)(*p - 'a' + 'A');
        r->method = m;
    }
    if (!(v = config_field(c, n, "path")))
        return config_fail(c, n, path, "path is required (e.g. path: /refunds, or "
                           "/refunds/* for a prefix)");
    config_join(fpath, sizeof fpath, path, "path");
    if (config_scalar(c, v, fpath, "a path like /refunds", &s))
        return -1;
    size_t len = strlen(s);
    if (s[0] != '/')
        return config_fail(c, v, fpath, "%s must start with /", config_quote(c, s));
    if (len > URL_PATH_MAX)
        return config_fail(c, v, fpath, "longer than 2048 bytes");
    for (size_t i = 0; i < len; i++)
        if (!config_url_path_char((unsigned char)s[i]))
            return config_fail(c, v, fpath, "%s: a path has no spaces, control "
                               "characters, query (?) or fragment (#)", config_quote(c, s));
    r->prefix = len >= 2 && s[len - 2] == '/' && s[len - 1] == '*';
    if (r->prefix)
        len--;
    for (size_t i = 0; i < len; i++)
        if (s[i] == '*' && (s[i - 1] != '/' || (i + 1 < len && s[i + 1] != '/')))
            return config_fail(c, v, fpath,
                               "%s: '*' stands for a whole segment (/orders/*/refunds) "
                               "or, last, for every path below (/refunds/*), never for part of one",
                               config_quote(c, s));
    if (!(r->path = strndup(s, len)) || !(r->folded_path = malloc(len + 2)))
        return config_oom(c);
    /* Folding drops a final '/', which a prefix needs: it is put back. */
    config_fold_path(r->path, r->folded_path, len + 1); /* never longer */
    size_t flen = strlen(r->folded_path);
    if (r->prefix && r->folded_path[flen - 1] != '/')
        memcpy(r->folded_path + flen, "/", 2);
    return 0;
}

int config_path_match(const char *pattern, int prefix, const char *path)
{
    for (const char *p = pattern; *p; p++) {
        if (*p == '*' && p[-1] == '/' && (p[1] == '/' || !p[1])) {
            /* One segment, whatever it holds, but something. */
            if (!*path || *path == '/')
                return 0;
            path += strcspn(path, "/");
            continue;
        }
        if (*p != *path)
            return 0;
        path++;
    }
    return prefix || !*path;
}

void config_fold_path(const char *path, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *c = path; *c && o + 1 < cap; c++) {
        int ch = (unsigned char)*c;
        if (ch == ';') {
            /* A path parameter, dropped to the segment's end. */
            while (c[1] && c[1] != '/' && !(c[1] == '%' && c[2] == '2' && (c[3] | 32) == 'f'))
                c++;
            continue;
        }
        if (ch == '%' && http_hex_value((unsigned char)c[1]) >= 0 &&
            http_hex_value((unsigned char)c[2]) >= 0) {
            int v = http_hex_value((unsigned char)c[1]) * 16 +
                    http_hex_value((unsigned char)c[2]);
            if ((v >= 'A' && v <= 'Z') || (v >= 'a' && v <= 'z') || (v >= '0' && v <= '9') ||
                v == '-' || v == '.' || v == '_' || v == '~' || v == '/') {
                ch = v;
                c += 2;
            }
        }
        out[o++] = (char)(ch >= 'A' && ch <= 'Z' ? ch + 32 : ch);
    }
    if (o > 1 && out[o - 1] == '/')
        o--;
    out[o] = '\0';
}

int config_check_resource_parts(struct config_ctx *c, const yaml_node_t *n, const char *path,
                                const struct route *r)
{
    int named = r->states && r->states->field.source == KEY_WECHATPAY_RESOURCE;
    for (size_t i = 0; i < r->key_parts; i++)
        named |= r->key[i].source == KEY_WECHATPAY_RESOURCE;
    if (!named || (r->signature && r->signature->scheme == SIGNATURE_WECHATPAY_V3 &&
                   r->signature->has_apiv3_key))
        return 0;
    return config_fail(c, n, path, "wechatpay_resource names a field of a WeChat Pay "
                       "notification's encrypted resource: give signature: { scheme: "
                       "wechatpay_v3, public_keys: [...], apiv3_key: { env: NAME } } to "
                       "check and decrypt it");
}

int config_get_key(struct config_ctx *c, const yaml_node_t *n, const char *path,
                   struct route *r, int for_consumer)
{
    char ipath[64];
    if (n->type == YAML_MAPPING_NODE) {
        if (!(r->key = calloc(1, sizeof *r->key)))
            return config_oom(c);
        r->key_parts = 1;
        return config_get_key_part(c, n, path, &r->key[0], for_consumer);
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return config_fail(c, n, path, "expected a mapping like { json: refund_no } or a "
                           "list of them, got %s", config_kind_name(n));
    yaml_node_item_t *it = n->data.sequence.items.start;
    size_t count = (size_t)(n->data.sequence.items.top - it);
    if (count == 0 || count > KEY_PARTS_MAX)
        return config_fail(c, n, path, "a composite key has 1 to %d parts, not %zu",
                           KEY_PARTS_MAX, count);
    if (!(r->key = calloc(count, sizeof *r->key)))
        return config_oom(c);
    r->key_parts = count;
    for (size_t i = 0; i < count; i++) {
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_get_key_part(c, config_node(c, it[i]), ipath, &r->key[i], for_consumer))
            return -1;
    }
    return 0;
}

static int get_layers(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      struct route *r)
{
    yaml_node_item_t *it;
    size_t count;
    int record = 0;
    if (config_list_items(c, n, path, "a list like [token, lock, record]", &it, &count))
        return -1;
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *v = config_node(c, it[i]);
        const char *s;
        int *flag;
        char ipath[112];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_scalar(c, v, ipath, "token, lock or record", &s))
            return -1;
        if (!strcmp(s, "token"))
            flag = &r->layer_token;
        else if (!strcmp(s, "lock"))
            flag = &r->layer_lock;
        else if (!strcmp(s, "record"))
            flag = &record;
        else
            return config_fail(c, v, ipath, "%s is not a layer (use token, lock, record)",
                               config_quote(c, s));
        if (*flag)
            return config_fail(c, v, ipath, "%s is listed twice", s);
        *flag = 1;
    }
    if (!record)
        return config_fail(c, n, path, "record is always on: list it (e.g. [record], "
                           "[lock, record] or [token, lock, record])");
    return 0;
}

static int get_replay_headers(struct config_ctx *c, const yaml_node_t *n, const char *path,
                              struct route *r)
{
    yaml_node_item_t *it;
    size_t count;
    if (config_list_items(c, n, path, "a list of header names", &it, &count))
        return -1;
    if (count > LIST_MAX)
        return config_fail(c, n, path, "%zu headers; at most %d", count, LIST_MAX);
    config_free_list(r->replay_headers, r->replay_header_count);
    r->replay_header_count = 0;
    if (!(r->replay_headers = calloc(count ? count : 1, sizeof *r->replay_headers)))
        return config_oom(c);
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *v = config_node(c, it[i]);
        const char *s;
        char *h, ipath[112];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_get_header_name(c, v, ipath, &s))
            return -1;
        if (!(h = config_lower_dup(s)))
            return config_oom(c);
        r->replay_headers[r->replay_header_count++] = h;
        /* The names the store never keeps (http_is_replayable_name), each
         * also spelt with '_' (Keep_Alive), as CGI-style upstreams read it. */
        if (http_is_hop_by_hop(NULL, h))
            return config_fail(c, v, ipath, "%s is a hop-by-hop header: it is never "
                               "stored, so it cannot be replayed", h);
        if (http_name_alike(h, "content-length"))
            return config_fail(c, v, ipath, "%s is computed for each reply; "
                               "leave it out", h);
        for (size_t j = 0; j + 1 < r->replay_header_count; j++)
            if (!strcmp(h, r->replay_headers[j]))
                return config_fail(c, v, ipath, "%s is listed twice", h);
    }
    return 0;
}

static int get_fingerprint(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           struct route *r)
{
    if (n->type == YAML_SCALAR_NODE) {
        const char *s;
        if (config_scalar(c, n, path, "body, none or a list of JSON fields", &s))
            return -1;
        if (!strcmp(s, "body"))
            r->fingerprint = FINGERPRINT_BODY;
        else if (!strcmp(s, "none"))
            r->fingerprint = FINGERPRINT_NONE;
        else
            return config_fail(c, n, path, "%s is not body, none or a list of JSON fields",
                               config_quote(c, s));
        return 0;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return config_fail(c, n, path, "expected body, none or a list of JSON fields, got %s",
                           config_kind_name(n));
    yaml_node_item_t *it = n->data.sequence.items.start;
    size_t count = (size_t)(n->data.sequence.items.top - it);
    if (count == 0)
        return config_fail(c, n, path, "an empty list: to fingerprint nothing, say none");
    if (count > LIST_MAX)
        return config_fail(c, n, path, "%zu fields; at most %d", count, LIST_MAX);
    if (!(r->fingerprint_fields = calloc(count, sizeof *r->fingerprint_fields)))
        return config_oom(c);
    r->fingerprint = FINGERPRINT_FIELDS;
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *v = config_node(c, it[i]);
        const char *s;
        char ipath[112];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_get_json_field(c, v, ipath, &s))
            return -1;
        for (size_t j = 0; j < r->fingerprint_field_count; j++)
            if (!strcmp(s, r->fingerprint_fields[j]))
                return config_fail(c, v, ipath, "%s is listed twice", config_quote(c, s));
        if (!(r->fingerprint_fields[r->fingerprint_field_count] = strdup(s)))
            return config_oom(c);
        r->fingerprint_field_count++;
    }
    return 0;
}

/* What a route and a consumer say alike of their records: space (default:
 * the name), lease, retention, tombstone, replay_headers, fingerprint,
 * states. */
int config_get_record_fields(struct config_ctx *c, const yaml_node_t *n, const char *path,
                             struct route *r, int for_consumer)
{
    char fpath[96];
    const yaml_node_t *v;
#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if ((v = FIELD("space")) && config_get_name(c, v, fpath, &r->space))
        return -1;
    if (!r->space && config_set_string(&r->space, r->name))
        return config_oom(c);
    /* At least a second: the gateway extends a live claim every lease/3
     * through the store, and a lease shorter than the store's ordinary
     * delays would run out under a live request, letting a duplicate take
     * it over and execute again. */
    if ((v = FIELD("lease")) && config_get_duration(c, v, fpath, MS_SEC, MS_DAY, &r->lease_ms))
        return -1;
    if ((v = FIELD("retention")) &&
        config_get_duration(c, v, fpath, 1, 3650 * MS_DAY, &r->retention_ms))
        return -1;
    /* The record keeps the key for both: retention, then the tombstone. */
    if ((v = FIELD("tombstone")) &&
        config_get_duration(c, v, fpath, 1, 3650 * MS_DAY, &r->tombstone_ms))
        return -1;
    if (r->retention_ms + r->tombstone_ms > 3650 * MS_DAY)
        return config_fail(c, v, fpath, "retention and tombstone add up to more than 3650d, "
                           "the longest a record is kept");
    if ((v = FIELD("replay_headers")) && get_replay_headers(c, v, fpath, r))
        return -1;
    if ((v = FIELD("fingerprint")) && get_fingerprint(c, v, fpath, r))
        return -1;
    if ((v = FIELD("states")) && config_get_states(c, v, fpath, for_consumer, &r->states))
        return -1;
#undef FIELD
    return 0;
}

void config_route_keep(struct route *r, int from, int to)
{
    for (int st = from; st <= to; st++)
        status_set_add(r->keep_status, st);
}

void config_route_keep_default(struct route *r, int with_5xx)
{
    memset(r->keep_status, 0, sizeof r->keep_status);
    config_route_keep(r, 100, 407);
    config_route_keep(r, 409, 424);
    config_route_keep(r, 426, 428);
    config_route_keep(r, 430, with_5xx ? 599 : 499);
}

int config_route_keeps(const struct route *r, int status)
{
    return status_set_has(r->keep_status, status);
}

int config_route_holds(const struct route *r)
{
    return r->unknown_hold || r->resolve;
}

/* store_statuses: a list of classes (2xx) and statuses (422). */
static int get_store_statuses(struct config_ctx *c, const yaml_node_t *n, const char *path,
                              struct route *r)
{
    /* A null is an empty list, as everywhere in the file. */
    if (config_is_null(n) || (n->type == YAML_SEQUENCE_NODE &&
                              n->data.sequence.items.start == n->data.sequence.items.top))
        return config_fail(c, n, path, "an empty list keeps no answer, so every retry would "
                           "execute again; list what to keep, e.g. [2xx, 4xx]");
    r->store_statuses_set = 1;
    return config_get_status_set(c, n, path, r->keep_status);
}

/* The problem types of a route's answers, which problems: may retitle. */
static const char *const problem_types[] = {
    "key_missing",      "key_invalid",       "subject_missing",   "subject_invalid",
    "fingerprint_unavailable", "token_missing", "token_spent",    "request_in_flight",
    "key_reused",       "store_unavailable", "invalid_argument",  "upstream_unreachable",
    "upstream_response_too_large", "outcome_unknown", "shutting_down", "attempts_exhausted",
    "stored_result_unreadable", "signature_invalid", "signature_expired",
    "transition_conflict", "unknown_state", "key_expired",
};

#define PROBLEM_TITLE_MAX 256
#define PROBLEM_DETAIL_MAX 1024

/* A title or detail: text for people, any language, on one line. */
static int get_problem_field(struct config_ctx *c, const yaml_node_t *n, const char *path,
                             size_t max,
                             char **dst)
{
    const char *s;
    if (config_scalar(c, n, path, "a string", &s))
        return -1;
    size_t len = strlen(s);
    if (!len || len > max)
        return config_fail(c, n, path, "%zu bytes: 1 to %zu", len, max);
    if (config_has_control(s))
        return config_fail(c, n, path, "holds a control character (a title or detail is one line)");
    const unsigned char *p = (const unsigned char *)s, *end = p + len;
    while (p < end) {
        size_t k = *p < 0x80 ? 1 : utf8_seq_len(p, end);
        if (!k)
            return config_fail(c, n, path, "is not UTF-8");
        p += k;
    }
    return config_set_string(dst, s) ? config_oom(c) : 0;
}

/* problems: { token_spent: { title: ..., detail: ... }, ... } */
int config_get_problems(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct problem_text **out, size_t *count)
{
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping like { token_spent: { title: ..., "
                           "detail: ... } }, got %s", config_kind_name(n));
    if (config_check_fields(c, n, path, problem_types,
                            sizeof problem_types / sizeof problem_types[0]))
        return -1;
    size_t pairs = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    if (!(*out = calloc(pairs ? pairs : 1, sizeof **out)))
        return config_oom(c);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        static const char *const fields[] = {"title", "detail"};
        const char *type = config_scalar_value(config_node(c, p->key));
        const yaml_node_t *v = config_node(c, p->value), *f;
        struct problem_text *t = &(*out)[*count];
        char tpath[112], fpath[128];
        config_join(tpath, sizeof tpath, path, type); /* check_fields: known, and once */
        if (!(t->type = strdup(type)))
            return config_oom(c);
        (*count)++;
        if (v->type != YAML_MAPPING_NODE)
            return config_fail(c, v, tpath, "expected a mapping like { title: ..., detail: ... }, "
                               "got %s", config_kind_name(v));
        if (config_check_fields(c, v, tpath, fields, 2))
            return -1;
        config_join(fpath, sizeof fpath, tpath, "title");
        if ((f = config_field(c, v, "title")) &&
            get_problem_field(c, f, fpath, PROBLEM_TITLE_MAX, &t->title))
            return -1;
        config_join(fpath, sizeof fpath, tpath, "detail");
        if ((f = config_field(c, v, "detail")) &&
            get_problem_field(c, f, fpath, PROBLEM_DETAIL_MAX, &t->detail))
            return -1;
        if (!t->title && !t->detail)
            return config_fail(c, v, tpath, "give a title, a detail or both");
    }
    return 0;
}

static const struct problem_text *find_problem(const struct problem_text *p, size_t n,
                                               const char *type)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(p[i].type, type))
            return &p[i];
    return NULL;
}

void config_problem_text(const struct server_config *c, const struct route *rt,
                         const char *type, const char **title, const char **detail)
{
    const struct problem_text *r = rt ? find_problem(rt->problems, rt->problem_count, type) : NULL;
    const struct problem_text *g = find_problem(c->problems, c->problem_count, type);
    *title = r && r->title ? r->title : g ? g->title : NULL;
    *detail = r && r->detail ? r->detail : g ? g->detail : NULL;
}

static const char *const route_fields[] = {
    "name",         "match",     "upstream",     "key",
    "space",        "scope",     "layers",       "token_scene",
    "in_flight",    "wait_timeout", "lease",     "retention",
    "upstream_timeout", "replay_headers", "fingerprint", "on_upstream_5xx",
    "on_redis_down", "on_unknown_outcome", "key_required", "store_statuses",
    "problems", "signature", "states", "tombstone", "resolve", "pass_host",
};

int config_get_unknown_outcome(struct config_ctx *c, const yaml_node_t *n, const char *path,
                               struct route *r)
{
    static const char *const modes[] = {"expire", "hold", "resolve"};
    char fpath[96];
    const yaml_node_t *v;
    int unknown = 0;
    config_join(fpath, sizeof fpath, path, "on_unknown_outcome");
    if ((v = config_field(c, n, "on_unknown_outcome")) &&
        config_get_enum(c, v, fpath, "expire, hold or resolve", modes, 3, NULL, &unknown))
        return -1;
    r->unknown_hold = unknown == 1;
    config_join(fpath, sizeof fpath, path, "resolve");
    if ((v = config_field(c, n, "resolve"))) {
        if (unknown != 2)
            return config_fail(c, v, fpath, "resolve is the status query of "
                               "on_unknown_outcome: resolve; set that too, or leave resolve out");
        return config_get_resolve(c, v, fpath, &r->resolve);
    }
    if (unknown == 2)
        return config_fail(c, n, path, "on_unknown_outcome: resolve needs resolve: { url: "
                           "http://127.0.0.1:9000/refunds/{key}, executed: [200], "
                           "not_executed: [404] }");
    return 0;
}

/* routes[i] from n; the routes before it are read already, and their names
 * are checked against this one's before the rest is read. */
static int get_route(struct config_ctx *c, const yaml_node_t *n, const char *path,
                     struct server_config *cfg, const yaml_node_item_t *items, size_t i)
{
    struct route *r = &cfg->routes[i];
    char fpath[96];
    const yaml_node_t *v;
    if (config_route_defaults(r))
        return config_oom(c);
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping (a route: name, match, "
                           "upstream, key, ...), got %s", config_kind_name(n));
    if (config_check_fields(c, n, path, route_fields,
                            sizeof route_fields / sizeof route_fields[0]))
        return -1;

#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if (!(v = FIELD("name")))
        return config_fail(c, n, path, "name is required");
    if (config_get_name(c, v, fpath, &r->name))
        return -1;
    for (size_t j = 0; j < i; j++)
        if (!strcmp(r->name, cfg->routes[j].name))
            return config_fail(c, v, fpath, "%s is already the name of routes[%zu] (line "
                               "%lu); names must be unique", config_quote(c, r->name), j,
                               (unsigned long)config_node(c, items[j])->start_mark.line + 1);
    if (!(v = FIELD("match")))
        return config_fail(c, n, path, "match is required (e.g. match: { method: POST, "
                           "path: /refunds })");
    if (get_match(c, v, fpath, r))
        return -1;
    if (!(v = FIELD("upstream")))
        return config_fail(c, n, path, "upstream is required (e.g. upstream: "
                           "http://127.0.0.1:9000)");
    if (config_get_upstream(c, v, fpath, &r->upstream))
        return -1;
    if (!(v = FIELD("key")))
        return config_fail(c, n, path, "key is required (e.g. key: { header: "
                           "Idempotency-Key })");
    if (config_get_key(c, v, fpath, r, 0) || config_get_record_fields(c, n, path, r, 0))
        return -1;
    if ((v = FIELD("scope")) && config_get_choice(c, v, fpath, "global", "subject",
                                                  &r->scope_subject))
        return -1;
    if ((v = FIELD("layers")) && get_layers(c, v, fpath, r))
        return -1;
    if ((v = FIELD("token_scene")) && config_get_name(c, v, fpath, &r->token_scene))
        return -1;
    if (!r->token_scene && config_set_string(&r->token_scene, r->name))
        return config_oom(c);
    if ((v = FIELD("in_flight")) && config_get_choice(c, v, fpath, "reject", "wait",
                                                      &r->in_flight_wait))
        return -1;
    if ((v = FIELD("wait_timeout")) &&
        config_get_duration(c, v, fpath, 1, 10 * MS_MIN, &r->wait_timeout_ms))
        return -1;
    if ((v = FIELD("upstream_timeout")) &&
        config_get_duration(c, v, fpath, 1, MS_HOUR, &r->upstream_timeout_ms))
        return -1;
    if ((v = FIELD("on_upstream_5xx")) && config_get_choice(c, v, fpath, "release", "store",
                                                            &r->on_5xx_store))
        return -1;
    if ((v = FIELD("on_redis_down")) && config_get_choice(c, v, fpath, "skip", "reject",
                                                          &r->on_redis_down_reject))
        return -1;
    if (config_get_unknown_outcome(c, n, path, r))
        return -1;
    if ((v = FIELD("key_required"))) {
        int required = 1;
        if (config_get_bool(c, v, fpath, &required))
            return -1;
        r->key_optional = !required;
    }
    if ((v = FIELD("pass_host")) && config_get_bool(c, v, fpath, &r->pass_host))
        return -1;
    if ((v = FIELD("store_statuses"))) {
        if (config_field(c, n, "on_upstream_5xx"))
            return config_fail(c, v, fpath, "store_statuses says which answers are kept, 5xx "
                               "included: list 5xx there rather than set on_upstream_5xx too");
        if (get_store_statuses(c, v, fpath, r))
            return -1;
    } else {
        config_route_keep_default(r, r->on_5xx_store);
    }
    if ((v = FIELD("signature")) && config_get_signature(c, v, fpath, &r->signature))
        return -1;
    if (config_check_resource_parts(c, n, path, r))
        return -1;
    if (r->resolve && r->states)
        return config_fail(c, config_field(c, n, "resolve"), path, "on_unknown_outcome: "
                           "resolve is not offered with states yet: a resolved answer would "
                           "have to move the key, which the status query does not say");
    if ((v = FIELD("problems")) &&
        config_get_problems(c, v, fpath, &r->problems, &r->problem_count))
        return -1;
#undef FIELD
    return 0;
}

static int same_match(const struct route *a, const struct route *b)
{
    int methods = (!a->method && !b->method) ||
                  (a->method && b->method && !strcmp(a->method, b->method));
    return methods && a->prefix == b->prefix && !strcmp(a->path, b->path);
}

int config_read_routes(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    yaml_node_item_t *it = NULL;
    size_t count = 0;
    char path[32];
    if (config_list_items(c, n, "routes", "a list of routes", &it, &count))
        return -1;
    if (count > ROUTES_MAX)
        return config_fail(c, n, "routes", "%zu routes; at most %d", count, ROUTES_MAX);
    if (count == 0)
        return 0;
    if (!(cfg->routes = calloc(count, sizeof *cfg->routes)))
        return config_oom(c);
    cfg->route_count = count;
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *rn = config_node(c, it[i]);
        config_pathf(path, sizeof path, "routes[%zu]", i);
        if (get_route(c, rn, path, cfg, it, i))
            return -1;
        for (size_t j = 0; j < i; j++) {
            char fpath[48];
            const struct route *a = &cfg->routes[i], *b = &cfg->routes[j];
            if (a->layer_token && b->layer_token && !strcmp(a->token_scene, b->token_scene) &&
                strcmp(a->space, b->space)) {
                config_join(fpath, sizeof fpath, path, "token_scene");
                /* Names: get_name let only plain characters through. */
                return config_fail(
                    c, rn, fpath, "\"%s\", as routes[%zu] (line %lu), whose space is "
                    "\"%s\", not \"%s\": a token spent on a key in one space would "
                    "let that key through in the other; give the two routes one space "
                    "or different token scenes",
                    a->token_scene, j, (unsigned long)config_node(c, it[j])->start_mark.line + 1,
                    b->space, a->space);
            }
            /* A subject route's record key is the subject and its parts,
             * a '/' between; a global route's, its parts: a global route
             * of one part more would build the same keys from a header
             * a client sets, and read or block another subject's. */
            if (!strcmp(a->space, b->space) &&
                (a->scope_subject != b->scope_subject || a->key_parts != b->key_parts)) {
                config_join(fpath, sizeof fpath, path, "space");
                return config_fail(
                    c, rn, fpath, "\"%s\", as routes[%zu] (line %lu), with %s and %zu "
                    "key part%s there and %s and %zu here: one space's keys are built "
                    "one way, or one route's keys could be another's (a subject's with "
                    "another subject's); give the two routes one scope and key shape, "
                    "or spaces of their own",
                    a->space, j, (unsigned long)config_node(c, it[j])->start_mark.line + 1,
                    b->scope_subject ? "scope: subject" : "scope: global", b->key_parts,
                    b->key_parts == 1 ? "" : "s",
                    a->scope_subject ? "scope: subject" : "scope: global", a->key_parts);
            }
            char other[32];
            config_pathf(other, sizeof other, "routes[%zu]", j);
            if (!strcmp(a->space, b->space) &&
                config_check_states_shared(c, rn, path, a->space, a->states, b->states, other))
                return -1;
            if (!same_match(a, b))
                continue;
            config_join(fpath, sizeof fpath, path, "match");
            return config_fail(c, config_field(c, rn, "match"), fpath, "the same method and path "
                               "as routes[%zu] (line %lu): this route would never be used",
                               j, (unsigned long)config_node(c, it[j])->start_mark.line + 1);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Printed back (config_print). */

void config_print_key(struct config_out *o, int indent, const struct route *r, int for_consumer)
{
    config_put_key(o, indent, "key");
    for (size_t i = 0; i < r->key_parts; i++) {
        if (r->key_parts > 1)
            config_put_item(o);
        config_print_key_part(o, r->key_parts > 1 ? indent + 4 : indent + 2, &r->key[i],
                              for_consumer);
    }
}

void config_print_record_fields(struct config_out *o, int indent, const struct route *r,
                                int for_consumer)
{
    config_put_str(o, indent, "space", r->space);
    config_put_duration(o, indent, "lease", r->lease_ms);
    config_put_duration(o, indent, "retention", r->retention_ms);
    if (r->tombstone_ms)
        config_put_duration(o, indent, "tombstone", r->tombstone_ms);
    else
        config_put_comment(o, indent, "tombstone: off");
    config_put_strings(o, indent, "replay_headers", r->replay_headers, r->replay_header_count);
    if (r->fingerprint == FINGERPRINT_FIELDS)
        config_put_strings(o, indent, "fingerprint", r->fingerprint_fields,
                           r->fingerprint_field_count);
    else
        config_put_word(o, indent, "fingerprint", r->fingerprint == FINGERPRINT_NONE ? "none"
                                                                                    : "body");
    if (r->states)
        config_print_states(o, indent, r->states, for_consumer);
}

void config_print_unknown_outcome(struct config_out *o, int indent, const struct route *r)
{
    config_put_word(o, indent, "on_unknown_outcome",
                    r->resolve ? "resolve" : r->unknown_hold ? "hold" : "expire");
    if (r->resolve)
        config_print_resolve(o, indent, r->resolve);
}

void config_print_problems(struct config_out *o, int indent, const struct problem_text *p,
                           size_t n)
{
    if (n)
        config_put_key(o, indent, "problems");
    for (size_t i = 0; i < n; i++) {
        config_put_key(o, indent + 2, p[i].type);
        if (p[i].title)
            config_put_str(o, indent + 4, "title", p[i].title);
        if (p[i].detail)
            config_put_str(o, indent + 4, "detail", p[i].detail);
    }
}

static void print_route(struct config_out *o, const struct route *r)
{
    char path[URL_PATH_MAX + 2];
    config_put_item(o);
    config_put_str(o, 4, "name", r->name);
    config_put_key(o, 4, "match");
    if (r->method)
        config_put_str(o, 6, "method", r->method);
    else
        config_put_comment(o, 6, "method: any");
    snprintf(path, sizeof path, "%s%s", r->path, r->prefix ? "*" : "");
    config_put_str(o, 6, "path", path);
    config_put_upstream(o, 4, "upstream", &r->upstream);
    config_print_key(o, 4, r, 0);
    config_print_record_fields(o, 4, r, 0);
    config_put_word(o, 4, "scope", r->scope_subject ? "subject" : "global");
    fprintf(o->f, "    layers: [%s%srecord]\n", r->layer_token ? "token, " : "",
            r->layer_lock ? "lock, " : "");
    config_put_str(o, 4, "token_scene", r->token_scene);
    config_put_word(o, 4, "in_flight", r->in_flight_wait ? "wait" : "reject");
    config_put_duration(o, 4, "wait_timeout", r->wait_timeout_ms);
    config_put_duration(o, 4, "upstream_timeout", r->upstream_timeout_ms);
    /* store_statuses says what on_upstream_5xx would, and the two are not
     * given together: the one the file gave (on_upstream_5xx, its default). */
    if (r->store_statuses_set)
        config_put_status_set(o, 4, "store_statuses", r->keep_status);
    else
        config_put_word(o, 4, "on_upstream_5xx", r->on_5xx_store ? "store" : "release");
    config_put_word(o, 4, "on_redis_down", r->on_redis_down_reject ? "reject" : "skip");
    config_print_unknown_outcome(o, 4, r);
    config_put_bool(o, 4, "key_required", !r->key_optional);
    config_put_bool(o, 4, "pass_host", r->pass_host);
    if (r->signature)
        config_print_signature(o, 4, r->signature);
    config_print_problems(o, 4, r->problems, r->problem_count);
}

void config_print_routes(struct config_out *o, const struct server_config *cfg)
{
    config_put_list(o, 0, "routes", cfg->route_count);
    for (size_t i = 0; i < cfg->route_count; i++)
        print_route(o, &cfg->routes[i]);
}
