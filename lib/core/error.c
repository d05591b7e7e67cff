/* SPDX-License-Identifier: Apache-2.0 */
/* The error table's texts and the per-thread detail behind idem_errdetail()
 * (core layer). */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char detail[256];

IDEM_EXTERN const char *idem_strerror(idem_rc rc)
{
    switch (rc) {
#define XX(code, name, text) \
    case IDEM_##name:        \
        return text;
        IDEM_ERRNO_MAP(XX)
#undef XX
    }
    return "unknown error";
}

IDEM_EXTERN const char *idem_errname(idem_rc rc)
{
    switch (rc) {
#define XX(code, name, text) \
    case IDEM_##name:        \
        return #name;
        IDEM_ERRNO_MAP(XX)
#undef XX
    }
    return "UNKNOWN";
}

IDEM_EXTERN const char *idem_errdetail(void)
{
    return detail;
}

IDEM_EXTERN const char *idem_outcome_name(idem_outcome o)
{
    static const char *const names[] = {
#define XX(name, text) text,
        IDEM_OUTCOME_MAP(XX)
#undef XX
    };
    if ((unsigned)o >= sizeof names / sizeof names[0])
        return "?";
    return names[o];
}

idem_rc idem__fail(idem_rc rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return rc;
}

void idem__clear_detail(void)
{
    detail[0] = '\0';
}
