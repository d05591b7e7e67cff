/* SPDX-License-Identifier: Apache-2.0 */
/*
 * group_commit.c — the writer thread behind the durable store (store layer).
 *
 * Why a writer thread and not a lock around the connection: with
 * synchronous=FULL every commit waits for an fsync (milliseconds on real
 * disks). With a lock, 64 callers wait for 64 fsyncs in a row. Here the writer
 * takes its batches by the group-commit policy (commit_queue.h): the next
 * batch holds everything that arrived during the previous fsync, so under
 * load a batch grows until one fsync carries it, and latency stays about two
 * fsyncs. What arrives while the batch's own jobs run joins it too, up to
 * batch_max: only what arrives during its COMMIT waits for the next.
 *
 * A job's failure must not cost the others their writes, so each job runs in
 * a savepoint. A failed COMMIT fails every job of the batch: none of their
 * writes happened, and each caller is told so.
 *
 * A job may also be queued with a completion (on_done) instead of a waiting
 * caller: the writer calls on_done where it would have woken the caller, so
 * an event loop can have durable writes without a thread waiting on each.
 * Nothing on the writer thread may wait for a job (it would wait for
 * itself): an on_done queues its next job, never submits it.
 */
#include "group_commit.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/stats.h"
#include "core/str.h"

struct idem__gc {
    struct idem__cq q;
    struct idem__cq_item **batch; /* the writer's, q.batch_max of them */
    pthread_t thread;
    const struct idem__gc_driver *drv;
    void *ctx;
};

static struct idem__gc_job *job_at(struct idem__cq_item *it)
{
    return (struct idem__gc_job *)((char *)it - offsetof(struct idem__gc_job, item));
}

static void keep_detail(struct idem__gc_job *j)
{
    if (j->rc == IDEM_OK)
        j->detail[0] = '\0';
    else
        idem__copy(j->detail, sizeof j->detail, idem_errdetail());
}

/* One job in a savepoint of its own: a job that fails leaves no write. A
 * single_write job leaves none by itself (a statement that fails is undone
 * by the database), and runs without: two statements fewer per job. */
static idem_rc run_in_savepoint(struct idem__gc *gc, struct idem__gc_job *j)
{
    const struct idem__gc_driver *d = gc->drv;
    if (j->single_write)
        return j->run(j, gc->ctx);
    idem_rc rc = d->savepoint(gc->ctx);
    if (rc == IDEM_OK)
        rc = j->run(j, gc->ctx);
    if (rc == IDEM_OK)
        return d->release(gc->ctx);
    /* The job's error is the one to report, not what rolling back says
     * (when the database already rolled everything back, it has no
     * savepoint left to roll back to). */
    char detail[sizeof j->detail];
    idem__copy(detail, sizeof detail, idem_errdetail());
    d->rollback_to(gc->ctx);
    return idem__fail(rc, "%s", detail);
}

/* The batch's transaction is gone (the database rolled it back on an
 * error): every write of the batch so far went with it. */
static idem_rc transaction_lost(struct idem__gc_job *j)
{
    return idem__fail(IDEM_ESTORE, "the database rolled back the whole batch after an error "
                                   "(%s); nothing of it was written",
                      j->rc != IDEM_OK && j->detail[0] ? j->detail : "no detail");
}

static void run_batch(struct idem__gc *gc, unsigned n)
{
    const struct idem__gc_driver *d = gc->drv;
    struct idem__cq_item **batch = gc->batch;
    int64_t t0 = idem__mono_us();
    idem_rc rc = d->begin(gc->ctx);
    if (rc == IDEM_OK) {
        for (unsigned i = 0; i < n; i++) {
            struct idem__gc_job *j = job_at(batch[i]);
            idem__clear_detail();
            j->rc = run_in_savepoint(gc, j);
            keep_detail(j);
            /* Running on would write outside any transaction. */
            if (!d->in_transaction(gc->ctx)) {
                rc = transaction_lost(j);
                break;
            }
            /* Jobs queued while the batch's statements ran join it before
             * its COMMIT: they share its fsync instead of the next one's. */
            if (i + 1 == n)
                n += idem__cq_take_more(&gc->q, batch, n, 0);
        }
        if (rc == IDEM_OK) {
            idem__clear_detail();
            rc = d->commit(gc->ctx);
        }
    }
    if (rc != IDEM_OK) {
        d->rollback(gc->ctx);
        for (unsigned i = 0; i < n; i++) {
            struct idem__gc_job *j = job_at(batch[i]);
            j->rc = rc;
            keep_detail(j);
        }
    }
    if (rc == IDEM_OK)
        idem__cq_committed(&gc->q, n, idem__mono_us() - t0);
    /* Wake each caller alone, with no mutex held: a broadcast would wake
     * every waiting caller, and a wake under the mutex would have the caller
     * block on it at once. A job may be gone once its caller (or on_done)
     * runs. */
    for (unsigned i = 0; i < n; i++) {
        struct idem__gc_job *j = job_at(batch[i]);
        if (j->on_done)
            j->on_done(j);
        else
            sem_post(&j->done);
    }
    if (d->after_batch)
        d->after_batch(gc->ctx);
}

static void *writer(void *arg)
{
    struct idem__gc *gc = arg;
    unsigned n;
    while ((n = idem__cq_take(&gc->q, gc->batch)) > 0)
        run_batch(gc, n);
    return NULL;
}

idem_rc idem__gc_start(const struct idem__gc_driver *drv, void *ctx,
                       unsigned batch_max, struct idem__gc **out)
{
    struct idem__gc *gc = idem__calloc(1, sizeof *gc);
    if (!gc)
        return idem__fail(IDEM_ENOMEM, "group commit: allocating");
    batch_max = batch_max ? batch_max : 1;
    if (!(gc->batch = idem__calloc(batch_max, sizeof *gc->batch))) {
        idem__free(gc);
        return idem__fail(IDEM_ENOMEM, "group commit: allocating");
    }
    /* SQLite's batches are bounded by their count alone. */
    idem__cq_init(&gc->q, batch_max, SIZE_MAX);
    gc->drv = drv;
    gc->ctx = ctx;
    if (pthread_create(&gc->thread, NULL, writer, gc) != 0) {
        idem__cq_destroy(&gc->q);
        idem__free(gc->batch);
        idem__free(gc);
        return idem__fail(IDEM_ENOMEM, "group commit: cannot start the writer thread");
    }
    pthread_setname_np(gc->thread, "idem-writer"); /* for top -H, perf, gdb */
    *out = gc;
    return IDEM_OK;
}

idem_rc idem__gc_queue(struct idem__gc *gc, struct idem__gc_job *job)
{
    job->detail[0] = '\0';
    job->item.bytes = 0;
    return idem__cq_push(&gc->q, &job->item);
}

idem_rc idem__gc_submit(struct idem__gc *gc, struct idem__gc_job *job)
{
    job->on_done = NULL;
    if (idem__gc_on_writer(gc))
        return idem__fail(IDEM_EINVAL, "the store's writer thread called the store and "
                                       "would wait for itself; it must not");
    sem_init(&job->done, 0, 0);
    idem_rc rc = idem__gc_queue(gc, job);
    if (rc != IDEM_OK) {
        sem_destroy(&job->done);
        return rc;
    }
    while (sem_wait(&job->done) != 0)
        ; /* EINTR */
    sem_destroy(&job->done);
    if (job->rc != IDEM_OK)
        return idem__fail(job->rc, "%s", job->detail);
    return IDEM_OK;
}

int idem__gc_on_writer(struct idem__gc *gc)
{
    /* gc->thread was set before any job could reach the writer: jobs are
     * handed over under the queue's mutex, after idem__gc_start() returned. */
    return pthread_equal(pthread_self(), gc->thread) != 0;
}

void idem__gc_stop(struct idem__gc *gc)
{
    if (!gc)
        return;
    /* From now on nothing new is queued; the writer leaves only once the
     * queue is empty, so every job already queued has run and been answered
     * (its caller woken or its on_done called) when the join returns. */
    idem__cq_stop(&gc->q);
    pthread_join(gc->thread, NULL);
    idem__cq_destroy(&gc->q);
    idem__free(gc->batch);
    idem__free(gc);
}

void idem__gc_stats(struct idem__gc *gc, idem_stats *stats, idem_commit_times *times,
                    idem_commit_batches *batches)
{
    idem__cq_stats(&gc->q, stats, times, batches);
}
