/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mq_redis.c — the Redis Streams source of the consumers (consume.h), on
 * hiredis's asynchronous API, attached to the consumer's event loop.
 *
 * Two connections. The reading one asks for as many entries as the
 * consumer takes, one request at a time: XREADGROUP GROUP g NAME COUNT n
 * BLOCK 1000 STREAMS s >, or, when due (at connecting, then every few
 * seconds), XAUTOCLAIM of the entries consumers that stopped answering
 * left pending past min_idle (the lease, the handler's timeout and the
 * longest backoff, so that an entry a live consumer holds is not taken).
 * A blocked read holds its connection, which is why the other exists: it
 * acks (XACK) and dead-letters. A dead letter is one script (XADD to the
 * dead stream, then XACK), so the entry leaves the group only once its
 * dead letter is written.
 *
 * An entry's field body_field is the message's body, message_id its id
 * (else the entry's id), and every other field a header. The group is
 * used as it is when it exists; otherwise it is made from the stream's
 * first entry (nothing already in the stream is skipped), with MKSTREAM.
 * The consumer's name in the group is this instance's.
 */
#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "consume/consume.h"
#include "http/http_parser.h"
#include "core/redis_url.h"
#include "log.h"
#include "mono.h"

#define CONNECT_TIMEOUT_MS 2000
#define RECONNECT_MIN_MS 250
#define RECONNECT_MAX_MS 10000
#define CLAIM_EVERY_MS 2000
#define DEAD_HEADERS_MAX 1000 /* a dead letter's headers, at most */

/* XADD the dead letter, then XACK the entry: if the first fails the
 * script stops, and the entry stays pending. KEYS: dead stream, stream;
 * ARGV: group, entry id, then the dead letter's fields and values. */
static const char dead_letter_script[] =
    "local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))\n"
    "redis.call('XACK', KEYS[2], ARGV[1], ARGV[2])\n"
    "return id\n";

struct redis_src {
    struct consumer *k;
    struct event_base *base;
    const struct consumer_config *cfg;
    char host[IDEM_REDIS_HOST_MAX + 1];  /* with sentinels: where the last one said */
    int port, db;
    int sentinels;                       /* redis-sentinel://: each dial asks one first */
    struct {
        char host[IDEM_REDIS_HOST_MAX + 1];
        int port;
    } sentinel[IDEM_REDIS_SENTINELS_MAX];
    char master[IDEM_REDIS_HOST_MAX + 1];
    int ask_next;                        /* the sentinel asked next */
    redisAsyncContext *ask;              /* asking it; NULL when not */
    char user[IDEM_REDIS_USER_MAX + 1];         /* "" for none */
    char password[IDEM_REDIS_PASSWORD_MAX + 1]; /* "" for none */
    char name[96];               /* the consumer's name in the group */
    redisAsyncContext *rd, *wr;  /* reading, writing; NULL when closed */
    int rd_up, wr_up;            /* connected and set up */
    int reading;                 /* an XREADGROUP is out */
    size_t want;                 /* how many more the consumer takes */
    int claim_due;               /* the next read is an XAUTOCLAIM */
    unsigned long gen;           /* this pair of connections (consumer_gen when up) */
    struct event *dial_ev, *claim_ev, *timeout_ev;
    int64_t backoff_ms, min_idle_ms;
    unsigned long failures;
    int stopped, connected;
    char claim_cursor[48];
};

static void lost(struct redis_src *r, const char *why);
static void read_more(struct redis_src *r);

static int is_error(const redisReply *x)
{
    return !x || x->type == REDIS_REPLY_ERROR;
}

static const char *error_text(const redisAsyncContext *c, const redisReply *x)
{
    if (x && x->type == REDIS_REPLY_ERROR)
        return x->str;
    return c && c->errstr[0] ? c->errstr : "the connection closed";
}

/* ---- entries ---- */

static struct mq_message *from_entry(struct redis_src *r, const redisReply *e)
{
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
        e->element[0]->type != REDIS_REPLY_STRING)
        return NULL;
    const redisReply *fields = e->element[1];
    struct mq_message *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->gen = consumer_gen(r->k);
    snprintf(m->entry, sizeof m->entry, "%s", e->element[0]->str);
    size_t n = fields->type == REDIS_REPLY_ARRAY ? fields->elements / 2 : 0;
    int oom = n && !(m->headers = calloc(n, sizeof *m->headers));
    for (size_t i = 0; !oom && i < n; i++) {
        const redisReply *f = fields->element[2 * i], *v = fields->element[2 * i + 1];
        if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
            continue;
        if (!strcmp(f->str, r->cfg->body_field) && !m->body) {
            oom = !(m->body = malloc(v->len + 1));
            if (!oom) {
                memcpy(m->body, v->str, v->len);
                m->body[v->len] = '\0';
                m->body_len = v->len;
            }
        } else if (!strcmp(f->str, "message_id") && !m->id) {
            oom = !(m->id = strndup(v->str, v->len));
            if (!oom && (!http_is_field_text(v->str, v->len) || strlen(m->id) != v->len))
                m->bad = "message_id_invalid";
        } else {
            oom = mq_add_header(m, f->str, f->len, v->str, v->len) != 0;
        }
    }
    if (!oom && !m->id)
        oom = !(m->id = strdup(m->entry));
    if (!oom && !m->body)
        oom = !(m->body = calloc(1, 1));
    if (oom) {
        mq_message_free(m);
        return NULL;
    }
    return m;
}


/* The entries of an XREADGROUP or XAUTOCLAIM reply, to the consumer. An
 * entry deleted from the stream while pending comes as an id alone: it is
 * acked, there being nothing to handle. */
static void deliver_entries(struct redis_src *r, const redisReply *list)
{
    unsigned long gen = r->gen;
    if (list && list->type == REDIS_REPLY_ARRAY)
        r->want = r->want > list->elements ? r->want - list->elements : 0;
    for (size_t i = 0; list && list->type == REDIS_REPLY_ARRAY && i < list->elements; i++) {
        const redisReply *e = list->element[i];
        if (e->type == REDIS_REPLY_ARRAY && e->elements == 2 &&
            e->element[1]->type == REDIS_REPLY_NIL && e->element[0]->type == REDIS_REPLY_STRING) {
            redisAsyncCommand(r->wr, NULL, NULL, "XACK %s %s %s", r->cfg->queue, r->cfg->group,
                              e->element[0]->str);
            continue;
        }
        /* A claim gives back entries this consumer holds too (waiting long
         * for their next attempt): they are here already. */
        if (e->type == REDIS_REPLY_ARRAY && e->elements == 2 &&
            e->element[0]->type == REDIS_REPLY_STRING &&
            consumer_holds(r->k, e->element[0]->str))
            continue;
        struct mq_message *m = from_entry(r, e);
        if (m)
            consumer_deliver(r->k, m);
        if (r->gen != gen) /* the consumer lost the connection meanwhile */
            return;
    }
}

static void on_read(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    (void)c;
    if (!r->rd || c != r->rd)
        return; /* an old connection's */
    r->reading = 0;
    if (is_error(x)) {
        char why[300];
        snprintf(why, sizeof why, "XREADGROUP: %s", error_text(c, x));
        lost(r, why);
        return;
    }
    /* [[stream, [entry...]]], or nil after BLOCK without entries. */
    if (x->type == REDIS_REPLY_ARRAY && x->elements > 0 &&
        x->element[0]->type == REDIS_REPLY_ARRAY && x->element[0]->elements == 2) {
        deliver_entries(r, x->element[0]->element[1]);
    }
    read_more(r);
}

static void on_claimed(redisAsyncContext *c, void *reply, void *arg);

/* The next read on the reading connection, as many as the consumer takes:
 * new entries, or (claim_due) the pending entries consumers left. One at a
 * time, so that what is out never asks for more than the consumer takes. */
static void read_more(struct redis_src *r)
{
    size_t n = r->want;
    if (r->stopped || !r->connected || r->reading || n == 0)
        return;
    char count[24], idle[24];
    snprintf(count, sizeof count, "%zu", n);
    snprintf(idle, sizeof idle, "%lld", (long long)r->min_idle_ms);
    const char *rd[] = {"XREADGROUP", "GROUP", r->cfg->group, r->name, "COUNT", count,
                        "BLOCK", "1000", "STREAMS", r->cfg->queue, ">"};
    const char *claim[] = {"XAUTOCLAIM", r->cfg->queue, r->cfg->group, r->name, idle,
                           r->claim_cursor[0] ? r->claim_cursor : "0-0", "COUNT", count};
    int claiming = r->claim_due && strcmp(r->claim_cursor, "off") != 0;
    r->claim_due = 0;
    if ((claiming ? redisAsyncCommandArgv(r->rd, on_claimed, r, 8, claim, NULL)
                  : redisAsyncCommandArgv(r->rd, on_read, r, 11, rd, NULL)) == REDIS_OK) {
        r->reading = 1;
    }
}

/* ---- pending entries of consumers gone ---- */

static void on_claimed(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    if (!r->rd || c != r->rd)
        return;
    r->reading = 0;
    if (is_error(x) && !x) {
        lost(r, "XAUTOCLAIM: the connection closed");
        return;
    }
    if (is_error(x)) {
        /* XAUTOCLAIM is Redis 6.2's: before it, pending entries of a dead
         * consumer stay until an operator claims them. Said once. */
        if (x && !r->claim_cursor[0]) {
            daemon_log_about(LOG_INFO, LOG_CONSUMER(r->cfg->route.name),
                             "consumer %s: XAUTOCLAIM failed (%s): entries left pending by a "
                             "consumer that stopped are not taken over",
                             r->cfg->route.name, error_text(c, x));
            snprintf(r->claim_cursor, sizeof r->claim_cursor, "off");
        }
        read_more(r);
        return;
    }
    /* [next cursor, [entry...], (7.0: deleted ids)] */
    if (x->type != REDIS_REPLY_ARRAY || x->elements < 2) {
        read_more(r);
        return;
    }
    if (x->element[0]->type == REDIS_REPLY_STRING)
        snprintf(r->claim_cursor, sizeof r->claim_cursor, "%s", x->element[0]->str);
    unsigned long gen = r->gen;
    deliver_entries(r, x->element[1]);
    if (r->gen != gen)
        return;
    /* More of the group's pending entries to look at: go on with them
     * before new ones, as far as the consumer takes more. */
    r->claim_due = strcmp(r->claim_cursor, "0-0") != 0;
    read_more(r);
}

struct ids {
    const char **argv;
    size_t n, cap;
};

static void add_id(void *arg, const char *entry)
{
    struct ids *ids = arg;
    if (ids->n < ids->cap)
        ids->argv[ids->n++] = entry;
}

/* The entries held here, claimed again by this consumer (XCLAIM min-idle 0
 * JUSTID): their idle time starts anew, so that no consumer takes over an
 * entry this one still holds, however long its attempts take. */
static void refresh_held(struct redis_src *r)
{
    size_t cap = r->cfg->prefetch * 2 + 8;
    struct ids ids = {calloc(cap, sizeof(char *)), 0, cap};
    if (!ids.argv)
        return;
    const char *head[] = {"XCLAIM", r->cfg->queue, r->cfg->group, r->name, "0"};
    for (size_t i = 0; i < 5; i++)
        ids.argv[ids.n++] = head[i];
    consumer_each_held(r->k, add_id, &ids);
    if (ids.n > 5 && ids.n < cap) {
        ids.argv[ids.n++] = "JUSTID";
        redisAsyncCommandArgv(r->wr, NULL, NULL, (int)ids.n, ids.argv, NULL);
    }
    free(ids.argv);
}

static void on_claim_tick(evutil_socket_t fd, short what, void *arg)
{
    struct redis_src *r = arg;
    (void)fd;
    (void)what;
    if (r->stopped || !r->connected)
        return;
    refresh_held(r);
    r->claim_due = 1;
    read_more(r); /* or once the read out now is answered */
}

/* ---- connecting ---- */

static void close_connections(struct redis_src *r)
{
    /* Freed later by hiredis when inside one of its callbacks. */
    redisAsyncContext *rd = r->rd, *wr = r->wr, *ask = r->ask;
    r->rd = r->wr = r->ask = NULL;
    r->rd_up = r->wr_up = r->reading = 0;
    if (ask) {
        ask->data = NULL;
        redisAsyncFree(ask);
    }
    if (rd) {
        rd->data = NULL;
        redisAsyncFree(rd);
    }
    if (wr) {
        wr->data = NULL;
        redisAsyncFree(wr);
    }
}

static void redial_later(struct redis_src *r)
{
    if (r->stopped)
        return;
    struct timeval tv = ms_timeval(r->backoff_ms);
    r->backoff_ms = r->backoff_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : r->backoff_ms * 2;
    evtimer_add(r->dial_ev, &tv);
}

static void failed(struct redis_src *r, const char *why)
{
    r->failures++;
    if ((r->failures & (r->failures - 1)) == 0)
        daemon_log_about(LOG_WARN, LOG_CONSUMER(r->cfg->route.name),
                         "consumer %s: cannot connect to Redis (%s; %lu tries so far), "
                         "trying again",
                         r->cfg->route.name, why, r->failures);
    close_connections(r);
    redial_later(r);
}

static void lost(struct redis_src *r, const char *why)
{
    int was = r->connected;
    r->connected = 0;
    evtimer_del(r->timeout_ev);
    if (!was) {
        failed(r, why);
        return;
    }
    close_connections(r);
    consumer_connection(r->k, 0, why);
    r->backoff_ms = RECONNECT_MIN_MS;
    redial_later(r);
}

static void set_up(struct redis_src *r)
{
    if (!r->rd_up || !r->wr_up || r->connected)
        return;
    evtimer_del(r->timeout_ev);
    r->connected = 1;
    r->failures = 0;
    r->backoff_ms = RECONNECT_MIN_MS;
    r->gen++;
    char where[400];
    snprintf(where, sizeof where, "%s:%d db %d, stream %s, group %s as %s", r->host, r->port,
             r->db, r->cfg->queue, r->cfg->group, r->name);
    r->claim_cursor[0] = '\0';
    r->claim_due = 1; /* what consumers that died left, first */
    consumer_connection(r->k, 1, where); /* asks for messages: read_more */
}

/* The reply to the last setup command of a connection (after AUTH and
 * SELECT, pipelined before it): any error ends the attempt. */
static void on_setup(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    if (c != r->rd && c != r->wr)
        return;
    if (is_error(x) && !(x && c == r->wr && !strncmp(x->str, "BUSYGROUP", 9))) {
        char why[300];
        snprintf(why, sizeof why, "setting up: %s", error_text(c, x));
        lost(r, why);
        return;
    }
    if (c == r->wr && x->type != REDIS_REPLY_ERROR)
        daemon_log_about(LOG_INFO, LOG_CONSUMER(r->cfg->route.name),
                         "consumer %s: made group %s of stream %s, from its first entry",
                         r->cfg->route.name, r->cfg->group, r->cfg->queue);
    if (c == r->rd)
        r->rd_up = 1;
    else
        r->wr_up = 1;
    set_up(r);
}

static void on_step(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    if ((c == r->rd || c == r->wr) && is_error(x)) {
        char why[300];
        snprintf(why, sizeof why, "setting up: %s", error_text(c, x));
        lost(r, why);
    }
}

static void on_disconnect(const redisAsyncContext *c, int status)
{
    struct redis_src *r = c->data;
    (void)status;
    if (r && (c == r->rd || c == r->wr)) {
        /* hiredis frees c after this callback: ours to forget, not free. */
        if (c == r->rd)
            r->rd = NULL;
        else
            r->wr = NULL;
        lost(r, c->errstr[0] ? c->errstr : "the server closed the connection");
    }
}

static void on_connect(const redisAsyncContext *c, int status)
{
    struct redis_src *r = c->data;
    if (r && status != REDIS_OK && c == r->ask) {
        char why[400];
        snprintf(why, sizeof why, "sentinel %s:%d: %s", r->sentinel[r->ask_next].host,
                 r->sentinel[r->ask_next].port, c->errstr);
        r->ask = NULL; /* hiredis frees it */
        r->ask_next = (r->ask_next + 1) % r->sentinels;
        failed(r, why);
        return;
    }
    if (r && status != REDIS_OK && (c == r->rd || c == r->wr)) {
        if (c == r->rd)
            r->rd = NULL;
        else
            r->wr = NULL;
        char why[300];
        snprintf(why, sizeof why, "%s:%d: %s", r->host, r->port, c->errstr);
        lost(r, why);
    }
}

/* With sentinels: the server they named must be the master (one that has
 * not seen the failover yet names the old one, which may be a replica). */
static void on_role(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    if (c != r->rd && c != r->wr)
        return;
    if (!idem__redis_is_master(x)) {
        char why[400];
        snprintf(why, sizeof why, "%s:%d, named by the sentinels, is not a master (yet)",
                 r->host, r->port);
        lost(r, why);
    }
}

static redisAsyncContext *connect_one(struct redis_src *r, int writer)
{
    redisAsyncContext *c = redisAsyncConnect(r->host, r->port);
    if (!c || c->err) {
        if (c)
            redisAsyncFree(c);
        return NULL;
    }
    c->data = r;
    redisLibeventAttach(c, r->base);
    redisAsyncSetConnectCallback(c, on_connect);
    redisAsyncSetDisconnectCallback(c, on_disconnect);
    if (r->user[0])
        redisAsyncCommand(c, on_step, r, "AUTH %s %s", r->user, r->password);
    else if (r->password[0])
        redisAsyncCommand(c, on_step, r, "AUTH %s", r->password);
    redisAsyncCommand(c, on_step, r, "SELECT %d", r->db);
    if (r->sentinels)
        redisAsyncCommand(c, on_role, r, "ROLE");
    if (writer)
        redisAsyncCommand(c, on_setup, r, "XGROUP CREATE %s %s 0 MKSTREAM", r->cfg->queue,
                          r->cfg->group);
    else
        redisAsyncCommand(c, on_setup, r, "PING");
    return c;
}

static void on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct redis_src *r = arg;
    (void)fd;
    (void)what;
    if (r->ask) /* that sentinel said nothing: the next one, next time */
        r->ask_next = (r->ask_next + 1) % r->sentinels;
    if (!r->connected)
        lost(r, r->ask ? "a sentinel: no answer within 2 s" : "no answer within 2 s");
}

static void dial(struct redis_src *r)
{
    r->rd = connect_one(r, 0);
    r->wr = r->rd ? connect_one(r, 1) : NULL;
    if (!r->wr) {
        failed(r, "cannot make a connection");
        return;
    }
    struct timeval tv = ms_timeval(CONNECT_TIMEOUT_MS);
    evtimer_add(r->timeout_ev, &tv);
}

/* A sentinel's answer: where the master is; the connections go there. */
static void on_ask(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_src *r = arg;
    redisReply *x = reply;
    if (c != r->ask)
        return;
    r->ask = NULL;
    c->data = NULL;
    char why[400];
    const char *not = x ? idem__sentinel_master(x, r->host, sizeof r->host, &r->port)
                        : error_text(c, x);
    if (!not) {
        redisAsyncDisconnect(c);
        evtimer_del(r->timeout_ev);
        dial(r);
        return;
    }
    snprintf(why, sizeof why, "sentinel %s:%d: %s", r->sentinel[r->ask_next].host,
             r->sentinel[r->ask_next].port, not);
    redisAsyncDisconnect(c);
    r->ask_next = (r->ask_next + 1) % r->sentinels;
    failed(r, why);
}

/* With sentinels, each dial asks one where the master is first (in turn,
 * the next after one that did not say): a lost connection comes back to
 * the master of the moment. */
static void ask_sentinel(struct redis_src *r)
{
    const char *host = r->sentinel[r->ask_next].host;
    int port = r->sentinel[r->ask_next].port;
    redisAsyncContext *c = redisAsyncConnect(host, port);
    if (!c || c->err) {
        char why[400];
        snprintf(why, sizeof why, "sentinel %s:%d: %s", host, port,
                 c ? c->errstr : "out of memory");
        if (c)
            redisAsyncFree(c);
        r->ask_next = (r->ask_next + 1) % r->sentinels;
        failed(r, why);
        return;
    }
    c->data = r;
    redisLibeventAttach(c, r->base);
    redisAsyncSetConnectCallback(c, on_connect);
    redisAsyncSetDisconnectCallback(c, on_disconnect);
    const char *argv[] = {"SENTINEL", "get-master-addr-by-name", r->master};
    redisAsyncCommandArgv(c, on_ask, r, 3, argv, NULL);
    r->ask = c;
    struct timeval tv = ms_timeval(CONNECT_TIMEOUT_MS);
    evtimer_add(r->timeout_ev, &tv);
}

static void on_dial(evutil_socket_t fd, short what, void *arg)
{
    struct redis_src *r = arg;
    (void)fd;
    (void)what;
    if (r->stopped || r->rd || r->wr || r->ask)
        return;
    if (r->sentinels)
        ask_sentinel(r);
    else
        dial(r);
}

/* ---- the source ---- */

static void *redis_open(struct consumer *k, struct event_base *base,
                        const struct consumer_config *cfg, const char *instance)
{
    struct redis_src *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->k = k;
    r->base = base;
    r->cfg = cfg;
    r->backoff_ms = RECONNECT_MIN_MS;
    snprintf(r->name, sizeof r->name, "%s", instance);
    int64_t longest = 0;
    for (size_t i = 0; i < cfg->backoff_count; i++)
        longest = cfg->backoff_ms[i] > longest ? cfg->backoff_ms[i] : longest;
    r->min_idle_ms = cfg->route.lease_ms + cfg->route.upstream_timeout_ms + longest;
    /* The library's parser (core/redis_url.h), the distributed store's
     * own: its detail names what is wrong, never the password. */
    struct idem__redis_url url;
    if (idem__redis_url_parse(cfg->url, "redis_stream", &url) != IDEM_OK) {
        daemon_log_about(LOG_INFO, LOG_CONSUMER(cfg->route.name),
                         "consumer %s: %s", cfg->route.name, idem_errdetail());
        free(r);
        return NULL;
    }
    snprintf(r->host, sizeof r->host, "%s", url.host);
    r->port = url.port;
    r->sentinels = url.sentinels;
    for (int i = 0; i < url.sentinels; i++) {
        snprintf(r->sentinel[i].host, sizeof r->sentinel[i].host, "%s", url.sentinel[i].host);
        r->sentinel[i].port = url.sentinel[i].port;
    }
    snprintf(r->master, sizeof r->master, "%s", url.master);
    r->db = url.db;
    snprintf(r->user, sizeof r->user, "%s", url.user);
    snprintf(r->password, sizeof r->password, "%s", url.password);
    idem__redis_url_wipe(&url);
    r->dial_ev = evtimer_new(base, on_dial, r);
    r->timeout_ev = evtimer_new(base, on_connect_timeout, r);
    r->claim_ev = event_new(base, -1, EV_PERSIST, on_claim_tick, r);
    /* Often enough that a held entry is refreshed well within min_idle. */
    int64_t every_ms = r->min_idle_ms / 3 < CLAIM_EVERY_MS ? r->min_idle_ms / 3 : CLAIM_EVERY_MS;
    struct timeval now = {0, 0}, every = ms_timeval(every_ms > 100 ? every_ms : 100);
    if (!r->dial_ev || !r->timeout_ev || !r->claim_ev || evtimer_add(r->dial_ev, &now) != 0 ||
        event_add(r->claim_ev, &every) != 0) {
        if (r->dial_ev)
            event_free(r->dial_ev);
        if (r->timeout_ev)
            event_free(r->timeout_ev);
        if (r->claim_ev)
            event_free(r->claim_ev);
        free(r);
        return NULL;
    }
    return r;
}

static void redis_want(void *src, size_t n)
{
    struct redis_src *r = src;
    /* What the read out now brings comes off it when it comes. */
    r->want = n;
    read_more(r);
}

static int redis_ack(void *src, const struct mq_message *m)
{
    struct redis_src *r = src;
    if (!r->connected)
        return -1;
    const char *argv[] = {"XACK", r->cfg->queue, r->cfg->group, m->entry};
    return redisAsyncCommandArgv(r->wr, NULL, NULL, 4, argv, NULL) == REDIS_OK ? 0 : -1;
}

static void on_dead_lettered(redisAsyncContext *c, void *reply, void *arg)
{
    redisReply *x = reply;
    struct redis_src *r = c->data;
    (void)arg;
    if (r && x && x->type == REDIS_REPLY_ERROR)
        daemon_log_about(LOG_ERROR, LOG_CONSUMER(r->cfg->route.name),
                         "consumer %s: dead-lettering to %s failed (%s): the entry stays pending, "
                         "and is taken over again later",
                         r->cfg->route.name, r->cfg->dead_letter, x->str);
}

/* An EVAL's arguments: the script and its keys, then the fields of an
 * entry (a message's body, headers and id, and Idem's own). */
struct args {
    const char **argv;
    size_t *lens;
    size_t n, cap;
};

static int args_init(struct args *a, size_t cap)
{
    a->argv = calloc(cap, sizeof *a->argv);
    a->lens = calloc(cap, sizeof *a->lens);
    a->n = 0;
    a->cap = cap;
    if (a->argv && a->lens)
        return 0;
    free(a->argv);
    free(a->lens);
    return -1;
}

static void add_arg(struct args *a, const char *s, size_t len)
{
    if (a->n < a->cap) {
        a->argv[a->n] = s;
        a->lens[a->n++] = len;
    }
}

static void arg_str(struct args *a, const char *s)
{
    add_arg(a, s, strlen(s));
}

/* m's body, headers and id as an entry's fields, at most DEAD_HEADERS_MAX
 * headers (Lua's unpack() takes some 8000 values; a message refused for
 * too many says how many were left out, in dropped). Room: 2 *
 * (DEAD_HEADERS_MAX + 3). */
static void message_fields(struct args *a, const struct redis_src *r, const struct mq_message *m,
                           char dropped[24])
{
    size_t headers = m->header_count < DEAD_HEADERS_MAX ? m->header_count : DEAD_HEADERS_MAX;
    arg_str(a, r->cfg->body_field);
    add_arg(a, m->body, m->body_len);
    for (size_t h = 0; h < headers; h++) {
        arg_str(a, m->headers[h].name);
        arg_str(a, m->headers[h].value);
    }
    if (headers < m->header_count) {
        snprintf(dropped, 24, "%zu", m->header_count - headers);
        arg_str(a, "x-idem-headers-left-out");
        arg_str(a, dropped);
    }
    arg_str(a, "message_id");
    arg_str(a, m->id ? m->id : m->entry);
}

static size_t fields_room(const struct mq_message *m)
{
    size_t headers = m->header_count < DEAD_HEADERS_MAX ? m->header_count : DEAD_HEADERS_MAX;
    return 2 * (headers + 3);
}

static int redis_dead_letter(void *src, const struct mq_message *m, const char *reason,
                             unsigned attempts, int last_status)
{
    struct redis_src *r = src;
    struct args a;
    if (!r->connected || args_init(&a, 7 + fields_room(m) + 10) != 0)
        return -1;
    char att[16], st[16], dropped[24];
    snprintf(att, sizeof att, "%u", attempts);
    snprintf(st, sizeof st, "%d", last_status);
    arg_str(&a, "EVAL");
    add_arg(&a, dead_letter_script, sizeof dead_letter_script - 1);
    arg_str(&a, "2");
    arg_str(&a, r->cfg->dead_letter);
    arg_str(&a, r->cfg->queue);
    arg_str(&a, r->cfg->group);
    arg_str(&a, m->entry);
    message_fields(&a, r, m, dropped);
    const char *ours[] = {"x-idem-reason", reason, "x-idem-attempts", att,
                          "x-idem-last-status", st, "x-idem-consumer", r->cfg->route.name,
                          "x-idem-entry", m->entry};
    for (size_t i = 0; i < sizeof ours / sizeof ours[0]; i++)
        arg_str(&a, ours[i]);
    int rc = redisAsyncCommandArgv(r->wr, on_dead_lettered, NULL, (int)a.n, a.argv, a.lens);
    free(a.argv);
    free(a.lens);
    return rc == REDIS_OK ? 0 : -1;
}

/* ---- the redrive's session (consume.h) ----
 *
 * On the writing connection: XRANGE reads the dead stream one entry at a
 * time after the last one read, up to the last one there at the start
 * (one put back and dead-lettered again lands past it, and is not
 * chased); a requeue is one script, which adds the
 * message to the stream and deletes the dead letter only if the dead
 * letter is still there (another session may have taken it): a dead
 * letter leaves only once its message is back, and goes back once. */

/* KEYS: dead stream, stream; ARGV: the dead letter's id, then the fields.
 * 1 moved, 0 gone already. */
static const char requeue_script[] =
    "if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end\n"
    "redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))\n"
    "redis.call('XDEL', KEYS[1], ARGV[1])\n"
    "return 1\n";

struct redis_dead {
    struct redis_src *r;
    char cursor[48]; /* the last entry read; "" none yet */
    char last[48];   /* the last entry at the start; "" not read yet */
    void (*got)(void *arg, int rc, struct mq_message *m);
    void (*done)(void *arg, int rc);
    void (*left)(void *arg, long n);
    void *arg;
};

static void *redis_dead_open(void *src, char *err, size_t errlen)
{
    struct redis_src *r = src;
    if (!r->connected) {
        snprintf(err, errlen, "not connected to Redis");
        return NULL;
    }
    struct redis_dead *s = calloc(1, sizeof *s);
    if (!s)
        snprintf(err, errlen, "out of memory");
    else
        s->r = r;
    return s;
}

static void on_dead_read(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_dead *s = arg;
    redisReply *x = reply;
    struct mq_message *m = NULL;
    int rc = 0;
    if (is_error(x) || x->type != REDIS_REPLY_ARRAY) {
        daemon_log_about(LOG_WARN, LOG_CONSUMER(s->r->cfg->route.name),
                         "consumer %s: redrive: XRANGE %s: %s", s->r->cfg->route.name,
                         s->r->cfg->dead_letter, error_text(c, x));
        rc = -1;
    } else if (x->elements > 0) {
        m = from_entry(s->r, x->element[0]);
        if (m && mq_dead_unwrap(m) != 0) {
            mq_message_free(m);
            m = NULL;
        }
        if (m)
            snprintf(s->cursor, sizeof s->cursor, "%s", m->entry);
        else
            rc = -1;
    }
    s->got(s->arg, rc, m);
}

static void redis_dead_next(void *ses, void (*got)(void *arg, int rc, struct mq_message *m),
                            void *arg);

/* The last entry of the dead stream at the start, then the first read. */
static void on_dead_last(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_dead *s = arg;
    redisReply *x = reply;
    if (is_error(x) || x->type != REDIS_REPLY_ARRAY) {
        on_dead_read(c, reply, arg); /* says why, and ends it */
        return;
    }
    if (x->elements == 0 || x->element[0]->type != REDIS_REPLY_ARRAY ||
        x->element[0]->elements < 1 || x->element[0]->element[0]->type != REDIS_REPLY_STRING) {
        s->got(s->arg, 0, NULL); /* none */
        return;
    }
    snprintf(s->last, sizeof s->last, "%s", x->element[0]->element[0]->str);
    redis_dead_next(s, s->got, s->arg);
}

static void redis_dead_next(void *ses, void (*got)(void *arg, int rc, struct mq_message *m),
                            void *arg)
{
    struct redis_dead *s = ses;
    char from[52];
    snprintf(from, sizeof from, "%s%s", s->cursor[0] ? "(" : "-", s->cursor);
    const char *argv[] = {"XRANGE", s->r->cfg->dead_letter, from, s->last, "COUNT", "1"};
    const char *last[] = {"XREVRANGE", s->r->cfg->dead_letter, "+", "-", "COUNT", "1"};
    s->got = got;
    s->arg = arg;
    if (s->cursor[0] && strcmp(s->cursor, s->last) == 0) {
        got(arg, 0, NULL); /* up to the last one there at the start */
        return;
    }
    if (!s->r->connected ||
        redisAsyncCommandArgv(s->r->wr, s->last[0] ? on_dead_read : on_dead_last, s, 6,
                              s->last[0] ? argv : last, NULL) != REDIS_OK)
        on_dead_read(NULL, NULL, s);
}

static void on_dead_settled(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_dead *s = arg;
    redisReply *x = reply;
    int rc = -1;
    if (!is_error(x) && x->type == REDIS_REPLY_INTEGER)
        rc = x->integer > 0 ? 1 : 0;
    else
        daemon_log_about(LOG_WARN, LOG_CONSUMER(s->r->cfg->route.name),
                         "consumer %s: redrive: settling a dead letter of %s failed (%s): "
                         "it stays there", s->r->cfg->route.name, s->r->cfg->dead_letter,
                         error_text(c, x));
    s->done(s->arg, rc);
}

static void redis_dead_settle(void *ses, const struct mq_message *m, int requeue, uint64_t base,
                              void (*done)(void *arg, int rc), void *arg)
{
    struct redis_dead *s = ses;
    struct redis_src *r = s->r;
    struct args a;
    char num[24], dropped[24];
    s->done = done;
    s->arg = arg;
    int rc = REDIS_ERR;
    if (r->connected && args_init(&a, 6 + fields_room(m) + 2) == 0) {
        if (requeue) {
            arg_str(&a, "EVAL");
            add_arg(&a, requeue_script, sizeof requeue_script - 1);
            arg_str(&a, "2");
            arg_str(&a, r->cfg->dead_letter);
            arg_str(&a, r->cfg->queue);
            arg_str(&a, m->entry);
            message_fields(&a, r, m, dropped);
            if (base) {
                snprintf(num, sizeof num, "%llu", (unsigned long long)base);
                arg_str(&a, "x-idem-attempt-base");
                arg_str(&a, num);
            }
        } else {
            arg_str(&a, "XDEL");
            arg_str(&a, r->cfg->dead_letter);
            arg_str(&a, m->entry);
        }
        rc = redisAsyncCommandArgv(r->wr, on_dead_settled, s, (int)a.n, a.argv, a.lens);
        free(a.argv);
        free(a.lens);
    }
    if (rc != REDIS_OK)
        on_dead_settled(NULL, NULL, s);
}

static void on_dead_counted(redisAsyncContext *c, void *reply, void *arg)
{
    struct redis_dead *s = arg;
    redisReply *x = reply;
    (void)c;
    long n = !is_error(x) && x->type == REDIS_REPLY_INTEGER ? (long)x->integer : -1;
    void (*left)(void *, long) = s->left;
    void *larg = s->arg;
    free(s);
    if (left)
        left(larg, n);
}

static void redis_dead_close(void *ses, void (*left)(void *arg, long n), void *arg)
{
    struct redis_dead *s = ses;
    s->left = left;
    s->arg = arg;
    const char *argv[] = {"XLEN", s->r->cfg->dead_letter};
    if (!s->r->connected ||
        redisAsyncCommandArgv(s->r->wr, on_dead_counted, s, 2, argv, NULL) != REDIS_OK)
        on_dead_counted(NULL, NULL, s);
}

static void redis_stop(void *src)
{
    struct redis_src *r = src;
    r->stopped = 1;
    event_del(r->dial_ev);
    event_del(r->claim_ev);
}

static void redis_close(void *src)
{
    struct redis_src *r = src;
    r->stopped = 1;
    r->connected = 0;
    /* The acks and dead letters queued last (the loop has ended): out to
     * the socket before the connection goes, or their entries would stay
     * pending until another consumer takes them over. */
    if (r->wr)
        redisAsyncHandleWrite(r->wr);
    close_connections(r);
    event_free(r->dial_ev);
    event_free(r->timeout_ev);
    event_free(r->claim_ev);
    free(r);
}

const struct mq_source_ops mq_redis_ops = {
    .kind = "redis_stream",
    .open = redis_open,
    .want = redis_want,
    .ack = redis_ack,
    .dead_letter = redis_dead_letter,
    .dead_open = redis_dead_open,
    .dead_next = redis_dead_next,
    .dead_settle = redis_dead_settle,
    .dead_close = redis_dead_close,
    .stop = redis_stop,
    .close = redis_close,
};
