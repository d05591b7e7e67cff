/* SPDX-License-Identifier: Apache-2.0 */
/* Error codes carry a thread-local detail: which argument, which limit, what
 * the store said. */
#ifndef IDEM_CORE_ERROR_H
#define IDEM_CORE_ERROR_H

#include "idem.h"

/* Set the calling thread's detail and return rc, for `return idem__fail(...)`. */
idem_rc idem__fail(idem_rc rc, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clear the detail at the start of a public call. */
void idem__clear_detail(void);

#endif
