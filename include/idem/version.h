/* SPDX-License-Identifier: Apache-2.0 */
/* The one place Idem's version is written. CMake reads it from here. */
#ifndef IDEM_VERSION_H
#define IDEM_VERSION_H

#define IDEM_VERSION_MAJOR 0
#define IDEM_VERSION_MINOR 1
#define IDEM_VERSION_PATCH 0
#define IDEM_VERSION_STRING "0.1.0"

/* Encoded as MAJOR * 10000 + MINOR * 100 + PATCH, like SQLITE_VERSION_NUMBER. */
#define IDEM_VERSION_NUMBER \
    (IDEM_VERSION_MAJOR * 10000 + IDEM_VERSION_MINOR * 100 + IDEM_VERSION_PATCH)

#endif
