/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox_tx.h — what the inbox with attempts in the caller's own database
 * (idem_inbox_attempt_*, _settle_*, _purge_*) shares between SQLite
 * (inbox_sqlite.c) and PostgreSQL (inbox_pg.c): the checks of the
 * arguments, the statements, and what a row's state answers (inbox layer).
 *
 * The table idem_inbox_msg, one row per (grp, msg_id), in the caller's
 * database:
 *
 *   (absent) ─attempt─► RECEIVED(1) ─attempt, a < max─► RECEIVED(a+1)
 *   RECEIVED(a) ─attempt, a = max─► DEAD
 *   (absent) or RECEIVED(a) ─settle, in the business transaction─► DONE
 *
 * An attempt commits on its own, before the business transaction, so its
 * count survives the business's rollback; the settle commits or rolls back
 * with the business. Both are one upsert whose ON CONFLICT ... WHERE
 * state = 'RECEIVED' decides on the row as it is when the statement holds
 * it, never on an earlier read: of two settles of one message, the second
 * waits for the first's transaction (PostgreSQL's row lock; SQLite's one
 * writer) and then finds DONE, or RECEIVED again if the first rolled back.
 * A row the upsert did not write is read afterwards to say why: DONE or
 * DEAD, which no attempt or settle ever leaves again.
 *
 * The statements are written once with $1-style parameters: PostgreSQL's
 * own, and names to SQLite, which binds them by name.
 */
#ifndef IDEM_INBOX_TX_H
#define IDEM_INBOX_TX_H

#include <stdint.h>

#include "idem.h"

#define IDEM_INBOX_ATTEMPTS_MAX 1000u
#define IDEM_INBOX_RETENTION_MAX_MS (3650LL * 24 * 3600 * 1000) /* ten years */

/* One message's parameters, by the numbers the statements give them:
 * $1 group, $2 msg_id, $3 biz_type ("" for NULL), $4 and $5 numbers (the
 * attempt: max_attempts and now; the settle: now). */
struct idem__inbox_msg {
    const char *group, *msg_id, *biz_type;
    int64_t n4, n5;
};

/* A backend runs one statement on message m to its end on its connection:
 * sql takes parameters $1..$nparams of m. *row: 1 if the statement gave a
 * row (state, attempts, biz_type), which fills *entry. what names the step
 * for an error's detail. */
typedef idem_rc (*idem__inbox_run_fn)(void *conn, const char *sql, int nparams,
                                      const struct idem__inbox_msg *m, const char *what,
                                      int *row, idem_inbox_entry *entry);

/* idem_inbox_attempt_* and idem_inbox_settle_*, once the backend has
 * checked the arguments (below) and found its connection in the right
 * transaction state. */
idem_rc idem__inbox_attempt(idem__inbox_run_fn run, void *conn, const char *group,
                            const char *msg_id, const char *biz_type, unsigned max_attempts,
                            idem_outcome *out, idem_inbox_entry *entry);
idem_rc idem__inbox_settle(idem__inbox_run_fn run, void *conn, const char *group,
                           const char *msg_id, const char *biz_type, idem_outcome *out,
                           idem_inbox_entry *entry);

/* The start of every public call on one message: clears the thread's
 * detail and checks the arguments (conn, named conn_name in the detail;
 * biz_type may be NULL); *out = IDEM_NONE when they are good. */
idem_rc idem__inbox_check_msg(const void *conn, const char *conn_name, const char *group,
                              const char *msg_id, const char *biz_type, idem_outcome *out);

/* max_attempts in 1..IDEM_INBOX_ATTEMPTS_MAX. */
idem_rc idem__inbox_check_attempts(unsigned max_attempts);

/* The same for a purge; *purged = 0. *cutoff receives the instant (ms) at
 * or before which an entry's last change makes it purgeable. */
idem_rc idem__inbox_check_purge(const void *conn, const char *conn_name, int64_t retention_ms,
                                unsigned *purged, int64_t *cutoff);

/* Fill entry from a row's text columns (any may be NULL). */
void idem__inbox_entry_set(idem_inbox_entry *entry, const char *state, const char *attempts,
                           const char *biz_type);

#endif
