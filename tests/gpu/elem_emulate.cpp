// Host emulation of the row-wise CUDA kernels (tests/gpu/elem_emulate.sh extracts their
// definitions from the sources into kernels.inc). A block's threads run one after another (the
// kernels never synchronize). Every kernel is launched the way the backend launches it
// (sd_cuda_row_threads / sd_cuda_row_grid, sd_cuda_chunk_bytes for the pure copies), once with
// the real grid-y limit and once with a limit of 3 rows so that the row loops wrap, in fp32 and
// bf16, and compared bit for bit with a plain loop over the flat index computing the same
// expression in the same order.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "emulate_cuda.h"

#include "kernels.inc"

static void launch(dim3 g, dim3 b, const std::function<void()> &f)
{
    gridDim = g;
    blockDim = b;
    for (unsigned bz = 0; bz < g.z; bz++)
        for (unsigned by = 0; by < g.y; by++)
            for (unsigned bx = 0; bx < g.x; bx++)
                for (unsigned t = 0; t < b.x * b.y * b.z; t++) {
                    blockIdx = dim3(bx, by, bz);
                    threadIdx = dim3(t % b.x, t / b.x % b.y, t / (b.x * b.y));
                    f();
                }
}

// ---- checks ----------------------------------------------------------------------------------
static int failures = 0, checks = 0;
static void check(bool ok, const char *what)
{
    checks++;
    if (!ok) {
        failures++;
        printf("FAIL: %s\n", what);
    }
}

static std::mt19937 rng(7);
template <typename T> static std::vector<T> random_vec(size_t n)
{
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<T> v(n);
    for (auto &x : v)
        sd_st(&x, 0, u(rng));
    return v;
}
template <typename T> static bool same(const std::vector<T> &a, const std::vector<T> &b)
{
    return a.size() == b.size() && !memcmp(a.data(), b.data(), a.size() * sizeof(T));
}
template <typename T> static const char *tname() { return sizeof(T) == 4 ? "f32" : "bf16"; }

static const int64_t ycaps[2] = {SD_GRID_Y_MAX, 3};

template <typename T>
static void test_pad(int n, int h, int w, int c, int pt, int pb, int pl, int pr, int64_t ycap,
                     int x_offset)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    std::vector<T> xs = random_vec<T>((size_t)n * h * w * c + x_offset);
    const T *x = xs.data() + x_offset;
    std::vector<T> got((size_t)n * hp * wp * c), ref(got.size());
    for (auto &v : got)
        sd_st(&v, 0, 99.0f); // every element must be written
    for (int b = 0; b < n; b++)
        for (int py = 0; py < hp; py++)
            for (int px = 0; px < wp; px++)
                for (int ch = 0; ch < c; ch++) {
                    const int sy = py - pt, sx = px - pl;
                    float v = 0;
                    if (sy >= 0 && sy < h && sx >= 0 && sx < w)
                        v = sd_ld(x, (((int64_t)b * h + sy) * w + sx) * c + ch);
                    sd_st(ref.data(), (((int64_t)b * hp + py) * wp + px) * c + ch, v);
                }
    const size_t pixel = (size_t)c * sizeof(T);
    const int u = sd_cuda_chunk_bytes(pixel, x, got.data()), cu = (int)(pixel / u);
    const int threads = sd_cuda_row_threads((int64_t)wp * cu);
    const dim3 grid = sd_cuda_row_grid(hp, (int64_t)wp * cu, threads, n, ycap);
    SD_CUDA_CHUNK_DISPATCH(u, U, {
        launch(grid, dim3(threads), [&] {
            conv_pad_kernel<U>(h, w, hp, wp, cu, pt, pl, (const U *)x, (U *)got.data());
        });
    });
    char what[160];
    snprintf(what, sizeof what, "conv pad %s n%d %dx%dx%d pads %d%d%d%d, %d-byte chunks, y cap %lld",
             tname<T>(), n, h, w, c, pt, pb, pl, pr, u, (long long)ycap);
    check(same(got, ref), what);
}

template <typename T>
static void test_crop(int n, int h, int w, int c, int pt, int pb, int pl, int pr, int acc,
                      int64_t ycap)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    std::vector<T> dxp = random_vec<T>((size_t)n * hp * wp * c);
    std::vector<T> got = random_vec<T>((size_t)n * h * w * c), ref = got;
    for (int b = 0; b < n; b++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < c; ch++) {
                    const int64_t o = (((int64_t)b * h + y) * w + x) * c + ch;
                    float v = sd_ld(dxp.data(), (((int64_t)b * hp + y + pt) * wp + x + pl) * c + ch);
                    if (acc)
                        v += sd_ld(ref.data(), o);
                    sd_st(ref.data(), o, v);
                }
    const int64_t cols = (int64_t)w * c;
    const int threads = sd_cuda_row_threads(cols);
    const dim3 grid = sd_cuda_row_grid(h, cols, threads, n, ycap);
    launch(grid, dim3(threads), [&] {
        conv_crop_kernel<T>(h, w, c, hp, wp, pt, pl, dxp.data(), got.data(), acc);
    });
    char what[160];
    snprintf(what, sizeof what, "conv crop %s n%d %dx%dx%d acc %d, y cap %lld", tname<T>(), n, h,
             w, c, acc, (long long)ycap);
    check(same(got, ref), what);
}

template <typename T> static void test_bias(int64_t rows, int c, int64_t ycap)
{
    std::vector<T> bias = random_vec<T>(c), got = random_vec<T>((size_t)rows * c), ref = got;
    for (int64_t i = 0; i < rows * c; i++)
        sd_st(ref.data(), i, sd_ld(ref.data(), i) + sd_ld(bias.data(), i % c));
    const int threads = sd_cuda_row_threads(c);
    launch(sd_cuda_row_grid(rows, c, threads, 1, ycap), dim3(threads),
           [&] { sd_bias_rows_kernel<T>(rows, c, bias.data(), got.data()); });
    char what[120];
    snprintf(what, sizeof what, "bias rows %s %lldx%d, y cap %lld", tname<T>(), (long long)rows, c,
             (long long)ycap);
    check(same(got, ref), what);
}

template <typename T>
static void test_upsample(int n, int h, int w, int c, int h_out, int w_out, int64_t ycap)
{
    std::vector<T> x = random_vec<T>((size_t)n * h * w * c);
    std::vector<T> y((size_t)n * h_out * w_out * c), yref(y.size());
    const int64_t total = (int64_t)n * h_out * w_out * c;
    for (int64_t i = 0; i < total; i++) { // the former flat-index form
        int64_t ch = i % c, cell = i / c;
        int ox = (int)(cell % w_out);
        int64_t row = cell / w_out;
        int oy = (int)(row % h_out);
        int64_t b = row / h_out;
        int iy = nearest_src(oy, h, h_out), ix = nearest_src(ox, w, w_out);
        yref[i] = x[((b * h + iy) * w + ix) * c + ch];
    }
    const size_t pixel = (size_t)c * sizeof(T);
    const int u = sd_cuda_chunk_bytes(pixel, x.data(), y.data()), cu = (int)(pixel / u);
    const int threads = sd_cuda_row_threads((int64_t)w_out * cu);
    const dim3 grid = sd_cuda_row_grid(h_out, (int64_t)w_out * cu, threads, n, ycap);
    SD_CUDA_CHUNK_DISPATCH(u, U, {
        launch(grid, dim3(threads), [&] {
            upsample_fwd_kernel<U>(h, w, h_out, w_out, cu, (const U *)x.data(), (U *)y.data());
        });
    });
    char what[160];
    snprintf(what, sizeof what, "upsample forward %s n%d %dx%d -> %dx%d c%d, %d-byte chunks, y cap %lld",
             tname<T>(), n, h, w, h_out, w_out, c, u, (long long)ycap);
    check(same(y, yref), what);

    // backward
    std::vector<T> dy = random_vec<T>(y.size());
    for (int acc = 0; acc < 2; acc++) {
        std::vector<T> dx = random_vec<T>(x.size()), dref = dx;
        for (int b = 0; b < n; b++)
            for (int iy = 0; iy < h; iy++)
                for (int ix = 0; ix < w; ix++)
                    for (int ch = 0; ch < c; ch++) {
                        const int64_t i = (((int64_t)b * h + iy) * w + ix) * c + ch;
                        float s = acc ? sd_ld(dref.data(), i) : 0.0f;
                        for (int oy = 0; oy < h_out; oy++)
                            for (int ox = 0; ox < w_out; ox++)
                                if (nearest_src(oy, h, h_out) == iy && nearest_src(ox, w, w_out) == ix)
                                    s += sd_ld(dy.data(), (((int64_t)b * h_out + oy) * w_out + ox) * c + ch);
                        sd_st(dref.data(), i, s);
                    }
        const int bt = sd_cuda_row_threads((int64_t)w * c);
        launch(sd_cuda_row_grid(h, (int64_t)w * c, bt, n, ycap), dim3(bt), [&] {
            upsample_bwd_kernel<T>(h, w, c, h_out, w_out, dy.data(), dx.data(), acc);
        });
        snprintf(what, sizeof what, "upsample backward %s n%d %dx%d -> %dx%d c%d acc %d, y cap %lld",
                 tname<T>(), n, h, w, h_out, w_out, c, acc, (long long)ycap);
        check(same(dx, dref), what);
    }
}

template <typename T> static void test_geglu(int64_t rows, int inner, int64_t ycap)
{
    std::vector<T> x = random_vec<T>((size_t)rows * 2 * inner), y((size_t)rows * inner), yref(y.size());
    for (int64_t i = 0; i < rows * inner; i++) {
        int64_t r = i / inner, j = i % inner, base = r * 2 * inner + j;
        sd_st(yref.data(), i, sd_ld(x.data(), base) * gelu_f(sd_ld(x.data(), base + inner)));
    }
    const int threads = sd_cuda_row_threads(inner);
    const dim3 grid = sd_cuda_row_grid(rows, inner, threads, 1, ycap);
    launch(grid, dim3(threads), [&] { geglu_fwd_kernel<T>(rows, inner, x.data(), y.data()); });
    char what[120];
    snprintf(what, sizeof what, "geglu forward %s %lldx%d, y cap %lld", tname<T>(), (long long)rows,
             inner, (long long)ycap);
    check(same(y, yref), what);
    std::vector<T> dy = random_vec<T>(y.size());
    for (int acc = 0; acc < 2; acc++) {
        std::vector<T> dx = random_vec<T>(x.size()), dref = dx;
        for (int64_t i = 0; i < rows * inner; i++) {
            int64_t r = i / inner, j = i % inner, vi = r * 2 * inner + j, gi = vi + inner;
            float d = sd_ld(dy.data(), i), gate = sd_ld(x.data(), gi);
            float a = d * gelu_f(gate), g = d * sd_ld(x.data(), vi) * gelu_grad_f(gate);
            sd_st(dref.data(), vi, acc ? sd_ld(dref.data(), vi) + a : a);
            sd_st(dref.data(), gi, acc ? sd_ld(dref.data(), gi) + g : g);
        }
        launch(grid, dim3(threads), [&] {
            geglu_bwd_kernel<T>(rows, inner, x.data(), dy.data(), dx.data(), acc);
        });
        snprintf(what, sizeof what, "geglu backward %s %lldx%d acc %d, y cap %lld", tname<T>(),
                 (long long)rows, inner, acc, (long long)ycap);
        check(same(dx, dref), what);
    }
}

template <typename T> static void test_bcast(int n, int64_t rows, int c, int64_t ycap)
{
    std::vector<T> x = random_vec<T>((size_t)n * rows * c), v = random_vec<T>((size_t)n * c);
    std::vector<T> y(x.size()), yref(x.size());
    const int64_t per = rows * c;
    for (int64_t i = 0; i < n * per; i++)
        sd_st(yref.data(), i, sd_ld(x.data(), i) + sd_ld(v.data(), i / per * c + i % c));
    const int threads = sd_cuda_row_threads(c);
    launch(sd_cuda_row_grid(rows, c, threads, n, ycap), dim3(threads),
           [&] { add_bcast_kernel<T>(rows, c, x.data(), v.data(), y.data()); });
    char what[120];
    snprintf(what, sizeof what, "add_bcast %s n%d %lldx%d, y cap %lld", tname<T>(), n,
             (long long)rows, c, (long long)ycap);
    check(same(y, yref), what);
    // in place, as the U-Net calls it
    launch(sd_cuda_row_grid(rows, c, threads, n, ycap), dim3(threads),
           [&] { add_bcast_kernel<T>(rows, c, x.data(), v.data(), x.data()); });
    snprintf(what, sizeof what, "add_bcast in place %s n%d %lldx%d, y cap %lld", tname<T>(), n,
             (long long)rows, c, (long long)ycap);
    check(same(x, yref), what);
}

template <typename T> static void test_concat(int64_t rows, int c1, int c2, int64_t ycap)
{
    const int cw = c1 + c2;
    std::vector<T> a = random_vec<T>((size_t)rows * c1), b = random_vec<T>((size_t)rows * c2);
    std::vector<T> y((size_t)rows * cw), yref(y.size());
    for (int64_t i = 0; i < rows * cw; i++) {
        int64_t r = i / cw;
        int j = (int)(i % cw);
        sd_st(yref.data(), i, j < c1 ? sd_ld(a.data(), r * c1 + j) : sd_ld(b.data(), r * c2 + (j - c1)));
    }
    int threads = sd_cuda_row_threads(cw);
    launch(sd_cuda_row_grid(rows, cw, threads, 1, ycap), dim3(threads),
           [&] { concat_kernel<T>(rows, c1, c2, a.data(), b.data(), y.data()); });
    char what[120];
    snprintf(what, sizeof what, "concat %s %lldx(%d+%d), y cap %lld", tname<T>(), (long long)rows,
             c1, c2, (long long)ycap);
    check(same(y, yref), what);
    for (int acc = 0; acc < 2; acc++)
        for (int part = 0; part < 2; part++) {
            const int offset = part ? c1 : 0, width = part ? c2 : c1;
            std::vector<T> out = random_vec<T>((size_t)rows * width), oref = out;
            for (int64_t i = 0; i < rows * width; i++) {
                int64_t r = i / width, j = i % width;
                float v = sd_ld(y.data(), r * cw + offset + j);
                sd_st(oref.data(), i, acc ? sd_ld(oref.data(), i) + v : v);
            }
            threads = sd_cuda_row_threads(width);
            launch(sd_cuda_row_grid(rows, width, threads, 1, ycap), dim3(threads), [&] {
                split_kernel<T>(rows, cw, offset, width, y.data(), out.data(), acc);
            });
            snprintf(what, sizeof what, "split %s part %d acc %d, y cap %lld", tname<T>(), part,
                     acc, (long long)ycap);
            check(same(out, oref), what);
        }
}

template <typename T> static void run_all()
{
    for (int64_t ycap : ycaps) {
        // the VAE downsampler's (0, 1, 0, 1), symmetric, and odd ones; channel counts that give
        // 16-, 8-, 4- and 2-byte chunks; a misaligned source
        test_pad<T>(2, 6, 6, 16, 0, 1, 0, 1, ycap, 0);
        test_pad<T>(3, 5, 7, 3, 1, 1, 1, 1, ycap, 0);
        test_pad<T>(1, 4, 9, 8, 2, 0, 1, 3, ycap, 0);
        test_pad<T>(2, 3, 5, 12, 0, 2, 2, 0, ycap, 1);
        test_pad<T>(1, 7, 3, 4, 1, 0, 0, 1, ycap, 0);
        for (int acc = 0; acc < 2; acc++) {
            test_crop<T>(2, 6, 6, 16, 0, 1, 0, 1, acc, ycap);
            test_crop<T>(3, 5, 7, 3, 2, 1, 1, 2, acc, ycap);
        }
        test_bias<T>(37, 5, ycap);
        test_bias<T>(9, 300, ycap);
        test_upsample<T>(2, 4, 5, 16, 8, 10, ycap);
        test_upsample<T>(1, 3, 7, 3, 7, 9, ycap);
        test_upsample<T>(2, 5, 4, 6, 5, 4, ycap);
        test_geglu<T>(11, 40, ycap);
        test_geglu<T>(5, 300, ycap);
        test_bcast<T>(3, 10, 24, ycap);
        test_bcast<T>(2, 7, 260, ycap);
        test_concat<T>(13, 16, 24, ycap);
        test_concat<T>(6, 3, 290, ycap);
    }
}

int main()
{
    run_all<float>();
    run_all<__nv_bfloat16>();
    printf("%d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
