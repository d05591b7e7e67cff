/* SPDX-License-Identifier: Apache-2.0 */
/*
 * front_config.h — what the front end listens with, as the configuration
 * gives it: a listener's TLS files and the limits of its connections and
 * requests, read by front_config.c with listen: and --listen.
 */
#ifndef IDEM_SERVER_HTTP_FRONT_CONFIG_H
#define IDEM_SERVER_HTTP_FRONT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

/* A listener's TLS: its certificate chain and key (PEM files), and for the
 * admin listener a CA whose client certificates it requires. cert NULL:
 * plain HTTP. */
struct tls_files {
    char *cert, *key, *client_ca;
};

struct server_limits {
    size_t request_line_max;    /* default 8 KiB */
    size_t header_count_max;    /* default 100 */
    size_t header_bytes_max;    /* default 32 KiB */
    size_t body_max;            /* default 1 MiB */
    size_t response_max;        /* stored/forwarded upstream response body; default 1 MiB */
    size_t connections_max;     /* default 10000 */
    size_t connections_per_peer; /* of those, from one client address; default 1000 */
    size_t admin_connections_max; /* on admin_listen, counted apart; default 64 */
    size_t requests_per_connection; /* default 10000 */
    int64_t idle_timeout_ms;    /* keep-alive connection idle; default 60 s */
    int64_t header_timeout_ms;  /* a request's head must arrive within; default 10 s */
    int64_t body_timeout_ms;    /* its body within; default 30 s */
    int64_t send_timeout_ms;    /* a client reads nothing of its answer; default 60 s */
    size_t in_flight_max;       /* requests being handled at once; default 1024 */
    size_t in_flight_per_peer;  /* of those, from one client address; default 256 */
    int64_t shutdown_timeout_ms; /* SIGTERM: how long in-flight requests may finish; default 30 s */
    size_t replay_cache;        /* finished answers kept per event loop; default 16 MiB, 0: off */
    size_t tokens_per_scene;    /* unspent tokens per subject and scene; default 16 */
    int64_t token_ttl_max_ms;   /* a token issued on listen lives at most; default 1 h */
    size_t token_rate_subject;  /* tokens issued on listen per second, per subject; 10 */
    size_t token_rate_peer;     /* the same per client address; default 100 */
};

struct server_config;

/* --listen over the file's listen, with the forms and checks of listen.
 * 0, or -1 with err ("--listen X: what is wrong"). */
int config_set_listen(struct server_config *cfg, const char *s, char *err, size_t errlen);

/* 1 for an address only this machine reaches: 127.0.0.0/8, ::1, localhost. */
int config_is_loopback(const char *host);

/* For config.c and the admin listener's reader. */
struct config_ctx;
struct yaml_node_s;

/* listen and admin_listen: an address, or { address: ..., tls: { cert,
 * key }, allow_plaintext: true }. admin_listen also takes unix:PATH
 * (unix_path non-NULL) and tls.client_ca. */
int config_get_listen(struct config_ctx *c, const struct yaml_node_s *n, const char *path,
                      char **host, int *port, char **unix_path, int *plaintext,
                      struct tls_files *tls);
/* limits: into *l. */
int config_get_limits(struct config_ctx *c, const struct yaml_node_s *n,
                      struct server_limits *l);

/* For config_print() (config.h), which prints the configuration back. */
struct config_out;

/* listen or admin_listen (key) as config_get_listen reads it back: the
 * mapping form, every field; unix_path for admin_listen's unix:PATH. */
void config_print_listen(struct config_out *o, const char *key, const char *host, int port,
                         const char *unix_path, int plaintext, const struct tls_files *tls);
/* limits:, every one. */
void config_print_limits(struct config_out *o, const struct server_limits *l);

#endif
