/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resolver.h — the claims of on_unknown_outcome: resolve routes that no
 * retry comes back for: every second, on one loop, the store is asked for
 * each such route's claims whose hold has ended, and each is handed to the
 * gateway to take over and ask the service about (gateway_resolve). What
 * is pending lives in the records, so a restarted daemon, or another
 * instance on the distributed store, asks about what a dead one left.
 */
#ifndef IDEM_SERVER_GATEWAY_RESOLVER_H
#define IDEM_SERVER_GATEWAY_RESOLVER_H

#include "daemon.h"
#include "http/front.h"

struct resolver;

/* Looks every second on loop (its base and Idem loop), injecting its
 * requests into front. NULL for want of memory. Loop thread. */
struct resolver *resolver_new(struct daemon *d, struct daemon_loop *loop, struct front *front);
/* No more looks (a stop); what is under way ends on its own. Loop thread. */
void resolver_stop(struct resolver *r);
/* After the loop has stopped and its calls were settled. NULL: a no-op. */
void resolver_free(struct resolver *r);

#endif
