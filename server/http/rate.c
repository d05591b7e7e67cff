/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rate.c — token buckets by name, in a table of a fixed size (daemon).
 *
 * The table never grows: a name's bucket sits in one set of WAYS slots,
 * found by a hash with a seed of this process's (so that nobody can aim
 * names at one set). A name with no bucket takes its set's slot that was
 * used longest ago; a bucket left alone for burst / rate seconds is full
 * again, as good as none, so dropping it loses nothing. Only names that
 * all came within that time compete for a set, and then one that loses
 * its bucket starts full: a client cycling through more names than the
 * table holds escapes its per-name limit — which is why every limit by
 * subject has one by address beside it, and addresses are few.
 */
#include "http/rate.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "seeded_hash.h"

#define WAYS 4

struct bucket {
    uint64_t hash; /* 0: empty */
    int64_t at_us; /* when tokens was last brought up to date */
    double tokens;
};

struct rate_table {
    pthread_mutex_t mu;
    uint64_t seed;
    size_t mask; /* sets - 1 */
    struct bucket *b;
};

struct rate_table *rate_table_new(size_t slots)
{
    size_t sets = 1;
    while (sets * WAYS < slots)
        sets <<= 1;
    struct rate_table *t = calloc(1, sizeof *t);
    if (!t || !(t->b = calloc(sets * WAYS, sizeof *t->b))) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->mask = sets - 1;
    t->seed = seeded_hash_seed(t);
    return t;
}

void rate_table_free(struct rate_table *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t->b);
    free(t);
}

int64_t rate_take(struct rate_table *t, const char *name, size_t len, double rate, double burst,
                  int64_t now_us)
{
    uint64_t h = seeded_hash(t->seed, name, len);
    int64_t wait_ms = 0;
    pthread_mutex_lock(&t->mu);
    struct bucket *set = &t->b[(h & t->mask) * WAYS], *b = NULL, *oldest = set;
    for (int i = 0; i < WAYS; i++) {
        if (set[i].hash == h) {
            b = &set[i];
            break;
        }
        if (oldest->hash != 0 && (set[i].hash == 0 || set[i].at_us < oldest->at_us))
            oldest = &set[i];
    }
    if (!b) {
        b = oldest;
        b->hash = h;
        b->at_us = now_us;
        b->tokens = burst;
    }
    if (now_us > b->at_us) {
        b->tokens += (double)(now_us - b->at_us) * rate / 1e6;
        if (b->tokens > burst)
            b->tokens = burst;
        b->at_us = now_us;
    }
    if (b->tokens >= 1.0)
        b->tokens -= 1.0;
    else
        wait_ms = (int64_t)((1.0 - b->tokens) * 1000.0 / rate) + 1;
    pthread_mutex_unlock(&t->mu);
    return wait_ms;
}
