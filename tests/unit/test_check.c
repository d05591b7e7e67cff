/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the core layer: input validation, the error table, the
 * token text and fingerprints. */
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"
#include "core/crypto.h"
#include "testlib.h"

static void test_keys(void **state)
{
    (void)state;
    char k[300];
    assert_int_equal(idem__check_key("R-2026-0001", "key", 0), IDEM_OK);
    assert_int_equal(idem__check_key("退款-单号 42", "key", 0), IDEM_OK); /* UTF-8 is fine */
    assert_int_equal(idem__check_key("", "key", 0), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "key: empty");
    assert_int_equal(idem__check_key("", "subject", 1), IDEM_OK);
    assert_int_equal(idem__check_key(NULL, "key", 1), IDEM_EINVAL);
    memset(k, 'a', 255);
    k[255] = '\0';
    assert_int_equal(idem__check_key(k, "key", 0), IDEM_OK);
    k[255] = 'a';
    k[256] = '\0';
    assert_int_equal(idem__check_key(k, "key", 0), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "key: longer than 255 bytes");
    for (int c = 1; c < 0x20; c++) {
        char bad[4] = {'a', (char)c, 'b', 0};
        assert_int_equal(idem__check_key(bad, "key", 0), IDEM_EINVAL);
    }
    assert_int_equal(idem__check_key("a\x7f", "key", 0), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "key: control character 0x7f at byte 1");

    /* Keys are UTF-8: every store keeps them as text. */
    assert_int_equal(idem__check_key("\xc3\xa9\xe2\x82\xac\xf0\x9f\x92\xb0", "key", 0), IDEM_OK);
    static const char *const not_utf8[] = {
        "R-\xe9",           /* Latin-1 */
        "\xc0\xaf",        /* overlong '/' */
        "\xe0\x80\xaf",   /* overlong, 3 bytes */
        "\xed\xa0\x80",   /* a surrogate */
        "\xf4\x90\x80\x80", /* above U+10FFFF */
        "\xf5\x80\x80\x80",
        "\x80",             /* a lone continuation byte */
        "ab\xe2\x82",      /* cut short at the end */
        "\xf0\x9f\x92",
    };
    for (size_t i = 0; i < sizeof not_utf8 / sizeof not_utf8[0]; i++)
        assert_int_equal(idem__check_key(not_utf8[i], "key", 0), IDEM_EINVAL);
    assert_int_equal(idem__check_key("R-\xe9", "key", 0), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "key: byte 2 (0xe9) is not valid UTF-8");
    /* 255 bytes of 2-byte characters and one more byte: too long. */
    for (int i = 0; i < 254; i += 2)
        k[i] = (char)0xc3, k[i + 1] = (char)0xa9;
    k[254] = 'x';
    k[255] = '\0';
    assert_int_equal(idem__check_key(k, "key", 0), IDEM_OK);
    k[254] = (char)0xc3, k[255] = (char)0xa9, k[256] = '\0';
    assert_int_equal(idem__check_key(k, "key", 0), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "key: longer than 255 bytes");
}

static void test_names(void **state)
{
    (void)state;
    assert_int_equal(idem__check_name("refund", "space"), IDEM_OK);
    assert_int_equal(idem__check_name("Pay.v2:cn-north_1", "space"), IDEM_OK);
    assert_int_equal(idem__check_name("has space", "space"), IDEM_EINVAL);
    assert_int_equal(idem__check_name("a/b", "space"), IDEM_EINVAL);
    assert_int_equal(idem__check_name("", "space"), IDEM_EINVAL);
    char n[80];
    memset(n, 'x', 65);
    n[65] = '\0';
    assert_int_equal(idem__check_name(n, "scene"), IDEM_EINVAL);
    n[64] = '\0';
    assert_int_equal(idem__check_name(n, "scene"), IDEM_OK);
    assert_int_equal(idem__check_ms(0, 1, 10, "ttl_ms"), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "ttl_ms: 0 ms, must be 1..10");
    assert_int_equal(idem__check_ms(10, 1, 10, "ttl_ms"), IDEM_OK);
}

static void test_error_table(void **state)
{
    (void)state;
    /* The table is append-only: published codes keep their numbers. */
    assert_int_equal(IDEM_OK, 0);
    assert_int_equal(IDEM_EINVAL, -1);
    assert_int_equal(IDEM_ENOMEM, -2);
    assert_int_equal(IDEM_ESTORE, -3);
    assert_int_equal(IDEM_ETIMEDOUT, -4);
    assert_int_equal(IDEM_ETOOBIG, -5);
    assert_int_equal(IDEM_EFULL, -6);
    assert_int_equal(IDEM_ENOTSUP, -7);
    assert_int_equal(IDEM_ENOTX, -8);
    assert_int_equal(IDEM_EUNAVAILABLE, -9);
    assert_int_equal(IDEM_ECLOSING, -10);
    for (int rc = 0; rc >= -10; rc--)
        assert_string_not_equal(idem_strerror((idem_rc)rc), "unknown error");
    for (int o = 0; o < IDEM_OUTCOME_COUNT_; o++)
        assert_string_not_equal(idem_outcome_name((idem_outcome)o), "?");
    assert_string_equal(idem_outcome_name(IDEM_OUTCOME_COUNT_), "?");
}

static void test_tokens_and_fingerprints(void **state)
{
    (void)state;
    char a[IDEM_TOKEN_LEN + 1], b[IDEM_TOKEN_LEN + 1];
    assert_int_equal(idem__random_token(a), IDEM_OK);
    assert_int_equal(idem__random_token(b), IDEM_OK);
    assert_int_equal(strlen(a), IDEM_TOKEN_LEN);
    assert_string_not_equal(a, b);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    assert_int_equal(idem_fingerprint("abc", 3, fp), IDEM_OK);
    /* SHA-256("abc") begins ba7816bf and ends f20015ad. */
    static const uint8_t head[4] = {0xba, 0x78, 0x16, 0xbf}, tail[4] = {0xf2, 0x00, 0x15, 0xad};
    assert_memory_equal(fp, head, 4);
    assert_memory_equal(fp + 28, tail, 4);
    assert_int_equal(idem_fingerprint(NULL, 3, fp), IDEM_EINVAL);
    assert_int_equal(idem_fingerprint(NULL, 0, fp), IDEM_OK);
}

static void test_tokens_after_fork(void **state)
{
    (void)state;
    /* The parent has drawn a pool of random bytes; a child must not hand
     * out the same ones. */
    char parent[IDEM_TOKEN_LEN + 1], child[IDEM_TOKEN_LEN + 1] = {0};
    assert_int_equal(idem__random_token(parent), IDEM_OK);
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char t[IDEM_TOKEN_LEN + 1];
        idem__random_token(t);
        _exit(write(p[1], t, IDEM_TOKEN_LEN) == IDEM_TOKEN_LEN ? 0 : 1);
    }
    close(p[1]);
    assert_int_equal(read(p[0], child, IDEM_TOKEN_LEN), IDEM_TOKEN_LEN);
    close(p[0]);
    waitpid(pid, NULL, 0);
    assert_int_equal(idem__random_token(parent), IDEM_OK);
    assert_string_not_equal(parent, child);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_tokens_and_fingerprints),
        cmocka_unit_test(test_tokens_after_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
