/* Fused ("flash") attention for the BF16 CUDA backend: scores never leave the chip. Forward and
 * a deterministic two-kernel backward built on mma.sync m16n8k16 (bf16 in, fp32 accumulate);
 * selected by SDTRAIN_CUDA_ATTENTION, the math path of ops_cuda_gemm.cu covers the rest.
 * doc/cuda/attention.md is the long version. */
#include <cmath>
#include <cstring>

#include "cuda_internal.h"

/* ---- tiling ----------------------------------------------------------------------------------
 * A CTA is 4 warps; it owns a tile of 64 query rows (forward, dQ) or 64 key rows (dK/dV), 16
 * per warp, and streams the other side through shared memory 64 rows at a time. Tiles are
 * stored in shared memory as raw bf16 bits with a row stride of head_dim + 8 elements. The pad
 * keeps both kinds of fragment load free of bank conflicts for head_dim 32, 64 and 128: the
 * 32-bit loads of A fragments (row g, word tg: banks (g (head_dim + 8) / 2 + tg) mod 32 are 32
 * different ones) and ldmatrix, whose 8 row addresses per matrix are (head_dim + 8) / 8 (odd)
 * 16-byte units apart and so fall in 8 different 16-byte bank groups. */
#define FA_TILE 64
#define FA_THREADS 128
#define FA_LOG2E 1.4426950408889634f
#define FA_LN2 0.6931471805599453f

/* Everything a kernel needs; pointers are at element (batch 0, token 0, channel 0). */
struct fa_params {
    const uint16_t *q, *k, *v, *dout;
    uint16_t *out;      /* forward: o; backward: the gradient the kernel writes (dq, dk or dv) */
    uint16_t *out2;     /* dK/dV kernel: dv (out is dk); either may be NULL */
    float *lse;         /* forward output (may be NULL) */
    const float *lse_in; /* backward input */
    const float *dd;    /* backward: D = rowsum(dO o O), [batch, heads, t_q] */
    int64_t ld_q, ld_k, ld_v, ld_o;
    int t_q, t_kv, heads;
    float scale;
    int causal;
    int accumulate;
    int vec; /* FA_VEC_* bits: the tensor allows 16-byte loads (address and row stride) */
};

#define FA_VEC_Q 1
#define FA_VEC_K 2
#define FA_VEC_V 4
#define FA_VEC_DO 8

static __device__ __forceinline__ float fa_bf16_to_f32(uint16_t bits)
{
    return __uint_as_float((uint32_t)bits << 16);
}

static __device__ __forceinline__ uint16_t fa_f32_to_bf16(float v)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

/* Two floats as one bf16x2 operand register: `lo` in the low half (the lower column / k). */
static __device__ __forceinline__ uint32_t fa_pack(float lo, float hi)
{
    return (uint32_t)fa_f32_to_bf16(lo) | ((uint32_t)fa_f32_to_bf16(hi) << 16);
}

/* Two consecutive bf16 of a shared-memory row (even element index: 4-byte aligned). */
static __device__ __forceinline__ uint32_t fa_ld2(const uint16_t *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

/* c += A B for one 16x8x16 block. PTX ISA fragment layout (g = lane / 4, tg = lane % 4):
 *   A (16x16, row): a0 = A[g][2tg..2tg+1], a1 = A[g+8][2tg..], a2 = A[g][2tg+8..], a3 = A[g+8][2tg+8..]
 *   B (16x8, col):  b0 = B[2tg..2tg+1][g], b1 = B[2tg+8..2tg+9][g]
 *   C (16x8):       c0, c1 = C[g][2tg], C[g][2tg+1]; c2, c3 = C[g+8][2tg], C[g+8][2tg+1]
 * the lower k (or column) index in the low 16 bits of each register. */
static __device__ __forceinline__ void fa_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* 16 bytes global -> shared without passing through registers (cp.async, L2 only); complete
 * for the issuing thread after fa_cp_wait, for the CTA after a __syncthreads that follows. */
static __device__ __forceinline__ void fa_cp_async16(void *dst, const void *src)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    const size_t g = __cvta_generic_to_global(src);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(s), "l"(g) : "memory");
}

/* Closes the group of cp.async issued since the last commit (an empty group is fine). */
static __device__ __forceinline__ void fa_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" : : : "memory");
}

/* Waits until at most the newest committed group of this thread is still in flight. */
static __device__ __forceinline__ void fa_cp_wait1()
{
    asm volatile("cp.async.wait_group 1;\n" : : : "memory");
}

/* rows x HD of a head (row stride ld elements) into a 64-row shared tile; rows past `rows` are
 * zero so masked keys and queries stay finite. All threads of the CTA take part. With `async`
 * the 16-byte path goes through cp.async (the caller commits and waits); the element path and
 * the zero rows are plain stores, visible after the caller's next __syncthreads either way. */
template <int HD>
static __device__ void fa_load_tile(uint16_t *sm, const uint16_t *g, int64_t ld, int rows,
                                    bool vec, bool async = false)
{
    constexpr int CH = HD / 8; /* 16-byte chunks per row */
    constexpr int LDS = HD + 8;
    for (int c = threadIdx.x; c < FA_TILE * CH; c += FA_THREADS) {
        const int r = c / CH, col = (c % CH) * 8;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (r < rows) {
            const uint16_t *src = g + (int64_t)r * ld + col;
            if (vec && async) {
                fa_cp_async16(sm + r * LDS + col, src);
                continue;
            }
            if (vec) {
                val = *reinterpret_cast<const uint4 *>(src);
            } else {
                uint16_t t[8];
#pragma unroll
                for (int e = 0; e < 8; e++)
                    t[e] = src[e];
                memcpy(&val, t, sizeof val);
            }
        }
        *reinterpret_cast<uint4 *>(sm + r * LDS + col) = val;
    }
}

/* A fragments (16 rows of a warp, all HD columns, k = the head dimension) from a tile. */
template <int HD>
static __device__ __forceinline__ void fa_load_a(uint32_t f[HD / 16][4], const uint16_t *rows16,
                                                 int g, int tg)
{
    constexpr int LDS = HD + 8;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const uint16_t *p = rows16 + kk * 16 + 2 * tg;
        f[kk][0] = fa_ld2(p + g * LDS);
        f[kk][1] = fa_ld2(p + (g + 8) * LDS);
        f[kk][2] = fa_ld2(p + g * LDS + 8);
        f[kk][3] = fa_ld2(p + (g + 8) * LDS + 8);
    }
}

/* Four 8x8 matrices of 16-bit elements from shared memory: lane l gives the (16-byte aligned)
 * address of row l % 8 of matrix l / 8 and receives, in r[m], row l / 4, elements 2 (l % 4) and
 * 2 (l % 4) + 1 of matrix m; that is the B fragment of a matrix stored with k contiguous. */
static __device__ __forceinline__ void fa_ldsm4(uint32_t r[4], const uint16_t *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* The same with .trans: lane l receives elements (2 (l % 4), l / 4) and (2 (l % 4) + 1, l / 4) of
 * each matrix; the B fragment of a matrix stored with n contiguous (k down the rows). */
static __device__ __forceinline__ void fa_ldsm4t(uint32_t r[4], const uint16_t *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* acc[16 x 64] = A[16 x HD] B^T where B is a 64 x HD tile (k = the head dimension, contiguous
 * in both): scores S = Q K^T, dP = dO V^T, and the transposed forms. One ldmatrix.x4 gives the
 * B fragments of two k-steps: matrices (rows nb*8.., columns kk*16 + 0, 8, 16, 24). */
template <int HD>
static __device__ __forceinline__ void fa_mma_abt(float acc[8][4], const uint32_t a[HD / 16][4],
                                                  const uint16_t *tile, int lane)
{
    constexpr int LDS = HD + 8;
    const uint16_t *lrow = tile + (lane & 7) * LDS + (lane >> 3) * 8;
#pragma unroll
    for (int nb = 0; nb < 8; nb++) {
        acc[nb][0] = acc[nb][1] = acc[nb][2] = acc[nb][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk += 2) {
            uint32_t r[4];
            fa_ldsm4(r, lrow + nb * 8 * LDS + kk * 16);
            fa_mma(acc[nb], a[kk][0], a[kk][1], a[kk][2], a[kk][3], r[0], r[1]);
            fa_mma(acc[nb], a[kk + 1][0], a[kk + 1][1], a[kk + 1][2], a[kk + 1][3], r[2], r[3]);
        }
    }
}

/* acc[16 x HD] += P[16 x 64] B where P is in accumulator layout (fp32, rounded to bf16 here)
 * and B a 64 x HD tile (k = the tile's rows): O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K.
 * The accumulator of n-blocks 2kk and 2kk+1 is exactly the A fragment of k-step kk. One
 * ldmatrix.x4.trans gives the B fragments of two n-blocks: matrices (rows kk*16 + 0 and 8,
 * columns nd*8 and nd*8 + 8). */
template <int HD>
static __device__ __forceinline__ void fa_mma_pb(float acc[HD / 8][4], const float p[8][4],
                                                 const uint16_t *tile, int lane)
{
    constexpr int LDS = HD + 8;
    const uint16_t *lrow = tile + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        const uint32_t a0 = fa_pack(p[2 * kk][0], p[2 * kk][1]);
        const uint32_t a1 = fa_pack(p[2 * kk][2], p[2 * kk][3]);
        const uint32_t a2 = fa_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        const uint32_t a3 = fa_pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd += 2) {
            uint32_t r[4];
            fa_ldsm4t(r, lrow + kk * 16 * LDS + nd * 8);
            fa_mma(acc[nd], a0, a1, a2, a3, r[0], r[1]);
            fa_mma(acc[nd + 1], a0, a1, a2, a3, r[2], r[3]);
        }
    }
}

/* Writes (or adds onto) 16 rows x HD of a gradient or output from accumulator layout, times
 * `mul`; rows at or past `valid` (relative to the warp's first row) are skipped. */
template <int HD>
static __device__ __forceinline__ void fa_store_rows(uint16_t *dst, int64_t ld, int valid,
                                                     const float acc[HD / 8][4], float mul,
                                                     int accumulate, int g, int tg)
{
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = g + 8 * half;
        if (r >= valid)
            continue;
        uint16_t *row = dst + (int64_t)r * ld + 2 * tg;
#pragma unroll
        for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = acc[nd][2 * half + e] * mul;
                if (accumulate)
                    v += fa_bf16_to_f32(row[nd * 8 + e]);
                row[nd * 8 + e] = fa_f32_to_bf16(v);
            }
    }
}

template <int HD>
static size_t fa_smem_bytes(int tiles, int extra_floats)
{
    return (size_t)tiles * FA_TILE * (HD + 8) * sizeof(uint16_t) + (size_t)extra_floats * 4;
}

/* ---- forward ---------------------------------------------------------------------------------
 * grid (query tiles, heads, batch). Each warp keeps its 16 Q rows as A fragments, and per key
 * tile: S = Q K^T (fp32), masking, online softmax in the log2 domain (x = s * scale * log2 e,
 * running max m and partial sum l per row, O rescaled when m grows), O += P V. */
template <int HD>
static __global__ void __launch_bounds__(FA_THREADS)
    fa_forward_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LDS = HD + 8;
    uint16_t *sq = reinterpret_cast<uint16_t *>(fa_smem);
    uint16_t *sk = sq + FA_TILE * LDS;     /* two K buffers, then two V buffers */
    uint16_t *sv = sk + 2 * FA_TILE * LDS;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FA_TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int64_t hoff = (int64_t)h * HD;
    const uint16_t *kb = p.k + (int64_t)b * p.t_kv * p.ld_k + hoff;
    const uint16_t *vb = p.v + (int64_t)b * p.t_kv * p.ld_v + hoff;

    const int kv_end = p.causal ? min(p.t_kv, q0 + FA_TILE) : p.t_kv;
    const int ntiles = (kv_end + FA_TILE - 1) / FA_TILE;
    fa_load_tile<HD>(sq, p.q + ((int64_t)b * p.t_q + q0) * p.ld_q + hoff, p.ld_q,
                     min(FA_TILE, p.t_q - q0), p.vec & FA_VEC_Q);
    /* K, V tile 0 in flight while Q goes to registers */
    fa_load_tile<HD>(sk, kb, p.ld_k, min(FA_TILE, p.t_kv), p.vec & FA_VEC_K, true);
    fa_load_tile<HD>(sv, vb, p.ld_v, min(FA_TILE, p.t_kv), p.vec & FA_VEC_V, true);
    fa_cp_commit();
    __syncthreads();
    uint32_t qf[HD / 16][4];
    fa_load_a<HD>(qf, sq + warp * 16 * LDS, g, tg);

    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    const float sl2 = p.scale * FA_LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float acc[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
        acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    /* double buffering: tile t + 1 is loaded into the other buffer while tile t is used; the
     * barrier at the end of an iteration frees the buffer the next iteration loads into */
    for (int t = 0; t < ntiles; t++) {
        const int kv0 = t * FA_TILE;
        const uint16_t *ck = sk + (t & 1) * FA_TILE * LDS, *cv = sv + (t & 1) * FA_TILE * LDS;
        if (t + 1 < ntiles) {
            const int next = kv0 + FA_TILE, rows = min(FA_TILE, p.t_kv - next);
            uint16_t *nk = sk + ((t + 1) & 1) * FA_TILE * LDS;
            uint16_t *nv = sv + ((t + 1) & 1) * FA_TILE * LDS;
            fa_load_tile<HD>(nk, kb + (int64_t)next * p.ld_k, p.ld_k, rows, p.vec & FA_VEC_K, true);
            fa_load_tile<HD>(nv, vb + (int64_t)next * p.ld_v, p.ld_v, rows, p.vec & FA_VEC_V, true);
        }
        fa_cp_commit();
        fa_cp_wait1(); /* this thread's part of tile t has landed */
        __syncthreads(); /* and everyone's */

        float s[8][4];
        fa_mma_abt<HD>(s, qf, ck, lane);
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = kv0 + nb * 8 + 2 * tg + (e & 1);
                const bool ok = j < p.t_kv && (!p.causal || j <= row[e >> 1]);
                s[nb][e] = ok ? s[nb][e] * sl2 : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[nb][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            /* the 4 lanes of a quad hold the same rows */
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m[r], mx[r]);
            /* a row with no visible key so far keeps everything at exactly zero */
            const float base = m_new == -INFINITY ? 0.0f : m_new;
            const float alpha = exp2f(m[r] - base);
            m[r] = m_new;
            l[r] *= alpha;
#pragma unroll
            for (int nd = 0; nd < HD / 8; nd++) {
                acc[nd][2 * r] *= alpha;
                acc[nd][2 * r + 1] *= alpha;
            }
            mx[r] = base;
        }
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[nb][e] = exp2f(s[nb][e] - mx[e >> 1]);
                l[e >> 1] += s[nb][e];
            }
        fa_mma_pb<HD>(acc, s, cv, lane);
        __syncthreads(); /* every warp is done with buffer t & 1 */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    /* every stored row saw key 0, so l >= 1 there; rows past t_q are not stored */
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++) {
        acc[nd][0] *= inv[0];
        acc[nd][1] *= inv[0];
        acc[nd][2] *= inv[1];
        acc[nd][3] *= inv[1];
    }
    const int row0 = q0 + warp * 16;
    fa_store_rows<HD>(p.out + ((int64_t)b * p.t_q + row0) * p.ld_o + hoff, p.ld_o, p.t_q - row0,
                      acc, 1.0f, 0, g, tg);
    if (p.lse && tg == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (row[r] < p.t_q)
                p.lse[((int64_t)b * p.heads + h) * p.t_q + row[r]] = m[r] * FA_LN2 + logf(l[r]);
}

/* ---- backward --------------------------------------------------------------------------------
 * D [batch, heads, t_q] = rowsum(dO o O) per head: one warp per row, fixed shuffle order. */
template <int HD>
static __global__ void fa_rowdot_kernel(int64_t rows, int heads, int t_q, int64_t ld_o,
                                        const uint16_t *o, const uint16_t *dout, float *dd)
{
    const int lane = threadIdx.x % 32;
    const int64_t nwarps = (int64_t)gridDim.x * blockDim.x / 32;
    for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows;
         r += nwarps) {
        const int i = (int)(r % t_q);
        const int64_t bh = r / t_q;
        const int h = (int)(bh % heads);
        const int64_t b = bh / heads;
        const int64_t base = (b * t_q + i) * ld_o + (int64_t)h * HD;
        float acc = 0.0f;
        for (int e = lane; e < HD; e += 32)
            acc += fa_bf16_to_f32(o[base + e]) * fa_bf16_to_f32(dout[base + e]);
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0)
            dd[r] = acc;
    }
}

/* dK and dV of one 64-key tile: grid (key tiles, heads, batch). Each warp owns 16 keys and
 * loops over the query tiles (causal: those at or after the key tile) in order, working on
 * transposed blocks so its keys are the M dimension:
 *   S^T = K Q^T,  P^T = exp(scale S^T - lse),  dV += P^T dO,
 *   dP^T = V dO^T,  dS^T = P^T o (dP^T - D),  dK += dS^T Q  (times scale at the end).
 * out = dk, out2 = dv; either may be NULL. */
template <int HD>
static __global__ void __launch_bounds__(FA_THREADS)
    fa_backward_kv_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LDS = HD + 8;
    uint16_t *sk = reinterpret_cast<uint16_t *>(fa_smem);
    uint16_t *sv = sk + FA_TILE * LDS;
    uint16_t *sq = sv + FA_TILE * LDS;       /* two Q buffers, two dO buffers, then lse and D */
    uint16_t *sdo = sq + 2 * FA_TILE * LDS;
    float *slse = reinterpret_cast<float *>(sdo + 2 * FA_TILE * LDS); /* log2 domain, 2 x 64 */
    float *sdd = slse + 2 * FA_TILE;
    const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * FA_TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int64_t hoff = (int64_t)h * HD;
    const int64_t bh = (int64_t)b * p.heads + h;
    const uint16_t *qb = p.q + (int64_t)b * p.t_q * p.ld_q + hoff;
    const uint16_t *dob = p.dout + (int64_t)b * p.t_q * p.ld_o + hoff;

    const int krows = min(FA_TILE, p.t_kv - k0);
    fa_load_tile<HD>(sk, p.k + ((int64_t)b * p.t_kv + k0) * p.ld_k + hoff, p.ld_k, krows,
                     p.vec & FA_VEC_K);
    fa_load_tile<HD>(sv, p.v + ((int64_t)b * p.t_kv + k0) * p.ld_v + hoff, p.ld_v, krows,
                     p.vec & FA_VEC_V);
    /* causal: query i sees key j only when i >= j, and k0 is a multiple of the tile */
    const int qbegin = p.causal ? k0 : 0;
    const int ntiles = (p.t_q - qbegin + FA_TILE - 1) / FA_TILE;
    /* Q, dO, lse and D of query tile `tile` into buffer `buf` */
    auto load_q_tile = [&](int tile, int buf) {
        const int q0 = qbegin + tile * FA_TILE, qrows = min(FA_TILE, p.t_q - q0);
        fa_load_tile<HD>(sq + buf * FA_TILE * LDS, qb + (int64_t)q0 * p.ld_q, p.ld_q, qrows,
                         p.vec & FA_VEC_Q, true);
        fa_load_tile<HD>(sdo + buf * FA_TILE * LDS, dob + (int64_t)q0 * p.ld_o, p.ld_o, qrows,
                         p.vec & FA_VEC_DO, true);
        if (threadIdx.x < FA_TILE) {
            const int i = q0 + threadIdx.x;
            slse[buf * FA_TILE + threadIdx.x] =
                i < p.t_q ? p.lse_in[bh * p.t_q + i] * FA_LOG2E : 0.0f;
            sdd[buf * FA_TILE + threadIdx.x] = i < p.t_q ? p.dd[bh * p.t_q + i] : 0.0f;
        }
    };
    if (ntiles > 0)
        load_q_tile(0, 0);
    fa_cp_commit();
    __syncthreads();
    uint32_t kf[HD / 16][4], vf[HD / 16][4];
    fa_load_a<HD>(kf, sk + warp * 16 * LDS, g, tg);
    fa_load_a<HD>(vf, sv + warp * 16 * LDS, g, tg);

    const int key[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    const float sl2 = p.scale * FA_LOG2E;
    float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[nd][e] = dv[nd][e] = 0.0f;

    /* double buffering as in the forward */
    for (int t = 0; t < ntiles; t++) {
        const int q0 = qbegin + t * FA_TILE;
        const uint16_t *cq = sq + (t & 1) * FA_TILE * LDS, *cdo = sdo + (t & 1) * FA_TILE * LDS;
        const float *clse = slse + (t & 1) * FA_TILE, *cdd = sdd + (t & 1) * FA_TILE;
        if (t + 1 < ntiles)
            load_q_tile(t + 1, (t + 1) & 1);
        fa_cp_commit();
        fa_cp_wait1();
        __syncthreads();

        float pt[8][4], dpt[8][4];
        fa_mma_abt<HD>(pt, kf, cq, lane);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = nb * 8 + 2 * tg + (e & 1); /* query within the tile */
                const bool ok = q0 + c < p.t_q && (!p.causal || q0 + c >= key[e >> 1]);
                pt[nb][e] = ok ? exp2f(pt[nb][e] * sl2 - clse[c]) : 0.0f;
            }
        if (p.out2)
            fa_mma_pb<HD>(dv, pt, cdo, lane);
        if (p.out) {
            fa_mma_abt<HD>(dpt, vf, cdo, lane);
#pragma unroll
            for (int nb = 0; nb < 8; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    dpt[nb][e] = pt[nb][e] * (dpt[nb][e] - cdd[nb * 8 + 2 * tg + (e & 1)]);
            fa_mma_pb<HD>(dk, dpt, cq, lane);
        }
        __syncthreads(); /* every warp is done with buffer t & 1 */
    }

    const int row0 = k0 + warp * 16;
    const int64_t at = ((int64_t)b * p.t_kv + row0);
    if (p.out)
        fa_store_rows<HD>(p.out + at * p.ld_k + hoff, p.ld_k, p.t_kv - row0, dk, p.scale,
                          p.accumulate, g, tg);
    if (p.out2)
        fa_store_rows<HD>(p.out2 + at * p.ld_v + hoff, p.ld_v, p.t_kv - row0, dv, 1.0f,
                          p.accumulate, g, tg);
}

/* dQ of one 64-query tile: grid (query tiles, heads, batch). Each warp owns 16 queries and
 * loops over the key tiles (causal: up to the diagonal) in order:
 *   S = Q K^T,  P = exp(scale S - lse),  dP = dO V^T,  dS = P o (dP - D),  dQ += dS K. */
template <int HD>
static __global__ void __launch_bounds__(FA_THREADS)
    fa_backward_q_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LDS = HD + 8;
    uint16_t *sq = reinterpret_cast<uint16_t *>(fa_smem);
    uint16_t *sdo = sq + FA_TILE * LDS;
    uint16_t *sk = sdo + FA_TILE * LDS; /* two K buffers, then two V buffers */
    uint16_t *sv = sk + 2 * FA_TILE * LDS;
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FA_TILE;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tg = lane % 4;
    const int64_t hoff = (int64_t)h * HD;
    const int64_t bh = (int64_t)b * p.heads + h;
    const uint16_t *kb = p.k + (int64_t)b * p.t_kv * p.ld_k + hoff;
    const uint16_t *vb = p.v + (int64_t)b * p.t_kv * p.ld_v + hoff;

    const int qrows = min(FA_TILE, p.t_q - q0);
    fa_load_tile<HD>(sq, p.q + ((int64_t)b * p.t_q + q0) * p.ld_q + hoff, p.ld_q, qrows,
                     p.vec & FA_VEC_Q);
    fa_load_tile<HD>(sdo, p.dout + ((int64_t)b * p.t_q + q0) * p.ld_o + hoff, p.ld_o, qrows,
                     p.vec & FA_VEC_DO);
    const int kv_end = p.causal ? min(p.t_kv, q0 + FA_TILE) : p.t_kv;
    const int ntiles = (kv_end + FA_TILE - 1) / FA_TILE;
    fa_load_tile<HD>(sk, kb, p.ld_k, min(FA_TILE, p.t_kv), p.vec & FA_VEC_K, true);
    fa_load_tile<HD>(sv, vb, p.ld_v, min(FA_TILE, p.t_kv), p.vec & FA_VEC_V, true);
    fa_cp_commit();
    __syncthreads();
    uint32_t qf[HD / 16][4], dof[HD / 16][4];
    fa_load_a<HD>(qf, sq + warp * 16 * LDS, g, tg);
    fa_load_a<HD>(dof, sdo + warp * 16 * LDS, g, tg);

    const int row[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float lse2[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lse2[r] = row[r] < p.t_q ? p.lse_in[bh * p.t_q + row[r]] * FA_LOG2E : 0.0f;
        dd[r] = row[r] < p.t_q ? p.dd[bh * p.t_q + row[r]] : 0.0f;
    }
    const float sl2 = p.scale * FA_LOG2E;
    float dq[HD / 8][4];
#pragma unroll
    for (int nd = 0; nd < HD / 8; nd++)
        dq[nd][0] = dq[nd][1] = dq[nd][2] = dq[nd][3] = 0.0f;

    /* double buffering as in the forward */
    for (int t = 0; t < ntiles; t++) {
        const int kv0 = t * FA_TILE;
        const uint16_t *ck = sk + (t & 1) * FA_TILE * LDS, *cv = sv + (t & 1) * FA_TILE * LDS;
        if (t + 1 < ntiles) {
            const int next = kv0 + FA_TILE, rows = min(FA_TILE, p.t_kv - next);
            uint16_t *nk = sk + ((t + 1) & 1) * FA_TILE * LDS;
            uint16_t *nv = sv + ((t + 1) & 1) * FA_TILE * LDS;
            fa_load_tile<HD>(nk, kb + (int64_t)next * p.ld_k, p.ld_k, rows, p.vec & FA_VEC_K, true);
            fa_load_tile<HD>(nv, vb + (int64_t)next * p.ld_v, p.ld_v, rows, p.vec & FA_VEC_V, true);
        }
        fa_cp_commit();
        fa_cp_wait1();
        __syncthreads();

        float s[8][4], dp[8][4];
        fa_mma_abt<HD>(s, qf, ck, lane);
        fa_mma_abt<HD>(dp, dof, cv, lane);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const int j = kv0 + nb * 8 + 2 * tg + (e & 1);
                const bool ok = row[r] < p.t_q && j < p.t_kv && (!p.causal || j <= row[r]);
                const float pr = ok ? exp2f(s[nb][e] * sl2 - lse2[r]) : 0.0f;
                s[nb][e] = pr * (dp[nb][e] - dd[r]);
            }
        fa_mma_pb<HD>(dq, s, ck, lane);
        __syncthreads(); /* every warp is done with buffer t & 1 */
    }

    const int row0 = q0 + warp * 16;
    fa_store_rows<HD>(p.out + ((int64_t)b * p.t_q + row0) * p.ld_q + hoff, p.ld_q, p.t_q - row0,
                      dq, p.scale, p.accumulate, g, tg);
}

/* ---- host side -------------------------------------------------------------------------- */

/* The math path's entries, kept when this file takes the table's attention entries over. */
static size_t (*math_forward_scratch)(const sd_backend *, const sd_attention_desc *);
static void (*math_forward)(const sd_backend *, const sd_attention_desc *, const void *,
                            const void *, const void *, void *, float *, sd_scratch);
static size_t (*math_backward_scratch)(const sd_backend *, const sd_attention_desc *);
static void (*math_backward)(const sd_backend *, const sd_attention_desc *, const void *,
                             const void *, const void *, const void *, const float *,
                             const void *, void *, void *, void *, int, sd_scratch);

/* Whether the fused kernels take this descriptor: a decision on the backend and descriptor only,
 * so the scratch query and the op agree. Pointer alignment is handled inside (16-byte loads
 * where allowed, element loads elsewhere). */
static int fa_takes(const sd_backend *be, const sd_attention_desc *d)
{
    const sd_cuda_state *st = sd_cuda(be);
    return st->attention_mode == SD_CUDA_ATTENTION_FLASH && st->dtype == SD_BF16 &&
           (d->head_dim == 32 || d->head_dim == 64 || d->head_dim == 128) &&
           d->batch <= 65535 && d->heads <= 65535;
}

/* A bf16 tensor allows 16-byte loads of 8 elements at any (token, head) when its address and
 * its row stride in bytes are multiples of 16 (head_dim is a multiple of 8). */
static int fa_vec_ok(const void *p, int ld)
{
    return p && (uintptr_t)p % 16 == 0 && ld % 8 == 0;
}

static fa_params fa_make_params(const sd_attention_desc *d, const void *q, const void *k,
                                const void *v)
{
    fa_params p;
    memset(&p, 0, sizeof p);
    p.q = (const uint16_t *)q;
    p.k = (const uint16_t *)k;
    p.v = (const uint16_t *)v;
    p.ld_q = d->ld_q;
    p.ld_k = d->ld_k;
    p.ld_v = d->ld_v;
    p.ld_o = d->ld_o;
    p.t_q = d->t_q;
    p.t_kv = d->t_kv;
    p.heads = d->heads;
    p.scale = d->scale;
    p.causal = d->causal;
    p.vec = (fa_vec_ok(q, d->ld_q) ? FA_VEC_Q : 0) | (fa_vec_ok(k, d->ld_k) ? FA_VEC_K : 0) |
            (fa_vec_ok(v, d->ld_v) ? FA_VEC_V : 0);
    return p;
}

/* Raises a kernel's dynamic shared-memory limit above the default 48 KiB, once per kernel and
 * device (the attribute belongs to the function on the current device). Host calls come from
 * the thread that drives the backend; the table holds every kernel of this file on 7 devices. */
static void fa_allow_smem(const sd_backend *be, const void *kernel, size_t smem)
{
    static struct {
        const void *kernel;
        int device;
    } done[64];
    static int ndone;
    const int device = sd_cuda(be)->device;
    for (int i = 0; i < ndone; i++)
        if (done[i].kernel == kernel && done[i].device == device)
            return;
    SD_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem));
    if (ndone < (int)(sizeof done / sizeof done[0])) {
        done[ndone].kernel = kernel;
        done[ndone].device = device;
        ndone++;
    }
}

/* Launches kernel<HD> on grid (tiles over `t`, heads, batch) with `smem` dynamic bytes (a
 * fixed size per kernel). */
template <int HD>
static void fa_launch(const sd_backend *be, void (*kernel)(fa_params), const sd_attention_desc *d,
                      int t, size_t smem, const fa_params &p)
{
    if (smem > 48 * 1024)
        fa_allow_smem(be, (const void *)kernel, smem);
    const dim3 grid((unsigned)((t + FA_TILE - 1) / FA_TILE), (unsigned)d->heads,
                    (unsigned)d->batch);
    kernel<<<grid, FA_THREADS, smem, sd_cuda_stream(be)>>>(p);
    SD_CUDA_LAUNCHED(be);
}

template <int HD>
static void fa_forward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                       const void *k, const void *v, void *o, float *lse)
{
    fa_params p = fa_make_params(d, q, k, v);
    p.out = (uint16_t *)o;
    p.lse = lse;
    fa_launch<HD>(be, fa_forward_kernel<HD>, d, d->t_q, fa_smem_bytes<HD>(5, 0), p);
}

template <int HD>
static void fa_backward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                        const void *k, const void *v, const void *o, const float *lse,
                        const void *dout, void *dq, void *dk, void *dv, int accumulate, float *dd)
{
    const int64_t rows = (int64_t)d->batch * d->heads * d->t_q;
    fa_rowdot_kernel<HD><<<sd_cuda_grid(be, rows * 32, 256), 256, 0, sd_cuda_stream(be)>>>(
        rows, d->heads, d->t_q, d->ld_o, (const uint16_t *)o, (const uint16_t *)dout, dd);
    SD_CUDA_LAUNCHED(be);

    fa_params p = fa_make_params(d, q, k, v);
    p.dout = (const uint16_t *)dout;
    p.lse_in = lse;
    p.dd = dd;
    p.accumulate = accumulate;
    p.vec |= fa_vec_ok(dout, d->ld_o) ? FA_VEC_DO : 0;
    if (dk || dv) {
        p.out = (uint16_t *)dk;
        p.out2 = (uint16_t *)dv;
        fa_launch<HD>(be, fa_backward_kv_kernel<HD>, d, d->t_kv, fa_smem_bytes<HD>(6, 4 * FA_TILE),
                      p);
    }
    if (dq) {
        p.out = (uint16_t *)dq;
        p.out2 = NULL;
        fa_launch<HD>(be, fa_backward_q_kernel<HD>, d, d->t_q, fa_smem_bytes<HD>(6, 0), p);
    }
}

static size_t cuda_flash_forward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    return fa_takes(be, d) ? 0 : math_forward_scratch(be, d);
}

static void cuda_flash_forward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                               const void *k, const void *v, void *o, float *lse, sd_scratch ws)
{
    if (!fa_takes(be, d)) {
        math_forward(be, d, q, k, v, o, lse, ws);
        return;
    }
    switch (d->head_dim) {
    case 32:
        fa_forward<32>(be, d, q, k, v, o, lse);
        break;
    case 64:
        fa_forward<64>(be, d, q, k, v, o, lse);
        break;
    default:
        fa_forward<128>(be, d, q, k, v, o, lse);
        break;
    }
}

/* D = rowsum(dO o O) per query row and head, fp32. */
static size_t fa_backward_need(const sd_attention_desc *d)
{
    return sd_cuda_align((size_t)d->batch * d->heads * d->t_q * sizeof(float));
}

static size_t cuda_flash_backward_scratch(const sd_backend *be, const sd_attention_desc *d)
{
    return fa_takes(be, d) ? fa_backward_need(d) : math_backward_scratch(be, d);
}

static void cuda_flash_backward(const sd_backend *be, const sd_attention_desc *d, const void *q,
                                const void *k, const void *v, const void *o, const float *lse,
                                const void *dout, void *dq, void *dk, void *dv, int accumulate,
                                sd_scratch ws)
{
    if (!fa_takes(be, d)) {
        math_backward(be, d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, ws);
        return;
    }
    SD_CHECK(ws.bytes >= fa_backward_need(d), "flash attention backward scratch %zu < %zu",
             ws.bytes, fa_backward_need(d));
    if (!dq && !dk && !dv)
        return;
    float *dd = (float *)ws.ptr;
    switch (d->head_dim) {
    case 32:
        fa_backward<32>(be, d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, dd);
        break;
    case 64:
        fa_backward<64>(be, d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, dd);
        break;
    default:
        fa_backward<128>(be, d, q, k, v, o, lse, dout, dq, dk, dv, accumulate, dd);
        break;
    }
}

void sd_cuda_fill_attention_ops(sd_ops *ops)
{
    /* the same four functions for every backend, so sharing the statics is harmless */
    math_forward_scratch = ops->attention_forward_scratch;
    math_forward = ops->attention_forward;
    math_backward_scratch = ops->attention_backward_scratch;
    math_backward = ops->attention_backward;
    SD_CHECK(math_forward_scratch && math_forward && math_backward_scratch && math_backward,
             "the math attention entries must be filled before the fused ones");
    ops->attention_forward_scratch = cuda_flash_forward_scratch;
    ops->attention_forward = cuda_flash_forward;
    ops->attention_backward_scratch = cuda_flash_backward_scratch;
    ops->attention_backward = cuda_flash_backward;
}
