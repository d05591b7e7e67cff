/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inbox_tx.c — the statements and checks that idem_inbox_attempt_*,
 * _settle_* and _purge_* share on SQLite and PostgreSQL (inbox layer); the
 * table and its states are drawn in inbox_tx.h.
 */
#include "inbox/inbox_tx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/error.h"
#include "store/store.h"

/* An attempt or settle that finds its row changed under it runs again;
 * more than this many times is a store gone wrong. */
#define ROUNDS_MAX 4

/* The alias m names the row as it stands; an attempt on a row at
 * max_attempts makes it DEAD instead of counting one more. */
static const char attempt_sql[] =
    "INSERT INTO idem_inbox_msg AS m (grp, msg_id, biz_type, state, attempts,"
    " created_ms, updated_ms) VALUES ($1, $2, $3, 'RECEIVED', 1, $5, $5)"
    " ON CONFLICT (grp, msg_id) DO UPDATE SET"
    " attempts = CASE WHEN m.attempts < $4 THEN m.attempts + 1 ELSE m.attempts END,"
    " state = CASE WHEN m.attempts < $4 THEN 'RECEIVED' ELSE 'DEAD' END,"
    " updated_ms = $5"
    " WHERE m.state = 'RECEIVED'"
    " RETURNING state, attempts, biz_type";

/* A message settled without an attempt first is its own first attempt. In
 * PostgreSQL the row is locked even when the WHERE refuses it, so the read
 * that follows sees it as the upsert did. */
static const char settle_sql[] =
    "INSERT INTO idem_inbox_msg AS m (grp, msg_id, biz_type, state, attempts,"
    " created_ms, updated_ms) VALUES ($1, $2, $3, 'DONE', 1, $4, $4)"
    " ON CONFLICT (grp, msg_id) DO UPDATE SET state = 'DONE', updated_ms = $4"
    " WHERE m.state = 'RECEIVED'"
    " RETURNING state, attempts, biz_type";

static const char read_sql[] =
    "SELECT state, attempts, biz_type FROM idem_inbox_msg WHERE grp = $1 AND msg_id = $2";

idem_rc idem__inbox_check_msg(const void *conn, const char *conn_name, const char *group,
                              const char *msg_id, const char *biz_type, idem_outcome *out)
{
    idem_rc rc;
    idem__clear_detail();
    if (!conn)
        return idem__fail(IDEM_EINVAL, "%s: NULL", conn_name);
    if ((rc = idem__check_name(group, "group")) != IDEM_OK ||
        (rc = idem__check_key(msg_id, "msg_id", 0)) != IDEM_OK ||
        (biz_type && (rc = idem__check_name(biz_type, "biz_type")) != IDEM_OK) ||
        (rc = idem__check_out(out, "out")) != IDEM_OK)
        return rc;
    *out = IDEM_NONE;
    return IDEM_OK;
}

idem_rc idem__inbox_check_attempts(unsigned max_attempts)
{
    if (max_attempts < 1 || max_attempts > IDEM_INBOX_ATTEMPTS_MAX)
        return idem__fail(IDEM_EINVAL, "max_attempts: %u, must be 1..%u", max_attempts,
                          IDEM_INBOX_ATTEMPTS_MAX);
    return IDEM_OK;
}

idem_rc idem__inbox_check_purge(const void *conn, const char *conn_name, int64_t retention_ms,
                                unsigned *purged, int64_t *cutoff)
{
    idem_rc rc;
    idem__clear_detail();
    if (!conn)
        return idem__fail(IDEM_EINVAL, "%s: NULL", conn_name);
    if ((rc = idem__check_out(purged, "purged")) != IDEM_OK)
        return rc;
    *purged = 0;
    if ((rc = idem__check_ms(retention_ms, 1, IDEM_INBOX_RETENTION_MAX_MS, "retention_ms")) !=
        IDEM_OK)
        return rc;
    *cutoff = idem__wall_clock_ms(NULL) - retention_ms;
    return IDEM_OK;
}

void idem__inbox_entry_set(idem_inbox_entry *entry, const char *state, const char *attempts,
                           const char *biz_type)
{
    memset(entry, 0, sizeof *entry);
    snprintf(entry->state, sizeof entry->state, "%s", state ? state : "");
    entry->attempts = attempts ? (unsigned)strtoul(attempts, NULL, 10) : 0;
    snprintf(entry->biz_type, sizeof entry->biz_type, "%s", biz_type ? biz_type : "");
}

/* Run upsert_sql on message m; when it writes nothing, read the row to say
 * why. *out: `written` if it wrote the row, DUPLICATE if the row is DONE,
 * DEAD if it is DEAD. A row found neither written nor final changed
 * between the two statements (a purge took it): the upsert runs again. */
static idem_rc upsert(idem__inbox_run_fn run, void *conn, const char *upsert_sql,
                      int nparams, const struct idem__inbox_msg *m, const char *what, idem_outcome written,
                      idem_outcome *out, idem_inbox_entry *cur)
{
    for (int round = 0; round < ROUNDS_MAX; round++) {
        int wrote = 0, found = 0;
        idem_rc rc = run(conn, upsert_sql, nparams, m, what, &wrote, cur);
        if (rc != IDEM_OK)
            return rc;
        if (wrote) {
            *out = written;
            return IDEM_OK;
        }
        if ((rc = run(conn, read_sql, 2, m, what, &found, cur)) != IDEM_OK)
            return rc;
        if (found && strcmp(cur->state, "DONE") == 0) {
            *out = IDEM_DUPLICATE;
            return IDEM_OK;
        }
        if (found && strcmp(cur->state, "DEAD") == 0) {
            *out = IDEM_DEAD;
            return IDEM_OK;
        }
    }
    return idem__fail(IDEM_ESTORE, "inbox: %s: %s/%s changed %d times during one call", what,
                      m->group, m->msg_id, ROUNDS_MAX);
}

idem_rc idem__inbox_attempt(idem__inbox_run_fn run, void *conn, const char *group,
                            const char *msg_id, const char *biz_type, unsigned max_attempts,
                            idem_outcome *out, idem_inbox_entry *entry)
{
    struct idem__inbox_msg m = {group, msg_id, biz_type ? biz_type : "", max_attempts,
                                idem__wall_clock_ms(NULL)};
    idem_inbox_entry cur;
    memset(&cur, 0, sizeof cur);
    idem_rc rc = upsert(run, conn, attempt_sql, 5, &m, "counting the attempt", IDEM_PROCESS, out,
                        &cur);
    if (rc != IDEM_OK)
        return rc;
    /* The attempt that found the count at max_attempts wrote DEAD. */
    if (*out == IDEM_PROCESS && strcmp(cur.state, "DEAD") == 0)
        *out = IDEM_DEAD;
    if (entry)
        *entry = cur;
    return IDEM_OK;
}

idem_rc idem__inbox_settle(idem__inbox_run_fn run, void *conn, const char *group,
                           const char *msg_id, const char *biz_type, idem_outcome *out,
                           idem_inbox_entry *entry)
{
    struct idem__inbox_msg m = {group, msg_id, biz_type ? biz_type : "",
                                idem__wall_clock_ms(NULL), 0};
    idem_inbox_entry cur;
    memset(&cur, 0, sizeof cur);
    idem_rc rc = upsert(run, conn, settle_sql, 4, &m, "settling the message", IDEM_CLAIMED, out,
                        &cur);
    if (rc == IDEM_OK && entry)
        *entry = cur;
    return rc;
}
