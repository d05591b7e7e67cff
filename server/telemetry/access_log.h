/* SPDX-License-Identifier: Apache-2.0 */
/*
 * access_log.h — a line per request on listen, and per message a consumer
 * handled (access_log.c): what it was, what the gateway made of it, how
 * long it took. JSON lines (default) or logfmt text, to stderr or a file.
 */
#ifndef IDEM_SERVER_ACCESS_LOG_H
#define IDEM_SERVER_ACCESS_LOG_H

#include <stddef.h>
#include <stdint.h>

struct server_config;
struct event_base;
struct front_request;

struct access_log;

/* The log configuration says (access_log): NULL with err "" when it is
 * off, NULL with err filled when the file cannot be opened. */
struct access_log *access_log_open(const struct server_config *cfg, char *err, size_t errlen);
/* SIGUSR1 (logrotate's postrotate): the file opened again at its path, in
 * place of the one the loops write to. 0 (also for stderr: nothing to
 * do), or -1 with err (the old file stays in use). Any thread. */
int access_log_reopen(struct access_log *l, char *err, size_t errlen);
/* After every buffer is freed. NULL: no-op. */
void access_log_close(struct access_log *l);

/* One event loop's lines, written together once per turn of the loop (or
 * when the buffer fills): one write() for many requests. NULL on OOM. */
struct access_buf;
struct access_buf *access_buf_new(struct access_log *l, struct event_base *base);
/* Writes what is left. NULL: no-op. */
void access_buf_free(struct access_buf *b);

/* A request of the main listener, answered with status: front_log_fn's
 * shape (front.h), arg the loop's buffer. */
void access_log_request(void *buf, const struct front_request *req, int status);

/* A message a consumer handled. */
struct access_message {
    const char *consumer, *queue;
    const char *message_id;   /* or NULL */
    const char *key;          /* "" when it had none */
    const char *outcome;      /* the gateway's verdict's name */
    const char *action;       /* "acked", "dead_lettered", "retried", "held", "dropped" */
    const char *reason;       /* a dead letter's, or NULL */
    int status, upstream_status;
    int64_t upstream_us, total_us;
    uint64_t epoch;
    unsigned attempt;
};
void access_log_message(struct access_buf *b, const struct access_message *m);

/* A status query of on_unknown_outcome: resolve (gateway.c, "resolving"):
 * its line, kind "question". */
struct access_question {
    const char *route, *key;
    uint64_t epoch;           /* the claim that asked */
    unsigned question;        /* 1, 2 ... */
    const char *verdict;      /* executed, not_executed, unanswered, given_up */
    int status;               /* the status query's answer, 0 for none */
    int64_t upstream_us;
    const char *request_id;   /* the retry's that asked, or NULL (the resolver) */
};
void access_log_question(struct access_buf *b, const struct access_question *q);

#endif
