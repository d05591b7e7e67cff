/*
 * metrics.h — the daemon's metrics in Prometheus's text format (metrics.c),
 * served on the admin listener at /metrics and /_idem/v1/metrics, and what
 * counts them as each answer goes out.
 */
#ifndef IDEM_SERVER_METRICS_H
#define IDEM_SERVER_METRICS_H

struct daemon;
struct daemon_counters;
struct front_request;
struct http_response;

/* Every metric, rendered now: reads memory (and /proc/self) only, never
 * the store, so any thread, a loop's too. NULL on OOM (a 503). */
struct http_response *metrics_render(struct daemon *d);

/* A request on a route (n: its counters; NULL: on none, not counted)
 * answered with status: its verdict, status, and the upstream's time and
 * failure. On its loop, as the answer goes out. */
void metrics_count_request(struct daemon_counters *n, const struct front_request *req,
                           int status);

#endif
