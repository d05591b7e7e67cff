/*
 * test_sqlite_wal.c — the VFS that writes a commit's WAL frames in one call
 * (lib/store/sqlite_wal.c), over a real SQLite file.
 *
 * A writer connection on the VFS, with synchronous=FULL as the store opens
 * it, and a reader on SQLite's default VFS, as the store's readers are. What
 * the VFS holds back must never be missed: after each COMMIT the reader sees
 * every row the writer committed, whole; the writer reads back pages it
 * spilled to the WAL mid-transaction; a rolled-back transaction leaves
 * nothing; transactions bigger than the VFS's buffer work; and the file
 * reopened on the default VFS passes SQLite's integrity check with every
 * row. (Killing the process mid-commit is store.durability.kill9's part: the
 * embedded store's writer runs on this VFS.)
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/sqlite_wal.h"
#include "testlib.h"

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

struct files {
    char *dir;
    char path[512];
    sqlite3 *writer, *reader;
};

static void open_both(struct files *f)
{
    f->dir = test_mkdtemp();
    snprintf(f->path, sizeof f->path, "%s/wal.db", f->dir);
    assert_int_equal(idem__sqlite_wal_vfs(), SQLITE_OK);
    assert_ptr_not_equal(sqlite3_vfs_find(NULL), sqlite3_vfs_find(IDEM_SQLITE_WAL_VFS));
    assert_int_equal(sqlite3_open_v2(f->path, &f->writer,
                                     SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                                     IDEM_SQLITE_WAL_VFS),
                     SQLITE_OK);
    exec(f->writer, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                    "CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL, v BLOB NOT NULL)");
    assert_int_equal(sqlite3_open_v2(f->path, &f->reader, SQLITE_OPEN_READONLY, NULL),
                     SQLITE_OK);
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
        exec(f.writer, "COMMIT");
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
    exec(f.writer, "COMMIT");
    assert_int_equal(one_int(f.reader, "SELECT count(*) FROM t"), 3000);
    assert_int_equal(one_int(f.reader, "SELECT sum(length(v)) FROM t"), 3000 * 700);
    close_both(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_sees_each_commit),
        cmocka_unit_test(test_spilled_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
