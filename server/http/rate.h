/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rate.h — token buckets by name, in a table of a fixed size (daemon): how
 * often one subject or one client address may do something (issue a token
 * on the main listener, fail an API key on the admin one).
 */
#ifndef IDEM_SERVER_RATE_H
#define IDEM_SERVER_RATE_H

#include <stddef.h>
#include <stdint.h>

struct rate_table;

/* A table of about slots buckets (rounded up to a power of two). NULL when
 * out of memory. */
struct rate_table *rate_table_new(size_t slots);
void rate_table_free(struct rate_table *t);

/* Take one from the bucket of name[0..len): it holds up to burst, and
 * fills at rate per second. 0 when taken, else the milliseconds until one
 * is there (nothing taken). Any thread; a few hundred nanoseconds, whatever
 * the table holds. */
int64_t rate_take(struct rate_table *t, const char *name, size_t len, double rate, double burst,
                  int64_t now_us);

#endif
