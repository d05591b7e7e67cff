/* SPDX-License-Identifier: Apache-2.0 */
/* log.h — the daemon's log: one line per event on stderr, with a UTC
 * timestamp, written whole (one write per line, so lines from several
 * threads never interleave), escaped (log.c says what is escaped and why). */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

#include <stddef.h>
#include <stdint.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_ALERT };

/* A line at level info; daemon_logl at the level given. Lines below the
 * level set by daemon_log_setup are not written. */
void daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void daemon_logl(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* What a line is about: in the JSON form, a field of its own each (route,
 * consumer, space, key, request_id, epoch), beside the message, which says
 * them too (the text form is the message alone). NULL or 0: not there. */
struct log_about {
    const char *route;
    const char *consumer;
    const char *space, *key;
    const char *request_id;
    uint64_t epoch;
};

/* A consumer's line, a route's: about it, by its name. */
#define LOG_CONSUMER(name) (&(struct log_about){.consumer = (name)})
#define LOG_ROUTE(name) (&(struct log_about){.route = (name)})

/* A line at level, about what *about names (about may be NULL). */
void daemon_log_about(enum log_level level, const struct log_about *about, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 when lines at level are written: a debug line's arguments need not
 * be made when they are not. Any thread. */
int daemon_log_enabled(enum log_level level);

/* The log's least level and form: text (the default: "TIME idem: MESSAGE",
 * a warning's and an error's message starting with its level), or json
 * ({"time", "level", "msg"} a line, and what it is about: struct
 * log_about). Before any thread logs. */
void daemon_log_setup(enum log_level least, int json);

/* in[0..n) as a log line may hold it, NUL-terminated in out (cap bytes),
 * cut between characters when it does not fit. Returns the length written. */
size_t log_escape(const char *in, size_t n, char *out, size_t cap);

/* in[0..n) as the inside of a JSON string, ASCII only: \uXXXX for every
 * other character (surrogate pairs past U+FFFF), U+FFFD for a byte that is
 * not UTF-8, \" and \\; into out (cap bytes, not terminated), cut between
 * characters. Returns the length written. */
size_t log_json_escape(const char *in, size_t n, char *out, size_t cap);

#endif
