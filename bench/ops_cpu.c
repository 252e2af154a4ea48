/* Micro-benchmark of the CPU ops at SD2 shapes: GFLOP/s of conv2d, attention and linear, GB/s of group norm. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/check.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/timer.h"

/*
 * Usage: ops_cpu [--quick]. Each line: the op, its shape, the median time of a few runs (after
 * one warm-up run) and the rate. FLOPs count a multiply-add as 2; attention counts the two
 * GEMMs (4 t_q t_kv head_dim per head), not the softmax. --quick drops the 512 px shapes.
 */

static const sd_backend *be;

static float *rnd(int64_t n)
{
    float *x = sd_xmalloc((size_t)n * sizeof(float));
    SD_CHECK(sd_rng_fill_uniform(1, SD_RNG_PURPOSE(SD_RNG_USER, 1), 0, 0, x, (size_t)n) == 0,
             "rng");
    for (int64_t i = 0; i < n; i++)
        x[i] = x[i] * 2.0f - 1.0f;
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef void (*bench_fn)(void *ctx);

/* Median seconds over `reps` runs after one warm-up. */
static double time_median(bench_fn fn, void *ctx, int reps)
{
    double t[16];
    if (reps > 16)
        reps = 16;
    fn(ctx);
    for (int i = 0; i < reps; i++) {
        double t0 = sd_time_now();
        fn(ctx);
        t[i] = sd_time_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    return t[reps / 2];
}

typedef struct conv_ctx {
    sd_conv2d_desc d;
    float *x, *w, *b, *y;
    sd_scratch ws;
} conv_ctx;

static void run_conv(void *p)
{
    conv_ctx *c = p;
    sd_conv2d_forward(be, &c->d, c->x, c->w, c->b, c->y, c->ws);
}

static void bench_conv(const char *what, int n, int hw, int c_in, int c_out, int k, int reps)
{
    conv_ctx c;
    c.d = sd_conv2d_make(n, hw, hw, c_in, c_out, k, 1, k / 2);
    c.x = rnd((int64_t)n * hw * hw * c_in);
    c.w = rnd((int64_t)c_out * k * k * c_in);
    c.b = rnd(c_out);
    c.y = sd_xmalloc((size_t)n * c.d.h_out * c.d.w_out * c_out * sizeof(float));
    c.ws.bytes = sd_conv2d_forward_scratch_bytes(be, &c.d);
    c.ws.ptr = c.ws.bytes ? sd_xmalloc(c.ws.bytes) : NULL;
    double s = time_median(run_conv, &c, reps);
    double flop = 2.0 * n * c.d.h_out * c.d.w_out * (double)c_out * c_in * k * k;
    printf("conv2d %dx%d  %-24s [%d,%d,%d,%d]->%d  %9.2f ms  %7.1f GFLOP/s\n", k, k, what, n, hw,
           hw, c_in, c_out, s * 1e3, flop / s * 1e-9);
    free(c.x), free(c.w), free(c.b), free(c.y), free(c.ws.ptr);
}

typedef struct attn_ctx {
    sd_attention_desc d;
    float *q, *k, *v, *o;
    sd_scratch ws;
} attn_ctx;

static void run_attn(void *p)
{
    attn_ctx *c = p;
    sd_attention_forward(be, &c->d, c->q, c->k, c->v, c->o, NULL, c->ws);
}

static void bench_attention(const char *what, int n, int heads, int dh, int t_q, int t_kv,
                            int causal, int reps)
{
    attn_ctx c;
    c.d = sd_attention_make(n, heads, dh, t_q, t_kv, causal);
    int64_t width = (int64_t)heads * dh;
    c.q = rnd(n * t_q * width);
    c.k = rnd(n * t_kv * width);
    c.v = rnd(n * t_kv * width);
    c.o = sd_xmalloc((size_t)(n * t_q * width) * sizeof(float));
    c.ws.bytes = sd_attention_forward_scratch_bytes(be, &c.d);
    c.ws.ptr = sd_xmalloc(c.ws.bytes);
    double s = time_median(run_attn, &c, reps);
    double flop = 4.0 * n * heads * (double)t_q * t_kv * dh;
    printf("attention  %-24s n=%d heads=%d d=%d t=%d/%d  %9.2f ms  %7.1f GFLOP/s\n", what, n,
           heads, dh, t_q, t_kv, s * 1e3, flop / s * 1e-9);
    free(c.q), free(c.k), free(c.v), free(c.o), free(c.ws.ptr);
}

typedef struct linear_ctx {
    int64_t rows;
    int in, out;
    float *x, *w, *b, *y;
} linear_ctx;

static void run_linear(void *p)
{
    linear_ctx *c = p;
    sd_linear_forward(be, c->rows, c->in, c->out, c->x, c->w, c->b, c->y);
}

static void bench_linear(const char *what, int64_t rows, int in, int out, int reps)
{
    linear_ctx c = {rows, in, out, rnd(rows * in), rnd((int64_t)out * in), rnd(out), NULL};
    c.y = sd_xmalloc((size_t)(rows * out) * sizeof(float));
    double s = time_median(run_linear, &c, reps);
    double flop = 2.0 * rows * (double)in * out;
    printf("linear     %-24s rows=%lld %d->%d  %9.2f ms  %7.1f GFLOP/s\n", what, (long long)rows,
           in, out, s * 1e3, flop / s * 1e-9);
    free(c.x), free(c.w), free(c.b), free(c.y);
}

typedef struct gn_ctx {
    sd_group_norm_desc d;
    float *x, *g, *b, *y, *mean, *rstd;
    sd_scratch ws;
} gn_ctx;

static void run_gn(void *p)
{
    gn_ctx *c = p;
    sd_group_norm_forward(be, &c->d, c->x, c->g, c->b, c->y, c->mean, c->rstd, c->ws);
}

static void bench_group_norm(const char *what, int n, int hw, int c_, int reps)
{
    gn_ctx c;
    c.d = (sd_group_norm_desc){n, hw * hw, c_, 32, 1e-5f, 1};
    int64_t nx = (int64_t)n * hw * hw * c_;
    c.x = rnd(nx), c.g = rnd(c_), c.b = rnd(c_);
    c.y = sd_xmalloc((size_t)nx * sizeof(float));
    c.mean = sd_xmalloc((size_t)n * 32 * sizeof(float));
    c.rstd = sd_xmalloc((size_t)n * 32 * sizeof(float));
    c.ws.bytes = sd_group_norm_forward_scratch_bytes(be, &c.d);
    c.ws.ptr = sd_xmalloc(c.ws.bytes);
    double s = time_median(run_gn, &c, reps);
    /* two reads for the statistics, one read and one write to normalize */
    double bytes = 4.0 * nx * sizeof(float);
    printf("groupnorm+silu %-20s [%d,%d,%d,%d]  %9.2f ms  %7.1f GB/s\n", what, n, hw, hw, c_,
           s * 1e3, bytes / s * 1e-9);
    free(c.x), free(c.g), free(c.b), free(c.y), free(c.mean), free(c.rstd), free(c.ws.ptr);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    be = sd_backend_cpu();
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("# sdtrain CPU ops benchmark: backend %s, %d OpenMP threads, batch 1\n", be->name,
           threads);

    bench_conv("U-Net 256px level 0", 1, 32, 320, 320, 3, 5);
    bench_conv("U-Net 256px level 1", 1, 16, 640, 640, 3, 5);
    bench_conv("U-Net 256px level 2", 1, 8, 1280, 1280, 3, 5);
    bench_conv("U-Net up concat", 1, 8, 2560, 1280, 3, 5);
    bench_conv("1x1 shortcut", 1, 32, 640, 320, 1, 5);
    if (!quick) {
        bench_conv("U-Net 512px level 0", 1, 64, 320, 320, 3, 3);
        bench_conv("VAE 512px mid", 1, 64, 512, 512, 3, 3);
    }

    bench_attention("U-Net 256px self", 1, 5, 64, 1024, 1024, 0, 5);
    bench_attention("U-Net 256px cross", 1, 5, 64, 1024, 77, 0, 5);
    bench_attention("U-Net 256px mid self", 1, 20, 64, 64, 64, 0, 5);
    bench_attention("CLIP causal", 1, 16, 64, 77, 77, 1, 5);
    if (!quick) {
        bench_attention("U-Net 512px self", 1, 5, 64, 4096, 4096, 0, 3);
        bench_attention("VAE 256px mid (1 head)", 1, 1, 512, 1024, 1024, 0, 3);
    }

    bench_linear("U-Net ff.net.0 (geglu)", 1024, 320, 2560, 5);
    bench_linear("CLIP mlp.fc1", 77, 1024, 4096, 5);
    bench_group_norm("U-Net 256px level 0", 1, 32, 320, 5);
    return 0;
}
