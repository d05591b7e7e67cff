/* SPDX-License-Identifier: Apache-2.0 */
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
 * A held claim is PROCESSING with a span (lease_until - updated_ms) that
 * no route's lease is: a claim in flight is only ever renewed to its
 * lease, a hold extends it by something else (config_span_is_lease). A
 * hold (hold_ms) is never shorter than the lease, so the store's filter
 * (a span over the longest lease) finds them; a resolver's wait for its
 * next question may be shorter, and on such a space the rows are sorted
 * here.
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
#include "admin/call.h"
#include "log.h"
#include "mono.h"
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

/* The longest lease of cfg's routes and consumers on space, whether one
 * of them holds unknown outcomes, and whether one resolves them. 0 when
 * none keeps records there. */
static int64_t space_lease(const struct server_config *cfg, const char *space, int *holds,
                           int *resolves)
{
    int64_t lease = 0;
    *holds = *resolves = 0;
    for (size_t i = 0; i < cfg->route_count + cfg->consumer_count; i++) {
        const struct route *rt = config_nth_route(cfg, i);
        if (strcmp(rt->space, space) != 0)
            continue;
        if (rt->lease_ms > lease)
            lease = rt->lease_ms;
        *holds |= config_route_holds(rt);
        *resolves |= rt->resolve != NULL;
    }
    return lease;
}

/* Is the claim rec live: a request may be executing under it now? A claim
 * in flight has the lease of a route (or consumer) on its space from its
 * last renewal on (its span, lease_until - updated, is that lease), and
 * the lease has not run out; a held one (hold, resolve) was extended by
 * another span, and an abandoned one has run out. */
static int claim_live(const struct server_config *cfg, const char *space, const idem_record *rec,
                      int64_t now)
{
    return strcmp(rec->state, IDEM_STATE_PROCESSING) == 0 && rec->lease_until_ms > now &&
           config_span_is_lease(cfg, space, rec->lease_until_ms - rec->updated_ms);
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

static json_t *item_json(const struct server_config *cfg, const char *space,
                         const idem_record_item *it, int64_t now, int holds)
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
        int held = holds && !config_span_is_lease(cfg, space, it->lease_until_ms - it->updated_ms);
        json_object_set_new(j, "held", json_boolean(held));
        /* Why, when this instance held it and still keeps the event. */
        char why[sizeof ((struct incident *)0)->why];
        if (held)
            incidents_why(INCIDENT_HELD, space, it->key, it->epoch, why, sizeof why);
        if (held && why[0])
            json_object_set_new(j, "reason", json_string(why));
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

/* What a listing's callback needs to show each row. */
struct listing {
    char space[IDEM_NAME_MAX + 1];
    int64_t now, lease;
    int holds, held_only; /* held_only: records/held */
    int resolves;         /* a route on the space resolves (see list) */
};

/* A listing refused for its query: the parameter named, as the library's
 * detail names the field. */
static struct http_response *list_refused(idem_rc rc, const char *detail)
{
    if (rc != IDEM_EINVAL)
        return problem_from_rc(rc, detail, "listing records");
    const char *name = strncmp(detail, "key_prefix", 10) == 0 ? "prefix"
                       : strncmp(detail, "cursor", 6) == 0    ? "cursor"
                       : strncmp(detail, "state", 5) == 0     ? "state"
                                                              : NULL;
    /* "cursor: not one ..." said as the parameter's name, once. */
    const char *colon = strstr(detail, ": ");
    return problem(400, "invalid_parameter", "parameter %s: %s", name ? name : "space",
                   colon ? colon + 2 : detail);
}

static void on_listed(void *arg, idem_rc rc, idem_record_page *page, const char *detail)
{
    struct api_call *c = arg;
    const struct listing *l = c->own;
    if (rc != IDEM_OK) {
        api_answer(c, list_refused(rc, detail));
        return;
    }
    json_t *items = json_array();
    for (size_t i = 0; i < page->count; i++) {
        const idem_record_item *it = &page->items[i];
        if (l->held_only && config_span_is_lease(c->cfg, l->space,
                                                 it->lease_until_ms - it->updated_ms))
            continue; /* in flight, not held: what the store's filter let through */
        json_array_append_new(items, item_json(c->cfg, l->space, it, l->now, l->holds));
    }
    json_t *j = json_pack("{s:o, s:o}", "records", items, "next_cursor",
                          page->next_cursor[0] ? json_string(page->next_cursor) : json_null());
    api_answer(c, json_response(200, j));
}

/* GET records and records/held. */
static void list(struct api_call *c, int held)
{
    struct query q = {.names = {"space", "prefix", "state", "older_than_ms", "newer_than_ms",
                                "limit", "cursor"}};
    if (held)
        q.names[1] = "limit", q.names[2] = "cursor", q.names[3] = NULL;
    struct http_response *r = parse_query(&q, c->req->msg->target);
    if (r) {
        api_answer(c, r);
        return;
    }
    const char *space = param(&q, "space");
    if (!space) {
        api_answer(c, problem(400, "invalid_parameter", "parameter space: required (records "
                              "are listed one key space at a time)"));
        return;
    }
    int64_t older = 0, newer = 0, limit = 0;
    if ((r = int_param(&q, "older_than_ms", 1, AGE_MAX_MS, 0, &older)) ||
        (r = int_param(&q, "newer_than_ms", 1, AGE_MAX_MS, 0, &newer)) ||
        (r = int_param(&q, "limit", 1, IDEM_LIST_LIMIT_MAX, IDEM_LIST_LIMIT_DEFAULT, &limit))) {
        api_answer(c, r);
        return;
    }
    struct listing *l = calloc(1, sizeof *l);
    if (!l) {
        api_answer(c, NULL);
        return;
    }
    c->own = l;
    snprintf(l->space, sizeof l->space, "%s", space);
    l->lease = space_lease(c->cfg, space, &l->holds, &l->resolves);
    l->held_only = held;
    if (held && !l->holds) {
        api_answer(c, problem(400, "invalid_parameter",
                              "parameter space: no route or consumer on space %s has "
                              "on_unknown_outcome: hold or resolve, so none of its claims is "
                              "held",
                              space));
        return;
    }
    l->now = wall_ms();
    idem_record_query rq = {
        .space = space,
        .key_prefix = param(&q, "prefix"),
        .state = held ? IDEM_STATE_PROCESSING : param(&q, "state") ? state_name(param(&q, "state"))
                                                                   : NULL,
        .created_before_ms = older ? l->now - older : 0,
        .created_after_ms = newer ? l->now - newer : 0,
        /* A hold is never shorter than the lease, so the store leaves out
         * the claims in flight; a resolver's wait for its next question
         * may be (after: 1s, lease: 30s): there the rows are sorted here. */
        .min_lease_span_ms = held && !l->resolves ? l->lease : 0,
        .limit = (unsigned)limit,
        .cursor = param(&q, "cursor"),
    };
    idem_rc rc = idem_record_list_async(c->d->h, c->loop, &rq, on_listed, c);
    if (rc != IDEM_OK)
        api_answer(c, list_refused(rc, idem_errdetail()));
}

void api_records_list(struct api_call *c)
{
    list(c, 0);
}

void api_records_held(struct api_call *c)
{
    list(c, 1);
}

/* GET events?limit=: newest first. */
void api_events(struct api_call *c)
{
    const char *target = c->req->msg->target;
    struct query q = {.names = {"limit"}};
    struct http_response *r = parse_query(&q, target);
    int64_t limit;
    if (r || (r = int_param(&q, "limit", 1, INCIDENTS_MAX, INCIDENTS_MAX, &limit))) {
        api_answer(c, r);
        return;
    }
    struct incident *newest = malloc((size_t)limit * sizeof *newest);
    if (!newest) {
        api_answer(c, NULL);
        return;
    }
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
        if (o && e->why[0])
            json_object_set_new(o, "why", json_string(e->why));
        json_array_append_new(list, o);
    }
    free(newest);
    api_answer(c, json_response(200, json_pack("{s:o, s:I, s:I}", "events", list, "noted",
                                               (json_int_t)noted, "kept_max",
                                               (json_int_t)INCIDENTS_MAX)));
}

/* ---- actions ----
 *
 * An action's walk, each step the library's asynchronous call:
 *
 *   release, mark_failed:  read ── not PROCESSING at the epoch ──► 409
 *                            │  └── live (in flight), without force ──► 409 claim_live
 *                            │
 *                            └─► fail_seen (retryable / final) ── CONFLICT ──► read ──► 409
 *                                     │
 *                                     └─► 200, or 404
 *   delete:                delete_seen (epoch, updated_ms) ── CONFLICT (the record as it
 *                            │                                stands) ──► 409
 *                            └─► 200, or 404
 *                            └─► 200, or 404
 *
 * A claim that moved on is refused before the store is asked to change it;
 * one that moves on between the read and the write is refused by the
 * store, as the caller's stale view (idem_record_fail_seen_async): logged
 * at INFO, never counted as the conflict alert rules watch for. A delete
 * is fenced on the record's version as well as its epoch (updated_ms, as
 * the operator read it): a record marked failed or released by another
 * operator since, at the same epoch, is not deleted for what it was.
 */

/* The fields of an action's body: space, key, epoch, and for mark_failed
 * reason and status (the endpoint table refuses any other). */
struct action {
    const char *op;              /* release, mark_failed, delete */
    const char *space, *key, *reason; /* in the call's body */
    uint64_t epoch;
    int64_t updated_ms;          /* delete: the record's as read (its version) */
    int status;
    int force;                   /* release, mark_failed: a live claim too */
};

/* 0, or the 400. */
static struct http_response *parse_action(json_t *body, struct action *a)
{
    int failing = strcmp(a->op, "mark_failed") == 0;
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
    if (strcmp(a->op, "delete") == 0) {
        json_t *u = json_object_get(body, "updated_ms");
        if (!json_is_integer(u) || json_integer_value(u) < 1)
            return problem(400, "invalid_field",
                           "field updated_ms: required, the record's updated_ms as listed (>= "
                           "1): a record written since it was read is not deleted");
        a->updated_ms = (int64_t)json_integer_value(u);
        return NULL;
    }
    json_t *force = json_object_get(body, "force");
    if (force && !json_is_boolean(force))
        return problem(400, "invalid_field", "field force: true or false");
    a->force = json_is_true(force);
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

/* The action's answer r, logged with the key that asked for it. done: the
 * record changed. */
static void act_end(struct api_call *c, struct http_response *r, int done)
{
    const struct action *a = c->own;
    const char *what = strcmp(a->op, "release") == 0  ? IDEM_STATE_RELEASED
                       : strcmp(a->op, "delete") == 0 ? "DELETED"
                                                      : IDEM_STATE_FAILED;
    if (done) {
        r = json_response(200, json_pack("{s:s}", "outcome", what));
        /* What the record answered before is no longer its answer: the
         * loops' replay caches drop what they kept. */
        atomic_fetch_add(&c->d->replay_gen, 1);
        held_census_nudge(&c->d->held, c->d->h, c->loop, c->cfg); /* one held fewer? */
    }
    const struct api_key *key = admin_key(c->cfg, c->req->msg);
    daemon_logl(LOG_WARN,
                "admin: API key %s from %s: records/%s %s/%s epoch %" PRIu64 ": %d %s",
                key ? key->name : "?", c->req->peer, a->op, a->space ? a->space : "-",
                a->key ? a->key : "-", a->epoch, r ? r->status : 503,
                done ? what : "refused, nothing changed");
    api_answer(c, r);
}

/* The 409 of an action refused: the record is state at epoch now. */
static struct http_response *moved_on(const struct action *a, const char *state, uint64_t epoch)
{
    if (strcmp(a->op, "delete") == 0 && epoch == a->epoch && idem_record_finished(state))
        return problem(409, "record_moved_on",
                       "delete refused: the record at epoch %" PRIu64 " was written since it "
                       "was read (updated_ms %" PRId64 "); it is %s now. Read it again; nothing "
                       "was changed",
                       epoch, a->updated_ms, state);
    return problem(409, "record_moved_on",
                   "%s refused: the record is %s at epoch %" PRIu64 ", not %s at epoch %" PRIu64
                   "; nothing was changed",
                   a->op, state, epoch,
                   strcmp(a->op, "delete") == 0 ? "finished" : IDEM_STATE_PROCESSING, a->epoch);
}

static void not_found(struct api_call *c)
{
    const struct action *a = c->own;
    act_end(c, problem(404, "record_not_found", "no record %s in space %s", a->key, a->space),
            0);
}

/* The read after a refused finish: the record as it stands, for the 409. */
static void on_moved(void *arg, idem_rc rc, idem_outcome o, idem_record *rec, const char *detail)
{
    struct api_call *c = arg;
    if (rc != IDEM_OK)
        act_end(c, problem_from_rc(rc, detail, "reading the record"), 0);
    else if (o == IDEM_NOT_FOUND)
        not_found(c);
    else
        act_end(c, moved_on(c->own, rec->state, rec->epoch), 0);
}

static void on_finished(void *arg, idem_rc rc, idem_outcome o, const char *detail)
{
    struct api_call *c = arg;
    const struct action *a = c->own;
    if (rc != IDEM_OK) {
        act_end(c, problem_from_rc(rc, detail, a->op), 0);
    } else if (o == IDEM_NOT_FOUND) {
        not_found(c);
    } else if (o != IDEM_CONFLICT) {
        act_end(c, NULL, 1);
    } else if ((rc = idem_record_get_async(c->d->h, c->loop, a->space, a->key, on_moved, c)) !=
               IDEM_OK) {
        act_end(c, problem_from_idem(rc, "reading the record"), 0);
    }
}

/* The read before a finish: is the claim still the one the operator saw? */
static void on_claim_read(void *arg, idem_rc rc, idem_outcome o, idem_record *rec,
                          const char *detail)
{
    struct api_call *c = arg;
    const struct action *a = c->own;
    if (rc != IDEM_OK) {
        act_end(c, problem_from_rc(rc, detail, "reading the record"), 0);
        return;
    }
    if (o == IDEM_NOT_FOUND) {
        not_found(c);
        return;
    }
    if (strcmp(rec->state, IDEM_STATE_PROCESSING) != 0 || rec->epoch != a->epoch) {
        act_end(c, moved_on(a, rec->state, rec->epoch), 0);
        return;
    }
    int64_t now = wall_ms();
    if (!a->force && claim_live(c->cfg, a->space, rec, now)) {
        act_end(c,
                problem(409, "claim_live",
                        "%s refused: the claim at epoch %" PRIu64 " is live: its lease, renewed "
                        "while its request runs, has %" PRId64 " ms left, and the upstream may "
                        "be executing it now. %s Wait until it ends or its lease runs out, or "
                        "send \"force\": true to do it anyway; nothing was changed",
                        a->op, rec->epoch, rec->lease_until_ms - now,
                        strcmp(a->op, "release") == 0
                            ? "Released, the next retry executes the key while this one may "
                              "still be running: a second execution."
                            : "Marked failed, every retry is answered with the failure even if "
                              "this request succeeds."),
                0);
        return;
    }
    if (strcmp(a->op, "release") == 0) {
        rc = idem_record_fail_seen_async(c->d->h, c->loop, a->space, a->key, a->epoch,
                                         IDEM_FAIL_RETRYABLE, NULL, 0, 0, on_finished, c);
    } else {
        /* Stored as the gateway stores its own answers: every retry of
         * the key is answered with this problem from now on. */
        struct http_response *answer = problem(a->status, "failed_by_operator", "%s", a->reason);
        size_t len = 0;
        char *stored = stored_encode_response(answer, &len);
        response_free(answer);
        if (!stored) {
            act_end(c, problem(503, "out_of_memory", "no memory to store the answer"), 0);
            return;
        }
        rc = idem_record_fail_seen_async(c->d->h, c->loop, a->space, a->key, a->epoch,
                                         IDEM_FAIL_FINAL, stored, len, 0, on_finished, c);
        free(stored); /* copied by the call */
    }
    if (rc != IDEM_OK)
        act_end(c, problem_from_idem(rc, a->op), 0);
}

static void on_deleted(void *arg, idem_rc rc, idem_outcome o, const char *current,
                       uint64_t current_epoch, const char *detail)
{
    struct api_call *c = arg;
    const struct action *a = c->own;
    if (rc != IDEM_OK)
        act_end(c, problem_from_rc(rc, detail, a->op), 0);
    else if (o == IDEM_NOT_FOUND)
        not_found(c);
    else if (o == IDEM_CONFLICT)
        act_end(c, moved_on(a, current, current_epoch), 0);
    else
        act_end(c, NULL, 1);
}

/* POST records/release, records/mark_failed, records/delete. */
void api_records_act(struct api_call *c)
{
    struct action *a = calloc(1, sizeof *a);
    if (!a) {
        api_answer(c, NULL);
        return;
    }
    c->own = a;
    a->op = c->rest + strlen("records/");
    struct http_response *r = parse_action(c->body, a);
    if (r) {
        act_end(c, r, 0);
        return;
    }
    idem_rc rc = strcmp(a->op, "delete") == 0
                     ? idem_record_delete_seen_async(c->d->h, c->loop, a->space, a->key,
                                                     a->epoch, a->updated_ms, on_deleted, c)
                     : idem_record_get_async(c->d->h, c->loop, a->space, a->key, on_claim_read,
                                             c);
    if (rc != IDEM_OK)
        act_end(c, problem_from_idem(rc, a->op), 0);
}
