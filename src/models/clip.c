/* CLIP text encoder forward on the op interface, with activation memory planned by a dry run
 * of the same code. */
#include "sdtrain/clip.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

#include "resolver.h"

typedef struct lin_p {
    const void *w, *b;
} lin_p;

typedef struct layer_p {
    lin_p ln1, ln2; /* gamma in w, beta in b */
    lin_p q, k, v, o, fc1, fc2;
} layer_p;

struct sd_clip {
    sd_clip_config cfg;
    const sd_backend *be;
    const void *tok, *pos;
    layer_p *layers;
    lin_p final_ln;
};

/* ---- parameter resolution ---------------------------------------------------------------- */

typedef sd_resolver resolver;

static const void *get(resolver *r, int64_t d0, int64_t d1, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* The tensor named by fmt with shape [d0] (d1 < 0) or [d0, d1]. */
static const void *get(resolver *r, int64_t d0, int64_t d1, const char *fmt, ...)
{
    const int64_t shape[2] = {d0, d1};
    const void *t;
    va_list ap;
    va_start(ap, fmt);
    t = sd_resolver_vget(r, d1 < 0 ? 1 : 2, shape, fmt, ap);
    va_end(ap);
    return t;
}

static lin_p get_linear(resolver *r, const char *prefix, int64_t in, int64_t out)
{
    lin_p l;
    l.w = get(r, out, in, "%s.weight", prefix);
    l.b = get(r, out, -1, "%s.bias", prefix);
    return l;
}

static lin_p get_norm(resolver *r, const char *prefix, int64_t c)
{
    lin_p l;
    l.w = get(r, c, -1, "%s.weight", prefix);
    l.b = get(r, c, -1, "%s.bias", prefix);
    return l;
}

static int check_config(const sd_clip_config *c, sd_err *err)
{
    if (c->hidden_size < 1 || c->num_attention_heads < 1 || c->hidden_size % c->num_attention_heads)
        return sd_err_set(err, "text encoder: hidden_size %d is not a positive multiple of %d "
                          "heads", c->hidden_size, c->num_attention_heads);
    if (c->vocab_size < 1 || c->intermediate_size < 1 || c->num_hidden_layers < 0 ||
        c->max_position_embeddings < 1)
        return sd_err_set(err, "text encoder: sizes must be positive");
    return 0;
}

int sd_clip_create(sd_clip **out, const sd_clip_config *c, const sd_param_table *table,
                   const void *params, const sd_backend *be, sd_err *err)
{
    const int64_t d = c->hidden_size, inner = c->intermediate_size;
    resolver r;
    sd_clip *m;
    char p[SD_PARAM_NAME_MAX];

    *out = NULL;
    if (check_config(c, err))
        return -1;
    sd_resolver_init(&r, table, params, sd_dtype_size(be->dtype));
    m = sd_xcalloc(1, sizeof *m);
    m->cfg = *c;
    m->be = be;
    m->layers = sd_xcalloc(c->num_hidden_layers ? (size_t)c->num_hidden_layers : 1,
                           sizeof *m->layers);
    m->tok = get(&r, c->vocab_size, d, "text_model.embeddings.token_embedding.weight");
    m->pos = get(&r, c->max_position_embeddings, d,
                 "text_model.embeddings.position_embedding.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        layer_p *L = &m->layers[l];
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.self_attn.q_proj", l);
        L->q = get_linear(&r, p, d, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.self_attn.k_proj", l);
        L->k = get_linear(&r, p, d, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.self_attn.v_proj", l);
        L->v = get_linear(&r, p, d, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.self_attn.out_proj", l);
        L->o = get_linear(&r, p, d, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm1", l);
        L->ln1 = get_norm(&r, p, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm2", l);
        L->ln2 = get_norm(&r, p, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc1", l);
        L->fc1 = get_linear(&r, p, d, inner);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc2", l);
        L->fc2 = get_linear(&r, p, inner, d);
    }
    m->final_ln = get_norm(&r, "text_model.final_layer_norm", d);
    if (sd_resolver_finish(&r, "text encoder", err)) {
        sd_clip_free(m);
        return -1;
    }
    *out = m;
    return 0;
}

int sd_clip_create_from_weights(sd_clip **out, const sd_clip_config *c, const sd_weights *w,
                                const sd_backend *be, sd_err *err)
{
    SD_CHECK(be->device == SD_DEV_CPU && be->dtype == SD_F32,
             "host fp32 weights need a CPU fp32 backend, not '%s'", be->name);
    return sd_clip_create(out, c, &w->table, w->data, be, err);
}

void sd_clip_free(sd_clip *m)
{
    if (!m)
        return;
    free(m->layers);
    free(m);
}

const sd_clip_config *sd_clip_get_config(const sd_clip *m)
{
    return &m->cfg;
}

int sd_clip_check_shape(const sd_clip_config *c, int batch, int t, sd_err *err)
{
    if (check_config(c, err))
        return -1;
    if (batch < 1 || t < 1 || t > c->max_position_embeddings)
        return sd_err_set(err, "text encoder: batch %d x %d tokens (need batch >= 1 and 1 to %d "
                          "tokens)", batch, t, c->max_position_embeddings);
    if ((double)batch * t * (c->intermediate_size > c->hidden_size ? c->intermediate_size
                                                                    : c->hidden_size) > 1e12)
        return sd_err_set(err, "text encoder: batch %d is too large", batch);
    return 0;
}

/* ---- the forward, shared by the dry run and the real run -------------------------------- */

typedef struct run {
    const sd_clip *m; /* NULL in a dry run */
    const sd_clip_config *cfg;
    const sd_backend *be; /* NULL when only counting FLOPs */
    sd_arena *a;
    int dry;
    size_t esize;
    double flops;
    const sd_clip_tap *tap;
} run;

static void *tmp(run *r, size_t bytes)
{
    void *p = sd_arena_alloc(r->a, bytes);
    if (!r->dry)
        SD_CHECK(p != NULL || bytes == 0,
                 "text encoder: the arena ran out (%zu of %zu bytes used, %zu more wanted): size it "
                 "with sd_clip_scratch_bytes", sd_arena_used(r->a), sd_arena_capacity(r->a), bytes);
    return p;
}

static void linear(run *r, const lin_p *p, const void *x, int64_t rows, int in, int out, void *y)
{
    r->flops += 2.0 * (double)rows * in * out;
    if (!r->dry)
        sd_linear_forward(r->be, rows, in, out, x, p->w, p->b, y);
}

static void lnorm(run *r, const lin_p *p, const void *x, int64_t rows, int c, void *y)
{
    if (!r->dry)
        sd_layer_norm_forward(r->be, rows, c, (float)r->cfg->layer_norm_eps, x, p->w, p->b, y,
                              NULL, NULL);
}

static void tap(run *r, const char *name, const void *x, int n, int t)
{
    if (!r->dry && r->tap && r->tap->fn)
        r->tap->fn(r->tap->user, name, x, n, 1, t, r->cfg->hidden_size);
}

static void clip_run(run *r, int n, int t, const int32_t *ids, void *out)
{
    const sd_clip_config *c = r->cfg;
    const sd_clip *m = r->m;
    const int d = c->hidden_size, inner = c->intermediate_size, heads = c->num_attention_heads;
    const int64_t rows = (int64_t)n * t;
    const size_t bytes = (size_t)rows * d * r->esize;
    sd_attention_desc ad = sd_attention_make(n, heads, d / heads, t, t, 1);
    char name[48];
    void *x = tmp(r, bytes); /* the residual stream */

    if (!r->dry)
        sd_embedding_forward(r->be, n, t, d, c->vocab_size, ids, m->tok, m->pos, x);
    tap(r, "embeddings", x, n, t);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const layer_p *L = m ? &m->layers[l] : NULL;
        size_t mark = sd_arena_mark(r->a), sb;
        void *h = tmp(r, bytes), *q = tmp(r, bytes), *k = tmp(r, bytes), *v = tmp(r, bytes), *s;
        void *f;
        lnorm(r, L ? &L->ln1 : NULL, x, rows, d, h);
        linear(r, L ? &L->q : NULL, h, rows, d, d, q);
        linear(r, L ? &L->k : NULL, h, rows, d, d, k);
        linear(r, L ? &L->v : NULL, h, rows, d, d, v);
        sb = r->be ? sd_attention_forward_scratch_bytes(r->be, &ad) : 0;
        s = tmp(r, sb);
        r->flops += 4.0 * n * heads * (double)(d / heads) * ((double)t * (t + 1) / 2);
        if (!r->dry)
            sd_attention_forward(r->be, &ad, q, k, v, h, NULL, (sd_scratch){s, sb});
        linear(r, L ? &L->o : NULL, h, rows, d, d, q);
        if (!r->dry)
            sd_add(r->be, rows * d, x, q, x); /* residual + hidden_states */
        lnorm(r, L ? &L->ln2 : NULL, x, rows, d, h);
        f = tmp(r, (size_t)rows * inner * r->esize);
        linear(r, L ? &L->fc1 : NULL, h, rows, d, inner, f);
        if (!r->dry) {
            if (c->quick_gelu)
                sd_quick_gelu_forward(r->be, rows * inner, f, f);
            else
                sd_gelu_forward(r->be, rows * inner, f, f);
        }
        linear(r, L ? &L->fc2 : NULL, f, rows, inner, d, h);
        if (!r->dry)
            sd_add(r->be, rows * d, x, h, x);
        sd_arena_reset_to(r->a, mark);
        snprintf(name, sizeof name, "encoder.layers.%d", l);
        tap(r, name, x, n, t);
    }
    lnorm(r, m ? &m->final_ln : NULL, x, rows, d, out);
    tap(r, "final_layer_norm", out, n, t);
}

typedef struct plan {
    size_t bytes;
    double flops;
} plan;

static plan make_plan(const sd_clip_config *c, const sd_backend *be, int batch, int t)
{
    sd_arena meas;
    run r;
    plan p;
    SD_CHECK(sd_arena_init_measure(&meas, SD_ARENA_DEFAULT_ALIGNMENT) == 0, "measuring arena");
    memset(&r, 0, sizeof r);
    r.cfg = c;
    r.be = be;
    r.a = &meas;
    r.dry = 1;
    r.esize = be ? sd_dtype_size(be->dtype) : sizeof(float);
    clip_run(&r, batch, t, NULL, NULL);
    p.bytes = sd_arena_high_water(&meas) + SD_ARENA_DEFAULT_ALIGNMENT;
    p.flops = r.flops;
    sd_arena_free(&meas);
    return p;
}

static void check_shape_or_die(const sd_clip_config *c, int batch, int t)
{
    sd_err err;
    SD_CHECK(sd_clip_check_shape(c, batch, t, &err) == 0, "%s", err.msg);
}

size_t sd_clip_scratch_bytes(const sd_clip_config *c, const sd_backend *be, int batch, int t)
{
    check_shape_or_die(c, batch, t);
    return make_plan(c, be, batch, t).bytes;
}

double sd_clip_forward_flops(const sd_clip_config *c, int batch, int t)
{
    check_shape_or_die(c, batch, t);
    return make_plan(c, NULL, batch, t).flops;
}

void sd_clip_forward(const sd_clip *m, int batch, int t, const int32_t *ids, void *last_hidden,
                     sd_arena *arena, const sd_clip_tap *tap_)
{
    plan p;
    run r;
    size_t mark, free_bytes;
    check_shape_or_die(&m->cfg, batch, t);
    p = make_plan(&m->cfg, m->be, batch, t);
    free_bytes = sd_arena_capacity(arena) - sd_arena_used(arena);
    SD_CHECK(!sd_arena_is_measuring(arena) && free_bytes >= p.bytes,
             "text encoder: the arena has %zu bytes free, %d x %d tokens need %zu (query "
             "sd_clip_scratch_bytes)", free_bytes, batch, t, p.bytes);
    mark = sd_arena_mark(arena);
    memset(&r, 0, sizeof r);
    r.m = m;
    r.cfg = &m->cfg;
    r.be = m->be;
    r.a = arena;
    r.esize = sd_dtype_size(m->be->dtype);
    r.tap = tap_;
    clip_run(&r, batch, t, ids, last_hidden);
    sd_arena_reset_to(arena, mark);
}

int sd_clip_pooled_index(const int32_t *ids, int t, int eos_token_id)
{
    int best = 0;
    if (eos_token_id == 2) {
        for (int i = 1; i < t; i++)
            if (ids[i] > ids[best])
                best = i;
        return best;
    }
    for (int i = 0; i < t; i++)
        if (ids[i] == eos_token_id)
            return i;
    return 0;
}

void sd_clip_pool(const sd_clip *m, int batch, int t, const int32_t *ids_host, int eos_token_id,
                  const void *last_hidden, void *pooled)
{
    const size_t row = (size_t)m->cfg.hidden_size * sd_dtype_size(m->be->dtype);
    for (int b = 0; b < batch; b++) {
        int i = sd_clip_pooled_index(ids_host + (size_t)b * t, t, eos_token_id);
        sd_copy(m->be, (unsigned char *)pooled + (size_t)b * row,
                (const unsigned char *)last_hidden + ((size_t)b * t + i) * row, row);
    }
}
