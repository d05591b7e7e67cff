/* SPDX-License-Identifier: Apache-2.0 */
/* Randomness and hashing from OpenSSL's libcrypto. */
#ifndef IDEM_CORE_CRYPTO_H
#define IDEM_CORE_CRYPTO_H

#include "idem.h"

/* IDEM_TOKEN_LEN URL-safe characters from the CSPRNG, NUL-terminated. */
idem_rc idem__random_token(char out[IDEM_TOKEN_LEN + 1]);

#endif
