/*
 * records_admin.h — what an operator sees of records and does to them, on
 * the admin listener (daemon): listings, the claims in flight and held,
 * recent conflicts and takeovers, and the actions that resolve a claim.
 */
#ifndef IDEM_SERVER_RECORDS_ADMIN_H
#define IDEM_SERVER_RECORDS_ADMIN_H

#include <stdint.h>

#include "config.h"
#include "daemon.h"

enum event_kind {
    EV_IN_FLIGHT_409, /* a request refused: another holds its key's claim */
    EV_MISMATCH_422,  /* a key reused with another payload */
    EV_TAKEOVER,      /* a claim whose lease ran out, taken over to execute */
    EV_HELD,          /* a claim held for an operator (on_unknown_outcome: hold) */
};

/* Note an event of route rt on key (epoch: the claim's, 0 when unknown) in
 * the process's ring of the last EVENTS_MAX, the oldest dropped. Any
 * thread; a mutex and a copy, never a store call. */
void events_note(enum event_kind kind, const struct route *rt, const char *key, uint64_t epoch);

/* The endpoints of this file, for a request of the admin listener whose
 * path is PREFIX/rest: 1 with req->resp set when rest is one of them, 0
 * to leave it to the rest of the JSON API. On a worker thread. */
int records_admin_handle(struct daemon *d, const struct server_config *cfg,
                         struct front_request *req, const char *rest);

#endif
