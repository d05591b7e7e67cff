/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hint.h — whether a read that only hints is worth making now (core).
 *
 * Some reads answer early what a later write would answer anyway: a look
 * for a finished record before a begin, which pays off for a retry (its
 * answer without queueing behind writes) and costs a store call for a new
 * key, which the write then claims regardless. Such a read is taken while
 * it pays off. Each one that does not lengthens a run of the next ones
 * that are skipped (1, 2, 4 ... IDEM__HINT_SKIP_MAX); one that does ends
 * the run, so a storm of retries reads every time and fresh writes pay for
 * one read in IDEM__HINT_SKIP_MAX + 1 at most. A skipped read must be one
 * that may be skipped: its answer is never a decision, only a hint. Any
 * thread; relaxed atomics, since an off-by-one run costs one read.
 */
#ifndef IDEM_CORE_HINT_H
#define IDEM_CORE_HINT_H

#include <stdatomic.h>

#define IDEM__HINT_SKIP_MAX 64

struct idem__hint {
    atomic_int skip;   /* reads to skip before the next */
    atomic_int streak; /* the length of the run the last miss set */
};

/* 1: make the read now; 0: skip it. */
static inline int idem__hint_take(struct idem__hint *h)
{
    if (atomic_fetch_sub_explicit(&h->skip, 1, memory_order_relaxed) > 0)
        return 0;
    atomic_store_explicit(&h->skip, 0, memory_order_relaxed);
    return 1;
}

/* What a read made (or a write that answered what a read would have):
 * paid 1 when it found what it was for. */
static inline void idem__hint_paid(struct idem__hint *h, int paid)
{
    if (paid) {
        atomic_store_explicit(&h->streak, 0, memory_order_relaxed);
        atomic_store_explicit(&h->skip, 0, memory_order_relaxed);
        return;
    }
    int streak = atomic_load_explicit(&h->streak, memory_order_relaxed);
    streak = streak ? streak * 2 : 1;
    if (streak > IDEM__HINT_SKIP_MAX)
        streak = IDEM__HINT_SKIP_MAX;
    atomic_store_explicit(&h->streak, streak, memory_order_relaxed);
    atomic_store_explicit(&h->skip, streak, memory_order_relaxed);
}

#endif
