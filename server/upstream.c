/*
 * upstream.c — the blocking upstream client with keep-alive pools (daemon).
 *
 * Workers call upstream_exchange() and block on poll() with deadlines. What
 * matters most here is the line between "not sent" and "maybe executed":
 *
 *   - connect refused or timed out               → NOT_SENT
 *   - a pooled connection found closed before use → discarded, another used
 *   - a write that fails before its first byte    → NOT_SENT
 *   - anything after the first byte went out      → UNKNOWN or TIMEOUT
 *
 * A pooled connection is only reused while it has been idle for less than
 * IDLE_REUSE_MS, well under the keep-alive timeouts of common servers, so the
 * race in which the server closes an idle connection just as we send on it
 * is rare; when it happens anyway the result is UNKNOWN, never a silent
 * retry, because the request may have been read.
 */
#include "upstream.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define IDLE_MAX 64
#define IDLE_REUSE_MS 2000
#define CONNECT_TIMEOUT_MS 5000

struct idle_conn {
    int fd;
    int64_t since;
};

struct upstream_pool {
    struct upstream_pool *next;
    char *host;
    int port;
    pthread_mutex_t mu;
    struct idle_conn idle[IDLE_MAX];
    int nidle;
};

static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static struct upstream_pool *pools;

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct upstream_pool *upstream_pool_get(const char *host, int port)
{
    pthread_mutex_lock(&pools_mu);
    struct upstream_pool *p = pools;
    for (; p; p = p->next)
        if (p->port == port && strcmp(p->host, host) == 0)
            break;
    if (!p && (p = calloc(1, sizeof *p)) != NULL) {
        p->host = strdup(host);
        p->port = port;
        if (!p->host) {
            free(p);
            p = NULL;
        } else {
            pthread_mutex_init(&p->mu, NULL);
            p->next = pools;
            pools = p;
        }
    }
    pthread_mutex_unlock(&pools_mu);
    return p;
}

void upstream_pools_free(void)
{
    pthread_mutex_lock(&pools_mu);
    while (pools) {
        struct upstream_pool *p = pools;
        pools = p->next;
        for (int i = 0; i < p->nidle; i++)
            close(p->idle[i].fd);
        pthread_mutex_destroy(&p->mu);
        free(p->host);
        free(p);
    }
    pthread_mutex_unlock(&pools_mu);
}

/* An idle connection that is still open, or -1. */
static int take_idle(struct upstream_pool *p)
{
    int64_t now = mono_ms();
    pthread_mutex_lock(&p->mu);
    while (p->nidle > 0) {
        struct idle_conn c = p->idle[--p->nidle];
        pthread_mutex_unlock(&p->mu);
        struct pollfd pfd = {.fd = c.fd, .events = POLLIN};
        /* Readable while idle means closed (or garbage): not reusable. */
        if (now - c.since < IDLE_REUSE_MS && poll(&pfd, 1, 0) == 0)
            return c.fd;
        close(c.fd);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return -1;
}

static void give_back(struct upstream_pool *p, int fd)
{
    pthread_mutex_lock(&p->mu);
    if (p->nidle < IDLE_MAX) {
        p->idle[p->nidle].fd = fd;
        p->idle[p->nidle].since = mono_ms();
        p->nidle++;
        fd = -1;
    }
    pthread_mutex_unlock(&p->mu);
    if (fd >= 0)
        close(fd);
}

static int connect_to(struct upstream_pool *p, int64_t deadline, char *detail, size_t dlen)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int gai = getaddrinfo(p->host, port, &hints, &ai);
    if (gai != 0) {
        snprintf(detail, dlen, "upstream %s:%d: %s", p->host, p->port, gai_strerror(gai));
        return -1;
    }
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
            err = errno;
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - mono_ms();
        if (left > CONNECT_TIMEOUT_MS)
            left = CONNECT_TIMEOUT_MS;
        socklen_t len = sizeof err;
        if (left <= 0 || poll(&pfd, 1, (int)left) != 1) {
            err = ETIMEDOUT;
        } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
            err = errno;
        }
        if (err) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        snprintf(detail, dlen, "upstream %s:%d: connect: %s", p->host, p->port,
                 strerror(err ? err : ECONNREFUSED));
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* The request's bytes: line, forwarded headers, our headers, body. */
static char *build_request(struct upstream_pool *p, const struct upstream_request *rq,
                           size_t *len)
{
    const struct http_msg *m = rq->original;
    size_t cap = 256 + strlen(rq->method) + strlen(rq->target) + strlen(p->host) +
                 (rq->peer ? strlen(rq->peer) : 0) + (m ? m->body_len : 0);
    for (size_t i = 0; m && i < m->header_count; i++)
        cap += strlen(m->headers[i].name) + strlen(m->headers[i].value) + 4;
    for (const char *const *e = rq->extra; e && *e; e++)
        cap += strlen(*e) + 2;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    o += sprintf(o, "%s %s HTTP/1.1\r\nHost: %s:%d\r\n", rq->method, rq->target, p->host,
                 p->port);
    const char *xff = NULL;
    for (size_t i = 0; m && i < m->header_count; i++) {
        const char *n = m->headers[i].name;
        if (strcasecmp(n, "host") == 0 || strcasecmp(n, "content-length") == 0 ||
            http_is_hop_by_hop(m, n))
            continue;
        if (strcasecmp(n, "x-forwarded-for") == 0) {
            xff = m->headers[i].value;
            continue;
        }
        o += sprintf(o, "%s: %s\r\n", n, m->headers[i].value);
    }
    if (rq->peer) {
        /* Only the address, not our view of the client's port. */
        const char *colon = strrchr(rq->peer, ':');
        int hostlen = colon ? (int)(colon - rq->peer) : (int)strlen(rq->peer);
        o += sprintf(o, "X-Forwarded-For: %s%s%.*s\r\n", xff ? xff : "", xff ? ", " : "",
                     hostlen, rq->peer);
    }
    for (const char *const *e = rq->extra; e && *e; e++)
        o += sprintf(o, "%s\r\n", *e);
    size_t body = m ? m->body_len : 0;
    o += sprintf(o, "Content-Length: %zu\r\n\r\n", body);
    if (body) {
        memcpy(o, m->body, body);
        o += body;
    }
    *len = (size_t)(o - out);
    return out;
}

/* Write it all by the deadline. Returns bytes written; *err set on failure. */
static size_t write_all(int fd, const char *buf, size_t len, int64_t deadline, int *err)
{
    size_t off = 0;
    *err = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            *err = errno;
            return off;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int64_t left = deadline - mono_ms();
        if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
            *err = ETIMEDOUT;
            return off;
        }
    }
    return off;
}

enum upstream_result upstream_exchange(struct upstream_pool *p, const struct upstream_request *rq,
                                       struct http_msg **resp, char *detail, size_t dlen)
{
    int64_t start = mono_ms(), deadline = start + rq->timeout_ms;
    size_t len;
    *resp = NULL;
    detail[0] = '\0';
    char *bytes = build_request(p, rq, &len);
    if (!bytes) {
        snprintf(detail, dlen, "out of memory building the upstream request");
        return UPSTREAM_NOT_SENT;
    }

    /* Send on a pooled connection, or a fresh one. */
    int fd, err = 0;
    size_t sent = 0;
    for (;;) {
        int reused = 1;
        fd = take_idle(p);
        if (fd < 0) {
            reused = 0;
            fd = connect_to(p, deadline, detail, dlen);
            if (fd < 0) {
                free(bytes);
                return UPSTREAM_NOT_SENT;
            }
        }
        sent = write_all(fd, bytes, len, deadline, &err);
        if (sent == len)
            break;
        close(fd);
        if (sent == 0 && reused)
            continue; /* the pooled connection was dead: nothing went out */
        free(bytes);
        snprintf(detail, dlen, "upstream %s:%d: sending: %s", p->host, p->port, strerror(err));
        return sent == 0 ? UPSTREAM_NOT_SENT : err == ETIMEDOUT ? UPSTREAM_TIMEOUT
                                                                 : UPSTREAM_UNKNOWN;
    }
    free(bytes);

    /* Read the answer. */
    struct http_limits limits = {
        .request_line_max = 8192,
        .header_count_max = 200,
        .header_bytes_max = 64 * 1024,
        .body_max = rq->response_max,
    };
    struct http_parser parser;
    http_parser_init(&parser, HTTP_PARSE_RESPONSE, &limits);
    parser.response_to_head = strcmp(rq->method, "HEAD") == 0;
    enum upstream_result result = UPSTREAM_UNKNOWN;
    int64_t next_tick = rq->tick ? mono_ms() + rq->tick_ms : INT64_MAX;
    char buf[16384];
    for (;;) {
        int64_t now = mono_ms();
        if (now >= deadline) {
            result = UPSTREAM_TIMEOUT;
            snprintf(detail, dlen, "upstream %s:%d: no answer within %lld ms", p->host, p->port,
                     (long long)rq->timeout_ms);
            break;
        }
        if (now >= next_tick) {
            rq->tick(rq->tick_arg);
            next_tick = mono_ms() + rq->tick_ms;
        }
        int64_t wait = deadline - now;
        if (next_tick - now < wait)
            wait = next_tick - now > 0 ? next_tick - now : 0;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, (int)wait);
        if (pr < 0 && errno != EINTR) {
            snprintf(detail, dlen, "upstream: poll: %s", strerror(errno));
            break;
        }
        if (pr <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        enum http_parse_status st = HTTP_NEED_MORE;
        size_t off = 0;
        if (n <= 0) {
            st = http_parser_eof(&parser);
            if (st != HTTP_DONE)
                snprintf(detail, dlen,
                         "upstream %s:%d: connection closed before a whole answer", p->host,
                         p->port);
        }
        while (n > 0 && (size_t)off < (size_t)n) {
            size_t used = 0;
            st = http_parser_feed(&parser, buf + off, (size_t)n - off, &used);
            off += used;
            if (st != HTTP_DONE || parser.error_status)
                break;
            /* A 1xx answer is informational: the real one follows. */
            if (!parser.msg || parser.msg->status >= 200) /* the message about to be taken */
                break;
            http_msg_free(http_parser_take(&parser));
            http_parser_reset(&parser);
            parser.response_to_head = strcmp(rq->method, "HEAD") == 0;
            st = HTTP_NEED_MORE;
        }
        if (st == HTTP_NEED_MORE && n > 0)
            continue;
        if (st == HTTP_ERROR) {
            result = parser.error_status == 413 ? UPSTREAM_TOO_BIG : UPSTREAM_UNKNOWN;
            snprintf(detail, dlen, "upstream %s:%d: %s", p->host, p->port,
                     result == UPSTREAM_TOO_BIG ? "response body over response_max"
                                                : parser.error_detail);
            break;
        }
        if (st != HTTP_DONE)
            break;
        struct http_msg *m = http_parser_take(&parser);
        if (!m) {
            snprintf(detail, dlen, "out of memory reading the upstream's answer");
            break;
        }
        *resp = m;
        result = UPSTREAM_OK;
        /* Reusable only if the answer ended exactly where the bytes did. */
        if (m->keep_alive && n > 0 && (size_t)off == (size_t)n) {
            give_back(p, fd);
            fd = -1;
        }
        break;
    }
    http_parser_free(&parser);
    if (fd >= 0)
        close(fd);
    return result;
}
