/* SPDX-License-Identifier: Apache-2.0 */
/*
 * report.c — print the scenarios' results: a table and a verdict line per
 * scenario (the default), a JSON document (--json), JUnit XML (--junit FILE:
 * one testcase per scenario, a <failure> with the reason, <skipped> for a
 * scenario that did not apply). The field names of the JSON are listed in
 * docs/verify.md and are kept stable.
 */
#include "report.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"
#include "judge.h"

static const char *verdict_name(enum verdict v)
{
    return v == VERDICT_PASS ? "PASS" : v == VERDICT_FAIL ? "FAIL" : "SKIP";
}

static const char *evidence_name(const struct verify_cfg *c)
{
    return c->counter.kind == COUNT_URL ? "count-url"
           : c->counter.kind == COUNT_CMD ? "count-cmd"
                                          : "responses";
}

/* Text fit for XML and JSON: valid UTF-8, no control characters but \n. */
static void clean_text(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    const unsigned char *s = (const unsigned char *)in;
    while (*s && o + 5 < cap) {
        size_t len = *s < 0x80 ? 1 : (*s >> 5) == 6 ? 2 : (*s >> 4) == 14 ? 3
                     : (*s >> 3) == 30 ? 4 : 0;
        int ok = len > 0;
        for (size_t k = 1; ok && k < len; k++)
            ok = (s[k] >> 6) == 2;
        if (!ok) {
            out[o++] = '?';
            s++;
            continue;
        }
        if (len == 1 && ((*s < 0x20 && *s != '\n') || *s == 0x7f)) {
            out[o++] = '?';
            s++;
            continue;
        }
        memcpy(out + o, s, len);
        o += len;
        s += len;
    }
    out[o] = '\0';
}

static const char *fmt_ms(double ms, char *buf, size_t len)
{
    if (ms <= 0)
        snprintf(buf, len, "-");
    else if (ms < 10)
        snprintf(buf, len, "%.1fms", ms);
    else if (ms < 10000)
        snprintf(buf, len, "%.0fms", ms);
    else
        snprintf(buf, len, "%.1fs", ms / 1000);
    return buf;
}

void report_table(FILE *out, const struct report *rep, int color)
{
    const struct verify_cfg *c = rep->cfg;
    const char *green = color ? "\033[32m" : "", *red = color ? "\033[31m" : "",
               *yellow = color ? "\033[33m" : "", *bold = color ? "\033[1m" : "",
               *off = color ? "\033[0m" : "";
    size_t passed = 0, failed = 0, skipped = 0;

    fprintf(out, "%sidem verify%s  %s %s\n", bold, off, c->method, c->main.text);
    if (c->counter.kind == COUNT_URL)
        fprintf(out, "executions: counted by GET %s, before and after each scenario\n",
                c->counter.text);
    else if (c->counter.kind == COUNT_CMD)
        fprintf(out, "executions: counted by the command '%s', before and after each scenario\n",
                c->counter.text);
    else
        fprintf(out, "executions: inferred from the answers only, weaker evidence "
                     "(--count-url or --count-cmd count them)\n");
    fprintf(out, "business keys: %s%s-<scenario>\n\n", c->key_prefix, rep->run_id);

    fprintf(out, "%-20s %5s %6s %5s  %-24s %9s %8s %7s %7s  %s\n", "scenario", "sent", "exec",
            "want", "answers", "same", "replayed", "p50", "p99", "verdict");
    for (size_t i = 0; i < rep->n; i++) {
        const struct scenario_result *r = &rep->results[i];
        const char *col = r->verdict == VERDICT_PASS ? green : r->verdict == VERDICT_FAIL ? red
                                                                                          : yellow;
        if (r->verdict == VERDICT_SKIP) {
            fprintf(out, "%-20s %5s %6s %5s  %-24s %9s %8s %7s %7s  %s%s%s\n", r->name, "-", "-",
                    "-", "-", "-", "-", "-", "-", col, "SKIP", off);
            continue;
        }
        char exec[24], same[24], answers[200], p50[16], p99[16];
        snprintf(exec, sizeof exec, "%s%lld", r->counted ? "" : "~", r->executions);
        if (r->duplicates)
            snprintf(same, sizeof same, "%zu/%zu", r->identical, r->duplicates);
        else
            snprintf(same, sizeof same, "-");
        fprintf(out, "%-20s %5zu %6s %5lld  %-24s %9s %8zu %7s %7s  %s%s%s\n", r->name, r->sent,
                exec, r->expected, judge_answers_text(r, answers, sizeof answers), same,
                r->replayed, fmt_ms(r->p50_ms, p50, sizeof p50),
                fmt_ms(r->p99_ms, p99, sizeof p99), col, verdict_name(r->verdict), off);
    }
    fprintf(out, "\n");
    for (size_t i = 0; i < rep->n; i++) {
        const struct scenario_result *r = &rep->results[i];
        const char *col = r->verdict == VERDICT_PASS ? green : r->verdict == VERDICT_FAIL ? red
                                                                                          : yellow;
        passed += r->verdict == VERDICT_PASS;
        failed += r->verdict == VERDICT_FAIL;
        skipped += r->verdict == VERDICT_SKIP;
        fprintf(out, "%-20s %s%s%s  %s\n", r->name, col, verdict_name(r->verdict), off,
                r->reason);
        if (r->note[0])
            fprintf(out, "%-20s       note: %s\n", "", r->note);
    }
    fprintf(out, "\n%s%zu passed, %zu failed, %zu skipped%s in %.1f s\n",
            failed ? red : green, passed, failed, skipped, off, rep->duration_ms / 1000);
}

static json_t *text(const char *s)
{
    char buf[1024];
    clean_text(s, buf, sizeof buf);
    return json_string(buf);
}

/* Milliseconds to the microsecond: enough digits, and no more. */
static json_t *ms_value(double ms)
{
    return json_real((double)(long long)(ms * 1000 + 0.5) / 1000);
}

static json_t *scenario_json(const struct scenario_result *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "verdict", json_string(verdict_name(r->verdict)));
    json_object_set_new(o, "reason", text(r->reason));
    if (r->note[0])
        json_object_set_new(o, "note", text(r->note));
    if (r->verdict == VERDICT_SKIP)
        return o;
    json_object_set_new(o, "business_key", text(r->key));
    json_object_set_new(o, "keys", json_integer((json_int_t)r->keys));
    json_object_set_new(o, "requests", json_integer((json_int_t)r->sent));
    json_object_set_new(o, "answered", json_integer((json_int_t)r->answered));
    json_object_set_new(o, "gave_up", json_integer((json_int_t)r->abandoned));
    json_object_set_new(o, "timeouts", json_integer((json_int_t)r->timeouts));
    json_object_set_new(o, "errors", json_integer((json_int_t)r->errors));
    json_t *st = json_object();
    for (size_t i = 0; i < r->nstatuses; i++) {
        char k[8];
        snprintf(k, sizeof k, "%d", r->statuses[i].status);
        json_object_set_new(st, k, json_integer((json_int_t)r->statuses[i].n));
    }
    if (r->other_statuses)
        json_object_set_new(st, "other", json_integer((json_int_t)r->other_statuses));
    json_object_set_new(o, "statuses", st);
    json_object_set_new(o, "executions", json_integer(r->executions));
    json_object_set_new(o, "expected_executions", json_integer(r->expected));
    json_object_set_new(o, "evidence", json_string(r->counted ? "count" : "responses"));
    json_object_set_new(o, "duplicates", json_integer((json_int_t)r->duplicates));
    json_object_set_new(o, "identical", json_integer((json_int_t)r->identical));
    json_object_set_new(o, "replayed", json_integer((json_int_t)r->replayed));
    json_object_set_new(o, "latency_ms", json_pack("{s:o, s:o, s:o, s:o}", "p50",
                                                   ms_value(r->p50_ms), "p90",
                                                   ms_value(r->p90_ms), "p99",
                                                   ms_value(r->p99_ms), "max",
                                                   ms_value(r->max_ms)));
    json_object_set_new(o, "duration_ms", ms_value(r->duration_ms));
    json_object_set_new(o, "requests_per_second", ms_value(r->rps));
    return o;
}

int report_json(FILE *out, const struct report *rep)
{
    const struct verify_cfg *c = rep->cfg;
    size_t passed = 0, failed = 0, skipped = 0;
    json_t *root = json_object(), *list = json_array();
    if (!root || !list) {
        json_decref(root);
        json_decref(list);
        return -1;
    }
    json_object_set_new(root, "tool", json_string("idem verify"));
    json_object_set_new(root, "version", json_string(idem_version()));
    json_object_set_new(root, "target", json_pack("{s:s, s:o}", "method", c->method, "url",
                                                  text(c->main.text)));
    json_object_set_new(root, "evidence", json_string(evidence_name(c)));
    if (c->counter.kind != COUNT_NONE)
        json_object_set_new(root, "count_source", text(c->counter.text));
    json_object_set_new(root, "run_id", json_string(rep->run_id));
    for (size_t i = 0; i < rep->n; i++) {
        const struct scenario_result *r = &rep->results[i];
        passed += r->verdict == VERDICT_PASS;
        failed += r->verdict == VERDICT_FAIL;
        skipped += r->verdict == VERDICT_SKIP;
        json_array_append_new(list, scenario_json(r));
    }
    json_object_set_new(root, "scenarios", list);
    json_object_set_new(root, "summary", json_pack("{s:I, s:I, s:I, s:o}", "passed",
                                                   (json_int_t)passed, "failed",
                                                   (json_int_t)failed, "skipped",
                                                   (json_int_t)skipped, "duration_ms",
                                                   ms_value(rep->duration_ms)));
    json_object_set_new(root, "exit_status", json_integer(rep->exit_status));
    int rc = json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(12)) == 0 &&
                     fputc('\n', out) != EOF
                 ? 0
                 : -1;
    json_decref(root);
    return rc;
}

static void xml_text(FILE *out, const char *s)
{
    char buf[2048];
    clean_text(s, buf, sizeof buf);
    for (const char *p = buf; *p; p++) {
        switch (*p) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&apos;", out); break;
        default: fputc(*p, out); break;
        }
    }
}

int report_junit(FILE *out, const struct report *rep)
{
    const struct verify_cfg *c = rep->cfg;
    size_t failed = 0, skipped = 0;
    for (size_t i = 0; i < rep->n; i++) {
        failed += rep->results[i].verdict == VERDICT_FAIL;
        skipped += rep->results[i].verdict == VERDICT_SKIP;
    }
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out, "<testsuites name=\"idem verify\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" "
                 "skipped=\"%zu\" time=\"%.3f\">\n", rep->n, failed, skipped,
            rep->duration_ms / 1000);
    fprintf(out, "  <testsuite name=\"idem verify ");
    xml_text(out, c->method);
    fputc(' ', out);
    xml_text(out, c->main.text);
    fprintf(out, "\" tests=\"%zu\" failures=\"%zu\" errors=\"0\" skipped=\"%zu\" time=\"%.3f\">\n",
            rep->n, failed, skipped, rep->duration_ms / 1000);
    fprintf(out, "    <properties>\n      <property name=\"evidence\" value=\"%s\"/>\n",
            evidence_name(c));
    if (c->counter.kind != COUNT_NONE) {
        fprintf(out, "      <property name=\"count_source\" value=\"");
        xml_text(out, c->counter.text);
        fprintf(out, "\"/>\n");
    }
    fprintf(out, "      <property name=\"run_id\" value=\"%s\"/>\n    </properties>\n",
            rep->run_id);
    for (size_t i = 0; i < rep->n; i++) {
        const struct scenario_result *r = &rep->results[i];
        char answers[200];
        fprintf(out, "    <testcase classname=\"idem.verify\" name=\"%s\" time=\"%.3f\">\n",
                r->name, r->duration_ms / 1000);
        if (r->verdict == VERDICT_SKIP) {
            fprintf(out, "      <skipped message=\"");
            xml_text(out, r->reason);
            fprintf(out, "\"/>\n");
        } else {
            const char *tag = r->verdict == VERDICT_FAIL ? "failure" : "system-out";
            fprintf(out, "      <%s", tag);
            if (r->verdict == VERDICT_FAIL) {
                fprintf(out, " type=\"%s\" message=\"",
                        r->executions > r->expected ? "duplicate-execution" : "not-idempotent");
                xml_text(out, r->reason);
                fprintf(out, "\"");
            }
            fprintf(out, ">");
            xml_text(out, r->reason);
            fprintf(out, "\nbusiness key: ");
            xml_text(out, r->key);
            fprintf(out, "\nrequests: %zu, answers: %s\nexecutions: %lld (expected %lld; %s)\n"
                         "repeated answers byte-identical: %zu of %zu; marked replayed: %zu\n",
                    r->sent, judge_answers_text(r, answers, sizeof answers), r->executions,
                    r->expected, r->counted ? "counted" : "inferred from the answers",
                    r->identical, r->duplicates, r->replayed);
            if (r->note[0]) {
                fprintf(out, "note: ");
                xml_text(out, r->note);
                fputc('\n', out);
            }
            fprintf(out, "</%s>\n", tag);
        }
        fprintf(out, "    </testcase>\n");
    }
    fprintf(out, "  </testsuite>\n</testsuites>\n");
    return ferror(out) ? -1 : 0;
}
