/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem.c — opening and closing a handle (public API layer): picks the
 * backends named by the options, applies the defaults, and tears down in the
 * reverse order.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/check.h"
#include "core/error.h"
#include "lock/lock_watchdog.h"
#include "store/store.h"

int64_t idem__wall_clock_ms(void *unused)
{
    (void)unused;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void idem__log(const struct idem *h, idem_log_level level, const char *fmt, ...)
{
    if (!h->log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    h->log(h->log_arg, level, line);
}

IDEM_EXTERN const char *idem_version(void)
{
    return IDEM_VERSION_STRING;
}

IDEM_EXTERN idem_rc idem_check_key(const char *key)
{
    idem__clear_detail();
    return idem__check_key(key, "key", 0);
}

IDEM_EXTERN void idem_options_init(idem_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->version = IDEM_OPTIONS_VERSION;
    o->store = "embedded";
}

/* The two halves of a store, by name. */
static int is_kv(const char *n) { return !strcmp(n, "memory") || !strcmp(n, "redis"); }
static int is_db(const char *n) { return !strcmp(n, "sqlite") || !strcmp(n, "postgres"); }

idem_rc idem__open_parts(const idem_options *opts, const char *kv, const char *db,
                         idem **out)
{
    idem__clear_detail();
    if (!out)
        return idem__fail(IDEM_EINVAL, "out: NULL out-parameter");
    *out = NULL;
    if (!opts)
        return idem__fail(IDEM_EINVAL, "options: NULL");
    if (!is_kv(kv) || !is_db(db))
        return idem__fail(IDEM_ENOTSUP, "store: no backend pair %s+%s", kv, db);
    /* Version 1 ended where version 2's fields begin: take only its part. */
    idem_options o;
    if (opts->version == 1) {
        idem_options_init(&o);
        memcpy(&o, opts, offsetof(idem_options, redis_url));
    } else if (opts->version == IDEM_OPTIONS_VERSION) {
        o = *opts;
    } else {
        return idem__fail(IDEM_EINVAL, "options: version %u, this library speaks 1..%u",
                          opts->version, IDEM_OPTIONS_VERSION);
    }
    int redis = !strcmp(kv, "redis"), postgres = !strcmp(db, "postgres");
    if (redis && (!o.redis_url || !*o.redis_url))
        return idem__fail(IDEM_EINVAL, "redis_url: the distributed store needs "
                                       "a Redis URL (redis://host:port/db)");
    if (postgres && (!o.postgres_url || !*o.postgres_url))
        return idem__fail(IDEM_EINVAL, "postgres_url: the distributed store "
                                       "needs a PostgreSQL connection URL");
    if (!postgres && (!o.path || !*o.path))
        return idem__fail(IDEM_EINVAL, "path: the embedded store needs a SQLite "
                                       "file path (or \":memory:\")");
    if (!o.pool_size)
        o.pool_size = 8;
    if (o.pool_size > 256)
        return idem__fail(IDEM_EINVAL, "pool_size: %u, at most 256", o.pool_size);
    if (!o.timeout_ms)
        o.timeout_ms = 2000;
    if (o.timeout_ms < 0 || o.timeout_ms > 600000)
        return idem__fail(IDEM_EINVAL, "timeout_ms: %lld, must be 1..600000",
                          (long long)o.timeout_ms);
    if (!o.result_max)
        o.result_max = IDEM_RESULT_MAX_DEFAULT;
    if (o.result_max > 64 * 1024 * 1024)
        return idem__fail(IDEM_EINVAL, "result_max: %zu, at most 64 MiB", o.result_max);
    if (!o.retention_ms)
        o.retention_ms = IDEM_DAY_MS;
    if (o.retention_ms < 0)
        return idem__fail(IDEM_EINVAL, "retention_ms: negative");
    if (!o.tokens_per_scene)
        o.tokens_per_scene = 16;
    if (!o.tokens_max)
        o.tokens_max = 1000000;
    if (!o.locks_max)
        o.locks_max = 1000000;
    if (!o.commit_batch_max)
        o.commit_batch_max = 512;
    if (!o.clock)
        o.clock = idem__wall_clock_ms;

    struct idem *h = idem__calloc(1, sizeof *h);
    if (!h)
        return idem__fail(IDEM_ENOMEM, "allocating the handle");
    h->store_name = redis && postgres ? "distributed"
                    : !redis && !postgres ? "embedded" : "mixed";
    h->result_max = o.result_max;
    h->retention_ms = o.retention_ms;
    h->tokens_per_scene = o.tokens_per_scene;
    h->clock = o.clock;
    h->clock_arg = o.clock_arg;
    h->log = o.log;
    h->log_arg = o.log_arg;
    pthread_mutex_init(&h->watchdog_mu, NULL);
    pthread_mutex_init(&h->loops_mu, NULL);
    pthread_cond_init(&h->loops_cv, NULL);
    idem_rc rc = redis ? idem__redis_open(&o, &h->kv_ops, &h->kv)
                       : idem__memory_open(&o, &h->kv_ops, &h->kv);
    if (rc == IDEM_OK)
        rc = postgres ? idem__postgres_open(&o, &h->db_ops, &h->db)
                      : idem__sqlite_open(&o, &h->db_ops, &h->db);
    if (rc != IDEM_OK) {
        idem_close(h);
        return rc;
    }
    *out = h;
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_open(const idem_options *opts, idem **out)
{
    const char *store = opts && opts->store ? opts->store : "embedded";
    if (!strcmp(store, "embedded"))
        return idem__open_parts(opts, "memory", "sqlite", out);
    if (!strcmp(store, "distributed"))
        return idem__open_parts(opts, "redis", "postgres", out);
    idem__clear_detail();
    if (out)
        *out = NULL;
    return idem__fail(IDEM_ENOTSUP, "store: \"%s\" is not built in "
                                    "(embedded and distributed are)", store);
}

IDEM_EXTERN void idem_close(idem *h)
{
    if (!h)
        return;
    idem__watchdog_free(h->watchdog);
    /* Calls on loops: those on a loop itself fail now, those on the db's
     * writers finish as it closes; then each loop's state goes. */
    idem__loops_gone(h);
    if (h->db)
        h->db_ops->close(h->db);
    idem__loops_free(h);
    if (h->kv)
        h->kv_ops->close(h->kv);
    pthread_mutex_destroy(&h->watchdog_mu);
    pthread_mutex_destroy(&h->loops_mu);
    pthread_cond_destroy(&h->loops_cv);
    idem__free(h);
}

IDEM_EXTERN const char *idem_store_name(const idem *h)
{
    return h ? h->store_name : "";
}

IDEM_EXTERN void idem_get_stats(idem *h, idem_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!h)
        return;
    out->conflicts = atomic_load(&h->conflicts);
    out->takeovers = atomic_load(&h->takeovers);
    h->db_ops->commit_stats(h->db, out, NULL, NULL);
}

IDEM_EXTERN void idem_get_replication(idem *h, idem_replication *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (h && h->db_ops->replication)
        h->db_ops->replication(h->db, out);
}

IDEM_EXTERN void idem_get_commit_times(idem *h, idem_commit_times *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (h)
        h->db_ops->commit_stats(h->db, NULL, out, NULL);
}

IDEM_EXTERN void idem_get_commit_batches(idem *h, idem_commit_batches *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (h)
        h->db_ops->commit_stats(h->db, NULL, NULL, out);
}
