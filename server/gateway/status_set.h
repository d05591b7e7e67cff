/* SPDX-License-Identifier: Apache-2.0 */
/*
 * status_set.h — a set of HTTP statuses 100..599 (status_set.c), as a
 * route's store_statuses and a resolver's executed and not_executed list
 * them: classes (2xx) and statuses (422).
 */
#ifndef IDEM_SERVER_STATUS_SET_H
#define IDEM_SERVER_STATUS_SET_H

#include <stdint.h>

#include "config_value.h"

/* A set of statuses 100..599, bit (status - 100). */
#define STATUS_SET_WORDS ((500 + 63) / 64)

static inline int status_set_has(const uint64_t *set, int status)
{
    return status >= 100 && status <= 599 && (set[(status - 100) / 64] >> ((status - 100) % 64) & 1);
}

static inline void status_set_add(uint64_t *set, int status)
{
    set[(status - 100) / 64] |= UINT64_C(1) << ((status - 100) % 64);
}

/* The list at n (path names it) into set: classes and statuses, none twice,
 * at most LIST_MAX. 0, or -1 with the error in c. */
int config_get_status_set(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          uint64_t set[STATUS_SET_WORDS]);
/* key: [2xx, 404] as config_get_status_set reads it back: a whole class as
 * its class, the rest status by status; null for an empty set. */
struct config_out;
void config_put_status_set(struct config_out *o, int indent, const char *key,
                           const uint64_t set[STATUS_SET_WORDS]);

#endif
