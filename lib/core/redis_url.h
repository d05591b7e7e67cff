/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_url.h — the one parser of redis:// URLs (core layer), for the
 * distributed store's Redis (lib/store/redis.c) and for the daemon's Redis
 * Streams consumers (server/consume/mq_redis.c):
 *
 *   redis://[[user]:password@]host[:port][/db]
 *   redis-sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]
 *
 * The second names Redis Sentinels (port 26379 by default), which are asked
 * where the master called master_name is (redis_sentinel.h); the user and
 * password are the master's.
 *
 * The user and the password are percent-decoded (a '/', '?', '#' or '@' in
 * a password is written %2F, %3F, %23, %40); the host is a name of letters,
 * digits, '.', '-' and '_', or an IPv6 address in brackets. Anything that
 * does not fit is refused, with a detail that names the part and what is
 * wrong with it, and never shows the password (nor the user).
 */
#ifndef IDEM_CORE_REDIS_URL_H
#define IDEM_CORE_REDIS_URL_H

#include <stddef.h>

#include "idem.h"

#define IDEM_REDIS_HOST_MAX 255
#define IDEM_REDIS_USER_MAX 255
#define IDEM_REDIS_PASSWORD_MAX 511 /* bytes, decoded */
#define IDEM_REDIS_DB_MAX 1000000
#define IDEM_REDIS_PORT_DEFAULT 6379
#define IDEM_REDIS_SENTINEL_PORT_DEFAULT 26379
#define IDEM_REDIS_SENTINELS_MAX 8

struct idem__redis_url {
    char host[IDEM_REDIS_HOST_MAX + 1];   /* without the brackets of an IPv6 address;
                                             "" for sentinels (asked at each connect) */
    int port;                             /* 6379 when the URL has none */
    int sentinels;                        /* redis-sentinel://: how many; else 0 */
    struct {
        char host[IDEM_REDIS_HOST_MAX + 1];
        int port;
    } sentinel[IDEM_REDIS_SENTINELS_MAX];
    char master[IDEM_REDIS_HOST_MAX + 1]; /* the master's name, as the sentinels know it */
    int db;                               /* 0 when the URL has none */
    char user[IDEM_REDIS_USER_MAX + 1];   /* "" for none (Redis's "default") */
    char password[IDEM_REDIS_PASSWORD_MAX + 1]; /* "" for none */
    char where[IDEM_REDIS_HOST_MAX + 16]; /* host:port, [host]:port for IPv6, or
                                             "master NAME via SENTINELS": for messages */
};

/* Parse url into *out: IDEM_OK, or IDEM_EINVAL with the thread's detail
 * saying "<what>: ..." and what was wrong. what names the setting in the
 * messages ("redis_url"). On error *out holds no credentials. Any thread. */
idem_rc idem__redis_url_parse(const char *url, const char *what, struct idem__redis_url *out);

/* Wipe the credentials of *u (explicit_bzero), once they are used. */
void idem__redis_url_wipe(struct idem__redis_url *u);

/* The two answers a connection through sentinels reads, the same for the
 * store's connections and the consumers'. rep: a hiredis reply, NULL for
 * none. */
struct redisReply;

/* SENTINEL GET-MASTER-ADDR-BY-NAME's answer: NULL when it named the
 * master, in host (cap bytes) and *port; otherwise why not, for a message
 * (static, or the reply's own error text). */
const char *idem__sentinel_master(const struct redisReply *rep, char *host, size_t cap,
                                  int *port);

/* ROLE's answer: 1 when the server is a master. */
int idem__redis_is_master(const struct redisReply *rep);

#endif
