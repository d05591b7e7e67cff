/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plain_consumer.c — the reference for bench/consume.sh: a consumer as one
 * is written without Idem, and the publisher that preloads the queue both
 * consumers drain.
 *
 *   idem-plain-consumer consume (--amqp URL --queue Q | --redis URL --stream S
 *                       [--group G]) --handler http://HOST:PORT/PATH --count N
 *                       [--prefetch 64]
 *   idem-plain-consumer publish (--amqp URL --queue Q | --redis URL --stream S)
 *                       --count N [--unique U]
 *   idem-plain-consumer depth (--amqp URL --queue Q | --redis URL --stream S
 *                       --group G)
 *
 * consume takes messages (basic.qos prefetch on RabbitMQ, XREADGROUP COUNT
 * prefetch on Redis), POSTs each body to the handler on one keep-alive
 * HTTP/1.1 connection, waits for a 2xx, and acks it (basic.ack, XACK): no
 * deduplication, nothing durable of its own. It stops after N acks, once
 * the broker has seen them (a synchronous command after the last), and
 * prints one line: "PLAIN acked=N handler_calls=N seconds=S".
 *
 * publish puts N messages {"id":"k-<i mod U>","amount":"1.00"} in the queue
 * (durable, persistent messages) or the stream (field body): with U = N
 * every key is unique; with U = N/10 each key comes 10 times, U messages
 * apart, the same body each time (as a message published again is: Idem
 * would take a new body under a key it has done for a key reused). It
 * returns once the broker holds all N.
 *
 * depth prints what is left to do, after a consumer has stopped: the
 * queue's messages (those a consumer took but never acked are back in it),
 * or the group's entries not yet read plus those read and not acked.
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHANNEL 1

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("idem-plain-consumer: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct opts {
    const char *mode, *amqp, *queue, *redis, *stream, *group, *handler;
    long count, unique, prefetch;
};

/* ---- the handler: a blocking HTTP/1.1 client on one connection ---------- */

struct http {
    char host[256], path[512];
    int port, fd;
    char buf[16384];
    size_t have; /* bytes of buf read but not yet consumed */
    long calls;
};

static void http_connect(struct http *h)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)h->port)};
    if (inet_pton(AF_INET, h->host, &sa.sin_addr) != 1)
        die("handler host %s: give an IPv4 address", h->host);
    if ((h->fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
        connect(h->fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        die("handler %s:%d: %s", h->host, h->port, strerror(errno));
    /* Request after request on one connection: no Nagle wait between them. */
    int one = 1;
    setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    h->have = 0;
}

static void http_open(struct http *h, const char *url)
{
    if (sscanf(url, "http://%255[^:/]:%d%511s", h->host, &h->port, h->path) != 3 ||
        h->path[0] != '/')
        die("--handler %s: expected http://HOST:PORT/PATH", url);
    http_connect(h);
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* More of the answer into buf: 0, or -1 once the connection is closed. */
static int http_read_more(struct http *h)
{
    for (;;) {
        ssize_t r = read(h->fd, h->buf + h->have, sizeof h->buf - h->have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        h->have += (size_t)r;
        return 0;
    }
}

/* One answer's head and body from the connection; its status, or -1 when
 * the connection closed before a whole answer. */
static int http_read_answer(struct http *h)
{
    char *end;
    while (!(end = memmem(h->buf, h->have, "\r\n\r\n", 4))) {
        if (h->have == sizeof h->buf)
            die("handler: an answer's head over %zu bytes", sizeof h->buf);
        if (http_read_more(h))
            return -1;
    }
    int status;
    if (sscanf(h->buf, "HTTP/1.%*d %d", &status) != 1)
        die("handler: not an HTTP answer: %.40s", h->buf);
    size_t head = (size_t)(end - h->buf) + 4, body = 0;
    /* The trivial handler always sends Content-Length (never chunked). */
    for (char *p = h->buf; p < end; p++)
        if ((p == h->buf || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0)
            body = strtoul(p + 15, NULL, 10);
    if (head + body > sizeof h->buf)
        die("handler: an answer over %zu bytes", sizeof h->buf);
    while (h->have < head + body)
        if (http_read_more(h))
            return -1;
    memmove(h->buf, h->buf + head + body, h->have - head - body);
    h->have -= head + body;
    return status;
}

/* POST body to the handler; dies unless it answers 2xx. A connection the
 * server closed between two requests (its keep-alive limit) is opened
 * again, once. */
static void http_post(struct http *h, const char *body, size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n",
                     h->path, h->host, h->port, len);
    for (int tries = 0;; tries++) {
        int status = -1;
        if (write_all(h->fd, head, (size_t)n) == 0 && write_all(h->fd, body, len) == 0)
            status = http_read_answer(h);
        if (status >= 200 && status < 300) {
            h->calls++;
            return;
        }
        if (status >= 0)
            die("handler answered %d", status);
        if (tries)
            die("handler %s:%d closed the connection twice", h->host, h->port);
        close(h->fd);
        http_connect(h);
    }
}

/* The body of message i: its key, and so the body, repeats every U
 * messages. */
static size_t message_body(char *buf, size_t cap, const struct opts *o, long i)
{
    int n = snprintf(buf, cap, "{\"id\":\"k-%ld\",\"amount\":\"1.00\"}", i % o->unique);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* ---- RabbitMQ --------------------------------------------------------------- */

static void amqp_check(amqp_rpc_reply_t r, const char *what)
{
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return;
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        die("%s: %s", what, amqp_error_string2(r.library_error));
    if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD || r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        /* Both close methods start with reply_code, reply_text. */
        amqp_channel_close_t *c = r.reply.decoded;
        die("%s: %u %.*s", what, c->reply_code, (int)c->reply_text.len,
            (char *)c->reply_text.bytes);
    }
    die("%s: broker error (method %#x)", what, (unsigned)r.reply.id);
}

static amqp_connection_state_t amqp_open(const char *url)
{
    struct amqp_connection_info ci;
    char *u = strdup(url);
    if (!u || amqp_parse_url(u, &ci) != AMQP_STATUS_OK)
        die("--amqp %s: not an amqp:// URL", url);
    amqp_connection_state_t c = amqp_new_connection();
    amqp_socket_t *s = amqp_tcp_socket_new(c);
    if (!s || amqp_socket_open(s, ci.host, ci.port) != AMQP_STATUS_OK)
        die("RabbitMQ %s:%d: cannot connect", ci.host, ci.port);
    amqp_check(amqp_login(c, ci.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, ci.user,
                          ci.password),
               "login");
    amqp_channel_open(c, CHANNEL);
    amqp_check(amqp_get_rpc_reply(c), "channel.open");
    free(u);
    return c;
}

/* As Idem declares a queue it does not find: durable, classic, no
 * arguments. passive: the ready messages of the queue as it is. */
static uint32_t amqp_declare(amqp_connection_state_t c, const char *queue, int passive)
{
    amqp_queue_declare_ok_t *ok = amqp_queue_declare(
        c, CHANNEL, amqp_cstring_bytes(queue), passive, 1, 0, 0, amqp_empty_table);
    amqp_check(amqp_get_rpc_reply(c), "queue.declare");
    return ok->message_count;
}

static void amqp_done(amqp_connection_state_t c)
{
    amqp_channel_close(c, CHANNEL, AMQP_REPLY_SUCCESS);
    amqp_connection_close(c, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(c);
}

static void amqp_consume(const struct opts *o, struct http *h)
{
    amqp_connection_state_t c = amqp_open(o->amqp);
    amqp_basic_qos(c, CHANNEL, 0, (uint16_t)o->prefetch, 0);
    amqp_check(amqp_get_rpc_reply(c), "basic.qos");
    amqp_basic_consume(c, CHANNEL, amqp_cstring_bytes(o->queue), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    amqp_check(amqp_get_rpc_reply(c), "basic.consume");
    for (long acked = 0; acked < o->count; acked++) {
        amqp_envelope_t env;
        amqp_maybe_release_buffers(c);
        amqp_check(amqp_consume_message(c, &env, NULL, 0), "consume");
        http_post(h, env.message.body.bytes, env.message.body.len);
        if (amqp_basic_ack(c, CHANNEL, env.delivery_tag, 0) != AMQP_STATUS_OK)
            die("basic.ack failed");
        amqp_destroy_envelope(&env);
    }
    /* The broker handles a channel's frames in order: once this answers,
     * it has every ack. */
    amqp_declare(c, o->queue, 1);
    amqp_done(c);
}

static void amqp_publish(const struct opts *o)
{
    amqp_connection_state_t c = amqp_open(o->amqp);
    uint32_t before = amqp_declare(c, o->queue, 0);
    amqp_basic_properties_t p = {
        ._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG,
        .content_type = amqp_cstring_bytes("application/json"),
        .delivery_mode = 2, /* persistent: as a message meant to be handled once */
    };
    char body[128];
    for (long i = 0; i < o->count; i++) {
        amqp_bytes_t b = {.len = message_body(body, sizeof body, o, i), .bytes = body};
        if (amqp_basic_publish(c, CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(o->queue), 0, 0,
                               &p, b) != AMQP_STATUS_OK)
            die("basic.publish failed");
    }
    /* No confirms: the queue's count says when all have arrived. */
    double t0 = now_s();
    while (amqp_declare(c, o->queue, 1) < before + (uint32_t)o->count) {
        if (now_s() - t0 > 60)
            die("the queue did not reach %ld messages in 60 s", o->count);
        usleep(20000);
    }
    amqp_done(c);
}

static void amqp_depth(const struct opts *o)
{
    amqp_connection_state_t c = amqp_open(o->amqp);
    printf("%u\n", amqp_declare(c, o->queue, 1));
    amqp_done(c);
}

/* ---- Redis Streams ------------------------------------------------------------ */

static redisContext *redis_open(const char *url)
{
    char host[256];
    int port = 6379, db = 0;
    if (sscanf(url, "redis://%255[^:/]:%d/%d", host, &port, &db) < 1)
        die("--redis %s: expected redis://HOST:PORT[/DB]", url);
    redisContext *r = redisConnect(host, port);
    if (!r || r->err)
        die("Redis %s:%d: %s", host, port, r ? r->errstr : "out of memory");
    redisReply *x = redisCommand(r, "SELECT %d", db);
    if (!x || x->type == REDIS_REPLY_ERROR)
        die("SELECT %d: %s", db, x ? x->str : r->errstr);
    freeReplyObject(x);
    return r;
}

static redisReply *redis_do(redisContext *r, const char *what, redisReply *x)
{
    if (!x)
        die("%s: %s", what, r->errstr);
    if (x->type == REDIS_REPLY_ERROR)
        die("%s: %s", what, x->str);
    return x;
}

static void redis_consume(const struct opts *o, struct http *h)
{
    redisContext *r = redis_open(o->redis);
    /* As Idem makes its group: from the stream's first entry. */
    redisReply *x = redisCommand(r, "XGROUP CREATE %s %s 0 MKSTREAM", o->stream, o->group);
    if (!x || (x->type == REDIS_REPLY_ERROR && strncmp(x->str, "BUSYGROUP", 9) != 0))
        die("XGROUP CREATE: %s", x ? x->str : r->errstr);
    freeReplyObject(x);
    char count[32];
    snprintf(count, sizeof count, "%ld", o->prefetch);
    long acked = 0;
    while (acked < o->count) {
        const char *argv[] = {"XREADGROUP", "GROUP", o->group, "plain", "COUNT", count,
                              "BLOCK", "1000", "STREAMS", o->stream, ">"};
        x = redis_do(r, "XREADGROUP", redisCommandArgv(r, 11, argv, NULL));
        /* [[stream, [[id, [field, value, ...]], ...]]], or nil after BLOCK. */
        if (x->type == REDIS_REPLY_ARRAY && x->elements == 1) {
            redisReply *entries = x->element[0]->element[1];
            for (size_t i = 0; i < entries->elements; i++) {
                redisReply *id = entries->element[i]->element[0];
                redisReply *f = entries->element[i]->element[1];
                size_t j = 0;
                while (j + 1 < f->elements && strcmp(f->element[j]->str, "body") != 0)
                    j += 2;
                if (j + 1 >= f->elements)
                    die("entry %s has no field body", id->str);
                http_post(h, f->element[j + 1]->str, f->element[j + 1]->len);
                freeReplyObject(redis_do(r, "XACK",
                                         redisCommand(r, "XACK %s %s %b", o->stream, o->group,
                                                      id->str, id->len)));
                acked++;
            }
        }
        freeReplyObject(x);
    }
    redisFree(r);
}

static void redis_publish(const struct opts *o)
{
    redisContext *r = redis_open(o->redis);
    char body[128];
    /* Pipelined, a thousand at a time. */
    for (long i = 0; i < o->count; i += 1000) {
        long n = o->count - i < 1000 ? o->count - i : 1000;
        for (long k = i; k < i + n; k++) {
            size_t len = message_body(body, sizeof body, o, k);
            redisAppendCommand(r, "XADD %s * body %b", o->stream, body, len);
        }
        for (long k = 0; k < n; k++) {
            void *x;
            if (redisGetReply(r, &x) != REDIS_OK)
                die("XADD: %s", r->errstr);
            freeReplyObject(redis_do(r, "XADD", x));
        }
    }
    redisFree(r);
}

static void redis_depth(const struct opts *o)
{
    redisContext *r = redis_open(o->redis);
    redisReply *x = redis_do(r, "XINFO GROUPS", redisCommand(r, "XINFO GROUPS %s", o->stream));
    long long left = -1;
    /* One flat list of field, value per group; lag is nil when Redis
     * cannot tell (entries deleted), then this says -1. */
    for (size_t g = 0; g < x->elements; g++) {
        redisReply *f = x->element[g];
        long long pending = 0, lag = -1;
        int ours = 0;
        for (size_t j = 0; j + 1 < f->elements; j += 2) {
            const char *k = f->element[j]->str;
            redisReply *v = f->element[j + 1];
            if (!strcmp(k, "name"))
                ours = !strcmp(v->str, o->group);
            else if (!strcmp(k, "pending"))
                pending = v->integer;
            else if (!strcmp(k, "lag") && v->type == REDIS_REPLY_INTEGER)
                lag = v->integer;
        }
        if (ours)
            left = lag < 0 ? -1 : pending + lag;
    }
    freeReplyObject(x);
    redisFree(r);
    printf("%lld\n", left);
}

/* ---- main ----------------------------------------------------------------------- */

static void usage(void)
{
    fputs("usage: idem-plain-consumer consume (--amqp URL --queue Q | --redis URL --stream S\n"
          "                           [--group G]) --handler http://HOST:PORT/PATH --count N\n"
          "                           [--prefetch 64]\n"
          "       idem-plain-consumer publish (--amqp URL --queue Q | --redis URL --stream S)\n"
          "                           --count N [--unique U]\n"
          "       idem-plain-consumer depth (--amqp URL --queue Q | --redis URL --stream S\n"
          "                           --group G)\n",
          stderr);
    exit(2);
}

static long number(const char *flag, const char *v, long lo, long hi)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || end == v || n < lo || n > hi)
        die("%s %s: expected a number from %ld to %ld", flag, v, lo, hi);
    return n;
}

int main(int argc, char **argv)
{
    struct opts o = {.group = "idem", .prefetch = 64};
    if (argc < 2)
        usage();
    o.mode = argv[1];
    for (int i = 2; i < argc; i += 2) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (!strcmp(f, "--amqp"))
            o.amqp = v;
        else if (!strcmp(f, "--queue"))
            o.queue = v;
        else if (!strcmp(f, "--redis"))
            o.redis = v;
        else if (!strcmp(f, "--stream"))
            o.stream = v;
        else if (!strcmp(f, "--group"))
            o.group = v;
        else if (!strcmp(f, "--handler"))
            o.handler = v;
        else if (!strcmp(f, "--count"))
            o.count = number(f, v, 1, 100000000);
        else if (!strcmp(f, "--unique"))
            o.unique = number(f, v, 1, 100000000);
        else if (!strcmp(f, "--prefetch"))
            o.prefetch = number(f, v, 1, 65535);
        else
            usage();
    }
    if (!o.amqp == !o.redis || (o.amqp && !o.queue) || (o.redis && !o.stream))
        usage();
    if (!strcmp(o.mode, "depth")) {
        o.amqp ? amqp_depth(&o) : redis_depth(&o);
        return 0;
    }
    if (!o.count)
        usage();
    if (!strcmp(o.mode, "publish")) {
        if (!o.unique)
            o.unique = o.count;
        o.amqp ? amqp_publish(&o) : redis_publish(&o);
        return 0;
    }
    if (strcmp(o.mode, "consume") || !o.handler)
        usage();
    struct http h = {0};
    http_open(&h, o.handler);
    double t0 = now_s();
    o.amqp ? amqp_consume(&o, &h) : redis_consume(&o, &h);
    printf("PLAIN acked=%ld handler_calls=%ld seconds=%.3f\n", o.count, h.calls, now_s() - t0);
    close(h.fd);
    return 0;
}
