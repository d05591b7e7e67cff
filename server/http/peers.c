/* SPDX-License-Identifier: Apache-2.0 */
/*
 * peers.c — what each client address holds at once (daemon).
 *
 * A table of fixed size, open addressing by a seeded hash of the address,
 * probing PROBES slots: an address's slot is found among them or, failing
 * that, the first slot no connection holds any more is taken. A slot
 * keeps its address until it is taken for another, so a probe chain is
 * never cut. With every probed slot held by other addresses (more distinct
 * addresses connected at once than the table is made for, or unlucky
 * ones), the new address goes uncounted (ref 0) and is held to the
 * daemon-wide limits alone; the hash's seed keeps anyone from choosing
 * addresses that collide. One mutex: a connection's start, end, and its
 * requests' start and end each take it once, for a few probes.
 */
#include "http/peers.h"

#include <pthread.h>
#include <stdlib.h>

#include "seeded_hash.h"

#define PROBES 16

struct peer_slot {
    uint64_t hash; /* 0: never used */
    uint32_t conns, in_flight;
};

struct peer_table {
    pthread_mutex_t mu;
    uint64_t seed;
    size_t mask;
    struct peer_slot *s; /* s[0] unused: ref 0 is "not counted" */
};

struct peer_table *peer_table_new(size_t slots)
{
    size_t n = 64;
    while (n < slots)
        n <<= 1;
    struct peer_table *t = calloc(1, sizeof *t);
    if (!t || !(t->s = calloc(n + 1, sizeof *t->s))) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->mask = n - 1;
    t->seed = seeded_hash_seed(t);
    return t;
}

void peer_table_free(struct peer_table *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->s);
    free(t);
}

int peer_conn_add(struct peer_table *t, const char *host, size_t len, size_t max,
                  peer_ref *ref)
{
    uint64_t h = seeded_hash(t->seed, host, len);
    size_t free_at = 0, at = 0;
    int over = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < PROBES && !at; i++) {
        size_t k = 1 + ((h + i) & t->mask);
        struct peer_slot *p = &t->s[k];
        if (p->hash == h)
            at = k;
        else if (!free_at && p->conns == 0 && p->in_flight == 0)
            free_at = k;
    }
    if (!at && free_at) {
        at = free_at;
        t->s[at].hash = h;
    }
    if (at)
        over = ++t->s[at].conns > max;
    pthread_mutex_unlock(&t->mu);
    *ref = (peer_ref)at;
    return over;
}

void peer_conn_done(struct peer_table *t, peer_ref ref)
{
    if (!ref)
        return;
    pthread_mutex_lock(&t->mu);
    t->s[ref].conns--;
    pthread_mutex_unlock(&t->mu);
}

int peer_request_add(struct peer_table *t, peer_ref ref, size_t max)
{
    int rc = 0;
    if (!ref)
        return 0;
    pthread_mutex_lock(&t->mu);
    if (t->s[ref].in_flight >= max)
        rc = -1;
    else
        t->s[ref].in_flight++;
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void peer_request_done(struct peer_table *t, peer_ref ref)
{
    if (!ref)
        return;
    pthread_mutex_lock(&t->mu);
    t->s[ref].in_flight--;
    pthread_mutex_unlock(&t->mu);
}
