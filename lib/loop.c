/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop.c — what a handle keeps for the loops its asynchronous calls run on
 * (public API layer; the loop interface is include/idem/loop.h).
 *
 * Each loop gets a struct idem__loop on its first call: a count of the
 * calls made on it whose callback is not posted yet, and the kv backend's
 * state for it. Detaching a loop fails what the kv backend runs on the loop
 * itself (it will not run again), waits for the rest (writer threads'
 * jobs), then frees the state. Loops are few (a daemon has one per core),
 * so the table is a list searched under loops_mu; each thread remembers
 * the last one it found, until a detach or a close anywhere makes that
 * memory stale (loops_gen).
 */
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "store/store.h"

static atomic_ulong loops_gen = 1; /* raised before any loop's state is freed */

static _Thread_local struct {
    idem *h;
    idem_loop *loop;
    struct idem__loop *l;
    unsigned long gen;
} last;

struct idem__loop *idem__loop_of(idem *h, idem_loop *loop)
{
    unsigned long gen = atomic_load(&loops_gen);
    if (last.h == h && last.loop == loop && last.gen == gen)
        return last.l;
    pthread_mutex_lock(&h->loops_mu);
    struct idem__loop *l = h->loops;
    while (l && l->loop != loop)
        l = l->next;
    if (!l && (l = idem__malloc(sizeof *l)) != NULL) {
        memset(l, 0, sizeof *l);
        l->h = h;
        l->loop = loop;
        atomic_init(&l->pending, 0);
        l->next = h->loops;
        h->loops = l;
    }
    pthread_mutex_unlock(&h->loops_mu);
    if (!l) {
        idem__fail(IDEM_ENOMEM, "asynchronous call: no memory for the loop's state");
        return NULL;
    }
    last.h = h;
    last.loop = loop;
    last.l = l;
    last.gen = gen;
    return l;
}

void idem__loop_begin(struct idem__loop *l)
{
    atomic_fetch_add(&l->pending, 1);
}

void idem__loop_post(struct idem__loop *l, idem_loop_post *p)
{
    l->loop->ops->post(l->loop->loop, p);
    /* Posted before counted out: a detach that sees 0 finds every callback
     * in the loop's queue. */
    idem__loop_end(l);
}

void idem__loop_end(struct idem__loop *l)
{
    idem *h = l->h;
    if (atomic_fetch_sub(&l->pending, 1) == 1) {
        pthread_mutex_lock(&h->loops_mu);
        pthread_cond_broadcast(&h->loops_cv);
        pthread_mutex_unlock(&h->loops_mu);
    }
}

static void let_go(idem *h, struct idem__loop *l)
{
    atomic_fetch_add(&loops_gen, 1);
    if (h->kv_ops && h->kv_ops->loop_gone)
        h->kv_ops->loop_gone(h->kv, l);
    pthread_mutex_lock(&h->loops_mu);
    while (atomic_load(&l->pending) > 0)
        pthread_cond_wait(&h->loops_cv, &h->loops_mu);
    pthread_mutex_unlock(&h->loops_mu);
    idem__free(l);
}

IDEM_EXTERN void idem_loop_detach(idem *h, idem_loop *loop)
{
    if (!h || !loop)
        return;
    pthread_mutex_lock(&h->loops_mu);
    struct idem__loop **p = &h->loops;
    while (*p && (*p)->loop != loop)
        p = &(*p)->next;
    struct idem__loop *l = *p;
    if (l)
        *p = l->next;
    pthread_mutex_unlock(&h->loops_mu);
    if (l)
        let_go(h, l);
}

void idem__loops_gone(idem *h)
{
    if (!h->kv_ops || !h->kv_ops->loop_gone)
        return;
    pthread_mutex_lock(&h->loops_mu);
    struct idem__loop *l = h->loops;
    pthread_mutex_unlock(&h->loops_mu);
    /* The list only shrinks under a detach, which must not race a close. */
    for (; l; l = l->next)
        h->kv_ops->loop_gone(h->kv, l);
}

void idem__loops_free(idem *h)
{
    for (;;) {
        pthread_mutex_lock(&h->loops_mu);
        struct idem__loop *l = h->loops;
        if (l)
            h->loops = l->next;
        pthread_mutex_unlock(&h->loops_mu);
        if (!l)
            break;
        let_go(h, l);
    }
}
