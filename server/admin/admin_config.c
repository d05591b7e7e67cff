/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin_config.c — reads the admin listener's part of idem serve's
 * configuration: admin_listen: (in listen's forms, read by
 * http/front_config.c, or a Unix socket, and never sharing listen's
 * address) and api_keys:, whose text comes from the environment or a file
 * and of which only the SHA-256 is kept. The values are read with
 * config_value.h; config.c calls in here.
 */
#include "admin/admin_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_print.h"
#include "config_value.h"
#include "idem.h"

#define API_KEYS_MAX 100
#define API_KEY_MIN 16 /* bytes: a key shorter than that is a password, not a key */

/* Would listen and admin_listen share connections, as far as the file
 * tells: one port, and the same host or a wildcard covering the other
 * (0.0.0.0 covers IPv4, :: everything). Names, and port 0, wait for the
 * bound sockets (front.c). */
static int same_listen_address(const struct server_config *cfg)
{
    if (!cfg->admin_host || cfg->admin_port == 0 || cfg->admin_port != cfg->listen_port)
        return 0;
    const char *a = cfg->admin_host, *l = cfg->listen_host;
    return strcmp(a, l) == 0 || strcmp(a, "::") == 0 || strcmp(l, "::") == 0 ||
           (strcmp(a, "0.0.0.0") == 0 && !strchr(l, ':')) ||
           (strcmp(l, "0.0.0.0") == 0 && !strchr(a, ':'));
}

int config_check_addresses(const struct server_config *cfg, char *err, size_t errlen)
{
    if (!same_listen_address(cfg))
        return 0;
    snprintf(err, errlen, "listen (%s:%d) and admin_listen (%s:%d) would share connections: "
             "the JSON API gets a listener of its own (another port, or another address and "
             "no wildcard)", cfg->listen_host, cfg->listen_port, cfg->admin_host,
             cfg->admin_port);
    return -1;
}

/* admin_listen: listen's forms (front_config.c), and unix:PATH; never the
 * address listen has. */
int config_read_admin_listen(struct config_ctx *c, const yaml_node_t *v,
                             struct server_config *cfg)
{
    if (config_get_listen(c, v, "admin_listen", &cfg->admin_host, &cfg->admin_port,
                          &cfg->admin_unix, &cfg->admin_plaintext, &cfg->admin_tls))
        return -1;
    if (same_listen_address(cfg))
        return config_fail(c, v, "admin_listen",
                           "would share connections with listen (the same "
                           "address, or a wildcard, on the same port): the JSON API gets a "
                           "listener of its own (another port, or a Unix socket)");
    return 0;
}

void config_print_admin_listen(struct config_out *o, const struct server_config *cfg)
{
    if (!cfg->admin_host && !cfg->admin_unix) {
        config_put_comment(o, 0, "admin_listen: not set: the Unix socket idem-admin.sock in "
                           "state_dir");
        return;
    }
    config_print_listen(o, "admin_listen", cfg->admin_host, cfg->admin_port, cfg->admin_unix,
                        cfg->admin_plaintext, &cfg->admin_tls);
}

void config_print_api_keys(struct config_out *o, const struct server_config *cfg)
{
    config_put_list(o, 0, "api_keys", cfg->api_key_count);
    for (size_t i = 0; i < cfg->api_key_count; i++) {
        const struct api_key *k = &cfg->api_keys[i];
        config_put_item(o);
        config_put_str(o, 4, "name", k->name);
        config_put_word(o, 4, "scope", k->write ? "write" : "read");
        config_put_secret(o, 4, &k->src);
    }
}

/* api_keys: [{ name, scope: read | write, env: NAME | file: PATH }], the
 * admin listener's keys. Their text comes from the environment or a file,
 * never from this one, and only its SHA-256 is kept. */
int config_read_api_keys(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    static const char *const known[] = {"env", "file", "name", "scope"};
    static const char *const scopes[] = {"read", "write"}; /* k->write 0, 1 */
    yaml_node_item_t *it = NULL;
    size_t count = 0;
    char path[32], fpath[48], text[SECRET_MAX + 2];
    int rc = -1;
    if (config_list_items(c, n, "api_keys", "a list of { name, scope, env or file }", &it, &count))
        return -1;
    if (count > API_KEYS_MAX)
        return config_fail(c, n, "api_keys", "%zu keys; at most %d", count, API_KEYS_MAX);
    if (count && !(cfg->api_keys = calloc(count, sizeof *cfg->api_keys)))
        return config_oom(c);
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *kn = config_node(c, it[i]), *v;
        struct api_key *k = &cfg->api_keys[i];
        cfg->api_key_count = i + 1;
        k->line = (unsigned long)kn->start_mark.line + 1;
        config_pathf(path, sizeof path, "api_keys[%zu]", i);
        if (kn->type != YAML_MAPPING_NODE) {
            config_fail(c, kn, path, "expected { name: ..., scope: read or write, env: NAME or "
                        "file: PATH }, got %s", config_kind_name(kn));
            goto out;
        }
        if ((v = config_field(c, kn, "key")) || (v = config_field(c, kn, "value"))) {
            config_fail(c, v, path, "a key's text never sits in this file: give env: NAME or "
                        "file: PATH, which holds it");
            goto out;
        }
        config_pathf(fpath, sizeof fpath, "%s.name", path);
        if (!(v = config_field(c, kn, "name"))) {
            config_fail(c, kn, fpath, "missing (a name for the log, say ops or grafana)");
            goto out;
        }
        if (config_get_name(c, v, fpath, &k->name))
            goto out;
        config_pathf(fpath, sizeof fpath, "%s.scope", path);
        if (!(v = config_field(c, kn, "scope"))) {
            config_fail(c, kn, fpath, "missing (read: GET records and metrics; write: everything)");
            goto out;
        }
        if (config_get_enum(c, v, fpath, "read or write", scopes, 2, "a scope (read or write)",
                            &k->write))
            goto out;
        if (config_get_secret(c, kn, path, known, 4, text, &k->src))
            goto out;
        size_t len = strlen(text);
        for (size_t j = 0; j < len; j++)
            if ((unsigned char)text[j] <= ' ' || (unsigned char)text[j] >= 0x7f) {
                config_fail(c, kn, path, "the key holds a space or a character outside printable "
                            "ASCII (make one with: openssl rand -hex 32)");
                goto out;
            }
        if (len < API_KEY_MIN) {
            config_fail(c, kn, path, "the key is %zu bytes; at least %d (make one with: openssl "
                        "rand -hex 32)", len, API_KEY_MIN);
            goto out;
        }
        idem_fingerprint(text, len, k->hash);
        config_pathf(fpath, sizeof fpath, "%s.name", path);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(cfg->api_keys[j].name, k->name) == 0) {
                config_fail(c, kn, fpath, "the name %s is api_keys[%zu]'s too (line %lu): each "
                            "key has a name of its own", k->name, j, cfg->api_keys[j].line);
                goto out;
            }
            if (memcmp(cfg->api_keys[j].hash, k->hash, sizeof k->hash) == 0) {
                config_fail(c, kn, path, "the same key as api_keys[%zu] (line %lu): each name "
                            "needs a key of its own", j, cfg->api_keys[j].line);
                goto out;
            }
        }
    }
    rc = 0;
out:
    /* The text is gone once hashed. */
    memset(text, 0, sizeof text);
    __asm__ __volatile__("" : : "r"(text) : "memory");
    return rc;
}
