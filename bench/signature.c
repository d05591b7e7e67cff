/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature.c — what checking a signed callback costs (idem-signature-bench),
 * scheme by scheme, against OpenSSL's one-shot HMAC-SHA256 over the same
 * body (the HMAC schemes) and its bare RSA-SHA256 verification of what the
 * scheme signs, with a 2048-bit key (the RSA ones): the least a check must
 * spend.
 *
 *   idem-signature-bench [--seconds S] [--body-bytes N]
 *
 * Each case checks one signed request (a JSON body of N bytes, 1024 by
 * default, and the scheme's headers) over and over on one thread for S
 * seconds (1 by default), and reports the process's CPU time per check,
 * read from CLOCK_PROCESS_CPUTIME_ID, and its ratio to the reference's. The
 * "2 secrets" cases sign with the second of two secrets, a rotation's worst
 * case: both are tried. Every check must pass; anything else exits 1.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gateway/signature.h"
#include "http/http_parser.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char key1[] = "bench-secret-one-0123456789abcdef";
static const char key2[] = "bench-secret-two-0123456789abcdef";

static void hmac(const char *key, const char *a, size_t alen, const char *b, size_t blen,
                 unsigned char out[32])
{
    /* a then b, as one message: what the scheme signs. */
    char *all = malloc(alen + blen);
    if (!all)
        exit(1);
    memcpy(all, a, alen);
    memcpy(all + alen, b, blen);
    unsigned len = 0;
    HMAC(EVP_sha256(), key, (int)strlen(key), (unsigned char *)all, alen + blen, out, &len);
    free(all);
}

static void hex(const unsigned char mac[32], char *out)
{
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", mac[i]);
}

struct bench_case {
    const char *name;
    enum signature_scheme scheme;
    int secrets;
};

int main(int argc, char **argv)
{
    double seconds = 1;
    size_t body_len = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--body-bytes") && i + 1 < argc)
            body_len = (size_t)atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--seconds S] [--body-bytes N]\n", argv[0]);
            return 2;
        }
    }
    if (seconds <= 0 || body_len < 32 || body_len > (1u << 24)) {
        fprintf(stderr, "idem-signature-bench: --seconds > 0, --body-bytes 32 .. 16 MiB\n");
        return 2;
    }
    char *body = malloc(body_len + 1);
    if (!body)
        return 1;
    /* A JSON event, padded to the size asked for. */
    int head = snprintf(body, body_len + 1, "{\"id\":\"evt_1\",\"refund_no\":\"RF-1\",\"pad\":\"");
    memset(body + head, 'x', body_len - (size_t)head - 2);
    memcpy(body + body_len - 2, "\"}", 3);

    long long now = (long long)time(NULL);
    char ts[24], mac_hex[65], line[3][256];
    snprintf(ts, sizeof ts, "%lld", now);
    static const struct bench_case cases[] = {
        {"stripe", SIGNATURE_STRIPE, 1},
        {"stripe, 2 secrets", SIGNATURE_STRIPE, 2},
        {"github", SIGNATURE_GITHUB, 1},
        {"standard_webhooks", SIGNATURE_STANDARD_WEBHOOKS, 1},
        {"hmac_sha256 (base64)", SIGNATURE_HMAC_SHA256, 1},
        {"wechatpay_v3", SIGNATURE_WECHATPAY_V3, 0},
        {"alipay_rsa2 (a 12-field form)", SIGNATURE_ALIPAY_RSA2, 0},
    };
    EVP_PKEY *rsa = EVP_RSA_gen(2048);
    if (!rsa)
        return 1;
    /* An Alipay notify of the same size: twelve fields, the last padded. */
    char *form = malloc(body_len + 2048);
    if (!form)
        return 1;
    size_t flen = 0;
    for (int i = 0; i < 11; i++)
        flen += (size_t)sprintf(form + flen, "field_%02d=value-%02d&", i, i);
    flen += (size_t)sprintf(form + flen, "pad=");
    while (flen < body_len)
        form[flen++] = 'x';
    form[flen] = '\0';

    printf("| check | µs of CPU per check | × its reference |\n");
    printf("|---|---:|---:|\n");
    /* The reference: the bare MAC of the body, one-shot. */
    double ref_us = 0, rsa_ref_us = 1;
    {
        unsigned char mac[32];
        unsigned len = 0;
        long n = 0;
        double c0 = cpu_s(), w0 = wall_s();
        while (wall_s() - w0 < seconds) {
            for (int i = 0; i < 256; i++, n++)
                HMAC(EVP_sha256(), key1, (int)strlen(key1), (unsigned char *)body, body_len,
                     mac, &len);
        }
        ref_us = (cpu_s() - c0) * 1e6 / (double)n;
        printf("| OpenSSL HMAC-SHA256 of a %zu-byte body (reference) | %.2f | 1.00× |\n",
               body_len, ref_us);
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const struct bench_case *bc = &cases[k];
        struct signature s;
        memset(&s, 0, sizeof s);
        s.scheme = bc->scheme;
        s.tolerance_ms = 300000;
        s.secret_count = (size_t)bc->secrets;
        s.secrets[0].key = (unsigned char *)key1;
        s.secrets[0].len = strlen(key1);
        s.secrets[1].key = (unsigned char *)key2;
        s.secrets[1].len = strlen(key2);
        const char *signer = bc->secrets == 2 ? key2 : key1;
        unsigned char mac[32];
        struct http_header h[4];
        size_t nh = 1;
        char prefix[160];
        switch (bc->scheme) {
        case SIGNATURE_STRIPE:
            snprintf(prefix, sizeof prefix, "%s.", ts);
            hmac(signer, prefix, strlen(prefix), body, body_len, mac);
            hex(mac, mac_hex);
            snprintf(line[0], sizeof line[0], "t=%s,v1=%s", ts, mac_hex);
            h[0] = (struct http_header){"Stripe-Signature", line[0], 16};
            break;
        case SIGNATURE_GITHUB:
            hmac(signer, "", 0, body, body_len, mac);
            hex(mac, mac_hex);
            snprintf(line[0], sizeof line[0], "sha256=%s", mac_hex);
            h[0] = (struct http_header){"X-Hub-Signature-256", line[0], 19};
            break;
        case SIGNATURE_STANDARD_WEBHOOKS: {
            snprintf(prefix, sizeof prefix, "msg_1.%s.", ts);
            hmac(signer, prefix, strlen(prefix), body, body_len, mac);
            snprintf(line[0], sizeof line[0], "v1,");
            EVP_EncodeBlock((unsigned char *)line[0] + 3, mac, 32);
            h[0] = (struct http_header){"webhook-signature", line[0], 17};
            h[1] = (struct http_header){"webhook-id", "msg_1", 10};
            h[2] = (struct http_header){"webhook-timestamp", ts, 17};
            nh = 3;
            break;
        }
        case SIGNATURE_HMAC_SHA256:
            s.header = "X-Signature";
            s.base64 = 1;
            hmac(signer, "", 0, body, body_len, mac);
            EVP_EncodeBlock((unsigned char *)line[0], mac, 32);
            h[0] = (struct http_header){"X-Signature", line[0], 11};
            break;
        case SIGNATURE_WECHATPAY_V3:
        case SIGNATURE_ALIPAY_RSA2: {
            s.public_key_count = 1;
            s.public_keys[0].key = rsa;
            s.public_keys[0].serial = "S1";
            int wx = bc->scheme == SIGNATURE_WECHATPAY_V3;
            size_t tlen = wx ? strlen(ts) + 8 + body_len : flen;
            char *text = malloc(tlen + 1);
            if (!text)
                return 1;
            if (wx)
                snprintf(text, tlen + 1, "%s\nnonce\n%s\n", ts, body);
            else
                memcpy(text, form, flen + 1);
            unsigned char sig[512];
            size_t sig_len = sizeof sig;
            EVP_MD_CTX *ctx = EVP_MD_CTX_new();
            if (!ctx || EVP_DigestSignInit(ctx, NULL, EVP_sha256(), NULL, rsa) != 1 ||
                EVP_DigestSign(ctx, sig, &sig_len, (unsigned char *)text, tlen) != 1)
                return 1;
            EVP_MD_CTX_free(ctx);
            /* The reference: the bare verification of what is signed. */
            long rn = 0;
            double rc0 = cpu_s(), rw0 = wall_s();
            while (wall_s() - rw0 < seconds)
                for (int i = 0; i < 64; i++, rn++) {
                    EVP_MD_CTX *v = EVP_MD_CTX_new();
                    if (!v || EVP_DigestVerifyInit(v, NULL, EVP_sha256(), NULL, rsa) != 1 ||
                        EVP_DigestVerify(v, sig, sig_len, (unsigned char *)text, tlen) != 1)
                        return 1;
                    EVP_MD_CTX_free(v);
                }
            rsa_ref_us = (cpu_s() - rc0) * 1e6 / (double)rn;
            printf("| OpenSSL RSA-SHA256 verification, 2048-bit, of what %s signs (reference) "
                   "| %.2f | 1.00× |\n", bc->name, rsa_ref_us);
            static char sig64[800], encoded[2400];
            EVP_EncodeBlock((unsigned char *)sig64, sig, (int)sig_len);
            if (wx) {
                h[0] = (struct http_header){"Wechatpay-Timestamp", ts, 19};
                h[1] = (struct http_header){"Wechatpay-Nonce", "nonce", 15};
                h[2] = (struct http_header){"Wechatpay-Signature", sig64, 19};
                static struct http_header serial = {"Wechatpay-Serial", "S1", 16};
                h[3] = serial;
                nh = 4;
            } else {
                size_t o = 0;
                for (const char *p = sig64; *p; p++)
                    o += (size_t)(*p == '+' || *p == '/' || *p == '='
                                      ? sprintf(encoded + o, "%%%02X", *p)
                                      : sprintf(encoded + o, "%c", *p));
                snprintf(form + flen, 2048 + body_len - flen, "&sign_type=RSA2&sign=%s",
                         encoded);
                nh = 0;
            }
            free(text);
            break;
        }
        }
        struct http_msg m;
        memset(&m, 0, sizeof m);
        m.method = "POST";
        m.target = "/hooks";
        m.headers = h;
        m.header_count = nh;
        m.body = bc->scheme == SIGNATURE_ALIPAY_RSA2 ? form : body;
        m.body_len = strlen(m.body);
        const char *type;
        char detail[256];
        long n = 0;
        double c0 = cpu_s(), w0 = wall_s();
        while (wall_s() - w0 < seconds) {
            for (int i = 0; i < 256; i++, n++)
                if (signature_check(&s, &m, now * 1000, &type, detail, sizeof detail) != 0) {
                    fprintf(stderr, "idem-signature-bench: %s: refused: %s\n", bc->name, detail);
                    return 1;
                }
        }
        double us = (cpu_s() - c0) * 1e6 / (double)n;
        int rsa_scheme = bc->scheme == SIGNATURE_WECHATPAY_V3 || bc->scheme == SIGNATURE_ALIPAY_RSA2;
        printf("| signature_check, %s | %.2f | %.2f× |\n", bc->name, us,
               us / (rsa_scheme ? rsa_ref_us : ref_us));
    }
    EVP_PKEY_free(rsa);
    free(form);
    free(body);
    return 0;
}
