/* A failing disk for the tests, through LD_PRELOAD. For files (and directories) whose path
 * contains SD_EIO_PATH, in the process whose OMPI_COMM_WORLD_RANK is SD_EIO_RANK (unset: every
 * process), the operations SD_EIO_OPS names (a comma list; default "read") fail with errno
 * SD_EIO_ERRNO (a number; default EIO):
 *   read   read/pread/readv/preadv touching bytes [SD_EIO_OFFSET, SD_EIO_END) of the file
 *          (defaults 0 and the end: every read);
 *   write  write/pwrite/writev/pwritev touching those bytes;
 *   sync   fsync/fdatasync/sync_file_range;
 *   list   readdir of a directory (the listing fails after the entries already returned: none);
 *   stat   stat/lstat of the path;
 *   open   open/open64/openat of the path (HDF5's file opens go through them).
 * A pattern ending in '$' must end the path (".../shards$": the directory, not its files).
 * SD_EIO_AFTER=N lets the first N of those operations pass (counted in each process), so that
 * the failure can be put on, say, the second fsync of a directory. SD_EIO_HANG=1 makes those
 * operations hang instead of failing (a server that never answers: the call sleeps for good).
 * Everything else passes through.
 *
 * So HDF5 (sec2: open + pread/pwrite; MPI-IO through Open MPI's posix component), json-c
 * (open + read) and sdtrain's own POSIX calls meet the error where a lost server or a bad sector
 * would put it, below the libraries, and what reaches sdtrain is whatever those libraries make
 * of it. stdio's own reads and writes (fread, fprintf) do not go through these symbols and are
 * not failed; fsync(fileno(f)) of a file opened with fopen is. Used by
 * tests/mpi/storage_errors.sh and tests/mpi/storage_writes.sh; built by `make check` (Makefile.am) with plain flags. In a
 * sanitizer build the test preloads the sanitizer's runtime ahead of it (it must come first). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 4096

static char failing[MAX_FD]; /* fds open on a failing file */
static off_t fail_from, fail_end = -1; /* -1: no end */
static int fail_errno = EIO;
static int configured, active;
static int op_read = 1, op_write, op_sync, op_list, op_stat, op_open;
static const char *pattern;
static size_t pattern_len;
static int anchored; /* the pattern ended in '$' */
static long pass_first; /* SD_EIO_AFTER */
static int hang; /* SD_EIO_HANG */

static int has_op(const char *list, const char *op)
{
    const size_t n = strlen(op);
    for (const char *p = list; (p = strstr(p, op)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == '\0' || p[n] == ','))
            return 1;
    return 0;
}

/* Read once when the library is loaded, before any thread of the process exists; the lazy call
 * in track() covers an open made by another library's constructor that runs first. */
__attribute__((constructor)) static void configure(void)
{
    if (configured)
        return;
    configured = 1;
    pattern = getenv("SD_EIO_PATH");
    if (pattern) {
        pattern_len = strlen(pattern);
        anchored = pattern_len > 0 && pattern[pattern_len - 1] == '$';
        pattern_len -= (size_t)anchored;
    }
    const char *h = getenv("SD_EIO_HANG");
    hang = h && *h && strcmp(h, "0") != 0;
    const char *after = getenv("SD_EIO_AFTER");
    if (after)
        pass_first = atol(after);
    const char *rank = getenv("SD_EIO_RANK"), *mine = getenv("OMPI_COMM_WORLD_RANK");
    const char *e = getenv("SD_EIO_ERRNO"), *off = getenv("SD_EIO_OFFSET");
    active = pattern && *pattern && (!rank || (mine && strcmp(rank, mine) == 0));
    if (e && atoi(e) > 0)
        fail_errno = atoi(e);
    const char *end = getenv("SD_EIO_END"), *ops = getenv("SD_EIO_OPS");
    if (ops && *ops) {
        op_read = has_op(ops, "read");
        op_write = has_op(ops, "write");
        op_sync = has_op(ops, "sync");
        op_list = has_op(ops, "list");
        op_stat = has_op(ops, "stat");
        op_open = has_op(ops, "open");
    }
    if (off)
        fail_from = (off_t)atoll(off);
    if (end && *end)
        fail_end = (off_t)atoll(end);
}

static int matches(const char *path)
{
    configure();
    if (!active || !path || !pattern_len)
        return 0;
    const size_t n = strlen(path);
    if (anchored)
        return n >= pattern_len && memcmp(path + n - pattern_len, pattern, pattern_len) == 0;
    for (const char *p = path; (p = strchr(p, pattern[0])) != NULL; p++)
        if (strncmp(p, pattern, pattern_len) == 0)
            return 1;
    return 0;
}

/* every operation that would fail goes through here: 1 when it fails (errno set) */
static int now_fail(void)
{
    static long seen;
    if (__atomic_add_fetch(&seen, 1, __ATOMIC_RELAXED) <= pass_first)
        return 0;
    while (hang)
        pause();
    errno = fail_errno;
    return 1;
}

static void track(int fd, const char *path)
{
    if (fd >= 0 && fd < MAX_FD)
        failing[fd] = matches(path);
}

static int fails(int op, int fd, off_t off, size_t n)
{
    return op && n > 0 && fd >= 0 && fd < MAX_FD && failing[fd] && off + (off_t)n > fail_from &&
           (fail_end < 0 || off < fail_end) && now_fail();
}

#define REAL(name, type) static type real_##name; if (!real_##name) real_##name = (type)dlsym(RTLD_NEXT, #name)

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
typedef int (*close_fn)(int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef int (*sync_fn)(int);
typedef FILE *(*fopen_fn)(const char *, const char *);
typedef int (*fclose_fn)(FILE *);
typedef DIR *(*opendir_fn)(const char *);
typedef int (*closedir_fn)(DIR *);
typedef struct dirent *(*readdir_fn)(DIR *);
typedef struct dirent64 *(*readdir64_fn)(DIR *);
typedef int (*mkstemp_fn)(char *);
typedef int (*mkostemp_fn)(char *, int);
typedef int (*stat_fn)(const char *, struct stat *);
typedef int (*stat64_fn)(const char *, struct stat64 *);

static void untrack(int fd)
{
    if (fd >= 0 && fd < MAX_FD)
        failing[fd] = 0;
}

/* a write or read at the file position (not a pipe or socket that reused the number of a file
 * closed behind the shim's back: those have no position and pass through) */
static int fails_here(int op, int fd, size_t n)
{
    if (!op || fd < 0 || fd >= MAX_FD || !failing[fd])
        return 0;
    const off_t at = lseek(fd, 0, SEEK_CUR);
    return at >= 0 && fails(op, fd, at, n);
}

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
    if (op_open && matches(path) && now_fail())
        return -1;
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
    if (op_open && matches(path) && now_fail())
        return -1;
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
    if (op_open && matches(path) && now_fail())
        return -1;
    const int fd = real_openat(dir, path, flags, m);
    track(fd, path);
    return fd;
}

int close(int fd)
{
    REAL(close, close_fn);
    untrack(fd);
    return real_close(fd);
}

ssize_t read(int fd, void *buf, size_t n)
{
    REAL(read, read_fn);
    if (fails_here(op_read, fd, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_read(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    REAL(pread, pread_fn);
    if (fails(op_read, fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pread(fd, buf, n, off);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t off)
{
    REAL(pread64, pread_fn);
    if (fails(op_read, fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pread64(fd, buf, n, off);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    REAL(write, write_fn);
    if (fails_here(op_write, fd, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    REAL(pwrite, pwrite_fn);
    if (fails(op_write, fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    REAL(pwrite64, pwrite_fn);
    if (fails(op_write, fd, off, n)) {
        errno = fail_errno;
        return -1;
    }
    return real_pwrite64(fd, buf, n, off);
}

static int sync_fails(int fd)
{
    return op_sync && fd >= 0 && fd < MAX_FD && failing[fd] && now_fail();
}

int fsync(int fd)
{
    REAL(fsync, sync_fn);
    return sync_fails(fd) ? -1 : real_fsync(fd);
}

int fdatasync(int fd)
{
    REAL(fdatasync, sync_fn);
    return sync_fails(fd) ? -1 : real_fdatasync(fd);
}

typedef int (*sync_range_fn)(int, off64_t, off64_t, unsigned int);
int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags)
{
    REAL(sync_file_range, sync_range_fn);
    return sync_fails(fd) ? -1 : real_sync_file_range(fd, off, n, flags);
}

/* stdio opens and closes below the exported symbols: tracked here so that fsync(fileno(f)) of a
 * failing file fails, and a number a FILE had is forgotten with it */
FILE *fopen(const char *path, const char *mode)
{
    REAL(fopen, fopen_fn);
    FILE *f = real_fopen(path, mode);
    if (f)
        track(fileno(f), path);
    return f;
}

FILE *fopen64(const char *path, const char *mode)
{
    REAL(fopen64, fopen_fn);
    FILE *f = real_fopen64(path, mode);
    if (f)
        track(fileno(f), path);
    return f;
}

int fclose(FILE *f)
{
    REAL(fclose, fclose_fn);
    if (f)
        untrack(fileno(f));
    return real_fclose(f);
}

/* directories: opendir's own open is below the symbols too; fdopendir keeps the number's mark */
DIR *opendir(const char *path)
{
    REAL(opendir, opendir_fn);
    DIR *d = real_opendir(path);
    if (d)
        track(dirfd(d), path);
    return d;
}

static void untrack_dir(DIR *d)
{
    if (d)
        untrack(dirfd(d));
}

int closedir(DIR *d)
{
    REAL(closedir, closedir_fn);
    untrack_dir(d);
    return real_closedir(d);
}

static int list_fails(DIR *d)
{
    const int fd = d ? dirfd(d) : -1;
    return op_list && fd >= 0 && fd < MAX_FD && failing[fd] && now_fail();
}

struct dirent *readdir(DIR *d)
{
    REAL(readdir, readdir_fn);
    return list_fails(d) ? NULL : real_readdir(d);
}

struct dirent64 *readdir64(DIR *d)
{
    REAL(readdir64, readdir64_fn);
    return list_fails(d) ? NULL : real_readdir64(d);
}

/* temporary files (mkstemp's open is below the symbols as well) */
int mkstemp(char *tmpl)
{
    REAL(mkstemp, mkstemp_fn);
    const int fd = real_mkstemp(tmpl);
    track(fd, tmpl);
    return fd;
}

int mkstemp64(char *tmpl)
{
    REAL(mkstemp64, mkstemp_fn);
    const int fd = real_mkstemp64(tmpl);
    track(fd, tmpl);
    return fd;
}

int mkostemp(char *tmpl, int flags)
{
    REAL(mkostemp, mkostemp_fn);
    const int fd = real_mkostemp(tmpl, flags);
    track(fd, tmpl);
    return fd;
}

static int stat_fails(const char *path)
{
    return op_stat && matches(path) && now_fail();
}

int stat(const char *path, struct stat *st)
{
    REAL(stat, stat_fn);
    return stat_fails(path) ? -1 : real_stat(path, st);
}

int stat64(const char *path, struct stat64 *st)
{
    REAL(stat64, stat64_fn);
    return stat_fails(path) ? -1 : real_stat64(path, st);
}

int lstat(const char *path, struct stat *st)
{
    REAL(lstat, stat_fn);
    return stat_fails(path) ? -1 : real_lstat(path, st);
}

int lstat64(const char *path, struct stat64 *st)
{
    REAL(lstat64, stat64_fn);
    return stat_fails(path) ? -1 : real_lstat64(path, st);
}

/* the vector forms (MPI-IO's posix component may use them) */
typedef ssize_t (*iov_fn)(int, const struct iovec *, int);
typedef ssize_t (*piov_fn)(int, const struct iovec *, int, off_t);

static size_t iov_bytes(const struct iovec *iov, int n)
{
    size_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += iov[i].iov_len;
    return sum;
}

ssize_t readv(int fd, const struct iovec *iov, int n)
{
    REAL(readv, iov_fn);
    if (fails_here(op_read, fd, iov_bytes(iov, n))) {
        errno = fail_errno;
        return -1;
    }
    return real_readv(fd, iov, n);
}

ssize_t writev(int fd, const struct iovec *iov, int n)
{
    REAL(writev, iov_fn);
    if (fails_here(op_write, fd, iov_bytes(iov, n))) {
        errno = fail_errno;
        return -1;
    }
    return real_writev(fd, iov, n);
}

#define VECTOR_AT(name, op)                                                                       \
    ssize_t name(int fd, const struct iovec *iov, int n, off_t off)                               \
    {                                                                                             \
        REAL(name, piov_fn);                                                                      \
        if (fails(op, fd, off, iov_bytes(iov, n))) {                                              \
            errno = fail_errno;                                                                   \
            return -1;                                                                            \
        }                                                                                         \
        return real_##name(fd, iov, n, off);                                                      \
    }
VECTOR_AT(preadv, op_read)
VECTOR_AT(preadv64, op_read)
VECTOR_AT(pwritev, op_write)
VECTOR_AT(pwritev64, op_write)
