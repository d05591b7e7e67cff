/* SPDX-License-Identifier: Apache-2.0 */
/*
 * commit_queue.h — the group-commit policy, once, for the writers of both
 * durable stores (group_commit.c, SQLite's; postgres.c, PostgreSQL's).
 *
 * Callers queue writes and hear of each only once the batch that carried
 * it is durable (or failed). A writer takes every write queued — at most
 * batch_max of them and bytes_max of payload, at least one — as one
 * transaction: under load a batch grows until one commit carries it, and N
 * concurrent writers pay for about one commit, not N. What is queued while
 * a batch runs waits for the next one, unless its writer can still take it
 * before its commit (idem__cq_take_more). Any number of writers take from
 * one queue. Once stopping, nothing new is queued and writers leave only
 * with the queue empty, so every write queued is answered.
 */
#ifndef IDEM_STORE_COMMIT_QUEUE_H
#define IDEM_STORE_COMMIT_QUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "core/stats.h"
#include "idem.h"

/* A queued write; the store's job embeds it. */
struct idem__cq_item {
    struct idem__cq_item *next;
    size_t bytes; /* its payload, counted against bytes_max */
    uint64_t seq; /* the order of arrival, set when queued */
};

struct idem__cq {
    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t work;
    struct idem__cq_item *head, **tail;
    uint64_t seq;
    int stopping;
    unsigned batch_max;
    size_t bytes_max;
    struct idem__commit_stats stats;
};

void idem__cq_init(struct idem__cq *q, unsigned batch_max, size_t bytes_max);
void idem__cq_destroy(struct idem__cq *q);

/* Queue it: IDEM_OK, or IDEM_ECLOSING once stopping (and it is not). */
idem_rc idem__cq_push(struct idem__cq *q, struct idem__cq_item *it);

/* A writer's next batch into out (room for batch_max): waits for a write,
 * or the stop; returns how many it took, 0 when stopping with none left. */
unsigned idem__cq_take(struct idem__cq *q, struct idem__cq_item **out);

/* Late joiners: without waiting, take more into out[n...] while the batch
 * (n writes, bytes of payload) stays within the limits; how many. */
unsigned idem__cq_take_more(struct idem__cq *q, struct idem__cq_item **out, unsigned n,
                            size_t bytes);

/* Refuse new writes and wake every writer waiting. */
void idem__cq_stop(struct idem__cq *q);

/* A durable commit of ops writes that took us microseconds. */
void idem__cq_committed(struct idem__cq *q, unsigned ops, int64_t us);
void idem__cq_stats(struct idem__cq *q, idem_stats *stats, idem_commit_times *times,
                    idem_commit_batches *batches);

#endif
