/* SPDX-License-Identifier: Apache-2.0 */
/*
 * request_key.c — business keys and fingerprints of gateway requests
 * (daemon).
 *
 * The key must come from the business, not the channel: the same payment
 * reaching two routes (a channel callback, an operator's re-push) must give
 * the same key. So a key is built only from the values it names, each part
 * escaped ('%' and '/' percent-encoded) and joined with '/', prefixed by the
 * escaped subject when the route is scoped per subject — "alice/R-1" can
 * never be produced by another subject, and no two part lists give the same
 * key.
 */
#include "gateway/request_key.h"

#include <jansson.h>
#include <openssl/crypto.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "gateway/json_scan.h"
#include "gateway/wechatpay_resource.h"
#include "gateway/states_config.h"
#include "http/http_parser.h"
#include "put.h"

size_t request_path(const char *target, char *out, size_t cap)
{
    size_t len = strcspn(target, "?#"), n = len < cap ? len : cap - 1;
    memcpy(out, target, n);
    out[n] = '\0';
    return len;
}

int request_pct_encode(const char *s, char *out, size_t cap, size_t *o)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                    (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (*o + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            out[(*o)++] = (char)*p;
        } else {
            out[(*o)++] = '%';
            out[(*o)++] = hex[*p >> 4];
            out[(*o)++] = hex[*p & 15];
        }
    }
    return 0;
}

int request_pct_decode(const char *s, size_t n, char *out, size_t cap, int plus_is_space)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi = i + 1 < n ? http_hex_value((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < n ? http_hex_value((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            c = hi * 16 + lo;
            i += 2;
            if (c == 0)
                return -1; /* it would end the string: "R-1%00A" read as "R-1" */
        } else if (c == '+' && plus_is_space) {
            c = ' ';
        } else if (c == 0) {
            return -1; /* a form body's NUL, as %00 */
        }
        if (o + 1 >= cap)
            return -1;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return 0;
}

/* The value of field name in n bytes of form-encoded s (a query, or a
 * form body: name=value&name=value), decoded. 1 found, 0 not, -1
 * malformed, -2 given more than once (which one the upstream takes cannot
 * be told, so neither is a key). */
static int form_value(const char *s, size_t n, const char *name, char *out, size_t cap)
{
    size_t nlen = strlen(name);
    int found = 0;
    for (const char *p = s, *stop = s + n; p < stop;) {
        const char *amp = memchr(p, '&', (size_t)(stop - p));
        const char *end = amp ? amp : stop;
        const char *eq = memchr(p, '=', (size_t)(end - p));
        const char *kend = eq ? eq : end;
        char k[256];
        if (request_pct_decode(p, (size_t)(kend - p), k, sizeof k, 1) == 0 && strlen(k) == nlen &&
            memcmp(k, name, nlen) == 0) {
            if (found)
                return -2;
            found = 1;
            if (request_pct_decode(eq ? eq + 1 : end, eq ? (size_t)(end - eq - 1) : 0, out, cap,
                                   1) != 0)
                return -1;
        }
        if (!amp)
            break;
        p = amp + 1;
    }
    return found;
}

/* The value of query parameter name in target (see form_value). */
static int query_param(const char *target, const char *name, char *out, size_t cap)
{
    const char *q = strchr(target, '?');
    return q ? form_value(q + 1, strcspn(q + 1, "#"), name, out, cap) : 0;
}

/* Segment n (1-based) of the path, decoded. 1 found, 0 not, -1 malformed. */
static int path_segment(const char *target, int n, char *out, size_t cap)
{
    char path[8192];
    request_path(target, path, sizeof path);
    const char *p = path;
    for (int i = 1; *p; i++) {
        if (*p == '/')
            p++;
        size_t len = strcspn(p, "/");
        if (i == n)
            return len == 0 ? 0 : request_pct_decode(p, len, out, cap, 0) == 0 ? 1 : -1;
        p += len;
    }
    return 0;
}

/* The value at a dotted path ("payer.account"), or NULL. */
static json_t *json_path(json_t *root, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s", name);
    json_t *v = root;
    for (char *save = NULL, *part = strtok_r(path, ".", &save); part && v;
         part = strtok_r(NULL, ".", &save))
        v = json_is_object(v) ? json_object_get(v, part) : NULL;
    return v;
}

/* A member on the way to name ("payer.account") spelt in another case,
 * or NULL: an upstream that reads JSON names whatever their case (ASP.NET
 * Core's web defaults do) may take its value instead of the one at name. */
static const char *json_path_alike(json_t *root, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s", name);
    json_t *v = root;
    for (char *save = NULL, *part = strtok_r(path, ".", &save); part && json_is_object(v);
         part = strtok_r(NULL, ".", &save)) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            if (strcasecmp(k, part) == 0 && strcmp(k, part) != 0)
                return k;
        }
        v = json_object_get(v, part);
    }
    return NULL;
}

int request_json_field(json_t *root, const char *name, char *out, size_t cap)
{
    json_t *v = json_path(root, name);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        if (json_string_length(v) >= cap)
            return -1;
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
        return 1;
    }
    if (json_is_integer(v)) {
        snprintf(out, cap, "%lld", (long long)json_integer_value(v));
        return 1;
    }
    return -1;
}

static const char *source_name(enum key_source s)
{
    switch (s) {
    case KEY_HEADER: return "header";
    case KEY_JSON: return "JSON field";
    case KEY_QUERY: return "query parameter";
    case KEY_FORM: return "form field";
    case KEY_WECHATPAY_RESOURCE: return "WeChat Pay resource field";
    case KEY_PATH_SEGMENT: return "path segment";
    }
    return "?";
}

/* Append s escaped to key at *len; -1 when over IDEM_KEY_MAX. */
static int append_escaped(char *key, size_t *len, const char *s)
{
    for (; *s; s++) {
        const char *esc = *s == '%' ? "%25" : *s == '/' ? "%2F" : NULL;
        size_t n = esc ? 3 : 1;
        if (*len + n > IDEM_KEY_MAX)
            return -1;
        memcpy(key + *len, esc ? esc : s, n);
        *len += n;
    }
    key[*len] = '\0';
    return 0;
}

__attribute__((format(printf, 5, 6))) static int bad(const char **type, const char *t,
                                                     char *detail, size_t dlen,
                                                     const char *fmt, ...)
{
    va_list ap;
    *type = t;
    va_start(ap, fmt);
    vsnprintf(detail, dlen, fmt, ap);
    va_end(ap);
    return 400;
}

int request_subject(const struct http_msg *m, const char *header, const char **subject,
                    char *detail, size_t dlen)
{
    *subject = http_msg_header(m, header);
    size_t n = http_msg_header_alike_count(m, header);
    if (n <= 1 && (n == 0 || *subject))
        return 0;
    /* Twice, or once spelt otherwise (X_Subject), which a CGI-style
     * upstream reads as the subject while Idem would not. */
    snprintf(detail, dlen, "the subject header %s is given %zu times (counting spellings with "
             "'_' for '-'): which one is the subject cannot be told", header, n);
    return 400;
}

/* ---- the Idempotency-Key header ----
 *
 * A Structured Field Item whose bare item is an sf-string (RFC 8941, as
 * draft-ietf-httpapi-idempotency-key-header defines it): "abc", with \"
 * and \\ the only escapes, printable ASCII inside, then parameters
 * (;a=1;b), which are checked and ignored. A bare token (what many
 * clients send) is taken as it is, so that "abc" and abc are one key. */

/* A quoted string at p (on its '"'): its content to out (cap bytes, out
 * NULL: only checked); the end past the closing quote, or NULL with why. */
static const char *sf_quoted(const char *p, char *out, size_t cap, const char **why)
{
    size_t o = 0;
    for (p++;; p++) {
        unsigned char ch = (unsigned char)*p;
        if (!ch) {
            *why = "it opens a quoted string (a Structured Field sf-string) and does not "
                   "close it";
            return NULL;
        }
        if (ch == '"')
            break;
        if (ch == '\\') {
            ch = (unsigned char)*++p;
            if (ch != '"' && ch != '\\') {
                *why = "a backslash in a quoted string escapes only \" and \\";
                return NULL;
            }
        } else if (ch < 0x20 || ch > 0x7e) {
            *why = "a quoted string holds printable ASCII only";
            return NULL;
        }
        if (out) {
            if (o + 1 >= cap) {
                *why = "it is too long";
                return NULL;
            }
            out[o++] = (char)ch;
        }
    }
    if (out)
        out[o] = '\0';
    return p + 1;
}

static int lcalpha(char c)
{
    return c >= 'a' && c <= 'z';
}

static int digit(char c)
{
    return c >= '0' && c <= '9';
}

/* A parameter's bare item at p (RFC 8941 3.3): an integer or decimal, a
 * string, a token, a byte sequence or a boolean. Its end, or NULL. */
static const char *sf_bare_item(const char *p, const char **why)
{
    if (*p == '"')
        return sf_quoted(p, NULL, 0, why);
    if (*p == '-' || digit(*p)) {
        p += *p == '-';
        size_t whole = strspn(p, "0123456789"), frac = 0;
        p += whole;
        if (*p == '.') {
            frac = strspn(p + 1, "0123456789");
            p += 1 + frac;
        }
        if (whole && (frac ? whole <= 12 && frac <= 3 : whole <= 15 && p[-1] != '.'))
            return p;
    } else if (*p == '?') {
        if (p[1] == '0' || p[1] == '1')
            return p + 2;
    } else if (*p == ':') {
        p += 1 + strspn(p + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                               "0123456789+/=");
        if (*p == ':')
            return p + 1;
    } else if ((*p >= 'A' && *p <= 'Z') || lcalpha(*p) || *p == '*') {
        for (p++; *p && (http_is_token(p, 1) || *p == ':' || *p == '/'); p++)
            ;
        return p;
    }
    *why = "a parameter's value is not a Structured Field bare item (an integer, a "
           "decimal, a string, a token, a byte sequence or a boolean)";
    return NULL;
}

/* in (the field's value, trimmed, on its '"') to out (cap bytes): 0, or
 * -1 with why. */
static int sf_string(const char *in, char *out, size_t cap, const char **why)
{
    const char *p = sf_quoted(in, out, cap, why);
    while (p && *p == ';') {
        for (p++; *p == ' '; p++)
            ;
        if (!lcalpha(*p) && *p != '*') {
            *why = "a parameter after the quoted string does not start with a name (a "
                   "lower-case letter or '*')";
            return -1;
        }
        p += strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_-.*");
        if (*p == '=')
            p = sf_bare_item(p + 1, why);
    }
    if (p && *p) {
        *why = "something follows the quoted string (one sf-string, with parameters as "
               ";name=value, is the key)";
        return -1;
    }
    return p ? 0 : -1;
}

/* What the parts of one request read, parsed once for every part that
 * needs it: the JSON body, and a WeChat Pay notification's resource,
 * decrypted with the route's APIv3 key. */
struct parts {
    const struct route *rt;
    json_t *body;
    json_t *resource;
};

static void parts_done(struct parts *p)
{
    json_decref(p->body);
    json_decref(p->resource);
}

/* The decrypted resource of p's request, as JSON: 0, or 400 (key_invalid)
 * with detail. */
static int resource_of(struct parts *p, const struct http_msg *m, const char **type,
                       char *detail, size_t dlen)
{
    if (p->resource)
        return 0;
    char *plain = NULL, why[256];
    size_t len = 0;
    json_error_t err;
    if (wechatpay_resource(p->rt->signature, m, &plain, &len, why, sizeof why) != 0)
        return bad(type, "key_invalid", detail, dlen, "%s", why);
    p->resource = json_loadb(plain, len, JSON_REJECT_DUPLICATES, &err);
    OPENSSL_cleanse(plain, len);
    free(plain);
    if (!p->resource)
        return bad(type, "key_invalid", detail, dlen,
                   "the WeChat Pay resource decrypts to no JSON object: %s", err.text);
    return 0;
}

/* The value of one key part (or a states field) of m into value (cap
 * bytes): 0, or 400 with type and detail, which call the value noun. */
static int part_value(const struct key_part *kp, const struct http_msg *m, struct parts *p,
                      char *value, size_t cap, const char *noun, const char **type,
                      char *detail, size_t dlen)
{
    int found = 0;
    json_t **body = &p->body;
    switch (kp->source) {
    case KEY_HEADER: {
        const char *v = http_msg_header(m, kp->name);
        found = v && *v;
        if (found)
            found = http_msg_header_alike_count(m, kp->name) > 1 ? -2
                    : strlen(v) < cap                                ? (strcpy(value, v), 1)
                                                                     : -1;
        const char *why = "it is not a structured-field string"; /* each failure sets its own */
        if (found == 1 && value[0] == '"' && strcasecmp(kp->name, "Idempotency-Key") == 0 &&
            sf_string(v, value, cap, &why) != 0)
            return bad(type, "key_invalid", detail, dlen,
                       "the Idempotency-Key header is not a valid key: %s", why);
        found = found == 1 && !value[0] ? 0 : found; /* "": no key */
        break;
    }
    case KEY_JSON:
        /* The scan answers most bodies without a tree (json_scan.h); the
         * full parse answers the rest, with its own words for what is
         * wrong. */
        if (!*body && (found = json_scan_field(m->body, m->body_len, kp->name, value,
                                              cap)) != JSON_SCAN_UNSURE)
            break;
        if (!*body) {
            json_error_t err;
            *body = json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, &err);
            if (!*body && json_error_code(&err) == json_error_duplicate_key) {
                return bad(type, "key_invalid", detail, dlen,
                           "the %s is the JSON field %s, and the body gives one member "
                           "twice (%s): which value counts cannot be told",
                           noun, kp->name, err.text);
            }
            if (!*body && json_error_code(&err) == json_error_numeric_overflow) {
                /* JSON, but not all of it can be read exactly. */
                return bad(type, "key_invalid", detail, dlen,
                           "the %s is the JSON field %s, and the body holds a number "
                           "Idem cannot read exactly (an integer past 9223372036854775807 "
                           "or below its negative, or a real past a double's range): %s",
                           noun, kp->name, err.text);
            }
            if (!*body) {
                return bad(type, "key_missing", detail, dlen,
                           "the %s is the JSON field %s, and the body is not JSON: %s",
                           noun, kp->name, err.text);
            }
        }
        {
            const char *alike = json_path_alike(*body, kp->name);
            if (alike) {
                return bad(type, "key_invalid", detail, dlen,
                           "the %s is the JSON field %s, and the body also has a member "
                           "%s: an upstream that reads names whatever their case may "
                           "take either, so which value counts cannot be told",
                           noun, kp->name, alike);
            }
        }
        found = request_json_field(*body, kp->name, value, cap);
        break;
    case KEY_QUERY:
        found = query_param(m->target, kp->name, value, cap);
        break;
    case KEY_FORM:
        found = m->body ? form_value(m->body, m->body_len, kp->name, value, cap) : 0;
        break;
    case KEY_PATH_SEGMENT:
        found = path_segment(m->target, kp->segment, value, cap);
        break;
    case KEY_WECHATPAY_RESOURCE: {
        int status = resource_of(p, m, type, detail, dlen);
        if (status)
            return status;
        found = request_json_field(p->resource, kp->name, value, cap);
        break;
    }
    }
    /* The part's name, for the details below. */
    char segment[16];
    const char *name = kp->name;
    if (kp->source == KEY_PATH_SEGMENT) {
        *put_uint(segment, (unsigned)kp->segment) = '\0';
        name = segment;
    }
    if (found == 0)
        return bad(type, "key_missing", detail, dlen, "the %s is missing: expected the %s %s",
                   noun, source_name(kp->source), name);
    if (found == -2)
        return bad(type, "key_invalid", detail, dlen,
                   "the %s %s is given more than once: which one is the %s cannot be told",
                   source_name(kp->source), name, noun);
    if (found < 0 || !*value)
        return bad(type, "key_invalid", detail, dlen,
                   "the %s %s is not a usable %s (a non-empty string or integer)",
                   source_name(kp->source), name, noun);
    for (const unsigned char *c = (const unsigned char *)value; *c; c++)
        if (*c < 0x20 || *c == 0x7f)
            return bad(type, "key_invalid", detail, dlen, "the %s %s contains a control character",
                       source_name(kp->source), name);
    return 0;
}

int request_key(const struct route *rt, const struct http_msg *m, const char *subject, char *key,
                const char **type, char *detail, size_t dlen)
{
    size_t len = 0;
    struct parts parts = {.rt = rt};
    int status = 0;
    key[0] = '\0';
    /* A subject is checked as the stores take it, since the token layer
     * hands it to the token store as is, whatever the scope (said here, not
     * taken for a bad token), and a subject scope puts it in the key.
     * idem_check_key's detail begins "key". */
    if ((rt->scope_subject || rt->layer_token) && subject && *subject &&
        idem_check_key(subject) != IDEM_OK) {
        status = bad(type, "subject_invalid", detail, dlen, "the subject header%s",
                     idem_errdetail() + 3);
        goto out;
    }
    if (rt->scope_subject) {
        if (!subject || !*subject) {
            status = bad(type, "subject_missing", detail, dlen,
                         "route %s is scoped per subject, and the request has no subject",
                         rt->name);
            goto out;
        }
        if (append_escaped(key, &len, subject) || len + 1 > IDEM_KEY_MAX) {
            status = bad(type, "key_invalid", detail, dlen, "the subject is too long");
            goto out;
        }
        key[len++] = '/';
        key[len] = '\0';
    }
    for (size_t i = 0; i < rt->key_parts; i++) {
        char value[IDEM_KEY_MAX * 3 + 1];
        if ((status = part_value(&rt->key[i], m, &parts, value, sizeof value,
                                 "idempotency key", type, detail, dlen)) != 0)
            goto out;
        if (i > 0) {
            if (len + 1 > IDEM_KEY_MAX)
                goto too_long;
            key[len++] = '/';
            key[len] = '\0';
        }
        if (append_escaped(key, &len, value))
            goto too_long;
    }
    /* The rest of what a key must be (UTF-8 text), as the store checks it. */
    if (idem_check_key(key) != IDEM_OK)
        status = bad(type, "key_invalid", detail, dlen, "the idempotency %s",
                     idem_errdetail());
    goto out;
too_long:
    status = bad(type, "key_invalid", detail, dlen, "the idempotency key is longer than %d bytes",
                 IDEM_KEY_MAX);
out:
    parts_done(&parts);
    return status;
}

int request_state(const struct route *rt, const struct http_msg *m, char *out, size_t cap,
                  char *detail, size_t dlen)
{
    const struct route_states *st = rt->states;
    const char *type = NULL;
    char value[IDEM_KEY_MAX * 3 + 1];
    struct parts parts = {.rt = rt};
    int status = part_value(&st->field, m, &parts, value, sizeof value, "state", &type, detail,
                            dlen);
    parts_done(&parts);
    if (status != 0)
        return 422;
    if (!idem_machine_has(st->machine, value) || strlen(value) >= cap) {
        snprintf(detail, dlen, "%.64s%s is not a state of route %s (its states start at %s)",
                 value, strlen(value) > 64 ? "..." : "", rt->name,
                 idem_machine_initial(st->machine));
        return 422;
    }
    memcpy(out, value, strlen(value) + 1);
    return 0;
}

int request_fingerprint(const struct route *rt, const struct http_msg *m,
                        uint8_t fp[IDEM_FINGERPRINT_LEN], int *has, char *detail, size_t dlen)
{
    *has = 0;
    if (rt->fingerprint == FINGERPRINT_NONE)
        return 0;
    if (rt->fingerprint == FINGERPRINT_BODY) {
        /* The method, the target with its query (a parameter there is as
         * much the request as the body is), and the body. */
        size_t mlen = strlen(m->method), tlen = strcspn(m->target, "#");
        size_t n = mlen + 1 + tlen + 1 + m->body_len;
        char small[4096];
        char *buf = n <= sizeof small ? small : malloc(n);
        if (!buf) {
            snprintf(detail, dlen, "out of memory");
            return 503;
        }
        char *o = buf;
        memcpy(o, m->method, mlen);
        o[mlen] = '\n';
        o += mlen + 1;
        memcpy(o, m->target, tlen);
        o[tlen] = '\n';
        o += tlen + 1;
        if (m->body_len)
            memcpy(o, m->body, m->body_len);
        idem_rc rc = idem_fingerprint(buf, n, fp);
        if (buf != small)
            free(buf);
        if (rc != IDEM_OK) {
            snprintf(detail, dlen, "%s", idem_errdetail());
            return 503;
        }
        *has = 1;
        return 0;
    }
    /* FINGERPRINT_FIELDS: the listed fields' canonical JSON, in order, and
     * nothing else: routes that share a space reach us on other paths. */
    json_error_t err;
    json_t *body = json_loadb(m->body, m->body_len, JSON_REJECT_DUPLICATES, &err);
    if (!body) {
        snprintf(detail, dlen, "the fingerprint uses JSON fields, and the body is not JSON%s: %s",
                 json_error_code(&err) == json_error_duplicate_key
                     ? " with each member once (which value counts cannot be told)"
                 : json_error_code(&err) == json_error_numeric_overflow
                     ? " Idem can read exactly (a number is past 9223372036854775807 or a double's range)"
                     : "",
                 err.text);
        return 400;
    }
    json_t *canon = json_array();
    for (size_t i = 0; canon && i < rt->fingerprint_field_count; i++) {
        json_t *v = json_path(body, rt->fingerprint_fields[i]);
        json_array_append(canon, v ? v : json_null());
    }
    char *text = canon ? json_dumps(canon, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY) : NULL;
    json_decref(canon);
    json_decref(body);
    if (!text) {
        snprintf(detail, dlen, "out of memory");
        return 503;
    }
    idem_fingerprint(text, strlen(text), fp);
    free(text);
    *has = 1;
    return 0;
}
