/* SPDX-License-Identifier: Apache-2.0 */
/*
 * template.h — the request template's placeholders: {{key}} (the scenario's
 * business key), {{uuid}} (a fresh random UUID per request) and {{seq}} (a
 * per-request sequence number). Used in the URL's path and query, in header
 * values and in bodies.
 */
#ifndef IDEM_VERIFY_TEMPLATE_H
#define IDEM_VERIFY_TEMPLATE_H

#include <stddef.h>

enum tpl_kind {
    TPL_TEXT,
    TPL_KEY,
    TPL_UUID,
    TPL_SEQ,
};

struct tpl_part {
    enum tpl_kind kind;
    size_t off, len; /* TPL_TEXT: the bytes src[off, off+len) */
};

struct tpl {
    char *src; /* owned copy of the text */
    size_t src_len;
    struct tpl_part *parts;
    size_t nparts;
};

struct tpl_values {
    const char *key;
    const char *uuid;
    unsigned long long seq;
};

/* Parse src[0, len). A placeholder is "{{", a known name (spaces around it
 * allowed), "}}"; any other "{{" is an error: an unknown name, or braces
 * never closed. A lone "}}" is text (JSON objects end so). what names the
 * template in the message ("-d", "header X-Request-Id", "the URL").
 * 0, or -1 with err naming the problem and its byte offset. */
int tpl_parse(struct tpl *t, const char *src, size_t len, const char *what, char *err,
              size_t errlen);

int tpl_uses(const struct tpl *t, enum tpl_kind kind);

/* The text with the values in; malloc()ed and NUL-terminated, *len without
 * the NUL. NULL when out of memory. */
char *tpl_render(const struct tpl *t, const struct tpl_values *v, size_t *len);

void tpl_free(struct tpl *t);

#endif
