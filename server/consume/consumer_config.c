/* SPDX-License-Identifier: Apache-2.0 */
/*
 * consumer_config.c — reads consumers: of idem serve's configuration into
 * struct consumer_config (consumer_config.h): a queue or stream each (its
 * source, with the broker's URL and any password from the environment or a
 * file), its handler, its dead letter and retry backoff, and its route,
 * whose key and record fields are read as a route's are
 * (gateway/route_config.c), its messages being handled as a route's
 * requests are (consume.c). config.c calls in here after the routes, whose
 * names and spaces a consumer's must agree with.
 */
#include "consume/consumer_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "config_print.h"
#include "config_value.h"
#include "gateway/signature_config.h"
#include "gateway/states_config.h"

#define CONSUMERS_MAX 100

void config_consumers_free(struct consumer_config *consumers, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct consumer_config *k = &consumers[i];
        config_route_free(&k->route);
        free(k->url);
        config_secret_free(&k->url_src);
        free(k->queue);
        free(k->group);
        free(k->body_field);
        free(k->dead_letter);
    }
    free(consumers);
}

/* amqp://user:pass@host... with RabbitMQ's own guest:guest, which the
 * broker accepts from loopback only: not a secret, and the URL a newcomer
 * copies. */
static int guest_on_loopback(const char *url)
{
    static const char *const hosts[] = {"127.0.0.1", "localhost", "[::1]"};
    const char *p = url + 7;
    if (strncasecmp(url, "amqp://", 7) != 0 || strncmp(p, "guest:guest@", 12) != 0)
        return 0;
    p += 12;
    for (size_t i = 0; i < sizeof hosts / sizeof hosts[0]; i++) {
        size_t n = strlen(hosts[i]);
        if (strncmp(p, hosts[i], n) == 0 && (p[n] == ':' || p[n] == '/' || !p[n]))
            return 1;
    }
    return 0;
}

/* A broker's URL: written out (without a password, but guest:guest on
 * loopback), or { env: NAME } / { file: PATH }. */
static int get_broker_url(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          const char *scheme, char **dst, struct config_secret *src)
{
    static const char *const known[] = {"env", "file"};
    char buf[SECRET_MAX + 2];
    const char *s = buf;
    if (n->type == YAML_MAPPING_NODE) {
        if (config_get_secret(c, n, path, known, 2, buf, src))
            return -1;
    } else {
        if (config_scalar(c, n, path, "a URL", &s))
            return -1;
        if (strlen(s) > SECRET_MAX || config_has_control(s))
            return config_fail(c, n, path, "not a URL (longer than %d bytes, or a control "
                               "character)", SECRET_MAX);
        if (config_url_has_password(s) && !guest_on_loopback(s))
            return config_fail(c, n, path, "the URL holds a password: keep it out of this file "
                               "with { env: NAME } or { file: PATH }");
    }
    size_t sl = strlen(scheme);
    if (!strcmp(scheme, "redis")) {
        /* Read whole by the parser the consumer opens it with: its two
         * forms, redis:// and redis-sentinel:// (core/redis_url.h). */
        if (config_check_redis_url(c, n, path, s))
            return -1;
    } else if (strncasecmp(s, scheme, sl) != 0 || strncmp(s + sl, "://", 3) != 0 || !s[sl + 3]) {
        return config_fail(c, n, path, "%s is not a %s:// URL", n->type == YAML_MAPPING_NODE
                           ? "the secret" : config_quote(c, s), scheme);
    }
    return config_set_string(dst, s) ? config_oom(c) : 0;
}

/* A queue or stream name: 1 to 255 bytes, printable, no blanks. */
static int get_queue_name(struct config_ctx *c, const yaml_node_t *n, const char *path, char **dst)
{
    const char *s;
    if (config_scalar(c, n, path, "a queue or stream name", &s))
        return -1;
    size_t len = strlen(s);
    int bad = len == 0 || len > FIELD_MAX_LEN;
    for (size_t i = 0; i < len && !bad; i++)
        bad = (unsigned char)s[i] <= ' ' || s[i] == 0x7f;
    if (bad)
        return config_fail(c, n, path, "%s is not a queue or stream name (1 to 255 bytes, "
                           "no blanks or control characters)", config_quote(c, s));
    return config_set_string(dst, s) ? config_oom(c) : 0;
}

static int get_source(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      struct consumer_config *k)
{
    static const char *const known[] = {"amqp", "queue", "prefetch", "redis_stream",
                                        "stream", "group", "body_field"};
    char fpath[96];
    const yaml_node_t *v;
    uint64_t prefetch;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping like { amqp: \"amqp://…\", queue: "
                           "NAME } or { redis_stream: \"redis://…\", stream: NAME }, got %s",
                           config_kind_name(n));
    if (config_check_fields(c, n, path, known, sizeof known / sizeof known[0]))
        return -1;
    const yaml_node_t *amqp = config_field(c, n, "amqp"), *redis = config_field(c, n,
                                                                                "redis_stream");
    if (!amqp == !redis)
        return config_fail(c, n, path, "give exactly one of amqp: URL or redis_stream: URL");
    k->source = amqp ? SOURCE_AMQP : SOURCE_REDIS_STREAM;
    /* Each source's own fields; the other's are refused. */
    const char *own = amqp ? "queue" : "stream";
    const char *const *foreign = amqp ? (const char *const[]){"stream", "group", "body_field"}
                                      : (const char *const[]){"queue", NULL, NULL};
    for (int i = 0; i < 3; i++)
        if (foreign[i] && (v = config_field(c, n, foreign[i]))) {
            config_join(fpath, sizeof fpath, path, foreign[i]);
            return config_fail(c, v, fpath, "%s belongs to %s sources", foreign[i],
                               amqp ? "redis_stream" : "amqp");
        }
    config_join(fpath, sizeof fpath, path, amqp ? "amqp" : "redis_stream");
    if (get_broker_url(c, amqp ? amqp : redis, fpath, amqp ? "amqp" : "redis", &k->url,
                       &k->url_src))
        return -1;
    config_join(fpath, sizeof fpath, path, own);
    if (!(v = config_field(c, n, own)))
        return config_fail(c, n, path, "%s is required", own);
    if (get_queue_name(c, v, fpath, &k->queue))
        return -1;
    config_join(fpath, sizeof fpath, path, "prefetch");
    if ((v = config_field(c, n, "prefetch"))) {
        if (config_get_count(c, v, fpath, 1, 4096, &prefetch))
            return -1;
        k->prefetch = (size_t)prefetch;
    }
    config_join(fpath, sizeof fpath, path, "group");
    if ((v = config_field(c, n, "group")) && config_get_name(c, v, fpath, &k->group))
        return -1;
    config_join(fpath, sizeof fpath, path, "body_field");
    if ((v = config_field(c, n, "body_field")) && get_queue_name(c, v, fpath, &k->body_field))
        return -1;
    if (k->source == SOURCE_REDIS_STREAM &&
        ((!k->group && config_set_string(&k->group, "idem")) ||
         (!k->body_field && config_set_string(&k->body_field, "body"))))
        return config_oom(c);
    return 0;
}

static int get_dead_letter(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           struct consumer_config *k)
{
    static const char *const known[] = {"queue", "stream"};
    const char *want = k->source == SOURCE_AMQP ? "queue" : "stream";
    char fpath[96];
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping like { %s: NAME }, got %s", want,
                           config_kind_name(n));
    if (config_check_fields(c, n, path, known, 2))
        return -1;
    const yaml_node_t *v = config_field(c, n, want);
    if (!v || n->data.mapping.pairs.top - n->data.mapping.pairs.start != 1)
        return config_fail(c, n, path, "a %s source's dead letter is { %s: NAME }",
                           k->source == SOURCE_AMQP ? "amqp" : "redis_stream", want);
    config_join(fpath, sizeof fpath, path, want);
    if (get_queue_name(c, v, fpath, &k->dead_letter))
        return -1;
    if (!strcmp(k->dead_letter, k->queue))
        return config_fail(c, v, fpath, "the dead letter is the %s itself: its messages would "
                           "come back for ever", want);
    return 0;
}

static const char *const consumer_fields[] = {
    "name",  "source",  "key",   "space",           "handler",      "lease",
    "handler_timeout",  "max_attempts", "retry_backoff", "dead_letter", "fingerprint",
    "retention", "replay_headers", "signature", "states", "tombstone",
    "on_unknown_outcome", "resolve",
};

static int get_consumer(struct config_ctx *c, const yaml_node_t *n, const char *path,
                        struct server_config *cfg, size_t i)
{
    struct consumer_config *k = &cfg->consumers[i];
    struct route *r = &k->route;
    char fpath[96];
    const yaml_node_t *v;
    uint64_t attempts;
    if (config_route_defaults(r))
        return config_oom(c);
    r->upstream_timeout_ms = 10 * MS_SEC;
    r->max_attempts = 5;
    k->prefetch = 64;
    k->backoff_ms[0] = MS_SEC;
    k->backoff_ms[1] = 5 * MS_SEC;
    k->backoff_ms[2] = 30 * MS_SEC;
    k->backoff_count = 3;
    k->line = (unsigned long)n->start_mark.line + 1;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping (a consumer: name, source, key, "
                           "handler, ...), got %s", config_kind_name(n));
    if (config_check_fields(c, n, path, consumer_fields,
                            sizeof consumer_fields / sizeof consumer_fields[0]))
        return -1;
#define FIELD(fname) (config_join(fpath, sizeof fpath, path, fname), config_field(c, n, fname))
    if (!(v = FIELD("name")))
        return config_fail(c, n, path, "name is required");
    if (config_get_name(c, v, fpath, &r->name))
        return -1;
    /* One list of counters by name holds routes and consumers alike. */
    for (size_t j = 0; j < cfg->route_count; j++)
        if (!strcmp(r->name, cfg->routes[j].name))
            return config_fail(c, v, fpath, "%s is already the name of routes[%zu]; route and "
                               "consumer names must be unique", config_quote(c, r->name), j);
    for (size_t j = 0; j < i; j++)
        if (!strcmp(r->name, cfg->consumers[j].route.name))
            return config_fail(c, v, fpath, "%s is already the name of consumers[%zu] (line %lu); "
                               "names must be unique", config_quote(c, r->name), j,
                               cfg->consumers[j].line);
    if (!(v = FIELD("source")))
        return config_fail(c, n, path, "source is required (e.g. source: { amqp: "
                           "\"amqp://guest:guest@127.0.0.1:5672/%%2f\", queue: refund.result })");
    if (get_source(c, v, fpath, k))
        return -1;
    if (!(v = FIELD("handler")))
        return config_fail(c, n, path, "handler is required (e.g. handler: "
                           "http://127.0.0.1:9000/mq/refund-result): each message is POSTed there");
    if (config_get_upstream(c, v, fpath, &r->upstream))
        return -1;
    if (!(v = FIELD("key")))
        return config_fail(c, n, path, "key is required (e.g. key: { json: refund_no } or "
                           "key: { message_id: true })");
    if (config_get_key(c, v, fpath, r, 1) || config_get_record_fields(c, n, path, r, 1))
        return -1;
    if (config_get_unknown_outcome(c, n, path, r))
        return -1;
    if ((v = FIELD("handler_timeout")) &&
        config_get_duration(c, v, fpath, 1, MS_HOUR, &r->upstream_timeout_ms))
        return -1;
    if ((v = FIELD("max_attempts"))) {
        if (config_get_count(c, v, fpath, 1, 1000, &attempts))
            return -1;
        r->max_attempts = (unsigned)attempts;
    }
    if ((v = FIELD("retry_backoff")) &&
        config_get_durations(c, v, fpath, 10, MS_HOUR, k->backoff_ms, CONSUMER_BACKOFFS_MAX,
                             &k->backoff_count))
        return -1;
    if ((v = FIELD("signature")) && config_get_signature(c, v, fpath, &r->signature))
        return -1;
    if (config_check_resource_parts(c, n, path, r))
        return -1;
    if ((v = FIELD("dead_letter")) && get_dead_letter(c, v, fpath, k))
        return -1;
    if (!k->dead_letter) {
        size_t len = strlen(k->queue);
        if (len + 5 > FIELD_MAX_LEN)
            return config_fail(c, n, path, "the %s's name is too long to add .dead to: give "
                               "dead_letter", k->source == SOURCE_AMQP ? "queue" : "stream");
        if (!(k->dead_letter = malloc(len + 6)))
            return config_oom(c);
        memcpy(k->dead_letter, k->queue, len);
        memcpy(k->dead_letter + len, ".dead", 6);
    }
#undef FIELD
    /* What a consumer's route is, whatever the file says: POST to the
     * handler, the record layer alone (no client to hold a token; the
     * in-process claims keep a key to one delivery at a time), an answer
     * in flight refused (the consumer comes back to it later). A 5xx, 408,
     * 425 or 429 releases the claim so that the next attempt runs (unless
     * it was the last); any other answer is the handler's last word, and a
     * 4xx among them fails the message (it is dead-lettered). */
    config_route_keep_default(r, 0);
    r->fails_from = 400;
    if (config_set_string(&r->method, "POST") || config_set_string(&r->path, "") ||
        config_set_string(&r->token_scene, r->name))
        return config_oom(c);
    return 0;
}

/* A space a route and a consumer share must build its keys one way, and
 * their fingerprints must agree: one payment's callback and its message
 * are one request. */
static int check_shared_space(struct config_ctx *c, const yaml_node_t *n, const char *path,
                              const struct server_config *cfg, const struct route *r)
{
    for (size_t j = 0; j < cfg->route_count; j++) {
        const struct route *o = &cfg->routes[j];
        char fpath[96];
        if (strcmp(o->space, r->space) != 0)
            continue;
        config_join(fpath, sizeof fpath, path, "space");
        if (o->scope_subject || o->key_parts != r->key_parts)
            return config_fail(c, n, fpath, "\"%s\", as routes[%zu] (%s, %zu key part%s) and this "
                               "consumer (global, %zu key part%s): one space's keys are built one "
                               "way; give them one key shape, or spaces of their own",
                               r->space, j, o->scope_subject ? "scope: subject" : "scope: global",
                               o->key_parts, o->key_parts == 1 ? "" : "s", r->key_parts,
                               r->key_parts == 1 ? "" : "s");
        char other[32];
        config_pathf(other, sizeof other, "routes[%zu]", j);
        if (config_check_states_shared(c, n, path, r->space, r->states, o->states, other))
            return -1;
        if (o->fingerprint == FINGERPRINT_BODY || r->fingerprint == FINGERPRINT_BODY)
            return config_fail(c, n, fpath, "\"%s\", as routes[%zu]: a route's fingerprint: body "
                               "covers its method and path, which a message has not, so the two "
                               "would never agree (422); give both fingerprint: none or the same "
                               "list of JSON fields", r->space, j);
    }
    return 0;
}

int config_read_consumers(struct config_ctx *c, const yaml_node_t *n, struct server_config *cfg)
{
    yaml_node_item_t *it = NULL;
    size_t count = 0;
    char path[40];
    if (config_list_items(c, n, "consumers", "a list of consumers", &it, &count))
        return -1;
    if (count > CONSUMERS_MAX)
        return config_fail(c, n, "consumers", "%zu consumers; at most %d", count, CONSUMERS_MAX);
    if (count == 0)
        return 0;
    if (!(cfg->consumers = calloc(count, sizeof *cfg->consumers)))
        return config_oom(c);
    cfg->consumer_count = count;
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *kn = config_node(c, it[i]);
        config_pathf(path, sizeof path, "consumers[%zu]", i);
        if (get_consumer(c, kn, path, cfg, i) ||
            check_shared_space(c, kn, path, cfg, &cfg->consumers[i].route))
            return -1;
        for (size_t j = 0; j < i; j++) {
            const struct route *a = &cfg->consumers[i].route, *b = &cfg->consumers[j].route;
            char fpath[64], other[32];
            config_pathf(other, sizeof other, "consumers[%zu]", j);
            if (!strcmp(a->space, b->space) &&
                config_check_states_shared(c, kn, path, a->space, a->states, b->states, other))
                return -1;
            if (strcmp(a->space, b->space) != 0 || a->key_parts == b->key_parts)
                continue;
            config_join(fpath, sizeof fpath, path, "space");
            return config_fail(c, kn, fpath, "\"%s\", as consumers[%zu], with %zu key parts there "
                               "and %zu here: one space's keys are built one way", a->space, j,
                               b->key_parts, a->key_parts);
        }
    }
    return 0;
}

static void print_consumer(struct config_out *o, const struct consumer_config *k)
{
    const struct route *r = &k->route;
    int amqp = k->source == SOURCE_AMQP;
    config_put_item(o);
    config_put_str(o, 4, "name", r->name);
    config_put_key(o, 4, "source");
    config_put_url(o, 6, amqp ? "amqp" : "redis_stream", k->url, &k->url_src);
    config_put_str(o, 6, amqp ? "queue" : "stream", k->queue);
    if (!amqp) {
        config_put_str(o, 6, "group", k->group);
        config_put_str(o, 6, "body_field", k->body_field);
    }
    config_put_count(o, 6, "prefetch", k->prefetch);
    config_put_upstream(o, 4, "handler", &r->upstream);
    config_print_key(o, 4, r, 1);
    config_print_record_fields(o, 4, r, 1);
    config_print_unknown_outcome(o, 4, r);
    config_put_duration(o, 4, "handler_timeout", r->upstream_timeout_ms);
    config_put_count(o, 4, "max_attempts", r->max_attempts);
    config_put_durations(o, 4, "retry_backoff", k->backoff_ms, k->backoff_count);
    if (r->signature)
        config_print_signature(o, 4, r->signature);
    config_put_key(o, 4, "dead_letter");
    config_put_str(o, 6, amqp ? "queue" : "stream", k->dead_letter);
}

void config_print_consumers(struct config_out *o, const struct server_config *cfg)
{
    config_put_list(o, 0, "consumers", cfg->consumer_count);
    for (size_t i = 0; i < cfg->consumer_count; i++)
        print_consumer(o, &cfg->consumers[i]);
}
