/* SPDX-License-Identifier: Apache-2.0 */
/*
 * row.c — a record row as the db backends hand it up (store layer; see
 * row.h).
 */
#include "row.h"

#include <string.h>

#include "core/alloc.h"

int idem__state_finished(const char *state)
{
    return strcmp(state, IDEM_STATE_PROCESSING) != 0 && strcmp(state, IDEM_STATE_RELEASED) != 0;
}

void idem__row_clear(idem_record *rec)
{
    if (!rec)
        return;
    idem__free(rec->result);
    memset(rec, 0, sizeof *rec);
}
