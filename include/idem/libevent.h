/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem/libevent.h — a libevent event_base as an idem_loop (idem/loop.h).
 *
 *   idem_loop *loop = idem_libevent_new(base);
 *   ... idem_lock_acquire_async(h, loop, ...), event_base_dispatch(base) ...
 *   idem_loop_detach(h, loop);
 *   idem_libevent_free(loop);
 *   event_base_free(base);
 *
 * Idem's stores finish calls on threads of their own and post the callback
 * to the loop, so the base must be one libevent can wake from another
 * thread: call evthread_use_pthreads() before event_base_new(). Everything
 * here is in this header (link with -levent_core -levent_pthreads); nothing
 * of it is in libidem.
 */
#ifndef IDEM_LIBEVENT_H
#define IDEM_LIBEVENT_H

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>

#include "idem/loop.h"

#ifdef __cplusplus
extern "C" {
#endif

struct idem_libevent {
    idem_loop loop; /* first: the idem_loop * is the adapter's */
    struct event_base *base;
    pthread_mutex_t mu; /* guards head and tail */
    idem_loop_post *head, **tail;
    struct event *wake;
};

struct idem_libevent_io {
    struct event *ev;
    struct event_base *base;
    evutil_socket_t fd;
    idem_loop_io_fn ready;
    void *arg;
    unsigned want;
};

struct idem_libevent_timer {
    struct event *ev;
    idem_loop_fn fire;
    void *arg;
};

static void idem_libevent_on_io(evutil_socket_t fd, short what, void *arg)
{
    struct idem_libevent_io *io = (struct idem_libevent_io *)arg;
    unsigned ready = ((what & EV_READ) ? IDEM_LOOP_READ : 0u) |
                     ((what & EV_WRITE) ? IDEM_LOOP_WRITE : 0u);
    (void)fd;
    io->ready(io->arg, ready);
}

static void *idem_libevent_io_new(void *loop, int fd, idem_loop_io_fn ready, void *arg)
{
    struct idem_libevent *l = (struct idem_libevent *)loop;
    struct idem_libevent_io *io = (struct idem_libevent_io *)calloc(1, sizeof *io);
    if (!io)
        return NULL;
    io->base = l->base;
    io->fd = fd;
    io->ready = ready;
    io->arg = arg;
    io->ev = event_new(l->base, fd, EV_PERSIST, idem_libevent_on_io, io);
    if (!io->ev) {
        free(io);
        return NULL;
    }
    return io;
}

static int idem_libevent_io_want(void *p, unsigned what)
{
    struct idem_libevent_io *io = (struct idem_libevent_io *)p;
    short ev = (short)(((what & IDEM_LOOP_READ) ? EV_READ : 0) |
                       ((what & IDEM_LOOP_WRITE) ? EV_WRITE : 0));
    if (what == io->want)
        return 0;
    event_del(io->ev);
    io->want = what;
    if (!ev)
        return 0;
    if (event_assign(io->ev, io->base, io->fd, (short)(ev | EV_PERSIST), idem_libevent_on_io,
                     io) != 0 ||
        event_add(io->ev, NULL) != 0) {
        io->want = 0;
        return -1;
    }
    return 0;
}

static void idem_libevent_io_free(void *p)
{
    struct idem_libevent_io *io = (struct idem_libevent_io *)p;
    if (!io)
        return;
    event_free(io->ev);
    free(io);
}

static void idem_libevent_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct idem_libevent_timer *t = (struct idem_libevent_timer *)arg;
    (void)fd;
    (void)what;
    t->fire(t->arg);
}

static void *idem_libevent_timer_new(void *loop, idem_loop_fn fire, void *arg)
{
    struct idem_libevent *l = (struct idem_libevent *)loop;
    struct idem_libevent_timer *t = (struct idem_libevent_timer *)calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->fire = fire;
    t->arg = arg;
    t->ev = evtimer_new(l->base, idem_libevent_on_timer, t);
    if (!t->ev) {
        free(t);
        return NULL;
    }
    return t;
}

static int idem_libevent_timer_set(void *p, int64_t ms)
{
    struct idem_libevent_timer *t = (struct idem_libevent_timer *)p;
    if (ms < 0)
        return evtimer_del(t->ev) == 0 ? 0 : -1;
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000 * 1000);
    return evtimer_add(t->ev, &tv) == 0 ? 0 : -1;
}

static void idem_libevent_timer_free(void *p)
{
    struct idem_libevent_timer *t = (struct idem_libevent_timer *)p;
    if (!t)
        return;
    event_free(t->ev);
    free(t);
}

/* Run everything posted so far, in order. */
static void idem_libevent_run_posted(struct idem_libevent *l)
{
    pthread_mutex_lock(&l->mu);
    idem_loop_post *p = l->head;
    l->head = NULL;
    l->tail = &l->head;
    pthread_mutex_unlock(&l->mu);
    while (p) {
        idem_loop_post *next = p->next;
        p->fn(p->arg); /* may free p */
        p = next;
    }
}

static void idem_libevent_on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    idem_libevent_run_posted((struct idem_libevent *)arg);
}

static void idem_libevent_post(void *loop, idem_loop_post *p)
{
    struct idem_libevent *l = (struct idem_libevent *)loop;
    p->next = NULL;
    pthread_mutex_lock(&l->mu);
    int first = l->head == NULL;
    *l->tail = p;
    l->tail = &p->next;
    pthread_mutex_unlock(&l->mu);
    /* A post onto a list not yet taken goes with the one that woke it. */
    if (first)
        event_active(l->wake, EV_READ, 0);
}

static const struct idem_loop_ops idem_libevent_ops = {
    IDEM_LOOP_OPS_VERSION,
    idem_libevent_io_new,
    idem_libevent_io_want,
    idem_libevent_io_free,
    idem_libevent_timer_new,
    idem_libevent_timer_set,
    idem_libevent_timer_free,
    idem_libevent_post,
};

/* base as an idem_loop; NULL for want of memory. */
static inline idem_loop *idem_libevent_new(struct event_base *base)
{
    struct idem_libevent *l = (struct idem_libevent *)calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->loop.ops = &idem_libevent_ops;
    l->loop.loop = l;
    l->base = base;
    l->tail = &l->head;
    l->wake = event_new(base, -1, 0, idem_libevent_on_wake, l);
    if (!l->wake || pthread_mutex_init(&l->mu, NULL) != 0) {
        if (l->wake)
            event_free(l->wake);
        free(l);
        return NULL;
    }
    return &l->loop;
}

/* Run what is still posted (the loop has stopped: on the thread that ran
 * it), without freeing anything. A shutdown calls it once every call it
 * made has finished, so that each callback runs. */
static inline void idem_libevent_drain(idem_loop *loop)
{
    if (loop)
        idem_libevent_run_posted((struct idem_libevent *)loop->loop);
}

/* Drain, then free the adapter (not the base). */
static inline void idem_libevent_free(idem_loop *loop)
{
    if (!loop)
        return;
    struct idem_libevent *l = (struct idem_libevent *)loop->loop;
    idem_libevent_run_posted(l);
    event_free(l->wake);
    pthread_mutex_destroy(&l->mu);
    free(l);
}

#ifdef __cplusplus
}
#endif

#endif
