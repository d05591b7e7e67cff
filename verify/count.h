/* SPDX-License-Identifier: Apache-2.0 */
/*
 * count.h — where idem verify reads the truth: how many times the endpoint
 * really executed. The user says where: a URL that answers a number (or JSON
 * with one), or a shell command that prints one. Read before and after each
 * scenario; the difference is the scenario's executions.
 */
#ifndef IDEM_VERIFY_COUNT_H
#define IDEM_VERIFY_COUNT_H

#include <stddef.h>

#include "url.h"

enum count_kind {
    COUNT_NONE, /* no source: executions are inferred from the answers */
    COUNT_URL,  /* GET url; the body is a number or JSON holding one */
    COUNT_CMD,  /* /bin/sh -c cmd; stdout is a number */
};

struct counter {
    enum count_kind kind;
    const char *text;  /* the URL or command as given, for messages */
    struct vurl url;   /* COUNT_URL, resolved */
    const char *field; /* COUNT_URL with a JSON object: the field, dots for nesting */
    int timeout_ms;
};

/* Read the count. 0, or -1 with err naming the source and what went wrong
 * (unreachable, a non-2xx status, not a number, the command failed...). */
int count_read(const struct counter *c, long long *out, char *err, size_t errlen);

#endif
