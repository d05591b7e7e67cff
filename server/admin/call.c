/* SPDX-License-Identifier: Apache-2.0 */
/*
 * call.c — what every endpoint of the JSON API shares (call.h): the answer,
 * the body's fields, the outcome and record shapes.
 */
#include "admin/call.h"

#include <stdlib.h>
#include <string.h>

#include "base64.h"

void api_answer(struct api_call *c, struct http_response *r)
{
    struct front_request *req = c->req;
    struct live_config *lc = c->lc;
    if (!r) {
        r = c->err; /* the field refused, if one was */
        c->err = NULL;
    }
    json_decref(c->body);
    response_free(c->err);
    free(c->own);
    free(c);
    daemon_answer(lc, req, r);
}

struct http_response *api_outcome(idem_outcome o, json_t *extra)
{
    json_t *j = extra ? extra : json_object();
    if (j)
        json_object_set_new(j, "outcome", json_string(idem_outcome_name(o)));
    return json_response(200, j);
}

const char *api_str(struct api_call *c, const char *name, int required)
{
    json_t *v = json_object_get(c->body, name);
    if (!v || json_is_null(v)) {
        if (required && !c->err)
            c->err = problem(400, "invalid_field", "field %s: required (a string)", name);
        return NULL;
    }
    if (!json_is_string(v)) {
        if (!c->err)
            c->err = problem(400, "invalid_field", "field %s: must be a string", name);
        return NULL;
    }
    return json_string_value(v);
}

int64_t api_int(struct api_call *c, const char *name, int required, int64_t dflt)
{
    json_t *v = json_object_get(c->body, name);
    if (!v || json_is_null(v)) {
        if (required && !c->err)
            c->err = problem(400, "invalid_field", "field %s: required (an integer)", name);
        return dflt;
    }
    if (!json_is_integer(v)) {
        if (!c->err)
            c->err = problem(400, "invalid_field", "field %s: must be an integer", name);
        return dflt;
    }
    return json_integer_value(v);
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
    char *out = malloc(BASE64_LEN(len) + 1);
    if (!out)
        return;
    base64_encode(data, len, out);
    json_object_set_new(j, "result_base64", json_string(out));
    free(out);
}

json_t *api_record_json(const idem_record *r)
{
    json_t *j = json_pack("{s:s, s:I, s:s, s:I, s:I, s:I}", "state", r->state, "epoch",
                          (json_int_t)r->epoch, "owner", r->owner, "lease_until_ms",
                          (json_int_t)r->lease_until_ms, "created_ms", (json_int_t)r->created_ms,
                          "updated_ms", (json_int_t)r->updated_ms);
    if (j && r->expires_ms)
        json_object_set_new(j, "expires_ms", json_integer(r->expires_ms));
    /* A key with states (docs/states.md): its moves, oldest first, and the
     * answer kept with its current state as the result. */
    idem_step_view v;
    if (j && r->result_len && idem_record_steps(r, &v) == IDEM_OK) {
        json_t *steps = json_array();
        for (unsigned i = 0; steps && i < v.count; i++)
            json_array_append_new(steps, json_pack("{s:s, s:I, s:I}", "state", v.steps[i].state,
                                                   "at_ms", (json_int_t)v.steps[i].at_ms,
                                                   "epoch", (json_int_t)v.steps[i].epoch));
        json_object_set_new(j, "steps", steps);
        put_result(j, v.result, v.result_len);
        return j;
    }
    if (j)
        put_result(j, r->result, r->result_len);
    return j;
}
