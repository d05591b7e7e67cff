/* The replaceable allocator (core layer). Like hiredis's alloc.h: a table of
 * function pointers, read on every call, set once before handles open. */
#include "alloc.h"

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

char *idem__strndup(const char *s, size_t len)
{
    char *p = idem__malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}
