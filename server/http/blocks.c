/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blocks.c — the memory of one HTTP message (see blocks.h).
 */
#include "http/blocks.h"

#include <stdlib.h>

struct http_block *blocks_first(void *mem, size_t cap)
{
    struct http_block *b = mem;
    *b = (struct http_block){.cap = cap};
    return b;
}

void *blocks_carve(struct http_block **head, size_t n, size_t align,
                   void *(*alloc)(void *, size_t))
{
    struct http_block *b = *head;
    size_t at = (b->used + align - 1) & ~(align - 1);
    if (at > b->cap || n > b->cap - at) {
        size_t cap = n > BLOCKS_NEXT_MIN ? n : BLOCKS_NEXT_MIN;
        if (cap > (size_t)-1 - sizeof *b)
            return NULL;
        struct http_block *fresh = alloc(NULL, sizeof *b + cap);
        if (!fresh)
            return NULL;
        *fresh = (struct http_block){.next = b, .cap = cap, .own = 1};
        *head = b = fresh;
        at = 0;
    }
    b->used = at + n;
    return b->data + at;
}

void blocks_free(struct http_block *head, int *body_inside)
{
    *body_inside = 0;
    for (struct http_block *b = head, *next; b; b = next) {
        next = b->next;
        *body_inside |= b->body;
        if (b->own)
            free(b);
    }
}
