/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_failover.c — the distributed store through the loss of its
 * PostgreSQL primary: a primary and a streaming standby of the test's own
 * (scripts/pg_standby.sh), two idem serve instances on libpq's multi-host
 * URL (target_session_attrs=read-write), a storm of keys, the primary
 * killed with SIGKILL mid-storm and the standby promoted.
 *
 *   test_failover IDEM_BINARY REFUND_SERVICE_BINARY PG_STANDBY_SH
 *                 PRIMARY_PORT STANDBY_PORT REDIS_URL
 *
 * The storm: 500 keys on a route with on_unknown_outcome: hold (refunds)
 * and 500 on one with expire (payments), each key sent 3 times, by 32
 * clients spread over the two instances. Afterwards every key is sent
 * until it is answered 2xx, and every key answered 2xx at any time is sent
 * once more: it must replay the same body. The refund service counts its
 * executions and its rows; executions beyond the rows are keys executed
 * twice (the second insert meets the first's UNIQUE row).
 *
 * With a synchronous standby nothing may be executed twice and no answer
 * lost, and every key is answered in the end. With an asynchronous one idem
 * warns at start, and what the failover cost is counted and printed, not
 * asserted: it is what the warning is about (a claim or an answer lost
 * with the old primary: the key executes again, and the service's own
 * UNIQUE row refuses it, an answer of its own that replaces the 2xx).
 */
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "syslib.h"
#include "testlib.h"

#define KEYS 500
#define SENDS 3
#define CLIENTS 32
#define SHOTS (2 * KEYS * SENDS)
#define KILL_AFTER 300 /* 2xx answers before the primary is killed */

static const char *idem_bin, *service_bin, *pair_sh, *redis_url, *sentinel_sh, *pg_url;
static int primary_port, standby_port, redis_ha_port;
static char *dir;
static struct proc service;
static int run_tag; /* keys differ from test to test: the service keeps its rows */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void pair(const char *what, const char *args)
{
    sys_sh("'%s' %s '%s/pair' %s", pair_sh, what, dir, args ? args : "");
}

static const char routes[] =
    "routes:\n"
    "  - name: hold\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: @UP@\n"
    "    key: { json: refund_no }\n"
    "    layers: [record]\n"
    "    on_unknown_outcome: hold\n"
    "    lease: 10s\n"
    "    upstream_timeout: 5s\n"
    "  - name: expire\n"
    "    match: { method: POST, path: /payments }\n"
    "    upstream: @UP@\n"
    "    key: { json: serial_no }\n"
    "    layers: [record]\n"
    "    lease: 10s\n"
    "    upstream_timeout: 5s\n";

static const char *storage_extra = ""; /* more lines of storage: */

static void start_idem_on(struct proc *p, const char *redis, const char *pg, const char *rts,
                         int n)
{
    char path[4200], log[4200], text[8192], up[64];
    snprintf(path, sizeof path, "%s/idem-%d.yaml", dir, n);
    snprintf(log, sizeof log, "%s/idem-%d.log", dir, n);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", service.port);
    char *o = text;
    o += sprintf(o, "storage:\n  kind: distributed\n  redis: %s\n  postgres: %s\n"
                    "  timeout: 1s\n%s" SYS_ADMIN_YAML,
                 redis, pg, storage_extra);
    for (const char *s = rts; *s;) {
        if (strncmp(s, "@UP@", 4) == 0) {
            o += sprintf(o, "%s", up);
            s += 4;
        } else if (strncmp(s, "@SENTINELS@", 11) == 0) {
            o += sprintf(o, "%s", redis);
            s += 11;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    sys_write_file(path, text);
    char *argv[] = {(char *)idem_bin, "serve", "-c", path, "--listen", "127.0.0.1:0", NULL};
    sys_start(p, argv, log);
}

static void start_idem(struct proc *p, const char *pg, int n)
{
    start_idem_on(p, redis_url, pg, routes, n);
}

/* One request's answer, kept for the checks after the storm. */
struct shot {
    int status;
    char *body;
    int64_t at; /* monotonic ms: answered */
};

struct storm {
    int port[2];
    atomic_int next;
    atomic_int ok; /* 2xx answers so far */
    atomic_int unavailable;
    struct shot shot[SHOTS];
};

/* Shot i: key i / 6, route (i / 3) % 2, send i % 3: a key's three sends
 * go out together, to both instances. */
static void body_of(int route, int key, char *buf, size_t cap)
{
    snprintf(buf, cap, route ? "{\"serial_no\":\"P-%d-%d\",\"amount\":\"1.00\"}"
                             : "{\"refund_no\":\"R-%d-%d\",\"amount\":\"1.00\"}",
             run_tag, key);
}

static const char *path_of(int route)
{
    return route ? "/payments" : "/refunds";
}

/* One POST, its answer kept in s; header may be NULL or "". */
static void shoot(int port, const char *path, const char *header, const char *body,
                  struct shot *s)
{
    const char *h[] = {header, NULL};
    struct sys_resp r;
    sys_http(port, "POST", path, header && header[0] ? h : NULL, body, 20000, &r);
    s->status = r.status;
    s->body = r.m ? strndup(r.m->body, r.m->body_len) : strdup("");
    s->at = test_mono_ms();
    sys_resp_free(&r);
}

static void post(int port, int route, int key, struct shot *s)
{
    char body[128];
    body_of(route, key, body, sizeof body);
    shoot(port, path_of(route), NULL, body, s);
}

static void *client_main(void *arg)
{
    struct storm *st = arg;
    for (int i; (i = atomic_fetch_add(&st->next, 1)) < SHOTS;) {
        struct shot *s = &st->shot[i];
        post(st->port[i % 2], (i / 3) % 2, i / 6, s);
        if (s->status >= 200 && s->status < 300)
            atomic_fetch_add(&st->ok, 1);
        else if (s->status == 503)
            atomic_fetch_add(&st->unavailable, 1);
    }
    return NULL;
}

static long service_stat(const char *field)
{
    return sys_stat(service.port, field);
}

struct verdict {
    int answered_before;   /* keys answered 2xx before the kill */
    int lost;              /* keys answered 2xx whose answer did not replay */
    int stuck;             /* keys never answered 2xx by the end */
    long twice[2];         /* executions beyond the rows, per route */
    int unavailable;       /* 503s during the storm */
    int64_t kill_to_promoted, promoted_to_first; /* ms */
};

/* The storm, the failover in its middle, then every key to its end. */
static void storm_and_failover(const struct proc *a, const struct proc *b, struct verdict *v)
{
    memset(v, 0, sizeof *v);
    run_tag++;
    long exec0[2] = {service_stat("executions"), service_stat("payment_executions")};
    long rows0[2] = {service_stat("refunds"), service_stat("payments")};
    struct storm *st = calloc(1, sizeof *st);
    st->port[0] = a->port, st->port[1] = b->port;
    pthread_t t[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        pthread_create(&t[i], NULL, client_main, st);
    while (atomic_load(&st->ok) < KILL_AFTER && atomic_load(&st->next) < SHOTS)
        sleep_ms(1);
    int64_t killed = test_mono_ms();
    pair("kill-primary", NULL);
    pair("promote", NULL);
    int64_t promoted = test_mono_ms();
    v->kill_to_promoted = promoted - killed;
    /* The first new key answered after the promotion (each try a new key:
     * a try that failed may have left its claim in doubt). */
    for (int n = 0;; n++) {
        struct shot s;
        post(n % 2 ? b->port : a->port, 1, 100000 + n, &s);
        int ok = s.status >= 200 && s.status < 300;
        free(s.body);
        if (ok)
            break;
        if (test_mono_ms() - promoted > 30000)
            fail_msg("no 2xx within 30 s of the promotion (last %d)", s.status);
        sleep_ms(10);
    }
    v->promoted_to_first = test_mono_ms() - promoted;
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(t[i], NULL);
    v->unavailable = atomic_load(&st->unavailable);

    /* Every key to a 2xx; then every 2xx given replays the same body. */
    int64_t until = test_mono_ms() + 60000;
    for (int route = 0; route < 2; route++) {
        for (int key = 0; key < KEYS; key++) {
            const char *first = NULL;
            int before = 0;
            for (int s = 0; s < SENDS; s++) {
                struct shot *x = &st->shot[key * 6 + route * 3 + s];
                if (x->status < 200 || x->status >= 300)
                    continue;
                before |= x->at < killed;
                if (!first)
                    first = x->body;
                else if (strcmp(first, x->body) != 0)
                    v->lost++; /* two different 2xx answers for one key */
            }
            v->answered_before += before;
            /* Answered 2xx: replayed as it was. Not yet: sent until it is
             * (a claim left in doubt would hold it for its lease). */
            struct shot last = {0};
            for (;;) {
                free(last.body);
                post(key % 2 ? b->port : a->port, route, key, &last);
                if (first || (last.status >= 200 && last.status < 300) || test_mono_ms() > until)
                    break;
                sleep_ms(100);
            }
            int ok = last.status >= 200 && last.status < 300;
            if (first && (!ok || strcmp(first, last.body) != 0))
                v->lost++;
            else if (!first && !ok)
                v->stuck++;
            free(last.body);
        }
    }
    v->twice[0] = (service_stat("executions") - exec0[0]) - (service_stat("refunds") - rows0[0]);
    v->twice[1] = (service_stat("payment_executions") - exec0[1]) -
                  (service_stat("payments") - rows0[1]);
    for (int i = 0; i < SHOTS; i++)
        free(st->shot[i].body);
    free(st);
}

static void say(const char *mode, const struct verdict *v)
{
    print_message("failover (%s standby): %d keys answered 2xx before the kill; "
                  "%d answers lost; %ld hold and %ld expire keys executed twice; "
                  "%d keys never answered; %d 503s in the storm; promoted %lld ms after "
                  "the kill, first 2xx %lld ms after the promotion\n",
                  mode, v->answered_before, v->lost, v->twice[0], v->twice[1], v->stuck,
                  v->unavailable, (long long)v->kill_to_promoted,
                  (long long)v->promoted_to_first);
}

/* Health's status and replication.commits, as one string "STATUS COMMITS". */
static void health_said(const struct proc *p, char *out, size_t cap)
{
    struct sys_resp r;
    sys_admin_http(p->admin_port, "GET", "/_idem/v1/health", NULL, 5000, &r);
    json_t *j = r.m ? json_loadb(r.m->body, r.m->body_len, 0, NULL) : NULL;
    const char *st = json_string_value(json_object_get(j, "status"));
    const char *c = json_string_value(json_object_get(json_object_get(j, "replication"),
                                                      "commits"));
    snprintf(out, cap, "%d %s %s", r.status, st ? st : "-", c ? c : "-");
    json_decref(j);
    sys_resp_free(&r);
}

static void health_becomes(const struct proc *p, const char *want)
{
    char got[128] = "";
    for (int i = 0; i < 200; i++) {
        health_said(p, got, sizeof got);
        if (!strcmp(got, want))
            return;
        sleep_ms(100);
    }
    fail_msg("health still says \"%s\" after 20 s, not \"%s\"", got, want);
}

/* The URL a script wrote to dir/SUB/url (pg_standby.sh, redis_sentinel.sh). */
static char *url_of(const char *sub)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s/url", dir, sub);
    char *url = sys_read_file(path);
    url[strcspn(url, "\n")] = '\0';
    return url;
}

/* The first line a shell command prints, into out. */
static void sh_line(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void sh_line(char *out, size_t cap, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    out[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (!f)
        fail_msg("cannot run: %s", cmd);
    if (fgets(out, (int)cap, f))
        out[strcspn(out, "\n")] = '\0';
    pclose(f);
}

static void sentinels(const char *what, const char *args);

static char *start_pair(const char *mode)
{
    char args[64];
    snprintf(args, sizeof args, "%d %d %s", primary_port, standby_port, mode);
    pair("start", args);
    return url_of("pair");
}

/* A master, a replica and three Sentinels of the test's own: the URL that
 * names the sentinels. */
static char *start_sentinels(void)
{
    char args[128];
    int m = redis_ha_port;
    snprintf(args, sizeof args, "%d %d %d %d %d", m, m + 1, m + 2, m + 3, m + 4);
    sentinels("start", args);
    return url_of("sentinel");
}

/* A synchronous standby: nothing executed twice, no answer lost, every
 * key answered. */
static void test_synchronous_standby(void **state)
{
    (void)state;
    char *url = start_pair("sync");
    struct proc a, b;
    start_idem(&a, url, 1);
    start_idem(&b, url, 2);
    health_becomes(&a, "200 ok synchronous");
    struct verdict v;
    storm_and_failover(&a, &b, &v);
    say("synchronous", &v);
    assert_true(v.answered_before >= KILL_AFTER / 3); /* the kill was mid-storm */
    assert_int_equal(v.lost, 0);
    assert_int_equal(v.twice[0], 0);
    assert_int_equal(v.twice[1], 0);
    assert_int_equal(v.stuck, 0);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
    pair("stop", NULL);
    free(url);
}

/* The primary's synchronous standby dropped from its settings while Idem
 * stays connected (as Patroni does when the standby is lost, unless
 * strict): with require_synchronous_replication, health turns 503 within
 * seconds, and back to 200 once the setting is back, with no reconnect. */
static void test_standby_dropped_under_it(void **state)
{
    (void)state;
    char *url = start_pair("sync");
    storage_extra = "  require_synchronous_replication: true\n";
    struct proc a;
    start_idem(&a, url, 7);
    storage_extra = "";
    health_becomes(&a, "200 ok synchronous");
    char sql[256];
    snprintf(sql, sizeof sql, "/usr/bin/psql -X -q -h 127.0.0.1 -p %d -U idem -d idem -c \"ALTER "
             "SYSTEM SET synchronous_standby_names = ''\" -c 'SELECT pg_reload_conf()' >/dev/null",
             primary_port);
    sys_sh("%s", sql);
    health_becomes(&a, "503 replication_asynchronous asynchronous");
    snprintf(sql, sizeof sql, "/usr/bin/psql -X -q -h 127.0.0.1 -p %d -U idem -d idem -c \"ALTER "
             "SYSTEM SET synchronous_standby_names = '*'\" -c 'SELECT pg_reload_conf()' "
             ">/dev/null", primary_port);
    sys_sh("%s", sql);
    health_becomes(&a, "200 ok synchronous");
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    pair("stop", NULL);
    free(url);
}

/* An asynchronous standby: said at start and in health; what the failover
 * lost is counted, not asserted. */
static void test_asynchronous_standby(void **state)
{
    (void)state;
    char *url = start_pair("async");
    struct proc a, b;
    start_idem(&a, url, 3);
    start_idem(&b, url, 4);
    health_becomes(&a, "200 ok asynchronous");
    struct verdict v;
    storm_and_failover(&a, &b, &v);
    say("asynchronous", &v);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
    /* The warning names both servers of the URL, each with its port. */
    char *log = sys_read_file(a.log), said[128];
    snprintf(said, sizeof said, "127.0.0.1:%d,127.0.0.1:%d has no synchronous standby",
             primary_port, standby_port);
    if (!strstr(log, said))
        fail_msg("no \"%s\" in the log of idem", said);
    free(log);
    pair("stop", NULL);
    free(url);
}

/* ---- Redis with three Sentinels ---- */

static void sentinels(const char *what, const char *args)
{
    sys_sh("'%s' %s '%s/sentinel' %s", sentinel_sh, what, dir, args ? args : "");
}

static const char token_routes[] =
    "consumers:\n"
    "  - name: orders\n"
    "    source: { redis_stream: \"@SENTINELS@\", stream: orders, group: idem }\n"
    "    key: { json: serial_no }\n"
    "    handler: @UP@/payments\n"
    "limits:\n"
    "  tokens_per_scene: 100000\n"
    "  token_rate_subject: 1000000\n"
    "  token_rate_peer: 1000000\n"
    "routes:\n"
    "  - name: refund\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: @UP@\n"
    "    key: { json: refund_no }\n"
    "    layers: [token, lock, record]\n"
    "    in_flight: reject\n"
    "    lease: 10s\n"
    "    upstream_timeout: 5s\n";

/* n orders on the stream, at the master the sentinels name now. */
static void orders(const char *tag, int n)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/orders-%s.redis", dir, tag);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++)
        fprintf(f, "XADD orders * body '{\"serial_no\":\"O-%d-%s-%d\",\"amount\":\"1.00\"}'\n",
                run_tag, tag, i);
    fclose(f);
    sys_sh("redis-cli -p \"$('%s' master '%s/sentinel')\" <'%s' >/dev/null", sentinel_sh, dir,
           path);
}

/* Wait until the service has rows more payments (the consumer's). */
static void payments_reach(long rows, const char *when)
{
    for (int i = 0; service_stat("payments") < rows; i++) {
        if (i == 600)
            fail_msg("%s: %ld payments, expected %ld", when, service_stat("payments"), rows);
        sleep_ms(100);
    }
}

/* A token for the route's scene, or "" when none could be had (Redis
 * between masters). */
static void token_for(int port, char *h, size_t cap)
{
    struct sys_resp r;
    sys_http(port, "POST", "/_idem/v1/tokens", NULL, "{\"scene\":\"refund\",\"ttl_ms\":600000}",
             5000, &r);
    const char *t = r.status == 201 && r.m ? strstr(r.m->body, "\"token\":\"") : NULL;
    if (t)
        snprintf(h, cap, "Idem-Token: %.32s", t + 9);
    else
        h[0] = '\0';
    sys_resp_free(&r);
}

struct tstorm {
    int port[2];
    char token[KEYS][64];
    atomic_int next, ok;
    struct shot shot[KEYS * SENDS];
};

static void tpost(int port, const char *token, int key, struct shot *s)
{
    char body[128];
    snprintf(body, sizeof body, "{\"refund_no\":\"S-%d-%d\",\"amount\":\"1.00\"}", run_tag, key);
    shoot(port, "/refunds", token, body, s);
}

static void *tclient_main(void *arg)
{
    struct tstorm *st = arg;
    for (int i; (i = atomic_fetch_add(&st->next, 1)) < KEYS * SENDS;) {
        struct shot *s = &st->shot[i];
        tpost(st->port[i % 2], st->token[i / SENDS], i / SENDS, s);
        if (s->status >= 200 && s->status < 300)
            atomic_fetch_add(&st->ok, 1);
    }
    return NULL;
}

/* Until a 2xx (a token refused, lost with the old master, is replaced), or
 * the deadline. */
static void tpost_until(const struct tstorm *st, int key, int64_t until, struct shot *last)
{
    char token[64];
    snprintf(token, sizeof token, "%s", st->token[key]);
    for (;;) {
        tpost(st->port[key % 2], token, key, last);
        if ((last->status >= 200 && last->status < 300) || test_mono_ms() > until)
            return;
        if (!token[0] || (last->status == 409 && strstr(last->body, "token_spent")))
            token_for(st->port[key % 2], token, sizeof token);
        free(last->body);
        last->body = NULL;
        sleep_ms(50);
    }
}

/* The master killed mid-storm on a [token, lock, record] route; the
 * sentinels promote the replica: nothing executes twice (the record layer
 * decides, whatever locks and tokens the old master took with it), every
 * answer given replays, service resumes by itself; the consumers and idem
 * run find the new master. */
static void test_redis_sentinel_failover(void **state)
{
    (void)state;
    char *url = start_sentinels();
    test_wipe_servers(NULL, pg_url);
    run_tag++;
    struct proc a, b;
    start_idem_on(&a, url, pg_url, token_routes, 5);
    start_idem_on(&b, url, pg_url, token_routes, 6);
    long exec0 = service_stat("executions"), rows0 = service_stat("refunds");
    /* A failover the sentinels are told to make, both servers up: the old
     * master, now a replica, answers the connections it still has
     * READONLY; each instance finds the new master for its tokens. */
    char before[32], after[32];
    sh_line(before, sizeof before, "'%s' master '%s/sentinel'", sentinel_sh, dir);
    for (int i = 0; i < 2; i++) {
        char token[64];
        token_for(i ? b.port : a.port, token, sizeof token);
        assert_true(token[0] != '\0');
    }
    sys_sh("redis-cli -p %d SENTINEL FAILOVER idem >/dev/null", redis_ha_port + 2);
    for (int i = 0;; i++) {
        sh_line(after, sizeof after, "'%s' master '%s/sentinel'", sentinel_sh, dir);
        if (strcmp(before, after) != 0)
            break;
        if (i == 300)
            fail_msg("SENTINEL FAILOVER: the master is still %s after 30 s", before);
        sleep_ms(100);
    }
    for (int i = 0; i < 2; i++) {
        char token[64] = "";
        for (int n = 0; !token[0]; n++) {
            token_for(i ? b.port : a.port, token, sizeof token);
            if (n == 300)
                fail_msg("instance %d issues no token 30 s after the forced failover", i);
            if (!token[0])
                sleep_ms(100);
        }
    }
    /* The new master has its replica (the old one) back before the kill. */
    for (int i = 0;; i++) {
        char online[16];
        sh_line(online, sizeof online, "redis-cli -p \"$('%s' master '%s/sentinel')\" "
                "INFO replication | grep -c 'state=online'", sentinel_sh, dir);
        if (atoi(online) >= 1)
            break;
        if (i == 300)
            fail_msg("the old master did not come back as a replica within 30 s");
        sleep_ms(100);
    }

    /* The consumers follow the master too: 100 orders taken before. */
    long pexec0 = service_stat("payment_executions"), prows0 = service_stat("payments");
    orders("before", 100);
    payments_reach(prows0 + 100, "before the failover");

    struct tstorm *st = calloc(1, sizeof *st);
    st->port[0] = a.port, st->port[1] = b.port;
    for (int k = 0; k < KEYS; k++) {
        token_for(a.port, st->token[k], sizeof st->token[k]);
        assert_true(st->token[k][0] != '\0');
    }
    pthread_t t[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        pthread_create(&t[i], NULL, tclient_main, st);
    while (atomic_load(&st->ok) < KILL_AFTER / 2 && atomic_load(&st->next) < KEYS * SENDS)
        sleep_ms(1);
    int64_t killed = test_mono_ms();
    sentinels("kill-master", NULL);
    /* Service is back when a new key, with a new token, is answered. */
    int64_t resumed = 0;
    for (int n = 0; !resumed; n++) {
        char token[64];
        struct shot s;
        token_for(n % 2 ? b.port : a.port, token, sizeof token);
        if (token[0]) {
            tpost(n % 2 ? b.port : a.port, token, 100000 + n, &s);
            if (s.status >= 200 && s.status < 300)
                resumed = test_mono_ms();
            free(s.body);
        }
        if (test_mono_ms() - killed > 60000)
            fail_msg("no 2xx within 60 s of the master's loss");
        sleep_ms(20);
    }
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(t[i], NULL);

    int lost = 0, stuck = 0;
    int64_t until = test_mono_ms() + 60000;
    for (int key = 0; key < KEYS; key++) {
        const char *first = NULL;
        for (int s = 0; s < SENDS; s++) {
            struct shot *x = &st->shot[key * SENDS + s];
            if (x->status >= 200 && x->status < 300 && !first)
                first = x->body;
            else if (x->status >= 200 && x->status < 300 && strcmp(first, x->body) != 0)
                lost++;
        }
        struct shot last = {0};
        tpost_until(st, key, until, &last);
        int ok = last.status >= 200 && last.status < 300;
        if (first && (!ok || strcmp(first, last.body) != 0))
            lost++;
        else if (!ok)
            stuck++;
        free(last.body);
    }
    long twice = (service_stat("executions") - exec0) - (service_stat("refunds") - rows0);
    /* 100 orders on the new master: both instances' consumers reconnect
     * there by themselves and take them, each executed once. */
    orders("after", 100);
    payments_reach(prows0 + 200, "after the failover");
    sleep_ms(500);
    assert_int_equal(service_stat("payments") - prows0, 200);
    assert_int_equal(service_stat("payment_executions") - pexec0, 200);
    /* idem run on the same configuration finds the new master too: twice,
     * its command once, the second printing the first's output. */
    char cfg[4200], out[4200];
    snprintf(cfg, sizeof cfg, "%s/idem-5.yaml", dir);
    snprintf(out, sizeof out, "%s/run.out", dir);
    for (int i = 0; i < 2; i++)
        sys_sh("%s='%s' '%s' run -c '%s' -s jobs -k 'daily-%d' -- "
               "sh -c 'echo ran; echo x >>%s.count' >>'%s'",
               SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, idem_bin, cfg, run_tag, out, out);
    char *ran = sys_read_file(out);
    assert_string_equal(ran, "ran\nran\n");
    free(ran);
    snprintf(out + strlen(out), sizeof out - strlen(out), ".count");
    ran = sys_read_file(out);
    assert_string_equal(ran, "x\n");
    free(ran);
    print_message("redis sentinel failover: %d answers lost; %ld keys executed twice; %d keys "
                  "never answered; service back %lld ms after the master's SIGKILL\n",
                  lost, twice, stuck, (long long)(resumed - killed));
    assert_int_equal(twice, 0);
    assert_int_equal(lost, 0);
    assert_int_equal(stuck, 0);
    for (int i = 0; i < KEYS * SENDS; i++)
        free(st->shot[i].body);
    free(st);
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    assert_int_equal(sys_stop(&b, SIGTERM), 0);
    sentinels("stop", NULL);
    free(url);
}

/* The master demoted under Idem's connections, without the sentinels'
 * CLIENT KILL that a failover they make sends (an operator's REPLICAOF,
 * the sentinels told afterwards): the old master answers writes READONLY.
 * Each connection that meets it is retired and the next asks the
 * sentinels: tokens are issued again at once, no restart. */
static void test_redis_demoted_under_a_connection(void **state)
{
    (void)state;
    int m = redis_ha_port, r = redis_ha_port + 1;
    char *url = start_sentinels();
    struct proc a;
    char one_loop[4096]; /* one connection to Redis: the one that meets READONLY */
    snprintf(one_loop, sizeof one_loop, "event_loops: 1\n%s", token_routes);
    start_idem_on(&a, url, pg_url, one_loop, 8);
    char token[64];
    token_for(a.port, token, sizeof token);
    assert_true(token[0] != '\0');
    for (int s = 2; s <= 4; s++)
        sys_sh("redis-cli -p %d SENTINEL REMOVE idem >/dev/null", m + s);
    sys_sh("redis-cli -p %d REPLICAOF NO ONE >/dev/null && "
           "redis-cli -p %d REPLICAOF 127.0.0.1 %d >/dev/null", r, m, r);
    for (int s = 2; s <= 4; s++)
        sys_sh("redis-cli -p %d SENTINEL MONITOR idem 127.0.0.1 %d 2 >/dev/null", m + s, r);
    int refused = 0;
    for (int n = 0;; n++) {
        token_for(a.port, token, sizeof token);
        if (token[0])
            break;
        refused++;
        if (n == 50)
            fail_msg("no token 5 s after the master was demoted");
        sleep_ms(100);
    }
    print_message("redis demoted under a connection: %d token issue(s) refused, then served "
                  "by the new master\n", refused);
    assert_true(refused <= 1); /* the one call that met READONLY, at most */
    assert_int_equal(sys_stop(&a, SIGTERM), 0);
    sentinels("stop", NULL);
    free(url);
}

static int group_setup(void **state)
{
    (void)state;
    dir = test_mkdtemp();
    sys_start_service(&service, service_bin, dir, "payments", NULL);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    pair("stop", NULL);
    sentinels("stop", NULL);
    sys_finish(&service, dir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 10) {
        fprintf(stderr, "usage: %s IDEM_BINARY REFUND_SERVICE_BINARY PG_STANDBY_SH "
                        "PRIMARY_PORT STANDBY_PORT REDIS_URL REDIS_SENTINEL_SH "
                        "REDIS_HA_PORT POSTGRES_URL\n", argv[0]);
        return 2;
    }
    idem_bin = argv[1], service_bin = argv[2], pair_sh = argv[3];
    primary_port = atoi(argv[4]), standby_port = atoi(argv[5]), redis_url = argv[6];
    sentinel_sh = argv[7], redis_ha_port = atoi(argv[8]), pg_url = argv[9];
    signal(SIGPIPE, SIG_IGN);
    /* IDEM_TEST_FILTER=*sentinel* runs only the tests it matches. */
    if (getenv("IDEM_TEST_FILTER"))
        cmocka_set_test_filter(getenv("IDEM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_synchronous_standby),
        cmocka_unit_test(test_asynchronous_standby),
        cmocka_unit_test(test_standby_dropped_under_it),
        cmocka_unit_test(test_redis_sentinel_failover),
        cmocka_unit_test(test_redis_demoted_under_a_connection),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
