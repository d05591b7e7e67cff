/* verify.c — placeholder until `idem verify` lands. */
#include <stdio.h>

#include "verify.h"

int verify_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "idem verify: not built yet\n");
    return 2;
}
