/* SPDX-License-Identifier: Apache-2.0 */
/* The replaceable allocator (core layer). Like hiredis's alloc.h: a table of
 * function pointers, read on every call, set once before handles open. */
#include "alloc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"

static void *(*malloc_fn)(size_t) = malloc;
static void (*free_fn)(void *) = free;

IDEM_EXTERN void idem_set_allocator(void *(*m)(size_t), void *(*r)(void *, size_t),
                                    void (*f)(void *))
{
    (void)r; /* Idem never grows a block in place; kept for callers' symmetry */
    malloc_fn = m ? m : malloc;
    free_fn = f ? f : free;
}

void *idem__malloc(size_t n)
{
    return malloc_fn(n ? n : 1);
}

void *idem__calloc(size_t count, size_t size)
{
    if (size && count > (size_t)-1 / size)
        return NULL;
    void *p = idem__malloc(count * size);
    if (p)
        memset(p, 0, count * size);
    return p;
}

void idem__free(void *p)
{
    if (p)
        free_fn(p);
}

/* ---- per-thread pools ---- */

#define POOL_SIZES 4
#define POOL_KEPT 64

struct pool {
    size_t size;   /* 0: unused */
    void *head;    /* each block's first bytes: the next one */
    unsigned kept;
};

static _Thread_local struct pool pools[POOL_SIZES];
static pthread_key_t pool_key;
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;

/* At a thread's exit: what it kept goes. */
static void pools_free(void *arg)
{
    struct pool *ps = arg;
    for (int i = 0; i < POOL_SIZES; i++)
        while (ps[i].head) {
            void *p = ps[i].head;
            ps[i].head = *(void **)p;
            idem__free(p);
        }
}

static void pool_key_make(void)
{
    (void)pthread_key_create(&pool_key, pools_free);
}

void *idem__pool_get(size_t size)
{
    for (int i = 0; i < POOL_SIZES; i++) {
        struct pool *p = &pools[i];
        if (p->size == size && p->head) {
            void *b = p->head;
            p->head = *(void **)b;
            p->kept--;
            return b;
        }
    }
    return idem__malloc(size < sizeof(void *) ? sizeof(void *) : size);
}

void idem__pool_put(void *b, size_t size)
{
    if (!b)
        return;
    struct pool *p = NULL;
    for (int i = 0; i < POOL_SIZES && !p; i++)
        if (pools[i].size == size)
            p = &pools[i];
    for (int i = 0; i < POOL_SIZES && !p; i++)
        if (pools[i].size == 0) {
            pthread_once(&pool_once, pool_key_make);
            pthread_setspecific(pool_key, pools); /* so that its exit frees them */
            p = &pools[i];
            p->size = size;
        }
    if (!p || p->kept >= POOL_KEPT) {
        idem__free(b);
        return;
    }
    *(void **)b = p->head;
    p->head = b;
    p->kept++;
}

char *idem__strndup(const char *s, size_t len)
{
    char *p = idem__malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}
