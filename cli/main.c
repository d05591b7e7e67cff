/*
 * main.c — the `idem` command: one executable, a subcommand per job.
 * Each subcommand is a client of libidem's public API (and of the daemon's
 * pieces in server/), the way curl's tool is a client of libcurl.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "idem.h"
#include "serve.h"
#include "verify.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: idem <command> [options]\n"
            "\n"
            "Idem makes write operations happen exactly once, however often a request\n"
            "or message arrives.\n"
            "\n"
            "commands:\n"
            "  serve      run the daemon: the idempotency gateway and the JSON API\n"
            "  consume    run only the configuration's message consumers\n"
            "  verify     prove an HTTP write endpoint is idempotent: duplicate storms\n"
            "  version    print the version\n"
            "  help       this text\n"
            "\n"
            "'idem <command> --help' describes a command.\n");
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
    if (strcmp(cmd, "serve") == 0)
        return serve_main(argc - 1, argv + 1);
    if (strcmp(cmd, "consume") == 0)
        return consume_main(argc - 1, argv + 1);
    if (strcmp(cmd, "verify") == 0)
        return verify_main(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("idem %s\n", idem_version());
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "idem: '%s' is not a command\n\n", cmd);
    usage(stderr);
    return 2;
}
