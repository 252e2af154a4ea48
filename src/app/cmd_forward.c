/* sdtool forward: run one model module of a diffusers snapshot on named input tensors and write its outputs, both in diffusers' layout. */
#include "sdtrain/commands.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/clip.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"

static void forward_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool forward --snapshot DIR --module MODULE --in IN.safetensors\n"
            "                      --out OUT.safetensors [--threads N] [--repeat N] [--weights FILE]\n"
            "                      [--device cpu|cuda] [--precision fp32|bf16]\n"
            "\n"
            "Runs one module of a diffusers snapshot (fp32 on the CPU by default) on the named tensors of IN and writes\n"
            "its outputs to OUT under the names diffusers uses. Tensors are in PyTorch's layout (NCHW,\n"
            "[batch, tokens, width]); inputs may be F32, F16, BF16 or F64, token ids I32 or I64;\n"
            "outputs are F32.\n"
            "\n"
            "  MODULE        inputs                                   outputs\n"
            "  unet          sample [B,C,h,w], timestep [B] or [],      sample [B,C',h,w]\n"
            "                encoder_hidden_states [B,T,D]\n"
            "  vae-encode    images [B,3,H,W] (in [-1, 1])            latent_dist.parameters [B,2L,h,w],\n"
            "                                                         latent_dist.mean, latent_dist.logvar\n"
            "                                                         [B,L,h,w] (logvar clamped to\n"
            "                                                         [-30, 20])\n"
            "  vae-decode    latents [B,L,h,w] (already divided by    sample [B,3,H,W]\n"
            "                the scaling factor)\n"
            "  text-encoder  input_ids [B,T]                          last_hidden_state [B,T,D],\n"
            "                                                         pooler_output [B,D]\n"
            "\n"
            "  --snapshot DIR  a diffusers snapshot folder, or the module's component folder\n"
            "  --threads N     OpenMP threads (the result does not depend on N)\n"
            "  --repeat N      run the forward N times and report the fastest (timing; default 1)\n"
            "  --weights FILE  weight file name inside the component folder (default:\n"
            "                  diffusion_pytorch_model / model .safetensors[.index.json])\n"
            "  --device D      cpu (default) or cuda (the CUDA backend on the first visible GPU)\n"
            "  --precision P   fp32 (default; no TF32 on the GPU) or bf16 (GPU only: bf16 weights\n"
            "                  and activations, fp32 accumulation)\n"
            "\n"
            "A line on standard output gives the shapes, the load and forward times and GFLOP/s.\n"
            "exit status: 0 done, 1 the snapshot cannot be loaded or OUT cannot be written,\n"
            "2 bad usage or input (missing tensor, wrong shape or dtype).\n");
}

typedef enum { MOD_UNET, MOD_VAE_ENCODE, MOD_VAE_DECODE, MOD_TEXT } module_kind;

typedef struct fwd_opts {
    const char *snapshot, *module, *in, *out, *weights, *device, *precision;
    sd_cmd_backend cb;
    int threads;
    int repeat; /* forward runs; the fastest is reported (timing) */
    module_kind kind;
} fwd_opts;

static int fail_input(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

static int fail_input(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "sdtool forward: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return SD_EXIT_USAGE;
}

static int fail_run(const char *msg)
{
    fprintf(stderr, "sdtool forward: %s\n", msg);
    return SD_EXIT_FAILURE;
}

/* The input tensor `name` with `ndim` dimensions, or NULL after a message. */
static const sd_st_tensor *input(const sd_st_file *f, const fwd_opts *o, const char *name,
                                 int ndim, const char *layout)
{
    const sd_st_tensor *t = sd_st_find(f, name);
    const char *path = o->in;
    char s[128];
    if (!t) {
        fail_input("%s: no input tensor '%s' (module %s wants %s)", path, name, o->module, layout);
        return NULL;
    }
    if (t->ndim != ndim) {
        fail_input("%s: '%s' has shape %s; expected %s", path, name,
                   sd_shape_str(t->ndim, t->shape, s, sizeof s), layout);
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] < 1 || t->shape[i] > (int64_t)1 << 30) {
            fail_input("%s: '%s' has shape %s; every dimension must be in [1, 2^30]", path, name,
                       sd_shape_str(t->ndim, t->shape, s, sizeof s));
            return NULL;
        }
    return t;
}

/* A float input as fp32 (malloc'ed), or NULL after a message. */
static float *read_float(const sd_st_tensor *t, const char *path)
{
    sd_err err;
    float *x;
    if (t->dtype != SD_ST_F32 && t->dtype != SD_ST_F16 && t->dtype != SD_ST_BF16 &&
        t->dtype != SD_ST_F64) {
        fail_input("%s: '%s' is %s; expected a float tensor (F32, F16, BF16 or F64)", path,
                   t->name, sd_st_dtype_name(t->dtype));
        return NULL;
    }
    x = sd_xmalloc((size_t)t->numel * sizeof *x);
    if (sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err)) {
        free(x);
        fail_input("%s", err.msg);
        return NULL;
    }
    return x;
}

/* [n, c, h, w] host fp32 -> [n, h, w, c] (malloc'ed). */
static float *to_nhwc(const float *x, int n, int c, int h, int w)
{
    float *y = sd_xmalloc((size_t)n * c * h * w * sizeof *y);
    sd_nchw_to_nhwc(sd_backend_cpu(), n, c, h, w, x, y);
    return y;
}

static float *to_nchw(const float *x, int n, int c, int h, int w)
{
    float *y = sd_xmalloc((size_t)n * c * h * w * sizeof *y);
    sd_nhwc_to_nchw(sd_backend_cpu(), n, c, h, w, x, y);
    return y;
}

/* Collects outputs; the data must stay alive until write_outputs. */
typedef struct outputs {
    sd_st_writer *w;
    float *keep[8];
    int n_keep;
} outputs;

static int add_output(outputs *o, const char *name, int ndim, const int64_t *shape, float *data,
                      sd_err *err)
{
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    SD_CHECK(o->n_keep < 8, "too many outputs");
    o->keep[o->n_keep++] = data;
    return sd_st_writer_add(o->w, name, SD_ST_F32, ndim, shape, data, n * sizeof(float), err);
}

/* Frees the writer and the kept output buffers (after a write, or when none happens). */
static void outputs_free(outputs *o)
{
    if (!o->w)
        return;
    sd_st_writer_free(o->w);
    for (int i = 0; i < o->n_keep; i++)
        free(o->keep[i]);
    o->w = NULL;
    o->n_keep = 0;
}

static int write_outputs(outputs *o, const char *path, const char *module)
{
    sd_err err;
    int rc = 0;
    sd_st_writer_set_metadata(o->w, "format", "pt", &err);
    sd_st_writer_set_metadata(o->w, "sdtrain_module", module, &err);
    if (sd_st_writer_write(o->w, path, &err)) {
        fprintf(stderr, "sdtool forward: %s\n", err.msg);
        rc = SD_EXIT_FAILURE;
    }
    outputs_free(o);
    return rc;
}

static void report(const fwd_opts *o, const char *in_desc, const char *out_desc, double t_load,
                   double t_fwd, double flops)
{
    printf("forward: %s %s -> %s: load %.3f s, forward %.3f s%s, %.2f GFLOP, %.1f GFLOP/s, ",
           o->module, in_desc, out_desc, t_load, t_fwd,
           o->repeat > 1 ? " (fastest of the runs)" : "", flops * 1e-9,
           t_fwd > 0 ? flops * 1e-9 / t_fwd : 0.0);
    if (o->cb.host)
        printf("%d thread%s\n", o->threads, o->threads == 1 ? "" : "s");
    else
        printf("%s %s\n", o->cb.be->name, o->cb.be->dtype == SD_BF16 ? "bf16" : "fp32");
}

static int arena_for(const fwd_opts *o, sd_arena *a, size_t bytes)
{
    if (sd_cmd_arena(&o->cb, bytes, a) == 0)
        return 0;
    fprintf(stderr, "sdtool forward: cannot allocate %zu bytes of activation memory on the %s "
            "backend\n", bytes, o->cb.be->name);
    return -1;
}

/* The flat parameters in the backend's memory: the host fp32 buffer itself on the CPU, a
 * converted device copy otherwise (released with sd_cmd_release(&o->cb, p, w->data)). */
static void *params_for(const fwd_opts *o, const sd_weights *w)
{
    void *p = sd_cmd_put(&o->cb, w->data, (int64_t)w->table.total_floats);
    if (!p)
        fprintf(stderr, "sdtool forward: cannot allocate %zu bytes for the weights on the %s "
                "backend\n", w->table.total_floats * sd_dtype_size(o->cb.be->dtype),
                o->cb.be->name);
    return p;
}

/* Host NHWC fp32 -> a backend tensor, or NULL after a message. */
static void *input_for(const fwd_opts *o, const float *x, int64_t n)
{
    void *d = sd_cmd_put(&o->cb, x, n);
    if (!d)
        fprintf(stderr, "sdtool forward: cannot allocate %lld input values on the %s backend\n",
                (long long)n, o->cb.be->name);
    return d;
}

/* ---- the modules ------------------------------------------------------------------------- */

static int run_text(const fwd_opts *o, const sd_snapshot *s, const sd_st_file *in)
{
    const sd_backend *be = o->cb.be;
    const sd_st_tensor *t = input(in, o, "input_ids", 2, "[batch, tokens] I32 or I64");
    sd_clip_config c;
    sd_weights w;
    sd_clip *m;
    sd_err err;
    sd_arena a;
    outputs out = {sd_st_writer_new(), {0}, 0};
    int eos, B, T, rc = 0;
    int32_t *ids;
    float *hidden, *pooled;
    void *params = NULL;
    double t0, t_load, t_fwd = 0;
    char s_in[96], s_out[96];

    if (!t) {
        sd_st_writer_free(out.w);
        return SD_EXIT_USAGE;
    }
    if (t->dtype != SD_ST_I32 && t->dtype != SD_ST_I64) {
        sd_st_writer_free(out.w);
        return fail_input("%s: 'input_ids' is %s; expected I32 or I64", o->in,
                          sd_st_dtype_name(t->dtype));
    }
    B = (int)t->shape[0];
    T = (int)t->shape[1];
    t0 = sd_time_now();
    if (sd_snapshot_load_text_encoder(s, o->weights, &c, &eos, &w, &err)) {
        sd_st_writer_free(out.w);
        return fail_run(err.msg);
    }
    if (!(params = params_for(o, &w))) {
        sd_weights_free(&w);
        sd_st_writer_free(out.w);
        return SD_EXIT_FAILURE;
    }
    if (sd_clip_create(&m, &c, &w.table, params, be, &err)) {
        sd_cmd_release(&o->cb, params, w.data);
        sd_weights_free(&w);
        sd_st_writer_free(out.w);
        return fail_run(err.msg);
    }
    t_load = sd_time_now() - t0;
    if (sd_clip_check_shape(&c, B, T, &err)) {
        rc = fail_input("%s: 'input_ids' %s: %s", o->in,
                        sd_shape_str(t->ndim, t->shape, s_in, sizeof s_in), err.msg);
        goto done;
    }
    ids = sd_xmalloc((size_t)B * T * sizeof *ids);
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        int64_t v;
        if (t->dtype == SD_ST_I32) {
            int32_t v32;
            memcpy(&v32, (const char *)t->data + 4 * i, 4);
            v = v32;
        } else {
            memcpy(&v, (const char *)t->data + 8 * i, 8);
        }
        if (v < 0 || v >= c.vocab_size) {
            free(ids);
            rc = fail_input("%s: input_ids[%" PRId64 "][%" PRId64 "] = %" PRId64
                            " is outside the vocabulary [0, %d)", o->in, i / T, i % T, v,
                            c.vocab_size);
            goto done;
        }
        ids[i] = (int32_t)v;
    }
    {
        const int64_t nh = (int64_t)B * T * c.hidden_size, np = (int64_t)B * c.hidden_size;
        const size_t es = sd_dtype_size(be->dtype);
        void *ids_be = sd_cmd_alloc(&o->cb, (size_t)B * T * sizeof *ids);
        void *hid_be = sd_cmd_alloc(&o->cb, (size_t)nh * es);
        void *pool_be = sd_cmd_alloc(&o->cb, (size_t)np * es);
        if (!ids_be || !hid_be || !pool_be || arena_for(o, &a, sd_clip_scratch_bytes(&c, be, B, T))) {
            if (!ids_be || !hid_be || !pool_be)
                fprintf(stderr, "sdtool forward: cannot allocate the ids and outputs on the %s "
                        "backend\n", be->name);
            sd_cmd_release(&o->cb, ids_be, NULL);
            sd_cmd_release(&o->cb, hid_be, NULL);
            sd_cmd_release(&o->cb, pool_be, NULL);
            free(ids);
            rc = SD_EXIT_FAILURE;
            goto done;
        }
        sd_upload(be, ids_be, ids, (size_t)B * T * sizeof *ids);
        for (int r = 0; r < o->repeat; r++) {
            double dt;
            t0 = sd_time_now();
            sd_clip_forward(m, B, T, (const int32_t *)ids_be, hid_be, &a, NULL);
            sd_clip_pool(m, B, T, ids, eos, hid_be, pool_be);
            sd_synchronize(be);
            dt = sd_time_now() - t0;
            t_fwd = r == 0 || dt < t_fwd ? dt : t_fwd;
        }
        sd_cmd_arena_free(&o->cb, &a);
        hidden = sd_cmd_get(&o->cb, hid_be, nh);
        pooled = sd_cmd_get(&o->cb, pool_be, np);
        sd_cmd_release(&o->cb, ids_be, NULL);
        sd_cmd_release(&o->cb, hid_be, NULL);
        sd_cmd_release(&o->cb, pool_be, NULL);
        free(ids);
    }
    if (add_output(&out, "last_hidden_state", 3, (int64_t[]){B, T, c.hidden_size}, hidden, &err) ||
        add_output(&out, "pooler_output", 2, (int64_t[]){B, c.hidden_size}, pooled, &err)) {
        rc = fail_run(err.msg);
        goto done;
    }
    snprintf(s_out, sizeof s_out, "last_hidden_state [%d, %d, %d]", B, T, c.hidden_size);
    snprintf(s_in, sizeof s_in, "input_ids [%d, %d]", B, T);
    report(o, s_in, s_out, t_load, t_fwd, sd_clip_forward_flops(&c, B, T));
    rc = write_outputs(&out, o->out, o->module);
done:
    outputs_free(&out);
    sd_clip_free(m);
    sd_cmd_release(&o->cb, params, w.data);
    sd_weights_free(&w);
    return rc;
}

static int run_vae(const fwd_opts *o, const sd_snapshot *s, const sd_st_file *in, int decode)
{
    const sd_backend *be = o->cb.be;
    const char *name = decode ? "latents" : "images";
    const sd_st_tensor *t = input(in, o, name, 4, decode ? "[batch, latent_channels, h, w]"
                                                             : "[batch, in_channels, H, W]");
    sd_vae_config c;
    sd_weights w;
    sd_vae *m;
    sd_err err;
    sd_arena a;
    outputs out = {sd_st_writer_new(), {0}, 0};
    int B, C, H, W, oh, ow, rc = 0, want_c;
    float *x, *xh, *y;
    void *params = NULL, *x_be, *y_be;
    int64_t ny;
    double t0, t_load, t_fwd = 0, flops;
    char s_in[96], s_out[128];

    if (!t) {
        sd_st_writer_free(out.w);
        return SD_EXIT_USAGE;
    }
    B = (int)t->shape[0];
    C = (int)t->shape[1];
    H = (int)t->shape[2];
    W = (int)t->shape[3];
    x = read_float(t, o->in);
    if (!x) {
        sd_st_writer_free(out.w);
        return SD_EXIT_USAGE;
    }
    t0 = sd_time_now();
    if (sd_snapshot_load_vae(s, o->weights, &c, &w, &err)) {
        free(x);
        sd_st_writer_free(out.w);
        return fail_run(err.msg);
    }
    if (!(params = params_for(o, &w))) {
        free(x);
        sd_weights_free(&w);
        sd_st_writer_free(out.w);
        return SD_EXIT_FAILURE;
    }
    if (sd_vae_create(&m, &c, &w.table, params, be, &err)) {
        free(x);
        sd_cmd_release(&o->cb, params, w.data);
        sd_weights_free(&w);
        sd_st_writer_free(out.w);
        return fail_run(err.msg);
    }
    t_load = sd_time_now() - t0;
    want_c = decode ? c.latent_channels : c.in_channels;
    sd_shape_str(t->ndim, t->shape, s_in, sizeof s_in);
    if (C != want_c) {
        rc = fail_input("%s: '%s' has shape %s; the VAE wants %d channels", o->in, name, s_in,
                        want_c);
        free(x);
        goto done;
    }
    if ((decode ? sd_vae_check_latent_shape(&c, B, H, W, &oh, &ow, &err)
                : sd_vae_check_image_shape(&c, B, H, W, &oh, &ow, &err))) {
        rc = fail_input("%s: '%s' %s: %s", o->in, name, s_in, err.msg);
        free(x);
        goto done;
    }
    xh = to_nhwc(x, B, C, H, W);
    free(x);
    ny = (int64_t)B * oh * ow * (decode ? c.out_channels : 2 * c.latent_channels);
    x_be = input_for(o, xh, (int64_t)B * H * W * C);
    y_be = sd_cmd_alloc(&o->cb, (size_t)ny * sd_dtype_size(be->dtype));
    if (!x_be || !y_be ||
        arena_for(o, &a, decode ? sd_vae_decode_scratch_bytes(&c, be, B, H, W)
                                : sd_vae_encode_scratch_bytes(&c, be, B, H, W))) {
        sd_cmd_release(&o->cb, x_be, xh);
        sd_cmd_release(&o->cb, y_be, NULL);
        free(xh);
        rc = SD_EXIT_FAILURE;
        goto done;
    }
    for (int r = 0; r < o->repeat; r++) {
        double dt;
        t0 = sd_time_now();
        if (decode)
            sd_vae_decode(m, B, H, W, x_be, y_be, &a, NULL);
        else
            sd_vae_encode(m, B, H, W, x_be, y_be, &a, NULL);
        sd_synchronize(be);
        dt = sd_time_now() - t0;
        t_fwd = r == 0 || dt < t_fwd ? dt : t_fwd;
    }
    sd_cmd_arena_free(&o->cb, &a);
    y = sd_cmd_get(&o->cb, y_be, ny);
    sd_cmd_release(&o->cb, x_be, xh);
    sd_cmd_release(&o->cb, y_be, NULL);
    free(xh);
    snprintf(s_in, sizeof s_in, "%s [%d, %d, %d, %d]", name, B, C, H, W);
    if (decode) {
        const int co = c.out_channels;
        flops = sd_vae_decode_flops(&c, B, H, W);
        rc = add_output(&out, "sample", 4, (int64_t[]){B, co, oh, ow}, to_nchw(y, B, co, oh, ow),
                        &err);
        snprintf(s_out, sizeof s_out, "sample [%d, %d, %d, %d]", B, co, oh, ow);
    } else {
        const int L = c.latent_channels;
        const int64_t rows = (int64_t)B * oh * ow;
        float *mean = sd_xmalloc((size_t)rows * L * sizeof *mean);
        float *logvar = sd_xmalloc((size_t)rows * L * sizeof *logvar);
        flops = sd_vae_encode_flops(&c, B, H, W);
        sd_vae_moments_split_host(rows, L, y, mean, logvar);
        rc = add_output(&out, "latent_dist.parameters", 4, (int64_t[]){B, 2 * L, oh, ow},
                        to_nchw(y, B, 2 * L, oh, ow), &err) ||
             add_output(&out, "latent_dist.mean", 4, (int64_t[]){B, L, oh, ow},
                        to_nchw(mean, B, L, oh, ow), &err) ||
             add_output(&out, "latent_dist.logvar", 4, (int64_t[]){B, L, oh, ow},
                        to_nchw(logvar, B, L, oh, ow), &err);
        free(mean);
        free(logvar);
        snprintf(s_out, sizeof s_out, "latent_dist.parameters [%d, %d, %d, %d]", B, 2 * L, oh, ow);
    }
    free(y);
    if (rc) {
        rc = fail_run(err.msg);
        goto done;
    }
    report(o, s_in, s_out, t_load, t_fwd, flops);
    rc = write_outputs(&out, o->out, o->module);
done:
    outputs_free(&out);
    sd_vae_free(m);
    sd_cmd_release(&o->cb, params, w.data);
    sd_weights_free(&w);
    return rc;
}

static int run_unet(const fwd_opts *o, const sd_snapshot *s, const sd_st_file *in)
{
    const sd_backend *be = o->cb.be;
    const sd_st_tensor *ts = input(in, o, "sample", 4, "[batch, in_channels, h, w]");
    const sd_st_tensor *tc = ts ? input(in, o, "encoder_hidden_states", 3,
                                        "[batch, tokens, cross_attention_dim]")
                                : NULL;
    const sd_st_tensor *tt = tc ? sd_st_find(in, "timestep") : NULL;
    sd_unet_config c;
    sd_weights w;
    sd_unet *u = NULL;
    sd_err err;
    sd_arena a;
    outputs out = {sd_st_writer_new(), {0}, 0};
    int B, C, H, W, T, D, rc = 0;
    float *sample = NULL, *ctx = NULL, *steps = NULL, *xh = NULL, *y;
    void *params = NULL, *x_be, *ctx_be, *y_be;
    int64_t ny;
    double t0, t_load, t_fwd = 0;
    char s_in[160], s_out[96], sh[96];

    if (ts && tc && !tt)
        fail_input("%s: no input tensor 'timestep' ([batch] or a scalar)", o->in);
    if (!ts || !tc || !tt) {
        sd_st_writer_free(out.w);
        return SD_EXIT_USAGE;
    }
    B = (int)ts->shape[0];
    C = (int)ts->shape[1];
    H = (int)ts->shape[2];
    W = (int)ts->shape[3];
    T = (int)tc->shape[1];
    D = (int)tc->shape[2];
    if (tc->shape[0] != B || !(tt->ndim == 0 || (tt->ndim == 1 && (tt->shape[0] == B ||
                                                                  tt->shape[0] == 1)))) {
        sd_st_writer_free(out.w);
        return fail_input("%s: batch sizes differ: sample %s, encoder_hidden_states %s, timestep "
                          "%s (timestep may be a scalar or [1])", o->in,
                          sd_shape_str(ts->ndim, ts->shape, s_in, sizeof s_in),
                          sd_shape_str(tc->ndim, tc->shape, s_out, sizeof s_out),
                          sd_shape_str(tt->ndim, tt->shape, sh, sizeof sh));
    }
    /* timesteps: any integer or float dtype, broadcast to the batch like diffusers */
    steps = sd_xmalloc((size_t)B * sizeof *steps);
    if (tt->dtype == SD_ST_I64 || tt->dtype == SD_ST_I32) {
        for (int b = 0; b < B; b++) {
            int64_t i = tt->numel == 1 ? 0 : b, v;
            if (tt->dtype == SD_ST_I64) {
                memcpy(&v, (const char *)tt->data + 8 * i, 8);
            } else {
                int32_t v32;
                memcpy(&v32, (const char *)tt->data + 4 * i, 4);
                v = v32;
            }
            steps[b] = (float)v;
        }
    } else if (tt->dtype == SD_ST_F32 || tt->dtype == SD_ST_F16 || tt->dtype == SD_ST_BF16 ||
               tt->dtype == SD_ST_F64) {
        sd_st_tensor_read_f32(tt, steps, (size_t)tt->numel, &err); /* numel is 1 or B */
        for (int b = 1; b < B && tt->numel == 1; b++)
            steps[b] = steps[0];
    } else {
        free(steps);
        sd_st_writer_free(out.w);
        return fail_input("%s: 'timestep' is %s; expected an integer or float type", o->in,
                          sd_st_dtype_name(tt->dtype));
    }
    if (!(sample = read_float(ts, o->in)) || !(ctx = read_float(tc, o->in))) {
        free(sample);
        free(steps);
        sd_st_writer_free(out.w);
        return SD_EXIT_USAGE;
    }
    t0 = sd_time_now();
    if (sd_snapshot_load_unet(s, o->weights, &c, &w, &err)) {
        free(sample);
        free(ctx);
        free(steps);
        sd_st_writer_free(out.w);
        return fail_run(err.msg);
    }
    if (!(params = params_for(o, &w))) {
        rc = SD_EXIT_FAILURE;
        goto done;
    }
    if (sd_unet_create(&u, &c, &w.table, params, be, &err)) {
        rc = fail_run(err.msg);
        goto done;
    }
    t_load = sd_time_now() - t0;
    if (C != c.in_channels || D != c.cross_attention_dim) {
        rc = fail_input("%s: sample has %d channels and encoder_hidden_states width %d; the U-Net "
                        "wants %d and %d", o->in, C, D, c.in_channels, c.cross_attention_dim);
        goto done;
    }
    if (sd_unet_check_shape(&c, B, H, W, T, &err)) {
        rc = fail_input("%s: %s", o->in, err.msg);
        goto done;
    }
    xh = to_nhwc(sample, B, C, H, W);
    ny = (int64_t)B * H * W * c.out_channels;
    x_be = input_for(o, xh, (int64_t)B * H * W * C);
    ctx_be = input_for(o, ctx, (int64_t)B * T * D);
    y_be = sd_cmd_alloc(&o->cb, (size_t)ny * sd_dtype_size(be->dtype));
    if (!x_be || !ctx_be || !y_be || arena_for(o, &a, sd_unet_scratch_bytes(&c, be, B, H, W, T))) {
        sd_cmd_release(&o->cb, x_be, xh);
        sd_cmd_release(&o->cb, ctx_be, ctx);
        sd_cmd_release(&o->cb, y_be, NULL);
        rc = SD_EXIT_FAILURE;
        goto done;
    }
    for (int r = 0; r < o->repeat; r++) {
        double dt;
        t0 = sd_time_now();
        sd_unet_forward(u, B, H, W, x_be, steps, ctx_be, T, y_be, &a, NULL);
        sd_synchronize(be);
        dt = sd_time_now() - t0;
        t_fwd = r == 0 || dt < t_fwd ? dt : t_fwd;
    }
    sd_cmd_arena_free(&o->cb, &a);
    y = sd_cmd_get(&o->cb, y_be, ny);
    sd_cmd_release(&o->cb, x_be, xh);
    sd_cmd_release(&o->cb, ctx_be, ctx);
    sd_cmd_release(&o->cb, y_be, NULL);
    rc = add_output(&out, "sample", 4, (int64_t[]){B, c.out_channels, H, W},
                    to_nchw(y, B, c.out_channels, H, W), &err);
    free(y);
    if (rc) {
        rc = fail_run(err.msg);
        goto done;
    }
    snprintf(s_in, sizeof s_in, "sample [%d, %d, %d, %d] + encoder_hidden_states [%d, %d, %d]", B,
             C, H, W, B, T, D);
    snprintf(s_out, sizeof s_out, "sample [%d, %d, %d, %d]", B, c.out_channels, H, W);
    report(o, s_in, s_out, t_load, t_fwd, sd_unet_forward_flops(&c, B, H, W, T));
    rc = write_outputs(&out, o->out, o->module);
done:
    outputs_free(&out);
    free(sample);
    free(ctx);
    free(steps);
    free(xh);
    sd_unet_free(u);
    sd_cmd_release(&o->cb, params, w.data);
    sd_weights_free(&w);
    return rc;
}

/* ---- command line ---------------------------------------------------------------------- */

int sd_cmd_forward(int argc, char **argv)
{
    static const char *const modules[] = {"unet", "vae-encode", "vae-decode", "text-encoder"};
    fwd_opts o;
    sd_snapshot s;
    sd_st_file in;
    sd_err err;
    int rc;

    memset(&o, 0, sizeof o);
    o.threads = 0;
    o.repeat = 1;
    {
        const sd_cmd_opt opts[] = {
            {"--snapshot", &o.snapshot, NULL, 0, 0}, {"--module", &o.module, NULL, 0, 0},
            {"--in", &o.in, NULL, 0, 0},             {"--out", &o.out, NULL, 0, 0},
            {"--weights", &o.weights, NULL, 0, 0},   {"--device", &o.device, NULL, 0, 0},
            {"--precision", &o.precision, NULL, 0, 0},
            {"--threads", NULL, &o.threads, 1, 4096}, {"--repeat", NULL, &o.repeat, 1, 4096},
        };
        int r = sd_cmd_parse_opts(argc, argv, "forward", opts, (int)(sizeof opts / sizeof opts[0]),
                                  &err);
        if (r == 1) {
            forward_usage(stdout);
            return SD_EXIT_OK;
        }
        if (r < 0)
            return fail_input("%s", err.msg);
    }
    if (!o.snapshot || !o.module || !o.in || !o.out) {
        forward_usage(stderr);
        return fail_input("--snapshot, --module, --in and --out are required");
    }
    rc = -1;
    for (int k = 0; k < 4; k++)
        if (!strcmp(o.module, modules[k]))
            rc = k;
    if (rc < 0)
        return fail_input("unknown module '%s' (unet, vae-encode, vae-decode or text-encoder)",
                          o.module);
    o.kind = (module_kind)rc;
#ifdef _OPENMP
    if (o.threads)
        omp_set_num_threads(o.threads);
    o.threads = omp_get_max_threads();
#else
    o.threads = 1;
#endif
    if (o.device && strcmp(o.device, "cpu") && strcmp(o.device, "cuda"))
        return fail_input("--device '%s': expected cpu or cuda", o.device);
    if (o.precision && strcmp(o.precision, "fp32") && strcmp(o.precision, "bf16"))
        return fail_input("--precision '%s': expected fp32 or bf16", o.precision);
    if (sd_st_open(o.in, &in, &err))
        return fail_input("%s", err.msg);
    if (sd_snapshot_open(&s, o.snapshot, &err)) {
        sd_st_close(&in);
        return fail_run(err.msg);
    }
    if (sd_cmd_backend_open(o.device, 0, o.precision, &o.cb, &err)) {
        sd_snapshot_close(&s);
        sd_st_close(&in);
        /* bf16 on the CPU is a usage error; a missing GPU or CUDA build a runtime one */
        return o.precision && !strcmp(o.precision, "bf16") && (!o.device || !strcmp(o.device, "cpu"))
                   ? fail_input("%s", err.msg)
                   : fail_run(err.msg);
    }
    switch (o.kind) {
    case MOD_UNET:
        rc = run_unet(&o, &s, &in);
        break;
    case MOD_VAE_ENCODE:
        rc = run_vae(&o, &s, &in, 0);
        break;
    case MOD_VAE_DECODE:
        rc = run_vae(&o, &s, &in, 1);
        break;
    default:
        rc = run_text(&o, &s, &in);
        break;
    }
    sd_cmd_backend_close(&o.cb);
    sd_snapshot_close(&s);
    sd_st_close(&in);
    return rc;
}
