/* SPDX-License-Identifier: Apache-2.0 */
/*
 * background.c — one thread and its queue, for the daemon's jobs that must
 * block and are not the store's (background.h).
 */
#include "background.h"

#include <pthread.h>
#include <stdlib.h>

struct background {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *head, **tail;
    int stopping;
    pthread_t thread;
};

static void *background_main(void *arg)
{
    struct background *bg = arg;
    pthread_mutex_lock(&bg->mu);
    for (;;) {
        while (!bg->head && !bg->stopping)
            pthread_cond_wait(&bg->cv, &bg->mu);
        struct job *j = bg->head;
        if (!j)
            break;
        bg->head = j->next;
        if (!bg->head)
            bg->tail = &bg->head;
        pthread_mutex_unlock(&bg->mu);
        j->run(j);
        pthread_mutex_lock(&bg->mu);
    }
    pthread_mutex_unlock(&bg->mu);
    return NULL;
}

struct background *background_start(const char *name)
{
    struct background *bg = calloc(1, sizeof *bg);
    if (!bg)
        return NULL;
    pthread_mutex_init(&bg->mu, NULL);
    pthread_cond_init(&bg->cv, NULL);
    bg->tail = &bg->head;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    int rc = pthread_create(&bg->thread, &attr, background_main, bg);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_cond_destroy(&bg->cv);
        pthread_mutex_destroy(&bg->mu);
        free(bg);
        return NULL;
    }
    pthread_setname_np(bg->thread, name);
    return bg;
}

int background_submit(struct background *bg, struct job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&bg->mu);
    if (bg->stopping) {
        pthread_mutex_unlock(&bg->mu);
        return -1;
    }
    *bg->tail = j;
    bg->tail = &j->next;
    pthread_mutex_unlock(&bg->mu);
    pthread_cond_signal(&bg->cv);
    return 0;
}

void background_stop(struct background *bg)
{
    if (!bg)
        return;
    pthread_mutex_lock(&bg->mu);
    bg->stopping = 1;
    pthread_cond_broadcast(&bg->cv);
    pthread_mutex_unlock(&bg->mu);
    pthread_join(bg->thread, NULL);
    pthread_cond_destroy(&bg->cv);
    pthread_mutex_destroy(&bg->mu);
    free(bg);
}
