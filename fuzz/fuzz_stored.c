/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_stored.c — stored responses: the bytes a record holds, which the
 * gateway decodes to replay. A record may have been written by another
 * program through the JSON API, so any bytes must decode or be refused
 * cleanly; and whatever decodes must encode back to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/stored.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_response *r = stored_decode(data, size);
    if (!r)
        return 0;
    size_t len = 0;
    char *again = stored_encode_response(r, &len);
    if (again) {
        /* A decoded answer re-encodes to what was stored (the format has one
         * spelling per answer). */
        if (len != size || memcmp(again, data, size) != 0)
            abort();
        free(again);
    }
    response_free(r);
    return 0;
}
