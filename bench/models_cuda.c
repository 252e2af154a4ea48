/* Whole-model GPU benchmark on the CUDA backend: VAE encode images/s, U-Net forward and
 * forward+backward, text encoder, at SD2-base shapes with random weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/clip.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"

/*
 * Usage: models_cuda [--what vae-encode|unet-fwd|unet-train|text-encoder|all] [--batch B]
 *                    [--res PIXELS] [--precision bf16|fp32] [--reps N] [--warmup N]
 * Defaults: all, batch 32, 256 px (U-Net latents res/8), bf16, 10 timed runs after 3 warm-ups.
 *
 * Every run is timed from a synchronized device to a synchronized device (host clock), so the
 * numbers are end-to-end per call, launch gaps included. Weights are the training
 * initialization (sd_weights_init_random) converted to the compute type; inputs are random
 * normals. One line per model: median / min / max ms, images per second and achieved TFLOP/s
 * (the models' own FLOP counts: 2 x multiply-adds of convolutions, linear layers and attention
 * matmuls), then "RESULT what=... batch=... res=... ms=... img_s=..." lines that
 * bench/gpu_vs_torch.py reads. Exit 77 without a usable GPU.
 */

#define MAX_REPS 200

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Set-up: from the scratch query (where the convolutions' algorithms and graph plans are made)
 * to the end of the first run, in seconds. */
static double setup_t0, setup_s;

static void report(const char *what, const char *shape, int batch, int res, const char *prec,
                   double flops, double *t, int reps, size_t arena)
{
    double med, lo, hi;
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    med = t[reps / 2];
    lo = t[0];
    hi = t[reps - 1];
    printf("%-13s %-34s %-5s %9.2f %9.2f %9.2f %9.1f %8.1f %8.0f %8.2f\n", what, shape, prec,
           med * 1e3, lo * 1e3, hi * 1e3, batch / med, flops / med * 1e-12,
           (double)arena / (1 << 20), setup_s);
    printf("RESULT what=%s batch=%d res=%d precision=%s ms=%.4f img_s=%.2f tflops=%.2f "
           "setup_s=%.3f\n", what, batch, res, prec, med * 1e3, batch / med, flops / med * 1e-12,
           setup_s);
    fflush(stdout);
}

/* Random normals as a backend tensor. */
static void *rand_tensor(const sd_cmd_backend *cb, int64_t n, uint32_t purpose)
{
    float *h = sd_xmalloc((size_t)n * sizeof *h);
    void *d;
    SD_CHECK(sd_rng_fill_normal(7, SD_RNG_PURPOSE(SD_RNG_USER, purpose), 0, 0, h, (size_t)n) == 0,
             "random stream of %lld values", (long long)n);
    d = sd_cmd_put(cb, h, n);
    SD_CHECK(d != NULL, "cannot allocate %lld values on the GPU", (long long)n);
    free(h);
    return d;
}

static void *weights_on(const sd_cmd_backend *cb, const sd_param_table *tab, sd_weights *w,
                        uint64_t seed)
{
    void *p;
    sd_weights_init(w, (sd_param_table *)tab);
    sd_weights_init_random(w, seed);
    p = sd_cmd_put(cb, w->data, (int64_t)w->table.total_floats);
    SD_CHECK(p != NULL, "cannot allocate the weights on the GPU");
    return p;
}

static void arena_on(const sd_cmd_backend *cb, size_t bytes, sd_arena *a)
{
    SD_CHECK(sd_cmd_arena(cb, bytes, a) == 0, "cannot allocate a %zu MiB arena on the GPU",
             bytes >> 20);
}

static void bench_vae(const sd_cmd_backend *cb, int batch, int res, int reps, int warmup,
                      const char *prec)
{
    const sd_backend *be = cb->be;
    sd_vae_config c;
    sd_param_table tab;
    sd_weights w;
    sd_vae *m;
    sd_err err;
    sd_arena a;
    int lh, lw;
    double t[MAX_REPS];
    char shape[64];
    void *params, *img, *out;
    sd_vae_config_sd2_base(&c);
    sd_vae_params(&c, &tab);
    params = weights_on(cb, &tab, &w, 2);
    SD_CHECK(sd_vae_create(&m, &c, &w.table, params, be, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_vae_check_image_shape(&c, batch, res, res, &lh, &lw, &err) == 0, "%s", err.msg);
    img = rand_tensor(cb, (int64_t)batch * res * res * c.in_channels, 11);
    out = sd_cmd_alloc(cb, (size_t)batch * lh * lw * 2 * c.latent_channels * sd_dtype_size(be->dtype));
    SD_CHECK(out != NULL, "output allocation");
    setup_t0 = sd_time_now();
    arena_on(cb, sd_vae_encode_scratch_bytes(&c, be, batch, res, res), &a);
    for (int r = 0; r < warmup + reps; r++) {
        double t0;
        sd_synchronize(be);
        if (r == warmup)
            sd_profile_reset(be); /* SDTRAIN_CUDA_PROFILE=1: the timed runs only */
        t0 = sd_time_now();
        sd_vae_encode(m, batch, res, res, img, out, &a, NULL);
        sd_synchronize(be);
        if (r == 0)
            setup_s = sd_time_now() - setup_t0;
        if (r >= warmup)
            t[r - warmup] = sd_time_now() - t0;
    }
    snprintf(shape, sizeof shape, "images [%d, 3, %d, %d]", batch, res, res);
    report("vae-encode", shape, batch, res, prec, sd_vae_encode_flops(&c, batch, res, res), t,
           reps, sd_arena_capacity(&a));
    sd_cmd_arena_free(cb, &a);
    sd_cmd_release(cb, img, NULL);
    sd_cmd_release(cb, out, NULL);
    sd_vae_free(m);
    sd_cmd_release(cb, params, NULL);
    sd_weights_free(&w);
}

static void bench_unet(const sd_cmd_backend *cb, int batch, int res, int reps, int warmup,
                       const char *prec, int train)
{
    const sd_backend *be = cb->be;
    const int ctx_len = 77, L = res / 8;
    sd_unet_config c;
    sd_param_table tab;
    sd_weights w;
    sd_unet *u;
    sd_unet_trainer *tr = NULL;
    sd_err err;
    sd_arena a;
    double t[MAX_REPS], flops;
    char shape[96];
    float *steps = sd_xmalloc((size_t)batch * sizeof *steps);
    void *params, *x, *ctx, *out, *dout = NULL;
    float *grads = NULL;
    sd_unet_config_sd2_base(&c);
    sd_unet_params(&c, &tab);
    params = weights_on(cb, &tab, &w, 3);
    SD_CHECK(sd_unet_create(&u, &c, &w.table, params, be, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_unet_check_shape(&c, batch, L, L, ctx_len, &err) == 0, "%s", err.msg);
    for (int b = 0; b < batch; b++)
        steps[b] = (float)((b * 997) % 1000);
    x = rand_tensor(cb, (int64_t)batch * L * L * c.in_channels, 12);
    ctx = rand_tensor(cb, (int64_t)batch * ctx_len * c.cross_attention_dim, 13);
    out = sd_cmd_alloc(cb, (size_t)batch * L * L * c.out_channels * sd_dtype_size(be->dtype));
    SD_CHECK(out != NULL, "output allocation");
    if (train) {
        grads = sd_cmd_alloc(cb, w.table.total_floats * sizeof(float));
        SD_CHECK(grads != NULL, "gradient allocation");
        dout = rand_tensor(cb, (int64_t)batch * L * L * c.out_channels, 14);
        setup_t0 = sd_time_now(); /* the trainer's scratch queries make the conv entries */
        SD_CHECK(sd_unet_trainer_create(&tr, u, &w.table, grads, batch, L, L, ctx_len, 0, &err) ==
                     0, "%s", err.msg);
        arena_on(cb, sd_unet_trainer_arena_bytes(tr), &a);
        flops = sd_unet_trainer_flops(tr);
    } else {
        setup_t0 = sd_time_now();
        arena_on(cb, sd_unet_scratch_bytes(&c, be, batch, L, L, ctx_len), &a);
        flops = sd_unet_forward_flops(&c, batch, L, L, ctx_len);
    }
    for (int r = 0; r < warmup + reps; r++) {
        double t0;
        sd_synchronize(be);
        if (r == warmup)
            sd_profile_reset(be); /* SDTRAIN_CUDA_PROFILE=1: the timed runs only */
        t0 = sd_time_now();
        if (train) {
            sd_zero(be, grads, w.table.total_floats * sizeof(float));
            sd_unet_train_forward(tr, x, steps, ctx, out, &a);
            sd_unet_backward(tr, dout, &a);
        } else {
            sd_unet_forward(u, batch, L, L, x, steps, ctx, ctx_len, out, &a, NULL);
        }
        sd_synchronize(be);
        if (r == 0)
            setup_s = sd_time_now() - setup_t0;
        if (r >= warmup)
            t[r - warmup] = sd_time_now() - t0;
    }
    snprintf(shape, sizeof shape, "latents [%d, 4, %d, %d], ctx 77", batch, L, L);
    report(train ? "unet-train" : "unet-fwd", shape, batch, res, prec, flops, t, reps,
           sd_arena_capacity(&a));
    sd_cmd_arena_free(cb, &a);
    sd_unet_trainer_free(tr);
    sd_cmd_release(cb, grads, NULL);
    sd_cmd_release(cb, dout, NULL);
    sd_cmd_release(cb, x, NULL);
    sd_cmd_release(cb, ctx, NULL);
    sd_cmd_release(cb, out, NULL);
    sd_unet_free(u);
    sd_cmd_release(cb, params, NULL);
    sd_weights_free(&w);
    free(steps);
}

static void bench_text(const sd_cmd_backend *cb, int batch, int reps, int warmup, const char *prec)
{
    const sd_backend *be = cb->be;
    const int T = 77;
    sd_clip_config c;
    sd_param_table tab;
    sd_weights w;
    sd_clip *m;
    sd_err err;
    sd_arena a;
    double t[MAX_REPS];
    char shape[64];
    int32_t *ids = sd_xmalloc((size_t)batch * T * sizeof *ids);
    void *params, *ids_d, *out;
    sd_clip_config_sd2_base(&c);
    sd_clip_params(&c, &tab);
    params = weights_on(cb, &tab, &w, 4);
    SD_CHECK(sd_clip_create(&m, &c, &w.table, params, be, &err) == 0, "%s", err.msg);
    for (int i = 0; i < batch * T; i++)
        ids[i] = (int32_t)sd_rng_below(2, SD_RNG_PURPOSE(SD_RNG_USER, 8), 0, 0, (uint32_t)i,
                                       (uint32_t)c.vocab_size);
    ids_d = sd_cmd_alloc(cb, (size_t)batch * T * sizeof *ids);
    out = sd_cmd_alloc(cb, (size_t)batch * T * c.hidden_size * sd_dtype_size(be->dtype));
    SD_CHECK(ids_d && out, "input/output allocation");
    sd_upload(be, ids_d, ids, (size_t)batch * T * sizeof *ids);
    setup_t0 = sd_time_now();
    arena_on(cb, sd_clip_scratch_bytes(&c, be, batch, T), &a);
    for (int r = 0; r < warmup + reps; r++) {
        double t0;
        sd_synchronize(be);
        if (r == warmup)
            sd_profile_reset(be); /* SDTRAIN_CUDA_PROFILE=1: the timed runs only */
        t0 = sd_time_now();
        sd_clip_forward(m, batch, T, (const int32_t *)ids_d, out, &a, NULL);
        sd_synchronize(be);
        if (r == 0)
            setup_s = sd_time_now() - setup_t0;
        if (r >= warmup)
            t[r - warmup] = sd_time_now() - t0;
    }
    snprintf(shape, sizeof shape, "ids [%d, %d]", batch, T);
    report("text-encoder", shape, batch, 0, prec, sd_clip_forward_flops(&c, batch, T), t, reps,
           sd_arena_capacity(&a));
    sd_cmd_arena_free(cb, &a);
    sd_cmd_release(cb, ids_d, NULL);
    sd_cmd_release(cb, out, NULL);
    sd_clip_free(m);
    sd_cmd_release(cb, params, NULL);
    sd_weights_free(&w);
    free(ids);
}

int main(int argc, char **argv)
{
    const char *what = "all", *prec = "bf16";
    int batch = 32, res = 256, reps = 10, warmup = 3;
    sd_cmd_backend cb;
    sd_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            goto usage;
        if (!strcmp(a, "--what"))
            what = v;
        else if (!strcmp(a, "--precision"))
            prec = v;
        else if (!strcmp(a, "--batch"))
            batch = atoi(v);
        else if (!strcmp(a, "--res"))
            res = atoi(v);
        else if (!strcmp(a, "--reps"))
            reps = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else
            goto usage;
        i++;
    }
    if (batch < 1 || res < 8 || res % 8 || reps < 1 || reps > MAX_REPS || warmup < 0)
        goto usage;
    if (sd_cmd_backend_open("cuda", 0, prec, &cb, &err)) {
        printf("no usable GPU: %s\n", err.msg);
        return 77;
    }
    printf("# sdtrain CUDA model benchmark: SD2-base shapes, random weights, %s, batch %d, median "
           "of %d after %d warm-ups\n", prec, batch, reps, warmup);
    printf("%-13s %-34s %-5s %9s %9s %9s %9s %8s %8s %8s\n", "model", "input", "prec", "ms", "min",
           "max", "img/s", "TFLOP/s", "arenaMiB", "set-up s");
    if (!strcmp(what, "vae-encode") || !strcmp(what, "all"))
        bench_vae(&cb, batch, res, reps, warmup, prec);
    if (!strcmp(what, "unet-fwd") || !strcmp(what, "all"))
        bench_unet(&cb, batch, res, reps, warmup, prec, 0);
    if (!strcmp(what, "unet-train") || !strcmp(what, "all"))
        bench_unet(&cb, batch, res, reps, warmup, prec, 1);
    if (!strcmp(what, "text-encoder") || !strcmp(what, "all"))
        bench_text(&cb, batch, reps, warmup, prec);
    sd_cmd_backend_close(&cb);
    return 0;
usage:
    fprintf(stderr, "usage: models_cuda [--what vae-encode|unet-fwd|unet-train|text-encoder|all] "
                    "[--batch B] [--res PIXELS (multiple of 8)] [--precision bf16|fp32] "
                    "[--reps N <= %d] [--warmup N]\n", MAX_REPS);
    return 2;
}
