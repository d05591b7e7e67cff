/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_value.c — the value parsers every section of the configuration
 * reads with (config_value.h): the walk over libyaml's document tree, the
 * one-line errors with file, line and field, and the typed values
 * (durations, sizes, counts, words, names, paths, URLs, secrets), each
 * checked for its syntax and range once, here. config.c reads the top
 * level; each part reads its own section with these.
 */
#include "config_value.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "core/redis_url.h"
#include "store/store.h"

/* ------------------------------------------------------------------------- */
/* Durations and sizes. */

static int is_digit(int ch)
{
    return ch >= '0' && ch <= '9';
}

static int lower(int ch)
{
    return ch >= 'A' && ch <= 'Z' ? ch + ('a' - 'A') : ch;
}

/* Leading decimal digits of s into *v; returns the end, or NULL when there are
 * none or the value passes max. */
const char *config_digits(const char *s, uint64_t max, uint64_t *v)
{
    uint64_t n = 0;
    if (!is_digit((unsigned char)*s))
        return NULL;
    for (; is_digit((unsigned char)*s); s++) {
        unsigned d = (unsigned)(*s - '0');
        if (n > (max - d) / 10)
            return NULL;
        n = n * 10 + d;
    }
    *v = n;
    return s;
}

static const char *skip_blanks(const char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/* A duration as Go, Traefik and Envoy users write it: one or more parts,
 * each a number (a decimal fraction allowed: 1.5s) and its unit, as in
 * 1h30m or 2m30s; or a whole number alone, which is milliseconds. The sum
 * must be a whole number of milliseconds (1.5ms is not). */
int config_parse_duration(const char *s, int64_t *ms)
{
    static const struct { const char *unit; size_t len; uint64_t ms; } units[] = {
        {"ms", 2, 1}, {"s", 1, MS_SEC}, {"m", 1, MS_MIN}, {"h", 1, MS_HOUR}, {"d", 1, MS_DAY},
    }; /* "ms" before "m" */
    uint64_t total = 0;
    int parts = 0;
    if (!s || !is_digit((unsigned char)*s))
        return -1;
    while (*s) {
        uint64_t whole, frac = 0, scale = 1;
        const char *end = config_digits(s, (uint64_t)INT64_MAX, &whole);
        if (!end)
            return -1;
        if (*end == '.') {
            if (!is_digit((unsigned char)*++end))
                return -1;
            for (; is_digit((unsigned char)*end); end++) {
                if (scale == 1000000000) /* nine decimals at most */
                    return -1;
                frac = frac * 10 + (uint64_t)(*end - '0');
                scale *= 10;
            }
        }
        end = skip_blanks(end);
        if (!*end) { /* no unit: milliseconds, a whole number alone */
            if (parts || scale != 1)
                return -1;
            *ms = (int64_t)whole;
            return 0;
        }
        size_t i = 0;
        while (i < sizeof units / sizeof units[0] &&
               (strncmp(end, units[i].unit, units[i].len) != 0 ||
                (end[units[i].len] && !is_digit((unsigned char)end[units[i].len]))))
            i++;
        if (i == sizeof units / sizeof units[0])
            return -1;
        uint64_t unit = units[i].ms, part, fraction = frac * unit; /* < 1e9 * 8.64e7 */
        if (whole > (uint64_t)INT64_MAX / unit || fraction % scale != 0)
            return -1;
        part = whole * unit + fraction / scale;
        if (part > (uint64_t)INT64_MAX - total)
            return -1;
        total += part;
        parts++;
        s = end + units[i].len;
    }
    *ms = (int64_t)total;
    return 0;
}

int config_parse_size(const char *s, size_t *bytes)
{
    static const struct { const char *unit; size_t mult; } units[] = {
        {"", 1},      {"b", 1},      {"k", KIB},    {"kb", KIB},
        {"kib", KIB}, {"m", MIB},    {"mb", MIB},   {"mib", MIB},
        {"g", GIB},   {"gb", GIB},   {"gib", GIB},
    };
    uint64_t n = 0;
    const char *end;
    char unit[4];
    size_t len = 0;
    int too_big = 0;
    if (!s || !is_digit((unsigned char)*s))
        return -1;
    if (!(end = config_digits(s, SIZE_MAX, &n))) {
        too_big = 1; /* a size still, if a unit follows: said as such */
        for (end = s; is_digit((unsigned char)*end); end++)
            ;
    }
    end = skip_blanks(end);
    for (; end[len]; len++) {
        if (len == sizeof unit - 1)
            return -1;
        unit[len] = (char)lower((unsigned char)end[len]);
    }
    unit[len] = '\0';
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(unit, units[i].unit) != 0)
            continue;
        if (too_big || n > SIZE_MAX / units[i].mult)
            return -2;
        *bytes = (size_t)n * units[i].mult;
        return 0;
    }
    return -1;
}

/* "1d", "10m", "1500ms": the largest unit that divides evenly. */
const char *config_fmt_duration(int64_t ms, char *buf, size_t size)
{
    static const struct { const char *unit; int64_t ms; } units[] = {
        {"d", MS_DAY}, {"h", MS_HOUR}, {"m", MS_MIN}, {"s", MS_SEC},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (ms != 0 && ms % units[i].ms == 0) {
            snprintf(buf, size, "%lld%s", (long long)(ms / units[i].ms), units[i].unit);
            return buf;
        }
    snprintf(buf, size, "%lldms", (long long)ms);
    return buf;
}

const char *config_fmt_size(size_t n, char *buf, size_t size)
{
    static const struct { const char *unit; size_t mult; } units[] = {
        {"GiB", GIB}, {"MiB", MIB}, {"KiB", KIB},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (n != 0 && n % units[i].mult == 0) {
            snprintf(buf, size, "%zu%s", n / units[i].mult, units[i].unit);
            return buf;
        }
    snprintf(buf, size, "%zuB", n);
    return buf;
}

void config_free_list(char **list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i]);
    free(list);
}

/* ------------------------------------------------------------------------- */
/* Walking the document: errors, node access, field tables. */

PRINTF_LIKE(4, 0)
static int vfail(struct config_ctx *c, unsigned long line, const char *path,
                 const char *fmt, va_list ap)
{
    char msg[MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (!c->err || c->errlen == 0)
        return -1;
    const char *sep = path && *path ? ": " : "";
    if (line)
        snprintf(c->err, c->errlen, "%s:%lu: %s%s%s", c->name, line,
                 path ? path : "", sep, msg);
    else
        snprintf(c->err, c->errlen, "%s: %s%s%s", c->name, path ? path : "", sep,
                 msg);
    return -1;
}

/* "name:line: path: message", the line being n's (none when n is NULL).
 * Always returns -1. */
PRINTF_LIKE(4, 5)
int config_fail(struct config_ctx *c, const yaml_node_t *n, const char *path,
                const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, n ? (unsigned long)n->start_mark.line + 1 : 0, path, fmt, ap);
    va_end(ap);
    return -1;
}

PRINTF_LIKE(3, 4)
int config_fail_at(struct config_ctx *c, const yaml_mark_t *mark, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, (unsigned long)mark->line + 1, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

/* s in double quotes, escaped, cut short if long: safe to print whatever the
 * file held. Valid until the next call. */
const char *config_quote(struct config_ctx *c, const char *s)
{
    char *o = c->quoted;
    size_t n = 0, cap = sizeof c->quoted;
    o[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (n + 10 >= cap) {
            memcpy(o + n, "...", 3);
            n += 3;
            break;
        }
        if (*p == '"' || *p == '\\') {
            o[n++] = '\\';
            o[n++] = (char)*p;
        } else if (*p < 0x20 || *p >= 0x7f) {
            n += (size_t)snprintf(o + n, cap - n, "\\x%02x", *p);
        } else {
            o[n++] = (char)*p;
        }
    }
    o[n++] = '"';
    o[n] = '\0';
    return o;
}

/* A field's path for messages ("routes[0].key[1].json"). A long one is cut
 * short, which is harmless: the line number is there too. */
PRINTF_LIKE(3, 4)
void config_pathf(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

void config_join(char *buf, size_t size, const char *path, const char *field)
{
    if (*path)
        config_pathf(buf, size, "%s.%s", path, field);
    else
        config_pathf(buf, size, "%s", field);
}

yaml_node_t *config_node(struct config_ctx *c, int id)
{
    return yaml_document_get_node(&c->doc, id);
}

const char *config_scalar_value(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

/* A plain empty, "~" or "null" scalar: YAML's way of writing nothing. */
int config_is_null(const yaml_node_t *n)
{
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *v = config_scalar_value(n);
    return !strcmp(v, "") || !strcmp(v, "~") || !strcmp(v, "null") ||
           !strcmp(v, "Null") || !strcmp(v, "NULL");
}

const char *config_kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        /* "key:" with nothing after it is an empty plain scalar. */
        return n->data.scalar.length == 0 && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
                   ? "no value"
                   : "a single value";
    }
}

/* n as a string: a scalar, not null, without NUL bytes ("\0" in a double-
 * quoted scalar would otherwise cut the value short unseen). */
int config_scalar(struct config_ctx *c, const yaml_node_t *n, const char *path,
                  const char *expected, const char **out)
{
    if (n->type != YAML_SCALAR_NODE)
        return config_fail(c, n, path, "expected %s, got %s", expected, config_kind_name(n));
    if (config_is_null(n))
        return config_fail(c, n, path, "no value (expected %s)", expected);
    if (strlen(config_scalar_value(n)) != n->data.scalar.length)
        return config_fail(c, n, path, "contains a NUL byte");
    *out = config_scalar_value(n);
    return 0;
}

/* Edit distance, for "did you mean". Both strings are at most 64 bytes. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[65];
    if (la > 64 || lb > 64)
        return SIZE_MAX;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (lower((unsigned char)a[i - 1]) !=
                                  lower((unsigned char)b[j - 1]));
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Is word one of name's words, as '_' parts them (timeout of
 * upstream_timeout)? Not name itself, nor an empty word. */
static int has_word(const char *name, const char *word)
{
    size_t n = strlen(word);
    if (!n || strcmp(name, word) == 0)
        return 0;
    for (const char *p = name; (p = strstr(p, word)) != NULL; p++)
        if ((p == name || p[-1] == '_') && (p[n] == '\0' || p[n] == '_'))
            return 1;
    return 0;
}

/* A field name a message can show: printable, cut short. */
static void safe_name(char *buf, size_t size, const char *s)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && n + 1 < size; p++)
        buf[n++] = *p > 0x20 && *p < 0x7f ? (char)*p : '?';
    buf[n] = '\0';
}

/* Checks that map is a mapping (or nothing) whose keys are plain strings, each
 * one of known[] and none given twice. */
int config_check_fields(struct config_ctx *c, const yaml_node_t *map, const char *path,
                        const char *const *known, size_t nknown)
{
    uint64_t seen = 0;
    if (config_is_null(map))
        return 0;
    if (map->type != YAML_MAPPING_NODE)
        return config_fail(c, map, path, "expected a mapping (field: value), got %s",
                           config_kind_name(map));
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = config_node(c, p->key);
        char name[72], fpath[160];
        if (!k || k->type != YAML_SCALAR_NODE ||
            strlen(config_scalar_value(k)) != k->data.scalar.length)
            return config_fail(c, k ? k : map, path, "field names must be plain strings");
        safe_name(name, sizeof name, config_scalar_value(k));
        config_join(fpath, sizeof fpath, path, name);
        size_t i = 0;
        while (i < nknown && strcmp(config_scalar_value(k), known[i]) != 0)
            i++;
        if (i < nknown) {
            if (seen & ((uint64_t)1 << i))
                return config_fail(c, k, fpath, "given twice");
            seen |= (uint64_t)1 << i;
            continue;
        }
        size_t best = SIZE_MAX, at = 0;
        for (size_t j = 0; j < nknown; j++) {
            size_t d = distance(config_scalar_value(k), known[j]);
            if (d < best) {
                best = d;
                at = j;
            }
        }
        if (best <= 2 && best < strlen(known[at]))
            return config_fail(c, k, fpath, "unknown field (did you mean %s?)", known[at]);
        /* A word of a known field's name (timeout: upstream_timeout and
         * wait_timeout), as another tool names it. */
        char words[MSG_MAX / 2];
        size_t w = 0, found = 0;
        words[0] = '\0';
        for (size_t j = 0; j < nknown && found < 4; j++)
            if (has_word(known[j], config_scalar_value(k)))
                w += (size_t)snprintf(words + w, sizeof words - w, "%s%s", found++ ? " or " : "",
                                      known[j]);
        if (found && w < sizeof words)
            return config_fail(c, k, fpath, "unknown field (did you mean %s?)", words);
        char list[MSG_MAX / 2];
        size_t n = 0;
        list[0] = '\0';
        for (size_t j = 0; j < nknown && n < sizeof list; j++)
            n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", j ? ", " : "",
                                  known[j]);
        return config_fail(c, k, fpath, "unknown field (known here: %s)", list);
    }
    return 0;
}

/* The value of field name in map (already checked), or NULL. */
yaml_node_t *config_field(struct config_ctx *c, const yaml_node_t *map, const char *name)
{
    if (map->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = config_node(c, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp(config_scalar_value(k), name))
            return config_node(c, p->value);
    }
    return NULL;
}

/* The items of a list field, or none for a null. */
int config_list_items(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *expected, yaml_node_item_t **start, size_t *count)
{
    if (config_is_null(n)) {
        *start = NULL;
        *count = 0;
        return 0;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return config_fail(c, n, path, "expected %s, got %s", expected, config_kind_name(n));
    *start = n->data.sequence.items.start;
    *count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Typed values. */

int config_set_string(char **dst, const char *s)
{
    char *copy = strdup(s);
    if (!copy)
        return -1;
    free(*dst);
    *dst = copy;
    return 0;
}

int config_oom(struct config_ctx *c)
{
    return config_fail(c, NULL, NULL, "out of memory");
}

int config_get_duration(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        int64_t min, int64_t max, int64_t *out)
{
    const char *s;
    int64_t ms;
    char a[32], b[32];
    if (config_scalar(c, n, path, "a duration like 500ms, 1.5s, 5m, 1h30m, 24h", &s))
        return -1;
    if (*s == '-')
        return config_fail(c, n, path, "%s: negative durations are not allowed (must be "
                           "%s to %s)", config_quote(c, s),
                           config_fmt_duration(min, a, sizeof a),
                           config_fmt_duration(max, b, sizeof b));
    if (config_parse_duration(s, &ms))
        return config_fail(c, n, path, "%s is not a duration (numbers with ms, s, m, h or "
                           "d, e.g. 500ms, 1.5s, 5m, 1h30m, 24h; a whole number alone is "
                           "milliseconds)", config_quote(c, s));
    if ((ms < min || ms > max) && s[strspn(s, "0123456789")] == '\0') {
        /* A number alone is milliseconds: say so, and what was likely meant. */
        char hint[64] = "";
        if (ms <= INT64_MAX / MS_SEC && ms * MS_SEC >= min && ms * MS_SEC <= max)
            snprintf(hint, sizeof hint, "; did you mean %llds?", (long long)ms);
        return config_fail(c, n, path, "%s is read as %lld ms, out of range (must be %s to %s): "
                           "a number without a unit is milliseconds%s",
                           config_quote(c, s), (long long)ms,
                           config_fmt_duration(min, a, sizeof a),
                           config_fmt_duration(max, b, sizeof b), hint);
    }
    if (ms < min || ms > max)
        return config_fail(c, n, path, "%s is out of range (must be %s to %s)",
                           config_quote(c, s), config_fmt_duration(min, a, sizeof a),
                           config_fmt_duration(max, b, sizeof b));
    *out = ms;
    return 0;
}

int config_get_durations(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         int64_t min_ms, int64_t max_ms, int64_t *out, size_t max,
                         size_t *count)
{
    yaml_node_item_t *it;
    size_t got;
    char ipath[160];
    if (config_list_items(c, n, path, "a list of durations like [1s, 5s, 30s]", &it, &got))
        return -1;
    if (got == 0 || got > max)
        return config_fail(c, n, path, "1 to %zu durations, not %zu", max, got);
    for (size_t i = 0; i < got; i++) {
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_get_duration(c, config_node(c, it[i]), ipath, min_ms, max_ms, &out[i]))
            return -1;
    }
    *count = got;
    return 0;
}

int config_get_size(struct config_ctx *c, const yaml_node_t *n, const char *path,
                    size_t min, size_t max, size_t *out)
{
    const char *s;
    size_t v;
    char a[32], b[32];
    if (config_scalar(c, n, path, "a size like 64KiB or 1MiB", &s))
        return -1;
    int bad = config_parse_size(s, &v);
    if (bad == -1)
        return config_fail(c, n, path, "%s is not a size (use a whole number of bytes "
                           "with an optional unit B, KiB, MiB, GiB; k/KB, m/MB, g/GB "
                           "are accepted and also mean multiples of 1024)", config_quote(c, s));
    if (bad == -2 || v < min || v > max) /* -2: a size, too large to hold */
        return config_fail(c, n, path, "%s is out of range (must be %s to %s)",
                           config_quote(c, s), config_fmt_size(min, a, sizeof a),
                           config_fmt_size(max, b, sizeof b));
    *out = v;
    return 0;
}

int config_get_count(struct config_ctx *c, const yaml_node_t *n, const char *path,
                     uint64_t min, uint64_t max, uint64_t *out)
{
    const char *s, *end;
    uint64_t v;
    if (config_scalar(c, n, path, "a whole number", &s))
        return -1;
    end = config_digits(s, UINT64_MAX, &v);
    if (!end || *end)
        return config_fail(c, n, path, "%s is not a whole number (must be %llu to %llu)",
                           config_quote(c, s), (unsigned long long)min, (unsigned long long)max);
    if (v < min || v > max)
        return config_fail(c, n, path, "%s is out of range (must be %llu to %llu)",
                           config_quote(c, s), (unsigned long long)min, (unsigned long long)max);
    *out = v;
    return 0;
}

/* One word of a few. Every such field (log.level, storage.kind, a key's
 * scope, on_upstream_5xx, ...) reads through here. */
int config_get_enum(struct config_ctx *c, const yaml_node_t *n, const char *path,
                    const char *expected, const char *const *words, size_t nwords,
                    const char *what, int *out)
{
    const char *s = NULL;
    if (config_scalar(c, n, path, expected, &s))
        return -1;
    for (size_t i = 0; i < nwords; i++)
        if (!strcmp(s, words[i])) {
            *out = (int)i;
            return 0;
        }
    return config_fail(c, n, path, "%s is not %s", config_quote(c, s), what ? what : expected);
}

/* One of two words: *out = 0 for a, 1 for b. */
int config_get_choice(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *a, const char *b, int *out)
{
    const char *const words[] = {a, b};
    char expected[64];
    snprintf(expected, sizeof expected, "%s or %s", a, b);
    return config_get_enum(c, n, path, expected, words, 2, NULL, out);
}

/* Idem's names: key spaces, scenes, and so route names. */
int config_is_name(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch) ||
              ch == '_' || ch == '.' || ch == ':' || ch == '-'))
            return 0;
    }
    return n >= 1 && n <= NAME_MAX_LEN;
}

int config_get_name(struct config_ctx *c, const yaml_node_t *n, const char *path, char **dst)
{
    const char *s;
    if (config_scalar(c, n, path, "a name of 1 to 64 of A-Z a-z 0-9 _ . : -", &s))
        return -1;
    if (!config_is_name(s))
        return config_fail(c, n, path, "%s is not a valid name (1 to 64 of A-Z a-z 0-9 "
                           "_ . : -)", config_quote(c, s));
    return config_set_string(dst, s) ? config_oom(c) : 0;
}

/* An HTTP field name (RFC 9110 token). */
int config_is_token(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++) {
        unsigned char ch = (unsigned char)s[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch) ||
              (ch && strchr("!#$%&'*+-.^_`|~", ch))))
            return 0;
    }
    return n >= 1 && n <= max;
}

int config_get_header_name(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           const char **out)
{
    if (config_scalar(c, n, path, "a header name", out))
        return -1;
    if (!config_is_token(*out, FIELD_MAX_LEN))
        return config_fail(c, n, path, "%s is not a header name (1 to 255 of A-Z a-z "
                           "0-9 and !#$%%&'*+-.^_`|~)", config_quote(c, *out));
    return 0;
}

/* 1 if s holds a control character (bytes < 0x20 and 0x7f). */
int config_has_control(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

/* "refund_no" or "order.id": dot-separated JSON object fields. */
int config_get_json_field(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char **out)
{
    const char *s = NULL;
    if (config_scalar(c, n, path, "a JSON field name", &s))
        return -1;
    size_t len = strlen(s);
    int bad = len > FIELD_MAX_LEN || s[0] == '.' || s[len - 1] == '.' ||
              strstr(s, "..") != NULL;
    if (bad || config_has_control(s))
        return config_fail(c, n, path, "%s is not a JSON field (a name, or names joined "
                           "by dots for nested objects, 1 to 255 bytes, no control "
                           "characters)", config_quote(c, s));
    *out = s;
    return 0;
}

char *config_lower_dup(const char *s)
{
    char *d = strdup(s);
    if (d)
        for (char *p = d; *p; p++)
            *p = (char)lower((unsigned char)*p);
    return d;
}

/* ------------------------------------------------------------------------- */
/* Addresses. */

static int is_hostname(const char *s, size_t len)
{
    if (len == 0 || len > 253)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || is_digit(ch) ||
              ch == '.' || ch == '-' || ch == '_'))
            return 0;
    }
    return 1;
}

static int is_ipv6(const char *s, size_t len)
{
    int colons = 0;
    if (len < 2 || len > 45)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == ':')
            colons++;
        else if (!(is_digit(ch) || (lower(ch) >= 'a' && lower(ch) <= 'f') || ch == '.'))
            return 0;
    }
    return colons >= 2;
}

/* A port; 0 only where allow_zero (listen: the system picks a free port,
 * which is what tests want). */
int config_parse_port(const char *s, int *port, int allow_zero)
{
    uint64_t v;
    const char *end = config_digits(s, 65535, &v);
    if (!end || *end || (v == 0 && !allow_zero))
        return -1;
    *port = (int)v;
    return 0;
}

/* "host:port", "[v6]:port", ":port" or "port". On failure says why. */
const char *config_parse_hostport(const char *s, int need_port, int allow_zero, char **host,
                                  int *port)
{
    const char *h = s, *colon;
    size_t hlen;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close)
            return "a '[' without its ']'";
        h = s + 1;
        hlen = (size_t)(close - h);
        if (!is_ipv6(h, hlen))
            return "not an IPv6 address between [ and ]";
        colon = close[1] == ':' ? close + 1 : NULL;
        if (close[1] && !colon)
            return "unexpected text after ]";
    } else {
        colon = strchr(s, ':');
        if (colon && strchr(colon + 1, ':'))
            return "an IPv6 address goes in brackets, as in [::1]:8080";
        hlen = colon ? (size_t)(colon - s) : strlen(s);
        if (hlen && !is_hostname(h, hlen))
            return "not a host name or IPv4 address";
    }
    if (colon) {
        if (config_parse_port(colon + 1, port, allow_zero))
            return allow_zero ? "the port must be a number from 0 to 65535"
                              : "the port must be a number from 1 to 65535";
    } else if (need_port) {
        return "no port";
    }
    if (hlen) {
        char *copy = strndup(h, hlen);
        if (!copy)
            return "out of memory";
        free(*host);
        *host = copy;
    }
    return NULL;
}

int config_get_bool(struct config_ctx *c, const yaml_node_t *n, const char *path, int *out)
{
    const char *s;
    if (config_scalar(c, n, path, "true or false", &s))
        return -1;
    if (strcmp(s, "true") != 0 && strcmp(s, "false") != 0)
        return config_fail(c, n, path, "%s: expected true or false", config_quote(c, s));
    *out = strcmp(s, "true") == 0;
    return 0;
}

/* A path the daemon opens (what: "file" for a certificate, key or CA,
 * "directory" for state_dir), checked for what a path may hold; whether it
 * opens is for the part that opens it to say (config_check_readable for a
 * file read at every load). */
int config_get_path(struct config_ctx *c, const yaml_node_t *n, const char *path, const char *what,
                    char **dst)
{
    const char *s;
    if (config_scalar(c, n, path, "a path", &s))
        return -1;
    if (!*s || strlen(s) > FS_PATH_MAX || config_has_control(s))
        return config_fail(c, n, path, "%s: expected a %s's path (at most %d bytes, no control "
                           "characters)", config_quote(c, s), what, FS_PATH_MAX);
    return config_set_string(dst, s) ? config_oom(c) : 0;
}

int config_check_readable(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char *file)
{
    if (access(file, R_OK) == 0)
        return 0;
    int e = errno;
    return config_fail(c, n, path, "%s: %s (it is read at start and at each SIGHUP, by the "
                       "daemon's user)", config_quote(c, file), strerror(e));
}

static int has_prefix_nocase(const char *s, const char *prefix)
{
    for (; *prefix; s++, prefix++)
        if (lower((unsigned char)*s) != *prefix)
            return 0;
    return 1;
}

/* The part of a URL path both match.path and a base path allow. */
int config_url_path_char(unsigned char ch)
{
    return ch > 0x20 && ch < 0x7f && ch != '?' && ch != '#';
}

const char *config_upstream_text(const struct upstream_url *u, char *buf, size_t size)
{
    int v6 = strchr(u->host, ':') != NULL;
    snprintf(buf, size, "%s://%s%s%s:%d%s", u->tls ? "https" : "http", v6 ? "[" : "", u->host,
             v6 ? "]" : "", u->port, u->base_path ? u->base_path : "");
    return buf;
}

int config_get_upstream(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct upstream_url *u)
{
    const char *url, *s, *why = NULL, *rest;
    char *authority = NULL;
    if (config_scalar(c, n, path, "a URL like http://127.0.0.1:9000", &url))
        return -1;
    s = url;
    u->tls = has_prefix_nocase(s, "https://");
    if (!u->tls && !has_prefix_nocase(s, "http://"))
        return config_fail(c, n, path, "%s is not an upstream URL (use http://host[:port]"
                           "[/base] or https://...)", config_quote(c, s));
    s += u->tls ? 8 : 7;
    rest = s + strcspn(s, "/?#");
    if (strpbrk(s, "?#"))
        why = "a query or fragment is not allowed (use http://host[:port][/base])";
    else if (memchr(s, '@', (size_t)(rest - s)))
        why = "user:password@ is not allowed in an upstream URL";
    else if (rest == s || *s == ':')
        why = "no host (use http://host[:port][/base])";
    if (!why && !(authority = strndup(s, (size_t)(rest - s))))
        return config_oom(c);
    if (!why) {
        u->port = u->tls ? 443 : 80;
        why = config_parse_hostport(authority, 0, 0, &u->host, &u->port);
        free(authority);
    }
    if (!why) {
        size_t len = strlen(rest);
        while (len > 0 && rest[len - 1] == '/')
            len--;
        if (len > URL_PATH_MAX)
            why = "the base path is longer than 2048 bytes";
        for (size_t i = 0; i < len && !why; i++)
            if (!config_url_path_char((unsigned char)rest[i]))
                why = "the base path holds a space or control character";
        if (!why) {
            char *base = strndup(rest, len);
            if (!base)
                return config_oom(c);
            free(u->base_path);
            u->base_path = base;
        }
    }
    if (why)
        return config_fail(c, n, path, "%s: %s", config_quote(c, url), why);
    u->line = (unsigned long)n->start_mark.line + 1;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* Secrets. */

/* A URL's user part ends at its LAST '@' (as the Redis backend reads it), so
 * that a password holding '/', '?' or '#' unescaped still counts as one and
 * is never printed. NULL when there is no '@' after the scheme. */
static const char *userinfo_end(const char *url)
{
    const char *scheme = strstr(url, "://");
    return scheme ? strrchr(scheme + 3, '@') : NULL;
}

/* libpq's keywords that hold a secret: password, and sslpassword (the
 * client key's passphrase). p..p+n is a keyword. */
static int password_keyword(const char *p, size_t n)
{
    return (n == 8 && !memcmp(p, "password", 8)) || (n == 11 && !memcmp(p, "sslpassword", 11));
}

int config_url_has_password(const char *url)
{
    const char *scheme = strstr(url, "://");
    if (scheme) {
        const char *at = userinfo_end(url);
        if (at && memchr(scheme + 3, ':', (size_t)(at - (scheme + 3))))
            return 1;
        /* postgresql://host/db?password=...&sslpassword=... */
        const char *q = strchr(at ? at : scheme + 3, '?');
        for (; q; q = strchr(q, '&')) {
            q++;
            if (password_keyword(q, strcspn(q, "=&")))
                return 1;
        }
        return 0;
    }
    /* key=value form: a secret's keyword anywhere, "keyword =" or
     * "keyword=". */
    for (const char *p = url; *p;) {
        p += strspn(p, " ");
        size_t n = strcspn(p, " =");
        const char *eq = p + n + strspn(p + n, " ");
        if (*eq == '=' && password_keyword(p, n))
            return 1;
        p += n;
        p += strcspn(p, " ");
    }
    return 0;
}

/* url without its user, password and parameters: "redis://host:6379/0". */
void config_url_without_userinfo(const char *url, char *buf, size_t size)
{
    const char *scheme = strstr(url, "://");
    if (!scheme) {
        snprintf(buf, size, "%s", config_url_has_password(url)
                                      ? "(a connection string with a password)" : url);
        return;
    }
    const char *at = userinfo_end(url);
    const char *host = at ? at + 1 : scheme + 3;
    int n = (int)strcspn(host, "?#");
    snprintf(buf, size, "%.*s%.*s", (int)(scheme + 3 - url), url, n, host);
}

/* A secret from { env: NAME } or { file: PATH } (its first line) in n, a
 * mapping whose other fields are in known (env and file among them), into
 * buf (SECRET_MAX + 2 bytes), and its source into *src. 0, or -1 having
 * said why. */
int config_get_secret(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      const char *const *known, size_t nknown, char *buf,
                      struct config_secret *src)
{
    const char *s;
    char fpath[64];
    {
        const yaml_node_t *env, *file;
        if (config_check_fields(c, n, path, known, nknown))
            return -1;
        env = config_field(c, n, "env");
        file = config_field(c, n, "file");
        if (!env == !file)
            return config_fail(c, n, path, "give exactly one of env: NAME or file: PATH");
        config_pathf(fpath, sizeof fpath, "%s.%s", path, env ? "env" : "file");
        if (config_scalar(c, env ? env : file, fpath, env ? "a variable name" : "a file path", &s))
            return -1;
        if (env) {
            const char *val = getenv(s);
            if (!val || !*val)
                return config_fail(c, env, fpath, "the environment variable %s is %s",
                                   config_quote(c, s),
                                   val ? "empty" : "not set");
            if (strlen(val) > SECRET_MAX)
                return config_fail(c, env, fpath, "the value of %s is longer than %d bytes",
                                   config_quote(c, s), SECRET_MAX);
            snprintf(buf, SECRET_MAX + 2, "%s", val);
        } else {
            /* A regular file only: a FIFO or a device could block. */
            int fd = open(s, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
            struct stat st;
            if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
                int e = fd < 0 ? errno : 0;
                if (fd >= 0)
                    close(fd);
                return config_fail(c, file, fpath, "cannot read %s: %s", config_quote(c, s),
                                   e ? strerror(e) : "not a regular file");
            }
            ssize_t r = read(fd, buf, SECRET_MAX + 1);
            close(fd);
            size_t got = r > 0 ? (size_t)r : 0;
            buf[got] = '\0';
            buf[strcspn(buf, "\r\n")] = '\0';
            if (got > SECRET_MAX)
                return config_fail(c, file, fpath, "%s is longer than %d bytes", config_quote(c, s),
                                   SECRET_MAX);
            if (!*buf)
                return config_fail(c, file, fpath, "%s is empty", config_quote(c, s));
        }
        if (config_has_control(buf))
            return config_fail(c, n, fpath, "the secret holds a control character");
        char *name = strdup(s);
        if (!name)
            return config_oom(c);
        config_secret_free(src);
        src->kind = env ? CONFIG_SECRET_ENV : CONFIG_SECRET_FILE;
        src->name = name;
    }
    return 0;
}

/* The library's detail "name: why", at the line as path: why. */
static int fail_with_detail(struct config_ctx *c, const yaml_node_t *n, const char *path,
                            const char *name)
{
    const char *why = idem_errdetail();
    size_t nl = strlen(name);
    if (!strncmp(why, name, nl) && !strncmp(why + nl, ": ", 2))
        why += nl + 2;
    return config_fail(c, n, path, "%s", why);
}

int config_check_postgres_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                              const char *url)
{
    /* libpq's reason may quote the URL: only one written in the file,
     * which holds no secret (get_server_url refused any). */
    int in_file = n->type == YAML_SCALAR_NODE;
    return idem__postgres_url_check(url, in_file) == IDEM_OK
               ? 0
               : fail_with_detail(c, n, path, "postgres_url");
}

int config_check_redis_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           const char *url)
{
    struct idem__redis_url u;
    if (idem__redis_url_parse(url, path, &u) == IDEM_OK) {
        idem__redis_url_wipe(&u);
        return 0;
    }
    /* The parser's detail is "PATH: why": the why, at the line. */
    return fail_with_detail(c, n, path, path);
}
