/* SPDX-License-Identifier: Apache-2.0 */
/*
 * put.h — writing a message's bytes into a buffer already sized for them
 * (daemon). The hot paths build every head this way: no format string to
 * interpret for each header of each request.
 */
#ifndef IDEM_SERVER_PUT_H
#define IDEM_SERVER_PUT_H

#include <stdint.h>
#include <string.h>

/* The n bytes of s at p; returns the end. */
static inline char *put(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

static inline char *put_str(char *p, const char *s)
{
    return put(p, s, strlen(s));
}

/* v in decimal (at most 20 digits) at p; returns the end. */
static inline char *put_uint(char *p, uint64_t v)
{
    char digits[20];
    size_t n = 0;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    while (n)
        *p++ = digits[--n];
    return p;
}

/* "name: value\r\n" (eol "\r\n") or "name: value\n" at p; returns the end. */
static inline char *put_field(char *p, const char *name, const char *value, const char *eol)
{
    p = put_str(p, name);
    p = put(p, ": ", 2);
    p = put_str(p, value);
    return put_str(p, eol);
}

#endif
