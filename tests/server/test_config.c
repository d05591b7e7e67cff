/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of server/config.c: the YAML file idem serve reads. Every field with
 * its default and its value, and every way a file is refused, asserting that
 * the message names the line and the field. */
#include "gateway/signature.h"
#include "gateway/resolve_config.h"
#include "gateway/states_config.h"
#include "testlib.h"

#include <openssl/pem.h>
#include <openssl/rsa.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

/* c printed as idem serve -T prints it; free() it. */
static char *print_config(const struct server_config *c)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(config_print(f, c), 0);
    fclose(f);
    return text;
}

/* What -T prints of c reads back, and printed again is the same text: the
 * printed form is a fixed point. The configuration read back, for the
 * caller to compare (or NULL: freed here). */
static struct server_config *round_trip(const struct server_config *c, int keep)
{
    char *one = print_config(c), *two, err[512];
    struct server_config *again = NULL;
    if (config_parse(one, strlen(one), "printed.yaml", &again, err, sizeof err) != 0)
        fail_msg("the printed configuration is refused: %s\n--- printed ---\n%s", err, one);
    two = print_config(again);
    if (strcmp(one, two) != 0)
        fail_msg("printed again, it differs\n--- printed ---\n%s--- read back, printed ---\n%s",
                 one, two);
    free(one);
    free(two);
    if (keep)
        return again;
    config_free(again);
    return NULL;
}

/* Every configuration a test reads is printed back too (round_trip). */
static struct server_config *parse_ok(const char *yaml)
{
    struct server_config *c = NULL;
    char err[512];
    if (config_parse(yaml, strlen(yaml), "idem.yaml", &c, err, sizeof err) != 0)
        fail_msg("refused: %s\n--- input ---\n%s", err, yaml);
    assert_non_null(c);
    round_trip(c, 0);
    return c;
}

/* Refused, and the message holds each of the given substrings. */
static void parse_bad_len(const char *yaml, size_t len, const char *want1,
                          const char *want2)
{
    struct server_config *c = (struct server_config *)1;
    char err[512] = "";
    if (config_parse(yaml, len, "idem.yaml", &c, err, sizeof err) == 0)
        fail_msg("accepted\n--- input ---\n%.*s", (int)(len < 400 ? len : 400), yaml);
    assert_null(c);
    if (want1 && !strstr(err, want1))
        fail_msg("message \"%s\" lacks \"%s\"\n--- input ---\n%.*s", err, want1,
                 (int)(len < 400 ? len : 400), yaml);
    if (want2 && !strstr(err, want2))
        fail_msg("message \"%s\" lacks \"%s\"\n--- input ---\n%.*s", err, want2,
                 (int)(len < 400 ? len : 400), yaml);
}

static void parse_bad(const char *yaml, const char *want1, const char *want2)
{
    parse_bad_len(yaml, strlen(yaml), want1, want2);
}

/* A minimal valid route; tests append lines from line 6 on. */
#define ROUTE                                                                    \
    "routes:\n"                                                                  \
    "  - name: r\n"                                                              \
    "    match: { path: /x }\n"                                                  \
    "    upstream: http://127.0.0.1:9000\n"                                      \
    "    key: { header: Idempotency-Key }\n"

static const char full_example[] =
    "listen: 127.0.0.1:8080\n"
    "storage: { kind: embedded, path: ./idem.db }\n"
    "subject_header: X-Subject          # set by the caller's auth layer\n"
    "workers: 64\n"
    "limits:\n"
    "  request_line_max: 8KiB\n"
    "  header_count_max: 100\n"
    "  header_bytes_max: 32KiB\n"
    "  body_max: 1MiB\n"
    "  response_max: 1MiB\n"
    "  connections_max: 10000\n"
    "  admin_connections_max: 32\n"
    "  requests_per_connection: 10000\n"
    "  idle_timeout: 60s\n"
    "  header_timeout: 10s\n"
    "  body_timeout: 30s\n"
    "  send_timeout: 45s\n"
    "  in_flight_max: 1024\n"
    "  shutdown_timeout: 30s\n"
    "  replay_cache: 4MiB\n"
    "  tokens_per_scene: 64\n"
    "routes:\n"
    "  - name: refund\n"
    "    match: { method: POST, path: /refunds }\n"
    "    upstream: http://127.0.0.1:9000\n"
    "    key: { json: refund_no }\n"
    "    space: refund\n"
    "    scope: subject\n"
    "    layers: [token, lock, record]\n"
    "    token_scene: refund\n"
    "    in_flight: wait\n"
    "    wait_timeout: 5s\n"
    "    lease: 30s\n"
    "    retention: 24h\n"
    "    upstream_timeout: 30s\n"
    "    replay_headers: [content-type, location]\n"
    "    fingerprint: body\n"
    "    on_upstream_5xx: release\n";

static void test_full_example(void **state)
{
    struct server_config *c = parse_ok(full_example);
    assert_null(c->path);
    assert_string_equal(c->listen_host, "127.0.0.1");
    assert_int_equal(c->listen_port, 8080);
    assert_string_equal(c->storage_kind, "embedded");
    assert_string_equal(c->storage_path, "./idem.db");
    assert_string_equal(c->subject_header, "X-Subject");
    assert_int_equal(c->workers, 64); /* read, though ignored */
    assert_int_equal(c->limits.request_line_max, 8192);
    assert_int_equal(c->limits.header_count_max, 100);
    assert_int_equal(c->limits.header_bytes_max, 32768);
    assert_int_equal(c->limits.body_max, 1048576);
    assert_int_equal(c->limits.response_max, 1048576);
    assert_int_equal(c->limits.connections_max, 10000);
    assert_int_equal(c->limits.admin_connections_max, 32);
    assert_int_equal(c->limits.requests_per_connection, 10000);
    assert_int_equal(c->limits.idle_timeout_ms, 60000);
    assert_int_equal(c->limits.header_timeout_ms, 10000);
    assert_int_equal(c->limits.body_timeout_ms, 30000);
    assert_int_equal(c->limits.send_timeout_ms, 45000);
    assert_int_equal(c->limits.in_flight_max, 1024);
    assert_int_equal(c->limits.shutdown_timeout_ms, 30000);
    assert_int_equal(c->limits.replay_cache, 4 * 1024 * 1024);
    assert_int_equal(c->limits.tokens_per_scene, 64);

    assert_int_equal(c->route_count, 1);
    const struct route *r = &c->routes[0];
    assert_string_equal(r->name, "refund");
    assert_string_equal(r->method, "POST");
    assert_string_equal(r->path, "/refunds");
    assert_int_equal(r->prefix, 0);
    assert_string_equal(r->upstream.host, "127.0.0.1");
    assert_int_equal(r->upstream.port, 9000);
    assert_string_equal(r->upstream.base_path, "");
    assert_int_equal(r->key_parts, 1);
    assert_int_equal(r->key[0].source, KEY_JSON);
    assert_string_equal(r->key[0].name, "refund_no");
    assert_string_equal(r->space, "refund");
    assert_int_equal(r->scope_subject, 1);
    assert_int_equal(r->layer_token, 1);
    assert_int_equal(r->layer_lock, 1);
    assert_string_equal(r->token_scene, "refund");
    assert_int_equal(r->in_flight_wait, 1);
    assert_int_equal(r->wait_timeout_ms, 5000);
    assert_int_equal(r->lease_ms, 30000);
    assert_int_equal(r->retention_ms, 24LL * 3600 * 1000);
    assert_int_equal(r->upstream_timeout_ms, 30000);
    assert_int_equal(r->replay_header_count, 2);
    assert_string_equal(r->replay_headers[0], "content-type");
    assert_string_equal(r->replay_headers[1], "location");
    assert_int_equal(r->fingerprint, FINGERPRINT_BODY);
    assert_int_equal(r->fingerprint_field_count, 0);
    assert_int_equal(r->on_5xx_store, 0);
    config_free(c);
}

static void check_default_limits(const struct server_config *c)
{
    assert_string_equal(c->listen_host, "127.0.0.1");
    assert_int_equal(c->listen_port, 8080);
    assert_string_equal(c->storage_kind, "embedded");
    assert_string_equal(c->storage_path, "./idem.db");
    assert_string_equal(c->subject_header, "X-Subject");
    assert_int_equal(c->workers, 0); /* not given: it is ignored anyway */
    assert_int_equal(c->limits.request_line_max, 8 * 1024);
    assert_int_equal(c->limits.header_count_max, 100);
    assert_int_equal(c->limits.header_bytes_max, 32 * 1024);
    assert_int_equal(c->limits.body_max, 1024 * 1024);
    assert_int_equal(c->limits.response_max, 1024 * 1024);
    assert_int_equal(c->limits.connections_max, 10000);
    assert_int_equal(c->limits.admin_connections_max, 64);
    assert_int_equal(c->limits.requests_per_connection, 10000);
    assert_int_equal(c->limits.idle_timeout_ms, 60000);
    assert_int_equal(c->limits.header_timeout_ms, 10000);
    assert_int_equal(c->limits.body_timeout_ms, 30000);
    assert_int_equal(c->limits.in_flight_max, 1024);
    assert_int_equal(c->limits.shutdown_timeout_ms, 30000);
    assert_int_equal(c->limits.replay_cache, 16 * 1024 * 1024);
    assert_int_equal(c->limits.tokens_per_scene, 16);
}

static void test_defaults(void **state)
{
    static const char *const empties[] = {
        "", "# nothing\n", "{}", "---\n", "~\n", "routes:\n", "routes: []\nlimits:\n",
        "storage: {}\nlimits: {}\n",
    };
    for (size_t i = 0; i < sizeof empties / sizeof empties[0]; i++) {
        struct server_config *c = parse_ok(empties[i]);
        check_default_limits(c);
        assert_int_equal(c->route_count, 0);
        assert_null(c->routes);
        config_free(c);
    }

    struct server_config *d = config_default();
    assert_non_null(d);
    check_default_limits(d);
    assert_int_equal(d->route_count, 0);
    assert_null(d->path);
    config_free(d);
    config_free(NULL);
}

static void test_route_defaults(void **state)
{
    struct server_config *c = parse_ok(ROUTE);
    const struct route *r = &c->routes[0];
    assert_string_equal(r->name, "r");
    assert_null(r->method);
    assert_string_equal(r->path, "/x");
    assert_int_equal(r->prefix, 0);
    assert_int_equal(r->upstream.port, 9000);
    assert_int_equal(r->key[0].source, KEY_HEADER);
    assert_string_equal(r->key[0].name, "Idempotency-Key");
    assert_string_equal(r->space, "r");
    assert_string_equal(r->token_scene, "r");
    assert_int_equal(r->scope_subject, 0);
    assert_int_equal(r->layer_token, 0);
    assert_int_equal(r->layer_lock, 0);
    assert_int_equal(r->in_flight_wait, 0);
    assert_int_equal(r->wait_timeout_ms, 5000);
    assert_int_equal(r->lease_ms, 30000);
    assert_int_equal(r->retention_ms, 86400000);
    assert_int_equal(r->upstream_timeout_ms, 30000);
    assert_int_equal(r->replay_header_count, 1);
    assert_string_equal(r->replay_headers[0], "content-type");
    assert_int_equal(r->fingerprint, FINGERPRINT_BODY);
    assert_int_equal(r->on_5xx_store, 0);
    config_free(c);
}

static void test_route_values(void **state)
{
    struct server_config *c = parse_ok(
        "routes:\n"
        "  - name: cb\n"
        "    match: { method: post, path: /callbacks/* }\n"
        "    upstream: HTTP://pay.internal:81/api/v1/\n"
        "    key: [{ header: X-Merchant }, { query: id }, { path_segment: 2 },\n"
        "          { json: order.serial }, { form: out_trade_no }]\n"
        "    space: payment\n"
        "    scope: global\n"
        "    layers: [lock, record]\n"
        "    token_scene: pay.scene:1\n"
        "    in_flight: reject\n"
        "    wait_timeout: 10m\n"
        "    lease: 1500\n"
        "    retention: 7d\n"
        "    upstream_timeout: 1h\n"
        "    replay_headers: [Content-Type, X-Request-Id, Location]\n"
        "    fingerprint: [amount, order.currency]\n"
        "    on_upstream_5xx: store\n"
        "  - name: any\n"
        "    match: { path: /* }\n"
        "    upstream: http://[::1]:9000\n"
        "    key: { header: Idempotency-Key }\n"
        "    fingerprint: none\n"
        "    replay_headers: []\n");
    assert_int_equal(c->route_count, 2);
    const struct route *r = &c->routes[0];
    assert_string_equal(r->method, "POST");
    assert_string_equal(r->path, "/callbacks/");
    assert_int_equal(r->prefix, 1);
    assert_string_equal(r->upstream.host, "pay.internal");
    assert_int_equal(r->upstream.port, 81);
    assert_string_equal(r->upstream.base_path, "/api/v1");
    assert_int_equal(r->key_parts, 5);
    assert_int_equal(r->key[4].source, KEY_FORM);
    assert_string_equal(r->key[4].name, "out_trade_no");
    assert_int_equal(r->key[0].source, KEY_HEADER);
    assert_string_equal(r->key[0].name, "X-Merchant");
    assert_int_equal(r->key[1].source, KEY_QUERY);
    assert_string_equal(r->key[1].name, "id");
    assert_int_equal(r->key[2].source, KEY_PATH_SEGMENT);
    assert_null(r->key[2].name);
    assert_int_equal(r->key[2].segment, 2);
    assert_int_equal(r->key[3].source, KEY_JSON);
    assert_string_equal(r->key[3].name, "order.serial");
    assert_string_equal(r->space, "payment");
    assert_int_equal(r->scope_subject, 0);
    assert_int_equal(r->layer_token, 0);
    assert_int_equal(r->layer_lock, 1);
    assert_string_equal(r->token_scene, "pay.scene:1");
    assert_int_equal(r->in_flight_wait, 0);
    assert_int_equal(r->wait_timeout_ms, 600000);
    assert_int_equal(r->lease_ms, 1500);
    assert_int_equal(r->retention_ms, 7LL * 86400000);
    assert_int_equal(r->upstream_timeout_ms, 3600000);
    assert_int_equal(r->replay_header_count, 3);
    assert_string_equal(r->replay_headers[0], "content-type");
    assert_string_equal(r->replay_headers[1], "x-request-id");
    assert_string_equal(r->replay_headers[2], "location");
    assert_int_equal(r->fingerprint, FINGERPRINT_FIELDS);
    assert_int_equal(r->fingerprint_field_count, 2);
    assert_string_equal(r->fingerprint_fields[0], "amount");
    assert_string_equal(r->fingerprint_fields[1], "order.currency");
    assert_int_equal(r->on_5xx_store, 1);

    r = &c->routes[1];
    assert_null(r->method);
    assert_string_equal(r->path, "/");
    assert_int_equal(r->prefix, 1);
    assert_string_equal(r->upstream.host, "::1");
    assert_int_equal(r->upstream.port, 9000);
    assert_int_equal(r->fingerprint, FINGERPRINT_NONE);
    assert_int_equal(r->replay_header_count, 0);
    config_free(c);
}

/* signature: read with its secrets from the environment, and refused,
 * with file:line, when it could never check anything. */
static void test_signature(void **state)
{
    (void)state;
    setenv("IDEM_TEST_SIG", "0123456789abcdef-secret", 1);
    setenv("IDEM_TEST_SIG_SHORT", "short", 1);
    setenv("IDEM_TEST_WHSEC", "whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWo=", 1);
    struct server_config *c =
        parse_ok(ROUTE "    signature: { scheme: stripe, secrets: [{ env: IDEM_TEST_SIG }] }\n");
    const struct signature *s = c->routes[0].signature;
    assert_non_null(s);
    assert_int_equal(s->scheme, SIGNATURE_STRIPE);
    assert_int_equal(s->secret_count, 1);
    assert_int_equal(s->secrets[0].len, strlen("0123456789abcdef-secret"));
    assert_int_equal(s->tolerance_ms, 300000); /* 5 min */
    config_free(c);
    c = parse_ok(ROUTE "    signature:\n      scheme: standard_webhooks\n"
                       "      secrets: [{ env: IDEM_TEST_WHSEC }]\n      tolerance: 1m\n");
    s = c->routes[0].signature;
    assert_int_equal(s->secrets[0].len, 20); /* the key is whsec_'s base64, decoded */
    assert_memory_equal(s->secrets[0].key, "0123456789abcdefghij", 20);
    assert_int_equal(s->tolerance_ms, 60000);
    config_free(c);
    /* The second secret above is refused: shown by the line it is on. */
    parse_bad(ROUTE "    signature:\n      scheme: standard_webhooks\n"
                    "      secrets: [{ env: IDEM_TEST_WHSEC }, { env: IDEM_TEST_SIG }]\n",
              "idem.yaml:8", "whsec_ and the base64 of at least 16 bytes");
    c = parse_ok(ROUTE "    signature:\n      scheme: hmac_sha256\n      header: X-Sig\n"
                       "      encoding: base64\n      prefix: \"sha256=\"\n"
                       "      secrets: [{ env: IDEM_TEST_SIG }]\n");
    s = c->routes[0].signature;
    assert_int_equal(s->scheme, SIGNATURE_HMAC_SHA256);
    assert_string_equal(s->header, "X-Sig");
    assert_int_equal(s->base64, 1);
    assert_string_equal(s->prefix, "sha256=");
    config_free(c);
    parse_bad(ROUTE "    signature: { scheme: stripe, secrets: [{ env: IDEM_TEST_SIG_SHORT }] }\n",
              "routes[0].signature.secrets[0]", "5 bytes; at least 16");
    parse_bad(ROUTE "    signature: { scheme: stripe, secrets: [\"in-the-file\"] }\n",
              "signature.secrets[0]", "never written in this file");
    parse_bad(ROUTE "    signature: { scheme: stripe, secrets: [{ env: IDEM_TEST_UNSET_X }] }\n",
              "IDEM_TEST_UNSET_X", "not set");
    parse_bad(ROUTE "    signature: { scheme: stripe, secrets: [] }\n", "0 secrets", "1 to 8");
    parse_bad(ROUTE "    signature: { scheme: stripe }\n", "secrets is required", NULL);
    parse_bad(ROUTE "    signature: { scheme: paypal, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "signature.scheme", "stripe, github, standard_webhooks, hmac_sha256, wechatpay_v3 or alipay_rsa2");
    parse_bad(ROUTE "    signature: { scheme: github, tolerance: 1m, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "signature.tolerance", "signs no timestamp");
    parse_bad(ROUTE "    signature: { scheme: github, header: X-A, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "signature.header", "for scheme hmac_sha256");
    parse_bad(ROUTE "    signature: { scheme: hmac_sha256, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "header is required", NULL);
    parse_bad(ROUTE "    signature: { scheme: stripe, secret: x, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "secret", NULL);

    /* The RSA schemes: public keys from PEM files, a serial for WeChat Pay. */
    char dir[] = "/tmp/idem-sig-XXXXXX", big[64], small[80], yaml[512];
    assert_non_null(mkdtemp(dir));
    snprintf(big, sizeof big, "%s/big.pem", dir);
    snprintf(small, sizeof small, "%s/small.pem", dir);
    EVP_PKEY *k2048 = EVP_RSA_gen(2048), *k1024 = EVP_RSA_gen(1024);
    FILE *f = fopen(big, "w");
    PEM_write_PUBKEY(f, k2048);
    fclose(f);
    f = fopen(small, "w");
    PEM_write_PUBKEY(f, k1024);
    fclose(f);
    snprintf(yaml, sizeof yaml, ROUTE "    signature: { scheme: wechatpay_v3, public_keys: "
             "[{ file: %s, serial: S-1 }] }\n", big);
    c = parse_ok(yaml);
    s = c->routes[0].signature;
    assert_int_equal(s->public_key_count, 1);
    assert_string_equal(s->public_keys[0].serial, "S-1");
    assert_int_equal(s->secret_count, 0);
    config_free(c);
    snprintf(yaml, sizeof yaml, ROUTE "    signature: { scheme: wechatpay_v3, public_keys: "
             "[{ file: %s }] }\n", big);
    parse_bad(yaml, "public_keys[0]", "serial is required with wechatpay_v3");
    snprintf(yaml, sizeof yaml, ROUTE "    signature: { scheme: alipay_rsa2, public_keys: "
             "[{ file: %s }] }\n", small);
    parse_bad(yaml, "public_keys[0].file", "no RSA public key of 2048 bits or more");
    snprintf(yaml, sizeof yaml, ROUTE "    signature: { scheme: alipay_rsa2, public_keys: "
             "[{ file: %s, serial: S }] }\n", big);
    parse_bad(yaml, "serial is for wechatpay_v3", NULL);
    parse_bad(ROUTE "    signature: { scheme: alipay_rsa2, secrets: [{ env: IDEM_TEST_SIG }] }\n",
              "give public_keys, not secrets", NULL);
    snprintf(yaml, sizeof yaml, ROUTE "    signature: { scheme: github, public_keys: "
             "[{ file: %s }], secrets: [{ env: IDEM_TEST_SIG }] }\n", big);
    parse_bad(yaml, "give secrets, not public_keys", NULL);
    parse_bad(ROUTE "    signature: { scheme: alipay_rsa2, public_keys: [{ file: /nonexistent.pem }] }\n",
              "cannot read", NULL);
    EVP_PKEY_free(k2048);
    EVP_PKEY_free(k1024);
    unlink(big);
    unlink(small);
    rmdir(dir);
}

/* store_statuses: which upstream answers a route keeps; the default is
 * every status under 500 but 408, 425 and 429, with 5xx too under
 * on_upstream_5xx: store. */
static void test_store_statuses(void **state)
{
    struct server_config *c = parse_ok(ROUTE);
    const struct route *r = &c->routes[0];
    assert_int_equal(r->store_statuses_set, 0);
    assert_true(config_route_keeps(r, 100));
    assert_true(config_route_keeps(r, 201));
    assert_true(config_route_keeps(r, 422));
    assert_true(config_route_keeps(r, 499));
    assert_true(config_route_keeps(r, 409));
    assert_true(config_route_keeps(r, 426));
    assert_true(config_route_keeps(r, 430));
    /* The answers that ask for a retry are not kept. */
    assert_false(config_route_keeps(r, 408));
    assert_false(config_route_keeps(r, 425));
    assert_false(config_route_keeps(r, 429));
    assert_false(config_route_keeps(r, 500));
    assert_false(config_route_keeps(r, 503));
    assert_false(config_route_keeps(r, 99));
    assert_false(config_route_keeps(r, 600));
    config_free(c);

    c = parse_ok(ROUTE "    on_upstream_5xx: store\n");
    assert_true(config_route_keeps(&c->routes[0], 503));
    assert_true(config_route_keeps(&c->routes[0], 599));
    assert_false(config_route_keeps(&c->routes[0], 600));
    config_free(c);

    c = parse_ok(ROUTE "    store_statuses: [2xx, 409, \"422\", 5xx]\n");
    r = &c->routes[0];
    assert_int_equal(r->store_statuses_set, 1);
    for (int st = 200; st <= 299; st++)
        assert_true(config_route_keeps(r, st));
    for (int st = 500; st <= 599; st++)
        assert_true(config_route_keeps(r, st));
    assert_true(config_route_keeps(r, 409));
    assert_true(config_route_keeps(r, 422));
    assert_false(config_route_keeps(r, 100));
    assert_false(config_route_keeps(r, 301));
    assert_false(config_route_keeps(r, 400));
    assert_false(config_route_keeps(r, 408));
    assert_false(config_route_keeps(r, 410));
    assert_false(config_route_keeps(r, 499));
    config_free(c);

    parse_bad(ROUTE "    store_statuses: []\n", "idem.yaml:6: routes[0].store_statuses",
              "keeps no answer");
    parse_bad(ROUTE "    store_statuses: ~\n", "idem.yaml:6: routes[0].store_statuses",
              "keeps no answer"); /* a null is an empty list */
    parse_bad(ROUTE "    store_statuses: 2xx\n", "store_statuses", "expected a list");
    parse_bad(ROUTE "    store_statuses: [2xx, 6xx]\n", "store_statuses[1]", "\"6xx\"");
    parse_bad(ROUTE "    store_statuses: [2XX]\n", "store_statuses[0]",
              "not a status class (1xx to 5xx) or a status (100 to 599)");
    parse_bad(ROUTE "    store_statuses: [99]\n", "store_statuses[0]", "\"99\"");
    parse_bad(ROUTE "    store_statuses: [600]\n", "store_statuses[0]", "\"600\"");
    parse_bad(ROUTE "    store_statuses: [0201]\n", "store_statuses[0]", "\"0201\"");
    parse_bad(ROUTE "    store_statuses: [-200]\n", "store_statuses[0]", NULL);
    parse_bad(ROUTE "    store_statuses: [2xx, 201]\n", "store_statuses[1]",
              "201 is listed already");
    parse_bad(ROUTE "    store_statuses: [422, 4xx]\n", "store_statuses[1]",
              "422 is listed already");
    parse_bad(ROUTE "    store_statuses: [{ a: 1 }]\n", "store_statuses[0]", NULL);
    parse_bad(ROUTE "    on_upstream_5xx: store\n    store_statuses: [2xx, 5xx]\n",
              "store_statuses", "list 5xx there");
    /* A consumer's attempts follow max_attempts, not this. */
    parse_bad("consumers:\n"
              "  - name: c\n"
              "    source: { amqp: \"amqp://guest:guest@127.0.0.1:5672/%2f\", queue: q }\n"
              "    key: { json: refund_no }\n"
              "    handler: http://127.0.0.1:9000/mq\n"
              "    store_statuses: [2xx]\n",
              "store_statuses", "unknown field");
}

/* problems: text per problem type, globally and per route, field by field. */
static void test_problems(void **state)
{
    (void)state;
    const char *title, *detail;
    struct server_config *c = parse_ok(
        "problems:\n"
        "  token_spent: { title: 令牌已失效, detail: 请刷新后重试 }\n"
        "  key_reused: { detail: \"Schlüssel schon benutzt\" }\n"
        ROUTE
        "    problems:\n"
        "      token_spent: { detail: refresh the page }\n"
        "      key_missing: { title: missing }\n");
    const struct route *r = &c->routes[0];
    config_problem_text(c, r, "token_spent", &title, &detail);
    assert_string_equal(title, "令牌已失效"); /* the global title: the route sets none */
    assert_string_equal(detail, "refresh the page");
    config_problem_text(c, NULL, "token_spent", &title, &detail);
    assert_string_equal(detail, "请刷新后重试");
    config_problem_text(c, r, "key_reused", &title, &detail);
    assert_null(title);
    assert_string_equal(detail, "Schlüssel schon benutzt");
    config_problem_text(c, r, "key_missing", &title, &detail);
    assert_string_equal(title, "missing");
    assert_null(detail);
    config_problem_text(c, r, "outcome_unknown", &title, &detail);
    assert_null(title);
    assert_null(detail);
    config_free(c);

    parse_bad("problems:\n  token_spnt: { title: x }\n", "problems.token_spnt",
              "did you mean token_spent");
    parse_bad("problems: [token_spent]\n", "problems", "expected a mapping");
    parse_bad("problems:\n  token_spent: gone\n", "problems.token_spent",
              "expected a mapping");
    parse_bad("problems:\n  token_spent: {}\n", "problems.token_spent",
              "give a title, a detail or both");
    parse_bad("problems:\n  token_spent: { text: x }\n", "problems.token_spent.text",
              "unknown field");
    parse_bad("problems:\n  token_spent: { title: \"\" }\n", "problems.token_spent.title",
              "1 to 256");
    parse_bad("problems:\n  token_spent: { detail: \"a\\nb\" }\n",
              "problems.token_spent.detail", "control character");
    parse_bad("problems:\n  token_spent: { detail: [a] }\n", "problems.token_spent.detail",
              NULL);
    parse_bad("problems:\n  token_spent: { title: a }\n  token_spent: { title: b }\n",
              "token_spent", NULL);
    char long_detail[1200];
    memset(long_detail, 'x', 1025);
    long_detail[1025] = '\0';
    char yaml[1400];
    snprintf(yaml, sizeof yaml, "problems:\n  token_spent: { detail: %s }\n", long_detail);
    parse_bad(yaml, "problems.token_spent.detail", "1025 bytes: 1 to 1024");
    parse_bad(ROUTE "    problems:\n      no_route: { title: x }\n",
              "routes[0].problems.no_route", "unknown field");
}

/* Two routes may share a key space: a callback and an admin re-push. */
static void test_shared_space(void **state)
{
    struct server_config *c = parse_ok(
        "routes:\n"
        "  - name: payment-callback\n"
        "    match: { method: POST, path: /callbacks/payment }\n"
        "    upstream: http://127.0.0.1:9000\n"
        "    key: { json: serial_no }\n"
        "    space: payment\n"
        "  - name: payment-repush\n"
        "    match: { method: POST, path: /admin/payments/repush }\n"
        "    upstream: http://127.0.0.1:9000\n"
        "    key: { json: serial_no }\n"
        "    space: payment\n");
    assert_int_equal(c->route_count, 2);
    assert_string_equal(c->routes[0].space, "payment");
    assert_string_equal(c->routes[1].space, "payment");
    assert_string_equal(c->routes[1].token_scene, "payment-repush");
    config_free(c);
    /* But only with one scope and key shape: a subject route's keys are
     * subject/part, which a global route of two parts could build from a
     * header the client chooses. */
    parse_bad("routes:\n"
              "  - { name: a, match: { path: /a }, upstream: http://h, key: { json: n },"
              " space: S, scope: subject }\n"
              "  - { name: b, match: { path: /b }, upstream: http://h,"
              " key: [{ header: X-Tenant }, { json: n }], space: S }\n",
              "idem.yaml:3: routes[1].space:", "one route's keys could be another's");
    parse_bad("routes:\n"
              "  - { name: a, match: { path: /a }, upstream: http://h, key: { json: n },"
              " space: S, scope: subject }\n"
              "  - { name: b, match: { path: /b }, upstream: http://h, key: { json: n },"
              " space: S }\n",
              "idem.yaml:3: routes[1].space:", "scope: subject and 1 key part there");
}

static void test_durations(void **state)
{
    static const struct { const char *s; int64_t ms; } good[] = {
        {"0", 0},          {"250", 250},       {"500ms", 500},    {"30s", 30000},
        {"5m", 300000},    {"24h", 86400000},  {"2d", 172800000}, {"1 s", 1000},
        {"9223372036854775807", INT64_MAX},    {"106751991167d", 106751991167LL * 86400000},
        {"1.5s", 1500},    {"1h30m", 5400000}, {"2m30s", 150000}, {"0.5h", 1800000},
        {"1d12h", 129600000}, {"1s500ms", 1500}, {"0.001s", 1}, {"1.250s", 1250},
    };
    static const char *const bad[] = {
        "",   "s",    "-1",   "-5s",  "5 m s", "5min", "5S",  "5sec",
        "1w", "0x10", "+5s",  "5s ",  " 5s",  "9223372036854775808",
        "106751991168d", "99999999999999999999h", "1.5", "1.5ms", "0.0001s", "1.s",
        ".5s", "1h30", "1h 30m", "1..5s", "1.0000000001s", "106751991167d1d",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        int64_t ms = -1;
        if (config_parse_duration(good[i].s, &ms) != 0)
            fail_msg("\"%s\" refused", good[i].s);
        assert_int_equal(ms, good[i].ms);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t ms = 42;
        if (config_parse_duration(bad[i], &ms) == 0)
            fail_msg("\"%s\" accepted as %lld", bad[i], (long long)ms);
        assert_int_equal(ms, 42);
    }
    assert_int_equal(config_parse_duration(NULL, &(int64_t){0}), -1);
}

static void test_sizes(void **state)
{
    static const struct { const char *s; size_t n; } good[] = {
        {"0", 0},           {"1048576", 1048576}, {"100B", 100},   {"100b", 100},
        {"64k", 65536},     {"64K", 65536},       {"64KB", 65536}, {"64KiB", 65536},
        {"64kib", 65536},   {"1m", 1048576},      {"1MB", 1048576}, {"1MiB", 1048576},
        {"2g", 2147483648u}, {"2GB", 2147483648u}, {"2GiB", 2147483648u},
        {"8 KiB", 8192},
    };
    static const char *const bad[] = {
        "", "k", "-1", "1.5MiB", "1TB", "1KiBs", "1 K i B", "ten", "0x100",
        "99999999999999999999", "18446744073709551615g",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t n = 7;
        if (config_parse_size(good[i].s, &n) != 0)
            fail_msg("\"%s\" refused", good[i].s);
        assert_int_equal(n, good[i].n);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = 7;
        if (config_parse_size(bad[i], &n) == 0)
            fail_msg("\"%s\" accepted as %zu", bad[i], n);
        assert_int_equal(n, 7);
    }
}

/* parse, then config_finish() as idem serve does: 0, or -1 with err. */
static int finish(const char *yaml, struct server_config **out, char *err, size_t errlen)
{
    struct server_config *c = parse_ok(yaml);
    int rc = config_finish(c, err, errlen);
    if (out && rc == 0)
        *out = c;
    else
        config_free(c);
    return rc;
}

/* The admin listener's default, and addresses off loopback refused
 * without allow_plaintext (the message says what to write). */
static void test_exposure(void **state)
{
    (void)state;
    char err[1024];
    struct server_config *c;
    assert_int_equal(finish("storage: { path: /var/lib/idem/idem.db }\n", &c, err, sizeof err), 0);
    assert_string_equal(c->admin_unix, "/var/lib/idem/idem-admin.sock");
    assert_null(c->admin_host);
    config_free(c);
    assert_int_equal(finish("state_dir: /run/idem\n", &c, err, sizeof err), 0);
    assert_string_equal(c->admin_unix, "/run/idem/idem-admin.sock");
    config_free(c);
    assert_int_equal(finish("storage: { path: idem.db }\n", &c, err, sizeof err), 0);
    assert_string_equal(c->admin_unix, "./idem-admin.sock");
    config_free(c);
    assert_int_equal(finish("admin_listen: unix:/tmp/a.sock\n", &c, err, sizeof err), 0);
    assert_string_equal(c->admin_unix, "/tmp/a.sock");
    config_free(c);
    assert_int_equal(finish("admin_listen: 127.0.0.1:9\n", &c, err, sizeof err), 0);
    assert_null(c->admin_unix);
    config_free(c);
    static const char *const exposed[] = {
        "listen: 0.0.0.0:8080\n", "listen: \"[::]:8080\"\n", "listen: 10.0.0.5:8080\n",
        "listen: gw.internal:8080\n", "listen: { address: \"0.0.0.0:8080\" }\n",
        "listen: { address: \"0.0.0.0:8080\", allow_plaintext: false }\n",
    };
    for (size_t i = 0; i < sizeof exposed / sizeof exposed[0]; i++) {
        if (finish(exposed[i], NULL, err, sizeof err) == 0)
            fail_msg("accepted %s", exposed[i]);
        assert_non_null(strstr(err, "is not a loopback address"));
        assert_non_null(strstr(err, "allow_plaintext: true"));
    }
    assert_int_equal(finish("listen: { address: \"0.0.0.0:8080\", allow_plaintext: true }\n",
                            &c, err, sizeof err),
                     0);
    assert_string_equal(c->listen_host, "0.0.0.0");
    config_free(c);
    assert_int_equal(finish("listen: { address: \"0.0.0.0:8080\", allow_plaintext: true }\n"
                            "admin_listen: 0.0.0.0:8081\n",
                            NULL, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "admin_listen 0.0.0.0:8081 is not a loopback"));
    /* --listen comes through the same check. */
    c = parse_ok("");
    assert_int_equal(config_set_listen(c, "0.0.0.0:1", err, sizeof err), 0);
    assert_int_equal(config_finish(c, err, sizeof err), -1);
    config_free(c);
    /* TLS on the listener is what an exposed address needs. */
    /* (Files that can be read: each is read as the file is loaded.) */
    assert_int_equal(finish("listen: { address: \"0.0.0.0:8443\", tls: { cert: /dev/null, "
                            "key: /dev/zero } }\nadmin_listen: { address: \"10.0.0.1:9\", "
                            "tls: { cert: /dev/null, key: /dev/null, client_ca: /dev/zero } }\n",
                            &c, err, sizeof err),
                     0);
    assert_string_equal(c->listen_tls.cert, "/dev/null");
    assert_null(c->listen_tls.client_ca);
    assert_string_equal(c->admin_tls.client_ca, "/dev/zero");
    config_free(c);
    parse_bad("listen: { address: \"0.0.0.0:8443\",\n"
              "  tls: { cert: /dev/null, key: /no/k.pem } }\n",
              "idem.yaml:2: listen.tls.key: \"/no/k.pem\": No such file or directory",
              "read at start and at each SIGHUP");
    parse_bad("tls_ca: /no/ca.pem\n", "idem.yaml:1: tls_ca: \"/no/ca.pem\": No such file", NULL);
    parse_bad("listen: { address: \"0.0.0.0:8443\", tls: { cert: /c.pem } }\n",
              "idem.yaml:1: listen.tls.key:", "missing");
    parse_bad("listen: { address: \"0.0.0.0:8443\", tls: { cert: /c.pem, key: /k.pem, "
              "client_ca: /ca.pem } }\n",
              "idem.yaml:1: listen.tls.client_ca:", "unknown field");
    parse_bad("admin_listen: { address: \"unix:/tmp/a.sock\",\n"
              "  tls: { cert: /dev/null, key: /dev/null } }\n",
              "idem.yaml:1: admin_listen.address:", "takes no tls");
    parse_bad("listen: { address: \"0.0.0.0:8080\", allow_plaintext: yes }\n",
              "idem.yaml:1: listen.allow_plaintext:", "true or false");
    parse_bad("listen: { allow_plaintext: true }\n", "idem.yaml:1: listen:", "no address");
    parse_bad("listen: unix:/tmp/x.sock\n", "idem.yaml:1: listen:", "the port must be");
    parse_bad("admin_listen: \"unix:\"\n", "idem.yaml:1: admin_listen:", "without a path");
    char longer[256];
    snprintf(longer, sizeof longer, "admin_listen: unix:/%0120d\n", 0);
    parse_bad(longer, "idem.yaml:1: admin_listen:", "longer than 107 bytes");
    snprintf(longer, sizeof longer, "state_dir: /%0100d\n", 0);
    assert_int_equal(finish(longer, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "longer than 107 bytes"));
    assert_true(config_is_loopback("127.0.0.1") && config_is_loopback("127.3.2.1") &&
                config_is_loopback("127.1") &&
                config_is_loopback("::1") && config_is_loopback("localhost"));
    assert_false(config_is_loopback("0.0.0.0") || config_is_loopback("::") ||
                 config_is_loopback("128.0.0.1") || config_is_loopback("localhost.evil"));
}

/* API keys: from the environment or a file, hashed; their text never in
 * the file; names and keys unique; a scope each. */
static void test_api_keys(void **state)
{
    (void)state;
    setenv("IDEM_TEST_K1", "0123456789abcdef0123", 1);
    setenv("IDEM_TEST_SHORT", "0123456789", 1);
    setenv("IDEM_TEST_SPACE", "0123456789 abcdef0123", 1);
    char *dir = test_mkdtemp(), path[4200], yaml[8400];
    snprintf(path, sizeof path, "%s/k2", dir);
    FILE *f = fopen(path, "w");
    fputs("fedcba9876543210fedcba\nsecond line ignored\n", f);
    fclose(f);
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - { name: ops, scope: write, env: IDEM_TEST_K1 }\n"
             "  - { name: graf, scope: read, file: %s }\n",
             path);
    struct server_config *c = parse_ok(yaml);
    assert_int_equal(c->api_key_count, 2);
    assert_string_equal(c->api_keys[0].name, "ops");
    assert_int_equal(c->api_keys[0].write, 1);
    assert_int_equal(c->api_keys[1].write, 0);
    uint8_t want[32];
    idem_fingerprint("fedcba9876543210fedcba", 22, want);
    assert_memory_equal(c->api_keys[1].hash, want, 32);
    config_free(c);
    parse_bad("api_keys:\n  - { name: ops, scope: write, key: 0123456789abcdef0123 }\n",
              "idem.yaml:2: api_keys[0]:", "never sits in this file");
    parse_bad("api_keys:\n  - { name: ops, scope: admin, env: IDEM_TEST_K1 }\n",
              "idem.yaml:2: api_keys[0].scope:", "read or write");
    parse_bad("api_keys:\n  - { scope: read, env: IDEM_TEST_K1 }\n",
              "idem.yaml:2: api_keys[0].name:", "missing");
    parse_bad("api_keys:\n  - { name: a, scope: read }\n", "idem.yaml:2: api_keys[0]:",
              "exactly one of env");
    parse_bad("api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_UNSET_X }\n",
              "idem.yaml:2: api_keys[0].env:", "not set");
    parse_bad("api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_SHORT }\n",
              "idem.yaml:2: api_keys[0]:", "at least 16");
    parse_bad("api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_SPACE }\n",
              "idem.yaml:2: api_keys[0]:", "printable ASCII");
    parse_bad("api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_K1 }\n"
              "  - { name: a, scope: write, file: /dev/null }\n",
              "idem.yaml:3: api_keys[1]", "");
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_K1 }\n"
             "  - { name: a, scope: write, file: %s }\n", path);
    parse_bad(yaml, "idem.yaml:3: api_keys[1].name:", "each key has a name of its own");
    snprintf(path, sizeof path, "%s/k1", dir);
    f = fopen(path, "w");
    fputs("0123456789abcdef0123\n", f);
    fclose(f);
    snprintf(yaml, sizeof yaml,
             "api_keys:\n  - { name: a, scope: read, env: IDEM_TEST_K1 }\n"
             "  - { name: b, scope: write, file: %s }\n", path);
    parse_bad(yaml, "idem.yaml:3: api_keys[1]:", "the same key as api_keys[0]");
    test_rmdir(dir);
}

static void test_listen(void **state)
{
    static const struct { const char *s, *host; int port; } good[] = {
        {"127.0.0.1:8080", "127.0.0.1", 8080}, {"0.0.0.0:80", "0.0.0.0", 80},
        {":9090", "127.0.0.1", 9090},          {"9091", "127.0.0.1", 9091},
        {"\"[::1]:8081\"", "::1", 8081},       {"localhost:65535", "localhost", 65535},
        {"idem-gw.internal:1", "idem-gw.internal", 1},
        {"127.0.0.1:0", "127.0.0.1", 0}, /* the system picks the port */
        {"0", "127.0.0.1", 0},
    };
    char yaml[128];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(yaml, sizeof yaml, "listen: %s\n", good[i].s);
        struct server_config *c = parse_ok(yaml);
        assert_string_equal(c->listen_host, good[i].host);
        assert_int_equal(c->listen_port, good[i].port);
        assert_null(c->admin_host);
        config_free(c);
        /* admin_listen takes the same forms (beside a listen of its own). */
        snprintf(yaml, sizeof yaml, "listen: 1.2.3.4:5\nadmin_listen: %s\n", good[i].s);
        c = parse_ok(yaml);
        assert_string_equal(c->admin_host, good[i].host);
        assert_int_equal(c->admin_port, good[i].port);
        assert_string_equal(c->listen_host, "1.2.3.4");
        config_free(c);
    }
    parse_bad("admin_listen: 127.0.0.1\n", "idem.yaml:1: admin_listen:", "no port");
    /* event_loops: 0 (unset) means one per processor. */
    struct server_config *e = parse_ok("event_loops: 3\n");
    assert_int_equal(e->event_loops, 3);
    config_free(e);
    e = parse_ok("listen: 80\n");
    assert_int_equal(e->event_loops, 0);
    config_free(e);
    parse_bad("event_loops: 17\n", "idem.yaml:1: event_loops:", "1 to 16");
    parse_bad("event_loops: 0\n", "idem.yaml:1: event_loops:", "1 to 16");
    parse_bad("admin_listen: bad host:80\n", "idem.yaml:1: admin_listen:", "host name");
    parse_bad("listen: 8081\nadmin_listen: 127.0.0.1:8081\n", "idem.yaml:2: admin_listen:",
              "would share connections with listen");
    parse_bad("listen: 0.0.0.0:8081\nadmin_listen: 127.0.0.1:8081\n",
              "idem.yaml:2: admin_listen:", "would share connections with listen");
    parse_bad("listen: 127.0.0.1:8081\nadmin_listen: \"[::]:8081\"\n",
              "idem.yaml:2: admin_listen:", "would share connections with listen");
    /* Another port, or another address and no wildcard: apart. */
    config_free(parse_ok("listen: 0.0.0.0:8080\nadmin_listen: 127.0.0.1:8081\n"));
    config_free(parse_ok("listen: 10.0.0.1:8080\nadmin_listen: 127.0.0.1:8080\n"));
    config_free(parse_ok("listen: 0.0.0.0:8080\nadmin_listen: \"[::1]:8080\"\n"));
    /* Both on port 0: each gets its own port from the system. */
    struct server_config *z = parse_ok("listen: 0\nadmin_listen: 0\n");
    assert_int_equal(z->admin_port, 0);
    config_free(z);
    parse_bad("listen: 127.0.0.1:65536\n", "idem.yaml:1: listen:", "0 to 65535");
    parse_bad("listen: :99999999999999999999999\n", "idem.yaml:1: listen:", "0 to 65535");
    parse_bad("listen: 127.0.0.1\n", "idem.yaml:1: listen:", "no port");
    parse_bad("listen: \"::1:8080\"\n", "idem.yaml:1: listen:", "brackets");
    parse_bad("listen: \"[::1\"\n", "idem.yaml:1: listen:", "]");
    parse_bad("listen: \"[zz]:80\"\n", "idem.yaml:1: listen:", "IPv6");
    parse_bad("listen: bad host:80\n", "idem.yaml:1: listen:", "host name");
    parse_bad("listen: [a, b]\n", "idem.yaml:1: listen:", "got a list");
    parse_bad("listen:\n", "idem.yaml:1: listen:", "no value");
}

static void test_default_upstream(void **state)
{
    (void)state;
    struct server_config *c = parse_ok("listen: 8080\n");
    assert_int_equal(c->has_upstream, 0);
    config_free(c);
    c = parse_ok("upstream: http://127.0.0.1:9000/api/\n");
    assert_int_equal(c->has_upstream, 1);
    assert_string_equal(c->upstream.host, "127.0.0.1");
    assert_int_equal(c->upstream.port, 9000);
    assert_string_equal(c->upstream.base_path, "/api");
    config_free(c);
    c = parse_ok("upstream: https://pay\n");
    assert_int_equal(c->upstream.tls, 1);
    assert_int_equal(c->upstream.port, 443);
    config_free(c);
    parse_bad("upstream: http://svc:0\n", "idem.yaml:1: upstream:", "1 to 65535");
}

static void test_upstream(void **state)
{
    static const struct { const char *s, *host; int port; const char *base; } good[] = {
        {"http://127.0.0.1:9000", "127.0.0.1", 9000, ""},
        {"https://pay.internal", "pay.internal", 443, ""},
        {"HTTPS://pay.internal:8443/v1", "pay.internal", 8443, "/v1"},
        {"http://svc", "svc", 80, ""},
        {"http://svc/", "svc", 80, ""},
        {"http://svc:8000/api/", "svc", 8000, "/api"},
        {"http://svc:8000/a/b//", "svc", 8000, "/a/b"},
        {"Http://[::1]:9000/x", "::1", 9000, "/x"},
    };
    char yaml[256];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(yaml, sizeof yaml,
                 "routes:\n  - name: r\n    match: { path: /x }\n"
                 "    upstream: \"%s\"\n    key: { header: K }\n", good[i].s);
        struct server_config *c = parse_ok(yaml);
        assert_string_equal(c->routes[0].upstream.host, good[i].host);
        assert_int_equal(c->routes[0].upstream.port, good[i].port);
        assert_string_equal(c->routes[0].upstream.base_path, good[i].base);
        assert_int_equal(c->routes[0].upstream.tls, good[i].s[4] == 's' || good[i].s[4] == 'S');
        config_free(c);
    }
    static const struct { const char *s, *want; } bad[] = {
        {"ftp://svc", "http://host[:port][/base]"},
        {"svc:9000", "http://host[:port][/base]"},
        {"http://svc/x?a=1", "query"},
        {"http://svc/x#f", "fragment"},
        {"http://user:pw@svc", "user:password@"},
        {"http://", "no host"},
        {"http:///x", "no host"},
        {"http://:9000", "no host"},
        {"http://svc:0", "1 to 65535"},
        {"http://svc:70000", "1 to 65535"},
        {"http://svc:", "1 to 65535"},
        {"http://s v c", "host name"},
        {"http://svc/a b", "space"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(yaml, sizeof yaml,
                 "routes:\n  - name: r\n    match: { path: /x }\n"
                 "    upstream: \"%s\"\n    key: { header: K }\n", bad[i].s);
        parse_bad(yaml, "idem.yaml:4: routes[0].upstream:", bad[i].want);
    }
}

static void test_match(void **state)
{
    parse_bad(ROUTE "    lease: 1s\n"
              "  - name: s\n    match: { method: GET, path: refunds }\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:8: routes[1].match.path:", "must start with /");
    /* '*' is a whole segment or nothing. */
    static const char *const part[] = {"/a*b", "/a/b*", "/a/*b/c", "/a/**/b", "/*x", "/a/b**"};
    for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
        char yaml[256];
        snprintf(yaml, sizeof yaml,
                 "routes:\n  - name: r\n    match: { path: \"%s\" }\n"
                 "    upstream: http://h\n    key: { query: id }\n",
                 part[i]);
        parse_bad(yaml, "idem.yaml:3: routes[0].match.path:", "whole segment");
    }
    parse_bad("routes:\n  - name: r\n    match: { path: \"/a?b=1\" }\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:3: routes[0].match.path:", "query");
    parse_bad("routes:\n  - name: r\n    match: { method: POST }\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:3: routes[0].match:", "path is required");
    parse_bad("routes:\n  - name: r\n    match:\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:3: routes[0].match:", "path is required");
    parse_bad("routes:\n  - name: r\n    match: { method: \"PO ST\", path: /x }\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:3: routes[0].match.method:", "not an HTTP method");
    parse_bad("routes:\n  - name: r\n    match: /x\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:3: routes[0].match:", "expected a mapping");
    /* The same match twice: the second route could never be chosen. */
    parse_bad(ROUTE "  - name: s\n    match: { path: /x }\n"
              "    upstream: http://h\n    key: { query: id }\n",
              "idem.yaml:7: routes[1].match:", "routes[0] (line 2)");
    struct server_config *c = parse_ok(
        ROUTE "  - name: s\n    match: { path: /x/* }\n"
        "    upstream: http://h\n    key: { query: id }\n"
        "  - name: t\n    match: { method: GET, path: /x }\n"
        "    upstream: http://h\n    key: { query: id }\n"
        "  - name: u\n    match: { path: /Orders/*/Refunds }\n"
        "    upstream: http://h\n    key: { path_segment: 2 }\n"
        "  - name: v\n    match: { path: /v1/*/items/*/* }\n"
        "    upstream: http://h\n    key: { path_segment: 2 }\n");
    assert_int_equal(c->route_count, 5);
    assert_string_equal(c->routes[3].path, "/Orders/*/Refunds");
    assert_int_equal(c->routes[3].prefix, 0);
    assert_string_equal(c->routes[3].folded_path, "/orders/*/refunds");
    assert_string_equal(c->routes[4].path, "/v1/*/items/*/");
    assert_int_equal(c->routes[4].prefix, 1);
    /* A prefix's folded path keeps its final '/'. */
    assert_string_equal(c->routes[1].folded_path, "/x/");
    config_free(c);
}

/* How a route's path matches a request's. */
static void test_path_match(void **state)
{
    (void)state;
    static const struct {
        const char *pattern;
        int prefix;
        const char *path;
        int match;
    } cases[] = {
        {"/refunds", 0, "/refunds", 1},
        {"/refunds", 0, "/refunds/", 0},
        {"/refunds", 0, "/refund", 0},
        {"/refunds", 0, "/refundsx", 0},
        {"/refunds/", 1, "/refunds/", 1},
        {"/refunds/", 1, "/refunds/R-1/x", 1},
        {"/refunds/", 1, "/refunds", 0},
        {"/refunds/", 1, "/refundsx/1", 0},
        {"/", 1, "/anything/at/all", 1},
        {"/orders/*/refunds", 0, "/orders/O-1/refunds", 1},
        {"/orders/*/refunds", 0, "/orders/O%2F1/refunds", 1},
        {"/orders/*/refunds", 0, "/orders//refunds", 0},      /* a segment, not empty */
        {"/orders/*/refunds", 0, "/orders/a/b/refunds", 0},   /* one segment */
        {"/orders/*/refunds", 0, "/orders/O-1/refunds/", 0},
        {"/orders/*/refunds", 0, "/orders/O-1/refundsx", 0},
        {"/orders/*/refunds", 0, "/orders/O-1", 0},
        {"/orders/*/refunds", 0, "/orders/O-1/cancel", 0},
        {"/orders/*/items/", 1, "/orders/O-1/items/7", 1},
        {"/orders/*/items/", 1, "/orders/O-1/items", 0},
        {"/*/x", 0, "/a/x", 1},
        {"/*/x", 0, "/x", 0},
        {"/a/*", 0, "/a/b", 1}, /* as a pattern: a prefix is stored as "/a/" */
        {"/a/*", 0, "/a/", 0},
        {"/a/*", 0, "/a/b/c", 0},
        {"/a/*/*/", 1, "/a/b/c/d/e", 1},
        {"/a/*/*/", 1, "/a/b/c", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (config_path_match(cases[i].pattern, cases[i].prefix, cases[i].path) !=
            cases[i].match)
            fail_msg("%s%s against %s: expected %s", cases[i].pattern,
                     cases[i].prefix ? " (prefix)" : "", cases[i].path,
                     cases[i].match ? "a match" : "none");
}

static void test_keys(void **state)
{
    parse_bad(ROUTE "  - name: s\n    match: { path: /y }\n    upstream: http://h\n",
              "idem.yaml:6: routes[1]:", "key is required");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: {}\n",
              "idem.yaml:5: routes[0].key:", "exactly one of");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { header: K, json: k }\n",
              "idem.yaml:5: routes[0].key:", "exactly one of");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: []\n",
              "idem.yaml:5: routes[0].key:", "1 to 8 parts");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: [{query: a}, {query: b}, {query: c}, {query: d}, {query: e},\n"
              "          {query: f}, {query: g}, {query: h}, {query: i}]\n",
              "idem.yaml:5: routes[0].key:", "not 9");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key:\n      - { header: K }\n      - { path_segment: 0 }\n",
              "idem.yaml:7: routes[0].key[1].path_segment:", "out of range");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key:\n      - { header: K }\n      - query\n",
              "idem.yaml:7: routes[0].key[1]:", "expected a mapping");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: Idempotency-Key\n",
              "idem.yaml:5: routes[0].key:", "expected a mapping");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { header: \"Idem Key\" }\n",
              "idem.yaml:5: routes[0].key.header:", "not a header name");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { json: a..b }\n",
              "idem.yaml:5: routes[0].key.json:", "not a JSON field");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { query: \"a=b\" }\n",
              "idem.yaml:5: routes[0].key.query:", "query parameter");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { heder: K }\n",
              "idem.yaml:5: routes[0].key.heder:", "did you mean header?");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://h\n"
              "    key: { path_segment: two }\n",
              "idem.yaml:5: routes[0].key.path_segment:", "whole number");
}

/* A minimal valid consumer; tests append lines after it. */
#define CONSUMER                                                                 \
    "consumers:\n"                                                               \
    "  - name: c\n"                                                              \
    "    source: { amqp: \"amqp://guest:guest@127.0.0.1:5672/%2f\", queue: q }\n" \
    "    key: { json: refund_no }\n"                                             \
    "    handler: http://127.0.0.1:9000/mq\n"

/* states: a machine checked at load, and a space's keys moved by one. */
#define STATES                                                                   \
    "    states:\n"                                                              \
    "      field: { json: status }\n"                                            \
    "      initial: CREATED\n"                                                   \
    "      transitions:\n"                                                       \
    "        CREATED: [PROCESSING, SUCCESS, FAILED]\n"                           \
    "        PROCESSING: [SUCCESS, FAILED]\n"                                    \
    "        SUCCESS: [REFUNDED_BACK]\n"

static void test_states(void **state)
{
    (void)state;
    struct server_config *c = parse_ok(ROUTE STATES);
    const struct route_states *st = c->routes[0].states;
    assert_non_null(st);
    assert_int_equal(st->field.source, KEY_JSON);
    assert_string_equal(st->field.name, "status");
    assert_string_equal(idem_machine_initial(st->machine), "CREATED");
    assert_int_equal(idem_machine_relation(st->machine, "SUCCESS", "PROCESSING"),
                     IDEM_STEP_BEHIND);
    config_free(c);
    /* A consumer sharing the route's space with the same states. */
    c = parse_ok(ROUTE "    space: refund\n    fingerprint: none\n" STATES CONSUMER
                 "    space: refund\n    fingerprint: none\n" STATES);
    config_free(c);

    parse_bad(ROUTE "    states:\n      field: { json: status }\n      initial: A\n"
                    "      transitions: { A: [B], B: [C], C: [A] }\n",
              "idem.yaml:9", "a cycle, A -> B -> C -> A");
    parse_bad(ROUTE "    states:\n      field: { json: status }\n      initial: A\n"
                    "      transitions: { A: [B], PROCESING: [C] }\n",
              "idem.yaml:9", "PROCESING cannot be reached from the initial state A");
    parse_bad(ROUTE "    states:\n      field: { json: status }\n      initial: A\n"
                    "      transitions: { B: [C] }\n",
              "idem.yaml:9", "the initial state A has no move out of it");
    parse_bad(ROUTE "    states:\n      field: { json: status }\n      initial: A\n"
                    "      transitions:\n        A: [\"state:B\"]\n",
              "idem.yaml:10", "not one of [A-Za-z0-9_.-]");
    parse_bad(ROUTE "    states:\n      field: { json: status }\n      initial: A\n"
                    "      transitions:\n        A: []\n",
              "idem.yaml:10", "an empty list");
    parse_bad(ROUTE "    states:\n      initial: A\n      transitions: { A: [B] }\n",
              "idem.yaml:7", "field is required");
    parse_bad(CONSUMER "    states:\n      field: { query: status }\n      initial: A\n"
                       "      transitions: { A: [B] }\n",
              "idem.yaml:7", "a message has no query");
    /* tombstone: a duration, and with retention at most ten years. */
    c = parse_ok(ROUTE "    retention: 1d\n    tombstone: 30d\n");
    assert_int_equal(c->routes[0].tombstone_ms, 30LL * 24 * 3600 * 1000);
    config_free(c);
    parse_bad(ROUTE "    retention: 3650d\n    tombstone: 1d\n", "idem.yaml:7",
              "retention and tombstone add up to more than 3650d");
    /* A WeChat Pay resource's field needs the key that decrypts it. */
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n"
              "    upstream: http://127.0.0.1:9000\n"
              "    key: { wechatpay_resource: out_refund_no }\n",
              "idem.yaml:2", "give signature: { scheme: wechatpay_v3");
    /* One space, two machines (or one and none): refused. */
    parse_bad(ROUTE "    space: refund\n" STATES
              "  - name: r2\n    match: { path: /y }\n    upstream: http://127.0.0.1:9000\n"
              "    key: { header: Idempotency-Key }\n    space: refund\n",
              "routes[1].space", "\"refund\", the space of routes[0] too, which has states");
    parse_bad(ROUTE "    space: refund\n" STATES CONSUMER "    space: refund\n"
              "    states:\n      field: { json: status }\n      initial: CREATED\n"
              "      transitions: { CREATED: [SUCCESS] }\n",
              "consumers[0].states", "whose states are other ones");
}

/* on_unknown_outcome: resolve and its status query. */
static void test_resolve(void **state)
{
    (void)state;
    struct server_config *c;
    c = parse_ok(ROUTE "    on_unknown_outcome: resolve\n"
                       "    resolve:\n      url: http://127.0.0.1:9000/refunds/{key}\n"
                       "      backoff: [1s, 5s]\n      executed: [2xx]\n"
                       "      not_executed: [404, 410]\n");
    assert_non_null(c->routes[0].resolve);
    assert_int_equal(c->routes[0].resolve->after_ms, 1000);
    assert_true(status_set_has(c->routes[0].resolve->executed, 204));
    assert_true(status_set_has(c->routes[0].resolve->not_executed, 410));
    char target[128];
    assert_int_equal(resolve_target(c->routes[0].resolve, "refund", "R 1/%", target,
                                    sizeof target), 0);
    assert_string_equal(target, "/refunds/R%201%2F%25");
    config_free(c);
    parse_bad(ROUTE "    on_unknown_outcome: resolve\n", "idem.yaml:2",
              "on_unknown_outcome: resolve needs resolve:");
    /* A consumer's handler call that timed out, the same way. */
    c = parse_ok(CONSUMER "    on_unknown_outcome: resolve\n"
                          "    resolve: { url: \"http://127.0.0.1:9000/r/{key}\", executed: [200], "
                          "not_executed: [404] }\n");
    assert_non_null(c->consumers[0].route.resolve);
    config_free(c);
    parse_bad(ROUTE "    resolve: { url: \"http://127.0.0.1:9000/r/{key}\", executed: [200], "
                    "not_executed: [404] }\n",
              "idem.yaml:6", "set that too");
    parse_bad(ROUTE "    on_unknown_outcome: resolve\n"
                    "    resolve: { url: \"http://127.0.0.1:9000/r\", executed: [200], "
                    "not_executed: [404] }\n",
              "idem.yaml:7", "names no {key}");
    parse_bad(ROUTE "    on_unknown_outcome: resolve\n"
                    "    resolve: { url: \"http://127.0.0.1:9000/r/{id}\", executed: [200], "
                    "not_executed: [404] }\n",
              "idem.yaml:7", "{id}: the URL's path may hold {key} and {space}");
    parse_bad(ROUTE "    on_unknown_outcome: resolve\n"
                    "    resolve: { url: \"http://127.0.0.1:9000/r/{key}\", executed: [2xx], "
                    "not_executed: [200] }\n",
              "idem.yaml:7", "200 is in executed too");
}

static void test_consumers(void **state)
{
    (void)state;
    struct server_config *c = parse_ok(CONSUMER);
    assert_int_equal(c->consumer_count, 1);
    const struct consumer_config *k = &c->consumers[0];
    assert_int_equal(k->source, SOURCE_AMQP);
    assert_string_equal(k->queue, "q");
    assert_string_equal(k->dead_letter, "q.dead");
    assert_int_equal(k->prefetch, 64);
    assert_int_equal(k->backoff_count, 3);
    assert_int_equal(k->backoff_ms[2], 30000);
    assert_int_equal(k->route.max_attempts, 5);
    assert_int_equal(k->route.upstream_timeout_ms, 10000);
    assert_string_equal(k->route.space, "c");
    assert_string_equal(k->route.upstream.base_path, "/mq");
    assert_false(k->route.layer_token);
    config_free(c);
    c = parse_ok("consumers:\n  - name: s\n"
                 "    source: { redis_stream: \"redis://127.0.0.1:6379/0\", stream: st }\n"
                 "    key: [{ message_id: true }, { header: x-biz }]\n"
                 "    handler: http://127.0.0.1:9000\n    max_attempts: 2\n"
                 "    retry_backoff: [100ms]\n    dead_letter: { stream: st.dlq }\n");
    k = &c->consumers[0];
    assert_int_equal(k->source, SOURCE_REDIS_STREAM);
    assert_string_equal(k->group, "idem");
    assert_string_equal(k->body_field, "body");
    assert_string_equal(k->dead_letter, "st.dlq");
    assert_string_equal(k->route.key[0].name, "Idem-Message-Id");
    assert_int_equal(k->route.max_attempts, 2);
    config_free(c);
    /* Secrets stay out of the file; RabbitMQ's loopback guest is no secret. */
    parse_bad("consumers:\n  - name: c\n"
              "    source: { amqp: \"amqp://app:s3cret@10.0.0.5/%2f\", queue: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "idem.yaml:3: consumers[0].source.amqp:", "holds a password");
    parse_bad("consumers:\n  - name: c\n"
              "    source: { amqp: \"amqp://guest:guest@10.0.0.5/%2f\", queue: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[0].source.amqp:", "holds a password");
    parse_bad("consumers:\n  - name: c\n"
              "    source: { amqp: \"http://h\", queue: q }\n    key: { json: k }\n"
              "    handler: http://h\n",
              "consumers[0].source.amqp:", "not a amqp:// URL");
    /* A Redis URL is read as the consumer would read it, at its line; a
     * Sentinels' one too. */
    parse_bad("consumers:\n  - name: c\n"
              "    source: { redis_stream: \"redis://h:70000/0\", stream: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "idem.yaml:3: consumers[0].source.redis_stream:", "the port must be 1..65535");
    parse_bad("consumers:\n  - name: c\n"
              "    source: { redis_stream: \"redis-sentinel://s1,s2\", stream: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[0].source.redis_stream:", "no master name after the sentinels");
    parse_bad("consumers:\n  - name: c\n"
              "    source: { redis_stream: \"http://h\", stream: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[0].source.redis_stream:", "not a redis:// or redis-sentinel:// URL");
    c = parse_ok("consumers:\n  - name: c\n"
                 "    source: { redis_stream: \"redis-sentinel://s1,s2:26380/orders/1\", "
                 "stream: q }\n    key: { json: k }\n    handler: http://h\n");
    config_free(c);
    parse_bad("consumers:\n  - name: c\n    source: { amqp: \"amqp://h\", stream: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[0].source.stream:", "belongs to redis_stream");
    parse_bad("consumers:\n  - name: c\n    source: { amqp: \"amqp://h\" }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[0].source:", "queue is required");
    parse_bad(CONSUMER "    dead_letter: { queue: q }\n", "consumers[0].dead_letter.queue:",
              "the queue itself");
    parse_bad(CONSUMER "    dead_letter: { stream: q2 }\n", "consumers[0].dead_letter:",
              "{ queue: NAME }");
    parse_bad(CONSUMER "    max_attempts: 0\n", "consumers[0].max_attempts:", "out of range");
    parse_bad(CONSUMER "    retry_backoff: []\n", "consumers[0].retry_backoff:", "not 0");
    parse_bad("consumers:\n  - name: c\n    source: { amqp: \"amqp://h\", queue: q }\n"
              "    key: { query: k }\n    handler: http://h\n",
              "consumers[0].key.query:", "a message has no query");
    parse_bad(ROUTE "    key: { message_id: true }\n", "routes[0].key", NULL);
    parse_bad(ROUTE CONSUMER "  - name: r\n    source: { amqp: \"amqp://h\", queue: q }\n"
              "    key: { json: k }\n    handler: http://h\n",
              "consumers[1].name:", "already the name of routes[0]");
    /* A space shared with a route: one key shape, fingerprints that agree. */
    parse_bad(ROUTE "    space: pay\n" CONSUMER "    space: pay\n", "consumers[0].space:",
              "fingerprint: body");
    c = parse_ok(ROUTE "    space: pay\n    fingerprint: none\n" CONSUMER
                 "    space: pay\n    fingerprint: none\n");
    config_free(c);
    parse_bad(ROUTE "    space: pay\n    fingerprint: none\n"
              "consumers:\n  - name: c\n    source: { amqp: \"amqp://h\", queue: q }\n"
              "    key: [{ json: a }, { json: b }]\n    handler: http://h\n    space: pay\n"
              "    fingerprint: none\n",
              "consumers[0].space:", "one key shape");
}

static void test_access_log(void **state)
{
    (void)state;
    struct server_config *c = parse_ok("listen: 127.0.0.1:8080\n");
    assert_null(c->access_to); /* stdout, apart from the daemon's log */
    assert_false(c->access_stderr);
    assert_false(c->access_text);
    assert_int_equal(c->access_subject, SUBJECT_HASH);
    config_free(c);
    c = parse_ok("access_log: off\n");
    assert_string_equal(c->access_to, "");
    config_free(c);
    c = parse_ok("access_log: /var/log/idem/access.log\n");
    assert_string_equal(c->access_to, "/var/log/idem/access.log");
    config_free(c);
    c = parse_ok("access_log: stdout\n");
    assert_null(c->access_to);
    assert_false(c->access_stderr);
    struct server_config *out = round_trip(c, 1); /* -T says stdout */
    assert_false(out->access_stderr);
    config_free(out);
    config_free(c);
    c = parse_ok("access_log: { to: stderr, format: text, subject: off }\n");
    assert_null(c->access_to);
    assert_true(c->access_stderr);
    struct server_config *back = round_trip(c, 1); /* -T says stderr, not the default */
    assert_true(back->access_stderr);
    config_free(back);
    assert_true(c->access_text);
    assert_int_equal(c->access_subject, SUBJECT_OFF);
    config_free(c);
    parse_bad("access_log: { format: xml }\n", "idem.yaml:1: access_log.format:",
              "is not json or text");
    parse_bad("access_log: { subject: sha1 }\n", "access_log.subject:", "hash, plain or off");
    parse_bad("access_log: { too: x }\n", "access_log.too:", NULL);
    parse_bad("access_log: [a]\n", "access_log:", NULL);
    c = parse_ok(ROUTE "    key_required: false\n");
    assert_true(c->routes[0].key_optional);
    config_free(c);
    c = parse_ok(ROUTE);
    assert_false(c->routes[0].key_optional);
    config_free(c);
    parse_bad(ROUTE "    key_required: maybe\n", "routes[0].key_required:", NULL);
    c = parse_ok("log: { level: warn, format: json }\n");
    assert_int_equal(c->log_level, 2);
    assert_true(c->log_json);
    config_free(c);
    c = parse_ok("listen: 127.0.0.1:8080\n");
    assert_int_equal(c->log_level, 1);
    assert_false(c->log_json);
    config_free(c);
    parse_bad("log: { level: loud }\n", "idem.yaml:1: log.level:", "debug, info, warn or error");
    parse_bad("log: text\n", "log:", "expected a mapping");
}

static void test_layers(void **state)
{
    parse_bad(ROUTE "    layers: [token, lock]\n", "idem.yaml:6: routes[0].layers:",
              "record is always on: list it");
    parse_bad(ROUTE "    layers: []\n", "idem.yaml:6: routes[0].layers:",
              "record is always on");
    parse_bad(ROUTE "    layers: [record, cache]\n", "idem.yaml:6: routes[0].layers[1]:",
              "not a layer");
    parse_bad(ROUTE "    layers: [lock, record, lock]\n",
              "idem.yaml:6: routes[0].layers[2]:", "listed twice");
    parse_bad(ROUTE "    layers: record\n", "idem.yaml:6: routes[0].layers:",
              "expected a list");
    parse_bad(ROUTE "    layers: [[record]]\n", "idem.yaml:6: routes[0].layers[0]:",
              "got a list");
    struct server_config *c = parse_ok(ROUTE "    layers: [record, token]\n");
    assert_int_equal(c->routes[0].layer_token, 1);
    assert_int_equal(c->routes[0].layer_lock, 0);
    config_free(c);
}

static void test_replay_headers(void **state)
{
    static const char *const refused[] = {
        "connection", "Keep-Alive", "transfer-encoding", "TE", "trailer", "upgrade",
        "proxy-authenticate", "proxy-authorization",
    };
    char yaml[512];
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(yaml, sizeof yaml, ROUTE "    replay_headers: [location, %s]\n",
                 refused[i]);
        parse_bad(yaml, "idem.yaml:6: routes[0].replay_headers[1]:", "hop-by-hop");
    }
    parse_bad(ROUTE "    replay_headers:\n      - Content-Length\n",
              "idem.yaml:7: routes[0].replay_headers[0]:", "content-length");
    parse_bad(ROUTE "    replay_headers: [location, Location]\n",
              "idem.yaml:6: routes[0].replay_headers[1]:", "listed twice");
    parse_bad(ROUTE "    replay_headers: [\"x y\"]\n",
              "idem.yaml:6: routes[0].replay_headers[0]:", "not a header name");
    parse_bad(ROUTE "    replay_headers: location\n",
              "idem.yaml:6: routes[0].replay_headers:", "expected a list");
    struct server_config *c = parse_ok(ROUTE "    replay_headers:\n");
    assert_int_equal(c->routes[0].replay_header_count, 0);
    config_free(c);
}

static void test_fingerprint(void **state)
{
    parse_bad(ROUTE "    fingerprint: headers\n", "idem.yaml:6: routes[0].fingerprint:",
              "not body, none or a list");
    parse_bad(ROUTE "    fingerprint: []\n", "idem.yaml:6: routes[0].fingerprint:",
              "say none");
    parse_bad(ROUTE "    fingerprint: [a, b, a]\n",
              "idem.yaml:6: routes[0].fingerprint[2]:", "listed twice");
    parse_bad(ROUTE "    fingerprint: [a, .b]\n",
              "idem.yaml:6: routes[0].fingerprint[1]:", "not a JSON field");
    parse_bad(ROUTE "    fingerprint: { body: 1 }\n",
              "idem.yaml:6: routes[0].fingerprint:", "got a mapping");
}

static void test_names(void **state)
{
    char yaml[512];
    char name64[65];
    memset(name64, 'n', 64);
    name64[64] = '\0';
    snprintf(yaml, sizeof yaml, ROUTE "    space: %s\n    token_scene: A.b:c-d_9\n",
             name64);
    struct server_config *c = parse_ok(yaml);
    assert_string_equal(c->routes[0].space, name64);
    assert_string_equal(c->routes[0].token_scene, "A.b:c-d_9");
    config_free(c);

    snprintf(yaml, sizeof yaml, ROUTE "    space: %sn\n", name64);
    parse_bad(yaml, "idem.yaml:6: routes[0].space:", "1 to 64");
    parse_bad(ROUTE "    token_scene: refund/v2\n", "idem.yaml:6: routes[0].token_scene:",
              "not a valid name");
    parse_bad(ROUTE "    space: \"\"\n", "idem.yaml:6: routes[0].space:",
              "not a valid name");
    parse_bad("routes:\n  - name: \"refund route\"\n", "idem.yaml:2: routes[0].name:",
              "not a valid name");
    parse_bad("routes:\n  - match: { path: /x }\n", "idem.yaml:2: routes[0]:",
              "name is required");
    parse_bad("routes:\n  - name: r\n    upstream: http://h\n", "idem.yaml:2: routes[0]:",
              "match is required");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n", "idem.yaml:2: routes[0]:",
              "upstream is required");
    /* Duplicate names. */
    parse_bad(ROUTE "  - name: r\n    match: { path: /y }\n",
              "idem.yaml:6: routes[1].name:", "already the name of routes[0] (line 2)");
    /* One token scene, two spaces: a token spent on a key in one space
     * would let the same key through in the other. */
#define TOKEN_ROUTE(name, path, space)                                           \
    "  - name: " name "\n"                                                       \
    "    match: { path: " path " }\n"                                           \
    "    upstream: http://127.0.0.1:9000\n"                                      \
    "    key: { header: Idempotency-Key }\n"                                     \
    "    layers: [token, record]\n"                                              \
    "    token_scene: pay\n"                                                     \
    "    space: " space "\n"
    parse_bad("routes:\n" TOKEN_ROUTE("a", "/a", "pay") TOKEN_ROUTE("b", "/b", "refund"),
              "idem.yaml:9: routes[1].token_scene: \"pay\", as routes[0] (line 2), whose space "
              "is \"pay\", not \"refund\"",
              "give the two routes one space or different token scenes");
    /* One scene and one space is fine, and so is a route without the token
     * layer. */
    c = parse_ok("routes:\n" TOKEN_ROUTE("a", "/a", "pay") TOKEN_ROUTE("b", "/b", "pay")
                 "  - name: c\n    match: { path: /c }\n    upstream: http://127.0.0.1:9000\n"
                 "    key: { header: Idempotency-Key }\n    token_scene: pay\n"
                 "    space: other\n");
    assert_int_equal(c->route_count, 3);
    config_free(c);
#undef TOKEN_ROUTE
}

static void test_unknown_fields(void **state)
{
    parse_bad(ROUTE "    lese: 30s\n", "idem.yaml:6: routes[0].lese: unknown field",
              "did you mean lease?");
    parse_bad(ROUTE "    timeout: 3s\n", "idem.yaml:6: routes[0].timeout:",
              "unknown field (did you mean wait_timeout or upstream_timeout?)");
    parse_bad("limits:\n  body: 1MiB\n", "idem.yaml:2: limits.body:", "did you mean body_max or");
    parse_bad("listen: :80\nworker: 4\n", "idem.yaml:2: worker: unknown field",
              "did you mean workers?");
    parse_bad("limits:\n  body_max: 1MiB\n  bodymax: 2MiB\n",
              "idem.yaml:3: limits.bodymax: unknown field", "did you mean body_max?");
    parse_bad("storage: { kind: embedded, dir: /tmp }\n",
              "idem.yaml:1: storage.dir: unknown field", "kind, path");
    parse_bad("routes:\n  - name: r\n    match: { path: /x, host: a }\n",
              "idem.yaml:3: routes[0].match.host: unknown field", NULL);
    parse_bad("certs: on\n", "idem.yaml:1: certs: unknown field",
              "known here: listen, admin_listen, api_keys, state_dir, tls_ca, storage, "
              "subject_header, upstream, workers,"
              " event_loops, limits, routes");
    parse_bad("? [a, b]\n: 1\n", "idem.yaml:1:", "plain strings");
    /* Given twice. */
    parse_bad(ROUTE "    lease: 1s\n    lease: 2s\n", "idem.yaml:7: routes[0].lease:",
              "given twice");
    /* A name full of bytes a terminal should not see comes out escaped. */
    char err[512];
    struct server_config *c;
    const char bad[] = "\"\\e[31mred\": 1\n";
    assert_int_equal(config_parse(bad, strlen(bad), "idem.yaml", &c, err, sizeof err), -1);
    assert_null(strchr(err, '\x1b'));
    assert_non_null(strstr(err, "unknown field"));
}

static void test_wrong_types_and_ranges(void **state)
{
    parse_bad("routes: { name: r }\n", "idem.yaml:1: routes:", "expected a list");
    parse_bad("routes: [r]\n", "idem.yaml:1: routes[0]:", "expected a mapping");
    parse_bad("limits: [1, 2]\n", "idem.yaml:1: limits:", "expected a mapping");
    parse_bad("storage: ./idem.db\n", "idem.yaml:1: storage:", "got a single value");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://a\n"
              "    key:\n",
              "idem.yaml:5: routes[0].key:", "got no value");
    parse_bad("routes:\n  - name: r\n    match: { path: /x }\n    upstream: http://a\n"
              "    key: \"\"\n",
              "idem.yaml:5: routes[0].key:", "got a single value");
    parse_bad("storage: { kind: redis }\n", "idem.yaml:1: storage.kind:", "embedded");
    parse_bad("storage: { path: \"\" }\n", "idem.yaml:1: storage.path:", "empty");
    parse_bad("storage: { path: \"file:/var/lib/idem/idem.db\" }\n", "idem.yaml:1: storage.path:",
              "SQLite URI");
    parse_bad("[1, 2]\n", "idem.yaml:1:", "top level must be a mapping");
    parse_bad("hello\n", "idem.yaml:1:", "top level must be a mapping");
    parse_bad("workers: 0\n", "idem.yaml:1: workers:", "1 to 4096");
    parse_bad("workers: 4097\n", "idem.yaml:1: workers:", "1 to 4096");
    parse_bad("workers: -3\n", "idem.yaml:1: workers:", "not a whole number");
    parse_bad("workers: 8.5\n", "idem.yaml:1: workers:", "not a whole number");
    parse_bad("workers: [8]\n", "idem.yaml:1: workers:", "got a list");
    parse_bad("subject_header: \"X Subject\"\n", "idem.yaml:1: subject_header:",
              "not a header name");
    parse_bad(ROUTE "    lease: 0\n", "idem.yaml:6: routes[0].lease:",
              "out of range (must be 1s to 1d)");
    parse_bad("limits:\n  body_max: 17179869184GiB\n", "idem.yaml:2: limits.body_max:",
              "out of range");
    parse_bad("limits:\n  body_max: 99999999999999999999999\n", "idem.yaml:2: limits.body_max:",
              "out of range");
    parse_bad("limits:\n  body_max: 1TB\n", "idem.yaml:2: limits.body_max:", "not a size");
    parse_bad(ROUTE "    lease: 999ms\n", "idem.yaml:6: routes[0].lease:",
              "out of range (must be 1s to 1d)");
    parse_bad(ROUTE "    on_unknown_outcome: keep\n", "idem.yaml:6: routes[0].on_unknown_outcome:",
              "expire");
    struct server_config *held = parse_ok(ROUTE "    on_unknown_outcome: hold\n");
    assert_int_equal(held->routes[0].unknown_hold, 1);
    config_free(held);
    held = parse_ok(ROUTE);
    assert_int_equal(held->routes[0].unknown_hold, 0); /* expire, the default */
    config_free(held);
    parse_bad(ROUTE "    lease: 25h\n", "idem.yaml:6: routes[0].lease:", "out of range");
    parse_bad(ROUTE "    lease: abc\n", "idem.yaml:6: routes[0].lease:",
              "\"abc\" is not a duration (numbers with");
    parse_bad(ROUTE "    lease: 30\n", "idem.yaml:6: routes[0].lease:",
              "\"30\" is read as 30 ms, out of range (must be 1s to 1d): a number without a "
              "unit is milliseconds; did you mean 30s?");
    struct server_config *host = parse_ok(ROUTE "    pass_host: true\n");
    assert_int_equal(host->routes[0].pass_host, 1);
    config_free(host);
    parse_bad(ROUTE "    pass_host: yes\n", "idem.yaml:6: routes[0].pass_host:", "true or false");
    struct server_config *dur = parse_ok(ROUTE "    lease: 1m30s\n    retention: 1.5h\n");
    assert_int_equal(dur->routes[0].lease_ms, 90000);
    assert_int_equal(dur->routes[0].retention_ms, 5400000);
    config_free(dur);
    parse_bad(ROUTE "    lease: -5s\n", "idem.yaml:6: routes[0].lease:", "negative");
    parse_bad(ROUTE "    lease:\n", "idem.yaml:6: routes[0].lease:", "no value");
    parse_bad(ROUTE "    lease: [30s]\n", "idem.yaml:6: routes[0].lease:", "got a list");
    parse_bad(ROUTE "    wait_timeout: 11m\n", "idem.yaml:6: routes[0].wait_timeout:",
              "must be 1ms to 10m");
    parse_bad(ROUTE "    retention: 3651d\n", "idem.yaml:6: routes[0].retention:",
              "out of range");
    parse_bad(ROUTE "    upstream_timeout: 2h\n",
              "idem.yaml:6: routes[0].upstream_timeout:", "out of range");
    parse_bad(ROUTE "    scope: tenant\n", "idem.yaml:6: routes[0].scope:",
              "not global or subject");
    parse_bad(ROUTE "    in_flight: queue\n", "idem.yaml:6: routes[0].in_flight:",
              "not reject or wait");
    parse_bad(ROUTE "    on_upstream_5xx: retry\n",
              "idem.yaml:6: routes[0].on_upstream_5xx:", "not release or store");
        parse_bad(ROUTE "    replay_headers: [content_length]\n",
              "idem.yaml:6: routes[0].replay_headers[0]:", "computed for each reply");
    parse_bad(ROUTE "    replay_headers: [proxy-connection]\n",
              "idem.yaml:6: routes[0].replay_headers[0]:", "hop-by-hop");
    parse_bad(ROUTE "    replay_headers: [keep_alive]\n",
              "idem.yaml:6: routes[0].replay_headers[0]:", "hop-by-hop");
parse_bad("limits:\n  body_max: lots\n", "idem.yaml:2: limits.body_max:",
              "not a size");
    parse_bad("limits:\n  body_max: 2GiB\n", "idem.yaml:2: limits.body_max:",
              "must be 1B to 1GiB");
    /* What the store can keep, status and headers included: --check says
     * so, rather than the daemon at its start. */
    parse_bad("limits:\n  response_max: 64MiB\n", "idem.yaml:2: limits.response_max:",
              "must be 1B to 63MiB");
    parse_bad("limits:\n  send_timeout: 0\n", "idem.yaml:2: limits.send_timeout:",
              "out of range");
    parse_bad("limits:\n  request_line_max: 100\n",
              "idem.yaml:2: limits.request_line_max:", "256B to 1MiB");
    parse_bad("limits:\n  header_count_max: 1k\n",
              "idem.yaml:2: limits.header_count_max:", "not a whole number");
    parse_bad("limits:\n  idle_timeout: 0\n", "idem.yaml:2: limits.idle_timeout:",
              "out of range");
    parse_bad("limits:\n  shutdown_timeout: -1s\n",
              "idem.yaml:2: limits.shutdown_timeout:", "negative");
    parse_bad("limits:\n  in_flight_max: 0\n", "idem.yaml:2: limits.in_flight_max:",
              "1 to 1000000");
    parse_bad("limits:\n  admin_connections_max: 100001\n",
              "idem.yaml:2: limits.admin_connections_max:", "1 to 100000");
    struct server_config *c = parse_ok("limits:\n  shutdown_timeout: 0\n");
    assert_int_equal(c->limits.shutdown_timeout_ms, 0);
    config_free(c);
    parse_bad("limits:\n  tokens_per_scene: 0\n", "idem.yaml:2: limits.tokens_per_scene:",
              "1 to 100000");
    c = parse_ok("limits:\n  replay_cache: 0\n");
    assert_int_equal(c->limits.replay_cache, 0);
    config_free(c);
    parse_bad("limits:\n  replay_cache: 2GiB\n", "idem.yaml:2: limits.replay_cache:",
              "0B to 1GiB");
}

static void test_syntax_errors(void **state)
{
    parse_bad("listen: :80\nroutes:\n  - name: r\n   match: x\n",
              "idem.yaml:4:", "YAML syntax:");
    parse_bad("limits: { body_max: 1MiB\n", "idem.yaml:2:", "YAML syntax:");
    parse_bad("routes:\n\t- name: x\n", "idem.yaml:2:1: YAML syntax:",
              "a tab; YAML indents with spaces only");
    parse_bad("listen: \"unterminated\n", "YAML syntax:", "quoted scalar");
    parse_bad("a: b: c\n", "idem.yaml:1:", "YAML syntax:");
    parse_bad("\tlisten: :80\n", "idem.yaml:1:", "YAML syntax:");
    parse_bad("listen: :80\n---\nworkers: 4\n", "idem.yaml:2:", "second YAML document");
    parse_bad("---\n---\n", "idem.yaml:2:", "second YAML document");
    parse_bad("listen: :80\n...\n]\n", "idem.yaml:3:", "YAML syntax:");
    parse_bad("x: *nowhere\n", "idem.yaml:1: *nowhere:", "aliases");
    /* Invalid UTF-8 is the reader's error; it still gets a line. */
    parse_bad("listen: :80\nworkers: \xff\n", "idem.yaml:2:", "YAML syntax:");
    /* A NUL byte, raw or escaped. */
    parse_bad_len("listen: :80\n\0workers: 1\n", 24, "idem.yaml:2:", "YAML syntax");
    parse_bad("storage: { path: \"a\\0b\" }\n", "idem.yaml:1: storage.path:", "NUL");
}

static void test_aliases(void **state)
{
    parse_bad("x: &a 1\n", "idem.yaml:1: x:", "unknown field");
    parse_bad("limits: &l { body_max: 1MiB }\nroutes:\n  - name: r\n    match: *l\n",
              "idem.yaml:4: *l:", "aliases are not supported");
    parse_bad(ROUTE "    layers: &l [record]\n  - name: s\n    layers: *l\n",
              "idem.yaml:8: *l:", "aliases are not supported");
    /* An anchor that refers to itself would make a cycle. */
    parse_bad("routes: &r [*r]\n", "idem.yaml:1: *r:", "aliases");
    parse_bad("&m {a: *m}\n", "idem.yaml:1: *m:", "aliases");
    /* An anchor alone is harmless. */
    struct server_config *c = parse_ok("listen: &l :8081\n");
    assert_int_equal(c->listen_port, 8081);
    config_free(c);

    /* Billion laughs: 9^30 references in 1.5 KB, refused at the first alias. */
    char bomb[2048];
    size_t n = (size_t)snprintf(bomb, sizeof bomb, "a0: &a0 [lol]\n");
    for (int i = 1; i <= 30; i++) {
        n += (size_t)snprintf(bomb + n, sizeof bomb - n, "a%d: &a%d [", i, i);
        for (int j = 0; j < 9; j++)
            n += (size_t)snprintf(bomb + n, sizeof bomb - n, "%s*a%d", j ? "," : "",
                                  i - 1);
        n += (size_t)snprintf(bomb + n, sizeof bomb - n, "]\n");
    }
    assert_true(n < sizeof bomb);
    parse_bad(bomb, "idem.yaml:2: *a0:", "aliases");
}

static void test_bounds(void **state)
{
    /* 1001 routes. */
    size_t cap = 1001 * 16 + 64, n = 0;
    char *y = malloc(cap);
    assert_non_null(y);
    n += (size_t)snprintf(y + n, cap - n, "routes:\n");
    for (int i = 0; i < 1001; i++)
        n += (size_t)snprintf(y + n, cap - n, "  - {}\n");
    parse_bad(y, "idem.yaml:2: routes:", "at most 1000");
    free(y);

    /* 1000 routes are fine. */
    cap = 1000 * 128 + 64;
    n = 0;
    y = malloc(cap);
    assert_non_null(y);
    n += (size_t)snprintf(y + n, cap - n, "routes:\n");
    for (int i = 0; i < 1000; i++)
        n += (size_t)snprintf(y + n, cap - n,
                              "  - {name: r%d, match: {path: /r%d}, upstream: "
                              "\"http://h\", key: {query: id}}\n", i, i);
    struct server_config *c = parse_ok(y);
    assert_int_equal(c->route_count, 1000);
    assert_string_equal(c->routes[999].path, "/r999");
    config_free(c);
    free(y);

    /* More than 1 MiB of input, even of comments. */
    size_t big = 1024 * 1024 + 1;
    y = malloc(big + 1);
    assert_non_null(y);
    memset(y, '#', big);
    y[big] = '\0';
    parse_bad(y, "idem.yaml:", "at most 1 MiB");
    free(y);

    /* Deep nesting: libyaml's scanner is quadratic in the depth, so a MiB of
     * "[" must be cut short, not scanned. */
    cap = 1024 * 1024;
    y = malloc(cap + 1);
    assert_non_null(y);
    n = (size_t)snprintf(y, 16, "routes: ");
    while (n < cap)
        y[n++] = '[';
    y[n] = '\0';
    parse_bad(y, "idem.yaml:1:", "nested more than 32 levels");
    free(y);
    parse_bad("a:\n b:\n  c:\n   d:\n    e:\n     f:\n      g:\n       h:\n"
              "        i:\n         j:\n          k:\n           l:\n"
              "            m:\n             n:\n              o:\n"
              "               p:\n                q:\n                 r:\n"
              "                  s:\n                   t:\n"
              "                    u:\n                     v:\n"
              "                      w:\n                       x:\n"
              "                        y:\n                         z:\n"
              "                          A:\n                           B:\n"
              "                            C:\n                             D:\n"
              "                              E:\n                               F:\n"
              "                                G: 1\n",
              "idem.yaml:33:", "nested more than 32");

    /* Too many values, each cheap to write. */
    cap = 200001 * 2 + 16;
    y = malloc(cap);
    assert_non_null(y);
    n = (size_t)snprintf(y, 16, "a: [");
    for (int i = 0; i < 200001; i++) {
        y[n++] = 'x';
        y[n++] = ',';
    }
    y[n - 1] = ']';
    y[n] = '\0';
    parse_bad(y, "idem.yaml:1:", "more than 200000 values");
    free(y);
}

static void test_error_buffer(void **state)
{
    struct server_config *c = (struct server_config *)1;
    char small[8];
    const char *yaml = ROUTE "    lese: 1s\n";
    assert_int_equal(config_parse(yaml, strlen(yaml), "idem.yaml", &c, small, sizeof small), -1);
    assert_null(c);
    assert_string_equal(small, "idem.ya");
    assert_int_equal(config_parse(yaml, strlen(yaml), NULL, &c, NULL, 0), -1);
    char err[256];
    assert_int_equal(config_parse("workers: 0", 10, NULL, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "config:1: workers:"));
    assert_int_equal(config_parse(NULL, 0, NULL, &c, err, sizeof err), 0);
    assert_non_null(c);
    config_free(c);
}

static void test_load(void **state)
{
    struct server_config *c = (struct server_config *)1;
    char err[512];
    char *dir = test_mkdtemp();
    char path[4096];

    snprintf(path, sizeof path, "%s/missing.yaml", dir);
    assert_int_equal(config_load(path, &c, err, sizeof err), -1);
    assert_null(c);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "No such file"));

    snprintf(path, sizeof path, "%s/idem.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(full_example, f);
    fclose(f);
    assert_int_equal(config_load(path, &c, err, sizeof err), 0);
    assert_string_equal(c->path, path);
    assert_int_equal(c->route_count, 1);
    config_free(c);

    f = fopen(path, "w");
    assert_non_null(f);
    fputs(ROUTE "    lease: 0s\n", f);
    fclose(f);
    assert_int_equal(config_load(path, &c, err, sizeof err), -1);
    char want[4200];
    snprintf(want, sizeof want, "%s:6: routes[0].lease:", path);
    if (!strstr(err, want))
        fail_msg("\"%s\" lacks \"%s\"", err, want);

    f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 1100; i++)
        fprintf(f, "# %1020d\n", i);
    fclose(f);
    assert_int_equal(config_load(path, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, "larger than 1 MiB"));

    assert_int_equal(config_load(dir, &c, err, sizeof err), -1);
    assert_non_null(strstr(err, dir));
    test_rmdir(dir);
}

/* The example shipped in examples/ parses. The source tree is found from this
 * file's own path. */
/* The distributed store: URLs, secrets from the environment or a file, and
 * the URL in log lines without its password. */
static void test_distributed_storage(void **state)
{
    (void)state;
    struct server_config *c = parse_ok(
        "storage:\n"
        "  kind: distributed\n"
        "  redis: redis://10.0.0.5:6380/2\n"
        "  postgres: postgresql://idem@10.0.0.6/idem?sslmode=require\n"
        "  pool: 16\n"
        "  timeout: 500ms\n" ROUTE "    on_redis_down: reject\n");
    assert_string_equal(c->storage_kind, "distributed");
    assert_string_equal(c->redis_url, "redis://10.0.0.5:6380/2");
    assert_string_equal(c->postgres_url, "postgresql://idem@10.0.0.6/idem?sslmode=require");
    assert_int_equal(c->storage_pool, 16);
    assert_int_equal(c->storage_timeout_ms, 500);
    assert_int_equal(c->routes[0].on_redis_down_reject, 1);
    char where[1100];
    config_storage_where(c, where, sizeof where);
    assert_string_equal(where, "redis://10.0.0.5:6380/2 + postgresql://10.0.0.6/idem");
    config_free(c);

    /* Defaults: skip, pool 8, timeout 2 s. */
    c = parse_ok("storage: { kind: distributed, redis: redis://r, postgres: postgresql://p/db }\n"
                 ROUTE);
    assert_int_equal(c->routes[0].on_redis_down_reject, 0);
    assert_int_equal(c->storage_pool, 8);
    assert_int_equal(c->storage_timeout_ms, 2000);
    config_free(c);

    /* A password never sits in the file; from the environment it is taken
     * whole, and kept out of log lines. */
    parse_bad("storage:\n  kind: distributed\n  redis: redis://:hunter2@r:6379/0\n"
              "  postgres: postgresql://p/db\n",
              "idem.yaml:3: storage.redis", "{ env: NAME }");
    parse_bad("storage:\n  kind: distributed\n  redis: redis://r\n"
              "  postgres: host=p password=hunter2 dbname=idem\n",
              "idem.yaml:4: storage.postgres", "password");
    setenv("IDEM_TEST_PG_URL", "postgresql://idem:hunter2@db.internal:5433/idem", 1);
    c = parse_ok("storage:\n  kind: distributed\n  redis: redis://r\n"
                 "  postgres: { env: IDEM_TEST_PG_URL }\n");
    assert_string_equal(c->postgres_url, "postgresql://idem:hunter2@db.internal:5433/idem");
    config_storage_where(c, where, sizeof where);
    assert_null(strstr(where, "hunter2"));
    assert_non_null(strstr(where, "postgresql://db.internal:5433/idem"));
    config_free(c);
    unsetenv("IDEM_TEST_PG_URL");
    parse_bad("storage:\n  kind: distributed\n  redis: redis://r\n"
              "  postgres: { env: IDEM_TEST_PG_URL }\n",
              "idem.yaml:4: storage.postgres.env", "IDEM_TEST_PG_URL");
    /* What libpq would refuse at the store's start is refused at its line
     * (so --check sees it), with libpq's reason; never when that could
     * quote a password. */
    parse_bad("storage:\n  kind: distributed\n  redis: redis://r\n"
              "  postgres: postgresql://idem@db/idem?sslmod=require\n",
              "idem.yaml:4: storage.postgres: not a libpq connection URI",
              "invalid URI query parameter: \"sslmod\"");
    parse_bad("storage:\n  kind: distributed\n  redis: redis://r\n"
              "  postgres: host=db dbnme=idem\n",
              "idem.yaml:4: storage.postgres", "invalid connection option \"dbnme\"");
    /* From the environment: refused without libpq's reason, which quotes
     * (here it would quote what may be a password put there by mistake). */
    setenv("IDEM_TEST_PG_URL", "hunter2-not-a-url", 1);
    struct server_config *pc = (struct server_config *)1;
    char perr[512] = "";
    static const char pg_env[] = "storage:\n  kind: distributed\n  redis: redis://r\n"
                                 "  postgres: { env: IDEM_TEST_PG_URL }\n";
    assert_int_equal(config_parse(pg_env, strlen(pg_env), "idem.yaml", &pc, perr, sizeof perr),
                     -1);
    assert_non_null(strstr(perr, "storage.postgres: not a libpq connection URI"));
    assert_null(strstr(perr, "hun"));
    unsetenv("IDEM_TEST_PG_URL");

    /* A password holding '/', '?', '#' or '@' unescaped still counts as one,
     * and never shows. */
    static const char *const tricky[] = {
        "redis://:Top/Secret@127.0.0.1:6379/0", "redis://:Top?Secret@127.0.0.1:6379/0",
        "redis://:Top#Secret@127.0.0.1:6379/0", "redis://u:Top@Secret@127.0.0.1:6379/0",
        "postgresql://idem:S3cr/etPW@db:5432/idem", "postgresql://idem@db/idem?password=Secret",
        "postgresql://idem@db/idem?sslmode=require&sslpassword=Secret",
        "host=db sslpassword = Secret dbname=idem",
    };
    for (size_t i = 0; i < sizeof tricky / sizeof tricky[0]; i++) {
        char y[512];
        assert_true(config_url_has_password(tricky[i]));
        snprintf(y, sizeof y, "storage:\n  kind: distributed\n  redis: \"%s\"\n"
                 "  postgres: postgresql://p/db\n", tricky[i]);
        parse_bad(y, "storage.redis", "{ env: NAME }");
        setenv("IDEM_TEST_TRICKY", tricky[i], 1);
        int redis = !strncmp(tricky[i], "redis", 5);
        const char *from_env = redis ? "storage:\n  kind: distributed\n"
                                       "  redis: { env: IDEM_TEST_TRICKY }\n"
                                       "  postgres: postgresql://p/db\n"
                                     : "storage:\n  kind: distributed\n"
                                       "  redis: redis://r:6379/0\n"
                                       "  postgres: { env: IDEM_TEST_TRICKY }\n";
        char err[512] = "";
        if (config_parse(from_env, strlen(from_env), "idem.yaml", &c, err, sizeof err) != 0) {
            /* An unescaped '/', '?' or '#' ends the host part: refused at
             * its line, as the store would refuse it, and not shown. */
            assert_non_null(strstr(err, redis ? "idem.yaml:3: storage.redis: "
                                              : "idem.yaml:4: storage.postgres: "));
            if (strstr(err, "Secret") || strstr(err, "Top") || strstr(err, "S3cr"))
                fail_msg("%s shows in \"%s\"", tricky[i], err);
            continue;
        }
        config_storage_where(c, where, sizeof where);
        if (strstr(where, "Secret") || strstr(where, "S3cr") || strstr(where, "Top"))
            fail_msg("%s shows as %s", tricky[i], where);
        config_free(c);
    }
    unsetenv("IDEM_TEST_TRICKY");
    /* storage.redis is read as the store will read it: --check refuses
     * what the start would, at its line. */
    parse_bad("storage:\n  kind: distributed\n  redis: redis://r:0/0\n"
              "  postgres: postgresql://p/db\n",
              "idem.yaml:3: storage.redis: ", "the port must be 1..65535");
    parse_bad("storage:\n  kind: distributed\n  redis: rediss://r/0\n"
              "  postgres: postgresql://p/db\n",
              "idem.yaml:3: storage.redis: ", "not a redis:// or redis-sentinel:// URL");
    c = parse_ok("storage:\n  kind: distributed\n"
                 "  redis: redis-sentinel://10.0.0.7,10.0.0.8/idem/2\n"
                 "  postgres: postgresql://p/db\n");
    config_free(c);
    assert_false(config_url_has_password("redis://cache:6379/0"));
    assert_false(config_url_has_password("postgresql://idem@db/idem?sslmode=require"));

    /* From a file: its first line. */
    char *dir = test_mkdtemp(), path[4200], yaml[5000];
    snprintf(path, sizeof path, "%s/redis-url", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("redis://:hunter2@cache:6379/1\n", f);
    fclose(f);
    snprintf(yaml, sizeof yaml, "storage:\n  kind: distributed\n  redis: { file: %s }\n"
             "  postgres: postgresql://p/db\n", path);
    c = parse_ok(yaml);
    assert_string_equal(c->redis_url, "redis://:hunter2@cache:6379/1");
    config_storage_where(c, where, sizeof where);
    assert_null(strstr(where, "hunter2"));
    config_free(c);
    snprintf(yaml, sizeof yaml, "storage:\n  kind: distributed\n  redis: { file: %s }\n"
             "  postgres: postgresql://p/db\n", dir);
    parse_bad(yaml, "storage.redis.file", "not a regular file");
    unlink(path);
    snprintf(yaml, sizeof yaml, "storage:\n  kind: distributed\n  redis: { file: %s }\n"
             "  postgres: postgresql://p/db\n", path);
    parse_bad(yaml, "storage.redis.file", "No such file");
    test_rmdir(dir);

    /* What belongs to one kind is refused in the other. */
    parse_bad("storage: { kind: embedded, redis: redis://r }\n", "storage.redis",
              "only for kind: distributed");
    parse_bad("storage: { kind: distributed, path: ./x.db, redis: redis://r, "
              "postgres: postgresql://p/db }\n", "storage.path", "only for kind: embedded");
    parse_bad("storage: { kind: distributed, postgres: postgresql://p/db }\n",
              "storage.redis", "missing");
    parse_bad("storage: { kind: distributed, redis: redis://r }\n", "storage.postgres",
              "missing");
    parse_bad("storage: { kind: cluster }\n", "storage.kind", "distributed");
    parse_bad("storage:\n  kind: distributed\n  redis: { env: A, file: B }\n"
              "  postgres: postgresql://p/db\n", "storage.redis", "exactly one");
    parse_bad("storage: { kind: distributed, redis: redis://r, postgres: postgresql://p/db, "
              "pool: 0 }\n", "storage.pool", NULL);
    parse_bad(ROUTE "    on_redis_down: ignore\n", "idem.yaml:6: routes[0].on_redis_down",
              "skip or reject");
}

static void test_shipped_example(void **state)
{
    struct server_config *c = NULL;
    char err[512], path[4096];
    const char *file = __FILE__, *at = strstr(file, "tests/server/");
    if (!at)
        skip();
    snprintf(path, sizeof path, "%.*sexamples/idem.yaml", (int)(at - file), file);
    if (config_load(path, &c, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(c->route_count, 3);
    assert_string_equal(c->routes[0].space, "refund");
    assert_int_equal(c->routes[0].scope_subject, 1);
    assert_int_equal(c->routes[0].in_flight_wait, 1);
    assert_string_equal(c->routes[1].space, "payment");
    assert_string_equal(c->routes[2].space, "payment");
    config_free(c);

    snprintf(path, sizeof path, "%.*sexamples/idem-distributed.yaml", (int)(at - file), file);
    setenv("IDEM_POSTGRES_URL", "postgresql://idem:pw@db.internal/idem", 1);
    setenv("IDEM_OPS_KEY", "0123456789abcdef0123456789abcdef", 1);
    if (config_load(path, &c, err, sizeof err) != 0)
        fail_msg("%s", err);
    unsetenv("IDEM_POSTGRES_URL");
    unsetenv("IDEM_OPS_KEY");
    assert_string_equal(c->storage_kind, "distributed");
    assert_null(c->admin_host);
    assert_int_equal(c->api_key_count, 1);
    assert_int_equal(config_finish(c, err, sizeof err), 0);
    assert_string_equal(c->admin_unix, "/var/lib/idem/idem-admin.sock");
    assert_string_equal(c->postgres_url, "postgresql://idem:pw@db.internal/idem");
    assert_int_equal(c->route_count, 3);
    assert_int_equal(c->routes[0].on_redis_down_reject, 1);
    assert_int_equal(c->routes[1].on_redis_down_reject, 0);
    config_free(c);
}

/* ------------------------------------------------------------------------- */
/* Printed back (idem serve -T). */

/* What printing must never show: the values the secrets of
 * rich_config() read. */
static const char *const secret_values[] = {
    "s3cr3t-VALUE-xyz-ops-key-0001",   "s3cr3t-VALUE-xyz-grafana-key-02",
    "s3cr3t-VALUE-xyz-redis",          "s3cr3t-VALUE-xyz-postgres",
    "s3cr3t-VALUE-xyz-hmac-0000001",   "s3cr3t-VALUE-xyz-hmac-file-0002",
    "s3cr3t-VALUE-apiv3-0123456789abc", "s3cr3t-VALUE-xyz-amqp",
    "s3cr3t-VALUE-xyz-stream",         "s3cr3t-VALUE-xyz-github-000003",
    "whsec_czNjcjN0LVZBTFVFLXh5ei1zdw==",
};

static void write_text(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Every field of every section, none at its default where it has one, the
 * secrets from the environment and from files in dir (made here, with the
 * TLS and PEM files the parser reads). */
static struct server_config *rich_config(const char *dir)
{
    static const char *const env[][2] = {
        {"IDEM_DUMP_OPS", "s3cr3t-VALUE-xyz-ops-key-0001"},
        {"IDEM_DUMP_REDIS", "redis://idem:s3cr3t-VALUE-xyz-redis@127.0.0.1:6379/0"},
        {"IDEM_DUMP_HMAC", "s3cr3t-VALUE-xyz-hmac-0000001"},
        {"IDEM_DUMP_APIV3", "s3cr3t-VALUE-apiv3-0123456789abc"},
        {"IDEM_DUMP_AMQP", "amqp://app:s3cr3t-VALUE-xyz-amqp@10.0.0.5:5672/%2f"},
        {"IDEM_DUMP_GITHUB", "s3cr3t-VALUE-xyz-github-000003"},
        {"IDEM_DUMP_WHSEC", "whsec_czNjcjN0LVZBTFVFLXh5ei1zdw=="},
    };
    for (size_t i = 0; i < sizeof env / sizeof env[0]; i++)
        setenv(env[i][0], env[i][1], 1);
    write_text(dir, "grafana.key", "s3cr3t-VALUE-xyz-grafana-key-02\n");
    write_text(dir, "pg.url", "postgresql://idem:s3cr3t-VALUE-xyz-postgres@db:5432/idem\n");
    write_text(dir, "hmac.key", "s3cr3t-VALUE-xyz-hmac-file-0002\n");
    write_text(dir, "stream.url", "redis://:s3cr3t-VALUE-xyz-stream@127.0.0.1:6380/2\n");
    write_text(dir, "cert.pem", "not read by the parser\n");
    write_text(dir, "key.pem", "not read by the parser\n");
    write_text(dir, "ca.pem", "not read by the parser\n");
    char pem[512];
    snprintf(pem, sizeof pem, "%s/provider.pem", dir);
    EVP_PKEY *k = EVP_RSA_gen(2048);
    FILE *f = fopen(pem, "w");
    assert_non_null(f);
    PEM_write_PUBKEY(f, k);
    fclose(f);
    EVP_PKEY_free(k);

    static const char yaml[] =
        "listen:\n"
        "  address: 0.0.0.0:8443\n"
        "  tls: { cert: {D}/cert.pem, key: {D}/key.pem }\n"
        "admin_listen:\n"
        "  address: \"[::1]:9443\"\n"
        "  allow_plaintext: true\n"
        "  tls: { cert: {D}/cert.pem, key: {D}/key.pem, client_ca: {D}/ca.pem }\n"
        "state_dir: {D}\n"
        "api_keys:\n"
        "  - { name: ops, scope: write, env: IDEM_DUMP_OPS }\n"
        "  - { name: grafana, scope: read, file: {D}/grafana.key }\n"
        "tls_ca: {D}/ca.pem\n"
        "storage:\n"
        "  kind: distributed\n"
        "  redis: { env: IDEM_DUMP_REDIS }\n"
        "  postgres: { file: {D}/pg.url }\n"
        "  pool: 12\n"
        "  timeout: 2500ms\n"
        "  require_synchronous_replication: true\n"
        "subject_header: \"X-!#$%&'*+.^_`|~\"\n"
        "upstream: HTTPS://Backend.example:8443/base/\n"
        "workers: 8\n"
        "event_loops: 3\n"
        "access_log: { to: \"{D}/access #1: 'log'.txt\", format: text, subject: plain }\n"
        "log: { level: warn, format: json }\n"
        "limits:\n"
        "  request_line_max: 4KiB\n  header_count_max: 50\n  header_bytes_max: 16KiB\n"
        "  body_max: 1536\n  response_max: 2MiB\n  connections_max: 500\n"
        "  connections_per_peer: 50\n  admin_connections_max: 8\n"
        "  requests_per_connection: 100\n  idle_timeout: 1h30m\n  header_timeout: 1.5s\n"
        "  body_timeout: 45s\n  send_timeout: 2m\n  in_flight_max: 99\n"
        "  in_flight_per_peer: 9\n  shutdown_timeout: 0\n  replay_cache: 0\n"
        "  tokens_per_scene: 4\n  token_ttl_max: 2d\n  token_rate_subject: 3\n"
        "  token_rate_peer: 30\n"
        "problems:\n"
        "  token_spent: { title: \"请刷新后重试\", detail: \"a \\\"quoted\\\" \\\\ detail: # no "
        "comment\" }\n"
        "  key_missing: { detail: \"\\x80\\N\\L\\P\\uFEFF\\u00e9 end\" }\n"
        "routes:\n"
        "  - name: \"null\"\n"
        "    match: { method: post, path: \"/orders/*/refunds/*\" }\n"
        "    upstream: http://127.0.0.1:9000/api\n"
        "    key: [{ header: Idempotency-Key }, { json: order.id }, { query: \"id:\\\"x\" }, "
        "{ path_segment: 2 }, { form: out_trade_no }]\n"
        "    space: \"1.5e3:-\"\n"
        "    scope: subject\n"
        "    layers: [record, lock, token]\n"
        "    token_scene: \"true\"\n"
        "    in_flight: wait\n"
        "    wait_timeout: 1500ms\n"
        "    lease: 45s\n"
        "    retention: 36h\n"
        "    tombstone: 7d\n"
        "    upstream_timeout: 1m30s\n"
        "    replay_headers: [Content-Type, X-Request-Id]\n"
        "    fingerprint: [amount, order.id]\n"
        "    store_statuses: [2xx, 409, 422, 5xx]\n"
        "    on_redis_down: reject\n"
        "    on_unknown_outcome: hold\n"
        "    key_required: false\n"
        "    pass_host: true\n"
        "    signature: { scheme: hmac_sha256, header: X-Sig, encoding: base64, "
        "prefix: \"sha256=\", secrets: [{ env: IDEM_DUMP_HMAC }, { file: {D}/hmac.key }] }\n"
        "    states:\n"
        "      field: { header: X-State }\n"
        "      initial: CREATED\n"
        "      transitions: { CREATED: [PROCESSING, SUCCESS], PROCESSING: [SUCCESS], "
        "CREATED: [FAILED, SUCCESS] }\n"
        "    problems: { token_spent: { title: t }, key_reused: { detail: d } }\n"
        "  - name: wechat\n"
        "    match: { path: /wx }\n"
        "    upstream: \"http://[::1]:9001\"\n"
        "    key: { wechatpay_resource: out_refund_no }\n"
        "    fingerprint: none\n"
        "    replay_headers: []\n"
        "    on_upstream_5xx: store\n"
        "    signature: { scheme: wechatpay_v3, tolerance: 2m, public_keys: [{ file: "
        "{D}/provider.pem, serial: S-1 }, { file: {D}/provider.pem, serial: \"S 2\" }], "
        "apiv3_key: { env: IDEM_DUMP_APIV3 } }\n"
        "    on_unknown_outcome: resolve\n"
        "    resolve: { url: \"http://localhost:9000/r/{space}/{key}\", after: 2s, "
        "backoff: [1s, 2s], give_up: 2h, executed: [200, 201], not_executed: [4xx] }\n"
        "  - name: alipay\n"
        "    match: { method: POST, path: /ali }\n"
        "    upstream: http://127.0.0.1:9000\n"
        "    key: { form: out_trade_no }\n"
        "    signature: { scheme: alipay_rsa2, public_keys: [{ file: {D}/provider.pem }] }\n"
        "  - name: stripe\n"
        "    match: { path: /stripe }\n"
        "    upstream: http://127.0.0.1:9000\n"
        "    key: { header: Idempotency-Key }\n"
        "    layers: [lock, record]\n"
        "    signature: { scheme: standard_webhooks, secrets: [{ env: IDEM_DUMP_WHSEC }] }\n"
        "consumers:\n"
        "  - name: c-amqp\n"
        "    source: { amqp: { env: IDEM_DUMP_AMQP }, queue: \"refund.result#1\", prefetch: 16 }\n"
        "    handler: http://127.0.0.1:9000/mq\n"
        "    key: { message_id: true }\n"
        "    space: c-space\n"
        "    lease: 1m\n"
        "    retention: 2d\n"
        "    tombstone: 1h\n"
        "    replay_headers: [x-a]\n"
        "    fingerprint: [a]\n"
        "    handler_timeout: 20s\n"
        "    max_attempts: 3\n"
        "    retry_backoff: [100ms, 2s]\n"
        "    dead_letter: { queue: dlq }\n"
        "    signature: { scheme: github, secrets: [{ env: IDEM_DUMP_GITHUB }] }\n"
        "    states:\n"
        "      field: { message_id: true }\n"
        "      initial: A\n"
        "      transitions: { A: [B] }\n"
        "  - name: c-redis\n"
        "    source: { redis_stream: { file: {D}/stream.url }, stream: st, group: g1, "
        "body_field: payload, prefetch: 8 }\n"
        "    handler: https://h.example/x\n"
        "    key: [{ header: X-Biz }, { json: id }, { form: f }]\n"
        "    on_unknown_outcome: resolve\n"
        "    resolve: { url: \"http://127.0.0.1:9000/c/{key}\", executed: [2xx], "
        "not_executed: [404] }\n"
        "  - name: c-guest\n"
        "    source: { amqp: \"amqp://guest:guest@127.0.0.1:5672/%2f\", queue: q3 }\n"
        "    handler: http://127.0.0.1:9000\n"
        "    key: { wechatpay_resource: id }\n"
        "    on_unknown_outcome: hold\n"
        "    signature: { scheme: wechatpay_v3, public_keys: [{ file: {D}/provider.pem, "
        "serial: S-3 }], apiv3_key: { env: IDEM_DUMP_APIV3 } }\n";
    /* {D} is dir. */
    size_t n = 0, dl = strlen(dir);
    char *text = malloc(sizeof yaml + 64 * dl);
    assert_non_null(text);
    for (const char *p = yaml; *p; p++) {
        if (!strncmp(p, "{D}", 3)) {
            memcpy(text + n, dir, dl);
            n += dl;
            p += 2;
        } else {
            text[n++] = *p;
        }
    }
    text[n] = '\0';
    struct server_config *c = parse_ok(text);
    free(text);
    return c;
}

/* Two strings either of which may be NULL. */
#define SAME_STR(x, y) assert_true((x) ? (y) && !strcmp((x), (y)) : !(y))
/* Field f of a and b. */
#define SAME(f) SAME_STR(a->f, b->f)

static void assert_same_problems(const struct problem_text *a, size_t an,
                                 const struct problem_text *b, size_t bn)
{
    assert_int_equal(an, bn);
    for (size_t i = 0; i < an; i++) {
        SAME_STR(a[i].type, b[i].type);
        SAME_STR(a[i].title, b[i].title);
        SAME_STR(a[i].detail, b[i].detail);
    }
}

/* The fields a configuration read back from its printed form must have as
 * the original has them: what the daemon runs with. */
static void assert_same_route(const struct route *a, const struct route *b)
{
    assert_string_equal(a->name, b->name);
    SAME(method);
    assert_string_equal(a->path, b->path);
    assert_int_equal(a->prefix, b->prefix);
    SAME(folded_path);
    assert_string_equal(a->upstream.host, b->upstream.host);
    assert_int_equal(a->upstream.port, b->upstream.port);
    assert_int_equal(a->upstream.tls, b->upstream.tls);
    assert_string_equal(a->upstream.base_path, b->upstream.base_path);
    assert_int_equal(a->key_parts, b->key_parts);
    for (size_t i = 0; i < a->key_parts; i++) {
        assert_int_equal(a->key[i].source, b->key[i].source);
        assert_int_equal(a->key[i].segment, b->key[i].segment);
        SAME_STR(a->key[i].name, b->key[i].name);
    }
    assert_string_equal(a->space, b->space);
    assert_string_equal(a->token_scene, b->token_scene);
    assert_int_equal(a->scope_subject, b->scope_subject);
    assert_int_equal(a->layer_token, b->layer_token);
    assert_int_equal(a->layer_lock, b->layer_lock);
    assert_int_equal(a->in_flight_wait, b->in_flight_wait);
    assert_int_equal(a->wait_timeout_ms, b->wait_timeout_ms);
    assert_int_equal(a->lease_ms, b->lease_ms);
    assert_int_equal(a->retention_ms, b->retention_ms);
    assert_int_equal(a->tombstone_ms, b->tombstone_ms);
    assert_int_equal(a->upstream_timeout_ms, b->upstream_timeout_ms);
    assert_int_equal(a->replay_header_count, b->replay_header_count);
    for (size_t i = 0; i < a->replay_header_count; i++)
        assert_string_equal(a->replay_headers[i], b->replay_headers[i]);
    assert_int_equal(a->fingerprint, b->fingerprint);
    assert_int_equal(a->fingerprint_field_count, b->fingerprint_field_count);
    for (size_t i = 0; i < a->fingerprint_field_count; i++)
        assert_string_equal(a->fingerprint_fields[i], b->fingerprint_fields[i]);
    assert_int_equal(a->on_5xx_store, b->on_5xx_store);
    assert_memory_equal(a->keep_status, b->keep_status, sizeof a->keep_status);
    assert_int_equal(a->store_statuses_set, b->store_statuses_set);
    assert_same_problems(a->problems, a->problem_count, b->problems, b->problem_count);
    assert_int_equal(a->on_redis_down_reject, b->on_redis_down_reject);
    assert_int_equal(a->key_optional, b->key_optional);
    assert_int_equal(a->pass_host, b->pass_host);
    assert_int_equal(a->unknown_hold, b->unknown_hold);
    assert_int_equal(a->fails_from, b->fails_from);
    assert_int_equal(a->max_attempts, b->max_attempts);
    assert_int_equal(!a->resolve, !b->resolve);
    if (a->resolve) {
        const struct route_resolve *x = a->resolve, *y = b->resolve;
        assert_string_equal(x->url.host, y->url.host);
        assert_int_equal(x->url.port, y->url.port);
        assert_string_equal(x->url.base_path, y->url.base_path);
        assert_int_equal(x->after_ms, y->after_ms);
        assert_int_equal(x->backoff_count, y->backoff_count);
        assert_memory_equal(x->backoff_ms, y->backoff_ms, sizeof x->backoff_ms);
        assert_int_equal(x->give_up_ms, y->give_up_ms);
        assert_memory_equal(x->executed, y->executed, sizeof x->executed);
        assert_memory_equal(x->not_executed, y->not_executed, sizeof x->not_executed);
    }
    assert_true(route_states_same(a->states, b->states));
    if (a->states) {
        assert_int_equal(a->states->field.source, b->states->field.source);
        assert_string_equal(a->states->field.name, b->states->field.name);
    }
    assert_int_equal(!a->signature, !b->signature);
    if (a->signature) {
        const struct signature *x = a->signature, *y = b->signature;
        assert_int_equal(x->scheme, y->scheme);
        assert_int_equal(x->tolerance_ms, y->tolerance_ms);
        assert_int_equal(x->base64, y->base64);
        SAME_STR(x->header, y->header);
        SAME_STR(x->prefix, y->prefix);
        assert_int_equal(x->secret_count, y->secret_count);
        for (size_t i = 0; i < x->secret_count; i++) {
            assert_int_equal(x->secrets[i].len, y->secrets[i].len);
            assert_memory_equal(x->secrets[i].key, y->secrets[i].key, x->secrets[i].len);
        }
        assert_int_equal(x->public_key_count, y->public_key_count);
        for (size_t i = 0; i < x->public_key_count; i++) {
            assert_int_equal(EVP_PKEY_eq(x->public_keys[i].key, y->public_keys[i].key), 1);
            SAME_STR(x->public_keys[i].serial, y->public_keys[i].serial);
        }
        assert_int_equal(x->has_apiv3_key, y->has_apiv3_key);
        assert_memory_equal(x->apiv3_key, y->apiv3_key, sizeof x->apiv3_key);
    }
}

static void assert_same_config(const struct server_config *a, const struct server_config *b)
{
    SAME(listen_host);
    assert_int_equal(a->listen_port, b->listen_port);
    assert_int_equal(a->listen_plaintext, b->listen_plaintext);
    SAME(listen_tls.cert);
    SAME(listen_tls.key);
    SAME(listen_tls.client_ca);
    SAME(admin_tls.cert);
    SAME(admin_tls.key);
    SAME(admin_tls.client_ca);
    SAME(tls_ca);
    SAME(admin_host);
    assert_int_equal(a->admin_port, b->admin_port);
    SAME(admin_unix);
    assert_int_equal(a->admin_plaintext, b->admin_plaintext);
    SAME(state_dir);
    assert_int_equal(a->api_key_count, b->api_key_count);
    for (size_t i = 0; i < a->api_key_count; i++) {
        assert_string_equal(a->api_keys[i].name, b->api_keys[i].name);
        assert_int_equal(a->api_keys[i].write, b->api_keys[i].write);
        assert_memory_equal(a->api_keys[i].hash, b->api_keys[i].hash, 32);
    }
    SAME(storage_kind);
    SAME(storage_path);
    SAME(redis_url);
    SAME(postgres_url);
    assert_int_equal(a->storage_pool, b->storage_pool);
    assert_int_equal(a->storage_timeout_ms, b->storage_timeout_ms);
    assert_int_equal(a->require_sync_replication, b->require_sync_replication);
    SAME(subject_header);
    assert_int_equal(a->has_upstream, b->has_upstream);
    if (a->has_upstream) {
        SAME(upstream.host);
        assert_int_equal(a->upstream.port, b->upstream.port);
        assert_int_equal(a->upstream.tls, b->upstream.tls);
        SAME(upstream.base_path);
    }
    assert_int_equal(a->event_loops, b->event_loops);
    assert_int_equal(a->log_level, b->log_level);
    assert_int_equal(a->log_json, b->log_json);
    SAME(access_to);
    assert_int_equal(a->access_stderr, b->access_stderr);
    assert_int_equal(a->access_text, b->access_text);
    assert_int_equal(a->access_subject, b->access_subject);
    assert_memory_equal(&a->limits, &b->limits, sizeof a->limits);
    assert_same_problems(a->problems, a->problem_count, b->problems, b->problem_count);
    assert_int_equal(a->route_count, b->route_count);
    for (size_t i = 0; i < a->route_count; i++)
        assert_same_route(&a->routes[i], &b->routes[i]);
    assert_int_equal(a->consumer_count, b->consumer_count);
    for (size_t i = 0; i < a->consumer_count; i++) {
        const struct consumer_config *x = &a->consumers[i], *y = &b->consumers[i];
        assert_int_equal(x->source, y->source);
        assert_string_equal(x->url, y->url);
        assert_string_equal(x->queue, y->queue);
        SAME_STR(x->group, y->group);
        SAME_STR(x->body_field, y->body_field);
        assert_int_equal(x->prefetch, y->prefetch);
        assert_string_equal(x->dead_letter, y->dead_letter);
        assert_int_equal(x->backoff_count, y->backoff_count);
        assert_memory_equal(x->backoff_ms, y->backoff_ms, sizeof x->backoff_ms);
        assert_same_route(&x->route, &y->route);
    }
}

/* Printed, read back, printed again: the same text, and the configuration
 * read back is the original, field by field; before config_finish() and
 * after it, as -T prints it. */
static void test_print_round_trip(void **state)
{
    (void)state;
    char *dir = test_mkdtemp(), err[512];
    struct server_config *c = rich_config(dir), *back = round_trip(c, 1);
    assert_same_config(c, back);
    config_free(back);
    assert_int_equal(config_finish(c, err, sizeof err), 0);
    back = round_trip(c, 1);
    assert_same_config(c, back);
    config_free(back);
    /* What the file gave is printed as it gave it. */
    char *text = print_config(c);
    static const char *const shown[] = {
        "  address: \"0.0.0.0:8443\"\n",
        "  address: \"[::1]:9443\"\n",
        "upstream: \"https://Backend.example:8443/base\"\n",
        "subject_header: \"X-!#$%&'*+.^_`|~\"\n",
        "  - name: \"null\"\n",
        "      method: \"POST\"\n      path: \"/orders/*/refunds/*\"\n",
        "    layers: [token, lock, record]\n",
        "    upstream: \"http://[::1]:9001\"\n",
        "    store_statuses: [2xx, 409, 422, 5xx]\n",
        "        \"CREATED\": [\"PROCESSING\", \"SUCCESS\", \"FAILED\"]\n",
        "  key_missing:\n    detail: \"\\x80\\x85\\u2028\\u2029\\uFEFFé end\"\n",
        "  idle_timeout: 90m\n  header_timeout: 1500ms\n",
        "  body_max: 1536B\n",
        "  shutdown_timeout: 0ms\n  replay_cache: 0B\n",
        "  token_ttl_max: 2d\n",
        "      amqp: \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n",
        "    key:\n      message_id: true\n",
        "    retry_backoff: [100ms, 2s]\n",
    };
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
        if (!strstr(text, shown[i])) {
            fputs(text, stderr); /* longer than cmocka's message */
            fail_msg("no %s in what is printed", shown[i]);
        }
    assert_null(strstr(text, "workers"));
    free(text);
    config_free(c);
    test_rmdir(dir);

    /* With every default, before and after config_finish. */
    c = config_default();
    round_trip(c, 0);
    assert_int_equal(config_finish(c, err, sizeof err), 0);
    back = round_trip(c, 1);
    assert_same_config(c, back);
    config_free(back);
    config_free(c);
}

/* No secret's value is printed, anywhere: each as its source. */
static void test_print_secrets(void **state)
{
    (void)state;
    char *dir = test_mkdtemp(), want[600];
    struct server_config *c = rich_config(dir);
    char *text = print_config(c);
    for (size_t i = 0; i < sizeof secret_values / sizeof secret_values[0]; i++)
        if (strstr(text, secret_values[i]))
            fail_msg("%s is printed:\n%s", secret_values[i], text);
    assert_null(strstr(text, "s3cr3t"));
    assert_null(strstr(text, "VALUE"));
    /* The password in a URL: its source, not the URL. */
    assert_null(strstr(text, "idem:"));
    assert_non_null(strstr(text, "  redis:\n    env: \"IDEM_DUMP_REDIS\"\n"));
    snprintf(want, sizeof want, "  postgres:\n    file: \"%s/pg.url\"\n", dir);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "  - name: \"ops\"\n    scope: write\n"
                                 "    env: \"IDEM_DUMP_OPS\"\n"));
    snprintf(want, sizeof want, "  - name: \"grafana\"\n    scope: read\n"
             "    file: \"%s/grafana.key\"\n", dir);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "      secrets:\n        - env: \"IDEM_DUMP_HMAC\"\n"
             "        - file: \"%s/hmac.key\"\n", dir);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "      apiv3_key:\n        env: \"IDEM_DUMP_APIV3\"\n"));
    assert_non_null(strstr(text, "      amqp:\n        env: \"IDEM_DUMP_AMQP\"\n"));
    snprintf(want, sizeof want, "      redis_stream:\n        file: \"%s/stream.url\"\n", dir);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "        - file: \"%s/provider.pem\"\n          serial: \"S-1\"\n",
             dir);
    assert_non_null(strstr(text, want));
    free(text);
    config_free(c);
    /* The sources read again give the same secrets; gone, the printed
     * form is refused as the file would be. */
    c = rich_config(dir);
    text = print_config(c);
    unsetenv("IDEM_DUMP_HMAC");
    parse_bad(text, "IDEM_DUMP_HMAC", "not set");
    free(text);
    config_free(c);
    test_rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_example),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_route_defaults),
        cmocka_unit_test(test_route_values),
        cmocka_unit_test(test_store_statuses),
        cmocka_unit_test(test_signature),
        cmocka_unit_test(test_states),
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_problems),
        cmocka_unit_test(test_shared_space),
        cmocka_unit_test(test_durations),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_listen),
        cmocka_unit_test(test_exposure),
        cmocka_unit_test(test_api_keys),
        cmocka_unit_test(test_upstream),
        cmocka_unit_test(test_default_upstream),
        cmocka_unit_test(test_match),
        cmocka_unit_test(test_path_match),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_consumers),
        cmocka_unit_test(test_access_log),
        cmocka_unit_test(test_layers),
        cmocka_unit_test(test_replay_headers),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_unknown_fields),
        cmocka_unit_test(test_wrong_types_and_ranges),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_error_buffer),
        cmocka_unit_test(test_load),
        cmocka_unit_test(test_shipped_example),
        cmocka_unit_test(test_distributed_storage),
        cmocka_unit_test(test_print_round_trip),
        cmocka_unit_test(test_print_secrets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
