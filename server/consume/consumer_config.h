/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer_config.h — a consumer as the configuration gives it (consumers:
 * in idem serve's file): its queue or stream, its handler and its route,
 * read by consumer_config.c. The consumers (consume.c) run from these.
 */
#ifndef IDEM_SERVER_CONSUME_CONSUMER_CONFIG_H
#define IDEM_SERVER_CONSUME_CONSUMER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "config_secret.h"
#include "gateway/route_config.h"

enum consumer_source {
    SOURCE_AMQP,         /* { amqp: URL, queue: NAME, prefetch: N } */
    SOURCE_REDIS_STREAM, /* { redis_stream: URL, stream: NAME, group: NAME } */
};

#define CONSUMER_BACKOFFS_MAX 16

/* consumers[i]: a queue or stream whose messages go to a handler once
 * each, through the gateway's steps (consume.c). */
struct consumer_config {
    enum consumer_source source;
    char *url;               /* amqp://… or redis://…; a password only from env: or
                                file:, or RabbitMQ's loopback-only guest:guest */
    struct config_secret url_src; /* that env: or file: (kind NONE: written out) */
    char *queue;             /* the AMQP queue, or the Redis stream */
    char *group;             /* Redis: the consumer group (default idem) */
    char *body_field;        /* Redis: the entry's field holding the body (body) */
    size_t prefetch;         /* messages handled at once; default 64 */
    char *dead_letter;       /* the queue (stream) given up messages go to;
                                default: the queue's name and .dead */
    int64_t backoff_ms[CONSUMER_BACKOFFS_MAX]; /* retry_backoff; the last repeats */
    size_t backoff_count;
    /* name, handler (the upstream), key, space, lease, handler_timeout
     * (upstream_timeout), retention, fingerprint, max_attempts; the record
     * layer only. */
    struct route route;
    unsigned long line;
};

/* For config.c. */
struct config_ctx;
struct yaml_node_s;
struct server_config;

/* consumers: into cfg->consumers, after the routes are read. */
int config_read_consumers(struct config_ctx *c, const struct yaml_node_s *n,
                          struct server_config *cfg);
void config_consumers_free(struct consumer_config *consumers, size_t n);
/* consumers: as config_read_consumers reads it back (config_print()):
 * every field of each, a broker URL's password by its env: or file:. */
struct config_out;
void config_print_consumers(struct config_out *o, const struct server_config *cfg);

#endif
