/* log.h — the daemon's log: one line per event on stderr, with a UTC
 * timestamp, written whole (one write per line, so lines from several
 * threads never interleave), escaped (log.c says what is escaped and why). */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

#include <stddef.h>

void daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* in[0..n) as a log line may hold it, NUL-terminated in out (cap bytes),
 * cut between characters when it does not fit. Returns the length written. */
size_t log_escape(const char *in, size_t n, char *out, size_t cap);

#endif
