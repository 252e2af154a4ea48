// Host emulation of the fused attention kernels of src/nn/cuda/ops_cuda_attention.cu, for
// checking their logic where there is no GPU (run it through tests/gpu/flash_emulate.sh, which
// extracts the device half of that file into kernels.inc). Each CTA runs as 128 OS threads
// with real barriers; __shfl_xor_sync, mma.sync m16n8k16 and ldmatrix.x4 (.trans) are emulated
// per warp from the PTX ISA's fragment definitions, independently of how the kernels use them.
// Results are compared with a double-precision reference of attention forward and backward.
// It cannot tell whether the PTX definitions were read right, nor anything about resources,
// launch limits or speed.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

struct emu_dim3 {
    unsigned x, y, z;
};
thread_local emu_dim3 threadIdx, blockIdx;
emu_dim3 gridDim, blockDim;
struct uint4 {
    unsigned x, y, z, w;
};
static uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d)
{
    return {a, b, c, d};
}
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __align__(x)
static int min(int a, int b)
{
    return a < b ? a : b;
}

struct cta_state {
    std::vector<unsigned char> smem;
    std::barrier<> *bar;
    std::barrier<> *wbar[8];
    float fx[8][32];
    uint32_t mx[8][32][6];
};
thread_local cta_state *cur;
static unsigned char *emu_smem()
{
    return cur->smem.data();
}
static void __syncthreads()
{
    cur->bar->arrive_and_wait();
}
static float __shfl_xor_sync(unsigned, float v, int o)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    cur->fx[w][l] = v;
    cur->wbar[w]->arrive_and_wait();
    float r = cur->fx[w][l ^ o];
    cur->wbar[w]->arrive_and_wait();
    return r;
}
static float __uint_as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct emu_bf16 {
    uint16_t x;
};
static emu_bf16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (std::isnan(f))
        return {(uint16_t)0x7fc0};
    u += 0x7fff + ((u >> 16) & 1);
    return {(uint16_t)(u >> 16)};
}
static uint16_t __bfloat16_as_ushort(emu_bf16 b)
{
    return b.x;
}
static float bf(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}
static float half_of(uint32_t r, int hi)
{
    return bf((uint16_t)(hi ? r >> 16 : r & 0xffff));
}

static void fa_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                   uint32_t b1)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    uint32_t *m = cur->mx[w][l];
    m[0] = a0, m[1] = a1, m[2] = a2, m[3] = a3, m[4] = b0, m[5] = b1;
    cur->wbar[w]->arrive_and_wait();
    const int g = l >> 2, tg = l & 3;
    float out[4];
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * tg + (e & 1);
        float s = 0;
        for (int k = 0; k < 16; k++) {
            // A(row, k): reg (row >= 8) + 2 (k >= 8), lane (row % 8) * 4 + (k % 8) / 2
            int ar = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0), al = (row % 8) * 4 + (k % 8) / 2;
            // B(k, col): reg (k >= 8), lane col * 4 + (k % 8) / 2
            int br = 4 + (k >= 8 ? 1 : 0), bl = col * 4 + (k % 8) / 2;
            s += half_of(cur->mx[w][al][ar], k & 1) * half_of(cur->mx[w][bl][br], k & 1);
        }
        out[e] = s;
    }
    cur->wbar[w]->arrive_and_wait();
    for (int e = 0; e < 4; e++)
        c[e] += out[e];
}

// ldmatrix.x4 (trans: transposed): lane l gives the address of row l % 8 of matrix l / 8.
static const uint16_t *ptr_xch[8][32];
static void emu_ldsm(uint32_t r[4], const uint16_t *p, bool trans)
{
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    // one CTA runs at a time, so one exchange area serves all
    if ((uintptr_t)p % 16 != 0 || p < (const uint16_t *)cur->smem.data() ||
        p + 8 > (const uint16_t *)(cur->smem.data() + cur->smem.size())) {
        fprintf(stderr, "ldmatrix row address misaligned or outside shared memory\n");
        abort();
    }
    ptr_xch[w][l] = p;
    cur->wbar[w]->arrive_and_wait();
    for (int m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (!trans) { // row l/4, elements 2(l%4), +1
            const uint16_t *row = ptr_xch[w][m * 8 + l / 4];
            lo = row[2 * (l % 4)];
            hi = row[2 * (l % 4) + 1];
        } else { // elements (2(l%4), l/4), (2(l%4)+1, l/4)
            lo = ptr_xch[w][m * 8 + 2 * (l % 4)][l / 4];
            hi = ptr_xch[w][m * 8 + 2 * (l % 4) + 1][l / 4];
        }
        r[m] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    cur->wbar[w]->arrive_and_wait();
}
static void fa_ldsm4(uint32_t r[4], const uint16_t *p) { emu_ldsm(r, p, false); }
static void fa_ldsm4t(uint32_t r[4], const uint16_t *p) { emu_ldsm(r, p, true); }

// cp.async: the 16-byte copy lands either at issue (emu_cp_late = false: catches a buffer
// overwritten while other warps still read it) or as late as allowed, at the wait that
// retires its group (true: catches a missing wait).
static bool emu_cp_late;
struct emu_copy {
    void *dst;
    const void *src;
};
thread_local std::vector<emu_copy> emu_open;
thread_local std::vector<std::vector<emu_copy>> emu_groups;
static void fa_cp_async16(void *dst, const void *src)
{
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) {
        fprintf(stderr, "cp.async address not 16-byte aligned\n");
        abort();
    }
    if ((unsigned char *)dst < cur->smem.data() ||
        (unsigned char *)dst + 16 > cur->smem.data() + cur->smem.size()) {
        fprintf(stderr, "cp.async destination outside shared memory\n");
        abort();
    }
    if (emu_cp_late)
        emu_open.push_back({dst, src});
    else
        memcpy(dst, src, 16);
}
static void fa_cp_commit()
{
    emu_groups.push_back(emu_open);
    emu_open.clear();
}
static void fa_cp_wait1()
{
    while (emu_groups.size() > 1) {
        for (auto &c : emu_groups.front())
            memcpy(c.dst, c.src, 16);
        emu_groups.erase(emu_groups.begin());
    }
}

#include "kernels.inc"

static void launch(void (*kernel)(fa_params), unsigned gx, unsigned gy, unsigned gz, size_t smem,
                   const fa_params &p)
{
    for (unsigned z = 0; z < gz; z++)
        for (unsigned y = 0; y < gy; y++)
            for (unsigned x = 0; x < gx; x++) {
                cta_state st;
                st.smem.assign(smem, 0xAB); // garbage, like real shared memory
                std::barrier<> bar(FA_THREADS);
                std::vector<std::barrier<> *> wb;
                for (int w = 0; w < FA_THREADS / 32; w++)
                    st.wbar[w] = new std::barrier<>(32);
                st.bar = &bar;
                std::vector<std::thread> th;
                for (int t = 0; t < FA_THREADS; t++)
                    th.emplace_back([&, t] {
                        threadIdx = {(unsigned)t, 0, 0};
                        blockIdx = {x, y, z};
                        cur = &st;
                        kernel(p);
                    });
                for (auto &t : th)
                    t.join();
                for (int w = 0; w < FA_THREADS / 32; w++)
                    delete st.wbar[w];
            }
}

static void launch_rowdot(void (*kernel)(int64_t, int, int, int64_t, const uint16_t *,
                                         const uint16_t *, float *),
                          int64_t rows, int heads, int t_q, int64_t ld_o, const uint16_t *o,
                          const uint16_t *dout, float *dd)
{
    const int threads = 256;
    unsigned blocks = (unsigned)((rows * 32 + threads - 1) / threads);
    if (blocks > 4)
        blocks = 4; // exercise the grid-stride loop
    gridDim = {blocks, 1, 1};
    blockDim = {(unsigned)threads, 1, 1};
    for (unsigned x = 0; x < blocks; x++) {
        cta_state st;
        std::barrier<> bar(threads);
        for (int w = 0; w < threads / 32; w++)
            st.wbar[w] = new std::barrier<>(32);
        st.bar = &bar;
        std::vector<std::thread> th;
        for (int t = 0; t < threads; t++)
            th.emplace_back([&, t] {
                threadIdx = {(unsigned)t, 0, 0};
                blockIdx = {x, 0, 0};
                cur = &st;
                kernel(rows, heads, t_q, ld_o, o, dout, dd);
            });
        for (auto &t : th)
            t.join();
        for (int w = 0; w < threads / 32; w++)
            delete st.wbar[w];
    }
}

// ---- reference (double) on bf16 values ------------------------------------------------------
struct cfg {
    int b, h, d, tq, tkv, causal, ld_pad, acc, null_mask;
};

static uint16_t tobf(float f)
{
    return __float2bfloat16_rn(f).x;
}

static double relerr(const std::vector<double> &got, const std::vector<double> &ref)
{
    double n = 0, dd = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (!std::isfinite(got[i]))
            return INFINITY;
        n += (got[i] - ref[i]) * (got[i] - ref[i]);
        dd += ref[i] * ref[i];
    }
    return dd > 0 ? sqrt(n / dd) : sqrt(n);
}

static int run(const cfg &c, std::mt19937 &rng)
{
    const int C = c.h * c.d;
    const int ld = C + c.ld_pad;
    std::normal_distribution<float> nd(0.f, 1.f);
    auto mk = [&](int64_t n) {
        std::vector<uint16_t> v(n);
        for (auto &x : v)
            x = tobf(nd(rng));
        return v;
    };
    const int64_t nq = (int64_t)c.b * c.tq * ld, nk = (int64_t)c.b * c.tkv * ld;
    auto q = mk(nq), k = mk(nk), v = mk(nk), dout = mk(nq);
    const float scale = 1.0f / sqrtf((float)c.d);
    // reference forward
    std::vector<double> o_ref(nq, 0), lse_ref((int64_t)c.b * c.h * c.tq);
    std::vector<double> dq_ref(nq, 0), dk_ref(nk, 0), dv_ref(nk, 0);
    std::vector<uint16_t> o_bf(nq, 0);
    auto Q = [&](int b, int i, int h, int e) { return (double)bf(q[((int64_t)b * c.tq + i) * ld + h * c.d + e]); };
    auto K = [&](int b, int j, int h, int e) { return (double)bf(k[((int64_t)b * c.tkv + j) * ld + h * c.d + e]); };
    auto V = [&](int b, int j, int h, int e) { return (double)bf(v[((int64_t)b * c.tkv + j) * ld + h * c.d + e]); };
    auto DO = [&](int b, int i, int h, int e) { return (double)bf(dout[((int64_t)b * c.tq + i) * ld + h * c.d + e]); };
    for (int b = 0; b < c.b; b++)
        for (int h = 0; h < c.h; h++)
            for (int i = 0; i < c.tq; i++) {
                int vis = c.causal ? i + 1 : c.tkv;
                std::vector<double> s(vis), pr(vis);
                double mx = -1e300;
                for (int j = 0; j < vis; j++) {
                    double a = 0;
                    for (int e = 0; e < c.d; e++)
                        a += Q(b, i, h, e) * K(b, j, h, e);
                    s[j] = a * scale;
                    mx = std::max(mx, s[j]);
                }
                double sum = 0;
                for (int j = 0; j < vis; j++)
                    sum += exp(s[j] - mx);
                lse_ref[((int64_t)b * c.h + h) * c.tq + i] = mx + log(sum);
                for (int j = 0; j < vis; j++)
                    pr[j] = exp(s[j] - mx) / sum;
                for (int e = 0; e < c.d; e++) {
                    double a = 0;
                    for (int j = 0; j < vis; j++)
                        a += pr[j] * V(b, j, h, e);
                    int64_t at = ((int64_t)b * c.tq + i) * ld + h * c.d + e;
                    o_ref[at] = a;
                    o_bf[at] = tobf((float)a);
                }
                // backward with o rounded
                double D = 0;
                for (int e = 0; e < c.d; e++)
                    D += DO(b, i, h, e) * bf(o_bf[((int64_t)b * c.tq + i) * ld + h * c.d + e]);
                for (int j = 0; j < vis; j++) {
                    double dp = 0;
                    for (int e = 0; e < c.d; e++)
                        dp += DO(b, i, h, e) * V(b, j, h, e);
                    double ds = pr[j] * (dp - D);
                    for (int e = 0; e < c.d; e++) {
                        dv_ref[((int64_t)b * c.tkv + j) * ld + h * c.d + e] += pr[j] * DO(b, i, h, e);
                        dq_ref[((int64_t)b * c.tq + i) * ld + h * c.d + e] += scale * ds * K(b, j, h, e);
                        dk_ref[((int64_t)b * c.tkv + j) * ld + h * c.d + e] += scale * ds * Q(b, i, h, e);
                    }
                }
            }
    // preloads
    std::vector<uint16_t> dq0 = mk(nq), dk0 = mk(nk), dv0 = mk(nk);
    if (c.acc) {
        for (int64_t i = 0; i < nq; i++)
            dq_ref[i] += bf(dq0[i]);
        for (int64_t i = 0; i < nk; i++) {
            dk_ref[i] += bf(dk0[i]);
            dv_ref[i] += bf(dv0[i]);
        }
    }

    // ---- kernels
    fa_params p;
    memset(&p, 0, sizeof p);
    p.q = q.data();
    p.k = k.data();
    p.v = v.data();
    p.ld_q = p.ld_k = p.ld_v = p.ld_o = ld;
    p.t_q = c.tq;
    p.t_kv = c.tkv;
    p.heads = c.h;
    p.scale = scale;
    p.causal = c.causal;
    p.vec = (c.ld_pad % 8 == 0) ? (FA_VEC_Q | FA_VEC_K | FA_VEC_V | FA_VEC_DO) : 0;
    std::vector<uint16_t> o(nq, 0x7fc0);
    std::vector<float> lse(lse_ref.size(), NAN);
    p.out = o.data();
    p.lse = lse.data();
    const unsigned gq = (c.tq + 63) / 64, gk = (c.tkv + 63) / 64;
    void (*fwd)(fa_params) = c.d == 32 ? fa_forward_kernel<32> : c.d == 64 ? fa_forward_kernel<64> : fa_forward_kernel<128>;
    void (*bkv)(fa_params) = c.d == 32 ? fa_backward_kv_kernel<32> : c.d == 64 ? fa_backward_kv_kernel<64> : fa_backward_kv_kernel<128>;
    void (*bq)(fa_params) = c.d == 32 ? fa_backward_q_kernel<32> : c.d == 64 ? fa_backward_q_kernel<64> : fa_backward_q_kernel<128>;
    auto rd = c.d == 32 ? fa_rowdot_kernel<32> : c.d == 64 ? fa_rowdot_kernel<64> : fa_rowdot_kernel<128>;
    // the sizes fa_forward / fa_backward launch with (keep in step)
    size_t smem_fwd = c.d == 32 ? fa_smem_bytes<32>(5, 0) : c.d == 64 ? fa_smem_bytes<64>(5, 0) : fa_smem_bytes<128>(5, 0);
    size_t smem_bwd = c.d == 32 ? fa_smem_bytes<32>(6, 256) : c.d == 64 ? fa_smem_bytes<64>(6, 256) : fa_smem_bytes<128>(6, 256);
    launch(fwd, gq, c.h, c.b, smem_fwd, p);

    std::vector<double> og, orf, lg(lse.begin(), lse.end());
    for (int64_t r = 0; r < (int64_t)c.b * c.tq; r++)
        for (int e = 0; e < C; e++) {
            og.push_back(bf(o[r * ld + e]));
            orf.push_back(o_ref[r * ld + e]);
        }
    double e_o = relerr(og, orf), e_l = relerr(lg, lse_ref);

    // backward: o as rounded by the reference, lse of the reference
    std::vector<float> lse_in(lse_ref.begin(), lse_ref.end()), dd(lse_ref.size(), NAN);
    launch_rowdot(rd, (int64_t)c.b * c.h * c.tq, c.h, c.tq, ld, o_bf.data(), dout.data(), dd.data());
    std::vector<uint16_t> dq = c.acc ? dq0 : std::vector<uint16_t>(nq, 0x7fc0);
    std::vector<uint16_t> dk = c.acc ? dk0 : std::vector<uint16_t>(nk, 0x7fc0);
    std::vector<uint16_t> dv = c.acc ? dv0 : std::vector<uint16_t>(nk, 0x7fc0);
    p.dout = dout.data();
    p.lse_in = lse_in.data();
    p.dd = dd.data();
    p.accumulate = c.acc;
    p.lse = nullptr;
    p.out = (c.null_mask & 2) ? nullptr : dk.data();
    p.out2 = (c.null_mask & 4) ? nullptr : dv.data();
    if (p.out || p.out2)
        launch(bkv, gk, c.h, c.b, smem_bwd, p);
    p.out = (c.null_mask & 1) ? nullptr : dq.data();
    p.out2 = nullptr;
    if (p.out)
        launch(bq, gq, c.h, c.b, smem_bwd, p);

    auto cmp = [&](const std::vector<uint16_t> &g, const std::vector<double> &r, int t) {
        std::vector<double> a, bb;
        for (int64_t row = 0; row < (int64_t)c.b * t; row++)
            for (int e = 0; e < C; e++) {
                a.push_back(bf(g[row * ld + e]));
                bb.push_back(r[row * ld + e]);
            }
        return relerr(a, bb);
    };
    double e_dq = (c.null_mask & 1) ? 0 : cmp(dq, dq_ref, c.tq);
    double e_dk = (c.null_mask & 2) ? 0 : cmp(dk, dk_ref, c.tkv);
    double e_dv = (c.null_mask & 4) ? 0 : cmp(dv, dv_ref, c.tkv);
    int ok = e_o < 1e-2 && e_l < 1e-2 && e_dq < 1e-2 && e_dk < 1e-2 && e_dv < 1e-2;
    printf("%s b%d h%d d%d tq%d tkv%d causal%d pad%d acc%d null%d: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n",
           ok ? "ok  " : "FAIL", c.b, c.h, c.d, c.tq, c.tkv, c.causal, c.ld_pad, c.acc, c.null_mask,
           e_o, e_l, e_dq, e_dk, e_dv);
    return ok;
}

int main(int argc, char **argv)
{
    std::mt19937 rng(1234);
    std::vector<cfg> cs = {
        {1, 2, 64, 100, 77, 0, 0, 0, 0},
        {1, 1, 64, 130, 130, 1, 3, 0, 0},
        {2, 1, 64, 17, 17, 0, 2 * 64, 1, 0},
        {1, 1, 32, 70, 70, 1, 0, 1, 0},
        {1, 1, 128, 65, 90, 0, 0, 0, 0},
        {1, 2, 64, 1, 1, 0, 0, 0, 0},
        {1, 1, 64, 64, 64, 1, 8, 0, 1},
        {1, 1, 64, 40, 130, 0, 0, 1, 2},
        {1, 1, 64, 40, 20, 0, 0, 0, 4},
    };
    int all = 1;
    for (int late = 0; late < 2; late++) {
        emu_cp_late = late;
        printf("cp.async copies land %s\n", late ? "at the wait" : "at issue");
        for (auto &c : cs)
            all &= run(c, rng);
    }
    printf(all ? "ALL OK\n" : "SOME FAILED\n");
    return all ? 0 : 1;
}
