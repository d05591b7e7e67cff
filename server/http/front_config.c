/* SPDX-License-Identifier: Apache-2.0 */
/*
 * front_config.c — reads what the front end listens with: listen: (an
 * address, or { address, tls, allow_plaintext }, also the form of
 * admin_listen:, which admin/admin_config.c reads with it), its TLS files,
 * --listen over the file's, and limits: (the parser's, the connections',
 * the timeouts and the rates), into struct server_config and the structs
 * of front_config.h. The values are read with config_value.h.
 */
#include "http/front_config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_print.h"
#include "config_value.h"

/* A listening address into *host and *port; on failure says why. */
static const char *parse_listen_address(const char *s, char **host, int *port)
{
    if (s[strspn(s, "0123456789")] == '\0' || (*s == ':' && !strchr(s + 1, ':'))) {
        /* Just a port: loopback, the safe choice for a gateway. */
        if (config_parse_port(s + (*s == ':'), port, 1))
            return "the port must be a number from 0 to 65535";
        return config_set_string(host, "127.0.0.1") ? "out of memory" : NULL;
    }
    return config_parse_hostport(s, 1, 1, host, port);
}

#define LISTEN_FORMS "use host:port, [::1]:port, :port or port"

static int get_tls_files(struct config_ctx *c, const yaml_node_t *n, const char *path, int with_ca,
                         struct tls_files *t)
{
    static const char *const known[] = {"cert", "key", "client_ca"};
    const yaml_node_t *v;
    char fpath[64];
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected { cert: FILE, key: FILE%s }, got %s",
                           with_ca ? ", client_ca: FILE" : "", config_kind_name(n));
    if (config_check_fields(c, n, path, known, with_ca ? 3 : 2))
        return -1;
    char **dst[] = {&t->cert, &t->key, &t->client_ca};
    for (int i = 0; i < 3; i++) {
        config_pathf(fpath, sizeof fpath, "%s.%s", path, known[i]);
        if (!(v = config_field(c, n, known[i]))) {
            if (i < 2)
                return config_fail(c, n, fpath, "missing (the %s's PEM file)",
                                   i == 0 ? "certificate chain" : "private key");
            continue;
        }
        if (config_get_path(c, v, fpath, "file", dst[i]))
            return -1;
    }
    /* Each read now, as at start: a missing file said at its line. */
    for (int i = 0; i < 3; i++) {
        config_pathf(fpath, sizeof fpath, "%s.%s", path, known[i]);
        if (*dst[i] && config_check_readable(c, config_field(c, n, known[i]), fpath, *dst[i]))
            return -1;
    }
    return 0;
}

/* listen and admin_listen: an address, or { address: ..., tls: { cert,
 * key }, allow_plaintext: true } (the last for one that others than this
 * machine reach without TLS). admin_listen also takes unix:PATH (unix_path
 * non-NULL) and tls.client_ca. */
int config_get_listen(struct config_ctx *c, const yaml_node_t *n, const char *path, char **host,
                      int *port, char **unix_path, int *plaintext, struct tls_files *tls)
{
    static const char *const known[] = {"address", "allow_plaintext", "tls"};
    const char *s, *why;
    char fpath[48];
    const yaml_node_t *a = n;
    if (n->type == YAML_MAPPING_NODE) {
        const yaml_node_t *v;
        if (config_check_fields(c, n, path, known, 3))
            return -1;
        config_pathf(fpath, sizeof fpath, "%s.allow_plaintext", path);
        if ((v = config_field(c, n, "allow_plaintext")) && config_get_bool(c, v, fpath, plaintext))
            return -1;
        config_pathf(fpath, sizeof fpath, "%s.tls", path);
        if ((v = config_field(c, n, "tls")) && get_tls_files(c, v, fpath, unix_path != NULL, tls))
            return -1;
        if (!(a = config_field(c, n, "address")))
            return config_fail(c, n, path, "no address (give address: HOST:PORT)");
        config_pathf(fpath, sizeof fpath, "%s.address", path);
        path = fpath;
    }
    if (config_scalar(c, a, path, "an address like 127.0.0.1:8080", &s))
        return -1;
    if (unix_path && strncmp(s, "unix:", 5) == 0 && tls->cert)
        return config_fail(c, a, path, "a Unix socket takes no tls (only this machine reaches it)");
    if (unix_path && strncmp(s, "unix:", 5) == 0) {
        if (!s[5])
            return config_fail(c, a, path, "unix: without a path (give unix:/run/idem/admin.sock)");
        if (strlen(s + 5) > UNIX_PATH_MAX)
            return config_fail(c, a, path, "the socket's path is longer than %d bytes, the most a "
                               "Unix socket's path may be", UNIX_PATH_MAX);
        if (config_has_control(s))
            return config_fail(c, a, path, "%s holds a control character", config_quote(c, s));
        free(*host);
        *host = NULL;
        return config_set_string(unix_path, s + 5) ? config_oom(c) : 0;
    }
    if ((why = parse_listen_address(s, host, port)))
        return config_fail(c, a, path, "%s: %s (" LISTEN_FORMS "%s)", config_quote(c, s), why,
                           unix_path ? ", or unix:PATH" : "");
    if (unix_path) {
        free(*unix_path);
        *unix_path = NULL;
    }
    return 0;
}

void config_print_listen(struct config_out *o, const char *key, const char *host, int port,
                         const char *unix_path, int plaintext, const struct tls_files *tls)
{
    static const char *const names[] = {"cert", "key", "client_ca"};
    const char *const files[] = {tls->cert, tls->key, tls->client_ca};
    char address[UNIX_PATH_MAX + 300];
    if (unix_path)
        snprintf(address, sizeof address, "unix:%s", unix_path);
    else
        snprintf(address, sizeof address, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    config_put_key(o, 0, key);
    config_put_str(o, 2, "address", address);
    config_put_bool(o, 2, "allow_plaintext", plaintext);
    if (!tls->cert) {
        config_put_comment(o, 2, "tls: none: plain HTTP");
        return;
    }
    config_put_key(o, 2, "tls");
    for (int i = 0; i < 3; i++)
        if (files[i])
            config_put_str(o, 4, names[i], files[i]);
}

int config_is_loopback(const char *host)
{
    unsigned char a[16];
    struct in_addr v4;
    if (strcmp(host, "localhost") == 0)
        return 1;
    /* inet_aton, not inet_pton: it reads 127.1 and 0x7f.1 as the resolver
     * that binds them will. */
    if (inet_aton(host, &v4) != 0)
        return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, a) == 1)
        return IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)(const void *)a);
    return 0;
}

int config_set_listen(struct server_config *cfg, const char *s, char *err, size_t errlen)
{
    const char *why = parse_listen_address(s, &cfg->listen_host, &cfg->listen_port);
    if (why)
        snprintf(err, errlen, "--listen \"%s\": %s (" LISTEN_FORMS ")", s, why);
    return why ? -1 : 0;
}

struct limit_field {
    const char *name;
    char kind;   /* 's' size, 'n' count, 't' duration */
    size_t offset;
    int64_t min, max;
};

#define LIMIT(name, member, kind, min, max) \
    {name, kind, offsetof(struct server_limits, member), min, max}
static const struct limit_field limit_fields[] = {
    LIMIT("request_line_max", request_line_max, 's', 256, (int64_t)MIB),
    LIMIT("header_count_max", header_count_max, 'n', 1, 10000),
    LIMIT("header_bytes_max", header_bytes_max, 's', (int64_t)KIB, 16 * (int64_t)MIB),
    LIMIT("body_max", body_max, 's', 1, (int64_t)GIB),
    /* The store keeps a result of at most 64 MiB: the body, with its
     * status and headers around it (serve.c gives them 64 KiB). */
    LIMIT("response_max", response_max, 's', 1, 63 * (int64_t)MIB),
    LIMIT("connections_max", connections_max, 'n', 1, 1000000),
    LIMIT("connections_per_peer", connections_per_peer, 'n', 1, 1000000),
    LIMIT("admin_connections_max", admin_connections_max, 'n', 1, 100000),
    LIMIT("requests_per_connection", requests_per_connection, 'n', 1, 1000000000),
    LIMIT("idle_timeout", idle_timeout_ms, 't', 1, MS_DAY),
    LIMIT("header_timeout", header_timeout_ms, 't', 1, MS_HOUR),
    LIMIT("body_timeout", body_timeout_ms, 't', 1, MS_HOUR),
    LIMIT("send_timeout", send_timeout_ms, 't', 1, MS_HOUR),
    LIMIT("in_flight_max", in_flight_max, 'n', 1, 1000000),
    LIMIT("in_flight_per_peer", in_flight_per_peer, 'n', 1, 1000000),
    LIMIT("shutdown_timeout", shutdown_timeout_ms, 't', 0, MS_HOUR),
    LIMIT("replay_cache", replay_cache, 's', 0, (int64_t)GIB),
    LIMIT("tokens_per_scene", tokens_per_scene, 'n', 1, 100000),
    LIMIT("token_ttl_max", token_ttl_max_ms, 't', 1000, 7 * MS_DAY),
    LIMIT("token_rate_subject", token_rate_subject, 'n', 1, 1000000),
    LIMIT("token_rate_peer", token_rate_peer, 'n', 1, 1000000),
};
#undef LIMIT
#define N_LIMITS (sizeof limit_fields / sizeof limit_fields[0])

int config_get_limits(struct config_ctx *c, const yaml_node_t *n, struct server_limits *l)
{
    const char *known[N_LIMITS];
    char fpath[64];
    for (size_t i = 0; i < N_LIMITS; i++)
        known[i] = limit_fields[i].name;
    if (config_check_fields(c, n, "limits", known, N_LIMITS))
        return -1;
    for (size_t i = 0; i < N_LIMITS; i++) {
        const struct limit_field *f = &limit_fields[i];
        const yaml_node_t *v = config_field(c, n, f->name);
        char *at = (char *)l + f->offset;
        uint64_t count;
        if (!v)
            continue;
        config_join(fpath, sizeof fpath, "limits", f->name);
        if (f->kind == 's') {
            if (config_get_size(c, v, fpath, (size_t)f->min, (size_t)f->max, (size_t *)(void *)at))
                return -1;
        } else if (f->kind == 'n') {
            if (config_get_count(c, v, fpath, (uint64_t)f->min, (uint64_t)f->max, &count))
                return -1;
            *(size_t *)(void *)at = (size_t)count;
        } else {
            if (config_get_duration(c, v, fpath, f->min, f->max, (int64_t *)(void *)at))
                return -1;
        }
    }
    return 0;
}

void config_print_limits(struct config_out *o, const struct server_limits *l)
{
    config_put_key(o, 0, "limits");
    for (size_t i = 0; i < N_LIMITS; i++) {
        const struct limit_field *f = &limit_fields[i];
        const char *at = (const char *)l + f->offset;
        if (f->kind == 's')
            config_put_size(o, 2, f->name, *(const size_t *)(const void *)at);
        else if (f->kind == 'n')
            config_put_count(o, 2, f->name, *(const size_t *)(const void *)at);
        else
            config_put_duration(o, 2, f->name, *(const int64_t *)(const void *)at);
    }
}
