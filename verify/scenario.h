/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scenario.h — the attack surfaces of DESIGN.md §1 as named scenarios: what
 * each is given (struct verify_cfg, filled from the command line by
 * verify.c), how it runs, and what it finds (struct scenario_result, which
 * report.c prints).
 */
#ifndef IDEM_VERIFY_SCENARIO_H
#define IDEM_VERIFY_SCENARIO_H

#include <stddef.h>
#include <stdint.h>

#include "count.h"
#include "exchange.h"
#include "template.h"
#include "url.h"

#define VERIFY_HEADERS_MAX 64
#define VERIFY_CHANNELS_MAX 16
#define VERIFY_REPLAY_HEADERS_MAX 16

enum scenario_id {
    SC_BURST,
    SC_DOUBLE_CLICK,
    SC_RETRY_AFTER_SUCCESS,
    SC_RETRY_AFTER_TIMEOUT,
    SC_CHANNELS,
    SC_PAYLOAD_MISMATCH,
    SC_CROSS_SUBJECT,
    SC_MIXED,
    SC_COUNT
};

/* A URL with its own body template (or the main one). */
struct endpoint {
    const char *text;       /* as given */
    struct vurl url;
    struct tpl target;      /* the URL's path and query */
    struct tpl own_body;
    const struct tpl *body; /* own_body, the main body, or NULL: none */
};

struct header_tpl {
    char *name;
    struct tpl value;
};

struct verify_cfg {
    /* The request template. */
    const char *method;
    struct endpoint main;
    struct tpl main_body;
    int has_body;
    struct header_tpl headers[VERIFY_HEADERS_MAX];
    size_t nheaders;
    int add_json_type; /* Content-Type: application/json, unless -H gave one */
    struct endpoint channels[VERIFY_CHANNELS_MAX];
    size_t nchannels;
    struct tpl mismatch_body;
    int has_mismatch_body;
    const char *subject_header;
    const char *subjects[2];
    const char *key_prefix;
    const char *token_scene; /* a token route's: a one-time token per business key */
    const char *replay_headers[VERIFY_REPLAY_HEADERS_MAX];
    size_t nreplay;

    /* Which scenarios, how big. */
    unsigned chosen; /* bit per scenario_id; 0: all that apply */
    int n;           /* requests per scenario (burst: exactly n at once) */
    int concurrency; /* mixed */
    int dups;        /* mixed: each key this many times */
    int retries;     /* retry-after-*: retries after the first request */
    int spacing_ms;  /* retry-after-success: pause between retries */
    int client_timeout_ms; /* retry-after-timeout: when the first client gives up */

    /* The truth, and the limits. */
    struct counter counter;
    int settle_ms;
    int timeout_ms;     /* per request */
    int64_t deadline_ms; /* the whole run */
    long max_requests;
};

/* One run of idem verify: what the scenarios share. */
struct verify_run {
    const struct verify_cfg *cfg;
    char id[17];             /* random, in every business key of the run */
    unsigned long long seq;  /* {{seq}} */
    long requests_left;      /* of --max-requests */
    int64_t deadline_us;     /* monotonic */
    struct xchg_ctx ctx;
    char err[600];           /* a fatal error: exit status 2 */
    /* --token-scene: the token issued for the last business key, which
     * its duplicates carry too, as a form's resubmissions do. */
    char token_key[128];
    char token[72];
};

enum verdict {
    VERDICT_PASS,
    VERDICT_FAIL,
    VERDICT_SKIP,
};

#define RESULT_STATUS_KINDS 12

struct status_tally {
    int status;
    size_t n;
};

struct scenario_result {
    const char *name;
    enum verdict verdict;
    char reason[600];
    char note[400];

    size_t sent, answered, timeouts, abandoned, errors;
    struct status_tally statuses[RESULT_STATUS_KINDS]; /* by status, ascending */
    size_t nstatuses, other_statuses;

    long long executions; /* counted, or inferred from the answers */
    long long expected;
    int counted;          /* executions came from the count source */
    size_t keys;          /* business keys (or subjects) used */
    size_t duplicates;    /* answers to repeated requests, compared with the first */
    size_t identical;     /* ...of which byte-identical (status and body) */
    size_t replayed;      /* answers with a replay header */
    double p50_ms, p90_ms, p99_ms, max_ms;
    double duration_ms, rps;
    char key[128];        /* the (first) business key used */
};

const char *scenario_name(int id);
int scenario_find(const char *name, size_t len); /* id, or -1 */

/* NULL when the scenario can run with cfg, else why not ("no --channel"). */
const char *scenario_not_applicable(const struct verify_cfg *cfg, int id);

/* How many requests it will send at most. */
long scenario_planned(const struct verify_cfg *cfg, int id);

/* Run one scenario and judge it. 0, or -1 on a fatal error (r->err): the
 * count could not be read, or the target stopped answering altogether. */
int scenario_run(struct verify_run *r, int id, struct scenario_result *res);

/* 16 random hex digits: the part of every business key that is this run's. */
void scenario_new_run_id(char out[17]);

/* The payload-mismatch body: body with one value changed (see the .c).
 * malloc()ed, or NULL when nothing could be changed; what says what. */
char *scenario_changed_body(const char *body, size_t len, const char *key, size_t *out_len,
                            char *what, size_t wlen);

#endif
