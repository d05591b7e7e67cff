/* SPDX-License-Identifier: Apache-2.0 */
/*
 * http_parser.h — an incremental, strict HTTP/1.1 message parser with
 * explicit limits, for requests (what clients send to idem serve) and
 * responses (what upstreams answer).
 *
 * Strict because Idem sits in front of services that trust it: anything a
 * request-smuggling attack or a sloppy client could make two parsers read
 * differently is refused, with the status to answer and a detail.
 *
 * Usage:
 *   struct http_parser p;
 *   http_parser_init(&p, HTTP_PARSE_REQUEST, &limits);
 *   for each chunk read:
 *       size_t used;
 *       switch (http_parser_feed(&p, data, len, &used)) { ... }
 *       (unconsumed bytes, data + used, belong to the next message)
 *   on HTTP_DONE: struct http_msg *m = http_parser_take(&p); ... http_msg_free(m);
 *                 then http_parser_reset(&p) for the next message on the
 *                 connection, and feed the rest of the data
 *   on EOF from the peer: http_parser_eof(&p) (a response delimited by close
 *                 completes there)
 *   http_parser_free(&p) when the connection goes.
 */
#ifndef IDEM_SERVER_HTTP_PARSER_H
#define IDEM_SERVER_HTTP_PARSER_H

#include <stddef.h>
#include <stdint.h>

enum http_parse_mode {
    HTTP_PARSE_REQUEST,
    HTTP_PARSE_RESPONSE,
};

struct http_limits {
    size_t request_line_max; /* method + target + version; over: 414 */
    size_t header_count_max; /* over: 431 */
    size_t header_bytes_max; /* all header lines together; over: 431 */
    size_t body_max;         /* decoded body bytes; over: 413 */
};

struct http_header {
    char *name;  /* as received; compare case-insensitively */
    char *value; /* leading and trailing whitespace removed; in name's block */
    size_t name_len;
};

struct http_msg {
    /* requests */
    char *method; /* "POST" */
    char *target; /* "/refunds?x=1" as received (origin-form) */
    /* responses */
    int status;   /* 100..599 */
    char *reason;
    /* both */
    int version_minor;     /* HTTP/1.<minor>: 0 or 1 */
    struct http_header *headers;
    size_t header_count;
    char *body;            /* NUL-terminated for convenience; may contain NULs */
    size_t body_len;
    int keep_alive;        /* the connection may carry another message */
    int chunked;           /* the body came chunked */
    /* The parser's (NULL in a message built by hand): where the strings
     * above live; see http_parser.c, "Decisions a caller must know". */
    struct http_block *blocks;
};

enum http_parse_status {
    HTTP_NEED_MORE = 0, /* all input consumed; feed more */
    HTTP_DONE = 1,      /* a whole message: take it */
    HTTP_ERROR = -1,    /* malformed or over a limit: see error_status */
};

struct http_parser {
    /* Set on HTTP_ERROR: the status to answer (400, 413, 414, 431, 501,
     * 505; in response mode 502, or 413 for a body over body_max and 431
     * for a head over the field limits) and what was wrong, for the problem
     * detail. */
    int error_status;
    char error_detail[160];

    /* Response mode only: set before feeding when the request was HEAD (a
     * response to HEAD, and any 1xx, 204 or 304, has no body). */
    int response_to_head;

    /* Request mode: set when an HTTP/1.1 request's head is whole, it has
     * "Expect: 100-continue", and its body is still to come: the caller
     * sends "100 Continue" (a client may wait for it before the body) and
     * clears the flag. Cleared by http_parser_reset(). */
    int expect_continue;

    /* private */
    enum http_parse_mode mode;
    struct http_limits limits;
    int state;
    struct http_msg *msg;
    char *line;     /* the line being assembled */
    size_t line_len, line_cap;
    size_t header_bytes;
    int64_t content_length; /* -1: none */
    int have_te;
    uint64_t chunk_left;
    size_t body_cap;
    size_t field_count; /* header and trailer lines so far (one budget) */
    int blank_lines;    /* empty lines skipped before the request line */
    /* Every allocation the parser makes goes through this (NULL: realloc);
     * what it returns must be free()-able. Tests set it after init to fail
     * allocations; reset keeps it. */
    void *(*realloc_fn)(void *ptr, size_t size);
};

void http_parser_init(struct http_parser *p, enum http_parse_mode mode,
                      const struct http_limits *limits);
/* Start the next message on the same connection. */
void http_parser_reset(struct http_parser *p);
void http_parser_free(struct http_parser *p);

/* Consume up to len bytes; *used says how many were consumed (on HTTP_DONE,
 * the bytes after the message are not consumed). After HTTP_ERROR the
 * parser must not be fed again. Out of memory is HTTP_ERROR with 500. */
enum http_parse_status http_parser_feed(struct http_parser *p, const char *data,
                                        size_t len, size_t *used);

/* The peer closed. HTTP_DONE if that completes a message (a response whose
 * body runs to the close); HTTP_NEED_MORE if no message had begun (a clean
 * close between messages); HTTP_ERROR if a message was cut short. */
enum http_parse_status http_parser_eof(struct http_parser *p);

/* A message has begun (some of it was fed): a close now cuts it short. */
int http_parser_in_message(const struct http_parser *p);

/* The head is whole and the body is being read. */
int http_parser_in_body(const struct http_parser *p);

/* After HTTP_DONE: the message, now the caller's. */
struct http_msg *http_parser_take(struct http_parser *p);

/* What has been read of a message so far, for a log line about one that
 * was refused (HTTP_ERROR) or cut short: its method and target, NULL
 * until read, and the header fields read whole. Still the parser's; NULL
 * before a message began. */
const struct http_msg *http_parser_partial(const struct http_parser *p);
void http_msg_free(struct http_msg *m);
/* The body, NUL-terminated, as a heap block that is now the caller's
 * (free() it), *len its length; the message is left without one. NULL
 * when out of memory (the message keeps its body then). */
char *http_msg_take_body(struct http_msg *m, size_t *len);

/* The first header with this name (case-insensitive), or NULL. */
const char *http_msg_header(const struct http_msg *m, const char *name);
/* How many headers have this name. */
size_t http_msg_header_count(const struct http_msg *m, const char *name);

/* The same header name to a CGI-style upstream (PHP, Rack, WSGI), which
 * folds case and takes '_' for '-': X_Subject is X-Subject there. */
int http_name_alike(const char *a, const char *b);
/* How many headers have a name alike to this one. */
size_t http_msg_header_alike_count(const struct http_msg *m, const char *name);

/* s[0..len) is a token (RFC 9110 §5.6.2: a method, a header name): not empty. */
int http_is_token(const char *s, size_t len);
/* s[0..len) is what the parser takes in a header value: HTAB, SP, visible
 * ASCII and obs-text, no other control character. */
int http_is_field_text(const char *s, size_t len);

/* The value of a hexadecimal digit, or -1 (chunk sizes, %-escapes). */
int http_hex_value(unsigned char c);

/* Hop-by-hop headers (RFC 9110 §7.6.1, plus the names listed in the
 * message's own Connection header): never forwarded, never stored. */
int http_is_hop_by_hop(const struct http_msg *m, const char *name);

/* A header a stored answer may keep and a replay send: not hop-by-hop for
 * m (NULL: by its name alone), and not Content-Length, which is computed for
 * each reply (both also spelt with '_'). */
int http_is_replayable_name(const struct http_msg *m, const char *name);

#endif
