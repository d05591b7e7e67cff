/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target for server/config.c: any bytes as an idem.yaml. The parser must
 * accept or refuse them with a message, never crash, hang, leak or blow up
 * (aliases, deep nesting, huge counts), and whatever it accepts must hold the
 * invariants the daemon relies on, and print back (idem serve -T) as a file
 * that is accepted and prints the same text again. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Not assert(): release builds define NDEBUG, and these must always hold. */
#define CHECK(x)                                                                 \
    do {                                                                         \
        if (!(x))                                                                \
            abort();                                                             \
    } while (0)

static void check(const struct server_config *c)
{
    /* Port 0 is valid: the system picks one. */
    CHECK(c->listen_host && c->listen_port >= 0 && c->listen_port <= 65535);
    CHECK(!c->admin_host || (c->admin_port >= 0 && c->admin_port <= 65535));
    CHECK(!c->admin_host || strcmp(c->admin_host, c->listen_host) != 0 ||
          c->admin_port != c->listen_port || c->listen_port == 0);
    CHECK(c->workers == 0 || (c->workers >= 1 && c->workers <= 4096)); /* ignored */
    CHECK(c->event_loops >= 0 && c->event_loops <= 16);
    CHECK(c->storage_kind && c->storage_path && c->subject_header);
    CHECK(c->route_count <= 1000);
    for (size_t i = 0; i < c->route_count; i++) {
        const struct route *r = &c->routes[i];
        CHECK(r->name && r->space && r->token_scene && r->path);
        CHECK(r->path[0] == '/');
        CHECK(!r->prefix || r->path[strlen(r->path) - 1] == '/');
        CHECK(r->upstream.host && r->upstream.base_path);
        CHECK(r->upstream.port >= 1 && r->upstream.port <= 65535);
        CHECK(r->key_parts >= 1 && r->key_parts <= 8);
        for (size_t k = 0; k < r->key_parts; k++)
            CHECK(r->key[k].source == KEY_PATH_SEGMENT ? r->key[k].segment >= 1
                                                        : r->key[k].name != NULL);
        CHECK(r->lease_ms >= 1 && r->wait_timeout_ms >= 1);
        CHECK(r->fingerprint != FINGERPRINT_FIELDS || r->fingerprint_field_count >= 1);
        for (size_t j = 0; j < r->replay_header_count; j++)
            CHECK(r->replay_headers[j] && strcmp(r->replay_headers[j], "connection"));
    }
}

/* c printed, as -T prints it; free() it. */
static char *print(const struct server_config *c, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    CHECK(f);
    CHECK(config_print(f, c) == 0);
    fclose(f);
    return text;
}

/* Printed, read back and printed again: the same text. */
static void check_printed(const struct server_config *c)
{
    size_t len, len2;
    char *one = print(c, &len), *two, err[256];
    struct server_config *again = NULL;
    if (len > 1024 * 1024) {
        /* Every default written out can take a file near the limits
         * (1 MiB, 1000 routes) past the parser's 1 MiB. */
        free(one);
        return;
    }
    CHECK(config_parse(one, len, "printed.yaml", &again, err, sizeof err) == 0);
    two = print(again, &len2);
    CHECK(len == len2 && memcmp(one, two, len) == 0);
    free(one);
    free(two);
    config_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct server_config *c = NULL;
    char err[256];
    if (config_parse((const char *)data, size, "fuzz.yaml", &c, err, sizeof err) == 0) {
        check(c);
        check_printed(c);
    } else {
        CHECK(c == NULL);
        CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err));
    }
    config_free(c);
    return 0;
}
