/* SPDX-License-Identifier: Apache-2.0 */
/*
 * open_loop.c — a fixed-rate (open-loop) HTTP load generator, for
 * bench/gateway.sh's latency runs (bench/latency.sh):
 *
 *   idem-open-loop --url http://127.0.0.1:PORT/PATH --rate R --seconds S
 *                  [--warmup W] [--connections N] [--threads T]
 *                  [--prefix P] [--timeout-ms MS]
 *
 * Every request is POST PATH {"refund_no":"<P>-<thread>-<n>","amount":"1.00"},
 * the body of bench/wrk/gateway.lua's unique mode, a fresh key each time.
 *
 * Why not wrk. wrk is closed-loop: each connection sends its next request
 * when the previous answer arrives, so while a server stalls the client
 * stops sending, and the requests that real users would have sent during
 * the stall are never made, let alone timed ("coordinated omission"). Here
 * the schedule is fixed before the run: request i of the whole run is due at
 * start + i / R, whatever happens to the others. Its latency is taken from
 * that due time to the end of its answer, so a request that had to wait for
 * a free connection, or for this program, is charged the wait.
 *
 * How. Each thread (T, default 1) has its own epoll loop, N / T keep-alive
 * connections and every T-th request of the schedule. A due request goes
 * out on any idle connection of its thread, at once; when none is idle it
 * waits, in schedule order, for the first that becomes idle (no pipelining:
 * one request in flight per connection, as a client's pool). Between due
 * times the thread sleeps on a timerfd armed for the next one. Requests due
 * in the first W seconds (default 1) warm the connections and the server
 * up and are not counted; those of the next S seconds are. When the last
 * is due, the program waits up to --timeout-ms (default 5000) for the
 * answers still out; one that has not come by then counts as a timeout.
 *
 * Every counted request's three times are kept (8 bytes each) and sorted at
 * the end, so the percentiles are exact (nearest rank), not a histogram's:
 *
 *   latency   due time → answer read       what a user waits (the figure)
 *   service   sent → answer read           what a closed-loop client sees
 *   lag       due time → sent              waiting for a connection or for
 *                                          this program; large when the
 *                                          server falls behind the rate
 *
 * At the end it prints one line (times in µs):
 *   OLRESULT requests=N seconds=S rate=R rps=A p50_us= p99_us= p999_us=
 *            max_us= svc_p50_us= svc_p99_us= svc_p999_us= lag_p50_us=
 *            lag_p99_us= answered=N replayed=N errors_connect=N errors_read=N
 *            errors_write=N errors_timeout=N status_201=N ...
 * requests: the answers counted; rps: them over S; answered: every answer,
 * the warm-up's included. Before it, should any
 * answer not be 201, one line: OLSAMPLE <status> <its body, 300 bytes>.
 * Exit status 0 when it ran (the caller judges the statuses), 1 when it
 * could not (no connection at the start, a bad answer it cannot parse),
 * 2 for bad arguments.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define CONNECTIONS_MAX 4096
#define THREADS_MAX 64
#define RATE_MAX 10000000.0
#define SECONDS_MAX 3600.0
#define READ_BUF 65536 /* an answer's head and body must fit: the gateway's are small */
#define REQ_BUF 512
#define SAMPLE_MAX 300
#define STATUSES 600

struct config {
    char host[256];
    char port[16];
    char path[256];
    double rate, seconds, warmup;
    unsigned connections, threads;
    const char *prefix;
    uint64_t timeout_ns;
};

struct conn {
    int fd;
    int busy;           /* a request is out on it */
    uint64_t due, sent; /* of the request out */
    int counted;        /* that request is in the measured window */
    char req[REQ_BUF];
    size_t req_len, req_off;
    char *buf;
    size_t len;
};

struct worker {
    const struct config *cfg;
    unsigned id;
    pthread_t thread;
    unsigned nconns;
    struct conn *conns;
    int ep, tfd;
    uint64_t start;         /* the schedule's origin, shared by every thread */
    uint64_t first, total;  /* this thread's requests: first, first + T, ... (total of them) */
    uint64_t warm;          /* those due before start + warmup: not counted */
    uint64_t next;          /* index (among this thread's) of the next to send */
    uint64_t outstanding;
    /* the counted ones' times, ns */
    uint64_t *lat, *svc, *lag;
    size_t n;
    uint64_t answered; /* every answer read, the warm-up's too */
    uint64_t replayed, err_connect, err_read, err_write, err_timeout;
    uint64_t status[STATUSES];
    char sample[SAMPLE_MAX + 16];
    char fatal[256];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Request k of this thread is request first + k * T of the run, due then. */
static uint64_t due_of(const struct worker *w, uint64_t k)
{
    double i = (double)(w->first + k * w->cfg->threads);
    return w->start + (uint64_t)(i / w->cfg->rate * 1e9);
}


/* A connected, non-blocking TCP socket to the target, or -1. */
static int dial(const struct config *cfg)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai, *a;
    if (getaddrinfo(cfg->host, cfg->port, &hints, &ai) != 0)
        return -1;
    int fd = -1;
    for (a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        /* A blocking connect: on loopback it is over in microseconds, and
         * the run only reconnects when the server closed a connection. */
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return -1;
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---- one thread's loop ---- */

/* The thread's idle connections: a stack, the most recently used on top. */
struct loop {
    struct conn **idle;
    unsigned nidle;
};

static void fail(struct worker *w, const char *what)
{
    if (!w->fatal[0])
        snprintf(w->fatal, sizeof w->fatal, "%s", what);
}

static int watch(struct worker *w, struct conn *c, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = c};
    return epoll_ctl(w->ep, op, c->fd, &ev);
}

/* c's connection is gone (the server closed it, or it failed): its request,
 * if one was out, is lost (counted by the caller); dial again and, on
 * success, c is idle. */
static void redial(struct worker *w, struct loop *l, struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd); /* also takes it out of the epoll set */
    c->busy = 0;
    c->len = 0;
    c->fd = dial(w->cfg);
    if (c->fd < 0 || watch(w, c, EPOLL_CTL_ADD, EPOLLIN) != 0) {
        if (c->fd >= 0)
            close(c->fd);
        c->fd = -1;
        w->err_connect++;
        return;
    }
    l->idle[l->nidle++] = c;
}

static void lost(struct worker *w, struct loop *l, struct conn *c, uint64_t *counter)
{
    if (c->busy) {
        (*counter)++;
        w->outstanding--;
    }
    redial(w, l, c);
}

/* Send what is left of c's request; 0, or -1 when the connection failed. */
static int push(struct worker *w, struct conn *c)
{
    while (c->req_off < c->req_len) {
        ssize_t n = write(c->fd, c->req + c->req_off, c->req_len - c->req_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return watch(w, c, EPOLL_CTL_MOD, EPOLLIN | EPOLLOUT);
        if (n <= 0)
            return -1;
        c->req_off += (size_t)n;
    }
    return watch(w, c, EPOLL_CTL_MOD, EPOLLIN);
}

/* Send every request that is due, while a connection is idle. */
static void dispatch(struct worker *w, struct loop *l, uint64_t now)
{
    while (w->next < w->total && due_of(w, w->next) <= now) {
        if (!l->nidle)
            return; /* it waits for the first connection to come back */
        struct conn *c = l->idle[--l->nidle];
        uint64_t i = w->first + w->next * w->cfg->threads;
        char body[160];
        int bn = snprintf(body, sizeof body,
                          "{\"refund_no\":\"%s-%" PRIu64 "\",\"amount\":\"1.00\"}",
                          w->cfg->prefix, i);
        int rn = snprintf(c->req, sizeof c->req,
                          "POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                          "Content-Length: %d\r\n\r\n%s",
                          w->cfg->path, w->cfg->host, w->cfg->port, bn, body);
        if (bn < 0 || (size_t)bn >= sizeof body || rn < 0 || (size_t)rn >= sizeof c->req) {
            fail(w, "request too long (shorten --prefix or the path)");
            return;
        }
        c->req_len = (size_t)rn;
        c->req_off = 0;
        c->due = due_of(w, w->next);
        c->counted = w->next >= w->warm;
        c->busy = 1;
        w->next++;
        w->outstanding++;
        c->sent = now_ns();
        if (push(w, c) != 0)
            lost(w, l, c, &w->err_write);
    }
}

/* The value of header NAME in the head [p, end), or NULL; its length in *n. */
static const char *header(const char *p, const char *end, const char *name, size_t *n)
{
    size_t nl = strlen(name);
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (!eol)
            eol = end;
        if ((size_t)(eol - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *e = eol;
            while (e > v && (e[-1] == ' ' || e[-1] == '\t'))
                e--;
            *n = (size_t)(e - v);
            return v;
        }
        p = eol + 2;
    }
    return NULL;
}

/* What came in on c: when it completes the answer, count it. */
static void readable(struct worker *w, struct loop *l, struct conn *c)
{
    for (;;) {
        ssize_t n = read(c->fd, c->buf + c->len, READ_BUF - c->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            /* Closed or failed: between requests the server may close a
             * keep-alive connection; during one it lost the request. */
            lost(w, l, c, &w->err_read);
            return;
        }
        c->len += (size_t)n;
        if (!c->busy) {
            fail(w, "bytes from the server with no request out");
            return;
        }
        const char *head_end = memmem(c->buf, c->len, "\r\n\r\n", 4);
        if (!head_end) {
            if (c->len == READ_BUF)
                fail(w, "an answer's head does not fit in the read buffer");
            if (c->len == READ_BUF)
                return;
            continue;
        }
        size_t head = (size_t)(head_end - c->buf) + 4;
        int status = 0;
        if (c->len < 12 || strncmp(c->buf, "HTTP/1.", 7) != 0 ||
            sscanf(c->buf + 9, "%3d", &status) != 1 || status < 100 || status >= STATUSES) {
            fail(w, "an answer without an HTTP/1.x status line");
            return;
        }
        const char *hs = memchr(c->buf, '\n', head) + 1, *he = c->buf + head - 2;
        size_t vn = 0, clen = 0;
        const char *v = header(hs, he, "Transfer-Encoding", &vn);
        if (v) {
            fail(w, "a chunked answer: only Content-Length framing is read");
            return;
        }
        if ((v = header(hs, he, "Content-Length", &vn)) != NULL) {
            char num[24] = {0};
            if (vn == 0 || vn >= sizeof num) {
                fail(w, "a bad Content-Length");
                return;
            }
            memcpy(num, v, vn);
            char *e;
            unsigned long long x = strtoull(num, &e, 10);
            if (*e || x > READ_BUF) {
                fail(w, "a Content-Length that is bad or larger than the read buffer");
                return;
            }
            clen = (size_t)x;
        } else if (!(status < 200 || status == 204 || status == 304)) {
            fail(w, "an answer without Content-Length");
            return;
        }
        if (head + clen > READ_BUF) {
            fail(w, "an answer larger than the read buffer");
            return;
        }
        if (c->len < head + clen)
            continue;
        uint64_t t = now_ns();
        if (c->len > head + clen) {
            fail(w, "bytes after an answer, with no request out");
            return;
        }
        w->answered++;
        if (c->counted) {
            w->status[status]++;
            w->lat[w->n] = t - c->due;
            w->svc[w->n] = t - c->sent;
            w->lag[w->n] = c->sent - c->due;
            w->n++;
        }
        v = header(hs, he, "Idempotent-Replayed", &vn);
        if (c->counted && v && vn == 4 && strncasecmp(v, "true", 4) == 0)
            w->replayed++;
        if (status != 201 && !w->sample[0]) {
            int bl = (int)(clen < SAMPLE_MAX ? clen : SAMPLE_MAX);
            snprintf(w->sample, sizeof w->sample, "%d %.*s", status, bl, c->buf + head);
            for (char *p = w->sample; *p; p++)
                if (*p == '\n' || *p == '\r' || *p == '\t')
                    *p = ' ';
        }
        v = header(hs, he, "Connection", &vn);
        int closing = v && vn == 5 && strncasecmp(v, "close", 5) == 0;
        c->busy = 0;
        c->len = 0;
        w->outstanding--;
        if (closing)
            redial(w, l, c);
        else
            l->idle[l->nidle++] = c;
        return;
    }
}

static int arm(struct worker *w, uint64_t at)
{
    struct itimerspec its = {.it_value = {.tv_sec = (time_t)(at / 1000000000u),
                                          .tv_nsec = (long)(at % 1000000000u)}};
    if (at == 0)
        its.it_value.tv_nsec = 1;
    return timerfd_settime(w->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static void *work(void *arg)
{
    struct worker *w = arg;
    /* Wake at the due time, not up to 50 µs later (the default slack). */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    struct loop l = {.idle = calloc(w->nconns, sizeof *l.idle)};
    struct epoll_event evs[64];
    static char timer_tag;
    if (!l.idle) {
        fail(w, "out of memory");
        return NULL;
    }
    for (unsigned i = 0; i < w->nconns; i++) {
        if (watch(w, &w->conns[i], EPOLL_CTL_ADD, EPOLLIN) != 0) {
            fail(w, "epoll_ctl failed");
            free(l.idle);
            return NULL;
        }
        l.idle[l.nidle++] = &w->conns[w->nconns - 1 - i];
    }
    struct epoll_event tev = {.events = EPOLLIN, .data.ptr = &timer_tag};
    if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->tfd, &tev) != 0) {
        fail(w, "epoll_ctl failed");
        free(l.idle);
        return NULL;
    }
    /* The last request's due time, plus the time its answer may take. */
    uint64_t end = (w->total ? due_of(w, w->total - 1) : w->start) + w->cfg->timeout_ns;
    while (!w->fatal[0]) {
        uint64_t now = now_ns();
        dispatch(w, &l, now);
        if (w->next == w->total && w->outstanding == 0)
            break;
        if (now >= end) {
            w->err_timeout += w->outstanding + (w->total - w->next);
            break;
        }
        uint64_t at = end;
        if (w->next < w->total && l.nidle) {
            uint64_t d = due_of(w, w->next);
            if (d < at)
                at = d;
        }
        if (arm(w, at) != 0) {
            fail(w, "timerfd_settime failed");
            break;
        }
        int n = epoll_wait(w->ep, evs, 64, -1);
        if (n < 0 && errno != EINTR) {
            fail(w, "epoll_wait failed");
            break;
        }
        for (int i = 0; i < n && !w->fatal[0]; i++) {
            if (evs[i].data.ptr == &timer_tag) {
                uint64_t ticks;
                if (read(w->tfd, &ticks, sizeof ticks) < 0 && errno != EAGAIN)
                    fail(w, "reading the timerfd failed");
                continue;
            }
            struct conn *c = evs[i].data.ptr;
            if (c->fd < 0)
                continue;
            if ((evs[i].events & EPOLLOUT) && c->busy && c->req_off < c->req_len &&
                push(w, c) != 0) {
                lost(w, &l, c, &w->err_write);
                continue;
            }
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                readable(w, &l, c);
        }
    }
    free(l.idle);
    return NULL;
}

/* ---- main ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: idem-open-loop --url http://HOST:PORT/PATH --rate REQ_PER_S --seconds S\n"
               "                      [--warmup S] [--connections N] [--threads T]\n"
               "                      [--prefix KEY_PREFIX] [--timeout-ms MS]\n");
}

static double parse_num(const char *s, const char *what, double lo, double hi)
{
    char *e;
    errno = 0;
    double v = s ? strtod(s, &e) : 0;
    if (!s || errno || *e || !(v >= lo && v <= hi)) {
        fprintf(stderr, "idem-open-loop: %s must be a number in [%g, %g] (got '%s')\n", what, lo,
                hi, s ? s : "");
        exit(2);
    }
    return v;
}

static void parse_url(struct config *cfg, const char *url)
{
    const char *p = url, *slash, *colon;
    if (strncmp(p, "http://", 7) != 0) {
        fprintf(stderr, "idem-open-loop: --url must be http://HOST:PORT/PATH\n");
        exit(2);
    }
    p += 7;
    slash = strchr(p, '/');
    if (!slash)
        slash = p + strlen(p);
    colon = memchr(p, ':', (size_t)(slash - p));
    size_t hl = (size_t)((colon ? colon : slash) - p);
    size_t pl = colon ? (size_t)(slash - colon - 1) : 2;
    if (hl == 0 || hl >= sizeof cfg->host || pl == 0 || pl >= sizeof cfg->port ||
        strlen(*slash ? slash : "/") >= sizeof cfg->path) {
        fprintf(stderr, "idem-open-loop: bad --url '%s'\n", url);
        exit(2);
    }
    memcpy(cfg->host, p, hl);
    if (colon)
        memcpy(cfg->port, colon + 1, pl);
    else
        strcpy(cfg->port, "80");
    strcpy(cfg->path, *slash ? slash : "/");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The nearest-rank p-th percentile of the n sorted values v, in µs. */
static uint64_t pct_us(const uint64_t *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    double r = p / 100.0 * (double)n;
    size_t k = (size_t)r;
    if ((double)k < r)
        k++;
    if (k == 0)
        k = 1;
    if (k > n)
        k = n;
    return v[k - 1] / 1000;
}

static void free_workers(struct worker *ws, unsigned n)
{
    for (unsigned t = 0; ws && t < n; t++) {
        struct worker *w = &ws[t];
        for (unsigned i = 0; w->conns && i < w->nconns; i++) {
            if (w->conns[i].fd >= 0)
                close(w->conns[i].fd);
            free(w->conns[i].buf);
        }
        if (w->ep >= 0)
            close(w->ep);
        if (w->tfd >= 0)
            close(w->tfd);
        free(w->conns);
        free(w->lat);
        free(w->svc);
        free(w->lag);
    }
    free(ws);
}

/* How many of first, first + step, ... are below n. */
static uint64_t count_below(uint64_t first, uint64_t step, uint64_t n)
{
    return n > first ? (n - first + step - 1) / step : 0;
}

int main(int argc, char **argv)
{
    struct config cfg = {.warmup = 1, .connections = 64, .threads = 1, .prefix = "ol",
                         .timeout_ns = 5000000000u};
    const char *url = NULL;
    int have_rate = 0, have_seconds = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--url") == 0)
            url = v;
        else if (strcmp(a, "--rate") == 0)
            cfg.rate = parse_num(v, "--rate", 1, RATE_MAX), have_rate = 1;
        else if (strcmp(a, "--seconds") == 0)
            cfg.seconds = parse_num(v, "--seconds", 0.1, SECONDS_MAX), have_seconds = 1;
        else if (strcmp(a, "--warmup") == 0)
            cfg.warmup = parse_num(v, "--warmup", 0, SECONDS_MAX);
        else if (strcmp(a, "--connections") == 0)
            cfg.connections = (unsigned)parse_num(v, "--connections", 1, CONNECTIONS_MAX);
        else if (strcmp(a, "--threads") == 0)
            cfg.threads = (unsigned)parse_num(v, "--threads", 1, THREADS_MAX);
        else if (strcmp(a, "--prefix") == 0)
            cfg.prefix = v;
        else if (strcmp(a, "--timeout-ms") == 0)
            cfg.timeout_ns = (uint64_t)parse_num(v, "--timeout-ms", 1, 600000) * 1000000u;
        else {
            fprintf(stderr, "idem-open-loop: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!url || !have_rate || !have_seconds) {
        usage(stderr);
        return 2;
    }
    if (cfg.threads > cfg.connections) {
        fprintf(stderr, "idem-open-loop: --threads must not exceed --connections\n");
        return 2;
    }
    if (strlen(cfg.prefix) > 64) {
        fprintf(stderr, "idem-open-loop: --prefix is at most 64 bytes\n");
        return 2;
    }
    parse_url(&cfg, url);

    uint64_t n_warm = (uint64_t)(cfg.rate * cfg.warmup + 0.5);
    uint64_t n_all = n_warm + (uint64_t)(cfg.rate * cfg.seconds + 0.5);
    struct worker *ws = calloc(cfg.threads, sizeof *ws);
    uint64_t *lat = NULL, *svc = NULL, *lag = NULL;
    unsigned started = 0;
    int rc = 1;
    if (!ws) {
        fprintf(stderr, "idem-open-loop: out of memory\n");
        return 1;
    }
    for (unsigned t = 0; t < cfg.threads; t++)
        ws[t].ep = ws[t].tfd = -1;
    for (unsigned t = 0; t < cfg.threads; t++) {
        struct worker *w = &ws[t];
        w->cfg = &cfg;
        w->id = t;
        w->first = t;
        w->total = count_below(t, cfg.threads, n_all);
        w->warm = count_below(t, cfg.threads, n_warm);
        w->nconns = (unsigned)count_below(t, cfg.threads, cfg.connections);
        w->conns = calloc(w->nconns, sizeof *w->conns);
        for (unsigned i = 0; w->conns && i < w->nconns; i++)
            w->conns[i].fd = -1;
        size_t m = (size_t)(w->total - w->warm) + 1;
        w->lat = malloc(m * sizeof *w->lat);
        w->svc = malloc(m * sizeof *w->svc);
        w->lag = malloc(m * sizeof *w->lag);
        w->ep = epoll_create1(EPOLL_CLOEXEC);
        w->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (!w->conns || !w->lat || !w->svc || !w->lag || w->ep < 0 || w->tfd < 0) {
            fprintf(stderr, "idem-open-loop: out of memory or descriptors\n");
            goto done;
        }
        for (unsigned i = 0; i < w->nconns; i++) {
            struct conn *c = &w->conns[i];
            c->buf = malloc(READ_BUF);
            c->fd = dial(&cfg);
            if (!c->buf || c->fd < 0) {
                fprintf(stderr, "idem-open-loop: cannot connect to %s:%s\n", cfg.host, cfg.port);
                goto done;
            }
        }
    }
    /* Every thread's schedule starts at the same instant, a little ahead. */
    uint64_t start = now_ns() + 20000000u;
    for (unsigned t = 0; t < cfg.threads; t++) {
        ws[t].start = start;
        if (pthread_create(&ws[t].thread, NULL, work, &ws[t]) != 0) {
            fprintf(stderr, "idem-open-loop: pthread_create failed\n");
            break;
        }
        started++;
    }
    for (unsigned t = 0; t < started; t++)
        pthread_join(ws[t].thread, NULL);
    if (started < cfg.threads)
        goto done;

    size_t n = 0;
    uint64_t answered = 0, replayed = 0, ec = 0, er = 0, ew = 0, et = 0, status[STATUSES] = {0};
    const char *sample = NULL;
    for (unsigned t = 0; t < cfg.threads; t++) {
        struct worker *w = &ws[t];
        if (w->fatal[0]) {
            fprintf(stderr, "idem-open-loop: %s\n", w->fatal);
            goto done;
        }
        n += w->n;
        answered += w->answered;
        replayed += w->replayed;
        ec += w->err_connect, er += w->err_read, ew += w->err_write, et += w->err_timeout;
        for (int s = 0; s < STATUSES; s++)
            status[s] += w->status[s];
        if (!sample && w->sample[0])
            sample = w->sample;
    }
    lat = malloc((n + 1) * sizeof *lat);
    svc = malloc((n + 1) * sizeof *svc);
    lag = malloc((n + 1) * sizeof *lag);
    if (!lat || !svc || !lag) {
        fprintf(stderr, "idem-open-loop: out of memory\n");
        goto done;
    }
    size_t k = 0;
    for (unsigned t = 0; t < cfg.threads; t++) {
        memcpy(lat + k, ws[t].lat, ws[t].n * sizeof *lat);
        memcpy(svc + k, ws[t].svc, ws[t].n * sizeof *svc);
        memcpy(lag + k, ws[t].lag, ws[t].n * sizeof *lag);
        k += ws[t].n;
    }
    qsort(lat, n, sizeof *lat, cmp_u64);
    qsort(svc, n, sizeof *svc, cmp_u64);
    qsort(lag, n, sizeof *lag, cmp_u64);
    if (sample)
        printf("OLSAMPLE %s\n", sample);
    printf("OLRESULT requests=%zu seconds=%.3f rate=%.1f rps=%.1f p50_us=%" PRIu64
           " p99_us=%" PRIu64 " p999_us=%" PRIu64 " max_us=%" PRIu64 " svc_p50_us=%" PRIu64
           " svc_p99_us=%" PRIu64 " svc_p999_us=%" PRIu64 " lag_p50_us=%" PRIu64
           " lag_p99_us=%" PRIu64 " answered=%" PRIu64 " replayed=%" PRIu64
           " errors_connect=%" PRIu64
           " errors_read=%" PRIu64 " errors_write=%" PRIu64 " errors_timeout=%" PRIu64,
           n, cfg.seconds, cfg.rate, (double)n / cfg.seconds, pct_us(lat, n, 50),
           pct_us(lat, n, 99), pct_us(lat, n, 99.9), n ? lat[n - 1] / 1000 : 0,
           pct_us(svc, n, 50), pct_us(svc, n, 99), pct_us(svc, n, 99.9), pct_us(lag, n, 50),
           pct_us(lag, n, 99), answered, replayed, ec, er, ew, et);
    for (int s = 0; s < STATUSES; s++)
        if (status[s])
            printf(" status_%d=%" PRIu64, s, status[s]);
    printf("\n");
    rc = fflush(stdout) != 0 || ferror(stdout) ? 1 : 0;
done:
    free(lat);
    free(svc);
    free(lag);
    free_workers(ws, cfg.threads);
    return rc;
}
