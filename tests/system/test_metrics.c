/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_metrics.c — idem serve's metrics as Prometheus scrapes them: the
 * daemon in front of the example refund service, on loopback, in a temp
 * dir, requests that end in several verdicts, then /metrics on the admin
 * listener checked by promtool and against what was sent; and the alert
 * rules and the Grafana dashboard under deploy/, checked against a real
 * scrape.
 *
 *   test_metrics IDEM_BINARY REFUND_SERVICE_BINARY
 */
#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

static const char *idem_bin, *service_bin;
static char *dir;
static struct proc service;

#define READ_KEY "test-read-key-0123456789abcdef"

/* Two routes on the refund service and one on a port where nothing
 * listens; a consumer whose broker is not there either (its counters are
 * shown all the same); a read key beside the tests' write key. */
static const char config_yaml[] =
    "subject_header: X-Subject\n"
    "admin_listen: 127.0.0.1:0\n"
    "api_keys:\n"
    "  - { name: test, scope: write, env: " SYS_ADMIN_KEY_ENV " }\n"
    "  - { name: prometheus, scope: read, env: IDEM_TEST_READ_KEY }\n"
    "routes:\n"
    "  - name: refund\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: http://127.0.0.1:@UP@\n"
    "    key: { json: refund_no }\n"
    "    fingerprint: [refund_no, amount]\n"
    "    layers: [lock, record]\n"
    "    in_flight: reject\n"
    "    upstream_timeout: 1s\n"
    "  - name: payment\n"
    "    match: { method: POST, path: /payments }\n"
    "    upstream: http://127.0.0.1:@UP@\n"
    "    key: { json: serial_no }\n"
    "    layers: [token, record]\n"
    "    token_scene: refund\n"
    "  - name: down\n"
    "    match: { method: POST, path: /down }\n"
    "    upstream: http://127.0.0.1:@DOWN@\n"
    "    key: { json: refund_no }\n"
    "    layers: [record]\n"
    "    on_unknown_outcome: hold\n"
    "consumers:\n"
    "  - name: refund-result\n"
    "    source: { amqp: \"amqp://guest:guest@127.0.0.1:@DOWN@/%2f\", queue: q }\n"
    "    key: { json: refund_no }\n"
    "    space: refund-result\n"
    "    handler: http://127.0.0.1:@UP@/refunds\n";

static void start_idem(struct proc *p)
{
    char text[8192], path[4200], db[4200], log[4200], up[16], down[16];
    snprintf(up, sizeof up, "%d", service.port);
    snprintf(down, sizeof down, "%d", sys_free_port());
    const char *s = config_yaml;
    char *o = text;
    while (*s) {
        const char *with = strncmp(s, "@UP@", 4) == 0     ? up
                           : strncmp(s, "@DOWN@", 6) == 0 ? down
                                                          : NULL;
        if (with) {
            o += sprintf(o, "%s", with);
            s += with == up ? 4 : 6;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    snprintf(path, sizeof path, "%s/idem.yaml", dir);
    snprintf(db, sizeof db, "%s/idem.db", dir);
    snprintf(log, sizeof log, "%s/idem.log", dir);
    sys_write_file(path, text);
    setenv("IDEM_TEST_READ_KEY", READ_KEY, 1);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", "127.0.0.1:0",
                    NULL};
    sys_start(p, argv, log);
    assert_true(p->admin_port > 0);
}

static void post(int port, const char *path, const char *const *headers, const char *body,
                 int status)
{
    struct sys_resp r;
    sys_http(port, "POST", path, headers, body, 10000, &r);
    assert_int_equal(r.status, status);
    sys_resp_free(&r);
}

/* GET target on the admin listener with this Authorization (NULL: none):
 * the status, and the body (malloc'd) in *body when 200. */
static int scrape(int admin_port, const char *target, const char *auth, char **body)
{
    const char *h[] = {auth, NULL};
    struct sys_resp r;
    sys_http(admin_port, "GET", target, auth ? h : NULL, NULL, 5000, &r);
    int status = r.status;
    if (body)
        *body = status == 200 ? strndup(r.m->body, r.m->body_len) : NULL;
    if (status == 200)
        assert_non_null(strstr(sys_header(&r, "Content-Type"), "text/plain; version=0.0.4"));
    sys_resp_free(&r);
    return status;
}

static char *scrape_ok(int admin_port)
{
    char *body = NULL;
    assert_int_equal(scrape(admin_port, "/metrics", "Authorization: Bearer " READ_KEY, &body),
                     200);
    return body;
}

/* The value of the series written exactly so ("name{labels}" or "name"),
 * or -1 when the scrape has no such line. */
static double value(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

/* The sum over the series of family name (its lines "name{...} v") that
 * carry the label text with (e.g. "route=\"refund\""). */
static double sum_of(const char *text, const char *name, const char *with)
{
    double sum = 0;
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        const char *end = strchr(p, '\n');
        if (strncmp(p, name, n) != 0 || p[n] != '{')
            continue;
        const char *close = strchr(p, '}'), *at = strstr(p, with);
        if (close && at && at < close && (!end || close < end))
            sum += atof(close + 2);
    }
    return sum;
}

/* promtool (the prometheus package) run as "promtool check WHAT [file]",
 * with stdin from in (NULL: none): its exit status, its output in out. */
static int promtool(const char *what, const char *file, const char *in, char *out, size_t cap)
{
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "promtool check %s %s%s%s 2>&1", what, file ? "'" : "",
             file ? file : "", file ? "'" : "");
    char inpath[4200];
    if (in) {
        snprintf(inpath, sizeof inpath, "%s/scrape.txt", dir);
        sys_write_file(inpath, in);
        snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " < '%s'", inpath);
    }
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t len = fread(out, 1, cap - 1, f);
    out[len] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

struct slow_post {
    int port;
};

static void *slow_post_main(void *arg)
{
    struct slow_post *s = arg;
    static const char *const delay[] = {"X-Delay-Ms: 800", NULL};
    post(s->port, "/refunds", delay, "{\"refund_no\":\"M-slow\",\"amount\":\"1.00\"}", 201);
    return NULL;
}

static void test_counts_match_what_happened(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw);
    const char *body = "{\"refund_no\":\"M-1\",\"amount\":\"1.00\"}";
    /* One execution, three replays, a payload mismatch, a missing key. */
    post(gw.port, "/refunds", NULL, body, 201);
    for (int i = 0; i < 3; i++)
        post(gw.port, "/refunds", NULL, body, 201);
    post(gw.port, "/refunds", NULL, "{\"refund_no\":\"M-1\",\"amount\":\"2.00\"}", 422);
    post(gw.port, "/refunds", NULL, "{\"amount\":\"2.00\"}", 400);
    /* The upstream's 503: released (upstream_error); its timeout: sent, no
     * answer (outcome_unknown); nothing listening: not sent. */
    static const char *const fail[] = {"X-Fail: 503", NULL};
    post(gw.port, "/refunds", fail, "{\"refund_no\":\"M-2\",\"amount\":\"1.00\"}", 503);
    static const char *const slow[] = {"X-Delay-Ms: 3000", NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", slow, "{\"refund_no\":\"M-3\",\"amount\":\"1.00\"}",
             10000, &r);
    int timeout_status = r.status;
    assert_true(timeout_status >= 500);
    sys_resp_free(&r);
    post(gw.port, "/down", NULL, "{\"refund_no\":\"D-1\",\"amount\":\"1.00\"}", 502);
    /* A token issued, spent, then refused on another key. */
    char th[128];
    sys_issue_token(gw.port, "carol", th, sizeof th);
    const char *h[] = {"X-Subject: carol", th, NULL};
    post(gw.port, "/payments", h, "{\"serial_no\":\"P-1\",\"amount\":\"1.00\"}", 201);
    post(gw.port, "/payments", h, "{\"serial_no\":\"P-2\",\"amount\":\"1.00\"}", 409);

    char *m = scrape_ok(gw.admin_port);
    char out[16384];
    int rc = promtool("metrics", NULL, m, out, sizeof out);
    if (rc != 0)
        fprintf(stderr, "promtool check metrics:\n%s\n", out);
    assert_int_equal(rc, 0);

#define REQ(route, outcome) "idem_requests_total{route=\"" route "\",outcome=\"" outcome "\"}"
    assert_int_equal(value(m, REQ("refund", "executed")), 1);
    assert_int_equal(value(m, REQ("refund", "replayed")), 3);
    assert_int_equal(value(m, REQ("refund", "mismatch")), 1);
    assert_int_equal(value(m, REQ("refund", "key_invalid")), 1);
    assert_int_equal(value(m, REQ("refund", "upstream_error")), 1);
    assert_int_equal(value(m, REQ("refund", "outcome_unknown")), 1);
    assert_int_equal(value(m, REQ("refund", "in_flight")), 0);
    assert_int_equal(value(m, REQ("down", "upstream_error")), 1);
    assert_int_equal(value(m, REQ("payment", "executed")), 1);
    assert_int_equal(value(m, REQ("payment", "token_refused")), 1);
    /* Every verdict has its series; each request one verdict. */
    assert_int_equal(value(m, REQ("refund", "held")), 0);
    assert_int_equal(sum_of(m, "idem_requests_total", "route=\"refund\""), 8);
    assert_int_equal(value(m, "idem_executions_total{route=\"refund\"}"), 3);
    assert_int_equal(value(m, REQ("refund", "replayed")), 3);

#define CODE(route, code) "idem_responses_total{route=\"" route "\",code=\"" code "\"}"
    assert_int_equal(value(m, CODE("refund", "201")), 4);
    assert_int_equal(value(m, CODE("refund", "422")), 1);
    assert_int_equal(value(m, CODE("refund", "400")), 1);
    assert_int_equal(value(m, CODE("refund", "503")), 1);
    char series[128];
    snprintf(series, sizeof series, "idem_responses_total{route=\"refund\",code=\"%d\"}",
             timeout_status);
    assert_int_equal(value(m, series), 1);
    assert_int_equal(sum_of(m, "idem_responses_total", "route=\"refund\""), 8);
    assert_int_equal(value(m, CODE("refund", "409")), -1); /* never answered: no series */
    assert_int_equal(value(m, CODE("payment", "409")), 1);

#define UPERR(route, kind) "idem_upstream_errors_total{route=\"" route "\",kind=\"" kind "\"}"
    assert_int_equal(value(m, UPERR("refund", "timeout")), 1);
    assert_int_equal(value(m, UPERR("refund", "not_sent")), 0);
    assert_int_equal(value(m, UPERR("refund", "unknown")), 0);
    assert_int_equal(value(m, UPERR("down", "not_sent")), 1);
    assert_int_equal(value(m, UPERR("down", "timeout")), 0);
    /* Three upstream calls on refund (the execution, the 503, the
     * timeout), at least the timeout's second among them. */
    assert_int_equal(value(m, "idem_upstream_duration_seconds_count{route=\"refund\"}"), 3);
    assert_true(value(m, "idem_upstream_duration_seconds_sum{route=\"refund\"}") >= 1.0);
    assert_int_equal(
        value(m, "idem_upstream_duration_seconds_bucket{route=\"refund\",le=\"+Inf\"}"), 3);
    assert_int_equal(value(m, "idem_request_duration_seconds_count{route=\"refund\"}"),
                     8);

    assert_int_equal(value(m, "idem_tokens_issued_total"), 1);
    assert_int_equal(value(m, "idem_tokens_consumed_total{route=\"payment\"}"), 1);
    assert_int_equal(value(m, "idem_tokens_consumed_total{route=\"refund\"}"), 0);
    /* The lock layer: each of the three keys that reached it took its lock. */
    assert_true(value(m, "idem_locks_acquired_total{route=\"refund\"}") >= 3);
    assert_int_equal(value(m, "idem_locks_busy_total{route=\"refund\"}"), 0);
    assert_int_equal(value(m, "idem_locks_acquired_total{route=\"payment\"}"), 0);

    /* The store's commits and their histogram agree. */
    assert_true(value(m, "idem_store_commits_total") >= 1);
    assert_int_equal(value(m, "idem_store_commit_duration_seconds_count"),
                     value(m, "idem_store_commits_total"));
    assert_int_equal(value(m, "idem_store_commit_batch_size_count"),
                     value(m, "idem_store_commits_total"));
    assert_int_equal(value(m, "idem_store_commit_batch_size_sum"),
                     value(m, "idem_store_committed_ops_total"));
    assert_int_equal(value(m, "idem_store_commit_batch_size_bucket{le=\"+Inf\"}"),
                     value(m, "idem_store_commits_total"));
    assert_int_equal(value(m, "idem_consumer_connected{consumer=\"refund-result\",source=\"amqp\"}"),
                     0);
    assert_int_equal(value(m, "idem_requests_in_flight"), 0);

    /* The process's own. */
    assert_true(value(m, "process_cpu_seconds_total") >= 0);
    assert_true(value(m, "process_resident_memory_bytes") > 1e5);
    assert_true(value(m, "process_virtual_memory_bytes") >=
                value(m, "process_resident_memory_bytes"));
    assert_true(value(m, "process_open_fds") >= 3);
    assert_true(value(m, "process_max_fds") >= value(m, "process_open_fds"));
    double start = value(m, "process_start_time_seconds"), now = (double)time(NULL);
    assert_true(start > now - 600 && start <= now + 2);
    free(m);

    /* A request being handled shows in the gauge while it is. */
    struct slow_post sp = {gw.port};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, slow_post_main, &sp), 0);
    double seen = 0;
    for (int i = 0; i < 100 && seen < 1; i++) {
        m = scrape_ok(gw.admin_port);
        seen = value(m, "idem_requests_in_flight");
        free(m);
        if (seen < 1)
            usleep(5000);
    }
    pthread_join(t, NULL);
    assert_int_equal(seen, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_metrics_behind_api_keys(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw);
    char *a = NULL, *b = NULL;
    /* /metrics and the older path, with a read key or the write key. */
    assert_int_equal(scrape(gw.admin_port, "/metrics", "Authorization: Bearer " READ_KEY, &a),
                     200);
    assert_int_equal(scrape(gw.admin_port, "/_idem/v1/metrics",
                            "Authorization: Bearer " SYS_ADMIN_KEY, &b),
                     200);
    assert_non_null(strstr(a, "\nidem_requests_total{route=\"refund\",outcome=\"executed\"} 0\n"));
    assert_non_null(strstr(b, "\nidem_requests_total{route=\"refund\",outcome=\"executed\"} 0\n"));
    free(a);
    free(b);
    /* No key, or a wrong one: 401; and never on the main listener. */
    assert_int_equal(scrape(gw.admin_port, "/metrics", NULL, NULL), 401);
    assert_int_equal(scrape(gw.admin_port, "/metrics", "Authorization: Bearer nope", NULL), 401);
    struct sys_resp r;
    sys_http(gw.port, "GET", "/_idem/v1/metrics", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 404);
    sys_resp_free(&r);
    /* A read key may not POST. */
    const char *h[] = {"Authorization: Bearer " READ_KEY, NULL};
    sys_http(gw.admin_port, "POST", "/metrics", h, "{}", 5000, &r);
    assert_int_equal(r.status, 403);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Every metric name (idem_..., process_...) in text is in the scrape m:
 * a line of it starts so, followed by '{' or ' '. */
static void names_in_scrape(const char *text, const char *m, const char *where)
{
    static const char *const prefixes[] = {"idem_", "process_"};
    for (const char *p = text; *p; p++) {
        for (size_t k = 0; k < 2; k++) {
            size_t pl = strlen(prefixes[k]);
            if (strncmp(p, prefixes[k], pl) != 0 ||
                (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '_')))
                continue;
            size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
            char name[128], a[140], b[140];
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            snprintf(a, sizeof a, "\n%s{", name);
            snprintf(b, sizeof b, "\n%s ", name);
            if (!strstr(m, a) && !strstr(m, b)) {
                fprintf(stderr, "%s: %s is in no scrape\n", where, name);
                fail();
            }
            p += n - 1;
            break;
        }
    }
}

/* The expressions of a dashboard's panels ("expr", at any depth),
 * appended to out. */
static void dashboard_exprs(json_t *j, char *out, size_t cap, int *count)
{
    const char *k;
    json_t *v;
    size_t i;
    if (json_is_object(j)) {
        json_object_foreach(j, k, v) {
            if (strcmp(k, "expr") == 0 && json_is_string(v)) {
                snprintf(out + strlen(out), cap - strlen(out), "%s\n", json_string_value(v));
                (*count)++;
            } else {
                dashboard_exprs(v, out, cap, count);
            }
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, v)
            dashboard_exprs(v, out, cap, count);
    }
}

static void test_deploy_rules_and_dashboard(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw);
    /* A request answered: the codes' series appear once one is. */
    post(gw.port, "/refunds", NULL, "{\"refund_no\":\"M-deploy\",\"amount\":\"1.00\"}", 201);
    char *m = scrape_ok(gw.admin_port);
    /* The held claims' gauge has its series once the first count is in. */
    for (int tries = 0; tries < 50 && !strstr(m, "\nidem_records_held{space=\"down\"} 0\n");
         tries++) {
        free(m);
        usleep(100 * 1000);
        m = scrape_ok(gw.admin_port);
    }
    assert_non_null(strstr(m, "\nidem_records_held{space=\"down\"} 0\n"));
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    char rules[4200], dash[4200], out[16384];
    snprintf(rules, sizeof rules, "%s/deploy/prometheus/idem-alerts.yml", IDEM_SOURCE_DIR);
    snprintf(dash, sizeof dash, "%s/deploy/grafana/idem-dashboard.json", IDEM_SOURCE_DIR);
    int rc = promtool("rules", rules, NULL, out, sizeof out);
    if (rc != 0)
        fprintf(stderr, "promtool check rules:\n%s\n", out);
    assert_int_equal(rc, 0);
    /* The rules' expressions name metrics the daemon has. */
    char *text = sys_read_file(rules), exprs[65536] = "";
    assert_non_null(text);
    int count = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "expr:")) {
            snprintf(exprs + strlen(exprs), sizeof exprs - strlen(exprs), "%s\n", line);
            count++;
        }
    assert_true(count >= 7);
    names_in_scrape(exprs, m, "idem-alerts.yml");
    free(text);
    /* Every alert has its runbook_url, and the runbook a section for it. */
    char runbook[4200];
    snprintf(runbook, sizeof runbook, "%s/docs/runbook.md", IDEM_SOURCE_DIR);
    char *book = sys_read_file(runbook), *rules_text = sys_read_file(rules);
    assert_non_null(book);
    assert_non_null(rules_text);
    int alerts = 0;
    for (const char *a = rules_text; (a = strstr(a, "- alert: ")) != NULL; a++, alerts++) {
        char name[64], section[80], url[96], lower[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(a + 9, "\n"), a + 9);
        for (size_t i = 0; i <= strlen(name); i++)
            lower[i] = (char)tolower((unsigned char)name[i]);
        snprintf(section, sizeof section, "\n## %s\n", name);
        snprintf(url, sizeof url, "/runbook.md#%s\"", lower);
        const char *next = strstr(a + 1, "- alert: ");
        const char *at = strstr(a, url);
        if (!strstr(book, section))
            fail_msg("docs/runbook.md has no section for %s", name);
        if (!at || (next && at > next))
            fail_msg("%s has no runbook_url to its section", name);
    }
    assert_true(alerts >= 18);
    free(book);
    free(rules_text);

    json_error_t err;
    json_t *j = json_load_file(dash, JSON_REJECT_DUPLICATES, &err);
    if (!j)
        fprintf(stderr, "%s:%d: %s\n", dash, err.line, err.text);
    assert_non_null(j);
    assert_true(json_is_array(json_object_get(j, "panels")));
    exprs[0] = '\0';
    count = 0;
    dashboard_exprs(j, exprs, sizeof exprs, &count);
    assert_true(count >= 8);
    names_in_scrape(exprs, m, "idem-dashboard.json");
    json_decref(j);
    free(m);
}

static int group_setup(void **state)
{
    (void)state;
    dir = test_mkdtemp();
    sys_start_service(&service, service_bin, dir, "refunds", NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sys_finish(&service, dir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s IDEM_BINARY REFUND_SERVICE_BINARY\n", argv[0]);
        return 2;
    }
    idem_bin = argv[1];
    service_bin = argv[2];
    setenv(SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, 1);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_match_what_happened),
        cmocka_unit_test(test_metrics_behind_api_keys),
        cmocka_unit_test(test_deploy_rules_and_dashboard),
    };
    return cmocka_run_group_tests_name("metrics", tests, group_setup, group_teardown);
}
