/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls.h — OpenSSL for the daemon's listeners and its https:// upstreams
 * (daemon): the contexts, made from the configuration's files, with
 * TLS 1.2 as the least and the ciphers and options set once here.
 */
#ifndef IDEM_SERVER_TLS_H
#define IDEM_SERVER_TLS_H

#include <stddef.h>

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

/* A listener's context, replaced whole on SIGHUP (a connection keeps the
 * one it was accepted with). */
struct tls_server;

/* From a certificate chain file (PEM, the leaf first) and its private key;
 * with client_ca, a client must show a certificate that CA signed. NULL
 * with err saying which file and why. */
struct tls_server *tls_server_new(const char *cert, const char *key, const char *client_ca,
                                  char *err, size_t errlen);
/* The files read again into a new context for the connections accepted
 * from now on; on failure the running one stays and err says why. 0 or -1. */
int tls_server_reload(struct tls_server *t, const char *cert, const char *key,
                      const char *client_ca, char *err, size_t errlen);
/* A new SSL for an accepted connection, or NULL (out of memory). Any
 * thread. */
SSL *tls_server_ssl(struct tls_server *t);
void tls_server_free(struct tls_server *t);

/* A context for https:// upstreams: certificates verified against ca_file
 * (PEM), or the system's store when ca_file is NULL. NULL with err. */
SSL_CTX *tls_client_ctx(const char *ca_file, char *err, size_t errlen);
/* An SSL to connect to host with: its name sent (SNI) and required of the
 * certificate. NULL when out of memory. */
SSL *tls_client_ssl(SSL_CTX *ctx, const char *host);
void tls_client_ctx_free(SSL_CTX *ctx);

/* ctx presents cert (a PEM chain, its own first) with key: 0, or -1 with
 * err naming the file and OpenSSL's reason. A server's own, or a client's
 * certificate. */
int tls_ctx_use_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen);

/* What went wrong in the last TLS call of this thread, as text. */
void tls_error(char *buf, size_t len);

#endif
