/* U-Net forward benchmark on the CPU backend: time, FLOPs per forward and GFLOP/s at the tiny and SD2-base sizes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_stats.h"
#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"

#include "unet_configs.h"

/*
 * Usage: unet_cpu [--model tiny|sd2|all] [--latent S] [--batch B] [--reps N] [--ctx L]
 *                 [--no-batch-invariance]
 * Defaults: all models, 32x32 latents, batch 1, 3 timed runs after one warm-up, 77 context
 * tokens. Weights are random (sd_weights_init_random: the training initialization), so the
 * benchmark needs no snapshot. FLOPs are counted by the
 * forward's own dry run (sd_unet_forward_flops): 2 x multiply-adds of convolutions, linear
 * layers and the two attention matmuls. Each model prints one line for people and one
 * "RESULT key=value ..." line for bench/unet_vs_torch.py.
 */

static void fill_uniform(float *x, size_t n, uint64_t stream, float lo, float hi)
{
    SD_CHECK(sd_rng_fill_uniform(20261122, SD_RNG_PURPOSE(SD_RNG_USER, 11), 0, stream, x, n) == 0,
             "rng fill");
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * x[i];
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void bench(const char *label, const sd_unet_config *c, int batch, int latent, int ctx_len,
                  int reps, int batch_invariant)
{
    const sd_backend *be = sd_backend_cpu();
    sd_param_table t;
    sd_weights w;
    sd_unet *u;
    sd_err err;
    sd_arena a;
    float *sample, *ctx, *out, ts[64];
    double times[32], flops, t0, med;
    size_t scratch;
    int threads = 1;

#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    SD_CHECK(batch >= 1 && batch <= 64, "batch %d out of 1..64", batch);
    SD_CHECK(sd_unet_check_shape(c, batch, latent, latent, ctx_len, &err) == 0, "%s", err.msg);
    sd_unet_params(c, &t);
    t0 = sd_time_now();
    sd_weights_init(&w, &t);
    sd_weights_init_random(&w, 20261122);
    SD_CHECK(sd_unet_create_from_weights(&u, c, &w, be, &err) == 0, "%s", err.msg);
    sd_unet_set_batch_invariant(u, batch_invariant);
    sample = sd_xmalloc((size_t)batch * latent * latent * c->in_channels * sizeof(float));
    ctx = sd_xmalloc((size_t)batch * ctx_len * c->cross_attention_dim * sizeof(float));
    out = sd_xmalloc((size_t)batch * latent * latent * c->out_channels * sizeof(float));
    fill_uniform(sample, (size_t)batch * latent * latent * c->in_channels, 1u << 20, -1.f, 1.f);
    fill_uniform(ctx, (size_t)batch * ctx_len * c->cross_attention_dim, 1u << 21, -1.f, 1.f);
    for (int b = 0; b < batch; b++)
        ts[b] = (float)((999 - 37 * b) % 1000);
    scratch = sd_unet_scratch_bytes(c, be, batch, latent, latent, ctx_len);
    flops = sd_unet_forward_flops(c, batch, latent, latent, ctx_len);
    SD_CHECK(sd_arena_init(&a, scratch, 0) == 0, "arena of %zu bytes", scratch);
    fprintf(stderr, "%s: %zu parameters, weights ready in %.1f s\n", label, w.table.total_numel,
            sd_time_now() - t0);

    sd_unet_forward(u, batch, latent, latent, sample, ts, ctx, ctx_len, out, &a, NULL);
    if (reps > 32)
        reps = 32;
    for (int r = 0; r < reps; r++) {
        t0 = sd_time_now();
        sd_unet_forward(u, batch, latent, latent, sample, ts, ctx, ctx_len, out, &a, NULL);
        times[r] = sd_time_now() - t0;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    med = bench_sorted_median(times, reps);
    for (size_t i = 0; i < (size_t)batch * latent * latent * c->out_channels; i++)
        SD_CHECK(isfinite(out[i]), "non-finite output %g at %zu", out[i], i);
    printf("unet %-5s batch %d latent %dx%d ctx %d threads %d: %10.2f ms (min %.2f, max %.2f)  "
           "%8.3f GFLOP/forward  %6.1f GFLOP/s  arena %.1f MiB%s\n",
           label, batch, latent, latent, ctx_len, threads, med * 1e3, times[0] * 1e3,
           times[reps - 1] * 1e3, flops / 1e9, flops / med / 1e9, scratch / 1048576.0,
           batch > 1 && !batch_invariant ? "  (batch invariance off)" : "");
    printf("RESULT model=%s batch=%d latent=%d ctx=%d threads=%d ms=%.3f gflop=%.4f gflops=%.2f\n",
           label, batch, latent, ctx_len, threads, med * 1e3, flops / 1e9, flops / med / 1e9);
    fflush(stdout);
    sd_arena_free(&a);
    free(sample);
    free(ctx);
    free(out);
    sd_unet_free(u);
    sd_weights_free(&w);
}

int main(int argc, char **argv)
{
    const char *model = "all";
    int latent = 32, batch = 1, reps = 3, ctx_len = 77, invariant = 1;
    sd_unet_config c;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            model = argv[++i];
        else if (strcmp(argv[i], "--latent") == 0 && i + 1 < argc)
            latent = atoi(argv[++i]);
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc)
            ctx_len = atoi(argv[++i]);
        else if (strcmp(argv[i], "--no-batch-invariance") == 0)
            invariant = 0;
        else {
            fprintf(stderr, "usage: %s [--model tiny|sd2|all] [--latent S] [--batch B] "
                            "[--reps N] [--ctx L] [--no-batch-invariance]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1)
        reps = 1;
    if (strcmp(model, "tiny") != 0 && strcmp(model, "sd2") != 0 && strcmp(model, "all") != 0) {
        fprintf(stderr, "%s: --model %s: expected tiny, sd2 or all\n", argv[0], model);
        return 2;
    }
    if (strcmp(model, "tiny") == 0 || strcmp(model, "all") == 0) {
        bench_tiny_unet_config(&c);
        bench("tiny", &c, batch, latent, ctx_len, reps, invariant);
    }
    if (strcmp(model, "sd2") == 0 || strcmp(model, "all") == 0) {
        sd_unet_config_sd2_base(&c);
        bench("sd2", &c, batch, latent, ctx_len, reps, invariant);
    }
    return 0;
}
