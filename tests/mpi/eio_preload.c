/* A failing disk for the tests, through LD_PRELOAD: reads of files whose path contains
 * SD_EIO_PATH fail with errno SD_EIO_ERRNO (a number; default EIO) when they touch bytes
 * [SD_EIO_OFFSET, SD_EIO_END) of the file (defaults 0 and the end: every read), in the process whose
 * OMPI_COMM_WORLD_RANK is SD_EIO_RANK (unset: every process). Everything else passes through.
 *
 * So HDF5 (its sec2 driver: open + pread), json-c (open + read) and sdtrain's own POSIX
 * re-reads meet the error where a lost server or a bad sector would put it, below the libraries,
 * and what reaches sdtrain is whatever those libraries make of it. Used by
 * tests/mpi/storage_errors.sh; built by `make check` (Makefile.am) with plain flags. In a
 * sanitizer build the test preloads the sanitizer's runtime ahead of it (it must come first). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FD 4096

static char failing[MAX_FD]; /* fds open on a failing file */
static off_t fail_from, fail_end = -1; /* -1: no end */
static int fail_errno = EIO;
static int configured, active;
static const char *pattern;

/* Read once when the library is loaded, before any thread of the process exists; the lazy call
 * in track() covers an open made by another library's constructor that runs first. */
__attribute__((constructor)) static void configure(void)
{
    if (configured)
        return;
    configured = 1;
    pattern = getenv("SD_EIO_PATH");
    const char *rank = getenv("SD_EIO_RANK"), *mine = getenv("OMPI_COMM_WORLD_RANK");
    const char *e = getenv("SD_EIO_ERRNO"), *off = getenv("SD_EIO_OFFSET");
    active = pattern && *pattern && (!rank || (mine && strcmp(rank, mine) == 0));
    if (e && atoi(e) > 0)
        fail_errno = atoi(e);
    const char *end = getenv("SD_EIO_END");
    if (off)
        fail_from = (off_t)atoll(off);
    if (end && *end)
        fail_end = (off_t)atoll(end);
}

static void track(int fd, const char *path)
{
    configure();
    if (fd >= 0 && fd < MAX_FD)
        failing[fd] = active && path && strstr(path, pattern) != NULL;
}

static int fails(int fd, off_t off, size_t n)
{
    return n > 0 && fd >= 0 && fd < MAX_FD && failing[fd] && off + (off_t)n > fail_from &&
           (fail_end < 0 || off < fail_end);
}

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef int (*close_fn)(int);

static mode_t mode_arg(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int open(const char *path, int flags, ...)
{
    REAL(open, open_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t m = mode_arg(flags, ap);
    va_end(ap);
    const int fd = real_open(path, flags, m);
    track(fd, path);
    return fd;
}

int open64(const char *path, int flags, ...)
{
    REAL(open64, open_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t m = mode_arg(flags, ap);
    va_end(ap);
    const int fd = real_open64(path, flags, m);
    track(fd, path);
    return fd;
}

int openat(int dir, const char *path, int flags, ...)
{
    REAL(openat, openat_fn);
    va_list ap;
    va_start(ap, flags);
    const mode_t m = mode_arg(flags, ap);
    va_end(ap);
    const int fd = real_openat(dir, path, flags, m);
    track(fd, path);
    return fd;
}

int close(int fd)
{
    REAL(close, close_fn);
    if (fd >= 0 && fd < MAX_FD)
        failing[fd] = 0;
    return real_close(fd);
}

ssize_t read(int fd, void *buf, size_t n)
{
    REAL(read, read_fn);
    if (fd >= 0 && fd < MAX_FD && failing[fd]) {
        /* no position (a pipe or socket that reused the number of a file closed behind the
         * shim's back): not a file of ours, pass through */
        const off_t at = lseek(fd, 0, SEEK_CUR);
        if (at >= 0 && fails(fd, at, n)) {
            errno = fail_errno;
            return -1;
        }
    }
    return real_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    REAL(pread, pread_fn);
    if (fails(fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
    REAL(pread64, pread_fn);
    if (fails(fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pread64(fd, buf, n, off);
}
