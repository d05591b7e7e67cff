/* SPDX-License-Identifier: Apache-2.0 */
/* Shared pieces of Idem's tests. */
#include "testlib.h"

#include <hiredis/hiredis.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_llong clock_offset;

int64_t test_clock(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + atomic_load(&clock_offset);
}

void test_clock_advance(int64_t ms)
{
    atomic_fetch_add(&clock_offset, ms);
}

void test_clock_reset(void)
{
    atomic_store(&clock_offset, 0);
}

char *test_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    char *path = malloc(4096);
    assert_non_null(path);
    snprintf(path, 4096, "%s/idem-test-XXXXXX", base && *base ? base : "/tmp");
    assert_non_null(mkdtemp(path));
    return path;
}

void test_rmdir(char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", dir);
    free(dir);
}

struct gun {
    pthread_barrier_t start;
    void (*fn)(void *, int);
    void *arg;
};

struct shooter {
    struct gun *gun;
    int i;
};

static void *shoot(void *p)
{
    struct shooter *s = p;
    pthread_barrier_wait(&s->gun->start);
    s->gun->fn(s->gun->arg, s->i);
    return NULL;
}

void test_run_threads(int n, void (*fn)(void *arg, int i), void *arg)
{
    struct gun gun = {.fn = fn, .arg = arg};
    pthread_t *t = calloc((size_t)n, sizeof *t);
    struct shooter *s = calloc((size_t)n, sizeof *s);
    assert_non_null(t);
    assert_non_null(s);
    pthread_barrier_init(&gun.start, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        s[i].gun = &gun;
        s[i].i = i;
        assert_int_equal(pthread_create(&t[i], NULL, shoot, &s[i]), 0);
    }
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&gun.start);
    free(t);
    free(s);
}

/* A connection to the Redis at url (redis://host:port/db), on its db. */
static redisContext *redis_at(const char *url)
{
    char host[256] = "127.0.0.1";
    int port = 6379, dbno = 0;
    sscanf(url, "redis://%255[^:/]:%d/%d", host, &port, &dbno);
    redisContext *c = redisConnect(host, port);
    if (!c || c->err)
        fail_msg("connecting to Redis at %s:%d: %s", host, port, c ? c->errstr : "no memory");
    redisReply *r = redisCommand(c, "SELECT %d", dbno);
    assert_non_null(r);
    freeReplyObject(r);
    return c;
}

void test_redis_command(const char *redis_url, const char *command)
{
    char words[256];
    const char *argv[8];
    int argc = 0;
    snprintf(words, sizeof words, "%s", command);
    char *save = NULL;
    for (char *w = strtok_r(words, " ", &save); w && argc < 8; w = strtok_r(NULL, " ", &save))
        argv[argc++] = w;
    redisContext *c = redis_at(redis_url);
    redisReply *r = redisCommandArgv(c, argc, argv, NULL);
    if (!r || r->type == REDIS_REPLY_ERROR)
        fail_msg("Redis %s: %s", command, r ? r->str : c->errstr);
    freeReplyObject(r);
    redisFree(c);
}

void test_wipe_servers(const char *redis_url, const char *postgres_url)
{
    if (redis_url) {
        redisContext *c = redis_at(redis_url);
        redisReply *r = redisCommand(c, "FLUSHDB");
        assert_true(r && r->type == REDIS_REPLY_STATUS);
        freeReplyObject(r);
        redisFree(c);
    }
    if (postgres_url) {
        PGconn *c = PQconnectdb(postgres_url);
        if (PQstatus(c) != CONNECTION_OK)
            fail_msg("wiping PostgreSQL: %s", PQerrorMessage(c));
        PGresult *r = PQexec(c, "SET client_min_messages = warning;"
                                "DROP SCHEMA public CASCADE; CREATE SCHEMA public");
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
            fail_msg("wiping PostgreSQL: %s", PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
    }
}

long test_pg_count(PGconn *c, const char *sql)
{
    PGresult *r = PQexec(c, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fail_msg("%s: %s", sql, PQerrorMessage(c));
    long n = atol(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

int64_t test_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
