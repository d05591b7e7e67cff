/* SPDX-License-Identifier: Apache-2.0 */
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

/* Around a COMMIT on conn (a connection with synchronous=FULL): gather
 * starts holding its WAL writes back, gathered ends it, committed saying
 * whether the COMMIT succeeded. What is still held then is written if it
 * did (its sync has written everything already: this returns SQLITE_OK) and
 * dropped if it did not. Neither does anything when conn's WAL file is not
 * open on this VFS. */
void idem__sqlite_wal_gather(sqlite3 *conn);
int idem__sqlite_wal_gathered(sqlite3 *conn, int committed);

#endif
