/* VAE (AutoencoderKL) encoder and decoder forward on the op interface, with activation memory
 * planned by a dry run of the same code. */
#include "sdtrain/vae.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

#include "resolver.h"

#define VAE_EPS 1e-6f /* every GroupNorm of the diffusers VAE (resnet_eps, attention, conv_norm_out) */

/* ---- resolved parameters ---------------------------------------------------------------- */

typedef struct conv_p { /* conv or linear: weight and bias */
    const void *w, *b;
} conv_p;

typedef struct norm_p {
    const void *g, *b;
} norm_p;

typedef struct resnet_p {
    norm_p norm1, norm2;
    conv_p conv1, conv2, shortcut;
} resnet_p;

typedef struct attn_p {
    norm_p norm;
    conv_p q, k, v, o;
} attn_p;

typedef struct mid_p {
    resnet_p res[2];
    attn_p attn;
} mid_p;

struct sd_vae {
    sd_vae_config cfg;
    const sd_backend *be;
    conv_p enc_conv_in, enc_down[SD_MODEL_MAX_LEVELS], enc_conv_out, quant;
    resnet_p *enc_res; /* [level][layers_per_block] */
    mid_p enc_mid;
    norm_p enc_norm_out;
    conv_p dec_conv_in, dec_up[SD_MODEL_MAX_LEVELS], dec_conv_out, post_quant;
    resnet_p *dec_res; /* [up level][layers_per_block + 1] */
    mid_p dec_mid;
    norm_p dec_norm_out;
};

typedef sd_resolver resolver;

static const void *get(resolver *r, int ndim, const int64_t *shape, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static const void *get(resolver *r, int ndim, const int64_t *shape, const char *fmt, ...)
{
    const void *t;
    va_list ap;
    va_start(ap, fmt);
    t = sd_resolver_vget(r, ndim, shape, fmt, ap);
    va_end(ap);
    return t;
}

static conv_p get_conv(resolver *r, const char *prefix, int64_t cin, int64_t cout, int64_t k)
{
    conv_p c;
    c.w = get(r, 4, (int64_t[]){cout, cin, k, k}, "%s.weight", prefix);
    c.b = get(r, 1, (int64_t[]){cout}, "%s.bias", prefix);
    return c;
}

static conv_p get_linear(resolver *r, const char *prefix, int64_t in, int64_t out)
{
    conv_p c;
    c.w = get(r, 2, (int64_t[]){out, in}, "%s.weight", prefix);
    c.b = get(r, 1, (int64_t[]){out}, "%s.bias", prefix);
    return c;
}

static norm_p get_norm(resolver *r, const char *prefix, int64_t c)
{
    norm_p n;
    n.g = get(r, 1, (int64_t[]){c}, "%s.weight", prefix);
    n.b = get(r, 1, (int64_t[]){c}, "%s.bias", prefix);
    return n;
}

static resnet_p get_resnet(resolver *r, const char *p, int64_t cin, int64_t cout)
{
    char n[SD_PARAM_NAME_MAX];
    resnet_p x;
    memset(&x, 0, sizeof x);
    snprintf(n, sizeof n, "%s.norm1", p);
    x.norm1 = get_norm(r, n, cin);
    snprintf(n, sizeof n, "%s.conv1", p);
    x.conv1 = get_conv(r, n, cin, cout, 3);
    snprintf(n, sizeof n, "%s.norm2", p);
    x.norm2 = get_norm(r, n, cout);
    snprintf(n, sizeof n, "%s.conv2", p);
    x.conv2 = get_conv(r, n, cout, cout, 3);
    if (cin != cout) {
        snprintf(n, sizeof n, "%s.conv_shortcut", p);
        x.shortcut = get_conv(r, n, cin, cout, 1);
    }
    return x;
}

static mid_p get_mid(resolver *r, const char *side, int64_t c, int attention)
{
    char n[SD_PARAM_NAME_MAX];
    mid_p m;
    memset(&m, 0, sizeof m);
    if (attention) {
        snprintf(n, sizeof n, "%s.mid_block.attentions.0.group_norm", side);
        m.attn.norm = get_norm(r, n, c);
        snprintf(n, sizeof n, "%s.mid_block.attentions.0.to_q", side);
        m.attn.q = get_linear(r, n, c, c);
        snprintf(n, sizeof n, "%s.mid_block.attentions.0.to_k", side);
        m.attn.k = get_linear(r, n, c, c);
        snprintf(n, sizeof n, "%s.mid_block.attentions.0.to_v", side);
        m.attn.v = get_linear(r, n, c, c);
        snprintf(n, sizeof n, "%s.mid_block.attentions.0.to_out.0", side);
        m.attn.o = get_linear(r, n, c, c);
    }
    for (int j = 0; j < 2; j++) {
        snprintf(n, sizeof n, "%s.mid_block.resnets.%d", side, j);
        m.res[j] = get_resnet(r, n, c, c);
    }
    return m;
}

static int check_config(const sd_vae_config *c, sd_err *err)
{
    if (c->n_levels < 1 || c->n_levels > SD_MODEL_MAX_LEVELS)
        return sd_err_set(err, "VAE: %d levels (1..%d supported)", c->n_levels, SD_MODEL_MAX_LEVELS);
    if (c->layers_per_block < 1 || c->latent_channels < 1 || c->in_channels < 1 ||
        c->out_channels < 1 || c->norm_num_groups < 1)
        return sd_err_set(err, "VAE: layers_per_block, channel counts and norm_num_groups must "
                          "be positive");
    for (int i = 0; i < c->n_levels; i++)
        if (c->block_out_channels[i] < 1 || c->block_out_channels[i] % c->norm_num_groups)
            return sd_err_set(err, "VAE: block_out_channels[%d] = %d is not a positive multiple "
                              "of norm_num_groups = %d", i, c->block_out_channels[i],
                              c->norm_num_groups);
    return 0;
}

int sd_vae_create(sd_vae **out, const sd_vae_config *c, const sd_param_table *table,
                  const void *params, const sd_backend *be, sd_err *err)
{
    const int L = c->n_levels, lpb = c->layers_per_block;
    resolver r;
    sd_vae *m;
    char p[SD_PARAM_NAME_MAX];
    int64_t ch, top;

    *out = NULL;
    if (check_config(c, err))
        return -1;
    sd_resolver_init(&r, table, params, sd_dtype_size(be->dtype));
    m = sd_xcalloc(1, sizeof *m);
    m->cfg = *c;
    m->be = be;
    m->enc_res = sd_xcalloc((size_t)L * lpb, sizeof *m->enc_res);
    m->dec_res = sd_xcalloc((size_t)L * (lpb + 1), sizeof *m->dec_res);
    top = c->block_out_channels[L - 1];

    ch = c->block_out_channels[0];
    m->enc_conv_in = get_conv(&r, "encoder.conv_in", c->in_channels, ch, 3);
    for (int i = 0; i < L; i++) {
        int64_t in = ch;
        ch = c->block_out_channels[i];
        for (int j = 0; j < lpb; j++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d", i, j);
            m->enc_res[i * lpb + j] = get_resnet(&r, p, j == 0 ? in : ch, ch);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            m->enc_down[i] = get_conv(&r, p, ch, ch, 3);
        }
    }
    m->enc_mid = get_mid(&r, "encoder", top, c->mid_block_add_attention);
    m->enc_norm_out = get_norm(&r, "encoder.conv_norm_out", top);
    m->enc_conv_out = get_conv(&r, "encoder.conv_out", top, 2 * c->latent_channels, 3);
    if (c->use_quant_conv)
        m->quant = get_conv(&r, "quant_conv", 2 * c->latent_channels, 2 * c->latent_channels, 1);

    if (c->use_post_quant_conv)
        m->post_quant = get_conv(&r, "post_quant_conv", c->latent_channels, c->latent_channels, 1);
    m->dec_conv_in = get_conv(&r, "decoder.conv_in", c->latent_channels, top, 3);
    m->dec_mid = get_mid(&r, "decoder", top, c->mid_block_add_attention);
    ch = top;
    for (int i = 0; i < L; i++) {
        int64_t prev = ch;
        ch = c->block_out_channels[L - 1 - i];
        for (int j = 0; j <= lpb; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d", i, j);
            m->dec_res[i * (lpb + 1) + j] = get_resnet(&r, p, j == 0 ? prev : ch, ch);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            m->dec_up[i] = get_conv(&r, p, ch, ch, 3);
        }
    }
    m->dec_norm_out = get_norm(&r, "decoder.conv_norm_out", c->block_out_channels[0]);
    m->dec_conv_out = get_conv(&r, "decoder.conv_out", c->block_out_channels[0], c->out_channels, 3);

    if (sd_resolver_finish(&r, "VAE", err)) {
        sd_vae_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int sd_vae_create_from_weights(sd_vae **out, const sd_vae_config *c, const sd_weights *w,
                               const sd_backend *be, sd_err *err)
{
    SD_CHECK(be->device == SD_DEV_CPU && be->dtype == SD_F32,
             "host fp32 weights need a CPU fp32 backend, not '%s'", be->name);
    return sd_vae_create(out, c, &w->table, w->data, be, err);
}

void sd_vae_free(sd_vae *m)
{
    if (!m)
        return;
    free(m->enc_res);
    free(m->dec_res);
    free(m);
}

const sd_vae_config *sd_vae_get_config(const sd_vae *m)
{
    return &m->cfg;
}

/* ---- shapes ------------------------------------------------------------------------------ */

/* Largest feature map we accept, in elements (int indexing in the ops' descriptors). */
#define MAX_ELEMS ((int64_t)1 << 40)

static int check_elems(const sd_vae_config *c, int batch, int64_t h, int64_t w, sd_err *err)
{
    int64_t cmax = c->in_channels > c->out_channels ? c->in_channels : c->out_channels;
    for (int i = 0; i < c->n_levels; i++)
        if (c->block_out_channels[i] > cmax)
            cmax = c->block_out_channels[i];
    if (h > INT32_MAX / 2 || w > INT32_MAX / 2 || h * w > INT32_MAX / 2 ||
        (double)batch * (double)h * (double)w * (double)cmax > (double)MAX_ELEMS)
        return sd_err_set(err, "VAE: %d x %" PRId64 " x %" PRId64 " is too large", batch, h, w);
    return 0;
}

int sd_vae_check_image_shape(const sd_vae_config *c, int batch, int h, int w, int *lh, int *lw,
                             sd_err *err)
{
    int hh = h, ww = w;
    if (check_config(c, err))
        return -1;
    if (batch < 1 || h < 1 || w < 1)
        return sd_err_set(err, "VAE encoder: batch %d, size %dx%d (all must be positive)", batch,
                          h, w);
    if (check_elems(c, batch, h, w, err))
        return -1;
    for (int i = 0; i < c->n_levels - 1; i++) {
        if (hh < 2 || ww < 2)
            return sd_err_set(err, "VAE encoder: %dx%d images shrink to %dx%d before level %d "
                              "(downsampling needs at least 2x2)", h, w, hh, ww, i + 1);
        hh /= 2;
        ww /= 2;
    }
    if (lh)
        *lh = hh;
    if (lw)
        *lw = ww;
    return 0;
}

int sd_vae_check_latent_shape(const sd_vae_config *c, int batch, int h, int w, int *oh, int *ow,
                              sd_err *err)
{
    int64_t f;
    if (check_config(c, err))
        return -1;
    if (batch < 1 || h < 1 || w < 1)
        return sd_err_set(err, "VAE decoder: batch %d, size %dx%d (all must be positive)", batch,
                          h, w);
    f = (int64_t)1 << (c->n_levels - 1);
    if (check_elems(c, batch, h * f, w * f, err))
        return -1;
    if (oh)
        *oh = (int)(h * f);
    if (ow)
        *ow = (int)(w * f);
    return 0;
}

/* ---- the forward, shared by the dry run and the real run -------------------------------- */

typedef struct run {
    const sd_vae *m;         /* NULL in a dry run */
    const sd_vae_config *cfg;
    const sd_backend *be;    /* NULL when only counting FLOPs */
    sd_arena *a;
    int dry, n;
    size_t esize;
    void *pp[2];             /* ping-pong activation buffers (real run) */
    size_t pp_cap;           /* bytes each */
    size_t pp_need;          /* largest activation asked for, bytes */
    int64_t conv_elems;      /* largest convolution input (as padded) or output, per sample */
    double flops;
    const sd_vae_tap *tap;
    const char *what;        /* "VAE encoder" / "VAE decoder", for messages */
} run;

/* A feature map [n, h, w, c]; slot 0/1 = ping-pong buffer, -1 = caller's memory or temporary. */
typedef struct act {
    void *p;
    int slot;
    int h, w, c;
} act;

#define SUB(p, field) ((p) ? &(p)->field : NULL)

static size_t act_bytes(const run *r, int h, int w, int c)
{
    return (size_t)r->n * (size_t)h * (size_t)w * (size_t)c * r->esize;
}

/* Temporary memory from the arena; the caller resets to a mark. */
static void *tmp(run *r, size_t bytes)
{
    void *p = sd_arena_alloc(r->a, bytes);
    if (!r->dry)
        SD_CHECK(p != NULL || bytes == 0,
                 "%s: the arena ran out (%zu of %zu bytes used, %zu more wanted): size it with the "
                 "scratch-bytes query", r->what, sd_arena_used(r->a), sd_arena_capacity(r->a), bytes);
    return p;
}

/* The ping-pong buffer that x does not occupy, as a [n, h, w, c] map. */
static act next_act(run *r, const act *x, int h, int w, int c)
{
    act y;
    size_t bytes = act_bytes(r, h, w, c);
    y.slot = x->slot == 0 ? 1 : 0;
    y.h = h;
    y.w = w;
    y.c = c;
    if (bytes > r->pp_need)
        r->pp_need = bytes;
    if (!r->dry)
        SD_CHECK(bytes <= r->pp_cap, "%s: activation of %zu bytes exceeds the planned %zu", r->what,
                 bytes, r->pp_cap);
    y.p = r->pp[y.slot];
    return y;
}

static void tap(run *r, const char *name, const act *x)
{
    if (!r->dry && r->tap && r->tap->fn)
        r->tap->fn(r->tap->user, name, x->p, r->n, x->h, x->w, x->c);
}

/* y = conv(x) + b, plus the residual z when z is not NULL (one pass where the backend can) */
static void conv(run *r, const conv_p *p, const act *x, int cout, int k, int stride, int pt,
                 int pb, int pl, int pr, const void *z, const act *y)
{
    sd_conv2d_desc d = sd_conv2d_make_padded(r->n, x->h, x->w, x->c, cout, k, k, stride, pt, pb,
                                             pl, pr);
    size_t mark = sd_arena_mark(r->a), sb;
    void *s;
    SD_CHECK(y->h == d.h_out && y->w == d.w_out && y->c == cout, "conv output %dx%dx%d vs %dx%dx%d",
             y->h, y->w, y->c, d.h_out, d.w_out, cout);
    r->flops += 2.0 * r->n * d.h_out * d.w_out * (double)cout * k * k * x->c;
    {
        const int64_t in = (int64_t)(x->h + pt + pb) * (x->w + pl + pr) * x->c,
                      out = (int64_t)d.h_out * d.w_out * cout, most = in > out ? in : out;
        if (most > r->conv_elems)
            r->conv_elems = most;
    }
    sb = r->be ? sd_conv2d_forward_scratch_bytes(r->be, &d) : 0;
    s = tmp(r, sb);
    if (!r->dry && z)
        sd_conv2d_forward_add(r->be, &d, x->p, p->w, p->b, z, y->p, (sd_scratch){s, sb});
    else if (!r->dry)
        sd_conv2d_forward(r->be, &d, x->p, p->w, p->b, y->p, (sd_scratch){s, sb});
    sd_arena_reset_to(r->a, mark);
}

static void conv3(run *r, const conv_p *p, const act *x, int cout, const act *y)
{
    conv(r, p, x, cout, 3, 1, 1, 1, 1, 1, NULL, y);
}

/* y = conv3(x) + z */
static void conv3_add(run *r, const conv_p *p, const act *x, int cout, const void *z,
                      const act *y)
{
    conv(r, p, x, cout, 3, 1, 1, 1, 1, 1, z, y);
}

static void conv1(run *r, const conv_p *p, const act *x, int cout, const act *y)
{
    conv(r, p, x, cout, 1, 1, 0, 0, 0, 0, NULL, y);
}

/* y [n, h*w, c] = GroupNorm(x) (eps 1e-6), then SiLU when `silu`. */
static void gnorm(run *r, const norm_p *p, const act *x, int silu, void *y)
{
    sd_group_norm_desc d;
    size_t mark = sd_arena_mark(r->a), sb;
    void *s;
    d.n = r->n;
    d.hw = x->h * x->w;
    d.c = x->c;
    d.groups = r->cfg->norm_num_groups;
    d.eps = VAE_EPS;
    d.silu = silu;
    sb = r->be ? sd_group_norm_forward_scratch_bytes(r->be, &d) : 0;
    s = tmp(r, sb);
    if (!r->dry)
        sd_group_norm_forward(r->be, &d, x->p, p->g, p->b, y, NULL, NULL, (sd_scratch){s, sb});
    sd_arena_reset_to(r->a, mark);
}

static void linear(run *r, const conv_p *p, const void *x, int64_t rows, int in, int out, void *y)
{
    r->flops += 2.0 * (double)rows * in * out;
    if (!r->dry)
        sd_linear_forward(r->be, rows, in, out, x, p->w, p->b, y);
}

/* ResnetBlock2D without time input: y = shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1 x))))). */
static void resnet(run *r, const resnet_p *p, const act *x, int cout, const act *y)
{
    const int cin = x->c, cmax = cin > cout ? cin : cout;
    size_t mark = sd_arena_mark(r->a);
    act t = {tmp(r, act_bytes(r, x->h, x->w, cmax)), -1, x->h, x->w, cin};
    act h = {tmp(r, act_bytes(r, x->h, x->w, cout)), -1, x->h, x->w, cout};
    gnorm(r, SUB(p, norm1), x, 1, t.p);
    conv3(r, SUB(p, conv1), &t, cout, &h);
    t.c = cout; /* t is free again: it takes norm2's output */
    gnorm(r, SUB(p, norm2), &h, 1, t.p);
    /* y = conv2(t) + residual in one pass where the backend can (diffusers: residual + h) */
    if (cin != cout) {
        conv1(r, SUB(p, shortcut), x, cout, &h); /* h is free again */
        conv3_add(r, SUB(p, conv2), &t, cout, h.p, y);
    } else {
        conv3_add(r, SUB(p, conv2), &t, cout, x->p, y);
    }
    sd_arena_reset_to(r->a, mark);
}

/* The mid-block Attention: single head over the h*w positions, residual added after to_out. */
static void attention(run *r, const attn_p *p, const act *x, const act *y)
{
    const int c = x->c, t = x->h * x->w;
    const int64_t rows = (int64_t)r->n * t;
    const size_t bytes = act_bytes(r, x->h, x->w, c);
    size_t mark = sd_arena_mark(r->a), sb;
    void *tn = tmp(r, bytes), *q = tmp(r, bytes), *k = tmp(r, bytes), *v = tmp(r, bytes), *s;
    sd_attention_desc d = sd_attention_make(r->n, 1, c, t, t, 0);
    gnorm(r, SUB(p, norm), x, 0, tn);
    linear(r, SUB(p, q), tn, rows, c, c, q);
    linear(r, SUB(p, k), tn, rows, c, c, k);
    linear(r, SUB(p, v), tn, rows, c, c, v);
    r->flops += 4.0 * r->n * (double)t * t * c;
    sb = r->be ? sd_attention_forward_scratch_bytes(r->be, &d) : 0;
    s = tmp(r, sb);
    if (!r->dry)
        sd_attention_forward(r->be, &d, q, k, v, tn, NULL, (sd_scratch){s, sb});
    /* y = to_out(tn) + x, the add in the GEMM's pass where the backend can (diffusers:
     * hidden_states + residual) */
    r->flops += 2.0 * (double)rows * c * c;
    if (!r->dry)
        sd_linear_forward_add(r->be, rows, c, c, tn, SUB(p, o)->w, SUB(p, o)->b, x->p, y->p);
    sd_arena_reset_to(r->a, mark);
}

static void mid_block(run *r, const mid_p *p, act *x)
{
    const int c = x->c;
    act y = next_act(r, x, x->h, x->w, c);
    resnet(r, SUB(p, res[0]), x, c, &y);
    *x = y;
    if (r->cfg->mid_block_add_attention) {
        y = next_act(r, x, x->h, x->w, c);
        attention(r, SUB(p, attn), x, &y);
        *x = y;
    }
    y = next_act(r, x, x->h, x->w, c);
    resnet(r, SUB(p, res[1]), x, c, &y);
    *x = y;
}

/* GroupNorm + SiLU into a temporary, then a 3x3 conv into y. */
static void norm_out_conv(run *r, const norm_p *np, const conv_p *cp, const act *x, int cout,
                          const act *y)
{
    size_t mark = sd_arena_mark(r->a);
    act t = {tmp(r, act_bytes(r, x->h, x->w, x->c)), -1, x->h, x->w, x->c};
    gnorm(r, np, x, 1, t.p);
    conv3(r, cp, &t, cout, y);
    sd_arena_reset_to(r->a, mark);
}

static void encode_run(run *r, const act *images, void *moments)
{
    const sd_vae_config *c = r->cfg;
    const sd_vae *m = r->m;
    const int L = c->n_levels, lpb = c->layers_per_block, z2 = 2 * c->latent_channels;
    char name[64];
    act x = *images, y;

    y = next_act(r, &x, x.h, x.w, c->block_out_channels[0]);
    conv3(r, m ? &m->enc_conv_in : NULL, &x, y.c, &y);
    x = y;
    tap(r, "encoder.conv_in", &x);
    for (int i = 0; i < L; i++) {
        const int cout = c->block_out_channels[i];
        for (int j = 0; j < lpb; j++) {
            y = next_act(r, &x, x.h, x.w, cout);
            resnet(r, m ? &m->enc_res[i * lpb + j] : NULL, &x, cout, &y);
            x = y;
        }
        if (i < L - 1) {
            /* Downsample2D with padding 0: F.pad (0, 1, 0, 1), then 3x3 stride 2 */
            y = next_act(r, &x, (x.h - 2) / 2 + 1, (x.w - 2) / 2 + 1, cout);
            conv(r, m ? &m->enc_down[i] : NULL, &x, cout, 3, 2, 0, 1, 0, 1, NULL, &y);
            x = y;
        }
        snprintf(name, sizeof name, "encoder.down_blocks.%d", i);
        tap(r, name, &x);
    }
    mid_block(r, m ? &m->enc_mid : NULL, &x);
    tap(r, "encoder.mid_block", &x);
    if (c->use_quant_conv) {
        act mo = {moments, -1, x.h, x.w, z2};
        y = next_act(r, &x, x.h, x.w, z2);
        norm_out_conv(r, m ? &m->enc_norm_out : NULL, m ? &m->enc_conv_out : NULL, &x, z2, &y);
        tap(r, "encoder", &y);
        conv1(r, m ? &m->quant : NULL, &y, z2, &mo);
        tap(r, "quant_conv", &mo);
    } else {
        y = (act){moments, -1, x.h, x.w, z2};
        norm_out_conv(r, m ? &m->enc_norm_out : NULL, m ? &m->enc_conv_out : NULL, &x, z2, &y);
        tap(r, "encoder", &y);
    }
}

static void decode_run(run *r, const act *latents, void *images)
{
    const sd_vae_config *c = r->cfg;
    const sd_vae *m = r->m;
    const int L = c->n_levels, lpb = c->layers_per_block;
    char name[64];
    act x = *latents, y, out;

    if (c->use_post_quant_conv) {
        y = next_act(r, &x, x.h, x.w, x.c);
        conv1(r, m ? &m->post_quant : NULL, &x, x.c, &y);
        x = y;
        tap(r, "post_quant_conv", &x);
    }
    y = next_act(r, &x, x.h, x.w, c->block_out_channels[L - 1]);
    conv3(r, m ? &m->dec_conv_in : NULL, &x, y.c, &y);
    x = y;
    tap(r, "decoder.conv_in", &x);
    mid_block(r, m ? &m->dec_mid : NULL, &x);
    tap(r, "decoder.mid_block", &x);
    for (int i = 0; i < L; i++) {
        const int cout = c->block_out_channels[L - 1 - i];
        for (int j = 0; j <= lpb; j++) {
            y = next_act(r, &x, x.h, x.w, cout);
            resnet(r, m ? &m->dec_res[i * (lpb + 1) + j] : NULL, &x, cout, &y);
            x = y;
        }
        if (i < L - 1) {
            /* Upsample2D: nearest x2, then 3x3 */
            size_t mark = sd_arena_mark(r->a);
            act u = {tmp(r, act_bytes(r, 2 * x.h, 2 * x.w, cout)), -1, 2 * x.h, 2 * x.w, cout};
            if (!r->dry)
                sd_upsample_nearest_forward(r->be, r->n, x.h, x.w, cout, u.h, u.w, x.p, u.p);
            y = next_act(r, &x, u.h, u.w, cout);
            conv3(r, m ? &m->dec_up[i] : NULL, &u, cout, &y);
            sd_arena_reset_to(r->a, mark);
            x = y;
        }
        snprintf(name, sizeof name, "decoder.up_blocks.%d", i);
        tap(r, name, &x);
    }
    out = (act){images, -1, x.h, x.w, c->out_channels};
    norm_out_conv(r, m ? &m->dec_norm_out : NULL, m ? &m->dec_conv_out : NULL, &x,
                  c->out_channels, &out);
    tap(r, "decoder", &out);
}

/* ---- planning and the public entry points ------------------------------------------------- */

typedef struct plan {
    size_t pp;    /* bytes of each ping-pong buffer, aligned */
    size_t temps; /* high-water mark of the temporaries above them */
    int64_t conv_elems; /* largest convolution tensor, per sample */
    double flops;
} plan;

static plan make_plan(const sd_vae_config *c, const sd_backend *be, int decode, int batch, int h,
                      int w)
{
    const size_t al = SD_ARENA_DEFAULT_ALIGNMENT;
    sd_arena meas;
    run r;
    plan p;
    act in = {NULL, -1, h, w, decode ? c->latent_channels : c->in_channels};
    SD_CHECK(sd_arena_init_measure(&meas, al) == 0, "measuring arena");
    memset(&r, 0, sizeof r);
    r.cfg = c;
    r.be = be;
    r.a = &meas;
    r.dry = 1;
    r.n = batch;
    r.esize = be ? sd_dtype_size(be->dtype) : sizeof(float);
    r.what = decode ? "VAE decoder" : "VAE encoder";
    if (decode)
        decode_run(&r, &in, NULL);
    else
        encode_run(&r, &in, NULL);
    p.pp = (r.pp_need + al - 1) / al * al;
    p.temps = sd_arena_high_water(&meas);
    p.conv_elems = r.conv_elems;
    p.flops = r.flops;
    sd_arena_free(&meas);
    return p;
}

static void check_shape_or_die(const sd_vae_config *c, int decode, int batch, int h, int w)
{
    sd_err err;
    int rc = decode ? sd_vae_check_latent_shape(c, batch, h, w, NULL, NULL, &err)
                    : sd_vae_check_image_shape(c, batch, h, w, NULL, NULL, &err);
    SD_CHECK(rc == 0, "%s", err.msg);
}

/* The most elements one convolution tensor may hold on `be`, 0 for no limit. cuDNN's tensor
 * descriptors take at most 2^31 - 1 elements (NOT_SUPPORTED above), which SD2's VAE passes at
 * 768 px with an encode batch of 29 ([29, 768, 768, 128]) or a decode batch of 15 ([15, 768,
 * 768, 256]); the CPU backend has no such limit. SDTRAIN_TEST_VAE_MAX_ELEMS sets one on any
 * backend, so that the CPU tests can show what the split does. */
static int64_t conv_elem_limit(const sd_backend *be)
{
    const char *env = getenv("SDTRAIN_TEST_VAE_MAX_ELEMS");
    if (env && *env) {
        char *end;
        long long v = strtoll(env, &end, 10);
        if (!*end && v > 0)
            return (int64_t)v;
    }
    return be && be->device != SD_DEV_CPU ? (int64_t)INT32_MAX : 0;
}

/* How many images (or latents) of the batch go through the model at once: all of them unless
 * a convolution tensor of the whole batch would pass the backend's limit; then the most that
 * stay under it (the samples are independent, so the outputs are those of one pass). */
int64_t sd_vae_conv_elems(const sd_vae_config *c, int decode, int h, int w)
{
    check_shape_or_die(c, decode, 1, h, w);
    return make_plan(c, NULL, decode, 1, h, w).conv_elems;
}

static int sub_batch(const sd_vae_config *c, const sd_backend *be, int decode, int batch, int h,
                     int w)
{
    const int64_t limit = conv_elem_limit(be);
    int64_t per;
    if (limit == 0)
        return batch;
    per = make_plan(c, NULL, decode, 1, h, w).conv_elems;
    SD_CHECK(per <= limit, "%s: one %s of %dx%d needs a convolution tensor of %lld elements; "
             "the %s backend takes at most %lld", decode ? "VAE decoder" : "VAE encoder",
             decode ? "latent" : "image", h, w, (long long)per, be ? be->name : "?",
             (long long)limit);
    return (int64_t)batch * per <= limit ? batch : (int)(limit / per);
}

static size_t plan_bytes(const plan *p)
{
    return 2 * p->pp + p->temps + SD_ARENA_DEFAULT_ALIGNMENT;
}

int sd_vae_pass_batch(const sd_vae_config *c, const sd_backend *be, int decode, int batch, int h,
                      int w)
{
    check_shape_or_die(c, decode, batch, h, w);
    return sub_batch(c, be, decode, batch, h, w);
}

size_t sd_vae_encode_scratch_bytes(const sd_vae_config *c, const sd_backend *be, int batch,
                                   int h, int w)
{
    plan p;
    check_shape_or_die(c, 0, batch, h, w);
    p = make_plan(c, be, 0, sub_batch(c, be, 0, batch, h, w), h, w);
    return plan_bytes(&p);
}

size_t sd_vae_decode_scratch_bytes(const sd_vae_config *c, const sd_backend *be, int batch,
                                   int h, int w)
{
    plan p;
    check_shape_or_die(c, 1, batch, h, w);
    p = make_plan(c, be, 1, sub_batch(c, be, 1, batch, h, w), h, w);
    return plan_bytes(&p);
}

double sd_vae_encode_flops(const sd_vae_config *c, int batch, int h, int w)
{
    check_shape_or_die(c, 0, batch, h, w);
    return make_plan(c, NULL, 0, batch, h, w).flops;
}

double sd_vae_decode_flops(const sd_vae_config *c, int batch, int h, int w)
{
    check_shape_or_die(c, 1, batch, h, w);
    return make_plan(c, NULL, 1, batch, h, w).flops;
}

/* One pass of `batch` samples (at most sub_batch's). */
static void forward_pass(const sd_vae *m, int decode, int batch, int h, int w, const void *in,
                         void *out, sd_arena *arena, const sd_vae_tap *tap_)
{
    const sd_vae_config *c = &m->cfg;
    const char *what = decode ? "VAE decoder" : "VAE encoder";
    plan p;
    run r;
    size_t mark, free_bytes;
    act x = {(void *)in, -1, h, w, decode ? c->latent_channels : c->in_channels};

    p = make_plan(c, m->be, decode, batch, h, w);
    free_bytes = sd_arena_capacity(arena) - sd_arena_used(arena);
    SD_CHECK(!sd_arena_is_measuring(arena) && free_bytes >= plan_bytes(&p),
             "%s: the arena has %zu bytes free, %d x %d x %d needs %zu (query "
             "sd_vae_%s_scratch_bytes)", what, free_bytes, batch, h, w, plan_bytes(&p),
             decode ? "decode" : "encode");
    mark = sd_arena_mark(arena);
    memset(&r, 0, sizeof r);
    r.m = m;
    r.cfg = c;
    r.be = m->be;
    r.a = arena;
    r.n = batch;
    r.esize = sd_dtype_size(m->be->dtype);
    r.tap = tap_;
    r.what = what;
    r.pp[0] = sd_arena_alloc(arena, p.pp);
    r.pp[1] = sd_arena_alloc(arena, p.pp);
    r.pp_cap = p.pp;
    SD_CHECK(r.pp[0] && r.pp[1], "%s: arena allocation of 2 x %zu bytes failed", what, p.pp);
    if (decode)
        decode_run(&r, &x, out);
    else
        encode_run(&r, &x, out);
    sd_arena_reset_to(arena, mark);
}

static void forward(const sd_vae *m, int decode, int batch, int h, int w, const void *in,
                    void *out, sd_arena *arena, const sd_vae_tap *tap_)
{
    const sd_vae_config *c = &m->cfg;
    const size_t es = sd_dtype_size(m->be->dtype);
    int oh, ow, sub;
    size_t in_bytes, out_bytes; /* per sample */
    sd_err err;
    int rc = decode ? sd_vae_check_latent_shape(c, batch, h, w, &oh, &ow, &err)
                    : sd_vae_check_image_shape(c, batch, h, w, &oh, &ow, &err);
    SD_CHECK(rc == 0, "%s", err.msg);
    sub = sub_batch(c, m->be, decode, batch, h, w);
    if (sub >= batch) {
        forward_pass(m, decode, batch, h, w, in, out, arena, tap_);
        return;
    }
    SD_CHECK(!tap_ || !tap_->fn, "%s: taps see one pass; a batch of %d is split into passes of %d",
             decode ? "VAE decoder" : "VAE encoder", batch, sub);
    in_bytes = (size_t)h * (size_t)w * (size_t)(decode ? c->latent_channels : c->in_channels) * es;
    out_bytes = (size_t)oh * (size_t)ow * (size_t)(decode ? c->out_channels : 2 * c->latent_channels) * es;
    for (int i = 0; i < batch; i += sub) {
        const int nb = batch - i < sub ? batch - i : sub;
        forward_pass(m, decode, nb, h, w, (const char *)in + (size_t)i * in_bytes,
                     (char *)out + (size_t)i * out_bytes, arena, tap_);
    }
}

void sd_vae_encode(const sd_vae *m, int batch, int h, int w, const void *images, void *moments,
                   sd_arena *arena, const sd_vae_tap *tap_)
{
    forward(m, 0, batch, h, w, images, moments, arena, tap_);
}

void sd_vae_decode(const sd_vae *m, int batch, int h, int w, const void *latents, void *images,
                   sd_arena *arena, const sd_vae_tap *tap_)
{
    forward(m, 1, batch, h, w, latents, images, arena, tap_);
}

void sd_vae_moments_split_host(int64_t rows, int c, const float *moments, float *mean,
                               float *logvar)
{
    for (int64_t i = 0; i < rows; i++) {
        const float *src = moments + i * 2 * c;
        for (int k = 0; k < c; k++) {
            float lv = src[c + k];
            if (mean)
                mean[i * c + k] = src[k];
            if (logvar)
                logvar[i * c + k] = lv < -30.0f ? -30.0f : (lv > 20.0f ? 20.0f : lv);
        }
    }
}
