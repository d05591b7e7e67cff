/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pieces of Idem's tests: a clock the test can move, a temp dir,
 * a starting gun for concurrent threads, and the cmocka includes. */
#ifndef IDEM_TESTLIB_H
#define IDEM_TESTLIB_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "idem.h"

/* The test clock: the wall clock plus an offset the test advances. */
int64_t test_clock(void *arg);
void test_clock_advance(int64_t ms);
void test_clock_reset(void);

/* The monotonic clock in milliseconds: deadlines and elapsed times. */
int64_t test_mono_ms(void);

/* A fresh directory under $TMPDIR (or /tmp), removed by test_rmdir(). */
char *test_mkdtemp(void);
void test_rmdir(char *dir);

/* Run fn(arg, i) on n threads released at the same instant; returns after
 * all have finished. */
void test_run_threads(int n, void (*fn)(void *arg, int i), void *arg);

/* Empty the distributed store's servers (either may be NULL): FLUSHDB on
 * the Redis URL's database, and schema public dropped and made anew in the
 * PostgreSQL database. Only for servers the tests started themselves. */
void test_wipe_servers(const char *redis_url, const char *postgres_url);
/* One command, its words apart by spaces (at most 8), to the Redis at
 * redis_url; fails the test when it cannot be sent or Redis answers an
 * error. */
void test_redis_command(const char *redis_url, const char *command);

/* The number the query's first row's first column holds, on a libpq
 * connection (PGconn); fails the test when the query fails. */
struct pg_conn;
long test_pg_count(struct pg_conn *c, const char *sql);

/* Assert an idem call succeeded, printing the error and its detail if not. */
#define assert_idem_ok(call)                                                     \
    do {                                                                         \
        idem_rc rc_ = (call);                                                    \
        if (rc_ != IDEM_OK)                                                      \
            fail_msg("%s -> %s (%s): %s", #call, idem_errname(rc_),              \
                     idem_strerror(rc_), idem_errdetail());                      \
    } while (0)

#define assert_outcome(got, want)                                                \
    do {                                                                         \
        idem_outcome g_ = (got), w_ = (want);                                    \
        if (g_ != w_)                                                            \
            fail_msg("outcome %s, expected %s", idem_outcome_name(g_),           \
                     idem_outcome_name(w_));                                     \
    } while (0)

#endif
