/*
 * gateway.c — the three layers in front of an upstream, per route (daemon).
 *
 * A request on a route goes through this lifecycle, on one worker thread,
 * top to bottom; every way out answers the client exactly once:
 *
 *   key, subject, fingerprint ── missing/invalid ─────────────► 400
 *        │
 *   [token]  consume Idem-Token ── unknown, or spent on another key ► 409 token_spent
 *        │   Redis down (layers 1 and 2): on_redis_down skip ── the layer is
 *        │   skipped, logged, counted; reject ── 503
 *        │   (spent on this same key: a late retry, go on)
 *   [lock]   acquire ── busy: reject ─────────────────────────► 409 + Retry-After
 *        │        └──── busy: wait, until wait_timeout, then ───► 409
 *        │   watchdog renews it while we work
 *   record   begin ── DONE ───────────────────────────────────► replay (Idempotent-Replayed)
 *        │        ├── MISMATCH ───────────────────────────────► 422
 *        │        └── IN_PROGRESS: reject, or wait as above ──► 409
 *        │   NEW / TAKEN_OVER: we hold the claim (epoch)
 *   upstream (the claim's lease extended every lease/3)
 *        ├── answer < 500, or 5xx with on_upstream_5xx: store ─► complete/fail(final)
 *        │                                                       with the stored answer
 *        ├── 5xx with release ──► fail(retryable), token back ► the 5xx as is
 *        ├── not sent (refused) ► fail(retryable), token back ► 502 upstream_unreachable
 *        ├── sent, no answer ───► record stays PROCESSING ────► 504 outcome_unknown
 *        └── answer too big ────► complete with a 502 problem (it did execute)
 *   release the lock; answer
 *
 * Store trouble at any step is 503, and the request is never forwarded
 * without its record claimed: the claim comes first, always.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "daemon.h"
#include "log.h"
#include "request_key.h"
#include "stored.h"
#include "upstream.h"

struct http_response *problem_from_idem(idem_rc rc, const char *what)
{
    if (rc == IDEM_EINVAL || rc == IDEM_ETOOBIG)
        return problem(400, "invalid_argument", "%s: %s", what, idem_errdetail());
    return problem(503, "store_unavailable", "%s: the store failed (%s): %s", what,
                   idem_strerror(rc), idem_errdetail());
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waiting for a holder: short sleeps first, up to 50 ms. */
static int64_t backoff(int64_t *step)
{
    int64_t s = *step;
    *step = s * 2 > 50 ? 50 : s * 2;
    return s;
}

/* Redis (layers 1 and 2) cannot be reached. With on_redis_down: skip the
 * layer is passed over, which is safe: the record (layer 3, PostgreSQL) alone
 * still lets one request execute. Returns 1 to skip, 0 to answer 503. */
static int skip_kv_layer(struct daemon *d, const struct route *rt, idem_rc rc, const char *layer)
{
    if (rt->on_redis_down_reject || (rc != IDEM_EUNAVAILABLE && rc != IDEM_ETIMEDOUT))
        return 0;
    unsigned long n = atomic_fetch_add(&d->n.redis_down_skips, 1) + 1;
    /* Every skip is counted; the log says so for the 1st, 2nd, 4th, 8th... */
    if ((n & (n - 1)) == 0)
        daemon_log("route %s: %s skipped, the store is down (%s: %s); %lu skipped so far",
                   rt->name, layer, idem_strerror(rc), idem_errdetail(), n);
    return 1;
}

static struct http_response *in_flight(const char *what)
{
    struct http_response *r =
        problem(409, "request_in_flight",
                "a request with this idempotency key is being processed (%s); retry later",
                what);
    if (r)
        response_add_header(r, "Retry-After", "1");
    return r;
}

struct claim {
    struct daemon *d;
    const struct route *rt;
    const char *key;
    uint64_t epoch;
};

/* While the upstream works, keep the claim alive. */
static void on_tick(void *arg)
{
    struct claim *c = arg;
    idem_outcome o;
    idem_rc rc = idem_record_extend(c->d->h, c->rt->space, c->key, c->epoch, c->rt->lease_ms, &o);
    if (rc != IDEM_OK || o != IDEM_RENEWED)
        daemon_log("%s/%s: extending the lease failed: %s %s", c->rt->space, c->key,
                rc != IDEM_OK ? idem_strerror(rc) : idem_outcome_name(o),
                rc != IDEM_OK ? idem_errdetail() : "");
}

static struct http_response *replay(struct daemon *d, const idem_record *rec)
{
    struct http_response *r = rec->result ? stored_decode(rec->result, rec->result_len) : NULL;
    if (!r)
        return problem(500, "stored_result_unreadable",
                       "the record is %s but its stored result is not a response Idem stored",
                       rec->state);
    atomic_fetch_add(&d->n.replays, 1);
    response_add_header(r, "Idempotent-Replayed", "true");
    return r;
}

/* The stored answer if (space, key) is finished — and its payload matches —
 * else NULL. A finished record never changes its answer, so this read needs
 * no lock. */
static struct http_response *replay_if_finished(struct daemon *d, const struct route *rt,
                                                const char *key, const uint8_t *fp)
{
    idem_outcome o;
    idem_record rec;
    if (idem_record_get(d->h, rt->space, key, &o, &rec) != IDEM_OK || o != IDEM_FOUND)
        return NULL;
    struct http_response *r = NULL;
    int finished = strcmp(rec.state, IDEM_STATE_PROCESSING) != 0 &&
                   strcmp(rec.state, IDEM_STATE_RELEASED) != 0;
    int same = !fp || !rec.has_fingerprint ||
               memcmp(fp, rec.fingerprint, IDEM_FINGERPRINT_LEN) == 0;
    if (finished && same)
        r = replay(d, &rec);
    idem_record_clear(&rec);
    return r;
}

int gateway_fast(struct daemon *d, const struct server_config *cfg, const struct route *rt,
                 struct front_request *req)
{
    /* With the token layer a replay must still go through the token check
     * (an unknown token is refused even for a finished key): not here. */
    if (rt->layer_token)
        return 0;
    char key[IDEM_KEY_MAX + 1], detail[512];
    const char *type;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    int has_fp = 0;
    const struct http_msg *m = req->msg;
    if (request_key(rt, m, http_msg_header(m, cfg->subject_header), key, &type, detail,
                    sizeof detail) != 0 ||
        request_fingerprint(rt, m, fp, &has_fp, detail, sizeof detail) != 0)
        return 0; /* the worker answers the problem */
    req->resp = replay_if_finished(d, rt, key, has_fp ? fp : NULL);
    if (!req->resp)
        return 0;
    atomic_fetch_add(&d->n.requests, 1);
    return 1;
}

/* A response to the client from an upstream answer (hop-by-hop removed). */
static struct http_response *from_upstream(const struct http_msg *m)
{
    struct http_response *r = response_new(m->status);
    if (!r)
        return NULL;
    for (size_t i = 0; i < m->header_count; i++) {
        const char *n = m->headers[i].name;
        if (http_is_hop_by_hop(m, n) || strcasecmp(n, "content-length") == 0)
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

/* Forward under the claim; finish the record per the answer. */
static struct http_response *execute(struct daemon *d, const struct server_config *cfg,
                                     const struct route *rt, struct front_request *req,
                                     const char *key, uint64_t epoch, int *give_token_back)
{
    const struct http_msg *m = req->msg;
    struct upstream_pool *pool = upstream_pool_get(rt->upstream.host, rt->upstream.port);
    if (!pool) {
        /* Nothing was sent: free the claim for a retry. */
        idem_outcome released;
        idem_record_fail(d->h, rt->space, key, epoch, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &released);
        *give_token_back = 1;
        return NULL;
    }
    char target[16384], epoch_hdr[64], key_hdr[IDEM_KEY_MAX * 3 + 32];
    const char *suffix = m->target;
    snprintf(target, sizeof target, "%s%s", rt->upstream.base_path, suffix);
    snprintf(epoch_hdr, sizeof epoch_hdr, "Idem-Epoch: %" PRIu64, epoch);
    snprintf(key_hdr, sizeof key_hdr, "Idem-Key: %s/%s", rt->space, key);
    const char *extra[] = {epoch_hdr, key_hdr, NULL};
    struct claim claim = {.d = d, .rt = rt, .key = key, .epoch = epoch};
    struct upstream_request rq = {
        .method = m->method,
        .target = target,
        .original = m,
        .peer = req->peer,
        .extra = extra,
        .timeout_ms = rt->upstream_timeout_ms,
        .response_max = cfg->limits.response_max,
        .tick = on_tick,
        .tick_arg = &claim,
        .tick_ms = rt->lease_ms / 3 > 0 ? rt->lease_ms / 3 : 1,
    };
    struct http_msg *resp = NULL;
    char detail[256];
    atomic_fetch_add(&d->n.executions, 1);
    enum upstream_result ur = upstream_exchange(pool, &rq, &resp, detail, sizeof detail);

    idem_outcome o = IDEM_NONE;
    idem_rc rc = IDEM_OK;
    struct http_response *out = NULL;
    switch (ur) {
    case UPSTREAM_OK:
        if (resp->status >= 500 && !rt->on_5xx_store) {
            rc = idem_record_fail(d->h, rt->space, key, epoch, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o);
            *give_token_back = 1;
            out = from_upstream(resp);
            break;
        }
        {
            size_t len;
            char *stored = stored_encode(rt, resp->status, resp, &len);
            if (!stored) {
                /* Executed, and we cannot keep its answer: keep the claim
                 * (PROCESSING) rather than let a retry run it again. */
                out = NULL;
                break;
            }
            if (len > cfg->limits.response_max + 65536) {
                free(stored);
                goto too_big;
            }
            rc = resp->status >= 500
                     ? idem_record_fail(d->h, rt->space, key, epoch, IDEM_FAIL_FINAL, stored, len,
                                        rt->retention_ms, &o)
                     : idem_record_complete(d->h, rt->space, key, epoch, stored, len,
                                            rt->retention_ms, &o);
            free(stored);
            out = from_upstream(resp);
        }
        break;
    case UPSTREAM_NOT_SENT:
        rc = idem_record_fail(d->h, rt->space, key, epoch, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o);
        *give_token_back = 1;
        out = problem(502, "upstream_unreachable",
                      "%s; the request was not executed and may be retried", detail);
        break;
    case UPSTREAM_TIMEOUT:
    case UPSTREAM_UNKNOWN:
        atomic_fetch_add(&d->n.upstream_unknown, 1);
        out = problem(504, "outcome_unknown",
                      "%s; the request may have been executed. Its record stays PROCESSING "
                      "until its lease ends (%" PRId64 " ms); retries get 409 until then",
                      detail, rt->lease_ms);
        break;
    case UPSTREAM_TOO_BIG:
    too_big: {
        struct http_response *p =
            problem(502, "upstream_response_too_large",
                    "the upstream executed the request and answered with more than "
                    "response_max (%zu bytes); the answer was not kept",
                    cfg->limits.response_max);
        size_t len;
        char *stored = p ? stored_encode_response(p, &len) : NULL;
        if (stored)
            rc = idem_record_fail(d->h, rt->space, key, epoch, IDEM_FAIL_FINAL, stored, len,
                                  rt->retention_ms, &o);
        free(stored);
        out = p;
        break;
    }
    }
    if (rc != IDEM_OK)
        daemon_log("%s/%s: finishing the record failed: %s: %s", rt->space, key,
                idem_strerror(rc), idem_errdetail());
    else if (o == IDEM_CONFLICT)
        daemon_log("ALERT %s/%s: epoch %" PRIu64 " was taken over while it ran",
                rt->space, key, epoch);
    http_msg_free(resp);
    return out;
}

void gateway_handle(struct daemon *d, const struct server_config *cfg, const struct route *rt,
                    struct front_request *req)
{
    const struct http_msg *m = req->msg;
    char key[IDEM_KEY_MAX + 1], detail[512], owner[64], spent[IDEM_KEY_MAX + 1];
    const char *type = NULL;
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    int has_fp = 0, token_spent = 0, locked = 0, give_token_back = 0;
    idem_watch *watch = NULL;
    idem_outcome o;
    idem_rc rc;
    const char *subject = http_msg_header(m, cfg->subject_header);
    const char *token = NULL;
    struct http_response *out = NULL;
    atomic_fetch_add(&d->n.requests, 1);

    int status = request_key(rt, m, subject, key, &type, detail, sizeof detail);
    if (status) {
        req->resp = problem(status, type, "%s", detail);
        return;
    }
    if ((status = request_fingerprint(rt, m, fp, &has_fp, detail, sizeof detail)) != 0) {
        req->resp = problem(status, "fingerprint_unavailable", "%s", detail);
        return;
    }
    snprintf(owner, sizeof owner, "%s-%lu", d->instance, atomic_fetch_add(&d->seq, 1) + 1);
    int64_t deadline = mono_ms() + rt->wait_timeout_ms, step = 2;

    /* Layer 1. */
    if (rt->layer_token) {
        token = http_msg_header(m, "Idem-Token");
        if (!token || !*token) {
            req->resp = problem(428, "token_missing",
                                "route %s needs a one-time token in the Idem-Token header "
                                "(POST /_idem/v1/tokens issues one for scene %s)",
                                rt->name, rt->token_scene);
            return;
        }
        rc = idem_token_consume(d->h, subject ? subject : "", rt->token_scene, token, key, &o,
                                spent);
        if (rc == IDEM_EINVAL) {
            req->resp = problem(409, "token_spent", "the Idem-Token is not a valid token; "
                                                    "refresh the page and retry");
            return;
        }
        if (rc != IDEM_OK && skip_kv_layer(d, rt, rc, "the token layer")) {
            o = IDEM_NONE;
        } else if (rc != IDEM_OK) {
            atomic_fetch_add(&d->n.store_errors, 1);
            req->resp = problem_from_idem(rc, "consuming the token");
            return;
        } else if (o == IDEM_CONSUMED) {
            token_spent = 1;
        } else if (!(o == IDEM_ALREADY_CONSUMED && strcmp(spent, key) == 0)) {
            req->resp = problem(409, "token_spent",
                                "this form was already submitted, or its token expired: "
                                "refresh and retry");
            return;
        }
    }

    /* Layer 2. */
    if (rt->layer_lock) {
        idem_lock_info info;
        for (;;) {
            rc = idem_lock_acquire(d->h, rt->space, key, owner, rt->lease_ms, &o, &info);
            if (rc != IDEM_OK && skip_kv_layer(d, rt, rc, "the lock layer")) {
                /* A timed-out acquire may have taken the lock after all:
                 * release it when done (ours, by owner), best effort. */
                locked = rc == IDEM_ETIMEDOUT;
                break;
            }
            if (rc != IDEM_OK) {
                atomic_fetch_add(&d->n.store_errors, 1);
                out = problem_from_idem(rc, "taking the business-key lock");
                give_token_back = 1;
                goto done;
            }
            if (o == IDEM_ACQUIRED)
                break;
            /* The holder may be a duplicate of a request that is finished:
             * its answer needs no lock. */
            if ((out = replay_if_finished(d, rt, key, has_fp ? fp : NULL)) != NULL)
                goto done;
            if (!rt->in_flight_wait || mono_ms() >= deadline) {
                atomic_fetch_add(&d->n.in_flight_409, 1);
                out = in_flight("its lock is held");
                give_token_back = 1;
                goto done;
            }
            sleep_ms(backoff(&step));
        }
        if (rc == IDEM_OK) {
            locked = 1;
            idem_watchdog_start(d->h, rt->space, key, owner, rt->lease_ms, NULL, NULL, &watch);
        }
    }

    /* Layer 3. */
    step = 2;
    for (;;) {
        idem_record rec;
        rc = idem_record_begin(d->h, rt->space, key, has_fp ? fp : NULL, owner, rt->lease_ms, &o,
                               &rec);
        if (rc != IDEM_OK) {
            atomic_fetch_add(&d->n.store_errors, 1);
            out = problem_from_idem(rc, "claiming the record");
            give_token_back = 1;
            goto done;
        }
        if (o == IDEM_NEW || o == IDEM_TAKEN_OVER) {
            uint64_t epoch = rec.epoch;
            idem_record_clear(&rec);
            out = execute(d, cfg, rt, req, key, epoch, &give_token_back);
            goto done;
        }
        if (o == IDEM_DONE) {
            out = replay(d, &rec);
            idem_record_clear(&rec);
            goto done;
        }
        idem_record_clear(&rec);
        if (o == IDEM_MISMATCH) {
            atomic_fetch_add(&d->n.mismatches, 1);
            out = problem(422, "key_reused",
                          "the idempotency key %s was already used with another payload", key);
            give_token_back = 1;
            goto done;
        }
        /* IN_PROGRESS */
        if (!rt->in_flight_wait || mono_ms() >= deadline) {
            atomic_fetch_add(&d->n.in_flight_409, 1);
            out = in_flight("its record is PROCESSING");
            goto done;
        }
        sleep_ms(backoff(&step));
    }

done:
    idem_watchdog_stop(watch);
    if (locked)
        idem_lock_release(d->h, rt->space, key, owner, &o);
    if (token_spent && give_token_back)
        idem_token_give_back(d->h, subject ? subject : "", rt->token_scene, token, key, &o);
    req->resp = out;
}

void passthrough_handle(struct daemon *d, const struct server_config *cfg,
                        struct front_request *req)
{
    const struct http_msg *m = req->msg;
    if (!cfg->has_upstream) {
        char path[512];
        request_path(m->target, path, sizeof path);
        req->resp = problem(404, "no_route", "no route matches %s %s, and no default upstream "
                                             "is configured",
                            m->method, path);
        return;
    }
    struct upstream_pool *pool = upstream_pool_get(cfg->upstream.host, cfg->upstream.port);
    if (!pool)
        return;
    char target[16384];
    snprintf(target, sizeof target, "%s%s", cfg->upstream.base_path, m->target);
    struct upstream_request rq = {
        .method = m->method,
        .target = target,
        .original = m,
        .peer = req->peer,
        .timeout_ms = 30000,
        .response_max = cfg->limits.response_max,
    };
    struct http_msg *resp = NULL;
    char detail[256];
    atomic_fetch_add(&d->n.passthrough, 1);
    enum upstream_result ur = upstream_exchange(pool, &rq, &resp, detail, sizeof detail);
    if (ur == UPSTREAM_OK)
        req->resp = from_upstream(resp);
    else
        req->resp = problem(ur == UPSTREAM_TIMEOUT ? 504 : 502, "upstream_failed", "%s", detail);
    http_msg_free(resp);
}
