/* SPDX-License-Identifier: Apache-2.0 */
/*
 * machine.c — the business's own state machine (record layer).
 *
 * A machine is a small acyclic graph of named states, at most 64, kept as
 * bit sets: next[i] holds the states one move from i, reach[i] those one or
 * more moves from i. Sealing computes reach and checks the graph once; after
 * that every question (is T ahead of C, behind it, or neither?) is two bit
 * tests, read-only, from any thread.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/str.h"
#include "record_state.h"

struct idem_machine {
    unsigned n;
    int sealed;
    char names[IDEM_MACHINE_STATES_MAX][IDEM_STEP_NAME_MAX + 1];
    uint64_t next[IDEM_MACHINE_STATES_MAX];
    uint64_t reach[IDEM_MACHINE_STATES_MAX];
};

idem_rc idem__check_step_name(const char *s, const char *what)
{
    if (!s || !*s)
        return idem__fail(IDEM_EINVAL, "%s: empty", what);
    size_t n = strlen(s);
    if (n > IDEM_STEP_NAME_MAX)
        return idem__fail(IDEM_EINVAL, "%s: %zu bytes, at most %d", what, n,
                          IDEM_STEP_NAME_MAX);
    for (const char *p = s; *p; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
              (*p >= '0' && *p <= '9') || *p == '_' || *p == '.' || *p == '-'))
            return idem__fail(IDEM_EINVAL, "%s: byte 0x%02x at %zu is not one of [A-Za-z0-9_.-]",
                              what, (unsigned char)*p, (size_t)(p - s));
    return IDEM_OK;
}

static int index_of(const idem_machine *m, const char *state)
{
    for (unsigned i = 0; i < m->n; i++)
        if (strcmp(m->names[i], state) == 0)
            return (int)i;
    return -1;
}

static idem_rc add_state(idem_machine *m, const char *state, const char *what, int *at)
{
    idem_rc rc = idem__check_step_name(state, what);
    if (rc != IDEM_OK)
        return rc;
    if ((*at = index_of(m, state)) >= 0)
        return IDEM_OK;
    if (m->n == IDEM_MACHINE_STATES_MAX)
        return idem__fail(IDEM_EFULL, "machine: %s would be state %d, at most %d", state,
                          IDEM_MACHINE_STATES_MAX + 1, IDEM_MACHINE_STATES_MAX);
    idem__copy(m->names[m->n], sizeof m->names[m->n], state);
    *at = (int)m->n++;
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_machine_new(const char *initial, idem_machine **out)
{
    idem__clear_detail();
    if (!out)
        return idem__fail(IDEM_EINVAL, "out: NULL out-parameter");
    *out = NULL;
    idem_rc rc = idem__check_step_name(initial, "initial");
    if (rc != IDEM_OK)
        return rc;
    idem_machine *m = idem__calloc(1, sizeof *m);
    if (!m)
        return idem__fail(IDEM_ENOMEM, "machine: no memory");
    idem__copy(m->names[0], sizeof m->names[0], initial);
    m->n = 1;
    *out = m;
    return IDEM_OK;
}

IDEM_EXTERN idem_rc idem_machine_allow(idem_machine *m, const char *from, const char *to)
{
    idem__clear_detail();
    if (!m)
        return idem__fail(IDEM_EINVAL, "machine: NULL");
    if (m->sealed)
        return idem__fail(IDEM_EINVAL, "machine: sealed, no move may be added");
    int f, t;
    idem_rc rc;
    if ((rc = add_state(m, from, "from", &f)) != IDEM_OK ||
        (rc = add_state(m, to, "to", &t)) != IDEM_OK)
        return rc;
    m->next[f] |= 1ull << t;
    return IDEM_OK;
}

/* Depth first from i: reach[i], or a cycle through the states on the
 * path (mark 1: on the path; 2: done). */
static int visit(idem_machine *m, unsigned i, unsigned char *mark, unsigned *path,
                 unsigned depth)
{
    mark[i] = 1;
    path[depth] = i;
    for (unsigned j = 0; j < m->n; j++) {
        if (!(m->next[i] >> j & 1))
            continue;
        if (mark[j] == 1) {
            char cycle[512] = "";
            size_t at = 0;
            unsigned k = 0;
            while (path[k] != j)
                k++;
            for (; k <= depth && at < sizeof cycle; k++)
                at += (size_t)snprintf(cycle + at, sizeof cycle - at, "%s -> ",
                                       m->names[path[k]]);
            if (at < sizeof cycle)
                snprintf(cycle + at, sizeof cycle - at, "%s", m->names[j]);
            idem__fail(IDEM_EINVAL,
                       "machine: a cycle, %s; the moves must not come back to a state, "
                       "or an event could be both ahead and behind",
                       cycle);
            return -1;
        }
        if (mark[j] == 0 && visit(m, j, mark, path, depth + 1) < 0)
            return -1;
        m->reach[i] |= m->reach[j] | 1ull << j;
    }
    mark[i] = 2;
    return 0;
}

IDEM_EXTERN idem_rc idem_machine_seal(idem_machine *m)
{
    idem__clear_detail();
    if (!m)
        return idem__fail(IDEM_EINVAL, "machine: NULL");
    if (m->sealed)
        return IDEM_OK;
    unsigned char mark[IDEM_MACHINE_STATES_MAX] = {0};
    unsigned path[IDEM_MACHINE_STATES_MAX];
    memset(m->reach, 0, sizeof m->reach);
    for (unsigned i = 0; i < m->n; i++)
        if (mark[i] == 0 && visit(m, i, mark, path, 0) < 0)
            return IDEM_EINVAL;
    if (!m->next[0])
        return idem__fail(IDEM_EINVAL, "machine: the initial state %s has no move out of it",
                          m->names[0]);
    for (unsigned i = 1; i < m->n; i++)
        if (!(m->reach[0] >> i & 1))
            return idem__fail(IDEM_EINVAL,
                              "machine: %s cannot be reached from the initial state %s "
                              "(a misspelt state?)",
                              m->names[i], m->names[0]);
    m->sealed = 1;
    return IDEM_OK;
}

IDEM_EXTERN void idem_machine_free(idem_machine *m)
{
    idem__free(m);
}

IDEM_EXTERN int idem_machine_has(const idem_machine *m, const char *state)
{
    return m && state && index_of(m, state) >= 0;
}

IDEM_EXTERN const char *idem_machine_initial(const idem_machine *m)
{
    return m ? m->names[0] : "";
}

IDEM_EXTERN idem_step_relation idem_machine_relation(const idem_machine *m, const char *from,
                                                     const char *to)
{
    if (!m || !m->sealed || !from || !to)
        return IDEM_STEP_UNKNOWN;
    int f = index_of(m, from), t = index_of(m, to);
    if (f < 0 || t < 0)
        return IDEM_STEP_UNKNOWN;
    if (f == t)
        return IDEM_STEP_SAME;
    if (m->reach[f] >> t & 1)
        return IDEM_STEP_AHEAD;
    if (m->reach[t] >> f & 1)
        return IDEM_STEP_BEHIND;
    return IDEM_STEP_APART;
}

IDEM_EXTERN int idem_machine_equal(const idem_machine *a, const idem_machine *b)
{
    if (!a || !b || a->n != b->n || strcmp(a->names[0], b->names[0]) != 0)
        return 0;
    int map[IDEM_MACHINE_STATES_MAX];
    for (unsigned i = 0; i < a->n; i++)
        if ((map[i] = index_of(b, a->names[i])) < 0)
            return 0;
    for (unsigned i = 0; i < a->n; i++)
        for (unsigned j = 0; j < a->n; j++)
            if ((a->next[i] >> j & 1) != (b->next[map[i]] >> map[j] & 1))
                return 0;
    return 1;
}
