/* CUDA activations, elementwise arithmetic, data movement, embeddings and resampling.
 * One thread per output element in grid-stride loops (int64 indices), fp32 math whatever the
 * storage type, no atomics: every output is written by exactly one thread, so every result is
 * the same on every run. Elementwise ops read an element before writing it from the same
 * thread, so an output may be one of the inputs (ops.h aliasing rule). doc/cuda/elementwise.md
 * has the precision notes and the bandwidth floors. */
#include <cmath>
#include <cstdio>

#include "cuda_internal.h"

#define EW_THREADS 256

#define SD_SQRT1_2F 0.70710678118654752440f
#define SD_INV_SQRT_2PIF 0.39894228040143267794f

#define GRID_STRIDE_LOOP(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- activation functions (same formulas as the CPU backend, libm-accurate expf/erff) ---- */

static __device__ __forceinline__ float silu_f(float v)
{
    return v / (1.0f + expf(-v));
}

static __device__ __forceinline__ float silu_grad_f(float v)
{
    float s = 1.0f / (1.0f + expf(-v));
    return s * (1.0f + v * (1.0f - s));
}

static __device__ __forceinline__ float gelu_f(float v)
{
    return v * 0.5f * (1.0f + erff(v * SD_SQRT1_2F));
}

static __device__ __forceinline__ float gelu_grad_f(float v)
{
    return 0.5f * (1.0f + erff(v * SD_SQRT1_2F)) + v * SD_INV_SQRT_2PIF * expf(-0.5f * v * v);
}

static __device__ __forceinline__ float quick_gelu_f(float v)
{
    return v * (1.0f / (1.0f + expf(-(1.702f * v))));
}

static __device__ __forceinline__ float quick_gelu_grad_f(float v)
{
    float s = 1.0f / (1.0f + expf(-(1.702f * v)));
    return s * (1.0f + 1.702f * v * (1.0f - s));
}

struct silu_op {
    __device__ float operator()(float v) const { return silu_f(v); }
};
struct silu_grad_op {
    __device__ float operator()(float v) const { return silu_grad_f(v); }
};
struct gelu_op {
    __device__ float operator()(float v) const { return gelu_f(v); }
};
struct gelu_grad_op {
    __device__ float operator()(float v) const { return gelu_grad_f(v); }
};
struct quick_gelu_op {
    __device__ float operator()(float v) const { return quick_gelu_f(v); }
};
struct quick_gelu_grad_op {
    __device__ float operator()(float v) const { return quick_gelu_grad_f(v); }
};

/* y[i] = f(x[i]) */
template <typename T, typename F>
static __global__ void unary_kernel(int64_t n, const T *x, T *y, F f)
{
    GRID_STRIDE_LOOP(i, n)
    {
        sd_st(y, i, f(sd_ld(x, i)));
    }
}

/* dx[i] (+)= dy[i] * f'(x[i]) */
template <typename T, typename F>
static __global__ void unary_grad_kernel(int64_t n, const T *x, const T *dy, T *dx,
                                         int accumulate, F fgrad)
{
    GRID_STRIDE_LOOP(i, n)
    {
        float g = sd_ld(dy, i) * fgrad(sd_ld(x, i));
        sd_st(dx, i, accumulate ? sd_ld(dx, i) + g : g);
    }
}

template <typename F>
static void launch_unary(const sd_backend *be, int64_t n, const void *x, void *y, F f)
{
    if (n <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        unary_kernel<T, F><<<grid, EW_THREADS, 0, s>>>(n, (const T *)x, (T *)y, f);
    });
    SD_CUDA_LAUNCHED(be);
}

template <typename F>
static void launch_unary_grad(const sd_backend *be, int64_t n, const void *x, const void *dy,
                              void *dx, int accumulate, F fgrad)
{
    if (n <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        unary_grad_kernel<T, F><<<grid, EW_THREADS, 0, s>>>(n, (const T *)x, (const T *)dy,
                                                             (T *)dx, accumulate, fgrad);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_silu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    launch_unary(be, n, x, y, silu_op());
}

static void cuda_silu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy,
                               void *dx, int accumulate)
{
    launch_unary_grad(be, n, x, dy, dx, accumulate, silu_grad_op());
}

static void cuda_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    launch_unary(be, n, x, y, gelu_op());
}

static void cuda_gelu_backward(const sd_backend *be, int64_t n, const void *x, const void *dy,
                               void *dx, int accumulate)
{
    launch_unary_grad(be, n, x, dy, dx, accumulate, gelu_grad_op());
}

static void cuda_quick_gelu_forward(const sd_backend *be, int64_t n, const void *x, void *y)
{
    launch_unary(be, n, x, y, quick_gelu_op());
}

static void cuda_quick_gelu_backward(const sd_backend *be, int64_t n, const void *x,
                                     const void *dy, void *dx, int accumulate)
{
    launch_unary_grad(be, n, x, dy, dx, accumulate, quick_gelu_grad_op());
}

/* ---- GEGLU: x [rows, 2 inner] = [value | gate], y = value * GELU(gate) ---------------------- */

/* row-wise (cuda_internal.h): row r on grid y, column j of `inner` on x */
template <typename T>
static __global__ void geglu_fwd_kernel(int64_t rows, int inner, const T *x, T *y)
{
    const int j = SD_COL_INDEX();
    if (j >= inner)
        return;
    SD_ROW_LOOP(r, rows)
    {
        const int64_t base = r * 2 * inner + j;
        sd_st(y, r * inner + j, sd_ld(x, base) * gelu_f(sd_ld(x, base + inner)));
    }
}

template <typename T>
static __global__ void geglu_bwd_kernel(int64_t rows, int inner, const T *x, const T *dy, T *dx,
                                        int accumulate)
{
    const int j = SD_COL_INDEX();
    if (j >= inner)
        return;
    SD_ROW_LOOP(r, rows)
    {
        const int64_t vi = r * 2 * inner + j, gi = vi + inner;
        const float d = sd_ld(dy, r * inner + j), gate = sd_ld(x, gi);
        float a = d * gelu_f(gate);
        float g = d * sd_ld(x, vi) * gelu_grad_f(gate);
        sd_st(dx, vi, accumulate ? sd_ld(dx, vi) + a : a);
        sd_st(dx, gi, accumulate ? sd_ld(dx, gi) + g : g);
    }
}

static void cuda_geglu_forward(const sd_backend *be, int64_t rows, int inner, const void *x,
                               void *y)
{
    if (rows <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads(inner);
    const dim3 grid = sd_cuda_row_grid(rows, inner, threads, 1, SD_GRID_Y_MAX);
    SD_CUDA_DISPATCH(be, T, {
        geglu_fwd_kernel<T><<<grid, threads, 0, s>>>(rows, inner, (const T *)x, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_geglu_backward(const sd_backend *be, int64_t rows, int inner, const void *x,
                                const void *dy, void *dx, int accumulate)
{
    if (rows <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads(inner);
    const dim3 grid = sd_cuda_row_grid(rows, inner, threads, 1, SD_GRID_Y_MAX);
    SD_CUDA_DISPATCH(be, T, {
        geglu_bwd_kernel<T><<<grid, threads, 0, s>>>(rows, inner, (const T *)x, (const T *)dy,
                                                     (T *)dx, accumulate);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- nearest resize --------------------------------------------------------------------------
 * PyTorch's source index, bit for bit the CPU's nearest_src: the float division and floorf are
 * IEEE-exact on the device too (no fast math), so both backends pick the same cells. */
static __device__ __forceinline__ int nearest_src(int dst, int in, int out)
{
    if (out == in)
        return dst;
    if (out == 2 * in)
        return dst >> 1;
    float scale = (float)in / (float)out;
    int src = (int)floorf((float)dst * scale);
    return src < in - 1 ? src : in - 1;
}

/* The first destination index whose source is >= s (out when none). nearest_src is
 * non-decreasing, so start from the exact-arithmetic guess and walk to the boundary: the walk
 * is what makes the answer exact, the guess only makes it short. */
static __device__ __forceinline__ int nearest_first_dst(int s, int in, int out)
{
    int64_t guess = (int64_t)s * out / in;
    int d = guess < out ? (int)guess : out - 1;
    while (d > 0 && nearest_src(d - 1, in, out) >= s)
        d--;
    while (d < out && nearest_src(d, in, out) < s)
        d++;
    return d;
}

/* A pure copy in chunks of U (cu a pixel); row-wise: output row oy of image z on grid y, the
 * row's chunks on x. */
template <typename U>
static __global__ void upsample_fwd_kernel(int h, int w, int h_out, int w_out, int cu, const U *x,
                                           U *y)
{
    const int j = SD_COL_INDEX();
    if (j >= w_out * cu)
        return;
    const int ox = j / cu, k = j - ox * cu, ix = nearest_src(ox, w, w_out);
    const int64_t b = blockIdx.z;
    SD_ROW_LOOP(oy, h_out)
    {
        const int iy = nearest_src((int)oy, h, h_out);
        y[(b * h_out + oy) * w_out * cu + j] = x[((b * h + iy) * w + ix) * cu + k];
    }
}

/* Gather: each input cell sums the output cells that copied it, in (output row, output
 * column) order as the CPU does, starting from the old dx when accumulating. Row-wise: input
 * row iy of image z on grid y, the row's w * c elements on x. */
template <typename T>
static __global__ void upsample_bwd_kernel(int h, int w, int c, int h_out, int w_out, const T *dy,
                                           T *dx, int accumulate)
{
    const int j = SD_COL_INDEX();
    if (j >= w * c)
        return;
    const int ix = j / c, ch = j - ix * c, ox0 = nearest_first_dst(ix, w, w_out);
    const int64_t b = blockIdx.z;
    SD_ROW_LOOP(row, h)
    {
        const int iy = (int)row, oy0 = nearest_first_dst(iy, h, h_out);
        const int64_t i = (b * h + iy) * w * c + j;
        float s = accumulate ? sd_ld(dx, i) : 0.0f;
        for (int oy = oy0; oy < h_out && nearest_src(oy, h, h_out) == iy; oy++)
            for (int ox = ox0; ox < w_out && nearest_src(ox, w, w_out) == ix; ox++)
                s += sd_ld(dy, ((b * h_out + oy) * w_out + ox) * c + ch);
        sd_st(dx, i, s);
    }
}

static void cuda_upsample_nearest_forward(const sd_backend *be, int n, int h, int w, int c,
                                          int h_out, int w_out, const void *x, void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    const size_t pixel = (size_t)c * sd_cuda_elem(be);
    const int u = sd_cuda_chunk_bytes(pixel, x, y), cu = (int)(pixel / (size_t)u);
    const int threads = sd_cuda_row_threads((int64_t)w_out * cu);
    const dim3 grid = sd_cuda_row_grid(h_out, (int64_t)w_out * cu, threads, n, SD_GRID_Y_MAX);
    SD_CHECK(n < 65536 && (int64_t)w_out * c < INT32_MAX, "upsample: %d images of %d x %d x %d: "
             "out of the kernel's range", n, h_out, w_out, c);
    SD_CUDA_CHUNK_DISPATCH(u, U, {
        upsample_fwd_kernel<U><<<grid, threads, 0, s>>>(h, w, h_out, w_out, cu, (const U *)x,
                                                        (U *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_upsample_nearest_backward(const sd_backend *be, int n, int h, int w, int c,
                                           int h_out, int w_out, const void *dy, void *dx,
                                           int accumulate)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads((int64_t)w * c);
    const dim3 grid = sd_cuda_row_grid(h, (int64_t)w * c, threads, n, SD_GRID_Y_MAX);
    SD_CHECK(n < 65536 && (int64_t)w * c < INT32_MAX, "upsample backward: %d images of %d x %d x "
             "%d: out of the kernel's range", n, h, w, c);
    SD_CUDA_DISPATCH(be, T, {
        upsample_bwd_kernel<T><<<grid, threads, 0, s>>>(h, w, c, h_out, w_out, (const T *)dy,
                                                        (T *)dx, accumulate);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- timestep embedding ------------------------------------------------------------------- */

/* y[i, j]: the rounding steps of cpu_timestep_embedding (neg_log_period and divisor rounded to
 * float on the host; freq = exp(neg_log_period * k / divisor) rounded to float, arg = t * freq,
 * then * scale). The exponential is taken in double and rounded once, which is the correctly
 * rounded float (libm's expf, within 1 ulp, agrees for nearly every k): a 1-ulp difference in
 * freq would move arg = 1000 * freq by 6e-5 and sin(arg) by as much, 1000 times the rounding
 * error of the result, while sinf/cosf themselves add only 1-2 ulp. */
template <typename T>
static __global__ void timestep_kernel(int n, int dim, int half, int flip, float neg_log_period,
                                       float divisor, float scale, const float *t, T *y)
{
    GRID_STRIDE_LOOP(idx, (int64_t)n * dim)
    {
        int i = (int)(idx / dim), j = (int)(idx % dim);
        float v = 0.0f; /* the zero pad of an odd dim */
        if (j < 2 * half) {
            int k = j < half ? j : j - half;
            int first = j < half; /* first half: sin, or cos with flip_sin_to_cos */
            float freq = (float)exp((double)(neg_log_period * (float)k / divisor));
            float arg = t[i] * freq;
            if (scale != 1.0f)
                arg = scale * arg;
            v = (first != (flip != 0)) ? sinf(arg) : cosf(arg);
        }
        sd_st(y, idx, v);
    }
}

static void cuda_timestep_embedding(const sd_backend *be, int n,
                                    const sd_timestep_embedding_desc *d, const float *t, void *y)
{
    const int half = d->dim / 2;
    const float neg_log_period = (float)(-log((double)d->max_period));
    const float divisor = (float)((double)half - (double)d->downscale_freq_shift);
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, (int64_t)n * d->dim, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        timestep_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, d->dim, half, d->flip_sin_to_cos,
                                                        neg_log_period, divisor, d->scale, t,
                                                        (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- token embedding ----------------------------------------------------------------------
 * An id outside [0, vocab) is a bug upstream (the tokenizer bounds its ids): the kernel prints
 * it and traps, which ends the job at the next CUDA check rather than reading out of bounds. */
template <typename T>
static __global__ void embedding_kernel(int batch, int t, int c, int vocab, const int32_t *ids,
                                        const T *table, const T *pos, T *y)
{
    GRID_STRIDE_LOOP(i, (int64_t)batch * t * c)
    {
        int64_t tok = i / c, j = i % c;
        int id = ids[tok];
        if (id < 0 || id >= vocab) {
            printf("sdtrain CUDA embedding: token id %d at position %lld outside [0, %d)\n", id,
                   (long long)tok, vocab);
            __trap();
        }
        float v = sd_ld(table, (int64_t)id * c + j);
        if (pos)
            v = v + sd_ld(pos, (tok % t) * c + j);
        sd_st(y, i, v);
    }
}

static void cuda_embedding_forward(const sd_backend *be, int batch, int t, int c, int vocab,
                                   const int32_t *ids, const void *table, const void *pos_table,
                                   void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, (int64_t)batch * t * c, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        embedding_kernel<T><<<grid, EW_THREADS, 0, s>>>(batch, t, c, vocab, ids,
                                                         (const T *)table,
                                                         (const T *)pos_table, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- arithmetic --------------------------------------------------------------------------- */

template <typename T>
static __global__ void add_kernel(int64_t n, const T *a, const T *b, float divisor, T *y)
{
    GRID_STRIDE_LOOP(i, n)
    {
        float v = sd_ld(a, i) + sd_ld(b, i);
        sd_st(y, i, divisor == 1.0f ? v : v / divisor);
    }
}

/* beta == 0 never reads y (it may hold NaN) */
template <typename T>
static __global__ void axpby_kernel(int64_t n, float alpha, const T *x, float beta, T *y)
{
    GRID_STRIDE_LOOP(i, n)
    {
        float v = alpha * sd_ld(x, i);
        if (beta != 0.0f)
            v = v + beta * sd_ld(y, i);
        sd_st(y, i, v);
    }
}

static void cuda_add(const sd_backend *be, int64_t n, const void *a, const void *b,
                     float divisor, void *y)
{
    if (n <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        add_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, (const T *)a, (const T *)b, divisor, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_axpby(const sd_backend *be, int64_t n, float alpha, const void *x, float beta,
                       void *y)
{
    if (n <= 0)
        return;
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        axpby_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, alpha, (const T *)x, beta, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- broadcast add and its backward --------------------------------------------------------- */

/* row-wise: row r of sample z on grid y, channel on x */
template <typename T>
static __global__ void add_bcast_kernel(int64_t rows, int c, const T *x, const T *v, T *y)
{
    const int ch = SD_COL_INDEX();
    if (ch >= c)
        return;
    const int64_t b = blockIdx.z;
    const float vb = sd_ld(v, b * c + ch);
    SD_ROW_LOOP(r, rows)
    {
        const int64_t i = (b * rows + r) * c + ch;
        sd_st(y, i, sd_ld(x, i) + vb);
    }
}

static void cuda_add_bcast_forward(const sd_backend *be, int n, int64_t rows, int c,
                                   const void *x, const void *v, void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads(c);
    const dim3 grid = sd_cuda_row_grid(rows, c, threads, n, SD_GRID_Y_MAX);
    SD_CHECK(n < 65536, "add_bcast: %d samples: too many", n);
    SD_CUDA_DISPATCH(be, T, {
        add_bcast_kernel<T><<<grid, threads, 0, s>>>(rows, c, (const T *)x, (const T *)v,
                                                     (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* dv[b, c] (+)= sum over rows of dy[b, rows, c], deterministic like sd_cuda_colsum (which
 * writes fp32; dv here is of the backend's dtype): rows cut into chunks of BCAST_ROWS, block
 * (x, p, b) sums chunk p of channels [32x, 32x + 32) of sample b (8 row lanes, then a fixed
 * tree), a second kernel adds each channel's chunk partials in chunk order and rounds once. */
#define BCAST_ROWS 256

static int64_t bcast_chunks(int64_t rows)
{
    return (rows + BCAST_ROWS - 1) / BCAST_ROWS;
}

static size_t cuda_add_bcast_backward_scratch(const sd_backend *be, int n, int64_t rows, int c)
{
    (void)be;
    return sd_cuda_align((size_t)n * (size_t)bcast_chunks(rows) * (size_t)c * sizeof(float));
}

template <typename T>
static __global__ void bcast_partial_kernel(int64_t rows, int c, int64_t chunks, const T *dy,
                                            float *partial)
{
    __shared__ float acc[8][33];
    const int ch = blockIdx.x * 32 + threadIdx.x;
    const int64_t b = blockIdx.z, p = blockIdx.y;
    const int64_t r0 = p * BCAST_ROWS;
    const int64_t r1 = r0 + BCAST_ROWS < rows ? r0 + BCAST_ROWS : rows;
    const T *dyb = dy + b * rows * c;
    float s = 0.0f;
    if (ch < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
            s += sd_ld(dyb, r * c + ch);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        float t = ((acc[0][threadIdx.x] + acc[1][threadIdx.x]) +
                   (acc[2][threadIdx.x] + acc[3][threadIdx.x])) +
                  ((acc[4][threadIdx.x] + acc[5][threadIdx.x]) +
                   (acc[6][threadIdx.x] + acc[7][threadIdx.x]));
        partial[(b * chunks + p) * c + ch] = t;
    }
}

template <typename T>
static __global__ void bcast_finish_kernel(int n, int c, int64_t chunks, const float *partial,
                                           T *dv, int accumulate)
{
    GRID_STRIDE_LOOP(i, (int64_t)n * c)
    {
        int64_t b = i / c, ch = i % c;
        float s = 0.0f;
        for (int64_t p = 0; p < chunks; p++)
            s += partial[(b * chunks + p) * c + ch];
        sd_st(dv, i, accumulate ? sd_ld(dv, i) + s : s);
    }
}

static void cuda_add_bcast_backward(const sd_backend *be, int n, int64_t rows, int c,
                                    const void *dy, void *dv, int accumulate, sd_scratch ws)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int64_t chunks = bcast_chunks(rows);
    SD_CHECK(chunks < 65536 && n < 65536, "add_bcast backward: %d samples of %lld rows: too many",
             n, (long long)rows);
    float *partial = (float *)ws.ptr;
    dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks, (unsigned)n), block(32, 8);
    unsigned fgrid = sd_cuda_grid(be, (int64_t)n * c, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        bcast_partial_kernel<T><<<grid, block, 0, s>>>(rows, c, chunks, (const T *)dy, partial);
        SD_CUDA_LAUNCHED(be);
        bcast_finish_kernel<T><<<fgrid, EW_THREADS, 0, s>>>(n, c, chunks, partial, (T *)dv,
                                                             accumulate);
        SD_CUDA_LAUNCHED(be);
    });
}

/* ---- channel concat / split ----------------------------------------------------------------- */

/* row-wise: row r on grid y, output column j on x */
template <typename T>
static __global__ void concat_kernel(int64_t rows, int c1, int c2, const T *a, const T *b, T *y)
{
    const int j = SD_COL_INDEX(), cw = c1 + c2;
    if (j >= cw)
        return;
    SD_ROW_LOOP(r, rows)
    {
        const float v = j < c1 ? sd_ld(a, r * c1 + j) : sd_ld(b, r * c2 + (j - c1));
        sd_st(y, r * cw + j, v);
    }
}

/* out[r, j] (+)= x[r, offset + j] for j < width, x rows of `cw`; row-wise like concat */
template <typename T>
static __global__ void split_kernel(int64_t rows, int cw, int offset, int width, const T *x,
                                    T *out, int accumulate)
{
    const int j = SD_COL_INDEX();
    if (j >= width)
        return;
    SD_ROW_LOOP(r, rows)
    {
        const int64_t o = r * width + j;
        const float v = sd_ld(x, r * cw + offset + j);
        sd_st(out, o, accumulate ? sd_ld(out, o) + v : v);
    }
}

static void cuda_concat_channels(const sd_backend *be, int64_t rows, int c1, int c2,
                                 const void *a, const void *b, void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads(c1 + c2);
    const dim3 grid = sd_cuda_row_grid(rows, c1 + c2, threads, 1, SD_GRID_Y_MAX);
    SD_CUDA_DISPATCH(be, T, {
        concat_kernel<T><<<grid, threads, 0, s>>>(rows, c1, c2, (const T *)a, (const T *)b,
                                                  (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

static void split_part(const sd_backend *be, int64_t rows, int cw, int offset, int width,
                       const void *x, void *out, int accumulate)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int threads = sd_cuda_row_threads(width);
    const dim3 grid = sd_cuda_row_grid(rows, width, threads, 1, SD_GRID_Y_MAX);
    SD_CUDA_DISPATCH(be, T, {
        split_kernel<T><<<grid, threads, 0, s>>>(rows, cw, offset, width, (const T *)x, (T *)out,
                                                 accumulate);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_split_channels(const sd_backend *be, int64_t rows, int c1, int c2,
                                const void *x, void *a, void *b, int accumulate)
{
    if (a)
        split_part(be, rows, c1 + c2, 0, c1, x, a, accumulate);
    if (b)
        split_part(be, rows, c1 + c2, c1, c2, x, b, accumulate);
}

/* ---- layout permutes (one thread per output element: coalesced writes, strided reads) ---- */

template <typename T>
static __global__ void nchw_to_nhwc_kernel(int n, int c, int64_t plane, const T *x, T *y)
{
    GRID_STRIDE_LOOP(i, (int64_t)n * c * plane)
    {
        int64_t ch = i % c, pix = i / c; /* pix = b * plane + p */
        int64_t b = pix / plane, p = pix % plane;
        sd_st(y, i, sd_ld(x, (b * c + ch) * plane + p));
    }
}

template <typename T>
static __global__ void nhwc_to_nchw_kernel(int n, int c, int64_t plane, const T *x, T *y)
{
    GRID_STRIDE_LOOP(i, (int64_t)n * c * plane)
    {
        int64_t p = i % plane, bc = i / plane; /* bc = b * c + ch */
        int64_t b = bc / c, ch = bc % c;
        sd_st(y, i, sd_ld(x, (b * plane + p) * c + ch));
    }
}

static void cuda_nchw_to_nhwc(const sd_backend *be, int n, int c, int h, int w, const void *x,
                              void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int64_t plane = (int64_t)h * w;
    unsigned grid = sd_cuda_grid(be, (int64_t)n * c * plane, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        nchw_to_nhwc_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, c, plane, (const T *)x, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

static void cuda_nhwc_to_nchw(const sd_backend *be, int n, int c, int h, int w, const void *x,
                              void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    const int64_t plane = (int64_t)h * w;
    unsigned grid = sd_cuda_grid(be, (int64_t)n * c * plane, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        nhwc_to_nchw_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, c, plane, (const T *)x, (T *)y);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- VAE posterior sample ------------------------------------------------------------------- */

/* z = scale * (mean + exp(0.5 clamp(logvar, -30, 20)) eps), or scale * mean without eps */
template <typename T>
static __global__ void gaussian_sample_kernel(int64_t rows, int c, const T *moments, const T *eps,
                                              float scale, T *z)
{
    GRID_STRIDE_LOOP(i, rows * c)
    {
        int64_t r = i / c, j = i % c;
        float s = sd_ld(moments, r * 2 * c + j);
        if (eps) {
            float lv = sd_ld(moments, r * 2 * c + c + j);
            lv = lv < -30.0f ? -30.0f : (lv > 20.0f ? 20.0f : lv);
            s = s + expf(0.5f * lv) * sd_ld(eps, i);
        }
        sd_st(z, i, s * scale);
    }
}

static void cuda_diag_gaussian_sample(const sd_backend *be, int64_t rows, int c,
                                      const void *moments, const void *eps, float scale, void *z)
{
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, rows * c, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, {
        gaussian_sample_kernel<T><<<grid, EW_THREADS, 0, s>>>(rows, c, (const T *)moments,
                                                               (const T *)eps, scale, (T *)z);
    });
    SD_CUDA_LAUNCHED(be);
}

/* ---- fp32 -> compute type ------------------------------------------------------------------ */

template <typename T>
static __global__ void cast_f32_kernel(int64_t n, const float *x, T *y)
{
    GRID_STRIDE_LOOP(i, n)
    sd_st(y, i, x[i]);
}

static void cuda_cast_f32(const sd_backend *be, int64_t n, const float *x, void *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    if (sd_cuda(be)->dtype == SD_F32) {
        SD_CUDA_CHECK(cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        SD_CUDA_LAUNCHED(be); /* as every op: SDTRAIN_CUDA_SYNC's wait */
        return;
    }
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, { cast_f32_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, x, (T *)y); });
    SD_CUDA_LAUNCHED(be);
}

template <typename T>
static __global__ void cast_to_f32_kernel(int64_t n, const T *x, float *y)
{
    GRID_STRIDE_LOOP(i, n)
    y[i] = sd_ld(x, i);
}

static void cuda_cast_to_f32(const sd_backend *be, int64_t n, const void *x, float *y)
{
    cudaStream_t s = sd_cuda_stream(be);
    if (sd_cuda(be)->dtype == SD_F32) {
        SD_CUDA_CHECK(cudaMemcpyAsync(y, x, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice, s));
        SD_CUDA_LAUNCHED(be); /* as every op: SDTRAIN_CUDA_SYNC's wait */
        return;
    }
    unsigned grid = sd_cuda_grid(be, n, EW_THREADS);
    SD_CUDA_DISPATCH(be, T, { cast_to_f32_kernel<T><<<grid, EW_THREADS, 0, s>>>(n, (const T *)x, y); });
    SD_CUDA_LAUNCHED(be);
}

/* ---- the diffusion objective ---------------------------------------------------------------- */

#define MSE_THREADS 256

/* One block per sample: dy = coef * (2 (pred - target)) in fp32 steps as the CPU rounds them,
 * and the squares (differences in double, as sd_diffusion_loss forms them) summed in double:
 * each thread a fixed strided subset, then a fixed tree over the block, so the result depends
 * on the shape only. */
template <typename T>
static __global__ void mse_loss_kernel(int64_t per, const T *pred, const float *target,
                                       const float *coef, float *mse, T *dy)
{
    __shared__ double part[MSE_THREADS];
    const int b = blockIdx.x;
    const T *p = pred + (size_t)b * per;
    const float *t = target + (size_t)b * per;
    const float g = dy ? coef[b] : 0.0f;
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < per; i += MSE_THREADS) {
        const float pv = sd_ld(p, i), tv = t[i];
        const double e = (double)pv - (double)tv;
        sum += e * e;
        if (dy) {
            const float two = 2.0f * (pv - tv);
            sd_st(dy + (size_t)b * per, i, __fmul_rn(two, g));
        }
    }
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = MSE_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        mse[b] = (float)(part[0] / (double)per);
}

static void cuda_mse_loss(const sd_backend *be, int n, int64_t hw, int c, const void *pred,
                          const float *target, const float *coef, float *mse, void *dy)
{
    cudaStream_t s = sd_cuda_stream(be);
    SD_CUDA_DISPATCH(be, T, {
        mse_loss_kernel<T><<<n, MSE_THREADS, 0, s>>>(hw * c, (const T *)pred, target, coef, mse,
                                                     (T *)dy);
    });
    SD_CUDA_LAUNCHED(be);
}

void sd_cuda_fill_elementwise_ops(sd_ops *ops)
{
    ops->silu_forward = cuda_silu_forward;
    ops->silu_backward = cuda_silu_backward;
    ops->gelu_forward = cuda_gelu_forward;
    ops->gelu_backward = cuda_gelu_backward;
    ops->quick_gelu_forward = cuda_quick_gelu_forward;
    ops->quick_gelu_backward = cuda_quick_gelu_backward;
    ops->geglu_forward = cuda_geglu_forward;
    ops->geglu_backward = cuda_geglu_backward;
    ops->upsample_nearest_forward = cuda_upsample_nearest_forward;
    ops->upsample_nearest_backward = cuda_upsample_nearest_backward;
    ops->timestep_embedding = cuda_timestep_embedding;
    ops->embedding_forward = cuda_embedding_forward;
    ops->add = cuda_add;
    ops->axpby = cuda_axpby;
    ops->cast_f32 = cuda_cast_f32;
    ops->cast_to_f32 = cuda_cast_to_f32;
    ops->mse_loss = cuda_mse_loss;
    ops->add_bcast_forward = cuda_add_bcast_forward;
    ops->add_bcast_backward_scratch = cuda_add_bcast_backward_scratch;
    ops->add_bcast_backward = cuda_add_bcast_backward;
    ops->concat_channels = cuda_concat_channels;
    ops->split_channels = cuda_split_channels;
    ops->nchw_to_nhwc = cuda_nchw_to_nhwc;
    ops->nhwc_to_nchw = cuda_nhwc_to_nchw;
    ops->diag_gaussian_sample = cuda_diag_gaussian_sample;
}
