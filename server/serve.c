/* SPDX-License-Identifier: Apache-2.0 */
/*
 * serve.c — `idem serve`: configuration, the Idem handle, the loop, signals
 * (daemon).
 *
 * One libevent loop per processor (at most 4), or event_loops of them (loop 0
 * on the main thread), handles requests without blocking (dispatch.c): the
 * gateway, the JSON API and the consumers make the library's asynchronous
 * calls on their loop. Only what must block has a thread: the store's own
 * (its writers), and one for a reload (background.c).
 * SIGTERM or SIGINT drains: no new connections, requests in flight finish
 * (up to shutdown_timeout), then the handle closes, which waits for the last
 * group commit — no record is left half-written. SIGHUP reloads the routes
 * from the same file; a file that does not load leaves the running routes in
 * place and says why.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <openssl/rand.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include "background.h"
#include "telemetry/access_log.h"
#include "telemetry/recent.h"
#include "consume/consume.h"
#include "daemon.h"
#include "dispatch.h"
#include "gateway/gateway.h"
#include "gateway/resolver.h"
#include "log.h"
#include "mono.h"
#include "http/peers.h"
#include "http/rate.h"
#include "gateway/replay_cache.h"
#include "serve.h"
#include "http/tls.h"
/* The --help texts, made from docs/man/ (scripts/mkman.sh). */
#include "idem/libevent.h"
#include "idem_consume_help.h"
#include "idem_serve_help.h"
#include "http/upstream.h"

/* Each request of the main listener as its answer goes out: counted in
 * the metrics, and its line in the access log (when on). */
static void on_answer_out(void *arg, const struct front_request *req, int status)
{
    struct daemon_loop *loop = arg;
    counts_answer(req->route_n, req, status);
    if (loop->alog)
        access_log_request(loop->alog, req, status);
}

/* ---- signals, reload, purge ---- */

#define LOOPS_MAX 16 /* event_loops' upper bound */
#define LOOPS_AUTO_MAX 4 /* without event_loops: one per processor, up to this */

/* One event loop: its base, its front end, its thread (loop 0 runs on the
 * main thread, with the signals and the purge timer). */
struct loop {
    struct daemon_loop ctx;    /* its base, its upstream connections */
    struct front *front;
    pthread_t thread;
    int running;
};

/* The embedded store in a file named by its path (not :memory:; a file:
 * URI is refused with the configuration). */
static int store_is_file(const struct server_config *cfg)
{
    return strcmp(cfg->storage_kind, "embedded") == 0 &&
           strcmp(cfg->storage_path, ":memory:") != 0;
}

/* Each client connection, each upstream call and the store's files take a
 * file descriptor. The soft limit is raised to the hard one (a shell's 1024
 * is far below connections_max's default), and what is still short is said
 * at the start: past the limit, accept() fails and new clients wait. */
static void raise_fd_limit(const struct server_config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = was;
    }
    const struct server_limits *l = &cfg->limits;
    /* Past connections_max, up to 1024 more are accepted to be answered
     * 503 (OVER_LIMIT_GRACE in front.c); 64 for the store's files, the
     * listeners, the loops' own, and idle upstream connections beyond the
     * in-flight ones at most as many again. */
    unsigned long long need = (unsigned long long)l->connections_max + l->admin_connections_max +
                              2ull * l->in_flight_max + 1024 + 64;
    if (rl.rlim_cur != RLIM_INFINITY && need > rl.rlim_cur)
        daemon_logl(LOG_WARN,
                    "connections_max %zu, admin_connections_max %zu and in_flight_max "
                    "%zu (upstream connections, in use and idle) need up to %llu file "
                    "descriptors; the limit is %llu (ulimit -n, LimitNOFILE): past it new "
                    "clients wait",
                    l->connections_max, l->admin_connections_max, l->in_flight_max, need,
                    (unsigned long long)rl.rlim_cur);
}

/* One daemon per embedded store file: its tokens and locks (layers 1 and
 * 2) live in the process, so a second idem serve on the same file — started
 * by mistake, and taking half the connections, since the listeners share
 * their port — would split them. The file itself is flock()ed, which
 * SQLite's own (fcntl) locks do not see. The descriptor stays open until
 * the store is closed: closing any descriptor of a file drops the process's
 * fcntl locks on it, SQLite's included. 0, or -1 with the reason printed. */
static int lock_store_file(const struct server_config *cfg, int *fd)
{
    const char *path = cfg->storage_path;
    if (!store_is_file(cfg))
        return 0;
    /* Made 0600 (SQLite gives its -wal and -shm the same mode): the
     * stored answers are the admin listener's to show, and nobody's who
     * can only list the directory. */
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (*fd < 0) {
        fprintf(stderr, "idem serve: opening the embedded store at %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        fprintf(stderr,
                "idem serve: %s is in use by another idem serve%s: an embedded store has one "
                "daemon, whose tokens and locks live in its process. Stop that one first, or "
                "run several on the distributed store\n",
                path, errno == EWOULDBLOCK ? "" : " (or cannot be locked)");
        close(*fd);
        *fd = -1;
        return -1;
    }
    return 0;
}

struct serve {
    struct daemon d;
    const struct server_limits *limits; /* start's: fixed for the life of the process */
    struct loop loops[LOOPS_MAX];
    int nloops;
    struct front_counts counts;  /* all loops' connections and requests */
    struct event_base *base;     /* loops[0].ctx.base */
    /* The reload: on a thread of its own (idem-bg), since reading the file,
     * its certificates and its upstreams' names blocks. */
    struct background *background;
    struct event *sig_term, *sig_int, *sig_hup, *sig_usr1, *purge_timer, *census_timer;
    struct event *recent_timer;
    struct resolver *resolver;   /* on_unknown_outcome: resolve's looks, on loop 0 */
    const char *listen_arg, *db_arg; /* --listen and --db, or NULL */
    struct live_config *start;       /* the configuration it started with (kept) */
    int purge_running;               /* a round of batches is under way, on loop 0 */
    int purge_stop;                  /* set at SIGTERM: a running purge ends */
    int store_lock;                  /* the embedded store's file, flock()ed; -1 */
    const char *admin_socket;        /* the Unix socket made (start's config), unlinked at exit */
    struct tls_server *tls, *admin_tls; /* listen.tls, admin_listen.tls; or NULL */
    SSL_CTX *upstream_tls;           /* https:// upstreams: tls_ca (or the system's) */
    struct consumers *consumers;     /* consumers: (start's config), or NULL */
    struct access_log *access;       /* access_log (start's config), or NULL: off */
    int consume_only;                /* idem consume: no main listener */
    struct job reload_job; /* SIGHUP's reload, on the background thread */
    int reload_running, reload_again;
};

static size_t in_flight(struct serve *s)
{
    size_t n = 0;
    for (int i = 0; i < s->nloops; i++)
        if (s->loops[i].front)
            n += front_in_flight(s->loops[i].front);
    return n;
}

struct drain_order {
    struct front *front;
    int64_t timeout_ms;
};

/* Runs on the loop whose front it drains: fronts are not shared. */
static void on_drain_order(evutil_socket_t fd, short what, void *arg)
{
    struct drain_order *o = arg;
    (void)fd;
    (void)what;
    front_drain(o->front, o->timeout_ms);
    free(o);
}

static void on_stop(evutil_socket_t sig, short what, void *arg)
{
    struct serve *s = arg;
    (void)what;
    daemon_log("%s: draining (%zu requests in flight, up to %lld ms)",
            sig == SIGINT ? "SIGINT" : "SIGTERM", in_flight(s),
            (long long)s->limits->shutdown_timeout_ms);
    event_del(s->purge_timer);
    event_del(s->census_timer);
    event_del(s->recent_timer);
    pthread_mutex_lock(&s->d.held.mu);
    event_del(s->d.held.later);
    pthread_mutex_unlock(&s->d.held.mu);
    resolver_stop(s->resolver);
    __atomic_store_n(&s->purge_stop, 1, __ATOMIC_RELEASE);
    consumers_drain(s->consumers, s->limits->shutdown_timeout_ms);
    for (int i = 1; i < s->nloops; i++) {
        struct drain_order *o = malloc(sizeof *o);
        if (!o) {
            event_base_loopexit(s->loops[i].ctx.base, NULL);
            continue;
        }
        o->front = s->loops[i].front;
        o->timeout_ms = s->limits->shutdown_timeout_ms;
        if (event_base_once(s->loops[i].ctx.base, -1, EV_TIMEOUT, on_drain_order, o, NULL) != 0) {
            free(o);
            event_base_loopexit(s->loops[i].ctx.base, NULL);
        }
    }
    front_drain(s->loops[0].front, s->limits->shutdown_timeout_ms);
}

static void *loop_main(void *arg)
{
    struct loop *l = arg;
    event_base_dispatch(l->ctx.base);
    return NULL;
}

/* How many event loops: event_loops, or one per processor, at most
 * LOOPS_AUTO_MAX. */
static int loop_count(const struct server_config *cfg)
{
    if (cfg->event_loops > 0)
        return cfg->event_loops;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > LOOPS_AUTO_MAX ? LOOPS_AUTO_MAX : (int)n;
}

/* What a loaded configuration goes through, at start and on every reload
 * alike (so that a reload compares like with like): --listen and --db over
 * the file's values, then the upstreams' host names looked up. 0, 1 (out
 * of memory), or 2 with err filled. */
static int finish_loading(struct server_config *cfg, const char *listen, const char *db,
                          char *err, size_t errlen)
{
    if (listen && (config_set_listen(cfg, listen, err, errlen) != 0 ||
                   config_check_addresses(cfg, err, errlen) != 0))
        return 2;
    if (db && strcmp(cfg->storage_kind, "embedded") != 0) {
        snprintf(err, errlen, "--db is for the embedded store; %s keeps storage.kind: %s",
                 cfg->path ? cfg->path : "the configuration", cfg->storage_kind);
        return 2;
    }
    if (db && strncmp(db, "file:", 5) == 0) {
        snprintf(err, errlen, "--db %s is a SQLite URI; give the file's path (the daemon locks "
                 "the file against a second idem serve by its path)", db);
        return 2;
    }
    if (db) {
        char *copy = strdup(db);
        if (!copy) {
            snprintf(err, errlen, "out of memory");
            return 1;
        }
        free(cfg->storage_path);
        cfg->storage_path = copy;
    }
    return config_finish(cfg, err, errlen) != 0 || config_resolve(cfg, err, errlen) != 0 ? 2 : 0;
}

/* The TLS contexts cfg asks for: the listeners' (their files read and
 * checked: a key that does not match its certificate is refused here, at
 * start and by --check), and the upstreams' when a route or the default
 * upstream is https://. 0, or -1 with err. */
static int open_tls(const struct server_config *cfg, struct tls_server *tls[2],
                    SSL_CTX **upstream, char *err, size_t errlen)
{
    const struct tls_files *f[2] = {&cfg->listen_tls, &cfg->admin_tls};
    static const char *const name[2] = {"listen.tls", "admin_listen.tls"};
    char why[400];
    for (int i = 0; i < 2; i++) {
        if (f[i]->cert && !(tls[i] = tls_server_new(f[i]->cert, f[i]->key, f[i]->client_ca, why,
                                                    sizeof why))) {
            snprintf(err, errlen, "%s: %s", name[i], why);
            goto fail;
        }
    }
    int https = cfg->has_upstream && cfg->upstream.tls;
    for (size_t i = 0; i < cfg->route_count; i++)
        https |= cfg->routes[i].upstream.tls;
    if ((https || cfg->tls_ca) && !(*upstream = tls_client_ctx(cfg->tls_ca, why, sizeof why))) {
        snprintf(err, errlen, "tls_ca: %s", why);
        goto fail;
    }
    return 0;
fail:
    tls_server_free(tls[0]);
    tls_server_free(tls[1]);
    tls[0] = tls[1] = NULL;
    return -1;
}

/* Two configured addresses, either host possibly NULL (none). */
static int same_address(const char *h1, int p1, const char *h2, int p2)
{
    return h1 && h2 ? strcmp(h1, h2) == 0 && p1 == p2 : h1 == h2;
}

/* 1 if the two routes build the same record keys from the same request. */
static int same_keys(const struct route *a, const struct route *b)
{
    if (strcmp(a->space, b->space) != 0 || a->scope_subject != b->scope_subject ||
        a->key_parts != b->key_parts)
        return 0;
    for (size_t i = 0; i < a->key_parts; i++) {
        const struct key_part *x = &a->key[i], *y = &b->key[i];
        if (x->source != y->source || x->segment != y->segment ||
            ((x->name || y->name) && (!x->name || !y->name || strcmp(x->name, y->name) != 0)))
            return 0;
    }
    return 1;
}

/* A reload that changes how a route's keys are made (its space, key or
 * scope, or the subject header) does not carry the records over: a
 * duplicate of a request recorded before it, or still in flight, is
 * executed again. Allowed (a new space is how a route starts over), but
 * said, route by route. */
static void warn_new_keys(const struct server_config *was, const struct server_config *now)
{
    int subject = strcasecmp(was->subject_header, now->subject_header) != 0;
    for (size_t i = 0; i < now->route_count; i++) {
        const struct route *n = &now->routes[i];
        for (size_t j = 0; j < was->route_count; j++) {
            const struct route *w = &was->routes[j];
            if (strcmp(w->name, n->name) != 0)
                continue;
            if (!same_keys(w, n) || (subject && n->scope_subject))
                daemon_log("SIGHUP: route %s: its records are keyed differently now (space, "
                           "key, scope or subject_header changed): duplicates of requests "
                           "recorded before, or still in flight, execute again",
                           n->name);
            if (w->layer_token && n->layer_token && strcmp(w->token_scene, n->token_scene))
                daemon_log("SIGHUP: route %s: its token_scene is %s now, not %s: tokens "
                           "issued for %s are refused on it, and retries with a token spent "
                           "on it before get 409 token_spent",
                           n->name, n->token_scene, w->token_scene, w->token_scene);
            break;
        }
    }
}

/* Load the file again and make it current. On a worker: loading looks up
 * the upstreams' host names, which may wait on DNS for seconds, and a loop
 * that waited would stop extending its requests' leases. */
static void reload(struct serve *s)
{
    struct live_config *cur = daemon_config_get(&s->d);
    const char *path = cur->c->path;
    if (!path) {
        daemon_log("SIGHUP: no configuration file to reload");
        daemon_config_put(cur);
        return;
    }
    char err[512];
    struct server_config *next = NULL;
    if (config_load(path, &next, err, sizeof err) != 0 ||
        finish_loading(next, s->listen_arg, s->db_arg, err, sizeof err) != 0) {
        daemon_log("SIGHUP: %s; the running routes stay", err);
        atomic_store(&s->d.reload_failed, 1);
        config_free(next);
        daemon_config_put(cur);
        return;
    }
    struct live_config *lc = calloc(1, sizeof *lc);
    if (!lc) {
        config_free(next);
        daemon_config_put(cur);
        return;
    }
    /* What the process set up at start stays until a restart: where it
     * listens and stores, its threads, its limits (the connections, the
     * parser and the store, whose largest result is response_max's, were
     * set up with them). The file is compared with what the process
     * started with, not with the last file loaded, and what differs is
     * named. */
    const struct server_config *st = s->start->c;
    char was[1100], now[1100], waits[128] = "";
    config_storage_where(st, was, sizeof was);
    config_storage_where(next, now, sizeof now);
    const struct {
        int changed;
        const char *name;
    } fixed[] = {
        {!same_address(next->listen_host, next->listen_port, st->listen_host, st->listen_port),
         "listen"},
        {!same_address(next->admin_host, next->admin_port, st->admin_host, st->admin_port) ||
             !same_address(next->admin_unix, 0, st->admin_unix, 0),
         "admin_listen"},
        {strcmp(next->storage_kind, st->storage_kind) || strcmp(was, now), "storage"},
        {loop_count(next) != s->nloops, "event_loops"},
        {memcmp(&next->limits, s->limits, sizeof *s->limits) != 0, "limits"},
        {!next->listen_tls.cert != !st->listen_tls.cert, "listen.tls (on or off)"},
        {!next->admin_tls.cert != !st->admin_tls.cert ||
             !next->admin_tls.client_ca != !st->admin_tls.client_ca,
         "admin_listen.tls (on or off, client_ca)"},
        {!same_address(next->tls_ca, 0, st->tls_ca, 0), "tls_ca"},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i].changed)
            snprintf(waits + strlen(waits), sizeof waits - strlen(waits), "%s%s",
                     waits[0] ? ", " : "", fixed[i].name);
    if (waits[0])
        daemon_log("SIGHUP: %s: changed in the file; the running ones stay until a restart",
                   waits);
    warn_new_keys(cur->c, next);
    /* Certificates are read again (renewed ones taken), for the
     * connections accepted from now on. */
    struct {
        struct tls_server *t;
        const struct tls_files *f;
        const char *name;
    } certs[] = {{s->tls, &next->listen_tls, "listen"}, {s->admin_tls, &next->admin_tls,
                                                        "admin_listen"}};
    /* client_ca stays the start's (a restart changes it): a file that
     * dropped it must not switch client certificates off. */
    const char *client_ca[2] = {NULL, st->admin_tls.client_ca};
    for (int i = 0; i < 2; i++)
        if (certs[i].t && certs[i].f->cert &&
            tls_server_reload(certs[i].t, certs[i].f->cert, certs[i].f->key, client_ca[i], err,
                              sizeof err) != 0)
            daemon_log("SIGHUP: %s.tls: %s; its certificate stays", certs[i].name, err);
    next->limits = *s->limits;
    counts_attach(&s->d.counts, next);
    lc->c = next;
    atomic_init(&lc->refs, 1);
    pthread_mutex_lock(&s->d.cfg_mu);
    struct live_config *old = s->d.live;
    s->d.live = lc;
    pthread_mutex_unlock(&s->d.cfg_mu);
    daemon_config_put(old);
    daemon_log("SIGHUP: reloaded %s: %zu routes", path, next->route_count);
    atomic_store(&s->d.reload_failed, 0);
    atomic_store(&s->d.config_loaded_s, (long)(wall_ms() / 1000));
    daemon_config_put(cur);
}

/* SIGUSR1 is what logrotate's postrotate sends to have log files opened
 * again: the access log's file, if it has one. (The daemon's own log goes
 * to stderr, which it did not open.) Its default action would end the
 * daemon, requests in flight and all. */
static void on_reopen(evutil_socket_t sig, short what, void *arg)
{
    struct serve *s = arg;
    char err[600];
    (void)sig;
    (void)what;
    if (!s->start->c->access_to || !*s->start->c->access_to) {
        daemon_log("SIGUSR1: the logs go to stdout and stderr, which the daemon does not "
                   "open: nothing to reopen");
        return;
    }
    if (access_log_reopen(s->access, err, sizeof err) != 0)
        daemon_log("SIGUSR1: %s; lines go on to the file it had open", err);
    else
        daemon_log("SIGUSR1: the access log %s reopened", s->start->c->access_to);
}

/* One reload at a time; a SIGHUP during one asks for another after it. */
static void run_reload(struct job *j)
{
    struct serve *s = (struct serve *)((char *)j - offsetof(struct serve, reload_job));
    for (;;) {
        __atomic_store_n(&s->reload_again, 0, __ATOMIC_RELEASE);
        reload(s);
        __atomic_store_n(&s->reload_running, 0, __ATOMIC_RELEASE);
        if (!__atomic_load_n(&s->reload_again, __ATOMIC_ACQUIRE) ||
            __atomic_exchange_n(&s->reload_running, 1, __ATOMIC_ACQ_REL))
            return;
    }
}

static void on_reload(evutil_socket_t sig, short what, void *arg)
{
    struct serve *s = arg;
    (void)sig;
    (void)what;
    __atomic_store_n(&s->reload_again, 1, __ATOMIC_RELEASE);
    if (__atomic_exchange_n(&s->reload_running, 1, __ATOMIC_ACQ_REL))
        return; /* the running one sees reload_again */
    s->reload_job.run = run_reload;
    if (background_submit(s->background, &s->reload_job) != 0) {
        __atomic_store_n(&s->reload_running, 0, __ATOMIC_RELEASE);
        daemon_log("SIGHUP: the daemon is stopping; not reloaded");
    }
}

/* At start and each minute, every record whose retention has run out goes,
 * PURGE_BATCH at a time: each batch is one asynchronous store call made on
 * loop 0, so the requests' writes take turns with it, never waiting behind
 * one long delete, and the next batch is asked for while they come back
 * full. A stop (SIGTERM) ends the round between batches. Loop 0 only. */
#define PURGE_BATCH 1000

static void purge_next(struct serve *s);

static void on_purged(void *arg, idem_rc rc, unsigned n, const char *detail)
{
    struct serve *s = arg;
    if (rc != IDEM_OK && rc != IDEM_ECLOSING)
        daemon_log("purging expired records: %s: %s", idem_strerror(rc), detail);
    if (rc == IDEM_OK && n == PURGE_BATCH && !s->purge_stop)
        purge_next(s);
    else
        s->purge_running = 0;
}

static void purge_next(struct serve *s)
{
    idem_rc rc = idem_record_purge_async(s->d.h, s->loops[0].ctx.iloop, PURGE_BATCH, on_purged,
                                         s);
    if (rc != IDEM_OK) {
        daemon_log("purging expired records: %s: %s", idem_strerror(rc), idem_errdetail());
        s->purge_running = 0;
    }
}

static void on_purge(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    if (s->purge_running || s->purge_stop)
        return;
    s->purge_running = 1;
    purge_next(s);
}

/* Every HELD_CENSUS_EVERY_S, the claims held now are counted on loop 0
 * (admin/held_census.h), for the metrics. */
static void on_census(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    if (__atomic_load_n(&s->purge_stop, __ATOMIC_ACQUIRE))
        return;
    struct live_config *lc = daemon_config_get(&s->d);
    held_census_run(&s->d.held, s->d.h, s->loops[0].ctx.iloop, lc->c);
    daemon_config_put(lc);
}

/* Every RECENT_STEP_MS, each route's counters are copied into its recent
 * past (telemetry/recent.h), on loop 0, for the console's rates. */
static void on_recent(evutil_socket_t fd, short what, void *arg)
{
    struct serve *s = arg;
    (void)fd;
    (void)what;
    recent_sample_all(&s->d.counts, mono_ms());
}

static void on_idem_log(void *arg, idem_log_level level, const char *msg)
{
    (void)arg;
    daemon_logl(level == IDEM_LOG_ALERT  ? LOG_ALERT
                : level == IDEM_LOG_WARN ? LOG_WARN
                                         : LOG_INFO,
                "%s", msg);
}

static void consume_usage(FILE *out)
{
    fputs(idem_consume_help, out);
}

static void usage(FILE *out)
{
    fputs(idem_serve_help, out);
}

static int run(int argc, char **argv, int consume_only)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"db", required_argument, NULL, 'd'},
        {"check", no_argument, NULL, 't'},
        {"dump-config", no_argument, NULL, 'T'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *me = consume_only ? "idem consume" : "idem serve";
    const char *config_path = NULL, *listen = NULL, *db = NULL;
    int c, check = 0, dump = 0;
    optind = 1;
    /* -t, -T and -V as nginx has them (-t tests the file, -T tests and
     * prints it, -v says the version). */
    while ((c = getopt_long(argc, argv, "c:l:htTV", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'l': listen = optarg; break;
        case 'd': db = optarg; break;
        case 't': check = 1; break;
        case 'T': check = dump = 1; break;
        case 'V': printf("%s %s\n", me, idem_version()); return 0;
        case 'h': (consume_only ? consume_usage : usage)(stdout); return 0;
        default: (consume_only ? consume_usage : usage)(stderr); return 2;
        }
    }
    if (consume_only && listen) {
        fprintf(stderr, "idem consume: --listen: nothing listens on listen here\n");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", me, argv[optind]);
        (consume_only ? consume_usage : usage)(stderr);
        return 2;
    }

    char err[512];
    struct server_config *cfg = NULL;
    if (config_path) {
        if (config_load(config_path, &cfg, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", me, err);
            return 2;
        }
    } else if (!(cfg = config_default())) {
        fprintf(stderr, "%s: out of memory\n", me);
        return 1;
    }
    /* The log's level and form, before anything is logged. */
    daemon_log_setup((enum log_level)cfg->log_level, cfg->log_json);
    int bad = finish_loading(cfg, listen, db, err, sizeof err);
    if (bad) {
        fprintf(stderr, "%s: %s\n", me, err);
        config_free(cfg);
        return bad;
    }
    struct tls_server *tls[2] = {NULL, NULL};
    SSL_CTX *upstream_tls = NULL;
    if (open_tls(cfg, tls, &upstream_tls, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", me, err);
        config_free(cfg);
        return 2;
    }
    if (consume_only && cfg->consumer_count == 0) {
        fprintf(stderr, "%s: %s has no consumers: to consume, list them under consumers: "
                "(docs/consumers.md)\n", me, config_path ? config_path : "the configuration");
        tls_server_free(tls[0]);
        tls_server_free(tls[1]);
        tls_client_ctx_free(upstream_tls);
        config_free(cfg);
        return 2;
    }
    if (check) {
        /* What SIGHUP would load, checked without touching the store or
         * the ports: before a reload or a restart. */
        tls_server_free(tls[0]);
        tls_server_free(tls[1]);
        tls_client_ctx_free(upstream_tls);
        /* -T: the configuration on stdout, what it says of it on stderr
         * (the output is a file idem serve -c reads). */
        if (dump && config_print(stdout, cfg) != 0) {
            fprintf(stderr, "%s: writing the configuration: %s\n", me, strerror(errno));
            config_free(cfg);
            return 1;
        }
        fprintf(dump ? stderr : stdout, "%s: %s is valid: %zu routes, %zu consumers\n", me,
                config_path ? config_path : "(defaults)", cfg->route_count, cfg->consumer_count);
        config_free(cfg);
        return 0;
    }

    struct serve *s = calloc(1, sizeof *s);
    struct live_config *lc = calloc(1, sizeof *lc);
    struct gateway *gw = gateway_new();
    int rc = 1;
    if (!s || !lc || !gw) {
        gateway_free(gw);
        free(lc);
        config_free(cfg);
        free(s);
        tls_server_free(tls[0]);
        tls_server_free(tls[1]);
        tls_client_ctx_free(upstream_tls);
        return 1;
    }
    lc->c = cfg;
    s->d.gateway = gw;
    atomic_init(&lc->refs, 1);
    s->tls = tls[0];
    s->admin_tls = tls[1];
    s->upstream_tls = upstream_tls;
    pthread_mutex_init(&s->d.cfg_mu, NULL);
    held_census_init(&s->d.held);
    counts_init(&s->d.counts);
    pthread_mutex_init(&s->d.public_health.mu, NULL);
    counts_attach(&s->d.counts, cfg);
    s->d.live = lc;
    s->start = daemon_config_get(&s->d); /* what SIGHUP compares with */
    atomic_store(&s->d.config_loaded_s, (long)(wall_ms() / 1000));
    s->limits = &cfg->limits;
    s->listen_arg = listen;
    s->db_arg = db;
    unsigned char raw[6];
    RAND_bytes(raw, sizeof raw);
    snprintf(s->d.instance, sizeof s->d.instance, "idem-%02x%02x%02x%02x%02x%02x", raw[0], raw[1],
             raw[2], raw[3], raw[4], raw[5]);

    raise_fd_limit(cfg);
    s->store_lock = -1;
    if (lock_store_file(cfg, &s->store_lock) != 0)
        goto out;
    idem_options o;
    idem_options_init(&o);
    o.store = cfg->storage_kind;
    o.path = cfg->storage_path;
    o.redis_url = cfg->redis_url;
    o.postgres_url = cfg->postgres_url;
    o.pool_size = cfg->storage_pool;
    o.timeout_ms = cfg->storage_timeout_ms;
    char where[1100];
    config_storage_where(cfg, where, sizeof where);
    o.result_max = cfg->limits.response_max + 65536; /* status and headers around the body */
    o.tokens_per_scene = (unsigned)cfg->limits.tokens_per_scene;
    o.log = on_idem_log;
    if (idem_open(&o, &s->d.h) != IDEM_OK) {
        fprintf(stderr, "%s: opening the %s store at %s: %s\n", me, cfg->storage_kind,
                where, idem_errdetail());
        goto out;
    }
    /* What the store's primary promises on a failover: said once, and with
     * require_synchronous_replication a condition of starting at all. */
    idem_replication repl;
    idem_get_replication(s->d.h, &repl);
    if (repl.known && !repl.synchronous) {
        if (cfg->require_sync_replication) {
            fprintf(stderr, "%s: storage.require_synchronous_replication: %s\n", me, repl.why);
            goto out;
        }
        daemon_logl(LOG_WARN,
                    "storage: %s. An execution whose claim or answer is lost that way can run "
                    "twice after the standby is promoted; give the primary a synchronous standby "
                    "(synchronous_standby_names, synchronous_commit = on), or set "
                    "storage.require_synchronous_replication to refuse to start without one",
                    repl.why);
    }
    signal(SIGPIPE, SIG_IGN);
    evthread_use_pthreads();
    if (!(s->background = background_start("idem-bg"))) {
        fprintf(stderr, "%s: cannot start the background thread (reload)\n", me);
        goto out;
    }
    front_counts_init(&s->counts);
    s->d.front_counts = &s->counts;
    if (!(s->counts.peers = peer_table_new(8192))) {
        fprintf(stderr, "%s: out of memory\n", me);
        goto out;
    }
    s->consume_only = consume_only;
    /* idem consume: one loop, for the admin listener alone. */
    s->access = access_log_open(cfg, err, sizeof err);
    if (!s->access && err[0]) {
        fprintf(stderr, "%s: %s\n", me, err);
        goto out;
    }
    s->nloops = consume_only ? 1 : loop_count(cfg);
    int port = consume_only ? 0 : cfg->listen_port, admin_port = cfg->admin_port;
    s->d.issued_by_subject = rate_table_new(65536);
    s->d.issued_by_peer = rate_table_new(4096);
    s->d.auth_failures_by_peer = rate_table_new(1024);
    if (!s->d.issued_by_subject || !s->d.issued_by_peer || !s->d.auth_failures_by_peer) {
        fprintf(stderr, "%s: out of memory\n", me);
        goto out;
    }
    if ((port && front_address_free(cfg->listen_host, port, err, sizeof err) != 0) ||
        (cfg->admin_host && admin_port &&
         front_address_free(cfg->admin_host, admin_port, err, sizeof err) != 0)) {
        fprintf(stderr, "%s: listen: %s\n", me, err);
        goto out;
    }
    for (int i = 0; i < s->nloops; i++) {
        struct loop *l = &s->loops[i];
        l->ctx.d = &s->d;
        l->ctx.base = event_base_new();
        l->ctx.iloop = l->ctx.base ? idem_libevent_new(l->ctx.base) : NULL;
        l->ctx.upstreams = l->ctx.iloop ? upstream_loop_new(l->ctx.base, s->upstream_tls) : NULL;
        /* Without memory for it, the loop runs without a replay cache. */
        l->ctx.replays = replay_cache_new(s->limits->replay_cache);
        l->ctx.alog = s->access && l->ctx.base ? access_buf_new(s->access, l->ctx.base) : NULL;
        l->front = l->ctx.upstreams && (l->ctx.alog || !s->access)
                       ? front_new(l->ctx.base, s->limits, dispatch_request, &s->d, &l->ctx)
                       : NULL;
        if (l->front)
            front_set_log(l->front, on_answer_out, &l->ctx);
        if (!l->front) {
            fprintf(stderr, "%s: cannot start event loop %d\n", me, i);
            goto out;
        }
        front_share_counts(l->front, &s->counts);
        /* Every loop listens on the port the first one got (port 0). */
        if (!consume_only &&
            front_listen(l->front, cfg->listen_host, port, 0, s->tls, err, sizeof err) != 0) {
            fprintf(stderr, "%s: listen: %s\n", me, err);
            goto out;
        }
        if (!consume_only)
            port = front_port(l->front, 0);
        if (cfg->admin_host) {
            if (front_listen(l->front, cfg->admin_host, admin_port, 1, s->admin_tls, err,
                             sizeof err) != 0) {
                fprintf(stderr, "%s: admin_listen: %s\n", me, err);
                goto out;
            }
            admin_port = front_port(l->front, 1);
        } else if (i == 0) {
            if (front_listen_unix(l->front, cfg->admin_unix, err, sizeof err) != 0) {
                fprintf(stderr, "%s: admin_listen: %s\n", me, err);
                goto out;
            }
            s->admin_socket = cfg->admin_unix;
        }
    }
    s->base = s->loops[0].ctx.base;
    if (!(s->consumers = consumers_start(&s->d, s->start, s->upstream_tls, s->access, err,
                                         sizeof err))) {
        fprintf(stderr, "%s: %s\n", me, err);
        goto out;
    }
    s->d.consumers = s->consumers;
    if (!(s->resolver = resolver_new(&s->d, &s->loops[0].ctx, s->loops[0].front))) {
        fprintf(stderr, "%s: out of memory\n", me);
        goto out;
    }
    /* What libevent puts back when these events are freed, late in a stop:
     * ignored, not the default action, which would end the daemon (143,
     * 129, 138) in the middle of its clean exit. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, SIG_IGN);
    s->sig_term = evsignal_new(s->base, SIGTERM, on_stop, s);
    s->sig_int = evsignal_new(s->base, SIGINT, on_stop, s);
    s->sig_hup = evsignal_new(s->base, SIGHUP, on_reload, s);
    s->sig_usr1 = evsignal_new(s->base, SIGUSR1, on_reopen, s);
    s->purge_timer = event_new(s->base, -1, EV_PERSIST, on_purge, s);
    s->census_timer = event_new(s->base, -1, EV_PERSIST, on_census, s);
    s->recent_timer = event_new(s->base, -1, EV_PERSIST, on_recent, s);
    s->d.held.later = event_new(s->base, -1, 0, on_census, s);
    struct timeval minute = {60, 0}, census = {HELD_CENSUS_EVERY_S, 0};
    struct timeval step = {RECENT_STEP_MS / 1000, RECENT_STEP_MS % 1000 * 1000};
    event_add(s->sig_term, NULL);
    event_add(s->sig_int, NULL);
    event_add(s->sig_hup, NULL);
    event_add(s->sig_usr1, NULL);
    event_add(s->purge_timer, &minute);
    event_add(s->census_timer, &census);
    event_add(s->recent_timer, &step);
    on_purge(-1, EV_TIMEOUT, s); /* and once now: what expired while it was down */
    on_census(-1, EV_TIMEOUT, s);
    on_recent(-1, EV_TIMEOUT, s); /* where the first step starts */
    for (int i = 1; i < s->nloops; i++) {
        if (pthread_create(&s->loops[i].thread, NULL, loop_main, &s->loops[i]) != 0) {
            fprintf(stderr, "%s: cannot start the thread of event loop %d\n", me, i);
            goto out;
        }
        s->loops[i].running = 1;
        /* Loop 0 is the main thread, which keeps the program's name. (A
         * thread's name is 15 bytes at most: event_loops is 16 at most.) */
        char name[32];
        snprintf(name, sizeof name, "idem-loop-%d", i);
        pthread_setname_np(s->loops[i].thread, name);
    }

    char admin[300];
    if (cfg->admin_host)
        snprintf(admin, sizeof admin, ", JSON API on %s:%d", cfg->admin_host, admin_port);
    else
        snprintf(admin, sizeof admin, ", JSON API on unix:%s", cfg->admin_unix);
    if (cfg->workers)
        daemon_log("workers: ignored: the JSON API runs on the event loops (event_loops), "
                   "with no pool of threads to size; the line can go");
    if (cfg->api_key_count == 0)
        daemon_log("api_keys: none, so the admin listener refuses every request (401); add a "
                   "key to read or change records, locks and tokens there");
    if (consume_only)
        printf("idem: consuming%s, %s store at %s, %zu consumers\n", admin,
               idem_store_name(s->d.h), where, cfg->consumer_count);
    else
        printf("idem: listening on %s:%d%s, %s store at %s, %zu routes, %zu consumers, %d "
               "event loops\n",
               cfg->listen_host, port, admin, idem_store_name(s->d.h), where, cfg->route_count,
               cfg->consumer_count, s->nloops);
    fflush(stdout);
    event_base_dispatch(s->base);
    rc = 0;

out:
    /* Loop 0 has drained (or never ran): stop the others and the consumers
     * (draining since SIGTERM). */
    for (int i = 1; i < s->nloops; i++)
        if (s->loops[i].running) {
            if (rc != 0)
                event_base_loopexit(s->loops[i].ctx.base, NULL);
            pthread_join(s->loops[i].thread, NULL);
        }
    if (rc != 0)
        consumers_drain(s->consumers, 0);
    consumers_join(s->consumers);
    if (rc == 0)
        daemon_log("stopped (%zu requests were still in flight)", in_flight(s));
    /* Requests still in flight after shutdown_timeout are abandoned: first
     * those parked on a loop (their upstream exchange, a wait), then, as
     * each loop lets the store go, those whose store call was still out
     * (its callback finds the front closing). The handle stays open until
     * then: abandoning a request releases its lock. */
    for (int i = 0; i < s->nloops; i++)
        front_abort_parked(s->loops[i].front);
    background_stop(s->background);
    for (int i = 0; i < s->nloops; i++)
        daemon_loop_settle(&s->loops[i].ctx);
    for (int i = 0; i < s->nloops; i++)
        front_free(s->loops[i].front);
    consumers_free(s->consumers);
    resolver_free(s->resolver);
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->sig_hup)
        event_free(s->sig_hup);
    if (s->sig_usr1)
        event_free(s->sig_usr1);
    if (s->purge_timer)
        event_free(s->purge_timer);
    if (s->census_timer)
        event_free(s->census_timer);
    if (s->recent_timer)
        event_free(s->recent_timer);
    if (s->d.held.later)
        event_free(s->d.held.later);
    for (int i = 0; i < LOOPS_MAX; i++) {
        replay_cache_free(s->loops[i].ctx.replays);
        access_buf_free(s->loops[i].ctx.alog); /* its last lines */
        if (s->loops[i].ctx.base) {
            upstream_loop_free(s->loops[i].ctx.upstreams);
            idem_libevent_free(s->loops[i].ctx.iloop);
            event_base_free(s->loops[i].ctx.base);
        }
    }
    if (s->admin_socket)
        unlink(s->admin_socket);
    peer_table_free(s->counts.peers);
    access_log_close(s->access);
    tls_server_free(s->tls);
    tls_server_free(s->admin_tls);
    tls_client_ctx_free(s->upstream_tls);
    rate_table_free(s->d.issued_by_subject);
    rate_table_free(s->d.issued_by_peer);
    rate_table_free(s->d.auth_failures_by_peer);
    idem_close(s->d.h); /* the last group commit completes here */
    if (s->store_lock >= 0)
        close(s->store_lock); /* after the store's own connections: see lock_store_file */
    daemon_config_put(s->start);
    daemon_config_put(s->d.live);
    pthread_mutex_destroy(&s->d.cfg_mu);
    held_census_free(&s->d.held);
    gateway_free(s->d.gateway);
    pthread_mutex_destroy(&s->d.public_health.mu);
    counts_free(&s->d.counts);
    free(s);
    return rc;
}

int serve_main(int argc, char **argv)
{
    return run(argc, argv, 0);
}

int consume_main(int argc, char **argv)
{
    return run(argc, argv, 1);
}
