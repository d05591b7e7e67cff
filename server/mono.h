/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mono.h — the daemon's clocks: the library's CLOCK_MONOTONIC in
 * milliseconds (or microseconds) for deadlines, timers and durations, the
 * wall clock for comparing with the store's times, and a duration as
 * libevent's struct timeval (daemon).
 */
#ifndef IDEM_SERVER_MONO_H
#define IDEM_SERVER_MONO_H

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

#include "core/clock.h"

/* The library's monotonic clock (lib/core/clock.h), under the daemon's
 * names: one clock for every deadline and duration in the process. */
static inline int64_t mono_ms(void)
{
    return idem__mono_ms();
}

static inline int64_t mono_us(void)
{
    return idem__mono_us();
}

/* The wall clock in milliseconds, as the store's times are kept. */
static inline int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ms (negative: 0) as a struct timeval. */
static inline struct timeval ms_timeval(int64_t ms)
{
    if (ms < 0)
        ms = 0;
    return (struct timeval){.tv_sec = (time_t)(ms / 1000),
                            .tv_usec = (suseconds_t)(ms % 1000) * 1000};
}

#endif
