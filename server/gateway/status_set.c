/* SPDX-License-Identifier: Apache-2.0 */
/*
 * status_set.c — a list of HTTP statuses read from the configuration
 * (status_set.h): a route's store_statuses, a resolver's executed and
 * not_executed; and printed back.
 */
#include "gateway/status_set.h"

#include <stdio.h>
#include <string.h>

#include "config_print.h"

int config_get_status_set(struct config_ctx *c, const yaml_node_t *n, const char *path,
                          uint64_t set[STATUS_SET_WORDS])
{
    yaml_node_item_t *it;
    size_t count;
    if (config_list_items(c, n, path, "a list like [2xx, 409, 422]", &it, &count))
        return -1;
    if (count > LIST_MAX)
        return config_fail(c, n, path, "%zu entries; at most %d", count, LIST_MAX);
    memset(set, 0, STATUS_SET_WORDS * sizeof *set);
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *v = config_node(c, it[i]);
        const char *s, *end;
        uint64_t code;
        int from, to;
        char ipath[112];
        config_pathf(ipath, sizeof ipath, "%s[%zu]", path, i);
        if (config_scalar(c, v, ipath, "a status class like 2xx or a status like 422", &s))
            return -1;
        if (s[0] >= '1' && s[0] <= '5' && !strcmp(s + 1, "xx")) {
            from = (s[0] - '0') * 100;
            to = from + 99;
        } else if ((end = config_digits(s, 999, &code)) && !*end && end - s == 3 &&
                   code >= 100 && code <= 599) {
            from = to = (int)code;
        } else {
            return config_fail(c, v, ipath, "%s is not a status class (1xx to 5xx) or a status "
                               "(100 to 599)", config_quote(c, s));
        }
        for (int st = from; st <= to; st++) {
            if (status_set_has(set, st))
                return config_fail(c, v, ipath, "%s: %d is listed already", config_quote(c, s), st);
            status_set_add(set, st);
        }
    }
    return 0;
}

void config_put_status_set(struct config_out *o, int indent, const char *key,
                           const uint64_t set[STATUS_SET_WORDS])
{
    int n = 0;
    config_put_name(o, indent, key);
    for (int class = 100; class < 600; class += 100) {
        int all = 1;
        for (int st = class; st < class + 100 && all; st++)
            all = status_set_has(set, st);
        if (all) {
            fprintf(o->f, "%s%dxx", n++ ? ", " : "[", class / 100);
            continue;
        }
        for (int st = class; st < class + 100; st++)
            if (status_set_has(set, st))
                fprintf(o->f, "%s%d", n++ ? ", " : "[", st);
    }
    /* Empty: resolve's executed or not_executed may be (store_statuses
     * may not). */
    fputs(n ? "]\n" : "[]\n", o->f);
}
