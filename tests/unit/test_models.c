/* Tests of the model weights, snapshot loader, CLIP text encoder and VAE forward:
 *   - the three golden snapshots (tests/data/models/{tiny-sd2,tiny-sd1,odd}, written by
 *     tests/reference/make_model_goldens.py with diffusers 0.42.1 / transformers 5.23) load
 *     through the snapshot loader (F16, BF16, F32 files; legacy VAE attention names; text
 *     encoder keys with and without "text_model.") and the text encoder, VAE encoder and VAE
 *     decoder reproduce every out.* and act.* golden with relative error <= 1e-5;
 *   - broken snapshots written here (missing, unexpected, wrongly shaped, I8 and truncated
 *     tensors, bad JSON, missing folders, a folder of the wrong kind) are rejected with a
 *     message naming the file and the tensor, never a crash; tolerated spellings load;
 *   - the forward passes give the same bits with 1 and 2 OpenMP threads, and the planned
 *     arena size is exactly what the forward uses;
 *   - sd_weights_init_random is a function of (seed, tensor index) in PyTorch element order.
 * Usage: test_models (data from $srcdir/tests/data/models). */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/clip.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/vae.h"
#include "sdtrain/weights.h"
#include "tap.h"

#define TOL 1e-5

static const sd_backend *be;
static char models_dir[1024];
static char tmpdir[64];

/* ---- helpers ------------------------------------------------------------------------------ */

static double rel_err(const float *x, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!(num == num)) /* NaN */
        return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* A golden tensor as fp32 (NULL if absent); shape into shape/ndim when given. */
static float *golden(const sd_st_file *f, const char *name, int64_t *shape, int *ndim)
{
    const sd_st_tensor *t = sd_st_find(f, name);
    sd_err err;
    float *x;
    if (!t)
        return NULL;
    x = sd_xmalloc((size_t)(t->numel ? t->numel : 1) * sizeof *x);
    SD_CHECK(sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err) == 0, "%s", err.msg);
    if (shape)
        memcpy(shape, t->shape, sizeof t->shape);
    if (ndim)
        *ndim = t->ndim;
    return x;
}

static float *nchw_to_nhwc(const float *x, int n, int c, int h, int w)
{
    float *y = sd_xmalloc((size_t)n * c * h * w * sizeof *y);
    sd_nchw_to_nhwc(be, n, c, h, w, x, y);
    return y;
}

static float *nhwc_to_nchw(const float *x, int n, int c, int h, int w)
{
    float *y = sd_xmalloc((size_t)n * c * h * w * sizeof *y);
    sd_nhwc_to_nchw(be, n, c, h, w, x, y);
    return y;
}

/* Compares an NHWC result with an NCHW golden (or a token sequence with a [n, t, c] golden). */
static void compare(const char *what, const float *ours_nhwc, const sd_st_file *g,
                    const char *name, int n, int h, int w, int c, int tokens)
{
    int64_t shape[SD_TENSOR_MAX_DIMS];
    int ndim;
    float *ref = golden(g, name, shape, &ndim);
    float *ours;
    double e;
    if (!tap_ok(ref != NULL, "%s: golden has %s", what, name))
        return;
    if (tokens) {
        /* [n, t, c]; a pooled output [n, c] is passed as t = 1 */
        int ok = ndim == 3 ? shape[0] == n && shape[1] == w && shape[2] == c
                           : ndim == 2 && w == 1 && shape[0] == n && shape[1] == c;
        if (!tap_ok(ok,
                    "%s: %s has shape [%d, %d, %d]", what, name, n, w, c)) {
            free(ref);
            return;
        }
        e = rel_err(ours_nhwc, ref, (size_t)n * w * c);
    } else {
        if (!tap_ok(ndim == 4 && shape[0] == n && shape[1] == c && shape[2] == h && shape[3] == w,
                    "%s: %s has shape [%d, %d, %d, %d]", what, name, n, c, h, w)) {
            free(ref);
            return;
        }
        ours = nhwc_to_nchw(ours_nhwc, n, c, h, w);
        e = rel_err(ours, ref, (size_t)n * c * h * w);
        free(ours);
    }
    tap_ok(e <= TOL, "%s: %s relative error %.3g (<= %g)", what, name, e, TOL);
    free(ref);
}

typedef struct tap_ctx {
    const char *what;
    const sd_st_file *golden;
    int tokens;
    int seen;
} tap_ctx;

/* Compares every activation the golden file has (act.<name>) as it goes by. */
static void tap_compare(void *user, const char *name, const void *x, int n, int h, int w, int c)
{
    tap_ctx *t = user;
    char key[160];
    snprintf(key, sizeof key, "act.%s", name);
    if (!sd_st_find(t->golden, key))
        return;
    t->seen++;
    compare(t->what, x, t->golden, key, n, h, w, c, t->tokens);
}

static int open_golden(const char *snap, const char *module, sd_st_file *g)
{
    char path[1200];
    sd_err err;
    int rc;
    snprintf(path, sizeof path, "%s/%s/golden/%s.safetensors", models_dir, snap, module);
    rc = sd_st_open(path, g, &err);
    return tap_ok(rc == 0, "%s: golden %s opens (%s)", snap, module, rc == 0 ? "ok" : err.msg)
               ? 0
               : -1;
}

static int count_golden_acts(const sd_st_file *g)
{
    int n = 0;
    for (size_t i = 0; i < sd_st_count(g); i++)
        n += !strncmp(sd_st_tensor_at(g, i)->name, "act.", 4);
    return n;
}

/* ---- golden parity ------------------------------------------------------------------------ */

static void test_text_encoder(const char *snap, const sd_snapshot *s)
{
    sd_clip_config c;
    sd_weights w;
    sd_clip *m = NULL;
    sd_st_file g;
    sd_err err;
    sd_arena a;
    int eos, B, T;
    int32_t *ids;
    float *out, *pooled;
    char what[96];
    const sd_st_tensor *ti;
    tap_ctx tc;
    sd_clip_tap tap;

    snprintf(what, sizeof what, "%s text-encoder", snap);
    if (!tap_ok(sd_snapshot_load_text_encoder(s, NULL, &c, &eos, &w, &err) == 0,
                "%s: loads", what)) {
        tap_diag("%s", err.msg);
        return;
    }
    if (!tap_ok(sd_clip_create_from_weights(&m, &c, &w, be, &err) == 0, "%s: model resolves",
                what)) {
        tap_diag("%s", err.msg);
        sd_weights_free(&w);
        return;
    }
    if (open_golden(snap, "text-encoder", &g)) {
        sd_clip_free(m);
        sd_weights_free(&w);
        return;
    }
    ti = sd_st_find(&g, "input_ids");
    SD_CHECK(ti && ti->dtype == SD_ST_I32 && ti->ndim == 2, "input_ids");
    B = (int)ti->shape[0];
    T = (int)ti->shape[1];
    ids = sd_xmalloc((size_t)B * T * sizeof *ids);
    SD_CHECK(sd_st_tensor_read_raw(ti, ids, ti->nbytes, &err) == 0, "%s", err.msg);
    out = sd_xmalloc((size_t)B * T * c.hidden_size * sizeof *out);
    pooled = sd_xmalloc((size_t)B * c.hidden_size * sizeof *pooled);
    SD_CHECK(sd_arena_init(&a, sd_clip_scratch_bytes(&c, be, B, T), 0) == 0, "arena");
    tc = (tap_ctx){what, &g, 1, 0};
    tap = (sd_clip_tap){tap_compare, &tc};
    sd_clip_forward(m, B, T, ids, out, &a, &tap);
    compare(what, out, &g, "out.last_hidden_state", B, 1, T, c.hidden_size, 1);
    sd_clip_pool(m, B, T, ids, eos, out, pooled);
    compare(what, pooled, &g, "out.pooler_output", B, 1, 1, c.hidden_size, 1);
    tap_ok(tc.seen == count_golden_acts(&g), "%s: all %d act.* goldens compared", what, tc.seen);
    sd_arena_free(&a);
    free(ids);
    free(out);
    free(pooled);
    sd_st_close(&g);
    sd_clip_free(m);
    sd_weights_free(&w);
}

static void test_vae(const char *snap, const sd_snapshot *s)
{
    sd_vae_config c;
    sd_weights w;
    sd_vae *m = NULL;
    sd_st_file g;
    sd_err err;
    sd_arena a;
    char what[96];
    int64_t shape[SD_TENSOR_MAX_DIMS];
    tap_ctx tc;
    sd_vae_tap tap;

    if (!tap_ok(sd_snapshot_load_vae(s, NULL, &c, &w, &err) == 0, "%s vae: loads", snap)) {
        tap_diag("%s", err.msg);
        return;
    }
    if (!tap_ok(sd_vae_create_from_weights(&m, &c, &w, be, &err) == 0, "%s vae: model resolves",
                snap)) {
        tap_diag("%s", err.msg);
        sd_weights_free(&w);
        return;
    }

    /* encode */
    snprintf(what, sizeof what, "%s vae-encode", snap);
    if (open_golden(snap, "vae-encode", &g) == 0) {
        float *img = golden(&g, "images", shape, NULL), *x, *mom, *mean, *logvar;
        const int B = (int)shape[0], C = (int)shape[1], H = (int)shape[2], W = (int)shape[3];
        const int L = c.latent_channels;
        int lh, lw;
        SD_CHECK(sd_vae_check_image_shape(&c, B, H, W, &lh, &lw, &err) == 0, "%s", err.msg);
        x = nchw_to_nhwc(img, B, C, H, W);
        mom = sd_xmalloc((size_t)B * lh * lw * 2 * L * sizeof *mom);
        mean = sd_xmalloc((size_t)B * lh * lw * L * sizeof *mean);
        logvar = sd_xmalloc((size_t)B * lh * lw * L * sizeof *logvar);
        SD_CHECK(sd_arena_init(&a, sd_vae_encode_scratch_bytes(&c, be, B, H, W), 0) == 0, "arena");
        tc = (tap_ctx){what, &g, 0, 0};
        tap = (sd_vae_tap){tap_compare, &tc};
        sd_vae_encode(m, B, H, W, x, mom, &a, &tap);
        compare(what, mom, &g, "out.latent_dist.parameters", B, lh, lw, 2 * L, 0);
        sd_vae_moments_split_host((int64_t)B * lh * lw, L, mom, mean, logvar);
        compare(what, mean, &g, "out.latent_dist.mean", B, lh, lw, L, 0);
        compare(what, logvar, &g, "out.latent_dist.logvar", B, lh, lw, L, 0);
        tap_ok(tc.seen == count_golden_acts(&g), "%s: all %d act.* goldens compared", what,
               tc.seen);
        sd_arena_free(&a);
        free(img);
        free(x);
        free(mom);
        free(mean);
        free(logvar);
        sd_st_close(&g);
    }

    /* decode */
    snprintf(what, sizeof what, "%s vae-decode", snap);
    if (open_golden(snap, "vae-decode", &g) == 0) {
        float *lat = golden(&g, "latents", shape, NULL), *x, *img;
        const int B = (int)shape[0], C = (int)shape[1], h = (int)shape[2], wd = (int)shape[3];
        int oh, ow;
        SD_CHECK(sd_vae_check_latent_shape(&c, B, h, wd, &oh, &ow, &err) == 0, "%s", err.msg);
        x = nchw_to_nhwc(lat, B, C, h, wd);
        img = sd_xmalloc((size_t)B * oh * ow * c.out_channels * sizeof *img);
        SD_CHECK(sd_arena_init(&a, sd_vae_decode_scratch_bytes(&c, be, B, h, wd), 0) == 0, "arena");
        tc = (tap_ctx){what, &g, 0, 0};
        tap = (sd_vae_tap){tap_compare, &tc};
        sd_vae_decode(m, B, h, wd, x, img, &a, &tap);
        compare(what, img, &g, "out.sample", B, oh, ow, c.out_channels, 0);
        tap_ok(tc.seen == count_golden_acts(&g), "%s: all %d act.* goldens compared", what,
               tc.seen);
        sd_arena_free(&a);
        free(lat);
        free(x);
        free(img);
        sd_st_close(&g);
    }
    sd_vae_free(m);
    sd_weights_free(&w);
}

static void test_goldens(void)
{
    static const char *snaps[] = {"tiny-sd2", "tiny-sd1", "odd"};
    for (size_t i = 0; i < sizeof snaps / sizeof snaps[0]; i++) {
        char path[1200];
        sd_snapshot s;
        sd_err err;
        snprintf(path, sizeof path, "%s/%s", models_dir, snaps[i]);
        if (!tap_ok(sd_snapshot_open(&s, path, &err) == 0, "%s: snapshot opens", snaps[i])) {
            tap_diag("%s", err.msg);
            continue;
        }
        tap_ok(s.has_model_index && !s.is_component && s.listed[SD_COMPONENT_VAE] &&
                   s.listed[SD_COMPONENT_TEXT_ENCODER],
               "%s: model_index.json lists vae and text_encoder", snaps[i]);
        test_text_encoder(snaps[i], &s);
        test_vae(snaps[i], &s);
        sd_snapshot_close(&s);
    }
}

/* ---- broken and tolerated snapshots ------------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    long n;
    char *buf;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = sd_xmalloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static void write_text(const char *path, const char *text, size_t len)
{
    FILE *f = fopen(path, "wb");
    SD_CHECK(f && fwrite(text, 1, len, f) == len && fclose(f) == 0, "cannot write %s", path);
}

typedef enum {
    MOD_NONE,
    MOD_MISSING,     /* drop `target` */
    MOD_UNEXPECTED,  /* add `target` (a new name) */
    MOD_SHAPE,       /* `target` with one more element */
    MOD_DTYPE_I8,    /* `target` stored as I8 */
    MOD_TRUNCATE,    /* the file cut short */
    MOD_SQUEEZE,     /* VAE attention weights stored as [C, C, 1, 1] */
    MOD_POSITION_IDS /* a text encoder with the old I64 position_ids buffer */
} mod_kind;

/* Writes <tmpdir>/<name>/ as a copy of the component folder `src` (config.json and weights)
 * with one modification; returns the folder. */
static const char *make_component(const char *name, const char *src, const char *weights,
                                  mod_kind mod, const char *target)
{
    static char dir[1200];
    char path[1300], out[1300];
    size_t len;
    char *cfg;
    sd_st_file f;
    sd_st_writer *wr = sd_st_writer_new();
    sd_err err;
    void *extra[4] = {0};
    int nextra = 0;

    snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
    SD_CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    snprintf(path, sizeof path, "%s/config.json", src);
    cfg = read_file(path, &len);
    SD_CHECK(cfg != NULL, "read %s", path);
    snprintf(out, sizeof out, "%s/config.json", dir);
    write_text(out, cfg, len);
    free(cfg);
    snprintf(path, sizeof path, "%s/%s", src, weights);
    SD_CHECK(sd_st_open(path, &f, &err) == 0, "%s", err.msg);
    for (size_t i = 0; i < sd_st_count(&f); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(&f, i);
        int is_target = target && !strcmp(t->name, target);
        int64_t shape[SD_TENSOR_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (mod == MOD_MISSING && is_target)
            continue;
        if (mod == MOD_SHAPE && is_target) {
            /* one more element in the last dimension of every row */
            size_t es = t->nbytes / (size_t)t->numel;
            size_t bytes = t->nbytes + es * (size_t)(t->numel / t->shape[t->ndim - 1]);
            unsigned char *d = sd_xcalloc(bytes, 1);
            memcpy(d, t->data, t->nbytes);
            shape[t->ndim - 1]++;
            extra[nextra++] = d;
            SD_CHECK(sd_st_writer_add(wr, t->name, t->dtype, t->ndim, shape, d, bytes, &err) == 0,
                     "%s", err.msg);
            continue;
        }
        if (mod == MOD_DTYPE_I8 && is_target) {
            unsigned char *d = sd_xcalloc((size_t)t->numel, 1);
            extra[nextra++] = d;
            SD_CHECK(sd_st_writer_add(wr, t->name, SD_ST_I8, t->ndim, shape, d, (size_t)t->numel,
                                      &err) == 0, "%s", err.msg);
            continue;
        }
        if (mod == MOD_SQUEEZE && t->ndim == 2 && strstr(t->name, "mid_block.attentions.0.")) {
            shape[2] = shape[3] = 1;
            SD_CHECK(sd_st_writer_add(wr, t->name, t->dtype, 4, shape, t->data, t->nbytes, &err) == 0,
                     "%s", err.msg);
            continue;
        }
        SD_CHECK(sd_st_writer_add(wr, t->name, t->dtype, t->ndim, shape, t->data, t->nbytes,
                                  &err) == 0, "%s", err.msg);
    }
    if (mod == MOD_UNEXPECTED) {
        static const uint16_t four[4] = {0x3c00, 0x3c00, 0x3c00, 0x3c00};
        SD_CHECK(sd_st_writer_add(wr, target, SD_ST_F16, 1, (int64_t[]){4}, four, sizeof four,
                                  &err) == 0, "%s", err.msg);
    }
    if (mod == MOD_POSITION_IDS) {
        int64_t *pos = sd_xmalloc(77 * sizeof *pos);
        for (int i = 0; i < 77; i++)
            pos[i] = i;
        extra[nextra++] = pos;
        SD_CHECK(sd_st_writer_add(wr, target, SD_ST_I64, 2, (int64_t[]){1, 77}, pos,
                                  77 * sizeof *pos, &err) == 0, "%s", err.msg);
    }
    snprintf(out, sizeof out, "%s/%s", dir, weights);
    SD_CHECK(sd_st_writer_write(wr, out, &err) == 0, "%s", err.msg);
    sd_st_writer_free(wr);
    sd_st_close(&f);
    for (int i = 0; i < nextra; i++)
        free(extra[i]);
    if (mod == MOD_TRUNCATE) {
        struct stat st;
        SD_CHECK(stat(out, &st) == 0 && truncate(out, st.st_size - 100) == 0, "truncate %s", out);
    }
    return dir;
}

/* Loads `dir` as a VAE (or text encoder) expecting failure; the message must contain every
 * fragment given (NULL-terminated). */
static void expect_fail(const char *what, const char *dir, sd_component comp, ...)
{
    sd_snapshot s;
    sd_err err;
    sd_weights w;
    int rc;
    va_list ap;
    const char *frag;
    int all = 1;
    char missing[200] = "";
    memset(&err, 0, sizeof err);
    rc = sd_snapshot_open(&s, dir, &err);
    if (rc == 0) {
        if (comp == SD_COMPONENT_VAE) {
            sd_vae_config c;
            rc = sd_snapshot_load_vae(&s, NULL, &c, &w, &err);
        } else if (comp == SD_COMPONENT_UNET) {
            sd_unet_config c;
            rc = sd_snapshot_load_unet(&s, NULL, &c, &w, &err);
        } else {
            sd_clip_config c;
            rc = sd_snapshot_load_text_encoder(&s, NULL, &c, NULL, &w, &err);
        }
        if (rc == 0)
            sd_weights_free(&w);
        sd_snapshot_close(&s);
    }
    va_start(ap, comp);
    while ((frag = va_arg(ap, const char *)) != NULL)
        if (!strstr(err.msg, frag)) {
            all = 0;
            snprintf(missing, sizeof missing, "%s", frag);
        }
    va_end(ap);
    tap_ok(rc != 0 && all, "%s is rejected%s%s", what, all ? "" : ", message lacks ", missing);
    tap_diag("  %s", err.msg);
}

static void test_broken(void)
{
    char src[1200], path[1300], te[1200];
    const char *dir;
    snprintf(src, sizeof src, "%s/tiny-sd2/vae", models_dir);
    snprintf(te, sizeof te, "%s/odd/text_encoder", models_dir);
    const char *wts = "diffusion_pytorch_model.safetensors";

    dir = make_component("missing", src, wts, MOD_MISSING, "encoder.conv_in.bias");
    snprintf(path, sizeof path, "%s/%s", dir, wts);
    expect_fail("a missing tensor", dir, SD_COMPONENT_VAE, path, "missing (1)",
                "'encoder.conv_in.bias'", (char *)NULL);

    dir = make_component("unexpected", src, wts, MOD_UNEXPECTED, "encoder.conv_in.extra");
    snprintf(path, sizeof path, "%s/%s", dir, wts);
    expect_fail("an unexpected tensor", dir, SD_COMPONENT_VAE, path, "unexpected (1)",
                "'encoder.conv_in.extra'", (char *)NULL);

    dir = make_component("shape", src, wts, MOD_SHAPE, "decoder.conv_out.weight");
    snprintf(path, sizeof path, "%s/%s", dir, wts);
    expect_fail("a wrongly shaped tensor", dir, SD_COMPONENT_VAE, path, "'decoder.conv_out.weight'",
                "[3, 16, 3, 4]", "expected [3, 16, 3, 3]", "config.json", (char *)NULL);

    dir = make_component("dtype", src, wts, MOD_DTYPE_I8, "encoder.mid_block.attentions.0.query.bias");
    snprintf(path, sizeof path, "%s/%s", dir, wts);
    expect_fail("an I8 tensor", dir, SD_COMPONENT_VAE, path,
                "'encoder.mid_block.attentions.0.query.bias' is I8", (char *)NULL);

    dir = make_component("truncated", src, wts, MOD_TRUNCATE, NULL);
    snprintf(path, sizeof path, "%s/%s", dir, wts);
    expect_fail("a truncated file", dir, SD_COMPONENT_VAE, path, (char *)NULL);

    /* many problems at once: the message stays within sd_err and keeps every category */
    {
        sd_snapshot s;
        sd_err err;
        sd_weights w;
        sd_unet_config uc;
        char usrc[1200];
        snprintf(usrc, sizeof usrc, "%s/tiny-sd2/unet", models_dir);
        dir = make_component("as-vae", usrc, wts, MOD_NONE, NULL);
        /* a U-Net's weights under a VAE config: hundreds missing and unexpected */
        snprintf(path, sizeof path, "%s/config.json", dir);
        {
            size_t len;
            char cfgp[1300], *cfg;
            snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
            cfg = read_file(cfgp, &len);
            write_text(path, cfg, len);
            free(cfg);
        }
        tap_ok(sd_snapshot_open(&s, dir, &err) == 0, "a VAE folder with U-Net weights opens");
        tap_ok(sd_snapshot_load_vae(&s, NULL, (sd_vae_config[1]){0}, &w, &err) != 0 &&
                   strstr(err.msg, "missing (") && strstr(err.msg, "unexpected (") &&
                   strstr(err.msg, "more") && strlen(err.msg) < sizeof err.msg,
               "U-Net weights as a VAE: one message lists missing and unexpected with counts");
        tap_diag("  %s", err.msg);
        (void)uc;
        sd_snapshot_close(&s);
    }

    /* configuration and layout errors */
    {
        char bad[1000];
        dir = make_component("badjson", src, wts, MOD_NONE, NULL);
        snprintf(bad, sizeof bad, "%s/config.json", dir);
        write_text(bad, "{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [16, 32", 60);
        expect_fail("invalid JSON in config.json", dir, SD_COMPONENT_VAE, bad, "JSON", (char *)NULL);

        snprintf(bad, sizeof bad, "%s/nowhere", tmpdir);
        expect_fail("a missing snapshot folder", bad, SD_COMPONENT_VAE, bad, "no such", (char *)NULL);

        snprintf(bad, sizeof bad, "%s/empty-snapshot", tmpdir);
        SD_CHECK(mkdir(bad, 0755) == 0, "mkdir");
        expect_fail("a folder that is no snapshot", bad, SD_COMPONENT_VAE, bad, "not a diffusers",
                    (char *)NULL);
        snprintf(path, sizeof path, "%s/model_index.json", bad);
        write_text(path, "{\"vae\": [\"diffusers\", \"AutoencoderKL\"]}", 39);
        snprintf(path, sizeof path, "%s/vae", bad);
        expect_fail("a snapshot without vae/", bad, SD_COMPONENT_VAE, path, "no such folder",
                    (char *)NULL);
        snprintf(path, sizeof path, "%s/model_index.json", bad);
        write_text(path, "{\"vae\": [\"diffusers\", \"AutoencoderTiny\"]}", 41);
        expect_fail("a snapshot whose VAE is another class", bad, SD_COMPONENT_VAE, path,
                    "AutoencoderTiny", (char *)NULL);
        write_text(path, "[1, 2", 5);
        expect_fail("invalid model_index.json", bad, SD_COMPONENT_VAE, path, "invalid JSON",
                    (char *)NULL);

        snprintf(path, sizeof path, "%s/tiny-sd2/vae", models_dir);
        expect_fail("a VAE folder loaded as a U-Net", path, SD_COMPONENT_UNET, "vae folder, not a unet",
                    (char *)NULL);
        snprintf(path, sizeof path, "%s/tiny-sd2/text_encoder", models_dir);
        expect_fail("a text encoder folder loaded as a VAE", path, SD_COMPONENT_VAE,
                    "text_encoder folder, not a vae", (char *)NULL);
    }

    /* tolerated spellings: [C, C, 1, 1] attention weights, position_ids */
    {
        sd_snapshot s0, s1;
        sd_weights w0, w1;
        sd_vae_config c0, c1;
        sd_clip_config cc;
        sd_err err;
        int ok;
        dir = make_component("squeeze", src, wts, MOD_SQUEEZE, NULL);
        ok = sd_snapshot_open(&s0, src, &err) == 0 && sd_snapshot_open(&s1, dir, &err) == 0 &&
             sd_snapshot_load_vae(&s0, NULL, &c0, &w0, &err) == 0 &&
             sd_snapshot_load_vae(&s1, NULL, &c1, &w1, &err) == 0;
        tap_ok(ok && w0.table.total_floats == w1.table.total_floats &&
                   !memcmp(w0.data, w1.data, w0.table.total_floats * sizeof(float)),
               "VAE attention weights stored as [C, C, 1, 1] load like [C, C] (%s)",
               ok ? "same values" : err.msg);
        if (ok) {
            sd_weights_free(&w0);
            sd_weights_free(&w1);
            sd_snapshot_close(&s0);
            sd_snapshot_close(&s1);
        }
        dir = make_component("position-ids", te, "model.safetensors", MOD_POSITION_IDS,
                             "embeddings.position_ids");
        ok = sd_snapshot_open(&s0, dir, &err) == 0 &&
             sd_snapshot_load_text_encoder(&s0, NULL, &cc, NULL, &w0, &err) == 0;
        tap_ok(ok, "a text encoder file with position_ids loads (%s)", ok ? "ignored" : err.msg);
        if (ok) {
            sd_weights_free(&w0);
            sd_snapshot_close(&s0);
        }
        /* CLIPTextModelWithProjection's files carry text_projection.weight, which SD never uses */
        dir = make_component("text-projection", te, "model.safetensors", MOD_UNEXPECTED,
                             "text_projection.weight");
        ok = sd_snapshot_open(&s0, dir, &err) == 0 &&
             sd_snapshot_load_text_encoder(&s0, NULL, &cc, NULL, &w0, &err) == 0;
        tap_ok(ok, "a text encoder file with text_projection.weight loads (%s)",
               ok ? "ignored" : err.msg);
        if (ok) {
            sd_weights_free(&w0);
            sd_snapshot_close(&s0);
        }
    }
}

/* A sharded copy of a component (two shards and a diffusers index) loads like the single file;
 * a bad tensor in a shard is reported with the shard's name. */
static void test_sharded(void)
{
    char src[1200], dir[1200], path[1300], cfgp[1300];
    const char *wts = "diffusion_pytorch_model.safetensors";
    sd_st_file f;
    sd_st_writer *w0 = sd_st_writer_new(), *w1 = sd_st_writer_new();
    sd_err err;
    FILE *idx;
    size_t len;
    char *cfg;
    sd_snapshot s0 = {0}, s1 = {0};
    sd_weights a, b;
    sd_vae_config c;
    int ok;
    unsigned char *bad = NULL;

    snprintf(src, sizeof src, "%s/tiny-sd2/vae", models_dir);
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    SD_CHECK(mkdir(dir, 0755) == 0, "mkdir");
    snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
    cfg = read_file(cfgp, &len);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, cfg, len);
    free(cfg);
    snprintf(path, sizeof path, "%s/%s", src, wts);
    SD_CHECK(sd_st_open(path, &f, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/%s.index.json", dir, wts);
    idx = fopen(path, "w");
    SD_CHECK(idx != NULL, "index");
    fprintf(idx, "{\"metadata\": {}, \"weight_map\": {");
    for (size_t i = 0; i < sd_st_count(&f); i++) {
        const sd_st_tensor *t = sd_st_tensor_at(&f, i);
        SD_CHECK(sd_st_writer_add(i % 2 ? w1 : w0, t->name, t->dtype, t->ndim, t->shape, t->data,
                                  t->nbytes, &err) == 0, "%s", err.msg);
        fprintf(idx, "%s\"%s\": \"shard-%zu.safetensors\"", i ? ", " : "", t->name, i % 2);
    }
    fprintf(idx, "}}\n");
    SD_CHECK(fclose(idx) == 0, "index");
    snprintf(path, sizeof path, "%s/shard-0.safetensors", dir);
    SD_CHECK(sd_st_writer_write(w0, path, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/shard-1.safetensors", dir);
    SD_CHECK(sd_st_writer_write(w1, path, &err) == 0, "%s", err.msg);
    ok = sd_snapshot_open(&s0, src, &err) == 0 && sd_snapshot_open(&s1, dir, &err) == 0 &&
         sd_snapshot_load_vae(&s0, NULL, &c, &a, &err) == 0 &&
         sd_snapshot_load_vae(&s1, NULL, &c, &b, &err) == 0;
    tap_ok(ok && !memcmp(a.data, b.data, a.table.total_floats * sizeof(float)),
           "a sharded VAE (index + 2 shards) loads like the single file (%s)",
           ok ? "same values" : err.msg);
    if (ok) {
        sd_weights_free(&a);
        sd_weights_free(&b);
    }
    /* the same with an I8 tensor in shard 1 */
    sd_st_writer_free(w1);
    w1 = sd_st_writer_new();
    for (size_t i = 1; i < sd_st_count(&f); i += 2) {
        const sd_st_tensor *t = sd_st_tensor_at(&f, i);
        if (i == 1) {
            bad = sd_xcalloc((size_t)t->numel, 1);
            SD_CHECK(sd_st_writer_add(w1, t->name, SD_ST_I8, t->ndim, t->shape, bad,
                                      (size_t)t->numel, &err) == 0, "%s", err.msg);
            snprintf(cfgp, sizeof cfgp, "'%s' is I8 in ", t->name);
        } else {
            SD_CHECK(sd_st_writer_add(w1, t->name, t->dtype, t->ndim, t->shape, t->data,
                                      t->nbytes, &err) == 0, "%s", err.msg);
        }
    }
    snprintf(path, sizeof path, "%s/shard-1.safetensors", dir);
    SD_CHECK(sd_st_writer_write(w1, path, &err) == 0, "%s", err.msg);
    ok = sd_snapshot_load_vae(&s1, NULL, &c, &b, &err) != 0 && strstr(err.msg, cfgp) &&
         strstr(err.msg, "shard-1.safetensors") && strstr(err.msg, ".index.json");
    tap_ok(ok, "a bad tensor in a shard names the index, the tensor and the shard");
    tap_diag("  %s", err.msg);
    free(bad);
    sd_st_writer_free(w0);
    sd_st_writer_free(w1);
    sd_st_close(&f);
    sd_snapshot_close(&s0);
    sd_snapshot_close(&s1);
}

/* ---- thread-count independence and the memory plan ---------------------------------------- */

static int set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
    return 1;
#else
    (void)n;
    return 0;
#endif
}

static float *uniform(int64_t n, uint32_t site)
{
    float *x = sd_xmalloc((size_t)n * sizeof *x);
    SD_CHECK(sd_rng_fill_uniform(7, SD_RNG_PURPOSE(SD_RNG_USER, site), 0, 0, x, (size_t)n) == 0,
             "rng");
    for (int64_t i = 0; i < n; i++)
        x[i] = 2 * x[i] - 1;
    return x;
}

/* Runs the forward in an arena of exactly the planned size; *used receives its high water. */
static void vae_run(const sd_vae *m, int decode, int B, int h, int w, const float *in, float *out,
                    size_t *planned, size_t *used)
{
    sd_arena a;
    const sd_vae_config *c = sd_vae_get_config(m);
    *planned = decode ? sd_vae_decode_scratch_bytes(c, be, B, h, w)
                      : sd_vae_encode_scratch_bytes(c, be, B, h, w);
    SD_CHECK(sd_arena_init(&a, *planned, 0) == 0, "arena");
    if (decode)
        sd_vae_decode(m, B, h, w, in, out, &a, NULL);
    else
        sd_vae_encode(m, B, h, w, in, out, &a, NULL);
    *used = sd_arena_high_water(&a);
    sd_arena_free(&a);
}

static void test_threads_and_plan(void)
{
    sd_vae_config vc;
    sd_clip_config cc;
    sd_param_table t;
    sd_weights vw, cw;
    sd_vae *vae;
    sd_clip *clip;
    sd_err err;
    const int B = 2, H = 40, W = 36;
    int lh, lw;
    size_t planned, used;

    if (!set_threads(1)) {
        tap_ok(1, "# SKIP thread-count independence: built without OpenMP");
        return;
    }
    sd_vae_config_sd2_base(&vc);
    vc.n_levels = 3;
    vc.block_out_channels[0] = 32;
    vc.block_out_channels[1] = 64;
    vc.block_out_channels[2] = 64;
    vc.layers_per_block = 1;
    vc.norm_num_groups = 16;
    sd_vae_params(&vc, &t);
    sd_weights_init(&vw, &t);
    sd_weights_init_random(&vw, 11);
    SD_CHECK(sd_vae_create_from_weights(&vae, &vc, &vw, be, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_vae_check_image_shape(&vc, B, H, W, &lh, &lw, &err) == 0, "%s", err.msg);
    {
        float *img = uniform((int64_t)B * H * W * 3, 1), *lat = uniform((int64_t)B * lh * lw * 4, 2);
        size_t nm = (size_t)B * lh * lw * 8, ni = (size_t)B * H * W * 3;
        float *m1 = sd_xmalloc(nm * 4), *m2 = sd_xmalloc(nm * 4);
        float *d1 = sd_xmalloc(ni * 4), *d2 = sd_xmalloc(ni * 4);
        set_threads(1);
        vae_run(vae, 0, B, H, W, img, m1, &planned, &used);
        tap_ok(used + SD_ARENA_DEFAULT_ALIGNMENT == planned,
               "VAE encode uses exactly the planned arena (%zu bytes + slack)", used);
        vae_run(vae, 1, B, lh, lw, lat, d1, &planned, &used);
        tap_ok(used + SD_ARENA_DEFAULT_ALIGNMENT == planned,
               "VAE decode uses exactly the planned arena (%zu bytes + slack)", used);
        set_threads(2);
        vae_run(vae, 0, B, H, W, img, m2, &planned, &used);
        vae_run(vae, 1, B, lh, lw, lat, d2, &planned, &used);
        tap_ok(!memcmp(m1, m2, nm * 4), "VAE encode: 1 and 2 threads give the same bits");
        tap_ok(!memcmp(d1, d2, ni * 4), "VAE decode: 1 and 2 threads give the same bits");
        free(img);
        free(lat);
        free(m1);
        free(m2);
        free(d1);
        free(d2);
    }
    {
        /* A batch whose convolution tensors pass the backend's limit (cuDNN: 2^31 - 1 elements;
         * set here on the CPU by SDTRAIN_TEST_VAE_MAX_ELEMS) runs in passes of the most that
         * fit: 5 samples with room for 2 give the bits of three calls of 2, 2 and 1 (one call
         * of 5 differs from them in the last bits: the CPU's GEMMs block by batch size). */
        const int B5 = 5, cut[4] = {0, 2, 4, 5};
        float *img = uniform((int64_t)B5 * H * W * 3, 4), *lat = uniform((int64_t)B5 * lh * lw * 4, 5);
        const size_t sm = (size_t)lh * lw * 8, si = (size_t)H * W * 3, sl = (size_t)lh * lw * 4;
        size_t one[2], split[2];
        float *m1 = sd_xmalloc(B5 * sm * 4), *m2 = sd_xmalloc(B5 * sm * 4);
        float *d1 = sd_xmalloc(B5 * si * 4), *d2 = sd_xmalloc(B5 * si * 4);
        const int64_t pe = sd_vae_conv_elems(&vc, 0, H, W), pd = sd_vae_conv_elems(&vc, 1, lh, lw);
        char lim[32];
        set_threads(2);
        tap_ok(pe == (int64_t)(H + 2) * (W + 2) * 32 && pd == (int64_t)(H + 2) * (W + 2) * 64,
               "largest convolution tensor of one sample: encode %lld (the first level's padded "
               "input, 42 x 38 x 32), decode %lld (42 x 38 x 64)", (long long)pe, (long long)pd);
        for (int k = 0; k < 3; k++) {
            const int n = cut[k + 1] - cut[k];
            vae_run(vae, 0, n, H, W, img + cut[k] * si, m1 + cut[k] * sm, &one[0], &used);
            vae_run(vae, 1, n, lh, lw, lat + cut[k] * sl, d1 + cut[k] * si, &one[1], &used);
        }
        vae_run(vae, 0, B5, H, W, img, m2, &one[0], &used);
        vae_run(vae, 1, B5, lh, lw, lat, d2, &one[1], &used);
        tap_ok(sd_vae_pass_batch(&vc, be, 0, B5, H, W) == B5, "no limit on the CPU: one pass");
        snprintf(lim, sizeof lim, "%lld", (long long)(2 * pe + 1));
        setenv("SDTRAIN_TEST_VAE_MAX_ELEMS", lim, 1);
        tap_ok(sd_vae_pass_batch(&vc, be, 0, B5, H, W) == 2, "encode: a limit of %s elements "
               "takes 2 images a pass", lim);
        vae_run(vae, 0, B5, H, W, img, m2, &split[0], &used);
        tap_ok(!memcmp(m1, m2, B5 * sm * 4) && split[0] < one[0], "VAE encode of 5 in passes of "
               "2 + 2 + 1: the bits of three calls, in %zu of %zu scratch bytes", split[0], one[0]);
        snprintf(lim, sizeof lim, "%lld", (long long)(2 * pd + 1));
        setenv("SDTRAIN_TEST_VAE_MAX_ELEMS", lim, 1);
        tap_ok(sd_vae_pass_batch(&vc, be, 1, B5, lh, lw) == 2, "decode: a limit of %s elements "
               "takes 2 latents a pass", lim);
        vae_run(vae, 1, B5, lh, lw, lat, d2, &split[1], &used);
        tap_ok(!memcmp(d1, d2, B5 * si * 4) && split[1] < one[1], "VAE decode of 5 in passes of "
               "2 + 2 + 1: the bits of three calls, in %zu of %zu scratch bytes", split[1], one[1]);
        unsetenv("SDTRAIN_TEST_VAE_MAX_ELEMS");
        free(img);
        free(lat);
        free(m1);
        free(m2);
        free(d1);
        free(d2);
    }
    sd_vae_free(vae);
    sd_weights_free(&vw);

    sd_clip_config_sd2_base(&cc);
    cc.vocab_size = 1000;
    cc.hidden_size = 64;
    cc.intermediate_size = 160;
    cc.num_attention_heads = 4;
    cc.num_hidden_layers = 2;
    sd_clip_params(&cc, &t);
    sd_weights_init(&cw, &t);
    sd_weights_init_random(&cw, 12);
    SD_CHECK(sd_clip_create_from_weights(&clip, &cc, &cw, be, &err) == 0, "%s", err.msg);
    {
        const int T = 77;
        int32_t ids[2 * 77];
        size_t n = (size_t)B * T * cc.hidden_size;
        float *o1 = sd_xmalloc(n * 4), *o2 = sd_xmalloc(n * 4);
        sd_arena a;
        for (int i = 0; i < B * T; i++)
            ids[i] = (int32_t)sd_rng_below(3, SD_RNG_PURPOSE(SD_RNG_USER, 3), 0, 0, (uint32_t)i, 1000);
        set_threads(1);
        planned = sd_clip_scratch_bytes(&cc, be, B, T);
        SD_CHECK(sd_arena_init(&a, planned, 0) == 0, "arena");
        sd_clip_forward(clip, B, T, ids, o1, &a, NULL);
        tap_ok(sd_arena_high_water(&a) + SD_ARENA_DEFAULT_ALIGNMENT == planned,
               "text encoder uses exactly the planned arena (%zu bytes + slack)",
               sd_arena_high_water(&a));
        sd_arena_free(&a);
        set_threads(2);
        SD_CHECK(sd_arena_init(&a, sd_clip_scratch_bytes(&cc, be, B, T), 0) == 0, "arena");
        sd_clip_forward(clip, B, T, ids, o2, &a, NULL);
        sd_arena_free(&a);
        tap_ok(!memcmp(o1, o2, n * 4), "text encoder: 1 and 2 threads give the same bits");
        free(o1);
        free(o2);
    }
    sd_clip_free(clip);
    sd_weights_free(&cw);
}

/* ---- random initialization ----------------------------------------------------------------- */

static void test_init_random(void)
{
    sd_vae_config vc;
    sd_param_table t;
    sd_weights a, b;
    const sd_param *conv = NULL, *norm = NULL, *bias = NULL;
    size_t conv_i = 0;
    int same;
    sd_vae_config_sd2_base(&vc);
    vc.n_levels = 2;
    vc.block_out_channels[0] = 16;
    vc.block_out_channels[1] = 32;
    vc.norm_num_groups = 8;
    sd_vae_params(&vc, &t);
    sd_weights_init(&a, &t);
    sd_vae_params(&vc, &t);
    sd_weights_init(&b, &t);
    sd_weights_init_random(&a, 5);
    sd_weights_init_random(&b, 5);
    same = !memcmp(a.data, b.data, a.table.total_floats * sizeof(float));
    tap_ok(same, "random initialization is deterministic");
    sd_weights_init_random(&b, 6);
    tap_ok(memcmp(a.data, b.data, a.table.total_floats * sizeof(float)) != 0,
           "another seed gives other weights");
    for (size_t i = 0; i < a.table.n; i++) {
        const sd_param *p = &a.table.params[i];
        if (!conv && p->kind == SD_PARAM_CONV && p->shape[2] == 3) {
            conv = p;
            conv_i = i;
        }
        if (!norm && !strcmp(p->name, "encoder.conv_norm_out.weight"))
            norm = p;
        if (!bias && !strcmp(p->name, "encoder.conv_norm_out.bias"))
            bias = p;
    }
    SD_CHECK(conv && norm && bias, "params");
    {
        float *ref = sd_xmalloc(conv->numel * sizeof *ref), *perm = sd_xmalloc(conv->numel * sizeof *perm);
        float sd = (float)(1.0 / sqrt((double)(conv->shape[1] * conv->shape[2] * conv->shape[3])));
        int ok = 1;
        SD_CHECK(sd_rng_fill_normal(5, SD_RNG_PURPOSE(SD_RNG_INIT, 0), 0, conv_i, ref, conv->numel) == 0,
                 "rng");
        for (size_t k = 0; k < conv->numel; k++)
            ref[k] *= sd;
        sd_weight_from_torch(4, conv->shape, sizeof(float), ref, perm, NULL);
        ok = !memcmp(perm, a.data + conv->offset, conv->numel * sizeof(float));
        tap_ok(ok, "conv weight '%s' = N(0, 1/fan_in) of stream (seed, INIT, 0, %zu) in PyTorch "
               "order, permuted", conv->name, conv_i);
        free(ref);
        free(perm);
    }
    {
        int ok = 1;
        for (size_t k = 0; k < norm->numel; k++)
            ok &= a.data[norm->offset + k] == 1.0f && a.data[bias->offset + k] == 0.0f;
        tap_ok(ok, "norm weights are 1, biases 0");
    }
    tap_ok(sd_weights_find(&a, "encoder.conv_in.weight") == a.data + a.table.params[0].offset &&
               sd_weights_find(&a, "encoder.nothing") == NULL,
           "sd_weights_find by name");
    sd_weights_free(&a);
    sd_weights_free(&b);
}

static void test_pooled_index(void)
{
    const int32_t sd2[8] = {49406, 320, 1125, 49407, 0, 0, 0, 0};
    const int32_t sd1[8] = {49406, 320, 1125, 49407, 49407, 49407, 49407, 49407};
    const int32_t none[4] = {5, 9, 9, 1};
    tap_ok(sd_clip_pooled_index(sd2, 8, 2) == 3 && sd_clip_pooled_index(sd1, 8, 2) == 3,
           "pooled index, eos_token_id 2: first position of the largest id");
    tap_ok(sd_clip_pooled_index(sd2, 8, 49407) == 3 && sd_clip_pooled_index(sd1, 8, 49407) == 3,
           "pooled index, eos_token_id 49407: first eos");
    tap_ok(sd_clip_pooled_index(none, 4, 49407) == 0 && sd_clip_pooled_index(none, 4, 2) == 1 &&
               sd_clip_pooled_index(none, 4, -1) == 0,
           "pooled index without eos: 0 (argmax of all-false); argmax ties take the first");
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    char cmd[128];
    be = sd_backend_cpu();
    snprintf(models_dir, sizeof models_dir, "%s/tests/data/models", srcdir ? srcdir : ".");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sdtrain-test-models-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    test_goldens();
    test_broken();
    test_sharded();
    test_threads_and_plan();
    test_init_random();
    test_pooled_index();
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", tmpdir);
    return tap_done();
}
