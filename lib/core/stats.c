/* SPDX-License-Identifier: Apache-2.0 */
/* stats.c — the durable-commit counters behind idem_stats (core layer). */
#include "stats.h"

#include <string.h>

/* Upper bounds of the buckets but the last, in microseconds. */
static const uint64_t bounds_us[IDEM_COMMIT_BUCKETS - 1] = {
    100,   250,    500,    1000,   2500,    5000,    10000,    25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 10000000,
};

IDEM_EXTERN uint64_t idem_commit_bucket_us(unsigned i)
{
    return i < IDEM_COMMIT_BUCKETS - 1 ? bounds_us[i] : UINT64_MAX;
}

IDEM_EXTERN uint64_t idem_commit_batch_bound(unsigned i)
{
    return i < IDEM_BATCH_BUCKETS - 1 ? (uint64_t)1 << i : UINT64_MAX;
}

void idem__commit_stats_add(struct idem__commit_stats *s, unsigned ops, int64_t us)
{
    uint64_t u = us > 0 ? (uint64_t)us : 0;
    unsigned b = 0;
    while (b < IDEM_COMMIT_BUCKETS - 1 && u > bounds_us[b])
        b++;
    s->commits++;
    s->ops += ops;
    s->us += u;
    s->hist[b]++;
    b = 0;
    while (b < IDEM_BATCH_BUCKETS - 1 && ops > idem_commit_batch_bound(b))
        b++;
    s->batch_hist[b]++;
}

void idem__commit_stats_get(const struct idem__commit_stats *s, idem_stats *stats,
                            idem_commit_times *times, idem_commit_batches *batches)
{
    if (stats) {
        stats->commits = s->commits;
        stats->committed_ops = s->ops;
    }
    if (times) {
        times->commits = s->commits;
        times->us = s->us;
        memcpy(times->hist, s->hist, sizeof times->hist);
    }
    if (batches) {
        batches->commits = s->commits;
        batches->ops = s->ops;
        memcpy(batches->hist, s->batch_hist, sizeof batches->hist);
    }
}
