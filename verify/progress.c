/* SPDX-License-Identifier: Apache-2.0 */
/*
 * progress.c — a thread redraws one line on stderr ten times a second:
 * which scenario runs and how many of its requests are done. The request
 * threads only bump an atomic counter, so drawing never slows the storm.
 */
#include "progress.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BAR_WIDTH 30

static struct {
    int running;
    int stop;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char name[32];
    long total;
    atomic_long done;
} bar = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void draw(void)
{
    long done = atomic_load(&bar.done), total = bar.total;
    char cells[BAR_WIDTH + 1];
    int full = total > 0 ? (int)(done * BAR_WIDTH / total) : 0;
    if (full > BAR_WIDTH)
        full = BAR_WIDTH;
    memset(cells, '#', (size_t)full);
    memset(cells + full, '.', (size_t)(BAR_WIDTH - full));
    cells[BAR_WIDTH] = '\0';
    if (bar.name[0])
        fprintf(stderr, "\r  %-20s [%s] %ld/%ld\033[K", bar.name, cells, done, total);
    fflush(stderr);
}

static void *draw_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&bar.mu);
    while (!bar.stop) {
        draw();
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&bar.cv, &bar.mu, &ts);
    }
    fprintf(stderr, "\r\033[K");
    fflush(stderr);
    pthread_mutex_unlock(&bar.mu);
    return NULL;
}

void progress_start(int enabled)
{
    if (!enabled || !isatty(2) || bar.running)
        return;
    bar.stop = 0;
    bar.running = pthread_create(&bar.thread, NULL, draw_main, NULL) == 0;
}

void progress_scenario(const char *name, long total)
{
    pthread_mutex_lock(&bar.mu);
    snprintf(bar.name, sizeof bar.name, "%s", name);
    bar.total = total;
    atomic_store(&bar.done, 0);
    pthread_mutex_unlock(&bar.mu);
}

void progress_tick(void *unused)
{
    (void)unused;
    atomic_fetch_add(&bar.done, 1);
}

void progress_stop(void)
{
    if (!bar.running)
        return;
    pthread_mutex_lock(&bar.mu);
    bar.stop = 1;
    pthread_cond_signal(&bar.cv);
    pthread_mutex_unlock(&bar.mu);
    pthread_join(bar.thread, NULL);
    bar.running = 0;
}
