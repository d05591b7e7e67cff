/* SPDX-License-Identifier: Apache-2.0 */
/*
 * incidents.h — the process's ring of the last incidents an operator looks
 * for (telemetry): requests refused because another held their key, keys
 * reused with another payload, claims taken over, claims held. The gateway
 * notes them; the admin side reads them (GET /_idem/v1/events).
 */
#ifndef IDEM_SERVER_INCIDENTS_H
#define IDEM_SERVER_INCIDENTS_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "idem.h"

#define INCIDENTS_MAX 256

enum incident_kind {
    INCIDENT_IN_FLIGHT_409, /* a request refused: another holds its key's claim */
    INCIDENT_MISMATCH_422,  /* a key reused with another payload */
    INCIDENT_TAKEOVER,      /* a claim whose lease ran out, taken over to execute */
    INCIDENT_HELD,          /* a claim held (on_unknown_outcome: hold, resolve), with why */
    INCIDENT_TRANSITION_CONFLICT, /* states: an event contradicting its key's state */
};

struct incident {
    int64_t time_ms; /* wall clock */
    enum incident_kind kind;
    char route[65];
    char space[IDEM_NAME_MAX + 1];
    char key[IDEM_KEY_MAX + 1];
    uint64_t epoch; /* the claim's; 0 when unknown */
    char why[128];  /* held: why ("upstream timeout ...", "its lease ran out
                       unfinished", "the resolver gave up: ..."); else "" */
};

/* Note an incident of route rt (NULL: none) on key in the ring of the last
 * INCIDENTS_MAX, the oldest dropped. Any thread; a mutex and a copy, never
 * a store call. */
void incidents_note(enum incident_kind kind, const struct route *rt, const char *key,
                    uint64_t epoch);
/* The same, with why (NULL: none), cut to fit. */
void incidents_note_why(enum incident_kind kind, const struct route *rt, const char *key,
                        uint64_t epoch, const char *why);
/* Why the newest incident of kind on (space, key, epoch) says, into why
 * (cap bytes; "" when none is kept in the ring). Any thread. */
void incidents_why(enum incident_kind kind, const char *space, const char *key, uint64_t epoch,
                   char *why, size_t cap);

/* Copy the newest max incidents (at most INCIDENTS_MAX) into out, newest
 * first; returns how many, and *noted how many were ever noted. Any thread. */
size_t incidents_newest(struct incident *out, size_t max, uint64_t *noted);

/* "in_flight_409", "mismatch_422", "takeover", "held". */
const char *incident_kind_name(enum incident_kind kind);

#endif
