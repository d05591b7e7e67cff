/* log.h — the daemon's log: one line per event on stderr, with a UTC
 * timestamp, written whole (one write per line, so lines from several
 * threads never interleave). */
#ifndef IDEM_SERVER_LOG_H
#define IDEM_SERVER_LOG_H

void daemon_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
