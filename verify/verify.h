/* SPDX-License-Identifier: Apache-2.0 */
/* verify.h — `idem verify`, called by the command line (cli/main.c). */
#ifndef IDEM_VERIFY_H
#define IDEM_VERIFY_H

/* Run the scenarios; the exit status: 0 all passed, 1 a scenario failed,
 * 2 usage or connection error. */
int verify_main(int argc, char **argv);

#endif
