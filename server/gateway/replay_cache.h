/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_cache.h — finished answers kept in memory, for duplicates that
 * arrive soon after (daemon). One cache per event loop: no locking.
 */
#ifndef IDEM_SERVER_REPLAY_CACHE_H
#define IDEM_SERVER_REPLAY_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "idem.h"

#define REPLAY_CACHE_TTL_MS 1000     /* an entry is used for this long */
#define REPLAY_CACHE_ENTRY_MAX 16384 /* larger answers (stored form) are not kept */

struct replay_cache;

/* A cache of at most max_bytes (keys and answers); 0: none (NULL). */
struct replay_cache *replay_cache_new(size_t max_bytes);
void replay_cache_free(struct replay_cache *c);

/* What is kept of one answer: the record's stored form, and the replay as
 * it goes on the wire to a kept-alive connection — empty until the first
 * duplicate builds it (most answers are never asked for again). */
struct replay_kept {
    const void *stored;
    size_t stored_len;
    int64_t expires_ms; /* the record's, as put (Idempotency-Key-Expires) */
    const void *wire;
    size_t wire_len;
    void *entry; /* get: where replay_cache_add_wire() puts the wire form */
};

/* The answer kept for (space, key) if it is here, younger than
 * REPLAY_CACHE_TTL_MS at now_ms, put at generation gen, and stored for the
 * same payload (fp NULL, or the entry without one, matches any): 1 and *out
 * filled, else 0. The bytes stay valid until the next call on this cache
 * other than replay_cache_add_wire(). */
int replay_cache_get(struct replay_cache *c, const char *space, const char *key,
                     const uint8_t *fp, int64_t now_ms, unsigned long gen,
                     struct replay_kept *out);

/* Keep the wire form of the answer *kept (just returned by get, with none)
 * beside it (copied); kept->wire then points at the copy. It may evict
 * other entries (never this one); nothing happens when it cannot fit or
 * there is no memory for it. */
void replay_cache_add_wire(struct replay_cache *c, struct replay_kept *kept, const void *wire,
                           size_t len);

/* The bytes the cache holds now (entries, keys and answers). */
size_t replay_cache_bytes(const struct replay_cache *c);

/* Forget everything kept so far (the store's records changed state behind
 * the cache: a transition). */
void replay_cache_clear(struct replay_cache *c);

/* Keep the stored answer of a finished record (its bytes are copied), and
 * when the record expires (wall-clock ms, 0: not known). Only an answer
 * that is durable and final may be put: the cache answers from it without
 * asking the store. gen: the generation seen before the record was read, so
 * that an answer read before a transition is never served after it. */
void replay_cache_put(struct replay_cache *c, const char *space, const char *key,
                      const uint8_t *fp, const void *stored, size_t stored_len,
                      int64_t expires_ms, int64_t now_ms, unsigned long gen);

#endif
