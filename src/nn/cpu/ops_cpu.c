/* The CPU backend of the op interface: fp32, OpenMP over independent outputs, CBLAS for GEMMs. */
#include "sdtrain/ops.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <stdlib.h>

#include "sdtrain/check.h"
#include "sdtrain/timer.h"

/*
 * Threading and determinism. OpenBLAS's own threading is not thread-count independent (its
 * multi-threaded sgemm rounds differently from its single-threaded one, and differently again
 * for 2 and 3 threads), so BLAS runs single-threaded here and the parallelism is ours:
 *   - a GEMM is cut into tiles whose sizes depend on the matrix shape only; each tile is one
 *     single-threaded cblas_sgemm over the whole inner dimension, and OpenMP spreads the tiles;
 *   - attention runs one (sample, head, query block) per OpenMP task, each with its own slice
 *     of scratch, and single-threaded GEMMs inside;
 *   - every other loop writes disjoint outputs, with each sum done inside one iteration in a
 *     fixed order. Statistics (norm mean/variance, softmax denominators) accumulate in double.
 * So a result depends on the shape and the data, never on the OpenMP thread count. With
 * OpenBLAS the backend sets its thread count to 1 before each BLAS-using op (another CBLAS
 * must be single-threaded or detect OpenMP regions itself: MKL does, BLIS is by default).
 */

#define CPU_SQRT1_2 0.70710678118654752440f

/* im2col tiles: at most this many bytes of columns, and between these many output pixels. */
#define CPU_CONV_TILE_BYTES ((int64_t)32 << 20)
#define CPU_CONV_TILE_MIN_ROWS 256
#define CPU_CONV_TILE_MAX_ROWS 4096
#ifndef CPU_CONV_BLOCK_BYTES
#define CPU_CONV_BLOCK_BYTES ((int64_t)2 << 20)
#endif
#ifndef CPU_CONV_BLOCK_MIN_ROWS
#define CPU_CONV_BLOCK_MIN_ROWS 256
#endif
#ifndef CPU_CONV_BLOCK_MAX_ROWS
#define CPU_CONV_BLOCK_MAX_ROWS 1024
#endif
#define CPU_CONV_FUSED_MIN_BLOCKS 16

/* GEMM tiles: about this many rows and columns, rounded so the tiles of a matrix are even. */
#define CPU_GEMM_TILE 256
#define CPU_GEMM_TILE_ROUND 16

/* Elementwise loops: rows or elements per dynamic OpenMP task (tasks, not threads, split the
 * work, and every element is computed the same way whichever task holds it). */
#define CPU_ROWS_PER_TASK 64
#define CPU_ELEMS_PER_TASK 16384

/* Attention: query rows per task, so a task's score block is CPU_ATTN_Q_BLOCK x t_kv floats. */
#define CPU_ATTN_Q_BLOCK 256

static int blas_int(int64_t v, const char *what)
{
    SD_CHECK(v >= 0 && v <= INT_MAX, "%s = %lld exceeds the BLAS integer range", what,
             (long long)v);
    return (int)v;
}

static int cpu_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Per-thread scratch slots a scratch query asks for: the processors of the machine, not the
 * current thread count, so scratch planned once stays valid when the thread count changes
 * later (a run uses as many slots as it was given; results do not depend on it). */
static int cpu_scratch_slots(void)
{
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}

static void blas_single_threaded(void)
{
#ifdef OPENBLAS_VERSION
    if (openblas_get_num_threads() != 1)
        openblas_set_num_threads(1);
#endif
}

/* Tile edge for a dimension of size n: ceil(n / ceil(n / T)) rounded up to a multiple of R,
 * so a 320-wide matrix is two tiles of 160 rather than 256 + 64. */
static int gemm_tile(int n)
{
    int tiles = (n + CPU_GEMM_TILE - 1) / CPU_GEMM_TILE;
    int t = (n + tiles - 1) / tiles;
    t = (t + CPU_GEMM_TILE_ROUND - 1) / CPU_GEMM_TILE_ROUND * CPU_GEMM_TILE_ROUND;
    return t < n ? t : n;
}

/* C[m, n] = alpha A[m, k] op(B) + beta C (row-major, leading dimensions lda, ldb, ldc), op(B)
 * = B^T for B [n, k] when trans_b, else B [k, n]. Tiles of C in parallel, see the top. */
static void cpu_gemm(int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc)
{
    const int tm = gemm_tile(m), tn = gemm_tile(n);
    const int mt = (m + tm - 1) / tm, nt = (n + tn - 1) / tn;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
#pragma omp parallel for schedule(dynamic) if (mt * nt > 1)
    for (int t = 0; t < mt * nt; t++) {
        int i0 = (t / nt) * tm, j0 = (t % nt) * tn;
        int mm = m - i0 < tm ? m - i0 : tm, nn = n - j0 < tn ? n - j0 : tn;
        const float *bt = trans_b ? b + (int64_t)j0 * ldb : b + j0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, tb, mm, nn, k, alpha, a + (int64_t)i0 * lda, lda,
                    bt, ldb, beta, c + (int64_t)i0 * ldc + j0, ldc);
    }
}

/* ---- vector helpers and a vectorisable exp ---------------------------------------------- */

/* GCC/Clang vector extensions: 4 floats, one SSE register at the baseline x86-64 ISA (wider
 * generic vectors get their compares and selects scalarised there). Every lane does the same IEEE operations as the scalar versions
 * below, so an element's result never depends on whether it was in a vector or in a tail, on
 * its position, or on the thread that computed it. No FMA contraction (-std=c11). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* 4 doubles between inlined static functions only */
#endif
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) v4f v4f_load(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void v4f_store(float *p, v4f v)
{
    memcpy(p, &v, sizeof v);
}

static inline __attribute__((always_inline)) v4d v4d_from_floats(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, v4d);
}

static inline __attribute__((always_inline)) v4f v4f_select(v4i mask, v4f a, v4f b) /* mask ? a : b, lane by lane */
{
    return (v4f)(((v4i)a & mask) | ((v4i)b & ~mask));
}

/* exp(x) for float, Cephes' expf: n = round(x log2 e), r = x - n ln 2 (in two parts, the first
 * exact), exp(r) by a degree-7 polynomial on [-ln2/2, ln2/2], times 2^n built in the exponent
 * bits (as 2 * 2^(n-1), so n = 128 works). Within 2 ulp of expf; 0 below -86.5 (true value
 * < 2.7e-38), +inf above ln(FLT_MAX), NaN for NaN. */
#define EXP_LO (-86.5f)
#define EXP_HI 88.72283935546875f
#define EXP_LOG2E 1.44269504088896341f
#define EXP_ROUND 12582912.0f /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
#define EXP_C1 0.693359375f
#define EXP_C2 (-2.12194440e-4f)
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f

static inline __attribute__((always_inline)) float exp_s(float x)
{
    float xc = x < EXP_LO ? EXP_LO : (x > EXP_HI ? EXP_HI : x);
    float n = (xc * EXP_LOG2E + EXP_ROUND) - EXP_ROUND;
    float r = xc - n * EXP_C1;
    r = r - n * EXP_C2;
    float p = EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    float y = p * (r * r) + r + 1.0f;
    int32_t bits = ((int32_t)n + 126) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float res = (y + y) * scale;
    res = x < EXP_LO ? 0.0f : res;
    res = x > EXP_HI ? INFINITY : res;
    return x != x ? x : res;
}

static inline __attribute__((always_inline)) v4f exp_v4(v4f x)
{
    const v4f zero = {0};
    v4f xc = v4f_select(x < EXP_LO, zero + EXP_LO, x);
    xc = v4f_select(xc > EXP_HI, zero + EXP_HI, xc);
    v4f n = (xc * EXP_LOG2E + EXP_ROUND) - EXP_ROUND;
    v4f r = xc - n * EXP_C1;
    r = r - n * EXP_C2;
    v4f p = zero + EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    v4f y = p * (r * r) + r + 1.0f;
    v4f scale = (v4f)((__builtin_convertvector(n, v4i) + 126) << 23);
    v4f res = (y + y) * scale;
    res = v4f_select(x < EXP_LO, zero, res);
    res = v4f_select(x > EXP_HI, zero + INFINITY, res);
    return v4f_select(x != x, x, res);
}

static inline __attribute__((always_inline)) float silu_f(float v)
{
    return v / (1.0f + exp_s(-v));
}

static inline __attribute__((always_inline)) v4f silu_v4(v4f v)
{
    return v / (1.0f + exp_v4(-v));
}

/* y[i] = silu(x[i]) for i in [0, n), vectors then a scalar tail */
static void silu_span(int64_t n, const float *x, float *y)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        v4f_store(y + i, silu_v4(v4f_load(x + i)));
    for (; i < n; i++)
        y[i] = silu_f(x[i]);
}

/* erf(x) for float, our fit (same operations in erf_s and erf_v4, so an element's result does
 * not depend on the lane it is in): |x| <= 1: x P(x^2), P of degree 6 fitted to erf(x)/x
 * (relative error 1.7e-7); 1 < |x| < 4: 1 - exp(-x^2) R(1/x), R of degree 10 fitted to
 * erfc(x) exp(x^2); beyond: +-1 (erfc(4) = 1.5e-8 is below half an ulp of 1). Within 1.4e-7
 * of erf everywhere (libm's erff: 1 ulp), NaN for NaN. */
#define ERF_A0 1.128379107e+00f
#define ERF_A1 (-3.761262894e-01f)
#define ERF_A2 1.128362194e-01f
#define ERF_A3 (-2.685550973e-02f)
#define ERF_A4 5.191835109e-03f
#define ERF_A5 (-8.043394773e-04f)
#define ERF_A6 7.971125888e-05f
#define ERF_B0 2.414324808e-05f
#define ERF_B1 5.637617111e-01f
#define ERF_B2 2.587178256e-03f
#define ERF_B3 (-2.827252746e-01f)
#define ERF_B4 (-7.821245492e-02f)
#define ERF_B5 9.210093617e-01f
#define ERF_B6 (-1.558856130e+00f)
#define ERF_B7 1.461412191e+00f
#define ERF_B8 (-8.362318277e-01f)
#define ERF_B9 2.747865319e-01f
#define ERF_B10 (-3.997189179e-02f)

static inline __attribute__((always_inline)) float erf_small(float x, float x2)
{
    float p = ERF_A6;
    p = p * x2 + ERF_A5;
    p = p * x2 + ERF_A4;
    p = p * x2 + ERF_A3;
    p = p * x2 + ERF_A2;
    p = p * x2 + ERF_A1;
    p = p * x2 + ERF_A0;
    return x * p;
}

static inline __attribute__((always_inline)) float erf_large(float a, float x2)
{
    float u = 1.0f / a;
    float r = ERF_B10;
    r = r * u + ERF_B9;
    r = r * u + ERF_B8;
    r = r * u + ERF_B7;
    r = r * u + ERF_B6;
    r = r * u + ERF_B5;
    r = r * u + ERF_B4;
    r = r * u + ERF_B3;
    r = r * u + ERF_B2;
    r = r * u + ERF_B1;
    r = r * u + ERF_B0;
    return 1.0f - exp_s(-x2) * r;
}

static inline __attribute__((always_inline)) float erf_s(float x)
{
    const float a = fabsf(x), x2 = x * x;
    if (x != x)
        return x;
    if (a <= 1.0f)
        return erf_small(x, x2);
    if (a < 4.0f) {
        float r = erf_large(a, x2);
        return x > 0.0f ? r : -r;
    }
    return x > 0.0f ? 1.0f : -1.0f;
}

static inline __attribute__((always_inline)) v4f erf_v4(v4f x)
{
    const v4f zero = {0};
    const v4f a = v4f_select(x < 0.0f, -x, x), x2 = x * x;
    v4f p = zero + ERF_A6;
    p = p * x2 + ERF_A5;
    p = p * x2 + ERF_A4;
    p = p * x2 + ERF_A3;
    p = p * x2 + ERF_A2;
    p = p * x2 + ERF_A1;
    p = p * x2 + ERF_A0;
    const v4f small = x * p;
    /* the large branch on a clamped to [1, 4) so no lane divides by zero */
    const v4f ac = v4f_select(a < 1.0f, zero + 1.0f, v4f_select(a < 4.0f, a, zero + 1.0f));
    const v4f u = 1.0f / ac;
    v4f r = zero + ERF_B10;
    r = r * u + ERF_B9;
    r = r * u + ERF_B8;
    r = r * u + ERF_B7;
    r = r * u + ERF_B6;
    r = r * u + ERF_B5;
    r = r * u + ERF_B4;
    r = r * u + ERF_B3;
    r = r * u + ERF_B2;
    r = r * u + ERF_B1;
    r = r * u + ERF_B0;
    v4f large = 1.0f - exp_v4(-x2) * r;
    large = v4f_select(x > 0.0f, large, -large);
    const v4f sat = v4f_select(x > 0.0f, zero + 1.0f, zero - 1.0f);
    v4f res = v4f_select(a <= 1.0f, small, v4f_select(a < 4.0f, large, sat));
    return v4f_select(x != x, x, res);
}

/* Exact GELU, 0.5 v (1 + erf(v / sqrt 2)), and its derivative
 * 0.5 (1 + erf(v / sqrt 2)) + v exp(-v^2 / 2) / sqrt(2 pi): scalar and 4-lane, same operations. */
static inline __attribute__((always_inline)) float gelu_f(float v)
{
    return v * 0.5f * (1.0f + erf_s(v * CPU_SQRT1_2));
}

static inline __attribute__((always_inline)) v4f gelu_v4(v4f v)
{
    return v * 0.5f * (1.0f + erf_v4(v * CPU_SQRT1_2));
}

/* y[r, :] += b for every row (bias after the GEMM: y = (sum) + b, one rounding). */
static void add_row_bias(int64_t rows, int c, const float *b, float *y)
{
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * c;
        for (int j = 0; j < c; j++)
            yr[j] += b[j];
    }
}

/* ---- memory ------------------------------------------------------------------------------- */

static void cpu_synchronize(const sd_backend *be)
{
    (void)be;
}

/* The stream clock: the ops are done when they return, so a mark is the host's clock (one set
 * for the process, as the backend object is; NAN until set). */
static double cpu_marks[SD_STREAM_MARKS] = {NAN, NAN, NAN, NAN};
_Static_assert(SD_STREAM_MARKS == 4, "one NAN for each stream mark");

static void cpu_stream_mark(const sd_backend *be, int slot)
{
    (void)be;
    cpu_marks[slot] = sd_time_now();
}

static double cpu_stream_elapsed(const sd_backend *be, int a, int b)
{
    (void)be;
    return cpu_marks[b] - cpu_marks[a];
}

static void cpu_zero(const sd_backend *be, void *dst, size_t bytes)
{
    if (bytes)
        memset(dst, 0, bytes);
}

static void cpu_copy(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(dst, src, bytes);
}

static void cpu_upload_f32(const sd_backend *be, void *dst, const float *src, int64_t n)
{
    if (n)
        memcpy(dst, src, (size_t)n * sizeof(float));
}

static void cpu_download_f32(const sd_backend *be, float *dst, const void *src, int64_t n)
{
    if (n)
        memcpy(dst, src, (size_t)n * sizeof(float));
}

static void *cpu_alloc(const sd_backend *be, size_t bytes)
{
    (void)be;
    size_t rounded = (bytes + 255) / 256 * 256;
    return aligned_alloc(256, rounded ? rounded : 256);
}

static void cpu_release(const sd_backend *be, void *ptr)
{
    (void)be;
    free(ptr);
}

static void cpu_bytes(const sd_backend *be, void *dst, const void *src, size_t bytes)
{
    (void)be;
    memcpy(dst, src, bytes);
}

static void cpu_cast_f32(const sd_backend *be, int64_t n, const float *x, void *y)
{
    (void)be;
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void cpu_cast_to_f32(const sd_backend *be, int64_t n, const void *x, float *y)
{
    (void)be;
    memcpy(y, x, (size_t)n * sizeof(float));
}

/* sd_diffusion_loss's arithmetic on NHWC samples: the squares in double, in the order of the
 * NCHW tensor (channel after channel), so the mean is the same bits. */
static void cpu_mse_loss(const sd_backend *be, int n, int64_t hw, int c, const void *pv,
                         const float *target, const float *coef, float *mse, void *dv)
{
    const float *pred = pv;
    float *dy = dv;
    const int64_t per = hw * c;
    (void)be;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < n; b++) {
        const float *p = pred + (size_t)b * per, *t = target + (size_t)b * per;
        double sum = 0.0;
        for (int ch = 0; ch < c; ch++)
            for (int64_t i = 0; i < hw; i++) {
                double e = (double)p[i * c + ch] - (double)t[i * c + ch];
                sum += e * e;
            }
        mse[b] = (float)(sum / (double)per);
        if (dy) {
            const float g = coef[b];
            float *d = dy + (size_t)b * per;
            for (int64_t i = 0; i < per; i++) {
                float diff = p[i] - t[i];
                float two = 2.0f * diff;
                d[i] = two * g;
            }
        }
    }
}

/* ---- conv2d ------------------------------------------------------------------------------- */

static int conv_is_pointwise(const sd_conv2d_desc *d)
{
    return d->kh == 1 && d->kw == 1 && d->stride == 1 && d->pad_top == 0 && d->pad_bottom == 0 &&
           d->pad_left == 0 && d->pad_right == 0;
}

static int64_t conv_tile_rows(const sd_conv2d_desc *d)
{
    int64_t k = (int64_t)d->kh * d->kw * d->c_in;
    int64_t pixels = (int64_t)d->n * d->h_out * d->w_out;
    int64_t rows = CPU_CONV_TILE_BYTES / (k * (int64_t)sizeof(float));
    if (rows < CPU_CONV_TILE_MIN_ROWS)
        rows = CPU_CONV_TILE_MIN_ROWS;
    if (rows > CPU_CONV_TILE_MAX_ROWS)
        rows = CPU_CONV_TILE_MAX_ROWS;
    return rows < pixels ? rows : pixels;
}

/* Fused path: when the output has many pixels, each task is a block of conv_block_rows output
 * pixels, gathered into its thread's own im2col slot (small enough to stay in cache) and
 * multiplied by the whole weight in one cblas_sgemm. Block sizes depend on the shape only. */
static int64_t conv_block_rows(const sd_conv2d_desc *d)
{
    int64_t k = (int64_t)d->kh * d->kw * d->c_in;
    int64_t rows = CPU_CONV_BLOCK_BYTES / (k * (int64_t)sizeof(float));
    rows = rows / 64 * 64;
    if (rows < CPU_CONV_BLOCK_MIN_ROWS)
        rows = CPU_CONV_BLOCK_MIN_ROWS;
    if (rows > CPU_CONV_BLOCK_MAX_ROWS)
        rows = CPU_CONV_BLOCK_MAX_ROWS;
    return rows;
}

static int64_t conv_blocks(const sd_conv2d_desc *d)
{
    int64_t pixels = (int64_t)d->n * d->h_out * d->w_out, r = conv_block_rows(d);
    return (pixels + r - 1) / r;
}

static int conv_is_fused(const sd_conv2d_desc *d)
{
    return conv_blocks(d) >= CPU_CONV_FUSED_MIN_BLOCKS;
}

static size_t conv_block_bytes(const sd_conv2d_desc *d)
{
    return (size_t)conv_block_rows(d) * (size_t)d->kh * d->kw * d->c_in * sizeof(float);
}

static size_t cpu_conv2d_forward_scratch(const sd_backend *be, const sd_conv2d_desc *d)
{
    if (conv_is_pointwise(d))
        return 0;
    if (conv_is_fused(d)) {
        int64_t slots = cpu_scratch_slots();
        if (slots > conv_blocks(d))
            slots = conv_blocks(d);
        return (size_t)slots * conv_block_bytes(d);
    }
    return (size_t)conv_tile_rows(d) * (size_t)d->kh * d->kw * d->c_in * sizeof(float);
}

/* Rows [p0, p0 + m) of the im2col matrix: row p holds, for output pixel p, the kh*kw input
 * pixels it sees (c_in contiguous channels each, zeros for padding) in (u, v) order, which is
 * the order of a weight row [kh, kw, c_in]. */
static void conv_im2col(const sd_conv2d_desc *d, const float *x, int64_t p0, int64_t m,
                        float *col, int parallel)
{
    const int64_t k = (int64_t)d->kh * d->kw * d->c_in;
    const int64_t plane = (int64_t)d->h_out * d->w_out;
    const size_t cin_bytes = (size_t)d->c_in * sizeof(float);
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t r = 0; r < m; r++) {
        int64_t p = p0 + r;
        int64_t b = p / plane;
        int oy = (int)((p % plane) / d->w_out);
        int ox = (int)((p % plane) % d->w_out);
        float *row = col + r * k;
        for (int u = 0; u < d->kh; u++) {
            int iy = oy * d->stride - d->pad_top + u;
            for (int v = 0; v < d->kw; v++) {
                int ix = ox * d->stride - d->pad_left + v;
                float *dst = row + ((int64_t)u * d->kw + v) * d->c_in;
                if (iy < 0 || iy >= d->h || ix < 0 || ix >= d->w)
                    memset(dst, 0, cin_bytes);
                else
                    memcpy(dst, x + ((b * d->h + iy) * d->w + ix) * d->c_in, cin_bytes);
            }
        }
    }
}

static void cpu_conv2d_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *xv,
                               const void *wv, const void *bv, void *yv, sd_scratch ws)
{
    const float *x = xv, *w = wv, *b = bv;
    float *y = yv;
    const int64_t pixels = (int64_t)d->n * d->h_out * d->w_out;
    const int k = blas_int((int64_t)d->kh * d->kw * d->c_in, "conv2d kh*kw*c_in");

    blas_single_threaded();
    if (conv_is_pointwise(d)) {
        /* A 1x1 stride-1 convolution in NHWC is a GEMM on the input as it lies. */
        cpu_gemm(1, blas_int(pixels, "conv2d pixels"), d->c_out, k, 1.0f, x, k, w, k, 0.0f, y,
                 d->c_out);
    } else if (conv_is_fused(d)) {
        const int64_t rows = conv_block_rows(d), blocks = conv_blocks(d);
        const size_t slot = conv_block_bytes(d);
        int64_t slots = (int64_t)(ws.bytes / slot);
        if (slots > cpu_max_threads())
            slots = cpu_max_threads();
        if (slots > blocks)
            slots = blocks;
        SD_CHECK(slots >= 1, "conv2d scratch of %zu bytes holds no im2col block of %zu",
                 ws.bytes, slot);
#pragma omp parallel num_threads((int)slots)
        {
            int tid = 0;
#ifdef _OPENMP
            tid = omp_get_thread_num();
#endif
            float *col = (float *)((char *)ws.ptr + (size_t)tid * slot);
#pragma omp for schedule(dynamic)
            for (int64_t blk = 0; blk < blocks; blk++) {
                int64_t p0 = blk * rows;
                int64_t m = pixels - p0 < rows ? pixels - p0 : rows;
                conv_im2col(d, x, p0, m, col, 0);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, d->c_out, k, 1.0f,
                            col, k, w, k, 0.0f, y + p0 * d->c_out, d->c_out);
            }
        }
    } else {
        const int64_t tile = conv_tile_rows(d);
        float *col = ws.ptr;
        for (int64_t p0 = 0; p0 < pixels; p0 += tile) {
            int64_t m = pixels - p0 < tile ? pixels - p0 : tile;
            conv_im2col(d, x, p0, m, col, 1);
            cpu_gemm(1, (int)m, d->c_out, k, 1.0f, col, k, w, k, 0.0f, y + p0 * d->c_out,
                     d->c_out);
        }
    }
    if (b)
        add_row_bias(pixels, d->c_out, b, y);
}

/* ---- linear ------------------------------------------------------------------------------- */

static void cpu_linear_forward(const sd_backend *be, int64_t rows, int in, int out,
                               const void *xv, const void *wv, const void *bv, void *yv)
{
    const float *x = xv, *w = wv, *b = bv;
    float *y = yv;
    blas_single_threaded();
    cpu_gemm(1, blas_int(rows, "linear rows"), out, in, 1.0f, x, in, w, in, 0.0f, y, out);
    if (b)
        add_row_bias(rows, out, b, y);
}

/* ---- normalization ------------------------------------------------------------------------ */

/* Group norm statistics are gathered in one pass in row order: the pixels of a sample are cut
 * into chunks (their number depends on hw only), and each (sample, chunk) task sums, per
 * channel and in double, d = x - K and d^2, K being the channel's value at the sample's first
 * pixel (a shift, so the variance does not cancel). A (sample, group) task then adds the chunk
 * sums in chunk order and merges its channels with Chan's formula. Fixed chunks, fixed orders:
 * the result does not depend on the thread count. */
#define CPU_GN_CHUNK_MIN 256 /* pixels */
#define CPU_GN_MAX_CHUNKS 64

static int64_t gn_chunks(int64_t hw)
{
    int64_t k = hw / CPU_GN_CHUNK_MIN;
    if (k < 1)
        k = 1;
    return k < CPU_GN_MAX_CHUNKS ? k : CPU_GN_MAX_CHUNKS;
}

static size_t gn_align(size_t b)
{
    return (b + 63) & ~(size_t)63;
}

static size_t cpu_group_norm_forward_scratch(const sd_backend *be, const sd_group_norm_desc *d)
{
    /* chunk sums (2 c doubles per sample and chunk), per-channel mean and rstd (2 c floats per
     * sample), room for the statistics when the caller does not keep them, and alignment */
    return 64 + gn_align(2 * (size_t)d->n * gn_chunks(d->hw) * d->c * sizeof(double)) +
           gn_align(2 * (size_t)d->n * d->c * sizeof(float)) +
           2 * (size_t)d->n * d->groups * sizeof(float);
}

/* y[0, c) = silu?((x - m) * s * gamma + beta), per-channel m and s */
static inline void gn_row(int c, const float *xr, const float *m, const float *s,
                          const float *gamma, const float *beta, int silu, float *yr)
{
    int j = 0;
    for (; j + 4 <= c; j += 4) {
        v4f v = (v4f_load(xr + j) - v4f_load(m + j)) * v4f_load(s + j);
        if (gamma)
            v = v * v4f_load(gamma + j);
        if (beta)
            v = v + v4f_load(beta + j);
        v4f_store(yr + j, silu ? silu_v4(v) : v);
    }
    for (; j < c; j++) {
        float v = (xr[j] - m[j]) * s[j];
        if (gamma)
            v = v * gamma[j];
        if (beta)
            v = v + beta[j];
        yr[j] = silu ? silu_f(v) : v;
    }
}

static void cpu_group_norm_forward(const sd_backend *be, const sd_group_norm_desc *d,
                                   const void *xv, const void *gv, const void *bv, void *yv,
                                   float *mean, float *rstd, sd_scratch ws)
{
    const float *x = xv, *gamma = gv, *beta = bv;
    float *y = yv;
    const int groups = d->groups, c = d->c, cpg = d->c / d->groups, n = d->n;
    const int64_t hw = d->hw, nch = gn_chunks(hw), clen = (hw + nch - 1) / nch;
    char *base = (char *)(((uintptr_t)ws.ptr + 63) & ~(uintptr_t)63);
    double *part = (double *)base;
    base += gn_align(2 * (size_t)n * nch * c * sizeof(double));
    float *mch = (float *)base, *sch = mch + (size_t)n * c;
    base += gn_align(2 * (size_t)n * c * sizeof(float));
    float *mu = mean ? mean : (float *)base;
    float *rs = rstd ? rstd : (float *)base + (size_t)n * groups;

#pragma omp parallel for schedule(dynamic)
    for (int64_t task = 0; task < n * nch; task++) {
        const int64_t b = task / nch, k = task % nch;
        const int64_t p0 = k * clen, p1 = p0 + clen < hw ? p0 + clen : hw;
        const float *x0 = x + b * hw * c;
        double *s1 = part + task * 2 * c, *s2 = s1 + c;
        for (int j = 0; j < c; j++)
            s1[j] = s2[j] = 0.0;
        for (int64_t p = p0; p < p1; p++) {
            const float *xr = x0 + p * c;
            int j = 0;
            for (; j + 4 <= c; j += 4) {
                v4d e = v4d_from_floats(xr + j) - v4d_from_floats(x0 + j), a1, a2;
                memcpy(&a1, s1 + j, sizeof a1);
                memcpy(&a2, s2 + j, sizeof a2);
                a1 = a1 + e;
                a2 = a2 + e * e;
                memcpy(s1 + j, &a1, sizeof a1);
                memcpy(s2 + j, &a2, sizeof a2);
            }
            for (; j < c; j++) {
                double e = (double)xr[j] - (double)x0[j];
                s1[j] += e;
                s2[j] += e * e;
            }
        }
    }

#pragma omp parallel for schedule(dynamic)
    for (int task = 0; task < n * groups; task++) {
        const int b = task / groups, g = task % groups;
        const float *x0 = x + (int64_t)b * hw * c;
        const double cnt = (double)hw;
        double mj[cpg > 0 ? cpg : 1], m2j[cpg > 0 ? cpg : 1], msum = 0.0;
        for (int jj = 0; jj < cpg; jj++) {
            const int j = g * cpg + jj;
            double t1 = 0.0, t2 = 0.0;
            for (int64_t k = 0; k < nch; k++) {
                const double *s1 = part + ((int64_t)b * nch + k) * 2 * c;
                t1 += s1[j];
                t2 += s1[c + j];
            }
            double m2 = t2 - t1 * (t1 / cnt);
            mj[jj] = (double)x0[j] + t1 / cnt;
            m2j[jj] = m2 > 0.0 ? m2 : 0.0;
            msum += mj[jj];
        }
        const double m = msum / cpg;
        double m2 = 0.0;
        for (int jj = 0; jj < cpg; jj++) {
            double dm = mj[jj] - m;
            m2 += m2j[jj] + cnt * dm * dm;
        }
        const float mf = (float)m, rf = (float)(1.0 / sqrt(m2 / (cnt * cpg) + (double)d->eps));
        mu[task] = mf;
        rs[task] = rf;
        for (int jj = 0; jj < cpg; jj++) {
            mch[(int64_t)b * c + g * cpg + jj] = mf;
            sch[(int64_t)b * c + g * cpg + jj] = rf;
        }
    }

    const int64_t rows = (int64_t)n * hw;
#pragma omp parallel for schedule(dynamic)
    for (int64_t r0 = 0; r0 < rows; r0 += CPU_ROWS_PER_TASK) {
        const int64_t r1 = r0 + CPU_ROWS_PER_TASK < rows ? r0 + CPU_ROWS_PER_TASK : rows;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t b = r / hw;
            gn_row(c, x + r * c, mch + b * c, sch + b * c, gamma, beta, d->silu, y + r * c);
        }
    }
}

static void cpu_layer_norm_forward(const sd_backend *be, int64_t rows, int c, float eps,
                                   const void *xv, const void *gv, const void *bv, void *yv,
                                   float *mean, float *rstd)
{
    const float *x = xv, *gamma = gv, *beta = bv;
    float *y = yv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * c;
        float *yr = y + r * c;
        double s = 0.0;
        for (int j = 0; j < c; j++)
            s += xr[j];
        double md = s / c;
        double v = 0.0;
        for (int j = 0; j < c; j++) {
            double e = xr[j] - md;
            v += e * e;
        }
        float m = (float)md, rs = (float)(1.0 / sqrt(v / c + (double)eps));
        if (mean)
            mean[r] = m;
        if (rstd)
            rstd[r] = rs;
        for (int j = 0; j < c; j++) {
            float o = (xr[j] - m) * rs;
            if (gamma)
                o = o * gamma[j];
            if (beta)
                o = o + beta[j];
            yr[j] = o;
        }
    }
}

/* ---- activations -------------------------------------------------------------------------- */

static void cpu_silu_forward(const sd_backend *be, int64_t n, const void *xv, void *yv)
{
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for schedule(dynamic)
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ELEMS_PER_TASK)
        silu_span(n - i0 < CPU_ELEMS_PER_TASK ? n - i0 : CPU_ELEMS_PER_TASK, x + i0, y + i0);
}

static void cpu_gelu_forward(const sd_backend *be, int64_t n, const void *xv, void *yv)
{
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for schedule(dynamic)
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ELEMS_PER_TASK) {
        const int64_t end = n - i0 < CPU_ELEMS_PER_TASK ? n : i0 + CPU_ELEMS_PER_TASK;
        int64_t i = i0;
        for (; i + 4 <= end; i += 4)
            v4f_store(y + i, gelu_v4(v4f_load(x + i)));
        for (; i < end; i++)
            y[i] = gelu_f(x[i]);
    }
}

/* transformers' QuickGELUActivation: input * sigmoid(1.702 * input), the sigmoid evaluated
 * as 1 / (1 + exp(-z)) like PyTorch's CPU kernel. */
static void cpu_quick_gelu_forward(const sd_backend *be, int64_t n, const void *xv, void *yv)
{
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * (1.0f / (1.0f + expf(-(1.702f * x[i]))));
}

static void cpu_geglu_forward(const sd_backend *be, int64_t rows, int inner, const void *xv,
                              void *yv)
{
    const float *x = xv;
    float *y = yv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *value = x + r * 2 * inner, *gate = value + inner;
        float *yr = y + r * inner;
        int j = 0;
        for (; j + 4 <= inner; j += 4)
            v4f_store(yr + j, v4f_load(value + j) * gelu_v4(v4f_load(gate + j)));
        for (; j < inner; j++)
            yr[j] = value[j] * gelu_f(gate[j]);
    }
}

/* ---- attention ---------------------------------------------------------------------------- */

static int attn_q_block(const sd_attention_desc *d)
{
    return d->t_q < CPU_ATTN_Q_BLOCK ? d->t_q : CPU_ATTN_Q_BLOCK;
}

static size_t attn_slot_bytes(const sd_attention_desc *d)
{
    return (size_t)attn_q_block(d) * (size_t)d->t_kv * sizeof(float);
}

static int64_t attn_tasks(const sd_attention_desc *d)
{
    int qb = attn_q_block(d);
    return (int64_t)d->batch * d->heads * ((d->t_q + qb - 1) / qb);
}

/* One score block per thread that can work at once; a smaller scratch means fewer threads,
 * never a different result. */
static size_t cpu_attention_forward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    int64_t slots = cpu_scratch_slots();
    if (slots > attn_tasks(d))
        slots = attn_tasks(d);
    return (size_t)slots * attn_slot_bytes(d);
}

/* Task (b, h, query block): S = scale Q K^T, a softmax per row, O = P V. A causal block only
 * looks at the keys its last row can see. */
/* row[j] = exp(row[j] - max) for j < n, returns the sum of those (and *max). Max, exp and sum
 * are vectorised; the sum keeps 8 double lanes (element j in lane j % 8) added in a fixed
 * order, so it depends on the row only. The AVX2 twin below does the same IEEE operations on
 * 8 floats at a time (no FMA), so both give the same bits. */
static double softmax_exp_row_base(float *row, int n, float *max)
{
    int j = 0;
    float mx = row[0];
    if (n >= 4) {
        v4f vm = v4f_load(row);
        for (j = 4; j + 4 <= n; j += 4) {
            v4f r = v4f_load(row + j);
            vm = v4f_select(r > vm, r, vm);
        }
        for (int l = 0; l < 4; l++)
            mx = vm[l] > mx ? vm[l] : mx;
    } else {
        j = 1;
    }
    for (; j < n; j++)
        mx = row[j] > mx ? row[j] : mx;
    v4d lo = {0}, hi = {0};
    double lanes[8];
    j = 0;
    for (; j + 8 <= n; j += 8) {
        v4f e0 = exp_v4(v4f_load(row + j) - mx), e1 = exp_v4(v4f_load(row + j + 4) - mx);
        v4f_store(row + j, e0);
        v4f_store(row + j + 4, e1);
        lo = lo + __builtin_convertvector(e0, v4d);
        hi = hi + __builtin_convertvector(e1, v4d);
    }
    for (int l = 0; l < 4; l++) {
        lanes[l] = lo[l];
        lanes[4 + l] = hi[l];
    }
    for (int l = 0; j < n; j++, l++) {
        float e = exp_s(row[j] - mx);
        row[j] = e;
        lanes[l] += e;
    }
    *max = mx;
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
           ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SD_HAVE_AVX2_TWIN 1
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

__attribute__((target("avx2"))) static inline v8f v8f_select(v8i mask, v8f a, v8f b)
{
    return (v8f)(((v8i)a & mask) | ((v8i)b & ~mask));
}

/* exp_v4 on 8 lanes: the same operations in the same order */
__attribute__((target("avx2"))) static inline v8f exp_v8(v8f x)
{
    const v8f zero = {0};
    v8f xc = v8f_select(x < EXP_LO, zero + EXP_LO, x);
    xc = v8f_select(xc > EXP_HI, zero + EXP_HI, xc);
    v8f n = (xc * EXP_LOG2E + EXP_ROUND) - EXP_ROUND;
    v8f r = xc - n * EXP_C1;
    r = r - n * EXP_C2;
    v8f p = zero + EXP_P0;
    p = p * r + EXP_P1;
    p = p * r + EXP_P2;
    p = p * r + EXP_P3;
    p = p * r + EXP_P4;
    p = p * r + EXP_P5;
    v8f y = p * (r * r) + r + 1.0f;
    v8f scale = (v8f)((__builtin_convertvector(n, v8i) + 126) << 23);
    v8f res = (y + y) * scale;
    res = v8f_select(x < EXP_LO, zero, res);
    res = v8f_select(x > EXP_HI, zero + INFINITY, res);
    return v8f_select(x != x, x, res);
}

__attribute__((target("avx2"))) static double softmax_exp_row_avx2(float *row, int n, float *max)
{
    int j = 0;
    float mx = row[0];
    for (j = 1; j < n; j++) /* the maximum is exact in any order */
        mx = row[j] > mx ? row[j] : mx;
    v4d lo = {0}, hi = {0};
    double lanes[8];
    j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x, e;
        v4f e0, e1;
        memcpy(&x, row + j, sizeof x);
        e = exp_v8(x - mx);
        memcpy(row + j, &e, sizeof e);
        memcpy(&e0, &e, sizeof e0);
        memcpy(&e1, (const char *)&e + sizeof e0, sizeof e1);
        lo = lo + __builtin_convertvector(e0, v4d);
        hi = hi + __builtin_convertvector(e1, v4d);
    }
    for (int l = 0; l < 4; l++) {
        lanes[l] = lo[l];
        lanes[4 + l] = hi[l];
    }
    for (int l = 0; j < n; j++, l++) {
        float e = exp_s(row[j] - mx);
        row[j] = e;
        lanes[l] += e;
    }
    *max = mx;
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
           ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
}
#endif

/* row[j] = exp(row[j] - shift) for j < n (the attention backward's probabilities from the
 * log-sum-exp): element by element the same operations as exp_s, so any width gives the same
 * bits. */
#ifdef SD_HAVE_AVX2_TWIN
__attribute__((target("avx2"))) static void exp_shift_row_avx2(float *row, int n, float shift)
{
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x;
        memcpy(&x, row + j, sizeof x);
        x = exp_v8(x - shift);
        memcpy(row + j, &x, sizeof x);
    }
    for (; j < n; j++)
        row[j] = exp_s(row[j] - shift);
}
#endif

static void exp_shift_row_base(float *row, int n, float shift)
{
    int j = 0;
    for (; j + 4 <= n; j += 4)
        v4f_store(row + j, exp_v4(v4f_load(row + j) - shift));
    for (; j < n; j++)
        row[j] = exp_s(row[j] - shift);
}

/* The AVX2 twin when the CPU has it, unless SDTRAIN_CPU_ISA=baseline (for comparing the two). */
static int cpu_use_avx2(void)
{
    static int use = -1;
    if (use < 0) {
#ifdef SD_HAVE_AVX2_TWIN
        const char *isa = getenv("SDTRAIN_CPU_ISA");
        __builtin_cpu_init();
        use = __builtin_cpu_supports("avx2") && !(isa && strcmp(isa, "baseline") == 0);
#else
        use = 0;
#endif
    }
    return use;
}

static void exp_shift_row(float *row, int n, float shift)
{
#ifdef SD_HAVE_AVX2_TWIN
    if (cpu_use_avx2()) {
        exp_shift_row_avx2(row, n, shift);
        return;
    }
#endif
    exp_shift_row_base(row, n, shift);
}

static double softmax_exp_row(float *row, int n, float *max)
{
#ifdef SD_HAVE_AVX2_TWIN
    if (cpu_use_avx2())
        return softmax_exp_row_avx2(row, n, max);
#endif
    return softmax_exp_row_base(row, n, max);
}

static void attention_block(const sd_attention_desc *d, const float *q, const float *k,
                            const float *v, float *o, float *lse, int64_t task, float *s)
{
    const int dh = d->head_dim, qb = attn_q_block(d), nqb = (d->t_q + qb - 1) / qb;
    const int b = (int)(task / ((int64_t)d->heads * nqb));
    const int h = (int)(task / nqb % d->heads);
    const int q0 = (int)(task % nqb) * qb;
    const int m = d->t_q - q0 < qb ? d->t_q - q0 : qb;
    const int nk = d->causal ? q0 + m : d->t_kv;
    const float *qp = q + ((int64_t)b * d->t_q + q0) * d->ld_q + (int64_t)h * dh;
    const float *kp = k + (int64_t)b * d->t_kv * d->ld_k + (int64_t)h * dh;
    const float *vp = v + (int64_t)b * d->t_kv * d->ld_v + (int64_t)h * dh;
    float *op = o + ((int64_t)b * d->t_q + q0) * d->ld_o + (int64_t)h * dh;
    float *lp = lse ? lse + ((int64_t)b * d->heads + h) * d->t_q + q0 : NULL;
    float denom[CPU_ATTN_Q_BLOCK];

    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, dh, d->scale, qp, d->ld_q, kp,
                d->ld_k, 0.0f, s, nk);
    for (int i = 0; i < m; i++) {
        float *row = s + (int64_t)i * nk;
        const int visible = d->causal ? q0 + i + 1 : nk;
        float mx;
        const double sum = softmax_exp_row(row, visible, &mx);
        denom[i] = (float)sum;
        for (int j = visible; j < nk; j++)
            row[j] = 0.0f; /* masked: exactly zero probability */
        if (lp)
            lp[i] = (float)((double)mx + log(sum));
    }
    /* o = (e v) / sum: the normalisation is applied to the m x dh output rather than to the
     * m x nk weights (one pass over the score block less) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dh, nk, 1.0f, s, nk, vp, d->ld_v,
                0.0f, op, d->ld_o);
    for (int i = 0; i < m; i++) {
        float *orow = op + (int64_t)i * d->ld_o;
        for (int c = 0; c < dh; c++)
            orow[c] /= denom[i];
    }
}

static void cpu_attention_forward(const sd_backend *be, const sd_attention_desc *d,
                                  const void *q, const void *k, const void *v, void *o,
                                  float *lse, sd_scratch ws)
{
    const int64_t tasks = attn_tasks(d);
    const size_t slot = attn_slot_bytes(d);
    int64_t slots = (int64_t)(ws.bytes / slot);
    if (slots > cpu_max_threads())
        slots = cpu_max_threads();
    if (slots > tasks)
        slots = tasks;
    SD_CHECK(slots >= 1, "attention scratch of %zu bytes holds no score block of %zu", ws.bytes,
             slot);
    blas_single_threaded();
    (void)cpu_use_avx2(); /* resolved here, not by racing threads */
#pragma omp parallel num_threads((int)slots)
    {
        int tid = 0, nth = 1;
#ifdef _OPENMP
        tid = omp_get_thread_num();
        nth = omp_get_num_threads();
#endif
        (void)nth;
        float *s = (float *)((char *)ws.ptr + (size_t)tid * slot);
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++)
            attention_block(d, q, k, v, o, lse, task, s);
    }
}

/* ---- resampling and data movement ---------------------------------------------------------- */

/* PyTorch's nearest source index (UpSample.h): identity, halving for exactly 2x, else
 * floor(dst * (float)in / out) clamped to the input. */
static int nearest_src(int dst, int in, int out)
{
    if (out == in)
        return dst;
    if (out == 2 * in)
        return dst >> 1;
    float scale = (float)in / (float)out;
    int src = (int)floorf((float)dst * scale);
    return src < in - 1 ? src : in - 1;
}

static void cpu_upsample_nearest_forward(const sd_backend *be, int n, int h, int w, int c,
                                         int h_out, int w_out, const void *xv, void *yv)
{
    const float *x = xv;
    float *y = yv;
    const size_t cb = (size_t)c * sizeof(float);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)n * h_out; r++) {
        int64_t b = r / h_out;
        int iy = nearest_src((int)(r % h_out), h, h_out);
        const float *xr = x + (b * h + iy) * (int64_t)w * c;
        float *yr = y + r * (int64_t)w_out * c;
        for (int ox = 0; ox < w_out; ox++)
            memcpy(yr + (int64_t)ox * c, xr + (int64_t)nearest_src(ox, w, w_out) * c, cb);
    }
}

static void cpu_timestep_embedding(const sd_backend *be, int n,
                                   const sd_timestep_embedding_desc *d, const float *t, void *yv)
{
    float *y = yv;
    const int half = d->dim / 2;
    /* The rounding steps of the PyTorch code: -ln(max_period) is a Python double rounded to
     * float when it multiplies the fp32 arange; the divisor (half - shift) likewise. */
    const float neg_log_period = (float)(-log((double)d->max_period));
    const float divisor = (float)((double)half - (double)d->downscale_freq_shift);
    for (int i = 0; i < n; i++) {
        float *yi = y + (int64_t)i * d->dim;
        float *first = yi, *second = yi + half;
        if (d->flip_sin_to_cos) { /* [cos | sin] */
            first = yi + half;
            second = yi;
        }
        for (int k = 0; k < half; k++) {
            float freq = expf(neg_log_period * (float)k / divisor);
            float arg = t[i] * freq;
            if (d->scale != 1.0f)
                arg = d->scale * arg;
            first[k] = sinf(arg);
            second[k] = cosf(arg);
        }
        if (d->dim % 2)
            yi[d->dim - 1] = 0.0f;
    }
}

static void cpu_embedding_forward(const sd_backend *be, int batch, int t, int c, int vocab,
                                  const int32_t *ids, const void *tv, const void *pv, void *yv)
{
    const float *table = tv, *pos = pv;
    float *y = yv;
    for (int64_t i = 0; i < (int64_t)batch * t; i++)
        SD_CHECK(ids[i] >= 0 && ids[i] < vocab, "token id %d at position %lld outside [0, %d)",
                 (int)ids[i], (long long)i, vocab);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < (int64_t)batch * t; i++) {
        const float *e = table + (int64_t)ids[i] * c;
        const float *p = pos ? pos + (i % t) * c : NULL;
        float *yr = y + i * c;
        for (int j = 0; j < c; j++)
            yr[j] = p ? e[j] + p[j] : e[j];
    }
}

static void cpu_add(const sd_backend *be, int64_t n, const void *av, const void *bv,
                    float divisor, void *yv)
{
    const float *a = av, *b = bv;
    float *y = yv;
    if (divisor == 1.0f) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            y[i] = a[i] + b[i];
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            y[i] = (a[i] + b[i]) / divisor;
    }
}

static void cpu_axpby(const sd_backend *be, int64_t n, float alpha, const void *xv, float beta,
                      void *yv)
{
    const float *x = xv;
    float *y = yv;
    if (beta == 0.0f) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            y[i] = alpha * x[i];
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++)
            y[i] = alpha * x[i] + beta * y[i];
    }
}

static void cpu_add_bcast_forward(const sd_backend *be, int n, int64_t rows, int c,
                                  const void *xv, const void *vv, void *yv)
{
    const float *x = xv, *v = vv;
    float *y = yv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)n * rows; r++) {
        const float *vb = v + (r / rows) * c;
        const float *xr = x + r * c;
        float *yr = y + r * c;
        for (int j = 0; j < c; j++)
            yr[j] = xr[j] + vb[j];
    }
}

static void cpu_concat_channels(const sd_backend *be, int64_t rows, int c1, int c2,
                                const void *av, const void *bv, void *yv)
{
    const float *a = av, *b = bv;
    float *y = yv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        memcpy(y + r * (c1 + c2), a + r * c1, (size_t)c1 * sizeof(float));
        memcpy(y + r * (c1 + c2) + c1, b + r * c2, (size_t)c2 * sizeof(float));
    }
}

static void split_part(int64_t rows, int width, int offset, int c, const float *x, float *out,
                       int accumulate)
{
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * width + offset;
        float *o = out + r * c;
        if (accumulate)
            for (int j = 0; j < c; j++)
                o[j] += xr[j];
        else
            memcpy(o, xr, (size_t)c * sizeof(float));
    }
}

static void cpu_split_channels(const sd_backend *be, int64_t rows, int c1, int c2,
                               const void *xv, void *av, void *bv, int accumulate)
{
    if (av)
        split_part(rows, c1 + c2, 0, c1, xv, av, accumulate);
    if (bv)
        split_part(rows, c1 + c2, c1, c2, xv, bv, accumulate);
}

static void cpu_nchw_to_nhwc(const sd_backend *be, int n, int c, int h, int w, const void *xv,
                             void *yv)
{
    const float *x = xv;
    float *y = yv;
    const int64_t plane = (int64_t)h * w;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)n * plane; r++) {
        const float *xb = x + (r / plane) * c * plane + r % plane;
        float *yr = y + r * c;
        for (int j = 0; j < c; j++)
            yr[j] = xb[j * plane];
    }
}

static void cpu_nhwc_to_nchw(const sd_backend *be, int n, int c, int h, int w, const void *xv,
                             void *yv)
{
    const float *x = xv;
    float *y = yv;
    const int64_t plane = (int64_t)h * w;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)n * c; r++) {
        const float *xb = x + (r / c) * plane * c + r % c;
        float *yr = y + r * plane;
        for (int64_t p = 0; p < plane; p++)
            yr[p] = xb[p * c];
    }
}

static void cpu_diag_gaussian_sample(const sd_backend *be, int64_t rows, int c,
                                     const void *mv, const void *ev, float scale, void *zv)
{
    const float *moments = mv, *eps = ev;
    float *z = zv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *mean = moments + r * 2 * c, *logvar = mean + c;
        float *zr = z + r * c;
        for (int j = 0; j < c; j++) {
            float s = mean[j];
            if (eps) {
                /* diffusers: clamp, std = exp(0.5 * logvar), mean + std * eps */
                float lv = logvar[j] < -30.0f ? -30.0f : (logvar[j] > 20.0f ? 20.0f : logvar[j]);
                float sd = expf(0.5f * lv);
                s = s + sd * eps[r * c + j];
            }
            zr[j] = s * scale;
        }
    }
}

/* ==== backward ==================================================================================
 * Same determinism rules as the forward: parallel loops write disjoint outputs; every reduction
 * over rows (weight gradients, bias sums, norm statistics, attention dk/dv) is done by one task
 * in a fixed order (in double where it is a plain sum), or by one single-threaded GEMM per output
 * tile over the whole inner dimension, with tiles that depend on the shape only. */

#define CPU_INV_SQRT_2PI 0.39894228040143267794f
#define CPU_COLS_PER_TASK 64

static inline float silu_grad_f(float v)
{
    float s = 1.0f / (1.0f + exp_s(-v));
    return s * (1.0f + v * (1.0f - s));
}

static inline __attribute__((always_inline)) float gelu_grad_f(float v)
{
    return 0.5f * (1.0f + erf_s(v * CPU_SQRT1_2)) + v * CPU_INV_SQRT_2PI * exp_s(-0.5f * v * v);
}

static inline __attribute__((always_inline)) v4f gelu_grad_v4(v4f v)
{
    return 0.5f * (1.0f + erf_v4(v * CPU_SQRT1_2)) + v * CPU_INV_SQRT_2PI * exp_v4(-0.5f * v * v);
}

/* C = alpha op(A) op(B) + beta C, op(A) = A^T for A [k, m] when trans_a; tiles of C in
 * parallel, each one single-threaded sgemm over the whole inner dimension. */
static void cpu_gemm_ab(int trans_a, int trans_b, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c,
                        int ldc)
{
    const int tm = gemm_tile(m), tn = gemm_tile(n);
    const int mt = (m + tm - 1) / tm, nt = (n + tn - 1) / tn;
    const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
#pragma omp parallel for schedule(dynamic) if (mt * nt > 1)
    for (int t = 0; t < mt * nt; t++) {
        int i0 = (t / nt) * tm, j0 = (t % nt) * tn;
        int mm = m - i0 < tm ? m - i0 : tm, nn = n - j0 < tn ? n - j0 : tn;
        const float *at = trans_a ? a + i0 : a + (int64_t)i0 * lda;
        const float *bt = trans_b ? b + (int64_t)j0 * ldb : b + j0;
        cblas_sgemm(CblasRowMajor, ta, tb, mm, nn, k, alpha, at, lda, bt, ldb, beta,
                    c + (int64_t)i0 * ldc + j0, ldc);
    }
}

/* out[s, j] = (or +=) sum over r of a[s, r, j], for sets s < nsets of `rows` rows of c: one
 * task per (set, block of columns), rows added in order in double. */
static void col_sums(int nsets, int64_t rows, int c, const float *a, float *out, int accumulate)
{
    const int cb = (c + CPU_COLS_PER_TASK - 1) / CPU_COLS_PER_TASK;
#pragma omp parallel for schedule(dynamic)
    for (int64_t t = 0; t < (int64_t)nsets * cb; t++) {
        const int64_t s = t / cb;
        const int j0 = (int)(t % cb) * CPU_COLS_PER_TASK;
        const int j1 = j0 + CPU_COLS_PER_TASK < c ? j0 + CPU_COLS_PER_TASK : c;
        double acc[CPU_COLS_PER_TASK];
        for (int j = 0; j < j1 - j0; j++)
            acc[j] = 0.0;
        const float *base = a + s * rows * c;
        for (int64_t r = 0; r < rows; r++) {
            const float *ar = base + r * c;
            for (int j = j0; j < j1; j++)
                acc[j - j0] += ar[j];
        }
        float *o = out + s * c;
        for (int j = j0; j < j1; j++)
            o[j] = accumulate ? (float)((double)o[j] + acc[j - j0]) : (float)acc[j - j0];
    }
}

/* ---- activations backward ------------------------------------------------------------------ */

static void cpu_silu_backward(const sd_backend *be, int64_t n, const void *xv, const void *dyv,
                              void *dxv, int accumulate)
{
    const float *x = xv, *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float g = dy[i] * silu_grad_f(x[i]);
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

static void cpu_gelu_backward(const sd_backend *be, int64_t n, const void *xv, const void *dyv,
                              void *dxv, int accumulate)
{
    const float *x = xv, *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for schedule(dynamic)
    for (int64_t i0 = 0; i0 < n; i0 += CPU_ELEMS_PER_TASK) {
        const int64_t end = n - i0 < CPU_ELEMS_PER_TASK ? n : i0 + CPU_ELEMS_PER_TASK;
        int64_t i = i0;
        for (; i + 4 <= end; i += 4) {
            v4f g = v4f_load(dy + i) * gelu_grad_v4(v4f_load(x + i));
            v4f_store(dx + i, accumulate ? v4f_load(dx + i) + g : g);
        }
        for (; i < end; i++) {
            float g = dy[i] * gelu_grad_f(x[i]);
            dx[i] = accumulate ? dx[i] + g : g;
        }
    }
}

/* d/dx [x sigmoid(1.702 x)] = s + 1.702 x s (1 - s), s evaluated as in the forward */
static void cpu_quick_gelu_backward(const sd_backend *be, int64_t n, const void *xv,
                                    const void *dyv, void *dxv, int accumulate)
{
    const float *x = xv, *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float s = 1.0f / (1.0f + expf(-(1.702f * x[i])));
        const float g = dy[i] * (s * (1.0f + 1.702f * x[i] * (1.0f - s)));
        dx[i] = accumulate ? dx[i] + g : g;
    }
}

static void cpu_geglu_backward(const sd_backend *be, int64_t rows, int inner, const void *xv,
                               const void *dyv, void *dxv, int accumulate)
{
    const float *x = xv, *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *value = x + r * 2 * inner, *gate = value + inner, *dyr = dy + r * inner;
        float *dval = dx + r * 2 * inner, *dgate = dval + inner;
        int j = 0;
        for (; j + 4 <= inner; j += 4) {
            const v4f gt = v4f_load(gate + j), d = v4f_load(dyr + j);
            v4f a = d * gelu_v4(gt);
            v4f g = d * v4f_load(value + j) * gelu_grad_v4(gt);
            v4f_store(dval + j, accumulate ? v4f_load(dval + j) + a : a);
            v4f_store(dgate + j, accumulate ? v4f_load(dgate + j) + g : g);
        }
        for (; j < inner; j++) {
            float a = dyr[j] * gelu_f(gate[j]);
            float g = dyr[j] * value[j] * gelu_grad_f(gate[j]);
            dval[j] = accumulate ? dval[j] + a : a;
            dgate[j] = accumulate ? dgate[j] + g : g;
        }
    }
}

/* ---- linear backward ----------------------------------------------------------------------- */

static void cpu_linear_backward(const sd_backend *be, int64_t rows, int in, int out,
                                const void *xv, const void *wv, const void *dyv, void *dxv,
                                int accumulate, float *dw, float *db, sd_scratch ws)
{
    const float *x = xv, *w = wv, *dy = dyv;
    float *dx = dxv;
    const int m = blas_int(rows, "linear rows");
    (void)ws;
    blas_single_threaded();
    if (dx) /* dx [rows, in] = dy [rows, out] w [out, in] */
        cpu_gemm_ab(0, 0, m, in, out, 1.0f, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
    /* dw [out, in] += dy^T x */
    cpu_gemm_ab(1, 0, out, in, m, 1.0f, dy, out, x, in, 1.0f, dw, in);
    if (db)
        col_sums(1, rows, out, dy, db, 1);
}

/* ---- normalization backward ---------------------------------------------------------------- */

static size_t cpu_layer_norm_backward_scratch(const sd_backend *be, int64_t rows, int c)
{
    return 0;
}

static void cpu_layer_norm_backward(const sd_backend *be, int64_t rows, int c, const void *xv,
                                    const void *gv, const float *mean, const float *rstd,
                                    const void *dyv, void *dxv, int accumulate, float *dgamma,
                                    float *dbeta, sd_scratch ws)
{
    const float *x = xv, *gamma = gv, *dy = dyv;
    float *dx = dxv;
    (void)ws;
    if (dx) {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * c, *dyr = dy + r * c;
            float *dxr = dx + r * c;
            const float m = mean[r], rs = rstd[r];
            double s1 = 0.0, s2 = 0.0;
            for (int j = 0; j < c; j++) {
                float xh = (xr[j] - m) * rs;
                float g = gamma ? dyr[j] * gamma[j] : dyr[j];
                s1 += g;
                s2 += (double)g * xh;
            }
            const float a = (float)(s1 / c), b = (float)(s2 / c);
            for (int j = 0; j < c; j++) {
                float xh = (xr[j] - m) * rs;
                float g = gamma ? dyr[j] * gamma[j] : dyr[j];
                float v = rs * (g - a - xh * b);
                dxr[j] = accumulate ? dxr[j] + v : v;
            }
        }
    }
    if (dgamma || dbeta) {
        const int cb = (c + CPU_COLS_PER_TASK - 1) / CPU_COLS_PER_TASK;
#pragma omp parallel for schedule(dynamic)
        for (int t = 0; t < cb; t++) {
            const int j0 = t * CPU_COLS_PER_TASK;
            const int j1 = j0 + CPU_COLS_PER_TASK < c ? j0 + CPU_COLS_PER_TASK : c;
            double ag[CPU_COLS_PER_TASK], ab[CPU_COLS_PER_TASK];
            for (int j = 0; j < j1 - j0; j++)
                ag[j] = ab[j] = 0.0;
            for (int64_t r = 0; r < rows; r++) {
                const float *xr = x + r * c, *dyr = dy + r * c;
                const float m = mean[r], rs = rstd[r];
                for (int j = j0; j < j1; j++) {
                    ag[j - j0] += (double)dyr[j] * ((xr[j] - m) * rs);
                    ab[j - j0] += dyr[j];
                }
            }
            for (int j = j0; j < j1; j++) {
                if (dgamma)
                    dgamma[j] = (float)((double)dgamma[j] + ag[j - j0]);
                if (dbeta)
                    dbeta[j] = (float)((double)dbeta[j] + ab[j - j0]);
            }
        }
    }
}

static size_t cpu_group_norm_backward_scratch(const sd_backend *be, const sd_group_norm_desc *d)
{
    /* chunk sums (2 c doubles per sample and chunk), per-sample channel sums (2 c doubles),
     * per-group coefficients (2 floats), alignment */
    return 64 + gn_align(2 * (size_t)d->n * gn_chunks(d->hw) * d->c * sizeof(double)) +
           gn_align(2 * (size_t)d->n * d->c * sizeof(double)) +
           gn_align(2 * (size_t)d->n * d->groups * sizeof(float)) +
           4 * (size_t)d->n * d->c * sizeof(float); /* per-channel copies of the group values */
}

static inline __attribute__((always_inline)) v4f silu_grad_v4(v4f v)
{
    v4f s = 1.0f / (1.0f + exp_v4(-v));
    return s * (1.0f + v * (1.0f - s));
}

/* gn_dz on 4 channels [j, j + 4) of one row, with the group statistics expanded per channel. */
static inline __attribute__((always_inline)) v4f gn_dz_v4(v4f xv, v4f m, v4f rs,
                                                           const float *gamma,
                                                           const float *beta, int silu, int j,
                                                           v4f dyv, v4f *xh)
{
    v4f h = (xv - m) * rs;
    *xh = h;
    if (!silu)
        return dyv;
    v4f z = h;
    if (gamma)
        z = z * v4f_load(gamma + j);
    if (beta)
        z = z + v4f_load(beta + j);
    return dyv * silu_grad_v4(z);
}

/* dz = gradient at the normalised-and-affine value (through the SiLU when fused); xh = x hat */
static inline float gn_dz(float xv, float m, float rs, const float *gamma, const float *beta,
                          int silu, int j, float dyv, float *xh)
{
    float h = (xv - m) * rs;
    *xh = h;
    if (!silu)
        return dyv;
    float z = h;
    if (gamma)
        z = z * gamma[j];
    if (beta)
        z = z + beta[j];
    return dyv * silu_grad_f(z);
}

static void cpu_group_norm_backward(const sd_backend *be, const sd_group_norm_desc *d,
                                    const void *xv, const void *gv, const void *bv,
                                    const float *mean, const float *rstd, const void *dyv,
                                    void *dxv, int accumulate, float *dgamma, float *dbeta,
                                    sd_scratch ws)
{
    const float *x = xv, *gamma = gv, *beta = bv, *dy = dyv;
    float *dx = dxv;
    const int groups = d->groups, c = d->c, cpg = d->c / d->groups, n = d->n;
    const int64_t hw = d->hw, nch = gn_chunks(hw), clen = (hw + nch - 1) / nch;
    char *base = (char *)(((uintptr_t)ws.ptr + 63) & ~(uintptr_t)63);
    double *part = (double *)base;
    base += gn_align(2 * (size_t)n * nch * c * sizeof(double));
    double *tot = (double *)base; /* [n][2c]: sum dz, sum dz * xh */
    base += gn_align(2 * (size_t)n * c * sizeof(double));
    float *coef = (float *)base; /* [n * groups][2]: mean of dz gamma, of dz gamma xh */
    base += gn_align(2 * (size_t)n * groups * sizeof(float));
    /* the group values per channel [n][c], so the channel loops run 4 channels at a time with
     * the same operations as one at a time */
    float *mean_c = (float *)base, *rstd_c = mean_c + (size_t)n * c;
    float *c0_c = rstd_c + (size_t)n * c, *c1_c = c0_c + (size_t)n * c;
    for (int64_t t = 0; t < (int64_t)n * c; t++) {
        const int64_t gi = t / c * groups + t % c / cpg;
        mean_c[t] = mean[gi];
        rstd_c[t] = rstd[gi];
    }

#pragma omp parallel for schedule(dynamic)
    for (int64_t task = 0; task < n * nch; task++) {
        const int64_t b = task / nch, k = task % nch;
        const int64_t p0 = k * clen, p1 = p0 + clen < hw ? p0 + clen : hw;
        const float *mb = mean_c + b * c, *rb = rstd_c + b * c;
        double *s1 = part + task * 2 * c, *s2 = s1 + c;
        for (int j = 0; j < c; j++)
            s1[j] = s2[j] = 0.0;
        for (int64_t p = p0; p < p1; p++) {
            const float *xr = x + (b * hw + p) * c, *dyr = dy + (b * hw + p) * c;
            int j = 0;
            for (; j + 4 <= c; j += 4) {
                v4f xh, dz = gn_dz_v4(v4f_load(xr + j), v4f_load(mb + j), v4f_load(rb + j),
                                      gamma, beta, d->silu, j, v4f_load(dyr + j), &xh);
                v4d a, q;
                memcpy(&a, s1 + j, sizeof a);
                memcpy(&q, s2 + j, sizeof q);
                a = a + __builtin_convertvector(dz, v4d);
                q = q + __builtin_convertvector(dz, v4d) * __builtin_convertvector(xh, v4d);
                memcpy(s1 + j, &a, sizeof a);
                memcpy(s2 + j, &q, sizeof q);
            }
            for (; j < c; j++) {
                float xh, dz = gn_dz(xr[j], mb[j], rb[j], gamma, beta, d->silu, j, dyr[j], &xh);
                s1[j] += dz;
                s2[j] += (double)dz * xh;
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < (int64_t)n * c; t++) {
        const int64_t b = t / c, j = t % c;
        double a1 = 0.0, a2 = 0.0;
        for (int64_t k = 0; k < nch; k++) {
            const double *s1 = part + (b * nch + k) * 2 * c;
            a1 += s1[j];
            a2 += s1[c + j];
        }
        tot[b * 2 * c + j] = a1;
        tot[b * 2 * c + c + j] = a2;
    }
    for (int t = 0; t < n * groups; t++) {
        const int b = t / groups, g = t % groups;
        double a1 = 0.0, a2 = 0.0;
        for (int j = g * cpg; j < (g + 1) * cpg; j++) {
            double gm = gamma ? gamma[j] : 1.0;
            a1 += gm * tot[(int64_t)b * 2 * c + j];
            a2 += gm * tot[(int64_t)b * 2 * c + c + j];
        }
        const double cnt = (double)hw * cpg;
        coef[2 * t] = (float)(a1 / cnt);
        coef[2 * t + 1] = (float)(a2 / cnt);
    }
    for (int64_t t = 0; t < (int64_t)n * c; t++) {
        const int64_t gi = t / c * groups + t % c / cpg;
        c0_c[t] = coef[2 * gi];
        c1_c[t] = coef[2 * gi + 1];
    }
    for (int j = 0; j < c && (dgamma || dbeta); j++) {
        double a1 = 0.0, a2 = 0.0;
        for (int b = 0; b < n; b++) {
            a1 += tot[(int64_t)b * 2 * c + j];
            a2 += tot[(int64_t)b * 2 * c + c + j];
        }
        if (dgamma)
            dgamma[j] = (float)((double)dgamma[j] + a2);
        if (dbeta)
            dbeta[j] = (float)((double)dbeta[j] + a1);
    }
    if (!dx)
        return;
    const int64_t rows = (int64_t)n * hw;
#pragma omp parallel for schedule(dynamic)
    for (int64_t r0 = 0; r0 < rows; r0 += CPU_ROWS_PER_TASK) {
        const int64_t r1 = r0 + CPU_ROWS_PER_TASK < rows ? r0 + CPU_ROWS_PER_TASK : rows;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t b = r / hw;
            const float *xr = x + r * c, *dyr = dy + r * c;
            const float *mb = mean_c + b * c, *rb = rstd_c + b * c;
            const float *k0 = c0_c + b * c, *k1 = c1_c + b * c;
            float *dxr = dx + r * c;
            int j = 0;
            for (; j + 4 <= c; j += 4) {
                const v4f rs = v4f_load(rb + j);
                v4f xh, dz = gn_dz_v4(v4f_load(xr + j), v4f_load(mb + j), rs, gamma, beta,
                                      d->silu, j, v4f_load(dyr + j), &xh);
                v4f g = gamma ? dz * v4f_load(gamma + j) : dz;
                v4f v = rs * (g - v4f_load(k0 + j) - xh * v4f_load(k1 + j));
                v4f_store(dxr + j, accumulate ? v4f_load(dxr + j) + v : v);
            }
            for (; j < c; j++) {
                const float rs = rb[j];
                float xh, dz = gn_dz(xr[j], mb[j], rs, gamma, beta, d->silu, j, dyr[j], &xh);
                float g = gamma ? dz * gamma[j] : dz;
                float v = rs * (g - k0[j] - xh * k1[j]);
                dxr[j] = accumulate ? dxr[j] + v : v;
            }
        }
    }
}

/* ---- resampling and broadcast backward ----------------------------------------------------- */

/* Each input row gathers, in (output row, output column) order, the output cells that copied
 * it (nearest_src is monotonic, so they are found by a scan). */
static void cpu_upsample_nearest_backward(const sd_backend *be, int n, int h, int w, int c,
                                          int h_out, int w_out, const void *dyv, void *dxv,
                                          int accumulate)
{
    const float *dy = dyv;
    float *dx = dxv;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < (int64_t)n * h; r++) {
        const int64_t b = r / h;
        const int iy = (int)(r % h);
        float *dxr = dx + r * (int64_t)w * c;
        if (!accumulate)
            memset(dxr, 0, (size_t)w * c * sizeof(float));
        for (int oy = 0; oy < h_out; oy++) {
            if (nearest_src(oy, h, h_out) != iy)
                continue;
            const float *dyr = dy + (b * h_out + oy) * (int64_t)w_out * c;
            for (int ox = 0; ox < w_out; ox++) {
                float *o = dxr + (int64_t)nearest_src(ox, w, w_out) * c;
                const float *g = dyr + (int64_t)ox * c;
                for (int j = 0; j < c; j++)
                    o[j] += g[j];
            }
        }
    }
}

static size_t cpu_add_bcast_backward_scratch(const sd_backend *be, int n, int64_t rows, int c)
{
    return 0;
}

static void cpu_add_bcast_backward(const sd_backend *be, int n, int64_t rows, int c,
                                   const void *dyv, void *dvv, int accumulate, sd_scratch ws)
{
    (void)ws;
    col_sums(n, rows, c, dyv, dvv, accumulate);
}

/* ---- conv2d backward ----------------------------------------------------------------------- */

static size_t cpu_conv2d_backward_scratch(const sd_backend *be, const sd_conv2d_desc *d)
{
    if (conv_is_pointwise(d))
        return 0;
    return (size_t)conv_tile_rows(d) * (size_t)d->kh * d->kw * d->c_in * sizeof(float);
}

/* dx += the im2col-gradient rows [p0, p0 + m) (col2im): every input pixel gathers, in (u, v)
 * order, the entries of the output pixels of this tile that saw it; one task per input row. */
static void conv_col2im_add(const sd_conv2d_desc *d, const float *dcol, int64_t p0, int64_t m,
                            float *dx)
{
    const int64_t k = (int64_t)d->kh * d->kw * d->c_in;
    /* the input rows (over all samples, b * h + iy) that the tile's output rows see */
    const int64_t r0 = p0 / d->w_out, r1 = (p0 + m - 1) / d->w_out;
    const int y0 = (int)(r0 % d->h_out) * d->stride - d->pad_top;
    const int y1 = (int)(r1 % d->h_out) * d->stride - d->pad_top + d->kh - 1;
    /* (clamped to the sample; an extra row scanned is harmless, each entry is checked) */
    const int64_t g0 = r0 / d->h_out * d->h + (y0 < 0 ? 0 : (y0 > d->h - 1 ? d->h - 1 : y0));
    const int64_t g1 = r1 / d->h_out * d->h + (y1 < 0 ? 0 : (y1 > d->h - 1 ? d->h - 1 : y1));
#pragma omp parallel for schedule(dynamic)
    for (int64_t gr = g0; gr <= g1; gr++) {
        const int64_t b = gr / d->h;
        const int iy = (int)(gr % d->h);
        for (int u = 0; u < d->kh; u++) {
            int ty = iy + d->pad_top - u;
            if (ty < 0 || ty % d->stride)
                continue;
            int oy = ty / d->stride;
            if (oy >= d->h_out)
                continue;
            for (int ix = 0; ix < d->w; ix++) {
                float *o = dx + ((b * d->h + iy) * d->w + ix) * d->c_in;
                for (int v = 0; v < d->kw; v++) {
                    int tx = ix + d->pad_left - v;
                    if (tx < 0 || tx % d->stride)
                        continue;
                    int ox = tx / d->stride;
                    if (ox >= d->w_out)
                        continue;
                    int64_t p = (b * d->h_out + oy) * d->w_out + ox;
                    if (p < p0 || p >= p0 + m)
                        continue;
                    const float *g = dcol + (p - p0) * k + ((int64_t)u * d->kw + v) * d->c_in;
                    for (int j = 0; j < d->c_in; j++)
                        o[j] += g[j];
                }
            }
        }
    }
}

static void cpu_conv2d_backward(const sd_backend *be, const sd_conv2d_desc *d, const void *xv,
                                const void *wv, const void *dyv, void *dxv, int accumulate,
                                float *dw, float *db, sd_scratch ws)
{
    const float *x = xv, *w = wv, *dy = dyv;
    float *dx = dxv;
    const int64_t pixels = (int64_t)d->n * d->h_out * d->w_out;
    const int k = blas_int((int64_t)d->kh * d->kw * d->c_in, "conv2d kh*kw*c_in");
    if (conv_is_pointwise(d)) {
        cpu_linear_backward(be, pixels, d->c_in, d->c_out, x, w, dy, dx, accumulate, dw, db, ws);
        return;
    }
    const int64_t tile = conv_tile_rows(d);
    SD_CHECK(ws.bytes >= (size_t)tile * k * sizeof(float),
             "conv2d backward scratch of %zu bytes is too small", ws.bytes);
    float *col = ws.ptr;
    blas_single_threaded();
    if (db)
        col_sums(1, pixels, d->c_out, dy, db, 1);
    if (dx && !accumulate)
        memset(dx, 0, (size_t)d->n * d->h * d->w * d->c_in * sizeof(float));
    for (int64_t p0 = 0; p0 < pixels; p0 += tile) {
        const int m = (int)(pixels - p0 < tile ? pixels - p0 : tile);
        const float *dyt = dy + p0 * d->c_out;
        conv_im2col(d, x, p0, m, col, 1);
        /* dw [c_out, k] += dy_tile^T col */
        cpu_gemm_ab(1, 0, d->c_out, k, m, 1.0f, dyt, d->c_out, col, k, 1.0f, dw, k);
        if (dx) {
            /* dcol [m, k] = dy_tile w, then scattered back by a gather per input pixel */
            cpu_gemm_ab(0, 0, m, k, d->c_out, 1.0f, dyt, d->c_out, w, k, 0.0f, col, k);
            conv_col2im_add(d, col, p0, m, dx);
        }
    }
}

/* ---- attention backward -------------------------------------------------------------------- */

/* Per (sample, head) task, query blocks in order: P rebuilt from lse, D = rowsum(dO o O),
 * dV += P^T dO, dS = P (dO V^T - D), dQ = scale dS K, dK += scale dS^T Q. The task owns its
 * head's dk and dv, so their sums over query blocks run in a fixed order. */
static size_t attn_bwd_slot_bytes(const sd_attention_desc *d)
{
    return 2 * attn_slot_bytes(d) + (size_t)attn_q_block(d) * sizeof(float);
}

static size_t cpu_attention_backward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    int64_t slots = cpu_scratch_slots(), tasks = (int64_t)d->batch * d->heads;
    if (slots > tasks)
        slots = tasks;
    return (size_t)slots * attn_bwd_slot_bytes(d);
}

static void attention_bwd_head(const sd_attention_desc *d, const float *q, const float *k,
                               const float *v, const float *o, const float *lse,
                               const float *dout, float *dq, float *dk, float *dv,
                               int accumulate, int64_t task, float *s)
{
    const int dh = d->head_dim, qb = attn_q_block(d);
    const int b = (int)(task / d->heads), h = (int)(task % d->heads);
    const float *qp = q + (int64_t)b * d->t_q * d->ld_q + (int64_t)h * dh;
    const float *kp = k + (int64_t)b * d->t_kv * d->ld_k + (int64_t)h * dh;
    const float *vp = v + (int64_t)b * d->t_kv * d->ld_v + (int64_t)h * dh;
    const float *op = o + (int64_t)b * d->t_q * d->ld_o + (int64_t)h * dh;
    const float *dop = dout + (int64_t)b * d->t_q * d->ld_o + (int64_t)h * dh;
    float *dqp = dq ? dq + (int64_t)b * d->t_q * d->ld_q + (int64_t)h * dh : NULL;
    float *dkp = dk ? dk + (int64_t)b * d->t_kv * d->ld_k + (int64_t)h * dh : NULL;
    float *dvp = dv ? dv + (int64_t)b * d->t_kv * d->ld_v + (int64_t)h * dh : NULL;
    const float *lp = lse + ((int64_t)b * d->heads + h) * d->t_q;
    float *p = s, *ds = s + (size_t)qb * d->t_kv, *dd = ds + (size_t)qb * d->t_kv;

    if (!accumulate)
        for (int j = 0; j < d->t_kv; j++) {
            if (dkp)
                memset(dkp + (int64_t)j * d->ld_k, 0, (size_t)dh * sizeof(float));
            if (dvp)
                memset(dvp + (int64_t)j * d->ld_v, 0, (size_t)dh * sizeof(float));
        }
    for (int q0 = 0; q0 < d->t_q; q0 += qb) {
        const int m = d->t_q - q0 < qb ? d->t_q - q0 : qb;
        const int nk = d->causal ? q0 + m : d->t_kv;
        const float *qb_p = qp + (int64_t)q0 * d->ld_q, *dob = dop + (int64_t)q0 * d->ld_o;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, dh, d->scale, qb_p, d->ld_q,
                    kp, d->ld_k, 0.0f, p, nk);
        for (int i = 0; i < m; i++) {
            float *row = p + (int64_t)i * nk;
            const int visible = d->causal ? q0 + i + 1 : nk;
            const float l = lp[q0 + i];
            exp_shift_row(row, visible, l);
            for (int j = visible; j < nk; j++)
                row[j] = 0.0f;
            const float *orow = op + (int64_t)(q0 + i) * d->ld_o;
            const float *grow = dob + (int64_t)i * d->ld_o;
            double acc = 0.0;
            for (int e = 0; e < dh; e++)
                acc += (double)orow[e] * grow[e];
            dd[i] = (float)acc;
        }
        if (dvp)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, dh, m, 1.0f, p, nk, dob,
                        d->ld_o, 1.0f, dvp, d->ld_v);
        if (!dqp && !dkp)
            continue;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, nk, dh, 1.0f, dob, d->ld_o, vp,
                    d->ld_v, 0.0f, ds, nk);
        for (int i = 0; i < m; i++) {
            float *pr = p + (int64_t)i * nk, *dr = ds + (int64_t)i * nk;
            for (int j = 0; j < nk; j++)
                dr[j] = pr[j] * (dr[j] - dd[i]);
        }
        if (dqp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, dh, nk, d->scale, ds, nk,
                        kp, d->ld_k, accumulate ? 1.0f : 0.0f, dqp + (int64_t)q0 * d->ld_q,
                        d->ld_q);
        if (dkp)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, dh, m, d->scale, ds, nk,
                        qb_p, d->ld_q, 1.0f, dkp, d->ld_k);
    }
}

static void cpu_attention_backward(const sd_backend *be, const sd_attention_desc *d,
                                   const void *q, const void *k, const void *v, const void *o,
                                   const float *lse, const void *dout, void *dq, void *dk,
                                   void *dv, int accumulate, sd_scratch ws)
{
    const int64_t tasks = (int64_t)d->batch * d->heads;
    const size_t slot = attn_bwd_slot_bytes(d);
    int64_t slots = (int64_t)(ws.bytes / slot);
    if (slots > cpu_max_threads())
        slots = cpu_max_threads();
    if (slots > tasks)
        slots = tasks;
    SD_CHECK(slots >= 1, "attention backward scratch of %zu bytes holds no block of %zu",
             ws.bytes, slot);
    blas_single_threaded();
    (void)cpu_use_avx2(); /* resolved here, not by racing threads */
#pragma omp parallel num_threads((int)slots)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *s = (float *)((char *)ws.ptr + (size_t)tid * slot);
#pragma omp for schedule(dynamic)
        for (int64_t task = 0; task < tasks; task++)
            attention_bwd_head(d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, task, s);
    }
}

/* ---- the table ---------------------------------------------------------------------------- */

/* Backward entries not provided yet are NULL and the sd_* wrappers say so. */
static const sd_ops cpu_ops = {
    .synchronize = cpu_synchronize,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_bytes,
    .download = cpu_bytes,
    .host_alloc = cpu_alloc,
    .host_release = cpu_release,
    .upload_async = cpu_bytes,
    .download_async = cpu_bytes,
    .download_wait = cpu_synchronize,
    .stream_mark = cpu_stream_mark,
    .stream_elapsed = cpu_stream_elapsed,
    .cast_f32 = cpu_cast_f32,
    .cast_to_f32 = cpu_cast_to_f32,
    .mse_loss = cpu_mse_loss,
    .conv2d_forward_scratch = cpu_conv2d_forward_scratch,
    .conv2d_forward = cpu_conv2d_forward,
    .linear_forward = cpu_linear_forward,
    .group_norm_forward_scratch = cpu_group_norm_forward_scratch,
    .group_norm_forward = cpu_group_norm_forward,
    .layer_norm_forward = cpu_layer_norm_forward,
    .silu_forward = cpu_silu_forward,
    .gelu_forward = cpu_gelu_forward,
    .quick_gelu_forward = cpu_quick_gelu_forward,
    .geglu_forward = cpu_geglu_forward,
    .attention_forward_scratch = cpu_attention_forward_scratch,
    .attention_forward = cpu_attention_forward,
    .upsample_nearest_forward = cpu_upsample_nearest_forward,
    .timestep_embedding = cpu_timestep_embedding,
    .embedding_forward = cpu_embedding_forward,
    .add = cpu_add,
    .axpby = cpu_axpby,
    .add_bcast_forward = cpu_add_bcast_forward,
    .concat_channels = cpu_concat_channels,
    .split_channels = cpu_split_channels,
    .nchw_to_nhwc = cpu_nchw_to_nhwc,
    .nhwc_to_nchw = cpu_nhwc_to_nchw,
    .diag_gaussian_sample = cpu_diag_gaussian_sample,
    .silu_backward = cpu_silu_backward,
    .gelu_backward = cpu_gelu_backward,
    .quick_gelu_backward = cpu_quick_gelu_backward,
    .geglu_backward = cpu_geglu_backward,
    .linear_backward = cpu_linear_backward,
    .layer_norm_backward_scratch = cpu_layer_norm_backward_scratch,
    .layer_norm_backward = cpu_layer_norm_backward,
    .group_norm_backward_scratch = cpu_group_norm_backward_scratch,
    .group_norm_backward = cpu_group_norm_backward,
    .upsample_nearest_backward = cpu_upsample_nearest_backward,
    .add_bcast_backward_scratch = cpu_add_bcast_backward_scratch,
    .add_bcast_backward = cpu_add_bcast_backward,
    .conv2d_backward_scratch = cpu_conv2d_backward_scratch,
    .conv2d_backward = cpu_conv2d_backward,
    .attention_backward_scratch = cpu_attention_backward_scratch,
    .attention_backward = cpu_attention_backward,
};

static const sd_backend cpu_backend = {
    .name = "cpu",
    .device = SD_DEV_CPU,
    .dtype = SD_F32,
    .ops = &cpu_ops,
    .impl = NULL,
};

const sd_backend *sd_backend_cpu(void)
{
    return &cpu_backend;
}
