/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.h — the daemon's metrics in Prometheus's text format (metrics.c),
 * served on the admin listener at /metrics and /_idem/v1/metrics; what they
 * count is counted in telemetry/counters.c.
 */
#ifndef IDEM_SERVER_METRICS_H
#define IDEM_SERVER_METRICS_H

struct daemon;
struct http_response;

/* Every metric, rendered now: reads memory (and /proc/self) only, never
 * the store, so any thread, a loop's too. NULL on OOM (a 503). */
struct http_response *metrics_render(struct daemon *d);

/* GET metrics, a handler of the endpoint table (api.c). */
struct api_call;
void api_metrics(struct api_call *c);

/* GET routes/stats: each route's and consumer's requests per second, error
 * ratio, p50 and p99 over the last minute, and its answers and 5xx in each
 * 10 s step of the last hour, from the daemon's own record of them. */
void api_route_stats(struct api_call *c);

#endif
