/* sdtool grad: the training loss of one batch and the gradient of every U-Net parameter, in diffusers' names and PyTorch's layouts. */
#include "sdtrain/commands.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/cmd_backend.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/error.h"
#include "sdtrain/json_file.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/timer.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"

static void grad_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool grad --snapshot DIR --batch BATCH.safetensors --out OUT.safetensors\n"
            "                   [--prediction-type epsilon|v_prediction] [--threads N]\n"
            "                   [--recompute] [--weights FILE] [--device cpu|cuda]\n"
            "                   [--precision fp32|bf16]\n"
            "\n"
            "One training step's loss and gradients for the U-Net of a diffusers snapshot (fp32 on\n"
            "the CPU by default), without the optimizer. BATCH holds (PyTorch layouts):\n"
            "  latents                [B, C, h, w]  x0, already scaled by the VAE scaling factor\n"
            "  noise                  [B, C, h, w]  the epsilon added to them\n"
            "  timesteps              [B]           integers in [0, num_train_timesteps)\n"
            "  encoder_hidden_states  [B, T, D]     the text encoder's output\n"
            "and may say prediction_type in its metadata. The objective is diffusers' training\n"
            "loss: noisy = DDPMScheduler.add_noise(latents, noise, t), target = noise (epsilon) or\n"
            "get_velocity(latents, noise, t) (v_prediction), loss = mean((unet(noisy, t, ehs) -\n"
            "target)^2). The schedule comes from the snapshot's scheduler/scheduler_config.json,\n"
            "or is SD's (scaled_linear, 0.00085 to 0.012, 1000 steps) when it has none.\n"
            "\n"
            "OUT receives `loss` (F32, shape []), `pred` [B, C, h, w] and the gradient of every\n"
            "U-Net parameter under its diffusers key, F32, in PyTorch's layout.\n"
            "\n"
            "  --prediction-type  overrides the batch metadata and the scheduler config\n"
            "  --threads N        OpenMP threads (the result does not depend on N)\n"
            "  --recompute        recompute block activations in the backward (same result)\n"
            "  --weights FILE     weight file name inside unet/ (default: the usual names)\n"
            "  --device D         cpu (default) or cuda (the first visible GPU)\n"
            "  --precision P      fp32 (default; no TF32 on the GPU) or bf16 (GPU only; the\n"
            "                     gradients are still accumulated in fp32)\n"
            "\n"
            "exit status: 0 done, 1 the snapshot cannot be loaded or OUT cannot be written,\n"
            "2 bad usage or input.\n");
}

static int fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "sdtool grad: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    return code;
}

typedef struct sched {
    char beta_schedule[32], prediction[32];
    double beta_start, beta_end;
    int64_t steps;
    int zero_snr;
} sched;

/* scheduler/scheduler_config.json of the snapshot, when there is one (SD2's schedule for the
 * keys it does not have). */
static int read_scheduler(const sd_snapshot *s, sched *out)
{
    char path[4200];
    struct stat st;
    const char *schedule = "scaled_linear", *prediction = "epsilon";
    int steps = 1000;
    sd_jconf j;
    sd_err err;
    memset(out, 0, sizeof *out);
    snprintf(out->beta_schedule, sizeof out->beta_schedule, "%s", schedule);
    snprintf(out->prediction, sizeof out->prediction, "%s", prediction);
    out->beta_start = 0.00085;
    out->beta_end = 0.012;
    if (!s->is_component) {
        snprintf(path, sizeof path, "%s/scheduler/scheduler_config.json", s->path);
        if (lstat(path, &st) == 0) { /* anything there is read, or refused by name */
            if (sd_jconf_open(&j, path, &err) != 0)
                return fail(SD_EXIT_USAGE, "%s", err.msg);
            sd_jconf_string(&j, "beta_schedule", &schedule);
            sd_jconf_string(&j, "prediction_type", &prediction);
            sd_jconf_double(&j, "beta_start", &out->beta_start);
            sd_jconf_double(&j, "beta_end", &out->beta_end);
            sd_jconf_int(&j, "num_train_timesteps", &steps);
            sd_jconf_bool(&j, "rescale_betas_zero_snr", &out->zero_snr);
            snprintf(out->beta_schedule, sizeof out->beta_schedule, "%s", schedule);
            snprintf(out->prediction, sizeof out->prediction, "%s", prediction);
            if (sd_jconf_close(&j) != 0)
                return fail(SD_EXIT_USAGE, "%s", err.msg);
        }
    }
    out->steps = steps;
    return 0;
}

/* A float tensor of the batch with the given rank, read as fp32 (malloc'ed), or NULL. */
static float *batch_float(const sd_st_file *f, const char *path, const char *name, int ndim,
                          const sd_st_tensor **out)
{
    const sd_st_tensor *t = sd_st_find(f, name);
    sd_err err;
    float *x;
    char s[96];
    *out = t;
    if (!t) {
        fail(SD_EXIT_USAGE, "%s: no tensor '%s' (see sdtool grad --help)", path, name);
        return NULL;
    }
    if (t->ndim != ndim || t->numel < 1) {
        fail(SD_EXIT_USAGE, "%s: '%s' has shape %s; expected %d dimensions", path, name,
             sd_shape_str(t->ndim, t->shape, s, sizeof s), ndim);
        return NULL;
    }
    if (t->dtype != SD_ST_F32 && t->dtype != SD_ST_F16 && t->dtype != SD_ST_BF16 &&
        t->dtype != SD_ST_F64) {
        fail(SD_EXIT_USAGE, "%s: '%s' is %s; expected F32, F16, BF16 or F64", path, name,
             sd_st_dtype_name(t->dtype));
        return NULL;
    }
    x = sd_xmalloc((size_t)t->numel * sizeof *x);
    if (sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err)) {
        free(x);
        fail(SD_EXIT_USAGE, "%s", err.msg);
        return NULL;
    }
    return x;
}

typedef struct grad_opts {
    const char *snapshot, *batch, *out, *weights, *prediction, *device, *precision;
    sd_cmd_backend cb;
    int threads, recompute;
} grad_opts;

static int run(const grad_opts *o)
{
    const sd_backend *be = o->cb.be;
    const sd_backend *hb = sd_backend_cpu(); /* layout changes of host arrays */
    sd_snapshot snap;
    sd_st_file in;
    sd_err err;
    sched sc;
    sd_diffusion d;
    sd_unet_config c;
    sd_weights w;
    sd_unet *u = NULL;
    sd_unet_trainer *tr = NULL;
    sd_arena arena;
    sd_st_writer *wr = NULL;
    const sd_st_tensor *tl, *tn, *tc, *tt;
    float *lat = NULL, *noise = NULL, *ctx = NULL, *steps = NULL, *grads = NULL;
    float *xt = NULL, *target = NULL, *pred = NULL, *dpred = NULL, *xh = NULL, *yh = NULL;
    float *torch_grads = NULL, l32;
    void *params = NULL, *grads_be = NULL, *xh_be = NULL, *ctx_be = NULL, *yh_be = NULL;
    void *dy_be = NULL;
    int32_t *ti = NULL;
    int B, C, H, W, T, D, rc = SD_EXIT_FAILURE, have_sched = 0, have_arena = 0;
    double loss, t0, t_step;
    char pred_name[32];
    size_t per;

    memset(&w, 0, sizeof w);
    if (sd_st_open(o->batch, &in, &err))
        return fail(SD_EXIT_USAGE, "%s", err.msg);
    if (sd_snapshot_open(&snap, o->snapshot, &err)) {
        sd_st_close(&in);
        return fail(SD_EXIT_FAILURE, "%s", err.msg);
    }
    if (read_scheduler(&snap, &sc)) {
        rc = SD_EXIT_USAGE;
        goto done;
    }
    snprintf(pred_name, sizeof pred_name, "%s", sc.prediction);
    {
        const char *m = sd_st_metadata(&in, "prediction_type");
        if (m)
            snprintf(pred_name, sizeof pred_name, "%s", m);
        if (o->prediction)
            snprintf(pred_name, sizeof pred_name, "%s", o->prediction);
    }
    if (sd_diffusion_init(&d, sc.beta_schedule, sc.beta_start, sc.beta_end, sc.steps, pred_name,
                          SD_LINSPACE_FUSED, &err)) {
        rc = fail(SD_EXIT_USAGE, "%s", err.msg);
        goto done;
    }
    have_sched = 1;
    if (sc.zero_snr && sd_diffusion_rescale_zero_snr(&d, &err)) {
        rc = fail(SD_EXIT_USAGE, "%s", err.msg);
        goto done;
    }

    rc = SD_EXIT_USAGE;
    if (!(lat = batch_float(&in, o->batch, "latents", 4, &tl)) ||
        !(noise = batch_float(&in, o->batch, "noise", 4, &tn)) ||
        !(ctx = batch_float(&in, o->batch, "encoder_hidden_states", 3, &tc)))
        goto done;
    B = (int)tl->shape[0];
    C = (int)tl->shape[1];
    H = (int)tl->shape[2];
    W = (int)tl->shape[3];
    T = (int)tc->shape[1];
    D = (int)tc->shape[2];
    if (memcmp(tl->shape, tn->shape, sizeof tl->shape) || tc->shape[0] != B) {
        fail(rc, "%s: latents, noise and encoder_hidden_states disagree on shape or batch",
             o->batch);
        goto done;
    }
    tt = sd_st_find(&in, "timesteps");
    if (!tt || tt->ndim != 1 || tt->shape[0] != B ||
        (tt->dtype != SD_ST_I64 && tt->dtype != SD_ST_I32)) {
        fail(rc, "%s: 'timesteps' must be I64 or I32 of shape [%d]", o->batch, B);
        goto done;
    }
    ti = sd_xmalloc((size_t)B * sizeof *ti);
    steps = sd_xmalloc((size_t)B * sizeof *steps);
    for (int b = 0; b < B; b++) {
        int64_t v;
        if (tt->dtype == SD_ST_I64) {
            memcpy(&v, (const char *)tt->data + 8 * (size_t)b, 8);
        } else {
            int32_t v32;
            memcpy(&v32, (const char *)tt->data + 4 * (size_t)b, 4);
            v = v32;
        }
        if (v < 0 || v >= d.num_train_timesteps) {
            fail(rc, "%s: timesteps[%d] = %lld is outside [0, %d)", o->batch, b, (long long)v,
                 d.num_train_timesteps);
            goto done;
        }
        ti[b] = (int32_t)v;
        steps[b] = (float)v;
    }

    rc = SD_EXIT_FAILURE;
    t0 = sd_time_now();
    if (sd_snapshot_load_unet(&snap, o->weights, &c, &w, &err)) {
        fail(rc, "%s", err.msg);
        goto done;
    }
    if (!(params = sd_cmd_put(&o->cb, w.data, (int64_t)w.table.total_floats))) {
        fail(rc, "cannot allocate the weights on the %s backend", be->name);
        goto done;
    }
    if (sd_unet_create(&u, &c, &w.table, params, be, &err)) {
        fail(rc, "%s", err.msg);
        goto done;
    }
    if (C != c.in_channels || C != c.out_channels || D != c.cross_attention_dim) {
        rc = fail(SD_EXIT_USAGE, "%s: latents have %d channels and encoder_hidden_states width "
                  "%d; the U-Net takes %d, predicts %d and attends to width %d (the loss needs "
                  "in_channels == out_channels)", o->batch, C, D, c.in_channels, c.out_channels,
                  c.cross_attention_dim);
        goto done;
    }
    if (sd_unet_check_shape(&c, B, H, W, T, &err)) {
        rc = fail(SD_EXIT_USAGE, "%s: %s", o->batch, err.msg);
        goto done;
    }
    grads = sd_xcalloc(w.table.total_floats ? w.table.total_floats : 1, sizeof *grads);
    if (o->cb.host) {
        grads_be = grads;
    } else {
        grads_be = sd_cmd_alloc(&o->cb, (w.table.total_floats ? w.table.total_floats : 1) *
                                            sizeof(float));
        if (!grads_be) {
            fail(rc, "cannot allocate the gradients on the %s backend", be->name);
            goto done;
        }
        sd_zero(be, grads_be, w.table.total_floats * sizeof(float));
    }
    if (sd_unet_trainer_create(&tr, u, &w.table, grads_be, B, H, W, T, o->recompute, &err)) {
        fail(rc, "%s", err.msg);
        goto done;
    }
    if (sd_cmd_arena(&o->cb, sd_unet_trainer_arena_bytes(tr), &arena)) {
        fail(rc, "cannot allocate %zu bytes of activation memory on the %s backend",
             sd_unet_trainer_arena_bytes(tr), be->name);
        goto done;
    }
    have_arena = 1;

    /* the objective, in PyTorch's NCHW order, around the U-Net's NHWC */
    per = (size_t)C * H * W;
    xt = sd_xmalloc(B * per * sizeof *xt);
    target = sd_xmalloc(B * per * sizeof *target);
    pred = sd_xmalloc(B * per * sizeof *pred);
    dpred = sd_xmalloc(B * per * sizeof *dpred);
    xh = sd_xmalloc(B * per * sizeof *xh);
    yh = sd_xmalloc(B * per * sizeof *yh);
    t0 = sd_time_now();
    sd_diffusion_add_noise(&d, ti, B, (int64_t)per, lat, noise, xt);
    sd_diffusion_target(&d, ti, B, (int64_t)per, lat, noise, target);
    sd_nchw_to_nhwc(hb, B, C, H, W, xt, xh);
    xh_be = sd_cmd_put(&o->cb, xh, (int64_t)(B * per));
    ctx_be = sd_cmd_put(&o->cb, ctx, (int64_t)B * T * D);
    yh_be = sd_cmd_alloc(&o->cb, B * per * sd_dtype_size(be->dtype));
    if (!xh_be || !ctx_be || !yh_be) {
        fail(rc, "cannot allocate the batch on the %s backend", be->name);
        goto done;
    }
    sd_unet_train_forward(tr, xh_be, steps, ctx_be, yh_be, &arena);
    {
        float *y = sd_cmd_get(&o->cb, yh_be, (int64_t)(B * per));
        sd_nhwc_to_nchw(hb, B, C, H, W, y, pred);
        free(y);
    }
    loss = sd_diffusion_loss(&d, ti, B, (int64_t)per, B, pred, target, NULL, dpred);
    sd_nchw_to_nhwc(hb, B, C, H, W, dpred, yh);
    if (!(dy_be = sd_cmd_put(&o->cb, yh, (int64_t)(B * per)))) {
        fail(rc, "cannot allocate the output gradient on the %s backend", be->name);
        goto done;
    }
    sd_unet_backward(tr, dy_be, &arena);
    sd_synchronize(be);
    t_step = sd_time_now() - t0;
    if (!o->cb.host)
        sd_download(be, grads, grads_be, w.table.total_floats * sizeof(float));

    /* outputs */
    wr = sd_st_writer_new();
    l32 = (float)loss;
    {
        if (sd_st_writer_add(wr, "loss", SD_ST_F32, 0, NULL, &l32, sizeof l32, &err) ||
            sd_st_writer_add(wr, "pred", SD_ST_F32, 4, (int64_t[]){B, C, H, W}, pred,
                             B * per * sizeof *pred, &err)) {
            fail(rc, "%s", err.msg);
            goto done;
        }
    }
    /* the writer keeps pointers until it writes: one buffer for all PyTorch-layout copies */
    torch_grads = sd_xcalloc(w.table.total_floats ? w.table.total_floats : 1, sizeof *torch_grads);
    for (size_t i = 0; i < w.table.n; i++) {
        const sd_param *p = &w.table.params[i];
        float *g = torch_grads + p->offset;
        sd_weight_to_torch(p->ndim, p->shape, sizeof(float), grads + p->offset, g);
        if (sd_st_writer_add(wr, p->name, SD_ST_F32, p->ndim, p->shape, g, p->numel * sizeof *g,
                             &err)) {
            fail(rc, "%s", err.msg);
            goto done;
        }
    }
    sd_st_writer_set_metadata(wr, "format", "pt", &err);
    sd_st_writer_set_metadata(wr, "prediction_type", pred_name, &err);
    if (sd_st_writer_write(wr, o->out, &err)) {
        fail(rc, "%s", err.msg);
        goto done;
    }
    {
        char where[64];
        if (o->cb.host)
            snprintf(where, sizeof where, "%d threads", o->threads);
        else
            snprintf(where, sizeof where, "%s %s", be->name,
                     be->dtype == SD_BF16 ? "bf16" : "fp32");
        printf("grad: batch %d, latent %dx%dx%d, context %dx%d, %s, loss %.9g, %zu gradient "
               "tensors, step %.3f s (%.2f GFLOP/s, %s%s)\n",
               B, C, H, W, T, D, pred_name, loss, w.table.n, t_step,
               sd_unet_trainer_flops(tr) / t_step * 1e-9, where,
               o->recompute ? ", recompute" : "");
    }
    rc = SD_EXIT_OK;
done:
    if (wr)
        sd_st_writer_free(wr);
    if (have_arena)
        sd_cmd_arena_free(&o->cb, &arena);
    sd_unet_trainer_free(tr);
    sd_unet_free(u);
    sd_cmd_release(&o->cb, params, w.data);
    sd_cmd_release(&o->cb, grads_be, grads);
    sd_cmd_release(&o->cb, xh_be, xh);
    sd_cmd_release(&o->cb, ctx_be, ctx);
    sd_cmd_release(&o->cb, yh_be, NULL);
    sd_cmd_release(&o->cb, dy_be, yh);
    sd_weights_free(&w);
    if (have_sched)
        sd_diffusion_free(&d);
    free(lat);
    free(noise);
    free(ctx);
    free(steps);
    free(ti);
    free(grads);
    free(torch_grads);
    free(xt);
    free(target);
    free(pred);
    free(dpred);
    free(xh);
    free(yh);
    sd_snapshot_close(&snap);
    sd_st_close(&in);
    return rc;
}

int sd_cmd_grad(int argc, char **argv)
{
    grad_opts o;
    memset(&o, 0, sizeof o);
    {
        const sd_cmd_opt opts[] = {
            {"--snapshot", &o.snapshot, NULL, 0, 0}, {"--batch", &o.batch, NULL, 0, 0},
            {"--out", &o.out, NULL, 0, 0},           {"--weights", &o.weights, NULL, 0, 0},
            {"--prediction-type", &o.prediction, NULL, 0, 0},
            {"--device", &o.device, NULL, 0, 0},     {"--precision", &o.precision, NULL, 0, 0},
            {"--threads", NULL, &o.threads, 1, 4096}, {"--recompute", NULL, &o.recompute, 0, 0},
        };
        sd_err perr;
        int r = sd_cmd_parse_opts(argc, argv, "grad", opts, (int)(sizeof opts / sizeof opts[0]),
                                  &perr);
        if (r == 1) {
            grad_usage(stdout);
            return SD_EXIT_OK;
        }
        if (r < 0)
            return fail(SD_EXIT_USAGE, "%s", perr.msg);
    }
    if (!o.snapshot || !o.batch || !o.out) {
        grad_usage(stderr);
        return fail(SD_EXIT_USAGE, "--snapshot, --batch and --out are required");
    }
    if (o.prediction && strcasecmp(o.prediction, "epsilon") && strcasecmp(o.prediction, "v_prediction"))
        return fail(SD_EXIT_USAGE, "--prediction-type '%s': expected epsilon or v_prediction",
                    o.prediction);
#ifdef _OPENMP
    if (o.threads)
        omp_set_num_threads(o.threads);
    o.threads = omp_get_max_threads();
#else
    o.threads = 1;
#endif
    {
        sd_err err;
        int rc;
        if (o.device && strcmp(o.device, "cpu") && strcmp(o.device, "cuda"))
            return fail(SD_EXIT_USAGE, "--device '%s': expected cpu or cuda", o.device);
        if (o.precision && strcmp(o.precision, "fp32") && strcmp(o.precision, "bf16"))
            return fail(SD_EXIT_USAGE, "--precision '%s': expected fp32 or bf16", o.precision);
        if (sd_cmd_backend_open(o.device, 0, o.precision, &o.cb, &err))
            return fail(o.cb.be == NULL && (!o.device || !strcmp(o.device, "cpu"))
                            ? SD_EXIT_USAGE
                            : SD_EXIT_FAILURE,
                        "%s", err.msg);
        rc = run(&o);
        sd_cmd_backend_close(&o.cb);
        return rc;
    }
}
