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

enum key_source {
    KEY_HEADER,       /* { header: Idempotency-Key } */
    KEY_JSON,         /* { json: refund_no }  (a top-level field; "a.b" for nested) */
    KEY_QUERY,        /* { query: id } */
    KEY_PATH_SEGMENT, /* { path_segment: 2 }  (1-based: /refunds/R-1 -> 2 is R-1) */
};

/* A consumer's { message_id: true }: the message's id, which the consumer
 * puts in this header of the request it hands the gateway (and of its POST
 * to the handler), in place of any the message carried. */
#define CONSUMER_MESSAGE_ID_HEADER "Idem-Message-Id"


struct key_part {
    enum key_source source;
    char *name;  /* header, JSON field or query parameter */
    int segment; /* KEY_PATH_SEGMENT */
};

enum fingerprint_kind {
    FINGERPRINT_BODY,   /* method, target with its query, and the whole body (default) */
    FINGERPRINT_FIELDS, /* the listed JSON fields only: routes sharing a space agree */
    FINGERPRINT_NONE,
};

struct upstream_addrs;

struct upstream_url {
    char *host;       /* "127.0.0.1" */
    int port;         /* 80 (https: 443) when not given */
    int tls;          /* https://: the certificate checked (tls_ca) */
    char *base_path;  /* "" or "/api" (no trailing slash): prefixed to the path */
    unsigned long line;            /* where the file gives it */
    struct upstream_addrs *addrs;  /* looked up by config_resolve(); NULL before */
};

struct route_counts;

/* A listener's TLS: its certificate chain and key (PEM files), and for the
 * admin listener a CA whose client certificates it requires. cert NULL:
 * plain HTTP. */
struct tls_files {
    char *cert, *key, *client_ca;
};

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
    int64_t upstream_timeout_ms; /* default 30 s */
    char **replay_headers;   /* lower-cased; default: content-type */
    size_t replay_header_count;
    enum fingerprint_kind fingerprint;
    char **fingerprint_fields; /* FINGERPRINT_FIELDS */
    size_t fingerprint_field_count;
    int on_5xx_store;        /* on_upstream_5xx: store (1) or release (0, default) */
    /* store_statuses: the upstream statuses (100..599) whose answers are
     * kept, bit (status - 100); the rest release the claim. Default: every
     * status under 500, and 5xx with on_upstream_5xx: store. Routes only: a
     * consumer's attempts follow max_attempts. */
    uint64_t keep_status[(500 + 63) / 64];
    int store_statuses_set;  /* store_statuses was given */
    struct problem_text *problems; /* problems: this route's, over the global ones */
    size_t problem_count;
    int on_redis_down_reject; /* on_redis_down: reject (1: 503) or skip (0, default:
                                 layers 1-2 are skipped, the record still holds) */
    int key_optional;         /* key_required: false (1): a request without the key is
                                 forwarded unguarded, counted and logged as unkeyed */
    int unknown_hold;         /* on_unknown_outcome: hold (1: the claim is held for
                                 retention, at most a day, until an operator finishes
                                 it) or expire
                                 (0, default: retries run once the lease ends) */
    /* A consumer's route (consumer.route): its handler is the upstream,
     * and each claim is an attempt — the record's epoch counts them (see
     * gateway.c, "attempts"). 0 on the routes of routes:. */
    unsigned max_attempts;
};

enum consumer_source {
    SOURCE_AMQP,         /* { amqp: URL, queue: NAME, prefetch: N } */
    SOURCE_REDIS_STREAM, /* { redis_stream: URL, stream: NAME, group: NAME } */
};

#define CONSUMER_BACKOFFS_MAX 16

/* consumers[i]: a queue or stream whose messages go to a handler once
 * each, through the gateway's steps (consume.c). */
struct consumer_config {
    char *name;
    enum consumer_source source;
    char *url;               /* amqp://… or redis://…; a password only from env: or
                                file:, or RabbitMQ's loopback-only guest:guest */
    char *queue;             /* the AMQP queue, or the Redis stream */
    char *group;             /* Redis: the consumer group (default idem) */
    char *body_field;        /* Redis: the entry's field holding the body (body) */
    size_t prefetch;         /* messages handled at once; default 64 */
    char *dead_letter;       /* the queue (stream) given up messages go to;
                                default: the queue's name and .dead */
    int64_t backoff_ms[CONSUMER_BACKOFFS_MAX]; /* retry_backoff; the last repeats */
    size_t backoff_count;
    /* name, handler (the upstream), key, space, lease, handler_timeout
     * (upstream_timeout), retention, fingerprint, max_attempts; the record
     * layer only. */
    struct route route;
    unsigned long line;
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

/* An API key of the admin listener: its name (logged on use), its scope,
 * and the SHA-256 of its text (the text itself is not kept). */
struct api_key {
    char *name;
    int write;               /* scope: write (1: everything) or read (0: GET only) */
    unsigned char hash[32];
    unsigned long line;      /* where the file gives it */
    int64_t logged_ms;       /* when its use was last logged (serve.c) */
};

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
    unsigned storage_pool;    /* distributed: PostgreSQL connections; default 8 */
    int64_t storage_timeout_ms; /* distributed: connect and command timeout; 2 s */
    char *subject_header;     /* default X-Subject */
    struct upstream_url upstream; /* where requests no route matches go */
    int has_upstream;         /* 0: those get 404 no_route */
    int workers;              /* threads for blocking calls (API, distributed store); default 64 */
    int event_loops;          /* 0: one per processor, at most 4; else 1..16 */
    /* access_log: a line per request on listen and per message consumed.
     * to: NULL stderr (the default), "" off, else a file (opened for
     * appending, reopened on SIGUSR1); json (default) or text; the subject
     * as its hash (default), plain, or left out. */
    int log_level;            /* log.level: 0 debug, 1 info (default), 2 warn, 3 error */
    int log_json;             /* log.format: json (1) or text (0, default) */
    char *access_to;
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

/* The configuration with every default and no routes (no file given). */
struct server_config *config_default(void);

/* --listen over the file's listen, with the forms and checks of listen.
 * 0, or -1 with err ("--listen X: what is wrong"). */
int config_set_listen(struct server_config *cfg, const char *s, char *err, size_t errlen);

/* What a command-line change can break across fields (admin_listen spelled
 * as listen). 0, or -1 with err. */
int config_check_addresses(const struct server_config *cfg, char *err, size_t errlen);

/* After --listen and --db are applied: admin_listen's default (the Unix
 * socket idem-admin.sock in state_dir), and the exposure check: listen or
 * admin_listen on an address other than loopback is refused unless the file
 * says allow_plaintext: true for it. 0, or -1 with err saying why and what
 * to write instead. */
int config_finish(struct server_config *cfg, char *err, size_t errlen);

/* 1 for an address only this machine reaches: 127.0.0.0/8, ::1, localhost. */
int config_is_loopback(const char *host);

void config_free(struct server_config *c);

/* Where the store is, fit for a log line: the SQLite path, or the two
 * servers' URLs with any user and password left out. */
void config_storage_where(const struct server_config *c, char *buf, size_t size);

/* 1 if a Redis or PostgreSQL URL (or key=value connection string) carries a
 * password. */
int config_url_has_password(const char *url);

/* 1 for one of Idem's names, as a route's space must be: 1 to 64 of
 * A-Z a-z 0-9 _ . : - (idem run checks its --space with it). */
int config_is_name(const char *s);

/* Does the route keep an answer with this upstream status (store_statuses)? */
int config_route_keeps(const struct route *r, int status);

/* The text configured for problem type on route rt (NULL: none), field by
 * field: the route's problems, else the global ones; NULL where neither
 * sets it. */
void config_problem_text(const struct server_config *c, const struct route *rt,
                         const char *type, const char **title, const char **detail);

/* "500ms", "30s", "5m", "24h", "2d" or a bare number of milliseconds. */
int config_parse_duration(const char *s, int64_t *ms);
/* "1048576", "64KiB"/"64k", "1MiB"/"1m"/"1MB" ... 0; -1 not a size; -2 a
 * size too large to hold (*bytes untouched either way). */
int config_parse_size(const char *s, size_t *bytes);

#endif
