/* TAP tests of the CPU op backend against naive double-precision references, and thread-count independence. */
#include "sdtrain/ops.h"

#include <cblas.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/check.h"
#include "sdtrain/rng.h"
#include "tap.h"

/*
 * Error measure (the spec's, §8): max over elements of |y - ref| / max(1, |ref|), with the
 * reference computed in double from the same fp32 inputs. Inputs are scaled like real
 * activations and initialised weights so outputs are O(1). TOL = 1e-5 unless a case says why
 * it needs another bound.
 */
#define TOL 1e-5

static const sd_backend *be;
static uint64_t fill_stream;
static int default_threads = 1;

/* ---- helpers ------------------------------------------------------------------------------ */

static float *rnd(int64_t n, float lo, float hi)
{
    float *x = sd_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    SD_CHECK(sd_rng_fill_uniform(20261122, SD_RNG_PURPOSE(SD_RNG_USER, 7), 0, fill_stream++, x,
                                 (size_t)n) == 0,
             "rng fill");
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * x[i];
    return x;
}

static float *fbuf(int64_t n)
{
    return sd_xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static double *dbuf(int64_t n)
{
    return sd_xcalloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

static double max_err(const float *y, const double *ref, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)y[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
        if (!(d <= e)) /* NaN counts as an infinite error */
            e = isnan(d) ? INFINITY : d;
    }
    return e;
}

static sd_scratch scratch(size_t bytes)
{
    sd_scratch s = {bytes ? sd_xmalloc(bytes) : NULL, bytes};
    return s;
}

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
#ifdef OPENBLAS_VERSION
    openblas_set_num_threads(n);
#endif
}

/* Checks the thread-count independence of `run`, which writes `n` floats to `out`: 1 thread
 * and 3 threads (more than this machine may have, so the split differs from the default) must
 * give the bits `expected` got with the default count. OpenBLAS is asked for the same counts:
 * the backend must keep it single-threaded, since its own threading changes the rounding. */
typedef void (*run_fn)(const void *ctx, float *out);

static void check_threads(const char *name, run_fn run, const void *ctx, const float *expected,
                          int64_t n)
{
    float *a = fbuf(n), *b = fbuf(n);
    set_threads(1);
    run(ctx, a);
    set_threads(3);
    run(ctx, b);
    set_threads(default_threads);
    tap_ok(memcmp(a, b, (size_t)n * sizeof(float)) == 0 &&
               memcmp(a, expected, (size_t)n * sizeof(float)) == 0,
           "%s: bit-identical with 1, 3 and %d threads", name, default_threads);
    free(a);
    free(b);
}

/* A fatal check ends the job through the abort handler; here it jumps back to the test. */
static jmp_buf fatal_jump;
static void catch_fatal(int code)
{
    longjmp(fatal_jump, code ? code : 1);
}

/* ---- weight layouts ----------------------------------------------------------------------- */

static void test_layouts(void)
{
    int64_t ts[4] = {2, 3, 2, 2}; /* O, I, kh, kw */
    float t[24], ours[24], back[24];
    int64_t os[4] = {0, 0, 0, 0};
    for (int i = 0; i < 24; i++)
        t[i] = (float)i;
    sd_weight_from_torch(4, ts, sizeof(float), t, ours, os);
    tap_ok(os[0] == 2 && os[1] == 2 && os[2] == 2 && os[3] == 3,
           "conv weight OIHW [2,3,2,2] becomes OHWI [2,2,2,3]");
    int ok = 1;
    for (int o = 0; o < 2; o++)
        for (int i = 0; i < 3; i++)
            for (int u = 0; u < 2; u++)
                for (int v = 0; v < 2; v++)
                    ok &= ours[((o * 2 + u) * 2 + v) * 3 + i] == t[((o * 3 + i) * 2 + u) * 2 + v];
    tap_ok(ok, "ours[o][u][v][i] == torch[o][i][u][v] for every element");
    sd_weight_to_torch(4, ts, sizeof(float), ours, back);
    tap_ok(memcmp(back, t, sizeof t) == 0, "sd_weight_to_torch inverts sd_weight_from_torch");

    /* Element size is a parameter: the same permutation on 2-byte (bf16/fp16) patterns. */
    uint16_t h[24], hours[24];
    for (int i = 0; i < 24; i++)
        h[i] = (uint16_t)(0x3f00 + i);
    sd_weight_from_torch(4, ts, sizeof(uint16_t), h, hours, NULL);
    ok = 1;
    for (int i = 0; i < 24; i++)
        ok &= hours[i] == (uint16_t)(0x3f00 + (int)ours[i]);
    tap_ok(ok, "2-byte elements are permuted the same way");

    int64_t ls[2] = {4, 6}; /* linear [out, in]: our layout too */
    float lw[24], lo[24];
    int64_t los[2];
    for (int i = 0; i < 24; i++)
        lw[i] = (float)(i * 3 + 1);
    sd_weight_from_torch(2, ls, sizeof(float), lw, lo, los);
    tap_ok(memcmp(lw, lo, sizeof lw) == 0 && los[0] == 4 && los[1] == 6,
           "linear weight [out, in] is copied unchanged");
}

/* ---- conv2d ------------------------------------------------------------------------------- */

typedef struct conv_ctx {
    sd_conv2d_desc d;
    const float *x, *w, *b;
    sd_scratch ws;
} conv_ctx;

static void run_conv(const void *ctx, float *out)
{
    const conv_ctx *c = ctx;
    sd_conv2d_forward(be, &c->d, c->x, c->w, c->b, out, c->ws);
}

/* x NHWC, w_torch OIHW: the reference reads PyTorch's layout directly, so this also checks
 * that sd_weight_from_torch produces what the kernel expects. */
static void conv_reference(const sd_conv2d_desc *d, const float *x, const float *wt,
                           const float *b, double *ref)
{
    for (int n = 0; n < d->n; n++)
        for (int oy = 0; oy < d->h_out; oy++)
            for (int ox = 0; ox < d->w_out; ox++)
                for (int o = 0; o < d->c_out; o++) {
                    double s = b ? b[o] : 0.0;
                    for (int i = 0; i < d->c_in; i++)
                        for (int u = 0; u < d->kh; u++)
                            for (int v = 0; v < d->kw; v++) {
                                int iy = oy * d->stride - d->pad_top + u;
                                int ix = ox * d->stride - d->pad_left + v;
                                if (iy < 0 || iy >= d->h || ix < 0 || ix >= d->w)
                                    continue;
                                s += (double)wt[((o * d->c_in + i) * d->kh + u) * d->kw + v] *
                                     x[(((int64_t)n * d->h + iy) * d->w + ix) * d->c_in + i];
                            }
                    ref[(((int64_t)n * d->h_out + oy) * d->w_out + ox) * d->c_out + o] = s;
                }
}

static void conv_case(const char *name, sd_conv2d_desc d, int bias, int threads)
{
    int64_t nx = (int64_t)d.n * d.h * d.w * d.c_in;
    int64_t nw = (int64_t)d.c_out * d.c_in * d.kh * d.kw;
    int64_t ny = (int64_t)d.n * d.h_out * d.w_out * d.c_out;
    float bound = 1.0f / sqrtf((float)(d.c_in * d.kh * d.kw));
    float *x = rnd(nx, -1.0f, 1.0f), *wt = rnd(nw, -bound, bound), *b = rnd(d.c_out, -0.5f, 0.5f);
    float *w = fbuf(nw), *y = fbuf(ny);
    double *ref = dbuf(ny);
    int64_t ts[4] = {d.c_out, d.c_in, d.kh, d.kw};
    sd_weight_from_torch(4, ts, sizeof(float), wt, w, NULL);
    conv_ctx c = {d, x, w, bias ? b : NULL,
                  scratch(sd_conv2d_forward_scratch_bytes(be, &d))};
    run_conv(&c, y);
    conv_reference(&d, x, wt, c.b, ref);
    double e = max_err(y, ref, ny);
    tap_ok(e <= TOL, "conv2d %s: [%d,%d,%d,%d] -> [%d,%d,%d,%d], max rel err %.2e <= %.0e", name,
           d.n, d.h, d.w, d.c_in, d.n, d.h_out, d.w_out, d.c_out, e, TOL);
    if (threads)
        check_threads(name, run_conv, &c, y, ny);
    /* with a residual: exactly the conv, then sd_add */
    float *z = rnd(ny, -1.0f, 1.0f), *yz = fbuf(ny), *want = fbuf(ny);
    sd_conv2d_forward_add(be, &d, x, w, c.b, z, yz, c.ws);
    sd_add(be, ny, y, z, want);
    tap_ok(memcmp(yz, want, (size_t)ny * sizeof(float)) == 0,
           "conv2d %s + residual: the bits of conv then add", name);
    free(z), free(yz), free(want);
    free(x), free(wt), free(b), free(w), free(y), free(ref), free(c.ws.ptr);
}

static void test_conv2d(void)
{
    sd_conv2d_desc u = sd_conv2d_make(1, 9, 6, 13, 7, 3, 2, 1);
    tap_ok(u.h_out == 5 && u.w_out == 3, "stride-2 pad-1 conv of 9x6 gives ceil: 5x3");
    sd_conv2d_desc v = sd_conv2d_make_padded(2, 7, 10, 6, 6, 3, 3, 2, 0, 1, 0, 1);
    tap_ok(v.h_out == 3 && v.w_out == 5, "VAE downsample (pad right/bottom 1) of 7x10 gives 3x5");

    conv_case("3x3 s1 p1, odd non-square, batch 2", sd_conv2d_make(2, 7, 5, 3, 5, 3, 1, 1), 1, 0);
    conv_case("3x3 s2 p1 (U-Net Downsample2D), odd H", u, 1, 1);
    conv_case("3x3 s2 pad (0,1,0,1) (VAE Downsample2D)",
              sd_conv2d_make_padded(2, 8, 10, 6, 6, 3, 3, 2, 0, 1, 0, 1), 1, 0);
    conv_case("3x3 s2 pad (0,1,0,1), odd H and W", v, 1, 1);
    conv_case("1x1 (ResNet shortcut), no bias", sd_conv2d_make(2, 5, 3, 11, 9, 1, 1, 0), 0, 1);
    conv_case("3x3 s1 p1, K = 630 (several BLAS K blocks)", sd_conv2d_make(1, 6, 5, 70, 33, 3, 1, 1),
              1, 1);
    conv_case("3x3 s1 p1, 4270 pixels (two im2col tiles)", sd_conv2d_make(1, 70, 61, 3, 4, 3, 1, 1),
              1, 1);
    conv_case("3x3 s1 p1, 1x1 image", sd_conv2d_make(1, 1, 1, 5, 3, 3, 1, 1), 1, 0);
    /* enough output pixels (>= 16 blocks) for the per-thread im2col block path of big convs */
    conv_case("3x3 s1 p1, 120x120 x 64 ch (per-thread im2col blocks)",
              sd_conv2d_make(1, 120, 120, 64, 8, 3, 1, 1), 1, 1);
}

/* ---- linear ------------------------------------------------------------------------------- */

typedef struct linear_ctx {
    int64_t rows;
    int in, out;
    const float *x, *w, *b;
} linear_ctx;

static void run_linear(const void *ctx, float *out)
{
    const linear_ctx *c = ctx;
    sd_linear_forward(be, c->rows, c->in, c->out, c->x, c->w, c->b, out);
}

static void linear_case(int64_t rows, int in, int out, int bias, int threads)
{
    float bound = 1.0f / sqrtf((float)in);
    float *x = rnd(rows * in, -1, 1), *w = rnd((int64_t)out * in, -bound, bound);
    float *b = rnd(out, -0.5f, 0.5f), *y = fbuf(rows * out);
    double *ref = dbuf(rows * out);
    linear_ctx c = {rows, in, out, x, w, bias ? b : NULL};
    run_linear(&c, y);
    for (int64_t r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            double s = bias ? b[o] : 0.0;
            for (int i = 0; i < in; i++)
                s += (double)x[r * in + i] * w[(int64_t)o * in + i];
            ref[r * out + o] = s;
        }
    double e = max_err(y, ref, rows * out);
    tap_ok(e <= TOL, "linear rows=%lld %d->%d%s: max rel err %.2e", (long long)rows, in, out,
           bias ? " +bias" : "", e);
    {
        /* with a residual: exactly the linear, then sd_add */
        float *z = rnd(rows * out, -1, 1), *yz = fbuf(rows * out), *want = fbuf(rows * out);
        sd_linear_forward_add(be, rows, in, out, x, w, c.b, z, yz);
        sd_add(be, rows * out, y, z, want);
        tap_ok(memcmp(yz, want, (size_t)(rows * out) * sizeof(float)) == 0,
               "linear rows=%lld %d->%d%s + residual: the bits of linear then add",
               (long long)rows, in, out, bias ? " +bias" : "");
        free(z), free(yz), free(want);
    }
    if (threads)
        check_threads("linear", run_linear, &c, y, rows * out);
    free(x), free(w), free(b), free(y), free(ref);
}

static void test_linear(void)
{
    linear_case(7, 13, 5, 1, 0);
    linear_case(1, 9, 3, 0, 0);
    linear_case(154, 64, 96, 1, 1);
    linear_case(600, 70, 300, 1, 1); /* 3 x 2 GEMM tiles of uneven edges, spread over threads */
}

/* ---- normalization ------------------------------------------------------------------------ */

typedef struct gn_ctx {
    sd_group_norm_desc d;
    const float *x, *g, *b;
    sd_scratch ws;
} gn_ctx;

static void run_gn(const void *ctx, float *out)
{
    const gn_ctx *c = ctx;
    sd_group_norm_forward(be, &c->d, c->x, c->g, c->b, out, NULL, NULL, c->ws);
}

static void group_norm_case(int n, int hw, int c, int groups, float eps, int silu, int affine,
                            int threads)
{
    sd_group_norm_desc d = {n, hw, c, groups, eps, silu};
    int64_t nx = (int64_t)n * hw * c;
    /* An offset of 3 makes a one-pass (sum of squares) variance visibly wrong. */
    float *x = rnd(nx, 2.0f, 4.0f), *g = rnd(c, 0.5f, 1.5f), *b = rnd(c, -0.5f, 0.5f);
    float *y = fbuf(nx), *mean = fbuf(n * groups), *rstd = fbuf(n * groups);
    double *ref = dbuf(nx), *rmean = dbuf(n * groups), *rrstd = dbuf(n * groups);
    gn_ctx ctx = {d, x, affine ? g : NULL, affine ? b : NULL,
                  scratch(sd_group_norm_forward_scratch_bytes(be, &d))};
    sd_group_norm_forward(be, &d, x, ctx.g, ctx.b, y, mean, rstd, ctx.ws);
    int cpg = c / groups;
    for (int s = 0; s < n; s++)
        for (int gi = 0; gi < groups; gi++) {
            double sum = 0, sq = 0, cnt = (double)hw * cpg;
            for (int p = 0; p < hw; p++)
                for (int j = gi * cpg; j < (gi + 1) * cpg; j++)
                    sum += x[((int64_t)s * hw + p) * c + j];
            double m = sum / cnt;
            for (int p = 0; p < hw; p++)
                for (int j = gi * cpg; j < (gi + 1) * cpg; j++) {
                    double e = x[((int64_t)s * hw + p) * c + j] - m;
                    sq += e * e;
                }
            double r = 1.0 / sqrt(sq / cnt + eps);
            rmean[s * groups + gi] = m;
            rrstd[s * groups + gi] = r;
            for (int p = 0; p < hw; p++)
                for (int j = gi * cpg; j < (gi + 1) * cpg; j++) {
                    int64_t k = ((int64_t)s * hw + p) * c + j;
                    double v = (x[k] - m) * r;
                    if (affine)
                        v = v * g[j] + b[j];
                    ref[k] = silu ? v / (1.0 + exp(-v)) : v;
                }
        }
    double e = max_err(y, ref, nx);
    double es = fmax(max_err(mean, rmean, n * groups), max_err(rstd, rrstd, n * groups));
    tap_ok(e <= TOL && es <= TOL,
           "group norm n=%d hw=%d c=%d groups=%d%s%s: max rel err %.2e, statistics %.2e", n, hw, c,
           groups, silu ? " +SiLU" : "", affine ? "" : " (no affine)", e, es);
    if (threads)
        check_threads("group norm", run_gn, &ctx, y, nx);
    free(x), free(g), free(b), free(y), free(mean), free(rstd), free(ref), free(rmean),
        free(rrstd), free(ctx.ws.ptr);
}

typedef struct ln_ctx {
    int64_t rows;
    int c;
    const float *x, *g, *b;
} ln_ctx;

static void run_ln(const void *ctx, float *out)
{
    const ln_ctx *c = ctx;
    sd_layer_norm_forward(be, c->rows, c->c, 1e-5f, c->x, c->g, c->b, out, NULL, NULL);
}

static void layer_norm_case(int64_t rows, int c, int threads)
{
    float *x = rnd(rows * c, -3.0f, 5.0f), *g = rnd(c, 0.5f, 1.5f), *b = rnd(c, -0.5f, 0.5f);
    float *y = fbuf(rows * c), *mean = fbuf(rows), *rstd = fbuf(rows);
    double *ref = dbuf(rows * c), *rmean = dbuf(rows), *rrstd = dbuf(rows);
    sd_layer_norm_forward(be, rows, c, 1e-5f, x, g, b, y, mean, rstd);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0, q = 0;
        for (int j = 0; j < c; j++)
            s += x[r * c + j];
        double m = s / c;
        for (int j = 0; j < c; j++)
            q += (x[r * c + j] - m) * (x[r * c + j] - m);
        double rs = 1.0 / sqrt(q / c + (double)1e-5f);
        rmean[r] = m;
        rrstd[r] = rs;
        for (int j = 0; j < c; j++)
            ref[r * c + j] = (x[r * c + j] - m) * rs * g[j] + b[j];
    }
    double e = max_err(y, ref, rows * c);
    double es = fmax(max_err(mean, rmean, rows), max_err(rstd, rrstd, rows));
    tap_ok(e <= TOL && es <= TOL, "layer norm rows=%lld c=%d: max rel err %.2e, statistics %.2e",
           (long long)rows, c, e, es);
    if (threads) {
        ln_ctx ctx = {rows, c, x, g, b};
        check_threads("layer norm", run_ln, &ctx, y, rows * c);
    }
    free(x), free(g), free(b), free(y), free(mean), free(rstd), free(ref), free(rmean),
        free(rrstd);
}

static void test_norms(void)
{
    group_norm_case(2, 15, 12, 4, 1e-5f, 0, 1, 1);
    group_norm_case(1, 7, 30, 3, 1e-6f, 1, 1, 0);
    group_norm_case(3, 4, 64, 32, 1e-6f, 0, 0, 1);
    group_norm_case(1, 1, 32, 32, 1e-5f, 1, 1, 0); /* one element per group: x - mean = 0 */
    /* several pixel chunks summed in order, channels not a multiple of the vector width */
    group_norm_case(2, 1100, 42, 6, 1e-6f, 1, 1, 1);
    layer_norm_case(5, 37, 1);
    layer_norm_case(1, 1024, 0);
    layer_norm_case(3, 1, 0); /* variance 0: y = beta */
}

/* ---- activations -------------------------------------------------------------------------- */

static double silu_d(double v)
{
    return v / (1.0 + exp(-v));
}

static double gelu_d(double v)
{
    return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
}

static void test_activations(void)
{
    const int64_t n = 1003;
    float *x = rnd(n, -8.0f, 8.0f), *y = fbuf(n);
    double *ref = dbuf(n);
    x[0] = -100.0f, x[1] = 100.0f, x[2] = 0.0f, x[3] = -0.0f, x[4] = 1e-30f;

    sd_silu_forward(be, n, x, y);
    for (int64_t i = 0; i < n; i++)
        ref[i] = silu_d(x[i]);
    double e = max_err(y, ref, n);
    tap_ok(e <= TOL, "SiLU on [-8, 8] and +-100: max rel err %.2e", e);

    /* the vectorised exp over its whole range, vector lanes and scalar tail alike */
    {
        const int64_t nw = 20003;
        float *xw = fbuf(nw), *yw = fbuf(nw);
        double *rw = dbuf(nw), ew = 0.0;
        for (int64_t i = 0; i < nw; i++)
            xw[i] = -100.0f + 200.0f * (float)i / (float)(nw - 1);
        sd_silu_forward(be, nw, xw, yw);
        for (int64_t i = 0; i < nw; i++) {
            rw[i] = silu_d(xw[i]);
            double r = fabs(yw[i] - rw[i]) / fmax(fabs(rw[i]), 1e-30);
            ew = fabs(rw[i]) > 1e-30 && r > ew ? r : ew;
        }
        tap_ok(ew <= 1e-6, "SiLU on [-100, 100] relative to |silu|: max rel err %.2e", ew);
        free(xw), free(yw), free(rw);
    }

    sd_gelu_forward(be, n, x, y);
    for (int64_t i = 0; i < n; i++)
        ref[i] = gelu_d(x[i]);
    e = max_err(y, ref, n);
    tap_ok(e <= TOL, "exact GELU on [-8, 8] and +-100: max rel err %.2e", e);
    /* erf form, not the tanh approximation: at x = 1 they differ by ~1.6e-4 */
    float one = 1.0f, g1;
    sd_gelu_forward(be, 1, &one, &g1);
    tap_ok(fabs(g1 - 0.8413447460685429) < 1e-6, "GELU(1) = Phi(1) = 0.841345 (erf form): %.7f",
           (double)g1);

    sd_quick_gelu_forward(be, n, x, y);
    for (int64_t i = 0; i < n; i++)
        ref[i] = x[i] / (1.0 + exp(-1.702 * x[i]));
    e = max_err(y, ref, n);
    tap_ok(e <= TOL, "QuickGELU x * sigmoid(1.702 x): max rel err %.2e", e);

    float *xi = fbuf(n);
    memcpy(xi, x, (size_t)n * sizeof(float));
    sd_silu_forward(be, n, xi, xi);
    sd_silu_forward(be, n, x, y);
    tap_ok(memcmp(xi, y, (size_t)n * sizeof(float)) == 0, "SiLU in place equals out of place");

    /* GEGLU: [value | gate], gate is the second half */
    const int rows = 3, inner = 17;
    float *gx = rnd(rows * 2 * inner, -3.0f, 3.0f), *gy = fbuf(rows * inner);
    double *gref = dbuf(rows * inner);
    sd_geglu_forward(be, rows, inner, gx, gy);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < inner; j++)
            gref[r * inner + j] = gx[r * 2 * inner + j] * gelu_d(gx[r * 2 * inner + inner + j]);
    e = max_err(gy, gref, rows * inner);
    tap_ok(e <= TOL, "GEGLU value * GELU(gate), gate = second half: max rel err %.2e", e);
    free(x), free(y), free(ref), free(xi), free(gx), free(gy), free(gref);
}

/* ---- attention ---------------------------------------------------------------------------- */

typedef struct attn_ctx {
    sd_attention_desc d;
    const float *q, *k, *v;
    sd_scratch ws;
} attn_ctx;

/* The CPU attention scratch holds one score block per OpenMP thread, so size it for the
 * largest thread count check_threads uses. */
static sd_scratch attention_scratch(const sd_attention_desc *d)
{
    set_threads(default_threads > 3 ? default_threads : 3);
    sd_scratch s = scratch(sd_attention_forward_scratch_bytes(be, d));
    set_threads(default_threads);
    return s;
}

static void run_attn(const void *ctx, float *out)
{
    const attn_ctx *c = ctx;
    sd_attention_forward(be, &c->d, c->q, c->k, c->v, out, NULL, c->ws);
}

static void attention_reference(const sd_attention_desc *d, const float *q, const float *k,
                                const float *v, double *o, double *lse)
{
    double *s = dbuf(d->t_kv);
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < d->t_q; i++) {
                const float *qi = q + ((int64_t)b * d->t_q + i) * d->ld_q + h * d->head_dim;
                int visible = d->causal ? i + 1 : d->t_kv;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < visible; j++) {
                    const float *kj = k + ((int64_t)b * d->t_kv + j) * d->ld_k + h * d->head_dim;
                    double dot = 0;
                    for (int e = 0; e < d->head_dim; e++)
                        dot += (double)qi[e] * kj[e];
                    s[j] = (double)d->scale * dot;
                    mx = fmax(mx, s[j]);
                }
                for (int j = 0; j < visible; j++)
                    sum += exp(s[j] - mx);
                if (lse)
                    lse[((int64_t)b * d->heads + h) * d->t_q + i] = mx + log(sum);
                double *oi = o + ((int64_t)b * d->t_q + i) * d->ld_o + h * d->head_dim;
                for (int e = 0; e < d->head_dim; e++) {
                    double acc = 0;
                    for (int j = 0; j < visible; j++)
                        acc += exp(s[j] - mx) / sum *
                               v[((int64_t)b * d->t_kv + j) * d->ld_v + h * d->head_dim + e];
                    oi[e] = acc;
                }
            }
    free(s);
}

/* q, k, v in [-qk_range, qk_range]: with a range of 3 and head_dim 64 the scores spread over
 * tens of units, so the max subtraction and tiny probabilities are exercised. */
static void attention_case(const char *name, sd_attention_desc d, float qk_range, int threads)
{
    int64_t nq = (int64_t)d.batch * d.t_q * d.ld_q, nk = (int64_t)d.batch * d.t_kv * d.ld_k;
    int64_t nv = (int64_t)d.batch * d.t_kv * d.ld_v, no = (int64_t)d.batch * d.t_q * d.ld_o;
    int64_t nl = (int64_t)d.batch * d.heads * d.t_q;
    float *q = rnd(nq, -qk_range, qk_range), *k = rnd(nk, -qk_range, qk_range);
    float *v = rnd(nv, -1, 1), *o = fbuf(no), *lse = fbuf(nl);
    double *ref = dbuf(no), *rlse = dbuf(nl);
    attn_ctx c = {d, q, k, v, attention_scratch(&d)};
    sd_attention_forward(be, &d, q, k, v, o, lse, c.ws);
    attention_reference(&d, q, k, v, ref, rlse);
    /* Columns of o beyond heads*head_dim (a strided output) are not written; compare only the
     * written ones by zeroing both. */
    int width = d.heads * d.head_dim;
    for (int64_t r = 0; r < (int64_t)d.batch * d.t_q; r++)
        for (int j = width; j < d.ld_o; j++)
            o[r * d.ld_o + j] = 0.0f, ref[r * d.ld_o + j] = 0.0;
    double e = max_err(o, ref, no), el = max_err(lse, rlse, nl);
    tap_ok(e <= TOL && el <= TOL,
           "attention %s: batch=%d heads=%d d=%d t_q=%d t_kv=%d%s: max rel err %.2e, lse %.2e",
           name, d.batch, d.heads, d.head_dim, d.t_q, d.t_kv, d.causal ? " causal" : "", e, el);
    if (threads) {
        float *o1 = fbuf(no);
        run_attn(&c, o1); /* the unwritten columns of a strided output must match too */
        check_threads(name, run_attn, &c, o1, no);
        free(o1);
    }
    free(q), free(k), free(v), free(o), free(lse), free(ref), free(rlse), free(c.ws.ptr);
}

static void test_attention(void)
{
    sd_attention_desc d = sd_attention_make(2, 5, 64, 10, 10, 0);
    tap_ok(d.scale == 0.125f && d.ld_q == 320, "head_dim 64: scale exactly 1/8, rows of 320");
    d = sd_attention_make(1, 1, 512, 4, 4, 0);
    tap_ok(d.scale == (float)(1.0 / sqrt(512.0)), "VAE head_dim 512: scale = (float)512^-0.5");

    attention_case("cross, t_q != t_kv, odd head_dim", sd_attention_make(2, 3, 5, 7, 11, 0), 1.0f,
                   1);
    attention_case("CLIP-like causal", sd_attention_make(1, 2, 8, 9, 9, 1), 1.0f, 1);
    attention_case("single token", sd_attention_make(2, 1, 4, 1, 1, 0), 1.0f, 0);
    attention_case("one query, many keys", sd_attention_make(1, 2, 6, 1, 13, 0), 1.0f, 0);
    attention_case("two query blocks", sd_attention_make(1, 2, 64, 300, 77, 0), 3.0f, 1);
    attention_case("two query blocks, causal", sd_attention_make(1, 2, 16, 300, 300, 1), 2.0f,
                   1);
    attention_case("VAE-like single head d=40", sd_attention_make(1, 1, 40, 12, 12, 0), 2.0f, 0);

    /* Fused QKV [t, 3C] read in place through the row strides, output into a wider buffer. */
    const int b = 2, t = 6, heads = 2, dh = 3, width = heads * dh;
    float *qkv = rnd((int64_t)b * t * 3 * width, -1, 1);
    float *o = fbuf((int64_t)b * t * (width + 2));
    double *ref = dbuf((int64_t)b * t * (width + 2));
    sd_attention_desc s = sd_attention_make(b, heads, dh, t, t, 1);
    s.ld_q = s.ld_k = s.ld_v = 3 * width;
    s.ld_o = width + 2;
    sd_scratch ws = attention_scratch(&s);
    sd_attention_forward(be, &s, qkv, qkv + width, qkv + 2 * width, o, NULL, ws);
    attention_reference(&s, qkv, qkv + width, qkv + 2 * width, ref, NULL);
    double e = 0;
    for (int r = 0; r < b * t; r++)
        e = fmax(e, max_err(o + r * (width + 2), ref + r * (width + 2), width));
    tap_ok(e <= TOL, "attention on a fused QKV buffer through row strides: max rel err %.2e", e);
    free(qkv), free(o), free(ref), free(ws.ptr);
}

/* ---- resampling, embeddings, data movement --------------------------------------------------- */

static void test_upsample(void)
{
    const int n = 2, h = 3, w = 5, c = 7;
    float *x = rnd((int64_t)n * h * w * c, -1, 1), *y = fbuf((int64_t)n * 2 * h * 2 * w * c);
    sd_upsample_nearest_forward(be, n, h, w, c, 2 * h, 2 * w, x, y);
    int ok = 1;
    for (int b = 0; b < n; b++)
        for (int oy = 0; oy < 2 * h; oy++)
            for (int ox = 0; ox < 2 * w; ox++)
                for (int j = 0; j < c; j++)
                    ok &= y[(((int64_t)b * 2 * h + oy) * 2 * w + ox) * c + j] ==
                          x[(((int64_t)b * h + oy / 2) * w + ox / 2) * c + j];
    tap_ok(ok, "nearest x2: out[y][x] = in[y/2][x/2]");

    /* PyTorch's rule for other sizes, worked by hand: 3 -> 7 rows take source rows
     * floor(dst * 3/7) = 0 0 0 1 1 2 2; 5 -> 8 columns take floor(dst * 0.625) = 0 0 1 1 2 3 3 4. */
    static const int rows7[7] = {0, 0, 0, 1, 1, 2, 2};
    static const int cols8[8] = {0, 0, 1, 1, 2, 3, 3, 4};
    float *z = fbuf((int64_t)n * 7 * 8 * c);
    sd_upsample_nearest_forward(be, n, h, w, c, 7, 8, x, z);
    ok = 1;
    for (int b = 0; b < n; b++)
        for (int oy = 0; oy < 7; oy++)
            for (int ox = 0; ox < 8; ox++)
                for (int j = 0; j < c; j++)
                    ok &= z[(((int64_t)b * 7 + oy) * 8 + ox) * c + j] ==
                          x[(((int64_t)b * h + rows7[oy]) * w + cols8[ox]) * c + j];
    tap_ok(ok, "nearest to an explicit size 3x5 -> 7x8 follows PyTorch's floor(dst*in/out)");
    free(x), free(y), free(z);
}

static void test_timestep_embedding(void)
{
    sd_timestep_embedding_desc d = sd_timestep_embedding_sd2(320);
    tap_ok(d.dim == 320 && d.flip_sin_to_cos && d.downscale_freq_shift == 0.0f &&
               d.scale == 1.0f && d.max_period == 10000.0f,
           "SD2 settings: flip_sin_to_cos, shift 0, scale 1, period 10000");
    float t[4] = {0.0f, 1.0f, 500.5f, 999.0f};
    float *y = fbuf(4 * 320);
    sd_timestep_embedding(be, 4, &d, t, y);
    int ok = 1;
    for (int k = 0; k < 160; k++)
        ok &= y[k] == 1.0f && y[160 + k] == 0.0f;
    tap_ok(ok, "t = 0 gives [cos = 1 x160 | sin = 0 x160] (cos first)");

    /* Against the exact formula in double. fp32 arguments t * freq carry a relative error of a
     * few 2^-24, i.e. up to ~2e-4 radians at t = 999 for the low frequencies, which is inherent
     * to diffusers' fp32 formulation: 3e-4 bounds it, 1e-6 holds for t <= 1. */
    double e_small = 0, e_large = 0;
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 160; k++) {
            double arg = t[i] * exp(-log(10000.0) * k / 160.0);
            double ec = fabs(y[i * 320 + k] - cos(arg)), es = fabs(y[i * 320 + 160 + k] - sin(arg));
            if (t[i] <= 1.0f)
                e_small = fmax(e_small, fmax(ec, es));
            else
                e_large = fmax(e_large, fmax(ec, es));
        }
    tap_ok(e_small <= 1e-6, "t <= 1: max |err| vs exact %.2e <= 1e-6", e_small);
    tap_ok(e_large <= 3e-4, "t = 500.5, 999: max |err| vs exact %.2e <= 3e-4", e_large);

    /* Values printed by torch 2.15.0 (CPU) from diffusers 0.42.1 get_timestep_embedding(
     * torch.tensor([999.]), 320, flip_sin_to_cos=True, downscale_freq_shift=0). */
    static const struct {
        int col;
        float val;
    } torch999[] = {{0, 0.999649823f},   {1, 0.802677512f},    {80, -0.844469786f},
                    {159, 0.994406343f}, {160, -0.0264607519f}, {161, 0.596413314f},
                    {240, -0.535603166f}, {319, 0.105622061f}};
    double e_torch = 0;
    for (size_t i = 0; i < sizeof torch999 / sizeof torch999[0]; i++)
        e_torch = fmax(e_torch, fabs(y[3 * 320 + torch999[i].col] - torch999[i].val));
    tap_ok(e_torch <= 2e-4, "t = 999 matches PyTorch's values: max |err| %.2e <= 2e-4", e_torch);

    sd_timestep_embedding_desc odd = {7, 0, 1.0f, 1.0f, 10000.0f};
    float yo[7];
    float t1 = 3.0f;
    sd_timestep_embedding(be, 1, &odd, &t1, yo);
    /* half 3, shift 1: freq_k = 10000^(-k/2) = 1, 0.01, 1e-4; [sin | cos | 0] */
    double eo = fmax(fabs(yo[0] - sin(3.0)), fabs(yo[1] - sin(0.03)));
    eo = fmax(eo, fmax(fabs(yo[2] - sin(3e-4)), fabs(yo[3] - cos(3.0))));
    eo = fmax(eo, fmax(fabs(yo[4] - cos(0.03)), fabs(yo[5] - cos(3e-4))));
    tap_ok(eo <= 1e-6 && yo[6] == 0.0f,
           "dim 7, no flip, shift 1: [sin | cos | 0] with freq 10000^(-k/2) (err %.2e)", eo);
    free(y);
}

static void test_embedding(void)
{
    const int b = 2, t = 5, c = 6, vocab = 11;
    int32_t ids[10] = {0, 10, 3, 3, 7, 1, 2, 0, 9, 10};
    float *table = rnd((int64_t)vocab * c, -1, 1), *pos = rnd((int64_t)t * c, -1, 1);
    float *y = fbuf((int64_t)b * t * c), *y2 = fbuf((int64_t)b * t * c);
    sd_embedding_forward(be, b, t, c, vocab, ids, table, pos, y);
    sd_embedding_forward(be, b, t, c, vocab, ids, table, NULL, y2);
    int ok = 1, ok2 = 1;
    for (int i = 0; i < b * t; i++)
        for (int j = 0; j < c; j++) {
            ok &= y[i * c + j] == table[ids[i] * c + j] + pos[(i % t) * c + j];
            ok2 &= y2[i * c + j] == table[ids[i] * c + j];
        }
    tap_ok(ok, "token + position embedding");
    tap_ok(ok2, "token embedding without positions");
    free(table), free(pos), free(y), free(y2);
}

static void test_elementwise(void)
{
    const int64_t n = 37;
    float *a = rnd(n, -2, 2), *b = rnd(n, -2, 2), *y = fbuf(n);
    int ok = 1;
    sd_add(be, n, a, b, y);
    for (int64_t i = 0; i < n; i++)
        ok &= y[i] == a[i] + b[i];
    tap_ok(ok, "add");
    sd_add_scaled(be, n, a, b, 1.4142135f, y);
    ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= y[i] == (a[i] + b[i]) / 1.4142135f;
    tap_ok(ok, "residual add divided by output_scale_factor");
    memcpy(y, a, (size_t)n * sizeof(float));
    sd_add(be, n, y, b, y);
    ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= y[i] == a[i] + b[i];
    tap_ok(ok, "add in place (y = a)");
    for (int64_t i = 0; i < n; i++)
        y[i] = NAN;
    sd_axpby(be, n, 0.18215f, a, 0.0f, y);
    ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= y[i] == 0.18215f * a[i];
    tap_ok(ok, "axpby with beta 0 ignores a NaN-filled y");
    memcpy(y, b, (size_t)n * sizeof(float));
    sd_axpby(be, n, 7.5f, a, -1.0f, y);
    ok = 1;
    for (int64_t i = 0; i < n; i++)
        ok &= y[i] == 7.5f * a[i] + -1.0f * b[i];
    tap_ok(ok, "axpby y = alpha x + beta y");

    /* time conditioning: [n, rows, c] + v[n, c] */
    const int nb = 2, rows = 3, c = 5;
    float *x = rnd(nb * rows * c, -1, 1), *v = rnd(nb * c, -1, 1), *z = fbuf(nb * rows * c);
    sd_add_bcast_forward(be, nb, rows, c, x, v, z);
    ok = 1;
    for (int s = 0; s < nb; s++)
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < c; j++)
                ok &= z[(s * rows + r) * c + j] == x[(s * rows + r) * c + j] + v[s * c + j];
    tap_ok(ok, "add_bcast: v[n, c] added at every row of sample n");

    /* concat [h | skip] and its inverse */
    const int64_t pr = 4;
    const int c1 = 3, c2 = 5;
    float *p = rnd(pr * c1, -1, 1), *q = rnd(pr * c2, -1, 1), *cat = fbuf(pr * (c1 + c2));
    float *p2 = fbuf(pr * c1), *q2 = fbuf(pr * c2);
    sd_concat_channels(be, pr, c1, c2, p, q, cat);
    ok = 1;
    for (int64_t r = 0; r < pr; r++) {
        for (int j = 0; j < c1; j++)
            ok &= cat[r * (c1 + c2) + j] == p[r * c1 + j];
        for (int j = 0; j < c2; j++)
            ok &= cat[r * (c1 + c2) + c1 + j] == q[r * c2 + j];
    }
    tap_ok(ok, "concat channels: current path first, skip second");
    sd_split_channels(be, pr, c1, c2, cat, p2, q2, 0);
    tap_ok(memcmp(p, p2, (size_t)(pr * c1) * sizeof(float)) == 0 &&
               memcmp(q, q2, (size_t)(pr * c2) * sizeof(float)) == 0,
           "split channels inverts concat");
    sd_split_channels(be, pr, c1, c2, cat, NULL, q2, 1);
    ok = 1;
    for (int64_t i = 0; i < pr * c2; i++)
        ok &= q2[i] == q[i] + q[i];
    tap_ok(ok, "split channels accumulates into one part when asked, the other may be NULL");

    /* NCHW <-> NHWC */
    const int pn = 2, pc = 3, ph = 4, pw = 5;
    float *nchw = rnd(pn * pc * ph * pw, -1, 1), *nhwc = fbuf(pn * pc * ph * pw);
    float *back = fbuf(pn * pc * ph * pw);
    sd_nchw_to_nhwc(be, pn, pc, ph, pw, nchw, nhwc);
    ok = 1;
    for (int s = 0; s < pn; s++)
        for (int j = 0; j < pc; j++)
            for (int yy = 0; yy < ph; yy++)
                for (int xx = 0; xx < pw; xx++)
                    ok &= nhwc[((s * ph + yy) * pw + xx) * pc + j] ==
                          nchw[((s * pc + j) * ph + yy) * pw + xx];
    sd_nhwc_to_nchw(be, pn, pc, ph, pw, nhwc, back);
    tap_ok(ok && memcmp(back, nchw, (size_t)(pn * pc * ph * pw) * sizeof(float)) == 0,
           "NCHW -> NHWC -> NCHW");

    /* VAE posterior sample */
    const int64_t gr = 3;
    const int gc = 4;
    float *mom = rnd(gr * 2 * gc, -2, 2), *eps = rnd(gr * gc, -2, 2), *zz = fbuf(gr * gc);
    double *zref = dbuf(gr * gc);
    mom[gc] = 50.0f;      /* logvar clamped to 20 */
    mom[gc + 1] = -90.0f; /* logvar clamped to -30 */
    sd_diag_gaussian_sample(be, gr, gc, mom, eps, 0.18215f, zz);
    for (int64_t r = 0; r < gr; r++)
        for (int j = 0; j < gc; j++) {
            double lv = fmin(20.0, fmax(-30.0, mom[r * 2 * gc + gc + j]));
            zref[r * gc + j] = 0.18215 * (mom[r * 2 * gc + j] + exp(0.5 * lv) * eps[r * gc + j]);
        }
    double e = max_err(zz, zref, gr * gc);
    tap_ok(e <= TOL, "posterior sample scale*(mean + exp(0.5 clamp(logvar)) eps): err %.2e", e);
    sd_diag_gaussian_sample(be, gr, gc, mom, NULL, 1.0f, zz);
    ok = 1;
    for (int64_t r = 0; r < gr; r++)
        for (int j = 0; j < gc; j++)
            ok &= zz[r * gc + j] == mom[r * 2 * gc + j];
    tap_ok(ok, "posterior mode (eps NULL) is the mean");

    float host[5] = {1, 2, 3, 4, 5}, dev[5], out[5];
    sd_upload_f32(be, dev, host, 5);
    sd_copy(be, out, dev, sizeof dev);
    sd_zero(be, dev, sizeof dev);
    sd_download_f32(be, host, out, 5);
    sd_synchronize(be);
    tap_ok(host[4] == 5.0f && dev[0] == 0.0f && dev[4] == 0.0f, "upload, copy, zero, download");

    free(a), free(b), free(y), free(x), free(v), free(z), free(p), free(q), free(cat), free(p2),
        free(q2), free(nchw), free(nhwc), free(back), free(mom), free(eps), free(zz), free(zref);
}

/* ---- backward ------------------------------------------------------------------------------
 * Each backward op is checked against central differences, in double, of a double-precision
 * forward written here: the gradient of L = sum(dy . y(p)) with respect to every input p (step
 * 1e-4; truncation error ~1e-9, so the bound below is the fp32 op's own error). The op's output
 * buffer is laid out [region 0 | region 1 | ...] in the same order as the differentiated inputs
 * (e.g. [dx | dw | db] for [x | w | b]). Each case runs the op:
 *   - writing input gradients (accumulate = 0, the old contents NaN) and accumulating weight
 *     gradients onto random old values;
 *   - accumulating everything (accumulate = 1) onto random old values;
 *   - with the optional gradients NULL (they must stay untouched, the others still right);
 *   - with 1 and 3 threads (bit-identical to the default count).
 */
#define BWD_TOL 1e-5
#define FD_STEP 1e-4

typedef void (*dfwd_fn)(const void *ctx, const double *p, double *y);

typedef struct bwd_common {
    int acc, nulls;
    int nreg;
    int64_t off[5];        /* region r is [off[r], off[r + 1]) of the output */
    unsigned in_mask;      /* regions that are input gradients (written or accumulated) */
    unsigned opt_mask;     /* regions passed as NULL in the nulls run */
    const float *base;     /* old contents of the output */
} bwd_common;

static float *bwd_region(const bwd_common *c, float *out, int r)
{
    return c->nulls && (c->opt_mask >> r & 1) ? NULL : out + c->off[r];
}

static void bwd_prepare(const bwd_common *c, float *out)
{
    memcpy(out, c->base, (size_t)c->off[c->nreg] * sizeof(float));
    if (!c->acc)
        for (int r = 0; r < c->nreg; r++)
            if (c->in_mask >> r & 1)
                for (int64_t i = c->off[r]; i < c->off[r + 1]; i++)
                    out[i] = NAN;
}

/* g[i] = d(sum dy . f(p)) / dp[i] by central differences */
static void fd_grad(dfwd_fn f, const void *ctx, int64_t np, const float *pf, int64_t ny,
                    const float *dy, double *g)
{
    double *p = dbuf(np), *y = dbuf(ny);
    for (int64_t i = 0; i < np; i++)
        p[i] = pf[i];
    for (int64_t i = 0; i < np; i++) {
        const double s = p[i];
        double lp = 0.0, lm = 0.0;
        p[i] = s + FD_STEP;
        f(ctx, p, y);
        for (int64_t j = 0; j < ny; j++)
            lp += (double)dy[j] * y[j];
        p[i] = s - FD_STEP;
        f(ctx, p, y);
        for (int64_t j = 0; j < ny; j++)
            lm += (double)dy[j] * y[j];
        p[i] = s;
        g[i] = (lp - lm) / (2.0 * FD_STEP);
    }
    free(p), free(y);
}

/* Runs the checks listed above; `ctx` starts with its bwd_common. */
static void bwd_check(const char *name, run_fn run, void *ctx, const double *grad, double tol)
{
    bwd_common *c = ctx;
    const int64_t n = c->off[c->nreg];
    float *out = fbuf(n);
    double *ref = dbuf(n);
    for (int mode = 0; mode < 3; mode++) {
        c->acc = mode >= 1;
        c->nulls = mode == 2;
        run(ctx, out);
        for (int r = 0; r < c->nreg; r++)
            for (int64_t i = c->off[r]; i < c->off[r + 1]; i++) {
                if (c->nulls && (c->opt_mask >> r & 1))
                    ref[i] = c->base[i];
                else if (!c->acc && (c->in_mask >> r & 1))
                    ref[i] = grad[i];
                else
                    ref[i] = c->base[i] + grad[i];
            }
        double e = max_err(out, ref, n);
        if (mode == 2 && c->opt_mask == 0)
            continue;
        tap_ok(e <= tol, "%s backward, %s: max rel err %.2e <= %.0e", name,
               mode == 0 ? "written" : mode == 1 ? "accumulated" : "optional gradients NULL", e,
               tol);
    }
    c->acc = 1;
    c->nulls = 0;
    run(ctx, out);
    check_threads(name, run, ctx, out, n);
    free(out), free(ref);
}

/* fills a bwd_common for regions of the given sizes */
static void bwd_setup(bwd_common *c, int nreg, const int64_t *sizes, unsigned in_mask,
                      unsigned opt_mask)
{
    memset(c, 0, sizeof *c);
    c->nreg = nreg;
    for (int r = 0; r < nreg; r++)
        c->off[r + 1] = c->off[r] + sizes[r];
    c->in_mask = in_mask;
    c->opt_mask = opt_mask;
    c->base = rnd(c->off[nreg], -1.0f, 1.0f);
}

/* -- elementwise: silu, gelu, geglu -- */

typedef struct act_ctx {
    bwd_common cm;
    int op; /* 0 silu, 1 gelu, 2 geglu, 3 quick_gelu */
    int64_t n;
    int rows, inner;
    const float *x, *dy;
} act_ctx;

static void run_act_bwd(const void *ctx, float *out)
{
    const act_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    if (c->op == 0)
        sd_silu_backward(be, c->n, c->x, c->dy, out, c->cm.acc);
    else if (c->op == 1)
        sd_gelu_backward(be, c->n, c->x, c->dy, out, c->cm.acc);
    else if (c->op == 3)
        sd_quick_gelu_backward(be, c->n, c->x, c->dy, out, c->cm.acc);
    else
        sd_geglu_backward(be, c->rows, c->inner, c->x, c->dy, out, c->cm.acc);
}

static void act_fwd_d(const void *ctx, const double *p, double *y)
{
    const act_ctx *c = ctx;
    if (c->op == 0)
        for (int64_t i = 0; i < c->n; i++)
            y[i] = silu_d(p[i]);
    else if (c->op == 1)
        for (int64_t i = 0; i < c->n; i++)
            y[i] = gelu_d(p[i]);
    else if (c->op == 3)
        for (int64_t i = 0; i < c->n; i++)
            y[i] = p[i] / (1.0 + exp(-1.702 * p[i]));
    else
        for (int r = 0; r < c->rows; r++)
            for (int j = 0; j < c->inner; j++)
                y[r * c->inner + j] =
                    p[r * 2 * c->inner + j] * gelu_d(p[r * 2 * c->inner + c->inner + j]);
}

static void act_case(const char *name, int op, int rows, int inner, int64_t n)
{
    act_ctx c;
    int64_t nx = op == 2 ? (int64_t)rows * 2 * inner : n, ny = op == 2 ? (int64_t)rows * inner : n;
    bwd_setup(&c.cm, 1, &nx, 1, 0);
    c.op = op, c.n = n, c.rows = rows, c.inner = inner;
    float *x = rnd(nx, -6.0f, 6.0f), *dy = rnd(ny, -1.0f, 1.0f);
    x[0] = 0.0f;
    c.x = x, c.dy = dy;
    double *g = dbuf(nx);
    fd_grad(act_fwd_d, &c, nx, x, ny, dy, g);
    bwd_check(name, run_act_bwd, &c, g, BWD_TOL);
    if (op == 0) { /* far tails: 0 and 1 without NaN */
        float xt[2] = {-100.0f, 100.0f}, dyt[2] = {1.0f, 1.0f}, dxt[2];
        sd_silu_backward(be, 2, xt, dyt, dxt, 0);
        tap_ok(dxt[0] == 0.0f && dxt[1] == 1.0f, "SiLU' (-100) = 0, SiLU'(100) = 1: %g %g",
               (double)dxt[0], (double)dxt[1]);
    }
    free(x), free(dy), free(g), free((void *)c.cm.base);
}

/* -- linear -- */

typedef struct lin_bwd_ctx {
    bwd_common cm;
    int64_t rows;
    int in, out;
    const float *x, *w, *dy;
    sd_scratch ws;
} lin_bwd_ctx;

static void run_linear_bwd(const void *ctx, float *out)
{
    const lin_bwd_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    sd_linear_backward(be, c->rows, c->in, c->out, c->x, c->w, c->dy, bwd_region(&c->cm, out, 0),
                       c->cm.acc, bwd_region(&c->cm, out, 1), bwd_region(&c->cm, out, 2),
                       c->ws);
}

static void linear_fwd_d(const void *ctx, const double *p, double *y)
{
    const lin_bwd_ctx *c = ctx;
    const double *x = p, *w = x + c->rows * c->in, *b = w + (int64_t)c->out * c->in;
    for (int64_t r = 0; r < c->rows; r++)
        for (int o = 0; o < c->out; o++) {
            double s = b[o];
            for (int i = 0; i < c->in; i++)
                s += x[r * c->in + i] * w[(int64_t)o * c->in + i];
            y[r * c->out + o] = s;
        }
}

static void linear_bwd_case(int64_t rows, int in, int out)
{
    lin_bwd_ctx c;
    int64_t sizes[3] = {rows * in, (int64_t)out * in, out};
    bwd_setup(&c.cm, 3, sizes, 1, 5);
    c.rows = rows, c.in = in, c.out = out;
    float *p = rnd(c.cm.off[3], -1.0f, 1.0f), *dy = rnd(rows * out, -1.0f, 1.0f);
    c.x = p, c.w = p + sizes[0], c.dy = dy;
    c.ws = scratch(sd_linear_backward_scratch_bytes(be, rows, in, out));
    double *g = dbuf(c.cm.off[3]);
    fd_grad(linear_fwd_d, &c, c.cm.off[3], p, rows * out, dy, g);
    char name[96];
    snprintf(name, sizeof name, "linear rows=%lld %d->%d", (long long)rows, in, out);
    bwd_check(name, run_linear_bwd, &c, g, BWD_TOL);
    free(p), free(dy), free(g), free((void *)c.cm.base), free(c.ws.ptr);
}

/* Several GEMM tiles in every product (too many parameters for differences): against the
 * analytic gradient in double, dx = dy w, dw = dy^T x, db = column sums of dy. The inputs are
 * all O(1) and the inner dimensions 270 and 300, so fp32 partial sums reach ~10 and results
 * near 1 carry absolute errors of ~1e-5 (measured 9e-6): bound 5e-5. */
#define BWD_TOL_BIG 5e-5
static void linear_bwd_big_case(int64_t rows, int in, int out)
{
    lin_bwd_ctx c;
    int64_t sizes[3] = {rows * in, (int64_t)out * in, out};
    bwd_setup(&c.cm, 3, sizes, 1, 5);
    c.rows = rows, c.in = in, c.out = out;
    float *p = rnd(c.cm.off[3], -1.0f, 1.0f), *dy = rnd(rows * out, -1.0f, 1.0f);
    c.x = p, c.w = p + sizes[0], c.dy = dy;
    c.ws = scratch(sd_linear_backward_scratch_bytes(be, rows, in, out));
    double *g = dbuf(c.cm.off[3]), *gw = g + sizes[0], *gb = gw + sizes[1];
    for (int64_t r = 0; r < rows; r++)
        for (int o = 0; o < out; o++) {
            const double gy = dy[r * out + o];
            gb[o] += gy;
            for (int i = 0; i < in; i++) {
                g[r * in + i] += gy * c.w[(int64_t)o * in + i];
                gw[(int64_t)o * in + i] += gy * c.x[r * in + i];
            }
        }
    char name[96];
    snprintf(name, sizeof name, "linear rows=%lld %d->%d (GEMM tiles, analytic)", (long long)rows,
             in, out);
    bwd_check(name, run_linear_bwd, &c, g, BWD_TOL_BIG);
    free(p), free(dy), free(g), free((void *)c.cm.base), free(c.ws.ptr);
}

/* -- layer norm and group norm (params [x | gamma | beta]) -- */

typedef struct norm_bwd_ctx {
    bwd_common cm;
    int group; /* 0 layer norm [rows, c], 1 group norm */
    int64_t rows;
    int c;
    float eps;
    sd_group_norm_desc d;
    int affine;
    const float *x, *g, *b, *dy;
    float *mean, *rstd;
    sd_scratch ws;
} norm_bwd_ctx;

static void run_norm_bwd(const void *ctx, float *out)
{
    const norm_bwd_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    float *dx = bwd_region(&c->cm, out, 0);
    float *dg = c->affine ? bwd_region(&c->cm, out, 1) : NULL;
    float *db = c->affine ? bwd_region(&c->cm, out, 2) : NULL;
    if (c->group)
        sd_group_norm_backward(be, &c->d, c->x, c->g, c->b, c->mean, c->rstd, c->dy, dx,
                               c->cm.acc, dg, db, c->ws);
    else
        sd_layer_norm_backward(be, c->rows, c->c, c->x, c->g, c->mean, c->rstd, c->dy, dx,
                               c->cm.acc, dg, db, c->ws);
}

static void norm_fwd_d(const void *ctx, const double *p, double *y)
{
    const norm_bwd_ctx *c = ctx;
    const int64_t nx = c->rows * c->c;
    const double *x = p, *g = x + nx, *b = g + c->c;
    /* a set = the elements normalised together: a row, or a (sample, group) */
    const int groups = c->group ? c->d.groups : 1, cpg = c->c / groups;
    const int64_t hw = c->group ? c->d.hw : 1;
    const int64_t nsets = c->group ? (int64_t)c->d.n * groups : c->rows;
    for (int64_t s = 0; s < nsets; s++) {
        const int64_t r0 = c->group ? (s / groups) * hw : s;
        const int j0 = (int)(s % groups) * cpg;
        double sum = 0.0, sq = 0.0, cnt = (double)hw * cpg;
        for (int64_t r = r0; r < r0 + hw; r++)
            for (int j = j0; j < j0 + cpg; j++)
                sum += x[r * c->c + j];
        const double m = sum / cnt;
        for (int64_t r = r0; r < r0 + hw; r++)
            for (int j = j0; j < j0 + cpg; j++)
                sq += (x[r * c->c + j] - m) * (x[r * c->c + j] - m);
        const double rs = 1.0 / sqrt(sq / cnt + (double)c->eps);
        for (int64_t r = r0; r < r0 + hw; r++)
            for (int j = j0; j < j0 + cpg; j++) {
                double v = (x[r * c->c + j] - m) * rs;
                if (c->affine)
                    v = v * g[j] + b[j];
                y[r * c->c + j] = c->group && c->d.silu ? silu_d(v) : v;
            }
    }
}

static void norm_bwd_case(int group, int n, int hw, int c, int groups, int silu, int affine)
{
    norm_bwd_ctx ctx;
    const int64_t rows = (int64_t)n * hw, nx = rows * c;
    int64_t sizes[3] = {nx, c, c};
    bwd_setup(&ctx.cm, affine ? 3 : 1, sizes, 1, affine ? 5 : 1);
    ctx.group = group, ctx.rows = rows, ctx.c = c, ctx.eps = 1e-5f, ctx.affine = affine;
    ctx.d = (sd_group_norm_desc){n, hw, c, groups, 1e-5f, silu};
    float *p = rnd(nx + 2 * c, 0.5f, 1.5f), *dy = rnd(nx, -1.0f, 1.0f), *y = fbuf(nx);
    for (int64_t i = 0; i < nx; i++)
        p[i] = 4.0f * p[i] - 3.0f; /* x in [-1, 3] */
    ctx.x = p, ctx.g = affine ? p + nx : NULL, ctx.b = affine ? p + nx + c : NULL, ctx.dy = dy;
    const int64_t nstat = group ? (int64_t)n * groups : rows;
    ctx.mean = fbuf(nstat), ctx.rstd = fbuf(nstat);
    if (group) {
        sd_scratch fw = scratch(sd_group_norm_forward_scratch_bytes(be, &ctx.d));
        sd_group_norm_forward(be, &ctx.d, ctx.x, ctx.g, ctx.b, y, ctx.mean, ctx.rstd, fw);
        free(fw.ptr);
        ctx.ws = scratch(sd_group_norm_backward_scratch_bytes(be, &ctx.d));
    } else {
        sd_layer_norm_forward(be, rows, c, ctx.eps, ctx.x, ctx.g, ctx.b, y, ctx.mean, ctx.rstd);
        ctx.ws = scratch(sd_layer_norm_backward_scratch_bytes(be, rows, c));
    }
    double *gr = dbuf(nx + 2 * c);
    fd_grad(norm_fwd_d, &ctx, ctx.cm.off[ctx.cm.nreg], p, nx, dy, gr);
    char name[128];
    if (group)
        snprintf(name, sizeof name, "group norm n=%d hw=%d c=%d groups=%d%s%s", n, hw, c, groups,
                 silu ? " +SiLU" : "", affine ? "" : " (no affine)");
    else
        snprintf(name, sizeof name, "layer norm rows=%lld c=%d%s", (long long)rows, c,
                 affine ? "" : " (no affine)");
    bwd_check(name, run_norm_bwd, &ctx, gr, BWD_TOL);
    free(p), free(dy), free(y), free(gr), free(ctx.mean), free(ctx.rstd), free(ctx.ws.ptr),
        free((void *)ctx.cm.base);
}

/* -- nearest upsample (params x) and broadcast add (params v) -- */

static int nearest_src_t(int dst, int in, int out)
{
    if (out == in)
        return dst;
    if (out == 2 * in)
        return dst >> 1;
    int s = (int)floorf((float)dst * ((float)in / (float)out));
    return s < in - 1 ? s : in - 1;
}

typedef struct mv_bwd_ctx {
    bwd_common cm;
    int op; /* 0 upsample, 1 add_bcast */
    int n, h, w, c, h_out, w_out;
    int64_t rows;
    const float *dy;
} mv_bwd_ctx;

static void run_mv_bwd(const void *ctx, float *out)
{
    const mv_bwd_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    if (c->op == 0)
        sd_upsample_nearest_backward(be, c->n, c->h, c->w, c->c, c->h_out, c->w_out, c->dy, out,
                                     c->cm.acc);
    else
        sd_add_bcast_backward(be, c->n, c->rows, c->c, c->dy, out, c->cm.acc,
                              sd_scratch_none());
}

static void mv_fwd_d(const void *ctx, const double *p, double *y)
{
    const mv_bwd_ctx *c = ctx;
    if (c->op == 0) {
        for (int b = 0; b < c->n; b++)
            for (int oy = 0; oy < c->h_out; oy++)
                for (int ox = 0; ox < c->w_out; ox++)
                    for (int j = 0; j < c->c; j++)
                        y[(((int64_t)b * c->h_out + oy) * c->w_out + ox) * c->c + j] =
                            p[(((int64_t)b * c->h + nearest_src_t(oy, c->h, c->h_out)) * c->w +
                               nearest_src_t(ox, c->w, c->w_out)) * c->c + j];
    } else {
        for (int b = 0; b < c->n; b++)
            for (int64_t r = 0; r < c->rows; r++)
                for (int j = 0; j < c->c; j++)
                    y[((int64_t)b * c->rows + r) * c->c + j] = 0.25 * r + p[b * c->c + j];
    }
}

static void mv_bwd_case(int op, int n, int h, int w, int c, int h_out, int w_out, int64_t rows)
{
    mv_bwd_ctx ctx;
    int64_t np = op == 0 ? (int64_t)n * h * w * c : (int64_t)n * c;
    int64_t ny = op == 0 ? (int64_t)n * h_out * w_out * c : (int64_t)n * rows * c;
    bwd_setup(&ctx.cm, 1, &np, 1, 0);
    ctx.op = op, ctx.n = n, ctx.h = h, ctx.w = w, ctx.c = c, ctx.h_out = h_out,
    ctx.w_out = w_out, ctx.rows = rows;
    float *p = rnd(np, -1.0f, 1.0f), *dy = rnd(ny, -1.0f, 1.0f);
    ctx.dy = dy;
    double *g = dbuf(np);
    fd_grad(mv_fwd_d, &ctx, np, p, ny, dy, g);
    char name[96];
    if (op == 0)
        snprintf(name, sizeof name, "nearest %dx%d -> %dx%d", h, w, h_out, w_out);
    else
        snprintf(name, sizeof name, "add_bcast n=%d rows=%lld c=%d", n, (long long)rows, c);
    bwd_check(name, run_mv_bwd, &ctx, g, BWD_TOL);
    free(p), free(dy), free(g), free((void *)ctx.cm.base);
}

/* -- conv2d (params [x | w (ours, [c_out, kh, kw, c_in]) | b]) -- */

typedef struct conv_bwd_ctx {
    bwd_common cm;
    sd_conv2d_desc d;
    const float *x, *w, *dy;
    sd_scratch ws;
} conv_bwd_ctx;

static void run_conv_bwd(const void *ctx, float *out)
{
    const conv_bwd_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    sd_conv2d_backward(be, &c->d, c->x, c->w, c->dy, bwd_region(&c->cm, out, 0), c->cm.acc,
                       bwd_region(&c->cm, out, 1), bwd_region(&c->cm, out, 2), c->ws);
}

static void conv_fwd_d(const void *ctx, const double *p, double *y)
{
    const conv_bwd_ctx *c = ctx;
    const sd_conv2d_desc *d = &c->d;
    const double *x = p, *w = x + c->cm.off[1], *b = p + c->cm.off[2];
    for (int n = 0; n < d->n; n++)
        for (int oy = 0; oy < d->h_out; oy++)
            for (int ox = 0; ox < d->w_out; ox++)
                for (int o = 0; o < d->c_out; o++) {
                    double s = b[o];
                    for (int u = 0; u < d->kh; u++)
                        for (int v = 0; v < d->kw; v++) {
                            int iy = oy * d->stride - d->pad_top + u;
                            int ix = ox * d->stride - d->pad_left + v;
                            if (iy < 0 || iy >= d->h || ix < 0 || ix >= d->w)
                                continue;
                            for (int i = 0; i < d->c_in; i++)
                                s += w[(((int64_t)o * d->kh + u) * d->kw + v) * d->c_in + i] *
                                     x[(((int64_t)n * d->h + iy) * d->w + ix) * d->c_in + i];
                        }
                    y[(((int64_t)n * d->h_out + oy) * d->w_out + ox) * d->c_out + o] = s;
                }
}

/* The weight gradient of the two large cases sums 4270 and 4800 products per element in fp32 in
 * the BLAS's order; how close that lands to the exact value depends on the sgemm kernel the
 * BLAS picks for the CPU: OpenBLAS's Haswell kernel stays under 1e-5, its SkylakeX (AVX-512)
 * kernel reaches 1.5e-5 on an AMD EPYC with AVX-512 (2026-11-26). The expected error of such a
 * sum is about u sqrt(K) |terms| = 2^-24 * 69 * (a few), hence 3e-5 for them. */
#define BWD_TOL_LONG_SUM 3e-5

static void conv_bwd_case(const char *what, sd_conv2d_desc d, double tol)
{
    conv_bwd_ctx c;
    int64_t sizes[3] = {(int64_t)d.n * d.h * d.w * d.c_in,
                        (int64_t)d.c_out * d.kh * d.kw * d.c_in, d.c_out};
    int64_t ny = (int64_t)d.n * d.h_out * d.w_out * d.c_out;
    bwd_setup(&c.cm, 3, sizes, 1, 5);
    c.d = d;
    float *p = rnd(c.cm.off[3], -1.0f, 1.0f), *dy = rnd(ny, -1.0f, 1.0f);
    c.x = p, c.w = p + c.cm.off[1], c.dy = dy;
    c.ws = scratch(sd_conv2d_backward_scratch_bytes(be, &d));
    double *g = dbuf(c.cm.off[3]);
    fd_grad(conv_fwd_d, &c, c.cm.off[3], p, ny, dy, g);
    char name[160];
    snprintf(name, sizeof name, "conv2d %s [%d,%d,%d,%d] -> [%d,%d,%d,%d]", what, d.n, d.h, d.w,
             d.c_in, d.n, d.h_out, d.w_out, d.c_out);
    bwd_check(name, run_conv_bwd, &c, g, tol);
    free(p), free(dy), free(g), free(c.ws.ptr), free((void *)c.cm.base);
}

/* -- attention (params [q | k | v], contiguous rows) -- */

typedef struct attn_bwd_ctx {
    bwd_common cm;
    sd_attention_desc d;
    const float *q, *k, *v, *o, *dout;
    float *lse;
    sd_scratch ws;
} attn_bwd_ctx;

static void run_attn_bwd(const void *ctx, float *out)
{
    const attn_bwd_ctx *c = ctx;
    bwd_prepare(&c->cm, out);
    sd_attention_backward(be, &c->d, c->q, c->k, c->v, c->o, c->lse, c->dout,
                          bwd_region(&c->cm, out, 0), bwd_region(&c->cm, out, 1),
                          bwd_region(&c->cm, out, 2), c->cm.acc, c->ws);
}

static void attn_fwd_d(const void *ctx, const double *p, double *y)
{
    const attn_bwd_ctx *c = ctx;
    const sd_attention_desc *d = &c->d;
    const double *q = p, *k = p + c->cm.off[1], *v = p + c->cm.off[2];
    const int dh = d->head_dim, ld = d->heads * dh;
    double *s = dbuf(d->t_kv);
    for (int b = 0; b < d->batch; b++)
        for (int h = 0; h < d->heads; h++)
            for (int i = 0; i < d->t_q; i++) {
                const int nk = d->causal ? i + 1 : d->t_kv;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j < nk; j++) {
                    double a = 0.0;
                    for (int e = 0; e < dh; e++)
                        a += q[((int64_t)b * d->t_q + i) * ld + h * dh + e] *
                             k[((int64_t)b * d->t_kv + j) * ld + h * dh + e];
                    s[j] = a * d->scale;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int j = 0; j < nk; j++)
                    sum += (s[j] = exp(s[j] - mx));
                for (int e = 0; e < dh; e++) {
                    double a = 0.0;
                    for (int j = 0; j < nk; j++)
                        a += s[j] / sum * v[((int64_t)b * d->t_kv + j) * ld + h * dh + e];
                    y[((int64_t)b * d->t_q + i) * ld + h * dh + e] = a;
                }
            }
    free(s);
}

static void attn_bwd_case(const char *what, sd_attention_desc d, float range)
{
    attn_bwd_ctx c;
    const int ld = d.heads * d.head_dim;
    int64_t sizes[3] = {(int64_t)d.batch * d.t_q * ld, (int64_t)d.batch * d.t_kv * ld,
                        (int64_t)d.batch * d.t_kv * ld};
    bwd_setup(&c.cm, 3, sizes, 7, 5);
    c.d = d;
    float *p = rnd(c.cm.off[3], -range, range), *dout = rnd(sizes[0], -1.0f, 1.0f);
    float *o = fbuf(sizes[0]);
    c.q = p, c.k = p + c.cm.off[1], c.v = p + c.cm.off[2], c.o = o, c.dout = dout;
    c.lse = fbuf((int64_t)d.batch * d.heads * d.t_q);
    sd_scratch fw = attention_scratch(&d);
    sd_attention_forward(be, &d, c.q, c.k, c.v, o, c.lse, fw);
    free(fw.ptr);
    set_threads(default_threads > 3 ? default_threads : 3);
    c.ws = scratch(sd_attention_backward_scratch_bytes(be, &d));
    set_threads(default_threads);
    double *g = dbuf(c.cm.off[3]);
    fd_grad(attn_fwd_d, &c, c.cm.off[3], p, sizes[0], dout, g);
    char name[160];
    snprintf(name, sizeof name, "attention %s (b=%d heads=%d d=%d t_q=%d t_kv=%d)", what, d.batch,
             d.heads, d.head_dim, d.t_q, d.t_kv);
    bwd_check(name, run_attn_bwd, &c, g, BWD_TOL);
    free(p), free(dout), free(o), free(c.lse), free(g), free(c.ws.ptr), free((void *)c.cm.base);
}

/* Fused QKV: q, k, v and dq, dk, dv as column blocks of [batch * t, 3C] rows (ld = 3C) give
 * the same gradients as separate contiguous tensors. */
static void attn_bwd_fused_case(void)
{
    const sd_attention_desc dc = sd_attention_make(2, 3, 8, 9, 9, 0);
    const int C = 24, ld = 3 * C;
    const int64_t rows = 2 * 9, nt = rows * C;
    sd_attention_desc df = dc;
    df.ld_q = df.ld_k = df.ld_v = ld;
    float *qkv = rnd(rows * ld, -1.0f, 1.0f), *dout = rnd(nt, -1.0f, 1.0f);
    float *q = fbuf(nt), *k = fbuf(nt), *v = fbuf(nt), *o = fbuf(nt);
    float *lse = fbuf(2 * 3 * 9), *dq = fbuf(nt), *dk = fbuf(nt), *dv = fbuf(nt);
    float *dqkv = fbuf(rows * ld);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(q + r * C, qkv + r * ld, C * sizeof(float));
        memcpy(k + r * C, qkv + r * ld + C, C * sizeof(float));
        memcpy(v + r * C, qkv + r * ld + 2 * C, C * sizeof(float));
    }
    sd_scratch fw = attention_scratch(&dc);
    sd_attention_forward(be, &dc, q, k, v, o, lse, fw);
    sd_scratch ws = scratch(sd_attention_backward_scratch_bytes(be, &dc));
    sd_attention_backward(be, &dc, q, k, v, o, lse, dout, dq, dk, dv, 0, ws);
    sd_attention_backward(be, &df, qkv, qkv + C, qkv + 2 * C, o, lse, dout, dqkv, dqkv + C,
                          dqkv + 2 * C, 0, ws);
    double e = 0.0;
    for (int64_t r = 0; r < rows; r++)
        for (int j = 0; j < C; j++) {
            e = fmax(e, fabs(dqkv[r * ld + j] - dq[r * C + j]));
            e = fmax(e, fabs(dqkv[r * ld + C + j] - dk[r * C + j]));
            e = fmax(e, fabs(dqkv[r * ld + 2 * C + j] - dv[r * C + j]));
        }
    tap_ok(e <= 1e-6, "attention backward, fused QKV (ld = 3C) equals separate tensors: %.2e", e);
    free(qkv), free(dout), free(q), free(k), free(v), free(o), free(lse), free(dq), free(dk),
        free(dv), free(dqkv), free(fw.ptr), free(ws.ptr);
}

static void test_backward(void)
{
    act_case("SiLU", 0, 0, 0, 203);
    act_case("GELU", 1, 0, 0, 203);
    act_case("GEGLU", 2, 5, 13, 0);
    act_case("QuickGELU", 3, 0, 0, 203);
    linear_bwd_case(7, 13, 5);
    linear_bwd_case(40, 9, 20);
    linear_bwd_big_case(300, 300, 270);
    norm_bwd_case(0, 5, 1, 37, 1, 0, 1);
    norm_bwd_case(0, 3, 1, 8, 1, 0, 0);
    norm_bwd_case(0, 4, 1, 100, 1, 0, 1); /* two column blocks for dgamma/dbeta */
    norm_bwd_case(1, 2, 6, 12, 4, 0, 1);
    norm_bwd_case(1, 2, 5, 12, 3, 1, 1);
    norm_bwd_case(1, 1, 7, 8, 2, 1, 0);
    norm_bwd_case(1, 1, 600, 8, 2, 1, 1); /* two pixel chunks */
    mv_bwd_case(0, 2, 3, 4, 5, 6, 8, 0);
    mv_bwd_case(0, 1, 4, 3, 3, 11, 9, 0);
    mv_bwd_case(0, 1, 5, 4, 2, 5, 4, 0);
    mv_bwd_case(1, 3, 0, 0, 70, 0, 0, 9);
    conv_bwd_case("3x3 s1 p1", sd_conv2d_make(2, 5, 4, 3, 4, 3, 1, 1), BWD_TOL);
    conv_bwd_case("3x3 s2 p1, odd H", sd_conv2d_make(1, 7, 6, 3, 5, 3, 2, 1), BWD_TOL);
    conv_bwd_case("3x3 s2 pad (0,1,0,1) (VAE Downsample2D)",
                  sd_conv2d_make_padded(2, 7, 6, 3, 3, 3, 3, 2, 0, 1, 0, 1), BWD_TOL);
    conv_bwd_case("1x1", sd_conv2d_make(2, 3, 4, 5, 6, 1, 1, 0), BWD_TOL);
    conv_bwd_case("3x3 s1 p1, 2 im2col tiles", sd_conv2d_make(1, 70, 61, 1, 2, 3, 1, 1),
                  BWD_TOL_LONG_SUM);
    conv_bwd_case("3x3 s2 p1, samples across im2col tiles",
                  sd_conv2d_make(3, 80, 80, 1, 1, 3, 2, 1), BWD_TOL_LONG_SUM);
    attn_bwd_case("cross", sd_attention_make(2, 2, 4, 5, 7, 0), 1.0f);
    attn_bwd_case("causal", sd_attention_make(1, 2, 8, 6, 6, 1), 1.5f);
    attn_bwd_case("causal, 2 query blocks", sd_attention_make(1, 1, 2, 260, 260, 1), 2.0f);
    attn_bwd_case("cross, 2 query blocks", sd_attention_make(1, 1, 3, 300, 4, 0), 2.0f);
    attn_bwd_fused_case();
}

/* ---- the stream clock --------------------------------------------------------------------- */

static void test_stream_clock(void)
{
    const struct timespec nap = {0, 60 * 1000 * 1000};
    volatile int caught = 0;
    double dt;
    tap_ok(isnan(sd_stream_elapsed(be, 0, 3)), "stream clock: NAN while a mark is unset");
    sd_stream_mark(be, 0);
    nanosleep(&nap, NULL);
    sd_stream_mark(be, 3);
    dt = sd_stream_elapsed(be, 0, 3);
    tap_ok(dt >= 0.059 && dt < 5.0, "stream clock: marks 60 ms apart measure %.4f s", dt);
    tap_ok(sd_stream_elapsed(be, 3, 0) == -dt && sd_stream_elapsed(be, 3, 3) == 0.0,
           "stream clock: reversed marks give the negative, one mark zero");
    sd_stream_mark(be, 0); /* a slot's next mark replaces it */
    tap_ok(sd_stream_elapsed(be, 0, 3) < 0.03, "stream clock: a mark set again replaces the first");
    sd_set_abort_handler(catch_fatal);
    tap_diag("two fatal messages follow on stderr; they are expected");
    if (setjmp(fatal_jump) == 0)
        sd_stream_mark(be, SD_STREAM_MARKS);
    else
        caught = 1;
    tap_ok(caught, "stream clock: a mark past the last slot is refused");
    caught = 0;
    if (setjmp(fatal_jump) == 0)
        (void)sd_stream_elapsed(be, -1, 0);
    else
        caught = 1;
    tap_ok(caught, "stream clock: a negative slot is refused");
    sd_set_abort_handler(NULL);
}

/* ---- misuse is reported, not crashed on --------------------------------------------------- */

static void test_failures(void)
{
    sd_conv2d_desc d = sd_conv2d_make(1, 4, 4, 2, 2, 3, 1, 1);
    float x[32], w[36], y[32], dw[36];
    memset(x, 0, sizeof x), memset(w, 0, sizeof w), memset(dw, 0, sizeof dw);
    volatile int caught = 0;

    sd_set_abort_handler(catch_fatal);
    tap_diag("three fatal messages follow on stderr; they are expected");
    /* every CPU entry is filled in: a copy of its table with one entry removed stands in for
     * a backend that lacks an op */
    sd_ops lacking_ops = *be->ops;
    lacking_ops.quick_gelu_backward = NULL;
    sd_backend lacking = *be;
    lacking.ops = &lacking_ops;
    if (setjmp(fatal_jump) == 0)
        sd_quick_gelu_backward(&lacking, 32, x, y, dw, 0);
    else
        caught = 1;
    tap_ok(caught, "a backward op a backend lacks ends the job with a message");

    caught = 0;
    if (setjmp(fatal_jump) == 0)
        sd_conv2d_forward(be, &d, x, w, NULL, y, sd_scratch_none());
    else
        caught = 1;
    tap_ok(caught && sd_conv2d_forward_scratch_bytes(be, &d) > 0,
           "a 3x3 conv given no scratch is refused");

    caught = 0;
    d.h_out = 5;
    if (setjmp(fatal_jump) == 0)
        sd_conv2d_forward(be, &d, x, w, NULL, y, sd_scratch_none());
    else
        caught = 1;
    tap_ok(caught, "an inconsistent conv descriptor is refused");
    sd_set_abort_handler(NULL);
}

int main(void)
{
    be = sd_backend_cpu();
    tap_ok(be && be->device == SD_DEV_CPU && be->dtype == SD_F32 && strcmp(be->name, "cpu") == 0,
           "CPU backend: fp32 on the host");
#ifdef _OPENMP
    default_threads = omp_get_max_threads();
#endif
    test_layouts();
    test_conv2d();
    test_linear();
    test_norms();
    test_activations();
    test_attention();
    test_upsample();
    test_timestep_embedding();
    test_embedding();
    test_elementwise();
    test_backward();
    test_stream_clock();
    test_failures();
    return tap_done();
}
