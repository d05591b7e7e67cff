/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox_sqlite.c — the inbox in the caller's own SQLite database (inbox
 * layer): the claim inside the caller's transaction, and the message table
 * with attempts (inbox_tx.h draws it).
 *
 * The consumer's business write and the claim of its message id commit or
 * roll back together, so there is no window in which the effect exists but
 * the claim does not (a redelivery would apply it twice) or the claim exists
 * but the effect does not (the message would be lost). The claim is an
 * INSERT ... ON CONFLICT DO NOTHING on the table's primary key: the key
 * decides, never a read.
 *
 * The tables are created on first use, inside whatever transaction the
 * call runs in, so that in the caller's transaction they too roll back
 * with the business.
 */
#include <sqlite3.h>
#include <string.h>

#include "core/error.h"
#include "inbox/inbox_tx.h"

static const char create_claim_sql[] =
    "CREATE TABLE IF NOT EXISTS idem_inbox_claim ("
    " grp TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " biz_type TEXT NOT NULL,"
    " claimed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),"
    " PRIMARY KEY (grp, msg_id))";

static const char claim_sql[] =
    "INSERT INTO idem_inbox_claim (grp, msg_id, biz_type) VALUES (?1, ?2, ?3)"
    " ON CONFLICT (grp, msg_id) DO NOTHING";

static const char create_msg_sql[] =
    "CREATE TABLE IF NOT EXISTS idem_inbox_msg ("
    " grp TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " biz_type TEXT NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('RECEIVED', 'DONE', 'DEAD')),"
    " attempts INTEGER NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " PRIMARY KEY (grp, msg_id));"
    "CREATE INDEX IF NOT EXISTS idem_inbox_msg_updated ON idem_inbox_msg (updated_ms)";

/* Entries whose last change is at or before $1, $2 at most. */
static const char purge_sql[] =
    "DELETE FROM idem_inbox_msg WHERE rowid IN (SELECT rowid FROM idem_inbox_msg"
    " WHERE updated_ms <= ?1 LIMIT ?2)";

static idem_rc db_fail(sqlite3 *db, const char *what)
{
    int code = sqlite3_extended_errcode(db);
    return idem__fail((code & 0xff) == SQLITE_NOMEM ? IDEM_ENOMEM : IDEM_ESTORE,
                      "sqlite: %s: %s (%d)", what, sqlite3_errmsg(db), code);
}

/* Prepare sql; a statement that does not prepare is taken for the first
 * use on this database: create_sql makes the table, and sql is prepared
 * again. */
static idem_rc prepare(sqlite3 *db, const char *sql, const char *create_sql,
                       const char *what, sqlite3_stmt **s)
{
    *s = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, s, NULL) == SQLITE_OK)
        return IDEM_OK;
    if (sqlite3_exec(db, create_sql, NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(db, "creating the inbox table");
    if (sqlite3_prepare_v2(db, sql, -1, s, NULL) != SQLITE_OK)
        return db_fail(db, what);
    return IDEM_OK;
}

/* IDEM_ENOTX unless db has a transaction open, where the business writes
 * and `verb` (claim, settle) belongs. */
static idem_rc want_transaction(sqlite3 *db, const char *verb)
{
    if (!sqlite3_get_autocommit(db))
        return IDEM_OK;
    return idem__fail(IDEM_ENOTX, "db: no transaction is open; BEGIN before the business "
                                  "write and %s inside it",
                      verb);
}

IDEM_EXTERN idem_rc idem_inbox_claim_sqlite(sqlite3 *db, const char *group,
                                            const char *msg_id,
                                            const char *biz_type,
                                            idem_outcome *out)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(db, "db", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = want_transaction(db, "claim")) != IDEM_OK)
        return rc;
    sqlite3_stmt *s = NULL;
    if ((rc = prepare(db, claim_sql, create_claim_sql, "preparing the claim", &s)) != IDEM_OK)
        return rc;
    sqlite3_bind_text(s, 1, group, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, msg_id, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, biz_type ? biz_type : "", -1, SQLITE_STATIC);
    int step = sqlite3_step(s);
    if (step != SQLITE_DONE)
        rc = db_fail(db, "claiming the message");
    else
        *out = sqlite3_changes(db) == 1 ? IDEM_CLAIMED : IDEM_DUPLICATE;
    sqlite3_finalize(s);
    return rc;
}

/* ---- the message table with attempts ---------------------------------- */

/* inbox_tx.c's runner: binds the $1-style parameters by name. */
static idem_rc run_msg(void *conn, const char *sql, int nparams,
                       const struct idem__inbox_msg *m, const char *what, int *row,
                       idem_inbox_entry *entry)
{
    sqlite3 *db = conn;
    sqlite3_stmt *s = NULL;
    idem_rc rc = prepare(db, sql, create_msg_sql, what, &s);
    if (rc != IDEM_OK)
        return rc;
    static const char *const names[5] = {"$1", "$2", "$3", "$4", "$5"};
    const char *text[3] = {m->group, m->msg_id, m->biz_type};
    const int64_t num[2] = {m->n4, m->n5};
    for (int i = 1; i <= nparams && i <= 5; i++) {
        int at = sqlite3_bind_parameter_index(s, names[i - 1]);
        if (i <= 3)
            sqlite3_bind_text(s, at, text[i - 1], -1, SQLITE_STATIC);
        else
            sqlite3_bind_int64(s, at, num[i - 4]);
    }
    *row = 0;
    int step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) {
        *row = 1;
        idem__inbox_entry_set(entry, (const char *)sqlite3_column_text(s, 0),
                              (const char *)sqlite3_column_text(s, 1),
                              (const char *)sqlite3_column_text(s, 2));
    }
    if (step != SQLITE_DONE)
        rc = db_fail(db, what);
    sqlite3_finalize(s);
    return rc;
}

IDEM_EXTERN idem_rc idem_inbox_attempt_sqlite(sqlite3 *db, const char *group,
                                              const char *msg_id, const char *biz_type,
                                              unsigned max_attempts, idem_outcome *out,
                                              idem_inbox_entry *entry)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(db, "db", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = idem__inbox_check_attempts(max_attempts)) != IDEM_OK)
        return rc;
    if (!sqlite3_get_autocommit(db))
        return idem__fail(IDEM_EINVAL, "db: a transaction is open; count the attempt before "
                                       "BEGIN, so that the count outlives a rollback");
    return idem__inbox_attempt(run_msg, db, group, msg_id, biz_type, max_attempts, out, entry);
}

IDEM_EXTERN idem_rc idem_inbox_settle_sqlite(sqlite3 *db, const char *group,
                                             const char *msg_id, const char *biz_type,
                                             idem_outcome *out, idem_inbox_entry *entry)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(db, "db", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = want_transaction(db, "settle")) != IDEM_OK)
        return rc;
    return idem__inbox_settle(run_msg, db, group, msg_id, biz_type, out, entry);
}

IDEM_EXTERN idem_rc idem_inbox_purge_sqlite(sqlite3 *db, int64_t retention_ms,
                                            unsigned limit, unsigned *purged)
{
    idem_rc rc;
    int64_t cutoff = 0;
    if ((rc = idem__inbox_check_purge(db, "db", retention_ms, purged, &cutoff)) != IDEM_OK ||
        limit == 0)
        return rc;
    sqlite3_stmt *s = NULL;
    if ((rc = prepare(db, purge_sql, create_msg_sql, "preparing the purge", &s)) != IDEM_OK)
        return rc;
    sqlite3_bind_int64(s, 1, cutoff);
    sqlite3_bind_int64(s, 2, limit);
    if (sqlite3_step(s) != SQLITE_DONE)
        rc = db_fail(db, "purging inbox entries");
    else
        *purged = (unsigned)sqlite3_changes(db);
    sqlite3_finalize(s);
    return rc;
}
