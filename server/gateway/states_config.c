/* SPDX-License-Identifier: Apache-2.0 */
/*
 * states_config.c — a route's or consumer's states: section
 * (states_config.h). The machine is built and checked by the record layer
 * (idem_machine_seal): a cycle, an initial state with no way out and a
 * state nothing reaches are refused here, at load, with the file's line.
 */
#include "gateway/states_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_print.h"

void route_states_free(struct route_states *s)
{
    if (!s)
        return;
    free(s->field.name);
    idem_machine_free(s->machine);
    for (size_t i = 0; i < s->move_count; i++) {
        free(s->moves[i].from);
        free(s->moves[i].to);
    }
    free(s->moves);
    free(s);
}

int route_states_same(const struct route_states *a, const struct route_states *b)
{
    if (!a || !b)
        return !a && !b;
    return idem_machine_equal(a->machine, b->machine);
}

/* A business state's name; the record layer checks what it may be. */
static int get_state(struct config_ctx *c, const yaml_node_t *n, const char *path,
                     const char **out)
{
    return config_scalar(c, n, path, "a state's name", out);
}

/* from -> to into s->moves, unless it is there already. 0, or -1 out of
 * memory. */
static int keep_move(struct route_states *s, const char *from, const char *to)
{
    for (size_t i = 0; i < s->move_count; i++)
        if (!strcmp(s->moves[i].from, from) && !strcmp(s->moves[i].to, to))
            return 0;
    struct state_move *m = realloc(s->moves, (s->move_count + 1) * sizeof *m);
    if (!m)
        return -1;
    s->moves = m;
    m = &s->moves[s->move_count];
    if (!(m->from = strdup(from)) || !(m->to = strdup(to))) {
        free(m->from);
        return -1;
    }
    s->move_count++;
    return 0;
}

/* transitions: { FROM: [TO, ...], ... } into s->machine and s->moves. */
static int get_transitions(struct config_ctx *c, const yaml_node_t *n, const char *path,
                           struct route_states *s)
{
    idem_machine *m = s->machine;
    char fpath[192], ipath[208];
    if (n->type != YAML_MAPPING_NODE || n->data.mapping.pairs.start == n->data.mapping.pairs.top)
        return config_fail(c, n, path, "expected a mapping of moves, FROM: [TO, ...], like "
                           "{ CREATED: [PROCESSING, SUCCESS, FAILED], PROCESSING: [SUCCESS, "
                           "FAILED] }");
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        const yaml_node_t *kn = config_node(c, p->key), *vn = config_node(c, p->value);
        const char *from;
        if (get_state(c, kn, path, &from))
            return -1;
        config_join(fpath, sizeof fpath, path, from);
        if (vn->type != YAML_SEQUENCE_NODE)
            return config_fail(c, vn, fpath, "expected a list of the states %s moves to, like "
                               "[SUCCESS, FAILED], got %s", from, config_kind_name(vn));
        yaml_node_item_t *it = vn->data.sequence.items.start;
        size_t count = (size_t)(vn->data.sequence.items.top - it);
        if (count == 0)
            return config_fail(c, vn, fpath, "an empty list: a state with no move out of it "
                               "is one no key leaves, and needs no entry");
        for (size_t i = 0; i < count; i++) {
            const yaml_node_t *tn = config_node(c, it[i]);
            const char *to;
            config_pathf(ipath, sizeof ipath, "%s[%zu]", fpath, i);
            if (get_state(c, tn, ipath, &to))
                return -1;
            idem_rc rc = idem_machine_allow(m, from, to);
            if (rc == IDEM_ENOMEM || (rc == IDEM_OK && keep_move(s, from, to)))
                return config_oom(c);
            if (rc != IDEM_OK) { /* "from: ...", "to: ..." or "machine: ..." */
                const char *why = idem_errdetail();
                if (strncmp(why, "from: ", 6) == 0)
                    return config_fail(c, kn, path, "%s: %s", from, why + 6);
                return config_fail(c, tn, ipath, "%s",
                                   strncmp(why, "to: ", 4) == 0 ? why + 4 : why + 9);
            }
        }
    }
    return 0;
}

int config_get_states(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      int for_consumer, struct route_states **out)
{
    static const char *const fields[] = {"field", "initial", "transitions"};
    char fpath[160];
    const yaml_node_t *v;
    const char *initial;
    if (n->type != YAML_MAPPING_NODE)
        return config_fail(c, n, path, "expected a mapping: { field: { json: status }, initial: "
                           "CREATED, transitions: { CREATED: [SUCCESS, FAILED] } }, got %s",
                           config_kind_name(n));
    if (config_check_fields(c, n, path, fields, 3))
        return -1;
    struct route_states *s = calloc(1, sizeof *s);
    if (!s)
        return config_oom(c);
    *out = s;
    config_join(fpath, sizeof fpath, path, "field");
    if (!(v = config_field(c, n, "field")))
        return config_fail(c, n, path, "field is required: the key part that names the state "
                           "a request moves its key to, like { json: status }");
    if (config_get_key_part(c, v, fpath, &s->field, for_consumer))
        return -1;
    config_join(fpath, sizeof fpath, path, "initial");
    if (!(v = config_field(c, n, "initial")))
        return config_fail(c, n, path, "initial is required: the state of a key that has no "
                           "record yet, like CREATED");
    if (get_state(c, v, fpath, &initial))
        return -1;
    idem_rc rc = idem_machine_new(initial, &s->machine);
    if (rc == IDEM_ENOMEM)
        return config_oom(c);
    if (rc != IDEM_OK)
        return config_fail(c, v, fpath, "%s", idem_errdetail());
    config_join(fpath, sizeof fpath, path, "transitions");
    if (!(v = config_field(c, n, "transitions")))
        return config_fail(c, n, path, "transitions is required: the moves, FROM: [TO, ...]");
    if (get_transitions(c, v, fpath, s))
        return -1;
    if (idem_machine_seal(s->machine) != IDEM_OK)
        return config_fail(c, v, fpath, "%s", idem_errdetail() + strlen("machine: "));
    return 0;
}

void config_print_states(struct config_out *o, int indent, const struct route_states *s,
                         int for_consumer)
{
    config_put_key(o, indent, "states");
    config_put_key(o, indent + 2, "field");
    config_print_key_part(o, indent + 4, &s->field, for_consumer);
    config_put_str(o, indent + 2, "initial", idem_machine_initial(s->machine));
    config_put_key(o, indent + 2, "transitions");
    /* Each state the moves leave, once, at its first move: FROM: [TO, ...]. */
    for (size_t i = 0; i < s->move_count; i++) {
        const char *from = s->moves[i].from;
        size_t j = 0;
        while (j < i && strcmp(s->moves[j].from, from) != 0)
            j++;
        if (j < i)
            continue;
        fprintf(o->f, "%*s", indent + 4, "");
        config_put_quoted(o->f, from);
        fputs(": [", o->f);
        for (size_t k = i, n = 0; k < s->move_count; k++)
            if (!strcmp(s->moves[k].from, from)) {
                fputs(n++ ? ", " : "", o->f);
                config_put_quoted(o->f, s->moves[k].to);
            }
        fputs("]\n", o->f);
    }
}

int config_check_states_shared(struct config_ctx *c, const yaml_node_t *n, const char *path,
                               const char *space, const struct route_states *here,
                               const struct route_states *there, const char *there_name)
{
    char fpath[160];
    if (route_states_same(here, there))
        return 0;
    config_join(fpath, sizeof fpath, path, here ? "states" : "space");
    return config_fail(c, n, fpath, "\"%s\", the space of %s too, %s: one space's keys move "
                       "through one machine, or a key could be SUCCESS for one and new for the "
                       "other; give both the same states, or spaces of their own",
                       space, there_name,
                       here && there ? "whose states are other ones"
                       : here        ? "which has no states"
                                     : "which has states");
}
