/*
 * workers.h — the threads that run what blocks.
 *
 * The event loops never block. What must — the JSON API's calls, and every
 * store call on the distributed store, which waits on Redis or PostgreSQL —
 * runs here (front_work), and the request goes back to its loop after.
 */
#ifndef IDEM_SERVER_WORKERS_H
#define IDEM_SERVER_WORKERS_H

struct workers;

struct work {
    struct work *next;
    void (*run)(struct work *w);
};

/* Start n threads, each named name (at most 15 bytes: top -H, perf, gdb).
 * NULL on failure. */
struct workers *workers_start(int n, const char *name);
/* Queue w; a worker calls w->run(w) once. 0, or -1 when stopping. */
int workers_submit(struct workers *ws, struct work *w);
/* Run everything queued, then stop and join the threads. NULL: no-op. */
void workers_stop(struct workers *ws);

#endif
