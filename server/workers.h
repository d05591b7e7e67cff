/*
 * workers.h — the threads that run request handlers.
 *
 * Handlers block: a record call waits for its group commit's fsync, an
 * upstream call for the upstream. The event loop never does; it hands each
 * complete request to a worker and goes on serving other connections.
 */
#ifndef IDEM_SERVER_WORKERS_H
#define IDEM_SERVER_WORKERS_H

struct workers;

struct work {
    struct work *next;
    void (*run)(struct work *w);
};

/* Start n threads. NULL on failure. */
struct workers *workers_start(int n);
/* Queue w; a worker calls w->run(w) once. 0, or -1 when stopping. */
int workers_submit(struct workers *ws, struct work *w);
/* Run everything queued, then stop and join the threads. NULL: no-op. */
void workers_stop(struct workers *ws);

#endif
