/* The MPI runtime: start-up, the configuration broadcast, the split of MPI_COMM_WORLD into the
 * preprocessing and training communicators, and the check macros for MPI calls. */
#ifndef SDTRAIN_RUNTIME_H
#define SDTRAIN_RUNTIME_H

#include <mpi.h>
#include <stdint.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/error.h"
#include "sdtrain/progress.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SD_ROLE_PROCESS = 0, SD_ROLE_TRAIN = 1, SD_ROLE_SAMPLE = 2 } sd_role;

const char *sd_role_name(sd_role r);

/* How a world of `world_size` ranks is divided for a configuration: a pure function, so that
 * `sdtrain --check --np N` can show the layout of a job it does not run. Ranks
 * [0, n_process) preprocess, [n_process, world_size) train (or sample). */
typedef struct sd_layout {
    int world_size;
    int n_process;
    int n_train;   /* training or sampling ranks */
} sd_layout;

int sd_layout_compute(const sd_config *c, int world_size, sd_layout *out, sd_err *err);
sd_role sd_layout_role(const sd_config *c, const sd_layout *l, int world_rank);

/* One rank's place in the job. */
typedef struct sd_runtime {
    int world_rank, world_size;
    int node_rank, node_size;  /* among ranks on the same node (MPI_COMM_TYPE_SHARED) */
    int n_nodes;
    sd_role role;
    MPI_Comm role_comm;        /* preprocessing or training communicator (this rank's side) */
    int role_rank, role_size;
    MPI_Comm node_comm;
    sd_layout layout;
    char hostname[256];
} sd_runtime;

/* MPI_Init_thread, logging prefixes, and an abort handler that calls MPI_Abort. */
void sd_mpi_start(int *argc, char ***argv);
/* Whether MPI provides MPI_THREAD_SERIALIZED (calls from any thread, one at a time): what mode
 * 'process''s shard writer thread needs; without it the shards are written by the main thread. */
int sd_mpi_serialized(void);
/* Frees communicators and calls MPI_Finalize. */
void sd_mpi_finish(sd_runtime *rt);

/* Collective over MPI_COMM_WORLD: splits by role and by node. The layout must have been
 * validated (sd_layout_compute succeeded on every rank with the same inputs). */
void sd_runtime_split(const sd_config *c, const sd_layout *layout, sd_runtime *rt);

/* Collective: 1 when any rank passes a non-zero `failed`. */
int sd_any_failed(int failed);

/* Collective over comm: 0 when no rank failed; otherwise every rank returns -1 with err holding
 * the message (and the `storage` flag) of the lowest failing rank, so all report the same cause
 * and none waits in a later collective. */
int sd_agree(MPI_Comm comm, int failed, sd_err *err);

/* Collective over comm: MPI_Bcast of `bytes` bytes from rank 0, in pieces of 1 GiB (MPI counts
 * are int). */
void sd_bcast_bytes(void *buf, size_t bytes, MPI_Comm comm);

/* Collective over comm: when some ranks compute on a GPU (on_gpu) and others on the CPU, the
 * lowest CPU rank, with its `notice` (why its device resolved to the CPU; may be "") copied into
 * why on every rank; -1, why untouched, when every rank has the same kind of device. */
int sd_device_mix(MPI_Comm comm, int on_gpu, const char *notice, char *why, size_t why_size);

/* Completes `req` without spinning: MPI_Test with sleeps of 1 ms growing to 50 ms in between.
 * For ranks that may wait long (the trainers of a pipeline waiting for shards, one half of a
 * pipeline job waiting for the other): a rank spinning in a blocking call takes a core from the
 * ranks that work. */
void sd_mpi_wait_idle_at(MPI_Request *req, const char *file, int line);
/* (the stall watchdog reports the caller's line as the MPI call the rank is inside) */
#define sd_mpi_wait_idle(req) sd_mpi_wait_idle_at((req), __FILE__, __LINE__)

/* ---- &run mode = 'pipeline': the preprocessing half tells the training half its plan --------
 * Preprocessing rank 0 (world rank 0) sends one message over MPI_COMM_WORLD to training rank 0
 * (world rank layout.n_process) once it has indexed the dataset: how many shards it will have
 * committed when it is done (indices [0, n_shards), committed ones of an earlier run included)
 * and an upper bound of their samples (the dataset's count; skipped samples make the real total
 * smaller, known shard by shard from the manifest). */
typedef struct sd_pipeline_plan {
    int64_t n_shards;
    int64_t max_samples;
} sd_pipeline_plan;

#define SD_PIPELINE_PLAN_TAG 0x5D01

/* Preprocessing rank 0 of a pipeline job; a no-op in every other case. */
void sd_pipeline_send_plan(const sd_runtime *rt, const sd_pipeline_plan *plan);

/* &run pipeline_end = 'training': training rank 0 tells preprocessing rank 0 (world rank 0),
 * with one empty message, that training is done; preprocessing checks for it before each shard
 * it has still to write. */
#define SD_PIPELINE_TRAINED_TAG 0x5D02

/* Training rank 0 of a pipeline job; a no-op in every other case. */
void sd_pipeline_send_trained(const sd_runtime *rt);
/* Preprocessing rank 0 of a pipeline job posts the receive of that message in *req (an MPI
 * request, MPI_REQUEST_NULL on every other rank and in every other case). */
void sd_pipeline_trained_listen(const sd_runtime *rt, MPI_Request *req);
/* Collective over the preprocessing communicator: 1 on every rank once the message has come
 * (preprocessing rank 0 tests *req), else 0. 0 outside a pipeline job's preprocessing half.
 * Preprocessing waits for the message before it ends (sd_pipeline_wait_watching), so that none
 * is left unreceived at the end of the job. */
int sd_pipeline_trained(const sd_runtime *rt, MPI_Request *req);

/* A signal stop (SIGUSR1 / SIGTERM) of a pipeline job: each half stops at its own next boundary
 * (the trainers with a checkpoint, preprocessing after committing the shard it has encoded), and
 * the half that caught the signal tells the other, which then stops as if signalled itself.
 * The word is one int (the signal) from one half's rank 0 to the other's, over MPI_COMM_WORLD
 * (preprocessing rank 0 = world rank 0, training rank 0 = world rank layout.n_process), sent at
 * most once a half and not after the other half's word came; it is apart from the trainers'
 * "trained" word (SD_PIPELINE_TRAINED_TAG), which only ends preprocessing with
 * pipeline_end = 'training'. The receive is posted before either half starts and completed, or
 * cancelled when no word was sent, by sd_pipeline_stop_close once both halves are done. The
 * state is the calling process's own (one pipeline job a process). */
#define SD_PIPELINE_STOP_TAG 0x5D03

/* Rank 0 of either half of a pipeline job posts the receive of the other half's word; a no-op
 * on every other rank and outside mode 'pipeline'. Before the half's mode starts. */
void sd_pipeline_stop_listen(const sd_runtime *rt);
/* Rank 0 of a half: the signal the other half stopped for, once its word has come (a test of
 * the receive, no wait), else 0. 0 on every other rank and outside a pipeline job. Local: the
 * caller agrees on it over its half with the reduction it makes for its own signals. */
int sd_pipeline_stop_heard(const sd_runtime *rt);
/* Rank 0 of a half that stops for its own signal `sig`: sends the word to the other half's
 * rank 0, unless it was sent already or the other half's word came first; 1 when it sent it. A
 * no-op (0) elsewhere. */
int sd_pipeline_stop_tell(const sd_runtime *rt, int sig);
/* Collective over the half (rt->role_comm) of a pipeline job: waits, sleeping, until *req is
 * complete on every rank of the half that holds one (MPI_REQUEST_NULL: nothing to wait for),
 * watching for SIGUSR1 / SIGTERM meanwhile: every 0.2 s the half's ranks agree (one small
 * reduction) on whether all are complete and whether any caught a signal, and a signal makes
 * rank 0 pass the stop word on (sd_pipeline_stop_tell), so that a half waiting for the other
 * does not leave it running on. Returns the signal when rank 0 sent the word in this wait, else
 * 0 (on rank 0; 0 on the others). */
int sd_pipeline_wait_watching(const sd_runtime *rt, MPI_Request *req);
/* Collective over MPI_COMM_WORLD once both halves are done (after the job's last barrier): the
 * ranks 0 learn whether the other sent its word, wait for it if so and cancel the receive if
 * not, so that no message and no receive is left at MPI_Finalize. */
void sd_pipeline_stop_close(const sd_runtime *rt);

/* ---- read-only bytes held once per node ------------------------------------------------------
 * What every rank of a communicator reads and none writes (mode 'process''s dataset index: tens
 * of GB for 10^8 samples) kept once per node in an MPI shared-memory window
 * (MPI_Win_allocate_shared on the node's first rank of comm) instead of once per rank. Comm's
 * rank 0 fills it, the node leaders (node rank 0) pass it on among themselves, in pieces of at
 * most 1 GiB, and the other ranks of a node read their leader's. A node whose window cannot be
 * had (a shared-memory file system too small for it, an MPI without such windows, or try_shared
 * 0) falls back to one malloc'd copy on each of its ranks; one rank alone on its node has one. */
typedef struct sd_node_buffer {
    void *data;       /* size bytes: comm's rank 0 writes them between sd_node_buffer_alloc and
                         sd_node_buffer_publish; read-only everywhere afterwards */
    size_t size;
    int shared;       /* 1: this node's ranks read one copy in a shared window */
    int node_rank, node_size; /* among comm's ranks on this node */
    MPI_Win win;      /* MPI_WIN_NULL when not shared */
    MPI_Comm node_comm, leader_comm; /* comm's ranks on this node; the node leaders (or
                                        MPI_COMM_NULL on the others) */
} sd_node_buffer;

/* Collective over comm, with the same size on every rank. Returns 0 when this node holds one
 * copy (shared, or the node has one rank of comm), -1 on every rank of a node of several ranks
 * that fell back to per-rank copies, with why saying why (the same on the node's ranks). */
int sd_node_buffer_alloc(MPI_Comm comm, size_t size, int try_shared, sd_node_buffer *b,
                         sd_err *why);
/* Collective over comm: rank 0's bytes reach every rank; then they must not change. */
void sd_node_buffer_publish(sd_node_buffer *b);
/* Collective over comm (nothing may read the bytes after it); safe on a zeroed buffer. */
void sd_node_buffer_free(sd_node_buffer *b);

/* Prints a table of every rank's role, communicator rank, node and node-local rank (rank 0). */
void sd_runtime_report(const sd_runtime *rt);

void sd_fatal_mpi(const char *file, int line, const char *func, const char *stmt, int code)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;
/* Every MPI call of the code base: its failure ends the job; the stall watchdog
 * (sdtrain/progress.h) knows which call the main thread is inside. */
#define SD_MPI_CHECK(call)                                                                    \
    do {                                                                                      \
        int sd_mpi_rc_;                                                                       \
        sd_progress_mpi_enter(#call, __FILE__, __LINE__);                                     \
        sd_mpi_rc_ = (call);                                                                  \
        sd_progress_mpi_leave();                                                              \
        if (sd_mpi_rc_ != MPI_SUCCESS)                                                        \
            sd_fatal_mpi(__FILE__, __LINE__, __func__, #call, sd_mpi_rc_);                    \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
