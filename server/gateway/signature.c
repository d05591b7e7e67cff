/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature.c — signed callbacks checked (see signature.h).
 *
 * The HMAC schemes: an HMAC-SHA256 over the raw body, after a prefix some of
 * them sign too (a timestamp, an event id), compared in constant time with
 * each signature the request carries and each secret the route holds: any
 * pair that agrees passes, so that a provider rotating its secret and a
 * route holding both keep working. A signature is decoded to its 32 bytes
 * first, so that hex in either case and base64 with or without padding are
 * compared as what they mean. A timestamp is judged only once a signature
 * matched: a forgery is "invalid", whatever its timestamp; a genuine but
 * old (replayed) request is "expired".
 *
 * The RSA schemes (WeChat Pay v3, Alipay's RSA2): an RSA-SHA256 (PKCS #1
 * v1.5) signature by the provider's private key over what the scheme
 * signs, verified with the route's public keys: the one whose serial the
 * request names (WeChat Pay), or each in turn (Alipay).
 */
#include "gateway/signature.h"

#include <inttypes.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "gateway/request_key.h"
#include "http/http_parser.h"

#define MAC_LEN 32         /* SHA-256 */
#define SIGNATURES_MAX 16  /* looked at in one header; the rest are ignored */

void signature_free(struct signature *s)
{
    if (!s)
        return;
    OPENSSL_cleanse(s->apiv3_key, sizeof s->apiv3_key);
    config_secret_free(&s->apiv3_src);
    for (size_t i = 0; i < s->secret_count; i++) {
        OPENSSL_cleanse(s->secrets[i].key, s->secrets[i].len);
        free(s->secrets[i].key);
        config_secret_free(&s->secrets[i].src);
    }
    for (size_t i = 0; i < s->public_key_count; i++) {
        EVP_PKEY_free(s->public_keys[i].key);
        free(s->public_keys[i].file);
        free(s->public_keys[i].serial);
    }
    free(s->header);
    free(s->prefix);
    free(s);
}

const char *signature_scheme_name(enum signature_scheme scheme)
{
    switch (scheme) {
    case SIGNATURE_STRIPE:
        return "stripe";
    case SIGNATURE_GITHUB:
        return "github";
    case SIGNATURE_STANDARD_WEBHOOKS:
        return "standard_webhooks";
    case SIGNATURE_HMAC_SHA256:
        return "hmac_sha256";
    case SIGNATURE_WECHATPAY_V3:
        return "wechatpay_v3";
    case SIGNATURE_ALIPAY_RSA2:
        return "alipay_rsa2";
    }
    return "?";
}

/* ---- the MAC ---- */

static EVP_MAC *hmac;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void fetch_hmac(void)
{
    hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

/* HMAC-SHA256 of parts[0..n) under key, to out: 0, or -1. */
static int mac(const struct signature_secret *key, const void *const *parts,
               const size_t *lens, size_t n, unsigned char out[MAC_LEN])
{
    pthread_once(&hmac_once, fetch_hmac);
    if (!hmac)
        return -1;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(hmac);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, "SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    size_t got = 0;
    int ok = ctx && EVP_MAC_init(ctx, key->key, key->len, params);
    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_MAC_update(ctx, parts[i], lens[i]);
    ok = ok && EVP_MAC_final(ctx, out, &got, MAC_LEN) && got == MAC_LEN;
    EVP_MAC_CTX_free(ctx);
    return ok ? 0 : -1;
}

/* ---- what a request carries ---- */

struct carried {
    unsigned char sig[SIGNATURES_MAX][MAC_LEN];
    size_t count;
};

/* n characters at s as one signature (hex, or base64 with base64): taken
 * into *c when it decodes to 32 bytes; 0 if it does not (a malformed one
 * matches nothing, as a wrong one does). */
static int take(struct carried *c, const char *s, size_t n, int base64)
{
    if (c->count == SIGNATURES_MAX)
        return 0;
    unsigned char *out = c->sig[c->count];
    if (base64) {
        unsigned char buf[MAC_LEN + 3];
        if (n > BASE64_LEN(MAC_LEN) || base64_decode(s, n, buf) != MAC_LEN)
            return 0;
        memcpy(out, buf, MAC_LEN);
    } else {
        if (n != 2 * MAC_LEN)
            return 0;
        for (size_t i = 0; i < MAC_LEN; i++) {
            int hi = http_hex_value((unsigned char)s[2 * i]),
                lo = http_hex_value((unsigned char)s[2 * i + 1]);
            if (hi < 0 || lo < 0)
                return 0;
            out[i] = (unsigned char)(hi << 4 | lo);
        }
    }
    c->count++;
    return 1;
}

/* Does one of s's secrets sign parts as one of c's signatures? */
static int matches(const struct signature *s, const struct carried *c, const void *const *parts,
                   const size_t *lens, size_t n)
{
    int found = 0;
    for (size_t k = 0; k < s->secret_count; k++) {
        unsigned char want[MAC_LEN];
        if (mac(&s->secrets[k], parts, lens, n, want) != 0)
            continue;
        for (size_t i = 0; i < c->count; i++)
            found |= CRYPTO_memcmp(want, c->sig[i], MAC_LEN) == 0;
        OPENSSL_cleanse(want, sizeof want);
    }
    return found;
}

/* A decimal Unix time of 1 to 12 digits: seconds, or -1. */
static int64_t unix_time(const char *s, size_t n)
{
    if (n == 0 || n > 12)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

static int refuse(const char **type, const char *what, char *detail, size_t dlen,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int refuse(const char **type, const char *what, char *detail, size_t dlen,
                  const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, dlen, fmt, ap);
    va_end(ap);
    *type = what;
    return 401;
}

/* The one value of header name in m, or NULL with detail (absent, empty,
 * or given twice: which one is signed cannot be told). */
static const char *one_header(const struct http_msg *m, const char *name, const char **type,
                              char *detail, size_t dlen, int *status)
{
    const char *v = http_msg_header(m, name);
    if (!v || !*v) {
        *status = refuse(type, "signature_invalid", detail, dlen,
                         "the request has no %s header: it is not signed", name);
        return NULL;
    }
    if (http_msg_header_alike_count(m, name) > 1) {
        *status = refuse(type, "signature_invalid", detail, dlen,
                         "the %s header is given more than once", name);
        return NULL;
    }
    return v;
}

/* A match's timestamp against now: 0, or 401 signature_expired. */
static int in_time(const struct signature *s, int64_t t, int64_t now_ms, const char **type,
                   char *detail, size_t dlen)
{
    int64_t off_s = now_ms / 1000 - t;
    if (off_s < 0)
        off_s = -off_s;
    if (off_s * 1000 <= s->tolerance_ms)
        return 0;
    return refuse(type, "signature_expired", detail, dlen,
                  "the signature is valid, but its timestamp %" PRId64 " is %" PRId64
                  " s from now, past the route's tolerance of %" PRId64 " s: a replayed "
                  "request, or a clock that is off",
                  t, off_s, s->tolerance_ms / 1000);
}

/* ---- the schemes ---- */

static int check_stripe(const struct signature *s, const struct http_msg *m, int64_t now_ms,
                        const char **type, char *detail, size_t dlen)
{
    int status = 0;
    const char *v = one_header(m, "Stripe-Signature", type, detail, dlen, &status);
    if (!v)
        return status;
    struct carried c = {.count = 0};
    const char *t = NULL;
    size_t tlen = 0;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        const char *eq = memchr(p, '=', n);
        if (eq && eq - p == 1 && *p == 't') {
            t = eq + 1;
            tlen = n - 2;
        } else if (eq && eq - p == 2 && p[0] == 'v' && p[1] == '1') {
            take(&c, eq + 1, n - 3, 0);
        }
        p += n + (p[n] == ',');
        while (*p == ' ')
            p++;
    }
    int64_t ts = t ? unix_time(t, tlen) : -1;
    if (ts < 0)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Stripe-Signature header has no timestamp (t=<unix time>)");
    if (!c.count)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Stripe-Signature header has no v1 signature (v1=<64 hex digits>)");
    const void *parts[] = {t, ".", m->body ? m->body : ""};
    size_t lens[] = {tlen, 1, m->body_len};
    if (!matches(s, &c, parts, lens, 3))
        return refuse(type, "signature_invalid", detail, dlen,
                      "no v1 signature of the Stripe-Signature header matches the body under "
                      "the route's secrets");
    return in_time(s, ts, now_ms, type, detail, dlen);
}

static int check_body_mac(const struct signature *s, const struct http_msg *m,
                          const char *header, const char *prefix, int base64, const char **type,
                          char *detail, size_t dlen)
{
    int status = 0;
    const char *v = one_header(m, header, type, detail, dlen, &status);
    if (!v)
        return status;
    size_t plen = prefix ? strlen(prefix) : 0;
    if (plen && strncmp(v, prefix, plen) != 0)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the %s header does not start with %s", header, prefix);
    struct carried c = {.count = 0};
    if (!take(&c, v + plen, strlen(v + plen), base64))
        return refuse(type, "signature_invalid", detail, dlen,
                      "the %s header does not hold an HMAC-SHA256 (%s)", header,
                      base64 ? "44 base64 characters" : "64 hex digits");
    const void *parts[] = {m->body ? m->body : ""};
    size_t lens[] = {m->body_len};
    if (!matches(s, &c, parts, lens, 1))
        return refuse(type, "signature_invalid", detail, dlen,
                      "the %s signature does not match the body under the route's secrets",
                      header);
    return 0;
}

static int check_standard(const struct signature *s, const struct http_msg *m, int64_t now_ms,
                          const char **type, char *detail, size_t dlen)
{
    int status = 0;
    const char *id, *ts, *sig;
    if (!(id = one_header(m, "webhook-id", type, detail, dlen, &status)) ||
        !(ts = one_header(m, "webhook-timestamp", type, detail, dlen, &status)) ||
        !(sig = one_header(m, "webhook-signature", type, detail, dlen, &status)))
        return status;
    int64_t t = unix_time(ts, strlen(ts));
    if (t < 0)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the webhook-timestamp header is not a Unix time in seconds");
    struct carried c = {.count = 0};
    for (const char *p = sig; *p;) {
        size_t n = strcspn(p, " ");
        if (n > 3 && memcmp(p, "v1,", 3) == 0)
            take(&c, p + 3, n - 3, 1);
        p += n;
        while (*p == ' ')
            p++;
    }
    if (!c.count)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the webhook-signature header has no v1 signature (v1,<base64>)");
    const void *parts[] = {id, ".", ts, ".", m->body ? m->body : ""};
    size_t lens[] = {strlen(id), 1, strlen(ts), 1, m->body_len};
    if (!matches(s, &c, parts, lens, 5))
        return refuse(type, "signature_invalid", detail, dlen,
                      "no v1 signature of the webhook-signature header matches under the "
                      "route's secrets");
    return in_time(s, t, now_ms, type, detail, dlen);
}

/* ---- the RSA schemes ---- */

#define RSA_SIG_MAX 1024 /* bytes: an 8192-bit key's signature */

/* Does key sign parts[0..n) as sig (RSA-SHA256, PKCS #1 v1.5)? */
static int rsa_verifies(struct evp_pkey_st *key, const void *const *parts, const size_t *lens,
                        size_t n, const unsigned char *sig, size_t sig_len)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestVerifyInit(ctx, NULL, EVP_sha256(), NULL, key) == 1;
    for (size_t i = 0; ok && i < n; i++)
        ok = EVP_DigestVerifyUpdate(ctx, parts[i], lens[i]) == 1;
    ok = ok && EVP_DigestVerifyFinal(ctx, sig, sig_len) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
}

/* A base64 signature of n characters at s into sig: its length, or -1. */
static long rsa_signature(const char *s, size_t n, unsigned char sig[RSA_SIG_MAX + 3])
{
    if (n > BASE64_LEN(RSA_SIG_MAX))
        return -1;
    return base64_decode(s, n, sig);
}

static int check_wechatpay(const struct signature *s, const struct http_msg *m, int64_t now_ms,
                           const char **type, char *detail, size_t dlen)
{
    int status = 0;
    const char *ts, *nonce, *sig64, *serial;
    if (!(ts = one_header(m, "Wechatpay-Timestamp", type, detail, dlen, &status)) ||
        !(nonce = one_header(m, "Wechatpay-Nonce", type, detail, dlen, &status)) ||
        !(sig64 = one_header(m, "Wechatpay-Signature", type, detail, dlen, &status)) ||
        !(serial = one_header(m, "Wechatpay-Serial", type, detail, dlen, &status)))
        return status;
    int64_t t = unix_time(ts, strlen(ts));
    if (t < 0)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Wechatpay-Timestamp header is not a Unix time in seconds");
    const struct signature_public_key *key = NULL;
    for (size_t i = 0; i < s->public_key_count && !key; i++)
        if (strcmp(s->public_keys[i].serial, serial) == 0)
            key = &s->public_keys[i];
    if (!key)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Wechatpay-Serial header names no public key of the route's");
    unsigned char sig[RSA_SIG_MAX + 3];
    long sig_len = rsa_signature(sig64, strlen(sig64), sig);
    if (sig_len <= 0)
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Wechatpay-Signature header is not a base64 signature");
    const void *parts[] = {ts, "\n", nonce, "\n", m->body ? m->body : "", "\n"};
    size_t lens[] = {strlen(ts), 1, strlen(nonce), 1, m->body_len, 1};
    if (!rsa_verifies(key->key, parts, lens, 6, sig, (size_t)sig_len))
        return refuse(type, "signature_invalid", detail, dlen,
                      "the Wechatpay-Signature does not verify with the public key of that "
                      "serial");
    return in_time(s, t, now_ms, type, detail, dlen);
}

/* ---- a form-encoded body (Alipay's notify) ---- */

#define FORM_FIELDS_MAX 128

struct form_field {
    char *name, *value; /* decoded, in the form's copy */
};

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct form_field *)a)->name, ((const struct form_field *)b)->name);
}

/* Decode n bytes at s in place (+ is a space, %XX a byte): its new length,
 * or -1 for a broken escape or a NUL. */
static long form_decode(char *s, size_t n)
{
    return request_pct_decode(s, n, s, n + 1, 1) == 0 ? (long)strlen(s) : -1;
}

static int check_alipay(const struct signature *s, const struct http_msg *m, const char **type,
                        char *detail, size_t dlen)
{
    char *copy = malloc(m->body_len + 1);
    struct form_field *f = calloc(FORM_FIELDS_MAX, sizeof *f);
    char *content = malloc(m->body_len + 1);
    size_t n = 0, clen = 0;
    const char *sig64 = NULL, *why = NULL;
    int status = 401;
    if (!copy || !f || !content) {
        why = "no memory to read the form";
        goto out;
    }
    memcpy(copy, m->body ? m->body : "", m->body_len);
    copy[m->body_len] = '\0';
    for (char *p = copy, *end = copy + m->body_len; p < end && !why;) {
        char *amp = memchr(p, '&', (size_t)(end - p));
        size_t len = amp ? (size_t)(amp - p) : (size_t)(end - p);
        char *eq = memchr(p, '=', len);
        if (!eq || eq == p) {
            why = "the body is not a form (name=value&...)";
            break;
        }
        long nl = form_decode(p, (size_t)(eq - p));
        long vl = form_decode(eq + 1, len - (size_t)(eq - p) - 1);
        if (nl < 0 || vl < 0) {
            why = "the form holds a broken %-escape or a NUL";
            break;
        }
        if (!strcmp(p, "sign")) {
            if (sig64) {
                why = "the form gives sign twice";
                break;
            }
            sig64 = eq + 1;
        } else if (strcmp(p, "sign_type") != 0 && vl > 0) {
            if (n == FORM_FIELDS_MAX) {
                why = "the form has more than 128 fields";
                break;
            }
            f[n++] = (struct form_field){p, eq + 1};
        }
        p += len + 1;
    }
    if (!why && !sig64)
        why = "the form has no sign field: it is not signed";
    if (why)
        goto out;
    qsort(f, n, sizeof *f, by_name);
    for (size_t i = 0; i < n; i++) {
        if (i && !strcmp(f[i].name, f[i - 1].name)) {
            why = "the form gives a field twice: which one is signed cannot be told";
            goto out;
        }
        clen += (size_t)sprintf(content + clen, "%s%s=%s", i ? "&" : "", f[i].name, f[i].value);
    }
    unsigned char sig[RSA_SIG_MAX + 3];
    long sig_len = rsa_signature(sig64, strlen(sig64), sig);
    if (sig_len <= 0) {
        why = "the form's sign is not a base64 signature";
        goto out;
    }
    const void *parts[] = {content};
    size_t lens[] = {clen};
    for (size_t k = 0; k < s->public_key_count && status; k++)
        if (rsa_verifies(s->public_keys[k].key, parts, lens, 1, sig, (size_t)sig_len))
            status = 0;
    if (status)
        why = "the form's sign does not verify with the route's public keys";
out:
    if (why)
        refuse(type, "signature_invalid", detail, dlen, "%s", why);
    free(copy);
    free(f);
    free(content);
    return why ? 401 : 0;
}

int signature_check(const struct signature *s, const struct http_msg *m, int64_t now_ms,
                    const char **type, char *detail, size_t dlen)
{
    switch (s->scheme) {
    case SIGNATURE_STRIPE:
        return check_stripe(s, m, now_ms, type, detail, dlen);
    case SIGNATURE_GITHUB:
        return check_body_mac(s, m, "X-Hub-Signature-256", "sha256=", 0, type, detail, dlen);
    case SIGNATURE_STANDARD_WEBHOOKS:
        return check_standard(s, m, now_ms, type, detail, dlen);
    case SIGNATURE_HMAC_SHA256:
        return check_body_mac(s, m, s->header, s->prefix, s->base64, type, detail, dlen);
    case SIGNATURE_WECHATPAY_V3:
        return check_wechatpay(s, m, now_ms, type, detail, dlen);
    case SIGNATURE_ALIPAY_RSA2:
        return check_alipay(s, m, type, detail, dlen);
    }
    return refuse(type, "signature_invalid", detail, dlen, "unknown signature scheme");
}
