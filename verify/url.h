/* SPDX-License-Identifier: Apache-2.0 */
/*
 * url.h — the http:// URLs idem verify is given (the target, --channel,
 * --count-url), and the rule that keeps it a good citizen: it talks to the
 * target's host, or to loopback, and to nothing else.
 */
#ifndef IDEM_VERIFY_URL_H
#define IDEM_VERIFY_URL_H

#include <stddef.h>
#include <sys/socket.h>

#define VURL_HOST_MAX 255

struct vurl {
    char host[VURL_HOST_MAX + 1];  /* a name or an address; IPv6 without brackets */
    int port;                      /* 1..65535; 80 (443 for https) when absent */
    int tls;                       /* https:// */
    char authority[VURL_HOST_MAX + 10]; /* for Host: "host[:port]", IPv6 in brackets */
    char *target;                  /* path and query ("/" when empty); may hold
                                      {{placeholders}}; owned */
    /* Filled by vurl_resolve(): the one address every request goes to. */
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int loopback;
};

/* Parse "http://host[:port][/path][?query]" or https:// (TLS: see
 * xchg_tls_init). Refuses user:password@, a fragment, placeholders outside
 * the path and query, and spaces or control characters. 0, or -1 with err
 * saying why. */
int vurl_parse(const char *text, struct vurl *u, char *err, size_t errlen);

/* Resolve the host once (getaddrinfo; the first address). 0 or -1 + err. */
int vurl_resolve(struct vurl *u, char *err, size_t errlen);

/* May idem verify send to u when it verifies target? Yes when u names the
 * same host, resolves to the same address, or is loopback. Both resolved. */
int vurl_allowed(const struct vurl *u, const struct vurl *target);

/* "127.0.0.1:8080" (IPv6 in brackets), for messages. */
const char *vurl_addr_text(const struct vurl *u, char *buf, size_t len);

void vurl_free(struct vurl *u);

#endif
