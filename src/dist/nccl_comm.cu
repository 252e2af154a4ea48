/* NCCL communicator of the GPU training ranks (include/sdtrain/nccl_comm.h). Every call is
 * enqueued on the CUDA backend's stream, in order with the ops before and after it, except the
 * buckets (reductions, broadcasts), which go on a stream of their own ordered by events. While
 * it lives, the backend's waits watch it (watch below). */
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "sd_config.h"

#include "sdtrain/check.h"
#include "sdtrain/cuda_check.h"
#include "sdtrain/nccl_comm.h"

static_assert(SD_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "SD_NCCL_ID_BYTES != NCCL's");
static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "ncclUniqueId size");

struct sd_nccl {
    ncclComm_t comm;
    cudaStream_t stream;  /* the backend's */
    int rank, nranks;
    /* the overlapped reductions: their stream (created on first use), an event marking how far
     * the backend's stream had got, and one marking the last reduction queued */
    cudaStream_t side;
    cudaEvent_t at_compute, at_side;
    int side_pending;
    /* sd_nccl_side_mark's events */
    cudaEvent_t *marks;
    int n_marks;
    /* the watch over the backend's waits (watch below) */
    const sd_backend *be;
    double timeout_s;
};

/* The backend's wait hook while the communicator lives: a host waiting for its GPU with NCCL
 * work queued would wait forever if a peer rank is gone (its collectives never complete). An
 * asynchronous NCCL error, or one wait longer than SDTRAIN_NCCL_TIMEOUT seconds (default 1800,
 * 0 = never), aborts the communicator and ends the job with a message. */
static void watch(void *user, double waited_s)
{
    sd_nccl *c = (sd_nccl *)user;
    ncclResult_t r = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(c->comm, &r);
    if (q != ncclSuccess)
        r = q;
    if (r != ncclSuccess && r != ncclInProgress) {
        ncclCommAbort(c->comm);
        sd_fatalf(__FILE__, __LINE__, __func__, "NCCL failed",
                  "training rank %d of %d: %s (another training rank failed or its node is "
                  "gone; NCCL_DEBUG=WARN says more)", c->rank, c->nranks, ncclGetErrorString(r));
    }
    if (c->timeout_s > 0 && waited_s > c->timeout_s) {
        ncclCommAbort(c->comm);
        sd_fatalf(__FILE__, __LINE__, __func__, "waiting for the GPU timed out",
                  "training rank %d of %d has waited %.0f s for its GPU with NCCL collectives "
                  "queued (SDTRAIN_NCCL_TIMEOUT = %g s): another training rank is probably gone "
                  "or stuck", c->rank, c->nranks, waited_s, c->timeout_s);
    }
}

/* After each collective queued on stream s: what the backend does after its own ops (with
 * SDTRAIN_CUDA_SYNC=1, waiting for s under the watch), then the communicator's error state. */
static void debug_sync(sd_nccl *c, cudaStream_t s)
{
    sd_backend_cuda_after_op(c->be, s);
    watch(c, 0.0);
}

extern "C" int sd_nccl_unique_id(unsigned char id[SD_NCCL_ID_BYTES], sd_err *err)
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return sd_err_set(err, "ncclGetUniqueId: %s (set NCCL_DEBUG=WARN for details)",
                          ncclGetErrorString(r));
    memcpy(id, u.internal, SD_NCCL_ID_BYTES);
    return 0;
}

extern "C" sd_nccl *sd_nccl_create(const unsigned char id[SD_NCCL_ID_BYTES], int nranks, int rank,
                                   int device, const sd_backend *be)
{
    sd_nccl *c = (sd_nccl *)calloc(1, sizeof *c);
    ncclUniqueId u;
    SD_CHECK(c != NULL, "out of host memory");
    memcpy(u.internal, id, SD_NCCL_ID_BYTES);
    c->rank = rank;
    c->nranks = nranks;
    c->stream = (cudaStream_t)sd_backend_cuda_stream(be);
    c->be = be;
    c->timeout_s = 1800;
    {
        const char *env = getenv("SDTRAIN_NCCL_TIMEOUT");
        char *end = nullptr;
        if (env && *env) {
            c->timeout_s = strtod(env, &end);
            if (*end || !(c->timeout_s >= 0))
                sd_fatalf(__FILE__, __LINE__, __func__, "bad environment",
                          "SDTRAIN_NCCL_TIMEOUT = '%s': expected seconds (a number >= 0; 0 = no "
                          "limit)", env);
        }
    }
    SD_CUDA_CHECK(cudaSetDevice(device));
    SD_NCCL_CHECK(ncclCommInitRank(&c->comm, nranks, u, rank));
    sd_backend_cuda_set_wait_hook(be, watch, c);
    return c;
}

extern "C" void sd_nccl_destroy(sd_nccl *c)
{
    if (!c)
        return;
    /* the backend's waits are still watched by this communicator */
    sd_backend_cuda_wait_stream(c->be, c->stream);
    if (c->side)
        sd_backend_cuda_wait_stream(c->be, c->side);
    sd_backend_cuda_set_wait_hook(c->be, nullptr, nullptr);
    if (c->side) {
        SD_CUDA_CHECK(cudaEventDestroy(c->at_compute));
        SD_CUDA_CHECK(cudaEventDestroy(c->at_side));
        SD_CUDA_CHECK(cudaStreamDestroy(c->side));
    }
    for (int i = 0; i < c->n_marks; i++)
        SD_CUDA_CHECK(cudaEventDestroy(c->marks[i]));
    free(c->marks);
    SD_NCCL_CHECK(ncclCommDestroy(c->comm));
    free(c);
}

extern "C" void sd_nccl_allreduce_sum(sd_nccl *c, float *buf, size_t n)
{
    SD_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, c->stream));
    debug_sync(c, c->stream);
}

extern "C" void sd_nccl_reduce_scatter_sum(sd_nccl *c, float *buf, size_t shard)
{
    /* in place: NCCL's rule is recvbuff == sendbuff + rank * recvcount */
    SD_NCCL_CHECK(ncclReduceScatter(buf, buf + (size_t)c->rank * shard, shard, ncclFloat32,
                                    ncclSum, c->comm, c->stream));
    debug_sync(c, c->stream);
}

extern "C" void sd_nccl_allgather_bf16(sd_nccl *c, void *buf, size_t shard)
{
    uint16_t *b = (uint16_t *)buf;
    SD_NCCL_CHECK(ncclAllGather(b + (size_t)c->rank * shard, b, shard, ncclBfloat16, c->comm,
                                c->stream));
    debug_sync(c, c->stream);
}

extern "C" void sd_nccl_allgather(sd_nccl *c, float *buf, size_t shard)
{
    /* in place: sendbuff == recvbuff + rank * sendcount */
    SD_NCCL_CHECK(ncclAllGather(buf + (size_t)c->rank * shard, buf, shard, ncclFloat32, c->comm,
                                c->stream));
    debug_sync(c, c->stream);
}

/* The side stream, after the work queued on the backend's stream so far. */
static cudaStream_t side_after_compute(sd_nccl *c)
{
    if (!c->side) {
        int lo, hi;
        /* the highest priority: a reduction's small kernels should not wait behind the
         * backward's big ones */
        SD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
        SD_CUDA_CHECK(cudaStreamCreateWithPriority(&c->side, cudaStreamNonBlocking, hi));
        SD_CUDA_CHECK(cudaEventCreateWithFlags(&c->at_compute, cudaEventDisableTiming));
        SD_CUDA_CHECK(cudaEventCreateWithFlags(&c->at_side, cudaEventDisableTiming));
    }
    /* the wait takes the event as recorded now, so one event serves every call */
    SD_CUDA_CHECK(cudaEventRecord(c->at_compute, c->stream));
    SD_CUDA_CHECK(cudaStreamWaitEvent(c->side, c->at_compute, 0));
    c->side_pending = 1;
    return c->side;
}

extern "C" void sd_nccl_bucket_allreduce_sum(sd_nccl *c, float *buf, size_t n)
{
    cudaStream_t s = side_after_compute(c);
    SD_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, c->comm, s));
    debug_sync(c, s);
}

extern "C" void sd_nccl_bucket_reduce_sum(sd_nccl *c, float *buf, size_t n, int root)
{
    cudaStream_t s = side_after_compute(c);
    SD_CHECK(root >= 0 && root < c->nranks, "NCCL reduce to rank %d of %d", root, c->nranks);
    SD_NCCL_CHECK(ncclReduce(buf, buf, n, ncclFloat32, ncclSum, root, c->comm, s));
    debug_sync(c, s);
}

extern "C" void sd_nccl_join(sd_nccl *c)
{
    if (!c->side_pending)
        return;
    SD_CUDA_CHECK(cudaEventRecord(c->at_side, c->side));
    SD_CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->at_side, 0));
    c->side_pending = 0;
}

extern "C" void sd_nccl_bucket_broadcast(sd_nccl *c, void *buf, size_t n, int elem_bytes, int root)
{
    cudaStream_t s = side_after_compute(c);
    SD_CHECK(root >= 0 && root < c->nranks, "NCCL broadcast from rank %d of %d", root, c->nranks);
    SD_CHECK(elem_bytes == 2 || elem_bytes == 4, "NCCL broadcast of %d-byte elements", elem_bytes);
    SD_NCCL_CHECK(ncclBroadcast(buf, buf, n, elem_bytes == 2 ? ncclBfloat16 : ncclFloat32, root,
                                c->comm, s));
    debug_sync(c, s);
}

extern "C" void sd_nccl_side_mark(sd_nccl *c, int slot)
{
    SD_CHECK(c->side && slot >= 0, "sd_nccl_side_mark(%d) before any work on the side stream",
             slot);
    if (slot >= c->n_marks) {
        cudaEvent_t *m = (cudaEvent_t *)realloc(c->marks, (size_t)(slot + 1) * sizeof *m);
        SD_CHECK(m != NULL, "out of host memory");
        c->marks = m;
        for (; c->n_marks <= slot; c->n_marks++)
            SD_CUDA_CHECK(cudaEventCreateWithFlags(&c->marks[c->n_marks],
                                                   cudaEventDisableTiming));
    }
    SD_CUDA_CHECK(cudaEventRecord(c->marks[slot], c->side));
}

extern "C" void sd_nccl_side_wait(sd_nccl *c, int slot)
{
    SD_CHECK(slot >= 0 && slot < c->n_marks, "sd_nccl_side_wait(%d): no such mark", slot);
    SD_CUDA_CHECK(cudaStreamWaitEvent(c->stream, c->marks[slot], 0));
}
