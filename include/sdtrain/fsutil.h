/* Small file-system helpers shared by the programs and the writers of files. */
#ifndef SDTRAIN_FSUTIL_H
#define SDTRAIN_FSUTIL_H

#include <dirent.h>
#include <glob.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/stat.h>

#include "sdtrain/error.h"

struct stat;

#ifdef __cplusplus
extern "C" {
#endif

/* mkdir -p: creates `path` and any missing parents. `what` names the directory in messages
 * ("directory", "shard directory"): "cannot create <what> '<prefix>': <reason>". */
int sd_mkdir_p(const char *path, const char *what, sd_err *err);

/* 1 when errno value e says the storage failed an operation (a lost server, a stale handle, a
 * bad sector, no permission, no memory or descriptors): the bytes may well be intact and a retry
 * may succeed. 0 for everything else (a missing file, ...), which is the data's problem. */
int sd_storage_errno(int e);
/* After an error set from a failed system call with errno e: when e is a storage failure, marks
 * err (err->storage = 1) and appends " (a storage error: a retry may succeed)"; else nothing.
 * Returns -1, for `return sd_err_storage_errno(...)`. */
int sd_err_storage_errno(sd_err *err, int e);
/* sd_storage_errno for the reads of a job's inputs (images, captions, tar shards, manifests,
 * dataset folders): there EACCES and EPERM mean the file itself is not ours to read, which the
 * dataset's policy skips, not a failing storage. */
int sd_input_storage_errno(int e);
/* err := the message (printf-style), ": " and strerror(e), after a failed system call with errno
 * e; then sd_err_storage_errno. -1, for `return sd_err_errno(err, e, "cannot sync '%s'", p)`. */
int sd_err_errno(sd_err *err, int e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* sd_err_errno for the reads of a job's inputs: marks err only where sd_input_storage_errno. */
int sd_err_input_errno(sd_err *err, int e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* sd_mkdir_p, then a check that files can be created in it (a read-only file system, no
 * permission): "<what> '<path>' is not writable: <reason>". For the folders a job writes into
 * late (checkpoints, shards), so that it stops before its work, not after. */
int sd_mkdir_writable(const char *path, const char *what, sd_err *err);

/* The bytes an unprivileged writer may still put on the file system holding `path`
 * (statvfs), or -1 when it cannot say. */
double sd_fs_free_bytes(const char *path);

/* Before a write of `need` bytes under the folder `dir` that cannot be undone half-way (a
 * collective parallel-HDF5 write): 0 when it fits or the file system cannot say, else -1 with
 * "it needs N MiB, and the file system of 'dir' has M MiB free". The environment variable
 * SDTRAIN_TEST_NO_ROOM_CHECK=1 (a test hook) makes it always 0, to reach the failed write. */
int sd_fs_check_room(const char *dir, double need, sd_err *err);

/* `bytes` bytes of buf written to (writing = 1) or read from (0) the descriptor fd at offset
 * `at` with pwrite/pread, all of them: interrupted and short transfers are resumed, in pieces of
 * at most 1 GiB. 0, or -1 with errno set (0 when a read met the end of the file first, EIO for
 * a write that moved nothing); *done (may be NULL) := the bytes that did move. */
int sd_pio_all(int fd, void *buf, size_t bytes, uint64_t at, int writing, size_t *done);

/* Streamed writeback of a large file written block by block. After each block's write,
 * sd_writeback_add starts the kernel's writeback of it (sync_file_range) and waits until the
 * block written before it is on storage, so that at most two blocks of the file are dirty or in
 * flight at a time: the final fsync has one block left, not the whole file (the stall watchdog
 * sees progress block by block; a node's page cache does not fill with one file's dirty pages,
 * which the kernel would otherwise write out all at once in the fsync). A file system that
 * cannot do it (EINVAL, ENOSYS, ESPIPE, EOPNOTSUPP) leaves everything to the final fsync, as
 * does SDTRAIN_WRITEBACK=off (for comparisons). An error of an earlier write's writeback is
 * reported here and, on Linux, not again by the fsync: the caller takes it for a failed sync. */
typedef struct sd_writeback {
    int fd;
    int off;          /* 1: not supported or turned off */
    uint64_t at, len; /* the block whose writeback was started last; len 0: none */
} sd_writeback;
void sd_writeback_init(sd_writeback *wb, int fd);
/* [at, at + len) was just written through wb->fd. 0, or -1 with errno set (a failed sync). */
int sd_writeback_add(sd_writeback *wb, uint64_t at, uint64_t len);
/* The block of the streamed large writes (sd_pwrite_streamed; the checkpoint's parts, also the
 * device path's staging block): 64 MiB, two of them dirty per file at most. */
#define SD_IO_BLOCK_BYTES ((size_t)64 << 20)
/* sd_pio_all's write through wb->fd in blocks of SD_IO_BLOCK_BYTES, each given to
 * sd_writeback_add. 0; -1 when a write failed, -2 when a sync did, errno set. */
int sd_pwrite_streamed(sd_writeback *wb, const void *buf, size_t bytes, uint64_t at);

/* fsync(fd), open(2) and rename(2) marked for the stall watchdog as file-system calls (its
 * report names the call and the file: a server that does not answer holds a rank in one). */
int sd_fsync_fd(int fd);
int sd_open(const char *path, int flags, int mode);
FILE *sd_fopen(const char *path, const char *mode); /* fopen(3), marked as an open */
int sd_rename(const char *from, const char *to);
/* The metadata calls of the input and shard paths, marked likewise: stat(2), fstat(2),
 * fstatat(2) and openat(2) (named by the folder dfd), opendir(3), readdir(3) (named by the
 * folder) and glob(3) (named by the pattern). The same results and errno as the calls. */
int sd_stat(const char *path, struct stat *st);
int sd_fstat(int fd, struct stat *st);
int sd_fstatat(int dfd, const char *name, struct stat *st, int flags);
int sd_openat(int dfd, const char *name, int flags);
DIR *sd_opendir(const char *path);
struct dirent *sd_readdir(DIR *d);
int sd_glob(const char *pattern, int flags, glob_t *g);
/* The names in folder `dir` that do not start with '.', sorted by strcmp (NULL-terminated, *n
 * of them; free with sd_free_names), listed through sd_readdir; NULL when the folder cannot be
 * opened or listed (errno set). */
char **sd_list_names(const char *dir, size_t *n);
void sd_free_names(char **names, size_t n);

/* After writes through fd to the file `path`: unless `failed`, fsyncs fd (file systems that
 * cannot sync, EINVAL or EROFS, are not an error); then closes it, a failed close reported unless
 * `failed`. Returns the verdict: `failed`, or 1 when the sync or the close failed (err says
 * which; storage failures marked). For `failed = sd_fsync_close(fd, path, failed, e)`. */
int sd_fsync_close(int fd, const char *path, int failed, sd_err *err);

/* fsync of a path: a file's data, or a directory's entries (which a rename changed). File
 * systems that cannot sync directories (EINVAL, EROFS) are not an error. A failure of the
 * storage (sd_storage_errno) is marked in err (sd_err_storage_errno), here and below. */
int sd_fsync_path(const char *path, sd_err *err);
/* sd_fsync_path of the folder holding `path` ("." for a bare name, "/" for "/name"): what makes
 * a rename or a new name in it durable. */
int sd_fsync_parent(const char *path, sd_err *err);

/* Replaces `path` atomically with `len` bytes: written to "<path>.tmp", fsynced, renamed over
 * `path`, and the directory fsynced. A reader sees the old or the new content, never a part. */
int sd_write_file_atomic(const char *path, const void *data, size_t len, sd_err *err);

/* rm -r of `path` (files and directories, symbolic links not followed); a missing path is fine. */
int sd_remove_tree(const char *path, sd_err *err);

/* `path` opened for reading when it is a regular file (*st its status): the descriptor; -1 when
 * it cannot be opened or stat'ed (errno says why); -2 when it is something else (a folder, a
 * device, a FIFO: opened without blocking, so that a FIFO with no writer cannot hold the open). */
int sd_open_regular(const char *path, struct stat *st);

/* cp -rL of `from` (a file or a folder) to `to`: regular files and folders, symbolic links
 * followed (Hugging Face cache snapshots link their files to blobs); every file fsynced. A fault
 * of `from` sets err->input (missing, not readable, not a regular file or a folder), or
 * err->storage when the storage failed its read (sd_err_input_errno). */
int sd_copy_tree(const char *from, const char *to, sd_err *err);

/* Puts the finished folder `tmp` in place as `out`: a rename, after moving an existing `out`
 * aside (removed once the new one is in; put back if the rename fails, else `tool` prints where
 * it is), then an fsync of the parent folder. Readers see the old folder or the complete new one. */
int sd_commit_dir(const char *tmp, const char *out, const char *tool, sd_err *err);

/* The rest of the file open at `fd` (from its offset to its end, read with `read`, interrupted
 * calls resumed) into *buf: malloc'ed or NULL, *cap bytes, grown (doubled) as needed; the bytes
 * are NUL-terminated and *len says how many there are. A file that grows while it is read is read
 * to its new end. 0, or -1 with errno (what was read stays in *buf). */
int sd_read_to_end(int fd, void **buf, size_t *cap, size_t *len);

/* The whole of the regular file `path` into *data (malloc'ed, NUL-terminated; *len bytes
 * without the NUL). Refused with a message naming the file: missing or unreadable, not a
 * regular file (a FIFO is not waited on), more than `limit` bytes ("... MiB <what> may have"). */
int sd_read_regular_file(const char *path, size_t limit, const char *what, char **data,
                         size_t *len, sd_err *err);

/* 1 when `a` and `b` name the same existing file (device and inode, so links and other
 * spellings of a path count), else 0. For the commands that must not write over an input. */
int sd_same_file(const char *a, const char *b);

/* 1 when `path` is the folder or file `dir` or lies inside it, comparing real paths (symbolic
 * links, "..", other spellings); either may name what does not exist yet, whose existing part is
 * resolved. 0 otherwise, or when a path cannot be resolved. For the commands that replace an
 * output folder: one that holds an input, or lies in one, must be refused. */
int sd_path_within(const char *path, const char *dir);

/* Takes a lock of a directory for the rest of the process: an exclusive flock on dir/name
 * (created; ".sdtrain.lock" for the output directory, another name for another role of the
 * same folder), which then records "pid host start-time". 0 when held, or when the
 * file system takes no locks (nothing to be had); -1 with err naming the holder when another
 * process holds it (`what`: "output directory", ...). The lock goes with the process, so a job
 * killed or requeued leaves none behind. */
int sd_lock_dir(const char *dir, const char *name, const char *what, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
