/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_json_scan.c — the body scan (server/gateway/json_scan.c): the bodies it must
 * answer itself (or it saves nothing), and the ones it must leave to the
 * full parse. That its answers equal the full parse's is the fuzz target's
 * job (fuzz/fuzz_json_scan.c), over its corpus in every build.
 */
#include <string.h>

#include "gateway/json_scan.h"
#include "testlib.h"

static enum json_scan scan(const char *body, const char *path, char *out, size_t cap)
{
    return json_scan_field(body, strlen(body), path, out, cap);
}

static void expect_found(const char *body, const char *path, const char *want)
{
    char out[766];
    assert_int_equal(scan(body, path, out, sizeof out), JSON_SCAN_FOUND);
    assert_string_equal(out, want);
}

static void expect(const char *body, const char *path, enum json_scan want)
{
    char out[766];
    assert_int_equal(scan(body, path, out, sizeof out), want);
}

static void test_answers_common_bodies(void **state)
{
    (void)state;
    expect_found("{\"refund_no\":\"R-1\",\"amount\":\"1.00\"}", "refund_no", "R-1");
    expect_found(" {\n\t\"a\" : 1 , \"refund_no\" : \"R 2\" }\r\n", "refund_no", "R 2");
    expect_found("{\"payer\":{\"name\":\"Z\xc3\xa9\",\"account\":\"A-9\"},\"amount\":12.50,"
                 "\"items\":[1,{\"x\":[]},\"s\",true,false,null]}",
                 "payer.account", "A-9");
    expect_found("{\"id\":\"\xe6\x94\xaf\xe4\xbb\x98-\xf0\x9f\x92\xb3\"}", "id",
                 "\xe6\x94\xaf\xe4\xbb\x98-\xf0\x9f\x92\xb3");
    expect_found("{\"id\":-0}", "id", "0"); /* as the full parse writes it */
    expect_found("{\"id\":123456789012345678}", "id", "123456789012345678");
    expect_found("{\"id\":-42}", "id", "-42");
    expect_found("{\"id\":\"x\"}", "..id.", "x"); /* empty names skipped */
    expect("{\"other\":1}", "id", JSON_SCAN_MISSING);
    expect("{\"id\":null}", "id", JSON_SCAN_MISSING);
    expect("{\"a\":\"x\"}", "a.b", JSON_SCAN_MISSING);       /* through a string */
    expect("{\"a\":[{\"b\":\"x\"}]}", "a.b", JSON_SCAN_MISSING); /* not into arrays */
    expect("{\"id\":1.5}", "id", JSON_SCAN_UNUSABLE);
    expect("{\"id\":true}", "id", JSON_SCAN_UNUSABLE);
    expect("{\"id\":{\"a\":1}}", "id", JSON_SCAN_UNUSABLE);
    char small[8];
    assert_int_equal(scan("{\"id\":\"12345678\"}", "id", small, sizeof small),
                     JSON_SCAN_UNUSABLE);
    assert_int_equal(scan("{\"id\":\"1234567\"}", "id", small, sizeof small), JSON_SCAN_FOUND);
    assert_string_equal(small, "1234567");
}

static void test_leaves_the_rest_to_the_full_parse(void **state)
{
    (void)state;
    static const char *const bodies[] = {
        "",
        "[{\"id\":\"x\"}]",                      /* not an object */
        "\"id\"",
        "{\"id\":\"a\",\"id\":\"b\"}",           /* a member twice */
        "{\"a\":{\"k\":1,\"k\":2},\"id\":\"x\"}", /* twice, deeper */
        "{\"id\":\"a\\u0062\"}",                 /* an escape */
        "{\"i\\u0064\":\"x\"}",
        "{\"id\":\"a\x01\"}",                    /* a control character */
        "{\"id\":\"\xc3\"}",                     /* cut UTF-8 */
        "{\"id\":\"\xed\xa0\x80\"}",             /* a surrogate */
        "{\"id\":\"\xc0\xaf\"}",                 /* overlong */
        "{\"id\":\"\xf4\x90\x80\x80\"}",         /* past U+10FFFF */
        "{\"id\":1234567890123456789}",          /* 19 digits */
        "{\"id\":1e5}",
        "{\"id\":007}",
        "{\"id\":1.}",
        "{\"id\":-}",
        "{\"id\":+1}",
        "{\"id\":truex}",
        "{\"id\":\"x\"} x",                      /* after the object */
        "{\"id\":\"x\",}",
        "{\"id\" \"x\"}",
        "{\"id\":\"x\"",
        "{'id':'x'}",
        "{\"a\":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]],\"id\":\"x\"}", /* deep */
        "{\"id\":\"x\",\"ID\":\"y\"}",         /* the name in another case */
        "{\"Id\":\"y\",\"id\":\"x\"}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        char out[766];
        if (scan(bodies[i], "id", out, sizeof out) != JSON_SCAN_UNSURE)
            fail_msg("answered body %zu: %s", i, bodies[i]);
    }
    char path[300];
    memset(path, 'a', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    expect("{\"id\":\"x\"}", path, JSON_SCAN_UNSURE); /* a path too long */
    expect("{\"id\":\"x\"}", "...", JSON_SCAN_UNSURE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answers_common_bodies),
        cmocka_unit_test(test_leaves_the_rest_to_the_full_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
