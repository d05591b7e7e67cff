/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resolve_config.h — a route's resolve: section, for on_unknown_outcome:
 * resolve: where to ask the service whether a request whose outcome is
 * unknown executed, when, and which answers mean yes and no. The gateway
 * asks (gateway.c, "resolving"); resolver.c finds the claims to ask about.
 */
#ifndef IDEM_SERVER_GATEWAY_RESOLVE_CONFIG_H
#define IDEM_SERVER_GATEWAY_RESOLVE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "config_value.h"
#include "gateway/status_set.h"
#include "http/upstream_config.h"

#define RESOLVE_BACKOFFS_MAX 16

struct route_resolve {
    /* The status query's URL: GET, its path a template in which {key} and
     * {space} stand for the record's key and space, percent-escaped. */
    struct upstream_url url;
    int64_t after_ms;                        /* the first question, after the 504 */
    int64_t backoff_ms[RESOLVE_BACKOFFS_MAX]; /* then; the last repeats */
    size_t backoff_count;
    int64_t give_up_ms;                      /* then held for an operator, as hold */
    uint64_t executed[STATUS_SET_WORDS];     /* answers meaning "it executed" */
    uint64_t not_executed[STATUS_SET_WORDS]; /* answers meaning "it did not" */
};

/* resolve: { url, after, backoff, give_up, executed, not_executed } in n,
 * into *out (malloc'd; route_resolve_free). 0, or -1 having said why. */
int config_get_resolve(struct config_ctx *c, const yaml_node_t *n, const char *path,
                       struct route_resolve **out);
void route_resolve_free(struct route_resolve *r);
/* resolve: as config_get_resolve reads it back, at indent. */
struct config_out;
void config_print_resolve(struct config_out *o, int indent, const struct route_resolve *r);

/* The status query's target for (space, key): the URL's path with {key}
 * and {space} replaced, percent-escaped, into out (cap bytes). 0, or -1
 * when it does not fit. */
int resolve_target(const struct route_resolve *r, const char *space, const char *key, char *out,
                   size_t cap);

/* The wait before question n (0: the first, after the 504). */
int64_t resolve_wait_ms(const struct route_resolve *r, unsigned n);

#endif
