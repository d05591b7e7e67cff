/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scenario.c — the duplicate storms. Each scenario builds its requests from
 * the template with a business key of its own (fresh for every run, so runs
 * never see each other's records), sends them in its pattern, and has them
 * judged (judge.c) against what the user named as the truth: the execution
 * count, read before it and after it has settled.
 *
 *   scenario             requests (-n N)              expected executions
 *   burst                N at one instant             1
 *   double-click         P = min(N/2, 10) pairs       P (a key per pair)
 *   retry-after-success  1 + R, spaced                1
 *   retry-after-timeout  1 abandoned + up to R        1
 *   channels             2 + 2C (C --channel URLs)    1
 *   payload-mismatch     3                            1, the changed body refused
 *   cross-subject        4                            2 (one per subject)
 *   mixed                K = N/D keys x D dups        K
 *
 * Every scenario takes the same steps (scenario_run): read the count, make
 * the shots, send them, let the count settle and read it again, judge.
 */
#include "scenario.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include "judge.h"

static const char *const names[SC_COUNT] = {
    [SC_BURST] = "burst",
    [SC_DOUBLE_CLICK] = "double-click",
    [SC_RETRY_AFTER_SUCCESS] = "retry-after-success",
    [SC_RETRY_AFTER_TIMEOUT] = "retry-after-timeout",
    [SC_CHANNELS] = "channels",
    [SC_PAYLOAD_MISMATCH] = "payload-mismatch",
    [SC_CROSS_SUBJECT] = "cross-subject",
    [SC_MIXED] = "mixed",
};

const char *scenario_name(int id)
{
    return id >= 0 && id < SC_COUNT ? names[id] : "?";
}

int scenario_find(const char *name, size_t len)
{
    for (int i = 0; i < SC_COUNT; i++)
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0)
            return i;
    return -1;
}

/* ---- sizes ---- */

static int pairs_of(const struct verify_cfg *c)
{
    int p = c->n / 2;
    return p > 10 ? 10 : p < 1 ? 1 : p;
}

static int retries_of(const struct verify_cfg *c)
{
    int k = c->retries < c->n - 1 ? c->retries : c->n - 1;
    return k < 1 ? 1 : k;
}

static int mixed_keys(const struct verify_cfg *c)
{
    int k = c->n / c->dups;
    return k < 1 ? 1 : k;
}

long scenario_planned(const struct verify_cfg *c, int id)
{
    switch (id) {
    case SC_BURST:
        return c->n;
    case SC_DOUBLE_CLICK:
        return 2L * pairs_of(c);
    case SC_RETRY_AFTER_SUCCESS:
    case SC_RETRY_AFTER_TIMEOUT:
        return 1L + retries_of(c);
    case SC_CHANNELS:
        return 2L + 2L * (long)c->nchannels;
    case SC_PAYLOAD_MISMATCH:
        return 3;
    case SC_CROSS_SUBJECT:
        return 4;
    case SC_MIXED:
        return (long)mixed_keys(c) * c->dups;
    }
    return 0;
}

const char *scenario_not_applicable(const struct verify_cfg *c, int id)
{
    if (id == SC_CHANNELS && c->nchannels == 0)
        return "no --channel URL given";
    if (id == SC_PAYLOAD_MISMATCH && !c->has_mismatch_body) {
        if (!c->has_body)
            return "the request has no body to change (give --mismatch-data)";
        struct tpl_values v = {"verify-sample-key", "00000000-0000-4000-8000-000000000000", 1};
        size_t len, out_len;
        char what[200], *b = tpl_render(&c->main_body, &v, &len);
        char *changed = b ? scenario_changed_body(b, len, v.key, &out_len, what, sizeof what)
                          : NULL;
        free(b);
        free(changed);
        if (!changed)
            return "the body is not a JSON object, so no value can be changed "
                   "(give --mismatch-data)";
    }
    return NULL;
}

/* ---- the changed payload ---- */

static int ends_in_digit(const char *s, size_t len)
{
    return len > 0 && s[len - 1] >= '0' && s[len - 1] <= '9';
}

/* Which member to change, in order of preference: a number or a string
 * ending in a digit (an amount, a quantity: still valid when changed, so a
 * refusal is about the key, not the value), then any other string, then a
 * boolean. Members holding the key are never changed. */
static int change_rank(json_t *v, const char *key)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (key && *key && strstr(s, key))
            return 0;
        return ends_in_digit(s, json_string_length(v)) ? 3 : 2;
    }
    if (json_is_number(v))
        return 3;
    if (json_is_boolean(v))
        return 1;
    return 0;
}

char *scenario_changed_body(const char *body, size_t len, const char *key, size_t *out_len,
                            char *what, size_t wlen)
{
    json_t *root = json_loadb(body, len, 0, NULL);
    char *out = NULL;
    if (!json_is_object(root))
        goto out;
    const char *name, *best = NULL;
    json_t *v;
    int best_rank = 0;
    json_object_foreach(root, name, v) {
        int rank = change_rank(v, key);
        if (rank > best_rank) {
            best_rank = rank;
            best = name;
        }
    }
    json_t *nv = NULL;
    if (!best) {
        best = "idem_verify_changed";
        nv = json_true();
        snprintf(what, wlen, "added \"idem_verify_changed\": true");
    } else {
        v = json_object_get(root, best);
        if (json_is_string(v)) {
            size_t sl = json_string_length(v);
            char *s = malloc(sl + 9);
            if (!s)
                goto out;
            memcpy(s, json_string_value(v), sl);
            if (ends_in_digit(s, sl)) {
                s[sl - 1] = s[sl - 1] == '9' ? '8' : (char)(s[sl - 1] + 1);
                s[sl] = '\0';
            } else {
                memcpy(s + sl, "-changed", 9);
            }
            snprintf(what, wlen, "\"%s\": \"%.40s\" -> \"%.40s\"", best, json_string_value(v), s);
            nv = json_stringn(s, strlen(s));
            free(s);
        } else if (json_is_integer(v)) {
            json_int_t i = json_integer_value(v);
            nv = json_integer(i == LLONG_MAX ? i - 1 : i + 1);
            snprintf(what, wlen, "\"%s\": %" JSON_INTEGER_FORMAT " -> %" JSON_INTEGER_FORMAT,
                     best, i, json_integer_value(nv));
        } else if (json_is_real(v)) {
            nv = json_real(json_real_value(v) + 1.0);
            snprintf(what, wlen, "\"%s\": %g -> %g", best, json_real_value(v),
                     json_real_value(nv));
        } else {
            nv = json_boolean(!json_is_true(v));
            snprintf(what, wlen, "\"%s\": %s -> %s", best, json_is_true(v) ? "true" : "false",
                     json_is_true(v) ? "false" : "true");
        }
    }
    if (!nv || json_object_set_new(root, best, nv) != 0)
        goto out;
    out = json_dumps(root, JSON_COMPACT);
    if (out)
        *out_len = strlen(out);
out:
    json_decref(root);
    return out;
}

/* ---- requests ---- */

static void random_bytes(unsigned char *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(b + got, n - got, 0);
        if (r > 0) {
            got += (size_t)r;
        } else if (r < 0 && errno != EINTR) {
            /* No kernel randomness: uniqueness is all a key needs. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            unsigned long long x = (unsigned long long)ts.tv_nsec ^
                                   ((unsigned long long)ts.tv_sec << 20) ^ (uintptr_t)b;
            for (; got < n; got++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                b[got] = (unsigned char)x;
            }
        }
    }
}

static void new_uuid(char out[37])
{
    unsigned char b[16];
    random_bytes(b, sizeof b);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

void scenario_new_run_id(char out[17])
{
    unsigned char b[8];
    random_bytes(b, sizeof b);
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void make_key(const struct verify_run *r, int id, int index, char *out, size_t len)
{
    if (index < 0)
        snprintf(out, len, "%s%s-%s", r->cfg->key_prefix, r->id, names[id]);
    else
        snprintf(out, len, "%s%s-%s-%d", r->cfg->key_prefix, r->id, names[id], index);
}

/* The one-time token for key (--token-scene), as a browser gets one for a
 * form before it is submitted: POST /_idem/v1/tokens on ep's host with the
 * request's own headers (its subject), once per business key, its
 * duplicates carrying the same one. 0, or -1 with r->err. */
static int token_for(struct verify_run *r, const struct endpoint *ep, const char *key,
                     const struct xchg_header *h, size_t nh)
{
    if (strcmp(r->token_key, key) == 0 && r->token[0])
        return 0;
    char body[128];
    int blen = snprintf(body, sizeof body, "{\"scene\":\"%s\"}", r->cfg->token_scene);
    struct xchg_header th[VERIFY_HEADERS_MAX + 3];
    size_t n = 0;
    for (size_t i = 0; i < nh; i++)
        if (strcasecmp(h[i].name, "Content-Type") != 0)
            th[n++] = h[i];
    th[n++] = (struct xchg_header){"Content-Type", "application/json"};
    struct shot t;
    memset(&t, 0, sizeof t);
    t.url = &ep->url;
    t.timeout_ms = r->cfg->timeout_ms;
    t.retry_after_ms = -1;
    t.request = xchg_build("POST", &ep->url, "/_idem/v1/tokens", th, n, body, (size_t)blen, 1,
                           &t.request_len);
    if (!t.request) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    xchg_shot(&r->ctx, &t);
    const char *at = t.outcome == SHOT_ANSWERED && t.status == 201 && t.body
                         ? strstr(t.body, "\"token\":\"")
                         : NULL;
    size_t len = at ? strspn(at + 9, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                     "0123456789-_")
                    : 0;
    if (!at || len == 0 || len >= sizeof r->token || at[9 + len] != '"') {
        snprintf(r->err, sizeof r->err,
                 "--token-scene %s: POST /_idem/v1/tokens answered %s%d %.200s",
                 r->cfg->token_scene, t.outcome == SHOT_ANSWERED ? "" : "no answer: ",
                 t.status, t.outcome == SHOT_ANSWERED && t.body ? t.body : t.error);
        shot_clear(&t);
        return -1;
    }
    memcpy(r->token, at + 9, len);
    r->token[len] = '\0';
    snprintf(r->token_key, sizeof r->token_key, "%s", key);
    shot_clear(&t);
    return 0;
}

/* One request of the template to ep with this key: subject (or NULL)
 * replaces the subject header; body (or NULL: ep's own); mutate changes the
 * payload (payload-mismatch). 0, or -1 when out of memory. */
static int make_shot(struct verify_run *r, struct shot *s, const struct endpoint *ep, const char *key,
                     const char *subject, const struct tpl *body, int mutate, int group,
                     int role, char *what, size_t wlen)
{
    const struct verify_cfg *c = r->cfg;
    struct xchg_header h[VERIFY_HEADERS_MAX + 3];
    char *vals[VERIFY_HEADERS_MAX] = {0}, uuid[37], *b = NULL;
    size_t nh = 0, blen = 0;
    new_uuid(uuid);
    struct tpl_values v = {key, uuid, ++r->seq};
    char *target = tpl_render(&ep->target, &v, NULL);
    int ok = target != NULL;
    for (size_t i = 0; i < c->nheaders; i++) {
        if (subject && strcasecmp(c->headers[i].name, c->subject_header) == 0)
            continue;
        vals[i] = tpl_render(&c->headers[i].value, &v, NULL);
        ok = ok && vals[i];
        h[nh++] = (struct xchg_header){c->headers[i].name, vals[i] ? vals[i] : ""};
    }
    if (subject)
        h[nh++] = (struct xchg_header){c->subject_header, subject};
    if (c->add_json_type)
        h[nh++] = (struct xchg_header){"Content-Type", "application/json"};
    if (ok && c->token_scene) {
        if (token_for(r, ep, key, h, nh) != 0) {
            free(target);
            for (size_t i = 0; i < c->nheaders; i++)
                free(vals[i]);
            memset(s, 0, sizeof *s);
            return -1;
        }
        h[nh++] = (struct xchg_header){"Idem-Token", r->token};
    }
    if (!body)
        body = ep->body;
    if (body && ok) {
        b = tpl_render(body, &v, &blen);
        if (b && mutate) {
            size_t mlen = 0;
            char *m = scenario_changed_body(b, blen, key, &mlen, what, wlen);
            free(b);
            b = m;
            blen = mlen;
        }
        ok = b != NULL;
    }
    memset(s, 0, sizeof *s);
    if (ok)
        s->request = xchg_build(c->method, &ep->url, target, h, nh, b, blen, body != NULL,
                                &s->request_len);
    s->url = &ep->url;
    s->timeout_ms = c->timeout_ms;
    s->head = strcmp(c->method, "HEAD") == 0;
    s->group = group;
    s->role = role;
    s->retry_after_ms = -1;
    free(target);
    free(b);
    for (size_t i = 0; i < c->nheaders; i++)
        free(vals[i]);
    return s->request ? 0 : -1;
}

/* ---- the runs ---- */

static int run_burst(struct verify_run *r, struct shot *shots, size_t *n, struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    make_key(r, SC_BURST, -1, res->key, sizeof res->key);
    for (int i = 0; i < c->n; i++)
        if (make_shot(r, &shots[i], &c->main, res->key, NULL, NULL, 0, 0, ROLE_SAME, NULL, 0))
            return -1;
    *n = (size_t)c->n;
    res->keys = 1;
    res->expected = 1;
    xchg_gun(&r->ctx, shots, *n);
    return 0;
}

static int run_double_click(struct verify_run *r, struct shot *shots, size_t *n,
                            struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    int pairs = pairs_of(c);
    for (int p = 0; p < pairs; p++) {
        char key[128];
        make_key(r, SC_DOUBLE_CLICK, p, key, sizeof key);
        if (p == 0)
            snprintf(res->key, sizeof res->key, "%s", key);
        for (int k = 0; k < 2; k++)
            if (make_shot(r, &shots[2 * p + k], &c->main, key, NULL, NULL, 0, p, ROLE_SAME,
                          NULL, 0))
                return -1;
        /* The second click 10 to 50 ms after the first, spread over the pairs. */
        shots[2 * p + 1].at_ms = 10 + (pairs > 1 ? 40 * p / (pairs - 1) : 20);
    }
    *n = 2 * (size_t)pairs;
    res->keys = (size_t)pairs;
    res->expected = pairs;
    xchg_gun(&r->ctx, shots, *n);
    return 0;
}

static int run_retry_after_success(struct verify_run *r, struct shot *shots, size_t *n,
                                   struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    int total = 1 + retries_of(c);
    make_key(r, SC_RETRY_AFTER_SUCCESS, -1, res->key, sizeof res->key);
    for (int i = 0; i < total; i++)
        if (make_shot(r, &shots[i], &c->main, res->key, NULL, NULL, 0, 0, ROLE_SAME, NULL, 0))
            return -1;
    res->keys = 1;
    res->expected = 1;
    for (int i = 0; i < total; i++) {
        if (i > 0)
            xchg_sleep_ms(c->spacing_ms);
        xchg_shot(&r->ctx, &shots[i]);
        *n = (size_t)i + 1;
    }
    return 0;
}

/* Whether a retrying client would wait and try again: "not yet" answers. */
static int busy_answer(const struct shot *s)
{
    return s->outcome == SHOT_TIMEOUT || s->outcome == SHOT_ERROR ||
           (s->outcome == SHOT_ANSWERED && (s->status == 409 || s->status == 425 ||
                                            s->status == 429 || s->status == 503));
}

static int run_retry_after_timeout(struct verify_run *r, struct shot *shots, size_t *n,
                                   struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    int total = 1 + retries_of(c);
    make_key(r, SC_RETRY_AFTER_TIMEOUT, -1, res->key, sizeof res->key);
    for (int i = 0; i < total; i++)
        if (make_shot(r, &shots[i], &c->main, res->key, NULL, NULL, 0, 0, ROLE_SAME, NULL, 0))
            return -1;
    res->keys = 1;
    res->expected = 1;
    shots[0].timeout_ms = c->client_timeout_ms;
    shots[0].abandon = 1;
    xchg_shot(&r->ctx, &shots[0]);
    *n = 1;
    if (shots[0].outcome == SHOT_ANSWERED)
        snprintf(res->note, sizeof res->note,
                 "the first request was answered within --client-timeout (%d ms), so no client "
                 "gave up: slow the endpoint down (a delay header, a slow test double) to test "
                 "a real timeout", c->client_timeout_ms);
    /* Retry at once, as an impatient client does; after a "not yet" answer
     * wait as told (Retry-After, else 250 ms); stop one retry after the
     * first success, which confirms what a later duplicate gets. */
    int successes = 0;
    for (int i = 1; i < total && successes < 2; i++) {
        xchg_shot(&r->ctx, &shots[i]);
        *n = (size_t)i + 1;
        if (shot_is_2xx(&shots[i])) {
            successes++;
        } else if (busy_answer(&shots[i])) {
            long wait = shots[i].retry_after_ms >= 0 ? shots[i].retry_after_ms : 250;
            xchg_sleep_ms(wait > 5000 ? 5000 : wait);
        }
    }
    return 0;
}

static int run_channels(struct verify_run *r, struct shot *shots, size_t *n,
                        struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    size_t ch = c->nchannels, k = 0;
    make_key(r, SC_CHANNELS, -1, res->key, sizeof res->key);
    /* 1: the main URL; 2: each channel in turn; 3: all of them at once. */
    for (size_t round = 0; round < 3; round++)
        for (size_t i = round == 1 ? 1 : 0; i <= (round == 0 ? 0 : ch); i++)
            if (make_shot(r, &shots[k++], i == 0 ? &c->main : &c->channels[i - 1], res->key,
                          NULL, NULL, 0, 0, ROLE_SAME, NULL, 0))
                return -1;
    res->keys = 1;
    res->expected = 1;
    for (size_t i = 0; i < 1 + ch; i++) {
        xchg_shot(&r->ctx, &shots[i]);
        *n = i + 1;
    }
    xchg_gun(&r->ctx, shots + 1 + ch, 1 + ch);
    *n = k;
    return 0;
}

static int run_payload_mismatch(struct verify_run *r, struct shot *shots, size_t *n,
                                struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    char what[200] = "";
    make_key(r, SC_PAYLOAD_MISMATCH, -1, res->key, sizeof res->key);
    if (make_shot(r, &shots[0], &c->main, res->key, NULL, NULL, 0, 0, ROLE_SAME, NULL, 0) ||
        make_shot(r, &shots[1], &c->main, res->key, NULL,
                  c->has_mismatch_body ? &c->mismatch_body : NULL, !c->has_mismatch_body, 0,
                  ROLE_MISMATCH, what, sizeof what) ||
        make_shot(r, &shots[2], &c->main, res->key, NULL, NULL, 0, 0, ROLE_SAME, NULL, 0))
        return -1;
    snprintf(res->note, sizeof res->note, "changed body: %s",
             c->has_mismatch_body ? "--mismatch-data" : what);
    res->keys = 1;
    res->expected = 1;
    for (size_t i = 0; i < 3; i++) {
        xchg_shot(&r->ctx, &shots[i]);
        *n = i + 1;
    }
    return 0;
}

static int run_cross_subject(struct verify_run *r, struct shot *shots, size_t *n,
                             struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    make_key(r, SC_CROSS_SUBJECT, -1, res->key, sizeof res->key);
    /* A, B, A again, B again. */
    for (int i = 0; i < 4; i++)
        if (make_shot(r, &shots[i], &c->main, res->key, c->subjects[i % 2], NULL, 0, i % 2,
                      ROLE_SAME, NULL, 0))
            return -1;
    res->keys = 2;
    res->expected = 2;
    for (size_t i = 0; i < 4; i++) {
        xchg_shot(&r->ctx, &shots[i]);
        *n = i + 1;
    }
    return 0;
}

static int run_mixed(struct verify_run *r, struct shot *shots, size_t *n, struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    int keys = mixed_keys(c);
    size_t total = (size_t)keys * (size_t)c->dups;
    for (int k = 0; k < keys; k++) {
        char key[128];
        make_key(r, SC_MIXED, k, key, sizeof key);
        if (k == 0)
            snprintf(res->key, sizeof res->key, "%s", key);
        for (int d = 0; d < c->dups; d++)
            if (make_shot(r, &shots[(size_t)k * c->dups + d], &c->main, key, NULL, NULL, 0, k,
                          ROLE_SAME, NULL, 0))
                return -1;
    }
    /* Duplicates in random order, as they come in real traffic. */
    for (size_t i = total - 1; i > 0; i--) {
        unsigned int x;
        random_bytes((unsigned char *)&x, sizeof x);
        size_t j = x % (i + 1);
        struct shot t = shots[i];
        shots[i] = shots[j];
        shots[j] = t;
    }
    *n = total;
    res->keys = (size_t)keys;
    res->expected = keys;
    xchg_pool(&r->ctx, shots, total, (size_t)c->concurrency);
    return 0;
}

typedef int (*run_fn)(struct verify_run *, struct shot *, size_t *, struct scenario_result *);

static const run_fn runners[SC_COUNT] = {
    [SC_BURST] = run_burst,
    [SC_DOUBLE_CLICK] = run_double_click,
    [SC_RETRY_AFTER_SUCCESS] = run_retry_after_success,
    [SC_RETRY_AFTER_TIMEOUT] = run_retry_after_timeout,
    [SC_CHANNELS] = run_channels,
    [SC_PAYLOAD_MISMATCH] = run_payload_mismatch,
    [SC_CROSS_SUBJECT] = run_cross_subject,
    [SC_MIXED] = run_mixed,
};

/* ---- the steps every scenario takes ---- */

static int read_count(struct verify_run *r, long long *v)
{
    return count_read(&r->cfg->counter, v, r->err, sizeof r->err);
}

/* After the last answer, work may still be finishing upstream (an abandoned
 * request, a queue): read until two reads settle_ms apart agree, for at
 * most max(--timeout, 2 s). */
static int read_count_settled(struct verify_run *r, long long *v)
{
    const struct verify_cfg *c = r->cfg;
    int64_t limit = xchg_now_us() + (int64_t)(c->timeout_ms > 2000 ? c->timeout_ms : 2000) * 1000;
    long long prev, cur;
    xchg_sleep_ms(c->settle_ms);
    if (read_count(r, &prev) != 0)
        return -1;
    for (;;) {
        xchg_sleep_ms(c->settle_ms);
        if (read_count(r, &cur) != 0)
            return -1;
        if (cur == prev || xchg_now_us() >= limit)
            break;
        prev = cur;
    }
    *v = cur;
    return 0;
}

int scenario_run(struct verify_run *r, int id, struct scenario_result *res)
{
    const struct verify_cfg *c = r->cfg;
    memset(res, 0, sizeof *res);
    res->name = names[id];
    res->counted = c->counter.kind != COUNT_NONE;
    const char *na = scenario_not_applicable(c, id);
    long planned = scenario_planned(c, id);
    if (na) {
        res->verdict = VERDICT_SKIP;
        snprintf(res->reason, sizeof res->reason, "not applicable: %s", na);
        return 0;
    }
    if (planned > r->requests_left) {
        res->verdict = VERDICT_SKIP;
        snprintf(res->reason, sizeof res->reason,
                 "not run: it needs %ld requests and --max-requests leaves %ld", planned,
                 r->requests_left);
        return 0;
    }
    if (xchg_now_us() >= r->deadline_us) {
        res->verdict = VERDICT_SKIP;
        snprintf(res->reason, sizeof res->reason, "not run: the --deadline has passed");
        return 0;
    }

    long long before = 0, after = 0;
    struct shot *shots = calloc((size_t)planned, sizeof *shots);
    size_t n = 0;
    int rc = -1;
    if (!shots) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    if (res->counted && read_count(r, &before) != 0)
        goto out;
    int64_t t0 = xchg_now_us();
    r->err[0] = '\0';
    if (runners[id](r, shots, &n, res) != 0) {
        if (!r->err[0]) /* a token refused says so itself */
            snprintf(r->err, sizeof r->err, "out of memory building the requests");
        goto out;
    }
    res->duration_ms = (double)(xchg_now_us() - t0) / 1000.0;
    r->requests_left -= (long)n;
    if (res->counted && read_count_settled(r, &after) != 0)
        goto out;

    judge_scenario(id, shots, n, after - before, res);
    if (res->sent && res->errors == res->sent) {
        snprintf(r->err, sizeof r->err, "%s: every request failed: %s", res->name,
                 shots[0].error);
        goto out;
    }
    rc = 0;
out:
    for (size_t i = 0; i < (size_t)planned; i++)
        shot_clear(&shots[i]);
    free(shots);
    return rc;
}
