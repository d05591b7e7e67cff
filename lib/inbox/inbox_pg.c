/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox_pg.c — the inbox in the caller's own PostgreSQL database (inbox
 * layer), inbox_sqlite.c's twin: the claim inside the caller's transaction,
 * and the message table with attempts (inbox_tx.h draws it).
 *
 * The consumer's business write and the claim of its message id commit or
 * roll back together, on the caller's connection, in the caller's
 * transaction. The claim is an INSERT ... ON CONFLICT DO NOTHING on the
 * table's primary key: the key decides, never a read. A concurrent claim of
 * the same id that has not committed yet makes ours wait for it; once it
 * commits ours inserts nothing (DUPLICATE), and if it rolls back ours is the
 * claim (CLAIMED).
 *
 * Statements are unnamed (PQexecParams), so nothing here collides with the
 * caller's own prepared statements.
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "inbox/inbox_tx.h"

static const char exists_sql[] = "SELECT to_regclass($1) IS NOT NULL";

/* Two transactions that both find the table missing both create it; the
 * second waits for the first and then fails on the catalog's unique key.
 * The savepoint keeps that failure from aborting the caller's transaction. */
static const char create_sql[] =
    "CREATE TABLE IF NOT EXISTS idem_inbox_claim ("
    " grp text NOT NULL,"
    " msg_id text NOT NULL,"
    " biz_type text NOT NULL,"
    " claimed_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (grp, msg_id))";

static const char claim_sql[] =
    "INSERT INTO idem_inbox_claim (grp, msg_id, biz_type) VALUES ($1, $2, $3)"
    " ON CONFLICT (grp, msg_id) DO NOTHING";

static idem_rc pg_fail(PGconn *conn, const PGresult *r, const char *what)
{
    const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    char line[200];
    size_t n = 0;
    /* libpq's own messages span lines; the detail is one. */
    for (const char *p = msg ? msg : PQerrorMessage(conn); *p && n + 1 < sizeof line; p++)
        line[n++] = *p == '\n' || *p == '\t' ? ' ' : *p;
    while (n && line[n - 1] == ' ')
        n--;
    line[n] = '\0';
    return idem__fail(PQstatus(conn) == CONNECTION_BAD ? IDEM_EUNAVAILABLE : IDEM_ESTORE,
                      "postgres: %s: %s (SQLSTATE %s)", what, line, state ? state : "none");
}

/* Run sql; IDEM_OK if it gave `want`. *out, if not NULL, keeps the result. */
static idem_rc run(PGconn *conn, const char *sql, int nparams, const char *const *params,
                   ExecStatusType want, const char *what, PGresult **out)
{
    PGresult *r = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(r) != want) {
        idem_rc rc = pg_fail(conn, r, what);
        PQclear(r);
        return rc;
    }
    if (out)
        *out = r;
    else
        PQclear(r);
    return IDEM_OK;
}

/* *exists: the caller's search path finds table. */
static idem_rc table_exists(PGconn *conn, const char *table, int *exists)
{
    PGresult *r = NULL;
    const char *const params[1] = {table};
    idem_rc rc = run(conn, exists_sql, 1, params, PGRES_TUPLES_OK, "looking for the inbox table", &r);
    if (rc != IDEM_OK)
        return rc;
    *exists = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    return IDEM_OK;
}

/* Two transactions that both found a table missing both create it; the
 * second waits for the first and then fails on the catalog's unique key
 * (23505), or finds the relation (42P07) or its row type (42710) there:
 * the first's has committed, and ours may use it. */
static int lost_race(const char *sqlstate)
{
    return sqlstate && (!strcmp(sqlstate, "23505") || !strcmp(sqlstate, "42P07") ||
                        !strcmp(sqlstate, "42710"));
}

/* Create idem_inbox_claim if this database has none yet, inside the
 * caller's transaction, so it too rolls back with the business. */
static idem_rc ensure_table(PGconn *conn)
{
    int exists = 0;
    idem_rc rc = table_exists(conn, "idem_inbox_claim", &exists);
    if (rc != IDEM_OK || exists)
        return rc;
    if ((rc = run(conn, "SAVEPOINT idem_inbox_claim_create", 0, NULL, PGRES_COMMAND_OK,
                  "creating idem_inbox_claim", NULL)) != IDEM_OK)
        return rc;
    PGresult *r = PQexecParams(conn, create_sql, 0, NULL, NULL, NULL, NULL, 0);
    int made = PQresultStatus(r) == PGRES_COMMAND_OK;
    const char *state = made ? NULL : PQresultErrorField(r, PG_DIAG_SQLSTATE);
    rc = made || lost_race(state) ? IDEM_OK : pg_fail(conn, r, "creating idem_inbox_claim");
    PQclear(r);
    char detail[256];
    snprintf(detail, sizeof detail, "%s", idem_errdetail());
    /* Either way the savepoint goes; a failed CREATE is undone first, so
     * the caller's transaction carries on. */
    idem_rc end = IDEM_OK;
    if (!made)
        end = run(conn, "ROLLBACK TO SAVEPOINT idem_inbox_claim_create", 0, NULL,
                  PGRES_COMMAND_OK, "creating idem_inbox_claim", NULL);
    if (end == IDEM_OK)
        end = run(conn, "RELEASE SAVEPOINT idem_inbox_claim_create", 0, NULL,
                  PGRES_COMMAND_OK, "creating idem_inbox_claim", NULL);
    if (rc != IDEM_OK)
        return idem__fail(rc, "%s", detail);
    return end;
}

static const char *tx_status(PGTransactionStatusType ts)
{
    return ts == PQTRANS_IDLE      ? "no transaction is open"
           : ts == PQTRANS_INTRANS ? "a transaction is open"
           : ts == PQTRANS_INERROR ? "the transaction has failed"
           : ts == PQTRANS_ACTIVE  ? "a command is in progress"
                                   : "the connection is not usable";
}

/* IDEM_ENOTX unless conn is idle inside a transaction block, where the
 * business writes and `verb` (claim, settle) belongs. */
static idem_rc want_transaction(PGconn *conn, const char *verb)
{
    PGTransactionStatusType ts = PQtransactionStatus(conn);
    if (ts == PQTRANS_INTRANS)
        return IDEM_OK;
    return idem__fail(IDEM_ENOTX, "conn: %s; BEGIN before the business write and %s inside it",
                      tx_status(ts), verb);
}

/* struct pg_conn, in idem.h, is libpq's own name for PGconn. */
IDEM_EXTERN idem_rc idem_inbox_claim_pg(PGconn *conn, const char *group, const char *msg_id,
                                        const char *biz_type, idem_outcome *out)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(conn, "conn", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = want_transaction(conn, "claim")) != IDEM_OK ||
        (rc = ensure_table(conn)) != IDEM_OK)
        return rc;
    const char *const params[3] = {group, msg_id, biz_type ? biz_type : ""};
    PGresult *r = NULL;
    if ((rc = run(conn, claim_sql, 3, params, PGRES_COMMAND_OK, "claiming the message", &r)) !=
        IDEM_OK)
        return rc;
    *out = strcmp(PQcmdTuples(r), "1") == 0 ? IDEM_CLAIMED : IDEM_DUPLICATE;
    PQclear(r);
    return IDEM_OK;
}

/* ---- the message table with attempts ---------------------------------- */

static const char create_msg_sql[] =
    "CREATE TABLE IF NOT EXISTS idem_inbox_msg ("
    " grp text COLLATE \"C\" NOT NULL,"
    " msg_id text COLLATE \"C\" NOT NULL,"
    " biz_type text NOT NULL,"
    " state text NOT NULL CHECK (state IN ('RECEIVED', 'DONE', 'DEAD')),"
    " attempts bigint NOT NULL,"
    " created_ms bigint NOT NULL,"
    " updated_ms bigint NOT NULL,"
    " PRIMARY KEY (grp, msg_id));"
    "CREATE INDEX IF NOT EXISTS idem_inbox_msg_updated ON idem_inbox_msg (updated_ms)";

/* As for records: rows a concurrent transaction holds (a settle not yet
 * committed) are left for the next purge, so a purge never waits; the rows
 * it locked are deleted by their ctid. */
static const char purge_sql[] =
    "DELETE FROM idem_inbox_msg WHERE ctid = ANY (ARRAY(SELECT ctid FROM idem_inbox_msg"
    " WHERE updated_ms <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED))";

/* Create idem_inbox_msg, outside any transaction of the caller's (the
 * attempt runs in none): its two statements commit together. */
static idem_rc create_msg_table(PGconn *conn)
{
    PGresult *r = PQexec(conn, create_msg_sql);
    int made = PQresultStatus(r) == PGRES_COMMAND_OK;
    idem_rc rc = made || lost_race(PQresultErrorField(r, PG_DIAG_SQLSTATE))
                     ? IDEM_OK
                     : pg_fail(conn, r, "creating idem_inbox_msg");
    PQclear(r);
    return rc;
}

/* inbox_tx.c's runner. A statement that finds no idem_inbox_msg outside a
 * transaction (an attempt: the first on this database) creates the table
 * and runs again; inside one, PostgreSQL has aborted the caller's
 * transaction, and the detail says what creates the table. */
static idem_rc run_msg(void *c, const char *sql, int nparams, const struct idem__inbox_msg *m,
                       const char *what, int *row, idem_inbox_entry *entry)
{
    PGconn *conn = c;
    char n4[24], n5[24];
    snprintf(n4, sizeof n4, "%lld", (long long)m->n4);
    snprintf(n5, sizeof n5, "%lld", (long long)m->n5);
    const char *const params[5] = {m->group, m->msg_id, m->biz_type, n4, n5};
    for (int tries = 0;; tries++) {
        PGresult *r = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(r) == PGRES_TUPLES_OK) {
            *row = PQntuples(r) > 0;
            if (*row)
                idem__inbox_entry_set(entry, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1),
                                      PQgetvalue(r, 0, 2));
            PQclear(r);
            return IDEM_OK;
        }
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        int missing = state && strcmp(state, "42P01") == 0;
        idem_rc rc = pg_fail(conn, r, what);
        PQclear(r);
        if (!missing || tries > 0)
            return rc;
        if (PQtransactionStatus(conn) != PQTRANS_IDLE) {
            char detail[256];
            snprintf(detail, sizeof detail, "%s", idem_errdetail());
            return idem__fail(rc, "%s; idem_inbox_attempt_pg() creates the table: count the "
                                  "attempt before the transaction",
                              detail);
        }
        if ((rc = create_msg_table(conn)) != IDEM_OK)
            return rc;
    }
}

IDEM_EXTERN idem_rc idem_inbox_attempt_pg(PGconn *conn, const char *group, const char *msg_id,
                                          const char *biz_type, unsigned max_attempts,
                                          idem_outcome *out, idem_inbox_entry *entry)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(conn, "conn", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = idem__inbox_check_attempts(max_attempts)) != IDEM_OK)
        return rc;
    PGTransactionStatusType ts = PQtransactionStatus(conn);
    if (ts != PQTRANS_IDLE)
        return idem__fail(ts == PQTRANS_UNKNOWN ? IDEM_EUNAVAILABLE : IDEM_EINVAL,
                          "conn: %s; count the attempt before BEGIN, so that the count "
                          "outlives a rollback",
                          tx_status(ts));
    return idem__inbox_attempt(run_msg, conn, group, msg_id, biz_type, max_attempts, out, entry);
}

IDEM_EXTERN idem_rc idem_inbox_settle_pg(PGconn *conn, const char *group, const char *msg_id,
                                         const char *biz_type, idem_outcome *out,
                                         idem_inbox_entry *entry)
{
    idem_rc rc;
    if ((rc = idem__inbox_check_msg(conn, "conn", group, msg_id, biz_type, out)) != IDEM_OK ||
        (rc = want_transaction(conn, "settle")) != IDEM_OK)
        return rc;
    return idem__inbox_settle(run_msg, conn, group, msg_id, biz_type, out, entry);
}

IDEM_EXTERN idem_rc idem_inbox_purge_pg(PGconn *conn, int64_t retention_ms, unsigned limit,
                                        unsigned *purged)
{
    idem_rc rc;
    int64_t cutoff = 0;
    int exists = 0;
    if ((rc = idem__inbox_check_purge(conn, "conn", retention_ms, purged, &cutoff)) != IDEM_OK ||
        limit == 0 ||
        (rc = table_exists(conn, "idem_inbox_msg", &exists)) != IDEM_OK || !exists)
        return rc;
    char cut[24], lim[24];
    snprintf(cut, sizeof cut, "%lld", (long long)cutoff);
    snprintf(lim, sizeof lim, "%u", limit);
    const char *const params[2] = {cut, lim};
    PGresult *r = NULL;
    if ((rc = run(conn, purge_sql, 2, params, PGRES_COMMAND_OK, "purging inbox entries", &r)) !=
        IDEM_OK)
        return rc;
    *purged = (unsigned)strtoul(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return IDEM_OK;
}
