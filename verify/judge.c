/* SPDX-License-Identifier: Apache-2.0 */
/*
 * judge.c — how idem verify decides. The count source, when there is one,
 * is the truth: a scenario passes when the endpoint executed exactly as many
 * times as the scenario has business keys (two for cross-subject, one per
 * subject), and fails with the number of duplicate executions otherwise.
 * Without a count the answers are the evidence: each distinct successful
 * answer (status and body, byte for byte) of a business key is taken as an
 * execution, which finds a service that answers every duplicate with a fresh
 * id, and misses one that answers them all with the same constant body:
 * weaker evidence, and the reason says so.
 *
 * On top of the count, the answers must show: at least one success per
 * business key (else the template is probably wrong); for payload-mismatch,
 * the changed body refused with a 4xx (a 2xx, replayed or not, is a FAIL);
 * for cross-subject, no answer replayed across subjects.
 */
#include "judge.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int shot_is_2xx(const struct shot *s)
{
    return s->outcome == SHOT_ANSWERED && s->status >= 200 && s->status <= 299;
}

int shot_same_answer(const struct shot *a, const struct shot *b)
{
    return a->outcome == SHOT_ANSWERED && b->outcome == SHOT_ANSWERED && a->status == b->status &&
           a->body_len == b->body_len && memcmp(a->body, b->body, a->body_len) == 0;
}

/* ---- analysis ---- */

struct analysis {
    long long inferred;          /* executions as the answers suggest */
    size_t groups_failed;        /* groups (that must succeed) without a 2xx answer */
    size_t groups_checked;
    size_t successes;
};

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest rank: the smallest value with at least p% of the values at or
 * below it. v sorted, n > 0. */
static double percentile(const double *v, size_t n, unsigned p)
{
    size_t rank = (p * n + 99) / 100;
    return v[rank == 0 ? 0 : rank - 1];
}

static void tally_status(struct scenario_result *res, int status)
{
    size_t i = 0;
    while (i < res->nstatuses && res->statuses[i].status < status)
        i++;
    if (i < res->nstatuses && res->statuses[i].status == status) {
        res->statuses[i].n++;
        return;
    }
    if (res->nstatuses == RESULT_STATUS_KINDS) {
        res->other_statuses++;
        return;
    }
    memmove(&res->statuses[i + 1], &res->statuses[i],
            (res->nstatuses - i) * sizeof res->statuses[0]);
    res->statuses[i] = (struct status_tally){status, 1};
    res->nstatuses++;
}

/* The answer a group's repeated requests are compared with: the first to
 * arrive of its successful answers that are not replays; else of its
 * successes; else of its answers. -1 when none came back. */
static long reference_of(const struct shot *shots, size_t n, int group)
{
    long best = -1;
    int best_rank = 0;
    for (size_t i = 0; i < n; i++) {
        const struct shot *s = &shots[i];
        if (s->group != group || s->role != ROLE_SAME || s->outcome != SHOT_ANSWERED)
            continue;
        int rank = shot_is_2xx(s) ? (s->replayed_by ? 2 : 3) : 1;
        if (rank > best_rank || (rank == best_rank && s->done_us < shots[best].done_us)) {
            best = (long)i;
            best_rank = rank;
        }
    }
    return best;
}

static void analyse(const struct shot *shots, size_t n, struct scenario_result *res,
                    struct analysis *a, int groups_needing_success)
{
    double *lat = calloc(n ? n : 1, sizeof *lat);
    size_t nlat = 0;
    memset(a, 0, sizeof *a);
    for (size_t i = 0; i < n; i++) {
        const struct shot *s = &shots[i];
        if (s->outcome == SHOT_NOT_RUN)
            continue;
        res->sent++;
        switch (s->outcome) {
        case SHOT_ANSWERED:
            res->answered++;
            tally_status(res, s->status);
            res->replayed += s->replayed_by != NULL;
            if (lat)
                lat[nlat++] = (double)(s->done_us - s->sent_us) / 1000.0;
            a->successes += shot_is_2xx(s);
            break;
        case SHOT_TIMEOUT:
            res->timeouts++;
            break;
        case SHOT_ABANDONED:
            res->abandoned++;
            break;
        default:
            res->errors++;
            break;
        }
    }
    if (lat && nlat) {
        qsort(lat, nlat, sizeof *lat, cmp_double);
        res->p50_ms = percentile(lat, nlat, 50);
        res->p90_ms = percentile(lat, nlat, 90);
        res->p99_ms = percentile(lat, nlat, 99);
        res->max_ms = lat[nlat - 1];
    }
    free(lat);
    for (int g = 0; g < (int)res->keys; g++) {
        long ref = reference_of(shots, n, g);
        size_t distinct = 0, have_2xx = 0;
        for (size_t i = 0; i < n; i++) {
            const struct shot *s = &shots[i];
            if (s->group != g || s->role != ROLE_SAME || s->outcome != SHOT_ANSWERED)
                continue;
            if ((long)i != ref) {
                res->duplicates++;
                res->identical += ref >= 0 && shot_same_answer(s, &shots[ref]);
            }
            if (!shot_is_2xx(s))
                continue;
            have_2xx++;
            /* A success unlike every earlier success of the group. */
            int seen = 0;
            for (size_t j = 0; j < i && !seen; j++)
                seen = shots[j].group == g && shots[j].role == ROLE_SAME &&
                       shot_is_2xx(&shots[j]) && shot_same_answer(&shots[j], s);
            distinct += !seen;
        }
        a->inferred += (long long)distinct;
        if (g < groups_needing_success) {
            a->groups_checked++;
            a->groups_failed += have_2xx == 0;
        }
    }
}

static void add_word(char *buf, size_t len, size_t *o, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add_word(char *buf, size_t len, size_t *o, const char *fmt, ...)
{
    if (*o + 1 >= len)
        return;
    if (*o)
        buf[(*o)++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(buf + *o, len - *o, fmt, ap);
    va_end(ap);
    *o += w < 0 ? 0 : (size_t)w < len - *o ? (size_t)w : len - *o - 1;
}

const char *judge_answers_text(const struct scenario_result *res, char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < res->nstatuses; i++)
        add_word(buf, len, &o, "%d:%zu", res->statuses[i].status, res->statuses[i].n);
    if (res->other_statuses)
        add_word(buf, len, &o, "other:%zu", res->other_statuses);
    if (res->abandoned)
        add_word(buf, len, &o, "gave-up:%zu", res->abandoned);
    if (res->timeouts)
        add_word(buf, len, &o, "timeout:%zu", res->timeouts);
    if (res->errors)
        add_word(buf, len, &o, "error:%zu", res->errors);
    if (!o)
        snprintf(buf, len, "-");
    return buf;
}

/* ---- judging ---- */

static void append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t o = strlen(buf);
    if (o && o + 2 < cap) {
        memcpy(buf + o, "; ", 3);
        o += 2;
    }
    if (o >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + o, cap - o, fmt, ap);
    va_end(ap);
}

static const char *plural(long long n)
{
    return n == 1 ? "" : "s";
}

static void judge(int id, const struct shot *shots, size_t n, struct scenario_result *res,
                  const struct analysis *a)
{
    char fails[sizeof res->reason] = "", answers[200];
    long long e = res->executions, x = res->expected;
    const char *unit = id == SC_CROSS_SUBJECT ? "subject" : "business key";
    judge_answers_text(res, answers, sizeof answers);

    if (res->counted && e < 0)
        append(fails, sizeof fails, "the count went down by %lld: did the service restart or "
               "something else change it?", -e);
    else if (e > x)
        append(fails, sizeof fails, "%lld duplicate execution%s: %lld executions for %lld %s%s",
               e - x, plural(e - x), e, x, unit, plural(x));
    else if (e < x)
        append(fails, sizeof fails, "%lld execution%s where %lld %s expected%s", e, plural(e),
               x, x == 1 ? "was" : "were",
               res->counted && e == 0 && a->successes
                   ? " (is the count source counting this endpoint?)" : "");

    if (a->groups_checked && a->groups_failed == a->groups_checked)
        append(fails, sizeof fails, "no request succeeded (answers: %s): check the URL and the "
               "template", answers);
    else if (a->groups_failed)
        append(fails, sizeof fails, "%zu of %zu business keys never got a 2xx answer",
               a->groups_failed, a->groups_checked);

    if (id == SC_PAYLOAD_MISMATCH) {
        const struct shot *m = &shots[1];
        if (n < 2 || m->outcome != SHOT_ANSWERED)
            append(fails, sizeof fails, "the changed payload got no answer (%s)",
                   n < 2 ? "not sent" : m->error);
        else if (m->status >= 200 && m->status <= 299)
            append(fails, sizeof fails, "the changed payload was answered %d%s", m->status,
                   m->replayed_by ? " with the first request's answer replayed: the key is "
                                    "not checked against the payload"
                                  : ", not refused");
        else if (m->status < 400 || m->status > 499)
            append(fails, sizeof fails, "the changed payload was answered %d, not refused with "
                   "a 4xx (422 is usual)", m->status);
        else if (m->status != 422)
            append(res->note, sizeof res->note, "the changed payload was refused with %d, not "
                   "422: make sure it was refused for reusing the key, not for the changed "
                   "value", m->status);
    }
    if (id == SC_CROSS_SUBJECT && n >= 2 && shots[1].outcome == SHOT_ANSWERED) {
        const struct shot *a1 = &shots[0], *b1 = &shots[1];
        if (b1->replayed_by)
            append(fails, sizeof fails, "subject B's first request was answered with a replay "
                   "(%s): an answer leaked across subjects (if the endpoint has no subjects, "
                   "leave cross-subject out)", b1->replayed_by);
        else if (shot_is_2xx(a1) && shot_same_answer(a1, b1)) {
            if (!res->counted)
                append(fails, sizeof fails, "subject B got exactly subject A's answer: it "
                       "probably leaked across subjects");
            else
                append(res->note, sizeof res->note, "subject B's answer is byte-identical to "
                       "subject A's");
        }
    }
    if (id == SC_CROSS_SUBJECT && n >= 4 && !shot_same_answer(&shots[0], &shots[1])) {
        /* A retry replayed the other subject's answer. */
        if (shots[2].replayed_by && shot_same_answer(&shots[2], &shots[1]))
            append(fails, sizeof fails, "subject A's retry was replayed subject B's answer");
        else if (shots[3].replayed_by && shot_same_answer(&shots[3], &shots[0]))
            append(fails, sizeof fails, "subject B's retry was replayed subject A's answer");
    }

    if (fails[0]) {
        res->verdict = VERDICT_FAIL;
        snprintf(res->reason, sizeof res->reason, "%s", fails);
    } else {
        res->verdict = VERDICT_PASS;
        switch (id) {
        case SC_PAYLOAD_MISMATCH:
            snprintf(res->reason, sizeof res->reason, "%lld execution; the changed payload was "
                     "refused with %d", e, shots[1].status);
            break;
        case SC_CROSS_SUBJECT:
            snprintf(res->reason, sizeof res->reason, "%lld executions, one per subject; no "
                     "answer crossed subjects", e);
            break;
        case SC_MIXED:
            snprintf(res->reason, sizeof res->reason, "%lld executions for %zu business keys "
                     "(%zu requests); %.0f requests/s", e, res->keys, res->sent, res->rps);
            break;
        default:
            snprintf(res->reason, sizeof res->reason, "%lld execution%s for %zu requests with "
                     "%zu business key%s", e, plural(e), res->sent, res->keys,
                     plural((long long)res->keys));
            break;
        }
        if (res->duplicates && id != SC_CROSS_SUBJECT)
            append(res->reason, sizeof res->reason, "%zu of %zu repeated answers byte-identical, "
                   "%zu marked replayed", res->identical, res->duplicates, res->replayed);
    }
    if (!res->counted)
        append(res->reason, sizeof res->reason, "executions inferred from the answers only "
               "(weaker evidence)");
}

/* Cross-subject without a count: one execution per subject that got an
 * answer of its own (B's first answer neither a replay nor A's, byte for
 * byte). */
static long long cross_subject_inferred(const struct shot *shots, size_t n)
{
    int a_ok = n >= 1 && shot_is_2xx(&shots[0]);
    int b_own = n >= 2 && shots[1].outcome == SHOT_ANSWERED && !shots[1].replayed_by &&
                !(a_ok && shot_same_answer(&shots[0], &shots[1]));
    return a_ok + b_own;
}

void judge_scenario(int id, const struct shot *shots, size_t n, long long counted_delta,
                    struct scenario_result *res)
{
    struct analysis a;
    analyse(shots, n, res, &a, id == SC_CROSS_SUBJECT ? 1 : (int)res->keys);
    res->rps = res->duration_ms > 0 ? (double)res->answered * 1000.0 / res->duration_ms : 0;
    if (res->counted)
        res->executions = counted_delta;
    else if (id == SC_CROSS_SUBJECT)
        res->executions = cross_subject_inferred(shots, n);
    else
        res->executions = a.inferred;
    judge(id, shots, n, res, &a);
}
