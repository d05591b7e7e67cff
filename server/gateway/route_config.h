/* SPDX-License-Identifier: Apache-2.0 */
/*
 * route_config.h — a route as the configuration gives it (routes: in
 * idem serve's file, and a consumer's route): what it matches, the parts
 * of its key, its layers and its record's policy, read by route_config.c.
 * The router, the gateway and the request keys read these structs.
 */
#ifndef IDEM_SERVER_GATEWAY_ROUTE_CONFIG_H
#define IDEM_SERVER_GATEWAY_ROUTE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/status_set.h"
#include "http/upstream_config.h"

#include "gateway/key_part.h"

enum fingerprint_kind {
    FINGERPRINT_BODY,   /* method, target with its query, and the whole body (default) */
    FINGERPRINT_FIELDS, /* the listed JSON fields only: routes sharing a space agree */
    FINGERPRINT_NONE,
};

struct route_counts;
struct route_states;
struct route_resolve;

/* problems: the text a team gives one problem type of the gateway's answers
 * (localised: "请刷新后重试" for token_spent); the type itself never changes. */
struct problem_text {
    char *type;   /* token_spent: the type without its urn:idem: */
    char *title;  /* NULL: the status's reason phrase, or the global one */
    char *detail; /* NULL: Idem's own detail, or the global one */
};

struct route {
    char *name;              /* required; unique */
    char *method;            /* match.method, upper case; NULL: any */
    char *path;              /* match.path without the trailing "*"; a '*'
                              * segment in it stands for any one segment */
    int prefix;              /* match.path ended in slash-star: a prefix match */
    char *folded_path;       /* path through config_fold_path(), a prefix's
                              * final '/' kept */
    struct route_counts *n; /* the daemon's counters for this route's name:
                                * set by the daemon, not the parser */
    struct upstream_url upstream;   /* required */
    struct key_part *key;    /* one part, or several for a composite key */
    size_t key_parts;        /* >= 1; required */
    char *space;             /* default: the route's name */
    int scope_subject;       /* scope: subject (1) or global (0, default) */
    int layer_token;         /* layers: [token, lock, record]; record always on */
    int layer_lock;
    char *token_scene;       /* default: the route's name */
    int in_flight_wait;      /* in_flight: wait (1) or reject (0, default) */
    int64_t wait_timeout_ms; /* default 5 s */
    int64_t lease_ms;        /* default 30 s */
    int64_t retention_ms;    /* default 24 h */
    int64_t tombstone_ms;    /* tombstone: how long after its retention a key is
                                refused (410 key_expired) before it is new; 0: off */
    int64_t upstream_timeout_ms; /* default 30 s */
    char **replay_headers;   /* lower-cased; default: content-type */
    size_t replay_header_count;
    enum fingerprint_kind fingerprint;
    char **fingerprint_fields; /* FINGERPRINT_FIELDS */
    size_t fingerprint_field_count;
    int on_5xx_store;        /* on_upstream_5xx: store (1) or release (0, default) */
    /* store_statuses: the upstream statuses (100..599) whose answers are
     * kept, bit (status - 100); the rest release the claim for another
     * try. Default (routes and consumers): every status under 500 but the
     * ones that ask for a retry (408, 425, 429), and 5xx with
     * on_upstream_5xx: store. */
    uint64_t keep_status[STATUS_SET_WORDS];
    int store_statuses_set;  /* store_statuses was given */
    struct problem_text *problems; /* problems: this route's, over the global ones */
    size_t problem_count;
    int on_redis_down_reject; /* on_redis_down: reject (1: 503) or skip (0, default:
                                 layers 1-2 are skipped, the record still holds) */
    int key_optional;         /* key_required: false (1): a request without the key is
                                 forwarded unguarded, counted and logged as unkeyed */
    int pass_host;            /* pass_host: true: the client's Host goes upstream (as
                                 Traefik and Envoy do), not the upstream's host:port */
    /* on_unknown_outcome: resolve: the status query that decides an
     * unknown outcome (resolve_config.h), or NULL. */
    struct route_resolve *resolve;
    int unknown_hold;         /* on_unknown_outcome: hold (1: the claim is held for
                                 retention, at most a day, until an operator finishes
                                 it) or expire
                                 (0, default: retries run once the lease ends) */
    /* states: the business's machine for this space's keys, and where a
     * request names the state it moves its key to (states_config.h), or
     * NULL: a plain record per key. */
    struct route_states *states;
    /* signature: the provider's signature checked on the body before
     * anything else (gateway/signature.h), or NULL. */
    struct signature *signature;
    /* A kept answer with this status or above fails the record (FAILED),
     * one below completes it: 500 on routes, 400 for a consumer's handler. */
    int fails_from;
    /* Each claim is an attempt, and at most this many are made: the
     * record's epoch counts them (see gateway.c, "attempts"), the last one
     * keeps whatever it gets. A consumer's (max_attempts); 0 on the routes
     * of routes:, whose clients decide when to retry. */
    unsigned max_attempts;
};

/* A path as a lenient upstream reads it, for telling spellings of one path
 * apart: letters in lower case, %-escapes of unreserved characters and of
 * '/' decoded (nginx, for one, routes on %2F as a '/'), path parameters (a
 * ';' to its segment's end) dropped (servlet containers map a path without
 * them), no trailing slash. Never longer than path; out holds cap bytes. */
void config_fold_path(const char *path, char *out, size_t cap);
/* 1 when path is matched by a route's path (or folded path) pattern: its
 * characters as they are, but a '*' segment for any one segment that is not
 * empty, and with prefix, anything after all that. */
int config_path_match(const char *pattern, int prefix, const char *path);

/* Does the route keep an answer with this upstream status (store_statuses)? */
int config_route_keeps(const struct route *r, int status);
/* Does the route hold a claim whose outcome is unknown (on_unknown_outcome:
 * hold or resolve), past its lease, for an operator or its resolver? */
int config_route_holds(const struct route *r);
/* Keep the answers with a status from..to (100..599) as well. */
void config_route_keep(struct route *r, int from, int to);
/* Keep what a route keeps without store_statuses: every answer under 500
 * but 408, 425 and 429, which ask for a retry, and with with_5xx the 5xx
 * too. */
void config_route_keep_default(struct route *r, int with_5xx);

struct server_config;

/* The text configured for problem type on route rt (NULL: none), field by
 * field: the route's problems, else the global ones; NULL where neither
 * sets it. */
void config_problem_text(const struct server_config *c, const struct route *rt,
                         const char *type, const char **title, const char **detail);

/* For config.c and the consumers' reader, which read a route's parts. */
struct config_ctx;
struct yaml_node_s;

/* A route's defaults, before its fields are read. 0, or -1 out of memory. */
int config_route_defaults(struct route *r);
void config_route_free(struct route *r);
void config_problems_free(struct problem_text *p, size_t n);
/* The route's key parts and states.field name a WeChat Pay resource's
 * field only with a wechatpay_v3 signature that has an apiv3_key: 0, or
 * -1 having said so at n's path. After the route's signature is read. */
int config_check_resource_parts(struct config_ctx *c, const struct yaml_node_s *n,
                                const char *path, const struct route *r);
/* key: one part or a list of them (for_consumer: header, json, message_id). */
int config_get_key(struct config_ctx *c, const struct yaml_node_s *n, const char *path,
                   struct route *r, int for_consumer);
/* What a route and a consumer say alike of their records: space, lease,
 * retention, replay_headers, fingerprint, states, read from the mapping n. */
int config_get_record_fields(struct config_ctx *c, const struct yaml_node_s *n,
                             const char *path, struct route *r, int for_consumer);
/* on_unknown_outcome (expire, hold, resolve) and resolve:, as a route and
 * a consumer say them, from the mapping n. */
int config_get_unknown_outcome(struct config_ctx *c, const struct yaml_node_s *n,
                               const char *path, struct route *r);
/* problems: { token_spent: { title: ..., detail: ... }, ... } */
int config_get_problems(struct config_ctx *c, const struct yaml_node_s *n, const char *path,
                        struct problem_text **out, size_t *count);
/* routes: into cfg->routes. */
int config_read_routes(struct config_ctx *c, const struct yaml_node_s *n,
                       struct server_config *cfg);

/* For config_print() (config.h) and the consumers' printer: each reader's
 * fields printed back, at indent, as it reads them. */
struct config_out;
/* key: its one part, or the list of them. */
void config_print_key(struct config_out *o, int indent, const struct route *r, int for_consumer);
/* space, lease, retention, tombstone, replay_headers, fingerprint, states. */
void config_print_record_fields(struct config_out *o, int indent, const struct route *r,
                                int for_consumer);
/* on_unknown_outcome, and resolve: with resolve. */
void config_print_unknown_outcome(struct config_out *o, int indent, const struct route *r);
/* problems: (key), nothing when there are none. */
void config_print_problems(struct config_out *o, int indent, const struct problem_text *p,
                           size_t n);
/* routes:, every field of each. */
void config_print_routes(struct config_out *o, const struct server_config *cfg);

#endif
