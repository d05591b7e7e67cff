/* SPDX-License-Identifier: Apache-2.0 */
/*
 * syslib.h — the pieces of a system test: start real processes (idem serve,
 * the example refund service) on loopback, talk HTTP to them, stop or kill
 * them, all inside a temp dir that is removed afterwards.
 */
#ifndef IDEM_TESTS_SYSLIB_H
#define IDEM_TESTS_SYSLIB_H

#include <stddef.h>
#include <sys/types.h>

#include "http/http_parser.h"

struct proc {
    pid_t pid;
    int port;      /* the port it said it listens on */
    int admin_port; /* idem serve with admin_listen: "JSON API on HOST:PORT"; else 0 */
    char log[256]; /* where its stdout and stderr go */
    char ready[512]; /* the ready line ("... listening on ..."), cut to fit */
};

/* A free TCP port on 127.0.0.1 (bound and released: a small race, fine for
 * tests). */
int sys_free_port(void);

/* Start argv (NULL-terminated), stderr to log_path, and wait up to 10 s for
 * a stdout line containing "listening on HOST:PORT" (or idem consume's
 * "idem: consuming", port 0); the port is parsed from it (and the admin port from "JSON API on HOST:PORT" in the same line, if
 * there). Fails the test if the process exits or says nothing. */
void sys_start(struct proc *p, char *const argv[], const char *log_path);

/* Start the example refund service on a free port of 127.0.0.1, its SQLite
 * file dir/NAME.db and its stderr dir/NAME.log, with extra arguments (a
 * NULL-terminated list, or NULL). */
void sys_start_service(struct proc *p, const char *bin, const char *dir, const char *name,
                       const char *const *extra);

/* The end of a group of tests: stop p (SIGTERM), SIGKILL whatever else is
 * left, and remove dir, unless IDEM_KEEP_TEST_DIR is set. */
void sys_finish(struct proc *p, char *dir);

/* Start, expecting the process to exit with a non-zero status; returns its
 * exit status and fills err (its stderr) for assertions. */
int sys_run_fail(char *const argv[], char *err, size_t errlen);

/* SIGKILL every process started and not stopped (call from teardown). */
void sys_kill_all(void);

/* Send sig and wait for the exit; returns the exit status (or 128+signal). */
int sys_stop(struct proc *p, int sig);

/* SIGTERM, then SIGTERM, SIGHUP and SIGUSR1 in turn every 100 µs until the
 * process exits (an impatient supervisor, logrotate, a reload, all during
 * its shutdown); returns its exit status (or 128+signal). */
int sys_stop_hammered(struct proc *p);

struct sys_resp {
    int status;        /* 0 when the connection failed or closed without an answer */
    struct http_msg *m;
    int closed;        /* the server closed the connection after answering */
};

/* One request on a fresh connection. headers: NULL-terminated "Name: value"
 * strings; body may be NULL. timeout_ms bounds the whole exchange. */
void sys_http(int port, const char *method, const char *target, const char *const *headers,
              const char *body, int timeout_ms, struct sys_resp *r);

/* The write-scope API key the system tests' daemons take from the
 * environment (SYS_ADMIN_KEY_ENV), and the configuration lines that give
 * them an admin listener on a free loopback port with it. */
#define SYS_ADMIN_KEY "test-admin-key-0123456789abcdef"
#define SYS_ADMIN_KEY_ENV "IDEM_TEST_ADMIN_KEY"
#define SYS_ADMIN_YAML                                                       \
    "admin_listen: 127.0.0.1:0\n"                                            \
    "api_keys:\n"                                                            \
    "  - { name: test, scope: write, env: " SYS_ADMIN_KEY_ENV " }\n"

/* sys_http on the admin listener, with the test key. */
void sys_admin_http(int admin_port, const char *method, const char *target, const char *body,
                    int timeout_ms, struct sys_resp *r);

/* Raw bytes on a fresh connection; reads one answer (or the close). */
void sys_http_raw(int port, const char *bytes, size_t len, int timeout_ms, struct sys_resp *r);
/* The same, shutting the client's sending side once the bytes are out (a
 * half-close: the client still reads). */
void sys_http_raw_shut(int port, const char *bytes, size_t len, int timeout_ms,
                       struct sys_resp *r);
/* Send the bytes, wait wait_ms, and reset the connection (SO_LINGER 0): a
 * client that gives up without waiting for its answer. */
void sys_http_send_and_reset(int port, const char *bytes, size_t len, int wait_ms);
/* A TCP connection to 127.0.0.1:port (TCP_NODELAY), or -1. */
int sys_connect_local(int port);
/* Send the bytes, shut the sending side, and return everything the server
 * sends until it closes (or timeout_ms, or 16 MiB), NUL-terminated; free()
 * it. NULL if the connection failed. */
char *sys_http_raw_until_close(int port, const char *bytes, size_t len, int timeout_ms,
                               size_t *out_len);

void sys_resp_free(struct sys_resp *r);

/* A header of the response, or NULL. */
const char *sys_header(const struct sys_resp *r, const char *name);

/* Issue a refund-scene token on idem serve's JSON API for subject (the
 * X-Subject header; NULL: none) and put its "Idem-Token: ..." header line
 * in th. */
void sys_issue_token(int port, const char *subject, char *th, size_t cap);

/* The refund service's GET /stats field (executions, refunds, payments...). */
long sys_stat(int upstream_port, const char *field);

/* Write text to path. */
void sys_write_file(const char *path, const char *text);
/* The whole file, NUL-terminated; free() it. */
char *sys_read_file(const char *path);

/* How many of process pid's threads are named name (their /proc comm),
 * or with name NULL how many it runs. */
int sys_threads(pid_t pid, const char *name);

/* Run a shell command (printf-style), which must succeed: fails the test
 * with the command otherwise. */
void sys_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A certificate dir/NAME.pem (key NAME.key) for cn with the alternative
 * names san ("DNS:localhost,IP:127.0.0.1"), signed by the CA dir/CA.pem, or
 * the CA itself (ca NULL), made with openssl(1). Fails the test if not. */
void sys_make_cert(const char *dir, const char *name, const char *cn, const char *san,
                   const char *ca);

#endif
