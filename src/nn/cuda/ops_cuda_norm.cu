/* CUDA group norm and layer norm (forward and backward), and the deterministic column sums
 * that bias gradients use. Statistics and sums in fp32 whatever the tensor type. */
#include "cuda_internal.h"

/* ---- column sums ---------------------------------------------------------------------------
 * db[c] = sum over rows of dy[r, c]. Rows are cut into chunks of COLSUM_ROWS; block (x, p) sums
 * chunk p of channels [32x, 32x + 32) into partial[p, c] (8 row lanes, then a fixed-order tree in
 * shared memory); a second kernel adds the partials of each channel in chunk order. The split
 * depends on the shape only, so the result is the same on every run and every GPU. */
#define COLSUM_ROWS 256

size_t sd_cuda_colsum_scratch(int64_t rows, int c)
{
    int64_t chunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    return sd_cuda_align((size_t)chunks * (size_t)c * sizeof(float));
}

template <typename T>
static __global__ void colsum_partial_kernel(int64_t rows, int c, const T *dy, float *partial)
{
    __shared__ float acc[8][33];
    int ch = blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * COLSUM_ROWS;
    int64_t r1 = r0 + COLSUM_ROWS < rows ? r0 + COLSUM_ROWS : rows;
    float s = 0.0f;
    if (ch < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8)
            s += sd_ld(dy, r * c + ch);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        float t = ((acc[0][threadIdx.x] + acc[1][threadIdx.x]) +
                   (acc[2][threadIdx.x] + acc[3][threadIdx.x])) +
                  ((acc[4][threadIdx.x] + acc[5][threadIdx.x]) +
                   (acc[6][threadIdx.x] + acc[7][threadIdx.x]));
        partial[(int64_t)blockIdx.y * c + ch] = t;
    }
}

static __global__ void colsum_finish_kernel(int64_t chunks, int c, const float *partial, float *db,
                                            int accumulate)
{
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= c)
        return;
    float s = 0.0f;
    for (int64_t p = 0; p < chunks; p++)
        s += partial[p * c + ch];
    db[ch] = accumulate ? db[ch] + s : s;
}

void sd_cuda_colsum(const sd_backend *be, int64_t rows, int c, const void *dy, float *db,
                    int accumulate, void *scratch)
{
    cudaStream_t s = sd_cuda_stream(be);
    int64_t chunks = (rows + COLSUM_ROWS - 1) / COLSUM_ROWS;
    SD_CHECK(chunks < 65536, "column sum over %lld rows: too many chunks", (long long)rows);
    float *partial = (float *)scratch;
    if (chunks > 0) {
        dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks), block(32, 8);
        SD_CUDA_DISPATCH(be, T, {
            colsum_partial_kernel<T><<<grid, block, 0, s>>>(rows, c, (const T *)dy, partial);
        });
        SD_CUDA_LAUNCHED(be);
    }
    colsum_finish_kernel<<<(c + 255) / 256, 256, 0, s>>>(chunks, c, partial, db, accumulate);
    SD_CUDA_LAUNCHED(be);
}

/* ---- shared pieces of the norms -------------------------------------------------------------
 * Every reduction over rows (group statistics, the backward sums, dgamma/dbeta) goes through one
 * pattern, the column sum above generalised: per-(sample, channel) sums of NV derived values
 * f(x, dy, ...) over the sample's rows, cut into chunks of NORM_ROWS rows; block (x, p, b) sums
 * chunk p of channels [32x, 32x + 32) of sample b into partial[b, p, k, c] (8 row lanes, then a
 * fixed tree); later kernels add the chunk partials of a channel in chunk order (in double) and,
 * for groups, the channels of a group in channel order. Reads are coalesced along channels, and
 * the split depends on the shape only: the same bits on every run. */
#define NORM_ROWS 256
#define NORM_THREADS 256

#define NORM_LOOP(i, n)                                                                        \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                  \
         i += (int64_t)gridDim.x * blockDim.x)

static int64_t norm_chunks(int64_t rows)
{
    return (rows + NORM_ROWS - 1) / NORM_ROWS;
}

/* f(b, r, ch, i, v): sample b, global row r (= b * rows + row in the sample), channel ch,
 * element index i = r * c + ch; fills v[0, NV). */
template <int NV, typename F>
static __global__ void norm_colpartial_kernel(int64_t rows, int c, int64_t chunks, F f,
                                              float *partial)
{
    __shared__ float acc[NV][8][33];
    const int ch = blockIdx.x * 32 + threadIdx.x;
    const int64_t b = blockIdx.z, p = blockIdx.y;
    const int64_t r0 = p * NORM_ROWS;
    const int64_t r1 = r0 + NORM_ROWS < rows ? r0 + NORM_ROWS : rows;
    float s[NV];
    for (int k = 0; k < NV; k++)
        s[k] = 0.0f;
    if (ch < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            const int64_t gr = b * rows + r;
            float v[NV];
            f(b, gr, ch, gr * c + ch, v);
            for (int k = 0; k < NV; k++)
                s[k] += v[k];
        }
    for (int k = 0; k < NV; k++)
        acc[k][threadIdx.y][threadIdx.x] = s[k];
    __syncthreads();
    if (threadIdx.y == 0 && ch < c)
        for (int k = 0; k < NV; k++) {
            const int x = threadIdx.x;
            float t = ((acc[k][0][x] + acc[k][1][x]) + (acc[k][2][x] + acc[k][3][x])) +
                      ((acc[k][4][x] + acc[k][5][x]) + (acc[k][6][x] + acc[k][7][x]));
            partial[((b * chunks + p) * NV + k) * c + ch] = t;
        }
}

template <int NV, typename F>
static void norm_colpartial(const sd_backend *be, int n, int64_t rows, int c, F f,
                            float *partial)
{
    const int64_t chunks = norm_chunks(rows);
    SD_CHECK(chunks < 65536 && n < 65536, "norm reduction over %d x %lld rows: too many", n,
             (long long)rows);
    dim3 grid((unsigned)((c + 31) / 32), (unsigned)chunks, (unsigned)n), block(32, 8);
    norm_colpartial_kernel<NV, F><<<grid, block, 0, sd_cuda_stream(be)>>>(rows, c, chunks, f,
                                                                          partial);
    SD_CUDA_LAUNCHED(be);
}

/* tot[b, k, ch] = sum over chunks (in order) of partial[b, p, k, ch] */
static __global__ void norm_chunk_sum_kernel(int n, int nv, int c, int64_t chunks,
                                             const float *partial, float *tot)
{
    NORM_LOOP(i, (int64_t)n * nv * c)
    {
        const int64_t b = i / ((int64_t)nv * c), kc = i % ((int64_t)nv * c);
        double s = 0.0;
        for (int64_t p = 0; p < chunks; p++)
            s += partial[(b * chunks + p) * nv * c + kc];
        tot[i] = (float)s;
    }
}

static void norm_chunk_sum(const sd_backend *be, int n, int nv, int c, int64_t rows,
                           const float *partial, float *tot)
{
    const int64_t total = (int64_t)n * nv * c;
    norm_chunk_sum_kernel<<<sd_cuda_grid(be, total, NORM_THREADS), NORM_THREADS, 0,
                            sd_cuda_stream(be)>>>(n, nv, c, norm_chunks(rows), partial, tot);
    SD_CUDA_LAUNCHED(be);
}

/* dbeta[ch] += sum over samples of tot[b, 0, ch], dgamma[ch] += of tot[b, 1, ch] (either
 * may be NULL) */
static __global__ void norm_param_grad_kernel(int n, int c, const float *tot, float *dgamma,
                                              float *dbeta)
{
    NORM_LOOP(ch, (int64_t)c)
    {
        double s0 = 0.0, s1 = 0.0;
        for (int64_t b = 0; b < n; b++) {
            s0 += tot[(b * 2 + 0) * c + ch];
            s1 += tot[(b * 2 + 1) * c + ch];
        }
        if (dbeta)
            dbeta[ch] = (float)((double)dbeta[ch] + s0);
        if (dgamma)
            dgamma[ch] = (float)((double)dgamma[ch] + s1);
    }
}

static void norm_param_grad(const sd_backend *be, int n, int c, const float *tot, float *dgamma,
                            float *dbeta)
{
    if (!dgamma && !dbeta)
        return;
    norm_param_grad_kernel<<<sd_cuda_grid(be, c, NORM_THREADS), NORM_THREADS, 0,
                             sd_cuda_stream(be)>>>(n, c, tot, dgamma, dbeta);
    SD_CUDA_LAUNCHED(be);
}

/* Carves 256-aligned pieces from a scratch block, in the order the size query adds them. */
static char *norm_carve(char **cursor, size_t bytes)
{
    char *p = *cursor;
    *cursor += sd_cuda_align(bytes);
    return p;
}

static __device__ __forceinline__ float norm_silu(float v)
{
    return v / (1.0f + expf(-v));
}

/* SiLU with the hardware approximations (SDTRAIN_CUDA_GN_APPLY=fast): ex2.approx for the
 * exponential and an approximate reciprocal for the division, a few ulps from norm_silu. For
 * v < -87 (where expf(-v) overflows) __fdividef returns 0, the limit. */
static __device__ __forceinline__ float norm_silu_fast(float v)
{
    return __fdividef(v, 1.0f + __expf(-v));
}

static __device__ __forceinline__ float norm_silu_grad(float v)
{
    float s = 1.0f / (1.0f + expf(-v));
    return s * (1.0f + v * (1.0f - s));
}

/* ---- group norm ------------------------------------------------------------------------------
 * Forward: per-channel sums of x -> group means; per-channel sums of (x - mean)^2 -> group rstd
 * (two passes, biased variance); then one elementwise kernel for the affine map and the SiLU.
 * Backward: per-channel sums of dz and dz * xhat (dz = dy, or dy * silu'(pre) when fused,
 * pre-SiLU value recomputed from x, mean, rstd, gamma, beta), from which come the per-group
 * coefficients, dgamma/dbeta, and dx = rstd (gamma dz - mean(gamma dz) - xhat mean(gamma dz
 * xhat)), as the CPU backend does. */

template <typename T>
struct gn_load_x {
    const T *x;
    __device__ void operator()(int64_t b, int64_t r, int ch, int64_t i, float *v) const
    {
        v[0] = sd_ld(x, i);
    }
};

template <typename T>
struct gn_sq_dev {
    const T *x;
    const float *mean;
    int groups, cg;
    __device__ void operator()(int64_t b, int64_t r, int ch, int64_t i, float *v) const
    {
        float d = sd_ld(x, i) - mean[b * groups + ch / cg];
        v[0] = d * d;
    }
};

/* dz and xhat of one element (gn_dz of the CPU backend) */
/* The per-element arithmetic of group norm, one function each, shared by every kernel variant
 * (scalar, 16-byte, registers) so that they all round alike. gamma / beta take part only where
 * given (has_g, has_b).
 * gn_apply_one: (x - m) r, times gamma, plus beta, then SiLU when asked (FAST: the approximate
 *   one); gn_dz_one: xhat = (x - m) rs and dz = dy (times SiLU' of the affine xhat with silu);
 *   gn_dx_one: rs (gamma dz - c1 - xhat c2), the input gradient from the group coefficients. */
/* Each product and sum is an explicitly rounded intrinsic: ptxas would otherwise fuse some of
 * them into an FMA depending on the code around each inlined copy, and the variants (and the
 * CPU backend, which rounds each operation) would differ in the last bit. */
template <bool FAST>
static __device__ __forceinline__ float gn_apply_one(float x, float m, float r, bool has_g,
                                                     float g, bool has_b, float b, int silu)
{
    float o = __fmul_rn(__fsub_rn(x, m), r);
    if (has_g)
        o = __fmul_rn(o, g);
    if (has_b)
        o = __fadd_rn(o, b);
    return silu ? (FAST ? norm_silu_fast(o) : norm_silu(o)) : o;
}

static __device__ __forceinline__ float gn_dz_one(float x, float dy, float m, float rs,
                                                  bool has_g, float g, bool has_b, float b,
                                                  int silu, float *xh)
{
    const float h = __fmul_rn(__fsub_rn(x, m), rs);
    *xh = h;
    if (!silu)
        return dy;
    float z = h;
    if (has_g)
        z = __fmul_rn(z, g);
    if (has_b)
        z = __fadd_rn(z, b);
    return __fmul_rn(dy, norm_silu_grad(z));
}

static __device__ __forceinline__ float gn_dx_one(float dz, float xh, float rs, bool has_g,
                                                  float g, float c1, float c2)
{
    const float gg = has_g ? __fmul_rn(dz, g) : dz;
    return __fmul_rn(rs, __fsub_rn(__fsub_rn(gg, c1), __fmul_rn(xh, c2)));
}

template <typename T>
static __device__ __forceinline__ float gn_dz(const T *x, const T *dy, const T *gamma,
                                              const T *beta, float m, float rs, int silu,
                                              int ch, int64_t i, float *xh)
{
    return gn_dz_one(sd_ld(x, i), sd_ld(dy, i), m, rs, gamma != nullptr,
                     gamma ? sd_ld(gamma, ch) : 1.0f, beta != nullptr,
                     beta ? sd_ld(beta, ch) : 0.0f, silu, xh);
}

template <typename T>
struct gn_bwd_sums {
    const T *x, *dy, *gamma, *beta;
    const float *mean, *rstd;
    int groups, cg, silu;
    __device__ void operator()(int64_t b, int64_t r, int ch, int64_t i, float *v) const
    {
        const int64_t gi = b * groups + ch / cg;
        float xh;
        float dz = gn_dz(x, dy, gamma, beta, mean[gi], rstd[gi], silu, ch, i, &xh);
        v[0] = dz;
        v[1] = dz * xh;
    }
};

/* One block per (sample, group) adds the group's chunk partials (chunks x channels of the
 * group) in double: thread j takes elements j, j + GN_STAT_THREADS, ... of the (chunk, channel)
 * list, then a fixed-order tree in shared memory. The order depends on the shape only (the same
 * bits on every run). One thread per group doing all of them in sequence was the old way: at the
 * VAE's 256x256 levels that is 1024 dependent loads per thread on 1024 threads, about 0.3 ms a
 * pass. stage 0: mean[g] = sum / count; stage 1: rstd[g] = 1 / sqrt(sum / count + eps). */
#define GN_STAT_THREADS 256
static __global__ void gn_group_stat_kernel(int groups, int c, int64_t chunks, double count,
                                            float eps, const float *partial, int stage,
                                            float *out)
{
    __shared__ double sh[GN_STAT_THREADS];
    const int cg = c / groups;
    const int64_t t = blockIdx.x, b = t / groups, g = t % groups;
    const int64_t items = chunks * cg;
    double s = 0.0;
    for (int64_t e = threadIdx.x; e < items; e += GN_STAT_THREADS) {
        const int64_t p = e / cg;
        const int k = (int)(e - p * cg);
        s += partial[(b * chunks + p) * c + g * cg + k];
    }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int h = GN_STAT_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h)
            sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const double v = sh[0];
        out[t] = stage == 0 ? (float)(v / count) : (float)(1.0 / sqrt(v / count + (double)eps));
    }
}

/* ---- one-pass group statistics (SDTRAIN_CUDA_GN_STATS=onepass) --------------------------------
 * One read of x instead of two. Block (channel block of 32, chunk p, sample b), 32 x 8 threads as
 * the column pattern: each thread takes its channel over every 8th row of the chunk and sums
 * x - K and (x - K)^2 in fp32, K its first value (a shift inside the data keeps the sums small, so
 * M2 = q - s^2 / n loses nothing to cancellation); the 8 row lanes merge in a fixed tree with
 * Chan's formula (double) into (mean, M2) per (sample, chunk, channel). Then one block per
 * (sample, group) merges the group's (chunk, channel) pieces the same way, in a fixed order.
 * The default since it passed tests/gpu/test_cuda_elem on an H100 (2026-11-22).
 * SDTRAIN_CUDA_GN_STATS=wide (2026-11-26, not yet run on a GPU) has each thread take 4 adjacent
 * channels with one 8-byte (bf16) or 16-byte (fp32) load per row: a warp reads 256 or 512
 * contiguous bytes of a row instead of 64 or 128, four times the bytes in flight per load;
 * every channel's sums are formed in the same order, so the bits are those of onepass. */
struct gn_moments {
    double n, mean, m2;
};

static __device__ __forceinline__ gn_moments gn_merge(gn_moments a, gn_moments b)
{
    if (b.n == 0.0)
        return a;
    if (a.n == 0.0)
        return b;
    const double n = a.n + b.n, delta = b.mean - a.mean;
    gn_moments r;
    r.n = n;
    r.mean = a.mean + delta * (b.n / n);
    r.m2 = a.m2 + b.m2 + delta * delta * (a.n * b.n / n);
    return r;
}

template <typename T>
static __global__ void gn_moments_partial_kernel(int64_t rows, int c, int64_t chunks, const T *x,
                                                 float *partial)
{
    __shared__ double sh[3][8][33];
    const int ch = blockIdx.x * 32 + threadIdx.x;
    const int64_t b = blockIdx.z, p = blockIdx.y;
    const int64_t r0 = p * NORM_ROWS;
    const int64_t r1 = r0 + NORM_ROWS < rows ? r0 + NORM_ROWS : rows;
    gn_moments m = {0.0, 0.0, 0.0};
    if (ch < c) {
        const T *xb = x + b * rows * c + ch;
        float k = 0.0f, s = 0.0f, q = 0.0f;
        int cnt = 0;
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            const float v = sd_ld(xb, r * c);
            if (cnt == 0)
                k = v;
            const float d = v - k;
            s += d;
            q += d * d;
            cnt++;
        }
        if (cnt) {
            m.n = cnt;
            m.mean = (double)k + (double)s / cnt;
            const double m2 = (double)q - (double)s * (double)s / cnt;
            m.m2 = m2 > 0.0 ? m2 : 0.0;
        }
    }
    sh[0][threadIdx.y][threadIdx.x] = m.n;
    sh[1][threadIdx.y][threadIdx.x] = m.mean;
    sh[2][threadIdx.y][threadIdx.x] = m.m2;
    __syncthreads();
    if (threadIdx.y == 0 && ch < c) {
        gn_moments l[8];
        for (int y = 0; y < 8; y++)
            l[y] = {sh[0][y][threadIdx.x], sh[1][y][threadIdx.x], sh[2][y][threadIdx.x]};
        const gn_moments t = gn_merge(gn_merge(gn_merge(l[0], l[1]), gn_merge(l[2], l[3])),
                                      gn_merge(gn_merge(l[4], l[5]), gn_merge(l[6], l[7])));
        partial[((b * chunks + p) * 2 + 0) * c + ch] = (float)t.mean;
        partial[((b * chunks + p) * 2 + 1) * c + ch] = (float)t.m2;
    }
}

/* 4 consecutive elements of a row as floats (8 or 16 bytes, aligned) */
static __device__ __forceinline__ void gn_load4(const float *p, float v[4])
{
    const float4 f = *(const float4 *)p;
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
static __device__ __forceinline__ void gn_load4(const __nv_bfloat16 *p, float v[4])
{
    union {
        uint2 u;
        __nv_bfloat16 e[4];
    } b;
    b.u = *(const uint2 *)p;
    for (int j = 0; j < 4; j++)
        v[j] = __bfloat162float(b.e[j]);
}

#define GN_WIDE 4 /* channels per thread in gn_moments_partial_wide_kernel */

template <typename T>
static __global__ void gn_moments_partial_wide_kernel(int64_t rows, int c, int64_t chunks,
                                                      const T *x, float *partial)
{
    __shared__ double sh[3][8][32 * GN_WIDE + 1];
    const int ch0 = (blockIdx.x * 32 + threadIdx.x) * GN_WIDE;
    const int64_t b = blockIdx.z, p = blockIdx.y;
    const int64_t r0 = p * NORM_ROWS;
    const int64_t r1 = r0 + NORM_ROWS < rows ? r0 + NORM_ROWS : rows;
    gn_moments m[GN_WIDE];
    for (int j = 0; j < GN_WIDE; j++)
        m[j] = {0.0, 0.0, 0.0};
    if (ch0 < c) {
        const T *xb = x + b * rows * c + ch0;
        float k[GN_WIDE], sm[GN_WIDE], q[GN_WIDE];
        int cnt = 0;
        for (int j = 0; j < GN_WIDE; j++)
            k[j] = sm[j] = q[j] = 0.0f;
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
            float v[GN_WIDE];
            gn_load4(xb + r * c, v);
#pragma unroll
            for (int j = 0; j < GN_WIDE; j++) {
                if (cnt == 0)
                    k[j] = v[j];
                const float d = v[j] - k[j];
                sm[j] += d;
                q[j] += d * d;
            }
            cnt++;
        }
        if (cnt)
            for (int j = 0; j < GN_WIDE; j++) {
                m[j].n = cnt;
                m[j].mean = (double)k[j] + (double)sm[j] / cnt;
                const double m2 = (double)q[j] - (double)sm[j] * (double)sm[j] / cnt;
                m[j].m2 = m2 > 0.0 ? m2 : 0.0;
            }
    }
    for (int j = 0; j < GN_WIDE; j++) {
        sh[0][threadIdx.y][threadIdx.x * GN_WIDE + j] = m[j].n;
        sh[1][threadIdx.y][threadIdx.x * GN_WIDE + j] = m[j].mean;
        sh[2][threadIdx.y][threadIdx.x * GN_WIDE + j] = m[j].m2;
    }
    __syncthreads();
    if (threadIdx.y == 0 && ch0 < c) {
        for (int j = 0; j < GN_WIDE; j++) {
            const int col = threadIdx.x * GN_WIDE + j, ch = ch0 + j;
            gn_moments l[8];
            for (int y = 0; y < 8; y++)
                l[y] = {sh[0][y][col], sh[1][y][col], sh[2][y][col]};
            const gn_moments t = gn_merge(gn_merge(gn_merge(l[0], l[1]), gn_merge(l[2], l[3])),
                                          gn_merge(gn_merge(l[4], l[5]), gn_merge(l[6], l[7])));
            partial[((b * chunks + p) * 2 + 0) * c + ch] = (float)t.mean;
            partial[((b * chunks + p) * 2 + 1) * c + ch] = (float)t.m2;
        }
    }
}

/* One block per (sample, group): thread j merges pieces j, j + GN_STAT_THREADS, ... of the
 * group's (chunk, channel) list in order, then a fixed tree; mean and rstd of the group. */
static __global__ void gn_moments_group_kernel(int groups, int c, int64_t rows, int64_t chunks,
                                               float eps, const float *partial, float *mean,
                                               float *rstd)
{
    __shared__ double sh[3][GN_STAT_THREADS];
    const int cg = c / groups;
    const int64_t t = blockIdx.x, b = t / groups, g = t % groups;
    const int64_t items = chunks * cg;
    gn_moments m = {0.0, 0.0, 0.0};
    for (int64_t e = threadIdx.x; e < items; e += GN_STAT_THREADS) {
        const int64_t p = e / cg;
        const int ch = (int)(g * cg + (e - p * cg));
        const int64_t r0 = p * NORM_ROWS;
        gn_moments piece;
        piece.n = (double)((r0 + NORM_ROWS < rows ? r0 + NORM_ROWS : rows) - r0);
        piece.mean = partial[((b * chunks + p) * 2 + 0) * c + ch];
        piece.m2 = partial[((b * chunks + p) * 2 + 1) * c + ch];
        m = gn_merge(m, piece);
    }
    sh[0][threadIdx.x] = m.n;
    sh[1][threadIdx.x] = m.mean;
    sh[2][threadIdx.x] = m.m2;
    __syncthreads();
    for (int h = GN_STAT_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h) {
            const gn_moments a = {sh[0][threadIdx.x], sh[1][threadIdx.x], sh[2][threadIdx.x]};
            const gn_moments o = {sh[0][threadIdx.x + h], sh[1][threadIdx.x + h],
                                  sh[2][threadIdx.x + h]};
            const gn_moments r = gn_merge(a, o);
            sh[0][threadIdx.x] = r.n;
            sh[1][threadIdx.x] = r.mean;
            sh[2][threadIdx.x] = r.m2;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        mean[t] = (float)sh[1][0];
        rstd[t] = (float)(1.0 / sqrt(sh[2][0] / sh[0][0] + (double)eps));
    }
}

template <typename T>
static __global__ void gn_apply_kernel(int64_t total, int64_t per_sample, int c, int groups,
                                       const T *x, const T *gamma, const T *beta,
                                       const float *mean, const float *rstd, int silu, T *y)
{
    const int cg = c / groups;
    NORM_LOOP(i, total)
    {
        const int64_t b = i / per_sample;
        const int ch = (int)(i % c);
        const int64_t gi = b * groups + ch / cg;
        sd_st(y, i, gn_apply_one<false>(sd_ld(x, i), mean[gi], rstd[gi], gamma != nullptr,
                                        gamma ? sd_ld(gamma, ch) : 1.0f, beta != nullptr,
                                        beta ? sd_ld(beta, ch) : 0.0f, silu));
    }
}

/* The same map over one sample, 16 bytes (8 bf16 or 4 fp32) per thread and 32-bit index
 * arithmetic (blockIdx.y = sample): for c a multiple of the vector width and 16-byte aligned
 * tensors. Each element goes through the same operations in the same order as above, so the
 * bits are the same; only the 64-bit divisions per element and the 2-byte accesses are gone. */
/* 16 bytes of a tensor, as one load and as elements */
template <typename T>
union pack16 {
    uint4 u;
    T e[16 / sizeof(T)];
};

/* One sample's place in the 16-byte kernels (blockIdx.y = sample). */
struct gn_sample {
    int64_t base;             /* first element of the sample */
    const float *mean, *rstd; /* the sample's group statistics */
    int cg, nvec;             /* channels per group, 16-byte pieces in the sample */
};

static __device__ __forceinline__ gn_sample gn_sample_at(int per_sample, int c, int groups,
                                                         int vec, const float *mean,
                                                         const float *rstd)
{
    gn_sample s;
    s.base = (int64_t)blockIdx.y * per_sample;
    s.mean = mean + (int64_t)blockIdx.y * groups;
    s.rstd = rstd + (int64_t)blockIdx.y * groups;
    s.cg = c / groups;
    s.nvec = per_sample / vec;
    return s;
}

template <typename T>
static __global__ void gn_apply_vec_kernel(int per_sample, int c, int groups, const T *x,
                                           const T *gamma, const T *beta, const float *mean,
                                           const float *rstd, int silu, T *y)
{
    constexpr int VEC = 16 / sizeof(T);
    const gn_sample sm = gn_sample_at(per_sample, c, groups, VEC, mean, rstd);
    const int cg = sm.cg;
    const int64_t base = sm.base;
    const float *mb = sm.mean, *rb = sm.rstd;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < sm.nvec; v += gridDim.x * blockDim.x) {
        pack16<T> in, out;
        in.u = *(const uint4 *)(x + base + (int64_t)v * VEC);
        const int ch0 = (v * VEC) % c;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const int ch = ch0 + j, g = ch / cg;
            sd_st(out.e, j, gn_apply_one<false>(sd_ld(in.e, j), mb[g], rb[g], gamma != nullptr,
                                                gamma ? sd_ld(gamma, ch) : 1.0f, beta != nullptr,
                                                beta ? sd_ld(beta, ch) : 0.0f, silu));
        }
        *(uint4 *)(y + base + (int64_t)v * VEC) = out.u;
    }
}

/* The same map again, with each thread's channel constants in registers
 * (SDTRAIN_CUDA_GN_APPLY=regs): the grid-stride step in 16-byte pieces is a multiple of c / VEC
 * (gn_regs_grid), so every piece a thread visits starts at the same channel, and the mean, rstd,
 * gamma and beta of its VEC channels are loaded once instead of per element (with a 32-bit
 * division for the group). The arithmetic per element is the one above, in the same order:
 * the same bits. */
template <typename T, bool FAST>
static __global__ void gn_apply_regs_kernel(int per_sample, int c, int groups, const T *x,
                                            const T *gamma, const T *beta, const float *mean,
                                            const float *rstd, int silu, T *y)
{
    constexpr int VEC = 16 / sizeof(T);
    const gn_sample sm = gn_sample_at(per_sample, c, groups, VEC, mean, rstd);
    const int v0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    if (v0 >= sm.nvec)
        return;
    const int ch0 = (v0 * VEC) % c;
    float mk[VEC], rk[VEC], gk[VEC], bk[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        const int ch = ch0 + j, g = ch / sm.cg;
        mk[j] = sm.mean[g];
        rk[j] = sm.rstd[g];
        gk[j] = gamma ? sd_ld(gamma, ch) : 1.0f;
        bk[j] = beta ? sd_ld(beta, ch) : 0.0f;
    }
    for (int v = v0; v < sm.nvec; v += stride) {
        pack16<T> in, out;
        in.u = *(const uint4 *)(x + sm.base + (int64_t)v * VEC);
#pragma unroll
        for (int j = 0; j < VEC; j++)
            sd_st(out.e, j, gn_apply_one<FAST>(sd_ld(in.e, j), mk[j], rk[j], gamma != nullptr,
                                               gk[j], beta != nullptr, bk[j], silu));
        *(uint4 *)(y + sm.base + (int64_t)v * VEC) = out.u;
    }
}

static int64_t gn_gcd(int64_t a, int64_t b)
{
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Grid of gn_apply_regs_kernel: as gn_vec_grid, with the blocks per sample a multiple of
 * (c / VEC) / gcd(c / VEC, NORM_THREADS), so that the step is a whole number of rows. */
static dim3 gn_regs_grid(const sd_backend *be, int64_t per_sample, int c, int n)
{
    const int64_t vec = 16 / (int64_t)sd_cuda_elem(be), nvec = per_sample / vec, q = c / vec;
    const int64_t f = q / gn_gcd(q, NORM_THREADS);
    int64_t gx = (nvec + NORM_THREADS - 1) / NORM_THREADS;
    int64_t cap = (int64_t)sd_cuda(be)->sm_count * 16 / n + 1;
    gx = (gx + f - 1) / f * f;
    cap = cap / f * f;
    if (cap < f)
        cap = f;
    if (gx > cap)
        gx = cap;
    return dim3((unsigned)gx, (unsigned)n);
}

/* Grid of the 16-byte kernels: x over a sample's pieces (capped near 16 blocks per SM in all),
 * y over the samples. */
static dim3 gn_vec_grid(const sd_backend *be, int64_t per_sample, int n)
{
    const int64_t nvec = per_sample / (16 / (int64_t)sd_cuda_elem(be));
    int64_t gx = (nvec + NORM_THREADS - 1) / NORM_THREADS;
    const int64_t cap = (int64_t)sd_cuda(be)->sm_count * 16 / n + 1;
    if (gx > cap)
        gx = cap;
    return dim3((unsigned)gx, (unsigned)n);
}

/* Whether the 16-byte kernels take a tensor: c a multiple of the vector width (so a vector never
 * crosses a row), 16-byte aligned pointers, a sample's elements addressable in 32 bits. */
static int gn_vec_ok(const sd_backend *be, int64_t per_sample, int c, const void *a,
                     const void *b, int n)
{
    const int vec = 16 / (int)sd_cuda_elem(be);
    return c % vec == 0 && per_sample < INT32_MAX && (uintptr_t)a % 16 == 0 &&
           (uintptr_t)b % 16 == 0 && n <= 65535;
}

/* coef[t] = (sum_j gamma_j tot0[b, j], sum_j gamma_j tot1[b, j]) / count over the group's
 * channels j, in channel order */
template <typename T>
static __global__ void gn_coef_kernel(int n, int groups, int c, double count, const T *gamma,
                                      const float *tot, float *coef)
{
    const int cg = c / groups;
    NORM_LOOP(t, (int64_t)n * groups)
    {
        const int64_t b = t / groups, g = t % groups;
        double a1 = 0.0, a2 = 0.0;
        for (int k = 0; k < cg; k++) {
            const int ch = (int)g * cg + k;
            const double gm = gamma ? (double)sd_ld(gamma, ch) : 1.0;
            a1 += gm * tot[(b * 2 + 0) * c + ch];
            a2 += gm * tot[(b * 2 + 1) * c + ch];
        }
        coef[2 * t] = (float)(a1 / count);
        coef[2 * t + 1] = (float)(a2 / count);
    }
}

template <typename T>
static __global__ void gn_dx_kernel(int64_t total, int64_t per_sample, int c, int groups,
                                    const T *x, const T *gamma, const T *beta, const float *mean,
                                    const float *rstd, const float *coef, const T *dy, int silu,
                                    T *dx, int accumulate)
{
    const int cg = c / groups;
    NORM_LOOP(i, total)
    {
        const int64_t b = i / per_sample;
        const int ch = (int)(i % c);
        const int64_t gi = b * groups + ch / cg;
        const float rs = rstd[gi];
        float xh;
        float dz = gn_dz(x, dy, gamma, beta, mean[gi], rs, silu, ch, i, &xh);
        float v = gn_dx_one(dz, xh, rs, gamma != nullptr, gamma ? sd_ld(gamma, ch) : 1.0f,
                            coef[2 * gi], coef[2 * gi + 1]);
        sd_st(dx, i, accumulate ? sd_ld(dx, i) + v : v);
    }
}

/* gn_dx_kernel over one sample with 16-byte vectors (blockIdx.y = sample), the same operations
 * per element in the same order (see gn_apply_vec_kernel). */
template <typename T>
static __global__ void gn_dx_vec_kernel(int per_sample, int c, int groups, const T *x,
                                        const T *gamma, const T *beta, const float *mean,
                                        const float *rstd, const float *coef, const T *dy,
                                        int silu, T *dx, int accumulate)
{
    constexpr int VEC = 16 / sizeof(T);
    const gn_sample sm = gn_sample_at(per_sample, c, groups, VEC, mean, rstd);
    const int cg = sm.cg;
    const float *mb = sm.mean, *rb = sm.rstd;
    const float *cb = coef + 2 * (int64_t)blockIdx.y * groups;
    for (int v = blockIdx.x * blockDim.x + threadIdx.x; v < sm.nvec; v += gridDim.x * blockDim.x) {
        const int64_t at = sm.base + (int64_t)v * VEC;
        pack16<T> xv, dyv, old, out;
        xv.u = *(const uint4 *)(x + at);
        dyv.u = *(const uint4 *)(dy + at);
        if (accumulate)
            old.u = *(const uint4 *)(dx + at);
        const int ch0 = (v * VEC) % c;
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            const int ch = ch0 + j, g = ch / cg;
            const float rs = rb[g];
            float xh;
            float dz = gn_dz(xv.e, dyv.e, gamma, beta, mb[g], rs, silu, ch, j, &xh);
            float val = gn_dx_one(dz, xh, rs, gamma != nullptr, gamma ? sd_ld(gamma, ch) : 1.0f,
                                  cb[2 * g], cb[2 * g + 1]);
            sd_st(out.e, j, accumulate ? sd_ld(old.e, j) + val : val);
        }
        *(uint4 *)(dx + at) = out.u;
    }
}

/* gn_dx_vec_kernel with each thread's channel constants in registers (SDTRAIN_CUDA_GN_APPLY=regs
 * or fast; the grid of gn_regs_grid, so a thread's pieces all start at one channel): mean, rstd,
 * the two group coefficients, gamma and beta of its VEC channels are loaded once. Per element
 * the operations of gn_dz and gn_dx_vec_kernel in the same order: the same bits. */
template <typename T>
static __global__ void gn_dx_regs_kernel(int per_sample, int c, int groups, const T *x,
                                         const T *gamma, const T *beta, const float *mean,
                                         const float *rstd, const float *coef, const T *dy,
                                         int silu, T *dx, int accumulate)
{
    constexpr int VEC = 16 / sizeof(T);
    const gn_sample sm = gn_sample_at(per_sample, c, groups, VEC, mean, rstd);
    const int v0 = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
    if (v0 >= sm.nvec)
        return;
    const float *cb = coef + 2 * (int64_t)blockIdx.y * groups;
    const int ch0 = (v0 * VEC) % c;
    float mk[VEC], rk[VEC], c1[VEC], c2[VEC], gk[VEC], bk[VEC];
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        const int ch = ch0 + j, g = ch / sm.cg;
        mk[j] = sm.mean[g];
        rk[j] = sm.rstd[g];
        c1[j] = cb[2 * g];
        c2[j] = cb[2 * g + 1];
        gk[j] = gamma ? sd_ld(gamma, ch) : 1.0f;
        bk[j] = beta ? sd_ld(beta, ch) : 0.0f;
    }
    for (int v = v0; v < sm.nvec; v += stride) {
        const int64_t at = sm.base + (int64_t)v * VEC;
        pack16<T> xv, dyv, old, out;
        xv.u = *(const uint4 *)(x + at);
        dyv.u = *(const uint4 *)(dy + at);
        if (accumulate)
            old.u = *(const uint4 *)(dx + at);
#pragma unroll
        for (int j = 0; j < VEC; j++) {
            float xh;
            const float dz = gn_dz_one(sd_ld(xv.e, j), sd_ld(dyv.e, j), mk[j], rk[j],
                                       gamma != nullptr, gk[j], beta != nullptr, bk[j], silu,
                                       &xh);
            const float val = gn_dx_one(dz, xh, rk[j], gamma != nullptr, gk[j], c1[j], c2[j]);
            sd_st(out.e, j, accumulate ? sd_ld(old.e, j) + val : val);
        }
        *(uint4 *)(dx + at) = out.u;
    }
}

static size_t cuda_group_norm_forward_scratch(const sd_backend *be, const sd_group_norm_desc *d)
{
    /* chunk partials (1 value per channel; 2 in one-pass mode), then mean and rstd for a caller
     * that keeps none */
    const size_t per = sd_cuda(be)->gn_onepass ? 2 : 1;
    return sd_cuda_align(per * d->n * norm_chunks(d->hw) * d->c * sizeof(float)) +
           2 * sd_cuda_align((size_t)d->n * d->groups * sizeof(float));
}

static void cuda_group_norm_forward(const sd_backend *be, const sd_group_norm_desc *d,
                                    const void *x, const void *gamma, const void *beta, void *y,
                                    float *mean, float *rstd, sd_scratch ws)
{
    const int n = d->n, c = d->c, groups = d->groups, cg = d->c / d->groups;
    const int64_t hw = d->hw, chunks = norm_chunks(hw);
    const double count = (double)hw * cg;
    char *cur = (char *)ws.ptr;
    float *partial = (float *)norm_carve(
        &cur, (sd_cuda(be)->gn_onepass ? 2 : 1) * (size_t)n * chunks * c * sizeof(float));
    float *own_mean = (float *)norm_carve(&cur, (size_t)n * groups * sizeof(float));
    float *own_rstd = (float *)norm_carve(&cur, (size_t)n * groups * sizeof(float));
    float *mu = mean ? mean : own_mean, *rs = rstd ? rstd : own_rstd;
    cudaStream_t s = sd_cuda_stream(be);
    const unsigned sgrid = (unsigned)((int64_t)n * groups);
    const int64_t total = (int64_t)n * hw * c;
    SD_CHECK((int64_t)n * groups < INT32_MAX, "group norm: %d x %d groups", n, groups);
    SD_CUDA_DISPATCH(be, T, {
        if (sd_cuda(be)->gn_onepass) {
            /* partial holds n * chunks * c floats; the moments need two per channel: the scratch
             * query asks for the second half when this mode is on */
            SD_CHECK(chunks < 65536 && n < 65536, "group norm over %d x %lld rows: too many", n,
                     (long long)hw);
            dim3 pblock(32, 8);
            if (sd_cuda(be)->gn_onepass == 2 && c % GN_WIDE == 0 &&
                (uintptr_t)x % (GN_WIDE * sizeof(T)) == 0) {
                dim3 pgrid((unsigned)((c + 32 * GN_WIDE - 1) / (32 * GN_WIDE)), (unsigned)chunks,
                           (unsigned)n);
                gn_moments_partial_wide_kernel<T><<<pgrid, pblock, 0, s>>>(hw, c, chunks,
                                                                            (const T *)x, partial);
            } else {
                dim3 pgrid((unsigned)((c + 31) / 32), (unsigned)chunks, (unsigned)n);
                gn_moments_partial_kernel<T><<<pgrid, pblock, 0, s>>>(hw, c, chunks,
                                                                       (const T *)x, partial);
            }
            SD_CUDA_LAUNCHED(be);
            gn_moments_group_kernel<<<sgrid, GN_STAT_THREADS, 0, s>>>(groups, c, hw, chunks,
                                                                       d->eps, partial, mu, rs);
            SD_CUDA_LAUNCHED(be);
            SD_CUDA_SUBMARK(be, "group_norm_forward:moments");
        } else {
            gn_load_x<T> f0 = {(const T *)x};
            norm_colpartial<1>(be, n, hw, c, f0, partial);
            gn_group_stat_kernel<<<sgrid, GN_STAT_THREADS, 0, s>>>(groups, c, chunks, count, d->eps,
                                                                    partial, 0, mu);
            SD_CUDA_LAUNCHED(be);
            SD_CUDA_SUBMARK(be, "group_norm_forward:mean");
            gn_sq_dev<T> f1 = {(const T *)x, mu, groups, cg};
            norm_colpartial<1>(be, n, hw, c, f1, partial);
            gn_group_stat_kernel<<<sgrid, GN_STAT_THREADS, 0, s>>>(groups, c, chunks, count, d->eps,
                                                                    partial, 1, rs);
            SD_CUDA_LAUNCHED(be);
            SD_CUDA_SUBMARK(be, "group_norm_forward:rstd");
        }
        const int mode = sd_cuda(be)->gn_apply;
        const bool fast = mode == SD_CUDA_GN_APPLY_FAST ||
                          (mode == SD_CUDA_GN_APPLY_AUTO && sizeof(T) == 2);
        if (gn_vec_ok(be, hw * c, c, x, y, n) && fast) {
            gn_apply_regs_kernel<T, true><<<gn_regs_grid(be, hw * c, c, n), NORM_THREADS, 0, s>>>(
                (int)(hw * c), c, groups, (const T *)x, (const T *)gamma, (const T *)beta, mu,
                rs, d->silu, (T *)y);
        } else if (gn_vec_ok(be, hw * c, c, x, y, n) && mode != SD_CUDA_GN_APPLY_LOADS) {
            gn_apply_regs_kernel<T, false><<<gn_regs_grid(be, hw * c, c, n), NORM_THREADS, 0, s>>>(
                (int)(hw * c), c, groups, (const T *)x, (const T *)gamma, (const T *)beta, mu,
                rs, d->silu, (T *)y);
        } else if (gn_vec_ok(be, hw * c, c, x, y, n)) {
            gn_apply_vec_kernel<T><<<gn_vec_grid(be, hw * c, n), NORM_THREADS, 0, s>>>(
                (int)(hw * c), c, groups, (const T *)x, (const T *)gamma, (const T *)beta, mu,
                rs, d->silu, (T *)y);
        } else {
            gn_apply_kernel<T><<<sd_cuda_grid(be, total, NORM_THREADS), NORM_THREADS, 0, s>>>(
                total, hw * c, c, groups, (const T *)x, (const T *)gamma, (const T *)beta, mu,
                rs, d->silu, (T *)y);
        }
        SD_CUDA_LAUNCHED(be);
    });
}

static size_t cuda_group_norm_backward_scratch(const sd_backend *be, const sd_group_norm_desc *d)
{
    (void)be;
    /* chunk partials (2 values per channel), per-sample channel sums, per-group coefficients */
    return sd_cuda_align(2 * (size_t)d->n * norm_chunks(d->hw) * d->c * sizeof(float)) +
           sd_cuda_align(2 * (size_t)d->n * d->c * sizeof(float)) +
           sd_cuda_align(2 * (size_t)d->n * d->groups * sizeof(float));
}

static void cuda_group_norm_backward(const sd_backend *be, const sd_group_norm_desc *d,
                                     const void *x, const void *gamma, const void *beta,
                                     const float *mean, const float *rstd, const void *dy,
                                     void *dx, int accumulate, float *dgamma, float *dbeta,
                                     sd_scratch ws)
{
    const int n = d->n, c = d->c, groups = d->groups, cg = d->c / d->groups;
    const int64_t hw = d->hw, chunks = norm_chunks(hw);
    const double count = (double)hw * cg;
    char *cur = (char *)ws.ptr;
    float *partial = (float *)norm_carve(&cur, 2 * (size_t)n * chunks * c * sizeof(float));
    float *tot = (float *)norm_carve(&cur, 2 * (size_t)n * c * sizeof(float));
    float *coef = (float *)norm_carve(&cur, 2 * (size_t)n * groups * sizeof(float));
    cudaStream_t s = sd_cuda_stream(be);
    const int64_t total = (int64_t)n * hw * c;
    /* beta matters only through the SiLU */
    const void *beta_used = d->silu ? beta : nullptr;
    SD_CUDA_DISPATCH(be, T, {
        gn_bwd_sums<T> f = {(const T *)x, (const T *)dy, (const T *)gamma,
                            (const T *)beta_used, mean, rstd, groups, cg, d->silu};
        norm_colpartial<2>(be, n, hw, c, f, partial);
        norm_chunk_sum(be, n, 2, c, hw, partial, tot);
        norm_param_grad(be, n, c, tot, dgamma, dbeta);
        if (dx) {
            gn_coef_kernel<T><<<sd_cuda_grid(be, (int64_t)n * groups, NORM_THREADS),
                                NORM_THREADS, 0, s>>>(n, groups, c, count, (const T *)gamma,
                                                      tot, coef);
            SD_CUDA_LAUNCHED(be);
            if (gn_vec_ok(be, hw * c, c, x, dx, n) && (uintptr_t)dy % 16 == 0 &&
                sd_cuda(be)->gn_apply != SD_CUDA_GN_APPLY_LOADS) {
                gn_dx_regs_kernel<T><<<gn_regs_grid(be, hw * c, c, n), NORM_THREADS, 0, s>>>(
                    (int)(hw * c), c, groups, (const T *)x, (const T *)gamma,
                    (const T *)beta_used, mean, rstd, coef, (const T *)dy, d->silu, (T *)dx,
                    accumulate);
            } else if (gn_vec_ok(be, hw * c, c, x, dx, n) && (uintptr_t)dy % 16 == 0) {
                gn_dx_vec_kernel<T><<<gn_vec_grid(be, hw * c, n), NORM_THREADS, 0, s>>>(
                    (int)(hw * c), c, groups, (const T *)x, (const T *)gamma,
                    (const T *)beta_used, mean, rstd, coef, (const T *)dy, d->silu, (T *)dx,
                    accumulate);
            } else {
                gn_dx_kernel<T><<<sd_cuda_grid(be, total, NORM_THREADS), NORM_THREADS, 0, s>>>(
                    total, hw * c, c, groups, (const T *)x, (const T *)gamma,
                    (const T *)beta_used, mean, rstd, coef, (const T *)dy, d->silu, (T *)dx,
                    accumulate);
            }
            SD_CUDA_LAUNCHED(be);
        }
    });
}

/* ---- layer norm ------------------------------------------------------------------------------
 * One warp per row (c is at most a few thousand): lane-strided fp32 partial sums and a xor
 * butterfly, which leaves the same total in every lane (each step adds the same two values);
 * two passes (mean, then squared deviations). dgamma/dbeta go through the column pattern. */
#define LN_WARPS 8

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
static __global__ void ln_fwd_kernel(int64_t rows, int c, float eps, const T *x, const T *gamma,
                                     const T *beta, T *y, float *mean, float *rstd)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    for (int64_t r = warp; r < rows; r += (int64_t)gridDim.x * LN_WARPS) {
        const T *xr = x + r * c;
        T *yr = y + r * c;
        float s = 0.0f;
        for (int j = lane; j < c; j += 32)
            s += sd_ld(xr, j);
        const float m = warp_sum(s) / (float)c;
        float q = 0.0f;
        for (int j = lane; j < c; j += 32) {
            float e = sd_ld(xr, j) - m;
            q += e * e;
        }
        const float rs = 1.0f / sqrtf(warp_sum(q) / (float)c + eps);
        if (lane == 0) {
            if (mean)
                mean[r] = m;
            if (rstd)
                rstd[r] = rs;
        }
        for (int j = lane; j < c; j += 32) {
            float o = (sd_ld(xr, j) - m) * rs;
            if (gamma)
                o = o * sd_ld(gamma, j);
            if (beta)
                o = o + sd_ld(beta, j);
            sd_st(yr, j, o);
        }
    }
}

static void cuda_layer_norm_forward(const sd_backend *be, int64_t rows, int c, float eps,
                                    const void *x, const void *gamma, const void *beta, void *y,
                                    float *mean, float *rstd)
{
    cudaStream_t s = sd_cuda_stream(be);
    unsigned grid = sd_cuda_grid(be, rows, LN_WARPS);
    SD_CUDA_DISPATCH(be, T, {
        ln_fwd_kernel<T><<<grid, LN_WARPS * 32, 0, s>>>(rows, c, eps, (const T *)x,
                                                         (const T *)gamma, (const T *)beta,
                                                         (T *)y, mean, rstd);
    });
    SD_CUDA_LAUNCHED(be);
}

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma */
template <typename T>
static __global__ void ln_dx_kernel(int64_t rows, int c, const T *x, const T *gamma,
                                    const float *mean, const float *rstd, const T *dy, T *dx,
                                    int accumulate)
{
    const int lane = threadIdx.x & 31;
    const int64_t warp = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    for (int64_t r = warp; r < rows; r += (int64_t)gridDim.x * LN_WARPS) {
        const T *xr = x + r * c, *dyr = dy + r * c;
        T *dxr = dx + r * c;
        const float m = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f;
        for (int j = lane; j < c; j += 32) {
            float xh = (sd_ld(xr, j) - m) * rs;
            float g = gamma ? sd_ld(dyr, j) * sd_ld(gamma, j) : sd_ld(dyr, j);
            s1 += g;
            s2 += g * xh;
        }
        const float a = warp_sum(s1) / (float)c, bb = warp_sum(s2) / (float)c;
        for (int j = lane; j < c; j += 32) {
            float xh = (sd_ld(xr, j) - m) * rs;
            float g = gamma ? sd_ld(dyr, j) * sd_ld(gamma, j) : sd_ld(dyr, j);
            float v = rs * (g - a - xh * bb);
            sd_st(dxr, j, accumulate ? sd_ld(dxr, j) + v : v);
        }
    }
}

/* The same dx with the row held in registers: each lane loads its 16-byte pieces of x and dy
 * (and dx when accumulating) once, all loads issued before any arithmetic, instead of two passes
 * of 2-byte loads that the compiler must keep in order around the stores (dx may alias). Lane l
 * takes pieces l, l + 32, ...; its partial sums go in that order, then the same butterfly. */
#define LN_VEC_MAX 6 /* pieces per lane: c up to 1536 (bf16) / 768 (fp32) */
template <typename T>
static __global__ void ln_dx_vec_kernel(int64_t rows, int c, const T *__restrict__ x,
                                        const T *__restrict__ gamma,
                                        const float *__restrict__ mean,
                                        const float *__restrict__ rstd, const T *__restrict__ dy,
                                        T *__restrict__ dx, int accumulate)
{
    constexpr int VEC = 16 / sizeof(T);
    const int lane = threadIdx.x & 31;
    const int pieces = c / VEC;
    const int64_t warp = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5);
    for (int64_t r = warp; r < rows; r += (int64_t)gridDim.x * LN_WARPS) {
        const int64_t at = r * c;
        pack16<T> xv[LN_VEC_MAX], dv[LN_VEC_MAX];
#pragma unroll
        for (int k = 0; k < LN_VEC_MAX; k++) {
            const int pc = lane + 32 * k;
            if (pc < pieces) {
                xv[k].u = *(const uint4 *)(x + at + (int64_t)pc * VEC);
                dv[k].u = *(const uint4 *)(dy + at + (int64_t)pc * VEC);
            }
        }
        const float m = mean[r], rs = rstd[r];
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < LN_VEC_MAX; k++) {
            const int pc = lane + 32 * k;
            if (pc < pieces)
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const int ch = pc * VEC + j;
                    float xh = (sd_ld(xv[k].e, j) - m) * rs;
                    float g = gamma ? sd_ld(dv[k].e, j) * sd_ld(gamma, ch) : sd_ld(dv[k].e, j);
                    s1 += g;
                    s2 += g * xh;
                }
        }
        const float a = warp_sum(s1) / (float)c, bb = warp_sum(s2) / (float)c;
#pragma unroll
        for (int k = 0; k < LN_VEC_MAX; k++) {
            const int pc = lane + 32 * k;
            if (pc < pieces) {
                pack16<T> old, out;
                if (accumulate)
                    old.u = *(const uint4 *)(dx + at + (int64_t)pc * VEC);
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const int ch = pc * VEC + j;
                    float xh = (sd_ld(xv[k].e, j) - m) * rs;
                    float g = gamma ? sd_ld(dv[k].e, j) * sd_ld(gamma, ch) : sd_ld(dv[k].e, j);
                    float v = rs * (g - a - xh * bb);
                    sd_st(out.e, j, accumulate ? sd_ld(old.e, j) + v : v);
                }
                *(uint4 *)(dx + at + (int64_t)pc * VEC) = out.u;
            }
        }
    }
}

/* v[0] = dy (dbeta), v[1] = dy * xhat (dgamma) */
template <typename T>
struct ln_param_sums {
    const T *x, *dy;
    const float *mean, *rstd;
    __device__ void operator()(int64_t b, int64_t r, int ch, int64_t i, float *v) const
    {
        float d = sd_ld(dy, i);
        v[0] = d;
        v[1] = d * ((sd_ld(x, i) - mean[r]) * rstd[r]);
    }
};

static size_t cuda_layer_norm_backward_scratch(const sd_backend *be, int64_t rows, int c)
{
    (void)be;
    return sd_cuda_align(2 * (size_t)norm_chunks(rows) * c * sizeof(float)) +
           sd_cuda_align(2 * (size_t)c * sizeof(float));
}

static void cuda_layer_norm_backward(const sd_backend *be, int64_t rows, int c, const void *x,
                                     const void *gamma, const float *mean, const float *rstd,
                                     const void *dy, void *dx, int accumulate, float *dgamma,
                                     float *dbeta, sd_scratch ws)
{
    cudaStream_t s = sd_cuda_stream(be);
    char *cur = (char *)ws.ptr;
    float *partial = (float *)norm_carve(&cur, 2 * (size_t)norm_chunks(rows) * c * sizeof(float));
    float *tot = (float *)norm_carve(&cur, 2 * (size_t)c * sizeof(float));
    SD_CUDA_DISPATCH(be, T, {
        const int vec = 16 / (int)sizeof(T);
        const int vec_ok = c % vec == 0 && c / vec <= 32 * LN_VEC_MAX &&
                           (uintptr_t)x % 16 == 0 && (uintptr_t)dy % 16 == 0 &&
                           (uintptr_t)dx % 16 == 0 && x != dx && dy != dx;
        if (dx && vec_ok) {
            ln_dx_vec_kernel<T><<<sd_cuda_grid(be, rows, LN_WARPS), LN_WARPS * 32, 0, s>>>(
                rows, c, (const T *)x, (const T *)gamma, mean, rstd, (const T *)dy, (T *)dx,
                accumulate);
            SD_CUDA_LAUNCHED(be);
            SD_CUDA_SUBMARK(be, "layer_norm_backward:dx");
        } else if (dx) {
            ln_dx_kernel<T><<<sd_cuda_grid(be, rows, LN_WARPS), LN_WARPS * 32, 0, s>>>(
                rows, c, (const T *)x, (const T *)gamma, mean, rstd, (const T *)dy, (T *)dx,
                accumulate);
            SD_CUDA_LAUNCHED(be);
            SD_CUDA_SUBMARK(be, "layer_norm_backward:dx");
        }
        if (dgamma || dbeta) {
            ln_param_sums<T> f = {(const T *)x, (const T *)dy, mean, rstd};
            norm_colpartial<2>(be, 1, rows, c, f, partial);
            SD_CUDA_SUBMARK(be, "layer_norm_backward:colpartial");
            norm_chunk_sum(be, 1, 2, c, rows, partial, tot);
            SD_CUDA_SUBMARK(be, "layer_norm_backward:chunk_sum");
            norm_param_grad(be, 1, c, tot, dgamma, dbeta);
        }
    });
}

void sd_cuda_fill_norm_ops(sd_ops *ops)
{
    ops->group_norm_forward_scratch = cuda_group_norm_forward_scratch;
    ops->group_norm_forward = cuda_group_norm_forward;
    ops->group_norm_backward_scratch = cuda_group_norm_backward_scratch;
    ops->group_norm_backward = cuda_group_norm_backward;
    ops->layer_norm_forward = cuda_layer_norm_forward;
    ops->layer_norm_backward_scratch = cuda_layer_norm_backward_scratch;
    ops->layer_norm_backward = cuda_layer_norm_backward;
}
