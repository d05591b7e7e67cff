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
#include "peers.h"

#include <openssl/rand.h>
#include <pthread.h>
#include <stdlib.h>

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
    if (RAND_bytes((unsigned char *)&t->seed, sizeof t->seed) != 1)
        t->seed = (uint64_t)(uintptr_t)t * 0x9e3779b97f4a7c15u;
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

static uint64_t hash(uint64_t seed, const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325u ^ seed;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9u;
    h ^= h >> 29;
    return h ? h : 1;
}

int peer_conn_add(struct peer_table *t, const char *host, size_t len, size_t max,
                  peer_ref *ref)
{
    uint64_t h = hash(t->seed, host, len);
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
