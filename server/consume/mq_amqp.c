/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mq_amqp.c — the RabbitMQ source of the consumers (consume.h), on
 * librabbitmq, on the consumer's event loop.
 *
 * Two connections to the broker. The consuming one has channel 1 in
 * basic.consume with basic.qos prefetch, and is read when its socket is
 * readable (and once a second, which also sends its heartbeats): each
 * basic.deliver is a message for the consumer, acked on that channel once
 * the consumer says so — the acks of one turn of the loop together, as
 * one basic.ack with multiple for a run of consecutive tags. The publishing one, in confirm mode, declares the
 * queues and puts dead letters on theirs, each confirmed by the broker
 * (basic.ack) before the original is acked: a dead letter is never lost
 * between the two. Waiting for a confirm on a connection of its own, the
 * consumer reads nothing but that confirm.
 *
 * A queue that exists is used as it is (a passive declare); a missing one
 * is declared durable, classic, without arguments. Nothing is ever
 * redeclared with other arguments.
 *
 * librabbitmq's calls block; they are kept short: the socket is read only
 * when it has data, connecting and each RPC are bounded by 2 s, a confirm
 * by 5 s. The loop is the consumer's own, so a slow broker holds only
 * that consumer.
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "consume/consume.h"
#include "http/http_parser.h"
#include "log.h"
#include "mono.h"

#define CHANNEL 1
#define RPC_TIMEOUT_MS 2000
#define CONFIRM_TIMEOUT_MS 5000
#define HEARTBEAT_S 10
#define PUMP_BATCH 256  /* deliveries read per turn of the loop */
#define RECONNECT_MIN_MS 250
#define RECONNECT_MAX_MS 10000
#define DEAD_HEADERS_MAX 1000 /* a dead letter's headers, at most */

struct amqp_src {
    struct consumer *k;
    struct event_base *base;
    const struct consumer_config *cfg;
    char *url;                 /* a copy amqp_parse_url cut up: info points into it */
    struct amqp_connection_info info;
    amqp_connection_state_t in, out; /* consuming, publishing; NULL: not connected */
    struct event *read_ev, *tick_ev, *dial_ev, *flush_ev;
    /* Acks, sent together at the end of the loop's turn (flush_acks). The
     * broker numbers a channel's deliveries 1, 2, 3 ...: tags first ..
     * first + len - 1 were delivered on this connection and not yet acked
     * as a run; st[t - first] is 0 not acked, 1 acked and not yet sent,
     * 2 sent alone. */
    uint64_t first;
    unsigned char *st;
    size_t len, cap;
    int flush_due;
    int64_t backoff_ms;
    unsigned long failures;    /* connecting, in a row */
    int stopped;
};

static void describe(amqp_rpc_reply_t r, char *out, size_t n)
{
    switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
        snprintf(out, n, "ok");
        return;
    case AMQP_RESPONSE_NONE:
        snprintf(out, n, "no reply from the broker");
        return;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
        snprintf(out, n, "%s", amqp_error_string2(r.library_error));
        return;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
        if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
            const amqp_connection_close_t *m = r.reply.decoded;
            snprintf(out, n, "the broker closed the connection: %u %.*s", m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
            const amqp_channel_close_t *m = r.reply.decoded;
            snprintf(out, n, "the broker closed the channel: %u %.*s", m->reply_code,
                     (int)m->reply_text.len, (const char *)m->reply_text.bytes);
        } else {
            snprintf(out, n, "the broker answered method 0x%08x", r.reply.id);
        }
        return;
    }
    snprintf(out, n, "unknown reply");
}

static int rpc_ok(amqp_connection_state_t c, const char *what, char *err, size_t errlen)
{
    amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    char d[200];
    describe(r, d, sizeof d);
    snprintf(err, errlen, "%.180s: %.200s", what, d);
    return -1;
}

static amqp_connection_state_t dial(struct amqp_src *a, int heartbeat, char *err, size_t errlen)
{
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s = c ? amqp_tcp_socket_new(c) : NULL;
    struct timeval tv = ms_timeval(RPC_TIMEOUT_MS);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        if (c)
            amqp_destroy_connection(c);
        return NULL;
    }
    amqp_set_handshake_timeout(c, &tv);
    amqp_set_rpc_timeout(c, &tv);
    int st = amqp_socket_open_noblock(s, a->info.host, a->info.port, &tv);
    if (st != AMQP_STATUS_OK) {
        snprintf(err, errlen, "%s:%d: %s", a->info.host, a->info.port, amqp_error_string2(st));
        amqp_destroy_connection(c);
        return NULL;
    }
    /* consumer_cancel_notify: a broker that deletes the queue under the
     * consumer says so (basic.cancel), and the connection is made again,
     * the queue with it; without it the consumer would wait on a queue
     * that is gone while its successor fills. */
    amqp_table_entry_t cap = {.key = amqp_cstring_bytes("consumer_cancel_notify"),
                              .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value.boolean = 1}};
    amqp_table_entry_t prop[2] = {
        {.key = amqp_cstring_bytes("capabilities"),
         .value = {.kind = AMQP_FIELD_KIND_TABLE, .value.table = {1, &cap}}},
        {.key = amqp_cstring_bytes("product"),
         .value = {.kind = AMQP_FIELD_KIND_UTF8, .value.bytes = amqp_cstring_bytes("idem")}},
    };
    amqp_table_t props = {2, prop};
    amqp_rpc_reply_t r =
        amqp_login_with_properties(c, a->info.vhost, 0, 131072, heartbeat, &props,
                                   AMQP_SASL_METHOD_PLAIN, a->info.user, a->info.password);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        char d[200];
        describe(r, d, sizeof d);
        snprintf(err, errlen, "logging in to %s:%d vhost %s: %s", a->info.host, a->info.port,
                 a->info.vhost, d);
        amqp_destroy_connection(c);
        return NULL;
    }
    amqp_channel_open(c, CHANNEL);
    if (rpc_ok(c, "opening a channel", err, errlen) != 0) {
        amqp_destroy_connection(c);
        return NULL;
    }
    return c;
}

/* The queue as it is, or declared durable, classic, without arguments
 * when the broker has none of that name. 0, or -1 with err. */
static int ensure_queue(struct amqp_src *a, amqp_connection_state_t c, const char *name,
                        char *err, size_t errlen)
{
    amqp_queue_declare(c, CHANNEL, amqp_cstring_bytes(name), 1, 0, 0, 0, amqp_empty_table);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(c);
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || r.reply.id != AMQP_CHANNEL_CLOSE_METHOD ||
        ((const amqp_channel_close_t *)r.reply.decoded)->reply_code != 404) {
        char d[300];
        describe(r, d, sizeof d);
        snprintf(err, errlen, "queue %s: %s", name, d);
        return -1;
    }
    /* Not found: the broker closed the channel, which is reopened. */
    amqp_channel_close_ok_t ok = {0};
    if (amqp_send_method(c, CHANNEL, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK) {
        snprintf(err, errlen, "queue %s: the connection failed", name);
        return -1;
    }
    amqp_channel_open(c, CHANNEL);
    if (rpc_ok(c, "opening a channel", err, errlen) != 0)
        return -1;
    amqp_queue_declare(c, CHANNEL, amqp_cstring_bytes(name), 0, 1, 0, 0, amqp_empty_table);
    char what[300];
    snprintf(what, sizeof what, "declaring queue %s", name);
    if (rpc_ok(c, what, err, errlen) != 0)
        return -1;
    daemon_log_about(LOG_INFO, LOG_CONSUMER(a->cfg->route.name),
                     "consumer %s: declared queue %s (it did not exist): durable, classic, "
                     "without arguments", a->cfg->route.name, name);
    return 0;
}

/* The publishing connection: the queues made sure of (queue too, at
 * connecting), then confirm mode. NULL with err. */
static amqp_connection_state_t open_publisher(struct amqp_src *a, const char *queue, char *err,
                                              size_t errlen)
{
    amqp_connection_state_t c = dial(a, 0, err, errlen);
    if (c && ((queue && ensure_queue(a, c, queue, err, errlen) != 0) ||
              ensure_queue(a, c, a->cfg->dead_letter, err, errlen) != 0 ||
              (amqp_confirm_select(c, CHANNEL), rpc_ok(c, "confirm mode", err, errlen)) != 0)) {
        amqp_destroy_connection(c);
        c = NULL;
    }
    return c;
}

static void drop_connections(struct amqp_src *a)
{
    a->first = 1; /* a new channel numbers its deliveries from 1 */
    a->len = 0;
    if (a->read_ev) {
        event_free(a->read_ev);
        a->read_ev = NULL;
    }
    if (a->in)
        amqp_destroy_connection(a->in);
    if (a->out)
        amqp_destroy_connection(a->out);
    a->in = a->out = NULL;
}

static void redial_later(struct amqp_src *a)
{
    if (a->stopped)
        return;
    struct timeval tv = ms_timeval(a->backoff_ms);
    a->backoff_ms = a->backoff_ms * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : a->backoff_ms * 2;
    evtimer_add(a->dial_ev, &tv);
}

static void flush_acks(struct amqp_src *a);

/* The connection is of no more use (or the broker ended it). The acks
 * already decided go out first, where the connection still takes them:
 * each one not sent is a message given out again after the reconnect,
 * handled again (a duplicate, or a second dead letter). */
static void lost(struct amqp_src *a, const char *why)
{
    if (a->flush_due && a->in) {
        flush_acks(a); /* clears flush_due first: a failure there comes back once */
        if (!a->in)
            return; /* that failure was handled as the loss, by this function */
    }
    drop_connections(a);
    consumer_connection(a->k, 0, why);
    a->backoff_ms = RECONNECT_MIN_MS;
    redial_later(a);
}

/* ---- deliveries ---- */

static char *dup_bytes(amqp_bytes_t b)
{
    char *s = malloc(b.len + 1);
    if (s) {
        if (b.len)
            memcpy(s, b.bytes, b.len);
        s[b.len] = '\0';
    }
    return s;
}

/* A header's value as text; NULL for a kind not passed on (tables,
 * arrays, decimals, void), or on OOM (*oom set). */
static char *value_text(const amqp_field_value_t *v, int *oom)
{
    char buf[64];
    switch (v->kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES: {
        char *s = dup_bytes(v->value.bytes);
        *oom = !s;
        return s;
    }
    case AMQP_FIELD_KIND_BOOLEAN: snprintf(buf, sizeof buf, "%s", v->value.boolean ? "true" : "false"); break;
    case AMQP_FIELD_KIND_I8: snprintf(buf, sizeof buf, "%d", v->value.i8); break;
    case AMQP_FIELD_KIND_U8: snprintf(buf, sizeof buf, "%u", v->value.u8); break;
    case AMQP_FIELD_KIND_I16: snprintf(buf, sizeof buf, "%d", v->value.i16); break;
    case AMQP_FIELD_KIND_U16: snprintf(buf, sizeof buf, "%u", v->value.u16); break;
    case AMQP_FIELD_KIND_I32: snprintf(buf, sizeof buf, "%d", v->value.i32); break;
    case AMQP_FIELD_KIND_U32: snprintf(buf, sizeof buf, "%u", v->value.u32); break;
    case AMQP_FIELD_KIND_I64: snprintf(buf, sizeof buf, "%lld", (long long)v->value.i64); break;
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_TIMESTAMP:
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)v->value.u64);
        break;
    case AMQP_FIELD_KIND_F32: snprintf(buf, sizeof buf, "%.9g", (double)v->value.f32); break;
    case AMQP_FIELD_KIND_F64: snprintf(buf, sizeof buf, "%.17g", v->value.f64); break;
    default: return NULL;
    }
    char *s = strdup(buf);
    *oom = !s;
    return s;
}

/* A delivery's properties as the consumer's message, which takes body
 * (malloc'd, NUL-terminated): NULL on OOM, body freed. A header or id the
 * handler's request cannot carry marks it bad (dead-lettered). */
static struct mq_message *to_message(struct amqp_src *a, uint64_t tag,
                                     const amqp_basic_properties_t *p, char *body,
                                     size_t body_len)
{
    struct mq_message *m = calloc(1, sizeof *m);
    if (!m) {
        free(body);
        return NULL;
    }
    m->tag = tag;
    m->gen = consumer_gen(a->k);
    m->body_len = body_len;
    m->body = body;
    int oom = 0;
    if (!oom && (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)) {
        oom = !(m->id = dup_bytes(p->message_id));
        if (!oom && (!http_is_field_text(m->id, p->message_id.len) ||
                     strlen(m->id) != p->message_id.len))
            m->bad = "message_id_invalid";
    }
    if (!oom && (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)) {
        oom = !(m->content_type = dup_bytes(p->content_type));
        if (!oom && !http_is_field_text(m->content_type, p->content_type.len))
            m->bad = "header_invalid";
    }
    const amqp_table_t *t = (p->_flags & AMQP_BASIC_HEADERS_FLAG) ? &p->headers : NULL;
    if (!oom && t && t->num_entries > 0 &&
        !(m->headers = calloc((size_t)t->num_entries, sizeof *m->headers)))
        oom = 1;
    for (int i = 0; !oom && t && i < t->num_entries; i++) {
        const amqp_table_entry_t *e = &t->entries[i];
        char *value = value_text(&e->value, &oom);
        if (!value)
            continue; /* a kind not passed on, or OOM */
        int bytes = e->value.kind == AMQP_FIELD_KIND_UTF8 || e->value.kind == AMQP_FIELD_KIND_BYTES;
        size_t vlen = bytes ? e->value.value.bytes.len : strlen(value);
        oom = mq_add_header(m, (const char *)e->key.bytes, e->key.len, value, vlen) != 0;
        free(value);
    }
    if (oom) {
        mq_message_free(m);
        return NULL;
    }
    return m;
}

/* ---- acks ---- */

/* Tag delivered: it gets its place (a tag the broker skipped, which it
 * never does, is taken as acked). 0, or -1 on OOM. */
static int note_delivery(struct amqp_src *a, uint64_t tag)
{
    if (tag < a->first + a->len)
        return 0; /* known already */
    size_t need = (size_t)(tag - a->first + 1);
    if (need > a->cap) {
        size_t cap = a->cap ? a->cap : 256;
        while (cap < need)
            cap *= 2;
        unsigned char *st = realloc(a->st, cap);
        if (!st)
            return -1;
        a->st = st;
        a->cap = cap;
    }
    memset(a->st + a->len, 2, need - a->len - 1);
    a->st[need - 1] = 0;
    a->len = need;
    return 0;
}

/* The acks noted this turn, to the broker: one basic.ack with multiple
 * for the run of tags from first on that are all acked, one alone for
 * each acked past a tag still held. */
static void flush_acks(struct amqp_src *a)
{
    a->flush_due = 0;
    if (!a->in)
        return;
    /* The run's highest tag acked but not yet sent: a multiple ack's own
     * tag must be one the broker still has unacked. */
    size_t run = 0, last = 0;
    while (run < a->len && a->st[run] != 0)
        if (a->st[run++] == 1)
            last = run;
    int st = AMQP_STATUS_OK;
    if (last)
        st = amqp_basic_ack(a->in, CHANNEL, a->first + last - 1, 1);
    if (run) {
        memmove(a->st, a->st + run, a->len - run);
        a->len -= run;
        a->first += run;
    }
    for (size_t i = 0; st == AMQP_STATUS_OK && i < a->len; i++)
        if (a->st[i] == 1) {
            st = amqp_basic_ack(a->in, CHANNEL, a->first + i, 0);
            a->st[i] = 2;
        }
    if (st != AMQP_STATUS_OK) {
        char why[200];
        snprintf(why, sizeof why, "acking: %s", amqp_error_string2(st));
        lost(a, why);
    }
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    flush_acks(arg);
}

/* A frame from connection c, the wait bounded by the RPC timeout: 0, or
 * -1 with why (the connection is then of no more use). */
static int next_frame(amqp_connection_state_t c, amqp_frame_t *f, char *why, size_t n)
{
    struct timeval tv = ms_timeval(RPC_TIMEOUT_MS);
    int st = amqp_simple_wait_frame_noblock(c, f, &tv);
    while (st == AMQP_STATUS_OK && f->frame_type == AMQP_FRAME_HEARTBEAT)
        st = amqp_simple_wait_frame_noblock(c, f, &tv);
    if (st != AMQP_STATUS_OK) {
        snprintf(why, n, "reading a delivery: %s", amqp_error_string2(st));
        return -1;
    }
    if (f->frame_type == AMQP_FRAME_METHOD && (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
                                               f->payload.method.id == AMQP_CONNECTION_CLOSE_METHOD)) {
        amqp_rpc_reply_t x = {.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION,
                              .reply = f->payload.method};
        describe(x, why, n);
        return -1;
    }
    return 0;
}

/* The rest of a message after its basic.deliver or basic.get-ok (its
 * content header and body frames), read as amqp_consume_message() reads
 * it, but with the properties used as decoded rather than copied:
 * librabbitmq refuses to copy a header table with an empty name, which
 * RabbitMQ passes on, and one such message would then look like a broken
 * connection (and be given out again on every reconnect, holding up the
 * queue for good). Read here, it is a message with a bad header:
 * dead-lettered and acked like any other. The message, or NULL with why. */
static struct mq_message *read_message(struct amqp_src *a, amqp_connection_state_t c,
                                       uint64_t tag, char *why, size_t n)
{
    amqp_frame_t f;
    if (next_frame(c, &f, why, n) != 0)
        return NULL;
    if (f.frame_type != AMQP_FRAME_HEADER) {
        snprintf(why, n, "a delivery without its content header (frame type %d)", f.frame_type);
        return NULL;
    }
    /* The properties stay in the channel's pool until the next
     * amqp_maybe_release_buffers(), after the message is made. */
    const amqp_basic_properties_t *p = f.payload.properties.decoded;
    uint64_t size = f.payload.properties.body_size;
    char *body = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!body) {
        snprintf(why, n, "out of memory for a body of %llu bytes", (unsigned long long)size);
        return NULL;
    }
    for (uint64_t got = 0; got < size;) {
        amqp_frame_t bf;
        if (next_frame(c, &bf, why, n) != 0) {
            free(body);
            return NULL;
        }
        if (bf.frame_type != AMQP_FRAME_BODY || bf.payload.body_fragment.len > size - got) {
            snprintf(why, n, "a delivery's body cut short or overlong");
            free(body);
            return NULL;
        }
        memcpy(body + got, bf.payload.body_fragment.bytes, bf.payload.body_fragment.len);
        got += bf.payload.body_fragment.len;
    }
    body[size] = '\0';
    struct mq_message *m = to_message(a, tag, p, body, (size_t)size);
    if (!m)
        snprintf(why, n, "out of memory");
    return m;
}

static int deliver(struct amqp_src *a, const amqp_frame_t *method, char *why, size_t n)
{
    const amqp_basic_deliver_t *d = method->payload.method.decoded;
    uint64_t tag = d->delivery_tag;
    if (note_delivery(a, tag) != 0) {
        snprintf(why, n, "out of memory");
        return -1;
    }
    struct mq_message *m = read_message(a, a->in, tag, why, n);
    if (!m)
        return -1;
    consumer_deliver(a->k, m); /* may ack, and so lose the connection */
    return 0;
}

static void pump(struct amqp_src *a)
{
    char why[300];
    for (int n = 0; a->in && n < PUMP_BATCH; n++) {
        amqp_maybe_release_buffers(a->in);
        struct timeval zero = {0, 0};
        amqp_frame_t f;
        int st = amqp_simple_wait_frame_noblock(a->in, &f, &zero);
        if (st == AMQP_STATUS_TIMEOUT)
            return; /* nothing more to read now */
        if (st != AMQP_STATUS_OK) {
            snprintf(why, sizeof why, "%s", amqp_error_string2(st));
            lost(a, why);
            return;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue; /* heartbeats */
        switch (f.payload.method.id) {
        case AMQP_BASIC_DELIVER_METHOD:
            if (deliver(a, &f, why, sizeof why) != 0) {
                lost(a, why);
                return;
            }
            continue;
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD: {
            /* The broker ends the channel or the connection. */
            amqp_rpc_reply_t x = {.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION,
                                  .reply = f.payload.method};
            describe(x, why, sizeof why);
            lost(a, why);
            return;
        }
        case AMQP_BASIC_CANCEL_METHOD:
            snprintf(why, sizeof why, "the broker cancelled the consumer (was queue %s deleted?)",
                     a->cfg->queue);
            lost(a, why);
            return;
        default:
            continue; /* others are ignored */
        }
    }
    if (a->in) /* more may be waiting: after the loop's other events */
        event_active(a->read_ev, EV_READ, 0);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct amqp_src *a = arg;
    if (!a->stopped)
        pump(a);
}

/* Once a second: heartbeats go out (and a broker gone silent is noticed)
 * whenever librabbitmq is called, which a quiet queue would not do. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct amqp_src *a = arg;
    if (a->in && !a->stopped)
        pump(a);
}

static void on_dial(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    struct amqp_src *a = arg;
    char err[400];
    if (a->stopped || a->in)
        return;
    if ((a->out = open_publisher(a, a->cfg->queue, err, sizeof err)) != NULL)
        a->in = dial(a, HEARTBEAT_S, err, sizeof err);
    if (!a->in)
        goto failed;
    amqp_basic_qos(a->in, CHANNEL, 0, (uint16_t)a->cfg->prefetch, 0);
    if (rpc_ok(a->in, "basic.qos", err, sizeof err) != 0)
        goto failed;
    amqp_basic_consume(a->in, CHANNEL, amqp_cstring_bytes(a->cfg->queue), amqp_empty_bytes, 0, 0,
                       0, amqp_empty_table);
    if (rpc_ok(a->in, "basic.consume", err, sizeof err) != 0)
        goto failed;
    a->read_ev = event_new(a->base, amqp_get_sockfd(a->in), EV_READ | EV_PERSIST, on_readable, a);
    if (!a->read_ev || event_add(a->read_ev, NULL) != 0) {
        snprintf(err, sizeof err, "out of memory");
        goto failed;
    }
    a->failures = 0;
    a->backoff_ms = RECONNECT_MIN_MS;
    char where[400];
    snprintf(where, sizeof where, "%s:%d vhost %s, queue %s", a->info.host, a->info.port,
             a->info.vhost, a->cfg->queue);
    consumer_connection(a->k, 1, where);
    pump(a); /* what arrived with the handshake */
    return;
failed:
    drop_connections(a);
    a->failures++;
    /* The 1st, 2nd, 4th, 8th... failure in a row is logged. */
    if ((a->failures & (a->failures - 1)) == 0)
        daemon_log_about(LOG_WARN, LOG_CONSUMER(a->cfg->route.name),
                         "consumer %s: cannot connect to RabbitMQ (%s; %lu tries so far), trying "
                         "again",
                         a->cfg->route.name, err, a->failures);
    redial_later(a);
}

/* ---- the source ---- */

static void *amqp_open(struct consumer *k, struct event_base *base,
                       const struct consumer_config *cfg, const char *instance)
{
    (void)instance;
    struct amqp_src *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->k = k;
    a->base = base;
    a->cfg = cfg;
    a->backoff_ms = RECONNECT_MIN_MS;
    a->url = strdup(cfg->url);
    amqp_default_connection_info(&a->info);
    if (!a->url || amqp_parse_url(a->url, &a->info) != AMQP_STATUS_OK) {
        if (a->url)
            daemon_log_about(LOG_INFO, LOG_CONSUMER(cfg->route.name),
                             "consumer %s: the amqp URL does not parse", cfg->route.name);
        free(a->url);
        free(a);
        return NULL;
    }
    a->first = 1;
    a->dial_ev = evtimer_new(base, on_dial, a);
    a->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, a);
    a->flush_ev = event_new(base, -1, 0, on_flush, a);
    struct timeval now = {0, 0}, second = {1, 0};
    if (!a->dial_ev || !a->tick_ev || !a->flush_ev || evtimer_add(a->dial_ev, &now) != 0 ||
        event_add(a->tick_ev, &second) != 0) {
        if (a->dial_ev)
            event_free(a->dial_ev);
        if (a->tick_ev)
            event_free(a->tick_ev);
        if (a->flush_ev)
            event_free(a->flush_ev);
        free(a->url);
        free(a);
        return NULL;
    }
    return a;
}

static void amqp_want(void *src, size_t n)
{
    (void)src; /* basic.qos makes the broker send no more than prefetch */
    (void)n;
}

/* Noted, and sent with the others of this turn of the loop (flush_acks):
 * the record is durable already, so a lost connection before the send
 * gives out a message whose redelivery is a duplicate. */
static int amqp_ack(void *src, const struct mq_message *m)
{
    struct amqp_src *a = src;
    if (!a->in || m->tag < a->first || m->tag >= a->first + a->len)
        return -1;
    a->st[m->tag - a->first] = 1;
    if (!a->flush_due) {
        a->flush_due = 1;
        event_active(a->flush_ev, EV_TIMEOUT, 0);
    }
    return 0;
}

static amqp_table_entry_t text_entry(const char *name, const char *value)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(name);
    e.value.kind = AMQP_FIELD_KIND_UTF8;
    e.value.value.bytes = amqp_cstring_bytes(value);
    return e;
}

static amqp_table_entry_t int_entry(const char *name, int32_t value)
{
    amqp_table_entry_t e;
    e.key = amqp_cstring_bytes(name);
    e.value.kind = AMQP_FIELD_KIND_I32;
    e.value.value.i32 = value;
    return e;
}

/* Wait for the broker's confirm of the one publish made: 0 confirmed, 1
 * returned (no queue of that name: not kept), -1 failed. */
static int confirmed(amqp_connection_state_t c)
{
    int returned = 0;
    int64_t deadline = mono_ms() + CONFIRM_TIMEOUT_MS;
    for (;;) {
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            return -1;
        struct timeval tv = ms_timeval(left);
        amqp_frame_t f;
        if (amqp_simple_wait_frame_noblock(c, &f, &tv) != AMQP_STATUS_OK)
            return -1;
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        switch (f.payload.method.id) {
        case AMQP_BASIC_ACK_METHOD:
            return returned;
        case AMQP_BASIC_NACK_METHOD:
            return -1;
        case AMQP_BASIC_RETURN_METHOD: {
            amqp_message_t msg;
            amqp_rpc_reply_t r = amqp_read_message(c, CHANNEL, &msg, 0);
            if (r.reply_type != AMQP_RESPONSE_NORMAL)
                return -1;
            amqp_destroy_message(&msg);
            returned = 1;
            break;
        }
        case AMQP_CHANNEL_CLOSE_METHOD:
        case AMQP_CONNECTION_CLOSE_METHOD:
            return -1;
        }
    }
}

/* Publish m (its body, content type, id and headers, then extra's) to
 * queue on c, persistent, and wait for the broker's confirm: 0
 * confirmed, 1 returned (no such queue), -1 failed. Past DEAD_HEADERS_MAX
 * headers (a message refused for too many), the rest are left out, and
 * the copy says how many: its header frame must fit the broker's frame
 * size. */
static int publish(amqp_connection_state_t c, const char *queue, const struct mq_message *m,
                   const amqp_table_entry_t *extra, size_t nextra)
{
    size_t headers = m->header_count < DEAD_HEADERS_MAX ? m->header_count : DEAD_HEADERS_MAX;
    amqp_table_entry_t *entries = calloc(headers + nextra + 1, sizeof *entries);
    if (!entries)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < headers; i++)
        entries[n++] = text_entry(m->headers[i].name, m->headers[i].value);
    if (headers < m->header_count)
        entries[n++] = int_entry("x-idem-headers-left-out", (int32_t)(m->header_count - headers));
    for (size_t i = 0; i < nextra; i++)
        entries[n++] = extra[i];
    amqp_basic_properties_t p = {0};
    p._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG;
    p.delivery_mode = 2; /* persistent */
    p.headers.num_entries = (int)n;
    p.headers.entries = entries;
    if (m->content_type) {
        p._flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
        p.content_type = amqp_cstring_bytes(m->content_type);
    }
    if (m->id) {
        p._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        p.message_id = amqp_cstring_bytes(m->id);
    }
    amqp_bytes_t body = {m->body_len, m->body};
    int st = amqp_basic_publish(c, CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(queue), 1, 0,
                                &p, body);
    free(entries);
    return st == AMQP_STATUS_OK ? confirmed(c) : -1;
}

static int amqp_dead_letter(void *src, const struct mq_message *m, const char *reason,
                            unsigned attempts, int last_status)
{
    struct amqp_src *a = src;
    char err[400];
    if (!a->in)
        return -1;
    if (!a->out && !(a->out = open_publisher(a, NULL, err, sizeof err))) {
        daemon_log_about(LOG_INFO, LOG_CONSUMER(a->cfg->route.name),
                         "consumer %s: cannot reach RabbitMQ to dead-letter a message: %s",
                         a->cfg->route.name, err);
        return -1;
    }
    amqp_table_entry_t idem[] = {
        text_entry("x-idem-reason", reason),
        int_entry("x-idem-attempts", (int32_t)attempts),
        int_entry("x-idem-last-status", last_status),
        text_entry("x-idem-consumer", a->cfg->route.name),
        text_entry("x-idem-queue", a->cfg->queue),
    };
    int r = publish(a->out, a->cfg->dead_letter, m, idem, sizeof idem / sizeof idem[0]);
    if (r != 0) {
        daemon_log_about(LOG_ERROR, LOG_CONSUMER(a->cfg->route.name),
                         "consumer %s: dead-lettering to %s failed (%s): the message stays "
                         "unacked",
                         a->cfg->route.name, a->cfg->dead_letter,
                         r > 0 ? "no such queue: it is declared again"
                               : "no confirm from the broker");
        amqp_destroy_connection(a->out); /* opened again, the queue with it */
        a->out = NULL;
        return -1;
    }
    return amqp_ack(a, m);
}

/* ---- the redrive's session (consume.h) ----
 *
 * A connection of its own, in confirm mode: as many as the dead letter held
 * at the start are taken, each by basic.get
 * (unacked: no other session gets it meanwhile), a requeue publishes it to
 * the queue and acks it once the broker confirmed the copy. Whatever the
 * session took and did not settle goes back to the dead letter when its
 * connection closes. Each call is librabbitmq's, bounded like the rest,
 * and answers from within. */

struct amqp_dead {
    struct amqp_src *a;
    amqp_connection_state_t c;
    long remaining;      /* on the queue (the start's count, then each get's) */
    size_t unsettled;    /* taken and not settled */
    uint32_t budget;     /* more to take: those on the queue at the start */
};

static void *amqp_dead_open(void *src, char *err, size_t errlen)
{
    struct amqp_src *a = src;
    struct amqp_dead *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->a = a;
    if (!(s->c = open_publisher(a, a->cfg->queue, err, errlen))) {
        free(s);
        return NULL;
    }
    /* Only the dead letters there now: one put back and dead-lettered
     * again meanwhile lands behind them, and is not chased. */
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        s->c, CHANNEL, amqp_cstring_bytes(a->cfg->dead_letter), 1, 0, 0, 0, amqp_empty_table);
    if (rpc_ok(s->c, "counting the dead letters", err, errlen) != 0 || !ok) {
        amqp_destroy_connection(s->c);
        free(s);
        return NULL;
    }
    s->budget = ok->message_count;
    s->remaining = (long)ok->message_count;
    return s;
}

static void amqp_dead_next(void *ses, void (*got)(void *arg, int rc, struct mq_message *m),
                           void *arg)
{
    struct amqp_dead *s = ses;
    struct amqp_src *a = s->a;
    char why[300];
    if (s->budget == 0) {
        got(arg, 0, NULL);
        return;
    }
    amqp_maybe_release_buffers(s->c);
    amqp_rpc_reply_t r =
        amqp_basic_get(s->c, CHANNEL, amqp_cstring_bytes(a->cfg->dead_letter), 0);
    if (r.reply_type == AMQP_RESPONSE_NORMAL && r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) {
        s->remaining = 0;
        got(arg, 0, NULL);
        return;
    }
    struct mq_message *m = NULL;
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        describe(r, why, sizeof why);
    } else if (r.reply.id == AMQP_BASIC_GET_OK_METHOD) {
        const amqp_basic_get_ok_t *ok = r.reply.decoded;
        s->remaining = (long)ok->message_count;
        m = read_message(a, s->c, ok->delivery_tag, why, sizeof why);
        if (m && mq_dead_unwrap(m) != 0) {
            mq_message_free(m);
            m = NULL;
            snprintf(why, sizeof why, "out of memory");
        }
    } else {
        snprintf(why, sizeof why, "the broker answered method 0x%08x", r.reply.id);
    }
    if (!m) {
        daemon_log_about(LOG_WARN, LOG_CONSUMER(a->cfg->route.name),
                         "consumer %s: redrive: taking a dead letter from %s: %s",
                         a->cfg->route.name, a->cfg->dead_letter, why);
        got(arg, -1, NULL);
        return;
    }
    s->unsettled++;
    s->budget--;
    got(arg, 0, m);
}

static void amqp_dead_settle(void *ses, const struct mq_message *m, int requeue, uint64_t base,
                             void (*done)(void *arg, int rc), void *arg)
{
    struct amqp_dead *s = ses;
    char num[24];
    snprintf(num, sizeof num, "%llu", (unsigned long long)base);
    amqp_table_entry_t extra = text_entry("x-idem-attempt-base", num);
    if ((!requeue || publish(s->c, s->a->cfg->queue, m, &extra, base ? 1 : 0) == 0) &&
        amqp_basic_ack(s->c, CHANNEL, m->tag, 0) == AMQP_STATUS_OK) {
        s->unsettled--;
        done(arg, 1);
        return;
    }
    daemon_log_about(LOG_WARN, LOG_CONSUMER(s->a->cfg->route.name),
                     "consumer %s: redrive: %s a dead letter failed: it stays on %s",
                     s->a->cfg->route.name, requeue ? "putting back" : "taking off",
                     s->a->cfg->dead_letter);
    done(arg, -1);
}

static void amqp_dead_close(void *ses, void (*left)(void *arg, long n), void *arg)
{
    struct amqp_dead *s = ses;
    long n = s->remaining + (long)s->unsettled;
    amqp_connection_close(s->c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(s->c);
    free(s);
    if (left)
        left(arg, n);
}

static void amqp_stop(void *src)
{
    struct amqp_src *a = src;
    a->stopped = 1;
    /* Nothing more is read: what the broker sent and nobody took goes back
     * to the queue when the connection closes. */
    if (a->read_ev)
        event_del(a->read_ev);
    event_del(a->tick_ev);
    event_del(a->dial_ev);
}

static void amqp_close(void *src)
{
    struct amqp_src *a = src;
    a->stopped = 1;
    flush_acks(a); /* those of the loop's last turn */
    if (a->in)
        amqp_connection_close(a->in, AMQP_REPLY_SUCCESS);
    if (a->out)
        amqp_connection_close(a->out, AMQP_REPLY_SUCCESS);
    drop_connections(a);
    event_free(a->dial_ev);
    event_free(a->tick_ev);
    event_free(a->flush_ev);
    free(a->st);
    free(a->url);
    free(a);
}

const struct mq_source_ops mq_amqp_ops = {
    .kind = "amqp",
    .open = amqp_open,
    .want = amqp_want,
    .ack = amqp_ack,
    .dead_letter = amqp_dead_letter,
    .dead_open = amqp_dead_open,
    .dead_next = amqp_dead_next,
    .dead_settle = amqp_dead_settle,
    .dead_close = amqp_dead_close,
    .stop = amqp_stop,
    .close = amqp_close,
};
