/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_sqlite_wal.c — the VFS that writes a commit's WAL frames in one call
 * (lib/store/sqlite_wal.c), over a real SQLite file.
 *
 * A writer connection on the VFS, with synchronous=FULL, each COMMIT
 * between idem__sqlite_wal_gather() and _gathered() as the store's writer
 * does, and a reader on SQLite's default VFS, as the store's readers are.
 * What the VFS holds back must never be missed: after each COMMIT the reader
 * sees every row the writer committed, whole; the writer reads back pages it
 * spilled to the WAL mid-transaction; a rolled-back transaction leaves
 * nothing; transactions bigger than the VFS's buffer work; a write that
 * fails when the buffer is written fails the COMMIT and leaves nothing of
 * it; what a rolled-back transaction wrote never lands over what another
 * writer committed since; and the file reopened on the default VFS passes
 * SQLite's integrity check with every row. (Killing the process mid-commit
 * is store.durability.kill9's part: the embedded store's writer runs on
 * this VFS.)
 *
 * Under the VFS, as its default, a VFS of the test's own that fails the
 * next big write to a WAL file on demand.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/sqlite_wal.h"
#include "testlib.h"

/* ---- the VFS below: the default one, failing one WAL write on demand ---- */

static sqlite3_vfs *unix_vfs, faulty_vfs;
static const sqlite3_io_methods *unix_methods;
static sqlite3_io_methods faulty_methods;
static int fail_next_big_write; /* the next WAL write of more than a page */

static int faulty_write(sqlite3_file *f, const void *src, int n, sqlite3_int64 off)
{
    if (fail_next_big_write && n > 4096) {
        fail_next_big_write = 0;
        return SQLITE_FULL;
    }
    return unix_methods->xWrite(f, src, n, off);
}

static int faulty_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out)
{
    (void)v;
    int rc = unix_vfs->xOpen(unix_vfs, name, f, flags, out);
    if (rc == SQLITE_OK && (flags & SQLITE_OPEN_WAL)) {
        if (!unix_methods) {
            unix_methods = f->pMethods;
            faulty_methods = *unix_methods;
            faulty_methods.xWrite = faulty_write;
        }
        assert_ptr_equal(f->pMethods, unix_methods);
        f->pMethods = &faulty_methods;
    }
    return rc;
}

static int setup_vfs(void **state)
{
    (void)state;
    unix_vfs = sqlite3_vfs_find(NULL);
    faulty_vfs = *unix_vfs;
    faulty_vfs.zName = "idem-test-faulty";
    faulty_vfs.xOpen = faulty_open;
    return sqlite3_vfs_register(&faulty_vfs, 1) == SQLITE_OK &&
                   idem__sqlite_wal_vfs() == SQLITE_OK
               ? 0
               : -1;
}

/* ---- helpers ---- */

static void exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fail_msg("%s: %s", sql, err ? err : sqlite3_errmsg(db));
}

static sqlite3_int64 one_int(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *s;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK)
        fail_msg("%s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_step(s) != SQLITE_ROW)
        fail_msg("%s: no row: %s", sql, sqlite3_errmsg(db));
    sqlite3_int64 v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    return v;
}

/* COMMIT as the store's writer does; SQLITE_OK or the error. */
static int commit(sqlite3 *writer)
{
    idem__sqlite_wal_gather(writer);
    int rc = sqlite3_exec(writer, "COMMIT", NULL, NULL, NULL);
    int rc2 = idem__sqlite_wal_gathered(writer, rc == SQLITE_OK);
    return rc != SQLITE_OK ? rc : rc2;
}

struct files {
    char *dir;
    char path[512];
    sqlite3 *writer, *reader;
};

static void open_both(struct files *f)
{
    f->dir = test_mkdtemp();
    snprintf(f->path, sizeof f->path, "%s/wal.db", f->dir);
    assert_ptr_not_equal(sqlite3_vfs_find(NULL), sqlite3_vfs_find(IDEM_SQLITE_WAL_VFS));
    assert_int_equal(sqlite3_open_v2(f->path, &f->writer,
                                     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                                     IDEM_SQLITE_WAL_VFS),
                     SQLITE_OK);
    exec(f->writer, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                    "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, v BLOB NOT NULL)");
    assert_int_equal(sqlite3_open_v2(f->path, &f->reader, SQLITE_OPEN_READONLY, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_busy_timeout(f->reader, 5000), SQLITE_OK);
}

static void close_both(struct files *f)
{
    sqlite3_close(f->reader);
    sqlite3_close(f->writer);
    /* Every row, whole, in a file opened anew on the default VFS. */
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(f->path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(s), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    assert_int_equal(one_int(db, "SELECT count(*) FROM t WHERE length(v) != n"), 0);
    sqlite3_close(db);
    test_rmdir(f->dir);
}

/* Row sizes from a few bytes to more than the VFS's buffer (64 KiB). */
static int row_bytes(int i)
{
    return i % 50 == 49 ? 300000 + i : i % 7 == 0 ? 5000 + i : 10 + i;
}

static void test_reader_sees_each_commit(void **state)
{
    (void)state;
    struct files f;
    open_both(&f);
    sqlite3_stmt *ins;
    assert_int_equal(sqlite3_prepare_v2(f.writer, "INSERT INTO t VALUES (?1, ?2, zeroblob(?2))",
                                        -1, &ins, NULL),
                     SQLITE_OK);
    sqlite3_int64 bytes = 0;
    for (int i = 0; i < 300; i++) {
        exec(f.writer, "BEGIN IMMEDIATE");
        /* Two rows per transaction: frames for several pages. */
        for (int k = 0; k < 2; k++) {
            int id = 2 * i + k, n = row_bytes(id);
            sqlite3_bind_int(ins, 1, id);
            sqlite3_bind_int(ins, 2, n);
            assert_int_equal(sqlite3_step(ins), SQLITE_DONE);
            sqlite3_reset(ins);
            bytes += n;
        }
        assert_int_equal(commit(f.writer), SQLITE_OK);
        assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 2 * i + 2);
        assert_int_equal(one_int(f.reader, "SELECT sum(length(v)) FROM t"), bytes);
        if (i % 40 == 39)
            exec(f.writer, "PRAGMA wal_checkpoint(PASSIVE)");
    }
    sqlite3_finalize(ins);
    close_both(&f);
}

/* With a page cache of a few pages, a transaction spills pages to the WAL
 * before its COMMIT, and reads some of them back. */
static void test_spilled_pages(void **state)
{
    (void)state;
    struct files f;
    open_both(&f);
    exec(f.writer, "PRAGMA cache_size=5");
    const char *fill = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c"
                       " WHERE x < 3000) INSERT INTO t SELECT x, 700, randomblob(700) FROM c";
    exec(f.writer, "BEGIN IMMEDIATE");
    exec(f.writer, fill);
    assert_int_equal(one_int(f.writer, "SELECT sum(length(v)) FROM t"), 3000 * 700);
    exec(f.writer, "ROLLBACK");
    assert_int_equal(one_int(f.writer, "SELECT count(*) FROM t"), 0);
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 0);

    exec(f.writer, "BEGIN IMMEDIATE");
    exec(f.writer, fill);
    exec(f.writer, "UPDATE t SET v = randomblob(700) WHERE id % 3 = 0");
    assert_int_equal(one_int(f.writer, "SELECT sum(length(v)) FROM t"), 3000 * 700);
    assert_int_equal(commit(f.writer), SQLITE_OK);
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 3000);
    assert_int_equal(one_int(f.reader, "SELECT sum(length(v)) FROM t"), 3000 * 700);
    close_both(&f);
}

/* The buffer's write fails (a full disk): the COMMIT fails, the rollback
 * leaves nothing of the transaction, and the next one commits whole. */
static void test_failed_write_fails_the_commit(void **state)
{
    (void)state;
    struct files f;
    open_both(&f);
    exec(f.writer, "BEGIN IMMEDIATE; INSERT INTO t VALUES (1, 3000, zeroblob(3000))");
    assert_int_equal(commit(f.writer), SQLITE_OK);
    exec(f.writer, "BEGIN IMMEDIATE;"
                   "INSERT INTO t VALUES (2, 9000, zeroblob(9000));"
                   "INSERT INTO t VALUES (3, 9000, zeroblob(9000))");
    fail_next_big_write = 1;
    assert_int_not_equal(commit(f.writer), SQLITE_OK);
    assert_int_equal(fail_next_big_write, 0); /* it was the buffer's write */
    if (!sqlite3_get_autocommit(f.writer))
        exec(f.writer, "ROLLBACK");
    assert_int_equal(one_int(f.writer, "SELECT count(*) FROM t"), 1);
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 1);
    exec(f.writer, "BEGIN IMMEDIATE; INSERT INTO t VALUES (4, 9000, zeroblob(9000))");
    assert_int_equal(commit(f.writer), SQLITE_OK);
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 2);
    assert_int_equal(one_int(f.reader, "SELECT sum(id) FROM t"), 1 + 4);
    close_both(&f);
}

/* A transaction spills a few pages to the WAL (less than the VFS's buffer)
 * and rolls back; another writer on the file then commits over the same
 * part of the WAL; the first commits again. Nothing of the rolled-back
 * transaction may land over the other writer's frames. */
static void test_rolled_back_spill_then_other_writer(void **state)
{
    (void)state;
    struct files f;
    open_both(&f);
    exec(f.writer, "PRAGMA cache_size=5");
    exec(f.writer, "BEGIN IMMEDIATE;"
                   "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 60)"
                   " INSERT INTO t SELECT x, 700, randomblob(700) FROM c");
    exec(f.writer, "ROLLBACK");
    sqlite3 *other;
    assert_int_equal(sqlite3_open(f.path, &other), SQLITE_OK);
    exec(other, "BEGIN IMMEDIATE;"
                "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 40)"
                " INSERT INTO t SELECT 1000 + x, 500, randomblob(500) FROM c;"
                "COMMIT");
    sqlite3_close(other);
    exec(f.writer, "BEGIN IMMEDIATE; INSERT INTO t VALUES (1, 100, zeroblob(100))");
    assert_int_equal(commit(f.writer), SQLITE_OK);
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 41);
    assert_int_equal(one_int(f.reader, "SELECT sum(length(v)) FROM t"), 40 * 500 + 100);
    close_both(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_sees_each_commit),
        cmocka_unit_test(test_spilled_pages),
        cmocka_unit_test(test_failed_write_fails_the_commit),
        cmocka_unit_test(test_rolled_back_spill_then_other_writer),
    };
    return cmocka_run_group_tests(tests, setup_vfs, NULL);
}
