// Host emulation of the group-norm statistics and apply kernels (src/nn/cuda/ops_cuda_norm.cu)
// and of the cast and objective kernels (ops_cuda_elem.cu), run through tests/gpu/norm_emulate.sh,
// which extracts their definitions into kernels.inc. A block's threads run one after another
// for kernels that never synchronize, and as OS threads with a real barrier for those that do;
// blocks run one at a time, so a kernel's __shared__ arrays are plain statics. The grids come
// from the backend's own grid helpers on a pretend GPU of 2 SMs, so the grid-stride loops wrap.
// Checks: the 16-byte apply kernel and the register variant give the bits of a scalar reference
// of the same expression (fp32 and bf16, with and without SiLU and affine parameters); the
// "fast" variant runs; the input-gradient kernels (scalar, 16-byte, register) agree bit for bit; the wide moments kernel gives the partials of the narrow one bit for bit,
// and the group statistics are those of a double-precision reference; mse_loss and the casts
// against host references.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "emulate_cuda.h"

static float emu_expf(float x) { return expf(x); } // glibc has its own __expf
#define __expf emu_expf
static float __fdividef(float a, float b) { return a / b; }
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }

thread_local std::barrier<> *cur_bar;
static void __syncthreads() { cur_bar->arrive_and_wait(); }

// the backend as the grid helpers see it: SM count and element size
struct sd_backend {
    int sm_count;
    size_t es;
};
static const sd_backend *sd_cuda(const sd_backend *be) { return be; }
static size_t sd_cuda_elem(const sd_backend *be) { return be->es; }

#include "kernels.inc"

// Runs f() as every thread of every block of the grid; `sync`: threads as OS threads with a
// barrier (the kernel calls __syncthreads), else one after another.
template <class F>
static void launch(dim3 g, dim3 b, bool sync, F f)
{
    gridDim = g;
    blockDim = b;
    const unsigned nt = b.x * b.y * b.z;
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++) {
                const dim3 blk(bx, by, bz);
                auto body = [&](unsigned t, std::barrier<> *bar) {
                    blockIdx = blk;
                    threadIdx = dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
                    cur_bar = bar;
                    f();
                };
                if (!sync) {
                    for (unsigned t = 0; t < nt; t++)
                        body(t, nullptr);
                    continue;
                }
                std::barrier<> bar((std::ptrdiff_t)nt);
                std::vector<std::thread> th;
                for (unsigned t = 0; t < nt; t++)
                    th.emplace_back(body, t, &bar);
                for (auto &x : th)
                    x.join();
            }
}

// ---- checks ----------------------------------------------------------------------------------
static int failures = 0, checks = 0;
static void check(bool ok, const char *fmt, const char *what)
{
    checks++;
    if (!ok) {
        failures++;
        printf("FAIL: ");
    } else {
        printf("ok: ");
    }
    printf(fmt, what);
    printf("\n");
}

static std::mt19937_64 rng(20261126);
static float uni(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng() >> 11) * 0x1.0p-53);
}

template <typename T>
static std::vector<T> to_t(const std::vector<float> &v)
{
    std::vector<T> o(v.size());
    for (size_t i = 0; i < v.size(); i++)
        sd_st(o.data(), (int64_t)i, v[i]);
    return o;
}

template <typename T>
static const char *tname()
{
    return sizeof(T) == 4 ? "fp32" : "bf16";
}

// apply: vec and regs against a scalar reference of the same expression (same bits), fast runs
template <typename T>
static void apply_case(int n, int hw, int c, int groups, int silu, int affine)
{
    const sd_backend be = {2, sizeof(T)};
    const int64_t per = (int64_t)hw * c, total = n * per;
    std::vector<float> xf(total), gf(c), bf(c), mean(n * groups), rstd(n * groups);
    for (auto &v : xf)
        v = uni(-3, 3);
    for (int i = 0; i < c; i++)
        gf[i] = uni(0.5f, 1.5f), bf[i] = uni(-0.5f, 0.5f);
    for (int i = 0; i < n * groups; i++)
        mean[i] = uni(-0.5f, 0.5f), rstd[i] = uni(0.5f, 2.0f);
    std::vector<T> x = to_t<T>(xf), g = to_t<T>(gf), b = to_t<T>(bf);
    const T *gp = affine ? g.data() : nullptr, *bp = affine ? b.data() : nullptr;
    std::vector<T> ref(total), yv(total), yr(total), yf(total), ys(total);
    const int cg = c / groups;
    for (int64_t i = 0; i < total; i++) {
        const int64_t s = i / per;
        const int ch = (int)(i % c);
        float o = (sd_ld(x.data(), i) - mean[s * groups + ch / cg]) * rstd[s * groups + ch / cg];
        if (gp)
            o = o * sd_ld(gp, ch);
        if (bp)
            o = o + sd_ld(bp, ch);
        sd_st(ref.data(), i, silu ? norm_silu(o) : o);
    }
    char what[160];
    snprintf(what, sizeof what, "%s n=%d hw=%d c=%d groups=%d%s%s", tname<T>(), n, hw, c, groups,
             silu ? " silu" : "", affine ? " affine" : "");
    if (!gn_vec_ok(&be, per, c, x.data(), yv.data(), n)) {
        check(false, "apply %s: gn_vec_ok refuses the shape", what);
        return;
    }
    dim3 gv = gn_vec_grid(&be, per, n), gr = gn_regs_grid(&be, per, c, n);
    launch(gv, dim3(NORM_THREADS), false, [&] {
        gn_apply_vec_kernel<T>((int)per, c, groups, x.data(), gp, bp, mean.data(), rstd.data(),
                               silu, yv.data());
    });
    launch(gr, dim3(NORM_THREADS), false, [&] {
        gn_apply_regs_kernel<T, false>((int)per, c, groups, x.data(), gp, bp, mean.data(),
                                       rstd.data(), silu, yr.data());
    });
    launch(gr, dim3(NORM_THREADS), false, [&] {
        gn_apply_regs_kernel<T, true>((int)per, c, groups, x.data(), gp, bp, mean.data(),
                                      rstd.data(), silu, yf.data());
    });
    launch(dim3(7), dim3(NORM_THREADS), false, [&] {
        gn_apply_kernel<T>(total, per, c, groups, x.data(), gp, bp, mean.data(), rstd.data(), silu,
                           ys.data());
    });
    const size_t bytes = (size_t)total * sizeof(T);
    const int64_t vec = 16 / (int64_t)sizeof(T);
    const bool wraps = (int64_t)gr.x * NORM_THREADS * vec < per;
    check(memcmp(ref.data(), yv.data(), bytes) == 0, "apply %s: 16-byte kernel = reference", what);
    check(memcmp(ref.data(), yr.data(), bytes) == 0, "apply %s: regs kernel = reference", what);
    check(memcmp(ref.data(), ys.data(), bytes) == 0, "apply %s: scalar kernel = reference", what);
    check(memcmp(ref.data(), yf.data(), bytes) == 0, "apply %s: fast kernel (expf here) = reference",
          what);
    char w2[200];
    snprintf(w2, sizeof w2, "%s: regs grid %u x %u blocks, step %lld pieces, a multiple of c/vec; %s",
             what, gr.x, gr.y, (long long)gr.x * NORM_THREADS,
             wraps ? "the loop wraps" : "no wrap");
    check((int64_t)gr.x * NORM_THREADS % (c / vec) == 0, "%s", w2);
}

// input gradient: the scalar, 16-byte and register kernels give the same bits (written and
// accumulated), on random statistics and group coefficients
template <typename T>
static void dx_case(int n, int hw, int c, int groups, int silu, int affine, int accumulate)
{
    const sd_backend be = {2, sizeof(T)};
    const int64_t per = (int64_t)hw * c, total = n * per;
    std::vector<float> xf(total), dyf(total), oldf(total), gf(c), bf(c), mean(n * groups),
        rstd(n * groups), coef(2 * n * groups);
    for (auto &v : xf)
        v = uni(-3, 3);
    for (auto &v : dyf)
        v = uni(-1, 1);
    for (auto &v : oldf)
        v = uni(-1, 1);
    for (int i = 0; i < c; i++)
        gf[i] = uni(0.5f, 1.5f), bf[i] = uni(-0.5f, 0.5f);
    for (int i = 0; i < n * groups; i++)
        mean[i] = uni(-0.5f, 0.5f), rstd[i] = uni(0.5f, 2.0f);
    for (auto &v : coef)
        v = uni(-0.1f, 0.1f);
    std::vector<T> x = to_t<T>(xf), dy = to_t<T>(dyf), g = to_t<T>(gf), b = to_t<T>(bf);
    const T *gp = affine ? g.data() : nullptr, *bp = affine && silu ? b.data() : nullptr;
    std::vector<T> ds = to_t<T>(oldf), dv = ds, dr = ds;
    launch(dim3(5), dim3(NORM_THREADS), false, [&] {
        gn_dx_kernel<T>(total, per, c, groups, x.data(), gp, bp, mean.data(), rstd.data(),
                        coef.data(), dy.data(), silu, ds.data(), accumulate);
    });
    launch(gn_vec_grid(&be, per, n), dim3(NORM_THREADS), false, [&] {
        gn_dx_vec_kernel<T>((int)per, c, groups, x.data(), gp, bp, mean.data(), rstd.data(),
                            coef.data(), dy.data(), silu, dv.data(), accumulate);
    });
    launch(gn_regs_grid(&be, per, c, n), dim3(NORM_THREADS), false, [&] {
        gn_dx_regs_kernel<T>((int)per, c, groups, x.data(), gp, bp, mean.data(), rstd.data(),
                             coef.data(), dy.data(), silu, dr.data(), accumulate);
    });
    char what[160];
    snprintf(what, sizeof what, "%s n=%d hw=%d c=%d groups=%d%s%s%s", tname<T>(), n, hw, c,
             groups, silu ? " silu" : "", affine ? " affine" : "", accumulate ? " accumulate" : "");
    const size_t bytes = (size_t)total * sizeof(T);
    check(memcmp(ds.data(), dv.data(), bytes) == 0, "dx %s: 16-byte kernel = scalar kernel", what);
    check(memcmp(ds.data(), dr.data(), bytes) == 0, "dx %s: regs kernel = scalar kernel", what);
}

// moments: narrow and wide partials bit for bit, then the group statistics against double
template <typename T>
static void moments_case(int n, int64_t rows, int c, int groups, float shift)
{
    const int64_t chunks = norm_chunks(rows), total = n * rows * c;
    std::vector<float> xf(total);
    for (auto &v : xf)
        v = uni(-1, 1) * 2 + shift;
    std::vector<T> x = to_t<T>(xf);
    std::vector<float> pn(2 * n * chunks * c, NAN), pw(2 * n * chunks * c, NAN);
    launch(dim3((c + 31) / 32, (unsigned)chunks, n), dim3(32, 8), true, [&] {
        gn_moments_partial_kernel<T>(rows, c, chunks, x.data(), pn.data());
    });
    launch(dim3((c + 32 * GN_WIDE - 1) / (32 * GN_WIDE), (unsigned)chunks, n), dim3(32, 8), true,
           [&] { gn_moments_partial_wide_kernel<T>(rows, c, chunks, x.data(), pw.data()); });
    char what[160];
    snprintf(what, sizeof what, "%s n=%d rows=%lld c=%d (%lld chunks) shift %g", tname<T>(), n,
             (long long)rows, c, (long long)chunks, (double)shift);
    check(memcmp(pn.data(), pw.data(), pn.size() * sizeof(float)) == 0,
          "moments %s: wide partials = narrow partials, bit for bit", what);
    std::vector<float> mean(n * groups), rstd(n * groups);
    launch(dim3(n * groups), dim3(GN_STAT_THREADS), true, [&] {
        gn_moments_group_kernel(groups, c, rows, chunks, 1e-5f, pw.data(), mean.data(),
                                rstd.data());
    });
    const int cg = c / groups;
    double worst = 0;
    for (int s = 0; s < n; s++)
        for (int g = 0; g < groups; g++) {
            double sum = 0, sq = 0;
            const double cnt = (double)rows * cg;
            for (int64_t r = 0; r < rows; r++)
                for (int j = 0; j < cg; j++)
                    sum += sd_ld(x.data(), (s * rows + r) * c + g * cg + j);
            const double mu = sum / cnt;
            for (int64_t r = 0; r < rows; r++)
                for (int j = 0; j < cg; j++) {
                    const double d = sd_ld(x.data(), (s * rows + r) * c + g * cg + j) - mu;
                    sq += d * d;
                }
            const double rs = 1.0 / sqrt(sq / cnt + 1e-5);
            const double em = fabs(mean[s * groups + g] - mu) / (fabs(mu) + 1.0);
            const double er = fabs(rstd[s * groups + g] - rs) / rs;
            worst = fmax(worst, fmax(em, er));
        }
    char w2[220];
    snprintf(w2, sizeof w2, "%s: group mean / rstd within %.2e of double (<= 1e-6)", what, worst);
    check(worst <= 1e-6, "moments %s", w2);
}

template <typename T>
static void mse_case(int n, int64_t hw, int c)
{
    const int64_t per = hw * c;
    std::vector<float> pf(n * per), t(n * per), coef(n), mse(n, NAN);
    for (auto &v : pf)
        v = uni(-2, 2);
    for (auto &v : t)
        v = uni(-2, 2);
    for (auto &v : coef)
        v = uni(1e-4f, 1e-3f);
    std::vector<T> p = to_t<T>(pf), dy(n * per);
    launch(dim3(n), dim3(MSE_THREADS), true, [&] {
        mse_loss_kernel<T>(per, p.data(), t.data(), coef.data(), mse.data(), dy.data());
    });
    double worst = 0;
    bool dy_ok = true;
    for (int b = 0; b < n; b++) {
        double s = 0;
        for (int64_t i = 0; i < per; i++) {
            const float pv = sd_ld(p.data(), b * per + i);
            const double e = (double)pv - (double)t[b * per + i];
            s += e * e;
            T want[1];
            sd_st(want, 0, (2.0f * (pv - t[b * per + i])) * coef[b]);
            dy_ok = dy_ok && memcmp(want, &dy[b * per + i], sizeof(T)) == 0;
        }
        worst = fmax(worst, fabs(mse[b] - s / per) / (s / per));
    }
    char what[160];
    snprintf(what, sizeof what, "%s n=%d per=%lld: mse within %.1e of double, dy %s", tname<T>(),
             n, (long long)per, worst, dy_ok ? "bit for bit" : "DIFFERS");
    check(worst <= 1e-7 && dy_ok, "mse_loss %s", what);
    std::vector<float> mse2(n, NAN);
    launch(dim3(n), dim3(MSE_THREADS), true, [&] {
        mse_loss_kernel<T>(per, p.data(), t.data(), nullptr, mse2.data(), (T *)nullptr);
    });
    check(memcmp(mse.data(), mse2.data(), n * sizeof(float)) == 0,
          "mse_loss %s: without dy the same mse", tname<T>());
}

template <typename T>
static void cast_case(int64_t n)
{
    std::vector<float> x(n), back(n);
    for (auto &v : x)
        v = uni(-100, 100);
    std::vector<T> y(n), want = to_t<T>(x);
    launch(dim3(3), dim3(256), false, [&] { cast_f32_kernel<T>(n, x.data(), y.data()); });
    launch(dim3(5), dim3(256), false, [&] { cast_to_f32_kernel<T>(n, y.data(), back.data()); });
    bool ok = memcmp(y.data(), want.data(), n * sizeof(T)) == 0;
    for (int64_t i = 0; i < n && ok; i++)
        ok = back[i] == sd_ld(want.data(), i);
    check(ok, "cast_f32 / cast_to_f32 %s: round to nearest even and back exactly", tname<T>());
}

template <typename T>
static void all_cases()
{
    apply_case<T>(3, 200, 24, 4, 1, 1);
    apply_case<T>(2, 300, 40, 8, 1, 0);
    apply_case<T>(2, 333, 40, 8, 0, 1);
    apply_case<T>(2, 1100, 128, 32, 1, 1);
    apply_case<T>(2, 180, 320, 32, 1, 1);
    apply_case<T>(1, 64, 1280, 32, 1, 1);
    dx_case<T>(2, 1100, 128, 32, 1, 1, 0);
    dx_case<T>(2, 180, 320, 32, 1, 1, 1);
    dx_case<T>(3, 200, 24, 4, 0, 1, 0);
    dx_case<T>(2, 333, 40, 8, 1, 0, 1);
    moments_case<T>(2, 600, 40, 8, 0.5f);
    moments_case<T>(2, 300, 128, 32, 40.0f);
    moments_case<T>(1, 257, 136, 8, 0.0f);
    mse_case<T>(3, 64, 4);
    mse_case<T>(2, 77, 3);
    cast_case<T>(10007);
}

int main()
{
    all_cases<float>();
    all_cases<__nv_bfloat16>();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
