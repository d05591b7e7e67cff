/* SPDX-License-Identifier: Apache-2.0 */
/* Argument validation shared by every public call (core layer). */
#include "check.h"

#include "error.h"

/* The length of the well-formed UTF-8 sequence at p (1..4), or 0: no
 * overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    if (p[0] >= 0xc2 && p[0] <= 0xdf)
        return (p[1] & 0xc0) == 0x80 ? 2 : 0;
    if (p[0] >= 0xe0 && p[0] <= 0xef) {
        unsigned lo = p[0] == 0xe0 ? 0xa0 : 0x80, hi = p[0] == 0xed ? 0x9f : 0xbf;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 ? 3 : 0;
    }
    if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        unsigned lo = p[0] == 0xf0 ? 0x90 : 0x80, hi = p[0] == 0xf4 ? 0x8f : 0xbf;
        return p[1] >= lo && p[1] <= hi && (p[2] & 0xc0) == 0x80 &&
                       (p[3] & 0xc0) == 0x80
                   ? 4
                   : 0;
    }
    return 0;
}

/* Keys are UTF-8 text: every store keeps them as text (PostgreSQL refuses
 * anything else), so every store refuses the same keys. */
idem_rc idem__check_key(const char *s, const char *what, int may_be_empty)
{
    if (!s)
        return idem__fail(IDEM_EINVAL, "%s: NULL", what);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        if (*p < 0x20 || *p == 0x7f)
            return idem__fail(IDEM_EINVAL,
                              "%s: control character 0x%02x at byte %zu", what,
                              *p, n);
        size_t len = utf8_seq(p);
        if (!len)
            return idem__fail(IDEM_EINVAL, "%s: byte %zu (0x%02x) is not valid UTF-8",
                              what, n, *p);
        p += len, n += len;
        if (n > IDEM_KEY_MAX)
            return idem__fail(IDEM_EINVAL, "%s: longer than %d bytes", what,
                              IDEM_KEY_MAX);
    }
    if (n == 0 && !may_be_empty)
        return idem__fail(IDEM_EINVAL, "%s: empty", what);
    return IDEM_OK;
}

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
           c == '-';
}

idem_rc idem__check_name(const char *s, const char *what)
{
    if (!s)
        return idem__fail(IDEM_EINVAL, "%s: NULL", what);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        if (n == IDEM_NAME_MAX)
            return idem__fail(IDEM_EINVAL, "%s: longer than %d bytes", what,
                              IDEM_NAME_MAX);
        if (!name_char(*p))
            return idem__fail(IDEM_EINVAL,
                              "%s: byte 0x%02x at %zu is not one of "
                              "[A-Za-z0-9_.:-]",
                              what, *p, n);
    }
    if (n == 0)
        return idem__fail(IDEM_EINVAL, "%s: empty", what);
    return IDEM_OK;
}

idem_rc idem__check_ms(int64_t ms, int64_t min, int64_t max, const char *what)
{
    if (ms < min || ms > max)
        return idem__fail(IDEM_EINVAL, "%s: %lld ms, must be %lld..%lld", what,
                          (long long)ms, (long long)min, (long long)max);
    return IDEM_OK;
}

idem_rc idem__check_out(const void *p, const char *what)
{
    if (!p)
        return idem__fail(IDEM_EINVAL, "%s: NULL out-parameter", what);
    return IDEM_OK;
}
