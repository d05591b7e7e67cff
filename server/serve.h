/* SPDX-License-Identifier: Apache-2.0 */
/* serve.h — `idem serve` and `idem consume`, called by the command line (cli/main.c). */
#ifndef IDEM_SERVER_SERVE_H
#define IDEM_SERVER_SERVE_H

/* Run the daemon until it is told to stop; the exit status. */
int serve_main(int argc, char **argv);
/* `idem consume`: the configuration's consumers alone. */
int consume_main(int argc, char **argv);

#endif
