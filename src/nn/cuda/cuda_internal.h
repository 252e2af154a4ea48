/* Shared by the CUDA backend's .cu files: backend state, element-type helpers, launch checks.
 * CUDA C++ kept C-like: templates only for the element type (float / bf16) and small functors. */
#ifndef SDTRAIN_CUDA_INTERNAL_H
#define SDTRAIN_CUDA_INTERNAL_H

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "sdtrain/check.h"
#include "sdtrain/cuda_check.h"
#include "sdtrain/ops.h"

/* Elements of the pinned staging buffer for host fp32 <-> bf16 copies (8 MiB). */
#define SD_CUDA_STAGE_ELEMS (1 << 22)

/* Attention implementations (sd_cuda_state.attention_mode): the math path of ops_cuda_gemm.cu,
 * or the fused kernels of ops_cuda_attention.cu where they apply (BF16, head_dim 32/64/128). */
#define SD_CUDA_ATTENTION_MATH 0
#define SD_CUDA_ATTENTION_FLASH 1

/* Group-norm apply kernels (sd_cuda_state.gn_apply, ops_cuda_norm.cu): statistics and affine
 * parameters loaded per element; each thread's channel constants in registers; that with the
 * forward SiLU from __expf / __fdividef (a few fp32 ulps); auto: fast where the output is bf16
 * (whose rounding, 2^-9, hides those ulps), regs for fp32. */
#define SD_CUDA_GN_APPLY_LOADS 0
#define SD_CUDA_GN_APPLY_REGS 1
#define SD_CUDA_GN_APPLY_FAST 2
#define SD_CUDA_GN_APPLY_AUTO 3

/* Convolution forward APIs (sd_cuda_state.conv_api, SDTRAIN_CUDA_CONV_API, in the order of its
 * list of values, the default first): cuDNN's graph API (ops_cuda_conv_graph.cu) with conv + bias
 * (+ residual) as one graph, precompiled engines only; its legacy convolution calls; the graph
 * API also with engines compiled at run time. */
#define SD_CUDA_CONV_API_GRAPH 0
#define SD_CUDA_CONV_API_LEGACY 1
#define SD_CUDA_CONV_API_GRAPH_RTC 2

/* cuBLASLt workspace owned by the backend (32 MiB: what cuBLAS asks for on Hopper). */
#define SD_CUDA_LT_WORKSPACE (32u << 20)

struct sd_cuda_conv_cache; /* ops_cuda_conv.cu */
struct sd_cuda_gemm_cache; /* ops_cuda_gemm.cu */
struct sd_cuda_prof;       /* backend_cuda.cu: SDTRAIN_CUDA_PROFILE=1 */

/* be->impl of a CUDA backend. One stream: every op is enqueued on it in program order. */
typedef struct sd_cuda_state {
    int device;
    sd_dtype dtype;           /* SD_F32 or SD_BF16 */
    cudaStream_t stream;
    cudaStream_t copy_stream; /* sd_upload_async's copies, beside the compute stream */
    cudaEvent_t copy_done;    /* recorded after each such copy; the compute stream waits on it */
    cudaEvent_t compute_mark; /* sd_download_async: the copy stream waits for the ops so far */
    cudaEvent_t marks[SD_STREAM_MARKS]; /* sd_stream_mark (timed events) */
    unsigned marks_set;       /* bit i: marks[i] has been recorded */
    int copy_stream_on;       /* SDTRAIN_CUDA_COPY_STREAM=off: async copies on the compute stream */
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;
    void *lt_workspace;       /* SD_CUDA_LT_WORKSPACE bytes of device memory */
    void *stage;              /* pinned host staging for bf16 conversions, or NULL */
    int sm_count;
    int sync_each_op;         /* SDTRAIN_CUDA_SYNC=1: synchronize and check after every launch */
    int attention_mode;       /* SDTRAIN_CUDA_ATTENTION: SD_CUDA_ATTENTION_MATH or _FLASH */
    int gn_onepass;           /* SDTRAIN_CUDA_GN_STATS: 1 onepass (group statistics in one
                               * read), 2 wide (the same, 4 channels per thread), 0 twopass */
    int gn_apply;             /* SDTRAIN_CUDA_GN_APPLY: an SD_CUDA_GN_APPLY_* value */
    int conv_find;            /* SDTRAIN_CUDA_CONV_ALGO=find: timed algorithm choice */
    int conv_api;             /* SDTRAIN_CUDA_CONV_API: an SD_CUDA_CONV_API_* value */
    int conv_bias_separate;   /* SDTRAIN_CUDA_CONV_BIAS=separate: no bias in cuDNN's epilogue */
    int64_t conv_graph_runs;  /* convolution forwards run through a graph-API plan */
    struct sd_cuda_conv_cache *conv_cache;
    struct sd_cuda_gemm_cache *gemm_cache;
    struct sd_cuda_prof *prof; /* op timings (SDTRAIN_CUDA_PROFILE=1), or NULL */
    sd_wait_fn wait_fn;       /* sd_backend_cuda_set_wait_hook, or NULL */
    void *wait_user;
    sd_backend backend;       /* the object handed out; backend.impl points back here */
    sd_ops ops;               /* the table backend.ops points at */
} sd_cuda_state;

static inline sd_cuda_state *sd_cuda(const sd_backend *be)
{
    return (sd_cuda_state *)be->impl;
}

static inline cudaStream_t sd_cuda_stream(const sd_backend *be)
{
    return sd_cuda(be)->stream;
}

/* The host waits for stream s: cudaStreamSynchronize, or, with a wait hook set
 * (sd_backend_cuda_set_wait_hook), polling that calls the hook every few milliseconds. */
void sd_cuda_stream_wait(const sd_cuda_state *st, cudaStream_t s);
/* Before a copy to or from pageable host memory on stream s: the same watched wait while a
 * wait hook is set (the copy itself would block unwatched), nothing otherwise. */
void sd_cuda_wait_before_copy(const sd_cuda_state *st, cudaStream_t s);

/* Op profile (SDTRAIN_CUDA_PROFILE=1, backend_cuda.cu): a mark inside an op splits its time, the
 * GPU work since the previous mark going to `label` (a string literal such as
 * "linear_backward:dw"); what follows the last sub-mark keeps the op's own name. No-op without
 * profiling. */
void sd_cuda_profile_mark(const sd_backend *be, const char *label);
#define SD_CUDA_SUBMARK(be, label)                                                             \
    do {                                                                                       \
        if (sd_cuda(be)->prof)                                                                 \
            sd_cuda_profile_mark((be), (label));                                               \
    } while (0)

/* After a library call that queues work (cuDNN, a memset or copy): with SDTRAIN_CUDA_SYNC=1 the
 * stream is synchronized, so that an error inside the library's kernels is reported at this op
 * (cudaGetLastError is not asked: libraries may leave a benign error there); then the profile
 * mark. */
#define SD_CUDA_LIB_DONE(be, label)                                                            \
    do {                                                                                       \
        if (sd_cuda(be)->sync_each_op)                                                         \
            sd_cuda_stream_wait(sd_cuda(be), sd_cuda(be)->stream);                             \
        SD_CUDA_SUBMARK(be, label);                                                            \
    } while (0)

/* After every kernel launch: a launch error (bad configuration) is reported at once; with
 * SDTRAIN_CUDA_SYNC=1 the stream is also synchronized (the watched wait: NCCL's errors and
 * timeout are seen there too) so an error inside the kernel is reported at the op that caused
 * it rather than at a later synchronization. */
#define SD_CUDA_LAUNCHED(be)                                                                   \
    do {                                                                                       \
        SD_CUDA_CHECK(cudaGetLastError());                                                     \
        if (sd_cuda(be)->sync_each_op)                                                         \
            sd_cuda_stream_wait(sd_cuda(be), sd_cuda(be)->stream);                             \
    } while (0)

/* ---- element types ---------------------------------------------------------------------- */

/* Loads and stores through fp32: every kernel computes in fp32 whatever the storage type. */
static __device__ __forceinline__ float sd_ld(const float *p, int64_t i)
{
    return p[i];
}
static __device__ __forceinline__ float sd_ld(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
static __device__ __forceinline__ void sd_st(float *p, int64_t i, float v)
{
    p[i] = v;
}
static __device__ __forceinline__ void sd_st(__nv_bfloat16 *p, int64_t i, float v)
{
    p[i] = __float2bfloat16_rn(v);
}

/* Runs `body` with T = float or __nv_bfloat16 according to the backend's dtype:
 *   SD_CUDA_DISPATCH(be, T, { my_kernel<T><<<g, b, 0, s>>>((const T *)x, (T *)y, n); });  */
#define SD_CUDA_DISPATCH(be, T, ...)                                                          \
    do {                                                                                       \
        switch (sd_cuda(be)->dtype) {                                                          \
        case SD_F32: {                                                                         \
            typedef float T;                                                                   \
            __VA_ARGS__;                                                                       \
            break;                                                                             \
        }                                                                                      \
        case SD_BF16: {                                                                        \
            typedef __nv_bfloat16 T;                                                           \
            __VA_ARGS__;                                                                       \
            break;                                                                             \
        }                                                                                      \
        default:                                                                               \
            SD_CHECK(0, "CUDA backend dtype %d is neither F32 nor BF16",                       \
                     (int)sd_cuda(be)->dtype);                                                 \
        }                                                                                      \
    } while (0)

/* Bytes of one element of the backend's tensors (4 or 2). */
static inline size_t sd_cuda_elem(const sd_backend *be)
{
    return sd_cuda(be)->dtype == SD_BF16 ? 2 : 4;
}

/* cudaDataType / cuDNN data type of the backend's tensors. */
static inline cudaDataType_t sd_cuda_data_type(const sd_backend *be)
{
    return sd_cuda(be)->dtype == SD_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}
static inline cudnnDataType_t sd_cudnn_data_type(const sd_backend *be)
{
    return sd_cuda(be)->dtype == SD_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

/* Grid size for a grid-stride loop over n items: enough blocks to fill the GPU a few times,
 * never more than the items need. */
static inline unsigned sd_cuda_grid(const sd_backend *be, int64_t n, int threads)
{
    int64_t need = (n + threads - 1) / threads;
    int64_t cap = (int64_t)sd_cuda(be)->sm_count * 32;
    if (need > cap)
        need = cap;
    return (unsigned)(need > 0 ? need : 1);
}

/* ---- row-wise kernels ------------------------------------------------------------------------
 * Kernels over [planes, rows, cols] views (a batch of images' pixel rows, a matrix's rows) put
 * the columns on x, the rows on y (a stride loop past the grid's y limit) and the planes on z, so
 * that no thread splits a flat 64-bit index with / and %: 64-bit integer division is a software
 * routine of some 70 instructions on the GPU, which made the per-element kernels written that way
 * (padding, nearest upsampling, GEGLU, broadcast add, concat) instruction-bound at a fraction of
 * the copy bandwidth. Inside a kernel:
 *   const int j = SD_COL_INDEX(); if (j >= cols) return;  SD_ROW_LOOP(r, rows) { ... }  */
#define SD_GRID_Y_MAX 65535
#define SD_COL_INDEX() ((int)(blockIdx.x * blockDim.x + threadIdx.x))
#define SD_ROW_LOOP(r, rows) for (int64_t r = blockIdx.y; r < (rows); r += gridDim.y)

/* Threads of a row-wise block: a row of up to 1024 columns in one block (whole warps, so a
 * row of 320 does not leave most of a second 256-thread block idle), longer rows in blocks of
 * 256. */
static inline int sd_cuda_row_threads(int64_t cols)
{
    if (cols <= 32)
        return 32;
    return cols > 1024 ? 256 : (int)((cols + 31) / 32 * 32);
}

/* The grid of a row-wise kernel: x covers the columns, y min(rows, y_max), z the planes. */
static inline dim3 sd_cuda_row_grid(int64_t rows, int64_t cols, int threads, int64_t planes,
                                    int64_t y_max)
{
    const int64_t gx = (cols + threads - 1) / threads;
    const int64_t gy = rows < y_max ? rows : y_max;
    return dim3((unsigned)(gx > 0 ? gx : 1), (unsigned)(gy > 0 ? gy : 1),
                (unsigned)(planes > 0 ? planes : 1));
}

/* y [rows, c] += bias [c] (conv and linear when the bias is not in the library's epilogue). */
template <typename T>
static __global__ void sd_bias_rows_kernel(int64_t rows, int c, const T *bias, T *y)
{
    const int ch = SD_COL_INDEX();
    if (ch >= c)
        return;
    const float bv = sd_ld(bias, ch);
    SD_ROW_LOOP(r, rows)
    {
        const int64_t i = r * c + ch;
        sd_st(y, i, sd_ld(y, i) + bv);
    }
}

/* Pure copies move chunks of 16, 8, 4, 2 or 1 bytes: the widest that divides a pixel's bytes
 * and both addresses. */
static inline int sd_cuda_chunk_bytes(size_t pixel_bytes, const void *a, const void *b)
{
    for (int u = 16; u > 1; u /= 2)
        if (pixel_bytes % (size_t)u == 0 && (uintptr_t)a % (uintptr_t)u == 0 &&
            (uintptr_t)b % (uintptr_t)u == 0)
            return u;
    return 1;
}

/* Runs `body` with U the unsigned type of `bytes` bytes (16: uint4). */
#define SD_CUDA_CHUNK_DISPATCH(bytes, U, ...)                                                  \
    do {                                                                                       \
        switch (bytes) {                                                                       \
        case 16: { typedef uint4 U; __VA_ARGS__; break; }                                      \
        case 8: { typedef uint2 U; __VA_ARGS__; break; }                                       \
        case 4: { typedef unsigned U; __VA_ARGS__; break; }                                    \
        case 2: { typedef unsigned short U; __VA_ARGS__; break; }                              \
        default: { typedef unsigned char U; __VA_ARGS__; break; }                              \
        }                                                                                      \
    } while (0)

/* Launches a row-wise bias add on the backend's stream. */
static inline void sd_cuda_bias_rows(const sd_backend *be, int64_t rows, int c, const void *bias,
                                     void *y)
{
    const int threads = sd_cuda_row_threads(c);
    const dim3 grid = sd_cuda_row_grid(rows, c, threads, 1, SD_GRID_Y_MAX);
    cudaStream_t s = sd_cuda_stream(be);
    SD_CUDA_DISPATCH(be, T, {
        sd_bias_rows_kernel<T><<<grid, threads, 0, s>>>(rows, c, (const T *)bias, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* Round a byte count up to 256 (so several scratch pieces carved from one block stay aligned). */
static inline size_t sd_cuda_align(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

/* ---- the parts of the op table, one per source file -------------------------------------- */

/* ops_cuda_elem.cu: activations, elementwise, data movement, embeddings, resampling. */
void sd_cuda_fill_elementwise_ops(sd_ops *ops);
/* ops_cuda_norm.cu: group norm, layer norm, and the column reductions (bias gradients). */
void sd_cuda_fill_norm_ops(sd_ops *ops);
/* ops_cuda_conv.cu: conv2d forward/backward through cuDNN. */
void sd_cuda_fill_conv_ops(sd_ops *ops);
void sd_cuda_conv_cache_destroy(sd_cuda_state *st);
/* ops_cuda_conv_graph.cu: one conv forward (+ bias, + residual when with_z) as a cuDNN graph
 * and its execution plan. build returns NULL with the reason in `why` when cuDNN offers no
 * usable plan (never aborts); run returns 0 without doing anything when the call does not fit
 * the plan (no bias, residual or not as built, a pointer not 16-byte aligned), 1 after
 * enqueuing it on the backend's stream, -1 with the reason in `why` when cuDNN refused to run
 * it (nothing was enqueued: the caller drops the plan and takes the legacy path); ws must hold
 * sd_cuda_conv_graph_ws bytes. */
typedef struct sd_conv_graph sd_conv_graph;
sd_conv_graph *sd_cuda_conv_graph_build(sd_cuda_state *st, const sd_conv2d_desc *d, int with_z,
                                        size_t ws_cap, char *why, size_t nwhy);
size_t sd_cuda_conv_graph_ws(const sd_conv_graph *g);
void sd_cuda_conv_graph_describe(const sd_conv_graph *g, char *buf, size_t n);
int sd_cuda_conv_graph_run(sd_cuda_state *st, const sd_conv_graph *g, const void *x,
                           const void *w, const void *b, const void *z, void *y, void *ws,
                           char *why, size_t nwhy);
void sd_cuda_conv_graph_free(sd_conv_graph *g);
/* ops_cuda_gemm.cu: linear forward/backward through cuBLASLt, attention. */
void sd_cuda_fill_gemm_ops(sd_ops *ops);
void sd_cuda_gemm_cache_destroy(sd_cuda_state *st);
/* ops_cuda_attention.cu: fused attention; takes over the attention entries (call after
 * sd_cuda_fill_gemm_ops) and hands a descriptor it does not take to the math path. */
void sd_cuda_fill_attention_ops(sd_ops *ops);

/* ops_cuda_norm.cu: db[c] (+)= sum over rows of dy[rows, c] (dy of the backend's dtype), fp32,
 * deterministic (fixed split of the rows, partial sums added in order). `scratch` must hold
 * sd_cuda_colsum_scratch(rows, c) bytes of device memory. accumulate = 0 overwrites db. */
size_t sd_cuda_colsum_scratch(int64_t rows, int c);
void sd_cuda_colsum(const sd_backend *be, int64_t rows, int c, const void *dy, float *db,
                    int accumulate, void *scratch);

#endif
