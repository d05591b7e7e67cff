/*
 * admin.c — the admin listener's door (daemon).
 *
 * Every request on admin_listen names an API key: "Authorization: Bearer
 * KEY". The configuration holds each key's SHA-256, never its text; a
 * request's key is hashed once and compared with every configured hash in
 * constant time, so neither which key matched nor how much of a guess did
 * shows in the time an answer takes. A read key may GET and HEAD (records,
 * metrics, health); a write key may do everything. What a refusal costs
 * the refused, and how repeated failures are slowed down, is serve.c's.
 */
#include "admin.h"

#include <string.h>
#include <strings.h>

#include "idem.h"

static int same_hash(const unsigned char *a, const unsigned char *b)
{
    unsigned char diff = 0;
    for (size_t i = 0; i < 32; i++)
        diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

const struct api_key *admin_key(const struct server_config *cfg, const struct http_msg *m)
{
    if (http_msg_header_alike_count(m, "Authorization") != 1)
        return NULL;
    const char *v = http_msg_header(m, "Authorization");
    if (!v || strncasecmp(v, "Bearer ", 7) != 0)
        return NULL;
    v += 7;
    while (*v == ' ')
        v++;
    unsigned char h[32];
    if (!*v || idem_fingerprint(v, strlen(v), h) != IDEM_OK)
        return NULL;
    const struct api_key *found = NULL;
    for (size_t i = 0; i < cfg->api_key_count; i++) {
        int same = same_hash(h, cfg->api_keys[i].hash);
        found = same ? &cfg->api_keys[i] : found;
    }
    return found;
}

struct http_response *admin_refusal(const struct server_config *cfg, const struct api_key *key,
                                    const struct http_msg *m)
{
    struct http_response *r;
    if (!key) {
        if (cfg->api_key_count == 0)
            r = problem(401, "unauthorized",
                        "the admin listener takes requests with an API key only, and this "
                        "daemon has none: add one to api_keys (docs/security.md)");
        else if (!http_msg_header(m, "Authorization"))
            r = problem(401, "unauthorized",
                        "no API key: send Authorization: Bearer KEY, with a key of api_keys");
        else
            r = problem(401, "unauthorized", "the Authorization header names no API key of "
                        "this daemon (Authorization: Bearer KEY)");
        if (r)
            response_add_header(r, "WWW-Authenticate", "Bearer realm=\"idem\"");
        return r;
    }
    if (key->write || strcmp(m->method, "GET") == 0 || strcmp(m->method, "HEAD") == 0)
        return NULL;
    return problem(403, "insufficient_scope",
                   "API key %s has scope read (GET and HEAD only); %s needs a key of scope "
                   "write",
                   key->name, m->method);
}

size_t admin_peer_host(const char *peer)
{
    const char *colon = strrchr(peer, ':');
    return colon ? (size_t)(colon - peer) : strlen(peer);
}
