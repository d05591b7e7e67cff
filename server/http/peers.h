/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.h — what each client address holds at once (daemon): its open
 * connections and its requests in flight on the main listener, counted
 * over every event loop, so that limits.connections_per_peer and
 * in_flight_per_peer bound what one client can take of connections_max
 * and in_flight_max.
 */
#ifndef IDEM_SERVER_PEERS_H
#define IDEM_SERVER_PEERS_H

#include <stddef.h>
#include <stdint.h>

struct peer_table;

/* A table for up to about slots addresses at once. NULL on OOM. */
struct peer_table *peer_table_new(size_t slots);
void peer_table_free(struct peer_table *t);

/* A client address's place in the table, for the life of a connection:
 * 0 when the table has no room for another address (it is then not
 * counted, only held to the daemon-wide limits). */
typedef uint32_t peer_ref;

/* One more connection from host[0..len) (the address without its port):
 * its ref in *ref, and 1 if that is more than max connections from it
 * (counted all the same: peer_conn_done takes it back). Any thread. */
int peer_conn_add(struct peer_table *t, const char *host, size_t len, size_t max,
                  peer_ref *ref);
void peer_conn_done(struct peer_table *t, peer_ref ref);

/* One more request in flight from ref's address: 0, or -1 (not counted)
 * when it has max already. peer_request_done takes a counted one back. */
int peer_request_add(struct peer_table *t, peer_ref ref, size_t max);
void peer_request_done(struct peer_table *t, peer_ref ref);

#endif
