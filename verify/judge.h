/* SPDX-License-Identifier: Apache-2.0 */
/*
 * judge.h — from a scenario's answers and its execution count to a verdict:
 * the tallies the report shows (answers by status, duplicates compared byte
 * for byte with the first answer, replays, latency percentiles) and PASS or
 * FAIL with the reason.
 */
#ifndef IDEM_VERIFY_JUDGE_H
#define IDEM_VERIFY_JUDGE_H

#include <stddef.h>

#include "exchange.h"
#include "scenario.h"

/* What a shot is to its scenario (struct shot's role). */
enum shot_role {
    ROLE_SAME,     /* the group's request, sent again */
    ROLE_MISMATCH, /* the group's key with a changed body (payload-mismatch) */
};

/* Judge scenario id from its n shots. res arrives with name, keys,
 * expected, counted, duration_ms and note set by the run; counted_delta is
 * the count's difference over the scenario (used when res->counted). */
void judge_scenario(int id, const struct shot *shots, size_t n, long long counted_delta,
                    struct scenario_result *res);

/* The answers by kind, "201:99 409:1 gave-up:1 timeout:1 error:2". */
const char *judge_answers_text(const struct scenario_result *res, char *buf, size_t len);

int shot_is_2xx(const struct shot *s);
/* Same status and the same body, byte for byte. */
int shot_same_answer(const struct shot *a, const struct shot *b);

#endif
