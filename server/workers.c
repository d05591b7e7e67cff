/* workers.c — a fixed pool of threads for blocking calls, fed by one queue (daemon). */
#include "workers.h"

#include <pthread.h>
#include <stdlib.h>

struct workers {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct work *head, **tail;
    int stopping;
    int n;
    pthread_t threads[];
};

static void *worker_main(void *arg)
{
    struct workers *ws = arg;
    pthread_mutex_lock(&ws->mu);
    for (;;) {
        while (!ws->head && !ws->stopping)
            pthread_cond_wait(&ws->cv, &ws->mu);
        struct work *w = ws->head;
        if (!w)
            break;
        ws->head = w->next;
        if (!ws->head)
            ws->tail = &ws->head;
        pthread_mutex_unlock(&ws->mu);
        w->run(w);
        pthread_mutex_lock(&ws->mu);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

struct workers *workers_start(int n, const char *name)
{
    struct workers *ws = calloc(1, sizeof *ws + (size_t)n * sizeof(pthread_t));
    if (!ws)
        return NULL;
    pthread_mutex_init(&ws->mu, NULL);
    pthread_cond_init(&ws->cv, NULL);
    ws->tail = &ws->head;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    for (; ws->n < n; ws->n++) {
        if (pthread_create(&ws->threads[ws->n], &attr, worker_main, ws) != 0)
            break;
        pthread_setname_np(ws->threads[ws->n], name); /* for top -H, perf, gdb */
    }
    pthread_attr_destroy(&attr);
    if (ws->n < n) {
        workers_stop(ws);
        return NULL;
    }
    return ws;
}

int workers_submit(struct workers *ws, struct work *w)
{
    w->next = NULL;
    pthread_mutex_lock(&ws->mu);
    if (ws->stopping) {
        pthread_mutex_unlock(&ws->mu);
        return -1;
    }
    *ws->tail = w;
    ws->tail = &w->next;
    pthread_mutex_unlock(&ws->mu);
    /* After the unlock: a worker woken while we still held the mutex would
     * only block on it again. */
    pthread_cond_signal(&ws->cv);
    return 0;
}

void workers_stop(struct workers *ws)
{
    if (!ws)
        return;
    pthread_mutex_lock(&ws->mu);
    ws->stopping = 1;
    pthread_cond_broadcast(&ws->cv);
    pthread_mutex_unlock(&ws->mu);
    for (int i = 0; i < ws->n; i++)
        pthread_join(ws->threads[i], NULL);
    pthread_cond_destroy(&ws->cv);
    pthread_mutex_destroy(&ws->mu);
    free(ws);
}
