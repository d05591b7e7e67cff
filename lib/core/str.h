/* SPDX-License-Identifier: Apache-2.0 */
/* str.h — bounded string copies (core layer). */
#ifndef IDEM_CORE_STR_H
#define IDEM_CORE_STR_H

#include <stddef.h>
#include <string.h>

/* Copy src into dst of cap bytes (cap > 0), cut to fit, always terminated:
 * what snprintf(dst, cap, "%s", src) does, without a format to read. */
static inline void idem__copy(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

#endif
