/* SPDX-License-Identifier: Apache-2.0 */
/*
 * key_part.h — one part of a key as the configuration gives it: where a
 * request (or a message) holds it. A route's and a consumer's key: is one
 * or more of them, and their states.field one; request_key.c reads them
 * from a request, key_part_config.c from the file.
 */
#ifndef IDEM_SERVER_GATEWAY_KEY_PART_H
#define IDEM_SERVER_GATEWAY_KEY_PART_H

#include "config_value.h"

enum key_source {
    KEY_HEADER,       /* { header: Idempotency-Key } */
    KEY_JSON,         /* { json: refund_no }  (a top-level field; "a.b" for nested) */
    KEY_QUERY,        /* { query: id } */
    KEY_PATH_SEGMENT, /* { path_segment: 2 }  (1-based: /refunds/R-1 -> 2 is R-1) */
    KEY_FORM,         /* { form: out_trade_no }  (a form-encoded body's field) */
    KEY_WECHATPAY_RESOURCE, /* { wechatpay_resource: out_refund_no }  (a field of a
                               WeChat Pay notification's resource, decrypted with
                               the route's signature.apiv3_key) */
};

/* A consumer's { message_id: true }: the message's id, which the consumer
 * puts in this header of the request it hands the gateway (and of its POST
 * to the handler), in place of any the message carried. */
#define CONSUMER_MESSAGE_ID_HEADER "Idem-Message-Id"

struct key_part {
    enum key_source source;
    char *name;  /* header, JSON field, query parameter or form field */
    int segment; /* KEY_PATH_SEGMENT */
};

/* One key part (for_consumer: header, json, form, message_id,
 * wechatpay_resource), as key: and states.field take them. 0, or -1 having
 * said why. */
int config_get_key_part(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct key_part *k, int for_consumer);
/* k as config_get_key_part reads it back: its one line (header: "X"),
 * message_id: true for a consumer's message id. */
struct config_out;
void config_print_key_part(struct config_out *o, int indent, const struct key_part *k,
                           int for_consumer);

#endif
