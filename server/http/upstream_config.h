/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upstream_config.h — an upstream as the configuration gives it
 * (http://host[:port][/base] or https://...: a route's upstream, a
 * consumer's handler, the default upstream), read by config_get_upstream()
 * (config_value.h) and looked up by config_resolve() (config.h); the
 * upstream client (upstream.h) connects to it.
 */
#ifndef IDEM_SERVER_HTTP_UPSTREAM_CONFIG_H
#define IDEM_SERVER_HTTP_UPSTREAM_CONFIG_H

struct upstream_addrs;

struct upstream_url {
    char *host;       /* "127.0.0.1" */
    int port;         /* 80 (https: 443) when not given */
    int tls;          /* https://: the certificate checked (tls_ca) */
    char *base_path;  /* "" or "/api" (no trailing slash): prefixed to the path */
    unsigned long line;            /* where the file gives it */
    struct upstream_addrs *addrs;  /* looked up by config_resolve(); NULL before */
};

#endif
