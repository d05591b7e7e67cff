/*
 * sqlite_wal.h — the VFS that writes a commit's WAL frames in one call
 * (store layer; see sqlite_wal.c for what it does and its precondition).
 */
#ifndef IDEM_SQLITE_WAL_H
#define IDEM_SQLITE_WAL_H

#include <sqlite3.h>

#define IDEM_SQLITE_WAL_VFS "idem-wal"

/* Registers the VFS, once per process, under IDEM_SQLITE_WAL_VFS (never as
 * the default). SQLITE_OK when it can be used. */
int idem__sqlite_wal_vfs(void);

#endif
