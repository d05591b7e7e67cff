/* SPDX-License-Identifier: Apache-2.0 */
/*
 * front.c — the HTTP front end of idem serve (daemon).
 *
 * Each libevent loop owns its client connections. It parses requests with
 * the strict parser (http_parser.c) under the configured limits and gives
 * each complete request to the handler, on the loop thread. The handler never
 * blocks: what waits on a store is the library's asynchronous calls, whose
 * callbacks the library posts to this same loop (include/idem/libevent.h).
 * A connection serves one request at a time (pipelined requests wait in its
 * input buffer), so responses go out in order.
 *
 * A connection's lifecycle — every change goes through set_state():
 *
 *      accept
 *        │            idle timer (idle_timeout) while no byte has arrived;
 *        ▼            then header_timeout from the first byte, and
 *    ┌─ READING ◄──────────────────────────────┐     body_timeout from the head's end
 *    │    │ a whole request                     │
 *    │    ▼                                     │ written, keep-alive
 *    │  HANDLING ── (the handler has it; more   │
 *    │    │   input waits) front_answer()       │
 *    │    ▼                                     │
 *    │  WRITING ────────────────────────────────┘
 *    │    │ written, close (Connection: close, HTTP/1.0, limit reached,
 *    │    ▼                 or the request was malformed)
 *    │  LINGERING ── our side shut; what the peer still sends is read and
 *    │    │          dropped (up to LINGER_MS), so that closing with unread
 *    │    ▼          input cannot reset the connection and lose our answer
 *    └─► CLOSED ◄── timeout, peer gone, write error, nothing of an answer
 *                   read for send_timeout
 *
 * A peer that goes away while its request is HANDLING does not stop the
 * work: the record is finished regardless. A reset connection is freed when
 * the answer comes (ORPHANED); a peer that only shut its side (EOF) may
 * still read, so its answer is written and then the connection closes.
 * Malformed requests are answered with the parser's status and the
 * connection is closed, because after a framing error nothing that follows
 * on it can be trusted.
 *
 * Reads stay enabled while a request is handled and written (until the
 * peer's EOF), and an answer goes out with one send() when the socket takes
 * it: a request on a kept-alive connection changes nothing epoll watches.
 */
#include "http/front.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/listener.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include "log.h"
#include "mono.h"
#include "http/peers.h"
#include "http/tls.h"

enum conn_state { READING, HANDLING, WRITING, ORPHANED, LINGERING };

#define LINGER_MS 2000
#define INPUT_HIGH (64 * 1024) /* input buffered while a request is handled */
#define READ_MAX (16 * 1024)   /* the most one recv() of a plain connection takes */
#define OVER_LIMIT_GRACE 1024 /* connections answered 503 while over the limit */
#define ACCEPT_PAUSE_MS 100   /* accept() failed (out of descriptors): listen again after */
#define ACCEPT_LOG_MS 10000   /* and say so at most this often */

struct conn {
    struct front *f;
    struct bufferevent *bev;
    /* Plain TCP: the connection's own read event, in place of the
     * bufferevent's (see on_readable); NULL with TLS. */
    struct event *rd;
    struct evbuffer_cb_entry *drained; /* rd's: input taken below INPUT_HIGH */
    int reading;          /* the connection reads (read_on), TLS or not */
    int full;             /* rd is off until the input goes below INPUT_HIGH */
    struct event *timer;
    struct http_parser parser;
    enum conn_state state;
    int timer_is_request; /* the timer is a request deadline, not idle: 1 for
                             its head (header_timeout), 2 for its body */
    int close_after_write;
    size_t unsent;        /* WRITING: bytes not yet taken by the peer, last seen */
    int64_t sent_ms;      /* when that last went down (send_timeout counts from it) */
    int peer_eof;         /* the client shut its sending side: read no more */
    int head_request;
    int admin;            /* accepted on the admin listener */
    int tls;              /* c->bev is an OpenSSL bufferevent */
    peer_ref peer_slot;   /* the main listener's: its address's counts */
    unsigned requests;
    char peer[64];
    struct front_request req;
    struct conn *prev, *next; /* all connections */
};

struct front {
    struct event_base *base;
    struct evconnlistener *listener;
    struct evconnlistener *admin_listener; /* admin_listen, or NULL */
    struct tls_server *tls, *admin_tls;    /* the listeners' TLS, or NULL */
    struct event *drain_ev;
    struct event *accept_pause_ev;  /* listening again after a failed accept() */
    unsigned long accept_failures;  /* since the last log line */
    int64_t accept_logged_ms;
    const struct server_limits *limits;
    struct http_limits parse_limits;
    front_handler_fn handler;
    void *handler_arg;
    front_log_fn log;               /* or NULL */
    void *log_arg;
    void *loop_ctx;
    int port, admin_port;
    int draining;
    int closing;                    /* front_free() is running the last steps */
    char scratch[READ_MAX];         /* on_readable's, on this front's loop */

    pthread_mutex_t mu;             /* guards in_flight */
    size_t in_flight;               /* this loop's requests being handled */

    struct injected *injected;      /* front_inject()'s, not answered yet */
    uint32_t id_seed;               /* this loop's request ids: random, then a count */
    uint64_t id_count;
    size_t nconns;            /* this loop's connections */
    struct front_counts own_counts;
    struct front_counts *counts; /* all loops': what the limits count */
    struct conn *conns;
};

static void conn_free(struct conn *c);
static void process_input(struct conn *c);
static void on_event(struct bufferevent *bev, short what, void *arg);

/* The answer that needs no allocation: over the connection limit, or out of
 * memory. */
#define OVERLOADED_BODY                                                             \
    "{\"type\":\"urn:idem:overloaded\",\"title\":\"Service Unavailable\",\"status\":503," \
    "\"detail\":\"try later\"}"
_Static_assert(sizeof OVERLOADED_BODY - 1 == 94, "fix Content-Length below");
static const char fixed_503[] =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"
    "Content-Length: 94\r\nConnection: close\r\n\r\n" OVERLOADED_BODY;

static void arm_timer(struct conn *c, int64_t ms, int is_request)
{
    struct timeval tv = ms_timeval(ms);
    c->timer_is_request = is_request;
    evtimer_add(c->timer, &tv);
}

/* The bytes of answers the peer has not taken (acknowledged) yet: what the
 * output buffer holds, and what the socket has not sent or had
 * acknowledged. It goes down as, and only as, the peer reads. */
static size_t unsent_bytes(struct conn *c)
{
    int queued = 0;
    if (ioctl(bufferevent_getfd(c->bev), TIOCOUTQ, &queued) != 0 || queued < 0)
        queued = 0;
    return evbuffer_get_length(bufferevent_get_output(c->bev)) + (size_t)queued;
}

/* How often a WRITING connection is looked at: a quarter of send_timeout,
 * from 10 ms to 1 s. */
static int64_t send_check_ms(const struct conn *c)
{
    int64_t ms = c->f->limits->send_timeout_ms / 4;
    return ms < 10 ? 10 : ms > 1000 ? 1000 : ms;
}

/* Read from the socket, or stop. A plain connection's reads are its own
 * (on_readable); a TLS one's are its bufferevent's. */
static void read_on(struct conn *c)
{
    if (c->reading)
        return;
    c->reading = 1;
    if (c->rd && !c->full)
        event_add(c->rd, NULL);
    else if (!c->rd)
        bufferevent_enable(c->bev, EV_READ);
}

static void read_off(struct conn *c)
{
    if (!c->reading)
        return;
    c->reading = 0;
    if (c->rd)
        event_del(c->rd);
    else
        bufferevent_disable(c->bev, EV_READ);
}

static void set_state(struct conn *c, enum conn_state s)
{
    c->state = s;
    switch (s) {
    case READING:
        arm_timer(c, c->f->limits->idle_timeout_ms, 0);
        if (!c->peer_eof)
            read_on(c);
        break;
    case HANDLING:
        /* Reads stay on (no epoll_ctl per request): what a client pipelines
         * waits in the input buffer, up to INPUT_HIGH, and its leaving is
         * seen at once. */
        evtimer_del(c->timer);
        break;
    case WRITING:
        /* An answer the socket took whole is done; one it did not is
         * watched: the peer must keep taking it (send_timeout). */
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
            evtimer_del(c->timer);
        } else {
            c->unsent = SIZE_MAX;
            c->sent_ms = mono_ms();
            arm_timer(c, send_check_ms(c), 0);
        }
        break;
    case ORPHANED:
        evtimer_del(c->timer);
        read_off(c);
        bufferevent_disable(c->bev, EV_WRITE);
        break;
    case LINGERING: {
        /* What was buffered is dropped too, so that reading (suspended at
         * INPUT_HIGH, maybe) goes on until the peer's EOF. */
        struct evbuffer *in = bufferevent_get_input(c->bev);
        evbuffer_drain(in, evbuffer_get_length(in));
        if (c->tls) /* the answer is whole: close_notify says so */
            SSL_shutdown(bufferevent_openssl_get_ssl(c->bev));
        shutdown(bufferevent_getfd(c->bev), SHUT_WR);
        arm_timer(c, LINGER_MS, 0);
        read_on(c);
        break;
    }
    }
}

/* Out with one send() when the socket takes it all, which is the usual
 * case: no write event to add and remove. What it does not take goes
 * through the bufferevent (whose errors then report the peer gone).
 * 1 if everything went out. */
static int send_now(struct conn *c, const char *bytes, size_t len)
{
    ssize_t n = 0;
    if (!c->tls && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
        n = send(bufferevent_getfd(c->bev), bytes, len, MSG_NOSIGNAL);
    if (n < 0)
        n = 0;
    if ((size_t)n == len)
        return 1;
    bufferevent_write(c->bev, bytes + n, len - (size_t)n);
    return 0;
}

static void on_written(struct conn *c, int now);

/* The connection stays open after this answer (a kept-alive answer is
 * right for it): no limit reached, no draining, no close asked. */
static int keeps_open(const struct conn *c)
{
    return !c->close_after_write && !c->f->draining &&
           c->requests + 1 < c->f->limits->requests_per_connection;
}

/* Send a response and go to WRITING; on_written() finishes. */
static void send_response(struct conn *c, struct http_response *r)
{
    size_t len = 0;
    char *bytes = NULL;
    if (r) {
        if (!keeps_open(c))
            c->close_after_write = 1;
        c->requests++;
        r->close = r->close || c->close_after_write;
        c->close_after_write = r->close;
        bytes = response_serialize(r, c->head_request, &len);
    }
    int out;
    if (!bytes) {
        c->close_after_write = 1;
        out = send_now(c, fixed_503, sizeof fixed_503 - 1);
    } else {
        out = send_now(c, bytes, len);
        free(bytes);
    }
    set_state(c, WRITING);
    if (out)
        on_written(c, 1);
}

/* A request refused before any handler had it (a limit, or the parser): its
 * line in the access log all the same, as nginx logs its 400, 408, 413 and
 * 414. */
static void log_refused(struct conn *c, struct http_msg *msg, int status, const char *why)
{
    struct front *f = c->f;
    if (!f->log || c->admin)
        return;
    struct front_request r;
    memset(&r, 0, sizeof r);
    r.msg = msg;
    r.front = f;
    r.start_us = mono_us();
    r.log_outcome = why;
    _Static_assert(sizeof r.peer == sizeof c->peer, "one size for the peer's name");
    memcpy(r.peer, c->peer, sizeof c->peer);
    f->log(f->log_arg, &r, status);
}

/* The line for a request the parser refused or that came too late: what
 * was read of it, its method and target if they were. */
static void log_unparsed(struct conn *c, int status, const char *type)
{
    const struct http_msg *part = http_parser_partial(&c->parser);
    struct http_msg m;
    memset(&m, 0, sizeof m);
    m.method = part ? part->method : NULL;
    m.target = part && part->target ? part->target : "";
    m.headers = part ? part->headers : NULL;
    m.header_count = part ? part->header_count : 0;
    log_refused(c, &m, status, type);
}

static void send_problem_and_close(struct conn *c, int status, const char *type,
                                   const char *detail)
{
    log_unparsed(c, status, type);
    struct http_response *r = problem(status, type, "%s", detail);
    if (r)
        r->close = 1;
    c->close_after_write = 1;
    send_response(c, r);
    response_free(r);
}

/* ---- steps and answers ---- */

int front_closing(const struct front_request *req)
{
    return req->front->closing;
}

int front_can_answer_raw(const struct front_request *req)
{
    const struct conn *c = req->conn;
    return c && c->state == HANDLING && !c->head_request && keeps_open(c);
}

/* The handler is done with req: it no longer counts as in flight. */
static void handled(struct front_request *req)
{
    struct front *f = req->front;
    pthread_mutex_lock(&f->mu);
    f->in_flight--;
    pthread_mutex_unlock(&f->mu);
    if (!req->admin) {
        atomic_fetch_sub(&f->counts->in_flight, 1);
        if (f->counts->peers)
            peer_request_done(f->counts->peers, req->conn->peer_slot);
    }
    http_msg_free(req->msg);
    req->msg = NULL;
    req->on_abort = NULL;
}

void front_set_log(struct front *f, front_log_fn fn, void *arg)
{
    f->log = fn;
    f->log_arg = arg;
}

/* The access log's line for req, before handled() lets go of its message. */
static void log_answer(struct front_request *req, int status)
{
    struct front *f = req->front;
    if (f->log && !req->admin)
        f->log(f->log_arg, req, status);
}

void front_answer_raw(struct front_request *req, const void *bytes, size_t len)
{
    struct conn *c = req->conn;
    /* "HTTP/1.1 201 ...": the status of an answer serialized already. */
    const char *b = bytes;
    /* Its body: what follows the head's blank line. */
    const char *end = memmem(bytes, len, "\r\n\r\n", 4);
    req->bytes_out = end ? len - (size_t)(end + 4 - b) : 0;
    log_answer(req, len > 12 ? (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0') : 0);
    handled(req);
    c->requests++;
    int out = send_now(c, bytes, len);
    set_state(c, WRITING);
    if (out)
        on_written(c, 1);
}

/* The loops have stopped (front_free): what is left to answer gets one
 * send of its answer, marked closing, and no more — nothing will run to
 * finish a partial write — before its connection goes. Best effort: an
 * answer larger than the socket's buffer is cut, and a client that had
 * pipelined more requests may see the close as a reset. */
static void answer_at_close(struct conn *c, struct http_response *r)
{
    size_t len = 0;
    char *bytes = NULL;
    if (r) {
        r->close = 1;
        bytes = response_serialize(r, c->head_request, &len);
    }
    /* What send_now() cannot send at once it leaves in the output buffer,
     * which goes with the connection. */
    if (bytes)
        send_now(c, bytes, len);
    else
        send_now(c, fixed_503, sizeof fixed_503 - 1);
    free(bytes);
}

/* A request front_inject() made: its answer goes to answered, on the loop,
 * instead of a client. req comes first, so that a request with no
 * connection is one of these. */
struct injected {
    struct front_request req;
    front_answered_fn answered;
    void *owner;                   /* answered's */
    struct injected *prev, *next;  /* the front's, not answered yet */
};

static struct injected *injected_of(struct front_request *req)
{
    return (struct injected *)req;
}

static void unlink_injected(struct injected *in)
{
    struct front *f = in->req.front;
    if (in->prev)
        in->prev->next = in->next;
    else
        f->injected = in->next;
    if (in->next)
        in->next->prev = in->prev;
}

static void free_injected(struct injected *in)
{
    http_msg_free(in->req.msg);
    response_free(in->req.resp);
    free(in);
}

struct front_request *front_inject(struct front *f, struct http_msg *msg,
                                   front_answered_fn answered, void *owner)
{
    struct injected *in = f->draining || f->closing ? NULL : calloc(1, sizeof *in);
    if (!in) {
        http_msg_free(msg);
        return NULL;
    }
    in->req.start_us = mono_us();
    in->req.msg = msg;
    in->req.front = f;
    in->req.loop_ctx = f->loop_ctx;
    in->answered = answered;
    in->owner = owner;
    in->next = f->injected;
    if (f->injected)
        f->injected->prev = in;
    f->injected = in;
    pthread_mutex_lock(&f->mu);
    f->in_flight++;
    pthread_mutex_unlock(&f->mu);
    return &in->req;
}

static void answer_injected(struct injected *in)
{
    struct front *f = in->req.front;
    pthread_mutex_lock(&f->mu);
    f->in_flight--;
    int idle = f->draining && f->in_flight == 0;
    pthread_mutex_unlock(&f->mu);
    unlink_injected(in);
    in->req.on_abort = NULL;
    in->answered(in->owner, &in->req);
    free_injected(in);
    if (idle)
        event_active(f->drain_ev, EV_TIMEOUT, 0);
}

void front_answer(struct front_request *req)
{
    struct conn *c = req->conn;
    if (!c) {
        answer_injected(injected_of(req));
        return;
    }
    req->bytes_out = req->resp ? req->resp->body_len : 0;
    log_answer(req, req->resp ? req->resp->status : 503);
    handled(req);
    if (c->state == ORPHANED || c->f->closing) {
        if (c->state != ORPHANED)
            answer_at_close(c, req->resp);
        response_free(req->resp);
        req->resp = NULL;
        conn_free(c);
        return;
    }
    send_response(c, req->resp);
    response_free(req->resp);
    req->resp = NULL;
}

/* The request's id: the client's X-Request-Id when it gives one (which
 * goes upstream with its other headers, and to the log escaped), else one
 * made here, which the gateway adds: this loop's random seed and its
 * count, unique in practice across loops, restarts and instances. */
static void request_id(struct front *f, const struct http_msg *msg, struct front_request *req)
{
    const char *v = http_msg_header(msg, "X-Request-Id");
    if (v) {
        snprintf(req->request_id, sizeof req->request_id, "%s", v);
        return;
    }
    snprintf(req->request_id, sizeof req->request_id, "%08" PRIx32 "%016" PRIx64, f->id_seed,
             ++f->id_count);
    req->request_id_own = 1;
}

static void dispatch(struct conn *c, struct http_msg *msg)
{
    struct front *f = c->f;
    c->head_request = strcmp(msg->method, "HEAD") == 0;
    if (!msg->keep_alive)
        c->close_after_write = 1;
    set_state(c, HANDLING);

    /* in_flight_max counts the main listener's requests on every loop. The
     * admin listener's are not held to it (its connections, each one
     * request at a time, bound them), so that the clients of the main
     * listener cannot crowd the operators out. */
    if (!c->admin &&
        atomic_fetch_add(&f->counts->in_flight, 1) >= f->limits->in_flight_max) {
        atomic_fetch_sub(&f->counts->in_flight, 1);
        log_refused(c, msg, 503, "overloaded");
        http_msg_free(msg);
        struct http_response *r =
            problem(503, "overloaded", "%zu requests are being handled, the in_flight_max limit",
                    f->limits->in_flight_max);
        if (r)
            response_add_header(r, "Retry-After", "1");
        send_response(c, r);
        response_free(r);
        return;
    }
    /* And one client address, in_flight_per_peer of them: one that waits
     * on a thousand duplicates does not take in_flight_max from the rest. */
    if (!c->admin && f->counts->peers &&
        peer_request_add(f->counts->peers, c->peer_slot, f->limits->in_flight_per_peer) != 0) {
        atomic_fetch_sub(&f->counts->in_flight, 1);
        log_refused(c, msg, 503, "overloaded");
        http_msg_free(msg);
        struct http_response *r =
            problem(503, "overloaded", "this client address has %zu requests being handled, "
                    "the in_flight_per_peer limit", f->limits->in_flight_per_peer);
        if (r)
            response_add_header(r, "Retry-After", "1");
        send_response(c, r);
        response_free(r);
        return;
    }
    pthread_mutex_lock(&f->mu);
    f->in_flight++;
    pthread_mutex_unlock(&f->mu);
    memset(&c->req, 0, sizeof c->req);
    c->req.start_us = mono_us();
    request_id(f, msg, &c->req);
    c->req.msg = msg;
    c->req.conn = c;
    c->req.front = f;
    c->req.loop_ctx = f->loop_ctx;
    c->req.admin = c->admin;
    c->req.tls = c->tls;
    _Static_assert(sizeof c->req.peer == sizeof c->peer, "one size for the peer's name");
    memcpy(c->req.peer, c->peer, sizeof c->peer);
    f->handler(f->handler_arg, &c->req);
}

static void process_input(struct conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    while (c->state == READING && evbuffer_get_length(in) > 0) {
        /* Feed contiguous chunks without copying. */
        struct evbuffer_iovec v[8];
        int n = evbuffer_peek(in, -1, NULL, v, 8);
        if (n > 8)
            n = 8;
        size_t total = 0;
        enum http_parse_status st = HTTP_NEED_MORE;
        for (int i = 0; i < n && st == HTTP_NEED_MORE; i++) {
            size_t used = 0;
            st = http_parser_feed(&c->parser, v[i].iov_base, v[i].iov_len, &used);
            total += used;
        }
        evbuffer_drain(in, total);
        if (st == HTTP_ERROR) {
            send_problem_and_close(c, c->parser.error_status,
                                   c->parser.error_status == 413   ? "body_too_large"
                                   : c->parser.error_status == 431 ? "headers_too_large"
                                   : c->parser.error_status == 414 ? "request_line_too_long"
                                                                   : "malformed_request",
                                   c->parser.error_detail);
            return;
        }
        if (st == HTTP_DONE) {
            struct http_msg *msg = http_parser_take(&c->parser);
            http_parser_reset(&c->parser);
            if (!msg) {
                send_problem_and_close(c, 503, "overloaded", "out of memory");
                return;
            }
            dispatch(c, msg);
            return;
        }
        /* The head's deadline runs from the request's first byte, empty
         * lines before it included: the parser skips those and is then out
         * of a message again, and arming at each new start would let a
         * client sending a CRLF now and then keep its connection for good. */
        if (c->timer_is_request == 0 && total > 0)
            arm_timer(c, c->f->limits->header_timeout_ms, 1);
        if (c->timer_is_request == 1 && http_parser_in_body(&c->parser))
            arm_timer(c, c->f->limits->body_timeout_ms, 2);
        if (c->parser.expect_continue) {
            /* The head is accepted (its limits were checked): the client
             * may send the body, instead of waiting out its own timer. */
            static const char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
            c->parser.expect_continue = 0;
            send_now(c, go_on, sizeof go_on - 1);
        }
    }
    /* Every whole request the client sent before shutting its side has been
     * answered; what is left can never complete. */
    if (c->state == READING && c->peer_eof)
        conn_free(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (c->state == LINGERING) {
        struct evbuffer *in = bufferevent_get_input(bev);
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    process_input(c); /* reads nothing unless READING */
}

/* A plain connection's socket is readable (or later() asked). libevent's
 * socket bufferevent asks the kernel how much there is (ioctl FIONREAD)
 * before each read: a system call a request that nginx does not make. This
 * reads with one recv() into the loop's scratch buffer, as much as fits
 * under INPUT_HIGH (then stops reading until the requests before it are
 * taken: on_drained), adds what came to the input (a request's few hundred
 * bytes: a copy costs less than reserving room for a whole read in the
 * buffer, which allocates), and hands on as the bufferevent would: on_read
 * with what is buffered, on_event at the peer's EOF or an error. */
static void on_readable(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(c->bev);
    size_t have = evbuffer_get_length(in);
    (void)what;
    /* Reading off, this is later()'s call: the bufferevent's trigger ran
     * the read callback without reading either. On, it reads even after
     * the peer's EOF (LINGERING turns reading on again): the socket stays
     * readable, and the second EOF is what frees the connection. */
    if (c->reading && have < INPUT_HIGH) {
        size_t want = INPUT_HIGH - have < READ_MAX ? INPUT_HIGH - have : READ_MAX;
        ssize_t n = recv(fd, c->f->scratch, want, 0);
        if (n > 0 && evbuffer_add(in, c->f->scratch, (size_t)n) != 0) {
            n = -1;
            errno = ENOMEM;
        }
        if (n == 0) {
            on_event(c->bev, BEV_EVENT_EOF | BEV_EVENT_READING, c);
            return;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            on_event(c->bev, BEV_EVENT_ERROR | BEV_EVENT_READING, c);
            return;
        }
        have = evbuffer_get_length(in);
    }
    if (have >= INPUT_HIGH && !c->full) {
        c->full = 1;
        event_del(c->rd);
    }
    if (have > 0 || c->peer_eof)
        on_read(c->bev, c);
}

/* rd's input went below INPUT_HIGH: read again, if reading. */
static void on_drained(struct evbuffer *in, const struct evbuffer_cb_info *info, void *arg)
{
    struct conn *c = arg;
    if (c->full && info->n_deleted > 0 && evbuffer_get_length(in) < INPUT_HIGH) {
        c->full = 0;
        if (c->reading)
            event_add(c->rd, NULL);
    }
}

/* Run the read callback from the loop soon, with what is buffered. */
static void later(struct conn *c)
{
    if (c->rd)
        event_active(c->rd, EV_READ, 0);
    else
        bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_DEFER_CALLBACKS);
}

/* The answer is out: close, or read the next request. now: written from
 * inside send_response(), whose caller may be a handler still on the stack
 * — a pipelined request then waits for the loop, not for a recursion. */
static void on_written(struct conn *c, int now)
{
    if (c->close_after_write) {
        set_state(c, LINGERING);
        return;
    }
    set_state(c, READING);
    if (!now)
        process_input(c);
    else if (evbuffer_get_length(bufferevent_get_input(c->bev)) > 0 || c->peer_eof)
        later(c);
}

static void on_write(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    (void)bev;
    if (c->state == WRITING)
        on_written(c, 0);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    (void)bev;
    if (what == BEV_EVENT_CONNECTED)
        return; /* a TLS handshake done: requests come through on_read */
    /* The client shut its side after its request(s): it may still read our
     * answers (a half-close). The requests already in the input buffer are
     * answered in order, then the connection closes (process_input). Seen
     * while READING too: an answer given at once (a replay, a 4xx) left the
     * next pipelined request to be parsed later, after this event. */
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) &&
        (c->state == HANDLING || c->state == WRITING || c->state == READING)) {
        c->peer_eof = 1;
        read_off(c);
        if (c->state == READING)
            process_input(c); /* frees c once nothing whole is left */
        return;
    }
    /* An error: the peer is gone. */
    if (c->state == HANDLING) {
        set_state(c, ORPHANED); /* freed at front_answer() */
        return;
    }
    conn_free(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct conn *c = arg;
    (void)fd;
    (void)what;
    if (c->state == LINGERING) {
        conn_free(c);
        return;
    }
    if (c->state == WRITING) {
        /* Cut off once the peer has taken nothing for send_timeout: one that
         * never reads would hold its connection, and its answers, for ever. */
        size_t unsent = unsent_bytes(c);
        int64_t now = mono_ms();
        if (unsent < c->unsent) {
            c->unsent = unsent;
            c->sent_ms = now;
        }
        if (now - c->sent_ms < c->f->limits->send_timeout_ms) {
            arm_timer(c, send_check_ms(c), 0);
            return;
        }
        conn_free(c);
        return;
    }
    if (c->state == READING && c->timer_is_request) {
        send_problem_and_close(c, 408, "request_timeout",
                               c->timer_is_request == 1
                                   ? "the request's head did not arrive within header_timeout"
                                   : "the request's body did not arrive within body_timeout");
        return;
    }
    conn_free(c);
}

static void conn_free(struct conn *c)
{
    struct front *f = c->f;
    if (c->prev)
        c->prev->next = c->next;
    else
        f->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    f->nconns--;
    atomic_fetch_sub(c->admin ? &f->counts->admin_connections : &f->counts->connections, 1);
    if (!c->admin && f->counts->peers)
        peer_conn_done(f->counts->peers, c->peer_slot);
    if (c->timer)
        event_free(c->timer);
    if (c->rd)
        event_free(c->rd);
    if (c->drained)
        evbuffer_remove_cb_entry(bufferevent_get_input(c->bev), c->drained);
    if (c->bev)
        bufferevent_free(c->bev);
    http_parser_free(&c->parser);
    http_msg_free(c->req.msg);
    response_free(c->req.resp);
    free(c);
    if (f->draining) {
        pthread_mutex_lock(&f->mu);
        int idle = f->in_flight == 0;
        pthread_mutex_unlock(&f->mu);
        if (idle)
            event_active(f->drain_ev, EV_TIMEOUT, 0);
    }
}

static void format_peer(const struct sockaddr *sa, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &s->sin_addr, host, sizeof host);
        port = ntohs(s->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof host);
        port = ntohs(s->sin6_port);
    } else if (sa->sa_family == AF_UNIX) {
        snprintf(out, cap, "unix");
        return;
    }
    snprintf(out, cap, "%s:%d", host, port);
}

size_t front_peer_host(const char *peer)
{
    const char *colon = strrchr(peer, ':');
    return colon ? (size_t)(colon - peer) : strlen(peer);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    struct front *f = arg;
    (void)salen;
    /* Admin connections have a limit and a count of their own: a flood on
     * the main listener does not lock the operators out. */
    int admin = l == f->admin_listener;
    atomic_size_t *count = admin ? &f->counts->admin_connections : &f->counts->connections;
    size_t max = admin ? f->limits->admin_connections_max : f->limits->connections_max;
    /* Counted before the check, in one step: the loops, accepting at once,
     * cannot all see room for one more. conn_free() gives it back. */
    size_t open = atomic_fetch_add(count, 1);
    int over = open >= max || f->draining;
    /* And from one client address, connections_per_peer (main listener). */
    char peer[64];
    peer_ref ref = 0;
    format_peer(sa, peer, sizeof peer);
    if (!admin && f->counts->peers)
        over |= peer_conn_add(f->counts->peers, peer, front_peer_host(peer),
                              f->limits->connections_per_peer, &ref);
    struct conn *c = over && open >= max + OVER_LIMIT_GRACE ? NULL : calloc(1, sizeof *c);
    if (!c) {
        atomic_fetch_sub(count, 1);
        if (!admin && f->counts->peers)
            peer_conn_done(f->counts->peers, ref);
        evutil_closesocket(fd); /* out of memory, or a flood: not even an answer */
        return;
    }
    c->peer_slot = ref;
    int one = 1;
    if (sa->sa_family != AF_UNIX)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->f = f;
    c->admin = admin;
    struct tls_server *tls = admin ? f->admin_tls : f->tls;
    SSL *ssl = tls ? tls_server_ssl(tls) : NULL;
    c->tls = tls != NULL;
    if (tls && !ssl)
        c->bev = NULL; /* out of memory: closed below */
    else if (tls)
        c->bev = bufferevent_openssl_socket_new(f->base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                                BEV_OPT_CLOSE_ON_FREE);
    else
        c->bev = bufferevent_socket_new(f->base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (c->bev && tls) /* a client that closes without close_notify is gone, not an attack */
        bufferevent_openssl_set_allow_dirty_shutdown(c->bev, 1);
    c->timer = evtimer_new(f->base, on_timer, c);
    if (c->bev && !tls) {
        /* The socket bufferevent keeps its input's end frozen but while it
         * reads itself, which it never does here. */
        evbuffer_unfreeze(bufferevent_get_input(c->bev), 0);
        c->rd = event_new(f->base, fd, EV_READ | EV_PERSIST, on_readable, c);
        c->drained = evbuffer_add_cb(bufferevent_get_input(c->bev), on_drained, c);
    }
    http_parser_init(&c->parser, HTTP_PARSE_REQUEST, &f->parse_limits);
    memcpy(c->peer, peer, sizeof c->peer);
    c->next = f->conns;
    if (f->conns)
        f->conns->prev = c;
    f->conns = c;
    f->nconns++;
    if (!c->bev || !c->timer || (!tls && (!c->rd || !c->drained))) {
        if (!c->bev)
            evutil_closesocket(fd);
        if (!c->bev && ssl)
            SSL_free(ssl);
        conn_free(c);
        return;
    }
    bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
    if (c->tls) /* a plain connection's reads stop there by themselves: on_readable */
        bufferevent_setwatermark(c->bev, EV_READ, 0, INPUT_HIGH);
    if (over) {
        /* Answered and closed, without reading a request. */
        c->close_after_write = 1;
        bufferevent_write(c->bev, fixed_503, sizeof fixed_503 - 1);
        set_state(c, WRITING);
        bufferevent_enable(c->bev, EV_WRITE);
        return;
    }
    set_state(c, READING);
}

/* accept() failed: out of file descriptors, most likely (EMFILE, ENFILE),
 * or of memory. The listening socket stays readable, so trying again at once
 * would spin (and log each failure): the loop stops accepting for
 * ACCEPT_PAUSE_MS, the waiting clients stay in the backlog meanwhile, and
 * the failures are logged at most every ACCEPT_LOG_MS. */
static void on_accept_error(struct evconnlistener *l, void *arg)
{
    struct front *f = arg;
    int err = EVUTIL_SOCKET_ERROR();
    (void)l;
    f->accept_failures++;
    int64_t now = mono_ms();
    if (!f->accept_logged_ms || now - f->accept_logged_ms >= ACCEPT_LOG_MS) {
        daemon_log("accepting connections failed: %s (%lu times%s); pausing %d ms each time%s",
                   evutil_socket_error_to_string(err), f->accept_failures,
                   f->accept_logged_ms ? " since the last line" : "", ACCEPT_PAUSE_MS,
                   err == EMFILE || err == ENFILE
                       ? ": out of file descriptors (raise the limit, ulimit -n or "
                         "LimitNOFILE, or lower connections_max)"
                       : "");
        f->accept_logged_ms = now;
        f->accept_failures = 0;
    }
    if (f->listener)
        evconnlistener_disable(f->listener);
    if (f->admin_listener)
        evconnlistener_disable(f->admin_listener);
    struct timeval tv = ms_timeval(ACCEPT_PAUSE_MS);
    evtimer_add(f->accept_pause_ev, &tv);
}

static void on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct front *f = arg;
    (void)fd;
    (void)what;
    /* (Gone if the front drained meanwhile.) */
    if (f->listener)
        evconnlistener_enable(f->listener);
    if (f->admin_listener)
        evconnlistener_enable(f->admin_listener);
}

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
    struct front *f = arg;
    (void)fd;
    (void)what;
    /* Called on the drain deadline, or when the last request finished. */
    event_base_loopexit(f->base, NULL);
}

struct front *front_new(struct event_base *base, const struct server_limits *limits,
                        front_handler_fn fn, void *arg, void *loop_ctx)
{
    struct front *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->base = base;
    f->limits = limits;
    f->handler = fn;
    f->handler_arg = arg;
    f->loop_ctx = loop_ctx;
    if (RAND_bytes((unsigned char *)&f->id_seed, sizeof f->id_seed) != 1)
        f->id_seed = (uint32_t)mono_us();
    f->parse_limits.request_line_max = limits->request_line_max;
    f->parse_limits.header_count_max = limits->header_count_max;
    f->parse_limits.header_bytes_max = limits->header_bytes_max;
    f->parse_limits.body_max = limits->body_max;
    pthread_mutex_init(&f->mu, NULL);
    front_counts_init(&f->own_counts);
    f->counts = &f->own_counts;
    f->drain_ev = event_new(base, -1, 0, on_drain, f);
    f->accept_pause_ev = evtimer_new(base, on_accept_resume, f);
    if (!f->drain_ev || !f->accept_pause_ev) {
        front_free(f);
        return NULL;
    }
    return f;
}

/* The bound address of a listener. */
static void bound_address(struct evconnlistener *l, struct sockaddr_storage *a)
{
    socklen_t len = sizeof *a;
    memset(a, 0, sizeof *a);
    getsockname(evconnlistener_get_fd(l), (struct sockaddr *)a, &len);
}

static const struct sockaddr_in *in4(const struct sockaddr_storage *a)
{
    return (const void *)a;
}

static const struct sockaddr_in6 *in6(const struct sockaddr_storage *a)
{
    return (const void *)a;
}

static int address_port(const struct sockaddr_storage *a)
{
    return ntohs(a->ss_family == AF_INET6 ? in6(a)->sin6_port : in4(a)->sin_port);
}

static int address_is_any(const struct sockaddr_storage *a)
{
    if (a->ss_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&in6(a)->sin6_addr);
    return in4(a)->sin_addr.s_addr == htonl(INADDR_ANY);
}

static int address_equal(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET6)
        return memcmp(&in6(a)->sin6_addr, &in6(b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return in4(a)->sin_addr.s_addr == in4(b)->sin_addr.s_addr;
}

/* An IPv6 socket that takes IPv6 only (else :: takes IPv4 too). */
static int v6_only(struct evconnlistener *l)
{
    int on = 0;
    socklen_t len = sizeof on;
    getsockopt(evconnlistener_get_fd(l), IPPROTO_IPV6, IPV6_V6ONLY, &on, &len);
    return on;
}

/* Does wildcard listener w (bound to wa) take connections meant for o? */
static int wildcard_covers(struct evconnlistener *w, const struct sockaddr_storage *wa,
                           struct evconnlistener *o, const struct sockaddr_storage *oa)
{
    if (wa->ss_family == AF_INET) /* 0.0.0.0: IPv4, and a dual-stack :: */
        return oa->ss_family == AF_INET || (address_is_any(oa) && !v6_only(o));
    return oa->ss_family == AF_INET6 || !v6_only(w);
}

/* Would the kernel hand connections for one listener to the other? With
 * SO_REUSEPORT (which the loops need to share their port) a second bind of
 * the same address succeeds and joins the first, and a wildcard address
 * takes what a specific one on its port does not. Compared after binding,
 * so that every spelling of an address (a host name, --listen, port 0)
 * is caught. */
static int listeners_overlap(struct evconnlistener *x, struct evconnlistener *y)
{
    struct sockaddr_storage a, b;
    bound_address(x, &a);
    bound_address(y, &b);
    if (address_port(&a) != address_port(&b))
        return 0;
    return address_equal(&a, &b) || (address_is_any(&a) && wildcard_covers(x, &a, y, &b)) ||
           (address_is_any(&b) && wildcard_covers(y, &b, x, &a));
}

/* host:port's first address to listen on, or NULL with err filled. */
static struct addrinfo *listen_address(const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    int gai = getaddrinfo(host, ports, &hints, &ai);
    if (gai != 0) {
        snprintf(err, errlen, "%s:%d: %s", host, port, gai_strerror(gai));
        return NULL;
    }
    return ai;
}

int front_address_free(const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo *ai = listen_address(host, port, err, errlen);
    if (!ai)
        return -1;
    /* Without SO_REUSEPORT, a bind fails where anyone listens (SO_REUSEADDR
     * only passes over connections of an earlier process in TIME_WAIT). */
    int rc = 0, one = 1;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        rc = -1;
        if (errno == EADDRINUSE)
            snprintf(err, errlen, "%s:%d: in use by another process (a second idem serve? "
                     "two daemons on one port would split the clients between them)",
                     host, port);
        else
            snprintf(err, errlen, "%s:%d: %s", host, port, strerror(errno));
    }
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return rc;
}

int front_listen(struct front *f, const char *host, int port, int admin, struct tls_server *tls,
                 char *err, size_t errlen)
{
    struct addrinfo *ai = listen_address(host, port, err, errlen);
    if (!ai)
        return -1;
    struct evconnlistener *l = evconnlistener_new_bind(
        f->base, on_accept, f,
        LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE | LEV_OPT_REUSEABLE_PORT |
            LEV_OPT_CLOSE_ON_EXEC,
        1024, ai->ai_addr, (int)ai->ai_addrlen);
    freeaddrinfo(ai);
    if (!l) {
        snprintf(err, errlen, "%s:%d: %s", host, port, strerror(errno));
        return -1;
    }
    evconnlistener_set_error_cb(l, on_accept_error);
    struct sockaddr_storage bound;
    bound_address(l, &bound);
    int bound_port = address_port(&bound);
    struct evconnlistener *other = admin ? f->listener : f->admin_listener;
    if (other && listeners_overlap(l, other)) {
        evconnlistener_free(l);
        snprintf(err, errlen, "%s:%d: overlaps the %s address (the same address and port, "
                 "or a wildcard address on the same port): the two need addresses of their own",
                 host, bound_port, admin ? "listen" : "admin_listen");
        return -1;
    }
    if (admin) {
        f->admin_listener = l;
        f->admin_port = bound_port;
        f->admin_tls = tls;
    } else {
        f->listener = l;
        f->port = bound_port;
        f->tls = tls;
    }
    return 0;
}

int front_listen_unix(struct front *f, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int fd = -1;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "unix:%s: longer than a Unix socket's path may be", path);
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    /* A socket left by a daemon that died is taken over; one that a live
     * process answers on is not, nor is anything that is not a socket. */
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "unix:%s: exists and is not a socket", path);
            return -1;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            snprintf(err, errlen, "unix:%s: in use by another process (a second idem serve "
                     "in one state directory?)", path);
            return -1;
        }
        unlink(path);
    }
    /* Made 0600 from the start (umask), not chmod()ed after: no instant in
     * which another user could connect. */
    mode_t was = umask(0177);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : -1;
    umask(was);
    if (rc != 0 || listen(fd, 128) != 0) {
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    struct evconnlistener *l =
        evconnlistener_new(f->base, on_accept, f, LEV_OPT_CLOSE_ON_FREE, -1, fd);
    if (!l) {
        snprintf(err, errlen, "unix:%s: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        return -1;
    }
    evconnlistener_set_error_cb(l, on_accept_error);
    f->admin_listener = l;
    f->admin_port = 0;
    return 0;
}

void front_counts_init(struct front_counts *n)
{
    atomic_init(&n->connections, 0);
    atomic_init(&n->admin_connections, 0);
    atomic_init(&n->in_flight, 0);
    n->peers = NULL;
}

void front_share_counts(struct front *f, struct front_counts *counts)
{
    f->counts = counts;
}

int front_port(const struct front *f, int admin)
{
    return admin ? f->admin_port : f->port;
}

size_t front_in_flight(struct front *f)
{
    pthread_mutex_lock(&f->mu);
    size_t n = f->in_flight;
    pthread_mutex_unlock(&f->mu);
    return n;
}

void front_drain(struct front *f, int64_t timeout_ms)
{
    f->draining = 1;
    /* Closed, not only no longer accepted from: a socket still listening
     * would let the kernel complete new clients' handshakes, and they would
     * hang until the process ends instead of being refused at once (and
     * going to another instance). */
    if (f->listener)
        evconnlistener_free(f->listener);
    if (f->admin_listener)
        evconnlistener_free(f->admin_listener);
    f->listener = f->admin_listener = NULL;
    /* Idle connections go now; busy ones close after their answer. */
    for (struct conn *c = f->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == READING && !http_parser_in_message(&c->parser))
            conn_free(c);
        else
            c->close_after_write = 1;
    }
    struct timeval tv = ms_timeval(timeout_ms);
    if (front_in_flight(f) == 0)
        event_active(f->drain_ev, EV_TIMEOUT, 0);
    else
        event_add(f->drain_ev, &tv);
}

void front_abort_parked(struct front *f)
{
    if (!f)
        return;
    for (struct conn *c = f->conns, *next; c; c = next) {
        next = c->next;
        if ((c->state == HANDLING || c->state == ORPHANED) && c->req.on_abort) {
            front_step_fn abort = c->req.on_abort;
            c->req.on_abort = NULL;
            abort(&c->req); /* ends with front_answer(), which may free c */
        }
    }
    for (struct injected *in = f->injected, *next; in; in = next) {
        next = in->next;
        if (in->req.on_abort) {
            front_step_fn abort = in->req.on_abort;
            in->req.on_abort = NULL;
            abort(&in->req); /* ends with front_answer(), which frees in */
        }
    }
    /* What comes back from now on finds the front closing. */
    f->closing = 1;
}

void front_free(struct front *f)
{
    if (!f)
        return;
    f->closing = 1;
    /* Anything still HANDLING now has nobody left to answer it. */
    while (f->conns)
        conn_free(f->conns);
    while (f->injected) {
        struct injected *in = f->injected;
        unlink_injected(in);
        free_injected(in);
    }
    if (f->listener)
        evconnlistener_free(f->listener);
    if (f->admin_listener)
        evconnlistener_free(f->admin_listener);
    if (f->drain_ev)
        event_free(f->drain_ev);
    if (f->accept_pause_ev)
        event_free(f->accept_pause_ev);
    pthread_mutex_destroy(&f->mu);
    free(f);
}
