/* Tokens from the CSPRNG and request fingerprints (core layer). Both are
 * OpenSSL: RAND_bytes is thread-safe with a per-thread DRBG in OpenSSL 3. */
#include "crypto.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "error.h"

static const char b64url[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

idem_rc idem__random_token(char out[IDEM_TOKEN_LEN + 1])
{
    /* 24 bytes = 192 bits = 32 base64 characters, no padding needed. */
    unsigned char raw[IDEM_TOKEN_LEN / 4 * 3];
    if (RAND_bytes(raw, (int)sizeof raw) != 1)
        return idem__fail(IDEM_ESTORE, "RAND_bytes failed: no entropy");
    char *o = out;
    for (size_t i = 0; i < sizeof raw; i += 3) {
        unsigned v = (unsigned)raw[i] << 16 | (unsigned)raw[i + 1] << 8 | raw[i + 2];
        *o++ = b64url[v >> 18 & 63];
        *o++ = b64url[v >> 12 & 63];
        *o++ = b64url[v >> 6 & 63];
        *o++ = b64url[v & 63];
    }
    *o = '\0';
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_fingerprint(const void *data, size_t len,
                                     uint8_t out[IDEM_FINGERPRINT_LEN])
{
    idem__clear_detail();
    if (!out || (!data && len))
        return idem__fail(IDEM_EINVAL, "fingerprint: NULL argument");
    unsigned int n = 0;
    if (EVP_Digest(data ? data : "", len, out, &n, EVP_sha256(), NULL) != 1 ||
        n != IDEM_FINGERPRINT_LEN)
        return idem__fail(IDEM_ESTORE, "SHA-256 failed");
    return IDEM_OK;
}
