/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redrive.c — `idem consume --redrive NAME`: a client of the running
 * daemon's JSON API (POST /_idem/v1/consumers/{name}/redrive), on the
 * admin listener its configuration names, with the write key the
 * environment gives (IDEM_API_KEY). The daemon does the redrive, on the
 * consumer's own loop: this only asks and says what came of it.
 */
#include "redrive.h"

#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "config.h"
#include "exchange.h"
#include "gateway/request_key.h"
#include "url.h"

#define REDRIVE_TIMEOUT_MS (10 * 60 * 1000) /* a long redrive is answered when over */

static void redrive_usage(FILE *out)
{
    fputs("usage: idem consume --redrive NAME [-c FILE] [--limit N] [--reason REASON]\n"
          "                    [--cacert FILE]\n"
          "(the write key in IDEM_API_KEY; idem consume --help says more)\n",
          out);
}

/* The admin listener of cfg as where u goes: its unix socket, or
 * http(s)://host:port. 0, or -1 with err. */
static int admin_url(const struct server_config *cfg, const char *target, struct vurl *u,
                     char *err, size_t errlen)
{
    char text[600];
    if (cfg->admin_unix) {
        struct sockaddr_un *sa = (struct sockaddr_un *)&u->addr;
        memset(u, 0, sizeof *u);
        if (strlen(cfg->admin_unix) >= sizeof sa->sun_path) {
            snprintf(err, errlen, "admin_listen: unix:%s is too long a path", cfg->admin_unix);
            return -1;
        }
        sa->sun_family = AF_UNIX;
        snprintf(sa->sun_path, sizeof sa->sun_path, "%s", cfg->admin_unix);
        u->addrlen = sizeof *sa;
        u->port = 80;
        snprintf(u->host, sizeof u->host, "localhost");
        snprintf(u->authority, sizeof u->authority, "localhost");
        return (u->target = strdup(target)) ? 0 : (snprintf(err, errlen, "out of memory"), -1);
    }
    int v6 = strchr(cfg->admin_host, ':') != NULL;
    snprintf(text, sizeof text, "%s://%s%s%s:%d%s", cfg->admin_tls.cert ? "https" : "http",
             v6 ? "[" : "", cfg->admin_host, v6 ? "]" : "", cfg->admin_port, target);
    return vurl_parse(text, u, err, errlen) != 0 || vurl_resolve(u, err, errlen) != 0 ? -1 : 0;
}

/* What the answer says, on stdout (or the problem's detail on stderr).
 * The exit status: 0 complete, 1 not. */
static int report(const char *name, const struct shot *s)
{
    json_t *j = s->body ? json_loadb(s->body, s->body_len, 0, NULL) : NULL;
    int rc = 1;
    if (s->status == 200 && json_is_object(j)) {
        json_t *error = json_object_get(j, "error");
        printf("idem consume: redrive of %s: %lld moved back, %lld done already, %lld kept, "
               "%lld left on the dead letter%s%s\n",
               name, json_integer_value(json_object_get(j, "moved")),
               json_integer_value(json_object_get(j, "done")),
               json_integer_value(json_object_get(j, "kept")),
               json_integer_value(json_object_get(j, "left")),
               error ? "; stopped short: " : "", error ? json_string_value(error) : "");
        rc = json_is_true(json_object_get(j, "complete")) ? 0 : 1;
    } else if (s->status) {
        const char *detail = json_string_value(json_object_get(j, "detail"));
        fprintf(stderr, "idem consume: redrive of %s: %d %s\n", name, s->status,
                detail ? detail : "(no detail)");
    } else {
        fprintf(stderr, "idem consume: redrive of %s: %s (is the daemon running?)\n", name,
                s->error);
    }
    json_decref(j);
    return rc;
}

int redrive_main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"redrive", required_argument, NULL, 'r'},
        {"limit", required_argument, NULL, 'n'},
        {"reason", required_argument, NULL, 'R'},
        {"cacert", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL, *name = NULL, *reason = NULL, *cacert = NULL;
    long limit = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'r': name = optarg; break;
        case 'R': reason = optarg; break;
        case 'a': cacert = optarg; break;
        case 'n':
            limit = strtol(optarg, &end, 10);
            if (*end || limit < 1 || limit > 100000) {
                fprintf(stderr, "idem consume: --limit: 1 to 100000 dead letters, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case 'h': redrive_usage(stdout); return 0;
        default: redrive_usage(stderr); return 2;
        }
    }
    if (optind < argc || !name) {
        redrive_usage(stderr);
        return 2;
    }
    const char *key = getenv("IDEM_API_KEY");
    if (!key || !*key) {
        fprintf(stderr, "idem consume: --redrive asks the running daemon, with a write key of "
                        "its api_keys in IDEM_API_KEY, which is not set\n");
        return 2;
    }
    char err[512] = "out of memory";
    struct server_config *cfg = NULL;
    int bad = config_path ? config_load(config_path, &cfg, err, sizeof err) != 0
                          : !(cfg = config_default()) || config_finish(cfg, err, sizeof err) != 0;
    if (bad) {
        /* The defaults finished as a file's are: admin_listen's socket. */
        fprintf(stderr, "idem consume: %s\n", err);
        config_free(cfg);
        return 2;
    }
    json_t *body = json_object();
    if (limit)
        json_object_set_new(body, "limit", json_integer(limit));
    if (reason)
        json_object_set_new(body, "reason", json_string(reason));
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    /* The name in the path, percent-encoded. */
    char target[400] = "/_idem/v1/consumers/";
    size_t o = strlen(target);
    int too_long = request_pct_encode(name, target, sizeof target - strlen("/redrive"), &o);
    snprintf(target + o, sizeof target - o, "/redrive");
    struct vurl u;
    memset(&u, 0, sizeof u);
    int rc = 1;
    char auth[600];
    snprintf(auth, sizeof auth, "Bearer %s", key);
    struct xchg_header h[] = {{"Authorization", auth}, {"Content-Type", "application/json"}};
    if (!text || too_long) {
        fprintf(stderr, "idem consume: --redrive: %s\n", text ? "a name that long is no consumer's"
                                                              : "out of memory");
        rc = 2;
    } else if (admin_url(cfg, target, &u, err, sizeof err) != 0 ||
               (u.tls && xchg_tls_init(cacert, NULL, NULL, err, sizeof err) != 0)) {
        fprintf(stderr, "idem consume: %s\n", err);
        rc = 2;
    } else {
        struct shot s = {.url = &u, .timeout_ms = REDRIVE_TIMEOUT_MS};
        struct xchg_ctx x = {.deadline_us = xchg_now_us() + (int64_t)REDRIVE_TIMEOUT_MS * 1000};
        s.request = xchg_build("POST", &u, target, h, 2, text, strlen(text), 1, &s.request_len);
        if (s.request) {
            xchg_shot(&x, &s);
            rc = report(name, &s);
        }
        shot_clear(&s);
    }
    memset(auth, 0, sizeof auth);
    free(text);
    vurl_free(&u);
    xchg_tls_free();
    config_free(cfg);
    return rc;
}
