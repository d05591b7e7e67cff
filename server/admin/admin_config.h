/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin_config.h — the admin listener's keys as the configuration gives
 * them, and the check that admin_listen stays apart from listen; read by
 * admin_config.c.
 */
#ifndef IDEM_SERVER_ADMIN_ADMIN_CONFIG_H
#define IDEM_SERVER_ADMIN_ADMIN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "config_secret.h"

/* An API key of the admin listener: its name (logged on use), its scope,
 * the SHA-256 of its text (the text itself is not kept) and where the text
 * came from. */
struct api_key {
    char *name;
    int write;               /* scope: write (1: everything) or read (0: GET only) */
    unsigned char hash[32];
    struct config_secret src; /* its env: or file: */
    unsigned long line;      /* where the file gives it */
    int64_t logged_ms;       /* when its use was last logged (serve.c) */
};

struct server_config;

/* What a command-line change can break across fields (admin_listen spelled
 * as listen). 0, or -1 with err. */
int config_check_addresses(const struct server_config *cfg, char *err, size_t errlen);

/* For config.c. */
struct config_ctx;
struct yaml_node_s;

/* admin_listen: into cfg's admin_host and admin_port, or admin_unix. */
int config_read_admin_listen(struct config_ctx *c, const struct yaml_node_s *v,
                             struct server_config *cfg);
/* api_keys: into cfg->api_keys. */
int config_read_api_keys(struct config_ctx *c, const struct yaml_node_s *n,
                         struct server_config *cfg);

/* For config_print() (config.h): admin_listen: (a comment when it is not
 * set yet: config_finish() sets its default), and api_keys:, each key by
 * the env: or file: it is read from. */
struct config_out;
void config_print_admin_listen(struct config_out *o, const struct server_config *cfg);
void config_print_api_keys(struct config_out *o, const struct server_config *cfg);

#endif
