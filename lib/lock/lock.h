/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.h — what the lock layer offers the layers that use its checks: the
 * public API layer's asynchronous lock calls (kv_async.c) and the watchdog,
 * so that every way to take or keep a lock refuses the same input.
 */
#ifndef IDEM_LOCK_H
#define IDEM_LOCK_H

#include <stdint.h>

#include "idem.h"

/* The lock calls' checks but the out-parameter's and the TTL's. */
idem_rc idem__lock_check(idem *h, const char *space, const char *key, const char *owner);

/* A lock's TTL: 1 ms .. 1 day. */
idem_rc idem__check_lock_ttl(int64_t ttl_ms);

#endif
