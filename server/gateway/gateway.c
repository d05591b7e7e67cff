/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gateway.c — the three layers in front of an upstream, per route (daemon).
 *
 * A request on a route is a state machine on its event loop (enum
 * gw_state; states[] says what each state does and where it may go, and
 * every change goes through enter()). The loop never blocks: a state's
 * store call runs elsewhere and resumes the request on its loop, where
 * done() — the one transition function — decides what is next:
 *
 *   W_DB   record calls: the library's asynchronous calls on the request's
 *          loop (idem_record_begin_async ...), answered once durable — a
 *          job of the SQLite writer, or of the PostgreSQL writers.
 *   W_KV   token and lock calls, asynchronous on the loop too: in memory
 *          on the embedded store, answered at once; a Redis command on the
 *          loop's own connection on the distributed one.
 *
 * No thread of ours waits on a store, and the gateway never asks which
 * store it runs on: every call answers the same way.
 *
 * The waits are the request's timer, and the upstream exchange runs on the
 * loop itself (upstream.c). Every way out answers the client exactly once,
 * in S_DONE:
 *
 *   S_NEW  key, subject, fingerprint ── missing/invalid ──────────► 400
 *        │   (no token layer: a record finished a moment ago is replayed
 *        │    from the loop's replay cache, before any state)
 *   S_READ   no token layer, while such reads find any: finished? ─► replay
 *   S_TOKEN  consume Idem-Token ── unknown, or spent on another key ► 409
 *        │   Redis down (layers 1 and 2): on_redis_down skip ── the layer is
 *        │   skipped, logged, counted; reject ── 503
 *        │   (spent on this same key: a late retry, go on; if it gets to
 *        │    execute, it takes the token again first: S_RESPEND)
 *   S_LOCK   acquire ── busy ── S_LOCK_READ: finished? ── yes ─► replay
 *        │        ▲                       └── no: reject ──────► 409 + Retry-After
 *        │        └──── S_LOCK_WAIT (backoff) ◄─ wait ─────────┘ until wait_timeout
 *        │   acquired, the lease timer renews it until S_CLEANUP
 *   S_BEGIN  begin ── DONE ───────────────────────────────────────► replay (Idempotent-Replayed)
 *        │     ├── MISMATCH, or claimed here with another payload ► 422
 *        │     └── IN_PROGRESS, or claimed here: reject ──────────► 409
 *        │           or S_BEGIN_WAIT (backoff) and S_BEGIN again
 *        │   NEW / TAKEN_OVER: we hold the claim (epoch), durably
 *        │   (TAKEN_OVER on an on_unknown_outcome: hold route: held ──► 409;
 *        │    past a consumer's max_attempts: released, not sent ───► 502)
 *   S_FORWARD  upstream, on the loop (the timer extends the claim's lease
 *        │   every lease/3, as a record call of its own)
 *        ├── a status kept (store_statuses; by default < 500, and 5xx with
 *        │   on_upstream_5xx: store) ─► S_FINISH: complete/fail(final) with the stored answer
 *        ├── any other status ──► token back, S_FINISH: fail(retryable) ► the answer as is
 *        ├── not sent (refused) ► token back, S_FINISH: fail(retryable) ► 502 upstream_unreachable
 *        │   (token back: S_CONFIRM that the claim is ours, then S_GIVE_BACK;
 *        │    see finish_record)
 *        ├── sent, no answer ───► record stays PROCESSING ─────────────► 504 outcome_unknown
 *        └── answer too big ────► S_FINISH: fail(final) with a 502 problem (it did execute)
 *        (a finish the store fails, but a release: the claim, lock and client
 *         are kept, S_FINISH_WAIT, and the finish written again until it is
 *         kept — S_FINISH_READ when a retry is refused; see "claims held here")
 *   S_CLEANUP  stop the lease timer, release the lock
 *   S_DONE     answer
 *
 * Store trouble in any state before S_FORWARD is 503, and the request is
 * never forwarded without its record claimed: S_FORWARD follows only a
 * begin whose call reported success (or S_RESPEND after one), which on the
 * embedded store means its batch is durable.
 *
 * If the daemon stops while a request is parked (its upstream exchange, a
 * wait), or its store call comes back after the loops stopped, it is
 * abandoned: its lease timer stopped and its lock released, nothing else. A
 * claimed record stays PROCESSING until its lease ends, as after a crash;
 * the client is told 504 outcome_unknown if the request was forwarded, 503
 * shutting_down if not.
 */
#include "gateway/gateway.h"

#include <assert.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "core/hint.h"
#include "gateway/replay_cache.h"
#include "gateway/resolve_config.h"
#include "gateway/request_key.h"
#include "gateway/signature.h"
#include "gateway/states_config.h"
#include "gateway/stored.h"
#include "http/upstream.h"
#include "log.h"
#include "mono.h"
#include "put.h"
#include "telemetry/access_log.h"
#include "telemetry/incidents.h"

/* A gateway counter: the route's (the daemon's totals are their sums). */
#define COUNT(rt, field) atomic_fetch_add(&(rt)->n->field, 1)

/* What a line of the daemon's log is about (its fields in the JSON log):
 * the request's route, space, key, request id and claim; a renewal's
 * space, key and claim. */
#define ABOUT(g) about_of((g), &(struct log_about){0})
#define TIMER_ABOUT(t)                                                                  \
    (&(struct log_about){.space = (t)->space, .key = (t)->key, .epoch = (t)->epoch})

/* The verdict a request's answer carries (enum gw_outcome). */
#define VERDICT(g, v) ((g)->req->outcome = (v))

/* ---- the request's state ---- */

/* How long on_unknown_outcome: hold keeps a claim: retention, and no more
 * than the longest lease a record takes (a day, idem.h) — but never less
 * than the lease, which expire would have kept it for. */
static int64_t hold_ms(const struct route *rt)
{
    const int64_t day = 24 * 3600 * 1000LL;
    int64_t ms = rt->retention_ms < day ? rt->retention_ms : day;
    return ms > rt->lease_ms ? ms : rt->lease_ms;
}

enum finish_kind {
    FINISH_NONE,
    FINISH_COMPLETE,
    FINISH_FAIL_FINAL,
    FINISH_FAIL_RETRYABLE,
    FINISH_HOLD, /* outcome unknown, on_unknown_outcome: hold: PROCESSING for retention */
};

/* What claimed_here() found for a request's key among this daemon's
 * other requests. */
enum held_here {
    HELD_NONE = 0,      /* no other request here claims it */
    HELD_RUNNING,       /* another request here runs it */
    HELD_UNKEPT,        /* another request here ran it, and its answer waits to be kept */
    HELD_OTHER_PAYLOAD, /* another request here runs it with another payload */
};

/* Where a request is (g->state). A state is one piece of work under way —
 * a store call off the loop (kv: token and lock calls; db: record calls),
 * a wait on the request's timer, or the upstream exchange — and done() is
 * the one place that decides, when that work comes back, which state is
 * next; every change goes through enter(). */
enum gw_state {
    S_NEW,         /* keyed and fingerprinted, no store touched yet */
    S_READ,        /* db: is the record finished already? (no token layer,
                      and only while such reads find any: core/hint.h) */
    S_TOKEN,       /* kv: spending the Idem-Token on the key */
    S_LOCK,        /* kv: acquiring the business-key lock; acquired, the
                      lease timer renews it until S_CLEANUP */
    S_LOCK_READ,   /* db: the lock is busy: is the record finished already? */
    S_LOCK_WAIT,   /* timer: backing off before acquiring again */
    S_BEGIN,       /* db: claiming the record; a key claimed by another
                      request here is decided without the store (held_here) */
    S_BEGIN_WAIT,  /* timer: the key is in flight: backing off before
                      beginning again */
    S_RESPEND,     /* kv: claimed on a token another request spent on this
                      key: spending it again before executing (after_reconsume) */
    S_FORWARD,     /* the upstream has it, under our claim (epoch); the
                      lease timer extends the claim's lease too */
    S_RESOLVE,     /* on_unknown_outcome: resolve: the status query of a claim
                      taken over, under our claim (see "resolving") */
    S_CONFIRM,     /* db: releasing with a token spent: is the claim still
                      ours? (finish_record) */
    S_GIVE_BACK,   /* kv: giving the token back, before the release */
    S_FINISH,      /* db: the record completed, failed, released or held */
    S_FINISH_WAIT, /* timer: the finish failed: the claim, lock and client
                      kept until it is written (see "claims held here") */
    S_FINISH_READ, /* db: a finish tried again was refused: did an earlier
                      try get written after all? */
    S_CLEANUP,     /* kv: the lock released (the lease timer stopped first) */
    S_DONE,        /* answered: g is freed */
};

struct gw {
    struct front_request *req;
    struct daemon *d;
    struct live_config *lc;  /* held until the answer: rt points into it */
    const struct route *rt;
    const char *subject;     /* "" when absent; these two point into req->msg */
    const char *token;
    char key[IDEM_KEY_MAX + 1];
    char owner[64];
    char spent[IDEM_KEY_MAX + 1];
    /* states: the state the request moves its key to, and, once it holds
     * the claim, the one it moves it from (see "states"). */
    char to[IDEM_NAME_MAX + 1];
    char from[IDEM_NAME_MAX + 1];
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    int has_fp;
    int token_spent, locked;
    int renewing; /* the lock is ours: the lease timer renews it */
    int token_rode; /* went on with a token spent on this key by another request */
    int64_t deadline, backoff_ms;
    unsigned long replay_gen; /* the daemon's, when the request came */
    int64_t t0;               /* mono_us() when it came */

    /* Where it is, and what the last store call found. */
    enum gw_state state;
    idem_rc rc;
    idem_outcome o;
    char detail[256];
    idem_record rec;

    uint64_t epoch;            /* our claim, from begin */
    int resolver;              /* made by resolver.c to ask about a claim: no client */
    unsigned question;         /* resolving: which status query of the key this is */
    int64_t created_ms;        /* resolving: the key's first claim, for give_up */
    int64_t hold_for_ms;       /* FINISH_HOLD for this long (0: hold_ms) */
    int64_t sent_us;           /* mono_us() when the upstream call started */
    unsigned attempt;          /* which claim of the key this is (see "attempts") */
    int forwarded;             /* the upstream may have it */
    struct event *timer;       /* a wait (in g's block) */
    struct event *lease;       /* renews what it holds (see "leases"; in g's block) */
    struct renewal *extending; /* the claim's latest extension in flight, told if
                                  it finds the claim gone (see "leases") */
    struct upstream_call *call;
    enum finish_kind finish;
    char *stored;              /* what the record is finished with */
    size_t stored_len;
    int64_t expires_ms;        /* when the kept answer's record expires, at the
                                  latest (wall clock; Idempotency-Key-Expires) */
    struct http_response *out; /* the answer */
    /* Our claim, on the daemon's list from the begin that made it to the
     * answer (see "claims held here"); unkept while the store fails to keep
     * its answer, trying again every retry_ms. held_here: the begin found
     * the key claimed by another request of this daemon. */
    int claimed, unkept;
    enum held_here held_here;
    struct gw *claim_next;
    uint64_t key_hash; /* of space and key: the list is scanned by it */
    unsigned tries;
    int64_t retry_ms;
};

static const struct log_about *about_of(const struct gw *g, struct log_about *a)
{
    a->route = g->rt->name;
    a->space = g->rt->space;
    a->key = g->key[0] ? g->key : NULL;
    a->request_id = !g->resolver && g->req && g->req->request_id[0] ? g->req->request_id : NULL;
    a->epoch = g->epoch;
    return a;
}

static void claim_remove(struct gw *g);
static void extending_forget(struct gw *g);

static void gw_free(struct gw *g)
{
    claim_remove(g); /* other threads look at the list */
    extending_forget(g);
    event_del(g->timer); /* in g's own block */
    event_del(g->lease);
    idem_record_clear(&g->rec);
    free(g->stored);
    response_free(g->out);
    daemon_config_put(g->lc);
    free(g);
}

/* ---- claims held here ----
 *
 * A request that claimed its key (a begin that answered NEW or TAKEN_OVER)
 * is on the daemon's list until it is answered, and no other request for
 * that key is begun in this daemon meanwhile: it is in flight here (409, or
 * a wait), whatever the record's lease says. The list is looked at on the
 * loop, before a begin is asked of the store (enter, S_BEGIN), and a begin
 * that claims the key joins it when its answer comes back (on_begun): two
 * begins of one key in flight together are the store's to tell apart, as
 * its unique key does for any two, and the second finds the first's claim
 * with its lease running.
 *
 * That matters when the lease runs out under a live claim. The upstream
 * has executed and answered, and the write that finishes the record fails
 * (a full disk, an I/O error, the store unreachable); the lease extensions
 * fail as well. The claim must not end then: the next duplicate would take
 * the record over and execute again. So the request keeps its claim, its
 * lock and its client, and writes the finish again, every 100 ms at first,
 * then every 2 s, until the store keeps it (unkept meanwhile); its client
 * gets the answer then, the kept one. A daemon that stops before the answer
 * is kept gives its client the upstream's answer and leaves the record
 * PROCESSING until its lease ends, as a crash would. The list is this
 * daemon's: on the distributed store another instance can still take such
 * a claim over once its lease ends (the lock layer keeps it out while Redis
 * works). */

/* The list, and whether the read for finished records pays off, are what the
 * gateway shares across its loops. */
struct gateway {
    /* The keys claimed by this daemon's requests, from their begin to their
     * answer, by the hash of space and key; unkept_count: those whose
     * answer the store failed to keep. */
    pthread_mutex_t claims_mu;
    struct gw *claims[1024];
    atomic_ulong unkept_count;
    /* Whether the read for finished records pays off lately. */
    struct idem__hint reads;
};

struct gateway *gateway_new(void)
{
    struct gateway *gw = calloc(1, sizeof *gw);
    if (gw)
        pthread_mutex_init(&gw->claims_mu, NULL);
    return gw;
}

void gateway_free(struct gateway *gw)
{
    if (!gw)
        return;
    pthread_mutex_destroy(&gw->claims_mu);
    free(gw);
}

unsigned long gateway_unkept(struct gateway *gw)
{
    return atomic_load(&gw->unkept_count);
}

static struct gw **claim_bucket(struct gateway *gw, uint64_t hash)
{
    return &gw->claims[hash % (sizeof gw->claims / sizeof gw->claims[0])];
}

static void claim_add(struct gw *g)
{
    struct gateway *gw = g->d->gateway;
    pthread_mutex_lock(&gw->claims_mu);
    struct gw **b = claim_bucket(gw, g->key_hash);
    g->claim_next = *b;
    *b = g;
    g->claimed = 1;
    pthread_mutex_unlock(&gw->claims_mu);
}

static void set_unkept(struct gw *g, int unkept)
{
    struct gateway *gw = g->d->gateway;
    if (g->unkept == unkept)
        return;
    pthread_mutex_lock(&gw->claims_mu);
    g->unkept = unkept;
    if (unkept)
        atomic_fetch_add(&gw->unkept_count, 1);
    else
        atomic_fetch_sub(&gw->unkept_count, 1);
    pthread_mutex_unlock(&gw->claims_mu);
}

static void claim_remove(struct gw *g)
{
    struct gateway *gw = g->d->gateway;
    set_unkept(g, 0);
    if (!g->claimed)
        return;
    pthread_mutex_lock(&gw->claims_mu);
    for (struct gw **p = claim_bucket(gw, g->key_hash); *p; p = &(*p)->claim_next)
        if (*p == g) {
            *p = g->claim_next;
            break;
        }
    g->claimed = 0;
    pthread_mutex_unlock(&gw->claims_mu);
}

/* Is this key claimed by another request of this daemon (enum held_here;
 * another payload: the claim's fingerprint differs, which the record would
 * refuse as well — but on a route with states, where another payload is
 * another event, in flight like any other)? Any thread. */
static enum held_here claimed_here(struct gw *self)
{
    struct gateway *gw = self->d->gateway;
    enum held_here found = HELD_NONE;
    pthread_mutex_lock(&gw->claims_mu);
    for (struct gw *g = *claim_bucket(gw, self->key_hash); g && !found; g = g->claim_next)
        if (g->key_hash == self->key_hash && g != self && strcmp(g->key, self->key) == 0 &&
            strcmp(g->rt->space, self->rt->space) == 0)
            found = g->has_fp && self->has_fp && !self->rt->states &&
                            memcmp(g->fp, self->fp, IDEM_FINGERPRINT_LEN) != 0
                        ? HELD_OTHER_PAYLOAD
                    : g->unkept ? HELD_UNKEPT
                                : HELD_RUNNING;
    pthread_mutex_unlock(&gw->claims_mu);
    return found;
}

/* A problem of Idem's given the text the configuration has for its type
 * (problems:, the route's over the global): every answer of a route passes
 * here on its way out (answer, answer_early), and a problem to be stored
 * before it is, so that its replays are the answer as first given. Stored
 * answers replayed are left as they were stored. Without memory for it, the
 * problem goes with Idem's own text. */
static struct http_response *localise(const struct server_config *cfg, const struct route *rt,
                                      struct http_response *r)
{
    const char *title, *detail;
    if (!r || !r->problem_type[0])
        return r;
    config_problem_text(cfg, rt, r->problem_type, &title, &detail);
    (void)problem_set_text(r, title, detail);
    return r;
}

static void answer(struct gw *g)
{
    counts_observe(g->rt, g->t0);
    struct front_request *req = g->req;
    if (g->out && g->out->problem_type[0]) /* Idem's own problem, not a stored one */
        (void)problem_set_instance(g->out, req->request_id);
    localise(g->lc->c, g->rt, g->out);
    req->resp = g->out;
    g->out = NULL;
    gw_free(g);
    front_answer(req);
}

static void enter(struct gw *g, enum gw_state s);

/* The daemon stops under a parked request: give back what others would wait
 * for (the lock); the record's lease ends on its own. */
static void abandon(struct gw *g)
{
    evtimer_del(g->lease);
    g->renewing = 0;
    if (g->locked) {
        idem_outcome o;
        idem_lock_release(g->d->h, g->rt->space, g->key, g->owner, &o);
    }
    /* An answer already settled (a replay, a 409, the upstream's answer
     * once the record was finished) stands. So does one the store has not
     * kept yet: the record stays PROCESSING until its lease ends, and a
     * client told the real outcome has no reason to retry into that. */
    int executed = g->finish == FINISH_COMPLETE || g->finish == FINISH_FAIL_FINAL ||
                   g->finish == FINISH_HOLD;
    int finishing = g->state == S_FINISH || g->state == S_FINISH_WAIT;
    if (g->out && finishing && g->rc != IDEM_OK && executed) {
        VERDICT(g, GW_OUTCOME_UNKNOWN); /* executed, and not kept */
        daemon_log_about(LOG_INFO, ABOUT(g),
                         "%s/%s: stopping before its answer was kept (%u failed tries): the record "
                         "stays PROCESSING until its lease ends, and a retry then executes again",
                         g->rt->space, g->key, g->tries);
    }
    if (g->out && (!finishing || g->rc == IDEM_OK || executed)) {
        enter(g, S_DONE);
        return;
    }
    response_free(g->out);
    VERDICT(g, g->forwarded ? GW_OUTCOME_UNKNOWN : GW_UNDECIDED);
    if (g->forwarded)
        g->out = problem(504, "outcome_unknown",
                         "the server stopped while the upstream had the request; it may have "
                         "been executed. Its record stays PROCESSING until its lease ends "
                         "(%" PRId64 " ms); retries get 409 until then",
                         g->rt->lease_ms);
    else
        g->out = problem(503, "shutting_down",
                         "the server stopped before the request was forwarded; if its "
                         "record was claimed, it stays PROCESSING until its lease ends");
    enter(g, S_DONE);
}

static void on_abort(struct front_request *req)
{
    struct gw *g = req->state;
    if (g->call)
        upstream_call_cancel(g->call);
    g->call = NULL;
    extending_forget(g);
    abandon(g);
}

/* ---- store calls, off the loop ---- */

static void keep_rc(struct gw *g, idem_rc rc)
{
    g->rc = rc;
    if (rc != IDEM_OK)
        snprintf(g->detail, sizeof g->detail, "%s", idem_errdetail());
}

/* Every store call is one of the library's asynchronous calls, on the
 * request's loop. Its callback runs on the loop, never inside the call
 * that started it (idem/loop.h), so it goes on with the request at once:
 * back(). A start that fails has no callback: start_call() then goes on at
 * once. */

static void back(struct gw *g);

static void on_record(void *arg, idem_rc rc, idem_outcome o, idem_record *rec,
                      const char *detail)
{
    struct gw *g = arg;
    g->rc = rc;
    g->o = o;
    if (rc != IDEM_OK)
        snprintf(g->detail, sizeof g->detail, "%s", detail);
    if (rec) {
        idem_record_clear(&g->rec);
        g->rec = *rec; /* taken: its result is g's now */
        memset(rec, 0, sizeof *rec);
    }
    back(g);
}

static void on_outcome(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    on_record(arg, rc, o, NULL, detail);
}

/* A begin that claimed the key: on the list of claims held here (see
 * enter(), which looked at it before the begin), before anything else of
 * the request runs. */
static void on_begun(void *arg, idem_rc rc, idem_outcome o, idem_record *rec,
                     const char *detail)
{
    struct gw *g = arg;
    if (rc == IDEM_OK && (o == IDEM_NEW || o == IDEM_TAKEN_OVER))
        claim_add(g);
    on_record(arg, rc, o, rec, detail);
}

static idem_loop *loop_of(const struct gw *g)
{
    return ((struct daemon_loop *)g->req->loop_ctx)->iloop;
}

static void on_spent(void *arg, idem_rc rc, idem_outcome o, const char *spent_key,
                     const char *detail)
{
    struct gw *g = arg;
    snprintf(g->spent, sizeof g->spent, "%s", spent_key);
    counts_token(g->rt, rc, o);
    on_outcome(arg, rc, o, detail);
}

static idem_rc do_token(struct gw *g)
{
    return idem_token_consume_async(g->d->h, loop_of(g), g->subject, g->rt->token_scene,
                                    g->token, g->key, on_spent, g);
}

static void on_locked(void *arg, idem_rc rc, idem_outcome o, const idem_lock_info *info,
                      const char *detail)
{
    struct gw *g = arg;
    (void)info;
    counts_lock(g->rt, rc, o);
    on_outcome(arg, rc, o, detail);
}

static idem_rc do_lock(struct gw *g)
{
    const struct route *rt = g->rt;
    return idem_lock_acquire_async(g->d->h, loop_of(g), rt->space, g->key, g->owner,
                                   rt->lease_ms, on_locked, g);
}

static idem_rc do_get(struct gw *g)
{
    return idem_record_get_async(g->d->h, loop_of(g), g->rt->space, g->key, on_record, g);
}

static idem_rc do_begin(struct gw *g)
{
    if (g->rt->states)
        return idem_record_step_async(g->d->h, loop_of(g), g->rt->states->machine,
                                      g->rt->space, g->key, g->to, g->has_fp ? g->fp : NULL,
                                      g->owner, g->rt->lease_ms, on_begun, g);
    return idem_record_begin_async(g->d->h, loop_of(g), g->rt->space, g->key,
                                   g->has_fp ? g->fp : NULL, g->owner, g->rt->lease_ms, on_begun,
                                   g);
}

static idem_rc do_finish(struct gw *g)
{
    const struct route *rt = g->rt;
    idem *h = g->d->h;
    idem_loop *l = loop_of(g);
    /* Read before the store reads its clock: the record expires no sooner
     * than this, so the header never promises more than the record keeps. */
    g->expires_ms = wall_ms() + rt->retention_ms;
    /* The record outlives the retention by the tombstone (see replay). */
    int64_t keep_ms = rt->retention_ms + rt->tombstone_ms;
    if (rt->states && g->finish != FINISH_HOLD) {
        /* A kept answer moves the key to its state, whatever its status
         * (the business's answer to that event); any other leaves it. */
        if (g->finish == FINISH_FAIL_RETRYABLE)
            return idem_record_step_release_async(h, l, rt->space, g->key, g->epoch, keep_ms,
                                                  on_outcome, g);
        return idem_record_step_complete_async(h, l, rt->space, g->key, g->epoch, g->to,
                                               g->has_fp ? g->fp : NULL, g->stored,
                                               g->stored_len, keep_ms, on_outcome, g);
    }
    if (g->finish == FINISH_COMPLETE)
        return idem_record_complete_async(h, l, rt->space, g->key, g->epoch, g->stored,
                                          g->stored_len, keep_ms, on_outcome, g);
    if (g->finish == FINISH_FAIL_FINAL)
        return idem_record_fail_async(h, l, rt->space, g->key, g->epoch, IDEM_FAIL_FINAL,
                                      g->stored, g->stored_len, keep_ms, on_outcome, g);
    if (g->finish == FINISH_HOLD)
        return idem_record_extend_async(h, l, rt->space, g->key, g->epoch,
                                        g->hold_for_ms ? g->hold_for_ms : hold_ms(rt), on_outcome,
                                        g);
    return idem_record_fail_async(h, l, rt->space, g->key, g->epoch, IDEM_FAIL_RETRYABLE, NULL,
                                  0, 0, on_outcome, g);
}

/* Best effort: a lock not released runs out at its TTL. */
static void on_released(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct gw *g = arg;
    (void)rc;
    (void)o;
    (void)detail;
    g->locked = 0;
    back(g);
}

/* Entered only with the lock held (finish()). */
static idem_rc do_cleanup(struct gw *g)
{
    return idem_lock_release_async(g->d->h, loop_of(g), g->rt->space, g->key, g->owner,
                                   on_released, g);
}

/* The claim, still this request's for another lease? Taken over meanwhile
 * (a pause or a store outage longer than the lease, on the distributed
 * store another instance), the token may be paying for the new holder's
 * execution, and must stay spent. */
static idem_rc do_confirm_claim(struct gw *g)
{
    return idem_record_extend_async(g->d->h, loop_of(g), g->rt->space, g->key, g->epoch,
                                    g->rt->lease_ms, on_outcome, g);
}

static void on_given_back(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct gw *g = arg;
    g->token_spent = 0;
    on_outcome(arg, rc, o, detail);
}

static idem_rc do_give_back(struct gw *g)
{
    return idem_token_give_back_async(g->d->h, loop_of(g), g->subject, g->rt->token_scene,
                                      g->token, g->key, on_given_back, g);
}

/* ---- the states ---- */

#define BIT(s) (1u << (s))
/* From S_DONE's row nothing leaves; S_DONE itself may follow any state (an
 * answer, or the daemon stopping under the request: abandon()). */
#define ENDS (BIT(S_CLEANUP) | BIT(S_DONE))

enum state_work { W_NONE, W_KV, W_DB, W_TIMER, W_UPSTREAM };

static const struct state_info {
    const char *name;
    enum state_work work;
    /* W_KV, W_DB: start the state's asynchronous store call, whose
     * callback fills g->rc, g->o (g->rec) and resumes the request. */
    idem_rc (*call)(struct gw *g);
    unsigned next;              /* the states it may go on to */
} states[] = {
    [S_NEW] = {"new", W_NONE, NULL, BIT(S_READ) | BIT(S_TOKEN) | BIT(S_LOCK) | BIT(S_BEGIN)},
    [S_READ] = {"read", W_DB, do_get, BIT(S_LOCK) | BIT(S_BEGIN) | ENDS},
    [S_TOKEN] = {"token", W_KV, do_token, BIT(S_LOCK) | BIT(S_BEGIN)},
    [S_LOCK] = {"lock", W_KV, do_lock, BIT(S_LOCK_READ) | BIT(S_BEGIN) | ENDS},
    [S_LOCK_READ] = {"lock_read", W_DB, do_get, BIT(S_LOCK_WAIT) | ENDS},
    [S_LOCK_WAIT] = {"lock_wait", W_TIMER, NULL, BIT(S_LOCK)},
    [S_BEGIN] = {"begin", W_DB, do_begin,
                 BIT(S_BEGIN_WAIT) | BIT(S_RESPEND) | BIT(S_FORWARD) | BIT(S_RESOLVE) |
                     BIT(S_FINISH) | ENDS},
    [S_BEGIN_WAIT] = {"begin_wait", W_TIMER, NULL, BIT(S_BEGIN)},
    [S_RESPEND] = {"respend", W_KV, do_token, BIT(S_FORWARD) | BIT(S_FINISH)},
    /* A call that cannot start leaves S_FORWARD for the release at once. */
    [S_FORWARD] = {"forward", W_UPSTREAM, NULL, BIT(S_CONFIRM) | BIT(S_FINISH) | ENDS},
    [S_RESOLVE] = {"resolve", W_UPSTREAM, NULL,
                   BIT(S_RESPEND) | BIT(S_FORWARD) | BIT(S_CONFIRM) | BIT(S_FINISH) | ENDS},
    [S_CONFIRM] = {"confirm", W_DB, do_confirm_claim, BIT(S_GIVE_BACK) | BIT(S_FINISH)},
    [S_GIVE_BACK] = {"give_back", W_KV, do_give_back, BIT(S_FINISH) | ENDS},
    [S_FINISH] = {"finish", W_DB, do_finish, BIT(S_FINISH_WAIT) | BIT(S_FINISH_READ) | ENDS},
    [S_FINISH_WAIT] = {"finish_wait", W_TIMER, NULL, BIT(S_FINISH)},
    [S_FINISH_READ] = {"finish_read", W_DB, do_get, BIT(S_FINISH_WAIT) | ENDS},
    [S_CLEANUP] = {"cleanup", W_KV, do_cleanup, BIT(S_DONE)},
    [S_DONE] = {"done", W_NONE, NULL, 0},
};

static void done(struct gw *g);
static void answer(struct gw *g);
static void arm_timer(struct gw *g);

/* A store call came back to the loop. Once the daemon is stopping (the
 * loop no longer runs: its last answers are run by the shutdown, see
 * daemon_loop_settle), the request is abandoned. */
static void back(struct gw *g)
{
    if (front_closing(g->req))
        abandon(g);
    else
        done(g);
}

/* Start the state's store call; its answer comes to done(). */
static void start_call(struct gw *g)
{
    g->rc = IDEM_OK;
    g->o = IDEM_NONE;
    g->detail[0] = '\0';
    idem_record_clear(&g->rec);
    idem_rc rc = states[g->state].call(g);
    if (rc != IDEM_OK) { /* no callback will come */
        keep_rc(g, rc);
        done(g);
    }
}

static void forward(struct gw *g);
static void ask(struct gw *g);

/* Go to state s, and start its work. */
static void enter(struct gw *g, enum gw_state s)
{
    if (s != S_DONE && !(states[g->state].next & BIT(s))) {
        daemon_log_about(LOG_ALERT, ABOUT(g),
                         "%s/%s: the gateway went from %s to %s, which it never does",
                         g->rt->space, g->key, states[g->state].name, states[s].name);
        assert(!"a transition missing from states[]");
    }
    /* log.level: debug: each request's walk, a line a state. */
    if (daemon_log_enabled(LOG_DEBUG))
        daemon_log_about(LOG_DEBUG, ABOUT(g),
                         "route %s: %s/%s (request %s): %s -> %s%s%s", g->rt->name,
                         g->rt->space, g->key, g->req->request_id[0] ? g->req->request_id : "-",
                         states[g->state].name, states[s].name, g->o != IDEM_NONE ? " after " : "",
                         g->o != IDEM_NONE ? idem_outcome_name(g->o) : "");
    g->state = s;
    switch (states[s].work) {
    case W_DB:
        /* A key another request of this daemon claims is decided without
         * the store: it is in flight here, even if its lease ran out. (A
         * begin that claims the key joins the list when its answer comes
         * back, on_begun; two begins of one key meanwhile are the store's
         * to tell apart.) */
        if (s == S_BEGIN && (g->held_here = claimed_here(g)) != HELD_NONE) {
            g->rc = IDEM_OK;
            done(g);
            break;
        }
        /* fall through */
    case W_KV:
        start_call(g);
        break;
    case W_TIMER:
        arm_timer(g);
        break;
    case W_UPSTREAM:
        if (s == S_RESOLVE)
            ask(g);
        else
            forward(g);
        break;
    case W_NONE:
        answer(g); /* S_DONE */
        break;
    }
}

/* ---- decisions, on the loop ---- */

/* Redis (layers 1 and 2) cannot be reached. With on_redis_down: skip the
 * layer is passed over, which is safe: the record (layer 3, PostgreSQL) alone
 * still lets one request execute. Returns 1 to skip, 0 to answer 503. */
static int skip_kv_layer(struct gw *g, const char *layer)
{
    if (g->rt->on_redis_down_reject || (g->rc != IDEM_EUNAVAILABLE && g->rc != IDEM_ETIMEDOUT))
        return 0;
    unsigned long n = COUNT(g->rt, redis_down_skips) + 1;
    /* Every skip is counted; the log says so for the route's 1st, 2nd, 4th... */
    if ((n & (n - 1)) == 0)
        daemon_log_about(LOG_INFO, ABOUT(g),
                         "route %s: %s skipped, the store is down (%s: %s); %lu skipped so far",
                         g->rt->name, layer, idem_strerror(g->rc), g->detail, n);
    return 1;
}

/* 1 when the claim rec is no longer renewed by a running request: held,
 * or left to its lease (see retry_after_s). */
static int claim_idle(const idem_record *rec, int64_t lease_ms)
{
    return rec && strcmp(rec->state, IDEM_STATE_PROCESSING) == 0 &&
           wall_ms() - rec->updated_ms > lease_ms / 3 + 1000;
}

/* Seconds a duplicate should wait before it retries, from the claim it met
 * (rec: PROCESSING, or none found). A live claim is renewed by its lease
 * timer every lease/3, and its request usually ends within a second. One
 * not renewed for longer is not running here any more: an unknown outcome
 * (held, or left to its lease), or a gateway that died. Nothing changes for
 * it until its lease ends (or an operator finishes it), so the wait is what
 * is left of the lease. */
static long retry_after_s(const idem_record *rec, int64_t lease_ms)
{
    if (!claim_idle(rec, lease_ms))
        return 1;
    int64_t now = wall_ms();
    int64_t left = rec->lease_until_ms - now;
    return left <= 1000 ? 1 : (long)((left + 999) / 1000);
}

static struct http_response *in_flight(struct gw *g, const char *what, const idem_record *rec,
                                       int64_t lease_ms)
{
    VERDICT(g, GW_IN_FLIGHT);
    struct http_response *r =
        problem(409, "request_in_flight",
                "a request with this idempotency key is being processed (%s); retry later",
                what);
    char secs[24];
    snprintf(secs, sizeof secs, "%ld", retry_after_s(rec, lease_ms));
    if (r)
        response_add_header(r, "Retry-After", secs);
    /* The claim it met, for an operator's tool: its epoch, and until when
     * it is held when nothing renews it. */
    if (r && rec && strcmp(rec->state, IDEM_STATE_PROCESSING) == 0)
        (void)problem_set_claim(r, rec->epoch, claim_idle(rec, lease_ms) ? rec->lease_until_ms : 0);
    return r;
}

/* Idempotency-Key-Expires: until when the key's answer is kept (the
 * record's expiry, an HTTP-date), on the answers that are kept: executed
 * and replayed. 0 or unknown: none. -1 on OOM. */
static int add_expires(struct http_response *r, int64_t expires_ms)
{
    char date[32];
    if (expires_ms <= 0 || !http_date(expires_ms, date))
        return 0;
    return response_add_header(r, "Idempotency-Key-Expires", date);
}

/* A stored answer as its replay: decoded and marked, with its record's
 * expiry. NULL if the bytes are not an answer Idem stored (or on OOM). */
static struct http_response *decode_replay(const void *stored, size_t len, int64_t expires_ms)
{
    struct http_response *r = stored ? stored_decode(stored, len) : NULL;
    if (r && (response_add_header(r, "Idempotent-Replayed", "true") != 0 ||
              add_expires(r, expires_ms) != 0)) {
        response_free(r);
        r = NULL;
    }
    return r;
}

/* The answer to a duplicate: the replay r, counted, or the problem. */
static struct http_response *counted_replay(const struct route *rt, struct http_response *r,
                                            const char *state)
{
    if (!r)
        return problem(500, "stored_result_unreadable",
                       "the record is %s but its stored result is not a response Idem stored",
                       state);
    COUNT(rt, replays);
    return r;
}

/* Keep a durable, final answer for the duplicates that follow. */
static void keep_answer(struct gw *g, const uint8_t *fp, const void *stored, size_t len,
                        int64_t expires_ms)
{
    struct daemon_loop *loop = g->req->loop_ctx;
    /* A key with states changes its answer as it moves: not kept here. */
    if (stored && !g->rt->states)
        replay_cache_put(loop->replays, g->rt->space, g->key, fp, stored, len, expires_ms,
                         mono_ms(), g->replay_gen);
}

/* A key past its retention, within its tombstone: refused, and not run
 * again until the tombstone ends (the record's expiry, after which the
 * record layer takes the key as new). */
static struct http_response *key_expired(struct gw *g, const idem_record *rec,
                                         int64_t retention_end_ms)
{
    char used[32], ended[32], until[32];
    VERDICT(g, GW_KEY_EXPIRED);
    g->req->outcome_type = "key_expired";
    if (!http_date(rec->created_ms, used) || !http_date(retention_end_ms, ended) ||
        !http_date(rec->expires_ms, until))
        used[0] = ended[0] = until[0] = '?', used[1] = ended[1] = until[1] = '\0';
    struct http_response *r =
        problem(410, "key_expired",
                "the idempotency key %s was first used at %s and its answer was kept until %s; "
                "it is not executed again before %s (tombstone)",
                g->key, used, ended, until);
    return r;
}

/* Replay a finished record read from the store, and keep its answer. A
 * stepped record's answer is the one kept with its current state, which
 * the replay names (Idem-State). */
static struct http_response *replay(struct gw *g, const idem_record *rec)
{
    /* With a tombstone, the record is kept past the retention (by the
     * tombstone, do_finish): the answer is the retention's, and the rest
     * is the tombstone's 410. */
    int64_t expires_ms = rec->expires_ms ? rec->expires_ms - g->rt->tombstone_ms : 0;
    if (g->rt->tombstone_ms && expires_ms && wall_ms() >= expires_ms)
        return key_expired(g, rec, expires_ms);
    VERDICT(g, GW_REPLAYED);
    if (g->rt->states) {
        idem_step_view v;
        struct http_response *r =
            idem_record_steps(rec, &v) == IDEM_OK
                ? decode_replay(v.result, v.result_len, expires_ms)
                : NULL;
        if (r && response_add_header(r, "Idem-State", v.state) != 0) {
            response_free(r);
            r = NULL;
        }
        return counted_replay(g->rt, r, rec->state);
    }
    struct http_response *r = decode_replay(rec->result, rec->result_len, expires_ms);
    if (r)
        keep_answer(g, rec->has_fingerprint ? rec->fingerprint : NULL, rec->result,
                    rec->result_len, expires_ms);
    return counted_replay(g->rt, r, rec->state);
}

/* The stored answer if the record read is finished — and its payload
 * matches — else NULL. A finished record never changes its answer. */
static struct http_response *replay_finished(struct gw *g, idem_outcome o,
                                             const idem_record *rec)
{
    /* A key with states: whether its answer is this request's depends on
     * the state the request names, which only the step decides. */
    if (o != IDEM_FOUND || !idem_record_finished(rec->state) || g->rt->states ||
        (rec->expires_ms && rec->expires_ms <= wall_ms()))
        return NULL;
    if (g->has_fp && rec->has_fingerprint &&
        memcmp(g->fp, rec->fingerprint, IDEM_FINGERPRINT_LEN) != 0)
        return NULL;
    return replay(g, rec);
}

/* Everything ends here: give back what we hold, then answer. */
static void finish(struct gw *g)
{
    evtimer_del(g->lease);
    g->renewing = 0;
    enter(g, g->locked ? S_CLEANUP : S_DONE);
}

static void go_lock(struct gw *g);
static void go_begin(struct gw *g);
static void lease_start(struct gw *g);
static int64_t tick_ms(const struct route *rt);

/* The request's wait, for the state it is in: 2 ms, doubling, at most
 * 50 ms; a finish's retry_ms. */
static void arm_timer(struct gw *g)
{
    int64_t ms = g->state == S_FINISH_WAIT ? g->retry_ms : g->backoff_ms;
    if (g->state == S_LOCK_WAIT || g->state == S_BEGIN_WAIT)
        g->backoff_ms = g->backoff_ms * 2 > 50 ? 50 : g->backoff_ms * 2;
    struct timeval tv = ms_timeval(ms);
    g->req->on_abort = on_abort;
    evtimer_add(g->timer, &tv);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct gw *g = arg;
    (void)fd;
    (void)what;
    g->req->on_abort = NULL;
    enter(g, g->state == S_LOCK_WAIT ? S_LOCK : g->state == S_BEGIN_WAIT ? S_BEGIN : S_FINISH);
}

static void after_token(struct gw *g)
{
    if (g->rc == IDEM_EINVAL) {
        VERDICT(g, GW_TOKEN_REFUSED);
        g->out = problem(409, "token_spent",
                         "the Idem-Token is not a valid token; refresh the page and retry");
        enter(g, S_DONE);
        return;
    }
    if (g->rc != IDEM_OK) {
        if (!skip_kv_layer(g, "the token layer")) {
            COUNT(g->rt, store_errors);
            VERDICT(g, GW_STORE_UNAVAILABLE);
            g->out = problem_from_rc(g->rc, g->detail, "consuming the token");
            enter(g, S_DONE);
            return;
        }
    } else if (g->o == IDEM_CONSUMED) {
        g->token_spent = 1;
    } else if (g->o == IDEM_ALREADY_CONSUMED && strcmp(g->spent, g->key) == 0) {
        g->token_rode = 1; /* a late retry: the record decides */
    } else {
        VERDICT(g, GW_TOKEN_REFUSED);
        g->out = problem(409, "token_spent",
                         "this form was already submitted, or its token expired: "
                         "refresh and retry");
        enter(g, S_DONE);
        return;
    }
    go_lock(g);
}


static void stale_event(struct gw *g, const char *current);
static void transition_conflict(struct gw *g, const char *current, uint64_t epoch);

/* A key with states, read before its step: the answers that need no
 * write, decided from the state it is in. Its states only move forward
 * (the machine is acyclic), so a request that is the current state's
 * duplicate, or behind it, or against it, stays so: what the step would
 * answer a moment later. 1 when answered. */
static int answered_from_state(struct gw *g)
{
    const idem_record *rec = &g->rec;
    idem_step_view v;
    if (g->rc != IDEM_OK || g->o != IDEM_FOUND || !idem_record_finished(rec->state) ||
        (rec->expires_ms && rec->expires_ms <= wall_ms()) ||
        idem_record_steps(rec, &v) != IDEM_OK)
        return 0;
    idem_step_relation rel = idem_machine_relation(g->rt->states->machine, v.state, g->to);
    if (rel == IDEM_STEP_SAME && g->has_fp && rec->has_fingerprint &&
        memcmp(g->fp, rec->fingerprint, IDEM_FINGERPRINT_LEN) != 0)
        return 0; /* the step says MISMATCH */
    if (rel != IDEM_STEP_SAME && rel != IDEM_STEP_BEHIND && rel != IDEM_STEP_APART)
        return 0;
    /* Each answer below ends the request (g is freed): everything of the
     * record it needs is taken first. */
    idem__hint_paid(&g->d->gateway->reads, 1);
    uint64_t epoch = rec->epoch;
    if (rel == IDEM_STEP_SAME)
        g->out = replay(g, rec);
    idem_record_clear(&g->rec);
    if (rel == IDEM_STEP_SAME)
        enter(g, S_DONE);
    else if (rel == IDEM_STEP_BEHIND)
        stale_event(g, v.state);
    else
        transition_conflict(g, v.state, epoch);
    return 1;
}

/* A finished record found before any layer is asked: its answer. */
static void after_read(struct gw *g)
{
    if (g->rt->states && answered_from_state(g))
        return;
    if (g->rc == IDEM_OK && (g->out = replay_finished(g, g->o, &g->rec)) != NULL) {
        idem__hint_paid(&g->d->gateway->reads, 1);
        enter(g, S_DONE);
        return;
    }
    idem__hint_paid(&g->d->gateway->reads, 0);
    idem_record_clear(&g->rec);
    go_lock(g);
}

static void after_busy_get(struct gw *g)
{
    /* The holder may be a duplicate of a request that is finished: its
     * answer needs no lock. */
    if (g->rc == IDEM_OK && (g->out = replay_finished(g, g->o, &g->rec)) != NULL) {
        finish(g);
        return;
    }
    if (!g->rt->in_flight_wait || mono_ms() >= g->deadline) {
        COUNT(g->rt, in_flight_409);
        const idem_record *rec = g->rc == IDEM_OK && g->o == IDEM_FOUND ? &g->rec : NULL;
        incidents_note(INCIDENT_IN_FLIGHT_409, g->rt, g->key, rec ? rec->epoch : 0);
        /* The token stays spent on this key, as with the record's 409: a
         * retry with it and the key goes on to the record (finish_record
         * says why it is not given back). */
        g->out = in_flight(g, "its lock is held", rec, g->rt->lease_ms);
        finish(g);
        return;
    }
    enter(g, S_LOCK_WAIT);
}

static void after_lock(struct gw *g)
{
    if (g->rc != IDEM_OK && skip_kv_layer(g, "the lock layer")) {
        /* A timed-out acquire may have taken the lock after all: release
         * it when done (ours, by owner), best effort. */
        g->locked = g->rc == IDEM_ETIMEDOUT;
        go_begin(g);
        return;
    }
    if (g->rc != IDEM_OK) {
        COUNT(g->rt, store_errors);
        VERDICT(g, GW_STORE_UNAVAILABLE);
        g->out = problem_from_rc(g->rc, g->detail, "taking the business-key lock");
        finish(g); /* the token stays spent on the key: see finish_record */
        return;
    }
    if (g->o == IDEM_ACQUIRED) {
        g->locked = 1;
        g->renewing = 1;
        lease_start(g);
        go_begin(g);
        return;
    }
    enter(g, S_LOCK_READ);
}

static void go_lock(struct gw *g)
{
    if (g->rt->layer_lock)
        enter(g, S_LOCK);
    else
        go_begin(g);
}


static const char *held_why(enum held_here held)
{
    return held == HELD_UNKEPT ? "it was executed here and its answer is being stored"
                     : "this server is running a request with this key";
}

/* The key is claimed by a request still running: 409, or wait and begin
 * again, as the route says. rec: the claim, if it was read. */
static void in_flight_elsewhere(struct gw *g, const char *why, const idem_record *rec)
{
    if (!g->rt->in_flight_wait || mono_ms() >= g->deadline) {
        COUNT(g->rt, in_flight_409);
        incidents_note(INCIDENT_IN_FLIGHT_409, g->rt, g->key, rec ? rec->epoch : 0);
        g->out = in_flight(g, why, rec, g->rt->lease_ms);
        finish(g);
        return;
    }
    enter(g, S_BEGIN_WAIT);
}

static void finish_record(struct gw *g, enum finish_kind kind);

/* A request that went on with a token another request had spent on its key
 * now executes: the spend must be there while it does, or the token could
 * be spent again on another key. The spender gives it back before it
 * releases the record, and only then (finish_record), so here it is either
 * back (take it), still spent on this key (by a request that spent it
 * since, which does not hold the claim and so never gives it back), or
 * spent on another key or gone (this request must not execute). */
static void after_reconsume(struct gw *g)
{
    if (g->rc == IDEM_OK && g->o == IDEM_CONSUMED) {
        g->token_spent = 1;
        enter(g, S_FORWARD);
        return;
    }
    if ((g->rc == IDEM_OK && g->o == IDEM_ALREADY_CONSUMED && strcmp(g->spent, g->key) == 0) ||
        (g->rc != IDEM_OK && g->rc != IDEM_EINVAL && skip_kv_layer(g, "the token layer"))) {
        enter(g, S_FORWARD);
        return;
    }
    if (g->rc == IDEM_OK || g->rc == IDEM_EINVAL) {
        VERDICT(g, GW_TOKEN_REFUSED);
        g->out = problem(409, "token_spent",
                         "this form's token was given back and then spent on another request, "
                         "or it expired: refresh and retry");
    } else {
        COUNT(g->rt, store_errors);
        VERDICT(g, GW_STORE_UNAVAILABLE);
        g->out = problem_from_rc(g->rc, g->detail, "consuming the token");
    }
    finish_record(g, FINISH_FAIL_RETRYABLE); /* not executed: release the claim */
}

/* The key was used with another payload: 422. */
static void key_reused(struct gw *g)
{
    COUNT(g->rt, mismatches);
    VERDICT(g, GW_MISMATCH);
    incidents_note(INCIDENT_MISMATCH_422, g->rt, g->key, 0);
    g->out = problem(422, "key_reused",
                     "the idempotency key %s was already used with another payload", g->key);
    finish(g); /* the token stays spent on the key: see finish_record */
}

/* Another request of this daemon holds the key's claim (held, as
 * claimed_here says): in flight, or refused at once for another payload. */
static void held_elsewhere(struct gw *g, enum held_here held)
{
    if (held == HELD_OTHER_PAYLOAD)
        key_reused(g);
    else
        in_flight_elsewhere(g, held_why(held), NULL);
}

/* On a route with on_unknown_outcome: hold, no retry takes a claim over
 * and executes: a claim whose lease ran out was left by a daemon that died
 * mid-request (kill -9, a lost machine: whichever instance finds it) or is
 * a hold that ran its time, and either way whether it executed is unknown.
 * The begin took the claim at a new epoch; it is held as an unknown
 * outcome is, for hold_ms, and the retry is told 409 until an operator
 * finishes the record. */
static void hold_abandoned(struct gw *g)
{
    const struct route *rt = g->rt;
    g->epoch = g->rec.epoch;
    idem_record_clear(&g->rec);
    COUNT(rt, in_flight_409);
    VERDICT(g, GW_HELD);
    incidents_note_why(INCIDENT_HELD, rt, g->key, g->epoch,
                       "taken over after its lease ran out unfinished (a crash, a lost "
                       "instance, or a hold that ran its time)");
    daemon_log_about(LOG_INFO, ABOUT(g),
                     "%s/%s: a claim whose lease ran out, its outcome unknown, is held at epoch "
                     "%" PRIu64 " for %" PRId64 " ms (on_unknown_outcome: hold): an operator "
                     "finishes it through the JSON API",
                     rt->space, g->key, g->epoch, hold_ms(rt));
    g->out = problem(409, "request_in_flight",
                     "an earlier request with this idempotency key was left unfinished (its "
                     "lease ran out) and may have been executed: its record is held PROCESSING "
                     "(epoch %" PRIu64 ") until an operator finishes it",
                     g->epoch);
    char secs[24];
    snprintf(secs, sizeof secs, "%" PRId64, hold_ms(rt) / 1000);
    if (g->out) {
        response_add_header(g->out, "Retry-After", secs);
        (void)problem_set_claim(g->out, g->epoch, wall_ms() + hold_ms(rt));
    }
    finish_record(g, FINISH_HOLD);
}

/* ---- attempts ----
 *
 * A route with max_attempts (a consumer's) is tried at most that many
 * times per key, however often its message is delivered and however often
 * Idem restarts meanwhile: the count is the record's, since every claim of
 * a key moves its epoch on by one, from the clock at its creation
 * (created_ms). Which answers are worth another attempt is the route's
 * keep set (store_statuses), whoever configured it. The last attempt's
 * answer, when it is one worth another attempt (a 5xx, a refused
 * connection), and any claim past max_attempts (not sent) end the same
 * way: GW_EXHAUSTED, the claim released, and a consumer dead-letters the
 * message. Released, not failed for good: the consumer's count is kept in
 * the epoch, so a later delivery of the message is past max_attempts again
 * and never sent, while the key stays open to the other channels sharing
 * its space (a payment's callback, a reconciliation: max_attempts 0),
 * which execute it instead of being answered the handler's 500 for good.
 * A redrive (consume.c) puts the message back with the epoch its record
 * had then (front_request.attempt_base): its claims count from there, so
 * the redriven message gets max_attempts afresh, and a copy that was not
 * redriven still finds them used up. A base can only lower the count (a
 * producer that forges one gains no claim the record does not show).
 * With max_attempts 0 (the routes of routes:) nothing is counted. */

static unsigned attempt_of(const idem_record *rec)
{
    /* A key with states is claimed once per move, and each move's
     * attempts count from the claim that made the one before. A plain
     * key's claim carries no result: nothing to parse, nothing to fail. */
    idem_step_view v;
    if (rec->result_len && idem_record_steps(rec, &v) == IDEM_OK &&
        rec->epoch > v.steps[v.count - 1].epoch) {
        uint64_t n = rec->epoch - v.steps[v.count - 1].epoch;
        return n > UINT32_MAX ? UINT32_MAX : (unsigned)n;
    }
    uint64_t first = rec->created_ms > 0 ? (uint64_t)rec->created_ms : rec->epoch;
    uint64_t n = rec->epoch >= first ? rec->epoch - first + 1 : 1;
    return n > UINT32_MAX ? UINT32_MAX : (unsigned)n;
}

/* The claim's number for a message put back at base (0: none). */
static unsigned attempt_since(const idem_record *rec, uint64_t base)
{
    unsigned n = attempt_of(rec);
    if (base && base < rec->epoch && rec->epoch - base < n)
        n = (unsigned)(rec->epoch - base);
    return n;
}

static void exhausted(struct gw *g)
{
    VERDICT(g, GW_EXHAUSTED);
    g->out = problem(502, "attempts_exhausted",
                     "claim %u of this key, and max_attempts is %u: it is not sent to the "
                     "handler again",
                     g->attempt, g->rt->max_attempts);
    /* Released (see above); a key with states stays where it was. */
    finish_record(g, FINISH_FAIL_RETRYABLE);
}

/* ---- states ----
 *
 * On a route with states, the begin is a step of the key's machine
 * (idem_record_step): the request names the state it moves its key to
 * (g->to), and the record says where the key is. A move ahead executes
 * once, with Idem-State-From and Idem-State-To; the current state's own
 * event is its replay; an event behind the key is answered 200 and not
 * sent (a provider stops retrying on 2xx); one that contradicts it is the
 * alert branch, 409 transition_conflict. A kept answer moves the key
 * (step_complete), any other leaves it where it was (step_release). */

static void stale_event(struct gw *g, const char *current)
{
    COUNT(g->rt, stale);
    VERDICT(g, GW_STALE);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s}", "outcome", "stale", "key", g->key, "state",
                          current, "event", g->to);
    g->out = json_response(200, j);
    if (g->out && response_add_header(g->out, "Idem-State", current) != 0) {
        response_free(g->out);
        g->out = NULL;
    }
    finish(g);
}

static void transition_conflict(struct gw *g, const char *current, uint64_t epoch)
{
    const struct route *rt = g->rt;
    COUNT(rt, transition_conflicts);
    VERDICT(g, GW_TRANSITION_CONFLICT);
    incidents_note(INCIDENT_TRANSITION_CONFLICT, rt, g->key, epoch);
    daemon_log_about(LOG_ALERT, ABOUT(g),
                     "route %s: %s/%s is %s, and an event moves it to %s, which its states never "
                     "allow from there: not forwarded (409 transition_conflict)",
                     rt->name, rt->space, g->key, current, g->to);
    g->out = problem(409, "transition_conflict",
                     "the key %s is in state %s, and %s cannot follow it: the event "
                     "contradicts what is recorded",
                     g->key, current, g->to);
    if (g->out)
        response_add_header(g->out, "Idem-State", current);
    finish(g);
}

/* The state the record rec (a step's answer) says its key is in. */
static const char *state_of(const struct gw *g, const idem_record *rec, char *buf)
{
    idem_step_view v;
    if (rec->result_len && idem_record_steps(rec, &v) == IDEM_OK) {
        memcpy(buf, v.state, sizeof v.state);
        return buf;
    }
    return idem_machine_initial(g->rt->states->machine);
}

static void take_to_resolve(struct gw *g);
static void resolver_nothing(struct gw *g);

static void after_begin(struct gw *g)
{
    if (g->rc != IDEM_OK) {
        COUNT(g->rt, store_errors);
        VERDICT(g, GW_STORE_UNAVAILABLE);
        daemon_write_failed(g->d, g->rc);
        g->out = problem_from_rc(g->rc, g->detail, "claiming the record");
        finish(g); /* the token stays spent on the key: see finish_record */
        return;
    }
    /* The resolver asks only about a claim it took over: anything else
     * (in flight here or elsewhere, finished, gone) is left as it is. */
    if (g->resolver && (g->held_here != HELD_NONE || g->o != IDEM_TAKEN_OVER)) {
        resolver_nothing(g);
        return;
    }
    if (g->held_here != HELD_NONE) { /* decided without the store: see enter */
        held_elsewhere(g, g->held_here);
        return;
    }
    daemon_write_ok(g->d);
    switch (g->o) {
    case IDEM_TAKEN_OVER:
        if (g->rt->resolve) {
            take_to_resolve(g);
            return;
        }
        if (g->rt->unknown_hold) {
            hold_abandoned(g);
            return;
        }
        incidents_note(INCIDENT_TAKEOVER, g->rt, g->key, g->rec.epoch);
        /* fall through */
    case IDEM_NEW:
        g->epoch = g->rec.epoch;
        g->attempt = attempt_since(&g->rec, g->req->attempt_base);
        if (g->rt->states) {
            char buf[IDEM_NAME_MAX + 1];
            snprintf(g->from, sizeof g->from, "%s", state_of(g, &g->rec, buf));
        }
        g->req->epoch = g->epoch;
        g->req->attempt = g->attempt;
        idem_record_clear(&g->rec);
        if (g->rt->max_attempts && g->attempt > g->rt->max_attempts) {
            exhausted(g);
            return;
        }
        enter(g, g->token_rode ? S_RESPEND : S_FORWARD);
        return;
    case IDEM_DONE:
        idem__hint_paid(&g->d->gateway->reads, 1); /* a read on the loop would have found it */
        g->out = replay(g, &g->rec);
        finish(g);
        return;
    case IDEM_MISMATCH:
        key_reused(g);
        return;
    case IDEM_STALE:
    case IDEM_CONFLICT: {
        char buf[IDEM_NAME_MAX + 1];
        const char *current = state_of(g, &g->rec, buf);
        if (g->o == IDEM_STALE)
            stale_event(g, current);
        else
            transition_conflict(g, current, g->rec.epoch);
        return;
    }
    default: /* IN_PROGRESS */
        in_flight_elsewhere(g, "its record is PROCESSING", &g->rec);
    }
}

static void go_begin(struct gw *g)
{
    g->backoff_ms = 2;
    enter(g, S_BEGIN);
}

/* ---- leases ----
 *
 * One timer per request renews what it holds, every lease/3: its lock,
 * from the acquire to S_CLEANUP (renewing), and its record's claim while
 * the upstream has it (S_FORWARD). Each renewal is a store call of its own,
 * which outlives the request if it must; a failed one is logged, and the
 * next comes a third of a lease later, so two more are tried before the
 * lease can run out. Both are asynchronous calls on the request's loop:
 * the lock's in memory or a Redis command on the loop's connection, the
 * claim's a job of the store's writers, so a Redis that stops answering
 * (each lock renewal then fails after storage.timeout) never delays a
 * claim's.
 *
 * A claim's extension that finds the claim gone (CONFLICT: taken over,
 * its lease having run out while this daemon could not renew it, or
 * finished by an operator; NOT_FOUND: deleted) reaches the request if it
 * is still forwarding at that epoch (g->extending, cleared as the request
 * moves on or goes): the upstream call is cut, since whatever it does now
 * runs beside the key's new owner, and the client gets 504 outcome_unknown
 * (it may have executed); the record is not touched, it is not ours. */
struct renewal {
    struct daemon *d;
    struct gw *g; /* the request, while it forwards at epoch; else NULL */
    int lock; /* the lock's renewal; 0: the claim's extension */
    char space[IDEM_NAME_MAX + 1];
    char key[IDEM_KEY_MAX + 1];
    char owner[64];
    uint64_t epoch;
    int64_t lease_ms;
    idem_rc rc;
    idem_outcome o;
    char detail[256];
};

static void renewal_done(struct renewal *t)
{
    if (t->rc != IDEM_OK || t->o != IDEM_RENEWED)
        daemon_log_about(LOG_WARN, TIMER_ABOUT(t), "%s/%s: %s failed: %s %s", t->space, t->key,
                         t->lock ? "renewing the lock" : "extending the claim's lease",
                         t->rc != IDEM_OK ? idem_strerror(t->rc) : idem_outcome_name(t->o),
                         t->rc != IDEM_OK ? t->detail : "");
    free(t);
}

/* The request stops listening to its claim's extension. */
static void extending_forget(struct gw *g)
{
    if (g->extending)
        g->extending->g = NULL;
    g->extending = NULL;
}

static void claim_lost(struct gw *g, idem_outcome o);

/* The renewal, answered on the loop. */
static void renewal_answered(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct renewal *t = arg;
    struct gw *g = t->g;
    t->rc = rc;
    t->o = o;
    if (rc != IDEM_OK)
        snprintf(t->detail, sizeof t->detail, "%s", detail);
    if (g)
        g->extending = NULL;
    if (g && rc == IDEM_OK && (o == IDEM_CONFLICT || o == IDEM_NOT_FOUND) &&
        (g->state == S_FORWARD || g->state == S_RESOLVE) && g->call && g->epoch == t->epoch)
        claim_lost(g, o);
    renewal_done(t);
}

static int64_t tick_ms(const struct route *rt)
{
    return rt->lease_ms / 3 > 0 ? rt->lease_ms / 3 : 1;
}

static void renewal_start(struct gw *g, int lock)
{
    struct daemon *d = g->d;
    struct renewal *t = calloc(1, sizeof *t);
    if (!t) {
        daemon_log_about(LOG_WARN, ABOUT(g),
                         "%s/%s: no memory to renew the %s", g->rt->space, g->key,
                         lock ? "lock" : "claim's lease");
        return;
    }
    t->d = d;
    t->lock = lock;
    snprintf(t->space, sizeof t->space, "%s", g->rt->space);
    snprintf(t->key, sizeof t->key, "%s", g->key);
    snprintf(t->owner, sizeof t->owner, "%s", g->owner);
    t->epoch = g->epoch;
    t->lease_ms = g->rt->lease_ms;
    idem_rc rc = lock ? idem_lock_renew_async(d->h, loop_of(g), t->space, t->key, t->owner,
                                              t->lease_ms, renewal_answered, t)
                      : idem_record_extend_async(d->h, loop_of(g), t->space, t->key, t->epoch,
                                                 t->lease_ms, renewal_answered, t);
    if (rc != IDEM_OK) {
        daemon_log_about(LOG_WARN, TIMER_ABOUT(t),
                         "%s/%s: cannot renew the %s: %s", t->space, t->key,
                         lock ? "lock" : "claim's lease", idem_errdetail());
        free(t);
        return;
    }
    if (!lock) { /* the latest extension is the one that tells */
        extending_forget(g);
        t->g = g;
        g->extending = t;
    }
}

static void on_lease(evutil_socket_t fd, short what, void *arg)
{
    struct gw *g = arg;
    (void)fd;
    (void)what;
    int claim = g->state == S_FORWARD || g->state == S_RESOLVE;
    if (g->renewing)
        renewal_start(g, 1);
    if (claim)
        renewal_start(g, 0);
    if (g->renewing || claim) {
        struct timeval tv = ms_timeval(tick_ms(g->rt));
        evtimer_add(g->lease, &tv);
    }
}

/* Renew what g holds from a lease/3 from now, unless that is under way. */
static void lease_start(struct gw *g)
{
    if (evtimer_pending(g->lease, NULL))
        return;
    struct timeval tv = ms_timeval(tick_ms(g->rt));
    evtimer_add(g->lease, &tv);
}

/* ---- forwarding under the claim ---- */

/* A response to the client from an upstream answer m (hop-by-hop removed);
 * head: m answers a HEAD, whose Content-Length (what GET would have) is
 * passed on as the upstream gave it. */
static struct http_response *from_upstream(const struct http_msg *m, int head)
{
    struct http_response *r = response_new(m->status);
    if (!r)
        return NULL;
    r->upstream_head = head;
    for (size_t i = 0; i < m->header_count; i++) {
        const char *n = m->headers[i].name;
        if (http_is_hop_by_hop(m, n) || (!head && strcasecmp(n, "content-length") == 0))
            continue;
        if (response_add_header(r, n, m->headers[i].value)) {
            response_free(r);
            return NULL;
        }
    }
    if (response_set_body(r, m->body, m->body_len)) {
        response_free(r);
        return NULL;
    }
    return r;
}

static void after_finish(struct gw *g);

/* A retried finish was refused (CONFLICT): the record is not PROCESSING at
 * our epoch any more. Finished at our epoch: an earlier try was written
 * after all, and the answer is kept. Otherwise another claim took it over:
 * the alert below, and the client gets the answer of its own execution. */
static void after_conflict_read(struct gw *g)
{
    if (g->rc != IDEM_OK) { /* the store fails again: so does this try */
        idem_record_clear(&g->rec);
        after_finish(g);
        return;
    }
    int kept = g->o == IDEM_FOUND && g->rec.epoch == g->epoch &&
               strcmp(g->rec.state, IDEM_STATE_PROCESSING) != 0;
    if (kept) {
        daemon_log_about(LOG_INFO, ABOUT(g),
                         "%s/%s: the answer is kept: an earlier of %u failed tries was written",
                         g->rt->space, g->key, g->tries);
        g->expires_ms = g->rec.expires_ms;
    }
    set_unkept(g, 0);
    idem_record_clear(&g->rec);
    g->rc = IDEM_OK;
    g->o = !kept ? IDEM_CONFLICT : g->finish == FINISH_HOLD ? IDEM_RENEWED : IDEM_COMPLETED;
    after_finish(g);
}

static void after_finish(struct gw *g)
{
    if (g->rc != IDEM_OK && g->finish != FINISH_FAIL_RETRYABLE && !front_closing(g->req)) {
        /* Executed (or held as unknown): try again until it is kept (see
         * "claims held here"). A failed release needs none of this: its
         * lease ending lets the retry execute, as the release would have. */
        daemon_write_failed(g->d, g->rc);
        g->tries++;
        if (!g->unkept) {
            daemon_log_about(LOG_ERROR, ABOUT(g),
                             "%s/%s: keeping the answer failed: %s: %s; the claim is kept, and "
                             "the answer is written again until the store takes it",
                             g->rt->space, g->key, idem_strerror(g->rc), g->detail);
            set_unkept(g, 1);
            g->retry_ms = 100;
        } else {
            /* Doubling, up to 2 s and to a sixth of the lease: nothing renews
             * the lease meanwhile (a store that fails the finish fails a
             * renewal too), so a store back before the lease runs out is
             * tried again in time, its own reconnecting included. */
            int64_t cap = tick_ms(g->rt) / 2;
            cap = cap < 100 ? 100 : cap > 2000 ? 2000 : cap;
            g->retry_ms = g->retry_ms * 2 > cap ? cap : g->retry_ms * 2;
        }
        enter(g, S_FINISH_WAIT);
        return;
    }
    if (g->unkept && g->rc == IDEM_OK && g->o == IDEM_CONFLICT) {
        /* A try that failed may have been written all the same (a reply
         * lost on the way back): read what the record holds. */
        enter(g, S_FINISH_READ);
        return;
    }
    if (g->unkept && g->rc == IDEM_OK) {
        daemon_log_about(LOG_INFO, ABOUT(g),
                         "%s/%s: the answer is kept after %u failed tries", g->rt->space, g->key,
                         g->tries);
        set_unkept(g, 0);
    }
    if (g->rc == IDEM_OK && g->o == IDEM_COMPLETED && g->finish != FINISH_FAIL_RETRYABLE) {
        /* Durable and final: duplicates from now on are answered with it.
         * Without memory for the header, the answer goes without it. */
        keep_answer(g, g->has_fp ? g->fp : NULL, g->stored, g->stored_len, g->expires_ms);
        if (g->out)
            (void)add_expires(g->out, g->expires_ms);
    }
    if (g->req->outcome == GW_UNDECIDED)
        VERDICT(g, g->finish == FINISH_FAIL_RETRYABLE      ? GW_RELEASED
                   : g->rc != IDEM_OK                      ? GW_OUTCOME_UNKNOWN
                   : g->o == IDEM_CONFLICT                 ? GW_IN_FLIGHT
                   : g->finish == FINISH_HOLD              ? GW_HELD
                                                           : GW_EXECUTED);
    if (g->rc != IDEM_OK) {
        daemon_log_about(LOG_ERROR, ABOUT(g),
                         "%s/%s: finishing the record failed: %s: %s", g->rt->space, g->key,
                         idem_strerror(g->rc), g->detail);
        daemon_write_failed(g->d, g->rc);
    } else {
        daemon_write_ok(g->d);
        if (g->o == IDEM_CONFLICT)
            daemon_log_about(LOG_ALERT, ABOUT(g),
                             "%s/%s: epoch %" PRIu64 " was taken over while it ran",
                             g->rt->space, g->key, g->epoch);
        else if (g->finish == FINISH_HOLD)
            held_census_nudge(&g->d->held, g->d->h, loop_of(g), g->lc->c); /* the gauge */
    }
    finish(g);
}

static void after_give_back(struct gw *g)
{
    /* IDEM_EUNAVAILABLE: never sent, so never done; the token stays spent
     * on the key, and the record is released as without the token layer. */
    if (g->rc != IDEM_OK && g->rc != IDEM_EUNAVAILABLE) {
        /* A store that did not answer may still give the token back later:
         * were the record released now, a retry could execute on the token
         * meanwhile. The claim stays until its lease ends. */
        daemon_log_about(LOG_WARN, ABOUT(g),
                         "%s/%s: giving the token back failed (%s: %s): the record stays "
                         "PROCESSING until its lease ends",
                         g->rt->space, g->key, idem_strerror(g->rc), g->detail);
        g->finish = FINISH_NONE;
        finish(g);
        return;
    }
    enter(g, S_FINISH);
}

static void after_confirm_claim(struct gw *g)
{
    if (g->rc == IDEM_OK && g->o == IDEM_RENEWED)
        enter(g, S_GIVE_BACK);
    else
        enter(g, S_FINISH); /* the token stays spent on the key */
}

static void finish_record(struct gw *g, enum finish_kind kind)
{
    g->finish = kind;
    if (kind == FINISH_NONE)
        finish(g);
    else if (kind == FINISH_FAIL_RETRYABLE && g->token_spent)
        /* The only place a token is given back: by the request that spent
         * it, holding the key's claim, as it releases the claim because it
         * did not execute or failed retryably, before the release.
         * A request riding on that spend (same token, same key) executes
         * only once it holds the claim itself, after taking the token again
         * (after_reconsume); and a spender that does not hold the claim (a
         * 409, a 422, store trouble before the claim) never gives its token
         * back, since a rider may be executing on it: a retry with the token
         * and the key goes on to the record instead. */
        enter(g, S_CONFIRM);
    else
        enter(g, S_FINISH);
}

/* The answer was too big to keep (why says how): the record is finished
 * with a problem (the request did execute), and the client gets that
 * problem. */
static void finish_too_big(struct gw *g, const char *why)
{
    const struct server_config *cfg = g->lc->c;
    response_free(g->out);
    g->req->outcome_type = "upstream_response_too_large"; /* executed: a consumer's reason */
    g->out = problem(502, "upstream_response_too_large",
                     "the upstream executed the request, and its answer was too big to keep "
                     "(%s; a body may have up to response_max, %zu bytes, a head up to %d "
                     "fields and %d bytes); the answer was not kept",
                     why, cfg->limits.response_max, UPSTREAM_HEAD_FIELDS_MAX,
                     UPSTREAM_HEAD_BYTES_MAX);
    free(g->stored);
    g->stored = g->out ? stored_encode_response(localise(cfg, g->rt, g->out), &g->stored_len)
                       : NULL;
    finish_record(g, g->stored ? FINISH_FAIL_FINAL : FINISH_NONE);
}

/* The upstream call is over (answered, failed, or cut): nothing of it is
 * left to abort or renew, and the access log learns how it went. */
static void call_ended(struct gw *g, enum upstream_result ur, int status)
{
    g->call = NULL;
    g->req->on_abort = NULL;
    extending_forget(g);
    if (!g->renewing)
        evtimer_del(g->lease); /* it renewed the claim alone */
    int64_t took = mono_us() - g->sent_us;
    g->req->upstream_us = took > 0 ? took : 1; /* a call was made: never 0 */
    g->req->upstream_status = status;
    g->req->upstream_result = (int)ur;
}

static void on_upstream(void *arg, enum upstream_result ur, struct http_msg *resp,
                        const char *detail)
{
    struct gw *g = arg;
    const struct route *rt = g->rt;
    const struct server_config *cfg = g->lc->c;
    call_ended(g, ur, ur == UPSTREAM_OK ? resp->status : 0);
    switch (ur) {
    case UPSTREAM_OK: {
        int retry = !config_route_keeps(rt, resp->status);
        int ok = resp->status < rt->fails_from;
        g->out = from_upstream(resp, strcmp(g->req->msg->method, "HEAD") == 0);
        if (retry) {
            if (rt->max_attempts && g->attempt >= rt->max_attempts)
                VERDICT(g, GW_EXHAUSTED); /* the last attempt (see "attempts") */
            finish_record(g, FINISH_FAIL_RETRYABLE);
            break;
        }
        g->stored = stored_encode(rt, resp->status, resp, &g->stored_len);
        if (!g->stored) {
            /* Executed, and we cannot keep its answer: keep the claim
             * (PROCESSING) rather than let a retry run it again. */
            VERDICT(g, GW_OUTCOME_UNKNOWN);
            response_free(g->out);
            g->out = NULL;
            finish_record(g, FINISH_NONE);
        } else if (g->stored_len > cfg->limits.response_max + 65536) {
            finish_too_big(g, "its body and the headers to keep come to more than "
                              "response_max and 64 KiB");
        } else {
            finish_record(g, ok ? FINISH_COMPLETE : FINISH_FAIL_FINAL);
        }
        break;
    }
    case UPSTREAM_NOT_SENT:
        g->out = problem(502, "upstream_unreachable",
                         "%s; the request was not executed and may be retried", detail);
        if (rt->max_attempts && g->attempt >= rt->max_attempts)
            VERDICT(g, GW_EXHAUSTED); /* the last attempt (see "attempts") */
        finish_record(g, FINISH_FAIL_RETRYABLE);
        break;
    case UPSTREAM_TIMEOUT:
    case UPSTREAM_UNKNOWN:
        COUNT(g->rt, upstream_unknown);
        VERDICT(g, rt->unknown_hold || rt->resolve ? GW_HELD : GW_OUTCOME_UNKNOWN);
        if (rt->resolve) {
            /* Held until the first question; then whoever takes the claim
             * over (a retry, or the resolver) asks first (see "resolving"). */
            incidents_note_why(INCIDENT_HELD, rt, g->key, g->epoch, detail);
            g->hold_for_ms = rt->resolve->after_ms;
            g->out = problem(504, "outcome_unknown",
                             "%s; the request may have been executed. Its record is held "
                             "PROCESSING (epoch %" PRIu64 ") and the service is asked in %" PRId64
                             " ms whether it executed; retries get 409 until it answers",
                             detail, g->epoch, rt->resolve->after_ms);
            (void)problem_set_claim(g->out, g->epoch, wall_ms() + rt->resolve->after_ms);
            finish_record(g, FINISH_HOLD);
            break;
        }
        if (rt->unknown_hold) {
            incidents_note_why(INCIDENT_HELD, rt, g->key, g->epoch, detail);
            g->out = problem(504, "outcome_unknown",
                             "%s; the request may have been executed. Its record is held "
                             "PROCESSING (epoch %" PRIu64 ") for %" PRId64 " ms, until an "
                             "operator finishes it through the JSON API; retries get 409",
                             detail, g->epoch, hold_ms(rt));
            (void)problem_set_claim(g->out, g->epoch, wall_ms() + hold_ms(rt));
            finish_record(g, FINISH_HOLD);
            break;
        }
        g->out = problem(504, "outcome_unknown",
                         "%s; the request may have been executed. Its record stays PROCESSING "
                         "until its lease ends (%" PRId64 " ms); retries get 409 until then",
                         detail, rt->lease_ms);
        (void)problem_set_claim(g->out, g->epoch, 0);
        finish_record(g, FINISH_NONE);
        break;
    case UPSTREAM_TOO_BIG:
        finish_too_big(g, detail);
        break;
    }
    http_msg_free(resp);
}

/* The claim's extension found the claim gone while the upstream had the
 * request (see "leases"): cut the call, answer as an unknown outcome,
 * leave the record to its new owner. */
static void claim_lost(struct gw *g, idem_outcome o)
{
    const struct route *rt = g->rt;
    upstream_call_cancel(g->call);
    call_ended(g, UPSTREAM_UNKNOWN, 0);
    COUNT(rt, upstream_unknown);
    VERDICT(g, GW_OUTCOME_UNKNOWN);
    const char *why = o == IDEM_NOT_FOUND
                          ? "its record was deleted"
                          : "its record is no longer PROCESSING at this claim's epoch (taken "
                            "over after its lease ran out, or finished by an operator)";
    daemon_log_about(LOG_WARN, ABOUT(g),
                     "%s/%s: the claim (epoch %" PRIu64 ") was lost while the upstream "
                     "had the request: %s; the upstream call is cut", rt->space, g->key, g->epoch,
                     why);
    g->out = problem(504, "outcome_unknown",
                     "the claim (epoch %" PRIu64 ") was lost while the upstream had the request: "
                     "%s. The call was cut, and the request may have been executed",
                     g->epoch, why);
    (void)problem_set_claim(g->out, g->epoch, 0);
    finish_record(g, FINISH_NONE);
}

static void forward(struct gw *g)
{
    const struct route *rt = g->rt;
    const struct http_msg *m = g->req->msg;
    struct daemon_loop *loop = g->req->loop_ctx;
    /* "Idem-Key: space/key": the space is at most IDEM_NAME_MAX bytes. */
    char epoch_hdr[64], key_hdr[IDEM_NAME_MAX + IDEM_KEY_MAX + 16];
    char *o = put(epoch_hdr, "Idem-Epoch: ", 12);
    *put_uint(o, g->epoch) = '\0';
    o = put_str(put(key_hdr, "Idem-Key: ", 10), rt->space);
    *o++ = '/';
    *put_str(o, g->key) = '\0';
    char attempt_hdr[32];
    o = put(attempt_hdr, "Idem-Attempt: ", 14);
    *put_uint(o, g->attempt) = '\0';
    /* A states route's move: from where to where (see "states"). */
    char from_hdr[IDEM_NAME_MAX + 24], to_hdr[IDEM_NAME_MAX + 24];
    *put_str(put(from_hdr, "Idem-State-From: ", 17), g->from) = '\0';
    *put_str(put(to_hdr, "Idem-State-To: ", 15), g->to) = '\0';
    /* The request's id, the one the front made when the client gave none. */
    char id_hdr[sizeof g->req->request_id + 16];
    *put_str(put(id_hdr, "X-Request-Id: ", 14), g->req->request_id) = '\0';
    const char *extra[7] = {epoch_hdr, key_hdr};
    size_t n_extra = 2;
    if (g->req->request_id_own)
        extra[n_extra++] = id_hdr;
    /* Only a route with max_attempts counts its claims (see "attempts"). */
    if (rt->max_attempts)
        extra[n_extra++] = attempt_hdr;
    if (rt->states) {
        extra[n_extra++] = from_hdr;
        extra[n_extra++] = to_hdr;
    }
    struct upstream_request rq = {
        .method = m->method,
        .base_path = rt->upstream.base_path,
        .target = m->target,
        .original = m,
        .peer = g->req->peer[0] ? g->req->peer : NULL,
        .proto = g->req->peer[0] ? (g->req->tls ? "https" : "http") : NULL,
        .pass_host = rt->pass_host,
        .extra = extra,
        .timeout_ms = rt->upstream_timeout_ms,
        .response_max = g->lc->c->limits.response_max,
    };
    COUNT(g->rt, executions);
    g->forwarded = 1;
    g->sent_us = mono_us();
    g->call = upstream_call_start(loop->upstreams, rt->upstream.addrs, &rq, on_upstream, g);
    if (!g->call) {
        g->forwarded = 0;
        finish_record(g, FINISH_FAIL_RETRYABLE);
        return;
    }
    g->req->on_abort = on_abort;
    lease_start(g);
}

/* ---- resolving ----
 *
 * On a route with on_unknown_outcome: resolve, an unknown outcome is not
 * left to its lease: the claim is held until the first question (resolve
 * .after), and whoever takes it over once that hold ends — a retry of the
 * client's, or the resolver (resolver.c), which looks for such claims in
 * the store every second — asks the service (resolve.url, GET) before
 * anything executes again. A crash's abandoned claim is asked about the
 * same way: the question belongs to the record, not to a process.
 *
 *   executed      the record completes with the status query's answer,
 *                 marked Idem-Resolved: true; the retry gets it replayed
 *   not_executed  the retry executes under its claim; the resolver
 *                 releases the claim, so the next retry does
 *   anything else held again until the next question (resolve.backoff),
 *                 409 with Retry-After until then; past give_up, held for
 *                 an operator, as on_unknown_outcome: hold does
 *
 * Each question is a claim of its own (epoch + 1), so two instances never
 * ask at once, and the question's number is the claim's (see "attempts"). */

static void take_to_resolve(struct gw *g)
{
    unsigned attempt = attempt_of(&g->rec);
    g->epoch = g->rec.epoch;
    g->created_ms = g->rec.created_ms;
    g->question = attempt >= 2 ? attempt - 2 : 0;
    g->req->epoch = g->epoch;
    idem_record_clear(&g->rec);
    enter(g, S_RESOLVE);
}

/* A resolver's look that found nothing to ask about (finished meanwhile,
 * in flight, or gone: a claim it made of a vanished key is given back). */
static void resolver_nothing(struct gw *g)
{
    g->out = json_response(200, json_pack("{s:s}", "resolved", "nothing to ask"));
    if (g->rc == IDEM_OK && g->o == IDEM_NEW) {
        g->epoch = g->rec.epoch;
        idem_record_clear(&g->rec);
        finish_record(g, FINISH_FAIL_RETRYABLE);
        return;
    }
    idem_record_clear(&g->rec);
    finish(g);
}

enum resolution { RESOLVED_EXECUTED, RESOLVED_NOT_EXECUTED, RESOLVED_UNANSWERED, RESOLVED_GIVEN_UP };

static const char *resolution_name(enum resolution v)
{
    static const char *const names[] = {"executed", "not_executed", "unanswered", "given_up"};
    return names[v];
}

static void resolved(struct gw *g, enum resolution v, int status, const char *detail)
{
    const struct route *rt = g->rt;
    atomic_fetch_add(&rt->n->resolutions[v], 1);
    char why[300];
    if (detail)
        snprintf(why, sizeof why, "%s", detail);
    else
        snprintf(why, sizeof why, "status %d", status);
    /* And the access log's line, as for a request. */
    struct daemon_loop *loop = g->req->loop_ctx;
    if (loop->alog)
        access_log_question(loop->alog,
                            &(struct access_question){
                                .route = rt->name, .key = g->key, .epoch = g->epoch,
                                .question = g->question + 1, .verdict = resolution_name(v),
                                .status = status, .upstream_us = g->req->upstream_us,
                                .request_id = g->resolver ? NULL : g->req->request_id});
    daemon_log_about(v == RESOLVED_GIVEN_UP ? LOG_ALERT : LOG_INFO, ABOUT(g),
                     "route %s: %s/%s (epoch %" PRIu64 "), status query %u: %s (%s)%s", rt->name,
                     rt->space, g->key, g->epoch, g->question + 1, resolution_name(v), why,
                     v == RESOLVED_GIVEN_UP ? "; held for an operator, as on_unknown_outcome: hold"
                     : "");
}

/* Ask again later, or give up and hold for an operator. */
static void ask_later(struct gw *g, int status, const char *detail)
{
    const struct route_resolve *rs = g->rt->resolve;
    int give_up = wall_ms() - g->created_ms >= rs->give_up_ms;
    resolved(g, give_up ? RESOLVED_GIVEN_UP : RESOLVED_UNANSWERED, status, detail);
    g->hold_for_ms = give_up ? hold_ms(g->rt) : resolve_wait_ms(rs, g->question + 1);
    /* Why the claim (at the question's epoch) is held, with the service's
     * last answer: what an operator reads beside it (an event's why holds
     * 127 bytes: the answer, free text, last). */
    char answer[120], why[260];
    if (detail)
        snprintf(answer, sizeof answer, "%s", detail);
    else
        snprintf(answer, sizeof answer, "status %d", status);
    if (give_up)
        snprintf(why, sizeof why, "the resolver gave up after %u questions; the last: %s",
                 g->question + 1, answer);
    else
        snprintf(why, sizeof why,
                 "an unknown outcome, being resolved: asked again in %" PRId64
                 " s; status query %u answered %s",
                 (g->hold_for_ms + 999) / 1000, g->question + 1, answer);
    incidents_note_why(INCIDENT_HELD, g->rt, g->key, g->epoch, why);
    VERDICT(g, GW_HELD);
    g->out = problem(409, "request_in_flight",
                     "an earlier request with this idempotency key may have been executed: the "
                     "service %s whether it was (epoch %" PRIu64 ")%s",
                     give_up ? "never said" : "has not said yet", g->epoch,
                     give_up ? "; it is held until an operator finishes it" : "");
    if (g->out) {
        char secs[24];
        snprintf(secs, sizeof secs, "%" PRId64, (g->hold_for_ms + 999) / 1000);
        response_add_header(g->out, "Retry-After", secs);
        (void)problem_set_claim(g->out, g->epoch, wall_ms() + g->hold_for_ms);
    }
    finish_record(g, FINISH_HOLD);
}

static void on_status_query(void *arg, enum upstream_result ur, struct http_msg *resp,
                            const char *detail)
{
    struct gw *g = arg;
    const struct route *rt = g->rt;
    const struct route_resolve *rs = rt->resolve;
    int status = ur == UPSTREAM_OK ? resp->status : 0;
    call_ended(g, ur, status);
    if (status && status_set_has(rs->executed, status)) {
        resolved(g, RESOLVED_EXECUTED, status, NULL);
        /* The status query's answer is the key's, marked as resolved. */
        char *plain = stored_encode(rt, status, resp, &g->stored_len);
        struct http_response *r = plain ? stored_decode(plain, g->stored_len) : NULL;
        free(plain);
        g->stored = r && response_add_header(r, "Idem-Resolved", "true") == 0
                        ? stored_encode_response(r, &g->stored_len)
                        : NULL;
        response_free(r);
        if (!g->stored) { /* no memory: asked again later */
            http_msg_free(resp);
            ask_later(g, status, "its answer could not be kept");
            return;
        }
        if (g->resolver) {
            g->out = json_response(200, json_pack("{s:s}", "resolved", "executed"));
        } else {
            VERDICT(g, GW_REPLAYED);
            g->out = decode_replay(g->stored, g->stored_len, wall_ms() + rt->retention_ms);
            g->out = counted_replay(rt, g->out, "resolved");
        }
        finish_record(g, status < rt->fails_from ? FINISH_COMPLETE : FINISH_FAIL_FINAL);
    } else if (status && status_set_has(rs->not_executed, status)) {
        resolved(g, RESOLVED_NOT_EXECUTED, status, NULL);
        if (g->resolver) {
            g->out = json_response(200, json_pack("{s:s}", "resolved", "not_executed"));
            finish_record(g, FINISH_FAIL_RETRYABLE); /* the next retry executes */
        } else {
            enter(g, g->token_rode ? S_RESPEND : S_FORWARD); /* this one does */
        }
    } else {
        ask_later(g, status, status ? NULL : detail);
    }
    http_msg_free(resp);
}

static void ask(struct gw *g)
{
    const struct route *rt = g->rt;
    struct daemon_loop *loop = g->req->loop_ctx;
    char target[4096], epoch_hdr[64], key_hdr[IDEM_NAME_MAX + IDEM_KEY_MAX + 16];
    if (resolve_target(rt->resolve, rt->space, g->key, target, sizeof target) != 0) {
        ask_later(g, 0, "the status query's URL with this key is longer than 4 KiB");
        return;
    }
    *put_uint(put(epoch_hdr, "Idem-Epoch: ", 12), g->epoch) = '\0';
    char *o = put_str(put(key_hdr, "Idem-Key: ", 10), rt->space);
    *o++ = '/';
    *put_str(o, g->key) = '\0';
    const char *extra[] = {epoch_hdr, key_hdr, NULL};
    struct upstream_request rq = {
        .method = "GET",
        .target = target,
        .extra = extra,
        .timeout_ms = rt->upstream_timeout_ms,
        .response_max = g->lc->c->limits.response_max,
    };
    g->sent_us = mono_us();
    g->call = upstream_call_start(loop->upstreams, rt->resolve->url.addrs, &rq, on_status_query, g);
    if (!g->call) {
        ask_later(g, 0, "the status query could not be started");
        return;
    }
    g->req->on_abort = on_abort;
    lease_start(g);
}

/* ---- the transition function ---- */

/* The work of g's state came back (a store call: g->rc, g->o, g->rec say
 * what it found): decide where g goes next. */
static void done(struct gw *g)
{
    switch (g->state) {
    case S_READ:
        after_read(g);
        break;
    case S_TOKEN:
        after_token(g);
        break;
    case S_LOCK:
        after_lock(g);
        break;
    case S_LOCK_READ:
        after_busy_get(g);
        break;
    case S_BEGIN:
        after_begin(g);
        break;
    case S_RESPEND:
        after_reconsume(g);
        break;
    case S_CONFIRM:
        after_confirm_claim(g);
        break;
    case S_GIVE_BACK:
        after_give_back(g);
        break;
    case S_FINISH:
        after_finish(g);
        break;
    case S_FINISH_READ:
        after_conflict_read(g);
        break;
    case S_CLEANUP:
        enter(g, S_DONE);
        break;
    default: /* the waits and the upstream end in on_timer and on_upstream */
        assert(!"done() in a state without a store call");
        break;
    }
}

/* ---- entry ---- */

/* The read for a finished record (S_READ) costs a store call: on a SQLite
 * file a transaction on a reader, at once; on PostgreSQL a statement in
 * the writers' next batch. On traffic of fresh keys it never finds one, and
 * the begin that follows finds a finished record anyway (DONE), only later:
 * so it is taken while it pays off (core/hint.h, the store's own rule for
 * its peeks), a begin the writer answered DONE counting as a read that
 * would have. */
/* An answer given before the request's state exists (see answer() for the
 * others): timed, then sent. */
static void answer_early(struct live_config *lc, const struct route *rt,
                         struct front_request *req, struct http_response *r, int64_t t0)
{
    if (r && r->problem_type[0])
        (void)problem_set_instance(r, req->request_id);
    counts_observe(rt, t0);
    daemon_answer(lc, req, localise(lc->c, rt, r));
}

/* Answer a duplicate from the loop's replay cache, if its answer is kept
 * there: 1 when answered. The first duplicate on a kept-alive connection
 * builds the bytes the next ones get. */
static int answer_kept(struct daemon *d, struct live_config *lc, const struct route *rt,
                       struct front_request *req, const char *key, const uint8_t *fp,
                       unsigned long gen, int64_t t0)
{
    struct daemon_loop *loop = req->loop_ctx;
    struct replay_kept kept;
    if (!replay_cache_get(loop->replays, rt->space, key, fp, mono_ms(), gen, &kept) ||
        (kept.expires_ms && kept.expires_ms <= wall_ms()))
        return 0; /* past its retention, the store decides (tombstone, or new) */
    req->outcome = GW_REPLAYED;
    int raw = front_can_answer_raw(req);
    struct http_response *r = NULL;
    if (!kept.wire_len || !raw)
        r = decode_replay(kept.stored, kept.stored_len, kept.expires_ms);
    if (r && raw && !kept.wire_len) {
        /* Fresh from decoding, r has no close set: the kept-alive form. */
        size_t len;
        char *wire = response_serialize(r, 0, &len);
        if (wire)
            replay_cache_add_wire(loop->replays, &kept, wire, len);
        free(wire);
    }
    if (raw && kept.wire_len) {
        response_free(r);
        COUNT(rt, replays);
        counts_observe(rt, t0);
        daemon_config_put(lc);
        front_answer_raw(req, kept.wire, kept.wire_len);
        return 1;
    }
    answer_early(lc, rt, req, counted_replay(rt, r, "finished"), t0);
    return 1;
}

static void forward_untouched(struct daemon *d, const struct upstream_url *to, int64_t timeout_ms,
                              int pass_host, const struct server_config *cfg,
                              struct front_request *req, enum gw_outcome outcome);

/* A request's state on route rt for key, with its two timers in one
 * block; NULL for want of memory. */
static struct gw *gw_new(struct daemon *d, struct live_config *lc, const struct route *rt,
                         struct front_request *req, const char *key, int64_t t0)
{
    struct daemon_loop *loop = req->loop_ctx;
    size_t head = (sizeof(struct gw) + 15) & ~(size_t)15;
    size_t ev = (event_get_struct_event_size() + 15) & ~(size_t)15;
    struct gw *g = calloc(1, head + 2 * ev);
    if (!g)
        return NULL;
    g->timer = (struct event *)((char *)g + head);
    g->lease = (struct event *)((char *)g + head + ev);
    evtimer_assign(g->timer, loop->base, on_timer, g);
    evtimer_assign(g->lease, loop->base, on_lease, g);
    g->req = req;
    g->d = d;
    g->lc = lc;
    g->rt = rt;
    req->state = g;
    g->subject = "";
    memcpy(g->key, key, strlen(key) + 1);
    g->t0 = t0;
    uint64_t h = 14695981039346656037ull; /* FNV-1a */
    for (const char *c = rt->space; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull; /* no name holds 0xff: space/key apart */
    for (const char *c = g->key; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    g->key_hash = h;
    snprintf(g->owner, sizeof g->owner, "%s-%lu", d->instance, atomic_fetch_add(&d->seq, 1) + 1);
    g->deadline = mono_ms() + rt->wait_timeout_ms;
    g->backoff_ms = 2;
    return g;
}

void gateway_resolve(struct daemon *d, struct live_config *lc, const struct route *rt,
                     struct front_request *req, const char *key)
{
    int64_t t0 = mono_us();
    snprintf(req->log_route, sizeof req->log_route, "%s", rt->name);
    snprintf(req->log_key, sizeof req->log_key, "%s", key);
    struct gw *g = gw_new(d, lc, rt, req, key, t0);
    if (!g) {
        daemon_config_put(lc);
        front_answer(req); /* 503: the next look asks again */
        return;
    }
    g->resolver = 1;
    go_begin(g); /* no lock, no fingerprint: a claim whose lease ran out is taken over */
}

void gateway_start(struct daemon *d, struct live_config *lc, const struct route *rt,
                   struct front_request *req)
{
    const struct server_config *cfg = lc->c;
    const struct http_msg *m = req->msg;
    char detail[512], key[IDEM_KEY_MAX + 1];
    uint8_t fp[IDEM_FINGERPRINT_LEN] = {0};
    int has_fp = 0;
    const char *type = NULL;
    int64_t t0 = mono_us();
    COUNT(rt, requests);
    snprintf(req->log_route, sizeof req->log_route, "%s", rt->name);
    /* Signed callbacks: before the key is even read, so that a forgery
     * leaves no trace in any layer (see signature.h). */
    int status = rt->signature
                     ? signature_check(rt->signature, m, wall_ms(), &type, detail, sizeof detail)
                     : 0;
    if (status) {
        req->outcome = GW_SIGNATURE_REFUSED;
        req->outcome_type = type;
        answer_early(lc, rt, req, problem(status, type, "%s", detail), t0);
        return;
    }
    const char *subject;
    status = request_subject(m, cfg->subject_header, &subject, detail, sizeof detail);
    if (status)
        type = "subject_invalid";
    else
        status = request_key(rt, m, subject, key, &type, detail, sizeof detail);
    /* states: the state the event moves its key to, one of the route's. */
    char to[IDEM_NAME_MAX + 1] = "";
    if (!status && rt->states &&
        (status = request_state(rt, m, to, sizeof to, detail, sizeof detail)) != 0)
        type = "unknown_state";
    if (status && rt->key_optional && type && strcmp(type, "key_missing") == 0) {
        /* key_required: false: without its key the request goes to the
         * route's upstream unguarded, as Stripe takes a POST without an
         * Idempotency-Key. */
        COUNT(rt, unkeyed);
        counts_observe(rt, t0);
        forward_untouched(d, &rt->upstream, rt->upstream_timeout_ms, rt->pass_host, cfg, req,
                          GW_UNKEYED);
        daemon_config_put(lc);
        return;
    }
    if (status) {
        req->outcome = GW_KEY_INVALID;
        req->outcome_type = type;
        answer_early(lc, rt, req, problem(status, type, "%s", detail), t0);
        return;
    }
    snprintf(req->log_key, sizeof req->log_key, "%s", key);
    if ((status = request_fingerprint(rt, m, fp, &has_fp, detail, sizeof detail)) != 0) {
        req->outcome = status == 400 ? GW_KEY_INVALID : GW_UNDECIDED;
        req->outcome_type = "fingerprint_unavailable";
        answer_early(lc, rt, req, problem(status, "fingerprint_unavailable", "%s", detail), t0);
        return;
    }
    /* A finished record: its answer kept from a moment ago — answered here,
     * before anything is allocated for the request — or read below when
     * reading does not block (with the token layer, an unknown token is
     * refused even for a finished key, so neither). */
    struct daemon_loop *loop = req->loop_ctx;
    unsigned long gen = atomic_load(&d->replay_gen);
    if (loop->replay_gen != gen) {
        replay_cache_clear(loop->replays); /* all of it is stale now */
        loop->replay_gen = gen;
    }
    if (!rt->layer_token && !rt->states &&
        answer_kept(d, lc, rt, req, key, has_fp ? fp : NULL, gen, t0))
        return;
    struct gw *g = gw_new(d, lc, rt, req, key, t0);
    if (!g) {
        answer_early(lc, rt, req, NULL, t0); /* 503 */
        return;
    }
    g->subject = subject ? subject : "";
    memcpy(g->to, to, sizeof to);
    memcpy(g->fp, fp, sizeof fp);
    g->has_fp = has_fp;
    g->replay_gen = gen;
    if (!rt->layer_token) {
        if (idem__hint_take(&d->gateway->reads))
            enter(g, S_READ);
        else
            go_lock(g);
        return;
    }
    g->token = http_msg_header(m, "Idem-Token");
    if (!g->token || !*g->token) {
        VERDICT(g, GW_TOKEN_REFUSED);
        g->out = problem(428, "token_missing",
                         "route %s needs a one-time token in the Idem-Token header "
                         "(POST /_idem/v1/tokens issues one for scene %s)",
                         rt->name, rt->token_scene);
        enter(g, S_DONE);
        return;
    }
    enter(g, S_TOKEN);
}

/* ---- no route: proxied untouched ---- */

struct pass {
    struct front_request *req;
    struct upstream_call *call;
    int64_t sent_us;
};

static void pass_answer(struct pass *p, struct http_response *r)
{
    struct front_request *req = p->req;
    free(p);
    req->resp = r;
    front_answer(req);
}

static void on_pass_abort(struct front_request *req)
{
    struct pass *p = req->state;
    int sent = upstream_call_sent(p->call);
    upstream_call_cancel(p->call);
    pass_answer(p, sent ? problem(504, "outcome_unknown",
                                  "the server stopped while the upstream had the request; it "
                                  "may have been executed (passed through: nothing recorded)")
                        : problem(503, "shutting_down",
                                  "the server stopped before the request was sent to the "
                                  "upstream; it was not executed"));
}

static void on_passed(void *arg, enum upstream_result ur, struct http_msg *resp, const char *detail)
{
    struct pass *p = arg;
    p->req->on_abort = NULL;
    p->req->upstream_us = mono_us() - p->sent_us;
    p->req->upstream_status = ur == UPSTREAM_OK ? resp->status : 0;
    int head = strcmp(p->req->msg->method, "HEAD") == 0;
    pass_answer(p, ur == UPSTREAM_OK ? from_upstream(resp, head)
                                     : problem(ur == UPSTREAM_TIMEOUT ? 504 : 502,
                                               "upstream_failed", "%s", detail));
    http_msg_free(resp);
}

/* req to the upstream at `to` as it came, its answer back as it is:
 * nothing recorded. The call holds the upstream's addresses. */
static void forward_untouched(struct daemon *d, const struct upstream_url *to, int64_t timeout_ms,
                              int pass_host, const struct server_config *cfg,
                              struct front_request *req, enum gw_outcome outcome)
{
    const struct http_msg *m = req->msg;
    struct daemon_loop *loop = req->loop_ctx;
    char id_hdr[sizeof req->request_id + 16];
    *put_str(put(id_hdr, "X-Request-Id: ", 14), req->request_id) = '\0';
    const char *extra[] = {req->request_id_own ? id_hdr : NULL, NULL};
    struct upstream_request rq = {
        .method = m->method,
        .base_path = to->base_path,
        .target = m->target,
        .original = m,
        .peer = req->peer,
        .proto = req->tls ? "https" : "http",
        .pass_host = pass_host,
        .extra = extra,
        .timeout_ms = timeout_ms,
        .response_max = cfg->limits.response_max,
    };
    struct pass *p = calloc(1, sizeof *p);
    if (p)
        p->call = upstream_call_start(loop->upstreams, to->addrs, &rq, on_passed, p);
    if (!p || !p->call) {
        free(p);
        front_answer(req); /* resp NULL: 503 */
        return;
    }
    if (outcome == GW_PASSED_THROUGH)
        atomic_fetch_add(&d->passthrough, 1);
    req->outcome = outcome;
    p->sent_us = mono_us();
    p->req = req;
    req->state = p;
    req->on_abort = on_pass_abort;
}

void passthrough_start(struct daemon *d, const struct server_config *cfg,
                       struct front_request *req)
{
    if (!cfg->has_upstream) {
        char path[512];
        request_path(req->msg->target, path, sizeof path);
        req->resp = problem(404, "no_route",
                            "no route matches %s %s, and no default upstream is configured",
                            req->msg->method, path);
        front_answer(req);
        return;
    }
    forward_untouched(d, &cfg->upstream, 30000, 0, cfg, req, GW_PASSED_THROUGH);
}
