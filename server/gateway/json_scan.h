/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json_scan.h — one field of a JSON request body, without building a tree
 * (daemon).
 *
 * A key taken from the body ({ json: refund_no }) is read on every request.
 * A full parse (jansson) allocates a node per value and a table per object
 * to find one string. json_scan_field() reads the body once, checks it is
 * JSON with every member named once per object, and copies the one value.
 * It does so for the bodies clients send in practice; for the rest it says
 * JSON_SCAN_UNSURE, and the caller parses in full as before. That keeps one
 * rule for every body: what the scanner answers is what the full parse
 * (JSON_REJECT_DUPLICATES) answers — fuzz/fuzz_json_scan.c checks exactly
 * that — and every error message still comes from the full parse.
 *
 * Unsure: a body that is not a JSON object; any backslash escape; a control
 * character or invalid UTF-8 in a string; a number with an exponent, or an
 * integer of more than 18 digits, or a number of more than 300 characters;
 * nesting deeper than 16 or an object of more than 64 members; a member
 * named twice; anything not JSON; a path of 256 bytes or more, or without a
 * name in it.
 */
#ifndef IDEM_SERVER_JSON_SCAN_H
#define IDEM_SERVER_JSON_SCAN_H

#include <stddef.h>

enum json_scan {
    JSON_SCAN_UNSURE = -2, /* parse the body in full to know */
    JSON_SCAN_UNUSABLE = -1, /* there, but not a string or an integer, or a
                                string of cap bytes or more */
    JSON_SCAN_MISSING = 0, /* not there, or null */
    JSON_SCAN_FOUND = 1,   /* out holds it: a string as it is, an integer in
                              decimal */
};

/* The value at path ("payer.account": member account of member payer of the
 * top-level object; empty names between dots are skipped) in the len bytes
 * of body, into out (cap bytes). */
enum json_scan json_scan_field(const char *body, size_t len, const char *path, char *out,
                               size_t cap);

#endif
