/* Training checkpoints: the writer (rank 0 makes the HDF5 file's structure, every rank pwrites
 * its parts, at once or on a thread of its own) with its commit protocol (temporary directory,
 * rename, `latest` pointer, keep_last), resume resolution, the verified loader, the
 * configuration comparison and the signal flag (format: doc/checkpoints.md). */
#include "sdtrain/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <json-c/json.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/collectives.h"
#include "sdtrain/config.h"
#include "sdtrain/fault.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/h5check.h"
#include "sdtrain/h5util.h"
#include "sdtrain/hash.h"
#include "sdtrain/log.h"
#include "sdtrain/progress.h"
#include "sdtrain/runtime.h"
#include "sdtrain/timer.h"
#include "sdtrain/version.h"

#if !defined(H5_HAVE_PARALLEL)
#error "checkpoints need a parallel HDF5 build (H5_HAVE_PARALLEL)"
#endif

#define PATH_SIZE 4200

enum { DS_PARAMS = 0, DS_M, DS_V, DS_EMA, DS_N };
static const char *const ds_names[DS_N] = {"params", "adam_m", "adam_v", "ema"};

/* ---- names, checksum ------------------------------------------------------------------------ */

void sd_ckpt_dir_name(int64_t step, char *buf, size_t size)
{
    snprintf(buf, size, "step-%08lld", (long long)step);
}

uint64_t sd_ckpt_checksum(const float *x, size_t first, size_t count)
{
    uint64_t s = 0;
    /* a wrapping integer sum: exact, so the thread count cannot change it */
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (size_t i = 0; i < count; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        s += sd_fmix64((uint64_t)(first + i) * 0x9E3779B97F4A7C15ULL + b);
    }
    return s;
}

static int join(char *out, size_t size, const char *a, const char *b, sd_err *err)
{
    int n = snprintf(out, size, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= size)
        return sd_err_set(err, "path too long: '%s/%s'", a, b);
    return 0;
}

/* 1 when p exists, 0 when it does not (ENOENT, ENOTDIR), -1 (errno kept) when stat fails
 * otherwise: a storage that cannot answer is not a missing file. */
static int stat_exists(const char *p)
{
    struct stat st;
    if (sd_stat(p, &st) == 0)
        return 1;
    return errno == ENOENT || errno == ENOTDIR ? 0 : -1;
}

static int path_exists(const char *p)
{
    return stat_exists(p) == 1;
}

/* Ends this process the way a node failure would (no MPI_Finalize, no HDF5 flush). */
static void fault_kill(const char *phase, int64_t step)
{
    fprintf(stderr, "[rank %d] fault injection: killing this rank at phase '%s' (checkpoint of "
            "step %lld)\n", sd_log_rank(), phase, (long long)step);
    fflush(stderr);
    raise(SIGKILL);
    _exit(137);
}

/* The part [*wb, *we) of the held range [begin, end) this rank writes or verifies, so that the
 * ranks' parts partition [0, n): DDP ranks (all holding [0, n)) take sd_shard_range's slices,
 * ZeRO-2 ranks their own shards. Collective; the verdict is the same on every rank. */
static int own_range(MPI_Comm comm, size_t n, size_t begin, size_t end, size_t *wb, size_t *we,
                     sd_err *err)
{
    int rank, size, full = 1, ok = 1;
    uint64_t mine[2] = {begin, end}, *all, prev = 0;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &size));
    all = sd_xmalloc(2 * (size_t)size * sizeof *all);
    SD_MPI_CHECK(MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, comm));
    for (int r = 0; r < size; r++) {
        full &= all[2 * r] == 0 && all[2 * r + 1] == n;
        ok &= all[2 * r] == prev && all[2 * r + 1] >= all[2 * r];
        prev = all[2 * r + 1];
    }
    ok &= prev == n;
    free(all);
    if (full) {
        sd_shard_range(n, size, rank, SD_SHARD_ALIGN, wb, we);
        return 0;
    }
    if (!ok)
        return sd_err_set(err, "checkpoint: the ranks' optimizer ranges neither all cover the "
                          "%zu parameters nor partition them in rank order", n);
    *wb = begin;
    *we = end;
    return 0;
}

/* ---- the collective writer ------------------------------------------------------------------ */

typedef struct writer {
    MPI_Comm comm;
    int rank, size, world_rank;
    const sd_ckpt_scalars *s;
    const sd_ckpt_tensors *t;
    char dir[PATH_SIZE], name[64], tmp_dir[PATH_SIZE], final_dir[PATH_SIZE], file[PATH_SIZE];
    hid_t h5;
    uint64_t sums[DS_N];
    size_t wb[DS_N], we[DS_N]; /* the part of each dataset this rank wrote */
    int verified;              /* read back and checked before the commit (&checkpoint verify) */
    haddr_t addr[DS_N];        /* each dataset's data offset in the file (contiguous) */
    int64_t bytes;
    int renamed;      /* rank 0: step-K is in place (the commit may have failed after) */
} writer;

/* Creates dataset ds (n floats, contiguous, allocated at creation and never filled) of which
 * this rank writes [wb, we); its file offset goes to w->addr[ds]. Rank 0, which alone creates
 * the file. */
static hid_t create_dataset(writer *w, int ds, hid_t space, size_t wb, size_t we)
{
    hid_t dcpl, d;
    SD_H5_CHECK(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    SD_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    SD_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    SD_H5_CHECK(d = H5Dcreate2(w->h5, ds_names[ds], H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl,
                               H5P_DEFAULT));
    SD_H5_CHECK(H5Pclose(dcpl));
    w->wb[ds] = wb;
    w->we[ds] = we;
    w->addr[ds] = H5Dget_offset(d); /* allocated at creation (H5D_ALLOC_TIME_EARLY) */
    return d;
}

static void checksum_attrs(hid_t d, uint64_t sum)
{
    char hex[32];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
    sd_h5_attr_str(d, "checksum", hex);
    sd_h5_attr_str(d, "checksum_algorithm", SD_CKPT_CHECKSUM_ALGORITHM);
}

static void file_attrs(writer *w)
{
    char creator[160];
    snprintf(creator, sizeof creator, "sdtrain %s (git %s)", sd_version(), sd_git_revision());
    sd_h5_attr_str(w->h5, "format", SD_CKPT_FORMAT);
    sd_h5_attr_i64(w->h5, "format_version", SD_CKPT_FORMAT_VERSION);
    sd_h5_attr_i64(w->h5, "step", w->s->step);
    sd_h5_attr_i64(w->h5, "opt_step", w->s->opt_step);
    sd_h5_attr_str(w->h5, "creator", creator);
}

static json_object *manifest_json(const writer *w)
{
    const sd_ckpt_scalars *s = w->s;
    const sd_param_table *tab = w->t->table;
    json_object *root = json_object_new_object(), *sums = json_object_new_object();
    json_object *params = json_object_new_array();
    char hex[32], created[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_object_add(root, "format", json_object_new_string(SD_CKPT_FORMAT));
    json_object_object_add(root, "version", json_object_new_int(SD_CKPT_FORMAT_VERSION));
    json_object_object_add(root, "sdtrain_version", json_object_new_string(sd_version()));
    json_object_object_add(root, "git_revision", json_object_new_string(sd_git_revision()));
    json_object_object_add(root, "created", json_object_new_string(created));
    json_object_object_add(root, "step", json_object_new_int64(s->step));
    json_object_object_add(root, "opt_step", json_object_new_int64(s->opt_step));
    json_object_object_add(root, "skipped", json_object_new_int64(s->skipped));
    json_object_object_add(root, "epoch", json_object_new_int64(s->epoch));
    json_object_object_add(root, "steps_per_epoch", json_object_new_int64(s->steps_per_epoch));
    json_object_object_add(root, "global_batch", json_object_new_int64(s->global_batch));
    json_object_object_add(root, "batch_size_per_rank", json_object_new_int64(s->batch_per_rank));
    json_object_object_add(root, "seed", json_object_new_int64(s->seed));
    json_object_object_add(root, "n_ranks", json_object_new_int64(s->n_ranks));
    json_object_object_add(root, "sharding", json_object_new_string(s->sharding));
    json_object_object_add(root, "has_ema", json_object_new_boolean(s->has_ema != 0));
    json_object_object_add(root, "verified_after_write", json_object_new_boolean(w->verified));
    json_object_object_add(root, "file", json_object_new_string(SD_CKPT_STATE_FILE));
    json_object_object_add(root, "bytes", json_object_new_int64(w->bytes));
    json_object_object_add(root, "n_floats", json_object_new_int64((int64_t)w->t->n));
    json_object_object_add(root, "checksum_algorithm",
                           json_object_new_string(SD_CKPT_CHECKSUM_ALGORITHM));
    for (int ds = 0; ds < DS_N; ds++) {
        if (ds == DS_EMA && !s->has_ema)
            continue;
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)w->sums[ds]);
        json_object_object_add(sums, ds_names[ds], json_object_new_string(hex));
    }
    json_object_object_add(root, "checksums", sums);
    for (size_t i = 0; i < tab->n; i++) {
        const sd_param *p = &tab->params[i];
        json_object *o = json_object_new_object(), *shape = json_object_new_array();
        for (int d = 0; d < p->ndim; d++)
            json_object_array_add(shape, json_object_new_int64(p->shape[d]));
        json_object_object_add(o, "name", json_object_new_string(p->name));
        json_object_object_add(o, "offset", json_object_new_int64((int64_t)p->offset));
        json_object_object_add(o, "shape", shape);
        json_object_array_add(params, o);
    }
    json_object_object_add(root, "parameters", params);
    return root;
}

/* "latest" names a checkpoint directory of dir, or *name is "" when there is none. */
int sd_ckpt_read_latest(const char *dir, char *name, size_t size, sd_err *err)
{
    char path[PATH_SIZE], buf[128];
    size_t len;
    FILE *f;
    name[0] = '\0';
    if (join(path, sizeof path, dir, SD_CKPT_LATEST, err))
        return -1;
    f = sd_fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : sd_err_errno(err, errno, "cannot read '%s'", path);
    len = fread(buf, 1, sizeof buf - 1, f);
    if (ferror(f)) { /* a read the storage failed is not a malformed `latest` */
        const int e = errno;
        fclose(f);
        return sd_err_errno(err, e, "cannot read '%s'", path);
    }
    fclose(f);
    buf[len] = '\0';
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ' || buf[len - 1] == '\r'))
        buf[--len] = '\0';
    if (strncmp(buf, "step-", 5) != 0 || len < 6 || strspn(buf + 5, "0123456789") != len - 5 ||
        len >= size)
        return sd_err_set(err, "'%s' does not name a checkpoint directory (expected "
                          "'step-NNNNNNNN', found '%.60s')", path, buf);
    memcpy(name, buf, len + 1);
    return 0;
}

static int is_step_name(const char *s, int64_t *step)
{
    if (strncmp(s, "step-", 5) != 0 || !s[5] || strspn(s + 5, "0123456789") != strlen(s + 5))
        return 0;
    *step = strtoll(s + 5, NULL, 10);
    return 1;
}

typedef struct step_dir {
    int64_t step;
    char name[64];
} step_dir;

static int step_dir_cmp(const void *a, const void *b)
{
    const step_dir *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : 0; /* newest first */
}

/* keep.last: of the checkpoints up to the one just committed (`latest`), the newest keep.last
 * stay, and those of steps that are multiples of keep.every (> 0) stay whatever their age (they
 * count among the newest). Later steps are another run's (one started over with resume =
 * 'never', or a run resumed from an older checkpoint): they are not this run's history, so they
 * neither count nor go. */
static void prune(const char *dir, sd_ckpt_keep keep, const char *latest)
{
    DIR *d = sd_opendir(dir);
    struct dirent *de;
    step_dir *list = NULL;
    size_t n = 0, cap = 0;
    int64_t now = INT64_MAX;
    if (!d)
        return;
    if (!is_step_name(latest, &now))
        now = INT64_MAX;
    while ((de = sd_readdir(d))) {
        int64_t st;
        if (!is_step_name(de->d_name, &st) || strlen(de->d_name) >= sizeof list->name ||
            st > now)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            list = sd_xrealloc(list, cap * sizeof *list);
        }
        list[n].step = st;
        snprintf(list[n].name, sizeof list[n].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    qsort(list, n, sizeof *list, step_dir_cmp);
    for (size_t i = (size_t)keep.last; i < n; i++) {
        char path[PATH_SIZE];
        sd_err e;
        sd_err_clear(&e);
        if (!strcmp(list[i].name, latest) || (keep.every > 0 && list[i].step % keep.every == 0) ||
            join(path, sizeof path, dir, list[i].name, &e))
            continue;
        if (sd_remove_tree(path, &e))
            sd_warn("keep_last: %s", e.msg);
        else
            sd_debug("keep_last = %lld: removed %s", (long long)keep.last, path);
    }
    free(list);
}

/* Rank 0, once every rank has closed and synced the state file. */
static int commit(writer *w, const char *config_text, sd_ckpt_keep keep, sd_err *e)
{
    char path[PATH_SIZE], old[PATH_SIZE + 80], latest[128];
    json_object *root;
    const char *text;
    struct stat st;
    int rc;
    if (sd_stat(w->file, &st) != 0)
        return sd_err_set(e, "cannot stat '%s': %s", w->file, strerror(errno));
    w->bytes = (int64_t)st.st_size;
    root = manifest_json(w);
    json_object_object_add(root, "config", json_object_new_string(config_text ? config_text : ""));
    text = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                                    JSON_C_TO_STRING_NOSLASHESCAPE);
    rc = join(path, sizeof path, w->tmp_dir, SD_CKPT_MANIFEST, e) ||
         sd_write_file_atomic(path, text, strlen(text), e);
    json_object_put(root);
    if (rc)
        return -1;
    /* A step-K that exists already was committed by an earlier run (killed before `latest`
     * moved, or started over with resume = 'never'): the new one replaces it. */
    if (path_exists(w->final_dir)) {
        snprintf(old, sizeof old, "%s/.%s.old", w->dir, w->name);
        if (sd_remove_tree(old, e) || rename(w->final_dir, old) != 0) {
            if (!e->msg[0])
                sd_err_set(e, "cannot move '%s' aside: %s", w->final_dir, strerror(errno));
            return -1;
        }
    } else {
        old[0] = '\0';
    }
    if (sd_rename(w->tmp_dir, w->final_dir) != 0)
        return sd_err_set(e, "cannot rename '%s' to '%s': %s", w->tmp_dir, w->final_dir,
                          strerror(errno));
    w->renamed = 1;
    if (sd_fsync_path(w->dir, e))
        return -1;
    if (old[0])
        sd_remove_tree(old, e);
    sd_err_clear(e);
    /* a node failure between the rename and the pointer: `latest` still names the previous one */
    if (sd_fault_armed(SD_FAULT_KILL, w->world_rank, w->s->step, "ckpt-commit"))
        fault_kill("ckpt-commit", w->s->step);
    snprintf(latest, sizeof latest, "%s\n", w->name);
    if (join(path, sizeof path, w->dir, SD_CKPT_LATEST, e) ||
        sd_write_file_atomic(path, latest, strlen(latest), e))
        return -1;
    if (keep.last > 0)
        prune(w->dir, keep, w->name);
    return 0;
}

static int read_range(hid_t f, const char *file, int ds, uint64_t n, size_t b, size_t e,
                      float *dst, int *io_failure, sd_err *err);

/* Adds to *sum the checksum of [b, e) of dataset ds read from f, in blocks of 4 Mi floats (the
 * checksum is a sum over elements of a function of (flat index, value), so the blocks' sums add
 * up to the range's). Local to this rank. */
static int checksum_range(hid_t f, const char *file, int ds, uint64_t n, size_t b, size_t e,
                          uint64_t *sum, sd_err *err)
{
    const size_t block = (size_t)4 << 20;
    float *buf = sd_xmalloc((e - b < block ? (e > b ? e - b : 1) : block) * sizeof *buf);
    int rc = 0;
    for (size_t lo = b; lo < e && !rc; lo += block) {
        const size_t hi = e - lo < block ? e : lo + block;
        rc = read_range(f, file, ds, n, lo, hi, buf, NULL, err);
        if (!rc)
            *sum += sd_ckpt_checksum(buf, lo, hi - lo);
    }
    free(buf);
    return rc;
}

/* SDTRAIN_FAULT flip:rank=R:phase=ckpt-write: a storage fault the writer cannot see. After the
 * file was written and synced, one bit of the first value this rank wrote is changed on disk. */
/* One try of the flip: NULL when done, else the call that failed (errno set). */
static const char *flip_byte(const char *file, off_t at)
{
    unsigned char byte = 0;
    const char *failed = NULL;
    ssize_t got;
    int fd = open(file, O_RDWR);
    if (fd < 0)
        return "open";
    got = pread(fd, &byte, 1, at);
    if (got != 1) {
        failed = got == 0 ? "pread (end of file)" : "pread";
    } else {
        byte ^= 0x40;
        if (pwrite(fd, &byte, 1, at) != 1)
            failed = "pwrite";
        else if (fsync(fd) != 0)
            failed = "fsync";
    }
    const int e = errno;
    close(fd);
    errno = e;
    return failed;
}

static void fault_flip(const writer *w)
{
    for (int ds = 0; ds < DS_N; ds++) {
        const char *failed = NULL;
        int e = 0;
        if (w->we[ds] <= w->wb[ds] || w->addr[ds] == HADDR_UNDEF)
            continue;
        const off_t at = (off_t)w->addr[ds] + (off_t)(w->wb[ds] * sizeof(float));
        /* a flip that does not land makes the test that expects it fail: say why */
        failed = flip_byte(w->file, at);
        e = errno;
        if (failed)
            fprintf(stderr, "[rank %d] SDTRAIN_FAULT: could not flip a bit of dataset '%s' "
                    "(index %zu, byte %lld) in %s: %s: %s\n", sd_log_rank(), ds_names[ds],
                    w->wb[ds], (long long)at, w->file, failed, strerror(e));
        else
            fprintf(stderr, "[rank %d] SDTRAIN_FAULT: flipped a bit of dataset '%s' (index %zu) "
                    "in %s\n", sd_log_rank(), ds_names[ds], w->wb[ds], w->file);
        return;
    }
}

/* A checkpoint that would fill the file system is not started (a write that fails all the same
 * is a failed checkpoint too, found later, after the time spent writing). The file holds
 * (3 + EMA) fp32 copies of the parameters plus HDF5's metadata (a few KiB; 4 MiB allowed) and
 * what &run io_alignment adds before each copy. */
static int check_room(const char *dir, const sd_ckpt_scalars *s, const sd_ckpt_tensors *t,
                      sd_err *e)
{
    const double copies = 3.0 + (s->has_ema ? 1.0 : 0.0);
    return sd_fs_check_room(dir, copies * (double)t->n * 4.0 + 4194304.0 +
                                     sd_h5_alignment_slack((double)t->n * 4.0, copies), e);
}

/* Collective, after a failed write or commit: err := what happened and what stays, which rank 0
 * alone knows when the commit failed after the rename (the folder's sync, or `latest`'s write
 * or sync: the pointer may have moved before the failure). A checkpoint in place that `latest`
 * does not name is resumed only when there is no `latest` (resolve_root); else a later one
 * replaces it. */
static void commit_failed(writer *w, const sd_err *e, sd_err *err)
{
    char now[128] = "";
    int state = 0; /* 0: nothing in place; 1: in place, `latest` not moved; 2: `latest` names it */
    if (w->rank == 0 && w->renamed) {
        sd_err ignored;
        sd_err_clear(&ignored);
        if (sd_ckpt_read_latest(w->dir, now, sizeof now, &ignored))
            snprintf(now, sizeof now, "?");
        state = !strcmp(now, w->name) ? 2 : 1;
    }
    SD_MPI_CHECK(MPI_Bcast(&state, 1, MPI_INT, 0, w->comm));
    SD_MPI_CHECK(MPI_Bcast(now, (int)sizeof now, MPI_CHAR, 0, w->comm));
    const long long step = (long long)w->s->step;
    if (state == 2)
        sd_err_set(err, "checkpoint of step %lld into '%s' is committed and '%s' names it, but the "
                   "storage failed at the end (it may not hold the commit durably): %s", step,
                   w->dir, SD_CKPT_LATEST, e->msg);
    else if (state == 1 && !strcmp(now, "?"))
        sd_err_set(err, "checkpoint of step %lld into '%s' is in place as %s, but whether '%s' "
                   "names it cannot be read: %s", step, w->dir, w->name, SD_CKPT_LATEST, e->msg);
    else if (state == 1 && now[0])
        sd_err_set(err, "checkpoint of step %lld into '%s' is in place as %s, but '%s' still names "
                   "%s, which a resume takes: %s", step, w->dir, w->name, SD_CKPT_LATEST, now,
                   e->msg);
    else if (state == 1)
        sd_err_set(err, "checkpoint of step %lld into '%s' is in place as %s, but no '%s' names "
                   "it (a resume takes the newest complete checkpoint: this one): %s", step, w->dir,
                   w->name, SD_CKPT_LATEST, e->msg);
    else
        sd_err_set(err, "checkpoint of step %lld into '%s' failed (the previous checkpoint stays "
                   "the latest): %s", step, w->dir, e->msg);
    err->storage = e->storage;
}

/* Collective, once the state file is written (rc 0) or not (rc -1, message in e): rank 0
 * commits; a failure removes the temporary directory and says what stays (commit_failed). */
static int writer_end(writer *w, int rc, sd_err *e, const char *config_text, sd_ckpt_keep keep,
                      char *committed, size_t committed_size, sd_err *err)
{
    if (!rc) {
        if (w->rank != 0 && sd_fault_armed(SD_FAULT_KILL, w->world_rank, w->s->step, "ckpt-commit"))
            fault_kill("ckpt-commit", w->s->step);
        rc = sd_agree(w->comm, w->rank == 0 && commit(w, config_text, keep, e) != 0, e);
    }
    if (rc) {
        if (w->rank == 0) {
            sd_err dummy;
            sd_remove_tree(w->tmp_dir, &dummy);
        }
        commit_failed(w, e, err);
        return -1;
    }
    if (committed)
        snprintf(committed, committed_size, "%s", w->final_dir);
    return 0;
}

/* Collective: w set up for the checkpoint of s->step into dir, and rank 0's empty temporary
 * directory there, where there is room for the file. -1 (every rank) with err set when not. */
static int writer_begin(writer *w, MPI_Comm comm, const char *dir, const sd_ckpt_scalars *s,
                        const sd_ckpt_tensors *t, sd_err *err)
{
    sd_err e;
    int failed = 0;
    memset(w, 0, sizeof *w);
    sd_err_clear(&e);
    w->comm = comm;
    w->s = s;
    w->t = t;
    w->h5 = -1;
    SD_MPI_CHECK(MPI_Comm_rank(comm, &w->rank));
    SD_MPI_CHECK(MPI_Comm_size(comm, &w->size));
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w->world_rank));
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    sd_ckpt_dir_name(s->step, w->name, sizeof w->name);
    if (snprintf(w->tmp_dir, sizeof w->tmp_dir, "%s/.%s.tmp", dir, w->name) >=
            (int)sizeof w->tmp_dir ||
        join(w->final_dir, sizeof w->final_dir, dir, w->name, &e) ||
        join(w->file, sizeof w->file, w->tmp_dir, SD_CKPT_STATE_FILE, &e))
        failed = sd_err_set(&e, "checkpoint directory path too long: '%s'", dir) != 0;
    if (!failed && t->n == 0)
        failed = sd_err_set(&e, "checkpoint: no parameters to write") != 0;
    if (!failed && w->rank == 0)
        failed = sd_mkdir_p(dir, "checkpoint directory", &e) || sd_remove_tree(w->tmp_dir, &e) ||
                 check_room(dir, s, t, &e) || sd_mkdir_p(w->tmp_dir, "checkpoint directory", &e);
    if (sd_agree(comm, failed, &e)) {
        sd_err_set(err, "checkpoint of step %lld into '%s' not written (the previous checkpoint "
                   "stays the latest): %s", (long long)s->step, dir, e.msg);
        return -1;
    }
    return 0;
}

/* ---- writing in the background (&checkpoint async) ----------------------------------------- */

struct sd_ckpt_async {
    writer w;              /* as sd_ckpt_write's; w.s and w.t point at s and t below */
    sd_ckpt_scalars s;
    sd_ckpt_tensors t;     /* the table, n and ranges: the buffers are copied at the start */
    char *config_text;
    sd_ckpt_keep keep;     /* keep_last, keep_every_n_steps */
    int verify;
    int in_flight;         /* started, not yet finished (the same on every rank) */
    int thread_running;    /* a thread to join */
    pthread_t thread;
    float *snap;           /* this rank's parts of the datasets, kept from one checkpoint to the next */
    size_t snap_cap;       /* floats */
    void (*snap_free)(void *ctx, void *p); /* snap from the tensors' host_alloc: its release */
    void *snap_ctx;
    size_t at[DS_N];       /* where the part of dataset ds begins in snap */
    /* the thread's results, read after it is joined (done: while it runs) */
    atomic_int done;
    int failed;
    sd_err e;
    uint64_t part[DS_N];   /* checksums of this rank's parts, as written */
    double seconds;
};

/* Collective: the state file with its attributes and its datasets (allocated at creation,
 * contiguous, never filled), no data; each dataset's offset in w->addr, this rank's parts in
 * w->wb / w->we. Rank 0 alone creates it (sd_h5_create_local: HDF5's POSIX driver, the file
 * first made through MPI-IO on MPI_COMM_SELF when &run io_hints are given, so that Lustre
 * striping and the like apply at its creation): a storage error then fails one rank's HDF5
 * calls, which no other rank waits in. */
static int create_state_file(writer *w, sd_err *e)
{
    const sd_ckpt_tensors *t = w->t;
    const hsize_t dims[1] = {t->n};
    size_t pb, pe, ob, oe;
    uint64_t addr[DS_N];
    int failed = 0;
    if (own_range(w->comm, t->n, 0, t->n, &pb, &pe, e) ||
        own_range(w->comm, t->n, t->begin, t->end, &ob, &oe, e))
        return -1; /* the same on every rank */
    for (int ds = 0; ds < DS_N; ds++) {
        w->wb[ds] = ds == DS_PARAMS ? pb : ob;
        w->we[ds] = ds == DS_PARAMS ? pe : oe;
        w->addr[ds] = HADDR_UNDEF;
    }
    if (w->rank == 0) {
        hid_t space;
        /* HDF5's own writes of the structure (at the create and the close) as one marked call:
         * a hang in them is reported with the file (nothing else runs in between) */
        sd_progress_io_enter_path("HDF5 write", w->file);
        w->h5 = sd_h5_create_local(w->file, e);
        failed = w->h5 < 0;
        if (!failed) {
            file_attrs(w);
            SD_H5_CHECK(space = H5Screate_simple(1, dims, NULL));
            for (int ds = 0; ds < DS_N; ds++) {
                if (ds == DS_EMA && !w->s->has_ema)
                    continue;
                hid_t d = create_dataset(w, ds, space, w->wb[ds], w->we[ds]);
                SD_H5_CHECK(H5Dclose(d));
                if (w->addr[ds] == HADDR_UNDEF && !failed)
                    failed = sd_err_set(e, "dataset '%s' of %s has no place in the file",
                                        ds_names[ds], w->file) != 0;
            }
            SD_H5_CHECK(H5Sclose(space));
            /* a failed close ends the job (a failed H5Fcreate, above, is a plain failure) */
            sd_h5_close_local(w->h5, w->file, "the checkpoints committed before are intact");
            w->h5 = -1;
        }
        sd_progress_io_leave();
    }
    if (sd_agree(w->comm, failed, e))
        return -1;
    for (int ds = 0; ds < DS_N; ds++)
        addr[ds] = (uint64_t)w->addr[ds];
    SD_MPI_CHECK(MPI_Bcast(addr, DS_N, MPI_UINT64_T, 0, w->comm));
    for (int ds = 0; ds < DS_N; ds++)
        w->addr[ds] = (haddr_t)addr[ds];
    return 0;
}

/* Host memory for n floats from the tensors' host_alloc (page-locked on the device path), else
 * from malloc; *release := the host_free that gives it back, NULL for free(). NULL when neither
 * has the memory. */
static float *host_floats(const sd_ckpt_tensors *t, size_t n, void (**release)(void *, void *))
{
    const size_t bytes = (n ? n : 1) * sizeof(float);
    float *p = t->host_alloc ? t->host_alloc(t->copy_ctx, bytes) : NULL;
    *release = p ? t->host_free : NULL;
    return p ? p : malloc(bytes);
}

static void host_floats_free(float *p, void (*release)(void *, void *), void *ctx)
{
    if (release)
        release(ctx, p);
    else
        free(p);
}

/* Floats a block of the checkpoint's part writes and the device path's transfers moves
 * (sd_ckpt_write's download and write, sd_ckpt_load's read and upload): SD_IO_BLOCK_BYTES, the
 * streamed writeback's block. Test hook: SDTRAIN_TEST_CKPT_BLOCK_FLOATS=N
 * makes it N, so that a small model's state crosses several blocks with a tail. */
static size_t block_floats(void)
{
    const char *v = getenv("SDTRAIN_TEST_CKPT_BLOCK_FLOATS");
    const long n = v ? atol(v) : 0;
    return n > 0 ? (size_t)n : SD_IO_BLOCK_BYTES / sizeof(float);
}

/* This rank's parts (src[ds]: the floats [w->wb[ds], w->we[ds]) of dataset ds) into the state
 * file at their offsets, with plain pwrite in 64 MiB pieces (no MPI, no HDF5: safe on a thread
 * of its own, and a storage error fails this rank alone, never a collective call half-way),
 * fsync'ed on the descriptor that wrote them; part[ds] := their checksums. With verify they are
 * read back past the page cache (POSIX_FADV_DONTNEED on the synced file) and the checksum of
 * what comes back must be the same. With w->t->copy (sd_ckpt_write on the device path) src is
 * the device's memory, and each piece is first brought into one host block (from the tensors'
 * host_alloc when it gives one). Local; 0, or -1 with e set. */
static int write_parts(writer *w, const float *const src[DS_N], int verify, uint64_t part[DS_N],
                       sd_err *e)
{
    const size_t block = block_floats();
    const int64_t step = w->s->step;
    const sd_ckpt_tensors *t = w->t;
    int failed = 0;
    float *stage = NULL; /* with t->copy: a block at a time from the device */
    void (*stage_release)(void *, void *) = NULL;
    int fd = sd_open(w->file, O_WRONLY | O_CLOEXEC, 0);
    sd_writeback wb;
    memset(part, 0, DS_N * sizeof *part);
    if (fd < 0)
        return sd_err_errno(e, errno, "cannot open '%s' to write rank %d's part", w->file, w->rank);
    sd_writeback_init(&wb, fd);
    if (t->copy) {
        stage = host_floats(t, block, &stage_release);
        SD_CHECK(stage != NULL, "out of memory for a %zu MiB block", block * sizeof(float) >> 20);
    }
    for (int ds = 0; ds < DS_N && !failed; ds++) {
        if (ds == DS_EMA && !w->s->has_ema)
            continue;
        const size_t first = w->wb[ds], len = w->we[ds] - w->wb[ds];
        for (size_t off = 0; off < len && !failed; off += block) {
            const size_t cnt = len - off < block ? len - off : block;
            const float *p = src[ds] + off;
            if (t->copy) {
                t->copy(t->copy_ctx, stage, p, cnt);
                p = stage;
            }
            const uint64_t at = (uint64_t)w->addr[ds] + (first + off) * sizeof(float);
            part[ds] += sd_ckpt_checksum(p, first + off, cnt); /* the blocks' sums add up */
            if (sd_pio_all(fd, (void *)p, cnt * sizeof(float), at, 1, NULL))
                failed = sd_err_errno(e, errno, "writing dataset '%s' of %s failed "
                                      "on rank %d", ds_names[ds], w->file, w->rank) != 0;
            else if (sd_writeback_add(&wb, at, cnt * sizeof(float)))
                failed = sd_err_errno(e, errno, "cannot sync '%s'", w->file) != 0;
            /* a node failure in the middle of a checkpoint: the temporary file holds part of it */
            if (ds == DS_PARAMS && off == 0 &&
                sd_fault_armed(SD_FAULT_KILL, w->world_rank, step, "ckpt-write"))
                fault_kill("ckpt-write", step);
            if (ds == DS_PARAMS && off == 0 &&
                sd_fault_armed(SD_FAULT_HANG, w->world_rank, step, "ckpt-write"))
                sd_fault_hang(w->world_rank, "writing the checkpoint of step", step);
        }
    }
    host_floats_free(stage, stage_release, t->copy_ctx);
    if (sd_fsync_close(fd, w->file, failed, e))
        return -1;
    /* a storage fault the writer cannot see: a bit changed on disk after the sync */
    if (sd_fault_armed(SD_FAULT_FLIP, w->world_rank, step, "ckpt-write"))
        fault_flip(w);
    if (!verify)
        return 0;
    float *buf = sd_xmalloc(block * sizeof *buf);
    fd = sd_open(w->file, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        failed = sd_err_errno(e, errno, "cannot open %s to read it back on rank %d", w->file,
                              w->rank) != 0;
    else
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    for (int ds = 0; ds < DS_N && !failed; ds++) {
        if (ds == DS_EMA && !w->s->has_ema)
            continue;
        const size_t first = w->wb[ds], len = w->we[ds] - w->wb[ds];
        uint64_t sum = 0;
        for (size_t off = 0; off < len && !failed; off += block) {
            const size_t cnt = len - off < block ? len - off : block;
            if (sd_pio_all(fd, buf, cnt * sizeof(float),
                           (uint64_t)w->addr[ds] + (first + off) * sizeof(float), 0, NULL)) {
                if (errno)
                    failed = sd_err_errno(e, errno, "reading back dataset '%s' of %s failed on "
                                          "rank %d", ds_names[ds], w->file, w->rank) != 0;
                else
                    failed = sd_err_set(e, "reading back dataset '%s' of %s failed on rank %d: "
                                        "the file ends early", ds_names[ds], w->file,
                                        w->rank) != 0;
            } else {
                sum += sd_ckpt_checksum(buf, first + off, cnt);
            }
        }
        if (!failed && sum != part[ds])
            failed = sd_err_set(e, "read back, rank %d's part of dataset '%s' of %s has checksum "
                                "%016llx, the data written %016llx: the file system returned "
                                "other data than was written", w->rank, ds_names[ds], w->file,
                                (unsigned long long)sum, (unsigned long long)part[ds]) != 0;
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    return failed ? -1 : 0;
}

/* Rank 0, before the commit: the datasets' checksum attributes. */
static int add_checksum_attrs(writer *w, sd_err *e)
{
    char h5msg[512];
    int failed = 0;
    sd_progress_io_enter_path("HDF5 write", w->file); /* the open to the close, as one call */
    hid_t f = sd_h5_fopen(w->file, H5F_ACC_RDWR, H5P_DEFAULT); /* this rank alone (sec2) */
    if (f < 0) {
        sd_progress_io_leave();
        return sd_err_set(e, "cannot open %s to add its checksums: %s", w->file,
                          sd_h5_error_string(h5msg, sizeof h5msg));
    }
    for (int ds = 0; ds < DS_N; ds++) {
        if (ds == DS_EMA && !w->s->has_ema)
            continue;
        hid_t d = H5Dopen2(f, ds_names[ds], H5P_DEFAULT);
        if (d < 0) {
            failed = 1;
            break;
        }
        checksum_attrs(d, w->sums[ds]);
        SD_H5_CHECK(H5Dclose(d));
    }
    if (H5Fclose(f) < 0)
        failed = 1;
    sd_progress_io_leave();
    if (failed)
        return sd_err_set(e, "cannot add the checksums to %s: %s", w->file,
                          sd_h5_error_string(h5msg, sizeof h5msg));
    return sd_fsync_path(w->file, e);
}

/* Collective, after every rank's write_parts (failed, e: this rank's verdict; part: its
 * checksums): the ranks agree, the checksums are summed, rank 0 adds them to the file and
 * commits (writer_end). */
static int finish_write(writer *w, int failed, sd_err *e, const uint64_t part[DS_N], int verify,
                        const char *config_text, sd_ckpt_keep keep, char *committed,
                        size_t committed_size, sd_err *err)
{
    sd_h5_quiet q;
    int rc = sd_agree(w->comm, failed, e);
    if (!rc) {
        SD_MPI_CHECK(MPI_Allreduce(part, w->sums, DS_N, MPI_UINT64_T, MPI_SUM, w->comm));
        w->verified = verify != 0;
        sd_h5_quiet_begin(&q);
        rc = sd_agree(w->comm, w->rank == 0 && add_checksum_attrs(w, e) != 0, e);
        sd_h5_quiet_end(&q);
    }
    return writer_end(w, rc, e, config_text, keep, committed, committed_size, err);
}

/* The background writer's thread. */
static void *async_main(void *arg)
{
    sd_ckpt_async *a = arg;
    const double t0 = sd_time_now();
    const float *src[DS_N];
    /* Test hook: SDTRAIN_TEST_CKPT_DELAY_MS=N: the writer starts N ms late (a slow file system),
     * so that steps, signals and the next checkpoint meet it in flight. */
    const char *delay = getenv("SDTRAIN_TEST_CKPT_DELAY_MS");
    if (delay && atol(delay) > 0) {
        const long ms = atol(delay);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    for (int ds = 0; ds < DS_N; ds++)
        src[ds] = a->snap + a->at[ds];
    a->failed = write_parts(&a->w, src, a->verify, a->part, &a->e) != 0;
    a->seconds = sd_time_now() - t0;
    atomic_store(&a->done, 1);
    return NULL;
}

int sd_ckpt_async_start(sd_ckpt_async **ap, MPI_Comm comm, const char *dir,
                        const sd_ckpt_scalars *s, const sd_ckpt_tensors *t,
                        const char *config_text, sd_ckpt_keep keep, int verify, sd_err *err)
{
    sd_ckpt_async *a = *ap;
    sd_h5_quiet q;
    sd_err e;
    size_t need = 0;
    int rc;
    if (!a)
        a = *ap = sd_xcalloc(1, sizeof *a);
    SD_CHECK(!a->in_flight, "checkpoint of step %lld started while that of step %lld is in flight",
             (long long)s->step, (long long)a->s.step);
    sd_err_clear(&e);
    a->s = *s;
    a->t = *t;
    if (writer_begin(&a->w, comm, dir, &a->s, &a->t, err))
        return -1;
    sd_h5_quiet_begin(&q);
    rc = create_state_file(&a->w, &e);
    sd_h5_quiet_end(&q);
    /* the copy: this rank's parts, in one buffer kept for the next checkpoint */
    for (int ds = 0; ds < DS_N && !rc; ds++) {
        a->at[ds] = need;
        if (ds != DS_EMA || s->has_ema)
            need += a->w.we[ds] - a->w.wb[ds];
    }
    /* the ranges are the run's: sd_ckpt_async_reserve made the room */
    SD_CHECK(rc || need <= a->snap_cap, "the background checkpoint's copy needs %zu floats, %zu "
             "reserved (sd_ckpt_async_reserve first)", need, a->snap_cap);
    if (rc) {
        if (a->w.rank == 0) {
            sd_err dummy;
            sd_remove_tree(a->w.tmp_dir, &dummy);
        }
        sd_err_set(err, "checkpoint of step %lld into '%s' not written (the previous checkpoint "
                   "stays the latest): %s", (long long)s->step, dir, e.msg);
        return -1;
    }
    {
        const float *from[DS_N] = {t->params, t->m, t->v, t->ema};
        for (int ds = 0; ds < DS_N; ds++) {
            if (ds == DS_EMA && !s->has_ema)
                continue;
            const size_t held_b = ds == DS_PARAMS ? 0 : t->begin, cnt = a->w.we[ds] - a->w.wb[ds];
            if (t->copy)
                t->copy(t->copy_ctx, a->snap + a->at[ds], from[ds] + (a->w.wb[ds] - held_b), cnt);
            else
                memcpy(a->snap + a->at[ds], from[ds] + (a->w.wb[ds] - held_b),
                       cnt * sizeof(float));
        }
    }
    a->t.params = a->t.m = a->t.v = a->t.ema = NULL; /* theirs, changing from now on */
    a->t.copy = NULL;
    a->t.copy_ctx = NULL;
    free(a->config_text);
    a->config_text = sd_xstrdup(config_text ? config_text : "");
    a->keep = keep;
    a->verify = verify;
    a->failed = 0;
    sd_err_clear(&a->e);
    memset(a->part, 0, sizeof a->part);
    atomic_store(&a->done, 0);
    {
        sigset_t all, old;
        sigfillset(&all);
        SD_CHECK(pthread_sigmask(SIG_SETMASK, &all, &old) == 0, "block signals");
        const int erc = pthread_create(&a->thread, NULL, async_main, a);
        SD_CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0, "restore signals");
        SD_CHECK(erc == 0, "cannot start the checkpoint writer thread: %s", strerror(erc));
    }
    a->thread_running = 1;
    a->in_flight = 1;
    return 0;
}

/* The copy given back (local). */
static void snap_release(sd_ckpt_async *a)
{
    host_floats_free(a->snap, a->snap_free, a->snap_ctx);
    a->snap = NULL;
    a->snap_cap = 0;
    a->snap_free = NULL;
    a->snap_ctx = NULL;
}

int sd_ckpt_async_pinned(const sd_ckpt_async *a)
{
    return a && a->snap && a->snap_free != NULL;
}

int sd_ckpt_async_reserve(sd_ckpt_async **ap, MPI_Comm comm, const sd_ckpt_tensors *t,
                          int has_ema, size_t *bytes, sd_err *err)
{
    sd_ckpt_async *a = *ap;
    size_t pb, pe, ob, oe, need;
    int rank, no_memory;
    if (!a)
        a = *ap = sd_xcalloc(1, sizeof *a);
    SD_CHECK(!a->in_flight, "the background checkpoint's copy reserved while one is in flight");
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (own_range(comm, t->n, 0, t->n, &pb, &pe, err) ||
        own_range(comm, t->n, t->begin, t->end, &ob, &oe, err))
        return -1;
    need = (pe - pb) + (2 + (has_ema != 0)) * (oe - ob);
    *bytes = need * sizeof(float);
    {
        /* Test hook: SDTRAIN_TEST_CKPT_NO_MEMORY=R: rank R of comm cannot hold its copy. */
        const char *nomem = getenv("SDTRAIN_TEST_CKPT_NO_MEMORY");
        no_memory = nomem && *nomem && atoi(nomem) == rank;
    }
    if (!no_memory && need > a->snap_cap) {
        snap_release(a);
        a->snap = host_floats(t, need, &a->snap_free);
        a->snap_ctx = t->copy_ctx;
        if (a->snap) {
            /* every page touched now, not in the first checkpoint's pause */
            memset(a->snap, 0, need * sizeof(float));
            a->snap_cap = need;
        } else {
            no_memory = 1;
        }
    }
    sd_err_clear(err);
    if (no_memory)
        sd_err_set(err, "rank %d has no room in host memory for its copy of the state (%.1f MiB)",
                   rank, (double)need * 4.0 / 1048576.0);
    return sd_agree(comm, no_memory, err) ? SD_CKPT_NO_MEMORY : 0;
}

int64_t sd_ckpt_async_step(const sd_ckpt_async *a)
{
    return a && a->in_flight ? a->s.step : -1;
}

int sd_ckpt_async_ready(sd_ckpt_async *a, MPI_Comm comm)
{
    int ready = !a || !a->in_flight || atomic_load(&a->done);
    SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ready, 1, MPI_INT, MPI_MIN, comm));
    return ready;
}

static void async_join(sd_ckpt_async *a)
{
    if (a->thread_running) {
        SD_CHECK(pthread_join(a->thread, NULL) == 0, "join the checkpoint writer thread");
        a->thread_running = 0;
    }
}

int sd_ckpt_async_finish(sd_ckpt_async *a, char *committed, size_t committed_size,
                         double *seconds, sd_err *err)
{
    sd_err e;
    SD_CHECK(a->in_flight, "no checkpoint in flight to finish");
    async_join(a);
    a->in_flight = 0;
    e = a->e;
    if (seconds) {
        *seconds = a->seconds;
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, seconds, 1, MPI_DOUBLE, MPI_MAX, a->w.comm));
    }
    return finish_write(&a->w, a->failed, &e, a->part, a->verify, a->config_text, a->keep,
                        committed, committed_size, err);
}

/* ---- writing at once ---------------------------------------------------------------------- */

int sd_ckpt_write(MPI_Comm comm, const char *dir, const sd_ckpt_scalars *s,
                  const sd_ckpt_tensors *t, const char *config_text, sd_ckpt_keep keep,
                  int verify, char *committed, size_t committed_size, sd_err *err)
{
    writer w;
    sd_err e;
    sd_h5_quiet q;
    uint64_t part[DS_N] = {0};
    int failed;
    sd_err_clear(&e);
    /* 1. rank 0 prepares an empty temporary directory, where there is room for the file, and
     * creates the file's structure there */
    if (writer_begin(&w, comm, dir, s, t, err))
        return -1;
    sd_h5_quiet_begin(&q);
    failed = create_state_file(&w, &e);
    sd_h5_quiet_end(&q);
    if (failed)
        return writer_end(&w, -1, &e, config_text, keep, committed, committed_size, err);
    /* 2. every rank writes its parts from the caller's buffers, syncs, reads them back */
    const float *src[DS_N] = {t->params + w.wb[DS_PARAMS], t->m + (w.wb[DS_M] - t->begin),
                              t->v + (w.wb[DS_V] - t->begin),
                              t->ema ? t->ema + (w.wb[DS_EMA] - t->begin) : NULL};
    failed = write_parts(&w, src, verify, part, &e) != 0;
    /* 3. rank 0 commits */
    return finish_write(&w, failed, &e, part, verify, config_text, keep, committed,
                        committed_size, err);
}

void sd_ckpt_async_free(sd_ckpt_async *a)
{
    if (!a)
        return;
    async_join(a);
    snap_release(a);
    free(a->config_text);
    free(a);
}

/* ---- resolving what to resume --------------------------------------------------------------- */

/* Rank 0: leftovers of interrupted writes are never valid checkpoints. */
static void remove_leftovers(const char *dir)
{
    DIR *d = sd_opendir(dir);
    struct dirent *de;
    if (!d)
        return;
    while ((de = sd_readdir(d))) {
        size_t len = strlen(de->d_name);
        char path[PATH_SIZE];
        sd_err e;
        int tmp = len > 4 && !strcmp(de->d_name + len - 4, ".tmp");
        int old = len > 4 && !strcmp(de->d_name + len - 4, ".old");
        if (!(tmp || old) || (strncmp(de->d_name, ".step-", 6) != 0 &&
                              strcmp(de->d_name, SD_CKPT_LATEST ".tmp") != 0))
            continue;
        sd_err_clear(&e);
        if (join(path, sizeof path, dir, de->d_name, &e))
            continue;
        if (sd_remove_tree(path, &e))
            sd_warn("%s", e.msg);
        else
            sd_info("removed %s, left by an interrupted checkpoint write", path);
    }
    closedir(d);
}

/* sd_ckpt_is_complete with the storage's failures told apart: 1 complete, 0 not, -1 with err
 * set (and marked a storage error for EIO, ESTALE, ...) when a stat cannot tell. */
static int complete_or_err(const char *path, sd_err *err)
{
    static const char *const files[2] = {SD_CKPT_MANIFEST, SD_CKPT_STATE_FILE};
    for (int i = 0; i < 2; i++) {
        char p[PATH_SIZE];
        int r;
        if (join(p, sizeof p, path, files[i], err))
            return -1;
        if ((r = stat_exists(p)) < 0)
            return sd_err_errno(err, errno, "cannot look at '%s'", p);
        if (r == 0)
            return 0;
    }
    return 1;
}

int sd_ckpt_is_complete(const char *path)
{
    sd_err e;
    sd_err_clear(&e);
    return complete_or_err(path, &e) == 1;
}

/* The newest complete checkpoint directory of dir (complete_or_err) with a step below `below`,
 * into name; "" when none (dir missing included): 0. A listing or a look the storage fails is an
 * error, -1: taking it for "no checkpoint" would start the run over, or resume an older
 * checkpoint than the newest. */
static int newest_complete(const char *dir, int64_t below, char *name, size_t size, sd_err *err)
{
    DIR *d = sd_opendir(dir);
    int64_t best = -1;
    int rc = 0;
    name[0] = '\0';
    if (!d)
        return errno == ENOENT ? 0
                               : sd_err_errno(err, errno, "cannot list checkpoint directory '%s'",
                                              dir);
    for (;;) {
        char path[PATH_SIZE];
        int64_t st;
        int r;
        errno = 0;
        struct dirent *de = sd_readdir(d);
        if (!de) {
            if (errno)
                rc = sd_err_errno(err, errno, "cannot list checkpoint directory '%s'", dir);
            break;
        }
        if (!is_step_name(de->d_name, &st) || st <= best || st >= below ||
            strlen(de->d_name) >= size ||
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path)
            continue;
        if ((r = complete_or_err(path, err)) < 0) {
            rc = -1;
            break;
        }
        if (r) {
            best = st;
            snprintf(name, size, "%s", de->d_name);
        }
    }
    closedir(d);
    if (rc)
        name[0] = '\0';
    return rc;
}

/* `latest` of dir := name (atomically). */
static int point_latest(const char *dir, const char *name, sd_err *err)
{
    char path[PATH_SIZE], text[128];
    snprintf(text, sizeof text, "%s\n", name);
    if (join(path, sizeof path, dir, SD_CKPT_LATEST, err))
        return -1;
    return sd_write_file_atomic(path, text, strlen(text), err);
}

/* Rank 0, resume = 'auto' and `latest` naming a missing, incomplete or damaged checkpoint
 * `bad_name` (`bad` says which and why): the newest complete checkpoint before it in dir into
 * path, `latest` pointed at it, and a warning: 0. None left: an error saying so. Later steps are
 * not looked at: they belong to another run (one this run started over from, or that resumed
 * from an older checkpoint), whose weights would silently replace this run's. */
static int fall_back(const char *dir, const char *bad_name, const char *bad, char *path,
                     size_t size, sd_err *err)
{
    char name[128];
    int64_t below;
    if (!is_step_name(bad_name, &below))
        below = INT64_MAX;
    if (newest_complete(dir, below, name, sizeof name, err))
        return -1;
    if (!name[0])
        return sd_err_set(err, "%s, and %s holds no older complete checkpoint; start fresh with "
                          "&checkpoint resume = 'never'", bad, dir);
    if (snprintf(path, size, "%s/%s", dir, name) >= (int)size)
        return sd_err_set(err, "path too long: '%s/%s'", dir, name);
    sd_warn("resume: %s; continuing from the newest complete checkpoint before it, %s", bad,
            path);
    return point_latest(dir, name, err);
}

static int resolve_root(const char *dir, const char *resume, char *path, size_t size, int *found,
                        sd_err *err)
{
    char name[128];
    int r;
    *found = 0;
    remove_leftovers(dir);
    if (!strcmp(resume, "never")) {
        if (sd_ckpt_read_latest(dir, name, sizeof name, err) == 0 && name[0])
            sd_warn("&checkpoint resume = 'never': starting fresh although %s holds checkpoints "
                    "(latest: %s); this run's checkpoints replace them (each one of the same "
                    "step as this run reaches it; later ones are left alone by keep_last and "
                    "by the fall-back to an older checkpoint)", dir, name);
        sd_err_clear(err);
        return 0;
    }
    if (!strcmp(resume, "auto")) {
        if (sd_ckpt_read_latest(dir, name, sizeof name, err))
            return -1;
        if (!name[0]) {
            /* no `latest`: a first commit interrupted before it was written (or `latest`
             * removed) can leave a complete checkpoint all the same, which a requeued job must
             * resume rather than start over and replace */
            if (newest_complete(dir, INT64_MAX, name, sizeof name, err))
                return -1;
            if (!name[0]) {
                sd_info("no checkpoint in %s: starting from step 0", dir);
                return 0;
            }
            sd_warn("resume: %s has no '%s' but holds the complete checkpoint %s (a commit "
                    "interrupted before '%s' was written?); resuming from it", dir,
                    SD_CKPT_LATEST, name, SD_CKPT_LATEST);
            if (snprintf(path, size, "%s/%s", dir, name) >= (int)size)
                return sd_err_set(err, "path too long: '%s/%s'", dir, name);
            if (point_latest(dir, name, err))
                return -1;
            *found = 1;
            return 0;
        }
        if (snprintf(path, size, "%s/%s", dir, name) >= (int)size)
            return sd_err_set(err, "path too long: '%s/%s'", dir, name);
        if ((r = complete_or_err(path, err)) < 0)
            return -1;
        if (!r) {
            char bad[2 * PATH_SIZE + 256];
            snprintf(bad, sizeof bad, "%s/%s names %s, which is missing or incomplete (no %s or "
                     "%s)", dir, SD_CKPT_LATEST, path, SD_CKPT_MANIFEST, SD_CKPT_STATE_FILE);
            if (fall_back(dir, name, bad, path, size, err))
                return -1;
        }
        *found = 1;
        return 0;
    }
    if ((r = complete_or_err(resume, err)) < 0)
        return -1;
    if (r) {
        if (snprintf(path, size, "%s", resume) >= (int)size)
            return sd_err_set(err, "path too long: '%s'", resume);
        *found = 1;
        return 0;
    }
    if ((r = sd_ckpt_read_latest(resume, name, sizeof name, err)) != 0 && err->storage)
        return -1; /* a `latest` the storage cannot deliver is not a missing one */
    if (r == 0 && name[0]) {
        if (snprintf(path, size, "%s/%s", resume, name) >= (int)size)
            return sd_err_set(err, "path too long: '%s/%s'", resume, name);
        if ((r = complete_or_err(path, err)) < 0)
            return -1;
        if (r) {
            *found = 1;
            return 0;
        }
    }
    return sd_err_set(err, "&checkpoint resume = '%s': not a complete checkpoint directory (it "
                      "needs %s and %s) nor a checkpoint directory with a valid '%s'", resume,
                      SD_CKPT_MANIFEST, SD_CKPT_STATE_FILE, SD_CKPT_LATEST);
}

int sd_ckpt_set_aside(MPI_Comm comm, const char *dir, const char *path, const char *why,
                      char *older, size_t older_size, sd_err *err)
{
    int rank, failed = 0;
    char *buf = sd_xcalloc(1, PATH_SIZE);
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0) {
        char aside[PATH_SIZE + 32], bad[PATH_SIZE + 1200];
        int k = 1;
        snprintf(aside, sizeof aside, "%s.damaged", path);
        while (path_exists(aside) && k < 1000)
            snprintf(aside, sizeof aside, "%s.damaged.%d", path, ++k);
        if (rename(path, aside) != 0) {
            failed = sd_err_set(err, "%s; moving it aside to '%s' failed: %s", why, aside,
                                strerror(errno)) != 0;
        } else {
            snprintf(bad, sizeof bad, "%s (moved aside to %s)", why, aside);
            const char *base = strrchr(path, '/');
            failed = fall_back(dir, base ? base + 1 : path, bad, buf, PATH_SIZE, err) != 0;
        }
    }
    if (sd_agree(comm, failed, err)) {
        free(buf);
        return -1;
    }
    SD_MPI_CHECK(MPI_Bcast(buf, PATH_SIZE, MPI_CHAR, 0, comm));
    snprintf(older, older_size, "%s", buf);
    free(buf);
    return 0;
}

int sd_ckpt_resolve(MPI_Comm comm, const char *dir, const char *resume, char *path,
                    size_t path_size, int *found, sd_err *err)
{
    int rank, failed = 0, f = 0;
    char *buf = sd_xcalloc(1, PATH_SIZE);
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0)
        failed = resolve_root(dir, resume, buf, PATH_SIZE, &f, err) != 0;
    if (sd_agree(comm, failed, err)) {
        free(buf);
        return -1;
    }
    SD_MPI_CHECK(MPI_Bcast(&f, 1, MPI_INT, 0, comm));
    SD_MPI_CHECK(MPI_Bcast(buf, PATH_SIZE, MPI_CHAR, 0, comm));
    *found = f;
    snprintf(path, path_size, "%s", f ? buf : "");
    free(buf);
    return 0;
}

/* ---- loading -------------------------------------------------------------------------------- */

/* What rank 0 found in the manifest, broadcast as bytes. */
typedef struct loaded {
    sd_ckpt_scalars s;
    uint64_t n;
    uint64_t sums[DS_N];
    int64_t bytes;
    int64_t config_len;
    char version[64];
    int verified; /* "verified_after_write": true (absent in older manifests) */
} loaded;

/* What a caller learns of a checkpoint besides its tensors (info takes `config`). */
static void fill_info(sd_ckpt_info *info, const loaded *L, char *config, const char *path)
{
    info->s = L->s;
    info->verified_after_write = L->verified;
    info->config_text = config;
    snprintf(info->path, sizeof info->path, "%s", path);
    snprintf(info->sdtrain_version, sizeof info->sdtrain_version, "%s", L->version);
}

static int json_i64(json_object *o, const char *key, int64_t *out, const char *path, sd_err *err)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !(json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_boolean)))
        return sd_err_set(err, "%s: missing or non-integer \"%s\"", path, key);
    *out = json_object_get_int64(v);
    return 0;
}

static const char *json_str(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* After HDF5 or json-c failed to open or read `file`: reads [off, off + len) (at most 256 MiB,
 * and not past the end) again with plain POSIX calls. Returns the errno of a storage failure, or
 * 0 when the bytes can be read (the reader refused what they hold: the file is damaged) or the
 * error is of another kind (a missing file). */
static int probe_storage(const char *file, uint64_t off, uint64_t len)
{
    char *buf = sd_xmalloc(1 << 20);
    int fd = sd_open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0), e = 0;
    if (fd < 0) {
        e = errno;
        free(buf);
        return sd_storage_errno(e) ? e : 0;
    }
    if (len > ((uint64_t)256 << 20))
        len = (uint64_t)256 << 20;
    for (uint64_t done = 0; done < len && !e;) {
        const size_t want = len - done < (1u << 20) ? (size_t)(len - done) : (1u << 20);
        const ssize_t got = pread(fd, buf, want, (off_t)(off + done));
        if (got < 0 && errno != EINTR)
            e = errno;
        else if (got == 0)
            break; /* the end of the file */
        else if (got > 0)
            done += (uint64_t)got;
    }
    close(fd);
    free(buf);
    return sd_storage_errno(e) ? e : 0;
}

/* Rank 0: the manifest, checked for format and completeness and against this run's model.
 * *incompatible is 1 when the checkpoint is intact but not for this sdtrain or this model (another
 * format or version, another parameter table), 2 when the storage failed to deliver the manifest
 * or the state file's size (probe_storage); every other failure means damaged files. */
static int read_manifest(const char *dir, const sd_ckpt_tensors *t, loaded *L, char **config,
                         int *incompatible, sd_err *err)
{
    char path[PATH_SIZE], file[PATH_SIZE];
    json_object *root, *arr, *sums;
    const char *str;
    int64_t v;
    struct stat st;
    int rc = -1;
    if (join(path, sizeof path, dir, SD_CKPT_MANIFEST, err) ||
        join(file, sizeof file, dir, SD_CKPT_STATE_FILE, err))
        return -1;
    root = json_object_from_file(path);
    if (!root) {
        const char *why = json_util_get_last_err();
        const int e = probe_storage(path, 0, UINT64_MAX);
        if (e) {
            *incompatible = 2;
            return sd_err_set(err, "cannot read checkpoint manifest '%s': %s (a storage error, "
                              "not damage: the checkpoint may be intact)", path, strerror(e));
        }
        return sd_err_set(err, "cannot read checkpoint manifest '%s': %s", path,
                          !path_exists(path) ? strerror(ENOENT) : why ? why : "malformed JSON");
    }
    str = json_str(root, "format");
    if (!str || strcmp(str, SD_CKPT_FORMAT) != 0) {
        sd_err_set(err, "%s: not an sdtrain checkpoint manifest (format '%s')", path,
                   str ? str : "?");
        *incompatible = str != NULL;
        goto out;
    }
    if (json_i64(root, "version", &v, path, err))
        goto out;
    if (v != SD_CKPT_FORMAT_VERSION) {
        sd_err_set(err, "%s: checkpoint format version %lld; this sdtrain reads version %d", path,
                   (long long)v, SD_CKPT_FORMAT_VERSION);
        *incompatible = 1;
        goto out;
    }
    {
        json_object *vo;
        L->verified = json_object_object_get_ex(root, "verified_after_write", &vo) &&
                      json_object_is_type(vo, json_type_boolean) && json_object_get_boolean(vo);
    }
    if (json_i64(root, "step", &L->s.step, path, err) ||
        json_i64(root, "opt_step", &L->s.opt_step, path, err) ||
        json_i64(root, "skipped", &L->s.skipped, path, err) ||
        json_i64(root, "epoch", &L->s.epoch, path, err) ||
        json_i64(root, "steps_per_epoch", &L->s.steps_per_epoch, path, err) ||
        json_i64(root, "global_batch", &L->s.global_batch, path, err) ||
        json_i64(root, "batch_size_per_rank", &L->s.batch_per_rank, path, err) ||
        json_i64(root, "seed", &L->s.seed, path, err) ||
        json_i64(root, "n_ranks", &L->s.n_ranks, path, err) ||
        json_i64(root, "has_ema", &L->s.has_ema, path, err) ||
        json_i64(root, "bytes", &L->bytes, path, err) || json_i64(root, "n_floats", &v, path, err))
        goto out;
    /* What any writer's numbers satisfy; a manifest outside them was edited or damaged, and a
     * resume from it would seek the data to a negative step or divide by a zero batch. */
    {
        const sd_ckpt_scalars *c = &L->s;
        const char *bad = c->step < 0                                  ? "step < 0"
                          : c->opt_step < 0 || c->opt_step > c->step   ? "opt_step outside 0..step"
                          : c->skipped < 0 || c->skipped > c->step     ? "skipped outside 0..step"
                          : c->steps_per_epoch < 1 || c->epoch < 0     ? "steps_per_epoch < 1 or epoch < 0"
                          : c->batch_per_rank < 1 || c->n_ranks < 1    ? "batch_size_per_rank or n_ranks < 1"
                          : c->global_batch < 1 || c->global_batch > INT64_MAX / 2
                              ? "global_batch outside 1..2^62"
                          : c->seed < 0 || c->seed > 4294967295LL       ? "seed outside 0..4294967295"
                          : (c->has_ema != 0 && c->has_ema != 1)       ? "has_ema not 0 or 1"
                          : L->bytes < 0 || v < 0                      ? "bytes or n_floats < 0"
                                                                       : NULL;
        if (bad) {
            sd_err_set(err, "%s: not a consistent checkpoint manifest: %s", path, bad);
            goto out;
        }
    }
    L->n = (uint64_t)v;
    snprintf(L->s.sharding, sizeof L->s.sharding, "%s", (str = json_str(root, "sharding")) ? str : "");
    snprintf(L->version, sizeof L->version, "%s",
             (str = json_str(root, "sdtrain_version")) ? str : "?");
    str = json_str(root, "checksum_algorithm");
    if (!str || strcmp(str, SD_CKPT_CHECKSUM_ALGORITHM) != 0) {
        sd_err_set(err, "%s: unknown checksum algorithm '%s'", path, str ? str : "?");
        goto out;
    }
    if (!json_object_object_get_ex(root, "checksums", &sums)) {
        sd_err_set(err, "%s: no \"checksums\"", path);
        goto out;
    }
    for (int ds = 0; ds < DS_N; ds++) {
        if (ds == DS_EMA && !L->s.has_ema)
            continue;
        str = json_str(sums, ds_names[ds]);
        if (!str || strlen(str) != 16 || strspn(str, "0123456789abcdef") != 16) {
            sd_err_set(err, "%s: missing or malformed checksum of dataset '%s'", path, ds_names[ds]);
            goto out;
        }
        L->sums[ds] = strtoull(str, NULL, 16);
    }
    if (!t) /* sd_ckpt_peek: the scalars and the configuration only */
        goto config;
    /* the same model: the parameter table must match name by name */
    if (!json_object_object_get_ex(root, "parameters", &arr) ||
        !json_object_is_type(arr, json_type_array)) {
        sd_err_set(err, "%s: no \"parameters\" table", path);
        goto out;
    }
    if (L->n != t->n || json_object_array_length(arr) != t->table->n) {
        sd_err_set(err, "checkpoint %s holds a model of %zu tensors in %llu floats; this run's "
                   "U-Net has %zu tensors in %zu floats (a different &model?)", dir,
                   json_object_array_length(arr), (unsigned long long)L->n, t->table->n, t->n);
        *incompatible = 1;
        goto out;
    }
    for (size_t i = 0; i < t->table->n; i++) {
        const sd_param *p = &t->table->params[i];
        json_object *o = json_object_array_get_idx(arr, i), *shape;
        const char *name = json_str(o, "name");
        int64_t off = -1;
        int same = name && !strcmp(name, p->name) && json_i64(o, "offset", &off, path, err) == 0 &&
                   off == (int64_t)p->offset && json_object_object_get_ex(o, "shape", &shape) &&
                   json_object_array_length(shape) == (size_t)p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = json_object_get_int64(json_object_array_get_idx(shape, (size_t)d)) == p->shape[d];
        if (!same) {
            sd_err_set(err, "checkpoint %s holds a different model: tensor %zu is '%s' there, "
                       "'%s' here (or its shape or offset differs; a different &model?)", dir, i,
                       name ? name : "?", p->name);
            *incompatible = 1;
            goto out;
        }
    }
    const int stat_rc = sd_stat(file, &st), stat_errno = stat_rc != 0 ? errno : 0;
    if (stat_rc != 0 && sd_storage_errno(stat_errno)) {
        sd_err_set(err, "cannot stat checkpoint file %s: %s (a storage error, not damage: the "
                   "checkpoint may be intact)", file, strerror(stat_errno));
        *incompatible = 2;
        goto out;
    }
    if (stat_rc != 0 || (int64_t)st.st_size != L->bytes) {
        sd_err_set(err, "checkpoint %s is incomplete: %s is %s (the manifest says %lld bytes)",
                   dir, file, path_exists(file) ? "of another size" : "missing",
                   (long long)L->bytes);
        goto out;
    }
config:
    str = json_str(root, "config");
    *config = sd_xstrdup(str ? str : "");
    L->config_len = (int64_t)strlen(*config);
    rc = 0;
out:
    json_object_put(root);
    return rc;
}

/* Reads [b, e) of a full-length dataset into dst. Local (the file is open on this rank only).
 * A failed read whose bytes the storage cannot deliver (probe_storage) sets *io_failure
 * (may be NULL) and says so in the message. */
static int read_range_h5(hid_t f, const char *file, int ds, uint64_t n, size_t b, size_t e,
                         float *dst, int *io_failure, sd_err *err)
{
    hid_t d, space, mspace, type;
    hsize_t dims[1], start[1] = {b}, count[1] = {e - b};
    int nd, ok;
    herr_t rc;
    char h5msg[512];
    d = H5Dopen2(f, ds_names[ds], H5P_DEFAULT);
    if (d < 0) {
        /* the storage failed reading the dataset's header (the driver's errno), or the header
         * is damaged */
        const int io = sd_h5_storage_errno();
        sd_h5_error_string(h5msg, sizeof h5msg);
        if (io_failure)
            *io_failure |= io != 0;
        if (io)
            return sd_err_set(err, "checkpoint %s: cannot open dataset '%s': %s (a storage "
                              "error, not damage: the checkpoint may be intact)", file,
                              ds_names[ds], strerror(io));
        return sd_err_set(err, "checkpoint %s: cannot open dataset '%s': %s", file, ds_names[ds],
                          h5msg);
    }
    SD_H5_CHECK(space = H5Dget_space(d));
    SD_H5_CHECK(type = H5Dget_type(d));
    nd = H5Sget_simple_extent_dims(space, dims, NULL);
    ok = nd == 1 && dims[0] == n && H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == 4;
    SD_H5_CHECK(H5Tclose(type));
    if (!ok) {
        H5Sclose(space);
        H5Dclose(d);
        return sd_err_set(err, "checkpoint %s: dataset '%s' is not %llu float32 values", file,
                          ds_names[ds], (unsigned long long)n);
    }
    rc = 0;
    if (e > b) {
        SD_H5_CHECK(mspace = H5Screate_simple(1, count, NULL));
        SD_H5_CHECK(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, NULL, count, NULL));
        rc = H5Dread(d, H5T_NATIVE_FLOAT, mspace, space, H5P_DEFAULT, dst);
        if (rc < 0) {
            /* the driver's errno from HDF5's error stack, else the bytes read again */
            const int h5e = sd_h5_storage_errno();
            sd_h5_error_string(h5msg, sizeof h5msg);
            const haddr_t at = h5e ? HADDR_UNDEF : H5Dget_offset(d);
            const int io = h5e                 ? h5e
                           : at == HADDR_UNDEF ? 0
                                               : probe_storage(file, at + 4 * (uint64_t)b,
                                                               4 * (e - b));
            if (io)
                sd_err_set(err, "checkpoint %s: reading dataset '%s' failed: %s (a storage "
                           "error, not damage: the checkpoint may be intact)", file, ds_names[ds],
                           strerror(io));
            else
                sd_err_set(err, "checkpoint %s: cannot read dataset '%s': %s", file, ds_names[ds],
                           h5msg);
            if (io_failure)
                *io_failure |= io != 0;
        }
        SD_H5_CHECK(H5Sclose(mspace));
    }
    SD_H5_CHECK(H5Sclose(space));
    SD_H5_CHECK(H5Dclose(d));
    return rc < 0 ? -1 : 0;
}

/* HDF5's reads of [b, e) of dataset ds into dst, marked as one call on the file (a hang in them
 * is reported with it). Returns 0, or -1 with err set (*io_failure |= a storage error). */
static int read_range(hid_t f, const char *file, int ds, uint64_t n, size_t b, size_t e,
                      float *dst, int *io_failure, sd_err *err)
{
    sd_progress_io_enter_path("HDF5 read", file);
    const int rc = read_range_h5(f, file, ds, n, b, e, dst, io_failure, err);
    sd_progress_io_leave();
    sd_progress_tick();
    return rc;
}

/* The checksum of the floats [x, x + cnt) at p, counted over the part of them inside [ob, oe)
 * (the rank's share of the checksum work: with DDP every rank holds a dataset's whole range, and
 * each counts a disjoint part of it). */
static uint64_t owned_checksum(const float *p, size_t x, size_t cnt, size_t ob, size_t oe)
{
    const size_t lo = x > ob ? x : ob, hi = x + cnt < oe ? x + cnt : oe;
    return hi > lo ? sd_ckpt_checksum(p + (lo - x), lo, hi - lo) : 0;
}

/* Dataset ds (m, v or ema: the rank's range [t->begin, t->end)) through one host block into the
 * other memory of t->upload, 64 MiB at a time; *part += the checksum of the owned [ob, oe). */
static int read_range_up(hid_t f, const char *file, const loaded *L, const sd_ckpt_tensors *t,
                         int ds, float *dst, float *stage, size_t block, size_t ob, size_t oe,
                         uint64_t *part, int *io, sd_err *err)
{
    for (size_t x = t->begin; x < t->end; x += block) {
        const size_t cnt = t->end - x < block ? t->end - x : block;
        if (read_range(f, file, ds, L->n, x, x + cnt, stage, io, err))
            return -1;
        *part += owned_checksum(stage, x, cnt, ob, oe);
        t->upload(t->copy_ctx, dst + (x - t->begin), stage, cnt);
    }
    return 0;
}

/* This rank's part of the checkpoint: parameters [pb, pe) (the rest comes from the other ranks
 * by an allgather), optimizer moments and EMA over the rank's held range (with t->upload, through
 * one host block into the other memory); part[ds] := the checksum of the parameters [pb, pe) and
 * of the owned [ob, oe) of the others. Returns 0, 1 (the file is damaged) or 2 (the storage
 * failed the read: probe_storage). SDTRAIN_FAULT eio:rank=R:phase=ckpt-load[:step=K] makes the
 * read of the checkpoint of step K fail as EIO. */
static int read_tensors(const char *file, const loaded *L, const sd_ckpt_tensors *t, size_t pb,
                        size_t pe, size_t ob, size_t oe, uint64_t part[DS_N], sd_err *err)
{
    const size_t block = block_floats();
    float *dst[DS_N] = {t->params, t->m, t->v, t->ema};
    float *stage = NULL;
    void (*stage_release)(void *, void *) = NULL;
    hid_t f;
    int rc = 0, io = 0, world_rank;
    char h5msg[512];
    memset(part, 0, DS_N * sizeof *part);
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    if (sd_fault_armed(SD_FAULT_EIO, world_rank, L->s.step, "ckpt-load")) {
        sd_err_set(err, "checkpoint %s: reading dataset 'params' failed: %s (a storage error, "
                   "not damage: the checkpoint may be intact) [SDTRAIN_FAULT]", file,
                   strerror(EIO));
        return 2;
    }
    /* every rank reads on its own (sec2): nothing collective can hang on a bad file */
    f = sd_h5_fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        const int h5e = sd_h5_storage_errno();
        sd_h5_error_string(h5msg, sizeof h5msg);
        const int e = h5e ? h5e : probe_storage(file, 0, 8);
        if (e) {
            sd_err_set(err, "cannot open checkpoint file %s: %s (a storage error, not damage: the "
                       "checkpoint may be intact)", file, strerror(e));
            return 2;
        }
        sd_err_set(err, "cannot open checkpoint file %s: %s", file, h5msg);
        return 1;
    }
    if (t->upload) {
        stage = host_floats(t, block, &stage_release);
        SD_CHECK(stage != NULL, "out of memory for a %zu MiB block", block * sizeof(float) >> 20);
    }
    for (int ds = 0; ds < DS_N && !rc; ds++) {
        if (ds == DS_EMA && (!L->s.has_ema || !t->ema))
            continue;
        if (ds == DS_PARAMS) {
            rc = read_range(f, file, ds, L->n, pb, pe, dst[ds] + pb, &io, err);
            if (!rc)
                part[ds] = sd_ckpt_checksum(dst[ds] + pb, pb, pe - pb);
        } else if (t->upload) {
            rc = read_range_up(f, file, L, t, ds, dst[ds], stage, block, ob, oe, &part[ds], &io,
                               err);
        } else {
            rc = read_range(f, file, ds, L->n, t->begin, t->end, dst[ds], &io, err);
            if (!rc)
                part[ds] = owned_checksum(dst[ds], t->begin, t->end - t->begin, ob, oe);
        }
    }
    host_floats_free(stage, stage_release, t->copy_ctx);
    if (H5Fclose(f) < 0 && !rc)
        rc = sd_err_set(err, "cannot close checkpoint file %s", file);
    return rc ? 1 + io : 0;
}

int sd_ckpt_load(MPI_Comm comm, const char *path, const sd_ckpt_tensors *t, sd_ckpt_info *info,
                 sd_err *err)
{
    loaded L;
    char *config = NULL, file[PATH_SIZE];
    int rank, failed = 0, incompatible = 0;
    size_t pb, pe, ob, oe;
    uint64_t part[DS_N] = {0}, sums[DS_N];
    sd_h5_quiet q;
    memset(&L, 0, sizeof L);
    memset(info, 0, sizeof *info);
    SD_MPI_CHECK(MPI_Comm_rank(comm, &rank));
    if (rank == 0)
        failed = read_manifest(path, t, &L, &config, &incompatible, err) != 0;
    if (sd_agree(comm, failed, err)) {
        free(config);
        SD_MPI_CHECK(MPI_Bcast(&incompatible, 1, MPI_INT, 0, comm));
        return incompatible == 2 ? SD_CKPT_IO_ERROR : incompatible ? -1 : SD_CKPT_DAMAGED;
    }
    SD_MPI_CHECK(MPI_Bcast(&L, (int)sizeof L, MPI_BYTE, 0, comm));
    if (rank != 0)
        config = sd_xcalloc((size_t)L.config_len + 1, 1);
    if (L.config_len > 0)
        SD_MPI_CHECK(MPI_Bcast(config, (int)L.config_len, MPI_CHAR, 0, comm));
    fill_info(info, &L, config, path);
    snprintf(file, sizeof file, "%s/%s", path, SD_CKPT_STATE_FILE);

    if (own_range(comm, t->n, 0, t->n, &pb, &pe, err) ||
        own_range(comm, t->n, t->begin, t->end, &ob, &oe, err)) {
        sd_ckpt_info_free(info);
        return -1;
    }
    sd_h5_quiet_begin(&q);
    failed = read_tensors(file, &L, t, pb, pe, ob, oe, part, err);
    sd_h5_quiet_end(&q);
    {
        int worst;
        SD_MPI_CHECK(MPI_Allreduce(&failed, &worst, 1, MPI_INT, MPI_MAX, comm));
        if (sd_agree(comm, failed != 0, err)) {
            sd_ckpt_info_free(info);
            /* a storage failure on any rank: the files may be intact, so never set them aside */
            return worst == 2 ? SD_CKPT_IO_ERROR : SD_CKPT_DAMAGED;
        }
    }
    /* each rank read one slice of the parameters (not all of them: at scale that is the
     * file read once per rank); the slices are sd_comm_shard's, so the allgather completes them */
    {
        sd_comm *c = sd_comm_create_mpi(comm);
        size_t cb, ce;
        sd_comm_shard(c, t->n, &cb, &ce);
        SD_CHECK(cb == pb && ce == pe, "checkpoint: parameter slice [%zu, %zu) is not the "
                 "collectives' shard [%zu, %zu)", pb, pe, cb, ce);
        sd_allgather_f32(c, t->params, t->n);
        sd_comm_destroy(c);
    }

    /* checksums over the ranks' disjoint slices, summed: each dataset verified exactly once */
    SD_MPI_CHECK(MPI_Allreduce(part, sums, DS_N, MPI_UINT64_T, MPI_SUM, comm));
    for (int ds = 0; ds < DS_N; ds++) {
        if (ds == DS_EMA && !(L.s.has_ema && t->ema))
            continue;
        if (sums[ds] != L.sums[ds]) {
            sd_ckpt_info_free(info);
            sd_err_set(err, "checkpoint %s: dataset '%s' fails its checksum (%s: manifest "
                       "%016llx, data %016llx): the file is corrupt", file,
                       ds_names[ds], SD_CKPT_CHECKSUM_ALGORITHM,
                       (unsigned long long)L.sums[ds], (unsigned long long)sums[ds]);
            return SD_CKPT_DAMAGED;
        }
    }
    return 0;
}

/* ---- one process, one dataset (sdtool export) ----------------------------------------------- */

int sd_ckpt_peek(const char *path, sd_ckpt_info *info, sd_err *err)
{
    loaded L;
    char *config = NULL;
    int incompatible = 0;
    memset(&L, 0, sizeof L);
    memset(info, 0, sizeof *info);
    if (read_manifest(path, NULL, &L, &config, &incompatible, err))
        return -1;
    fill_info(info, &L, config, path);
    return 0;
}

int sd_ckpt_read_dataset(const char *path, const sd_param_table *table, const char *dataset,
                         float *dst, sd_ckpt_info *info, sd_err *err)
{
    loaded L;
    sd_ckpt_tensors t;
    char *config = NULL, file[PATH_SIZE];
    int ds = -1, rc, incompatible = 0;
    hid_t f;
    uint64_t sum;
    char h5msg[512];
    sd_h5_quiet q;
    for (int i = 0; i < DS_N; i++)
        if (!strcmp(dataset, ds_names[i]))
            ds = i;
    if (ds < 0)
        return sd_err_set(err, "checkpoint %s: no dataset called '%s'", path, dataset);
    memset(&L, 0, sizeof L);
    memset(&t, 0, sizeof t);
    memset(info, 0, sizeof *info);
    t.table = table;
    t.n = table->total_floats;
    if (read_manifest(path, &t, &L, &config, &incompatible, err))
        return -1;
    fill_info(info, &L, config, path);
    if (ds == DS_EMA && !L.s.has_ema) {
        sd_ckpt_info_free(info);
        return sd_err_set(err, "checkpoint %s has no EMA (the run had &train ema_decay = 0)",
                          path);
    }
    snprintf(file, sizeof file, "%s/%s", path, SD_CKPT_STATE_FILE);
    sd_h5_quiet_begin(&q);
    f = sd_h5_fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        rc = sd_err_set(err, "cannot open checkpoint file %s: %s", file,
                        sd_h5_error_string(h5msg, sizeof h5msg));
    } else {
        rc = read_range(f, file, ds, L.n, 0, t.n, dst, NULL, err);
        if (H5Fclose(f) < 0 && !rc)
            rc = sd_err_set(err, "cannot close checkpoint file %s", file);
    }
    sd_h5_quiet_end(&q);
    if (rc) {
        sd_ckpt_info_free(info);
        return -1;
    }
    sum = sd_ckpt_checksum(dst, 0, t.n);
    if (sum != L.sums[ds]) {
        sd_ckpt_info_free(info);
        return sd_err_set(err, "checkpoint %s: dataset '%s' fails its checksum (%s: manifest "
                          "%016llx, data %016llx): the file is corrupt", file, ds_names[ds],
                          SD_CKPT_CHECKSUM_ALGORITHM, (unsigned long long)L.sums[ds],
                          (unsigned long long)sum);
    }
    return 0;
}

int sd_ckpt_verify(const char *path, sd_ckpt_info *info, sd_ckpt_dataset_check out[4],
                   int *n_out, sd_err *err)
{
    loaded L;
    char *config = NULL, file[PATH_SIZE], h5msg[512];
    int incompatible = 0, rc = 0;
    hid_t f;
    sd_h5_quiet q;
    struct stat st;
    memset(&L, 0, sizeof L);
    memset(info, 0, sizeof *info);
    *n_out = 0;
    if (read_manifest(path, NULL, &L, &config, &incompatible, err))
        return -1;
    fill_info(info, &L, config, path);
    snprintf(file, sizeof file, "%s/%s", path, SD_CKPT_STATE_FILE);
    if (sd_stat(file, &st) != 0 || (int64_t)st.st_size != L.bytes) {
        sd_ckpt_info_free(info);
        return sd_err_set(err, "checkpoint %s is incomplete: %s is %s (the manifest says %lld "
                          "bytes)", path, file, path_exists(file) ? "of another size" : "missing",
                          (long long)L.bytes);
    }
    sd_h5_quiet_begin(&q);
    f = sd_h5_fopen(file, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        sd_h5_quiet_end(&q);
        sd_ckpt_info_free(info);
        return sd_err_set(err, "cannot open checkpoint file %s: %s", file,
                          sd_h5_error_string(h5msg, sizeof h5msg));
    }
    for (int ds = 0; ds < DS_N && !rc; ds++) {
        sd_ckpt_dataset_check *c;
        if (ds == DS_EMA && !L.s.has_ema)
            continue;
        c = &out[(*n_out)++];
        memset(c, 0, sizeof *c);
        snprintf(c->name, sizeof c->name, "%s", ds_names[ds]);
        c->n = L.n;
        c->expected = L.sums[ds];
        rc = checksum_range(f, file, ds, L.n, 0, L.n, &c->actual, err);
    }
    if (H5Fclose(f) < 0 && !rc)
        rc = sd_err_set(err, "cannot close checkpoint file %s", file);
    sd_h5_quiet_end(&q);
    if (rc)
        sd_ckpt_info_free(info);
    return rc;
}

void sd_ckpt_info_free(sd_ckpt_info *i)
{
    if (i) {
        free(i->config_text);
        i->config_text = NULL;
    }
}

/* ---- configuration comparison --------------------------------------------------------------- */

/* Keys that may change between a checkpoint and its resume without a word. */
static const char *const free_keys[] = {
    "train.max_steps", "train.batch_size_per_rank", "train.grad_accum_steps", "train.sharding",
    "train.log_every", "train.val_every", "train.recompute_activations", NULL};
/* Groups whose other keys shape the training: a change is worth a warning. */
static const char *const watched_groups[] = {"model", "train", "diffusion", NULL};

/* The value of group.key in namelist text (sd_config_to_namelist), copied into out. */
static int nml_value(const char *text, const char *group, const char *key, char *out, size_t size)
{
    const char *p = text;
    char cur[64] = "";
    size_t klen = strlen(key);
    while (p && *p) {
        const char *eol = strchr(p, '\n'), *q = p;
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        while (q < p + len && (*q == ' ' || *q == '\t'))
            q++;
        if (*q == '&') {
            size_t g = strcspn(q + 1, " \t\n");
            snprintf(cur, sizeof cur, "%.*s", (int)(g < 63 ? g : 63), q + 1);
        } else if (!strcmp(cur, group) && !strncmp(q, key, klen) &&
                   (q[klen] == ' ' || q[klen] == '=')) {
            const char *v = strchr(q, '='), *end = p + len;
            if (v && v < end) {
                v++;
                while (*v == ' ')
                    v++;
                while (end > v && (end[-1] == ' ' || end[-1] == '\r'))
                    end--;
                snprintf(out, size, "%.*s", (int)(end - v), v);
                return 1;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    return 0;
}

int sd_ckpt_check_config(const char *stored, const char *current, sd_err *err)
{
    size_t n;
    const sd_option *opts = sd_config_options(&n);
    char a[1024], b[1024];
    if (!stored || !stored[0]) {
        sd_warn("the checkpoint does not record its configuration; settings are not compared");
        return 0;
    }
    if (nml_value(stored, "run", "seed", a, sizeof a) &&
        nml_value(current, "run", "seed", b, sizeof b) && strcmp(a, b) != 0)
        return sd_err_set(err, "the checkpoint was written with &run seed = %s, this run has seed "
                          "= %s: the data order and every random draw depend on it (set it back, "
                          "or start fresh with &checkpoint resume = 'never')", a, b);
    for (size_t i = 0; i < n; i++) {
        char full[96];
        int watched = 0, exempt = 0;
        for (int g = 0; watched_groups[g]; g++)
            watched |= !strcmp(opts[i].group, watched_groups[g]);
        snprintf(full, sizeof full, "%s.%s", opts[i].group, opts[i].key);
        for (int k = 0; free_keys[k]; k++)
            exempt |= !strcmp(full, free_keys[k]);
        if (!strcmp(full, "data.val_fraction") || !strcmp(full, "data.shuffle_window"))
            watched = 1;
        if (!watched || exempt)
            continue;
        if (nml_value(stored, opts[i].group, opts[i].key, a, sizeof a) &&
            nml_value(current, opts[i].group, opts[i].key, b, sizeof b) && strcmp(a, b) != 0)
            sd_warn("resume: &%s %s was %s when the checkpoint was written, this run has %s",
                    opts[i].group, opts[i].key, a, b);
    }
    return 0;
}

/* ---- signals -------------------------------------------------------------------------------- */

static volatile sig_atomic_t caught_signal = 0;

static void on_signal(int sig)
{
    if (!caught_signal)
        caught_signal = sig;
}

void sd_ckpt_signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int sd_ckpt_signal_pending(void) { return caught_signal; }

const char *sd_ckpt_signal_name(int sig)
{
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "a signal";
}

/* ---- metrics -------------------------------------------------------------------------------- */

int sd_ckpt_metrics_rollback(const char *path, int64_t step, sd_err *err)
{
    FILE *f;
    char *line = NULL, *out = NULL;
    size_t cap = 0, len = 0, out_cap = 0;
    ssize_t got;
    int rc;
    f = sd_fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : sd_err_set(err, "cannot read %s: %s", path, strerror(errno));
    while ((got = getline(&line, &cap, f)) > 0) {
        const char *s = strstr(line, "\"step\":");
        if (line[got - 1] != '\n')
            break; /* the last line, cut short (a full disk, a crash): the next would join it */
        if (s && strtoll(s + 7, NULL, 10) > step)
            continue;
        if (len + (size_t)got + 1 > out_cap) {
            out_cap = 2 * (len + (size_t)got + 1);
            out = sd_xrealloc(out, out_cap);
        }
        memcpy(out + len, line, (size_t)got);
        len += (size_t)got;
    }
    free(line);
    fclose(f);
    rc = sd_write_file_atomic(path, out ? out : "", len, err);
    free(out);
    return rc;
}
