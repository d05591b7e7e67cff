/* SPDX-License-Identifier: Apache-2.0 */
/*
 * progress.h — the progress bar idem verify draws on stderr while a
 * scenario runs, when stderr is a terminal; nothing otherwise.
 */
#ifndef IDEM_VERIFY_PROGRESS_H
#define IDEM_VERIFY_PROGRESS_H

/* Draw from now on if enabled and stderr is a terminal. */
void progress_start(int enabled);
/* A scenario begins: its name and how many requests it will send at most. */
void progress_scenario(const char *name, long total);
/* One request done; thread-safe (an xchg_ctx on_done callback). */
void progress_tick(void *unused);
/* Stop drawing and clear the line. */
void progress_stop(void);

#endif
