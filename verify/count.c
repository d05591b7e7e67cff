/* SPDX-License-Identifier: Apache-2.0 */
/*
 * count.c — read the execution count from a URL (GET, a number or JSON) or
 * from a command (a number on stdout, e.g. `psql -tAc 'select count(*)...'`).
 * Anything but a clean number is an error that ends the run with status 2:
 * a verdict computed from a count that could not be read would be a guess.
 */
#include "count.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exchange.h"

#define OUT_MAX (64 * 1024)
#define ERR_MAX 4096

/* A whole signed decimal number, whitespace around it allowed. */
static int parse_number(const char *s, size_t len, long long *out)
{
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    size_t start = i;
    if (i < len && s[i] == '-')
        i++;
    size_t digits = i;
    long long v = 0;
    while (i < len && s[i] >= '0' && s[i] <= '9') {
        if (v > (9223372036854775807LL - (s[i] - '0')) / 10)
            return -1;
        v = v * 10 + (s[i] - '0');
        i++;
    }
    if (i == digits)
        return -1;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    if (i != len)
        return -1;
    *out = s[start] == '-' ? -v : v;
    return 0;
}

/* Printable excerpt of untrusted text, for a message. */
static const char *excerpt(const char *s, size_t len, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 4 < cap; i++)
        buf[o++] = (unsigned char)s[i] >= ' ' && (unsigned char)s[i] < 0x7f ? s[i] : '.';
    if (len > cap - 4 && o + 3 < cap) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

static int json_number(const char *body, size_t len, const char *field, long long *out)
{
    json_t *root = json_loadb(body, len, JSON_DECODE_ANY, NULL), *v = root;
    int rc = -1;
    if (json_is_object(v)) {
        char name[256];
        const char *f = field;
        while (v && *f) {
            size_t n = strcspn(f, ".");
            if (n >= sizeof name)
                break;
            memcpy(name, f, n);
            name[n] = '\0';
            v = json_object_get(v, name);
            f += n + (f[n] == '.');
        }
        if (*f)
            v = NULL;
    }
    if (json_is_integer(v)) {
        *out = (long long)json_integer_value(v);
        rc = 0;
    } else if (json_is_real(v) && json_real_value(v) == (double)(long long)json_real_value(v)) {
        *out = (long long)json_real_value(v);
        rc = 0;
    }
    json_decref(root);
    return rc;
}

static int read_url(const struct counter *c, long long *out, char *err, size_t errlen)
{
    struct xchg_ctx ctx = {0};
    struct shot s = {.url = &c->url, .timeout_ms = c->timeout_ms};
    char ex[100];
    int rc = -1;
    s.request = xchg_build("GET", &c->url, c->url.target, NULL, 0, NULL, 0, 0, &s.request_len);
    if (!s.request) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    xchg_shot(&ctx, &s);
    if (s.outcome != SHOT_ANSWERED)
        snprintf(err, errlen, "--count-url %s: %s", c->text, s.error);
    else if (s.status < 200 || s.status > 299)
        snprintf(err, errlen, "--count-url %s: answered %d (%s)", c->text, s.status,
                 excerpt(s.body, s.body_len, ex, 60));
    else if (parse_number(s.body, s.body_len, out) == 0 ||
             json_number(s.body, s.body_len, c->field, out) == 0)
        rc = 0;
    else
        snprintf(err, errlen,
                 "--count-url %s: the answer is neither a number nor JSON with a numeric "
                 "\"%s\" (--count-field names another): %s",
                 c->text, c->field, excerpt(s.body, s.body_len, ex, 60));
    shot_clear(&s);
    return rc;
}

static int read_cmd(const struct counter *c, long long *out, char *err, size_t errlen)
{
    int op[2] = {-1, -1}, ep[2] = {-1, -1};
    char *obuf = malloc(OUT_MAX + 1), ebuf[ERR_MAX + 1], ex[100];
    size_t olen = 0, elen = 0;
    int rc = -1, status = 0, timed_out = 0;
    pid_t pid = -1;
    if (!obuf || pipe2(op, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0) {
        snprintf(err, errlen, "--count-cmd: %s", obuf ? strerror(errno) : "out of memory");
        goto out;
    }
    pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "--count-cmd: fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        setpgid(0, 0);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        dup2(op[1], 1);
        dup2(ep[1], 2);
        execl("/bin/sh", "sh", "-c", c->text, (char *)NULL);
        _exit(127);
    }
    close(op[1]);
    close(ep[1]);
    op[1] = ep[1] = -1;
    int64_t deadline = xchg_now_us() + (int64_t)c->timeout_ms * 1000;
    int open_fds = 2;
    while (open_fds > 0) {
        int64_t left = (deadline - xchg_now_us()) / 1000;
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p[2] = {{.fd = op[0], .events = POLLIN}, {.fd = ep[0], .events = POLLIN}};
        int pr = poll(p, 2, (int)left);
        if (pr < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2 && pr > 0; i++) {
            if (p[i].fd < 0 || !p[i].revents)
                continue;
            char scratch[4096], *dst = scratch;
            size_t room = sizeof scratch;
            if (i == 0 && olen < OUT_MAX) {
                dst = obuf + olen;
                room = OUT_MAX - olen;
            } else if (i == 1 && elen < ERR_MAX) {
                dst = ebuf + elen;
                room = ERR_MAX - elen;
            }
            ssize_t n = read(p[i].fd, dst, room);
            if (n > 0 && dst != scratch)
                *(i == 0 ? &olen : &elen) += (size_t)n;
            if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
                close(p[i].fd);
                if (i == 0)
                    op[0] = -1;
                else
                    ep[0] = -1;
                open_fds--;
            }
        }
    }
    if (timed_out) {
        kill(-pid, SIGKILL); /* its process group... */
        kill(pid, SIGKILL);  /* ...which it may not have made yet */
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    obuf[olen] = '\0';
    ebuf[elen] = '\0';
    ebuf[strcspn(ebuf, "\n")] = '\0';
    if (timed_out)
        snprintf(err, errlen, "--count-cmd '%s' did not finish within %d ms", c->text,
                 c->timeout_ms);
    else if (WIFSIGNALED(status))
        snprintf(err, errlen, "--count-cmd '%s' was killed by signal %d", c->text,
                 WTERMSIG(status));
    else if (WEXITSTATUS(status) != 0)
        snprintf(err, errlen, "--count-cmd '%s' failed with exit status %d%s%s", c->text,
                 WEXITSTATUS(status), elen ? ": " : "", excerpt(ebuf, strlen(ebuf), ex, 90));
    else if (olen == 0)
        snprintf(err, errlen, "--count-cmd '%s' printed nothing; it must print a number",
                 c->text);
    else if (parse_number(obuf, olen, out) != 0) {
        while (olen && (obuf[olen - 1] == '\n' || obuf[olen - 1] == '\r'))
            olen--;
        snprintf(err, errlen, "--count-cmd '%s' printed \"%s\", not a number", c->text,
                 excerpt(obuf, olen, ex, 60));
    }
    else
        rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        if (op[i] >= 0)
            close(op[i]);
        if (ep[i] >= 0)
            close(ep[i]);
    }
    free(obuf);
    return rc;
}

int count_read(const struct counter *c, long long *out, char *err, size_t errlen)
{
    switch (c->kind) {
    case COUNT_URL:
        return read_url(c, out, err, errlen);
    case COUNT_CMD:
        return read_cmd(c, out, err, errlen);
    case COUNT_NONE:
        break;
    }
    snprintf(err, errlen, "no count source");
    return -1;
}
