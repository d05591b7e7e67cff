/* SPDX-License-Identifier: Apache-2.0 */
/*
 * group_commit.h — many callers, one transaction, one fsync.
 *
 * Callers submit jobs and block, or queue them with a completion callback.
 * One writer thread takes every job waiting (up to a batch limit), opens one
 * transaction, runs each job inside its own savepoint (a job that fails rolls
 * back alone), commits once, and only then wakes the batch's callers or calls
 * their completions. A caller therefore learns of its write only after it is
 * durable, and N concurrent callers pay for about one fsync, not N.
 */
#ifndef IDEM_STORE_GROUP_COMMIT_H
#define IDEM_STORE_GROUP_COMMIT_H

#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>

#include "commit_queue.h"
#include "idem.h"

struct idem__gc_job {
    struct idem__cq_item item; /* on the writer's queue (commit_queue.h) */
    /* Runs on the writer thread inside the batch's transaction. */
    idem_rc (*run)(struct idem__gc_job *job, void *ctx);
    /* Queued jobs only: called on the writer thread, once, after the batch is
     * durable or failed, with rc and detail set ("" when rc is IDEM_OK); it
     * may free the job. Submitted jobs have none: their caller waits on done. */
    void (*on_done)(struct idem__gc_job *job);
    /* Set by the job's maker: the job writes with one single-row statement
     * at most, and fails only when that statement wrote nothing (the
     * database undoes a single-row statement that fails, or rolls the whole
     * transaction back, which the writer sees). It needs no savepoint of its
     * own then. */
    int single_write;
    idem_rc rc;
    sem_t done;          /* posted once the job's batch is durable or failed */
    char detail[160];    /* the error detail, carried back to the caller */
};

/* How the writer drives the database: each returns IDEM_OK or an error. */
struct idem__gc_driver {
    idem_rc (*begin)(void *ctx);     /* open the batch's transaction */
    idem_rc (*commit)(void *ctx);    /* make it durable */
    void (*rollback)(void *ctx);     /* abandon it */
    idem_rc (*savepoint)(void *ctx); /* before each job (savepoints nest) */
    idem_rc (*release)(void *ctx);   /* after a job that succeeded */
    void (*rollback_to)(void *ctx);  /* after a job that failed */
    /* 1 while the batch's transaction is open. The database may roll it
     * back by itself on some errors (SQLite: disk full, I/O error), taking
     * every job's write with it: the batch then fails as a whole. */
    int (*in_transaction)(void *ctx);
    /* Optional: on the writer, after each batch's callers are answered,
     * outside any transaction: upkeep that no caller should wait for. */
    void (*after_batch)(void *ctx);
};

struct idem__gc;

idem_rc idem__gc_start(const struct idem__gc_driver *drv, void *ctx,
                       unsigned batch_max, struct idem__gc **out);
/* Run the job in the next batch and wait until that batch is durable (or
 * failed). Returns job->rc and sets the caller's error detail from it.
 * Called on the writer thread (a job's code, an on_done), it would wait for
 * the writer itself: it fails with IDEM_EINVAL. */
idem_rc idem__gc_submit(struct idem__gc *gc, struct idem__gc_job *job);
/* Queue a job and return without waiting: its on_done runs exactly once, on
 * the writer thread, after the job's batch; the job must stay valid until
 * then. IDEM_ECLOSING once the writer is stopping (then on_done never runs).
 * A job queued while a batch's jobs run, from any thread, the writer's own
 * included, may join that batch, after them. (idem__gc_submit queues
 * through here, with no on_done, and waits.) */
idem_rc idem__gc_queue(struct idem__gc *gc, struct idem__gc_job *job);
/* 1 on the writer thread itself. */
int idem__gc_on_writer(struct idem__gc *gc);
/* Finish every submitted and queued job (calling their on_done), stop the
 * writer, free. NULL is a no-op. */
void idem__gc_stop(struct idem__gc *gc);
/* Durable commits so far, their writes, their durations and sizes (any
 * may be NULL). */
void idem__gc_stats(struct idem__gc *gc, idem_stats *stats, idem_commit_times *times,
                    idem_commit_batches *batches);

#endif
