/* SPDX-License-Identifier: Apache-2.0 */
/*
 * main.c — the `idem` command: one executable, a subcommand per job.
 * Each subcommand is a client of libidem's public API (and of the daemon's
 * pieces in server/), the way curl's tool is a client of libcurl.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "idem.h"
#include "idem_help.h"
#include "redrive.h"
#include "run/run.h"
#include "serve.h"
#include "verify.h"

/* idem_help, the text below: docs/man/idem.txt, which idem(1) is made from
 * too (scripts/mkman.sh), as each command's help is. */
static void usage(FILE *out)
{
    fputs(idem_help, out);
}

/* idem consume: the consumers, or with --redrive a call to the running
 * daemon's (redrive.c). */
static int consume_cmd(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--redrive") == 0 || strncmp(argv[i], "--redrive=", 10) == 0)
            return redrive_main(argc, argv);
    return consume_main(argc, argv);
}

/* A command by its name: what `idem NAME` and `idem help NAME` run. */
static int (*command(const char *name))(int, char **)
{
    if (strcmp(name, "serve") == 0)
        return serve_main;
    if (strcmp(name, "consume") == 0)
        return consume_cmd;
    if (strcmp(name, "run") == 0)
        return run_main;
    if (strcmp(name, "verify") == 0)
        return verify_main;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    /* This process is ours, so SQLite is set up for it before anything
     * opens a database: no allocation statistics (sqlite3_memory_used(),
     * which nothing here reads), whose global mutex SQLite takes around
     * every allocation. That is about a tenth of the instructions of a
     * record call on the store's writer thread. A library cannot choose
     * this for the process it is loaded into; an application can. */
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    const char *cmd = argv[1];
    int (*run)(int, char **) = command(cmd);
    if (run)
        return run(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("idem %s\n", idem_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 && argc > 2) {
        /* idem help serve is idem serve --help. */
        if (strcmp(argv[2], "version") == 0 || strcmp(argv[2], "help") == 0) {
            usage(stdout);
            return 0;
        }
        if (!(run = command(argv[2]))) {
            fprintf(stderr, "idem help: '%s' is not a command\n\n", argv[2]);
            usage(stderr);
            return 2;
        }
        char *help_argv[] = {argv[2], "--help", NULL};
        return run(2, help_argv);
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "idem: '%s' is not a command\n\n", cmd);
    usage(stderr);
    return 2;
}
