/*
 * run.c — `idem run`: a command executed once per (space, key) by whichever
 * of any number of invocations, on any number of machines sharing the
 * store, claims the key first; a scheduled job's wrapper (docs/run.md).
 *
 * The same layers as the gateway's, in one process and without the daemon:
 * the business-key lock (layer 2) queues the invocations that come at once,
 * the record (layer 3) decides. The one that gets NEW (or TAKEN_OVER, a
 * dead claim's lease having run out, with the next epoch) runs the command
 * under both: the library's watchdog renews the lock, and this file extends
 * the record's lease every lease/3 while the command runs. The command's exit
 * status and the last RUN_OUT_MAX bytes of its stdout are the record's result;
 * every later invocation prints that output and exits with that status.
 *
 * The record's lease is what keeps others out: once it is lost (an extend
 * answers CONFLICT — taken over — or fails until the last good lease has run
 * out) the command is stopped (SIGTERM, then the keeper kills all it
 * started: see "the keeper") and nothing is stored, since another
 * invocation may be running it. A lost lock alone is said and
 * the command goes on: the record still holds the others off.
 *
 * On the embedded store the lock lives in this process's memory and so
 * orders nothing between invocations: there the record alone decides, and
 * SQLite's own locks make its begin atomic across the processes on one
 * file. Opening the store is serialised with a flock() on PATH.run-lock, as
 * two processes switching a new file to WAL at once would fail one of them.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "idem.h"
#include "idem_run_help.h"
#include "mono.h"
#include "run.h"

#define RUN_OUT_MAX (64 * 1024)      /* the stdout kept: its last 64 KiB */
#define RUN_LEASE_DEFAULT_MS 60000   /* --lease */
#define RUN_RETENTION_DEFAULT_MS (7 * 86400000LL) /* --retention */
#define RUN_POLL_MS 250              /* how often a --wait looks again */
#define RUN_KILL_GRACE_MS 10000      /* SIGTERM to SIGKILL, once the claim is lost */
#define RUN_PURGE_BATCH 1000         /* expired records purged after a run */

/* The stored result: a header line, then the stdout bytes kept. */
#define RESULT_MAGIC "idem-run/1"

extern char **environ;

struct run {
    const char *space, *key;
    int64_t lease_ms, wait_ms, retention_ms;
    int exit_done;                /* --exit-done, or -1: the stored status */
    int retry_on_failure;
    char **argv;                  /* the command */
    char owner[IDEM_KEY_MAX + 1];
    idem *h;
    idem_watch *watch;
    int locked;
    uint64_t epoch;               /* our claim */
    char busy[IDEM_KEY_MAX + 128]; /* BUSY: who holds the key */
};

/* ---- what wakes the loop while the command runs ----
 *
 * The signal handlers and the watchdog's on_lost write a byte to wake[1];
 * the loop polls wake[0] beside the command's stdout. */
static int wake[2] = {-1, -1};
static volatile sig_atomic_t stop_sig; /* SIGTERM or SIGINT, to pass on to the command */
static volatile sig_atomic_t stop_seen; /* ... or that reached it already (a terminal's) */
static atomic_int lock_lost;

static void poke(void)
{
    int saved = errno;
    char c = 0;
    (void)!write(wake[1], &c, 1);
    errno = saved;
}

/* A terminal's Ctrl-C (SI_KERNEL: sent to the whole foreground process
 * group) has reached the command already: passed on, it would get two. */
static void on_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    if (sig == SIGTERM || sig == SIGINT) {
        stop_seen = sig;
        if (!si || si->si_code != SI_KERNEL)
            stop_sig = sig;
    }
    poke();
}

static void on_lock_lost(void *arg, const char *space, const char *key)
{
    (void)arg;
    (void)space;
    (void)key;
    atomic_store(&lock_lost, 1);
    poke();
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static void on_idem_log(void *arg, idem_log_level level, const char *msg)
{
    (void)arg;
    if (level != IDEM_LOG_INFO)
        fprintf(stderr, "idem run: %s\n", msg);
}

/* Store trouble: said, and EX_UNAVAILABLE. */
static int store_failed(const struct run *r, idem_rc rc, const char *doing)
{
    fprintf(stderr, "idem run: %s/%s: %s: %s (%s)\n", r->space, r->key, doing, idem_strerror(rc),
            idem_errdetail());
    return EX_UNAVAILABLE;
}

/* Give back the lock (the record is finished or left by the caller). */
static void let_go(struct run *r)
{
    idem_watchdog_stop(r->watch);
    r->watch = NULL;
    if (r->locked) {
        idem_outcome o;
        (void)idem_lock_release(r->h, r->space, r->key, r->owner, &o);
        r->locked = 0;
    }
}

/* ---- the result ---- */

/* "idem-run/1 status=S signal=N kept=K dropped=D\n" and K bytes of stdout:
 * the command's exit status (128 + N when signal N ended it), and the tail
 * of its stdout, D bytes before it not kept. NULL without memory. */
static char *result_encode(int status, int sig, const char *out, size_t kept,
                           unsigned long long dropped, size_t *len)
{
    char head[128];
    int n = snprintf(head, sizeof head, RESULT_MAGIC " status=%d signal=%d kept=%zu dropped=%llu\n",
                     status, sig, kept, dropped);
    char *b = malloc((size_t)n + kept);
    if (!b)
        return NULL;
    memcpy(b, head, (size_t)n);
    memcpy(b + n, out, kept);
    *len = (size_t)n + kept;
    return b;
}

/* The other way: 0 with the fields set, or -1 for anything not so made. */
static int result_decode(const void *res, size_t len, int *status, const char **out, size_t *kept,
                         unsigned long long *dropped)
{
    const char *b = res, *nl = b ? memchr(b, '\n', len < 128 ? len : 128) : NULL;
    char head[128];
    int sig, used = -1;
    if (!nl)
        return -1;
    memcpy(head, b, (size_t)(nl - b));
    head[nl - b] = '\0';
    if (sscanf(head, RESULT_MAGIC " status=%d signal=%d kept=%zu dropped=%llu%n", status, &sig,
               kept, dropped, &used) != 4 ||
        used != nl - b || *status < 0 || *status > 255 || *kept != len - (size_t)(nl - b + 1))
        return -1;
    *out = nl + 1;
    return 0;
}

/* What a finished record (DONE) makes this invocation do: print the
 * stored stdout, exit with the stored status (or --exit-done). */
static int replay(const struct run *r, const idem_record *rec)
{
    int status;
    const char *out;
    size_t kept;
    unsigned long long dropped;
    if (result_decode(rec->result, rec->result_len, &status, &out, &kept, &dropped) != 0) {
        fprintf(stderr,
                "idem run: %s/%s: its record (%s) holds no result of idem run: the space is "
                "another's (a route's, a consumer's); give idem run a space of its own\n",
                r->space, r->key, rec->state);
        return EX_DATAERR;
    }
    fprintf(stderr, "idem run: %s/%s: ran already (%s, exit status %d): its output follows%s\n",
            r->space, r->key, rec->state, status,
            dropped ? ", without the start it did not keep" : "");
    if (kept && fwrite(out, 1, kept, stdout) != kept)
        fprintf(stderr, "idem run: writing the output: %s\n", strerror(errno));
    fflush(stdout);
    return r->exit_done >= 0 ? r->exit_done : status;
}

/* ---- claiming the key ---- */

enum claim { CLAIM_RUN, CLAIM_DONE, CLAIM_BUSY, CLAIM_ERROR };

/* One try. RUN: the lock and the claim are ours (r->epoch). DONE: rec is
 * the finished record. BUSY: r->busy says who has the key. ERROR: said,
 * and *status is the exit status. */
static enum claim try_claim(struct run *r, idem_record *rec, int *status)
{
    idem_outcome o;
    idem_lock_info info;
    idem_rc rc = idem_lock_acquire(r->h, r->space, r->key, r->owner, r->lease_ms, &o, &info);
    if (rc != IDEM_OK) {
        *status = store_failed(r, rc, "taking the lock");
        return CLAIM_ERROR;
    }
    if (o == IDEM_BUSY) {
        /* Its holder may have finished the record and not let go yet. */
        if ((rc = idem_record_get(r->h, r->space, r->key, &o, rec)) != IDEM_OK) {
            *status = store_failed(r, rc, "reading the record");
            return CLAIM_ERROR;
        }
        if (o == IDEM_FOUND && idem_record_finished(rec->state))
            return CLAIM_DONE;
        idem_record_clear(rec);
        snprintf(r->busy, sizeof r->busy, "its lock is held by %s for %lld ms more", info.holder,
                 (long long)info.ttl_left_ms);
        return CLAIM_BUSY;
    }
    r->locked = 1;
    if (idem_watchdog_start(r->h, r->space, r->key, r->owner, r->lease_ms, on_lock_lost, NULL,
                            &r->watch) != IDEM_OK) {
        r->watch = NULL;
        fprintf(stderr, "idem run: %s/%s: the lock's watchdog did not start (%s): the lock ends "
                "after its lease, and the record's claim holds the key after that\n",
                r->space, r->key, idem_errdetail());
    }
    rc = idem_record_begin(r->h, r->space, r->key, NULL, r->owner, r->lease_ms, &o, rec);
    if (rc != IDEM_OK) {
        let_go(r);
        *status = store_failed(r, rc, "claiming the record");
        return CLAIM_ERROR;
    }
    switch (o) {
    case IDEM_NEW:
    case IDEM_TAKEN_OVER:
        r->epoch = rec->epoch;
        idem_record_clear(rec);
        return CLAIM_RUN;
    case IDEM_DONE:
        let_go(r);
        return CLAIM_DONE;
    case IDEM_IN_PROGRESS:
        let_go(r);
        snprintf(r->busy, sizeof r->busy, "its record is PROCESSING, claimed by %s",
                 rec->owner);
        idem_record_clear(rec);
        return CLAIM_BUSY;
    default: /* MISMATCH: a record made with a fingerprint, which idem run gives none */
        let_go(r);
        fprintf(stderr, "idem run: %s/%s: the key's record is another's (%s): give idem run a "
                "space of its own\n", r->space, r->key, idem_outcome_name(o));
        idem_record_clear(rec);
        *status = EX_DATAERR;
        return CLAIM_ERROR;
    }
}

/* ---- running the command ---- */

/* The environment with IDEM_EPOCH=epoch in place of any IDEM_EPOCH. */
static char **child_env(uint64_t epoch)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof *env);
    char *mine = malloc(48);
    if (!env || !mine) {
        free(env);
        free(mine);
        return NULL;
    }
    snprintf(mine, 48, "IDEM_EPOCH=%" PRIu64, epoch);
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "IDEM_EPOCH=", 11) != 0)
            env[j++] = environ[i];
    env[j] = mine;
    return env;
}

/* In the command's process, between fork and exec: only async-signal-safe
 * calls. It dies with the keeper (PR_SET_PDEATHSIG), whose pid is parent. */
static void child(struct run *r, char **env, int out, int errpipe, pid_t parent,
                  const sigset_t *was)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGTERM, &dfl, NULL);
    sigaction(SIGINT, &dfl, NULL);
    sigaction(SIGUSR1, &dfl, NULL);
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    sigprocmask(SIG_SETMASK, was, NULL);
    int err = 0;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        err = errno;
    else if (getppid() != parent)
        _exit(EX_SOFTWARE); /* it died already */
    if (!err && dup2(out, STDOUT_FILENO) < 0)
        err = errno;
    if (!err) {
        /* Nothing of the store's (sockets, files) reaches the command. */
        if (close_range(3, ~0u, CLOSE_RANGE_CLOEXEC) != 0)
            for (int fd = 3; fd < 65536; fd++)
                if (fd != errpipe)
                    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
        execvpe(r->argv[0], r->argv, env);
        err = errno;
    }
    (void)!write(errpipe, &err, sizeof err);
    _exit(err == ENOENT ? 127 : 126);
}

/* ---- the keeper ----
 *
 * Between idem run and the command stands a process of ours, the keeper.
 * Once idem run is gone nothing renews the claim, and after its lease
 * another invocation runs the command: nothing of this one may still run
 * then. PR_SET_PDEATHSIG alone would end the command's first process
 * only, and a shell script's own children would run on. So the keeper is
 * the subreaper of everything the command starts (PR_SET_CHILD_SUBREAPER:
 * what a dying process leaves is handed to it, not to init), and when idem
 * run dies (its PR_SET_PDEATHSIG, SIGUSR1) or asks (SIGUSR1: the claim is
 * lost and its grace is over) it kills every process under it, until none
 * is left. Otherwise it passes SIGTERM and SIGINT on to the command (a
 * terminal's, sent to the whole group, reached the command already) and
 * exits as the command did. Forked from a process with threads, it makes
 * only async-signal-safe calls. A process that makes itself a daemon of
 * its own (setsid, then a double fork) is still under the keeper and goes
 * too. */

static volatile sig_atomic_t keeper_kill;
static volatile pid_t keeper_cmd;

static void keeper_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    if (sig == SIGUSR1)
        keeper_kill = 1;
    else if (keeper_cmd > 0 && (!si || si->si_code != SI_KERNEL))
        kill(keeper_cmd, sig);
}

/* The decimal digits of v at the end of buf[0..cap), NUL-terminated:
 * where they start. */
static char *digits(char *buf, size_t cap, long v)
{
    char *p = buf + cap - 1;
    *p = '\0';
    do
        *--p = (char)('0' + v % 10);
    while ((v /= 10) > 0 && p > buf);
    return p;
}

/* Kill every process under the keeper, those handed to it as their parents
 * die included, and reap them all. */
static void kill_all(void)
{
    char num[24], path[64] = "/proc/self/task/";
    const char *pid = digits(num, sizeof num, (long)getpid());
    size_t n = strlen(path), k = strlen(pid);
    memcpy(path + n, pid, k);
    memcpy(path + n + k, "/children", 10);
    for (;;) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            kill(keeper_cmd, SIGKILL); /* no children list: the command at least */
        } else {
            char buf[4096];
            ssize_t got;
            long v = 0;
            int in = 0;
            while ((got = read(fd, buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR))
                for (ssize_t i = 0; i < got; i++) {
                    if (buf[i] >= '0' && buf[i] <= '9') {
                        v = v * 10 + (buf[i] - '0');
                        in = 1;
                    } else if (in) {
                        kill((pid_t)v, SIGKILL);
                        v = 0;
                        in = 0;
                    }
                }
            if (in)
                kill((pid_t)v, SIGKILL);
            close(fd);
        }
        int st;
        if (waitpid(-1, &st, 0) < 0 && errno == ECHILD)
            return;
    }
}

static void keeper(struct run *r, char **env, int out, int errpipe, pid_t parent,
                   const sigset_t *was)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = keeper_signal;
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: a signal ends the waitpid below */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    prctl(PR_SET_NAME, "idem-keeper");
    int err = 0;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0 || prctl(PR_SET_PDEATHSIG, SIGUSR1) != 0)
        err = errno;
    else if (getppid() != parent)
        _exit(EX_SOFTWARE); /* idem run died already */
    pid_t me = getpid();
    pid_t cmd = err ? -1 : fork();
    if (cmd == 0)
        child(r, env, out, errpipe, me, was);
    if (cmd < 0) {
        if (!err)
            err = errno;
        (void)!write(errpipe, &err, sizeof err);
        _exit(126);
    }
    keeper_cmd = cmd;
    close(out);     /* the command's stdout ends when the command's does */
    close(errpipe); /* the exec's answer is the command's to give */
    sigprocmask(SIG_SETMASK, was, NULL);
    int st = 0;
    for (;;) {
        if (keeper_kill) {
            kill_all();
            _exit(128 + SIGKILL);
        }
        pid_t w = waitpid(cmd, &st, 0);
        if (w == cmd)
            break;
        if (w < 0 && errno != EINTR)
            _exit(EX_OSERR);
    }
    if (keeper_kill)
        kill_all();
    if (!WIFSIGNALED(st))
        _exit(WEXITSTATUS(st));
    /* Ended by a signal: so is the keeper, for idem run to see. */
    int sig = WTERMSIG(st);
    sigaction(sig, &dfl, NULL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

/* The tail of what the command wrote to stdout. */
struct tail {
    char buf[RUN_OUT_MAX];
    size_t len;
    unsigned long long dropped; /* bytes before buf[0] not kept */
};

static void tail_add(struct tail *t, const char *p, size_t n)
{
    if (n > RUN_OUT_MAX) {
        t->dropped += n - RUN_OUT_MAX;
        p += n - RUN_OUT_MAX;
        n = RUN_OUT_MAX;
    }
    if (t->len + n > RUN_OUT_MAX) {
        size_t drop = t->len + n - RUN_OUT_MAX;
        memmove(t->buf, t->buf + drop, t->len - drop);
        t->len -= drop;
        t->dropped += drop;
    }
    memcpy(t->buf + t->len, p, n);
    t->len += n;
}

/* Our stdout, as the command's goes by; once it fails (a reader gone), the
 * rest is only kept. */
static void pass_on(int *broken, const char *p, size_t n)
{
    while (!*broken && n) {
        ssize_t w = write(STDOUT_FILENO, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            *broken = 1;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Finish the claim with what the command did: complete, or fail for good,
 * or release (retryable: the next invocation runs it again). A store
 * error is tried again until the last good lease ends (the claim is ours
 * until then). 0, or an exit status with the reason said. */
static int finish_claim(struct run *r, idem_fail_mode mode, int ok, const char *res, size_t len,
                        int64_t lease_end)
{
    const char *what = ok ? "completing the record"
                          : mode == IDEM_FAIL_RETRYABLE ? "releasing the record"
                                                        : "failing the record";
    for (;;) {
        idem_outcome o;
        idem_rc rc = ok ? idem_record_complete(r->h, r->space, r->key, r->epoch, res, len,
                                               r->retention_ms, &o)
                        : idem_record_fail(r->h, r->space, r->key, r->epoch, mode, res, len,
                                           r->retention_ms, &o);
        if (rc == IDEM_OK && o == IDEM_COMPLETED)
            return 0;
        if (rc == IDEM_OK) {
            fprintf(stderr, "idem run: %s/%s: %s: %s: the claim (epoch %" PRIu64 ") was taken "
                    "over meanwhile; nothing is stored\n", r->space, r->key, what,
                    idem_outcome_name(o), r->epoch);
            return EX_SOFTWARE;
        }
        if (mono_ms() + RUN_POLL_MS >= lease_end) {
            store_failed(r, rc, what);
            fprintf(stderr, "idem run: %s/%s: the command ran, and its record stays PROCESSING "
                    "until its lease ends: then the next invocation runs it again\n",
                    r->space, r->key);
            return EX_UNAVAILABLE;
        }
        sleep_ms(RUN_POLL_MS);
    }
}

/* on_signal for sig, or its default action. */
static void set_handler(int sig, int on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (on) {
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_RESTART | SA_SIGINFO;
    } else {
        sa.sa_handler = SIG_DFL;
    }
    sigaction(sig, &sa, NULL);
}

/* Run the command under our claim; the exit status. */
static int execute(struct run *r)
{
    static struct tail tail;
    int out[2] = {-1, -1}, ex[2] = {-1, -1};
    char **env = child_env(r->epoch);
    int rc = EX_OSERR;
    if (!env || pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
        pipe2(ex, O_CLOEXEC) != 0) {
        fprintf(stderr, "idem run: %s/%s: %s\n", r->space, r->key,
                env ? strerror(errno) : "out of memory");
        goto not_run;
    }
    set_handler(SIGTERM, 1);
    set_handler(SIGINT, 1);
    set_handler(SIGCHLD, 1);
    /* No signal is handled in the child before it resets the handlers. */
    sigset_t all, was;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &was);
    pid_t parent = getpid(), pid = fork();
    if (pid == 0)
        keeper(r, env, out[1], ex[1], parent, &was);
    int fork_errno = errno;
    sigprocmask(SIG_SETMASK, &was, NULL);
    close(out[1]);
    close(ex[1]);
    out[1] = ex[1] = -1;
    if (pid < 0) {
        fprintf(stderr, "idem run: %s/%s: fork: %s\n", r->space, r->key, strerror(fork_errno));
        goto not_run;
    }
    /* The exec's answer: EOF once it succeeded, its errno if not. */
    int exec_errno = 0;
    ssize_t got;
    while ((got = read(ex[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR)
        ;
    if (got == (ssize_t)sizeof exec_errno) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        fprintf(stderr, "idem run: %s/%s: cannot run %s: %s (the record is released: it did "
                "not run)\n", r->space, r->key, r->argv[0], strerror(exec_errno));
        rc = exec_errno == ENOENT ? 127 : 126;
        goto not_run;
    }

    int64_t tick = r->lease_ms / 3, now = mono_ms();
    int64_t next_extend = now + tick, lease_end = now + r->lease_ms, kill_at = 0;
    int reaped = 0, status = 0, sig = 0, stdout_broken = 0, lost = 0, said_lock = 0;
    int stopped = 0; /* a SIGTERM or SIGINT reached the command */
    tail.len = 0;
    tail.dropped = 0;
    while (out[0] >= 0 || !reaped) {
        now = mono_ms();
        int64_t wait = next_extend - now;
        if (lost && !reaped && kill_at - now < wait)
            wait = kill_at - now;
        struct pollfd p[2] = {{wake[0], POLLIN, 0}, {out[0], POLLIN, 0}};
        /* The command gone, its stdout may still be held by a process it
         * left behind: what is there is read, nothing waited for. */
        if (reaped)
            wait = 0;
        int n = poll(p, out[0] >= 0 ? 2 : 1, wait < 0 ? 0 : (int)wait);
        if (n < 0 && errno != EINTR)
            break;
        if (n > 0 && (p[0].revents & POLLIN)) {
            char drain[64];
            while (read(wake[0], drain, sizeof drain) > 0)
                ;
        }
        if (n > 0 && out[0] >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            char buf[16384];
            ssize_t k = read(out[0], buf, sizeof buf);
            if (k > 0) {
                pass_on(&stdout_broken, buf, (size_t)k);
                tail_add(&tail, buf, (size_t)k);
            } else if (k == 0 || errno != EINTR) {
                close(out[0]);
                out[0] = -1;
            }
        } else if (reaped && out[0] >= 0 && n == 0) {
            close(out[0]); /* nothing more now: not waited for */
            out[0] = -1;
        }
        if (stop_seen && !reaped) {
            if (stop_sig)
                kill(pid, stop_sig);
            stopped = stop_seen;
            stop_sig = stop_seen = 0;
        }
        if (!reaped) {
            int st;
            pid_t w = waitpid(pid, &st, WNOHANG);
            if (w == pid) {
                reaped = 1;
                if (WIFSIGNALED(st)) {
                    sig = WTERMSIG(st);
                    status = 128 + sig;
                } else {
                    status = WEXITSTATUS(st);
                }
            }
        }
        if (atomic_load(&lock_lost) && !said_lock) {
            said_lock = 1;
            fprintf(stderr, "idem run: %s/%s: the lock was lost (not renewed in time); the "
                    "record's claim still holds the key, and the command goes on\n",
                    r->space, r->key);
        }
        now = mono_ms();
        if (!lost && !reaped && now >= next_extend) {
            idem_outcome o;
            idem_rc e = idem_record_extend(r->h, r->space, r->key, r->epoch, r->lease_ms, &o);
            if (e == IDEM_OK && o == IDEM_RENEWED) {
                lease_end = now + r->lease_ms;
            } else if (e == IDEM_OK || now >= lease_end) {
                lost = 1;
                fprintf(stderr, "idem run: %s/%s: the claim (epoch %" PRIu64 ") is lost (%s): "
                        "another invocation may run the command now. Stopping it (SIGTERM; then "
                        "all it started killed after %d s); nothing is stored\n",
                        r->space, r->key, r->epoch,
                        e == IDEM_OK ? idem_outcome_name(o) : "its lease ran out while the "
                                                                "store failed",
                        RUN_KILL_GRACE_MS / 1000);
                kill(pid, SIGTERM);
                kill_at = now + RUN_KILL_GRACE_MS;
            } else {
                fprintf(stderr, "idem run: %s/%s: extending the lease: %s (%s); trying again\n",
                        r->space, r->key, idem_strerror(e), idem_errdetail());
            }
            next_extend = now + (e == IDEM_OK ? tick : RUN_POLL_MS);
        }
        if (lost && !reaped && kill_at && mono_ms() >= kill_at) {
            kill(pid, SIGUSR1); /* the keeper kills it, and all it started */
            kill_at = INT64_MAX;
        }
    }
    if (out[0] >= 0)
        close(out[0]);
    out[0] = -1;
    set_handler(SIGTERM, 0);
    set_handler(SIGINT, 0);
    if (lost) {
        let_go(r);
        rc = EX_SOFTWARE;
        goto out;
    }
    size_t len = 0;
    char *res = result_encode(status, sig, tail.buf, tail.len, tail.dropped, &len);
    if (!res) {
        fprintf(stderr, "idem run: %s/%s: out of memory storing the result: the record stays "
                "PROCESSING until its lease ends\n", r->space, r->key);
        let_go(r);
        rc = EX_OSERR;
        goto out;
    }
    int ok = status == 0;
    idem_fail_mode mode = (stopped || r->retry_on_failure) ? IDEM_FAIL_RETRYABLE : IDEM_FAIL_FINAL;
    if (!ok && stopped)
        fprintf(stderr, "idem run: %s/%s: the command was stopped (signal %d) and "
                "exited %d: its record is released, and the next invocation runs it again\n",
                r->space, r->key, stopped, status);
    int bad = finish_claim(r, mode, ok, res, len, lease_end);
    free(res);
    let_go(r);
    rc = bad ? bad : status;
    unsigned purged;
    (void)idem_record_purge(r->h, RUN_PURGE_BATCH, &purged); /* no daemon may purge this store */
    goto out;

not_run:
    /* Never started: released, so that the next invocation runs it. */
    if (r->epoch) {
        idem_outcome o;
        idem_rc e = idem_record_fail(r->h, r->space, r->key, r->epoch, IDEM_FAIL_RETRYABLE, NULL,
                                     0, 0, &o);
        if (e != IDEM_OK)
            store_failed(r, e, "releasing the record");
    }
    let_go(r);
out:
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (ex[i] >= 0)
            close(ex[i]);
    }
    if (env) {
        for (size_t i = 0; env[i]; i++)
            if (strncmp(env[i], "IDEM_EPOCH=", 11) == 0 && !env[i + 1])
                free(env[i]);
        free(env);
    }
    return rc;
}

/* ---- the command line ---- */

/* idem_run_help: docs/man/idem-run.txt, which idem-run(1) is made from too. */
static void usage(FILE *out)
{
    fputs(idem_run_help, out);
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "idem run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(idem run --help lists the options)\n");
    va_end(ap);
    return EX_USAGE;
}

/* A duration option in lo..hi ms. 0, or -1 said. */
static int duration_arg(const char *name, const char *s, int64_t lo, int64_t hi, int64_t *ms,
                        const char *range)
{
    if (config_parse_duration(s, ms) != 0 || *ms < lo || *ms > hi) {
        fprintf(stderr, "idem run: --%s %s: not a duration in %s (500ms, 30s, 10m, 24h, 7d)\n"
                "(idem run --help lists the options)\n", name, s, range);
        return -1;
    }
    return 0;
}

/* Who we are in the store: the lock's holder and the record's owner. */
static void make_owner(struct run *r)
{
    char host[65] = "";
    unsigned char rnd[6] = {0};
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "?");
    for (char *p = host; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        memset(rnd, 0, sizeof rnd);
    snprintf(r->owner, sizeof r->owner, "run:%s:%ld:%02x%02x%02x%02x%02x%02x", host,
             (long)getpid(), rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5]);
}

/* Open the store cfg names; the exit status on failure, 0 on success. */
static int open_store(struct run *r, const struct server_config *cfg)
{
    idem_options o;
    idem_options_init(&o);
    o.store = cfg->storage_kind;
    o.path = cfg->storage_path;
    o.redis_url = cfg->redis_url;
    o.postgres_url = cfg->postgres_url;
    o.pool_size = cfg->storage_pool;
    o.timeout_ms = cfg->storage_timeout_ms;
    o.pool_size = 1; /* one read at a time, beside PostgreSQL's two writers */
    o.result_max = RUN_OUT_MAX + 128; /* the stdout kept and its header line */
    o.log = on_idem_log;
    int embedded = strcmp(cfg->storage_kind, "embedded") == 0, lock = -1;
    char where[1100];
    config_storage_where(cfg, where, sizeof where);
    if (embedded) {
        /* Two processes switching a new file to WAL at once: one is refused
         * at once ("database is locked"; SQLite calls no busy handler for
         * it). So the opens on one file take turns. */
        char path[4200];
        snprintf(path, sizeof path, "%s.run-lock", cfg->storage_path);
        lock = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (lock < 0 || flock(lock, LOCK_EX) != 0) {
            fprintf(stderr, "idem run: locking %s: %s\n", path, strerror(errno));
            if (lock >= 0)
                close(lock);
            return EX_UNAVAILABLE;
        }
    }
    idem_rc rc = idem_open(&o, &r->h);
    if (lock >= 0)
        close(lock);
    if (rc != IDEM_OK) {
        fprintf(stderr, "idem run: opening the %s store at %s: %s\n", cfg->storage_kind, where,
                idem_errdetail());
        return EX_UNAVAILABLE;
    }
    return 0;
}

int run_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db", required_argument, NULL, 'd'},
        {"space", required_argument, NULL, 's'},
        {"key", required_argument, NULL, 'k'},
        {"lease", required_argument, NULL, 'l'},
        {"wait", required_argument, NULL, 'w'},
        {"exit-done", required_argument, NULL, 'x'},
        {"retry-on-failure", no_argument, NULL, 'r'},
        {"retention", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct run r;
    memset(&r, 0, sizeof r);
    r.lease_ms = RUN_LEASE_DEFAULT_MS;
    r.retention_ms = RUN_RETENTION_DEFAULT_MS;
    r.exit_done = -1;
    const char *config_path = NULL, *db = NULL;
    int c;
    optind = 1;
    opterr = 0;
    /* '+': the options end at the command, whose own are its own. */
    while ((c = getopt_long(argc, argv, "+c:s:k:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'd': db = optarg; break;
        case 's': r.space = optarg; break;
        case 'k': r.key = optarg; break;
        case 'r': r.retry_on_failure = 1; break;
        case 'l':
            if (duration_arg("lease", optarg, 1000, 86400000, &r.lease_ms, "1s..1d") != 0)
                return EX_USAGE;
            break;
        case 'w':
            if (duration_arg("wait", optarg, 0, 86400000, &r.wait_ms, "0..1d") != 0)
                return EX_USAGE;
            break;
        case 't':
            if (duration_arg("retention", optarg, 1000, 3650 * 86400000LL, &r.retention_ms,
                             "1s..3650d") != 0)
                return EX_USAGE;
            break;
        case 'x': {
            char *end;
            errno = 0;
            long n = strtol(optarg, &end, 10);
            if (errno || end == optarg || *end || n < 0 || n > 255)
                return usage_error("--exit-done %s: not an exit status (0..255)", optarg);
            r.exit_done = (int)n;
            break;
        }
        case 'h': usage(stdout); return 0;
        default:
            if (optopt)
                fprintf(stderr, "idem run: -%c: %s\n", optopt,
                        strchr("cskh", optopt) ? "needs a value" : "not an option");
            else
                fprintf(stderr, "idem run: %s: not an option, or it needs a value\n",
                        argv[optind - 1]);
            fprintf(stderr, "(idem run --help lists the options)\n");
            return EX_USAGE;
        }
    }
    if (!r.space)
        return usage_error("--space is needed: the key space of the job's keys");
    if (!config_is_name(r.space))
        return usage_error("--space '%s': not a key space (1 to 64 of A-Z a-z 0-9 _ . : -)",
                           r.space);
    if (!r.key)
        return usage_error("--key is needed: what makes one run of the job one");
    if (idem_check_key(r.key) != IDEM_OK)
        return usage_error("--key: %s", idem_errdetail());
    if (optind >= argc)
        return usage_error("no command given (idem run [options] -- COMMAND [ARG...])");
    r.argv = argv + optind;
    /* A closed stdin, stdout or stderr (a careless caller may start us so)
     * would be taken by the first file opened: the store's, or the pipe the
     * command's stdout becomes. /dev/null holds their places. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return EX_OSERR;

    char err[512];
    struct server_config *cfg = NULL;
    if (config_path) {
        if (config_load(config_path, &cfg, err, sizeof err) != 0) {
            fprintf(stderr, "idem run: %s\n", err);
            return EX_CONFIG;
        }
    } else if (!(cfg = config_default())) {
        fprintf(stderr, "idem run: out of memory\n");
        return EX_OSERR;
    }
    int rc = EX_USAGE;
    if (db && strcmp(cfg->storage_kind, "embedded") != 0) {
        fprintf(stderr, "idem run: --db is for the embedded store; %s keeps storage.kind: %s\n",
                config_path, cfg->storage_kind);
        goto out;
    }
    if (db) {
        char *copy = strdup(db);
        if (!copy) {
            rc = EX_OSERR;
            goto out;
        }
        free(cfg->storage_path);
        cfg->storage_path = copy;
    }
    if (strcmp(cfg->storage_kind, "embedded") == 0 &&
        (strcmp(cfg->storage_path, ":memory:") == 0 ||
         strncmp(cfg->storage_path, "file:", 5) == 0)) {
        fprintf(stderr, "idem run: the embedded store %s: idem run needs a file's path, which "
                "every invocation opens (a store in memory ends with the process)\n",
                cfg->storage_path);
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    make_owner(&r);
    srandom((unsigned)getpid() ^ (unsigned)mono_ms()); /* --wait's naps, apart */
    if ((rc = open_store(&r, cfg)) != 0)
        goto out;

    int64_t deadline = mono_ms() + r.wait_ms;
    int said = 0;
    for (;;) {
        idem_record rec;
        memset(&rec, 0, sizeof rec);
        int status = 0;
        enum claim got = try_claim(&r, &rec, &status);
        if (got == CLAIM_RUN) {
            rc = execute(&r);
            break;
        }
        if (got == CLAIM_DONE) {
            rc = replay(&r, &rec);
            idem_record_clear(&rec);
            break;
        }
        if (got == CLAIM_ERROR) {
            rc = status;
            break;
        }
        int64_t now = mono_ms();
        if (now >= deadline) {
            fprintf(stderr, "idem run: %s/%s: running elsewhere (%s)%s\n", r.space, r.key, r.busy,
                    r.wait_ms ? ": --wait ran out" : "");
            rc = EX_TEMPFAIL;
            break;
        }
        if (!said) {
            fprintf(stderr, "idem run: %s/%s: running elsewhere (%s): waiting for it, up to "
                    "%lld ms\n", r.space, r.key, r.busy, (long long)(deadline - now));
            said = 1;
        }
        int64_t nap = RUN_POLL_MS / 2 + (int64_t)(random() % RUN_POLL_MS);
        sleep_ms(nap < deadline - now ? nap : deadline - now);
    }
    idem_close(r.h);
out:
    config_free(cfg);
    return rc;
}
