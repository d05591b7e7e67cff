/* SPDX-License-Identifier: Apache-2.0 */
/* stats.h — the durable-commit counters behind idem_stats, kept by each
 * store's writer (core layer). Not thread-safe: the writer keeps them under
 * the lock it already takes to publish a batch's results. */
#ifndef IDEM_CORE_STATS_H
#define IDEM_CORE_STATS_H

#include <stdint.h>

#include "idem.h"

struct idem__commit_stats {
    uint64_t commits, ops;
    uint64_t us;
    uint64_t hist[IDEM_COMMIT_BUCKETS];
    uint64_t batch_hist[IDEM_BATCH_BUCKETS]; /* by writes carried */
};

/* One durable transaction that carried ops writes and took us microseconds. */
void idem__commit_stats_add(struct idem__commit_stats *s, unsigned ops, int64_t us);

/* The figures of s in the public structs (any may be NULL). */
void idem__commit_stats_get(const struct idem__commit_stats *s, idem_stats *stats,
                            idem_commit_times *times, idem_commit_batches *batches);

#endif
