/* SPDX-License-Identifier: Apache-2.0 */
/*
 * steps.c — what a stepped record keeps in its result (record layer).
 *
 * The stores know a record's result as bytes; a stepped record's are a
 * document and then the answer kept with its current state:
 *
 *   "IDS1"                    4 bytes, the document's mark and version
 *   count                     1 byte, 1..IDEM_STEPS_KEPT moves, oldest first
 *   count times:
 *     len, name               1 byte, then len bytes: the state moved to
 *     at_ms                   8 bytes, big-endian: when
 *     epoch                   8 bytes, big-endian: the claim that moved it
 *   the answer                the rest, 0 or more bytes
 *
 * The last move's state is the key's current state. A claim of a move
 * keeps the document as it is (the state it came from), so that a claim
 * given up, or taken over after a crash, still knows it.
 */
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/str.h"
#include "record_state.h"

#define MARK "IDS1"
#define MARK_LEN 4

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

/* Parse the document of (b, len) into v; the answer's offset in *body.
 * -1 when it is not one. */
static int parse(const unsigned char *b, size_t len, idem_step_view *v, size_t *body)
{
    memset(v, 0, sizeof *v);
    if (!b || len < MARK_LEN + 1 || memcmp(b, MARK, MARK_LEN) != 0)
        return -1;
    size_t at = MARK_LEN;
    unsigned count = b[at++];
    if (count == 0 || count > IDEM_STEPS_KEPT)
        return -1;
    for (unsigned i = 0; i < count; i++) {
        if (at >= len)
            return -1;
        size_t n = b[at++];
        if (n == 0 || n > IDEM_STEP_NAME_MAX || len - at < n + 16)
            return -1;
        memcpy(v->steps[i].state, b + at, n);
        v->steps[i].state[n] = '\0';
        if (strlen(v->steps[i].state) != n)
            return -1;
        at += n;
        v->steps[i].at_ms = (int64_t)get64(b + at);
        v->steps[i].epoch = get64(b + at + 8);
        at += 16;
    }
    v->count = count;
    memcpy(v->state, v->steps[count - 1].state, sizeof v->state);
    *body = at;
    if (at < len) {
        v->result = b + at;
        v->result_len = len - at;
    }
    return 0;
}

IDEM_EXTERN idem_rc idem_record_steps(const idem_record *rec, idem_step_view *v)
{
    idem__clear_detail();
    if (!v)
        return idem__fail(IDEM_EINVAL, "v: NULL out-parameter");
    size_t body;
    if (!rec || parse(rec->result, rec->result_len, v, &body) < 0) {
        memset(v, 0, sizeof *v);
        return idem__fail(IDEM_EINVAL, "record: its result is not a stepped record's");
    }
    return IDEM_OK;
}

const char *idem__steps_current(const idem_record *rec, const idem_machine *m, char *buf)
{
    idem_step_view v;
    size_t body;
    if (parse(rec->result, rec->result_len, &v, &body) < 0)
        return idem_machine_initial(m);
    idem__copy(buf, IDEM_NAME_MAX + 1, v.state);
    return buf;
}

idem_rc idem__steps_compose(const idem_record *rec, const char *to, int64_t at_ms,
                            uint64_t epoch, const void *result, size_t len, void **out,
                            size_t *out_len)
{
    idem_step_view v;
    size_t body;
    if (parse(rec->result, rec->result_len, &v, &body) < 0)
        v.count = 0;
    unsigned keep = v.count < IDEM_STEPS_KEPT ? v.count : IDEM_STEPS_KEPT - 1;
    unsigned first = v.count - keep;
    size_t need = MARK_LEN + 1 + len;
    for (unsigned i = first; i < v.count; i++)
        need += 1 + strlen(v.steps[i].state) + 16;
    need += 1 + strlen(to) + 16;
    unsigned char *b = idem__malloc(need);
    if (!b)
        return idem__fail(IDEM_ENOMEM, "records: no memory for a step's document");
    size_t at = 0;
    memcpy(b, MARK, MARK_LEN);
    at += MARK_LEN;
    b[at++] = (unsigned char)(keep + 1);
    for (unsigned i = first; i <= v.count; i++) {
        const char *name = i < v.count ? v.steps[i].state : to;
        size_t n = strlen(name);
        b[at++] = (unsigned char)n;
        memcpy(b + at, name, n);
        at += n;
        put64(b + at, i < v.count ? (uint64_t)v.steps[i].at_ms : (uint64_t)at_ms);
        put64(b + at + 8, i < v.count ? v.steps[i].epoch : epoch);
        at += 16;
    }
    if (len)
        memcpy(b + at, result, len);
    *out = b;
    *out_len = at + len;
    return IDEM_OK;
}
