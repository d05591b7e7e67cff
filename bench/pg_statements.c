/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pg_statements.c — prints the SQL of the postgres db backend exactly as Idem
 * prepares it, so that bench/distributed.sh gives pgbench the very same
 * statements (their parameters turned into pgbench variables).
 *
 *   idem-pg-statements                 the statement names, one a line
 *   idem-pg-statements NAME            that statement's SQL, byte for byte
 *   idem-pg-statements --types NAME    its parameter types, one letter each:
 *                                      t text, b bytea, i bigint, o boolean
 *
 * As redis_scripts.c does for the Lua scripts, this program compiles
 * lib/store/postgres.c into itself rather than copying its file-local table:
 * the text cannot drift from Idem's, and a renamed table breaks this build.
 */
#include "store/postgres.c"

int main(int argc, char **argv)
{
    int types = argc == 3 && strcmp(argv[1], "--types") == 0;
    const char *name = argc == 2 ? argv[1] : types ? argv[2] : NULL;
    if (argc == 1) {
        for (int s = 0; s < ST_COUNT_; s++)
            printf("%s\n", stmts[s].name);
        return 0;
    }
    for (int s = 0; name && s < ST_COUNT_; s++)
        if (strcmp(name, stmts[s].name) == 0) {
            printf("%s\n", types ? stmts[s].types : stmts[s].sql);
            return ferror(stdout) ? 1 : 0;
        }
    fprintf(stderr, "usage: idem-pg-statements [[--types] NAME]\n(no statement named %s)\n",
            name ? name : "");
    return 2;
}
