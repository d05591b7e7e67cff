/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_verify.c — `idem verify` against the real example refund service, on
 * loopback, in a temp dir:
 *
 *   test_verify IDEM_BINARY REFUND_SERVICE_BINARY
 *
 * One refund service runs for the whole group in its broken --naive mode
 * (check, 200 ms delay, insert; no UNIQUE constraint; every well-formed
 * request counted as an execution before the check). Every scenario is run
 * twice: straight at the naive service, or behind a misconfigured gateway,
 * where it must FAIL; and behind `idem serve` configured for it, where it
 * must PASS with the expected executions. `idem verify` runs as a child
 * process; the tests read its exit status and its --json document. Bad
 * invocations must exit 2 naming the problem.
 *
 * The binary doubles as a --count-cmd: `test_verify --count PORT` prints the
 * service's GET /count.
 */
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

#define OUT_MAX (1 << 20)
#define ERR_MAX (64 * 1024)
#define VERIFY_DEADLINE_MS 240000

static const char *idem_bin, *service_bin;
static char self_bin[4096];
static char *dir;
static struct proc naive;
static int config_seq;
static char naive_url[128], count_url[128];

static const char refund_body[] = "{\"refund_no\":\"{{key}}\",\"amount\":\"1.00\"}";

/* ---- idem serve in front of the naive service ---- */

/* The refund route with these layers, and extra lines (scope,
 * fingerprint...) added to it. */
static void refund_routes_layered(char *out, size_t len, const char *layers, const char *extra)
{
    snprintf(out, len,
             "subject_header: X-Subject\n"
             "routes:\n"
             "  - name: refund\n"
             "    match: { method: POST, path: /refunds }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { json: refund_no }\n"
             "    layers: %s\n"
             "    in_flight: wait\n"
             "    wait_timeout: 30s\n"
             "    lease: 30s\n"
             "    upstream_timeout: 20s\n"
             "    replay_headers: [content-type, location]\n"
             "%s",
             naive.port, layers, extra ? extra : "");
}

static void refund_routes(char *out, size_t len, const char *extra)
{
    refund_routes_layered(out, len, "[lock, record]", extra);
}

/* The payment callback and the operator's re-push, in these key spaces. */
static void payment_routes(char *out, size_t len, const char *space_cb, const char *space_ops)
{
    snprintf(out, len,
             "routes:\n"
             "  - name: payment-callback\n"
             "    match: { method: POST, path: /callbacks/payment }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { json: serial_no }\n"
             "    space: %s\n"
             "    fingerprint: [serial_no, amount]\n"
             "    in_flight: wait\n"
             "    wait_timeout: 30s\n"
             "  - name: payment-repush\n"
             "    match: { method: POST, path: /admin/payments/repush }\n"
             "    upstream: http://127.0.0.1:%d\n"
             "    key: { json: serial_no }\n"
             "    space: %s\n"
             "    fingerprint: [serial_no, amount]\n"
             "    in_flight: wait\n"
             "    wait_timeout: 30s\n",
             naive.port, space_cb, naive.port, space_ops);
}

static void start_idem(struct proc *p, const char *yaml)
{
    char path[4200], db[4200], log[4200];
    config_seq++;
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, config_seq);
    snprintf(db, sizeof db, "%s/idem-%d.db", dir, config_seq);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, config_seq);
    sys_write_file(path, yaml);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--db", db, "--listen", "127.0.0.1:0",
                    NULL};
    sys_start(p, argv, log);
}

static void gw_url(char *out, size_t len, const struct proc *gw, const char *path)
{
    snprintf(out, len, "http://127.0.0.1:%d%s", gw->port, path);
}

/* ---- running idem verify ---- */

struct verify_run {
    int status;
    char *out; /* stdout */
    char err[ERR_MAX];
    json_t *doc; /* stdout as JSON, when it parses */
};

/* idem verify with these arguments (NULL-terminated, after "verify"). */
static void run_verify(struct verify_run *v, const char *const *args)
{
    const char *argv[64];
    size_t n = 0;
    argv[n++] = idem_bin;
    argv[n++] = "verify";
    for (const char *const *a = args; *a; a++) {
        assert_true(n < 63);
        argv[n++] = *a;
    }
    argv[n] = NULL;
    memset(v, 0, sizeof *v);
    v->out = calloc(1, OUT_MAX + 1);
    assert_non_null(v->out);
    int op[2], ep[2];
    assert_int_equal(pipe(op), 0);
    assert_int_equal(pipe(ep), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(op[1], 1);
        dup2(ep[1], 2);
        close(op[0]);
        close(ep[0]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(op[1]);
    close(ep[1]);
    size_t olen = 0, elen = 0;
    int open_fds = 2;
    struct pollfd p[2] = {{.fd = op[0], .events = POLLIN}, {.fd = ep[0], .events = POLLIN}};
    long long deadline = test_mono_ms() + VERIFY_DEADLINE_MS;
    while (open_fds > 0 && test_mono_ms() < deadline) {
        if (poll(p, 2, 200) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            char scratch[4096], *dst = scratch;
            size_t room = sizeof scratch;
            if (i == 0 && olen < OUT_MAX)
                dst = v->out + olen, room = OUT_MAX - olen;
            if (i == 1 && elen < ERR_MAX - 1)
                dst = v->err + elen, room = ERR_MAX - 1 - elen;
            ssize_t r = read(p[i].fd, dst, room);
            if (r > 0 && dst != scratch)
                *(i == 0 ? &olen : &elen) += (size_t)r;
            if (r <= 0) {
                close(p[i].fd);
                p[i].fd = -1;
                open_fds--;
            }
        }
    }
    int status;
    if (open_fds > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("idem verify ran over %d s; stderr: %s", VERIFY_DEADLINE_MS / 1000, v->err);
    }
    waitpid(pid, &status, 0);
    v->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    v->doc = json_loads(v->out, 0, NULL);
}

static void verify_free(struct verify_run *v)
{
    json_decref(v->doc);
    free(v->out);
    v->out = NULL;
    v->doc = NULL;
}

static json_t *scenario(const struct verify_run *v, const char *name)
{
    if (!v->doc)
        fail_msg("idem verify printed no JSON (exit %d); stdout: %.2000s; stderr: %.2000s",
                 v->status, v->out, v->err);
    size_t i;
    json_t *s;
    json_array_foreach(json_object_get(v->doc, "scenarios"), i, s) {
        if (strcmp(json_string_value(json_object_get(s, "name")), name) == 0)
            return s;
    }
    fail_msg("no scenario %s in: %.2000s", name, v->out);
    return NULL;
}

static long long field(json_t *s, const char *name)
{
    json_t *f = json_object_get(s, name);
    if (!json_is_integer(f))
        fail_msg("no integer %s in the scenario %s", name,
                 json_string_value(json_object_get(s, "name")));
    return (long long)json_integer_value(f);
}

static const char *text(json_t *s, const char *name)
{
    const char *t = json_string_value(json_object_get(s, name));
    return t ? t : "";
}

/* The scenario's verdict, exit status and executions, with the reason and
 * the whole output when they are not what the test expects. */
static json_t *expect(const struct verify_run *v, const char *name, const char *verdict,
                      int exit_status)
{
    json_t *s = scenario(v, name);
    if (strcmp(text(s, "verdict"), verdict) != 0 || v->status != exit_status)
        fail_msg("%s: %s (exit %d), expected %s (exit %d): %s\nstdout: %.3000s\nstderr: %.2000s",
                 name, text(s, "verdict"), v->status, verdict, exit_status, text(s, "reason"),
                 v->out, v->err);
    return s;
}

/* Runs one scenario at url with the refund body and the count URL, plus
 * extra arguments (NULL-terminated). */
static void verify_scenario(struct verify_run *v, const char *name, const char *url,
                            const char *const *extra)
{
    const char *args[48] = {"--json", "--no-progress", "--settle", "100ms", "--timeout", "30s",
                            "-s", name, "--count-url", count_url};
    size_t n = 10;
    int has_body = 0;
    for (const char *const *e = extra; e && *e; e++) {
        has_body |= strcmp(*e, "-d") == 0;
        args[n++] = *e;
    }
    if (!has_body) {
        args[n++] = "-d";
        args[n++] = refund_body;
    }
    args[n++] = url;
    args[n] = NULL;
    run_verify(v, args);
}

/* ---- burst ---- */

static void test_burst_naive_fails(void **state)
{
    (void)state;
    struct verify_run v;
    verify_scenario(&v, "burst", naive_url, NULL);
    json_t *s = expect(&v, "burst", "FAIL", 1);
    /* Every one of the 100 got through the check before any inserted. */
    long long e = field(s, "executions");
    if (e <= 1)
        fail_msg("%lld executions", e);
    assert_int_equal(field(s, "expected_executions"), 1);
    assert_int_equal(field(s, "requests"), 100);
    assert_string_equal(text(s, "evidence"), "count");
    char want[64];
    snprintf(want, sizeof want, "%lld duplicate executions", e - 1);
    assert_non_null(strstr(text(s, "reason"), want));
    verify_free(&v);
}

static void test_burst_behind_idem_passes(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    struct verify_run v;
    verify_scenario(&v, "burst", url, NULL);
    json_t *s = expect(&v, "burst", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(s, "requests"), 100);
    /* in_flight: wait: every duplicate got the first answer, replayed. */
    assert_int_equal(field(s, "duplicates"), 99);
    assert_int_equal(field(s, "identical"), 99);
    assert_int_equal(field(s, "replayed"), 99);
    assert_int_equal(field(json_object_get(s, "statuses"), "201"), 100);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- double-click ---- */

static void test_double_click(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    static const char *const small[] = {"-n", "10", NULL};
    verify_scenario(&v, "double-click", naive_url, small);
    json_t *s = expect(&v, "double-click", "FAIL", 1);
    assert_int_equal(field(s, "expected_executions"), 5);
    assert_true(field(s, "executions") > 5);
    verify_free(&v);

    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "double-click", url, small);
    s = expect(&v, "double-click", "PASS", 0);
    assert_int_equal(field(s, "executions"), 5);
    assert_int_equal(field(s, "requests"), 10);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* The run stopped before its scenarios (exit 2), saying why; v freed. */
static void expect_refused(struct verify_run *v, const char *why)
{
    if (v->status != 2 || !strstr(v->err, why))
        fail_msg("exit %d, expected 2 saying \"%s\":\n%s", v->status, why, v->err);
    verify_free(v);
}

/* ---- a token route ---- */

/* A route with the token layer: without a token every request is 428 and
 * nothing is verified; with --token-scene each business key gets its own
 * token, its duplicates carry it, and the burst and the double-click pass
 * with one execution per key. */
static void test_token_route(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    refund_routes_layered(yaml, sizeof yaml, "[token, record]",
                          "    token_scene: refund-form\n");
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    struct verify_run v;
    static const char *const none[] = {"-n", "10", "-H", "X-Subject: alice", NULL};
    verify_scenario(&v, "double-click", url, none);
    if (!strstr(v.out, "428"))
        fail_msg("without a token, no 428 in:\n%s", v.out);
    verify_free(&v);
    static const char *const tokens[] = {"-n", "10", "-H", "X-Subject: alice",
                                         "--token-scene", "refund-form", NULL};
    verify_scenario(&v, "double-click", url, tokens);
    json_t *s = expect(&v, "double-click", "PASS", 0);
    assert_int_equal(field(s, "executions"), 5);
    assert_int_equal(field(json_object_get(s, "statuses"), "201"), 10);
    verify_free(&v);
    verify_scenario(&v, "burst", url, tokens);
    s = expect(&v, "burst", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    verify_free(&v);
    static const char *const wrong[] = {"-n", "10", "--token-scene", "nope", NULL};
    verify_scenario(&v, "burst", url, wrong);
    expect_refused(&v, "--token-scene nope: POST /_idem/v1/tokens answered 400");
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- over TLS ---- */

/* idem serve with TLS on its listener: verify checks it over https://,
 * trusting the test's CA with --cacert (and offering a client certificate,
 * which the listener does not ask for); without the CA it refuses the
 * server's certificate and says so, and checks nothing. */
static void test_https(void **state)
{
    (void)state;
    char tls[4200], yaml[16384], route[4096], url[160], ca[4300], cert[4300], key[4300];
    snprintf(tls, sizeof tls, "%s/tls", dir);
    mkdir(tls, 0700);
    sys_make_cert(tls, "CA", "verify-test-ca", NULL, NULL);
    sys_make_cert(tls, "gw", "localhost", "DNS:localhost,IP:127.0.0.1", "CA");
    sys_make_cert(tls, "client", "verify-client", "DNS:verify-client", "CA");
    refund_routes(route, sizeof route, NULL);
    /* start_idem's --listen takes the address; the file's tls stays. */
    snprintf(yaml, sizeof yaml,
             "listen: { address: \"127.0.0.1:8443\", tls: { cert: %s/gw.pem, key: %s/gw.key } }\n"
             "%s",
             tls, tls, route);
    struct proc gw;
    start_idem(&gw, yaml);
    snprintf(url, sizeof url, "https://localhost:%d/refunds", gw.port);
    snprintf(ca, sizeof ca, "%s/CA.pem", tls);
    snprintf(cert, sizeof cert, "%s/client.pem", tls);
    snprintf(key, sizeof key, "%s/client.key", tls);
    struct verify_run v;
    const char *trusted[] = {"-n", "20", "--cacert", ca, "--cert", cert, "--key", key, NULL};
    verify_scenario(&v, "burst", url, trusted);
    json_t *s = expect(&v, "burst", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(json_object_get(s, "statuses"), "201"), 20);
    verify_free(&v);
    const char *untrusted[] = {"-n", "20", NULL};
    verify_scenario(&v, "burst", url, untrusted);
    expect_refused(&v, "TLS: unable to get local issuer certificate");
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- retry-after-success ---- */

static void test_retry_after_success(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    static const char *const small[] = {"-n", "4", "--spacing", "50ms", NULL};
    /* The naive service refuses the retries (409), but only after it has
     * counted them as executions: the check-then-insert itself is work. */
    verify_scenario(&v, "retry-after-success", naive_url, small);
    json_t *s = expect(&v, "retry-after-success", "FAIL", 1);
    assert_int_equal(field(s, "executions"), 4);
    assert_int_equal(field(s, "requests"), 4);
    verify_free(&v);

    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "retry-after-success", url, small);
    s = expect(&v, "retry-after-success", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(s, "identical"), 3);
    assert_int_equal(field(s, "replayed"), 3);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- retry-after-timeout ---- */

static void test_retry_after_timeout(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    /* The endpoint takes 1.5 s; the client gives up after 300 ms. */
    static const char *const slow[] = {"-H", "X-Delay-Ms: 1500", "--client-timeout", "300ms",
                                       NULL};
    verify_scenario(&v, "retry-after-timeout", naive_url, slow);
    json_t *s = expect(&v, "retry-after-timeout", "FAIL", 1);
    assert_int_equal(field(s, "gave_up"), 1);
    assert_true(field(s, "executions") >= 2);
    verify_free(&v);

    /* Behind idem the retry waits for the abandoned request's answer. */
    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "retry-after-timeout", url, slow);
    s = expect(&v, "retry-after-timeout", "PASS", 0);
    assert_int_equal(field(s, "gave_up"), 1);
    assert_int_equal(field(s, "executions"), 1);
    assert_true(field(s, "replayed") >= 1);
    assert_null(json_object_get(s, "note")); /* the client really gave up */
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- channels ---- */

static void run_channels(struct verify_run *v, const struct proc *gw)
{
    char main_url[128], repush[128];
    gw_url(main_url, sizeof main_url, gw, "/callbacks/payment");
    gw_url(repush, sizeof repush, gw, "/admin/payments/repush");
    const char *const extra[] = {
        "-d", "{\"serial_no\":\"{{key}}\",\"amount\":\"42.00\",\"channel\":\"alipay\"}",
        "--channel", repush,
        "--channel-data", "{\"serial_no\":\"{{key}}\",\"amount\":\"42.00\",\"operator\":\"ops\"}",
        NULL};
    verify_scenario(v, "channels", main_url, extra);
}

static void test_channels(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096];
    struct verify_run v;
    /* Callback and re-push share the key space: one payment. */
    payment_routes(yaml, sizeof yaml, "payment", "payment");
    start_idem(&gw, yaml);
    run_channels(&v, &gw);
    json_t *s = expect(&v, "channels", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(s, "requests"), 4);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* Each route its own space: the re-push executes the payment again. */
    payment_routes(yaml, sizeof yaml, "payment-callback", "payment-repush");
    start_idem(&gw, yaml);
    run_channels(&v, &gw);
    s = expect(&v, "channels", "FAIL", 1);
    assert_int_equal(field(s, "executions"), 2);
    assert_non_null(strstr(text(s, "reason"), "1 duplicate execution"));
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- payload-mismatch ---- */

static void test_payload_mismatch(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    refund_routes(yaml, sizeof yaml, NULL); /* fingerprint: body, the default */
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "payload-mismatch", url, NULL);
    json_t *s = expect(&v, "payload-mismatch", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(json_object_get(s, "statuses"), "422"), 1);
    assert_non_null(strstr(text(s, "note"), "\"amount\": \"1.00\" -> \"1.01\""));
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* fingerprint: none: the changed payload gets the first answer. */
    refund_routes(yaml, sizeof yaml, "    fingerprint: none\n");
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "payload-mismatch", url, NULL);
    s = expect(&v, "payload-mismatch", "FAIL", 1);
    assert_int_equal(field(s, "executions"), 1);
    assert_non_null(strstr(text(s, "reason"), "the changed payload was answered 201"));
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* Straight at the naive service, with the changed body given. */
    static const char *const given[] = {
        "--mismatch-data", "{\"refund_no\":\"{{key}}\",\"amount\":\"2.00\"}", NULL};
    verify_scenario(&v, "payload-mismatch", naive_url, given);
    s = expect(&v, "payload-mismatch", "FAIL", 1);
    assert_int_equal(field(s, "executions"), 3);
    verify_free(&v);
}

/* ---- cross-subject ---- */

static void test_cross_subject(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    refund_routes(yaml, sizeof yaml, "    scope: subject\n");
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "cross-subject", url, NULL);
    json_t *s = expect(&v, "cross-subject", "PASS", 0);
    assert_int_equal(field(s, "executions"), 2);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* scope: global: subject B is replayed subject A's refund. */
    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    static const char *const subjects[] = {"--subjects", "alice,bob", NULL};
    verify_scenario(&v, "cross-subject", url, subjects);
    s = expect(&v, "cross-subject", "FAIL", 1);
    assert_int_equal(field(s, "executions"), 1);
    assert_int_equal(field(s, "expected_executions"), 2);
    assert_non_null(strstr(text(s, "reason"), "leaked across subjects"));
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- mixed ---- */

static void test_mixed(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    static const char *const small[] = {"-n", "20", "--dups", "4", "-c", "8", NULL};
    verify_scenario(&v, "mixed", naive_url, small);
    json_t *s = expect(&v, "mixed", "FAIL", 1);
    assert_int_equal(field(s, "keys"), 5);
    assert_int_equal(field(s, "executions"), 20);
    verify_free(&v);

    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    verify_scenario(&v, "mixed", url, small);
    s = expect(&v, "mixed", "PASS", 0);
    assert_int_equal(field(s, "executions"), 5);
    assert_int_equal(field(s, "requests"), 20);
    assert_true(json_real_value(json_object_get(s, "requests_per_second")) > 0);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* ---- evidence, output, the whole run ---- */

static void test_responses_only(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128];
    struct verify_run v;
    /* No count source: 30 different 201s are 30 executions all the same. */
    const char *naive_args[] = {"--json", "--no-progress", "--timeout", "30s", "-s", "burst",
                                "-n", "30", "-d",
                                refund_body, naive_url, NULL};
    run_verify(&v, naive_args);
    json_t *s = expect(&v, "burst", "FAIL", 1);
    assert_string_equal(text(s, "evidence"), "responses");
    assert_string_equal(json_string_value(json_object_get(v.doc, "evidence")), "responses");
    assert_true(field(s, "executions") > 1);
    assert_non_null(strstr(text(s, "reason"), "weaker evidence"));
    verify_free(&v);

    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    const char *gw_args[] = {"--json", "--no-progress", "--timeout", "30s", "-s", "burst",
                             "-n", "30", "-d",
                             refund_body, url, NULL};
    run_verify(&v, gw_args);
    s = expect(&v, "burst", "PASS", 0);
    assert_int_equal(field(s, "executions"), 1);
    assert_string_equal(text(s, "evidence"), "responses");
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The default run: every scenario that applies, the table on stdout, the
 * count from a command, JUnit for CI. Small sizes keep it quick. */
static void test_all_scenarios_count_cmd_junit(void **state)
{
    (void)state;
    struct proc gw;
    char yaml[4096], url[128], cmd[4400], junit[4200];
    struct verify_run v;
    snprintf(cmd, sizeof cmd, "'%s' --count %d", self_bin, naive.port);
    snprintf(junit, sizeof junit, "%s/junit-pass.xml", dir);
    refund_routes(yaml, sizeof yaml, NULL);
    start_idem(&gw, yaml);
    gw_url(url, sizeof url, &gw, "/refunds");
    /* cross-subject needs scope: subject, which this route lacks: left out. */
    const char *pass_args[] = {"--no-progress", "--settle", "100ms", "--timeout", "30s", "-n",
                               "10", "-s",
                               "burst,double-click,retry-after-success,payload-mismatch,mixed",
                               "--count-cmd", cmd, "--junit", junit, "-d", refund_body, url,
                               NULL};
    run_verify(&v, pass_args);
    if (v.status != 0)
        fail_msg("exit %d\nstdout: %s\nstderr: %s", v.status, v.out, v.err);
    assert_non_null(strstr(v.out, "counted by the command"));
    assert_non_null(strstr(v.out, "5 passed, 0 failed, 0 skipped"));
    char *xml = slurp(junit);
    assert_non_null(strstr(xml, "<testsuites name=\"idem verify\" tests=\"5\" failures=\"0\""));
    assert_non_null(strstr(xml, "<testcase classname=\"idem.verify\" name=\"burst\""));
    assert_null(strstr(xml, "<failure"));
    free(xml);
    verify_free(&v);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    /* All of them at the naive service: all fail but channels, which does
     * not apply without --channel. */
    snprintf(junit, sizeof junit, "%s/junit-fail.xml", dir);
    const char *fail_args[] = {"--no-progress", "--settle", "100ms", "--timeout", "30s", "-n",
                               "10", "--count-cmd",
                               cmd, "--junit", junit, "-d", refund_body, "--json", naive_url,
                               NULL};
    run_verify(&v, fail_args);
    assert_int_equal(v.status, 1);
    expect(&v, "burst", "FAIL", 1);
    expect(&v, "channels", "SKIP", 1);
    assert_int_equal(field(json_object_get(v.doc, "summary"), "failed"), 7);
    xml = slurp(junit);
    assert_non_null(strstr(xml, "failures=\"7\" errors=\"0\" skipped=\"1\""));
    assert_non_null(strstr(xml, "<failure type=\"duplicate-execution\""));
    assert_non_null(strstr(xml, "<skipped message=\"not applicable: no --channel URL given\"/>"));
    free(xml);
    verify_free(&v);
}

/* ---- bad invocations: exit 2, naming the problem ---- */

static void expect_usage_error(const char *const *args, const char *needle)
{
    const char *argv[32];
    size_t n = 0;
    char err[8192];
    argv[n++] = idem_bin;
    argv[n++] = "verify";
    for (const char *const *a = args; *a; a++)
        argv[n++] = *a;
    argv[n] = NULL;
    int status = sys_run_fail((char *const *)argv, err, sizeof err);
    if (status != 2 || !strstr(err, needle))
        fail_msg("exit %d, stderr \"%s\"; expected 2 and \"%s\"", status, err, needle);
}

static void test_bad_invocations(void **state)
{
    (void)state;
    char dead[128], dead_count[128], missing[4200], cmd[4400];
    int port = sys_free_port();
    snprintf(dead, sizeof dead, "http://127.0.0.1:%d/refunds", port);
    snprintf(dead_count, sizeof dead_count, "http://127.0.0.1:%d/count", port);
    snprintf(missing, sizeof missing, "%s/no-such-body.json", dir);

    const char *no_url[] = {"-d", refund_body, NULL};
    expect_usage_error(no_url, "no URL given");
    const char *half[] = {"-d", refund_body, "--cert", "/dev/null",
                          "https://127.0.0.1/refunds", NULL};
    expect_usage_error(half, "--cert and --key go together");
    const char *plain_ca[] = {"-d", refund_body, "--cacert", "/dev/null", dead, NULL};
    expect_usage_error(plain_ca, "for https:// URLs only");
    const char *not_url[] = {"-d", refund_body, "127.0.0.1:8080/refunds", NULL};
    expect_usage_error(not_url, "not an http:// or https:// URL");
    const char *unreadable[] = {"--body-file", missing, naive_url, NULL};
    expect_usage_error(unreadable, "no-such-body.json: cannot read it");
    const char *unknown[] = {"-d", "{\"refund_no\":\"{{refund}}\"}", naive_url, NULL};
    expect_usage_error(unknown, "unknown placeholder {{refund}}");
    const char *unclosed[] = {"-d", "{\"refund_no\":\"{{key\"}", naive_url, NULL};
    expect_usage_error(unclosed, "never closed");
    const char *no_key[] = {"-d", "{\"refund_no\":\"R-1\"}", naive_url, NULL};
    expect_usage_error(no_key, "no {{key}}");
    const char *bad_json[] = {"-d", "{\"refund_no\":\"{{key}}\",}", naive_url, NULL};
    expect_usage_error(bad_json, "does not parse");
    const char *bad_scenario[] = {"-s", "stampede", "-d", refund_body, naive_url, NULL};
    expect_usage_error(bad_scenario, "unknown scenario 'stampede'");
    const char *no_channel[] = {"-s", "channels", "-d", refund_body, naive_url, NULL};
    expect_usage_error(no_channel, "no --channel");
    const char *bad_header[] = {"-H", "X Bad: 1", "-d", refund_body, naive_url, NULL};
    expect_usage_error(bad_header, "-H 'X Bad: 1'");
    const char *bad_timeout[] = {"--timeout", "soon", "-d", refund_body, naive_url, NULL};
    expect_usage_error(bad_timeout, "--timeout soon");
    const char *elsewhere[] = {"-d", refund_body, "--channel", "http://10.255.255.1/x",
                               naive_url, NULL};
    expect_usage_error(elsewhere, "sends only to the URL's host");
    const char *unreachable[] = {"-d", refund_body, dead, NULL};
    expect_usage_error(unreachable, "cannot connect to 127.0.0.1");
    const char *count_down[] = {"-d", refund_body, "--count-url", dead_count, naive_url, NULL};
    expect_usage_error(count_down, "--count-url");
    const char *count_fails[] = {"-d", refund_body, "--count-cmd", "echo broken >&2; exit 3",
                                 naive_url, NULL};
    expect_usage_error(count_fails, "failed with exit status 3: broken");
    const char *count_nan[] = {"-d", refund_body, "--count-cmd", "echo many", naive_url, NULL};
    expect_usage_error(count_nan, "printed \"many\", not a number");
    snprintf(cmd, sizeof cmd, "'%s' --count %d", self_bin, port);
    const char *count_cmd_down[] = {"-d", refund_body, "--count-cmd", cmd, naive_url, NULL};
    expect_usage_error(count_cmd_down, "--count-cmd");
    const char *too_many[] = {"-n", "5000", "--max-requests", "100", "-d", refund_body,
                              naive_url, NULL};
    expect_usage_error(too_many, "over --max-requests");
}

/* ---- the group ---- */

static int group_setup(void **state)
{
    (void)state;
    dir = test_mkdtemp();
    static const char *const naive_args[] = {"--naive", "--delay-ms", "200", NULL};
    sys_start_service(&naive, service_bin, dir, "naive", naive_args);
    snprintf(naive_url, sizeof naive_url, "http://127.0.0.1:%d/refunds", naive.port);
    snprintf(count_url, sizeof count_url, "http://127.0.0.1:%d/count", naive.port);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    sys_finish(&naive, dir);
    return 0;
}

/* test_verify --count PORT: the service's GET /count, for --count-cmd. */
static int print_count(const char *port)
{
    struct sys_resp r;
    sys_http(atoi(port), "GET", "/count", NULL, NULL, 10000, &r);
    if (r.status != 200) {
        fprintf(stderr, "GET /count: %d\n", r.status);
        sys_resp_free(&r);
        return 1;
    }
    fwrite(r.m->body, 1, r.m->body_len, stdout);
    sys_resp_free(&r);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--count") == 0)
        return print_count(argv[2]);
    if (argc != 3) {
        fprintf(stderr, "usage: %s IDEM_BINARY REFUND_SERVICE_BINARY\n", argv[0]);
        return 2;
    }
    idem_bin = argv[1];
    service_bin = argv[2];
    ssize_t n = readlink("/proc/self/exe", self_bin, sizeof self_bin - 1);
    if (n <= 0) {
        fprintf(stderr, "cannot find my own path\n");
        return 2;
    }
    self_bin[n] = '\0';
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_naive_fails),
        cmocka_unit_test(test_burst_behind_idem_passes),
        cmocka_unit_test(test_double_click),
        cmocka_unit_test(test_token_route),
        cmocka_unit_test(test_https),
        cmocka_unit_test(test_retry_after_success),
        cmocka_unit_test(test_retry_after_timeout),
        cmocka_unit_test(test_channels),
        cmocka_unit_test(test_payload_mismatch),
        cmocka_unit_test(test_cross_subject),
        cmocka_unit_test(test_mixed),
        cmocka_unit_test(test_responses_only),
        cmocka_unit_test(test_all_scenarios_count_cmd_junit),
        cmocka_unit_test(test_bad_invocations),
    };
    return cmocka_run_group_tests_name("verify", tests, group_setup, group_teardown);
}
