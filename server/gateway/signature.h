/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature.h — signed callbacks, checked before anything else (gateway):
 * a route with signature: takes a request only when its body is signed by
 * one of the route's secrets, as the provider that calls it signs it
 * (Stripe, GitHub, Standard Webhooks, or an HMAC-SHA256 header of the
 * route's own naming), or by the provider's private key, checked with one
 * of the route's public keys (WeChat Pay v3, Alipay's RSA2). A request that fails is refused 401 before its key
 * is read: no token spent, no lock taken, no record made, nothing
 * forwarded, so that a forgery sent first cannot occupy a genuine event's
 * key. Read from the configuration by signature_config.c.
 */
#ifndef IDEM_SERVER_SIGNATURE_H
#define IDEM_SERVER_SIGNATURE_H

#include <stddef.h>
#include <stdint.h>

#include "config_secret.h"

struct http_msg;

enum signature_scheme {
    SIGNATURE_STRIPE,            /* Stripe-Signature: t=<unix>,v1=<hex>[,v1=...]
                                    over "<t>.<body>" */
    SIGNATURE_GITHUB,            /* X-Hub-Signature-256: sha256=<hex> over the body */
    SIGNATURE_STANDARD_WEBHOOKS, /* webhook-id, webhook-timestamp,
                                    webhook-signature: v1,<base64> ... over
                                    "<id>.<timestamp>.<body>"; whsec_ secrets */
    SIGNATURE_HMAC_SHA256,       /* header: [prefix]<hex or base64> over the body */
    SIGNATURE_WECHATPAY_V3,      /* Wechatpay-Timestamp, -Nonce, -Signature (base64),
                                    -Serial: RSA-SHA256 over "<timestamp>\n<nonce>\n
                                    <body>\n", the public key chosen by serial */
    SIGNATURE_ALIPAY_RSA2,       /* a form-encoded notify: RSA-SHA256 (sign, base64)
                                    over its other fields, sorted: "k=v&k=v" */
};

#define SIGNATURE_SECRETS_MAX 8   /* at once, for rotation */
#define SIGNATURE_KEY_MAX 4096    /* bytes of one secret */

struct signature_secret {
    unsigned char *key;
    size_t len;
    struct config_secret src; /* the env: or file: it was read from */
};

struct evp_pkey_st; /* OpenSSL's EVP_PKEY */

struct signature_public_key {
    struct evp_pkey_st *key;
    char *file;   /* the PEM file it was read from */
    char *serial; /* wechatpay_v3: the serial it is chosen by */
};

struct signature {
    enum signature_scheme scheme;
    struct signature_secret secrets[SIGNATURE_SECRETS_MAX];
    size_t secret_count;       /* >= 1 for the HMAC schemes; 0 for the RSA ones */
    struct signature_public_key public_keys[SIGNATURE_SECRETS_MAX];
    size_t public_key_count;   /* >= 1 for the RSA schemes; 0 for the others */
    int64_t tolerance_ms;      /* stripe, standard_webhooks, wechatpay_v3: how far the signed
                                  timestamp may be from now; default 5 min */
    char *header;              /* hmac_sha256: the header that holds it */
    int base64;                /* hmac_sha256: base64 (1) or hex (0, default) */
    char *prefix;              /* hmac_sha256: what comes first ("sha256="), or NULL */
    /* wechatpay_v3: the merchant's APIv3 key (apiv3_key), which decrypts a
     * notification's resource (AEAD_AES_256_GCM); has_apiv3_key 0: none. */
    unsigned char apiv3_key[32];
    int has_apiv3_key;
    struct config_secret apiv3_src; /* where apiv3_key was read from */
};

void signature_free(struct signature *s);

/* The scheme's name as the configuration spells it ("stripe" ...). */
const char *signature_scheme_name(enum signature_scheme scheme);

/* 0 when m's body is signed by one of s's secrets within the tolerance;
 * else 401 with *type "signature_invalid" (missing, malformed or matching
 * no secret) or "signature_expired" (a match whose timestamp is more than
 * the tolerance from now_ms, the wall clock) and detail saying which. Any
 * thread; nothing allocated that outlives the call. */
int signature_check(const struct signature *s, const struct http_msg *m, int64_t now_ms,
                    const char **type, char *detail, size_t dlen);


#endif
