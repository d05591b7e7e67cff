/* SPDX-License-Identifier: Apache-2.0 */
/*
 * template.c — parse a request template into text and placeholders once, at
 * start-up (so a bad template is a usage error before anything is sent), and
 * render it for each request.
 */
#include "template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    enum tpl_kind kind;
} names[] = {
    {"key", TPL_KEY},
    {"uuid", TPL_UUID},
    {"seq", TPL_SEQ},
};

static int add_part(struct tpl *t, enum tpl_kind kind, size_t off, size_t len, size_t *cap)
{
    if (kind == TPL_TEXT && len == 0)
        return 0;
    if (t->nparts == *cap) {
        size_t ncap = *cap ? *cap * 2 : 8;
        struct tpl_part *p = realloc(t->parts, ncap * sizeof *p);
        if (!p)
            return -1;
        t->parts = p;
        *cap = ncap;
    }
    t->parts[t->nparts++] = (struct tpl_part){kind, off, len};
    return 0;
}

int tpl_parse(struct tpl *t, const char *src, size_t len, const char *what, char *err,
              size_t errlen)
{
    size_t cap = 0, text_start = 0, i = 0;
    memset(t, 0, sizeof *t);
    if (!(t->src = malloc(len + 1)))
        goto oom;
    memcpy(t->src, src, len);
    t->src[len] = '\0';
    t->src_len = len;
    while (i + 1 < len) {
        if (src[i] != '{' || src[i + 1] != '{') {
            i++;
            continue;
        }
        const char *close = NULL;
        for (size_t j = i + 2; j + 1 < len; j++)
            if (src[j] == '}' && src[j + 1] == '}') {
                close = src + j;
                break;
            }
        if (!close) {
            snprintf(err, errlen, "%s: the {{ at byte %zu is never closed with }} "
                     "(placeholders are {{key}}, {{uuid}}, {{seq}})", what, i);
            goto fail;
        }
        const char *n = src + i + 2, *nend = close;
        while (n < nend && *n == ' ')
            n++;
        while (nend > n && nend[-1] == ' ')
            nend--;
        size_t nlen = (size_t)(nend - n);
        enum tpl_kind kind = TPL_TEXT;
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
            if (strlen(names[k].name) == nlen && memcmp(names[k].name, n, nlen) == 0)
                kind = names[k].kind;
        if (kind == TPL_TEXT) {
            size_t shown = (size_t)(close - src) + 2 - i;
            snprintf(err, errlen,
                     "%s: unknown placeholder %.*s%s at byte %zu (known: {{key}}, {{uuid}}, "
                     "{{seq}})", what, (int)(shown > 40 ? 40 : shown), src + i,
                     shown > 40 ? "..." : "", i);
            goto fail;
        }
        if (add_part(t, TPL_TEXT, text_start, i - text_start, &cap) != 0 ||
            add_part(t, kind, 0, 0, &cap) != 0)
            goto oom;
        i = (size_t)(close - src) + 2;
        text_start = i;
    }
    if (add_part(t, TPL_TEXT, text_start, len - text_start, &cap) != 0)
        goto oom;
    return 0;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    tpl_free(t);
    return -1;
}

int tpl_uses(const struct tpl *t, enum tpl_kind kind)
{
    for (size_t i = 0; i < t->nparts; i++)
        if (t->parts[i].kind == kind)
            return 1;
    return 0;
}

char *tpl_render(const struct tpl *t, const struct tpl_values *v, size_t *len)
{
    char seq[24];
    snprintf(seq, sizeof seq, "%llu", v->seq);
    const char *key = v->key ? v->key : "", *uuid = v->uuid ? v->uuid : "";
    size_t n = 0;
    for (size_t i = 0; i < t->nparts; i++) {
        const struct tpl_part *p = &t->parts[i];
        n += p->kind == TPL_TEXT ? p->len
             : p->kind == TPL_KEY ? strlen(key)
             : p->kind == TPL_UUID ? strlen(uuid)
                                   : strlen(seq);
    }
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < t->nparts; i++) {
        const struct tpl_part *p = &t->parts[i];
        const char *s = p->kind == TPL_TEXT ? t->src + p->off
                        : p->kind == TPL_KEY ? key
                        : p->kind == TPL_UUID ? uuid
                                              : seq;
        size_t l = p->kind == TPL_TEXT ? p->len : strlen(s);
        memcpy(o, s, l);
        o += l;
    }
    *o = '\0';
    if (len)
        *len = n;
    return out;
}

void tpl_free(struct tpl *t)
{
    free(t->src);
    free(t->parts);
    memset(t, 0, sizeof *t);
}
