/* SPDX-License-Identifier: Apache-2.0 */
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
 * While the command runs, everything happens on one libevent loop, the
 * daemon's model: the lease's extensions are asynchronous store calls, the
 * command's stdout is read and passed on to ours without ever blocking (a
 * reader of ours that stalls stops our reading of the command's pipe, which
 * stops the command's writes: back-pressure, in bounded memory), and
 * signals and the command's exit wake the loop through a pipe. Nothing on
 * the loop waits, so a stalled stdout cannot keep the lease from being
 * renewed: that was a second execution (the lease lapsed while a blocking
 * write waited, and another invocation took the key over).
 *
 * The record's lease is what keeps others out: once it is lost (an extend
 * answers CONFLICT — taken over — or no extension succeeds before the last
 * good lease has run out) the command is stopped (SIGTERM, then the keeper
 * kills all it started: see "the keeper") and nothing is stored, since
 * another invocation may be running it. A lost lock alone is said and the
 * command goes on: the record still holds the others off.
 *
 * On the embedded store the lock lives in this process's memory and so
 * orders nothing between invocations: there the record alone decides, and
 * SQLite's own locks make its begin atomic across the processes on one
 * file. Opening the store is serialised with a flock() on PATH.run-lock, as
 * two processes switching a new file to WAL at once would fail one of them.
 */
#include <assert.h>
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
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "config.h"
#include "idem.h"
#include "idem/libevent.h"
#include "idem_run_help.h"
#include "mono.h"
#include "run.h"

#define RUN_OUT_MAX (64 * 1024)      /* the stdout kept: its last 64 KiB */
#define RUN_PASS_MAX (256 * 1024)    /* stdout read but not yet taken by our reader */
#define RUN_SAY_MAX (16 * 1024)      /* our own stderr lines not yet taken */
#define RUN_LEASE_DEFAULT_MS 60000   /* --lease */
#define RUN_RETENTION_DEFAULT_MS (7 * 86400000LL) /* --retention */
#define RUN_POLL_MS 250              /* how often a --wait looks again */
#define RUN_KILL_GRACE_MS 10000      /* from the stop signal to SIGKILL */
#define RUN_PURGE_BATCH 1000         /* expired records purged after a run */

/* The stored result: a header line, then the stdout bytes kept. */
#define RESULT_MAGIC "idem-run/1"

extern char **environ;

/* The lifecycle of an invocation (the picture is above enter()). */
enum run_state { RUN_CLAIMING, RUN_RUNNING, RUN_STOPPING, RUN_FINISHING, RUN_DONE };

/* Our stdout or stderr, written without blocking the loop: bytes wait in
 * buf[off .. off + len) until the file takes them. */
struct sink {
    int fd;                       /* a description of our own when one could be made */
    int own;                      /* fd is ours to close */
    int send;                     /* a socket: send(MSG_DONTWAIT) */
    int polled;                   /* the loop tells when fd takes more (else: written at once) */
    size_t chunk;                 /* the most one write is given */
    int broken;                   /* the reader is gone: bytes are dropped */
    char *buf;
    size_t off, len, cap;
    unsigned long long dropped;   /* stderr lines dropped for want of room */
    struct event *ev;
};

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

    /* From the command's start to the claim's end (execute()). */
    enum run_state state;
    struct event_base *base;
    idem_loop *loop;
    struct event *wake_ev, *pipe_ev, *extend_ev, *kill_ev, *finish_ev;
    struct sink out, err;
    int pipe_fd;                  /* the command's stdout, read end; -1 once closed */
    int paused;                   /* pipe_ev off: our stdout's reader is behind */
    pid_t keeper;
    int64_t lease_end;            /* the last good lease's end, mono ms */
    int64_t extend_sent;          /* when the extension in flight was asked */
    int extending;                /* an extension in flight */
    int lost;                     /* the claim is not ours any more */
    int stop_sig;                 /* the first stop (a signal's number), or 0 */
    unsigned passed;              /* the stop signals the command has, as BIT(i) of stop_sigs[] */
    int said_lock;
    int status, sig;              /* the command's exit status, the signal that ended it */
    int rc;                       /* execute()'s exit status */
};

/* ---- what wakes the loop ----
 *
 * The signal handlers and the watchdog's on_lost write a byte to wake[1];
 * the loop watches wake[0]. Handlers only note and poke; the loop acts. */
static int wake[2] = {-1, -1};
static const int stop_sigs[] = {SIGTERM, SIGINT, SIGHUP};
#define STOP_SIGS (int)(sizeof stop_sigs / sizeof stop_sigs[0])
/* Per stop signal, not yet acted on: 1 to pass on, 2 reached the command
 * already (the terminal's, to a process group the command shares). */
static volatile sig_atomic_t sig_got[STOP_SIGS];
/* The command shares our process group (see "signals", above execute()). */
static volatile sig_atomic_t shared_group;
static atomic_int lock_lost;

static void poke(void)
{
    int saved = errno;
    char c = 0;
    (void)!write(wake[1], &c, 1);
    errno = saved;
}

static void on_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    for (int i = 0; i < STOP_SIGS; i++)
        if (sig == stop_sigs[i]) {
            if (shared_group && si && si->si_code == SI_KERNEL)
                sig_got[i] = 2;
            else if (!sig_got[i])
                sig_got[i] = 1;
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
    int64_t asked = mono_ms(); /* the lease runs from here, at the latest */
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
        r->lease_end = asked + r->lease_ms;
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
    sigaction(SIGHUP, &dfl, NULL);
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
 * run dies (its PR_SET_PDEATHSIG, SIGUSR1) or asks (SIGUSR1: the command
 * was asked to stop and its grace is over) it kills every process under
 * it, until none is left. Otherwise it passes on to the command the
 * SIGTERM, SIGINT and SIGHUP that idem run sends it, and nothing else (what
 * reaches it from anyone else was sent to a process group, the command's
 * too), and exits as the command did. Forked from a process with threads,
 * it makes only async-signal-safe calls. A process that makes itself a
 * daemon of its own (setsid, then a double fork) is still under the keeper
 * and goes too. */

static volatile sig_atomic_t keeper_kill;
static volatile pid_t keeper_cmd, keeper_parent;

static void keeper_signal(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    if (sig == SIGUSR1)
        keeper_kill = 1;
    else if (keeper_cmd > 0 && si && si->si_code == SI_USER && si->si_pid == keeper_parent)
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
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
    prctl(PR_SET_NAME, "idem-keeper");
    keeper_parent = parent;
    int err = 0;
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0 || prctl(PR_SET_PDEATHSIG, SIGUSR1) != 0 ||
        (!shared_group && setpgid(0, 0) != 0))
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

static struct tail tail;

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

/* ---- our stdout and stderr, never waited for ----
 *
 * O_NONBLOCK belongs to an open file description, which fd 1 and 2 share
 * with whoever gave them to us: a shell's pipe, and the command's own
 * stderr (which is ours, inherited). Set there, it would make their writes
 * fail with EAGAIN. So a pipe, a FIFO or a terminal is opened anew through
 * /proc/self/fd, a description of our own that may be non-blocking; a
 * socket is sent to with MSG_DONTWAIT; a regular file waits for no reader
 * and is written at once. Without /proc, a pipe is given at most PIPE_BUF
 * bytes at a time and only once the loop says it has room, which a pipe
 * takes without blocking. A reader gone (EPIPE) makes the sink broken: the
 * rest is dropped (stdout is still kept for the record). */

static void sink_write(struct sink *s);
static void resume(struct run *r);

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    (void)what;
    if (fd == r->out.fd) {
        sink_write(&r->out);
        resume(r);
    } else {
        sink_write(&r->err);
    }
}

/* epoll (libevent's) can watch fd: not a regular file, nor /dev/null. */
static int watchable(int fd)
{
    struct epoll_event e = {.events = EPOLLOUT};
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int ok = ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) == 0;
    if (ep >= 0)
        close(ep);
    return ok;
}

static void sink_open(struct run *r, struct sink *s, int fd)
{
    struct stat st;
    s->fd = fd;
    s->chunk = SIZE_MAX;
    if (fstat(fd, &st) != 0) {
        s->broken = 1;
        return;
    }
    if (S_ISSOCK(st.st_mode)) {
        s->send = 1;
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
        char path[40];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        int own = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        if (own >= 0) {
            s->fd = own;
            s->own = 1;
        } else if (errno == ENXIO) {
            s->broken = 1; /* a FIFO whose reader is gone */
            return;
        } else {
            s->chunk = PIPE_BUF;
        }
    }
    /* What epoll cannot watch (a regular file, /dev/null) is written at once. */
    if (watchable(s->fd) && (s->ev = event_new(r->base, s->fd, EV_WRITE, on_writable, r)))
        s->polled = 1;
    else if (s->chunk != SIZE_MAX)
        s->broken = 1; /* a blocking pipe we cannot watch: never written, never waited on */
}

/* Give s's file what it takes now; the rest waits for on_writable. */
static void sink_write(struct sink *s)
{
    while (s->len && !s->broken) {
        size_t n = s->len < s->chunk ? s->len : s->chunk;
        ssize_t w = s->send ? send(s->fd, s->buf + s->off, n, MSG_DONTWAIT | MSG_NOSIGNAL)
                            : write(s->fd, s->buf + s->off, n);
        if (w > 0) {
            s->off += (size_t)w;
            s->len -= (size_t)w;
            if (s->chunk != SIZE_MAX)
                break; /* a blocking pipe: one PIPE_BUF per readiness */
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
        } else {
            s->broken = 1; /* the reader is gone */
            s->len = 0;
        }
    }
    if (!s->len)
        s->off = 0;
    if (s->polled) {
        if (s->len)
            event_add(s->ev, NULL);
        else
            event_del(s->ev);
    }
}

/* Queue n bytes for s; -1 without memory (they are dropped). */
static int sink_put(struct sink *s, const char *p, size_t n)
{
    if (s->broken)
        return 0;
    if (s->off + s->len + n > s->cap) {
        if (s->len + n <= s->cap) {
            memmove(s->buf, s->buf + s->off, s->len);
        } else {
            size_t cap = s->cap ? s->cap : 16384;
            while (cap < s->len + n)
                cap *= 2;
            char *b = malloc(cap);
            if (!b)
                return -1;
            if (s->len)
                memcpy(b, s->buf + s->off, s->len);
            free(s->buf);
            s->buf = b;
            s->cap = cap;
        }
        s->off = 0;
    }
    memcpy(s->buf + s->off + s->len, p, n);
    s->len += n;
    if (s->chunk == SIZE_MAX)
        sink_write(s);
    else if (s->polled)
        event_add(s->ev, NULL);
    return 0;
}

/* After the loop, nothing left to renew: what s holds is written, waiting
 * for its reader as any writer to a pipe does. */
static void sink_flush(struct sink *s)
{
    while (s->len && !s->broken) {
        sink_write(s);
        if (s->len && !s->broken) {
            struct pollfd p = {s->fd, POLLOUT, 0};
            if (poll(&p, 1, 1000) < 0 && errno != EINTR)
                break;
        }
    }
}

static void sink_close(struct sink *s)
{
    if (s->ev)
        event_free(s->ev);
    if (s->own)
        close(s->fd);
    free(s->buf);
    memset(s, 0, sizeof *s);
}

/* One line of ours on stderr: while the command runs, through r->err,
 * dropped (and counted) when RUN_SAY_MAX wait already. */
__attribute__((format(printf, 2, 3))) static void say(struct run *r, const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "idem run: %s/%s: ", r->space, r->key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    if (!r->base || !r->err.chunk) { /* no loop (yet, or any more) */
        fwrite(line, 1, len, stderr);
        return;
    }
    if (r->err.len + len > RUN_SAY_MAX || sink_put(&r->err, line, len) != 0)
        r->err.dropped++;
}

/* ---- the command's stdout ---- */

static void close_pipe(struct run *r)
{
    if (r->pipe_ev)
        event_free(r->pipe_ev);
    r->pipe_ev = NULL;
    if (r->pipe_fd >= 0)
        close(r->pipe_fd);
    r->pipe_fd = -1;
}

/* Kept for the record, and passed on to our stdout. */
static void take(struct run *r, const char *p, size_t n)
{
    tail_add(&tail, p, n);
    if (sink_put(&r->out, p, n) != 0)
        r->out.broken = 1; /* no memory: the rest is only kept */
}

/* Our stdout's reader is behind by RUN_PASS_MAX: the command's pipe is not
 * read until it catches up, and the command, once the pipe is full, waits
 * in its write. The loop does not. */
static void resume(struct run *r)
{
    if (r->paused && r->pipe_ev && (r->out.broken || r->out.len < RUN_PASS_MAX)) {
        event_add(r->pipe_ev, NULL);
        r->paused = 0;
    }
}

static void on_pipe(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    char buf[16384];
    (void)what;
    size_t room = r->out.broken ? sizeof buf
                  : r->out.len < RUN_PASS_MAX ? RUN_PASS_MAX - r->out.len : 0;
    if (room) {
        ssize_t k = read(fd, buf, room < sizeof buf ? room : sizeof buf);
        if (k > 0)
            take(r, buf, (size_t)k);
        else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
            close_pipe(r);
            return;
        }
    }
    if (!r->out.broken && r->out.len >= RUN_PASS_MAX) {
        event_del(r->pipe_ev);
        r->paused = 1;
    }
}

/* The command gone: what its pipe holds now is taken, whatever our stdout's
 * reader is behind (a pipe's worth at most), and nothing is waited for, as
 * a process it left behind may hold the pipe open. */
static void drain_pipe(struct run *r)
{
    char buf[16384];
    int avail = 0;
    if (r->pipe_fd >= 0 && ioctl(r->pipe_fd, FIONREAD, &avail) == 0)
        while (avail > 0) {
            ssize_t k = read(r->pipe_fd, buf, (size_t)avail < sizeof buf ? (size_t)avail
                                                                          : sizeof buf);
            if (k <= 0)
                break;
            take(r, buf, (size_t)k);
            avail -= (int)k;
        }
    close_pipe(r);
}

/* ---- the lifecycle ----
 *
 *              the command started
 *   CLAIMING ───────────────────────► RUNNING ────── it exited ──────► FINISHING
 *      │                                 │                                ▲    │
 *      │ it could not start              │ a stop signal, or              │    │ completed,
 *      │ (the claim released)            │ the claim lost                 │    │ failed or
 *      │                                 ▼                                │    │ released
 *      │                              STOPPING ── it exited, the ─────────┘    │ (or that
 *      │                                 │        claim ours                   │ failed: said)
 *      │                                 │ it exited, the claim lost           │
 *      │                                 ▼ (nothing stored)                    ▼
 *      └───────────────────────────────► DONE ◄────────────────────────────────┘
 *
 *   CLAIMING → RUNNING, DONE      execute()
 *   RUNNING → STOPPING            stop(): a signal (on_wake), or lose() (an
 *                                 extension answered CONFLICT, or none
 *                                 succeeded before the lease's end)
 *   RUNNING, STOPPING → FINISHING, STOPPING → DONE   exited()
 *   FINISHING → DONE              finished()
 *
 * CLAIMING: no loop yet. try_claim() and execute()'s setup make blocking
 *   calls: no command runs, and the lock's watchdog renews the lock.
 * RUNNING: the keeper lives; an extension is in flight or extend_ev is
 *   armed; pipe_ev is on unless paused (our stdout's reader behind).
 * STOPPING: as RUNNING (no extension once the claim is lost), and kill_ev
 *   armed until the grace is over: then the keeper kills it all.
 * FINISHING: the keeper reaped, the pipe closed; a finish call in flight,
 *   or finish_ev armed, or an extension in flight that it waits for.
 * DONE: the loop ends. What our stdout has not taken yet is written after
 *   it, waiting for its reader: nothing is left to renew.
 */

#define BIT(s) (1u << (s))
static const unsigned allowed_next[] = {
    [RUN_CLAIMING] = BIT(RUN_RUNNING) | BIT(RUN_DONE),
    [RUN_RUNNING] = BIT(RUN_STOPPING) | BIT(RUN_FINISHING),
    [RUN_STOPPING] = BIT(RUN_FINISHING) | BIT(RUN_DONE),
    [RUN_FINISHING] = BIT(RUN_DONE),
    [RUN_DONE] = 0,
};

static void enter(struct run *r, enum run_state to)
{
    assert(allowed_next[r->state] & BIT(to));
    (void)allowed_next; /* read by the assertion only */
    r->state = to;
    if (to == RUN_DONE && r->base)
        event_base_loopbreak(r->base);
}

static void arm(struct event *ev, int64_t ms)
{
    if (ms < 0)
        ms = 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
    evtimer_add(ev, &tv);
}

/* ---- signals ----
 *
 * A stop signal (SIGTERM, SIGINT, SIGHUP) is passed on to the command once,
 * and only when the command would not get it otherwise. So the keeper and
 * the command run in a process group of their own: what is sent to ours (a
 * `timeout`'s kill(0, SIGTERM), which follows its SIGTERM to idem run
 * itself) reaches idem run alone, which passes it on. Only when idem run is
 * in the foreground of its terminal does the command stay in our group, so
 * that it may read the terminal (a background group reading it would be
 * stopped by SIGTTIN); there the terminal's own signals (Ctrl-C, a hangup:
 * SI_KERNEL, sent to the whole group) reach the command with us, and are
 * not passed on. A second signal of a kind passed on already is not passed
 * on again (timeout's two SIGTERMs are one request). The first one starts
 * the grace: after RUN_KILL_GRACE_MS the keeper kills the command and all it
 * started. */

/* We are in the foreground process group of our controlling terminal. */
static int in_foreground(void)
{
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int fg = tcgetpgrp(fd) == getpgrp();
    close(fd);
    return fg;
}

/* on_signal for sig, or its default action. */
static void set_handler(int sig, int on)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (on) {
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_RESTART | SA_SIGINFO | (sig == SIGCHLD ? SA_NOCLDSTOP : 0);
    } else {
        sa.sa_handler = SIG_DFL;
    }
    sigaction(sig, &sa, NULL);
}

/* Ask the command to stop with stop_sigs[i]: passed on, unless it has it
 * already (reached: from its terminal; or passed on before), and the grace
 * started. */
static void stop(struct run *r, int i, int reached)
{
    if (!(r->passed & BIT(i))) {
        r->passed |= BIT(i);
        if (!reached)
            kill(r->keeper, stop_sigs[i]); /* the keeper passes it on */
    }
    if (r->state == RUN_RUNNING) {
        r->stop_sig = stop_sigs[i];
        enter(r, RUN_STOPPING);
        arm(r->kill_ev, RUN_KILL_GRACE_MS);
    }
}

static void on_grace_over(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    (void)fd;
    (void)what;
    if (r->state != RUN_STOPPING)
        return;
    say(r, "the command did not stop within %d s of signal %d: killing it and all it started",
        RUN_KILL_GRACE_MS / 1000, r->stop_sig);
    kill(r->keeper, SIGUSR1); /* the keeper kills it, and all it started */
}

/* ---- the lease ---- */

static void lose(struct run *r, const char *why)
{
    if (r->lost)
        return;
    r->lost = 1;
    say(r, "the claim (epoch %" PRIu64 ") is lost (%s): another invocation may run the command "
        "now. Stopping it (SIGTERM; then all it started killed after %d s); nothing is stored",
        r->epoch, why, RUN_KILL_GRACE_MS / 1000);
    stop(r, 0, 0); /* stop_sigs[0]: SIGTERM */
}

static void on_extended(void *arg, idem_rc rc, idem_outcome o, const char *detail);
static void finish(struct run *r);

/* extend_ev: every lease/3 an extension; and, while one is in flight, a
 * look at the lease's end, should no answer come before it. */
static void on_extend_due(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    (void)fd;
    (void)what;
    if (r->lost || (r->state != RUN_RUNNING && r->state != RUN_STOPPING))
        return;
    int64_t now = mono_ms();
    if (now >= r->lease_end) {
        lose(r, r->extending ? "the store did not answer before its lease ran out"
                             : "its lease ran out while the store failed");
        return;
    }
    if (!r->extending) {
        r->extend_sent = now;
        if (idem_record_extend_async(r->h, r->loop, r->space, r->key, r->epoch, r->lease_ms,
                                     on_extended, r) == IDEM_OK)
            r->extending = 1;
        else
            say(r, "extending the lease: %s; trying again", idem_errdetail());
    }
    int64_t left = r->lease_end - now;
    arm(r->extend_ev, r->extending ? left : left < RUN_POLL_MS ? left : RUN_POLL_MS);
}

static void on_extended(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct run *r = arg;
    r->extending = 0;
    if (r->state == RUN_FINISHING) {
        if (rc == IDEM_OK && o == IDEM_RENEWED)
            r->lease_end = r->extend_sent + r->lease_ms; /* longer to finish in */
        finish(r); /* it waited for this answer */
        return;
    }
    if (r->lost || (r->state != RUN_RUNNING && r->state != RUN_STOPPING))
        return;
    int64_t now = mono_ms();
    if (rc == IDEM_OK && o == IDEM_RENEWED) {
        r->lease_end = r->extend_sent + r->lease_ms; /* from the asking: on the safe side */
        arm(r->extend_ev, r->extend_sent + r->lease_ms / 3 - now);
    } else if (rc == IDEM_OK) {
        lose(r, idem_outcome_name(o));
    } else if (now >= r->lease_end) {
        lose(r, "its lease ran out while the store failed");
    } else {
        say(r, "extending the lease: %s (%s); trying again", idem_strerror(rc), detail);
        int64_t left = r->lease_end - now;
        arm(r->extend_ev, left < RUN_POLL_MS ? left : RUN_POLL_MS);
    }
}

/* ---- the end ---- */

static void on_finished(void *arg, idem_rc rc, idem_outcome o, const char *detail);

static void on_finish_due(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    finish(arg);
}

/* Finish the claim with what the command did: complete, or fail for good,
 * or release (retryable: the next invocation runs it again). */
static void finish(struct run *r)
{
    if (r->extending)
        return; /* its answer comes first, and calls again */
    int ok = r->status == 0;
    idem_fail_mode mode = (r->stop_sig || r->retry_on_failure) ? IDEM_FAIL_RETRYABLE
                                                              : IDEM_FAIL_FINAL;
    size_t len = 0;
    char *res = result_encode(r->status, r->sig, tail.buf, tail.len, tail.dropped, &len);
    if (!res) {
        say(r, "out of memory storing the result: the record stays PROCESSING until its "
            "lease ends");
        r->rc = EX_OSERR;
        enter(r, RUN_DONE);
        return;
    }
    idem_rc rc = ok ? idem_record_complete_async(r->h, r->loop, r->space, r->key, r->epoch, res,
                                                 len, r->retention_ms, on_finished, r)
                    : idem_record_fail_async(r->h, r->loop, r->space, r->key, r->epoch, mode,
                                             res, len, r->retention_ms, on_finished, r);
    free(res); /* the calls copy their arguments */
    if (rc != IDEM_OK)
        on_finished(r, rc, IDEM_COMPLETED, idem_errdetail());
}

/* A store error is tried again until the last good lease ends (the claim
 * is ours until then). */
static void on_finished(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct run *r = arg;
    if (r->state != RUN_FINISHING)
        return;
    const char *what = r->status == 0 ? "completing the record"
                       : (r->stop_sig || r->retry_on_failure) ? "releasing the record"
                                                              : "failing the record";
    if (rc == IDEM_OK && o == IDEM_COMPLETED) {
        r->rc = r->status;
    } else if (rc == IDEM_OK) {
        say(r, "%s: %s: the claim (epoch %" PRIu64 ") was taken over meanwhile; nothing is "
            "stored", what, idem_outcome_name(o), r->epoch);
        r->rc = EX_SOFTWARE;
    } else if (mono_ms() + RUN_POLL_MS < r->lease_end) {
        arm(r->finish_ev, RUN_POLL_MS);
        return;
    } else {
        say(r, "%s: %s (%s)", what, idem_strerror(rc), detail);
        say(r, "the command ran, and its record stays PROCESSING until its lease ends: then "
            "the next invocation runs it again");
        r->rc = EX_UNAVAILABLE;
    }
    enter(r, RUN_DONE);
}

/* The keeper is reaped: the command's end, as the keeper exited with it. */
static void exited(struct run *r, int st)
{
    if (WIFSIGNALED(st)) {
        r->sig = WTERMSIG(st);
        r->status = 128 + r->sig;
    } else {
        r->status = WEXITSTATUS(st);
    }
    drain_pipe(r);
    if (r->lost) {
        r->rc = EX_SOFTWARE;
        enter(r, RUN_DONE);
        return;
    }
    if (r->stop_sig && r->status != 0)
        say(r, "the command was stopped (signal %d) and exited %d: its record is released, "
            "and the next invocation runs it again", r->stop_sig, r->status);
    enter(r, RUN_FINISHING);
    finish(r);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    struct run *r = arg;
    char drain[64];
    (void)what;
    while (read(fd, drain, sizeof drain) > 0)
        ;
    for (int i = 0; i < STOP_SIGS; i++) {
        int got = sig_got[i];
        if (!got)
            continue;
        sig_got[i] = 0;
        if (r->state == RUN_RUNNING || r->state == RUN_STOPPING)
            stop(r, i, got == 2);
    }
    if (atomic_load(&lock_lost) && !r->said_lock) {
        r->said_lock = 1;
        say(r, "the lock was lost (not renewed in time); the record's claim still holds the "
            "key, and the command goes on");
    }
    int st;
    if ((r->state == RUN_RUNNING || r->state == RUN_STOPPING) &&
        waitpid(r->keeper, &st, WNOHANG) == r->keeper)
        exited(r, st);
}

/* Run the command under our claim; the exit status. */
static int execute(struct run *r)
{
    int out[2] = {-1, -1}, ex[2] = {-1, -1};
    char **env = child_env(r->epoch);
    r->rc = EX_OSERR;
    r->pipe_fd = -1;
    tail.len = 0;
    tail.dropped = 0;
    if (!env || pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
        pipe2(ex, O_CLOEXEC) != 0) {
        say(r, "%s", env ? strerror(errno) : "out of memory");
        goto not_run;
    }
    evthread_use_pthreads(); /* the store's threads post their answers to the loop */
    if (!(r->base = event_base_new()) || !(r->loop = idem_libevent_new(r->base)) ||
        !(r->wake_ev = event_new(r->base, wake[0], EV_READ | EV_PERSIST, on_wake, r)) ||
        !(r->extend_ev = evtimer_new(r->base, on_extend_due, r)) ||
        !(r->kill_ev = evtimer_new(r->base, on_grace_over, r)) ||
        !(r->finish_ev = evtimer_new(r->base, on_finish_due, r))) {
        say(r, "no event loop: out of memory");
        goto not_run;
    }
    sink_open(r, &r->out, STDOUT_FILENO);
    sink_open(r, &r->err, STDERR_FILENO);
    shared_group = in_foreground();
    for (int i = 0; i < STOP_SIGS; i++)
        set_handler(stop_sigs[i], 1);
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
        say(r, "fork: %s", strerror(fork_errno));
        goto not_run;
    }
    r->keeper = pid;
    /* The exec's answer: EOF once it succeeded, its errno if not. */
    int exec_errno = 0;
    ssize_t got;
    while ((got = read(ex[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR)
        ;
    if (got == (ssize_t)sizeof exec_errno) {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        say(r, "cannot run %s: %s (the record is released: it did not run)", r->argv[0],
            strerror(exec_errno));
        r->rc = exec_errno == ENOENT ? 127 : 126;
        goto not_run;
    }
    r->pipe_fd = out[0];
    out[0] = -1;
    if (fcntl(r->pipe_fd, F_SETFL, O_NONBLOCK) != 0 ||
        !(r->pipe_ev = event_new(r->base, r->pipe_fd, EV_READ | EV_PERSIST, on_pipe, r)) ||
        event_add(r->pipe_ev, NULL) != 0 || event_add(r->wake_ev, NULL) != 0) {
        /* The command runs: it is stopped as for a lost claim, and nothing stored. */
        say(r, "watching the command: %s", strerror(errno));
        kill(pid, SIGUSR1);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        goto not_run;
    }
    enter(r, RUN_RUNNING);
    arm(r->extend_ev, r->lease_ms / 3 - (mono_ms() - (r->lease_end - r->lease_ms)));
    if (event_base_dispatch(r->base) != 0 || r->state != RUN_DONE) {
        say(r, "the event loop failed: the command is stopped, nothing stored");
        kill(pid, SIGUSR1);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        r->lost = 1;
        r->rc = EX_SOFTWARE;
    }
    for (int i = 0; i < STOP_SIGS; i++)
        set_handler(stop_sigs[i], 0);
    let_go(r);
    if (!r->lost) {
        unsigned purged; /* no daemon may purge this store */
        (void)idem_record_purge(r->h, RUN_PURGE_BATCH, &purged);
    }
    goto out;

not_run:
    /* Never started: released, so that the next invocation runs it. */
    if (r->epoch) {
        idem_outcome o;
        idem_rc e = idem_record_fail(r->h, r->space, r->key, r->epoch, IDEM_FAIL_RETRYABLE, NULL,
                                     0, 0, &o);
        if (e != IDEM_OK)
            say(r, "releasing the record: %s (%s)", idem_strerror(e), idem_errdetail());
    }
    let_go(r);
    enter(r, RUN_DONE);
out:
    if (r->loop) {
        idem_loop_detach(r->h, r->loop); /* an extension in flight answers, to DONE */
        idem_libevent_free(r->loop);
        r->loop = NULL;
    }
    close_pipe(r);
    struct event **evs[] = {&r->wake_ev, &r->extend_ev, &r->kill_ev, &r->finish_ev};
    for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
        if (*evs[i]) {
            event_free(*evs[i]);
            *evs[i] = NULL;
        }
    sink_flush(&r->out);
    if (r->err.dropped) {
        char line[200];
        int n = snprintf(line, sizeof line, "idem run: %s/%s: %llu lines of idem run's own were "
                         "dropped: its stderr was not read\n", r->space, r->key, r->err.dropped);
        r->err.dropped = 0;
        (void)sink_put(&r->err, line, (size_t)n);
    }
    sink_flush(&r->err);
    sink_close(&r->out);
    sink_close(&r->err);
    if (r->base)
        event_base_free(r->base);
    r->base = NULL;
    for (int i = 0; i < 2; i++) {
        if (out[i] >= 0)
            close(out[i]);
        if (ex[i] >= 0)
            close(ex[i]);
        if (wake[i] >= 0)
            close(wake[i]);
        wake[i] = -1;
    }
    if (env) {
        for (size_t i = 0; env[i]; i++)
            if (strncmp(env[i], "IDEM_EPOCH=", 11) == 0 && !env[i + 1])
                free(env[i]);
        free(env);
    }
    return r->rc;
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
