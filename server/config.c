/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.c — reads idem serve's YAML file into struct server_config
 * (config.h). libyaml loads the text into a document tree; this file walks
 * that tree along a fixed schema, so each field is checked once, here: its
 * type, its syntax (durations, sizes, addresses, URLs) and its range. The
 * daemon calls config_load() at start and on reload and never sees YAML.
 * Anything wrong is refused with one line naming the file, the line and the
 * field, and saying what would have been accepted.
 *
 * The input is bounded (1 MiB, 1000 routes, small lists), and a first pass
 * over libyaml's events (prescan) refuses what would make loading or walking
 * the document expensive before the document is built: deep nesting, too
 * many values, and aliases, which a configuration has no need for.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

#include "config_print.h"
#include "config_value.h"
#include "gateway/resolve_config.h"
#include "http/upstream.h"

#define FILE_MAX (1024 * 1024)
#define DEPTH_MAX 32       /* the schema nests 5 deep: root, routes, route, key, part */
#define VALUES_MAX 200000  /* scalars, lists and mappings in the document */


/* ------------------------------------------------------------------------- */
/* Freeing and defaults. */

const struct route *config_nth_route(const struct server_config *c, size_t i)
{
    return i < c->route_count ? &c->routes[i] : &c->consumers[i - c->route_count].route;
}

int config_span_is_lease(const struct server_config *c, const char *space, int64_t span)
{
    for (size_t i = 0; i < c->route_count + c->consumer_count; i++) {
        const struct route *rt = config_nth_route(c, i);
        if (rt->lease_ms == span && strcmp(rt->space, space) == 0)
            return 1;
    }
    return 0;
}

void config_free(struct server_config *c)
{
    if (!c)
        return;
    free(c->path);
    free(c->listen_host);
    free(c->admin_host);
    free(c->admin_unix);
    free(c->state_dir);
    free(c->tls_ca);
    struct tls_files *tf[] = {&c->listen_tls, &c->admin_tls};
    for (int i = 0; i < 2; i++) {
        free(tf[i]->cert);
        free(tf[i]->key);
        free(tf[i]->client_ca);
    }
    for (size_t i = 0; i < c->api_key_count; i++) {
        free(c->api_keys[i].name);
        config_secret_free(&c->api_keys[i].src);
    }
    free(c->api_keys);
    free(c->storage_kind);
    free(c->storage_path);
    free(c->redis_url);
    free(c->postgres_url);
    config_secret_free(&c->redis_src);
    config_secret_free(&c->postgres_src);
    free(c->subject_header);
    free(c->access_to);
    free(c->upstream.host);
    free(c->upstream.base_path);
    upstream_addrs_put(c->upstream.addrs);
    config_problems_free(c->problems, c->problem_count);
    for (size_t i = 0; i < c->route_count; i++)
        config_route_free(&c->routes[i]);
    free(c->routes);
    config_consumers_free(c->consumers, c->consumer_count);
    free(c);
}

struct server_config *config_default(void)
{
    struct server_config *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->listen_host = strdup("127.0.0.1");
    c->listen_port = 8080;
    c->storage_kind = strdup("embedded");
    c->storage_path = strdup("./idem.db");
    c->storage_pool = 8;
    c->storage_timeout_ms = 2 * MS_SEC;
    c->subject_header = strdup("X-Subject");
    c->log_level = 1; /* info */
    c->limits = (struct server_limits){
        .request_line_max = 8 * KIB,
        .header_count_max = 100,
        .header_bytes_max = 32 * KIB,
        .body_max = MIB,
        .response_max = MIB,
        .connections_max = 10000,
        .connections_per_peer = 1000,
        .admin_connections_max = 64,
        .requests_per_connection = 10000,
        .idle_timeout_ms = 60 * MS_SEC,
        .header_timeout_ms = 10 * MS_SEC,
        .body_timeout_ms = 30 * MS_SEC,
        .send_timeout_ms = 60 * MS_SEC,
        .in_flight_max = 1024,
        .in_flight_per_peer = 256,
        .shutdown_timeout_ms = 30 * MS_SEC,
        .replay_cache = 16 * MIB,
        .tokens_per_scene = 16,
        .token_ttl_max_ms = MS_HOUR,
        .token_rate_subject = 10,
        .token_rate_peer = 100,
    };
    if (!c->listen_host || !c->storage_kind || !c->storage_path ||
        !c->subject_header) {
        config_free(c);
        return NULL;
    }
    return c;
}


/* The advice of an exposed plain-text listener. */
#define EXPOSED "%s %s:%d is not a loopback address, and it would speak plain HTTP: " \
                "anyone on the network between could read and change what passes. "   \
                "Give it tls: { cert: FILE, key: FILE }, or listen on loopback behind " \
                "a TLS proxy, or, on a network you trust, say so: %s: { address: "    \
                "\"%s:%d\", allow_plaintext: true }"

int config_finish(struct server_config *cfg, char *err, size_t errlen)
{
    if (!cfg->state_dir) {
        const char *p = cfg->storage_path, *slash = NULL;
        int file = strcmp(cfg->storage_kind, "embedded") == 0 && strcmp(p, ":memory:") != 0;
        if (file)
            slash = strrchr(p, '/');
        cfg->state_dir = slash ? strndup(p, slash == p ? 1 : (size_t)(slash - p)) : strdup(".");
        if (!cfg->state_dir) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (!cfg->admin_host && !cfg->admin_unix) {
        size_t n = strlen(cfg->state_dir) + sizeof "/idem-admin.sock";
        if (n - 1 > UNIX_PATH_MAX) {
            snprintf(err, errlen, "admin_listen: its default, the Unix socket idem-admin.sock "
                     "in %s, would have a path longer than %d bytes, the most a Unix socket's "
                     "path may be: give admin_listen: unix:PATH (or state_dir) a shorter one",
                     cfg->state_dir, UNIX_PATH_MAX);
            return -1;
        }
        if (!(cfg->admin_unix = malloc(n))) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        snprintf(cfg->admin_unix, n, "%s/idem-admin.sock", cfg->state_dir);
    }
    if (!cfg->listen_plaintext && !cfg->listen_tls.cert && !config_is_loopback(cfg->listen_host)) {
        snprintf(err, errlen, EXPOSED, "listen", cfg->listen_host, cfg->listen_port, "listen",
                 cfg->listen_host, cfg->listen_port);
        return -1;
    }
    if (cfg->admin_host && !cfg->admin_plaintext && !cfg->admin_tls.cert &&
        !config_is_loopback(cfg->admin_host)) {
        snprintf(err, errlen, EXPOSED " (and the admin listener changes records: it belongs "
                 "on loopback or a Unix socket)", "admin_listen", cfg->admin_host,
                 cfg->admin_port, "admin_listen", cfg->admin_host, cfg->admin_port);
        return -1;
    }
    return 0;
}


static int resolve_one(const struct server_config *cfg, struct upstream_url *u,
                       const char *field, char *err, size_t errlen)
{
    char detail[400];
    /* Routes sharing an upstream share one lookup. */
    for (size_t i = 0; i < cfg->route_count && !u->addrs; i++) {
        const struct upstream_url *o = &cfg->routes[i].upstream;
        if (o != u && o->addrs && o->port == u->port && o->tls == u->tls &&
            strcmp(o->host, u->host) == 0)
            u->addrs = upstream_addrs_get(o->addrs);
    }
    if (u->addrs ||
        (u->addrs = upstream_resolve(u->host, u->port, u->tls, detail, sizeof detail)))
        return 0;
    snprintf(err, errlen, "%s:%lu: %s: %s", cfg->path ? cfg->path : "(configuration)",
             u->line, field, detail);
    return -1;
}

int config_resolve(struct server_config *cfg, char *err, size_t errlen)
{
    char field[64];
    for (size_t i = 0; i < cfg->route_count; i++) {
        snprintf(field, sizeof field, "routes[%zu].upstream", i);
        if (resolve_one(cfg, &cfg->routes[i].upstream, field, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < cfg->route_count; i++) {
        if (!cfg->routes[i].resolve)
            continue;
        snprintf(field, sizeof field, "routes[%zu].resolve.url", i);
        if (resolve_one(cfg, &cfg->routes[i].resolve->url, field, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        if (!cfg->consumers[i].route.resolve)
            continue;
        snprintf(field, sizeof field, "consumers[%zu].resolve.url", i);
        if (resolve_one(cfg, &cfg->consumers[i].route.resolve->url, field, err, errlen))
            return -1;
    }
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        snprintf(field, sizeof field, "consumers[%zu].handler", i);
        if (resolve_one(cfg, &cfg->consumers[i].route.upstream, field, err, errlen))
            return -1;
    }
    return cfg->has_upstream ? resolve_one(cfg, &cfg->upstream, "upstream", err, errlen) : 0;
}


/* ------------------------------------------------------------------------- */
/* The top level. */


void config_storage_where(const struct server_config *c, char *buf, size_t size)
{
    if (strcmp(c->storage_kind, "distributed") != 0) {
        snprintf(buf, size, "%s", c->storage_path);
        return;
    }
    char r[512], p[512];
    config_url_without_userinfo(c->redis_url ? c->redis_url : "", r, sizeof r);
    config_url_without_userinfo(c->postgres_url ? c->postgres_url : "", p, sizeof p);
    snprintf(buf, size, "%s + %s", r, p);
}

/* storage.redis / storage.postgres: a URL written out, or { env: NAME } or
 * { file: PATH } for one that holds a password, which is then read from the
 * environment or the file (its first line) and never printed. */
static int get_server_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char *example, char **dst, struct config_secret *src)
{
    static const char *const known[] = {"env", "file"};
    const char *s;
    char buf[SECRET_MAX + 2];
    if (n->type == YAML_MAPPING_NODE) {
        if (config_get_secret(c, n, path, known, 2, buf, src))
            return -1;
        return config_set_string(dst, buf) ? config_oom(c) : 0;
    }
    if (config_scalar(c, n, path, example, &s))
        return -1;
    if (!*s)
        return config_fail(c, n, path, "empty (expected %s)", example);
    if (strlen(s) > SECRET_MAX)
        return config_fail(c, n, path, "longer than %d bytes", SECRET_MAX);
    if (config_has_control(s))
        return config_fail(c, n, path, "holds a control character");
    if (config_url_has_password(s))
        return config_fail(c, n, path, "the URL holds a password: keep it out of this file "
                           "with { env: NAME } or { file: PATH }");
    return config_set_string(dst, s) ? config_oom(c) : 0;
}


static int get_storage(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    static const char *const known[] = {"kind", "path", "redis", "postgres", "pool",
                                        "timeout", "require_synchronous_replication"};
    const yaml_node_t *v;
    const char *s;
    if (config_check_fields(c, n, "storage", known, sizeof known / sizeof known[0]))
        return -1;
    if ((v = config_field(c, n, "kind"))) {
        static const char *const kinds[] = {"embedded", "distributed"};
        int i;
        if (config_get_enum(c, v, "storage.kind", "embedded or distributed", kinds, 2,
                            "a storage kind (use embedded, or distributed for Redis and "
                            "PostgreSQL)", &i))
            return -1;
        if (config_set_string(&cfg->storage_kind, kinds[i]))
            return config_oom(c);
    }
    int distributed = strcmp(cfg->storage_kind, "distributed") == 0;
    static const char *const only_distributed[] = {"redis", "postgres", "pool", "timeout",
                                                   "require_synchronous_replication"};
    for (size_t i = 0; i < 5; i++)
        if (!distributed && (v = config_field(c, n, only_distributed[i]))) {
            char fp[32];
            config_pathf(fp, sizeof fp, "storage.%s", only_distributed[i]);
            return config_fail(c, v, fp, "only for kind: distributed");
        }
    if (distributed) {
        if ((v = config_field(c, n, "path")))
            return config_fail(c, v, "storage.path", "only for kind: embedded (the distributed "
                               "store is in Redis and PostgreSQL)");
        if (!(v = config_field(c, n, "redis")))
            return config_fail(c, n, "storage.redis", "missing (kind: distributed needs "
                               "redis: redis://host:port/db)");
        if (get_server_url(c, v, "storage.redis", "a URL like redis://127.0.0.1:6379/0",
                           &cfg->redis_url, &cfg->redis_src) ||
            config_check_redis_url(c, v, "storage.redis", cfg->redis_url))
            return -1;
        if (!(v = config_field(c, n, "postgres")))
            return config_fail(c, n, "storage.postgres", "missing (kind: distributed needs "
                               "postgres: postgresql://user@host/db)");
        if (get_server_url(c, v, "storage.postgres",
                           "a URL like postgresql://idem@127.0.0.1/idem", &cfg->postgres_url,
                           &cfg->postgres_src) ||
            config_check_postgres_url(c, v, "storage.postgres", cfg->postgres_url))
            return -1;
        uint64_t pool;
        if ((v = config_field(c, n, "pool"))) {
            if (config_get_count(c, v, "storage.pool", 1, 256, &pool))
                return -1;
            cfg->storage_pool = (unsigned)pool;
        }
        if ((v = config_field(c, n, "timeout")) &&
            config_get_duration(c, v, "storage.timeout", 1, 10 * 60 * MS_SEC,
                                &cfg->storage_timeout_ms))
            return -1;
        if ((v = config_field(c, n, "require_synchronous_replication")) &&
            config_get_bool(c, v, "storage.require_synchronous_replication",
                            &cfg->require_sync_replication))
            return -1;
        return 0;
    }
    if ((v = config_field(c, n, "path"))) {
        if (config_scalar(c, v, "storage.path", "a file path", &s))
            return -1;
        if (!*s)
            return config_fail(c, v, "storage.path", "empty (give a file path, or "
                               ":memory: for a store that does not survive a restart)");
        if (strlen(s) > FS_PATH_MAX)
            return config_fail(c, v, "storage.path", "longer than %d bytes", FS_PATH_MAX);
        if (config_has_control(s))
            return config_fail(c, v, "storage.path", "%s holds a control character",
                               config_quote(c, s));
        if (strncmp(s, "file:", 5) == 0)
            return config_fail(c, v, "storage.path",
                               "%s is a SQLite URI; give the file's path (the "
                               "daemon locks the file against a second idem serve by its path)",
                               config_quote(c, s));
        if (config_set_string(&cfg->storage_path, s))
            return config_oom(c);
    }
    return 0;
}


/* log: { level: debug|info|warn|error, format: text|json }: the daemon's
 * own log (stderr). */
static int get_log(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    static const char *const known[] = {"level", "format"};
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    const yaml_node_t *v;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, "log",
                           "expected a mapping like { level: info, format: text }, got %s",
                           config_kind_name(n));
    if (config_check_fields(c, n, "log", known, 2))
        return -1;
    if ((v = config_field(c, n, "format")) &&
        config_get_choice(c, v, "log.format", "text", "json", &cfg->log_json))
        return -1;
    if ((v = config_field(c, n, "level")) &&
        config_get_enum(c, v, "log.level", "debug, info, warn or error", levels, 4, NULL,
                        &cfg->log_level))
        return -1;
    return 0;
}

/* access_log: off | stdout | stderr | PATH, or { to: off|stdout|stderr|PATH,
 * format: json|text, subject: hash|plain|off }. */
static int get_access_log(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    static const char *const known[] = {"to", "format", "subject"};
    const yaml_node_t *to = n, *v;
    const char *s;
    if (n->type == YAML_MAPPING_NODE) {
        if (config_check_fields(c, n, "access_log", known, 3))
            return -1;
        to = config_field(c, n, "to");
        if ((v = config_field(c, n, "format")) &&
            config_get_choice(c, v, "access_log.format", "json", "text", &cfg->access_text))
            return -1;
        if ((v = config_field(c, n, "subject"))) {
            /* In the order of SUBJECT_HASH, SUBJECT_PLAIN, SUBJECT_OFF. */
            static const char *const subjects[] = {"hash", "plain", "off"};
            int i;
            if (config_get_enum(c, v, "access_log.subject", "hash, plain or off", subjects, 3,
                                NULL, &i))
                return -1;
            cfg->access_subject = i == 0 ? SUBJECT_HASH : i == 1 ? SUBJECT_PLAIN : SUBJECT_OFF;
        }
        if (!to)
            return 0;
    }
    const char *where = n == to ? "access_log" : "access_log.to";
    if (config_scalar(c, to, where, "off, stdout, stderr or a file's path", &s))
        return -1;
    if (!strcmp(s, "stdout"))
        return 0;
    if (!strcmp(s, "stderr")) {
        cfg->access_stderr = 1;
        return 0;
    }
    if (!strcmp(s, "off"))
        return config_set_string(&cfg->access_to, "") ? config_oom(c) : 0;
    return config_get_path(c, to, where, "file", &cfg->access_to);
}

static int get_root(struct config_ctx *c, const yaml_node_t *root, struct server_config *cfg)
{
    static const char *const known[] = {"listen", "admin_listen", "api_keys", "state_dir",
                                        "tls_ca", "storage", "subject_header", "upstream",
                                        "workers", "event_loops", "limits", "routes",
                                        "consumers", "access_log", "log", "problems"};
    const yaml_node_t *v;
    const char *s;
    uint64_t workers, loops;
    if (root->type != YAML_MAPPING_NODE && !config_is_null(root))
        return config_fail(c, root, NULL, "the top level must be a mapping (listen: ..., "
                           "routes: ...), not %s", config_kind_name(root));
    if (config_check_fields(c, root, "", known, sizeof known / sizeof known[0]))
        return -1;
    if ((v = config_field(c, root, "listen")) &&
        config_get_listen(c, v, "listen", &cfg->listen_host, &cfg->listen_port, NULL,
                   &cfg->listen_plaintext, &cfg->listen_tls))
        return -1;
    if ((v = config_field(c, root, "admin_listen")) && config_read_admin_listen(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "state_dir")) &&
        config_get_path(c, v, "state_dir", "directory", &cfg->state_dir))
        return -1;
    if ((v = config_field(c, root, "api_keys")) && config_read_api_keys(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "tls_ca")) &&
        (config_get_path(c, v, "tls_ca", "file", &cfg->tls_ca) ||
         config_check_readable(c, v, "tls_ca", cfg->tls_ca)))
        return -1;
    if ((v = config_field(c, root, "storage")) && get_storage(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "subject_header"))) {
        if (config_get_header_name(c, v, "subject_header", &s))
            return -1;
        if (config_set_string(&cfg->subject_header, s))
            return config_oom(c);
    }
    if ((v = config_field(c, root, "upstream"))) {
        if (config_get_upstream(c, v, "upstream", &cfg->upstream))
            return -1;
        cfg->has_upstream = 1;
    }
    if ((v = config_field(c, root, "workers"))) {
        if (config_get_count(c, v, "workers", 1, 4096, &workers))
            return -1;
        cfg->workers = (int)workers;
    }
    if ((v = config_field(c, root, "event_loops"))) {
        if (config_get_count(c, v, "event_loops", 1, 16, &loops))
            return -1;
        cfg->event_loops = (int)loops;
    }
    if ((v = config_field(c, root, "limits")) && config_get_limits(c, v, &cfg->limits))
        return -1;
    if ((v = config_field(c, root, "access_log")) && get_access_log(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "log")) && get_log(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "problems")) &&
        config_get_problems(c, v, "problems", &cfg->problems, &cfg->problem_count))
        return -1;
    if ((v = config_field(c, root, "routes")) && config_read_routes(c, v, cfg))
        return -1;
    if ((v = config_field(c, root, "consumers")) && config_read_consumers(c, v, cfg))
        return -1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Printed back: get_root's fields, in its order. */

static void print_storage(struct config_out *o, const struct server_config *cfg)
{
    config_put_key(o, 0, "storage");
    config_put_word(o, 2, "kind", cfg->storage_kind);
    if (strcmp(cfg->storage_kind, "distributed") != 0) {
        config_put_str(o, 2, "path", cfg->storage_path);
        return;
    }
    config_put_url(o, 2, "redis", cfg->redis_url, &cfg->redis_src);
    config_put_url(o, 2, "postgres", cfg->postgres_url, &cfg->postgres_src);
    config_put_count(o, 2, "pool", cfg->storage_pool);
    config_put_duration(o, 2, "timeout", cfg->storage_timeout_ms);
    config_put_bool(o, 2, "require_synchronous_replication", cfg->require_sync_replication);
}

static void print_logs(struct config_out *o, const struct server_config *cfg)
{
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    static const char *const subjects[] = {"hash", "plain", "off"}; /* SUBJECT_HASH ... */
    config_put_key(o, 0, "log");
    config_put_word(o, 2, "level", levels[cfg->log_level]);
    config_put_word(o, 2, "format", cfg->log_json ? "json" : "text");
    config_put_key(o, 0, "access_log");
    /* A path is never "off", "stdout" or "stderr": those are the words. */
    if (!cfg->access_to || !*cfg->access_to)
        config_put_word(o, 2, "to", cfg->access_to        ? "off"
                                    : cfg->access_stderr ? "stderr"
                                                         : "stdout");
    else
        config_put_str(o, 2, "to", cfg->access_to);
    config_put_word(o, 2, "format", cfg->access_text ? "text" : "json");
    config_put_word(o, 2, "subject", subjects[cfg->access_subject]);
}

int config_print(FILE *f, const struct server_config *cfg)
{
    struct config_out out = {.f = f}, *o = &out;
    fputs("# The configuration as idem serve reads it, every default filled in. A secret\n"
          "# is shown by where it is read from (env: or file:), never by its value.\n", f);
    config_print_listen(o, "listen", cfg->listen_host, cfg->listen_port, NULL,
                        cfg->listen_plaintext, &cfg->listen_tls);
    config_print_admin_listen(o, cfg);
    if (cfg->state_dir)
        config_put_str(o, 0, "state_dir", cfg->state_dir);
    else
        config_put_comment(o, 0, "state_dir: not set: the embedded store's directory, or .");
    config_print_api_keys(o, cfg);
    if (cfg->tls_ca)
        config_put_str(o, 0, "tls_ca", cfg->tls_ca);
    else
        config_put_comment(o, 0, "tls_ca: not set: the system's CAs");
    print_storage(o, cfg);
    config_put_str(o, 0, "subject_header", cfg->subject_header);
    if (cfg->has_upstream)
        config_put_upstream(o, 0, "upstream", &cfg->upstream);
    else
        config_put_comment(o, 0, "upstream: none: a request no route matches gets 404");
    /* workers: is read and ignored (the JSON API runs on the event loops),
     * so that older files load: it changes nothing, and is not printed. */
    if (cfg->event_loops)
        config_put_count(o, 0, "event_loops", (uint64_t)cfg->event_loops);
    else
        config_put_comment(o, 0, "event_loops: not set: one per processor, at most 4");
    print_logs(o, cfg);
    config_print_limits(o, &cfg->limits);
    config_print_problems(o, 0, cfg->problems, cfg->problem_count);
    config_print_routes(o, cfg);
    config_print_consumers(o, cfg);
    return fflush(f) != 0 || ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------------------- */
/* Entry points. */

static void syntax_error(struct config_ctx *c, const yaml_parser_t *p)
{
    if (!c->err || c->errlen == 0)
        return;
    if (p->error == YAML_MEMORY_ERROR) {
        snprintf(c->err, c->errlen, "%s: out of memory reading YAML", c->name);
        return;
    }
    unsigned long line = (unsigned long)p->problem_mark.line + 1;
    unsigned long col = (unsigned long)p->problem_mark.column + 1;
    if (p->error == YAML_READER_ERROR) {
        /* The reader only knows the byte offset: count the lines to it. */
        size_t end = p->problem_offset < c->input_len ? p->problem_offset : c->input_len;
        line = 1;
        col = 1;
        for (size_t i = 0; i < end; i++, col++)
            if (c->input[i] == '\n') {
                line++;
                col = 0;
            }
    }
    const char *problem = p->problem ? p->problem : "malformed";
    /* libyaml's "found character that cannot start any token" is most
     * often a tab, which YAML never takes for indentation: say so. */
    size_t at = p->problem_mark.index;
    if (p->error == YAML_SCANNER_ERROR && at < c->input_len && c->input[at] == '\t') {
        snprintf(c->err, c->errlen,
                 "%s:%lu:%lu: YAML syntax: a tab; YAML indents with spaces only (replace the "
                 "tab with spaces)",
                 c->name, line, col);
        return;
    }
    if (p->context)
        snprintf(c->err, c->errlen,
                 "%s:%lu:%lu: YAML syntax: %s %s (which started at line %lu)",
                 c->name, line, col, problem, p->context,
                 (unsigned long)p->context_mark.line + 1);
    else
        snprintf(c->err, c->errlen, "%s:%lu:%lu: YAML syntax: %s", c->name, line,
                 col, problem);
}

/* A first pass over the parser's events, before libyaml builds the document.
 * It bounds what the document may cost: libyaml's scanner takes time
 * quadratic in the nesting depth (a file of a million "[" would run for
 * hours), its loader memory linear in the number of values, and a walk over
 * a document with aliases time exponential in their depth ("billion laughs":
 * the loader makes an alias a second reference to the anchored node). So
 * nesting and values are capped, aliases and second documents refused. An
 * anchor alone is harmless and allowed. */
static int prescan(struct config_ctx *c)
{
    yaml_parser_t p;
    yaml_event_t ev;
    int depth = 0, documents = 0, rc = 0, done = 0;
    size_t values = 0;
    if (!yaml_parser_initialize(&p))
        return config_oom(c);
    yaml_parser_set_input_string(&p, (const unsigned char *)c->input, c->input_len);
    while (!done && rc == 0) {
        if (!yaml_parser_parse(&p, &ev)) {
            syntax_error(c, &p);
            rc = -1;
            break;
        }
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1)
                rc = config_fail_at(c, &ev.start_mark, "a second YAML document (after "
                                    "---); the configuration is one document");
            break;
        case YAML_ALIAS_EVENT:
            rc = config_fail_at(c, &ev.start_mark, "*%s: anchors and aliases are not "
                                "supported; write the value out",
                                (const char *)ev.data.alias.anchor);
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (++depth > DEPTH_MAX)
                rc = config_fail_at(c, &ev.start_mark, "nested more than %d levels deep; "
                                    "a configuration needs at most 5", DEPTH_MAX);
            /* fall through */
        case YAML_SCALAR_EVENT:
            if (rc == 0 && ++values > VALUES_MAX)
                rc = config_fail_at(c, &ev.start_mark, "more than %d values; a "
                                    "configuration has far fewer", VALUES_MAX);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

int config_parse(const char *yaml, size_t len, const char *name,
                 struct server_config **out, char *err, size_t errlen)
{
    struct config_ctx c = {
        .name = name ? name : "config",
        .input = yaml ? yaml : "",
        .input_len = yaml ? len : 0,
        .err = err,
        .errlen = errlen,
    };
    struct server_config *cfg = NULL;
    yaml_parser_t parser;
    int parser_ready = 0, have_doc = 0, rc = -1;
    if (err && errlen)
        err[0] = '\0';
    *out = NULL;
    if (c.input_len > FILE_MAX) {
        config_fail(&c, NULL, NULL, "%zu bytes; a configuration is at most 1 MiB", len);
        goto out;
    }
    if (prescan(&c))
        goto out;
    if (!(cfg = config_default()) || !yaml_parser_initialize(&parser)) {
        config_oom(&c);
        goto out;
    }
    parser_ready = 1;
    yaml_parser_set_input_string(&parser, (const unsigned char *)c.input, c.input_len);
    if (!yaml_parser_load(&parser, &c.doc)) {
        syntax_error(&c, &parser);
        goto out;
    }
    have_doc = 1;
    const yaml_node_t *root = yaml_document_get_root_node(&c.doc);
    if (root && get_root(&c, root, cfg))
        goto out;
    *out = cfg;
    cfg = NULL;
    rc = 0;
out:
    if (have_doc)
        yaml_document_delete(&c.doc);
    if (parser_ready)
        yaml_parser_delete(&parser);
    config_free(cfg);
    return rc;
}

int config_load(const char *path, struct server_config **out, char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = -1;
    FILE *f;
    *out = NULL;
    if (!(f = fopen(path, "rb"))) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    /* One byte past the limit tells a file that is too big. */
    if (!(buf = malloc(FILE_MAX + 1))) {
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    len = fread(buf, 1, FILE_MAX + 1, f);
    if (ferror(f)) {
        if (err && errlen)
            snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        goto out;
    }
    if (len > FILE_MAX) {
        if (err && errlen)
            snprintf(err, errlen, "%s: larger than 1 MiB; a configuration is at "
                     "most that", path);
        goto out;
    }
    if ((rc = config_parse(buf, len, path, out, err, errlen)) == 0 &&
        !((*out)->path = strdup(path))) {
        config_free(*out);
        *out = NULL;
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", path);
        rc = -1;
    }
out:
    free(buf);
    fclose(f);
    return rc;
}
