/* SPDX-License-Identifier: Apache-2.0 */
/* The lock watchdog: one thread per handle, started on the first watch. */
#ifndef IDEM_LOCK_WATCHDOG_H
#define IDEM_LOCK_WATCHDOG_H

#include "idem.h"

struct idem__watchdog;

/* Stop the thread and free the watchdog (not the watches). NULL: no-op. */
void idem__watchdog_free(struct idem__watchdog *wd);

#endif
