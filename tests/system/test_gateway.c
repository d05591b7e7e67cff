/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_gateway.c — idem serve in front of the real example refund service,
 * on loopback, in a temp dir:
 *
 *   test_gateway IDEM_BINARY REFUND_SERVICE_BINARY
 *
 * Each test starts the idem instance its configuration needs; the refund
 * service (with its own UNIQUE constraint and an execution counter) runs for
 * the whole group. Executions are read from the service's /stats before and
 * after, so tests do not depend on each other.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <signal.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

static const char *idem_bin, *service_bin;
static char *dir;
static struct proc service;
static int config_seq;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Write idem serve's config file: this YAML (routes and limits), with
 * "@UP@" in it the refund service's address. */
/* The log at path once it holds what (up to 10 s), or NULL; free it. */
static char *await_log(const char *path, const char *what)
{
    for (int i = 0; i < 200; i++) {
        char *log = sys_read_file(path);
        if (log && strstr(log, what))
            return log;
        free(log);
        sleep_ms(50);
    }
    return NULL;
}

/* How many times needle is in text. */
static int count_of(const char *text, const char *needle)
{
    int k = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++)
        k++;
    return k;
}

/* Wait until the daemon logging to path has reloaded n times in all. */
static void await_reloads(const char *path, int n)
{
    int seen = 0;
    for (int i = 0; i < 200 && seen < n; i++) {
        char *log = sys_read_file(path);
        seen = log ? count_of(log, "SIGHUP: reloaded") : 0;
        free(log);
        if (seen < n)
            sleep_ms(50);
    }
    assert_int_equal(seen, n);
}

static void write_config(const char *path, const char *yaml_routes)
{
    char text[16384], up[64];
    snprintf(up, sizeof up, "http://127.0.0.1:%d", service.port);
    const char *s = yaml_routes;
    char *o = text;
    o += sprintf(o, "subject_header: X-Subject\nupstream: %s\n", up);
    /* The JSON API on a loopback port of its own, with the tests' key. */
    if (!strstr(yaml_routes, "admin_listen"))
        o += sprintf(o, "%s", SYS_ADMIN_YAML);
    else if (!strstr(yaml_routes, "api_keys"))
        o += sprintf(o, "api_keys:\n  - { name: test, scope: write, env: %s }\n",
                     SYS_ADMIN_KEY_ENV);
    while (*s) {
        if (strncmp(s, "@UP@", 4) == 0) {
            o += sprintf(o, "%s", up);
            s += 4;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    sys_write_file(path, text);
}

/* Start idem serve with this YAML (see write_config); its file is
 * dir/idem-N.yaml, N the config_seq it leaves. */
static void start_idem(struct proc *p, const char *yaml_routes, const char *db_name)
{
    char path[4200], db[4200], log[4200];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, ++config_seq);
    snprintf(db, sizeof db, "%s/%s", dir, db_name);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, config_seq);
    write_config(path, yaml_routes);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", "127.0.0.1:0", NULL};
    sys_start(p, argv, log);
}

/* The refund route's first lines, which most configurations here share. */
#define REFUND_ROUTE                                                             \
    "  - name: refund\n"                                                         \
    "    match: { method: POST, path: /refunds }\n"                              \
    "    upstream: @UP@\n"                                                       \
    "    key: { json: refund_no }\n"

static const char wait_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    space: refund\n"
    "    layers: [lock, record]\n"
    "    in_flight: wait\n"
    "    wait_timeout: 10s\n"
    "    lease: 10s\n"
    "    upstream_timeout: 2s\n"
    "    replay_headers: [content-type, location]\n"
    "  - name: payment-callback\n"
    "    match: { method: POST, path: /callbacks/payment }\n"
    "    upstream: @UP@\n"
    "    key: { json: serial_no }\n"
    "    space: payment\n"
    "    fingerprint: [serial_no, amount]\n"
    "  - name: payment-repush\n"
    "    match: { method: POST, path: /admin/payments/repush }\n"
    "    upstream: @UP@\n"
    "    key: { json: serial_no }\n"
    "    space: payment\n"
    "    fingerprint: [serial_no, amount]\n";

static const char reject_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    in_flight: reject\n"
    "    lease: 10s\n"
    "    upstream_timeout: 1s\n";

static const char token_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    scope: subject\n"
    "    layers: [token, lock, record]\n"
    "    in_flight: wait\n"
    "    wait_timeout: 5s\n";

enum { ANY = -1 };

/* POST body to /refunds on port and check the answer's status and whether
 * it is a replay: replayed 1, Idempotent-Replayed: true; 0, no such header;
 * ANY, not checked. */
static void post_expect(int port, const char *body, int status, int replayed)
{
    struct sys_resp r;
    sys_http(port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, status);
    if (replayed == 1)
        assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    else if (replayed == 0)
        assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&r);
}

/* ---- concurrency ---- */

struct storm {
    int port;
    const char *body, *body2;
    const char *const *headers;
    struct sys_resp resp[100];
};

static void one_post(void *arg, int i)
{
    struct storm *s = arg;
    sys_http(s->port, "POST", "/refunds", s->headers, s->body, 20000, &s->resp[i]);
}

/* As one_post, the odd ones with body2 in place of body. */
static void one_post_mixed(void *arg, int i)
{
    struct storm *s = arg;
    sys_http(s->port, "POST", "/refunds", s->headers, i % 2 ? s->body2 : s->body, 20000,
             &s->resp[i]);
}

static void test_storm_wait_one_execution(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, wait_routes, "wait.db");
    long before = sys_stat(service.port, "executions");
    static const char *const hdrs[] = {"X-Delay-Ms: 200", NULL};
    struct storm *s = calloc(1, sizeof *s);
    s->port = gw.port;
    s->headers = hdrs;
    s->body = "{\"refund_no\":\"R-storm-wait\",\"amount\":\"10.00\"}";
    test_run_threads(100, one_post, s);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* Every client got the first answer, byte for byte. */
    assert_int_equal(s->resp[0].status, 201);
    int replayed = 0;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(s->resp[i].status, 201);
        assert_int_equal(s->resp[i].m->body_len, s->resp[0].m->body_len);
        assert_memory_equal(s->resp[i].m->body, s->resp[0].m->body, s->resp[0].m->body_len);
        const char *rp = sys_header(&s->resp[i], "Idempotent-Replayed");
        replayed += rp && strcmp(rp, "true") == 0;
    }
    assert_int_equal(replayed, 99);
    for (int i = 0; i < 100; i++)
        sys_resp_free(&s->resp[i]);
    free(s);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_storm_reject(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "reject.db");
    long before = sys_stat(service.port, "executions");
    static const char *const hdrs[] = {"X-Delay-Ms: 200", NULL};
    struct storm *s = calloc(1, sizeof *s);
    s->port = gw.port;
    s->headers = hdrs;
    s->body = "{\"refund_no\":\"R-storm-reject\",\"amount\":\"10.00\"}";
    test_run_threads(100, one_post, s);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    int created = 0, conflict = 0, replayed = 0;
    for (int i = 0; i < 100; i++) {
        if (s->resp[i].status == 201) {
            const char *rp = sys_header(&s->resp[i], "Idempotent-Replayed");
            if (rp)
                replayed++;
            else
                created++;
        } else {
            assert_int_equal(s->resp[i].status, 409);
            assert_string_equal(sys_header(&s->resp[i], "Content-Type"), "application/problem+json");
            assert_string_equal(sys_header(&s->resp[i], "Retry-After"), "1"); /* alive */
            assert_non_null(strstr(s->resp[i].m->body, "urn:idem:request_in_flight"));
            conflict++;
        }
        sys_resp_free(&s->resp[i]);
    }
    assert_int_equal(created, 1);
    assert_int_equal(created + conflict + replayed, 100);
    assert_true(conflict >= 1);
    free(s);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- sequential semantics ---- */

/* r replays first: its status and body byte for byte, marked as a replay. */
static void expect_replay_of(const struct sys_resp *first, const struct sys_resp *r)
{
    assert_int_equal(r->status, first->status);
    assert_string_equal(sys_header(r, "Idempotent-Replayed"), "true");
    assert_int_equal(r->m->body_len, first->m->body_len);
    assert_memory_equal(r->m->body, first->m->body, first->m->body_len);
}

static void test_replay_mismatch_missing_key(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp a, b, c, d;
    start_idem(&gw, reject_routes, "seq.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-seq\",\"amount\":\"5.00\"}";
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &a);
    assert_int_equal(a.status, 201);
    assert_null(sys_header(&a, "Idempotent-Replayed"));
    assert_non_null(sys_header(&a, "Location"));
    for (int i = 0; i < 3; i++) {
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &b);
        expect_replay_of(&a, &b);
        sys_resp_free(&b);
    }
    /* The same key with another payload: refused, never executed. */
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-seq\",\"amount\":\"999.00\"}",
             5000, &c);
    assert_int_equal(c.status, 422);
    assert_non_null(strstr(c.m->body, "urn:idem:key_reused"));
    /* No key: 400 naming what was expected. */
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"amount\":\"1.00\"}", 5000, &d);
    assert_int_equal(d.status, 400);
    assert_non_null(strstr(d.m->body, "refund_no"));
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* A request no route matches is proxied untouched. */
    struct sys_resp e;
    sys_http(gw.port, "GET", "/refunds/R-seq", NULL, NULL, 5000, &e);
    assert_int_equal(e.status, 200);
    assert_non_null(strstr(e.m->body, "R-seq"));
    assert_null(sys_header(&e, "Idempotent-Replayed"));
    sys_resp_free(&e);
    /* The same counts, in Prometheus's format. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/metrics", NULL, 5000, &e);
    assert_int_equal(e.status, 200);
    assert_string_equal(sys_header(&e, "Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    static const char *const counts[] = {
        "\nidem_executions_total{route=\"refund\"} 1\n",
        "\nidem_requests_total{route=\"refund\",outcome=\"replayed\"} 3\n",
        "\nidem_requests_total{route=\"refund\",outcome=\"mismatch\"} 1\n",
        "\nidem_requests_total{route=\"refund\",outcome=\"store_unavailable\"} 0\n",
        "\nidem_passthrough_total 1\n", "\nidem_record_conflicts_total 0\n",
        "# TYPE idem_requests_total counter\n", "idem_build_info{version=\"",
        "\nidem_request_duration_seconds_count{route=\"refund\"} 6\n",
        "\nidem_request_duration_seconds_bucket{route=\"refund\",le=\"+Inf\"} 6\n"};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
        if (!strstr(e.m->body, counts[i]))
            fail_msg("no %s in:\n%s", counts[i], e.m->body);
    sys_resp_free(&e);
    sys_resp_free(&a);
    sys_resp_free(&c);
    sys_resp_free(&d);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A request whose key or subject could be read two ways is refused: an
 * upstream that took the other value would execute under a key Idem never
 * claimed. And the query string is part of the body fingerprint. */
static const char ambiguous_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    scope: subject\n"
    "  - name: by-header\n"
    "    match: { method: POST, path: /callbacks/payment }\n"
    "    upstream: @UP@\n"
    "    key: { header: Idempotency-Key }\n"
    "  - name: by-query\n"
    "    match: { method: POST, path: /admin/payments/repush }\n"
    "    upstream: @UP@\n"
    "    key: { query: id }\n"
    "  - name: by-form\n"
    "    match: { method: POST, path: /payments }\n"
    "    upstream: @UP@\n"
    "    key: { form: out_trade_no }\n";

static void expect_refused(int port, const char *target, const char *const *headers,
                           const char *body, const char *type)
{
    struct sys_resp r;
    sys_http(port, "POST", target, headers, body, 5000, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.m->body, type));
    sys_resp_free(&r);
}

static void test_ambiguous_requests_refused(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, ambiguous_routes, "ambiguous.db");
    long refunds = sys_stat(service.port, "executions");
    long payments = sys_stat(service.port, "payment_executions");
    static const char *const alice[] = {"X-Subject: alice", NULL};
    static const char *const two_subjects[] = {"X-Subject: alice", "X-Subject: bob", NULL};
    static const char *const two_keys[] = {"Idempotency-Key: K-1", "Idempotency-Key: K-2", NULL};
    static const char *const alike_subjects[] = {"X-Subject: alice", "X_Subject: bob", NULL};
    static const char *const alike_keys[] = {"Idempotency-Key: K-4", "Idempotency_Key: K-5",
                                             NULL};
    const char *payment = "{\"serial_no\":\"CH-amb\",\"amount\":\"1.00\"}";
    expect_refused(gw.port, "/refunds", alice,
                   "{\"refund_no\":\"R-a1\",\"refund_no\":\"R-a2\",\"amount\":\"1.00\"}",
                   "key_invalid");
    /* The key's name in another case: an upstream reading names whatever
     * their case (ASP.NET Core's web defaults) may take that value. */
    expect_refused(gw.port, "/refunds", alice,
                   "{\"refund_no\":\"R-c1\",\"Refund_No\":\"R-c2\",\"amount\":\"1.00\"}",
                   "Refund_No");
    expect_refused(gw.port, "/refunds", two_subjects,
                   "{\"refund_no\":\"R-a3\",\"amount\":\"1.00\"}", "subject_invalid");
    /* JSON with a number past what Idem reads: not "not JSON", nor forwarded. */
    expect_refused(gw.port, "/refunds", alice,
                   "{\"refund_no\":\"R-big\",\"amount\":12345678901234567890}", "Idem cannot "
                   "read exactly");
    expect_refused(gw.port, "/callbacks/payment", two_keys, payment, "key_invalid");
    /* Spelt with '_', the same header to a CGI-style upstream. */
    expect_refused(gw.port, "/refunds", alike_subjects,
                   "{\"refund_no\":\"R-a4\",\"amount\":\"1.00\"}", "subject_invalid");
    expect_refused(gw.port, "/callbacks/payment", alike_keys, payment, "key_invalid");
    /* A %00 would end the value early: Q-1%00A read as Q-1. */
    expect_refused(gw.port, "/admin/payments/repush?id=Q-1%00A", NULL, payment, "key_invalid");
    expect_refused(gw.port, "/admin/payments/repush?id=Q-1&id=Q-2", NULL, payment,
                   "key_invalid");
    /* A form body's field: the same rules as a query's. */
    expect_refused(gw.port, "/payments", NULL, "out_trade_no=F-1&out_trade_no=F-2",
                   "given more than once");
    expect_refused(gw.port, "/payments", NULL, "out_trade_no=F-1%00A", "key_invalid");
    expect_refused(gw.port, "/payments", NULL, "out_trade_no=F-1%zz", "key_invalid");
    expect_refused(gw.port, "/payments", NULL, "trade_no=F-1", "key_missing");
    /* Paths an upstream may read as a route's own: refused, never passed
     * through unclaimed (to the default upstream, here the service). */
    static const char *const variants[] = {
        "/./callbacks/payment", "/x/../callbacks/payment", "/x/%2e%2e/callbacks/payment",
        "//callbacks/payment",  "/Callbacks/Payment",      "/callbacks/payment/",
        "/callbacks/%70ayment", "/callbacks%2Fpayment", "/%2Fcallbacks/payment",
        "/x/..%2Fcallbacks/payment", "/.%2Fcallbacks/payment",
        /* Path parameters, which servlet containers drop. */
        "/callbacks/payment;a=1", "/callbacks;x/payment", "/callbacks/payment;",
        "/callbacks/p%61yment;x", "/callbacks;x%2Fpayment",
    };
    static const char *const key[] = {"Idempotency-Key: K-var", NULL};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        struct sys_resp v;
        sys_http(gw.port, "POST", variants[i], key, payment, 5000, &v);
        if (v.status != 400 || !strstr(v.m->body, "path_not_canonical"))
            fail_msg("%s -> %d", variants[i], v.status);
        sys_resp_free(&v);
    }
    assert_int_equal(sys_stat(service.port, "executions"), refunds);
    assert_int_equal(sys_stat(service.port, "payment_executions"), payments);
    /* The JSON API refuses them too. */
    struct sys_resp r;
    sys_http(gw.port, "POST", "/_idem/v1/tokens", two_subjects, "{\"scene\":\"refund\"}", 5000,
             &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.m->body, "subject_invalid"));
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/_idem/v1/tokens", alice,
             "{\"scene\":\"refund\",\"scene\":\"other\"}", 5000, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.m->body, "invalid_json"));
    sys_resp_free(&r);
    /* One key, one value each: executed once, then replayed; another query
     * string under the same key is another request: 422. */
    sys_http(gw.port, "POST", "/admin/payments/repush?id=Q-3&amount=1", NULL, payment, 5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/admin/payments/repush?id=Q-3&amount=1", NULL, payment, 5000, &r);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/admin/payments/repush?id=Q-3&amount=1000", NULL, payment, 5000,
             &r);
    assert_int_equal(r.status, 422);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "payment_executions") - payments, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A '*' segment in a route's path: a refund filed under its order. The
 * route takes /orders/<any one segment>/refunds and nothing else; other
 * spellings of it are refused, as for a plain path, never passed through
 * unclaimed. */
static const char order_routes[] =
    "routes:\n"
    "  - name: order-refund\n"
    "    match: { method: POST, path: /orders/*/refunds }\n"
    "    upstream: @UP@\n"
    "    key: [{ path_segment: 2 }, { json: refund_no }]\n";

static void test_segment_wildcard_route(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp a, b;
    start_idem(&gw, order_routes, "orders.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-ord-1\",\"amount\":\"3.00\"}";
    sys_http(gw.port, "POST", "/orders/O-1/refunds", NULL, body, 5000, &a);
    assert_int_equal(a.status, 201);
    assert_null(sys_header(&a, "Idempotent-Replayed"));
    sys_http(gw.port, "POST", "/orders/O-1/refunds", NULL, body, 5000, &b);
    expect_replay_of(&a, &b);
    sys_resp_free(&b);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* Another order is another key: it executes, and the service's own
     * UNIQUE refund_no answers it. */
    sys_http(gw.port, "POST", "/orders/O-2/refunds", NULL, body, 5000, &b);
    assert_int_equal(b.status, 409);
    assert_null(sys_header(&b, "Idempotent-Replayed"));
    sys_resp_free(&b);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    /* Paths the route does not take go through untouched: the service
     * answers them itself (404), and nothing is claimed. */
    static const char *const other[] = {"/orders/O-1/refunds/x", "/orders/O-1/cancel",
                                        "/orders/refunds", "/orders/a/b/refunds"};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        sys_http(gw.port, "POST", other[i], NULL, body, 5000, &b);
        if (b.status != 404 || sys_header(&b, "Idempotent-Replayed"))
            fail_msg("%s -> %d", other[i], b.status);
        sys_resp_free(&b);
    }
    /* Another spelling of the route's path, an escaped '/' among them (an
     * upstream behind nginx would read /orders/O-1%2Frefunds as the route's
     * own path): refused. */
    static const char *const spelt[] = {
        "/Orders/O-1/Refunds",     "/orders/O-1/refunds/",     "/orders/O-1%2Frefunds",
        "/orders/O-1/r%65funds",   "/%2Forders/O-1/refunds",   "/orders/O-1/..%2Frefunds",
        "/orders%2F%2FO-1/refunds", "/orders/x%2F..%2FO-1/refunds",
        /* Path parameters: a servlet container reads order O-1 in each,
         * which would be other keys here. */
        "/orders/O-1;a/refunds", "/orders/O-1;/refunds", "/orders/O-1/refunds;b",
        "/orders;c/O-1/refunds"};
    for (size_t i = 0; i < sizeof spelt / sizeof spelt[0]; i++) {
        sys_http(gw.port, "POST", spelt[i], NULL, body, 5000, &b);
        if (b.status != 400 || !strstr(b.m->body, "path_not_canonical"))
            fail_msg("%s -> %d", spelt[i], b.status);
        sys_resp_free(&b);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    sys_resp_free(&a);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_shared_space_two_routes(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp a, b, c;
    start_idem(&gw, wait_routes, "shared.db");
    long before = sys_stat(service.port, "payment_executions");
    sys_http(gw.port, "POST", "/callbacks/payment", NULL,
             "{\"serial_no\":\"CH-778\",\"amount\":\"42.00\",\"channel\":\"alipay\"}", 5000, &a);
    assert_int_equal(a.status / 100, 2);
    /* The operator re-pushes the same payment through another route. */
    sys_http(gw.port, "POST", "/admin/payments/repush", NULL,
             "{\"serial_no\":\"CH-778\",\"amount\":\"42.00\",\"operator\":\"zhang\"}", 5000, &b);
    assert_int_equal(b.status, a.status);
    assert_string_equal(sys_header(&b, "Idempotent-Replayed"), "true");
    /* And the channel calls back again. */
    sys_http(gw.port, "POST", "/callbacks/payment", NULL,
             "{\"serial_no\":\"CH-778\",\"amount\":\"42.00\",\"channel\":\"alipay\"}", 5000, &c);
    assert_string_equal(sys_header(&c, "Idempotent-Replayed"), "true");
    assert_int_equal(sys_stat(service.port, "payment_executions") - before, 1);
    sys_resp_free(&a);
    sys_resp_free(&b);
    sys_resp_free(&c);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_subject_scope(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, token_routes, "subject.db");
    long before = sys_stat(service.port, "executions");
    struct sys_resp tok, r1, r2, r1b, r2b;
    const char *body = "{\"refund_no\":\"R-subj\",\"amount\":\"7.00\"}";
    char t1[128], t2[128];
    /* Each subject gets its own token. */
    static const char *const alice[] = {"X-Subject: alice", NULL};
    static const char *const bob[] = {"X-Subject: bob", NULL};
    sys_http(gw.port, "POST", "/_idem/v1/tokens", alice, "{\"scene\":\"refund\"}", 5000, &tok);
    assert_int_equal(tok.status, 201);
    snprintf(t1, sizeof t1, "Idem-Token: %.32s", strstr(tok.m->body, "\"token\":\"") + 9);
    sys_resp_free(&tok);
    sys_http(gw.port, "POST", "/_idem/v1/tokens", bob, "{\"scene\":\"refund\"}", 5000, &tok);
    snprintf(t2, sizeof t2, "Idem-Token: %.32s", strstr(tok.m->body, "\"token\":\"") + 9);
    sys_resp_free(&tok);
    const char *h1[] = {"X-Subject: alice", t1, NULL}, *h2[] = {"X-Subject: bob", t2, NULL};
    sys_http(gw.port, "POST", "/refunds", h1, body, 5000, &r1);
    sys_http(gw.port, "POST", "/refunds", h2, body, 5000, &r2);
    /* Two subjects, one key: two executions. */
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(r1.status, 201);
    /* The service's own constraint refused bob's duplicate refund_no: that is
     * bob's answer, and only bob's. */
    assert_int_equal(r2.status, 409);
    sys_http(gw.port, "POST", "/refunds", h1, body, 5000, &r1b);
    sys_http(gw.port, "POST", "/refunds", h2, body, 5000, &r2b);
    assert_int_equal(r1b.status, 201);
    assert_memory_equal(r1b.m->body, r1.m->body, r1.m->body_len);
    assert_int_equal(r2b.status, 409);
    assert_memory_equal(r2b.m->body, r2.m->body, r2.m->body_len);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    sys_resp_free(&r1);
    sys_resp_free(&r2);
    sys_resp_free(&r1b);
    sys_resp_free(&r2b);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A refund of refund_no for subject, its amount telling pair i's twin j
 * apart (the service's own answers differ with it). */
static void post_as(int port, const char *subject, const char *refund_no, size_t i, int j,
                    struct sys_resp *r)
{
    char sh[128], body[128];
    snprintf(sh, sizeof sh, "X-Subject: %s", subject);
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\",\"amount\":\"%zu.%d0\"}", refund_no,
             i + 1, j);
    const char *h[] = {sh, NULL};
    sys_http(port, "POST", "/refunds", h, body, 5000, r);
}

/* No two subjects' keys meet in one record, however either is spelt: a
 * '/' or an escape in the subject against the same bytes split otherwise
 * between subject and key, letter case, the two Unicode spellings of one
 * letter (NFC and NFD, which Idem keeps apart as the bytes they are). Each
 * of the fourteen requests executes once, and each one's replay is its
 * own answer, never its twin's. */
static void test_subjects_never_meet(void **state)
{
    (void)state;
    static const char routes[] = "routes:\n" REFUND_ROUTE "    scope: subject\n";
    struct proc gw;
    start_idem(&gw, routes, "subjects-meet.db");
    static const char *const pairs[][2][2] = {
        {{"alice/x", "y"}, {"alice", "x/y"}},
        {{"a%2Fb", "k1"}, {"a/b", "k1"}},
        {{"a%252Fb", "k2"}, {"a%2Fb", "k2"}},
        {{"Carol", "k3"}, {"carol", "k3"}},
        {{"Jos\xc3\xa9", "k4"}, {"Jose\xcc\x81", "k4"}},
        {{"dave", "K5"}, {"dave", "k5"}},
        {{"erin", "caf\xc3\xa9"}, {"erin", "cafe\xcc\x81"}},
    };
    const size_t n = sizeof pairs / sizeof pairs[0];
    long before = sys_stat(service.port, "executions");
    struct sys_resp first[7][2];
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < 2; j++) {
            post_as(gw.port, pairs[i][j][0], pairs[i][j][1], i, j, &first[i][j]);
            if (first[i][j].status != 201 && first[i][j].status != 409)
                fail_msg("pair %zu/%d: %d %s", i, j, first[i][j].status,
                         first[i][j].m ? first[i][j].m->body : "");
            if (sys_header(&first[i][j], "Idempotent-Replayed"))
                fail_msg("pair %zu/%d: replayed its twin's answer", i, j);
        }
    assert_int_equal(sys_stat(service.port, "executions") - before, (long)(2 * n));
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < 2; j++) {
            struct sys_resp again;
            post_as(gw.port, pairs[i][j][0], pairs[i][j][1], i, j, &again);
            assert_int_equal(again.status, first[i][j].status);
            assert_string_equal(sys_header(&again, "Idempotent-Replayed"), "true");
            assert_int_equal(again.m->body_len, first[i][j].m->body_len);
            assert_memory_equal(again.m->body, first[i][j].m->body, again.m->body_len);
            sys_resp_free(&again);
            sys_resp_free(&first[i][j]);
        }
    assert_int_equal(sys_stat(service.port, "executions") - before, (long)(2 * n));
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_token_flow(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, token_routes, "token.db");
    long before = sys_stat(service.port, "executions");
    struct sys_resp r;
    char th[128];
    sys_issue_token(gw.port, "carol", th, sizeof th);
    const char *h[] = {"X-Subject: carol", th, "X-Delay-Ms: 200", NULL};
    /* A double submit with one token: one execution. */
    struct storm *s = calloc(1, sizeof *s);
    s->port = gw.port;
    s->headers = h;
    s->body = "{\"refund_no\":\"R-token\",\"amount\":\"3.00\"}";
    test_run_threads(2, one_post, s);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(s->resp[i].status, 201);
        sys_resp_free(&s->resp[i]);
    }
    free(s);
    /* A late retry with the spent token and the same key: the first answer. */
    sys_http(gw.port, "POST", "/refunds", h, "{\"refund_no\":\"R-token\",\"amount\":\"3.00\"}", 5000,
             &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    sys_resp_free(&r);
    /* The spent token on another key: refused, "refresh and retry". */
    sys_http(gw.port, "POST", "/refunds", h, "{\"refund_no\":\"R-token-2\",\"amount\":\"3.00\"}",
             5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "urn:idem:token_spent"));
    sys_resp_free(&r);
    /* No token at all. */
    static const char *const none[] = {"X-Subject: carol", NULL};
    sys_http(gw.port, "POST", "/refunds", none, "{\"refund_no\":\"R-token-3\",\"amount\":\"3.00\"}",
             5000, &r);
    assert_int_equal(r.status, 428);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- failures ---- */

static void test_upstream_5xx_release(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp r;
    start_idem(&gw, reject_routes, "5xx.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-5xx\",\"amount\":\"1.00\"}";
    static const char *const fail[] = {"X-Fail: 503", NULL};
    sys_http(gw.port, "POST", "/refunds", fail, body, 5000, &r);
    assert_int_equal(r.status, 503);
    sys_resp_free(&r);
    /* Released: the retry executes, and succeeds. */
    post_expect(gw.port, body, 201, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stat(service.port, "refunds") >= 1, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* store_statuses: [2xx, 409]: the service's 400 for a bad amount is passed
 * on and not kept, so the corrected request under the same key executes
 * (and is kept: the bad one is then the other payload). By default the
 * 400 is kept, and the corrected one is refused as another payload, while
 * a 408, 425 or 429 is released for the retry. */
static void test_store_statuses_release_rejected(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp r;
    static const char routes[] =
        "routes:\n"
        REFUND_ROUTE
        "    store_statuses: [2xx, 409]\n";
    const char *bad = "{\"refund_no\":\"R-kept\",\"amount\":\"1,00\"}";
    const char *good = "{\"refund_no\":\"R-kept\",\"amount\":\"1.00\"}";
    start_idem(&gw, routes, "statuses.db");
    long before = sys_stat(service.port, "executions");
    for (int i = 0; i < 2; i++) { /* not kept: each one reaches the service */
        sys_http(gw.port, "POST", "/refunds", NULL, bad, 5000, &r);
        assert_int_equal(r.status, 400);
        assert_null(sys_header(&r, "Idempotent-Replayed"));
        assert_non_null(strstr(r.m->body, "amount must be"));
        sys_resp_free(&r);
    }
    post_expect(gw.port, good, 201, 0);
    post_expect(gw.port, good, 201, 1);
    post_expect(gw.port, bad, 422, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* The default keeps every answer under 500, the 400 included... */
    start_idem(&gw, "routes:\n" REFUND_ROUTE, "statuses-default.db");
    const char *bad2 = "{\"refund_no\":\"R-kept-2\",\"amount\":\"1,00\"}";
    const char *good2 = "{\"refund_no\":\"R-kept-2\",\"amount\":\"1.00\"}";
    post_expect(gw.port, bad2, 400, 0);
    post_expect(gw.port, bad2, 400, 1);
    post_expect(gw.port, good2, 422, 0);
    /* ...but those that ask for a retry: each is passed on and released,
     * and the retry of the same request executes and is kept. */
    static const char *const busy[][2] = {{"X-Fail: 429", NULL}, {"X-Fail: 408", NULL},
                                          {"X-Fail: 425", NULL}};
    const char *busy_body = "{\"refund_no\":\"R-busy\",\"amount\":\"1.00\"}";
    before = sys_stat(service.port, "executions");
    for (size_t i = 0; i < sizeof busy / sizeof busy[0]; i++) {
        sys_http(gw.port, "POST", "/refunds", busy[i], busy_body, 5000, &r);
        assert_int_equal(r.status, atoi(busy[i][0] + 8));
        assert_null(sys_header(&r, "Idempotent-Replayed"));
        assert_null(sys_header(&r, "Idempotency-Key-Expires"));
        sys_resp_free(&r);
    }
    post_expect(gw.port, busy_body, 201, 0);
    post_expect(gw.port, busy_body, 201, 1);
    assert_int_equal(sys_stat(service.port, "executions") - before, 4);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* An Idempotency-Key-Expires value as seconds since the epoch; -1 if it
 * is not an IMF-fixdate. */
static long long http_date_secs(const char *v)
{
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    const char *end = v ? strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm) : NULL;
    return end && !*end && strlen(v) == 29 ? (long long)timegm(&tm) : -1;
}

/* The wall clock's second, as the store reads it (CLOCK_REALTIME, not
 * time(), whose coarse clock may still be in the second before). */
static long long wall_secs(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec;
}

/* Executed and replayed answers say until when the key is kept: the
 * record's expiry, the same from the store as from the replay cache, and
 * after a restart; answers not kept say nothing. */
static void test_retention_header(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp r;
    static const char routes[] =
        "routes:\n"
        REFUND_ROUTE
        "    retention: 2h\n"
        "    store_statuses: [2xx]\n";
    const char *body = "{\"refund_no\":\"R-expires\",\"amount\":\"1.00\"}";
    start_idem(&gw, routes, "expires.db");
    long long t0 = wall_secs();
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    long long t1 = wall_secs();
    assert_int_equal(r.status, 201);
    char first[64];
    snprintf(first, sizeof first, "%s", sys_header(&r, "Idempotency-Key-Expires"));
    sys_resp_free(&r);
    long long at = http_date_secs(first);
    assert_true(at >= t0 + 7200 - 1 && at <= t1 + 7200);
    for (int i = 0; i < 2; i++) { /* the cache's answer, then its wire form */
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
        assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        assert_string_equal(sys_header(&r, "Idempotency-Key-Expires"), first);
        sys_resp_free(&r);
    }
    /* Not kept (a 400 outside store_statuses): nothing to promise. */
    sys_http(gw.port, "POST", "/refunds", NULL,
             "{\"refund_no\":\"R-expires-2\",\"amount\":\"x\"}", 5000, &r);
    assert_int_equal(r.status, 400);
    assert_null(sys_header(&r, "Idempotency-Key-Expires"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* From the store, after a restart: the record's own expiry, which the
     * store took a moment after the gateway read the clock (the same
     * second, or the next). */
    start_idem(&gw, routes, "expires.db");
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    long long stored = http_date_secs(sys_header(&r, "Idempotency-Key-Expires"));
    assert_true(stored == at || stored == at + 1);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_upstream_unreachable(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp r;
    char routes[1024];
    int dead = sys_free_port();
    snprintf(routes, sizeof routes,
             "routes:\n"
             "  - name: refund\n"
             "    match: { method: POST, path: /refunds }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { json: refund_no }\n",
             dead);
    start_idem(&gw, routes, "unreachable.db");
    const char *body = "{\"refund_no\":\"R-down\",\"amount\":\"1.00\"}";
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 502);
    assert_non_null(strstr(r.m->body, "urn:idem:upstream_unreachable"));
    sys_resp_free(&r);
    /* Released, not stuck: the retry is tried again (and fails again). */
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 502);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

struct bg_post {
    int port;
    const char *path; /* NULL: /refunds */
    const char *body;
    const char *const *headers;
    struct sys_resp resp;
    pthread_t t;
};

static void *bg_post_main(void *arg)
{
    struct bg_post *b = arg;
    sys_http(b->port, "POST", b->path ? b->path : "/refunds", b->headers, b->body, 15000,
             &b->resp);
    return NULL;
}

/* On a global route the token layer still takes the subject: one it cannot
 * hold is a bad subject (400), not a bad token (409 "refresh and retry"). */
static void test_token_subject_checked(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, "routes:\n" REFUND_ROUTE "    layers: [token, record]\n", "tokensubj.db");
    long before = sys_stat(service.port, "executions");
    char th[128], long_subject[320];
    sys_issue_token(gw.port, "frank", th, sizeof th);
    memset(long_subject, 0, sizeof long_subject);
    memcpy(long_subject, "X-Subject: ", 11);
    memset(long_subject + 11, 'f', 300);
    const char *h[] = {long_subject, th, NULL};
    expect_refused(gw.port, "/refunds", h, "{\"refund_no\":\"R-subj\",\"amount\":\"1.00\"}",
                   "the subject header: longer than 255 bytes");
    const char *tab[] = {"X-Subject: fr\tank", th, NULL};
    expect_refused(gw.port, "/refunds", tab, "{\"refund_no\":\"R-subj\",\"amount\":\"1.00\"}",
                   "subject_invalid");
    const char *latin1[] = {"X-Subject: caf\xe9", th, NULL};
    expect_refused(gw.port, "/refunds", latin1, "{\"refund_no\":\"R-subj\",\"amount\":\"1.00\"}",
                   "is not valid UTF-8");
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static int64_t mono_us_test(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* One client sending the same request over and over until until_ms. */
struct resubmits {
    int port;
    const char *const *headers;
    const char *body;
    int64_t until_ms;
    int first_hand; /* 201s that were not replays: executions paid for */
    pthread_t t;
};

static void *resubmits_main(void *arg)
{
    struct resubmits *e = arg;
    while (test_mono_ms() < e->until_ms) {
        struct sys_resp r;
        sys_http(e->port, "POST", "/refunds", e->headers, e->body, 10000, &r);
        e->first_hand += r.status == 201 && !sys_header(&r, "Idempotent-Replayed");
        sys_resp_free(&r);
    }
    return NULL;
}

/* One token pays for at most one key, whoever spends it and whatever
 * refuses whom. Here the first request fails (5xx) and gives its token
 * back while a retry waits to execute on it, and meanwhile the same form,
 * edited (another amount, so 422 once the retry's answer is stored), and
 * another form with the same token (another key) are submitted again and
 * again. Before, a resubmit that spent the token in the moment it was back
 * gave it back with its 422 while the retry executed on it, and the other
 * key then executed too. */
static void test_one_token_one_key_under_resubmits(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "routes:\n" REFUND_ROUTE "    scope: subject\n    layers: [token, record]\n"
               "    in_flight: wait\n    wait_timeout: 5s\n",
               "resubmits.db");
    long before = sys_stat(service.port, "executions");
    char th[128];
    sys_issue_token(gw.port, "gina", th, sizeof th);
    const char *failing[] = {"X-Subject: gina", th, "X-Fail: 500", "X-Delay-Ms: 300", NULL};
    const char *slow[] = {"X-Subject: gina", th, "X-Delay-Ms: 800", NULL};
    const char *plain[] = {"X-Subject: gina", th, NULL};
    const char *body = "{\"refund_no\":\"R-ride\",\"amount\":\"1.00\"}";
    int64_t t0 = test_mono_ms();
    struct bg_post a = {.port = gw.port, .headers = failing, .body = body};
    pthread_create(&a.t, NULL, bg_post_main, &a);
    sleep_ms(50);
    struct bg_post b = {.port = gw.port, .headers = slow, .body = body};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(200);
    struct resubmits edited = {.port = gw.port, .headers = plain, .until_ms = t0 + 1500,
                               .body = "{\"refund_no\":\"R-ride\",\"amount\":\"9.00\"}"};
    struct resubmits other = {.port = gw.port, .headers = plain, .until_ms = t0 + 1600,
                              .body = "{\"refund_no\":\"R-ride-2\",\"amount\":\"1.00\"}"};
    pthread_create(&edited.t, NULL, resubmits_main, &edited);
    sleep_ms(100);
    pthread_create(&other.t, NULL, resubmits_main, &other);
    pthread_join(a.t, NULL);
    pthread_join(b.t, NULL);
    pthread_join(edited.t, NULL);
    pthread_join(other.t, NULL);
    assert_int_equal(a.resp.status, 500);
    int b_first = b.resp.status == 201 && !sys_header(&b.resp, "Idempotent-Replayed");
    sys_resp_free(&a.resp);
    sys_resp_free(&b.resp);
    int r_ride = b_first + edited.first_hand, r_ride_2 = other.first_hand;
    if (r_ride + r_ride_2 != 1)
        fail_msg("one token paid for %d executions: R-ride %d (the retry %d, the edited form "
                 "%d), R-ride-2 %d",
                 r_ride + r_ride_2, r_ride, b_first, edited.first_hand, r_ride_2);
    /* The failed first one, and the one the token paid for. */
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* limits.tokens_per_scene reaches the token store: with 20, the first of 20
 * tokens issued for one subject and scene is still there (with the default
 * 16 it would have been dropped), and the 21st unspent one drops the
 * oldest. */
static void test_tokens_per_scene(void **state)
{
    (void)state;
    struct proc gw;
    char cfg[2048];
    snprintf(cfg, sizeof cfg, "limits:\n  tokens_per_scene: 20\n  token_rate_subject: 100\n%s",
             token_routes);
    start_idem(&gw, cfg, "tokens20.db");
    char first[128], second[128], th[128];
    sys_issue_token(gw.port, "erin", first, sizeof first);
    sys_issue_token(gw.port, "erin", second, sizeof second);
    for (int i = 2; i < 20; i++)
        sys_issue_token(gw.port, "erin", th, sizeof th);
    const char *h[] = {"X-Subject: erin", first, NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", h, "{\"refund_no\":\"R-tokens20\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    /* 19 unspent left: two more, and the oldest, the second, is gone. */
    sys_issue_token(gw.port, "erin", th, sizeof th);
    sys_issue_token(gw.port, "erin", th, sizeof th);
    const char *h2[] = {"X-Subject: erin", second, NULL};
    sys_http(gw.port, "POST", "/refunds", h2, "{\"refund_no\":\"R-tokens20-2\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "urn:idem:token_spent"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A token spent on a request that fails retryably goes back; a retry riding
 * on that spend (same token, same key, waiting behind it) then executes,
 * and must hold the token while it does: before, the token was back and
 * unspent after that execution, and one token paid for two keys. */
static void test_token_given_back_under_a_waiting_retry(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, token_routes, "giveback.db");
    long before = sys_stat(service.port, "executions");
    struct sys_resp r;
    char th[128];
    sys_issue_token(gw.port, "dave", th, sizeof th);
    const char *failing[] = {"X-Subject: dave", th, "X-Fail: 500", "X-Delay-Ms: 1000", NULL};
    const char *plain[] = {"X-Subject: dave", th, NULL};
    const char *body = "{\"refund_no\":\"R-giveback\",\"amount\":\"4.00\"}";
    struct bg_post a = {.port = gw.port, .headers = failing, .body = body};
    pthread_create(&a.t, NULL, bg_post_main, &a);
    sleep_ms(300); /* a has spent the token and waits for the upstream */
    /* b: the same token and key, a retry; it waits for a, then executes. */
    sys_http(gw.port, "POST", "/refunds", plain, body, 10000, &r);
    pthread_join(a.t, NULL);
    assert_int_equal(a.resp.status, 500);
    assert_int_equal(r.status, 201);
    assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&a.resp);
    sys_resp_free(&r);
    /* The token paid for b's execution: not for another key, */
    sys_http(gw.port, "POST", "/refunds", plain, "{\"refund_no\":\"R-giveback-2\",\"amount\":\"4.00\"}",
             5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "urn:idem:token_spent"));
    sys_resp_free(&r);
    /* and a late retry of b gets b's answer. */
    sys_http(gw.port, "POST", "/refunds", plain, body, 5000, &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2); /* a's, then b's */
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_upstream_killed_mid_request(void **state)
{
    (void)state;
    struct proc gw, svc;
    char db[4200], log[4200], listen[64], routes[1024];
    int port = sys_free_port();
    snprintf(db, sizeof db, "%s/killed-svc.db", dir);
    snprintf(log, sizeof log, "%s/killed-svc.log", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    char *argv[] = {(char *)service_bin, "--listen", listen, "--db", db, NULL};
    sys_start(&svc, argv, log);
    snprintf(routes, sizeof routes,
             "routes:\n"
             "  - name: refund\n"
             "    match: { method: POST, path: /refunds }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { json: refund_no }\n"
             "    lease: 30s\n",
             port);
    start_idem(&gw, routes, "killed.db");
    static const char *const slow[] = {"X-Delay-Ms: 3000", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-killed\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(500); /* the request is in the service's hands */
    sys_stop(&svc, SIGKILL);
    pthread_join(b.t, NULL);
    /* Sent, no answer: the outcome is unknown, and Idem says so. */
    assert_int_equal(b.resp.status, 504);
    assert_non_null(strstr(b.resp.m->body, "urn:idem:outcome_unknown"));
    sys_resp_free(&b.resp);
    /* The record stays PROCESSING: a retry is not executed. */
    sys_start(&svc, argv, log);
    long before = sys_stat(port, "executions");
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", NULL, b.body, 5000, &r);
    assert_int_equal(r.status, 409);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(port, "executions") - before, 0);
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund/R-killed", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"PROCESSING\""));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    sys_stop(&svc, SIGTERM);
}

static void test_daemon_killed_mid_request(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "sigkill.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-sigkill\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(400);
    sys_stop(&gw, SIGKILL);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 0); /* the client lost its connection */
    /* Restarted on the same file: the claim survived the kill. */
    start_idem(&gw, reject_routes, "sigkill.db");
    post_expect(gw.port, b.body, 409, ANY);
    sleep_ms(1500); /* the service finishes the first request */
    post_expect(gw.port, b.body, 409, ANY); /* still PROCESSING: the lease (10 s) holds */
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static const char drain_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    upstream_timeout: 20s\n";

static void test_sigterm_drains(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, drain_routes, "drain.db");
    static const char *const slow[] = {"X-Delay-Ms: 4000", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-drain\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(300);
    kill(gw.pid, SIGTERM);
    /* While it drains (the request has over 3 s to go), a new client is refused
     * at once (and can go to another instance), not left hanging in a
     * listen queue. */
    int refused = 0;
    for (int i = 0; i < 250 && !refused; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gw.port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        refused = connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == ECONNREFUSED;
        close(fd);
        if (!refused)
            sleep_ms(10);
    }
    assert_true(refused);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201); /* finished and answered */
    sys_resp_free(&b.resp);
    assert_int_equal(sys_stop(&gw, 0), 0);
    /* And recorded: a new instance replays it. */
    start_idem(&gw, drain_routes, "drain.db");
    post_expect(gw.port, b.body, 201, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* SIGTERM with a request that outlives shutdown_timeout: the daemon stops
 * on time without waiting for the upstream, the client is told the outcome
 * is unknown, and the claim stays PROCESSING — a retry after the restart is
 * refused, not run a second time. A request passed through is told the
 * outcome is unknown too, not "shutting down", which reads as not done. */
static const char abandon_routes[] =
    "limits:\n"
    "  shutdown_timeout: 300ms\n"
    "routes:\n"
    REFUND_ROUTE
    "    layers: [lock, record]\n"
    "    in_flight: reject\n"
    "    lease: 8s\n"
    "    upstream_timeout: 10s\n";

static void test_sigterm_past_timeout_abandons(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, abandon_routes, "abandon.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 3000", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-abandon\",\"amount\":\"1.00\"}"};
    struct bg_post pass = {.port = gw.port, .headers = slow, .path = "/callbacks/payment",
                           .body = "{\"serial_no\":\"CH-abandon\",\"amount\":\"1.00\"}"};
    long payments = sys_stat(service.port, "payment_executions");
    pthread_create(&b.t, NULL, bg_post_main, &b);
    pthread_create(&pass.t, NULL, bg_post_main, &pass);
    sleep_ms(300);
    kill(gw.pid, SIGTERM);
    pthread_join(b.t, NULL);
    pthread_join(pass.t, NULL);
    /* Answered before the upstream was: told the outcome is unknown. */
    assert_int_equal(b.resp.status, 504);
    assert_non_null(strstr(b.resp.m->body, "outcome_unknown"));
    sys_resp_free(&b.resp);
    assert_int_equal(pass.resp.status, 504);
    assert_non_null(strstr(pass.resp.m->body, "outcome_unknown"));
    sys_resp_free(&pass.resp);
    assert_int_equal(sys_stop(&gw, 0), 0);
    /* The upstream is still working on it: the claim holds after a
     * restart, and the retry is refused. */
    start_idem(&gw, abandon_routes, "abandon.db");
    post_expect(gw.port, b.body, 409, ANY);
    sleep_ms(3000); /* the upstream finishes the first request */
    post_expect(gw.port, b.body, 409, ANY); /* the lease (8 s) still holds */
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stat(service.port, "payment_executions") - payments, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Another payload under a key whose request is still running here is 422
 * at once, as the record would say: not 409 "retry later" (reject), nor a
 * wait for the first request to end (wait). */
struct bg_done {
    struct bg_post post;
    atomic_int done;
};

static void *bg_done_main(void *arg)
{
    struct bg_done *b = arg;
    bg_post_main(&b->post);
    atomic_store(&b->done, 1);
    return NULL;
}

static void test_other_payload_in_flight_422(void **state)
{
    (void)state;
    static const char *const modes[] = {"    in_flight: reject\n",
                                        "    in_flight: wait\n    wait_timeout: 10s\n"};
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    for (int m = 0; m < 2; m++) {
        struct proc gw;
        char routes[512];
        snprintf(routes, sizeof routes, "routes:\n" REFUND_ROUTE "%s", modes[m]);
        start_idem(&gw, routes, m ? "mismatch-wait.db" : "mismatch-reject.db");
        long before = sys_stat(service.port, "executions");
        struct bg_done first = {.post = {.port = gw.port, .headers = slow,
                                         .body = m ? "{\"refund_no\":\"R-mm-w\",\"amount\":\"1.00\"}"
                                                   : "{\"refund_no\":\"R-mm-r\",\"amount\":\"1.00\"}"}};
        atomic_init(&first.done, 0);
        pthread_create(&first.post.t, NULL, bg_done_main, &first);
        sleep_ms(300);
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", NULL,
                 m ? "{\"refund_no\":\"R-mm-w\",\"amount\":\"2.00\"}"
                   : "{\"refund_no\":\"R-mm-r\",\"amount\":\"2.00\"}",
                 5000, &r);
        assert_int_equal(r.status, 422);
        assert_non_null(strstr(r.m->body, "key_reused"));
        sys_resp_free(&r);
        /* Answered while the first was still at the upstream (1.5 s). */
        assert_int_equal(atomic_load(&first.done), 0);
        pthread_join(first.post.t, NULL);
        assert_int_equal(first.post.resp.status, 201);
        sys_resp_free(&first.post.resp);
        assert_int_equal(sys_stat(service.port, "executions") - before, 1);
        assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    }
}

/* The daemon stands still (SIGSTOP) from before the upstream's answer came
 * until past upstream_timeout. The answer came in time and waits in the
 * socket: it is the request's answer, not a timeout that would leave the
 * outcome unknown and let a retry execute again after the lease. */
static const char stall_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    in_flight: reject\n"
    "    lease: 1s\n"
    "    upstream_timeout: 1500ms\n";

static void test_answer_in_time_read_after_stall(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, stall_routes, "stall.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 500", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-stall\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(200);
    kill(gw.pid, SIGSTOP);
    sleep_ms(2000); /* the answer comes at 500 ms, the deadline is at 1500 */
    kill(gw.pid, SIGCONT);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    sys_resp_free(&b.resp);
    sleep_ms(1200); /* past the lease: a claim left PROCESSING would be taken over */
    post_expect(gw.port, b.body, 201, 1);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The upstream takes three and a half leases: the request's lease timer
 * renews its lock and extends its claim meanwhile, so neither runs out
 * under it. Another owner finds the lock held, the record's lease is still
 * ahead, a duplicate is in flight (409), and the key executes once. */
static void api_expect(int port, const char *path, const char *body, int status,
                       const char *substr);

static const char long_call_routes[] =
    "routes:\n"
    REFUND_ROUTE
    "    space: refund\n"
    "    layers: [lock, record]\n"
    "    in_flight: reject\n"
    "    lease: 1s\n"
    "    upstream_timeout: 10s\n";

static void test_lease_timer_renews_lock_and_claim(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, long_call_routes, "longcall.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 3500", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-long\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(2500); /* two and a half leases into the call */
    api_expect(gw.admin_port, "/_idem/v1/locks/acquire",
               "{\"space\":\"refund\",\"key\":\"R-long\",\"owner\":\"intruder\"}", 200,
               "\"holder\":");
    struct sys_resp r;
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund/R-long", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"PROCESSING\""));
    const char *lu = strstr(r.m->body, "\"lease_until_ms\":");
    assert_non_null(lu);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    assert_true(strtoll(lu + 17, NULL, 10) > now_ms);
    sys_resp_free(&r);
    post_expect(gw.port, b.body, 409, 0);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    sys_resp_free(&b.resp);
    post_expect(gw.port, b.body, 201, 1);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A claim lost while the upstream has the request (here an operator
 * marks it failed mid-call; a takeover after a lease that could not be
 * renewed looks the same to the gateway): the next extension finds it
 * gone, the upstream call is cut at once rather than left to run beside
 * the key's new owner, the client gets 504 outcome_unknown, and the record
 * keeps what its owner wrote. */
static void test_lost_claim_cuts_the_call(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, long_call_routes, "lostclaim.db");
    static const char *const slow[] = {"X-Delay-Ms: 6000", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-lost\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(400);
    struct sys_resp r;
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund/R-lost", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    const char *ep = strstr(r.m->body, "\"epoch\":");
    assert_non_null(ep);
    char body[200];
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"R-lost\",\"epoch\":%lld,\"reason\":\"refunded "
             "by hand\",\"status\":409,\"force\":true}", /* it is live: forced */
             strtoll(ep + 8, NULL, 10));
    sys_resp_free(&r);
    long long t0 = wall_secs();
    api_expect(gw.admin_port, "/_idem/v1/records/mark_failed", body, 200, "FAILED");
    pthread_join(b.t, NULL);
    /* Within a lease's third or so, not after the service's 6 s. */
    assert_true(wall_secs() - t0 <= 2);
    if (b.resp.status != 504 || !strstr(b.resp.m->body, "urn:idem:outcome_unknown") ||
        !strstr(b.resp.m->body, "was lost while the upstream had the request"))
        fail_msg("the client got %d %s", b.resp.status, b.resp.m ? b.resp.m->body : "");
    sys_resp_free(&b.resp);
    /* The operator's word stands. */
    sys_http(gw.port, "POST", "/refunds", NULL, b.body, 5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "refunded by hand"));
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *text = sys_read_file(gw.log);
    assert_non_null(strstr(text, "refund/R-lost: the claim"));
    assert_non_null(strstr(text, "the upstream call is cut"));
    free(text);
}

/* SIGTERM while the requests' claims wait on the store's writer: another
 * process (an operator's sqlite3 shell, say) holds the file's write lock, so
 * the claims are queued behind it when the daemon is told to stop, and still
 * queued when shutdown_timeout ends. The daemon waits for them (it never
 * leaves a claim half-written), forwards none of them once stopping, answers
 * each client 503, and exits cleanly. The claims that landed hold until
 * their lease ends; then each key executes exactly once. */
static const char held_routes[] =
    "limits:\n"
    "  shutdown_timeout: 200ms\n"
    "routes:\n"
    REFUND_ROUTE
    "    in_flight: reject\n"
    "    lease: 5s\n";

/* A store that reads but cannot write (here another process holds the
 * SQLite file's write lock; a full disk or a store gone read-only looks
 * the same): once a request's write failed, the health check writes too
 * and answers 503 until writes work again, so a load balancer stops
 * sending requests that could only fail. */
static void test_health_sees_failing_writes(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "writes.db");
    struct sys_resp r;
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/health", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"record_writes\":\"ok\""));
    sys_resp_free(&r);
    char db[4200];
    snprintf(db, sizeof db, "%s/writes.db", dir);
    sqlite3 *holder = NULL;
    assert_int_equal(sqlite3_open(db, &holder), SQLITE_OK);
    assert_int_equal(sqlite3_exec(holder, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    /* The request waits out the store's busy timeout (5 s), then 503. */
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-w1\",\"amount\":\"1.00\"}",
             15000, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.m->body, "store_unavailable"));
    sys_resp_free(&r);
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/health", NULL, 15000, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.m->body, "\"status\":\"store_unavailable\""));
    assert_non_null(strstr(r.m->body, "\"records\":\"ok\"")); /* reads still work */
    assert_null(strstr(r.m->body, "\"record_writes\":\"ok\""));
    sys_resp_free(&r);
    assert_int_equal(sqlite3_exec(holder, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(holder);
    /* Writes work again: the health check's own write says so. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/health", NULL, 15000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"record_writes\":\"ok\""));
    sys_resp_free(&r);
    post_expect(gw.port, "{\"refund_no\":\"R-w1\",\"amount\":\"1.00\"}", 201, 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The store's three files unlinked under the running daemon (a clean-up
 * script, a deploy that replaces the directory). Without a look at them the
 * daemon would go on answering new keys 201 with their claims in files no
 * one will open again, and after a restart each of those keys would execute
 * once more. Within a second new keys get 503 and are not forwarded, the
 * health check says 503, and the log says why; after the restart no key
 * that was answered 201 executes again, and the refused ones execute once.
 * (What the deleted files held went with them: that is not the daemon's to
 * keep.) */
static void test_store_files_deleted(void **state)
{
    (void)state;
    enum { KEYS_MAX = 1000 };
    struct proc gw;
    start_idem(&gw, reject_routes, "deleted.db");
    long before = sys_stat(service.port, "executions");
    post_expect(gw.port, "{\"refund_no\":\"R-del-0\",\"amount\":\"1.00\"}", 201, 0);
    static const char *const suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/deleted.db%s", dir, suffix[i]);
        if (unlink(path) != 0)
            fail_msg("unlink %s: %s", path, strerror(errno));
    }
    /* New keys one after another until one is refused, a second at most;
     * those answered 201 meanwhile are kept to be sent again. */
    int64_t t0 = test_mono_ms();
    int n = 1, acked = 0, acked_keys[KEYS_MAX];
    char body[96];
    struct sys_resp r;
    for (;; n++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"R-del-%d\",\"amount\":\"1.00\"}", n);
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
        if (r.status == 503)
            break;
        assert_int_equal(r.status, 201);
        sys_resp_free(&r);
        if (test_mono_ms() - t0 > 1000 || n >= KEYS_MAX)
            fail_msg("%d new keys answered 201 in the %lld ms since the files were deleted",
                     n, (long long)(test_mono_ms() - t0));
        acked_keys[acked++] = n;
    }
    assert_non_null(strstr(r.m->body, "store_unavailable"));
    assert_non_null(strstr(r.m->body, "removed or replaced"));
    assert_null(strstr(r.m->body, dir)); /* the path is for the log */
    sys_resp_free(&r);
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.m->body, "\"status\":\"store_unavailable\""));
    sys_resp_free(&r);
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/health", NULL, 5000, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.m->body, "\"records\":\"ESTORE\""));
    sys_resp_free(&r);
    /* Still refused, and never forwarded. */
    post_expect(gw.port, body, 503, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1 + acked);
    /* Said once, naming the file. */
    char *log = sys_read_file(gw.log), said[4300];
    snprintf(said, sizeof said, "ALERT the store file %s/deleted.db", dir);
    assert_non_null(log);
    const char *at = strstr(log, said);
    if (!at)
        fail_msg("the log does not say \"%s\":\n%s", said, log);
    assert_non_null(strstr(at, "removed or replaced under the running process"));
    assert_null(strstr(at + 1, "ALERT the store file"));
    free(log);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    start_idem(&gw, reject_routes, "deleted.db");
    /* The key acknowledged before the deletion too: its record was written
     * back from the open database. */
    post_expect(gw.port, "{\"refund_no\":\"R-del-0\",\"amount\":\"1.00\"}", 201, 1);
    for (int i = 0; i < acked; i++) {
        snprintf(body, sizeof body, "{\"refund_no\":\"R-del-%d\",\"amount\":\"1.00\"}",
                 acked_keys[i]);
        post_expect(gw.port, body, 201, 1);
    }
    /* The refused key's claim was committed by the batch that found the
     * files gone (its client got 503, nothing was forwarded), and written
     * back with the rest: PROCESSING until its lease ends, then it
     * executes once. */
    snprintf(body, sizeof body, "{\"refund_no\":\"R-del-%d\",\"amount\":\"1.00\"}", n);
    post_expect(gw.port, body, 409, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1 + acked);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The upstream executed, and the store fails to keep the answer (here
 * another process holds the SQLite file's write lock until the finish has
 * failed; a full disk looks the same). The claim's lease runs out meanwhile,
 * yet no duplicate may take it over and execute again: the gateway keeps the
 * claim and writes the answer again until the store takes it, answers
 * duplicates 409 until then, and gives its client the answer once kept. */
static void *slow_post_main(void *arg)
{
    struct bg_post *b = arg;
    sys_http(b->port, "POST", "/refunds", b->headers, b->body, 60000, &b->resp);
    return NULL;
}

static long metric(int port, const char *name)
{
    struct sys_resp r;
    sys_admin_http(port, "GET", "/_idem/v1/metrics", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    char line[128];
    snprintf(line, sizeof line, "\n%s ", name);
    const char *at = strstr(r.m->body, line);
    long v = at ? atol(at + strlen(line)) : -1;
    sys_resp_free(&r);
    return v;
}

static void test_answer_kept_after_store_failure(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "routes:\n" REFUND_ROUTE "    in_flight: reject\n    lease: 1s\n"
               "    upstream_timeout: 30s\n",
               "unkept.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    const char *body = "{\"refund_no\":\"R-unkept\",\"amount\":\"1.00\"}";
    struct bg_post b = {.port = gw.port, .headers = slow, .body = body};
    pthread_create(&b.t, NULL, slow_post_main, &b);
    sleep_ms(300); /* claimed and forwarded */
    char db[4200];
    snprintf(db, sizeof db, "%s/unkept.db", dir);
    sqlite3 *holder = NULL;
    assert_int_equal(sqlite3_open(db, &holder), SQLITE_OK);
    assert_int_equal(sqlite3_exec(holder, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    /* The lease extensions, then the finish, each wait out the store's busy
     * timeout (5 s) and fail. The lease (1 s) runs out while the finish has
     * not failed yet: a duplicate's begin, queued now, would run once the
     * store is back and take the record over. It is not begun: the key is
     * claimed by a request of this daemon. */
    sleep_ms(1500);
    struct sys_resp r;
    int64_t t = test_mono_ms();
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "running a request with this key"));
    assert_true(test_mono_ms() - t < 2000); /* not queued behind the store */
    sys_resp_free(&r);
    int waited = 0;
    while (metric(gw.admin_port, "idem_answers_not_kept") != 1 && waited < 30000) {
        sleep_ms(100);
        waited += 100;
    }
    assert_int_equal(metric(gw.admin_port, "idem_answers_not_kept"), 1);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* The finish failed: the answer waits to be kept, and says so. */
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "being stored"));
    sys_resp_free(&r);
    /* The store comes back: the answer is kept, and its client gets it. */
    assert_int_equal(sqlite3_exec(holder, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(holder);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    assert_null(sys_header(&b.resp, "Idempotent-Replayed"));
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    expect_replay_of(&b.resp, &r);
    sys_resp_free(&r);
    sys_resp_free(&b.resp);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(metric(gw.admin_port, "idem_answers_not_kept"), 0);
    /* Four requests; the first took over 5 s (the store's busy timeout,
     * twice), the two 409s and the replay far less. */
    assert_int_equal(
        metric(gw.admin_port, "idem_request_duration_seconds_count{route=\"refund\"}"), 4);
    assert_int_equal(
        metric(gw.admin_port, "idem_request_duration_seconds_bucket{route=\"refund\",le=\"5\"}"),
        3);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_sigterm_with_claims_queued_on_writer(void **state)
{
    (void)state;
    enum { N = 4 };
    struct proc gw;
    start_idem(&gw, held_routes, "held.db");
    long before = sys_stat(service.port, "executions");
    char db[4200];
    snprintf(db, sizeof db, "%s/held.db", dir);
    sqlite3 *holder = NULL;
    assert_int_equal(sqlite3_open(db, &holder), SQLITE_OK);
    assert_int_equal(sqlite3_exec(holder, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);

    struct bg_post b[N];
    char bodies[N][96];
    for (int i = 0; i < N; i++) {
        snprintf(bodies[i], sizeof bodies[i], "{\"refund_no\":\"R-held-%d\",\"amount\":\"1.00\"}",
                 i);
        b[i] = (struct bg_post){.port = gw.port, .body = bodies[i]};
        pthread_create(&b[i].t, NULL, bg_post_main, &b[i]);
    }
    sleep_ms(500); /* every claim is queued behind the held lock */
    kill(gw.pid, SIGTERM);
    sleep_ms(600); /* well past shutdown_timeout */
    int status;
    assert_int_equal(waitpid(gw.pid, &status, WNOHANG), 0); /* still waiting for them */
    assert_int_equal(sqlite3_exec(holder, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(holder);

    for (int i = 0; i < N; i++) {
        pthread_join(b[i].t, NULL);
        assert_int_equal(b[i].resp.status, 503);
        assert_non_null(strstr(b[i].resp.m->body, "shutting_down"));
        sys_resp_free(&b[i].resp);
    }
    assert_int_equal(sys_stop(&gw, 0), 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);

    /* The claims were written whole: after a restart each holds until its
     * lease ends, then runs once, then replays. */
    start_idem(&gw, held_routes, "held.db");
    for (int i = 0; i < N; i++)
        post_expect(gw.port, bodies[i], 409, ANY);
    sleep_ms(5000); /* the lease, from the claims' writing: over by now */
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < N; i++)
            post_expect(gw.port, bodies[i], 201, round);
    assert_int_equal(sys_stat(service.port, "executions") - before, N);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Send len bytes on fd while reading what comes back, until `answers`
 * status lines have arrived (or 20 s); what came back, NUL-terminated. */
static char *exchange(int fd, const char *bytes, size_t len, int answers, size_t *n)
{
    size_t cap = 1 << 20, off = 0;
    char *out = malloc(cap + 1);
    assert_non_null(out);
    *n = 0;
    out[0] = '\0';
    int64_t deadline = test_mono_ms() + 20000;
    while (count_of(out, "HTTP/1.1 ") < answers && test_mono_ms() < deadline && *n < cap) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN | (off < len ? POLLOUT : 0)};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        if ((pfd.revents & POLLOUT) && off < len) {
            ssize_t w = send(fd, bytes + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0)
                off += (size_t)w;
        }
        if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t r = recv(fd, out + *n, cap - *n, MSG_DONTWAIT);
            if (r == 0)
                break;
            if (r > 0) {
                *n += (size_t)r;
                out[*n] = '\0';
            }
        }
    }
    return out;
}

/* A client that shuts its sending side after its request (a half-close)
 * still reads: it gets its answer, then the connection closes. The request
 * runs while the EOF is already in. */
static void test_half_closed_client_answered(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "halfclose.db");
    long before = sys_stat(service.port, "executions");
    const char req[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 300\r\n"
                       "Content-Length: 38\r\n\r\n{\"refund_no\":\"R-half\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    sys_http_raw_shut(gw.port, req, sizeof req - 1, 5000, &r);
    assert_int_equal(r.status, 201);
    assert_true(r.closed);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);

    /* Two requests pipelined in one write, then the half-close: both run
     * and both are answered, in order, before the connection closes. */
    before = sys_stat(service.port, "executions");
    const char two[] =
        "POST /refunds HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 200\r\nContent-Length: 38\r\n\r\n"
        "{\"refund_no\":\"R-pip1\",\"amount\":\"1.00\"}"
        "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 38\r\n\r\n"
        "{\"refund_no\":\"R-pip2\",\"amount\":\"1.00\"}";
    size_t n;
    char *all = sys_http_raw_until_close(gw.port, two, sizeof two - 1, 5000, &n);
    assert_non_null(all);
    assert_int_equal(count_of(all, "HTTP/1.1 201"), 2);
    free(all);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);

    /* Requests answered at once (a 400 here; a replay alike), 100 of them
     * pipelined, then the half-close: the end of input is seen between two
     * of them, and every one is answered all the same. */
    const char bad[] = "GET //x HTTP/1.1\r\nHost: x\r\n\r\n";
    char *many = malloc(100 * (sizeof bad - 1) + 1);
    for (int i = 0; i < 100; i++)
        memcpy(many + i * (sizeof bad - 1), bad, sizeof bad - 1);
    all = sys_http_raw_until_close(gw.port, many, 100 * (sizeof bad - 1), 5000, &n);
    free(many);
    assert_non_null(all);
    assert_int_equal(count_of(all, "HTTP/1.1 400"), 100);
    free(all);

    /* More pipelined than the daemon buffers for a connection (64 KiB)
     * while its first request waits for the upstream: reading stops at
     * the limit and starts again as the requests are taken, until every
     * one is answered, in order; and the connection still reads a request
     * sent after all of them were answered. */
    enum { PADDED = 400 };
    const char slow[] =
        "POST /refunds HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 300\r\nContent-Length: 38\r\n\r\n"
        "{\"refund_no\":\"R-pip3\",\"amount\":\"1.00\"}";
    char padded[320];
    int plen = snprintf(padded, sizeof padded,
                        "GET //x HTTP/1.1\r\nHost: x\r\nX-Pad: %0250d\r\n\r\n", 0);
    size_t total = sizeof slow - 1 + (size_t)PADDED * (size_t)plen;
    assert_true(total > 64 * 1024);
    char *stream = malloc(total);
    assert_non_null(stream);
    memcpy(stream, slow, sizeof slow - 1);
    for (int i = 0; i < PADDED; i++)
        memcpy(stream + sizeof slow - 1 + (size_t)i * (size_t)plen, padded, (size_t)plen);
    before = sys_stat(service.port, "executions");
    int fd = sys_connect_local(gw.port);
    assert_true(fd >= 0);
    size_t got = 0;
    all = exchange(fd, stream, total, PADDED + 1, &got);
    free(stream);
    const char *first = strstr(all, "HTTP/1.1 ");
    assert_non_null(first);
    assert_memory_equal(first, "HTTP/1.1 201", 12);
    assert_int_equal(count_of(all, "HTTP/1.1 400"), PADDED);
    free(all);
    all = exchange(fd, padded, (size_t)plen, 1, &got);
    assert_int_equal(count_of(all, "HTTP/1.1 400"), 1);
    free(all);
    close(fd);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);

    /* A request that closes its connection, from a client that has shut
     * its side: the answer, then the daemon lets the connection go at
     * once, on the end of input it saw, not when its linger (2 s) ends. */
    const char closing[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                           "Content-Length: 38\r\n\r\n"
                           "{\"refund_no\":\"R-pip4\",\"amount\":\"1.00\"}";
    all = sys_http_raw_until_close(gw.port, closing, sizeof closing - 1, 5000, &n);
    assert_non_null(all);
    assert_int_equal(count_of(all, "HTTP/1.1 201"), 1);
    free(all);
    int64_t until = test_mono_ms() + 1000;
    while (metric(gw.admin_port, "idem_connections_open") != 0 && test_mono_ms() < until)
        usleep(20000);
    assert_int_equal(metric(gw.admin_port, "idem_connections_open"), 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Duplicates on a kept-alive connection are answered from the loop's
 * replay cache as ready bytes: the same status, replay header and body as
 * the replay a closing connection gets, three times over one connection. */
static void test_replays_on_kept_alive_connection(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "keepalive.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-keep\",\"amount\":\"1.00\"}";
    struct sys_resp first;
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &first);
    assert_int_equal(first.status, 201);
    const char one[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 38\r\n\r\n"
                       "{\"refund_no\":\"R-keep\",\"amount\":\"1.00\"}";
    char three[3 * sizeof one];
    snprintf(three, sizeof three, "%s%s%s", one, one, one);
    size_t n;
    char *all = sys_http_raw_until_close(gw.port, three, strlen(three), 5000, &n);
    assert_non_null(all);
    assert_int_equal(count_of(all, "HTTP/1.1 201 Created\r\n"), 3);
    assert_int_equal(count_of(all, "Idempotent-Replayed: true\r\n"), 3);
    assert_int_equal(count_of(all, first.m->body), 3);
    assert_null(strstr(all, "Connection: close")); /* kept alive throughout */
    free(all);
    sys_resp_free(&first);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A client that resets its connection while its request is in the upstream
 * and its record steps are still to come: the work goes on without it, the
 * record is finished, and its retry is a replay. */
static void test_client_reset_mid_request(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "reset.db");
    long before = sys_stat(service.port, "executions");
    const char req[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nX-Delay-Ms: 300\r\n"
                       "Content-Length: 38\r\n\r\n{\"refund_no\":\"R-rset\",\"amount\":\"1.00\"}";
    /* Reset once the request is surely in (a reset drops unread input). */
    sys_http_send_and_reset(gw.port, req, sizeof req - 1, 100);
    sleep_ms(700); /* the upstream answers at 300 ms; the record is finished after */
    post_expect(gw.port, "{\"refund_no\":\"R-rset\",\"amount\":\"1.00\"}", 201, 1);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* An upstream answer over response_max: the request did execute, so its
 * record is finished with a 502 problem saying so, and a retry replays that
 * problem instead of running again. */
static const char small_response_routes[] =
    "limits:\n"
    "  response_max: 16B\n"
    "routes:\n"
    REFUND_ROUTE
    "    in_flight: reject\n";

static void test_upstream_answer_too_large(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, small_response_routes, "toolarge.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-big\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    for (int i = 0; i < 2; i++) {
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
        assert_int_equal(r.status, 502);
        assert_non_null(strstr(r.m->body, "upstream_response_too_large"));
        if (i == 0)
            assert_null(sys_header(&r, "Idempotent-Replayed"));
        else
            assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* A reload that raises response_max leaves the running limit (the
     * store was opened for it) and says so. */
    char path[4200];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, config_seq);
    write_config(path, "limits:\n  response_max: 1MiB\nroutes:\n" REFUND_ROUTE);
    kill(gw.pid, SIGHUP);
    await_reloads(gw.log, 1);
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-big-2\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 502);
    assert_non_null(strstr(r.m->body, "upstream_response_too_large"));
    sys_resp_free(&r);
    /* A second reload of the same file says it again: the file is
     * compared with what the process started with, not with the last
     * file loaded. */
    kill(gw.pid, SIGHUP);
    await_reloads(gw.log, 2);
    char *log = sys_read_file(gw.log);
    const char *said = "SIGHUP: limits: changed in the file; the running ones stay until a restart";
    const char *first = strstr(log, said);
    assert_non_null(first);
    assert_non_null(strstr(first + 1, said));
    free(log);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The problem body's members, as the client reads them. */
static void expect_problem(const struct sys_resp *r, int status, const char *type,
                           const char *title, const char *detail)
{
    assert_int_equal(r->status, status);
    assert_string_equal(sys_header(r, "Content-Type"), "application/problem+json");
    json_t *j = json_loadb(r->m->body, r->m->body_len, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "type")), type);
    assert_int_equal(json_integer_value(json_object_get(j, "status")), status);
    if (title)
        assert_string_equal(json_string_value(json_object_get(j, "title")), title);
    if (detail)
        assert_string_equal(json_string_value(json_object_get(j, "detail")), detail);
    json_decref(j);
}

/* problems: the global text, a route's over it field by field, UTF-8 kept
 * as written, the type and status never changed; a problem that is stored
 * is stored with its text, so its replay is the answer first given. */
static void test_problems_localised(void **state)
{
    (void)state;
    struct proc gw;
    struct sys_resp r;
    static const char routes[] =
        "limits:\n"
        "  response_max: 16B\n"
        "problems:\n"
        "  token_spent: { title: 令牌已失效, detail: 请刷新后重试 }\n"
        "  key_missing: { title: Schlüssel fehlt }\n"
        "  upstream_response_too_large: { detail: \"trop grand, gardé\" }\n"
        "routes:\n"
        "  - name: refund\n"
        "    match: { method: POST, path: /refunds }\n"
        "    upstream: @UP@\n"
        "    key: { json: refund_no }\n"
        "    scope: subject\n"
        "    layers: [token, record]\n"
        "    problems:\n"
        "      key_missing: { detail: 请填写退款单号 }\n"
        "  - name: big\n"
        "    match: { method: POST, path: /payments }\n"
        "    upstream: @UP@\n"
        "    key: { json: serial_no }\n";
    start_idem(&gw, routes, "problems.db");
    static const char *const stale[] = {"X-Subject: dora", "Idem-Token: no-such-token", NULL};
    sys_http(gw.port, "POST", "/refunds", stale, "{\"refund_no\":\"R-l10n\",\"amount\":\"1.00\"}",
             5000, &r);
    expect_problem(&r, 409, "urn:idem:token_spent", "令牌已失效", "请刷新后重试");
    sys_resp_free(&r);
    /* The route's detail, the global title. */
    static const char *const dora[] = {"X-Subject: dora", NULL};
    sys_http(gw.port, "POST", "/refunds", dora, "{\"amount\":\"1.00\"}", 5000, &r);
    expect_problem(&r, 400, "urn:idem:key_missing", "Schlüssel fehlt", "请填写退款单号");
    sys_resp_free(&r);
    /* A type not configured keeps Idem's text. */
    sys_http(gw.port, "POST", "/refunds", dora, "{\"refund_no\":\"R-l10n\"}", 5000, &r);
    expect_problem(&r, 428, "urn:idem:token_missing", "Precondition Required", NULL);
    sys_resp_free(&r);
    /* Stored with its text: the replay says the same. */
    const char *big = "{\"serial_no\":\"P-l10n\",\"amount\":\"1.00\"}";
    for (int i = 0; i < 2; i++) {
        sys_http(gw.port, "POST", "/payments", NULL, big, 5000, &r);
        expect_problem(&r, 502, "urn:idem:upstream_response_too_large", "Bad Gateway",
                       "trop grand, gardé");
        if (i)
            assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        sys_resp_free(&r);
    }
    /* What was stored stays: a reload that changes the text changes new
     * answers, not the replay. */
    char path[4200];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, config_seq);
    write_config(path, "limits:\n  response_max: 16B\n"
                       "problems:\n  upstream_response_too_large: { detail: autre }\n"
                       "routes:\n  - name: big\n    match: { method: POST, path: /payments }\n"
                       "    upstream: @UP@\n    key: { json: serial_no }\n");
    kill(gw.pid, SIGHUP);
    await_reloads(gw.log, 1);
    sys_http(gw.port, "POST", "/payments", NULL, big, 5000, &r);
    expect_problem(&r, 502, "urn:idem:upstream_response_too_large", NULL, "trop grand, gardé");
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/payments", NULL, "{\"serial_no\":\"P-l10n-2\",\"amount\":\"1.00\"}",
             5000, &r);
    expect_problem(&r, 502, "urn:idem:upstream_response_too_large", NULL, "autre");
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- limits and malformed requests ---- */

static const char limit_routes[] =
    "limits:\n"
    "  body_max: 1KiB\n"
    "  header_count_max: 20\n"
    "  request_line_max: 512\n"
    "  header_timeout: 600ms\n"
    "  body_timeout: 600ms\n"
    "  connections_max: 40\n"
    "  requests_per_connection: 2\n"
    "routes:\n"
    "  - name: refund\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: @UP@\n"
    "    key: { json: refund_no }\n";

static void expect_raw(int port, const char *bytes, int status, int closed)
{
    struct sys_resp r;
    sys_http_raw(port, bytes, strlen(bytes), 3000, &r);
    if (r.status != status)
        fail_msg("%d for %s (expected %d)", r.status, bytes, status);
    if (closed)
        assert_true(r.closed);
    if (status >= 400)
        assert_string_equal(sys_header(&r, "Content-Type"), "application/problem+json");
    sys_resp_free(&r);
}

static void test_limits_and_malformed(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, limit_routes, "limits.db");
    long before = sys_stat(service.port, "executions");
    char big[4096];
    snprintf(big, sizeof big,
             "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n%2000d", 7);
    expect_raw(gw.port, big, 413, 1);
    expect_raw(gw.port,
               "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
               "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
               400, 1);
    expect_raw(gw.port,
               "POST /refunds HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
               1);
    expect_raw(gw.port, "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\rb\r\n\r\n", 400, 1);
    expect_raw(gw.port, "GET / HTTP/1.1\r\nHost: x\nX-A: b\r\n\r\n", 400, 1);
    static const char nul_req[] = "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\0b\r\n\r\n";
    struct sys_resp r;
    sys_http_raw(gw.port, nul_req, sizeof nul_req - 1, 3000, &r);
    assert_int_equal(r.status, 400);
    sys_resp_free(&r);
    char many[4096], *o = many;
    o += sprintf(o, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < 30; i++)
        o += sprintf(o, "X-H%d: v\r\n", i);
    sprintf(o, "\r\n");
    expect_raw(gw.port, many, 431, 1);
    char longline[2048];
    snprintf(longline, sizeof longline, "GET /%01000d HTTP/1.1\r\nHost: x\r\n\r\n", 0);
    expect_raw(gw.port, longline, 414, 1);
    /* The key with a control character, through JSON's escapes. */
    struct sys_resp k;
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R\\n1\",\"amount\":\"1\"}", 3000,
             &k);
    assert_int_equal(k.status, 400);
    assert_non_null(strstr(k.m->body, "urn:idem:key_invalid"));
    sys_resp_free(&k);
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);

    /* requests_per_connection: 2 — three pipelined requests get two
     * answers, the second saying Connection: close, then the close. */
    const char three[] = "GET /_idem/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
                         "GET /_idem/v1/health HTTP/1.1\r\nHost: x\r\n\r\n"
                         "GET /_idem/v1/health HTTP/1.1\r\nHost: x\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gw.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, three, sizeof three - 1, 0), (ssize_t)(sizeof three - 1));
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char got[16384];
    size_t len = 0;
    ssize_t n;
    while (len < sizeof got - 1 && (n = recv(fd, got + len, sizeof got - 1 - len, 0)) > 0)
        len += (size_t)n;
    assert_int_equal(n, 0); /* closed by the server, not timed out */
    close(fd);
    got[len] = '\0';
    int answers = 0;
    for (const char *g = got; (g = strstr(g, "HTTP/1.1 200")) != NULL; g++)
        answers++;
    assert_int_equal(answers, 2);
    const char *second = strstr(strstr(got, "HTTP/1.1 200") + 1, "HTTP/1.1 200");
    assert_non_null(strstr(second, "Connection: close"));
    assert_true(strstr(got, "Connection: close") > second); /* not on the first */

    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

struct slow_client {
    int port;
    struct sys_resp resp;
};

static void test_slow_client_cut_off(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, limit_routes, "slow.db");
    /* A client that sends half a request and stalls is answered 408 and
     * closed: after header_timeout if its head is not whole, after
     * body_timeout from the head's end if its body is not... */
    struct sys_resp r;
    const char half[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"ref";
    long long t0 = time(NULL);
    sys_http_raw(gw.port, half, sizeof half - 1, 5000, &r);
    assert_int_equal(r.status, 408);
    assert_true(r.closed);
    assert_non_null(strstr(r.m->body, "within body_timeout"));
    assert_true(time(NULL) - t0 <= 3);
    sys_resp_free(&r);
    const char half_head[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nContent-Le";
    sys_http_raw(gw.port, half_head, sizeof half_head - 1, 5000, &r);
    assert_int_equal(r.status, 408);
    assert_true(r.closed);
    assert_non_null(strstr(r.m->body, "head did not arrive within header_timeout"));
    sys_resp_free(&r);
    /* ...while everyone else is served. */
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 3000, &r);
    assert_int_equal(r.status, 200);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A second idem serve on the same embedded store file is refused: the two
 * would share the port and split the tokens and locks between them. So is
 * one on the same port with another file. The first goes on serving. */
static void test_second_daemon_on_one_store_refused(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "one.db");
    char path[4200], db[4200], err[4096], listen[64];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, config_seq);
    snprintf(db, sizeof db, "%s/one.db", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", gw.port);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", listen, NULL};
    assert_int_equal(sys_run_fail(argv, err, sizeof err), 1);
    assert_non_null(strstr(err, "in use by another idem serve"));
    /* Nor on the same port with a file of its own: the kernel would split
     * the clients between two daemons, each with its own records. */
    snprintf(db, sizeof db, "%s/other.db", dir);
    assert_int_equal(sys_run_fail(argv, err, sizeof err), 1);
    assert_non_null(strstr(err, "in use by another process"));
    post_expect(gw.port, "{\"refund_no\":\"R-one\",\"amount\":\"1.00\"}", 201, 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    /* Once it is gone, the file is free again. */
    start_idem(&gw, reject_routes, "one.db");
    post_expect(gw.port, "{\"refund_no\":\"R-one\",\"amount\":\"1.00\"}", 201, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_bad_config_refused(void **state)
{
    (void)state;
    char path[4200], err[4096];
    snprintf(path, sizeof path, "%s/bad.yaml", dir);
    sys_write_file(path, "listen: 127.0.0.1:0\n"
                         "routes:\n"
                         "  - name: refund\n"
                         "    match: { method: POST, path: /refunds }\n"
                         "    upstream: http://127.0.0.1:1\n"
                         "    key: { json: refund_no }\n"
                         "    lease: soon\n");
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, NULL};
    int status = sys_run_fail(argv, err, sizeof err);
    assert_int_equal(status, 2);
    assert_non_null(strstr(err, "bad.yaml:7"));
    assert_non_null(strstr(err, "lease"));
    /* --check says the same and exits, without starting. */
    char *check[] = {(char *)idem_bin, "serve", "-c", path, "--check", NULL};
    assert_int_equal(sys_run_fail(check, err, sizeof err), 2);
    assert_non_null(strstr(err, "bad.yaml:7"));
    /* A valid file: 0, and neither the store (in a directory that does not
     * exist) nor the port (in use: the refund service's) is touched. */
    char good[4200], db[4200], listen[64];
    snprintf(good, sizeof good, "%s/good.yaml", dir);
    sys_write_file(good, "routes:\n"
                         "  - name: refund\n"
                         "    match: { method: POST, path: /refunds }\n"
                         "    upstream: http://127.0.0.1:1\n"
                         "    key: { json: refund_no }\n");
    snprintf(db, sizeof db, "%s/no/such/dir/idem.db", dir);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", service.port);
    char *ok[] = {(char *)idem_bin, "serve", "-c", good, "--db", db, "--listen", listen,
                  "--check", NULL};
    assert_int_equal(sys_run_fail(ok, err, sizeof err), 0);
    assert_string_equal(err, "");
    /* -T checks as --check does, refusing with the same line and status... */
    char *dump_bad[] = {(char *)idem_bin, "serve", "-c", path, "-T", NULL};
    assert_int_equal(sys_run_fail(dump_bad, err, sizeof err), 2);
    assert_non_null(strstr(err, "bad.yaml:7"));
    /* ... and prints a valid one on stdout, --db and --listen applied, as
     * a file that, printed again, gives the same text. */
    char cmd[30000];
    snprintf(cmd, sizeof cmd,
             "D='%s' && '%s' serve -c \"$D/good.yaml\" --db '%s' --listen %s -T "
             ">\"$D/dump1.yaml\" 2>\"$D/dump.err\" && grep -q 'good.yaml is valid' "
             "\"$D/dump.err\" && grep -q '^  path: \"%s\"$' \"$D/dump1.yaml\" && "
             "grep -q '^  address: \"%s\"$' \"$D/dump1.yaml\" && '%s' serve --dump-config "
             "-c \"$D/dump1.yaml\" >\"$D/dump2.yaml\" 2>/dev/null && "
             "cmp -s \"$D/dump1.yaml\" \"$D/dump2.yaml\"",
             dir, idem_bin, db, listen, db, listen, idem_bin);
    assert_int_equal(system(cmd), 0);
}

/* Two routes, the second's upstream host given: the file idem serve loads
 * in test_upstream_names. Line 8 is the second upstream. */
static void write_named_routes(const char *path, const char *second_host)
{
    char text[2048];
    snprintf(text, sizeof text,
             "routes:\n"
             "  - name: refund\n"
             "    match: { method: POST, path: /refunds }\n"
             "    upstream: http://localhost:%d\n"
             "    key: { json: refund_no }\n"
             "  - name: payment\n"
             "    match: { method: POST, path: /callbacks/payment }\n"
             "    upstream: http://%s:%d\n"
             "    key: { json: serial_no }\n",
             service.port, second_host, service.port);
    sys_write_file(path, text);
}

/* Upstream host names are looked up when the file is loaded, never while a
 * request waits: a name is served like its address; one that does not
 * resolve refuses the file at start and in --check, naming the line, and
 * at a SIGHUP leaves the running routes serving. */
static void test_upstream_names(void **state)
{
    (void)state;
    char path[4200], db[4200], log[4200], err[4096];
    snprintf(path, sizeof path, "%s/names.yaml", dir);
    snprintf(db, sizeof db, "%s/names.db", dir);
    snprintf(log, sizeof log, "%s/names.log", dir);
    write_named_routes(path, "127.0.0.1");
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", "127.0.0.1:0",
                    NULL};
    struct proc gw;
    sys_start(&gw, argv, log);
    long before = sys_stat(service.port, "executions");
    long paid = sys_stat(service.port, "payment_executions");
    post_expect(gw.port, "{\"refund_no\":\"R-name-1\",\"amount\":\"1.00\"}", 201, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);

    /* A reload with a name that does not resolve: refused, named; the
     * running routes (both of them) go on. */
    write_named_routes(path, "no-such-host.invalid");
    kill(gw.pid, SIGHUP);
    char *text = await_log(log, "the running routes stay");
    assert_non_null(text);
    assert_non_null(strstr(text, "names.yaml:8: routes[1].upstream: upstream "
                                 "no-such-host.invalid:"));
    free(text);
    post_expect(gw.port, "{\"refund_no\":\"R-name-2\",\"amount\":\"1.00\"}", 201, 0);
    struct sys_resp r;
    sys_http(gw.port, "POST", "/callbacks/payment", NULL,
             "{\"serial_no\":\"CH-name\",\"amount\":\"1.00\"}", 5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stat(service.port, "payment_executions") - paid, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* The same file at start, and in --check: refused with the line. */
    assert_int_equal(sys_run_fail(argv, err, sizeof err), 2);
    assert_non_null(strstr(err, "names.yaml:8: routes[1].upstream: upstream "
                                "no-such-host.invalid:"));
    char *check[] = {(char *)idem_bin, "serve", "-c", path, "--check", NULL};
    assert_int_equal(sys_run_fail(check, err, sizeof err), 2);
    assert_non_null(strstr(err, "names.yaml:8: routes[1].upstream"));
}

static void test_sighup_reloads_routes(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "hup.db");
    struct sys_resp r;
    sys_http(gw.port, "POST", "/callbacks/payment", NULL,
             "{\"serial_no\":\"CH-hup\",\"amount\":\"1.00\"}", 5000, &r);
    assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&r);
    /* A request in flight across the reload keeps the routes it came
     * with (it holds them), and is finished and answered. */
    static const char *const slow[] = {"X-Delay-Ms: 600", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-hup\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(150);
    /* Rewrite the same file with the payment routes, and reload. */
    char path[4200];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, config_seq);
    write_config(path, wait_routes);
    kill(gw.pid, SIGHUP);
    await_reloads(gw.log, 1);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    sys_resp_free(&b.resp);
    for (int i = 0; i < 2; i++) {
        sys_http(gw.port, "POST", "/callbacks/payment", NULL,
                 "{\"serial_no\":\"CH-hup2\",\"amount\":\"1.00\"}", 5000, &r);
        if (i == 1)
            assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        sys_resp_free(&r);
    }
    /* The reload took the file, and says when; a file refused says so. */
    assert_int_equal(metric(gw.admin_port, "idem_config_last_reload_successful"), 1);
    long loaded = metric(gw.admin_port, "idem_config_last_reload_success_timestamp_seconds");
    assert_true(loaded > 1700000000 && loaded <= (long)time(NULL));
    sys_write_file(path, "routes: [ this is not a route ]\n");
    kill(gw.pid, SIGHUP);
    free(await_log(gw.log, "the running routes stay"));
    assert_int_equal(metric(gw.admin_port, "idem_config_last_reload_successful"), 0);
    assert_int_equal(metric(gw.admin_port, "idem_config_last_reload_success_timestamp_seconds"),
                     loaded);
    assert_true(metric(gw.admin_port, "idem_connections_open") >= 0);
    /* The metrics count per route, and a route that keeps its name across
     * the reload keeps its counts. */
    assert_int_equal(metric(gw.admin_port, "idem_executions_total{route=\"refund\"}"), 1);
    assert_int_equal(metric(gw.admin_port, "idem_requests_total{route=\"payment-callback\","
                                           "outcome=\"executed\"}"),
                     1);
    assert_int_equal(metric(gw.admin_port, "idem_requests_total{route=\"payment-callback\","
                                           "outcome=\"replayed\"}"),
                     1);
    assert_int_equal(metric(gw.admin_port, "idem_passthrough_total"), 1);
    /* Every durable commit of the store is timed into its histogram. */
    long commits = metric(gw.admin_port, "idem_store_commits_total");
    assert_true(commits >= 4);
    assert_int_equal(metric(gw.admin_port, "idem_store_commit_duration_seconds_count"), commits);
    assert_int_equal(metric(gw.admin_port, "idem_store_commit_duration_seconds_bucket{le=\"+Inf\"}"),
                     commits);
    long fast = metric(gw.admin_port, "idem_store_commit_duration_seconds_bucket{le=\"0.0001\"}");
    assert_true(fast >= 0 && fast <= commits);
    /* Only the routes changed: the reload applied --listen and --db again
     * and did not claim that anything waits for a restart. */
    char *log = sys_read_file(gw.log);
    assert_non_null(strstr(log, "SIGHUP: reloaded"));
    assert_null(strstr(log, "until a restart"));
    assert_null(strstr(log, "keyed differently"));
    free(log);
    /* A new space for a route: allowed, and said, since its old records no
     * longer stop duplicates. */
    write_config(path, "routes:\n" REFUND_ROUTE "    space: refund-v2\n");
    kill(gw.pid, SIGHUP);
    log = await_log(gw.log, "SIGHUP: route refund: its records are keyed differently");
    assert_non_null(log);
    free(log);
    /* A new token scene: the tokens issued for the old one are refused from
     * now on, and that is said too. */
    write_config(path, "routes:\n" REFUND_ROUTE "    space: refund-v2\n"
                       "    layers: [token, record]\n");
    kill(gw.pid, SIGHUP);
    await_reloads(gw.log, 3);
    write_config(path, "routes:\n" REFUND_ROUTE "    space: refund-v2\n"
                       "    layers: [token, record]\n    token_scene: refund-v2\n");
    kill(gw.pid, SIGHUP);
    log = await_log(gw.log, "SIGHUP: route refund: its token_scene is refund-v2 now, not refund");
    assert_non_null(log);
    free(log);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}


/* ---- the JSON API ---- */

static struct sys_resp api(int port, const char *path, const char *body)
{
    struct sys_resp r;
    sys_admin_http(port, body ? "POST" : "GET", path, body, 5000, &r);
    return r;
}

static void api_expect(int port, const char *path, const char *body, int status,
                       const char *substr)
{
    struct sys_resp r = api(port, path, body);
    if (r.status != status || !r.m || !strstr(r.m->body, substr))
        fail_msg("%s %s -> %d %s (expected %d with %s)", path, body ? body : "", r.status,
                 r.m ? r.m->body : "", status, substr);
    sys_resp_free(&r);
}

static void test_json_api(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "api.db");
    int p = gw.admin_port;
    /* Locks. */
    api_expect(p, "/_idem/v1/locks/acquire",
               "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w1\",\"ttl_ms\":30000}", 200,
               "\"outcome\":\"ACQUIRED\"");
    api_expect(p, "/_idem/v1/locks/acquire", "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w2\"}",
               200, "\"holder\":\"w1\"");
    api_expect(p, "/_idem/v1/locks/release", "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w2\"}",
               200, "\"outcome\":\"NOT_HELD\"");
    /* A release has no ttl_ms to take: refused, not ignored. */
    api_expect(p, "/_idem/v1/locks/release",
               "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w1\",\"ttl_ms\":5}", 400,
               "locks/release takes no such field");
    api_expect(p, "/_idem/v1/locks/renew", "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w1\"}",
               200, "\"outcome\":\"RENEWED\"");
    api_expect(p, "/_idem/v1/locks/release", "{\"space\":\"acct\",\"key\":\"A-1\",\"owner\":\"w1\"}",
               200, "\"outcome\":\"RELEASED\"");
    /* Records: begin, in progress, complete, replay, transition. */
    struct sys_resp b = api(p, "/_idem/v1/records/begin",
                            "{\"space\":\"pay\",\"key\":\"P-1\",\"owner\":\"w1\","
                            "\"lease_ms\":30000,\"fingerprint\":"
                            "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}");
    assert_int_equal(b.status, 200);
    assert_non_null(strstr(b.m->body, "\"outcome\":\"NEW\""));
    long long epoch = atoll(strstr(b.m->body, "\"epoch\":") + 8);
    assert_true(epoch > 0);
    sys_resp_free(&b);
    char body[512];
    api_expect(p, "/_idem/v1/records/begin", "{\"space\":\"pay\",\"key\":\"P-1\",\"owner\":\"w2\"}",
               200, "\"outcome\":\"IN_PROGRESS\"");
    snprintf(body, sizeof body, "{\"space\":\"pay\",\"key\":\"P-1\",\"epoch\":%lld}", epoch + 1);
    api_expect(p, "/_idem/v1/records/complete", body, 200, "\"outcome\":\"CONFLICT\"");
    snprintf(body, sizeof body,
             "{\"space\":\"pay\",\"key\":\"P-1\",\"epoch\":%lld,\"result\":\"paid\"}", epoch);
    api_expect(p, "/_idem/v1/records/complete", body, 200, "\"outcome\":\"COMPLETED\"");
    api_expect(p, "/_idem/v1/records/begin", "{\"space\":\"pay\",\"key\":\"P-1\",\"owner\":\"w3\"}",
               200, "\"result\":\"paid\"");
    api_expect(p, "/_idem/v1/records/begin",
               "{\"space\":\"pay\",\"key\":\"P-1\",\"owner\":\"w3\","
               "\"fingerprint\":\"ff112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"}",
               200, "\"outcome\":\"MISMATCH\"");
    api_expect(p, "/_idem/v1/records/transition",
               "{\"space\":\"pay\",\"key\":\"P-1\",\"from\":\"SUCCEEDED\",\"to\":\"REFUNDED\"}", 200,
               "\"outcome\":\"APPLIED\"");
    api_expect(p, "/_idem/v1/records/transition",
               "{\"space\":\"pay\",\"key\":\"P-1\",\"from\":\"SUCCEEDED\",\"to\":\"REFUNDED\"}", 200,
               "\"outcome\":\"ALREADY\"");
    api_expect(p, "/_idem/v1/records/transition",
               "{\"space\":\"pay\",\"key\":\"P-1\",\"from\":\"SUCCEEDED\",\"to\":\"VOID\"}", 200,
               "\"current\":\"REFUNDED\"");
    api_expect(p, "/_idem/v1/records/pay/P-1", NULL, 200, "\"state\":\"REFUNDED\"");
    api_expect(p, "/_idem/v1/records/pay/P-none", NULL, 404, "urn:idem:record_not_found");
    /* fail, retryable: the next begin executes again, at the next epoch. */
    b = api(p, "/_idem/v1/records/begin", "{\"space\":\"pay\",\"key\":\"P-2\",\"owner\":\"w1\"}");
    assert_non_null(strstr(b.m->body, "\"outcome\":\"NEW\""));
    epoch = atoll(strstr(b.m->body, "\"epoch\":") + 8);
    sys_resp_free(&b);
    snprintf(body, sizeof body,
             "{\"space\":\"pay\",\"key\":\"P-2\",\"epoch\":%lld,\"retryable\":true,"
             "\"result_base64\":\"AAEC\"}",
             epoch);
    /* retryable is a boolean: "true" is refused, not taken as final. */
    char quoted[512];
    snprintf(quoted, sizeof quoted,
             "{\"space\":\"pay\",\"key\":\"P-2\",\"epoch\":%lld,\"retryable\":\"true\"}", epoch);
    api_expect(p, "/_idem/v1/records/fail", quoted, 400, "field retryable");
    /* base64 is RFC 4648's: padding only at the end, completing a group. */
    static const char *const not_base64[] = {"QQ==garbage!", "QQ=", "Q", "QQ=A", "QQ===",
                                             "QQ?="};
    for (size_t i = 0; i < sizeof not_base64 / sizeof not_base64[0]; i++) {
        snprintf(quoted, sizeof quoted,
                 "{\"space\":\"pay\",\"key\":\"P-2\",\"epoch\":%lld,\"result_base64\":\"%s\"}",
                 epoch, not_base64[i]);
        api_expect(p, "/_idem/v1/records/fail", quoted, 400, "field result_base64");
    }
    api_expect(p, "/_idem/v1/records/fail", body, 200, "\"outcome\":\"COMPLETED\"");
    char next[64];
    snprintf(next, sizeof next, "\"epoch\":%lld", epoch + 1);
    api_expect(p, "/_idem/v1/records/begin", "{\"space\":\"pay\",\"key\":\"P-2\",\"owner\":\"w2\"}",
               200, next);
    /* Tokens. */
    struct sys_resp t = api(p, "/_idem/v1/tokens", "{\"scene\":\"checkout\",\"ttl_ms\":60000}");
    assert_int_equal(t.status, 201);
    snprintf(body, sizeof body, "{\"scene\":\"checkout\",\"token\":\"%.32s\",\"key\":\"O-1\"}",
             strstr(t.m->body, "\"token\":\"") + 9);
    sys_resp_free(&t);
    api_expect(p, "/_idem/v1/tokens/consume", body, 200, "\"outcome\":\"CONSUMED\"");
    api_expect(p, "/_idem/v1/tokens/consume", body, 200, "\"spent_key\":\"O-1\"");
    api_expect(p, "/_idem/v1/tokens/give_back", body, 200, "\"outcome\":\"RESTORED\"");
    api_expect(p, "/_idem/v1/tokens/consume", body, 200, "\"outcome\":\"CONSUMED\"");
    /* Malformed input: 400 naming the field. */
    api_expect(p, "/_idem/v1/locks/acquire", "{\"space\":\"acct\",\"owner\":\"w1\"}", 400,
               "field key");
    api_expect(p, "/_idem/v1/locks/acquire", "{\"space\":\"acct\",\"key\":7,\"owner\":\"w1\"}", 400,
               "field key: must be a string");
    api_expect(p, "/_idem/v1/records/begin", "not json", 400, "urn:idem:invalid_json");
    /* A fingerprint is 64 hex digits: no sign, space or 0x slips through. */
    static const char *const not_hex[] = {
        "0x112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
        " 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1",
        "-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1",
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddee0g"};
    for (size_t i = 0; i < sizeof not_hex / sizeof not_hex[0]; i++) {
        snprintf(body, sizeof body,
                 "{\"space\":\"pay\",\"key\":\"P-hex\",\"owner\":\"o\",\"fingerprint\":\"%s\"}",
                 not_hex[i]);
        api_expect(p, "/_idem/v1/records/begin", body, 400, "field fingerprint");
    }
    api_expect(p, "/_idem/v1/records/begin",
               "{\"space\":\"bad space\",\"key\":\"k\",\"owner\":\"o\"}", 400, "space");
    api_expect(p, "/_idem/v1/records/complete", "{\"space\":\"pay\",\"key\":\"P-1\",\"epoch\":0}",
               400, "epoch");
    api_expect(p, "/_idem/v1/records/begin",
               "{\"space\":\"pay\",\"key\":\"k\",\"owner\":\"o\",\"fingerprint\":\"xyz\"}", 400,
               "fingerprint");
    /* A field the endpoint does not take is refused, not ignored: a
     * misspelt one would leave its default in force. */
    api_expect(p, "/_idem/v1/records/complete",
               "{\"space\":\"pay\",\"key\":\"P-9\",\"epoch\":1,\"retention\":5}", 400,
               "field retention: records/complete takes no such field");
    api_expect(p, "/_idem/v1/tokens", "{\"scene\":\"checkout\",\"tll_ms\":5}", 400,
               "urn:idem:invalid_field");
    /* Its name is quoted cut short, and still makes a valid answer when the
     * cut falls inside a character (30 euro signs, 90 bytes). */
    char euros[200] = "{\"";
    for (int i = 0; i < 30; i++)
        strcat(euros, "\xe2\x82\xac");
    strcat(euros, "\":1}");
    api_expect(p, "/_idem/v1/tokens", euros, 400, "urn:idem:invalid_field");
    api_expect(p, "/_idem/v1/nope", "{}", 404, "urn:idem:no_such_endpoint");
    api_expect(p, "/_idem/v1/records/nothing", "{}", 404, "urn:idem:no_such_endpoint");
    api_expect(p, "/_idem/v1/tokens", NULL, 405, "urn:idem:method_not_allowed");
    api_expect(p, "/_idem/v1/health", NULL, 200, "\"status\":\"ok\"");
    /* A record written through the API with a CR in a stored header must not
     * inject headers into the gateway's replay. */
    b = api(p, "/_idem/v1/records/begin",
            "{\"space\":\"refund\",\"key\":\"R-inject\",\"owner\":\"w1\"}");
    assert_non_null(strstr(b.m->body, "\"outcome\":\"NEW\""));
    epoch = atoll(strstr(b.m->body, "\"epoch\":") + 8);
    sys_resp_free(&b);
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"R-inject\",\"epoch\":%lld,"
             "\"result\":\"IDEM1 200 1 0\\nX-A: a\\rSet-Cookie: s=1\\n\"}",
             epoch);
    api_expect(p, "/_idem/v1/records/complete", body, 200, "\"outcome\":\"COMPLETED\"");
    struct sys_resp inj;
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-inject\",\"amount\":\"1\"}",
             5000, &inj);
    assert_int_equal(inj.status, 500);
    assert_null(sys_header(&inj, "Set-Cookie"));
    assert_non_null(strstr(inj.m->body, "urn:idem:stored_result_unreadable"));
    sys_resp_free(&inj);
    struct sys_resp d;
    sys_admin_http(p, "DELETE", "/_idem/v1/health", NULL, 5000, &d);
    assert_int_equal(d.status, 405);
    assert_string_equal(sys_header(&d, "Allow"), "GET, HEAD");
    sys_resp_free(&d);
    sys_admin_http(p, "POST", "/_idem/v1/health", "{}", 5000, &d);
    assert_int_equal(d.status, 405);
    assert_string_equal(sys_header(&d, "Allow"), "GET, HEAD");
    sys_resp_free(&d);
    sys_admin_http(p, "PUT", "/_idem/v1/tokens", "{}", 5000, &d);
    assert_int_equal(d.status, 405);
    assert_string_equal(sys_header(&d, "Allow"), "POST");
    sys_resp_free(&d);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* One request over a Unix socket; the whole answer (until the close),
 * NUL-terminated, in out. */
static void unix_http(const char *path, const char *request, char *out, size_t cap)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        fail_msg("connect %s: %s", path, strerror(errno));
    assert_int_equal(send(fd, request, strlen(request), 0), (ssize_t)strlen(request));
    size_t n = 0;
    ssize_t got;
    while (n + 1 < cap && (got = recv(fd, out + n, cap - 1 - n, 0)) > 0)
        n += (size_t)got;
    out[n] = '\0';
    close(fd);
}

/* The shipped example configuration, as a newcomer starts it: on the main
 * listener nothing under /_idem/v1/ answers but health and token issuance
 * (every endpoint tried, none had an effect); the JSON API is on a Unix
 * socket of mode 0600 beside the store, which without a key refuses all. */
static void test_example_config_exposes_nothing(void **state)
{
    (void)state;
    char db[4200], log[4200], sock[4200];
    snprintf(db, sizeof db, "%s/example.db", dir);
    snprintf(log, sizeof log, "%s/example.log", dir);
    snprintf(sock, sizeof sock, "%s/idem-admin.sock", dir);
    char *argv[] = {(char *)idem_bin, "serve", "-c", IDEM_SOURCE_DIR "/examples/idem.yaml",
                    "--db", db, "--listen", "127.0.0.1:0", NULL};
    /* Started on every address as is, it refuses to: plain HTTP off
     * loopback must be asked for in the file. */
    char err[4096];
    char *exposed[] = {(char *)idem_bin, "serve", "-c", IDEM_SOURCE_DIR "/examples/idem.yaml",
                       "--db", db, "--listen", "0.0.0.0:0", NULL};
    assert_int_equal(sys_run_fail(exposed, err, sizeof err), 2);
    assert_non_null(strstr(err, "is not a loopback address"));
    assert_non_null(strstr(err, "allow_plaintext: true"));
    struct proc gw;
    sys_start(&gw, argv, log);
    assert_non_null(strstr(gw.ready, "JSON API on unix:"));
    static const char *const privileged[] = {
        "POST /_idem/v1/records/begin", "POST /_idem/v1/records/complete",
        "POST /_idem/v1/records/fail", "POST /_idem/v1/records/transition",
        "GET /_idem/v1/records/refund/alice%2FR-1", "GET /_idem/v1/records/payment/CH-1",
        "POST /_idem/v1/locks/acquire", "POST /_idem/v1/locks/renew",
        "POST /_idem/v1/locks/release", "POST /_idem/v1/tokens/consume",
        "POST /_idem/v1/tokens/give_back", "GET /_idem/v1/metrics", "GET /_idem/v1",
        "GET /_idem/v1/", "GET /_idem/v1/nope", "POST /_idem/v1/inbox/claim",
    };
    static const char begin[] =
        "{\"space\":\"payment\",\"key\":\"CH-1\",\"owner\":\"mallory\",\"lease_ms\":60000}";
    for (size_t i = 0; i < sizeof privileged / sizeof privileged[0]; i++) {
        char method[8], target[64];
        sscanf(privileged[i], "%7s %63s", method, target);
        struct sys_resp r;
        sys_http(gw.port, method, target, NULL, method[0] == 'P' ? begin : NULL, 5000, &r);
        if (r.status != 404 || !strstr(r.m->body, "urn:idem:no_such_endpoint"))
            fail_msg("%s on the main listener: %d %s", privileged[i], r.status,
                     r.m ? r.m->body : "");
        sys_resp_free(&r);
    }
    /* Health and token issuance stay; the health says no counts. */
    struct sys_resp r;
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.m->body, "{\"status\":\"ok\",\"records\":\"ok\",\"tokens_and_locks\":\"ok\"}");
    sys_resp_free(&r);
    sys_http(gw.port, "GET", "/_idem/v1/health/live", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    sys_resp_free(&r);
    char th[128];
    sys_issue_token(gw.port, "alice", th, sizeof th);
    /* The admin socket: the daemon's user only, and no key, no answer. */
    struct stat st;
    assert_int_equal(stat(sock, &st), 0);
    assert_true(S_ISSOCK(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    /* The store's files likewise: the stored answers are nobody else's. */
    static const char *const suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        char f[4300];
        snprintf(f, sizeof f, "%s%s", db, suffix[i]);
        assert_int_equal(stat(f, &st), 0);
        if ((st.st_mode & 0777) != 0600)
            fail_msg("%s has mode %o", f, (unsigned)(st.st_mode & 0777));
    }
    char out[4096];
    unix_http(sock, "GET /_idem/v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", out,
              sizeof out);
    assert_non_null(strstr(out, "HTTP/1.1 401 "));
    assert_non_null(strstr(out, "WWW-Authenticate: Bearer"));
    unix_http(sock,
              "POST /_idem/v1/records/begin HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
              "Authorization: Bearer not-a-key-of-this-daemon\r\nContent-Length: 2\r\n\r\n{}",
              out, sizeof out);
    assert_non_null(strstr(out, "HTTP/1.1 401 "));
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    /* The socket goes with the daemon. */
    assert_int_equal(stat(sock, &st), -1);
}

/* The two surfaces with keys: an attacker on the main listener can read,
 * begin, finish, transition, lock or consume nothing (each tried, and the
 * effect looked for on the admin side); on the admin listener a request
 * without a key is 401, with a read key it may read and not write (403),
 * with a write key it does everything; keys are logged by name. */
static void test_two_surfaces(void **state)
{
    (void)state;
    char rpath[4200];
    snprintf(rpath, sizeof rpath, "%s/read.key", dir);
    sys_write_file(rpath, "read-key-0123456789abcdef-0123456789\n");
    char routes[8192];
    snprintf(routes, sizeof routes,
             SYS_ADMIN_YAML
             "  - { name: grafana, scope: read, file: %s }\n"
             "limits:\n  token_ttl_max: 1m\n"
             "routes:\n" REFUND_ROUTE "    scope: subject\n"
             "    layers: [token, record]\n",
             rpath);
    struct proc gw;
    start_idem(&gw, routes, "surfaces.db");
    int p = gw.port, a = gw.admin_port;
    assert_true(a > 0 && a != p);
    long before = sys_stat(service.port, "executions");
    /* Mallory, on the main listener, tries every privileged endpoint. */
    static const char *const tries[][2] = {
        {"/_idem/v1/records/begin",
         "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"owner\":\"m\",\"lease_ms\":60000}"},
        {"/_idem/v1/records/complete",
         "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"epoch\":1,\"result\":\"x\"}"},
        {"/_idem/v1/records/fail", "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"epoch\":1}"},
        {"/_idem/v1/records/transition",
         "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"from\":\"A\",\"to\":\"B\"}"},
        {"/_idem/v1/locks/acquire",
         "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"owner\":\"m\",\"ttl_ms\":60000}"},
        {"/_idem/v1/locks/release", "{\"space\":\"refund\",\"key\":\"k\",\"owner\":\"m\"}"},
        {"/_idem/v1/tokens/consume", "{\"scene\":\"refund\",\"token\":\"x\"}"},
        {"/_idem/v1/records/refund/dave%2FR-adm", NULL},
    };
    static const char *const mallory[] = {"X-Subject: dave", NULL};
    for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
        struct sys_resp r;
        sys_http(p, tries[i][1] ? "POST" : "GET", tries[i][0], mallory, tries[i][1], 5000, &r);
        if (r.status != 404)
            fail_msg("%s on the main listener: %d", tries[i][0], r.status);
        sys_resp_free(&r);
    }
    /* None of it happened: no record, and the lock is free for another. */
    api_expect(a, "/_idem/v1/records/refund/dave%2FR-adm", NULL, 404, "record_not_found");
    api_expect(a, "/_idem/v1/locks/acquire",
               "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"owner\":\"ops\"}", 200,
               "\"ACQUIRED\"");
    /* A token issued to dave on the main listener is dave's: mallory's
     * consume above did not touch it, and the gateway takes it once. */
    struct sys_resp tok, r;
    sys_http(p, "POST", "/_idem/v1/tokens", mallory, "{\"scene\":\"refund\",\"ttl_ms\":60000}",
             5000, &tok);
    assert_int_equal(tok.status, 201);
    char th[128];
    snprintf(th, sizeof th, "Idem-Token: %.32s", strstr(tok.m->body, "\"token\":\"") + 9);
    sys_resp_free(&tok);
    /* Without ttl_ms: five minutes, or token_ttl_max if that is less. */
    sys_http(p, "POST", "/_idem/v1/tokens", mallory, "{\"scene\":\"refund\"}", 5000, &tok);
    assert_int_equal(tok.status, 201);
    assert_non_null(strstr(tok.m->body, "\"expires_in_ms\":60000"));
    sys_resp_free(&tok);
    /* Only for a scene a route uses, and not for longer than token_ttl_max. */
    sys_http(p, "POST", "/_idem/v1/tokens", mallory, "{\"scene\":\"other\"}", 5000, &tok);
    assert_int_equal(tok.status, 400);
    sys_resp_free(&tok);
    sys_http(p, "POST", "/_idem/v1/tokens", mallory,
             "{\"scene\":\"refund\",\"ttl_ms\":604800000}", 5000, &tok);
    assert_int_equal(tok.status, 400);
    assert_non_null(strstr(tok.m->body, "token_ttl_max"));
    sys_resp_free(&tok);
    const char *h[] = {"X-Subject: dave", th, NULL};
    const char *body = "{\"refund_no\":\"R-adm\",\"amount\":\"4.00\"}";
    /* The admin listener is no gateway. */
    sys_admin_http(a, "POST", "/refunds", body, 5000, &r);
    assert_int_equal(r.status, 404);
    sys_resp_free(&r);
    sys_http(p, "POST", "/refunds", h, body, 5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* The admin listener: no key, a wrong key, a read key, a write key. */
    sys_http(a, "GET", "/_idem/v1/records/refund/dave%2FR-adm", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.m->body, "urn:idem:unauthorized"));
    assert_string_equal(sys_header(&r, "WWW-Authenticate"), "Bearer realm=\"idem\"");
    sys_resp_free(&r);
    static const char *const wrong[] = {"Authorization: Bearer read-key-0123456789abcdef-012345678",
                                        NULL};
    sys_http(a, "GET", "/_idem/v1/metrics", wrong, NULL, 5000, &r);
    assert_int_equal(r.status, 401);
    sys_resp_free(&r);
    static const char *const reader[] = {"Authorization: bearer read-key-0123456789abcdef-0123456789",
                                         NULL};
    sys_http(a, "GET", "/_idem/v1/records/refund/dave%2FR-adm", reader, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"SUCCEEDED\""));
    sys_resp_free(&r);
    sys_http(a, "GET", "/_idem/v1/metrics", reader, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\nidem_admin_auth_failures_total 2\n"));
    sys_resp_free(&r);
    sys_http(a, "POST", "/_idem/v1/records/transition", reader,
             "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"from\":\"SUCCEEDED\","
             "\"to\":\"RELEASED\"}",
             5000, &r);
    assert_int_equal(r.status, 403);
    assert_non_null(strstr(r.m->body, "urn:idem:insufficient_scope"));
    sys_resp_free(&r);
    api_expect(a, "/_idem/v1/records/refund/dave%2FR-adm", NULL, 200, "\"state\":\"SUCCEEDED\"");
    api_expect(a, "/_idem/v1/records/transition",
               "{\"space\":\"refund\",\"key\":\"dave/R-adm\",\"from\":\"SUCCEEDED\","
               "\"to\":\"RELEASED\"}",
               200, "\"APPLIED\"");
    /* Where Prometheus looks by default, for a read key too; not on the
     * main listener. */
    sys_http(a, "GET", "/metrics", reader, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\nidem_admin_auth_failures_total 2\n"));
    sys_resp_free(&r);
    sys_http(p, "GET", "/metrics", NULL, NULL, 5000, &r);
    assert_null(r.m ? strstr(r.m->body, "idem_admin_auth_failures_total") : NULL);
    sys_resp_free(&r);
    /* SIGUSR1, what logrotate sends, is logged and ends nothing (the access
     * log here goes to stdout: nothing to reopen). */
    kill(gw.pid, SIGUSR1);
    sleep_ms(200);
    api_expect(a, "/_idem/v1/health", NULL, 200, "\"status\":\"ok\"");
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *text = sys_read_file(gw.log);
    assert_non_null(strstr(text, "admin: API key grafana (scope read) in use: GET"));
    assert_non_null(strstr(text, "admin: API key test (scope write) in use:"));
    assert_non_null(strstr(text, "SIGUSR1: the logs go to stdout and stderr"));
    assert_null(strstr(text, "read-key-0123456789abcdef")); /* never the key itself */
    free(text);
}

/* A connection to 127.0.0.1:port from the loopback address src (so that
 * the daemon sees several clients), or -1. */
static int connect_from(const char *src, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, src, &a.sin_addr);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

struct flood {
    int port, id;
    long requests;
    long issued, refused, other; /* 201, 429, anything else */
    pthread_t t;
};

/* requests token requests, each under a subject of its own, pipelined in
 * batches on one keep-alive connection; the answers counted by status. */
static void *flood_main(void *arg)
{
    struct flood *f = arg;
    enum { BATCH = 200 };
    static __thread char out[BATCH * 160], in[1 << 16];
    int fd = connect_from("127.0.0.1", f->port);
    assert_true(fd >= 0);
    size_t have = 0;
    for (long sent = 0; sent < f->requests;) {
        size_t n = 0;
        long batch = f->requests - sent < BATCH ? f->requests - sent : BATCH;
        for (long i = 0; i < batch; i++)
            n += (size_t)sprintf(out + n,
                                 "POST /_idem/v1/tokens HTTP/1.1\r\nHost: x\r\n"
                                 "X-Subject: flood-%d-%ld\r\nContent-Length: 18\r\n\r\n"
                                 "{\"scene\":\"refund\"}",
                                 f->id, sent + i);
        for (size_t off = 0; off < n;) {
            ssize_t w = send(fd, out + off, n - off, MSG_NOSIGNAL);
            assert_true(w > 0);
            off += (size_t)w;
        }
        sent += batch;
        /* Read the batch's answers: each a head with a Content-Length. */
        for (long got = 0; got < batch;) {
            char *end = memmem(in, have, "\r\n\r\n", 4);
            const char *cl = end ? memmem(in, (size_t)(end - in), "Content-Length: ", 16) : NULL;
            size_t whole = end && cl ? (size_t)(end + 4 - in) + (size_t)atol(cl + 16) : 0;
            if (!whole || whole > have) {
                ssize_t r = recv(fd, in + have, sizeof in - have, 0);
                if (r <= 0)
                    fail_msg("flood %d: connection closed after %ld answers", f->id,
                             sent - batch + got);
                have += (size_t)r;
                continue;
            }
            int status = atoi(in + 9);
            if (status == 201)
                f->issued++;
            else if (status == 429)
                f->refused++;
            else
                f->other++;
            memmove(in, in + whole, have - whole);
            have -= whole;
            got++;
        }
    }
    close(fd);
    return NULL;
}

/* One request from the loopback address src; its status, and the time it
 * took (ms) in *ms. */
static int timed_post(const char *src, int port, const char *req, double *ms)
{
    int64_t t0 = mono_us_test();
    int fd = connect_from(src, port);
    if (fd < 0)
        return -1;
    send(fd, req, strlen(req), MSG_NOSIGNAL);
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    close(fd);
    *ms = (double)(mono_us_test() - t0) / 1000.0;
    if (n < 12)
        return -1;
    buf[n] = '\0';
    return atoi(buf + 9);
}

/* A POST to the plain payment route, a key of its own, Connection: close. */
static void payment_request(char *req, size_t cap, const char *tag, int i)
{
    char body[64];
    snprintf(body, sizeof body, "{\"serial_no\":\"FL-%s-%04d\",\"amount\":\"1\"}", tag, i);
    snprintf(req, cap,
             "POST /callbacks/payment HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(body), body);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Idempotency-Key as the draft defines it, a Structured Field sf-string:
 * "k-1" and a bare k-1 are one key, escapes are read, parameters after it
 * are checked and ignored, a malformed field is 400 saying what is
 * wrong. */
static void test_idempotency_key_sf_string(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "access_log: off\nroutes:\n"
               "  - name: refund\n    match: { method: POST, path: /refunds }\n"
               "    upstream: @UP@\n    key: { header: Idempotency-Key }\n",
               "sf.db");
    long before = sys_stat(service.port, "executions");
    struct {
        const char *header;
        int status;
        const char *replayed, *problem;
    } cases[] = {
        {"Idempotency-Key: \"sf-1\"", 201, NULL, NULL},
        {"Idempotency-Key: sf-1", 201, "true", NULL}, /* the same key, bare */
        {"Idempotency-Key: \"sf\\\"2\"", 201, NULL, NULL},
        {"Idempotency-Key: \"sf-3", 400, NULL, "does not close it"},
        {"Idempotency-Key: \"sf-4\";a=1", 201, NULL, NULL},
        {"Idempotency-Key: sf-4", 201, "true", NULL}, /* parameters are no part of it */
        {"Idempotency-Key: \"sf-4\"; b;c=?1;d=-1.5;e=tok/x:y;f=:aGk=:;g=\"v;\\\"\"", 201,
         "true", NULL},
        {"Idempotency-Key: \"sf-5\" x", 400, NULL, "follows the quoted string"},
        {"Idempotency-Key: \"sf-5\";A=1", 400, NULL, "does not start with a name"},
        {"Idempotency-Key: \"sf-5\";a=1.", 400, NULL, "bare item"},
        {"Idempotency-Key: \"sf-5\";a=\"open", 400, NULL, "does not close it"},
        {"Idempotency-Key: \"sf\\x\"", 400, NULL, "escapes only"},
        {"Idempotency-Key: \"\"", 400, NULL, "key_missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[96];
        /* A replay's body is its key's first one. */
        size_t first = i;
        while (first > 0 && cases[first].replayed)
            first--;
        snprintf(body, sizeof body, "{\"refund_no\":\"SF-%zu\",\"amount\":\"1.00\"}", first);
        const char *h[] = {"Content-Type: application/json", cases[i].header, NULL};
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", h, body, 10000, &r);
        if (r.status != cases[i].status)
            fail_msg("%s: %d, not %d", cases[i].header, r.status, cases[i].status);
        if (cases[i].replayed)
            assert_non_null(sys_header(&r, "Idempotent-Replayed"));
        if (cases[i].problem && !strstr(r.m->body, cases[i].problem))
            fail_msg("%s: the problem does not say %s: %s", cases[i].header, cases[i].problem,
                     r.m->body);
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 3);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- signed callbacks ---- */

/* HMAC-SHA256 of a.b.c (the parts that are not NULL, joined by '.') under
 * key, as hex (base64 0) or base64, into out. OpenSSL's one-shot HMAC, not
 * the daemon's code. */
static void sign(const char *key, size_t key_len, const char *a, const char *b, const char *c,
                 int base64, char *out)
{
    char text[1024];
    snprintf(text, sizeof text, "%s%s%s%s%s", a, b ? "." : "", b ? b : "", c ? "." : "",
             c ? c : "");
    unsigned char mac[32];
    unsigned len = 0;
    HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)text, strlen(text), mac, &len);
    assert_int_equal(len, 32);
    if (base64) {
        EVP_EncodeBlock((unsigned char *)out, mac, 32);
        return;
    }
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", mac[i]);
}

enum { STRIPE, GITHUB, STANDARD, OWN };

/* The headers that sign body as scheme does, with key, at time t. */
static void signed_headers(int scheme, const char *key, size_t key_len, const char *body,
                           long long t, char h[3][512])
{
    char sig[128], ts[24];
    snprintf(ts, sizeof ts, "%lld", t);
    h[1][0] = h[2][0] = '\0';
    switch (scheme) {
    case STRIPE:
        sign(key, key_len, ts, body, NULL, 0, sig);
        /* Another v1 (an old secret's) and a v0 beside it, as Stripe sends. */
        snprintf(h[0], 512, "Stripe-Signature: t=%s,v1=%064d,v1=%s,v0=%064d", ts, 0, sig, 0);
        break;
    case GITHUB:
        sign(key, key_len, body, NULL, NULL, 0, sig);
        snprintf(h[0], 512, "X-Hub-Signature-256: sha256=%s", sig);
        break;
    case STANDARD:
        sign(key, key_len, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", ts, body, 1, sig);
        snprintf(h[0], 512, "webhook-signature: v1,bm90IHRoaXMgb25lIGF0IGFsbCwgbm8= v1,%s", sig);
        snprintf(h[1], 512, "webhook-id: msg_2KWPBgLlAfxdpx2AI54pPJ85f4W");
        snprintf(h[2], 512, "webhook-timestamp: %s", ts);
        break;
    default:
        sign(key, key_len, body, NULL, NULL, 1, sig);
        snprintf(h[0], 512, "X-Signature: hmac=%s", sig);
        break;
    }
}

static void post_signed(int port, int scheme, const char *key, size_t key_len, const char *body,
                        long long t, int status, const char *type, int replayed)
{
    char h[3][512];
    signed_headers(scheme, key, key_len, body, t, h);
    const char *hs[] = {h[0], h[1][0] ? h[1] : NULL, h[2][0] ? h[2] : NULL, NULL};
    struct sys_resp r;
    sys_http(port, "POST", "/refunds", hs, body, 5000, &r);
    if (r.status != status || (type && !strstr(r.m->body, type)))
        fail_msg("scheme %d, %s: %d %s, not %d %s", scheme, body, r.status,
                 r.m ? r.m->body : "", status, type ? type : "");
    if (replayed)
        assert_non_null(sys_header(&r, "Idempotent-Replayed"));
    else
        assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&r);
}

static char **read_lines(const char *path, size_t *n);
static void free_lines(char **lines, size_t n);

/* Every scheme: a forgery (the wrong secret) on a real event's key is 401
 * and leaves no record, so the genuine event then executes once and its
 * redeliveries replay; an unsigned request and an old timestamp are 401;
 * the second of two secrets (a rotation) is accepted. */
/* tombstone: past its retention a key is refused for a while (410), not
 * executed again, and after that it is new; a restart changes nothing. */
static void test_tombstone(void **state)
{
    (void)state;
    static const char routes[] = "routes:\n" REFUND_ROUTE
                                 "    retention: 1s\n"
                                 "    tombstone: 3s\n";
    struct proc gw;
    start_idem(&gw, routes, "tombstone.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"TB-1\",\"amount\":\"1.00\"}";
    int64_t t0 = test_mono_ms();
    post_expect(gw.port, body, 201, 0);
    post_expect(gw.port, body, 201, 1); /* within the retention: the replay */
    sleep_ms((int)(t0 + 2000 - test_mono_ms()));
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 410);
    assert_non_null(strstr(r.m->body, "urn:idem:key_expired"));
    assert_non_null(strstr(r.m->body, "was first used at"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    start_idem(&gw, routes, "tombstone.db");
    post_expect(gw.port, body, 410, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(metric(gw.admin_port,
                            "idem_requests_total{route=\"refund\",outcome=\"key_expired\"}"),
                     1);
    sleep_ms((int)(t0 + 4300 - test_mono_ms()));
    /* The tombstone is over: the key is new, and executes (the service's
     * own unique refund_no refuses it: its third defence, 409). */
    post_expect(gw.port, body, 409, 0);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- on_unknown_outcome: resolve ---- */

static const char resolve_routes[] =
    "routes:\n" REFUND_ROUTE
    "    upstream_timeout: 300ms\n"
    "    lease: 2s\n"
    "    on_unknown_outcome: resolve\n"
    "    resolve:\n"
    "      url: @UP@/refunds/{key}\n"
    "      after: 2s\n"
    "      backoff: [500ms]\n"
    "      executed: [200]\n"
    "      not_executed: [404]\n";

/* The record's state of key, as the JSON API reads it. */
static void record_state_of(int admin_port, const char *key, char *state, size_t cap)
{
    char target[256];
    struct sys_resp r;
    snprintf(target, sizeof target, "/_idem/v1/records/refund/%s", key);
    sys_admin_http(admin_port, "GET", target, NULL, 5000, &r);
    const char *at = r.status == 200 ? strstr(r.m->body, "\"state\":\"") : NULL;
    snprintf(state, cap, "%.*s", at ? (int)strcspn(at + 9, "\"") : 0, at ? at + 9 : "");
    sys_resp_free(&r);
}

/* Until key's record is in state, for at most ms. */
static void wait_state(int admin_port, const char *key, const char *state, int ms)
{
    char now[64] = "";
    for (int64_t end = test_mono_ms() + ms; test_mono_ms() < end; sleep_ms(100)) {
        record_state_of(admin_port, key, now, sizeof now);
        if (strcmp(now, state) == 0)
            return;
    }
    fail_msg("%s: %s after %d ms, %s expected", key, now, ms, state);
}

/* A request that timed out is not left to its lease: the service is asked
 * whether it executed. It did (the service finished after idem gave up):
 * the record completes with the status query's answer, with no retry, and
 * the retry then gets that answer; a crash between changes nothing, since
 * the question is the record's. It did not: the retry executes. */
static void test_resolve_unknown_outcomes(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, resolve_routes, "resolve.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 1000", NULL};
    static const char *const slow_fail[] = {"X-Delay-Ms: 1000", "X-Fail: 503", NULL};
    const char *executed = "{\"refund_no\":\"RS-1\",\"amount\":\"1.00\"}";
    const char *crashed = "{\"refund_no\":\"RS-2\",\"amount\":\"1.00\"}";
    const char *failed = "{\"refund_no\":\"RS-3\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", slow, executed, 5000, &r);
    assert_int_equal(r.status, 504);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    assert_true(json_integer_value(json_object_get(j, "epoch")) > 0);
    assert_non_null(json_string_value(json_object_get(j, "held_until")));
    json_decref(j);
    sys_resp_free(&r);
    /* A retry before the first question: 409, told when to come back. */
    sys_http(gw.port, "POST", "/refunds", NULL, executed, 5000, &r);
    assert_int_equal(r.status, 409);
    long wait = atol(sys_header(&r, "Retry-After"));
    if (wait < 1 || wait > 2)
        fail_msg("Retry-After: %ld, expected the 2 s until the first question", wait);
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/refunds", slow_fail, failed, 5000, &r);
    assert_int_equal(r.status, 504);
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/refunds", slow, crashed, 5000, &r);
    assert_int_equal(r.status, 504);
    sys_resp_free(&r);
    sys_stop(&gw, SIGKILL); /* RS-2's question is the next daemon's */
    start_idem(&gw, resolve_routes, "resolve.db");
    /* Nobody retries RS-1 or RS-2: the resolver asks, and they complete. */
    wait_state(gw.admin_port, "RS-1", "SUCCEEDED", 8000);
    wait_state(gw.admin_port, "RS-2", "SUCCEEDED", 8000);
    sys_http(gw.port, "POST", "/refunds", NULL, executed, 5000, &r);
    assert_int_equal(r.status, 200); /* the status query's answer, kept */
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_string_equal(sys_header(&r, "Idem-Resolved"), "true");
    assert_non_null(strstr(r.m->body, "\"refund_no\":\"RS-1\""));
    sys_resp_free(&r);
    /* RS-3 did not execute (the service said 503 after idem gave up): the
     * resolver released it, and the retry executes, once. */
    wait_state(gw.admin_port, "RS-3", "RELEASED", 8000);
    post_expect(gw.port, failed, 201, 0);
    /* Three calls that timed out, and one retry: nothing ran twice. */
    assert_int_equal(sys_stat(service.port, "executions") - before, 4);
    assert_int_equal(metric(gw.admin_port,
                            "idem_resolutions_total{route=\"refund\",verdict=\"executed\"}"),
                     2);
    assert_int_equal(metric(gw.admin_port,
                            "idem_resolutions_total{route=\"refund\",verdict=\"not_executed\"}"),
                     1);
    /* A space with a resolve route holds its unknown outcomes: the console
     * asks records/held for it. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/spaces", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"holds\":true"));
    sys_resp_free(&r);
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/held?space=refund", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    /* Each question has its access-log line (stderr here). */
    char *log = sys_read_file(gw.log);
    assert_non_null(strstr(log, "\"kind\":\"question\",\"route\":\"refund\",\"key\":\"RS-1\""));
    const char *rs3 = strstr(log, "\"kind\":\"question\",\"route\":\"refund\",\"key\":\"RS-3\"");
    assert_non_null(rs3);
    assert_non_null(strstr(rs3, "\"verdict\":\"not_executed\",\"status\":404"));
    free(log);
}

/* The status URL stops answering (the service frozen, SIGSTOP) while a
 * refund it will make is pending: every question times out, and the
 * retries get 409 with a Retry-After that grows with the backoff (1 s,
 * 2 s, 4 s); once the service is back the next question finds the refund
 * made, and the key completes with it. Nothing executes twice. */
static void test_resolve_status_url_down(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "routes:\n" REFUND_ROUTE "    upstream_timeout: 300ms\n"
               "    lease: 2s\n"
               "    on_unknown_outcome: resolve\n"
               "    resolve:\n"
               "      url: @UP@/refunds/{key}\n"
               "      after: 1s\n"
               "      backoff: [1s, 2s, 4s]\n"
               "      executed: [200]\n"
               "      not_executed: [404]\n",
               "resolve-down.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 700", NULL};
    const char *body = "{\"refund_no\":\"RD-1\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", slow, body, 5000, &r);
    assert_int_equal(r.status, 504);
    sys_resp_free(&r);
    kill(service.pid, SIGSTOP); /* the refund not made yet; no question answered */
    /* Held for 1 s (after), shorter than its lease (2 s): held all the
     * same, and listed as such. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/held?space=refund", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    if (!strstr(r.m->body, "\"key\":\"RD-1\"") || !strstr(r.m->body, "\"held\":true"))
        fail_msg("RD-1 held for its first question, not listed: %s", r.m->body);
    sys_resp_free(&r);
    long first = 0, most = 0;
    int held = 0;
    for (int64_t end = test_mono_ms() + 7000; test_mono_ms() < end; sleep_ms(250)) {
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
        if (r.status != 409)
            fail_msg("a retry while the service is down: %d %s", r.status,
                     r.m ? r.m->body : "");
        const char *ra = sys_header(&r, "Retry-After");
        assert_non_null(ra);
        long secs = strtol(ra, NULL, 10);
        assert_true(secs >= 1 && secs <= 5);
        if (!held++)
            first = secs;
        most = secs > most ? secs : most;
        sys_resp_free(&r);
    }
    assert_true(first <= 1);
    assert_true(most >= 3); /* the 4 s wait after the third question */
    /* The held claim says why, with the service's last answer. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/held?space=refund", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    json_t *list = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    sys_resp_free(&r);
    json_t *it = json_array_get(json_object_get(list, "records"), 0);
    const char *why = json_string_value(json_object_get(it, "reason"));
    if (!why || !strstr(why, "being resolved: asked again in ") || !strstr(why, "; status query "))
        fail_msg("RD-1 held, resolving, and said: %s", why ? why : "(nothing)");
    json_decref(list);
    kill(service.pid, SIGCONT); /* it makes the refund, and answers again */
    wait_state(gw.admin_port, "RD-1", "SUCCEEDED", 10000);
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(sys_header(&r, "Idem-Resolved"), "true");
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_true(metric(gw.admin_port,
                       "idem_resolutions_total{route=\"refund\",verdict=\"unanswered\"}") >= 3);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- states: the business's machine on a route ---- */

static const char states_routes[] =
    "routes:\n"
    "  - name: refund-status\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: @UP@\n"
    "    key: { json: refund_no }\n"
    "    in_flight: wait\n"
    "    wait_timeout: 10s\n"
    "    states:\n"
    "      field: { json: status }\n"
    "      initial: CREATED\n"
    "      transitions:\n"
    "        CREATED: [PROCESSING, SUCCESS, FAILED]\n"
    "        PROCESSING: [SUCCESS, FAILED]\n"
    "        SUCCESS: [REFUNDED_BACK]\n";

static void state_body(char *out, size_t cap, const char *key, const char *status)
{
    snprintf(out, cap, "{\"refund_no\":\"%s\",\"amount\":\"1.00\",\"status\":\"%s\"}", key,
             status);
}

/* POST the event moving key to status; check the status, whether it is a
 * replay, and that the body holds want (NULL: not checked). */
static void post_state(int port, const char *key, const char *status, int want_status,
                       int replayed, const char *want)
{
    char body[160];
    struct sys_resp r;
    state_body(body, sizeof body, key, status);
    sys_http(port, "POST", "/refunds", NULL, body, 5000, &r);
    if (r.status != want_status || (want && !strstr(r.m->body, want)))
        fail_msg("%s -> %s: %d %.*s, expected %d with %s", key, status, r.status,
                 (int)r.m->body_len, r.m->body, want_status, want ? want : "any body");
    if (replayed >= 0)
        assert_int_equal(sys_header(&r, "Idempotent-Replayed") != NULL, replayed);
    sys_resp_free(&r);
}

static void test_states_storm(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, states_routes, "states-storm.db");
    long before = sys_stat(service.port, "executions");
    static const char *const hdrs[] = {"X-Delay-Ms: 200", NULL};
    char success[160], failed[160];
    state_body(success, sizeof success, "RF-storm", "SUCCESS");
    state_body(failed, sizeof failed, "RF-storm", "FAILED");
    /* 100 at once: the even ones say SUCCESS, the odd ones FAILED. */
    struct storm *both = calloc(1, sizeof *both);
    both->port = gw.port;
    both->headers = hdrs;
    both->body = success;
    both->body2 = failed;
    test_run_threads(100, one_post_mixed, both);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    int winner = -1;
    for (int i = 0; i < 100; i++)
        if (both->resp[i].status == 200 && !sys_header(&both->resp[i], "Idempotent-Replayed"))
            winner = winner == -1 ? i : -2;
    assert_true(winner >= 0); /* exactly one executed answer */
    const char *won = winner % 2 ? "FAILED" : "SUCCESS";
    int replays = 0, conflicts = 0;
    for (int i = 0; i < 100; i++) {
        struct sys_resp *r = &both->resp[i];
        if (i == winner)
            continue;
        if (i % 2 == winner % 2) {
            /* The winner's duplicates: its answer, byte for byte. */
            assert_int_equal(r->status, 200);
            assert_string_equal(sys_header(r, "Idempotent-Replayed"), "true");
            assert_string_equal(sys_header(r, "Idem-State"), won);
            assert_int_equal(r->m->body_len, both->resp[winner].m->body_len);
            assert_memory_equal(r->m->body, both->resp[winner].m->body, r->m->body_len);
            replays++;
        } else {
            assert_int_equal(r->status, 409);
            assert_non_null(strstr(r->m->body, "urn:idem:transition_conflict"));
            assert_string_equal(sys_header(r, "Idem-State"), won);
            conflicts++;
        }
    }
    assert_int_equal(replays, 49);
    assert_int_equal(conflicts, 50);
    assert_non_null(strstr(both->resp[winner].m->body, "\"state_from\":\"CREATED\""));
    assert_int_equal(metric(gw.admin_port, "idem_transition_conflicts_total{route=\"refund-status\"}"),
                     50);
    assert_int_equal(metric(gw.admin_port,
                            "idem_requests_total{route=\"refund-status\",outcome=\"conflict\"}"),
                     50);
    for (int i = 0; i < 100; i++)
        sys_resp_free(&both->resp[i]);
    free(both);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_states_out_of_order(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, states_routes, "states-order.db");
    long before = sys_stat(service.port, "executions");
    post_state(gw.port, "RF-1", "SUCCESS", 200, 0, "\"state_from\":\"CREATED\"");
    /* Behind SUCCESS: answered, not forwarded. */
    post_state(gw.port, "RF-1", "PROCESSING", 200, 0,
               "{\"outcome\":\"stale\",\"key\":\"RF-1\",\"state\":\"SUCCESS\","
               "\"event\":\"PROCESSING\"}");
    post_state(gw.port, "RF-1", "CREATED", 200, 0, "\"outcome\":\"stale\"");
    post_state(gw.port, "RF-1", "REFUNDED_BACK", 200, 0,
               "\"state_from\":\"SUCCESS\",\"state_to\":\"REFUNDED_BACK\"");
    post_state(gw.port, "RF-1", "SUCCESS", 200, 0, "\"state\":\"REFUNDED_BACK\"");
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(metric(gw.admin_port, "idem_stale_events_total{route=\"refund-status\"}"), 3);
    /* Not a state of the route, or none at all: 422, not forwarded. */
    post_state(gw.port, "RF-1", "NOPE", 422, 0, "urn:idem:unknown_state");
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"RF-1\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 422);
    assert_non_null(strstr(r.m->body, "the state is missing: expected the JSON field status"));
    sys_resp_free(&r);
    /* A failed move leaves the key where it was: RF-2 stays CREATED. */
    char body[160];
    static const char *const fail503[] = {"X-Fail: 503", NULL};
    state_body(body, sizeof body, "RF-2", "PROCESSING");
    sys_http(gw.port, "POST", "/refunds", fail503, body, 5000, &r);
    assert_int_equal(r.status, 503);
    sys_resp_free(&r);
    post_state(gw.port, "RF-2", "PROCESSING", 200, 0, "\"state_from\":\"CREATED\"");
    assert_int_equal(sys_stat(service.port, "executions") - before, 4);

    /* kill -9, and the same file: the states survive it. */
    sys_stop(&gw, SIGKILL);
    start_idem(&gw, states_routes, "states-order.db");
    post_state(gw.port, "RF-1", "REFUNDED_BACK", 200, 1, "\"state_to\":\"REFUNDED_BACK\"");
    post_state(gw.port, "RF-1", "FAILED", 409, 0, "urn:idem:transition_conflict");
    post_state(gw.port, "RF-2", "FAILED", 200, 0, "\"state_from\":\"PROCESSING\"");
    assert_int_equal(sys_stat(service.port, "executions") - before, 5);
    /* The record says where the key is, and how it got there. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund-status/RF-1", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"state:REFUNDED_BACK\""));
    json_t *doc = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    json_t *rec = json_object_get(doc, "record");
    json_t *steps = json_object_get(rec, "steps");
    assert_int_equal(json_array_size(steps), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(steps, 0), "state")),
                        "SUCCESS");
    assert_string_equal(json_string_value(json_object_get(json_array_get(steps, 1), "state")),
                        "REFUNDED_BACK");
    /* The result is the answer kept with REFUNDED_BACK, as the gateway stored it. */
    assert_non_null(strstr(json_string_value(json_object_get(rec, "result")), "IDEM1 200"));
    json_decref(doc);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void test_signed_callbacks(void **state)
{
    (void)state;
    static const char secret1[] = "sk-one-0123456789abcdef", secret2[] = "sk-two-0123456789abcdef";
    /* Standard Webhooks' secrets are whsec_ and the base64 of the key. */
    static const char raw1[] = "std-one-0123456789ab", raw2[] = "std-two-0123456789ab";
    char wh1[64] = "whsec_", wh2[64] = "whsec_";
    EVP_EncodeBlock((unsigned char *)wh1 + 6, (const unsigned char *)raw1, sizeof raw1 - 1);
    EVP_EncodeBlock((unsigned char *)wh2 + 6, (const unsigned char *)raw2, sizeof raw2 - 1);
    static const char *const names[] = {"stripe", "github", "standard_webhooks", "hmac_sha256"};
    static const char *const extra[] = {"", "", "", "      header: X-Signature\n"
                                                    "      encoding: base64\n"
                                                    "      prefix: hmac=\n"};
    char envfile[4300];
    snprintf(envfile, sizeof envfile, "%s/second.secret", dir);
    for (int scheme = STRIPE; scheme <= OWN; scheme++) {
        int std = scheme == STANDARD;
        setenv("IDEM_TEST_SIGNING_SECRET", std ? wh1 : secret1, 1);
        char second[80];
        snprintf(second, sizeof second, "%s\n", std ? wh2 : secret2);
        sys_write_file(envfile, second);
        const char *k1 = std ? raw1 : secret1, *k2 = std ? raw2 : secret2;
        size_t l1 = strlen(k1), l2 = strlen(k2);
        char routes[16384], db[32], alog[4300];
        snprintf(alog, sizeof alog, "%s/signed-%d.access.log", dir, scheme);
        snprintf(routes, sizeof routes,
                 "access_log: { to: %s }\nroutes:\n" REFUND_ROUTE
                 "    signature:\n"
                 "      scheme: %s\n"
                 "      secrets: [{ env: IDEM_TEST_SIGNING_SECRET }, { file: %s }]\n%s",
                 alog, names[scheme], envfile, extra[scheme]);
        snprintf(db, sizeof db, "signed-%d.db", scheme);
        struct proc gw;
        start_idem(&gw, routes, db);
        long before = sys_stat(service.port, "executions");
        long long now = (long long)time(NULL);
        char body[96];
        snprintf(body, sizeof body, "{\"refund_no\":\"SIG-%d\",\"amount\":\"1.00\"}", scheme);
        static const char forger[] = "not-the-secret-0123456789";
        for (int i = 0; i < 2; i++) /* the forger first, twice */
            post_signed(gw.port, scheme, forger, strlen(forger), body, now, 401,
                        "urn:idem:signature_invalid", 0);
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r); /* not signed at all */
        assert_int_equal(r.status, 401);
        assert_non_null(strstr(r.m->body, "is not signed"));
        sys_resp_free(&r);
        assert_int_equal(sys_stat(service.port, "executions") - before, 0);
        post_signed(gw.port, scheme, k1, l1, body, now, 201, NULL, 0);
        post_signed(gw.port, scheme, k1, l1, body, now + 1, 201, NULL, 1);
        post_signed(gw.port, scheme, k2, l2, body, now, 201, NULL, 1); /* the second secret */
        /* A forged redelivery of the executed event is still refused. */
        post_signed(gw.port, scheme, forger, strlen(forger), body, now, 401,
                    "urn:idem:signature_invalid", 0);
        char body2[96];
        snprintf(body2, sizeof body2, "{\"refund_no\":\"SIG-%d-b\",\"amount\":\"1.00\"}", scheme);
        if (scheme == STRIPE || std) {
            /* A genuine signature from ten minutes ago: a replayed request. */
            post_signed(gw.port, scheme, k1, l1, body2, now - 600, 401,
                        "urn:idem:signature_expired", 0);
            post_signed(gw.port, scheme, forger, strlen(forger), body2, now - 600, 401,
                        "urn:idem:signature_invalid", 0);
        }
        post_signed(gw.port, scheme, k2, l2, body2, now, 201, NULL, 0);
        assert_int_equal(sys_stat(service.port, "executions") - before, 2);
        /* The refusals are counted, by what became of them. */
        sys_admin_http(gw.admin_port, "GET", "/_idem/v1/metrics", NULL, 5000, &r);
        char want[128];
        snprintf(want, sizeof want,
                 "idem_requests_total{route=\"refund\",outcome=\"signature_refused\"} %d",
                 scheme == STRIPE || std ? 6 : 4);
        if (!strstr(r.m->body, want))
            fail_msg("%s: no \"%s\" in the metrics", names[scheme], want);
        sys_resp_free(&r);
        assert_int_equal(sys_stop(&gw, SIGTERM), 0);
        /* And in the access log, each refusal by its type. */
        size_t n, invalid = 0, expired = 0;
        char **lines = read_lines(alog, &n);
        for (size_t i = 0; i < n; i++) {
            invalid += strstr(lines[i], "\"outcome\":\"signature_refused\",\"problem\":"
                                        "\"signature_invalid\",\"status\":401") != NULL;
            expired += strstr(lines[i], "\"outcome\":\"signature_refused\",\"problem\":"
                                        "\"signature_expired\",\"status\":401") != NULL;
        }
        free_lines(lines, n);
        assert_int_equal(invalid, scheme == STRIPE || std ? 5 : 4);
        assert_int_equal(expired, scheme == STRIPE || std ? 1 : 0);
    }
    unsetenv("IDEM_TEST_SIGNING_SECRET");
}

/* An RSA-SHA256 signature of text by key, base64, into out (1024 bytes). */
static void rsa_sign(EVP_PKEY *key, const char *text, char *out)
{
    unsigned char sig[512];
    size_t len = sizeof sig;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    assert_int_equal(EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, key), 1);
    assert_int_equal(EVP_DigestSign(ctx, sig, &len, (const unsigned char *)text, strlen(text)), 1);
    EVP_MD_CTX_free(ctx);
    EVP_EncodeBlock((unsigned char *)out, sig, (int)len);
}

/* A fresh RSA key, its public half written to dir/name as PEM. */
static EVP_PKEY *rsa_key(const char *name, char *path, size_t cap)
{
    EVP_PKEY *key = EVP_RSA_gen(2048);
    assert_non_null(key);
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(PEM_write_PUBKEY(f, key), 1);
    fclose(f);
    return key;
}

/* A WeChat Pay refund notification: its resource encrypted under the
 * APIv3 key (AES-256-GCM, the tag last), the whole body signed. */
static void wechat_notify(int port, EVP_PKEY *key, const char *apiv3, const char *no,
                          const char *status, int want_status, const char *want)
{
    static unsigned counter;
    char plain[160], nonce[16], b64[512], body[1024], text[1200], sig[1024], h[4][1200];
    unsigned char ct[256];
    int len = 0, fin = 0;
    snprintf(plain, sizeof plain, "{\"out_refund_no\":\"%s\",\"refund_status\":\"%s\"}", no,
             status);
    snprintf(nonce, sizeof nonce, "n0nce%07u", ++counter);
    EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
    assert_int_equal(EVP_EncryptInit_ex(x, EVP_aes_256_gcm(), NULL, (const unsigned char *)apiv3,
                                        (const unsigned char *)nonce), 1);
    assert_int_equal(EVP_EncryptUpdate(x, NULL, &len, (const unsigned char *)"refund", 6), 1);
    assert_int_equal(EVP_EncryptUpdate(x, ct, &len, (const unsigned char *)plain,
                                       (int)strlen(plain)), 1);
    assert_int_equal(EVP_EncryptFinal_ex(x, ct + len, &fin), 1);
    assert_int_equal(EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_GET_TAG, 16, ct + len + fin), 1);
    EVP_CIPHER_CTX_free(x);
    EVP_EncodeBlock((unsigned char *)b64, ct, len + fin + 16);
    /* refund_no and amount: what the test's service reads. */
    snprintf(body, sizeof body,
             "{\"id\":\"EV-%u\",\"event_type\":\"REFUND.%s\",\"refund_no\":\"%s\","
             "\"amount\":\"1.00\",\"resource\":{\"algorithm\":\"AEAD_AES_256_GCM\","
             "\"ciphertext\":\"%s\",\"nonce\":\"%s\",\"associated_data\":\"refund\","
             "\"original_type\":\"refund\"}}",
             counter, status, no, b64, nonce);
    long long t = (long long)time(NULL);
    snprintf(text, sizeof text, "%lld\n%s\n%s\n", t, nonce, body);
    rsa_sign(key, text, sig);
    snprintf(h[0], sizeof h[0], "Wechatpay-Timestamp: %lld", t);
    snprintf(h[1], sizeof h[1], "Wechatpay-Nonce: %s", nonce);
    snprintf(h[2], sizeof h[2], "Wechatpay-Signature: %s", sig);
    snprintf(h[3], sizeof h[3], "Wechatpay-Serial: SERIAL-A");
    const char *hs[] = {h[0], h[1], h[2], h[3], NULL};
    struct sys_resp r;
    sys_http(port, "POST", "/refunds", hs, body, 5000, &r);
    if (r.status != want_status || (want && !strstr(r.m->body, want)))
        fail_msg("%s %s: %d %.*s, expected %d with %s", no, status, r.status, (int)r.m->body_len,
                 r.m->body, want_status, want ? want : "any body");
    sys_resp_free(&r);
}

/* The key and the state read from the decrypted resource: a WeChat Pay
 * refund's notifications keyed by out_refund_no, moved by refund_status. */
static void test_wechatpay_resource(void **state)
{
    (void)state;
    static const char apiv3[] = "0123456789abcdef0123456789ABCDEF";
    setenv("IDEM_TEST_APIV3_KEY", apiv3, 1);
    char pem_a[4300], routes[8192];
    EVP_PKEY *a = rsa_key("wx-resource.pem", pem_a, sizeof pem_a);
    snprintf(routes, sizeof routes,
             "routes:\n"
             "  - name: wechat-refund\n    match: { method: POST, path: /refunds }\n"
             "    upstream: @UP@\n"
             "    key: { wechatpay_resource: out_refund_no }\n"
             "    fingerprint: none\n"
             "    signature:\n      scheme: wechatpay_v3\n"
             "      public_keys: [{ file: %s, serial: SERIAL-A }]\n"
             "      apiv3_key: { env: IDEM_TEST_APIV3_KEY }\n"
             "    states:\n      field: { wechatpay_resource: refund_status }\n"
             "      initial: PROCESSING\n"
             "      transitions: { PROCESSING: [SUCCESS, CLOSED, ABNORMAL] }\n",
             pem_a);
    struct proc gw;
    start_idem(&gw, routes, "wechat-resource.db");
    long before = sys_stat(service.port, "executions");
    wechat_notify(gw.port, a, apiv3, "WXR-1", "SUCCESS", 200, "\"state_from\":\"PROCESSING\"");
    wechat_notify(gw.port, a, apiv3, "WXR-1", "SUCCESS", 200, "\"state_to\":\"SUCCESS\"");
    wechat_notify(gw.port, a, apiv3, "WXR-1", "CLOSED", 409, "urn:idem:transition_conflict");
    /* Encrypted under another key (and signed: a leaked signing key, or a
     * misconfigured merchant): it does not decrypt, nothing executes. */
    wechat_notify(gw.port, a, "ffffffffffffffffffffffffffffffff", "WXR-2", "SUCCESS", 400,
                  "does not decrypt with the route's APIv3 key");
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    struct sys_resp r;
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/wechat-refund/WXR-1", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"state:SUCCESS\""));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    EVP_PKEY_free(a);
}

/* The RSA schemes, with keys made here: WeChat Pay v3 (the key chosen by
 * the serial the request names; two keys, as during a rotation) and
 * Alipay's RSA2 (a form, its fields sorted). A forgery signed with another
 * key is 401 and leaves no record, the genuine call then executes once and
 * replays; a stale WeChat Pay timestamp is signature_expired. */
static void test_signed_callbacks_rsa(void **state)
{
    (void)state;
    char pem_a[4300], pem_b[4300], pem_x[4300];
    EVP_PKEY *a = rsa_key("wx-a.pem", pem_a, sizeof pem_a);
    EVP_PKEY *b = rsa_key("wx-b.pem", pem_b, sizeof pem_b);
    EVP_PKEY *forger = rsa_key("forger.pem", pem_x, sizeof pem_x);
    char routes[16384];
    snprintf(routes, sizeof routes,
             "routes:\n"
             "  - name: wechat\n    match: { method: POST, path: /refunds }\n"
             "    upstream: @UP@\n    key: { json: refund_no }\n"
             "    signature:\n      scheme: wechatpay_v3\n"
             "      public_keys: [{ file: %s, serial: SERIAL-A }, { file: %s, serial: SERIAL-B }]\n"
             "  - name: alipay\n    match: { method: POST, path: /payments }\n"
             "    upstream: @UP@\n    key: { form: out_trade_no }\n"
             "    signature: { scheme: alipay_rsa2, public_keys: [{ file: %s }] }\n",
             pem_a, pem_b, pem_a);
    struct proc gw;
    start_idem(&gw, routes, "signed-rsa.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"WX-1\",\"amount\":\"1.00\"}";
    long long now = (long long)time(NULL);
    struct {
        EVP_PKEY *key;
        const char *serial;
        long long t;
        int status;
        const char *type;
        int replayed;
    } wx[] = {
        {forger, "SERIAL-A", now, 401, "urn:idem:signature_invalid", 0},
        {a, "SERIAL-B", now, 401, "urn:idem:signature_invalid", 0}, /* the wrong key's serial */
        {a, "SERIAL-C", now, 401, "names no public key", 0},
        {a, "SERIAL-A", now - 900, 401, "urn:idem:signature_expired", 0},
        {a, "SERIAL-A", now, 201, NULL, 0},
        {b, "SERIAL-B", now, 201, NULL, 1}, /* the rotated key: a redelivery */
    };
    for (size_t i = 0; i < sizeof wx / sizeof wx[0]; i++) {
        char text[512], sig[1024], h[4][1200];
        snprintf(text, sizeof text, "%lld\nnonce-%zu\n%s\n", wx[i].t, i, body);
        rsa_sign(wx[i].key, text, sig);
        snprintf(h[0], sizeof h[0], "Wechatpay-Timestamp: %lld", wx[i].t);
        snprintf(h[1], sizeof h[1], "Wechatpay-Nonce: nonce-%zu", i);
        snprintf(h[2], sizeof h[2], "Wechatpay-Signature: %s", sig);
        snprintf(h[3], sizeof h[3], "Wechatpay-Serial: %s", wx[i].serial);
        const char *hs[] = {h[0], h[1], h[2], h[3], NULL};
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", hs, body, 5000, &r);
        if (r.status != wx[i].status || (wx[i].type && !strstr(r.m->body, wx[i].type)))
            fail_msg("wechatpay case %zu: %d %s", i, r.status, r.m ? r.m->body : "");
        if (wx[i].replayed)
            assert_non_null(sys_header(&r, "Idempotent-Replayed"));
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);

    /* Alipay: the fields but sign and sign_type, sorted, as k=v&k=v. */
    const char *signed_text = "notify_id=N-1&out_trade_no=T 1&trade_status=TRADE_SUCCESS";
    for (int i = 0; i < 4; i++) {
        char sig[1024], enc[3200], form[4000];
        rsa_sign(i == 0 ? forger : a, signed_text, sig);
        size_t o = 0; /* the signature, %-escaped as a form value */
        for (const char *p = sig; *p; p++)
            o += (size_t)(isalnum((unsigned char)*p) ? sprintf(enc + o, "%c", *p)
                                                     : sprintf(enc + o, "%%%02X", *p));
        snprintf(form, sizeof form,
                 "trade_status=TRADE_SUCCESS&sign_type=RSA2&out_trade_no=T+1&empty=&"
                 "sign=%s&notify_id=N-1",
                 enc);
        const char *hs[] = {"Content-Type: application/x-www-form-urlencoded", NULL};
        struct sys_resp r;
        sys_http(gw.port, "POST", "/payments", hs, i == 3 ? "out_trade_no=T+1&sign=" : form, 5000,
                 &r);
        /* The service answers 400 to a form (it takes JSON), kept as the
         * key's answer: the genuine notify reached it, the replay says so. */
        int want = i == 0 || i == 3 ? 401 : 400;
        if (r.status != want)
            fail_msg("alipay case %d: %d %s", i, r.status, r.m ? r.m->body : "");
        if (i == 2)
            assert_non_null(sys_header(&r, "Idempotent-Replayed"));
        if (i == 1)
            assert_null(sys_header(&r, "Idempotent-Replayed"));
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    EVP_PKEY_free(a);
    EVP_PKEY_free(b);
    EVP_PKEY_free(forger);
}

/* key_required: false: a request without the key goes to the route's
 * upstream unguarded (each one executes), counted and logged as unkeyed;
 * one with the key is guarded as ever. */
static void test_key_optional(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "routes:\n"
               "  - name: refund\n    match: { method: POST, path: /refunds }\n"
               "    upstream: @UP@\n    key: { header: Idempotency-Key }\n"
               "    key_required: false\n",
               "optional.db");
    long before = sys_stat(service.port, "executions");
    const char *bare[] = {"Content-Type: application/json", NULL};
    const char *keyed[] = {"Content-Type: application/json", "Idempotency-Key: opt-1", NULL};
    const char *bodies[] = {"{\"refund_no\":\"OPT-1\",\"amount\":\"1.00\"}",
                            "{\"refund_no\":\"OPT-2\",\"amount\":\"1.00\"}"};
    for (int i = 0; i < 2; i++) {
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", bare, bodies[i], 10000, &r);
        assert_int_equal(r.status, 201);
        assert_null(sys_header(&r, "Idempotent-Replayed"));
        sys_resp_free(&r);
    }
    for (int i = 0; i < 2; i++) {
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", keyed, "{\"refund_no\":\"OPT-3\",\"amount\":\"1.00\"}",
                 10000, &r);
        assert_int_equal(r.status, 201);
        if (i == 1)
            assert_non_null(sys_header(&r, "Idempotent-Replayed"));
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 3);
    struct sys_resp m;
    sys_admin_http(gw.admin_port, "GET", "/metrics", NULL, 5000, &m);
    assert_int_equal(m.status, 200);
    assert_non_null(strstr(m.m->body, "idem_requests_total{route=\"refund\",outcome=\"unkeyed\"} 2\n"));
    sys_resp_free(&m);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *text = sys_read_file(gw.log);
    assert_non_null(strstr(text, "\"outcome\":\"unkeyed\""));
    free(text);
}

/* Every answer has one Date: the upstream's, or Idem's own on what it makes
 * (problems, the JSON API) and on replays, whose stored headers have none. */
static int date_fields(const struct sys_resp *r)
{
    int n = 0;
    for (size_t i = 0; r->m && i < r->m->header_count; i++)
        n += strcasecmp(r->m->headers[i].name, "date") == 0;
    return n;
}

static void test_date_on_every_answer(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, "access_log: off\nroutes:\n" REFUND_ROUTE, "date.db");
    const char *h[] = {"Content-Type: application/json", NULL};
    const char *bodies[] = {"{\"refund_no\":\"DT-1\",\"amount\":\"1.00\"}", /* executed */
                            "{\"refund_no\":\"DT-1\",\"amount\":\"1.00\"}", /* replayed */
                            "{\"amount\":\"1.00\"}"};                      /* 400 */
    const int want[] = {201, 201, 400};
    for (int i = 0; i < 3; i++) {
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", h, bodies[i], 10000, &r);
        assert_int_equal(r.status, want[i]);
        assert_int_equal(date_fields(&r), 1);
        const char *d = sys_header(&r, "Date");
        assert_non_null(d);
        assert_non_null(strstr(d, " GMT"));
        sys_resp_free(&r);
    }
    struct sys_resp r;
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 10000, &r);
    assert_int_equal(r.status, 200);
    assert_int_equal(date_fields(&r), 1);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Signals that keep coming while the daemon shuts down (a supervisor's
 * SIGTERMs, logrotate's SIGUSR1, a reload's SIGHUP): each is handled or
 * ignored, and the daemon still exits 0. Before, one that came after the
 * signal events were freed took the default action: the daemon was
 * killed (143, 129 or 138) at the end of a clean stop. Ten rounds. */
static void test_signals_during_shutdown(void **state)
{
    (void)state;
    for (int round = 0; round < 10; round++) {
        struct proc gw;
        char db[32];
        snprintf(db, sizeof db, "hammer-%d.db", round);
        start_idem(&gw, "routes:\n" REFUND_ROUTE, db);
        int status = sys_stop_hammered(&gw);
        if (status != 0)
            fail_msg("round %d: idem serve exited %d under signals during its shutdown",
                     round, status);
    }
}

/* The access log: a line per request, whole and parseable, each field what
 * the gateway made of it; what a client chose (a request id with quotes and
 * a line separator, a subject with a bidi override) escaped, never a line
 * of its own; the subject hashed; the query left out; and on SIGUSR1 the
 * file opened again at its path (logrotate's postrotate). */
static char **read_lines(const char *path, size_t *n)
{
    char *text = sys_read_file(path);
    char **lines = calloc(64, sizeof *lines);
    *n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l && *n < 64;
         l = strtok_r(NULL, "\n", &save))
        lines[(*n)++] = strdup(l);
    free(text);
    return lines;
}

static void free_lines(char **lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
}

static void post_refund(int port, const char *body, const char *extra_header, int want)
{
    const char *h[] = {"Content-Type: application/json", extra_header, NULL};
    struct sys_resp r;
    sys_http(port, "POST", "/refunds?token=secret-in-query", h, body, 10000, &r);
    assert_int_equal(r.status, want);
    sys_resp_free(&r);
}

/* The line of lines[0..n) that holds needle; fails if none does. Each
 * loop writes its own lines at the end of its turn, so requests served by
 * two loops may be logged in either order. */
static const char *line_with(char **lines, size_t n, const char *needle)
{
    for (size_t i = 0; i < n; i++)
        if (strstr(lines[i], needle))
            return lines[i];
    fail_msg("no access log line holds %s", needle);
    return NULL;
}

static void test_access_log(void **state)
{
    (void)state;
    char log[4200], routes[8192];
    snprintf(log, sizeof log, "%s/access-%d.log", dir, config_seq + 1);
    snprintf(routes, sizeof routes, "access_log: { to: %s }\nroutes:\n" REFUND_ROUTE, log);
    struct proc gw;
    start_idem(&gw, routes, "access.db");
    post_refund(gw.port, "{\"refund_no\":\"AL-1\",\"amount\":\"1.00\"}",
                "X-Request-Id: a\"b\\c\xe2\x80\xa8" "d", 201);
    post_refund(gw.port, "{\"refund_no\":\"AL-1\",\"amount\":\"1.00\"}",
                "X-Subject: mallory\xe2\x80\xae" "evil", 201);
    post_refund(gw.port, "{\"amount\":\"1.00\"}", NULL, 400);
    sleep_ms(200); /* a loop's lines go out at the end of its turn */
    size_t n;
    char **lines = read_lines(log, &n);
    assert_int_equal(n, 3);
    /* The verdicts as the metrics name them; a refusal's problem beside. */
    const char *want_outcome[] = {"executed", "replayed", "key_invalid"};
    for (size_t i = 0; i < n; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"outcome\":\"%s\"", want_outcome[i]);
        const char *line = line_with(lines, n, needle);
        for (const unsigned char *c = (const unsigned char *)line; *c; c++)
            assert_true(*c >= 0x20 && *c < 0x7f); /* ASCII, one line */
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        if (!j)
            fail_msg("line %zu is not JSON (%s): %s", i, err.text, line);
        assert_string_equal(json_string_value(json_object_get(j, "outcome")), want_outcome[i]);
        if (i == 2)
            assert_string_equal(json_string_value(json_object_get(j, "problem")), "key_missing");
        assert_string_equal(json_string_value(json_object_get(j, "route")), "refund");
        assert_string_equal(json_string_value(json_object_get(j, "path")), "/refunds");
        assert_true(json_is_number(json_object_get(j, "total_ms")));
        if (i == 0) {
            assert_string_equal(json_string_value(json_object_get(j, "key")), "AL-1");
            assert_int_equal(json_integer_value(json_object_get(j, "upstream_status")), 201);
            assert_true(json_integer_value(json_object_get(j, "epoch")) > 0);
            /* The client's bytes, back as they were sent. */
            assert_string_equal(json_string_value(json_object_get(j, "request_id")),
                                "a\"b\\c\xe2\x80\xa8" "d");
            assert_int_equal(json_integer_value(json_object_get(j, "bytes_in")),
                             strlen("{\"refund_no\":\"AL-1\",\"amount\":\"1.00\"}"));
            assert_true(json_integer_value(json_object_get(j, "bytes_out")) > 10);
            assert_non_null(json_string_value(json_object_get(j, "host")));
        } else {
            /* None sent: one made, 24 hex digits, and given to the upstream. */
            const char *id = json_string_value(json_object_get(j, "request_id"));
            assert_non_null(id);
            assert_int_equal(strlen(id), 24);
            assert_int_equal(strspn(id, "0123456789abcdef"), 24);
        }
        if (i == 1) {
            const char *sub = json_string_value(json_object_get(j, "subject"));
            assert_non_null(sub);
            assert_int_equal(strlen(sub), 16); /* hashed, not the subject */
            assert_null(strstr(line, "mallory"));
            assert_int_equal(json_integer_value(json_object_get(j, "status")), 201);
        }
        json_decref(j);
    }
    for (size_t i = 0; i < n; i++)
        assert_null(strstr(lines[i], "secret-in-query"));
    free_lines(lines, n);
    /* logrotate: the file moved away, SIGUSR1, the next lines in a new one. */
    char moved[4300];
    snprintf(moved, sizeof moved, "%s.1", log);
    assert_int_equal(rename(log, moved), 0);
    kill(gw.pid, SIGUSR1);
    sleep_ms(300);
    post_refund(gw.port, "{\"refund_no\":\"AL-2\",\"amount\":\"1.00\"}", NULL, 201);
    sleep_ms(200);
    lines = read_lines(log, &n);
    assert_int_equal(n, 1);
    assert_non_null(strstr(lines[0], "\"key\":\"AL-2\""));
    free_lines(lines, n);
    lines = read_lines(moved, &n);
    assert_int_equal(n, 3); /* nothing more went to the old one */
    free_lines(lines, n);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* Text (logfmt): one line each, the same bytes escaped as the log does. */
    snprintf(log, sizeof log, "%s/access-text-%d.log", dir, config_seq + 1);
    snprintf(routes, sizeof routes,
             "access_log: { to: %s, format: text, subject: plain }\nroutes:\n" REFUND_ROUTE, log);
    start_idem(&gw, routes, "access-text.db");
    post_refund(gw.port, "{\"refund_no\":\"AL-3\",\"amount\":\"1.00\"}",
                "X-Subject: eve\xe2\x80\xae" "x y", 201);
    post_refund(gw.port, "{\"refund_no\":\"AL-3\",\"amount\":\"1.00\"}", NULL, 201);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0); /* its last lines written at exit */
    lines = read_lines(log, &n);
    assert_int_equal(n, 2);
    assert_non_null(strstr(line_with(lines, n, " outcome=executed "),
                           "subject=\"eve\\u202ex y\""));
    line_with(lines, n, " outcome=replayed ");
    free_lines(lines, n);

    /* The daemon's own log in JSON: every line an object with its level;
     * a request's lines (here its walk, at debug) with what they are
     * about in fields of their own. */
    start_idem(&gw, "log: { format: json, level: debug }\naccess_log: off\nroutes:\n"
               REFUND_ROUTE, "access-json.db");
    static const char *const rid[] = {"X-Request-Id: walk-1", NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", rid, "{\"refund_no\":\"AL-J\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    lines = read_lines(gw.log, &n);
    assert_true(n >= 2); /* draining, stopped */
    int about = 0, forwarded = 0;
    for (size_t i = 0; i < n; i++) {
        if (strncmp(lines[i], "idem: listening on ", 19) == 0)
            continue; /* the ready line, on stdout, which the log file also holds */
        json_t *j = json_loads(lines[i], 0, NULL);
        if (!j)
            fail_msg("log line %zu is not JSON: %s", i, lines[i]);
        assert_non_null(json_string_value(json_object_get(j, "time")));
        const char *level = json_string_value(json_object_get(j, "level"));
        assert_true(!strcmp(level, "info") || !strcmp(level, "debug"));
        assert_non_null(json_string_value(json_object_get(j, "msg")));
        const char *key = json_string_value(json_object_get(j, "key"));
        if (key) {
            about++;
            assert_string_equal(key, "AL-J");
            assert_string_equal(json_string_value(json_object_get(j, "route")), "refund");
            assert_string_equal(json_string_value(json_object_get(j, "space")), "refund");
            assert_string_equal(json_string_value(json_object_get(j, "request_id")), "walk-1");
            /* Once begun, the claim's epoch too. */
            if (strstr(json_string_value(json_object_get(j, "msg")), "-> forward")) {
                forwarded++;
                assert_true(json_integer_value(json_object_get(j, "epoch")) > 0);
            }
        }
        json_decref(j);
    }
    assert_true(about >= 4);
    assert_int_equal(forwarded, 1);
    free_lines(lines, n);
}

/* 1,000,000 token requests on the main listener, each under another
 * subject, from one client address: issued at token_rate_peer, the rest
 * refused 429 at once; meanwhile a client at another address gets every
 * token it asks for, and every gateway request is served (their times,
 * idle and during the flood, are printed: how much the flood slows them
 * is a benchmark's to say, not a test's). Before the rates, such a
 * flood filled the daemon-wide token table in about a minute, every
 * subject's request was refused for the tokens' TTL, and each refusal
 * cost 0.3 s of CPU. */
static void test_token_flood(void **state)
{
    (void)state;
    static const char routes[] =
        "limits:\n  requests_per_connection: 100000000\n"
        "access_log: off\n" /* a million lines would be a third of a GB of test log */
        "routes:\n" REFUND_ROUTE "    layers: [token, record]\n"
        "  - name: plain\n    match: { method: POST, path: /callbacks/payment }\n"
        "    upstream: @UP@\n    key: { json: serial_no }\n    space: payment\n";
    struct proc gw;
    start_idem(&gw, routes, "flood.db");
    long total = getenv("IDEM_TEST_FLOOD") ? atol(getenv("IDEM_TEST_FLOOD")) : 1000000;
    char req[512];
    double idle[21], busy[21];
    for (int i = 0; i < 21; i++) {
        payment_request(req, sizeof req, "idle", i);
        assert_int_equal(timed_post("127.0.0.3", gw.port, req, &idle[i]), 201);
    }
    /* One flooding connection: on two cores, a second would take the
     * processor from the daemon rather than test it. */
    struct flood f[1];
    int64_t t0 = mono_us_test();
    f[0] = (struct flood){.port = gw.port, .id = 0, .requests = total};
    pthread_create(&f[0].t, NULL, flood_main, &f[0]);
    sleep_ms(200);
    int alice = 0, probes = 0;
    for (; probes < 21; probes++) {
        payment_request(req, sizeof req, "busy", probes);
        assert_int_equal(timed_post("127.0.0.3", gw.port, req, &busy[probes]), 201);
        double ms;
        alice += timed_post("127.0.0.2", gw.port,
                            "POST /_idem/v1/tokens HTTP/1.1\r\nHost: x\r\nX-Subject: alice\r\n"
                            "Connection: close\r\nContent-Length: 18\r\n\r\n{\"scene\":\"refund\"}",
                            &ms) == 201;
        sleep_ms(150); /* alice at under her 10 a second */
    }
    pthread_join(f[0].t, NULL);
    double secs = (double)(mono_us_test() - t0) / 1e6;
    long issued = f[0].issued, refused = f[0].refused;
    printf("# %ld token requests in %.1f s: %ld issued, %ld refused, %ld other\n", total, secs,
           issued, refused, f[0].other);
    assert_int_equal(f[0].other, 0);
    assert_int_equal(issued + refused, total);
    /* The peer's rate (100 a second) and its burst: no more. */
    if (issued > (long)(100 * secs) + 100 + 10)
        fail_msg("%ld tokens issued to one address in %.1f s", issued, secs);
    assert_int_equal(alice, probes);
    qsort(idle, 21, sizeof idle[0], cmp_double);
    qsort(busy, 21, sizeof busy[0], cmp_double);
    printf("# gateway p50 idle %.2f ms, during the flood %.2f ms\n", idle[10], busy[10]);
    /* And after it, a new subject gets a token at once (from an address of
     * its own: the flood's is out of tokens for a second). */
    double ms;
    assert_int_equal(timed_post("127.0.0.4", gw.port,
                                "POST /_idem/v1/tokens HTTP/1.1\r\nHost: x\r\nX-Subject: bob\r\n"
                                "Connection: close\r\nContent-Length: 18\r\n\r\n"
                                "{\"scene\":\"refund\"}",
                                &ms),
                     201);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* One client address can take connections_per_peer of connections_max and
 * in_flight_per_peer of in_flight_max, no more: past them it is answered
 * 503 while another address is served. */
static void test_per_peer_limits(void **state)
{
    (void)state;
    static const char routes[] = "limits:\n  connections_per_peer: 3\n  in_flight_per_peer: 1\n"
                                 "routes:\n" REFUND_ROUTE;
    struct proc gw;
    start_idem(&gw, routes, "per-peer.db");
    int idle[3];
    for (int i = 0; i < 3; i++)
        assert_true((idle[i] = connect_from("127.0.0.1", gw.port)) >= 0);
    sleep_ms(100);
    static const char stats[] = "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    double ms;
    assert_int_equal(timed_post("127.0.0.1", gw.port, stats, &ms), 503);
    assert_int_equal(timed_post("127.0.0.2", gw.port, stats, &ms), 200);
    for (int i = 0; i < 3; i++)
        close(idle[i]);
    sleep_ms(100);
    assert_int_equal(timed_post("127.0.0.1", gw.port, stats, &ms), 200);
    /* One request of 127.0.0.1 in flight (slow): its next is refused, and
     * another address's is not. */
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-per-peer\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(400);
    char req[256];
    snprintf(req, sizeof req,
             "POST /refunds HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 43\r\n\r\n"
             "{\"refund_no\":\"R-per-peer-2\",\"amount\":\"1.0\"}");
    assert_int_equal(timed_post("127.0.0.1", gw.port, req, &ms), 503);
    assert_int_equal(timed_post("127.0.0.2", gw.port, req, &ms), 201);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    sys_resp_free(&b.resp);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    /* The request refused at in_flight_per_peer has its access-log line
     * (stderr here) all the same. */
    char *text = sys_read_file(gw.log);
    assert_non_null(strstr(text, "\"outcome\":\"overloaded\",\"status\":503"));
    free(text);
}

/* ---- TLS: certificates made here with openssl(1) ---- */

/* curl's exit status (0: a whole answer; 35, 56, 60: TLS refused), and the
 * answer's status in *status. */
static int curl_status(const char *args, int *status)
{
    char cmd[8192], out[64] = "";
    snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' --max-time 10 %s", args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    if (!fgets(out, sizeof out, f))
        out[0] = '\0';
    int rc = pclose(f);
    *status = atoi(out);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The serial of the certificate a TLS server on port shows. */
static void served_serial(int port, char *out, size_t cap)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "openssl s_client -connect 127.0.0.1:%d -servername localhost </dev/null "
             "2>/dev/null | openssl x509 -noout -serial",
             port);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    if (!fgets(out, (int)cap, f))
        out[0] = '\0';
    pclose(f);
}

/* idem serve named name in d: TLS on its listen with the certificate
 * d/cert.pem, passing every request through to the refund service. */
static void start_tls_passthrough(struct proc *p, const char *d, const char *name,
                                  const char *cert)
{
    char path[512], db[512], log[512], yaml[2048];
    snprintf(path, sizeof path, "%s/%s.yaml", d, name);
    snprintf(yaml, sizeof yaml,
             "listen: { address: \"127.0.0.1:0\", tls: { cert: %s/%s.pem, key: %s/%s.key } }\n"
             "admin_listen: unix:%s/%s.sock\nupstream: http://127.0.0.1:%d\n",
             d, cert, d, cert, d, name, service.port);
    sys_write_file(path, yaml);
    snprintf(db, sizeof db, "%s/%s.db", d, name);
    snprintf(log, sizeof log, "%s/%s.log", d, name);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, NULL};
    sys_start(p, argv, log);
}

/* TLS on both listeners and to an upstream, with certificates made for the
 * test: the gateway (TLS on listen) in front of an https:// upstream (a
 * second idem serve with TLS, passing through to the refund service).
 * Works with the right CA and host name; an upstream whose certificate is
 * for another name, or from a CA not trusted, is refused before anything
 * is sent: 502, not executed, the claim released (a retry gets 502 again,
 * not 409). Plain HTTP on a TLS port gets nothing; the admin listener asks
 * for a client certificate; a SIGHUP takes a renewed certificate. */
static void test_tls(void **state)
{
    (void)state;
    char d[256], path[512], db[512], log[512], yaml[8192];
    if ((size_t)snprintf(d, sizeof d, "%s/tls", dir) >= sizeof d)
        skip();
    mkdir(d, 0700);
    sys_make_cert(d, "ca", "idem-test-ca", NULL, NULL);
    sys_make_cert(d, "other-ca", "someone-else", NULL, NULL);
    sys_make_cert(d, "srv", "localhost", "DNS:localhost", "ca");
    sys_make_cert(d, "stranger", "localhost", "DNS:localhost", "other-ca");
    sys_make_cert(d, "client", "ops", "DNS:ops", "ca");
    /* The upstream: TLS on its listen, passing everything to the service;
     * and the same showing a certificate of a CA the gateway does not trust. */
    struct proc up, up2, gw;
    start_tls_passthrough(&up, d, "up", "srv");
    start_tls_passthrough(&up2, d, "up2", "stranger");
    /* The gateway: TLS on listen and on admin_listen (client certificates
     * required), routes to the upstreams by name, by an address the
     * certificate does not name, and to the stranger. */
    snprintf(yaml, sizeof yaml,
             "listen: { address: \"127.0.0.1:0\", tls: { cert: %s/srv.pem, key: %s/srv.key } }\n"
             "admin_listen: { address: \"127.0.0.1:0\", tls: { cert: %s/srv.pem, key: %s/srv.key, "
             "client_ca: %s/ca.pem } }\n"
             "api_keys:\n  - { name: test, scope: write, env: " SYS_ADMIN_KEY_ENV " }\n"
             "tls_ca: %s/ca.pem\n"
             "routes:\n"
             "  - { name: good, match: { method: POST, path: /callbacks/payment }, "
             "upstream: \"https://localhost:%d\", key: { json: serial_no }, space: tls }\n"
             "  - { name: by-address, match: { method: POST, path: /by-address }, "
             "upstream: \"https://127.0.0.1:%d/callbacks/payment\", key: { json: serial_no }, "
             "space: tls }\n"
             "  - { name: stranger, match: { method: POST, path: /stranger }, "
             "upstream: \"https://localhost:%d/callbacks/payment\", key: { json: serial_no }, "
             "space: tls }\n",
             d, d, d, d, d, d, up.port, up.port, up2.port);
    snprintf(path, sizeof path, "%s/gw.yaml", d);
    sys_write_file(path, yaml);
    snprintf(db, sizeof db, "%s/gw.db", d);
    snprintf(log, sizeof log, "%s/gw.log", d);
    char *gargv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, NULL};
    sys_start(&gw, gargv, log);
    long before = sys_stat(service.port, "payment_executions");
    char args[8192];
    int status;
    /* Through TLS both ways: executed once, then replayed. */
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args,
                 "--cacert %s/ca.pem -X POST -d '{\"serial_no\":\"TLS-1\",\"amount\":\"1\"}' "
                 "https://localhost:%d/callbacks/payment",
                 d, gw.port);
        assert_int_equal(curl_status(args, &status), 0);
        assert_int_equal(status, 201);
    }
    assert_int_equal(sys_stat(service.port, "payment_executions") - before, 1);
    /* Upstreams whose certificate does not pass: nothing forwarded, and the
     * claim released (502 again, not 409 in flight). */
    static const char *const refused[] = {"/by-address", "/stranger"};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 2; i++) {
            snprintf(args, sizeof args,
                     "--cacert %s/ca.pem -X POST -d '{\"serial_no\":\"TLS-%d\",\"amount\":\"1\"}' "
                     "https://localhost:%d%s",
                     d, 2 + r, gw.port, refused[r]);
            assert_int_equal(curl_status(args, &status), 0);
            if (status != 502)
                fail_msg("%s: %d, expected 502", refused[r], status);
        }
    assert_int_equal(sys_stat(service.port, "payment_executions") - before, 1);
    /* A certificate, key or CA file that does not load is refused at the
     * start, and by --check, naming it. */
    char bad[512], err[4096];
    snprintf(bad, sizeof bad, "%s/bad.yaml", d);
    snprintf(yaml, sizeof yaml,
             "listen: { address: \"127.0.0.1:0\", tls: { cert: %s/srv.pem, key: %s/client.key } }\n",
             d, d);
    sys_write_file(bad, yaml);
    char *check[] = {(char *)idem_bin, "serve", "-c", bad, "--check", NULL};
    assert_int_equal(sys_run_fail(check, err, sizeof err), 2);
    assert_non_null(strstr(err, "listen.tls: TLS: "));
    assert_non_null(strstr(err, "client.key"));
    /* Plain HTTP on a TLS listener: no answer. */
    struct sys_resp r;
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 3000, &r);
    assert_int_equal(r.status, 0);
    sys_resp_free(&r);
    /* The admin listener: no client certificate, no handshake; with one
     * and the key, the API. */
    snprintf(args, sizeof args,
             "--cacert %s/ca.pem -H 'Authorization: Bearer " SYS_ADMIN_KEY "' "
             "https://localhost:%d/_idem/v1/records/tls/TLS-1",
             d, gw.admin_port);
    assert_true(curl_status(args, &status) != 0);
    snprintf(args, sizeof args,
             "--cacert %s/ca.pem --cert %s/client.pem --key %s/client.key "
             "-H 'Authorization: Bearer " SYS_ADMIN_KEY "' "
             "https://localhost:%d/_idem/v1/records/tls/TLS-1",
             d, d, d, gw.admin_port);
    assert_int_equal(curl_status(args, &status), 0);
    assert_int_equal(status, 200);
    /* A renewed certificate, taken on SIGHUP by new connections. */
    char was[128], now[128];
    served_serial(gw.port, was, sizeof was);
    assert_non_null(strstr(was, "serial="));
    sys_make_cert(d, "srv", "localhost", "DNS:localhost", "ca");
    kill(gw.pid, SIGHUP);
    for (int i = 0; i < 100; i++) {
        served_serial(gw.port, now, sizeof now);
        if (strcmp(now, was) != 0)
            break;
        sleep_ms(50);
    }
    if (strcmp(now, was) == 0)
        fail_msg("the certificate served after SIGHUP is still %s", was);
    /* A file that drops client_ca does not switch client certificates off
     * on SIGHUP (it takes a restart, and says so). */
    char *text = sys_read_file(path);
    char *ca = strstr(text, ", client_ca: ");
    assert_non_null(ca);
    char *rest = strstr(ca, " }");
    memmove(ca, rest, strlen(rest) + 1);
    assert_null(strstr(text, "client_ca"));
    sys_write_file(path, text);
    free(text);
    kill(gw.pid, SIGHUP);
    for (int i = 0; i < 100; i++) {
        text = sys_read_file(gw.log);
        int reloaded = strstr(text, "SIGHUP: reloaded") != NULL &&
                       strstr(strstr(text, "SIGHUP: reloaded") + 1, "SIGHUP: reloaded") != NULL;
        free(text);
        if (reloaded)
            break;
        sleep_ms(50);
    }
    snprintf(args, sizeof args,
             "--cacert %s/ca.pem -H 'Authorization: Bearer " SYS_ADMIN_KEY "' "
             "https://localhost:%d/_idem/v1/health",
             d, gw.admin_port);
    assert_true(curl_status(args, &status) != 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    assert_int_equal(sys_stop(&up, SIGTERM), 0);
    assert_int_equal(sys_stop(&up2, SIGTERM), 0);
}

/* Failed API keys from one address are slowed down: past a burst, each
 * refusal waits a second; a right key is never held. */
static void test_failed_keys_slowed(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, "routes: []\n", "slowed.db");
    static const char *const wrong[] = {"Authorization: Bearer wrong-key-0123456789abcdef",
                                        NULL};
    int64_t slow = 0;
    for (int i = 0; i < 14; i++) {
        struct sys_resp r;
        int64_t t0 = test_mono_ms();
        sys_http(gw.admin_port, "GET", "/_idem/v1/metrics", wrong, NULL, 5000, &r);
        assert_int_equal(r.status, 401);
        sys_resp_free(&r);
        slow += test_mono_ms() - t0 >= 900;
    }
    if (slow < 3)
        fail_msg("%lld of 14 failures were held back; past the burst of 10 each should be",
                 (long long)slow);
    struct sys_resp r;
    int64_t t0 = test_mono_ms();
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/metrics", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_true(test_mono_ms() - t0 < 900);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* From 40 addresses, a guess each: past the listener's burst (30) the
     * rest are held too, though no address failed twice. */
    start_idem(&gw, "routes: []\n", "slowed-many.db");
    int held = 0;
    for (int i = 0; i < 40; i++) {
        char src[32], req[256];
        double ms;
        snprintf(src, sizeof src, "127.0.0.%d", i + 2);
        snprintf(req, sizeof req,
                 "GET /_idem/v1/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 "Authorization: Bearer wrong-key-%02d-0123456789abcdef\r\n\r\n", i);
        assert_int_equal(timed_post(src, gw.admin_port, req, &ms), 401);
        held += ms >= 900;
    }
    if (held < 5)
        fail_msg("%d of 40 failures from 40 addresses were held back; past the listener's "
                 "burst of 30 each should be", held);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* admin_listen where the kernel would mix its connections with listen's is
 * refused: the same address or a wildcard on its port, in the file (by line)
 * or through --listen, before binding (--check sees it); another spelling of
 * the address once bound. Otherwise SO_REUSEPORT would let the two share
 * one port and hand gateway clients the JSON API. */
static void test_admin_listen_overlap_refused(void **state)
{
    (void)state;
    char path[4200], err[4096];
    snprintf(path, sizeof path, "%s/same.yaml", dir);
    sys_write_file(path, "listen: 127.0.0.1:18080\n"
                         "admin_listen: 127.0.0.1:18080\n");
    char *same[] = {(char *)idem_bin, "serve", "-c", path, NULL};
    assert_int_equal(sys_run_fail(same, err, sizeof err), 2);
    assert_non_null(strstr(err, "same.yaml:2"));
    assert_non_null(strstr(err, "admin_listen"));

    int port = sys_free_port();
    char yaml[128], listen[64], db[4200];
    snprintf(path, sizeof path, "%s/overlap.yaml", dir);
    snprintf(yaml, sizeof yaml, "admin_listen: 127.0.0.1:%d\n", port);
    sys_write_file(path, yaml);
    snprintf(db, sizeof db, "%s/overlap.db", dir);
    /* The same address, or a wildcard, is caught with the file (so --check
     * sees it too); another spelling of the address only once bound. */
    static const struct { const char *host, *says; } listens[] = {
        {"127.0.0.1", "would share connections"},
        {"0.0.0.0", "would share connections"},
        {"127.1", "overlaps the listen address"},
    };
    for (int i = 0; i < 3; i++) {
        snprintf(listen, sizeof listen, "%s:%d", listens[i].host, port);
        char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", listen,
                        NULL};
        if (sys_run_fail(argv, err, sizeof err) == 0)
            fail_msg("--listen %s started beside admin_listen 127.0.0.1:%d", listen, port);
        assert_non_null(strstr(err, listens[i].says));
    }
    snprintf(listen, sizeof listen, "0.0.0.0:%d", port);
    char *check[] = {(char *)idem_bin, "serve", "-c", path, "--listen", listen, "--check", NULL};
    assert_int_equal(sys_run_fail(check, err, sizeof err), 2);
    assert_non_null(strstr(err, "would share connections"));
}

/* The loops keep recent answers in memory for duplicates; a transition made
 * through the JSON API must still reach the very next duplicate: RELEASED
 * lets it run again (the service, which already has the refund, answers 409
 * from its own UNIQUE constraint). */
static void test_transition_reaches_replays(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "rerun.db");
    long before = sys_stat(service.port, "executions");
    const char *body = "{\"refund_no\":\"R-rerun\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    for (int i = 0; i < 6; i++) /* one execution, then replays */
        post_expect(gw.port, body, 201, i ? 1 : ANY);
    api_expect(gw.admin_port, "/_idem/v1/records/transition",
               "{\"space\":\"refund\",\"key\":\"R-rerun\",\"from\":\"SUCCEEDED\","
               "\"to\":\"RELEASED\"}",
               200, "\"outcome\":\"APPLIED\"");
    sys_http(gw.port, "POST", "/refunds", NULL, body, 5000, &r);
    assert_null(sys_header(&r, "Idempotent-Replayed"));
    assert_int_equal(r.status, 409);
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* An idle connection to 127.0.0.1:port, connected and left open. */
static void open_idle_now(int port, int *fd)
{
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(*fd, (struct sockaddr *)&a, sizeof a), 0);
}

/* Read from fd until buf holds want, up to ms; what was read, NUL-ended. */
static void read_until(int fd, char *buf, size_t cap, const char *want, int ms)
{
    size_t n = 0;
    buf[0] = '\0';
    struct pollfd p = {.fd = fd, .events = POLLIN};
    /* In steps of 50 ms: a slow build may take long between two reads. */
    for (int waited = 0; !strstr(buf, want) && n + 1 < cap && waited < ms;) {
        int r = poll(&p, 1, 50);
        if (r < 0)
            break;
        if (r == 0) {
            waited += 50;
            continue;
        }
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got <= 0)
            break;
        n += (size_t)got;
        buf[n] = '\0';
    }
}

/* Requests the parser refuses get their access-log line too, as nginx
 * logs its 400, 413 and 414: a target in absolute form, a body declared
 * over body_max, a head over its limit, each with what was read of it and
 * the problem's type as its outcome. */
static void test_access_log_parser_refusals(void **state)
{
    (void)state;
    char log[4200], routes[8192];
    snprintf(log, sizeof log, "%s/access-refused-%d.log", dir, config_seq + 1);
    snprintf(routes, sizeof routes,
             "access_log: { to: %s }\nlimits:\n  body_max: 1KiB\n  header_bytes_max: 4KiB\n"
             "routes:\n" REFUND_ROUTE, log);
    struct proc gw;
    start_idem(&gw, routes, "access-refused.db");
    char big_head[20000];
    int k = snprintf(big_head, sizeof big_head, "POST /refunds HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    memset(big_head + k, 'p', sizeof big_head - (size_t)k - 8);
    memcpy(big_head + sizeof big_head - 8, "\r\n\r\n", 5);
    const char *raw[][2] = {
        {"POST http://evil.example/refunds HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
         "400"},
        {"POST /refunds HTTP/1.1\r\nHost: x\r\nX-Request-Id: req-413\r\n"
         "Content-Length: 5000\r\n\r\n", "413"},
        {big_head, "431"},
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        int fd;
        char buf[4096];
        open_idle_now(gw.port, &fd);
        assert_true(send(fd, raw[i][0], strlen(raw[i][0]), MSG_NOSIGNAL) > 0);
        read_until(fd, buf, sizeof buf, "\r\n\r\n", 5000);
        if (strncmp(buf + 9, raw[i][1], 3) != 0)
            fail_msg("request %zu: %s, not %s", i, buf, raw[i][1]);
        close(fd);
    }
    sleep_ms(300);
    size_t n;
    char **lines = read_lines(log, &n);
    assert_int_equal(n, 3);
    const char *l = line_with(lines, n, "\"outcome\":\"malformed_request\"");
    assert_non_null(strstr(l, "\"status\":400"));
    l = line_with(lines, n, "\"outcome\":\"body_too_large\"");
    assert_non_null(strstr(l, "\"status\":413"));
    assert_non_null(strstr(l, "\"method\":\"POST\""));
    assert_non_null(strstr(l, "\"path\":\"/refunds\""));
    assert_non_null(strstr(l, "\"request_id\":\"req-413\""));
    l = line_with(lines, n, "\"outcome\":\"headers_too_large\"");
    assert_non_null(strstr(l, "\"status\":431"));
    for (size_t i = 0; i < n; i++) {
        json_error_t err;
        json_t *j = json_loads(lines[i], 0, &err);
        if (!j)
            fail_msg("line %zu is not JSON (%s): %s", i, err.text, lines[i]);
        json_decref(j);
    }
    free_lines(lines, n);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* HEAD: passed through with the upstream's own Content-Length (the length
 * GET would have) or none, not 0; and a route without a method does not take it,
 * so its empty answer is never a key's stored answer for a later POST. */
static void test_head_passed_through(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw,
               "routes:\n"
               "  - name: any-method\n"
               "    match: { path: /refunds }\n"
               "    upstream: @UP@\n"
               "    key: { header: Idempotency-Key }\n"
               "    fingerprint: none\n",
               "head.db");
    struct sys_resp get, head;
    sys_http(gw.port, "GET", "/stats", NULL, NULL, 5000, &get);
    sys_http(gw.port, "HEAD", "/stats", NULL, NULL, 5000, &head);
    assert_int_equal(get.status, 200);
    assert_int_equal(head.status, 200);
    /* The service gives none for HEAD (libevent's evhttp does not): none
     * is passed on, never one of 0 made up here. */
    assert_true(get.m->body_len > 0);
    const char *cl = sys_header(&head, "Content-Length");
    if (cl && atol(cl) != (long)get.m->body_len)
        fail_msg("HEAD Content-Length %s, GET's body %zu bytes", cl, get.m->body_len);
    sys_resp_free(&get);
    sys_resp_free(&head);
    long before = sys_stat(service.port, "executions");
    static const char *const key[] = {"Idempotency-Key: K-head", NULL};
    sys_http(gw.port, "HEAD", "/refunds", key, NULL, 5000, &head);
    assert_null(sys_header(&head, "Idempotent-Replayed"));
    sys_resp_free(&head);
    sys_http(gw.port, "POST", "/refunds", key, "{\"refund_no\":\"R-head\",\"amount\":\"1.00\"}",
             5000, &get);
    assert_int_equal(get.status, 201);
    assert_null(sys_header(&get, "Idempotent-Replayed"));
    sys_resp_free(&get);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Records past their retention are purged at start and each minute, all of
 * them, however many (1000 per store call): 2500 expired records go in one
 * round, a live one stays. */
static long count_records(const char *db)
{
    sqlite3 *c = NULL;
    sqlite3_stmt *st = NULL;
    long n = -1;
    if (sqlite3_open_v2(db, &c, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(c, "SELECT count(*) FROM idem_record", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(c);
    return n;
}

static void test_expired_records_purged(void **state)
{
    (void)state;
    struct proc gw;
    char db[4200];
    snprintf(db, sizeof db, "%s/purge.db", dir);
    start_idem(&gw, "routes:\n" REFUND_ROUTE, "purge.db"); /* makes the file */
    post_expect(gw.port, "{\"refund_no\":\"R-live\",\"amount\":\"1.00\"}", 201, 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    sqlite3 *c;
    assert_int_equal(sqlite3_open(db, &c), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(c,
                     "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                     "WHERE i < 2500) INSERT INTO idem_record (space, key, state, epoch, owner, "
                     "lease_until, created_ms, updated_ms, expires_ms) SELECT 'refund', "
                     "'P-' || i, 'SUCCEEDED', 1, 'o', 0, 1, 1, 1 FROM n",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(c);
    assert_int_equal(count_records(db), 2501);
    start_idem(&gw, "routes:\n" REFUND_ROUTE, "purge.db");
    long n = -1;
    for (int i = 0; i < 100 && (n = count_records(db)) != 1; i++)
        sleep_ms(100);
    assert_int_equal(n, 1);
    post_expect(gw.port, "{\"refund_no\":\"R-live\",\"amount\":\"1.00\"}", 201, 1);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Empty lines before a request line do not put header_timeout off: it runs
 * from the first byte, so a client that sends a CRLF now and then, and never
 * a request, is answered 408 and closed (600 ms here), not kept until
 * idle_timeout (60 s). */
static void test_empty_lines_no_reprieve(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, limit_routes, "crlf.db");
    int fd;
    open_idle_now(gw.port, &fd);
    char buf[2048] = "";
    for (int i = 0; i < 10 && !strstr(buf, "408"); i++) { /* 3 s: 5 header_timeouts */
        (void)send(fd, "\r\n", 2, MSG_NOSIGNAL);
        read_until(fd, buf, sizeof buf, "408", 300);
    }
    if (!strstr(buf, "HTTP/1.1 408"))
        fail_msg("no 408 after 10 empty lines 300 ms apart: \"%s\"", buf);
    close(fd);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A client that sends "Expect: 100-continue" and waits before its body
 * (curl does for large bodies, for a second) is told to go on at once. */
static void test_expect_continue(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, reject_routes, "expect.db");
    const char *body = "{\"refund_no\":\"R-expect\",\"amount\":\"1.00\"}";
    char head[512], got[4096];
    snprintf(head, sizeof head,
             "POST /refunds HTTP/1.1\r\nHost: idem\r\nExpect: 100-continue\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             strlen(body));
    int fd;
    open_idle_now(gw.port, &fd);
    assert_int_equal(send(fd, head, strlen(head), 0), (ssize_t)strlen(head));
    read_until(fd, got, sizeof got, "\r\n\r\n", 3000);
    assert_string_equal(got, "HTTP/1.1 100 Continue\r\n\r\n");
    assert_int_equal(send(fd, body, strlen(body), 0), (ssize_t)strlen(body));
    read_until(fd, got, sizeof got, "HTTP/1.1 201", 5000);
    assert_non_null(strstr(got, "HTTP/1.1 201"));
    close(fd);
    post_expect(gw.port, body, 201, 1); /* executed once, as any request */
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* n of them, then a pause for the server to accept them. */
static void open_idle(int port, int *fds, int n)
{
    for (int i = 0; i < n; i++)
        open_idle_now(port, &fds[i]);
    sleep_ms(300); /* long enough on a loaded machine too */
}

static const char conn_limit_routes[] =
    "limits:\n"
    "  connections_max: 4\n"
    "  idle_timeout: 500ms\n"
    "routes: []\n";

static void test_connection_limits(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, conn_limit_routes, "conns.db");
    /* Four idle connections are the limit: the fifth is told so. */
    int fds[4];
    open_idle(gw.port, fds, 4);
    struct sys_resp r;
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 3000, &r);
    assert_int_equal(r.status, 503);
    assert_non_null(strstr(r.m->body, "urn:idem:overloaded"));
    sys_resp_free(&r);
    /* idle_timeout closes them; then there is room again. */
    char b;
    for (int i = 0; i < 4; i++) {
        struct timeval tv = {3, 0};
        setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        assert_int_equal(recv(fds[i], &b, 1, 0), 0); /* closed by the server */
        close(fds[i]);
    }
    sys_http(gw.port, "GET", "/_idem/v1/health", NULL, NULL, 3000, &r);
    assert_int_equal(r.status, 200);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static void expect_status(int port, const char *path, int status)
{
    struct sys_resp r;
    sys_admin_http(port, "GET", path, NULL, 3000, &r);
    if (r.status != status)
        fail_msg("GET %s on %d: %d, expected %d", path, port, r.status, status);
    if (status == 503)
        assert_non_null(strstr(r.m->body, "urn:idem:overloaded"));
    sys_resp_free(&r);
}

/* The same once the server has seen connections close: within 3 s. */
static void expect_status_soon(int port, const char *path, int status)
{
    for (int i = 0; i < 60; i++) {
        struct sys_resp r;
        sys_admin_http(port, "GET", path, NULL, 3000, &r);
        int got = r.status;
        sys_resp_free(&r);
        if (got == status)
            return;
        sleep_ms(50);
    }
    expect_status(port, path, status);
}

/* The JSON API runs on the event loops, as the gateway does: 100
 * concurrent begins of one key through it make exactly one claim, 100
 * concurrent transitions of one record exactly one move, and the daemon
 * does it all with event_loops: 2 on at most six threads (the two loops,
 * the store's writer, the background thread for reloads, and room for
 * what the libraries start), none of them a pool of workers. */
struct api_post {
    int port;
    const char *path, *body;
    struct sys_resp resp;
    pthread_t t;
};

static void *api_post_main(void *arg)
{
    struct api_post *a = arg;
    sys_admin_http(a->port, "POST", a->path, a->body, 15000, &a->resp);
    return NULL;
}

/* Fire n POSTs of body at path at once; how many answers held word. */
static int api_storm(int port, const char *path, const char *body, const char *word)
{
    enum { N = 100 };
    static struct api_post a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct api_post){.port = port, .path = path, .body = body};
        assert_int_equal(pthread_create(&a[i].t, NULL, api_post_main, &a[i]), 0);
    }
    int n = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(a[i].t, NULL);
        if (a[i].resp.status != 200)
            fail_msg("%s: %d %s", path, a[i].resp.status, a[i].resp.m ? a[i].resp.m->body : "");
        n += strstr(a[i].resp.m->body, word) != NULL;
        sys_resp_free(&a[i].resp);
    }
    return n;
}

static void test_json_api_on_the_loops(void **state)
{
    (void)state;
    struct proc gw;
    /* 100 connections at once: above admin_connections_max's default (64),
     * which a slow machine's overlap would otherwise reach (503). */
    start_idem(&gw, "event_loops: 2\nlimits: { admin_connections_max: 256 }\n" "routes:\n"
               REFUND_ROUTE, "api-loops.db");
    int p = gw.admin_port;
    assert_int_equal(api_storm(p, "/_idem/v1/records/begin",
                               "{\"space\":\"storm\",\"key\":\"S-1\",\"owner\":\"w\"}",
                               "\"outcome\":\"NEW\""),
                     1);
    struct sys_resp r = api(p, "/_idem/v1/records/storm/S-1", NULL);
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    json_int_t epoch = json_integer_value(json_object_get(json_object_get(j, "record"), "epoch"));
    json_decref(j);
    sys_resp_free(&r);
    char body[200];
    snprintf(body, sizeof body,
             "{\"space\":\"storm\",\"key\":\"S-1\",\"epoch\":%lld,\"result\":\"ok\"}",
             (long long)epoch);
    api_expect(p, "/_idem/v1/records/complete", body, 200, "\"outcome\":\"COMPLETED\"");
    assert_int_equal(api_storm(p, "/_idem/v1/records/transition",
                               "{\"space\":\"storm\",\"key\":\"S-1\","
                               "\"from\":\"SUCCEEDED\",\"to\":\"REFUNDED\"}",
                               "\"outcome\":\"APPLIED\""),
                     1);
    api_expect(p, "/_idem/v1/records?space=storm", NULL, 200, "\"state\":\"REFUNDED\"");
    expect_status(gw.port, "/_idem/v1/health", 200);
    int threads = sys_threads(gw.pid, NULL), workers = sys_threads(gw.pid, "idem-worker");
    if (threads > 6 || workers != 0)
        fail_msg("idem serve with event_loops: 2 runs %d threads (at most 6), %d of them "
                 "idem-worker (none)",
                 threads, workers);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The admin listener's connections and requests are counted apart from the
 * main listener's: clients filling connections_max or in_flight_max there
 * leave the JSON API answering; admin_connections_max bounds it alone. */
static const char admin_limit_routes[] =
    "admin_listen: 127.0.0.1:0\n"
    "event_loops: 2\n"
    "limits:\n"
    "  connections_max: 3\n"
    "  admin_connections_max: 2\n"
    "  in_flight_max: 1\n"
    "routes: []\n";

static void test_admin_limits_apart(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, admin_limit_routes, "admin-limits.db");
    /* The main listener's one request in flight (passed through, slow). */
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-adm-lim\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(500);
    expect_status(gw.port, "/stats", 503);
    expect_status(gw.admin_port, "/_idem/v1/health", 200);
    pthread_join(b.t, NULL);
    assert_int_equal(b.resp.status, 201);
    sys_resp_free(&b.resp);
    /* The main listener's connections all taken. */
    int main_fds[3], admin_fds[2];
    open_idle(gw.port, main_fds, 3);
    expect_status(gw.port, "/stats", 503);
    expect_status(gw.admin_port, "/_idem/v1/health", 200);
    /* And the admin listener's own limit. */
    open_idle(gw.admin_port, admin_fds, 2);
    expect_status(gw.admin_port, "/_idem/v1/health", 503);
    for (int i = 0; i < 2; i++)
        close(admin_fds[i]);
    expect_status_soon(gw.admin_port, "/_idem/v1/health", 200);
    for (int i = 0; i < 3; i++)
        close(main_fds[i]);
    expect_status_soon(gw.port, "/stats", 200);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A burst of connections at once, spread by the kernel over four event
 * loops (whatever the machine has): exactly connections_max are kept, and
 * every other one is answered 503 and closed (fails with a count per loop:
 * more are kept). */
static const char burst_routes[] =
    "event_loops: 4\n"
    "limits:\n"
    "  connections_max: 8\n"
    "  idle_timeout: 20s\n"
    "routes: []\n";

struct burst {
    int port;
    int fds[64];
};

static void burst_connect(void *arg, int i)
{
    struct burst *b = arg;
    open_idle_now(b->port, &b->fds[i]);
}

static void test_connection_limit_burst(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, burst_routes, "burst.db");
    assert_non_null(strstr(gw.ready, ", 4 event loops")); /* event_loops: 4 */
    struct burst *b = calloc(1, sizeof *b);
    b->port = gw.port;
    test_run_threads(64, burst_connect, b);
    sleep_ms(500);
    int kept = 0, refused = 0;
    for (int i = 0; i < 64; i++) {
        struct pollfd p = {.fd = b->fds[i], .events = POLLIN};
        if (poll(&p, 1, 500) == 0) {
            kept++; /* admitted, idle: nothing said to it */
        } else {
            char buf[64] = "";
            assert_true(recv(b->fds[i], buf, sizeof buf - 1, 0) > 0);
            assert_memory_equal(buf, "HTTP/1.1 503", 12);
            refused++;
        }
        close(b->fds[i]);
    }
    assert_int_equal(kept, 8);
    assert_int_equal(refused, 56);
    free(b);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The daemon's threads say what they are (top -H, perf, gdb): the event
 * loops past the first (which is the main thread), the store's writer, the
 * background thread; and there is no pool of workers. */
static void test_thread_names(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, burst_routes, "names.db");
    assert_int_equal(sys_threads(gw.pid, "idem-loop-1"), 1);
    assert_int_equal(sys_threads(gw.pid, "idem-loop-3"), 1);
    assert_int_equal(sys_threads(gw.pid, "idem-loop-4"), 0);
    assert_int_equal(sys_threads(gw.pid, "idem-writer"), 1);
    assert_int_equal(sys_threads(gw.pid, "idem-bg"), 1);
    assert_int_equal(sys_threads(gw.pid, "idem-worker"), 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static const char in_flight_routes[] =
    "event_loops: 2\n"
    "limits:\n"
    "  in_flight_max: 2\n"
    "routes:\n"
    "  - name: refund\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: @UP@\n"
    "    key: { json: refund_no }\n";

struct distinct_storm {
    int port;
    struct sys_resp resp[6];
};

static void one_distinct_post(void *arg, int i)
{
    struct distinct_storm *s = arg;
    static const char *const slow[] = {"X-Delay-Ms: 1500", NULL};
    char body[128];
    snprintf(body, sizeof body, "{\"refund_no\":\"R-busy-%d\",\"amount\":\"1.00\"}", i);
    sys_http(s->port, "POST", "/refunds", slow, body, 10000, &s->resp[i]);
}

static void test_in_flight_limit(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, in_flight_routes, "inflight.db");
    long before = sys_stat(service.port, "executions");
    /* Six different refunds at once, each held 1.5 s upstream, with room
     * for two (over every event loop): the others are told 503, and are not
     * executed. */
    struct distinct_storm s = {.port = gw.port};
    test_run_threads(6, one_distinct_post, &s);
    int created = 0, overloaded = 0;
    for (int i = 0; i < 6; i++) {
        if (s.resp[i].status == 201)
            created++;
        else if (s.resp[i].status == 503 && strstr(s.resp[i].m->body, "urn:idem:overloaded"))
            overloaded++;
        sys_resp_free(&s.resp[i]);
    }
    assert_int_equal(created, 2);
    assert_int_equal(overloaded, 4);
    assert_int_equal(sys_stat(service.port, "executions") - before, created);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* An upstream played by the test itself: it accepts one connection,
 * records the request bytes, and answers (or, with answer NULL, stays
 * silent until told to stop). */
struct raw_upstream {
    int listen_fd, port;
    const char *answer;
    char got[65536];
    size_t got_len;
    pthread_t t;
};

static void *raw_upstream_main(void *arg)
{
    struct raw_upstream *u = arg;
    int fd = accept(u->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ssize_t n;
    while (u->got_len < sizeof u->got - 1 &&
           (n = recv(fd, u->got + u->got_len, sizeof u->got - 1 - u->got_len, 0)) > 0) {
        u->got_len += (size_t)n;
        u->got[u->got_len] = '\0';
        const char *end = strstr(u->got, "\r\n\r\n");
        const char *cl = strstr(u->got, "Content-Length: ");
        if (end && cl && u->got_len >= (size_t)(end + 4 - u->got) + (size_t)atoi(cl + 16))
            break;
    }
    if (u->answer)
        send(fd, u->answer, strlen(u->answer), MSG_NOSIGNAL);
    else
        sleep_ms(1500); /* past the gateway's upstream_timeout */
    close(fd);
    return NULL;
}

static void raw_upstream_start(struct raw_upstream *u, const char *answer)
{
    memset(u, 0, sizeof *u);
    u->answer = answer;
    u->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(u->listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(u->listen_fd, 4), 0);
    getsockname(u->listen_fd, (struct sockaddr *)&a, &len);
    u->port = ntohs(a.sin_port);
    pthread_create(&u->t, NULL, raw_upstream_main, u);
}

static void raw_upstream_stop(struct raw_upstream *u)
{
    pthread_join(u->t, NULL);
    close(u->listen_fd);
}

static void start_idem_on(struct proc *gw, int upstream_port, const char *extra, const char *db)
{
    char routes[8192];
    snprintf(routes, sizeof routes,
             "routes:\n"
             "  - name: refund\n"
             "    match: { method: POST, path: /refunds }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { header: Idempotency-Key }\n"
             "    replay_headers: [content-type, x-kept]\n"
             "%s",
             upstream_port, extra);
    start_idem(gw, routes, db);
}

static void test_hop_by_hop_never_forwarded_nor_stored(void **state)
{
    (void)state;
    struct proc gw;
    struct raw_upstream u;
    raw_upstream_start(&u, "HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\n"
                           "X-Kept: yes\r\nX-Dropped: not-listed\r\n"
                           "Connection: X-Private\r\nX-Private: hop\r\n"
                           "Content-Length: 2\r\n\r\nok");
    start_idem_on(&gw, u.port, "", "hop.db");
    static const char *const hdrs[] = {
        "Idempotency-Key: H-1", "Connection: keep-alive, X-Client-Hop", "X-Client-Hop: secret",
        "Keep-Alive: timeout=5", "TE: trailers", "Upgrade: websocket", "X-End-To-End: kept",
        "Idem-Key: refund/FORGED", "Idem-Epoch: 999999", "Idem-Token: spent-here",
        "Idem_Epoch: 888888", "IDEM_KEY: refund/UNDERSCORE", "Keep_Alive: under-hop",
        "Transfer_Encoding: chunked", NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    raw_upstream_stop(&u);
    assert_int_equal(r.status, 201);
    /* What reached the upstream: end-to-end headers and Idem's own, never
     * a hop-by-hop one. */
    assert_non_null(strstr(u.got, "X-End-To-End: kept"));
    assert_non_null(strstr(u.got, "Idem-Key: refund/H-1"));
    assert_non_null(strstr(u.got, "Idem-Epoch: "));
    assert_null(strstr(u.got, "X-Client-Hop"));
    assert_null(strstr(u.got, "Keep-Alive"));
    assert_null(strstr(u.got, "TE: "));
    assert_null(strstr(u.got, "Upgrade"));
    assert_null(strstr(u.got, "under-hop")); /* Keep_Alive: the same to CGI-style upstreams */
    assert_null(strstr(u.got, "Transfer_Encoding"));
    /* Idem-Key and Idem-Epoch are Idem's alone: a client's copies (which an
     * upstream reading the first value would fence on) never go through,
     * nor does the token. */
    assert_null(strstr(u.got, "FORGED"));
    assert_null(strstr(u.got, "999999"));
    assert_null(strstr(u.got, "Idem-Token"));
    assert_null(strstr(u.got, "888888")); /* Idem_Epoch: the same to PHP or Rack */
    assert_null(strstr(u.got, "UNDERSCORE"));
    const char *epoch_at = strstr(u.got, "Idem-Epoch: ");
    assert_non_null(epoch_at);
    assert_null(strstr(epoch_at + 1, "Idem-Epoch: "));
    /* What the first client got: no hop-by-hop header of the upstream's. */
    assert_null(sys_header(&r, "X-Private"));
    assert_string_equal(sys_header(&r, "X-Kept"), "yes");
    sys_resp_free(&r);
    /* What is replayed: the listed headers only. */
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_string_equal(sys_header(&r, "X-Kept"), "yes");
    assert_null(sys_header(&r, "X-Dropped"));
    assert_null(sys_header(&r, "X-Private"));
    assert_memory_equal(r.m->body, "ok", 2);
    sys_resp_free(&r);
    /* A key that is not UTF-8 (a Latin-1 byte) is no key, on any store. */
    static const char *const latin1[] = {"Idempotency-Key: R-\xe9", NULL};
    sys_http(gw.port, "POST", "/refunds", latin1, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 400);
    assert_non_null(strstr(r.m->body, "key_invalid"));
    assert_non_null(strstr(r.m->body, "not valid UTF-8"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A client that asks for big answers and reads none of them is cut off after
 * send_timeout, rather than holding its connection (and the answers) for
 * ever; one that reads gets them all. */
static void test_client_that_never_reads_cut_off(void **state)
{
    (void)state;
    enum { BODY = 512 * 1024, ASKED = 16 };
    char *answer = malloc(BODY + 128);
    int head = sprintf(answer, "HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n", BODY);
    memset(answer + head, 'x', BODY);
    answer[head + BODY] = '\0';
    struct raw_upstream u;
    raw_upstream_start(&u, answer);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "limits:\n  send_timeout: 1s\n"
             "routes:\n  - name: refund\n    match: { method: POST, path: /refunds }\n"
             "    upstream: http://127.0.0.1:%d\n    key: { header: Idempotency-Key }\n",
             u.port);
    struct proc gw;
    start_idem(&gw, yaml, "never-reads.db");
    static const char *const hdrs[] = {"Idempotency-Key: BIG-1", NULL};
    struct sys_resp first;
    sys_http(gw.port, "POST", "/refunds", hdrs, "{}", 10000, &first);
    raw_upstream_stop(&u);
    free(answer);
    assert_int_equal(first.status, 201);
    assert_int_equal(first.m->body_len, BODY);
    sys_resp_free(&first);

    const char one[] = "POST /refunds HTTP/1.1\r\nHost: x\r\nIdempotency-Key: BIG-1\r\n"
                       "Content-Length: 2\r\n\r\n{}";
    char asked[ASKED * sizeof one];
    for (int i = 0; i < ASKED; i++)
        memcpy(asked + i * (sizeof one - 1), one, sizeof one - 1);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 16 * 1024; /* and no autotuning: the kernel holds little */
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gw.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, asked, ASKED * (sizeof one - 1), MSG_NOSIGNAL),
                     (ssize_t)(ASKED * (sizeof one - 1)));
    sleep_ms(3000); /* reading nothing, past send_timeout */
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    char buf[65536];
    ssize_t k;
    while ((k = recv(fd, buf, sizeof buf, 0)) > 0)
        got += (size_t)k;
    int why = k < 0 ? errno : 0;
    close(fd);
    /* Closed (an end, or a reset: what was unsent is dropped), not timed out
     * on our side, and with most of the answers never sent. */
    assert_true(k == 0 || why == ECONNRESET);
    assert_true(got < (size_t)ASKED * BODY / 2);

    /* The daemon is fine, and a client that reads gets the answer. */
    sys_http(gw.port, "POST", "/refunds", hdrs, "{}", 10000, &first);
    assert_int_equal(first.status, 201);
    assert_int_equal(first.m->body_len, BODY);
    sys_resp_free(&first);

    /* One that reads slowly but steadily (16 KiB every 50 ms, 2 MiB in all:
     * far longer than send_timeout) gets every byte: the clock runs from
     * the last byte it took, not from the last time the socket had room. */
    enum { SLOW = 4 };
    fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(send(fd, asked, SLOW * (sizeof one - 1), MSG_NOSIGNAL),
                     (ssize_t)(SLOW * (sizeof one - 1)));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t want = 0;
    got = 0;
    for (;;) {
        k = recv(fd, buf, 16 * 1024, 0);
        if (k <= 0)
            break;
        got += (size_t)k;
        if (got >= (size_t)SLOW * BODY) {
            want = got;
            break;
        }
        sleep_ms(50);
    }
    close(fd);
    if (want == 0)
        fail_msg("a slow reader got %zu bytes, then %s", got, k == 0 ? "the close" : "an error");
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Out of file descriptors (a limit of 100, which the daemon cannot raise,
 * and 150 clients): it says so at the start and once when accept() fails,
 * rather than retrying (and logging) in a loop, and serves new clients
 * again once connections close. */
static void test_out_of_descriptors_said_once(void **state)
{
    (void)state;
    char path[4200], db[4200], log[4200];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, ++config_seq);
    snprintf(db, sizeof db, "%s/nofile.db", dir);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, config_seq);
    write_config(path, reject_routes);
    char *argv[] = {"/bin/sh", "-c", "ulimit -n 100 && exec \"$0\" \"$@\"", (char *)idem_bin,
                    "serve", "-c", path, "--db", db, "--listen", "127.0.0.1:0", NULL};
    struct proc gw;
    sys_start(&gw, argv, log);
    enum { CLIENTS = 150 };
    int fds[CLIENTS];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gw.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < CLIENTS; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        assert_true(fds[i] >= 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&a, sizeof a), 0); /* the backlog */
    }
    sleep_ms(1500);
    char *text = sys_read_file(gw.log);
    assert_non_null(text);
    int failures = count_of(text, "accept");
    if (failures < 1 || failures > 4)
        fail_msg("%d lines about accept() in the log:\n%.2000s", failures, text);
    assert_non_null(strstr(text, "need up to"));
    assert_non_null(strstr(text, "out of file descriptors"));
    free(text);
    for (int i = 0; i < CLIENTS; i++)
        close(fds[i]);
    sleep_ms(500);
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-fd\",\"amount\":\"1.00\"}",
             5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Write a finished record through the JSON API, holding result. */
static void api_write_record(int port, const char *key, const char *result_json)
{
    char body[1024];
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"%s\",\"owner\":\"t\"}", key);
    struct sys_resp b;
    sys_admin_http(port, "POST", "/_idem/v1/records/begin", body, 5000, &b);
    assert_int_equal(b.status, 200);
    assert_non_null(strstr(b.m->body, "\"outcome\":\"NEW\""));
    long long epoch = atoll(strstr(b.m->body, "\"epoch\":") + 8);
    sys_resp_free(&b);
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"%s\",\"epoch\":%lld,\"result\":%s}",
             key, epoch, result_json);
    sys_admin_http(port, "POST", "/_idem/v1/records/complete", body, 5000, &b);
    assert_int_equal(b.status, 200);
    assert_non_null(strstr(b.m->body, "\"outcome\":\"COMPLETED\""));
    sys_resp_free(&b);
}

/* Key <prefix>-<i>: a finished record holding result (JSON), written
 * through the JSON API, then a duplicate of it through the gateway. */
static void replay_of_written(const struct proc *gw, const char *prefix, size_t i,
                              const char *result, struct sys_resp *r)
{
    char key[32], kh[64];
    snprintf(key, sizeof key, "%s-%zu", prefix, i);
    snprintf(kh, sizeof kh, "Idempotency-Key: %s", key);
    const char *hdrs[] = {kh, NULL};
    api_write_record(gw->admin_port, key, result);
    sys_http(gw->port, "POST", "/refunds", hdrs, "{}", 5000, r);
}

/* A replay sends what the first client got, header for header: a tab in a
 * value is kept (the parser takes it, so the store must give it back), and
 * a header the upstream's Connection names is hop-by-hop for the replay too.
 * A stored answer written through the JSON API is never sent as is:
 * framing and hop-by-hop headers are left out; a name that is no token, a
 * control character, an interim status give 500 stored_result_unreadable.
 * An upstream that answers 101 has not answered: 504, the outcome unknown. */
static void test_replay_sends_what_was_answered(void **state)
{
    (void)state;
    struct proc gw;
    struct raw_upstream u;
    raw_upstream_start(&u, "HTTP/1.1 201 Created\r\nContent-Type: text/plain;\tcharset=utf-8\r\n"
                           "X-Kept: hop-here\r\nConnection: X-Kept\r\n"
                           "Content-Length: 2\r\n\r\nok");
    start_idem_on(&gw, u.port, "    fingerprint: none\n", "replay-as-sent.db");
    static const char *const hdrs[] = {"Idempotency-Key: T-1", NULL};
    struct sys_resp first, again;
    sys_http(gw.port, "POST", "/refunds", hdrs, "{}", 5000, &first);
    raw_upstream_stop(&u);
    assert_int_equal(first.status, 201);
    assert_string_equal(sys_header(&first, "Content-Type"), "text/plain;\tcharset=utf-8");
    assert_null(sys_header(&first, "X-Kept"));
    for (int i = 0; i < 2; i++) {
        sys_http(gw.port, "POST", "/refunds", hdrs, "{}", 5000, &again);
        assert_int_equal(again.status, 201);
        assert_string_equal(sys_header(&again, "Idempotent-Replayed"), "true");
        assert_string_equal(sys_header(&again, "Content-Type"), "text/plain;\tcharset=utf-8");
        assert_null(sys_header(&again, "X-Kept"));
        expect_replay_of(&first, &again);
        sys_resp_free(&again);
    }
    sys_resp_free(&first);

    /* Framing and hop-by-hop headers are left out of the replay. */
    static const char *const framing[] = {
        "\"IDEM1 200 3 5\\nContent-Length: 0\\nTransfer-Encoding: chunked\\nX-B: 1\\nhello\"",
        "\"IDEM1 200 2 5\\nConnection: close\\nX-B: 1\\nhello\"",
        "\"IDEM1 200 2 5\\nContent_Length: 9\\nX-B: 1\\nhello\"",
        "\"IDEM1 200 2 5\\nProxy-Connection: close\\nX-B: 1\\nhello\"",
    };
    for (size_t i = 0; i < sizeof framing / sizeof framing[0]; i++) {
        replay_of_written(&gw, "H", i, framing[i], &again);
        if (again.status != 200 || again.m->body_len != 5 ||
            memcmp(again.m->body, "hello", 5) != 0 || !sys_header(&again, "X-B") ||
            sys_header(&again, "Transfer-Encoding") || sys_header(&again, "Content_Length") ||
            sys_header(&again, "Proxy-Connection"))
            fail_msg("stored %s replayed as %d %.*s", framing[i], again.status,
                     (int)again.m->body_len, again.m->body);
        sys_resp_free(&again);
    }
    /* What Idem could not have written is not sent at all. */
    static const char *const forged[] = {
        "\"IDEM1 200 1 5\\nBad Name(x): 1\\nhello\"",
        "\"IDEM1 200 1 5\\nX-A: \\u0001\\nhello\"",
        "\"IDEM1 100 0 5\\nhello\"",
    };
    for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
        replay_of_written(&gw, "F", i, forged[i], &again);
        if (again.status != 500 || !strstr(again.m->body, "stored_result_unreadable"))
            fail_msg("stored %s replayed as %d %.*s", forged[i], again.status,
                     (int)again.m->body_len, again.m->body);
        assert_null(sys_header(&again, "Transfer-Encoding"));
        sys_resp_free(&again);
    }
    /* One Idem would have written replays. */
    api_write_record(gw.admin_port, "OK-1", "\"IDEM1 202 1 5\\nX-Tab: a\\tb\\nhello\"");
    static const char *const okh[] = {"Idempotency-Key: OK-1", NULL};
    sys_http(gw.port, "POST", "/refunds", okh, "{}", 5000, &again);
    assert_int_equal(again.status, 202);
    assert_string_equal(sys_header(&again, "X-Tab"), "a\tb");
    assert_memory_equal(again.m->body, "hello", 5);
    sys_resp_free(&again);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    raw_upstream_start(&u, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
                           "Connection: Upgrade\r\n\r\n"
                           "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok");
    start_idem_on(&gw, u.port, "    upstream_timeout: 2s\n", "replay-101.db");
    static const char *const sw[] = {"Idempotency-Key: S-1", NULL};
    sys_http(gw.port, "POST", "/refunds", sw, "{}", 5000, &again);
    raw_upstream_stop(&u);
    assert_int_equal(again.status, 504);
    assert_non_null(strstr(again.m->body, "outcome_unknown"));
    sys_resp_free(&again);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A target as long as request_line_max allows reaches the upstream whole:
 * the gateway used to copy it into a 16 KiB buffer, which cut a longer one
 * (the upstream would have run another request than the one keyed). A path
 * over 8191 bytes is refused, since routes and keys read the path. */
static void test_long_target_forwarded_whole(void **state)
{
    (void)state;
    struct proc gw;
    struct raw_upstream u;
    raw_upstream_start(&u, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok");
    start_idem_on(&gw, u.port, "limits:\n  request_line_max: 48KiB\n", "long.db");
    size_t pad = 40000;
    char *target = malloc(pad + 32);
    char *o = target + sprintf(target, "/refunds?pad=");
    memset(o, 'A', pad);
    strcpy(o + pad, "&end=1");
    static const char *const hdrs[] = {"Idempotency-Key: L-1", NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", target, hdrs, "{}", 5000, &r);
    raw_upstream_stop(&u);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    char *line = malloc(pad + 64);
    sprintf(line, "POST %s HTTP/1.1\r\n", target);
    assert_memory_equal(u.got, line, strlen(line));
    free(line);
    /* A path that long is refused, not cut: routes and path keys read it. */
    o = target + sprintf(target, "/refunds/");
    memset(o, 'p', 9000);
    o[9000] = '\0';
    sys_http(gw.port, "POST", target, hdrs, "{}", 5000, &r);
    assert_int_equal(r.status, 414);
    assert_non_null(strstr(r.m->body, "path_too_long"));
    sys_resp_free(&r);
    free(target);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* A request without X-Request-Id gets one: in the access log, and to the
 * upstream, so that the two can be joined. An upstream that cannot be
 * reached has no status in the log, but the reason. */
static void test_request_id_made_and_passed_on(void **state)
{
    (void)state;
    struct raw_upstream u;
    raw_upstream_start(&u, "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok");
    char log[4200], extra[4400];
    snprintf(log, sizeof log, "%s/access-id-%d.log", dir, config_seq + 1);
    snprintf(extra, sizeof extra,
             "  - name: down\n    match: { method: POST, path: /down }\n"
             "    upstream: http://127.0.0.1:1\n    key: { header: Idempotency-Key }\n"
             "access_log: { to: %s }\nlog: { level: debug }\n", log);
    struct proc gw;
    start_idem_on(&gw, u.port, extra, "request-id.db");
    static const char *const hdrs[] = {"Idempotency-Key: RID-1", NULL};
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", hdrs, "{}", 5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    sys_http(gw.port, "POST", "/down", hdrs, "{}", 5000, &r);
    assert_int_equal(r.status, 502);
    sys_resp_free(&r);
    /* A problem names its request: instance, the id the log has. */
    sys_http(gw.port, "POST", "/refunds", NULL, "{}", 5000, &r);
    assert_int_equal(r.status, 400);
    json_t *p = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    char instance[128];
    snprintf(instance, sizeof instance, "%s",
             json_string_value(json_object_get(p, "instance")) ?: "");
    json_decref(p);
    sys_resp_free(&r);
    assert_int_equal(strncmp(instance, "urn:idem-request:", 17), 0);
    raw_upstream_stop(&u);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    size_t n;
    char **lines = read_lines(log, &n);
    json_t *j = json_loads(line_with(lines, n, "\"key\":\"RID-1\",\"outcome\":\"executed\""), 0,
                           NULL);
    const char *id = json_string_value(json_object_get(j, "request_id"));
    assert_non_null(id);
    char want[64];
    snprintf(want, sizeof want, "\r\nX-Request-Id: %s\r\n", id);
    u.got[u.got_len < sizeof u.got ? u.got_len : sizeof u.got - 1] = '\0';
    if (!strstr(u.got, want))
        fail_msg("the upstream got no %s:\n%s", want + 2, u.got);
    /* log.level: debug: the request's walk, by its id. */
    char *daemon = sys_read_file(gw.log);
    snprintf(want, sizeof want, "(request %s): begin -> forward after NEW", id);
    if (!strstr(daemon, want))
        fail_msg("no \"%s\" in the daemon's log:\n%s", want, daemon);
    free(daemon);
    json_decref(j);
    j = json_loads(line_with(lines, n, "\"problem\":\"key_missing\""), 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), instance + 17);
    json_decref(j);
    j = json_loads(line_with(lines, n, "\"path\":\"/down\""), 0, NULL);
    assert_true(json_is_null(json_object_get(j, "upstream_status")));
    assert_string_equal(json_string_value(json_object_get(j, "upstream_error")), "not_sent");
    json_decref(j);
    free_lines(lines, n);
}

/* Start idem in front of an upstream that reads the request and never
 * answers, send one POST, and expect the 504 saying the outcome is unknown
 * (its body holding what); the upstream is gone afterwards. */
static void post_to_silent_upstream(struct proc *gw, const char *route_extra, const char *db,
                                    const char *const *hdrs, const char *what)
{
    struct raw_upstream u;
    raw_upstream_start(&u, NULL);
    start_idem_on(gw, u.port, route_extra, db);
    struct sys_resp r;
    sys_http(gw->port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 504);
    assert_non_null(strstr(r.m->body, what));
    /* The claim's epoch as a member, for a tool that should not parse detail. */
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    assert_true(json_integer_value(json_object_get(j, "epoch")) > 0);
    json_decref(j);
    sys_resp_free(&r);
    raw_upstream_stop(&u);
}

/* Keys holding U+0085, U+009B, U+2028 and U+202E pass the key check (they
 * are no ASCII control) and reach the log (here the line of a hold that
 * finds an abandoned claim): escaped, never as the bytes that would break
 * or reorder a log line. The upstream listens and never answers. */
static void test_log_escapes_keys(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 16), 0);
    getsockname(fd, (struct sockaddr *)&a, &len);
    struct proc gw;
    start_idem_on(&gw, ntohs(a.sin_port),
                  "    upstream_timeout: 300ms\n    lease: 1s\n"
                  "    on_unknown_outcome: hold\n    retention: 1s\n",
                  "log-escape.db");
    static const char *const keys[][2] = {
        {"K-\xc2\x85-nel", "K-\\u0085-nel"},
        {"K-\xc2\x9b" "31m-csi", "K-\\u009b31m-csi"},
        {"K-\xe2\x80\xa8-ls", "K-\\u2028-ls"},
        {"K-\xe2\x80\xae-rlo", "K-\\u202e-rlo"},
    };
    for (int round = 0; round < 2; round++) {
        if (round)
            sleep_ms(1500); /* each hold (its lease, 1 s) has run its time */
        for (int i = 0; i < 4; i++) {
            char kh[96];
            snprintf(kh, sizeof kh, "Idempotency-Key: %s", keys[i][0]);
            const char *h[] = {kh, NULL};
            struct sys_resp r;
            sys_http(gw.port, "POST", "/refunds", h, "{\"a\":1}", 5000, &r);
            assert_int_equal(r.status, round ? 409 : 504);
            sys_resp_free(&r);
        }
    }
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    close(fd);
    char *log = sys_read_file(gw.log);
    for (int i = 0; i < 4; i++) {
        char said[128];
        snprintf(said, sizeof said, "refund/%s: a claim whose lease ran out", keys[i][1]);
        if (!strstr(log, said))
            fail_msg("the log does not say \"%s\":\n%s", said, log);
        assert_null(strstr(log, keys[i][0]));
    }
    free(log);
}

/* on_unknown_outcome: hold: a request whose outcome is unknown keeps its
 * claim past the lease, until an operator finishes it; then a retry runs. */
static void test_unknown_outcome_held(void **state)
{
    (void)state;
    struct proc gw;
    static const char *const hdrs[] = {"Idempotency-Key: T-hold", NULL};
    post_to_silent_upstream(&gw,
                            "    upstream_timeout: 400ms\n    lease: 1s\n"
                            "    on_unknown_outcome: hold\n"
                            "    retention: 7d\n", /* held a day: the longest lease */
                            "held-unknown.db", hdrs, "is held PROCESSING");
    struct sys_resp r;
    sleep_ms(1600); /* the lease is over: without hold, a retry would be forwarded (502) */
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 409);
    /* Not renewed for more than a third of its lease: nothing is running it,
     * and nothing changes before the hold ends (about a day) or an operator
     * acts. The client is told to wait, not to come back every second. */
    long wait = atol(sys_header(&r, "Retry-After"));
    if (wait < 86000 || wait > 86400)
        fail_msg("Retry-After: %ld", wait);
    json_t *held = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    sys_resp_free(&r);
    /* The operator decides it did not happen, and releases it. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund/T-hold", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"state\":\"PROCESSING\""));
    long long epoch = atoll(strstr(r.m->body, "\"epoch\":") + 8);
    sys_resp_free(&r);
    /* The 409 named the held claim: its epoch, and until when (a day on). */
    assert_int_equal(json_integer_value(json_object_get(held, "epoch")), epoch);
    const char *until = json_string_value(json_object_get(held, "held_until"));
    assert_non_null(until);
    assert_int_equal(strlen(until), 24); /* 2026-12-04T09:30:00.123Z */
    assert_int_equal(until[23], 'Z');
    json_decref(held);
    char body[256];
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"T-hold\",\"epoch\":%lld,\"retryable\":true}",
             epoch);
    api_expect(gw.admin_port, "/_idem/v1/records/fail", body, 200, "\"outcome\":\"COMPLETED\"");
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    /* Forwarded now (the upstream is gone: 502 or 504), not refused 409. */
    assert_true(r.status == 502 || r.status == 504);
    assert_null(strstr(r.m->body, "request_in_flight"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* hold with a retention shorter than the lease holds the claim for the
 * lease at least: never shorter than expire would. */
static void test_unknown_outcome_held_lease_at_least(void **state)
{
    (void)state;
    struct proc gw;
    static const char *const hdrs[] = {"Idempotency-Key: T-hold-short", NULL};
    post_to_silent_upstream(&gw,
                            "    upstream_timeout: 400ms\n    lease: 4s\n"
                            "    on_unknown_outcome: hold\n    retention: 500ms\n",
                            "held-short.db", hdrs, "is held PROCESSING");
    sleep_ms(1500); /* past the retention, inside the lease */
    struct sys_resp r;
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "request_in_flight"));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* on_unknown_outcome: hold across a crash: idem serve killed (-9) while
 * its upstream runs a hold route's request; after a restart and the lease,
 * a retry is held 409, not taken over and executed again (it was, before:
 * only an unknown outcome the daemon saw itself was held). */
static void test_hold_survives_crash(void **state)
{
    (void)state;
    static const char routes[] =
        "routes:\n" REFUND_ROUTE "    lease: 1s\n    on_unknown_outcome: hold\n";
    struct proc gw;
    start_idem(&gw, routes, "held-crash.db");
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 800", NULL};
    struct bg_post b = {.port = gw.port, .headers = slow,
                        .body = "{\"refund_no\":\"R-held-crash\",\"amount\":\"1.00\"}"};
    pthread_create(&b.t, NULL, bg_post_main, &b);
    sleep_ms(300); /* the request is in the service's hands */
    sys_stop(&gw, SIGKILL);
    pthread_join(b.t, NULL);
    sys_resp_free(&b.resp);
    sleep_ms(1000); /* the service has executed it; the lease has run out */
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    start_idem(&gw, routes, "held-crash.db");
    for (int i = 0; i < 2; i++) {
        struct sys_resp r;
        sys_http(gw.port, "POST", "/refunds", NULL, b.body, 5000, &r);
        /* The first finds the claim abandoned and holds it; the next, past
         * the lease again, finds it held. */
        if (r.status != 409 || (i == 0 && !strstr(r.m->body, "held PROCESSING")))
            fail_msg("retry %d after the crash: %d %s", i, r.status, r.m ? r.m->body : "");
        sys_resp_free(&r);
        sleep_ms(1200);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    struct sys_resp r;
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/refund/R-held-crash", NULL, 5000, &r);
    assert_non_null(strstr(r.m->body, "\"state\":\"PROCESSING\""));
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *text = sys_read_file(gw.log);
    assert_non_null(strstr(text, "refund/R-held-crash: a claim whose lease ran out"));
    free(text);
}

static void test_upstream_timeout_after_send(void **state)
{
    (void)state;
    struct proc gw;
    static const char *const hdrs[] = {"Idempotency-Key: T-1", NULL};
    post_to_silent_upstream(&gw, "    upstream_timeout: 400ms\n    lease: 30s\n", "timeout.db",
                            hdrs, "urn:idem:outcome_unknown");
    struct sys_resp r;
    /* It may have executed: the record stays PROCESSING, a retry is not
     * forwarded (nothing listens any more; a forward would be a 502). */
    sys_http(gw.port, "POST", "/refunds", hdrs, "{\"a\":1}", 5000, &r);
    assert_int_equal(r.status, 409);
    /* Its claim was written a moment ago: it may be alive, retry soon. */
    assert_string_equal(sys_header(&r, "Retry-After"), "1");
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
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
    /* The name that must not resolve (no-such-host.invalid) is refused in a
     * second, not after the resolver's default retries, where DNS is slow
     * or unreachable; the daemons inherit it. */
    setenv("RES_OPTIONS", "timeout:1 attempts:1", 1);
    service_bin = argv[2];
    signal(SIGPIPE, SIG_IGN);
    /* IDEM_TEST_FILTER=test_two_* runs only the tests it matches. */
    if (getenv("IDEM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("IDEM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_storm_wait_one_execution),
        cmocka_unit_test(test_storm_reject),
        cmocka_unit_test(test_replay_mismatch_missing_key),
        cmocka_unit_test(test_ambiguous_requests_refused),
        cmocka_unit_test(test_shared_space_two_routes),
        cmocka_unit_test(test_segment_wildcard_route),
        cmocka_unit_test(test_subject_scope),
        cmocka_unit_test(test_subjects_never_meet),
        cmocka_unit_test(test_token_flow),
        cmocka_unit_test(test_upstream_5xx_release),
        cmocka_unit_test(test_store_statuses_release_rejected),
        cmocka_unit_test(test_retention_header),
        cmocka_unit_test(test_problems_localised),
        cmocka_unit_test(test_upstream_unreachable),
        cmocka_unit_test(test_token_given_back_under_a_waiting_retry),
        cmocka_unit_test(test_one_token_one_key_under_resubmits),
        cmocka_unit_test(test_tokens_per_scene),
        cmocka_unit_test(test_token_subject_checked),
        cmocka_unit_test(test_upstream_killed_mid_request),
        cmocka_unit_test(test_daemon_killed_mid_request),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_sigterm_past_timeout_abandons),
        cmocka_unit_test(test_answer_in_time_read_after_stall),
        cmocka_unit_test(test_lease_timer_renews_lock_and_claim),
        cmocka_unit_test(test_lost_claim_cuts_the_call),
        cmocka_unit_test(test_other_payload_in_flight_422),
        cmocka_unit_test(test_sigterm_with_claims_queued_on_writer),
        cmocka_unit_test(test_health_sees_failing_writes),
        cmocka_unit_test(test_store_files_deleted),
        cmocka_unit_test(test_answer_kept_after_store_failure),
        cmocka_unit_test(test_half_closed_client_answered),
        cmocka_unit_test(test_client_reset_mid_request),
        cmocka_unit_test(test_replays_on_kept_alive_connection),
        cmocka_unit_test(test_upstream_answer_too_large),
        cmocka_unit_test(test_limits_and_malformed),
        cmocka_unit_test(test_slow_client_cut_off),
        cmocka_unit_test(test_empty_lines_no_reprieve),
        cmocka_unit_test(test_head_passed_through),
        cmocka_unit_test(test_expired_records_purged),
        cmocka_unit_test(test_bad_config_refused),
        cmocka_unit_test(test_second_daemon_on_one_store_refused),
        cmocka_unit_test(test_sighup_reloads_routes),
        cmocka_unit_test(test_upstream_names),
        cmocka_unit_test(test_json_api),
        cmocka_unit_test(test_json_api_on_the_loops),
        cmocka_unit_test(test_example_config_exposes_nothing),
        cmocka_unit_test(test_two_surfaces),
        cmocka_unit_test(test_failed_keys_slowed),
        cmocka_unit_test(test_tls),
        cmocka_unit_test(test_token_flood),
        cmocka_unit_test(test_access_log),
        cmocka_unit_test(test_signals_during_shutdown),
        cmocka_unit_test(test_access_log_parser_refusals),
        cmocka_unit_test(test_date_on_every_answer),
        cmocka_unit_test(test_key_optional),
        cmocka_unit_test(test_idempotency_key_sf_string),
        cmocka_unit_test(test_tombstone),
        cmocka_unit_test(test_request_id_made_and_passed_on),
        cmocka_unit_test(test_resolve_unknown_outcomes),
        cmocka_unit_test(test_resolve_status_url_down),
        cmocka_unit_test(test_states_storm),
        cmocka_unit_test(test_states_out_of_order),
        cmocka_unit_test(test_signed_callbacks),
        cmocka_unit_test(test_wechatpay_resource),
        cmocka_unit_test(test_signed_callbacks_rsa),
        cmocka_unit_test(test_per_peer_limits),
        cmocka_unit_test(test_admin_listen_overlap_refused),
        cmocka_unit_test(test_transition_reaches_replays),
        cmocka_unit_test(test_expect_continue),
        cmocka_unit_test(test_connection_limits),
        cmocka_unit_test(test_connection_limit_burst),
        cmocka_unit_test(test_thread_names),
        cmocka_unit_test(test_in_flight_limit),
        cmocka_unit_test(test_admin_limits_apart),
        cmocka_unit_test(test_hop_by_hop_never_forwarded_nor_stored),
        cmocka_unit_test(test_replay_sends_what_was_answered),
        cmocka_unit_test(test_client_that_never_reads_cut_off),
        cmocka_unit_test(test_out_of_descriptors_said_once),
        cmocka_unit_test(test_long_target_forwarded_whole),
        cmocka_unit_test(test_upstream_timeout_after_send),
        cmocka_unit_test(test_unknown_outcome_held),
        cmocka_unit_test(test_unknown_outcome_held_lease_at_least),
        cmocka_unit_test(test_hold_survives_crash),
        cmocka_unit_test(test_log_escapes_keys),
    };
    return cmocka_run_group_tests_name("gateway", tests, group_setup, group_teardown);
}
