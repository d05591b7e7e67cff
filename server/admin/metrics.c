/* SPDX-License-Identifier: Apache-2.0 */
/*
 * metrics.c — the daemon's metrics, in Prometheus's text exposition format
 * (0.0.4): the gateway's counters per route, the store's, the consumers',
 * the admin listener's, and the process's own (process_*, as Prometheus's
 * client libraries name them). docs/metrics.md lists them all.
 *
 * Read without touching the store, so a scrape every few seconds costs
 * nothing and works while the store is down. The series are bounded: a
 * route's label is a route or consumer name of the configuration (at most
 * ROUTES_MAX and CONSUMERS_MAX in one; kept across reloads by name, never
 * dropped, so only reloads that keep renaming routes add any), an outcome one
 * of enum gw_outcome's GW_OUTCOMES names, a code a status of 100 to 599
 * (only those answered appear), a kind one of enum upstream_result's.
 *
 * Beside them, GET routes/stats: each route's figures over the last minute
 * (telemetry/recent.h), for the console's overview of what is wrong now.
 */
#include "admin/metrics.h"

#include <dirent.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "admin/call.h"
#include "consume/consume.h"
#include "daemon.h"
#include "gateway/gateway.h"
#include "telemetry/counters.h"
#include "telemetry/recent.h"
#include "http/upstream.h"
#include "mono.h"

_Static_assert(GW_KEY_EXPIRED + 1 == GW_OUTCOMES, "GW_OUTCOMES counts enum gw_outcome");
_Static_assert(UPSTREAM_TOO_BIG + 1 == UPSTREAM_RESULTS,
               "UPSTREAM_RESULTS counts enum upstream_result");


/* The text, growing as it is written; failed once a realloc did. */
struct out {
    char *buf;
    size_t n, cap;
    int failed;
};

/* Room for k more bytes and a NUL; 0 once the text failed. */
static int room(struct out *o, size_t k)
{
    if (o->failed)
        return 0;
    if (o->cap - o->n > k)
        return 1;
    size_t cap = o->cap * 2 > o->n + k + 1 ? o->cap * 2 : o->n + k + 1;
    char *more = realloc(o->buf, cap);
    if (!more) {
        o->failed = 1;
        return 0;
    }
    o->buf = more;
    o->cap = cap;
    return 1;
}

static void add(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct out *o, const char *fmt, ...)
{
    for (int tries = 0; !o->failed && tries < 2; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(o->buf + o->n, o->cap - o->n, fmt, ap);
        va_end(ap);
        if (k < 0) {
            o->failed = 1;
            return;
        }
        if ((size_t)k < o->cap - o->n) {
            o->n += (size_t)k;
            return;
        }
        if (!room(o, (size_t)k))
            return;
    }
}

/* The text as a 200 of that type, o's buffer freed; NULL when it failed
 * or for want of memory (a 503). */
static struct http_response *out_response(struct out *o, const char *type)
{
    struct http_response *r = !o->failed ? response_new(200) : NULL;
    if (!r || response_add_header(r, "Content-Type", type) ||
        response_set_body(r, o->buf, o->n)) {
        response_free(r);
        r = NULL;
    }
    free(o->buf);
    o->buf = NULL;
    return r;
}

/* A label's value as the format wants it: backslash, double quote and
 * line feed escaped. Names of the configuration are at most IDEM_NAME_MAX
 * bytes (route names 64): out holds twice that; longer is cut. */
#define LABEL_MAX (2 * IDEM_NAME_MAX + 1)
static const char *label(const char *in, char out[LABEL_MAX])
{
    size_t k = 0;
    for (; *in && k + 2 < LABEL_MAX; in++) {
        if (*in == '\\' || *in == '"' || *in == '\n') {
            out[k++] = '\\';
            out[k++] = *in == '\n' ? 'n' : *in;
        } else {
            out[k++] = *in;
        }
    }
    out[k] = '\0';
    return out;
}

static void family(struct out *o, const char *name, const char *type, const char *help)
{
    add(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A histogram's lines: counts[b] observations in bucket b (not cumulative),
 * the last of nb without a bound; labels ("route=\"x\"" or "") on each.
 * Bounds and sum in microseconds, shown in seconds; or with us 0, counts
 * shown as they are (a batch's writes). */
static void add_histogram(struct out *o, const char *name, const char *labels,
                          const uint64_t *counts, const uint64_t *bounds, int nb, uint64_t sum,
                          int us)
{
    const char *comma = *labels ? "," : "";
    uint64_t total = 0;
    for (int b = 0; b < nb; b++) {
        total += counts[b];
        if (b < nb - 1)
            add(o, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, comma,
                (double)bounds[b] / (us ? 1e6 : 1), (unsigned long long)total);
        else
            add(o, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, comma,
                (unsigned long long)total);
    }
    const char *open = *labels ? "{" : "", *close = *labels ? "}" : "";
    if (us)
        add(o, "%s_sum%s%s%s %llu.%06llu\n", name, open, labels, close,
            (unsigned long long)(sum / 1000000), (unsigned long long)(sum % 1000000));
    else
        add(o, "%s_sum%s%s%s %llu\n", name, open, labels, close, (unsigned long long)sum);
    add(o, "%s_count%s%s%s %llu\n", name, open, labels, close, (unsigned long long)total);
}

/* A route's histogram of durations kept in the latency buckets. */
static void add_latency(struct out *o, const char *name, const char *route,
                        const atomic_ulong *buckets, const atomic_ulong *sum_us)
{
    uint64_t bounds[LATENCY_BUCKETS], counts[LATENCY_BUCKETS];
    for (int b = 0; b < LATENCY_BUCKETS - 1; b++)
        bounds[b] = (uint64_t)latency_bounds_us[b];
    for (int b = 0; b < LATENCY_BUCKETS; b++)
        counts[b] = atomic_load(&buckets[b]);
    char esc[LABEL_MAX], labels[LABEL_MAX + 16];
    snprintf(labels, sizeof labels, "route=\"%s\"", label(route, esc));
    add_histogram(o, name, labels, counts, bounds, LATENCY_BUCKETS, atomic_load(sum_us), 1);
}

/* The consumers' counters (label consumer). */
static void add_consumer_metrics(struct daemon *d, struct out *o)
{
    static const struct {
        const char *name, *type, *help;
        size_t field; /* in struct consumer_counters */
    } per[] = {
        {"idem_consumer_received_total", "counter", "Messages delivered by the broker.",
         offsetof(struct consumer_counters, received)},
        {"idem_consumer_executed_total", "counter",
         "Messages the handler answered 2xx, kept, then acked.",
         offsetof(struct consumer_counters, executed)},
        {"idem_consumer_duplicates_total", "counter",
         "Messages whose key was finished before (by a delivery, a consumer or a route), "
         "acked without a handler call.",
         offsetof(struct consumer_counters, duplicates)},
        {"idem_consumer_retried_total", "counter",
         "Attempts that failed (5xx, 408, 429, refused, timed out) and are tried again after "
         "the backoff.",
         offsetof(struct consumer_counters, retried)},
        {"idem_consumer_dead_lettered_total", "counter",
         "Messages put on the dead letter (with x-idem-reason), then acked.",
         offsetof(struct consumer_counters, dead_lettered)},
        {"idem_consumer_alerts_total", "counter",
         "Keys reused with another payload (dead-lettered key_reused): alert on any.",
         offsetof(struct consumer_counters, alerts)},
        {"idem_consumer_store_waits_total", "counter",
         "Messages held back because the store failed (nothing acked meanwhile).",
         offsetof(struct consumer_counters, store_waits)},
        {"idem_consumer_reconnects_total", "counter", "Broker connections lost.",
         offsetof(struct consumer_counters, reconnects)},
        {"idem_consumer_in_flight", "gauge",
         "Messages held now, unacked: being handled, or waiting to be tried again.",
         offsetof(struct consumer_counters, in_flight)},
    };
    size_t count = consumers_count(d->consumers);
    if (!count)
        return;
    char esc[LABEL_MAX], esc2[LABEL_MAX];
    for (size_t i = 0; i < sizeof per / sizeof per[0]; i++) {
        family(o, per[i].name, per[i].type, per[i].help);
        for (size_t k = 0; k < count; k++) {
            const char *c = (const char *)consumers_counters(d->consumers, k);
            add(o, "%s{consumer=\"%s\"} %lu\n", per[i].name,
                label(consumers_name(d->consumers, k), esc),
                atomic_load((const atomic_ulong *)(c + per[i].field)));
        }
    }
    family(o, "idem_consumer_connected", "gauge",
           "1 while the consumer's broker connection is up.");
    for (size_t k = 0; k < count; k++)
        add(o, "idem_consumer_connected{consumer=\"%s\",source=\"%s\"} %d\n",
            label(consumers_name(d->consumers, k), esc),
            label(consumers_kind(d->consumers, k), esc2),
            atomic_load(&consumers_counters(d->consumers, k)->connected));
}

/* The process's own, as Prometheus's client libraries define them: from
 * /proc/self/stat (fields 14, 15: user and system CPU in clock ticks; 22:
 * the start, in ticks after boot; 23: virtual size in bytes; 24: resident
 * pages), /proc/stat's btime, /proc/self/fd and RLIMIT_NOFILE. What cannot
 * be read is left out. */
static void add_process_metrics(struct out *o)
{
    long tick = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
    unsigned long long utime, stime, start, vsize;
    long long rss;
    char stat[2048];
    FILE *f = fopen("/proc/self/stat", "re");
    size_t len = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f)
        fclose(f);
    stat[len] = '\0';
    /* After the command's name, in parentheses, which may hold anything. */
    const char *p = strrchr(stat, ')');
    if (tick > 0 && page > 0 && p &&
        sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
                      "%*d %llu %llu %lld",
               &utime, &stime, &start, &vsize, &rss) == 5) {
        family(o, "process_cpu_seconds_total", "counter",
               "Total user and system CPU time spent in seconds.");
        add(o, "process_cpu_seconds_total %.2f\n", (double)(utime + stime) / (double)tick);
        family(o, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        add(o, "process_resident_memory_bytes %lld\n", rss * page);
        family(o, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        add(o, "process_virtual_memory_bytes %llu\n", vsize);
        unsigned long long btime = 0;
        char line[256];
        FILE *s = fopen("/proc/stat", "re");
        while (s && fgets(line, sizeof line, s) && sscanf(line, "btime %llu", &btime) != 1)
            ;
        if (s)
            fclose(s);
        if (btime) {
            family(o, "process_start_time_seconds", "gauge",
                   "Start time of the process since unix epoch in seconds.");
            add(o, "process_start_time_seconds %.2f\n",
                (double)btime + (double)start / (double)tick);
        }
    }
    DIR *fds = opendir("/proc/self/fd");
    if (fds) {
        long open_fds = -1; /* not the directory's own */
        for (struct dirent *e; (e = readdir(fds)) != NULL;)
            open_fds += e->d_name[0] != '.';
        closedir(fds);
        family(o, "process_open_fds", "gauge", "Number of open file descriptors.");
        add(o, "process_open_fds %ld\n", open_fds);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        family(o, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        add(o, "process_max_fds %llu\n", (unsigned long long)rl.rlim_cur);
    }
}

struct http_response *metrics_render(struct daemon *d)
{
    static const struct {
        const char *name, *help;
        size_t field; /* in struct route_counts */
    } per_route[] = {
        {"idem_executions_total",
         "Requests forwarded to the upstream under a claimed record.",
         offsetof(struct route_counts, executions)},
        {"idem_redis_down_skips_total",
         "Requests that went on without the token and lock layers while Redis was down.",
         offsetof(struct route_counts, redis_down_skips)},
        {"idem_stale_events_total",
         "Events behind their key's state on a route with states, answered 200 unforwarded.",
         offsetof(struct route_counts, stale)},
        {"idem_transition_conflicts_total",
         "Events contradicting their key's state on a route with states (SUCCESS after "
         "FAILED), answered 409 unforwarded: the alert branch.",
         offsetof(struct route_counts, transition_conflicts)},
        {"idem_tokens_consumed_total", "Tokens the route's token layer spent.",
         offsetof(struct route_counts, tokens_consumed)},
        {"idem_locks_acquired_total", "Locks the route's lock layer took.",
         offsetof(struct route_counts, locks_acquired)},
        {"idem_locks_busy_total",
         "Lock attempts of the route's lock layer that found the key's lock held.",
         offsetof(struct route_counts, locks_busy)},
    };
    idem_stats st;
    idem_get_stats(d->h, &st);
    idem_commit_times ct;
    idem_get_commit_times(d->h, &ct);
    idem_commit_batches cb;
    idem_get_commit_batches(d->h, &cb);
    const struct {
        const char *name, *type, *help;
        uint64_t value;
    } whole[] = {
        {"idem_passthrough_total", "counter",
         "Requests that matched no route, proxied untouched.", atomic_load(&d->passthrough)},
        {"idem_answers_not_kept", "gauge",
         "Requests executed whose answer the store has not kept yet: each holds its claim "
         "and writes it again until the store takes it.",
         gateway_unkept(d->gateway)},
        {"idem_requests_in_flight", "gauge",
         "Requests of the main listener being handled now (in_flight_max bounds them).",
         d->front_counts ? atomic_load(&d->front_counts->in_flight) : 0},
        {"idem_connections_open", "gauge",
         "Connections open on the main listener now (connections_max bounds them).",
         d->front_counts ? atomic_load(&d->front_counts->connections) : 0},
        {"idem_admin_connections_open", "gauge",
         "Connections open on the admin listener now (admin_connections_max bounds them).",
         d->front_counts ? atomic_load(&d->front_counts->admin_connections) : 0},
        {"idem_config_last_reload_successful", "gauge",
         "1 when the last reload (SIGHUP) took the file, or there was none since the "
         "start; 0 when it was refused and the running configuration stayed.",
         (uint64_t)(atomic_load(&d->reload_failed) == 0)},
        {"idem_config_last_reload_success_timestamp_seconds", "gauge",
         "When the running configuration was loaded (the start, or the last reload that "
         "took the file), in seconds since the Unix epoch.",
         (uint64_t)atomic_load(&d->config_loaded_s)},
        {"idem_record_conflicts_total", "counter",
         "Finishes or transitions refused because another claim or state won: alert on "
         "any.",
         st.conflicts},
        {"idem_record_takeovers_total", "counter",
         "Records claimed again after their lease ran out.", st.takeovers},
        {"idem_store_commits_total", "counter", "Durable store transactions (group commits).",
         st.commits},
        {"idem_store_committed_ops_total", "counter", "Writes carried by those transactions.",
         st.committed_ops},
        {"idem_admin_auth_failures_total", "counter",
         "Requests on the admin listener refused 401: no API key, or a wrong one.",
         atomic_load(&d->auth_failures)},
        {"idem_tokens_issued_total", "counter",
         "Tokens issued by the JSON API (POST /_idem/v1/tokens answered 201), on either "
         "listener.",
         atomic_load(&d->tokens_issued)},
        {"idem_tokens_rate_limited_total", "counter",
         "Token requests on the main listener refused 429 (token_rate_subject, "
         "token_rate_peer).",
         atomic_load(&d->tokens_refused)},
        {"idem_store_writes_failing", "gauge",
         "1 after a gateway write to the store failed, until one succeeds again.",
         (uint64_t)(atomic_load(&d->writes_failing) != 0)},
    };
    struct out o = {.cap = 65536};
    if (!(o.buf = malloc(o.cap)))
        return NULL; /* 503, as for any response that cannot be built */
    char esc[LABEL_MAX];
    pthread_mutex_lock(&d->counts.mu);
    for (size_t i = 0; i < sizeof per_route / sizeof per_route[0]; i++) {
        family(&o, per_route[i].name, "counter", per_route[i].help);
        for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
            add(&o, "%s{route=\"%s\"} %lu\n", per_route[i].name, label(rc->name, esc),
                counts_read(&rc->n, per_route[i].field));
    }
    family(&o, "idem_requests_total", "counter",
           "Requests on the route (consumers' messages included) by what became of them: "
           "one series per verdict, the access log's outcome.");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        for (int v = 0; v < GW_OUTCOMES; v++)
            add(&o, "idem_requests_total{route=\"%s\",outcome=\"%s\"} %lu\n",
                label(rc->name, esc), gw_outcome_name(v), atomic_load(&rc->n.outcomes[v]));
    family(&o, "idem_responses_total", "counter",
           "Answers on the route by status code (those answered at least once).");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        for (int c = 0; c < STATUS_CODES; c++) {
            unsigned long v = atomic_load(&rc->n.codes[c]);
            if (v)
                add(&o, "idem_responses_total{route=\"%s\",code=\"%d\"} %lu\n",
                    label(rc->name, esc), c + STATUS_MIN, v);
        }
    family(&o, "idem_upstream_errors_total", "counter",
           "Upstream calls that got no usable answer, by kind: not_sent (no byte reached it: "
           "refused, unreachable), unknown (sent, then the connection failed or the answer "
           "was malformed), timeout (sent, no whole answer in time), too_big (an answer over "
           "the limits).");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        for (int k = UPSTREAM_OK + 1; k < UPSTREAM_RESULTS; k++)
            add(&o, "idem_upstream_errors_total{route=\"%s\",kind=\"%s\"} %lu\n",
                label(rc->name, esc), upstream_result_name((enum upstream_result)k),
                atomic_load(&rc->n.upstream_errors[k]));
    static const char *const resolutions[] = {"executed", "not_executed", "unanswered",
                                              "given_up"};
    family(&o, "idem_resolutions_total", "counter",
           "Status queries of on_unknown_outcome: resolve routes, by what the service said: "
           "executed, not_executed, unanswered (another status, a timeout: asked again "
           "later), given_up (past give_up: held for an operator).");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        for (int v = 0; v < 4; v++)
            add(&o, "idem_resolutions_total{route=\"%s\",verdict=\"%s\"} %lu\n",
                label(rc->name, esc), resolutions[v], atomic_load(&rc->n.resolutions[v]));
    const char *dur = "idem_request_duration_seconds";
    family(&o, dur, "histogram",
           "From a request's arrival at the route to its answer (the upstream's time "
           "included).");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        add_latency(&o, dur, rc->name, rc->n.latency, &rc->n.latency_sum_us);
    const char *up = "idem_upstream_duration_seconds";
    family(&o, up, "histogram",
           "The upstream's part of a request: from sending it to the upstream's whole answer, "
           "or its failure.");
    for (const struct named_counts *rc = d->counts.list; rc; rc = rc->next)
        add_latency(&o, up, rc->name, rc->n.upstream_latency, &rc->n.upstream_latency_sum_us);
    pthread_mutex_unlock(&d->counts.mu);
    const char *commit = "idem_store_commit_duration_seconds";
    family(&o, commit, "histogram",
           "Durable store transactions, from a batch's first statement to its durable "
           "COMMIT (the fsync included): every durable write waits for one.");
    uint64_t bounds[IDEM_COMMIT_BUCKETS > IDEM_BATCH_BUCKETS ? IDEM_COMMIT_BUCKETS
                                                             : IDEM_BATCH_BUCKETS];
    for (int b = 0; b < IDEM_COMMIT_BUCKETS - 1; b++)
        bounds[b] = idem_commit_bucket_us((unsigned)b);
    add_histogram(&o, commit, "", ct.hist, bounds, IDEM_COMMIT_BUCKETS, ct.us, 1);
    const char *batch = "idem_store_commit_batch_size";
    family(&o, batch, "histogram",
           "Writes each durable store transaction carried: group commit shares one among "
           "many; batches of one mean each write pays for its own.");
    for (int b = 0; b < IDEM_BATCH_BUCKETS - 1; b++)
        bounds[b] = idem_commit_batch_bound((unsigned)b);
    add_histogram(&o, batch, "", cb.hist, bounds, IDEM_BATCH_BUCKETS, cb.ops, 0);
    for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) {
        family(&o, whole[i].name, whole[i].type, whole[i].help);
        add(&o, "%s %llu\n", whole[i].name, (unsigned long long)whole[i].value);
    }
    add_consumer_metrics(d, &o);
    size_t nheld = 0;
    int64_t census_ms = 0;
    struct held_count *held = held_census_read(&d->held, &nheld, &census_ms);
    family(&o, "idem_records_held", "gauge",
           "Claims held now in the key space (on_unknown_outcome: hold or resolve, a held "
           "takeover), every instance's: counted from the store every 15 s. Alert while "
           "above 0.");
    for (size_t i = 0; i < nheld; i++)
        add(&o, "idem_records_held{space=\"%s\"} %llu\n", label(held[i].space, esc),
            (unsigned long long)held[i].held);
    free(held);
    char esc2[LABEL_MAX];
    family(&o, "idem_build_info", "gauge", "The running version and store.");
    add(&o, "idem_build_info{version=\"%s\",store=\"%s\"} 1\n", label(idem_version(), esc),
        label(idem_store_name(d->h), esc2));
    add_process_metrics(&o);
    return out_response(&o, "text/plain; version=0.0.4; charset=utf-8");
}

void api_metrics(struct api_call *c)
{
    api_answer(c, metrics_render(c->d));
}

/* The answer of routes/stats is written by hand, not built as a jansson
 * tree: an hour of steps is 360 pairs a route, and a tree of them costs a
 * loop about 0.1 ms a route (118 ms for 1000 routes, every 2 s while a
 * console is open), three allocations a step; written out, none. */

/* A number, or null when it is not known (negative). */
static void add_figure(struct out *o, const char *name, double v)
{
    if (v < 0)
        add(o, ",\"%s\":null", name);
    else
        add(o, ",\"%s\":%.3f", name, v);
}

/* n in decimal, without printf. */
static void put_uint(struct out *o, uint32_t n)
{
    char d[10];
    int k = 0;
    do
        d[k++] = (char)('0' + n % 10);
    while ((n /= 10) != 0);
    while (k)
        o->buf[o->n++] = d[--k];
}

/* One step as [answers,5xx], after a comma unless it is the first. */
static void add_step(struct out *o, const struct recent_step *st, int first)
{
    if (!room(o, 24)) /* ",[" 10 digits "," 10 digits "]" */
        return;
    if (!first)
        o->buf[o->n++] = ',';
    o->buf[o->n++] = '[';
    put_uint(o, st->requests);
    o->buf[o->n++] = ',';
    put_uint(o, st->errors);
    o->buf[o->n++] = ']';
    o->buf[o->n] = '\0';
}

/* A route's figures over the last STATS_SPAN_MS, and its answers and 5xx
 * in each step of the last hour. */
#define STATS_SPAN_MS 60000
static void route_stats(struct out *o, struct daemon *d, const struct route *rt, int consumer,
                        int64_t now_ms, struct recent_step *steps)
{
    const struct recent *r = NULL;
    if (rt->n != &d->counts.unlisted)
        r = ((const struct named_counts *)((const char *)rt->n -
                                           offsetof(struct named_counts, n)))->recent;
    struct recent_figures f;
    unsigned nsteps = recent_read(r, rt->n, now_ms, STATS_SPAN_MS, &f, steps);
    char esc[LABEL_MAX];
    add(o, "{\"route\":\"%s\",\"kind\":\"%s\",\"seconds\":%.3f,\"requests\":%lu",
        label(rt->name, esc), consumer ? "consumer" : "route", f.seconds, f.requests);
    add_figure(o, "per_second", f.seconds > 0 ? (double)f.requests / f.seconds : -1);
    add(o, ",\"errors\":%lu", f.errors);
    add_figure(o, "error_ratio", f.requests ? (double)f.errors / (double)f.requests : -1);
    add(o, ",\"executions\":%lu,\"replays\":%lu,\"conflicts\":%lu", f.executions, f.replays,
        f.conflicts);
    add_figure(o, "p50_ms", f.p50_ms);
    add_figure(o, "p99_ms", f.p99_ms);
    add(o, ",\"steps\":[");
    for (unsigned i = 0; i < nsteps; i++)
        add_step(o, &steps[i], i == 0);
    add(o, "],\"last_step_ms\":%u}", nsteps ? steps[nsteps - 1].ms : 0);
}

void api_route_stats(struct api_call *c)
{
    struct daemon *d = c->d;
    const struct server_config *cfg = c->cfg;
    int64_t now = mono_ms();
    struct out o = {.cap = 65536};
    struct recent_step *steps = malloc(RECENT_STEPS * sizeof *steps);
    if (!steps || !(o.buf = malloc(o.cap))) {
        free(steps);
        api_answer(c, NULL); /* 503, as for any answer that cannot be built */
        return;
    }
    add(&o, "{\"span_ms\":%d,\"step_ms\":%d,\"routes\":[", STATS_SPAN_MS, RECENT_STEP_MS);
    pthread_mutex_lock(&d->counts.mu);
    for (size_t i = 0; i < cfg->route_count + cfg->consumer_count; i++) {
        if (i)
            add(&o, ",");
        route_stats(&o, d, config_nth_route(cfg, i), i >= cfg->route_count, now, steps);
    }
    pthread_mutex_unlock(&d->counts.mu);
    add(&o, "]}");
    free(steps);
    api_answer(c, out_response(&o, "application/json"));
}
