/*
 * inbox_pg.c — the inbox claim inside the caller's own PostgreSQL
 * transaction (inbox layer); inbox_sqlite.c's twin.
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
#include <string.h>

#include "core/check.h"
#include "core/error.h"

static const char exists_sql[] = "SELECT to_regclass('idem_inbox_claim') IS NOT NULL";

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

/* Create idem_inbox_claim if this database has none yet, inside the
 * caller's transaction, so it too rolls back with the business. */
static idem_rc ensure_table(PGconn *conn)
{
    PGresult *r = NULL;
    idem_rc rc = run(conn, exists_sql, 0, NULL, PGRES_TUPLES_OK, "looking for idem_inbox_claim", &r);
    if (rc != IDEM_OK)
        return rc;
    int exists = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    if (exists)
        return IDEM_OK;
    if ((rc = run(conn, "SAVEPOINT idem_inbox_claim_create", 0, NULL, PGRES_COMMAND_OK,
                  "creating idem_inbox_claim", NULL)) != IDEM_OK)
        return rc;
    r = PQexecParams(conn, create_sql, 0, NULL, NULL, NULL, NULL, 0);
    int made = PQresultStatus(r) == PGRES_COMMAND_OK;
    /* Someone else's transaction created it first (23505, 42P07): theirs
     * has committed, and ours may use it. */
    const char *state = made ? NULL : PQresultErrorField(r, PG_DIAG_SQLSTATE);
    int lost_race = state && (!strcmp(state, "23505") || !strcmp(state, "42P07"));
    rc = made || lost_race ? IDEM_OK : pg_fail(conn, r, "creating idem_inbox_claim");
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

/* struct pg_conn, in idem.h, is libpq's own name for PGconn. */
IDEM_EXTERN idem_rc idem_inbox_claim_pg(PGconn *conn, const char *group, const char *msg_id,
                                        const char *biz_type, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if (!conn)
        return idem__fail(IDEM_EINVAL, "conn: NULL");
    if ((rc = idem__check_name(group, "group")) != IDEM_OK ||
        (rc = idem__check_key(msg_id, "msg_id", 0)) != IDEM_OK ||
        (biz_type && (rc = idem__check_name(biz_type, "biz_type")) != IDEM_OK) ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    PGTransactionStatusType ts = PQtransactionStatus(conn);
    if (ts != PQTRANS_INTRANS)
        return idem__fail(IDEM_ENOTX, "conn: %s; BEGIN before the business write and "
                                      "claim inside it",
                          ts == PQTRANS_IDLE      ? "no transaction is open"
                          : ts == PQTRANS_INERROR ? "the transaction has failed"
                          : ts == PQTRANS_ACTIVE  ? "a command is in progress"
                                                  : "the connection is not usable");
    if ((rc = ensure_table(conn)) != IDEM_OK)
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
