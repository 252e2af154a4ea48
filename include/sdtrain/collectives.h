/* Collectives between training ranks on flat fp32 buffers (gradients, parameters), behind a
 * table of function pointers so that a GPU backend (NCCL) can implement the same interface.
 *
 * Determinism: every floating-point reduction sums the contributions in rank order 0..P-1
 * (acc = x_0; acc += x_1; ...; acc += x_{P-1}; then, for averages, acc / P), whatever the
 * transport does. Results are therefore bit-identical across runs, on every rank, and between
 * an all-reduce and a reduce-scatter followed by an all-gather, so DDP and ZeRO-2 produce the
 * same parameters.
 *
 * Shards: a buffer of n floats is split into sd_comm_size() contiguous ranges given by
 * sd_shard_range(n, size, rank, comm->align); rank r owns [begin_r, end_r).
 *
 * Sizes are size_t throughout; the MPI backend moves large buffers in chunks so that no MPI
 * count exceeds INT_MAX. All functions are collective over the communicator and end the job
 * (SD_MPI_CHECK / SD_CHECK) on failure. */
#ifndef SDTRAIN_COLLECTIVES_H
#define SDTRAIN_COLLECTIVES_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Default shard alignment in floats (256 bytes: vector and GPU friendly). */
#define SD_SHARD_ALIGN 64

/* Splits [0, n_total) into n_ranks contiguous ranges; `rank`'s is [*begin, *end).
 * Boundaries are multiples of `align` (0 means 1) or equal n_total; the
 * ranges cover [0, n_total) exactly, in rank order, and hold whole aligned blocks split as
 * evenly as possible (sizes differ by less than 2 * align; the first ranks get the extra
 * blocks; trailing ranks may get empty ranges when n_total is small). Pure function. */
void sd_shard_range(size_t n_total, int n_ranks, int rank, size_t align, size_t *begin,
                    size_t *end);

typedef enum { SD_RED_SUM = 0, SD_RED_AVG = 1, SD_RED_MAX = 2, SD_RED_MIN = 3 } sd_red_op;

typedef struct sd_comm sd_comm;

/* The backend. Buffers live in the backend's memory space (host memory for MPI). */
typedef struct sd_comm_ops {
    const char *name;
    /* buf[n] on every rank <- sum (or average) over ranks, in place. op: SUM or AVG. */
    void (*allreduce_f32)(sd_comm *c, float *buf, size_t n, sd_red_op op);
    /* shard[end-begin] <- sum (or average) over ranks of send[begin:end] for this rank's
     * shard of n. `shard` may be `send + begin` (in place). op: SUM or AVG. */
    void (*reduce_scatter_f32)(sd_comm *c, const float *send, float *shard, size_t n,
                               sd_red_op op);
    /* buf[n] on rank `root` <- sum (or average) over ranks, in place; the other ranks' buf is
     * only read. op: SUM or AVG. */
    void (*reduce_f32)(sd_comm *c, float *buf, size_t n, sd_red_op op, int root);
    /* buf[n]: each rank's shard [begin_r, end_r) is copied to every rank, in place. */
    void (*allgather_f32)(sd_comm *c, float *buf, size_t n);
    /* bytes from `root` to every rank. */
    void (*broadcast)(sd_comm *c, void *buf, size_t bytes, int root);
    /* Small vectors (norms, counters, flags), in place, same result on every rank.
     * f64: SUM (rank order) / AVG / MAX / MIN; i64: SUM / MAX / MIN. */
    void (*allreduce_f64)(sd_comm *c, double *v, int n, sd_red_op op);
    void (*allreduce_i64)(sd_comm *c, int64_t *v, int n, sd_red_op op);
    void (*barrier)(sd_comm *c);
    void (*destroy)(sd_comm *c);
} sd_comm_ops;

struct sd_comm {
    const sd_comm_ops *ops;
    int rank, size;
    size_t align;       /* shard alignment in floats (SD_SHARD_ALIGN by default) */
    size_t chunk_elems; /* largest message in elements (<= INT_MAX) */
    void *impl;         /* backend state */
};

/* The MPI backend on a duplicate of `comm` (its messages cannot mix with others'). Collective. */
sd_comm *sd_comm_create_mpi(MPI_Comm comm);
void sd_comm_destroy(sd_comm *c); /* collective; NULL is fine */

static inline int sd_comm_rank(const sd_comm *c) { return c->rank; }
static inline int sd_comm_size(const sd_comm *c) { return c->size; }
/* This rank's shard of a buffer of n floats. */
static inline void sd_comm_shard(const sd_comm *c, size_t n, size_t *begin, size_t *end)
{
    sd_shard_range(n, c->size, c->rank, c->align, begin, end);
}
/* Must be the same on every rank, and set before buffers are sharded. */
void sd_comm_set_align(sd_comm *c, size_t align);
/* Internal, for tests: the largest message in elements (clamped to [1, INT_MAX]). Results do
 * not depend on it. Must be the same on every rank. */
void sd_comm_set_chunk_elems(sd_comm *c, size_t elems);

/* Dispatch. */
static inline void sd_allreduce_f32(sd_comm *c, float *buf, size_t n, sd_red_op op)
{
    c->ops->allreduce_f32(c, buf, n, op);
}
static inline void sd_reduce_scatter_f32(sd_comm *c, const float *send, float *shard, size_t n,
                                         sd_red_op op)
{
    c->ops->reduce_scatter_f32(c, send, shard, n, op);
}
static inline void sd_reduce_f32(sd_comm *c, float *buf, size_t n, sd_red_op op, int root)
{
    c->ops->reduce_f32(c, buf, n, op, root);
}
static inline void sd_allgather_f32(sd_comm *c, float *buf, size_t n)
{
    c->ops->allgather_f32(c, buf, n);
}
static inline void sd_broadcast(sd_comm *c, void *buf, size_t bytes, int root)
{
    c->ops->broadcast(c, buf, bytes, root);
}
static inline void sd_allreduce_f64(sd_comm *c, double *v, int n, sd_red_op op)
{
    c->ops->allreduce_f64(c, v, n, op);
}
static inline void sd_allreduce_i64(sd_comm *c, int64_t *v, int n, sd_red_op op)
{
    c->ops->allreduce_i64(c, v, n, op);
}
static inline void sd_comm_barrier(sd_comm *c) { c->ops->barrier(c); }

/* ZeRO-2 on one flat buffer of n floats: gradients are full on every rank, optimizer state
 * and the update cover only this rank's shard [begin, end). */
typedef struct sd_zero2 {
    sd_comm *comm;
    size_t n;
    size_t begin, end; /* this rank's shard */
} sd_zero2;

void sd_zero2_init(sd_zero2 *z, sd_comm *c, size_t n);
static inline size_t sd_zero2_shard_len(const sd_zero2 *z) { return z->end - z->begin; }
/* shard_grads[end-begin] <- average over ranks of grads[begin:end]; `shard_grads` may be
 * `grads + begin`. */
void sd_zero2_reduce_grads(const sd_zero2 *z, const float *grads, float *shard_grads);
/* After this rank updated params[begin:end]: every rank's shard into params[n] everywhere. */
void sd_zero2_gather_params(const sd_zero2 *z, float *params);

#ifdef __cplusplus
}
#endif
#endif
