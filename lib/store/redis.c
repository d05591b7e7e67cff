/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis.c — the "redis" kv backend: tokens and locks in Redis, the
 * distributed store's layers 1 and 2, shared by every process that opens
 * the same server. Its semantics are memory.c's, operation for operation.
 *
 * Keys. Each carries its scope in a hash tag, so that every key one
 * operation touches hashes to one slot should the server become a Redis
 * Cluster:
 *
 *   idem:{<space>}:lock:<key>    "<expiry> <fence> <owner>"
 *   idem:{<space>}:fence         the space's fence counter (never expires)
 *   idem:{<scene>}:tok:<token>   "<expiry> <issued expiry> <ttl> <subject>",
 *                                and "\n<key>" once spent on key; expiry is
 *                                the issued one while unspent, then the
 *                                instant it is remembered until
 *   idem:{<scene>}:tq:<subject>  zset: the subject's unspent tokens in the
 *                                order memory.c keeps them (score: a sequence)
 *   idem:{<scene>}:te:<subject>  zset: the same tokens by issued expiry, so
 *                                the expired ones are found without a scan
 *
 * A token evicted by the per-(subject, scene) cap leaves the queue only:
 * deleting its own key would touch a key the script was not given. An
 * unspent token that is not in its queue is no token (consume answers
 * UNKNOWN and deletes it), and the key goes by itself at its PEXPIRE.
 *
 * Why scripts. Every operation is a check and an act on the same keys (spend
 * if unspent, delete if the owner matches, extend if the owner matches). Each
 * is one Lua script, which Redis runs with no other command in between, so
 * the pair is atomic without WATCH/MULTI round trips. The scripts are loaded
 * on every connect (SCRIPT LOAD) and run by EVALSHA; a NOSCRIPT answer (the
 * cache was flushed) loads the script again and retries once.
 *
 * Time. Expiry is judged by the handle's clock, as in memory.c: each value
 * holds its expiry instant and every script compares it with the caller's
 * `now`. Keys also get a PEXPIRE of the time they have left, so Redis drops
 * dead keys by itself; as long as the handle's clock runs no slower than
 * Redis's, a key Redis drops is dead by the handle's clock too.
 *
 * Fences come from the space's counter, which never runs behind the wall
 * clock in microseconds (passed from C): a counter lost (FLUSHDB, a restart
 * without persistence) or set back (an older snapshot, a failover to a
 * lagging replica) starts again above every fence handed out before, as
 * memory.c's do across a process restart. See lock_acquire_lua.
 *
 * Pipelining. Callers never touch a connection. A call is a job on one
 * queue, and its caller sleeps on the job's semaphore. NIO I/O threads each
 * own a connection; a thread takes everything queued (up to BATCH_MAX),
 * appends the commands, writes them in one go and reads the replies in
 * order, waking each caller as its reply arrives. While one thread waits
 * for its replies the next batch gathers and the other thread sends it, so
 * concurrent callers share round trips.
 *
 * Faults. A failed write, a read that times out (timeout_ms) or a lost
 * connection drops the connection. A command that was sent fails with
 * ETIMEDOUT: it may have run, and is never sent again (a token consume that
 * ran must not run twice). One that was not sent whole cannot have run:
 * when the connection broke under it, it is queued again, once, for the
 * next connection; when the server stalled, or on its second try, it fails
 * with EUNAVAILABLE. A thread without a connection connects again before
 * it takes jobs; when that fails it backs off (BACKOFF_MIN_MS doubling to
 * BACKOFF_MAX_MS), and while no thread is connected, queued jobs fail at
 * once with the last cause. A caller whose job has not been sent after
 * timeout_ms takes it back off the queue (EUNAVAILABLE). So a call answers
 * within about timeout_ms while Redis is down, and the handle recovers by
 * itself once it is back. An idle connection is checked (poll: one that
 * owes no reply and has something to read was closed by the server) before
 * each batch, which then waits for a new connection, so a server restarted
 * in between costs no failed call.
 *
 * Locking: redis.mu guards the queue, the jobs' state and the shared
 * connection state (nconnected, backoff). A connection is touched only by
 * the thread that owns it, without the mutex.
 */
#include <assert.h>
#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/redis_url.h"
#include "store.h"

#define NIO 2              /* I/O threads, each with its own connection */
#define BATCH_MAX 256      /* commands per round trip */
#define ARGV_MAX 12        /* EVALSHA sha numkeys, 3 keys, up to 6 args */
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 1000
#define DETAIL_MAX 256     /* as error.c's detail */
#define KEY_BUF 512        /* "idem:{" name "}:tok:" key: 6 + 64 + 6 + 255 */

/* ---- the scripts ---- */

/* Values are strings, read with one GET and written with one SET ... PX (a
 * script's cost is mostly its redis.call()s). Subjects, owners and keys
 * hold no control characters (lib/core/check.c), so '\n' can end a field:
 *
 *   token  "<expiry> <issued expiry> <ttl> <subject>", and once spent
 *          "\n<the key it was spent on>" after it
 *   lock   "<expiry> <fence> <owner>"
 *
 * Instants and TTLs are passed as decimal strings and written back as they
 * came; a number a script computes is written with %.0f. Lua numbers are
 * doubles, exact for these (milliseconds since 1970 are far below 2^53). */

/* The token's fields, or nil if it does not exist or is another subject's
 * (a token of another scene is another key). */
#define LUA_TOKEN                                                              \
    "local function token(subject)\n"                                          \
    "  local v = redis.call('GET', KEYS[1])\n"                                 \
    "  if not v then return nil end\n"                                         \
    "  local x, i, t, s, nl, k =\n"                                            \
    "    string.match(v, '^(%d+) (%d+) (%d+) ([^\\n]*)(\\n?)(.*)$')\n"         \
    "  if not x or s ~= subject then return nil end\n"                         \
    "  return {x = tonumber(x), i = i, t = t, s = s, spent = nl ~= '', k = k}\n" \
    "end\n"

/* A token that has run out by `now`: delete it, and take it off its queue
 * when it was unspent (memory.c drops it the same way when touched). */
#define LUA_DROP                                                               \
    "local function drop(v, token)\n"                                          \
    "  redis.call('DEL', KEYS[1])\n"                                           \
    "  if not v.spent then\n"                                                  \
    "    redis.call('ZREM', KEYS[2], token)\n"                                 \
    "    redis.call('ZREM', KEYS[3], token)\n"                                 \
    "  end\n"                                                                  \
    "end\n"

/* Append a token to the (subject, scene) queue, KEYS[2] and KEYS[3], and
 * keep both alive at least `left` ms (their members come and go together,
 * so they always carry the same TTL). */
#define LUA_PUSH                                                               \
    "local function push(token, expires, left)\n"                              \
    "  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')\n"     \
    "  local seq = last[2] and tonumber(last[2]) + 1 or 1\n"                   \
    "  redis.call('ZADD', KEYS[2], seq, token)\n"                              \
    "  redis.call('ZADD', KEYS[3], expires, token)\n"                          \
    "  if redis.call('PTTL', KEYS[2]) < left then\n"                           \
    "    redis.call('PEXPIRE', KEYS[2], left)\n"                               \
    "    redis.call('PEXPIRE', KEYS[3], left)\n"                               \
    "  end\n"                                                                  \
    "end\n"

/* KEYS: token, queue, expiries. ARGV: subject, token, ttl, cap, now,
 * expiry (now + ttl). */
static const char token_put_lua[] =
    LUA_PUSH
    "local cap, now = tonumber(ARGV[4]), tonumber(ARGV[5])\n"
    "local function zrem(key, list)\n"
    "  for i = 1, #list, 256 do\n"
    "    redis.call('ZREM', key, unpack(list, i, math.min(i + 255, #list)))\n"
    "  end\n"
    "end\n"
    /* The queue's expired tokens first, then the oldest over the cap. */
    "local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)\n"
    "if #gone > 0 then\n"
    "  zrem(KEYS[2], gone)\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)\n"
    "end\n"
    "local n = redis.call('ZCARD', KEYS[2])\n"
    "if n >= cap then\n"
    "  local old = redis.call('ZRANGE', KEYS[2], 0, n - cap)\n"
    "  zrem(KEYS[2], old)\n"
    "  zrem(KEYS[3], old)\n"
    "end\n"
    "redis.call('SET', KEYS[1], ARGV[6] .. ' ' .. ARGV[6] .. ' ' .. ARGV[3] .. ' ' .. ARGV[1],\n"
    "           'PX', ARGV[3])\n"
    "push(ARGV[2], ARGV[6], tonumber(ARGV[3]))\n"
    "return 1\n";

/* KEYS: token, queue, expiries. ARGV: subject, token, biz key, now.
 * {0} unknown, {1} consumed, {2, key} spent before, on key. */
static const char token_consume_lua[] =
    LUA_TOKEN LUA_DROP
    "local now = tonumber(ARGV[4])\n"
    "local v = token(ARGV[1])\n"
    "if not v then return {0} end\n"
    "if v.x <= now then drop(v, ARGV[2]) return {0} end\n"
    "if v.spent then return {2, v.k} end\n"
    /* Unspent but off its queue: evicted by the cap. */
    "if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  return {0}\n"
    "end\n"
    "redis.call('ZREM', KEYS[3], ARGV[2])\n"
    "redis.call('SET', KEYS[1], string.format('%.0f', now + tonumber(v.t)) .. ' ' ..\n"
    "           v.i .. ' ' .. v.t .. ' ' .. v.s .. '\\n' .. ARGV[3], 'PX', v.t)\n"
    "return {1}\n";

/* KEYS: token, queue, expiries. ARGV: subject, token, biz key, now.
 * 1 restored, 0 unknown. */
static const char token_give_back_lua[] =
    LUA_TOKEN LUA_DROP LUA_PUSH
    "local now = tonumber(ARGV[4])\n"
    "local v = token(ARGV[1])\n"
    "if not v then return 0 end\n"
    "if v.x <= now then drop(v, ARGV[2]) return 0 end\n"
    "local left = tonumber(v.i) - now\n"
    "if not v.spent or v.k ~= ARGV[3] or left <= 0 then return 0 end\n"
    "redis.call('SET', KEYS[1], v.i .. ' ' .. v.i .. ' ' .. v.t .. ' ' .. v.s, 'PX', left)\n"
    "push(ARGV[2], v.i, left)\n"
    "return 1\n";

/* The lock's fields if it is alive by `now`; an expired lock is deleted on
 * the way, as memory.c drops it. */
#define LUA_LOCK                                                               \
    "local function lock(now)\n"                                               \
    "  local v = redis.call('GET', KEYS[1])\n"                                 \
    "  if not v then return nil end\n"                                         \
    "  local x, f, o = string.match(v, '^(%d+) (%d+) (.*)$')\n"                \
    "  if not x or tonumber(x) <= now then\n"                                  \
    "    redis.call('DEL', KEYS[1])\n"                                         \
    "    return nil\n"                                                         \
    "  end\n"                                                                  \
    "  return {x = tonumber(x), f = f, o = o}\n"                               \
    "end\n"

/* The fence: one more than the space's counter, or the wall clock (µs,
 * ARGV[4]) if that is more. A missing counter (a fresh server, FLUSHDB, a
 * restart without persistence) and a stale one (a restart from an older
 * snapshot, a failover to a replica that lagged) both restart from the
 * clock, above every fence handed out before (that was at most the clock
 * then, unless acquisitions outran a microsecond each). The comparison runs
 * on doubles, exact below 2^53 µs (the year 2255); past that the counter
 * alone counts, in Redis's exact 64-bit INCR. */

/* KEYS: lock, fence counter. ARGV: owner, ttl, now, wall clock µs, expiry
 * (now + ttl). {1, fence} acquired, {2, holder, ms left} busy. */
static const char lock_acquire_lua[] =
    LUA_LOCK
    "local now = tonumber(ARGV[3])\n"
    "local v = lock(now)\n"
    "if v then\n"
    "  if v.o ~= ARGV[1] then return {2, v.o, v.x - now} end\n"
    "  redis.call('SET', KEYS[1], ARGV[5] .. ' ' .. v.f .. ' ' .. v.o, 'PX', ARGV[2])\n"
    "  return {1, v.f}\n"
    "end\n"
    "local exact = 9007199254740992\n"
    "local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0\n"
    "local f\n"
    "if c < exact and c < tonumber(ARGV[4]) then\n"
    "  f = ARGV[4]\n"
    "  redis.call('SET', KEYS[2], f)\n"
    "else\n"
    "  f = redis.call('INCR', KEYS[2])\n"
    "  f = f < exact and string.format('%.0f', f) or redis.call('GET', KEYS[2])\n"
    "end\n"
    "redis.call('SET', KEYS[1], ARGV[5] .. ' ' .. f .. ' ' .. ARGV[1], 'PX', ARGV[2])\n"
    "return {1, f}\n";

/* Compare-and-extend. KEYS: lock. ARGV: owner, ttl, now, expiry.
 * 1 renewed, 0 not held. */
static const char lock_renew_lua[] =
    LUA_LOCK
    "local v = lock(tonumber(ARGV[3]))\n"
    "if not v or v.o ~= ARGV[1] then return 0 end\n"
    "redis.call('SET', KEYS[1], ARGV[4] .. ' ' .. v.f .. ' ' .. v.o, 'PX', ARGV[2])\n"
    "return 1\n";

/* Compare-and-delete. KEYS: lock. ARGV: owner, now. 1 released. */
static const char lock_release_lua[] =
    LUA_LOCK
    "local v = lock(tonumber(ARGV[2]))\n"
    "if not v or v.o ~= ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "return 1\n";

enum script {
    TOKEN_PUT,
    TOKEN_CONSUME,
    TOKEN_GIVE_BACK,
    LOCK_ACQUIRE,
    LOCK_RENEW,
    LOCK_RELEASE,
    NSCRIPTS
};

static const char *const script_text[NSCRIPTS] = {
    token_put_lua,    token_consume_lua, token_give_back_lua,
    lock_acquire_lua, lock_renew_lua,    lock_release_lua,
};

static const char *const script_name[NSCRIPTS] = {
    "token_put", "token_consume", "token_give_back",
    "lock_acquire", "lock_renew", "lock_release",
};

/* ---- the handle ---- */

enum job_state { QUEUED, TAKEN, DONE };

/* One command and its caller. Lives on the caller's stack; the caller
 * sleeps on done until an I/O thread has set reply or rc. */
struct job {
    struct job *next;
    enum job_state state; /* changed under redis.mu only */
    int argc;
    const char *argv[ARGV_MAX];
    size_t len[ARGV_MAX];
    redisReply *reply;    /* rc == IDEM_OK: the reply, the caller's to free */
    int resent;           /* queued again once after a write that broke */
    idem_rc rc;
    char detail[DETAIL_MAX];
    sem_t done;
};

struct io {
    struct redis *r;
    pthread_t thread;
    int started;
    redisContext *c;          /* NULL while disconnected; owned by thread */
    struct job *batch[BATCH_MAX];
    size_t end[BATCH_MAX];    /* where each command ends in the output */
};

struct redis {
    /* From the URL; read-only once open. With sentinels (redis-sentinel://)
     * host is "": each connection asks them where the master is first. */
    char host[IDEM_REDIS_HOST_MAX + 1];
    int port;
    int sentinels;
    struct {
        char host[IDEM_REDIS_HOST_MAX + 1];
        int port;
    } sentinel[IDEM_REDIS_SENTINELS_MAX];
    char master[IDEM_REDIS_HOST_MAX + 1];
    int db;
    char user[IDEM_REDIS_USER_MAX + 1];
    char password[IDEM_REDIS_PASSWORD_MAX + 1];
    char where[300];          /* host:port, for messages */
    int64_t timeout_ms;
    char sha[NSCRIPTS][41];   /* set by the first connect, before threads */

    pthread_mutex_t mu;
    pthread_cond_t work;      /* I/O threads wait for jobs (monotonic) */
    struct job *head, **tail;
    int idle;                 /* threads waiting on work */
    int stopping;
    int nconnected;           /* threads holding a connection */
    int64_t retry_at;         /* monotonic ms: no connect before */
    int64_t backoff_ms;
    char down[DETAIL_MAX];    /* why the last connect failed */
    /* Monotonic ms of the last connection of this handle's, any thread's
     * or loop's, that got through: a loop backing off after a failure
     * older than that tries again at once (the server is back). */
    int64_t up_at;            /* __atomic */

    struct io io[NIO];

    pthread_mutex_t amu;      /* guards the loops' kv_state, made on first use */
};

static struct timeval timeval_of(int64_t ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    return tv;
}

/* A write to a socket the server has closed raises SIGPIPE, whose default
 * is to end the process. Writes happen with it blocked; one it left pending
 * is taken, so it is never delivered later. Blocked signals raised by a
 * write are directed at the writing thread, so only our own are taken. */
static void sigpipe_block(sigset_t *old)
{
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, old);
}

static void sigpipe_drain(void)
{
    sigset_t pipe, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE)) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
}

static void sigpipe_restore(const sigset_t *old)
{
    if (!sigismember(old, SIGPIPE))
        sigpipe_drain();
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* Messages are cut to DETAIL_MAX, as error.c cuts them: through vsnprintf,
 * which the compiler does not second-guess about truncation. */
static void say(char *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(char *buf, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

/* A server that became a replica (a failover demoted it) refuses every
 * write with READONLY (a script, at its first write: before it wrote): the
 * command did not run. */
static int is_readonly(const char *msg)
{
    return strncmp(msg, "READONLY", 8) == 0 || strstr(msg, "-READONLY") != NULL;
}

/* An error reply's code: OOM is a full store, READONLY an unavailable one
 * (the master is elsewhere now), anything else a store error. */
static idem_rc error_rc(const char *msg)
{
    if (strncmp(msg, "OOM", 3) == 0 || strstr(msg, "OOM command not allowed"))
        return IDEM_EFULL;
    if (is_readonly(msg))
        return IDEM_EUNAVAILABLE;
    return IDEM_ESTORE;
}

/* ---- sentinels ----
 *
 * With a redis-sentinel:// URL no connection goes to an address of its
 * own: each asks the sentinels first (SENTINEL GET-MASTER-ADDR-BY-NAME,
 * each in the URL's order until one answers), then connects to the master
 * they name and checks with ROLE that it is one (a sentinel that has not
 * yet seen a failover names the old master, which may be back as a
 * replica). A lost connection, or a READONLY answer (the server was
 * demoted under it), sends the next connection back to the sentinels. The
 * I/O threads ask with blocking calls (below); the loops' connections ask
 * on the loop, as a connection of their own (see "on a loop"). */

/* Ask the sentinels, in order, where the master is (blocking). */
static idem_rc sentinel_ask(struct redis *r, char *host, size_t cap, int *port, char *why,
                            size_t whylen)
{
    char last[DETAIL_MAX] = "";
    for (int i = 0; i < r->sentinels; i++) {
        redisContext *c = redisConnectWithTimeout(r->sentinel[i].host, r->sentinel[i].port,
                                                  timeval_of(r->timeout_ms));
        if (!c) {
            say(why, whylen, "redis %s: out of memory connecting", r->where);
            return IDEM_ENOMEM;
        }
        redisReply *rep = NULL;
        if (!c->err && redisSetTimeout(c, timeval_of(r->timeout_ms)) == REDIS_OK)
            rep = redisCommand(c, "SENTINEL get-master-addr-by-name %s", r->master);
        const char *not = c->err ? c->errstr : idem__sentinel_master(rep, host, cap, port);
        int ok = !not;
        if (!ok)
            say(last, sizeof last, "sentinel %s:%d: %s", r->sentinel[i].host,
                r->sentinel[i].port, not);
        if (rep)
            freeReplyObject(rep);
        redisFree(c);
        if (ok)
            return IDEM_OK;
    }
    say(why, whylen, "redis %s: no sentinel named the master (last: %s)", r->where, last);
    return IDEM_EUNAVAILABLE;
}

/* ---- connections ---- */

/* Connect, authenticate, select the database and load the scripts, the last
 * three in one round trip. first: the open's connect, which records the
 * scripts' SHA1s (the threads have not started). On failure *why names
 * host:port and the cause, never the password. */
static idem_rc conn_open(struct redis *r, redisContext **out, int first,
                         char *why, size_t whylen)
{
    idem_rc rc = IDEM_OK;
    *out = NULL;
    char host[IDEM_REDIS_HOST_MAX + 1];
    int port = r->port;
    snprintf(host, sizeof host, "%s", r->host);
    if (r->sentinels && (rc = sentinel_ask(r, host, sizeof host, &port, why, whylen)) != IDEM_OK)
        return rc;
    redisContext *c = redisConnectWithTimeout(host, port, timeval_of(r->timeout_ms));
    if (!c) {
        say(why, whylen, "redis %s: out of memory connecting", r->where);
        return IDEM_ENOMEM;
    }
    if (c->err) {
        say(why, whylen, "redis %s: connecting to %s:%d: %s", r->where, host, port, c->errstr);
        redisFree(c);
        return IDEM_EUNAVAILABLE;
    }
    if (redisSetTimeout(c, timeval_of(r->timeout_ms)) != REDIS_OK) {
        say(why, whylen, "redis %s: setting the timeout: %s", r->where, c->errstr);
        redisFree(c);
        return IDEM_EUNAVAILABLE;
    }

    const char *what[3 + NSCRIPTS];
    int n = 0, ok = 1;
    char dbtext[16];
    if (r->password[0]) {
        const char *argv[3] = {"AUTH", r->user, r->password};
        ok &= r->user[0] ? redisAppendCommandArgv(c, 3, argv, NULL) == REDIS_OK
                         : redisAppendCommand(c, "AUTH %s", r->password) == REDIS_OK;
        what[n++] = "AUTH";
    }
    /* A new connection is on db 0; not selecting it keeps a Redis Cluster,
     * which refuses SELECT, usable. */
    if (r->db) {
        snprintf(dbtext, sizeof dbtext, "%d", r->db);
        ok &= redisAppendCommand(c, "SELECT %s", dbtext) == REDIS_OK;
        what[n++] = "SELECT";
    }
    if (r->sentinels) {
        ok &= redisAppendCommand(c, "ROLE") == REDIS_OK;
        what[n++] = "ROLE";
    }
    for (int s = 0; s < NSCRIPTS; s++) {
        ok &= redisAppendCommand(c, "SCRIPT LOAD %s", script_text[s]) == REDIS_OK;
        what[n++] = "SCRIPT LOAD";
    }
    if (!ok) {
        say(why, whylen, "redis %s: out of memory connecting", r->where);
        redisFree(c);
        return IDEM_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK) {
            int timed_out = c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
            if (timed_out)
                say(why, whylen, "redis %s: %s: no reply within %lld ms", r->where,
                         what[i], (long long)r->timeout_ms);
            else
                say(why, whylen, "redis %s: %s: %s", r->where, what[i], c->errstr);
            rc = IDEM_EUNAVAILABLE;
            break;
        }
        redisReply *rep = v;
        if (rep->type == REDIS_REPLY_ERROR) {
            say(why, whylen, "redis %s: %s: %s", r->where, what[i], rep->str);
            rc = error_rc(rep->str);
        } else if (!strcmp(what[i], "ROLE") && !idem__redis_is_master(rep)) {
            say(why, whylen, "redis %s: %s:%d, named by the sentinels, is not a master (yet)",
                r->where, host, port);
            rc = IDEM_EUNAVAILABLE;
        } else if (!strcmp(what[i], "SCRIPT LOAD")) {
            int s = i - (n - NSCRIPTS);
            if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
                say(why, whylen, "redis %s: SCRIPT LOAD: unexpected reply", r->where);
                rc = IDEM_ESTORE;
            } else if (first) {
                memcpy(r->sha[s], rep->str, 40);
                r->sha[s][40] = '\0';
            }
        }
        freeReplyObject(rep);
        if (rc != IDEM_OK)
            break;
    }
    if (rc != IDEM_OK) {
        redisFree(c);
        return rc;
    }
    *out = c;
    return IDEM_OK;
}

/* Whether an idle connection is still usable: no reply is owed on it, so
 * anything to read (an EOF, a reset) means the server has gone. */
static int conn_alive(redisContext *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    int n;
    while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR)
        ;
    return n == 0;
}

/* ---- the I/O threads ---- */

static void finish(struct job *j, idem_rc rc, const char *detail)
{
    j->rc = rc;
    say(j->detail, sizeof j->detail, "%s", detail);
    sem_post(&j->done);
}

/* Fail every queued job. With r->mu held. */
static void fail_queue(struct redis *r, idem_rc rc, const char *detail)
{
    struct job *j = r->head, *next;
    r->head = NULL;
    r->tail = &r->head;
    for (; j; j = next) {
        next = j->next;
        j->state = DONE;
        finish(j, rc, detail);
    }
}

/* Send the thread's batch and read its replies, waking each job as its
 * reply arrives. 0 when the connection was lost (and freed); then the first
 * *resend jobs of the batch are unanswered, to be queued again. */
static int round_trip(struct redis *r, struct io *io, int n, int *resend)
{
    redisContext *c = io->c;
    char why[DETAIL_MAX];
    int i = 0, demoted = 0;
    *resend = 0;

    for (; i < n; i++) {
        struct job *j = io->batch[i];
        if (redisAppendCommandArgv(c, j->argc, j->argv, j->len) != REDIS_OK) {
            say(why, sizeof why, "redis %s: out of memory queueing a command", r->where);
            for (i = 0; i < n; i++)
                finish(io->batch[i], IDEM_ENOMEM, why);
            goto lost;
        }
        io->end[i] = sdslen(c->obuf);
    }

    int done = 0;
    while (!done) {
        if (redisBufferWrite(c, &done) == REDIS_OK)
            continue;
        int e = errno;
        /* What was written may have run; what was not written whole cannot
         * have: Redis runs a command once it has all of it. */
        size_t sent = io->end[n - 1] - sdslen(c->obuf);
        int stalled = c->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK);
        if (stalled)
            say(why, sizeof why, "redis %s: sending: stalled for %lld ms", r->where,
                     (long long)r->timeout_ms);
        else
            say(why, sizeof why, "redis %s: sending: %s", r->where, c->errstr);
        /* A connection that broke (the server went away after the check
         * before use) is replaced, and what it did not take is sent once
         * more on the next one. Not what a stalled server did not take:
         * it would stall the next connection as well. */
        for (i = 0; i < n; i++) {
            struct job *j = io->batch[i];
            if (io->end[i] <= sent) {
                finish(j, IDEM_ETIMEDOUT, why);
            } else if (!stalled && !j->resent) {
                j->resent = 1;
                io->batch[(*resend)++] = j;
            } else {
                finish(j, IDEM_EUNAVAILABLE, why);
            }
        }
        goto lost;
    }

    for (i = 0; i < n; i++) {
        void *v = NULL;
        if (redisGetReply(c, &v) != REDIS_OK) {
            int e = errno;
            if (c->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK))
                say(why, sizeof why, "redis %s: no reply within %lld ms "
                         "(the command may have run)", r->where, (long long)r->timeout_ms);
            else
                say(why, sizeof why, "redis %s: connection lost: %s "
                         "(the command may have run)", r->where, c->errstr);
            for (; i < n; i++)
                finish(io->batch[i], IDEM_ETIMEDOUT, why);
            goto lost;
        }
        struct job *j = io->batch[i];
        redisReply *rep = v;
        demoted |= rep->type == REDIS_REPLY_ERROR && is_readonly(rep->str);
        j->reply = v;
        j->rc = IDEM_OK;
        sem_post(&j->done); /* j may be gone from here on */
    }
    if (demoted)
        goto lost; /* the next connection asks where the master is now */
    return 1;
lost:
    redisFree(c);
    io->c = NULL;
    sigpipe_drain();
    return 0;
}

/* Put a taken batch back at the head of the queue, in order. With r->mu. */
static void requeue(struct redis *r, struct io *io, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        struct job *j = io->batch[i];
        j->state = QUEUED;
        j->next = r->head;
        if (!r->head)
            r->tail = &j->next;
        r->head = j;
    }
}

/* Connect a thread that has none, or back off. With r->mu held; drops it
 * while connecting. */
static void reconnect(struct redis *r, struct io *io)
{
    char why[DETAIL_MAX];
    int64_t now = idem__mono_ms();
    if (now < r->retry_at) {
        if (r->nconnected == 0) {
            say(why, sizeof why, "%s (next attempt in %lld ms)", r->down,
                     (long long)(r->retry_at - now));
            fail_queue(r, IDEM_EUNAVAILABLE, why);
        } else {
            /* Another thread is connected and serves the queue meanwhile. */
            struct timespec until = idem__mono_after(r->retry_at - now);
            pthread_cond_timedwait(&r->work, &r->mu, &until);
        }
        return;
    }
    pthread_mutex_unlock(&r->mu);
    redisContext *c;
    idem_rc rc = conn_open(r, &c, 0, why, sizeof why);
    sigpipe_drain();
    pthread_mutex_lock(&r->mu);
    if (rc == IDEM_OK) {
        io->c = c;
        r->nconnected++;
        r->backoff_ms = 0;
        r->retry_at = 0;
        __atomic_store_n(&r->up_at, idem__mono_ms(), __ATOMIC_RELAXED);
        return;
    }
    r->backoff_ms = r->backoff_ms ? r->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (r->backoff_ms > BACKOFF_MAX_MS)
        r->backoff_ms = BACKOFF_MAX_MS;
    r->retry_at = idem__mono_ms() + r->backoff_ms;
    say(r->down, sizeof r->down, "%s", why);
    if (r->nconnected == 0)
        fail_queue(r, rc == IDEM_ENOMEM ? IDEM_ENOMEM : IDEM_EUNAVAILABLE, why);
}

static void *io_main(void *arg)
{
    struct io *io = arg;
    struct redis *r = io->r;
    sigset_t old;
    sigpipe_block(&old); /* for the thread's life: every write here may raise it */

    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->head && !r->stopping) {
            r->idle++;
            pthread_cond_wait(&r->work, &r->mu);
            r->idle--;
        }
        if (r->stopping)
            break;
        if (!io->c) {
            reconnect(r, io);
            continue;
        }
        int n = 0;
        while (r->head && n < BATCH_MAX) {
            struct job *j = r->head;
            r->head = j->next;
            j->state = TAKEN;
            io->batch[n++] = j;
        }
        if (!r->head)
            r->tail = &r->head;
        pthread_mutex_unlock(&r->mu);

        int alive = conn_alive(io->c), resend = 0;
        if (alive)
            alive = round_trip(r, io, n, &resend);
        pthread_mutex_lock(&r->mu);
        if (!alive) {
            if (io->c) { /* found dead before sending: the jobs wait */
                redisFree(io->c);
                io->c = NULL;
                requeue(r, io, n);
            } else {     /* lost while sending: what it did not take waits */
                requeue(r, io, resend);
            }
            r->nconnected--;
        }
    }
    /* Stopping: no caller may be waiting (close is the last call), but a
     * job must never be left unanswered. */
    fail_queue(r, IDEM_ECLOSING, "the handle is closing");
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- calls ---- */

static void unlink_job(struct redis *r, struct job *j)
{
    struct job **link = &r->head, *prev = NULL;
    while (*link && *link != j) {
        prev = *link;
        link = &(*link)->next;
    }
    if (!*link)
        return;
    *link = j->next;
    if (r->tail == &j->next)
        r->tail = prev ? &prev->next : &r->head;
}

/* Queue the job and wait for its reply. A job still queued after
 * timeout_ms is taken back: it was never sent. */
static idem_rc submit(struct redis *r, struct job *j)
{
    j->next = NULL;
    j->state = QUEUED;
    j->reply = NULL;
    j->resent = 0;
    j->rc = IDEM_OK;
    j->detail[0] = '\0';
    sem_init(&j->done, 0, 0);
    struct timespec deadline = idem__mono_after(r->timeout_ms);

    pthread_mutex_lock(&r->mu);
    if (r->stopping) {
        pthread_mutex_unlock(&r->mu);
        sem_destroy(&j->done);
        return idem__fail(IDEM_ECLOSING, "the handle is closing");
    }
    *r->tail = j;
    r->tail = &j->next;
    int wake = r->idle > 0;
    pthread_mutex_unlock(&r->mu);
    /* Broadcast: a thread backing off waits on the same condition and must
     * not swallow the wake-up meant for a connected one. */
    if (wake)
        pthread_cond_broadcast(&r->work);

    while (sem_clockwait(&j->done, CLOCK_MONOTONIC, &deadline) != 0) {
        if (errno == EINTR)
            continue;
        pthread_mutex_lock(&r->mu);
        int queued = j->state == QUEUED;
        if (queued)
            unlink_job(r, j);
        pthread_mutex_unlock(&r->mu);
        if (queued) {
            sem_destroy(&j->done);
            return idem__fail(IDEM_EUNAVAILABLE, "redis %s: not sent within %lld ms "
                              "(connecting or overloaded)", r->where,
                              (long long)r->timeout_ms);
        }
        /* In a round trip, which its own timeouts bound. */
        deadline = idem__mono_after(r->timeout_ms);
    }
    sem_destroy(&j->done);
    if (j->rc != IDEM_OK)
        return idem__fail(j->rc, "%s", j->detail);
    return IDEM_OK;
}

static void arg(struct job *j, const char *s)
{
    assert(j->argc < ARGV_MAX);
    j->argv[j->argc] = s;
    j->len[j->argc++] = strlen(s);
}

/* Load a script again after NOSCRIPT (the server's cache was flushed). */
static idem_rc load_script(struct redis *r, enum script s)
{
    struct job j = {.argc = 0};
    arg(&j, "SCRIPT");
    arg(&j, "LOAD");
    arg(&j, script_text[s]);
    idem_rc rc = submit(r, &j);
    if (rc != IDEM_OK)
        return rc;
    redisReply *rep = j.reply;
    if (rep->type == REDIS_REPLY_ERROR)
        rc = idem__fail(error_rc(rep->str), "redis %s: SCRIPT LOAD: %s", r->where, rep->str);
    else if (rep->type != REDIS_REPLY_STRING || strcmp(rep->str, r->sha[s]) != 0)
        rc = idem__fail(IDEM_ESTORE, "redis %s: SCRIPT LOAD %s: unexpected reply",
                        r->where, script_name[s]);
    freeReplyObject(rep);
    return rc;
}

/* ---- operations ---- */

/* One token or lock operation: the script's EVALSHA and its arguments, and
 * where its answer goes. The blocking calls and those on a loop build it,
 * and read its reply, with the same functions below, so they cannot
 * disagree. argv points into buf (the keys and numbers) and at the
 * caller's strings, which must outlive it. */
struct op {
    enum script s;
    int argc;
    const char *argv[ARGV_MAX];
    size_t len[ARGV_MAX];

    idem_outcome *out;
    char *spent_key;          /* consume: may be NULL */
    idem_lock_info *info;     /* acquire: may be NULL */
    int64_t ttl_ms;           /* acquire: for info */

    size_t used;              /* of buf; buf last, left out of op_init's memset */
    char buf[3 * KEY_BUF + 4 * 24];
};

static void op_arg(struct op *o, const char *s)
{
    assert(o->argc < ARGV_MAX);
    o->argv[o->argc] = s;
    o->len[o->argc++] = strlen(s);
}

/* An argument made here, in o->buf. */
static void op_argf(struct op *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void op_argf(struct op *o, const char *fmt, ...)
{
    char *p = o->buf + o->used;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p, sizeof o->buf - o->used, fmt, ap);
    va_end(ap);
    /* The checks above this layer bound every name and key (KEY_BUF). */
    assert(n >= 0 && (size_t)n < sizeof o->buf - o->used);
    o->used += (size_t)n + 1;
    op_arg(o, p);
}

/* EVALSHA of script s with nkeys keys; keys and arguments follow. */
static void op_init(struct op *o, const struct redis *r, enum script s, const char *nkeys)
{
    memset(o, 0, offsetof(struct op, buf));
    o->used = 0;
    o->s = s;
    op_arg(o, "EVALSHA");
    op_arg(o, r->sha[s]);
    op_arg(o, nkeys);
}

/* A token script's three keys. */
static void op_token_keys(struct op *o, const struct redis *r, enum script s,
                          const char *subject, const char *scene, const char *token)
{
    op_init(o, r, s, "3");
    op_argf(o, "idem:{%s}:tok:%s", scene, token);
    op_argf(o, "idem:{%s}:tq:%s", scene, subject);
    op_argf(o, "idem:{%s}:te:%s", scene, subject);
}

static void op_token_put(struct op *o, const struct redis *r, const char *subject,
                         const char *scene, const char *token, int64_t ttl_ms,
                         unsigned per_scene, int64_t now)
{
    op_token_keys(o, r, TOKEN_PUT, subject, scene, token);
    op_arg(o, subject);
    op_arg(o, token);
    op_argf(o, "%" PRId64, ttl_ms);
    op_argf(o, "%u", per_scene);
    op_argf(o, "%" PRId64, now);
    op_argf(o, "%" PRId64, now + ttl_ms);
}

/* A consume or give-back: the token's keys, then subject, token, business
 * key and now. */
static void op_spend(struct op *o, const struct redis *r, enum script s, const char *subject,
                     const char *scene, const char *token, const char *biz_key, int64_t now,
                     idem_outcome *out, char *spent_key)
{
    op_token_keys(o, r, s, subject, scene, token);
    op_arg(o, subject);
    op_arg(o, token);
    op_arg(o, biz_key ? biz_key : "");
    op_argf(o, "%" PRId64, now);
    o->out = out;
    o->spent_key = spent_key;
}

static void op_lock_acquire(struct op *o, const struct redis *r, const char *space,
                            const char *key, const char *owner, int64_t ttl_ms, int64_t now,
                            idem_outcome *out, idem_lock_info *info)
{
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    op_init(o, r, LOCK_ACQUIRE, "2");
    op_argf(o, "idem:{%s}:lock:%s", space, key);
    op_argf(o, "idem:{%s}:fence", space);
    op_arg(o, owner);
    op_argf(o, "%" PRId64, ttl_ms);
    op_argf(o, "%" PRId64, now);
    op_argf(o, "%" PRIu64,
            (uint64_t)wall.tv_sec * 1000000u + (uint64_t)wall.tv_nsec / 1000u);
    op_argf(o, "%" PRId64, now + ttl_ms);
    o->out = out;
    o->info = info;
    o->ttl_ms = ttl_ms;
}

/* Renew (ttl_ms > 0) and release: a yes-or-no script on the lock's key
 * alone. */
static void op_lock_cas(struct op *o, const struct redis *r, enum script s, const char *space,
                        const char *key, const char *owner, int64_t ttl_ms, int64_t now,
                        idem_outcome *out)
{
    op_init(o, r, s, "1");
    op_argf(o, "idem:{%s}:lock:%s", space, key);
    op_arg(o, owner);
    if (ttl_ms > 0)
        op_argf(o, "%" PRId64, ttl_ms);
    op_argf(o, "%" PRId64, now);
    if (ttl_ms > 0)
        op_argf(o, "%" PRId64, now + ttl_ms);
    o->out = out;
}

static int is_noscript(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0;
}

static idem_rc unexpected(const struct redis *r, enum script s)
{
    return idem__fail(IDEM_ESTORE, "redis %s: %s: unexpected reply", r->where, script_name[s]);
}

/* An array reply whose first element is an integer: that integer. */
static int reply_code(const redisReply *rep, long long *code)
{
    if (rep->type == REDIS_REPLY_INTEGER) {
        *code = rep->integer;
        return 1;
    }
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1 ||
        rep->element[0]->type != REDIS_REPLY_INTEGER)
        return 0;
    *code = rep->element[0]->integer;
    return 1;
}

/* What the reply to o says, into o's out-parameters: IDEM_OK, or the error
 * (a NOSCRIPT among them: the callers deal with that one first). The reply
 * stays the caller's. */
static idem_rc op_answer(const struct redis *r, struct op *o, const redisReply *rep)
{
    enum script s = o->s;
    long long code;
    if (rep->type == REDIS_REPLY_ERROR)
        return idem__fail(error_rc(rep->str), "redis %s: %s: %s", r->where, script_name[s],
                          rep->str);
    if (!reply_code(rep, &code))
        return unexpected(r, s);
    switch (s) {
    case TOKEN_PUT:
        return code == 1 ? IDEM_OK : unexpected(r, s);
    case TOKEN_CONSUME:
        if (code == 0) {
            *o->out = IDEM_UNKNOWN;
        } else if (code == 1) {
            *o->out = IDEM_CONSUMED;
        } else if (code == 2 && rep->elements == 2 &&
                   rep->element[1]->type == REDIS_REPLY_STRING &&
                   rep->element[1]->len <= IDEM_KEY_MAX) {
            *o->out = IDEM_ALREADY_CONSUMED;
            if (o->spent_key) {
                memcpy(o->spent_key, rep->element[1]->str, rep->element[1]->len);
                o->spent_key[rep->element[1]->len] = '\0';
            }
        } else {
            return unexpected(r, s);
        }
        return IDEM_OK;
    case LOCK_ACQUIRE:
        if (code == 1 && rep->elements == 2 &&
            rep->element[1]->type == REDIS_REPLY_STRING) {
            char *end;
            errno = 0;
            unsigned long long f = strtoull(rep->element[1]->str, &end, 10);
            if (errno || *end || f == 0)
                return unexpected(r, s);
            *o->out = IDEM_ACQUIRED;
            if (o->info) {
                o->info->fence = f;
                o->info->ttl_left_ms = o->ttl_ms;
                o->info->holder[0] = '\0';
            }
        } else if (code == 2 && rep->elements == 3 &&
                   rep->element[1]->type == REDIS_REPLY_STRING &&
                   rep->element[1]->len <= IDEM_KEY_MAX &&
                   rep->element[2]->type == REDIS_REPLY_INTEGER) {
            *o->out = IDEM_BUSY;
            if (o->info) {
                o->info->fence = 0;
                o->info->ttl_left_ms = rep->element[2]->integer;
                memcpy(o->info->holder, rep->element[1]->str, rep->element[1]->len);
                o->info->holder[rep->element[1]->len] = '\0';
            }
        } else {
            return unexpected(r, s);
        }
        return IDEM_OK;
    default:
        break;
    }
    /* The yes-or-no scripts. */
    if (code != 0 && code != 1)
        return unexpected(r, s);
    static const idem_outcome yes[NSCRIPTS] = {
        [TOKEN_GIVE_BACK] = IDEM_RESTORED, [LOCK_RENEW] = IDEM_RENEWED,
        [LOCK_RELEASE] = IDEM_RELEASED};
    static const idem_outcome no[NSCRIPTS] = {
        [TOKEN_GIVE_BACK] = IDEM_UNKNOWN, [LOCK_RENEW] = IDEM_NOT_HELD,
        [LOCK_RELEASE] = IDEM_NOT_HELD};
    *o->out = code == 1 ? yes[s] : no[s];
    return IDEM_OK;
}

/* ---- the blocking calls ---- */

/* Run o on the I/O threads and wait for its answer. A NOSCRIPT answer
 * loads the script again and retries once. */
static idem_rc run_op(struct redis *r, struct op *o)
{
    struct job j;
    j.argc = o->argc;
    memcpy(j.argv, o->argv, sizeof j.argv);
    memcpy(j.len, o->len, sizeof j.len);
    for (int attempt = 0;; attempt++) {
        idem_rc rc = submit(r, &j);
        if (rc != IDEM_OK)
            return rc;
        redisReply *rep = j.reply;
        if (attempt == 0 && is_noscript(rep)) {
            freeReplyObject(rep);
            if ((rc = load_script(r, o->s)) != IDEM_OK)
                return rc;
            continue;
        }
        rc = op_answer(r, o, rep);
        freeReplyObject(rep);
        return rc;
    }
}

static idem_rc token_put(void *kv, const char *subject, const char *scene,
                         const char *token, int64_t ttl_ms, unsigned per_scene,
                         int64_t now)
{
    struct op o;
    op_token_put(&o, kv, subject, scene, token, ttl_ms, per_scene, now);
    return run_op(kv, &o);
}

static idem_rc token_consume(void *kv, const char *subject, const char *scene,
                             const char *token, const char *biz_key,
                             int64_t now, idem_outcome *out, char *spent_key)
{
    struct op o;
    op_spend(&o, kv, TOKEN_CONSUME, subject, scene, token, biz_key, now, out, spent_key);
    return run_op(kv, &o);
}

static idem_rc token_give_back(void *kv, const char *subject, const char *scene,
                               const char *token, const char *biz_key,
                               int64_t now, idem_outcome *out)
{
    struct op o;
    op_spend(&o, kv, TOKEN_GIVE_BACK, subject, scene, token, biz_key, now, out, NULL);
    return run_op(kv, &o);
}

static idem_rc lock_acquire(void *kv, const char *space, const char *key,
                            const char *owner, int64_t ttl_ms, int64_t now,
                            idem_outcome *out, idem_lock_info *info)
{
    struct op o;
    op_lock_acquire(&o, kv, space, key, owner, ttl_ms, now, out, info);
    return run_op(kv, &o);
}

static idem_rc lock_renew(void *kv, const char *space, const char *key,
                          const char *owner, int64_t ttl_ms, int64_t now,
                          idem_outcome *out)
{
    struct op o;
    op_lock_cas(&o, kv, LOCK_RENEW, space, key, owner, ttl_ms, now, out);
    return run_op(kv, &o);
}

static idem_rc lock_release(void *kv, const char *space, const char *key,
                            const char *owner, int64_t now, idem_outcome *out)
{
    struct op o;
    op_lock_cas(&o, kv, LOCK_RELEASE, space, key, owner, 0, now, out);
    return run_op(kv, &o);
}

/* ---- on the caller's loop ----
 *
 * Each loop asynchronous calls are made on gets a connection of its own
 * (struct aloop, in l->kv_state): a hiredis async context whose fd the
 * loop watches through the loop interface, and the loop's timer for the
 * deadlines hiredis 0.14 cannot keep. Calls may come from any thread, so a
 * start only queues the operation under the loop's mutex and posts one
 * flush to the loop; the flush, on the loop's thread, appends everything
 * queued and writes it at once, so the calls made in one turn of the loop
 * share one write and their replies come back in one read. Each reply is
 * read by op_answer, as the blocking calls' are.
 *
 * Faults keep the blocking calls' meaning. A connection is made (without
 * blocking) when a flush finds none, unless the last attempt failed less
 * than the backoff ago: then the calls fail at once with EUNAVAILABLE and
 * the cause — but not once a connection of another loop or thread of the
 * handle has got through since that attempt began (r->up_at): the server
 * is back, and the loop connects again at once. AUTH and SELECT go first, and the operations wait for their
 * replies (one that ran on another database would be wrong). Every
 * command's reply is due timeout_ms after it was appended; when the oldest
 * one is late the connection is dropped, and each command on it fails:
 * ETIMEDOUT if it was written (it may have run), EUNAVAILABLE if not. A
 * connection that breaks (the server closed it) fails what was written
 * with ETIMEDOUT and queues what was not, once, for the next connection.
 * An idle connection is checked before use, as the I/O threads do. A NOSCRIPT
 * reply is answered by sending the same script with EVAL, which needs no
 * SCRIPT LOAD first. Letting the loop go fails what is queued or in flight
 * with ECLOSING.
 */

struct aconn;

/* One operation on a loop. */
struct acmd {
    struct acmd *next;        /* in the loop's inbox, its wait list, or in flight */
    struct idem__call *c;
    int64_t deadline;         /* monotonic ms: its reply is due */
    size_t end;               /* where it ends in the connection's output */
    int resent;               /* queued again once, after a connection broke */
    int evaled;               /* sent again as EVAL, after NOSCRIPT */
    struct op op;
};

struct aloop {
    struct redis *r;
    idem_loop *loop;

    pthread_mutex_t mu;       /* guards the inbox, posted, gone */
    struct acmd *in_head, **in_tail; /* started, not yet taken by a flush */
    int posted;               /* flush is in the loop's queue */
    int gone;                 /* let go while posted: the flush frees this */
    idem_loop_post flush;

    /* The loop's thread only. */
    struct acmd *wait_head, **wait_tail; /* for a connection to be ready */
    struct aconn *conn;
    void *timer;
    int timer_set;
    int64_t timer_at;
    int64_t retry_at;         /* monotonic ms: no connect before */
    int64_t backoff_ms;
    int64_t tried_at;         /* monotonic ms: the last connect began */
    char down[DETAIL_MAX];    /* why the last connect failed */
    /* With sentinels: a connection asks one of them first (asking), and
     * the next one goes where it said, once. */
    int asked;                /* master_host:master_port: an answer to go by */
    char master_host[IDEM_REDIS_HOST_MAX + 1];
    int master_port;
    int sentinel_next;        /* the one to ask next */
    int sentinel_tries;       /* asked in a row without an answer */
};

/* One connection of a loop's; freed by hiredis's cleanup hook. */
struct aconn {
    struct aloop *a;
    redisAsyncContext *ac;
    void *io;
    unsigned want, applied;   /* IDEM_LOOP_READ / WRITE */
    int defer;                /* appending: apply want afterwards, once */
    int connected;            /* the TCP connect completed */
    int handshake;            /* AUTH / SELECT replies still due */
    int ready;                /* those answered: operations may go */
    int asking;               /* a sentinel's: where is the master? */
    int readonly;             /* answered READONLY: demoted, used no more */
    int64_t ready_by;         /* monotonic ms: the handshake is due */
    struct acmd *head, *tail; /* in flight, in the order sent */
    size_t appended;          /* bytes appended to the output, all told */
    int dropped;              /* let go here, for why_rc and why */
    idem_rc why_rc;
    char why[DETAIL_MAX];
};

static void afinish(struct acmd *m, idem_rc rc, const char *detail)
{
    struct idem__call *c = m->c;
    idem__free(m);
    c->done(c, rc, detail);
}

static void afail_list(struct acmd *m, idem_rc rc, const char *detail)
{
    while (m) {
        struct acmd *next = m->next;
        afinish(m, rc, detail);
        m = next;
    }
}

static void await_push(struct aloop *a, struct acmd *m)
{
    m->next = NULL;
    *a->wait_tail = m;
    a->wait_tail = &m->next;
}

static struct acmd *await_take(struct aloop *a)
{
    struct acmd *m = a->wait_head;
    a->wait_head = NULL;
    a->wait_tail = &a->wait_head;
    return m;
}

static void aloop_free(struct aloop *a)
{
    if (a->timer)
        a->loop->ops->timer_free(a->timer);
    pthread_mutex_destroy(&a->mu);
    idem__free(a);
}

static void on_flush(void *arg);

/* Have a flush run on the loop soon. Any thread. */
static void aschedule(struct aloop *a)
{
    pthread_mutex_lock(&a->mu);
    int post = !a->posted;
    a->posted = 1;
    pthread_mutex_unlock(&a->mu);
    if (post)
        a->loop->ops->post(a->loop->loop, &a->flush);
}

/* The connection's wishes, to the loop (once, after appending). A failure
 * leaves the commands unanswered, and so to their deadline. */
static void aconn_apply(struct aconn *k)
{
    if (k->defer || k->want == k->applied)
        return;
    if (k->a->loop->ops->io_want(k->io, k->want) == 0)
        k->applied = k->want;
}

static void ev_add_read(void *p)
{
    struct aconn *k = p;
    k->want |= IDEM_LOOP_READ;
    aconn_apply(k);
}

static void ev_del_read(void *p)
{
    struct aconn *k = p;
    k->want &= ~IDEM_LOOP_READ;
    aconn_apply(k);
}

static void ev_add_write(void *p)
{
    struct aconn *k = p;
    k->want |= IDEM_LOOP_WRITE;
    aconn_apply(k);
}

static void ev_del_write(void *p)
{
    struct aconn *k = p;
    k->want &= ~IDEM_LOOP_WRITE;
    aconn_apply(k);
}

/* A connect that failed (refused, or the handshake refused or late): back
 * off, and fail what waited for it. */
static void aconnect_failed(struct aloop *a, const char *why)
{
    a->backoff_ms = a->backoff_ms ? a->backoff_ms * 2 : BACKOFF_MIN_MS;
    if (a->backoff_ms > BACKOFF_MAX_MS)
        a->backoff_ms = BACKOFF_MAX_MS;
    a->retry_at = idem__mono_ms() + a->backoff_ms;
    say(a->down, sizeof a->down, "%s", why);
    afail_list(await_take(a), IDEM_EUNAVAILABLE, why);
}

/* A sentinel that did not say where the master is: the next one is asked
 * at once, until each has been, in a row; then it is a failed connect. */
static void asentinel_failed(struct aloop *a, const char *why)
{
    struct redis *r = a->r;
    a->sentinel_next = (a->sentinel_next + 1) % r->sentinels;
    if (++a->sentinel_tries < r->sentinels) {
        aschedule(a);
        return;
    }
    a->sentinel_tries = 0;
    char all[DETAIL_MAX];
    say(all, sizeof all, "redis %s: no sentinel named the master (last: %s)", r->where, why);
    aconnect_failed(a, all);
}

/* hiredis frees the context: after every callback has had its NULL reply,
 * before the context goes. */
static void ev_cleanup(void *p)
{
    struct aconn *k = p;
    struct aloop *a = k->a;
    a->loop->ops->io_free(k->io);
    if (a->conn == k)
        a->conn = NULL;
    if (k->asking) {
        /* Dropped with ECLOSING: it answered (or the loop is let go). */
        if (!(k->dropped && k->why_rc == IDEM_ECLOSING)) {
            char why[DETAIL_MAX];
            if (k->dropped)
                say(why, sizeof why, "%s", k->why);
            else
                say(why, sizeof why, "%s:%d: %s", a->r->sentinel[a->sentinel_next].host,
                    a->r->sentinel[a->sentinel_next].port,
                    k->ac->errstr ? k->ac->errstr : "connection lost");
            asentinel_failed(a, why);
        }
        idem__free(k);
        return;
    }
    if ((!k->connected || !k->ready) && !(k->dropped && k->why_rc == IDEM_ECLOSING)) {
        char why[DETAIL_MAX];
        if (k->dropped)
            say(why, sizeof why, "%s", k->why);
        else
            say(why, sizeof why, "redis %s: connecting: %s", a->r->where,
                k->ac->errstr ? k->ac->errstr : "connection lost");
        aconnect_failed(a, why);
    }
    idem__free(k);
}

/* Let the connection go, for rc and why; hiredis answers each command on
 * it with a NULL reply (at once, or once the callback it is in returns). */
static void aconn_drop(struct aconn *k, idem_rc rc, const char *why)
{
    k->dropped = 1;
    k->why_rc = rc;
    say(k->why, sizeof k->why, "%s", why);
    if (k->a->conn == k)
        k->a->conn = NULL;
    redisAsyncFree(k->ac);
}

/* Set the timer for the connection's first deadline, unless it is set for
 * an earlier one (which, when it goes off, sets it again). */
static void aarm(struct aloop *a, int64_t now)
{
    struct aconn *k = a->conn;
    if (!k || !a->timer)
        return;
    int64_t at;
    if (!k->ready)
        at = k->ready_by;
    else if (k->head)
        at = k->head->deadline;
    else
        return;
    if (a->timer_set && a->timer_at <= at)
        return;
    if (a->loop->ops->timer_set(a->timer, at > now ? at - now : 0) == 0) {
        a->timer_set = 1;
        a->timer_at = at;
    }
}

static void on_timer(void *arg)
{
    struct aloop *a = arg;
    struct redis *r = a->r;
    a->timer_set = 0;
    struct aconn *k = a->conn;
    if (!k)
        return;
    int64_t now = idem__mono_ms();
    char why[DETAIL_MAX];
    if (!k->ready && now >= k->ready_by) {
        if (k->asking)
            say(why, sizeof why, "%s:%d: no reply within %lld ms",
                r->sentinel[a->sentinel_next].host, r->sentinel[a->sentinel_next].port,
                (long long)r->timeout_ms);
        else
            say(why, sizeof why, "redis %s: %s: no reply within %lld ms", r->where,
                r->password[0] ? "AUTH" : r->db ? "SELECT" : "ROLE",
                (long long)r->timeout_ms);
        aconn_drop(k, IDEM_EUNAVAILABLE, why);
    } else if (k->ready && k->head && now >= k->head->deadline) {
        say(why, sizeof why, "redis %s: no reply within %lld ms (the command may have run)",
            r->where, (long long)r->timeout_ms);
        aconn_drop(k, IDEM_ETIMEDOUT, why);
    } else {
        aarm(a, now);
    }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

/* Append m to the connection's output and count it in flight. */
static void asend(struct aconn *k, struct acmd *m, int64_t now)
{
    redisAsyncContext *ac = k->ac;
    size_t before = sdslen(ac->c.obuf);
    if (redisAsyncCommandArgv(ac, on_reply, m, m->op.argc, m->op.argv, m->op.len) !=
        REDIS_OK) {
        char why[DETAIL_MAX];
        say(why, sizeof why, "redis %s: out of memory queueing a command", k->a->r->where);
        afinish(m, IDEM_ENOMEM, why);
        return;
    }
    k->appended += sdslen(ac->c.obuf) - before;
    m->end = k->appended;
    m->deadline = now + k->a->r->timeout_ms;
    m->next = NULL;
    if (k->tail)
        k->tail->next = m;
    else
        k->head = m;
    k->tail = m;
    if (k->head == m)
        aarm(k->a, now);
}

/* A command hiredis answers with no reply: its connection is going. */
static void alost(struct aconn *k, struct acmd *m)
{
    struct aloop *a = k->a;
    struct redis *r = a->r;
    size_t written = k->appended - sdslen(k->ac->c.obuf);
    int sent = m->end <= written;
    char why[DETAIL_MAX];
    if (k->dropped) {
        if (k->why_rc == IDEM_ETIMEDOUT && !sent) {
            say(why, sizeof why, "redis %s: sending: stalled for %lld ms", r->where,
                (long long)r->timeout_ms);
            afinish(m, IDEM_EUNAVAILABLE, why);
        } else {
            afinish(m, k->why_rc, k->why);
        }
    } else if (!k->connected) {
        say(why, sizeof why, "redis %s: connecting: %s", r->where,
            k->ac->errstr ? k->ac->errstr : "failed");
        afinish(m, IDEM_EUNAVAILABLE, why);
    } else if (sent) {
        say(why, sizeof why, "redis %s: connection lost: %s (the command may have run)",
            r->where, k->ac->errstr ? k->ac->errstr : "closed");
        afinish(m, IDEM_ETIMEDOUT, why);
    } else if (!m->resent) {
        /* Not written whole, so it cannot have run: once more, on the next
         * connection, as the I/O threads do. */
        m->resent = 1;
        await_push(a, m);
        aschedule(a);
    } else {
        say(why, sizeof why, "redis %s: sending: %s", r->where,
            k->ac->errstr ? k->ac->errstr : "connection lost");
        afinish(m, IDEM_EUNAVAILABLE, why);
    }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct aconn *k = ac->data;
    struct acmd *m = priv;
    assert(k->head == m); /* replies come in the order sent */
    k->head = m->next;
    if (!k->head)
        k->tail = NULL;
    if (!reply) {
        alost(k, m);
        return;
    }
    struct redis *r = k->a->r;
    redisReply *rep = reply;
    if (!m->evaled && is_noscript(rep)) {
        /* The script cache was flushed: the same script with EVAL, which
         * needs no SCRIPT LOAD, and caches it again. */
        m->evaled = 1;
        m->op.argv[0] = "EVAL";
        m->op.len[0] = 4;
        m->op.argv[1] = script_text[m->op.s];
        m->op.len[1] = strlen(script_text[m->op.s]);
        asend(k, m, idem__mono_ms());
        return;
    }
    if (rep->type == REDIS_REPLY_ERROR && is_readonly(rep->str)) {
        k->readonly = 1; /* no more on it: the next connection asks the sentinels */
        if (!k->head)
            aschedule(k->a);
    }
    idem_rc rc = op_answer(r, &m->op, rep);
    afinish(m, rc, rc == IDEM_OK ? "" : idem_errdetail());
}

/* A sentinel's answer: where the master is, for the next connection. */
static void on_sentinel(redisAsyncContext *ac, void *reply, void *priv)
{
    struct aconn *k = ac->data;
    struct aloop *a = k->a;
    struct redis *r = a->r;
    redisReply *rep = reply;
    (void)priv;
    if (!rep)
        return; /* ev_cleanup asks the next one */
    char why[DETAIL_MAX];
    const char *not = idem__sentinel_master(rep, a->master_host, sizeof a->master_host,
                                            &a->master_port);
    if (!not) {
        a->asked = 1;
        a->sentinel_tries = 0;
        aconn_drop(k, IDEM_ECLOSING, "answered");
        aschedule(a); /* a flush connects to the master */
        return;
    }
    say(why, sizeof why, "%s:%d: %s", r->sentinel[a->sentinel_next].host,
        r->sentinel[a->sentinel_next].port, not);
    aconn_drop(k, IDEM_EUNAVAILABLE, why);
}

static void on_handshake(redisAsyncContext *ac, void *reply, void *priv)
{
    struct aconn *k = ac->data;
    const char *what = priv;
    redisReply *rep = reply;
    if (!rep)
        return; /* ev_cleanup fails the connect */
    if (rep->type == REDIS_REPLY_ERROR) {
        char why[DETAIL_MAX];
        say(why, sizeof why, "redis %s: %s: %s", k->a->r->where, what, rep->str);
        aconn_drop(k, IDEM_EUNAVAILABLE, why);
        return;
    }
    if (!strcmp(what, "ROLE") && !idem__redis_is_master(rep)) {
        char why[DETAIL_MAX];
        say(why, sizeof why, "redis %s: %s:%d, named by the sentinels, is not a master (yet)",
            k->a->r->where, k->a->master_host, k->a->master_port);
        aconn_drop(k, IDEM_EUNAVAILABLE, why);
        return;
    }
    if (--k->handshake == 0) {
        k->ready = 1;
        k->a->backoff_ms = 0;
        __atomic_store_n(&k->a->r->up_at, idem__mono_ms(), __ATOMIC_RELAXED);
        aschedule(k->a); /* not from here: the operations go from a flush */
    }
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    struct aconn *k = ac->data;
    if (status != REDIS_OK)
        return; /* hiredis frees the context next: ev_cleanup */
    k->connected = 1;
    if (k->ready) {
        /* No handshake to wait for: through, as on_handshake says of one. */
        k->a->backoff_ms = 0;
        __atomic_store_n(&k->a->r->up_at, idem__mono_ms(), __ATOMIC_RELAXED);
    }
}

/* Write what the connection has to write now, rather than a turn of the
 * loop later. The connection may be gone afterwards. */
static void awrite(struct aconn *k)
{
    sigset_t old;
    sigpipe_block(&old);
    redisAsyncHandleWrite(k->ac);
    sigpipe_restore(&old);
}

static void on_io(void *arg, unsigned ready)
{
    struct aconn *k = arg;
    struct aloop *a = k->a;
    if (ready & IDEM_LOOP_READ) {
        redisAsyncHandleRead(k->ac);
        if (a->conn != k)
            return; /* dropped, and perhaps freed */
    }
    if (ready & IDEM_LOOP_WRITE)
        awrite(k);
}

/* A connection, being made: a->conn, or an error with why (and backoff). */
static idem_rc aconn_new(struct aloop *a, int64_t now, char *why, size_t whylen)
{
    struct redis *r = a->r;
    const char *host = r->host;
    int port = r->port, asking = 0;
    if (r->sentinels && a->asked) {
        host = a->master_host; /* where a sentinel just said: once */
        port = a->master_port;
        a->asked = 0;
    } else if (r->sentinels) {
        host = r->sentinel[a->sentinel_next].host;
        port = r->sentinel[a->sentinel_next].port;
        asking = 1;
    }
    redisAsyncContext *ac = redisAsyncConnect(host, port);
    if (!ac) {
        say(why, whylen, "redis %s: out of memory connecting", r->where);
        return IDEM_ENOMEM;
    }
    if (ac->err) {
        say(why, whylen, "redis %s: connecting to %s:%d: %s", r->where, host, port, ac->errstr);
        redisAsyncFree(ac);
        if (asking) {
            asentinel_failed(a, why);
            return IDEM_OK; /* the next one is asked from a flush */
        }
        aconnect_failed(a, why);
        return IDEM_EUNAVAILABLE;
    }
    struct aconn *k = idem__calloc(1, sizeof *k);
    if (k)
        k->io = a->loop->ops->io_new(a->loop->loop, ac->c.fd, on_io, k);
    if (!k || !k->io) {
        idem__free(k);
        redisAsyncFree(ac);
        say(why, whylen, "redis %s: out of memory connecting", r->where);
        return IDEM_ENOMEM;
    }
    k->a = a;
    k->ac = ac;
    ac->data = k;
    ac->ev.data = k;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    redisAsyncSetConnectCallback(ac, on_connect);
    a->conn = k;

    int ok = 1;
    k->defer = 1;
    k->asking = asking;
    if (asking) {
        const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", r->master};
        ok &= redisAsyncCommandArgv(ac, on_sentinel, NULL, 3, argv, NULL) == REDIS_OK;
        k->handshake++;
    } else if (r->password[0]) {
        const char *argv[3] = {"AUTH", r->user, r->password};
        int argc = 3;
        if (!r->user[0]) {
            argv[1] = r->password;
            argc = 2;
        }
        ok &= redisAsyncCommandArgv(ac, on_handshake, "AUTH", argc, argv, NULL) == REDIS_OK;
        k->handshake++;
    }
    if (r->db && !asking) {
        char dbtext[16];
        snprintf(dbtext, sizeof dbtext, "%d", r->db);
        const char *argv[2] = {"SELECT", dbtext};
        ok &= redisAsyncCommandArgv(ac, on_handshake, "SELECT", 2, argv, NULL) == REDIS_OK;
        k->handshake++;
    }
    if (r->sentinels && !asking) {
        const char *argv[1] = {"ROLE"};
        ok &= redisAsyncCommandArgv(ac, on_handshake, "ROLE", 1, argv, NULL) == REDIS_OK;
        k->handshake++;
    }
    k->defer = 0;
    k->appended = sdslen(ac->c.obuf);
    k->ready = k->handshake == 0;
    k->ready_by = now + r->timeout_ms;
    if (!ok) {
        say(why, whylen, "redis %s: out of memory connecting", r->where);
        aconn_drop(k, IDEM_ECLOSING, why); /* no backoff: not the server's doing */
        return IDEM_ENOMEM;
    }
    ev_add_write(k); /* the connect completes when the socket is writable */
    aarm(a, now);
    return IDEM_OK;
}

/* Send what waits, connecting first when there is no connection. */
static void apump(struct aloop *a)
{
    struct redis *r = a->r;
    if (!a->wait_head)
        return;
    char why[DETAIL_MAX];
    if (!a->timer && !(a->timer = a->loop->ops->timer_new(a->loop->loop, on_timer, a))) {
        say(why, sizeof why, "redis %s: no memory for the loop's timer", r->where);
        afail_list(await_take(a), IDEM_ENOMEM, why);
        return;
    }
    int64_t now = idem__mono_ms();
    struct aconn *k = a->conn;
    if (k && k->connected && k->ready && !k->head && !conn_alive(&k->ac->c)) {
        /* Closed by the server while idle (a restart): nothing is lost. */
        say(why, sizeof why, "redis %s: closed by the server", r->where);
        aconn_drop(k, IDEM_EUNAVAILABLE, why);
        k = NULL;
    }
    if (k && k->readonly) {
        /* Demoted under it (a failover): once what is in flight on it is
         * answered, the sentinels are asked where the master is now. */
        if (k->head)
            return; /* on_reply schedules a flush */
        say(why, sizeof why, "redis %s: the server answered READONLY: a replica now", r->where);
        aconn_drop(k, IDEM_EUNAVAILABLE, why);
        k = NULL;
    }
    if (!k) {
        /* Backing off, unless a connection of another loop (or thread) got
         * through since this loop's last attempt began. */
        if (now < a->retry_at &&
            __atomic_load_n(&r->up_at, __ATOMIC_RELAXED) <= a->tried_at) {
            say(why, sizeof why, "%s (next attempt in %lld ms)", a->down,
                (long long)(a->retry_at - now));
            afail_list(await_take(a), IDEM_EUNAVAILABLE, why);
            return;
        }
        a->tried_at = now;
        idem_rc rc = aconn_new(a, now, why, sizeof why);
        if (rc != IDEM_OK) {
            afail_list(await_take(a), rc, why);
            return;
        }
        if (!(k = a->conn))
            return; /* a sentinel refused at once: the next is asked from a flush */
    }
    if (!k->ready)
        return; /* on_handshake schedules a flush */
    k->defer = 1;
    for (struct acmd *m = await_take(a), *next; m; m = next) {
        next = m->next;
        asend(k, m, now);
    }
    k->defer = 0;
    if (k->connected)
        awrite(k);
    else
        aconn_apply(k);
}

static void on_flush(void *arg)
{
    struct aloop *a = arg;
    pthread_mutex_lock(&a->mu);
    struct acmd *m = a->in_head;
    a->in_head = NULL;
    a->in_tail = &a->in_head;
    a->posted = 0;
    int gone = a->gone;
    pthread_mutex_unlock(&a->mu);
    if (gone) { /* let go while this was posted: left to free here */
        aloop_free(a);
        return;
    }
    if (m) {
        *a->wait_tail = m;
        while (m->next)
            m = m->next;
        a->wait_tail = &m->next;
    }
    apump(a);
}

/* Queue m for l's connection, made on first use. Any thread. */
static idem_rc astart(struct redis *r, struct idem__loop *l, struct acmd *m)
{
    /* Made once, under amu; read without it afterwards, as loops' calls
     * come from their threads at once. */
    struct aloop *a = __atomic_load_n(&l->kv_state, __ATOMIC_ACQUIRE);
    if (!a) {
        pthread_mutex_lock(&r->amu);
        a = l->kv_state;
        if (!a && (a = idem__calloc(1, sizeof *a)) != NULL) {
            a->r = r;
            a->loop = l->loop;
            pthread_mutex_init(&a->mu, NULL);
            a->in_tail = &a->in_head;
            a->wait_tail = &a->wait_head;
            a->flush.fn = on_flush;
            a->flush.arg = a;
            __atomic_store_n(&l->kv_state, a, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&r->amu);
    }
    if (!a) {
        idem__free(m);
        return idem__fail(IDEM_ENOMEM, "redis %s: no memory for the loop's connection",
                          r->where);
    }
    m->next = NULL;
    pthread_mutex_lock(&a->mu);
    *a->in_tail = m;
    a->in_tail = &m->next;
    int post = !a->posted;
    a->posted = 1;
    pthread_mutex_unlock(&a->mu);
    if (post)
        a->loop->ops->post(a->loop->loop, &a->flush);
    return IDEM_OK;
}

static struct acmd *acmd_new(struct idem__call *c)
{
    struct acmd *m = idem__malloc(sizeof *m);
    if (!m) {
        idem__fail(IDEM_ENOMEM, "redis: no memory for the call");
        return NULL;
    }
    m->c = c;
    m->resent = 0;
    m->evaled = 0;
    return m;
}

static idem_rc token_put_start(void *kv, struct idem__loop *l, const char *subject,
                               const char *scene, const char *token, int64_t ttl_ms,
                               unsigned per_scene, int64_t now, struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_token_put(&m->op, kv, subject, scene, token, ttl_ms, per_scene, now);
    return astart(kv, l, m);
}

static idem_rc token_consume_start(void *kv, struct idem__loop *l, const char *subject,
                                   const char *scene, const char *token, const char *biz_key,
                                   int64_t now, idem_outcome *out, char *spent_key,
                                   struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_spend(&m->op, kv, TOKEN_CONSUME, subject, scene, token, biz_key, now, out, spent_key);
    return astart(kv, l, m);
}

static idem_rc token_give_back_start(void *kv, struct idem__loop *l, const char *subject,
                                     const char *scene, const char *token,
                                     const char *biz_key, int64_t now, idem_outcome *out,
                                     struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_spend(&m->op, kv, TOKEN_GIVE_BACK, subject, scene, token, biz_key, now, out, NULL);
    return astart(kv, l, m);
}

static idem_rc lock_acquire_start(void *kv, struct idem__loop *l, const char *space,
                                  const char *key, const char *owner, int64_t ttl_ms,
                                  int64_t now, idem_outcome *out, idem_lock_info *info,
                                  struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_lock_acquire(&m->op, kv, space, key, owner, ttl_ms, now, out, info);
    return astart(kv, l, m);
}

static idem_rc lock_renew_start(void *kv, struct idem__loop *l, const char *space,
                                const char *key, const char *owner, int64_t ttl_ms,
                                int64_t now, idem_outcome *out, struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_lock_cas(&m->op, kv, LOCK_RENEW, space, key, owner, ttl_ms, now, out);
    return astart(kv, l, m);
}

static idem_rc lock_release_start(void *kv, struct idem__loop *l, const char *space,
                                  const char *key, const char *owner, int64_t now,
                                  idem_outcome *out, struct idem__call *c)
{
    struct acmd *m = acmd_new(c);
    if (!m)
        return IDEM_ENOMEM;
    op_lock_cas(&m->op, kv, LOCK_RELEASE, space, key, owner, 0, now, out);
    return astart(kv, l, m);
}

/* l is being let go (on its thread, or with it stopped): everything queued
 * or in flight on it fails with ECLOSING, and its connection goes. */
static void loop_gone(void *kv, struct idem__loop *l)
{
    struct redis *r = kv;
    pthread_mutex_lock(&r->amu);
    struct aloop *a = l->kv_state;
    __atomic_store_n(&l->kv_state, NULL, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&r->amu);
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    struct acmd *m = a->in_head;
    a->in_head = NULL;
    a->in_tail = &a->in_head;
    a->gone = 1;
    int posted = a->posted;
    pthread_mutex_unlock(&a->mu);
    char why[DETAIL_MAX];
    say(why, sizeof why, "redis %s: the loop was let go (idem_loop_detach or idem_close)",
        r->where);
    afail_list(await_take(a), IDEM_ECLOSING, why);
    afail_list(m, IDEM_ECLOSING, why);
    if (a->conn)
        aconn_drop(a->conn, IDEM_ECLOSING, why);
    if (a->timer)
        a->loop->ops->timer_set(a->timer, -1);
    if (!posted)
        aloop_free(a);
}

/* ---- the URL ---- */

/* The URL's parts, by the one parser of redis:// URLs (core/redis_url.c). */
static idem_rc parse_url(const char *url, struct redis *r)
{
    struct idem__redis_url u;
    idem_rc rc = idem__redis_url_parse(url, "redis_url", &u);
    if (rc != IDEM_OK)
        return rc;
    snprintf(r->host, sizeof r->host, "%s", u.host);
    r->port = u.port;
    r->sentinels = u.sentinels;
    for (int i = 0; i < u.sentinels; i++) {
        snprintf(r->sentinel[i].host, sizeof r->sentinel[i].host, "%s", u.sentinel[i].host);
        r->sentinel[i].port = u.sentinel[i].port;
    }
    snprintf(r->master, sizeof r->master, "%s", u.master);
    r->db = u.db;
    snprintf(r->user, sizeof r->user, "%s", u.user);
    snprintf(r->password, sizeof r->password, "%s", u.password);
    snprintf(r->where, sizeof r->where, "%s", u.where);
    idem__redis_url_wipe(&u);
    return IDEM_OK;
}

/* ---- open and close ---- */

static void redis_close(void *kv)
{
    struct redis *r = kv;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stopping = 1;
    pthread_mutex_unlock(&r->mu);
    pthread_cond_broadcast(&r->work);
    for (int i = 0; i < NIO; i++) {
        if (r->io[i].started)
            pthread_join(r->io[i].thread, NULL);
        if (r->io[i].c)
            redisFree(r->io[i].c);
    }
    pthread_cond_destroy(&r->work);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->amu);
    explicit_bzero(r->password, sizeof r->password);
    idem__free(r);
}

static const struct idem__kv_ops redis_ops = {
    .version = IDEM_KV_OPS_VERSION,
    .name = "redis",
    .token_put = token_put,
    .token_consume = token_consume,
    .token_give_back = token_give_back,
    .lock_acquire = lock_acquire,
    .lock_renew = lock_renew,
    .lock_release = lock_release,
    .close = redis_close,
    .token_consume_start = token_consume_start,
    .token_give_back_start = token_give_back_start,
    .lock_acquire_start = lock_acquire_start,
    .lock_renew_start = lock_renew_start,
    .lock_release_start = lock_release_start,
    .loop_gone = loop_gone,
    .token_put_start = token_put_start,
};

idem_rc idem__redis_open(const idem_options *o, const struct idem__kv_ops **ops, void **out)
{
    struct redis *r = idem__calloc(1, sizeof *r);
    if (!r)
        return idem__fail(IDEM_ENOMEM, "redis store: allocating");
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->amu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&r->work, &attr);
    pthread_condattr_destroy(&attr);
    r->tail = &r->head;
    r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;

    idem_rc rc;
    if (!o->redis_url) {
        rc = idem__fail(IDEM_EINVAL, "redis_url: NULL");
        goto fail;
    }
    if ((rc = parse_url(o->redis_url, r)) != IDEM_OK)
        goto fail;

    /* The first connection is made here, so an unreachable server is an
     * error of idem_open; it becomes the first thread's. */
    char why[DETAIL_MAX];
    sigset_t old;
    sigpipe_block(&old);
    rc = conn_open(r, &r->io[0].c, 1, why, sizeof why);
    sigpipe_restore(&old);
    if (rc != IDEM_OK) {
        idem__fail(rc, "%s", why);
        goto fail;
    }
    r->nconnected = 1;
    for (int i = 0; i < NIO; i++) {
        r->io[i].r = r;
        if (pthread_create(&r->io[i].thread, NULL, io_main, &r->io[i]) != 0) {
            rc = idem__fail(IDEM_ENOMEM, "redis store: cannot start an I/O thread");
            goto fail;
        }
        r->io[i].started = 1;
        pthread_setname_np(r->io[i].thread, "idem-redis-io"); /* for top -H, perf, gdb */
    }
    *ops = &redis_ops;
    *out = r;
    return IDEM_OK;
fail:
    redis_close(r);
    return rc;
}
