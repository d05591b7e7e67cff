/* SPDX-License-Identifier: Apache-2.0 */
/* The intrusive hash table behind the in-memory store (core layer). */
#include "htab.h"

#include "alloc.h"

uint64_t idem__hash2(const char *a, const char *b)
{
    /* FNV-1a, then a final mix so that the low bits used for buckets and
     * shards depend on every input byte. */
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)a; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    h = (h ^ 0) * 0x100000001b3ULL;
    for (const unsigned char *p = (const unsigned char *)b; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

int idem__htab_init(struct idem__htab *t, size_t buckets)
{
    size_t n = 8;
    while (n < buckets)
        n <<= 1;
    t->buckets = idem__calloc(n, sizeof *t->buckets);
    t->mask = n - 1;
    t->count = 0;
    return t->buckets ? 0 : -1;
}

void idem__htab_free(struct idem__htab *t)
{
    idem__free(t->buckets);
    t->buckets = NULL;
}

struct idem__hnode **idem__htab_find(struct idem__htab *t, uint64_t hash,
                                     int (*eq)(const struct idem__hnode *,
                                               const void *),
                                     const void *arg)
{
    struct idem__hnode **link = &t->buckets[hash & t->mask];
    for (; *link; link = &(*link)->next)
        if ((*link)->hash == hash && eq(*link, arg))
            break;
    return link;
}

static void grow(struct idem__htab *t)
{
    size_t n = (t->mask + 1) * 2;
    struct idem__hnode **b = idem__calloc(n, sizeof *b);
    if (!b)
        return; /* keep the old array: slower, still correct */
    for (size_t i = 0; i <= t->mask; i++) {
        struct idem__hnode *e = t->buckets[i], *next;
        for (; e; e = next) {
            next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
        }
    }
    idem__free(t->buckets);
    t->buckets = b;
    t->mask = n - 1;
}

void idem__htab_insert(struct idem__htab *t, struct idem__hnode *n)
{
    if (t->count >= t->mask + 1)
        grow(t);
    struct idem__hnode **b = &t->buckets[n->hash & t->mask];
    n->next = *b;
    *b = n;
    t->count++;
}

void idem__htab_unlink(struct idem__htab *t, struct idem__hnode **link)
{
    *link = (*link)->next;
    t->count--;
}
