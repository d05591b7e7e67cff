/*
 * inbox_sqlite.c — the inbox claim inside the caller's own SQLite
 * transaction (inbox layer).
 *
 * The consumer's business write and the claim of its message id commit or
 * roll back together, so there is no window in which the effect exists but
 * the claim does not (a redelivery would apply it twice) or the claim exists
 * but the effect does not (the message would be lost). The claim is an
 * INSERT ... ON CONFLICT DO NOTHING on the table's primary key: the key
 * decides, never a read.
 */
#include <sqlite3.h>
#include <string.h>

#include "core/check.h"
#include "core/error.h"

static const char create_sql[] =
    "CREATE TABLE IF NOT EXISTS idem_inbox_claim ("
    " grp TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " biz_type TEXT NOT NULL,"
    " claimed_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),"
    " PRIMARY KEY (grp, msg_id))";

static const char claim_sql[] =
    "INSERT INTO idem_inbox_claim (grp, msg_id, biz_type) VALUES (?1, ?2, ?3)"
    " ON CONFLICT (grp, msg_id) DO NOTHING";

static idem_rc db_fail(sqlite3 *db, const char *what)
{
    int code = sqlite3_extended_errcode(db);
    return idem__fail((code & 0xff) == SQLITE_NOMEM ? IDEM_ENOMEM : IDEM_ESTORE,
                      "sqlite: %s: %s (%d)", what, sqlite3_errmsg(db), code);
}

IDEM_EXTERN idem_rc idem_inbox_claim_sqlite(sqlite3 *db, const char *group,
                                            const char *msg_id,
                                            const char *biz_type,
                                            idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if (!db)
        return idem__fail(IDEM_EINVAL, "db: NULL");
    if ((rc = idem__check_name(group, "group")) != IDEM_OK ||
        (rc = idem__check_key(msg_id, "msg_id", 0)) != IDEM_OK ||
        (biz_type && (rc = idem__check_name(biz_type, "biz_type")) != IDEM_OK) ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    if (sqlite3_get_autocommit(db))
        return idem__fail(IDEM_ENOTX, "db: no transaction is open; BEGIN before the "
                                      "business write and claim inside it");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, claim_sql, -1, &s, NULL) != SQLITE_OK) {
        /* First use on this database: create the table inside the caller's
         * transaction, so it too rolls back with the business. */
        if (sqlite3_exec(db, create_sql, NULL, NULL, NULL) != SQLITE_OK)
            return db_fail(db, "creating idem_inbox_claim");
        if (sqlite3_prepare_v2(db, claim_sql, -1, &s, NULL) != SQLITE_OK)
            return db_fail(db, "preparing the claim");
    }
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
