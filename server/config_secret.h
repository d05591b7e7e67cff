/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config_secret.h — where a secret of the configuration comes from: the
 * { env: NAME } or { file: PATH } the file gives in its place (an API key,
 * a signature's secret, a URL that holds a password). The value is read
 * when the file is loaded (config_get_secret, config_value.h) and kept, or
 * hashed, by the part that uses it; its source is kept beside it, so that
 * the configuration can be printed back (idem serve -T) with the source
 * where the file had it, and never the value.
 */
#ifndef IDEM_SERVER_CONFIG_SECRET_H
#define IDEM_SERVER_CONFIG_SECRET_H

#include <stdlib.h>

enum config_secret_kind {
    CONFIG_SECRET_NONE, /* no source: the value was written out (a URL without a password) */
    CONFIG_SECRET_ENV,  /* { env: NAME } */
    CONFIG_SECRET_FILE, /* { file: PATH }, its first line */
};

struct config_secret {
    enum config_secret_kind kind;
    char *name; /* the variable's name or the file's path, as the file gave it */
};

static inline void config_secret_free(struct config_secret *s)
{
    free(s->name);
    s->name = NULL;
    s->kind = CONFIG_SECRET_NONE;
}

#endif
