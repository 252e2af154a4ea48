/* The op interface: channels-last forward/backward kernels behind one table of functions per backend. */
#ifndef SDTRAIN_OPS_H
#define SDTRAIN_OPS_H

/*
 * Model code calls the sd_* functions below with a backend; each checks its arguments
 * (SD_CHECK: a wrong shape is a bug, not bad input) and calls the backend's entry in its
 * sd_ops table. doc/ops.md is the long version of this comment.
 *
 * Layouts (row-major, contiguous unless a stride says otherwise):
 *   images / feature maps   [n, h, w, c]  (NHWC, channels last)
 *   token sequences         [n, t, c]     (attention heads: channel = head * head_dim + d)
 *   conv2d weight           [c_out, kh, kw, c_in]   (PyTorch's OIHW permuted at load)
 *   linear weight           [out, in]               (as PyTorch: y = x W^T + b)
 *   norm gamma/beta, biases [c]
 * sd_weight_from_torch() / sd_weight_to_torch() convert between PyTorch's layouts and these.
 *
 * Element types: every `void *` tensor (activations, their gradients, weights, biases, gamma,
 * beta) holds elements of `be->dtype` and lives in the backend's memory (`be->device`). The
 * `float *` arguments are fp32 in every backend: norm statistics, attention log-sum-exp,
 * timesteps, and weight gradients (accumulated in fp32 whatever the compute type).
 * The CPU backend computes in fp32 (be->dtype = SD_F32).
 *
 * Memory: ops never allocate. Outputs are caller memory; an op that needs temporary memory
 * takes an sd_scratch and has a *_scratch_bytes() query for the size it needs for a given
 * shape (the size may differ between backends; 0 = none). Size the scratch with a measuring
 * arena in a dry run, then carve it from the real one. The ops check that the scratch is big
 * enough. A size may depend on the backend's settings (the CPU attention keeps one score block
 * per OpenMP thread), so query after setting thread counts.
 *
 * Gradients: backward ops ACCUMULATE weight gradients (dw += ..., db += ..., fp32), so a step
 * zeroes the gradient buffer once and micro-batches add into it. Input gradients are written
 * (accumulate = 0) or added (accumulate = 1), for tensors that feed several consumers (a
 * skip connection, the time embedding). Gradient pointers documented as optional may be NULL
 * when that gradient is not wanted.
 *
 * Aliasing: elementwise ops (silu, gelu, add, axpby, ...) allow the output to be an input;
 * every other op needs outputs that overlap no input.
 *
 * Determinism: on the CPU the result of every op is a function of its inputs only, not of the
 * OpenMP or BLAS thread count: work is split over independent outputs, each reduction is done
 * by one thread in a fixed order, and blocking depends on the shape only.
 *
 * Backward entries that a backend does not provide yet are NULL in its table; calling the
 * sd_* wrapper of one ends the job with a message naming the op and the backend.
 */

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_backend sd_backend;

/* Temporary memory lent to one op call (backend memory, e.g. from an arena). */
typedef struct sd_scratch {
    void *ptr;
    size_t bytes;
} sd_scratch;

/* For ops that need no scratch, or a query that returned 0. */
static inline sd_scratch sd_scratch_none(void)
{
    sd_scratch s = {NULL, 0};
    return s;
}

/* ---- Shape descriptors ------------------------------------------------------------------ */

/* 2-D convolution (cross-correlation, zero padding) of x [n, h, w, c_in] with a weight
 * [c_out, kh, kw, c_in], giving y [n, h_out, w_out, c_out]. Padding may be asymmetric: the
 * VAE encoder's Downsample2D pads only the right and bottom (pad_bottom = pad_right = 1,
 * pad_top = pad_left = 0) before a 3x3 stride-2 convolution. */
typedef struct sd_conv2d_desc {
    int n, h, w, c_in;
    int c_out, kh, kw;
    int stride;
    int pad_top, pad_bottom, pad_left, pad_right;
    int h_out, w_out; /* (h + pad_top + pad_bottom - kh) / stride + 1, likewise w */
} sd_conv2d_desc;

/* A square k x k convolution with the same padding on all sides. */
sd_conv2d_desc sd_conv2d_make(int n, int h, int w, int c_in, int c_out, int k, int stride,
                              int pad);
/* Any padding: top, bottom, left, right (PyTorch's F.pad order is left, right, top, bottom). */
sd_conv2d_desc sd_conv2d_make_padded(int n, int h, int w, int c_in, int c_out, int kh, int kw,
                                     int stride, int pad_top, int pad_bottom, int pad_left,
                                     int pad_right);

/* Group normalization of x [n, hw, c]: group g owns channels [g*c/groups, (g+1)*c/groups),
 * statistics over those channels at all hw positions of one sample, biased variance.
 * y = (x - mean) * rstd * gamma + beta, then SiLU when `silu` is set (GroupNorm followed by
 * SiLU is how every SD2 ResNet and output head uses it; backward recomputes the pre-SiLU
 * value from x, mean and rstd). */
typedef struct sd_group_norm_desc {
    int n, hw, c, groups;
    float eps;
    int silu;
} sd_group_norm_desc;

/* Multi-head scaled-dot-product attention. q [batch, t_q, heads*head_dim] (token row stride
 * ld_q elements), k and v [batch, t_kv, ...] (strides ld_k, ld_v), o [batch, t_q, ...]
 * (stride ld_o). Head h uses channels [h*head_dim, (h+1)*head_dim) of every row, so a fused
 * QKV projection [t, 3C] is used in place with ld = 3C and pointers offset by 0, C, 2C.
 * s = scale * q.k, softmax over keys in fp32 with the row maximum subtracted; with `causal`
 * (CLIP) query i sees keys j <= i only and t_q must equal t_kv. */
typedef struct sd_attention_desc {
    int batch, heads, head_dim;
    int t_q, t_kv;
    int ld_q, ld_k, ld_v, ld_o;
    float scale;
    int causal;
} sd_attention_desc;

/* Contiguous rows (ld = heads*head_dim), scale = head_dim^-0.5 rounded from double to float as
 * diffusers' `dim_head**-0.5` is (exactly 0.125 for head_dim 64). */
sd_attention_desc sd_attention_make(int batch, int heads, int head_dim, int t_q, int t_kv,
                                    int causal);

/* Sinusoidal timestep embedding, diffusers' get_timestep_embedding: half = dim/2,
 * freq_k = exp(-ln(max_period) * k / (half - downscale_freq_shift)), arg = scale * t * freq_k,
 * out = [sin(arg) | cos(arg)], or [cos | sin] with flip_sin_to_cos, zero-padded to dim when
 * dim is odd. The SD2 U-Net uses dim 320, flip_sin_to_cos 1, shift 0, scale 1, period 10000
 * (see sd_timestep_embedding_sd2). Evaluated in fp32 with the rounding steps of the PyTorch
 * code; exp/sin/cos come from the platform's libm (within an ulp of PyTorch's). */
typedef struct sd_timestep_embedding_desc {
    int dim;
    int flip_sin_to_cos;
    float downscale_freq_shift;
    float scale;
    float max_period;
} sd_timestep_embedding_desc;

sd_timestep_embedding_desc sd_timestep_embedding_sd2(int dim);

/* ---- The backend table ------------------------------------------------------------------ */

/* One entry per op; `be` is passed back so a backend reaches its state (stream, handles).
 * Arguments are already checked by the sd_* wrappers. Scratch queries may be NULL (= 0). */
typedef struct sd_ops {
    /* memory of the backend (CPU: memcpy/memset) */
    void (*synchronize)(const sd_backend *be);
    void (*zero)(const sd_backend *be, void *dst, size_t bytes);
    void (*copy)(const sd_backend *be, void *dst, const void *src, size_t bytes);
    void (*upload_f32)(const sd_backend *be, void *dst, const float *src, int64_t n);
    void (*download_f32)(const sd_backend *be, float *dst, const void *src, int64_t n);
    void *(*alloc)(const sd_backend *be, size_t bytes);
    void (*release)(const sd_backend *be, void *ptr);
    void (*upload)(const sd_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(const sd_backend *be, void *dst, const void *src, size_t bytes);
    /* host memory for asynchronous uploads (CUDA: pinned) and the upload itself */
    void *(*host_alloc)(const sd_backend *be, size_t bytes);
    void (*host_release)(const sd_backend *be, void *ptr);
    void (*upload_async)(const sd_backend *be, void *dst, const void *src, size_t bytes);
    void (*download_async)(const sd_backend *be, void *dst, const void *src, size_t bytes);
    void (*download_wait)(const sd_backend *be);

    size_t (*conv2d_forward_scratch)(const sd_backend *be, const sd_conv2d_desc *d);
    void (*conv2d_forward)(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                           const void *w, const void *b, void *y, sd_scratch ws);
    /* optional (NULL: conv2d_forward, then add): y = conv(x, w) + b + z, scratch as forward */
    void (*conv2d_forward_add)(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                               const void *w, const void *b, const void *z, void *y,
                               sd_scratch ws);
    size_t (*conv2d_backward_scratch)(const sd_backend *be, const sd_conv2d_desc *d);
    void (*conv2d_backward)(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                            const void *w, const void *dy, void *dx, int accumulate,
                            float *dw, float *db, sd_scratch ws);

    void (*linear_forward)(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                           const void *w, const void *b, void *y);
    /* optional (NULL: linear_forward, then add): y = x w^T + b + z */
    void (*linear_forward_add)(const sd_backend *be, int64_t rows, int in, int out,
                               const void *x, const void *w, const void *b, const void *z,
                               void *y);
    size_t (*linear_backward_scratch)(const sd_backend *be, int64_t rows, int in, int out);
    void (*linear_backward)(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                            const void *w, const void *dy, void *dx, int accumulate, float *dw,
                            float *db, sd_scratch ws);

    size_t (*group_norm_forward_scratch)(const sd_backend *be, const sd_group_norm_desc *d);
    void (*group_norm_forward)(const sd_backend *be, const sd_group_norm_desc *d, const void *x,
                               const void *gamma, const void *beta, void *y, float *mean,
                               float *rstd, sd_scratch ws);
    size_t (*group_norm_backward_scratch)(const sd_backend *be, const sd_group_norm_desc *d);
    void (*group_norm_backward)(const sd_backend *be, const sd_group_norm_desc *d,
                                const void *x, const void *gamma, const void *beta,
                                const float *mean, const float *rstd, const void *dy, void *dx,
                                int accumulate, float *dgamma, float *dbeta, sd_scratch ws);

    void (*layer_norm_forward)(const sd_backend *be, int64_t rows, int c, float eps,
                               const void *x, const void *gamma, const void *beta, void *y,
                               float *mean, float *rstd);
    size_t (*layer_norm_backward_scratch)(const sd_backend *be, int64_t rows, int c);
    void (*layer_norm_backward)(const sd_backend *be, int64_t rows, int c, const void *x,
                                const void *gamma, const float *mean, const float *rstd,
                                const void *dy, void *dx, int accumulate, float *dgamma,
                                float *dbeta, sd_scratch ws);

    void (*silu_forward)(const sd_backend *be, int64_t n, const void *x, void *y);
    void (*silu_backward)(const sd_backend *be, int64_t n, const void *x, const void *dy,
                          void *dx, int accumulate);
    void (*gelu_forward)(const sd_backend *be, int64_t n, const void *x, void *y);
    void (*gelu_backward)(const sd_backend *be, int64_t n, const void *x, const void *dy,
                          void *dx, int accumulate);
    void (*quick_gelu_forward)(const sd_backend *be, int64_t n, const void *x, void *y);
    void (*quick_gelu_backward)(const sd_backend *be, int64_t n, const void *x, const void *dy,
                                void *dx, int accumulate);
    void (*geglu_forward)(const sd_backend *be, int64_t rows, int inner, const void *x,
                          void *y);
    void (*geglu_backward)(const sd_backend *be, int64_t rows, int inner, const void *x,
                           const void *dy, void *dx, int accumulate);

    size_t (*attention_forward_scratch)(const sd_backend *be, const sd_attention_desc *d);
    void (*attention_forward)(const sd_backend *be, const sd_attention_desc *d, const void *q,
                              const void *k, const void *v, void *o, float *lse,
                              sd_scratch ws);
    size_t (*attention_backward_scratch)(const sd_backend *be, const sd_attention_desc *d);
    void (*attention_backward)(const sd_backend *be, const sd_attention_desc *d, const void *q,
                               const void *k, const void *v, const void *o, const float *lse,
                               const void *dout, void *dq, void *dk, void *dv, int accumulate,
                               sd_scratch ws);

    void (*upsample_nearest_forward)(const sd_backend *be, int n, int h, int w, int c,
                                     int h_out, int w_out, const void *x, void *y);
    void (*upsample_nearest_backward)(const sd_backend *be, int n, int h, int w, int c,
                                      int h_out, int w_out, const void *dy, void *dx,
                                      int accumulate);

    void (*timestep_embedding)(const sd_backend *be, int n, const sd_timestep_embedding_desc *d,
                               const float *t, void *y);
    void (*embedding_forward)(const sd_backend *be, int batch, int t, int c, int vocab,
                              const int32_t *ids, const void *table, const void *pos_table,
                              void *y);

    void (*add)(const sd_backend *be, int64_t n, const void *a, const void *b, float divisor,
                void *y);
    void (*axpby)(const sd_backend *be, int64_t n, float alpha, const void *x, float beta,
                  void *y);
    void (*add_bcast_forward)(const sd_backend *be, int n, int64_t rows, int c, const void *x,
                              const void *v, void *y);
    size_t (*add_bcast_backward_scratch)(const sd_backend *be, int n, int64_t rows, int c);
    void (*add_bcast_backward)(const sd_backend *be, int n, int64_t rows, int c,
                               const void *dy, void *dv, int accumulate, sd_scratch ws);
    void (*concat_channels)(const sd_backend *be, int64_t rows, int c1, int c2, const void *a,
                            const void *b, void *y);
    void (*split_channels)(const sd_backend *be, int64_t rows, int c1, int c2, const void *x,
                           void *a, void *b, int accumulate);
    void (*nchw_to_nhwc)(const sd_backend *be, int n, int c, int h, int w, const void *x,
                         void *y);
    void (*nhwc_to_nchw)(const sd_backend *be, int n, int c, int h, int w, const void *x,
                         void *y);
    void (*diag_gaussian_sample)(const sd_backend *be, int64_t rows, int c, const void *moments,
                                 const void *eps, float scale, void *z);
    void (*cast_f32)(const sd_backend *be, int64_t n, const float *x, void *y);
    void (*cast_to_f32)(const sd_backend *be, int64_t n, const void *x, float *y);
    void (*mse_loss)(const sd_backend *be, int n, int64_t hw, int c, const void *pred,
                     const float *target, const float *coef, float *mse, void *dy);

    /* Optional profiling hook (CUDA with SDTRAIN_CUDA_PROFILE=1; NULL otherwise): the sd_*
     * wrappers call it before each compute op with NULL and after it with the op's name. */
    void (*profile_mark)(const sd_backend *be, const char *label);
    void (*profile_reset)(const sd_backend *be); /* forget what was measured so far */

    /* the stream clock (sd_stream_mark, sd_stream_elapsed) */
    void (*stream_mark)(const sd_backend *be, int slot);
    double (*stream_elapsed)(const sd_backend *be, int a, int b);
} sd_ops;

struct sd_backend {
    const char *name;   /* "cpu", "cuda" */
    sd_device device;   /* where the tensors passed to ops live */
    sd_dtype dtype;     /* element type of the `void *` tensors */
    const sd_ops *ops;
    void *impl;         /* backend state (CUDA: device, stream, library handles); CPU: NULL */
};

/* The CPU backend: fp32, OpenMP + CBLAS, host pointers. A static object: never freed. */
const sd_backend *sd_backend_cpu(void);

/* The CUDA backend on GPU `device` (a CUDA ordinal) with tensors of `dtype`:
 *   SD_F32   fp32 everywhere and no TF32 (cuDNN FMA math, cuBLASLt COMPUTE_32F), so results
 *            can be compared with the CPU backend and the goldens;
 *   SD_BF16  bf16 activations and weights, fp32 accumulation in every GEMM, convolution,
 *            reduction and softmax; the fp32 arguments (statistics, weight gradients) stay fp32.
 * All ops of one backend run in order on its own stream; sd_synchronize waits for them.
 * Returns 0, or -1 with err set (no CUDA in this build, no such device, library failure). */
int sd_backend_cuda_create(int device, sd_dtype dtype, sd_backend **out, sd_err *err);
/* Frees the stream, the library handles, the caches and workspaces; NULL is ignored. */
void sd_backend_cuda_destroy(sd_backend *be);
/* The backend's cudaStream_t (as void *, so that C callers need no CUDA header), for libraries
 * that enqueue work in order with the ops (NCCL). NULL in a build without CUDA. */
void *sd_backend_cuda_stream(const sd_backend *be);
/* While the host waits for a CUDA backend's GPU work (sd_synchronize, sd_download, the
 * optimizer's read-backs, ...), fn(user, waited_s) is called each time the host finds the work
 * unfinished (it polls, yielding between polls for 2 ms, then every 20 us), with the seconds
 * this wait has lasted; fn must be cheap. It may end the job (sd_fatal) when something it
 * watches has failed or taken too long (the NCCL communicator: sd_nccl_create sets it),
 * instead of leaving the rank blocked forever behind a collective whose peer is gone. NULL fn:
 * plain blocking waits (the default). A no-op for other backends and in a build without
 * CUDA. */
typedef void (*sd_wait_fn)(void *user, double waited_s);
void sd_backend_cuda_set_wait_hook(const sd_backend *be, sd_wait_fn fn, void *user);
/* The host waits for `stream` (a cudaStream_t of this backend's device, e.g. NCCL's side
 * stream) as the backend waits for its own: under the wait hook when one is set. */
void sd_backend_cuda_wait_stream(const sd_backend *be, void *stream);
/* What the backend does after each of its own ops, for work queued beside them (NCCL): checks
 * for a CUDA launch error, and with SDTRAIN_CUDA_SYNC=1 (debugging) also waits for `stream` as
 * sd_backend_cuda_wait_stream does, so a failure shows at the call that caused it. */
void sd_backend_cuda_after_op(const sd_backend *be, void *stream);
/* Which cuDNN graph-API forward plans a CUDA backend holds for a conv shape (made on first use,
 * SDTRAIN_CUDA_CONV_API=graph or graph-rtc): bit 0 conv + bias, bit 1 conv + bias + residual;
 * 0 for the legacy API, another backend, or a build without CUDA. For tests and benchmarks. */
int sd_backend_cuda_conv_graph_plans(const sd_backend *be, const sd_conv2d_desc *d);
/* How many convolution forwards a CUDA backend has run through graph-API plans (0 otherwise):
 * tests check that the graph path did run, not only that it exists. */
int64_t sd_backend_cuda_conv_graph_runs(const sd_backend *be);
/* Builds and finalizes the cuDNN operation graph of that forward (conv + bias, + residual when
 * with_z) for `dtype` without a device, which cuDNN >= 9.8 allows: what the graph path asks of
 * cuDNN up to the choice of an engine. 0 when it finalizes; -1 with the failing call in `why`;
 * 1 (why says so) when it cannot be checked: older cuDNN, or a build without CUDA. */
int sd_cuda_conv_graph_check(const sd_conv2d_desc *d, sd_dtype dtype, int with_z, char *why,
                             size_t nwhy);
/* The same graph put to cuDNN's heuristics (mode A) for a GPU described by device_json (cuDNN's
 * JSON device description: SM count, shared memory, clocks, ...) without a device: *listed
 * engine configurations, *usable of them passing the graph path's filter (precompiled,
 * deterministic, no FFT / Winograd / reduced precision; F32 no tensor cores) with a plan that
 * finalizes for that device within ws_cap bytes of workspace. 0 (why names the first usable
 * one's engine and workspace); -1 with why; 1 when it cannot be asked (older cuDNN, no CUDA in
 * the build). */
int sd_cuda_conv_graph_engines(const sd_conv2d_desc *d, sd_dtype dtype, int with_z,
                               const char *device_json, size_t ws_cap, int *usable, int *listed,
                               char *why, size_t nwhy);

/* ---- Memory ----------------------------------------------------------------------------- */

/* Waits until every op issued on the backend has finished, and with them every sd_upload_async
 * issued before the last op (ops wait for those). Not for an sd_download_async
 * (sd_download_wait), nor for work that another library queued on a stream of its own (the NCCL
 * side stream: sd_nccl_join makes the ops wait for it first). CPU: returns at once. */
void sd_synchronize(const sd_backend *be);
/* Op profile (SDTRAIN_CUDA_PROFILE=1 on a CUDA backend; nothing otherwise): forget the timings so
 * far, e.g. after warm-up runs whose first calls include plan creation and kernel loading. */
void sd_profile_reset(const sd_backend *be);
void sd_zero(const sd_backend *be, void *dst, size_t bytes);
/* Copies within the backend's memory; the ranges must not overlap. */
void sd_copy(const sd_backend *be, void *dst, const void *src, size_t bytes);
/* Host fp32 <-> backend tensors of be->dtype (converting, rounding to nearest even). */
void sd_upload_f32(const sd_backend *be, void *dst, const float *src, int64_t n);
void sd_download_f32(const sd_backend *be, float *dst, const void *src, int64_t n);
/* Raw memory of the backend (CPU: 256-byte aligned host memory; CUDA: cudaMalloc). Returns NULL
 * when `bytes` cannot be had (the caller reports it). Not for the step loop: size an arena once. */
void *sd_backend_alloc(const sd_backend *be, size_t bytes);
void sd_backend_free(const sd_backend *be, void *ptr);
/* Byte copies host -> backend and backend -> host, no conversion (int32 ids, fp32 statistics
 * and weight gradients). Both wait until the copy is done (ordered after earlier ops). */
void sd_upload(const sd_backend *be, void *dst, const void *src, size_t bytes);
void sd_download(const sd_backend *be, void *dst, const void *src, size_t bytes);
/* Host memory that sd_upload_async copies from without staging (CUDA: page-locked, from
 * cudaMallocHost; CPU: 256-byte aligned). NULL when it cannot be had. Allocate once. */
void *sd_host_alloc(const sd_backend *be, size_t bytes);
void sd_host_free(const sd_backend *be, void *ptr);
/* Byte copy host -> backend that returns at once: on CUDA it runs on the backend's copy stream,
 * beside the ops already issued, and every op issued after it waits for it (an event), so
 * inputs of the next step travel while the current one computes. `src` must come from
 * sd_host_alloc and stay unchanged, and `dst` unused by earlier ops that have not finished,
 * until an sd_synchronize issued after a later op has returned (the copy is then done). CPU:
 * memcpy. */
void sd_upload_async(const sd_backend *be, void *dst, const void *src, size_t bytes);
/* Byte copy backend -> host that returns at once: on CUDA it runs on the copy stream once the
 * ops issued so far have finished (an event), beside the ops issued after it. `dst` must come
 * from sd_host_alloc; its bytes are there once sd_download_wait returns, which waits for every
 * copy on the copy stream (not for the compute stream). `src` must not be written by ops issued
 * after this call until sd_download_wait has returned: the copy waits only for the ops before
 * it. CPU: memcpy, and waiting is nothing. */
void sd_download_async(const sd_backend *be, void *dst, const void *src, size_t bytes);
void sd_download_wait(const sd_backend *be);

/* ---- The stream clock ------------------------------------------------------------------- */

/* How long the backend itself took for a stretch of work, where the host's clock cannot tell
 * (on a GPU the host queues the ops and goes on; its waits hide the GPU's time). */
#define SD_STREAM_MARKS 4
/* Sets mark `slot` (0 <= slot < SD_STREAM_MARKS) where the backend's work now ends. CUDA: an
 * event on the compute stream; it passes when the ops issued before it have finished, and with
 * them the waits queued before it (for an sd_upload_async, for NCCL's side stream). CPU: the
 * host's clock now (its ops are done when they return); the CPU backend is one object for the
 * whole process, and so are its marks: one thread sets them. A slot's next mark replaces it. */
void sd_stream_mark(const sd_backend *be, int slot);
/* Seconds from mark a to mark b once both have passed (after an sd_synchronize issued after
 * both); NAN when a slot has no mark yet or (CUDA) its mark has not passed. Never waits. */
double sd_stream_elapsed(const sd_backend *be, int a, int b);

/* ---- Convolution and linear ------------------------------------------------------------- */

/* y = conv(x, w) + b. b may be NULL (no bias). */
size_t sd_conv2d_forward_scratch_bytes(const sd_backend *be, const sd_conv2d_desc *d);
void sd_conv2d_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                       const void *w, const void *b, void *y, sd_scratch ws);
/* y = conv(x, w) + b + z: a residual z ([n, h_out, w_out, c_out], not aliasing y) added in the
 * same pass where the backend can (CUDA: cuDNN's epilogue), else exactly conv then sd_add(y, z).
 * Scratch: sd_conv2d_forward_scratch_bytes. */
void sd_conv2d_forward_add(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                           const void *w, const void *b, const void *z, void *y, sd_scratch ws);
/* dx (optional) = transposed conv of dy; dw += (fp32); db += sum of dy (optional). For an
 * asymmetric padding the padded row/column simply receives no gradient. */
size_t sd_conv2d_backward_scratch_bytes(const sd_backend *be, const sd_conv2d_desc *d);
void sd_conv2d_backward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                        const void *w, const void *dy, void *dx, int accumulate, float *dw,
                        float *db, sd_scratch ws);

/* y [rows, out] = x [rows, in] w[out, in]^T + b (b may be NULL). 1x1 convolutions with stride
 * 1 in NHWC are this with rows = n*h*w. */
void sd_linear_forward(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                       const void *w, const void *b, void *y);
/* y = x w^T + b + z: a residual z ([rows, out], not aliasing y) added in the GEMM's pass where
 * the backend can (CUDA: cuBLASLt's C input), else exactly sd_linear_forward then sd_add(y, z). */
void sd_linear_forward_add(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                           const void *w, const void *b, const void *z, void *y);
/* dx (optional) = dy w; dw += dy^T x; db += column sums of dy (optional). */
size_t sd_linear_backward_scratch_bytes(const sd_backend *be, int64_t rows, int in, int out);
void sd_linear_backward(const sd_backend *be, int64_t rows, int in, int out, const void *x,
                        const void *w, const void *dy, void *dx, int accumulate, float *dw,
                        float *db, sd_scratch ws);

/* ---- Normalization ---------------------------------------------------------------------- */

/* mean and rstd ([n, groups], fp32) receive the statistics backward needs; either may be NULL
 * in inference. gamma and beta may be NULL (1 and 0). */
size_t sd_group_norm_forward_scratch_bytes(const sd_backend *be, const sd_group_norm_desc *d);
void sd_group_norm_forward(const sd_backend *be, const sd_group_norm_desc *d, const void *x,
                           const void *gamma, const void *beta, void *y, float *mean,
                           float *rstd, sd_scratch ws);
/* dgamma/dbeta (fp32, accumulated) optional; beta is needed only when d->silu is set. */
size_t sd_group_norm_backward_scratch_bytes(const sd_backend *be, const sd_group_norm_desc *d);
void sd_group_norm_backward(const sd_backend *be, const sd_group_norm_desc *d, const void *x,
                            const void *gamma, const void *beta, const float *mean,
                            const float *rstd, const void *dy, void *dx, int accumulate,
                            float *dgamma, float *dbeta, sd_scratch ws);

/* Over the last axis of x [rows, c]; mean, rstd [rows] (optional); gamma, beta may be NULL. */
void sd_layer_norm_forward(const sd_backend *be, int64_t rows, int c, float eps, const void *x,
                           const void *gamma, const void *beta, void *y, float *mean,
                           float *rstd);
size_t sd_layer_norm_backward_scratch_bytes(const sd_backend *be, int64_t rows, int c);
void sd_layer_norm_backward(const sd_backend *be, int64_t rows, int c, const void *x,
                            const void *gamma, const float *mean, const float *rstd,
                            const void *dy, void *dx, int accumulate, float *dgamma,
                            float *dbeta, sd_scratch ws);

/* ---- Activations ------------------------------------------------------------------------ */

/* SiLU(x) = x * sigmoid(x). */
void sd_silu_forward(const sd_backend *be, int64_t n, const void *x, void *y);
void sd_silu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy, void *dx,
                      int accumulate);
/* Exact GELU, 0.5 x (1 + erf(x / sqrt 2)) (SD2 has no tanh approximation anywhere). */
void sd_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y);
void sd_gelu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy, void *dx,
                      int accumulate);
/* QuickGELU, x * sigmoid(1.702 x): SD1's OpenAI CLIP text encoder (hidden_act "quick_gelu");
 * SD2's OpenCLIP encoder uses the exact GELU. */
void sd_quick_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y);
void sd_quick_gelu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy,
                            void *dx, int accumulate);
/* GEGLU, diffusers' order: x [rows, 2*inner] = [value | gate], y [rows, inner] =
 * value * GELU(gate) (the gate is the SECOND half of ff.net.0.proj's output). */
void sd_geglu_forward(const sd_backend *be, int64_t rows, int inner, const void *x, void *y);
void sd_geglu_backward(const sd_backend *be, int64_t rows, int inner, const void *x,
                       const void *dy, void *dx, int accumulate);

/* ---- Attention -------------------------------------------------------------------------- */

/* o = softmax(scale q k^T) v per head. lse [batch, heads, t_q] (fp32, optional) receives
 * max + log(sum exp(s - max)) of each row, from which backward rebuilds the probabilities. */
size_t sd_attention_forward_scratch_bytes(const sd_backend *be, const sd_attention_desc *d);
void sd_attention_forward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                          const void *k, const void *v, void *o, float *lse, sd_scratch ws);
/* dq, dk, dv written or accumulated (each optional); the strides of d apply to them too. */
size_t sd_attention_backward_scratch_bytes(const sd_backend *be, const sd_attention_desc *d);
void sd_attention_backward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                           const void *k, const void *v, const void *o, const float *lse,
                           const void *dout, void *dq, void *dk, void *dv, int accumulate,
                           sd_scratch ws);

/* ---- Resampling and data movement --------------------------------------------------------- */

/* Nearest-neighbour resize of x [n, h, w, c] to [n, h_out, w_out, c] with PyTorch's rule:
 * identity when sizes match, src = dst/2 for exactly twice the size (Upsample2D), otherwise
 * src = min(floor(dst * (float)in/out), in - 1). Backward sums each output cell's gradient into
 * its source cell. */
void sd_upsample_nearest_forward(const sd_backend *be, int n, int h, int w, int c, int h_out,
                                 int w_out, const void *x, void *y);
void sd_upsample_nearest_backward(const sd_backend *be, int n, int h, int w, int c, int h_out,
                                  int w_out, const void *dy, void *dx, int accumulate);

/* y [n, d->dim] from fp32 timesteps t [n] in the backend's memory (fractional allowed). */
void sd_timestep_embedding(const sd_backend *be, int n, const sd_timestep_embedding_desc *d,
                           const float *t, void *y);

/* y [batch, t, c] = table[ids[b, t]] + pos_table[t] (pos_table [>= t, c] may be NULL).
 * ids [batch, t] are int32 in the backend's memory, each < vocab. */
void sd_embedding_forward(const sd_backend *be, int batch, int t, int c, int vocab,
                          const int32_t *ids, const void *table, const void *pos_table, void *y);

/* y = a + b, and y = (a + b) / divisor (diffusers' residual `(x + h) / output_scale_factor`).
 * y may be a or b. */
void sd_add(const sd_backend *be, int64_t n, const void *a, const void *b, void *y);
void sd_add_scaled(const sd_backend *be, int64_t n, const void *a, const void *b, float divisor,
                   void *y);
/* y = alpha x + beta y; beta = 0 ignores the old y (which may hold NaN). */
void sd_axpby(const sd_backend *be, int64_t n, float alpha, const void *x, float beta, void *y);

/* y [n, rows, c] = x + v[n, c] broadcast over rows (ResNet time conditioning: the projected
 * embedding added at every pixel). y may be x. Backward: dv (= or +=) sum over rows of dy. */
void sd_add_bcast_forward(const sd_backend *be, int n, int64_t rows, int c, const void *x,
                          const void *v, void *y);
size_t sd_add_bcast_backward_scratch_bytes(const sd_backend *be, int n, int64_t rows, int c);
void sd_add_bcast_backward(const sd_backend *be, int n, int64_t rows, int c, const void *dy,
                           void *dv, int accumulate, sd_scratch ws);

/* y [rows, c1 + c2] = [a [rows, c1] | b [rows, c2]] (U-Net skip concat: current path first).
 * split_channels is its inverse and its backward: a and b may be NULL (not wanted). */
void sd_concat_channels(const sd_backend *be, int64_t rows, int c1, int c2, const void *a,
                        const void *b, void *y);
void sd_split_channels(const sd_backend *be, int64_t rows, int c1, int c2, const void *x,
                       void *a, void *b, int accumulate);

/* Between PyTorch's [n, c, h, w] and our [n, h, w, c] (images in, latents and outputs). */
void sd_nchw_to_nhwc(const sd_backend *be, int n, int c, int h, int w, const void *x, void *y);
void sd_nhwc_to_nchw(const sd_backend *be, int n, int c, int h, int w, const void *x, void *y);

/* VAE posterior: moments [rows, 2c] = [mean | logvar]; z [rows, c] =
 * scale * (mean + exp(0.5 * clamp(logvar, -30, 20)) * eps), or scale * mean when eps is NULL
 * (the mode). eps [rows, c] are standard normals from the caller (sd_rng_fill_normal). */
void sd_diag_gaussian_sample(const sd_backend *be, int64_t rows, int c, const void *moments,
                             const void *eps, float scale, void *z);

/* y = x converted to be->dtype (rounding to nearest even), both in the backend's memory; x
 * [n] fp32 (e.g. inputs that travelled by sd_upload_async in fp32). y must not overlap x. */
void sd_cast_f32(const sd_backend *be, int64_t n, const float *x, void *y);
/* y = x converted to fp32 (exact), both in the backend's memory; the inverse of sd_cast_f32. */
void sd_cast_to_f32(const sd_backend *be, int64_t n, const void *x, float *y);

/* The diffusion objective of a batch on the backend (doc/training.md): pred [n, hw, c] (NHWC,
 * be->dtype), target [n, hw, c] fp32, coef [n] fp32, all in the backend's memory.
 *   mse[b] = mean over the sample's hw * c elements of (pred - target)^2, fp32 [n] in the
 *            backend's memory, the squares summed in double (the CPU sums them in the order of
 *            the sample's NCHW tensor, exactly as sd_diffusion_loss does on NCHW arrays);
 *   dy     = coef[b] * (2 * (pred - target)), fp32 arithmetic rounded once to be->dtype (the
 *            loss gradient when coef[b] = w_b / (global batch) / (hw * c): sd_diffusion_loss's
 *            grad, permuted to NHWC).
 * dy may be NULL (validation: only mse), and then coef may be NULL; dy may not alias pred. */
void sd_mse_loss(const sd_backend *be, int n, int64_t hw, int c, const void *pred,
                 const float *target, const float *coef, float *mse, void *dy);

/* ---- Weight layouts (host memory, any element size) ------------------------------------- */

/* PyTorch -> ours: a 4-D tensor is a conv weight [O, I, kh, kw] and becomes [O, kh, kw, I];
 * every other tensor (linear [out, in], biases, norms, embeddings) is copied unchanged.
 * `our_shape` (may be NULL) receives the resulting shape. src and dst must not overlap. */
void sd_weight_from_torch(int ndim, const int64_t *torch_shape, size_t elem_size,
                          const void *src, void *dst, int64_t *our_shape);
/* Ours -> PyTorch, for export; `torch_shape` is the shape to produce. */
void sd_weight_to_torch(int ndim, const int64_t *torch_shape, size_t elem_size, const void *src,
                        void *dst);

#ifdef __cplusplus
}
#endif
#endif
