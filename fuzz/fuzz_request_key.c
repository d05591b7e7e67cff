/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_request_key.c — business keys and fingerprints from what a client
 * sends: the input is an HTTP request (parsed by the strict parser first,
 * as the daemon does), and every key source runs on it — header, JSON field
 * (nested), query parameter, path segment, form field, a composite, per
 * subject.
 * Whatever comes out must be a key Idem accepts: 1..255 bytes of UTF-8, no
 * control characters (idem_check_key()).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/request_key.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_key(const char *key)
{
    if (idem_check_key(key) != IDEM_OK)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct http_limits limits = {4096, 64, 16384, 65536};
    struct http_parser p;
    size_t used;
    http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
    enum http_parse_status st = http_parser_feed(&p, (const char *)data, size, &used);
    struct http_msg *m = st == HTTP_DONE ? http_parser_take(&p) : NULL;
    http_parser_free(&p);
    if (!m)
        return 0;

    struct key_part header = {KEY_HEADER, "Idempotency-Key", 0};
    struct key_part json = {KEY_JSON, "payment.serial_no", 0};
    struct key_part query = {KEY_QUERY, "id", 0};
    struct key_part segment = {KEY_PATH_SEGMENT, NULL, 2};
    struct key_part form = {KEY_FORM, "out_trade_no", 0};
    struct key_part composite[] = {header, json, query, segment, form};
    char *fields[] = {"amount", "payment.serial_no"};
    struct route rt;
    memset(&rt, 0, sizeof rt);
    rt.name = "fuzz";
    rt.fingerprint_fields = fields;
    rt.fingerprint_field_count = 2;
    struct key_part *parts[] = {&header, &json, &query, &segment, &form, composite};
    size_t counts[] = {1, 1, 1, 1, 1, 5};
    for (size_t i = 0; i < 6; i++)
        for (int scoped = 0; scoped < 2; scoped++) {
            char key[IDEM_KEY_MAX + 1], detail[512];
            const char *type = NULL;
            rt.key = parts[i];
            rt.key_parts = counts[i];
            rt.scope_subject = scoped;
            if (request_key(&rt, m, http_msg_header(m, "X-Subject"), key, &type, detail,
                            sizeof detail) == 0)
                check_key(key);
            else if (!type || !*detail)
                abort(); /* every refusal says what was wrong */
        }
    for (int kind = FINGERPRINT_BODY; kind <= FINGERPRINT_NONE; kind++) {
        uint8_t fp[IDEM_FINGERPRINT_LEN];
        int has;
        char detail[512];
        rt.fingerprint = (enum fingerprint_kind)kind;
        if (request_fingerprint(&rt, m, fp, &has, detail, sizeof detail) == 0 &&
            has != (kind != FINGERPRINT_NONE))
            abort();
    }
    http_msg_free(m);
    return 0;
}
