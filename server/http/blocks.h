/* SPDX-License-Identifier: Apache-2.0 */
/*
 * blocks.h — the memory of one HTTP message (a request or answer parsed, an
 * answer built): its strings, its header array and a small body carved
 * front to back from a few blocks, so that a typical message costs one
 * allocation instead of one per field. The first block comes inside the
 * message's own allocation; a piece that does not fit opens a new block,
 * at least BLOCKS_NEXT_MIN bytes or as large as the piece. Blocks never
 * move, so a pointer into one stays valid until the message is freed;
 * nothing is freed on its own before that.
 */
#ifndef IDEM_SERVER_HTTP_BLOCKS_H
#define IDEM_SERVER_HTTP_BLOCKS_H

#include <stddef.h>

#define BLOCKS_NEXT_MIN 2048

struct http_block {
    struct http_block *next; /* the one opened before */
    size_t used, cap;
    unsigned own : 1;  /* an allocation of its own (not the first) */
    unsigned body : 1; /* holds its message's body */
    _Alignas(max_align_t) unsigned char data[];
};

/* A message of size bytes, zeroed, and its first block of cap bytes after
 * it, in one allocation made with alloc (realloc's contract); *first is
 * the block. free() the message when its blocks are freed. NULL when the
 * allocation fails. */
void *blocks_new(size_t size, size_t cap, struct http_block **first,
                 void *(*alloc)(void *, size_t));

/* n bytes aligned to align (a power of two), from *head, opening a block
 * with alloc (realloc's contract) when they do not fit; NULL when that
 * fails. */
void *blocks_carve(struct http_block **head, size_t n, size_t align,
                   void *(*alloc)(void *, size_t));

/* Whether one of the blocks holds the message's body (body set on it). */
int blocks_hold_body(const struct http_block *head);

/* Free the blocks opened after the first. */
void blocks_free(struct http_block *head);

#endif
