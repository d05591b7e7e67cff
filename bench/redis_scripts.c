/* SPDX-License-Identifier: Apache-2.0 */
/*
 * redis_scripts.c — prints the Lua scripts of the redis kv backend exactly as
 * Idem loads them, so that bench/distributed.sh runs the very same scripts
 * under redis-benchmark (SCRIPT LOAD, then EVALSHA).
 *
 *   idem-redis-scripts            the script names, one a line
 *   idem-redis-scripts NAME       that script's text, byte for byte
 *
 * The scripts are file-local to lib/store/redis.c (built there from string
 * macros), so this program compiles that file into itself instead of copying
 * them: the text cannot drift from Idem's, and a renamed table breaks this
 * build rather than the measurement. The backend's one external function is
 * then defined here, so the linker never takes redis.o from libidem.a.
 */
#include "store/redis.c"

int main(int argc, char **argv)
{
    if (argc == 1) {
        for (int s = 0; s < NSCRIPTS; s++)
            printf("%s\n", script_name[s]);
        return 0;
    }
    for (int s = 0; s < NSCRIPTS; s++)
        if (argc == 2 && strcmp(argv[1], script_name[s]) == 0) {
            fputs(script_text[s], stdout);
            return ferror(stdout) ? 1 : 0;
        }
    fprintf(stderr, "usage: idem-redis-scripts [NAME]\n(no script named %s)\n",
            argc > 1 ? argv[1] : "");
    return 2;
}
