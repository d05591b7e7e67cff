/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tls.c — OpenSSL for the daemon's listeners and its https:// upstreams
 * (daemon).
 *
 * One policy for both sides: TLS 1.2 at least; for 1.2, forward-secret
 * AEAD suites only (ECDHE with AES-GCM or ChaCha20-Poly1305; 1.3 has
 * nothing else); no compression, no renegotiation, no session tickets
 * (a ticket key in memory that is never rotated would outlive every
 * certificate). A listener's files are read into a context at start and
 * on every SIGHUP; an accepted connection takes a reference to the context
 * of its moment, so a reload frees nothing in use. An upstream's
 * certificate is checked against the CA file (or the system's store) and
 * the upstream's host name, and a failed check is a handshake that fails:
 * nothing was sent.
 */
#include "http/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TLS12_CIPHERS "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:" \
                      "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:" \
                      "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

void tls_error(char *buf, size_t len)
{
    /* The first error queued is the cause ("no start line": not PEM), the
     * last what the call that failed made of it ("PEM lib"): both, by
     * their reasons, with the last's code for a search. */
    unsigned long first = ERR_get_error(), last = first, e = first;
    while ((e = ERR_get_error()) != 0)
        last = e;
    const char *cause = first ? ERR_reason_error_string(first) : NULL;
    const char *then = last != first ? ERR_reason_error_string(last) : NULL;
    if (cause && then && strcmp(cause, then) != 0)
        snprintf(buf, len, "%s, %s (OpenSSL error %08lx)", cause, then, last);
    else if (cause)
        snprintf(buf, len, "%s (OpenSSL error %08lx)", cause, first);
    else if (last)
        ERR_error_string_n(last, buf, len);
    else
        snprintf(buf, len, "no detail from OpenSSL");
}

static int policy(SSL_CTX *ctx)
{
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_NO_TICKET | SSL_OP_CIPHER_SERVER_PREFERENCE);
    return SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1 &&
           SSL_CTX_set_cipher_list(ctx, TLS12_CIPHERS) == 1;
}

struct tls_server {
    pthread_mutex_t mu;
    SSL_CTX *ctx;
};

int tls_ctx_use_cert(SSL_CTX *ctx, const char *cert, const char *key, char *err, size_t errlen)
{
    char why[256];
    const char *step = cert;
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) == 1) {
        step = key;
        if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) == 1 &&
            SSL_CTX_check_private_key(ctx) == 1)
            return 0;
    }
    tls_error(why, sizeof why);
    snprintf(err, errlen, "TLS: %s: %s", step, why);
    return -1;
}

static SSL_CTX *server_ctx(const char *cert, const char *key, const char *client_ca, char *err,
                           size_t errlen)
{
    char why[256];
    const char *step = "making a context";
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    ERR_clear_error();
    if (!ctx || !policy(ctx))
        goto fail;
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_num_tickets(ctx, 0); /* TLS 1.3 sends two unless told */
    if (tls_ctx_use_cert(ctx, cert, key, err, errlen) != 0) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (client_ca) {
        step = client_ca;
        STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(client_ca);
        if (!names || SSL_CTX_load_verify_locations(ctx, client_ca, NULL) != 1) {
            sk_X509_NAME_pop_free(names, X509_NAME_free);
            goto fail;
        }
        SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    }
    return ctx;
fail:
    tls_error(why, sizeof why);
    snprintf(err, errlen, "TLS: %s: %s", step, why);
    SSL_CTX_free(ctx);
    return NULL;
}

struct tls_server *tls_server_new(const char *cert, const char *key, const char *client_ca,
                                  char *err, size_t errlen)
{
    struct tls_server *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "TLS: out of memory");
        return NULL;
    }
    if (!(t->ctx = server_ctx(cert, key, client_ca, err, errlen))) {
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->mu, NULL);
    return t;
}

int tls_server_reload(struct tls_server *t, const char *cert, const char *key,
                      const char *client_ca, char *err, size_t errlen)
{
    SSL_CTX *ctx = server_ctx(cert, key, client_ca, err, errlen), *old;
    if (!ctx)
        return -1;
    pthread_mutex_lock(&t->mu);
    old = t->ctx;
    t->ctx = ctx;
    pthread_mutex_unlock(&t->mu);
    SSL_CTX_free(old); /* its connections hold references of their own */
    return 0;
}

SSL *tls_server_ssl(struct tls_server *t)
{
    pthread_mutex_lock(&t->mu);
    SSL *ssl = SSL_new(t->ctx);
    pthread_mutex_unlock(&t->mu);
    return ssl;
}

void tls_server_free(struct tls_server *t)
{
    if (!t)
        return;
    SSL_CTX_free(t->ctx);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

SSL_CTX *tls_client_ctx(const char *ca_file, char *err, size_t errlen)
{
    char why[256];
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    ERR_clear_error();
    if (!ctx || !policy(ctx) ||
        (ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                 : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
        tls_error(why, sizeof why);
        snprintf(err, errlen, "TLS: %s: %s", ca_file ? ca_file : "the system's CA store", why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    /* A send that the socket took part of goes on from where it stopped. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

SSL *tls_client_ssl(SSL_CTX *ctx, const char *host)
{
    SSL *ssl = SSL_new(ctx);
    if (!ssl)
        return NULL;
    SSL_set_connect_state(ssl);
    unsigned char addr[16];
    int is_ip = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
    /* A name: sent as SNI, and the certificate must be for it; an address:
     * the certificate must name that address (no SNI for addresses). */
    int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1
                   : SSL_set_tlsext_host_name(ssl, host) == 1 && SSL_set1_host(ssl, host) == 1;
    if (!ok) {
        SSL_free(ssl);
        return NULL;
    }
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    return ssl;
}

void tls_client_ctx_free(SSL_CTX *ctx)
{
    SSL_CTX_free(ctx);
}
