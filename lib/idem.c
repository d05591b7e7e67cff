/*
 * idem.c — opening and closing a handle (public API layer): picks the
 * backends named by the options, applies the defaults, and tears down in the
 * reverse order.
 */
#include <stdarg.h>
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

IDEM_EXTERN void idem_options_init(idem_options *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->version = IDEM_OPTIONS_VERSION;
    o->store = "embedded";
}

IDEM_EXTERN idem_rc idem_open(const idem_options *opts, idem **out)
{
    idem__clear_detail();
    if (!out)
        return idem__fail(IDEM_EINVAL, "out: NULL out-parameter");
    *out = NULL;
    if (!opts)
        return idem__fail(IDEM_EINVAL, "options: NULL");
    if (opts->version != IDEM_OPTIONS_VERSION)
        return idem__fail(IDEM_EINVAL, "options: version %u, this library speaks %u",
                          opts->version, IDEM_OPTIONS_VERSION);
    idem_options o = *opts;
    if (!o.store)
        o.store = "embedded";
    if (strcmp(o.store, "embedded") != 0)
        return idem__fail(IDEM_ENOTSUP, "store: \"%s\" is not built in (embedded is)",
                          o.store);
    if (!o.path || !*o.path)
        return idem__fail(IDEM_EINVAL, "path: the embedded store needs a SQLite "
                                       "file path (or \":memory:\")");
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
    h->store_name = "embedded";
    h->result_max = o.result_max;
    h->retention_ms = o.retention_ms;
    h->tokens_per_scene = o.tokens_per_scene;
    h->clock = o.clock;
    h->clock_arg = o.clock_arg;
    h->log = o.log;
    h->log_arg = o.log_arg;
    pthread_mutex_init(&h->watchdog_mu, NULL);
    idem_rc rc = idem__memory_open(&o, &h->kv_ops, &h->kv);
    if (rc == IDEM_OK)
        rc = idem__sqlite_open(&o, &h->db_ops, &h->db);
    if (rc != IDEM_OK) {
        idem_close(h);
        return rc;
    }
    *out = h;
    return IDEM_OK;
}

IDEM_EXTERN void idem_close(idem *h)
{
    if (!h)
        return;
    idem__watchdog_free(h->watchdog);
    if (h->db)
        h->db_ops->close(h->db);
    if (h->kv)
        h->kv_ops->close(h->kv);
    pthread_mutex_destroy(&h->watchdog_mu);
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
    h->db_ops->commit_stats(h->db, &out->commits, &out->committed_ops);
}
