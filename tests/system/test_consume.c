/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_consume.c — idem's consumers against a real RabbitMQ and a real
 * Redis (their streams), with the example refund service as the handler:
 * every message's key executed once, whatever the duplicates, the kills
 * and the restarts; poison messages and bad input on the dead letter with
 * their reason; a route and a consumer of one space executing a key once.
 *
 *   test_consume IDEM REFUND_SERVICE SERVICES_SH STATE_DIR RABBIT_STATE_DIR
 *                AMQP_URL REDIS_URL POSTGRES_URL
 *
 * The refund service counts executions (every POST /refunds it starts
 * working on) and keeps one row per refund_no (UNIQUE): executions == rows
 * means no key was sent to it twice; rows == keys means none was lost.
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <hiredis/hiredis.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

static const char *idem_bin, *service_bin, *services_sh, *state_dir, *rabbit_dir;
static const char *amqp_url, *redis_url, *pg_url;
static char *dir;
static struct proc service;
static int seq;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- the brokers, as a test sees them ---- */

struct header {
    const char *name, *value;
};

/* A queue (AMQP) or a stream (Redis) and its dead letter. */
struct bus {
    int redis;          /* 0: RabbitMQ */
    char queue[64], dead[80];
    amqp_connection_state_t amqp;
    redisContext *rc;
};

static amqp_connection_state_t amqp_open(void)
{
    struct amqp_connection_info info;
    char *url = strdup(amqp_url);
    assert_int_equal(amqp_parse_url(url, &info), AMQP_STATUS_OK);
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s = amqp_tcp_socket_new(c);
    assert_int_equal(amqp_socket_open(s, info.host, info.port), AMQP_STATUS_OK);
    amqp_rpc_reply_t r = amqp_login(c, info.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN,
                                    info.user, info.password);
    assert_int_equal(r.reply_type, AMQP_RESPONSE_NORMAL);
    amqp_channel_open(c, 1);
    assert_int_equal(amqp_get_rpc_reply(c).reply_type, AMQP_RESPONSE_NORMAL);
    free(url);
    return c;
}

static void bus_open(struct bus *b, int redis, const char *tag)
{
    memset(b, 0, sizeof *b);
    b->redis = redis;
    snprintf(b->queue, sizeof b->queue, "t.%s.%d.%d", tag, (int)getpid(), ++seq);
    snprintf(b->dead, sizeof b->dead, "%s.dead", b->queue);
    if (redis) {
        char host[64] = "127.0.0.1";
        int port = 6379;
        sscanf(redis_url, "redis://%63[^:]:%d", host, &port);
        b->rc = redisConnect(host, port);
        assert_true(b->rc && !b->rc->err);
        return;
    }
    b->amqp = amqp_open();
    /* Declared by the test, as an application would, with an argument of
     * its own: idem uses it as it is (declaring it without the argument
     * would fail: PRECONDITION_FAILED). Its dead letter idem declares. */
    amqp_table_entry_t ttl = {.key = amqp_cstring_bytes("x-message-ttl"),
                              .value = {.kind = AMQP_FIELD_KIND_I32, .value.i32 = 3600000}};
    amqp_table_t args = {.num_entries = 1, .entries = &ttl};
    amqp_queue_declare(b->amqp, 1, amqp_cstring_bytes(b->queue), 0, 1, 0, 0, args);
    assert_int_equal(amqp_get_rpc_reply(b->amqp).reply_type, AMQP_RESPONSE_NORMAL);
}

static void bus_close(struct bus *b)
{
    if (b->rc)
        redisFree(b->rc);
    if (b->amqp) {
        amqp_connection_close(b->amqp, AMQP_REPLY_SUCCESS);
        amqp_destroy_connection(b->amqp);
    }
}

static void bus_reconnect(struct bus *b)
{
    if (b->redis)
        return;
    amqp_destroy_connection(b->amqp);
    b->amqp = amqp_open();
}

/* Publish body with headers (NULL-terminated by a NULL name) and, for
 * RabbitMQ, message id (may be NULL). */
static void publish(struct bus *b, const char *body, const struct header *h, const char *id)
{
    size_t n = 0;
    while (h && h[n].name)
        n++;
    if (b->redis) {
        const char *argv[64];
        size_t lens[64], i = 0;
        argv[i++] = "XADD";
        argv[i++] = b->queue;
        argv[i++] = "*";
        argv[i++] = "body";
        argv[i++] = body;
        if (id) {
            argv[i++] = "message_id";
            argv[i++] = id;
        }
        for (size_t k = 0; k < n && i < 62; k++) {
            argv[i++] = h[k].name;
            argv[i++] = h[k].value;
        }
        for (size_t k = 0; k < i; k++)
            lens[k] = strlen(argv[k]);
        redisReply *x = redisCommandArgv(b->rc, (int)i, argv, lens);
        assert_true(x && x->type == REDIS_REPLY_STRING);
        freeReplyObject(x);
        return;
    }
    amqp_table_entry_t e[16];
    for (size_t k = 0; k < n && k < 16; k++) {
        e[k].key = amqp_cstring_bytes(h[k].name);
        e[k].value.kind = AMQP_FIELD_KIND_UTF8;
        e[k].value.value.bytes = amqp_cstring_bytes(h[k].value);
    }
    amqp_basic_properties_t p = {0};
    p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_CONTENT_TYPE_FLAG;
    p.delivery_mode = 2;
    p.content_type = amqp_cstring_bytes("application/json");
    if (n) {
        p._flags |= AMQP_BASIC_HEADERS_FLAG;
        p.headers.num_entries = (int)n;
        p.headers.entries = e;
    }
    if (id) {
        p._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
        p.message_id = amqp_cstring_bytes(id);
    }
    assert_int_equal(amqp_basic_publish(b->amqp, 1, amqp_empty_bytes,
                                        amqp_cstring_bytes(b->queue), 0, 0, &p,
                                        amqp_cstring_bytes(body)),
                     AMQP_STATUS_OK);
}

/* Messages waiting in name (ready, not given out), -1 if it does not exist. */
static long amqp_depth(struct bus *b, const char *name)
{
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(b->amqp, 1, amqp_cstring_bytes(name), 1,
                                                     0, 0, 0, amqp_empty_table);
    amqp_rpc_reply_t r = amqp_get_rpc_reply(b->amqp);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        bus_reconnect(b); /* the broker closed the channel (404) */
        return -1;
    }
    return (long)ok->message_count;
}

static long long redis_int(struct bus *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *x = redisvCommand(b->rc, fmt, ap);
    va_end(ap);
    long long v = x && x->type == REDIS_REPLY_INTEGER ? x->integer : -1;
    freeReplyObject(x);
    return v;
}

/* Messages on the dead letter. */
static long dead_count(struct bus *b)
{
    if (b->redis)
        return (long)redis_int(b, "XLEN %s", b->dead);
    long n = amqp_depth(b, b->dead);
    return n < 0 ? 0 : n;
}

/* Nothing left unacked or unread: the queue empty (RabbitMQ gives back an
 * unacked message when its consumer's connection closes, so call this with
 * idem stopped), or no entry pending in the group and every entry read. */
static int all_acked(struct bus *b)
{
    if (!b->redis)
        return amqp_depth(b, b->queue) == 0;
    redisReply *x = redisCommand(b->rc, "XPENDING %s idem", b->queue);
    int ok = x && x->type == REDIS_REPLY_ARRAY && x->elements >= 1 &&
             x->element[0]->type == REDIS_REPLY_INTEGER && x->element[0]->integer == 0;
    freeReplyObject(x);
    return ok;
}

/* A dead letter: its body and the value of one header of it. */
struct dead {
    char body[512];
    char reason[64], attempts[16], last_status[16], fail[16];
    char forged[16]; /* an Idem_Message_Id header, which idem never passes on */
};

/* The field of d a dead letter's header (or field) name fills, if any. */
static void dead_field(struct dead *d, const char *name, const char *value, size_t len)
{
    struct {
        const char *name;
        char *to;
        size_t cap;
    } f[] = {
        {"body", d->body, sizeof d->body},
        {"x-idem-reason", d->reason, sizeof d->reason},
        {"x-idem-attempts", d->attempts, sizeof d->attempts},
        {"x-idem-last-status", d->last_status, sizeof d->last_status},
        {"X-Fail", d->fail, sizeof d->fail},
        {"Idem_Message_Id", d->forged, sizeof d->forged},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!strcmp(name, f[i].name))
            snprintf(f[i].to, f[i].cap, "%.*s", (int)len, value);
}

/* Take every dead letter (at most cap). */
static size_t take_dead(struct bus *b, struct dead *d, size_t cap)
{
    size_t n = 0;
    memset(d, 0, cap * sizeof *d);
    if (b->redis) {
        redisReply *x = redisCommand(b->rc, "XRANGE %s - +", b->dead);
        for (size_t i = 0; x && x->type == REDIS_REPLY_ARRAY && i < x->elements && n < cap; i++) {
            redisReply *f = x->element[i]->element[1];
            for (size_t j = 0; j + 1 < f->elements; j += 2)
                dead_field(&d[n], f->element[j]->str, f->element[j + 1]->str,
                           f->element[j + 1]->len);
            n++;
        }
        freeReplyObject(x);
        redis_int(b, "DEL %s", b->dead);
        return n;
    }
    for (; n < cap; n++) {
        amqp_rpc_reply_t r = amqp_basic_get(b->amqp, 1, amqp_cstring_bytes(b->dead), 1);
        assert_int_equal(r.reply_type, AMQP_RESPONSE_NORMAL);
        if (r.reply.id != AMQP_BASIC_GET_OK_METHOD)
            break;
        amqp_message_t m;
        assert_int_equal(amqp_read_message(b->amqp, 1, &m, 0).reply_type, AMQP_RESPONSE_NORMAL);
        dead_field(&d[n], "body", m.body.bytes, m.body.len);
        const amqp_table_t *t = &m.properties.headers;
        for (int i = 0; (m.properties._flags & AMQP_BASIC_HEADERS_FLAG) && i < t->num_entries;
             i++) {
            const amqp_table_entry_t *e = &t->entries[i];
            char key[64], value[64];
            snprintf(key, sizeof key, "%.*s", (int)e->key.len, (const char *)e->key.bytes);
            if (e->value.kind == AMQP_FIELD_KIND_I32)
                snprintf(value, sizeof value, "%d", e->value.value.i32);
            else if (e->value.kind == AMQP_FIELD_KIND_UTF8)
                snprintf(value, sizeof value, "%.*s", (int)e->value.value.bytes.len,
                         (const char *)e->value.value.bytes.bytes);
            else
                continue;
            dead_field(&d[n], key, value, strlen(value));
        }
        amqp_destroy_message(&m);
    }
    return n;
}

/* ---- idem ---- */

/* The source: lines of a consumer's mapping for b. */
static void source_yaml(const struct bus *b, char *out, size_t cap, int prefetch)
{
    if (b->redis)
        snprintf(out, cap,
                 "    source: { redis_stream: \"%s\", stream: %s, group: idem, prefetch: %d }\n",
                 redis_url, b->queue, prefetch);
    else
        snprintf(out, cap, "    source: { amqp: \"%s\", queue: %s, prefetch: %d }\n", amqp_url,
                 b->queue, prefetch);
}

/* Write a configuration: the store (distributed or a file in dir), an
 * admin listener, then body, where @UP@ becomes the refund service. */
/* More of the limits mapping for the configurations written next (", k: v"). */
static const char *limits_extra = "";

static void write_config(char *path, size_t cap, int distributed, const char *body)
{
    char text[16384], *o = text;
    snprintf(path, cap, "%s/idem-%d.yaml", dir, ++seq);
    if (distributed)
        o += sprintf(o, "storage:\n  kind: distributed\n  redis: %s\n  postgres: %s\n", redis_url,
                     pg_url);
    else
        o += sprintf(o, "storage: { path: %s/idem-%d.db }\n", dir, seq);
    o += sprintf(o, SYS_ADMIN_YAML "limits: { shutdown_timeout: 3s%s }\n", limits_extra);
    for (const char *s = body; *s;) {
        if (strncmp(s, "@UP@", 4) == 0) {
            o += sprintf(o, "http://127.0.0.1:%d", service.port);
            s += 4;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    sys_write_file(path, text);
}

/* The configuration of the consumer most tests run: "refunds", b's queue
 * or stream (prefetch) into the refund service's POST /refunds, keyed by
 * refund_no, with the lines extra of its own; on the distributed store or
 * a file of its own. */
static void refunds_config(const struct bus *b, int prefetch, int distributed, const char *extra,
                           char *path, size_t cap)
{
    char src[512], cfg[2048];
    source_yaml(b, src, sizeof src, prefetch);
    snprintf(cfg, sizeof cfg,
             "consumers:\n  - name: refunds\n%s"
             "    key: { json: refund_no }\n    handler: @UP@/refunds\n%s",
             src, extra);
    write_config(path, cap, distributed, cfg);
}

static void start(struct proc *p, const char *cmd, const char *path)
{
    char log[4200];
    snprintf(log, sizeof log, "%s.%d.log", path, ++seq);
    char *argv[] = {(char *)idem_bin, (char *)cmd, "-c", (char *)path, NULL};
    char *serve[] = {(char *)idem_bin, (char *)cmd, "-c", (char *)path, "--listen", "127.0.0.1:0",
                     NULL};
    sys_start(p, strcmp(cmd, "serve") == 0 ? serve : argv, log);
}

/* A counter of idem's /metrics: name{consumer="c"}. */
static long metric(const struct proc *p, const char *name, const char *consumer)
{
    struct sys_resp r;
    sys_admin_http(p->admin_port, "GET", "/metrics", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    char want[200];
    snprintf(want, sizeof want, "%s{consumer=\"%s\"} ", name, consumer);
    const char *at = strstr(r.m->body, want);
    long v = at ? strtol(at + strlen(want), NULL, 10) : -1;
    sys_resp_free(&r);
    return v;
}

static long rows(void)
{
    return sys_stat(service.port, "refunds");
}

static long executions(void)
{
    return sys_stat(service.port, "executions");
}

/* Wait (up to ms) until the service holds want rows; the count. */
static long wait_rows(long want, int ms)
{
    long long deadline = test_mono_ms() + ms;
    long n;
    while ((n = rows()) < want && test_mono_ms() < deadline)
        sleep_ms(50);
    return n;
}

static long wait_dead(struct bus *b, long want, int ms)
{
    long long deadline = test_mono_ms() + ms;
    long n;
    while ((n = dead_count(b)) < want && test_mono_ms() < deadline)
        sleep_ms(50);
    return n;
}

/* ---- the tests ---- */

/* 1,000 keys, each published 3 times and interleaved, consumed by two idem
 * consume processes sharing one distributed store: each key executed once,
 * every message acked, two of every three counted as duplicates. */
static void duplicates_two_instances(int redis)
{
    struct bus b;
    char src[512], path[4200], body[256];
    bus_open(&b, redis, "dup");
    source_yaml(&b, src, sizeof src, 64);
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "consumers:\n  - name: refunds\n%s"
             "    key: { json: refund_no }\n    handler: @UP@/refunds\n    lease: 5s\n",
             src);
    write_config(path, sizeof path, 1, cfg);
    struct proc a, c;
    start(&a, "consume", path);
    start(&c, "consume", path);
    long before = executions(), before_rows = rows();
    /* Each pass publishes every key once, in its own order. */
    int order[1000];
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < 1000; i++)
            order[i] = i;
        for (int i = 999; i > 0; i--) {
            int j = rand() % (i + 1), t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int i = 0; i < 1000; i++) {
            snprintf(body, sizeof body, "{\"refund_no\":\"D%d-%d\",\"amount\":\"1.00\"}", seq,
                     order[i]);
            publish(&b, body, NULL, NULL);
        }
    }
    assert_int_equal(wait_rows(before_rows + 1000, 60000) - before_rows, 1000);
    long long deadline = test_mono_ms() + 30000;
    long got = 0;
    while (test_mono_ms() < deadline &&
           (got = metric(&a, "idem_consumer_received_total", "refunds") +
                  metric(&c, "idem_consumer_received_total", "refunds")) < 3000)
        sleep_ms(50);
    assert_int_equal(got, 3000);
    while (test_mono_ms() < deadline && (metric(&a, "idem_consumer_in_flight", "refunds") ||
                                         metric(&c, "idem_consumer_in_flight", "refunds")))
        sleep_ms(50);
    long dups = metric(&a, "idem_consumer_duplicates_total", "refunds") +
                metric(&c, "idem_consumer_duplicates_total", "refunds");
    long done = metric(&a, "idem_consumer_executed_total", "refunds") +
                metric(&c, "idem_consumer_executed_total", "refunds");
    /* No broker connection was lost (an ack the broker refused closes
     * the channel). */
    assert_int_equal(metric(&a, "idem_consumer_reconnects_total", "refunds"), 0);
    assert_int_equal(metric(&c, "idem_consumer_reconnects_total", "refunds"), 0);
    /* Both instances took part. */
    assert_true(metric(&a, "idem_consumer_received_total", "refunds") > 0);
    assert_true(metric(&c, "idem_consumer_received_total", "refunds") > 0);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&c, SIGTERM), 0);
    assert_int_equal(executions() - before, 1000); /* each key sent to the handler once */
    assert_int_equal(rows() - before_rows, 1000);
    assert_int_equal(done, 1000);
    assert_int_equal(dups, 2000);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_duplicates_two_instances(void **state)
{
    (void)state;
    duplicates_two_instances(0);
}

static void test_redis_duplicates_two_instances(void **state)
{
    (void)state;
    duplicates_two_instances(1);
}

struct storm {
    int port;
    const char *key;
    int status[50];
};

static void one_post(void *arg, int i)
{
    struct storm *s = arg;
    char body[128];
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\",\"amount\":\"1.00\"}", s->key);
    struct sys_resp r;
    const char *h[] = {"Content-Type: application/json", NULL};
    sys_http(s->port, "POST", "/refunds", h, body, 10000, &r);
    s->status[i] = r.status;
    sys_resp_free(&r);
}

struct pub_arg {
    struct bus *b;
    const char *key;
};

static void *publish_50(void *arg)
{
    struct pub_arg *p = arg;
    char body[128];
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\",\"amount\":\"1.00\"}", p->key);
    for (int i = 0; i < 50; i++)
        publish(p->b, body, NULL, NULL);
    return NULL;
}

/* A route (the payment's callback, POST /refunds) and consumer refund-mq
 * (b's queue or stream, prefetch) sharing space refund, both keyed and
 * fingerprinted alike; the consumer's lines extra of its own. */
static void shared_space_config(const struct bus *b, int prefetch, const char *extra,
                                char *path, size_t cap)
{
    char src[512], cfg[2048];
    source_yaml(b, src, sizeof src, prefetch);
    snprintf(cfg, sizeof cfg,
             "routes:\n  - name: refund-callback\n    match: { method: POST, path: /refunds }\n"
             "    upstream: @UP@\n    key: { json: refund_no }\n    space: refund\n"
             "    fingerprint: [refund_no, amount]\n"
             "consumers:\n  - name: refund-mq\n%s"
             "    key: { json: refund_no }\n    space: refund\n    handler: @UP@/refunds\n"
             "    fingerprint: [refund_no, amount]\n%s",
             src, extra);
    write_config(path, cap, 0, cfg);
}

/* POST body to the route refund-callback (shared_space_config) of the
 * idem on port: executed there, 201. */
static void post_refund(int port, const char *body)
{
    struct sys_resp r;
    const char *h[] = {"Content-Type: application/json", NULL};
    sys_http(port, "POST", "/refunds", h, body, 10000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
}

/* A payment's result by its HTTP callback (a route) and by the MQ (a
 * consumer) in one space: 50 of each at once, one execution. */
static void route_and_consumer(int redis)
{
    struct bus b;
    char path[4200], key[64];
    bus_open(&b, redis, "both");
    shared_space_config(&b, 64, "", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    snprintf(key, sizeof key, "BOTH-%d", seq);
    long before = executions();
    struct storm s = {.port = p.port, .key = key};
    struct pub_arg pa = {&b, key};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, publish_50, &pa), 0);
    test_run_threads(50, one_post, &s);
    pthread_join(t, NULL);
    for (int i = 0; i < 50; i++)
        if (s.status[i] != 201 && s.status[i] != 409)
            fail_msg("POST %d answered %d (201 or 409 expected)", i, s.status[i]);
    long long deadline = test_mono_ms() + 20000;
    while (test_mono_ms() < deadline &&
           (metric(&p, "idem_consumer_received_total", "refund-mq") < 50 ||
            metric(&p, "idem_consumer_in_flight", "refund-mq") > 0))
        sleep_ms(50);
    assert_int_equal(metric(&p, "idem_consumer_received_total", "refund-mq"), 50);
    assert_int_equal(metric(&p, "idem_consumer_in_flight", "refund-mq"), 0);
    struct sys_resp hr;
    sys_admin_http(p.admin_port, "GET", "/_idem/v1/health", NULL, 5000, &hr);
    assert_int_equal(hr.status, 200);
    json_t *health = json_loadb(hr.m->body, hr.m->body_len, 0, NULL);
    const char *state = json_string_value(
        json_object_get(json_object_get(health, "consumers"), "refund-mq"));
    assert_non_null(state);
    assert_string_equal(state, "connected");
    json_decref(health);
    sys_resp_free(&hr);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    /* The access log (stderr): each message and request has its line. */
    char *log = sys_read_file(p.log);
    size_t messages = 0, requests = 0;
    for (const char *at = log; (at = strstr(at, "\"kind\":\"message\"")) != NULL; at++)
        messages++;
    for (const char *at = log; (at = strstr(at, "\"kind\":\"http\"")) != NULL; at++)
        requests++;
    assert_true(messages >= 50); /* 50 taken, some held and taken again */
    assert_int_equal(requests, 50); /* the posts (the admin listener's are not logged) */
    assert_non_null(strstr(log, "\"action\":\"acked\""));
    free(log);
    assert_int_equal(executions() - before, 1);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_route_and_consumer_one_execution(void **state)
{
    (void)state;
    route_and_consumer(0);
}

static void test_redis_route_and_consumer_one_execution(void **state)
{
    (void)state;
    route_and_consumer(1);
}

/* A key whose consumer gave up (its handler failed every attempt: dead
 * letter attempts_exhausted) does not hold up the other channels of its
 * space: the payment's callback, a route, executes it once the handler is
 * well, instead of being answered the consumer's 500 for good. The
 * message delivered again is still past its attempts: dead letter, not
 * sent. */
static void dead_letter_leaves_key_open(int redis)
{
    enum { KEYS = 5 };
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "open");
    shared_space_config(&b, 8, "    max_attempts: 2\n    retry_backoff: [100ms]\n", path,
                        sizeof path);
    struct proc p;
    start(&p, "serve", path);
    const struct header fail[] = {{"X-Fail", "500"}, {NULL, NULL}};
    int first = seq;
    for (int i = 0; i < KEYS; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"OPEN-%d-%d\",\"amount\":\"1.00\"}", first,
                 i);
        publish(&b, body, fail, NULL);
    }
    assert_int_equal(wait_dead(&b, KEYS, 15000), KEYS);
    struct dead d[KEYS + 1];
    assert_int_equal(take_dead(&b, d, KEYS + 1), KEYS);
    for (int i = 0; i < KEYS; i++) {
        assert_string_equal(d[i].reason, "attempts_exhausted");
        assert_string_equal(d[i].attempts, "2");
        assert_string_equal(d[i].last_status, "500");
    }
    long before = rows();
    for (int i = 0; i < KEYS; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"OPEN-%d-%d\",\"amount\":\"1.00\"}", first,
                 i);
        post_refund(p.port, body); /* executed, not the consumer's 500 replayed */
    }
    assert_int_equal(rows() - before, KEYS);
    /* Delivered again: past its attempts, and now done by the route. */
    publish(&b, body, fail, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline &&
           metric(&p, "idem_consumer_duplicates_total", "refund-mq") < 1)
        sleep_ms(50);
    assert_int_equal(metric(&p, "idem_consumer_duplicates_total", "refund-mq"), 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(rows() - before, KEYS);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_dead_letter_leaves_key_open(void **state)
{
    (void)state;
    dead_letter_leaves_key_open(0);
}

static void test_redis_dead_letter_leaves_key_open(void **state)
{
    (void)state;
    dead_letter_leaves_key_open(1);
}

/* Two redrives at once, on the admin listener: each answer's tally. */
struct redrive_pair {
    int admin_port;
    const char *consumer; /* NULL: refund-mq */
    int status[2];
    json_t *answer[2];
};

/* On a thread of its own: nothing asserted here (cmocka's checks belong
 * to the test's thread), the answer kept for it. */
static void one_redrive(void *arg, int i)
{
    struct redrive_pair *rp = arg;
    struct sys_resp r;
    char target[128];
    snprintf(target, sizeof target, "/_idem/v1/consumers/%s/redrive",
             rp->consumer ? rp->consumer : "refund-mq");
    sys_admin_http(rp->admin_port, "POST", target, "{}", 30000, &r);
    rp->status[i] = r.status;
    if (r.m)
        rp->answer[i] = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    sys_resp_free(&r);
}

static long long member(const json_t *j, const char *name)
{
    return json_integer_value(json_object_get(j, name));
}

/* Run the shell command cmd (stderr with stdout): its exit status, and
 * what it printed into out (cap bytes). */
static int run_cli(const char *cmd, char *out, size_t cap)
{
    char line[10000];
    snprintf(line, sizeof line, "%s 2>&1", cmd);
    FILE *f = popen(line, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, cap - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* 20 keys dead-lettered (their handler refused every attempt), 5 of them
 * then executed through the route sharing the space; a redrive with the
 * handler still down takes the 5 off as done and gets the 15 their
 * attempts afresh (dead-lettered again after 2 more); the handler fixed,
 * two redrives at once: the 15 executed once each, the dead letter
 * empty. */
static void redrive(int redis)
{
    enum { KEYS = 20, BY_ROUTE = 5 };
    struct bus b;
    char path[4200], fixed[4300], body[128];
    bus_open(&b, redis, "redrive");
    shared_space_config(&b, 8, "    max_attempts: 2\n    retry_backoff: [100ms]\n", path,
                        sizeof path);
    /* The handler down: its port refuses. */
    char *text = sys_read_file(path), *at;
    char up[64];
    snprintf(up, sizeof up, "http://127.0.0.1:%d/refunds", service.port);
    assert_non_null(at = strstr(strstr(text, "refund-mq"), up));
    char broken[16384];
    snprintf(broken, sizeof broken, "%.*shttp://127.0.0.1:1/refunds%s", (int)(at - text), text,
             at + strlen(up));
    snprintf(fixed, sizeof fixed, "%s.fixed", path);
    sys_write_file(fixed, text);
    sys_write_file(path, broken);
    free(text);
    struct proc p;
    start(&p, "serve", path);
    int first = seq;
    for (int i = 0; i < KEYS; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"RD-%d-%d\",\"amount\":\"1.00\"}", first, i);
        publish(&b, body, NULL, NULL);
    }
    assert_int_equal(wait_dead(&b, KEYS, 20000), KEYS);
    long before = rows(), ran = executions();
    for (int i = 0; i < BY_ROUTE; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"RD-%d-%d\",\"amount\":\"1.00\"}", first, i);
        post_refund(p.port, body);
    }
    /* Redriven with the handler still down: the 5 done are taken off, the
     * 15 go back and are dead-lettered again after 2 attempts of their
     * own (their count afresh), and the redrive does not chase them. */
    struct sys_resp r;
    sys_admin_http(p.admin_port, "POST", "/_idem/v1/consumers/refund-mq/redrive", "{}", 30000,
                   &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    assert_int_equal(member(j, "moved"), KEYS - BY_ROUTE);
    assert_int_equal(member(j, "done"), BY_ROUTE);
    json_decref(j);
    sys_resp_free(&r);
    long long deadline = test_mono_ms() + 20000;
    while (test_mono_ms() < deadline &&
           (dead_count(&b) < KEYS - BY_ROUTE ||
            metric(&p, "idem_consumer_dead_lettered_total", "refund-mq") < 2 * KEYS - BY_ROUTE))
        sleep_ms(50);
    assert_int_equal(dead_count(&b), KEYS - BY_ROUTE);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    if (redis) { /* the dead letters, read where they are */
        struct dead d[KEYS];
        redisReply *x = redisCommand(b.rc, "XRANGE %s - +", b.dead);
        assert_int_equal(x->elements, KEYS - BY_ROUTE);
        for (size_t i = 0; i < x->elements; i++) {
            redisReply *f = x->element[i]->element[1];
            memset(&d[i], 0, sizeof d[i]);
            for (size_t k = 0; k + 1 < f->elements; k += 2)
                dead_field(&d[i], f->element[k]->str, f->element[k + 1]->str,
                           f->element[k + 1]->len);
            assert_string_equal(d[i].reason, "attempts_exhausted");
            assert_string_equal(d[i].attempts, "2");
        }
        freeReplyObject(x);
    }
    start(&p, "serve", fixed); /* the same store, the handler well */
    struct redrive_pair rp = {.admin_port = p.admin_port};
    test_run_threads(2, one_redrive, &rp);
    long long moved = 0, done = 0;
    for (int i = 0; i < 2; i++) {
        if (rp.status[i] != 200 || !rp.answer[i])
            fail_msg("redrive %d at once: %d %s", i, rp.status[i],
                     rp.answer[i] ? json_dumps(rp.answer[i], 0) : "");
        assert_non_null(rp.answer[i]);
        assert_true(json_is_true(json_object_get(rp.answer[i], "complete")));
        moved += member(rp.answer[i], "moved");
        done += member(rp.answer[i], "done");
        json_decref(rp.answer[i]);
    }
    assert_int_equal(moved, KEYS - BY_ROUTE);
    assert_int_equal(done, 0);
    assert_int_equal(wait_rows(before + KEYS, 20000), before + KEYS);
    deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline && metric(&p, "idem_consumer_in_flight", "refund-mq") > 0)
        sleep_ms(50);
    /* A second look finds nothing to do. */
    sys_admin_http(p.admin_port, "POST", "/_idem/v1/consumers/refund-mq/redrive",
                   "{\"limit\": 5}", 30000, &r);
    assert_int_equal(r.status, 200);
    j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    assert_int_equal(member(j, "moved") + member(j, "done"), 0);
    assert_int_equal(member(j, "left"), 0);
    json_decref(j);
    sys_resp_free(&r);
    sys_admin_http(p.admin_port, "POST", "/_idem/v1/consumers/nobody/redrive", "{}", 5000, &r);
    assert_int_equal(r.status, 404);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    if (!redis) {
        /* idem consume --redrive, through the admin listener's socket. */
        char unix_cfg[4400], cmd[9000], out[1024] = "";
        text = sys_read_file(fixed);
        assert_non_null(at = strstr(text, "admin_listen: 127.0.0.1:0"));
        snprintf(unix_cfg, sizeof unix_cfg, "%s.unix", path);
        snprintf(broken, sizeof broken, "%.*sadmin_listen: unix:%s/rd-%d.sock%s",
                 (int)(at - text), text, dir, seq, at + strlen("admin_listen: 127.0.0.1:0"));
        sys_write_file(unix_cfg, broken);
        free(text);
        start(&p, "serve", unix_cfg);
        /* The configuration loads as the daemon's does: its keys' variable
         * set; the key used is IDEM_API_KEY's. */
        setenv(SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, 1);
        snprintf(cmd, sizeof cmd, "IDEM_API_KEY=%s %s consume --redrive refund-mq -c %s",
                 SYS_ADMIN_KEY, idem_bin, unix_cfg);
        int st = run_cli(cmd, out, sizeof out);
        if (st != 0 ||
            !strstr(out, "redrive of refund-mq: 0 moved back, 0 done already, 0 kept, 0 left"))
            fail_msg("idem consume --redrive: %d, said: %s", st, out);
        snprintf(cmd, sizeof cmd, "%s consume --redrive nobody -c %s", idem_bin, unix_cfg);
        assert_int_equal(run_cli(cmd, out, sizeof out), 2); /* no key in IDEM_API_KEY */
        snprintf(cmd, sizeof cmd, "IDEM_API_KEY=%s %s consume --redrive nobody -c %s",
                 SYS_ADMIN_KEY, idem_bin, unix_cfg);
        assert_int_equal(run_cli(cmd, out, sizeof out), 1);
        if (!strstr(out, "404 no consumer nobody here; refund-mq"))
            fail_msg("idem consume --redrive nobody said: %s", out);
        /* Without -c: the defaults' admin socket (./idem-admin.sock), where
         * no daemon listens. */
        char *abs = realpath(idem_bin, NULL);
        assert_non_null(abs);
        snprintf(cmd, sizeof cmd, "cd %s && IDEM_API_KEY=%s %s consume --redrive refund-mq", dir,
                 SYS_ADMIN_KEY, abs);
        free(abs);
        assert_int_equal(run_cli(cmd, out, sizeof out), 1);
        if (!strstr(out, "(is the daemon running?)"))
            fail_msg("idem consume --redrive without -c said: %s", out);
        assert_int_equal(sys_stop(&p, SIGTERM), 0);
    }
    assert_int_equal(rows() - before, KEYS);
    assert_int_equal(executions() - ran, KEYS);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

/* one_redrive(arg, 0), as a thread of its own. */
static void *redrive_thread(void *arg)
{
    one_redrive(arg, 0);
    return NULL;
}

/* SIGTERM while a redrive runs (once it has moved some): the redrive stops
 * at its next step and
 * its caller is answered (200, complete or not) before the daemon exits,
 * cleanly; what it did not take stays on the dead letter. */
static void test_redis_redrive_stopped(void **state)
{
    (void)state;
    enum { DEAD = 2000 };
    struct bus b;
    char path[4200];
    bus_open(&b, 1, "rdstop");
    refunds_config(&b, 64, 0, "", path, sizeof path);
    for (int i = 0; i < DEAD; i++) /* without a key: each comes back */
        redis_int(&b, "XADD %s * body {} message_id m-%d x-idem-reason key_missing", b.dead, i);
    struct proc p;
    start(&p, "serve", path);
    struct redrive_pair rp = {.admin_port = p.admin_port, .consumer = "refunds"};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, redrive_thread, &rp), 0);
    /* Once it has put messages back (before that, a SIGTERM finds nothing
     * redriven: 503 redrive_failed, also an answer). */
    long long deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline && redis_int(&b, "XLEN %s", b.queue) < 1)
        sleep_ms(5);
    kill(p.pid, SIGTERM);
    pthread_join(t, NULL);
    if (rp.status[0] != 200 || !rp.answer[0])
        fail_msg("a redrive cut by SIGTERM: %d %s", rp.status[0],
                 rp.answer[0] ? json_dumps(rp.answer[0], 0) : "");
    long long moved = member(rp.answer[0], "moved");
    json_t *error = json_object_get(rp.answer[0], "error");
    assert_true(moved > 0);
    assert_true(json_is_true(json_object_get(rp.answer[0], "complete")) ||
                (error && strstr(json_string_value(error), "stopping")));
    json_decref(rp.answer[0]);
    assert_int_equal(sys_stop(&p, 0), 0); /* its exit, on the SIGTERM above */
    assert_int_equal(dead_count(&b) >= DEAD - moved, 1);
    bus_close(&b);
}

static void test_amqp_redrive(void **state)
{
    (void)state;
    redrive(0);
}

static void test_redis_redrive(void **state)
{
    (void)state;
    redrive(1);
}

/* States on a consumer and a route sharing one space: a refund's status
 * events by the MQ and by HTTP callbacks move one machine. */
static void states_shared(int redis)
{
    struct bus b;
    char src[512], path[4200], cfg[4096], key[64], body[160];
    bus_open(&b, redis, "states");
    source_yaml(&b, src, sizeof src, 64);
    static const char states[] = "    fingerprint: [refund_no, status]\n"
                                 "    states:\n"
                                 "      field: { json: status }\n"
                                 "      initial: CREATED\n"
                                 "      transitions:\n"
                                 "        CREATED: [PROCESSING, SUCCESS, FAILED]\n"
                                 "        PROCESSING: [SUCCESS, FAILED]\n"
                                 "        SUCCESS: [REFUNDED_BACK]\n";
    snprintf(cfg, sizeof cfg,
             "routes:\n  - name: refund-notify\n    match: { method: POST, path: /refunds }\n"
             "    upstream: @UP@\n    key: { json: refund_no }\n    space: refund-state\n%s"
             "consumers:\n  - name: refund-mq\n%s"
             "    key: { json: refund_no }\n    space: refund-state\n    handler: @UP@/refunds\n%s",
             states, src, states);
    write_config(path, sizeof path, 0, cfg);
    struct proc p;
    start(&p, "serve", path);
    snprintf(key, sizeof key, "ST-%d", seq);
    long before = executions();
#define EVENT(status)                                                                   \
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\",\"amount\":\"1.00\",\"status\":\"%s\"}", \
             key, status)
    /* SUCCESS by the MQ: executed. */
    EVENT("SUCCESS");
    publish(&b, body, NULL, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (executions() - before < 1 && test_mono_ms() < deadline)
        sleep_ms(20);
    assert_int_equal(executions() - before, 1);
    while (test_mono_ms() < deadline && metric(&p, "idem_consumer_executed_total", "refund-mq") < 1)
        sleep_ms(20);
    /* By HTTP: SUCCESS again is the MQ's answer; PROCESSING is stale. */
    struct sys_resp r;
    sys_http(p.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_non_null(strstr(r.m->body, "\"state_to\":\"SUCCESS\""));
    sys_resp_free(&r);
    EVENT("PROCESSING");
    sys_http(p.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"outcome\":\"stale\""));
    sys_resp_free(&r);
    /* By the MQ: PROCESSING is acked unsent; FAILED and an unknown state
     * are dead letters. */
    publish(&b, body, NULL, NULL);
    EVENT("FAILED");
    publish(&b, body, NULL, NULL);
    EVENT("NOPE");
    publish(&b, body, NULL, NULL);
    assert_int_equal(wait_dead(&b, 2, 10000), 2);
    deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline &&
           metric(&p, "idem_consumer_duplicates_total", "refund-mq") < 1)
        sleep_ms(20);
    assert_int_equal(metric(&p, "idem_consumer_duplicates_total", "refund-mq"), 1);
    assert_int_equal(metric(&p, "idem_consumer_alerts_total", "refund-mq"), 1);
    /* Redriven: a key with states is in a state of its machine, which
     * says nothing of these moves; they go back through the consumer's
     * steps (not taken off as done) and come back refused again. */
    sys_admin_http(p.admin_port, "POST", "/_idem/v1/consumers/refund-mq/redrive", "{}", 30000,
                   &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    assert_int_equal(member(j, "moved"), 2);
    assert_int_equal(member(j, "done"), 0);
    json_decref(j);
    sys_resp_free(&r);
    deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline &&
           metric(&p, "idem_consumer_dead_lettered_total", "refund-mq") < 4)
        sleep_ms(20);
    assert_int_equal(metric(&p, "idem_consumer_dead_lettered_total", "refund-mq"), 4);
    /* By HTTP: REFUNDED_BACK moves it on. */
    EVENT("REFUNDED_BACK");
    sys_http(p.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state_from\":\"SUCCESS\""));
    sys_resp_free(&r);
#undef EVENT
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(executions() - before, 2);
    struct dead d[3];
    assert_int_equal(take_dead(&b, d, 3), 2);
    int conflict = !strcmp(d[0].reason, "transition_conflict") ||
                   !strcmp(d[1].reason, "transition_conflict");
    int unknown = !strcmp(d[0].reason, "unknown_state") || !strcmp(d[1].reason, "unknown_state");
    assert_true(conflict && unknown);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_states_shared_with_a_route(void **state)
{
    (void)state;
    states_shared(0);
}

static void test_redis_states_shared_with_a_route(void **state)
{
    (void)state;
    states_shared(1);
}

/* A handler call that timed out (the handler finished after idem gave
 * up): on_unknown_outcome: resolve asks the service, which says it
 * executed; the message is acked, the handler called once. */
static void resolved_message(int redis)
{
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "resolve");
    refunds_config(&b, 8, 0, "    handler_timeout: 300ms\n"
                   "    lease: 2s\n"
                   "    on_unknown_outcome: resolve\n"
                   "    resolve:\n"
                   "      url: @UP@/refunds/{key}\n"
                   "      after: 1500ms\n"
                   "      executed: [200]\n"
                   "      not_executed: [404]\n", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"RQ-%d\",\"amount\":\"1.00\"}", seq);
    const struct header h[] = {{"X-Delay-Ms", "800"}, {NULL, NULL}};
    publish(&b, body, h, NULL);
    /* The call times out; the service is asked 1.5 s later, says yes. */
    static const char want[] = "idem_resolutions_total{route=\"refunds\",verdict=\"executed\"} 1";
    long long deadline = test_mono_ms() + 20000;
    int resolved = 0;
    while (!resolved && test_mono_ms() < deadline) {
        struct sys_resp r;
        sys_admin_http(p.admin_port, "GET", "/metrics", NULL, 5000, &r);
        resolved = strstr(r.m->body, want) != NULL;
        sys_resp_free(&r);
        if (!resolved)
            sleep_ms(100);
    }
    if (!resolved) {
        char *log = sys_read_file(p.log);
        fail_msg("never resolved; idem's log:\n%s", log);
    }
    while (test_mono_ms() < deadline && !all_acked(&b))
        sleep_ms(100);
    assert_true(all_acked(&b));
    assert_int_equal(executions() - before, 1);
    assert_int_equal(dead_count(&b), 0);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    bus_close(&b);
}

static void test_amqp_unknown_outcome_resolved(void **state)
{
    (void)state;
    resolved_message(0);
}

static void test_redis_unknown_outcome_resolved(void **state)
{
    (void)state;
    resolved_message(1);
}

/* A message whose key is past its retention but within its tombstone is
 * acked as a duplicate, not run again, and logged key_expired. */
static void tombstoned_message(int redis)
{
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "tomb");
    refunds_config(&b, 8, 0, "    retention: 1s\n    tombstone: 30s\n", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"TM-%d\",\"amount\":\"1.00\"}", seq);
    publish(&b, body, NULL, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (test_mono_ms() < deadline &&
           (executions() - before < 1 || metric(&p, "idem_consumer_executed_total", "refunds") < 1))
        sleep_ms(50);
    assert_int_equal(executions() - before, 1);
    sleep_ms(1500); /* past the retention */
    publish(&b, body, NULL, NULL);
    while (test_mono_ms() < deadline + 5000 &&
           metric(&p, "idem_consumer_duplicates_total", "refunds") < 1)
        sleep_ms(50);
    assert_int_equal(metric(&p, "idem_consumer_duplicates_total", "refunds"), 1);
    assert_int_equal(executions() - before, 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    char *log = sys_read_file(p.log);
    assert_non_null(strstr(log, "\"outcome\":\"key_expired\""));
    assert_non_null(strstr(log, "\"reason\":\"key_expired\""));
    free(log);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_tombstoned_acked(void **state)
{
    (void)state;
    tombstoned_message(0);
}

static void test_redis_tombstoned_acked(void **state)
{
    (void)state;
    tombstoned_message(1);
}

/* A handler that always answers 500: the message reaches the dead letter
 * after max_attempts, with Idem's headers and its own, the handler called
 * exactly max_attempts times — idem killed and started again between the
 * attempts. */
static void poison(int redis)
{
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "poison");
    refunds_config(&b, 8, 0, "    lease: 1s\n"
                   "    handler_timeout: 1s\n"
                   "    max_attempts: 3\n"
                   "    retry_backoff: [1500ms]\n", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"P-%d\",\"amount\":\"1.00\"}", seq);
    const struct header h[] = {{"X-Fail", "500"}, {NULL, NULL}};
    publish(&b, body, h, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (executions() - before < 1 && test_mono_ms() < deadline)
        sleep_ms(20);
    assert_int_equal(executions() - before, 1);
    sys_stop(&p, SIGKILL); /* between attempts 1 and 2 (or during 1) */
    start(&p, "serve", path);
    assert_int_equal(wait_dead(&b, 1, 30000), 1);
    sleep_ms(500); /* nothing more reaches the handler */
    assert_int_equal(executions() - before, 3);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    struct dead d[2];
    assert_int_equal(take_dead(&b, d, 2), 1);
    assert_string_equal(d[0].body, body);
    assert_string_equal(d[0].reason, "attempts_exhausted");
    assert_string_equal(d[0].attempts, "3");
    assert_string_equal(d[0].last_status, "500");
    assert_string_equal(d[0].fail, "500"); /* the message's own header */
    /* Delivered again (an operator's replay, a producer's retry): its key
     * failed for good, so back to the dead letter, the handler not called. */
    start(&p, "serve", path);
    publish(&b, body, h, NULL);
    assert_int_equal(wait_dead(&b, 1, 10000), 1);
    assert_int_equal(executions() - before, 3);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(take_dead(&b, d, 2), 1);
    assert_string_equal(d[0].reason, "attempts_exhausted");
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_poison_dead_lettered_across_restart(void **state)
{
    (void)state;
    poison(0);
}

static void test_redis_poison_dead_lettered_across_restart(void **state)
{
    (void)state;
    poison(1);
}

/* A consumer with signature: the provider's signature rides in the
 * message's headers. A forged and an unsigned message for a real key go
 * to the dead letter (signature_invalid) and leave no record, so the
 * genuine one then executes once, and its redelivery is a duplicate. */
static void signed_messages(int redis)
{
    static const char secret[] = "consumer-signing-secret-0123";
    static const char forger[] = "not-the-secret-0123456789ab";
    struct bus b;
    char path[4200], body[128], hex[2][72];
    bus_open(&b, redis, "signed");
    setenv("IDEM_TEST_CONSUMER_SECRET", secret, 1);
    refunds_config(&b, 8, 0,
                   "    signature: { scheme: github, secrets: [{ env: "
                   "IDEM_TEST_CONSUMER_SECRET }] }\n",
                   path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"SIGNED-%d\",\"amount\":\"1.00\"}", seq);
    const char *keys[] = {forger, secret};
    for (int i = 0; i < 2; i++) {
        unsigned char mac[32];
        unsigned len = 0;
        HMAC(EVP_sha256(), keys[i], (int)strlen(keys[i]), (const unsigned char *)body,
             strlen(body), mac, &len);
        strcpy(hex[i], "sha256=");
        for (int j = 0; j < 32; j++)
            sprintf(hex[i] + 7 + 2 * j, "%02x", mac[j]);
    }
    const struct header forged[] = {{"X-Hub-Signature-256", hex[0]}, {NULL, NULL}};
    const struct header genuine[] = {{"X-Hub-Signature-256", hex[1]}, {NULL, NULL}};
    publish(&b, body, forged, NULL);
    publish(&b, body, NULL, NULL);
    assert_int_equal(wait_dead(&b, 2, 10000), 2);
    assert_int_equal(executions() - before, 0);
    publish(&b, body, genuine, NULL);
    publish(&b, body, genuine, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (executions() - before < 1 && test_mono_ms() < deadline)
        sleep_ms(20);
    sleep_ms(500); /* the redelivery, handled too */
    assert_int_equal(executions() - before, 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    struct dead d[4];
    assert_int_equal(take_dead(&b, d, 4), 2);
    for (int i = 0; i < 2; i++) {
        assert_string_equal(d[i].reason, "signature_invalid");
        assert_string_equal(d[i].body, body);
    }
    assert_true(all_acked(&b));
    unsetenv("IDEM_TEST_CONSUMER_SECRET");
    bus_close(&b);
}

static void test_amqp_signed_messages(void **state)
{
    (void)state;
    signed_messages(0);
}

static void test_redis_signed_messages(void **state)
{
    (void)state;
    signed_messages(1);
}

/* Bad input on the dead letter with its reason, and the queue goes on. */
static void bad_input(int redis)
{
    struct bus b;
    char path[4200], long_key[1200], body[1400], good[128];
    bus_open(&b, redis, "bad");
    /* A group that exists (made at the stream's end) is used as it is. */
    if (redis)
        freeReplyObject(redisCommand(b.rc, "XGROUP CREATE %s idem $ MKSTREAM", b.queue));
    refunds_config(&b, 8, 0, "", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\"}", long_key);
    publish(&b, "{\"amount\":\"1.00\"}", NULL, NULL);       /* no key */
    publish(&b, body, NULL, NULL);                           /* a key too long */
    publish(&b, "refund_no=R-1", NULL, NULL);                /* not JSON */
    const struct header crlf[] = {{"X-Note", "a\r\nX-Injected: 1"}, {NULL, NULL}};
    publish(&b, "{\"refund_no\":\"CRLF-1\",\"amount\":\"1.00\"}", crlf, NULL);
    const struct header name[] = {{"Idem_Message_Id", "forged"}, {"Bad Name", "x"}, {NULL, NULL}};
    publish(&b, "{\"refund_no\":\"NAME-1\",\"amount\":\"1.00\"}", name, NULL);
    /* A header with an empty name: RabbitMQ passes it on, and librabbitmq
     * cannot copy it; it is a bad message, not a broken connection. */
    const struct header empty[] = {{"", "x"}, {NULL, NULL}};
    publish(&b, "{\"refund_no\":\"EMPTY-1\",\"amount\":\"1.00\"}", empty, NULL);
    snprintf(good, sizeof good, "{\"refund_no\":\"GOOD-%d\",\"amount\":\"1.00\"}", seq);
    publish(&b, good, NULL, NULL);
    assert_int_equal(wait_dead(&b, 6, 10000), 6);
    long long deadline = test_mono_ms() + 10000;
    while (executions() - before < 1 && test_mono_ms() < deadline)
        sleep_ms(20);
    assert_int_equal(executions() - before, 1); /* the good one only */
    sleep_ms(1000); /* a reconnect would give out the bad ones again: none does */
    assert_int_equal(sys_stop(&p, SIGTERM), 0); /* alive, and stops cleanly */
    struct dead d[12];
    assert_int_equal(take_dead(&b, d, 12), 6);
    const char *want[] = {"key_missing", "key_invalid", "key_missing", "header_invalid",
                          "header_invalid", "header_invalid"};
    for (int i = 0; i < 6; i++) {
        int found = 0;
        for (int j = 0; j < 6 && !found; j++)
            found = !strcmp(d[j].reason, want[i]);
        if (!found)
            fail_msg("no dead letter with reason %s", want[i]);
        assert_true(d[i].reason[0] != '\0');
        assert_string_equal(d[i].forged, ""); /* left out in every spelling */
    }
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_bad_input_dead_lettered(void **state)
{
    (void)state;
    bad_input(0);
}

static void test_redis_bad_input_dead_lettered(void **state)
{
    (void)state;
    bad_input(1);
}

/* Why a key's failure went to the dead letter: a status idem retries
 * (429) kept because the attempts ran out is attempts_exhausted, not the
 * handler's refusal; an answer too big to keep is
 * handler_answer_too_large after its one execution. */
static void dead_letter_reasons(int redis)
{
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "reasons");
    refunds_config(&b, 8, 0, "    max_attempts: 2\n    retry_backoff: [100ms]\n", path,
                   sizeof path);
    struct proc p;
    start(&p, "serve", path);
    snprintf(body, sizeof body, "{\"refund_no\":\"BUSY-%d\",\"amount\":\"1.00\"}", seq);
    const struct header busy[] = {{"X-Fail", "429"}, {NULL, NULL}};
    publish(&b, body, busy, NULL);
    assert_int_equal(wait_dead(&b, 1, 10000), 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    struct dead d[2];
    assert_int_equal(take_dead(&b, d, 2), 1);
    assert_string_equal(d[0].reason, "attempts_exhausted");
    assert_string_equal(d[0].attempts, "2");
    assert_string_equal(d[0].last_status, "429");

    limits_extra = ", response_max: 16B"; /* every answer of the service is longer */
    refunds_config(&b, 8, 0, "", path, sizeof path);
    limits_extra = "";
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"BIG-%d\",\"amount\":\"1.00\"}", seq);
    publish(&b, body, NULL, NULL);
    assert_int_equal(wait_dead(&b, 1, 10000), 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(executions() - before, 1);
    assert_int_equal(take_dead(&b, d, 2), 1);
    assert_string_equal(d[0].reason, "handler_answer_too_large");
    assert_string_equal(d[0].attempts, "1");
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_dead_letter_reasons(void **state)
{
    (void)state;
    dead_letter_reasons(0);
}

static void test_redis_dead_letter_reasons(void **state)
{
    (void)state;
    dead_letter_reasons(1);
}

/* kill -9 of idem every 1-2 s (started again each time) while it works
 * through 5,000 keys: none lost (each has its row), none executed twice
 * but the few whose handler call a kill cut short (at most what was in
 * flight at each kill), and nothing left unacked. */
static void kill9_stream(int redis)
{
    struct bus b;
    char path[4200], body[128];
    const int keys = 5000, prefetch = 8;
    bus_open(&b, redis, "kill");
    refunds_config(&b, prefetch, 0, "    lease: 1s\n"
                   "    handler_timeout: 1s\n"
                   "    max_attempts: 100\n"
                   "    retry_backoff: [100ms]\n", path, sizeof path);
    long before_rows = rows(), before = executions();
    /* Each call takes the handler 10 ms: prefetch / 10 ms messages a second,
     * so that the stream lasts through several kills. */
    const struct header slow[] = {{"X-Delay-Ms", "10"}, {NULL, NULL}};
    for (int i = 0; i < keys; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"K%d-%d\",\"amount\":\"1.00\"}", seq, i);
        publish(&b, body, slow, NULL);
    }
    struct proc p;
    int kills = 0;
    long long deadline = test_mono_ms() + 120000;
    start(&p, "serve", path);
    while (rows() - before_rows < keys && test_mono_ms() < deadline) {
        sleep_ms(1000 + rand() % 1000);
        if (rows() - before_rows >= keys)
            break;
        sys_stop(&p, SIGKILL);
        kills++;
        start(&p, "serve", path);
    }
    assert_int_equal(wait_rows(before_rows + keys, 30000) - before_rows, keys); /* none lost */
    /* A stream's entries whose ack a kill cut off stay pending with the
     * dead instance until the live one takes them over (and acks them:
     * their records are finished). */
    long long settle = test_mono_ms() + 20000;
    while (test_mono_ms() < settle && (metric(&p, "idem_consumer_in_flight", "refunds") > 0 ||
                                       (redis && !all_acked(&b))))
        sleep_ms(50);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    long extra = executions() - before - keys;
    print_message("%d kills, %ld extra handler calls (cut short by a kill)\n", kills, extra);
    assert_true(kills >= 2);
    assert_true(extra >= 0 && extra <= (long)kills * prefetch);
    /* A key re-sent after a kill is refused by the service's own UNIQUE
     * key (409): on the dead letter as handler_rejected, its row there. */
    struct dead *d = calloc((size_t)kills * prefetch + 1, sizeof *d);
    size_t nd = take_dead(&b, d, (size_t)kills * prefetch + 1);
    for (size_t i = 0; i < nd; i++)
        assert_string_equal(d[i].reason, "handler_rejected");
    free(d);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_kill9_stream(void **state)
{
    (void)state;
    kill9_stream(0);
}

static void test_redis_kill9_stream(void **state)
{
    (void)state;
    kill9_stream(1);
}

/* RabbitMQ restarted mid-stream, then the handler down for 5 s: every key
 * executed once, nothing on the dead letter, nothing left unacked. */
static void test_amqp_broker_restart_and_handler_down(void **state)
{
    (void)state;
    struct bus b;
    char path[4200], body[128];
    const int keys = 2000;
    bus_open(&b, 0, "restart");
    refunds_config(&b, 32, 0, "    lease: 2s\n"
                   "    max_attempts: 50\n"
                   "    retry_backoff: [200ms, 500ms]\n", path, sizeof path);
    long before_rows = rows(), before = executions();
    for (int i = 0; i < keys; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"B%d-%d\",\"amount\":\"1.00\"}", seq, i);
        publish(&b, body, NULL, NULL);
    }
    struct proc p;
    start(&p, "serve", path);
    long long deadline = test_mono_ms() + 20000;
    while (rows() - before_rows < keys / 4 && test_mono_ms() < deadline)
        sleep_ms(20);
    sys_sh("'%s' rabbitmq-restart '%s' >/dev/null", services_sh, rabbit_dir);
    bus_reconnect(&b);
    while (rows() - before_rows < keys / 2 && test_mono_ms() < deadline + 40000)
        sleep_ms(20);
    int port = service.port;
    /* The service's count starts over when it restarts: read it once no
     * handler call can land after the read. Idem stands still meanwhile
     * (SIGSTOP), and the calls it had sent are handled and counted. */
    kill(p.pid, SIGSTOP);
    sleep_ms(500);
    long done_before_stop = executions() - before;
    sys_stop(&service, SIGTERM);
    kill(p.pid, SIGCONT);
    sleep_ms(5000);
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    const char *extra[] = {"--listen", listen, NULL};
    sys_start_service(&service, service_bin, dir, "refunds", extra);
    assert_int_equal(wait_rows(before_rows + keys, 60000) - before_rows, keys);
    /* The copies the broker gave out again after its restart are
     * duplicates now, each acked once its turn comes: a held one waits
     * out its backoff first, longer under the sanitizers. */
    long long settle = test_mono_ms() + 60000;
    /* None held by idem, and none left in the queue: a moment with none
     * held comes between two of the broker's batches too. */
    while (test_mono_ms() < settle &&
           (metric(&p, "idem_consumer_in_flight", "refunds") > 0 || !all_acked(&b)))
        sleep_ms(50);
    assert_int_equal(metric(&p, "idem_consumer_in_flight", "refunds"), 0);
    assert_true(metric(&p, "idem_consumer_reconnects_total", "refunds") >= 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    /* The service counts from 0 again after its restart. */
    assert_int_equal(done_before_stop + executions(), keys);
    assert_int_equal(dead_count(&b), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

/* A key used again with another payload (the fingerprint differs): the
 * second message is dead-lettered key_reused and counted as an alert; the
 * handler ran the first only. */
static void key_reused(int redis)
{
    struct bus b;
    char path[4200], one[128], other[128];
    bus_open(&b, redis, "reused");
    refunds_config(&b, 8, 0, "", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(one, sizeof one, "{\"refund_no\":\"MM-%d\",\"amount\":\"1.00\"}", seq);
    snprintf(other, sizeof other, "{\"refund_no\":\"MM-%d\",\"amount\":\"9.00\"}", seq);
    publish(&b, one, NULL, NULL);
    long long deadline = test_mono_ms() + 10000;
    while (executions() - before < 1 && test_mono_ms() < deadline)
        sleep_ms(20);
    publish(&b, other, NULL, NULL);
    assert_int_equal(wait_dead(&b, 1, 10000), 1);
    assert_int_equal(metric(&p, "idem_consumer_alerts_total", "refunds"), 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(executions() - before, 1);
    struct dead d[2];
    assert_int_equal(take_dead(&b, d, 2), 1);
    assert_string_equal(d[0].reason, "key_reused");
    assert_string_equal(d[0].body, other);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_key_reused_dead_lettered(void **state)
{
    (void)state;
    key_reused(0);
}

static void test_redis_key_reused_dead_lettered(void **state)
{
    (void)state;
    key_reused(1);
}

/* A handler slower than handler_timeout, every time: each attempt's
 * outcome is unknown, the next takes its claim over after the lease, and
 * after max_attempts the message is dead-lettered once, saying 3 attempts
 * — however long it stayed with the consumer meanwhile (a stream's entry
 * is not taken over from a consumer that still holds it). */
static void slow_handler(int redis)
{
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, redis, "slow");
    refunds_config(&b, 8, 0, "    lease: 1s\n"
                   "    handler_timeout: 300ms\n"
                   "    max_attempts: 3\n"
                   "    retry_backoff: [200ms]\n", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before = executions();
    snprintf(body, sizeof body, "{\"refund_no\":\"SL-%d\",\"amount\":\"1.00\"}", seq);
    const struct header h[] = {{"X-Delay-Ms", "1500"}, {NULL, NULL}};
    publish(&b, body, h, NULL);
    assert_int_equal(wait_dead(&b, 1, 30000), 1);
    sleep_ms(3000); /* no second dead letter comes */
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_int_equal(executions() - before, 3);
    struct dead d[4];
    assert_int_equal(take_dead(&b, d, 4), 1);
    assert_string_equal(d[0].reason, "attempts_exhausted");
    assert_string_equal(d[0].attempts, "3");
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_slow_handler_dead_lettered_once(void **state)
{
    (void)state;
    slow_handler(0);
}

static void test_redis_slow_handler_dead_lettered_once(void **state)
{
    (void)state;
    slow_handler(1);
}

/* The queue deleted under the consumer, then declared again (a redeploy):
 * the broker cancels the consumer, which connects again and consumes the
 * new queue. */
static void test_amqp_queue_deleted_and_back(void **state)
{
    (void)state;
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, 0, "gone");
    refunds_config(&b, 8, 0, "", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before_rows = rows();
    snprintf(body, sizeof body, "{\"refund_no\":\"G%d-0\",\"amount\":\"1.00\"}", seq);
    publish(&b, body, NULL, NULL); /* consumed: the consumer is on the queue */
    assert_int_equal(wait_rows(before_rows + 1, 10000) - before_rows, 1);
    before_rows = rows();
    amqp_queue_delete(b.amqp, 1, amqp_cstring_bytes(b.queue), 0, 0);
    assert_int_equal(amqp_get_rpc_reply(b.amqp).reply_type, AMQP_RESPONSE_NORMAL);
    amqp_queue_declare(b.amqp, 1, amqp_cstring_bytes(b.queue), 0, 1, 0, 0, amqp_empty_table);
    assert_int_equal(amqp_get_rpc_reply(b.amqp).reply_type, AMQP_RESPONSE_NORMAL);
    snprintf(body, sizeof body, "{\"refund_no\":\"G%d\",\"amount\":\"1.00\"}", seq);
    publish(&b, body, NULL, NULL);
    assert_int_equal(wait_rows(before_rows + 1, 15000) - before_rows, 1);
    assert_true(metric(&p, "idem_consumer_reconnects_total", "refunds") >= 1);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    assert_true(all_acked(&b));
    bus_close(&b);
}

/* The distributed store's PostgreSQL stopped for 3 s under a stream of
 * messages: nothing acked meanwhile, every key executed once after. */
static void store_stopped(int redis)
{
    struct bus b;
    char path[4200], body[128];
    const int keys = 1000;
    bus_open(&b, redis, "store");
    refunds_config(&b, 16, 1, "    lease: 5s\n", path, sizeof path);
    long before_rows = rows(), before = executions();
    struct proc p;
    start(&p, "consume", path);
    for (int i = 0; i < keys; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"S%d-%d\",\"amount\":\"1.00\"}", seq, i);
        publish(&b, body, NULL, NULL);
    }
    long long deadline = test_mono_ms() + 20000;
    while (rows() - before_rows < keys / 4 && test_mono_ms() < deadline)
        sleep_ms(10);
    sys_sh("'%s' pg-stop '%s' >/dev/null", services_sh, state_dir);
    sleep_ms(1000);
    long during = rows();
    sleep_ms(2000);
    assert_int_equal(rows(), during); /* nothing executes without its record */
    sys_sh("'%s' pg-start '%s' >/dev/null", services_sh, state_dir);
    assert_int_equal(wait_rows(before_rows + keys, 60000) - before_rows, keys);
    long long settle = test_mono_ms() + 15000;
    while (test_mono_ms() < settle && (metric(&p, "idem_consumer_in_flight", "refunds") > 0 ||
                                       (redis && !all_acked(&b))))
        sleep_ms(50);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    /* A call the store's fall cut short may be sent again (its record not
     * finished): at most what was in flight. */
    long extra = executions() - before - keys;
    assert_true(extra >= 0 && extra <= 16);
    assert_true(all_acked(&b));
    bus_close(&b);
}

static void test_amqp_store_stopped(void **state)
{
    (void)state;
    store_stopped(0);
}

static void test_redis_store_stopped(void **state)
{
    (void)state;
    store_stopped(1);
}

/* A consumer that died with entries pending: another instance takes them
 * over (XAUTOCLAIM) once they have been idle past the lease, the handler's
 * timeout and the backoff, and every key gets its row. */
static void test_redis_dead_consumer_taken_over(void **state)
{
    (void)state;
    struct bus b;
    char path[4200], body[128];
    bus_open(&b, 1, "claim");
    refunds_config(&b, 64, 0, "    lease: 1s\n"
                   "    handler_timeout: 3s\n"
                   "    retry_backoff: [100ms]\n", path, sizeof path);
    struct proc p;
    start(&p, "serve", path);
    long before_rows = rows();
    /* Each held by its handler for a second: pending when idem dies. */
    const struct header slow[] = {{"X-Delay-Ms", "1000"}, {NULL, NULL}};
    for (int i = 0; i < 20; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"C%d-%d\",\"amount\":\"1.00\"}", seq, i);
        publish(&b, body, slow, NULL);
    }
    long long deadline = test_mono_ms() + 10000;
    while (metric(&p, "idem_consumer_received_total", "refunds") < 20 && test_mono_ms() < deadline)
        sleep_ms(10);
    sys_stop(&p, SIGKILL);
    assert_true(redis_int(&b, "XLEN %s", b.queue) == 20);
    assert_false(all_acked(&b)); /* pending with the dead instance */
    start(&p, "serve", path); /* another instance: another consumer name */
    assert_int_equal(wait_rows(before_rows + 20, 30000) - before_rows, 20);
    deadline = test_mono_ms() + 15000;
    while (!all_acked(&b) && test_mono_ms() < deadline)
        sleep_ms(50);
    assert_true(all_acked(&b));
    assert_true(metric(&p, "idem_consumer_received_total", "refunds") >= 20);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    bus_close(&b);
}

/* What a failed test left running must not count in the next one. */
static int teardown(void **state)
{
    (void)state;
    sys_kill_all();
    if (kill(service.pid, 0) != 0)
        sys_start_service(&service, service_bin, dir, "refunds", NULL);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    dir = test_mkdtemp();
    srand((unsigned)getpid());
    sys_start_service(&service, service_bin, dir, "refunds", NULL);
    test_wipe_servers(redis_url, pg_url);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sys_finish(&service, dir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: %s IDEM REFUND_SERVICE SERVICES_SH STATE_DIR RABBIT_STATE_DIR "
                        "AMQP_URL REDIS_URL POSTGRES_URL\n", argv[0]);
        return 2;
    }
    idem_bin = argv[1], service_bin = argv[2], services_sh = argv[3], state_dir = argv[4];
    rabbit_dir = argv[5], amqp_url = argv[6], redis_url = argv[7], pg_url = argv[8];
    signal(SIGPIPE, SIG_IGN);
    /* IDEM_TEST_FILTER=test_redis_* runs only the tests it matches. */
    if (getenv("IDEM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("IDEM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_amqp_duplicates_two_instances, teardown),
        cmocka_unit_test_teardown(test_redis_duplicates_two_instances, teardown),
        cmocka_unit_test_teardown(test_amqp_route_and_consumer_one_execution, teardown),
        cmocka_unit_test_teardown(test_redis_route_and_consumer_one_execution, teardown),
        cmocka_unit_test_teardown(test_amqp_dead_letter_leaves_key_open, teardown),
        cmocka_unit_test_teardown(test_redis_dead_letter_leaves_key_open, teardown),
        cmocka_unit_test_teardown(test_amqp_redrive, teardown),
        cmocka_unit_test_teardown(test_redis_redrive, teardown),
        cmocka_unit_test_teardown(test_redis_redrive_stopped, teardown),
        cmocka_unit_test_teardown(test_amqp_states_shared_with_a_route, teardown),
        cmocka_unit_test_teardown(test_amqp_unknown_outcome_resolved, teardown),
        cmocka_unit_test_teardown(test_amqp_tombstoned_acked, teardown),
        cmocka_unit_test_teardown(test_redis_tombstoned_acked, teardown),
        cmocka_unit_test_teardown(test_redis_unknown_outcome_resolved, teardown),
        cmocka_unit_test_teardown(test_redis_states_shared_with_a_route, teardown),
        cmocka_unit_test_teardown(test_amqp_poison_dead_lettered_across_restart, teardown),
        cmocka_unit_test_teardown(test_redis_poison_dead_lettered_across_restart, teardown),
        cmocka_unit_test_teardown(test_amqp_bad_input_dead_lettered, teardown),
        cmocka_unit_test_teardown(test_redis_bad_input_dead_lettered, teardown),
        cmocka_unit_test_teardown(test_amqp_dead_letter_reasons, teardown),
        cmocka_unit_test_teardown(test_redis_dead_letter_reasons, teardown),
        cmocka_unit_test_teardown(test_amqp_signed_messages, teardown),
        cmocka_unit_test_teardown(test_redis_signed_messages, teardown),
        cmocka_unit_test_teardown(test_amqp_kill9_stream, teardown),
        cmocka_unit_test_teardown(test_redis_kill9_stream, teardown),
        cmocka_unit_test_teardown(test_amqp_broker_restart_and_handler_down, teardown),
        cmocka_unit_test_teardown(test_amqp_queue_deleted_and_back, teardown),
        cmocka_unit_test_teardown(test_amqp_key_reused_dead_lettered, teardown),
        cmocka_unit_test_teardown(test_redis_key_reused_dead_lettered, teardown),
        cmocka_unit_test_teardown(test_amqp_slow_handler_dead_lettered_once, teardown),
        cmocka_unit_test_teardown(test_redis_slow_handler_dead_lettered_once, teardown),
        cmocka_unit_test_teardown(test_amqp_store_stopped, teardown),
        cmocka_unit_test_teardown(test_redis_store_stopped, teardown),
        cmocka_unit_test_teardown(test_redis_dead_consumer_taken_over, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
