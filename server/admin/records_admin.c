/*
 * records_admin.c — records an operator can find and act on (daemon), on
 * the admin listener under /_idem/v1/:
 *
 *   GET  records?space=...        a page of a space's records (idem_record_list)
 *   GET  records/held?space=...   the claims on_unknown_outcome: hold keeps
 *   GET  events                   the last conflicts, takeovers and holds here
 *   POST records/release          a claim at its epoch -> RELEASED: a retry executes
 *   POST records/mark_failed      a claim at its epoch -> FAILED, a problem replayed
 *   POST records/delete           a finished record at its epoch: its key executes again
 *
 * The admin door (admin.c) lets only write keys POST; each action is logged
 * here with the key's name, the peer, the record and what came of it.
 * Every action is guarded by the epoch the operator saw: a claim that moved
 * on since (finished, taken over, re-claimed) is never touched, and the
 * answer is 409 with the record as it stands. docs/http-api.md is the
 * reference.
 *
 * A held claim is PROCESSING with a lease longer than its route's: the
 * gateway extends it by hold_ms (gateway.c, FINISH_HOLD), never less than
 * the lease, and a claim in flight is only ever renewed to the lease. So a
 * space's held claims are its PROCESSING records whose lease_until -
 * updated_ms is over the longest lease of the routes on that space.
 */
#include "admin/records_admin.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "admin/admin.h"
#include "log.h"
#include "gateway/request_key.h"
#include "gateway/stored.h"
#include "telemetry/incidents.h"

#define QUERY_VALUE_MAX 1200 /* a cursor, percent-encoded at worst */
#define REASON_MAX 1000
#define AGE_MAX_MS (3650 * 24 * 3600 * 1000LL)

/* ---- query strings ---- */

/* The parameters an endpoint takes, decoded from the target's query. Any
 * other is refused, as a misspelt one would otherwise go unnoticed. */
#define PARAMS_MAX 8
struct query {
    const char *names[PARAMS_MAX]; /* the endpoint's, NULL-ended */
    char values[PARAMS_MAX][QUERY_VALUE_MAX];
    int given[PARAMS_MAX];
};

/* 0, or the 400 naming what is wrong. */
static struct http_response *parse_query(struct query *q, const char *target)
{
    const char *s = strchr(target, '?');
    if (!s)
        return NULL;
    s++;
    while (*s && *s != '#') {
        size_t n = strcspn(s, "&#");
        const char *eq = memchr(s, '=', n);
        size_t name_len = eq ? (size_t)(eq - s) : n;
        char name[64];
        if (n == 0) {
            s++;
            continue;
        }
        if (request_pct_decode(s, name_len, name, sizeof name, 1) != 0)
            return problem(400, "invalid_parameter", "a query parameter's name is not one "
                           "this endpoint takes");
        int i = 0;
        while (i < PARAMS_MAX && q->names[i] && strcmp(q->names[i], name) != 0)
            i++;
        if (i == PARAMS_MAX || !q->names[i]) {
            char list[200] = "";
            for (int k = 0; k < PARAMS_MAX && q->names[k]; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "",
                         q->names[k]);
            return problem(400, "invalid_parameter",
                           "parameter %s: no such parameter here (this endpoint takes %s)", name,
                           list);
        }
        if (q->given[i])
            return problem(400, "invalid_parameter", "parameter %s: given twice", name);
        const char *v = eq ? eq + 1 : s + n;
        if (request_pct_decode(v, (size_t)(s + n - v), q->values[i], sizeof q->values[i], 1))
            return problem(400, "invalid_parameter",
                           "parameter %s: not percent-encoded text of at most %d bytes", name,
                           QUERY_VALUE_MAX - 1);
        q->given[i] = 1;
        s += n;
        if (*s == '&')
            s++;
    }
    return NULL;
}

/* The value of parameter name, NULL when not given or empty. */
static const char *param(const struct query *q, const char *name)
{
    for (int i = 0; i < PARAMS_MAX && q->names[i]; i++)
        if (strcmp(q->names[i], name) == 0)
            return q->given[i] && q->values[i][0] ? q->values[i] : NULL;
    return NULL;
}

/* An integer parameter in min..max, or dflt when absent: 0, or the 400. */
static struct http_response *int_param(const struct query *q, const char *name, int64_t min,
                                       int64_t max, int64_t dflt, int64_t *out)
{
    const char *v = param(q, name);
    *out = dflt;
    if (!v)
        return NULL;
    int64_t n = 0;
    size_t i = 0;
    for (; v[i] >= '0' && v[i] <= '9' && i < 18; i++)
        n = n * 10 + (v[i] - '0');
    if (i == 0 || v[i] || n < min || n > max)
        return problem(400, "invalid_parameter",
                       "parameter %s: an integer from %" PRId64 " to %" PRId64, name, min, max);
    *out = n;
    return NULL;
}

/* ---- listing ---- */

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The longest lease of cfg's routes on space, and whether one of them
 * holds unknown outcomes. 0 when no route keeps records there. */
static int64_t space_lease(const struct server_config *cfg, const char *space, int *holds)
{
    int64_t lease = 0;
    *holds = 0;
    for (size_t i = 0; i < cfg->route_count; i++) {
        const struct route *rt = &cfg->routes[i];
        if (strcmp(rt->space, space) != 0)
            continue;
        if (rt->lease_ms > lease)
            lease = rt->lease_ms;
        *holds |= rt->unknown_hold;
    }
    return lease;
}

/* The status of a stored answer from its first bytes ("IDEM1 201 ..."), 0
 * when it is not one the gateway stored. */
static int stored_status(const idem_record_item *it)
{
    if (it->result_head_len < 10 || memcmp(it->result_head, "IDEM1 ", 6) != 0)
        return 0;
    const unsigned char *p = it->result_head + 6;
    if (p[0] < '1' || p[0] > '5' || p[1] < '0' || p[1] > '9' || p[2] < '0' || p[2] > '9' ||
        p[3] != ' ')
        return 0;
    return (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
}

static json_t *item_json(const char *space, const idem_record_item *it, int64_t now,
                         int64_t lease, int holds)
{
    int processing = strcmp(it->state, IDEM_STATE_PROCESSING) == 0;
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:s, s:I, s:I, s:I}", "space", space, "key",
                          it->key, "state", it->state, "epoch", (json_int_t)it->epoch, "owner",
                          it->owner, "created_ms", (json_int_t)it->created_ms, "updated_ms",
                          (json_int_t)it->updated_ms, "result_bytes",
                          (json_int_t)it->result_len);
    if (!j)
        return NULL;
    if (processing) {
        int64_t left = it->lease_until_ms - now;
        json_object_set_new(j, "lease_until_ms", json_integer(it->lease_until_ms));
        json_object_set_new(j, "lease_left_ms", json_integer(left > 0 ? left : 0));
        json_object_set_new(j, "held", json_boolean(holds && lease > 0 &&
                                                    it->lease_until_ms - it->updated_ms > lease));
    }
    if (it->expires_ms)
        json_object_set_new(j, "expires_ms", json_integer(it->expires_ms));
    int status = stored_status(it);
    if (status)
        json_object_set_new(j, "status", json_integer(status));
    return j;
}

/* The state as the store keeps it: the built-in ones in any case. */
static const char *state_name(const char *s)
{
    static const char *const builtin[] = {IDEM_STATE_PROCESSING, IDEM_STATE_SUCCEEDED,
                                          IDEM_STATE_FAILED, IDEM_STATE_RELEASED};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (strcasecmp(s, builtin[i]) == 0)
            return builtin[i];
    return s;
}

/* GET records and records/held. */
static struct http_response *list(struct daemon *d, const struct server_config *cfg,
                                  const char *target, int held)
{
    struct query q = {.names = {"space", "prefix", "state", "older_than_ms", "newer_than_ms",
                                "limit", "cursor"}};
    if (held)
        q.names[1] = "limit", q.names[2] = "cursor", q.names[3] = NULL;
    struct http_response *r = parse_query(&q, target);
    if (r)
        return r;
    const char *space = param(&q, "space");
    if (!space)
        return problem(400, "invalid_parameter",
                       "parameter space: required (records are listed one key space at a time)");
    int64_t older = 0, newer = 0, limit = 0;
    if ((r = int_param(&q, "older_than_ms", 1, AGE_MAX_MS, 0, &older)) ||
        (r = int_param(&q, "newer_than_ms", 1, AGE_MAX_MS, 0, &newer)) ||
        (r = int_param(&q, "limit", 1, IDEM_LIST_LIMIT_MAX, IDEM_LIST_LIMIT_DEFAULT, &limit)))
        return r;
    int holds;
    int64_t lease = space_lease(cfg, space, &holds);
    if (held && !holds)
        return problem(400, "invalid_parameter",
                       "parameter space: no route on space %s has on_unknown_outcome: hold, "
                       "so none of its claims is held",
                       space);
    int64_t now = wall_ms();
    idem_record_query rq = {
        .space = space,
        .key_prefix = param(&q, "prefix"),
        .state = held ? IDEM_STATE_PROCESSING : param(&q, "state") ? state_name(param(&q, "state"))
                                                                   : NULL,
        .created_before_ms = older ? now - older : 0,
        .created_after_ms = newer ? now - newer : 0,
        .min_lease_span_ms = held ? lease : 0,
        .limit = (unsigned)limit,
        .cursor = param(&q, "cursor"),
    };
    idem_record_page page;
    idem_rc rc = idem_record_list(d->h, &rq, &page);
    if (rc == IDEM_EINVAL) {
        /* The detail names the field, as the library calls it. */
        const char *detail = idem_errdetail();
        const char *name = strncmp(detail, "key_prefix", 10) == 0 ? "prefix"
                           : strncmp(detail, "cursor", 6) == 0    ? "cursor"
                           : strncmp(detail, "state", 5) == 0     ? "state"
                                                                  : NULL;
        /* "cursor: not one ..." said as the parameter's name, once. */
        const char *colon = strstr(detail, ": ");
        return problem(400, "invalid_parameter", "parameter %s: %s", name ? name : "space",
                       colon ? colon + 2 : detail);
    }
    if (rc != IDEM_OK)
        return problem_from_idem(rc, "listing records");
    json_t *items = json_array();
    for (size_t i = 0; i < page.count; i++)
        json_array_append_new(items, item_json(space, &page.items[i], now, lease, holds));
    json_t *j = json_pack("{s:o, s:o}", "records", items, "next_cursor",
                          page.next_cursor[0] ? json_string(page.next_cursor) : json_null());
    idem_record_page_clear(&page);
    return json_response(200, j);
}

/* GET events?limit=: newest first. */
static struct http_response *events(const char *target)
{
    struct query q = {.names = {"limit"}};
    struct http_response *r = parse_query(&q, target);
    int64_t limit;
    if (r || (r = int_param(&q, "limit", 1, INCIDENTS_MAX, INCIDENTS_MAX, &limit)))
        return r;
    struct incident *newest = malloc((size_t)limit * sizeof *newest);
    if (!newest)
        return NULL;
    uint64_t noted;
    size_t n = incidents_newest(newest, (size_t)limit, &noted);
    json_t *list = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct incident *e = &newest[i];
        json_t *o = json_pack("{s:I, s:s, s:s, s:s, s:s}", "time_ms", (json_int_t)e->time_ms,
                              "kind", incident_kind_name(e->kind), "route", e->route, "space",
                              e->space, "key", e->key);
        if (o && e->epoch)
            json_object_set_new(o, "epoch", json_integer((json_int_t)e->epoch));
        json_array_append_new(list, o);
    }
    free(newest);
    return json_response(200, json_pack("{s:o, s:I, s:I}", "events", list, "noted",
                                        (json_int_t)noted, "kept_max",
                                        (json_int_t)INCIDENTS_MAX));
}

/* ---- actions ---- */

/* The record as it stands, for a 409: {"current": {...}} or no record. */
static struct http_response *moved_on(struct daemon *d, const char *space, const char *key,
                                      uint64_t epoch, const char *action)
{
    idem_record rec;
    struct http_response *r = api_record_get(d, space, key, &rec);
    if (r)
        return r;
    r =
        problem(409, "record_moved_on",
                "%s refused: the record is %s at epoch %" PRIu64 ", not %s at epoch %" PRIu64
                "; nothing was changed",
                action, rec.state, rec.epoch,
                strcmp(action, "delete") == 0 ? "finished" : IDEM_STATE_PROCESSING, epoch);
    idem_record_clear(&rec);
    return r;
}

/* The fields of an action's body: space, key, epoch, and for mark_failed
 * reason and status. 0, or the 400. */
struct action {
    const char *space, *key, *reason;
    uint64_t epoch;
    int status;
};

static struct http_response *parse_action(json_t *body, const char *op, struct action *a)
{
    static const char *const fields[] = {"space", "key", "epoch", "reason", "status"};
    int failing = strcmp(op, "mark_failed") == 0;
    const char *name;
    json_t *v;
    json_object_foreach(body, name, v) {
        size_t k = 0, known = failing ? 5 : 3;
        while (k < known && strcmp(fields[k], name) != 0)
            k++;
        if (k == known)
            return problem(400, "invalid_field", "field %.64s: records/%s takes no such field "
                           "(it takes space, key, epoch%s)",
                           name, op, failing ? ", reason, status" : "");
    }
    json_t *s = json_object_get(body, "space"), *k = json_object_get(body, "key"),
           *e = json_object_get(body, "epoch"), *why = json_object_get(body, "reason"),
           *st = json_object_get(body, "status");
    if (!json_is_string(s))
        return problem(400, "invalid_field", "field space: required (a string)");
    if (!json_is_string(k))
        return problem(400, "invalid_field", "field key: required (a string)");
    if (!json_is_integer(e) || json_integer_value(e) < 1)
        return problem(400, "invalid_field",
                       "field epoch: required, the claim's epoch as listed (>= 1)");
    a->space = json_string_value(s);
    a->key = json_string_value(k);
    a->epoch = (uint64_t)json_integer_value(e);
    a->status = 502;
    a->reason = NULL;
    if (!failing)
        return NULL;
    if (!json_is_string(why) || json_string_length(why) == 0 ||
        json_string_length(why) > REASON_MAX)
        return problem(400, "invalid_field",
                       "field reason: required, 1..%d bytes of text: the detail every retry "
                       "is answered with",
                       REASON_MAX);
    a->reason = json_string_value(why);
    if (st && (!json_is_integer(st) || json_integer_value(st) < 400 ||
               json_integer_value(st) > 599))
        return problem(400, "invalid_field", "field status: an HTTP status from 400 to 599");
    if (st)
        a->status = (int)json_integer_value(st);
    return NULL;
}

static struct http_response *act(struct daemon *d, const struct server_config *cfg,
                                 const struct front_request *req, const char *op)
{
    const struct http_msg *m = req->msg;
    json_error_t jerr;
    json_t *body = json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, &jerr);
    struct action a = {0};
    struct http_response *r = NULL;
    if (!body || !json_is_object(body))
        r = problem(400, "invalid_json", "the body must be a JSON object%s%s", body ? "" : ": ",
                    body ? "" : jerr.text);
    else
        r = parse_action(body, op, &a);
    idem_outcome o = IDEM_NONE;
    idem_rc rc = IDEM_OK;
    /* A claim that moved on is refused here, before the store is asked:
     * the store would refuse it too, but as a finish of a claim taken over,
     * logged and counted as the conflict alert rules watch for. (One that
     * moves on between this read and the write is refused the same way,
     * and then counted.) */
    int finishing = strcmp(op, "release") == 0 || strcmp(op, "mark_failed") == 0;
    idem_record cur;
    if (!r && finishing && !(r = api_record_get(d, a.space, a.key, &cur))) {
        if (strcmp(cur.state, IDEM_STATE_PROCESSING) != 0 || cur.epoch != a.epoch)
            o = IDEM_CONFLICT;
        idem_record_clear(&cur);
    }
    if (!r && o == IDEM_CONFLICT) {
        /* refused below, with the record as it stands */
    } else if (!r && strcmp(op, "release") == 0) {
        rc = idem_record_fail(d->h, a.space, a.key, a.epoch, IDEM_FAIL_RETRYABLE, NULL, 0, 0, &o);
    } else if (!r && strcmp(op, "mark_failed") == 0) {
        /* Stored as the gateway stores its own answers: every retry of
         * the key is answered with this problem from now on. */
        struct http_response *answer = problem(a.status, "failed_by_operator", "%s", a.reason);
        size_t len = 0;
        char *stored = stored_encode_response(answer, &len);
        response_free(answer);
        if (!stored)
            r = problem(503, "out_of_memory", "no memory to store the answer");
        else
            rc = idem_record_fail(d->h, a.space, a.key, a.epoch, IDEM_FAIL_FINAL, stored, len, 0,
                                  &o);
        free(stored);
    } else if (!r) {
        rc = idem_record_delete(d->h, a.space, a.key, a.epoch, &o, NULL, NULL);
    }
    int done = !r && rc == IDEM_OK && (o == IDEM_COMPLETED || o == IDEM_APPLIED);
    const char *what = strcmp(op, "release") == 0  ? IDEM_STATE_RELEASED
                       : strcmp(op, "delete") == 0 ? "DELETED"
                                                   : IDEM_STATE_FAILED;
    if (done) {
        r = json_response(200, json_pack("{s:s}", "outcome", what));
        /* What the record answered before is no longer its answer: the
         * loops' replay caches drop what they kept. */
        atomic_fetch_add(&d->replay_gen, 1);
    } else if (!r && rc != IDEM_OK) {
        r = problem_from_idem(rc, op);
    } else if (!r && o == IDEM_NOT_FOUND) {
        r = problem(404, "record_not_found", "no record %s in space %s", a.key, a.space);
    } else if (!r) {
        r = moved_on(d, a.space, a.key, a.epoch, op);
    }
    const struct api_key *key = admin_key(cfg, m);
    daemon_logl(LOG_WARN,
                "admin: API key %s from %s: records/%s %s/%s epoch %" PRIu64 ": %d %s",
                key ? key->name : "?", req->peer, op, a.space ? a.space : "-",
                a.key ? a.key : "-", a.epoch, r ? r->status : 503,
                done ? what : "refused, nothing changed");
    json_decref(body);
    return r;
}

int records_admin_handle(struct daemon *d, const struct server_config *cfg,
                         struct front_request *req, const char *rest)
{
    const struct http_msg *m = req->msg;
    int get = strcmp(m->method, "GET") == 0 || strcmp(m->method, "HEAD") == 0;
    int post = strcmp(m->method, "POST") == 0;
    int is_get_ep = strcmp(rest, "records") == 0 || strcmp(rest, "records/held") == 0 ||
                    strcmp(rest, "events") == 0;
    int is_post_ep = strcmp(rest, "records/release") == 0 ||
                     strcmp(rest, "records/mark_failed") == 0 ||
                     strcmp(rest, "records/delete") == 0;
    if (!is_get_ep && !is_post_ep)
        return 0;
    if (is_get_ep ? !get : !post) {
        const char *allow = is_get_ep ? "GET, HEAD" : "POST";
        req->resp = problem(405, "method_not_allowed", "%s /_idem/v1/%s: this endpoint takes %s",
                            m->method, rest, allow);
        if (req->resp)
            response_add_header(req->resp, "Allow", allow);
        return 1;
    }
    if (strcmp(rest, "events") == 0)
        req->resp = events(m->target);
    else if (is_get_ep)
        req->resp = list(d, cfg, m->target, strcmp(rest, "records/held") == 0);
    else
        req->resp = act(d, cfg, req, rest + 8);
    return 1;
}
