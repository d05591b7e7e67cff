/* SPDX-License-Identifier: Apache-2.0 */
/*
 * store.h — the storage interface, and the handle that holds an opened store.
 *
 * A store is two backends, each behind one versioned table of operations
 * (like sqlite3_vfs):
 *
 *   kv  tokens and locks: short-lived, atomic compare-and-act on one key.
 *       "memory" (embedded), "redis" (distributed).
 *   db  records and inbox: durable rows, a unique key, conditional updates.
 *       "sqlite" (embedded), "postgres" (distributed).
 *
 * The operations are primitives, not policy: insert-if-absent and
 * compare-and-set. The decisions (what a begin on an expired PROCESSING record
 * means, when a message is dead) are made once, above this layer, in
 * lib/record and lib/inbox, so every backend behaves alike. Every operation
 * may fail with IDEM_ESTORE, IDEM_ETIMEDOUT or IDEM_EUNAVAILABLE, as a remote
 * store does, and has set the thread's error detail when it does.
 */
#ifndef IDEM_STORE_H
#define IDEM_STORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "idem.h"

#define IDEM_KV_OPS_VERSION 3 /* 2: the asynchronous operations, loop_gone;
                                 3: token_put_start */
#define IDEM_DB_OPS_VERSION 9 /* 4: rec_delete, rec_list; 5: the _start operations;
                                 6: rec_delete_start, rec_list_start,
                                 rec_purge_start; 7: version 2's run_async (and
                                 3's one_call) gone with idem_record_async;
                                 8: replication; 9: rec_delete's
                                 updated_ms */

struct idem__loop;

/* A call a backend runs without the caller waiting: done(c, rc, detail)
 * runs exactly once when its answer is in its out-parameters, on a thread
 * of the backend's (a writer; the loop, for a backend that runs on it), or
 * before the call that started it returns. detail is valid during done. A
 * start that returns an error never calls done. */
struct idem__call {
    void (*done)(struct idem__call *c, idem_rc rc, const char *detail);
};

struct idem__kv_ops {
    unsigned version; /* IDEM_KV_OPS_VERSION */
    const char *name;

    /* Store a fresh token for (subject, scene) for ttl_ms. When the
     * (subject, scene) already has per_scene unspent tokens, the oldest is
     * dropped. IDEM_EFULL when the store is at capacity. */
    idem_rc (*token_put)(void *kv, const char *subject, const char *scene,
                         const char *token, int64_t ttl_ms, unsigned per_scene,
                         int64_t now);
    /* Atomic compare-and-spend; see idem_token_consume(). */
    idem_rc (*token_consume)(void *kv, const char *subject, const char *scene,
                             const char *token, const char *biz_key,
                             int64_t now, idem_outcome *out, char *spent_key);
    idem_rc (*token_give_back)(void *kv, const char *subject,
                               const char *scene, const char *token,
                               const char *biz_key, int64_t now,
                               idem_outcome *out);

    /* See idem_lock_acquire() and friends. fence is per space. */
    idem_rc (*lock_acquire)(void *kv, const char *space, const char *key,
                            const char *owner, int64_t ttl_ms, int64_t now,
                            idem_outcome *out, idem_lock_info *info);
    idem_rc (*lock_renew)(void *kv, const char *space, const char *key,
                          const char *owner, int64_t ttl_ms, int64_t now,
                          idem_outcome *out);
    idem_rc (*lock_release)(void *kv, const char *space, const char *key,
                            const char *owner, int64_t now, idem_outcome *out);

    void (*close)(void *kv);

    /* Version 2. The operations above without waiting, on loop l (see
     * struct idem__loop): each answers in the out-parameters of c's
     * container and calls c->done, as struct idem__call says, on l's thread.
     * NULL: not offered (the handle then runs the blocking operation and
     * posts the answer). loop_gone(kv, l): l is being detached; fail what
     * is in flight on it (each done called) and free l->kv_state. */
    idem_rc (*token_consume_start)(void *kv, struct idem__loop *l, const char *subject,
                                   const char *scene, const char *token, const char *biz_key,
                                   int64_t now, idem_outcome *out, char *spent_key,
                                   struct idem__call *c);
    idem_rc (*token_give_back_start)(void *kv, struct idem__loop *l, const char *subject,
                                     const char *scene, const char *token,
                                     const char *biz_key, int64_t now, idem_outcome *out,
                                     struct idem__call *c);
    idem_rc (*lock_acquire_start)(void *kv, struct idem__loop *l, const char *space,
                                  const char *key, const char *owner, int64_t ttl_ms,
                                  int64_t now, idem_outcome *out, idem_lock_info *info,
                                  struct idem__call *c);
    idem_rc (*lock_renew_start)(void *kv, struct idem__loop *l, const char *space,
                                const char *key, const char *owner, int64_t ttl_ms,
                                int64_t now, idem_outcome *out, struct idem__call *c);
    idem_rc (*lock_release_start)(void *kv, struct idem__loop *l, const char *space,
                                  const char *key, const char *owner, int64_t now,
                                  idem_outcome *out, struct idem__call *c);
    void (*loop_gone)(void *kv, struct idem__loop *l); /* a second call: a no-op */

    /* Version 3. token_put on loop l, as the version 2 operations. */
    idem_rc (*token_put_start)(void *kv, struct idem__loop *l, const char *subject,
                               const char *scene, const char *token, int64_t ttl_ms,
                               unsigned per_scene, int64_t now, struct idem__call *c);
};

/* Compare-and-set on one record: the update happens only if the row is in
 * state expect_state, and (when expect_epoch != 0) at that epoch, and (when
 * lease_expired_at != 0) its lease_until <= lease_expired_at. */
struct idem__rec_cas {
    const char *space, *key;
    const char *expect_state;
    uint64_t expect_epoch;
    int64_t lease_expired_at;

    const char *state;     /* new state */
    uint64_t epoch;        /* new epoch, or 0 to keep */
    const char *owner;     /* new owner, or NULL to keep */
    const uint8_t *fingerprint; /* new fingerprint (IDEM_FINGERPRINT_LEN), NULL to keep */
    int64_t lease_until;   /* new lease (0 when not PROCESSING) */
    int set_result;        /* replace result with (result, result_len) */
    const void *result;
    size_t result_len;
    int64_t expires_ms;    /* -1 keep, 0 never, else the instant */
    int64_t now;
};

struct idem__rec_new {
    const char *space, *key;
    const uint8_t *fingerprint; /* NULL: none */
    const char *owner;
    uint64_t epoch;             /* the first claim's epoch */
    int64_t lease_until;
    int64_t now;
};

/* A listing (idem_record_list), its cursor decoded: rows of space ordered
 * by (created_ms, key) descending, after (after_created, after_key) when
 * after_key is not NULL, fetch of them at most. */
struct idem__rec_list {
    const char *space;
    const char *prefix;      /* NULL: any key */
    const char *prefix_upper; /* with prefix: keys below it; NULL: no bound */
    const char *state;       /* NULL: any state */
    int64_t created_before, created_after, min_lease_span; /* 0: none */
    int64_t after_created;
    const char *after_key;
    unsigned fetch;
};

struct idem__inbox_cas {
    const char *group, *msg_id;
    const char *expect_state;  /* NULL: any state */
    unsigned expect_attempts;  /* compared always */
    int64_t lease_expired_at;  /* 0: no lease condition */
    const char *state;
    unsigned attempts;
    int64_t lease_until;
    int64_t now;
};

struct idem__db_ops {
    unsigned version; /* IDEM_DB_OPS_VERSION */
    const char *name;

    /* Rows come back as idem_record; their result is allocated with
     * idem__malloc and handed to the caller.
     *
     * Insert a PROCESSING record at n->epoch unless (space, key) exists.
     * *inserted: 1 if this call created it. Otherwise *cur receives the
     * existing row, read in the same atomic step. */
    idem_rc (*rec_insert)(void *db, const struct idem__rec_new *n,
                          int *inserted, idem_record *cur);
    /* *changed: 1 if the update was made. When it was not and cur is not
     * NULL, *cur receives the row as it stands (*found 0 when there is none),
     * read in the same atomic step. */
    idem_rc (*rec_cas)(void *db, const struct idem__rec_cas *c, int *changed,
                       int *found, idem_record *cur);
    idem_rc (*rec_get)(void *db, const char *space, const char *key,
                       int *found, idem_record *cur);
    /* A quick read that may trail concurrent writes (a hint, never a
     * decision to write): begin uses it to answer DONE for finished records
     * without queueing behind writes. NULL: not offered. */
    idem_rc (*rec_peek)(void *db, const char *space, const char *key,
                        int *found, idem_record *cur);
    idem_rc (*rec_purge)(void *db, int64_t now, unsigned limit,
                         unsigned *purged);

    /* Inbox rows: insert (group, msg_id) in state `state` with `attempts`
     * unless it exists; *cur receives the row either way. */
    idem_rc (*inbox_insert)(void *db, const char *group, const char *msg_id,
                            const char *biz_type, const char *state,
                            unsigned attempts, int64_t lease_until,
                            int64_t now, int *inserted, idem_inbox_entry *cur);
    idem_rc (*inbox_cas)(void *db, const struct idem__inbox_cas *c,
                         int *changed, int *found, idem_inbox_entry *cur);

    /* Durable commits so far, the writes they carried, how long they took
     * and how many each carried (any may be NULL). */
    void (*commit_stats)(void *db, idem_stats *stats, idem_commit_times *times,
                         idem_commit_batches *batches);

    void (*close)(void *db);

    /* Version 4. Delete (space, key) if it is at epoch and not PROCESSING,
     * and (version 9) last written at updated_ms unless that is 0; *deleted
     * 1 if it went. When it did not, *found and *cur (if not NULL) say what
     * stands, read in the same atomic step. */
    idem_rc (*rec_delete)(void *db, const char *space, const char *key,
                          uint64_t epoch, int64_t updated_ms, int *deleted, int *found,
                          idem_record *cur);
    /* The rows of a listing, the last committed ones: *items (allocated
     * with idem__malloc, the caller's) receives *count <= l->fetch. */
    idem_rc (*rec_list)(void *db, const struct idem__rec_list *l,
                        idem_record_item **items, size_t *count);

    /* Version 5. rec_insert, rec_cas and rec_get without waiting (struct
     * idem__call): the arguments and out-parameters must stay until done
     * runs (on a writer thread, or before the start returns: a SQLite
     * file's read). NULL: not offered, and the asynchronous record calls
     * answer IDEM_ENOTSUP on that store. */
    idem_rc (*rec_insert_start)(void *db, const struct idem__rec_new *n, int *inserted,
                                idem_record *cur, struct idem__call *c);
    idem_rc (*rec_cas_start)(void *db, const struct idem__rec_cas *cas, int *changed,
                             int *found, idem_record *cur, struct idem__call *c);
    idem_rc (*rec_get_start)(void *db, const char *space, const char *key, int *found,
                             idem_record *cur, struct idem__call *c);

    /* Version 6. rec_delete, rec_list and rec_purge without waiting, as
     * version 5's: everything they are given, the listing's strings
     * included, must stay until done runs. A listing's *items are the
     * caller's once done reports IDEM_OK, and NULL otherwise. NULL: not
     * offered (the asynchronous calls answer IDEM_ENOTSUP). */
    idem_rc (*rec_delete_start)(void *db, const char *space, const char *key, uint64_t epoch,
                                int64_t updated_ms, int *deleted, int *found,
                                idem_record *cur, struct idem__call *c);
    idem_rc (*rec_list_start)(void *db, const struct idem__rec_list *l,
                              idem_record_item **items, size_t *count, struct idem__call *c);
    idem_rc (*rec_purge_start)(void *db, int64_t now, unsigned limit, unsigned *purged,
                               struct idem__call *c);

    /* Version 8. What the server promises of an acknowledged commit on a
     * failover (idem_get_replication); NULL: no replication (known 0). */
    void (*replication)(void *db, idem_replication *out);
};

/* What a handle keeps for each loop asynchronous calls were made on
 * (loop.c): the calls whose answer is not posted yet, and the kv backend's
 * own state for the loop (a connection of its own, for Redis). */
struct idem__loop {
    struct idem__loop *next;
    idem *h;
    idem_loop *loop;
    atomic_long pending;
    void *kv_state;
};

/* The handle's state for loop (made on first use); NULL for want of
 * memory, with the detail set. Any thread. */
struct idem__loop *idem__loop_of(idem *h, idem_loop *loop);
/* A call on l has begun; it ends with idem__loop_post, which posts p to
 * l's loop. */
void idem__loop_begin(struct idem__loop *l);
void idem__loop_post(struct idem__loop *l, idem_loop_post *p);
/* A call begun that will post nothing: it failed to start. */
void idem__loop_end(struct idem__loop *l);
/* When the handle closes: fail what the kv backend runs on each loop
 * (loop_gone, which must take a second call for the same loop), and,
 * once the db backend has finished its jobs, wait for every loop's calls
 * and free their state. */
void idem__loops_gone(idem *h);
void idem__loops_free(idem *h);

struct idem__watchdog;

/* The handle: an opened store, its limits and clock, its counters. */
struct idem {
    const struct idem__kv_ops *kv_ops;
    void *kv;
    const struct idem__db_ops *db_ops;
    void *db;
    const char *store_name;

    size_t result_max;
    int64_t retention_ms;
    unsigned tokens_per_scene;
    idem_clock_fn clock;
    void *clock_arg;
    idem_log_fn log;
    void *log_arg;

    atomic_uint_fast64_t conflicts;
    atomic_uint_fast64_t takeovers;

    pthread_mutex_t watchdog_mu; /* guards starting the watchdog lazily */
    struct idem__watchdog *watchdog;

    pthread_mutex_t loops_mu; /* guards loops; with loops_cv, pending's end */
    pthread_cond_t loops_cv;
    struct idem__loop *loops;
};

static inline int64_t idem__now(const struct idem *h)
{
    return h->clock(h->clock_arg);
}

/* Log a line through the handle's log callback, if it has one. */
void idem__log(const struct idem *h, idem_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The backends. Each open returns IDEM_OK and sets *out, or an error. */
idem_rc idem__memory_open(const idem_options *o, const struct idem__kv_ops **ops, void **out);
idem_rc idem__sqlite_open(const idem_options *o,
                          const struct idem__db_ops **ops, void **out);
/* The distributed store: Redis for kv, PostgreSQL for db. */
idem_rc idem__redis_open(const idem_options *o, const struct idem__kv_ops **ops,
                         void **out);
idem_rc idem__postgres_open(const idem_options *o,
                            const struct idem__db_ops **ops, void **out);
/* Whether libpq reads url as a connection URI or key=value string (as the
 * store would at its start): IDEM_OK, or IDEM_EINVAL with the detail
 * "postgres_url: ..."; libpq's reason (which may quote the URL) only when
 * quote is set, by a caller that knows the URL holds no secret. */
idem_rc idem__postgres_url_check(const char *url, int quote);

/* idem_open() with the two halves named: kv "memory" or "redis", db
 * "sqlite" or "postgres". The public stores are memory+sqlite ("embedded")
 * and redis+postgres ("distributed"); tests use the others to exercise one
 * backend at a time. */
idem_rc idem__open_parts(const idem_options *opts, const char *kv, const char *db,
                         idem **out);

/* Wall-clock milliseconds since the Unix epoch, the default clock. */
int64_t idem__wall_clock_ms(void *unused);

#endif
