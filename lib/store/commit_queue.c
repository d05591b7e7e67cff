/* SPDX-License-Identifier: Apache-2.0 */
/*
 * commit_queue.c — the queue every durable store's writers take their
 * batches from (store layer); the policy is drawn in commit_queue.h.
 */
#include "commit_queue.h"

#include <string.h>

#include "core/error.h"

void idem__cq_init(struct idem__cq *q, unsigned batch_max, size_t bytes_max)
{
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work, NULL);
    q->head = NULL;
    q->tail = &q->head;
    q->seq = 0;
    q->stopping = 0;
    q->batch_max = batch_max ? batch_max : 1;
    q->bytes_max = bytes_max;
    memset(&q->stats, 0, sizeof q->stats);
}

void idem__cq_destroy(struct idem__cq *q)
{
    pthread_cond_destroy(&q->work);
    pthread_mutex_destroy(&q->mu);
}

idem_rc idem__cq_push(struct idem__cq *q, struct idem__cq_item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        return idem__fail(IDEM_ECLOSING, "the handle is closing");
    }
    it->seq = q->seq++;
    *q->tail = it;
    q->tail = &it->next;
    pthread_mutex_unlock(&q->mu);
    pthread_cond_signal(&q->work);
    return IDEM_OK;
}

/* Under q->mu: off the head, while within the limits. */
static unsigned take_locked(struct idem__cq *q, struct idem__cq_item **out, unsigned n,
                            size_t bytes)
{
    unsigned took = 0;
    while (q->head && n < q->batch_max &&
           (n == 0 || bytes + q->head->bytes <= q->bytes_max)) {
        struct idem__cq_item *it = q->head;
        q->head = it->next;
        it->next = NULL;
        bytes += it->bytes;
        out[n++] = it;
        took++;
    }
    if (!q->head)
        q->tail = &q->head;
    return took;
}

unsigned idem__cq_take(struct idem__cq *q, struct idem__cq_item **out)
{
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->stopping)
        pthread_cond_wait(&q->work, &q->mu);
    unsigned n = take_locked(q, out, 0, 0);
    pthread_mutex_unlock(&q->mu);
    return n;
}

unsigned idem__cq_take_more(struct idem__cq *q, struct idem__cq_item **out, unsigned n,
                            size_t bytes)
{
    if (n >= q->batch_max)
        return 0;
    pthread_mutex_lock(&q->mu);
    unsigned took = take_locked(q, out, n, bytes);
    pthread_mutex_unlock(&q->mu);
    return took;
}

void idem__cq_stop(struct idem__cq *q)
{
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    pthread_cond_broadcast(&q->work);
    pthread_mutex_unlock(&q->mu);
}

void idem__cq_committed(struct idem__cq *q, unsigned ops, int64_t us)
{
    pthread_mutex_lock(&q->mu);
    idem__commit_stats_add(&q->stats, ops, us);
    pthread_mutex_unlock(&q->mu);
}

void idem__cq_stats(struct idem__cq *q, idem_stats *stats, idem_commit_times *times,
                    idem_commit_batches *batches)
{
    pthread_mutex_lock(&q->mu);
    idem__commit_stats_get(&q->stats, stats, times, batches);
    pthread_mutex_unlock(&q->mu);
}
