/* SPDX-License-Identifier: Apache-2.0 */
/* Validation of everything a caller passes in. Input is answered, never
 * asserted: each check returns IDEM_EINVAL with a detail naming the argument
 * and the rule it broke. */
#ifndef IDEM_CORE_CHECK_H
#define IDEM_CORE_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "idem.h"

/* A business key, subject, owner or message id: 1..IDEM_KEY_MAX bytes
 * (0..IDEM_KEY_MAX when may_be_empty), no control characters. */
idem_rc idem__check_key(const char *s, const char *what, int may_be_empty);

/* A key space, scene, group or state: 1..IDEM_NAME_MAX of [A-Za-z0-9_.:-]. */
idem_rc idem__check_name(const char *s, const char *what);

/* A duration in min..max milliseconds. */
idem_rc idem__check_ms(int64_t ms, int64_t min, int64_t max, const char *what);

/* A non-NULL out-parameter. */
idem_rc idem__check_out(const void *p, const char *what);

#define IDEM_DAY_MS (24LL * 3600 * 1000)

#endif
