/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_base64.c — RFC 4648's test vectors both ways, and what is refused.
 */
#include <string.h>

#include "base64.h"
#include "testlib.h"

static void test_vectors(void **state)
{
    (void)state;
    static const char *const plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *const coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=",
                                        "Zm9vYmFy"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
        char out[16];
        unsigned char back[16];
        base64_encode(plain[i], strlen(plain[i]), out);
        assert_string_equal(out, coded[i]);
        long n = base64_decode(coded[i], strlen(coded[i]), back);
        assert_int_equal(n, (long)strlen(plain[i]));
        assert_memory_equal(back, plain[i], (size_t)n);
        /* Padding may be left out. */
        size_t bare = strcspn(coded[i], "=");
        assert_int_equal(base64_decode(coded[i], bare, back), n);
    }
    /* Every byte value, there and back. */
    unsigned char all[256], back[260];
    char text[BASE64_LEN(256) + 1];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    base64_encode(all, sizeof all, text);
    assert_int_equal(strlen(text), BASE64_LEN(256));
    assert_int_equal(base64_decode(text, strlen(text), back), 256);
    assert_memory_equal(back, all, 256);
}

static void test_refused(void **state)
{
    (void)state;
    unsigned char out[16];
    static const char *const bad[] = {
        "Zg=",    /* padding that does not complete a group of four */
        "Z===",   /* three '=' */
        "Z",      /* a last group of one */
        "Zm9vY",  /* the same, after a whole group */
        "Zm9v!A==", /* outside the alphabet */
        "Zm=v",   /* padding inside */
        "Zm9-",   /* the URL-safe alphabet is another one */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (base64_decode(bad[i], strlen(bad[i]), out) != -1)
            fail_msg("\"%s\" was taken as base64", bad[i]);
    assert_int_equal(base64_decode("Zg\0=", 4, out), -1); /* a NUL inside */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
