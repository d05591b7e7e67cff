/* SPDX-License-Identifier: Apache-2.0 */
/*
 * report.h — what idem verify found, three ways: a table for people, one
 * JSON document for programs (--json), JUnit XML for CI systems (--junit).
 */
#ifndef IDEM_VERIFY_REPORT_H
#define IDEM_VERIFY_REPORT_H

#include <stdio.h>

#include "scenario.h"

struct report {
    const struct verify_cfg *cfg;
    const char *run_id;
    const struct scenario_result *results;
    size_t n;
    double duration_ms;
    int exit_status;
};

/* color: ANSI colours for the verdicts. */
void report_table(FILE *out, const struct report *rep, int color);

/* 0, or -1 when out of memory or the write failed. */
int report_json(FILE *out, const struct report *rep);
int report_junit(FILE *out, const struct report *rep);

#endif
