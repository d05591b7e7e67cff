/* SPDX-License-Identifier: Apache-2.0 */
/*
 * powerloss.c — a simulated power cut for SQLite files (see powerloss.h).
 *
 * The VFS is SQLite's default one with the methods of its files swapped
 * for copies that log before they act. Each log record is written with one
 * write() before the change it describes is made, so a record the kill cut
 * short describes a change that never happened; the parser stops there.
 *
 *   W  a write: where, how long, the file's size before, and the bytes it
 *      replaced (those that existed);
 *   T  a truncation: the new size, the size before, the bytes cut off;
 *   S  a sync: everything before it in that file is on the disk.
 *
 * To cut the power afterwards, each file's changes since its last S are
 * undone newest first (which also yields what each write wrote), then
 * replayed oldest first, sector by sector, each sector kept or dropped at
 * random: a disk may persist any of the sectors written since the last
 * flush, in any order, and tear a write between them.
 */
#include "powerloss.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECTOR 512
#define FILES_MAX 128

/* The default VFS gives a database file and its WAL different methods
 * (locking and not); each set has its copy here. */
#define METHODS_MAX 4
static sqlite3_vfs *unix_vfs, pl_vfs;
static struct {
    const sqlite3_io_methods *orig;
    sqlite3_io_methods copy;
} methods[METHODS_MAX];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int undo_fd = -1;
static unsigned long records, kill_at;
static struct {
    sqlite3_file *f;
    char *name;
} files[FILES_MAX];

struct rec {
    char kind;
    uint32_t name_len;
    uint32_t old_len;
    int64_t off;      /* W: where it wrote; T: the new size */
    int64_t len;      /* W: how much it wrote */
    int64_t old_size; /* the file's size before the change */
};

static void die(const char *what)
{
    fprintf(stderr, "powerloss: %s\n", what);
    abort();
}

/* The default VFS's methods for a file opened here. */
static const sqlite3_io_methods *orig(sqlite3_file *f)
{
    for (int i = 0; i < METHODS_MAX; i++)
        if (f->pMethods == &methods[i].copy)
            return methods[i].orig;
    die("a file with methods of its own");
    return NULL;
}

/* Under mu: the name a file was opened with, if it is being recorded. */
static const char *recorded(sqlite3_file *f)
{
    if (undo_fd < 0)
        return NULL;
    for (int i = 0; i < FILES_MAX; i++)
        if (files[i].f == f)
            return files[i].name;
    return NULL;
}

static void log_record(char kind, const char *name, int64_t off, int64_t len, int64_t old_size,
                       const void *old, size_t old_len)
{
    if (kill_at && ++records >= kill_at)
        raise(SIGKILL); /* between two changes: every one logged is made */
    struct rec r;
    memset(&r, 0, sizeof r);
    r.kind = kind;
    r.name_len = (uint32_t)strlen(name);
    r.old_len = (uint32_t)old_len;
    r.off = off;
    r.len = len;
    r.old_size = old_size;
    size_t n = sizeof r + r.name_len + old_len;
    char *buf = malloc(n);
    if (!buf)
        die("out of memory");
    memcpy(buf, &r, sizeof r);
    memcpy(buf + sizeof r, name, r.name_len);
    if (old_len)
        memcpy(buf + sizeof r + r.name_len, old, old_len);
    if (write(undo_fd, buf, n) != (ssize_t)n)
        die("writing the undo log");
    free(buf);
}

/* The bytes of [off, off + n) that exist, and the file's size. */
static unsigned char *existing(sqlite3_file *f, int64_t off, int64_t n, int64_t *size, size_t *len)
{
    sqlite3_int64 sz = 0;
    if (orig(f)->xFileSize(f, &sz) != SQLITE_OK)
        die("reading a file's size");
    *size = sz;
    *len = off < sz ? (size_t)(sz - off < n ? sz - off : n) : 0;
    unsigned char *old = malloc(*len + 1);
    if (!old)
        die("out of memory");
    if (*len && orig(f)->xRead(f, old, (int)*len, off) != SQLITE_OK)
        die("reading what a write replaces");
    return old;
}

static int pl_write(sqlite3_file *f, const void *src, int n, sqlite3_int64 off)
{
    pthread_mutex_lock(&mu);
    const char *name = recorded(f);
    if (name) {
        int64_t size;
        size_t old_len;
        unsigned char *old = existing(f, off, n, &size, &old_len);
        log_record('W', name, off, n, size, old, old_len);
        free(old);
    }
    int rc = orig(f)->xWrite(f, src, n, off);
    pthread_mutex_unlock(&mu);
    return rc;
}

static int pl_truncate(sqlite3_file *f, sqlite3_int64 size)
{
    pthread_mutex_lock(&mu);
    const char *name = recorded(f);
    if (name) {
        int64_t old_size;
        size_t old_len;
        unsigned char *old = existing(f, size, INT64_MAX / 2, &old_size, &old_len);
        log_record('T', name, size, 0, old_size, old, old_len);
        free(old);
    }
    int rc = orig(f)->xTruncate(f, size);
    pthread_mutex_unlock(&mu);
    return rc;
}

static int pl_sync(sqlite3_file *f, int flags)
{
    pthread_mutex_lock(&mu);
    const char *name = recorded(f);
    if (name)
        log_record('S', name, 0, 0, 0, NULL, 0);
    pthread_mutex_unlock(&mu);
    return name ? SQLITE_OK : orig(f)->xSync(f, flags);
}

static int pl_close(sqlite3_file *f)
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < FILES_MAX; i++)
        if (files[i].f == f) {
            free(files[i].name);
            files[i].f = NULL;
            files[i].name = NULL;
        }
    pthread_mutex_unlock(&mu);
    return orig(f)->xClose(f);
}

static int pl_open(sqlite3_vfs *v, const char *name, sqlite3_file *f, int flags, int *out)
{
    (void)v;
    int rc = unix_vfs->xOpen(unix_vfs, name, f, flags, out);
    if (rc != SQLITE_OK || !f->pMethods)
        return rc;
    pthread_mutex_lock(&mu);
    int m = 0;
    while (m < METHODS_MAX && methods[m].orig && methods[m].orig != f->pMethods)
        m++;
    if (m == METHODS_MAX)
        die("more kinds of files than expected");
    if (!methods[m].orig) {
        methods[m].orig = f->pMethods;
        methods[m].copy = *f->pMethods;
        methods[m].copy.xWrite = pl_write;
        methods[m].copy.xTruncate = pl_truncate;
        methods[m].copy.xSync = pl_sync;
        methods[m].copy.xClose = pl_close;
    }
    f->pMethods = &methods[m].copy;
    if (!name) {
        /* A temporary file: nothing of it outlives a cut. */
        pthread_mutex_unlock(&mu);
        return SQLITE_OK;
    }
    int slot = -1;
    for (int i = 0; i < FILES_MAX && slot < 0; i++)
        if (!files[i].f)
            slot = i;
    if (slot < 0)
        die("too many open files");
    files[slot].f = f;
    if (!(files[slot].name = strdup(name)))
        die("out of memory");
    pthread_mutex_unlock(&mu);
    return SQLITE_OK;
}

int powerloss_install(void)
{
    unix_vfs = sqlite3_vfs_find(NULL);
    if (!unix_vfs)
        return -1;
    pl_vfs = *unix_vfs;
    pl_vfs.pNext = NULL;
    pl_vfs.zName = "idem-test-powerloss";
    pl_vfs.xOpen = pl_open;
    return sqlite3_vfs_register(&pl_vfs, 1) == SQLITE_OK ? 0 : -1;
}

void powerloss_record(const char *undo_path, unsigned long die_at)
{
    pthread_mutex_lock(&mu);
    kill_at = die_at;
    records = 0;
    undo_fd = open(undo_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
    if (undo_fd < 0)
        die("opening the undo log");
    pthread_mutex_unlock(&mu);
}

/* ---- after the cut ---- */

struct entry {
    struct rec r;
    const char *name; /* into the log's bytes, not terminated */
    const unsigned char *old;
    unsigned char *wrote; /* W: what it wrote, found while undoing */
    int last;             /* the log's last record: the kill may have come
                           * before its change, or in the middle of it */
};

static int same_name(const struct entry *a, const struct entry *b)
{
    return a->r.name_len == b->r.name_len && !memcmp(a->name, b->name, a->r.name_len);
}

static unsigned char *read_all(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        die(path);
    *len = (size_t)st.st_size;
    unsigned char *buf = malloc(*len + 1);
    if (!buf || (*len && pread(fd, buf, *len, 0) != (ssize_t)*len))
        die(path);
    close(fd);
    return buf;
}

/* Grows the image to size, zero-filling. */
static void resize(unsigned char *img, int64_t *size, int64_t to)
{
    if (to > *size)
        memset(img + *size, 0, (size_t)(to - *size));
    *size = to;
}

/* One file's changes since its last sync, u[0..k) in order: undone, then
 * replayed sector by sector with probability keep. */
static size_t cut_file(struct entry **u, size_t k, double keep, unsigned *seed)
{
    char path[4200];
    snprintf(path, sizeof path, "%.*s", (int)u[0]->r.name_len, u[0]->name);
    size_t len;
    unsigned char *now = read_all(path, &len);
    int64_t cap = (int64_t)len;
    for (size_t i = 0; i < k; i++) {
        if (u[i]->r.old_size > cap)
            cap = u[i]->r.old_size;
        if (u[i]->r.off + u[i]->r.len > cap) /* a write's end, or a truncation's size */
            cap = u[i]->r.off + u[i]->r.len;
    }
    unsigned char *img = calloc(1, (size_t)cap + 1);
    if (!img)
        die("out of memory");
    memcpy(img, now, len);
    free(now);
    int64_t size = (int64_t)len;
    for (size_t i = k; i-- > 0;) {
        struct entry *e = u[i];
        if (e->r.kind == 'W') {
            if (!e->last && e->r.off + e->r.len > size)
                die("a logged write reaches past the file");
            if (!e->last) {
                if (!(e->wrote = malloc((size_t)e->r.len + 1)))
                    die("out of memory");
                memcpy(e->wrote, img + e->r.off, (size_t)e->r.len);
            }
        } else {
            resize(img, &size, e->r.old_size);
        }
        memcpy(img + e->r.off, e->old, e->r.old_len);
        resize(img, &size, e->r.old_size);
    }
    size_t lost = 0;
    for (size_t i = 0; i < k; i++) {
        struct entry *e = u[i];
        if (e->last)
            continue; /* whether, or how much of, it happened is unknown: dropped, not counted */
        if (e->r.kind == 'T') {
            if ((double)rand_r(seed) / RAND_MAX < keep) {
                if (e->r.off < size)
                    size = e->r.off;
                else
                    resize(img, &size, e->r.off);
            } else {
                lost++;
            }
            continue;
        }
        for (int64_t s = e->r.off; s < e->r.off + e->r.len;) {
            int64_t end = (s / SECTOR + 1) * SECTOR;
            if (end > e->r.off + e->r.len)
                end = e->r.off + e->r.len;
            if ((double)rand_r(seed) / RAND_MAX < keep) {
                if (end > size)
                    resize(img, &size, end);
                memcpy(img + s, e->wrote + (s - e->r.off), (size_t)(end - s));
            } else {
                lost++;
            }
            s = end;
        }
        free(e->wrote);
        e->wrote = NULL;
    }
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ftruncate(fd, size) != 0 ||
        (size && pwrite(fd, img, (size_t)size, 0) != (ssize_t)size))
        die("writing a file back");
    close(fd);
    free(img);
    return lost;
}

size_t powerloss_apply(const char *undo_path, double keep, unsigned *seed, size_t *files_touched,
                       size_t *logged)
{
    size_t len;
    unsigned char *log = read_all(undo_path, &len);
    struct entry *e = NULL;
    size_t n = 0, cap = 0;
    for (size_t at = 0; at + sizeof(struct rec) <= len;) {
        struct entry x;
        memcpy(&x.r, log + at, sizeof x.r);
        size_t need = sizeof x.r + x.r.name_len + x.r.old_len;
        if (at + need > len)
            break; /* cut short by the kill: its change never happened */
        x.name = (const char *)log + at + sizeof x.r;
        x.old = log + at + sizeof x.r + x.r.name_len;
        x.wrote = NULL;
        x.last = 0;
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            if (!(e = realloc(e, cap * sizeof *e)))
                die("out of memory");
        }
        e[n++] = x;
        at += need;
    }
    if (n)
        e[n - 1].last = 1;
    *logged = n;
    size_t lost = 0;
    *files_touched = 0;
    struct entry **u = malloc((n + 1) * sizeof *u);
    char *done = calloc(n + 1, 1);
    if (!u || !done)
        die("out of memory");
    for (size_t i = 0; i < n; i++) {
        if (done[i])
            continue;
        /* Every change to this file after its last sync. */
        size_t k = 0;
        for (size_t j = i; j < n; j++) {
            if (!same_name(&e[i], &e[j]))
                continue;
            done[j] = 1;
            if (e[j].r.kind == 'S')
                k = 0;
            else
                u[k++] = &e[j];
        }
        if (k) {
            (*files_touched)++;
            lost += cut_file(u, k, keep, seed);
        }
    }
    free(done);
    free(u);
    free(e);
    free(log);
    return lost;
}
