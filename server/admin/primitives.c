/* SPDX-License-Identifier: Apache-2.0 */
/*
 * primitives.c — every libidem primitive over HTTP (admin), for services
 * that want the layers without the gateway: tokens, locks, records. Each
 * endpoint checks its body, starts the library's asynchronous call on the
 * request's loop, and answers from its callback: business outcomes are 200
 * with {"outcome": "..."}, a malformed body 400 naming the field, store
 * trouble 503. docs/http-api.md is the normative reference; the endpoint
 * table (api.c) says which listener serves which.
 */
#include "admin/primitives.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "gateway/request_key.h"
#include "http/front.h"
#include "http/rate.h"
#include "mono.h"

/* ---- the callbacks: each answers its call ---- */

/* A GET of a record: its space and key, decoded, for the 404. */
struct names {
    char space[IDEM_NAME_MAX * 3 + 1];
    char key[IDEM_KEY_MAX * 3 + 1];
};

/* What the call was, for the problem of a failure: the endpoint's path. */
#define WHAT(c) ((c)->rest)

static void on_outcome(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct api_call *c = arg;
    api_answer(c, rc != IDEM_OK ? problem_from_rc(rc, detail, WHAT(c)) : api_outcome(o, NULL));
}

static void on_spent(void *arg, idem_rc rc, idem_outcome o, const char *spent_key,
                     const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK)
        api_answer(c, problem_from_rc(rc, detail, WHAT(c)));
    else
        api_answer(c, api_outcome(o, o == IDEM_ALREADY_CONSUMED
                                         ? json_pack("{s:s}", "spent_key", spent_key)
                                         : NULL));
}

static void on_lock(void *arg, idem_rc rc, idem_outcome o, const idem_lock_info *info,
                    const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK)
        api_answer(c, problem_from_rc(rc, detail, WHAT(c)));
    else
        api_answer(c, api_outcome(o, o == IDEM_ACQUIRED
                                         ? json_pack("{s:I, s:I}", "fence",
                                                     (json_int_t)info->fence, "ttl_left_ms",
                                                     (json_int_t)info->ttl_left_ms)
                                         : json_pack("{s:s, s:I}", "holder", info->holder,
                                                     "ttl_left_ms",
                                                     (json_int_t)info->ttl_left_ms)));
}

static void on_record(void *arg, idem_rc rc, idem_outcome o, idem_record *rec,
                      const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK) {
        api_answer(c, problem_from_rc(rc, detail, WHAT(c)));
        return;
    }
    if (o == IDEM_NOT_FOUND) {
        /* Only a GET reads a record that may not exist. */
        const struct names *n = c->own;
        api_answer(c, problem(404, "record_not_found", "no record %s in space %s", n->key,
                              n->space));
        return;
    }
    json_t *j = json_object();
    if (j)
        json_object_set_new(j, "record", api_record_json(rec));
    api_answer(c, api_outcome(o, j));
}

static void on_issued(void *arg, idem_rc rc, const char *token, const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK) {
        api_answer(c, problem_from_rc(rc, detail, WHAT(c)));
        return;
    }
    atomic_fetch_add(&c->d->tokens_issued, 1);
    api_answer(c, json_response(201, json_pack("{s:s, s:I}", "token", token, "expires_in_ms",
                                               (json_int_t)*(int64_t *)c->own)));
}

static void on_transition(void *arg, idem_rc rc, idem_outcome o, const char *current,
                          const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK) {
        api_answer(c, problem_from_rc(rc, detail, WHAT(c)));
        return;
    }
    /* A finished record may have left its answer behind (RELEASED, to run
     * again): no loop replays from what it kept before this. */
    if (o == IDEM_APPLIED)
        atomic_fetch_add(&c->d->replay_gen, 1);
    api_answer(c, api_outcome(o, o == IDEM_CONFLICT ? json_pack("{s:s}", "current", current)
                                                    : NULL));
}

/* An asynchronous call that did not start: the argument it refused (or no
 * memory), as the blocking call would have said. */
static void not_started(struct api_call *c, idem_rc rc)
{
    api_answer(c, problem_from_idem(rc, WHAT(c)));
}

/* ---- tokens ---- */

/* The subject of a token call: 0, or 1 with the call answered. */
static int subject_of(struct api_call *c)
{
    char why[300];
    if (request_subject(c->req->msg, c->cfg->subject_header, &c->subject, why, sizeof why)) {
        api_answer(c, problem(400, "subject_invalid", "%s", why));
        return 1;
    }
    if (!c->subject)
        c->subject = "";
    return 0;
}

/* A token issued on the main listener takes one from its subject's bucket
 * and one from its client address's (limits.token_rate_subject and
 * token_rate_peer, each a second's worth at most at once): a client that
 * varies its subject header still has one address, and what it can hold
 * at once is bounded by its rate times token_ttl_max. NULL, or the 429. */
static struct http_response *issue_rate_refusal(struct daemon *d, const struct server_config *cfg,
                                                const struct front_request *req)
{
    const char *subject = http_msg_header(req->msg, cfg->subject_header);
    int64_t now = mono_us(), wait;
    const char *by = "client address";
    double peer_rate = (double)cfg->limits.token_rate_peer;
    double subject_rate = (double)cfg->limits.token_rate_subject;
    wait = rate_take(d->issued_by_peer, req->peer, front_peer_host(req->peer), peer_rate,
                     peer_rate, now);
    if (wait == 0 && subject) {
        by = "subject";
        wait = rate_take(d->issued_by_subject, subject, strlen(subject), subject_rate,
                         subject_rate, now);
    }
    if (wait == 0)
        return NULL;
    atomic_fetch_add(&d->tokens_refused, 1);
    struct http_response *r =
        problem(429, "too_many_tokens",
                "tokens are issued here at most %zu a second per %s: retry in %lld ms",
                by[0] == 's' ? cfg->limits.token_rate_subject : cfg->limits.token_rate_peer, by,
                (long long)wait);
    char secs[24];
    snprintf(secs, sizeof secs, "%lld", (long long)(wait + 999) / 1000);
    if (r)
        response_add_header(r, "Retry-After", secs);
    return r;
}

/* A scene some route with the token layer uses: the only ones the main
 * listener issues tokens for. */
static int route_scene(const struct server_config *cfg, const char *scene)
{
    for (size_t i = 0; i < cfg->route_count; i++)
        if (cfg->routes[i].layer_token && strcmp(cfg->routes[i].token_scene, scene) == 0)
            return 1;
    return 0;
}

/* POST tokens, on either listener: the main listener's under its rate
 * limits, for the scenes of its routes, and up to its token_ttl_max. */
void api_tokens(struct api_call *c)
{
    const struct server_config *cfg = c->cfg;
    int admin = c->req->admin;
    struct http_response *refused = admin ? NULL : issue_rate_refusal(c->d, cfg, c->req);
    if (refused) {
        api_answer(c, refused);
        return;
    }
    if (subject_of(c))
        return;
    const char *scene = api_str(c, "scene", 1);
    /* Five minutes unless said, and no more than the main listener's
     * token_ttl_max there. */
    int64_t dflt = !admin && cfg->limits.token_ttl_max_ms < 300000 ? cfg->limits.token_ttl_max_ms
                                                                  : 300000;
    int64_t ttl = api_int(c, "ttl_ms", 0, dflt);
    if (!c->err && !admin && !route_scene(cfg, scene))
        c->err = problem(400, "invalid_field", "field scene: no route takes tokens of "
                         "scene %s (a route's token_scene, with layers: [token, ...])",
                         scene);
    if (!c->err && !admin && ttl > cfg->limits.token_ttl_max_ms)
        c->err = problem(400, "invalid_field", "field ttl_ms: at most %lld here "
                         "(limits.token_ttl_max)", (long long)cfg->limits.token_ttl_max_ms);
    if (!c->err && !(c->own = malloc(sizeof ttl)))
        c->err = problem(503, "out_of_memory", "no memory to issue a token");
    if (c->err) {
        api_answer(c, NULL);
        return;
    }
    *(int64_t *)c->own = ttl;
    idem_rc rc = idem_token_issue_async(c->d->h, c->loop, c->subject, scene, ttl, on_issued, c);
    if (rc != IDEM_OK)
        not_started(c, rc);
}

void api_tokens_consume(struct api_call *c)
{
    if (subject_of(c))
        return;
    const char *scene = api_str(c, "scene", 1), *token = api_str(c, "token", 1),
               *key = api_str(c, "key", 0);
    idem_rc rc = c->err ? IDEM_OK
                        : idem_token_consume_async(c->d->h, c->loop, c->subject, scene, token,
                                                   key, on_spent, c);
    if (c->err)
        api_answer(c, NULL);
    else if (rc != IDEM_OK)
        not_started(c, rc);
}

void api_tokens_give_back(struct api_call *c)
{
    if (subject_of(c))
        return;
    const char *scene = api_str(c, "scene", 1), *token = api_str(c, "token", 1),
               *key = api_str(c, "key", 0);
    idem_rc rc = c->err ? IDEM_OK
                        : idem_token_give_back_async(c->d->h, c->loop, c->subject, scene, token,
                                                     key, on_outcome, c);
    if (c->err)
        api_answer(c, NULL);
    else if (rc != IDEM_OK)
        not_started(c, rc);
}

/* ---- locks ---- */

void api_locks(struct api_call *c)
{
    const char *space = api_str(c, "space", 1), *key = api_str(c, "key", 1),
               *owner = api_str(c, "owner", 1);
    int64_t ttl = api_int(c, "ttl_ms", 0, 30000);
    if (c->err) {
        api_answer(c, NULL);
        return;
    }
    const char *op = c->rest + strlen("locks/");
    idem *h = c->d->h;
    idem_rc rc = strcmp(op, "acquire") == 0
                     ? idem_lock_acquire_async(h, c->loop, space, key, owner, ttl, on_lock, c)
                 : strcmp(op, "renew") == 0
                     ? idem_lock_renew_async(h, c->loop, space, key, owner, ttl, on_outcome, c)
                     : idem_lock_release_async(h, c->loop, space, key, owner, on_outcome, c);
    if (rc != IDEM_OK)
        not_started(c, rc);
}

/* ---- records ---- */

static int hex_fingerprint(struct api_call *a, uint8_t fp[IDEM_FINGERPRINT_LEN])
{
    const char *hex = api_str(a, "fingerprint", 0);
    if (!hex)
        return 0;
    if (strlen(hex) != 2 * IDEM_FINGERPRINT_LEN) {
        a->err = problem(400, "invalid_field", "field fingerprint: 64 hex digits (SHA-256)");
        return 0;
    }
    /* Digits only: not sscanf's "%2x", which takes a sign, spaces or 0x. */
    for (int i = 0; i < IDEM_FINGERPRINT_LEN; i++) {
        int hi = http_hex_value((unsigned char)hex[2 * i]);
        int lo = http_hex_value((unsigned char)hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            a->err = problem(400, "invalid_field", "field fingerprint: not hexadecimal");
            return 0;
        }
        fp[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

/* The result to store from "result" (text) or "result_base64". malloc'd. */
static unsigned char *get_result(struct api_call *a, size_t *len)
{
    *len = 0;
    json_t *t = json_object_get(a->body, "result");
    json_t *b = json_object_get(a->body, "result_base64");
    if (t && json_is_string(t)) {
        *len = json_string_length(t);
        unsigned char *copy = malloc(*len + 1);
        if (copy)
            memcpy(copy, json_string_value(t), *len);
        return copy;
    }
    if (b && json_is_string(b)) {
        size_t n = json_string_length(b);
        unsigned char *out = malloc(n / 4 * 3 + 3);
        long got = out ? base64_decode(json_string_value(b), n, out) : 0;
        if (got < 0) {
            free(out);
            a->err = problem(400, "invalid_field", "field result_base64: not base64");
            return NULL;
        }
        *len = (size_t)got;
        return out;
    }
    if ((t && !json_is_null(t)) || (b && !json_is_null(b)))
        a->err = problem(400, "invalid_field", "field result: must be a string");
    return NULL;
}

void api_records_begin(struct api_call *c)
{
    const char *space = api_str(c, "space", 1), *key = api_str(c, "key", 1),
               *owner = api_str(c, "owner", 1);
    int64_t lease = api_int(c, "lease_ms", 0, 30000);
    uint8_t fp[IDEM_FINGERPRINT_LEN];
    int has = hex_fingerprint(c, fp);
    if (c->err) {
        api_answer(c, NULL);
        return;
    }
    idem_rc rc = idem_record_begin_async(c->d->h, c->loop, space, key, has ? fp : NULL, owner,
                                         lease, on_record, c);
    if (rc != IDEM_OK)
        not_started(c, rc);
}

/* POST records/complete and records/fail. */
void api_records_finish(struct api_call *c)
{
    const char *space = api_str(c, "space", 1), *key = api_str(c, "key", 1);
    int64_t epoch = api_int(c, "epoch", 1, 0);
    int64_t retention = api_int(c, "retention_ms", 0, 0);
    json_t *retry = json_object_get(c->body, "retryable");
    size_t len = 0;
    unsigned char *result = c->err ? NULL : get_result(c, &len);
    if (!c->err && epoch <= 0)
        c->err = problem(400, "invalid_field", "field epoch: a claim's epoch (>= 1)");
    /* "true" or 1 taken as false would end the record for good. */
    if (!c->err && retry && !json_is_boolean(retry))
        c->err = problem(400, "invalid_field", "field retryable: true or false");
    if (c->err) {
        free(result);
        api_answer(c, NULL);
        return;
    }
    idem *h = c->d->h;
    idem_rc rc =
        strcmp(c->rest, "records/complete") == 0
            ? idem_record_complete_async(h, c->loop, space, key, (uint64_t)epoch, result, len,
                                         retention, on_outcome, c)
            : idem_record_fail_async(h, c->loop, space, key, (uint64_t)epoch,
                                     json_is_true(retry) ? IDEM_FAIL_RETRYABLE : IDEM_FAIL_FINAL,
                                     result, len, retention, on_outcome, c);
    free(result); /* copied by the call */
    if (rc != IDEM_OK)
        not_started(c, rc);
}

void api_records_transition(struct api_call *c)
{
    const char *space = api_str(c, "space", 1), *key = api_str(c, "key", 1),
               *from = api_str(c, "from", 1), *to = api_str(c, "to", 1);
    if (c->err) {
        api_answer(c, NULL);
        return;
    }
    idem_rc rc = idem_record_transition_async(c->d->h, c->loop, space, key, from, to,
                                              on_transition, c);
    if (rc != IDEM_OK)
        not_started(c, rc);
}

/* The key of GET records/{space}/?key=KEY: for a key no path can carry
 * ("." and "..", which clients resolve away, "%2E" included). 0, or -1. */
static int key_param(const char *target, char *out, size_t cap)
{
    const char *q = strchr(target, '?');
    for (const char *p = q; p; p = strchr(p + 1, '&'))
        if (strncmp(p + 1, "key=", 4) == 0)
            return request_pct_decode(p + 5, strcspn(p + 5, "&#"), out, cap, 1) || !*out ? -1
                                                                                         : 0;
    return -1;
}

/* GET records/{space}/{key}, each percent-encoded, or records/{space}/?key=KEY. */
void api_records_get(struct api_call *c)
{
    const char *rest = c->rest + strlen("records/");
    const char *slash = strchr(rest, '/');
    struct names *n = malloc(sizeof *n);
    if (!n) {
        api_answer(c, NULL);
        return;
    }
    c->own = n;
    if (!slash ||
        request_pct_decode(rest, (size_t)(slash - rest), n->space, sizeof n->space, 0) ||
        (slash[1] ? request_pct_decode(slash + 1, strlen(slash + 1), n->key, sizeof n->key, 0)
                  : key_param(c->req->msg->target, n->key, sizeof n->key))) {
        api_answer(c, problem(400, "invalid_path",
                              "expected /_idem/v1/records/{space}/{key}, each percent-encoded"));
        return;
    }
    idem_rc rc = idem_record_get_async(c->d->h, c->loop, n->space, n->key, on_record, c);
    if (rc != IDEM_OK)
        not_started(c, rc);
}
