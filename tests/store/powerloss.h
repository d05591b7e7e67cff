/* SPDX-License-Identifier: Apache-2.0 */
/*
 * powerloss.h — a simulated power cut for SQLite files (tests).
 *
 * A process killed with SIGKILL loses nothing the kernel already has: its
 * unsynced writes are in the page cache and reach the disk anyway. A power
 * cut loses them. This VFS lets a test cut the power: the process that runs
 * the store logs, before each write and truncation, what it replaces, and
 * logs each sync as a mark (it syncs nothing for real: the marks are the
 * disk's promises). After that process is killed, powerloss_apply() puts
 * each file back into a state a disk could be in after the cut: everything
 * before the file's last sync mark, and of what was written after it, each
 * 512-byte sector kept or lost at random.
 */
#ifndef IDEM_TEST_POWERLOSS_H
#define IDEM_TEST_POWERLOSS_H

#include <stddef.h>

/* Before any SQLite file is opened, in the parent: the VFS becomes SQLite's
 * default, passing everything through until powerloss_record(). 0 on
 * success. */
int powerloss_install(void);

/* In the process whose power will be cut (a forked child), before it opens
 * any file: from now on every write, truncation and sync of a named file
 * is logged in undo_path (created anew). With die_at > 0 the process kills
 * itself with SIGKILL instead of logging its die_at-th change: a cut
 * between two given changes, where a timer would mostly land between
 * commits. */
void powerloss_record(const char *undo_path, unsigned long die_at);

/* After that process is dead: undo, in each file it wrote, what a power cut
 * could have lost. Each sector written since the file's last sync mark
 * survives with probability keep (0: none does); nothing of the last change
 * logged does (the kill may have come before or during it). Returns how
 * many sectors were lost, not counting that last change's (which may never
 * have been written); *files_touched is how many files had unsynced
 * changes, *logged how many changes and syncs the log held. */
size_t powerloss_apply(const char *undo_path, double keep, unsigned *seed, size_t *files_touched,
                       size_t *logged);

#endif
