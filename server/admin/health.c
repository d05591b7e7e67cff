/* SPDX-License-Identifier: Apache-2.0 */
/*
 * health.c — the health endpoints (admin): live (the process answers),
 * and health and health/ready (whether requests can be served), which look
 * at both halves of the store with the library's asynchronous calls on the
 * request's loop.
 *
 * A look reads a record (the records' half) and releases a lock nobody
 * holds (the tokens' and locks' half) at once; once both answered, and
 * only when the gateway saw a record write fail, it writes a record of its
 * own (a begin, then a retryable fail), since reads can work while writes
 * fail (a full disk, a store gone read-only). Records down: 503, nothing
 * can be served. Tokens and locks down (Redis): "degraded", routes follow
 * their on_redis_down.
 */
#include "admin/health.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "consume/consume.h"
#include "gateway/gateway.h"
#include "mono.h"

#define PROBE_SPACE "idem.health"
#define TOTAL(d, field) ((json_int_t)counts_total(&(d)->counts, offsetof(struct route_counts, field)))

struct look {
    int admin;
    int mine;       /* the main listener's look that its cache waits for */
    int pending;    /* calls not answered yet */
    idem_rc rc;     /* the record read */
    idem_rc kv;     /* the lock release */
    idem_rc wr;     /* the write, when one was made */
    uint64_t epoch; /* the write's claim */
    char writes[300];
};

static void looked(struct api_call *c);
static void api_answer_health(struct api_call *c, struct http_response *r);

/* GET health/live: the process answers. */
void api_health_live(struct api_call *c)
{
    api_answer(c, json_response(200, json_pack("{s:s}", "status", "ok")));
}

static struct http_response *cached_health(const struct daemon_health *c)
{
    struct http_response *r = response_new(c->status);
    if (r && (response_add_header(r, "Content-Type", "application/json") ||
              response_set_body(r, c->body, c->body_len))) {
        response_free(r);
        r = NULL;
    }
    return r;
}

static void on_read(void *arg, idem_rc rc, idem_outcome o, idem_record *rec, const char *detail)
{
    struct api_call *c = arg;
    struct look *l = c->own;
    l->rc = rc;
    if (--l->pending == 0)
        looked(c);
}

static void on_kv(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct api_call *c = arg;
    struct look *l = c->own;
    l->kv = rc;
    if (--l->pending == 0)
        looked(c);
}

static void written(struct api_call *c, idem_rc rc, const char *detail)
{
    struct look *l = c->own;
    l->wr = rc;
    if (rc == IDEM_OK) {
        daemon_write_ok(c->d);
    } else {
        snprintf(l->writes, sizeof l->writes, "%s: %s", idem_strerror(rc), detail);
        daemon_write_failed(c->d, rc);
    }
    looked(c);
}

static void on_probe_failed(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    written(arg, rc, detail);
}

static void on_probe_begun(void *arg, idem_rc rc, idem_outcome o, idem_record *rec,
                           const char *detail)
{
    struct api_call *c = arg;
    /* IN_PROGRESS: another probe wrote it within the second. */
    if (rc != IDEM_OK || (o != IDEM_NEW && o != IDEM_TAKEN_OVER)) {
        written(c, rc, detail);
        return;
    }
    rc = idem_record_fail_async(c->d->h, c->loop, PROBE_SPACE, "write-probe", rec->epoch,
                                IDEM_FAIL_RETRYABLE, NULL, 0, 0, on_probe_failed, c);
    if (rc != IDEM_OK)
        written(c, rc, idem_errdetail());
}

/* Both halves answered (pending 0), or the write did (pending -1). */
static void looked(struct api_call *c)
{
    struct look *l = c->own;
    struct daemon *d = c->d;
    if (l->pending == 0 && l->rc == IDEM_OK && atomic_load(&d->writes_failing)) {
        l->pending = -1;
        idem_rc rc = idem_record_begin_async(d->h, c->loop, PROBE_SPACE, "write-probe", NULL,
                                             d->instance, 1000, on_probe_begun, c);
        if (rc != IDEM_OK)
            written(c, rc, idem_errdetail());
        return;
    }
    idem_rc rc = l->rc, kv = l->kv, wr = l->wr;
    const char *writes = l->writes;
    int admin = l->admin;
    idem_stats st;
    size_t down = 0, nk = consumers_count(d->consumers);
    json_t *consumers = json_object();
    for (size_t k = 0; k < nk; k++) {
        int up = atomic_load(&consumers_counters(d->consumers, k)->connected);
        down += !up;
        json_object_set_new(consumers, consumers_name(d->consumers, k),
                            json_string(up ? "connected" : "disconnected"));
    }
    /* With storage.require_synchronous_replication, a primary found without
     * a synchronous standby (after a failover, say) is not ready. */
    idem_replication repl;
    idem_get_replication(d->h, &repl);
    struct live_config *lc = daemon_config_get(d);
    int unsafe = lc->c->require_sync_replication && repl.known && !repl.synchronous;
    daemon_config_put(lc);
    /* A consumer without its broker takes nothing: degraded, as Redis
     * down is; the gateway still serves. */
    const char *status = rc != IDEM_OK || wr != IDEM_OK ? "store_unavailable"
                         : unsafe                       ? "replication_asynchronous"
                         : kv != IDEM_OK || down        ? "degraded"
                                                        : "ok";
    int code = rc == IDEM_OK && wr == IDEM_OK && !unsafe ? 200 : 503;
    if (!admin) {
        json_decref(consumers);
        api_answer_health(c, json_response(code, json_pack("{s:s, s:s, s:s}", "status", status, "records",
                                             rc == IDEM_OK && wr == IDEM_OK ? "ok"
                                                                            : "unavailable",
                                             "tokens_and_locks",
                                             kv == IDEM_OK ? "ok" : "unavailable")));
        return;
    }
    idem_get_stats(d->h, &st);
    idem_commit_times ct;
    idem_get_commit_times(d->h, &ct);
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}",
        "status", status,
        "records", rc == IDEM_OK ? "ok" : idem_errname(rc), "record_writes", writes,
        "tokens_and_locks", kv == IDEM_OK ? "ok" : idem_errname(kv),
        "store", idem_store_name(d->h),
        "version", idem_version(), "store_stats", "conflicts", (json_int_t)st.conflicts,
        "takeovers", (json_int_t)st.takeovers, "commits", (json_int_t)st.commits,
        "committed_ops", (json_int_t)st.committed_ops, "commit_us", (json_int_t)ct.us,
        "gateway", "requests",
        TOTAL(d, requests), "executions", TOTAL(d, executions), "replays", TOTAL(d, replays),
        "in_flight_409", TOTAL(d, in_flight_409), "mismatches", TOTAL(d, mismatches),
        "store_errors", TOTAL(d, store_errors), "upstream_unknown", TOTAL(d, upstream_unknown),
        "passthrough", (json_int_t)atomic_load(&d->passthrough), "redis_down_skips",
        TOTAL(d, redis_down_skips), "answers_not_kept", (json_int_t)gateway_unkept(d->gateway));
    if (j)
        json_object_set_new(j, "consumers", consumers);
    else
        json_decref(consumers);
    /* What the store's primary promises of an acknowledged commit on a
     * failover (the distributed store), as last read. */
    if (j && repl.known)
        json_object_set_new(j, "replication",
                            json_pack("{s:s, s:s, s:s, s:s?}", "commits",
                                      repl.synchronous ? "synchronous" : "asynchronous",
                                      "synchronous_commit", repl.synchronous_commit,
                                      "synchronous_standby_names",
                                      repl.synchronous_standby_names, "why",
                                      repl.synchronous ? NULL : repl.why));
    api_answer_health(c, json_response(code, j));
}


/* The look's answer; the main listener's look keeps it for the others. */
static void api_answer_health(struct api_call *c, struct http_response *r)
{
    struct look *l = c->own;
    struct daemon_health *h = &c->d->public_health;
    if (l->mine) {
        pthread_mutex_lock(&h->mu);
        h->looking = 0;
        if (r && r->body_len < sizeof h->body) {
            h->status = r->status;
            memcpy(h->body, r->body, r->body_len);
            h->body_len = r->body_len;
            h->at_ms = mono_ms();
        }
        pthread_mutex_unlock(&h->mu);
    }
    api_answer(c, r);
}

static void look(struct api_call *c, int admin, int mine)
{
    struct look *l = calloc(1, sizeof *l);
    if (!l) {
        api_answer(c, NULL);
        return;
    }
    c->own = l;
    l->admin = admin;
    l->mine = mine;
    l->pending = 2;
    snprintf(l->writes, sizeof l->writes, "ok");
    idem_rc rc = idem_record_get_async(c->d->h, c->loop, PROBE_SPACE, "probe", on_read, c);
    if (rc != IDEM_OK) {
        l->rc = rc;
        l->pending--;
    }
    rc = idem_lock_release_async(c->d->h, c->loop, PROBE_SPACE, "probe", "probe", on_kv, c);
    if (rc != IDEM_OK) {
        l->kv = rc;
        if (--l->pending == 0)
            looked(c);
    }
}

/* GET health and health/ready. On the admin listener, a look with the
 * counters. On the main listener, which anyone there may ask as often as
 * they like, only the verdicts, and the store is looked at once a second
 * at most, by one request; the others meanwhile get the last look's
 * answer (or, before the first look, look themselves). A load balancer
 * polling, or a client flooding, costs no store call, even while the
 * store is slow. */
void api_health(struct api_call *c)
{
    if (c->req->admin) {
        look(c, 1, 0);
        return;
    }
    struct daemon_health *h = &c->d->public_health;
    pthread_mutex_lock(&h->mu);
    int64_t now = mono_ms();
    if (h->at_ms && (now - h->at_ms < 1000 || h->looking)) {
        struct http_response *r = cached_health(h);
        pthread_mutex_unlock(&h->mu);
        api_answer(c, r);
        return;
    }
    int mine = !h->looking;
    h->looking = 1;
    pthread_mutex_unlock(&h->mu);
    look(c, 0, mine);
}
