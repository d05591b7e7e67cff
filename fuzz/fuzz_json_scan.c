/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_json_scan.c — the body scan (server/gateway/json_scan.c) against the full
 * parse it stands in for. The input is a path, a newline, then a body. The
 * full parse (jansson, duplicates refused) and the lookup request_key.c uses
 * when the scan is unsure (request_json_field) give the reference. Whenever
 * the scan answers (anything but UNSURE), it must be that answer, with the
 * same bytes; and a body the full parse refuses must never get an answer from
 * the scan. A difference aborts: it would key a request one way where the
 * upstream reads the body another.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/json_scan.h"
#include "gateway/request_key.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nl = memchr(data, '\n', size);
    if (!nl || nl - data > 300)
        return 0;
    char path[301];
    memcpy(path, data, (size_t)(nl - data));
    path[nl - data] = '\0';
    if (strlen(path) != (size_t)(nl - data))
        return 0; /* a NUL in the path: configurations cannot hold one */
    const char *body = (const char *)nl + 1;
    size_t len = size - (size_t)(nl - data) - 1;

    /* Small and large room, as a key part (766 bytes) and less. */
    static const size_t caps[] = {8, 766};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        char got[766], want[766];
        enum json_scan r = json_scan_field(body, len, path, got, caps[i]);
        if (r == JSON_SCAN_UNSURE)
            continue;
        json_error_t err;
        json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
        if (!root)
            abort(); /* the scan answered a body the full parse refuses */
        int ref = request_json_field(root, path, want, caps[i]);
        json_decref(root);
        if ((int)r != ref)
            abort();
        if (r == JSON_SCAN_FOUND && strcmp(got, want) != 0)
            abort();
    }
    return 0;
}
