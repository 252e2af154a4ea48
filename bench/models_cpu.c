/* CPU forward time and GFLOP/s of the CLIP text encoder and the VAE at tiny and SD2-base sizes, random weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_stats.h"
#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/clip.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/timer.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"

/*
 * Usage: models_cpu [--quick] [--reps N] [--res R] [--decoder]
 * Each line: module, size, shape, GFLOP of one forward (2 x multiply-adds of convolutions,
 * linear layers and attention matmuls; CLIP counts only the visible causal pairs), the median
 * time of N runs after one warm-up, GFLOP/s and the arena size. Lines starting "RESULT" are
 * for bench/models_vs_torch.py. --quick: tiny sizes only. --res: VAE image side for the
 * SD2-base size (default 256). --decoder adds the VAE decoder. OMP_NUM_THREADS sets threads.
 */

static const sd_backend *be;
static int reps = 3;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void result(const char *module, const char *size, const char *shape, double flops,
                   double *t, int n, size_t arena)
{
    double med;
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    med = bench_sorted_median(t, n);
    printf("%-13s %-9s %-22s %9.2f GFLOP %10.2f ms (min %.2f) %8.1f GFLOP/s  arena %.1f MiB\n",
           module, size, shape, flops * 1e-9, med * 1e3, t[0] * 1e3, flops * 1e-9 / med,
           arena / 1048576.0);
    printf("RESULT module=%s size=%s seconds=%.6f min_seconds=%.6f gflop=%.4f\n", module, size, med,
           t[0], flops * 1e-9);
    fflush(stdout);
}

static float *uniform(int64_t n)
{
    float *x = sd_xmalloc((size_t)n * sizeof *x);
    SD_CHECK(sd_rng_fill_uniform(1, SD_RNG_PURPOSE(SD_RNG_USER, 9), 0, 0, x, (size_t)n) == 0, "rng");
    for (int64_t i = 0; i < n; i++)
        x[i] = 2 * x[i] - 1;
    return x;
}

static void bench_clip(const char *size, const sd_clip_config *c, int batch, int t)
{
    sd_param_table tab;
    sd_weights w;
    sd_clip *m;
    sd_err err;
    sd_arena a;
    size_t bytes;
    int32_t *ids = sd_xmalloc((size_t)batch * t * sizeof *ids);
    float *out = sd_xmalloc((size_t)batch * t * c->hidden_size * sizeof *out);
    double times[32];
    char shape[64];
    sd_clip_params(c, &tab);
    sd_weights_init(&w, &tab);
    sd_weights_init_random(&w, 1);
    SD_CHECK(sd_clip_create_from_weights(&m, c, &w, be, &err) == 0, "%s", err.msg);
    for (int i = 0; i < batch * t; i++)
        ids[i] = (int32_t)sd_rng_below(2, SD_RNG_PURPOSE(SD_RNG_USER, 8), 0, 0, (uint32_t)i,
                                       (uint32_t)c->vocab_size);
    bytes = sd_clip_scratch_bytes(c, be, batch, t);
    SD_CHECK(sd_arena_init(&a, bytes, 0) == 0, "arena of %zu bytes", bytes);
    sd_clip_forward(m, batch, t, ids, out, &a, NULL);
    for (int r = 0; r < reps; r++) {
        double t0 = sd_time_now();
        sd_clip_forward(m, batch, t, ids, out, &a, NULL);
        times[r] = sd_time_now() - t0;
    }
    snprintf(shape, sizeof shape, "ids [%d, %d]", batch, t);
    result("text-encoder", size, shape, sd_clip_forward_flops(c, batch, t), times, reps, bytes);
    sd_arena_free(&a);
    sd_clip_free(m);
    sd_weights_free(&w);
    free(ids);
    free(out);
}

static void bench_vae(const char *size, const sd_vae_config *c, int batch, int res, int decoder)
{
    sd_param_table tab;
    sd_weights w;
    sd_vae *m;
    sd_err err;
    sd_arena a;
    size_t bytes;
    int lh, lw;
    float *img, *lat, *out;
    double times[32];
    char shape[64];
    sd_vae_params(c, &tab);
    sd_weights_init(&w, &tab);
    sd_weights_init_random(&w, 2);
    SD_CHECK(sd_vae_create_from_weights(&m, c, &w, be, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_vae_check_image_shape(c, batch, res, res, &lh, &lw, &err) == 0, "%s", err.msg);
    img = uniform((int64_t)batch * res * res * c->in_channels);
    lat = uniform((int64_t)batch * lh * lw * c->latent_channels);
    out = sd_xmalloc((size_t)batch * res * res * (c->out_channels > 2 * c->latent_channels
                                                       ? c->out_channels
                                                       : 2 * c->latent_channels) *
                     sizeof *out);
    bytes = sd_vae_encode_scratch_bytes(c, be, batch, res, res);
    SD_CHECK(sd_arena_init(&a, bytes, 0) == 0, "arena of %zu bytes", bytes);
    sd_vae_encode(m, batch, res, res, img, out, &a, NULL);
    for (int r = 0; r < reps; r++) {
        double t0 = sd_time_now();
        sd_vae_encode(m, batch, res, res, img, out, &a, NULL);
        times[r] = sd_time_now() - t0;
    }
    snprintf(shape, sizeof shape, "images [%d, %d, %d, %d]", batch, c->in_channels, res, res);
    result("vae-encode", size, shape, sd_vae_encode_flops(c, batch, res, res), times, reps, bytes);
    sd_arena_free(&a);
    if (decoder) {
        bytes = sd_vae_decode_scratch_bytes(c, be, batch, lh, lw);
        SD_CHECK(sd_arena_init(&a, bytes, 0) == 0, "arena of %zu bytes", bytes);
        sd_vae_decode(m, batch, lh, lw, lat, out, &a, NULL);
        for (int r = 0; r < reps; r++) {
            double t0 = sd_time_now();
            sd_vae_decode(m, batch, lh, lw, lat, out, &a, NULL);
            times[r] = sd_time_now() - t0;
        }
        snprintf(shape, sizeof shape, "latents [%d, %d, %d, %d]", batch, c->latent_channels, lh, lw);
        result("vae-decode", size, shape, sd_vae_decode_flops(c, batch, lh, lw), times, reps, bytes);
        sd_arena_free(&a);
    }
    sd_vae_free(m);
    sd_weights_free(&w);
    free(img);
    free(lat);
    free(out);
}

int main(int argc, char **argv)
{
    int quick = 0, decoder = 0, res = 256, threads = 1;
    sd_clip_config cc;
    sd_vae_config vc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--decoder"))
            decoder = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--res") && i + 1 < argc)
            res = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: models_cpu [--quick] [--reps N] [--res R] [--decoder]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 32 || res < 8) {
        fprintf(stderr, "models_cpu: --reps must be 1..32, --res >= 8\n");
        return 2;
    }
    be = sd_backend_cpu();
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    printf("# sdtrain CPU model forward benchmark: backend %s, %d OpenMP threads, fp32, random "
           "weights, median of %d\n", be->name, threads, reps);
    printf("THREADS %d\n", threads);

    /* tiny: the tiny-sd2 golden configuration (tests/reference/make_model_goldens.py) */
    sd_clip_config_sd2_base(&cc);
    cc.vocab_size = 1000;
    cc.hidden_size = 32;
    cc.intermediate_size = 64;
    cc.num_attention_heads = 4;
    cc.num_hidden_layers = 3;
    bench_clip("tiny", &cc, 1, 77);
    sd_vae_config_sd2_base(&vc);
    vc.n_levels = 2;
    vc.block_out_channels[0] = 16;
    vc.block_out_channels[1] = 32;
    vc.norm_num_groups = 8;
    bench_vae("tiny", &vc, 1, 64, decoder);
    if (quick)
        return 0;
    sd_clip_config_sd2_base(&cc);
    bench_clip("sd2-base", &cc, 1, 77);
    sd_vae_config_sd2_base(&vc);
    bench_vae("sd2-base", &vc, 1, res, decoder);
    return 0;
}
