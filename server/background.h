/* SPDX-License-Identifier: Apache-2.0 */
/*
 * background.h — the daemon's one thread for what must block and is not
 * the store's (background.c), as redis's bio.c: a reload's file reads,
 * certificate loads and DNS lookups. Requests never wait on it; the event
 * loops hand it a job and go on.
 */
#ifndef IDEM_SERVER_BACKGROUND_H
#define IDEM_SERVER_BACKGROUND_H

struct background;

struct job {
    struct job *next;
    void (*run)(struct job *j);
};

/* Start the thread, named name (at most 15 bytes: top -H, perf, gdb). NULL
 * on failure. */
struct background *background_start(const char *name);
/* Queue j; the thread calls j->run(j) once, in the order queued. 0, or -1
 * when stopping (nothing runs). Any thread. */
int background_submit(struct background *bg, struct job *j);
/* Run everything queued, then stop and join the thread. NULL: no-op. */
void background_stop(struct background *bg);

#endif
