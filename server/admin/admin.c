/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.c — the admin listener's door (daemon).
 *
 * Every request on admin_listen names an API key: "Authorization: Bearer
 * KEY". The configuration holds each key's SHA-256, never its text; a
 * request's key is hashed once and compared with every configured hash in
 * constant time, so neither which key matched nor how much of a guess did
 * shows in the time an answer takes. A read key may GET and HEAD (records,
 * metrics, health); a write key may do everything. Refusals are counted,
 * and past a burst of them from one address held back on a timer of the
 * loop (admin_door).
 */
#include "admin/admin.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idem.h"
#include "log.h"
#include "mono.h"
#include "http/rate.h"

static int same_hash(const unsigned char *a, const unsigned char *b)
{
    unsigned char diff = 0;
    for (size_t i = 0; i < 32; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

const struct api_key *admin_key(const struct server_config *cfg, const struct http_msg *m)
{
    if (http_msg_header_alike_count(m, "Authorization") != 1)
        return NULL;
    const char *v = http_msg_header(m, "Authorization");
    if (!v || strncasecmp(v, "Bearer ", 7) != 0)
        return NULL;
    v += 7;
    while (*v == ' ')
        v++;
    unsigned char h[32];
    if (!*v || idem_fingerprint(v, strlen(v), h) != IDEM_OK)
        return NULL;
    const struct api_key *found = NULL;
    for (size_t i = 0; i < cfg->api_key_count; i++) {
        int same = same_hash(h, cfg->api_keys[i].hash);
        found = same ? &cfg->api_keys[i] : found;
    }
    return found;
}

struct http_response *admin_refusal(const struct server_config *cfg, const struct api_key *key,
                                    const struct http_msg *m)
{
    struct http_response *r;
    if (!key) {
        if (cfg->api_key_count == 0)
            r = problem(401, "unauthorized",
                        "the admin listener takes requests with an API key only, and this "
                        "daemon has none: add one to api_keys (docs/security.md)");
        else if (!http_msg_header(m, "Authorization"))
            r = problem(401, "unauthorized",
                        "no API key: send Authorization: Bearer KEY, with a key of api_keys");
        else
            r = problem(401, "unauthorized", "the Authorization header names no API key of "
                        "this daemon (Authorization: Bearer KEY)");
        if (r)
            response_add_header(r, "WWW-Authenticate", "Bearer realm=\"idem\"");
        return r;
    }
    if (key->write || strcmp(m->method, "GET") == 0 || strcmp(m->method, "HEAD") == 0)
        return NULL;
    return problem(403, "insufficient_scope",
                   "API key %s has scope read (GET and HEAD only); %s needs a key of scope "
                   "write",
                   key->name, m->method);
}

/* A refused API key's answer, held back a second once its client address
 * has failed more than AUTH_FAILURE_BURST times lately (one more each
 * AUTH_FAILURE_EVERY_S seconds): guessing is slowed to the admin
 * listener's connections a second, while a right key is never held. */
#define AUTH_FAILURE_BURST 10
#define AUTH_FAILURE_EVERY_S 6
/* And on the listener as a whole, whatever the addresses: a local user can
 * bind as many loopback source addresses as it likes. */
#define AUTH_FAILURE_ALL_BURST 30
#define AUTH_FAILURE_ALL_EVERY_S 2
#define AUTH_FAILURE_ALL "(listener)" /* no peer's host: a table name of its own */
#define AUTH_FAILURE_HOLD_MS 1000

struct held_answer {
    struct event *ev;
    struct live_config *lc;
    struct http_response *r;
};

static void release_held(struct front_request *req)
{
    struct held_answer *h = req->state;
    req->on_abort = NULL;
    event_free(h->ev);
    struct live_config *lc = h->lc;
    struct http_response *r = h->r;
    free(h);
    daemon_answer(lc, req, r);
}

static void on_held(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    release_held(arg);
}

static void answer_refused_key(struct daemon *d, struct live_config *lc, struct front_request *req,
                               struct http_response *r)
{
    struct daemon_loop *loop = req->loop_ctx;
    atomic_fetch_add(&d->auth_failures, 1);
    struct held_answer *h = NULL;
    int64_t now = mono_us();
    int by_peer = rate_take(d->auth_failures_by_peer, req->peer, front_peer_host(req->peer),
                            1.0 / AUTH_FAILURE_EVERY_S, AUTH_FAILURE_BURST, now) != 0;
    int by_all = rate_take(d->auth_failures_by_peer, AUTH_FAILURE_ALL,
                           sizeof AUTH_FAILURE_ALL - 1, 1.0 / AUTH_FAILURE_ALL_EVERY_S,
                           AUTH_FAILURE_ALL_BURST, now) != 0;
    if ((!by_peer && !by_all) || !(h = calloc(1, sizeof *h)) ||
        !(h->ev = evtimer_new(loop->base, on_held, req))) {
        free(h);
        daemon_answer(lc, req, r);
        return;
    }
    h->lc = lc;
    h->r = r;
    req->state = h;
    req->on_abort = release_held;
    struct timeval tv = {AUTH_FAILURE_HOLD_MS / 1000, (AUTH_FAILURE_HOLD_MS % 1000) * 1000};
    evtimer_add(h->ev, &tv);
}

/* Each key's use is logged, at most once a minute per key (a service on
 * the JSON API makes a call per operation of its own). */
static void log_key_use(const struct api_key *k, const struct front_request *req,
                        const char *path)
{
    int64_t now = mono_ms();
    int64_t *at = (int64_t *)&k->logged_ms; /* the key's own, made by calloc */
    int64_t was = __atomic_load_n(at, __ATOMIC_RELAXED);
    if ((was && now - was < 60000) ||
        !__atomic_compare_exchange_n(at, &was, now, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return;
    daemon_log("admin: API key %s (scope %s) in use: %s %s from %s%s", k->name,
               k->write ? "write" : "read", req->msg->method, path, req->peer,
               was ? " (logged once a minute)" : "");
}

/* A request on the admin listener: its key checked. */
int admin_door(struct daemon *d, struct live_config *lc, struct front_request *req,
               const char *path)
{
    const struct server_config *cfg = lc->c;
    const struct api_key *key = admin_key(cfg, req->msg);
    struct http_response *r = admin_refusal(cfg, key, req->msg);
    if (!key) {
        answer_refused_key(d, lc, req, r);
        return 1;
    }
    if (r) {
        daemon_answer(lc, req, r);
        return 1;
    }
    log_key_use(key, req, path);
    return 0;
}
