/* SPDX-License-Identifier: Apache-2.0 */
/* syslib.c — processes and HTTP for the system tests. */
#include "syslib.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testlib.h"

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Every process started and not yet stopped, so that a failed test leaves
 * none running. */
static pid_t running[64];

static void track(pid_t pid)
{
    for (size_t i = 0; i < sizeof running / sizeof running[0]; i++)
        if (!running[i]) {
            running[i] = pid;
            return;
        }
}

static void untrack(pid_t pid)
{
    for (size_t i = 0; i < sizeof running / sizeof running[0]; i++)
        if (running[i] == pid)
            running[i] = 0;
}

void sys_kill_all(void)
{
    for (size_t i = 0; i < sizeof running / sizeof running[0]; i++)
        if (running[i]) {
            kill(running[i], SIGKILL);
            waitpid(running[i], NULL, 0);
            running[i] = 0;
        }
}

int sys_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The port of the address that follows label at s: after its last colon. */
static int port_after(const char *s, const char *label)
{
    const char *w = s + strlen(label), *colon = w, *end = w + strcspn(w, " ,\n");
    for (const char *c = w; c < end; c++)
        if (*c == ':' && c[1] >= '0' && c[1] <= '9')
            colon = c;
    return atoi(colon + 1);
}

void sys_start(struct proc *p, char *const argv[], const char *log_path)
{
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "%s", log_path);
    /* Its stdout (the ready line, the access log's lines by default) and its
     * stderr (its own log) both in the log file, read from where it ends now
     * until the ready line: a pipe nobody reads after that would fill and
     * stop the daemon's writes. */
    int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    assert_true(log >= 0);
    off_t from = lseek(log, 0, SEEK_END);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv(SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, 1);
        dup2(log, 1);
        dup2(log, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(log);
    p->pid = pid;
    track(pid);
    int in = open(log_path, O_RDONLY | O_CLOEXEC);
    assert_true(in >= 0);
    char buf[4096];
    size_t len = 0;
    long long deadline = mono_ms() + 10000;
    while (mono_ms() < deadline && len < sizeof buf - 1) {
        ssize_t n = pread(in, buf + len, sizeof buf - 1 - len, from + (off_t)len);
        if (n <= 0) {
            if (waitpid(pid, NULL, WNOHANG) == pid)
                break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        len += (size_t)n;
        buf[len] = '\0';
        /* idem consume listens on nothing but its admin listener. */
        const char *l = strstr(buf, "listening on "), *c = strstr(buf, "idem: consuming");
        const char *nl = l ? strchr(l, '\n') : c ? strchr(c, '\n') : NULL;
        if (nl) {
            if (!l)
                l = c;
            p->port = l == c ? 0 : port_after(l, "listening on ");
            const char *a = strstr(l, "JSON API on ");
            p->admin_port = a && a < nl ? port_after(a, "JSON API on ") : 0;
            snprintf(p->ready, sizeof p->ready, "%.*s", (int)(nl - l), l);
            close(in);
            return;
        }
    }
    close(in);
    int status;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    untrack(pid);
    fail_msg("%s did not say it was listening (its output: %.*s; in %s)", argv[0], (int)len, buf,
             log_path);
}

int sys_run_fail(char *const argv[], char *err, size_t errlen)
{
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        setenv(SYS_ADMIN_KEY_ENV, SYS_ADMIN_KEY, 1);
        dup2(pipefd[1], 2);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        close(pipefd[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(pipefd[1]);
    size_t len = 0;
    ssize_t n;
    long long deadline = mono_ms() + 10000;
    while (len < errlen - 1 && mono_ms() < deadline) {
        struct pollfd pfd = {.fd = pipefd[0], .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0) {
            if (waitpid(pid, NULL, WNOHANG) == pid)
                fail_msg("process exited but its stderr stayed open");
            continue;
        }
        if ((n = read(pipefd[0], err + len, errlen - 1 - len)) <= 0)
            break;
        len += (size_t)n;
    }
    err[len] = '\0';
    close(pipefd[0]);
    int status;
    if (mono_ms() >= deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail_msg("%s kept running; expected it to refuse and exit", argv[0]);
    }
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int sys_stop(struct proc *p, int sig)
{
    int status;
    if (p->pid <= 0)
        return -1;
    kill(p->pid, sig);
    waitpid(p->pid, &status, 0);
    untrack(p->pid);
    p->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int sys_stop_hammered(struct proc *p)
{
    static const int sigs[] = {SIGTERM, SIGHUP, SIGUSR1};
    int status = 0;
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    for (unsigned i = 0; waitpid(p->pid, &status, WNOHANG) == 0; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        kill(p->pid, sigs[i % 3]);
    }
    untrack(p->pid);
    p->pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int sys_connect_local(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void http_raw(int port, const char *bytes, size_t len, int timeout_ms, int shut_wr,
                     struct sys_resp *r)
{
    memset(r, 0, sizeof *r);
    int fd = sys_connect_local(port);
    if (fd < 0)
        return;
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, bytes + off, len - off, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (shut_wr)
        shutdown(fd, SHUT_WR);
    struct http_limits lim = {65536, 1000, 1 << 20, 64 << 20};
    struct http_parser p;
    http_parser_init(&p, HTTP_PARSE_RESPONSE, &lim);
    p.response_to_head = len >= 5 && memcmp(bytes, "HEAD ", 5) == 0; /* no body follows */
    long long deadline = mono_ms() + timeout_ms;
    char buf[65536];
    for (;;) {
        long long left = deadline - mono_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            break;
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        enum http_parse_status st;
        size_t used;
        if (n <= 0) {
            r->closed = 1;
            st = http_parser_eof(&p);
        } else {
            st = http_parser_feed(&p, buf, (size_t)n, &used);
        }
        if (st == HTTP_DONE) {
            r->m = http_parser_take(&p);
            r->status = r->m ? r->m->status : 0;
            /* Did the server close after the answer? */
            if (!r->closed) {
                struct pollfd q = {.fd = fd, .events = POLLIN};
                if (poll(&q, 1, 200) == 1 && recv(fd, buf, sizeof buf, 0) == 0)
                    r->closed = 1;
            }
            break;
        }
        if (st == HTTP_ERROR || n <= 0)
            break;
    }
    http_parser_free(&p);
    close(fd);
}

void sys_http_raw(int port, const char *bytes, size_t len, int timeout_ms, struct sys_resp *r)
{
    http_raw(port, bytes, len, timeout_ms, 0, r);
}

void sys_http_raw_shut(int port, const char *bytes, size_t len, int timeout_ms,
                       struct sys_resp *r)
{
    http_raw(port, bytes, len, timeout_ms, 1, r);
}

void sys_http_send_and_reset(int port, const char *bytes, size_t len, int wait_ms)
{
    int fd = sys_connect_local(port);
    if (fd < 0)
        return;
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, bytes + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    struct linger reset = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(fd); /* an RST, not a FIN */
}

char *sys_http_raw_until_close(int port, const char *bytes, size_t len, int timeout_ms,
                               size_t *out_len)
{
    int fd = sys_connect_local(port);
    size_t cap = 1 << 16, n = 0;
    char *out = malloc(cap + 1);
    *out_len = 0;
    if (fd < 0 || !out) {
        if (fd >= 0)
            close(fd);
        free(out);
        return NULL;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = send(fd, bytes + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    long long deadline = mono_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - mono_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            break;
        if (n == cap) {
            char *more = cap < (1u << 24) ? realloc(out, 2 * cap + 1) : NULL;
            if (!more)
                break;
            out = more;
            cap *= 2;
        }
        ssize_t got = recv(fd, out + n, cap - n, 0);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    out[n] = '\0';
    *out_len = n;
    return out;
}

void sys_http(int port, const char *method, const char *target, const char *const *headers,
              const char *body, int timeout_ms, struct sys_resp *r)
{
    size_t blen = body ? strlen(body) : 0, cap = 512 + blen + strlen(target);
    for (const char *const *h = headers; h && *h; h++)
        cap += strlen(*h) + 2;
    char *req = malloc(cap), *o = req;
    o += sprintf(o, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n", method, target);
    for (const char *const *h = headers; h && *h; h++)
        o += sprintf(o, "%s\r\n", *h);
    if (body)
        o += sprintf(o, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    o += sprintf(o, "Connection: close\r\n\r\n");
    if (body) {
        memcpy(o, body, blen);
        o += blen;
    }
    sys_http_raw(port, req, (size_t)(o - req), timeout_ms, r);
    free(req);
}

void sys_admin_http(int admin_port, const char *method, const char *target, const char *body,
                    int timeout_ms, struct sys_resp *r)
{
    const char *h[] = {"Authorization: Bearer " SYS_ADMIN_KEY, NULL};
    sys_http(admin_port, method, target, h, body, timeout_ms, r);
}

void sys_issue_token(int port, const char *subject, char *th, size_t cap)
{
    struct sys_resp r;
    char sh[96];
    snprintf(sh, sizeof sh, "X-Subject: %s", subject ? subject : "");
    const char *h[] = {sh, NULL};
    sys_http(port, "POST", "/_idem/v1/tokens", subject ? h : NULL,
             "{\"scene\":\"refund\",\"ttl_ms\":60000}", 5000, &r);
    assert_int_equal(r.status, 201);
    snprintf(th, cap, "Idem-Token: %.32s", strstr(r.m->body, "\"token\":\"") + 9);
    sys_resp_free(&r);
}

void sys_resp_free(struct sys_resp *r)
{
    http_msg_free(r->m);
    r->m = NULL;
}

const char *sys_header(const struct sys_resp *r, const char *name)
{
    return r->m ? http_msg_header(r->m, name) : NULL;
}

long sys_stat(int upstream_port, const char *field)
{
    struct sys_resp r;
    sys_http(upstream_port, "GET", "/stats", NULL, NULL, 5000, &r);
    if (r.status != 200)
        fail_msg("GET /stats on the upstream: %d", r.status);
    json_t *j = json_loadb(r.m->body, r.m->body_len, 0, NULL);
    json_t *v = j ? json_object_get(j, field) : NULL;
    if (!json_is_integer(v))
        fail_msg("GET /stats has no integer %s: %s", field, r.m->body);
    long n = (long)json_integer_value(v);
    json_decref(j);
    sys_resp_free(&r);
    return n;
}

void sys_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

char *sys_read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t cap = 4096, len = 0, n;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((n = fread(buf + len, 1, cap - 1 - len, f)) > 0) {
        len += n;
        if (len == cap - 1) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

void sys_start_service(struct proc *p, const char *bin, const char *dir, const char *name,
                       const char *const *extra)
{
    char db[4200], log[4200], listen[64];
    snprintf(db, sizeof db, "%s/%s.db", dir, name);
    snprintf(log, sizeof log, "%s/%s.log", dir, name);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", sys_free_port());
    char *argv[16] = {(char *)bin, "--listen", listen, "--db", db};
    size_t n = 5;
    for (; extra && *extra && n < 15; extra++)
        argv[n++] = (char *)*extra;
    argv[n] = NULL;
    sys_start(p, argv, log);
}

void sys_finish(struct proc *p, char *dir)
{
    sys_stop(p, SIGTERM);
    sys_kill_all();
    if (getenv("IDEM_KEEP_TEST_DIR"))
        fprintf(stderr, "test dir kept: %s\n", dir);
    else
        test_rmdir(dir);
}

int sys_threads(pid_t pid, const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        fail_msg("%s: %s", path, strerror(errno));
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char comm_path[sizeof path + sizeof e->d_name + 8], comm[32] = "";
        snprintf(comm_path, sizeof comm_path, "%s/%s/comm", path, e->d_name);
        FILE *f = name ? fopen(comm_path, "r") : NULL; /* a thread just gone: none */
        if (f && fgets(comm, sizeof comm, f))
            comm[strcspn(comm, "\n")] = '\0';
        if (f)
            fclose(f);
        n += !name || strcmp(comm, name) == 0;
    }
    closedir(d);
    return n;
}

void sys_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("failed: %s", cmd);
}

void sys_make_cert(const char *d, const char *name, const char *cn, const char *san,
                   const char *ca)
{
    if (!ca) {
        sys_sh("cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
               "-nodes -keyout %s.key -out %s.pem -days 2 -subj /CN=%s 2>/dev/null",
               d, name, name, cn);
        return;
    }
    sys_sh("cd '%s' && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
           "-keyout %s.key -out %s.csr -subj /CN=%s 2>/dev/null && "
           "printf 'subjectAltName=%s\\n' > %s.ext && "
           "openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key -CAcreateserial -out %s.pem "
           "-days 2 -extfile %s.ext 2>/dev/null",
           d, name, name, cn, san, name, name, ca, ca, name, name);
}
