/* TAP tests of the U-Net forward against diffusers goldens, thread-count and batch independence. */
#include "sdtrain/unet.h"

#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/check.h"
#include "sdtrain/models.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/weights.h"
#include "tap.h"

/*
 * For each golden snapshot under tests/data/models/ (made by tests/reference/
 * make_model_goldens.py with diffusers 0.42.1, CPU fp32): load unet/config.json and the
 * weights, run the forward on the golden inputs, and compare out.sample and the recorded
 * activations (time_embedding, conv_in, down_blocks.0, mid_block, up_blocks.0) by relative
 * error ||y - ref|| / ||ref||. Then: 1 and 2 OpenMP threads give the same bits, and each sample
 * of the batch run alone gives the same bits as in the batch.
 */
#define TOL 1e-5

static const sd_backend *be;

typedef struct golden {
    sd_st_file f;
    int batch, cin, h, w, ctx_len, ctx_dim, cout;
    float *sample;    /* NHWC */
    float *timesteps; /* [batch] */
    float *ctx;       /* [batch, ctx_len, ctx_dim] */
} golden;

static float *read_all(const sd_st_file *f, const char *name, const sd_st_tensor **tp)
{
    sd_err err;
    const sd_st_tensor *t = sd_st_find(f, name);
    float *x;
    SD_CHECK(t != NULL, "golden tensor %s missing", name);
    x = sd_xmalloc((size_t)t->numel * sizeof(float) + 1);
    SD_CHECK(sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err) == 0, "%s", err.msg);
    if (tp)
        *tp = t;
    return x;
}

static void golden_open(golden *g, const char *path)
{
    sd_err err;
    const sd_st_tensor *t;
    float *nchw;
    memset(g, 0, sizeof *g);
    SD_CHECK(sd_st_open(path, &g->f, &err) == 0, "%s", err.msg);
    nchw = read_all(&g->f, "sample", &t);
    g->batch = (int)t->shape[0];
    g->cin = (int)t->shape[1];
    g->h = (int)t->shape[2];
    g->w = (int)t->shape[3];
    g->sample = sd_xmalloc((size_t)t->numel * sizeof(float));
    sd_nchw_to_nhwc(be, g->batch, g->cin, g->h, g->w, nchw, g->sample);
    free(nchw);
    g->ctx = read_all(&g->f, "encoder_hidden_states", &t);
    g->ctx_len = (int)t->shape[1];
    g->ctx_dim = (int)t->shape[2];
    t = sd_st_find(&g->f, "timestep");
    SD_CHECK(t && t->dtype == SD_ST_I64 && t->numel == g->batch, "golden timestep");
    g->timesteps = sd_xmalloc((size_t)g->batch * sizeof(float));
    for (int b = 0; b < g->batch; b++) {
        int64_t v;
        memcpy(&v, (const char *)t->data + 8 * b, 8);
        g->timesteps[b] = (float)v;
    }
    t = sd_st_find(&g->f, "out.sample");
    SD_CHECK(t != NULL, "golden out.sample");
    g->cout = (int)t->shape[1];
}

static void golden_close(golden *g)
{
    free(g->sample);
    free(g->ctx);
    free(g->timesteps);
    sd_st_close(&g->f);
}

/* A U-Net's weights read the way sdtrain reads them: the snapshot loader builds the parameter
 * table from unet/config.json and fills the flat buffer with sd_weights_load. */
typedef struct model {
    sd_unet_config c;
    sd_weights w;
    sd_unet *u;
} model;

static int model_load(model *m, const char *dir, sd_err *err)
{
    sd_snapshot snap;
    int rc;
    memset(m, 0, sizeof *m);
    if (sd_snapshot_open(&snap, dir, err))
        return -1;
    rc = sd_snapshot_load_unet(&snap, NULL, &m->c, &m->w, err);
    sd_snapshot_close(&snap);
    if (rc)
        return -1;
    return sd_unet_create_from_weights(&m->u, &m->c, &m->w, be, err);
}

static void model_free(model *m)
{
    sd_unet_free(m->u);
    sd_weights_free(&m->w);
}

/* ---- activation capture ------------------------------------------------------------------- */

#define N_ACTS 5
static const char *const act_names[N_ACTS] = {"time_embedding", "conv_in", "down_blocks.0",
                                              "mid_block", "up_blocks.0"};

typedef struct capture {
    float *x[N_ACTS]; /* NCHW, like the goldens */
    int64_t n[N_ACTS];
    int shape[N_ACTS][4];
} capture;

static void capture_tap(void *user, const char *name, const void *x, int n, int h, int w, int c)
{
    capture *cap = user;
    for (int i = 0; i < N_ACTS; i++)
        if (strcmp(name, act_names[i]) == 0) {
            free(cap->x[i]);
            cap->n[i] = (int64_t)n * h * w * c;
            cap->x[i] = sd_xmalloc((size_t)cap->n[i] * sizeof(float));
            sd_nhwc_to_nchw(be, n, c, h, w, x, cap->x[i]);
            cap->shape[i][0] = n;
            cap->shape[i][1] = c;
            cap->shape[i][2] = h;
            cap->shape[i][3] = w;
        }
}

static void capture_free(capture *cap)
{
    for (int i = 0; i < N_ACTS; i++)
        free(cap->x[i]);
}

/* ||y - ref|| / ||ref|| in double; NaN anywhere gives infinity. Also the max |y - ref|. */
static double rel_err(const float *y, const float *ref, int64_t n, double *max_abs)
{
    double num = 0.0, den = 0.0, mx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)ref[i];
        if (isnan(d))
            return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx)
            mx = fabs(d);
    }
    if (max_abs)
        *max_abs = mx;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static float *run(const model *m, int batch, int h, int w, const float *sample, const float *t,
                  const float *ctx, int ctx_len, size_t scratch, const sd_unet_tap *tap)
{
    const int64_t n = (int64_t)batch * h * w * m->c.out_channels;
    float *out = sd_xmalloc((size_t)n * sizeof(float));
    sd_arena a;
    SD_CHECK(sd_arena_init(&a, scratch, 0) == 0, "arena of %zu bytes", scratch);
    sd_unet_forward(m->u, batch, h, w, sample, t, ctx, ctx_len, out, &a, tap);
    SD_CHECK(sd_arena_used(&a) == 0, "the forward left %zu bytes allocated", sd_arena_used(&a));
    sd_arena_free(&a);
    return out;
}

static void test_snapshot(const char *srcdir, const char *name)
{
    char dir[1024], path[1200];
    golden g;
    model m;
    sd_err err;
    capture cap;
    sd_unet_tap tap = {capture_tap, &cap};
    size_t scratch;
    float *out;
    int threads = 2, rc;

    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", srcdir, name);
    snprintf(path, sizeof path, "%s/golden/unet.safetensors", dir);
    golden_open(&g, path);
    rc = model_load(&m, dir, &err);
    if (!tap_ok(rc == 0, "%s: config, weights and U-Net load", name)) {
        tap_diag("%s", err.msg);
        model_free(&m);
        golden_close(&g);
        return;
    }
    tap_ok(m.c.in_channels == g.cin && m.c.out_channels == g.cout &&
               m.c.cross_attention_dim == g.ctx_dim,
           "%s: golden shapes match the configuration", name);

#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    scratch = sd_unet_scratch_bytes(&m.c, be, g.batch, g.h, g.w, g.ctx_len);
    tap_diag("%s: batch %d, latent %dx%d, scratch %.2f MiB, %.3f MFLOP per forward", name,
             g.batch, g.h, g.w, scratch / 1048576.0,
             sd_unet_forward_flops(&m.c, g.batch, g.h, g.w, g.ctx_len) / 1e6);

    memset(&cap, 0, sizeof cap);
    out = run(&m, g.batch, g.h, g.w, g.sample, g.timesteps, g.ctx, g.ctx_len, scratch, &tap);
    {
        const sd_st_tensor *t;
        float *ref = read_all(&g.f, "out.sample", &t);
        float *got = sd_xmalloc((size_t)t->numel * sizeof(float));
        double mx, e;
        sd_nhwc_to_nchw(be, g.batch, g.cout, g.h, g.w, out, got);
        e = rel_err(got, ref, t->numel, &mx);
        tap_ok(e <= TOL, "%s: out.sample relative error %.3g (max |diff| %.3g) <= %g", name, e,
               mx, TOL);
        free(ref);
        free(got);
    }
    for (int i = 0; i < N_ACTS; i++) {
        char key[64];
        const sd_st_tensor *t;
        float *ref;
        double mx = 0, e = INFINITY;
        int shape_ok;
        snprintf(key, sizeof key, "act.%s", act_names[i]);
        ref = read_all(&g.f, key, &t);
        if (t->ndim == 2) /* time_embedding [n, c] */
            shape_ok = cap.x[i] && cap.shape[i][0] == t->shape[0] &&
                       cap.shape[i][1] == t->shape[1] && cap.shape[i][2] == 1 &&
                       cap.shape[i][3] == 1;
        else
            shape_ok = cap.x[i] && t->ndim == 4 && cap.shape[i][0] == t->shape[0] &&
                       cap.shape[i][1] == t->shape[1] && cap.shape[i][2] == t->shape[2] &&
                       cap.shape[i][3] == t->shape[3];
        if (shape_ok)
            e = rel_err(cap.x[i], ref, t->numel, &mx);
        tap_ok(shape_ok && e <= TOL, "%s: %s relative error %.3g (max |diff| %.3g)", name, key,
               e, mx);
        free(ref);
    }
    capture_free(&cap);

#ifdef _OPENMP
    {
        float *one;
        omp_set_num_threads(1);
        one = run(&m, g.batch, g.h, g.w, g.sample, g.timesteps, g.ctx, g.ctx_len, scratch, NULL);
        omp_set_num_threads(threads);
        tap_ok(memcmp(one, out, (size_t)g.batch * g.h * g.w * g.cout * sizeof(float)) == 0,
               "%s: 1 and %d threads give identical bits", name, threads);
        free(one);
    }
#endif

    if (g.batch > 1) {
        const int64_t in_row = (int64_t)g.h * g.w * g.cin, out_row = (int64_t)g.h * g.w * g.cout;
        const int64_t ctx_row = (int64_t)g.ctx_len * g.ctx_dim;
        size_t s1 = sd_unet_scratch_bytes(&m.c, be, 1, g.h, g.w, g.ctx_len);
        int same = 1;
        for (int b = 0; b < g.batch; b++) {
            float *o = run(&m, 1, g.h, g.w, g.sample + b * in_row, g.timesteps + b,
                           g.ctx + b * ctx_row, g.ctx_len, s1, NULL);
            same &= memcmp(o, out + b * out_row, (size_t)out_row * sizeof(float)) == 0;
            free(o);
        }
        tap_ok(same, "%s: each sample alone gives the bits it has in the batch of %d", name,
               g.batch);
    }

    free(out);
    model_free(&m);
    golden_close(&g);
}

/* A fatal check ends the job through the abort handler; here it jumps back to the test. */
static jmp_buf fatal_jump;
static void catch_fatal(int code)
{
    longjmp(fatal_jump, code ? code : 1);
}

/* An arena smaller than sd_unet_scratch_bytes says ends the job with a message, not a crash. */
static void test_small_arena(const model *m)
{
    const int h = 8, w = 8, t_len = 5, cin = m->c.in_channels, x = m->c.cross_attention_dim;
    size_t need = sd_unet_scratch_bytes(&m->c, be, 1, h, w, t_len);
    float *sample = sd_xcalloc((size_t)h * w * cin, sizeof(float));
    float *ctx = sd_xcalloc((size_t)t_len * x, sizeof(float));
    float *out = sd_xcalloc((size_t)h * w * m->c.out_channels, sizeof(float));
    float t = 10.0f;
    sd_arena a;
    volatile int caught = 0;
    SD_CHECK(sd_arena_init(&a, need - 4096, 0) == 0, "arena");
    sd_set_abort_handler(catch_fatal);
    tap_diag("a fatal message follows on stderr; it is expected");
    if (setjmp(fatal_jump) == 0)
        sd_unet_forward(m->u, 1, h, w, sample, &t, ctx, t_len, out, &a, NULL);
    else
        caught = 1;
    sd_set_abort_handler(NULL);
    tap_ok(caught, "an arena 4 KiB short of sd_unet_scratch_bytes (%zu) is refused", need);
    sd_arena_free(&a);
    free(sample);
    free(ctx);
    free(out);
}

/* A configuration that does not match the weights is refused with one message. */
static void test_mismatch(const char *srcdir)
{
    char dir[1024];
    model m;
    sd_err err;
    sd_unet *u = NULL;
    sd_unet_config c;
    snprintf(dir, sizeof dir, "%s/tests/data/models/tiny-sd2", srcdir);
    if (model_load(&m, dir, &err)) {
        tap_ok(0, "mismatch: tiny-sd2 loads (%s)", err.msg);
        model_free(&m);
        return;
    }
    c = m.c;
    c.transformer_layers[0] = 2;
    tap_ok(sd_unet_create_from_weights(&u, &c, &m.w, be, &err) != 0 && u == NULL &&
               strstr(err.msg, "missing") &&
               strstr(err.msg, "down_blocks.0.attentions.0.transformer_blocks.1"),
           "a second transformer layer the weights lack is reported as missing");
    tap_diag("%s", err.msg);
    c = m.c;
    c.cross_attention_dim += 1;
    tap_ok(sd_unet_create_from_weights(&u, &c, &m.w, be, &err) != 0 &&
               strstr(err.msg, "attn2.to_k.weight' has shape"),
           "a wrong cross_attention_dim is reported as a shape mismatch");
    tap_diag("%s", err.msg);
    c = m.c;
    c.up_cross[1] = 0;
    tap_ok(sd_unet_create_from_weights(&u, &c, &m.w, be, &err) != 0 &&
               strstr(err.msg, "does not use"),
           "weights the configuration does not use are reported");
    tap_diag("%s", err.msg);
    tap_ok(sd_unet_check_shape(&m.c, 1, 0, 8, 77, &err) != 0 && strstr(err.msg, "positive"),
           "a zero latent side is refused: %s", err.msg);
    tap_ok(sd_unet_check_shape(&m.c, 1, 7, 9, 77, &err) == 0,
           "odd latent sides are accepted (upsamplers resize to the skips)");
    test_small_arena(&m);
    model_free(&m);
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    static const char *const names[] = {"tiny-sd2", "tiny-sd1", "odd"};
    be = sd_backend_cpu();
    if (!srcdir)
        srcdir = ".";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        test_snapshot(srcdir, names[i]);
    test_mismatch(srcdir);
    return tap_done();
}
