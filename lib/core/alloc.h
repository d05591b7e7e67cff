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

#endif
