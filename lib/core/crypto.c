/* SPDX-License-Identifier: Apache-2.0 */
/* Tokens from the CSPRNG and request fingerprints (core layer). Both are
 * OpenSSL: RAND_bytes is thread-safe with a per-thread DRBG in OpenSSL 3.
 *
 * RAND_bytes has a fixed cost per call (about half of a token issue when
 * called per token), so each thread draws 1 KiB at a time and hands out 24
 * bytes per token. A child process must never reuse its parent's bytes: a
 * fork bumps a generation number, and a buffer from an older generation is
 * thrown away. */
#include "crypto.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "error.h"

#define POOL_BYTES 1008 /* a multiple of 24: whole tokens */

static atomic_uint fork_generation;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void on_fork_child(void)
{
    atomic_fetch_add(&fork_generation, 1);
}

static void install_atfork(void)
{
    pthread_atfork(NULL, NULL, on_fork_child);
}

struct pool {
    unsigned char bytes[POOL_BYTES];
    size_t used;
    unsigned generation;
};

static _Thread_local struct pool pool = {.used = POOL_BYTES};

/* n random bytes (n divides POOL_BYTES). 0, or -1 when the CSPRNG fails. */
static int random_bytes(unsigned char *out, size_t n)
{
    pthread_once(&atfork_once, install_atfork);
    unsigned gen = atomic_load(&fork_generation);
    if (pool.used + n > POOL_BYTES || pool.generation != gen) {
        if (RAND_bytes(pool.bytes, (int)sizeof pool.bytes) != 1)
            return -1;
        pool.used = 0;
        pool.generation = gen;
    }
    memcpy(out, pool.bytes + pool.used, n);
    /* Bytes handed out are not kept around. */
    memset(pool.bytes + pool.used, 0, n);
    pool.used += n;
    return 0;
}

static const char b64url[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

idem_rc idem__random_token(char out[IDEM_TOKEN_LEN + 1])
{
    /* 24 bytes = 192 bits = 32 base64 characters, no padding needed. */
    unsigned char raw[IDEM_TOKEN_LEN / 4 * 3];
    _Static_assert(POOL_BYTES % sizeof raw == 0, "tokens must tile the pool");
    if (random_bytes(raw, sizeof raw) != 0)
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

/* SHA-256, fetched once. Passing EVP_sha256() to each digest makes
 * OpenSSL 3 look the algorithm up again on every call (a property query,
 * a lock, allocations): a fixed cost larger than hashing a request body. */
static EVP_MD *sha256;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void fetch_sha256(void)
{
    sha256 = EVP_MD_fetch(NULL, "SHA2-256", NULL);
}

IDEM_EXTERN idem_rc idem_fingerprint(const void *data, size_t len,
                                     uint8_t out[IDEM_FINGERPRINT_LEN])
{
    idem__clear_detail();
    if (!out || (!data && len))
        return idem__fail(IDEM_EINVAL, "fingerprint: NULL argument");
    pthread_once(&sha256_once, fetch_sha256);
    if (!sha256)
        return idem__fail(IDEM_ESTORE, "SHA-256 is not available from OpenSSL");
    /* A context per call: two small allocations, against a context kept
     * per thread, whose destructor would be left in unmapped code by a
     * host that unloads the library while those threads live on. */
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx)
        return idem__fail(IDEM_ENOMEM, "fingerprint: allocating a digest context");
    unsigned int n = 0;
    int ok = EVP_DigestInit_ex2(ctx, sha256, NULL) == 1 &&
             EVP_DigestUpdate(ctx, data ? data : "", len) == 1 &&
             EVP_DigestFinal_ex(ctx, out, &n) == 1 && n == IDEM_FINGERPRINT_LEN;
    EVP_MD_CTX_free(ctx);
    return ok ? IDEM_OK : idem__fail(IDEM_ESTORE, "SHA-256 failed");
}
