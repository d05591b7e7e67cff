/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exchange.c — how idem verify sends: every request on a connection of its
 * own (Connection: close), so duplicates are as independent as requests from
 * different clients, and read back with the daemon's strict response parser
 * (server/http/http_parser.c), so an answer the gateway would call malformed is
 * malformed here too.
 *
 * The starting gun (xchg_gun) is the point of `burst`: a thread per request
 * opens its connection first and waits; when every connection is open, one
 * broadcast releases them all, so the requests reach the server within
 * microseconds of each other instead of trickling in as connections are
 * made. Threads whose connection failed still report in, so the gun never
 * waits for a thread that cannot come.
 */
#include "exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http/http_parser.h"
#include "http/tls.h"
#include "idem.h"
#include "mono.h"

#define THREAD_STACK (256 * 1024)

static const struct http_limits answer_limits = {
    .request_line_max = 8192,    /* the status line */
    .header_count_max = 256,
    .header_bytes_max = 256 * 1024,
    .body_max = 16 * 1024 * 1024,
};

int64_t xchg_now_us(void)
{
    return mono_us();
}

void xchg_sleep_ms(int64_t ms)
{
    if (ms <= 0)
        return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int has_header(const struct xchg_header *h, size_t nh, const char *name)
{
    for (size_t i = 0; i < nh; i++)
        if (strcasecmp(h[i].name, name) == 0)
            return 1;
    return 0;
}

char *xchg_build(const char *method, const struct vurl *u, const char *target,
                 const struct xchg_header *h, size_t nh, const char *body, size_t body_len,
                 int has_body, size_t *len)
{
    int need_length = has_body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
                      strcmp(method, "PATCH") == 0;
    size_t cap = strlen(method) + strlen(target) + strlen(u->authority) + 160 + body_len;
    for (size_t i = 0; i < nh; i++)
        cap += strlen(h[i].name) + strlen(h[i].value) + 4;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    o += sprintf(o, "%s %s HTTP/1.1\r\n", method, target);
    if (!has_header(h, nh, "Host"))
        o += sprintf(o, "Host: %s\r\n", u->authority);
    if (!has_header(h, nh, "User-Agent"))
        o += sprintf(o, "User-Agent: idem-verify/%s\r\n", idem_version());
    for (size_t i = 0; i < nh; i++)
        o += sprintf(o, "%s: %s\r\n", h[i].name, h[i].value);
    if (need_length)
        o += sprintf(o, "Content-Length: %zu\r\n", has_body ? body_len : 0);
    o += sprintf(o, "Connection: close\r\n\r\n");
    if (has_body && body_len) {
        memcpy(o, body, body_len);
        o += body_len;
    }
    *len = (size_t)(o - out);
    return out;
}

/* ---- TLS (https://) ---- */

static SSL_CTX *tls_ctx; /* set by xchg_tls_init, before the shots' threads */

int xchg_tls_init(const char *ca_file, const char *cert, const char *key, char *err,
                  size_t errlen)
{
    /* The daemon's own client context for https:// upstreams (TLS 1.2 or
     * later, its ciphers, certificates verified), with a certificate of
     * the client's own when given. */
    SSL_CTX *ctx = tls_client_ctx(ca_file, err, errlen);
    if (ctx && cert && tls_ctx_use_cert(ctx, cert, key, err, errlen) != 0) {
        tls_client_ctx_free(ctx);
        ctx = NULL;
    }
    tls_ctx = ctx;
    return ctx ? 0 : -1;
}

void xchg_tls_free(void)
{
    tls_client_ctx_free(tls_ctx);
    tls_ctx = NULL;
}

/* A connection: its socket, and its TLS when the URL is https://. */
struct conn {
    int fd;
    SSL *ssl;
};

static void conn_close(struct conn *k)
{
    if (k->ssl)
        SSL_free(k->ssl); /* no close_notify: Connection: close ends it anyway */
    if (k->fd >= 0)
        close(k->fd);
    k->ssl = NULL;
    k->fd = -1;
}

/* Wait for ev on k until deadline: 0, or -1 when it passed. */
static int conn_wait(const struct conn *k, short ev, int64_t deadline_us)
{
    int64_t left = (deadline_us - xchg_now_us()) / 1000;
    if (left <= 0)
        return -1;
    struct pollfd p = {.fd = k->fd, .events = ev};
    poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
    return 0;
}

/* What a TLS call's failure asks for: POLLIN or POLLOUT to try again, 0
 * for an error (its reason in err), -2 for the peer's end of the stream. */
static int tls_want(SSL *ssl, int r, char *err, size_t errlen)
{
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return POLLIN;
    if (e == SSL_ERROR_WANT_WRITE)
        return POLLOUT;
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 &&
                                       errno == 0))
        return -2; /* closed, with or without close_notify */
    char why[160];
    long v = SSL_get_verify_result(ssl);
    if (v == X509_V_OK)
        tls_error(why, sizeof why);
    snprintf(err, errlen, "TLS: %s", v != X509_V_OK ? X509_verify_cert_error_string(v) : why);
    return 0;
}

/* The TLS handshake on k with u's host checked against its certificate
 * (the daemon's rule for its upstreams: tls_client_ssl). */
static int tls_open(struct conn *k, const struct vurl *u, int64_t deadline_us, char *err,
                    size_t errlen)
{
    if (!tls_ctx) {
        snprintf(err, errlen, "TLS: not set up for %s", u->authority);
        return -1;
    }
    if (!(k->ssl = tls_client_ssl(tls_ctx, u->host)) || SSL_set_fd(k->ssl, k->fd) != 1) {
        snprintf(err, errlen, "TLS: %s: out of memory, or a host no certificate can name",
                 u->host);
        return -1;
    }
    for (;;) {
        ERR_clear_error();
        errno = 0;
        int r = SSL_connect(k->ssl);
        if (r == 1)
            return 0;
        int want = tls_want(k->ssl, r, err, errlen);
        if (want == -2)
            snprintf(err, errlen, "TLS: %s closed the connection in the handshake",
                     u->authority);
        if (want <= 0)
            return -1;
        if (conn_wait(k, (short)want, deadline_us) != 0) {
            snprintf(err, errlen, "TLS: no handshake with %s in time", u->authority);
            return -1;
        }
    }
}

/* Send or receive on k: bytes done; 0 at the peer's end (receiving); -1
 * with *want POLLIN or POLLOUT to wait for, or 0 and err on an error. */
static ssize_t conn_io(struct conn *k, int sending, void *buf, size_t len, int *want, char *err,
                       size_t errlen)
{
    *want = 0;
    if (!k->ssl) {
        ssize_t n = sending ? send(k->fd, buf, len, MSG_NOSIGNAL) : recv(k->fd, buf, len, 0);
        if (n >= 0)
            return n;
        if (errno == EINTR || errno == EAGAIN) {
            *want = sending ? POLLOUT : POLLIN;
            return -1;
        }
        snprintf(err, errlen, "%s: %s", sending ? "sending" : "reading", strerror(errno));
        return -1;
    }
    ERR_clear_error();
    errno = 0;
    int n = sending ? SSL_write(k->ssl, buf, (int)(len > INT32_MAX ? INT32_MAX : len))
                    : SSL_read(k->ssl, buf, (int)(len > INT32_MAX ? INT32_MAX : len));
    if (n > 0)
        return n;
    int w = tls_want(k->ssl, n, err, errlen);
    if (w == -2)
        return 0;
    *want = w;
    return -1;
}

/* A connected non-blocking socket (with TLS done for https://): 0, or -1
 * with the shot's error set. */
static int open_conn(const struct vurl *u, int64_t deadline_us, char *err, size_t errlen,
                     int *refused, struct conn *k)
{
    k->fd = -1;
    k->ssl = NULL;
    char addr[80];
    int fd = socket(u->addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, (const struct sockaddr *)&u->addr, u->addrlen);
    int e = rc == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
        for (;;) {
            int64_t left = (deadline_us - xchg_now_us()) / 1000;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (left <= 0) {
                e = ETIMEDOUT;
                break;
            }
            int pr = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
            if (pr < 0 && errno == EINTR)
                continue;
            if (pr < 0) {
                e = errno;
                break;
            }
            if (pr == 0)
                continue;
            socklen_t elen = sizeof e;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
                e = errno;
            break;
        }
    }
    if (e != 0) {
        snprintf(err, errlen, "cannot connect to %s: %s", vurl_addr_text(u, addr, sizeof addr),
                 e == ETIMEDOUT ? "timed out" : strerror(e));
        if (refused)
            *refused = e == ECONNREFUSED;
        close(fd);
        return -1;
    }
    k->fd = fd;
    if (u->tls && tls_open(k, u, deadline_us, err, errlen) != 0) {
        conn_close(k);
        return -1;
    }
    return 0;
}

int xchg_probe(const struct vurl *u, int timeout_ms, char *err, size_t errlen)
{
    struct conn k;
    if (open_conn(u, xchg_now_us() + (int64_t)timeout_ms * 1000, err, errlen, NULL, &k) != 0)
        return -1;
    conn_close(&k);
    return 0;
}

static int64_t shot_deadline(const struct xchg_ctx *c, const struct shot *s, int64_t from)
{
    int64_t d = from + (int64_t)s->timeout_ms * 1000;
    return c->deadline_us && c->deadline_us < d ? c->deadline_us : d;
}

static void take_answer(const struct xchg_ctx *c, struct shot *s, struct http_msg *m)
{
    s->outcome = SHOT_ANSWERED;
    s->status = m->status;
    s->body = http_msg_take_body(m, &s->body_len);
    for (size_t i = 0; i < c->nreplay && !s->replayed_by; i++) {
        const char *v = http_msg_header(m, c->replay_headers[i]);
        if (v && (strcasecmp(v, "true") == 0 || strcmp(v, "1") == 0 ||
                  strcasecmp(v, "yes") == 0))
            s->replayed_by = c->replay_headers[i];
    }
    const char *ra = http_msg_header(m, "Retry-After");
    s->retry_after_ms = -1;
    if (ra && *ra && strspn(ra, "0123456789") == strlen(ra) && strlen(ra) < 7)
        s->retry_after_ms = atol(ra) * 1000;
    http_msg_free(m);
}

/* Send the request on k and read the answer; closes k. */
static void exchange(const struct xchg_ctx *c, struct shot *s, struct conn *k)
{
    char buf[16384];
    struct http_parser p;
    http_parser_init(&p, HTTP_PARSE_RESPONSE, &answer_limits);
    p.response_to_head = s->head;
    s->sent_us = xchg_now_us();
    int64_t deadline = shot_deadline(c, s, s->sent_us);
    size_t off = 0;
    int want;
    while (off < s->request_len) {
        ssize_t n = conn_io(k, 1, s->request + off, s->request_len - off, &want, s->error,
                            sizeof s->error);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && want && conn_wait(k, (short)want, deadline) == 0)
            continue;
        if (n < 0 && want) {
            s->outcome = s->abandon ? SHOT_ABANDONED : SHOT_TIMEOUT;
            snprintf(s->error, sizeof s->error, "could not send within %d ms", s->timeout_ms);
        } else {
            s->outcome = SHOT_ERROR;
            if (n == 0)
                snprintf(s->error, sizeof s->error, "sending: the connection closed");
        }
        goto out;
    }
    for (;;) {
        ssize_t n = conn_io(k, 0, buf, sizeof buf, &want, s->error, sizeof s->error);
        if (n < 0 && want) {
            if (conn_wait(k, (short)want, deadline) == 0)
                continue;
            s->outcome = s->abandon ? SHOT_ABANDONED : SHOT_TIMEOUT;
            snprintf(s->error, sizeof s->error, "no whole answer within %d ms", s->timeout_ms);
            goto out;
        }
        enum http_parse_status st;
        size_t used = 0, at = 0;
        if (n < 0) {
            s->outcome = SHOT_ERROR;
            goto out;
        }
        if (n == 0) {
            st = http_parser_eof(&p);
            if (st != HTTP_DONE) {
                s->outcome = SHOT_ERROR;
                snprintf(s->error, sizeof s->error, "%s",
                         http_parser_in_message(&p) ? "the connection closed mid-answer"
                                                    : "the connection closed without an answer");
                goto out;
            }
        } else {
            st = http_parser_feed(&p, buf, (size_t)n, &used);
        }
        while (st == HTTP_DONE) {
            struct http_msg *m = http_parser_take(&p);
            if (!m) {
                st = HTTP_ERROR;
                break;
            }
            if (m->status >= 200 || m->status == 101) {
                take_answer(c, s, m);
                goto out;
            }
            /* 1xx: informational, the answer follows. */
            http_msg_free(m);
            http_parser_reset(&p);
            p.response_to_head = s->head;
            at += used;
            used = 0;
            st = at < (size_t)n ? http_parser_feed(&p, buf + at, (size_t)n - at, &used)
                                : HTTP_NEED_MORE;
        }
        if (st == HTTP_ERROR) {
            s->outcome = SHOT_ERROR;
            snprintf(s->error, sizeof s->error, "malformed answer: %.120s", p.error_detail);
            goto out;
        }
    }
out:
    s->done_us = xchg_now_us();
    http_parser_free(&p);
    conn_close(k);
}

void xchg_shot(const struct xchg_ctx *c, struct shot *s)
{
    struct conn k;
    if (open_conn(s->url, shot_deadline(c, s, xchg_now_us()), s->error, sizeof s->error,
                  &s->connect_refused, &k) != 0) {
        s->outcome = SHOT_ERROR;
        s->sent_us = s->done_us = xchg_now_us();
    } else {
        exchange(c, s, &k);
    }
    if (c->on_done)
        c->on_done(c->on_done_arg);
}

/* ---- the starting gun ---- */

struct gun {
    const struct xchg_ctx *ctx;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t ready;
    int go;
};

struct gunner {
    struct gun *gun;
    struct shot *shot;
    pthread_t thread;
    int started;
};

static void *gunner_main(void *arg)
{
    struct gunner *g = arg;
    struct shot *s = g->shot;
    const struct xchg_ctx *c = g->gun->ctx;
    struct conn k;
    int opened = open_conn(s->url, shot_deadline(c, s, xchg_now_us()), s->error,
                           sizeof s->error, &s->connect_refused, &k) == 0;
    pthread_mutex_lock(&g->gun->mu);
    g->gun->ready++;
    pthread_cond_broadcast(&g->gun->cv);
    while (!g->gun->go)
        pthread_cond_wait(&g->gun->cv, &g->gun->mu);
    pthread_mutex_unlock(&g->gun->mu);
    if (!opened) {
        s->outcome = SHOT_ERROR;
        s->sent_us = s->done_us = xchg_now_us();
    } else {
        xchg_sleep_ms(s->at_ms);
        exchange(c, s, &k);
    }
    if (c->on_done)
        c->on_done(c->on_done_arg);
    return NULL;
}

static int start_thread(pthread_t *t, void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    int rc = pthread_create(t, &attr, fn, arg);
    pthread_attr_destroy(&attr);
    return rc;
}

void xchg_gun(const struct xchg_ctx *c, struct shot *shots, size_t n)
{
    struct gun gun = {.ctx = c};
    struct gunner *g = calloc(n, sizeof *g);
    size_t started = 0;
    pthread_mutex_init(&gun.mu, NULL);
    pthread_cond_init(&gun.cv, NULL);
    for (size_t i = 0; i < n; i++) {
        if (g) {
            g[i].gun = &gun;
            g[i].shot = &shots[i];
            g[i].started = start_thread(&g[i].thread, gunner_main, &g[i]) == 0;
            started += (size_t)g[i].started;
        }
        if (!g || !g[i].started) {
            shots[i].outcome = SHOT_ERROR;
            snprintf(shots[i].error, sizeof shots[i].error, "could not start a thread");
            if (c->on_done)
                c->on_done(c->on_done_arg);
        }
    }
    pthread_mutex_lock(&gun.mu);
    while (gun.ready < started)
        pthread_cond_wait(&gun.cv, &gun.mu);
    gun.go = 1;
    pthread_cond_broadcast(&gun.cv);
    pthread_mutex_unlock(&gun.mu);
    for (size_t i = 0; g && i < n; i++)
        if (g[i].started)
            pthread_join(g[i].thread, NULL);
    pthread_cond_destroy(&gun.cv);
    pthread_mutex_destroy(&gun.mu);
    free(g);
}

/* ---- the pool ---- */

struct pool {
    const struct xchg_ctx *ctx;
    struct shot *shots;
    size_t n;
    atomic_size_t next;
};

static void *pool_main(void *arg)
{
    struct pool *p = arg;
    size_t i;
    while ((i = atomic_fetch_add(&p->next, 1)) < p->n)
        xchg_shot(p->ctx, &p->shots[i]);
    return NULL;
}

void xchg_pool(const struct xchg_ctx *c, struct shot *shots, size_t n, size_t concurrency)
{
    struct pool p = {.ctx = c, .shots = shots, .n = n};
    atomic_init(&p.next, 0);
    if (concurrency > n)
        concurrency = n;
    pthread_t *t = calloc(concurrency ? concurrency : 1, sizeof *t);
    size_t started = 0;
    for (size_t i = 0; t && i < concurrency; i++)
        if (start_thread(&t[started], pool_main, &p) == 0)
            started++;
    if (started == 0)
        pool_main(&p); /* no threads to be had: one at a time, here */
    for (size_t i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    free(t);
}

void shot_clear(struct shot *s)
{
    free(s->request);
    free(s->body);
    s->request = NULL;
    s->body = NULL;
}
