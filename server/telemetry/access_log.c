/* SPDX-License-Identifier: Apache-2.0 */
/*
 * access_log.c — the access log (access_log.h).
 *
 * Every value a client or a producer chose (path, key, subject, request
 * and message ids) is escaped on its way into a line: in JSON as a JSON
 * string that is ASCII only (log_json_escape: \uXXXX for every other
 * character, U+FFFD for a byte that is not UTF-8), in text (logfmt) as
 * the daemon's own log escapes (log.c), quoted when it holds a blank, a
 * quote or '='. So a line
 * is one line, and a reader or a log shipper sees what was sent and
 * nothing it did not.
 *
 * The subject is logged as the first 16 hex digits of its SHA-256 by
 * default (a log should not be a list of who did what; the hash still
 * groups one subject's requests), as it is, or not at all. A request's
 * path is logged without its query, which may carry what a log should not.
 *
 * Each loop keeps its lines in a buffer of its own and writes them with
 * one write() at the end of its turn: O_APPEND and whole lines per write,
 * so lines of several loops never interleave.
 */
#include "telemetry/access_log.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "daemon.h"
#include "http/front.h"
#include "http/upstream.h"
#include "idem.h"
#include "log.h"
#include "mono.h"
#include "put.h"
#include "gateway/request_key.h"

#define BUF_SIZE (64 * 1024)
#define LINE_MAX_LEN 8192
#define VALUE_MAX 1024 /* bytes of one value logged; the rest is cut */

struct access_log {
    int fd;
    char *path; /* NULL: stdout or stderr */
    int text;
    int subject;
    char *subject_header;
};

struct access_buf {
    struct access_log *log;
    struct event *flush_ev;
    int flush_due;
    time_t second;      /* the second stamp is of */
    char stamp[24];     /* "2026-12-02T01:18:49" */
    size_t len;
    char data[BUF_SIZE];
};

static int open_file(const char *path)
{
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
}

struct access_log *access_log_open(const struct server_config *cfg, char *err, size_t errlen)
{
    err[0] = '\0';
    if (cfg->access_to && !*cfg->access_to)
        return NULL; /* off */
    struct access_log *l = calloc(1, sizeof *l);
    if (!l || !(l->subject_header = strdup(cfg->subject_header)) ||
        (cfg->access_to && !(l->path = strdup(cfg->access_to)))) {
        snprintf(err, errlen, "out of memory");
        access_log_close(l);
        return NULL;
    }
    l->text = cfg->access_text;
    l->subject = cfg->access_subject;
    l->fd = l->path ? open_file(l->path) : cfg->access_stderr ? STDERR_FILENO : STDOUT_FILENO;
    if (l->fd < 0) {
        snprintf(err, errlen, "access_log: opening %s: %s", l->path, strerror(errno));
        access_log_close(l);
        return NULL;
    }
    return l;
}

int access_log_reopen(struct access_log *l, char *err, size_t errlen)
{
    if (!l || !l->path)
        return 0;
    int fd = open_file(l->path);
    /* In place: the loops go on writing to the same descriptor, which
     * now is the new file. */
    if (fd < 0 || dup2(fd, l->fd) < 0) {
        snprintf(err, errlen, "access_log: reopening %s: %s", l->path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return 0;
}

void access_log_close(struct access_log *l)
{
    if (!l)
        return;
    if (l->path && l->fd >= 0)
        close(l->fd);
    free(l->path);
    free(l->subject_header);
    free(l);
}

static void flush(struct access_buf *b)
{
    size_t off = 0;
    while (off < b->len) {
        ssize_t n = write(b->log->fd, b->data + off, b->len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* a full disk: the lines are lost, the requests are not */
        off += (size_t)n;
    }
    b->len = 0;
}

static void on_flush(evutil_socket_t fd, short what, void *arg)
{
    struct access_buf *b = arg;
    (void)fd;
    (void)what;
    b->flush_due = 0;
    flush(b);
}

struct access_buf *access_buf_new(struct access_log *l, struct event_base *base)
{
    struct access_buf *b = malloc(sizeof *b);
    if (!b)
        return NULL;
    b->log = l;
    b->len = 0;
    b->flush_due = 0;
    b->second = (time_t)-1;
    if (!(b->flush_ev = event_new(base, -1, 0, on_flush, b))) {
        free(b);
        return NULL;
    }
    return b;
}

void access_buf_free(struct access_buf *b)
{
    if (!b)
        return;
    flush(b);
    event_free(b->flush_ev);
    free(b);
}

/* ---- a line ---- */

struct line {
    char buf[LINE_MAX_LEN];
    size_t len;
    int text, fields;
};

static void put_raw(struct line *ln, const char *s, size_t n)
{
    if (ln->len + n >= sizeof ln->buf - 2)
        n = sizeof ln->buf - 2 - ln->len;
    memcpy(ln->buf + ln->len, s, n);
    ln->len += n;
}

static void field_name(struct line *ln, const char *name)
{
    if (ln->text) {
        if (ln->fields++)
            put_raw(ln, " ", 1);
        put_raw(ln, name, strlen(name));
        put_raw(ln, "=", 1);
    } else {
        put_raw(ln, ln->fields++ ? ",\"" : "{\"", 2);
        put_raw(ln, name, strlen(name));
        put_raw(ln, "\":", 2);
    }
}

/* A text field; NULL is null (JSON) or left out (text). */
static void add_str(struct line *ln, const char *name, const char *value)
{
    if (!value) {
        if (!ln->text) {
            field_name(ln, name);
            put_raw(ln, "null", 4);
        }
        return;
    }
    size_t n = strlen(value);
    n = n > VALUE_MAX ? VALUE_MAX : n;
    field_name(ln, name);
    if (!ln->text) {
        put_raw(ln, "\"", 1);
        ln->len += log_json_escape(value, n, ln->buf + ln->len, sizeof ln->buf - 2 - ln->len);
        put_raw(ln, "\"", 1);
        return;
    }
    char esc[VALUE_MAX * 6 + 1];
    size_t e = log_escape(value, n, esc, sizeof esc);
    int quote = e == 0 || strpbrk(esc, " \"=") != NULL;
    if (!quote) {
        put_raw(ln, esc, e);
        return;
    }
    put_raw(ln, "\"", 1);
    for (size_t i = 0; i < e; i++)
        put_raw(ln, esc[i] == '"' ? "\\\"" : &esc[i], esc[i] == '"' ? 2 : 1);
    put_raw(ln, "\"", 1);
}

/* Numbers are written without a format string: a line per request. */
static void add_num(struct line *ln, const char *name, uint64_t v)
{
    char n[24];
    field_name(ln, name);
    put_raw(ln, n, (size_t)(put_uint(n, v) - n));
}

/* Microseconds as milliseconds with three decimals: "6.934". */
static void add_ms(struct line *ln, const char *name, int64_t us)
{
    char n[32], *o = n;
    uint64_t u = us > 0 ? (uint64_t)us : 0;
    field_name(ln, name);
    o = put_uint(o, u / 1000);
    *o++ = '.';
    *o++ = (char)('0' + u / 100 % 10);
    *o++ = (char)('0' + u / 10 % 10);
    *o++ = (char)('0' + u % 10);
    put_raw(ln, n, (size_t)(o - n));
}

/* The time to the millisecond; the date and time of day are formatted
 * once a second per loop. */
static void add_time(struct access_buf *b, struct line *ln)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec != b->second) {
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        strftime(b->stamp, sizeof b->stamp, "%Y-%m-%dT%H:%M:%S", &tm);
        b->second = ts.tv_sec;
    }
    char t[40], *o = put_str(t, b->stamp);
    long ms = ts.tv_nsec / 1000000;
    *o++ = '.';
    *o++ = (char)('0' + ms / 100);
    *o++ = (char)('0' + ms / 10 % 10);
    *o++ = (char)('0' + ms % 10);
    *o++ = 'Z';
    *o = '\0';
    add_str(ln, "time", t);
}

static void append(struct access_buf *b, struct line *ln)
{
    if (!ln->text)
        put_raw(ln, "}", 1);
    ln->buf[ln->len++] = '\n';
    if (b->len + ln->len > sizeof b->data)
        flush(b);
    memcpy(b->data + b->len, ln->buf, ln->len);
    b->len += ln->len;
    if (!b->flush_due) {
        b->flush_due = 1;
        event_active(b->flush_ev, EV_TIMEOUT, 0);
    }
}

static void add_subject(struct line *ln, const struct access_log *l, const char *subject)
{
    if (l->subject == SUBJECT_OFF)
        return;
    if (!subject || l->subject == SUBJECT_PLAIN) {
        add_str(ln, "subject", subject);
        return;
    }
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    char hex[17];
    if (idem_fingerprint(subject, strlen(subject), fp) != IDEM_OK) {
        add_str(ln, "subject", NULL);
        return;
    }
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", fp[i]);
    add_str(ln, "subject", hex);
}

/* A line's start: the time and its kind. */
static void line_begin(struct access_buf *b, struct line *ln, const char *kind)
{
    ln->len = 0;
    ln->fields = 0;
    ln->text = b->log->text;
    add_time(b, ln);
    add_str(ln, "kind", kind);
}

/* A status that may be none (no answer came): the number, or null. */
static void add_status(struct line *ln, const char *name, int status)
{
    if (status > 0)
        add_num(ln, name, (uint64_t)status);
    else
        add_str(ln, name, NULL);
}

void access_log_request(void *arg, const struct front_request *req, int status)
{
    struct access_buf *b = arg;
    const struct access_log *l = b->log;
    struct line ln; /* not zeroed whole: 8 KiB a request */
    char path[VALUE_MAX + 1];
    request_path(req->msg->target, path, sizeof path);
    line_begin(b, &ln, "http");
    add_str(&ln, "route", req->log_route[0] ? req->log_route : NULL);
    add_str(&ln, "method", req->msg->method);
    add_str(&ln, "path", path);
    add_str(&ln, "peer", req->peer);
    add_subject(&ln, l, http_msg_header(req->msg, l->subject_header));
    add_str(&ln, "key", req->log_key[0] ? req->log_key : NULL);
    /* A request the front refused (a limit) says so; one the gateway took
     * has its verdict, named as idem_requests_total's outcome label names
     * it (gw_outcome_name, one table for both), and a refused one its
     * problem's type beside it (key_missing, signature_expired ...); the
     * others are the JSON API's (token issuance, health), or not routed. */
    const char *outcome = req->log_outcome                   ? req->log_outcome
                          : req->log_route[0] || req->outcome ? gw_outcome_name(req->outcome)
                          : strncmp(path, "/_idem/", 7) == 0  ? "api"
                                                              : "not_routed";
    add_str(&ln, "outcome", outcome);
    if (!req->log_outcome && req->outcome_type)
        add_str(&ln, "problem", req->outcome_type);
    add_num(&ln, "status", status > 0 ? (uint64_t)status : 0);
    if (req->upstream_status || req->upstream_us) {
        /* No status when it gave none: what went wrong instead. */
        add_status(&ln, "upstream_status", req->upstream_status);
        if (req->upstream_result != UPSTREAM_OK)
            add_str(&ln, "upstream_error",
                    upstream_result_name((enum upstream_result)req->upstream_result));
        add_ms(&ln, "upstream_ms", req->upstream_us);
    }
    add_ms(&ln, "total_ms", mono_us() - req->start_us);
    if (req->epoch)
        add_num(&ln, "epoch", req->epoch);
    /* The client's own as it came, or the one made for it. */
    add_str(&ln, "request_id", req->request_id_own ? req->request_id
                                                   : http_msg_header(req->msg, "X-Request-Id"));
    add_str(&ln, "host", http_msg_header(req->msg, "Host"));
    add_str(&ln, "user_agent", http_msg_header(req->msg, "User-Agent"));
    add_num(&ln, "bytes_in", req->msg->body_len);
    add_num(&ln, "bytes_out", req->bytes_out);
    append(b, &ln);
}

void access_log_question(struct access_buf *b, const struct access_question *q)
{
    struct line ln;
    line_begin(b, &ln, "question");
    add_str(&ln, "route", q->route);
    add_str(&ln, "key", q->key);
    add_num(&ln, "epoch", q->epoch);
    add_num(&ln, "question", q->question);
    add_str(&ln, "verdict", q->verdict);
    add_status(&ln, "status", q->status);
    add_ms(&ln, "upstream_ms", q->upstream_us);
    add_str(&ln, "request_id", q->request_id && *q->request_id ? q->request_id : NULL);
    append(b, &ln);
}

void access_log_message(struct access_buf *b, const struct access_message *m)
{
    struct line ln;
    line_begin(b, &ln, "message");
    add_str(&ln, "consumer", m->consumer);
    add_str(&ln, "queue", m->queue);
    add_str(&ln, "message_id", m->message_id);
    add_str(&ln, "key", m->key && *m->key ? m->key : NULL);
    add_str(&ln, "outcome", m->outcome);
    add_str(&ln, "action", m->action);
    if (m->reason)
        add_str(&ln, "reason", m->reason);
    add_num(&ln, "status", m->status > 0 ? (uint64_t)m->status : 0);
    if (m->upstream_status || m->upstream_us) {
        add_status(&ln, "upstream_status", m->upstream_status);
        add_ms(&ln, "upstream_ms", m->upstream_us);
    }
    add_ms(&ln, "total_ms", m->total_us);
    if (m->epoch)
        add_num(&ln, "epoch", m->epoch);
    if (m->attempt)
        add_num(&ln, "attempt", m->attempt);
    append(b, &ln);
}
