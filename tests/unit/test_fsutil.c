/* TAP tests of the file-system helpers (src/core/fsutil.c): sd_pio_all, the one loop behind every
 * "all these bytes at this offset" of the checkpoint, shard, dataset, tar and safetensors code;
 * the streamed writeback of the large writes; the atomic replacement; the tree copy, which must refuse (not wait on) what is not a file; the
 * marked metadata calls (sd_stat ... sd_glob), which must keep the calls' results and errno. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp, mkfifo under -std=c11 */
#endif
#include "sdtrain/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tap.h"

static char dir[256];

static void path_in(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", dir, name);
}

static void test_pio(void)
{
    char path[512];
    const size_t n = (size_t)1 << 20;
    unsigned char *a = malloc(n), *b = malloc(n);
    size_t done = 7;
    int fd, rc, e;
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(i * 2654435761u >> 13);
    path_in(path, sizeof path, "pio.bin");
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    tap_ok(fd >= 0, "a scratch file opens (%s)", path);

    rc = sd_pio_all(fd, a, n, 4096, 1, &done);
    tap_ok(rc == 0 && done == n, "1 MiB written at offset 4096: rc %d, %zu bytes moved", rc, done);
    memset(b, 0, n);
    rc = sd_pio_all(fd, b, n, 4096, 0, &done);
    tap_ok(rc == 0 && done == n && !memcmp(a, b, n), "read back whole and equal: rc %d, %zu bytes",
           rc, done);
    rc = sd_pio_all(fd, b, 4096, 0, 0, &done);
    tap_ok(rc == 0 && done == 4096 && b[0] == 0 && b[4095] == 0,
           "the hole before the offset reads as zeros");

    /* the end of the file: -1, errno 0, and how far it got */
    errno = EINVAL;
    rc = sd_pio_all(fd, b, 200, 4096 + n - 100, 0, &done);
    e = errno;
    tap_ok(rc == -1 && e == 0 && done == 100 && !memcmp(b, a + n - 100, 100),
           "a read across the end: rc %d, errno %d (0: the end), %zu of 200 bytes", rc, e, done);
    rc = sd_pio_all(fd, b, 16, 4096 + n + 10, 0, &done);
    e = errno;
    tap_ok(rc == -1 && e == 0 && done == 0, "a read past the end: rc %d, errno %d, %zu bytes", rc,
           e, done);
    rc = sd_pio_all(fd, b, 0, 1u << 30, 0, &done);
    tap_ok(rc == 0 && done == 0, "nothing to move: rc %d, %zu bytes", rc, done);
    rc = sd_pio_all(fd, a, 1, 0, 1, NULL);
    tap_ok(rc == 0, "done may be NULL");
    close(fd);

    /* a descriptor that has no offsets: the system's error, not a loop */
    int p[2];
    if (pipe(p) == 0) {
        rc = sd_pio_all(p[1], a, 16, 0, 1, &done);
        e = errno;
        tap_ok(rc == -1 && e == ESPIPE && done == 0, "pwrite on a pipe: rc %d, %s", rc,
               strerror(e));
        tap_ok(!sd_storage_errno(ESPIPE), "ESPIPE is not a storage failure");
        close(p[0]);
        close(p[1]);
    } else {
        tap_skip("no pipe: %s", strerror(errno));
        tap_skip("no pipe");
    }
    /* a closed descriptor */
    rc = sd_pio_all(fd, b, 16, 0, 0, &done);
    e = errno;
    tap_ok(rc == -1 && e == EBADF, "a closed descriptor: rc %d, %s", rc, strerror(e));
    unlink(path);
    free(a);
    free(b);
}

/* sd_writeback / sd_pwrite_streamed: a write of more than a 64 MiB block reads back whole and
 * leaves its last block's writeback remembered; a pipe (ESPIPE) and SDTRAIN_WRITEBACK=off turn
 * it off without an error; a closed descriptor is a failed sync. */
static void test_writeback(void)
{
    char path[512];
    const size_t n = ((size_t)64 << 20) + 4097;
    unsigned char *a = malloc(n), *b = malloc(n);
    sd_writeback wb;
    int fd, rc, p[2];
    size_t done = 0;
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(i * 131 + (i >> 16));
    path_in(path, sizeof path, "streamed.bin");
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    sd_writeback_init(&wb, fd);
    rc = sd_pwrite_streamed(&wb, a, n, 512);
    tap_ok(rc == 0, "a streamed write of 64 MiB + 4097 bytes at 512: rc %d", rc);
    tap_ok(wb.off || (wb.at == 512 + ((uint64_t)64 << 20) && wb.len == 4097),
           "its last block's writeback is the one in flight (off %d, at %llu, %llu bytes)",
           wb.off, (unsigned long long)wb.at, (unsigned long long)wb.len);
    rc = sd_fsync_fd(fd);
    tap_ok(rc == 0 && sd_pio_all(fd, b, n, 512, 0, &done) == 0 && done == n &&
               memcmp(a, b, n) == 0,
           "synced, it reads back whole and equal");
    close(fd);
    unlink(path);
    if (pipe(p) == 0) {
        sd_writeback_init(&wb, p[1]);
        rc = sd_writeback_add(&wb, 0, 16);
        tap_ok(rc == 0 && wb.off == 1, "a pipe: no error, writeback off (rc %d, off %d)", rc,
               wb.off);
        close(p[0]);
        close(p[1]);
    } else {
        tap_skip("no pipe: %s", strerror(errno));
    }
    setenv("SDTRAIN_WRITEBACK", "off", 1);
    sd_writeback_init(&wb, 0);
    tap_ok(wb.off == 1 && sd_writeback_add(&wb, 0, 16) == 0 && wb.len == 0,
           "SDTRAIN_WRITEBACK=off: nothing done");
    unsetenv("SDTRAIN_WRITEBACK");
    fd = open("/dev/null", O_RDONLY);
    close(fd);
    sd_writeback_init(&wb, fd);
    errno = 0;
    rc = sd_writeback_add(&wb, 0, 16);
    tap_ok(rc == -1 && errno == EBADF && wb.off == 0,
           "a closed descriptor: a failed sync (rc %d, %s)", rc, strerror(errno));
    free(a);
    free(b);
}

static void test_atomic(void)
{
    char path[512], tmp[600];
    char *data = NULL;
    size_t len = 0;
    sd_err err;
    path_in(path, sizeof path, "atomic.txt");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    tap_ok(sd_write_file_atomic(path, "first version\n", 14, &err) == 0, "atomic write: new file");
    tap_ok(sd_write_file_atomic(path, "second\n", 7, &err) == 0, "atomic write: replaced");
    const int rc = sd_read_regular_file(path, (size_t)1 << 20, "a test file", &data, &len, &err);
    tap_ok(rc == 0 && len == 7 && !memcmp(data, "second\n", 7),
           "the second content, whole (%zu bytes)", len);
    tap_ok(access(tmp, F_OK) != 0, "no temporary file left");
    free(data);
}

static void test_copy_tree(void)
{
    char from[512], to[512], sub[600], file[700], copied[700], fifo[700];
    sd_err err;
    FILE *f;
    path_in(from, sizeof from, "tree");
    path_in(to, sizeof to, "tree-copy");
    snprintf(sub, sizeof sub, "%s/sub", from);
    snprintf(file, sizeof file, "%s/data.bin", sub);
    tap_ok(sd_mkdir_p(sub, "directory", &err) == 0, "mkdir -p %s", sub);
    f = fopen(file, "wb");
    /* 3 x 64 KiB + 5: whole blocks of the copy and a tail */
    for (int i = 0; f && i < 3 * 65536 + 5; i++)
        fputc(i % 251, f);
    if (f)
        fclose(f);
    err.msg[0] = '\0';
    const int rc = sd_copy_tree(from, to, &err);
    tap_ok(rc == 0, "cp -r of a folder%s%s", rc ? ": " : "", rc ? err.msg : "");
    snprintf(copied, sizeof copied, "%s/sub/data.bin", to);
    {
        char *a = NULL, *b = NULL;
        size_t la = 0, lb = 0;
        const size_t lim = (size_t)1 << 20;
        int same = sd_read_regular_file(file, lim, "a test file", &a, &la, &err) == 0 &&
                   sd_read_regular_file(copied, lim, "a test file", &b, &lb, &err) == 0;
        same = same && la == lb && la == 3 * 65536 + 5 && !memcmp(a, b, la);
        tap_ok(same, "the copy has the same %zu bytes", lb);
        free(a);
        free(b);
    }
    tap_ok(sd_remove_tree(to, &err) == 0 && access(to, F_OK) != 0, "rm -r of the copy");

    snprintf(fifo, sizeof fifo, "%s/pipe", sub);
    if (mkfifo(fifo, 0644) == 0) {
        err.msg[0] = '\0';
        /* before, the copy opened the FIFO and waited for a writer forever */
        const int frc = sd_copy_tree(from, to, &err);
        tap_ok(frc == -1 && strstr(err.msg, "pipe': not a regular file"),
               "a FIFO in the tree is refused by name: %s", err.msg);
    } else {
        tap_skip("mkfifo: %s", strerror(errno));
    }
    sd_remove_tree(to, &err);
    sd_remove_tree(from, &err);
}

/* sd_read_to_end: a file read whole into a buffer of its size (no growth), into no buffer at all,
 * an empty file, and a pipe whose data comes in pieces (the buffer grows); the input's faults. */
static void test_read_to_end(void)
{
    char path[600];
    const size_t n = 10000;
    char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (char)('a' + i % 26);
    snprintf(path, sizeof path, "%s/rte", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    tap_ok(fd >= 0 && write(fd, data, n) == (ssize_t)n, "a 10000-byte file");
    lseek(fd, 0, SEEK_SET);
    size_t cap = n + 1, len = 0;
    void *buf = malloc(cap);
    int rc = sd_read_to_end(fd, &buf, &cap, &len);
    tap_ok(rc == 0 && len == n && cap == n + 1 &&
               memcmp(buf, data, n) == 0 && ((char *)buf)[n] == '\0',
           "read whole into a buffer of its size plus one: not grown (cap %zu)", cap);
    free(buf);
    lseek(fd, 3, SEEK_SET);
    buf = NULL;
    cap = 0;
    rc = sd_read_to_end(fd, &buf, &cap, &len);
    tap_ok(rc == 0 && len == n - 3 &&
               memcmp(buf, data + 3, n - 3) == 0 && ((char *)buf)[n - 3] == '\0',
           "from offset 3 into no buffer: %zu bytes, cap %zu", len, cap);
    free(buf);
    tap_ok(ftruncate(fd, 0) == 0, "emptied");
    buf = NULL;
    cap = 0;
    rc = sd_read_to_end(fd, &buf, &cap, &len);
    tap_ok(rc == 0 && len == 0 && cap >= 1 &&
               ((char *)buf)[0] == '\0', "an empty file: 0 bytes, NUL-terminated");
    free(buf);
    close(fd);
    int p[2];
    if (pipe(p) == 0) {
        pid_t child = fork();
        if (child == 0) {
            close(p[0]);
            for (size_t at = 0; at < n; at += 700) {
                const size_t k = n - at < 700 ? n - at : 700;
                if (write(p[1], data + at, k) != (ssize_t)k)
                    _exit(1);
                usleep(1000);
            }
            _exit(0);
        }
        close(p[1]);
        cap = 16;
        buf = malloc(cap);
        rc = sd_read_to_end(p[0], &buf, &cap, &len);
        int status = 0;
        waitpid(child, &status, 0);
        tap_ok(rc == 0 && len == n && memcmp(buf, data, n) == 0 && cap > n,
               "a pipe written in pieces of 700: all %zu bytes, the buffer grown to %zu", len, cap);
        free(buf);
        close(p[0]);
    }
    buf = NULL;
    cap = 0;
    rc = sd_read_to_end(-1, &buf, &cap, &len);
    tap_ok(rc == -1 && errno == EBADF && len == 0,
           "a closed descriptor: -1, EBADF");
    free(buf);
    free(data);
}

/* The marked metadata calls (sd_stat ... sd_glob) give the calls' own results and errno: an
 * end of listing leaves errno 0, which is how a caller tells it from a failed readdir. */
static void test_metadata(void)
{
    char sub[300], file[600], pat[600];
    struct stat st, st2;
    sd_err err;
    path_in(sub, sizeof sub, "meta");
    tap_ok(sd_mkdir_p(sub, "directory", &err) == 0, "mkdir -p %s", sub);
    for (int i = 0; i < 3; i++) {
        snprintf(file, sizeof file, "%s/f%d.tar", sub, i);
        FILE *f = fopen(file, "w");
        tap_ok(f && fprintf(f, "%*s", 100 * (i + 1), "") > 0 && fclose(f) == 0, "a file of %d bytes",
               100 * (i + 1));
    }
    snprintf(file, sizeof file, "%s/f1.tar", sub);
    tap_ok(sd_stat(file, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 200, "sd_stat: a file of 200 bytes");
    errno = 0;
    int rc = sd_stat("/nonexistent/sd_fsutil", &st), e = errno;
    tap_ok(rc == -1 && e == ENOENT, "sd_stat of a missing path: -1, %s", strerror(e));

    DIR *d = sd_opendir(sub);
    int n = 0;
    struct dirent *de;
    tap_ok(d != NULL, "sd_opendir");
    errno = 0;
    while (d && (de = sd_readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    e = errno;
    tap_ok(n == 3 && e == 0, "sd_readdir lists the 3 files and ends with errno 0 (%d, %s)", n, strerror(e));
    if (d)
        closedir(d);
    errno = 0;
    d = sd_opendir("/nonexistent/sd_fsutil");
    e = errno;
    tap_ok(d == NULL && e == ENOENT, "sd_opendir of a missing folder: NULL, %s", strerror(e));

    int dfd = sd_open(sub, O_RDONLY | O_DIRECTORY, 0);
    tap_ok(dfd >= 0 && sd_fstat(dfd, &st) == 0 && S_ISDIR(st.st_mode), "sd_open + sd_fstat of the folder");
    tap_ok(sd_fstatat(dfd, "f2.tar", &st2, 0) == 0 && st2.st_size == 300, "sd_fstatat: f2.tar, 300 bytes");
    errno = 0;
    rc = sd_fstatat(dfd, "missing", &st2, 0);
    e = errno;
    tap_ok(rc == -1 && e == ENOENT, "sd_fstatat of a missing name: -1, %s", strerror(e));
    int fd = sd_openat(dfd, "f0.tar", O_RDONLY);
    tap_ok(fd >= 0 && sd_fstat(fd, &st2) == 0 && st2.st_size == 100, "sd_openat: f0.tar, 100 bytes");
    if (fd >= 0)
        close(fd);
    if (dfd >= 0)
        close(dfd);

    glob_t g;
    snprintf(pat, sizeof pat, "%s/f[02].tar", sub);
    rc = sd_glob(pat, 0, &g);
    tap_ok(rc == 0 && g.gl_pathc == 2 && strstr(g.gl_pathv[0], "/f0.tar") && strstr(g.gl_pathv[1], "/f2.tar"),
           "sd_glob: f0.tar and f2.tar");
    if (rc == 0)
        globfree(&g);
    snprintf(pat, sizeof pat, "%s/none*", sub);
    tap_ok(sd_glob(pat, 0, &g) == GLOB_NOMATCH, "sd_glob: no match");

    /* sd_fsync_parent: the folder of a path, "." for a bare name, "/" at the root */
    snprintf(file, sizeof file, "%s/f1.tar", sub);
    tap_ok(sd_fsync_parent(file, &err) == 0 && sd_fsync_parent("bare-name", &err) == 0 &&
               sd_fsync_parent("/sd-fsutil-bare", &err) == 0,
           "sd_fsync_parent of a file in a folder, of a bare name, of a name at the root");
    tap_ok(sd_fsync_parent("/nonexistent/sd_fsutil/x", &err) != 0 &&
               strstr(err.msg, "cannot open '/nonexistent/sd_fsutil' to sync it") != NULL,
           "sd_fsync_parent of a missing folder: %s", err.msg);

    /* sd_list_names: sorted, hidden names left out, NULL-terminated */
    snprintf(file, sizeof file, "%s/.hidden", sub);
    FILE *hf = fopen(file, "w");
    tap_ok(hf && fclose(hf) == 0, "a hidden file");
    size_t nn = 99;
    char **names = sd_list_names(sub, &nn);
    tap_ok(names && nn == 3 && !strcmp(names[0], "f0.tar") && !strcmp(names[1], "f1.tar") &&
               !strcmp(names[2], "f2.tar") && names[3] == NULL,
           "sd_list_names: f0.tar, f1.tar, f2.tar (%zu)", nn);
    sd_free_names(names, nn);
    snprintf(file, sizeof file, "%s/empty", sub);
    tap_ok(mkdir(file, 0755) == 0, "an empty folder");
    names = sd_list_names(file, &nn);
    tap_ok(names && nn == 0 && names[0] == NULL, "sd_list_names of an empty folder: none");
    sd_free_names(names, nn);
    errno = 0;
    names = sd_list_names("/nonexistent/sd_fsutil", &nn);
    e = errno;
    tap_ok(names == NULL && nn == 0 && e == ENOENT, "sd_list_names of a missing folder: NULL, %s",
           strerror(e));
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    sd_err err;
    snprintf(dir, sizeof dir, "%s/sd_fsutil_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(dir))
        tap_skip_all("no scratch directory");
    alarm(120); /* a copy that waits on the FIFO again fails the test instead of hanging it */
    test_pio();
    test_writeback();
    test_atomic();
    test_copy_tree();
    test_read_to_end();
    test_metadata();
    sd_remove_tree(dir, &err);
    return tap_done();
}
