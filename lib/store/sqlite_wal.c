/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sqlite_wal.c — a VFS over SQLite's default one that hands a commit's WAL
 * writes to the kernel in one call (store layer).
 *
 * SQLite appends a commit to the write-ahead log frame by frame, and each
 * frame in two writes: its 24-byte header, then its page. A commit of ten
 * pages is twenty pwrite calls, on the writer thread, before the fsync. This
 * VFS gathers the writes that follow one another in a WAL file in a buffer
 * and writes the buffer in one pwrite when SQLite syncs the file, or sooner
 * when it must: before any other operation on the file that could see or
 * change what is buffered (a read of a buffered range, a write elsewhere,
 * the size, a truncation, a file control, closing), and when the buffer is
 * full.
 *
 * It gathers only while its connection runs a COMMIT, between
 * idem__sqlite_wal_gather() and idem__sqlite_wal_gathered(); at any other
 * time writes go straight through. Within a COMMIT the buffer holds only
 * what SQLite has not yet synced, and nothing unsynced was promised to
 * anyone: with synchronous=FULL SQLite syncs the WAL at every commit before
 * it publishes the new frames in the WAL index, so another connection never
 * needs a frame this one still holds. That ordering is the precondition:
 * only a connection that commits with synchronous=FULL (or EXTRA) may gather,
 * and the store gathers only on its writer connection. Scoping it to the
 * COMMIT keeps two things out of the buffer: pages a transaction spills to
 * the WAL before its COMMIT (a failed write there is SQLite's own to handle,
 * as without this VFS), and what a failed COMMIT leaves behind, which is
 * dropped when the COMMIT ends, never written later over frames another
 * connection may have committed meanwhile.
 *
 * A failed flush is final for the COMMIT: every later call that flushes
 * fails too, the sync among them, so the COMMIT cannot succeed with frames
 * missing from the file.
 */
#include "sqlite_wal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The buffer, and so the most one write hands the default VFS: its writes
 * must stay under 128 KiB (unixWrite masks a larger count with 0x1ffff, and
 * a write of 256 KiB would write nothing). 64 KiB holds a commit of 15
 * pages of 4 KiB; a bigger one takes a write per 64 KiB. */
#define WAL_BUF_CAP (64 * 1024)

struct wal_file {
    sqlite3_file base;
    sqlite3_file *real; /* the default VFS's file, in the same allocation */
    char *buf;
    size_t len;
    sqlite3_int64 off;  /* where buf[0] goes in the file */
    int gathering;      /* a COMMIT runs: writes may be held in buf */
    int failed;         /* a flush failed during this COMMIT */
};

static sqlite3_vfs wal_vfs;
static sqlite3_vfs *base_vfs;
static int register_rc = SQLITE_ERROR;
static pthread_once_t register_once = PTHREAD_ONCE_INIT;

static struct wal_file *wf(sqlite3_file *f)
{
    return (struct wal_file *)f;
}

static int flush(struct wal_file *w)
{
    if (w->failed)
        return SQLITE_IOERR_WRITE;
    if (!w->len)
        return SQLITE_OK;
    int rc = w->real->pMethods->xWrite(w->real, w->buf, (int)w->len, w->off);
    w->len = 0;
    if (rc != SQLITE_OK) {
        /* What was buffered is gone: nothing may succeed in this COMMIT. A
         * read error would not stop SQLite, so every caller sees a write
         * error, which puts SQLite's pager into its error state. */
        w->failed = 1;
        return SQLITE_IOERR_WRITE;
    }
    return SQLITE_OK;
}

static int wal_close(sqlite3_file *f)
{
    struct wal_file *w = wf(f);
    int rc = flush(w);
    int rc2 = w->real->pMethods->xClose(w->real);
    free(w->buf);
    w->buf = NULL;
    return rc != SQLITE_OK ? rc : rc2;
}

static int wal_read(sqlite3_file *f, void *dst, int n, sqlite3_int64 off)
{
    struct wal_file *w = wf(f);
    if (w->len && off < w->off + (sqlite3_int64)w->len && w->off < off + n) {
        int rc = flush(w);
        if (rc != SQLITE_OK)
            return rc;
    }
    return w->real->pMethods->xRead(w->real, dst, n, off);
}

static int wal_write(sqlite3_file *f, const void *src, int n, sqlite3_int64 off)
{
    struct wal_file *w = wf(f);
    if (w->failed ||
        (w->len && (off != w->off + (sqlite3_int64)w->len || w->len + (size_t)n > WAL_BUF_CAP))) {
        int rc = flush(w);
        if (rc != SQLITE_OK)
            return rc;
    }
    if (!w->gathering || (size_t)n > WAL_BUF_CAP)
        return w->real->pMethods->xWrite(w->real, src, n, off);
    if (!w->len)
        w->off = off;
    memcpy(w->buf + w->len, src, (size_t)n);
    w->len += (size_t)n;
    return SQLITE_OK;
}

static int wal_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    struct wal_file *w = wf(f);
    int rc = flush(w);
    return rc != SQLITE_OK ? rc : w->real->pMethods->xTruncate(w->real, size);
}

static int wal_sync(sqlite3_file *f, int flags)
{
    struct wal_file *w = wf(f);
    int rc = flush(w);
    return rc != SQLITE_OK ? rc : w->real->pMethods->xSync(w->real, flags);
}

static int wal_file_size(sqlite3_file *f, sqlite3_int64 *size)
{
    struct wal_file *w = wf(f);
    int rc = flush(w);
    return rc != SQLITE_OK ? rc : w->real->pMethods->xFileSize(w->real, size);
}

static int wal_lock(sqlite3_file *f, int level)
{
    return wf(f)->real->pMethods->xLock(wf(f)->real, level);
}

static int wal_unlock(sqlite3_file *f, int level)
{
    return wf(f)->real->pMethods->xUnlock(wf(f)->real, level);
}

static int wal_check_reserved(sqlite3_file *f, int *out)
{
    return wf(f)->real->pMethods->xCheckReservedLock(wf(f)->real, out);
}

static int wal_file_control(sqlite3_file *f, int op, void *arg)
{
    struct wal_file *w = wf(f);
    int rc = flush(w);
    return rc != SQLITE_OK ? rc : w->real->pMethods->xFileControl(w->real, op, arg);
}

static int wal_sector_size(sqlite3_file *f)
{
    return wf(f)->real->pMethods->xSectorSize(wf(f)->real);
}

static int wal_device_characteristics(sqlite3_file *f)
{
    return wf(f)->real->pMethods->xDeviceCharacteristics(wf(f)->real);
}

/* Only the methods of version 1: a WAL file is never mapped into memory nor
 * has shared memory of its own (that is the database file's -shm). */
static const sqlite3_io_methods wal_methods = {
    .iVersion = 1,
    .xClose = wal_close,
    .xRead = wal_read,
    .xWrite = wal_write,
    .xTruncate = wal_truncate,
    .xSync = wal_sync,
    .xFileSize = wal_file_size,
    .xLock = wal_lock,
    .xUnlock = wal_unlock,
    .xCheckReservedLock = wal_check_reserved,
    .xFileControl = wal_file_control,
    .xSectorSize = wal_sector_size,
    .xDeviceCharacteristics = wal_device_characteristics,
};

/* Where the default VFS's file starts in ours: a multiple of 16 bytes after
 * it, so as aligned as the memory SQLite hands us (8 bytes at least). */
static size_t real_offset(void)
{
    return (sizeof(struct wal_file) + 15) / 16 * 16;
}

static int wal_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)vfs;
    if (!(flags & SQLITE_OPEN_WAL))
        return base_vfs->xOpen(base_vfs, name, f, flags, out_flags);
    struct wal_file *w = wf(f);
    memset(w, 0, sizeof *w);
    w->real = (sqlite3_file *)((char *)f + real_offset());
    if (!(w->buf = malloc(WAL_BUF_CAP)))
        return SQLITE_NOMEM;
    int rc = base_vfs->xOpen(base_vfs, name, w->real, flags, out_flags);
    if (rc != SQLITE_OK) {
        /* The default VFS leaves pMethods NULL when it fails, and SQLite
         * calls no method then. */
        free(w->buf);
        w->buf = NULL;
        return rc;
    }
    w->base.pMethods = &wal_methods;
    return SQLITE_OK;
}

/* The default VFS with its files opened here: every other method is its
 * own, which needs nothing of the copy but what it copied (its pAppData). */
static void register_vfs(void)
{
    base_vfs = sqlite3_vfs_find(NULL);
    if (!base_vfs)
        return;
    wal_vfs = *base_vfs;
    wal_vfs.pNext = NULL;
    wal_vfs.zName = IDEM_SQLITE_WAL_VFS;
    /* Big enough for the default VFS's files too: they are opened in it. */
    wal_vfs.szOsFile = (int)(real_offset() + (size_t)base_vfs->szOsFile);
    wal_vfs.xOpen = wal_open;
    register_rc = sqlite3_vfs_register(&wal_vfs, 0);
}

int idem__sqlite_wal_vfs(void)
{
    pthread_once(&register_once, register_vfs);
    return register_rc;
}

/* conn's WAL file, if it is open on this VFS. */
static struct wal_file *wal_of(sqlite3 *conn)
{
    sqlite3_file *f = NULL;
    if (sqlite3_file_control(conn, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) != SQLITE_OK ||
        !f || f->pMethods != &wal_methods)
        return NULL;
    return wf(f);
}

void idem__sqlite_wal_gather(sqlite3 *conn)
{
    struct wal_file *w = wal_of(conn);
    if (w)
        w->gathering = 1;
}

int idem__sqlite_wal_gathered(sqlite3 *conn, int committed)
{
    struct wal_file *w = wal_of(conn);
    if (!w)
        return SQLITE_OK;
    /* After a COMMIT that succeeded, its sync has emptied the buffer; after
     * one that failed, what is left is of a transaction rolled back. */
    int rc = committed ? flush(w) : SQLITE_OK;
    w->len = 0;
    w->failed = 0;
    w->gathering = 0;
    return rc;
}
