/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock_watchdog.c — renews held locks while their work runs (lock layer).
 *
 * A lock's TTL must outlive the work it guards, but a long TTL keeps a
 * crashed holder's lock for long. The watchdog squares this: the TTL stays
 * short and a thread renews it every ttl/3 for as long as the holder's watch
 * is registered. If the holder dies, renewals stop and the lock expires
 * within one TTL.
 *
 * Renewal answers decide:
 *   RENEWED   next renewal in ttl/3
 *   NOT_HELD  the lease is lost (expired and possibly taken): call on_lost once
 *   error     retry in ttl/10; once a whole TTL has passed since the last good
 *             renewal the lease has certainly run out: call on_lost once
 *
 * Scheduling runs on CLOCK_MONOTONIC; lease arithmetic in the store uses the
 * handle's clock. The callback runs without the watchdog's mutex held, with
 * the watch marked running; idem_watchdog_stop() waits for that to end, so a
 * stopped watch never calls back.
 */
#include "lock_watchdog.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/check.h"
#include "core/error.h"
#include "lock.h"
#include "store/store.h"

struct idem_watch {
    struct idem_watch *next;
    struct idem__watchdog *wd;
    int64_t ttl_ms;
    int64_t due;       /* monotonic ms of the next renewal */
    int64_t last_good; /* monotonic ms of the last good renewal */
    int listed;        /* still renewed */
    idem_lock_lost_fn on_lost;
    void *arg;
    char *space, *key, *owner;
};

struct idem__watchdog {
    idem *h;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a watch was added, or stop */
    pthread_cond_t idle; /* `running` changed */
    pthread_t thread;
    int stop;
    struct idem_watch *list;
    struct idem_watch *running;
    /* When the thread wakes by itself: the earliest renewal it knows of
     * (INT64_MAX while it waits for a first watch). A watch due no earlier
     * needs no wakeup, so starting one under load wakes nobody. */
    int64_t sleeps_until;
};

static void unlist(struct idem__watchdog *wd, struct idem_watch *w)
{
    for (struct idem_watch **p = &wd->list; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    w->listed = 0;
}

static void renew_one(struct idem__watchdog *wd, struct idem_watch *w)
{
    idem_outcome out = IDEM_NONE;
    idem *h = wd->h;
    idem_rc rc = h->kv_ops->lock_renew(h->kv, w->space, w->key, w->owner,
                                       w->ttl_ms, idem__now(h), &out);
    int64_t now = idem__mono_ms();
    int lost = 0;
    pthread_mutex_lock(&wd->mu);
    if (rc == IDEM_OK && out == IDEM_RENEWED) {
        w->last_good = now;
        w->due = now + (w->ttl_ms / 3 > 0 ? w->ttl_ms / 3 : 1);
    } else if (rc == IDEM_OK || now - w->last_good >= w->ttl_ms) {
        lost = 1;
    } else {
        w->due = now + (w->ttl_ms / 10 > 0 ? w->ttl_ms / 10 : 1);
    }
    if (lost && w->listed)
        unlist(wd, w);
    pthread_mutex_unlock(&wd->mu);
    if (lost && w->on_lost)
        w->on_lost(w->arg, w->space, w->key);
}

static void *watchdog_main(void *arg)
{
    struct idem__watchdog *wd = arg;
    pthread_mutex_lock(&wd->mu);
    while (!wd->stop) {
        struct idem_watch *next = NULL;
        for (struct idem_watch *w = wd->list; w; w = w->next)
            if (!next || w->due < next->due)
                next = w;
        int64_t now = idem__mono_ms();
        if (!next || next->due > now) {
            if (!next) {
                wd->sleeps_until = INT64_MAX;
                pthread_cond_wait(&wd->wake, &wd->mu);
            } else {
                wd->sleeps_until = next->due;
                struct timespec ts = idem__mono_after(next->due - now);
                pthread_cond_timedwait(&wd->wake, &wd->mu, &ts);
            }
            continue;
        }
        wd->sleeps_until = now; /* awake: sees every watch before it sleeps */
        wd->running = next;
        pthread_mutex_unlock(&wd->mu);
        renew_one(wd, next);
        pthread_mutex_lock(&wd->mu);
        wd->running = NULL;
        pthread_cond_broadcast(&wd->idle);
    }
    pthread_mutex_unlock(&wd->mu);
    return NULL;
}

static idem_rc watchdog_get(idem *h, struct idem__watchdog **out)
{
    idem_rc rc = IDEM_OK;
    pthread_mutex_lock(&h->watchdog_mu);
    struct idem__watchdog *wd = h->watchdog;
    if (!wd) {
        wd = idem__calloc(1, sizeof *wd);
        if (!wd) {
            rc = idem__fail(IDEM_ENOMEM, "watchdog: allocating");
            goto out;
        }
        wd->h = h;
        wd->sleeps_until = INT64_MAX;
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&wd->wake, &ca);
        pthread_condattr_destroy(&ca);
        pthread_cond_init(&wd->idle, NULL);
        pthread_mutex_init(&wd->mu, NULL);
        if (pthread_create(&wd->thread, NULL, watchdog_main, wd) != 0) {
            pthread_cond_destroy(&wd->wake);
            pthread_cond_destroy(&wd->idle);
            pthread_mutex_destroy(&wd->mu);
            idem__free(wd);
            rc = idem__fail(IDEM_ENOMEM, "watchdog: cannot start its thread");
            goto out;
        }
        pthread_setname_np(wd->thread, "idem-watchdog"); /* for top -H, perf, gdb */
        h->watchdog = wd;
    }
    *out = wd;
out:
    pthread_mutex_unlock(&h->watchdog_mu);
    return rc;
}

IDEM_EXTERN idem_rc idem_watchdog_start(idem *h, const char *space,
                                        const char *key, const char *owner,
                                        int64_t ttl_ms, idem_lock_lost_fn on_lost,
                                        void *arg, idem_watch **out)
{
    idem_rc rc;
    idem__clear_detail();
    if (!h)
        return idem__fail(IDEM_EINVAL, "handle: NULL");
    if ((rc = idem__check_name(space, "space")) != IDEM_OK ||
        (rc = idem__check_key(key, "key", 0)) != IDEM_OK ||
        (rc = idem__check_key(owner, "owner", 0)) != IDEM_OK ||
        (rc = idem__check_lock_ttl(ttl_ms)) != IDEM_OK ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = NULL;
    size_t sl = strlen(space), kl = strlen(key), ol = strlen(owner);
    struct idem_watch *w = idem__calloc(1, sizeof *w + sl + kl + ol + 3);
    if (!w)
        return idem__fail(IDEM_ENOMEM, "watchdog: allocating a watch");
    w->space = (char *)(w + 1);
    memcpy(w->space, space, sl + 1);
    w->key = w->space + sl + 1;
    memcpy(w->key, key, kl + 1);
    w->owner = w->key + kl + 1;
    memcpy(w->owner, owner, ol + 1);
    w->ttl_ms = ttl_ms;
    w->on_lost = on_lost;
    w->arg = arg;

    struct idem__watchdog *wd = NULL;
    if ((rc = watchdog_get(h, &wd)) != IDEM_OK) {
        idem__free(w);
        return rc;
    }
    w->wd = wd;
    pthread_mutex_lock(&wd->mu);
    w->last_good = idem__mono_ms();
    w->due = w->last_good + (ttl_ms / 3 > 0 ? ttl_ms / 3 : 1);
    w->listed = 1;
    w->next = wd->list;
    wd->list = w;
    if (w->due < wd->sleeps_until)
        pthread_cond_signal(&wd->wake);
    pthread_mutex_unlock(&wd->mu);
    *out = w;
    return IDEM_OK;
}

IDEM_EXTERN void idem_watchdog_stop(idem_watch *w)
{
    if (!w)
        return;
    struct idem__watchdog *wd = w->wd;
    pthread_mutex_lock(&wd->mu);
    while (wd->running == w)
        pthread_cond_wait(&wd->idle, &wd->mu);
    if (w->listed)
        unlist(wd, w);
    pthread_mutex_unlock(&wd->mu);
    idem__free(w);
}

void idem__watchdog_free(struct idem__watchdog *wd)
{
    if (!wd)
        return;
    pthread_mutex_lock(&wd->mu);
    wd->stop = 1;
    pthread_cond_signal(&wd->wake);
    pthread_mutex_unlock(&wd->mu);
    pthread_join(wd->thread, NULL);
    /* Every watch belongs to its caller until idem_watchdog_stop(), which
     * must come before idem_close(): none is freed here. */
    pthread_cond_destroy(&wd->wake);
    pthread_cond_destroy(&wd->idle);
    pthread_mutex_destroy(&wd->mu);
    idem__free(wd);
}
