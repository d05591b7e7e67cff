/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consume.h — the consumers: each of consumers: in the configuration reads
 * a RabbitMQ queue or a Redis stream and hands every message to the
 * gateway as a request of its own (consume.c), so that a message is
 * claimed, sent to its handler and finished by the steps an HTTP request
 * on a route goes through, in the same key spaces.
 *
 * The brokers' clients live behind struct mq_source (mq_amqp.c,
 * mq_redis.c): a source connects, delivers messages, acks them and
 * publishes dead letters, on its consumer's event loop.
 */
#ifndef IDEM_SERVER_CONSUME_H
#define IDEM_SERVER_CONSUME_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

struct daemon;
struct live_config;
struct server_limits;
struct event_base;
typedef struct ssl_ctx_st SSL_CTX;

/* A consumer's counters, read by /metrics from any thread. */
struct consumer_counters {
    atomic_ulong received;      /* deliveries taken from the broker */
    atomic_ulong executed;      /* handled: the handler's 2xx kept, then acked */
    atomic_ulong duplicates;    /* finished before (by any delivery, consumer or
                                   route): acked without a handler call */
    atomic_ulong retried;       /* attempts that failed and will be tried again */
    atomic_ulong dead_lettered; /* given up: sent to the dead letter, then acked */
    atomic_ulong alerts;        /* key reused with another payload */
    atomic_ulong store_waits;   /* messages put back because the store failed */
    atomic_ulong in_flight;     /* held now (gauge): being handled, or waiting */
    atomic_int connected;       /* the broker connection is up (gauge) */
    atomic_ulong reconnects;
};

/* ---- what a source gives the consumer ---- */

/* One header of a message, as text. */
struct mq_header {
    char *name, *value;
};

/* A message as a source delivers it: the consumer takes it over (and
 * frees it with mq_message_free). */
struct mq_message {
    char *body;
    size_t body_len;
    char *id;                 /* the message's id, or NULL: AMQP message_id, or a
                                 stream entry's message_id field (else its id) */
    char *content_type;       /* or NULL */
    struct mq_header *headers;
    size_t header_count;
    /* Where it came from, for its ack: the source's own. */
    uint64_t tag;             /* AMQP delivery tag */
    char entry[48];           /* the stream entry's id */
    unsigned long gen;        /* the source's connection it came on */
    const char *bad;          /* set by the source: the message cannot be handled as
                                 it is (a header it cannot pass on), dead-letter it
                                 with this reason */
    uint64_t attempt_base;    /* x-idem-attempt-base: put back by a redrive, its
                                 attempts count from this epoch of its record */
    char *dead_reason;        /* a dead letter's x-idem-reason (mq_dead_unwrap) */
};

void mq_message_free(struct mq_message *m);

/* Add a header a message carries (name[0..nlen), value[0..vlen)) to m,
 * whose headers has room for it: a name that is not an HTTP field name, or
 * a value with a control character (CR, LF, NUL...), marks m bad
 * (header_invalid) instead; one the request frames or sets itself
 * (Content-Length, Host, Idem-Message-Id...) is left out, and so is
 * x-idem-attempt-base, read into m->attempt_base. 0, or -1 on OOM. */
int mq_add_header(struct mq_message *m, const char *name, size_t nlen, const char *value,
                  size_t vlen);

/* A dead letter read back as the message it was: Idem's x-idem-* headers
 * taken off, x-idem-reason kept in m->dead_reason ("" when none). 0, or
 * -1 on OOM. */
int mq_dead_unwrap(struct mq_message *m);

struct consumer;

/* Called by a source on the loop for each message it receives. */
void consumer_deliver(struct consumer *k, struct mq_message *m);
/* The source's connection is up (1) or lost (0): messages of a lost
 * connection are not acked (the broker gives them out again). */
void consumer_connection(struct consumer *k, int up, const char *detail);

/* A source: one kind of broker. Every call runs on the consumer's loop. */
struct mq_source_ops {
    const char *kind; /* "amqp", "redis_stream" */
    /* Start connecting (and keep reconnecting, with backoff, whenever the
     * connection is lost, until stop). NULL on OOM. */
    void *(*open)(struct consumer *k, struct event_base *base,
                  const struct consumer_config *cfg, const char *instance);
    /* The consumer can take n more messages (0: none for now). */
    void (*want)(void *src, size_t n);
    /* Ack m (its connection still up, m->gen current). 0, or -1: not acked
     * (the broker will give it out again). */
    int (*ack)(void *src, const struct mq_message *m);
    /* Put m on the dead letter with Idem's headers, durably, then ack it.
     * 0, or -1: neither done for sure (it comes back). */
    int (*dead_letter)(void *src, const struct mq_message *m, const char *reason,
                       unsigned attempts, int last_status);
    /* ---- the redrive (consume.c): a session of its own takes the dead
     * letters one at a time and settles each, all on the loop. ---- */
    /* A session, or NULL with err (the broker cannot be reached). */
    void *(*dead_open)(void *src, char *err, size_t errlen);
    /* The next dead letter this session has not taken: got(arg, 0, m)
     * with the message as it was delivered first (mq_dead_unwrap), got(arg,
     * 0, NULL) when there is none, got(arg, -1, NULL) when the broker
     * failed. From within the call or later. */
    void (*dead_next)(void *ses, void (*got)(void *arg, int rc, struct mq_message *m),
                      void *arg);
    /* Settle m, one dead_next gave: requeue, put it back on the source
     * (with x-idem-attempt-base when base is not 0) and only then take it
     * off the dead letter; else only take it off. done(arg, 1) done,
     * done(arg, 0) another session took it first, done(arg, -1) the broker
     * failed (the dead letter stays). From within the call or later. */
    void (*dead_settle)(void *ses, const struct mq_message *m, int requeue, uint64_t base,
                        void (*done)(void *arg, int rc), void *arg);
    /* End the session: what it took and did not settle stays on the dead
     * letter. How many dead letters are left there (-1: not known) to
     * left(arg, n) (NULL: not asked), from within the call or later. */
    void (*dead_close)(void *ses, void (*left)(void *arg, long n), void *arg);
    /* Stop taking messages (shutdown): what is held may still be acked. */
    void (*stop)(void *src);
    /* Close and free. */
    void (*close)(void *src);
};

extern const struct mq_source_ops mq_amqp_ops, mq_redis_ops;

/* The source's connection generation: a message whose gen is not the
 * current one came on a lost connection. */
unsigned long consumer_gen(const struct consumer *k);

/* A stream's: 1 when the consumer holds the entry now (being handled, or
 * waiting for its next try); fn(arg, entry) for each entry it holds. */
int consumer_holds(const struct consumer *k, const char *entry);
void consumer_each_held(const struct consumer *k, void (*fn)(void *arg, const char *entry),
                        void *arg);

/* ---- the consumers of a daemon ---- */

struct consumers;

/* Start a thread and an event loop for each consumer of lc's
 * configuration (lc is held until consumers_free), their lines to alog
 * (NULL: none). NULL with err when one cannot start; a configuration
 * without consumers gives an empty set. */
struct access_log;
struct consumers *consumers_start(struct daemon *d, struct live_config *lc, SSL_CTX *tls,
                                  struct access_log *alog, char *err, size_t errlen);
/* SIGTERM: each stops taking messages and lets those in flight finish, up
 * to timeout_ms; then its loop ends. Any thread. */
void consumers_drain(struct consumers *cs, int64_t timeout_ms);
/* Wait for the loops to end, then abort what is parked on them (as
 * front_abort_parked). */
void consumers_join(struct consumers *cs);
/* After the workers and the store's writer handed back every step: free
 * everything, the broker connections closed. NULL: no-op. */
void consumers_free(struct consumers *cs);

/* A redrive's tally. */
struct redrive_result {
    unsigned long moved; /* put back on the source, to go through the records */
    unsigned long done;  /* their key finished meanwhile: taken off, not run */
    unsigned long kept;  /* looked at and left: another reason, failed for good */
    long left;           /* dead letters on the dead letter at the end; -1 unknown */
    char error[200];     /* "" or why it stopped short (the broker, the store) */
};

/* Redrive consumer i's dead letters (consume.c, "the redrive"), on its
 * loop: at most limit of them, only those dead-lettered for reason (NULL:
 * any). done(arg, result) is called once, on the consumer's thread, result
 * then freed.
 * -1 when it cannot start (OOM, the consumer stopped). Any thread. */
int consumers_redrive(struct consumers *cs, size_t i, unsigned long limit, const char *reason,
                      void (*done)(void *arg, const struct redrive_result *r), void *arg);
/* The consumer named name: its index, or -1. */
long consumers_find(const struct consumers *cs, const char *name);

size_t consumers_count(const struct consumers *cs);
/* The i-th consumer's name, source kind and counters. */
const char *consumers_name(const struct consumers *cs, size_t i);
const char *consumers_kind(const struct consumers *cs, size_t i);
const struct consumer_counters *consumers_counters(const struct consumers *cs, size_t i);

#endif
