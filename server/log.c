/* SPDX-License-Identifier: Apache-2.0 */
/* log.c — timestamped log lines on stderr (daemon).
 *
 * Much of what a line says comes from clients: keys, subjects, paths, a
 * route's upstream's words. A line is escaped whole as it is written, so no
 * caller can forget to: a control character, a byte that is not UTF-8, or a
 * character that moves or hides text on a terminal or in a log viewer (C1
 * controls such as U+0085 NEL and U+009B CSI, the line and paragraph
 * separators U+2028 and U+2029, the bidirectional overrides such as U+202E)
 * is written as an escape, as are the characters that show nothing (zero
 * width spaces and joiners, U+00AD, the tag characters U+E0000-E007F that
 * can carry hidden text), and a backslash as two, so that every line read
 * back is one line and says what was sent. */
#include "log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "utf8.h"

/* A code point a reader must not see as such: it moves, hides or joins
 * text without showing itself. */
static int hidden(uint32_t v)
{
    return (v >= 0x80 && v <= 0x9f) || v == 0xad || v == 0x34f || v == 0x61c || v == 0x180e ||
           (v >= 0x200b && v <= 0x200f) || (v >= 0x2028 && v <= 0x202e) ||
           (v >= 0x2060 && v <= 0x206f) || v == 0xfeff || (v >= 0xfff9 && v <= 0xfffb) ||
           (v >= 0xe0000 && v <= 0xe007f);
}

size_t log_escape(const char *in, size_t n, char *out, size_t cap)
{
    const unsigned char *p = (const unsigned char *)in, *end = p + n;
    size_t o = 0;
    if (cap == 0)
        return 0;
    while (p < end) {
        char esc[16];
        size_t len = 1, elen = 0;
        const unsigned char *copy = p;
        if (*p == '\\') {
            esc[0] = esc[1] = '\\';
            elen = 2;
        } else if (*p < 0x20 || *p == 0x7f) {
            elen = (size_t)snprintf(esc, sizeof esc, "\\x%02x", *p);
        } else if (*p >= 0x80) {
            len = utf8_seq_len(p, end);
            if (len == 0) {
                len = 1;
                elen = (size_t)snprintf(esc, sizeof esc, "\\x%02x", *p);
            } else if (hidden(utf8_decode(p, len))) {
                elen = (size_t)snprintf(esc, sizeof esc, "\\u%04x", (unsigned)utf8_decode(p, len));
            }
        }
        const void *src = elen ? (const void *)esc : (const void *)copy;
        size_t sn = elen ? elen : len;
        if (o + sn >= cap)
            break; /* cut between characters, never inside one */
        for (size_t i = 0; i < sn; i++)
            out[o + i] = ((const char *)src)[i];
        o += sn;
        p += len;
    }
    out[o] = '\0';
    return o;
}

size_t log_json_escape(const char *in, size_t n, char *out, size_t cap)
{
    const unsigned char *p = (const unsigned char *)in, *end = p + n;
    size_t o = 0;
    while (p < end) {
        char esc[16];
        size_t elen, len = 1;
        if (*p >= 0x20 && *p < 0x7f && *p != '"' && *p != '\\') {
            esc[0] = (char)*p;
            elen = 1;
        } else {
            uint32_t v = *p;
            if (*p >= 0x80) {
                len = utf8_seq_len(p, end);
                v = len ? utf8_decode(p, len) : 0xfffd;
                len = len ? len : 1;
            }
            if (v == '"' || v == '\\')
                elen = (size_t)snprintf(esc, sizeof esc, "\\%c", (char)v);
            else if (v > 0xffff)
                elen = (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x",
                                        (unsigned)(0xd800 + ((v - 0x10000) >> 10)),
                                        (unsigned)(0xdc00 + ((v - 0x10000) & 0x3ff)));
            else
                elen = (size_t)snprintf(esc, sizeof esc, "\\u%04x", (unsigned)v);
        }
        if (o + elen > cap)
            break; /* cut between characters */
        memcpy(out + o, esc, elen);
        o += elen;
        p += len;
    }
    return o;
}

static enum log_level least = LOG_INFO;
static int as_json;

void daemon_log_setup(enum log_level l, int json)
{
    least = l;
    as_json = json;
}

int daemon_log_enabled(enum log_level level)
{
    return level >= least;
}

/* ,"name":"value" for each field of about that is there, into line at n
 * (room for cap, and the "}\n" after); returns the new n. */
static size_t about_fields(const struct log_about *about, char *line, size_t n, size_t cap)
{
    const struct {
        const char *name, *value;
    } f[] = {{"route", about->route},           {"consumer", about->consumer},
             {"space", about->space},           {"key", about->key},
             {"request_id", about->request_id}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].value || n + strlen(f[i].name) + 8 >= cap)
            continue;
        n += (size_t)snprintf(line + n, cap - n, ",\"%s\":\"", f[i].name);
        n += log_json_escape(f[i].value, strlen(f[i].value), line + n, cap - n - 1);
        line[n++] = '"';
    }
    if (about->epoch && n + 40 < cap)
        n += (size_t)snprintf(line + n, cap - n, ",\"epoch\":%" PRIu64, about->epoch);
    return n;
}

static void vlog(enum log_level level, const struct log_about *about, const char *fmt,
                 va_list ap)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "alert"};
    char msg[1024], line[4096];
    struct timespec ts;
    struct tm tm;
    if (level < least)
        return;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = as_json ? (size_t)snprintf(line, sizeof line, "{\"time\":\"") : 0;
    n += strftime(line + n, sizeof line - n, "%Y-%m-%dT%H:%M:%S", &tm);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    size_t mlen = m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
    if (as_json) {
        n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ\",\"level\":\"%s\",\"msg\":\"",
                              ts.tv_nsec / 1000000, names[level]);
        n += log_json_escape(msg, mlen, line + n, sizeof line - n - 3 - 1200);
        line[n++] = '"';
        if (about)
            n = about_fields(about, line, n, sizeof line - 3);
        line[n++] = '}';
    } else {
        /* The level, as these lines have always said it. */
        static const char *const said[] = {"", "", "warning: ", "error: ", "ALERT "};
        n += (size_t)snprintf(line + n, sizeof line - n, ".%03ldZ idem: %s",
                              ts.tv_nsec / 1000000, said[level]);
        n += log_escape(msg, mlen, line + n, sizeof line - n - 1);
    }
    line[n++] = '\n';
    ssize_t w = write(2, line, n);
    (void)w;
}

void daemon_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(LOG_INFO, NULL, fmt, ap);
    va_end(ap);
}

void daemon_logl(enum log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, NULL, fmt, ap);
    va_end(ap);
}

void daemon_log_about(enum log_level level, const struct log_about *about, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vlog(level, about, fmt, ap);
    va_end(ap);
}
