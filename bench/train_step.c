/* U-Net training-step benchmark on the CPU backend: forward + loss + backward + clipping + AdamW, timed per phase, with peak memory. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_stats.h"
#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/optim.h"
#include "sdtrain/rng.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"

#include "unet_configs.h"

/*
 * Usage: train_step [--snapshot DIR | --config tiny|sd2-small] [--batch B] [--size S]
 *                   [--ctx-len L] [--reps N] [--warmup N] [--threads N] [--recompute]
 *                   [--no-batch-invariance]
 * Defaults: the U-Net of tests/data/models/tiny-sd2, batch 8, the config's sample_size, 77
 * context tokens, 10 timed steps after 2 warm-ups, OMP_NUM_THREADS threads, batch invariance on
 * (the CPU default, which the training loop uses). --config takes random weights
 * (sd_weights_init_random) of a built-in configuration instead of a snapshot: "tiny" is
 * tiny-sd2's shape, "sd2-small" is SD2-base with channels 64/128/256/256 at head_dim 64 and
 * 32x32 latents (bench/train_vs_torch.py builds the same ones for PyTorch).
 *
 * One step is what a training loop does on one rank with one micro-batch, in this order:
 *   optimizer part 1: zero the gradient buffer;
 *   forward:          add_noise (DDPM, SD's scaled_linear schedule, epsilon target), the
 *                     training forward, the MSE loss and its gradient;
 *   backward:         sd_unet_backward into the flat fp32 gradient buffer;
 *   optimizer part 2: global-norm clipping to 1.0 (sd_sumsq, sd_clip_coef, sd_scale) and one
 *                     AdamW update (lr 1e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01) over
 *                     the whole flat buffer.
 * Latents, noise and context are fixed standard normals (the same every step) and the timesteps
 * spread over [0, 1000), so the loss falls from step to step (printed as a sanity check). The
 * tensors stay channels-last: add_noise and the loss are elementwise per sample, so the NCHW
 * round trip of sdtool grad is left out (a real loop has its latents in NHWC already).
 *
 * Prints one table of median / min / max times per phase, images/s, GFLOP/s (FLOPs of
 * sd_unet_trainer_flops: forward + backward, recomputation not counted), memory (parameters,
 * gradients and AdamW moments; the activation arena; peak RSS from getrusage and the RSS at
 * the end), and a last line "RESULT key=value ..." for bench/train_vs_torch.py. Memory is in
 * MiB (2^20 bytes).
 */

#define MAX_REPS 1000

typedef struct opts {
    const char *snapshot, *config;
    int batch, size, ctx_len, reps, warmup, threads, recompute, batch_invariant;
} opts;

/* SD2-base at a fifth of the width: every block type, CLIP-width context, head_dim 64. */
static void sd2_small_config(sd_unet_config *c)
{
    static const int ch[4] = {64, 128, 256, 256}, heads[4] = {1, 2, 4, 4};
    sd_unet_config_sd2_base(c);
    for (int i = 0; i < 4; i++) {
        c->block_out_channels[i] = ch[i];
        c->heads[i] = heads[i];
    }
    c->sample_size = 32;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *x, int n, double *lo, double *hi)
{
    double *s = sd_xmalloc((size_t)n * sizeof *s), m;
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    m = bench_sorted_median(s, n);
    if (lo)
        *lo = s[0];
    if (hi)
        *hi = s[n - 1];
    free(s);
    return m;
}

static double peak_rss_mib(void)
{
    struct rusage ru;
    SD_CHECK(getrusage(RUSAGE_SELF, &ru) == 0, "getrusage: %s", strerror(errno));
    return ru.ru_maxrss / 1024.0; /* Linux: KiB */
}

/* The resident set now (VmRSS of /proc/self/status), or -1 where there is no such file. */
static double rss_now_mib(void)
{
    char line[256];
    double kib = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf", &kib) == 1)
            break;
    fclose(f);
    return kib < 0 ? -1 : kib / 1024.0;
}

static float *normals(size_t n, uint64_t stream)
{
    float *x = sd_xmalloc(n * sizeof *x);
    SD_CHECK(sd_rng_fill_normal(20261122, SD_RNG_PURPOSE(SD_RNG_USER, 12), 0, stream, x, n) == 0,
             "rng fill of %zu normals", n);
    return x;
}

static void load_model(const opts *o, sd_unet_config *c, sd_weights *w, char *label, size_t size)
{
    sd_err err;
    if (o->config) {
        sd_param_table t;
        if (strcmp(o->config, "tiny") == 0)
            bench_tiny_unet_config(c);
        else
            sd2_small_config(c);
        sd_unet_params(c, &t);
        sd_weights_init(w, &t);
        sd_weights_init_random(w, 20261122);
        snprintf(label, size, "config %s (random weights)", o->config);
    } else {
        sd_snapshot snap;
        SD_CHECK(sd_snapshot_open(&snap, o->snapshot, &err) == 0, "%s", err.msg);
        SD_CHECK(sd_snapshot_load_unet(&snap, NULL, c, w, &err) == 0, "%s", err.msg);
        sd_snapshot_close(&snap);
        snprintf(label, size, "%s", o->snapshot);
    }
}

static void run(const opts *o)
{
    const sd_backend *be = sd_backend_cpu();
    const sd_adamw_hparams hp = {0.9, 0.999, 1e-8, 0.01};
    const double lr = 1e-4, max_norm = 1.0;
    sd_unet_config c;
    sd_weights w;
    sd_diffusion d;
    sd_unet *u;
    sd_unet_trainer *tr;
    sd_arena arena;
    sd_err err;
    char label[4200];
    float *grads, *m, *v, *lat, *noise, *ctx, *xt, *pred, *dpred, *steps;
    int32_t *ti;
    double *t_step, *t_fwd, *t_bwd, *t_opt, flops, loss0 = 0, loss = 0, rss_loaded;
    double lo, hi, step, fwd, bwd, opt, t0, t1;
    size_t nf, per, arena_bytes;
    int B = o->batch, S, threads = 1, n = o->warmup + o->reps;

    load_model(o, &c, &w, label, sizeof label);
    S = o->size > 0 ? o->size : c.sample_size;
    SD_CHECK(c.in_channels == c.out_channels,
             "the loss needs in_channels == out_channels (the U-Net has %d and %d)",
             c.in_channels, c.out_channels);
    SD_CHECK(sd_unet_check_shape(&c, B, S, S, o->ctx_len, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, "epsilon",
                               SD_LINSPACE_FUSED, &err) == 0, "%s", err.msg);
#ifdef _OPENMP
    if (o->threads > 0)
        omp_set_num_threads(o->threads);
    threads = omp_get_max_threads();
#endif
    SD_CHECK(sd_unet_create_from_weights(&u, &c, &w, be, &err) == 0, "%s", err.msg);
    sd_unet_set_batch_invariant(u, o->batch_invariant);
    nf = w.table.total_floats;
    grads = sd_xcalloc(nf, sizeof *grads);
    m = sd_xcalloc(nf, sizeof *m);
    v = sd_xcalloc(nf, sizeof *v);
    SD_CHECK(sd_unet_trainer_create(&tr, u, &w.table, grads, B, S, S, o->ctx_len, o->recompute,
                                    &err) == 0, "%s", err.msg);
    arena_bytes = sd_unet_trainer_arena_bytes(tr);
    flops = sd_unet_trainer_flops(tr);
    SD_CHECK(sd_arena_init(&arena, arena_bytes, SD_ARENA_DEFAULT_ALIGNMENT) == 0,
             "arena of %zu bytes", arena_bytes);
    rss_loaded = peak_rss_mib();

    per = (size_t)S * S * c.in_channels;
    lat = normals(B * per, 1);
    noise = normals(B * per, 2);
    ctx = normals((size_t)B * o->ctx_len * c.cross_attention_dim, 3);
    xt = sd_xmalloc(B * per * sizeof *xt);
    pred = sd_xmalloc(B * per * sizeof *pred);
    dpred = sd_xmalloc(B * per * sizeof *dpred);
    ti = sd_xmalloc((size_t)B * sizeof *ti);
    steps = sd_xmalloc((size_t)B * sizeof *steps);
    for (int b = 0; b < B; b++) {
        ti[b] = (999 - 37 * b) % 1000;
        steps[b] = (float)ti[b];
    }
    t_step = sd_xmalloc((size_t)n * sizeof(double));
    t_fwd = sd_xmalloc((size_t)n * sizeof(double));
    t_bwd = sd_xmalloc((size_t)n * sizeof(double));
    t_opt = sd_xmalloc((size_t)n * sizeof(double));

    for (int r = 0; r < n; r++) {
        double sumsq, coef, ta, tb, tc;
        t0 = sd_time_now();
        memset(grads, 0, nf * sizeof *grads);
        ta = sd_time_now();
        sd_diffusion_add_noise(&d, ti, B, (int64_t)per, lat, noise, xt);
        sd_unet_train_forward(tr, xt, steps, ctx, pred, &arena);
        /* epsilon prediction: the target is the noise itself */
        loss = sd_diffusion_loss(&d, ti, B, (int64_t)per, B, pred, noise, NULL, dpred);
        tb = sd_time_now();
        sd_unet_backward(tr, dpred, &arena);
        tc = sd_time_now();
        sumsq = sd_sumsq(grads, nf);
        coef = sd_clip_coef(sumsq, max_norm);
        sd_scale(grads, nf, coef);
        sd_adamw_update(&hp, lr, r + 1, w.data, grads, m, v, nf);
        t1 = sd_time_now();
        SD_CHECK(isfinite(loss) && isfinite(sumsq), "step %d: loss %g, |g|^2 %g", r, loss, sumsq);
        if (r == 0)
            loss0 = loss;
        t_step[r] = t1 - t0;
        t_fwd[r] = tb - ta;
        t_bwd[r] = tc - tb;
        t_opt[r] = (ta - t0) + (t1 - tc);
    }

    step = median(t_step + o->warmup, o->reps, &lo, &hi);
    fwd = median(t_fwd + o->warmup, o->reps, NULL, NULL);
    bwd = median(t_bwd + o->warmup, o->reps, NULL, NULL);
    opt = median(t_opt + o->warmup, o->reps, NULL, NULL);
    printf("train_step: %s\n", label);
    printf("  %zu parameters, batch %d, latent %dx%dx%d, ctx %dx%d, %d threads, batch invariance "
           "%s%s, %d steps after %d warm-ups\n",
           w.table.total_numel, B, c.in_channels, S, S, o->ctx_len, c.cross_attention_dim,
           threads, o->batch_invariant ? "on" : "off", o->recompute ? ", recompute" : "",
           o->reps, o->warmup);
    printf("  loss %.6f (step 1) -> %.6f (step %d)\n", loss0, loss, n);
    printf("  %-24s %10s %10s %10s\n", "", "median", "min", "max");
    printf("  %-24s %10.2f %10.2f %10.2f\n", "step ms", step * 1e3, lo * 1e3, hi * 1e3);
    printf("  %-24s %10.2f %9.0f%%\n", "  forward + loss ms", fwd * 1e3, 100 * fwd / step);
    printf("  %-24s %10.2f %9.0f%%\n", "  backward ms", bwd * 1e3, 100 * bwd / step);
    printf("  %-24s %10.2f %9.0f%%\n", "  clip + AdamW + zero ms", opt * 1e3, 100 * opt / step);
    printf("  %-24s %10.1f\n", "images/s", B / step);
    printf("  %-24s %10.3f   (%.1f GFLOP/s; forward+backward only: %.1f GFLOP/s)\n",
           "GFLOP/step", flops * 1e-9, flops * 1e-9 / step, flops * 1e-9 / (fwd + bwd));
    printf("  %-24s %10.1f   (weights, grads, 2 AdamW moments: 4 x %.2f)\n", "parameters MiB",
           4.0 * nf * sizeof(float) / 1048576.0, nf * sizeof(float) / 1048576.0);
    printf("  %-24s %10.1f\n", "activation arena MiB", arena_bytes / 1048576.0);
    printf("  %-24s %10.1f   (after load and allocation: %.1f)\n", "peak RSS MiB",
           peak_rss_mib(), rss_loaded);
    printf("  %-24s %10.1f\n", "RSS at end MiB", rss_now_mib());
    printf("RESULT batch=%d size=%d ctx=%d threads=%d invariant=%d recompute=%d step_ms=%.3f "
           "min_ms=%.3f max_ms=%.3f fwd_ms=%.3f bwd_ms=%.3f opt_ms=%.3f images_s=%.2f "
           "gflop=%.4f gflops=%.2f params=%zu params_mb=%.2f arena_mb=%.2f peak_rss_mb=%.1f "
           "rss_mb=%.1f loss0=%.6f loss=%.6f\n",
           B, S, o->ctx_len, threads, o->batch_invariant, o->recompute, step * 1e3, lo * 1e3,
           hi * 1e3, fwd * 1e3, bwd * 1e3, opt * 1e3, B / step, flops * 1e-9, flops * 1e-9 / step,
           w.table.total_numel, 4.0 * nf * sizeof(float) / 1048576.0, arena_bytes / 1048576.0,
           peak_rss_mib(), rss_now_mib(), loss0, loss);
    fflush(stdout);

    free(t_step);
    free(t_fwd);
    free(t_bwd);
    free(t_opt);
    free(ti);
    free(steps);
    free(lat);
    free(noise);
    free(ctx);
    free(xt);
    free(pred);
    free(dpred);
    sd_arena_free(&arena);
    sd_unet_trainer_free(tr);
    sd_unet_free(u);
    free(grads);
    free(m);
    free(v);
    sd_diffusion_free(&d);
    sd_weights_free(&w);
}

static int usage(const char *prog)
{
    fprintf(stderr,
            "usage: %s [--snapshot DIR | --config tiny|sd2-small] [--batch B] [--size S]\n"
            "          [--ctx-len L] [--reps N] [--warmup N] [--threads N] [--recompute]\n"
            "          [--no-batch-invariance]\n",
            prog);
    return 2;
}

/* A whole number in [lo, hi], else the usage message and exit status 2. */
static int int_arg(const char *prog, const char *name, const char *s, int lo, int hi)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: %s '%s': expected a whole number from %d to %d\n", prog, name, s,
                lo, hi);
        exit(usage(prog));
    }
    return (int)x;
}

int main(int argc, char **argv)
{
    opts o = {"tests/data/models/tiny-sd2", NULL, 8, 0, 77, 10, 2, 0, 0, 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--recompute") == 0) {
            o.recompute = 1;
            continue;
        }
        if (strcmp(a, "--no-batch-invariance") == 0) {
            o.batch_invariant = 0;
            continue;
        }
        if (!val)
            return usage(argv[0]);
        i++;
        if (strcmp(a, "--snapshot") == 0)
            o.snapshot = val;
        else if (strcmp(a, "--config") == 0 && (strcmp(val, "tiny") == 0 ||
                                                 strcmp(val, "sd2-small") == 0))
            o.config = val;
        else if (strcmp(a, "--batch") == 0)
            o.batch = int_arg(argv[0], a, val, 1, 4096);
        else if (strcmp(a, "--size") == 0)
            o.size = int_arg(argv[0], a, val, 1, 4096);
        else if (strcmp(a, "--ctx-len") == 0)
            o.ctx_len = int_arg(argv[0], a, val, 1, 4096);
        else if (strcmp(a, "--reps") == 0)
            o.reps = int_arg(argv[0], a, val, 1, MAX_REPS);
        else if (strcmp(a, "--warmup") == 0)
            o.warmup = int_arg(argv[0], a, val, 0, MAX_REPS);
        else if (strcmp(a, "--threads") == 0)
            o.threads = int_arg(argv[0], a, val, 1, 4096);
        else
            return usage(argv[0]);
    }
    run(&o);
    return 0;
}
