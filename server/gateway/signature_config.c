/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature_config.c — a route's signature: section (signature_config.h).
 * The secrets come from the environment or a file, never from the YAML,
 * several at once for a rotation; the RSA schemes' public keys from PEM
 * files (a public key, or a certificate holding one).
 */
#include "gateway/signature_config.h"

#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "config_print.h"
#include "gateway/signature.h"

#define SECRET_MIN 16 /* bytes: a shorter secret can be guessed */

static const char *const schemes[] = {"stripe",      "github",       "standard_webhooks",
                                      "hmac_sha256", "wechatpay_v3", "alipay_rsa2"};
#define SCHEMES "stripe, github, standard_webhooks, hmac_sha256, wechatpay_v3 or alipay_rsa2"

/* One public key: { file: PATH } (PEM: a public key, or a certificate)
 * and, for wechatpay_v3, serial: the one WeChat Pay names it by. */
static int get_public_key(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          enum signature_scheme scheme, struct signature_public_key *out)
{
    static const char *const fields[] = {"file", "serial"};
    char fpath[192];
    const yaml_node_t *v;
    const char *file, *serial = NULL;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected { file: PATH, serial: ... }");
    if (config_check_fields(c, n, path, fields, 2))
        return -1;
    config_join(fpath, sizeof fpath, path, "file");
    if (!(v = config_field(c, n, "file")))
        return config_fail(c, n, path, "file is required: a PEM public key or certificate");
    if (config_scalar(c, v, fpath, "a file path", &file))
        return -1;
    config_join(fpath, sizeof fpath, path, "serial");
    if ((v = config_field(c, n, "serial"))) {
        if (scheme != SIGNATURE_WECHATPAY_V3)
            return config_fail(c, v, fpath, "serial is for wechatpay_v3, which names its key");
        if (config_scalar(c, v, fpath, "a certificate serial", &serial))
            return -1;
        if (!*serial || strlen(serial) > 128 || config_has_control(serial))
            return config_fail(c, v, fpath, "a serial is 1 to 128 printable bytes");
    } else if (scheme == SIGNATURE_WECHATPAY_V3) {
        return config_fail(c, n, path, "serial is required with wechatpay_v3: the "
                           "Wechatpay-Serial header chooses the key by it");
    }
    config_join(fpath, sizeof fpath, path, "file");
    FILE *f = fopen(file, "r");
    if (!f)
        return config_fail(c, config_field(c, n, "file"), fpath, "cannot read %s",
                           config_quote(c, file));
    EVP_PKEY *key = PEM_read_PUBKEY(f, NULL, NULL, NULL);
    if (!key) {
        rewind(f);
        X509 *cert = PEM_read_X509(f, NULL, NULL, NULL);
        key = cert ? X509_get_pubkey(cert) : NULL;
        X509_free(cert);
    }
    fclose(f);
    if (!key || EVP_PKEY_get_base_id(key) != EVP_PKEY_RSA || EVP_PKEY_get_bits(key) < 2048) {
        EVP_PKEY_free(key);
        return config_fail(c, config_field(c, n, "file"), fpath,
                           "%s holds no RSA public key of 2048 bits or more (PEM: a public "
                           "key or a certificate)", config_quote(c, file));
    }
    out->key = key;
    if (!(out->file = strdup(file)) || (serial && !(out->serial = strdup(serial))))
        return config_oom(c);
    return 0;
}

/* One secret, as the scheme takes it: a whsec_<base64> for Standard
 * Webhooks (its bytes are the key), the text itself for the others. */
static int get_secret(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      enum signature_scheme scheme, struct signature_secret *out)
{
    static const char *const known[] = {"env", "file"};
    char buf[SECRET_MAX + 2];
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected { env: NAME } or { file: PATH }: a secret is "
                           "never written in this file");
    if (config_get_secret(c, n, path, known, 2, buf, &out->src))
        return -1;
    size_t len = strlen(buf);
    unsigned char *key = malloc(len + 3);
    if (!key) {
        config_secret_free(&out->src);
        return config_oom(c);
    }
    if (scheme == SIGNATURE_STANDARD_WEBHOOKS) {
        long got = strncmp(buf, "whsec_", 6) == 0 ? base64_decode(buf + 6, len - 6, key) : -1;
        if (got < SECRET_MIN) {
            free(key);
            config_secret_free(&out->src); /* not counted: signature_free does not see it */
            return config_fail(c, n, path, "a standard_webhooks secret is whsec_ and the "
                               "base64 of at least %d bytes", SECRET_MIN);
        }
        len = (size_t)got;
    } else {
        if (len < SECRET_MIN) {
            free(key);
            config_secret_free(&out->src);
            return config_fail(c, n, path, "the secret is %zu bytes; at least %d", len,
                               SECRET_MIN);
        }
        memcpy(key, buf, len);
    }
    memset(buf, 0, sizeof buf);
    out->key = key;
    out->len = len;
    return 0;
}

/* apiv3_key: { env: NAME } or { file: PATH }, the merchant's 32-byte
 * APIv3 key, which decrypts a notification's resource. */
static int get_apiv3_key(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature *s)
{
    static const char *const known[] = {"env", "file"};
    char buf[SECRET_MAX + 2];
    if (s->scheme != SIGNATURE_WECHATPAY_V3)
        return config_fail(c, n, path, "apiv3_key is WeChat Pay's (scheme wechatpay_v3)");
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected { env: NAME } or { file: PATH }: a key is "
                           "never written in this file");
    if (config_get_secret(c, n, path, known, 2, buf, &s->apiv3_src))
        return -1;
    size_t len = strlen(buf);
    if (len != sizeof s->apiv3_key) {
        OPENSSL_cleanse(buf, sizeof buf);
        return config_fail(c, n, path, "an APIv3 key is 32 bytes, not %zu", len);
    }
    memcpy(s->apiv3_key, buf, sizeof s->apiv3_key);
    OPENSSL_cleanse(buf, sizeof buf);
    s->has_apiv3_key = 1;
    return 0;
}

static int get_signature(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature *s)
{
    static const char *const fields[] = {"scheme", "secrets",  "tolerance",  "header",
                                         "encoding", "prefix", "public_keys", "apiv3_key"};
    char fpath[128];
    const yaml_node_t *v;
    int scheme;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping (signature: { scheme: stripe, "
                           "secrets: [{ env: NAME }] })");
    if (config_check_fields(c, n, path, fields, sizeof fields / sizeof fields[0]))
        return -1;
#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if (!(v = FIELD("scheme")))
        return config_fail(c, n, path, "scheme is required: " SCHEMES);
    if (config_get_enum(c, v, fpath, SCHEMES,
                        schemes, sizeof schemes / sizeof schemes[0], NULL,
                        &scheme))
        return -1;
    s->scheme = (enum signature_scheme)scheme;
    int own = s->scheme == SIGNATURE_HMAC_SHA256;
    int timed = s->scheme == SIGNATURE_STRIPE || s->scheme == SIGNATURE_STANDARD_WEBHOOKS ||
                s->scheme == SIGNATURE_WECHATPAY_V3;
    int rsa = s->scheme == SIGNATURE_WECHATPAY_V3 || s->scheme == SIGNATURE_ALIPAY_RSA2;
    static const char *const own_fields[] = {"header", "encoding", "prefix"};
    for (size_t i = 0; !own && i < sizeof own_fields / sizeof own_fields[0]; i++)
        if ((v = FIELD(own_fields[i])))
            return config_fail(c, v, fpath, "%s is for scheme hmac_sha256; %s names its own "
                               "header", own_fields[i], schemes[scheme]);
    if ((v = FIELD("tolerance"))) {
        if (!timed)
            return config_fail(c, v, fpath, "%s signs no timestamp: tolerance is for stripe, "
                               "standard_webhooks and wechatpay_v3", schemes[scheme]);
        if (config_get_duration(c, v, fpath, 1000, MS_DAY, &s->tolerance_ms))
            return -1;
    }
    if (own) {
        const char *h;
        if (!(v = FIELD("header")))
            return config_fail(c, n, path, "header is required with hmac_sha256 (e.g. header: "
                               "X-Signature)");
        if (config_get_header_name(c, v, fpath, &h) || config_set_string(&s->header, h))
            return -1;
        if ((v = FIELD("encoding")) &&
            config_get_choice(c, v, fpath, "hex", "base64", &s->base64))
            return -1;
        if ((v = FIELD("prefix"))) {
            const char *p;
            if (config_scalar(c, v, fpath, "a prefix such as sha256=", &p))
                return -1;
            if (!*p || strlen(p) > 32 || config_has_control(p))
                return config_fail(c, v, fpath, "a prefix is 1 to 32 printable bytes");
            if (config_set_string(&s->prefix, p))
                return config_oom(c);
        }
    }
    yaml_node_item_t *it = NULL;
    size_t count = 0;
    if (rsa) {
        if ((v = FIELD("secrets")))
            return config_fail(c, v, fpath, "%s is checked with the provider's public keys: "
                               "give public_keys, not secrets", schemes[scheme]);
        if (!(v = FIELD("public_keys")))
            return config_fail(c, n, path, "public_keys is required (e.g. public_keys: "
                               "[{ file: /etc/idem/provider.pem%s }])",
                               s->scheme == SIGNATURE_WECHATPAY_V3 ? ", serial: 5157F09E..." : "");
        if (config_list_items(c, v, fpath, "a list of public keys", &it, &count))
            return -1;
        if (count == 0 || count > SIGNATURE_SECRETS_MAX)
            return config_fail(c, v, fpath, "%zu public keys; give 1 to %d", count,
                               SIGNATURE_SECRETS_MAX);
        for (size_t i = 0; i < count; i++) {
            char ipath[160];
            config_pathf(ipath, sizeof ipath, "%s[%zu]", fpath, i);
            if (get_public_key(c, config_node(c, it[i]), ipath, s->scheme, &s->public_keys[i]))
                return -1;
            s->public_key_count++;
        }
        if ((v = FIELD("apiv3_key")) && get_apiv3_key(c, v, fpath, s))
            return -1;
        return 0;
    }
    if ((v = FIELD("public_keys")))
        return config_fail(c, v, fpath, "%s is checked with shared secrets: give secrets, not "
                           "public_keys", schemes[scheme]);
    if ((v = FIELD("apiv3_key")))
        return config_fail(c, v, fpath, "apiv3_key is WeChat Pay's (scheme wechatpay_v3)");
    if (!(v = FIELD("secrets")))
        return config_fail(c, n, path, "secrets is required (e.g. secrets: [{ env: "
                           "WEBHOOK_SECRET }]): one or more, for a rotation");
    if (config_list_items(c, v, fpath, "a list of secrets", &it, &count))
        return -1;
    if (count == 0 || count > SIGNATURE_SECRETS_MAX)
        return config_fail(c, v, fpath, "%zu secrets; give 1 to %d", count,
                           SIGNATURE_SECRETS_MAX);
    for (size_t i = 0; i < count; i++) {
        char ipath[160];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", fpath, i);
        if (get_secret(c, config_node(c, it[i]), ipath, s->scheme, &s->secrets[i]))
            return -1;
        s->secret_count++;
    }
#undef FIELD
    return 0;
}

int config_get_signature(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature **out)
{
    struct signature *s = calloc(1, sizeof *s);
    if (!s)
        return config_oom(c);
    s->tolerance_ms = 5 * MS_MIN;
    if (get_signature(c, n, path, s)) {
        signature_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void config_print_signature(struct config_out *o, int indent, const struct signature *s)
{
    int in = indent + 2;
    config_put_key(o, indent, "signature");
    config_put_word(o, in, "scheme", schemes[s->scheme]);
    if (s->scheme == SIGNATURE_STRIPE || s->scheme == SIGNATURE_STANDARD_WEBHOOKS ||
        s->scheme == SIGNATURE_WECHATPAY_V3)
        config_put_duration(o, in, "tolerance", s->tolerance_ms);
    if (s->scheme == SIGNATURE_HMAC_SHA256) {
        config_put_str(o, in, "header", s->header);
        config_put_word(o, in, "encoding", s->base64 ? "base64" : "hex");
        if (s->prefix)
            config_put_str(o, in, "prefix", s->prefix);
    }
    if (s->secret_count)
        config_put_key(o, in, "secrets");
    for (size_t i = 0; i < s->secret_count; i++) {
        config_put_item(o);
        config_put_secret(o, in + 4, &s->secrets[i].src);
    }
    if (s->public_key_count)
        config_put_key(o, in, "public_keys");
    for (size_t i = 0; i < s->public_key_count; i++) {
        config_put_item(o);
        config_put_str(o, in + 4, "file", s->public_keys[i].file);
        if (s->public_keys[i].serial)
            config_put_str(o, in + 4, "serial", s->public_keys[i].serial);
    }
    if (s->has_apiv3_key) {
        config_put_key(o, in, "apiv3_key");
        config_put_secret(o, in + 2, &s->apiv3_src);
    }
}
