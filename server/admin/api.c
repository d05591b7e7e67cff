/*
 * api.c — the JSON API under /_idem/v1/: every libidem primitive over HTTP,
 * for services that want the layers without the gateway (daemon).
 *
 * Business outcomes are 200 with {"outcome": "..."}; a malformed body is 400
 * problem+json naming the field; store trouble is 503. docs/http-api.md is
 * the normative reference.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "admin/console.h"
#include "consume/consume.h"
#include "daemon.h"
#include "gateway/gateway.h"
#include "admin/metrics.h"
#include "mono.h"
#include "admin/records_admin.h"
#include "gateway/request_key.h"

#define PREFIX "/_idem/v1"

static struct http_response *outcome(idem_outcome o, json_t *extra)
{
    json_t *j = extra ? extra : json_object();
    if (j)
        json_object_set_new(j, "outcome", json_string(idem_outcome_name(o)));
    return json_response(200, j);
}

/* Field accessors: each returns 0, or 1 with *err set to a 400 problem. */
struct args {
    json_t *body;
    struct http_response *err;
};

static const char *str_field(struct args *a, const char *name, int required)
{
    json_t *v = json_object_get(a->body, name);
    if (!v || json_is_null(v)) {
        if (required && !a->err)
            a->err = problem(400, "invalid_field", "field %s: required (a string)", name);
        return NULL;
    }
    if (!json_is_string(v)) {
        if (!a->err)
            a->err = problem(400, "invalid_field", "field %s: must be a string", name);
        return NULL;
    }
    return json_string_value(v);
}

static int64_t int_field(struct args *a, const char *name, int required, int64_t dflt)
{
    json_t *v = json_object_get(a->body, name);
    if (!v || json_is_null(v)) {
        if (required && !a->err)
            a->err = problem(400, "invalid_field", "field %s: required (an integer)", name);
        return dflt;
    }
    if (!json_is_integer(v)) {
        if (!a->err)
            a->err = problem(400, "invalid_field", "field %s: must be an integer", name);
        return dflt;
    }
    return json_integer_value(v);
}

static int hex_fingerprint(struct args *a, uint8_t fp[IDEM_FINGERPRINT_LEN])
{
    const char *hex = str_field(a, "fingerprint", 0);
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

/* A stored result as JSON: "result" when it is UTF-8 text without NULs,
 * else "result_base64". */
static void put_result(json_t *j, const void *data, size_t len)
{
    if (!data)
        return;
    json_t *s = memchr(data, 0, len) ? NULL : json_stringn(data, len);
    if (s) {
        json_object_set_new(j, "result", s);
        return;
    }
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return;
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < len ? p[i + 2] : 0);
        *o++ = b64[v >> 18 & 63];
        *o++ = b64[v >> 12 & 63];
        *o++ = i + 1 < len ? b64[v >> 6 & 63] : '=';
        *o++ = i + 2 < len ? b64[v & 63] : '=';
    }
    *o = '\0';
    json_object_set_new(j, "result_base64", json_string(out));
    free(out);
}

/* The result to store from "result" (text) or "result_base64". malloc'd. */
static unsigned char *get_result(struct args *a, size_t *len)
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
        const char *s = json_string_value(b);
        size_t n = json_string_length(b), pad = 0;
        /* RFC 4648 base64: at most two '=', at the end, and only where they
         * complete the last group of four; without them, no group of one. */
        while (pad < n && pad < 3 && s[n - 1 - pad] == '=')
            pad++;
        if (pad > 2 || (pad && n % 4) || (!pad && n % 4 == 1)) {
            a->err = problem(400, "invalid_field", "field result_base64: not base64");
            return NULL;
        }
        n -= pad;
        unsigned char *out = malloc(n / 4 * 3 + 3);
        unsigned acc = 0;
        int bits = 0;
        for (size_t i = 0; out && i < n; i++) {
            const char *pos = strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                     "0123456789+/",
                                     s[i]);
            if (!pos || !s[i]) {
                free(out);
                a->err = problem(400, "invalid_field", "field result_base64: not base64");
                return NULL;
            }
            acc = acc << 6 | (unsigned)(pos - "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                              "0123456789+/");
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                out[(*len)++] = (unsigned char)(acc >> bits);
            }
        }
        return out;
    }
    if ((t && !json_is_null(t)) || (b && !json_is_null(b)))
        a->err = problem(400, "invalid_field", "field result: must be a string");
    return NULL;
}

static json_t *record_json(const idem_record *r)
{
    json_t *j = json_pack("{s:s, s:I, s:s, s:I, s:I, s:I}", "state", r->state, "epoch",
                          (json_int_t)r->epoch, "owner", r->owner, "lease_until_ms",
                          (json_int_t)r->lease_until_ms, "created_ms", (json_int_t)r->created_ms,
                          "updated_ms", (json_int_t)r->updated_ms);
    if (j && r->expires_ms)
        json_object_set_new(j, "expires_ms", json_integer(r->expires_ms));
    if (j)
        put_result(j, r->result, r->result_len);
    return j;
}

#define TOTAL(d, field) ((json_int_t)counts_total(&d->counts, offsetof(struct route_counts, field)))

static struct http_response *health(struct daemon *d, int admin);

/* The main listener's health, which anyone there may ask as often as they
 * like: the store is looked at once a second at most, by one request; the
 * others meanwhile get the last look's answer (or, before the first look,
 * look themselves). A load balancer polling, or a client flooding, costs
 * no store call and no worker's wait, even while the store is slow. */
static struct http_response *cached_health(const struct daemon_health *c)
{
    struct http_response *r = response_new(c->status);
    if (r && (response_add_header(r, "Content-Type", "application/json") ||
              response_set_body(r, c->body, c->body_len))) {
        response_free(r);
        r = NULL;
    }
    return r;
}

static struct http_response *public_health(struct daemon *d)
{
    struct daemon_health *c = &d->public_health;
    struct http_response *r;
    pthread_mutex_lock(&c->mu);
    int64_t now = mono_ms();
    if (c->at_ms && (now - c->at_ms < 1000 || c->looking)) {
        r = cached_health(c);
        pthread_mutex_unlock(&c->mu);
        return r;
    }
    int mine = !c->looking;
    c->looking = 1;
    pthread_mutex_unlock(&c->mu);
    r = health(d, 0);
    pthread_mutex_lock(&c->mu);
    if (mine) {
        c->looking = 0;
        if (r && r->body_len < sizeof c->body) {
            c->status = r->status;
            memcpy(c->body, r->body, r->body_len);
            c->body_len = r->body_len;
            c->at_ms = mono_ms();
        }
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

/* GET /_idem/v1/health/live: the process answers. */
static struct http_response *live(void)
{
    return json_response(200, json_pack("{s:s}", "status", "ok"));
}

/* GET /_idem/v1/health (and health/ready): whether requests can be served.
 * On the main listener only the verdicts; the counters are the admin's. */
static struct http_response *health(struct daemon *d, int admin)
{
    idem_stats st;
    idem_outcome o;
    /* Touch both halves of the store: a health check that cannot reach one
     * says so. Records down: 503, nothing can be served. Tokens and locks
     * down (Redis): "degraded", routes follow their on_redis_down. */
    idem_rc rc = idem_record_get(d->h, "idem.health", "probe", &o, NULL);
    idem_rc kv = idem_lock_release(d->h, "idem.health", "probe", "probe", &o);
    /* Reads can work while writes fail (a full disk, a store gone
     * read-only): after the gateway saw a write fail, a write of our own
     * says whether they work again. Not before: it costs a commit. */
    idem_rc wr = IDEM_OK;
    char writes[300] = "ok";
    if (rc == IDEM_OK && atomic_load(&d->writes_failing)) {
        idem_record rec;
        wr = idem_record_begin(d->h, "idem.health", "write-probe", NULL, d->instance, 1000, &o,
                               &rec);
        if (wr == IDEM_OK) {
            uint64_t epoch = rec.epoch;
            idem_record_clear(&rec);
            /* IN_PROGRESS: another probe wrote it within the second. */
            if (o == IDEM_NEW || o == IDEM_TAKEN_OVER)
                wr = idem_record_fail(d->h, "idem.health", "write-probe", epoch,
                                      IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o);
        }
        if (wr == IDEM_OK) {
            daemon_write_ok(d);
        } else {
            snprintf(writes, sizeof writes, "%s: %s", idem_strerror(wr), idem_errdetail());
            daemon_write_failed(d, wr);
        }
    }
    size_t down = 0, nk = consumers_count(d->consumers);
    json_t *consumers = json_object();
    for (size_t k = 0; k < nk; k++) {
        int up = atomic_load(&consumers_counters(d->consumers, k)->connected);
        down += !up;
        json_object_set_new(consumers, consumers_name(d->consumers, k),
                            json_string(up ? "connected" : "disconnected"));
    }
    /* A consumer without its broker takes nothing: degraded, as Redis
     * down is; the gateway still serves. */
    const char *status = rc != IDEM_OK || wr != IDEM_OK ? "store_unavailable"
                         : kv != IDEM_OK || down        ? "degraded"
                                                        : "ok";
    int code = rc == IDEM_OK && wr == IDEM_OK ? 200 : 503;
    if (!admin) {
        json_decref(consumers);
        return json_response(code, json_pack("{s:s, s:s, s:s}", "status", status, "records",
                                             rc == IDEM_OK && wr == IDEM_OK ? "ok"
                                                                            : "unavailable",
                                             "tokens_and_locks",
                                             kv == IDEM_OK ? "ok" : "unavailable"));
    }
    idem_get_stats(d->h, &st);
    idem_commit_times ct;
    idem_get_commit_times(d->h, &ct);
    json_t *j = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I}, "
        "s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}}",
        "status", status,
        "records", rc == IDEM_OK ? "ok" : idem_errname(rc), "record_writes", writes,
        "tokens_and_locks", kv == IDEM_OK ? "ok" : idem_errname(kv),
        "store", idem_store_name(d->h),
        "version", idem_version(), "store_stats", "conflicts", (json_int_t)st.conflicts,
        "takeovers", (json_int_t)st.takeovers, "commits", (json_int_t)st.commits,
        "committed_ops", (json_int_t)st.committed_ops, "commit_us", (json_int_t)ct.us,
        "gateway", "requests",
        TOTAL(d, requests), "executions", TOTAL(d, executions), "replays", TOTAL(d, replays),
        "in_flight_409", TOTAL(d, in_flight_409), "mismatches", TOTAL(d, mismatches),
        "store_errors", TOTAL(d, store_errors), "upstream_unknown", TOTAL(d, upstream_unknown),
        "passthrough", (json_int_t)atomic_load(&d->passthrough), "redis_down_skips",
        TOTAL(d, redis_down_skips), "answers_not_kept", (json_int_t)gateway_unkept(d->gateway));
    if (j)
        json_object_set_new(j, "consumers", consumers);
    else
        json_decref(consumers);
    return json_response(code, j);
}

/* GET /_idem/v1/records/{space}/{key} */
static struct http_response *get_record(struct daemon *d, const char *rest)
{
    const char *slash = strchr(rest, '/');
    char space[IDEM_NAME_MAX * 3 + 1], key[IDEM_KEY_MAX * 3 + 1];
    if (!slash || request_pct_decode(rest, (size_t)(slash - rest), space, sizeof space, 0) ||
        request_pct_decode(slash + 1, strlen(slash + 1), key, sizeof key, 0))
        return problem(400, "invalid_path",
                       "expected /_idem/v1/records/{space}/{key}, each percent-encoded");
    idem_record rec;
    struct http_response *missing = api_record_get(d, space, key, &rec);
    if (missing)
        return missing;
    json_t *j = json_object();
    json_object_set_new(j, "record", record_json(&rec));
    idem_record_clear(&rec);
    return outcome(IDEM_FOUND, j);
}

struct http_response *api_record_get(struct daemon *d, const char *space, const char *key,
                                     idem_record *rec)
{
    idem_outcome o;
    idem_rc rc = idem_record_get(d->h, space, key, &o, rec);
    if (rc != IDEM_OK)
        return problem_from_idem(rc, "reading the record");
    if (o == IDEM_NOT_FOUND)
        return problem(404, "record_not_found", "no record %s in space %s", key, space);
    return NULL;
}

/* The fields each POST endpoint takes. Any other is refused, as the
 * configuration file refuses unknown fields: a misspelt "retention" or
 * "retriable" would otherwise leave its default in force unnoticed. */
#define FIELDS_MAX 7
static const struct {
    const char *op;
    const char *fields[FIELDS_MAX]; /* the unused ones NULL */
} endpoint_fields[] = {
    {"tokens", {"scene", "ttl_ms"}},
    {"tokens/consume", {"scene", "token", "key"}},
    {"tokens/give_back", {"scene", "token", "key"}},
    {"locks/acquire", {"space", "key", "owner", "ttl_ms"}},
    {"locks/renew", {"space", "key", "owner", "ttl_ms"}},
    {"locks/release", {"space", "key", "owner"}},
    {"records/begin", {"space", "key", "owner", "lease_ms", "fingerprint"}},
    {"records/complete", {"space", "key", "epoch", "result", "result_base64", "retention_ms"}},
    {"records/fail",
     {"space", "key", "epoch", "result", "result_base64", "retention_ms", "retryable"}},
    {"records/transition", {"space", "key", "from", "to"}},
};

/* NULL, or the 400 naming the first field op does not take. */
static struct http_response *unknown_field(const char *op, json_t *body)
{
    for (size_t i = 0; i < sizeof endpoint_fields / sizeof endpoint_fields[0]; i++) {
        if (strcmp(op, endpoint_fields[i].op) != 0)
            continue;
        const char *const *known = endpoint_fields[i].fields;
        const char *name;
        json_t *v;
        json_object_foreach(body, name, v) {
            size_t k = 0;
            while (k < FIELDS_MAX && known[k] && strcmp(known[k], name) != 0)
                k++;
            if (k < FIELDS_MAX && known[k])
                continue;
            char list[160] = "";
            for (k = 0; k < FIELDS_MAX && known[k]; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         k ? ", " : "", known[k]);
            return problem(400, "invalid_field", "field %.64s: %s takes no such field (it takes %s)",
                           name, op, list);
        }
    }
    return NULL;
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

static struct http_response *post(struct daemon *d, const struct server_config *cfg,
                                  const char *op, const struct http_msg *m, int admin)
{
    json_error_t jerr;
    struct args a = {.body = json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, &jerr)};
    struct http_response *r = NULL;
    idem_outcome o = IDEM_NONE;
    idem_rc rc = IDEM_OK;
    if (!a.body || !json_is_object(a.body)) {
        json_decref(a.body);
        return problem(400, "invalid_json", "the body must be a JSON object%s%s",
                       a.body ? "" : ": ", a.body ? "" : jerr.text);
    }
    if ((r = unknown_field(op, a.body)) != NULL) {
        json_decref(a.body);
        return r;
    }
    const char *subject;
    char why[300];
    if (request_subject(m, cfg->subject_header, &subject, why, sizeof why)) {
        json_decref(a.body);
        return problem(400, "subject_invalid", "%s", why);
    }
    if (!subject)
        subject = "";

    if (strcmp(op, "tokens") == 0) {
        const char *scene = str_field(&a, "scene", 1);
        /* Five minutes unless said, and no more than the main listener's
         * token_ttl_max there. */
        int64_t dflt = !admin && cfg->limits.token_ttl_max_ms < 300000
                           ? cfg->limits.token_ttl_max_ms
                           : 300000;
        int64_t ttl = int_field(&a, "ttl_ms", 0, dflt);
        char token[IDEM_TOKEN_LEN + 1];
        if (!a.err && !admin && !route_scene(cfg, scene))
            a.err = problem(400, "invalid_field", "field scene: no route takes tokens of "
                            "scene %s (a route's token_scene, with layers: [token, ...])",
                            scene);
        if (!a.err && !admin && ttl > cfg->limits.token_ttl_max_ms)
            a.err = problem(400, "invalid_field", "field ttl_ms: at most %lld here "
                            "(limits.token_ttl_max)", (long long)cfg->limits.token_ttl_max_ms);
        if (!a.err && (rc = idem_token_issue(d->h, subject, scene, ttl, token)) == IDEM_OK)
            r = json_response(201, json_pack("{s:s, s:I}", "token", token, "expires_in_ms",
                                             (json_int_t)ttl));
    } else if (strcmp(op, "tokens/consume") == 0) {
        const char *scene = str_field(&a, "scene", 1), *token = str_field(&a, "token", 1),
                   *key = str_field(&a, "key", 0);
        char spent[IDEM_KEY_MAX + 1];
        if (!a.err && (rc = idem_token_consume(d->h, subject, scene, token, key, &o, spent)) ==
                          IDEM_OK)
            r = outcome(o, o == IDEM_ALREADY_CONSUMED ? json_pack("{s:s}", "spent_key", spent)
                                                      : NULL);
    } else if (strcmp(op, "tokens/give_back") == 0) {
        const char *scene = str_field(&a, "scene", 1), *token = str_field(&a, "token", 1),
                   *key = str_field(&a, "key", 0);
        if (!a.err && (rc = idem_token_give_back(d->h, subject, scene, token, key, &o)) == IDEM_OK)
            r = outcome(o, NULL);
    } else if (strncmp(op, "locks/", 6) == 0) {
        const char *space = str_field(&a, "space", 1), *key = str_field(&a, "key", 1),
                   *owner = str_field(&a, "owner", 1);
        int64_t ttl = int_field(&a, "ttl_ms", 0, 30000);
        if (a.err) {
        } else if (strcmp(op + 6, "acquire") == 0) {
            idem_lock_info info;
            if ((rc = idem_lock_acquire(d->h, space, key, owner, ttl, &o, &info)) == IDEM_OK)
                r = outcome(o, o == IDEM_ACQUIRED
                                   ? json_pack("{s:I, s:I}", "fence", (json_int_t)info.fence,
                                               "ttl_left_ms", (json_int_t)info.ttl_left_ms)
                                   : json_pack("{s:s, s:I}", "holder", info.holder,
                                               "ttl_left_ms", (json_int_t)info.ttl_left_ms));
        } else if (strcmp(op + 6, "renew") == 0) {
            if ((rc = idem_lock_renew(d->h, space, key, owner, ttl, &o)) == IDEM_OK)
                r = outcome(o, NULL);
        } else if (strcmp(op + 6, "release") == 0) {
            if ((rc = idem_lock_release(d->h, space, key, owner, &o)) == IDEM_OK)
                r = outcome(o, NULL);
        } else {
            r = problem(404, "no_such_endpoint", "POST %s/%s is not an endpoint", PREFIX, op);
        }
    } else if (strncmp(op, "records/", 8) == 0) {
        const char *space = str_field(&a, "space", 1), *key = str_field(&a, "key", 1);
        const char *what = op + 8;
        if (a.err) {
        } else if (strcmp(what, "begin") == 0) {
            const char *owner = str_field(&a, "owner", 1);
            int64_t lease = int_field(&a, "lease_ms", 0, 30000);
            uint8_t fp[IDEM_FINGERPRINT_LEN];
            int has = hex_fingerprint(&a, fp);
            idem_record rec;
            if (!a.err && (rc = idem_record_begin(d->h, space, key, has ? fp : NULL, owner, lease,
                                                  &o, &rec)) == IDEM_OK) {
                json_t *j = json_object();
                json_object_set_new(j, "record", record_json(&rec));
                idem_record_clear(&rec);
                r = outcome(o, j);
            }
        } else if (strcmp(what, "complete") == 0 || strcmp(what, "fail") == 0) {
            int64_t epoch = int_field(&a, "epoch", 1, 0);
            int64_t retention = int_field(&a, "retention_ms", 0, 0);
            json_t *retry = json_object_get(a.body, "retryable");
            size_t len = 0;
            unsigned char *result = a.err ? NULL : get_result(&a, &len);
            if (!a.err && epoch <= 0)
                a.err = problem(400, "invalid_field", "field epoch: a claim's epoch (>= 1)");
            /* "true" or 1 taken as false would end the record for good. */
            if (!a.err && retry && !json_is_boolean(retry))
                a.err = problem(400, "invalid_field", "field retryable: true or false");
            if (!a.err) {
                rc = strcmp(what, "complete") == 0
                         ? idem_record_complete(d->h, space, key, (uint64_t)epoch, result, len,
                                                retention, &o)
                         : idem_record_fail(d->h, space, key, (uint64_t)epoch,
                                            json_is_true(retry) ? IDEM_FAIL_RETRYABLE
                                                                : IDEM_FAIL_FINAL,
                                            result, len, retention, &o);
                if (rc == IDEM_OK)
                    r = outcome(o, NULL);
            }
            free(result);
        } else if (strcmp(what, "transition") == 0) {
            const char *from = str_field(&a, "from", 1), *to = str_field(&a, "to", 1);
            char current[IDEM_NAME_MAX + 1];
            if (!a.err && (rc = idem_record_transition(d->h, space, key, from, to, &o,
                                                       current)) == IDEM_OK)
                r = outcome(o, o == IDEM_CONFLICT ? json_pack("{s:s}", "current", current)
                                                  : NULL);
            /* A finished record may have left its answer behind (RELEASED, to
             * run again): no loop replays from what it kept before this. */
            if (!a.err && rc == IDEM_OK && o == IDEM_APPLIED)
                atomic_fetch_add(&d->replay_gen, 1);
        } else {
            r = problem(404, "no_such_endpoint", "POST %s/%s is not an endpoint", PREFIX, op);
        }
    } else {
        r = problem(404, "no_such_endpoint", "POST %s/%s is not an endpoint", PREFIX, op);
    }
    json_decref(a.body);
    if (a.err) {
        response_free(r);
        return a.err;
    }
    if (rc != IDEM_OK)
        return problem_from_idem(rc, op);
    return r;
}

int api_public_endpoint(const char *rest)
{
    return strcmp(rest, "tokens") == 0 || strcmp(rest, "health") == 0 ||
           strcmp(rest, "health/live") == 0 || strcmp(rest, "health/ready") == 0;
}

/* The endpoints taking POST, under PREFIX/: those with fields. */
static int is_post_endpoint(const char *rest)
{
    for (size_t i = 0; i < sizeof endpoint_fields / sizeof endpoint_fields[0]; i++)
        if (strcmp(rest, endpoint_fields[i].op) == 0)
            return 1;
    return 0;
}

void api_handle(struct daemon *d, const struct server_config *cfg, struct front_request *req)
{
    const struct http_msg *m = req->msg;
    char path[8192];
    request_path(m->target, path, sizeof path);
    const char *rest = path + strlen(PREFIX);
    if (*rest == '/')
        rest++;
    if (req->admin && records_admin_handle(d, cfg, req, rest))
        return;
    if (req->admin && console_api_handle(cfg, req, rest))
        return;
    int health_ep = strcmp(rest, "health") == 0 || strcmp(rest, "health/ready") == 0;
    int post_ep = is_post_endpoint(rest) && (req->admin || strcmp(rest, "tokens") == 0);
    int get_ep = !post_ep && (health_ep || strcmp(rest, "health/live") == 0 ||
                              (req->admin && (strcmp(rest, "metrics") == 0 ||
                                              (strncmp(rest, "records/", 8) == 0 &&
                                               strchr(rest + 8, '/')))));
    int get = strcmp(m->method, "GET") == 0 || strcmp(m->method, "HEAD") == 0;
    if (!post_ep && !get_ep) {
        req->resp = problem(404, "no_such_endpoint", "%s %s is not an endpoint", m->method, path);
    } else if (post_ep ? strcmp(m->method, "POST") != 0 : !get) {
        const char *allow = post_ep ? "POST" : "GET, HEAD";
        req->resp = problem(405, "method_not_allowed", "%s %s: this endpoint takes %s",
                            m->method, path, allow);
        if (req->resp)
            response_add_header(req->resp, "Allow", allow);
    } else if (post_ep) {
        req->resp = post(d, cfg, rest, m, req->admin);
    } else {
        req->resp = health_ep && !req->admin           ? public_health(d)
                    : health_ep                        ? health(d, 1)
                    : strcmp(rest, "health/live") == 0 ? live()
                    : strcmp(rest, "metrics") == 0     ? metrics_render(d)
                                                       : get_record(d, rest + 8);
    }
}
