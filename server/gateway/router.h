/* SPDX-License-Identifier: Apache-2.0 */
/*
 * router.h — which route takes a request (router.c).
 */
#ifndef IDEM_SERVER_ROUTER_H
#define IDEM_SERVER_ROUTER_H

#include "config.h"
#include "http/http_parser.h"
#include "http/response.h"

/* The route for request m, whose target's path is path (whole, never cut),
 * or NULL for none: pass it through. *refused, when set, is the answer
 * instead (400 path_not_canonical): a path an upstream may read as a
 * route's path ("." or ".." segments, "//", a ';', another spelling of a
 * route's path while a default upstream is configured). */
const struct route *router_match(const struct server_config *cfg, const struct http_msg *m,
                                 const char *path, struct http_response **refused);

#endif
