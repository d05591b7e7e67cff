/* SPDX-License-Identifier: Apache-2.0 */
/*
 * signature_config.h — a route's signature: section, read beside the
 * check (signature.h) over the shared value parsers.
 */
#ifndef IDEM_SERVER_SIGNATURE_CONFIG_H
#define IDEM_SERVER_SIGNATURE_CONFIG_H

#include "config_value.h"

struct signature;

/* signature: { scheme, secrets, tolerance, header, encoding, prefix } in
 * n, into *out (malloc'd; signature_free). 0, or -1 having said why. */
int config_get_signature(struct config_ctx *c, const yaml_node_t *n, const char *path,
                         struct signature **out);
/* signature: as config_get_signature reads it back, at indent: its
 * secrets and apiv3_key by the env: or file: they are read from, its
 * public keys by their files. */
struct config_out;
void config_print_signature(struct config_out *o, int indent, const struct signature *s);

#endif
