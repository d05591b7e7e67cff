/* SPDX-License-Identifier: Apache-2.0 */
/* clock.h — the monotonic clock, for deadlines and schedules (core layer).
 * Stored instants (leases, TTLs) use the handle's clock instead: see store.h. */
#ifndef IDEM_CORE_CLOCK_H
#define IDEM_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds on CLOCK_MONOTONIC. */
static inline int64_t idem__mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Microseconds on CLOCK_MONOTONIC. */
static inline int64_t idem__mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* CLOCK_MONOTONIC ms from now, for pthread_cond_timedwait (on a condition
 * set to that clock) and sem_clockwait. */
static inline struct timespec idem__mono_after(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

#endif
