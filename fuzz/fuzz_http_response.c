/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_http_response.c — libFuzzer target for server/http/http_parser.c in
 * response mode (what an upstream answers idem serve). It is the driver of
 * fuzz_http_request.c, included here in response mode, so both modes are
 * checked the same way: every cut of the stream parses alike, limits hold,
 * allocation failures end cleanly. A bit of the input's hash says whether
 * the request was HEAD, so a response is tried both with and without a body.
 */
#define FUZZ_HTTP_MODE HTTP_PARSE_RESPONSE
#include "fuzz_http_request.c"
