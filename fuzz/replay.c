/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay.c — a fuzz target without libFuzzer: `replay PATH...` runs the
 * target's LLVMFuzzerTestOneInput once on each file named, and on each file
 * in each directory named (one level, in name order, dot files skipped), then
 * prints how many inputs ran and exits 0. A directory that is missing counts
 * as empty, so a target without a corpus yet still passes.
 *
 * Linked with each fuzz_*.c into replay_<target>; ctest runs it on the
 * target's corpus, so CI replays every corpus on every build, under
 * ASan+UBSan in the sanitizer build: a crash or a leak fails the test.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Run the target on one file; -1 if it could not be read. */
static int replay_file(const char *path)
{
    int rc = -1;
    unsigned char *buf = NULL;
    errno = 0;
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0)
        goto out;
    /* Exactly the file's size, so that a read past the end is caught. */
    size_t size = (size_t)st.st_size;
    buf = malloc(size ? size : 1);
    if (!buf || fread(buf, 1, size, f) != size)
        goto out;
    LLVMFuzzerTestOneInput(buf, size);
    rc = 0;
out:
    if (rc != 0)
        fprintf(stderr, "replay: cannot read %s: %s\n", path, strerror(errno ? errno : EIO));
    free(buf);
    if (f)
        fclose(f);
    return rc;
}

static int skip_dot(const struct dirent *d)
{
    return d->d_name[0] != '.';
}

int main(int argc, char **argv)
{
    size_t ran = 0;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: not found, taken as an empty corpus\n", argv[i]);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (replay_file(argv[i]) == 0)
                ran++;
            else
                failed = 1;
            continue;
        }
        struct dirent **names;
        int n = scandir(argv[i], &names, skip_dot, alphasort);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list %s: %s\n", argv[i], strerror(errno));
            failed = 1;
            continue;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                if (replay_file(path) == 0)
                    ran++;
                else
                    failed = 1;
            }
            free(names[k]);
        }
        free(names);
    }
    printf("replay: %zu inputs\n", ran);
    return failed ? 1 : 0;
}
