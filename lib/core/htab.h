/* SPDX-License-Identifier: Apache-2.0 */
/* An intrusive chained hash table. Entries embed a struct idem__hnode; the
 * table never allocates entries, only its bucket array, and a failed grow
 * leaves it working at a higher load. Not thread-safe: its owner locks. */
#ifndef IDEM_CORE_HTAB_H
#define IDEM_CORE_HTAB_H

#include <stddef.h>
#include <stdint.h>

struct idem__hnode {
    struct idem__hnode *next;
    uint64_t hash;
};

struct idem__htab {
    struct idem__hnode **buckets;
    size_t mask; /* bucket count - 1; a power of two minus one */
    size_t count;
};

/* 64-bit hash of two strings taken as one ("a" "\0" "b"). */
uint64_t idem__hash2(const char *a, const char *b);

/* 0, or -1 when the bucket array cannot be allocated. */
int idem__htab_init(struct idem__htab *t, size_t buckets);
void idem__htab_free(struct idem__htab *t);

/* The link that points at the first node with this hash for which
 * eq(node, arg) is true, or at the NULL ending the chain when none does;
 * pass it to idem__htab_unlink() to remove that node. */
struct idem__hnode **idem__htab_find(struct idem__htab *t, uint64_t hash,
                                     int (*eq)(const struct idem__hnode *,
                                               const void *),
                                     const void *arg);

void idem__htab_insert(struct idem__htab *t, struct idem__hnode *n);
void idem__htab_unlink(struct idem__htab *t, struct idem__hnode **link);

#endif
