/* File-system helpers: mkdir -p, fsync, atomic replacement, rm -r, cp -rL, reading a regular
 * file; messages name the path. */
#include "sdtrain/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/progress.h"

int sd_storage_errno(int e)
{
    switch (e) {
    case EIO: case EACCES: case EPERM: case EMFILE: case ENFILE: case ENOMEM: case ENOBUFS:
    case ETIMEDOUT: case EAGAIN: case EBUSY: case EINTR: case ESTALE: case ENOLINK:
    case ECOMM: case ENETDOWN: case ENETUNREACH: case ECONNRESET: case EREMOTEIO: case ENXIO:
        return 1;
    default:
        return 0;
    }
}

int sd_input_storage_errno(int e)
{
    return sd_storage_errno(e) && e != EACCES && e != EPERM;
}

int sd_err_storage_errno(sd_err *err, int e)
{
    if (err && sd_storage_errno(e)) {
        const size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, " (a storage error: a retry may succeed)");
        err->storage = 1;
    }
    return -1;
}

/* err := fmt's text, ": ", strerror(e) */
static void err_errno(sd_err *err, int e, const char *fmt, va_list ap)
{
    sd_err_vset(err, fmt, ap);
    if (err) {
        const size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof err->msg - len, ": %s", strerror(e));
    }
}

int sd_err_errno(sd_err *err, int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_errno(err, e, fmt, ap);
    va_end(ap);
    return sd_err_storage_errno(err, e);
}

int sd_err_input_errno(sd_err *err, int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_errno(err, e, fmt, ap);
    va_end(ap);
    return sd_input_storage_errno(e) ? sd_err_storage_errno(err, e) : -1;
}

int sd_mkdir_p(const char *path, const char *what, sd_err *err)
{
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return sd_err_set(err, "invalid %s '%s'", what, path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            int rc;
            buf[i] = '\0';
            sd_progress_io_enter_path("mkdir", buf);
            rc = mkdir(buf, 0777);
            sd_progress_io_leave();
            if (rc != 0 && errno != EEXIST)
                return sd_err_errno(err, errno, "cannot create %s '%s'", what, buf);
            buf[i] = saved;
        }
    }
    {
        /* EEXIST also for a file of that name: not a directory to put anything in */
        struct stat st;
        if (stat(path, &st) == 0 && !S_ISDIR(st.st_mode))
            return sd_err_set(err, "%s '%s' exists and is not a directory", what, path);
    }
    return 0;
}

/* Opening read-only is enough for fsync on Linux and works for directories. */
int sd_pio_all(int fd, void *buf, size_t bytes, uint64_t at, int writing, size_t *done)
{
    char *p = buf;
    size_t moved = 0;
    int rc = 0;
    while (moved < bytes) {
        const size_t left = bytes - moved, n = left < ((size_t)1 << 30) ? left : (size_t)1 << 30;
        const off_t where = (off_t)(at + moved);
        ssize_t got;
        sd_progress_io_enter(writing ? "pwrite" : "pread", fd);
        got = writing ? pwrite(fd, p + moved, n, where) : pread(fd, p + moved, n, where);
        sd_progress_io_leave();
        sd_progress_tick();
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = writing ? EIO : 0;
            rc = -1;
            break;
        }
        moved += (size_t)got;
    }
    if (done)
        *done = moved;
    return rc;
}

int sd_fsync_fd(int fd)
{
    int rc;
    sd_progress_io_enter("fsync", fd);
    rc = fsync(fd);
    sd_progress_io_leave();
    sd_progress_tick();
    return rc;
}

/* the errors that say a descriptor cannot do sync_file_range, not that the storage failed */
static int writeback_unsupported(int e)
{
    return e == EINVAL || e == ENOSYS || e == ESPIPE || e == EOPNOTSUPP;
}

void sd_writeback_init(sd_writeback *wb, int fd)
{
    const char *v = getenv("SDTRAIN_WRITEBACK");
    wb->fd = fd;
    wb->off = v && (strcmp(v, "off") == 0 || strcmp(v, "0") == 0);
    wb->at = wb->len = 0;
}

int sd_writeback_add(sd_writeback *wb, uint64_t at, uint64_t len)
{
    int rc = 0;
    if (wb->off || len == 0)
        return 0;
    sd_progress_io_enter("sync_file_range", wb->fd);
    /* start the new block's writeback, then wait for the one before (both in flight at once) */
    if (sync_file_range(wb->fd, (off64_t)at, (off64_t)len, SYNC_FILE_RANGE_WRITE) != 0)
        rc = -1;
    else if (wb->len &&
             sync_file_range(wb->fd, (off64_t)wb->at, (off64_t)wb->len,
                             SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                 SYNC_FILE_RANGE_WAIT_AFTER) != 0)
        rc = -1;
    sd_progress_io_leave();
    sd_progress_tick();
    if (rc != 0 && writeback_unsupported(errno)) {
        wb->off = 1;
        return 0;
    }
    wb->at = at;
    wb->len = len;
    return rc;
}

int sd_pwrite_streamed(sd_writeback *wb, const void *buf, size_t bytes, uint64_t at)
{
    const size_t block = SD_IO_BLOCK_BYTES;
    const char *p = buf;
    for (size_t off = 0; off < bytes; off += block) {
        const size_t n = bytes - off < block ? bytes - off : block;
        if (sd_pio_all(wb->fd, (void *)(p + off), n, at + off, 1, NULL))
            return -1;
        if (sd_writeback_add(wb, at + off, n))
            return -2;
    }
    return 0;
}

int sd_fsync_close(int fd, const char *path, int failed, sd_err *err)
{
    if (!failed && sd_fsync_fd(fd) != 0 && errno != EINVAL && errno != EROFS)
        failed = sd_err_errno(err, errno, "cannot sync '%s'", path) != 0;
    if (close(fd) != 0 && !failed)
        failed = sd_err_errno(err, errno, "cannot close '%s'", path) != 0;
    return failed;
}

int sd_fsync_path(const char *path, sd_err *err)
{
    int fd, rc, e;
    fd = sd_open(path, O_RDONLY, 0);
    if (fd < 0)
        return sd_err_errno(err, errno, "cannot open '%s' to sync it", path);
    rc = sd_fsync_fd(fd);
    e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL && e != EROFS)
        return sd_err_errno(err, e, "cannot sync '%s'", path);
    return 0;
}

int sd_fsync_parent(const char *path, sd_err *err)
{
    const char *slash = strrchr(path, '/');
    char dir[4400];
    if (!slash)
        return sd_fsync_path(".", err);
    if (snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path) >=
        (int)sizeof dir)
        return sd_err_set(err, "path too long: '%s'", path);
    return sd_fsync_path(dir, err);
}

int sd_open(const char *path, int flags, int mode)
{
    int fd;
    sd_progress_io_enter_path("open", path);
    fd = open(path, flags, (mode_t)mode);
    sd_progress_io_leave();
    return fd;
}

FILE *sd_fopen(const char *path, const char *mode)
{
    FILE *f;
    sd_progress_io_enter_path("open", path);
    f = fopen(path, mode);
    sd_progress_io_leave();
    return f;
}

int sd_rename(const char *from, const char *to)
{
    int rc;
    sd_progress_io_enter_path("rename", from);
    rc = rename(from, to);
    sd_progress_io_leave();
    return rc;
}

int sd_stat(const char *path, struct stat *st)
{
    int rc;
    sd_progress_io_enter_path("stat", path);
    rc = stat(path, st);
    sd_progress_io_leave();
    return rc;
}

int sd_fstat(int fd, struct stat *st)
{
    int rc;
    sd_progress_io_enter("fstat", fd);
    rc = fstat(fd, st);
    sd_progress_io_leave();
    return rc;
}

int sd_fstatat(int dfd, const char *name, struct stat *st, int flags)
{
    int rc;
    sd_progress_io_enter("fstatat", dfd);
    rc = fstatat(dfd, name, st, flags);
    sd_progress_io_leave();
    return rc;
}

int sd_openat(int dfd, const char *name, int flags)
{
    int fd;
    sd_progress_io_enter("openat", dfd);
    fd = openat(dfd, name, flags);
    sd_progress_io_leave();
    return fd;
}

DIR *sd_opendir(const char *path)
{
    DIR *d;
    sd_progress_io_enter_path("opendir", path);
    d = opendir(path);
    sd_progress_io_leave();
    return d;
}

struct dirent *sd_readdir(DIR *d)
{
    struct dirent *de;
    sd_progress_io_enter("readdir", dirfd(d));
    de = readdir(d);
    sd_progress_io_leave();
    return de;
}

int sd_glob(const char *pattern, int flags, glob_t *g)
{
    int rc;
    sd_progress_io_enter_path("glob", pattern);
    rc = glob(pattern, flags, NULL, g);
    sd_progress_io_leave();
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

char **sd_list_names(const char *dir, size_t *n)
{
    DIR *d = sd_opendir(dir);
    char **names = NULL;
    size_t cap = 0;
    *n = 0;
    if (!d)
        return NULL;
    errno = 0;
    for (struct dirent *e; (e = sd_readdir(d)) != NULL; errno = 0) {
        if (e->d_name[0] == '.')
            continue;
        if (*n + 1 >= cap) {
            cap = cap ? 2 * cap : 32;
            names = sd_xrealloc(names, cap * sizeof *names);
        }
        names[(*n)++] = sd_xstrdup(e->d_name);
    }
    const int e = errno;
    closedir(d);
    if (e) {
        sd_free_names(names, *n);
        *n = 0;
        errno = e;
        return NULL;
    }
    if (!names)
        names = sd_xmalloc(sizeof *names);
    names[*n] = NULL;
    qsort(names, *n, sizeof *names, cmp_name);
    return names;
}

void sd_free_names(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        free(names[i]);
    free(names);
}

int sd_write_file_atomic(const char *path, const void *data, size_t len, sd_err *err)
{
    char tmp[4200];
    int fd, e, n = snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return sd_err_set(err, "path too long: '%s'", path);
    fd = sd_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0)
        return sd_err_errno(err, errno, "cannot write '%s'", tmp);
    if (sd_pio_all(fd, (void *)data, len, 0, 1, NULL)) {
        e = errno;
        close(fd);
        unlink(tmp);
        return sd_err_errno(err, e, "cannot write '%s'", tmp);
    }
    if (sd_fsync_fd(fd) != 0) {
        e = errno;
        close(fd);
        unlink(tmp);
        return sd_err_errno(err, e, "cannot sync '%s'", tmp);
    }
    if (close(fd) != 0 || sd_rename(tmp, path) != 0) {
        e = errno;
        unlink(tmp);
        return sd_err_errno(err, e, "cannot replace '%s'", path);
    }
    return sd_fsync_parent(path, err);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) != 0 && errno != ENOENT ? -1 : 0;
}

int sd_remove_tree(const char *path, sd_err *err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : sd_err_set(err, "cannot remove '%s': %s", path, strerror(errno));
    if (nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return sd_err_set(err, "cannot remove '%s': %s", path, strerror(errno));
    return 0;
}

int sd_open_regular(const char *path, struct stat *st)
{
    int fd = sd_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    if (sd_fstat(fd, st) != 0) {
        const int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return -2;
    }
    return fd;
}

/* A fault of the file `path` that sd_copy_tree reads (errno e): a failing storage is marked as
 * such (sd_err_input_errno: status 1, a retry may succeed), anything else is the input's own
 * (err->input). -1. */
static int source_failed(sd_err *err, int e, const char *what, const char *path)
{
    sd_err_input_errno(err, e, "%s '%s'", what, path);
    if (err && !err->storage)
        err->input = 1;
    return -1;
}

/* cp -rL: regular files and folders (symbolic links followed, as in Hugging Face caches whose
 * snapshot files link to blobs); each file is fsynced (the final rename is the commit). */
static int copy_file(const char *from, const char *to, sd_err *err)
{
    char buf[1 << 16];
    struct stat st;
    int in = sd_open_regular(from, &st), out;
    uint64_t at = 0;
    size_t n;
    int end = 0;
    if (in == -1)
        return source_failed(err, errno, "cannot read", from);
    if (in < 0) {
        sd_err_set(err, "cannot copy '%s': not a regular file or a folder", from);
        if (err)
            err->input = 1;
        return -1;
    }
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0) {
        close(in);
        return sd_err_set(err, "cannot write '%s': %s", to, strerror(errno));
    }
    while (!end) {
        if (sd_pio_all(in, buf, sizeof buf, at, 0, &n)) {
            if (errno) {
                source_failed(err, errno, "cannot read", from);
                close(in);
                close(out);
                return -1;
            }
            end = 1; /* the end of the file: n < sizeof buf */
        }
        if (sd_pio_all(out, buf, n, at, 1, NULL)) {
            sd_err_set(err, "cannot write '%s': %s", to, strerror(errno));
            close(in);
            close(out);
            return -1;
        }
        at += n;
    }
    close(in);
    if (fsync(out) != 0 || close(out) != 0)
        return sd_err_set(err, "cannot write '%s': %s", to, strerror(errno));
    return 0;
}

int sd_copy_tree(const char *from, const char *to, sd_err *err)
{
    DIR *d;
    struct dirent *e;
    int rc = 0;
    struct stat st;
    if (stat(from, &st) != 0 || !S_ISDIR(st.st_mode))
        return copy_file(from, to, err);
    if (sd_mkdir_p(to, "directory", err))
        return -1;
    d = opendir(from);
    if (!d)
        return source_failed(err, errno, "cannot read folder", from);
    while (!rc && (e = readdir(d))) {
        char a[4352], b[4352];
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (snprintf(a, sizeof a, "%s/%s", from, e->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", to, e->d_name) >= (int)sizeof b) {
            rc = sd_err_set(err, "path too long under '%s'", from);
            break;
        }
        rc = sd_copy_tree(a, b, err);
    }
    closedir(d);
    return rc;
}

int sd_commit_dir(const char *tmp, const char *out, const char *tool, sd_err *err)
{
    struct stat st;
    char old[4400];
    if (lstat(out, &st) == 0) {
        /* the previous one aside, the new one in, then the previous one removed */
        if (snprintf(old, sizeof old, "%s.old.%ld", tmp, (long)getpid()) >= (int)sizeof old)
            return sd_err_set(err, "path too long: '%s'", tmp);
        if (rename(out, old) != 0)
            return sd_err_set(err, "cannot move the existing %s aside: %s", out, strerror(errno));
        if (rename(tmp, out) != 0) {
            sd_err_set(err, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
            if (rename(old, out) != 0)
                fprintf(stderr, "%s: the previous %s is now %s\n", tool, out, old);
            return -1;
        }
        if (sd_remove_tree(old, err))
            return -1;
    } else if (rename(tmp, out) != 0) {
        return sd_err_set(err, "cannot rename %s to %s: %s", tmp, out, strerror(errno));
    }
    return sd_fsync_parent(out, err);
}

double sd_fs_free_bytes(const char *path)
{
    struct statvfs fs;
    if (statvfs(path, &fs) != 0)
        return -1.0;
    return (double)fs.f_bavail * (double)fs.f_frsize;
}

int sd_fs_check_room(const char *dir, double need, sd_err *err)
{
    const char *skip = getenv("SDTRAIN_TEST_NO_ROOM_CHECK");
    if (skip && !strcmp(skip, "1"))
        return 0;
    const double avail = sd_fs_free_bytes(dir);
    if (avail < 0 || avail >= need) /* a file system that cannot say: the write will tell */
        return 0;
    return sd_err_set(err, "it needs %.1f MiB, and the file system of '%s' has %.1f MiB free",
                      need / 1048576.0, dir, avail / 1048576.0);
}

int sd_mkdir_writable(const char *path, const char *what, sd_err *err)
{
    if (sd_mkdir_p(path, what, err) != 0)
        return -1;
    if (access(path, W_OK | X_OK) != 0)
        return sd_err_set(err, "%s '%s' is not writable: %s", what, path, strerror(errno));
    return 0;
}

int sd_read_to_end(int fd, void **buf, size_t *cap, size_t *len)
{
    size_t n = 0;
    for (;;) {
        char probe[4096];
        const int full = n + 1 >= *cap; /* no room left: is there more? (no growth at the end) */
        sd_progress_io_enter("read", fd);
        const ssize_t k = full ? read(fd, probe, sizeof probe)
                               : read(fd, (char *)*buf + n, *cap - 1 - n);
        sd_progress_io_leave();
        sd_progress_tick();
        if (k < 0 && errno == EINTR)
            continue;
        if (k > 0 && full) {
            while (*cap < n + (size_t)k + 1)
                *cap = *cap ? 2 * *cap : 4096;
            *buf = sd_xrealloc(*buf, *cap);
            memcpy((char *)*buf + n, probe, (size_t)k);
        }
        if (k <= 0) {
            const int e = errno;
            if (*cap == 0) {
                *cap = 1;
                *buf = sd_xrealloc(*buf, 1);
            }
            ((char *)*buf)[n] = '\0';
            *len = n;
            errno = e;
            return k < 0 ? -1 : 0;
        }
        n += (size_t)k;
    }
}

int sd_read_regular_file(const char *path, size_t limit, const char *what, char **data,
                         size_t *len, sd_err *err)
{
    struct stat st;
    int fd = sd_open_regular(path, &st);
    if (fd == -1)
        return sd_err_set(err, "%s: cannot read: %s", path, strerror(errno));
    if (fd < 0)
        return sd_err_set(err, "%s: not a regular file", path);
    if ((uint64_t)st.st_size > limit) {
        close(fd);
        return sd_err_set(err, "%s: %lld bytes, more than the %zu MiB %s may have", path,
                          (long long)st.st_size, limit >> 20, what);
    }
    size_t cap = (size_t)st.st_size, n = 0;
    char *buf = sd_xmalloc(cap + 1);
    /* a file that shrinks while read ends early (errno 0); one that grows is cut */
    if (sd_pio_all(fd, buf, cap, 0, 0, &n) && errno) {
        const int e = errno;
        close(fd);
        free(buf);
        return sd_err_set(err, "%s: read error: %s", path, strerror(e));
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

int sd_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* realpath of `p`, which may not exist (yet): the longest existing prefix resolved, then each
 * further component applied as mkdir -p would create it ("." and ".." by name). */
static int loose_realpath(const char *p, char out[PATH_MAX])
{
    char head[PATH_MAX];
    const char *rest;
    const size_t n = strlen(p);
    if (n == 0 || n >= sizeof head)
        return -1;
    memcpy(head, p, n + 1);
    while (!realpath(head[0] ? head : p[0] == '/' ? "/" : ".", out)) {
        char *slash = strrchr(head, '/');
        if (!head[0])
            return -1;
        if (slash)
            *slash = '\0';
        else
            head[0] = '\0';
    }
    for (rest = p + strlen(head); *rest;) {
        const size_t len = strcspn(rest, "/");
        char next[PATH_MAX];
        size_t at = strlen(out);
        if (len == 0 || (len == 1 && rest[0] == '.')) {
            /* nothing */
        } else if (len == 2 && rest[0] == '.' && rest[1] == '.') {
            while (at > 1 && out[at - 1] != '/')
                at--;
            out[at > 1 ? at - 1 : 1] = '\0';
        } else {
            if (at + 1 + len >= PATH_MAX)
                return -1;
            snprintf(out + at, PATH_MAX - at, "%s%.*s", at > 1 ? "/" : "", (int)len, rest);
            if (realpath(out, next)) /* a link or folder made meanwhile */
                memcpy(out, next, strlen(next) + 1);
        }
        rest += len;
        if (*rest == '/')
            rest++;
    }
    return 0;
}

int sd_path_within(const char *path, const char *dir)
{
    char rp[PATH_MAX], rd[PATH_MAX];
    size_t n;
    if (loose_realpath(path, rp) || loose_realpath(dir, rd))
        return 0;
    n = strlen(rd);
    return strncmp(rp, rd, n) == 0 && (rp[n] == '\0' || rp[n] == '/' || (n == 1 && rd[0] == '/'));
}

int sd_lock_dir(const char *dir, const char *name, const char *what, sd_err *err)
{
    char path[4200], holder[256] = "";
    int fd;
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        return 0;
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return 0; /* a directory where no lock file can be made is refused elsewhere, if at all */
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int e = errno;
        if (e != EWOULDBLOCK) { /* no locks on this file system (some network mounts) */
            close(fd);
            return 0;
        }
        ssize_t n = read(fd, holder, sizeof holder - 1);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        return sd_err_set(err, "another sdtrain job uses the %s '%s' (%s holds %s): two jobs "
                          "there would overwrite each other's files; wait for it to end or give "
                          "this one another directory", what, dir,
                          holder[0] ? holder : "a process", path);
    }
    {
        char host[128] = "?", text[300];
        time_t now = time(NULL);
        struct tm tm;
        char stamp[32];
        gethostname(host, sizeof host - 1);
        gmtime_r(&now, &tm);
        strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
        const int len = snprintf(text, sizeof text, "pid %ld on %s since %s\n", (long)getpid(),
                                 host, stamp);
        if (ftruncate(fd, 0) == 0 && pwrite(fd, text, (size_t)len, 0) == len) {
            /* the record is informational: the lock is the flock */
        }
    }
    return 0; /* fd stays open: the lock lasts as long as the process */
}
