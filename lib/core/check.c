/* Argument validation shared by every public call (core layer). */
#include "check.h"

#include "error.h"

idem_rc idem__check_key(const char *s, const char *what, int may_be_empty)
{
    if (!s)
        return idem__fail(IDEM_EINVAL, "%s: NULL", what);
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++, n++) {
        if (n == IDEM_KEY_MAX)
            return idem__fail(IDEM_EINVAL, "%s: longer than %d bytes", what,
                              IDEM_KEY_MAX);
        if (*p < 0x20 || *p == 0x7f)
            return idem__fail(IDEM_EINVAL,
                              "%s: control character 0x%02x at byte %zu", what,
                              *p, n);
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
