/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_print.h — the YAML writer the configuration is printed back with
 * (idem serve -T, config_print() in config.h): block mappings and lists
 * two spaces a level, every string a file could give double-quoted and
 * escaped, Idem's own words (embedded, reject, 2xx) plain, durations and
 * sizes in the largest unit that is exact, a secret as the env: or file:
 * it is read from. What it writes, config_parse() reads back to the same
 * configuration.
 *
 * config.c prints the top level and hands each section to the part that
 * reads it (gateway/route_config.c, consume/consumer_config.c, ...), which
 * prints it beside its reader with these, as it reads with config_value.h.
 * indent is the column of the key; a list's items are mappings whose first
 * key config_put_item() turns into "- key".
 */
#ifndef IDEM_SERVER_CONFIG_PRINT_H
#define IDEM_SERVER_CONFIG_PRINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config_secret.h"
#include "config_value.h"

struct config_out {
    FILE *f;
    int item; /* the next key starts a list's item: "- " in its indent's last two columns */
};

/* The next key written starts an item of a list (at indent - 2). */
void config_put_item(struct config_out *o);
/* "key:" alone on its line, its value on the lines below at indent + 2. */
void config_put_key(struct config_out *o, int indent, const char *key);
/* "key: " and the value is for the caller to write, and the newline. */
void config_put_name(struct config_out *o, int indent, const char *key);
/* s double-quoted, escaped as YAML reads it back (", \, control characters,
 * the code points a YAML reader takes for a line break or refuses). */
void config_put_quoted(FILE *f, const char *s);

/* key: "s" */
void config_put_str(struct config_out *o, int indent, const char *key, const char *s);
/* key: word, plain: one of Idem's own words, never a file's text. */
void config_put_word(struct config_out *o, int indent, const char *key, const char *word);
void config_put_bool(struct config_out *o, int indent, const char *key, int v);
void config_put_count(struct config_out *o, int indent, const char *key, uint64_t v);
/* key: 30s, as config_parse_duration reads it back exactly. */
void config_put_duration(struct config_out *o, int indent, const char *key, int64_t ms);
/* key: 16MiB, as config_parse_size reads it back exactly. */
void config_put_size(struct config_out *o, int indent, const char *key, size_t bytes);
/* A list of n mappings: "key: []" when there are none, else "key:" for
 * the items below (config_put_item). */
void config_put_list(struct config_out *o, int indent, const char *key, size_t n);
/* key: [1s, 5s, 30s] */
void config_put_durations(struct config_out *o, int indent, const char *key, const int64_t *ms,
                          size_t n);
/* key: ["a", "b"] */
void config_put_strings(struct config_out *o, int indent, const char *key, char *const *list,
                        size_t n);
/* "# text", a line for the reader (what a field left out means). */
PRINTF_LIKE(3, 4)
void config_put_comment(struct config_out *o, int indent, const char *fmt, ...);
/* env: "NAME" or file: "PATH", a line of the mapping that holds it. */
void config_put_secret(struct config_out *o, int indent, const struct config_secret *src);
/* A URL that may hold a password (storage, a consumer's broker): key:
 * "URL" as the file wrote it (config_get_* refused it with a password),
 * or key: and its env: or file: below. */
void config_put_url(struct config_out *o, int indent, const char *key, const char *url,
                    const struct config_secret *src);
struct upstream_url;
/* key: "http://host:port/base", the host as the file gave it (not an
 * address it was resolved to). */
void config_put_upstream(struct config_out *o, int indent, const char *key,
                         const struct upstream_url *u);

#endif
