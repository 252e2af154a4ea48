/* Training checkpoints: one directory per step written collectively (parallel HDF5 + JSON
 * manifest), committed by rename plus a `latest` pointer, with per-dataset checksums; format and
 * guarantees in doc/checkpoints.md. Works on host buffers only, so any backend can call it. */
#ifndef SDTRAIN_CHECKPOINT_H
#define SDTRAIN_CHECKPOINT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/models.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_CKPT_FORMAT "sdtrain-checkpoint"
#define SD_CKPT_FORMAT_VERSION 1
#define SD_CKPT_STATE_FILE "state.h5"
#define SD_CKPT_MANIFEST "manifest.json"
#define SD_CKPT_LATEST "latest"
#define SD_CKPT_CHECKSUM_ALGORITHM "sd-elemsum64-v1"

/* The scalar training state. */
typedef struct sd_ckpt_scalars {
    int64_t step;            /* training steps completed, skipped ones included: the data
                              * position (the loader resumes at 0-based step `step`) */
    int64_t opt_step;        /* AdamW updates done (k: bias corrections, LR schedule, EMA) */
    int64_t skipped;         /* steps skipped for non-finite gradients */
    int64_t epoch;           /* step / steps_per_epoch (informational) */
    int64_t steps_per_epoch;
    int64_t global_batch;    /* ranks x batch_size_per_rank: with the seed it fixes data order */
    int64_t batch_per_rank;
    int64_t seed;            /* &run seed: the data order and every random draw */
    int64_t n_ranks;         /* training ranks that wrote it (any count may resume) */
    int64_t has_ema;         /* 1 when an "ema" dataset is stored */
    char sharding[32];       /* 'none' or 'shard_grad_op' when written (either may resume) */
} sd_ckpt_scalars;

/* The tensors, in host memory unless the hooks below say otherwise. `params` is the whole flat
 * buffer of n floats on every rank (laid out by `table`). m, v and ema (NULL when there is no
 * EMA) hold the range [begin, end) of the same flat index space: either every rank holds [0, n)
 * (DDP) or the ranks' ranges partition [0, n) in rank order (ZeRO-2, any alignment). On disk each
 * is one full-length dataset, so a different rank count or sharding reads its own range back. */
typedef struct sd_ckpt_tensors {
    const sd_param_table *table;
    size_t n;
    float *params;
    size_t begin, end;
    float *m, *v, *ema;
    /* Optional, for the writers (sd_ckpt_write, sd_ckpt_async_start; never sd_ckpt_load): params,
     * m, v and ema lie in another memory (a GPU's), and copy(copy_ctx, dst, src, count) brings
     * `count` floats from src there into the host buffer dst (the device path's download).
     * sd_ckpt_write then writes through one 64 MiB host block. NULL: they are host buffers. */
    void (*copy)(void *ctx, float *dst, const float *src, size_t count);
    void *copy_ctx;
    /* Optional, for sd_ckpt_load: m, v and ema lie in another memory, and upload(copy_ctx, dst,
     * src, count) puts `count` floats from the host buffer src there (returning once it is
     * done). They are then read through one 64 MiB host block. params stay a host buffer (the
     * allgather completes them there). NULL: m, v and ema are host buffers. */
    void (*upload)(void *ctx, float *dst, const float *src, size_t count);
    /* Optional: host memory from host_alloc(copy_ctx, bytes) (the device path: page-locked, so
     * that `copy` and `upload` run at the link's speed) for sd_ckpt_async_reserve's copy and the
     * blocks of sd_ckpt_write and sd_ckpt_load, given back with host_free(copy_ctx, p); malloc
     * when NULL or when it returns NULL. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
} sd_ckpt_tensors;

/* What sd_ckpt_load found besides the tensors. config_text: the namelist the writer ran with
 * (sd_config_to_namelist, malloc'ed; sd_ckpt_info_free). */
typedef struct sd_ckpt_info {
    sd_ckpt_scalars s;
    char path[4200];
    char *config_text;
    char sdtrain_version[64];
    int verified_after_write; /* the writer read it back and checked it before the commit */
} sd_ckpt_info;
void sd_ckpt_info_free(sd_ckpt_info *i);

/* "step-00000012" (eight digits or more). */
void sd_ckpt_dir_name(int64_t step, char *buf, size_t size);

/* Checksum sd-elemsum64-v1 of x[0..count) whose first element has flat index `first`: the
 * wrapping 64-bit sum over elements of fmix64(index * 0x9E3779B97F4A7C15 + bits(x)). Sums of
 * disjoint ranges add up (mod 2^64) to the whole dataset's, in any order, so ranks checksum
 * their own slices whatever the rank count; any change of a single element changes it. */
uint64_t sd_ckpt_checksum(const float *x, size_t first, size_t count);

/* Which committed checkpoints a new commit leaves: the newest `last` (0 = all: nothing is
 * removed) up to it, and every one whose step is a multiple of `every` (0 = none such);
 * &checkpoint keep_last and keep_every_n_steps. */
typedef struct sd_ckpt_keep {
    int64_t last;
    int64_t every;
} sd_ckpt_keep;

/* ---- writing (collective over comm) ----------------------------------------------------------
 * Writes the checkpoint of s->step into dir (created if missing): rank 0 creates
 * <dir>/.step-K.tmp/state.h5 alone (HDF5, the datasets allocated at known offsets, no data;
 * sd_h5_create_local: &run io_hints apply), every rank writes its parts there with pwrite and
 * fsyncs; rank 0 then adds the summed checksums as attributes, writes manifest.json (scalars,
 * parameter table, checksums, config_text) into the temporary directory, renames it to
 * <dir>/step-K (an older step-K that `latest` does not name, left by a crash between rename and
 * pointer update, is replaced), writes <dir>/latest (temporary file + rename + directory fsync)
 * and, with keep.last > 0, deletes the oldest complete checkpoints beyond keep.last (never the
 * one `latest` names, nor one whose step is a multiple of keep.every > 0). On success every rank gets the committed directory in `committed` (may
 * be NULL). Failures (a storage error under any rank's writes included: no rank waits in
 * another's HDF5 call): every rank returns -1 with one message, the temporary directory is
 * removed and the previous checkpoint stays `latest`; only a failure of the metadata rank 0's
 * HDF5 writes when it closes the new file ends the job (HDF5 cannot let go of that file).
 * verify != 0: before the commit every rank reads back the parts it wrote (past the page cache
 * where the kernel allows) and the checksums of the data read must equal those written;
 * otherwise the checkpoint is not committed (a failure as above). Fault points (SDTRAIN_FAULT,
 * world rank, step = K): "ckpt-write" kills a rank after its first data is written (kill) or
 * changes a bit of its data on disk after the sync (flip), "ckpt-commit" kills after the rename
 * and before `latest` is updated. The caller holds the loader's HDF5 lock when a loader is
 * open. */
int sd_ckpt_write(MPI_Comm comm, const char *dir, const sd_ckpt_scalars *s,
                  const sd_ckpt_tensors *t, const char *config_text, sd_ckpt_keep keep,
                  int verify, char *committed, size_t committed_size, sd_err *err);

/* ---- writing in the background (&checkpoint async) -------------------------------------------
 * The same checkpoint as sd_ckpt_write's, with the training going on while it is written.
 * sd_ckpt_async_start (collective) sets up the temporary directory as sd_ckpt_write does, creates
 * the state file collectively (attributes, the datasets allocated at their offsets, no data),
 * copies this rank's parts of t into its host buffer (made by sd_ckpt_async_reserve, which must
 * come first: a second copy of the rank's part of the state; with t->copy straight from the
 * device, no host copy of the state needed) and starts a thread that writes them with pwrite
 * at their offsets, fsyncs, and with verify reads them back and compares checksums; it uses
 * neither MPI nor HDF5. From its return t may change. Returns 0 when the thread runs, -1 when
 * not started (the same on every rank, the message in err, the previous checkpoint stays the
 * latest).
 * sd_ckpt_async_ready (collective) is 1 when every rank's thread is done (or nothing is in
 * flight); sd_ckpt_async_finish (collective) waits for the threads and commits as sd_ckpt_write
 * does (rank 0 adds the checksum attributes first), with the same failures and messages, and
 * the threads' longest time in *seconds. A failed write leaves nothing in flight either way.
 * sd_ckpt_async_free (local) waits for the thread when one runs and frees; what it leaves
 * uncommitted is removed by the next run (sd_ckpt_resolve). The caller holds the loader's HDF5
 * lock around start and finish when a loader is open (the thread needs none). Fault points as
 * sd_ckpt_write's: "ckpt-write" (kill, flip) in the thread, "ckpt-commit" in the finish. */
typedef struct sd_ckpt_async sd_ckpt_async;
#define SD_CKPT_NO_MEMORY (-4)
int sd_ckpt_async_start(sd_ckpt_async **a, MPI_Comm comm, const char *dir,
                        const sd_ckpt_scalars *s, const sd_ckpt_tensors *t,
                        const char *config_text, sd_ckpt_keep keep, int verify, sd_err *err);
int sd_ckpt_async_ready(sd_ckpt_async *a, MPI_Comm comm);
int sd_ckpt_async_finish(sd_ckpt_async *a, char *committed, size_t committed_size,
                         double *seconds, sd_err *err);
/* Collective, optional before the first start: allocates this rank's copy for tensors laid out
 * as t (ranges and n; the buffers are not read) and touches every page of it, so that the
 * memory is had (or found missing) at once and the first checkpoint's pause does not pay for the
 * page faults (8 s for 3.3 GB a rank on the development VM). *bytes: its size. 0, or
 * SD_CKPT_NO_MEMORY (every rank, the message of the lowest rank without the memory), or -1 for
 * ranges that do not fit together. */
int sd_ckpt_async_reserve(sd_ckpt_async **a, MPI_Comm comm, const sd_ckpt_tensors *t,
                          int has_ema, size_t *bytes, sd_err *err);
/* 1 when the copy came from the tensors' host_alloc (page-locked on the device path). */
int sd_ckpt_async_pinned(const sd_ckpt_async *a);
/* The step of the checkpoint in flight, or -1. */
int64_t sd_ckpt_async_step(const sd_ckpt_async *a);
void sd_ckpt_async_free(sd_ckpt_async *a);

/* ---- resuming (collective over comm) --------------------------------------------------------
 * Decides where a run starts. Rank 0 first removes leftovers of interrupted writes in dir
 * (".step-*.tmp" directories, "latest.tmp"). resume = "auto": the checkpoint `latest` names, or
 * none (*found = 0) when dir has no `latest`; when `latest` names a missing or incomplete
 * directory, a warning and the newest complete checkpoint of dir (`latest` is pointed at it),
 * an error when there is none. "never": none (a warning when dir holds checkpoints). Otherwise a path:
 * a checkpoint directory, or a checkpoint root holding `latest`; an error when it is neither.
 * Every rank gets the same path and verdict. */
int sd_ckpt_resolve(MPI_Comm comm, const char *dir, const char *resume, char *path,
                    size_t path_size, int *found, sd_err *err);

/* Loads the checkpoint at `path`: rank 0 reads and checks the manifest (format, version, the
 * parameter table against t->table: names, shapes, offsets, size) and broadcasts it; every rank
 * reads params [0, n) and its range [begin, end) of m, v and ema (ema left alone when the
 * checkpoint has none: info->s.has_ema says), and the checksums of all datasets are verified
 * over the ranks' slices. A mismatch is an error naming the file and the dataset. Every rank
 * returns the same verdict; on success free info with sd_ckpt_info_free (nothing to free on
 * failure). The caller holds the loader's HDF5 lock when a loader is open. */
int sd_ckpt_load(MPI_Comm comm, const char *path, const sd_ckpt_tensors *t, sd_ckpt_info *info,
                 sd_err *err);

/* sd_ckpt_load's return value when the checkpoint's files are damaged (unreadable or malformed
 * manifest, a state file of the wrong size, an HDF5 read error, a failed checksum), as opposed
 * to -1 for an intact checkpoint this run cannot use (another format version, another model). */
#define SD_CKPT_DAMAGED (-2)

/* sd_ckpt_load's return value when the file system failed to deliver the state file's bytes
 * (EIO, ESTALE, ETIMEDOUT, EACCES, ...: a plain POSIX read of the same bytes fails too), as
 * opposed to bytes that are there but damaged: the checkpoint may be intact, so it is not set
 * aside; the caller ends the run with a failure status, and a retry (a requeued job) reads it
 * again. */
#define SD_CKPT_IO_ERROR (-3)

/* resume = 'auto' after sd_ckpt_load said SD_CKPT_DAMAGED for `path` (a checkpoint of dir):
 * rank 0 moves it aside to "<path>.damaged" (kept for inspection, never pruned), warns with
 * `why` (the load's message), and points `latest` at the newest complete checkpoint left, whose
 * path every rank gets in `older`. None left: -1 with a message (start fresh with resume =
 * 'never'). Collective. */
int sd_ckpt_set_aside(MPI_Comm comm, const char *dir, const char *path, const char *why,
                      char *older, size_t older_size, sd_err *err);

/* ---- one process, no MPI (sdtool export) ----------------------------------------------------
 * sd_ckpt_peek reads and checks the manifest of the checkpoint at `path` (format, version,
 * checksum entries) into info (scalars and config_text; free with sd_ckpt_info_free), without
 * the tensors: what a caller needs to build the parameter table it then passes to
 * sd_ckpt_read_dataset. That one makes sd_ckpt_load's checks (manifest against `table`, file
 * size), reads the whole dataset `dataset` ("params" or "ema", table->total_floats floats, our
 * layouts) into dst and verifies its checksum; a checkpoint without the EMA asked for is an
 * error. Both return 0, or -1 with a message naming the file (nothing to free then). */
int sd_ckpt_peek(const char *path, sd_ckpt_info *info, sd_err *err);
int sd_ckpt_read_dataset(const char *path, const sd_param_table *table, const char *dataset,
                         float *dst, sd_ckpt_info *info, sd_err *err);

/* The checkpoint directory a root's `latest` names ("step-NNNNNNNN") into name, or "" when
 * the root has no `latest`; -1 with a message when it cannot be read or names nothing valid. */
int sd_ckpt_read_latest(const char *dir, char *name, size_t size, sd_err *err);
/* 1 when `path` holds a manifest and a state file (a committed checkpoint directory). */
int sd_ckpt_is_complete(const char *path);

/* One dataset of a checkpoint checked by sd_ckpt_verify. */
typedef struct sd_ckpt_dataset_check {
    char name[16];     /* "params", "adam_m", "adam_v", "ema" */
    uint64_t n;        /* floats */
    uint64_t expected; /* the manifest's checksum */
    uint64_t actual;   /* recomputed from state.h5 */
} sd_ckpt_dataset_check;

/* One process (sdtool inspect --verify): the manifest read and checked as sd_ckpt_peek does,
 * the state file's size checked, then every stored dataset read in blocks and its checksum
 * recomputed into out[0 .. *n_out) (3 or 4 entries; a mismatch is reported there, not as an
 * error). Returns 0 (free info with sd_ckpt_info_free), or -1 with a message naming the file
 * when the checkpoint cannot be read at all. */
int sd_ckpt_verify(const char *path, sd_ckpt_info *info, sd_ckpt_dataset_check out[4],
                   int *n_out, sd_err *err);

/* Rank 0 after a load: compares the writer's configuration with this run's (both namelist
 * texts from sd_config_to_namelist). A different seed is an error (the data order and every
 * draw depend on it); differences in the model, training and diffusion settings are warnings
 * that name each key; rank count, batch split and sharding may differ freely. */
int sd_ckpt_check_config(const char *stored_text, const char *current_text, sd_err *err);

/* ---- signals ---------------------------------------------------------------------------------
 * SIGUSR1 and SIGTERM only set a flag (Slurm sends one ahead of the time limit); the training
 * loop polls it at a step boundary, agrees over the ranks and checkpoints before exiting. */
void sd_ckpt_signals_install(void);
/* The signal caught so far on this rank (SIGUSR1, SIGTERM), or 0. */
int sd_ckpt_signal_pending(void);
/* "SIGUSR1", "SIGTERM", or "a signal": for the stop messages. */
const char *sd_ckpt_signal_name(int sig);

/* ---- metrics on resume (one process) ---------------------------------------------------------
 * Keeps the lines of path whose "step" is at most `step` (the ones after the checkpoint are
 * recomputed by the resumed run), written to a temporary file and renamed; a last line without
 * its newline (a write cut short) is dropped, as the resumed run's lines would continue it. A
 * missing file is fine. */
int sd_ckpt_metrics_rollback(const char *path, int64_t step, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
