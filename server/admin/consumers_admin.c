/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumers_admin.c — POST consumers/{name}/redrive (consumers_admin.h).
 *
 * The redrive runs on the consumer's own loop, which holds its broker
 * connection (consume.c); the call waits for it there, and its tally
 * comes back to the request's loop to be answered.
 */
#include "admin/consumers_admin.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

#include "consume/consume.h"
#include "gateway/request_key.h"
#include "log.h"

struct redrive_call {
    struct api_call *c;
    struct event_base *base; /* the request's loop */
    char name[96];
    struct redrive_result res;
};

static void on_answer(evutil_socket_t fd, short what, void *arg)
{
    struct redrive_call *rc = arg;
    struct api_call *c = rc->c;
    const struct redrive_result *r = &rc->res;
    (void)fd;
    (void)what;
    if (r->error[0] && r->moved + r->done + r->kept == 0) {
        api_answer(c, problem(503, "redrive_failed", "consumer %s: nothing was redriven: %s",
                              rc->name, r->error));
        return;
    }
    json_t *j = json_pack("{s:s, s:I, s:I, s:I, s:I, s:b}", "consumer", rc->name, "moved",
                          (json_int_t)r->moved, "done", (json_int_t)r->done, "kept",
                          (json_int_t)r->kept, "left", (json_int_t)r->left, "complete",
                          !r->error[0]);
    if (j && r->error[0])
        json_object_set_new(j, "error", json_string(r->error));
    api_answer(c, j ? json_response(200, j) : NULL);
}

/* On the consumer's thread: the tally, to the request's loop. */
static void on_redriven(void *arg, const struct redrive_result *r)
{
    struct redrive_call *rc = arg;
    rc->res = *r;
    if (event_base_once(rc->base, -1, EV_TIMEOUT, on_answer, rc, NULL) != 0)
        daemon_log_about(LOG_ERROR, LOG_CONSUMER(rc->name),
                         "consumer %s: the redrive's answer was lost (out of memory); "
                         "its log line says what it did", rc->name);
}

void api_consumers_redrive(struct api_call *c)
{
    const char *rest = c->rest + strlen("consumers/");
    const char *slash = strchr(rest, '/');
    struct redrive_call *rc = calloc(1, sizeof *rc);
    if (!rc) {
        api_answer(c, NULL);
        return;
    }
    c->own = rc;
    rc->c = c;
    rc->base = ((struct daemon_loop *)c->req->loop_ctx)->base;
    if (!slash || request_pct_decode(rest, (size_t)(slash - rest), rc->name, sizeof rc->name, 0)) {
        api_answer(c, problem(400, "invalid_path",
                              "expected /_idem/v1/consumers/{name}/redrive, the name "
                              "percent-encoded"));
        return;
    }
    int64_t limit = api_int(c, "limit", 0, REDRIVE_LIMIT_DEFAULT);
    const char *reason = api_str(c, "reason", 0);
    if (!c->err && (limit < 1 || limit > REDRIVE_LIMIT_MAX))
        c->err = problem(400, "invalid_field", "field limit: 1 to %d dead letters, not %lld",
                         REDRIVE_LIMIT_MAX, (long long)limit);
    if (c->err) {
        api_answer(c, NULL);
        return;
    }
    struct consumers *cs = c->d->consumers;
    long i = consumers_find(cs, rc->name);
    if (i < 0) {
        char names[400] = "";
        for (size_t k = 0; k < consumers_count(cs); k++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", k ? ", " : "",
                     consumers_name(cs, k));
        api_answer(c, problem(404, "no_such_consumer", "no consumer %s here; %s", rc->name,
                              names[0] ? names : "this daemon runs none"));
        return;
    }
    if (consumers_redrive(cs, (size_t)i, (unsigned long)limit, reason, on_redriven, rc) != 0)
        api_answer(c, problem(503, "redrive_failed",
                              "consumer %s: the redrive could not start (out of memory, or "
                              "the consumer is stopping)", rc->name));
}
