/* Gradient and parameter collectives between GPU training ranks over NCCL, enqueued on the CUDA
 * backend's stream (the device path of &run mode = 'train', doc/training.md "On the GPU").
 *
 * Declared only in CUDA builds (SD_HAVE_CUDA from sd_config.h, which the including file
 * includes first). MPI stays out of the .cu file: the caller makes the unique id on rank 0
 * (sd_nccl_unique_id), broadcasts its SD_NCCL_ID_BYTES bytes with MPI and then creates the
 * communicator on every rank. NCCL needs one GPU per rank (two ranks on one GPU is an error).
 *
 * Buffers are device fp32 of the backend. The sharded calls need equal shards: a buffer of
 * nranks * shard floats, rank r owning [r * shard, (r + 1) * shard), which is why the GPU path
 * pads its flat buffers (its shard boundaries are not sd_comm_shard's). Unlike
 * src/dist/collectives.c the summation order is NCCL's (fixed for a given topology and rank
 * count, but not rank order), so results match the CPU's only to rounding.
 * Every NCCL failure ends the job (SD_NCCL_CHECK), so no rank is left waiting. So do the
 * asynchronous ones (a peer rank gone, a network failure) and a wait for the GPU that lasts
 * longer than SDTRAIN_NCCL_TIMEOUT seconds (default 1800, 0 = never): while a communicator
 * lives, the backend's host waits poll it (sd_backend_cuda_set_wait_hook), abort it and end the
 * job with a message. */
#ifndef SDTRAIN_NCCL_COMM_H
#define SDTRAIN_NCCL_COMM_H

#include <stddef.h>

#include "sdtrain/error.h"
#include "sdtrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SD_HAVE_CUDA)

/* NCCL_UNIQUE_ID_BYTES */
#define SD_NCCL_ID_BYTES 128

typedef struct sd_nccl sd_nccl;

/* ncclGetUniqueId into id (rank 0 only). Returns 0, or -1 with err set. */
int sd_nccl_unique_id(unsigned char id[SD_NCCL_ID_BYTES], sd_err *err);

/* ncclCommInitRank for `rank` of `nranks` on CUDA device `device` (the backend's), using the
 * backend's stream for every later call. Collective over the nranks callers. */
sd_nccl *sd_nccl_create(const unsigned char id[SD_NCCL_ID_BYTES], int nranks, int rank,
                        int device, const sd_backend *be);
void sd_nccl_destroy(sd_nccl *c); /* NULL is ignored */

/* buf[n] <- sum over ranks, in place. */
void sd_nccl_allreduce_sum(sd_nccl *c, float *buf, size_t n);
/* buf[nranks * shard]: buf[rank * shard ...] <- sum over ranks of that shard, in place. */
void sd_nccl_reduce_scatter_sum(sd_nccl *c, float *buf, size_t shard);
/* buf[nranks * shard]: every rank's shard copied to every rank, in place. */
void sd_nccl_allgather(sd_nccl *c, float *buf, size_t shard);
/* The same for a buffer of bf16 values (the compute copy of the parameters): half the bytes. */
void sd_nccl_allgather_bf16(sd_nccl *c, void *buf, size_t shard);

/* Reductions that overlap the backward (the gradient buckets, doc/training.md "Gradient
 * reduction"): each call makes the communicator's own stream wait for everything queued on the
 * backend's stream so far, then queues the reduction there, so the backward goes on meanwhile;
 * sd_nccl_join makes the backend's stream wait for every reduction queued before it. Every rank
 * must make the same calls in the same order. */
/* buf[n] <- sum over ranks, in place, on every rank. */
void sd_nccl_bucket_allreduce_sum(sd_nccl *c, float *buf, size_t n);
/* buf[n] on rank `root` <- sum over ranks, in place; the others' buf is only read. */
void sd_nccl_bucket_reduce_sum(sd_nccl *c, float *buf, size_t n, int root);
void sd_nccl_join(sd_nccl *c);
/* The parameters' all-gather ahead of the forward (ZeRO-2, the same stream): buf[n] of
 * `elem_bytes`-byte elements (2: bf16, 4: fp32) from rank `root` to every rank, in place. */
void sd_nccl_bucket_broadcast(sd_nccl *c, void *buf, size_t n, int elem_bytes, int root);
/* Marks how far the communicator's stream has got (event `slot`, 0 <= slot, created on first
 * use; marking a slot again moves the mark), and makes the backend's stream wait for the mark
 * of `slot` as last set: the forward waits only for the buckets it is about to read. */
void sd_nccl_side_mark(sd_nccl *c, int slot);
void sd_nccl_side_wait(sd_nccl *c, int slot);

#endif /* SD_HAVE_CUDA */

#ifdef __cplusplus
}
#endif
#endif
