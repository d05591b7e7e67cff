/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite.c — the "sqlite" db backend: records and inbox in one SQLite file,
 * the embedded store's layer 3.
 *
 * One connection, owned by the group-commit writer thread (group_commit.c):
 * every write is a job on that thread, so the connection is never shared and
 * all statements are prepared once; reads of a file go to read-only
 * connections of their own. The file is in WAL mode with synchronous=FULL: a
 * job's caller returns only after the batch that carried its write has been
 * fsynced, and a job started without a waiting caller (the _start
 * operations) is answered then.
 *
 * The table's PRIMARY KEY (space, key) decides who creates a record:
 * INSERT ... ON CONFLICT DO NOTHING, then changes() — never a read followed
 * by an insert. Every later change is an UPDATE conditional on the state (and
 * epoch, and lease) the caller last saw.
 *
 * The files are the ones opened, or nothing is served: a store file removed
 * or replaced under the running process (files_gone) fails every write and
 * read from then on.
 */
#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "group_commit.h"
#include "sqlite_wal.h"
#include "store.h"

#define SCHEMA_VERSION 1

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS idem_record ("
    " space TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " fingerprint BLOB,"
    " state TEXT NOT NULL,"
    " epoch INTEGER NOT NULL,"
    " owner TEXT NOT NULL,"
    " lease_until INTEGER NOT NULL,"
    " result BLOB,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " expires_ms INTEGER,"
    " PRIMARY KEY (space, key));"
    "CREATE INDEX IF NOT EXISTS idem_record_expiry ON idem_record (expires_ms)"
    " WHERE expires_ms IS NOT NULL;"
    /* For idem_record_list, newest first. created_ms never changes, so
     * only an insert writes to the first; the second holds only the
     * claims in flight. A file made before them gains them at its next
     * open, as this runs at every open; schema version 1 still, as a file
     * with them is one an Idem without them reads and writes unchanged. */
    "CREATE INDEX IF NOT EXISTS idem_record_created ON idem_record"
    " (space, created_ms, key);"
    "CREATE INDEX IF NOT EXISTS idem_record_processing ON idem_record"
    " (space, created_ms, key) WHERE state = 'PROCESSING';"
    "CREATE TABLE IF NOT EXISTS idem_inbox ("
    " grp TEXT NOT NULL,"
    " msg_id TEXT NOT NULL,"
    " biz_type TEXT NOT NULL,"
    " state TEXT NOT NULL,"
    " attempts INTEGER NOT NULL,"
    " lease_until INTEGER NOT NULL,"
    " created_ms INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL,"
    " PRIMARY KEY (grp, msg_id));";

enum {
    ST_BEGIN, ST_COMMIT, ST_ROLLBACK, ST_SAVEPOINT, ST_RELEASE, ST_ROLLBACK_TO,
    ST_REC_INSERT, ST_REC_GET, ST_REC_CAS, ST_REC_PURGE, ST_REC_DELETE,
    ST_INBOX_INSERT, ST_INBOX_GET, ST_INBOX_CAS,
    ST_COUNT_
};

static const char *const sql[ST_COUNT_] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_SAVEPOINT] = "SAVEPOINT job",
    [ST_RELEASE] = "RELEASE job",
    [ST_ROLLBACK_TO] = "ROLLBACK TO job",
    [ST_REC_INSERT] =
        "INSERT INTO idem_record (space, key, fingerprint, state, epoch, owner,"
        " lease_until, created_ms, updated_ms)"
        " VALUES (?1, ?2, ?3, 'PROCESSING', ?7, ?4, ?5, ?6, ?6)"
        " ON CONFLICT (space, key) DO NOTHING",
    [ST_REC_GET] =
        "SELECT state, epoch, owner, lease_until, created_ms, updated_ms,"
        " expires_ms, fingerprint, result FROM idem_record"
        " WHERE space = ?1 AND key = ?2",
    [ST_REC_CAS] =
        "UPDATE idem_record SET state = ?3,"
        " epoch = CASE WHEN ?4 = 0 THEN epoch ELSE ?4 END,"
        " owner = COALESCE(?5, owner), lease_until = ?6,"
        " result = CASE WHEN ?7 THEN ?8 ELSE result END,"
        " expires_ms = CASE WHEN ?9 < 0 THEN expires_ms"
        "   WHEN ?9 = 0 THEN NULL ELSE ?9 END,"
        " updated_ms = ?10, fingerprint = COALESCE(?14, fingerprint)"
        " WHERE space = ?1 AND key = ?2 AND state = ?11"
        " AND (?12 = 0 OR epoch = ?12) AND (?13 = 0 OR lease_until <= ?13)",
    [ST_REC_PURGE] =
        "DELETE FROM idem_record WHERE rowid IN (SELECT rowid FROM idem_record"
        " WHERE expires_ms <= ?1 AND state <> 'PROCESSING' LIMIT ?2)",
    [ST_REC_DELETE] =
        "DELETE FROM idem_record WHERE space = ?1 AND key = ?2 AND epoch = ?3"
        " AND state <> 'PROCESSING' AND (?4 = 0 OR updated_ms = ?4)",
    [ST_INBOX_INSERT] =
        "INSERT INTO idem_inbox (grp, msg_id, biz_type, state, attempts,"
        " lease_until, created_ms, updated_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)"
        " ON CONFLICT (grp, msg_id) DO NOTHING",
    [ST_INBOX_GET] =
        "SELECT state, attempts, lease_until, biz_type FROM idem_inbox"
        " WHERE grp = ?1 AND msg_id = ?2",
    [ST_INBOX_CAS] =
        "UPDATE idem_inbox SET state = ?3, attempts = ?4, lease_until = ?5,"
        " updated_ms = ?6"
        " WHERE grp = ?1 AND msg_id = ?2 AND (?7 IS NULL OR state = ?7)"
        " AND attempts = ?8 AND (?9 = 0 OR lease_until <= ?9)",
};

/* A read-only connection for reads outside the writer's queue. */
struct reader {
    struct reader *next;
    sqlite3 *conn;
    sqlite3_stmt *get;
};

/* One of the store's three files (the database, its -wal, its -shm) and the
 * inode it had once the writer's connection had it open. */
struct store_file {
    char *path; /* NULL: not watched (an in-memory database) */
    dev_t dev;
    ino_t ino;
};

enum { F_DB, F_WAL, F_SHM, F_COUNT_ };

struct sqlite_db {
    sqlite3 *conn;
    sqlite3_stmt *st[ST_COUNT_];
    struct idem__gc *gc;
    char *path;                  /* NULL for ":memory:": no readers then */
    pthread_mutex_t readers_mu;
    struct reader *idle_readers; /* opened on demand, kept for reuse */
    int wal_frames;              /* writer only: the WAL's, at the last commit */

    struct store_file files[F_COUNT_];
    atomic_int gone;                /* a file was seen removed or replaced: for good */
    char gone_detail[160];          /* why, for each call refused; set before gone */
    pthread_mutex_t gone_mu;        /* one thread says it, once */
    _Atomic int64_t files_seen_us;  /* the last look at the files, monotonic */
    struct idem__gc_job wake;       /* a reader that found them gone wakes the writer */
    int kept;                       /* writer only: keep_acknowledged ran */
    idem_log_fn log;
    void *log_arg;
};

static idem_rc db_error(sqlite3 *conn, const char *what)
{
    int code = sqlite3_extended_errcode(conn);
    return idem__fail((code & 0xff) == SQLITE_NOMEM ? IDEM_ENOMEM : IDEM_ESTORE,
                      "sqlite: %s: %s (%d)", what, sqlite3_errmsg(conn), code);
}

/* Run a statement that returns no rows. */
static idem_rc exec_stmt(struct sqlite_db *d, int which)
{
    sqlite3_stmt *s = d->st[which];
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, sql[which]);
    return IDEM_OK;
}

/* ---- the files under the store ----
 *
 * SQLite opens its files once and never looks at their paths again. Once
 * one is unlinked, or another file renamed over it (a clean-up script, a
 * restore, a deploy that replaces the directory), the store would go on
 * writing to a file no one will open again: every write it acknowledged
 * would be gone at the next start, and each of those keys would execute
 * once more. A removed -wal takes what it holds with it at the next crash;
 * a removed -shm has the next process that opens the database index the
 * WAL apart from this one. So the store compares each path's inode with the
 * one it opened, and from the first difference on refuses every write and
 * read (IDEM_ESTORE), says why once in the log, and waits to be reopened.
 * With the database file itself still in place, the writer first copies
 * into it what the WAL it holds open has; with it gone or replaced, it
 * writes the database it still holds open to a file beside it, and back
 * at the path when the path is free (keep_acknowledged).
 *
 * None of the three changes inode by SQLite's own doing while the writer's
 * connection is open: the WAL and the -shm are opened with the database and
 * kept until the last connection closes (a checkpoint starts the WAL over
 * in the same file, and sqlite_wal.c opens the WAL as the default VFS
 * does, once).
 *
 * The writer looks after each COMMIT, before the batch's callers are
 * answered, so what it acknowledges was written to the files at the
 * store's paths: a look per file per batch. Readers look at most every
 * FILES_LOOK_US, so that a store no one writes to (a health check's reads)
 * finds out too. */
#define FILES_LOOK_US 100000

/* Which file is at path: its device and inode, 0; or -1 with errno set.
 * It asks for nothing else. A stat() would also read the file's times,
 * and on a filesystem with fine-grained timestamps (ext4 and XFS since
 * Linux 6.13) a file whose times were read gets a new one at its next
 * write: the WAL's inode is dirtied by every commit, and each commit's
 * fdatasync writes it to the disk as well as the frames (ext4 without a
 * journal: a second I/O, 40 us more a flush on a virtio disk). Asking for
 * the inode alone leaves the times unread, and the inode is then dirtied
 * when the coarse clock ticks, a few times a second. */
static int file_id(const char *path, dev_t *dev, ino_t *ino)
{
#ifdef STATX_INO
    struct statx sx;
    if (statx(AT_FDCWD, path, 0, STATX_INO, &sx) == 0) {
        *dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
        *ino = (ino_t)sx.stx_ino;
        return 0;
    }
    if (errno != ENOSYS)
        return -1;
#endif
    struct stat st;
    if (stat(path, &st) != 0)
        return -1;
    *dev = st.st_dev;
    *ino = st.st_ino;
    return 0;
}

/* Compare each watched path's inode with the one opened; at the first that
 * differs, mark the store gone and say why. */
static void look_at_files(struct sqlite_db *d)
{
    for (int i = 0; i < F_COUNT_; i++) {
        const struct store_file *f = &d->files[i];
        dev_t dev;
        ino_t ino;
        if (!f->path)
            continue;
        int there = file_id(f->path, &dev, &ino) == 0;
        if (there ? dev == f->dev && ino == f->ino : errno != ENOENT && errno != ENOTDIR)
            continue; /* the same file, or no answer (EIO, ENOMEM): look again later */
        char now[32] = "none";
        if (there)
            snprintf(now, sizeof now, "%llu", (unsigned long long)ino);
        pthread_mutex_lock(&d->gone_mu);
        int first = !atomic_load(&d->gone);
        if (first) {
            /* The detail reaches clients (idem serve's 503): the file by
             * its part, the path only in the log. */
            static const char *const part[F_COUNT_] = {"database file", "-wal file",
                                                       "-shm file"};
            snprintf(d->gone_detail, sizeof d->gone_detail,
                     "sqlite: the store's %s was removed or replaced under this process; "
                     "reopen the store",
                     part[i]);
            atomic_store(&d->gone, 1);
        }
        pthread_mutex_unlock(&d->gone_mu);
        /* The writer keeps what it acknowledged after its next batch
         * (keep_acknowledged): an idle one is handed an empty job, whose
         * batch fails at its begin. */
        if (first && !idem__gc_on_writer(d->gc))
            (void)idem__gc_queue(d->gc, &d->wake);
        if (first && d->log) {
            char line[512];
            snprintf(line, sizeof line,
                     "the store file %s was removed or replaced under the running process "
                     "(inode %llu -> %s): refusing writes and reads until the store is "
                     "reopened; restart the daemon",
                     f->path, (unsigned long long)f->ino, now);
            d->log(d->log_arg, IDEM_LOG_ALERT, line);
        }
        return;
    }
}

/* That job: it never runs (its batch is refused), and once done, there is
 * nothing to free. */
static idem_rc run_wake(struct idem__gc_job *job, void *ctx)
{
    (void)job;
    (void)ctx;
    return IDEM_OK;
}

static void on_wake_done(struct idem__gc_job *job)
{
    (void)job;
}

/* The database file is gone from its path, or another is there: its
 * records would go with this process, and a restart would execute every
 * acknowledged key again. The writer still has it open. It checkpoints
 * the WAL into it (truncating the WAL, so that one left at the path adds
 * nothing to the copy), copies the whole database with SQLite's backup
 * into PATH.idem-saved-TIME beside it, and when the path is free links
 * that copy there (link(), which never replaces a file that appeared
 * meanwhile). The file now at a taken path is not touched: the operator
 * is told where the records are. */
static void save_database(struct sqlite_db *d, const char *path)
{
    char saved[4200], line[9000];
    const char *why = NULL;
    sqlite3 *dst = NULL;
    snprintf(saved, sizeof saved, "%s.idem-saved-%lld", path, (long long)time(NULL));
    sqlite3_wal_checkpoint_v2(d->conn, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
    if (sqlite3_open_v2(saved, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "unix") !=
        SQLITE_OK) {
        why = dst ? sqlite3_errmsg(dst) : "out of memory";
    } else {
        sqlite3_backup *b = sqlite3_backup_init(dst, "main", d->conn, "main");
        int rc = b ? sqlite3_backup_step(b, -1) : SQLITE_ERROR;
        if (b)
            sqlite3_backup_finish(b);
        if (rc != SQLITE_DONE)
            why = sqlite3_errmsg(dst);
        else if (sqlite3_exec(dst, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) !=
                 SQLITE_OK)
            why = sqlite3_errmsg(dst);
    }
    if (why) {
        snprintf(line, sizeof line,
                 "saving the records of the store file %s, which is gone, to %s failed (%s): "
                 "they are lost when this process ends, and their keys execute again",
                 path, saved, why);
        sqlite3_close(dst);
        unlink(saved);
        if (d->log)
            d->log(d->log_arg, IDEM_LOG_ALERT, line);
        return;
    }
    sqlite3_close(dst); /* its own -wal, checkpointed and truncated, goes */
    if (link(saved, path) == 0) {
        unlink(saved);
        snprintf(line, sizeof line,
                 "the store file %s was gone: the records this process holds are written back "
                 "there; restart the daemon",
                 path);
        if (d->log)
            d->log(d->log_arg, IDEM_LOG_WARN, line);
        return;
    }
    snprintf(line, sizeof line,
             "the store file %s is another file now: the records this process held are saved "
             "in %s; put that file back at %s before the daemon starts again, or their keys "
             "execute again",
             path, saved, path);
    if (d->log)
        d->log(d->log_arg, IDEM_LOG_ALERT, line);
}

/* Writer only, after the batch that follows the files found gone. With
 * the -wal or the -shm gone, the database file at its path is still this
 * store's, and the WAL the writer holds open has every commit since the
 * last checkpoint: a crash now would take those of a removed -wal with it,
 * though each was acknowledged. A full checkpoint copies them into the
 * database file and syncs it, as the close would, so that none waits for
 * a clean stop. With the database file gone or replaced, its records are
 * saved (save_database). */
static void keep_acknowledged(struct sqlite_db *d)
{
    const struct store_file *f = &d->files[F_DB];
    dev_t dev;
    ino_t ino;
    if (d->kept)
        return;
    d->kept = 1;
    if (!f->path)
        return;
    if (file_id(f->path, &dev, &ino) != 0 || dev != f->dev || ino != f->ino) {
        save_database(d, f->path);
        return;
    }
    int frames = -1, copied = -1;
    int rc = sqlite3_wal_checkpoint_v2(d->conn, NULL, SQLITE_CHECKPOINT_FULL, &frames, &copied);
    if (!d->log)
        return;
    char line[512];
    if (rc == SQLITE_OK && copied == frames) {
        snprintf(line, sizeof line,
                 "the store file %s is still the one opened: every frame of the WAL (%d) "
                 "is checkpointed into it, and stays there after a crash",
                 f->path, frames);
        d->log(d->log_arg, IDEM_LOG_WARN, line);
    } else {
        snprintf(line, sizeof line,
                 "checkpointing the WAL into the store file %s failed (%s, %d of %d frames): "
                 "what the WAL held since the last checkpoint is lost if the process dies "
                 "before a clean stop",
                 f->path, rc == SQLITE_OK ? "busy" : sqlite3_errmsg(d->conn), copied, frames);
        d->log(d->log_arg, IDEM_LOG_ALERT, line);
    }
}

/* 1, with the thread's error detail set, once the store's files are not the
 * ones it opened. now: look at them now (the writer); else at most every
 * FILES_LOOK_US over all the threads that ask. */
static int files_gone(struct sqlite_db *d, int now)
{
    if (!atomic_load(&d->gone)) {
        int64_t t = idem__mono_us(), seen = atomic_load(&d->files_seen_us);
        if (now)
            atomic_store(&d->files_seen_us, t);
        else if (t - seen < FILES_LOOK_US ||
                 !atomic_compare_exchange_strong(&d->files_seen_us, &seen, t))
            return 0;
        look_at_files(d);
        if (!atomic_load(&d->gone))
            return 0;
    }
    idem__fail(IDEM_ESTORE, "%s", d->gone_detail);
    return 1;
}

/* Watch the files the writer's connection has open: the database and, as
 * SQLite names them, its -wal and -shm. None for a database in memory. */
static idem_rc watch_files(struct sqlite_db *d)
{
    static const char *const suffix[F_COUNT_] = {"", "-wal", "-shm"};
    const char *db = sqlite3_db_filename(d->conn, "main");
    if (!db || !*db)
        return IDEM_OK;
    size_t n = strlen(db);
    for (int i = 0; i < F_COUNT_; i++) {
        size_t m = strlen(suffix[i]);
        dev_t dev;
        ino_t ino;
        char *path = idem__malloc(n + m + 1);
        if (!path)
            return idem__fail(IDEM_ENOMEM, "sqlite: allocating");
        memcpy(path, db, n);
        memcpy(path + n, suffix[i], m + 1);
        if (file_id(path, &dev, &ino) != 0) {
            idem__free(path); /* SQLite has none open: nothing to watch */
            continue;
        }
        d->files[i] = (struct store_file){.path = path, .dev = dev, .ino = ino};
    }
    return IDEM_OK;
}

/* ---- the group-commit driver ---- */

static idem_rc drv_begin(void *ctx)
{
    struct sqlite_db *d = ctx;
    if (atomic_load(&d->gone))
        return idem__fail(IDEM_ESTORE, "%s", d->gone_detail);
    return exec_stmt(d, ST_BEGIN);
}

/* The COMMIT's WAL frames reach the kernel in one write (sqlite_wal.c). A
 * COMMIT that went to files no longer at the store's paths fails: its
 * writes are as good as lost, and no caller may be told otherwise. */
static idem_rc drv_commit(void *ctx)
{
    struct sqlite_db *d = ctx;
    idem__sqlite_wal_gather(d->conn);
    idem_rc rc = exec_stmt(d, ST_COMMIT);
    if (idem__sqlite_wal_gathered(d->conn, rc == IDEM_OK) != SQLITE_OK && rc == IDEM_OK)
        rc = idem__fail(IDEM_ESTORE, "sqlite: writing the WAL after a commit failed");
    if (rc == IDEM_OK && files_gone(d, 1))
        rc = IDEM_ESTORE;
    return rc;
}
static idem_rc drv_savepoint(void *ctx) { return exec_stmt(ctx, ST_SAVEPOINT); }
static idem_rc drv_release(void *ctx) { return exec_stmt(ctx, ST_RELEASE); }

static void drv_rollback(void *ctx)
{
    struct sqlite_db *d = ctx;
    if (!sqlite3_get_autocommit(d->conn))
        (void)exec_stmt(d, ST_ROLLBACK);
}

static void drv_rollback_to(void *ctx)
{
    /* ROLLBACK TO keeps the savepoint open; RELEASE closes it. */
    (void)exec_stmt(ctx, ST_ROLLBACK_TO);
    (void)exec_stmt(ctx, ST_RELEASE);
}

static int drv_in_transaction(void *ctx)
{
    struct sqlite_db *d = ctx;
    return !sqlite3_get_autocommit(d->conn);
}

/* SQLite's automatic checkpoint runs inside the COMMIT that takes the WAL
 * past its threshold, so that batch's callers waited for it (a few
 * milliseconds: pages copied into the database file, two fsyncs), though
 * their writes were durable before it began. The writer checkpoints at the
 * same threshold, in the same mode, once the batch's callers are answered:
 * only what is queued behind it waits. */
#define CHECKPOINT_FRAMES 1000 /* SQLite's own default */

static int on_wal_commit(void *ctx, sqlite3 *conn, const char *db, int frames)
{
    (void)conn;
    (void)db;
    ((struct sqlite_db *)ctx)->wal_frames = frames;
    return SQLITE_OK;
}

static void drv_after_batch(void *ctx)
{
    struct sqlite_db *d = ctx;
    if (atomic_load(&d->gone)) {
        keep_acknowledged(d);
        return;
    }
    if (d->wal_frames < CHECKPOINT_FRAMES)
        return;
    d->wal_frames = 0;
    /* As SQLite's own, a checkpoint that fails or cannot finish is tried
     * again after the next commit; the WAL keeps every frame meanwhile. */
    (void)sqlite3_wal_checkpoint_v2(d->conn, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL);
}

static const struct idem__gc_driver driver = {
    .begin = drv_begin,
    .commit = drv_commit,
    .rollback = drv_rollback,
    .savepoint = drv_savepoint,
    .release = drv_release,
    .rollback_to = drv_rollback_to,
    .in_transaction = drv_in_transaction,
    .after_batch = drv_after_batch,
};

/* ---- binding and reading ---- */

static void bind_text(sqlite3_stmt *s, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, i);
}

static void copy_text(char *dst, size_t cap, sqlite3_stmt *s, int col)
{
    const unsigned char *t = sqlite3_column_text(s, col);
    size_t n = t ? (size_t)sqlite3_column_bytes(s, col) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(dst, t, n);
    dst[n] = '\0';
}

/* Read (space, key) with statement s (ST_REC_GET's SQL) on conn into *cur.
 * *found 0 when there is no such row. */
static idem_rc read_record_on(sqlite3 *conn, sqlite3_stmt *s, const char *space,
                              const char *key, int *found, idem_record *cur)
{
    bind_text(s, 1, space);
    bind_text(s, 2, key);
    int rc = sqlite3_step(s);
    idem_rc out = IDEM_OK;
    *found = 0;
    if (rc == SQLITE_ROW) {
        *found = 1;
        if (cur) {
            memset(cur, 0, sizeof *cur);
            copy_text(cur->state, sizeof cur->state, s, 0);
            cur->epoch = (uint64_t)sqlite3_column_int64(s, 1);
            copy_text(cur->owner, sizeof cur->owner, s, 2);
            cur->lease_until_ms = sqlite3_column_int64(s, 3);
            cur->created_ms = sqlite3_column_int64(s, 4);
            cur->updated_ms = sqlite3_column_int64(s, 5);
            cur->expires_ms = sqlite3_column_int64(s, 6);
            if (sqlite3_column_bytes(s, 7) == IDEM_FINGERPRINT_LEN) {
                cur->has_fingerprint = 1;
                memcpy(cur->fingerprint, sqlite3_column_blob(s, 7),
                       IDEM_FINGERPRINT_LEN);
            }
            size_t n = (size_t)sqlite3_column_bytes(s, 8);
            if (n) {
                cur->result = idem__malloc(n);
                if (!cur->result)
                    out = idem__fail(IDEM_ENOMEM, "records: reading a %zu-byte result", n);
                else {
                    memcpy(cur->result, sqlite3_column_blob(s, 8), n);
                    cur->result_len = n;
                }
            }
        }
    } else if (rc != SQLITE_DONE) {
        out = db_error(conn, "reading a record");
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return out;
}

static idem_rc read_record(struct sqlite_db *d, const char *space, const char *key,
                           int *found, idem_record *cur)
{
    return read_record_on(d->conn, d->st[ST_REC_GET], space, key, found, cur);
}

/* ---- records ---- */

struct rec_job {
    struct idem__gc_job job;
    const struct idem__rec_new *n;
    const struct idem__rec_cas *c;
    const char *space, *key;
    int *inserted, *changed, *found;
    idem_record *cur;
    int64_t now;
    unsigned limit, *purged;
    uint64_t epoch;
    int64_t updated_ms; /* rec_delete: 0, or the row's as the caller saw it */
    int *deleted;
    const struct idem__rec_list *list;
    idem_record_item **items;
    size_t *count;
};

static idem_rc run_rec_insert(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    struct sqlite_db *d = ctx;
    sqlite3_stmt *s = d->st[ST_REC_INSERT];
    const struct idem__rec_new *n = j->n;
    bind_text(s, 1, n->space);
    bind_text(s, 2, n->key);
    if (n->fingerprint)
        sqlite3_bind_blob(s, 3, n->fingerprint, IDEM_FINGERPRINT_LEN, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 3);
    bind_text(s, 4, n->owner);
    sqlite3_bind_int64(s, 5, n->lease_until);
    sqlite3_bind_int64(s, 6, n->now);
    sqlite3_bind_int64(s, 7, (sqlite3_int64)n->epoch);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "inserting a record");
    *j->inserted = sqlite3_changes(d->conn) == 1;
    if (*j->inserted)
        return IDEM_OK;
    int found;
    idem_rc r = read_record(d, n->space, n->key, &found, j->cur);
    if (r == IDEM_OK && !found)
        r = idem__fail(IDEM_ESTORE, "records: row vanished inside a transaction");
    return r;
}

static idem_rc run_rec_cas(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    struct sqlite_db *d = ctx;
    const struct idem__rec_cas *c = j->c;
    sqlite3_stmt *s = d->st[ST_REC_CAS];
    bind_text(s, 1, c->space);
    bind_text(s, 2, c->key);
    bind_text(s, 3, c->state);
    sqlite3_bind_int64(s, 4, (sqlite3_int64)c->epoch);
    bind_text(s, 5, c->owner);
    sqlite3_bind_int64(s, 6, c->lease_until);
    sqlite3_bind_int(s, 7, c->set_result);
    if (c->set_result && c->result_len)
        sqlite3_bind_blob64(s, 8, c->result, c->result_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 8);
    sqlite3_bind_int64(s, 9, c->expires_ms);
    sqlite3_bind_int64(s, 10, c->now);
    bind_text(s, 11, c->expect_state);
    sqlite3_bind_int64(s, 12, (sqlite3_int64)c->expect_epoch);
    sqlite3_bind_int64(s, 13, c->lease_expired_at);
    if (c->fingerprint)
        sqlite3_bind_blob(s, 14, c->fingerprint, IDEM_FINGERPRINT_LEN, SQLITE_STATIC);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "updating a record");
    *j->changed = sqlite3_changes(d->conn) == 1;
    *j->found = 1;
    if (*j->changed || !j->cur)
        return IDEM_OK;
    return read_record(d, c->space, c->key, j->found, j->cur);
}

static idem_rc run_rec_get(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    return read_record(ctx, j->space, j->key, j->found, j->cur);
}

static idem_rc run_rec_purge(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    struct sqlite_db *d = ctx;
    sqlite3_stmt *s = d->st[ST_REC_PURGE];
    sqlite3_bind_int64(s, 1, j->now);
    sqlite3_bind_int64(s, 2, j->limit);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "purging records");
    *j->purged = (unsigned)sqlite3_changes(d->conn);
    return IDEM_OK;
}

static idem_rc run_rec_delete(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    struct sqlite_db *d = ctx;
    sqlite3_stmt *s = d->st[ST_REC_DELETE];
    bind_text(s, 1, j->space);
    bind_text(s, 2, j->key);
    sqlite3_bind_int64(s, 3, (sqlite3_int64)j->epoch);
    sqlite3_bind_int64(s, 4, (sqlite3_int64)j->updated_ms);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "deleting a record");
    *j->deleted = sqlite3_changes(d->conn) == 1;
    *j->found = 1;
    if (*j->deleted)
        return IDEM_OK;
    return read_record(d, j->space, j->key, j->found, j->cur);
}

/* A listing on conn. The statement is made for the query, with only the
 * conditions it has, so that the planner sees which index serves it: the
 * primary key for a key prefix (a range, never LIKE: no byte of the prefix
 * is a wildcard), idem_record_processing for PROCESSING, whose condition
 * must be written out as the index's is for SQLite to use it, and
 * idem_record_created for the rest. Every value is a parameter. */
static idem_rc list_on(sqlite3 *conn, const struct idem__rec_list *l, idem_record_item **items,
                       size_t *count)
{
    char q[1024];
    int is_processing = l->state && strcmp(l->state, IDEM_STATE_PROCESSING) == 0;
    snprintf(q, sizeof q,
             "SELECT key, state, epoch, owner, lease_until, created_ms, updated_ms,"
             " expires_ms, length(result), substr(result, 1, %d) FROM idem_record"
             " WHERE space = ?1%s%s%s%s%s%s%s"
             " ORDER BY created_ms DESC, key DESC LIMIT ?10",
             IDEM_RESULT_HEAD, l->prefix ? " AND key >= ?2" : "",
             l->prefix && l->prefix_upper ? " AND key < ?3" : "",
             is_processing ? " AND state = 'PROCESSING'" : l->state ? " AND state = ?4" : "",
             l->created_before ? " AND created_ms < ?5" : "",
             l->created_after ? " AND created_ms > ?6" : "",
             l->min_lease_span ? " AND lease_until - updated_ms > ?7" : "",
             l->after_key ? " AND (created_ms, key) < (?8, ?9)" : "");
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(conn, q, -1, &s, NULL) != SQLITE_OK)
        return db_error(conn, "listing records");
    bind_text(s, 1, l->space);
    bind_text(s, 2, l->prefix);
    bind_text(s, 3, l->prefix_upper);
    bind_text(s, 4, l->state);
    sqlite3_bind_int64(s, 5, l->created_before);
    sqlite3_bind_int64(s, 6, l->created_after);
    sqlite3_bind_int64(s, 7, l->min_lease_span);
    sqlite3_bind_int64(s, 8, l->after_created);
    bind_text(s, 9, l->after_key);
    sqlite3_bind_int64(s, 10, l->fetch);
    idem_record_item *out = idem__calloc(l->fetch ? l->fetch : 1, sizeof *out);
    size_t n = 0;
    idem_rc rc = out ? IDEM_OK : idem__fail(IDEM_ENOMEM, "records: listing %u", l->fetch);
    int step;
    while (rc == IDEM_OK && n < l->fetch && (step = sqlite3_step(s)) == SQLITE_ROW) {
        idem_record_item *it = &out[n++];
        copy_text(it->key, sizeof it->key, s, 0);
        copy_text(it->state, sizeof it->state, s, 1);
        it->epoch = (uint64_t)sqlite3_column_int64(s, 2);
        copy_text(it->owner, sizeof it->owner, s, 3);
        it->lease_until_ms = sqlite3_column_int64(s, 4);
        it->created_ms = sqlite3_column_int64(s, 5);
        it->updated_ms = sqlite3_column_int64(s, 6);
        it->expires_ms = sqlite3_column_int64(s, 7);
        it->result_len = (size_t)sqlite3_column_int64(s, 8);
        size_t head = (size_t)sqlite3_column_bytes(s, 9);
        if (head > IDEM_RESULT_HEAD)
            head = IDEM_RESULT_HEAD;
        if (head)
            memcpy(it->result_head, sqlite3_column_blob(s, 9), head);
        it->result_head_len = head;
    }
    if (rc == IDEM_OK && n < l->fetch && step != SQLITE_DONE)
        rc = db_error(conn, "listing records");
    sqlite3_finalize(s);
    if (rc != IDEM_OK) {
        idem__free(out);
        return rc;
    }
    *items = out;
    *count = n;
    return IDEM_OK;
}

static idem_rc run_rec_list(struct idem__gc_job *job, void *ctx)
{
    struct rec_job *j = (struct rec_job *)job;
    struct sqlite_db *d = ctx;
    return list_on(d->conn, j->list, j->items, j->count);
}

/* A record job's result is freed if the batch that ran it did not commit. */
static idem_rc submit_rec(struct sqlite_db *d, struct rec_job *j)
{
    idem_rc rc = idem__gc_submit(d->gc, &j->job);
    if (rc != IDEM_OK && j->cur) {
        idem__free(j->cur->result);
        j->cur->result = NULL;
        j->cur->result_len = 0;
    }
    return rc;
}

static idem_rc rec_insert(void *db, const struct idem__rec_new *n,
                          int *inserted, idem_record *cur)
{
    /* One single-row statement, and a read only when it wrote nothing: a
     * failure leaves no write, so no savepoint (likewise rec_cas, rec_get;
     * not rec_purge, whose DELETE of many rows an error could stop
     * halfway). */
    struct rec_job j = {.job.run = run_rec_insert, .job.single_write = 1, .n = n,
                        .inserted = inserted, .cur = cur};
    if (cur)
        memset(cur, 0, sizeof *cur);
    return submit_rec(db, &j);
}

static idem_rc rec_cas(void *db, const struct idem__rec_cas *c, int *changed,
                       int *found, idem_record *cur)
{
    struct rec_job j = {.job.run = run_rec_cas, .job.single_write = 1, .c = c,
                        .changed = changed, .found = found, .cur = cur};
    if (cur)
        memset(cur, 0, sizeof *cur);
    return submit_rec(db, &j);
}

static void reader_free(struct reader *r)
{
    if (!r)
        return;
    sqlite3_finalize(r->get);
    sqlite3_close(r->conn);
    idem__free(r);
}

/* A reader from the pool, or a new one. */
static idem_rc reader_take(struct sqlite_db *d, struct reader **out)
{
    pthread_mutex_lock(&d->readers_mu);
    struct reader *r = d->idle_readers;
    if (r)
        d->idle_readers = r->next;
    pthread_mutex_unlock(&d->readers_mu);
    if (r) {
        *out = r;
        return IDEM_OK;
    }
    r = idem__calloc(1, sizeof *r);
    if (!r)
        return idem__fail(IDEM_ENOMEM, "sqlite: allocating a reader");
    idem_rc rc = IDEM_OK;
    if (sqlite3_open_v2(d->path, &r->conn, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                        NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(r->conn, 5000) != SQLITE_OK ||
        sqlite3_prepare_v3(r->conn, sql[ST_REC_GET], -1, SQLITE_PREPARE_PERSISTENT, &r->get,
                           NULL) != SQLITE_OK)
        rc = r->conn ? db_error(r->conn, "opening a reader")
                     : idem__fail(IDEM_ENOMEM, "sqlite: opening a reader");
    if (rc != IDEM_OK) {
        reader_free(r);
        return rc;
    }
    *out = r;
    return IDEM_OK;
}

static void reader_give_back(struct sqlite_db *d, struct reader *r)
{
    pthread_mutex_lock(&d->readers_mu);
    r->next = d->idle_readers;
    d->idle_readers = r;
    pthread_mutex_unlock(&d->readers_mu);
}

/* A read outside the writer's queue: WAL lets readers see the last commit
 * without waiting for the writer. Only committed (and so, with
 * synchronous=FULL, durable) rows are visible. An in-memory database has one
 * connection, so there it goes through the writer. */
static idem_rc rec_get(void *db, const char *space, const char *key,
                       int *found, idem_record *cur)
{
    struct sqlite_db *d = db;
    if (cur)
        memset(cur, 0, sizeof *cur);
    if (!d->path) {
        struct rec_job j = {.job.run = run_rec_get, .job.single_write = 1, .space = space,
                            .key = key, .found = found, .cur = cur};
        return submit_rec(db, &j);
    }
    /* A reader opened before a file was replaced still reads the old one. */
    if (files_gone(d, 0))
        return IDEM_ESTORE;
    struct reader *r = NULL;
    idem_rc rc = reader_take(d, &r);
    if (rc != IDEM_OK)
        return rc;
    rc = read_record_on(r->conn, r->get, space, key, found, cur);
    reader_give_back(d, r);
    if (rc != IDEM_OK && cur) {
        idem__free(cur->result);
        cur->result = NULL;
        cur->result_len = 0;
    }
    return rc;
}

/* ---- without waiting: the _start operations ---- */

/* A job whose caller does not wait: the writer calls c->done after its
 * batch, where it would have woken the caller. */
struct rec_started {
    struct rec_job j;
    struct idem__call *call;
};

static void rec_started_done(struct idem__gc_job *job)
{
    struct rec_started *a = (struct rec_started *)job;
    idem_rc rc = job->rc;
    char detail[sizeof job->detail];
    memcpy(detail, job->detail, sizeof detail);
    if (rc != IDEM_OK && a->j.cur) {
        idem__free(a->j.cur->result);
        a->j.cur->result = NULL;
        a->j.cur->result_len = 0;
    }
    if (rc != IDEM_OK && a->j.items) { /* a listing whose batch did not commit */
        idem__free(*a->j.items);
        *a->j.items = NULL;
        *a->j.count = 0;
    }
    struct idem__call *call = a->call;
    idem__free(a);
    call->done(call, rc, rc == IDEM_OK ? "" : detail);
}

static idem_rc start_rec(struct sqlite_db *d, const struct rec_job *model,
                         struct idem__call *call)
{
    struct rec_started *a = idem__malloc(sizeof *a);
    if (!a)
        return idem__fail(IDEM_ENOMEM, "sqlite: no memory for a record call");
    a->j = *model;
    a->j.job.on_done = rec_started_done;
    a->call = call;
    if (a->j.cur)
        memset(a->j.cur, 0, sizeof *a->j.cur);
    idem_rc rc = idem__gc_queue(d->gc, &a->j.job);
    if (rc != IDEM_OK)
        idem__free(a);
    return rc;
}

static idem_rc rec_insert_start(void *db, const struct idem__rec_new *n, int *inserted,
                                idem_record *cur, struct idem__call *c)
{
    struct rec_job j = {.job.run = run_rec_insert, .job.single_write = 1, .n = n,
                        .inserted = inserted, .cur = cur};
    return start_rec(db, &j, c);
}

static idem_rc rec_cas_start(void *db, const struct idem__rec_cas *cas, int *changed,
                             int *found, idem_record *cur, struct idem__call *c)
{
    struct rec_job j = {.job.run = run_rec_cas, .job.single_write = 1, .c = cas,
                        .changed = changed, .found = found, .cur = cur};
    return start_rec(db, &j, c);
}

/* A file's committed rows are read at once, on a reader (rec_get), and the
 * answer given before this returns; an in-memory database's read is a job
 * of the writer's. */
static idem_rc rec_get_start(void *db, const char *space, const char *key, int *found,
                             idem_record *cur, struct idem__call *c)
{
    struct sqlite_db *d = db;
    if (!d->path) {
        struct rec_job j = {.job.run = run_rec_get, .job.single_write = 1, .space = space,
                            .key = key, .found = found, .cur = cur};
        return start_rec(d, &j, c);
    }
    idem_rc rc = rec_get(db, space, key, found, cur);
    c->done(c, rc, rc == IDEM_OK ? "" : idem_errdetail());
    return IDEM_OK;
}

static idem_rc rec_delete_start(void *db, const char *space, const char *key, uint64_t epoch,
                                int64_t updated_ms, int *deleted, int *found,
                                idem_record *cur, struct idem__call *c)
{
    struct rec_job j = {.job.run = run_rec_delete, .job.single_write = 1, .space = space,
                        .key = key, .epoch = epoch, .updated_ms = updated_ms,
                        .deleted = deleted, .found = found, .cur = cur};
    return start_rec(db, &j, c);
}

static idem_rc rec_purge_start(void *db, int64_t now, unsigned limit, unsigned *purged,
                               struct idem__call *c)
{
    struct rec_job j = {.job.run = run_rec_purge, .now = now, .limit = limit,
                        .purged = purged};
    return start_rec(db, &j, c);
}

/* A listing without waiting is a job of the writer's, unlike a get's read
 * (rec_get_start), which is one probe of the primary key and is made at
 * once on the caller's thread. A listing's cost is the query's: a state or
 * lease condition over a large space may walk much of an index before it
 * has 500 rows, and the caller's thread is an event loop that every other
 * call on it would wait for, its token and lock calls included. The writer
 * is the thread that is there to block on the file; the listing delays its
 * batch's COMMIT as a purge's DELETE does, for an operator's call made a
 * few times a minute. It runs inside the batch, so it may read rows of
 * writes made before it in that batch, not yet committed; but its answer,
 * like theirs, is given only once the batch is durable, and a batch that
 * fails fails the listing too: it never shows a row that was not kept. It
 * writes nothing, so it needs no savepoint (single_write). */
static idem_rc rec_list_start(void *db, const struct idem__rec_list *l,
                              idem_record_item **items, size_t *count, struct idem__call *c)
{
    *items = NULL;
    *count = 0;
    struct rec_job j = {.job.run = run_rec_list, .job.single_write = 1, .list = l,
                        .items = items, .count = count};
    return start_rec(db, &j, c);
}

/* The hint for begin: from a reader. None where the only connection to read
 * is the writer's, an in-memory database: the peek exists to spare a begin
 * the queue, and there it would queue. */
static idem_rc rec_peek(void *db, const char *space, const char *key, int *found,
                        idem_record *cur)
{
    struct sqlite_db *d = db;
    if (!d->path) {
        *found = 0;
        if (cur)
            memset(cur, 0, sizeof *cur);
        return IDEM_OK;
    }
    return rec_get(db, space, key, found, cur);
}

static idem_rc rec_purge(void *db, int64_t now, unsigned limit, unsigned *purged)
{
    struct rec_job j = {.job.run = run_rec_purge, .now = now, .limit = limit,
                        .purged = purged};
    return submit_rec(db, &j);
}

static idem_rc rec_delete(void *db, const char *space, const char *key, uint64_t epoch,
                          int64_t updated_ms, int *deleted, int *found, idem_record *cur)
{
    struct rec_job j = {.job.run = run_rec_delete, .job.single_write = 1, .space = space,
                        .key = key, .epoch = epoch, .updated_ms = updated_ms,
                        .deleted = deleted, .found = found, .cur = cur};
    if (cur)
        memset(cur, 0, sizeof *cur);
    return submit_rec(db, &j);
}

/* From a reader, as rec_get reads; through the writer where there is none. */
static idem_rc rec_list(void *db, const struct idem__rec_list *l, idem_record_item **items,
                        size_t *count)
{
    struct sqlite_db *d = db;
    *items = NULL;
    *count = 0;
    if (!d->path) {
        struct rec_job j = {.job.run = run_rec_list, .job.single_write = 1, .list = l,
                            .items = items, .count = count};
        idem_rc rc = idem__gc_submit(d->gc, &j.job);
        if (rc != IDEM_OK) {
            idem__free(*items);
            *items = NULL;
            *count = 0;
        }
        return rc;
    }
    if (files_gone(d, 0))
        return IDEM_ESTORE;
    struct reader *r = NULL;
    idem_rc rc = reader_take(d, &r);
    if (rc != IDEM_OK)
        return rc;
    rc = list_on(r->conn, l, items, count);
    reader_give_back(d, r);
    return rc;
}

/* ---- inbox ---- */

struct inbox_job {
    struct idem__gc_job job;
    const char *group, *msg_id, *biz_type, *state;
    unsigned attempts;
    int64_t lease_until, now;
    const struct idem__inbox_cas *c;
    int *inserted, *changed, *found;
    idem_inbox_entry *cur;
};

static idem_rc read_inbox(struct sqlite_db *d, const char *group,
                          const char *msg_id, int *found, idem_inbox_entry *cur)
{
    sqlite3_stmt *s = d->st[ST_INBOX_GET];
    bind_text(s, 1, group);
    bind_text(s, 2, msg_id);
    int rc = sqlite3_step(s);
    idem_rc out = IDEM_OK;
    *found = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW && cur) {
        copy_text(cur->state, sizeof cur->state, s, 0);
        cur->attempts = (unsigned)sqlite3_column_int64(s, 1);
        cur->lease_until_ms = sqlite3_column_int64(s, 2);
        copy_text(cur->biz_type, sizeof cur->biz_type, s, 3);
    } else if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        out = db_error(d->conn, "reading an inbox entry");
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return out;
}

static idem_rc run_inbox_insert(struct idem__gc_job *job, void *ctx)
{
    struct inbox_job *j = (struct inbox_job *)job;
    struct sqlite_db *d = ctx;
    sqlite3_stmt *s = d->st[ST_INBOX_INSERT];
    bind_text(s, 1, j->group);
    bind_text(s, 2, j->msg_id);
    bind_text(s, 3, j->biz_type ? j->biz_type : "");
    bind_text(s, 4, j->state);
    sqlite3_bind_int64(s, 5, j->attempts);
    sqlite3_bind_int64(s, 6, j->lease_until);
    sqlite3_bind_int64(s, 7, j->now);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "inserting an inbox entry");
    *j->inserted = sqlite3_changes(d->conn) == 1;
    int found;
    idem_rc r = read_inbox(d, j->group, j->msg_id, &found, j->cur);
    if (r == IDEM_OK && !found)
        r = idem__fail(IDEM_ESTORE, "inbox: row vanished inside a transaction");
    return r;
}

static idem_rc run_inbox_cas(struct idem__gc_job *job, void *ctx)
{
    struct inbox_job *j = (struct inbox_job *)job;
    struct sqlite_db *d = ctx;
    const struct idem__inbox_cas *c = j->c;
    sqlite3_stmt *s = d->st[ST_INBOX_CAS];
    bind_text(s, 1, c->group);
    bind_text(s, 2, c->msg_id);
    bind_text(s, 3, c->state);
    sqlite3_bind_int64(s, 4, c->attempts);
    sqlite3_bind_int64(s, 5, c->lease_until);
    sqlite3_bind_int64(s, 6, c->now);
    bind_text(s, 7, c->expect_state);
    sqlite3_bind_int64(s, 8, c->expect_attempts);
    sqlite3_bind_int64(s, 9, c->lease_expired_at);
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    if (rc != SQLITE_DONE)
        return db_error(d->conn, "updating an inbox entry");
    *j->changed = sqlite3_changes(d->conn) == 1;
    return read_inbox(d, c->group, c->msg_id, j->found, j->cur);
}

static idem_rc inbox_insert(void *db, const char *group, const char *msg_id,
                            const char *biz_type, const char *state,
                            unsigned attempts, int64_t lease_until, int64_t now,
                            int *inserted, idem_inbox_entry *cur)
{
    struct sqlite_db *d = db;
    struct inbox_job j = {.job.run = run_inbox_insert, .group = group,
                          .msg_id = msg_id, .biz_type = biz_type, .state = state,
                          .attempts = attempts, .lease_until = lease_until,
                          .now = now, .inserted = inserted, .cur = cur};
    return idem__gc_submit(d->gc, &j.job);
}

static idem_rc inbox_cas(void *db, const struct idem__inbox_cas *c, int *changed,
                         int *found, idem_inbox_entry *cur)
{
    struct sqlite_db *d = db;
    struct inbox_job j = {.job.run = run_inbox_cas, .c = c, .changed = changed,
                          .found = found, .cur = cur};
    return idem__gc_submit(d->gc, &j.job);
}

/* ---- open and close ---- */

static void commit_stats(void *db, idem_stats *stats, idem_commit_times *times,
                         idem_commit_batches *batches)
{
    struct sqlite_db *d = db;
    idem__gc_stats(d->gc, stats, times, batches);
}

static void sqlite_close(void *db)
{
    struct sqlite_db *d = db;
    if (!d)
        return;
    idem__gc_stop(d->gc);
    while (d->idle_readers) {
        struct reader *r = d->idle_readers;
        d->idle_readers = r->next;
        reader_free(r);
    }
    pthread_mutex_destroy(&d->readers_mu);
    pthread_mutex_destroy(&d->gone_mu);
    for (int i = 0; i < F_COUNT_; i++)
        idem__free(d->files[i].path);
    idem__free(d->path);
    for (int i = 0; i < ST_COUNT_; i++)
        sqlite3_finalize(d->st[i]);
    sqlite3_close(d->conn);
    idem__free(d);
}

static const struct idem__db_ops sqlite_ops = {
    .version = IDEM_DB_OPS_VERSION,
    .name = "sqlite",
    .rec_insert = rec_insert,
    .rec_cas = rec_cas,
    .rec_get = rec_get,
    .rec_peek = rec_peek,
    .rec_purge = rec_purge,
    .inbox_insert = inbox_insert,
    .inbox_cas = inbox_cas,
    .commit_stats = commit_stats,
    .close = sqlite_close,
    .rec_delete = rec_delete,
    .rec_list = rec_list,
    .rec_insert_start = rec_insert_start,
    .rec_cas_start = rec_cas_start,
    .rec_get_start = rec_get_start,
    .rec_delete_start = rec_delete_start,
    .rec_list_start = rec_list_start,
    .rec_purge_start = rec_purge_start,
};

/* Set up the file: WAL, FULL sync, the schema, the schema version. */
static idem_rc prepare_file(struct sqlite_db *d, const char *path)
{
    char *err = NULL;
    int version = -1;
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(d->conn, "PRAGMA user_version", -1, &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW)
        version = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    if (version < 0)
        return db_error(d->conn, path);
    if (version > SCHEMA_VERSION)
        return idem__fail(IDEM_ESTORE,
                          "sqlite: %s has schema version %d; this Idem knows up to %d",
                          path, version, SCHEMA_VERSION);
    /* secure_delete=FAST: what a purge or an update frees inside a page is
     * zeroed, as with ON (Debian's build default), but a page that is freed
     * whole keeps its bytes until it is used again, instead of being written
     * once more only to be zeroed (docs/architecture.md, "What the embedded
     * store does not survive"). */
    const char *setup = "PRAGMA journal_mode=WAL;"
                        "PRAGMA synchronous=FULL;"
                        "PRAGMA secure_delete=FAST;"
                        "PRAGMA foreign_keys=ON;";
    if (sqlite3_exec(d->conn, setup, NULL, NULL, &err) != SQLITE_OK ||
        sqlite3_exec(d->conn, "BEGIN IMMEDIATE", NULL, NULL, &err) != SQLITE_OK ||
        sqlite3_exec(d->conn, schema, NULL, NULL, &err) != SQLITE_OK ||
        sqlite3_exec(d->conn, "PRAGMA user_version=1; COMMIT", NULL, NULL, &err) != SQLITE_OK) {
        idem_rc rc = idem__fail(IDEM_ESTORE, "sqlite: setting up %s: %s", path,
                                err ? err : sqlite3_errmsg(d->conn));
        sqlite3_free(err);
        if (!sqlite3_get_autocommit(d->conn))
            sqlite3_exec(d->conn, "ROLLBACK", NULL, NULL, NULL);
        return rc;
    }
    return IDEM_OK;
}

idem_rc idem__sqlite_open(const idem_options *o, const struct idem__db_ops **ops,
                          void **out)
{
    struct sqlite_db *d = idem__calloc(1, sizeof *d);
    idem_rc rc = IDEM_OK;
    if (!d)
        return idem__fail(IDEM_ENOMEM, "sqlite: allocating");
    pthread_mutex_init(&d->readers_mu, NULL);
    pthread_mutex_init(&d->gone_mu, NULL);
    d->log = o->log;
    d->log_arg = o->log_arg;
    d->wake.run = run_wake;
    d->wake.on_done = on_wake_done;
    if (strcmp(o->path, ":memory:") != 0 && strncmp(o->path, "file:", 5) != 0 &&
        !(d->path = idem__strndup(o->path, strlen(o->path)))) {
        sqlite_close(d);
        return idem__fail(IDEM_ENOMEM, "sqlite: allocating");
    }
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
    /* The writer's connection on the VFS that writes a commit's WAL frames
     * in one call (drv_commit): prepare_file sets synchronous=FULL, its
     * precondition (sqlite_wal.c), and it is the only connection that
     * commits with it. The readers stay on the default VFS. */
    const char *vfs = idem__sqlite_wal_vfs() == SQLITE_OK ? IDEM_SQLITE_WAL_VFS : NULL;
    if (sqlite3_open_v2(o->path, &d->conn, flags, vfs) != SQLITE_OK) {
        rc = d->conn ? db_error(d->conn, o->path)
                     : idem__fail(IDEM_ENOMEM, "sqlite: opening %s", o->path);
        goto fail;
    }
    sqlite3_extended_result_codes(d->conn, 1);
    sqlite3_busy_timeout(d->conn, 5000);
    if ((rc = prepare_file(d, o->path)) != IDEM_OK || (rc = watch_files(d)) != IDEM_OK)
        goto fail;
    /* In place of SQLite's automatic checkpoint (see drv_after_batch). */
    sqlite3_wal_hook(d->conn, on_wal_commit, d);
    for (int i = 0; i < ST_COUNT_; i++)
        if (sqlite3_prepare_v3(d->conn, sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                               &d->st[i], NULL) != SQLITE_OK) {
            rc = db_error(d->conn, sql[i]);
            goto fail;
        }
    if ((rc = idem__gc_start(&driver, d, o->commit_batch_max, &d->gc)) != IDEM_OK)
        goto fail;
    *ops = &sqlite_ops;
    *out = d;
    return IDEM_OK;
fail:
    sqlite_close(d);
    return rc;
}
