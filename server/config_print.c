/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_print.c — the YAML writer the configuration is printed back with
 * (config_print.h): keys and list items at their indent, strings
 * double-quoted with YAML's escapes, durations and sizes exact, secrets as
 * their source. Each section prints its part with these; config.c the top
 * level (config_print()).
 */
#include "config_print.h"

#include <stdarg.h>
#include <string.h>

#include "http/upstream_config.h"
#include "utf8.h"

static void indent_to(struct config_out *o, int indent)
{
    if (o->item) {
        fprintf(o->f, "%*s- ", indent > 2 ? indent - 2 : 0, "");
        o->item = 0;
        return;
    }
    fprintf(o->f, "%*s", indent, "");
}

void config_put_item(struct config_out *o)
{
    o->item = 1;
}

void config_put_key(struct config_out *o, int indent, const char *key)
{
    indent_to(o, indent);
    fprintf(o->f, "%s:\n", key);
}

void config_put_name(struct config_out *o, int indent, const char *key)
{
    indent_to(o, indent);
    fprintf(o->f, "%s: ", key);
}

/* In a double-quoted scalar YAML reads "\x", "\u" and "\N", "\L", "\P" as
 * code points; anything else is written as it is, but what a YAML reader
 * refuses in its input (C0 and C1 controls, U+FFFE, U+FFFF), what it
 * takes for a line break and folds (NEL, U+2028, U+2029) and a BOM, which
 * are escaped. A byte that is not UTF-8 (a --db path, say, which no YAML
 * gave) has no YAML spelling: it is written as the code point of its
 * value, which keeps the output YAML. */
void config_put_quoted(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    fputc('"', f);
    while (p < end) {
        unsigned ch = *p;
        size_t n = ch < 0x80 ? 1 : utf8_seq_len(p, end);
        uint32_t cp = n > 1 ? utf8_decode(p, n) : ch;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch == '\n')
            fputs("\\n", f);
        else if (ch == '\t')
            fputs("\\t", f);
        else if (n == 0 || cp < 0x20 || (cp >= 0x7f && cp <= 0x9f))
            fprintf(f, "\\x%02X", (unsigned)cp);
        else if (cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe || cp == 0xffff)
            fprintf(f, "\\u%04X", (unsigned)cp);
        else
            fwrite(p, 1, n, f);
        p += n ? n : 1;
    }
    fputc('"', f);
}

void config_put_str(struct config_out *o, int indent, const char *key, const char *s)
{
    config_put_name(o, indent, key);
    config_put_quoted(o->f, s);
    fputc('\n', o->f);
}

void config_put_word(struct config_out *o, int indent, const char *key, const char *word)
{
    config_put_name(o, indent, key);
    fprintf(o->f, "%s\n", word);
}

void config_put_bool(struct config_out *o, int indent, const char *key, int v)
{
    config_put_word(o, indent, key, v ? "true" : "false");
}

void config_put_count(struct config_out *o, int indent, const char *key, uint64_t v)
{
    config_put_name(o, indent, key);
    fprintf(o->f, "%llu\n", (unsigned long long)v);
}

void config_put_duration(struct config_out *o, int indent, const char *key, int64_t ms)
{
    char buf[32];
    config_put_word(o, indent, key, config_fmt_duration(ms, buf, sizeof buf));
}

void config_put_size(struct config_out *o, int indent, const char *key, size_t bytes)
{
    char buf[32];
    config_put_word(o, indent, key, config_fmt_size(bytes, buf, sizeof buf));
}

void config_put_list(struct config_out *o, int indent, const char *key, size_t n)
{
    if (n)
        config_put_key(o, indent, key);
    else
        config_put_word(o, indent, key, "[]");
}

void config_put_durations(struct config_out *o, int indent, const char *key, const int64_t *ms,
                          size_t n)
{
    char buf[32];
    config_put_name(o, indent, key);
    fputc('[', o->f);
    for (size_t i = 0; i < n; i++)
        fprintf(o->f, "%s%s", i ? ", " : "", config_fmt_duration(ms[i], buf, sizeof buf));
    fputs("]\n", o->f);
}

void config_put_strings(struct config_out *o, int indent, const char *key, char *const *list,
                        size_t n)
{
    config_put_name(o, indent, key);
    fputc('[', o->f);
    for (size_t i = 0; i < n; i++) {
        fputs(i ? ", " : "", o->f);
        config_put_quoted(o->f, list[i]);
    }
    fputs("]\n", o->f);
}

void config_put_comment(struct config_out *o, int indent, const char *fmt, ...)
{
    va_list ap;
    fprintf(o->f, "%*s# ", indent, "");
    va_start(ap, fmt);
    vfprintf(o->f, fmt, ap);
    va_end(ap);
    fputc('\n', o->f);
}

void config_put_secret(struct config_out *o, int indent, const struct config_secret *src)
{
    config_put_str(o, indent, src->kind == CONFIG_SECRET_FILE ? "file" : "env", src->name);
}

void config_put_url(struct config_out *o, int indent, const char *key, const char *url,
                    const struct config_secret *src)
{
    if (src->kind == CONFIG_SECRET_NONE) {
        config_put_str(o, indent, key, url);
        return;
    }
    config_put_key(o, indent, key);
    config_put_secret(o, indent + 2, src);
}

void config_put_upstream(struct config_out *o, int indent, const char *key,
                         const struct upstream_url *u)
{
    char url[URL_PATH_MAX + 400];
    config_put_str(o, indent, key, config_upstream_text(u, url, sizeof url));
}
