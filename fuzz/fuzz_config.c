/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz target for server/config.c: any bytes as an idem.yaml. The parser must
 * accept or refuse them with a message, never crash, hang, leak or blow up
 * (aliases, deep nesting, huge counts), and whatever it accepts must hold the
 * invariants the daemon relies on. */
#include <stdint.h>
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct server_config *c = NULL;
    char err[256];
    if (config_parse((const char *)data, size, "fuzz.yaml", &c, err, sizeof err) == 0) {
        check(c);
    } else {
        CHECK(c == NULL);
        CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err));
    }
    config_free(c);
    return 0;
}
