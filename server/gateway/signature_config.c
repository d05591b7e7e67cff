/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature_config.c — a route's signature: section (signature_config.h).
 * The secrets come from the environment or a file, never from the YAML,
 * several at once for a rotation.
 */
#include "gateway/signature_config.h"

#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "gateway/signature.h"

#define SECRET_MIN 16 /* bytes: a shorter secret can be guessed */

static const char *const schemes[] = {"stripe", "github", "standard_webhooks", "hmac_sha256"};

/* One secret, as the scheme takes it: a whsec_<base64> for Standard
 * Webhooks (its bytes are the key), the text itself for the others. */
static int get_secret(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      enum signature_scheme scheme, struct signature_secret *out)
{
    static const char *const known[] = {"env", "file"};
    char buf[SECRET_MAX + 2];
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected { env: NAME } or { file: PATH }: a secret is "
                           "never written in this file");
    if (config_get_secret(c, n, path, known, 2, buf))
        return -1;
    size_t len = strlen(buf);
    unsigned char *key = malloc(len + 3);
    if (!key)
        return config_oom(c);
    if (scheme == SIGNATURE_STANDARD_WEBHOOKS) {
        long got = strncmp(buf, "whsec_", 6) == 0 ? base64_decode(buf + 6, len - 6, key) : -1;
        if (got < SECRET_MIN) {
            free(key);
            return config_fail(c, n, path, "a standard_webhooks secret is whsec_ and the "
                               "base64 of at least %d bytes", SECRET_MIN);
        }
        len = (size_t)got;
    } else {
        if (len < SECRET_MIN) {
            free(key);
            return config_fail(c, n, path, "the secret is %zu bytes; at least %d", len,
                               SECRET_MIN);
        }
        memcpy(key, buf, len);
    }
    memset(buf, 0, sizeof buf);
    out->key = key;
    out->len = len;
    return 0;
}

static int get_signature(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature *s)
{
    static const char *const fields[] = {"scheme", "secrets", "tolerance", "header",
                                         "encoding", "prefix"};
    char fpath[128];
    const yaml_node_t *v;
    int scheme;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping (signature: { scheme: stripe, "
                           "secrets: [{ env: NAME }] })");
    if (config_check_fields(c, n, path, fields, sizeof fields / sizeof fields[0]))
        return -1;
#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if (!(v = FIELD("scheme")))
        return config_fail(c, n, path, "scheme is required: stripe, github, standard_webhooks "
                           "or hmac_sha256");
    if (config_get_enum(c, v, fpath, "stripe, github, standard_webhooks or hmac_sha256",
                        schemes, sizeof schemes / sizeof schemes[0], NULL,
                        &scheme))
        return -1;
    s->scheme = (enum signature_scheme)scheme;
    int own = s->scheme == SIGNATURE_HMAC_SHA256;
    int timed = s->scheme == SIGNATURE_STRIPE || s->scheme == SIGNATURE_STANDARD_WEBHOOKS;
    static const char *const own_fields[] = {"header", "encoding", "prefix"};
    for (size_t i = 0; !own && i < sizeof own_fields / sizeof own_fields[0]; i++)
        if ((v = FIELD(own_fields[i])))
            return config_fail(c, v, fpath, "%s is for scheme hmac_sha256; %s names its own "
                               "header", own_fields[i], schemes[scheme]);
    if ((v = FIELD("tolerance"))) {
        if (!timed)
            return config_fail(c, v, fpath, "%s signs no timestamp: tolerance is for stripe "
                               "and standard_webhooks", schemes[scheme]);
        if (config_get_duration(c, v, fpath, 1000, MS_DAY, &s->tolerance_ms))
            return -1;
    }
    if (own) {
        const char *h;
        if (!(v = FIELD("header")))
            return config_fail(c, n, path, "header is required with hmac_sha256 (e.g. header: "
                               "X-Signature)");
        if (config_get_header_name(c, v, fpath, &h) || config_set_string(&s->header, h))
            return -1;
        if ((v = FIELD("encoding")) &&
            config_get_choice(c, v, fpath, "hex", "base64", &s->base64))
            return -1;
        if ((v = FIELD("prefix"))) {
            const char *p;
            if (config_scalar(c, v, fpath, "a prefix such as sha256=", &p))
                return -1;
            if (!*p || strlen(p) > 32 || config_has_control(p))
                return config_fail(c, v, fpath, "a prefix is 1 to 32 printable bytes");
            if (config_set_string(&s->prefix, p))
                return config_oom(c);
        }
    }
    if (!(v = FIELD("secrets")))
        return config_fail(c, n, path, "secrets is required (e.g. secrets: [{ env: "
                           "WEBHOOK_SECRET }]): one or more, for a rotation");
    yaml_node_item_t *it = NULL;
    size_t count = 0;
    if (config_list_items(c, v, fpath, "a list of secrets", &it, &count))
        return -1;
    if (count == 0 || count > SIGNATURE_SECRETS_MAX)
        return config_fail(c, v, fpath, "%zu secrets; give 1 to %d", count,
                           SIGNATURE_SECRETS_MAX);
    for (size_t i = 0; i < count; i++) {
        char ipath[160];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", fpath, i);
        if (get_secret(c, config_node(c, it[i]), ipath, s->scheme, &s->secrets[i]))
            return -1;
        s->secret_count++;
    }
#undef FIELD
    return 0;
}

int config_get_signature(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature **out)
{
    struct signature *s = calloc(1, sizeof *s);
    if (!s)
        return config_oom(c);
    s->tolerance_ms = 5 * MS_MIN;
    if (get_signature(c, n, path, s)) {
        signature_free(s);
        return -1;
    }
    *out = s;
    return 0;
}
