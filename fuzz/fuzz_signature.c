/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_signature.c — signed callbacks as a forger sends them: the input is
 * an HTTP request (parsed by the strict parser first, as the daemon does),
 * checked under every scheme: the headers each reads (Stripe-Signature,
 * webhook-*, Wechatpay-*), Alipay's form body. The keys are fixed, so a
 * pass is all but impossible; what is checked is that nothing crashes or
 * reads out of bounds, and that every refusal is 401 with a type and a
 * detail.
 */
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/signature.h"
#include "gateway/wechatpay_resource.h"
#include "http/http_parser.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static EVP_PKEY *public_key(void)
{
    static EVP_PKEY *key;
    if (!key)
        key = EVP_RSA_gen(2048);
    return key;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_limits limits = {4096, 64, 16384, 65536};
    struct http_parser p;
    size_t used;
    http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
    enum http_parse_status st = http_parser_feed(&p, (const char *)data, size, &used);
    struct http_msg *m = st == HTTP_DONE ? http_parser_take(&p) : NULL;
    http_parser_free(&p);
    if (!m)
        return 0;
    static unsigned char secret[] = "fuzz-secret-0123456789abcdef";
    for (int scheme = SIGNATURE_STRIPE; scheme <= SIGNATURE_ALIPAY_RSA2; scheme++) {
        struct signature s;
        memset(&s, 0, sizeof s);
        s.scheme = (enum signature_scheme)scheme;
        s.tolerance_ms = 300000;
        if (scheme == SIGNATURE_WECHATPAY_V3 || scheme == SIGNATURE_ALIPAY_RSA2) {
            s.public_keys[0].key = public_key();
            s.public_keys[0].serial = "S1";
            s.public_key_count = 1;
        } else {
            s.secrets[0].key = secret;
            s.secrets[0].len = sizeof secret - 1;
            s.secret_count = 1;
            s.header = "X-Signature";
            s.base64 = scheme & 1;
            s.prefix = scheme & 2 ? "sha256=" : NULL;
        }
        const char *type = NULL;
        char detail[256] = "";
        int rc = signature_check(&s, m, 1700000000000LL, &type, detail, sizeof detail);
        if (rc != 0 && (rc != 401 || !type || !*detail))
            abort();
        if (scheme == SIGNATURE_WECHATPAY_V3) {
            /* The resource a key part may name: decrypted, or refused. */
            char *plain = NULL;
            size_t len = 0;
            memcpy(s.apiv3_key, "fuzz-apiv3-key-0123456789abcdef", 32);
            s.has_apiv3_key = 1;
            detail[0] = '\0';
            if (wechatpay_resource(&s, m, &plain, &len, detail, sizeof detail) == 0) {
                if (!plain || strlen(plain) > len)
                    abort();
                free(plain);
            } else if (plain || !*detail) {
                abort();
            }
        }
    }
    http_msg_free(m);
    return 0;
}
