/* SPDX-License-Identifier: Apache-2.0 */
/* The allocator every Idem allocation goes through, replaceable with
 * idem_set_allocator() so tests can fail the n-th allocation. */
#ifndef IDEM_CORE_ALLOC_H
#define IDEM_CORE_ALLOC_H

#include <stddef.h>

void *idem__malloc(size_t n);
void *idem__calloc(size_t count, size_t size);
void idem__free(void *p);
/* A copy of len bytes of s plus a NUL. */
char *idem__strndup(const char *s, size_t len);

/* Blocks of one size kept by the thread that frees them, for the next
 * idem__pool_get of that size on it: an asynchronous call is one block of
 * a fixed size per call, made and freed on the caller's loop, and a block
 * above glibc's per-thread cache (1 KiB) costs its allocator's slow path
 * each time. Up to POOL_SIZES sizes, POOL_KEPT blocks each, per thread;
 * freed when the thread exits. A block from idem__pool_get goes back with
 * idem__pool_put and the same size (or idem__free). */
void *idem__pool_get(size_t size);
void idem__pool_put(void *p, size_t size);

#endif
