/* SPDX-License-Identifier: Apache-2.0 */
/*
 * key_part_config.c — one key part read from the configuration
 * (key_part.h), for key: and states.field alike, and printed back.
 */
#include "gateway/key_part.h"

#include "config_print.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One part of a key. Routes take header, json, query, path_segment and
 * form; consumers (for_consumer) header, json, form and message_id, since
 * a message has no path or query. */
int config_get_key_part(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct key_part *k, int for_consumer)
{
    /* In the order of enum key_source up to path_segment, then message_id,
     * then form (KEY_FORM). */
    static const char *const known[] = {"header", "json", "query", "path_segment",
                                        "message_id", "form", "wechatpay_resource"};
    const yaml_node_t *v = NULL;
    const char *s = NULL;
    char fpath[96];
    size_t given = 0, which = 0;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping like { header: Idempotency-Key }"
                           ", got %s", config_kind_name(n));
    if (config_check_fields(c, n, path, known, 7))
        return -1;
    for (size_t i = 0; i < 7; i++) {
        const yaml_node_t *x = config_field(c, n, known[i]);
        if (x) {
            given++;
            v = x;
            which = i;
        }
    }
    if (given != 1)
        return config_fail(c, n, path, for_consumer
                           ? "give exactly one of header, json, form, message_id, "
                             "wechatpay_resource (a list of such mappings makes a composite key)"
                           : "give exactly one of header, json, query, path_segment, form, "
                             "wechatpay_resource (a list of such mappings makes a composite "
                             "key)");
    config_join(fpath, sizeof fpath, path, known[which]);
    if (which == 4 && !for_consumer)
        return config_fail(c, v, fpath, "only a consumer's messages have ids; a route takes "
                           "header, json, query, path_segment or form");
    if ((which == KEY_QUERY || which == KEY_PATH_SEGMENT) && for_consumer)
        return config_fail(c, v, fpath, "a message has no %s; a consumer takes header, json, "
                           "form or message_id", which == KEY_QUERY ? "query" : "path");
    if (which == 4) {
        int yes = 0;
        if (config_get_choice(c, v, fpath, "false", "true", &yes))
            return -1;
        if (!yes)
            return config_fail(c, v, fpath, "message_id: false names no key part; say true, or "
                               "give header or json");
        k->source = KEY_HEADER;
        return (k->name = strdup(CONSUMER_MESSAGE_ID_HEADER)) ? 0 : config_oom(c);
    }
    k->source = which == 5 ? KEY_FORM : which == 6 ? KEY_WECHATPAY_RESOURCE : (enum key_source)which;
    switch (k->source) {
    case KEY_HEADER:
        if (config_get_header_name(c, v, fpath, &s))
            return -1;
        if (for_consumer && !strcasecmp(s, CONSUMER_MESSAGE_ID_HEADER))
            return config_fail(c, v, fpath, "%s is where the consumer puts the message's id: say "
                               "message_id: true", config_quote(c, s));
        break;
    case KEY_JSON:
    case KEY_WECHATPAY_RESOURCE:
        if (config_get_json_field(c, v, fpath, &s))
            return -1;
        break;
    case KEY_QUERY:
    case KEY_FORM:
        if (config_scalar(c, v, fpath, k->source == KEY_FORM ? "a form field name"
                                                             : "a query parameter name", &s))
            return -1;
        if (!*s || strlen(s) > FIELD_MAX_LEN || strcspn(s, "&=# \t") != strlen(s))
            return config_fail(c, v, fpath, "%s is not a %s name (1 to 255 bytes, without & = # "
                               "or blanks)", config_quote(c, s),
                               k->source == KEY_FORM ? "form field" : "query parameter");
        if (config_has_control(s))
            return config_fail(c, v, fpath, "%s holds a control character", config_quote(c, s));
        break;
    case KEY_PATH_SEGMENT: {
        uint64_t seg;
        if (config_get_count(c, v, fpath, 1, 64, &seg))
            return -1;
        k->segment = (int)seg;
        return 0;
    }
    }
    return (k->name = strdup(s)) ? 0 : config_oom(c);
}

void config_print_key_part(struct config_out *o, int indent, const struct key_part *k,
                           int for_consumer)
{
    /* In the order of enum key_source. */
    static const char *const names[] = {"header", "json", "query", "path_segment", "form",
                                         "wechatpay_resource"};
    if (k->source == KEY_HEADER && for_consumer &&
        !strcasecmp(k->name, CONSUMER_MESSAGE_ID_HEADER))
        config_put_bool(o, indent, "message_id", 1);
    else if (k->source == KEY_PATH_SEGMENT)
        config_put_count(o, indent, names[k->source], (uint64_t)k->segment);
    else
        config_put_str(o, indent, names[k->source], k->name);
}
