/* SPDX-License-Identifier: Apache-2.0 */
/*
 * postgres.c — the "postgres" db backend: records and inbox in PostgreSQL,
 * the distributed store's layer 3. Any number of processes on any number of
 * machines open the same database and share its records.
 *
 * Schema. Idem creates and migrates its tables itself, at open. Migrations
 * are numbered; idem_schema holds one row per migration applied. They run in
 * one transaction under pg_advisory_xact_lock(SCHEMA_LOCK), so processes that
 * start together take turns, and each finds what the one before it made. A
 * migration only creates (tables, indexes, columns): never a DROP, never a
 * rewrite. A database migrated by a newer Idem than this one is refused
 * (IDEM_ESTORE naming both versions) rather than written in a shape this code
 * does not know. The tables are sqlite.c's in PostgreSQL types (text, bytea,
 * bigint): idem_record keyed by (space, key), with a partial index on
 * expires_ms for purge, and idem_inbox keyed by (grp, msg_id). Keys collate
 * as "C": they are identifiers, compared byte by byte.
 *
 * Who is first. The PRIMARY KEY decides, never a read: INSERT ... ON CONFLICT
 * DO NOTHING, whose row count says whether this call created the record. An
 * insert of a key that a concurrent transaction inserted and has not
 * committed waits for it, then does nothing. Every later change is an UPDATE
 * conditional on the state (and epoch, and lease) the caller last saw. When
 * the insert or update was not made, the row as it stands is read by a later
 * statement of the same transaction: under READ COMMITTED each statement
 * takes a fresh snapshot, so it sees the row the write waited for, which a
 * SELECT inside the write's own statement (a CTE) would not.
 *
 * Group commit. Callers do not talk to the server: they queue a job and
 * sleep, or (the _start operations) are called back. A writer thread, with
 * its own connection, takes every job queued by the group-commit policy
 * (commit_queue.h: up to commit_batch_max, and BATCH_BYTES_MAX of
 * payload), sorts them by
 * (table, space, key), and runs them as one transaction in libpq's pipeline
 * mode, in two round trips:
 *
 *   1. BEGIN, every job's INSERT or UPDATE, Sync; the row counts come back;
 *   2. a SELECT of the row for each write that was not made, COMMIT, Sync.
 *
 * Under ordinary load every write is made and the second trip is COMMIT
 * alone; reading every row in the first trip instead would cost a statement
 * per job for rows nobody looks at. Only after the COMMIT is each caller
 * woken (or called back): a caller returns once its write is durable, and 64 concurrent
 * callers cost a handful of WAL flushes, not 64. There are WRITERS (two)
 * writers on one queue: while one batch waits for its WAL flush, or for its
 * callers to come back, the other's executes on a second server process.
 * (Measured at 32 and 64 callers on two cores: 5 to 20% more writes per
 * second than one writer, for smaller batches and some more CPU.)
 *
 * The sort makes every process lock rows in one order, so batches of two
 * processes may wait for each other but never deadlock; a serialization
 * failure or deadlock all the same reruns the batch, RETRIES_MAX times at
 * most. A failed statement aborts the whole pipeline; when the failure is a
 * job's own (its data refused: SQLSTATE classes 22 and 23), that job alone
 * fails and the others run again without it: group_commit.c's savepoint
 * semantics without a savepoint per job.
 *
 * Reads. rec_get does not queue behind writes: it runs on a pool of at most
 * pool_size connections, and concurrent reads share round trips as writes do
 * (see "the read pool" below). rec_peek, begin's hint, is such a read, taken
 * only while peeks are paying off (see rec_peek). Every statement is
 * prepared once per connection.
 *
 * Failures. Connections are non-blocking, and every round trip polls the
 * socket against a deadline (libpq has no per-command timeout). A write job
 * that waited timeout_ms for a writer fails untried; a batch's round trips
 * get timeout_ms from when the batch starts; a read gets timeout_ms from
 * when it was asked. A timeout drops the connection. A batch whose COMMIT
 * may have been sent when its connection broke or timed out is in doubt:
 * the writer finds out, on a new connection (to the same server, or to the
 * standby promoted since), which of its writes committed, and answers each
 * caller with what is there (see "a batch in doubt"); only when no primary
 * answers for SETTLE_MS does it fail IDEM_ETIMEDOUT, "it may have
 * happened". A read that times out fails IDEM_ETIMEDOUT; a refused
 * connection, or one lost before COMMIT was sent, fails a batch with
 * IDEM_EUNAVAILABLE. A
 * failed connect starts a backoff (BACKOFF_MIN_MS, doubling to
 * BACKOFF_MAX_MS) shared by the handle's connections; while it runs calls
 * fail at once, and the first connect after it that succeeds puts the handle
 * back to work: nothing needs reopening. An idle connection whose server
 * went away (a restart) is noticed before it is used, and replaced; one that
 * is found broken only on use, before its batch's COMMIT was queued, costs
 * nothing either: the batch runs once more on a new connection, as a read
 * does (see run_batch for why only then). Messages name the server as
 * host:port, never by its URL, whose password they must not show.
 *
 * The operators' calls. A listing (up to 500 rows) and a delete by epoch
 * are an operator's, a few a minute, and run on a connection of their own,
 * outside the batches: a listing in a batch would hold a hundred begins'
 * COMMIT for its rows. Their asynchronous forms needed something to run
 * them that is not the caller's loop, and no new thread was to be had: so
 * they are jobs of the two writers, queued as any write is, which a writer
 * sets apart from its batch and runs alone, after the batch, on that
 * connection; at most one writer at a time does so, and the other goes on
 * committing batches (see "the operators' calls" below). The blocking
 * forms queue the same jobs and wait, as a blocking write does. Their
 * failures are those of the statements they were before: a deadline of
 * timeout_ms, one reconnect of a connection found dead before use, and a
 * timeout that may have deleted (IDEM_ETIMEDOUT). A purge is a batch's job
 * already; its _start form queues it with a completion.
 *
 * Threads: the writers; the callers, who also serve reads. Locks: q.mu (the
 * write queue, the counters), pool_mu (the read queue, idle connections),
 * backoff_mu, admin_mu (the operators' queue); none is held while another
 * is taken, nor across a round trip.
 */
#include <endian.h>
#include <errno.h>
#include <libpq-fe.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/hint.h"
#include "commit_queue.h"
#include "core/stats.h"
#include "core/str.h"
#include "row.h"
#include "store.h"

#define SCHEMA_VERSION 2
#define SCHEMA_LOCK 0x6964656d2e736368LL /* "idem.sch" */
#define BATCH_BYTES_MAX ((size_t)8 << 20)
#define RETRIES_MAX 8
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define PARAMS_MAX 14
#define READ_BATCH_MAX 128
#define READS_PER_SERVER 16
#define WRITERS 2
#define SETTLE_MS 30000 /* a batch in doubt: how long to look for its outcome */
#define SETTINGS_EVERY_MS 5000 /* the primary's synchronous_* read again */

/* ---- schema ---- */

/* migrations[v - 1] takes the schema from version v - 1 to v. Append only;
 * each step only creates (CREATE ... IF NOT EXISTS, ADD COLUMN IF NOT
 * EXISTS), so running it over a half-made schema is harmless too. */
static const char *const migrations[SCHEMA_VERSION] = {
    "CREATE TABLE IF NOT EXISTS idem_record ("
    " space text COLLATE \"C\" NOT NULL,"
    " key text COLLATE \"C\" NOT NULL,"
    " fingerprint bytea,"
    " state text NOT NULL,"
    " epoch bigint NOT NULL,"
    " owner text NOT NULL,"
    " lease_until bigint NOT NULL,"
    " result bytea,"
    " created_ms bigint NOT NULL,"
    " updated_ms bigint NOT NULL,"
    " expires_ms bigint,"
    " PRIMARY KEY (space, key));"
    "CREATE INDEX IF NOT EXISTS idem_record_expiry ON idem_record (expires_ms)"
    " WHERE expires_ms IS NOT NULL;"
    "CREATE TABLE IF NOT EXISTS idem_inbox ("
    " grp text COLLATE \"C\" NOT NULL,"
    " msg_id text COLLATE \"C\" NOT NULL,"
    " biz_type text NOT NULL,"
    " state text NOT NULL,"
    " attempts bigint NOT NULL,"
    " lease_until bigint NOT NULL,"
    " created_ms bigint NOT NULL,"
    " updated_ms bigint NOT NULL,"
    " PRIMARY KEY (grp, msg_id))",
    /* 2: idem_record_list, newest first (sqlite.c has the same two). */
    "CREATE INDEX IF NOT EXISTS idem_record_created ON idem_record"
    " (space, created_ms, key);"
    "CREATE INDEX IF NOT EXISTS idem_record_processing ON idem_record"
    " (space, created_ms, key) WHERE state = 'PROCESSING'",
};

/* ---- statements ---- */

enum {
    ST_BEGIN, ST_COMMIT, ST_ROLLBACK,
    ST_REC_INSERT, ST_REC_GET, ST_REC_CAS, ST_REC_PURGE,
    ST_INBOX_INSERT, ST_INBOX_GET, ST_INBOX_CAS,
    ST_XACT, ST_TERMINATE,
    ST_COUNT_
};

/* types: one letter per parameter, t text, b bytea, i bigint, o boolean.
 * Parameters and rows travel in binary. */
static const struct {
    const char *name, *types, *sql;
} stmts[ST_COUNT_] = {
    [ST_BEGIN] = {"idem_begin", "", "BEGIN ISOLATION LEVEL READ COMMITTED"},
    [ST_COMMIT] = {"idem_commit", "", "COMMIT"},
    [ST_ROLLBACK] = {"idem_rollback", "", "ROLLBACK"},
    [ST_REC_INSERT] = {
        "idem_rec_insert", "ttbitii",
        "INSERT INTO idem_record (space, key, fingerprint, state, epoch, owner,"
        " lease_until, created_ms, updated_ms)"
        " VALUES ($1, $2, $3, 'PROCESSING', $4, $5, $6, $7, $7)"
        " ON CONFLICT (space, key) DO NOTHING"},
    [ST_REC_GET] = {
        "idem_rec_get", "tt",
        "SELECT state, epoch, owner, lease_until, created_ms, updated_ms,"
        " expires_ms, fingerprint, result FROM idem_record"
        " WHERE space = $1 AND key = $2"},
    [ST_REC_CAS] = {
        "idem_rec_cas", "tttitiobiitiib",
        "UPDATE idem_record SET state = $3,"
        " epoch = CASE WHEN $4 = 0 THEN epoch ELSE $4 END,"
        " owner = COALESCE($5, owner), lease_until = $6,"
        " result = CASE WHEN $7 THEN $8 ELSE result END,"
        " expires_ms = CASE WHEN $9 < 0 THEN expires_ms"
        "   WHEN $9 = 0 THEN NULL ELSE $9 END,"
        " updated_ms = $10, fingerprint = COALESCE($14, fingerprint)"
        " WHERE space = $1 AND key = $2 AND state = $11"
        " AND ($12 = 0 OR epoch = $12) AND ($13 = 0 OR lease_until <= $13)"},
    /* SKIP LOCKED: rows a concurrent batch holds are left for the next
     * purge, so a purge never waits and never takes part in a deadlock.
     * The rows it locked are deleted by their ctid (a TID scan, whatever
     * the table's size); the lock keeps each where it was found. */
    [ST_REC_PURGE] = {
        "idem_rec_purge", "ii",
        "DELETE FROM idem_record WHERE ctid = ANY (ARRAY(SELECT ctid"
        " FROM idem_record WHERE expires_ms <= $1 AND state <> 'PROCESSING'"
        " LIMIT $2 FOR UPDATE SKIP LOCKED))"},
    [ST_INBOX_INSERT] = {
        "idem_inbox_insert", "ttttiii",
        "INSERT INTO idem_inbox (grp, msg_id, biz_type, state, attempts,"
        " lease_until, created_ms, updated_ms)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $7)"
        " ON CONFLICT (grp, msg_id) DO NOTHING"
        " RETURNING state, attempts, lease_until, biz_type"},
    [ST_INBOX_GET] = {
        "idem_inbox_get", "tt",
        "SELECT state, attempts, lease_until, biz_type FROM idem_inbox"
        " WHERE grp = $1 AND msg_id = $2"},
    [ST_INBOX_CAS] = {
        "idem_inbox_cas", "tttiiitii",
        "UPDATE idem_inbox SET state = $3, attempts = $4, lease_until = $5,"
        " updated_ms = $6"
        " WHERE grp = $1 AND msg_id = $2 AND ($7 IS NULL OR state = $7)"
        " AND attempts = $8 AND ($9 = 0 OR lease_until <= $9)"
        " RETURNING state, attempts, lease_until, biz_type"},
    /* A batch in doubt (see settle): its rows are read in a transaction
     * that writes (a row rewritten as it is), so that its COMMIT waits for
     * the synchronous standby as a batch's does (a transaction that only
     * takes an xid writes no WAL, and waits for nothing); and the session
     * that was committing it, when the server is still the same, is ended
     * first (as long as it is listed: a PID alone could be another
     * session's by now). */
    [ST_XACT] = {"idem_xact", "",
                 "UPDATE idem_schema SET version = version WHERE version = 1"},
    [ST_TERMINATE] = {
        "idem_terminate", "ii",
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1"
        " AND (extract(epoch FROM backend_start) * 1000000)::bigint = $2"},
};

/* ---- the backend's state ---- */

enum job_kind {
    JOB_REC_INSERT,
    JOB_REC_CAS,
    JOB_REC_GET, /* a read in the batch: an asynchronous rec_get */
    JOB_REC_PURGE,
    JOB_INBOX_INSERT,
    JOB_INBOX_CAS,
    /* The operators' calls: never in a batch, each run alone on the
     * operators' connection (see "the operators' calls" below). */
    JOB_REC_DELETE,
    JOB_REC_LIST,
};

/* A write, queued by its caller, carried out by a writer. The caller's
 * arguments are borrowed; the answer is kept here until the batch is over,
 * and handed to the caller only if it committed. Once the batch is over
 * the writer calls over(j), or, for a caller that waits (over NULL), posts
 * done. */
struct job {
    struct idem__cq_item item; /* first: the queue's item is the job */
    enum job_kind kind;
    int table;             /* sort: 0 records, 1 inbox, 2 purge, last */
    const char *k1, *k2;   /* sort: (space, key) or (group, msg_id) */
    int64_t deadline;      /* monotonic ms: queued + timeout_ms */

    const struct idem__rec_new *rec_new;
    const struct idem__rec_cas *rec_cas;
    const struct idem__inbox_cas *inbox_cas;
    const char *biz_type, *state; /* inbox insert */
    unsigned attempts;
    int64_t lease_until, now;
    unsigned limit;
    int want_row;          /* rec_cas: read the row when not changed */
    uint64_t epoch;        /* rec_delete */
    int64_t updated_ms;    /* rec_delete: 0, or the row's as the caller saw it */
    const struct idem__rec_list *list;

    idem_rc rc;
    int hit;               /* inserted / changed */
    int found;
    unsigned count;        /* purged */
    idem_record_item *items; /* listed: nitems of them, handed to the caller */
    size_t nitems;
    struct job *admin_next; /* on the operators' queue */
    idem_record rec;
    idem_inbox_entry entry;
    char detail[256];
    void (*over)(struct job *j);
    sem_t done;
};

struct pg_db;
struct read_req;

struct writer {
    struct pg_db *db;
    PGconn *pg;
    /* Who pg's session is, for a batch in doubt: the server's start and
     * the session's (microseconds since 1970), and its PID. */
    int64_t server_start_us, session_start_us;
    int session_pid;
    struct idem__cq_item **items;
    struct job **batch;
    pthread_t thread;
    int started;
};

/* A pooled read connection. */
struct reader {
    struct reader *next;
    PGconn *pg;
};

struct pg_db {
    char *url;           /* the conninfo; never printed */
    char *password;      /* scrubbed from any message that might echo it */
    char where[160];     /* host:port, for messages */
    int64_t timeout_ms;
    unsigned batch_max, pool_size;

    pthread_mutex_t backoff_mu;
    int64_t down_until, backoff_ms; /* monotonic ms */
    char down_why[200];

    struct idem__cq q;   /* the writers' (commit_queue.h), and the counters */
    struct writer writers[WRITERS];

    struct idem__hint peek; /* see rec_peek */

    pthread_mutex_t pool_mu; /* the read queue and the idle readers */
    struct read_req *rq_head, **rq_tail;
    unsigned rq_len, serving;
    struct reader *idle;
    struct reader *readers; /* pool_size of them */

    pthread_mutex_t admin_mu; /* the operators' queue, and who drains it */
    struct job *admin_head, **admin_tail;
    int admin_draining;       /* a writer runs the operators' jobs */
    PGconn *admin;            /* the operators' connection: the drainer's alone */

    pthread_mutex_t repl_mu;  /* what the primary promises: read at each connect, */
    idem_replication repl;
    _Atomic int64_t settings_due; /* and again from then on (refresh_settings) */
};

/* ---- time, messages ---- */

/* A server or libpq message as one line, without the password. */
static void clean_message(const struct pg_db *d, const char *msg, char *out, size_t cap)
{
    size_t n = 0;
    const char *pw = d->password && *d->password ? d->password : NULL;
    size_t pwlen = pw ? strlen(pw) : 0;
    for (const char *p = msg ? msg : ""; *p && n + 1 < cap;) {
        if (pw && strncmp(p, pw, pwlen) == 0) {
            for (const char *s = "***"; *s && n + 1 < cap; s++)
                out[n++] = *s;
            p += pwlen;
            continue;
        }
        char c = *p++;
        if (c == '\n' || c == '\t' || c == '\r')
            c = ' ';
        if (c == ' ' && (n == 0 || out[n - 1] == ' '))
            continue;
        out[n++] = c;
    }
    while (n && out[n - 1] == ' ')
        n--;
    out[n] = '\0';
}

static idem_rc conn_fail(const struct pg_db *d, PGconn *pg, idem_rc rc, const char *doing)
{
    char msg[200];
    clean_message(d, pg ? PQerrorMessage(pg) : "", msg, sizeof msg);
    return idem__fail(rc, "postgres: %s: %s: %s", d->where, doing,
                      *msg ? msg : "connection lost");
}

static idem_rc timeout_fail(const struct pg_db *d, const char *doing)
{
    return idem__fail(IDEM_ETIMEDOUT, "postgres: %s: no answer within %lld ms %s",
                      d->where, (long long)d->timeout_ms, doing);
}

static void on_notice(void *arg, const PGresult *res)
{
    (void)arg;
    (void)res; /* "relation already exists, skipping" and the like */
}

/* ---- backoff ---- */

static idem_rc backoff_check(struct pg_db *d)
{
    pthread_mutex_lock(&d->backoff_mu);
    int64_t left = d->down_until - idem__mono_ms();
    char why[sizeof d->down_why];
    memcpy(why, d->down_why, sizeof why);
    pthread_mutex_unlock(&d->backoff_mu);
    if (left <= 0)
        return IDEM_OK;
    return idem__fail(IDEM_EUNAVAILABLE, "postgres: %s: unreachable, next attempt in %lld ms "
                                         "(%s)",
                      d->where, (long long)left, why);
}

static void backoff_failed(struct pg_db *d, const char *why)
{
    /* why is a detail of conn_fail's: keep what follows its prefix. */
    size_t wl = strlen(d->where);
    if (!strncmp(why, "postgres: ", 10) && !strncmp(why + 10, d->where, wl) &&
        !strncmp(why + 10 + wl, ": ", 2))
        why += 12 + wl;
    pthread_mutex_lock(&d->backoff_mu);
    d->backoff_ms = d->backoff_ms ? d->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (d->backoff_ms > BACKOFF_MAX_MS)
        d->backoff_ms = BACKOFF_MAX_MS;
    d->down_until = idem__mono_ms() + d->backoff_ms;
    snprintf(d->down_why, sizeof d->down_why, "%s", why);
    pthread_mutex_unlock(&d->backoff_mu);
}

static void backoff_ok(struct pg_db *d)
{
    pthread_mutex_lock(&d->backoff_mu);
    d->backoff_ms = 0;
    d->down_until = 0;
    pthread_mutex_unlock(&d->backoff_mu);
}

/* ---- non-blocking I/O against a deadline ---- */

/* 1: the socket is ready; 0: the deadline passed; -1: no socket. */
static int wait_socket(PGconn *pg, short events, int64_t deadline)
{
    int fd = PQsocket(pg);
    if (fd < 0)
        return -1;
    for (;;) {
        int64_t left = deadline - idem__mono_ms();
        if (left <= 0)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* Send everything libpq holds for the server. While the server does not take
 * it, read what it sends: it may be blocked writing results we do not read. */
static idem_rc flush_out(const struct pg_db *d, PGconn *pg, int64_t deadline, const char *doing)
{
    for (;;) {
        int f = PQflush(pg);
        if (f == 0)
            return IDEM_OK;
        if (f < 0)
            return conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
        int w = wait_socket(pg, POLLIN | POLLOUT, deadline);
        if (w == 0)
            return timeout_fail(d, doing);
        if (w < 0 || !PQconsumeInput(pg))
            return conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
    }
}

/* The next result, waiting for it no later than the deadline; NULL ends a
 * query's results. */
static idem_rc get_result(const struct pg_db *d, PGconn *pg, int64_t deadline,
                          const char *doing, PGresult **out)
{
    *out = NULL;
    while (PQisBusy(pg)) {
        int w = wait_socket(pg, POLLIN, deadline);
        if (w == 0)
            return timeout_fail(d, doing);
        if (w < 0 || !PQconsumeInput(pg))
            return conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
    }
    *out = PQgetResult(pg);
    if (!*out && PQstatus(pg) == CONNECTION_BAD)
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
    return IDEM_OK;
}

/* The error of a failed statement, mapped to an idem_rc. */
static idem_rc result_fail(const struct pg_db *d, PGconn *pg, const PGresult *r, const char *doing)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *primary = PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);
    char msg[200];
    clean_message(d, primary ? primary : PQresultErrorMessage(r), msg, sizeof msg);
    idem_rc rc = IDEM_ESTORE;
    if (PQstatus(pg) == CONNECTION_BAD || (state && (!strncmp(state, "08", 2) ||
                                                    !strncmp(state, "57P", 3))))
        rc = IDEM_EUNAVAILABLE;
    else if (state && !strcmp(state, "57014"))
        rc = IDEM_ETIMEDOUT;
    else if (state && !strcmp(state, "53200"))
        rc = IDEM_ENOMEM;
    return idem__fail(rc, "postgres: %s: %s: %s (SQLSTATE %s)", d->where, doing,
                      *msg ? msg : "failed", state ? state : "none");
}

/* Run SQL with the simple protocol (outside pipeline mode) and wait for all
 * of it. *last, if not NULL, receives the last rows returned. */
static idem_rc exec_simple(const struct pg_db *d, PGconn *pg, const char *sql,
                           int64_t deadline, const char *doing, PGresult **last)
{
    idem_rc rc = IDEM_OK, first = IDEM_OK;
    char detail[256] = "";
    if (last)
        *last = NULL;
    if (!PQsendQuery(pg, sql))
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
    if ((rc = flush_out(d, pg, deadline, doing)) != IDEM_OK)
        return rc;
    for (;;) {
        PGresult *r;
        if ((rc = get_result(d, pg, deadline, doing, &r)) != IDEM_OK)
            return rc;
        if (!r)
            break;
        ExecStatusType st = PQresultStatus(r);
        if (st == PGRES_TUPLES_OK && last) {
            PQclear(*last);
            *last = r;
            continue;
        }
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && first == IDEM_OK) {
            first = result_fail(d, pg, r, doing);
            snprintf(detail, sizeof detail, "%s", idem_errdetail());
        }
        PQclear(r);
    }
    if (first != IDEM_OK) {
        if (last) {
            PQclear(*last);
            *last = NULL;
        }
        return idem__fail(first, "%s", detail);
    }
    return IDEM_OK;
}

/* ---- connections ---- */

static void conn_close(PGconn **pg)
{
    if (*pg)
        PQfinish(*pg);
    *pg = NULL;
}

/* An idle connection is owed nothing, so anything its socket has to read
 * means the server has ended the session: a shutdown or a crash sends a
 * notice or an error and closes, a timeout an error. The connection is
 * closed here, unread, and the caller opens another. Reading it to see
 * would not do: libpq takes the message and stops short of the end of file
 * behind it, so the connection still looks good until its next statement
 * fails. One poll(), no round trip. */
static void conn_check_idle(PGconn **pg)
{
    if (!*pg)
        return;
    struct pollfd p = {.fd = PQsocket(*pg), .events = POLLIN};
    int n = -1;
    if (PQstatus(*pg) == CONNECTION_OK && p.fd >= 0)
        while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR)
            ;
    if (n != 0)
        conn_close(pg);
}

static idem_rc prepare(const struct pg_db *d, PGconn *pg, int which, int64_t deadline)
{
    Oid types[PARAMS_MAX];
    int n = 0;
    for (const char *t = stmts[which].types; *t; t++)
        types[n++] = *t == 't' ? 25 : *t == 'b' ? 17 : *t == 'i' ? 20 : 16;
    if (!PQsendPrepare(pg, stmts[which].name, stmts[which].sql, n, types))
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, "preparing statements");
    idem_rc rc = flush_out(d, pg, deadline, "preparing statements");
    idem_rc first = IDEM_OK;
    char detail[256] = "";
    while (rc == IDEM_OK) {
        PGresult *r;
        if ((rc = get_result(d, pg, deadline, "preparing statements", &r)) != IDEM_OK || !r)
            break;
        if (PQresultStatus(r) != PGRES_COMMAND_OK && first == IDEM_OK) {
            first = result_fail(d, pg, r, stmts[which].name);
            snprintf(detail, sizeof detail, "%s", idem_errdetail());
        }
        PQclear(r);
    }
    if (rc == IDEM_OK && first != IDEM_OK)
        rc = idem__fail(first, "%s", detail);
    return rc;
}

/* Connect, in no more than until the deadline. During a backoff, fail at
 * once. A refused or failed connect starts or lengthens the backoff. */
static idem_rc conn_open(struct pg_db *d, int64_t deadline, PGconn **out)
{
    *out = NULL;
    idem_rc rc = backoff_check(d);
    if (rc != IDEM_OK)
        return rc;
    const char *const keys[] = {"fallback_application_name", "dbname", NULL};
    const char *const vals[] = {"idem", d->url, NULL};
    PGconn *pg = PQconnectStartParams(keys, vals, 1);
    if (!pg)
        return idem__fail(IDEM_ENOMEM, "postgres: allocating a connection");
    PQsetNoticeReceiver(pg, on_notice, NULL);
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    while (PQstatus(pg) != CONNECTION_BAD && st != PGRES_POLLING_OK &&
           st != PGRES_POLLING_FAILED) {
        int w = wait_socket(pg, st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline);
        if (w == 0) {
            rc = idem__fail(IDEM_EUNAVAILABLE, "postgres: %s: no connection within %lld ms",
                            d->where, (long long)d->timeout_ms);
            goto fail;
        }
        if (w < 0)
            break;
        st = PQconnectPoll(pg);
    }
    if (PQstatus(pg) != CONNECTION_OK) {
        rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "connecting");
        goto fail;
    }
    if (PQsetnonblocking(pg, 1) != 0) {
        rc = conn_fail(d, pg, IDEM_ESTORE, "setting up the connection");
        goto fail;
    }
    /* A server that notices our socket close while a statement waits ends
     * the transaction instead of running on for nobody (PostgreSQL 14+,
     * where the platform allows; without it, nothing is lost but time). */
    if (PQserverVersion(pg) >= 140000 &&
        (rc = exec_simple(d, pg, "SET client_connection_check_interval = 1000", deadline,
                          "setting up the connection", NULL)) != IDEM_OK &&
        rc != IDEM_ESTORE)
        goto fail;
    backoff_ok(d);
    *out = pg;
    return IDEM_OK;
fail:
    if (rc == IDEM_EUNAVAILABLE)
        backoff_failed(d, idem_errdetail());
    PQfinish(pg);
    return rc;
}

static idem_rc migrate(struct pg_db *d, PGconn *pg, int64_t deadline);

/* What the server w's connection pg is connected to promises about an
 * acknowledged commit on a failover: synchronous only with a synchronous
 * standby named and synchronous_commit at on or remote_apply (below on,
 * off, local and remote_write acknowledge before the standby has the
 * commit durably). And who the session is, for a batch in doubt. */
static void note_replication(struct pg_db *d, const char *commit, const char *standbys);

/* The two settings, first in read_server's query, alone in
 * refresh_settings'. */
#define SETTINGS_SQL                                                                    \
    "SELECT current_setting('synchronous_commit'),"                                     \
    " current_setting('synchronous_standby_names')"

static idem_rc read_server(struct writer *w, PGconn *pg, int64_t deadline)
{
    struct pg_db *d = w->db;
    PGresult *r = NULL;
    idem_rc rc = exec_simple(d, pg,
                             SETTINGS_SQL ","
                             " (extract(epoch FROM pg_postmaster_start_time()) * 1000000)"
                             "::bigint, (SELECT (extract(epoch FROM backend_start) * 1000000)"
                             "::bigint FROM pg_stat_activity WHERE pid = pg_backend_pid())",
                             deadline, "reading synchronous_commit", &r);
    if (rc != IDEM_OK || !r || PQntuples(r) != 1) {
        PQclear(r);
        return rc;
    }
    w->server_start_us = strtoll(PQgetvalue(r, 0, 2), NULL, 10);
    w->session_start_us = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    w->session_pid = PQbackendPID(pg);
    note_replication(d, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
    PQclear(r);
    atomic_store(&d->settings_due, idem__mono_ms() + SETTINGS_EVERY_MS);
    return IDEM_OK;
}

/* What the primary promises, as its two settings say (read_server, and
 * again every SETTINGS_EVERY_MS: refresh_settings). */
static void note_replication(struct pg_db *d, const char *commit, const char *standbys)
{
    idem_replication v;
    memset(&v, 0, sizeof v);
    v.known = 1;
    idem__copy(v.synchronous_commit, sizeof v.synchronous_commit, commit);
    idem__copy(v.synchronous_standby_names, sizeof v.synchronous_standby_names, standbys);
    int on = strcmp(v.synchronous_commit, "on") == 0 ||
             strcmp(v.synchronous_commit, "remote_apply") == 0;
    v.synchronous = on && v.synchronous_standby_names[0] != '\0';
    if (!v.synchronous_standby_names[0])
        snprintf(v.why, sizeof v.why,
                 "%s has no synchronous standby (synchronous_standby_names is empty): a commit "
                 "is acknowledged before any standby has it, and a failover can lose it",
                 d->where);
    else if (!on)
        snprintf(v.why, sizeof v.why,
                 "%s acknowledges a commit with synchronous_commit = %s, before its synchronous "
                 "standby has it durably: a failover can lose it",
                 d->where, v.synchronous_commit);
    pthread_mutex_lock(&d->repl_mu);
    d->repl = v;
    pthread_mutex_unlock(&d->repl_mu);
}

static void replication(void *db, idem_replication *out)
{
    struct pg_db *d = db;
    pthread_mutex_lock(&d->repl_mu);
    *out = d->repl;
    pthread_mutex_unlock(&d->repl_mu);
}

/* A writer's connection: every statement prepared, in pipeline mode. The
 * first one made at open migrates the schema before it prepares; each
 * reads what the server promises of a commit (a reconnect after a failover
 * finds the new primary's). */
static idem_rc writer_connect(struct writer *w, int64_t deadline, int migrate_first)
{
    struct pg_db *d = w->db;
    PGconn *pg = NULL;
    idem_rc rc = conn_open(d, deadline, &pg);
    if (rc == IDEM_OK && migrate_first)
        rc = migrate(d, pg, deadline);
    if (rc == IDEM_OK)
        rc = read_server(w, pg, deadline);
    for (int i = 0; rc == IDEM_OK && i < ST_COUNT_; i++)
        rc = prepare(d, pg, i, deadline);
    if (rc == IDEM_OK && !PQenterPipelineMode(pg))
        rc = conn_fail(d, pg, IDEM_ESTORE, "entering pipeline mode");
    if (rc != IDEM_OK) {
        if (pg)
            PQfinish(pg);
        return rc;
    }
    w->pg = pg;
    return IDEM_OK;
}

/* ---- parameters and rows ---- */

struct params {
    int n;
    const char *val[PARAMS_MAX];
    int len[PARAMS_MAX];
    int fmt[PARAMS_MAX];
    uint64_t ints[PARAMS_MAX];
    char bools[PARAMS_MAX];
};

static void p_text(struct params *p, const char *s)
{
    p->val[p->n] = s;
    p->len[p->n] = s ? (int)strlen(s) : 0;
    p->fmt[p->n++] = 1;
}

static void p_bytes(struct params *p, const void *b, size_t n)
{
    p->val[p->n] = b;
    p->len[p->n] = (int)n;
    p->fmt[p->n++] = 1;
}

static void p_int(struct params *p, int64_t v)
{
    p->ints[p->n] = htobe64((uint64_t)v);
    p_bytes(p, &p->ints[p->n], 8);
}

static void p_bool(struct params *p, int v)
{
    p->bools[p->n] = v ? 1 : 0;
    p_bytes(p, &p->bools[p->n], 1);
}

static int send_stmt(PGconn *pg, int which, const struct params *p)
{
    return PQsendQueryPrepared(pg, stmts[which].name, p->n, p->val, p->len, p->fmt, 1);
}

static int send_get(PGconn *pg, int which, const char *a, const char *b)
{
    struct params p = {0};
    p_text(&p, a);
    p_text(&p, b);
    return send_stmt(pg, which, &p);
}

/* Binary bigint; NULL reads as 0. -1 if the column is not a bigint. */
static int col_int(const PGresult *r, int col, int64_t *v)
{
    *v = 0;
    if (PQgetisnull(r, 0, col))
        return 0;
    if (PQfformat(r, col) != 1 || PQgetlength(r, 0, col) != 8)
        return -1;
    uint64_t be;
    memcpy(&be, PQgetvalue(r, 0, col), 8);
    *v = (int64_t)be64toh(be);
    return 0;
}

static void col_text(const PGresult *r, int col, char *dst, size_t cap)
{
    size_t n = PQgetisnull(r, 0, col) ? 0 : (size_t)PQgetlength(r, 0, col);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, PQgetvalue(r, 0, col), n);
    dst[n] = '\0';
}

/* A row of ST_REC_GET into *rec; its result allocated for the caller. */
static idem_rc parse_record(const PGresult *r, idem_record *rec)
{
    int64_t v[5];
    memset(rec, 0, sizeof *rec);
    if (PQnfields(r) != 9 || col_int(r, 1, &v[0]) || col_int(r, 3, &v[1]) ||
        col_int(r, 4, &v[2]) || col_int(r, 5, &v[3]) || col_int(r, 6, &v[4]))
        return idem__fail(IDEM_ESTORE, "postgres: idem_record row of an unexpected shape");
    col_text(r, 0, rec->state, sizeof rec->state);
    rec->epoch = (uint64_t)v[0];
    col_text(r, 2, rec->owner, sizeof rec->owner);
    rec->lease_until_ms = v[1];
    rec->created_ms = v[2];
    rec->updated_ms = v[3];
    rec->expires_ms = v[4];
    if (!PQgetisnull(r, 0, 7) && PQgetlength(r, 0, 7) == IDEM_FINGERPRINT_LEN) {
        rec->has_fingerprint = 1;
        memcpy(rec->fingerprint, PQgetvalue(r, 0, 7), IDEM_FINGERPRINT_LEN);
    }
    size_t n = PQgetisnull(r, 0, 8) ? 0 : (size_t)PQgetlength(r, 0, 8);
    if (n) {
        rec->result = idem__malloc(n);
        if (!rec->result)
            return idem__fail(IDEM_ENOMEM, "records: reading a %zu-byte result", n);
        memcpy(rec->result, PQgetvalue(r, 0, 8), n);
        rec->result_len = n;
    }
    return IDEM_OK;
}

static idem_rc parse_inbox(const PGresult *r, idem_inbox_entry *e)
{
    int64_t attempts, lease;
    memset(e, 0, sizeof *e);
    if (PQnfields(r) != 4 || col_int(r, 1, &attempts) || col_int(r, 2, &lease))
        return idem__fail(IDEM_ESTORE, "postgres: idem_inbox row of an unexpected shape");
    col_text(r, 0, e->state, sizeof e->state);
    e->attempts = (unsigned)attempts;
    e->lease_until_ms = lease;
    col_text(r, 3, e->biz_type, sizeof e->biz_type);
    return IDEM_OK;
}

static unsigned cmd_rows(const PGresult *r)
{
    return (unsigned)strtoul(PQcmdTuples((PGresult *)r), NULL, 10);
}

/* ---- a writer's batch ---- */

static void job_reset(struct job *j)
{
    idem__free(j->rec.result);
    memset(&j->rec, 0, sizeof j->rec);
    idem__free(j->items);
    j->items = NULL;
    j->nitems = 0;
    memset(&j->entry, 0, sizeof j->entry);
    j->rc = IDEM_OK;
    j->hit = j->found = 0;
    j->count = 0;
    j->detail[0] = '\0';
}

static void job_fail(struct job *j, idem_rc rc, const char *detail)
{
    job_reset(j);
    j->rc = rc;
    snprintf(j->detail, sizeof j->detail, "%s", detail);
}

/* Phase 1: queue job j's write. */
static int send_write(PGconn *pg, const struct job *j)
{
    struct params p = {0};
    switch (j->kind) {
    case JOB_REC_INSERT: {
        const struct idem__rec_new *n = j->rec_new;
        p_text(&p, n->space);
        p_text(&p, n->key);
        p_bytes(&p, n->fingerprint, n->fingerprint ? IDEM_FINGERPRINT_LEN : 0);
        p_int(&p, (int64_t)n->epoch);
        p_text(&p, n->owner);
        p_int(&p, n->lease_until);
        p_int(&p, n->now);
        return send_stmt(pg, ST_REC_INSERT, &p);
    }
    case JOB_REC_GET:
        return send_get(pg, ST_REC_GET, j->k1, j->k2);
    case JOB_REC_CAS: {
        const struct idem__rec_cas *c = j->rec_cas;
        p_text(&p, c->space);
        p_text(&p, c->key);
        p_text(&p, c->state);
        p_int(&p, (int64_t)c->epoch);
        p_text(&p, c->owner);
        p_int(&p, c->lease_until);
        p_bool(&p, c->set_result);
        p_bytes(&p, c->set_result && c->result_len ? c->result : NULL,
                c->set_result ? c->result_len : 0);
        p_int(&p, c->expires_ms);
        p_int(&p, c->now);
        p_text(&p, c->expect_state);
        p_int(&p, (int64_t)c->expect_epoch);
        p_int(&p, c->lease_expired_at);
        p_bytes(&p, c->fingerprint, c->fingerprint ? IDEM_FINGERPRINT_LEN : 0);
        return send_stmt(pg, ST_REC_CAS, &p);
    }
    case JOB_REC_PURGE:
        p_int(&p, j->now);
        p_int(&p, j->limit);
        return send_stmt(pg, ST_REC_PURGE, &p);
    case JOB_INBOX_INSERT:
        p_text(&p, j->k1);
        p_text(&p, j->k2);
        p_text(&p, j->biz_type ? j->biz_type : "");
        p_text(&p, j->state);
        p_int(&p, j->attempts);
        p_int(&p, j->lease_until);
        p_int(&p, j->now);
        return send_stmt(pg, ST_INBOX_INSERT, &p);
    case JOB_INBOX_CAS: {
        const struct idem__inbox_cas *c = j->inbox_cas;
        p_text(&p, c->group);
        p_text(&p, c->msg_id);
        p_text(&p, c->state);
        p_int(&p, c->attempts);
        p_int(&p, c->lease_until);
        p_int(&p, c->now);
        p_text(&p, c->expect_state);
        p_int(&p, c->expect_attempts);
        p_int(&p, c->lease_expired_at);
        return send_stmt(pg, ST_INBOX_CAS, &p);
    }
    case JOB_REC_DELETE: /* never in a batch (writer_main) */
    case JOB_REC_LIST:
        break;
    }
    return 0;
}

/* Phase 1's answer: was the write made? An inbox write returns its row. */
static void read_write(struct job *j, const PGresult *r)
{
    j->hit = cmd_rows(r) == 1;
    switch (j->kind) {
    case JOB_REC_GET:
        j->hit = 0;
        j->found = PQntuples(r) == 1;
        if (j->found)
            j->rc = parse_record(r, &j->rec);
        break;
    case JOB_REC_INSERT:
    case JOB_REC_CAS:
        j->found = 1;
        break;
    case JOB_REC_PURGE:
        j->count = cmd_rows(r);
        break;
    case JOB_INBOX_INSERT:
    case JOB_INBOX_CAS:
        if (j->hit && (j->rc = parse_inbox(r, &j->entry)) == IDEM_OK)
            j->found = 1;
        break;
    case JOB_REC_DELETE:
    case JOB_REC_LIST:
        break;
    }
    if (j->rc != IDEM_OK)
        snprintf(j->detail, sizeof j->detail, "%s", idem_errdetail());
}

/* Whether phase 2 reads the row: the write was not made and the caller
 * wants the row as it stands. */
static int needs_read(const struct job *j)
{
    if (j->rc != IDEM_OK || j->hit || j->kind == JOB_REC_PURGE || j->kind == JOB_REC_GET)
        return 0;
    return j->kind != JOB_REC_CAS || j->want_row;
}

static int send_read(PGconn *pg, const struct job *j)
{
    return send_get(pg, j->table == 0 ? ST_REC_GET : ST_INBOX_GET, j->k1, j->k2);
}

/* Phase 2's answer: the row as it stands, after the write that was not made. */
static void read_read(struct job *j, const PGresult *r)
{
    /* An insert that was not made and then finds no row: the row it met
     * was deleted (purged) in between; its caller tries again. */
    j->found = PQntuples(r) == 1;
    if (j->found)
        j->rc = j->table == 0 ? parse_record(r, &j->rec) : parse_inbox(r, &j->entry);
    if (j->rc != IDEM_OK)
        snprintf(j->detail, sizeof j->detail, "%s", idem_errdetail());
}

/* The first statement of a batch that failed, and whose it was. */
struct batch_error {
    idem_rc rc;            /* IDEM_OK: none failed */
    int job;               /* index of the job, or -1 (BEGIN, COMMIT) */
    int stale;             /* a connection kept from before broke, and nothing
                              can have been committed: see run_batch */
    int in_doubt;          /* it broke (or timed out) once COMMIT was queued:
                              see settle */
    char sqlstate[6];
    char detail[256];
};

/* Take the result of the pipeline's next statement. *out is NULL when the
 * statement did not run or failed (the failure is noted in e). Returns an
 * error only when the connection broke or the deadline passed. */
static idem_rc next_statement(const struct pg_db *d, PGconn *pg, int64_t deadline,
                              int job, struct batch_error *e, PGresult **out)
{
    PGresult *r, *end;
    *out = NULL;
    idem_rc rc = get_result(d, pg, deadline, "running a batch", &r);
    if (rc != IDEM_OK)
        return rc;
    if (!r)
        return idem__fail(IDEM_ESTORE, "postgres: %s: a batch's results ended early", d->where);
    /* Each statement's results end with a NULL. */
    rc = get_result(d, pg, deadline, "running a batch", &end);
    if (rc == IDEM_OK && end) {
        PQclear(end);
        rc = idem__fail(IDEM_ESTORE, "postgres: %s: a statement gave two results", d->where);
    }
    if (rc != IDEM_OK) {
        PQclear(r);
        return rc;
    }
    ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
        *out = r;
        return IDEM_OK;
    }
    if (st != PGRES_PIPELINE_ABORTED && e->rc == IDEM_OK) {
        const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        e->rc = result_fail(d, pg, r, "running a batch");
        e->job = job;
        snprintf(e->sqlstate, sizeof e->sqlstate, "%s", state ? state : "");
        snprintf(e->detail, sizeof e->detail, "%s", idem_errdetail());
    }
    PQclear(r);
    if (PQstatus(pg) == CONNECTION_BAD)
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, "running a batch");
    return IDEM_OK;
}

/* The result of the Sync that ends a pipeline's segment. */
static idem_rc sync_point(const struct pg_db *d, PGconn *pg, int64_t deadline)
{
    PGresult *r;
    idem_rc rc = get_result(d, pg, deadline, "running a batch", &r);
    if (rc == IDEM_OK && (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC))
        rc = idem__fail(IDEM_ESTORE, "postgres: %s: a batch's results out of step", d->where);
    PQclear(r);
    return rc;
}

/* Flush what is queued and take the results of BEGIN or COMMIT (job -1). */
static idem_rc take_command(const struct pg_db *d, PGconn *pg, int64_t deadline,
                            struct batch_error *e)
{
    PGresult *r;
    idem_rc rc = next_statement(d, pg, deadline, -1, e, &r);
    PQclear(r);
    return rc;
}

/* After a failed statement the transaction is aborted, not ended. */
static idem_rc end_aborted(const struct pg_db *d, PGconn *pg, int64_t deadline)
{
    if (PQtransactionStatus(pg) == PQTRANS_IDLE)
        return IDEM_OK;
    struct params none = {0};
    struct batch_error e = {.rc = IDEM_OK};
    if (!send_stmt(pg, ST_ROLLBACK, &none) || !PQpipelineSync(pg))
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, "rolling back");
    idem_rc rc = flush_out(d, pg, deadline, "rolling back");
    if (rc == IDEM_OK)
        rc = take_command(d, pg, deadline, &e);
    if (rc == IDEM_OK)
        rc = sync_point(d, pg, deadline);
    return rc != IDEM_OK ? rc : e.rc;
}

/* One try at a batch, in one transaction and two round trips:
 *
 *   1. BEGIN, every job's write, Sync — and read whether each was made;
 *   2. a read of the row for each write that was not, COMMIT, Sync.
 *
 * The second trip carries only COMMIT when every write was made, as it is
 * under ordinary load; a read for every job in one trip would cost a
 * statement per job for rows nobody looks at. IDEM_OK: committed.
 * Otherwise nothing was (or, after a timeout, it is unknown), e says which
 * statement failed if one did, and the connection is dropped unless it is
 * still in step.
 *
 * Until COMMIT is queued nothing can be committed, whatever reached the
 * server: a transaction whose session ends is rolled back. A broken
 * connection up to there fails the try with IDEM_EUNAVAILABLE, and sets
 * e->stale when the connection was kept from an earlier batch (it died
 * while idle, in a way the check before use did not show). From the moment
 * COMMIT is queued, a broken connection leaves the outcome unknown
 * (IDEM_ETIMEDOUT). */
static idem_rc run_once(struct writer *w, struct job **jobs, unsigned n, int64_t deadline,
                        struct batch_error *e)
{
    struct pg_db *d = w->db;
    struct params none = {0};
    PGresult *r;
    idem_rc rc;
    int committing = 0;
    e->rc = IDEM_OK;
    e->job = -1;
    e->stale = 0;
    e->in_doubt = 0;
    conn_check_idle(&w->pg);
    int kept = w->pg != NULL;
    if (!kept && (rc = writer_connect(w, deadline, 0)) != IDEM_OK)
        return rc;
    PGconn *pg = w->pg;

    int sent = send_stmt(pg, ST_BEGIN, &none);
    for (unsigned i = 0; sent && i < n; i++)
        sent = send_write(pg, jobs[i]);
    if (!sent || !PQpipelineSync(pg)) {
        rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "sending a batch");
        goto drop;
    }
    if ((rc = flush_out(d, pg, deadline, "sending a batch")) != IDEM_OK ||
        (rc = take_command(d, pg, deadline, e)) != IDEM_OK)
        goto drop;
    for (unsigned i = 0; i < n; i++) {
        if ((rc = next_statement(d, pg, deadline, (int)i, e, &r)) != IDEM_OK)
            goto drop;
        if (r)
            read_write(jobs[i], r);
        PQclear(r);
    }
    if ((rc = sync_point(d, pg, deadline)) != IDEM_OK)
        goto drop;
    if (e->rc != IDEM_OK)
        goto aborted;

    sent = 1;
    for (unsigned i = 0; sent && i < n; i++)
        if (needs_read(jobs[i]))
            sent = send_read(pg, jobs[i]);
    /* Queueing the reads may have written to the socket and found it
     * closed; then COMMIT is never queued. */
    if (!sent || PQstatus(pg) != CONNECTION_OK) {
        rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "sending a batch");
        goto drop;
    }
    /* From here on COMMIT may reach the server: a failure before its
     * answer leaves the batch's outcome unknown (see drop). */
    committing = 1;
    if (!send_stmt(pg, ST_COMMIT, &none) || !PQpipelineSync(pg)) {
        rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "sending a batch");
        goto drop;
    }
    if ((rc = flush_out(d, pg, deadline, "committing a batch")) != IDEM_OK)
        goto drop;
    for (unsigned i = 0; i < n; i++) {
        if (!needs_read(jobs[i]))
            continue;
        if ((rc = next_statement(d, pg, deadline, (int)i, e, &r)) != IDEM_OK)
            goto drop;
        if (r)
            read_read(jobs[i], r);
        PQclear(r);
    }
    if ((rc = take_command(d, pg, deadline, e)) != IDEM_OK ||
        (rc = sync_point(d, pg, deadline)) != IDEM_OK)
        goto drop;
    if (e->rc == IDEM_OK)
        return IDEM_OK;
aborted:
    if ((rc = end_aborted(d, pg, deadline)) != IDEM_OK)
        goto drop;
    return idem__fail(e->rc, "%s", e->detail);
drop:
    conn_close(&w->pg);
    e->in_doubt = committing;
    if (committing && rc != IDEM_ETIMEDOUT) {
        /* Not "unavailable": the batch may have committed. */
        char why[256];
        snprintf(why, sizeof why, "%s", idem_errdetail());
        rc = idem__fail(IDEM_ETIMEDOUT, "%s; the batch was being committed and may have "
                        "been", why);
    } else if (!committing && kept && rc == IDEM_EUNAVAILABLE) {
        e->stale = 1;
    }
    return rc;
}

static int job_order(const void *a, const void *b)
{
    const struct job *x = *(const struct job *const *)a, *y = *(const struct job *const *)b;
    if (x->table != y->table)
        return x->table < y->table ? -1 : 1;
    int c = strcmp(x->k1 ? x->k1 : "", y->k1 ? y->k1 : "");
    if (!c)
        c = strcmp(x->k2 ? x->k2 : "", y->k2 ? y->k2 : "");
    if (!c)
        c = x->item.seq < y->item.seq ? -1 : x->item.seq > y->item.seq;
    return c;
}

/* Drop jobs[i] from the batch, keeping the order of the rest. */
static void remove_job(struct job **jobs, unsigned *n, unsigned i)
{
    memmove(&jobs[i], &jobs[i + 1], (*n - i - 1) * sizeof *jobs);
    (*n)--;
}

/* ---- a batch in doubt ----
 *
 * A batch whose connection broke, or whose answer did not come in time,
 * once its COMMIT was queued may or may not have committed, and may yet, on
 * the server it was sent to. Failing it (IDEM_ETIMEDOUT, "it may have
 * happened") costs the callers dearly: a begin whose claim did commit holds
 * a key no request executes until the lease ends, and on a hold route for
 * good. Running it again would meet its own writes and take them for
 * another's. So the writer finds out, on a new connection, for up to
 * SETTLE_MS:
 *
 *   1. When the new connection is to the same server (its postmaster
 *      started at the same instant), the session that was committing is
 *      ended first (pg_terminate_backend) and waited for: until it has
 *      gone its COMMIT may still land. On another server (a standby
 *      promoted, libpq's multi-host URL finding it) or the same one
 *      restarted, that session is gone with its server.
 *   2. Each job's row is read, in a transaction that writes (ST_XACT): its
 *      COMMIT waits for the synchronous standby as the batch's would have,
 *      so a row read here is durable where the batch's had to be. A
 *      standby still in recovery refuses the write, and the writer tries
 *      again.
 *   3. A job whose row holds what its write would have written (applied())
 *      is answered as made; the others run again, as a batch of their
 *      own, deciding on the rows as they are now: the same first run that
 *      a batch that never committed would have had.
 *
 * When no primary answers within SETTLE_MS, or the handle closes, the
 * batch fails IDEM_ETIMEDOUT as before. The batch's other writer goes on
 * meanwhile. */

/* Whether j's write is in the row read back for it (j->rec or j->entry):
 * the row holds what the write would have written. */
static int applied(const struct job *j)
{
    if (j->rc != IDEM_OK || !j->found)
        return 0;
    switch (j->kind) {
    case JOB_REC_INSERT: {
        const struct idem__rec_new *n = j->rec_new;
        return j->rec.epoch == n->epoch && strcmp(j->rec.owner, n->owner) == 0 &&
               j->rec.created_ms == n->now;
    }
    case JOB_REC_CAS: {
        const struct idem__rec_cas *c = j->rec_cas;
        uint64_t epoch = c->epoch ? c->epoch : c->expect_epoch;
        return strcmp(j->rec.state, c->state) == 0 && (!epoch || j->rec.epoch == epoch) &&
               (!c->owner || strcmp(j->rec.owner, c->owner) == 0) &&
               j->rec.lease_until_ms == c->lease_until && j->rec.updated_ms == c->now;
    }
    case JOB_INBOX_INSERT:
        return strcmp(j->entry.state, j->state) == 0 && j->entry.attempts == j->attempts &&
               j->entry.lease_until_ms == j->lease_until;
    case JOB_INBOX_CAS: {
        const struct idem__inbox_cas *c = j->inbox_cas;
        return strcmp(j->entry.state, c->state) == 0 && j->entry.attempts == c->attempts &&
               j->entry.lease_until_ms == c->lease_until;
    }
    default: /* a read, a purge: run again */
        return 0;
    }
}

static int writes_a_row(const struct job *j)
{
    return j->kind == JOB_REC_INSERT || j->kind == JOB_REC_CAS ||
           j->kind == JOB_INBOX_INSERT || j->kind == JOB_INBOX_CAS;
}

/* Step 1: on the server the batch ran on, end the session that ran it and
 * wait until it is no longer listed. */
static idem_rc end_session(struct writer *w, int64_t server_us, int64_t session_us, int pid,
                           int64_t deadline)
{
    struct pg_db *d = w->db;
    if (w->server_start_us != server_us)
        return IDEM_OK;
    for (;;) {
        struct params p = {0};
        struct batch_error e = {.rc = IDEM_OK};
        PGresult *r = NULL;
        p_int(&p, pid);
        p_int(&p, session_us);
        if (!send_stmt(w->pg, ST_TERMINATE, &p) || !PQpipelineSync(w->pg))
            return conn_fail(d, w->pg, IDEM_EUNAVAILABLE, "ending a batch's session");
        idem_rc rc = flush_out(d, w->pg, deadline, "ending a batch's session");
        if (rc == IDEM_OK)
            rc = next_statement(d, w->pg, deadline, -1, &e, &r);
        int listed = r && PQntuples(r) > 0;
        PQclear(r);
        if (rc == IDEM_OK)
            rc = sync_point(d, w->pg, deadline);
        if (rc == IDEM_OK && e.rc != IDEM_OK)
            rc = idem__fail(e.rc, "%s", e.detail);
        if (rc != IDEM_OK || !listed)
            return rc;
        if (idem__mono_ms() >= deadline)
            return timeout_fail(d, "for a batch's session to end");
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Step 2: each job's row, read in a transaction that writes. */
static idem_rc read_back(struct writer *w, struct job **jobs, unsigned n, int64_t deadline)
{
    struct pg_db *d = w->db;
    PGconn *pg = w->pg;
    struct params none = {0};
    struct batch_error e = {.rc = IDEM_OK, .job = -1};
    PGresult *r;
    int sent = send_stmt(pg, ST_BEGIN, &none) && send_stmt(pg, ST_XACT, &none);
    for (unsigned i = 0; sent && i < n; i++)
        if (writes_a_row(jobs[i]))
            sent = send_read(pg, jobs[i]);
    if (!sent || !send_stmt(pg, ST_COMMIT, &none) || !PQpipelineSync(pg))
        return conn_fail(d, pg, IDEM_EUNAVAILABLE, "reading a batch back");
    idem_rc rc = flush_out(d, pg, deadline, "reading a batch back");
    if (rc == IDEM_OK)
        rc = take_command(d, pg, deadline, &e);
    if (rc == IDEM_OK)
        rc = take_command(d, pg, deadline, &e);
    for (unsigned i = 0; rc == IDEM_OK && i < n; i++) {
        if (!writes_a_row(jobs[i]))
            continue;
        if ((rc = next_statement(d, pg, deadline, (int)i, &e, &r)) == IDEM_OK && r)
            read_read(jobs[i], r);
        PQclear(r);
    }
    if (rc == IDEM_OK)
        rc = take_command(d, pg, deadline, &e);
    if (rc == IDEM_OK)
        rc = sync_point(d, pg, deadline);
    if (rc == IDEM_OK && e.rc != IDEM_OK) {
        (void)end_aborted(d, pg, deadline);
        rc = idem__fail(e.rc, "%s", e.detail);
    }
    return rc;
}

static int stopping(struct pg_db *d)
{
    pthread_mutex_lock(&d->q.mu);
    int stop = d->q.stopping;
    pthread_mutex_unlock(&d->q.mu);
    return stop;
}

/* Settle jobs[0..*n) of a batch in doubt, until `until`: IDEM_OK with the
 * jobs whose writes committed moved past *n, answered as made, and the
 * rest in jobs[0..*n) to run again; otherwise an error (why: the batch's
 * failure, which stays the answer). */
static idem_rc settle(struct writer *w, struct job **jobs, unsigned *n, int64_t until)
{
    struct pg_db *d = w->db;
    int64_t server_us = w->server_start_us, session_us = w->session_start_us;
    int pid = w->session_pid;
    idem_rc rc = IDEM_ETIMEDOUT;
    while (!stopping(d)) {
        int64_t now = idem__mono_ms();
        if (now >= until)
            break;
        int64_t deadline = now + d->timeout_ms < until ? now + d->timeout_ms : until;
        conn_close(&w->pg);
        rc = writer_connect(w, deadline, 0);
        if (rc == IDEM_OK)
            rc = end_session(w, server_us, session_us, pid, deadline);
        if (rc == IDEM_OK)
            rc = read_back(w, jobs, *n, deadline);
        if (rc == IDEM_OK)
            break;
        conn_close(&w->pg);
        for (unsigned i = 0; i < *n; i++)
            job_reset(jobs[i]);
        struct timespec ts = {0, BACKOFF_MIN_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (rc != IDEM_OK)
        return rc;
    for (unsigned i = 0; i < *n;) {
        struct job *j = jobs[i];
        if (applied(j)) {
            j->hit = 1;
            remove_job(jobs, n, i);
            jobs[*n] = j; /* past the end: answered */
        } else {
            job_reset(j);
            i++;
        }
    }
    return IDEM_OK;
}

static void run_batch(struct writer *w, struct job **jobs, unsigned n)
{
    struct pg_db *d = w->db;
    unsigned all = n, retries = 0;
    int resent = 0;
    int64_t settle_until = 0;
    qsort(jobs, n, sizeof *jobs, job_order);

    /* A job that waited timeout_ms for a writer fails without being tried;
     * the rest get timeout_ms for the batch's round trips, as a Redis call
     * gets it for its own once sent. (The earliest of their deadlines would
     * let one job that queued long time out a whole batch of fresh ones,
     * and under load the next batch too.) */
    int64_t now = idem__mono_ms(), deadline = now + d->timeout_ms;
    idem_rc rc = IDEM_OK;
    for (unsigned i = 0; i < n;) {
        struct job *j = jobs[i];
        if (j->deadline > now) {
            i++;
            continue;
        }
        idem__fail(IDEM_ETIMEDOUT, "postgres: %s: waited %lld ms for a writer", d->where,
                   (long long)d->timeout_ms);
        job_fail(j, IDEM_ETIMEDOUT, idem_errdetail());
        remove_job(jobs, &n, i);
        jobs[n] = j;
    }
    if (n == 0)
        goto answer;
    int64_t t0 = idem__mono_us();
    for (;;) {
        struct batch_error e;
        rc = run_once(w, jobs, n, deadline, &e);
        if (rc == IDEM_OK)
            break;
        char detail[256];
        snprintf(detail, sizeof detail, "%s", idem_errdetail());
        for (unsigned i = 0; i < n; i++)
            job_reset(jobs[i]);
        int conflict = e.rc != IDEM_OK && (!strcmp(e.sqlstate, "40001") ||
                                           !strcmp(e.sqlstate, "40P01"));
        int own = e.rc != IDEM_OK && e.job >= 0 &&
                  (!strncmp(e.sqlstate, "22", 2) || !strncmp(e.sqlstate, "23", 2));
        /* A connection that died while idle (the server restarted since
         * its last batch) fails a batch that nothing of was committed
         * (run_once): the batch runs once more, on a new connection. For
         * the database that is its first run, each write deciding on the
         * rows as they are now, as it would have: begin's INSERT ... ON
         * CONFLICT DO NOTHING, and the UPDATEs of a takeover, complete,
         * fail, extend and transition (and the inbox's), each conditional
         * on the state, epoch and lease its caller last saw. Not so once
         * COMMIT may have reached the server: a rerun of a batch that did
         * commit would meet its own writes and take them for another's
         * (begin would find its own claim IN_PROGRESS and lose it until its
         * lease ends; complete would find the record DONE, not PROCESSING,
         * and answer a conflict for the result it stored). Such a batch is
         * settled instead: its writes that committed are answered as made,
         * the rest run again (settle). */
        if (e.stale && !resent++ && idem__mono_ms() < deadline)
            continue;
        if (e.in_doubt) {
            if (!settle_until)
                settle_until = idem__mono_ms() + SETTLE_MS;
            if (settle(w, jobs, &n, settle_until) == IDEM_OK) {
                if (n == 0)
                    break; /* all of it had committed */
                deadline = idem__mono_ms() + d->timeout_ms;
                retries = 0;
                continue;
            }
        }
        if (conflict && ++retries < RETRIES_MAX && idem__mono_ms() < deadline)
            continue;
        if (own) {
            /* That job's data was refused: it fails alone, the rest run
             * again without it. */
            struct job *bad = jobs[e.job];
            job_fail(bad, e.rc, e.detail);
            remove_job(jobs, &n, (unsigned)e.job);
            jobs[n] = bad; /* kept past the end to be answered */
            if (n == 0)
                break;
            continue;
        }
        for (unsigned i = 0; i < n; i++)
            job_fail(jobs[i], rc, detail);
        break;
    }
    if (rc == IDEM_OK && n) {
        unsigned ok = 0;
        for (unsigned i = 0; i < n; i++)
            ok += jobs[i]->rc == IDEM_OK;
        int64_t took = idem__mono_us() - t0;
        idem__cq_committed(&d->q, ok, took);
    }
answer:
    /* Wake each caller alone; a job may be gone once its caller runs. */
    for (unsigned i = 0; i < all; i++) {
        struct job *j = jobs[i];
        if (j->over)
            j->over(j);
        else
            sem_post(&j->done);
    }
}

static int is_operators(const struct job *j)
{
    return j->kind == JOB_REC_DELETE || j->kind == JOB_REC_LIST;
}

static void operators_queue(struct pg_db *d, struct job *j);
static void operators_drain(struct pg_db *d);

/* Take what is queued: the operators' jobs go to their own queue, the rest
 * is a batch; then, unless the other writer is at it, run the operators'
 * jobs, one at a time. */
/* The settings read again on a writer's connection, at most every
 * SETTINGS_EVERY_MS (whichever writer finishes a batch first once it is
 * due): a manager may drop the synchronous standby from the primary's
 * settings while Idem stays connected (Patroni does when the standby is
 * lost, unless synchronous_mode_strict). A failure here only drops the
 * connection; the next batch reconnects, which reads them too. */
static void refresh_settings(struct writer *w)
{
    struct pg_db *d = w->db;
    int64_t due = atomic_load(&d->settings_due), now = idem__mono_ms();
    if (!w->pg || now < due ||
        !atomic_compare_exchange_strong(&d->settings_due, &due, now + SETTINGS_EVERY_MS))
        return;
    int64_t deadline = now + d->timeout_ms;
    PGconn *pg = w->pg;
    PGresult *r = NULL;
    if (!PQsendQueryParams(pg, SETTINGS_SQL, 0, NULL, NULL, NULL, NULL, 0) ||
        !PQpipelineSync(pg) || flush_out(d, pg, deadline, "reading synchronous_commit") ||
        get_result(d, pg, deadline, "reading synchronous_commit", &r) || !r) {
        PQclear(r);
        conn_close(&w->pg);
        return;
    }
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) == 2;
    if (ok)
        note_replication(d, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
    PQclear(r);
    if (get_result(d, pg, deadline, "reading synchronous_commit", &r) || r ||
        sync_point(d, pg, deadline) || !ok) {
        PQclear(r);
        conn_close(&w->pg);
    }
}

static void *writer_main(void *arg)
{
    struct writer *w = arg;
    struct pg_db *d = w->db;
    unsigned n;
    while ((n = idem__cq_take(&d->q, w->items)) > 0) {
        unsigned m = 0;
        for (unsigned i = 0; i < n; i++) {
            struct job *j = (struct job *)w->items[i];
            if (is_operators(j))
                operators_queue(d, j);
            else
                w->batch[m++] = j;
        }
        if (m)
            run_batch(w, w->batch, m);
        refresh_settings(w);
        operators_drain(d);
    }
    return NULL;
}

/* Queue a job for the writers: IDEM_OK, or IDEM_ECLOSING (and it is not). */
static idem_rc enqueue(struct pg_db *d, struct job *j)
{
    job_reset(j);
    j->deadline = idem__mono_ms() + d->timeout_ms;
    return idem__cq_push(&d->q, &j->item);
}

/* Queue a job and sleep until its batch is over. The job's answer is then
 * in it; the caller takes it only when this returns IDEM_OK. */
static idem_rc submit(struct pg_db *d, struct job *j)
{
    j->item.bytes += 512;
    j->over = NULL;
    sem_init(&j->done, 0, 0);
    idem_rc rc = enqueue(d, j);
    if (rc != IDEM_OK) {
        sem_destroy(&j->done);
        return rc;
    }
    while (sem_wait(&j->done) != 0)
        ; /* EINTR */
    sem_destroy(&j->done);
    if (j->rc != IDEM_OK) {
        rc = j->rc;
        char detail[sizeof j->detail];
        memcpy(detail, j->detail, sizeof detail);
        job_reset(j);
        return idem__fail(rc, "%s", detail);
    }
    return IDEM_OK;
}

/* An insert: when the row it ran into is gone by the time it is read (a
 * purge, of this process or another, deleted it in between), it runs again,
 * and then either inserts or meets a row that stays. */
static idem_rc submit_insert(struct pg_db *d, struct job *j)
{
    for (int tries = 0;; tries++) {
        idem_rc rc = submit(d, j);
        if (rc != IDEM_OK || j->hit || j->found)
            return rc;
        if (tries == RETRIES_MAX)
            return idem__fail(IDEM_ESTORE, "postgres: %s: %s %s/%s: the row met by the "
                              "insert vanished %d times", d->where,
                              j->table == 0 ? "record" : "inbox entry", j->k1, j->k2,
                              RETRIES_MAX + 1);
    }
}

/* ---- records ---- */

static idem_rc rec_insert(void *db, const struct idem__rec_new *n, int *inserted,
                          idem_record *cur)
{
    struct job j = {.kind = JOB_REC_INSERT, .table = 0, .k1 = n->space, .k2 = n->key,
                    .rec_new = n};
    if (cur)
        memset(cur, 0, sizeof *cur);
    idem_rc rc = submit_insert(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *inserted = j.hit;
    if (cur && !j.hit)
        *cur = j.rec;
    else
        idem__free(j.rec.result);
    return IDEM_OK;
}

static idem_rc rec_cas(void *db, const struct idem__rec_cas *c, int *changed, int *found,
                       idem_record *cur)
{
    struct job j = {.kind = JOB_REC_CAS, .table = 0, .k1 = c->space, .k2 = c->key,
                    .rec_cas = c, .want_row = cur != NULL,
                    .item.bytes = c->set_result ? c->result_len : 0};
    if (cur)
        memset(cur, 0, sizeof *cur);
    idem_rc rc = submit(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *changed = j.hit;
    *found = j.found;
    if (cur && j.found && !j.hit)
        *cur = j.rec;
    else
        idem__free(j.rec.result);
    return IDEM_OK;
}

/* ---- records, without waiting ---- */

/* A job whose caller does not wait (the _start operations): its answer goes
 * to the out-parameters and call->done on the writer's thread. */
struct started {
    struct job j;
    struct pg_db *d;
    int tries;
    int *hit, *found;
    idem_record *cur;
    unsigned *count;           /* purge */
    idem_record_item **items;  /* list */
    size_t *nitems;
    struct idem__call *call;
};

static void started_over(struct job *j)
{
    struct started *a = (struct started *)j;
    struct pg_db *d = a->d;
    char detail[sizeof j->detail];
    idem_rc rc = j->rc;
    /* An insert that met a row gone by the time it was read: again, as
     * submit_insert does. */
    if (rc == IDEM_OK && j->kind == JOB_REC_INSERT && !j->hit && !j->found) {
        if (a->tries++ < RETRIES_MAX) {
            if ((rc = enqueue(d, j)) == IDEM_OK)
                return;
            snprintf(j->detail, sizeof j->detail, "%s", idem_errdetail());
        } else {
            rc = IDEM_ESTORE;
            snprintf(j->detail, sizeof j->detail,
                     "postgres: %s: record %s/%s: the row met by the insert vanished %d times",
                     d->where, j->k1, j->k2, RETRIES_MAX + 1);
        }
    }
    memcpy(detail, j->detail, sizeof detail);
    if (rc == IDEM_OK) {
        if (a->hit)
            *a->hit = j->hit;
        if (a->found)
            *a->found = j->found;
        /* The row read, when the caller wants it (as the blocking calls). */
        if (a->cur && j->found && !j->hit)
            *a->cur = j->rec;
        else
            idem__free(j->rec.result);
        if (a->count)
            *a->count = j->count;
        if (a->items) {
            *a->items = j->items;
            *a->nitems = j->nitems;
        } else {
            idem__free(j->items);
        }
    } else {
        idem__free(j->rec.result);
        idem__free(j->items);
    }
    struct idem__call *call = a->call;
    idem__free(a);
    call->done(call, rc, rc == IDEM_OK ? "" : detail);
}

static idem_rc start_any(struct pg_db *d, const struct job *model, struct started *outs)
{
    struct started *a = idem__malloc(sizeof *a);
    if (!a)
        return idem__fail(IDEM_ENOMEM, "postgres: no memory for a record call");
    memset(a, 0, sizeof *a);
    a->j = *model;
    a->j.item.bytes += 512;
    a->j.over = started_over;
    a->d = d;
    a->hit = outs->hit;
    a->found = outs->found;
    a->cur = outs->cur;
    a->count = outs->count;
    a->items = outs->items;
    a->nitems = outs->nitems;
    a->call = outs->call;
    if (a->cur)
        memset(a->cur, 0, sizeof *a->cur);
    idem_rc rc = enqueue(d, &a->j);
    if (rc != IDEM_OK)
        idem__free(a);
    return rc;
}

static idem_rc start(struct pg_db *d, const struct job *model, int *hit, int *found,
                     idem_record *cur, struct idem__call *call)
{
    struct started outs = {.hit = hit, .found = found, .cur = cur, .call = call};
    return start_any(d, model, &outs);
}

static idem_rc rec_insert_start(void *db, const struct idem__rec_new *n, int *inserted,
                                idem_record *cur, struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_INSERT, .table = 0, .k1 = n->space, .k2 = n->key,
                    .rec_new = n};
    return start(db, &j, inserted, NULL, cur, c);
}

static idem_rc rec_cas_start(void *db, const struct idem__rec_cas *cas, int *changed,
                             int *found, idem_record *cur, struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_CAS, .table = 0, .k1 = cas->space, .k2 = cas->key,
                    .rec_cas = cas, .want_row = cur != NULL,
                    .item.bytes = cas->set_result ? cas->result_len : 0};
    return start(db, &j, changed, found, cur, c);
}

static idem_rc rec_get_start(void *db, const char *space, const char *key, int *found,
                             idem_record *cur, struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_GET, .table = 0, .k1 = space, .k2 = key};
    return start(db, &j, NULL, found, cur, c);
}

static idem_rc rec_purge(void *db, int64_t now, unsigned limit, unsigned *purged)
{
    struct job j = {.kind = JOB_REC_PURGE, .table = 2, .now = now, .limit = limit};
    idem_rc rc = submit(db, &j);
    if (rc == IDEM_OK)
        *purged = j.count;
    return rc;
}

static idem_rc rec_purge_start(void *db, int64_t now, unsigned limit, unsigned *purged,
                               struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_PURGE, .table = 2, .now = now, .limit = limit};
    struct started outs = {.count = purged, .call = c};
    *purged = 0;
    return start_any(db, &j, &outs);
}

/* ---- the read pool ----
 *
 * Reads share round trips too, without a thread of their own. A caller
 * queues its read; if no one is serving reads (or the queue is longer than
 * READS_PER_SERVER per server) it takes a pooled connection and becomes a
 * server: it sends every queued read, its own among them, in one pipeline,
 * answers them all, and goes on while its own read is still queued. When it
 * stops with reads still queued, it hands the connection to one of their
 * callers, who serves next. Any other caller sleeps until its read is
 * answered or a connection is handed to it. One server at a time carries
 * the reads of many callers per round trip; a second one only joins when
 * the queue outgrows the first. At most pool_size connections are open,
 * each opened when first needed and kept.
 */

enum read_state { READ_QUEUED, READ_TAKEN, READ_DONE };

struct read_req {
    struct read_req *next;
    const char *space, *key;
    int64_t deadline;
    enum read_state state;
    int serving;              /* its caller holds a connection */
    struct reader *handoff;   /* a connection passed to its caller */
    idem_rc rc;
    int found;
    idem_record rec;
    char detail[256];
    sem_t wake;
};

static void read_reset(struct read_req *q)
{
    idem__free(q->rec.result);
    memset(&q->rec, 0, sizeof q->rec);
    q->found = 0;
    q->rc = IDEM_OK;
    q->detail[0] = '\0';
}

static void read_fail(struct read_req *q, idem_rc rc, const char *detail)
{
    read_reset(q);
    q->rc = rc;
    snprintf(q->detail, sizeof q->detail, "%s", detail);
}

/* The reads in one pipeline, each with its own Sync so that one read's
 * failure is its alone. IDEM_OK unless the connection broke or timed out. */
static idem_rc pipeline_reads(struct pg_db *d, PGconn *pg, struct read_req **batch, unsigned n,
                              int64_t deadline)
{
    for (unsigned i = 0; i < n; i++)
        if (!send_get(pg, ST_REC_GET, batch[i]->space, batch[i]->key) || !PQpipelineSync(pg))
            return conn_fail(d, pg, IDEM_EUNAVAILABLE, "reading records");
    idem_rc rc = flush_out(d, pg, deadline, "reading records");
    for (unsigned i = 0; rc == IDEM_OK && i < n; i++) {
        struct read_req *q = batch[i];
        PGresult *r, *end;
        if ((rc = get_result(d, pg, deadline, "reading records", &r)) != IDEM_OK)
            break;
        if (!r) {
            rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "reading records");
            break;
        }
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            q->rc = result_fail(d, pg, r, "reading a record");
        } else {
            q->found = PQntuples(r) == 1;
            if (q->found)
                q->rc = parse_record(r, &q->rec);
        }
        if (q->rc != IDEM_OK)
            snprintf(q->detail, sizeof q->detail, "%s", idem_errdetail());
        PQclear(r);
        if ((rc = get_result(d, pg, deadline, "reading records", &end)) != IDEM_OK)
            break;
        if (end) {
            PQclear(end);
            rc = idem__fail(IDEM_ESTORE, "postgres: %s: a read gave two results", d->where);
            break;
        }
        if (PQstatus(pg) == CONNECTION_BAD) {
            rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, "reading records");
            break;
        }
        rc = sync_point(d, pg, deadline);
    }
    return rc;
}

/* Answer a batch of reads on connection r, opening it if need be. A
 * connection kept from before that fails is replaced once: the server may
 * have restarted while it idled, and a read may be repeated. */
static void run_reads(struct pg_db *d, struct reader *r, struct read_req **batch, unsigned n)
{
    int64_t deadline = INT64_MAX;
    for (unsigned i = 0; i < n; i++)
        if (batch[i]->deadline < deadline)
            deadline = batch[i]->deadline;
    idem_rc rc = IDEM_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        conn_check_idle(&r->pg);
        int fresh = !r->pg;
        if (fresh) {
            rc = conn_open(d, deadline, &r->pg);
            if (rc == IDEM_OK)
                rc = prepare(d, r->pg, ST_REC_GET, deadline);
            if (rc == IDEM_OK && !PQenterPipelineMode(r->pg))
                rc = conn_fail(d, r->pg, IDEM_ESTORE, "entering pipeline mode");
            if (rc != IDEM_OK) {
                conn_close(&r->pg);
                break;
            }
        }
        rc = pipeline_reads(d, r->pg, batch, n, deadline);
        if (rc == IDEM_OK)
            return;
        conn_close(&r->pg);
        for (unsigned i = 0; i < n; i++)
            read_reset(batch[i]);
        if (rc != IDEM_EUNAVAILABLE || fresh)
            break;
    }
    char detail[256];
    snprintf(detail, sizeof detail, "%s", idem_errdetail());
    for (unsigned i = 0; i < n; i++)
        read_fail(batch[i], rc, detail);
}

/* A connection leaves a server: to a waiting caller if reads are queued,
 * else back to the pool. Called with pool_mu held. */
static void pool_release(struct pg_db *d, struct reader *r)
{
    for (struct read_req *q = d->rq_head; q; q = q->next) {
        if (!q->serving) {
            q->serving = 1;
            d->serving++;
            q->handoff = r;
            sem_post(&q->wake);
            return;
        }
    }
    r->next = d->idle;
    d->idle = r;
}

/* Serve queued reads on r until own's read has been taken. */
static void serve(struct pg_db *d, struct reader *r, struct read_req *own)
{
    struct read_req *batch[READ_BATCH_MAX];
    pthread_mutex_lock(&d->pool_mu);
    while (own->state == READ_QUEUED) {
        unsigned n = 0;
        while (d->rq_head && n < READ_BATCH_MAX) {
            struct read_req *q = d->rq_head;
            d->rq_head = q->next;
            d->rq_len--;
            q->state = READ_TAKEN;
            batch[n++] = q;
        }
        if (!d->rq_head)
            d->rq_tail = &d->rq_head;
        pthread_mutex_unlock(&d->pool_mu);
        run_reads(d, r, batch, n);
        pthread_mutex_lock(&d->pool_mu);
        /* Posted with the mutex held: a caller who sees READ_DONE may
         * leave, and its request with it. */
        for (unsigned i = 0; i < n; i++) {
            batch[i]->state = READ_DONE;
            sem_post(&batch[i]->wake);
        }
    }
    own->serving = 0;
    d->serving--;
    pool_release(d, r);
    pthread_mutex_unlock(&d->pool_mu);
}

static void unqueue(struct pg_db *d, struct read_req *q)
{
    struct read_req **p = &d->rq_head;
    while (*p && *p != q)
        p = &(*p)->next;
    if (!*p)
        return;
    *p = q->next;
    if (!*p)
        d->rq_tail = p;
    d->rq_len--;
}

/* A read of the last committed row, not through the writer. */
static idem_rc rec_get(void *db, const char *space, const char *key, int *found,
                       idem_record *cur)
{
    struct pg_db *d = db;
    struct read_req q = {.space = space, .key = key, .deadline = idem__mono_ms() + d->timeout_ms};
    struct timespec until = {.tv_sec = q.deadline / 1000,
                             .tv_nsec = (q.deadline % 1000) * 1000000};
    int timed_out = 0;
    *found = 0;
    if (cur)
        memset(cur, 0, sizeof *cur);
    sem_init(&q.wake, 0, 0);
    pthread_mutex_lock(&d->pool_mu);
    *d->rq_tail = &q;
    d->rq_tail = &q.next;
    d->rq_len++;
    /* One server at a time takes everything queued in one round trip;
     * another starts only when the queue outgrows what the servers carry. */
    struct reader *r = d->idle;
    if (r && (d->serving == 0 || d->rq_len > READS_PER_SERVER * d->serving)) {
        d->idle = r->next;
        q.serving = 1;
        d->serving++;
    } else {
        r = NULL;
    }
    pthread_mutex_unlock(&d->pool_mu);
    if (r)
        serve(d, r, &q);
    for (;;) {
        pthread_mutex_lock(&d->pool_mu);
        /* A connection handed over is served on (or passed on) even if
         * another server answered this read meanwhile. */
        if ((r = q.handoff)) {
            q.handoff = NULL;
            pthread_mutex_unlock(&d->pool_mu);
            serve(d, r, &q);
            continue;
        }
        if (q.state == READ_DONE) {
            pthread_mutex_unlock(&d->pool_mu);
            break;
        }
        if (timed_out && q.state == READ_QUEUED) {
            unqueue(d, &q);
            pthread_mutex_unlock(&d->pool_mu);
            idem__fail(IDEM_ETIMEDOUT, "postgres: %s: all %u read connections busy for %lld ms",
                       d->where, d->pool_size, (long long)d->timeout_ms);
            read_fail(&q, IDEM_ETIMEDOUT, idem_errdetail());
            break;
        }
        pthread_mutex_unlock(&d->pool_mu);
        /* Once taken, a read is answered within its server's deadline,
         * which is no later than its own. */
        if (timed_out)
            while (sem_wait(&q.wake) != 0)
                ; /* EINTR */
        else if (sem_clockwait(&q.wake, CLOCK_MONOTONIC, &until) != 0 && errno == ETIMEDOUT)
            timed_out = 1;
    }
    sem_destroy(&q.wake);
    if (q.rc != IDEM_OK) {
        idem_rc rc = q.rc;
        char detail[sizeof q.detail];
        memcpy(detail, q.detail, sizeof detail);
        read_reset(&q);
        return idem__fail(rc, "%s", detail);
    }
    *found = q.found;
    if (cur && q.found)
        *cur = q.rec;
    else
        idem__free(q.rec.result);
    return IDEM_OK;
}

/* begin's hint. A peek pays off only for a finished record (a replay: DONE
 * without queueing behind writes); for a new key, the common case, it is a
 * round trip the insert makes anyway. So it is taken while it pays off
 * (core/hint.h): a retry storm is answered from the pool, fresh writes do
 * not pay for the hint. A skipped peek answers "not found", which a hint
 * may: the insert's primary key then decides, as it always does. */
static idem_rc rec_peek(void *db, const char *space, const char *key, int *found,
                        idem_record *cur)
{
    struct pg_db *d = db;
    if (!idem__hint_take(&d->peek)) {
        *found = 0;
        if (cur)
            memset(cur, 0, sizeof *cur);
        return IDEM_OK;
    }
    idem_rc rc = rec_get(db, space, key, found, cur);
    if (rc != IDEM_OK)
        return rc;
    idem__hint_paid(&d->peek, *found && cur && idem__state_finished(cur->state));
    return IDEM_OK;
}

/* ---- the operators' calls ----
 *
 * Listing and deleting records are an operator's, a few a minute: they run
 * on one connection of their own, opened when first needed and kept, one
 * call at a time, outside the writers' batches and the read pool, so that
 * a listing of 500 rows never sits in a batch of a hundred begins. Each is
 * one statement, and so its own transaction: the DELETE is atomic with its
 * conditions as a batch's UPDATE is, and waits, as one does, for a batch
 * that holds the row.
 *
 * Who runs them: the writers, without a thread of their own. A call, the
 * blocking one or its _start form, queues a job on the writers' queue as
 * any write does; the writer that takes it moves it to the operators'
 * queue (admin_head, under admin_mu) instead of its batch, commits its
 * batch, and then, unless the other writer is already at it
 * (admin_draining), runs the operators' queue to its end, one job at a
 * time, on the operators' connection, and answers each as a batch's jobs
 * are answered (the caller woken, or over() called). So at most one writer
 * is ever busy with operators' work, the other goes on committing batches,
 * and the operators' connection has one user at a time, the drainer. A
 * job that waited timeout_ms for a writer fails untried, as a write does;
 * the statement gets timeout_ms of its own (admin_exec). The failures are
 * admin_exec's: a timeout drops the connection and is IDEM_ETIMEDOUT (a
 * DELETE may have been made), a refused connection IDEM_EUNAVAILABLE.
 */

/* Run one statement with parameters, binary in and out; *res its rows. */
static idem_rc admin_exec(struct pg_db *d, const char *sql, const struct params *p,
                          const char *doing, PGresult **res)
{
    *res = NULL;
    int64_t deadline = idem__mono_ms() + d->timeout_ms;
    idem_rc rc = IDEM_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        conn_check_idle(&d->admin);
        int fresh = !d->admin;
        if (fresh && (rc = conn_open(d, deadline, &d->admin)) != IDEM_OK)
            return rc;
        PGconn *pg = d->admin;
        if (!PQsendQueryParams(pg, sql, p->n, NULL, p->val, p->len, p->fmt, 1)) {
            rc = conn_fail(d, pg, IDEM_EUNAVAILABLE, doing);
        } else if ((rc = flush_out(d, pg, deadline, doing)) == IDEM_OK) {
            PGresult *r;
            idem_rc first = IDEM_OK;
            char detail[256] = "";
            while ((rc = get_result(d, pg, deadline, doing, &r)) == IDEM_OK && r) {
                ExecStatusType st = PQresultStatus(r);
                if ((st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) && !*res && first == IDEM_OK) {
                    *res = r;
                    continue;
                }
                if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && first == IDEM_OK) {
                    first = result_fail(d, pg, r, doing);
                    snprintf(detail, sizeof detail, "%s", idem_errdetail());
                }
                PQclear(r);
            }
            if (rc == IDEM_OK && first != IDEM_OK)
                rc = idem__fail(first, "%s", detail);
            if (rc == IDEM_OK)
                return IDEM_OK;
        }
        PQclear(*res);
        *res = NULL;
        /* A kept connection whose server restarted is replaced once; the
         * statement may be repeated: a listing is a read, and a DELETE
         * that went through before finds nothing to delete the second
         * time. */
        if (PQstatus(d->admin) == CONNECTION_BAD || rc == IDEM_ETIMEDOUT)
            conn_close(&d->admin);
        if (rc != IDEM_EUNAVAILABLE || fresh)
            break;
    }
    return rc;
}

/* A delete's statement: j->hit 1 if the row went; else j->found and
 * j->rec say what stands. */
static idem_rc run_delete(struct pg_db *d, struct job *j)
{
    struct params p = {0};
    p_text(&p, j->k1);
    p_text(&p, j->k2);
    p_int(&p, (int64_t)j->epoch);
    p_int(&p, j->updated_ms);
    /* When nothing was deleted, the row is read by a second statement: it
     * takes a fresh snapshot, so it sees what the DELETE waited for, which
     * a SELECT in the DELETE's own statement would not (see the top). */
    PGresult *r;
    idem_rc rc = admin_exec(d,
                            "DELETE FROM idem_record WHERE space = $1 AND key = $2"
                            " AND epoch = $3 AND state <> 'PROCESSING'"
                            " AND ($4::bigint = 0 OR updated_ms = $4::bigint)",
                            &p, "deleting a record", &r);
    if (rc == IDEM_OK) {
        j->hit = cmd_rows(r) == 1;
        PQclear(r);
        r = NULL;
        p.n = 2;
        if (!j->hit)
            rc = admin_exec(d,
                            "SELECT state, epoch, owner, lease_until, created_ms, updated_ms,"
                            " expires_ms, NULL::bytea, NULL::bytea FROM idem_record"
                            " WHERE space = $1 AND key = $2",
                            &p, "reading a record", &r);
    }
    if (rc != IDEM_OK || !r)
        return rc;
    j->found = PQntuples(r) == 1;
    if (j->found)
        rc = parse_record(r, &j->rec);
    PQclear(r);
    return rc;
}

/* As sqlite.c's list_on: a statement with only the query's conditions,
 * every value a parameter, the key prefix a range of the primary key (no
 * LIKE, so no wildcard), PROCESSING written out as the partial index's
 * condition is. */
static idem_rc run_list(struct pg_db *d, struct job *j)
{
    const struct idem__rec_list *l = j->list;
    struct params p = {0};
    char sql[1024], cond[512] = "", num[16];
#define COND(text, bind)                                                                         \
    do {                                                                                         \
        bind;                                                                                    \
        snprintf(num, sizeof num, "$%d", p.n);                                                   \
        snprintf(cond + strlen(cond), sizeof cond - strlen(cond), text, num);                    \
    } while (0)
    p_text(&p, l->space);
    if (l->prefix)
        COND(" AND key >= %s", p_text(&p, l->prefix));
    if (l->prefix && l->prefix_upper)
        COND(" AND key < %s", p_text(&p, l->prefix_upper));
    if (l->state && strcmp(l->state, IDEM_STATE_PROCESSING) == 0)
        snprintf(cond + strlen(cond), sizeof cond - strlen(cond), " AND state = 'PROCESSING'");
    else if (l->state)
        COND(" AND state = %s", p_text(&p, l->state));
    if (l->created_before)
        COND(" AND created_ms < %s", p_int(&p, l->created_before));
    if (l->created_after)
        COND(" AND created_ms > %s", p_int(&p, l->created_after));
    if (l->min_lease_span)
        COND(" AND lease_until - updated_ms > %s", p_int(&p, l->min_lease_span));
    if (l->after_key) {
        p_int(&p, l->after_created);
        p_text(&p, l->after_key);
        snprintf(cond + strlen(cond), sizeof cond - strlen(cond),
                 " AND (created_ms, key) < ($%d, $%d)", p.n - 1, p.n);
    }
#undef COND
    p_int(&p, l->fetch);
    snprintf(sql, sizeof sql,
             "SELECT key, state, epoch, owner, lease_until, created_ms, updated_ms, expires_ms,"
             " octet_length(result)::bigint, substring(result from 1 for %d) FROM idem_record"
             " WHERE space = $1%s ORDER BY created_ms DESC, key DESC LIMIT $%d",
             IDEM_RESULT_HEAD, cond, p.n);
    PGresult *r;
    idem_rc rc = admin_exec(d, sql, &p, "listing records", &r);
    if (rc != IDEM_OK)
        return rc;
    size_t n = (size_t)PQntuples(r);
    if (n > l->fetch || PQnfields(r) != 10) {
        PQclear(r);
        return idem__fail(IDEM_ESTORE, "postgres: listing records: an answer of an unexpected "
                                       "shape");
    }
    idem_record_item *out = idem__calloc(n ? n : 1, sizeof *out);
    if (!out) {
        PQclear(r);
        return idem__fail(IDEM_ENOMEM, "records: listing %zu", n);
    }
    for (size_t i = 0; i < n; i++) {
        idem_record_item *it = &out[i];
        int row = (int)i;
        int64_t v[7];
        for (int c = 0, k = 0; c < 9; c++) {
            if (c == 0 || c == 1 || c == 3)
                continue;
            v[k] = 0;
            if (!PQgetisnull(r, row, c)) {
                uint64_t be;
                if (PQgetlength(r, row, c) != 8) {
                    idem__free(out);
                    PQclear(r);
                    return idem__fail(IDEM_ESTORE, "postgres: idem_record row of an unexpected "
                                                   "shape");
                }
                memcpy(&be, PQgetvalue(r, row, c), 8);
                v[k] = (int64_t)be64toh(be);
            }
            k++;
        }
        size_t kn = (size_t)PQgetlength(r, row, 0), sn = (size_t)PQgetlength(r, row, 1),
               on = (size_t)PQgetlength(r, row, 3), hn = (size_t)PQgetlength(r, row, 9);
        memcpy(it->key, PQgetvalue(r, row, 0), kn < IDEM_KEY_MAX ? kn : IDEM_KEY_MAX);
        memcpy(it->state, PQgetvalue(r, row, 1), sn < IDEM_NAME_MAX ? sn : IDEM_NAME_MAX);
        memcpy(it->owner, PQgetvalue(r, row, 3), on < IDEM_KEY_MAX ? on : IDEM_KEY_MAX);
        it->epoch = (uint64_t)v[0];
        it->lease_until_ms = v[1];
        it->created_ms = v[2];
        it->updated_ms = v[3];
        it->expires_ms = v[4];
        it->result_len = (size_t)v[5];
        it->result_head_len = hn < IDEM_RESULT_HEAD ? hn : IDEM_RESULT_HEAD;
        memcpy(it->result_head, PQgetvalue(r, row, 9), it->result_head_len);
    }
    PQclear(r);
    j->items = out;
    j->nitems = n;
    return IDEM_OK;
}

static void operators_queue(struct pg_db *d, struct job *j)
{
    j->admin_next = NULL;
    pthread_mutex_lock(&d->admin_mu);
    *d->admin_tail = j;
    d->admin_tail = &j->admin_next;
    pthread_mutex_unlock(&d->admin_mu);
}

/* Run the operators' queue to its end, unless another writer does. */
static void operators_drain(struct pg_db *d)
{
    pthread_mutex_lock(&d->admin_mu);
    if (d->admin_draining) {
        pthread_mutex_unlock(&d->admin_mu);
        return;
    }
    d->admin_draining = 1;
    for (;;) {
        struct job *j = d->admin_head;
        if (!j)
            break;
        d->admin_head = j->admin_next;
        if (!d->admin_head)
            d->admin_tail = &d->admin_head;
        pthread_mutex_unlock(&d->admin_mu);
        idem__clear_detail();
        idem_rc rc;
        if (idem__mono_ms() >= j->deadline)
            rc = idem__fail(IDEM_ETIMEDOUT, "postgres: %s: waited %lld ms for a writer",
                            d->where, (long long)d->timeout_ms);
        else
            rc = j->kind == JOB_REC_DELETE ? run_delete(d, j) : run_list(d, j);
        if (rc != IDEM_OK)
            job_fail(j, rc, idem_errdetail());
        /* A job may be gone once its caller runs. */
        if (j->over)
            j->over(j);
        else
            sem_post(&j->done);
        pthread_mutex_lock(&d->admin_mu);
    }
    d->admin_draining = 0;
    pthread_mutex_unlock(&d->admin_mu);
}

static idem_rc rec_delete(void *db, const char *space, const char *key, uint64_t epoch,
                          int64_t updated_ms, int *deleted, int *found, idem_record *cur)
{
    struct job j = {.kind = JOB_REC_DELETE, .k1 = space, .k2 = key, .epoch = epoch,
                    .updated_ms = updated_ms};
    *deleted = *found = 0;
    if (cur)
        memset(cur, 0, sizeof *cur);
    idem_rc rc = submit(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *deleted = j.hit;
    *found = j.found;
    if (cur && j.found && !j.hit)
        *cur = j.rec;
    else
        idem__free(j.rec.result);
    return IDEM_OK;
}

static idem_rc rec_list(void *db, const struct idem__rec_list *l, idem_record_item **items,
                        size_t *count)
{
    struct job j = {.kind = JOB_REC_LIST, .list = l};
    *items = NULL;
    *count = 0;
    idem_rc rc = submit(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *items = j.items;
    *count = j.nitems;
    return IDEM_OK;
}

static idem_rc rec_delete_start(void *db, const char *space, const char *key, uint64_t epoch,
                                int64_t updated_ms, int *deleted, int *found,
                                idem_record *cur, struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_DELETE, .k1 = space, .k2 = key, .epoch = epoch,
                    .updated_ms = updated_ms};
    struct started outs = {.hit = deleted, .found = found, .cur = cur, .call = c};
    *deleted = *found = 0;
    return start_any(db, &j, &outs);
}

static idem_rc rec_list_start(void *db, const struct idem__rec_list *l,
                              idem_record_item **items, size_t *count, struct idem__call *c)
{
    struct job j = {.kind = JOB_REC_LIST, .list = l};
    struct started outs = {.items = items, .nitems = count, .call = c};
    *items = NULL;
    *count = 0;
    return start_any(db, &j, &outs);
}

/* ---- inbox ---- */

static idem_rc inbox_insert(void *db, const char *group, const char *msg_id,
                            const char *biz_type, const char *state, unsigned attempts,
                            int64_t lease_until, int64_t now, int *inserted,
                            idem_inbox_entry *cur)
{
    struct job j = {.kind = JOB_INBOX_INSERT, .table = 1, .k1 = group, .k2 = msg_id,
                    .biz_type = biz_type, .state = state, .attempts = attempts,
                    .lease_until = lease_until, .now = now};
    idem_rc rc = submit_insert(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *inserted = j.hit;
    if (cur)
        *cur = j.entry;
    return IDEM_OK;
}

static idem_rc inbox_cas(void *db, const struct idem__inbox_cas *c, int *changed, int *found,
                         idem_inbox_entry *cur)
{
    struct job j = {.kind = JOB_INBOX_CAS, .table = 1, .k1 = c->group, .k2 = c->msg_id,
                    .inbox_cas = c};
    idem_rc rc = submit(db, &j);
    if (rc != IDEM_OK)
        return rc;
    *changed = j.hit;
    *found = j.found;
    if (cur && j.found)
        *cur = j.entry;
    return IDEM_OK;
}

/* ---- open and close ---- */

static void commit_stats(void *db, idem_stats *stats, idem_commit_times *times,
                         idem_commit_batches *batches)
{
    struct pg_db *d = db;
    idem__cq_stats(&d->q, stats, times, batches);
}

static void postgres_close(void *db)
{
    struct pg_db *d = db;
    if (!d)
        return;
    idem__cq_stop(&d->q);
    for (int i = 0; i < WRITERS; i++) {
        struct writer *w = &d->writers[i];
        if (w->started)
            pthread_join(w->thread, NULL);
        conn_close(&w->pg);
        idem__free(w->items);
        idem__free(w->batch);
    }
    for (unsigned i = 0; d->readers && i < d->pool_size; i++)
        conn_close(&d->readers[i].pg);
    idem__free(d->readers);
    conn_close(&d->admin);
    pthread_mutex_destroy(&d->admin_mu);
    pthread_mutex_destroy(&d->repl_mu);
    pthread_mutex_destroy(&d->pool_mu);
    idem__cq_destroy(&d->q);
    pthread_mutex_destroy(&d->backoff_mu);
    if (d->password) {
        memset(d->password, 0, strlen(d->password));
        idem__free(d->password);
    }
    if (d->url) {
        memset(d->url, 0, strlen(d->url));
        idem__free(d->url);
    }
    idem__free(d);
}

static const struct idem__db_ops postgres_ops = {
    .version = IDEM_DB_OPS_VERSION,
    .name = "postgres",
    .rec_insert = rec_insert,
    .rec_cas = rec_cas,
    .rec_get = rec_get,
    .rec_peek = rec_peek,
    .rec_purge = rec_purge,
    .inbox_insert = inbox_insert,
    .inbox_cas = inbox_cas,
    .commit_stats = commit_stats,
    .close = postgres_close,
    .rec_delete = rec_delete,
    .rec_list = rec_list,
    .rec_insert_start = rec_insert_start,
    .rec_cas_start = rec_cas_start,
    .rec_get_start = rec_get_start,
    .rec_delete_start = rec_delete_start,
    .rec_list_start = rec_list_start,
    .rec_purge_start = rec_purge_start,
    .replication = replication,
};

/* Bring the schema to SCHEMA_VERSION, one process at a time. */
static idem_rc migrate(struct pg_db *d, PGconn *pg, int64_t deadline)
{
    char begin[256];
    snprintf(begin, sizeof begin,
             "BEGIN; SELECT pg_advisory_xact_lock(%lld);"
             "CREATE TABLE IF NOT EXISTS idem_schema (version integer PRIMARY KEY,"
             " applied_at timestamptz NOT NULL DEFAULT now())",
             SCHEMA_LOCK);
    PGresult *r = NULL;
    idem_rc rc = exec_simple(d, pg, begin, deadline, "migrating the schema", NULL);
    if (rc == IDEM_OK)
        rc = exec_simple(d, pg, "SELECT coalesce(max(version), 0) FROM idem_schema", deadline,
                         "migrating the schema", &r);
    if (rc != IDEM_OK)
        goto out;
    int version = r && PQntuples(r) == 1 ? atoi(PQgetvalue(r, 0, 0)) : -1;
    if (version < 0 || version > SCHEMA_VERSION) {
        rc = idem__fail(IDEM_ESTORE, "postgres: %s: the database's Idem schema is version %d; "
                                     "this Idem knows versions up to %d",
                        d->where, version, SCHEMA_VERSION);
        goto out;
    }
    for (int v = version + 1; rc == IDEM_OK && v <= SCHEMA_VERSION; v++) {
        char note[96];
        snprintf(note, sizeof note, "INSERT INTO idem_schema (version) VALUES (%d)", v);
        rc = exec_simple(d, pg, migrations[v - 1], deadline, "migrating the schema", NULL);
        if (rc == IDEM_OK)
            rc = exec_simple(d, pg, note, deadline, "migrating the schema", NULL);
    }
    if (rc == IDEM_OK)
        rc = exec_simple(d, pg, "COMMIT", deadline, "migrating the schema", NULL);
out:
    PQclear(r);
    if (rc != IDEM_OK && PQstatus(pg) == CONNECTION_OK &&
        PQtransactionStatus(pg) != PQTRANS_IDLE) {
        char detail[256];
        snprintf(detail, sizeof detail, "%s", idem_errdetail());
        (void)exec_simple(d, pg, "ROLLBACK", deadline, "migrating the schema", NULL);
        idem__fail(rc, "%s", detail);
    }
    return rc;
}

/* Where the URL points, for messages: host:port, never the password. */
/* host:port for messages; libpq's multi-host form (hosts and ports as
 * lists, one port for all or one each) paired: h1:p1,h2:p2. */
static void where_of(char *out, size_t cap, const char *hosts, const char *ports)
{
    size_t n = 0;
    const char *p = ports;
    out[0] = '\0';
    for (const char *h = hosts; *h && n + 1 < cap;) {
        size_t hl = strcspn(h, ","), pl = strcspn(p, ",");
        int w = snprintf(out + n, cap - n, "%s%.*s:%.*s", n ? "," : "", (int)hl, h,
                         pl ? (int)pl : 4, pl ? p : "5432");
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
        h += hl + (h[hl] == ',');
        if (p[pl] == ',')
            p += pl + 1; /* one port each; a single one stays for all */
    }
}

/* url as libpq reads it, or why not, the options in *out (freed by the
 * caller) when out is not NULL. libpq's own reason, which may quote any
 * part of url, is said only when quote is set: the caller knows that url
 * holds no secret. */
static idem_rc check_url(const char *url, int quote, PQconninfoOption **out)
{
    /* libpq ends a URI's user part at the first '/', '?' or '#': an '@'
     * after one means a password holding it unescaped, which libpq would
     * read as host and port, and which we would then print. */
    const char *scheme = strstr(url, "://");
    if (scheme && !strncmp(url, "postgres", 8)) {
        const char *auth = scheme + 3;
        size_t end = strcspn(auth, "/?#");
        if (auth[end] && strchr(auth + end, '@'))
            return idem__fail(IDEM_EINVAL, "postgres_url: an '@' after the host part: "
                                           "percent-encode '/', '?', '#' and '@' in the "
                                           "user and password (%%2F %%3F %%23 %%40)");
    }
    char *err = NULL;
    PQconninfoOption *opts = PQconninfoParse(url, &err);
    if (!opts) {
        size_t n = err && quote ? strcspn(err, "\n") : 0;
        idem_rc rc = idem__fail(IDEM_EINVAL, "postgres_url: not a libpq connection URI or "
                                "key=value string%s%.*s",
                                n ? ": " : "", (int)n, err ? err : "");
        PQfreemem(err);
        return rc;
    }
    if (out)
        *out = opts;
    else
        PQconninfoFree(opts);
    return IDEM_OK;
}

idem_rc idem__postgres_url_check(const char *url, int quote)
{
    return check_url(url, quote, NULL);
}

static idem_rc parse_url(struct pg_db *d, const char *url)
{
    PQconninfoOption *opts;
    idem_rc bad = check_url(url, 0, &opts);
    if (bad != IDEM_OK)
        return bad;
    const char *host = NULL, *hostaddr = NULL, *port = NULL, *password = NULL;
    for (PQconninfoOption *o = opts; o->keyword; o++) {
        if (!o->val || !*o->val)
            continue;
        if (!strcmp(o->keyword, "host"))
            host = o->val;
        else if (!strcmp(o->keyword, "hostaddr"))
            hostaddr = o->val;
        else if (!strcmp(o->keyword, "port"))
            port = o->val;
        else if (!strcmp(o->keyword, "password"))
            password = o->val;
    }
    where_of(d->where, sizeof d->where, host ? host : hostaddr ? hostaddr : "localhost",
             port ? port : "5432");
    idem_rc rc = IDEM_OK;
    if (password && !(d->password = idem__strndup(password, strlen(password))))
        rc = idem__fail(IDEM_ENOMEM, "postgres: allocating");
    PQconninfoFree(opts);
    return rc;
}

idem_rc idem__postgres_open(const idem_options *o, const struct idem__db_ops **ops,
                            void **out)
{
    struct pg_db *d = idem__calloc(1, sizeof *d);
    if (!d)
        return idem__fail(IDEM_ENOMEM, "postgres: allocating");
    pthread_mutex_init(&d->backoff_mu, NULL);
    pthread_mutex_init(&d->pool_mu, NULL);
    pthread_mutex_init(&d->admin_mu, NULL);
    pthread_mutex_init(&d->repl_mu, NULL);
    d->admin_tail = &d->admin_head;
    d->rq_tail = &d->rq_head;
    d->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;
    d->batch_max = o->commit_batch_max ? o->commit_batch_max : 512;
    idem__cq_init(&d->q, d->batch_max, BATCH_BYTES_MAX);
    d->pool_size = o->pool_size ? o->pool_size : 8;
    idem_rc rc = IDEM_OK;
    if (!o->postgres_url || !*o->postgres_url) {
        rc = idem__fail(IDEM_EINVAL, "postgres_url: empty");
        goto fail;
    }
    if ((rc = parse_url(d, o->postgres_url)) != IDEM_OK)
        goto fail;
    if (!(d->url = idem__strndup(o->postgres_url, strlen(o->postgres_url)))) {
        rc = idem__fail(IDEM_ENOMEM, "postgres: allocating");
        goto fail;
    }
    if (!(d->readers = idem__calloc(d->pool_size, sizeof *d->readers))) {
        rc = idem__fail(IDEM_ENOMEM, "postgres: allocating");
        goto fail;
    }
    for (unsigned i = 0; i < d->pool_size; i++) {
        d->readers[i].next = d->idle;
        d->idle = &d->readers[i];
    }
    /* The first writer's connection migrates the schema. */
    int64_t deadline = idem__mono_ms() + d->timeout_ms;
    for (int i = 0; i < WRITERS; i++) {
        struct writer *w = &d->writers[i];
        w->db = d;
        if (!(w->batch = idem__calloc(d->batch_max, sizeof *w->batch)) ||
            !(w->items = idem__calloc(d->batch_max, sizeof *w->items))) {
            rc = idem__fail(IDEM_ENOMEM, "postgres: allocating");
            goto fail;
        }
        if ((rc = writer_connect(w, deadline, i == 0)) != IDEM_OK)
            goto fail;
    }
    for (int i = 0; i < WRITERS; i++) {
        struct writer *w = &d->writers[i];
        if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
            rc = idem__fail(IDEM_ENOMEM, "postgres: cannot start a writer thread");
            goto fail;
        }
        w->started = 1;
        pthread_setname_np(w->thread, "idem-pg-writer"); /* for top -H, perf, gdb */
    }
    *ops = &postgres_ops;
    *out = d;
    return IDEM_OK;
fail:
    postgres_close(d);
    return rc;
}
