/* What the libFuzzer harnesses (tests/fuzz/fuzz_*.c) share: the invariant check that aborts, so
 * that libFuzzer keeps the input (and tests/fuzz/replay.sh fails on it), and scratch files for
 * the code that reads paths. A harness defines FUZZ_NAME (its name in messages) first. */
#ifndef SDTRAIN_FUZZ_UTIL_H
#define SDTRAIN_FUZZ_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including fuzz_util.h"
#endif

/* Aborts with "FUZZ_NAME: invariant broken: what: detail" unless cond holds. */
static inline void fuzz_require(int cond, const char *what, const char *detail)
{
    if (!cond) {
        fprintf(stderr, "%s: invariant broken: %s%s%s\n", FUZZ_NAME, what, detail ? ": " : "",
                detail ? detail : "");
        abort();
    }
}

/* Replaces the contents of the open file fd with data[0..size). */
static inline void fuzz_put_fd(int fd, const void *data, size_t size)
{
    fuzz_require(ftruncate(fd, 0) == 0, "truncate a scratch file", NULL);
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(fd, (const char *)data + done, size - done, (off_t)done);
        fuzz_require(w > 0, "write a scratch file", NULL);
        done += (size_t)w;
    }
}

/* Creates or replaces the file at path with data[0..size). */
static inline void fuzz_put_file(const char *path, const void *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    fuzz_require(fd >= 0, "create a scratch file", path);
    fuzz_put_fd(fd, data, size);
    close(fd);
}

/* A new folder "<prefix>-XXXXXX" on tmpfs (/dev/shm) when there is one, else in /tmp. */
static inline void fuzz_scratch_dir(char *buf, size_t size, const char *prefix)
{
    snprintf(buf, size, "%s/%s-XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             prefix);
    fuzz_require(mkdtemp(buf) != NULL, "mkdtemp", buf);
}

/* An anonymous in-memory file; its /proc name (which open, fstat and mmap take as a path)
 * into path. Returns the descriptor. */
static inline int fuzz_memfd(const char *name, char *path, size_t size)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    fuzz_require(fd >= 0, "memfd_create", name);
    snprintf(path, size, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
