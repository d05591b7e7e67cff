/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config.h — idem serve's configuration: the YAML file, parsed and checked
 * into plain structs. Every value the daemon uses comes from here, with its
 * default; a file that does not parse, or names an unknown field, or gives a
 * value out of range, is refused with the file, line and field named.
 */
#ifndef IDEM_SERVER_CONFIG_H
#define IDEM_SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "admin/admin_config.h"
#include "config_secret.h"
#include "consume/consumer_config.h"
#include "gateway/route_config.h"
#include "http/front_config.h"
#include "http/upstream_config.h"

struct server_config {
    char *path;               /* the file it came from (for reload), or NULL */
    char *listen_host;        /* default 127.0.0.1 */
    int listen_port;          /* default 8080 */
    int listen_plaintext;     /* listen.allow_plaintext: a non-loopback address is
                                 allowed without TLS */
    struct tls_files listen_tls, admin_tls; /* listen.tls, admin_listen.tls */
    char *tls_ca;             /* CAs for https:// upstreams; NULL: the system's */
    char *admin_host;         /* admin_listen as host:port, */
    int admin_port;
    char *admin_unix;         /* or as unix:PATH (the default: state_dir's
                                 idem-admin.sock); exactly one of the two is set
                                 once config_finish() has run */
    int admin_plaintext;      /* admin_listen.allow_plaintext */
    char *state_dir;          /* default: the embedded store file's directory, or . */
    struct api_key *api_keys; /* the admin listener's keys; none: it refuses all */
    size_t api_key_count;
    char *storage_kind;       /* "embedded" (default) or "distributed" */
    char *storage_path;       /* embedded: default ./idem.db */
    char *redis_url;          /* distributed: secret when it holds a password */
    char *postgres_url;       /* distributed: likewise; never logged */
    struct config_secret redis_src, postgres_src; /* where each came from: the env:
                                 or file: the file gave (kind NONE: written out) */
    unsigned storage_pool;    /* distributed: PostgreSQL connections; default 8 */
    int64_t storage_timeout_ms; /* distributed: connect and command timeout; 2 s */
    int require_sync_replication; /* distributed: refuse to start (and fail health)
                                     when the primary has no synchronous standby */
    char *subject_header;     /* default X-Subject */
    struct upstream_url upstream; /* where requests no route matches go */
    int has_upstream;         /* 0: those get 404 no_route */
    int workers;              /* workers: as given (0: not), and ignored: the JSON API
                                 runs on the event loops; kept so older files load */
    int event_loops;          /* 0: one per processor, at most 4; else 1..16 */
    /* access_log: a line per request on listen and per message consumed.
     * to: NULL stdout (the default: the daemon's own log is on stderr) or
     * stderr (access_stderr), "" off, else a file (opened for appending,
     * reopened on SIGUSR1); json (default) or text; the subject as its
     * hash (default), plain, or left out. */
    int log_level;            /* log.level: 0 debug, 1 info (default), 2 warn, 3 error */
    int log_json;             /* log.format: json (1) or text (0, default) */
    char *access_to;
    int access_stderr;
    int access_text;
    enum { SUBJECT_HASH, SUBJECT_PLAIN, SUBJECT_OFF } access_subject;
    struct server_limits limits;
    struct problem_text *problems; /* problems: for every route's answers */
    size_t problem_count;
    struct route *routes;
    size_t route_count;
    struct consumer_config *consumers;
    size_t consumer_count;
};

/* Parse and check the YAML file at path. On success returns 0 and *out; on
 * failure returns -1 and writes one line to err: "idem.yaml:12: routes[0].lease:
 * \"abc\" is not a duration (use 500ms, 30s, 5m, 24h)". */
int config_load(const char *path, struct server_config **out, char *err, size_t errlen);

/* The same, from a string (tests, fuzzing); name is used in messages. */
int config_parse(const char *yaml, size_t len, const char *name,
                 struct server_config **out, char *err, size_t errlen);

/* Look up the address of every upstream (the routes' and the default one):
 * the one step of loading a configuration that may block, on DNS, kept
 * apart from parsing so that the parser never touches the network. 0, or
 * -1 with err naming the line and field ("idem.yaml:9: routes[0].upstream:
 * upstream svc:9000: Name or service not known"). */
int config_resolve(struct server_config *cfg, char *err, size_t errlen);

/* The configuration with every default and no routes (no file given). */
struct server_config *config_default(void);

/* After --listen and --db are applied: admin_listen's default (the Unix
 * socket idem-admin.sock in state_dir), and the exposure check: listen or
 * admin_listen on an address other than loopback is refused unless the file
 * says allow_plaintext: true for it. 0, or -1 with err saying why and what
 * to write instead. */
int config_finish(struct server_config *cfg, char *err, size_t errlen);

void config_free(struct server_config *c);

/* The configuration as YAML (idem serve -T): every field, every default
 * filled in, in a form config_parse() reads back to the same configuration
 * (so that printing that gives the same text again). A secret is printed
 * as the { env: NAME } or { file: PATH } it is read from, never its value;
 * an upstream by the host name the file gives, not its address. Fields
 * config_finish() fills in (admin_listen, state_dir) are printed once it
 * has run, a comment before. 0, or -1 when f could not be written. */
int config_print(FILE *f, const struct server_config *c);

/* The i-th of c's routes, then of its consumers' routes (route_count +
 * consumer_count in all): everything that keeps records in a space. */
const struct route *config_nth_route(const struct server_config *c, size_t i);

/* Of a PROCESSING claim on space, its span (lease_until - updated): 1 when
 * it is the lease of a route or consumer there, the claim in flight and
 * renewed to it; 0 when a hold set it (hold, resolve: gateway.c's
 * FINISH_HOLD), the claim held. The one rule the admin's listings and
 * actions read a claim by (the held census keeps a copy of the leases,
 * its rounds outliving a reload). */
int config_span_is_lease(const struct server_config *c, const char *space, int64_t span);

/* Where the store is, fit for a log line: the SQLite path, or the two
 * servers' URLs with any user and password left out. */
void config_storage_where(const struct server_config *c, char *buf, size_t size);

/* 1 if a Redis or PostgreSQL URL (or key=value connection string) carries a
 * password. */
int config_url_has_password(const char *url);

/* 1 for one of Idem's names, as a route's space must be: 1 to 64 of
 * A-Z a-z 0-9 _ . : - (idem run checks its --space with it). */
int config_is_name(const char *s);

/* "500ms", "30s", "5m", "24h", "2d" or a bare number of milliseconds. */
int config_parse_duration(const char *s, int64_t *ms);
/* "1048576", "64KiB"/"64k", "1MiB"/"1m"/"1MB" ... 0; -1 not a size; -2 a
 * size too large to hold (*bytes untouched either way). */
int config_parse_size(const char *s, size_t *bytes);

#endif
