/* SPDX-License-Identifier: Apache-2.0 */
/*
 * incidents.c — the ring of the last incidents (incidents.h): one per
 * process, as there is one daemon per process, written by the gateway's
 * loops and read by the admin side, under one mutex held for a copy.
 */
#include "telemetry/incidents.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static struct {
    pthread_mutex_t mu;
    struct incident ring[INCIDENTS_MAX];
    uint64_t noted; /* ring[(noted - 1) % INCIDENTS_MAX] is the newest */
} incidents = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const kind_names[] = {
    [INCIDENT_IN_FLIGHT_409] = "in_flight_409",
    [INCIDENT_MISMATCH_422] = "mismatch_422",
    [INCIDENT_TAKEOVER] = "takeover",
    [INCIDENT_HELD] = "held",
    [INCIDENT_TRANSITION_CONFLICT] = "transition_conflict",
};

const char *incident_kind_name(enum incident_kind kind)
{
    return kind_names[kind];
}

void incidents_note(enum incident_kind kind, const struct route *rt, const char *key,
                    uint64_t epoch)
{
    incidents_note_why(kind, rt, key, epoch, NULL);
}

void incidents_why(enum incident_kind kind, const char *space, const char *key, uint64_t epoch,
                   char *why, size_t cap)
{
    why[0] = '\0';
    pthread_mutex_lock(&incidents.mu);
    for (uint64_t n = 0; n < incidents.noted && n < INCIDENTS_MAX; n++) {
        const struct incident *e = &incidents.ring[(incidents.noted - 1 - n) % INCIDENTS_MAX];
        if (e->kind == kind && e->epoch == epoch && strcmp(e->key, key) == 0 &&
            strcmp(e->space, space) == 0) {
            snprintf(why, cap, "%s", e->why);
            break;
        }
    }
    pthread_mutex_unlock(&incidents.mu);
}

void incidents_note_why(enum incident_kind kind, const struct route *rt, const char *key,
                        uint64_t epoch, const char *why)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&incidents.mu);
    struct incident *e = &incidents.ring[incidents.noted++ % INCIDENTS_MAX];
    e->time_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    e->kind = kind;
    snprintf(e->route, sizeof e->route, "%s", rt ? rt->name : "");
    snprintf(e->space, sizeof e->space, "%s", rt ? rt->space : "");
    snprintf(e->key, sizeof e->key, "%s", key ? key : "");
    e->epoch = epoch;
    snprintf(e->why, sizeof e->why, "%s", why ? why : "");
    pthread_mutex_unlock(&incidents.mu);
}

size_t incidents_newest(struct incident *out, size_t max, uint64_t *noted)
{
    size_t n = 0;
    pthread_mutex_lock(&incidents.mu);
    *noted = incidents.noted;
    for (; n < max && n < incidents.noted && n < INCIDENTS_MAX; n++)
        out[n] = incidents.ring[(incidents.noted - 1 - n) % INCIDENTS_MAX];
    pthread_mutex_unlock(&incidents.mu);
    return n;
}
