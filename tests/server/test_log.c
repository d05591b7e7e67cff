/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_log.c — the daemon's log escapes what clients control
 * (server/log.c): nothing a key, subject or path holds can end a line,
 * forge one, or hide or reorder text in a terminal or a log viewer.
 */
#include <jansson.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_controls_and_separators_escaped),
        cmocka_unit_test(test_cut_between_characters),
        cmocka_unit_test(test_json_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
