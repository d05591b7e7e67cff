/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem.h — the whole public API of libidem, and its reference.
 *
 * Idem makes a write happen exactly once however often its request or message
 * arrives. It layers three defences, each good at one kind of duplicate:
 *
 *   layer 1  tokens   one-time anti-duplicate tokens at the entry (double clicks)
 *   layer 2  locks    a lock on the business key (the concurrent window)
 *   layer 3  records  a unique record per business key with a state machine
 *                     (late duplicates; the backstop that always holds)
 *
 * plus an inbox for message consumers. Every write path needs layer 3; money
 * paths use all three.
 *
 * Conventions that hold for every function below:
 *
 *  - Functions return an idem_rc. IDEM_OK (0) means the call did its job and
 *    its out-parameters are set; a negative value is an error from the table
 *    IDEM_ERRNO_MAP and the out-parameters are unspecified. idem_strerror()
 *    names an error; idem_errdetail() says, for the calling thread's last
 *    failed call, what exactly was wrong ("key: 256 bytes, limit is 255").
 *  - Business outcomes are not errors. NEW, DONE, BUSY, MISMATCH, ... come
 *    back through an idem_outcome out-parameter of a call that returned IDEM_OK.
 *  - Strings are NUL-terminated and borrowed for the duration of the call.
 *    Keys, subjects, owners and message ids are 1..255 bytes of UTF-8 with
 *    no control characters (bytes < 0x20 and 0x7f); key spaces, scenes,
 *    groups and states are 1..64 bytes of [A-Za-z0-9_.:-]. Violations return IDEM_EINVAL and
 *    store nothing.
 *  - Times are milliseconds. They are read from the clock given in
 *    idem_options (default: the wall clock, because record leases are stored
 *    and must mean the same after a restart).
 *  - Thread safety: an idem handle may be shared by any number of threads;
 *    every function that takes one is safe to call concurrently, except
 *    idem_close(), which must be the last call on the handle.
 *  - Callbacks are (fn, void *arg). If the call that registers a callback
 *    returns an error, the callback never runs; the documentation of each
 *    callback says when it runs.
 *  - Memory that Idem hands to the caller (a record's result) comes from the
 *    allocator set with idem_set_allocator() and is freed by the matching
 *    *_clear() function.
 */
#ifndef IDEM_H
#define IDEM_H

#include <stddef.h>
#include <stdint.h>

#include "idem/loop.h"
#include "idem/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(IDEM_STATIC)
#define IDEM_EXTERN
#elif defined(IDEM_BUILDING)
#define IDEM_EXTERN __attribute__((visibility("default")))
#else
#define IDEM_EXTERN
#endif

/* ------------------------------------------------------------------------- */
/* Errors: one table, append-only. A code, once published, is never renumbered
 * or reused. */

#define IDEM_ERRNO_MAP(XX)                                                     \
    XX(0, OK, "success")                                                       \
    XX(-1, EINVAL, "invalid argument")                                         \
    XX(-2, ENOMEM, "out of memory")                                            \
    XX(-3, ESTORE, "storage error")                                            \
    XX(-4, ETIMEDOUT, "storage timed out")                                     \
    XX(-5, ETOOBIG, "value exceeds its size limit")                            \
    XX(-6, EFULL, "capacity limit reached")                                    \
    XX(-7, ENOTSUP, "not supported by this store")                             \
    XX(-8, ENOTX, "no transaction open on the caller's connection")            \
    XX(-9, EUNAVAILABLE, "store unreachable")                                  \
    XX(-10, ECLOSING, "handle is closing")

typedef enum idem_rc {
#define IDEM_RC_ENUM_(code, name, text) IDEM_##name = code,
    IDEM_ERRNO_MAP(IDEM_RC_ENUM_)
#undef IDEM_RC_ENUM_
} idem_rc;

/* The fixed text of an error code; "unknown error" for a code not in the
 * table. Never NULL; static storage. */
IDEM_EXTERN const char *idem_strerror(idem_rc rc);

/* The symbolic name of an error code ("EINVAL"); static storage. */
IDEM_EXTERN const char *idem_errname(idem_rc rc);

/* What exactly went wrong in the calling thread's last call that returned an
 * error: the argument and limit for IDEM_EINVAL, the store's message for
 * IDEM_ESTORE. Thread-local; valid until the thread's next Idem call. Empty
 * string when there is nothing to add. */
IDEM_EXTERN const char *idem_errdetail(void);

/* ------------------------------------------------------------------------- */
/* Business outcomes. */

#define IDEM_OUTCOME_MAP(XX)                                                   \
    XX(NONE, "NONE")                       /* no outcome (call failed) */      \
    XX(NEW, "NEW")                         /* record: caller executes */       \
    XX(IN_PROGRESS, "IN_PROGRESS")         /* record: someone else is */       \
    XX(DONE, "DONE")                       /* record: stored result */         \
    XX(MISMATCH, "MISMATCH")               /* key reused, other payload */     \
    XX(TAKEN_OVER, "TAKEN_OVER")           /* abandoned record re-claimed */   \
    XX(COMPLETED, "COMPLETED")             /* record: complete/fail applied */ \
    XX(CONFLICT, "CONFLICT")               /* conditional update lost */       \
    XX(APPLIED, "APPLIED")                 /* transition made */               \
    XX(ALREADY, "ALREADY")                 /* transition already made */       \
    XX(NOT_FOUND, "NOT_FOUND")             /* no such record / message */      \
    XX(FOUND, "FOUND")                     /* record read */                   \
    XX(CONSUMED, "CONSUMED")               /* token: this call spent it */     \
    XX(ALREADY_CONSUMED, "ALREADY_CONSUMED") /* token spent earlier */         \
    XX(UNKNOWN, "UNKNOWN")                 /* token never issued/expired */    \
    XX(RESTORED, "RESTORED")               /* token given back */              \
    XX(ACQUIRED, "ACQUIRED")               /* lock: caller holds it */         \
    XX(BUSY, "BUSY")                       /* lock: someone else holds it */   \
    XX(RENEWED, "RENEWED")                 /* lock: lease extended */          \
    XX(RELEASED, "RELEASED")               /* lock released / record freed */  \
    XX(NOT_HELD, "NOT_HELD")               /* lock not held by this owner */   \
    XX(CLAIMED, "CLAIMED")                 /* inbox: first delivery */         \
    XX(DUPLICATE, "DUPLICATE")             /* inbox: seen before */            \
    XX(PROCESS, "PROCESS")                 /* inbox: caller processes now */   \
    XX(RETRY_LATER, "RETRY_LATER")         /* inbox: failed, will retry */     \
    XX(DEAD, "DEAD")                       /* inbox: attempts exhausted */     \
    XX(STALE, "STALE")                     /* step: the key is past it */

typedef enum idem_outcome {
#define IDEM_OUTCOME_ENUM_(name, text) IDEM_##name,
    IDEM_OUTCOME_MAP(IDEM_OUTCOME_ENUM_)
#undef IDEM_OUTCOME_ENUM_
        IDEM_OUTCOME_COUNT_
} idem_outcome;

/* "NEW", "DONE", ...; static storage; "?" for a value out of range. */
IDEM_EXTERN const char *idem_outcome_name(idem_outcome o);

/* ------------------------------------------------------------------------- */
/* Limits. Every input has one; exceeding it is IDEM_EINVAL or IDEM_ETOOBIG. */

#define IDEM_KEY_MAX 255     /* business keys, subjects, owners, msg ids */
#define IDEM_NAME_MAX 64     /* key spaces, scenes, groups, states */
#define IDEM_TOKEN_LEN 32    /* 192 random bits, base64url, no padding */
#define IDEM_FINGERPRINT_LEN 32 /* SHA-256 */
#define IDEM_RESULT_MAX_DEFAULT (1024 * 1024)

/* Check a business key (or subject, owner, message id) as every call that
 * takes one does: IDEM_OK, or IDEM_EINVAL with idem_errdetail() saying what
 * is wrong (empty, too long, a control character, not UTF-8). */
IDEM_EXTERN idem_rc idem_check_key(const char *key);

/* ------------------------------------------------------------------------- */
/* Library-wide settings. */

/* Replace the allocator used for everything Idem allocates itself (the
 * stores' own libraries keep theirs). Call before opening any handle; not
 * thread-safe against concurrent Idem calls. realloc_fn may be NULL. Passing
 * all NULL restores malloc/realloc/free. Used by tests to inject allocation
 * failures. */
IDEM_EXTERN void idem_set_allocator(void *(*malloc_fn)(size_t),
                                    void *(*realloc_fn)(void *, size_t),
                                    void (*free_fn)(void *));

/* The version of the library linked in, IDEM_VERSION_STRING of its build. */
IDEM_EXTERN const char *idem_version(void);

/* SHA-256 of len bytes, for record fingerprints. Thread-safe. */
IDEM_EXTERN idem_rc idem_fingerprint(const void *data, size_t len,
                                     uint8_t out[IDEM_FINGERPRINT_LEN]);

/* ------------------------------------------------------------------------- */
/* Handles. */

typedef struct idem idem;

/* A clock: milliseconds since the Unix epoch. Must be thread-safe. */
typedef int64_t (*idem_clock_fn)(void *arg);

typedef enum idem_log_level {
    IDEM_LOG_INFO = 0,
    IDEM_LOG_WARN = 1,  /* a recovery happened: an abandoned claim taken over */
    IDEM_LOG_ALERT = 2, /* a conflict: a stale owner tried to finish a record;
                           the embedded store's files removed under it */
} idem_log_level;

/* Receives one line, without a newline, on the thread that made the call
 * (the embedded store's writer thread for what it finds after a commit).
 * Must be thread-safe and must not call back into Idem. */
typedef void (*idem_log_fn)(void *arg, idem_log_level level, const char *msg);

#define IDEM_OPTIONS_VERSION 2

typedef struct idem_options {
    unsigned version;         /* IDEM_OPTIONS_VERSION (1 is still accepted:
                                 it ends before redis_url) */
    const char *store;        /* "embedded" (default when NULL) or
                                 "distributed" */
    const char *path;         /* embedded: SQLite file, or ":memory:" */
    size_t result_max;        /* stored result limit; 0: 1 MiB */
    int64_t retention_ms;     /* default record retention; 0: 24 h */
    unsigned tokens_per_scene;/* outstanding tokens per subject+scene; 0: 16.
                                 Issuing one more evicts the oldest. */
    size_t tokens_max;        /* embedded: tokens held in memory in all; 0: 1,000,000 */
    size_t locks_max;         /* embedded: locks held in memory in all; 0: 1,000,000 */
    unsigned commit_batch_max;/* group commit: writes per fsync; 0: 512 */
    idem_clock_fn clock;      /* NULL: wall clock */
    void *clock_arg;
    idem_log_fn log;          /* NULL: no log; idem_stats still counts */
    void *log_arg;

    /* Version 2: the distributed store. */
    const char *redis_url;    /* redis://[[user]:password@]host[:port][/db] */
    const char *postgres_url; /* a libpq connection URI or key=value string */
    unsigned pool_size;       /* PostgreSQL connections for reads (the two
                                 writers' come on top); 0: 8 */
    int64_t timeout_ms;       /* connect and per-command timeout; 0: 2000 */
} idem_options;

/* Fill *opts with the defaults above (store "embedded", path NULL). */
IDEM_EXTERN void idem_options_init(idem_options *opts);

/* Open a handle on the store described by opts. On success *out is a handle
 * to pass to idem_close(); on error *out is NULL.
 *
 * "embedded" keeps tokens and locks in this process's memory and records and
 * inbox in the SQLite file opts->path (created if missing; WAL;
 * synchronous=FULL; writes from concurrent callers share one fsync — group
 * commit — and each call returns only after its own write is durable).
 *
 * "distributed" keeps tokens and locks in Redis (opts->redis_url) and records
 * and inbox in PostgreSQL (opts->postgres_url), so that any number of
 * processes on any number of machines share them. idem_open() connects to
 * both and creates or migrates the PostgreSQL schema (never destructively);
 * IDEM_EUNAVAILABLE if either cannot be reached. Afterwards a call whose
 * server is down fails with IDEM_EUNAVAILABLE or IDEM_ETIMEDOUT (within
 * timeout_ms of being sent, and a call waits at most timeout_ms more to be
 * sent) and the handle reconnects by itself, with backoff, once the server
 * is back (the lookup of a host name is the system resolver's and is not
 * bounded by timeout_ms: name servers by address where it could hang).
 * IDEM_ETIMEDOUT means the command was sent and may still
 * have run: a lock acquire that timed out may be held, so retry it with the
 * same owner (which answers ACQUIRED with the same fence) or let its TTL end.
 * tokens_max and locks_max do not apply: Redis's own memory limit does, and
 * its out-of-memory answer is IDEM_EFULL. Concurrent calls share round-trips: Redis commands are
 * pipelined and PostgreSQL statements batched. Expiry of tokens, locks and
 * leases is judged by the handle's clock, as for the embedded store, so the
 * machines sharing a store must keep their clocks in step (NTP). */
IDEM_EXTERN idem_rc idem_open(const idem_options *opts, idem **out);

/* Close a handle: stops its watchdog and writer, waits for calls in flight
 * on the writer to finish, lets every loop go (idem_loop_detach) with each
 * asynchronous call's callback posted, frees everything. idem_close(NULL)
 * is a no-op. No other call on the handle may be running or start. */
IDEM_EXTERN void idem_close(idem *h);

/* The store's name: "embedded" or "distributed". Static storage. */
IDEM_EXTERN const char *idem_store_name(const idem *h);

/* ------------------------------------------------------------------------- */
/* Layer 1: tokens.
 *
 * A token is issued to a (subject, scene): the page a user opened. It is spent
 * once: of any number of concurrent consumers exactly one gets CONSUMED. A
 * spent token remembers the business key it was spent on for the token's TTL
 * from the moment it was spent, so a late retry carrying the same token and
 * key can be told apart from a new submission and let through to layer 3. */

/* Issue a token. subject may be "" (anonymous). ttl_ms in 1..7 days.
 * token receives IDEM_TOKEN_LEN characters of [A-Za-z0-9_-] and a NUL.
 * IDEM_EFULL when the handle holds tokens_max tokens. */
IDEM_EXTERN idem_rc idem_token_issue(idem *h, const char *subject,
                                     const char *scene, int64_t ttl_ms,
                                     char token[IDEM_TOKEN_LEN + 1]);

/* Spend a token on business key biz_key (may be NULL: none).
 * *out: CONSUMED — this call spent it;
 *       ALREADY_CONSUMED — it was spent before; spent_key (if not NULL,
 *         IDEM_KEY_MAX + 1 bytes) receives the key it was spent on ("" if none);
 *       UNKNOWN — never issued, expired, or issued to another subject/scene. */
IDEM_EXTERN idem_rc idem_token_consume(idem *h, const char *subject,
                                       const char *scene, const char *token,
                                       const char *biz_key, idem_outcome *out,
                                       char *spent_key);

/* Give a spent token back when the request it was spent on failed in a way
 * the user may retry: it becomes unspent again until its original expiry.
 * Only a token spent on biz_key (NULL: none) is given back.
 * *out: RESTORED, or UNKNOWN (not spent, or spent on another key, or gone). */
IDEM_EXTERN idem_rc idem_token_give_back(idem *h, const char *subject,
                                         const char *scene, const char *token,
                                         const char *biz_key,
                                         idem_outcome *out);

/* ------------------------------------------------------------------------- */
/* Layer 2: locks.
 *
 * A lock on (space, key) is held by one owner until it releases it or its TTL
 * runs out. A lock only queues concurrent requests; it never decides whether
 * the work should run — layer 3 does. Each acquisition gets a fencing token
 * that is strictly greater than every fence handed out before in that space,
 * so a downstream system can refuse writes from a holder whose lease ran out. */

typedef struct idem_lock_info {
    uint64_t fence;          /* ACQUIRED: the fencing token */
    int64_t ttl_left_ms;     /* ACQUIRED: ttl; BUSY: holder's time left */
    char holder[IDEM_KEY_MAX + 1]; /* BUSY: the holder's owner id */
} idem_lock_info;

/* Take the lock for ttl_ms (1 ms .. 1 day). *out: ACQUIRED (info->fence set)
 * or BUSY (info->holder, info->ttl_left_ms). Acquiring a lock the same owner
 * already holds is ACQUIRED with the same fence and a fresh TTL, so an acquire
 * whose answer was lost can be retried. info may be NULL. IDEM_EFULL when the
 * handle holds locks_max locks. */
IDEM_EXTERN idem_rc idem_lock_acquire(idem *h, const char *space,
                                      const char *key, const char *owner,
                                      int64_t ttl_ms, idem_outcome *out,
                                      idem_lock_info *info);

/* Extend the owner's lock to ttl_ms from now. *out: RENEWED, or NOT_HELD
 * (expired, or held by someone else — which is left untouched). */
IDEM_EXTERN idem_rc idem_lock_renew(idem *h, const char *space,
                                    const char *key, const char *owner,
                                    int64_t ttl_ms, idem_outcome *out);

/* Release the owner's lock. *out: RELEASED, or NOT_HELD (a lock held by
 * anyone else is never deleted). */
IDEM_EXTERN idem_rc idem_lock_release(idem *h, const char *space,
                                      const char *key, const char *owner,
                                      idem_outcome *out);

/* The watchdog renews a held lock every ttl_ms / 3 while work runs, so a
 * lock outlives slow work without a long TTL. */
typedef struct idem_watch idem_watch;

/* Called at most once, on the watchdog's thread, when the lease is lost:
 * a renewal answered NOT_HELD, or renewals failed with store errors until the
 * last good lease ran out. The work should stop: its lock is gone. */
typedef void (*idem_lock_lost_fn)(void *arg, const char *space,
                                  const char *key);

/* Start renewing a lock that owner holds. On success *out is a watch to
 * stop with idem_watchdog_stop(), before idem_close() of the handle; on_lost
 * may be NULL. */
IDEM_EXTERN idem_rc idem_watchdog_start(idem *h, const char *space,
                                        const char *key, const char *owner,
                                        int64_t ttl_ms, idem_lock_lost_fn on_lost,
                                        void *arg, idem_watch **out);

/* Stop renewing and free the watch. When it returns, on_lost is not running
 * and never will. Does not release the lock. NULL is a no-op. Must not be
 * called from on_lost of the same watch. */
IDEM_EXTERN void idem_watchdog_stop(idem_watch *w);

/* ------------------------------------------------------------------------- */
/* Layer 3: records.
 *
 * One record per (space, key), created by the first idem_record_begin(); the
 * store's unique constraint decides who is first, never a read. States:
 *
 *   PROCESSING  someone executes; owner and epoch say who; lease_until says
 *               until when its claim is good
 *   SUCCEEDED   done; result stored and replayed to every later begin
 *   FAILED      done and failed for good; result replayed like SUCCEEDED
 *   RELEASED    failed in a way that may be retried: the next begin executes
 *   any other   a state of the user's own machine, reached by transition
 *
 * The full state machine is drawn in lib/record/record_state.c. */

#define IDEM_STATE_PROCESSING "PROCESSING"
#define IDEM_STATE_SUCCEEDED "SUCCEEDED"
#define IDEM_STATE_FAILED "FAILED"
#define IDEM_STATE_RELEASED "RELEASED"

typedef struct idem_record {
    char state[IDEM_NAME_MAX + 1];
    uint64_t epoch;          /* claim number: the first claim's is the clock at
                                creation (ms), +1 per re-claim; so it never
                                repeats for a key, even after a purge */
    char owner[IDEM_KEY_MAX + 1]; /* who claimed it last */
    int64_t lease_until_ms;  /* PROCESSING: claim good until */
    int64_t created_ms, updated_ms;
    int64_t expires_ms;      /* 0 while PROCESSING: never expires then */
    int has_fingerprint;
    uint8_t fingerprint[IDEM_FINGERPRINT_LEN];
    void *result;            /* stored result bytes, or NULL; owned */
    size_t result_len;
} idem_record;

/* Free what a record holds (its result) and zero it. NULL is a no-op. */
IDEM_EXTERN void idem_record_clear(idem_record *rec);

/* 1 if a record in this state is finished: its result is final, and every
 * later begin is answered DONE with it (SUCCEEDED, FAILED, or a state of the
 * user's own); 0 for PROCESSING and RELEASED, which a begin may claim. */
IDEM_EXTERN int idem_record_finished(const char *state);

/* Claim (space, key) for execution.
 * fingerprint: SHA-256 of the request's identifying content, or NULL to skip
 * the payload check. lease_ms (1 ms .. 1 day): how long the claim holds
 * without completion before another caller may take it over.
 * *out:
 *   NEW         the caller executes; rec->epoch is its claim (a new record's
 *               first epoch, or the next epoch when re-claiming RELEASED —
 *               whatever fingerprint RELEASED had: the record takes this
 *               one, since a released attempt keeps no answer — or a
 *               finished record whose retention has run out, which is as
 *               good as purged)
 *   TAKEN_OVER  a PROCESSING record whose lease ran out was re-claimed for the
 *               caller, epoch + 1; the caller executes; the old owner's
 *               complete/fail will be refused
 *   IN_PROGRESS someone else executes; rec has owner and lease_until_ms
 *   DONE        rec holds the final state and the stored result
 *   MISMATCH    the key exists, not RELEASED, with another fingerprint;
 *               nothing changed
 * rec (may be NULL) receives the record as it stands after the call; release
 * it with idem_record_clear(). */
IDEM_EXTERN idem_rc idem_record_begin(idem *h, const char *space,
                                      const char *key,
                                      const uint8_t *fingerprint,
                                      const char *owner, int64_t lease_ms,
                                      idem_outcome *out, idem_record *rec);

/* Finish the claim with the given epoch: PROCESSING -> SUCCEEDED, storing
 * result (len bytes, at most the handle's result_max; NULL with len 0 for
 * none). retention_ms: how long the record is kept (0: the handle default).
 * *out: COMPLETED, or CONFLICT when the record is not PROCESSING with that
 * epoch any more (taken over, or finished) — nothing is changed, and the
 * conflict is counted in idem_stats. NOT_FOUND if there is no record. */
IDEM_EXTERN idem_rc idem_record_complete(idem *h, const char *space,
                                         const char *key, uint64_t epoch,
                                         const void *result, size_t len,
                                         int64_t retention_ms,
                                         idem_outcome *out);

/* Extend the claim with the given epoch: lease_until becomes now + lease_ms,
 * so a long execution is not taken over while it is alive (the gateway calls
 * this every lease/3 while its upstream call runs). *out: RENEWED, CONFLICT
 * (not PROCESSING at that epoch: taken over or finished — counted and
 * logged), or NOT_FOUND. */
IDEM_EXTERN idem_rc idem_record_extend(idem *h, const char *space,
                                       const char *key, uint64_t epoch,
                                       int64_t lease_ms, idem_outcome *out);

typedef enum idem_fail_mode {
    IDEM_FAIL_FINAL = 0,     /* -> FAILED: the result is replayed from now on */
    IDEM_FAIL_RETRYABLE = 1, /* -> RELEASED: the next begin executes again */
} idem_fail_mode;

/* Finish the claim as failed; like idem_record_complete() otherwise. */
IDEM_EXTERN idem_rc idem_record_fail(idem *h, const char *space,
                                     const char *key, uint64_t epoch,
                                     idem_fail_mode mode, const void *result,
                                     size_t len, int64_t retention_ms,
                                     idem_outcome *out);

/* Move the record from state `from` to state `to` if it is in `from`
 * (UPDATE ... WHERE state = from). *out: APPLIED; ALREADY when it is in `to`
 * already (an idempotent success); CONFLICT when it is in another state,
 * which current (if not NULL, IDEM_NAME_MAX + 1 bytes) receives — counted in
 * idem_stats; NOT_FOUND. Moving into or out of PROCESSING is IDEM_EINVAL:
 * claims are made by begin and finished by complete/fail, with their epoch. */
IDEM_EXTERN idem_rc idem_record_transition(idem *h, const char *space,
                                           const char *key, const char *from,
                                           const char *to, idem_outcome *out,
                                           char *current);

/* Read a record. *out: FOUND (rec filled; clear it) or NOT_FOUND. */
IDEM_EXTERN idem_rc idem_record_get(idem *h, const char *space,
                                    const char *key, idem_outcome *out,
                                    idem_record *rec);

/* Delete up to limit records whose retention has run out; never a
 * PROCESSING record. *purged receives how many went. */
IDEM_EXTERN idem_rc idem_record_purge(idem *h, unsigned limit,
                                      unsigned *purged);

/* Delete a finished record so that its key executes again: the next begin
 * creates it anew. Guarded by the epoch the caller last saw, so a record
 * that moved on since (re-claimed, purged and created again) is never
 * touched. *out: APPLIED (deleted); CONFLICT when it is PROCESSING (a claim
 * in flight is never forgotten: finish it first) or at another epoch —
 * current (if not NULL, IDEM_NAME_MAX + 1 bytes) receives its state and
 * *current_epoch (if not NULL) its epoch; NOT_FOUND. */
IDEM_EXTERN idem_rc idem_record_delete(idem *h, const char *space,
                                       const char *key, uint64_t epoch,
                                       idem_outcome *out, char *current,
                                       uint64_t *current_epoch);

/* As idem_record_delete, and only if the record is still as the caller read
 * it: last written at updated_ms (its idem_record or listing's updated_ms,
 * > 0). An operator's delete: a record written since at the same epoch (a
 * claim marked failed or released by someone else, a transition) answers
 * CONFLICT and stays, rather than being deleted for what it no longer
 * is. */
IDEM_EXTERN idem_rc idem_record_delete_seen(idem *h, const char *space,
                                            const char *key, uint64_t epoch,
                                            int64_t updated_ms, idem_outcome *out,
                                            char *current, uint64_t *current_epoch);

/* Listing records, for operators: which claims are in flight, which are
 * held, what a key prefix holds. A page at a time, newest first (by
 * created_ms, then key, both descending), with a keyset cursor: a page
 * starts after the last row of the one before, so rows created meanwhile
 * (which sort first) never shift a page, and no row is listed twice.
 *
 * The space is required: records are kept, and indexed, per space. The
 * key prefix matches bytes literally (a '%' or '_' in it is that
 * character, never a wildcard) and is served from the primary key; a
 * state of PROCESSING from an index of its own, so in-flight claims are
 * found without reading finished records. */
#define IDEM_LIST_LIMIT_DEFAULT 50
#define IDEM_LIST_LIMIT_MAX 500
#define IDEM_CURSOR_MAX 544    /* a cursor's length, without its NUL */
#define IDEM_RESULT_HEAD 16    /* bytes of each result listed */

typedef struct idem_record_query {
    const char *space;          /* required */
    const char *key_prefix;     /* NULL or "": any key; else 1..IDEM_KEY_MAX bytes */
    const char *state;          /* NULL: any state */
    int64_t created_before_ms;  /* 0: no bound; else created_ms < it */
    int64_t created_after_ms;   /* 0: no bound; else created_ms > it */
    int64_t min_lease_span_ms;  /* 0: any; else lease_until_ms - updated_ms > it
                                   (a claim extended further than a lease) */
    unsigned limit;             /* 0: IDEM_LIST_LIMIT_DEFAULT; at most _MAX */
    const char *cursor;         /* NULL or "": the first page; else a page's
                                   next_cursor, with the same query */
} idem_record_query;

/* A listed record: idem_record's fields, with the first bytes of its result
 * in place of the result. */
typedef struct idem_record_item {
    char key[IDEM_KEY_MAX + 1];
    char state[IDEM_NAME_MAX + 1];
    uint64_t epoch;
    char owner[IDEM_KEY_MAX + 1];
    int64_t lease_until_ms;
    int64_t created_ms, updated_ms;
    int64_t expires_ms;         /* 0: never expires (PROCESSING) */
    size_t result_len;          /* the whole result's, 0 for none */
    unsigned char result_head[IDEM_RESULT_HEAD]; /* its first bytes */
    size_t result_head_len;
} idem_record_item;

typedef struct idem_record_page {
    idem_record_item *items;    /* count of them, owned; idem_record_page_clear */
    size_t count;
    char next_cursor[IDEM_CURSOR_MAX + 1]; /* "": this was the last page */
} idem_record_page;

/* One page of the records q matches. IDEM_EINVAL naming the field for a
 * bad query (a cursor that is not one this function made, among them);
 * IDEM_ENOTSUP when the store cannot list. On IDEM_OK, release out with
 * idem_record_page_clear(). */
IDEM_EXTERN idem_rc idem_record_list(idem *h, const idem_record_query *q,
                                     idem_record_page *out);

/* Free what a page holds and zero it. NULL is a no-op. */
IDEM_EXTERN void idem_record_page_clear(idem_record_page *page);

/* ------------------------------------------------------------------------- */
/* Layer 3, its second half: the business's own state machine on a key.
 *
 * A payment channel's status callbacks name the state an event moves a key
 * to (refund RF-1 to SUCCESS), arrive more than once, out of order, and now
 * and then contradicting each other. A machine says which moves exist; a
 * step is one event, and the record of the key holds its current state
 * and the answer kept with it:
 *
 *   to reachable from the current state   the caller executes, once (NEW)
 *   to is the current state               its kept answer (DONE)
 *   to is behind the current state        nothing to do (STALE)
 *   neither (SUCCESS after FAILED)        the alert branch (CONFLICT)
 *
 * A key with no record is in the machine's initial state; an event naming
 * the initial state for it is its first event, executed like any move.
 * The machine must be acyclic, so that "ahead" and "behind" mean one thing.
 *
 * A stepped record's state is IDEM_STEP_PREFIX and the business state
 * ("state:SUCCESS"), so that it never reads as one of Idem's own (a business
 * state may well be called PROCESSING); while a move is executed it is
 * PROCESSING, with an epoch and a lease as any claim, and the state it came
 * from is kept with it. Its result holds the current state, the last
 * IDEM_STEPS_KEPT moves and the answer kept with the current state:
 * idem_record_steps() reads them. Use a space for stepped keys only. */

#define IDEM_STEP_PREFIX "state:"
#define IDEM_STEP_NAME_MAX 48      /* a business state: 1..48 of [A-Za-z0-9_.-] */
#define IDEM_MACHINE_STATES_MAX 64
#define IDEM_STEPS_KEPT 8

typedef struct idem_machine idem_machine;

typedef enum idem_step_relation {
    IDEM_STEP_AHEAD,   /* to is reachable from the current state */
    IDEM_STEP_SAME,    /* to is the current state */
    IDEM_STEP_BEHIND,  /* the current state is reachable from to */
    IDEM_STEP_APART,   /* neither: the two contradict each other */
    IDEM_STEP_UNKNOWN, /* one of them is not a state of the machine */
} idem_step_relation;

/* A machine whose keys start in `initial`. Add its moves with
 * idem_machine_allow(), then seal it; a sealed machine is read-only and may
 * be shared by any threads. */
IDEM_EXTERN idem_rc idem_machine_new(const char *initial, idem_machine **out);
/* Allow the move from -> to (either may be new). IDEM_EINVAL for a bad
 * name or a sealed machine, IDEM_EFULL past IDEM_MACHINE_STATES_MAX. */
IDEM_EXTERN idem_rc idem_machine_allow(idem_machine *m, const char *from, const char *to);
/* Check and seal: IDEM_EINVAL, naming the states, for a cycle, an initial
 * state with no way out, or a state that cannot be reached from it (a
 * misspelt name, most often). */
IDEM_EXTERN idem_rc idem_machine_seal(idem_machine *m);
IDEM_EXTERN void idem_machine_free(idem_machine *m);
/* 1 if state is one of the machine's. */
IDEM_EXTERN int idem_machine_has(const idem_machine *m, const char *state);
IDEM_EXTERN const char *idem_machine_initial(const idem_machine *m);
/* Where `to` stands from `from`, on a sealed machine. */
IDEM_EXTERN idem_step_relation idem_machine_relation(const idem_machine *m, const char *from,
                                                     const char *to);
/* 1 if a and b have the same states, initial state and moves. */
IDEM_EXTERN int idem_machine_equal(const idem_machine *a, const idem_machine *b);

/* One event for (space, key) that moves it to `to`, a state of the sealed
 * machine m (which must outlive the call). *out:
 *   NEW         the caller executes the move; rec->epoch is its claim and
 *               idem_record_steps(rec) names the state it moves from ("":
 *               the initial state). Finish with idem_record_step_complete
 *               (the answer is kept and the key is in `to`) or
 *               idem_record_step_release (it stays where it was).
 *   TAKEN_OVER  as NEW, over a claim whose lease ran out
 *   IN_PROGRESS another move of the key is being executed
 *   DONE        `to` is the current state: the answer kept with it is in
 *               rec (idem_record_steps)
 *   STALE       `to` is behind the current state: nothing to do
 *   CONFLICT    `to` contradicts the current state (counted, logged)
 *   MISMATCH    `to` is the current state, reached with another fingerprint
 * For every outcome rec (may be NULL) receives the record as it stands. */
IDEM_EXTERN idem_rc idem_record_step(idem *h, const idem_machine *m, const char *space,
                                     const char *key, const char *to,
                                     const uint8_t *fingerprint, const char *owner,
                                     int64_t lease_ms, idem_outcome *out, idem_record *rec);
/* Finish the claim at epoch: the key moves to `to` (the state it was
 * claimed for) and keeps result as that state's answer, and the record
 * takes fingerprint (NULL: keeps its own), in one conditional update on the
 * claim. *out: COMPLETED, CONFLICT (the claim is gone), NOT_FOUND. */
IDEM_EXTERN idem_rc idem_record_step_complete(idem *h, const char *space, const char *key,
                                              uint64_t epoch, const char *to,
                                              const uint8_t *fingerprint, const void *result,
                                              size_t len, int64_t retention_ms,
                                              idem_outcome *out);
/* Give the claim at epoch up: the key goes back to the state it was in,
 * with its answer (a key that had none is RELEASED, as a new one). *out:
 * RELEASED, CONFLICT, NOT_FOUND. */
IDEM_EXTERN idem_rc idem_record_step_release(idem *h, const char *space, const char *key,
                                             uint64_t epoch, int64_t retention_ms,
                                             idem_outcome *out);

typedef struct idem_step_view {
    char state[IDEM_NAME_MAX + 1]; /* the current business state; "" when the
                                      key has none yet (the initial state) */
    unsigned count;                /* moves kept, oldest first */
    struct {
        char state[IDEM_NAME_MAX + 1];
        int64_t at_ms;
        uint64_t epoch;
    } steps[IDEM_STEPS_KEPT];
    const void *result;            /* the current state's answer: points into
                                      the record read; NULL when none */
    size_t result_len;
} idem_step_view;

/* Read a stepped record's state, moves and answer. IDEM_EINVAL when rec's
 * result is not a stepped record's (v->state is then ""). */
IDEM_EXTERN idem_rc idem_record_steps(const idem_record *rec, idem_step_view *v);

/* ------------------------------------------------------------------------- */
/* Asynchronous calls, on the caller's event loop (idem/loop.h: the loop
 * interface, and the rule every call here keeps — an error returned means
 * no callback; IDEM_OK means exactly one, on the loop's thread, after the
 * call has returned, with the answer and the error's detail as arguments).
 *
 * Each is the blocking call of the same name, answering through cb instead
 * of out-parameters; the arguments are copied, and need not outlive the
 * call. They return IDEM_OK, an argument's IDEM_EINVAL (as the blocking
 * call would), or IDEM_ENOMEM; everything the store says comes to cb. Any
 * thread may call them for any loop. On the embedded store a token or lock
 * call runs at once, in memory, and its callback is posted; a record call
 * is a job of the store's writer thread, whose batch posts each of its
 * callbacks once it is durable. On the distributed store token and lock
 * calls are Redis commands on a connection of the loop's own, and record
 * calls are jobs of the PostgreSQL writers. */

typedef void (*idem_outcome_fn)(void *arg, idem_rc rc, idem_outcome out, const char *detail);
/* spent_key: what idem_token_consume's would receive ("" when none). */
typedef void (*idem_spend_fn)(void *arg, idem_rc rc, idem_outcome out, const char *spent_key,
                              const char *detail);
typedef void (*idem_lock_fn)(void *arg, idem_rc rc, idem_outcome out,
                             const idem_lock_info *info, const char *detail);
/* rec: the record, valid during the call; to keep it, copy *rec and zero
 * it, and its result is the callback's to idem_record_clear(). */
typedef void (*idem_record_fn)(void *arg, idem_rc rc, idem_outcome out, idem_record *rec,
                               const char *detail);

IDEM_EXTERN idem_rc idem_token_consume_async(idem *h, idem_loop *loop, const char *subject,
                                             const char *scene, const char *token,
                                             const char *biz_key, idem_spend_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_token_give_back_async(idem *h, idem_loop *loop, const char *subject,
                                               const char *scene, const char *token,
                                               const char *biz_key, idem_outcome_fn cb,
                                               void *arg);
IDEM_EXTERN idem_rc idem_lock_acquire_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const char *owner, int64_t ttl_ms,
                                            idem_lock_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_lock_renew_async(idem *h, idem_loop *loop, const char *space,
                                          const char *key, const char *owner, int64_t ttl_ms,
                                          idem_outcome_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_lock_release_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const char *owner,
                                            idem_outcome_fn cb, void *arg);

IDEM_EXTERN idem_rc idem_record_begin_async(idem *h, idem_loop *loop, const char *space,
                                            const char *key, const uint8_t *fingerprint,
                                            const char *owner, int64_t lease_ms,
                                            idem_record_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_record_complete_async(idem *h, idem_loop *loop, const char *space,
                                               const char *key, uint64_t epoch,
                                               const void *result, size_t len,
                                               int64_t retention_ms, idem_outcome_fn cb,
                                               void *arg);
IDEM_EXTERN idem_rc idem_record_fail_async(idem *h, idem_loop *loop, const char *space,
                                           const char *key, uint64_t epoch, idem_fail_mode mode,
                                           const void *result, size_t len, int64_t retention_ms,
                                           idem_outcome_fn cb, void *arg);
/* As idem_record_fail_async, for an action on a claim the caller read but
 * does not hold (an operator's release or mark-failed): a claim that moved
 * on since answers CONFLICT as ever, but that is the caller's view gone
 * stale, not a claim taken over from under its owner: it is logged at INFO
 * and not counted in idem_stats.conflicts, which alert rules watch. */
IDEM_EXTERN idem_rc idem_record_fail_seen_async(idem *h, idem_loop *loop, const char *space,
                                                const char *key, uint64_t epoch,
                                                idem_fail_mode mode, const void *result,
                                                size_t len, int64_t retention_ms,
                                                idem_outcome_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_record_extend_async(idem *h, idem_loop *loop, const char *space,
                                             const char *key, uint64_t epoch, int64_t lease_ms,
                                             idem_outcome_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_record_get_async(idem *h, idem_loop *loop, const char *space,
                                          const char *key, idem_record_fn cb, void *arg);
/* The steps (a machine's events): m must outlive the call. */
IDEM_EXTERN idem_rc idem_record_step_async(idem *h, idem_loop *loop, const idem_machine *m,
                                           const char *space, const char *key, const char *to,
                                           const uint8_t *fingerprint, const char *owner,
                                           int64_t lease_ms, idem_record_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_record_step_complete_async(idem *h, idem_loop *loop, const char *space,
                                                    const char *key, uint64_t epoch,
                                                    const char *to, const uint8_t *fingerprint,
                                                    const void *result, size_t len,
                                                    int64_t retention_ms, idem_outcome_fn cb,
                                                    void *arg);
IDEM_EXTERN idem_rc idem_record_step_release_async(idem *h, idem_loop *loop, const char *space,
                                                   const char *key, uint64_t epoch,
                                                   int64_t retention_ms, idem_outcome_fn cb,
                                                   void *arg);

/* The calls below answer with what their blocking forms put in their
 * out-parameters, and refuse at once exactly the input those refuse.
 *
 * idem_token_issue_async: token is the token issued (IDEM_TOKEN_LEN
 * characters), valid during the call; "" on error. */
typedef void (*idem_token_fn)(void *arg, idem_rc rc, const char *token, const char *detail);
IDEM_EXTERN idem_rc idem_token_issue_async(idem *h, idem_loop *loop, const char *subject,
                                           const char *scene, int64_t ttl_ms,
                                           idem_token_fn cb, void *arg);

/* idem_record_transition_async: out as idem_record_transition's; current
 * is the record's state when out is IDEM_CONFLICT, else "". */
typedef void (*idem_transition_fn)(void *arg, idem_rc rc, idem_outcome out,
                                   const char *current, const char *detail);
IDEM_EXTERN idem_rc idem_record_transition_async(idem *h, idem_loop *loop, const char *space,
                                                 const char *key, const char *from,
                                                 const char *to, idem_transition_fn cb,
                                                 void *arg);

/* idem_record_delete_async: as idem_record_delete; on CONFLICT, current
 * and current_epoch say what stands ("" and 0 otherwise). */
typedef void (*idem_delete_fn)(void *arg, idem_rc rc, idem_outcome out, const char *current,
                               uint64_t current_epoch, const char *detail);
IDEM_EXTERN idem_rc idem_record_delete_async(idem *h, idem_loop *loop, const char *space,
                                             const char *key, uint64_t epoch,
                                             idem_delete_fn cb, void *arg);
IDEM_EXTERN idem_rc idem_record_delete_seen_async(idem *h, idem_loop *loop, const char *space,
                                                  const char *key, uint64_t epoch,
                                                  int64_t updated_ms, idem_delete_fn cb,
                                                  void *arg);

/* idem_record_list_async: q and every string it points to (space,
 * key_prefix, state, cursor) are copied; a cursor that is not one is
 * IDEM_EINVAL at once. page: valid during the call; to keep it, copy *page
 * and zero it, and it is the callback's to idem_record_page_clear(). Empty
 * on error. */
typedef void (*idem_page_fn)(void *arg, idem_rc rc, idem_record_page *page, const char *detail);
IDEM_EXTERN idem_rc idem_record_list_async(idem *h, idem_loop *loop, const idem_record_query *q,
                                           idem_page_fn cb, void *arg);

/* idem_record_purge_async: count is how many records went (0 on error). */
typedef void (*idem_count_fn)(void *arg, idem_rc rc, unsigned count, const char *detail);
IDEM_EXTERN idem_rc idem_record_purge_async(idem *h, idem_loop *loop, unsigned limit,
                                            idem_count_fn cb, void *arg);

/* Let loop go: on the loop's thread, once it no longer runs. Every call
 * made on it is finished (those that wait on the loop itself, Redis
 * commands, fail with IDEM_ECLOSING) and its callback posted; the caller
 * then runs what the loop has posted (idem_libevent_free() does) and frees
 * the loop. A loop never used is a no-op. idem_close() lets every loop go
 * that is still held, so it must come before the loops are freed. */
IDEM_EXTERN void idem_loop_detach(idem *h, idem_loop *loop);

/* ------------------------------------------------------------------------- */
/* The inbox: message consumers.
 *
 * Form 1, in the caller's own transaction. The consumer records the message id
 * in the same SQLite transaction as the business effect: if the business
 * rolls back, so does the claim, and a redelivery is processed again; once it
 * commits, every redelivery is a DUPLICATE to be acked and skipped. The table
 * idem_inbox_claim is created in the caller's database on first use. */

struct sqlite3;

/* db: the caller's connection, with a transaction open (BEGIN issued, not yet
 * committed) — IDEM_ENOTX otherwise. group: the consumer group; biz_type: a
 * label kept for operators (may be NULL). *out: CLAIMED or DUPLICATE. Safe to
 * call from any thread that may use db. Does not need an idem handle. */
IDEM_EXTERN idem_rc idem_inbox_claim_sqlite(struct sqlite3 *db,
                                            const char *group,
                                            const char *msg_id,
                                            const char *biz_type,
                                            idem_outcome *out);

/* The same in the caller's PostgreSQL transaction, on the caller's own
 * connection (a PGconn from libpq): conn must be idle inside a transaction
 * block (PQtransactionStatus() == PQTRANS_INTRANS) — IDEM_ENOTX otherwise.
 * The table idem_inbox_claim is created in the caller's database on first
 * use. IDEM_ESTORE with the server's message if a statement fails (the
 * caller's transaction is then aborted, as PostgreSQL does). */
struct pg_conn;
IDEM_EXTERN idem_rc idem_inbox_claim_pg(struct pg_conn *conn,
                                        const char *group, const char *msg_id,
                                        const char *biz_type,
                                        idem_outcome *out);

/* Form 2, with retries, in Idem's own store. A message moves
 *
 *   RECEIVED -> PROCESSING (lease) -> DONE
 *                   |  ^          \-> FAILED -> PROCESSING ... -> DEAD
 *                   \--/ lease ran out: re-claimed, attempt + 1
 *
 * and after max_attempts failed or abandoned attempts it is DEAD: the caller
 * moves it to a dead-letter queue and acks it. */

typedef struct idem_inbox_entry {
    char state[IDEM_NAME_MAX + 1]; /* RECEIVED PROCESSING DONE FAILED DEAD */
    unsigned attempts;       /* attempts started so far */
    int64_t lease_until_ms;  /* PROCESSING: claim good until */
    char biz_type[IDEM_NAME_MAX + 1];
} idem_inbox_entry;

/* Record that a message arrived. *out: CLAIMED (first time: RECEIVED) or
 * DUPLICATE (entry shows its state). entry may be NULL. */
IDEM_EXTERN idem_rc idem_inbox_receive(idem *h, const char *group,
                                       const char *msg_id,
                                       const char *biz_type,
                                       idem_outcome *out,
                                       idem_inbox_entry *entry);

/* Claim a message for processing (recording it first if it was not
 * received). *out:
 *   PROCESS      the caller processes it now: attempt entry->attempts, lease
 *                lease_ms; finish with idem_inbox_done() or _fail()
 *   DUPLICATE    it is DONE: ack and skip
 *   IN_PROGRESS  another consumer holds an unexpired lease on it
 *   DEAD         attempts exhausted (max_attempts >= 1): dead-letter it
 * entry may be NULL. */
IDEM_EXTERN idem_rc idem_inbox_begin(idem *h, const char *group,
                                     const char *msg_id, const char *biz_type,
                                     int64_t lease_ms, unsigned max_attempts,
                                     idem_outcome *out,
                                     idem_inbox_entry *entry);

/* PROCESSING with this attempt -> DONE. *out: COMPLETED, CONFLICT (not that
 * attempt any more), or NOT_FOUND. */
IDEM_EXTERN idem_rc idem_inbox_done(idem *h, const char *group,
                                    const char *msg_id, unsigned attempt,
                                    idem_outcome *out);

/* PROCESSING with this attempt -> FAILED (*out RETRY_LATER) or, when it was
 * attempt max_attempts, -> DEAD (*out DEAD). CONFLICT or NOT_FOUND as for
 * done. */
IDEM_EXTERN idem_rc idem_inbox_fail(idem *h, const char *group,
                                    const char *msg_id, unsigned attempt,
                                    unsigned max_attempts, idem_outcome *out);

/* Form 3, both: the claim in the caller's own transaction, with an attempt
 * count that outlives its rollback, so a poison message is dead-lettered
 * after max_attempts instead of being redelivered for ever. On the caller's
 * own connection, SQLite or PostgreSQL; no idem handle. For each delivery:
 *
 *   idem_inbox_attempt_*()      before BEGIN, committed on its own:
 *                                 PROCESS, DUPLICATE (ack) or DEAD
 *                                 (dead-letter, then ack)
 *   BEGIN
 *   idem_inbox_settle_*()       first in the transaction: CLAIMED, or
 *                                 DUPLICATE / DEAD (ROLLBACK, then as above)
 *   the business writes
 *   COMMIT, then ack            a failure: ROLLBACK and let the message be
 *                                 redelivered; the next attempt counts it
 *
 * The table idem_inbox_msg, in the caller's database, holds one row per
 * (group, msg_id): state RECEIVED (attempts counted, not done), DONE
 * (settled with a committed business) or DEAD, with attempts and the times
 * in ms of its creation and last change (created_ms, updated_ms). The first
 * attempt on a database creates it. A unique key and conditional updates
 * decide, never a read: of any number of consumers given the same message
 * at once, each is counted an attempt, and exactly one settle commits
 * CLAIMED; the others wait for it (they are writing the same row) and get
 * DUPLICATE, or CLAIMED if it rolled back. A consumer that dies between the
 * calls has used up its attempt: the redelivery is counted as the next.
 * DONE and DEAD are final.
 *
 * The business transaction must be the database's own: PostgreSQL's default
 * READ COMMITTED (under REPEATABLE READ or SERIALIZABLE a settle that waited
 * for another fails with SQLSTATE 40001: roll back and let the message come
 * again), and on SQLite a write transaction from the start (BEGIN
 * IMMEDIATE) with a busy timeout on every connection (sqlite3_busy_timeout),
 * as any SQLite program with several writers needs. */

/* Count a delivery of the message as an attempt, in a statement committed
 * on its own: the connection must have no transaction open (IDEM_EINVAL
 * otherwise). max_attempts: 1..1000. *out:
 *   PROCESS    process it now: entry->attempts is this attempt's number
 *              (1 for the first delivery); settle it inside the business
 *              transaction
 *   DUPLICATE  it is DONE: ack it and skip it
 *   DEAD       max_attempts attempts were counted before this one (or it
 *              was DEAD already): move it to a dead-letter queue and ack it.
 *              Every later delivery is DEAD too, so a dead-letter that was
 *              not acked is dead-lettered again: the dead-letter queue, like
 *              any queue, may see a message twice.
 * entry (may be NULL) receives the message's row as the call left it. On
 * PostgreSQL the call waits while another transaction settles the same
 * message, and answers once it has committed (DUPLICATE) or rolled back
 * (PROCESS). */
IDEM_EXTERN idem_rc idem_inbox_attempt_sqlite(struct sqlite3 *db,
                                              const char *group,
                                              const char *msg_id,
                                              const char *biz_type,
                                              unsigned max_attempts,
                                              idem_outcome *out,
                                              idem_inbox_entry *entry);
IDEM_EXTERN idem_rc idem_inbox_attempt_pg(struct pg_conn *conn,
                                          const char *group,
                                          const char *msg_id,
                                          const char *biz_type,
                                          unsigned max_attempts,
                                          idem_outcome *out,
                                          idem_inbox_entry *entry);

/* Mark the message DONE inside the caller's business transaction, which
 * must be open (BEGIN issued, not committed; on PostgreSQL idle in it) —
 * IDEM_ENOTX otherwise. Call it before the business writes: a concurrent
 * delivery then waits here rather than doing the work twice. *out:
 *   CLAIMED    this transaction marks it DONE: do the business writes and
 *              COMMIT; once committed, every attempt answers DUPLICATE. If
 *              the transaction rolls back, so does the mark
 *   DUPLICATE  another delivery's transaction committed it: ROLLBACK, ack
 *   DEAD       another delivery found the attempts exhausted meanwhile:
 *              ROLLBACK, then as for idem_inbox_attempt_*'s DEAD
 * A message that had no attempt counted is settled as its first. On
 * PostgreSQL the table must exist (an attempt creates it): a settle that
 * finds none fails with IDEM_ESTORE, and, as with any failed statement,
 * the caller's transaction is aborted; SQLite's settle creates it inside
 * the transaction. entry may be NULL. */
IDEM_EXTERN idem_rc idem_inbox_settle_sqlite(struct sqlite3 *db,
                                             const char *group,
                                             const char *msg_id,
                                             const char *biz_type,
                                             idem_outcome *out,
                                             idem_inbox_entry *entry);
IDEM_EXTERN idem_rc idem_inbox_settle_pg(struct pg_conn *conn,
                                         const char *group,
                                         const char *msg_id,
                                         const char *biz_type,
                                         idem_outcome *out,
                                         idem_inbox_entry *entry);

/* Delete up to limit rows of idem_inbox_msg whose last change is
 * retention_ms (1 ms .. 3650 days) or more in the past, in whatever state:
 * a DONE message delivered again after its row went is processed again, so
 * retention must outlast every redelivery the queue may make; a RECEIVED
 * row that old only loses its count. On PostgreSQL rows held by a
 * transaction still open are left for the next purge, so a purge never
 * waits for a consumer. *purged receives how many went (0 when the
 * database has no table yet). In the caller's transaction if one is open,
 * else on its own. */
IDEM_EXTERN idem_rc idem_inbox_purge_sqlite(struct sqlite3 *db,
                                            int64_t retention_ms,
                                            unsigned limit, unsigned *purged);
IDEM_EXTERN idem_rc idem_inbox_purge_pg(struct pg_conn *conn,
                                        int64_t retention_ms, unsigned limit,
                                        unsigned *purged);

/* ------------------------------------------------------------------------- */
/* Counters, for operators. Monotonic since idem_open(). */

typedef struct idem_stats {
    uint64_t conflicts;      /* complete/fail/transition/inbox refused: alerts */
    uint64_t takeovers;      /* abandoned records re-claimed */
    uint64_t commits;        /* durable transactions (fsyncs) */
    uint64_t committed_ops;  /* writes carried by those transactions */
} idem_stats;

IDEM_EXTERN void idem_get_stats(idem *h, idem_stats *out);

/* What the store's server promises about a commit it has acknowledged when
 * its primary is lost and a standby promoted (the distributed store's
 * PostgreSQL): read when each connection to the primary is made, so a
 * failover to a new primary is read again. synchronous is 1 when every
 * acknowledged commit is on a synchronous standby too
 * (synchronous_standby_names names one, and synchronous_commit is on or
 * remote_apply); 0 when a failover can lose acknowledged commits, and why
 * says why. known 0: the store has no replication (the embedded one, a
 * single file), or it was not read yet. */
typedef struct idem_replication {
    int known;
    int synchronous;
    char synchronous_commit[32];
    char synchronous_standby_names[256];
    char why[512];
} idem_replication;

IDEM_EXTERN void idem_get_replication(idem *h, idem_replication *out);

/* How long the durable transactions took, from a batch's first statement to
 * its durable COMMIT (the fsync included; on the distributed store, every
 * round trip to PostgreSQL of the batch), as a histogram: hist[i] counts
 * those that took more than idem_commit_bucket_us(i - 1) and at most
 * idem_commit_bucket_us(i) microseconds; the last bucket has no bound. A
 * rising commit time is the disk (or PostgreSQL) slowing down: every durable
 * write waits for one. (A struct and a call of their own: idem_stats keeps
 * its size for programs built against an earlier libidem.) */
#define IDEM_COMMIT_BUCKETS 16

typedef struct idem_commit_times {
    uint64_t commits;                   /* as idem_stats.commits, at the same instant */
    uint64_t us;                        /* their durations, summed, in microseconds */
    uint64_t hist[IDEM_COMMIT_BUCKETS]; /* their durations, bucketed */
} idem_commit_times;

IDEM_EXTERN void idem_get_commit_times(idem *h, idem_commit_times *out);

/* The upper bound of hist[i] in microseconds: 100 us to 10 s, and
 * UINT64_MAX for the last bucket (and past it). */
IDEM_EXTERN uint64_t idem_commit_bucket_us(unsigned i);

/* How many writes the durable transactions carried, as a histogram:
 * hist[i] counts those that carried more than idem_commit_batch_bound(i -
 * 1) and at most idem_commit_batch_bound(i) writes; the last bucket has no
 * bound. Group commit at work: under load many writes share a commit, and
 * batches of one mean each write pays for its own fsync. (A struct and a
 * call of their own, as idem_commit_times.) */
#define IDEM_BATCH_BUCKETS 12

typedef struct idem_commit_batches {
    uint64_t commits;                  /* as idem_stats.commits, at the same instant */
    uint64_t ops;                      /* as idem_stats.committed_ops */
    uint64_t hist[IDEM_BATCH_BUCKETS]; /* their sizes, bucketed */
} idem_commit_batches;

IDEM_EXTERN void idem_get_commit_batches(idem *h, idem_commit_batches *out);

/* The upper bound of the batches' hist[i] in writes: 1, 2, 4 ... 1024, and
 * UINT64_MAX for the last bucket (and past it). */
IDEM_EXTERN uint64_t idem_commit_batch_bound(unsigned i);

#ifdef __cplusplus
}
#endif
#endif
