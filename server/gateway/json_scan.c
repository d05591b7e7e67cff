/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json_scan.c — one field of a JSON request body, without building a tree
 * (daemon). See json_scan.h for what it answers and when it leaves the body
 * to the full parse.
 *
 * A recursive descent over RFC 8259, taking no value apart except the one
 * at the path. Each object's member names are kept (pointers into the body)
 * to refuse a name given twice, as the full parse does. Every byte it does
 * not understand ends the scan with UNSURE rather than a guess: being wrong
 * here would key a request differently from the full parse, which is what
 * an upstream reading the body would follow.
 */
#include "gateway/json_scan.h"

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "put.h"
#include "utf8.h"

#define DEPTH_MAX 16
#define MEMBERS_MAX 64
#define PARTS_MAX 16
#define PATH_MAX_LEN 256
#define INT_DIGITS_MAX 18   /* below LLONG_MAX: never out of range */
#define NUMBER_MAX 300      /* a real this long without an exponent never overflows */

enum kind { K_NONE, K_NULL, K_STRING, K_INT, K_OTHER };

struct scan {
    const char *p, *end;
    const char *part[PARTS_MAX];
    size_t part_len[PARTS_MAX];
    int parts;
    enum kind kind; /* what was found at the path */
    const char *val;
    size_t val_len;
};

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

/* A string at s->p (its opening quote): its bytes, without the quotes. 0
 * if unsure (an escape, a control character, invalid UTF-8, no end). */
static int string(struct scan *s, const char **start, size_t *len)
{
    const unsigned char *p = (const unsigned char *)s->p + 1, *end = (const unsigned char *)s->end;
    *start = (const char *)p;
    while (p < end) {
        unsigned c = *p;
        if (c == '"') {
            *len = (size_t)((const char *)p - *start);
            s->p = (const char *)p + 1;
            return 1;
        }
        if (c == '\\' || c < 0x20)
            return 0;
        if (c < 0x80) {
            p++;
            continue;
        }
        size_t n = utf8_seq_len(p, end);
        if (!n)
            return 0;
        p += n;
    }
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* A number at s->p: its kind (K_INT or K_OTHER for a real), K_NONE if
 * unsure. The grammar is RFC 8259's: no leading zero, no '+', digits on
 * both sides of a '.'. */
static enum kind number(struct scan *s)
{
    const char *p = s->p, *end = s->end, *start = p;
    if (p < end && *p == '-')
        p++;
    if (p >= end || !is_digit(*p))
        return K_NONE;
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p))
            return K_NONE; /* a leading zero */
    } else {
        while (p < end && is_digit(*p))
            p++;
    }
    enum kind k = K_INT;
    size_t int_digits = (size_t)(p - start) - (*start == '-');
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return K_NONE;
        while (p < end && is_digit(*p))
            p++;
        k = K_OTHER;
    }
    if (p < end && (*p == 'e' || *p == 'E'))
        return K_NONE; /* left to the full parse, which judges overflow */
    if ((k == K_INT && int_digits > INT_DIGITS_MAX) || (size_t)(p - start) > NUMBER_MAX)
        return K_NONE;
    s->p = p;
    return k;
}

static int literal(struct scan *s, const char *word, size_t n)
{
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return 0;
    s->p += n;
    /* "truex" is one invalid word to the full parse, not true and x. */
    return s->p == s->end || !((*s->p >= 'a' && *s->p <= 'z') || (*s->p >= 'A' && *s->p <= 'Z'));
}

static int value(struct scan *s, int depth, int matched);

/* After a member or an element: 1 if a ',' leads to another, 0 if close
 * ends the container, -1 if neither follows. */
static int after_item(struct scan *s, char close)
{
    skip_ws(s);
    if (s->p < s->end && *s->p == ',') {
        s->p++;
        skip_ws(s);
        return 1;
    }
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 0;
    }
    return -1;
}

/* Past a container's opening bracket at s->p: 1 if close follows at once
 * (the container is empty, and read), 0 if its first item does. */
static int opened_empty(struct scan *s, char close)
{
    s->p++;
    skip_ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        return 1;
    }
    return 0;
}

/* An object at s->p. matched: how many parts of the path lead here along
 * objects, or -1 off the path. */
static int object(struct scan *s, int depth, int matched)
{
    const char *name[MEMBERS_MAX];
    size_t name_len[MEMBERS_MAX];
    int members = 0;
    if (opened_empty(s, '}'))
        return 1;
    for (;;) {
        if (s->p >= s->end || *s->p != '"' || members == MEMBERS_MAX)
            return 0;
        const char *n;
        size_t len;
        if (!string(s, &n, &len))
            return 0;
        for (int i = 0; i < members; i++)
            if (name_len[i] == len && memcmp(name[i], n, len) == 0)
                return 0; /* named twice: the full parse says so */
        name[members] = n;
        name_len[members++] = len;
        skip_ws(s);
        if (s->p >= s->end || *s->p != ':')
            return 0;
        s->p++;
        skip_ws(s);
        int on_path = matched >= 0 && matched < s->parts && s->part_len[matched] == len;
        if (on_path && memcmp(s->part[matched], n, len) != 0 &&
            strncasecmp(s->part[matched], n, len) == 0)
            return 0; /* the name in another case: the full parse says so */
        int next = on_path && memcmp(s->part[matched], n, len) == 0 ? matched + 1 : -1;
        if (!value(s, depth + 1, next))
            return 0;
        int more = after_item(s, '}');
        if (more <= 0)
            return more == 0;
    }
}

static int array(struct scan *s, int depth)
{
    if (opened_empty(s, ']'))
        return 1;
    for (;;) {
        if (!value(s, depth + 1, -1))
            return 0;
        int more = after_item(s, ']');
        if (more <= 0)
            return more == 0;
    }
}

/* A value at s->p (no blank before it); the one at the path is noted. */
static int value(struct scan *s, int depth, int matched)
{
    if (depth > DEPTH_MAX || s->p >= s->end)
        return 0;
    int here = matched == s->parts;
    const char *start = s->p;
    enum kind k;
    switch (*s->p) {
    case '{':
        if (!object(s, depth, matched))
            return 0;
        k = K_OTHER;
        break;
    case '[':
        if (!array(s, depth))
            return 0;
        k = K_OTHER;
        break;
    case '"': {
        const char *str;
        size_t len;
        if (!string(s, &str, &len))
            return 0;
        if (here) {
            s->kind = K_STRING;
            s->val = str;
            s->val_len = len;
        }
        return 1;
    }
    case 't':
        if (!literal(s, "true", 4))
            return 0;
        k = K_OTHER;
        break;
    case 'f':
        if (!literal(s, "false", 5))
            return 0;
        k = K_OTHER;
        break;
    case 'n':
        if (!literal(s, "null", 4))
            return 0;
        k = K_NULL;
        break;
    default:
        if ((k = number(s)) == K_NONE)
            return 0;
        break;
    }
    if (here) {
        s->kind = k;
        s->val = start;
        s->val_len = (size_t)(s->p - start);
    }
    return 1;
}

/* The path's names, split at dots as the full parse's lookup splits them. */
static int split_path(struct scan *s, const char *path)
{
    size_t n = strlen(path);
    if (n >= PATH_MAX_LEN)
        return 0;
    for (const char *p = path; *p;) {
        while (*p == '.')
            p++;
        if (!*p)
            break;
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (s->parts == PARTS_MAX)
            return 0;
        s->part[s->parts] = p;
        s->part_len[s->parts++] = len;
        p += len;
    }
    return s->parts > 0;
}

enum json_scan json_scan_field(const char *body, size_t len, const char *path, char *out,
                               size_t cap)
{
    struct scan s = {.p = body, .end = body + len, .kind = K_NONE};
    if (!split_path(&s, path))
        return JSON_SCAN_UNSURE;
    skip_ws(&s);
    if (s.p >= s.end || *s.p != '{' || !value(&s, 1, 0))
        return JSON_SCAN_UNSURE;
    skip_ws(&s);
    if (s.p != s.end)
        return JSON_SCAN_UNSURE; /* something after the object */
    switch (s.kind) {
    case K_NONE:
    case K_NULL:
        return JSON_SCAN_MISSING;
    case K_STRING:
        if (s.val_len >= cap)
            return JSON_SCAN_UNUSABLE;
        memcpy(out, s.val, s.val_len);
        out[s.val_len] = '\0';
        return JSON_SCAN_FOUND;
    case K_INT: {
        if (cap < 21)
            return JSON_SCAN_UNSURE;
        /* As the full parse writes it: "-0" is 0. */
        const char *p = s.val;
        int neg = *p == '-';
        uint64_t v = 0;
        for (p += neg; p < s.val + s.val_len; p++)
            v = v * 10 + (uint64_t)(*p - '0');
        char *o = out;
        if (neg && v)
            *o++ = '-';
        *put_uint(o, v) = '\0';
        return JSON_SCAN_FOUND;
    }
    case K_OTHER:
        break;
    }
    return JSON_SCAN_UNUSABLE;
}
