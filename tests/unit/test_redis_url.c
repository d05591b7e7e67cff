/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the one redis:// URL parser (lib/core/redis_url.c), which
 * the distributed store and the daemon's Redis Streams consumers share:
 * what it takes, what it refuses and why, and that no message shows a
 * password. */
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>

#include "core/redis_url.h"
#include "testlib.h"

static void parsed(const char *url, struct idem__redis_url *u)
{
    if (idem__redis_url_parse(url, "redis_url", u) != IDEM_OK)
        fail_msg("%s refused: %s", url, idem_errdetail());
}

/* A URL refused: EINVAL, the detail naming the setting and holding want,
 * and no credentials left in *u. */
static void refused(const char *url, const char *want)
{
    struct idem__redis_url u;
    assert_int_equal(idem__redis_url_parse(url, "redis_url", &u), IDEM_EINVAL);
    const char *d = idem_errdetail();
    if (strncmp(d, "redis_url: ", 11) != 0 || !strstr(d, want))
        fail_msg("%s: detail \"%s\", expected one with \"%s\"", url, d, want);
    if (strstr(d, "SECRET") || strstr(d, "alice"))
        fail_msg("%s: the detail \"%s\" shows a credential", url, d);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "");
}

static void test_every_part(void **state)
{
    (void)state;
    struct idem__redis_url u;
    parsed("redis://alice:s%40cr%2Ft%3F%23@cache.example:6380/3", &u);
    assert_string_equal(u.user, "alice");
    assert_string_equal(u.password, "s@cr/t?#");
    assert_string_equal(u.host, "cache.example");
    assert_int_equal(u.port, 6380);
    assert_int_equal(u.db, 3);
    assert_string_equal(u.where, "cache.example:6380");
    idem__redis_url_wipe(&u);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "");

    /* The password alone, Redis's "default" user; defaults for the rest. */
    parsed("redis://:p%25w@10.0.0.5", &u);
    assert_string_equal(u.user, "");
    assert_string_equal(u.password, "p%w");
    assert_int_equal(u.port, 6379);
    assert_int_equal(u.db, 0);
    /* An '@' in the password, unescaped: the last '@' ends it. */
    parsed("redis://u:a@b@h/", &u);
    assert_string_equal(u.password, "a@b");
    assert_string_equal(u.host, "h");
    assert_int_equal(u.db, 0);
    /* No credentials; an IPv6 host. */
    parsed("redis://[::1]:7000/1000000", &u);
    assert_string_equal(u.host, "::1");
    assert_string_equal(u.where, "[::1]:7000");
    assert_int_equal(u.db, 1000000);
    assert_string_equal(u.password, "");
}

/* A password of IDEM_REDIS_PASSWORD_MAX bytes is taken, as written or
 * escaped; one byte more is refused, never cut. */
static void test_long_password(void **state)
{
    (void)state;
    static char url[4096], pw[IDEM_REDIS_PASSWORD_MAX + 2];
    struct idem__redis_url u;
    memset(pw, 'x', IDEM_REDIS_PASSWORD_MAX);
    pw[IDEM_REDIS_PASSWORD_MAX] = '\0';
    snprintf(url, sizeof url, "redis://:%s@h:1/2", pw);
    parsed(url, &u);
    assert_int_equal(strlen(u.password), IDEM_REDIS_PASSWORD_MAX);
    int n = snprintf(url, sizeof url, "redis://:");
    for (int i = 0; i < IDEM_REDIS_PASSWORD_MAX; i++)
        n += snprintf(url + n, sizeof url - (size_t)n, "%%78");
    snprintf(url + n, sizeof url - (size_t)n, "@h");
    parsed(url, &u);
    assert_string_equal(u.password, pw);

    snprintf(url, sizeof url, "redis://:SECRET%s@h:1/2", pw);
    refused(url, "the password is longer than 511 bytes");
    memset(pw, 'u', IDEM_REDIS_USER_MAX + 1);
    pw[IDEM_REDIS_USER_MAX + 1] = '\0';
    snprintf(url, sizeof url, "redis://%s:SECRET@h", pw);
    refused(url, "the user name is longer than 255 bytes");
}

static void test_refusals(void **state)
{
    (void)state;
    refused("http://h:6379", "not a redis:// or redis-sentinel:// URL");
    refused("", "not a redis:// or redis-sentinel:// URL");
    refused("redis://", "no host");
    refused("redis://:SECRET@", "no host");
    refused("redis://:SECRET@:6379/0", "no host");
    refused("redis://alice@h", "credentials must be user:password or :password");
    refused("redis://alice:@h", "empty password");
    refused("redis://:SECRET%4@h", "the password has a % not followed by two hex digits");
    refused("redis://:SECRET%zz@h", "the password has a % not followed by two hex digits");
    refused("redis://ali%0ace:SECRET@h", "the user name holds a control character");
    refused("redis://:SECRET%0d@h", "the password holds a control character");
    refused("redis://:SECRET@h:0", "the port must be 1..65535");
    refused("redis://:SECRET@h:65536", "the port must be 1..65535");
    refused("redis://:SECRET@h:", "the port must be 1..65535");
    refused("redis://:SECRET@h:63x9", "the port must be 1..65535");
    refused("redis://:SECRET@h/db1", "the db must be a number (0..1000000)");
    refused("redis://:SECRET@h/1000001", "the db must be a number (0..1000000)");
    refused("redis://:SECRET@h/-1", "the db must be a number");
    refused("redis://:SECRET@[::1", "unclosed [ in the host");
    refused("redis://:SECRET@[::g]:1", "malformed IPv6 address");
    refused("redis://:SECRET@[::1]x", "unexpected text after the host");
    refused("redis://:SECRET@ho st", "the host may hold letters, digits");
    refused("redis://:SECRET@h?db=1", "the host may hold letters, digits");
    /* '/' ends the host part: an unescaped '/' in a password leaves no
     * '@' before it, and no host; the password is not shown. */
    refused("redis://:SEC/RET@h:6379/0", "no host");
    char url[600];
    char host[300];
    memset(host, 'h', 256);
    host[256] = '\0';
    snprintf(url, sizeof url, "redis://:SECRET@%s:1", host);
    refused(url, "host longer than 255 bytes");
    struct idem__redis_url u;
    assert_int_equal(idem__redis_url_parse(NULL, "redis_stream", &u), IDEM_EINVAL);
    assert_string_equal(idem_errdetail(), "redis_stream: NULL");
}

/* redis-sentinel://: the sentinels in order (26379 by default), the
 * master's name, the db; the credentials are the master's. */
static void test_sentinels(void **state)
{
    (void)state;
    struct idem__redis_url u;
    parsed("redis-sentinel://:p%40ss@10.0.0.1:26380,s2.example,[::1]:5000/payments/2", &u);
    assert_int_equal(u.sentinels, 3);
    assert_string_equal(u.sentinel[0].host, "10.0.0.1");
    assert_int_equal(u.sentinel[0].port, 26380);
    assert_string_equal(u.sentinel[1].host, "s2.example");
    assert_int_equal(u.sentinel[1].port, 26379);
    assert_string_equal(u.sentinel[2].host, "::1");
    assert_int_equal(u.sentinel[2].port, 5000);
    assert_string_equal(u.master, "payments");
    assert_int_equal(u.db, 2);
    assert_string_equal(u.password, "p@ss");
    assert_string_equal(u.host, "");
    assert_string_equal(u.where,
                        "master payments via 10.0.0.1:26380,s2.example:26379,[::1]:5000");
    idem__redis_url_wipe(&u);
    parsed("redis-sentinel://s1/m", &u);
    assert_int_equal(u.sentinels, 1);
    assert_int_equal(u.db, 0);
    assert_string_equal(u.master, "m");

    refused("redis-sentinel://:SECRET@s1:26379", "no master name after the sentinels");
    refused("redis-sentinel://:SECRET@s1:26379/", "no master name after the sentinels");
    refused("redis-sentinel://:SECRET@s1,,s2/m", "no host");
    refused("redis-sentinel://:SECRET@s1:0/m", "the port must be 1..65535");
    refused("redis-sentinel://:SECRET@s1/m/x", "the db must be a number");
    refused("redis-sentinel://:SECRET@s1/m%20x", "the master name holds a space");
    refused("redis-sentinel://a,b,c,d,e,f,g,h,i/m", "more than 8 sentinels");
}

static redisReply text(int type, const char *s)
{
    redisReply r = {.type = type, .str = (char *)s, .len = strlen(s)};
    return r;
}

/* The sentinels' answers, as every connection through them reads them. */
static void test_sentinel_answers(void **state)
{
    (void)state;
    char host[64];
    int port = 0;
    redisReply h = text(REDIS_REPLY_STRING, "10.0.0.9"), p = text(REDIS_REPLY_STRING, "6380");
    redisReply *pair[2] = {&h, &p};
    redisReply addr = {.type = REDIS_REPLY_ARRAY, .elements = 2, .element = pair};
    assert_null(idem__sentinel_master(&addr, host, sizeof host, &port));
    assert_string_equal(host, "10.0.0.9");
    assert_int_equal(port, 6380);
    redisReply nil = {.type = REDIS_REPLY_NIL};
    assert_string_equal(idem__sentinel_master(&nil, host, sizeof host, &port), "no such master");
    redisReply err = text(REDIS_REPLY_ERROR, "ERR unknown command");
    assert_string_equal(idem__sentinel_master(&err, host, sizeof host, &port),
                        "ERR unknown command");
    assert_string_equal(idem__sentinel_master(NULL, host, sizeof host, &port), "no answer");
    p = text(REDIS_REPLY_STRING, "70000");
    assert_string_equal(idem__sentinel_master(&addr, host, sizeof host, &port),
                        "an answer that is not an address");
    p = text(REDIS_REPLY_STRING, "6380");
    assert_non_null(idem__sentinel_master(&addr, host, 4, &port)); /* no room for the host */

    redisReply role = text(REDIS_REPLY_STRING, "master"), *first[1] = {&role};
    redisReply roles = {.type = REDIS_REPLY_ARRAY, .elements = 1, .element = first};
    assert_true(idem__redis_is_master(&roles));
    role = text(REDIS_REPLY_STRING, "slave");
    assert_false(idem__redis_is_master(&roles));
    assert_false(idem__redis_is_master(&err));
    assert_false(idem__redis_is_master(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_part),
        cmocka_unit_test(test_long_password),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_sentinels),
        cmocka_unit_test(test_sentinel_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
