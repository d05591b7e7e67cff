/* SPDX-License-Identifier: Apache-2.0 */
/*
 * idem/loop.h — the event loop Idem's asynchronous calls run on.
 *
 * Idem does not bring a loop of its own: the caller hands it theirs,
 * described by a small table of operations (an adapter), as hiredis's
 * adapters do. include/idem/libevent.h is the adapter for libevent; one for
 * another loop fills the same table.
 *
 * The rule of every asynchronous call (those ending in _async, which take
 * an idem_loop and a callback), as libuv's:
 *
 *   - if the call returns an error, the callback never runs, and the error's
 *     detail is the thread's idem_errdetail(), as for any call;
 *   - if it returns IDEM_OK, the callback runs exactly once, on the loop's
 *     thread, never before the call has returned — also when the handle is
 *     closed first (it then reports IDEM_ECLOSING, or what the store said);
 *   - the callback receives the call's result and its error detail as
 *     arguments; the detail is valid during the callback only.
 *
 * A loop given to an asynchronous call is the handle's until
 * idem_loop_detach() (idem.h) lets it go: detach it, on its thread, before
 * the loop itself goes away.
 */
#ifndef IDEM_LOOP_H
#define IDEM_LOOP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IDEM_LOOP_OPS_VERSION 1

/* What an fd is watched for, and what it was found ready for. */
#define IDEM_LOOP_READ 1u
#define IDEM_LOOP_WRITE 2u

typedef void (*idem_loop_fn)(void *arg);
typedef void (*idem_loop_io_fn)(void *arg, unsigned ready);

/* A function for the loop to run on its thread, queued from any thread.
 * The storage is the poster's, and the loop's from post() until fn runs. */
typedef struct idem_loop_post {
    struct idem_loop_post *next; /* the loop's own */
    idem_loop_fn fn;
    void *arg;
} idem_loop_post;

struct idem_loop_ops {
    unsigned version; /* IDEM_LOOP_OPS_VERSION */

    /* Watch fd, for nothing yet: ready(arg, what) runs on the loop's thread
     * when fd is ready for what it is set to wait for. NULL on failure. */
    void *(*io_new)(void *loop, int fd, idem_loop_io_fn ready, void *arg);
    /* Wait for IDEM_LOOP_READ, IDEM_LOOP_WRITE, both, or (0) nothing. 0, or
     * -1 on failure. */
    int (*io_want)(void *io, unsigned what);
    void (*io_free)(void *io);

    /* A timer, not set: fire(arg) runs on the loop's thread when it goes
     * off. NULL on failure. */
    void *(*timer_new)(void *loop, idem_loop_fn fire, void *arg);
    /* Go off once, ms milliseconds from now (replacing any earlier setting);
     * ms < 0 stops it. 0, or -1 on failure. */
    int (*timer_set)(void *timer, int64_t ms);
    void (*timer_free)(void *timer);

    /* Run p->fn(p->arg) on the loop's thread soon, in the order posted.
     * Any thread; never fails, never runs fn before it returns. */
    void (*post)(void *loop, idem_loop_post *p);
};

/* A loop as Idem sees it: the adapter's operations and its own pointer. */
typedef struct idem_loop {
    const struct idem_loop_ops *ops;
    void *loop;
} idem_loop;

#ifdef __cplusplus
}
#endif

#endif
