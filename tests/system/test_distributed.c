/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_distributed.c — several idem serve instances sharing one Redis and one
 * PostgreSQL, in front of the real example refund service, with the servers
 * stopped, killed and restarted under them:
 *
 *   test_distributed IDEM_BINARY REFUND_SERVICE_BINARY SERVICES_SH STATE_DIR
 *                    REDIS_URL POSTGRES_URL
 *
 * The servers are the tests' own, started by scripts/services.sh in STATE_DIR
 * (the ctest fixture does it); the same script stops and starts them here.
 * Both are wiped before each test.
 */
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

static const char *idem_bin, *service_bin, *services_sh, *state_dir, *redis_url, *pg_url;
static char *dir;
static struct proc service;
static int config_seq;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* scripts/services.sh redis-stop|redis-start|pg-stop|pg-stop-immediate|pg-start */
static void services(const char *what)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s '%s'", services_sh, what, state_dir);
    if (system(cmd) != 0)
        fail_msg("%s failed", cmd);
}

/* Start idem serve on the distributed store with these routes; "@UP@"
 * becomes the refund service's address. */
static void start_idem(struct proc *p, const char *routes)
{
    char path[4200], log[4200], text[16384], up[64];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, ++config_seq);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, config_seq);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", service.port);
    char *o = text;
    o += sprintf(o, "storage:\n  kind: distributed\n  redis: %s\n  postgres: %s\n"
                    "  timeout: 1s\n" SYS_ADMIN_YAML,
                 redis_url, pg_url);
    for (const char *s = routes; *s;) {
        if (strncmp(s, "@UP@", 4) == 0) {
            o += sprintf(o, "%s", up);
            s += 4;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    sys_write_file(path, text);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--listen", "127.0.0.1:0", NULL};
    sys_start(p, argv, log);
}

/* A number in idem's GET /_idem/v1/health: section.field, or field. */
static long health_stat(int port, const char *section, const char *field, int *status)
{
    struct sys_resp r;
    sys_admin_http(port, "GET", "/_idem/v1/health", NULL, 5000, &r);
    if (status)
        *status = r.status;
    json_t *j = r.m ? json_loadb(r.m->body, r.m->body_len, 0, NULL) : NULL;
    json_t *v = j && section ? json_object_get(j, section) : j;
    v = v ? json_object_get(v, field) : NULL;
    if (!json_is_integer(v))
        fail_msg("health has no %s.%s (status %d)", section ? section : "", field, r.status);
    long n = (long)json_integer_value(v);
    json_decref(j);
    sys_resp_free(&r);
    return n;
}

/* POST body to path until the answer is `status` with `word` in its body
 * (a server coming back: the store reconnects with backoff, up to 1 s), for
 * up to 10 s; while waiting only 503 (store unavailable) may come back.
 * Fails the test otherwise. */
static void post_until(int port, const char *path, const char *body, int status,
                       const char *word)
{
    int last = 0;
    for (int i = 0; i < 100; i++) {
        struct sys_resp r;
        if (strncmp(path, "/_idem/", 7) == 0)
            sys_admin_http(port, "POST", path, body, 10000, &r);
        else
            sys_http(port, "POST", path, NULL, body, 10000, &r);
        last = r.status;
        int ok = r.status == status && (!word || strstr(r.m->body, word));
        if (!ok && r.status != 503)
            fail_msg("POST %s: %d %.*s", path, r.status, r.m ? (int)r.m->body_len : 0,
                     r.m ? r.m->body : "");
        sys_resp_free(&r);
        if (ok)
            return;
        sleep_ms(100);
    }
    fail_msg("POST %s: still %d after 10 s", path, last);
}

/* The refund route's first lines, which every configuration here starts
 * with; most add both record and lock layers. */
#define REFUND_ROUTE                                                           \
    "routes:\n"                                                               \
    "  - name: refund\n"                                                      \
    "    match: { method: POST, path: /refunds }\n"                           \
    "    upstream: @UP@\n"                                                    \
    "    key: { json: refund_no }\n"
#define LOCKED_REFUND_ROUTE REFUND_ROUTE "    layers: [lock, record]\n"

static const char wait_routes[] =
    LOCKED_REFUND_ROUTE
    "    in_flight: wait\n"
    "    wait_timeout: 15s\n"
    "    lease: 10s\n"
    "    upstream_timeout: 5s\n";

static const char resolve_routes[] =
    REFUND_ROUTE
    "    upstream_timeout: 300ms\n"
    "    lease: 2s\n"
    "    on_unknown_outcome: resolve\n"
    "    resolve:\n"
    "      url: @UP@/refunds/{key}\n"
    "      after: 1s\n"
    "      backoff: [500ms]\n"
    "      executed: [200]\n"
    "      not_executed: [404]\n";

static const char reject_routes[] =
    LOCKED_REFUND_ROUTE
    "    in_flight: reject\n"
    "    on_redis_down: reject\n";

struct storm {
    int port[2];
    const char *body;
    const char *const *headers;
    struct sys_resp resp[100];
};

static void one_post(void *arg, int i)
{
    struct storm *s = arg;
    sys_http(s->port[i % 2], "POST", "/refunds", s->headers, s->body, 30000, &s->resp[i]);
}

/* Every client got the same status and body; returns how many were replays. */
static int same_answers(struct storm *s, int status)
{
    int replayed = 0;
    for (int i = 0; i < 100; i++) {
        if (s->resp[i].status != status)
            fail_msg("client %d got %d, expected %d: %.*s", i, s->resp[i].status, status,
                     s->resp[i].m ? (int)s->resp[i].m->body_len : 0,
                     s->resp[i].m ? s->resp[i].m->body : "");
        assert_int_equal(s->resp[i].m->body_len, s->resp[0].m->body_len);
        assert_memory_equal(s->resp[i].m->body, s->resp[0].m->body, s->resp[0].m->body_len);
        const char *rp = sys_header(&s->resp[i], "Idempotent-Replayed");
        replayed += rp && strcmp(rp, "true") == 0;
    }
    return replayed;
}

static void storm_free(struct storm *s)
{
    for (int i = 0; i < 100; i++)
        sys_resp_free(&s->resp[i]);
    free(s);
}

/* 100 duplicates split across two instances: one execution; both replay. */
static void test_two_instances_one_execution(void **state)
{
    (void)state;
    struct proc a, b;
    start_idem(&a, wait_routes);
    start_idem(&b, wait_routes);
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 200", NULL};
    struct storm *s = calloc(1, sizeof *s);
    s->port[0] = a.port, s->port[1] = b.port;
    s->headers = slow;
    s->body = "{\"refund_no\":\"R-two\",\"amount\":\"10.00\"}";
    test_run_threads(100, one_post, s);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(same_answers(s, 201), 99);
    /* Later retries, on either instance, are replays of that one answer. */
    for (int i = 0; i < 2; i++) {
        struct sys_resp r;
        sys_http(i ? b.port : a.port, "POST", "/refunds", NULL, s->body, 5000, &r);
        assert_int_equal(r.status, 201);
        assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
        assert_memory_equal(r.m->body, s->resp[0].m->body, s->resp[0].m->body_len);
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    storm_free(s);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

struct bg_storm {
    pthread_t t;
    struct storm *s;
};

static void *bg_storm_main(void *arg)
{
    struct bg_storm *b = arg;
    test_run_threads(100, one_post, b->s);
    return NULL;
}

/* Redis is killed while 100 duplicates are in flight: with on_redis_down:
 * skip the lock layer is passed over and the PostgreSQL record alone keeps
 * it to one execution. Redis restarted: locks work again, no idem restart. */
static void test_redis_killed_mid_storm_skip(void **state)
{
    (void)state;
    struct proc a, b;
    start_idem(&a, wait_routes);
    start_idem(&b, wait_routes);
    long before = sys_stat(service.port, "executions");
    static const char *const slow[] = {"X-Delay-Ms: 600", NULL};
    struct bg_storm bg = {.s = calloc(1, sizeof *bg.s)};
    bg.s->port[0] = a.port, bg.s->port[1] = b.port;
    bg.s->headers = slow;
    bg.s->body = "{\"refund_no\":\"R-redis-killed\",\"amount\":\"10.00\"}";
    pthread_create(&bg.t, NULL, bg_storm_main, &bg);
    sleep_ms(200);
    services("redis-stop");
    pthread_join(bg.t, NULL);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(same_answers(bg.s, 201), 99);
    storm_free(bg.s);

    /* New keys while Redis is down: served, each once, the skips counted. */
    const char *body = "{\"refund_no\":\"R-while-down\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    for (int i = 0; i < 3; i++) {
        sys_http(i % 2 ? b.port : a.port, "POST", "/refunds", NULL, body, 10000, &r);
        assert_int_equal(r.status, 201);
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_true(health_stat(a.admin_port, "gateway", "redis_down_skips", NULL) +
                    health_stat(b.admin_port, "gateway", "redis_down_skips", NULL) >= 3);

    /* Redis back: the lock layer works again in the same processes. */
    services("redis-start");
    const char *lock = "{\"space\":\"refund\",\"key\":\"probe\",\"owner\":\"t\",\"ttl_ms\":5000}";
    post_until(a.admin_port, "/_idem/v1/locks/acquire", lock, 200, "\"ACQUIRED\"");
    /* ...and the lock is real, shared: the other instance sees it held
     * (once its own connections are back: they reconnect with backoff). */
    const char *other = "{\"space\":\"refund\",\"key\":\"probe\",\"owner\":\"u\",\"ttl_ms\":5000}";
    post_until(b.admin_port, "/_idem/v1/locks/acquire", other, 200, "\"BUSY\"");
    /* Tokens too: one issued by A is spent once, through B. */
    sys_admin_http(a.admin_port, "POST", "/_idem/v1/tokens", "{\"scene\":\"refund\"}", 5000, &r);
    assert_int_equal(r.status, 201);
    json_t *issued = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    const char *token = json_string_value(json_object_get(issued, "token"));
    assert_non_null(token);
    char spend[256];
    snprintf(spend, sizeof spend, "{\"scene\":\"refund\",\"token\":\"%s\"}", token);
    json_decref(issued);
    sys_resp_free(&r);
    for (int i = 0; i < 2; i++) {
        sys_admin_http(b.admin_port, "POST", "/_idem/v1/tokens/consume", spend, 5000, &r);
        if (r.status != 200)
            fail_msg("tokens/consume on B: %d %s", r.status, r.m ? r.m->body : "");
        assert_non_null(strstr(r.m->body, i == 0 ? "\"CONSUMED\"" : "\"ALREADY_CONSUMED\""));
        sys_resp_free(&r);
    }
    long skips = health_stat(a.admin_port, "gateway", "redis_down_skips", NULL);
    sys_http(a.port, "POST", "/refunds", NULL, "{\"refund_no\":\"R-after\",\"amount\":\"1\"}",
             5000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    assert_int_equal(health_stat(a.admin_port, "gateway", "redis_down_skips", NULL), skips);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

/* on_redis_down: reject — 503 and nothing forwarded; back when Redis is. */
/* POST body to /refunds with headers (NULL-terminated, or NULL): answered
 * status. */
static void post_status(int port, const char *const *headers, const char *body, int status)
{
    struct sys_resp r;
    sys_http(port, "POST", "/refunds", headers, body, 5000, &r);
    if (r.status != status)
        fail_msg("POST %s: %d %.*s, expected %d", body, r.status, r.m ? (int)r.m->body_len : 0,
                 r.m ? r.m->body : "", status);
    sys_resp_free(&r);
}

/* The state of key's record, as instance p's JSON API reads it. */
static void state_of(const struct proc *p, const char *key, char *state, size_t cap)
{
    char target[256];
    struct sys_resp r;
    snprintf(target, sizeof target, "/_idem/v1/records/refund/%s", key);
    sys_admin_http(p->admin_port, "GET", target, NULL, 5000, &r);
    const char *at = r.status == 200 ? strstr(r.m->body, "\"state\":\"") : NULL;
    snprintf(state, cap, "%.*s", at ? (int)strcspn(at + 9, "\"") : 0, at ? at + 9 : "");
    sys_resp_free(&r);
}

/* Two instances on one store, unknown outcomes on a resolve route, and the
 * instance whose requests timed out killed (-9) before any question: the
 * questions are the records', so the other instance asks them. The refund
 * the service made completes with its answer, unasked by any client; the
 * one it did not make is released, and its retry executes, once. */
static void test_resolve_questions_survive_their_instance(void **state)
{
    (void)state;
    struct proc a, b;
    start_idem(&a, resolve_routes);
    start_idem(&b, resolve_routes);
    long rows = sys_stat(service.port, "refunds");
    static const char *const slow[] = {"X-Delay-Ms: 700", NULL};
    static const char *const slow_fail[] = {"X-Delay-Ms: 700", "X-Fail: 503", NULL};
    const char *made = "{\"refund_no\":\"RX-1\",\"amount\":\"1.00\"}";
    const char *failed = "{\"refund_no\":\"RX-2\",\"amount\":\"1.00\"}";
    post_status(a.port, slow, made, 504);
    post_status(a.port, slow_fail, failed, 504);
    sys_stop(&a, SIGKILL); /* its claims' questions are nobody's here now */
    char now[64] = "";
    for (int i = 0; i < 100 && strcmp(now, "SUCCEEDED") != 0; i++, sleep_ms(100))
        state_of(&b, "RX-1", now, sizeof now);
    assert_string_equal(now, "SUCCEEDED");
    for (int i = 0; i < 100 && strcmp(now, "RELEASED") != 0; i++, sleep_ms(100))
        state_of(&b, "RX-2", now, sizeof now);
    assert_string_equal(now, "RELEASED");
    struct sys_resp r;
    sys_http(b.port, "POST", "/refunds", NULL, made, 5000, &r);
    assert_int_equal(r.status, 200); /* the status query's answer, kept */
    assert_string_equal(sys_header(&r, "Idem-Resolved"), "true");
    sys_resp_free(&r);
    post_status(b.port, NULL, failed, 201); /* not made: executed now */
    assert_int_equal(sys_stat(service.port, "refunds") - rows, 2); /* one row each */
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

static void test_redis_down_reject(void **state)
{
    (void)state;
    struct proc a;
    start_idem(&a, reject_routes);
    long before = sys_stat(service.port, "executions");
    services("redis-stop");
    const char *body = "{\"refund_no\":\"R-reject\",\"amount\":\"1.00\"}";
    struct sys_resp r;
    for (int i = 0; i < 5; i++) {
        sys_http(a.port, "POST", "/refunds", NULL, body, 10000, &r);
        assert_int_equal(r.status, 503);
        assert_string_equal(sys_header(&r, "Content-Type"), "application/problem+json");
        sys_resp_free(&r);
    }
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);
    int status;
    health_stat(a.admin_port, "gateway", "requests", &status);
    assert_int_equal(status, 200); /* degraded, not down: records are served */
    services("redis-start");
    post_until(a.port, "/refunds", body, 201, NULL);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
}

/* PostgreSQL stopped: 503 and zero forwarded requests, whatever the Redis
 * side says; restarted: served again by the same process. */
static void test_postgres_stopped(void **state)
{
    (void)state;
    struct proc a;
    start_idem(&a, wait_routes);
    long before = sys_stat(service.port, "executions");
    services("pg-stop");
    struct sys_resp r;
    for (int i = 0; i < 5; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"refund_no\":\"R-pg-down-%d\",\"amount\":\"1\"}", i);
        sys_http(a.port, "POST", "/refunds", NULL, body, 10000, &r);
        assert_int_equal(r.status, 503);
        sys_resp_free(&r);
    }
    int status;
    health_stat(a.admin_port, "gateway", "requests", &status);
    assert_int_equal(status, 503);
    assert_int_equal(sys_stat(service.port, "executions") - before, 0);
    services("pg-start");
    post_until(a.port, "/refunds", "{\"refund_no\":\"R-pg-down-0\",\"amount\":\"1\"}", 201,
               NULL);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
}

/* ---- a steady stream across a restart ---- */

#define STREAM_CLIENTS 8   /* half on each instance */
#define STREAM_MAX 4000    /* answers kept; the stream ends at this many */

struct shot {
    int instance;          /* 0 or 1 */
    int status;
    long long start, end;  /* monotonic ms */
    char body[240];        /* of an answer other than 201 */
};

struct stream {
    int port[2];
    const char *tag;
    atomic_int stop;
    atomic_int quiet;      /* instance 1's clients hold off */
    atomic_int busy;       /* instance 1's requests under way */
    atomic_int n;
    struct shot shot[STREAM_MAX];
    pthread_t t;
};

/* One client: a new key at a time, 20 ms apart, each answer noted. */
static void stream_one(void *arg, int i)
{
    struct stream *s = arg;
    int inst = i % 2;
    for (int k = 0; !atomic_load(&s->stop); k++) {
        /* busy before quiet is read: once the main thread has set quiet
         * and seen busy at 0, no request of instance 1 is under way. */
        if (inst == 1) {
            atomic_fetch_add(&s->busy, 1);
            if (atomic_load(&s->quiet)) {
                atomic_fetch_sub(&s->busy, 1);
                sleep_ms(5);
                continue;
            }
        }
        char body[128];
        snprintf(body, sizeof body, "{\"refund_no\":\"R-%s-%d-%d\",\"amount\":\"1.00\"}",
                 s->tag, i, k);
        struct sys_resp r;
        long long start = test_mono_ms();
        sys_http(s->port[inst], "POST", "/refunds", NULL, body, 10000, &r);
        int slot = atomic_fetch_add(&s->n, 1);
        if (slot < STREAM_MAX) {
            struct shot *t = &s->shot[slot];
            *t = (struct shot){inst, r.status, start, test_mono_ms(), ""};
            if (r.status != 201 && r.m)
                snprintf(t->body, sizeof t->body, "%.*s", (int)r.m->body_len, r.m->body);
        } else {
            atomic_store(&s->stop, 1);
        }
        sys_resp_free(&r);
        if (inst == 1)
            atomic_fetch_sub(&s->busy, 1);
        sleep_ms(20);
    }
}

static void *stream_main(void *arg)
{
    test_run_threads(STREAM_CLIENTS, stream_one, arg);
    return NULL;
}

/* Stop a server and start it again (services.sh commands) under a stream
 * of new keys: 1 s before, 200 ms down, 3 s after. Instance 0 is sent
 * requests throughout; instance 1 none while the server is away, as in a
 * quiet moment, so that every connection it holds, to Redis or PostgreSQL,
 * writer's or reader's, outlives the server idle. Only 201 and, while the
 * server is away, 503 may come back. Instance 0 answers 201 again, and from
 * its first 201 on nothing else; instance 1 answers 201 to every request
 * made after the restart, the first on each dead connection included. */
static void stream_across(const struct proc *a, const struct proc *b, const char *tag,
                          const char *stop, const char *start)
{
    struct stream *s = calloc(1, sizeof *s);
    s->port[0] = a->port, s->port[1] = b->port;
    s->tag = tag;
    pthread_create(&s->t, NULL, stream_main, s);
    sleep_ms(1000); /* both instances' connections opened, used, idle between */
    atomic_store(&s->quiet, 1);
    while (atomic_load(&s->busy) > 0)
        sleep_ms(1);
    services(stop);
    long long down_at = test_mono_ms();
    sleep_ms(200);
    services(start);
    atomic_store(&s->quiet, 0);
    sleep_ms(3000);
    atomic_store(&s->stop, 1);
    pthread_join(s->t, NULL);

    int n = atomic_load(&s->n);
    if (n > STREAM_MAX)
        n = STREAM_MAX;
    for (int inst = 0; inst < 2; inst++) {
        /* Counted from instance 0's first 201 after the stop, and from
         * instance 1's first request after it (its clients held off). */
        long long from = inst == 1 ? down_at : LLONG_MAX, first = LLONG_MAX;
        int before = 0, after = 0;
        for (int i = 0; i < n; i++) {
            const struct shot *t = &s->shot[i];
            if (t->status != 201 && t->status != 503)
                fail_msg("%s: instance %d answered %d: %s", stop, t->instance, t->status,
                         t->body);
            if (inst == 0 && t->instance == inst && t->status == 201 &&
                t->start >= down_at && t->end < from)
                from = t->end;
            before += t->instance == inst && t->end < down_at && t->status == 201;
        }
        if (from == LLONG_MAX)
            fail_msg("%s: instance %d never answered 201 again", stop, inst);
        for (int i = 0; i < n; i++) {
            const struct shot *t = &s->shot[i];
            if (t->instance != inst || t->start < from)
                continue;
            after++;
            if (t->start < first)
                first = t->start;
            if (t->status != 201)
                fail_msg("%s: instance %d answered %d to a request made %lld ms after "
                         "the stop, once the server was back: %s", stop, inst, t->status,
                         t->start - down_at, t->body);
        }
        print_message("%s: instance %d: %d answered 201 before the stop; from %lld ms "
                      "after it, %d answers, all 201\n", stop, inst, before,
                      first - down_at, after);
        assert_true(before >= 20);
        assert_true(after >= 20);
    }
    free(s);
}

/* PostgreSQL crashes (pg_ctl stop -m immediate) and comes back under a
 * stream from two instances: every pooled connection, the writers' and the
 * readers', died with it, and none costs a request a 503 once the server is
 * back. */
static void test_postgres_restart_no_stale_503(void **state)
{
    (void)state;
    static const char routes[] =
        LOCKED_REFUND_ROUTE
        "    in_flight: reject\n";
    struct proc a, b;
    start_idem(&a, routes);
    start_idem(&b, routes);
    stream_across(&a, &b, "pg-restart", "pg-stop-immediate", "pg-start");
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

/* The same with Redis killed (kill -9) and started again, on a route that
 * answers 503 without Redis (on_redis_down: reject): once it is back, every
 * request takes its lock again. */
static void test_redis_restart_no_stale_503(void **state)
{
    (void)state;
    struct proc a, b;
    start_idem(&a, reject_routes);
    start_idem(&b, reject_routes);
    stream_across(&a, &b, "redis-restart", "redis-stop", "redis-start");
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

struct bg_post {
    pthread_t t;
    int port;
    const char *body;
    const char *const *headers;
    struct sys_resp resp;
};

static void *bg_post_main(void *arg)
{
    struct bg_post *b = arg;
    sys_http(b->port, "POST", "/refunds", b->headers, b->body, 30000, &b->resp);
    return NULL;
}

/* Redis stopped while a request holds a token: its upstream's 5xx cannot
 * give the token back, and the give-back was never sent, so the token stays
 * spent on the key and the record is released at once; with on_redis_down:
 * skip, a retry executes (had the give-back been sent and not answered, the
 * record would stay PROCESSING until its lease ended). */
static void test_give_back_never_sent_releases(void **state)
{
    (void)state;
    static const char routes[] =
        REFUND_ROUTE
        "    layers: [token, record]\n"
        "    in_flight: reject\n"
        "    lease: 30s\n";
    struct proc a;
    start_idem(&a, routes);
    long before = sys_stat(service.port, "executions");
    struct sys_resp r;
    char th[128];
    sys_issue_token(a.port, NULL, th, sizeof th);
    const char *failing[] = {th, "X-Fail: 500", "X-Delay-Ms: 1500", NULL};
    const char *plain[] = {th, NULL};
    struct bg_post pa = {.port = a.port, .headers = failing,
                         .body = "{\"refund_no\":\"R-nogiveback\",\"amount\":\"1.00\"}"};
    pthread_create(&pa.t, NULL, bg_post_main, &pa);
    sleep_ms(300); /* the token is spent, the request is in the service's hands */
    services("redis-stop");
    pthread_join(pa.t, NULL);
    assert_int_equal(pa.resp.status, 500);
    sys_resp_free(&pa.resp);
    sys_http(a.port, "POST", "/refunds", plain, pa.body, 10000, &r);
    assert_int_equal(r.status, 201);
    sys_resp_free(&r);
    services("redis-start");
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
}

/* The same, with Redis taking the give-back and not answering it (CLIENT
 * PAUSE WRITE: every script waits): it may still give the token back, so
 * the record is not released but held until its lease ends, and a retry
 * meanwhile gets 409 instead of executing on a token that may come back. */
static void test_give_back_unanswered_holds(void **state)
{
    (void)state;
    static const char routes[] =
        REFUND_ROUTE
        "    layers: [token, record]\n"
        "    in_flight: reject\n"
        "    lease: 30s\n";
    struct proc a;
    start_idem(&a, routes);
    long before = sys_stat(service.port, "executions");
    char th[128];
    sys_issue_token(a.port, NULL, th, sizeof th);
    const char *failing[] = {th, "X-Fail: 500", "X-Delay-Ms: 1000", NULL};
    const char *plain[] = {th, NULL};
    struct bg_post pa = {.port = a.port, .headers = failing,
                         .body = "{\"refund_no\":\"R-unanswered\",\"amount\":\"1.00\"}"};
    pthread_create(&pa.t, NULL, bg_post_main, &pa);
    sleep_ms(300); /* the token is spent, the request is in the service's hands */
    test_redis_command(redis_url, "CLIENT PAUSE 5000 WRITE");
    pthread_join(pa.t, NULL); /* its give-back waits out the store's 1 s timeout */
    assert_int_equal(pa.resp.status, 500);
    sys_resp_free(&pa.resp);
    struct sys_resp r;
    sys_http(a.port, "POST", "/refunds", plain, pa.body, 10000, &r);
    test_redis_command(redis_url, "CLIENT UNPAUSE");
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "PROCESSING"));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 1);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
}

/* Fencing: instance A is paused (SIGSTOP) past its lease while its upstream
 * call runs; B takes the abandoned claim over and finishes it. A, resumed,
 * cannot complete: its epoch is stale, the record keeps B's answer. And
 * end to end: the service, called by B with a higher Idem-Epoch, refuses
 * A's late write (fenced), so the refund is made once, by B. */
static void test_paused_holder_is_fenced(void **state)
{
    (void)state;
    static const char short_lease[] =
        LOCKED_REFUND_ROUTE
        "    in_flight: reject\n"
        "    lease: 1s\n"
        "    upstream_timeout: 10s\n";
    struct proc a, b;
    start_idem(&a, short_lease);
    start_idem(&b, short_lease);
    long before = sys_stat(service.port, "executions");
    long fenced_before = sys_stat(service.port, "fenced");
    long rows_before = sys_stat(service.port, "refunds");
    static const char *const slow[] = {"X-Delay-Ms: 2500", NULL};
    struct bg_post pa = {.port = a.port, .headers = slow,
                         .body = "{\"refund_no\":\"R-fenced\",\"amount\":\"5.00\"}"};
    pthread_create(&pa.t, NULL, bg_post_main, &pa);
    sleep_ms(300); /* A has claimed the record and called the service */
    assert_int_equal(kill(a.pid, SIGSTOP), 0);
    sleep_ms(1600); /* A's lock and lease run out: nothing renews them */

    struct sys_resp r;
    sys_http(b.port, "POST", "/refunds", NULL, pa.body, 10000, &r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    int b_status = r.status;
    char b_body[4096];
    snprintf(b_body, sizeof b_body, "%.*s", (int)r.m->body_len, r.m->body);
    sys_resp_free(&r);
    assert_true(b_status < 500);
    assert_int_equal(health_stat(b.admin_port, "store_stats", "takeovers", NULL), 1);

    assert_int_equal(kill(a.pid, SIGCONT), 0);
    /* A's first extension after the pause is refused (counted), and cuts
     * its service call; or, with a slow store, the call returns first and
     * its complete is refused. Either way A writes nothing. */
    pthread_join(pa.t, NULL);
    sys_resp_free(&pa.resp);
    assert_true(health_stat(a.admin_port, "store_stats", "conflicts", NULL) >= 1);
    char log[16384] = "";
    FILE *f = fopen(a.log, "r");
    assert_non_null(f);
    log[fread(log, 1, sizeof log - 1, f)] = '\0';
    fclose(f);
    if (!strstr(log, "record refund/R-fenced: finishing epoch") &&
        !strstr(log, "refund/R-fenced: the claim (epoch"))
        fail_msg("A's log shows neither its call cut nor its completion refused:\n%s", log);

    /* The record holds B's answer; every later retry replays it. */
    sys_http(a.port, "POST", "/refunds", NULL, pa.body, 10000, &r);
    assert_int_equal(r.status, b_status);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_int_equal(r.m->body_len, strlen(b_body));
    assert_memory_equal(r.m->body, b_body, strlen(b_body));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    /* A's call, cut or not, ends in the service 2.5 s after it began. */
    for (int i = 0; i < 40 && sys_stat(service.port, "fenced") == fenced_before; i++)
        sleep_ms(100);
    assert_int_equal(sys_stat(service.port, "fenced") - fenced_before, 1);
    assert_int_equal(sys_stat(service.port, "refunds") - rows_before, 1);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

/* A token's spender paused past its lease, then failing: its claim was
 * taken over by a retry that executed on the token (on another instance),
 * so it must not give the token back. Before, it did, and the token then
 * paid for a second key. */
static void test_taken_over_spender_keeps_token(void **state)
{
    (void)state;
    static const char routes[] =
        REFUND_ROUTE
        "    layers: [token, lock, record]\n"
        "    in_flight: wait\n"
        "    wait_timeout: 10s\n"
        "    lease: 1s\n"
        "    upstream_timeout: 10s\n";
    struct proc a, b;
    start_idem(&a, routes);
    start_idem(&b, routes);
    long before = sys_stat(service.port, "executions");
    struct sys_resp r;
    char th[128];
    sys_issue_token(b.port, NULL, th, sizeof th);
    const char *failing[] = {th, "X-Fail: 500", "X-Delay-Ms: 2500", NULL};
    const char *plain[] = {th, NULL};
    struct bg_post pa = {.port = a.port, .headers = failing,
                         .body = "{\"refund_no\":\"R-spender\",\"amount\":\"5.00\"}"};
    pthread_create(&pa.t, NULL, bg_post_main, &pa);
    sleep_ms(300); /* A has spent the token, claimed the record, called the service */
    assert_int_equal(kill(a.pid, SIGSTOP), 0);
    sleep_ms(1600); /* A's lock and lease run out */
    /* A retry on B rides on A's spend, takes the claim over and executes. */
    sys_http(b.port, "POST", "/refunds", plain, pa.body, 10000, &r);
    assert_int_equal(r.status, 201);
    assert_null(sys_header(&r, "Idempotent-Replayed"));
    sys_resp_free(&r);
    assert_int_equal(kill(a.pid, SIGCONT), 0);
    /* A's claim is no longer its own: its first extension after the pause
     * finds that and cuts the call (504), or, with a slow store, the
     * service's 500 comes first and is not kept. */
    pthread_join(pa.t, NULL);
    if (pa.resp.status != 504 && pa.resp.status != 500)
        fail_msg("A answered %d %s", pa.resp.status, pa.resp.m ? pa.resp.m->body : "");
    sys_resp_free(&pa.resp);
    /* The token paid for R-spender: not for another key. */
    sys_http(b.port, "POST", "/refunds", plain, "{\"refund_no\":\"R-spender-2\",\"amount\":\"5.00\"}",
             10000, &r);
    assert_int_equal(r.status, 409);
    assert_non_null(strstr(r.m->body, "urn:idem:token_spent"));
    sys_resp_free(&r);
    assert_int_equal(sys_stat(service.port, "executions") - before, 2);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

struct flood {
    int port;
    atomic_int stop;
};

static void flood_one(void *arg, int i)
{
    struct flood *f = arg;
    for (int n = 0; !atomic_load(&f->stop); n++) {
        char body[128];
        snprintf(body, sizeof body, "{\"refund_no\":\"R-flood-%d-%d\",\"amount\":\"1.00\"}", i,
                 n);
        struct sys_resp r;
        sys_http(f->port, "POST", "/refunds", NULL, body, 60000, &r);
        sys_resp_free(&r);
    }
}

static void *flood_main(void *arg)
{
    test_run_threads(32, flood_one, arg);
    return NULL;
}

/* Redis stops answering commands (CLIENT PAUSE WRITE: connections and
 * SCRIPT LOAD work, every script waits) while A runs a slow request with a
 * 3 s lease, and 32 clients keep A's one worker busy with token and lock
 * calls that each wait out the store's 1 s timeout. A's lease renewals and
 * its finish do not queue behind them, so its claim is live, or finished,
 * when a duplicate comes to B 4 s later: B neither takes it over nor
 * forwards it (before, B forwarded it: its lease had run out). */
static void test_renewals_not_starved_by_stuck_redis(void **state)
{
    (void)state;
    static const char routes[] =
        "workers: 1\n"
        LOCKED_REFUND_ROUTE
        "    in_flight: reject\n"
        "    on_redis_down: skip\n"
        "    lease: 3s\n"
        "    upstream_timeout: 30s\n";
    struct proc a, b;
    start_idem(&a, routes);
    start_idem(&b, routes);
    static const char *const slow[] = {"X-Delay-Ms: 5000", NULL};
    struct bg_post pa = {.port = a.port, .headers = slow,
                         .body = "{\"refund_no\":\"R-starved\",\"amount\":\"5.00\"}"};
    pthread_create(&pa.t, NULL, bg_post_main, &pa);
    sleep_ms(300); /* A holds the lock and the claim and calls the service */
    test_redis_command(redis_url, "CLIENT PAUSE 10000 WRITE");
    struct flood f = {.port = a.port};
    pthread_t ft;
    pthread_create(&ft, NULL, flood_main, &f);
    sleep_ms(3700); /* past the lease, had nothing renewed it */
    struct bg_post pb = {.port = b.port, .body = pa.body};
    pthread_create(&pb.t, NULL, bg_post_main, &pb);
    pthread_join(pb.t, NULL); /* B waits out its lock call, then begins */
    long takeovers = health_stat(b.admin_port, "store_stats", "takeovers", NULL);
    atomic_store(&f.stop, 1);
    test_redis_command(redis_url, "CLIENT UNPAUSE");
    pthread_join(pa.t, NULL);
    pthread_join(ft, NULL);

    /* B found the claim live (409) or finished (a replay), never gone. */
    assert_int_equal(takeovers, 0);
    assert_int_equal(pa.resp.status, 201);
    if (pb.resp.status == 201)
        assert_string_equal(sys_header(&pb.resp, "Idempotent-Replayed"), "true");
    else if (pb.resp.status != 409 || !strstr(pb.resp.m->body, "request_in_flight"))
        fail_msg("B answered %d %.*s", pb.resp.status, (int)pb.resp.m->body_len,
                 pb.resp.m->body);
    struct sys_resp r;
    sys_http(b.port, "POST", "/refunds", NULL, pa.body, 10000, &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(sys_header(&r, "Idempotent-Replayed"), "true");
    assert_int_equal(r.m->body_len, pa.resp.m->body_len);
    assert_memory_equal(r.m->body, pa.resp.m->body, r.m->body_len);
    sys_resp_free(&r);
    assert_int_equal(health_stat(a.admin_port, "store_stats", "conflicts", NULL), 0);
    sys_resp_free(&pa.resp);
    sys_resp_free(&pb.resp);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
}

/* A URL with a password never reaches a log or an error message. */
/* The tests' PostgreSQL has no standby: a commit it acknowledges is lost
 * with it on a failover. idem says so once at start (a WARNING naming the
 * server and why), and health shows it; with
 * storage.require_synchronous_replication it refuses to start. */
static void test_asynchronous_replication_said(void **state)
{
    (void)state;
    struct proc p;
    start_idem(&p, "routes:\n  - name: r\n    match: { method: POST, path: /refunds }\n"
                   "    upstream: @UP@\n    key: { json: refund_no }\n");
    struct sys_resp r;
    sys_admin_http(p.admin_port, "GET", "/_idem/v1/health", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    json_t *repl = json_object_get(j, "replication");
    assert_string_equal(json_string_value(json_object_get(repl, "commits")), "asynchronous");
    assert_string_equal(json_string_value(json_object_get(repl, "synchronous_standby_names")), "");
    assert_non_null(strstr(json_string_value(json_object_get(repl, "why")),
                           "has no synchronous standby"));
    json_decref(j);
    sys_resp_free(&r);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
    char *log = sys_read_file(p.log);
    assert_non_null(strstr(log, "warning: storage: 127.0.0.1:"));
    assert_non_null(strstr(log, "can run twice after the standby is promoted"));
    free(log);

    char path[4200], text[4096], err[8192];
    snprintf(path, sizeof path, "%s/require-sync.yaml", dir);
    snprintf(text, sizeof text,
             "storage:\n  kind: distributed\n  redis: %s\n  postgres: %s\n"
             "  require_synchronous_replication: true\n", redis_url, pg_url);
    sys_write_file(path, text);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--listen", "127.0.0.1:0", NULL};
    assert_int_not_equal(sys_run_fail(argv, err, sizeof err), 0);
    if (!strstr(err, "storage.require_synchronous_replication: 127.0.0.1:") ||
        !strstr(err, "has no synchronous standby"))
        fail_msg("refused with: %s", err);
}

static void test_password_never_logged(void **state)
{
    (void)state;
    char path[4200], text[4096], err[8192];
    snprintf(path, sizeof path, "%s/secret.yaml", dir);
    snprintf(text, sizeof text,
             "storage:\n  kind: distributed\n  redis: { env: IDEM_TEST_REDIS_SECRET }\n"
             "  postgres: %s\n  timeout: 300ms\n", pg_url);
    sys_write_file(path, text);
    setenv("IDEM_TEST_REDIS_SECRET", "redis://:hunter2-secret@127.0.0.1:1/0", 1);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--listen", "127.0.0.1:0", NULL};
    assert_int_not_equal(sys_run_fail(argv, err, sizeof err), 0);
    unsetenv("IDEM_TEST_REDIS_SECRET");
    assert_non_null(strstr(err, "127.0.0.1:1"));
    assert_null(strstr(err, "hunter2"));
}

/* The JSON API runs on the event loops on the distributed store too: its
 * record, lock and listing endpoints answer through Redis and PostgreSQL
 * with event_loops: 2 on at most eight threads (the two loops, Redis's and
 * PostgreSQL's own threads, the background thread for reloads), none of
 * them a pool of workers. */
static void test_json_api_threads(void **state)
{
    (void)state;
    struct proc p;
    start_idem(&p, "event_loops: 2\n" LOCKED_REFUND_ROUTE "    in_flight: reject\n");
    post_until(p.admin_port, "/_idem/v1/records/begin",
               "{\"space\":\"t\",\"key\":\"T-1\",\"owner\":\"w\"}", 200, "\"NEW\"");
    post_until(p.admin_port, "/_idem/v1/locks/acquire",
               "{\"space\":\"t\",\"key\":\"T-1\",\"owner\":\"w\"}", 200, "ACQUIRED");
    struct sys_resp r;
    sys_admin_http(p.admin_port, "GET", "/_idem/v1/records?space=t", NULL, 5000, &r);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.m->body, "\"key\":\"T-1\""));
    sys_resp_free(&r);
    post_until(p.port, "/refunds", "{\"refund_no\":\"R-threads\",\"amount\":\"1.00\"}", 201,
               NULL);
    int threads = sys_threads(p.pid, NULL), workers = sys_threads(p.pid, "idem-worker");
    if (threads > 8 || workers != 0)
        fail_msg("idem serve with event_loops: 2 runs %d threads (at most 8), %d of them "
                 "idem-worker (none)",
                 threads, workers);
    assert_int_equal(sys_stop(&p, SIGTERM), 0);
}

static int setup(void **state)
{
    (void)state;
    services("up"); /* a failed test may have left one stopped */
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
    if (argc != 7) {
        fprintf(stderr, "usage: %s IDEM_BINARY REFUND_SERVICE_BINARY SERVICES_SH STATE_DIR "
                        "REDIS_URL POSTGRES_URL\n", argv[0]);
        return 2;
    }
    idem_bin = argv[1], service_bin = argv[2], services_sh = argv[3];
    state_dir = argv[4], redis_url = argv[5], pg_url = argv[6];
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_two_instances_one_execution, setup),
        cmocka_unit_test_setup(test_resolve_questions_survive_their_instance, setup),
        cmocka_unit_test_setup(test_redis_killed_mid_storm_skip, setup),
        cmocka_unit_test_setup(test_redis_down_reject, setup),
        cmocka_unit_test_setup(test_postgres_stopped, setup),
        cmocka_unit_test_setup(test_postgres_restart_no_stale_503, setup),
        cmocka_unit_test_setup(test_redis_restart_no_stale_503, setup),
        cmocka_unit_test_setup(test_paused_holder_is_fenced, setup),
        cmocka_unit_test_setup(test_taken_over_spender_keeps_token, setup),
        cmocka_unit_test_setup(test_give_back_never_sent_releases, setup),
        cmocka_unit_test_setup(test_give_back_unanswered_holds, setup),
        cmocka_unit_test_setup(test_renewals_not_starved_by_stuck_redis, setup),
        cmocka_unit_test_setup(test_asynchronous_replication_said, setup),
        cmocka_unit_test_setup(test_password_never_logged, setup),
        cmocka_unit_test_setup(test_json_api_threads, setup),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
