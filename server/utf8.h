/* SPDX-License-Identifier: Apache-2.0 */
/*
 * utf8.h — one UTF-8 sequence checked (daemon): what the JSON body scan and
 * the problem details both need to know, by the rules jansson applies.
 */
#ifndef IDEM_SERVER_UTF8_H
#define IDEM_SERVER_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The length of the sequence at p (p < end, *p >= 0x80), or 0 if it is not
 * well-formed UTF-8: a stray continuation byte, an overlong form, a
 * surrogate, past U+10FFFF, or cut short by end. */
static inline size_t utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    size_t n;
    uint32_t v;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2, v = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        n = 3, v = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        n = 4, v = c & 0x07;
    else
        return 0; /* a continuation byte, an overlong 0xc0/0xc1, or past U+10FFFF */
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (p[i] & 0x3f);
    }
    if (v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff) || (n == 3 && v < 0x800) ||
        (n == 4 && v < 0x10000))
        return 0;
    return n;
}

/* The code point of the well-formed sequence of n bytes at p (n from
 * utf8_seq_len). */
static inline uint32_t utf8_decode(const unsigned char *p, size_t n)
{
    uint32_t v = n == 2 ? p[0] & 0x1fu : n == 3 ? p[0] & 0x0fu : p[0] & 0x07u;
    for (size_t i = 1; i < n; i++)
        v = v << 6 | (p[i] & 0x3fu);
    return v;
}

#endif
