/* SPDX-License-Identifier: Apache-2.0 */
/*
 * row.h — a record row as the db backends hand it up (store layer): which
 * states are finished, and freeing what a row holds. The record layer's
 * public idem_record_finished() and idem_record_clear() are these, so the
 * backends below it and the layers above share one definition.
 */
#ifndef IDEM_STORE_ROW_H
#define IDEM_STORE_ROW_H

#include "idem.h"

/* 1 if a record in this state is finished: its result is final (SUCCEEDED,
 * FAILED, or a state of the user's own); 0 for PROCESSING and RELEASED,
 * which a begin may claim. */
int idem__state_finished(const char *state);

/* Free what a row holds (its result) and zero it. NULL is a no-op. */
void idem__row_clear(idem_record *rec);

#endif
