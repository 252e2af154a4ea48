/* The U-Net forward: parameters resolved once into a tree of pointers, one code path that either
 * runs the ops or (in a measuring arena) only plans memory and counts FLOPs. */
#include "sdtrain/unet.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "unet_internal.h"


/* ---- building: names, shapes, pointers ------------------------------------------------------ */

/* Collects every mismatch between the table and the configuration into one message. With no
 * table (t == NULL) only the shapes are built and every pointer stays NULL. */
#define UB_NAME 160

typedef struct ub {
    const sd_param_table *t;
    const unsigned char *base;
    size_t es;
    unsigned char *used;
    int n_missing, n_bad;
    char missing[512], bad[512];
} ub;

static void note(char *buf, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void note(char *buf, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(buf);
    va_list ap;
    if (len + 8 >= cap)
        return;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* Formats a parameter name; names are short, so overflow is a bug. */
static void ub_name(char *dst, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void ub_name(char *dst, size_t cap, const char *fmt, ...)
{
    va_list ap;
    int len;
    va_start(ap, fmt);
    len = vsnprintf(dst, cap, fmt, ap);
    va_end(ap);
    SD_CHECK(len >= 0 && (size_t)len < cap, "parameter name too long: %s...", dst);
}

static int shape_is(const sd_param *p, int ndim, const int64_t *shape)
{
    if (p->ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (p->shape[i] != shape[i])
            return 0;
    return 1;
}

/* The tensor `name` with PyTorch shape `shape`; `alt` (may be NULL) is an accepted
 * alternative shape with the same bytes (a linear stored as a 1x1 conv). */
static const void *ub_tensor(ub *b, const char *name, int ndim, const int64_t *shape,
                             int alt_ndim, const int64_t *alt)
{
    const sd_param *p;
    if (!b->t)
        return NULL;
    p = sd_param_find(b->t, name);
    if (!p) {
        if (b->n_missing++ < 6)
            note(b->missing, sizeof b->missing, "%s'%s'", b->n_missing > 1 ? ", " : "", name);
        return NULL;
    }
    b->used[p - b->t->params] = 1;
    if (!shape_is(p, ndim, shape) && !(alt && shape_is(p, alt_ndim, alt))) {
        char got[64], want[64];
        if (b->n_bad++ < 4)
            note(b->bad, sizeof b->bad, "%s'%s' has shape %s, expected %s",
                 b->n_bad > 1 ? "; " : "", name, sd_shape_str(p->ndim, p->shape, got, sizeof got),
                 sd_shape_str(ndim, shape, want, sizeof want));
        return NULL;
    }
    return b->base + p->offset * b->es;
}

static const void *ub_vec(ub *b, const char *prefix, const char *what, int64_t c)
{
    char n[UB_NAME];
    ub_name(n, sizeof n, "%s.%s", prefix, what);
    return ub_tensor(b, n, 1, (int64_t[]){c}, 0, NULL);
}

static ut_norm ub_norm(ub *b, const char *prefix, int64_t c)
{
    ut_norm r;
    r.g = ub_vec(b, prefix, "weight", c);
    r.b = ub_vec(b, prefix, "bias", c);
    return r;
}

/* A linear layer; `as_conv_ok` also accepts the weight as a 1x1 conv [out, in, 1, 1]. */
static ut_lin ub_linear(ub *b, const char *prefix, int64_t in, int64_t out, int bias,
                        int as_conv_ok)
{
    char n[UB_NAME];
    ut_lin r;
    ub_name(n, sizeof n, "%s.weight", prefix);
    r.w = ub_tensor(b, n, 2, (int64_t[]){out, in}, 4, as_conv_ok ? (int64_t[]){out, in, 1, 1} : NULL);
    r.b = bias ? ub_vec(b, prefix, "bias", out) : NULL;
    return r;
}

static ut_lin ub_conv(ub *b, const char *prefix, int64_t in, int64_t out, int64_t k)
{
    char n[UB_NAME];
    ut_lin r;
    ub_name(n, sizeof n, "%s.weight", prefix);
    r.w = ub_tensor(b, n, 4, (int64_t[]){out, in, k, k}, 0, NULL);
    r.b = ub_vec(b, prefix, "bias", out);
    return r;
}

static void ub_resnet(ub *b, ut_resnet *r, const char *p, int cin, int cout, int temb)
{
    char n[UB_NAME];
    r->cin = cin;
    r->cout = cout;
    ub_name(n, sizeof n, "%s.norm1", p);
    r->norm1 = ub_norm(b, n, cin);
    ub_name(n, sizeof n, "%s.conv1", p);
    r->conv1 = ub_conv(b, n, cin, cout, 3);
    ub_name(n, sizeof n, "%s.time_emb_proj", p);
    r->time_proj = ub_linear(b, n, temb, cout, 1, 0);
    ub_name(n, sizeof n, "%s.norm2", p);
    r->norm2 = ub_norm(b, n, cout);
    ub_name(n, sizeof n, "%s.conv2", p);
    r->conv2 = ub_conv(b, n, cout, cout, 3);
    memset(&r->shortcut, 0, sizeof r->shortcut);
    if (cin != cout) {
        ub_name(n, sizeof n, "%s.conv_shortcut", p);
        r->shortcut = ub_conv(b, n, cin, cout, 1);
    }
}

static void ub_transformer(ub *b, ut_transformer *x, const char *p, int c, int heads, int layers,
                           int ctx_dim)
{
    char n[UB_NAME];
    const int64_t d = (int64_t)heads * (c / heads);
    x->c = c;
    x->heads = heads;
    x->head_dim = c / heads;
    x->inner = (int)d;
    x->layers = layers;
    ub_name(n, sizeof n, "%s.norm", p);
    x->norm = ub_norm(b, n, c);
    ub_name(n, sizeof n, "%s.proj_in", p);
    x->proj_in = ub_linear(b, n, c, d, 1, 1);
    ub_name(n, sizeof n, "%s.proj_out", p);
    x->proj_out = ub_linear(b, n, d, c, 1, 1);
    x->blocks = sd_xcalloc((size_t)layers, sizeof *x->blocks);
    for (int l = 0; l < layers; l++) {
        ut_block *k = &x->blocks[l];
#define TB(field, what, ...)                                                                   \
    do {                                                                                       \
        ub_name(n, sizeof n, "%s.transformer_blocks.%d.%s", p, l, what);                      \
        k->field = __VA_ARGS__;                                                                \
    } while (0)
        TB(norm1, "norm1", ub_norm(b, n, d));
        TB(q1, "attn1.to_q", ub_linear(b, n, d, d, 0, 0).w);
        TB(k1, "attn1.to_k", ub_linear(b, n, d, d, 0, 0).w);
        TB(v1, "attn1.to_v", ub_linear(b, n, d, d, 0, 0).w);
        TB(out1, "attn1.to_out.0", ub_linear(b, n, d, d, 1, 0));
        TB(norm2, "norm2", ub_norm(b, n, d));
        TB(q2, "attn2.to_q", ub_linear(b, n, d, d, 0, 0).w);
        TB(k2, "attn2.to_k", ub_linear(b, n, ctx_dim, d, 0, 0).w);
        TB(v2, "attn2.to_v", ub_linear(b, n, ctx_dim, d, 0, 0).w);
        TB(out2, "attn2.to_out.0", ub_linear(b, n, d, d, 1, 0));
        TB(norm3, "norm3", ub_norm(b, n, d));
        TB(ff_in, "ff.net.0.proj", ub_linear(b, n, d, 8 * d, 1, 0));
        TB(ff_out, "ff.net.2", ub_linear(b, n, 4 * d, d, 1, 0));
#undef TB
    }
}

/* The settings the forward implements, beyond what sd_unet_config_load already enforces. */
static int check_config(const sd_unet_config *c, sd_err *err)
{
    const char *what = NULL;
    if (c->n_levels < 1 || c->n_levels > SD_MODEL_MAX_LEVELS)
        what = "n_levels must be 1..SD_MODEL_MAX_LEVELS";
    else if (c->layers_per_block < 1 || c->layers_per_block > SD_UNET_MAX_LAYERS_PER_BLOCK)
        what = "layers_per_block must be 1..SD_UNET_MAX_LAYERS_PER_BLOCK";
    else if (c->in_channels < 1 || c->out_channels < 1 || c->cross_attention_dim < 1 ||
             c->norm_num_groups < 1)
        what = "in/out_channels, cross_attention_dim and norm_num_groups must be positive";
    else if (c->conv_in_kernel < 1 || c->conv_in_kernel % 2 == 0 || c->conv_out_kernel < 1 ||
             c->conv_out_kernel % 2 == 0)
        what = "conv_in_kernel and conv_out_kernel must be odd";
    else if (c->downsample_padding < 0 || c->downsample_padding > 1)
        what = "downsample_padding must be 0 or 1";
    else if (c->block_out_channels[0] > SD_UNET_MAX_TIME_PROJ_DIM)
        what = "block_out_channels[0] exceeds SD_UNET_MAX_TIME_PROJ_DIM";
    for (int i = 0; i < c->n_levels && !what; i++) {
        int ch = c->block_out_channels[i];
        if (ch < 1 || ch % c->norm_num_groups)
            what = "every block_out_channels entry must be a positive multiple of norm_num_groups";
        else if (c->heads[i] < 1 || ch / c->heads[i] < 1)
            what = "every level needs 1..channels attention heads";
        else if (c->transformer_layers[i] < 1)
            what = "transformer_layers_per_block must be positive";
    }
    if (what)
        return sd_err_set(err, "U-Net configuration not supported: %s", what);
    return 0;
}

static void stage_alloc(ut_stage *s, int n_res, int cross)
{
    s->n_res = n_res;
    s->res = sd_xcalloc((size_t)n_res, sizeof *s->res);
    s->attn = cross ? sd_xcalloc((size_t)n_res, sizeof *s->attn) : NULL;
}

static void transformer_free(ut_transformer *x)
{
    free(x->blocks);
    x->blocks = NULL;
}

void sd_unet_free(sd_unet *u)
{
    if (!u)
        return;
    for (int i = 0; i < SD_MODEL_MAX_LEVELS; i++) {
        ut_stage *st[2] = {&u->down[i], &u->up[i]};
        for (int s = 0; s < 2; s++) {
            if (st[s]->attn)
                for (int j = 0; j < st[s]->n_res; j++)
                    transformer_free(&st[s]->attn[j]);
            free(st[s]->attn);
            free(st[s]->res);
        }
    }
    transformer_free(&u->mid_attn);
    free(u);
}

/* Builds the tree; with table == NULL a shape-only model (pointers NULL) for dry runs. */
int sd_unet_build_tree(sd_unet **out, const sd_unet_config *c, const sd_param_table *table,
                       const void *params, size_t elem_size, const sd_backend *be, sd_err *err)
{
    const int L = c->n_levels, lpb = c->layers_per_block;
    sd_unet *u;
    ub b;
    char p[UB_NAME];
    int ch;

    *out = NULL;
    if (check_config(c, err))
        return -1;
    memset(&b, 0, sizeof b);
    b.t = table;
    b.base = params;
    b.es = elem_size ? elem_size : be ? sd_dtype_size(be->dtype) : sizeof(float);
    if (table)
        b.used = sd_xcalloc(table->n ? table->n : 1, 1);

    u = sd_xcalloc(1, sizeof *u);
    u->c = *c;
    u->be = be;
    u->batch_invariant = be && be->device == SD_DEV_CPU;
    u->temb_dim = 4 * c->block_out_channels[0];
    u->conv_in = ub_conv(&b, "conv_in", c->in_channels, c->block_out_channels[0], c->conv_in_kernel);
    u->time1 = ub_linear(&b, "time_embedding.linear_1", c->block_out_channels[0], u->temb_dim, 1, 0);
    u->time2 = ub_linear(&b, "time_embedding.linear_2", u->temb_dim, u->temb_dim, 1, 0);

    ch = c->block_out_channels[0];
    for (int i = 0; i < L; i++) {
        ut_stage *s = &u->down[i];
        const int cout = c->block_out_channels[i];
        stage_alloc(s, lpb, c->down_cross[i]);
        for (int j = 0; j < lpb; j++) {
            ub_name(p, sizeof p, "down_blocks.%d.resnets.%d", i, j);
            ub_resnet(&b, &s->res[j], p, j == 0 ? ch : cout, cout, u->temb_dim);
            if (s->attn) {
                ub_name(p, sizeof p, "down_blocks.%d.attentions.%d", i, j);
                ub_transformer(&b, &s->attn[j], p, cout, c->heads[i], c->transformer_layers[i],
                               c->cross_attention_dim);
            }
        }
        s->has_sampler = i < L - 1;
        if (s->has_sampler) {
            ub_name(p, sizeof p, "down_blocks.%d.downsamplers.0.conv", i);
            s->sampler = ub_conv(&b, p, cout, cout, 3);
        }
        ch = cout;
    }

    ub_resnet(&b, &u->mid_res[0], "mid_block.resnets.0", ch, ch, u->temb_dim);
    ub_transformer(&b, &u->mid_attn, "mid_block.attentions.0", ch, c->heads[L - 1],
                   c->transformer_layers[L - 1], c->cross_attention_dim);
    ub_resnet(&b, &u->mid_res[1], "mid_block.resnets.1", ch, ch, u->temb_dim);

    for (int i = 0; i < L; i++) {
        ut_stage *s = &u->up[i];
        const int lvl = L - 1 - i, cout = c->block_out_channels[lvl];
        const int skip_last = c->block_out_channels[lvl > 0 ? lvl - 1 : 0];
        stage_alloc(s, lpb + 1, c->up_cross[i]);
        for (int j = 0; j <= lpb; j++) {
            int cin = (j == 0 ? ch : cout) + (j == lpb ? skip_last : cout);
            ub_name(p, sizeof p, "up_blocks.%d.resnets.%d", i, j);
            ub_resnet(&b, &s->res[j], p, cin, cout, u->temb_dim);
            if (s->attn) {
                ub_name(p, sizeof p, "up_blocks.%d.attentions.%d", i, j);
                ub_transformer(&b, &s->attn[j], p, cout, c->heads[lvl],
                               c->transformer_layers[lvl], c->cross_attention_dim);
            }
        }
        s->has_sampler = i < L - 1;
        if (s->has_sampler) {
            ub_name(p, sizeof p, "up_blocks.%d.upsamplers.0.conv", i);
            s->sampler = ub_conv(&b, p, cout, cout, 3);
        }
        ch = cout;
    }
    u->norm_out = ub_norm(&b, "conv_norm_out", c->block_out_channels[0]);
    u->conv_out = ub_conv(&b, "conv_out", c->block_out_channels[0], c->out_channels,
                          c->conv_out_kernel);

    if (table) {
        size_t n_unused = 0, first = 0;
        for (size_t i = table->n; i-- > 0;)
            if (!b.used[i]) {
                n_unused++;
                first = i;
            }
        if (b.n_missing || b.n_bad || n_unused) {
            char msg[sizeof err->msg] = "";
            if (b.n_missing)
                note(msg, sizeof msg, " %d missing: %s%s;", b.n_missing, b.missing,
                     b.n_missing > 6 ? " ..." : "");
            if (b.n_bad)
                note(msg, sizeof msg, " %d with the wrong shape: %s%s;", b.n_bad, b.bad,
                     b.n_bad > 4 ? " ..." : "");
            if (n_unused)
                note(msg, sizeof msg, " %zu the configuration does not use, first '%s';",
                     n_unused, table->params[first].name);
            if (msg[0])
                msg[strlen(msg) - 1] = '\0';
            sd_err_set(err, "U-Net weights do not match the configuration:%s", msg);
            free(b.used);
            sd_unet_free(u);
            return -1;
        }
        free(b.used);
    }
    *out = u;
    return 0;
}

int sd_unet_create(sd_unet **out, const sd_unet_config *c, const sd_param_table *table,
                   const void *params, const sd_backend *be, sd_err *err)
{
    SD_CHECK(out && c && table && params && be, "sd_unet_create needs every argument");
    return sd_unet_build_tree(out, c, table, params, 0, be, err);
}

int sd_unet_create_from_weights(sd_unet **out, const sd_unet_config *c, const sd_weights *w,
                                const sd_backend *be, sd_err *err)
{
    SD_CHECK(out && c && w && be, "sd_unet_create_from_weights needs every argument");
    *out = NULL;
    if (be->device != SD_DEV_CPU || be->dtype != SD_F32)
        return sd_err_set(err, "sd_weights hold host fp32 tensors, which the '%s' backend "
                          "cannot use in place: copy the flat buffer to the backend and call "
                          "sd_unet_create", be->name);
    return sd_unet_build_tree(out, c, &w->table, w->data, 0, be, err);
}

void sd_unet_set_batch_invariant(sd_unet *u, int on)
{
    u->batch_invariant = on != 0;
}

const sd_unet_config *sd_unet_get_config(const sd_unet *u)
{
    return &u->c;
}

/* ---- the forward ---------------------------------------------------------------------------- */


void *ufw_alloc(ufw *f, int64_t elems)
{
    size_t bytes = (size_t)elems * f->es;
    void *p = sd_arena_alloc(f->a, bytes);
    if (!p && !f->dry)
        sd_fatalf(__FILE__, __LINE__, __func__, "U-Net activation arena too small",
                  "%zu bytes asked at %zu of %zu used (size the arena with "
                  "sd_unet_scratch_bytes, after setting the thread count)",
                  bytes, sd_arena_used(f->a), sd_arena_capacity(f->a));
    return p;
}

sd_scratch ufw_scratch(ufw *f, size_t bytes)
{
    sd_scratch s = sd_scratch_none();
    if (bytes) {
        s.bytes = bytes;
        s.ptr = sd_arena_alloc(f->a, bytes);
        if (!s.ptr && !f->dry)
            sd_fatalf(__FILE__, __LINE__, __func__, "U-Net activation arena too small",
                      "%zu bytes of op scratch asked at %zu of %zu used (size the arena with "
                      "sd_unet_scratch_bytes, after setting the thread count)",
                      bytes, sd_arena_used(f->a), sd_arena_capacity(f->a));
    }
    return s;
}

void ufw_tap(ufw *f, const char *name, const void *x, int n, int h, int w, int c)
{
    if (f->tap && f->tap->fn && !f->dry)
        f->tap->fn(f->tap->user, name, x, n, h, w, c);
}

int ufw_tapping(const ufw *f)
{
    return f->tap && f->tap->fn && !f->dry;
}

/* y [n * per, out] = x [n * per, in] w^T + b. In batch-invariant mode each sample is its own
 * call, because a BLAS GEMM may round a row differently depending on the number of rows and
 * the row's position among them (OpenBLAS on Zen: it does). */
void ufw_linear(ufw *f, int n, int64_t per, int in, int out, const void *x, const void *w,
                      const void *b, void *y)
{
    f->flops += 2.0 * (double)n * per * in * out;
    if (f->dry)
        return;
    if (f->u->batch_invariant && n > 1)
        for (int i = 0; i < n; i++)
            sd_linear_forward(f->be, per, in, out, (const char *)x + (size_t)(i * per * in) * f->es,
                              w, b, (char *)y + (size_t)(i * per * out) * f->es);
    else
        sd_linear_forward(f->be, (int64_t)n * per, in, out, x, w, b, y);
}

/* y = ufw_linear(x) + z in one pass where the backend can (z must not alias y) */
void ufw_linear_add(ufw *f, int n, int64_t per, int in, int out, const void *x, const void *w,
                    const void *b, const void *z, void *y)
{
    f->flops += 2.0 * (double)n * per * in * out;
    if (f->dry)
        return;
    if (f->u->batch_invariant && n > 1)
        for (int i = 0; i < n; i++) {
            const size_t yo = (size_t)(i * per * out) * f->es;
            sd_linear_forward_add(f->be, per, in, out,
                                  (const char *)x + (size_t)(i * per * in) * f->es, w, b,
                                  (const char *)z + yo, (char *)y + yo);
        }
    else
        sd_linear_forward_add(f->be, (int64_t)n * per, in, out, x, w, b, z, y);
}

/* conv (z NULL) or conv + residual z */
static void conv_z(ufw *f, const sd_conv2d_desc *d, const void *x, ut_lin l, const void *z,
                   void *y)
{
    size_t mark = sd_arena_mark(f->a);
    f->flops += 2.0 * d->n * d->h_out * d->w_out * (double)d->c_out * d->c_in * d->kh * d->kw;
    if (f->u->batch_invariant && d->n > 1) {
        sd_conv2d_desc one = *d;
        const size_t in_bytes = (size_t)d->h * d->w * d->c_in * f->es;
        const size_t out_bytes = (size_t)d->h_out * d->w_out * d->c_out * f->es;
        sd_scratch ws;
        one.n = 1;
        ws = ufw_scratch(f, sd_conv2d_forward_scratch_bytes(f->be, &one));
        if (!f->dry)
            for (int i = 0; i < d->n; i++) {
                const void *xi = (const char *)x + i * in_bytes;
                void *yi = (char *)y + i * out_bytes;
                if (z)
                    sd_conv2d_forward_add(f->be, &one, xi, l.w, l.b,
                                          (const char *)z + i * out_bytes, yi, ws);
                else
                    sd_conv2d_forward(f->be, &one, xi, l.w, l.b, yi, ws);
            }
    } else {
        sd_scratch ws = ufw_scratch(f, sd_conv2d_forward_scratch_bytes(f->be, d));
        if (!f->dry && z)
            sd_conv2d_forward_add(f->be, d, x, l.w, l.b, z, y, ws);
        else if (!f->dry)
            sd_conv2d_forward(f->be, d, x, l.w, l.b, y, ws);
    }
    sd_arena_reset_to(f->a, mark);
}

void ufw_conv(ufw *f, const sd_conv2d_desc *d, const void *x, ut_lin l, void *y)
{
    conv_z(f, d, x, l, NULL, y);
}

void ufw_conv_add(ufw *f, const sd_conv2d_desc *d, const void *x, ut_lin l, const void *z,
                  void *y)
{
    conv_z(f, d, x, l, z, y);
}

void ufw_group_norm(ufw *f, int n, int64_t hw, int c, float eps, int silu, const void *x,
                          ut_norm g, void *y)
{
    sd_group_norm_desc d;
    size_t mark = sd_arena_mark(f->a);
    sd_scratch ws;
    SD_CHECK(hw <= INT_MAX, "group norm over %lld positions", (long long)hw);
    d.n = n;
    d.hw = (int)hw;
    d.c = c;
    d.groups = f->u->c.norm_num_groups;
    d.eps = eps;
    d.silu = silu;
    ws = ufw_scratch(f, sd_group_norm_forward_scratch_bytes(f->be, &d));
    if (!f->dry)
        sd_group_norm_forward(f->be, &d, x, g.g, g.b, y, NULL, NULL, ws);
    sd_arena_reset_to(f->a, mark);
}

void ufw_attention(ufw *f, const sd_attention_desc *d, const void *q, const void *k,
                         const void *v, void *o)
{
    size_t mark = sd_arena_mark(f->a);
    sd_scratch ws = ufw_scratch(f, sd_attention_forward_scratch_bytes(f->be, d));
    f->flops += 4.0 * d->batch * d->heads * (double)d->t_q * d->t_kv * d->head_dim;
    if (!f->dry)
        sd_attention_forward(f->be, d, q, k, v, o, NULL, ws);
    sd_arena_reset_to(f->a, mark);
}

void ufw_add(ufw *f, int64_t n, const void *a, const void *b, void *y)
{
    if (!f->dry)
        sd_add(f->be, n, a, b, y);
}

/* ResnetBlock2D: y = shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x))) + proj(SiLU(emb))))).
 * emb_act is SiLU(emb) [n, temb], the same for every ResNet, so it is computed once. */
static void fw_resnet(ufw *f, const ut_resnet *r, int n, int h, int w, const void *x,
                      const void *emb_act, void *y)
{
    const sd_unet_config *c = &f->u->c;
    const int64_t hw = (int64_t)h * w, rows = n * hw;
    const float eps = (float)c->norm_eps;
    size_t mark = sd_arena_mark(f->a);
    void *t = ufw_alloc(f, rows * (r->cin > r->cout ? r->cin : r->cout));
    void *hb = ufw_alloc(f, rows * r->cout);
    void *tp = ufw_alloc(f, (int64_t)n * r->cout);
    sd_conv2d_desc d1 = sd_conv2d_make(n, h, w, r->cin, r->cout, 3, 1, 1);
    sd_conv2d_desc d2 = sd_conv2d_make(n, h, w, r->cout, r->cout, 3, 1, 1);

    ufw_group_norm(f, n, hw, r->cin, eps, 1, x, r->norm1, t);
    ufw_conv(f, &d1, t, r->conv1, hb);
    ufw_linear(f, n, 1, f->u->temb_dim, r->cout, emb_act, r->time_proj.w, r->time_proj.b, tp);
    if (!f->dry)
        sd_add_bcast_forward(f->be, n, hw, r->cout, hb, tp, hb);
    ufw_group_norm(f, n, hw, r->cout, eps, 1, hb, r->norm2, t);
    /* y = residual + conv2(t), the add in the convolution's pass where the backend can */
    if (r->cin != r->cout) {
        sd_conv2d_desc ds = sd_conv2d_make(n, h, w, r->cin, r->cout, 1, 1, 0);
        ufw_conv(f, &ds, x, r->shortcut, hb); /* hb is free once norm2 has read it */
        ufw_conv_add(f, &d2, t, r->conv2, hb, y);
    } else {
        ufw_conv_add(f, &d2, t, r->conv2, x, y);
    }
    sd_arena_reset_to(f->a, mark);
}

static void swap_ptr(void **a, void **b)
{
    void *t = *a;
    *a = *b;
    *b = t;
}

/* Transformer2DModel: y = x + proj_out(blocks(proj_in(GroupNorm(x)))), tokens = pixels (NHWC
 * rows), so the reshapes of the PyTorch code are no-ops here and a 1x1-conv projection is the
 * same GEMM as a linear one. */
static void fw_transformer(ufw *f, const ut_transformer *x, int n, int h, int w, const void *in,
                           const void *ctx, int ctx_len, void *y)
{
    const int64_t hw = (int64_t)h * w, rows = n * hw, crow = (int64_t)n * ctx_len;
    const int C = x->c, D = x->inner, X = f->u->c.cross_attention_dim;
    size_t mark = sd_arena_mark(f->a);
    void *hs, *ln, *q, *k, *v, *o, *ff, *gg;
    sd_attention_desc self, cross;

    SD_CHECK(hw <= INT_MAX, "%lld tokens", (long long)hw);
    self = sd_attention_make(n, x->heads, x->head_dim, (int)hw, (int)hw, 0);
    cross = sd_attention_make(n, x->heads, x->head_dim, (int)hw, ctx_len, 0);

    ln = ufw_alloc(f, rows * (C > D ? C : D));
    hs = ufw_alloc(f, rows * D);
    ufw_group_norm(f, n, hw, C, UNET_TRANSFORMER_GN_EPS, 0, in, x->norm, ln);
    ufw_linear(f, n, hw, C, D, ln, x->proj_in.w, x->proj_in.b, hs);

    q = ufw_alloc(f, rows * D);
    o = ufw_alloc(f, rows * D);
    k = ufw_alloc(f, (rows > crow ? rows : crow) * D);
    v = ufw_alloc(f, (rows > crow ? rows : crow) * D);
    ff = ufw_alloc(f, rows * 8 * D);
    gg = ufw_alloc(f, rows * 4 * D);
    for (int l = 0; l < x->layers; l++) {
        const ut_block *b = &x->blocks[l];
        /* h = h + attn1(norm1(h)) */
        if (!f->dry)
            sd_layer_norm_forward(f->be, rows, D, UNET_LAYER_NORM_EPS, hs, b->norm1.g, b->norm1.b,
                                  ln, NULL, NULL);
        ufw_linear(f, n, hw, D, D, ln, b->q1, NULL, q);
        ufw_linear(f, n, hw, D, D, ln, b->k1, NULL, k);
        ufw_linear(f, n, hw, D, D, ln, b->v1, NULL, v);
        ufw_attention(f, &self, q, k, v, o);
        /* q = out1(o) + hs, then q and hs trade places (the add in the GEMM's pass) */
        ufw_linear_add(f, n, hw, D, D, o, b->out1.w, b->out1.b, hs, q);
        swap_ptr(&q, &hs);
        /* h = h + attn2(norm2(h), ctx) */
        if (!f->dry)
            sd_layer_norm_forward(f->be, rows, D, UNET_LAYER_NORM_EPS, hs, b->norm2.g, b->norm2.b,
                                  ln, NULL, NULL);
        ufw_linear(f, n, hw, D, D, ln, b->q2, NULL, q);
        ufw_linear(f, n, ctx_len, X, D, ctx, b->k2, NULL, k);
        ufw_linear(f, n, ctx_len, X, D, ctx, b->v2, NULL, v);
        ufw_attention(f, &cross, q, k, v, o);
        ufw_linear_add(f, n, hw, D, D, o, b->out2.w, b->out2.b, hs, q);
        swap_ptr(&q, &hs);
        /* h = h + ff(norm3(h)), ff = Linear(4D -> D)(GEGLU(Linear(D -> 8D))) */
        if (!f->dry)
            sd_layer_norm_forward(f->be, rows, D, UNET_LAYER_NORM_EPS, hs, b->norm3.g, b->norm3.b,
                                  ln, NULL, NULL);
        ufw_linear(f, n, hw, D, 8 * D, ln, b->ff_in.w, b->ff_in.b, ff);
        if (!f->dry)
            sd_geglu_forward(f->be, rows, 4 * D, ff, gg);
        ufw_linear_add(f, n, hw, 4 * D, D, gg, b->ff_out.w, b->ff_out.b, hs, q);
        swap_ptr(&q, &hs);
    }
    if (y != in) {
        ufw_linear_add(f, n, hw, D, C, hs, x->proj_out.w, x->proj_out.b, in, y);
    } else {
        ufw_linear(f, n, hw, D, C, hs, x->proj_out.w, x->proj_out.b, y);
        ufw_add(f, rows * C, y, in, y);
    }
    sd_arena_reset_to(f->a, mark);
}

static sd_timestep_embedding_desc time_desc(const sd_unet_config *c)
{
    sd_timestep_embedding_desc td = sd_timestep_embedding_sd2(c->block_out_channels[0]);
    td.flip_sin_to_cos = c->flip_sin_to_cos;
    td.downscale_freq_shift = (float)c->freq_shift;
    return td;
}

void sd_unet_time_sinusoid(const sd_unet_config *c, int n, const float *timesteps, float *out)
{
    const sd_timestep_embedding_desc td = time_desc(c);
    sd_timestep_embedding(sd_backend_cpu(), n, &td, timesteps, out);
}

void ufw_time_sinusoid(ufw *f, int n, const float *timesteps, void *tsin)
{
    const sd_unet_config *c = &f->u->c;
    const int c0 = c->block_out_channels[0];
    if (f->dry)
        return;
    if (f->be->device == SD_DEV_CPU && f->be->dtype == SD_F32) {
        sd_unet_time_sinusoid(c, n, timesteps, tsin);
    } else {
        /* host fp32, then converted to the compute type (diffusers casts t_emb to the sample's
         * dtype the same way); as many rows per (synchronous) upload as the buffer holds
         * (64 KiB): one upload for a batch of up to 51 at SD2's 320 channels. The training
         * step avoids the wait: its sinusoids travel with its inputs (sd_unet_train_forward_sin) */
        float rows[4 * SD_UNET_MAX_TIME_PROJ_DIM];
        const int per_upload = (int)(sizeof rows / sizeof rows[0]) / c0;
        for (int b0 = 0; b0 < n; b0 += per_upload) {
            const int m = n - b0 < per_upload ? n - b0 : per_upload;
            sd_unet_time_sinusoid(c, m, timesteps + b0, rows);
            sd_upload_f32(f->be, (char *)tsin + (size_t)b0 * c0 * f->es, rows, (int64_t)m * c0);
        }
    }
}

sd_conv2d_desc sd_unet_downsample_desc(const sd_unet_config *c, int n, int h, int w, int ch)
{
    return c->downsample_padding
               ? sd_conv2d_make(n, h, w, ch, ch, 3, 2, c->downsample_padding)
               : sd_conv2d_make_padded(n, h, w, ch, ch, 3, 3, 2, 0, 1, 0, 1);
}

void sd_unet_level_sizes(const sd_unet_config *c, int h, int w, int *hs, int *ws, int *forced)
{
    const int L = c->n_levels;
    *forced = 0;
    /* spatial size of every level (Downsample2D: 3x3 stride 2, pad per downsample_padding) */
    hs[0] = h;
    ws[0] = w;
    for (int l = 1; l < L; l++) {
        sd_conv2d_desc d = sd_unet_downsample_desc(c, 1, hs[l - 1], ws[l - 1], 1);
        hs[l] = d.h_out;
        ws[l] = d.w_out;
    }
    /* diffusers forces every upsampler to the next skip's size unless both sides are
     * multiples of 2^(number of upsamplers) */
    if (h % (1 << (L - 1)) || w % (1 << (L - 1)))
        *forced = 1;
}

typedef struct skip {
    const void *p;
    int h, w, c;
} skip;

#define UNET_MAX_SKIPS (1 + SD_MODEL_MAX_LEVELS * (SD_UNET_MAX_LAYERS_PER_BLOCK + 1))

static void unet_run(ufw *f, int n, int h, int w, const void *sample, const float *timesteps,
                     const void *ctx, int ctx_len, void *out)
{
    const sd_unet *u = f->u;
    const sd_unet_config *c = &u->c;
    const int L = c->n_levels, c0 = c->block_out_channels[0], T = u->temb_dim;
    const size_t mark0 = sd_arena_mark(f->a);
    int hs[SD_MODEL_MAX_LEVELS], ws[SD_MODEL_MAX_LEVELS], forced, ch;
    skip st[UNET_MAX_SKIPS];
    int ns = 0;
    void *tsin, *t1, *emb, *cur, *spare;
    int64_t pp = 0;
    char name[64];

    sd_unet_level_sizes(c, h, w, hs, ws, &forced);

    /* time embedding: sinusoid (fp32) -> linear_1 -> SiLU -> linear_2; ResNets use SiLU(emb) */
    tsin = ufw_alloc(f, (int64_t)n * c0);
    ufw_time_sinusoid(f, n, timesteps, tsin);
    t1 = ufw_alloc(f, (int64_t)n * T);
    emb = ufw_alloc(f, (int64_t)n * T);
    ufw_linear(f, n, 1, c0, T, tsin, u->time1.w, u->time1.b, t1);
    if (!f->dry)
        sd_silu_forward(f->be, (int64_t)n * T, t1, t1);
    ufw_linear(f, n, 1, T, T, t1, u->time2.w, u->time2.b, emb);
    ufw_tap(f, "time_embedding", emb, n, 1, 1, T);
    if (!f->dry)
        sd_silu_forward(f->be, (int64_t)n * T, emb, t1);
    /* from here t1 = SiLU(emb) */

    /* conv_in; the skip stack grows upwards in the arena and stays until the end */
    {
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c->in_channels, c0, c->conv_in_kernel, 1,
                                          c->conv_in_kernel / 2);
        void *s = ufw_alloc(f, (int64_t)n * h * w * c0);
        ufw_conv(f, &d, sample, u->conv_in, s);
        st[ns++] = (skip){s, h, w, c0};
        ufw_tap(f, "conv_in", s, n, h, w, c0);
        cur = s;
        ch = c0;
    }

    /* down path: every stage output is a skip, allocated before its block's temporaries */
    for (int i = 0; i < L; i++) {
        const ut_stage *s = &u->down[i];
        const int cout = c->block_out_channels[i];
        const int64_t rows = (int64_t)n * hs[i] * ws[i];
        for (int j = 0; j < s->n_res; j++) {
            void *o = ufw_alloc(f, rows * cout);
            if (s->attn) {
                size_t mark = sd_arena_mark(f->a);
                void *r = ufw_alloc(f, rows * cout);
                fw_resnet(f, &s->res[j], n, hs[i], ws[i], cur, t1, r);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "down_blocks.%d.resnets.%d", i, j);
                    ufw_tap(f, name, r, n, hs[i], ws[i], cout);
                }
                fw_transformer(f, &s->attn[j], n, hs[i], ws[i], r, ctx, ctx_len, o);
                sd_arena_reset_to(f->a, mark);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "down_blocks.%d.attentions.%d", i, j);
                    ufw_tap(f, name, o, n, hs[i], ws[i], cout);
                }
            } else {
                fw_resnet(f, &s->res[j], n, hs[i], ws[i], cur, t1, o);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "down_blocks.%d.resnets.%d", i, j);
                    ufw_tap(f, name, o, n, hs[i], ws[i], cout);
                }
            }
            st[ns++] = (skip){o, hs[i], ws[i], cout};
            cur = o;
            ch = cout;
        }
        if (s->has_sampler) {
            sd_conv2d_desc d = sd_unet_downsample_desc(c, n, hs[i], ws[i], cout);
            void *o = ufw_alloc(f, (int64_t)n * hs[i + 1] * ws[i + 1] * cout);
            ufw_conv(f, &d, cur, s->sampler, o);
            st[ns++] = (skip){o, hs[i + 1], ws[i + 1], cout};
            cur = o;
            if (ufw_tapping(f)) {
                snprintf(name, sizeof name, "down_blocks.%d.downsamplers.0", i);
                ufw_tap(f, name, o, n, hs[i + 1], ws[i + 1], cout);
            }
        }
        if (ufw_tapping(f)) {
            int lv = s->has_sampler ? i + 1 : i;
            snprintf(name, sizeof name, "down_blocks.%d", i);
            ufw_tap(f, name, cur, n, hs[lv], ws[lv], cout);
        }
    }

    /* mid block and up path ping-pong between two buffers sized for the largest state */
    pp = (int64_t)n * hs[L - 1] * ws[L - 1] * c->block_out_channels[L - 1];
    for (int i = 0; i < L; i++) {
        const int lvl = L - 1 - i, cout = c->block_out_channels[lvl];
        int64_t e = (int64_t)n * hs[lvl] * ws[lvl] * cout;
        if (e > pp)
            pp = e;
        if (lvl > 0) {
            e = (int64_t)n * hs[lvl - 1] * ws[lvl - 1] * cout;
            if (e > pp)
                pp = e;
        }
    }
    {
        const int hb = hs[L - 1], wb = ws[L - 1];
        void *a = ufw_alloc(f, pp), *b = ufw_alloc(f, pp);
        fw_resnet(f, &u->mid_res[0], n, hb, wb, cur, t1, a);
        ufw_tap(f, "mid_block.resnets.0", a, n, hb, wb, ch);
        fw_transformer(f, &u->mid_attn, n, hb, wb, a, ctx, ctx_len, b);
        ufw_tap(f, "mid_block.attentions.0", b, n, hb, wb, ch);
        fw_resnet(f, &u->mid_res[1], n, hb, wb, b, t1, a);
        ufw_tap(f, "mid_block.resnets.1", a, n, hb, wb, ch);
        ufw_tap(f, "mid_block", a, n, hb, wb, ch);
        cur = a;
        spare = b;
    }

    for (int i = 0; i < L; i++) {
        const ut_stage *s = &u->up[i];
        const int lvl = L - 1 - i, cout = c->block_out_channels[lvl];
        const int H = hs[lvl], W = ws[lvl];
        const int64_t rows = (int64_t)n * H * W;
        for (int j = 0; j < s->n_res; j++) {
            const ut_resnet *r = &s->res[j];
            size_t mark = sd_arena_mark(f->a);
            void *cat, *tmp;
            skip sk;
            SD_CHECK(ns > 0, "up_blocks.%d.resnets.%d: the skip stack is empty", i, j);
            sk = st[--ns];
            SD_CHECK(sk.h == H && sk.w == W && ch + sk.c == r->cin,
                     "up_blocks.%d.resnets.%d: skip [%d,%d,%d] does not fit [%d,%d,%d+%d]", i, j,
                     sk.h, sk.w, sk.c, H, W, ch, r->cin - ch);
            cat = ufw_alloc(f, rows * r->cin);
            if (!f->dry)
                sd_concat_channels(f->be, rows, ch, sk.c, cur, sk.p, cat);
            if (s->attn) {
                tmp = ufw_alloc(f, rows * cout);
                fw_resnet(f, r, n, H, W, cat, t1, tmp);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "up_blocks.%d.resnets.%d", i, j);
                    ufw_tap(f, name, tmp, n, H, W, cout);
                }
                fw_transformer(f, &s->attn[j], n, H, W, tmp, ctx, ctx_len, spare);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "up_blocks.%d.attentions.%d", i, j);
                    ufw_tap(f, name, spare, n, H, W, cout);
                }
            } else {
                fw_resnet(f, r, n, H, W, cat, t1, spare);
                if (ufw_tapping(f)) {
                    snprintf(name, sizeof name, "up_blocks.%d.resnets.%d", i, j);
                    ufw_tap(f, name, spare, n, H, W, cout);
                }
            }
            sd_arena_reset_to(f->a, mark);
            tmp = cur;
            cur = spare;
            spare = tmp;
            ch = cout;
        }
        if (s->has_sampler) {
            /* nearest x2, or to the next skip's size when forced, then a 3x3 conv */
            const int ho = forced ? st[ns - 1].h : 2 * H, wo = forced ? st[ns - 1].w : 2 * W;
            size_t mark = sd_arena_mark(f->a);
            void *up = ufw_alloc(f, (int64_t)n * ho * wo * cout), *tmp;
            sd_conv2d_desc d = sd_conv2d_make(n, ho, wo, cout, cout, 3, 1, 1);
            SD_CHECK(ho == hs[lvl - 1] && wo == ws[lvl - 1],
                     "upsampled %dx%d, next skips are %dx%d", ho, wo, hs[lvl - 1], ws[lvl - 1]);
            if (!f->dry)
                sd_upsample_nearest_forward(f->be, n, H, W, cout, ho, wo, cur, up);
            ufw_conv(f, &d, up, s->sampler, spare);
            sd_arena_reset_to(f->a, mark);
            tmp = cur;
            cur = spare;
            spare = tmp;
            if (ufw_tapping(f)) {
                snprintf(name, sizeof name, "up_blocks.%d.upsamplers.0", i);
                ufw_tap(f, name, cur, n, ho, wo, cout);
            }
        }
        if (ufw_tapping(f)) {
            int lv = s->has_sampler ? lvl - 1 : lvl;
            snprintf(name, sizeof name, "up_blocks.%d", i);
            ufw_tap(f, name, cur, n, hs[lv], ws[lv], cout);
        }
    }
    SD_CHECK(ns == 0, "%d skips left after the up path", ns);

    /* conv_norm_out -> SiLU -> conv_out */
    {
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c0, c->out_channels, c->conv_out_kernel, 1,
                                          c->conv_out_kernel / 2);
        void *t = ufw_alloc(f, (int64_t)n * h * w * c0);
        ufw_group_norm(f, n, (int64_t)h * w, c0, (float)c->norm_eps, 1, cur, u->norm_out, t);
        ufw_tap(f, "conv_norm_out", t, n, h, w, c0);
        ufw_conv(f, &d, t, u->conv_out, out);
        ufw_tap(f, "conv_out", out, n, h, w, c->out_channels);
    }
    sd_arena_reset_to(f->a, mark0);
}

int sd_unet_check_shape(const sd_unet_config *c, int batch, int h, int w, int ctx_len,
                        sd_err *err)
{
    int64_t widest = 0;
    if (check_config(c, err))
        return -1;
    if (batch < 1 || h < 1 || w < 1 || ctx_len < 1)
        return sd_err_set(err, "U-Net input sizes must be positive (batch %d, latent %dx%d, "
                          "context length %d)", batch, h, w, ctx_len);
    /* the widest per-pixel row is the feed-forward's 8 x inner at full resolution, or an
     * up-path concat; rows of every GEMM must fit a BLAS int */
    for (int i = 0; i < c->n_levels; i++) {
        int64_t cw = 8 * (int64_t)c->block_out_channels[i];
        if (cw > widest)
            widest = cw;
    }
    if ((int64_t)batch * h * w > INT_MAX / 4 || (int64_t)batch * h * w * widest > INT64_MAX / 16 ||
        (int64_t)batch * ctx_len > INT_MAX)
        return sd_err_set(err, "U-Net input of batch %d, latent %dx%d is too large", batch, h, w);
    return 0;
}

static double dry_run(const sd_unet_config *c, const sd_backend *be, int batch_invariant,
                      int batch, int h, int w, int ctx_len, size_t *bytes)
{
    sd_unet *u;
    sd_err err;
    sd_arena a;
    ufw f;
    SD_CHECK(sd_unet_check_shape(c, batch, h, w, ctx_len, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_unet_build_tree(&u, c, NULL, NULL, 0, be, &err) == 0, "%s", err.msg);
    u->batch_invariant = batch_invariant;
    SD_CHECK(sd_arena_init_measure(&a, 0) == 0, "measuring arena");
    memset(&f, 0, sizeof f);
    f.u = u;
    f.be = be;
    f.a = &a;
    f.dry = 1;
    f.es = sd_dtype_size(be->dtype);
    unet_run(&f, batch, h, w, NULL, NULL, NULL, ctx_len, NULL);
    if (bytes)
        *bytes = sd_arena_high_water(&a) + SD_ARENA_DEFAULT_ALIGNMENT;
    sd_arena_free(&a);
    sd_unet_free(u);
    return f.flops;
}

size_t sd_unet_scratch_bytes(const sd_unet_config *c, const sd_backend *be, int batch, int h,
                             int w, int ctx_len)
{
    size_t on = 0, off = 0;
    SD_CHECK(c && be, "sd_unet_scratch_bytes needs a configuration and a backend");
    dry_run(c, be, 1, batch, h, w, ctx_len, &on);
    dry_run(c, be, 0, batch, h, w, ctx_len, &off);
    return on > off ? on : off;
}

double sd_unet_forward_flops(const sd_unet_config *c, int batch, int h, int w, int ctx_len)
{
    SD_CHECK(c, "sd_unet_forward_flops needs a configuration");
    return dry_run(c, sd_backend_cpu(), 0, batch, h, w, ctx_len, NULL);
}

void sd_unet_forward(const sd_unet *u, int batch, int h, int w, const void *sample,
                     const float *timesteps, const void *ctx, int ctx_len, void *out,
                     sd_arena *arena, const sd_unet_tap *tap)
{
    sd_err err;
    ufw f;
    SD_CHECK(u && sample && timesteps && ctx && out && arena,
             "sd_unet_forward needs every tensor and an arena");
    SD_CHECK(sd_unet_check_shape(&u->c, batch, h, w, ctx_len, &err) == 0, "%s", err.msg);
    memset(&f, 0, sizeof f);
    f.u = u;
    f.be = u->be;
    f.a = arena;
    f.dry = sd_arena_is_measuring(arena);
    f.es = sd_dtype_size(u->be->dtype);
    f.tap = tap;
    unet_run(&f, batch, h, w, sample, timesteps, ctx, ctx_len, out);
}
