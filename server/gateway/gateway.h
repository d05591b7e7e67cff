/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gateway.h — the three layers in front of an upstream (gateway.c): a
 * request on a route walks the gateway's state machine on its loop; a
 * request on no route is proxied untouched. What the gateway shares across
 * loops (the claims held here, how often its read for finished records
 * pays off) is its own, behind struct gateway.
 */
#ifndef IDEM_SERVER_GATEWAY_H
#define IDEM_SERVER_GATEWAY_H

#include "config.h"
#include "daemon.h"
#include "http/front.h"

struct gateway;

/* The gateway's shared state, for one daemon. NULL for want of memory. */
struct gateway *gateway_new(void);
/* After every request is answered. NULL: a no-op. */
void gateway_free(struct gateway *gw);

/* The claims held here whose answer the store failed to keep, being
 * written again (see "claims held here" in gateway.c). Any thread. */
unsigned long gateway_unkept(struct gateway *gw);

/* A request on route rt; takes over the reference lc. Loop thread. */
void gateway_start(struct daemon *d, struct live_config *lc, const struct route *rt,
                   struct front_request *req);
/* The resolver's look at a claim of route rt (on_unknown_outcome: resolve)
 * whose lease ran out: req is an injected request of its own (resolver.c);
 * takes over lc. The claim is taken over and the service asked (see
 * "resolving" in gateway.c); anything else found is left as it is. */
void gateway_resolve(struct daemon *d, struct live_config *lc, const struct route *rt,
                     struct front_request *req, const char *key);
/* A request on no route: proxied untouched. Loop thread. */
void passthrough_start(struct daemon *d, const struct server_config *cfg,
                       struct front_request *req);

#endif
