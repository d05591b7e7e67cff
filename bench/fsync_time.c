/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsync_time.c — what one durable write costs on a disk: the floor under
 * every commit of the embedded store, for bench/latency.sh's target.
 *
 *   idem-fsync-time DIR [COUNT]
 *
 * In a file of its own in DIR (removed afterwards), COUNT times (default
 * 1000, at most 1000000): write 4 KiB at the next offset, then fdatasync,
 * each pair timed apart. The file is written and synced whole once before
 * the timed loop, so each timed flush carries the 4 KiB and nothing of the
 * file's size or allocation: as SQLite's WAL, which is rewritten in place
 * once it has reached its size. Prints one line (µs):
 *
 *   FSYNCRESULT count=N bytes=4096 p50_us=A p99_us=B max_us=C mean_us=D
 *
 * Percentiles are exact (nearest rank over the sorted times). Exit status 0,
 * 1 when a write or a flush failed, 2 for bad arguments.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 4096
#define COUNT_MAX 1000000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pct_us(const uint64_t *v, size_t n, unsigned p)
{
    size_t k = (n * p + 99) / 100; /* nearest rank: ceil(p% of n) */
    return v[(k ? k : 1) - 1] / 1000;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: idem-fsync-time DIR [COUNT]\n");
        return 2;
    }
    long count = 1000;
    if (argc == 3) {
        char *e;
        count = strtol(argv[2], &e, 10);
        if (*e || count < 1 || count > COUNT_MAX) {
            fprintf(stderr, "idem-fsync-time: COUNT must be 1..%d\n", COUNT_MAX);
            return 2;
        }
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/idem-fsync-time.XXXXXX", argv[1]) >= (int)sizeof path) {
        fprintf(stderr, "idem-fsync-time: DIR too long\n");
        return 2;
    }
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "idem-fsync-time: %s: %s\n", path, strerror(errno));
        return 1;
    }
    unlink(path); /* gone whatever happens; the descriptor keeps it */
    static char block[BLOCK];
    uint64_t *t = malloc((size_t)count * sizeof *t), sum = 0;
    const char *failed = NULL;
    if (!t) {
        fprintf(stderr, "idem-fsync-time: out of memory\n");
        close(fd);
        return 1;
    }
    for (long i = 0; i < count && !failed; i++)
        if (pwrite(fd, block, BLOCK, (off_t)i * BLOCK) != BLOCK)
            failed = "write";
    if (!failed && fsync(fd) != 0)
        failed = "fsync";
    for (long i = 0; i < count && !failed; i++) {
        memset(block, (int)(i & 0xff), 8); /* a change the disk must take */
        uint64_t t0 = now_ns();
        if (pwrite(fd, block, BLOCK, (off_t)i * BLOCK) != BLOCK || fdatasync(fd) != 0)
            failed = "write + fdatasync";
        t[i] = now_ns() - t0;
        sum += t[i];
    }
    if (failed)
        fprintf(stderr, "idem-fsync-time: %s: %s\n", failed, strerror(errno));
    close(fd);
    if (!failed) {
        qsort(t, (size_t)count, sizeof *t, cmp_u64);
        printf("FSYNCRESULT count=%ld bytes=%d p50_us=%" PRIu64 " p99_us=%" PRIu64
               " max_us=%" PRIu64 " mean_us=%" PRIu64 "\n",
               count, BLOCK, pct_us(t, (size_t)count, 50), pct_us(t, (size_t)count, 99),
               t[count - 1] / 1000, sum / (uint64_t)count / 1000);
    }
    free(t);
    return failed || fflush(stdout) != 0 || ferror(stdout) ? 1 : 0;
}
