/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_value.h — what every section of idem serve's configuration reads
 * its values with: the walk over the YAML document (a field of a mapping,
 * the items of a list, the "unknown field" check), the file:line error
 * every refusal is written as, and the typed values more than one section
 * takes (durations, sizes, counts, choices, names, header names, JSON
 * fields, paths, upstream URLs, secrets from the environment or a file).
 *
 * config.c reads the top level and hands each section to the part it
 * configures (gateway/route_config.c, consume/consumer_config.c, ...),
 * which reads it with these, as h2o's handlers read theirs with its
 * configurator's value parsers. Only those readers include this header.
 *
 * Each get function checks one value and, if it is wrong, writes the one
 * error line into the context and returns -1; the caller returns -1 too.
 * A path names the field for messages ("routes[0].lease").
 */
#ifndef IDEM_SERVER_CONFIG_VALUE_H
#define IDEM_SERVER_CONFIG_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include <yaml.h>

#include "config_secret.h"

#define LIST_MAX 64        /* replay_headers, fingerprint fields */
#define NAME_MAX_LEN 64    /* route names, spaces, scenes: Idem's names */
#define FIELD_MAX_LEN 255  /* header names, JSON fields, query parameters */
#define URL_PATH_MAX 2048  /* match.path, an upstream's base path */
#define FS_PATH_MAX 4096   /* storage.path */
#define SECRET_MAX 4096    /* a secret read from the environment or a file */
#define UNIX_PATH_MAX 107  /* a Unix socket's path fits in sun_path with its NUL */
#define MSG_MAX 512

#define MS_SEC 1000LL
#define MS_MIN (60 * MS_SEC)
#define MS_HOUR (60 * MS_MIN)
#define MS_DAY (24 * MS_HOUR)
#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define GIB (1024 * MIB)

/* The one document being read, and where its error goes. */
struct config_ctx {
    yaml_document_t doc;
    const char *name;     /* the file, for messages */
    const char *input;    /* the text, to place reader errors */
    size_t input_len;
    char *err;
    size_t errlen;
    char quoted[112];     /* the one user value a message quotes */
};

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

/* ---- Errors: "name:line: path: message". */

/* The line being n's (none when n is NULL). Always returns -1. */
PRINTF_LIKE(4, 5)
int config_fail(struct config_ctx *c, const yaml_node_t *n, const char *path,
                const char *fmt, ...);
PRINTF_LIKE(3, 4)
int config_fail_at(struct config_ctx *c, const yaml_mark_t *mark, const char *fmt, ...);
/* A Redis URL (redis:// or redis-sentinel://, as core/redis_url.h reads
 * them) that will parse when the store or a consumer opens it: refused
 * here, at its line, with the parser's reason (never the password). */
int config_check_redis_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           const char *url);
/* A PostgreSQL URL or key=value string that libpq will read when the store
 * opens it: refused here, at its line, with libpq's reason when the URL is
 * written in the file (libpq may quote it; one from env: or file: is a
 * secret). */
int config_check_postgres_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                              const char *url);
/* "out of memory"; -1. */
int config_oom(struct config_ctx *c);
/* s in double quotes, escaped, cut short if long: safe to print whatever the
 * file held. Valid until the next call. */
const char *config_quote(struct config_ctx *c, const char *s);
/* A field's path for messages ("routes[0].key[1].json"); a long one is cut
 * short, which is harmless: the line number is there too. */
PRINTF_LIKE(3, 4)
void config_pathf(char *buf, size_t size, const char *fmt, ...);
/* path.field, or field at the top level. */
void config_join(char *buf, size_t size, const char *path, const char *field);

/* ---- The document. */

yaml_node_t *config_node(struct config_ctx *c, int id);
const char *config_scalar_value(const yaml_node_t *n);
/* A plain empty, "~" or "null" scalar: YAML's way of writing nothing. */
int config_is_null(const yaml_node_t *n);
/* "a mapping", "a list", "a single value" or "no value", for messages. */
const char *config_kind_name(const yaml_node_t *n);
/* n as a string: a scalar, not null, without NUL bytes. */
int config_scalar(struct config_ctx *c, const yaml_node_t *n, const char *path,
                  const char *expected, const char **out);
/* Checks that map is a mapping (or nothing) whose keys are plain strings,
 * each one of known[] (at most 64) and none given twice; an unknown one is
 * refused with the nearest known name, or the list of them. */
int config_check_fields(struct config_ctx *c, const yaml_node_t *map, const char *path,
                        const char *const *known, size_t nknown);
/* The value of field name in map (already checked), or NULL. */
yaml_node_t *config_field(struct config_ctx *c, const yaml_node_t *map, const char *name);
/* The items of a list field, or none for a null. */
int config_list_items(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *expected, yaml_node_item_t **start, size_t *count);

/* ---- Typed values. */

int config_set_string(char **dst, const char *s);
char *config_lower_dup(const char *s);
void config_free_list(char **list, size_t n);
/* Leading decimal digits of s into *v; returns the end, or NULL when there
 * are none or the value passes max. */
const char *config_digits(const char *s, uint64_t max, uint64_t *v);
/* 1 if s holds a control character (bytes < 0x20 and 0x7f). */
int config_has_control(const char *s);
/* An HTTP field name (RFC 9110 token) of 1 to max bytes. */
int config_is_token(const char *s, size_t max);

int config_get_duration(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        int64_t min, int64_t max, int64_t *out);
/* ms and n as config_parse_duration and config_parse_size read them back
 * exactly: in the largest unit that divides them ("1d", "90s", "1500ms";
 * "16MiB", "1536B"). buf, for messages and the configuration printed. */
const char *config_fmt_duration(int64_t ms, char *buf, size_t size);
const char *config_fmt_size(size_t n, char *buf, size_t size);
/* A list of 1 to max durations, each min_ms..max_ms, like [1s, 5s, 30s]
 * (backoffs), into out; *count their number. */
int config_get_durations(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         int64_t min_ms, int64_t max_ms, int64_t *out, size_t max,
                         size_t *count);
int config_get_size(struct config_ctx *c, const yaml_node_t *n, const char *path,
                    size_t min, size_t max, size_t *out);
int config_get_count(struct config_ctx *c, const yaml_node_t *n, const char *path,
                     uint64_t min, uint64_t max, uint64_t *out);
/* One of words[0..nwords) into *out (its index). expected is what the
 * value should be ("debug, info, warn or error"); a word outside them is
 * refused as "\"x\" is not WHAT" (what NULL: expected). */
int config_get_enum(struct config_ctx *c, const yaml_node_t *n, const char *path,
                    const char *expected, const char *const *words, size_t nwords,
                    const char *what, int *out);
/* One of two words: *out = 0 for a, 1 for b. */
int config_get_choice(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *a, const char *b, int *out);
int config_get_bool(struct config_ctx *c, const yaml_node_t *n, const char *path, int *out);
/* One of Idem's names (config_is_name), copied into *dst. */
int config_get_name(struct config_ctx *c, const yaml_node_t *n, const char *path, char **dst);
int config_get_header_name(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           const char **out);
/* "refund_no" or "order.id": dot-separated JSON object fields. */
int config_get_json_field(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char **out);
/* A path the daemon opens (what: "file" or "directory"), checked for what a
 * path may hold; whether it opens is for the part that opens it to say. */
int config_get_path(struct config_ctx *c, const yaml_node_t *n, const char *path,
                    const char *what, char **dst);
/* 0 if file (a path config_get_path read from n) can be read now, or the
 * error at n naming why not: a certificate, key or CA file, which the
 * daemon reads at start and at each reload. */
int config_check_readable(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char *file);

/* ---- Addresses and URLs. */

/* A port; 0 only where allow_zero. 0, or -1. */
int config_parse_port(const char *s, int *port, int allow_zero);
/* "host:port", "[v6]:port", ":port" or "port" into *host and *port. NULL,
 * or why not. */
const char *config_parse_hostport(const char *s, int need_port, int allow_zero, char **host,
                                  int *port);
/* The characters a URL path (match.path, a base path) may hold. */
int config_url_path_char(unsigned char ch);
struct upstream_url;
/* http://host[:port][/base] or https://...: a route's upstream, a
 * consumer's handler, the default upstream. */
int config_get_upstream(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct upstream_url *u);
/* u written back as a URL, "http://host:port/base", the host as the file
 * gave it (an IPv6 address in brackets); buf. */
const char *config_upstream_text(const struct upstream_url *u, char *buf, size_t size);
/* url without its user, password and parameters: "redis://host:6379/0"
 * (a key=value connection string with a password: said so, not shown). */
void config_url_without_userinfo(const char *url, char *buf, size_t size);
/* A secret from { env: NAME } or { file: PATH } (its first line) in n, a
 * mapping whose other fields are in known (env and file among them), into
 * buf (SECRET_MAX + 2 bytes), and where it came from into *src (its name
 * malloc'd: config_secret_free). 0, or -1 having said why (*src untouched). */
int config_get_secret(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *const *known, size_t nknown, char *buf,
                      struct config_secret *src);

#endif
