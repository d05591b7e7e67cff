/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redrive.h — `idem consume --redrive NAME` (redrive.c).
 */
#ifndef IDEM_CLI_REDRIVE_H
#define IDEM_CLI_REDRIVE_H

/* argv as idem consume's: 0 the redrive complete, 1 not (or the daemon
 * could not be asked), 2 a usage or configuration error. */
int redrive_main(int argc, char **argv);

#endif
