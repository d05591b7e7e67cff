/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_records_admin.c — records an operator finds and acts on, through
 * the admin listener of a real idem serve in front of the real example
 * refund service, on either store:
 *
 *   test_records_admin IDEM_BINARY REFUND_SERVICE_BINARY embedded
 *   test_records_admin IDEM_BINARY REFUND_SERVICE_BINARY distributed REDIS_URL POSTGRES_URL
 *
 * The distributed servers are the tests' own (scripts/services.sh, started
 * by the ctest fixture), wiped before each test.
 */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

static const char *idem_bin, *service_bin, *redis_url, *pg_url;
static char *dir;
static struct proc service;
static int config_seq;

#define READ_KEY "test-read-key-0123456789abcdef0"
#define READ_KEY_ENV "IDEM_TEST_READ_KEY"

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The refund route, on space refund, its payload checked, with these
 * lines added. */
static void start_idem(struct proc *p, const char *extra)
{
    char path[4200], log[4200], db[4200], text[8192];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, ++config_seq);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, config_seq);
    snprintf(db, sizeof db, "%s/records-%d.db", dir, config_seq);
    char *o = text;
    if (pg_url)
        o += sprintf(o, "storage:\n  kind: distributed\n  redis: %s\n  postgres: %s\n"
                        "  timeout: 1s\n",
                     redis_url, pg_url);
    o += sprintf(o,
                 "admin_listen: 127.0.0.1:0\n"
                 "api_keys:\n"
                 "  - { name: ops-write, scope: write, env: " SYS_ADMIN_KEY_ENV " }\n"
                 "  - { name: ops-read, scope: read, env: " READ_KEY_ENV " }\n"
                 "routes:\n"
                 "  - name: refund\n"
                 "    match: { method: POST, path: /refunds }\n"
                 "    upstream: http://127.0.0.1:%d\n"
                 "    key: { json: refund_no }\n"
                 "    space: refund\n"
                 "    fingerprint: [refund_no, amount]\n"
                 "%s",
                 service.port, extra ? extra : "");
    sys_write_file(path, text);
    if (pg_url) {
        char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--listen", "127.0.0.1:0", NULL};
        sys_start(p, argv, log);
    } else {
        char *argv[] = {(char *)idem_bin, "serve", "-c",     path, "--db",
                        db,               "--listen", "127.0.0.1:0", NULL};
        sys_start(p, argv, log);
    }
}

/* A hold route: an answer slower than 400 ms is an unknown outcome, held. */
static const char hold_lines[] = "    upstream_timeout: 400ms\n"
                                 "    lease: 1s\n"
                                 "    on_unknown_outcome: hold\n"
                                 "    retention: 7d\n";

static int post_refund(int port, const char *no, const char *amount, int delay_ms,
                       struct sys_resp *r)
{
    char body[256], delay[64];
    snprintf(body, sizeof body, "{\"refund_no\":\"%s\",\"amount\":\"%s\"}", no, amount);
    snprintf(delay, sizeof delay, "X-Delay-Ms: %d", delay_ms);
    const char *h[] = {delay, NULL};
    sys_http(port, "POST", "/refunds", delay_ms ? h : NULL, body, 10000, r);
    return r->status;
}

static void refund_expect(int port, const char *no, int status)
{
    struct sys_resp r;
    assert_int_equal(post_refund(port, no, "1.00", 0, &r), status);
    sys_resp_free(&r);
}

/* GET target on the admin listener with the write key: the status, and
 * the body parsed (NULL when not JSON; json_decref it). */
static json_t *admin_get(int port, const char *target, int *status)
{
    struct sys_resp r;
    sys_admin_http(port, "GET", target, NULL, 10000, &r);
    *status = r.status;
    json_t *j = r.m ? json_loadb(r.m->body, r.m->body_len, 0, NULL) : NULL;
    sys_resp_free(&r);
    return j;
}

static json_t *admin_get_ok(int port, const char *target)
{
    int status;
    json_t *j = admin_get(port, target, &status);
    if (status != 200 || !j)
        fail_msg("GET %s: %d", target, status);
    return j;
}

/* POST an action; its status, and the body in body_out (cap bytes). */
static int admin_post(int port, const char *key, const char *op, const char *body,
                      char *body_out, size_t cap)
{
    char auth[128], target[128];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
    snprintf(target, sizeof target, "/_idem/v1/records/%s", op);
    const char *h[] = {auth, NULL};
    struct sys_resp r;
    sys_http(port, "POST", target, h, body, 10000, &r);
    if (body_out)
        snprintf(body_out, cap, "%s", r.m ? r.m->body : "");
    int status = r.status;
    sys_resp_free(&r);
    return status;
}

/* The keys of a listing, joined by spaces. */
static void keys_of(const json_t *j, char *out, size_t cap)
{
    json_t *list = json_object_get(j, "records"), *it;
    size_t i;
    out[0] = '\0';
    json_array_foreach(list, i, it)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? " " : "",
                 json_string_value(json_object_get(it, "key")));
}

static void list_expect(int port, const char *target, const char *want)
{
    json_t *j = admin_get_ok(port, target);
    char keys[1024];
    keys_of(j, keys, sizeof keys);
    if (strcmp(keys, want) != 0)
        fail_msg("GET %s: [%s], not [%s]", target, keys, want);
    json_decref(j);
}

/* A 400 naming the parameter. */
static void bad_param(int port, const char *target, const char *name)
{
    struct sys_resp r;
    sys_admin_http(port, "GET", target, NULL, 5000, &r);
    assert_int_equal(r.status, 400);
    char said[80];
    snprintf(said, sizeof said, "parameter %s", name);
    if (!strstr(r.m->body, said))
        fail_msg("GET %s: %s", target, r.m->body);
    sys_resp_free(&r);
}

static void test_list_search_and_page(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, NULL);
    /* Keys holding LIKE's wildcards, and keys they would match. The
     * gateway's record keys escape '%' (request_key.c): R%1 is R%251. */
    const char *keys[] = {"R%1", "R_1", "Rx1", "R%%", "S1"};
    for (int i = 0; i < 5; i++) {
        refund_expect(gw.port, keys[i], 201);
        sleep_ms(5); /* each its own created_ms */
    }
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund", "S1 R%25%25 Rx1 R_1 R%251");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&prefix=R%25", "R%25%25 R%251");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&prefix=R_", "R_1");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&prefix=R%2525%25", "R%25%25");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&state=processing", "");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&newer_than_ms=600000",
                "S1 R%25%25 Rx1 R_1 R%251");
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&older_than_ms=600000", "");
    list_expect(gw.admin_port, "/_idem/v1/records?space=payment", "");

    /* What an item says of a finished record. */
    json_t *j = admin_get_ok(gw.admin_port, "/_idem/v1/records?space=refund&state=SUCCEEDED"
                                            "&prefix=S");
    json_t *it = json_array_get(json_object_get(j, "records"), 0);
    assert_string_equal(json_string_value(json_object_get(it, "state")), "SUCCEEDED");
    assert_string_equal(json_string_value(json_object_get(it, "space")), "refund");
    assert_int_equal(json_integer_value(json_object_get(it, "status")), 201);
    assert_true(json_integer_value(json_object_get(it, "result_bytes")) > 20);
    assert_true(json_integer_value(json_object_get(it, "epoch")) > 0);
    assert_true(json_is_null(json_object_get(j, "next_cursor")));
    json_decref(j);

    /* Pages of two, with a record created between pages: each record once,
     * the new ones (sorting first) on no page. */
    char all[1024] = "", target[1400], cur[1024] = "";
    int pages = 0;
    do {
        snprintf(target, sizeof target, "/_idem/v1/records?space=refund&limit=2%s%s",
                 *cur ? "&cursor=" : "", cur);
        j = admin_get_ok(gw.admin_port, target);
        char page[256];
        keys_of(j, page, sizeof page);
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", *all ? " " : "", page);
        json_t *next = json_object_get(j, "next_cursor");
        snprintf(cur, sizeof cur, "%s", json_is_string(next) ? json_string_value(next) : "");
        json_decref(j);
        /* Its characters need no escaping in a query. */
        assert_int_equal(strspn(cur, "c0123456789abcdef."), strlen(cur));
        char fresh[16];
        snprintf(fresh, sizeof fresh, "N%d", pages++);
        refund_expect(gw.port, fresh, 201);
    } while (*cur && pages < 10);
    assert_string_equal(all, "S1 R%25%25 Rx1 R_1 R%251");
    assert_int_equal(pages, 3);

    bad_param(gw.admin_port, "/_idem/v1/records", "space");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&limit=0", "limit");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&limit=501", "limit");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&limit=ten", "limit");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&older_than_ms=-5", "older_than_ms");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&cursor=OFFSET%205", "cursor");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&sort=key", "sort");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&space=payment", "space");
    bad_param(gw.admin_port, "/_idem/v1/records?space=re%20fund", "space");
    bad_param(gw.admin_port, "/_idem/v1/records?space=refund&state=a%20b", "state");
    bad_param(gw.admin_port, "/_idem/v1/records/held?space=refund", "space");

    /* A read key sees; the main listener has none of it. */
    const char *h[] = {"Authorization: Bearer " READ_KEY, NULL};
    struct sys_resp r;
    sys_http(gw.admin_port, "GET", "/_idem/v1/records?space=refund", h, NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    sys_resp_free(&r);
    sys_http(gw.port, "GET", "/_idem/v1/records?space=refund", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 404);
    sys_resp_free(&r);
    sys_http(gw.port, "GET", "/_idem/v1/events", NULL, NULL, 5000, &r);
    assert_int_equal(r.status, 404);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

/* Post key on a hold route with an upstream slower than upstream_timeout:
 * 504, the claim held; then wait for the upstream's own (unknown to idem)
 * execution to land. Returns the held claim's epoch, from the held view. */
static long long hold_one(const struct proc *gw, const char *no)
{
    struct sys_resp r;
    assert_int_equal(post_refund(gw->port, no, "1.00", 1200, &r), 504);
    sys_resp_free(&r);
    sleep_ms(1500);
    json_t *j = admin_get_ok(gw->admin_port, "/_idem/v1/records/held?space=refund");
    json_t *list = json_object_get(j, "records"), *it;
    size_t i;
    long long epoch = 0;
    json_array_foreach(list, i, it) {
        if (strcmp(json_string_value(json_object_get(it, "key")), no) != 0)
            continue;
        assert_string_equal(json_string_value(json_object_get(it, "state")), "PROCESSING");
        assert_true(json_is_true(json_object_get(it, "held")));
        assert_true(json_integer_value(json_object_get(it, "lease_left_ms")) > 3600 * 1000);
        /* Why it is held: the upstream's failure, as this instance saw it. */
        const char *why = json_string_value(json_object_get(it, "reason"));
        if (!why || !strstr(why, "no answer within 400 ms"))
            fail_msg("%s held for no reason given: %s", no, why ? why : "(none)");
        epoch = json_integer_value(json_object_get(it, "epoch"));
    }
    json_decref(j);
    if (!epoch)
        fail_msg("%s is not among the held claims", no);
    return epoch;
}

/* An event of kind on key among GET events. */
static int has_event(int port, const char *kind, const char *key)
{
    json_t *j = admin_get_ok(port, "/_idem/v1/events");
    json_t *list = json_object_get(j, "events"), *e;
    size_t i;
    int found = 0;
    json_array_foreach(list, i, e)
        found |= strcmp(json_string_value(json_object_get(e, "kind")), kind) == 0 &&
                 strcmp(json_string_value(json_object_get(e, "key")), key) == 0 &&
                 strcmp(json_string_value(json_object_get(e, "route")), "refund") == 0;
    json_decref(j);
    return found;
}

struct storm {
    int port;
    const char *no;
    int status[20];
};

static void storm_one(void *arg, int i)
{
    struct storm *s = arg;
    struct sys_resp r;
    s->status[i] = post_refund(s->port, s->no, "1.00", 0, &r);
    sys_resp_free(&r);
}

/* idem_records_held{space="refund"} once it is want, waiting up to 5 s for
 * the census (held_census.h); its value then. */
static long held_gauge(int admin_port, long want)
{
    long v = -1;
    for (int tries = 0; tries < 50 && v != want; tries++, sleep_ms(100)) {
        struct sys_resp r;
        sys_admin_http(admin_port, "GET", "/metrics", NULL, 5000, &r);
        assert_int_equal(r.status, 200);
        const char *at = strstr(r.m->body, "\nidem_records_held{space=\"refund\"} ");
        v = at ? strtol(at + strlen("\nidem_records_held{space=\"refund\"} "), NULL, 10) : -1;
        sys_resp_free(&r);
    }
    return v;
}

/* The epoch of key's record in space refund, and its updated_ms. */
static long long listed(int admin_port, const char *key, long long *updated_ms)
{
    char path[256];
    snprintf(path, sizeof path, "/_idem/v1/records?space=refund&prefix=%s", key);
    json_t *j = admin_get_ok(admin_port, path);
    json_t *rec = json_array_get(json_object_get(j, "records"), 0);
    assert_non_null(rec);
    long long epoch = json_integer_value(json_object_get(rec, "epoch"));
    *updated_ms = json_integer_value(json_object_get(rec, "updated_ms"));
    json_decref(j);
    return epoch;
}

/* A held claim, released at its epoch, lets a retry execute: once, however
 * many retries come at once; every action, and every refusal, logged with
 * the key's name. */
static void test_held_released_executes_once(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, hold_lines);
    long long epoch = hold_one(&gw, "H-1");
    assert_int_equal(held_gauge(gw.admin_port, 1), 1); /* the gauge the alert watches */
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&state=processing", "H-1");
    assert_true(has_event(gw.admin_port, "held", "H-1"));
    refund_expect(gw.port, "H-1", 409); /* held: retries are refused */
    assert_true(has_event(gw.admin_port, "in_flight_409", "H-1"));
    struct sys_resp r;
    assert_int_equal(post_refund(gw.port, "H-1", "2.00", 0, &r), 422);
    sys_resp_free(&r);
    assert_true(has_event(gw.admin_port, "mismatch_422", "H-1"));

    char body[256], out[2048];
    /* A read key may not act; nor may the write key on an epoch moved on. */
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"H-1\",\"epoch\":%lld}", epoch);
    assert_int_equal(admin_post(gw.admin_port, READ_KEY, "release", body, out, sizeof out), 403);
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"H-1\",\"epoch\":%lld}",
             epoch - 1);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "release", body, out, sizeof out),
                     409);
    assert_non_null(strstr(out, "record_moved_on"));
    assert_non_null(strstr(out, "PROCESSING"));
    refund_expect(gw.port, "H-1", 409); /* still held */

    long before = sys_stat(service.port, "executions");
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"H-1\",\"epoch\":%lld}", epoch);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "release", body, out, sizeof out),
                     200);
    assert_non_null(strstr(out, "\"outcome\":\"RELEASED\""));
    assert_int_equal(held_gauge(gw.admin_port, 0), 0);
    /* The refund service has had H-1 since the held request: the one retry
     * that executes is answered 409 by it, and that answer is kept. */
    struct storm s = {.port = gw.port, .no = "H-1"};
    test_run_threads(20, storm_one, &s);
    for (int i = 0; i < 20; i++)
        if (s.status[i] != 409)
            fail_msg("retry %d: %d", i, s.status[i]);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(post_refund(gw.port, "H-1", "1.00", 0, &r), 409);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_null(strstr(r.m->body, "request_in_flight"));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    /* Released again at that epoch: the claim has moved on, untouched. */
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "release", body, out, sizeof out),
                     409);
    assert_non_null(strstr(out, "SUCCEEDED"));
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "release", "{\"space\":\"refund\"}",
                                out, sizeof out),
                     400);
    assert_non_null(strstr(out, "field key"));
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);

    char *log = sys_read_file(gw.log);
    char want[256];
    assert_non_null(strstr(log, "admin: API key ops-write from 127.0.0.1:"));
    snprintf(want, sizeof want, "records/release refund/H-1 epoch %lld: 200 RELEASED", epoch);
    if (!strstr(log, want))
        fail_msg("the log does not say \"%s\":\n%s", want, log);
    snprintf(want, sizeof want, "records/release refund/H-1 epoch %lld: 409 refused", epoch - 1);
    if (!strstr(log, want))
        fail_msg("the log does not say \"%s\":\n%s", want, log);
    /* An operator's refused action is no conflict for the alerts: the
     * claim was never the operator's. */
    if (strstr(log, "ALERT"))
        fail_msg("a refused action was alerted as a conflict:\n%s", log);
    free(log);
}

/* Marked failed for good with a reason: every retry is answered with it,
 * and nothing executes again. */
static void test_mark_failed_replays_reason(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, hold_lines);
    long long epoch = hold_one(&gw, "H-2");
    long before = sys_stat(service.port, "executions");
    char body[512], out[2048];
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"H-2\",\"epoch\":%lld,\"status\":409,"
             "\"reason\":\"refund H-2 was paid by hand: <ticket 7>\"}",
             epoch);
    assert_int_equal(admin_post(gw.admin_port, READ_KEY, "mark_failed", body, out, sizeof out),
                     403);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "mark_failed", body, out,
                                sizeof out),
                     200);
    assert_non_null(strstr(out, "\"outcome\":\"FAILED\""));
    for (int i = 0; i < 2; i++) {
        struct sys_resp r;
        assert_int_equal(post_refund(gw.port, "H-2", "1.00", 0, &r), 409);
        assert_non_null(strstr(r.m->body, "failed_by_operator"));
        assert_non_null(strstr(r.m->body, "refund H-2 was paid by hand: <ticket 7>"));
        assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);
    list_expect(gw.admin_port, "/_idem/v1/records?space=refund&state=failed", "H-2");
    /* Limits: a reason is required and bounded, a status is an error's. */
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"H-2\",\"epoch\":%lld}", epoch);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "mark_failed", body, out,
                                sizeof out),
                     400);
    assert_non_null(strstr(out, "field reason"));
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"H-2\",\"epoch\":%lld,\"reason\":\"x\",\"status\":200}",
             epoch);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "mark_failed", body, out,
                                sizeof out),
                     400);
    assert_non_null(strstr(out, "field status"));
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *log = sys_read_file(gw.log);
    char want[256];
    snprintf(want, sizeof want, "records/mark_failed refund/H-2 epoch %lld: 200 FAILED", epoch);
    if (!strstr(log, want))
        fail_msg("the log does not say \"%s\":\n%s", want, log);
    free(log);
}

/* A finished record deleted at its epoch: its key executes again. Never a
 * claim in flight. */
static void test_delete_lets_key_execute_again(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, hold_lines);
    long long held = hold_one(&gw, "H-3");
    long before = sys_stat(service.port, "executions");
    refund_expect(gw.port, "D-1", 201);
    refund_expect(gw.port, "D-1", 201); /* replayed */
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    long long updated;
    long long epoch = listed(gw.admin_port, "D-1", &updated);
    char body[256], out[2048];
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"D-1\",\"epoch\":%lld}", epoch);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "delete", body, out, sizeof out),
                     400); /* which version was read is required */
    assert_non_null(strstr(out, "field updated_ms"));
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"D-1\",\"epoch\":%lld,\"updated_ms\":%lld}", epoch,
             updated);
    assert_int_equal(admin_post(gw.admin_port, READ_KEY, "delete", body, out, sizeof out), 403);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "delete", body, out, sizeof out),
                     200);
    assert_non_null(strstr(out, "\"outcome\":\"DELETED\""));
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "delete", body, out, sizeof out),
                     404);
    /* Executed again (the refund service, which has D-1, answers 409
     * itself), not replayed. */
    struct sys_resp r;
    assert_int_equal(post_refund(gw.port, "D-1", "1.00", 0, &r), 409);
    assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    /* The held claim is in flight: not deleted, and still held. */
    listed(gw.admin_port, "H-3", &updated);
    snprintf(body, sizeof body,
             "{\"space\":\"refund\",\"key\":\"H-3\",\"epoch\":%lld,\"updated_ms\":%lld}", held,
             updated);
    assert_int_equal(admin_post(gw.admin_port, SYS_ADMIN_KEY, "delete", body, out, sizeof out),
                     409);
    assert_non_null(strstr(out, "PROCESSING"));
    refund_expect(gw.port, "H-3", 409);
    /* An action is a POST; a listing a GET. */
    sys_admin_http(gw.admin_port, "GET", "/_idem/v1/records/delete", NULL, 5000, &r);
    assert_int_equal(r.status, 405);
    sys_resp_free(&r);
    sys_admin_http(gw.admin_port, "POST", "/_idem/v1/records?space=refund", "{}", 5000, &r);
    assert_int_equal(r.status, 405);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *log = sys_read_file(gw.log);
    char want[256];
    snprintf(want, sizeof want, "records/delete refund/D-1 epoch %lld: 200 DELETED", epoch);
    if (!strstr(log, want))
        fail_msg("the log does not say \"%s\":\n%s", want, log);
    snprintf(want, sizeof want, "records/delete refund/H-3 epoch %lld: 409 refused", held);
    if (!strstr(log, want))
        fail_msg("the log does not say \"%s\":\n%s", want, log);
    free(log);
}

/* records/op on refund/key at epoch with the write key, the body's other
 * fields in more (",\"reason\":\"x\"" or ""): answered status, with want in
 * its body (NULL: not checked). */
static void act_expect(int admin_port, const char *op, const char *key, long long epoch,
                       const char *more, int status, const char *want)
{
    char body[512], out[2048];
    snprintf(body, sizeof body, "{\"space\":\"refund\",\"key\":\"%s\",\"epoch\":%lld%s}", key,
             epoch, more);
    int got = admin_post(admin_port, SYS_ADMIN_KEY, op, body, out, sizeof out);
    if (got != status || (want && !strstr(out, want)))
        fail_msg("records/%s %s: %d %s (expected %d with %s)", op, body, got, out, status,
                 want ? want : "any body");
}

/* Two operators on one held claim, each from what they read: one marks it
 * failed; the other's delete, sent at the same epoch from the record as it
 * was before, is refused (its version moved on), so the key does not run
 * again. The other's release is refused too, and neither refusal is an
 * alert. */
static void test_stale_operator_refused(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, hold_lines);
    long long epoch = hold_one(&gw, "H-5");
    long long seen;
    assert_int_equal(listed(gw.admin_port, "H-5", &seen), epoch);
    sleep_ms(5); /* the next write is in another millisecond */
    act_expect(gw.admin_port, "mark_failed", "H-5", epoch, ",\"reason\":\"paid by hand\"", 200,
               NULL);
    char seen_field[64];
    snprintf(seen_field, sizeof seen_field, ",\"updated_ms\":%lld", seen);
    act_expect(gw.admin_port, "delete", "H-5", epoch, seen_field, 409,
               "written since it was read");
    act_expect(gw.admin_port, "release", "H-5", epoch, "", 409, NULL);
    long before = sys_stat(service.port, "executions");
    struct sys_resp r;
    assert_int_equal(post_refund(gw.port, "H-5", "1.00", 0, &r), 502); /* the failure */
    assert_non_null(strstr(r.m->body, "paid by hand"));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
    char *log = sys_read_file(gw.log);
    if (strstr(log, "ALERT"))
        fail_msg("an operator's stale action was alerted as a conflict:\n%s", log);
    free(log);
}

struct slow {
    int port, status;
};

static void *slow_refund(void *arg)
{
    struct slow *s = arg;
    struct sys_resp r;
    s->status = post_refund(s->port, "LIVE-1", "1.00", 3000, &r);
    sys_resp_free(&r);
    return NULL;
}

/* A live claim (its request in flight, its lease renewed) is neither
 * released nor marked failed unless the operator forces it: a release
 * would let a retry execute the key a second time while the first may
 * still be running. */
static void test_live_claim_needs_force(void **state)
{
    (void)state;
    struct proc gw;
    start_idem(&gw, "    upstream_timeout: 10s\n    lease: 2s\n");
    struct slow s = {.port = gw.port};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, slow_refund, &s), 0);
    long long epoch = 0;
    for (int tries = 0; !epoch && tries < 100; tries++, sleep_ms(50)) {
        json_t *j = admin_get_ok(gw.admin_port, "/_idem/v1/records?space=refund&prefix=LIVE-1");
        epoch = json_integer_value(
            json_object_get(json_array_get(json_object_get(j, "records"), 0), "epoch"));
        json_decref(j);
    }
    assert_true(epoch > 0);
    act_expect(gw.admin_port, "release", "LIVE-1", epoch, "", 409,
               "claim_live"); /* and the detail says what it risks: */
    act_expect(gw.admin_port, "release", "LIVE-1", epoch, "", 409, "second execution");
    act_expect(gw.admin_port, "mark_failed", "LIVE-1", epoch, ",\"reason\":\"x\"", 409,
               "claim_live");
    act_expect(gw.admin_port, "release", "LIVE-1", epoch, ",\"force\":1", 400, "field force");
    act_expect(gw.admin_port, "release", "LIVE-1", epoch, ",\"force\":true", 200,
               "\"outcome\":\"RELEASED\"");
    pthread_join(t, NULL);
    /* Its next renewal found the claim gone: the call was cut, and its
     * outcome is unknown (the refund may or may not have been made). */
    assert_int_equal(s.status, 504);
    assert_int_equal(sys_stop(&gw, SIGTERM), 0);
}

static int setup(void **state)
{
    (void)state;
    if (pg_url)
        test_wipe_servers(redis_url, pg_url);
    return 0;
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
    if (!(argc == 4 && strcmp(argv[3], "embedded") == 0) &&
        !(argc == 6 && strcmp(argv[3], "distributed") == 0)) {
        fprintf(stderr, "usage: %s IDEM_BINARY REFUND_SERVICE_BINARY embedded\n"
                        "       %s IDEM_BINARY REFUND_SERVICE_BINARY distributed REDIS_URL "
                        "POSTGRES_URL\n",
                argv[0], argv[0]);
        return 2;
    }
    idem_bin = argv[1], service_bin = argv[2];
    if (argc == 6)
        redis_url = argv[4], pg_url = argv[5];
    setenv(SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, 1);
    setenv(READ_KEY_ENV, READ_KEY, 1);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_list_search_and_page, setup),
        cmocka_unit_test_setup(test_held_released_executes_once, setup),
        cmocka_unit_test_setup(test_mark_failed_replays_reason, setup),
        cmocka_unit_test_setup(test_delete_lets_key_execute_again, setup),
        cmocka_unit_test_setup(test_live_claim_needs_force, setup),
        cmocka_unit_test_setup(test_stale_operator_refused, setup),
    };
    return cmocka_run_group_tests_name(argv[3], tests, group_setup, group_teardown);
}
