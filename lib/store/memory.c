/* SPDX-License-Identifier: Apache-2.0 */
/*
 * memory.c — the "memory" kv backend: tokens and locks in this process's
 * memory, the embedded store's layers 1 and 2.
 *
 * Both live in NSHARDS shards, each a mutex and its tables; a token goes to
 * the shard of its (subject, scene), a lock to the shard of its (space, key),
 * so every operation takes exactly one mutex and never two. Entries expire by
 * the handle's clock; expired entries are dropped when touched, a few at a
 * time from the oldest end of each shard's age list on every insert, and all
 * at once when the store reaches its capacity. That sweep walks everything
 * held, so it is not made again while nothing can have expired since: the
 * store keeps a bound below which no entry expires (the sweep's soonest
 * survivor, lowered by every expiry set after it), and an insert that finds
 * the store full before that time is refused at once. A client filling the
 * table costs each refusal microseconds, not a walk over a million entries.
 *
 * Fencing tokens come from one counter shared by all spaces: a sequence that
 * is strictly increasing overall is strictly increasing within each space. It
 * starts at the wall clock in nanoseconds, so fences keep increasing across a
 * restart of the process, where the in-memory locks themselves are lost.
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/htab.h"
#include "store.h"

#define NSHARDS 64
#define SWEEP_ON_INSERT 4

/* A doubly linked list threaded through entries, oldest first. */
struct age {
    struct age *prev, *next;
};

static void age_push(struct age *head, struct age *a)
{
    a->prev = head->prev;
    a->next = head;
    head->prev->next = a;
    head->prev = a;
}

static void age_unlink(struct age *a)
{
    a->prev->next = a->next;
    a->next->prev = a->prev;
}

/* All tokens issued to one (subject, scene) in one shard. Lives while any of
 * them, spent or not, does. */
struct slot {
    struct idem__hnode node;
    struct tok *head, *tail; /* unspent tokens, oldest first */
    unsigned unspent;
    unsigned refs;
    char *scene;
    char subject[];
};

struct tok {
    struct idem__hnode node; /* in shard->tokens, by token text */
    struct age age;
    struct tok *sprev, *snext; /* in slot's unspent list */
    struct slot *slot;
    int64_t expires;      /* unspent: until; spent: remembered until */
    int64_t issued_until; /* the expiry it was issued with */
    int64_t ttl;
    char *spent_key;      /* NULL while unspent */
    char text[IDEM_TOKEN_LEN + 1];
};

struct lk {
    struct idem__hnode node;
    struct age age;
    int64_t expires;
    uint64_t fence;
    char *key;
    char *owner;
    char space[];
};

struct shard {
    pthread_mutex_t mu;
    struct idem__htab tokens, slots, locks;
    struct age tok_age, lock_age;
};

struct memory {
    struct shard shards[NSHARDS];
    size_t tokens_max, locks_max;
    atomic_size_t ntokens, nlocks;
    /* No token (lock) held expires before this: see the top of the file. */
    _Atomic int64_t tok_soonest, lock_soonest;
    atomic_uint_fast64_t fence;
};

#define CONTAINER(p, type, member) \
    ((type *)(void *)((char *)(p) - offsetof(type, member)))

static struct shard *shard_of(struct memory *m, uint64_t hash)
{
    return &m->shards[(hash >> 58) % NSHARDS];
}

/* ---- tokens ---- */

struct slot_key {
    const char *subject, *scene;
};

static int slot_eq(const struct idem__hnode *n, const void *arg)
{
    const struct slot *s = CONTAINER(n, struct slot, node);
    const struct slot_key *k = arg;
    return strcmp(s->subject, k->subject) == 0 && strcmp(s->scene, k->scene) == 0;
}

static int tok_eq(const struct idem__hnode *n, const void *arg)
{
    return strcmp(CONTAINER(n, struct tok, node)->text, arg) == 0;
}

static void slot_unlink_tok(struct slot *s, struct tok *t)
{
    if (t->sprev)
        t->sprev->snext = t->snext;
    else
        s->head = t->snext;
    if (t->snext)
        t->snext->sprev = t->sprev;
    else
        s->tail = t->sprev;
    t->sprev = t->snext = NULL;
    s->unspent--;
}

static void slot_push_tok(struct slot *s, struct tok *t)
{
    t->snext = NULL;
    t->sprev = s->tail;
    if (s->tail)
        s->tail->snext = t;
    else
        s->head = t;
    s->tail = t;
    s->unspent++;
}

static void slot_unref(struct shard *sh, struct slot *s)
{
    if (--s->refs)
        return;
    struct slot_key k = {s->subject, s->scene};
    struct idem__hnode **link = idem__htab_find(&sh->slots, s->node.hash, slot_eq, &k);
    idem__htab_unlink(&sh->slots, link);
    idem__free(s);
}

static void tok_drop(struct memory *m, struct shard *sh, struct tok *t)
{
    struct idem__hnode **link = idem__htab_find(&sh->tokens, t->node.hash, tok_eq, t->text);
    idem__htab_unlink(&sh->tokens, link);
    age_unlink(&t->age);
    if (!t->spent_key)
        slot_unlink_tok(t->slot, t);
    slot_unref(sh, t->slot);
    idem__free(t->spent_key);
    idem__free(t);
    atomic_fetch_sub(&m->ntokens, 1);
}

/* bound lowered to at most expires. */
static void lower(_Atomic int64_t *bound, int64_t expires)
{
    int64_t was = atomic_load_explicit(bound, memory_order_relaxed);
    while (expires < was &&
           !atomic_compare_exchange_weak_explicit(bound, &was, expires, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* Drops up to max expired tokens of sh from the oldest end; with soonest,
 * walks them all and lowers *soonest to the first expiry of those left. */
static void tok_sweep(struct memory *m, struct shard *sh, int64_t now, size_t max,
                      int64_t *soonest)
{
    struct age *a = sh->tok_age.next, *next;
    for (; a != &sh->tok_age && max; a = next, max--) {
        next = a->next;
        struct tok *t = CONTAINER(a, struct tok, age);
        if (t->expires <= now)
            tok_drop(m, sh, t);
        else if (soonest && t->expires < *soonest)
            *soonest = t->expires;
    }
}

/* Reserve room for one more entry in a store-wide count, sweeping every
 * shard once when the store is full and something may have expired (now
 * at or past *soonest). The sweep's soonest survivor becomes the bound,
 * unless an expiry set meanwhile lowered it (then that one stands). */
static int reserve(struct memory *m, atomic_size_t *count, size_t max,
                   void (*sweep)(struct memory *, struct shard *, int64_t, size_t, int64_t *),
                   _Atomic int64_t *soonest, int64_t now)
{
    for (int pass = 0; pass < 2; pass++) {
        if (atomic_fetch_add(count, 1) < max)
            return 1;
        atomic_fetch_sub(count, 1);
        int64_t was = atomic_load(soonest);
        if (pass == 1 || now < was)
            break;
        int64_t first = INT64_MAX;
        for (int i = 0; i < NSHARDS; i++) {
            pthread_mutex_lock(&m->shards[i].mu);
            sweep(m, &m->shards[i], now, (size_t)-1, &first);
            pthread_mutex_unlock(&m->shards[i].mu);
        }
        atomic_compare_exchange_strong(soonest, &was, first);
    }
    return 0;
}

static idem_rc token_put(void *kv, const char *subject, const char *scene,
                         const char *token, int64_t ttl_ms, unsigned per_scene,
                         int64_t now)
{
    struct memory *m = kv;
    uint64_t sh_hash = idem__hash2(subject, scene);
    struct shard *sh = shard_of(m, sh_hash);
    size_t sublen = strlen(subject), scenelen = strlen(scene);
    idem_rc rc = IDEM_OK;

    if (!reserve(m, &m->ntokens, m->tokens_max, tok_sweep, &m->tok_soonest, now))
        return idem__fail(IDEM_EFULL, "tokens: %zu held, the limit", m->tokens_max);
    struct tok *t = idem__calloc(1, sizeof *t);
    struct slot *fresh = idem__malloc(sizeof *fresh + sublen + scenelen + 2);
    if (!t || !fresh) {
        rc = idem__fail(IDEM_ENOMEM, "tokens: allocating an entry");
        goto out;
    }
    memcpy(t->text, token, IDEM_TOKEN_LEN + 1);
    t->node.hash = idem__hash2(token, "");
    t->ttl = ttl_ms;
    t->expires = t->issued_until = now + ttl_ms;
    lower(&m->tok_soonest, t->expires);

    pthread_mutex_lock(&sh->mu);
    tok_sweep(m, sh, now, SWEEP_ON_INSERT, NULL);
    struct slot_key k = {subject, scene};
    struct idem__hnode **link = idem__htab_find(&sh->slots, sh_hash, slot_eq, &k);
    struct slot *s;
    if (*link) {
        s = CONTAINER(*link, struct slot, node);
    } else {
        s = fresh;
        fresh = NULL;
        memset(s, 0, sizeof *s);
        memcpy(s->subject, subject, sublen + 1);
        s->scene = s->subject + sublen + 1;
        memcpy(s->scene, scene, scenelen + 1);
        s->node.hash = sh_hash;
        idem__htab_insert(&sh->slots, &s->node);
    }
    s->refs++;
    t->slot = s;
    /* Expired tokens of this page first, then the oldest over the cap. */
    for (struct tok *o = s->head, *next; o; o = next) {
        next = o->snext;
        if (o->expires <= now)
            tok_drop(m, sh, o);
    }
    while (s->unspent >= per_scene)
        tok_drop(m, sh, s->head);
    slot_push_tok(s, t);
    idem__htab_insert(&sh->tokens, &t->node);
    age_push(&sh->tok_age, &t->age);
    t = NULL;
    pthread_mutex_unlock(&sh->mu);
out:
    if (t) {
        idem__free(t);
        atomic_fetch_sub(&m->ntokens, 1);
    }
    idem__free(fresh);
    return rc;
}

/* The token (subject, scene, text) if it is alive, with its shard locked;
 * NULL (and the shard unlocked) otherwise. */
static struct tok *tok_lookup(struct memory *m, const char *subject,
                              const char *scene, const char *text, int64_t now,
                              struct shard **shp)
{
    struct shard *sh = shard_of(m, idem__hash2(subject, scene));
    pthread_mutex_lock(&sh->mu);
    struct idem__hnode **link =
        idem__htab_find(&sh->tokens, idem__hash2(text, ""), tok_eq, text);
    struct tok *t = *link ? CONTAINER(*link, struct tok, node) : NULL;
    if (t && t->expires <= now) {
        tok_drop(m, sh, t);
        t = NULL;
    }
    if (t && (strcmp(t->slot->subject, subject) || strcmp(t->slot->scene, scene)))
        t = NULL;
    if (!t) {
        pthread_mutex_unlock(&sh->mu);
        return NULL;
    }
    *shp = sh;
    return t;
}

static idem_rc token_consume(void *kv, const char *subject, const char *scene,
                             const char *token, const char *biz_key,
                             int64_t now, idem_outcome *out, char *spent_key)
{
    struct memory *m = kv;
    struct shard *sh;
    const char *key = biz_key ? biz_key : "";
    /* Allocate before taking the mutex: the common case spends the token. */
    char *copy = idem__strndup(key, strlen(key));
    if (!copy)
        return idem__fail(IDEM_ENOMEM, "tokens: copying the business key");
    struct tok *t = tok_lookup(m, subject, scene, token, now, &sh);
    if (!t) {
        *out = IDEM_UNKNOWN;
    } else if (t->spent_key) {
        *out = IDEM_ALREADY_CONSUMED;
        if (spent_key)
            strcpy(spent_key, t->spent_key);
    } else {
        slot_unlink_tok(t->slot, t);
        t->spent_key = copy;
        copy = NULL;
        t->expires = now + t->ttl;
        lower(&m->tok_soonest, t->expires);
        age_unlink(&t->age);
        age_push(&sh->tok_age, &t->age);
        *out = IDEM_CONSUMED;
    }
    if (t)
        pthread_mutex_unlock(&sh->mu);
    idem__free(copy);
    return IDEM_OK;
}

static idem_rc token_give_back(void *kv, const char *subject, const char *scene,
                               const char *token, const char *biz_key,
                               int64_t now, idem_outcome *out)
{
    struct memory *m = kv;
    struct shard *sh;
    struct tok *t = tok_lookup(m, subject, scene, token, now, &sh);
    *out = IDEM_UNKNOWN;
    if (!t)
        return IDEM_OK;
    if (t->spent_key && strcmp(t->spent_key, biz_key ? biz_key : "") == 0 &&
        t->issued_until > now) {
        idem__free(t->spent_key);
        t->spent_key = NULL;
        t->expires = t->issued_until;
        lower(&m->tok_soonest, t->expires);
        slot_push_tok(t->slot, t);
        *out = IDEM_RESTORED;
    }
    pthread_mutex_unlock(&sh->mu);
    return IDEM_OK;
}

/* ---- locks ---- */

struct lock_key {
    const char *space, *key;
};

static int lock_eq(const struct idem__hnode *n, const void *arg)
{
    const struct lk *l = CONTAINER(n, struct lk, node);
    const struct lock_key *k = arg;
    return strcmp(l->key, k->key) == 0 && strcmp(l->space, k->space) == 0;
}

static void lock_drop(struct memory *m, struct shard *sh, struct idem__hnode **link)
{
    struct lk *l = CONTAINER(*link, struct lk, node);
    idem__htab_unlink(&sh->locks, link);
    age_unlink(&l->age);
    idem__free(l);
    atomic_fetch_sub(&m->nlocks, 1);
}

static void lock_sweep(struct memory *m, struct shard *sh, int64_t now, size_t max,
                       int64_t *soonest)
{
    struct age *a = sh->lock_age.next, *next;
    for (; a != &sh->lock_age && max; a = next, max--) {
        next = a->next;
        struct lk *l = CONTAINER(a, struct lk, age);
        if (l->expires <= now) {
            struct lock_key k = {l->space, l->key};
            lock_drop(m, sh, idem__htab_find(&sh->locks, l->node.hash, lock_eq, &k));
        } else if (soonest && l->expires < *soonest) {
            *soonest = l->expires;
        }
    }
}

/* The link to the live lock on (space, key), with its shard locked; an
 * expired lock found on the way is dropped. */
static struct idem__hnode **lock_find(struct memory *m, const char *space,
                                      const char *key, int64_t now,
                                      struct shard **shp, uint64_t *hash)
{
    *hash = idem__hash2(space, key);
    struct shard *sh = *shp = shard_of(m, *hash);
    struct lock_key k = {space, key};
    pthread_mutex_lock(&sh->mu);
    struct idem__hnode **link = idem__htab_find(&sh->locks, *hash, lock_eq, &k);
    if (*link && CONTAINER(*link, struct lk, node)->expires <= now) {
        lock_drop(m, sh, link);
        link = idem__htab_find(&sh->locks, *hash, lock_eq, &k);
    }
    return link;
}

static idem_rc lock_acquire(void *kv, const char *space, const char *key,
                            const char *owner, int64_t ttl_ms, int64_t now,
                            idem_outcome *out, idem_lock_info *info)
{
    struct memory *m = kv;
    struct shard *sh;
    uint64_t hash;
    size_t sl = strlen(space), kl = strlen(key), ol = strlen(owner);
    /* Allocated up front: a lock is usually free. */
    struct lk *fresh = idem__malloc(sizeof *fresh + sl + kl + ol + 3);
    if (!fresh)
        return idem__fail(IDEM_ENOMEM, "locks: allocating an entry");

    struct idem__hnode **link = lock_find(m, space, key, now, &sh, &hash);
    if (*link) {
        struct lk *l = CONTAINER(*link, struct lk, node);
        if (strcmp(l->owner, owner) == 0) {
            l->expires = now + ttl_ms;
            lower(&m->lock_soonest, l->expires);
            *out = IDEM_ACQUIRED;
            if (info) {
                info->fence = l->fence;
                info->ttl_left_ms = ttl_ms;
                info->holder[0] = '\0';
            }
        } else {
            *out = IDEM_BUSY;
            if (info) {
                info->fence = 0;
                info->ttl_left_ms = l->expires - now;
                strcpy(info->holder, l->owner);
            }
        }
        pthread_mutex_unlock(&sh->mu);
        idem__free(fresh);
        return IDEM_OK;
    }
    pthread_mutex_unlock(&sh->mu);

    if (!reserve(m, &m->nlocks, m->locks_max, lock_sweep, &m->lock_soonest, now)) {
        idem__free(fresh);
        return idem__fail(IDEM_EFULL, "locks: %zu held, the limit", m->locks_max);
    }
    memcpy(fresh->space, space, sl + 1);
    fresh->key = fresh->space + sl + 1;
    memcpy(fresh->key, key, kl + 1);
    fresh->owner = fresh->key + kl + 1;
    memcpy(fresh->owner, owner, ol + 1);
    fresh->node.hash = hash;
    fresh->expires = now + ttl_ms;
    lower(&m->lock_soonest, fresh->expires);

    /* The mutex was dropped for the reservation: look again. */
    link = lock_find(m, space, key, now, &sh, &hash);
    if (*link) {
        pthread_mutex_unlock(&sh->mu);
        atomic_fetch_sub(&m->nlocks, 1);
        idem__free(fresh);
        return lock_acquire(kv, space, key, owner, ttl_ms, now, out, info);
    }
    lock_sweep(m, sh, now, SWEEP_ON_INSERT, NULL);
    fresh->fence = atomic_fetch_add(&m->fence, 1) + 1;
    idem__htab_insert(&sh->locks, &fresh->node);
    age_push(&sh->lock_age, &fresh->age);
    pthread_mutex_unlock(&sh->mu);
    *out = IDEM_ACQUIRED;
    if (info) {
        info->fence = fresh->fence;
        info->ttl_left_ms = ttl_ms;
        info->holder[0] = '\0';
    }
    return IDEM_OK;
}

static idem_rc lock_renew(void *kv, const char *space, const char *key,
                          const char *owner, int64_t ttl_ms, int64_t now,
                          idem_outcome *out)
{
    struct memory *m = kv;
    struct shard *sh;
    uint64_t hash;
    struct idem__hnode **link = lock_find(m, space, key, now, &sh, &hash);
    *out = IDEM_NOT_HELD;
    if (*link) {
        struct lk *l = CONTAINER(*link, struct lk, node);
        if (strcmp(l->owner, owner) == 0) {
            l->expires = now + ttl_ms;
            lower(&m->lock_soonest, l->expires);
            *out = IDEM_RENEWED;
        }
    }
    pthread_mutex_unlock(&sh->mu);
    return IDEM_OK;
}

static idem_rc lock_release(void *kv, const char *space, const char *key,
                            const char *owner, int64_t now, idem_outcome *out)
{
    struct memory *m = kv;
    struct shard *sh;
    uint64_t hash;
    struct idem__hnode **link = lock_find(m, space, key, now, &sh, &hash);
    *out = IDEM_NOT_HELD;
    if (*link && strcmp(CONTAINER(*link, struct lk, node)->owner, owner) == 0) {
        lock_drop(m, sh, link);
        *out = IDEM_RELEASED;
    }
    pthread_mutex_unlock(&sh->mu);
    return IDEM_OK;
}

/* ---- open and close ---- */

static void memory_close(void *kv)
{
    struct memory *m = kv;
    if (!m)
        return;
    for (int i = 0; i < NSHARDS; i++) {
        struct shard *sh = &m->shards[i];
        if (sh->tokens.buckets) {
            while (sh->tok_age.next != &sh->tok_age)
                tok_drop(m, sh, CONTAINER(sh->tok_age.next, struct tok, age));
            while (sh->lock_age.next != &sh->lock_age) {
                struct lk *l = CONTAINER(sh->lock_age.next, struct lk, age);
                struct lock_key k = {l->space, l->key};
                lock_drop(m, sh, idem__htab_find(&sh->locks, l->node.hash, lock_eq, &k));
            }
            pthread_mutex_destroy(&sh->mu);
        }
        idem__htab_free(&sh->tokens);
        idem__htab_free(&sh->slots);
        idem__htab_free(&sh->locks);
    }
    idem__free(m);
}

static const struct idem__kv_ops memory_ops = {
    .version = IDEM_KV_OPS_VERSION,
    .name = "memory",
    .token_put = token_put,
    .token_consume = token_consume,
    .token_give_back = token_give_back,
    .lock_acquire = lock_acquire,
    .lock_renew = lock_renew,
    .lock_release = lock_release,
    .close = memory_close,
};

idem_rc idem__memory_open(const idem_options *o, const struct idem__kv_ops **ops, void **out)
{
    struct memory *m = idem__calloc(1, sizeof *m);
    if (!m)
        return idem__fail(IDEM_ENOMEM, "memory store: allocating");
    m->tokens_max = o->tokens_max;
    m->locks_max = o->locks_max;
    atomic_init(&m->tok_soonest, INT64_MAX);
    atomic_init(&m->lock_soonest, INT64_MAX);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_init(&m->fence, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
    for (int i = 0; i < NSHARDS; i++) {
        struct shard *sh = &m->shards[i];
        if (idem__htab_init(&sh->tokens, 16) || idem__htab_init(&sh->slots, 16) ||
            idem__htab_init(&sh->locks, 16)) {
            /* tokens.buckets marks a shard that memory_close must tear down */
            idem__htab_free(&sh->tokens);
            memory_close(m);
            return idem__fail(IDEM_ENOMEM, "memory store: allocating shards");
        }
        pthread_mutex_init(&sh->mu, NULL);
        sh->tok_age.prev = sh->tok_age.next = &sh->tok_age;
        sh->lock_age.prev = sh->lock_age.next = &sh->lock_age;
    }
    *ops = &memory_ops;
    *out = m;
    return IDEM_OK;
}
