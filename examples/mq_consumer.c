/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mq_consumer.c — a RabbitMQ consumer whose business effect happens once
 * per message however often the queue delivers it, and whose poison
 * messages end in a dead-letter queue instead of coming back for ever.
 *
 * Each message is a refund, its body "REFUND_NO AMOUNT" ("R-17 100.00");
 * its id is the AMQP message-id property, or REFUND_NO when there is none.
 * For each delivery, on one database connection of the consumer's own:
 *
 *   idem_inbox_attempt_*()   counts the delivery, committed on its own:
 *                              DUPLICATE: ack; DEAD: dead-letter, ack
 *   BEGIN
 *   idem_inbox_settle_*()    CLAIMED, or DUPLICATE / DEAD: ROLLBACK
 *   INSERT INTO refund ...   the business effect
 *   COMMIT, then ack         a failure: ROLLBACK, reject with requeue;
 *                              the redelivery is the next attempt
 *
 * A refund of a non-positive amount breaks the refund table's CHECK: a
 * poison message, whose business fails every time. After --max-attempts
 * attempts its next delivery is DEAD: published to the dead-letter queue
 * (confirmed by the broker) and only then acked.
 *
 *   mq_consumer --amqp URL --queue NAME [--dead-letter NAME]
 *               (--sqlite FILE | --postgres URL) [--max-attempts N]
 *               [--group NAME] [--retention-days N] [--idle-exit MS]
 *
 * examples/README.md shows a run; the test suite runs it as
 * example.mq_consumer.sqlite and example.mq_consumer.postgres.
 */
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

#define CHANNEL 1
#define PURGE_EVERY_MS 60000
#define CONFIRM_WAIT_S 10

static struct {
    const char *amqp_url, *queue, *dead_letter, *sqlite_path, *postgres_url, *group;
    unsigned max_attempts;
    int retention_days;
    long idle_exit_ms;
} opt = {.group = "refunds", .max_attempts = 3, .retention_days = 7};

static volatile sig_atomic_t stopping;
static sqlite3 *lite;            /* one of these two is the database */
static PGconn *pg;
static amqp_connection_state_t mq;
static uint64_t published;       /* messages this channel has published */
static long processed, duplicates, failed, dead_lettered;

/* No UNIQUE on refund_no, on purpose: the inbox alone keeps each refund
 * once, and the test counts the rows to prove it. */
static const char create_refund_sql[] =
    "CREATE TABLE IF NOT EXISTS refund (msg_id TEXT NOT NULL, refund_no TEXT NOT NULL,"
    " amount_cents BIGINT NOT NULL CHECK (amount_cents > 0))";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the database: the caller's own connection, SQLite or PostgreSQL ---- */

static int db_exec(const char *sql)
{
    if (lite) {
        char *err = NULL;
        if (sqlite3_exec(lite, sql, NULL, NULL, &err) == SQLITE_OK)
            return 0;
        fprintf(stderr, "mq_consumer: %s: %s\n", sql, err);
        sqlite3_free(err);
        return -1;
    }
    PGresult *r = PQexec(pg, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "mq_consumer: %s: %s", sql, PQerrorMessage(pg));
    PQclear(r);
    return ok ? 0 : -1;
}

static int db_open(void)
{
    if (opt.sqlite_path) {
        if (sqlite3_open(opt.sqlite_path, &lite) != SQLITE_OK) {
            fprintf(stderr, "mq_consumer: %s: %s\n", opt.sqlite_path, sqlite3_errmsg(lite));
            return -1;
        }
        /* Other consumers write the same file: wait for them, not fail. */
        sqlite3_busy_timeout(lite, 10000);
        /* Turning on WAL needs the file to itself, and SQLite answers BUSY
         * at once, without its busy handler, while another consumer opens
         * it at the same moment: try again for up to 10 s. */
        int rc = SQLITE_BUSY;
        for (int i = 0; i < 1000; i++) {
            rc = sqlite3_exec(lite, "PRAGMA journal_mode = WAL", NULL, NULL, NULL);
            if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED)
                break;
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (rc != SQLITE_OK) {
            fprintf(stderr, "mq_consumer: PRAGMA journal_mode = WAL: %s\n",
                    sqlite3_errmsg(lite));
            return -1;
        }
    } else {
        pg = PQconnectdb(opt.postgres_url);
        if (PQstatus(pg) != CONNECTION_OK) {
            fprintf(stderr, "mq_consumer: %s", PQerrorMessage(pg));
            return -1;
        }
    }
    /* Consumers started together may all create the table; on PostgreSQL
     * all but the first fail on its catalog's unique key, and find the
     * table when they try again. */
    return db_exec(create_refund_sql) && db_exec(create_refund_sql) ? -1 : 0;
}

static idem_rc db_attempt(const char *msg_id, idem_outcome *o, idem_inbox_entry *e)
{
    return lite ? idem_inbox_attempt_sqlite(lite, opt.group, msg_id, "refund",
                                            opt.max_attempts, o, e)
                : idem_inbox_attempt_pg(pg, opt.group, msg_id, "refund", opt.max_attempts, o,
                                        e);
}

static idem_rc db_settle(const char *msg_id, idem_outcome *o)
{
    return lite ? idem_inbox_settle_sqlite(lite, opt.group, msg_id, "refund", o, NULL)
                : idem_inbox_settle_pg(pg, opt.group, msg_id, "refund", o, NULL);
}

static void db_purge(void)
{
    int64_t retention = (int64_t)opt.retention_days * 24 * 3600 * 1000;
    unsigned n = 0;
    idem_rc rc = lite ? idem_inbox_purge_sqlite(lite, retention, 1000, &n)
                      : idem_inbox_purge_pg(pg, retention, 1000, &n);
    if (rc != IDEM_OK)
        fprintf(stderr, "mq_consumer: purge: %s\n", idem_errdetail());
}

/* The business effect. -1 when the database refuses it. */
static int insert_refund(const char *msg_id, const char *refund_no, long long cents)
{
    char amount[24];
    snprintf(amount, sizeof amount, "%lld", cents);
    if (lite) {
        sqlite3_stmt *s = NULL;
        int rc = sqlite3_prepare_v2(lite, "INSERT INTO refund VALUES (?1, ?2, ?3)", -1, &s,
                                    NULL);
        if (rc == SQLITE_OK) {
            sqlite3_bind_text(s, 1, msg_id, -1, SQLITE_STATIC);
            sqlite3_bind_text(s, 2, refund_no, -1, SQLITE_STATIC);
            sqlite3_bind_int64(s, 3, cents);
            rc = sqlite3_step(s);
        }
        sqlite3_finalize(s);
        if (rc == SQLITE_DONE)
            return 0;
        fprintf(stderr, "mq_consumer: refund %s: %s\n", refund_no, sqlite3_errmsg(lite));
        return -1;
    }
    const char *params[3] = {msg_id, refund_no, amount};
    PGresult *r = PQexecParams(pg, "INSERT INTO refund VALUES ($1, $2, $3)", 3, NULL, params,
                               NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "mq_consumer: refund %s: %s", refund_no, PQerrorMessage(pg));
    PQclear(r);
    return ok ? 0 : -1;
}

/* ---- the broker ---- */

static int amqp_ok(amqp_rpc_reply_t r, const char *what)
{
    if (r.reply_type == AMQP_RESPONSE_NORMAL)
        return 0;
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
        fprintf(stderr, "mq_consumer: %s: %s\n", what, amqp_error_string2(r.library_error));
    else
        fprintf(stderr, "mq_consumer: %s: refused by the broker (method 0x%08x)\n", what,
                r.reply.id);
    return -1;
}

static int mq_open(void)
{
    struct amqp_connection_info at;
    char *url = strdup(opt.amqp_url);
    if (!url || amqp_parse_url(url, &at) != AMQP_STATUS_OK) {
        fprintf(stderr, "mq_consumer: --amqp %s: not an amqp:// URL\n", opt.amqp_url);
        free(url);
        return -1;
    }
    mq = amqp_new_connection();
    amqp_socket_t *sock = amqp_tcp_socket_new(mq);
    int rc = sock ? amqp_socket_open(sock, at.host, at.port) : AMQP_STATUS_NO_MEMORY;
    if (rc != AMQP_STATUS_OK) {
        fprintf(stderr, "mq_consumer: %s:%d: %s\n", at.host, at.port, amqp_error_string2(rc));
        free(url);
        return -1;
    }
    rc = amqp_ok(amqp_login(mq, at.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, at.user,
                            at.password),
                 "login");
    free(url);
    if (rc)
        return -1;
    amqp_channel_open(mq, CHANNEL);
    if (amqp_ok(amqp_get_rpc_reply(mq), "opening the channel"))
        return -1;
    const char *queues[2] = {opt.queue, opt.dead_letter};
    for (int i = 0; i < 2; i++) {
        amqp_queue_declare(mq, CHANNEL, amqp_cstring_bytes(queues[i]), 0, 1, 0, 0,
                           amqp_empty_table);
        if (amqp_ok(amqp_get_rpc_reply(mq), queues[i]))
            return -1;
    }
    /* One message in hand at a time: nothing else arrives on the channel
     * while this consumer waits for a dead-letter's confirm. */
    amqp_basic_qos(mq, CHANNEL, 0, 1, 0);
    amqp_confirm_select(mq, CHANNEL);
    amqp_basic_consume(mq, CHANNEL, amqp_cstring_bytes(opt.queue), amqp_empty_bytes, 0, 0, 0,
                       amqp_empty_table);
    return amqp_ok(amqp_get_rpc_reply(mq), "consuming");
}

/* Publish the message to the dead-letter queue, persistent, and wait for
 * the broker to confirm it has taken it over. */
static int dead_letter(const amqp_envelope_t *env, const char *msg_id, unsigned attempts)
{
    amqp_basic_properties_t p;
    memset(&p, 0, sizeof p);
    amqp_table_entry_t why = {amqp_cstring_bytes("x-idem-attempts"),
                              {.kind = AMQP_FIELD_KIND_U32, .value.u32 = attempts}};
    p._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
               AMQP_BASIC_HEADERS_FLAG;
    p.delivery_mode = 2;
    p.message_id = amqp_cstring_bytes(msg_id);
    p.headers = (amqp_table_t){1, &why};
    if (amqp_basic_publish(mq, CHANNEL, amqp_empty_bytes, amqp_cstring_bytes(opt.dead_letter), 0,
                           0, &p, env->message.body) != AMQP_STATUS_OK)
        return -1;
    published++;
    for (;;) {
        amqp_frame_t f;
        struct timeval tv = {CONFIRM_WAIT_S, 0};
        int rc = amqp_simple_wait_frame_noblock(mq, &f, &tv);
        if (rc != AMQP_STATUS_OK) {
            fprintf(stderr, "mq_consumer: dead-letter confirm: %s\n", amqp_error_string2(rc));
            return -1;
        }
        if (f.frame_type != AMQP_FRAME_METHOD)
            continue;
        if (f.payload.method.id == AMQP_BASIC_NACK_METHOD)
            return -1;
        if (f.payload.method.id == AMQP_BASIC_ACK_METHOD) {
            amqp_basic_ack_t *ack = f.payload.method.decoded;
            if (ack->delivery_tag == published || (ack->multiple && ack->delivery_tag > published))
                return 0;
        }
    }
}

/* ---- one delivery ---- */

enum verdict { ACK, REQUEUE };

/* The business transaction: settle, then the refund, then COMMIT. */
static enum verdict process(const char *msg_id, const char *refund_no, long long cents,
                            int parsed)
{
    idem_outcome o;
    if (db_exec(lite ? "BEGIN IMMEDIATE" : "BEGIN"))
        return REQUEUE;
    if (db_settle(msg_id, &o) != IDEM_OK) {
        fprintf(stderr, "mq_consumer: settle %s: %s\n", msg_id, idem_errdetail());
        db_exec("ROLLBACK");
        return REQUEUE;
    }
    if (o != IDEM_CLAIMED) {
        /* Another delivery committed it (DUPLICATE) or dead-lettered it
         * (DEAD) while this one was in hand. */
        db_exec("ROLLBACK");
        duplicates++;
        return ACK;
    }
    if (!parsed || insert_refund(msg_id, refund_no, cents) != 0) {
        db_exec("ROLLBACK");
        failed++;
        return REQUEUE;
    }
    if (db_exec("COMMIT")) {
        /* Committed or not, the redelivery's attempt will say. */
        db_exec("ROLLBACK");
        return REQUEUE;
    }
    processed++;
    return ACK;
}

static enum verdict handle(const amqp_envelope_t *env)
{
    char body[512], refund_no[256] = "", msg_id[256];
    double amount = 0;
    size_t n = env->message.body.len < sizeof body - 1 ? env->message.body.len : sizeof body - 1;
    memcpy(body, env->message.body.bytes, n);
    body[n] = '\0';
    int parsed = sscanf(body, "%255s %lf", refund_no, &amount) == 2;
    const amqp_basic_properties_t *p = &env->message.properties;
    if ((p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) && p->message_id.len &&
        p->message_id.len < sizeof msg_id) {
        memcpy(msg_id, p->message_id.bytes, p->message_id.len);
        msg_id[p->message_id.len] = '\0';
    } else {
        snprintf(msg_id, sizeof msg_id, "%s", refund_no);
    }
    if (idem_check_key(msg_id) != IDEM_OK) {
        /* No id to count its attempts by: straight to the dead letters. */
        fprintf(stderr, "mq_consumer: a message without an id: %s\n", idem_errdetail());
        if (dead_letter(env, "none", 0) != 0)
            return REQUEUE;
        dead_lettered++;
        return ACK;
    }
    idem_outcome o;
    idem_inbox_entry e;
    if (db_attempt(msg_id, &o, &e) != IDEM_OK) {
        fprintf(stderr, "mq_consumer: attempt %s: %s\n", msg_id, idem_errdetail());
        return REQUEUE;
    }
    if (o == IDEM_DUPLICATE) {
        duplicates++;
        return ACK;
    }
    if (o == IDEM_DEAD) {
        if (dead_letter(env, msg_id, e.attempts) != 0)
            return REQUEUE;
        dead_lettered++;
        fprintf(stderr, "mq_consumer: %s dead-lettered after %u attempts\n", msg_id, e.attempts);
        return ACK;
    }
    return process(msg_id, refund_no, (long long)(amount * 100 + (amount < 0 ? -0.5 : 0.5)),
                   parsed);
}

/* ---- the loop ---- */

static int consume(void)
{
    int64_t last_message = now_ms(), last_purge = 0;
    while (!stopping) {
        if (now_ms() - last_purge >= PURGE_EVERY_MS) {
            db_purge();
            last_purge = now_ms();
        }
        amqp_envelope_t env;
        struct timeval tv = {0, 200000};
        amqp_maybe_release_buffers(mq);
        amqp_rpc_reply_t r = amqp_consume_message(mq, &env, &tv, 0);
        if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
            r.library_error == AMQP_STATUS_TIMEOUT) {
            if (opt.idle_exit_ms && now_ms() - last_message >= opt.idle_exit_ms)
                break;
            continue;
        }
        if (amqp_ok(r, "receiving"))
            return -1;
        last_message = now_ms();
        enum verdict v = handle(&env);
        int rc = v == ACK ? amqp_basic_ack(mq, CHANNEL, env.delivery_tag, 0)
                          : amqp_basic_reject(mq, CHANNEL, env.delivery_tag, 1);
        amqp_destroy_envelope(&env);
        if (rc != AMQP_STATUS_OK) {
            fprintf(stderr, "mq_consumer: ack: %s\n", amqp_error_string2(rc));
            return -1;
        }
        if (v == REQUEUE)
            usleep(10000); /* a failing store or business: not a hot loop */
    }
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    stopping = 1;
}

static int usage(void)
{
    fprintf(stderr, "usage: mq_consumer --amqp URL --queue NAME [--dead-letter NAME]\n"
                    "                   (--sqlite FILE | --postgres URL) [--max-attempts N]\n"
                    "                   [--group NAME] [--retention-days N] [--idle-exit MS]\n");
    return 2;
}

int main(int argc, char **argv)
{
    static char dlq[300];
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--amqp")) opt.amqp_url = v;
        else if (!strcmp(k, "--queue")) opt.queue = v;
        else if (!strcmp(k, "--dead-letter")) opt.dead_letter = v;
        else if (!strcmp(k, "--sqlite")) opt.sqlite_path = v;
        else if (!strcmp(k, "--postgres")) opt.postgres_url = v;
        else if (!strcmp(k, "--group")) opt.group = v;
        else if (!strcmp(k, "--max-attempts")) opt.max_attempts = (unsigned)atoi(v);
        else if (!strcmp(k, "--retention-days")) opt.retention_days = atoi(v);
        else if (!strcmp(k, "--idle-exit")) opt.idle_exit_ms = atol(v);
        else return usage();
    }
    if (argc % 2 == 0 || !opt.amqp_url || !opt.queue || !opt.sqlite_path == !opt.postgres_url ||
        opt.retention_days < 1)
        return usage();
    if (!opt.dead_letter) {
        snprintf(dlq, sizeof dlq, "%s.dead", opt.queue);
        opt.dead_letter = dlq;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    int rc = db_open() || mq_open() || consume() ? 1 : 0;
    printf("mq_consumer: processed %ld, duplicates %ld, failed %ld, dead-lettered %ld\n",
           processed, duplicates, failed, dead_lettered);
    if (mq) {
        amqp_channel_close(mq, CHANNEL, AMQP_REPLY_SUCCESS);
        amqp_connection_close(mq, AMQP_REPLY_SUCCESS);
        amqp_destroy_connection(mq);
    }
    sqlite3_close(lite);
    PQfinish(pg);
    return rc;
}
