/* SPDX-License-Identifier: Apache-2.0 */
/*
 * seeded_hash.h — a hash of a client's name (an address, a subject) with a
 * seed of this process's (daemon): what the tables a client can fill are
 * keyed by, so that nobody can aim names at one place of them.
 */
#ifndef IDEM_SERVER_SEEDED_HASH_H
#define IDEM_SERVER_SEEDED_HASH_H

#include <openssl/rand.h>
#include <stddef.h>
#include <stdint.h>

/* A seed from the CSPRNG (or, failing that, from salt, an address). */
static inline uint64_t seeded_hash_seed(const void *salt)
{
    uint64_t seed;
    if (RAND_bytes((unsigned char *)&seed, sizeof seed) != 1)
        seed = (uint64_t)(uintptr_t)salt * 0x9e3779b97f4a7c15u;
    return seed;
}

/* FNV-1a from the seed, then a final mix, so that every bit of the result
 * depends on every byte; never 0 (which the tables keep for "empty"). */
static inline uint64_t seeded_hash(uint64_t seed, const char *s, size_t len)
{
    uint64_t h = 0xcbf29ce484222325u ^ seed;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3u;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 33;
    return h ? h : 1;
}

#endif
