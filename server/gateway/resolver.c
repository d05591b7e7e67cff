/* SPDX-License-Identifier: Apache-2.0 */
/*
 * resolver.c — finds the held claims of on_unknown_outcome: resolve routes
 * whose hold has ended and hands each to the gateway (resolver.h).
 *
 * A look lists a route's space's PROCESSING records (the state index the
 * listing is served from, idem.h) and takes those whose lease has run
 * out: a claim held until its next question, or one a dead daemon left.
 * The gateway takes each over (a new epoch, so that two instances never ask
 * about one claim at once) and asks the service. One look per route at a
 * time; a page of at most LOOK_MAX claims per look.
 */
#include "gateway/resolver.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/gateway.h"
#include "log.h"
#include "mono.h"

#define LOOK_MAX 100

struct resolver {
    struct daemon *d;
    struct daemon_loop *loop;
    struct front *front;
    struct event *timer;
    unsigned looking; /* listings in flight */
    int stopped;
};

struct look {
    struct resolver *r;
    struct live_config *lc; /* a reference, for the route */
    const struct route *rt;
};

static void on_done(void *owner, struct front_request *req)
{
    (void)owner;
    (void)req; /* the gateway logged what it found */
}

/* Hand one claim to the gateway, as a request of its own. */
static void resolve_one(struct resolver *r, struct live_config *lc, const struct route *rt,
                        const char *key)
{
    struct http_msg *m = calloc(1, sizeof *m);
    if (m) {
        m->version_minor = 1;
        m->method = strdup("GET");
        m->target = strdup("/");
        m->body = strdup("");
    }
    if (!m || !m->method || !m->target || !m->body) {
        http_msg_free(m);
        return; /* the next look asks again */
    }
    struct front_request *req = front_inject(r->front, m, on_done, r);
    if (req)
        gateway_resolve(r->d, daemon_config_ref(lc), rt, req, key);
}

static void on_page(void *arg, idem_rc rc, idem_record_page *page, const char *detail)
{
    struct look *k = arg;
    struct resolver *r = k->r;
    if (rc != IDEM_OK && rc != IDEM_ECLOSING)
        daemon_log_about(LOG_WARN, LOG_ROUTE(k->rt->name),
                         "route %s: looking for claims to resolve: %s: %s", k->rt->name,
                         idem_strerror(rc), detail);
    int64_t now = wall_ms();
    size_t due = 0;
    for (size_t i = 0; rc == IDEM_OK && !r->stopped && i < page->count; i++)
        if (page->items[i].lease_until_ms <= now)
            resolve_one(r, k->lc, k->rt, page->items[i].key), due++;
    if (rc == IDEM_OK && daemon_log_enabled(LOG_DEBUG))
        daemon_log_about(LOG_DEBUG, LOG_ROUTE(k->rt->name),
                         "route %s: %zu claims in flight, %zu of them to ask about",
                         k->rt->name, page->count, due);
    daemon_config_put(k->lc);
    free(k);
    r->looking--;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct resolver *r = arg;
    (void)fd;
    (void)what;
    if (r->looking || r->stopped)
        return;
    struct live_config *lc = daemon_config_get(r->d);
    const struct server_config *c = lc->c;
    for (size_t i = 0; i < c->route_count + c->consumer_count; i++) {
        const struct route *rt =
            i < c->route_count ? &c->routes[i] : &c->consumers[i - c->route_count].route;
        if (!rt->resolve)
            continue;
        struct look *k = malloc(sizeof *k);
        if (!k)
            break;
        k->r = r;
        k->lc = daemon_config_ref(lc);
        k->rt = rt;
        idem_record_query q = {.space = rt->space, .state = IDEM_STATE_PROCESSING,
                               .limit = LOOK_MAX};
        r->looking++;
        if (idem_record_list_async(r->d->h, r->loop->iloop, &q, on_page, k) != IDEM_OK) {
            r->looking--;
            daemon_config_put(k->lc);
            free(k);
        }
    }
    daemon_config_put(lc);
}

struct resolver *resolver_new(struct daemon *d, struct daemon_loop *loop, struct front *front)
{
    struct resolver *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->d = d;
    r->loop = loop;
    r->front = front;
    if (!(r->timer = event_new(loop->base, -1, EV_PERSIST, on_tick, r))) {
        free(r);
        return NULL;
    }
    struct timeval second = {1, 0};
    event_add(r->timer, &second);
    return r;
}

void resolver_stop(struct resolver *r)
{
    if (!r)
        return;
    r->stopped = 1;
    event_del(r->timer);
}

void resolver_free(struct resolver *r)
{
    if (!r)
        return;
    event_free(r->timer);
    free(r);
}
