/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verify.c — `idem verify [options] URL`: read the command line into a
 * struct verify_cfg, check everything that can be checked before a request
 * is sent (URLs, the host rule, templates, the count source, the target
 * being reachable), run the chosen scenarios (scenario.c) and report
 * (report.c). Exit status: 0 every scenario passed, 1 one failed, 2 a usage
 * or connection error.
 */
#include "verify.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "progress.h"
#include "report.h"
#include "scenario.h"
/* The --help text, idem_verify_help: made from docs/man/idem-verify.txt,
 * as the manual page is (scripts/mkman.sh). */
#include "idem_verify_help.h"

#define BODY_MAX (1024 * 1024)
#define N_MAX 10000
#define ERR_LEN 700

enum {
    OPT_BODY_FILE = 256,
    OPT_DUPS,
    OPT_RETRIES,
    OPT_SPACING,
    OPT_CLIENT_TIMEOUT,
    OPT_CHANNEL,
    OPT_CHANNEL_DATA,
    OPT_MISMATCH_DATA,
    OPT_SUBJECT_HEADER,
    OPT_SUBJECTS,
    OPT_KEY_PREFIX,
    OPT_TOKEN_SCENE,
    OPT_REPLAY_HEADER,
    OPT_COUNT_URL,
    OPT_COUNT_FIELD,
    OPT_COUNT_CMD,
    OPT_SETTLE,
    OPT_TIMEOUT,
    OPT_DEADLINE,
    OPT_MAX_REQUESTS,
    OPT_JSON,
    OPT_JUNIT,
    OPT_NO_PROGRESS,
    OPT_CACERT,
    OPT_CERT,
    OPT_KEY,
};

static const struct option long_options[] = {
    {"request", required_argument, NULL, 'X'},
    {"header", required_argument, NULL, 'H'},
    {"data", required_argument, NULL, 'd'},
    {"body-file", required_argument, NULL, OPT_BODY_FILE},
    {"scenario", required_argument, NULL, 's'},
    {"requests", required_argument, NULL, 'n'},
    {"concurrency", required_argument, NULL, 'c'},
    {"dups", required_argument, NULL, OPT_DUPS},
    {"retries", required_argument, NULL, OPT_RETRIES},
    {"spacing", required_argument, NULL, OPT_SPACING},
    {"client-timeout", required_argument, NULL, OPT_CLIENT_TIMEOUT},
    {"channel", required_argument, NULL, OPT_CHANNEL},
    {"channel-data", required_argument, NULL, OPT_CHANNEL_DATA},
    {"mismatch-data", required_argument, NULL, OPT_MISMATCH_DATA},
    {"subject-header", required_argument, NULL, OPT_SUBJECT_HEADER},
    {"subjects", required_argument, NULL, OPT_SUBJECTS},
    {"key-prefix", required_argument, NULL, OPT_KEY_PREFIX},
    {"token-scene", required_argument, NULL, OPT_TOKEN_SCENE},
    {"replay-header", required_argument, NULL, OPT_REPLAY_HEADER},
    {"count-url", required_argument, NULL, OPT_COUNT_URL},
    {"count-field", required_argument, NULL, OPT_COUNT_FIELD},
    {"count-cmd", required_argument, NULL, OPT_COUNT_CMD},
    {"settle", required_argument, NULL, OPT_SETTLE},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"deadline", required_argument, NULL, OPT_DEADLINE},
    {"max-requests", required_argument, NULL, OPT_MAX_REQUESTS},
    {"json", no_argument, NULL, OPT_JSON},
    {"junit", required_argument, NULL, OPT_JUNIT},
    {"no-progress", no_argument, NULL, OPT_NO_PROGRESS},
    {"cacert", required_argument, NULL, OPT_CACERT},
    {"cert", required_argument, NULL, OPT_CERT},
    {"key", required_argument, NULL, OPT_KEY},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* What the command line said, before it is checked and turned into cfg. */
struct args {
    const char *url;
    const char *body;      /* -d text */
    const char *body_file; /* --body-file, or -d @FILE */
    const char *headers[VERIFY_HEADERS_MAX];
    size_t nheaders;
    const char *channels[VERIFY_CHANNELS_MAX];
    const char *channel_data[VERIFY_CHANNELS_MAX];
    size_t nchannels;
    const char *mismatch;
    const char *subjects;
    const char *count_url, *count_cmd;
    const char *junit;
    const char *cacert, *cert, *key; /* https:// URLs: --cacert, --cert, --key */
    int json, progress;
    char *body_text; /* the body read from a file, owned */
};

static const char *const default_replay_headers[] = {
    "Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed",
    "X-Idempotency-Replayed",
};

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "idem verify: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(idem verify --help lists the options)\n");
    return 2;
}

/* A duration: a number with ms, s or m; bare is seconds. ms in [lo, hi]. */
static int parse_duration(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *ms)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mult = 1000;
    if (end == s || errno || v < 0) {
        usage_error("%s %s: expected a duration like 500ms, 10s or 2m", opt, s);
        return -1;
    }
    if (strcmp(end, "ms") == 0)
        mult = 1;
    else if (strcmp(end, "s") == 0 || *end == '\0')
        mult = 1000;
    else if (strcmp(end, "m") == 0)
        mult = 60000;
    else {
        usage_error("%s %s: unknown unit '%s' (use ms, s or m)", opt, s, end);
        return -1;
    }
    double r = v * mult;
    if (r < (double)lo || r > (double)hi) {
        usage_error("%s %s: out of range (%lldms to %llds)", opt, s, (long long)lo,
                    (long long)(hi / 1000));
        return -1;
    }
    *ms = (int64_t)r;
    return 0;
}

static int parse_count(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        usage_error("%s %s: expected a whole number from %ld to %ld", opt, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int is_token(const char *s, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!strchr("!#$%&'*+-.^_`|~", s[i]) && !(s[i] >= '0' && s[i] <= '9') &&
            !(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= 'A' && s[i] <= 'Z'))
            return 0;
    return 1;
}

static int has_ctl(const char *s)
{
    for (; *s; s++)
        if (((unsigned char)*s < 0x20 && *s != '\t') || *s == 0x7f)
            return 1;
    return 0;
}

static char *read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--body-file %s: cannot read it: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(BODY_MAX + 1);
    size_t n = buf ? fread(buf, 1, BODY_MAX + 1, f) : 0;
    int bad = !buf || ferror(f);
    int e = errno;
    fclose(f);
    if (bad) {
        snprintf(err, errlen, "--body-file %s: cannot read it: %s", path,
                 buf ? strerror(e) : "out of memory");
        free(buf);
        return NULL;
    }
    if (n > BODY_MAX) {
        snprintf(err, errlen, "--body-file %s: over 1 MiB", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int looks_like_json(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i < len && (s[i] == '{' || s[i] == '[');
}

/* A body template: placeholders parse, and a body that looks like JSON is
 * JSON once they are filled in. */
static int parse_body(struct tpl *t, const char *text, size_t len, const char *what, char *err,
                      size_t errlen)
{
    if (tpl_parse(t, text, len, what, err, errlen) != 0)
        return -1;
    if (!looks_like_json(text, len))
        return 0;
    struct tpl_values v = {"verify-sample-key", "00000000-0000-4000-8000-000000000000", 1};
    size_t rlen;
    char *r = tpl_render(t, &v, &rlen);
    json_error_t je;
    json_t *j = r ? json_loadb(r, rlen, JSON_DECODE_ANY, &je) : NULL;
    free(r);
    if (!j) {
        snprintf(err, errlen, "%s: the body looks like JSON but does not parse: %s (line %d, "
                 "column %d)", what, r ? je.text : "out of memory", je.line, je.column);
        tpl_free(t);
        return -1;
    }
    json_decref(j);
    return 0;
}

static int parse_endpoint(struct endpoint *e, const char *text, const char *what, char *err,
                          size_t errlen)
{
    e->text = text;
    if (vurl_parse(text, &e->url, err, errlen) != 0)
        return -1;
    return tpl_parse(&e->target, e->url.target, strlen(e->url.target), what, err, errlen);
}

static void endpoint_free(struct endpoint *e)
{
    vurl_free(&e->url);
    tpl_free(&e->target);
    tpl_free(&e->own_body);
}

static void cfg_free(struct verify_cfg *c)
{
    endpoint_free(&c->main);
    tpl_free(&c->main_body);
    for (size_t i = 0; i < c->nheaders; i++) {
        free(c->headers[i].name);
        tpl_free(&c->headers[i].value);
    }
    for (size_t i = 0; i < c->nchannels; i++)
        endpoint_free(&c->channels[i]);
    tpl_free(&c->mismatch_body);
    vurl_free(&c->counter.url);
}

static int headers_use_key(const struct verify_cfg *c)
{
    for (size_t i = 0; i < c->nheaders; i++)
        if (tpl_uses(&c->headers[i].value, TPL_KEY))
            return 1;
    return 0;
}

static int choose_scenarios(struct verify_cfg *c, const char *list)
{
    const char *s = list;
    while (*s) {
        size_t len = strcspn(s, ",");
        int id = scenario_find(s, len);
        if (id < 0) {
            usage_error("unknown scenario '%.*s' (scenarios: burst, double-click, "
                        "retry-after-success, retry-after-timeout, channels, payload-mismatch, "
                        "cross-subject, mixed)", (int)len, s);
            return -1;
        }
        c->chosen |= 1u << id;
        s += len + (s[len] == ',');
    }
    return 0;
}

/* Turn args into cfg; every check that needs no network. 0, or 2. */
static int build_cfg(struct args *a, struct verify_cfg *c)
{
    char err[ERR_LEN];
    if (!a->url)
        return usage_error("no URL given: idem verify [options] URL");
    if (parse_endpoint(&c->main, a->url, "the URL", err, sizeof err) != 0)
        return usage_error("%s", err);

    /* The body. */
    if (a->body && a->body_file)
        return usage_error("the body is given twice (-d and --body-file): give one");
    const char *body = a->body;
    size_t body_len = body ? strlen(body) : 0;
    char what[300];
    snprintf(what, sizeof what, "-d");
    if (a->body_file) {
        if (!(a->body_text = read_file(a->body_file, &body_len, err, sizeof err)))
            return usage_error("%s", err);
        body = a->body_text;
        snprintf(what, sizeof what, "--body-file %s", a->body_file);
    }
    if (body) {
        if (parse_body(&c->main_body, body, body_len, what, err, sizeof err) != 0)
            return usage_error("%s", err);
        c->has_body = 1;
        c->main.body = &c->main_body;
    }

    /* Headers. */
    int have_type = 0;
    for (size_t i = 0; i < a->nheaders; i++) {
        const char *h = a->headers[i], *colon = strchr(h, ':');
        if (!colon || !is_token(h, (size_t)(colon - h)))
            return usage_error("-H '%s': expected 'Name: value' with a valid header name", h);
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        if (has_ctl(v))
            return usage_error("-H '%.*s: ...': the value holds a control character",
                               (int)(colon - h), h);
        size_t nlen = (size_t)(colon - h);
        static const char *const ours[] = {"Content-Length", "Transfer-Encoding", "Connection"};
        for (size_t k = 0; k < sizeof ours / sizeof ours[0]; k++)
            if (strlen(ours[k]) == nlen && strncasecmp(h, ours[k], nlen) == 0)
                return usage_error("-H %s: idem verify sets this header itself", ours[k]);
        have_type |= nlen == 12 && strncasecmp(h, "Content-Type", 12) == 0;
        struct header_tpl *t = &c->headers[c->nheaders];
        if (!(t->name = strndup(h, nlen)))
            return usage_error("out of memory");
        c->nheaders++;
        snprintf(what, sizeof what, "-H %s", t->name);
        if (tpl_parse(&t->value, v, strlen(v), what, err, sizeof err) != 0)
            return usage_error("%s", err);
    }
    c->add_json_type = c->has_body && !have_type && looks_like_json(body, body_len);
    if (!tpl_uses(&c->main.target, TPL_KEY) && !headers_use_key(c) &&
        !(c->has_body && tpl_uses(&c->main_body, TPL_KEY)))
        return usage_error("the request template has no {{key}}: put it where the endpoint "
                           "reads its idempotency key (the URL, a header or the body), e.g. "
                           "-d '{\"order_no\":\"{{key}}\"}' or -H 'Idempotency-Key: {{key}}'");

    /* Channels. */
    for (size_t i = 0; i < a->nchannels; i++) {
        struct endpoint *e = &c->channels[i];
        snprintf(what, sizeof what, "--channel %s", a->channels[i]);
        c->nchannels++;
        if (parse_endpoint(e, a->channels[i], what, err, sizeof err) != 0)
            return usage_error("--channel %s", err);
        e->body = c->has_body ? &c->main_body : NULL;
        if (a->channel_data[i]) {
            snprintf(what, sizeof what, "--channel-data for %s", a->channels[i]);
            if (parse_body(&e->own_body, a->channel_data[i], strlen(a->channel_data[i]), what,
                           err, sizeof err) != 0)
                return usage_error("%s", err);
            e->body = &e->own_body;
        }
        if (!tpl_uses(&e->target, TPL_KEY) && !headers_use_key(c) &&
            !(e->body && tpl_uses(e->body, TPL_KEY)))
            return usage_error("--channel %s: no {{key}} in its URL, the headers or its body",
                               a->channels[i]);
    }
    if (a->mismatch) {
        if (parse_body(&c->mismatch_body, a->mismatch, strlen(a->mismatch), "--mismatch-data",
                       err, sizeof err) != 0)
            return usage_error("%s", err);
        c->has_mismatch_body = 1;
    }

    /* Subjects. */
    if (!is_token(c->subject_header, strlen(c->subject_header)))
        return usage_error("--subject-header %s: not a header name", c->subject_header);
    static char subj[2][256];
    if (a->subjects) {
        const char *comma = strchr(a->subjects, ',');
        size_t l1 = comma ? (size_t)(comma - a->subjects) : 0;
        if (!comma || l1 == 0 || l1 >= sizeof subj[0] || !comma[1] || strchr(comma + 1, ',') ||
            strlen(comma + 1) >= sizeof subj[1] || has_ctl(a->subjects))
            return usage_error("--subjects %s: expected two names, A,B", a->subjects);
        snprintf(subj[0], sizeof subj[0], "%.*s", (int)l1, a->subjects);
        snprintf(subj[1], sizeof subj[1], "%s", comma + 1);
        if (strcmp(subj[0], subj[1]) == 0)
            return usage_error("--subjects %s: the two subjects must differ", a->subjects);
        c->subjects[0] = subj[0];
        c->subjects[1] = subj[1];
    }
    if (has_ctl(c->key_prefix) || strlen(c->key_prefix) > 64)
        return usage_error("--key-prefix: at most 64 characters, no control characters");

    /* The count. */
    if (a->count_url && a->count_cmd)
        return usage_error("give --count-url or --count-cmd, not both");
    if (a->count_url) {
        c->counter.kind = COUNT_URL;
        c->counter.text = a->count_url;
        if (vurl_parse(a->count_url, &c->counter.url, err, sizeof err) != 0)
            return usage_error("--count-url %s", err);
    } else if (a->count_cmd) {
        if (!*a->count_cmd)
            return usage_error("--count-cmd: the command is empty");
        c->counter.kind = COUNT_CMD;
        c->counter.text = a->count_cmd;
    }
    c->counter.timeout_ms = c->timeout_ms;

    if (c->n > c->max_requests)
        return usage_error("-n %d is over --max-requests %ld", c->n, c->max_requests);
    for (int id = 0; id < SC_COUNT; id++) {
        const char *why = scenario_not_applicable(c, id);
        if ((c->chosen & (1u << id)) && why)
            return usage_error("--scenario %s: %s", scenario_name(id), why);
    }
    return 0;
}

/* Resolve every URL, apply the host rule, and make sure the target takes
 * connections: 0, or 2 with the problem on stderr. */
static int check_network(struct verify_cfg *c)
{
    char err[ERR_LEN];
    if (vurl_resolve(&c->main.url, err, sizeof err) != 0)
        return usage_error("%s (the URL %s)", err, c->main.text);
    for (size_t i = 0; i < c->nchannels; i++) {
        struct endpoint *e = &c->channels[i];
        if (vurl_resolve(&e->url, err, sizeof err) != 0)
            return usage_error("%s (--channel %s)", err, e->text);
        if (!vurl_allowed(&e->url, &c->main.url))
            return usage_error("--channel %s: idem verify sends only to the URL's host (%s) "
                               "or to loopback", e->text, c->main.url.host);
    }
    if (c->counter.kind == COUNT_URL) {
        if (vurl_resolve(&c->counter.url, err, sizeof err) != 0)
            return usage_error("%s (--count-url %s)", err, c->counter.text);
        if (!vurl_allowed(&c->counter.url, &c->main.url))
            return usage_error("--count-url %s: idem verify talks only to the URL's host (%s) "
                               "or to loopback", c->counter.text, c->main.url.host);
    }
    int probe_ms = c->timeout_ms < 5000 ? c->timeout_ms : 5000;
    if (xchg_probe(&c->main.url, probe_ms, err, sizeof err) != 0) {
        /* A TLS refusal is the service's answer, not its absence. */
        fprintf(stderr, "idem verify: %s (the URL %s)%s\n", err, c->main.text,
                strncmp(err, "TLS:", 4) == 0 ? "" : ": is the service running?");
        return 2;
    }
    for (size_t i = 0; i < c->nchannels; i++)
        if (xchg_probe(&c->channels[i].url, probe_ms, err, sizeof err) != 0) {
            fprintf(stderr, "idem verify: %s (--channel %s)\n", err, c->channels[i].text);
            return 2;
        }
    return 0;
}

/* burst holds N connections open at once. */
static int check_fd_limit(const struct verify_cfg *c)
{
    if (c->chosen && !(c->chosen & (1u << SC_BURST)))
        return 0;
    struct rlimit rl;
    rlim_t need = (rlim_t)c->n + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need)
        return 0;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur >= need)
        return 0;
    return usage_error("-n %d needs %d open connections, and the limit on open files is %llu "
                       "(ulimit -n)", c->n, c->n, (unsigned long long)rl.rlim_cur);
}

static int parse_args(int argc, char **argv, struct args *a, struct verify_cfg *c)
{
    int opt;
    long v;
    int64_t ms;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":X:H:d:s:n:c:h", long_options, NULL)) != -1) {
        switch (opt) {
        case 'X':
            if (!is_token(optarg, strlen(optarg)) || strlen(optarg) > 32)
                return usage_error("-X %s: not an HTTP method", optarg);
            c->method = optarg;
            break;
        case 'H':
            if (a->nheaders == VERIFY_HEADERS_MAX)
                return usage_error("more than %d -H headers", VERIFY_HEADERS_MAX);
            a->headers[a->nheaders++] = optarg;
            break;
        case 'd':
            if (optarg[0] == '@') {
                if (a->body_file)
                    return usage_error("the body is given twice: give one -d or --body-file");
                a->body_file = optarg + 1;
            } else {
                if (a->body)
                    return usage_error("the body is given twice: give one -d");
                a->body = optarg;
            }
            break;
        case OPT_BODY_FILE:
            if (a->body_file)
                return usage_error("the body is given twice: give one --body-file");
            a->body_file = optarg;
            break;
        case 's':
            if (choose_scenarios(c, optarg) != 0)
                return 2;
            break;
        case 'n':
            if (parse_count("-n", optarg, 1, N_MAX, &v) != 0)
                return 2;
            c->n = (int)v;
            break;
        case 'c':
            if (parse_count("-c", optarg, 1, 1000, &v) != 0)
                return 2;
            c->concurrency = (int)v;
            break;
        case OPT_DUPS:
            if (parse_count("--dups", optarg, 2, 1000, &v) != 0)
                return 2;
            c->dups = (int)v;
            break;
        case OPT_RETRIES:
            if (parse_count("--retries", optarg, 1, 100, &v) != 0)
                return 2;
            c->retries = (int)v;
            break;
        case OPT_SPACING:
            if (parse_duration("--spacing", optarg, 0, 60000, &ms) != 0)
                return 2;
            c->spacing_ms = (int)ms;
            break;
        case OPT_CLIENT_TIMEOUT:
            if (parse_duration("--client-timeout", optarg, 1, 600000, &ms) != 0)
                return 2;
            c->client_timeout_ms = (int)ms;
            break;
        case OPT_CHANNEL:
            if (a->nchannels == VERIFY_CHANNELS_MAX)
                return usage_error("more than %d --channel URLs", VERIFY_CHANNELS_MAX);
            a->channels[a->nchannels++] = optarg;
            break;
        case OPT_CHANNEL_DATA:
            if (a->nchannels == 0)
                return usage_error("--channel-data comes after the --channel it is for");
            if (a->channel_data[a->nchannels - 1])
                return usage_error("--channel %s has two --channel-data",
                                   a->channels[a->nchannels - 1]);
            a->channel_data[a->nchannels - 1] = optarg;
            break;
        case OPT_MISMATCH_DATA:
            a->mismatch = optarg;
            break;
        case OPT_SUBJECT_HEADER:
            c->subject_header = optarg;
            break;
        case OPT_SUBJECTS:
            a->subjects = optarg;
            break;
        case OPT_KEY_PREFIX:
            c->key_prefix = optarg;
            break;
        case OPT_TOKEN_SCENE:
            if (!*optarg || strlen(optarg) > 64 || strspn(optarg, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                                  "abcdefghijklmnopqrstuvwxyz"
                                                                  "0123456789_.:-") !=
                                                          strlen(optarg))
                return usage_error("--token-scene %s: a scene is 1 to 64 of A-Z a-z 0-9 _ . : -",
                                   optarg);
            c->token_scene = optarg;
            break;
        case OPT_REPLAY_HEADER:
            if (c->nreplay == VERIFY_REPLAY_HEADERS_MAX)
                return usage_error("too many --replay-header names");
            if (!is_token(optarg, strlen(optarg)))
                return usage_error("--replay-header %s: not a header name", optarg);
            c->replay_headers[c->nreplay++] = optarg;
            break;
        case OPT_COUNT_URL:
            a->count_url = optarg;
            break;
        case OPT_COUNT_FIELD:
            if (!*optarg)
                return usage_error("--count-field: empty");
            c->counter.field = optarg;
            break;
        case OPT_COUNT_CMD:
            a->count_cmd = optarg;
            break;
        case OPT_SETTLE:
            if (parse_duration("--settle", optarg, 0, 60000, &ms) != 0)
                return 2;
            c->settle_ms = (int)ms;
            break;
        case OPT_TIMEOUT:
            if (parse_duration("--timeout", optarg, 1, 3600000, &ms) != 0)
                return 2;
            c->timeout_ms = (int)ms;
            break;
        case OPT_DEADLINE:
            if (parse_duration("--deadline", optarg, 1, 86400000, &ms) != 0)
                return 2;
            c->deadline_ms = ms;
            break;
        case OPT_MAX_REQUESTS:
            if (parse_count("--max-requests", optarg, 1, 10000000, &v) != 0)
                return 2;
            c->max_requests = v;
            break;
        case OPT_JSON:
            a->json = 1;
            break;
        case OPT_JUNIT:
            a->junit = optarg;
            break;
        case OPT_CACERT:
            a->cacert = optarg;
            break;
        case OPT_CERT:
            a->cert = optarg;
            break;
        case OPT_KEY:
            a->key = optarg;
            break;
        case OPT_NO_PROGRESS:
            a->progress = 0;
            break;
        case 'h':
            fputs(idem_verify_help, stdout);
            return 1;
        case ':':
            return usage_error("%s needs a value", argv[optind - 1]);
        default:
            if (optopt)
                return usage_error("unknown option -%c", optopt);
            return usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        a->url = argv[optind];
    if (optind + 1 < argc)
        return usage_error("one URL please; got %s and %s (use --channel for more)",
                           argv[optind], argv[optind + 1]);
    return 0;
}

static void set_defaults(struct verify_cfg *c, struct args *a)
{
    c->method = "POST";
    c->subject_header = "X-Subject";
    c->subjects[0] = "verify-subject-a";
    c->subjects[1] = "verify-subject-b";
    c->key_prefix = "verify-";
    c->n = 100;
    c->concurrency = 16;
    c->dups = 5;
    c->retries = 3;
    c->spacing_ms = 100;
    c->client_timeout_ms = 1000;
    c->counter.field = "count";
    c->settle_ms = 300;
    c->timeout_ms = 10000;
    c->deadline_ms = 300000;
    c->max_requests = 2000;
    for (size_t i = 0; i < sizeof default_replay_headers / sizeof default_replay_headers[0]; i++)
        c->replay_headers[c->nreplay++] = default_replay_headers[i];
    a->progress = 1;
}

/* TLS when a URL is https:// (the target, a channel, the count URL): the
 * CAs of --cacert (else the system's) and --cert with --key. 0, or 2's
 * usage error. */
static int check_tls(const struct args *a, const struct verify_cfg *c)
{
    int https = c->main.url.tls || (c->counter.kind == COUNT_URL && c->counter.url.tls);
    for (size_t i = 0; i < c->nchannels; i++)
        https |= c->channels[i].url.tls;
    if (!a->cert != !a->key)
        return usage_error("--cert and --key go together: a client certificate and its key");
    if (!https) {
        if (a->cacert || a->cert)
            return usage_error("--cacert, --cert and --key are for https:// URLs only");
        return 0;
    }
    char err[400];
    if (xchg_tls_init(a->cacert, a->cert, a->key, err, sizeof err) != 0)
        return usage_error("%s", err);
    return 0;
}

int verify_main(int argc, char **argv)
{
    struct verify_cfg cfg;
    struct args args;
    struct scenario_result results[SC_COUNT];
    size_t nresults = 0;
    struct verify_run run;
    FILE *junit = NULL;
    int status = 2, failed = 0;
    long long baseline;
    memset(&cfg, 0, sizeof cfg);
    memset(&run, 0, sizeof run);
    memset(&args, 0, sizeof args);
    set_defaults(&cfg, &args);
    signal(SIGPIPE, SIG_IGN);

    int rc = parse_args(argc, argv, &args, &cfg);
    if (rc != 0) {
        status = rc == 1 ? 0 : 2;
        goto out;
    }
    if (build_cfg(&args, &cfg) != 0 || check_fd_limit(&cfg) != 0 || check_tls(&args, &cfg) != 0 ||
        check_network(&cfg) != 0)
        goto out;
    if (args.junit && !(junit = fopen(args.junit, "w"))) {
        usage_error("--junit %s: cannot write it: %s", args.junit, strerror(errno));
        goto out;
    }

    run.cfg = &cfg;
    run.requests_left = cfg.max_requests;
    scenario_new_run_id(run.id);
    int64_t t0 = xchg_now_us();
    run.deadline_us = t0 + cfg.deadline_ms * 1000;
    run.ctx = (struct xchg_ctx){.replay_headers = cfg.replay_headers, .nreplay = cfg.nreplay,
                                .deadline_us = run.deadline_us, .on_done = progress_tick};
    if (cfg.counter.kind != COUNT_NONE &&
        count_read(&cfg.counter, &baseline, run.err, sizeof run.err) != 0) {
        fprintf(stderr, "idem verify: %s\n", run.err);
        goto out;
    }

    progress_start(args.progress);
    for (int id = 0; id < SC_COUNT; id++) {
        if (cfg.chosen && !(cfg.chosen & (1u << id)))
            continue;
        progress_scenario(scenario_name(id), scenario_planned(&cfg, id));
        if (scenario_run(&run, id, &results[nresults]) != 0) {
            progress_stop();
            fprintf(stderr, "idem verify: %s\n", run.err);
            goto out;
        }
        failed |= results[nresults].verdict == VERDICT_FAIL;
        nresults++;
    }
    progress_stop();

    status = failed ? 1 : 0;
    struct report rep = {.cfg = &cfg, .run_id = run.id, .results = results, .n = nresults,
                         .duration_ms = (double)(xchg_now_us() - t0) / 1000.0,
                         .exit_status = status};
    if (args.json)
        report_json(stdout, &rep);
    else
        report_table(stdout, &rep, isatty(1) && !getenv("NO_COLOR"));
    fflush(stdout);
    if (junit && (report_junit(junit, &rep) != 0 || fclose(junit) != 0)) {
        junit = NULL;
        fprintf(stderr, "idem verify: --junit %s: the write failed\n", args.junit);
        status = 2;
    }
    junit = NULL;
out:
    if (junit)
        fclose(junit);
    xchg_tls_free();
    cfg_free(&cfg);
    free(args.body_text);
    return status;
}
