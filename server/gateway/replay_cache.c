/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay_cache.c — finished answers kept in memory, for duplicates that
 * arrive soon after (daemon).
 *
 * Duplicates come in bursts: a client's retries, a double click, an MQ
 * redelivery, a storm. Each one is answered from the record's stored answer,
 * which costs a read of the store (on the embedded store, a SQLite read
 * transaction whose page cache is cold whenever the writer committed since;
 * on the distributed store, a PostgreSQL round trip). Here the answers of
 * records that just finished are kept for REPLAY_CACHE_TTL_MS.
 *
 * Why this is safe: only an answer that is durable and final goes in — one
 * read from the store as finished, or one whose complete/fail(final) the
 * store acknowledged — and a finished record's answer never changes. What
 * can change is whether the record still exists (purged after its
 * retention) or its state (a transition, to RELEASED say, to run it
 * again). A transition made through this daemon's JSON API clears every
 * loop's cache (gateway.c); one made by another program, or on another
 * instance, the cache does not see for at most REPLAY_CACHE_TTL_MS, and
 * answers a duplicate with the stored answer where the store would have let
 * it execute again: the error, if any, is one more replay, never one more
 * execution.
 *
 * An open hash table of entries, and a list in the order they were put: the
 * oldest go first when the byte budget is reached, and entries past their
 * TTL are dropped from its tail on every put (and when a get meets one).
 */
#include "gateway/replay_cache.h"

#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *hnext;        /* hash chain */
    struct entry *prev, *next;  /* in put order: the newest at head */
    uint64_t hash;
    int64_t born_ms;
    int64_t expires_ms;
    unsigned long gen;
    int has_fp;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    char *wire;                   /* the wire form, once a duplicate built it */
    size_t id_len, len, wire_len; /* "space\0key", the stored form, the wire form */
    char data[];                  /* id, stored form */
};

struct replay_cache {
    struct entry **buckets;
    size_t nbuckets; /* a power of two */
    struct entry *head, *tail;
    size_t bytes, max_bytes;
};

static uint64_t hash_id(const char *id, size_t len)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)id[i]) * 1099511628211ULL;
    return h;
}

static size_t entry_bytes(const struct entry *e)
{
    return sizeof *e + e->id_len + e->len + e->wire_len;
}

struct replay_cache *replay_cache_new(size_t max_bytes)
{
    if (max_bytes == 0)
        return NULL;
    struct replay_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    /* About one bucket per small entry the budget holds. */
    c->nbuckets = 1024;
    while (c->nbuckets < max_bytes / 512 && c->nbuckets < (1u << 20))
        c->nbuckets <<= 1;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    if (!c->buckets) {
        free(c);
        return NULL;
    }
    c->max_bytes = max_bytes;
    return c;
}

static void unlink_entry(struct replay_cache *c, struct entry *e)
{
    struct entry **p = &c->buckets[e->hash & (c->nbuckets - 1)];
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    c->bytes -= entry_bytes(e);
    free(e->wire);
    free(e);
}

size_t replay_cache_bytes(const struct replay_cache *c)
{
    return c ? c->bytes : 0;
}

void replay_cache_clear(struct replay_cache *c)
{
    while (c && c->head)
        unlink_entry(c, c->head);
}

void replay_cache_free(struct replay_cache *c)
{
    if (!c)
        return;
    replay_cache_clear(c);
    free(c->buckets);
    free(c);
}

/* "space\0key" into buf (IDEM_NAME_MAX + IDEM_KEY_MAX + 2 bytes). */
static size_t make_id(char *buf, const char *space, const char *key)
{
    size_t s = strlen(space), k = strlen(key);
    memcpy(buf, space, s + 1);
    memcpy(buf + s + 1, key, k);
    return s + 1 + k;
}

static struct entry *find(struct replay_cache *c, const char *id, size_t id_len, uint64_t h)
{
    for (struct entry *e = c->buckets[h & (c->nbuckets - 1)]; e; e = e->hnext)
        if (e->hash == h && e->id_len == id_len && memcmp(e->data, id, id_len) == 0)
            return e;
    return NULL;
}

int replay_cache_get(struct replay_cache *c, const char *space, const char *key,
                     const uint8_t *fp, int64_t now_ms, unsigned long gen,
                     struct replay_kept *out)
{
    if (!c)
        return 0;
    char id[IDEM_NAME_MAX + IDEM_KEY_MAX + 2];
    size_t id_len = make_id(id, space, key);
    uint64_t h = hash_id(id, id_len);
    struct entry *e = find(c, id, id_len, h);
    if (!e)
        return 0;
    if (now_ms - e->born_ms >= REPLAY_CACHE_TTL_MS || e->gen != gen) {
        unlink_entry(c, e);
        return 0;
    }
    if (fp && e->has_fp && memcmp(fp, e->fp, IDEM_FINGERPRINT_LEN) != 0)
        return 0; /* another payload: the store says MISMATCH */
    out->stored = e->data + e->id_len;
    out->stored_len = e->len;
    out->expires_ms = e->expires_ms;
    out->wire = e->wire;
    out->wire_len = e->wire_len;
    out->entry = e;
    return 1;
}

/* Make room for more bytes: the least recently put go first, but never keep
 * (the entry being added to). 0 when there is room. */
static int make_room(struct replay_cache *c, size_t more, const struct entry *keep)
{
    /* What can never fit evicts nothing. */
    if (more + (keep ? entry_bytes(keep) : 0) > c->max_bytes)
        return -1;
    while (c->bytes + more > c->max_bytes) {
        struct entry *victim = c->tail;
        if (victim == keep)
            victim = victim->prev;
        if (!victim)
            return -1;
        unlink_entry(c, victim);
    }
    return 0;
}

void replay_cache_add_wire(struct replay_cache *c, struct replay_kept *kept, const void *wire,
                           size_t len)
{
    struct entry *e = kept->entry;
    if (!c || !e || e->wire || len == 0 || make_room(c, len, e) != 0)
        return;
    if (!(e->wire = malloc(len)))
        return;
    memcpy(e->wire, wire, len);
    e->wire_len = len;
    c->bytes += len;
    kept->wire = e->wire;
    kept->wire_len = len;
}

void replay_cache_put(struct replay_cache *c, const char *space, const char *key,
                      const uint8_t *fp, const void *stored, size_t len, int64_t expires_ms,
                      int64_t now_ms, unsigned long gen)
{
    if (!c || len > REPLAY_CACHE_ENTRY_MAX)
        return;
    char id[IDEM_NAME_MAX + IDEM_KEY_MAX + 2];
    size_t id_len = make_id(id, space, key);
    uint64_t h = hash_id(id, id_len);
    struct entry *old = find(c, id, id_len, h);
    if (old)
        unlink_entry(c, old);
    struct entry *e = malloc(sizeof *e + id_len + len);
    if (!e)
        return;
    e->hash = h;
    e->born_ms = now_ms;
    e->expires_ms = expires_ms;
    e->gen = gen;
    e->has_fp = fp != NULL;
    if (fp)
        memcpy(e->fp, fp, IDEM_FINGERPRINT_LEN);
    e->wire = NULL;
    e->id_len = id_len;
    e->len = len;
    e->wire_len = 0;
    memcpy(e->data, id, id_len);
    memcpy(e->data + id_len, stored, len);
    /* The list is in the order entries were put: what expired is at the
     * tail. Dropping it here keeps the cache at about TTL's worth of
     * answers, not at its budget of dead ones. */
    while (c->tail && now_ms - c->tail->born_ms >= REPLAY_CACHE_TTL_MS)
        unlink_entry(c, c->tail);
    if (make_room(c, entry_bytes(e), NULL) != 0) {
        free(e);
        return;
    }
    struct entry **b = &c->buckets[h & (c->nbuckets - 1)];
    e->hnext = *b;
    *b = e;
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    else
        c->tail = e;
    c->head = e;
    c->bytes += entry_bytes(e);
}
