/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wechatpay_resource.c — a WeChat Pay v3 notification's resource,
 * decrypted (wechatpay_resource.h): AEAD_AES_256_GCM under the merchant's
 * APIv3 key, the resource's nonce as the IV, its associated_data as the
 * AAD, and the ciphertext's last 16 bytes as the tag, which must match.
 */
#include "gateway/wechatpay_resource.h"

#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "gateway/signature.h"
#include "http/http_parser.h"

int wechatpay_resource(const struct signature *s, const struct http_msg *m, char **plain,
                       size_t *len, char *detail, size_t dlen)
{
    *plain = NULL;
    if (!s || s->scheme != SIGNATURE_WECHATPAY_V3 || !s->has_apiv3_key) {
        snprintf(detail, dlen, "the route has no WeChat Pay APIv3 key (signature.apiv3_key)");
        return -1;
    }
    json_t *body = m->body ? json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, NULL)
                           : NULL;
    json_t *res = json_object_get(body, "resource");
    const char *alg = json_string_value(json_object_get(res, "algorithm")),
               *ct = json_string_value(json_object_get(res, "ciphertext")),
               *nonce = json_string_value(json_object_get(res, "nonce")),
               *aad = json_string_value(json_object_get(res, "associated_data"));
    int rc = -1;
    unsigned char *raw = NULL;
    char *out = NULL;
    EVP_CIPHER_CTX *x = NULL;
    if (!ct || !nonce || !alg || strcmp(alg, "AEAD_AES_256_GCM") != 0) {
        snprintf(detail, dlen, "the body is not a WeChat Pay notification with a resource "
                 "{ algorithm: AEAD_AES_256_GCM, ciphertext, nonce }");
        goto out;
    }
    size_t ct_len = strlen(ct), nonce_len = strlen(nonce);
    long n = -1;
    if (ct_len <= 4 * 1024 * 1024 && (raw = malloc(ct_len / 4 * 3 + 3)) != NULL)
        n = base64_decode(ct, ct_len, raw);
    if (n < 17 || nonce_len == 0 || nonce_len > 64) {
        snprintf(detail, dlen, "the WeChat Pay resource's ciphertext is not base64 of at least "
                 "17 bytes, or its nonce is not 1 to 64 bytes");
        goto out;
    }
    size_t body_len = (size_t)n - 16;
    int got = 0, fin = 0;
    if (!(out = malloc(body_len + 1)) || !(x = EVP_CIPHER_CTX_new()) ||
        EVP_DecryptInit_ex(x, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_IVLEN, (int)nonce_len, NULL) != 1 ||
        EVP_DecryptInit_ex(x, NULL, NULL, s->apiv3_key, (const unsigned char *)nonce) != 1 ||
        (aad && *aad &&
         EVP_DecryptUpdate(x, NULL, &got, (const unsigned char *)aad, (int)strlen(aad)) != 1) ||
        EVP_DecryptUpdate(x, (unsigned char *)out, &got, raw, (int)body_len) != 1 ||
        EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_TAG, 16, raw + body_len) != 1 ||
        EVP_DecryptFinal_ex(x, (unsigned char *)out + got, &fin) != 1) {
        snprintf(detail, dlen, "the WeChat Pay resource does not decrypt with the route's "
                 "APIv3 key (its tag does not match)");
        goto out;
    }
    out[got + fin] = '\0';
    *plain = out;
    *len = (size_t)(got + fin);
    out = NULL;
    rc = 0;
out:
    EVP_CIPHER_CTX_free(x);
    free(out);
    free(raw);
    json_decref(body);
    return rc;
}
