/* The U-Net's training forward (keeping what the backward needs) and its backward, on the op
 * interface, with the memory of a step planned once by a dry run. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "unet_internal.h"

/*
 * Saved tensors go on a tape (a stack of pointers into the arena): a block's forward pushes
 * what its backward pops, in reverse order. The top level pushes its own pointers after the
 * blocks it called, so the backward pops the top-level pointers of a block first and then lets
 * the block pop its internals. With recomputation the blocks push nothing during the forward;
 * the backward re-runs a block's forward (pushing) right before its backward (popping).
 */
struct sd_unet_trainer {
    const sd_unet *u;
    sd_unet *g; /* the gradient mirror: the same tree, pointers into the fp32 grads */
    int batch, h, w, ctx_len, recompute;
    size_t arena_bytes;
    double flops;
    void **tape;
    int tape_n, tape_cap, tape_max;
    /* one step's state */
    ufw f;
    int forward_done;
    size_t mark0;
    const void *sample, *ctx;
    const float *tsin_in; /* sd_unet_train_forward_sin's sinusoids, or NULL */
    void *emb_act, *d_emb_act;
    struct tskip {
        void *p;
        int h, w, c;
    } skips[1 + SD_MODEL_MAX_LEVELS * (SD_UNET_MAX_LAYERS_PER_BLOCK + 1)];
    int n_skips;
    /* the gradient-ready hook (sd_unet_trainer_set_ready_hook) and the first offset of every
     * block the backward finishes, in floats: [0] conv_norm_out, [1 + i] up_blocks.i,
     * [1 + L] mid_block, [2 + L + i] down_blocks.i */
    sd_unet_ready_fn ready_fn;
    void *ready_user;
    size_t ready_at[3 + 2 * SD_MODEL_MAX_LEVELS];
    /* the parameter-need hook (sd_unet_trainer_set_need_hook) and the buffer's length */
    sd_unet_need_fn need_fn;
    void *need_user;
    size_t total_floats;
};

typedef struct sd_unet_trainer tr;

static void push(tr *t, const void *p)
{
    if (t->f.dry) {
        if (++t->tape_n > t->tape_max)
            t->tape_max = t->tape_n;
        return;
    }
    SD_CHECK(t->tape_n < t->tape_cap, "U-Net tape overflow (%d entries planned)", t->tape_cap);
    t->tape[t->tape_n++] = (void *)p;
}

static void *pop(tr *t)
{
    SD_CHECK(t->tape_n > 0, "U-Net tape underflow: the backward does not mirror the forward");
    t->tape_n--;
    return t->f.dry ? NULL : t->tape[t->tape_n];
}

static float *alloc_f32(tr *t, int64_t n)
{
    ufw tmp = t->f;
    tmp.es = sizeof(float);
    return ufw_alloc(&tmp, n);
}

static void *alloc_zero(tr *t, int64_t elems)
{
    void *p = ufw_alloc(&t->f, elems);
    if (!t->f.dry)
        sd_zero(t->f.be, p, (size_t)elems * t->f.es);
    return p;
}

static int running(const tr *t)
{
    return !t->f.dry;
}

/* Tells the hook that the gradients from ready_at[slot] to the end of the buffer are final. */
static void ready(tr *t, int slot)
{
    if (running(t) && t->ready_fn)
        t->ready_fn(t->ready_user, slot < 0 ? 0 : t->ready_at[slot]);
}

/* Tells the hook that the forward is about to read the parameters [0, upto). */
static void need(tr *t, size_t upto)
{
    if (running(t) && t->need_fn)
        t->need_fn(t->need_user, upto);
}

/* ---- ops with saved statistics, and the backward ops (per sample when batch invariant) ---- */

static sd_group_norm_desc gn_desc(const tr *t, int n, int64_t hw, int c, float eps, int silu)
{
    sd_group_norm_desc d;
    SD_CHECK(hw <= INT_MAX, "group norm over %lld positions", (long long)hw);
    d.n = n;
    d.hw = (int)hw;
    d.c = c;
    d.groups = t->u->c.norm_num_groups;
    d.eps = eps;
    d.silu = silu;
    return d;
}

static void gn_fwd(tr *t, const sd_group_norm_desc *d, const void *x, ut_norm g, void *y,
                   float *mean, float *rstd)
{
    size_t mark = sd_arena_mark(t->f.a);
    sd_scratch ws = ufw_scratch(&t->f, sd_group_norm_forward_scratch_bytes(t->f.be, d));
    if (running(t))
        sd_group_norm_forward(t->f.be, d, x, g.g, g.b, y, mean, rstd, ws);
    sd_arena_reset_to(t->f.a, mark);
}

static void gn_bwd(tr *t, const sd_group_norm_desc *d, const void *x, ut_norm g, ut_norm dg,
                   const float *mean, const float *rstd, const void *dy, void *dx, int acc)
{
    size_t mark = sd_arena_mark(t->f.a);
    sd_scratch ws = ufw_scratch(&t->f, sd_group_norm_backward_scratch_bytes(t->f.be, d));
    if (running(t))
        sd_group_norm_backward(t->f.be, d, x, g.g, g.b, mean, rstd, dy, dx, acc, (float *)dg.g,
                               (float *)dg.b, ws);
    sd_arena_reset_to(t->f.a, mark);
}

static void ln_fwd(tr *t, int64_t rows, int c, const void *x, ut_norm g, void *y, float *mean,
                   float *rstd)
{
    if (running(t))
        sd_layer_norm_forward(t->f.be, rows, c, UNET_LAYER_NORM_EPS, x, g.g, g.b, y, mean, rstd);
}

static void ln_bwd(tr *t, int64_t rows, int c, const void *x, ut_norm g, ut_norm dg,
                   const float *mean, const float *rstd, const void *dy, void *dx, int acc)
{
    size_t mark = sd_arena_mark(t->f.a);
    sd_scratch ws = ufw_scratch(&t->f, sd_layer_norm_backward_scratch_bytes(t->f.be, rows, c));
    if (running(t))
        sd_layer_norm_backward(t->f.be, rows, c, x, g.g, mean, rstd, dy, dx, acc, (float *)dg.g,
                               (float *)dg.b, ws);
    sd_arena_reset_to(t->f.a, mark);
}

static void attn_fwd(tr *t, const sd_attention_desc *d, const void *q, const void *k,
                     const void *v, void *o, float *lse)
{
    size_t mark = sd_arena_mark(t->f.a);
    sd_scratch ws = ufw_scratch(&t->f, sd_attention_forward_scratch_bytes(t->f.be, d));
    t->f.flops += 4.0 * d->batch * d->heads * (double)d->t_q * d->t_kv * d->head_dim;
    if (running(t))
        sd_attention_forward(t->f.be, d, q, k, v, o, lse, ws);
    sd_arena_reset_to(t->f.a, mark);
}

static void attn_bwd(tr *t, const sd_attention_desc *d, const void *q, const void *k,
                     const void *v, const void *o, const float *lse, const void *dout, void *dq,
                     void *dk, void *dv)
{
    size_t mark = sd_arena_mark(t->f.a);
    sd_scratch ws = ufw_scratch(&t->f, sd_attention_backward_scratch_bytes(t->f.be, d));
    t->f.flops += 8.0 * d->batch * d->heads * (double)d->t_q * d->t_kv * d->head_dim;
    if (running(t))
        sd_attention_backward(t->f.be, d, q, k, v, o, lse, dout, dq, dk, dv, 0, ws);
    sd_arena_reset_to(t->f.a, mark);
}

/* dx (optional, = or +=) and dw, db (+=) of y [n * per, out] = x w^T + b. */
static void lin_bwd(tr *t, int n, int64_t per, int in, int out, const void *x, const void *w,
                    const void *dy, void *dx, int acc, const void *dw, const void *db)
{
    const sd_backend *be = t->f.be;
    const size_t es = t->f.es;
    size_t mark = sd_arena_mark(t->f.a);
    int split = t->u->batch_invariant && n > 1;
    int64_t rows = split ? per : (int64_t)n * per;
    sd_scratch ws = ufw_scratch(&t->f, sd_linear_backward_scratch_bytes(be, rows, in, out));
    t->f.flops += (dx ? 4.0 : 2.0) * (double)n * per * in * out;
    if (running(t)) {
        if (split)
            for (int i = 0; i < n; i++)
                sd_linear_backward(be, per, in, out, (const char *)x + (size_t)(i * per * in) * es,
                                   w, (const char *)dy + (size_t)(i * per * out) * es,
                                   dx ? (char *)dx + (size_t)(i * per * in) * es : NULL, acc,
                                   (float *)dw, (float *)db, ws);
        else
            sd_linear_backward(be, rows, in, out, x, w, dy, dx, acc, (float *)dw, (float *)db, ws);
    }
    sd_arena_reset_to(t->f.a, mark);
}

static void conv_bwd(tr *t, const sd_conv2d_desc *d, const void *x, ut_lin l, ut_lin dl,
                     const void *dy, void *dx, int acc)
{
    const sd_backend *be = t->f.be;
    size_t mark = sd_arena_mark(t->f.a);
    const double macs = (double)d->n * d->h_out * d->w_out * d->c_out * d->c_in * d->kh * d->kw;
    t->f.flops += (dx ? 4.0 : 2.0) * macs;
    if (t->u->batch_invariant && d->n > 1) {
        sd_conv2d_desc one = *d;
        const size_t in_bytes = (size_t)d->h * d->w * d->c_in * t->f.es;
        const size_t out_bytes = (size_t)d->h_out * d->w_out * d->c_out * t->f.es;
        sd_scratch ws;
        one.n = 1;
        ws = ufw_scratch(&t->f, sd_conv2d_backward_scratch_bytes(be, &one));
        if (running(t))
            for (int i = 0; i < d->n; i++)
                sd_conv2d_backward(be, &one, (const char *)x + i * in_bytes, l.w,
                                   (const char *)dy + i * out_bytes,
                                   dx ? (char *)dx + i * in_bytes : NULL, acc, (float *)dl.w,
                                   (float *)dl.b, ws);
    } else {
        sd_scratch ws = ufw_scratch(&t->f, sd_conv2d_backward_scratch_bytes(be, d));
        if (running(t))
            sd_conv2d_backward(be, d, x, l.w, dy, dx, acc, (float *)dl.w, (float *)dl.b, ws);
    }
    sd_arena_reset_to(t->f.a, mark);
}

/* dst (+)= src over n elements */
static void add_into(tr *t, int64_t n, const void *src, void *dst, int acc)
{
    if (!running(t))
        return;
    if (acc)
        sd_axpby(t->f.be, n, 1.0f, src, 1.0f, dst);
    else
        sd_copy(t->f.be, dst, src, (size_t)n * t->f.es);
}

/* ---- ResnetBlock2D ---------------------------------------------------------------------- */

/* Saves mean1, rstd1, t1 = SiLU(norm1(x)), h1 = conv1(t1) + proj(SiLU(emb)), mean2, rstd2,
 * t2 = SiLU(norm2(h1)); x itself belongs to the caller. */
static void resnet_fwd(tr *t, const ut_resnet *r, int n, int h, int w, const void *x, void *y,
                       int save)
{
    ufw *f = &t->f;
    const int64_t hw = (int64_t)h * w, rows = n * hw;
    const int G = t->u->c.norm_num_groups;
    const sd_group_norm_desc g1 = gn_desc(t, n, hw, r->cin, (float)t->u->c.norm_eps, 1);
    const sd_group_norm_desc g2 = gn_desc(t, n, hw, r->cout, (float)t->u->c.norm_eps, 1);
    const sd_conv2d_desc d1 = sd_conv2d_make(n, h, w, r->cin, r->cout, 3, 1, 1);
    const sd_conv2d_desc d2 = sd_conv2d_make(n, h, w, r->cout, r->cout, 3, 1, 1);
    size_t mark = sd_arena_mark(f->a), kept;
    float *m1 = alloc_f32(t, (int64_t)n * G), *r1 = alloc_f32(t, (int64_t)n * G);
    void *t1 = ufw_alloc(f, rows * r->cin), *h1 = ufw_alloc(f, rows * r->cout);
    float *m2 = alloc_f32(t, (int64_t)n * G), *r2 = alloc_f32(t, (int64_t)n * G);
    void *t2 = ufw_alloc(f, rows * r->cout), *tp, *hb;
    kept = sd_arena_mark(f->a);
    tp = ufw_alloc(f, (int64_t)n * r->cout);
    hb = ufw_alloc(f, rows * r->cout);

    gn_fwd(t, &g1, x, r->norm1, t1, m1, r1);
    ufw_conv(f, &d1, t1, r->conv1, h1);
    ufw_linear(f, n, 1, t->u->temb_dim, r->cout, t->emb_act, r->time_proj.w, r->time_proj.b, tp);
    if (running(t))
        sd_add_bcast_forward(f->be, n, hw, r->cout, h1, tp, h1);
    gn_fwd(t, &g2, h1, r->norm2, t2, m2, r2);
    /* y = residual + conv2(t2), the add in the convolution's pass where the backend can */
    if (r->cin != r->cout) {
        sd_conv2d_desc ds = sd_conv2d_make(n, h, w, r->cin, r->cout, 1, 1, 0);
        ufw_conv(f, &ds, x, r->shortcut, hb);
        ufw_conv_add(f, &d2, t2, r->conv2, hb, y);
    } else {
        ufw_conv_add(f, &d2, t2, r->conv2, x, y);
    }
    if (save) {
        push(t, m1);
        push(t, r1);
        push(t, t1);
        push(t, h1);
        push(t, m2);
        push(t, r2);
        push(t, t2);
        sd_arena_reset_to(f->a, kept);
    } else {
        sd_arena_reset_to(f->a, mark);
    }
}

static void resnet_bwd(tr *t, const ut_resnet *r, const ut_resnet *g, int n, int h, int w,
                       const void *x, const void *dy, void *dx, int acc)
{
    ufw *f = &t->f;
    const int64_t hw = (int64_t)h * w, rows = n * hw;
    const sd_group_norm_desc g1 = gn_desc(t, n, hw, r->cin, (float)t->u->c.norm_eps, 1);
    const sd_group_norm_desc g2 = gn_desc(t, n, hw, r->cout, (float)t->u->c.norm_eps, 1);
    const sd_conv2d_desc d1 = sd_conv2d_make(n, h, w, r->cin, r->cout, 3, 1, 1);
    const sd_conv2d_desc d2 = sd_conv2d_make(n, h, w, r->cout, r->cout, 3, 1, 1);
    const void *t2 = pop(t);
    const float *r2 = pop(t), *m2 = pop(t);
    const void *h1 = pop(t), *t1 = pop(t);
    const float *r1 = pop(t), *m1 = pop(t);
    size_t mark = sd_arena_mark(f->a);
    void *dt = ufw_alloc(f, rows * (r->cin > r->cout ? r->cin : r->cout));
    void *dh = ufw_alloc(f, rows * r->cout);
    void *dtp = ufw_alloc(f, (int64_t)n * r->cout);

    conv_bwd(t, &d2, t2, r->conv2, g->conv2, dy, dt, 0);
    gn_bwd(t, &g2, h1, r->norm2, g->norm2, m2, r2, dt, dh, 0);
    {
        size_t m = sd_arena_mark(f->a);
        sd_scratch ws =
            ufw_scratch(f, sd_add_bcast_backward_scratch_bytes(f->be, n, hw, r->cout));
        if (running(t))
            sd_add_bcast_backward(f->be, n, hw, r->cout, dh, dtp, 0, ws);
        sd_arena_reset_to(f->a, m);
    }
    lin_bwd(t, n, 1, t->u->temb_dim, r->cout, t->emb_act, r->time_proj.w, dtp, t->d_emb_act, 1,
            g->time_proj.w, g->time_proj.b);
    conv_bwd(t, &d1, t1, r->conv1, g->conv1, dh, dt, 0);
    gn_bwd(t, &g1, x, r->norm1, g->norm1, m1, r1, dt, dx, acc);
    if (r->cin != r->cout) {
        sd_conv2d_desc ds = sd_conv2d_make(n, h, w, r->cin, r->cout, 1, 1, 0);
        conv_bwd(t, &ds, x, r->shortcut, g->shortcut, dy, dx, 1);
    } else {
        add_into(t, rows * r->cout, dy, dx, 1);
    }
    sd_arena_reset_to(f->a, mark);
}

/* ---- Transformer2DModel ----------------------------------------------------------------- */

/* One BasicTransformerBlock's saved tensors. */
typedef struct blk_saved {
    const float *lm[3], *lr[3], *lse1, *lse2;
    const void *hin[3]; /* the residual stream entering norm1, norm2, norm3 */
    const void *ln[3], *q, *k, *v, *o, *q2, *k2, *v2, *o2, *ff, *gg;
} blk_saved;

static void transformer_fwd(tr *t, const ut_transformer *x, int n, int h, int w, const void *in,
                            void *y, int save)
{
    ufw *f = &t->f;
    const int64_t hw = (int64_t)h * w, rows = n * hw, crow = (int64_t)n * t->ctx_len;
    const int C = x->c, D = x->inner, X = t->u->c.cross_attention_dim, G = t->u->c.norm_num_groups;
    const sd_group_norm_desc gd = gn_desc(t, n, hw, C, UNET_TRANSFORMER_GN_EPS, 0);
    size_t mark = sd_arena_mark(f->a), kept;
    sd_attention_desc self, cross;
    float *gm = alloc_f32(t, (int64_t)n * G), *gr = alloc_f32(t, (int64_t)n * G);
    void *ln0 = ufw_alloc(f, rows * C), *hs = ufw_alloc(f, rows * D), *tmp;

    SD_CHECK(hw <= INT_MAX, "%lld tokens", (long long)hw);
    self = sd_attention_make(n, x->heads, x->head_dim, (int)hw, (int)hw, 0);
    cross = sd_attention_make(n, x->heads, x->head_dim, (int)hw, t->ctx_len, 0);
    gn_fwd(t, &gd, in, x->norm, ln0, gm, gr);
    ufw_linear(f, n, hw, C, D, ln0, x->proj_in.w, x->proj_in.b, hs);
    if (save) {
        push(t, gm);
        push(t, gr);
        push(t, ln0);
    }
    for (int l = 0; l < x->layers; l++) {
        const ut_block *b = &x->blocks[l];
        blk_saved s;
        void *q, *k, *v, *o, *q2, *k2, *v2, *o2, *ff, *gg, *h1, *h2, *h3;
        float *lse1, *lse2;
        for (int i = 0; i < 3; i++) {
            s.lm[i] = alloc_f32(t, rows);
            s.lr[i] = alloc_f32(t, rows);
            s.ln[i] = ufw_alloc(f, rows * D);
        }
        q = ufw_alloc(f, rows * D);
        k = ufw_alloc(f, rows * D);
        v = ufw_alloc(f, rows * D);
        o = ufw_alloc(f, rows * D);
        q2 = ufw_alloc(f, rows * D);
        k2 = ufw_alloc(f, crow * D);
        v2 = ufw_alloc(f, crow * D);
        o2 = ufw_alloc(f, rows * D);
        ff = ufw_alloc(f, rows * 8 * D);
        gg = ufw_alloc(f, rows * 4 * D);
        lse1 = alloc_f32(t, rows * x->heads);
        lse2 = alloc_f32(t, rows * x->heads);
        h1 = ufw_alloc(f, rows * D);
        h2 = ufw_alloc(f, rows * D);
        h3 = ufw_alloc(f, rows * D);

        /* h1 = hs + attn1(norm1(hs)) */
        ln_fwd(t, rows, D, hs, b->norm1, (void *)s.ln[0], (float *)s.lm[0], (float *)s.lr[0]);
        ufw_linear(f, n, hw, D, D, s.ln[0], b->q1, NULL, q);
        ufw_linear(f, n, hw, D, D, s.ln[0], b->k1, NULL, k);
        ufw_linear(f, n, hw, D, D, s.ln[0], b->v1, NULL, v);
        attn_fwd(t, &self, q, k, v, o, lse1);
        ufw_linear_add(f, n, hw, D, D, o, b->out1.w, b->out1.b, hs, h1);
        /* h2 = h1 + attn2(norm2(h1), ctx) */
        ln_fwd(t, rows, D, h1, b->norm2, (void *)s.ln[1], (float *)s.lm[1], (float *)s.lr[1]);
        ufw_linear(f, n, hw, D, D, s.ln[1], b->q2, NULL, q2);
        ufw_linear(f, n, t->ctx_len, X, D, t->ctx, b->k2, NULL, k2);
        ufw_linear(f, n, t->ctx_len, X, D, t->ctx, b->v2, NULL, v2);
        attn_fwd(t, &cross, q2, k2, v2, o2, lse2);
        ufw_linear_add(f, n, hw, D, D, o2, b->out2.w, b->out2.b, h1, h2);
        /* h3 = h2 + ff(norm3(h2)) */
        ln_fwd(t, rows, D, h2, b->norm3, (void *)s.ln[2], (float *)s.lm[2], (float *)s.lr[2]);
        ufw_linear(f, n, hw, D, 8 * D, s.ln[2], b->ff_in.w, b->ff_in.b, ff);
        if (running(t))
            sd_geglu_forward(f->be, rows, 4 * D, ff, gg);
        ufw_linear_add(f, n, hw, 4 * D, D, gg, b->ff_out.w, b->ff_out.b, h2, h3);
        if (save) {
            /* hs, h1, h2 enter the three norms; q..gg feed the linears and attentions */
            const void *keep[] = {hs, h1, h2, s.lm[0], s.lr[0], s.ln[0], s.lm[1], s.lr[1],
                                  s.ln[1], s.lm[2], s.lr[2], s.ln[2], q, k, v, o, lse1,
                                  q2, k2, v2, o2, lse2, ff, gg};
            for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
                push(t, keep[i]);
        }
        hs = h3;
    }
    kept = sd_arena_mark(f->a);
    tmp = ufw_alloc(f, rows * C);
    ufw_linear(f, n, hw, D, C, hs, x->proj_out.w, x->proj_out.b, tmp);
    ufw_add(f, rows * C, tmp, in, y);
    if (save) {
        push(t, hs);
        sd_arena_reset_to(f->a, kept);
    } else {
        sd_arena_reset_to(f->a, mark);
    }
}

static void transformer_bwd(tr *t, const ut_transformer *x, const ut_transformer *g, int n,
                            int h, int w, const void *in, const void *dy, void *din, int acc)
{
    ufw *f = &t->f;
    const int64_t hw = (int64_t)h * w, rows = n * hw, crow = (int64_t)n * t->ctx_len;
    const int C = x->c, D = x->inner, X = t->u->c.cross_attention_dim;
    const sd_group_norm_desc gd = gn_desc(t, n, hw, C, UNET_TRANSFORMER_GN_EPS, 0);
    const sd_attention_desc self = sd_attention_make(n, x->heads, x->head_dim, (int)hw, (int)hw, 0);
    const sd_attention_desc cross =
        sd_attention_make(n, x->heads, x->head_dim, (int)hw, t->ctx_len, 0);
    size_t mark = sd_arena_mark(f->a);
    const void *hs_last = pop(t);
    void *dhs = ufw_alloc(f, rows * D), *dln = ufw_alloc(f, rows * (C > D ? C : D));
    void *dq = ufw_alloc(f, rows * D), *dout = ufw_alloc(f, rows * D);
    void *dk = ufw_alloc(f, (rows > crow ? rows : crow) * D);
    void *dv = ufw_alloc(f, (rows > crow ? rows : crow) * D);
    void *dff = ufw_alloc(f, rows * 8 * D), *dgg = ufw_alloc(f, rows * 4 * D);

    /* y = in + proj_out(hs) */
    add_into(t, rows * C, dy, din, acc);
    lin_bwd(t, n, hw, D, C, hs_last, x->proj_out.w, dy, dhs, 0, g->proj_out.w, g->proj_out.b);
    for (int l = x->layers - 1; l >= 0; l--) {
        const ut_block *b = &x->blocks[l], *gb = &g->blocks[l];
        blk_saved s;
        s.gg = pop(t);
        s.ff = pop(t);
        s.lse2 = pop(t);
        s.o2 = pop(t);
        s.v2 = pop(t);
        s.k2 = pop(t);
        s.q2 = pop(t);
        s.lse1 = pop(t);
        s.o = pop(t);
        s.v = pop(t);
        s.k = pop(t);
        s.q = pop(t);
        for (int i = 2; i >= 0; i--) {
            s.ln[i] = pop(t);
            s.lr[i] = pop(t);
            s.lm[i] = pop(t);
        }
        s.hin[2] = pop(t);
        s.hin[1] = pop(t);
        s.hin[0] = pop(t);

        /* feed-forward: h3 = h2 + ff_out(geglu(ff_in(norm3(h2)))) */
        lin_bwd(t, n, hw, 4 * D, D, s.gg, b->ff_out.w, dhs, dgg, 0, gb->ff_out.w, gb->ff_out.b);
        if (running(t))
            sd_geglu_backward(f->be, rows, 4 * D, s.ff, dgg, dff, 0);
        lin_bwd(t, n, hw, D, 8 * D, s.ln[2], b->ff_in.w, dff, dln, 0, gb->ff_in.w, gb->ff_in.b);
        ln_bwd(t, rows, D, s.hin[2], b->norm3, gb->norm3, s.lm[2], s.lr[2], dln, dhs, 1);
        /* cross-attention: h2 = h1 + out2(attn(q2(norm2(h1)), k2(ctx), v2(ctx))) */
        lin_bwd(t, n, hw, D, D, s.o2, b->out2.w, dhs, dout, 0, gb->out2.w, gb->out2.b);
        attn_bwd(t, &cross, s.q2, s.k2, s.v2, s.o2, s.lse2, dout, dq, dk, dv);
        lin_bwd(t, n, hw, D, D, s.ln[1], b->q2, dq, dln, 0, gb->q2, NULL);
        lin_bwd(t, n, t->ctx_len, X, D, t->ctx, b->k2, dk, NULL, 0, gb->k2, NULL);
        lin_bwd(t, n, t->ctx_len, X, D, t->ctx, b->v2, dv, NULL, 0, gb->v2, NULL);
        ln_bwd(t, rows, D, s.hin[1], b->norm2, gb->norm2, s.lm[1], s.lr[1], dln, dhs, 1);
        /* self-attention: h1 = hs + out1(attn(q1, k1, v1 of norm1(hs))) */
        lin_bwd(t, n, hw, D, D, s.o, b->out1.w, dhs, dout, 0, gb->out1.w, gb->out1.b);
        attn_bwd(t, &self, s.q, s.k, s.v, s.o, s.lse1, dout, dq, dk, dv);
        lin_bwd(t, n, hw, D, D, s.ln[0], b->q1, dq, dln, 0, gb->q1, NULL);
        lin_bwd(t, n, hw, D, D, s.ln[0], b->k1, dk, dln, 1, gb->k1, NULL);
        lin_bwd(t, n, hw, D, D, s.ln[0], b->v1, dv, dln, 1, gb->v1, NULL);
        ln_bwd(t, rows, D, s.hin[0], b->norm1, gb->norm1, s.lm[0], s.lr[0], dln, dhs, 1);
    }
    {
        const void *ln0 = pop(t);
        const float *gr = pop(t), *gm = pop(t);
        lin_bwd(t, n, hw, C, D, ln0, x->proj_in.w, dhs, dln, 0, g->proj_in.w, g->proj_in.b);
        gn_bwd(t, &gd, in, x->norm, g->norm, gm, gr, dln, din, 1);
    }
    sd_arena_reset_to(f->a, mark);
}

/* ---- blocks with optional recomputation ---------------------------------------------------- */

static void resnet_step_bwd(tr *t, const ut_resnet *r, const ut_resnet *g, int n, int h, int w,
                            const void *x, const void *dy, void *dx, int acc)
{
    size_t mark = sd_arena_mark(t->f.a);
    if (t->recompute)
        resnet_fwd(t, r, n, h, w, x, ufw_alloc(&t->f, (int64_t)n * h * w * r->cout), 1);
    resnet_bwd(t, r, g, n, h, w, x, dy, dx, acc);
    sd_arena_reset_to(t->f.a, mark);
}

static void transformer_step_bwd(tr *t, const ut_transformer *x, const ut_transformer *g, int n,
                                 int h, int w, const void *in, const void *dy, void *din, int acc)
{
    size_t mark = sd_arena_mark(t->f.a);
    if (t->recompute)
        transformer_fwd(t, x, n, h, w, in, ufw_alloc(&t->f, (int64_t)n * h * w * x->c), 1);
    transformer_bwd(t, x, g, n, h, w, in, dy, din, acc);
    sd_arena_reset_to(t->f.a, mark);
}

/* An up-path ResNet with its skip concat [cur | skip] as one block (the concat is saved with
 * the block's internals, or recomputed with them). */
static void upres_fwd(tr *t, const ut_resnet *r, int n, int h, int w, const void *cur, int ch,
                      const void *skip, int skc, void *y, int save)
{
    const int64_t rows = (int64_t)n * h * w;
    size_t mark = sd_arena_mark(t->f.a);
    void *cat = ufw_alloc(&t->f, rows * r->cin);
    SD_CHECK(ch + skc == r->cin, "skip concat %d + %d != %d", ch, skc, r->cin);
    if (running(t))
        sd_concat_channels(t->f.be, rows, ch, skc, cur, skip, cat);
    resnet_fwd(t, r, n, h, w, cat, y, save);
    if (save)
        push(t, cat);
    else
        sd_arena_reset_to(t->f.a, mark);
}

static void upres_step_bwd(tr *t, const ut_resnet *r, const ut_resnet *g, int n, int h, int w,
                           const void *cur, int ch, const void *skip, int skc, const void *dy,
                           void *dcur, void *dskip)
{
    const int64_t rows = (int64_t)n * h * w;
    size_t mark = sd_arena_mark(t->f.a);
    const void *cat;
    void *dcat;
    if (t->recompute)
        upres_fwd(t, r, n, h, w, cur, ch, skip, skc, ufw_alloc(&t->f, rows * r->cout), 1);
    cat = pop(t);
    dcat = ufw_alloc(&t->f, rows * r->cin);
    resnet_bwd(t, r, g, n, h, w, cat, dy, dcat, 0);
    if (running(t)) {
        /* d cur is written, d skip accumulates (the skip also feeds the down path) */
        sd_split_channels(t->f.be, rows, ch, skc, dcat, dcur, NULL, 0);
        sd_split_channels(t->f.be, rows, ch, skc, dcat, NULL, dskip, 1);
    }
    sd_arena_reset_to(t->f.a, mark);
}

/* ---- the whole model ------------------------------------------------------------------------ */

typedef struct tskip tskip;

#define TR_MAX_SKIPS ((int)(sizeof ((tr *)0)->skips / sizeof ((tr *)0)->skips[0]))

static void run_forward(tr *t, const void *sample, const float *timesteps, void *out)
{
    ufw *f = &t->f;
    const sd_unet *u = t->u;
    const sd_unet_config *c = &u->c;
    const int n = t->batch, h = t->h, w = t->w;
    const int L = c->n_levels, c0 = c->block_out_channels[0], T = u->temb_dim;
    const int save = !t->recompute;
    int hs[SD_MODEL_MAX_LEVELS], ws[SD_MODEL_MAX_LEVELS], forced, ch = c0;
    tskip st[TR_MAX_SKIPS];
    int ns = 0, n_skips;
    void *tsin, *t1pre, *t1act, *emb, *cur;

    sd_unet_level_sizes(c, h, w, hs, ws, &forced);

    /* the time embedding and conv_in: everything before down_blocks.0 */
    need(t, t->ready_at[2 + L]);
    tsin = ufw_alloc(f, (int64_t)n * c0);
    if (t->tsin_in && running(t))
        sd_cast_f32(f->be, (int64_t)n * c0, t->tsin_in, tsin);
    else
        ufw_time_sinusoid(f, n, timesteps, tsin);
    t1pre = ufw_alloc(f, (int64_t)n * T);
    t1act = ufw_alloc(f, (int64_t)n * T);
    emb = ufw_alloc(f, (int64_t)n * T);
    t->emb_act = ufw_alloc(f, (int64_t)n * T);
    ufw_linear(f, n, 1, c0, T, tsin, u->time1.w, u->time1.b, t1pre);
    if (running(t))
        sd_silu_forward(f->be, (int64_t)n * T, t1pre, t1act);
    ufw_linear(f, n, 1, T, T, t1act, u->time2.w, u->time2.b, emb);
    if (running(t))
        sd_silu_forward(f->be, (int64_t)n * T, emb, t->emb_act);
    push(t, tsin);
    push(t, t1pre);
    push(t, t1act);
    push(t, emb);

    {
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c->in_channels, c0, c->conv_in_kernel, 1,
                                          c->conv_in_kernel / 2);
        cur = ufw_alloc(f, (int64_t)n * h * w * c0);
        ufw_conv(f, &d, sample, u->conv_in, cur);
        st[ns++] = (tskip){cur, h, w, c0};
    }
    for (int i = 0; i < L; i++) {
        const ut_stage *s = &u->down[i];
        SD_CHECK(ns + s->n_res + 1 <= TR_MAX_SKIPS, "too many skips");
        const int cout = c->block_out_channels[i];
        const int64_t rows = (int64_t)n * hs[i] * ws[i];
        need(t, i + 1 < L ? t->ready_at[2 + L + i + 1] : t->ready_at[1 + L]);
        for (int j = 0; j < s->n_res; j++) {
            void *o = ufw_alloc(f, rows * cout);
            if (s->attn) {
                void *r = ufw_alloc(f, rows * cout);
                resnet_fwd(t, &s->res[j], n, hs[i], ws[i], cur, r, save);
                transformer_fwd(t, &s->attn[j], n, hs[i], ws[i], r, o, save);
                push(t, r);
            } else {
                resnet_fwd(t, &s->res[j], n, hs[i], ws[i], cur, o, save);
            }
            st[ns++] = (tskip){o, hs[i], ws[i], cout};
            cur = o;
        }
        if (s->has_sampler) {
            sd_conv2d_desc d = sd_unet_downsample_desc(c, n, hs[i], ws[i], cout);
            void *o = ufw_alloc(f, (int64_t)n * hs[i + 1] * ws[i + 1] * cout);
            ufw_conv(f, &d, cur, s->sampler, o);
            st[ns++] = (tskip){o, hs[i + 1], ws[i + 1], cout};
            cur = o;
        }
        ch = cout;
    }
    n_skips = ns;
    {
        const int64_t e = (int64_t)n * hs[L - 1] * ws[L - 1] * ch;
        void *a = ufw_alloc(f, e), *b = ufw_alloc(f, e), *m = ufw_alloc(f, e);
        need(t, t->ready_at[1]);
        resnet_fwd(t, &u->mid_res[0], n, hs[L - 1], ws[L - 1], cur, a, save);
        transformer_fwd(t, &u->mid_attn, n, hs[L - 1], ws[L - 1], a, b, save);
        resnet_fwd(t, &u->mid_res[1], n, hs[L - 1], ws[L - 1], b, m, save);
        push(t, a);
        push(t, b);
        cur = m;
    }
    for (int i = 0; i < L; i++) {
        const ut_stage *s = &u->up[i];
        const int lvl = L - 1 - i, cout = c->block_out_channels[lvl];
        const int H = hs[lvl], W = ws[lvl];
        const int64_t rows = (int64_t)n * H * W;
        need(t, i + 1 < L ? t->ready_at[1 + i + 1] : t->ready_at[0]);
        for (int j = 0; j < s->n_res; j++) {
            tskip sk;
            void *o = ufw_alloc(f, rows * cout);
            SD_CHECK(ns > 0, "up_blocks.%d.resnets.%d: the skip stack is empty", i, j);
            sk = st[--ns];
            SD_CHECK(sk.h == H && sk.w == W, "up_blocks.%d.resnets.%d: skip %dx%d, state %dx%d",
                     i, j, sk.h, sk.w, H, W);
            if (s->attn) {
                void *r = ufw_alloc(f, rows * cout);
                upres_fwd(t, &s->res[j], n, H, W, cur, ch, sk.p, sk.c, r, save);
                transformer_fwd(t, &s->attn[j], n, H, W, r, o, save);
                push(t, r);
            } else {
                upres_fwd(t, &s->res[j], n, H, W, cur, ch, sk.p, sk.c, o, save);
            }
            push(t, cur);
            cur = o;
            ch = cout;
        }
        if (s->has_sampler) {
            const int ho = forced ? st[ns - 1].h : 2 * H, wo = forced ? st[ns - 1].w : 2 * W;
            sd_conv2d_desc d = sd_conv2d_make(n, ho, wo, cout, cout, 3, 1, 1);
            void *up = ufw_alloc(f, (int64_t)n * ho * wo * cout);
            void *o = ufw_alloc(f, (int64_t)n * ho * wo * cout);
            SD_CHECK(ho == hs[lvl - 1] && wo == ws[lvl - 1],
                     "upsampled %dx%d, next skips are %dx%d", ho, wo, hs[lvl - 1], ws[lvl - 1]);
            if (running(t))
                sd_upsample_nearest_forward(f->be, n, H, W, cout, ho, wo, cur, up);
            ufw_conv(f, &d, up, s->sampler, o);
            push(t, up);
            cur = o;
        }
    }
    SD_CHECK(ns == 0, "%d skips left after the up path", ns);
    memcpy(t->skips, st, sizeof st);
    t->n_skips = n_skips;
    {
        const sd_group_norm_desc gd = gn_desc(t, n, (int64_t)h * w, c0, (float)c->norm_eps, 1);
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c0, c->out_channels, c->conv_out_kernel, 1,
                                          c->conv_out_kernel / 2);
        float *gm = alloc_f32(t, (int64_t)n * c->norm_num_groups);
        float *gr = alloc_f32(t, (int64_t)n * c->norm_num_groups);
        void *tn = ufw_alloc(f, (int64_t)n * h * w * c0);
        need(t, t->total_floats);
        gn_fwd(t, &gd, cur, u->norm_out, tn, gm, gr);
        ufw_conv(f, &d, tn, u->conv_out, out);
        push(t, cur);
        push(t, gm);
        push(t, gr);
        push(t, tn);
    }
}

static void run_backward(tr *t, const void *dout)
{
    ufw *f = &t->f;
    const sd_unet *u = t->u, *g = t->g;
    const sd_unet_config *c = &u->c;
    const int n = t->batch, h = t->h, w = t->w;
    const int L = c->n_levels, c0 = c->block_out_channels[0], T = u->temb_dim;
    int hs[SD_MODEL_MAX_LEVELS], ws[SD_MODEL_MAX_LEVELS], forced;
    tskip st[TR_MAX_SKIPS], gs[TR_MAX_SKIPS];
    int ns = 0, k;
    int64_t pp = 0;
    void *dcur, *spare;

    sd_unet_level_sizes(c, h, w, hs, ws, &forced);

    ns = t->n_skips;
    memcpy(st, t->skips, sizeof st);
    /* one zeroed gradient per skip (each has two consumers), ping-pong buffers for the mid and
     * up path states, and the gradient of SiLU(emb) that every ResNet adds to */
    for (int i = 0; i < ns; i++) {
        gs[i] = st[i];
        gs[i].p = alloc_zero(t, (int64_t)n * st[i].h * st[i].w * st[i].c);
    }
    for (int lvl = 0; lvl < L; lvl++) {
        int64_t e = (int64_t)n * hs[lvl] * ws[lvl] * c->block_out_channels[lvl];
        if (e > pp)
            pp = e;
        if (lvl > 0 && (e = (int64_t)n * hs[lvl - 1] * ws[lvl - 1] * c->block_out_channels[lvl]) > pp)
            pp = e;
    }
    dcur = ufw_alloc(f, pp);
    spare = ufw_alloc(f, pp);
    t->d_emb_act = alloc_zero(t, (int64_t)n * T);

    /* conv_norm_out -> SiLU -> conv_out */
    {
        const sd_group_norm_desc gd = gn_desc(t, n, (int64_t)h * w, c0, (float)c->norm_eps, 1);
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c0, c->out_channels, c->conv_out_kernel, 1,
                                          c->conv_out_kernel / 2);
        const void *tn = pop(t);
        const float *gr = pop(t), *gm = pop(t);
        const void *cur = pop(t);
        size_t mark = sd_arena_mark(f->a);
        void *dt = ufw_alloc(f, (int64_t)n * h * w * c0);
        conv_bwd(t, &d, tn, u->conv_out, g->conv_out, dout, dt, 0);
        gn_bwd(t, &gd, cur, u->norm_out, g->norm_out, gm, gr, dt, dcur, 0);
        sd_arena_reset_to(f->a, mark);
    }
    ready(t, 0);

    /* up path, last block first; skips come back in the order they were stacked */
    k = 0;
    for (int i = L - 1; i >= 0; i--) {
        const ut_stage *s = &u->up[i], *sg = &g->up[i];
        const int lvl = L - 1 - i, cout = c->block_out_channels[lvl];
        const int H = hs[lvl], W = ws[lvl];
        const int64_t rows = (int64_t)n * H * W;
        void *tmp;
        if (s->has_sampler) {
            const int ho = hs[lvl - 1], wo = ws[lvl - 1];
            sd_conv2d_desc d = sd_conv2d_make(n, ho, wo, cout, cout, 3, 1, 1);
            const void *up = pop(t);
            size_t mark = sd_arena_mark(f->a);
            void *dup = ufw_alloc(f, (int64_t)n * ho * wo * cout);
            conv_bwd(t, &d, up, s->sampler, sg->sampler, dcur, dup, 0);
            if (running(t))
                sd_upsample_nearest_backward(f->be, n, H, W, cout, ho, wo, dup, spare, 0);
            sd_arena_reset_to(f->a, mark);
            tmp = dcur;
            dcur = spare;
            spare = tmp;
        }
        for (int j = s->n_res - 1; j >= 0; j--) {
            const int ch = j > 0 ? cout : (i > 0 ? c->block_out_channels[lvl + 1] : c->block_out_channels[L - 1]);
            const void *cur = pop(t);
            const tskip sk = st[k];
            void *dsk = gs[k].p;
            k++;
            if (s->attn) {
                const void *r = pop(t);
                size_t mark = sd_arena_mark(f->a);
                void *dr = ufw_alloc(f, rows * cout);
                transformer_step_bwd(t, &s->attn[j], &sg->attn[j], n, H, W, r, dcur, dr, 0);
                upres_step_bwd(t, &s->res[j], &sg->res[j], n, H, W, cur, ch, sk.p, sk.c, dr,
                               spare, dsk);
                sd_arena_reset_to(f->a, mark);
            } else {
                upres_step_bwd(t, &s->res[j], &sg->res[j], n, H, W, cur, ch, sk.p, sk.c, dcur,
                               spare, dsk);
            }
            tmp = dcur;
            dcur = spare;
            spare = tmp;
        }
        ready(t, 1 + i);
    }
    SD_CHECK(k == ns, "%d of %d skips met on the way back", k, ns);

    /* mid block: m = res1(attn(res0(x))), x = the deepest skip */
    {
        const int hb = hs[L - 1], wb = ws[L - 1];
        const void *b = pop(t), *a = pop(t);
        void *gx = gs[ns - 1].p;
        resnet_step_bwd(t, &u->mid_res[1], &g->mid_res[1], n, hb, wb, b, dcur, spare, 0);
        transformer_step_bwd(t, &u->mid_attn, &g->mid_attn, n, hb, wb, a, spare, dcur, 0);
        resnet_step_bwd(t, &u->mid_res[0], &g->mid_res[0], n, hb, wb, st[ns - 1].p, dcur, gx, 1);
    }
    ready(t, 1 + L);

    /* down path, last block first: skip k came from skip k - 1 */
    k = ns - 1;
    for (int i = L - 1; i >= 0; i--) {
        const ut_stage *s = &u->down[i], *sg = &g->down[i];
        const int cout = c->block_out_channels[i];
        const int64_t rows = (int64_t)n * hs[i] * ws[i];
        if (s->has_sampler) {
            sd_conv2d_desc d = sd_unet_downsample_desc(c, n, hs[i], ws[i], cout);
            conv_bwd(t, &d, st[k - 1].p, s->sampler, sg->sampler, gs[k].p, gs[k - 1].p, 1);
            k--;
        }
        for (int j = s->n_res - 1; j >= 0; j--) {
            if (s->attn) {
                const void *r = pop(t);
                size_t mark = sd_arena_mark(f->a);
                void *dr = ufw_alloc(f, rows * cout);
                transformer_step_bwd(t, &s->attn[j], &sg->attn[j], n, hs[i], ws[i], r, gs[k].p,
                                     dr, 0);
                resnet_step_bwd(t, &s->res[j], &sg->res[j], n, hs[i], ws[i], st[k - 1].p, dr,
                                gs[k - 1].p, 1);
                sd_arena_reset_to(f->a, mark);
            } else {
                resnet_step_bwd(t, &s->res[j], &sg->res[j], n, hs[i], ws[i], st[k - 1].p,
                                gs[k].p, gs[k - 1].p, 1);
            }
            k--;
        }
        ready(t, 2 + L + i);
    }
    SD_CHECK(k == 0, "down path ended at skip %d", k);

    /* conv_in (no gradient for the input sample) */
    {
        sd_conv2d_desc d = sd_conv2d_make(n, h, w, c->in_channels, c0, c->conv_in_kernel, 1,
                                          c->conv_in_kernel / 2);
        conv_bwd(t, &d, t->sample, u->conv_in, g->conv_in, gs[0].p, NULL, 0);
    }

    /* time embedding: emb_act = SiLU(linear_2(SiLU(linear_1(tsin)))) */
    {
        const void *emb = pop(t), *t1act = pop(t), *t1pre = pop(t), *tsin = pop(t);
        size_t mark = sd_arena_mark(f->a);
        void *d1 = ufw_alloc(f, (int64_t)n * T), *d2 = ufw_alloc(f, (int64_t)n * T);
        if (running(t))
            sd_silu_backward(f->be, (int64_t)n * T, emb, t->d_emb_act, d1, 0);
        lin_bwd(t, n, 1, T, T, t1act, u->time2.w, d1, d2, 0, g->time2.w, g->time2.b);
        if (running(t))
            sd_silu_backward(f->be, (int64_t)n * T, t1pre, d2, d2, 0);
        lin_bwd(t, n, 1, c0, T, tsin, u->time1.w, d2, NULL, 0, g->time1.w, g->time1.b);
        sd_arena_reset_to(f->a, mark);
    }
    SD_CHECK(t->tape_n == 0, "%d tape entries left after the backward", t->tape_n);
    /* conv_in and the time embedding, at the start of the buffer, came last */
    ready(t, -1);
}

/* ---- public API ----------------------------------------------------------------------------- */

static void step_begin(tr *t, sd_arena *a, int dry)
{
    memset(&t->f, 0, sizeof t->f);
    t->f.u = t->u;
    t->f.be = t->u->be;
    t->f.a = a;
    t->f.dry = dry;
    t->f.es = sd_dtype_size(t->u->be->dtype);
}

/* A dry forward + backward with batch invariance `bi`: arena high water, tape depth, FLOPs. */
static size_t plan(tr *t, int bi, double *flops)
{
    sd_unet shape = *t->u;
    const sd_unet *real = t->u;
    sd_arena a;
    size_t bytes;
    shape.batch_invariant = bi;
    t->u = &shape;
    SD_CHECK(sd_arena_init_measure(&a, 0) == 0, "measuring arena");
    step_begin(t, &a, 1);
    t->tape_n = 0;
    run_forward(t, NULL, NULL, NULL);
    run_backward(t, NULL);
    bytes = sd_arena_high_water(&a) + SD_ARENA_DEFAULT_ALIGNMENT;
    if (flops)
        *flops = t->f.flops;
    sd_arena_free(&a);
    t->u = real;
    return bytes;
}

/* The first offset of the tensors named `prefix`*, which the table lists together (module order). */
static size_t first_offset(const sd_param_table *table, const char *prefix, int *found)
{
    const size_t len = strlen(prefix);
    for (size_t i = 0; i < table->n; i++)
        if (!strncmp(table->params[i].name, prefix, len)) {
            *found = 1;
            return table->params[i].offset;
        }
    *found = 0;
    return 0;
}

/* The block at `slot`, reported next by the backward, starts before the one reported last. */
static void ready_falls(const tr *t, int slot, size_t *prev)
{
    SD_CHECK(t->ready_at[slot] < *prev,
             "U-Net parameter table: block %d starts at %zu, after the block finished before it "
             "in the backward (%zu)", slot, t->ready_at[slot], *prev);
    *prev = t->ready_at[slot];
}

/* ready_at[] from the parameter table. The backward finishes the blocks from the end of the
 * buffer to its start (conv_norm_out and conv_out, up_blocks L-1 .. 0, mid_block, down_blocks
 * L-1 .. 0; then conv_in and the time embedding at the very start), so after each of them
 * everything from its first tensor on is final. Checked here: the offsets must fall. The
 * forward's need hook uses the same offsets the other way round: a block's tensors end where
 * the next block's begin. */
static int find_ready_offsets(tr *t, const sd_param_table *table, sd_err *err)
{
    const int L = t->u->c.n_levels;
    char name[64];
    int found;
    size_t prev = table->total_floats;
    for (int slot = 0; slot < 2 * L + 2; slot++) {
        if (slot == 0)
            snprintf(name, sizeof name, "conv_norm_out.");
        else if (slot <= L)
            snprintf(name, sizeof name, "up_blocks.%d.", slot - 1);
        else if (slot == L + 1)
            snprintf(name, sizeof name, "mid_block.");
        else
            snprintf(name, sizeof name, "down_blocks.%d.", slot - L - 2);
        t->ready_at[slot] = first_offset(table, name, &found);
        if (!found)
            return sd_err_set(err, "the U-Net parameter table has no tensor %s*", name);
    }
    /* in the order the backward reports them (run_backward) */
    ready_falls(t, 0, &prev);
    for (int i = L - 1; i >= 0; i--)
        ready_falls(t, 1 + i, &prev);
    ready_falls(t, 1 + L, &prev);
    for (int i = L - 1; i >= 0; i--)
        ready_falls(t, 2 + L + i, &prev);
    return 0;
}

void sd_unet_trainer_set_ready_hook(sd_unet_trainer *t, sd_unet_ready_fn fn, void *user)
{
    t->ready_fn = fn;
    t->ready_user = user;
}

void sd_unet_trainer_set_need_hook(sd_unet_trainer *t, sd_unet_need_fn fn, void *user)
{
    t->need_fn = fn;
    t->need_user = user;
}

int sd_unet_trainer_create(sd_unet_trainer **out, const sd_unet *u, const sd_param_table *table,
                           float *grads, int batch, int h, int w, int ctx_len, int recompute,
                           sd_err *err)
{
    tr *t;
    size_t on, off;
    SD_CHECK(out && u && table && grads, "sd_unet_trainer_create needs every argument");
    *out = NULL;
    if (sd_unet_check_shape(&u->c, batch, h, w, ctx_len, err))
        return -1;
    t = sd_xcalloc(1, sizeof *t);
    t->u = u;
    t->batch = batch;
    t->h = h;
    t->w = w;
    t->ctx_len = ctx_len;
    t->recompute = recompute != 0;
    if (sd_unet_build_tree(&t->g, &u->c, table, grads, sizeof(float), u->be, err)) {
        free(t);
        return -1;
    }
    t->total_floats = table->total_floats;
    if (find_ready_offsets(t, table, err)) {
        sd_unet_free(t->g);
        free(t);
        return -1;
    }
    on = plan(t, 1, NULL);
    off = plan(t, 0, NULL);
    {
        /* the model's FLOPs: without recomputation */
        int rc = t->recompute;
        t->recompute = 0;
        plan(t, u->batch_invariant, &t->flops);
        t->recompute = rc;
    }
    t->arena_bytes = on > off ? on : off;
    t->tape_cap = t->tape_max > 0 ? t->tape_max : 1;
    t->tape = sd_xcalloc((size_t)t->tape_cap, sizeof *t->tape);
    t->tape_n = 0;
    *out = t;
    return 0;
}

void sd_unet_trainer_free(sd_unet_trainer *t)
{
    if (!t)
        return;
    sd_unet_free(t->g);
    free(t->tape);
    free(t);
}

size_t sd_unet_trainer_arena_bytes(const sd_unet_trainer *t)
{
    return t->arena_bytes;
}

double sd_unet_trainer_flops(const sd_unet_trainer *t)
{
    return t->flops;
}

void sd_unet_train_forward(sd_unet_trainer *t, const void *sample, const float *timesteps,
                           const void *ctx, void *out, sd_arena *arena)
{
    SD_CHECK(t && sample && timesteps && ctx && out && arena,
             "sd_unet_train_forward needs every tensor and an arena");
    SD_CHECK(!t->forward_done, "sd_unet_train_forward called twice without a backward");
    SD_CHECK(sd_arena_capacity(arena) - sd_arena_used(arena) >= t->arena_bytes,
             "the arena has %zu free bytes, a training step needs %zu "
             "(sd_unet_trainer_arena_bytes)", sd_arena_capacity(arena) - sd_arena_used(arena),
             t->arena_bytes);
    step_begin(t, arena, 0);
    t->mark0 = sd_arena_mark(arena);
    t->sample = sample;
    t->ctx = ctx;
    t->tape_n = 0;
    run_forward(t, sample, timesteps, out);
    t->forward_done = 1;
}

void sd_unet_train_forward_sin(sd_unet_trainer *t, const void *sample, const float *tsin,
                               const void *ctx, void *out, sd_arena *arena)
{
    SD_CHECK(t && tsin, "sd_unet_train_forward_sin needs the sinusoids");
    t->tsin_in = tsin;
    /* the timesteps argument is not read when tsin_in is set */
    sd_unet_train_forward(t, sample, tsin, ctx, out, arena);
    t->tsin_in = NULL;
}

void sd_unet_backward(sd_unet_trainer *t, const void *dout, sd_arena *arena)
{
    SD_CHECK(t && dout && arena, "sd_unet_backward needs every argument");
    SD_CHECK(t->forward_done && t->f.a == arena,
             "sd_unet_backward without a matching sd_unet_train_forward on this arena");
    run_backward(t, dout);
    sd_arena_reset_to(arena, t->mark0);
    t->forward_done = 0;
}
