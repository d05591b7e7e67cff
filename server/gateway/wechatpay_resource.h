/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wechatpay_resource.h — a WeChat Pay v3 notification's encrypted resource,
 * opened with the route's APIv3 key (signature.apiv3_key), so that key:
 * and states.field may name its fields ({ wechatpay_resource: ... }).
 * The signature over the whole body is checked first, as for any route
 * with signature: (signature.h); this only reads what it signed.
 */
#ifndef IDEM_SERVER_GATEWAY_WECHATPAY_RESOURCE_H
#define IDEM_SERVER_GATEWAY_WECHATPAY_RESOURCE_H

#include <stddef.h>

struct http_msg;
struct signature;

/* A WeChat Pay v3 notification's resource, decrypted with s's APIv3 key:
 * the JSON body's resource { algorithm: AEAD_AES_256_GCM, ciphertext
 * (base64, its tag last), nonce, associated_data }. 0 and the plaintext
 * in *plain (malloc'd, *len bytes, NUL-terminated), or -1 with detail
 * (not such a body, or it does not decrypt: a forgery or another key). */
int wechatpay_resource(const struct signature *s, const struct http_msg *m, char **plain,
                       size_t *len, char *detail, size_t dlen);

#endif
