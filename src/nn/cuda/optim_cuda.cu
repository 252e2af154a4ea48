/* AdamW, clipping, EMA and checks over flat fp32 device buffers (include/sdtrain/optim_cuda.h),
 * with the numerics of src/train/optim.c.
 *
 * Bit-identity with the CPU rests on three things:
 *   - the host scalars are computed by the same C expressions (double, rounded to float where
 *     the CPU rounds them; glibc pow on both sides);
 *   - every device float operation is an explicitly rounded intrinsic (__fmul_rn, __fadd_rn,
 *     __fsub_rn, __fdiv_rn, __fsqrt_rn), which nvcc never contracts into an FMA, and the one
 *     FMA is the CPU's own fmaf of the lerp (__fmaf_rn);
 *   - denormals are kept (nvcc's default -ftz=false; do not build these kernels with
 *     --use_fast_math or -ftz=true), as on the CPU (no FTZ/DAZ).
 * The loops are elementwise grid-stride loops with scalar loads, so any element offset (a
 * ZeRO shard starting anywhere) is fine. */
#include <cmath>

#include "sd_config.h"

#include "cuda_internal.h"
#include "sdtrain/optim_cuda.h"

#define OPTIM_THREADS 256

/* ---- AdamW ---------------------------------------------------------------------------------- */

/* The scalars of one step, as optim.c's adamw_scalars. */
typedef struct adamw_consts {
    float decay, lerp_w, bc2_sqrt, b2, one_m_b2, eps, neg_step;
    int lerp_from_m;
} adamw_consts;

static __global__ void adamw_kernel(adamw_consts c, float *p, const float *g, float *m, float *v,
                                    int64_t n, __nv_bfloat16 *p_lowp)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float gi = g[i];
        const float mo = m[i];
        const float pi = __fmul_rn(p[i], c.decay);
        const float mi = __fmaf_rn(c.lerp_w, __fsub_rn(gi, mo), c.lerp_from_m ? mo : gi);
        float vi = __fmul_rn(v[i], c.b2);
        vi = __fadd_rn(vi, __fmul_rn(__fmul_rn(c.one_m_b2, gi), gi));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
        const float pn = __fadd_rn(pi, __fdiv_rn(__fmul_rn(c.neg_step, mi), denom));
        p[i] = pn;
        m[i] = mi;
        v[i] = vi;
        if (p_lowp)
            p_lowp[i] = __float2bfloat16_rn(pn);
    }
}

extern "C" void sd_cuda_adamw_update(const sd_backend *be, const sd_adamw_hparams *h, double lr,
                                     int64_t k, float *p, const float *g, float *m, float *v,
                                     size_t n, void *p_lowp)
{
    SD_CHECK(k >= 1, "AdamW step number %lld, must be >= 1", (long long)k);
    /* Word for word the scalars of sd_adamw_update (optim.c). */
    const double bc1 = 1.0 - pow(h->beta1, (double)k);
    const double bc2 = 1.0 - pow(h->beta2, (double)k);
    const double step_size = lr / bc1;
    const float w1 = (float)(1.0 - h->beta1);
    adamw_consts c;
    c.bc2_sqrt = (float)pow(bc2, 0.5);
    c.decay = h->weight_decay != 0.0 ? (float)(1.0 - lr * h->weight_decay) : 1.0f;
    c.lerp_from_m = std::fabs(w1) < 0.5f;
    c.lerp_w = c.lerp_from_m ? w1 : w1 - 1.0f;
    c.b2 = (float)h->beta2;
    c.one_m_b2 = (float)(1.0 - h->beta2);
    c.eps = (float)h->eps;
    c.neg_step = (float)(-step_size);
    if (n == 0)
        return;
    adamw_kernel<<<sd_cuda_grid(be, (int64_t)n, OPTIM_THREADS), OPTIM_THREADS, 0,
                   sd_cuda_stream(be)>>>(c, p, g, m, v, (int64_t)n, (__nv_bfloat16 *)p_lowp);
    SD_CUDA_LAUNCHED(be);
}

/* ---- sum of squares ------------------------------------------------------------------------
 * As sd_sumsq: block b of SD_SUMSQ_BLOCK elements is summed in double in index order, then the
 * block sums in block order. One CUDA block per sumsq block stages the floats in shared memory
 * (coalesced loads) and its thread 0 adds them in order; one thread then adds the block sums.
 * Each term x*x is exact in double (24-bit significands), so the sums are the CPU's bits. The
 * in-order chains make this slower than a tree (about 2 ms for SD2's 865M parameters on an
 * H100, against about 1 ms of memory traffic), which is small beside a training step. */
#define SUMSQ_THREADS 128

static __global__ void sumsq_blocks_kernel(const float *x, int64_t n, double *block_sums)
{
    __shared__ float chunk[SD_SUMSQ_BLOCK];
    const int64_t lo = (int64_t)blockIdx.x * SD_SUMSQ_BLOCK;
    const int len = n - lo < SD_SUMSQ_BLOCK ? (int)(n - lo) : SD_SUMSQ_BLOCK;
    for (int j = threadIdx.x; j < len; j += blockDim.x)
        chunk[j] = x[lo + j];
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
#pragma unroll 8
        for (int j = 0; j < len; j++) {
            const double xj = (double)chunk[j];
            s = __dadd_rn(s, __dmul_rn(xj, xj));
        }
        block_sums[blockIdx.x] = s;
    }
}

static __global__ void sumsq_total_kernel(const double *block_sums, int64_t nb, double *total)
{
    if (blockIdx.x != 0 || threadIdx.x != 0)
        return;
    double s = 0.0;
    for (int64_t b = 0; b < nb; b++)
        s = __dadd_rn(s, block_sums[b]);
    *total = s;
}

static size_t sumsq_nblocks(size_t n)
{
    return (n + SD_SUMSQ_BLOCK - 1) / SD_SUMSQ_BLOCK;
}

extern "C" size_t sd_cuda_sumsq_scratch(size_t n)
{
    /* the total first (its own 256 bytes), then the block sums */
    return 256 + sd_cuda_align(sumsq_nblocks(n) * sizeof(double));
}

extern "C" void sd_cuda_sumsq(const sd_backend *be, const float *x, size_t n, double *out_host,
                              void *scratch)
{
    *out_host = 0.0;
    if (n == 0)
        return;
    SD_CHECK(scratch != NULL, "sd_cuda_sumsq needs %zu bytes of scratch",
             sd_cuda_sumsq_scratch(n));
    cudaStream_t s = sd_cuda_stream(be);
    const size_t nb = sumsq_nblocks(n);
    SD_CHECK(nb <= 0x7fffffffu, "sum of squares over %zu elements: too many blocks", n);
    double *total = (double *)scratch;
    double *block_sums = (double *)((char *)scratch + 256);
    sumsq_blocks_kernel<<<(unsigned)nb, SUMSQ_THREADS, 0, s>>>(x, (int64_t)n, block_sums);
    SD_CUDA_LAUNCHED(be);
    sumsq_total_kernel<<<1, 1, 0, s>>>(block_sums, (int64_t)nb, total);
    SD_CUDA_LAUNCHED(be);
    sd_cuda_wait_before_copy(sd_cuda(be), s); /* out_host may be pageable */
    SD_CUDA_CHECK(cudaMemcpyAsync(out_host, total, sizeof(double), cudaMemcpyDeviceToHost, s));
    sd_cuda_stream_wait(sd_cuda(be), s);
}

/* ---- scale, EMA, bf16 copy ------------------------------------------------------------------ */

static __global__ void scale_kernel(float *x, int64_t n, float s)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = __fmul_rn(x[i], s);
}

extern "C" void sd_cuda_scale(const sd_backend *be, float *x, size_t n, float s)
{
    if (n == 0 || s == 1.0f)
        return;
    scale_kernel<<<sd_cuda_grid(be, (int64_t)n, OPTIM_THREADS), OPTIM_THREADS, 0,
                   sd_cuda_stream(be)>>>(x, (int64_t)n, s);
    SD_CUDA_LAUNCHED(be);
}

static __global__ void ema_kernel(float *ema, const float *p, int64_t n, float omd)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float e = ema[i];
        const float step = __fmul_rn(omd, __fsub_rn(e, p[i]));
        ema[i] = __fsub_rn(e, step);
    }
}

extern "C" void sd_cuda_ema_update(const sd_backend *be, float *ema, const float *p, size_t n,
                                   double d)
{
    const float omd = (float)(1.0 - d);
    if (n == 0)
        return;
    ema_kernel<<<sd_cuda_grid(be, (int64_t)n, OPTIM_THREADS), OPTIM_THREADS, 0,
                 sd_cuda_stream(be)>>>(ema, p, (int64_t)n, omd);
    SD_CUDA_LAUNCHED(be);
}

static __global__ void f32_to_bf16_kernel(const float *src, __nv_bfloat16 *dst, int64_t n)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

extern "C" void sd_cuda_f32_to_bf16(const sd_backend *be, const float *src, void *dst, size_t n)
{
    if (n == 0)
        return;
    f32_to_bf16_kernel<<<sd_cuda_grid(be, (int64_t)n, OPTIM_THREADS), OPTIM_THREADS, 0,
                         sd_cuda_stream(be)>>>(src, (__nv_bfloat16 *)dst, (int64_t)n);
    SD_CUDA_LAUNCHED(be);
}

/* ---- non-finite check ----------------------------------------------------------------------
 * A value is NaN or ±Inf exactly when its exponent bits are all ones (a bit test, immune to any
 * fast-math setting). Blocks OR their flags; any block that saw one sets the flag, so the
 * result does not depend on scheduling. */
static __global__ void nonfinite_kernel(const float *x, int64_t n, int *flag)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int bad = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        bad |= (__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u;
    if (__syncthreads_or(bad) && threadIdx.x == 0)
        atomicOr(flag, 1);
}

extern "C" size_t sd_cuda_nonfinite_scratch(void)
{
    return 256;
}

extern "C" int sd_cuda_nonfinite(const sd_backend *be, const float *x, size_t n, void *scratch)
{
    if (n == 0)
        return 0;
    SD_CHECK(scratch != NULL, "sd_cuda_nonfinite needs %zu bytes of scratch",
             sd_cuda_nonfinite_scratch());
    cudaStream_t s = sd_cuda_stream(be);
    int *flag = (int *)scratch;
    int host = 0;
    SD_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), s));
    nonfinite_kernel<<<sd_cuda_grid(be, (int64_t)n, OPTIM_THREADS), OPTIM_THREADS, 0, s>>>(
        x, (int64_t)n, flag);
    SD_CUDA_LAUNCHED(be);
    sd_cuda_wait_before_copy(sd_cuda(be), s); /* &host is pageable */
    SD_CUDA_CHECK(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, s));
    sd_cuda_stream_wait(sd_cuda(be), s);
    return host != 0;
}
