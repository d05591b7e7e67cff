/* SPDX-License-Identifier: Apache-2.0 */
/*
 * states_config.h — a route's or consumer's states: section: the business's
 * state machine for its space's keys (idem_machine, idem.h) and the key
 * part that names the state a request moves its key to.
 */
#ifndef IDEM_SERVER_GATEWAY_STATES_CONFIG_H
#define IDEM_SERVER_GATEWAY_STATES_CONFIG_H

#include "config_value.h"
#include "gateway/key_part.h"
#include "idem.h"

/* One move of a machine, FROM -> TO. */
struct state_move {
    char *from, *to;
};

struct route_states {
    struct key_part field; /* where the target state is */
    idem_machine *machine; /* sealed */
    /* The moves, each once, in the order the file gives them: the machine
     * keeps bit sets, which do not say it (the configuration printed back). */
    struct state_move *moves;
    size_t move_count;
};

/* states: { field, initial, transitions } in n, into *out (malloc'd;
 * route_states_free). 0, or -1 having said why, with file:line. */
int config_get_states(struct config_ctx *c, const yaml_node_t *n, const char *path,
                      int for_consumer, struct route_states **out);
void route_states_free(struct route_states *s);
/* states: as config_get_states reads it back, at indent. */
struct config_out;
void config_print_states(struct config_out *o, int indent, const struct route_states *s,
                         int for_consumer);
/* 1 if a and b move keys alike: both without states, or the same machine. */
int route_states_same(const struct route_states *a, const struct route_states *b);

/* A route or consumer with states here, and one with states there (named
 * there_name: "routes[2]"), sharing space: they must have the same states,
 * or none. 0, or -1 having said so at n's path. */
int config_check_states_shared(struct config_ctx *c, const yaml_node_t *n, const char *path,
                               const char *space, const struct route_states *here,
                               const struct route_states *there, const char *there_name);

#endif
