/* SPDX-License-Identifier: Apache-2.0 */
/*
 * upstream.c — the daemon's HTTP client for upstreams (daemon):
 * non-blocking, on a libevent event_base; the answer comes to a callback on
 * the loop's thread. Each loop has its own pools (struct upstream_loop),
 * touched only by that thread. Host names are looked up before any of this,
 * when a configuration is loaded (struct upstream_addrs): nothing a loop
 * runs waits on DNS.
 *
 * What matters most is the line between "not sent" and "maybe executed":
 *
 *   - connect refused or timed out               → NOT_SENT
 *   - a pooled connection found closed before use → discarded, another used
 *   - a send that fails before its first byte     → NOT_SENT
 *   - anything after the first byte went out      → UNKNOWN or TIMEOUT
 *
 * A pooled connection is only reused while it has been idle for less than
 * IDLE_REUSE_MS, well under the keep-alive timeouts of common servers, so the
 * race in which the server closes an idle connection just as we send on it
 * is rare; when it happens anyway the result is UNKNOWN, never a silent
 * retry, because the request may have been read. Idle connections are
 * watched for readability (EOF or stray bytes) and closed at once; one idle
 * for IDLE_REUSE_MS or more is not reused (it is closed when a call next
 * looks at the pool); taking one peeks at it, for a FIN that came after the
 * loop last looked. (A reset is seen by the send itself,
 * which then fails before its first byte, and another connection is used.)
 *
 * A connection goes back to its pool only if the answer ended exactly where
 * the bytes read did and keep-alive holds, and not after an answer an
 * upstream may yet send a body for (to HEAD; a 204 or 304 with a length).
 *
 * An https:// upstream's connection has a TLS handshake between connecting
 * and sending (HANDSHAKING below), and the certificate must be one the CA
 * file vouches for, for the upstream's host name: a handshake that fails,
 * or a certificate that does not pass, is NOT_SENT like a refused connect.
 * The bytes then go through OpenSSL; what "sent" means is unchanged (the
 * first byte of the request out, encrypted).
 */
#include "http/upstream.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "mono.h"
#include "put.h"
#include "http/tls.h"

#define IDLE_MAX 64
#define IDLE_REUSE_MS 2000
#define CONNECT_TIMEOUT_MS 5000

/* ---- addresses, connecting, the request, the answer ---------------------- */

struct upstream_addrs {
    atomic_int refs;
    char *host;
    int port;
    int tls;
    struct addrinfo *ai; /* at least one */
};

struct upstream_addrs *upstream_resolve(const char *host, int port, int tls, char *detail,
                                        size_t dlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host, service, &hints, &ai);
    if (gai != 0) {
        snprintf(detail, dlen, "upstream %s:%d: %s", host, port,
                 gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
        return NULL;
    }
    struct upstream_addrs *a = calloc(1, sizeof *a);
    if (!a || !(a->host = strdup(host))) {
        snprintf(detail, dlen, "upstream %s:%d: out of memory", host, port);
        free(a);
        freeaddrinfo(ai);
        return NULL;
    }
    atomic_init(&a->refs, 1);
    a->port = port;
    a->tls = tls;
    a->ai = ai;
    return a;
}

struct upstream_addrs *upstream_addrs_get(struct upstream_addrs *a)
{
    atomic_fetch_add(&a->refs, 1);
    return a;
}

void upstream_addrs_put(struct upstream_addrs *a)
{
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        freeaddrinfo(a->ai);
        free(a->host);
        free(a);
    }
}

/* A non-blocking socket with a connect to a under way (or done): wait for
 * it to be writable, then ask connect_result(). -1 with *err. */
static int connect_start(const struct addrinfo *a, int *err)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

/* Once the connecting socket is writable: 0 if connected, else why not. */
static int connect_result(int fd)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

/* How long the next address may take to connect: up to the deadline, and
 * never more than CONNECT_TIMEOUT_MS. */
static int64_t connect_budget(int64_t deadline)
{
    int64_t left = deadline - mono_ms();
    return left > CONNECT_TIMEOUT_MS ? CONNECT_TIMEOUT_MS : left;
}

static void connect_failed(const char *host, int port, int err, char *detail, size_t dlen)
{
    snprintf(detail, dlen, "upstream %s:%d: connect: %s", host, port,
             strerror(err ? err : ECONNREFUSED));
}

const char *upstream_result_name(enum upstream_result r)
{
    static const char *const names[] = {
        [UPSTREAM_OK] = "ok",           [UPSTREAM_NOT_SENT] = "not_sent",
        [UPSTREAM_UNKNOWN] = "unknown", [UPSTREAM_TIMEOUT] = "timeout",
        [UPSTREAM_TOO_BIG] = "too_big",
    };
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "unknown";
}

/* Headers a client may send that never reach the upstream: Idem's own
 * (Idem-Key, Idem-Epoch, a consumer's Idem-Attempt and a states route's
 * Idem-State-From and Idem-State-To are set by the gateway alone, so that an
 * upstream fencing on them cannot be handed a client's forgery; the
 * one-time token is spent here) and Expect, which Idem answers itself
 * (the body is forwarded whole, with its length). Spelt with '_' too
 * (Idem_Epoch), which CGI-style upstreams read as the same header. */
static int not_forwarded(const char *name, size_t len)
{
    switch (len) {
    case 6: return http_name_alike(name, "expect");
    case 8: return http_name_alike(name, "idem-key");
    case 10: return http_name_alike(name, "idem-epoch") || http_name_alike(name, "idem-token");
    case 12: return http_name_alike(name, "idem-attempt");
    case 13: return http_name_alike(name, "idem-state-to");
    case 15: return http_name_alike(name, "idem-state-from");
    }
    return 0;
}

/* s as an RFC 7230 quoted-string's content: '"' and '\\' escaped. */
static char *put_quoted(char *o, const char *s)
{
    *o++ = '"';
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            *o++ = '\\';
        *o++ = *s;
    }
    *o++ = '"';
    return o;
}

/* What the client asked for, as proxies say it (Traefik and Envoy send the
 * X- pair, RFC 7239 the Forwarded list, the client's own elements first):
 * its Host, its scheme, and its address. */
static char *put_forwarded(char *o, const struct upstream_request *rq, const char *client_host,
                           const char *client_fwd)
{
    if (client_host) {
        o = put(o, "X-Forwarded-Host: ", 18);
        o = put_str(o, client_host);
        o = put(o, "\r\n", 2);
    }
    o = put(o, "X-Forwarded-Proto: ", 19);
    o = put_str(o, rq->proto);
    o = put(o, "\r\nForwarded: ", 13);
    if (client_fwd) {
        o = put_str(o, client_fwd);
        o = put(o, ", ", 2);
    }
    o = put(o, "proto=", 6);
    o = put_str(o, rq->proto);
    if (client_host) {
        o = put(o, ";host=", 6);
        o = put_quoted(o, client_host);
    }
    if (rq->peer) {
        /* The address alone; an IPv6 one in brackets, quoted (RFC 7239 6). */
        char addr[64];
        const char *colon = strrchr(rq->peer, ':');
        size_t n = colon ? (size_t)(colon - rq->peer) : strlen(rq->peer);
        snprintf(addr, sizeof addr, "%s%.*s%s", memchr(rq->peer, ':', n) ? "[" : "", (int)n,
                 rq->peer, memchr(rq->peer, ':', n) ? "]" : "");
        o = put(o, ";for=", 5);
        o = put_quoted(o, addr);
    }
    return put(o, "\r\n", 2);
}

/* The request's bytes: line, forwarded headers, our headers, body. */
static char *build_request(const char *host, int port, const struct upstream_request *rq,
                           size_t *len)
{
    const struct http_msg *m = rq->original;
    const char *base = rq->base_path ? rq->base_path : "";
    size_t cap = 256 + strlen(rq->method) + strlen(base) + strlen(rq->target) + strlen(host) +
                 (rq->peer ? strlen(rq->peer) : 0) + (m ? m->body_len : 0);
    /* The client's Host and Forwarded, read in the same pass: idem says
     * them again (see put_forwarded). */
    const char *client_host = NULL, *client_fwd = NULL;
    for (size_t i = 0; m && i < m->header_count; i++) {
        const struct http_header *h = &m->headers[i];
        size_t vlen = strlen(h->value);
        cap += h->name_len + vlen + 4;
        if (!client_host && h->name_len == 4 && strcasecmp(h->name, "host") == 0)
            client_host = h->value, cap += 4 * vlen; /* Host, X-Forwarded-Host, host="" */
        else if (!client_fwd && h->name_len == 9 && strcasecmp(h->name, "forwarded") == 0)
            client_fwd = h->value;
    }
    for (const char *const *e = rq->extra; e && *e; e++)
        cap += strlen(*e) + 2;
    cap += (rq->peer ? strlen(rq->peer) : 0) + 128; /* Forwarded's for= and the rest */
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    o = put_str(o, rq->method);
    *o++ = ' ';
    o = put_str(o, base);
    o = put_str(o, rq->target);
    o = put(o, " HTTP/1.1\r\nHost: ", 17);
    if (rq->pass_host && client_host) {
        o = put_str(o, client_host);
    } else {
        o = put_str(o, host);
        *o++ = ':';
        o = put_uint(o, (unsigned)port);
    }
    o = put(o, "\r\n", 2);
    const char *xff = NULL;
    for (size_t i = 0; m && i < m->header_count; i++) {
        const char *n = m->headers[i].name;
        size_t nlen = m->headers[i].name_len;
        if ((nlen == 4 && strcasecmp(n, "host") == 0) ||
            (nlen == 14 && strcasecmp(n, "content-length") == 0) || not_forwarded(n, nlen) ||
            http_is_hop_by_hop(m, n))
            continue;
        /* Said by idem for the client it saw, not taken from the client. */
        if (rq->proto && (http_name_alike(n, "x-forwarded-host") ||
                          http_name_alike(n, "x-forwarded-proto") ||
                          (nlen == 9 && strcasecmp(n, "forwarded") == 0)))
            continue;
        if (nlen == 15 && strcasecmp(n, "x-forwarded-for") == 0) {
            xff = m->headers[i].value;
            continue;
        }
        o = put_field(o, n, m->headers[i].value, "\r\n");
    }
    if (rq->peer) {
        /* Only the address, not our view of the client's port. */
        const char *colon = strrchr(rq->peer, ':');
        size_t hostlen = colon ? (size_t)(colon - rq->peer) : strlen(rq->peer);
        o = put(o, "X-Forwarded-For: ", 17);
        if (xff) {
            o = put_str(o, xff);
            o = put(o, ", ", 2);
        }
        o = put(o, rq->peer, hostlen);
        o = put(o, "\r\n", 2);
    }
    if (rq->proto)
        o = put_forwarded(o, rq, client_host, client_fwd);
    for (const char *const *e = rq->extra; e && *e; e++) {
        o = put_str(o, *e);
        o = put(o, "\r\n", 2);
    }
    size_t body = m ? m->body_len : 0;
    o = put(o, "Content-Length: ", 16);
    o = put_uint(o, body);
    o = put(o, "\r\n\r\n", 4);
    if (body) {
        memcpy(o, m->body, body);
        o += body;
    }
    *len = (size_t)(o - out);
    return out;
}

/* Reading an answer: the response parser, with 1xx answers skipped and the
 * peer's close, a malformed answer and the body limit turned into results. */
struct answer {
    struct http_parser parser;
    int head;         /* the request was HEAD: the answer has no body */
    const char *host; /* for details */
    int port;
    /* Once answer_feed() returned 1: */
    enum upstream_result result;
    struct http_msg *resp; /* UPSTREAM_OK: the whole answer, now the caller's */
    int reusable;          /* the connection may carry the next exchange */
};

static void answer_init(struct answer *a, const struct upstream_request *rq, const char *host,
                        int port)
{
    struct http_limits limits = {
        .request_line_max = 8192,
        .header_count_max = UPSTREAM_HEAD_FIELDS_MAX,
        .header_bytes_max = UPSTREAM_HEAD_BYTES_MAX,
        .body_max = rq->response_max,
    };
    *a = (struct answer){.head = strcmp(rq->method, "HEAD") == 0,
                         .host = host,
                         .port = port,
                         .result = UPSTREAM_UNKNOWN};
    http_parser_init(&a->parser, HTTP_PARSE_RESPONSE, &limits);
    a->parser.response_to_head = a->head;
}

static void answer_free(struct answer *a)
{
    http_parser_free(&a->parser);
}

/* A 204 or 304 (which have no body) that says how long its body is. */
static int bodiless_but_framed(const struct http_msg *m)
{
    if (m->status != 204 && m->status != 304)
        return 0;
    const char *cl = http_msg_header(m, "Content-Length");
    return (cl && strcmp(cl, "0") != 0) || http_msg_header(m, "Transfer-Encoding") != NULL;
}

/* Feed what one recv() returned: n bytes of buf, 0 when the peer closed,
 * < 0 when the connection failed (errno). 0: read more. 1: decided, see
 * result (and resp and reusable); detail says what went wrong otherwise. */
static int answer_feed(struct answer *a, const char *buf, ssize_t n, char *detail, size_t dlen)
{
    enum http_parse_status st = HTTP_NEED_MORE;
    size_t off = 0;
    if (n < 0) {
        /* A reset is not an end: an answer framed by the close, cut by a
         * reset, would otherwise pass for whole. */
        snprintf(detail, dlen, "upstream %s:%d: reading: %s", a->host, a->port,
                 strerror(errno));
        return 1; /* result stays UNKNOWN */
    }
    if (n == 0) {
        st = http_parser_eof(&a->parser);
        if (st != HTTP_DONE)
            snprintf(detail, dlen, "upstream %s:%d: connection closed before a whole answer",
                     a->host, a->port);
    }
    while (n > 0 && off < (size_t)n) {
        size_t used = 0;
        st = http_parser_feed(&a->parser, buf + off, (size_t)n - off, &used);
        off += used;
        if (st != HTTP_DONE || a->parser.error_status)
            break;
        /* A 1xx answer is informational: the real one follows. But after a
         * 101 what follows is another protocol, never an answer: nothing
         * asked to switch, and its bytes must not be read as the answer. */
        if (!a->parser.msg || a->parser.msg->status >= 200) /* the message about to be taken */
            break;
        if (a->parser.msg->status == 101) {
            snprintf(detail, dlen, "upstream %s:%d: answered 101 Switching Protocols, which "
                     "nothing asked for", a->host, a->port);
            return 1; /* result stays UNKNOWN */
        }
        http_msg_free(http_parser_take(&a->parser));
        http_parser_reset(&a->parser);
        a->parser.response_to_head = a->head;
        st = HTTP_NEED_MORE;
    }
    if (st == HTTP_NEED_MORE && n > 0)
        return 0;
    a->result = UPSTREAM_UNKNOWN;
    if (st == HTTP_ERROR) {
        /* A body or a head over the limits (413, 431) is an answer, only too
         * big to keep: the upstream did execute. Anything else malformed may
         * not be an answer at all. */
        int status = a->parser.error_status;
        if (status == 413 || status == 431)
            a->result = UPSTREAM_TOO_BIG;
        snprintf(detail, dlen, "upstream %s:%d: %s", a->host, a->port,
                 status == 413 ? "response body over response_max" : a->parser.error_detail);
        return 1;
    }
    if (st != HTTP_DONE)
        return 1;
    a->resp = http_parser_take(&a->parser);
    if (!a->resp) {
        snprintf(detail, dlen, "out of memory reading the upstream's answer");
        return 1;
    }
    a->result = UPSTREAM_OK;
    /* Reusable only if the answer ended exactly where the bytes did, and
     * the upstream is not likely to send more later: after an answer to
     * HEAD, or a 204 or 304 with a length or chunking of its own, an
     * upstream that sends the body anyway would have it read as the answer
     * to the next request on the connection. */
    a->reusable = a->resp->keep_alive && n > 0 && off == (size_t)n && !a->head &&
                  !bodiless_but_framed(a->resp);
    return 1;
}

/* ---- the event-loop client ------------------------------------------------
 *
 * A call's life, every step on the loop's thread:
 *
 *   upstream_call_start
 *     │
 *     ▼
 *   attach ──── a pooled connection ────────────┐
 *     │  ▲                                      ▼
 *     │  └── pooled, failed before a byte ── SENDING ── all out ──► READING
 *     ▼                                         ▲                      │
 *   CONNECTING ── connected ──(https)─► HANDSHAKING       a whole answer, or the close
 *     ↺ the next address on failure   (plain) ──┘                      ▼
 *   any state ── failure or the deadline ─────────────────────────► DECIDED ──► done runs
 *
 *   attach()        → SENDING with a pooled connection, else → CONNECTING
 *                     to the call's addresses through connect_next()
 *   on_io()         CONNECTING → SENDING (or HANDSHAKING) once connected;
 *                   connect_next() on failure
 *   handshake()     HANDSHAKING → SENDING once the certificate passed, else decide()
 *   send_some()     SENDING → READING, or back to attach(), or decide()
 *   read_some()     READING → decide() once the answer is whole or cut short
 *   on_timer()      the deadline → decide()
 *   decide()        → DECIDED; deliver() runs done and frees the call
 *   upstream_call_cancel()  any state before done ran → freed, no done
 *
 *   CONNECTING  c->fd connecting to the address before c->next_addr, watched
 *               for EV_WRITE with min(deadline, CONNECT_TIMEOUT_MS); nothing
 *               sent. Out of addresses, or the deadline: NOT_SENT.
 *   SENDING     c->sent of c->len bytes out; EV_WRITE watched only while the
 *               socket is full. A failure: NOT_SENT if c->sent == 0 (after
 *               trying another connection if this one was pooled), else
 *               UNKNOWN; the deadline: NOT_SENT or TIMEOUT likewise.
 *   HANDSHAKING c->conn connected, its SSL's handshake under way: its EV_READ
 *               and, while OpenSSL wants to write, c->io's EV_WRITE drive
 *               it. Nothing sent: a failure or the deadline is NOT_SENT.
 *   READING     EV_READ feeds the answer; the deadline: TIMEOUT.
 *   DECIDED     the connection is closed or back in the pool; result and
 *               resp wait for deliver(), which runs at once, or from the
 *               timer made active if the call was decided inside
 *               upstream_call_start().
 *
 * One timer per call (the deadline) and one I/O event for connecting and
 * for a socket that is full. Once connected, a connection (struct loop_conn)
 * has its own EV_READ event, added once and kept for the connection's life,
 * idle or in a call: a request on a pooled connection costs no epoll_ctl.
 * While idle, that event firing means the upstream closed the connection
 * (or sent something unasked): it is closed at once.
 */

struct loop_pool;
struct upstream_call;

/* A connected socket: in a call, or idle in its pool. */
struct loop_conn {
    struct loop_pool *pool;
    int fd;
    SSL *ssl;                   /* an https:// upstream's; else NULL */
    int64_t since;              /* idle since (monotonic ms) */
    struct event *readable;     /* EV_READ | EV_PERSIST, for the conn's life */
    struct upstream_call *call; /* NULL while idle */
};

struct loop_pool {
    struct loop_pool *next;
    struct event_base *base;
    char *host;
    int port;
    int tls;                    /* https:// (pools apart from http:// ones) */
    SSL_CTX *tls_ctx;           /* the loop's, when tls */
    struct loop_conn *idle[IDLE_MAX]; /* newest last */
    int nidle;
};

struct upstream_loop {
    struct event_base *base;
    SSL_CTX *tls;
    struct loop_pool *pools;
};

enum call_state { CONNECTING, HANDSHAKING, SENDING, READING, DECIDED };

struct upstream_call {
    struct loop_pool *pool;
    struct upstream_addrs *to;        /* a reference, for the call's life */
    upstream_done_fn done;
    void *arg;
    enum call_state state;
    int starting; /* inside upstream_call_start(): done must wait */
    int fd;                           /* CONNECTING: the socket */
    struct loop_conn *conn;           /* connected: the connection */
    int reused;                       /* conn came from the pool */
    int waiting_writable;             /* SENDING: the socket was full */
    const struct addrinfo *next_addr; /* CONNECTING: the address to try next */
    int connect_err;                  /* why the last address failed */
    char *bytes;
    size_t len, sent;
    int64_t deadline, timeout_ms;
    struct event *io;    /* both in the call's own block */
    struct event *timer;
    struct answer answer;
    enum upstream_result result; /* DECIDED */
    struct http_msg *resp;
    char detail[256];
};

static void conn_close(struct loop_conn *k)
{
    event_free(k->readable);
    SSL_free(k->ssl); /* no close_notify: the socket goes either way */
    close(k->fd);
    free(k);
}

static int read_some(struct upstream_call *c);
static void handshake(struct upstream_call *c);

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct loop_conn *k = arg;
    struct loop_pool *p = k->pool;
    (void)fd;
    (void)what;
    if (k->call) {
        if (k->call->state == HANDSHAKING) {
            handshake(k->call);
            return;
        }
        /* OpenSSL may hold decrypted bytes the socket no longer shows. */
        while (read_some(k->call) == 2 && k->ssl && SSL_pending(k->ssl) > 0)
            ;
        return;
    }
    /* Closed by the upstream (or sent to unasked) while idle: gone. */
    for (int i = 0; i < p->nidle; i++) {
        if (p->idle[i] == k) {
            memmove(&p->idle[i], &p->idle[i + 1], (size_t)(p->nidle - i - 1) * sizeof *p->idle);
            p->nidle--;
            break;
        }
    }
    conn_close(k);
}

/* A connected fd becomes a connection, its EV_READ watched from now on.
 * NULL (fd closed) on OOM. */
static struct loop_conn *conn_new(struct loop_pool *p, int fd)
{
    struct loop_conn *k = calloc(1, sizeof *k);
    if (k && (k->readable = event_new(p->base, fd, EV_READ | EV_PERSIST, on_readable, k)) &&
        event_add(k->readable, NULL) == 0) {
        k->pool = p;
        k->fd = fd;
        return k;
    }
    if (k && k->readable)
        event_free(k->readable);
    free(k);
    close(fd);
    return NULL;
}

/* Into the pool, still watched; closed if the pool is full. */
static void pool_put(struct loop_pool *p, struct loop_conn *k)
{
    k->call = NULL;
    k->since = mono_ms();
    if (p->nidle < IDLE_MAX)
        p->idle[p->nidle++] = k;
    else
        conn_close(k);
}

/* The newest idle connection still young enough and still open, or NULL.
 * Its event closed it if the loop saw the upstream close it or send
 * anything while it idled; a peek catches what arrived since the loop last
 * looked (one syscall, to keep a FIN from turning a send into UNKNOWN). */
static struct loop_conn *pool_take(struct loop_pool *p)
{
    int64_t now = mono_ms();
    while (p->nidle > 0) {
        struct loop_conn *k = p->idle[--p->nidle];
        char byte;
        if (now - k->since < IDLE_REUSE_MS &&
            recv(k->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) < 0 &&
            (errno == EAGAIN || errno == EWOULDBLOCK))
            return k;
        conn_close(k);
    }
    return NULL;
}

static struct loop_pool *loop_pool_get(struct upstream_loop *ul, const char *host, int port,
                                       int tls)
{
    struct loop_pool *p = ul->pools;
    for (; p; p = p->next)
        if (p->port == port && p->tls == tls && strcmp(p->host, host) == 0)
            return p;
    if ((p = calloc(1, sizeof *p)) == NULL)
        return NULL;
    if ((p->host = strdup(host)) == NULL) {
        free(p);
        return NULL;
    }
    p->base = ul->base;
    p->port = port;
    p->tls = tls;
    p->tls_ctx = ul->tls;
    p->next = ul->pools;
    ul->pools = p;
    return p;
}

struct upstream_loop *upstream_loop_new(struct event_base *base, SSL_CTX *tls)
{
    struct upstream_loop *ul = calloc(1, sizeof *ul);
    if (ul) {
        ul->base = base;
        ul->tls = tls;
    }
    return ul;
}

void upstream_loop_free(struct upstream_loop *ul)
{
    if (!ul)
        return;
    while (ul->pools) {
        struct loop_pool *p = ul->pools;
        ul->pools = p->next;
        while (p->nidle > 0)
            conn_close(p->idle[--p->nidle]);
        free(p->host);
        free(p);
    }
    free(ul);
}

static void call_free(struct upstream_call *c)
{
    event_del(c->io); /* both live in c's own block */
    event_del(c->timer);
    if (c->fd >= 0)
        close(c->fd);
    if (c->conn)
        conn_close(c->conn);
    answer_free(&c->answer);
    free(c->bytes);
    upstream_addrs_put(c->to);
    free(c);
}

static void deliver(struct upstream_call *c)
{
    c->done(c->arg, c->result, c->resp, c->detail);
    call_free(c);
}

/* The end of the exchange: the connection goes (unless read_some() gave it
 * back to the pool), and done runs, now or once start has returned. */
static void decide(struct upstream_call *c, enum upstream_result r, struct http_msg *resp)
{
    c->state = DECIDED;
    c->result = r;
    c->resp = resp;
    event_del(c->io);
    event_del(c->timer);
    if (c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->conn) {
        conn_close(c->conn);
        c->conn = NULL;
    }
    free(c->bytes);
    c->bytes = NULL;
    if (c->starting)
        event_active(c->timer, EV_TIMEOUT, 1);
    else
        deliver(c);
}

static void on_io(evutil_socket_t fd, short what, void *arg);

/* Watch fd for EV_WRITE, until it goes or for timeout_ms (-1: none). */
static int watch_writable(struct upstream_call *c, int fd, int64_t timeout_ms)
{
    struct timeval tv = ms_timeval(timeout_ms);
    event_del(c->io);
    if (event_assign(c->io, c->pool->base, fd, EV_WRITE | EV_PERSIST, on_io, c) != 0)
        return -1;
    return event_add(c->io, timeout_ms >= 0 ? &tv : NULL);
}

/* The connection failed: it goes, and what was sent on it says the rest. */
static void drop_fd(struct upstream_call *c)
{
    event_del(c->io);
    c->waiting_writable = 0;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    if (c->conn)
        conn_close(c->conn);
    c->conn = NULL;
}

static void connect_next(struct upstream_call *c);
static void send_some(struct upstream_call *c);

/* A connection for the request: the newest pooled one, or a new one. */
static void attach(struct upstream_call *c)
{
    struct loop_pool *p = c->pool;
    c->conn = pool_take(p);
    c->reused = c->conn != NULL;
    if (c->reused) {
        c->conn->call = c;
        c->state = SENDING;
        send_some(c);
        return;
    }
    c->state = CONNECTING;
    c->next_addr = c->to->ai;
    c->connect_err = 0;
    connect_next(c);
}

static void connect_next(struct upstream_call *c)
{
    while (c->next_addr) {
        const struct addrinfo *a = c->next_addr;
        c->next_addr = a->ai_next;
        int64_t budget = connect_budget(c->deadline);
        if (budget <= 0) {
            c->connect_err = ETIMEDOUT;
            continue;
        }
        if ((c->fd = connect_start(a, &c->connect_err)) < 0)
            continue;
        if (watch_writable(c, c->fd, budget) == 0)
            return;
        c->connect_err = errno ? errno : ENOMEM;
        drop_fd(c);
    }
    connect_failed(c->pool->host, c->pool->port, c->connect_err, c->detail, sizeof c->detail);
    decide(c, UPSTREAM_NOT_SENT, NULL);
}

/* SSL_write as send(): bytes written, or -1 with errno (EAGAIN while
 * OpenSSL waits for the socket). */
static ssize_t tls_send(SSL *ssl, const char *bytes, size_t len)
{
    size_t n = 0;
    ERR_clear_error();
    if (SSL_write_ex(ssl, bytes, len, &n) == 1)
        return (ssize_t)n;
    int e = SSL_get_error(ssl, 0);
    errno = e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ ? EAGAIN
            : e == SSL_ERROR_SYSCALL && errno                     ? errno
                                                                  : EPROTO;
    return -1;
}

/* SSL_read as recv(): bytes read, 0 at the upstream's close_notify, -1 with
 * errno (EAGAIN: nothing decrypted yet; a close without close_notify is a
 * reset, ECONNRESET: an answer framed by the close may be cut short). */
static ssize_t tls_recv(SSL *ssl, char *buf, size_t len)
{
    size_t n = 0;
    ERR_clear_error();
    if (SSL_read_ex(ssl, buf, len, &n) == 1)
        return (ssize_t)n;
    switch (SSL_get_error(ssl, 0)) {
    case SSL_ERROR_ZERO_RETURN:
        return 0;
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_SYSCALL:
        errno = errno ? errno : ECONNRESET;
        return -1;
    default:
        errno = EPROTO;
        return -1;
    }
}

/* HANDSHAKING: one more step of it, driven by the connection's EV_READ and,
 * while OpenSSL wants to write, c->io. */
static void handshake(struct upstream_call *c)
{
    SSL *ssl = c->conn->ssl;
    ERR_clear_error();
    int r = SSL_do_handshake(ssl);
    if (r == 1) {
        event_del(c->io);
        c->state = SENDING;
        send_some(c);
        return;
    }
    int e = SSL_get_error(ssl, r);
    if (e == SSL_ERROR_WANT_READ) {
        event_del(c->io);
        return;
    }
    if (e == SSL_ERROR_WANT_WRITE && watch_writable(c, c->conn->fd, -1) == 0)
        return;
    char why[256];
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK)
        snprintf(why, sizeof why, "the certificate was refused: %s",
                 X509_verify_cert_error_string(verify));
    else if (e == SSL_ERROR_SYSCALL)
        snprintf(why, sizeof why, "%s", errno ? strerror(errno) : "the connection closed");
    else
        tls_error(why, sizeof why);
    snprintf(c->detail, sizeof c->detail, "upstream %s:%d: TLS handshake: %.160s",
             c->pool->host, c->pool->port, why);
    decide(c, UPSTREAM_NOT_SENT, NULL);
}

/* While the socket is full, its EV_READ is off: an early answer or a close
 * is seen by the next send, or read once everything is out. */
static void send_some(struct upstream_call *c)
{
    struct loop_conn *k = c->conn;
    int err = 0, waiting = c->waiting_writable;
    while (c->sent < c->len) {
        ssize_t n = k->ssl ? tls_send(k->ssl, c->bytes + c->sent, c->len - c->sent)
                           : send(k->fd, c->bytes + c->sent, c->len - c->sent, MSG_NOSIGNAL);
        if (n > 0) {
            c->sent += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            if (waiting)
                return;
            if (event_del(k->readable) == 0 && watch_writable(c, k->fd, -1) == 0) {
                c->waiting_writable = 1;
                return;
            }
            err = errno ? errno : ENOMEM;
            break;
        } else {
            err = n < 0 ? errno : EPIPE;
            break;
        }
    }
    if (!err && waiting) {
        event_del(c->io);
        c->waiting_writable = 0;
        if (event_add(k->readable, NULL) != 0)
            err = ENOMEM;
    }
    if (!err) {
        c->state = READING;
        return;
    }
    drop_fd(c);
    if (c->sent == 0 && c->reused) {
        attach(c); /* the pooled connection was dead: nothing went out */
        return;
    }
    snprintf(c->detail, sizeof c->detail, "upstream %s:%d: sending: %s", c->pool->host,
             c->pool->port, strerror(err));
    decide(c, c->sent == 0 ? UPSTREAM_NOT_SENT : UPSTREAM_UNKNOWN, NULL);
}

/* One recv of the answer. 1: the call is decided (and may be gone); 0:
 * nothing more to read now; 2: something was read, there may be more. */
static int read_some(struct upstream_call *c)
{
    char buf[16384];
    if (c->state != READING)
        return 0; /* not before the request is out (see send_some) */
    ssize_t n = c->conn->ssl ? tls_recv(c->conn->ssl, buf, sizeof buf)
                             : recv(c->conn->fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR)
        return 2;
    if (n < 0 && errno == EAGAIN)
        return 0;
    if (!answer_feed(&c->answer, buf, n, c->detail, sizeof c->detail))
        return 2;
    if (c->answer.reusable) {
        pool_put(c->pool, c->conn);
        c->conn = NULL;
    }
    struct http_msg *resp = c->answer.resp;
    c->answer.resp = NULL;
    decide(c, c->answer.result, resp);
    return 1;
}

static void on_io(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_call *c = arg;
    switch (c->state) {
    case CONNECTING: {
        int err = what & EV_TIMEOUT ? ETIMEDOUT : connect_result(c->fd);
        if (err) {
            c->connect_err = err;
            drop_fd(c);
            connect_next(c);
        } else {
            /* Connected: from here on a connection with its own EV_READ. */
            event_del(c->io);
            int sock = c->fd;
            c->fd = -1;
            if (!(c->conn = conn_new(c->pool, sock))) {
                connect_failed(c->pool->host, c->pool->port, ENOMEM, c->detail,
                               sizeof c->detail);
                decide(c, UPSTREAM_NOT_SENT, NULL);
                break;
            }
            c->conn->call = c;
            if (c->pool->tls) {
                c->state = HANDSHAKING;
                if (!c->pool->tls_ctx) {
                    snprintf(c->detail, sizeof c->detail,
                             "upstream %s:%d: https, and TLS was not set up at start (a "
                             "reload added it: restart)", c->pool->host, c->pool->port);
                    decide(c, UPSTREAM_NOT_SENT, NULL);
                    break;
                }
                if (!(c->conn->ssl = tls_client_ssl(c->pool->tls_ctx, c->pool->host)) ||
                    SSL_set_fd(c->conn->ssl, sock) != 1) {
                    snprintf(c->detail, sizeof c->detail,
                             "upstream %s:%d: TLS: out of memory", c->pool->host, c->pool->port);
                    decide(c, UPSTREAM_NOT_SENT, NULL);
                    break;
                }
                handshake(c);
                break;
            }
            c->state = SENDING;
            send_some(c);
        }
        break;
    }
    case HANDSHAKING:
        handshake(c);
        break;
    case SENDING:
        send_some(c);
        break;
    case READING:
        (void)read_some(c);
        break;
    case DECIDED:
        break;
    }
}

/* The deadline; or, for a call decided inside start, the moment to deliver. */
static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct upstream_call *c = arg;
    const char *host = c->pool->host;
    int port = c->pool->port;
    /* libevent's clock is coarse (a few ms) unless the base was made with
     * EVENT_BASE_FLAG_PRECISE_TIMER: never give up before the deadline. */
    int64_t left = c->deadline - mono_ms();
    if (c->state != DECIDED && left > 0) {
        struct timeval tv = ms_timeval(left);
        if (evtimer_add(c->timer, &tv) == 0)
            return;
    }
    switch (c->state) {
    case CONNECTING:
        connect_failed(host, port, ETIMEDOUT, c->detail, sizeof c->detail);
        decide(c, UPSTREAM_NOT_SENT, NULL);
        break;
    case HANDSHAKING:
        snprintf(c->detail, sizeof c->detail, "upstream %s:%d: TLS handshake: %s", host, port,
                 strerror(ETIMEDOUT));
        decide(c, UPSTREAM_NOT_SENT, NULL);
        break;
    case SENDING:
        snprintf(c->detail, sizeof c->detail, "upstream %s:%d: sending: %s", host, port,
                 strerror(ETIMEDOUT));
        decide(c, c->sent == 0 ? UPSTREAM_NOT_SENT : UPSTREAM_TIMEOUT, NULL);
        break;
    case READING: {
        /* An answer that came in time may be unread yet: after the whole
         * process stood still (stopped, or starved of CPU) past the
         * deadline, the loop can run this timer before the read. Read what
         * is there first; a whole answer is the upstream's, not a timeout. */
        int r;
        while ((r = read_some(c)) == 2)
            ;
        if (r == 1)
            return;
        snprintf(c->detail, sizeof c->detail, "upstream %s:%d: no answer within %lld ms", host,
                 port, (long long)c->timeout_ms);
        decide(c, UPSTREAM_TIMEOUT, NULL);
        break;
    }
    case DECIDED:
        deliver(c);
        break;
    }
}

struct upstream_call *upstream_call_start(struct upstream_loop *ul, struct upstream_addrs *to,
                                          const struct upstream_request *rq,
                                          upstream_done_fn done, void *arg)
{
    struct loop_pool *p = loop_pool_get(ul, to->host, to->port, to->tls);
    /* The call and its two events in one block: nothing more to allocate
     * per request than the request's bytes. */
    size_t head = (sizeof(struct upstream_call) + 15) & ~(size_t)15;
    size_t ev = (event_get_struct_event_size() + 15) & ~(size_t)15;
    struct upstream_call *c = p ? calloc(1, head + 2 * ev) : NULL;
    if (!c)
        return NULL;
    c->io = (struct event *)((char *)c + head);
    c->timer = (struct event *)((char *)c + head + ev);
    event_assign(c->io, ul->base, -1, 0, on_io, c);
    evtimer_assign(c->timer, ul->base, on_timer, c);
    c->pool = p;
    c->to = upstream_addrs_get(to);
    c->done = done;
    c->arg = arg;
    c->fd = -1;
    c->timeout_ms = rq->timeout_ms;
    c->deadline = mono_ms() + rq->timeout_ms;
    answer_init(&c->answer, rq, p->host, p->port);
    c->bytes = build_request(p->host, p->port, rq, &c->len);
    struct timeval tv = ms_timeval(rq->timeout_ms);
    if (!c->bytes || evtimer_add(c->timer, &tv) != 0) {
        call_free(c);
        return NULL;
    }
    c->starting = 1;
    attach(c);
    c->starting = 0;
    return c;
}

int upstream_call_sent(const struct upstream_call *c)
{
    return c->sent > 0;
}

void upstream_call_cancel(struct upstream_call *c)
{
    if (!c)
        return;
    if (c->state == DECIDED)
        http_msg_free(c->resp);
    call_free(c);
}
