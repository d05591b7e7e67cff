/* SPDX-License-Identifier: Apache-2.0 */
/*
 * base64.h — RFC 4648 base64, the standard alphabet (daemon): the JSON
 * API's result_base64 both ways, and the secrets and signatures of signed
 * callbacks.
 */
#ifndef IDEM_SERVER_BASE64_H
#define IDEM_SERVER_BASE64_H

#include <stddef.h>

/* The encoded length of len bytes, with padding, without the NUL. */
#define BASE64_LEN(len) (((len) + 2) / 3 * 4)

/* len bytes to out (BASE64_LEN(len) + 1 bytes), padded, NUL-terminated. */
void base64_encode(const void *data, size_t len, char *out);

/* n characters of s to out (at least n / 4 * 3 + 3 bytes): the decoded
 * length, or -1 when s is not base64: a character outside the alphabet,
 * padding anywhere but where it completes the last group of four, or a
 * last group of one character. Padding may be left out. */
long base64_decode(const char *s, size_t n, unsigned char *out);

#endif
