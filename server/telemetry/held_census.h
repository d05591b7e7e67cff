/* SPDX-License-Identifier: Apache-2.0 */
/*
 * held_census.h — how many claims are held now, per key space
 * (held_census.c), for the idem_records_held gauge and the alert that stays
 * firing while any is held.
 *
 * Held claims are the store's, shared by every instance on it: a round
 * lists each holding space's PROCESSING records (asynchronous listings on a
 * loop, never waited for) and counts those held; the metrics read the last
 * round's counts from memory. serve.c starts a round at start and every
 * HELD_CENSUS_EVERY_S seconds.
 */
#ifndef IDEM_SERVER_HELD_CENSUS_H
#define IDEM_SERVER_HELD_CENSUS_H

#include <event2/event.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "idem.h"

struct server_config;

#define HELD_CENSUS_EVERY_S 15
/* Records listed per space and round at most (pages of IDEM_LIST_LIMIT_MAX):
 * a count that reached it says "at least". */
#define HELD_CENSUS_SCAN_MAX 20000

struct held_count {
    char space[IDEM_NAME_MAX + 1];
    uint64_t held;
    int capped; /* the scan stopped at HELD_CENSUS_SCAN_MAX: at least held */
};

/* The last round's counts (struct daemon's held). */
struct held_census {
    pthread_mutex_t mu;
    struct held_count *counts;
    size_t n;
    int64_t at_ms;  /* when that round ended (wall clock); 0: none yet */
    int running;    /* a round is under way (the starting thread's and the loop's) */
    /* A round asked for by a nudge that came too soon: `later` (its owner's,
     * a timer that runs a round) is pending. */
    struct event *later;
    int pending;
    struct held_round *round; /* the one under way, freed by held_census_free if
                            its answer never came (the daemon stopped) */
};

void held_census_init(struct held_census *hc);
/* After idem_close(): no listing answers any more. */
void held_census_free(struct held_census *hc);

/* Start a round on loop (its callbacks run there) unless one is under way:
 * the spaces cfg's routes and consumers hold, listed through h. */
void held_census_run(struct held_census *hc, idem *h, idem_loop *loop,
                     const struct server_config *cfg);
/* A claim was held, or an operator acted, here: a round now, so that the
 * gauge follows at once; or, when one is under way or ended within
 * HELD_CENSUS_NUDGE_MS (a resolve route holds its claim again at each
 * question), one round when that time is up (hc->later), however many
 * nudges came meanwhile. Any thread. */
#define HELD_CENSUS_NUDGE_MS 1000
void held_census_nudge(struct held_census *hc, idem *h, idem_loop *loop,
                       const struct server_config *cfg);

/* A copy of the last round's counts (malloc'd, *n of them; the caller
 * frees), and when it ended; NULL with *n 0 when none or on OOM. */
struct held_count *held_census_read(struct held_census *hc, size_t *n, int64_t *at_ms);

#endif
