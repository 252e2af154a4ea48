/* Benchmark of the CUDA backend's ops at SD2 U-Net shapes against the GPU's measured ceilings. */
#include "sd_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/device.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/timer.h"

/*
 * Usage: ops_cuda [--batch N] [--res 32|64|both] [--dtype bf16|f32] [--reps N]
 *                 [--only SUBSTRING] [--csv FILE]
 * Defaults: batch 32, both resolutions (latents 32x32 = 256 px, 64x64 = 512 px), bf16, 10 reps.
 *
 * Each op runs through its sd_* wrapper on the CUDA backend of GPU 0: two warm-up runs, then
 * three rounds of `reps` runs between two sd_synchronize calls, timed on the monotonic clock;
 * the time is the median round divided by reps. Everything is allocated (sd_backend_alloc,
 * scratch from the *_scratch_bytes queries) and filled with random non-zero values
 * (sd_upload_f32) before the timing; a backward op first runs its forward when the backend has
 * it, so statistics, lse and outputs are consistent.
 *
 * Two ceilings are measured first: a device-to-device copy of 1 GiB (bandwidth = 2 GiB moved
 * per copy) and an 8192^3 GEMM through sd_linear_forward in the backend's dtype (FLOP/s). For
 * each op the table gives the time, TFLOP/s, GB/s (of the minimum bytes), the floor
 * max(flops / peak FLOP/s, bytes / peak bandwidth) and the floor as a percentage of the time
 * (100% = at the measured ceiling).
 *
 * FLOPs count a multiply-add as 2. Attention counts its GEMMs: 4 t_q t_kv d per head forward,
 * 10 backward (scores recomputed, then dV, dP, dQ, dK); convolution and linear backward count
 * dx and dw (twice the forward). The elementwise and normalization ops get a nominal few FLOPs
 * per element (noted at each), which never decides their floor. Minimum bytes: every input read
 * once and every output written once at its element size (the dtype's, 4 for the fp32
 * arguments); accumulated fp32 gradients (dw, db, dgamma, dbeta) are read and written.
 *
 * Ops the backend does not implement yet (NULL table entries) are listed as n/a, as are ops
 * whose buffers do not fit in device memory. Without a usable GPU: "no usable GPU: ..." and
 * exit status 77.
 */

#define CHUNK (1 << 20) /* random values uploaded once, then tiled by device copies */
#define MAX_BUFS 24
#ifndef CEILING_COPY_BYTES
#define CEILING_COPY_BYTES ((int64_t)1 << 30) /* the copy of the bandwidth ceiling */
#endif
#ifndef CEILING_GEMM_N
#define CEILING_GEMM_N 8192 /* the square GEMM of the FLOP/s ceiling */
#endif

typedef struct opts {
    int batch, res_lo, res_hi, reps;
    sd_dtype dtype;
    const char *only, *csv;
} opts;

static const sd_backend *be;
static size_t es;          /* bytes per element of be->dtype */
static float *host_chunk;  /* CHUNK random values in [-1, 1), none zero */
static double peak_flops;  /* measured, FLOP/s (0: unknown) */
static double peak_bw;     /* measured, bytes/s */
static opts opt;
static FILE *csv;

static void usage(FILE *f)
{
    fprintf(f, "usage: ops_cuda [--batch N] [--res 32|64|both] [--dtype bf16|f32] [--reps N]\n"
               "                [--only SUBSTRING] [--csv FILE]\n");
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static void parse_opts(int argc, char **argv)
{
    opt.batch = 32;
    opt.res_lo = 32;
    opt.res_hi = 64;
    opt.reps = 10;
    opt.dtype = SD_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (!v) {
            bad = 1;
        } else if (strcmp(a, "--batch") == 0) {
            bad = parse_int(v, 1, 4096, &opt.batch);
        } else if (strcmp(a, "--reps") == 0) {
            bad = parse_int(v, 1, 100000, &opt.reps);
        } else if (strcmp(a, "--res") == 0) {
            if (strcmp(v, "32") == 0)
                opt.res_lo = opt.res_hi = 32;
            else if (strcmp(v, "64") == 0)
                opt.res_lo = opt.res_hi = 64;
            else if (strcmp(v, "both") == 0)
                opt.res_lo = 32, opt.res_hi = 64;
            else
                bad = 1;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "bf16") == 0)
                opt.dtype = SD_BF16;
            else if (strcmp(v, "f32") == 0)
                opt.dtype = SD_F32;
            else
                bad = 1;
        } else if (strcmp(a, "--only") == 0) {
            opt.only = v;
        } else if (strcmp(a, "--csv") == 0) {
            opt.csv = v;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "ops_cuda: bad option '%s%s%s'\n", a, v ? " " : "", v ? v : "");
            usage(stderr);
            exit(2);
        }
        i++;
    }
}

/* ---- device buffers ---------------------------------------------------------------------- */

/* The buffers of one benchmark case, freed together. */
typedef struct pool {
    void *buf[MAX_BUFS];
    int n, failed;
} pool;

static void *pool_alloc(pool *pl, size_t bytes)
{
    SD_CHECK(pl->n < MAX_BUFS, "benchmark case needs more than %d buffers", MAX_BUFS);
    void *p = pl->failed ? NULL : sd_backend_alloc(be, bytes);
    if (!p) {
        pl->failed = 1;
        return NULL;
    }
    pl->buf[pl->n++] = p;
    return p;
}

static void pool_release(pool *pl)
{
    for (int i = 0; i < pl->n; i++)
        sd_backend_free(be, pl->buf[i]);
    pl->n = 0;
}

/* n random elements: of the backend's dtype, or fp32 when `f32` is set. */
static void *pool_rand(pool *pl, int64_t n, int f32)
{
    const size_t size = f32 ? sizeof(float) : es;
    char *d = pool_alloc(pl, (size_t)n * size);
    if (!d)
        return NULL;
    const int64_t first = n < CHUNK ? n : CHUNK;
    if (f32)
        sd_upload(be, d, host_chunk, (size_t)first * sizeof(float));
    else
        sd_upload_f32(be, d, host_chunk, first);
    for (int64_t off = first; off < n; off += first) {
        const int64_t m = n - off < first ? n - off : first;
        sd_copy(be, d + (size_t)off * size, d, (size_t)m * size);
    }
    return d;
}

static sd_scratch pool_scratch(pool *pl, size_t bytes)
{
    sd_scratch s = {NULL, bytes};
    if (bytes)
        s.ptr = pool_alloc(pl, bytes);
    return s;
}

/* ---- timing and the table ---------------------------------------------------------------- */

typedef struct ctx {
    sd_conv2d_desc conv;
    sd_attention_desc att;
    sd_group_norm_desc gn;
    int64_t rows, n;
    int in, out, c, inner, h, w, h_out, w_out;
    void *x, *wt, *bias, *y, *dy, *dx, *gamma, *beta;
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *dw, *db, *mean, *rstd, *lse;
    sd_scratch ws;
} ctx;

typedef void (*bench_fn)(ctx *c);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per run: median of three rounds of opt.reps runs, after two warm-up runs. */
static double time_op(bench_fn fn, ctx *c)
{
    double round_s[3];
    fn(c);
    fn(c);
    for (int r = 0; r < 3; r++) {
        sd_synchronize(be);
        const double t0 = sd_time_now();
        for (int i = 0; i < opt.reps; i++)
            fn(c);
        sd_synchronize(be);
        round_s[r] = (sd_time_now() - t0) / opt.reps;
    }
    qsort(round_s, 3, sizeof round_s[0], cmp_double);
    return round_s[1];
}

static int wanted(const char *op, const char *shape)
{
    if (!opt.only)
        return 1;
    char both[256];
    snprintf(both, sizeof both, "%s %s", op, shape);
    return strstr(both, opt.only) != NULL;
}

static void print_header(void)
{
    printf("%-18s %-34s %10s %8s %8s %10s %7s\n", "op", "shape", "ms", "TFLOP/s", "GB/s",
           "floor ms", "%floor");
    if (csv)
        fprintf(csv, "op,shape,dtype,batch,ms,tflops,gbs,floor_ms,pct_of_floor,note\n");
}

static void report_na(const char *op, const char *shape, const char *why)
{
    printf("%-18s %-34s %10s   (%s)\n", op, shape, "n/a", why);
    if (csv)
        fprintf(csv, "%s,%s,%s,%d,,,,,,%s\n", op, shape, sd_dtype_name(be->dtype), opt.batch,
                why);
    fflush(stdout);
}

static void report(const char *op, const char *shape, double s, double flops, double bytes)
{
    double floor_s = bytes / peak_bw;
    if (peak_flops > 0.0 && flops / peak_flops > floor_s)
        floor_s = flops / peak_flops;
    const double tflops = flops / s * 1e-12, gbs = bytes / s * 1e-9;
    const double pct = floor_s / s * 100.0;
    printf("%-18s %-34s %10.3f %8.1f %8.0f %10.3f %6.1f%%\n", op, shape, s * 1e3, tflops, gbs,
           floor_s * 1e3, pct);
    if (csv)
        fprintf(csv, "%s,%s,%s,%d,%.6f,%.3f,%.1f,%.6f,%.2f,\n", op, shape,
                sd_dtype_name(be->dtype), opt.batch, s * 1e3, tflops, gbs, floor_s * 1e3, pct);
    fflush(stdout);
}

/* Times fn unless the buffers could not be had. */
static void run_case(pool *pl, const char *op, const char *shape, bench_fn fn, ctx *c,
                     double flops, double bytes)
{
    if (pl->failed)
        report_na(op, shape, "out of device memory");
    else
        report(op, shape, time_op(fn, c), flops, bytes);
    pool_release(pl);
}

/* ---- the ops ------------------------------------------------------------------------------ */

static void run_copy(ctx *c)
{
    sd_copy(be, c->y, c->x, (size_t)c->n);
}

static void run_linear_fwd(ctx *c)
{
    sd_linear_forward(be, c->rows, c->in, c->out, c->x, c->wt, c->bias, c->y);
}

static void run_linear_bwd(ctx *c)
{
    sd_linear_backward(be, c->rows, c->in, c->out, c->x, c->wt, c->dy, c->dx, 0, c->dw, c->db,
                       c->ws);
}

static void run_conv_fwd(ctx *c)
{
    sd_conv2d_forward(be, &c->conv, c->x, c->wt, c->bias, c->y, c->ws);
}

static void run_conv_bwd(ctx *c)
{
    sd_conv2d_backward(be, &c->conv, c->x, c->wt, c->dy, c->dx, 0, c->dw, c->db, c->ws);
}

static void run_attn_fwd(ctx *c)
{
    sd_attention_forward(be, &c->att, c->q, c->k, c->v, c->o, c->lse, c->ws);
}

static void run_attn_bwd(ctx *c)
{
    sd_attention_backward(be, &c->att, c->q, c->k, c->v, c->o, c->lse, c->dout, c->dq, c->dk,
                          c->dv, 0, c->ws);
}

static void run_gn_fwd(ctx *c)
{
    sd_group_norm_forward(be, &c->gn, c->x, c->gamma, c->beta, c->y, c->mean, c->rstd, c->ws);
}

static void run_gn_bwd(ctx *c)
{
    sd_group_norm_backward(be, &c->gn, c->x, c->gamma, c->beta, c->mean, c->rstd, c->dy, c->dx,
                           0, c->dw, c->db, c->ws);
}

static void run_ln_fwd(ctx *c)
{
    sd_layer_norm_forward(be, c->rows, c->c, 1e-5f, c->x, c->gamma, c->beta, c->y, c->mean,
                          c->rstd);
}

static void run_ln_bwd(ctx *c)
{
    sd_layer_norm_backward(be, c->rows, c->c, c->x, c->gamma, c->mean, c->rstd, c->dy, c->dx, 0,
                           c->dw, c->db, c->ws);
}

static void run_geglu_fwd(ctx *c)
{
    sd_geglu_forward(be, c->rows, c->inner, c->x, c->y);
}

static void run_geglu_bwd(ctx *c)
{
    sd_geglu_backward(be, c->rows, c->inner, c->x, c->dy, c->dx, 0);
}

static void run_upsample_fwd(ctx *c)
{
    sd_upsample_nearest_forward(be, (int)c->n, c->h, c->w, c->c, c->h_out, c->w_out, c->x, c->y);
}

static void run_upsample_bwd(ctx *c)
{
    sd_upsample_nearest_backward(be, (int)c->n, c->h, c->w, c->c, c->h_out, c->w_out, c->dy,
                                 c->dx, 0);
}

static void run_add(ctx *c)
{
    sd_add(be, c->n, c->x, c->dy, c->y);
}

static void run_add_bcast(ctx *c)
{
    sd_add_bcast_forward(be, (int)c->n, c->rows, c->c, c->x, c->bias, c->y);
}

static void run_concat(ctx *c)
{
    sd_concat_channels(be, c->rows, c->c, c->c, c->x, c->dy, c->y);
}

/* The two ceilings: bandwidth from a 1 GiB device copy, FLOP/s from an 8192^3 GEMM. */
static void measure_ceilings(void)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.n = CEILING_COPY_BYTES;
    c.x = pool_alloc(&pl, (size_t)c.n);
    c.y = pool_alloc(&pl, (size_t)c.n);
    if (pl.failed) {
        fprintf(stderr, "ops_cuda: cannot allocate 2 x %lld bytes for the bandwidth ceiling\n",
                (long long)c.n);
        exit(1);
    }
    sd_zero(be, c.x, (size_t)c.n);
    const double copy_s = time_op(run_copy, &c);
    peak_bw = 2.0 * (double)c.n / copy_s;
    snprintf(shape, sizeof shape, "%.3g GiB", (double)c.n / (1 << 30));
    report("copy d2d", shape, copy_s, 0.0, 2.0 * (double)c.n);
    pool_release(&pl);

    const int g = CEILING_GEMM_N;
    snprintf(shape, sizeof shape, "%dx%dx%d (rows in out)", g, g, g);
    if (!be->ops->linear_forward) {
        report_na("gemm ceiling", shape, "linear_forward not implemented: floors count bytes only");
        return;
    }
    c.rows = c.in = c.out = g;
    c.x = pool_rand(&pl, c.rows * c.in, 0);
    c.wt = pool_rand(&pl, (int64_t)c.out * c.in, 0);
    c.bias = NULL;
    c.y = pool_alloc(&pl, (size_t)(c.rows * c.out) * es);
    const double flops = 2.0 * g * (double)g * g;
    if (pl.failed) {
        report_na("gemm ceiling", shape, "out of device memory: floors count bytes only");
        pool_release(&pl);
        return;
    }
    const double s = time_op(run_linear_fwd, &c);
    peak_flops = flops / s;
    report("gemm ceiling", shape, s, flops, 3.0 * g * (double)g * (double)es);
    pool_release(&pl);
}

static void bench_conv(int n, int hw, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.conv = sd_conv2d_make(n, hw, hw, ch, ch, 3, 1, 1);
    snprintf(shape, sizeof shape, "n%d %dx%d c%d->%d 3x3", n, hw, hw, ch, ch);
    const double nx = (double)n * hw * hw * ch, nw = 9.0 * ch * ch;
    const double flops = 2.0 * nx * ch * 9.0;

    if (wanted("conv2d fwd", shape)) {
        if (!be->ops->conv2d_forward) {
            report_na("conv2d fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.wt = pool_rand(&pl, (int64_t)nw, 0);
            c.bias = pool_rand(&pl, ch, 0);
            c.y = pool_alloc(&pl, (size_t)nx * es);
            c.ws = pool_scratch(&pl, sd_conv2d_forward_scratch_bytes(be, &c.conv));
            run_case(&pl, "conv2d fwd", shape, run_conv_fwd, &c, flops,
                     (double)es * (2.0 * nx + nw + ch));
        }
    }
    if (wanted("conv2d bwd", shape)) {
        if (!be->ops->conv2d_backward) {
            report_na("conv2d bwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.wt = pool_rand(&pl, (int64_t)nw, 0);
            c.dy = pool_rand(&pl, (int64_t)nx, 0);
            c.dx = pool_alloc(&pl, (size_t)nx * es);
            c.dw = pool_rand(&pl, (int64_t)nw, 1);
            c.db = pool_rand(&pl, ch, 1);
            c.ws = pool_scratch(&pl, sd_conv2d_backward_scratch_bytes(be, &c.conv));
            run_case(&pl, "conv2d bwd", shape, run_conv_bwd, &c, 2.0 * flops,
                     (double)es * (3.0 * nx + nw) + 8.0 * (nw + ch));
        }
    }
}

/* The VAE encoder's Downsample2D: 3x3 stride 2 with the right and bottom padded (cuDNN has no
 * asymmetric padding: the op pads a copy of x first; its bytes count in the floor's). */
static void bench_conv_down(int n, int hw, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.conv = sd_conv2d_make_padded(n, hw, hw, ch, ch, 3, 3, 2, 0, 1, 0, 1);
    snprintf(shape, sizeof shape, "n%d %dx%d c%d->%d 3x3 s2 pad 0,1 (VAE)", n, hw, hw, ch, ch);
    const double nx = (double)n * hw * hw * ch, ny = nx / 4.0, nw = 9.0 * ch * ch;
    if (!wanted("conv2d fwd", shape))
        return;
    if (!be->ops->conv2d_forward) {
        report_na("conv2d fwd", shape, "not implemented");
        return;
    }
    c.x = pool_rand(&pl, (int64_t)nx, 0);
    c.wt = pool_rand(&pl, (int64_t)nw, 0);
    c.bias = pool_rand(&pl, ch, 0);
    c.y = pool_alloc(&pl, (size_t)ny * es);
    c.ws = pool_scratch(&pl, sd_conv2d_forward_scratch_bytes(be, &c.conv));
    run_case(&pl, "conv2d fwd", shape, run_conv_fwd, &c, 2.0 * ny * ch * 9.0,
             (double)es * (nx + ny + nw + ch));
}

static void bench_linear(int64_t rows, int in, int out, const char *what)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.rows = rows, c.in = in, c.out = out;
    snprintf(shape, sizeof shape, "rows %lld %d->%d %s", (long long)rows, in, out, what);
    const double nx = (double)rows * in, ny = (double)rows * out, nw = (double)in * out;
    const double flops = 2.0 * rows * nw;

    if (wanted("linear fwd", shape)) {
        if (!be->ops->linear_forward) {
            report_na("linear fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.wt = pool_rand(&pl, (int64_t)nw, 0);
            c.bias = pool_rand(&pl, out, 0);
            c.y = pool_alloc(&pl, (size_t)ny * es);
            run_case(&pl, "linear fwd", shape, run_linear_fwd, &c, flops,
                     (double)es * (nx + nw + out + ny));
        }
    }
    if (wanted("linear bwd", shape)) {
        if (!be->ops->linear_backward) {
            report_na("linear bwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.wt = pool_rand(&pl, (int64_t)nw, 0);
            c.dy = pool_rand(&pl, (int64_t)ny, 0);
            c.dx = pool_alloc(&pl, (size_t)nx * es);
            c.dw = pool_rand(&pl, (int64_t)nw, 1);
            c.db = pool_rand(&pl, out, 1);
            c.ws = pool_scratch(&pl, sd_linear_backward_scratch_bytes(be, rows, in, out));
            run_case(&pl, "linear bwd", shape, run_linear_bwd, &c, 2.0 * flops,
                     (double)es * (2.0 * nx + nw + ny) + 8.0 * (nw + out));
        }
    }
}

static void bench_attention(int n, int t_q, int t_kv, const char *what)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    const int heads = 5, dh = 64, width = heads * dh;
    memset(&c, 0, sizeof c);
    c.att = sd_attention_make(n, heads, dh, t_q, t_kv, 0);
    snprintf(shape, sizeof shape, "n%d h%d d%d t%d/%d %s", n, heads, dh, t_q, t_kv, what);
    const double nq = (double)n * t_q * width, nkv = (double)n * t_kv * width;
    const double nlse = (double)n * heads * t_q;
    const double mm = (double)n * heads * t_q * t_kv * dh; /* multiply-adds of one GEMM */

    if (wanted("attention fwd", shape)) {
        if (!be->ops->attention_forward) {
            report_na("attention fwd", shape, "not implemented");
        } else {
            c.q = pool_rand(&pl, (int64_t)nq, 0);
            c.k = pool_rand(&pl, (int64_t)nkv, 0);
            c.v = pool_rand(&pl, (int64_t)nkv, 0);
            c.o = pool_alloc(&pl, (size_t)nq * es);
            c.lse = pool_alloc(&pl, (size_t)nlse * sizeof(float));
            c.ws = pool_scratch(&pl, sd_attention_forward_scratch_bytes(be, &c.att));
            run_case(&pl, "attention fwd", shape, run_attn_fwd, &c, 4.0 * mm,
                     (double)es * (2.0 * nq + 2.0 * nkv) + 4.0 * nlse);
        }
    }
    if (wanted("attention bwd", shape)) {
        if (!be->ops->attention_backward) {
            report_na("attention bwd", shape, "not implemented");
        } else {
            c.q = pool_rand(&pl, (int64_t)nq, 0);
            c.k = pool_rand(&pl, (int64_t)nkv, 0);
            c.v = pool_rand(&pl, (int64_t)nkv, 0);
            c.o = pool_rand(&pl, (int64_t)nq, 0);
            c.lse = pool_rand(&pl, (int64_t)nlse, 1);
            c.dout = pool_rand(&pl, (int64_t)nq, 0);
            c.dq = pool_alloc(&pl, (size_t)nq * es);
            c.dk = pool_alloc(&pl, (size_t)nkv * es);
            c.dv = pool_alloc(&pl, (size_t)nkv * es);
            c.ws = pool_scratch(&pl, sd_attention_backward_scratch_bytes(be, &c.att));
            if (!pl.failed && be->ops->attention_forward) {
                /* o and lse as the forward gives them (its own scratch, freed before timing) */
                pool fw = {{0}, 0, 0};
                sd_scratch ws = pool_scratch(&fw, sd_attention_forward_scratch_bytes(be, &c.att));
                if (!fw.failed)
                    sd_attention_forward(be, &c.att, c.q, c.k, c.v, c.o, c.lse, ws);
                sd_synchronize(be);
                pool_release(&fw);
            }
            run_case(&pl, "attention bwd", shape, run_attn_bwd, &c, 10.0 * mm,
                     (double)es * (4.0 * nq + 4.0 * nkv) + 4.0 * nlse);
        }
    }
}

/* GroupNorm + SiLU, nominal 11 FLOPs per element forward (statistics 3, affine 4, SiLU 4) and
 * 20 backward. */
static void bench_group_norm(int n, int hw, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.gn.n = n, c.gn.hw = hw * hw, c.gn.c = ch, c.gn.groups = 32, c.gn.eps = 1e-5f, c.gn.silu = 1;
    snprintf(shape, sizeof shape, "n%d %dx%d c%d g32", n, hw, hw, ch);
    const double nx = (double)n * hw * hw * ch, nstat = (double)n * 32;

    if (wanted("groupnorm+silu fwd", shape)) {
        if (!be->ops->group_norm_forward) {
            report_na("groupnorm+silu fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.gamma = pool_rand(&pl, ch, 0);
            c.beta = pool_rand(&pl, ch, 0);
            c.y = pool_alloc(&pl, (size_t)nx * es);
            c.mean = pool_alloc(&pl, (size_t)nstat * sizeof(float));
            c.rstd = pool_alloc(&pl, (size_t)nstat * sizeof(float));
            c.ws = pool_scratch(&pl, sd_group_norm_forward_scratch_bytes(be, &c.gn));
            run_case(&pl, "groupnorm+silu fwd", shape, run_gn_fwd, &c, 11.0 * nx,
                     (double)es * (2.0 * nx + 2.0 * ch) + 8.0 * nstat);
        }
    }
    if (wanted("groupnorm+silu bwd", shape)) {
        if (!be->ops->group_norm_backward) {
            report_na("groupnorm+silu bwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.gamma = pool_rand(&pl, ch, 0);
            c.beta = pool_rand(&pl, ch, 0);
            c.mean = pool_rand(&pl, (int64_t)nstat, 1);
            c.rstd = pool_rand(&pl, (int64_t)nstat, 1);
            c.dy = pool_rand(&pl, (int64_t)nx, 0);
            c.dx = pool_alloc(&pl, (size_t)nx * es);
            c.dw = pool_rand(&pl, ch, 1);
            c.db = pool_rand(&pl, ch, 1);
            c.ws = pool_scratch(&pl, sd_group_norm_backward_scratch_bytes(be, &c.gn));
            if (!pl.failed && be->ops->group_norm_forward) {
                pool fw = {{0}, 0, 0};
                void *y = pool_alloc(&fw, (size_t)nx * es);
                sd_scratch ws = pool_scratch(&fw, sd_group_norm_forward_scratch_bytes(be, &c.gn));
                if (!fw.failed)
                    sd_group_norm_forward(be, &c.gn, c.x, c.gamma, c.beta, y, c.mean, c.rstd,
                                          ws);
                sd_synchronize(be);
                pool_release(&fw);
            }
            run_case(&pl, "groupnorm+silu bwd", shape, run_gn_bwd, &c, 20.0 * nx,
                     (double)es * (3.0 * nx + 2.0 * ch) + 8.0 * nstat + 16.0 * ch);
        }
    }
}

/* LayerNorm, nominal 7 FLOPs per element forward and 15 backward. */
static void bench_layer_norm(int64_t rows, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.rows = rows, c.c = ch;
    snprintf(shape, sizeof shape, "rows %lld c%d", (long long)rows, ch);
    const double nx = (double)rows * ch;

    if (wanted("layernorm fwd", shape)) {
        if (!be->ops->layer_norm_forward) {
            report_na("layernorm fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.gamma = pool_rand(&pl, ch, 0);
            c.beta = pool_rand(&pl, ch, 0);
            c.y = pool_alloc(&pl, (size_t)nx * es);
            c.mean = pool_alloc(&pl, (size_t)rows * sizeof(float));
            c.rstd = pool_alloc(&pl, (size_t)rows * sizeof(float));
            run_case(&pl, "layernorm fwd", shape, run_ln_fwd, &c, 7.0 * nx,
                     (double)es * (2.0 * nx + 2.0 * ch) + 8.0 * (double)rows);
        }
    }
    if (wanted("layernorm bwd", shape)) {
        if (!be->ops->layer_norm_backward) {
            report_na("layernorm bwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.gamma = pool_rand(&pl, ch, 0);
            c.mean = pool_rand(&pl, rows, 1);
            c.rstd = pool_rand(&pl, rows, 1);
            c.dy = pool_rand(&pl, (int64_t)nx, 0);
            c.dx = pool_alloc(&pl, (size_t)nx * es);
            c.dw = pool_rand(&pl, ch, 1);
            c.db = pool_rand(&pl, ch, 1);
            c.ws = pool_scratch(&pl, sd_layer_norm_backward_scratch_bytes(be, rows, ch));
            if (!pl.failed && be->ops->layer_norm_forward) {
                pool fw = {{0}, 0, 0};
                void *y = pool_alloc(&fw, (size_t)nx * es);
                if (!fw.failed)
                    sd_layer_norm_forward(be, rows, ch, 1e-5f, c.x, c.gamma, NULL, y, c.mean,
                                          c.rstd);
                sd_synchronize(be);
                pool_release(&fw);
            }
            run_case(&pl, "layernorm bwd", shape, run_ln_bwd, &c, 15.0 * nx,
                     (double)es * (3.0 * nx + ch) + 8.0 * (double)rows + 16.0 * ch);
        }
    }
}

/* GEGLU, nominal 10 FLOPs per output forward (exact GELU and the product) and 20 backward. */
static void bench_geglu(int64_t rows, int inner)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.rows = rows, c.inner = inner;
    snprintf(shape, sizeof shape, "rows %lld inner %d", (long long)rows, inner);
    const double ny = (double)rows * inner;

    if (wanted("geglu fwd", shape)) {
        if (!be->ops->geglu_forward) {
            report_na("geglu fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)(2.0 * ny), 0);
            c.y = pool_alloc(&pl, (size_t)ny * es);
            run_case(&pl, "geglu fwd", shape, run_geglu_fwd, &c, 10.0 * ny, (double)es * 3.0 * ny);
        }
    }
    if (wanted("geglu bwd", shape)) {
        if (!be->ops->geglu_backward) {
            report_na("geglu bwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)(2.0 * ny), 0);
            c.dy = pool_rand(&pl, (int64_t)ny, 0);
            c.dx = pool_alloc(&pl, (size_t)(2.0 * ny) * es);
            run_case(&pl, "geglu bwd", shape, run_geglu_bwd, &c, 20.0 * ny,
                     (double)es * 5.0 * ny);
        }
    }
}

/* Nearest 2x upsampling (no FLOPs forward; backward adds 4 values per input: 3 FLOPs). */
static void bench_upsample(int n, int hw, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.n = n, c.h = c.w = hw, c.c = ch, c.h_out = c.w_out = 2 * hw;
    snprintf(shape, sizeof shape, "n%d %dx%d->%dx%d c%d", n, hw, hw, 2 * hw, 2 * hw, ch);
    const double nx = (double)n * hw * hw * ch, ny = 4.0 * nx;

    if (wanted("upsample2x fwd", shape)) {
        if (!be->ops->upsample_nearest_forward) {
            report_na("upsample2x fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.y = pool_alloc(&pl, (size_t)ny * es);
            run_case(&pl, "upsample2x fwd", shape, run_upsample_fwd, &c, 0.0,
                     (double)es * (nx + ny));
        }
    }
    if (wanted("upsample2x bwd", shape)) {
        if (!be->ops->upsample_nearest_backward) {
            report_na("upsample2x bwd", shape, "not implemented");
        } else {
            c.dy = pool_rand(&pl, (int64_t)ny, 0);
            c.dx = pool_alloc(&pl, (size_t)nx * es);
            run_case(&pl, "upsample2x bwd", shape, run_upsample_bwd, &c, 3.0 * nx,
                     (double)es * (nx + ny));
        }
    }
}

static void bench_add(int64_t n)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.n = n;
    snprintf(shape, sizeof shape, "n %lld", (long long)n);
    if (!wanted("add", shape))
        return;
    if (!be->ops->add) {
        report_na("add", shape, "not implemented");
        return;
    }
    c.x = pool_rand(&pl, n, 0);
    c.dy = pool_rand(&pl, n, 0);
    c.y = pool_alloc(&pl, (size_t)n * es);
    run_case(&pl, "add", shape, run_add, &c, (double)n, (double)es * 3.0 * (double)n);
}

/* The ResNet's time-embedding add (one vector per sample over its pixels) and the up path's
 * skip concat: pure data movement. */
static void bench_bcast_concat(int n, int hw, int ch)
{
    char shape[96];
    ctx c;
    pool pl = {{0}, 0, 0};
    memset(&c, 0, sizeof c);
    c.n = n, c.rows = (int64_t)hw * hw, c.c = ch;
    const double nx = (double)n * hw * hw * ch;
    snprintf(shape, sizeof shape, "n%d %dx%d c%d", n, hw, hw, ch);
    if (wanted("add_bcast fwd", shape)) {
        if (!be->ops->add_bcast_forward) {
            report_na("add_bcast fwd", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.bias = pool_rand(&pl, (int64_t)n * ch, 0);
            c.y = pool_alloc(&pl, (size_t)nx * es);
            run_case(&pl, "add_bcast fwd", shape, run_add_bcast, &c, nx, (double)es * 2.0 * nx);
        }
    }
    c.rows = (int64_t)n * hw * hw;
    snprintf(shape, sizeof shape, "rows %lld c%d+%d", (long long)c.rows, ch, ch);
    if (wanted("concat", shape)) {
        if (!be->ops->concat_channels) {
            report_na("concat", shape, "not implemented");
        } else {
            c.x = pool_rand(&pl, (int64_t)nx, 0);
            c.dy = pool_rand(&pl, (int64_t)nx, 0);
            c.y = pool_alloc(&pl, (size_t)(2.0 * nx) * es);
            run_case(&pl, "concat", shape, run_concat, &c, 0.0, (double)es * 4.0 * nx);
        }
    }
}

static void bench_resolution(int res)
{
    const int n = opt.batch;
    const int64_t rows = (int64_t)n * res * res;
    printf("# latents %dx%d (%d px), batch %d\n", res, res, res * 8, n);
    bench_conv(n, res, 320);
    bench_conv(n, res / 2, 640);
    bench_conv(n, res / 4, 1280);
    bench_linear(rows, 320, 320, "(proj)");
    bench_linear(rows, 320, 2560, "(geglu proj)");
    bench_linear(rows, 1280, 320, "(ff out)");
    bench_attention(n, res * res, res * res, "self");
    bench_attention(n, res * res, 77, "cross");
    bench_group_norm(n, res, 320);
    /* the VAE encoder's first level at this resolution (images of res * 8 px, 128 channels):
     * the largest group norms of preprocessing */
    bench_group_norm(n, res * 8, 128);
    bench_layer_norm(rows, 320);
    bench_geglu(rows, 1280);
    bench_upsample(n, res / 2, 640);
    bench_add(rows * 320);
    bench_bcast_concat(n, res, 320);
    /* the VAE encoder's first downsampler at this resolution (128 channels at res * 8 px) */
    bench_conv_down(n, res * 8, 128);
}

int main(int argc, char **argv)
{
    parse_opts(argc, argv);
    sd_backend *cuda = NULL;
    sd_err err;
    if (sd_backend_cuda_create(0, opt.dtype, &cuda, &err) != 0) {
        printf("no usable GPU: %s\n", err.msg);
        return 77;
    }
    be = cuda;
    es = sd_dtype_size(be->dtype);
    if (opt.csv) {
        csv = fopen(opt.csv, "w");
        SD_CHECK(csv != NULL, "cannot write %s", opt.csv);
    }

    host_chunk = sd_xmalloc(CHUNK * sizeof(float));
    SD_CHECK(sd_rng_fill_uniform(1, SD_RNG_PURPOSE(SD_RNG_USER, 2), 0, 0, host_chunk, CHUNK) == 0,
             "rng");
    for (int i = 0; i < CHUNK; i++) {
        host_chunk[i] = host_chunk[i] * 2.0f - 1.0f;
        if (host_chunk[i] == 0.0f)
            host_chunk[i] = 0.5f;
    }

    char name[256] = "?";
    sd_cuda_device_name(0, name, sizeof name);
    printf("# sdtrain CUDA ops benchmark: %s, dtype %s, batch %d, %d reps x 3 rounds (median)\n",
           name, sd_dtype_name(be->dtype), opt.batch, opt.reps);
    print_header();
    measure_ceilings();
    if (peak_flops > 0.0)
        printf("# ceilings: %.0f GB/s (copy), %.1f TFLOP/s (GEMM)\n", peak_bw * 1e-9,
               peak_flops * 1e-12);
    else
        printf("# ceilings: %.0f GB/s (copy), no GEMM: floors from bytes only\n",
               peak_bw * 1e-9);
    for (int res = opt.res_lo; res <= opt.res_hi; res *= 2)
        bench_resolution(res);

    if (csv)
        SD_CHECK(fclose(csv) == 0, "cannot write %s", opt.csv);
    free(host_chunk);
    sd_backend_cuda_destroy(cuda);
    return 0;
}
