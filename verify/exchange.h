/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exchange.h — idem verify's HTTP client: one request on its own TCP
 * connection (a "shot"), read back with the strict response parser; many
 * shots released at the same instant (the starting gun), or run through a
 * fixed number of threads (the pool).
 */
#ifndef IDEM_VERIFY_EXCHANGE_H
#define IDEM_VERIFY_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "url.h"

enum shot_outcome {
    SHOT_NOT_RUN,
    SHOT_ANSWERED,  /* a whole response: status, body */
    SHOT_TIMEOUT,   /* no whole answer within timeout_ms */
    SHOT_ABANDONED, /* the client gave up at timeout_ms, as planned (abandon) */
    SHOT_ERROR,     /* connect, send or read failed, or the answer was malformed */
};

struct shot {
    /* What to send; the request bytes are owned. */
    const struct vurl *url;
    char *request;
    size_t request_len;
    int head;       /* a HEAD request: the answer has no body */
    int timeout_ms; /* from connecting to the whole answer */
    int abandon;    /* giving up at timeout_ms is the plan, not a failure */
    int at_ms;      /* xchg_gun: released this long after the others */
    int group;      /* the scenario's business key (or subject) group */
    int role;       /* the scenario's meaning for it */

    /* What came back. */
    enum shot_outcome outcome;
    int status;
    char *body; /* owned; NUL-terminated */
    size_t body_len;
    const char *replayed_by; /* the replay header that said "true", or NULL */
    long retry_after_ms;     /* Retry-After in seconds, as ms; -1 when none */
    int connect_refused;     /* the error was ECONNREFUSED */
    int64_t sent_us, done_us;
    char error[160];
};

struct xchg_ctx {
    const char *const *replay_headers; /* names whose value "true" marks a replay */
    size_t nreplay;
    int64_t deadline_us;               /* no shot runs past this (monotonic) */
    void (*on_done)(void *arg);        /* after each shot, from any thread */
    void *on_done_arg;
};

struct xchg_header {
    const char *name;
    const char *value;
};

/* The request's bytes: the request line, Host (unless among h),
 * User-Agent (unless among h), h, Content-Length (when has_body, or for
 * POST, PUT and PATCH), Connection: close, and the body. malloc()ed; NULL
 * when out of memory. */
char *xchg_build(const char *method, const struct vurl *u, const char *target,
                 const struct xchg_header *h, size_t nh, const char *body, size_t body_len,
                 int has_body, size_t *len);

/* Connect, send, read the answer; fills the shot's results. */
void xchg_shot(const struct xchg_ctx *c, struct shot *s);

/* n shots at once, one thread and connection each: every shot connects
 * first; when all are connected they are released together and each sends
 * at_ms later. Returns when all are done. */
void xchg_gun(const struct xchg_ctx *c, struct shot *shots, size_t n);

/* n shots through `concurrency` threads, each on a fresh connection. */
void xchg_pool(const struct xchg_ctx *c, struct shot *shots, size_t n, size_t concurrency);

/* Can a TCP connection to u be opened? 0, or -1 with err. */
int xchg_probe(const struct vurl *u, int timeout_ms, char *err, size_t errlen);

/* TLS for https:// URLs, set up once before any shot: the CAs that vouch
 * for the servers (ca_file, or NULL: the system's), and a client
 * certificate and its key (both, or neither). 0, or -1 with err. */
int xchg_tls_init(const char *ca_file, const char *cert, const char *key, char *err,
                  size_t errlen);
void xchg_tls_free(void);

void shot_clear(struct shot *s); /* frees request and body */

int64_t xchg_now_us(void);
void xchg_sleep_ms(int64_t ms);

#endif
