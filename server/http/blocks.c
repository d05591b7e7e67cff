/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blocks.c — the memory of one HTTP message (see blocks.h).
 */
#include "http/blocks.h"

#include <stdlib.h>
#include <string.h>

void *blocks_new(size_t size, size_t cap, struct http_block **first,
                 void *(*alloc)(void *, size_t))
{
    size_t at = (size + _Alignof(struct http_block) - 1) & ~(_Alignof(struct http_block) - 1);
    unsigned char *a = alloc(NULL, at + sizeof **first + cap);
    if (!a)
        return NULL;
    memset(a, 0, size);
    *first = (struct http_block *)(a + at);
    **first = (struct http_block){.cap = cap};
    return a;
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

int blocks_hold_body(const struct http_block *head)
{
    for (const struct http_block *b = head; b; b = b->next)
        if (b->body)
            return 1;
    return 0;
}

void blocks_free(struct http_block *head)
{
    for (struct http_block *b = head, *next; b; b = next) {
        next = b->next;
        if (b->own)
            free(b);
    }
}
