/* SPDX-License-Identifier: Apache-2.0 */
/* run.h — `idem run`, called by the command line (cli/main.c). */
#ifndef IDEM_SERVER_RUN_H
#define IDEM_SERVER_RUN_H

/* Run a command once per (space, key) across every process sharing the
 * store; the exit status (docs/run.md lists them). */
int run_main(int argc, char **argv);

#endif
