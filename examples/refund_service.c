/* SPDX-License-Identifier: Apache-2.0 */
/*
 * refund_service.c — an example upstream for Idem: the refund service that the
 * README's quick start and the system tests put behind `idem serve`.
 *
 * Its tables carry a UNIQUE business key, the service's own last line of
 * defence, and it counts every *execution* (business work started for a
 * well-formed request, whether or not the row then goes in), so a test can tell
 * "the gateway let one request through" from "the database threw the rest away".
 * --naive breaks refunds on purpose (check, delay, insert into a table with no
 * UNIQUE constraint) to give `idem verify` something to catch. Test hooks: the
 * X-Fail and X-Delay-Ms request headers. It honours Idem-Epoch as a fence
 * (see "fencing" below). GET / is a refund form (page[] and
 * script[] below) that, reached through `idem serve`, shows the token flow in
 * a browser. examples/README.md lists the endpoints.
 *
 *   refund_service [--listen 127.0.0.1:9000] [--db ./refunds.db | :memory:]
 *                  [--delay-ms N] [--naive]
 *   curl -d '{"refund_no":"R-1","amount":"100.00"}' http://127.0.0.1:9000/refunds
 */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>
#include <sqlite3.h>

#define MAX_BODY     (64 * 1024)
#define MAX_HEADERS  (16 * 1024)
#define MAX_KEY      256
#define MAX_DELAY_MS 600000L

/* One kind of business operation: a table whose key column is UNIQUE. */
struct kind {
    const char *key;          /* JSON field and column: refund_no, serial_no */
    const char *table;
    const char *naive_table;  /* used under --naive; NULL: always the real table */
    const char *duplicate;    /* the 409 message */
    atomic_long executions;
};

static atomic_long fenced; /* writes refused for a stale Idem-Epoch */
static struct kind refunds = {"refund_no", "refunds", "refunds_naive", "duplicate refund_no", 0};
static struct kind payments = {"serial_no", "payments", NULL, "duplicate serial_no", 0};

/* A request that has been checked and counted, waiting out its delay. */
struct pending {
    LIST_ENTRY(pending) link;
    struct evhttp_request *req;
    struct event *timer;
    struct kind *kind;
    char *key, *amount, *subject;   /* subject may be NULL */
    long delay_ms;
    long execution;                 /* this kind's execution count, this one included */
    int fail;                       /* injected 5xx status, or 0 */
    long long epoch;                /* its Idem-Epoch, or 0 when it has none */
    char *state_from, *state_to;    /* a status event's move (Idem-State-From, -To) */
};

/* GET /: the refund form, meant to be reached through `idem serve` (which
 * proxies GET / here as a request no route matches), so that its script's
 * calls go to Idem: a token for scene "refund" when the page loads, the form
 * posted to /refunds with it, and on 409 token_spent the problem's detail
 * (the configuration's localised text) and a button that fetches a new token.
 * Plain HTML and a script of its own (GET /app.js), nothing from elsewhere:
 * the Content-Security-Policy allows this origin only. X-Subject stands in
 * for the auth layer in front of Idem, which would set it. */
static const char page[] =
    "<!doctype html>\n"
    "<html lang=\"en\">\n"
    "<head>\n"
    "<meta charset=\"utf-8\">\n"
    "<title>Refund</title>\n"
    "<style>\n"
    "body { font: 16px sans-serif; max-width: 32em; margin: 2em auto; }\n"
    "label { display: block; margin: .5em 0; }\n"
    "#result.ok { color: #060; } #result.spent, #result.error { color: #a00; }\n"
    "</style>\n"
    "</head>\n"
    "<body>\n"
    "<h1>Refund</h1>\n"
    "<form id=\"refund\">\n"
    "<label>Customer (X-Subject) <input id=\"subject\" value=\"alice\"></label>\n"
    "<label>Refund number <input id=\"refund_no\" required value=\"R-web-1\"></label>\n"
    "<label>Amount <input id=\"amount\" required value=\"1.00\"></label>\n"
    "<button id=\"send\" type=\"submit\" disabled>Refund</button>\n"
    "</form>\n"
    "<p>Token: <code id=\"token\">(getting one)</code></p>\n"
    "<p id=\"result\" role=\"status\"></p>\n"
    "<button id=\"again\" type=\"button\" hidden>Get a new token and retry</button>\n"
    "<script src=\"/app.js\"></script>\n"
    "</body>\n"
    "</html>\n";

/* What the page runs. Everything shown goes through textContent: an
 * answer's text is never read as HTML. */
static const char script[] =
    "'use strict';\n"
    "const $ = (id) => document.getElementById(id);\n"
    "let token = null;\n"
    "\n"
    "function show(kind, text) {\n"
    "  $('result').className = kind;\n"
    "  $('result').textContent = text;\n"
    "}\n"
    "\n"
    "async function answerOf(r) {\n"
    "  const text = await r.text();\n"
    "  try {\n"
    "    return { text, json: JSON.parse(text) };\n"
    "  } catch (e) {\n"
    "    return { text, json: null };\n"
    "  }\n"
    "}\n"
    "\n"
    "// A one-time token for the refund scene, from Idem's POST /_idem/v1/tokens.\n"
    "async function newToken() {\n"
    "  token = null;\n"
    "  $('send').disabled = true;\n"
    "  $('token').textContent = '(getting one)';\n"
    "  const r = await fetch('/_idem/v1/tokens', {\n"
    "    method: 'POST',\n"
    "    headers: { 'Content-Type': 'application/json', 'X-Subject': $('subject').value },\n"
    "    body: JSON.stringify({ scene: 'refund' }),\n"
    "  });\n"
    "  const a = await answerOf(r);\n"
    "  if (!r.ok || !a.json || !a.json.token) {\n"
    "    show('error', 'no token: ' + r.status + ' ' + ((a.json && a.json.detail) || a.text));\n"
    "    return;\n"
    "  }\n"
    "  token = a.json.token;\n"
    "  $('token').textContent = token;\n"
    "  $('send').disabled = false;\n"
    "}\n"
    "\n"
    "// The form, posted with the token: a second click, a reload of the answer\n"
    "// or a retry is answered by Idem with the first answer (Idempotent-Replayed).\n"
    "$('refund').addEventListener('submit', async (ev) => {\n"
    "  ev.preventDefault();\n"
    "  const r = await fetch('/refunds', {\n"
    "    method: 'POST',\n"
    "    headers: { 'Content-Type': 'application/json', 'X-Subject': $('subject').value,\n"
    "               'Idem-Token': token },\n"
    "    body: JSON.stringify({ refund_no: $('refund_no').value, amount: $('amount').value }),\n"
    "  });\n"
    "  const a = await answerOf(r);\n"
    "  if (r.status === 409 && a.json && a.json.type === 'urn:idem:token_spent') {\n"
    "    show('spent', a.json.detail);\n"
    "    $('again').hidden = false;\n"
    "  } else if (r.ok) {\n"
    "    const replayed = r.headers.get('Idempotent-Replayed') === 'true';\n"
    "    show('ok', (replayed ? 'Already done (replayed): ' : 'Done: ') + a.text);\n"
    "  } else {\n"
    "    const why = a.json && (a.json.detail || a.json.error);\n"
    "    show('error', r.status + ': ' + (why || a.text));\n"
    "  }\n"
    "});\n"
    "\n"
    "$('again').addEventListener('click', () => {\n"
    "  $('again').hidden = true;\n"
    "  show('', '');\n"
    "  newToken();\n"
    "});\n"
    "\n"
    "newToken();\n";

static struct event_base *base;
static sqlite3 *db;
static long delay_ms;
static bool naive;
static LIST_HEAD(, pending) waiting = LIST_HEAD_INITIALIZER(waiting);

#define COLUMNS " subject TEXT, amount TEXT NOT NULL, epoch INTEGER," \
                " created_at TEXT DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
static const char schema[] =
    "PRAGMA journal_mode=WAL;"
    /* The newest Idem-Epoch each key has been called with (see "fencing"). */
    "CREATE TABLE IF NOT EXISTS fences(kind TEXT NOT NULL, key TEXT NOT NULL,"
    " epoch INTEGER NOT NULL, PRIMARY KEY(kind, key));"
    "CREATE TABLE IF NOT EXISTS refunds(id INTEGER PRIMARY KEY,"
    " refund_no TEXT NOT NULL UNIQUE," COLUMNS ";"
    "CREATE TABLE IF NOT EXISTS refunds_naive(id INTEGER PRIMARY KEY,"
    " refund_no TEXT NOT NULL," COLUMNS ";"          /* no UNIQUE: that is the bug */
    "CREATE TABLE IF NOT EXISTS payments(id INTEGER PRIMARY KEY,"
    " serial_no TEXT NOT NULL UNIQUE," COLUMNS ";";

static const char *table_of(const struct kind *k)
{
    return naive && k->naive_table ? k->naive_table : k->table;
}

/* A reply with a one-line body; a NULL reason asks libevent for the phrase. */
static void reply(struct evhttp_request *req, int code, const char *type, const char *text)
{
    struct evbuffer *out = evbuffer_new();
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
    if (out && text)
        evbuffer_add_printf(out, "%s\n", text);
    evhttp_send_reply(req, code, NULL, out);
    if (out)
        evbuffer_free(out);
}

/* Sends obj as JSON and drops the reference. */
static void reply_json(struct evhttp_request *req, int code, json_t *obj)
{
    char *text = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    reply(req, code, "application/json", text);
    free(text);
    json_decref(obj);
}

static void reply_error(struct evhttp_request *req, int code, const char *msg)
{
    reply_json(req, code, json_pack("{s:s}", "error", msg));
}

/* Table and column names are ours, never the client's, so %s is safe here. */
static sqlite3_stmt *prepare(const char *fmt, ...)
{
    sqlite3_stmt *st = NULL;
    va_list ap;
    va_start(ap, fmt);
    char *sql = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    if (sql && sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        fprintf(stderr, "refund_service: %s\n", sqlite3_errmsg(db));
    sqlite3_free(sql);
    return st;
}

static long long count_rows(const char *table)
{
    sqlite3_stmt *st = prepare("SELECT count(*) FROM %s", table);
    long long n = st && sqlite3_step(st) == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
    sqlite3_finalize(st);
    return n;
}

/* SQLITE_ROW if table has a row with this key, SQLITE_DONE if not, else an error. */
static int find_key(const struct kind *k, const char *table, const char *key)
{
    sqlite3_stmt *st = prepare("SELECT 1 FROM %s WHERE %s = ?1", table, k->key);
    int rc = st ? sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) : SQLITE_ERROR;
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc;
}

/* After the delay: the INSERT, and the UNIQUE constraint decides. */
/* ---- fencing ----
 *
 * Idem sends each claim of a key with Idem-Epoch, higher for every new
 * claim. A call can outlive its claim: its gateway paused or cut off past
 * the lease, the key taken over and called again with a higher epoch,
 * then the old call's work arriving late. So the service remembers, per
 * key, the newest epoch it has been called with (on arrival, in fences),
 * and refuses a write whose epoch is older than that: only the key's
 * current owner writes. The epoch is kept with the row too. */

/* On arrival: the key has now been called with p's epoch. */
static void fence_note(const struct pending *p)
{
    sqlite3_stmt *st = prepare("INSERT INTO fences(kind, key, epoch) VALUES(?1, ?2, ?3)"
                               " ON CONFLICT(kind, key) DO UPDATE SET"
                               " epoch = max(epoch, excluded.epoch)");
    if (st) {
        sqlite3_bind_text(st, 1, p->kind->key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, p->key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, p->epoch);
        if (sqlite3_step(st) != SQLITE_DONE)
            fprintf(stderr, "refund_service: fence: %s\n", sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
}

/* Before the write: the newest epoch the key was called with, if newer
 * than p's; else 0. */
static long long fence_newer(const struct pending *p)
{
    sqlite3_stmt *st = prepare("SELECT epoch FROM fences WHERE kind = ?1 AND key = ?2");
    long long newest = 0;
    if (st) {
        sqlite3_bind_text(st, 1, p->kind->key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, p->key, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW)
            newest = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    return newest > p->epoch ? newest : 0;
}

static void insert_and_reply(struct pending *p)
{
    const struct kind *k = p->kind;
    long long newer = p->epoch ? fence_newer(p) : 0;
    if (newer) {
        char why[160];
        atomic_fetch_add(&fenced, 1);
        snprintf(why, sizeof why, "fenced: this call's Idem-Epoch %lld is older than the "
                 "key's newest claim (%lld)", p->epoch, newer);
        reply_error(p->req, 409, why);
        return;
    }
    sqlite3_stmt *st = prepare("INSERT INTO %s(%s, subject, amount, epoch) VALUES(?1, ?2, ?3, ?4)",
                               table_of(k), k->key);
    int rc = st ? SQLITE_OK : SQLITE_ERROR;
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, p->key, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, p->subject, -1, SQLITE_STATIC);  /* NULL binds NULL */
        sqlite3_bind_text(st, 3, p->amount, -1, SQLITE_STATIC);
        if (p->epoch)
            sqlite3_bind_int64(st, 4, p->epoch);
        rc = sqlite3_step(st);
    }
    if (rc == SQLITE_DONE) {
        long long id = sqlite3_last_insert_rowid(db);
        if (k == &refunds) {
            char location[64];
            snprintf(location, sizeof location, "/refunds/%lld", id);
            evhttp_add_header(evhttp_request_get_output_headers(p->req), "Location", location);
        }
        reply_json(p->req, 201, json_pack("{s:s, s:I, s:s, s:I}", k->key, p->key,
                                          "id", (json_int_t)id, "amount", p->amount,
                                          "execution", (json_int_t)p->execution));
    } else if ((rc & 0xff) == SQLITE_CONSTRAINT) {
        reply_error(p->req, 409, k->duplicate);
    } else {
        fprintf(stderr, "refund_service: insert: %s\n", sqlite3_errmsg(db));
        reply_error(p->req, 500, "database error");
    }
    sqlite3_finalize(st);
}

static void pending_free(struct pending *p)
{
    if (p->timer)
        event_free(p->timer);
    free(p->key);
    free(p->amount);
    free(p->subject);
    free(p->state_from);
    free(p->state_to);
    free(p);
}

static void on_delay_done(evutil_socket_t fd, short what, void *arg)
{
    struct pending *p = arg;
    (void)fd, (void)what;
    LIST_REMOVE(p, link);
    if (p->fail)
        reply_error(p->req, p->fail, "injected");
    else if (p->state_to)
        /* A status event Idem passes on from a route with states: the
         * move it was given, acknowledged (a service would update its row
         * from state_from to state_to here). */
        reply_json(p->req, 200, json_pack("{s:s, s:s, s:s, s:I}", p->kind->key, p->key,
                                          "state_from", p->state_from, "state_to", p->state_to,
                                          "execution", (json_int_t)p->execution));
    else
        insert_and_reply(p);
    pending_free(p);
}

/* A whole decimal number in [lo, hi], or -1. */
static long parse_long(const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < lo || v > hi ? -1 : v;
}

/* Fills p from the request, or returns the message for a 400. */
static const char *parse_write(struct evhttp_request *req, struct pending *p)
{
    struct evkeyvalq *headers = evhttp_request_get_input_headers(req);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t len = evbuffer_get_length(in);
    const char *hdr, *key, *amount, *why = NULL;

    p->delay_ms = delay_ms;

    if ((hdr = evhttp_find_header(headers, "X-Fail"))) {
        p->fail = (int)parse_long(hdr, 408, 599);
        if (p->fail < 500 && p->fail != 408 && p->fail != 425 && p->fail != 429)
            return "X-Fail must be a 5xx status, 408, 425 or 429";
    }
    if ((hdr = evhttp_find_header(headers, "Idem-Epoch")) &&
        (p->epoch = strtoll(hdr, NULL, 10), hdr[strspn(hdr, "0123456789")] || p->epoch <= 0))
        return "Idem-Epoch must be a positive whole number";
    if ((hdr = evhttp_find_header(headers, "X-Delay-Ms")) &&
        (p->delay_ms = parse_long(hdr, 0, MAX_DELAY_MS)) < 0)
        return "X-Delay-Ms must be a number of milliseconds";
    if ((hdr = evhttp_find_header(headers, "X-Subject")) && !(p->subject = strdup(hdr)))
        return "out of memory";
    if ((hdr = evhttp_find_header(headers, "Idem-State-To")) &&
        (!(p->state_to = strdup(hdr)) ||
         !(p->state_from = strdup((hdr = evhttp_find_header(headers, "Idem-State-From")) ? hdr
                                                                                         : ""))))
        return "out of memory";

    json_t *body = json_loadb((const char *)evbuffer_pullup(in, -1), len, 0, NULL);
    if (!json_is_object(body))
        why = "body must be a JSON object";
    else if (!(key = json_string_value(json_object_get(body, p->kind->key))) || !*key ||
             strlen(key) > MAX_KEY)
        why = p->kind == &refunds ? "refund_no must be a string of 1 to 256 characters"
                                  : "serial_no must be a string of 1 to 256 characters";
    else if (!(amount = json_string_value(json_object_get(body, "amount"))) || !*amount ||
             amount[strspn(amount, "0123456789.")] || strlen(amount) > 32)
        why = "amount must be a decimal string like \"100.00\"";
    else if (!(p->key = strdup(key)) || !(p->amount = strdup(amount)))
        why = "out of memory";
    json_decref(body);
    return why;
}

/* POST of a refund or a payment: check, count, then wait out the delay. */
static void on_write(struct evhttp_request *req, struct kind *k)
{
    struct pending *p = calloc(1, sizeof *p);
    const char *why;
    if (!p) {
        reply_error(req, 500, "out of memory");
        return;
    }
    p->req = req;
    p->kind = k;
    if ((why = parse_write(req, p))) {
        reply_error(req, 400, why);
        goto fail;
    }
    p->execution = atomic_fetch_add(&k->executions, 1) + 1;
    if (p->epoch)
        fence_note(p);

    if (naive && k->naive_table && !p->fail) {
        /* The broken check-then-insert: nothing stops two requests that both
         * pass this check from both inserting after the delay. */
        int rc = find_key(k, k->naive_table, p->key);
        if (rc != SQLITE_DONE) {
            if (rc == SQLITE_ROW)
                reply_error(req, 409, k->duplicate);
            else
                reply_error(req, 500, "database error");
            goto fail;
        }
    }
    struct timeval tv = {p->delay_ms / 1000, (p->delay_ms % 1000) * 1000};
    if (!(p->timer = evtimer_new(base, on_delay_done, p)) || evtimer_add(p->timer, &tv) != 0) {
        reply_error(req, 500, "cannot arm timer");
        goto fail;
    }
    LIST_INSERT_HEAD(&waiting, p, link);
    return;
fail:
    pending_free(p);
}

static void on_get_refund(struct evhttp_request *req, const char *encoded)
{
    char *key = evhttp_uridecode(encoded, 0, NULL);
    sqlite3_stmt *st = prepare("SELECT id, refund_no, subject, amount, created_at FROM %s"
                               " WHERE refund_no = ?1 OR id = ?1"
                               " ORDER BY refund_no = ?1 DESC, id LIMIT 1", table_of(&refunds));
    int rc = key && st ? sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC) : SQLITE_ERROR;
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        reply_json(req, 200, json_pack("{s:I, s:s, s:s?, s:s, s:s?}",
                   "id", (json_int_t)sqlite3_column_int64(st, 0),
                   "refund_no", (const char *)sqlite3_column_text(st, 1),
                   "subject", (const char *)sqlite3_column_text(st, 2),
                   "amount", (const char *)sqlite3_column_text(st, 3),
                   "created_at", (const char *)sqlite3_column_text(st, 4)));
    else if (rc == SQLITE_DONE)
        reply_error(req, 404, "no such refund");
    else
        reply_error(req, 500, "database error");
    sqlite3_finalize(st);
    free(key);
}

static void on_stats(struct evhttp_request *req)
{
    reply_json(req, 200, json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}",
               "executions", (json_int_t)atomic_load(&refunds.executions),
               "fenced", (json_int_t)atomic_load(&fenced),
               "refunds", (json_int_t)count_rows("refunds"),
               "naive_rows", (json_int_t)count_rows("refunds_naive"),
               "payments", (json_int_t)count_rows("payments"),
               "payment_executions", (json_int_t)atomic_load(&payments.executions)));
}

/* The page and its script: this origin only, never sniffed, never cached
 * (the demo is changed and reloaded). */
static void reply_asset(struct evhttp_request *req, const char *type, const char *text,
                        size_t len)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    struct evbuffer *out = evbuffer_new();
    evhttp_add_header(h, "Content-Type", type);
    evhttp_add_header(h, "Content-Security-Policy", "default-src 'self'; "
                      "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'");
    evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
    evhttp_add_header(h, "Cache-Control", "no-store");
    if (out)
        evbuffer_add(out, text, len);
    evhttp_send_reply(req, 200, NULL, out);
    if (out)
        evbuffer_free(out);
}

static void on_count(struct evhttp_request *req)
{
    char text[32];
    snprintf(text, sizeof text, "%ld",
             atomic_load(&refunds.executions) + atomic_load(&payments.executions));
    reply(req, 200, "text/plain", text);
}

/* /orders/<order_no>/refunds: a refund filed under its order, one segment. */
static bool order_refund(const char *path)
{
    if (strncmp(path, "/orders/", 8) != 0)
        return false;
    size_t n = strcspn(path + 8, "/");
    return n > 0 && strcmp(path + 8 + n, "/refunds") == 0;
}

static void on_request(struct evhttp_request *req, void *arg)
{
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    bool post = evhttp_request_get_command(req) == EVHTTP_REQ_POST;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    bool get = cmd == EVHTTP_REQ_GET || cmd == EVHTTP_REQ_HEAD; /* HEAD: GET without a body */
    (void)arg;
    if (!path)
        path = "/";

    /* Exact paths: a service that took any path ending in these would take
     * /x/callbacks/payment too, which no gateway route matches. */
    bool refund = strcmp(path, "/refunds") == 0 || order_refund(path);
    if (refund || strcmp(path, "/payments") == 0 || strcmp(path, "/callbacks/payment") == 0 ||
        strcmp(path, "/admin/payments/repush") == 0) {
        if (post)
            on_write(req, refund ? &refunds : &payments);
        else
            reply_error(req, 405, "use POST");
    } else if (strncmp(path, "/refunds/", 9) == 0 && path[9]) {
        if (get)
            on_get_refund(req, path + 9);
        else
            reply_error(req, 405, "use GET");
    } else if (get && strcmp(path, "/stats") == 0) {
        on_stats(req);
    } else if (get && strcmp(path, "/count") == 0) {
        on_count(req);
    } else if (get && strcmp(path, "/") == 0) {
        reply_asset(req, "text/html; charset=utf-8", page, sizeof page - 1);
    } else if (get && strcmp(path, "/app.js") == 0) {
        reply_asset(req, "text/javascript; charset=utf-8", script, sizeof script - 1);
    } else {
        reply_error(req, 404, "not found");
    }
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)sig, (void)what, (void)arg;
    event_base_loopexit(base, NULL);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: refund_service [--listen HOST:PORT] [--db PATH] [--delay-ms N] [--naive]\n"
               "  --listen HOST:PORT  default 127.0.0.1:9000 (port 0: any free port)\n"
               "  --db PATH           SQLite file, default ./refunds.db; \":memory:\" works\n"
               "  --delay-ms N        wait N ms between check and insert, default 0\n"
               "  --naive             broken check-then-insert, for idem verify to catch\n");
}

int main(int argc, char **argv)
{
    char addr[300] = "127.0.0.1:9000";
    const char *db_path = "./refunds.db";
    struct evhttp *http = NULL;
    struct event *signals[2] = {NULL, NULL};
    int status = 1;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = argv[i + 1];   /* argv[argc] is NULL */
        bool ok = true;
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--naive") == 0) {
            naive = true;
        } else if (val && strcmp(arg, "--listen") == 0) {
            ok = snprintf(addr, sizeof addr, "%s", argv[++i]) < (int)sizeof addr;
        } else if (val && strcmp(arg, "--db") == 0) {
            db_path = argv[++i];
        } else if (val && strcmp(arg, "--delay-ms") == 0) {
            ok = (delay_ms = parse_long(argv[++i], 0, MAX_DELAY_MS)) >= 0;
        } else {
            ok = false;
        }
        if (!ok) {
            usage(stderr);
            return 2;
        }
    }

    char *colon = strrchr(addr, ':'), *host = addr;
    long port = colon ? parse_long(colon + 1, 0, 65535) : -1;
    if (port < 0) {
        fprintf(stderr, "refund_service: --listen wants HOST:PORT, got %s\n", addr);
        return 2;
    }
    *colon = '\0';

    signal(SIGPIPE, SIG_IGN);
    if (sqlite3_open(db_path, &db) != SQLITE_OK ||
        sqlite3_busy_timeout(db, 5000) != SQLITE_OK ||
        sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "refund_service: %s: %s\n", db_path, sqlite3_errmsg(db));
        goto out;
    }
    /* A file made before the rows kept their epoch: add the column (an
     * error here is the column being there already). */
    static const char *const tables[] = {"refunds", "refunds_naive", "payments"};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        char sql[80];
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN epoch INTEGER", tables[i]);
        sqlite3_exec(db, sql, NULL, NULL, NULL);
    }
    struct evhttp_bound_socket *bound = NULL;
    if (!(base = event_base_new()) || !(http = evhttp_new(base)) ||
        !(bound = evhttp_bind_socket_with_handle(http, host, (unsigned short)port))) {
        fprintf(stderr, "refund_service: cannot listen on %s:%ld\n", host, port);
        goto out;
    }
    evhttp_set_max_body_size(http, MAX_BODY);
    evhttp_set_max_headers_size(http, MAX_HEADERS);
    evhttp_set_gencb(http, on_request, NULL);
    for (int i = 0; i < 2; i++) {
        signals[i] = evsignal_new(base, i ? SIGINT : SIGTERM, on_signal, NULL);
        if (!signals[i] || evsignal_add(signals[i], NULL) != 0) {
            fprintf(stderr, "refund_service: cannot catch signals\n");
            goto out;
        }
    }

    struct sockaddr_storage sa;
    socklen_t salen = sizeof sa;
    if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&sa, &salen) == 0)
        port = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                              : ((struct sockaddr_in *)&sa)->sin_port);
    printf("refund_service: listening on %s:%ld\n", host, port);
    fflush(stdout);

    status = event_base_dispatch(base) < 0;

    /* Requests still waiting out their delay get a 503, which one last
     * non-blocking pass of the loop writes out. */
    struct pending *p;
    while ((p = LIST_FIRST(&waiting))) {
        LIST_REMOVE(p, link);
        reply_error(p->req, 503, "shutting down");
        pending_free(p);
    }
    event_base_loop(base, EVLOOP_NONBLOCK);
out:
    for (int i = 0; i < 2; i++)
        if (signals[i])
            event_free(signals[i]);
    if (http)
        evhttp_free(http);
    if (base)
        event_base_free(base);
    sqlite3_close(db);
    libevent_global_shutdown();
    return status;
}
