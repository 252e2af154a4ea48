/* Runs the U-Net of a diffusers snapshot on inputs read from a safetensors file and writes the output (a driver for parity checks at full size). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"

/*
 * Usage: unet_file SNAPSHOT INPUTS.safetensors OUTPUT.safetensors [--reps N]
 * SNAPSHOT is a diffusers snapshot folder or its unet/ folder (sd_snapshot_open).
 * INPUTS holds `sample` [B, C, h, w], `timestep` [B] (I64 or F32) and `encoder_hidden_states`
 * [B, L, X], all in PyTorch layouts (NCHW). OUTPUT receives `out.sample` [B, C_out, h, w] F32.
 * Prints the load time and the median forward time of N runs (default 1). Until `sdtool forward
 * --module unet` exists, tests/reference/verify_unet_full_size.py drives the U-Net through this.
 */

static float *read_tensor(const sd_st_file *f, const char *name, const sd_st_tensor **tp)
{
    sd_err err;
    const sd_st_tensor *t = sd_st_find(f, name);
    float *x;
    if (!t) {
        fprintf(stderr, "unet_file: %s has no tensor '%s'\n", f->path, name);
        exit(1);
    }
    x = sd_xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof(float));
    if (t->dtype == SD_ST_I64) {
        for (int64_t i = 0; i < t->numel; i++) {
            int64_t v;
            memcpy(&v, (const char *)t->data + 8 * i, 8);
            x[i] = (float)v;
        }
    } else if (sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err)) {
        fprintf(stderr, "unet_file: %s\n", err.msg);
        exit(1);
    }
    *tp = t;
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const sd_backend *be = sd_backend_cpu();
    sd_snapshot snap;
    sd_unet_config c;
    sd_weights w;
    sd_st_file in;
    sd_unet *u;
    sd_err err;
    sd_arena arena;
    const sd_st_tensor *ts, *tt, *tc;
    float *sample_nchw, *sample, *timesteps, *ctx, *out, *out_nchw;
    double t0, times[32];
    int reps = 1, batch, cin, h, wd, ctx_len, threads = 1;

    if (argc == 6 && strcmp(argv[4], "--reps") == 0)
        reps = atoi(argv[5]);
    else if (argc != 4) {
        fprintf(stderr, "usage: %s SNAPSHOT INPUTS.safetensors OUTPUT.safetensors [--reps N]\n",
                argv[0]);
        return 2;
    }
    if (reps < 1 || reps > 32)
        reps = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif

    t0 = sd_time_now();
    if (sd_snapshot_open(&snap, argv[1], &err) || sd_snapshot_load_unet(&snap, NULL, &c, &w, &err) ||
        sd_unet_create_from_weights(&u, &c, &w, be, &err)) {
        fprintf(stderr, "unet_file: %s\n", err.msg);
        return 1;
    }
    sd_snapshot_close(&snap);
    printf("loaded %s: %zu parameters in %.1f s\n", argv[1], w.table.total_numel,
           sd_time_now() - t0);

    if (sd_st_open(argv[2], &in, &err)) {
        fprintf(stderr, "unet_file: %s\n", err.msg);
        return 1;
    }
    sample_nchw = read_tensor(&in, "sample", &ts);
    timesteps = read_tensor(&in, "timestep", &tt);
    ctx = read_tensor(&in, "encoder_hidden_states", &tc);
    if (ts->ndim != 4 || tc->ndim != 3 || tt->ndim != 1 || tt->shape[0] != ts->shape[0] ||
        tc->shape[0] != ts->shape[0] || ts->shape[1] != c.in_channels ||
        tc->shape[2] != c.cross_attention_dim) {
        fprintf(stderr, "unet_file: %s: inputs do not fit the U-Net (in_channels %d, "
                        "cross_attention_dim %d)\n", argv[2], c.in_channels, c.cross_attention_dim);
        return 1;
    }
    batch = (int)ts->shape[0];
    cin = (int)ts->shape[1];
    h = (int)ts->shape[2];
    wd = (int)ts->shape[3];
    ctx_len = (int)tc->shape[1];
    if (sd_unet_check_shape(&c, batch, h, wd, ctx_len, &err)) {
        fprintf(stderr, "unet_file: %s\n", err.msg);
        return 1;
    }
    sample = sd_xmalloc((size_t)batch * cin * h * wd * sizeof(float));
    sd_nchw_to_nhwc(be, batch, cin, h, wd, sample_nchw, sample);
    out = sd_xmalloc((size_t)batch * c.out_channels * h * wd * sizeof(float));
    out_nchw = sd_xmalloc((size_t)batch * c.out_channels * h * wd * sizeof(float));

    SD_CHECK(sd_arena_init(&arena, sd_unet_scratch_bytes(&c, be, batch, h, wd, ctx_len), 0) == 0,
             "activation arena");
    for (int r = 0; r < reps; r++) {
        t0 = sd_time_now();
        sd_unet_forward(u, batch, h, wd, sample, timesteps, ctx, ctx_len, out, &arena, NULL);
        times[r] = sd_time_now() - t0;
    }
    qsort(times, (size_t)reps, sizeof times[0], cmp_double);
    printf("forward batch %d latent %dx%d ctx %d threads %d: %.2f ms (median of %d)\n", batch, h,
           wd, ctx_len, threads, times[reps / 2] * 1e3, reps);
    printf("RESULT ms=%.3f\n", times[reps / 2] * 1e3);

    sd_nhwc_to_nchw(be, batch, c.out_channels, h, wd, out, out_nchw);
    {
        sd_st_writer *wr = sd_st_writer_new();
        int64_t shape[4] = {batch, c.out_channels, h, wd};
        if (sd_st_writer_add(wr, "out.sample", SD_ST_F32, 4, shape, out_nchw,
                             (size_t)batch * c.out_channels * h * wd * sizeof(float), &err) ||
            sd_st_writer_write(wr, argv[3], &err)) {
            fprintf(stderr, "unet_file: %s\n", err.msg);
            return 1;
        }
        sd_st_writer_free(wr);
    }
    sd_arena_free(&arena);
    sd_st_close(&in);
    free(sample_nchw);
    free(sample);
    free(timesteps);
    free(ctx);
    free(out);
    free(out_nchw);
    sd_unet_free(u);
    sd_weights_free(&w);
    return 0;
}
