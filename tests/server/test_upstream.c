/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_upstream.c — the upstream client of idem serve (server/http/upstream.c).
 *
 * Every case runs against a real loopback server: a thread of this test
 * with a listening socket on port 0 and a thread per connection, scripted
 * per case (answer in parts, stay silent, close after reading, echo after a
 * delay). The client runs on a real event_base.
 *
 * What matters most is the line between "not sent" and "maybe executed":
 * each case asserts the exact result, and where a connection can or cannot
 * be reused, how many connections the server accepted.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "testlib.h"
#include "http/upstream.h"

#define HOST "127.0.0.1"
#define MAX_CONNS 256

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static const char *result_name(enum upstream_result r)
{
    static const char *const names[] = {"OK", "NOT_SENT", "UNKNOWN", "TIMEOUT", "TOO_BIG"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

#define assert_result(got, want, detail)                                         \
    do {                                                                         \
        enum upstream_result g_ = (got), w_ = (want);                            \
        if (g_ != w_)                                                            \
            fail_msg("result %s, expected %s (detail: %s)", result_name(g_),     \
                     result_name(w_), (detail));                                 \
    } while (0)

/* ---- the loopback server ------------------------------------------------- */

struct server {
    int lfd, port;
    pthread_t acceptor;
    void (*handle)(struct server *s, int fd);
    const char *const *parts; /* serve_parts: the answer, a pause between parts */
    int close_after;          /* serve_parts: close once answered */
    int reset;                /* close with a reset (RST), not a FIN */
    atomic_int stop;
    atomic_int accepts;  /* connections accepted */
    atomic_int requests; /* whole requests read */
    atomic_int closes;   /* connections the peer closed while we waited for it */
    atomic_int closed;   /* connections the server has closed */
    pthread_mutex_t mu;
    struct http_msg *first; /* the first request read */
    int conn_fd[MAX_CONNS];
    pthread_t conn_thread[MAX_CONNS];
    int nconns;
};

struct conn {
    struct server *s;
    int i;
};

/* recv, waiting in slices so that server_stop() ends the wait. */
static ssize_t srv_recv(struct server *s, int fd, char *buf, size_t len)
{
    while (!atomic_load(&s->stop)) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 20) > 0)
            return recv(fd, buf, len, 0);
    }
    return -1;
}

static void srv_send(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n <= 0)
            return;
        s += n;
        len -= (size_t)n;
    }
}

/* The next request on fd, or NULL when the peer closed or sent garbage. */
static struct http_msg *read_request(struct server *s, int fd)
{
    static const struct http_limits limits = {8192, 100, 65536, 64 << 20};
    struct http_parser p;
    http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
    struct http_msg *m = NULL;
    char buf[4096];
    for (;;) {
        ssize_t n = srv_recv(s, fd, buf, sizeof buf);
        if (n <= 0)
            break;
        size_t used;
        enum http_parse_status st = http_parser_feed(&p, buf, (size_t)n, &used);
        if (st == HTTP_DONE)
            m = http_parser_take(&p);
        if (st != HTTP_NEED_MORE)
            break;
    }
    http_parser_free(&p);
    if (m)
        atomic_fetch_add(&s->requests, 1);
    return m;
}

/* The first request is kept for the test to look at; the others go. */
static void done_with(struct server *s, struct http_msg *m)
{
    pthread_mutex_lock(&s->mu);
    if (!s->first) {
        s->first = m;
        m = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    http_msg_free(m);
}

/* Wait until the peer closes (or the server stops). */
static void await_close(struct server *s, int fd)
{
    char buf[4096];
    ssize_t n;
    while ((n = srv_recv(s, fd, buf, sizeof buf)) > 0)
        ;
    if (n == 0)
        atomic_fetch_add(&s->closes, 1);
}

/* Each request answered with s->parts; closed after the first if close_after. */
static void serve_parts(struct server *s, int fd)
{
    struct http_msg *m;
    while ((m = read_request(s, fd)) != NULL) {
        done_with(s, m);
        for (const char *const *p = s->parts; *p; p++) {
            if (p != s->parts)
                sleep_ms(30);
            srv_send(fd, *p, strlen(*p));
        }
        if (s->close_after)
            return;
    }
}

/* Reads the request and never answers. */
static void serve_silent(struct server *s, int fd)
{
    struct http_msg *m = read_request(s, fd);
    if (m)
        done_with(s, m);
    await_close(s, fd);
}

/* Reads the request and closes. */
static void serve_close(struct server *s, int fd)
{
    struct http_msg *m = read_request(s, fd);
    if (m)
        done_with(s, m);
}

/* Reads a little of the request and closes (with s->reset: a reset). */
static void serve_read_little(struct server *s, int fd)
{
    char buf[1024];
    if (srv_recv(s, fd, buf, sizeof buf) > 0)
        atomic_fetch_add(&s->requests, 1); /* counts requests begun, here */
}

/* Accepts and never reads, until told to stop: the client's socket fills. */
static void serve_never_read(struct server *s, int fd)
{
    (void)fd;
    atomic_fetch_add(&s->requests, 1); /* counts connections held, here */
    while (!atomic_load(&s->stop))
        sleep_ms(10);
}

/* Each request answered with the length of its body. */
static void serve_body_length(struct server *s, int fd)
{
    struct http_msg *m;
    while ((m = read_request(s, fd)) != NULL) {
        char out[128];
        char len[32];
        snprintf(len, sizeof len, "%zu", m->body_len);
        int n = snprintf(out, sizeof out, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
                         strlen(len), len);
        srv_send(fd, out, (size_t)n);
        http_msg_free(m);
    }
}

/* Each request answered 50 ms later with its target as the body. */
static void serve_echo_later(struct server *s, int fd)
{
    struct http_msg *m;
    while ((m = read_request(s, fd)) != NULL) {
        char out[512];
        sleep_ms(50);
        int n = snprintf(out, sizeof out, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s",
                         strlen(m->target), m->target);
        srv_send(fd, out, (size_t)n);
        done_with(s, m);
    }
}

static void *conn_main(void *arg)
{
    struct conn *c = arg;
    struct server *s = c->s;
    s->handle(s, s->conn_fd[c->i]);
    pthread_mutex_lock(&s->mu);
    if (s->reset) {
        struct linger now = {.l_onoff = 1, .l_linger = 0};
        setsockopt(s->conn_fd[c->i], SOL_SOCKET, SO_LINGER, &now, sizeof now);
    }
    close(s->conn_fd[c->i]);
    s->conn_fd[c->i] = -1;
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add(&s->closed, 1);
    free(c);
    return NULL;
}

static void *acceptor_main(void *arg)
{
    struct server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd pfd = {.fd = s->lfd, .events = POLLIN};
        if (poll(&pfd, 1, 20) <= 0)
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        atomic_fetch_add(&s->accepts, 1);
        pthread_mutex_lock(&s->mu);
        struct conn *c = malloc(sizeof *c);
        if (s->nconns == MAX_CONNS || !c) {
            free(c);
            close(fd);
        } else {
            *c = (struct conn){.s = s, .i = s->nconns++};
            s->conn_fd[c->i] = fd;
            pthread_create(&s->conn_thread[c->i], NULL, conn_main, c);
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* A socket on a loopback port of its own; listening if asked. */
static int loopback_socket(int listening, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (listening)
        assert_int_equal(listen(fd, 128), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static void server_start(struct server *s, void (*handle)(struct server *, int))
{
    s->handle = handle;
    pthread_mutex_init(&s->mu, NULL);
    s->lfd = loopback_socket(1, &s->port);
    assert_int_equal(pthread_create(&s->acceptor, NULL, acceptor_main, s), 0);
}

static void server_stop(struct server *s)
{
    atomic_store(&s->stop, 1);
    pthread_join(s->acceptor, NULL);
    pthread_mutex_lock(&s->mu);
    int n = s->nconns;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
        pthread_join(s->conn_thread[i], NULL);
    close(s->lfd);
    http_msg_free(s->first);
    pthread_mutex_destroy(&s->mu);
}

/* ---- the client side ------------------------------------------------------ */

struct fixture {
    struct event_base *base;
    struct upstream_loop *ul;
    struct server srv;
    int started;
};

struct done_rec {
    int calls;
    enum upstream_result r;
    struct http_msg *resp;
    char detail[256];
    int64_t ms; /* how long the call took */
};

static void on_done(void *arg, enum upstream_result r, struct http_msg *resp, const char *detail)
{
    struct done_rec *d = arg;
    d->calls++;
    d->r = r;
    d->resp = resp;
    snprintf(d->detail, sizeof d->detail, "%s", detail);
}

static void on_nothing(evutil_socket_t fd, short what, void *arg)
{
}

/* Run the loop until *count reaches want, for limit_ms at the most. */
static void run_until(struct event_base *base, const int *count, int want, int64_t limit_ms)
{
    struct event *wake = event_new(base, -1, EV_PERSIST, on_nothing, NULL);
    struct timeval tv = {.tv_usec = 10000};
    assert_non_null(wake);
    event_add(wake, &tv);
    int64_t end = test_mono_ms() + limit_ms;
    while ((!count || *count < want) && test_mono_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    event_free(wake);
}

static void run_for(struct event_base *base, int64_t ms)
{
    run_until(base, NULL, 0, ms);
}

/* upstream_call_start() to HOST:port: the addresses looked up, handed to
 * the call, and dropped here at once (the call keeps its own reference). */
static struct upstream_call *start_call(struct upstream_loop *ul, int port,
                                        const struct upstream_request *rq,
                                        upstream_done_fn done, void *arg)
{
    char detail[256];
    struct upstream_addrs *to = upstream_resolve(HOST, port, 0, detail, sizeof detail);
    assert_non_null(to);
    struct upstream_call *c = upstream_call_start(ul, to, rq, done, arg);
    upstream_addrs_put(to);
    return c;
}

/* Wait (the loop running) until the server's counter reaches want. */
static void await_server(struct fixture *f, atomic_int *counter, int want)
{
    int64_t end = test_mono_ms() + 5000;
    while (atomic_load(counter) < want && test_mono_ms() < end)
        run_for(f->base, 10);
    assert_int_equal(atomic_load(counter), want);
}

/* One exchange with port, through the fixture's client. */
static struct done_rec call_port(struct fixture *f, int port, const struct upstream_request *rq)
{
    struct done_rec d = {0};
    int64_t t0 = test_mono_ms();
    struct upstream_call *c = start_call(f->ul, port, rq, on_done, &d);
    assert_non_null(c);
    assert_int_equal(d.calls, 0); /* never from inside start */
    run_until(f->base, &d.calls, 1, rq->timeout_ms + 10000);
    assert_int_equal(d.calls, 1);
    d.ms = test_mono_ms() - t0;
    if (d.r == UPSTREAM_OK)
        assert_non_null(d.resp);
    else
        assert_null(d.resp);
    return d;
}

static struct done_rec call(struct fixture *f, const struct upstream_request *rq)
{
    return call_port(f, f->srv.port, rq);
}

/* One exchange that must be OK: the response, the caller's to free. */
static struct http_msg *call_ok(struct fixture *f, const struct upstream_request *rq)
{
    struct done_rec d = call(f, rq);
    assert_result(d.r, UPSTREAM_OK, d.detail);
    return d.resp;
}

static const struct upstream_request get_rq = {
    .method = "GET",
    .target = "/",
    .timeout_ms = 5000,
    .response_max = 1024,
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    f->base = event_base_new();
    f->ul = upstream_loop_new(f->base, NULL);
    assert_non_null(f->base);
    assert_non_null(f->ul);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    upstream_loop_free(f->ul);
    event_base_free(f->base);
    if (f->started)
        server_stop(&f->srv);
    free(f);
    return 0;
}

static void start(struct fixture *f, void (*handle)(struct server *, int),
                  const char *const *parts, int close_after)
{
    f->srv.parts = parts;
    f->srv.close_after = close_after;
    server_start(&f->srv, handle);
    f->started = 1;
}

/* ---- the cases ------------------------------------------------------------ */

/* A client's request as the front parses it, whole. */
static struct http_msg *parsed_request(const char *raw, size_t len)
{
    struct http_parser p;
    http_parser_init(&p, HTTP_PARSE_REQUEST, NULL);
    size_t used;
    assert_int_equal(http_parser_feed(&p, raw, len, &used), HTTP_DONE);
    struct http_msg *m = http_parser_take(&p);
    http_parser_free(&p);
    return m;
}

/* 1. A 201 with a body comes back whole; the server received the method,
 * target, forwarded headers (not the hop-by-hop ones, not Host), the
 * X-Forwarded-For chain, the extra headers, Content-Length and body. Every
 * string the request points to is freed right after the call starts. */
static void ok_and_request_as_sent(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {
        "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nX-Up: yes\r\n\r\nhello", NULL};
    start(f, serve_parts, answer, 0);

    static const char raw[] = "POST /in HTTP/1.1\r\nHost: front.example\r\nX-Custom: a\r\n"
                              "X-Forwarded-For: 10.0.0.1\r\nConnection: keep-alive, X-Drop\r\n"
                              "X-Drop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 7\r\n\r\n"
                              "{\"a\":1}";
    struct http_msg *original = parsed_request(raw, sizeof raw - 1);
    char *method = strdup("POST"), *target = strdup("/refunds?x=1");
    char *peer = strdup("192.0.2.7:5555");
    char *e1 = strdup("Idem-Key: s/k1"), *e2 = strdup("Idem-Epoch: 3");
    const char **extra = calloc(3, sizeof *extra);
    extra[0] = e1;
    extra[1] = e2;
    struct upstream_request *rq = calloc(1, sizeof *rq);
    *rq = (struct upstream_request){.method = method, .target = target, .original = original,
                                    .peer = peer, .extra = extra, .timeout_ms = 5000,
                                    .response_max = 1024};

    struct done_rec d = {0};
    struct upstream_call *c = start_call(f->ul, f->srv.port, rq, on_done, &d);
    assert_non_null(c);
    assert_int_equal(d.calls, 0);
    free(method);
    free(target);
    free(peer);
    free(e1);
    free(e2);
    free(extra);
    free(rq);
    http_msg_free(original);
    run_until(f->base, &d.calls, 1, 10000);
    assert_int_equal(d.calls, 1);

    assert_result(d.r, UPSTREAM_OK, d.detail);
    assert_int_equal(d.resp->status, 201);
    assert_string_equal(d.resp->reason, "Created");
    assert_int_equal(d.resp->body_len, 5);
    assert_string_equal(d.resp->body, "hello");
    assert_string_equal(http_msg_header(d.resp, "X-Up"), "yes");
    http_msg_free(d.resp);

    struct http_msg *got = f->srv.first;
    char host[64];
    snprintf(host, sizeof host, HOST ":%d", f->srv.port);
    assert_non_null(got);
    assert_string_equal(got->method, "POST");
    assert_string_equal(got->target, "/refunds?x=1");
    assert_string_equal(http_msg_header(got, "Host"), host);
    assert_int_equal(http_msg_header_count(got, "Host"), 1);
    assert_string_equal(http_msg_header(got, "X-Custom"), "a");
    assert_string_equal(http_msg_header(got, "X-Forwarded-For"), "10.0.0.1, 192.0.2.7");
    assert_int_equal(http_msg_header_count(got, "X-Forwarded-For"), 1);
    assert_null(http_msg_header(got, "X-Drop"));
    assert_null(http_msg_header(got, "Keep-Alive"));
    assert_null(http_msg_header(got, "Connection"));
    assert_string_equal(http_msg_header(got, "Idem-Key"), "s/k1");
    assert_string_equal(http_msg_header(got, "Idem-Epoch"), "3");
    assert_string_equal(http_msg_header(got, "Content-Length"), "7");
    assert_int_equal(http_msg_header_count(got, "Content-Length"), 1);
    assert_int_equal(got->body_len, 7);
    assert_string_equal(got->body, "{\"a\":1}");
}

/* The client as proxies say it: X-Forwarded-Host and -Proto set by idem
 * (the client's own dropped), Forwarded with the client's elements first
 * and an IPv6 address in brackets, quoted; Host the client's with
 * pass_host. */
static void forwarded_and_pass_host(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    start(f, serve_parts, answer, 0);
    static const char raw[] = "POST /in HTTP/1.1\r\nHost: shop.example:8443\r\n"
                              "X-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: http\r\n"
                              "X_Forwarded_Proto: http\r\nForwarded: for=10.0.0.1\r\n"
                              "Content-Length: 0\r\n\r\n";
    struct http_msg *original = parsed_request(raw, sizeof raw - 1);
    struct upstream_request rq = {.method = "POST", .target = "/in", .original = original,
                                  .peer = "2001:db8::7:5555", .proto = "https", .pass_host = 1,
                                  .timeout_ms = 5000, .response_max = 1024};
    http_msg_free(call_ok(f, &rq));
    struct http_msg *got = f->srv.first; /* without pass_host: ok_and_request_as_sent */
    assert_string_equal(http_msg_header(got, "Host"), "shop.example:8443");
    assert_int_equal(http_msg_header_count(got, "Host"), 1);
    assert_string_equal(http_msg_header(got, "X-Forwarded-Host"), "shop.example:8443");
    assert_int_equal(http_msg_header_count(got, "X-Forwarded-Host"), 1);
    assert_string_equal(http_msg_header(got, "X-Forwarded-Proto"), "https");
    assert_int_equal(http_msg_header_alike_count(got, "X-Forwarded-Proto"), 1);
    assert_string_equal(http_msg_header(got, "Forwarded"),
                        "for=10.0.0.1, proto=https;host=\"shop.example:8443\";"
                        "for=\"[2001:db8::7]\"");
    assert_string_equal(http_msg_header(got, "X-Forwarded-For"), "2001:db8::7");
    http_msg_free(original);
}

/* Two calls in a row against a server answering each request with answer
 * (closing after it if close_after): both OK, with the body "ok". */
static void two_calls_ok(struct fixture *f, const char *const *answer, int close_after)
{
    start(f, serve_parts, answer, close_after);
    for (int i = 0; i < 2; i++) {
        struct http_msg *resp = call_ok(f, &get_rq);
        assert_string_equal(resp->body, "ok");
        http_msg_free(resp);
    }
    assert_int_equal(atomic_load(&f->srv.requests), 2);
}

/* 2. Two sequential calls share one connection while the server keeps it
 * alive ... */
static void keep_alive_reuses(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    two_calls_ok(f, answer, 0);
    assert_int_equal(atomic_load(&f->srv.accepts), 1);
}

/* ... and two connections when it answers Connection: close. */
static void connection_close_not_reused(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {
        "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", NULL};
    two_calls_ok(f, answer, 1);
    assert_int_equal(atomic_load(&f->srv.accepts), 2);
}

/* Bytes after the answer: the answer is fine, the connection is not. */
static void stray_bytes_not_reused(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokJUNK",
                                         NULL};
    two_calls_ok(f, answer, 0);
    assert_int_equal(atomic_load(&f->srv.accepts), 2);
}

/* A HEAD answer has no body, whatever its Content-Length says; the
 * connection does not carry the next request, since an upstream that sent
 * the body anyway, a moment later, would have it read as the next answer. */
static void head_has_no_body(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", NULL};
    start(f, serve_parts, answer, 0);
    struct upstream_request rq = get_rq;
    rq.method = "HEAD";
    rq.timeout_ms = 2000;
    for (int i = 0; i < 2; i++) {
        struct http_msg *resp = call_ok(f, &rq);
        assert_int_equal(resp->body_len, 0);
        http_msg_free(resp);
    }
    assert_int_equal(atomic_load(&f->srv.accepts), 2);
}

/* A 204 that gives a length, then sends that body a moment later: the
 * body must not be read as the next request's answer. Each call gets a
 * connection of its own and the upstream's own answer. A plain 204 leaves
 * the connection reusable. */
static void bodiless_with_length_not_reused(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {
        "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", "HELLO", NULL};
    start(f, serve_parts, answer, 0);
    for (int i = 0; i < 3; i++) {
        sleep_ms(10); /* the body comes 30 ms after the head: call in between */
        struct http_msg *resp = call_ok(f, &get_rq);
        assert_int_equal(resp->status, 204);
        http_msg_free(resp);
    }
    assert_int_equal(atomic_load(&f->srv.accepts), 3);
}

static void bodiless_plain_reused(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 204 No Content\r\n\r\n", NULL};
    start(f, serve_parts, answer, 0);
    for (int i = 0; i < 2; i++) {
        struct http_msg *resp = call_ok(f, &get_rq);
        assert_int_equal(resp->status, 204);
        http_msg_free(resp);
    }
    assert_int_equal(atomic_load(&f->srv.accepts), 1);
}

/* 3. Nothing listening: refused, NOT_SENT. */
static void refused_not_sent(void **state)
{
    struct fixture *f = *state;
    int port, fd = loopback_socket(0, &port); /* bound, not listening */
    struct done_rec d = call_port(f, port, &get_rq);
    close(fd);
    assert_result(d.r, UPSTREAM_NOT_SENT, d.detail);
    assert_non_null(strstr(d.detail, "connect"));
}

/* Host names are looked up by upstream_resolve(), before any call: a name
 * that resolves is called like its address, and the call keeps the
 * addresses it was given after the caller drops them; a name that does not
 * resolve is refused there, named, and no call can start with it. */
static void names_looked_up_first(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                                         NULL};
    start(f, serve_parts, answer, 0);
    char detail[256];
    struct upstream_addrs *to = upstream_resolve("localhost", f->srv.port, 0, detail, sizeof detail);
    assert_non_null(to);
    struct done_rec d = {0};
    assert_non_null(upstream_call_start(f->ul, to, &get_rq, on_done, &d));
    upstream_addrs_put(to);
    run_until(f->base, &d.calls, 1, 10000);
    assert_int_equal(d.calls, 1);
    assert_result(d.r, UPSTREAM_OK, d.detail);
    assert_int_equal(d.resp->status, 200);
    http_msg_free(d.resp);

    detail[0] = '\0';
    assert_null(upstream_resolve("no-such-host.invalid", 80, 0, detail, sizeof detail));
    assert_non_null(strstr(detail, "upstream no-such-host.invalid:80: "));
}

/* A result known inside upstream_call_start (no time left to connect)
 * still comes later, from the loop; and a call cancelled before that never
 * calls back. */
static void decided_at_start_comes_later(void **state)
{
    struct fixture *f = *state;
    start(f, serve_silent, NULL, 0);
    struct upstream_request rq = get_rq;
    rq.timeout_ms = 0;
    struct done_rec d = {0};
    assert_non_null(start_call(f->ul, f->srv.port, &rq, on_done, &d));
    assert_int_equal(d.calls, 0);
    run_until(f->base, &d.calls, 1, 5000);
    assert_int_equal(d.calls, 1);
    assert_result(d.r, UPSTREAM_NOT_SENT, d.detail);

    struct done_rec never = {0};
    struct upstream_call *c = start_call(f->ul, f->srv.port, &rq, on_done, &never);
    assert_non_null(c);
    upstream_call_cancel(c);
    run_for(f->base, 50);
    assert_int_equal(never.calls, 0);
    assert_int_equal(atomic_load(&f->srv.requests), 0);
}

/* 4. Read and never answered: TIMEOUT at the timeout, not before, and the
 * connection is closed. */
static void silent_times_out(void **state)
{
    struct fixture *f = *state;
    start(f, serve_silent, NULL, 0);
    struct upstream_request rq = get_rq;
    rq.timeout_ms = 300;
    struct done_rec d = call(f, &rq);
    assert_result(d.r, UPSTREAM_TIMEOUT, d.detail);
    if (d.ms < 300 || d.ms > 2300)
        fail_msg("timed out after %lld ms, for a timeout of 300 ms", (long long)d.ms);
    assert_int_equal(atomic_load(&f->srv.requests), 1);
    await_server(f, &f->srv.closes, 1);
}

/* 5. Read, then closed without an answer: may have executed. */
static void closed_after_read_unknown(void **state)
{
    struct fixture *f = *state;
    start(f, serve_close, NULL, 0);
    struct done_rec d = call(f, &get_rq);
    assert_result(d.r, UPSTREAM_UNKNOWN, d.detail);
    assert_int_equal(atomic_load(&f->srv.requests), 1);
}

/* 6. A body over response_max, by length or chunked: TOO_BIG. */
static void body_over_limit_too_big(void **state)
{
    struct fixture *f = *state;
    static char big[512];
    static const char *const answer[] = {big, NULL};
    snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n%0100d", 0);
    start(f, serve_parts, answer, 0);
    struct upstream_request rq = get_rq;
    rq.response_max = 10;
    struct done_rec d = call(f, &rq);
    assert_result(d.r, UPSTREAM_TOO_BIG, d.detail);

    snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                              "8\r\n12345678\r\n8\r\n12345678\r\n0\r\n\r\n");
    d = call(f, &rq);
    assert_result(d.r, UPSTREAM_TOO_BIG, d.detail);
    /* Ten bytes exactly is within the limit. */
    snprintf(big, sizeof big, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789");
    http_msg_free(call_ok(f, &rq));
}

/* 6b. A head over the limits is an answer too, only too big to keep:
 * TOO_BIG (the upstream executed), never UNKNOWN, which would have the
 * gateway let a retry execute again. At the limits it is an answer. */
static void head_over_limits_too_big(void **state)
{
    struct fixture *f = *state;
    static char *answer[2];
    size_t cap = UPSTREAM_HEAD_BYTES_MAX + 4096;
    char *a = answer[0] = malloc(cap);
    assert_non_null(a);
    start(f, serve_parts, (const char *const *)answer, 0);
    struct upstream_request rq = get_rq;
    rq.timeout_ms = 5000;
    for (int fields = UPSTREAM_HEAD_FIELDS_MAX; fields <= UPSTREAM_HEAD_FIELDS_MAX + 1; fields++) {
        size_t n = (size_t)snprintf(a, cap, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n");
        for (int i = 1; i < fields; i++)
            n += (size_t)snprintf(a + n, cap - n, "X-F%d: v\r\n", i);
        snprintf(a + n, cap - n, "\r\nok");
        struct done_rec d = call(f, &rq);
        assert_result(d.r, fields > UPSTREAM_HEAD_FIELDS_MAX ? UPSTREAM_TOO_BIG : UPSTREAM_OK,
                      d.detail);
        http_msg_free(d.resp);
    }
    /* One field that takes the head past the byte limit. */
    size_t n = (size_t)snprintf(a, cap, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\nX-Big: ");
    memset(a + n, 'v', UPSTREAM_HEAD_BYTES_MAX + 100);
    snprintf(a + n + UPSTREAM_HEAD_BYTES_MAX + 100, cap - n - UPSTREAM_HEAD_BYTES_MAX - 100,
             "\r\n\r\nok");
    struct done_rec d = call(f, &rq);
    assert_result(d.r, UPSTREAM_TOO_BIG, d.detail);
    assert_non_null(strstr(d.detail, "bytes"));
    server_stop(&f->srv); /* before its answer goes */
    f->started = 0;
    free(a);
    answer[0] = NULL;
}

/* 7. 1xx answers are skipped, in the same read as each other and in a
 * read of their own. */
static void informational_skipped(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    start(f, serve_parts, answer, 0);
    struct http_msg *resp = call_ok(f, &get_rq);
    assert_int_equal(resp->status, 200);
    assert_string_equal(resp->body, "ok");
    http_msg_free(resp);
}

/* 8. The server closes a pooled connection while it idles: the next call
 * goes out on a fresh connection, OK (not UNKNOWN on the dead one). */
static void idle_closed_by_server_fresh(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    start(f, serve_parts, answer, 1); /* keep-alive answered, then closed */
    http_msg_free(call_ok(f, &get_rq));
    await_server(f, &f->srv.closed, 1);
    run_for(f->base, 100);

    http_msg_free(call_ok(f, &get_rq));
    assert_int_equal(atomic_load(&f->srv.accepts), 2);
}

/* The server resets a pooled connection and the loop has not run since, so
 * nothing has noticed: the send fails before its first byte, and the call
 * goes out on a fresh connection, OK. */
static void idle_reset_unseen_retried(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    f->srv.reset = 1;
    start(f, serve_parts, answer, 1);
    http_msg_free(call_ok(f, &get_rq));
    for (int i = 0; i < 500 && atomic_load(&f->srv.closed) < 1; i++)
        sleep_ms(10); /* the loop is not run: its idle watch cannot see the reset */
    assert_int_equal(atomic_load(&f->srv.closed), 1);
    sleep_ms(50);

    http_msg_free(call_ok(f, &get_rq));
    assert_int_equal(atomic_load(&f->srv.accepts), 2);
    assert_int_equal(atomic_load(&f->srv.requests), 2);
}

/* A POST with a body much larger than the socket buffers: it goes out in
 * many writes. */
#define BIG_BODY (16u << 20)
/* A message to forward with a BIG_BODY body; free with http_msg_free. */
static struct http_msg *big_message(void)
{
    struct http_msg *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->body = malloc(BIG_BODY + 1);
    assert_non_null(m->body);
    memset(m->body, 'x', BIG_BODY);
    m->body[BIG_BODY] = '\0';
    m->body_len = BIG_BODY;
    return m;
}

static struct done_rec call_big(struct fixture *f)
{
    struct http_msg *m = big_message();
    struct upstream_request rq = get_rq;
    rq.method = "POST";
    rq.original = m;
    rq.timeout_ms = 20000;
    struct done_rec d = call(f, &rq);
    http_msg_free(m);
    return d;
}

/* It arrives whole ... */
static void big_request_whole(void **state)
{
    struct fixture *f = *state;
    start(f, serve_body_length, NULL, 0);
    struct done_rec d = call_big(f);
    assert_result(d.r, UPSTREAM_OK, d.detail);
    struct http_msg *resp = d.resp;
    char want[32];
    snprintf(want, sizeof want, "%u", BIG_BODY);
    assert_string_equal(resp->body, want);
    http_msg_free(resp);
}

/* ... and when the server resets the connection after reading its first
 * bytes, the request may have been read: UNKNOWN, not NOT_SENT. */
static void reset_mid_send_unknown(void **state)
{
    struct fixture *f = *state;
    f->srv.reset = 1;
    start(f, serve_read_little, NULL, 0);
    struct done_rec d = call_big(f);
    assert_result(d.r, UPSTREAM_UNKNOWN, d.detail);
    assert_int_equal(atomic_load(&f->srv.requests), 1);
}

/* 9. A chunked body, in parts, comes back whole. */
static void chunked_reassembled(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "lo\r\n6\r\n world\r\n",
        "0\r\n\r\n", NULL};
    start(f, serve_parts, answer, 0);
    struct http_msg *resp = call_ok(f, &get_rq);
    assert_int_equal(resp->chunked, 1);
    assert_int_equal(resp->body_len, 11);
    assert_string_equal(resp->body, "hello world");
    http_msg_free(resp);
}

/* 10. Cancelled while the server holds the request: done never runs, the
 * server sees the connection close. Cancelled before anything happened:
 * the same. */
static void cancel_mid_flight(void **state)
{
    struct fixture *f = *state;
    start(f, serve_silent, NULL, 0);
    struct done_rec d = {0};
    struct upstream_call *c = start_call(f->ul, f->srv.port, &get_rq, on_done, &d);
    assert_non_null(c);
    await_server(f, &f->srv.requests, 1);
    upstream_call_cancel(c);
    await_server(f, &f->srv.closes, 1);

    c = start_call(f->ul, f->srv.port, &get_rq, on_done, &d);
    assert_non_null(c);
    upstream_call_cancel(c);
    run_for(f->base, 200);
    assert_int_equal(d.calls, 0);
}

/* ... and while the request does not fit in the socket (the upstream reads
 * nothing, the call waits to write, its connection's read event off):
 * cancelling it frees everything, and done never runs. */
static void cancel_while_socket_full(void **state)
{
    struct fixture *f = *state;
    start(f, serve_never_read, NULL, 0);
    struct http_msg *m = big_message();
    struct upstream_request rq = get_rq;
    rq.method = "POST";
    rq.original = m;
    struct done_rec d = {0};
    struct upstream_call *c = start_call(f->ul, f->srv.port, &rq, on_done, &d);
    http_msg_free(m);
    assert_non_null(c);
    await_server(f, &f->srv.requests, 1);
    run_for(f->base, 200); /* the socket is full by now: the call waits to write */
    assert_int_equal(d.calls, 0);
    upstream_call_cancel(c);
    run_for(f->base, 100);
    assert_int_equal(d.calls, 0);
}

/* 11. 64 calls at once on one loop, each answered after a delay: each gets
 * its own answer. Each done starts a second call from inside the callback;
 * those find the 64 connections in the pool, so nothing more is accepted. */
#define NCALLS 64
struct many {
    struct fixture *f;
    struct done_rec rec[2][NCALLS];
    char target[NCALLS][32];
    int done;
};
struct many_arg {
    struct many *m;
    int wave, i;
};
static struct many_arg many_args[2][NCALLS];

static void on_many_done(void *arg, enum upstream_result r, struct http_msg *resp,
                         const char *detail)
{
    struct many_arg *a = arg;
    struct many *m = a->m;
    on_done(&m->rec[a->wave][a->i], r, resp, detail);
    m->done++;
    if (a->wave == 0) {
        struct upstream_request rq = get_rq;
        rq.target = m->target[a->i];
        struct upstream_call *c = start_call(m->f->ul, m->f->srv.port, &rq,
                                                      on_many_done, &many_args[1][a->i]);
        if (!c) /* counted, so the wait ends; the check of rec[1] fails */
            m->done++;
    }
}

static void many_at_once(void **state)
{
    struct fixture *f = *state;
    start(f, serve_echo_later, NULL, 0);
    static struct many m;
    memset(&m, 0, sizeof m);
    m.f = f;
    for (int i = 0; i < NCALLS; i++) {
        snprintf(m.target[i], sizeof m.target[i], "/n/%d", i);
        for (int w = 0; w < 2; w++)
            many_args[w][i] = (struct many_arg){.m = &m, .wave = w, .i = i};
        struct upstream_request rq = get_rq;
        rq.target = m.target[i];
        assert_non_null(
            start_call(f->ul, f->srv.port, &rq, on_many_done, &many_args[0][i]));
    }
    run_until(f->base, &m.done, 2 * NCALLS, 20000);
    assert_int_equal(m.done, 2 * NCALLS);
    for (int w = 0; w < 2; w++) {
        for (int i = 0; i < NCALLS; i++) {
            struct done_rec *d = &m.rec[w][i];
            assert_int_equal(d->calls, 1);
            assert_result(d->r, UPSTREAM_OK, d->detail);
            assert_string_equal(d->resp->body, m.target[i]);
            http_msg_free(d->resp);
        }
    }
    assert_int_equal(atomic_load(&f->srv.requests), 2 * NCALLS);
    assert_int_equal(atomic_load(&f->srv.accepts), NCALLS);
}

/* A loop keeps at most 64 idle connections per upstream: after 70 calls at
 * once, 70 more find 64 in the pool and open 6. */
static void pool_keeps_64(void **state)
{
    struct fixture *f = *state;
    start(f, serve_echo_later, NULL, 0);
    enum { N = 70 };
    static struct done_rec rec[N];
    int done = 0;
    for (int wave = 0; wave < 2; wave++) {
        memset(rec, 0, sizeof rec);
        for (int i = 0; i < N; i++)
            assert_non_null(
                start_call(f->ul, f->srv.port, &get_rq, on_done, &rec[i]));
        done = 0;
        int64_t end = test_mono_ms() + 20000;
        while (done < N && test_mono_ms() < end) {
            run_for(f->base, 10);
            done = 0;
            for (int i = 0; i < N; i++)
                done += rec[i].calls;
        }
        assert_int_equal(done, N);
        for (int i = 0; i < N; i++) {
            assert_result(rec[i].r, UPSTREAM_OK, rec[i].detail);
            http_msg_free(rec[i].resp);
        }
    }
    assert_int_equal(atomic_load(&f->srv.accepts), N + (N - 64));
}

/* upstream_loop_free with connections in its pool closes them; NULL is a no-op. */
static void loop_free_closes_idle(void **state)
{
    struct fixture *f = *state;
    static const char *const answer[] = {"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", NULL};
    start(f, serve_parts, answer, 0);
    http_msg_free(call_ok(f, &get_rq));
    upstream_loop_free(f->ul);
    f->ul = NULL;
    upstream_loop_free(NULL);
    upstream_call_cancel(NULL);
    await_server(f, &f->srv.closed, 1);
}

#define LOOP(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
    /* no-such-host.invalid fails in a second where DNS is unreachable. */
    setenv("RES_OPTIONS", "timeout:1 attempts:1", 1);
    const struct CMUnitTest tests[] = {
        LOOP(ok_and_request_as_sent),
        LOOP(forwarded_and_pass_host),
        LOOP(keep_alive_reuses),
        LOOP(connection_close_not_reused),
        LOOP(stray_bytes_not_reused),
        LOOP(head_has_no_body),
        LOOP(refused_not_sent),
        LOOP(names_looked_up_first),
        LOOP(decided_at_start_comes_later),
        LOOP(silent_times_out),
        LOOP(closed_after_read_unknown),
        LOOP(head_over_limits_too_big),
        LOOP(bodiless_with_length_not_reused),
        LOOP(bodiless_plain_reused),
        LOOP(body_over_limit_too_big),
        LOOP(informational_skipped),
        LOOP(idle_closed_by_server_fresh),
        LOOP(idle_reset_unseen_retried),
        LOOP(chunked_reassembled),
        LOOP(big_request_whole),
        LOOP(reset_mid_send_unknown),
        LOOP(cancel_mid_flight),
        LOOP(cancel_while_socket_full),
        LOOP(many_at_once),
        LOOP(pool_keeps_64),
        LOOP(loop_free_closes_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
