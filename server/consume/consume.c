/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consume.c — the consumers (consume.h): a message is a gateway request.
 *
 * Each consumer has a thread and an event loop of its own, with the
 * gateway's loop state (upstream connections, a replay cache) and a front
 * end without listeners. A message becomes a request made on that front
 * (front_inject): POST of its body to the handler, its headers as the
 * request's, its id in Idem-Message-Id. gateway_start() runs it through
 * the steps a route's request takes — key, fingerprint, the record's
 * begin, the handler under the claim (the upstream client), the finish —
 * on the consumer's route, whose space an HTTP route may share. What the
 * gateway made of it (front_request.outcome) decides what the broker is
 * told, and only ever after the record is durable:
 *
 *   delivered ──► key, fingerprint ── missing/invalid ─────► dead letter (reason), ack
 *                     │
 *                 begin (record) ── DONE ───────────────────► ack (a duplicate); if it
 *                     │                                        failed, dead letter again
 *                     │            ├─ MISMATCH ─────────────► dead letter key_reused, ack
 *                     │            ├─ states: STALE ────────► ack (its key moved past it)
 *                     │            ├─ tombstone: expired ───► ack, logged key_expired
 *                     │            ├─ states: CONFLICT ─────► dead letter transition_conflict
 *                     │            ├─ IN_PROGRESS ──────────► held, tried again later
 *                     │            └─ claim past max_attempts ► dead letter attempts_exhausted
 *                 NEW / TAKEN_OVER (attempt = the claim's number)
 *                     │
 *                 POST to the handler ── 2xx, kept ─────────► ack
 *                     ├─ 4xx (not 408/425/429), kept ───────► dead letter handler_rejected
 *                     ├─ 5xx/408/425/429/refused, released ─► held, tried again after the
 *                     │    (after the last attempt: dead       backoff (attempts counted in
 *                     │    letter attempts_exhausted)          the record: see gateway.c)
 *                     ├─ too big to keep, kept as failed ───► dead letter
 *                     │                                        handler_answer_too_large
 *                     └─ sent, no answer ───────────────────► held; PROCESSING until its lease
 *                                                              ends, then taken over
 *   store down ─────────────────────────────────────────────► held, tried again; nothing acked
 *
 * The same walk as the states a message held here is in (struct held's
 * state; every change goes through enter(), which checks allowed_next[]):
 *
 *      ┌──────────── bad, over limits: dead letter ────────────┐
 *      │        submit()                on_answered()            ▼
 *   DELIVERED ───────────► RUNNING ──────────────────────────► SETTLING ──► DONE
 *      │                     ▲   │ retry_later()                  │
 *      │ no request          │   │ (released, in flight,          │ dead letter
 *      │ (OOM)     on_retry()│   ▼  store down)                   │ not sure written
 *      └───────────────────► HELD ◄───────────────────────────────┘
 *                             │
 *                             └── lost connection, draining ──► DONE
 *
 *   DELIVERED → RUNNING   submit(): the request is in the gateway
 *   DELIVERED → SETTLING  consumer_deliver(): bad or over limits, dead letter
 *   DELIVERED → HELD      submit(): no request could be made (OOM)
 *   RUNNING → SETTLING    on_answered(): ack or dead letter
 *   RUNNING → HELD        on_answered(): retry or wait (retry_later())
 *   SETTLING → HELD       dead_letter(): not sure it was written, again later
 *   HELD → RUNNING        on_retry(): submit() again
 *   HELD → HELD           on_retry(): no request could be made (OOM)
 *   any → DONE            drop(): acked, dead-lettered, or left to the broker
 *                         (a lost connection, draining, a stopped loop)
 *
 *   DELIVERED  taken from the source and in the held list; checked
 *              (consumer_deliver) and not yet anywhere else.
 *   RUNNING    a request in the gateway: its on_answered() runs exactly
 *              once; a lost connection or a drain leaves it be.
 *   SETTLING   the broker is being told (ack, dead letter): whoever tells
 *              it drops it or holds it; a lost connection leaves it be.
 *   HELD       its timer is armed, nothing else refers to it: a lost
 *              connection or a drain drops it (the broker has it again).
 *   DONE       given up here (acked, dead-lettered, left to the broker):
 *              drop() frees it at once.
 *
 * A held message is not acked, so it occupies one of the prefetch slots
 * (the broker sends no more than prefetch unacked messages): with the
 * store down, the consumer soon takes nothing more. A message of a lost
 * broker connection is never acked on another: the broker gives it out
 * again, and its record answers for it (DONE, or the claim in progress).
 */
#include "consume/consume.h"

#include <assert.h>
#include <event2/event.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "telemetry/access_log.h"
#include "daemon.h"
#include "gateway/gateway.h"
#include "gateway/route_config.h"
#include "idem/libevent.h"
#include "http/front.h"
#include "http/http_parser.h"
#include "log.h"
#include "mono.h"
#include "gateway/replay_cache.h"
#include "gateway/request_key.h"
#include "http/upstream.h"

/* Where a message held here is in its walk (the picture above). */
enum msg_state { M_DELIVERED, M_RUNNING, M_SETTLING, M_HELD, M_DONE };

#define BIT(s) (1u << (s))

static const unsigned allowed_next[] = {
    [M_DELIVERED] = BIT(M_RUNNING) | BIT(M_SETTLING) | BIT(M_HELD) | BIT(M_DONE),
    [M_RUNNING] = BIT(M_SETTLING) | BIT(M_HELD) | BIT(M_DONE),
    [M_SETTLING] = BIT(M_HELD) | BIT(M_DONE),
    [M_HELD] = BIT(M_RUNNING) | BIT(M_HELD) | BIT(M_DONE),
    [M_DONE] = 0,
};

/* A message the consumer holds, from its delivery to its ack (or to its
 * connection's loss). */
struct held {
    struct consumer *k;
    struct held *prev, *next;
    struct mq_message *m;
    struct event *timer;  /* waiting to be tried again */
    enum msg_state state; /* changed by enter() only */
    int last_status;      /* the handler's last answer (0: none seen here) */
    unsigned attempts;    /* the last claim's number */
    unsigned waits;       /* tries again without an attempt (in flight elsewhere, store) */
};

struct consumer {
    struct daemon *d;
    struct live_config *lc;
    const struct consumer_config *cfg;
    struct consumer_counters n;
    pthread_t thread;
    int running;
    struct daemon_loop ctx;
    struct front *front;
    const struct mq_source_ops *ops;
    void *src;
    struct held *held;
    unsigned long gen; /* the source's connection: +1 at each connect */
    int up;
    int stopping;      /* draining: nothing new is taken */
    int stopped;       /* the loop has ended: nothing is told the broker */
    int64_t drain_ms;
    struct event *drain_ev;
    struct redrive *redrives; /* running now (see "the redrive") */
    struct event *redrive_wait; /* draining: the redrives' time to end */
};

struct consumers {
    size_t count;
    struct consumer *k;
};

void mq_message_free(struct mq_message *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->header_count; i++) {
        free(m->headers[i].name);
        free(m->headers[i].value);
    }
    free(m->headers);
    free(m->body);
    free(m->id);
    free(m->content_type);
    free(m->dead_reason);
    free(m);
}

#define IDEM_HEADER_PREFIX "x-idem-"

int mq_dead_unwrap(struct mq_message *m)
{
    size_t kept = 0;
    for (size_t i = 0; i < m->header_count; i++) {
        struct mq_header *h = &m->headers[i];
        if (strncasecmp(h->name, IDEM_HEADER_PREFIX, strlen(IDEM_HEADER_PREFIX)) != 0) {
            m->headers[kept++] = *h;
            continue;
        }
        if (!m->dead_reason && strcasecmp(h->name, "x-idem-reason") == 0) {
            m->dead_reason = h->value;
            h->value = NULL;
        }
        free(h->name);
        free(h->value);
    }
    m->header_count = kept;
    return m->dead_reason || (m->dead_reason = strdup("")) ? 0 : -1;
}

int mq_add_header(struct mq_message *m, const char *name, size_t nlen, const char *value,
                  size_t vlen)
{
    static const char *const reserved[] = {"content-length", "transfer-encoding", "host",
                                           "connection", "idem-message-id"};
    int ok = nlen <= 255 && http_is_token(name, nlen) && http_is_field_text(value, vlen);
    if (!ok) {
        m->bad = "header_invalid";
        return 0;
    }
    /* Left out in every spelling: a handler that reads headers CGI-style
     * takes Idem_Message_Id for Idem-Message-Id. */
    char spelt[256];
    memcpy(spelt, name, nlen);
    spelt[nlen] = '\0';
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++)
        if (strlen(reserved[i]) == nlen && http_name_alike(spelt, reserved[i]))
            return 0;
    if (strcasecmp(spelt, "x-idem-attempt-base") == 0) {
        /* Set by a redrive (consume.c, "the redrive"); a number or nothing. */
        char num[24];
        char *end;
        if (vlen < sizeof num) {
            memcpy(num, value, vlen);
            num[vlen] = '\0';
            unsigned long long b = strtoull(num, &end, 10);
            if (vlen && *end == '\0' && num[0] >= '0' && num[0] <= '9')
                m->attempt_base = b;
        }
        return 0;
    }
    char *n = strndup(name, nlen), *v = malloc(vlen + 1);
    if (!n || !v) {
        free(n);
        free(v);
        return -1;
    }
    memcpy(v, value, vlen);
    v[vlen] = '\0';
    m->headers[m->header_count].name = n;
    m->headers[m->header_count].value = v;
    m->header_count++;
    return 0;
}

unsigned long consumer_gen(const struct consumer *k)
{
    return k->gen;
}

int consumer_holds(const struct consumer *k, const char *entry)
{
    for (const struct held *h = k->held; h; h = h->next)
        if (h->m->entry[0] && strcmp(h->m->entry, entry) == 0)
            return 1;
    return 0;
}

void consumer_each_held(const struct consumer *k, void (*fn)(void *arg, const char *entry),
                        void *arg)
{
    for (const struct held *h = k->held; h; h = h->next)
        if (h->m->entry[0])
            fn(arg, h->m->entry);
}

/* Every change of a message's state: a refused one is a bug here, not
 * anything a broker or a handler can cause. */
static void enter(struct held *h, enum msg_state to)
{
    assert(allowed_next[h->state] & BIT(to));
    (void)allowed_next; /* read by the assertion only */
    h->state = to;
}

static size_t held_count(const struct consumer *k)
{
    return atomic_load(&k->n.in_flight);
}

/* The message is done with here (acked, dead-lettered, or left to the
 * broker): let the source give out another. */
static void drop(struct held *h)
{
    struct consumer *k = h->k;
    enter(h, M_DONE);
    if (h->prev)
        h->prev->next = h->next;
    else
        k->held = h->next;
    if (h->next)
        h->next->prev = h->prev;
    if (h->timer)
        event_free(h->timer);
    mq_message_free(h->m);
    free(h);
    atomic_fetch_sub(&k->n.in_flight, 1);
    if (!k->stopping && k->up && held_count(k) < k->cfg->prefetch)
        k->ops->want(k->src, k->cfg->prefetch - held_count(k));
}

/* 1 when h came on the connection that is up now: only then may the
 * broker be told about it. */
static int current(const struct held *h)
{
    return h->k->up && !h->k->stopped && h->m->gen == h->k->gen;
}

static void ack(struct held *h)
{
    enter(h, M_SETTLING);
    if (current(h))
        h->k->ops->ack(h->k->src, h->m);
    drop(h);
}

static void submit(struct held *h);

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
    struct held *h = arg;
    (void)fd;
    (void)what;
    if (!current(h) || h->k->stopping) {
        drop(h);
        return;
    }
    submit(h);
}

static void retry_later(struct held *h, int64_t ms)
{
    if (!current(h) || h->k->stopping) {
        drop(h);
        return;
    }
    if (!h->timer && !(h->timer = evtimer_new(h->k->ctx.base, on_retry, h))) {
        drop(h); /* it comes back from the broker */
        return;
    }
    struct timeval tv = ms_timeval(ms);
    evtimer_add(h->timer, &tv);
    enter(h, M_HELD);
}

static void dead_letter(struct held *h, const char *reason)
{
    struct consumer *k = h->k;
    if (!current(h)) {
        drop(h);
        return;
    }
    enter(h, M_SETTLING);
    if (k->ops->dead_letter(k->src, h->m, reason, h->attempts, h->last_status) != 0) {
        /* Not sure it is there: the message stays unacked, and is tried
         * again (a second copy on the dead letter is possible, never none). */
        retry_later(h, 1000);
        return;
    }
    atomic_fetch_add(&k->n.dead_lettered, 1);
    /* The id is the producer's: the log line escapes it (log.c). */
    daemon_log_about(LOG_WARN, LOG_CONSUMER(k->cfg->route.name),
                     "consumer %s: message %.200s dead-lettered to %s: %s (%u attempts, "
                     "last status %d)",
                     k->cfg->route.name, h->m->id ? h->m->id : "without an id",
                     k->cfg->dead_letter, reason, h->attempts, h->last_status);
    drop(h);
}

/* The wait after a failed attempt: retry_backoff[attempt - 1], the last
 * value repeating. */
static int64_t backoff_ms(const struct consumer_config *cfg, unsigned attempt)
{
    size_t i = attempt > 0 ? attempt - 1 : 0;
    return cfg->backoff_ms[i < cfg->backoff_count ? i : cfg->backoff_count - 1];
}

/* The wait before a message whose key is in flight elsewhere (or whose
 * store failed) is tried again: 50 ms, doubling, up to cap. */
static int64_t wait_ms(struct held *h, int64_t cap)
{
    int64_t ms = 50;
    for (unsigned i = 0; i < h->waits && ms < cap; i++)
        ms *= 2;
    h->waits++;
    return ms < cap ? ms : cap;
}

static int64_t retry_after_ms(const struct http_response *r, int64_t lease_ms)
{
    for (size_t i = 0; r && i < r->header_count; i++)
        if (strcasecmp(r->headers[i].name, "retry-after") == 0) {
            long s = strtol(r->headers[i].value, NULL, 10);
            int64_t ms = s > 0 ? (int64_t)s * 1000 : 1000;
            return ms < lease_ms ? ms : lease_ms;
        }
    return 1000;
}

/* What becomes of a message the gateway answered. */
enum action { ACK, ACK_DUPLICATE, DEAD_LETTER, RETRY, WAIT, DROP };

/* The access log's line for it (consume.c's own verdicts beside the
 * gateway's). */
static void log_message(struct consumer *k, const struct held *h, const struct front_request *req,
                        int status, enum action a, const char *reason)
{
    static const char *const names[] = {
        [ACK] = "acked", [ACK_DUPLICATE] = "acked", [DEAD_LETTER] = "dead_lettered",
        [RETRY] = "retried", [WAIT] = "held", [DROP] = "dropped",
    };
    if (!k->ctx.alog)
        return;
    struct access_message m = {
        .consumer = k->cfg->route.name,
        .queue = k->cfg->queue,
        .message_id = h->m->id,
        .key = req->log_key,
        .outcome = gw_outcome_name(req->outcome),
        .action = names[a],
        .reason = reason,
        .status = status,
        .upstream_status = req->upstream_status,
        .upstream_us = req->upstream_us,
        .total_us = mono_us() - req->start_us,
        .epoch = req->epoch,
        .attempt = req->attempt,
    };
    access_log_message(k->ctx.alog, &m);
}

/* Why a finished key's failure goes to the dead letter: Idem's own 502
 * for an answer too big to keep (the handler executed); a status the
 * route retries (5xx, 408, 425, 429, a refused connection's 502) kept
 * only because it was the last attempt; or the handler's own refusal. */
static const char *dead_letter_reason(const struct route *rt, const struct front_request *req,
                                      int status)
{
    if (status < 400)
        return NULL;
    if (req->outcome_type && strcmp(req->outcome_type, "upstream_response_too_large") == 0)
        return "handler_answer_too_large";
    return config_route_keeps(rt, status) ? "handler_rejected" : "attempts_exhausted";
}

/* What the gateway made of the message: tell the broker, or hold it. */
static void on_answered(void *owner, struct front_request *req)
{
    struct held *h = owner;
    struct consumer *k = h->k;
    const struct route *rt = &k->cfg->route;
    int status = req->resp ? req->resp->status : 503;
    counts_answer(rt->n, req, status);
    enum action a = WAIT;
    const char *reason = NULL;
    int64_t delay = 1000;
    if (req->attempt)
        h->attempts = req->attempt;
    switch (k->stopped ? -1 : req->outcome) {
    case -1:
        a = DROP; /* nothing more is said to the broker: it gives it out again */
        break;
    case GW_EXECUTED:
        h->last_status = status;
        h->waits = 0;
        a = status < 400 ? ACK : DEAD_LETTER;
        reason = dead_letter_reason(rt, req, status);
        break;
    case GW_REPLAYED:
        /* Finished before, and failed: it belongs on the dead letter. A
         * copy that was dead-lettered already gets there again (its earlier
         * dead letter may not have been written: never none, maybe two). */
        a = status < 400 ? ACK_DUPLICATE : DEAD_LETTER;
        reason = dead_letter_reason(rt, req, status);
        atomic_fetch_add(&k->n.duplicates, 1);
        break;
    case GW_MISMATCH:
        atomic_fetch_add(&k->n.alerts, 1);
        a = DEAD_LETTER;
        reason = "key_reused";
        break;
    case GW_KEY_EXPIRED: /* tombstone: a key past its retention, refused a while */
        a = ACK_DUPLICATE;
        reason = "key_expired";
        atomic_fetch_add(&k->n.duplicates, 1);
        break;
    case GW_STALE: /* states: its key has moved past it; nothing to do */
        a = ACK_DUPLICATE;
        atomic_fetch_add(&k->n.duplicates, 1);
        break;
    case GW_TRANSITION_CONFLICT: /* states: it contradicts its key's state */
        atomic_fetch_add(&k->n.alerts, 1);
        a = DEAD_LETTER;
        reason = "transition_conflict";
        break;
    case GW_KEY_INVALID:
    case GW_SIGNATURE_REFUSED: /* forged, or replayed from long ago */
        a = DEAD_LETTER;
        reason = req->outcome_type ? req->outcome_type : "key_invalid";
        break;
    case GW_EXHAUSTED:
        /* The last attempt, or a claim that found them used up, which was
         * none of them (no call made on it). */
        if (req->upstream_us || req->upstream_status)
            h->last_status = status;
        else
            h->attempts = req->attempt > 0 ? req->attempt - 1 : 0;
        h->waits = 0;
        a = DEAD_LETTER;
        reason = "attempts_exhausted";
        break;
    case GW_RELEASED:
    case GW_OUTCOME_UNKNOWN:
        /* This attempt failed (or may have: its claim runs out, and the
         * next one takes it over): counted in the record already. */
        h->last_status = status;
        h->waits = 0;
        atomic_fetch_add(&k->n.retried, 1);
        a = RETRY;
        delay = backoff_ms(k->cfg, h->attempts);
        break;
    case GW_IN_FLIGHT:
        delay = wait_ms(h, retry_after_ms(req->resp, rt->lease_ms));
        break;
    case GW_STORE_UNAVAILABLE:
        atomic_fetch_add(&k->n.store_waits, 1);
        delay = wait_ms(h, 5000);
        break;
    default: /* no verdict: nothing is known to have happened */
        delay = wait_ms(h, 1000);
        break;
    }
    log_message(k, h, req, status, a, reason);
    switch (a) {
    case ACK:
        atomic_fetch_add(&k->n.executed, 1);
        /* fall through */
    case ACK_DUPLICATE:
        ack(h);
        break;
    case DEAD_LETTER:
        dead_letter(h, reason);
        break;
    case RETRY:
    case WAIT:
        retry_later(h, delay);
        break;
    case DROP:
        drop(h);
        break;
    }
}

/* One header into m's headers (name and value in one block, as the parser
 * makes them). */
static int add_header(struct http_msg *m, const char *name, const char *value)
{
    size_t nl = strlen(name), vl = strlen(value);
    char *b = malloc(nl + vl + 2);
    if (!b)
        return -1;
    memcpy(b, name, nl + 1);
    memcpy(b + nl + 1, value, vl + 1);
    m->headers[m->header_count].name = b;
    m->headers[m->header_count].value = b + nl + 1;
    m->headers[m->header_count].name_len = nl;
    m->header_count++;
    return 0;
}

/* The request a message is to the gateway, or NULL (OOM). */
static struct http_msg *as_request(const struct consumer *k, const struct mq_message *mm)
{
    const struct route *rt = &k->cfg->route;
    struct http_msg *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->version_minor = 1;
    m->keep_alive = 1;
    m->method = strdup("POST");
    /* The handler's URL is the route's upstream and base path. */
    m->target = strdup(rt->upstream.base_path && *rt->upstream.base_path ? "" : "/");
    m->headers = calloc(mm->header_count + 2, sizeof *m->headers);
    m->body = malloc(mm->body_len + 1);
    int bad = !m->method || !m->target || !m->headers || !m->body;
    for (size_t i = 0; !bad && i < mm->header_count; i++)
        bad = add_header(m, mm->headers[i].name, mm->headers[i].value);
    if (!bad && mm->content_type)
        bad = add_header(m, "Content-Type", mm->content_type);
    if (!bad && mm->id)
        bad = add_header(m, CONSUMER_MESSAGE_ID_HEADER, mm->id);
    if (bad) {
        http_msg_free(m);
        return NULL;
    }
    if (mm->body_len)
        memcpy(m->body, mm->body, mm->body_len);
    m->body[mm->body_len] = '\0';
    m->body_len = mm->body_len;
    return m;
}

static void submit(struct held *h)
{
    struct consumer *k = h->k;
    struct http_msg *m = as_request(k, h->m);
    struct front_request *req = m ? front_inject(k->front, m, on_answered, h) : NULL;
    if (!req) {
        retry_later(h, 1000);
        return;
    }
    req->attempt_base = h->m->attempt_base;
    enter(h, M_RUNNING);
    gateway_start(k->d, daemon_config_ref(k->lc), &k->cfg->route, req);
}

/* What a message may hold, as the front end's limits say for a request:
 * NULL, or the reason it is refused. */
static const char *over_limits(const struct consumer *k, const struct mq_message *m)
{
    const struct server_limits *l = &k->lc->c->limits;
    size_t bytes = 0;
    if (m->body_len > l->body_max)
        return "body_too_large";
    if (m->header_count + 2 > l->header_count_max)
        return "too_many_headers";
    for (size_t i = 0; i < m->header_count; i++)
        bytes += strlen(m->headers[i].name) + strlen(m->headers[i].value) + 4;
    if (bytes > l->header_bytes_max || (m->id && strlen(m->id) > IDEM_KEY_MAX * 4))
        return "headers_too_large";
    return NULL;
}

void consumer_deliver(struct consumer *k, struct mq_message *m)
{
    atomic_fetch_add(&k->n.received, 1);
    struct held *h = calloc(1, sizeof *h);
    if (!h || k->stopping) {
        free(h);
        mq_message_free(m); /* unacked: the broker gives it out again */
        return;
    }
    h->k = k;
    h->m = m;
    h->next = k->held;
    if (k->held)
        k->held->prev = h;
    k->held = h;
    atomic_fetch_add(&k->n.in_flight, 1);
    h->state = M_DELIVERED; /* the first state, entered once */
    const char *bad = m->bad ? m->bad : over_limits(k, m);
    if (bad)
        dead_letter(h, bad);
    else
        submit(h);
}

void consumer_connection(struct consumer *k, int up, const char *detail)
{
    if (up) {
        k->gen++;
        k->up = 1;
        atomic_store(&k->n.connected, 1);
        daemon_log_about(LOG_INFO, LOG_CONSUMER(k->cfg->route.name),
                         "consumer %s: connected to %s (%s)", k->cfg->route.name, k->ops->kind,
                         detail);
        if (!k->stopping && held_count(k) < k->cfg->prefetch)
            k->ops->want(k->src, k->cfg->prefetch - held_count(k));
        return;
    }
    if (k->up) {
        atomic_fetch_add(&k->n.reconnects, 1);
        daemon_log_about(LOG_WARN, LOG_CONSUMER(k->cfg->route.name),
                         "consumer %s: lost the %s connection: %s; its unacked messages come "
                         "back from the broker",
                         k->cfg->route.name, k->ops->kind, detail);
    }
    k->up = 0;
    atomic_store(&k->n.connected, 0);
    /* Those waiting here are given up: the broker has them again. Those in
     * the gateway finish their records, and are dropped once answered; one
     * being told to the broker is dropped by the one telling. */
    for (struct held *h = k->held, *next; h; h = next) {
        next = h->next;
        if (h->state == M_HELD)
            drop(h);
    }
}

/* ---- the redrive ----
 *
 * Dead letters go back through the records, one at a time, on the
 * consumer's loop, in a session of the source's own (consume.h): each is
 * taken, its key read from it as the gateway reads a message's, and its
 * record looked at:
 *
 *   no key, no record, RELEASED, PROCESSING,
 *   any record of a key with states ─────────► requeued, with the record's
 *        epoch as its attempt base: its attempts count afresh (gateway.c,
 *        "attempts"); the message then goes through the consumer like any
 *        other, so a key that another channel finishes meanwhile is acked
 *        there as a duplicate
 *   finished successfully (no states) ───────► taken off: done
 *   FAILED for good, or another reason asked ─► left where it is: kept
 *
 * A dead letter leaves its queue only once its message is back on the
 * source (or its key is done): two redrives at once, or one racing the
 * consumer, at worst put a message back twice, and its record runs it
 * once. */

struct redrive {
    struct consumer *k;
    struct redrive *prev, *next;
    void *ses;
    unsigned long limit;
    char *reason;
    struct redrive_result res;
    void (*done)(void *arg, const struct redrive_result *r);
    void *arg;
    struct mq_message *m; /* the dead letter in hand */
    int requeue;          /* what is done with it: put back, or taken off */
    struct event *step;   /* the next dead letter, on the loop's next turn (or
                             the session opened again, until open_until) */
    int64_t open_until;
};

static void redrive_free(struct redrive *r)
{
    struct consumer *k = r->k;
    if (r->prev)
        r->prev->next = r->next;
    else if (k->redrives == r)
        k->redrives = r->next;
    if (r->next)
        r->next->prev = r->prev;
    if (r->ses)
        k->ops->dead_close(r->ses, NULL, NULL);
    mq_message_free(r->m);
    if (r->step)
        event_free(r->step);
    free(r->reason);
    free(r);
}

static void redrive_told(void *arg, long left)
{
    struct redrive *r = arg;
    r->ses = NULL; /* closed */
    r->res.left = left;
    daemon_log_about(LOG_INFO, LOG_CONSUMER(r->k->cfg->route.name),
                     "consumer %s: redrive of %s: %lu moved back, %lu done already, %lu kept, "
                     "%ld left%s%s",
                     r->k->cfg->route.name, r->k->cfg->dead_letter, r->res.moved, r->res.done,
                     r->res.kept, left, r->res.error[0] ? "; stopped short: " : "", r->res.error);
    r->done(r->arg, &r->res);
    struct consumer *k = r->k;
    redrive_free(r);
    if (k->stopping && !k->redrives && evtimer_pending(k->redrive_wait, NULL)) {
        evtimer_del(k->redrive_wait);
        event_active(k->redrive_wait, EV_TIMEOUT, 0); /* the drain goes on */
    }
}

static void redrive_end(struct redrive *r, const char *error)
{
    if (error && !r->res.error[0])
        snprintf(r->res.error, sizeof r->res.error, "%s", error);
    mq_message_free(r->m);
    r->m = NULL;
    if (!r->ses) {
        redrive_told(r, -1);
        return;
    }
    void *ses = r->ses;
    r->ses = NULL;
    r->k->ops->dead_close(ses, redrive_told, r);
}

static void redrive_later(struct redrive *r)
{
    struct timeval now = {0, 0};
    mq_message_free(r->m);
    r->m = NULL;
    evtimer_add(r->step, &now);
}

static void on_settled(void *arg, int rc)
{
    struct redrive *r = arg;
    if (rc < 0) {
        redrive_end(r, "the broker failed while settling a dead letter");
        return;
    }
    if (rc > 0 && r->requeue) /* 0: another redrive took it first */
        r->res.moved++;
    else if (rc > 0)
        r->res.done++;
    redrive_later(r);
}

static void settle(struct redrive *r, int requeue, uint64_t base)
{
    r->requeue = requeue;
    r->k->ops->dead_settle(r->ses, r->m, requeue, base, on_settled, r);
}

static void on_looked(void *arg, idem_rc rc, idem_outcome o, idem_record *rec, const char *detail)
{
    struct redrive *r = arg;
    if (rc != IDEM_OK) {
        char why[200];
        snprintf(why, sizeof why, "the store: %.180s", detail ? detail : idem_strerror(rc));
        redrive_end(r, why);
        return;
    }
    if (o == IDEM_NOT_FOUND) {
        settle(r, 1, 0);
    } else if (r->k->cfg->route.states) {
        /* A key with states: the state it is in says nothing of whether
         * this message's move was made; the consumer's steps decide (made
         * since: acked as stale; contradicted: dead-lettered again). */
        settle(r, 1, rec->epoch);
    } else if (strcmp(rec->state, IDEM_STATE_FAILED) == 0) {
        r->res.kept++; /* it would come back here: failed for good */
        redrive_later(r);
    } else if (idem_record_finished(rec->state)) {
        settle(r, 0, 0);
    } else {
        settle(r, 1, rec->epoch);
    }
}

/* The dead letter in hand: its key's record, looked at. */
static void look(struct redrive *r)
{
    struct consumer *k = r->k;
    const struct route *rt = &k->cfg->route;
    struct http_msg *msg = as_request(k, r->m);
    if (!msg) {
        redrive_end(r, "out of memory");
        return;
    }
    char key[IDEM_KEY_MAX + 1], detail[200];
    const char *subject = NULL, *type = NULL;
    int bad = request_subject(msg, k->lc->c->subject_header, &subject, detail, sizeof detail) ||
              request_key(rt, msg, subject, key, &type, detail, sizeof detail);
    idem_rc rc = bad ? IDEM_OK
                     : idem_record_get_async(k->d->h, k->ctx.iloop, rt->space, key, on_looked, r);
    http_msg_free(msg);
    if (bad)
        settle(r, 1, 0); /* no key: it goes back to be refused again, or read anew */
    else if (rc != IDEM_OK)
        on_looked(r, rc, IDEM_NOT_FOUND, NULL, idem_errdetail());
}

static void on_dead(void *arg, int rc, struct mq_message *m)
{
    struct redrive *r = arg;
    if (rc < 0) {
        redrive_end(r, "the broker failed while taking a dead letter");
        return;
    }
    if (!m) {
        redrive_end(r, NULL);
        return;
    }
    r->m = m;
    if (r->reason && strcmp(m->dead_reason, r->reason) != 0) {
        r->res.kept++;
        redrive_later(r);
        return;
    }
    look(r);
}

static void on_step(evutil_socket_t fd, short what, void *arg)
{
    struct redrive *r = arg;
    (void)fd;
    (void)what;
    if (r->k->stopping) {
        redrive_end(r, "the consumer is stopping");
        return;
    }
    if (r->res.moved + r->res.done >= r->limit) {
        redrive_end(r, NULL);
        return;
    }
    r->k->ops->dead_next(r->ses, on_dead, r);
}

#define REDRIVE_OPEN_MS 5000 /* a consumer (re)connecting is waited for this long */

static void on_open(evutil_socket_t fd, short what, void *arg)
{
    struct redrive *r = arg;
    struct consumer *k = r->k;
    (void)fd;
    (void)what;
    char err[300] = "the consumer is stopping";
    if (!k->stopping && !(r->ses = k->ops->dead_open(k->src, err, sizeof err)) &&
        mono_ms() < r->open_until) {
        struct timeval tv = {0, 200 * 1000};
        event_assign(r->step, k->ctx.base, -1, 0, on_open, r);
        evtimer_add(r->step, &tv); /* connecting still, say: again */
        return;
    }
    event_assign(r->step, k->ctx.base, -1, 0, on_step, r);
    if (!r->ses) {
        redrive_end(r, err);
        return;
    }
    on_step(-1, 0, r);
}

static void on_redrive(evutil_socket_t fd, short what, void *arg)
{
    struct redrive *r = arg;
    struct consumer *k = r->k;
    r->next = k->redrives;
    if (k->redrives)
        k->redrives->prev = r;
    k->redrives = r;
    r->open_until = mono_ms() + REDRIVE_OPEN_MS;
    on_open(fd, what, r);
}

int consumers_redrive(struct consumers *cs, size_t i, unsigned long limit, const char *reason,
                      void (*done)(void *arg, const struct redrive_result *r), void *arg)
{
    struct consumer *k = &cs->k[i];
    struct redrive *r = calloc(1, sizeof *r);
    if (!r || !k->running || (reason && !(r->reason = strdup(reason))) ||
        !(r->step = evtimer_new(k->ctx.base, on_step, r))) {
        if (r && r->step)
            event_free(r->step);
        if (r)
            free(r->reason);
        free(r);
        return -1;
    }
    r->k = k;
    r->limit = limit;
    r->done = done;
    r->arg = arg;
    r->res.left = -1;
    if (event_base_once(k->ctx.base, -1, EV_TIMEOUT, on_redrive, r, NULL) != 0) {
        event_free(r->step);
        free(r->reason);
        free(r);
        return -1;
    }
    return 0;
}

long consumers_find(const struct consumers *cs, const char *name)
{
    for (size_t i = 0; cs && i < cs->count; i++)
        if (strcmp(cs->k[i].cfg->route.name, name) == 0)
            return (long)i;
    return -1;
}

/* ---- the loop ---- */

static void *consumer_main(void *arg)
{
    struct consumer *k = arg;
    event_base_dispatch(k->ctx.base);
    return NULL;
}

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    struct consumer *k = arg;
    (void)fd;
    (void)what;
    k->stopping = 1;
    k->ops->stop(k->src);
    for (struct held *h = k->held, *next; h; h = next) {
        next = h->next;
        if (h->state == M_HELD)
            drop(h); /* waiting to be tried again: the broker gives it out again */
    }
    /* A redrive stops at its next step and answers its caller; the loop
     * waits for that (up to drain_ms), or the call would never be
     * answered. */
    struct timeval tv = ms_timeval(k->drain_ms);
    if (!k->redrives || evtimer_add(k->redrive_wait, &tv) != 0)
        front_drain(k->front, k->drain_ms);
}

/* Draining, and the redrives ended (or their time ran out). */
static void on_redrives_ended(evutil_socket_t fd, short what, void *arg)
{
    struct consumer *k = arg;
    (void)fd;
    (void)what;
    front_drain(k->front, k->drain_ms);
}

static void consumer_free(struct consumer *k)
{
    k->stopping = 1;
    if (k->src)
        k->ops->close(k->src);
    while (k->held)
        drop(k->held);
    while (k->redrives)
        redrive_free(k->redrives);
    if (k->drain_ev)
        event_free(k->drain_ev);
    if (k->redrive_wait)
        event_free(k->redrive_wait);
    replay_cache_free(k->ctx.replays);
    access_buf_free(k->ctx.alog); /* its last lines */
    upstream_loop_free(k->ctx.upstreams);
    idem_libevent_free(k->ctx.iloop);
    if (k->ctx.base)
        event_base_free(k->ctx.base);
    daemon_config_put(k->lc);
}

/* A consumer's front listens nowhere: its requests are the messages it
 * injects (front_inject), each handed to the gateway by the consumer. */
static void no_listener(void *arg, struct front_request *req)
{
    (void)arg;
    req->resp = problem(404, "no_such_endpoint", "a consumer's loop takes no requests");
    front_answer(req);
}

struct consumers *consumers_start(struct daemon *d, struct live_config *lc, SSL_CTX *tls,
                                  struct access_log *alog, char *err, size_t errlen)
{
    const struct server_config *cfg = lc->c;
    struct consumers *cs = calloc(1, sizeof *cs);
    if (!cs || (cfg->consumer_count && !(cs->k = calloc(cfg->consumer_count, sizeof *cs->k)))) {
        free(cs);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < cfg->consumer_count; i++) {
        struct consumer *k = &cs->k[i];
        cs->count++;
        k->d = d;
        k->lc = daemon_config_ref(lc);
        k->cfg = &cfg->consumers[i];
        k->ops = k->cfg->source == SOURCE_AMQP ? &mq_amqp_ops : &mq_redis_ops;
        k->drain_ms = cfg->limits.shutdown_timeout_ms;
        k->ctx.d = d;
        k->ctx.base = event_base_new();
        k->ctx.iloop = k->ctx.base ? idem_libevent_new(k->ctx.base) : NULL;
        k->ctx.upstreams = k->ctx.iloop ? upstream_loop_new(k->ctx.base, tls) : NULL;
        k->ctx.replays = replay_cache_new(cfg->limits.replay_cache);
        k->ctx.alog = alog && k->ctx.base ? access_buf_new(alog, k->ctx.base) : NULL;
        k->front = k->ctx.upstreams
                       ? front_new(k->ctx.base, &cfg->limits, no_listener, d, &k->ctx)
                       : NULL;
        k->drain_ev = k->ctx.base ? event_new(k->ctx.base, -1, 0, on_drain, k) : NULL;
        k->redrive_wait = k->ctx.base ? evtimer_new(k->ctx.base, on_redrives_ended, k) : NULL;
        k->src = k->front && k->drain_ev && k->redrive_wait && (k->ctx.alog || !alog)
                     ? k->ops->open(k, k->ctx.base, k->cfg, d->instance) : NULL;
        if (!k->src) {
            snprintf(err, errlen, "consumers[%zu] (%s): cannot start its event loop", i,
                     k->cfg->route.name);
            consumers_free(cs);
            return NULL;
        }
    }
    for (size_t i = 0; i < cs->count; i++) {
        struct consumer *k = &cs->k[i];
        if (pthread_create(&k->thread, NULL, consumer_main, k) != 0) {
            snprintf(err, errlen, "consumers[%zu] (%s): cannot start its thread", i,
                     k->cfg->route.name);
            consumers_drain(cs, 0);
            consumers_join(cs);
            consumers_free(cs);
            return NULL;
        }
        k->running = 1;
        char name[16];
        snprintf(name, sizeof name, "idem-mq-%u", (unsigned)(i % 100));
        pthread_setname_np(k->thread, name);
    }
    return cs;
}

void consumers_drain(struct consumers *cs, int64_t timeout_ms)
{
    for (size_t i = 0; cs && i < cs->count; i++) {
        struct consumer *k = &cs->k[i];
        if (!k->running)
            continue;
        k->drain_ms = timeout_ms;
        event_active(k->drain_ev, EV_TIMEOUT, 0); /* run on the consumer's loop */
    }
}

void consumers_join(struct consumers *cs)
{
    for (size_t i = 0; cs && i < cs->count; i++) {
        struct consumer *k = &cs->k[i];
        if (k->running)
            pthread_join(k->thread, NULL);
        k->running = 0;
        k->stopped = 1;
        front_abort_parked(k->front);
    }
}

void consumers_free(struct consumers *cs)
{
    if (!cs)
        return;
    for (size_t i = 0; i < cs->count; i++) {
        cs->k[i].stopped = 1;
        daemon_loop_settle(&cs->k[i].ctx);
        front_free(cs->k[i].front); /* the last steps: they see closing */
        cs->k[i].front = NULL;
        consumer_free(&cs->k[i]);
    }
    free(cs->k);
    free(cs);
}

size_t consumers_count(const struct consumers *cs)
{
    return cs ? cs->count : 0;
}

const char *consumers_name(const struct consumers *cs, size_t i)
{
    return cs->k[i].cfg->route.name;
}

const char *consumers_kind(const struct consumers *cs, size_t i)
{
    return cs->k[i].ops->kind;
}

const struct consumer_counters *consumers_counters(const struct consumers *cs, size_t i)
{
    return &cs->k[i].n;
}
