/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_log.c — the daemon's log escapes what clients control
 * (server/log.c): nothing a key, subject or path holds can end a line,
 * forge one, or hide or reorder text in a terminal or a log viewer.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "testlib.h"

static void expect(const char *in, const char *want)
{
    char out[256];
    size_t n = log_escape(in, strlen(in), out, sizeof out);
    assert_string_equal(out, want);
    assert_int_equal(n, strlen(want));
}

static void test_controls_and_separators_escaped(void **state)
{
    (void)state;
    expect("R-1", "R-1");
    expect("caf\xc3\xa9 \xe4\xb8\xad", "caf\xc3\xa9 \xe4\xb8\xad"); /* text stays text */
    expect("a\nb\r\x1b[2Jc\x7f", "a\\x0ab\\x0d\\x1b[2Jc\\x7f");
    expect("K\xc2\x85" "forged", "K\\u0085forged");        /* NEL */
    expect("K\xc2\x9b" "31m", "K\\u009b31m");              /* CSI */
    expect("K\xe2\x80\xa8" "x", "K\\u2028x");              /* LINE SEPARATOR */
    expect("K\xe2\x80\xa9" "x", "K\\u2029x");              /* PARAGRAPH SEPARATOR */
    expect("K\xe2\x80\xae" "gnp.exe", "K\\u202egnp.exe");  /* RIGHT-TO-LEFT OVERRIDE */
    expect("K\xe2\x81\xa6" "x", "K\\u2066x");              /* LEFT-TO-RIGHT ISOLATE */
    expect("\xef\xbb\xbfK", "\\ufeffK");
    /* What shows nothing: zero width space and joiner, soft hyphen, word
     * joiner, a tag character (hidden text), an annotation anchor. */
    expect("a\xe2\x80\x8b" "b\xe2\x80\x8d" "c\xc2\xad" "d\xe2\x81\xa0" "e",
           "a\\u200bb\\u200dc\\u00add\\u2060e");
    expect("x\xf3\xa0\x80\x81" "y\xef\xbf\xb9" "z", "x\\ue0001y\\ufff9z");
    /* Bytes that are not UTF-8, and the backslash itself: an escape read
     * back is always one that was made here. */
    expect("\xff\xc0\xaf", "\\xff\\xc0\\xaf");
    expect("\xe2\x80", "\\xe2\\x80");
    expect("a\\x0ab", "a\\\\x0ab");
}

static void test_cut_between_characters(void **state)
{
    (void)state;
    char out[8];
    /* "ab" then an escape of 6 that does not fit in the 5 left. */
    assert_int_equal(log_escape("ab\xc2\x85zz", 6, out, sizeof out), 2);
    assert_string_equal(out, "ab");
    assert_int_equal(log_escape("abc\xc3\xa9x", 6, out, 6), 5);
    assert_string_equal(out, "abc\xc3\xa9");
    assert_int_equal(log_escape("abc\xc3\xa9x", 6, out, 5), 3); /* é would not fit whole */
    assert_string_equal(out, "abc");
}

/* JSON's escaping: ASCII out, and the same text back once parsed (a byte
 * that is not UTF-8 as U+FFFD); never cut inside an escape. */
static void test_json_escape(void **state)
{
    (void)state;
    const char in[] = "a\"b\\c\n\x01\xe2\x80\xa8\xf0\x9f\x98\x80\xff!";
    char out[256] = "\"";
    size_t n = 1 + log_json_escape(in, sizeof in - 1, out + 1, sizeof out - 3);
    out[n++] = '"';
    out[n] = '\0';
    for (size_t i = 0; i < n; i++)
        assert_true(out[i] >= 0x20 && out[i] < 0x7f);
    json_error_t err;
    json_t *j = json_loads(out, JSON_DECODE_ANY, &err);
    if (!j)
        fail_msg("not JSON (%s): %s", err.text, out);
    assert_string_equal(json_string_value(j),
                        "a\"b\\c\n\x01\xe2\x80\xa8\xf0\x9f\x98\x80\xef\xbf\xbd!");
    json_decref(j);
    /* Cut: whole escapes only. */
    char small[9];
    size_t k = log_json_escape("ab\xe2\x80\xa8", 5, small, 7);
    assert_int_equal(k, 2); /* "ab", then \u2028 (6 bytes) does not fit in 5 */
}

/* The lines daemon_log_about() writes while fn runs, from stderr. */
static char *captured(void (*fn)(void))
{
    char path[] = "/tmp/idem-test-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    assert_true(fd >= 0 && saved >= 0);
    dup2(fd, 2);
    fn();
    dup2(saved, 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    char *text = calloc(1, (size_t)n + 1);
    assert_int_equal(pread(fd, text, (size_t)n, 0), n);
    close(fd);
    unlink(path);
    return text;
}

static void write_about(void)
{
    struct log_about a = {.route = "refund", .space = "refunds", .key = "R-1\"\n",
                          .request_id = "rid-7", .epoch = 1796346503701ULL};
    daemon_log_about(LOG_WARN, &a, "%s/%s: held", a.space, "R-1");
    daemon_log_about(LOG_INFO, LOG_CONSUMER("orders"), "consumer %s: connected", "orders");
    daemon_log("no fields");
}

/* The JSON form: what a line is about in fields of its own, escaped as
 * the message is; the text form unchanged. */
static void test_json_fields(void **state)
{
    (void)state;
    daemon_log_setup(LOG_INFO, 1);
    char *text = captured(write_about);
    daemon_log_setup(LOG_INFO, 0);
    char *line[3] = {text, NULL, NULL};
    for (int i = 1; i < 3; i++) {
        line[i] = strchr(line[i - 1], '\n');
        assert_non_null(line[i]);
        *line[i]++ = '\0';
    }
    json_t *j = json_loads(line[0], 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "level")), "warn");
    assert_string_equal(json_string_value(json_object_get(j, "msg")), "refunds/R-1: held");
    assert_string_equal(json_string_value(json_object_get(j, "route")), "refund");
    assert_string_equal(json_string_value(json_object_get(j, "space")), "refunds");
    assert_string_equal(json_string_value(json_object_get(j, "key")), "R-1\"\n");
    assert_string_equal(json_string_value(json_object_get(j, "request_id")), "rid-7");
    assert_int_equal(json_integer_value(json_object_get(j, "epoch")), 1796346503701LL);
    assert_null(json_object_get(j, "consumer"));
    json_decref(j);
    j = json_loads(line[1], 0, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "consumer")), "orders");
    assert_null(json_object_get(j, "route"));
    assert_null(json_object_get(j, "epoch"));
    json_decref(j);
    j = json_loads(line[2], 0, NULL);
    assert_int_equal(json_object_size(j), 3); /* time, level, msg */
    json_decref(j);
    free(text);

    text = captured(write_about);
    assert_non_null(strstr(text, " idem: warning: refunds/R-1: held\n"));
    assert_null(strstr(text, "rid-7"));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_controls_and_separators_escaped),
        cmocka_unit_test(test_cut_between_characters),
        cmocka_unit_test(test_json_escape),
        cmocka_unit_test(test_json_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
