/* Parameter tables: the diffusers/transformers key, PyTorch shape and flat-buffer offset of
 * every tensor of the U-Net, VAE and text encoder, enumerated from the configuration in the
 * order the modules are built. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/models.h"

/* dst = prefix + "." + suffix; parameter names are short, so overflow is a bug. */
static void join(char *dst, size_t cap, const char *prefix, const char *suffix)
{
    size_t a = strlen(prefix), b = strlen(suffix);
    SD_CHECK(a + 1 + b < cap, "parameter name too long: %s.%s", prefix, suffix);
    memcpy(dst, prefix, a);
    dst[a] = '.';
    memcpy(dst + a + 1, suffix, b + 1);
}

static void add(sd_param_table *t, sd_param_kind kind, int ndim, const int64_t *shape, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

static void add(sd_param_table *t, sd_param_kind kind, int ndim, const int64_t *shape, const char *fmt, ...)
{
    sd_param *p;
    va_list ap;
    int n;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 256;
        t->params = sd_xrealloc(t->params, t->cap * sizeof *t->params);
    }
    p = &t->params[t->n++];
    memset(p, 0, sizeof *p);
    va_start(ap, fmt);
    n = vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    SD_CHECK(n > 0 && (size_t)n < sizeof p->name, "parameter name too long: %s", p->name);
    p->kind = kind;
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = shape[i];
        p->numel *= (size_t)shape[i];
    }
    p->offset = t->total_floats;
    t->total_floats += (p->numel + SD_PARAM_ALIGN - 1) / SD_PARAM_ALIGN * SD_PARAM_ALIGN;
    t->total_numel += p->numel;
}

static void vec(sd_param_table *t, int64_t c, const char *prefix, const char *what)
{
    char n[SD_PARAM_NAME_MAX];
    join(n, sizeof n, prefix, what);
    add(t, SD_PARAM_VECTOR, 1, (int64_t[]){c}, "%s", n);
}

static void linear(sd_param_table *t, const char *prefix, int64_t in, int64_t out, int bias)
{
    char n[SD_PARAM_NAME_MAX];
    join(n, sizeof n, prefix, "weight");
    add(t, SD_PARAM_LINEAR, 2, (int64_t[]){out, in}, "%s", n);
    if (bias)
        vec(t, out, prefix, "bias");
}

static void conv(sd_param_table *t, const char *prefix, int64_t in, int64_t out, int64_t k)
{
    char n[SD_PARAM_NAME_MAX];
    join(n, sizeof n, prefix, "weight");
    add(t, SD_PARAM_CONV, 4, (int64_t[]){out, in, k, k}, "%s", n);
    vec(t, out, prefix, "bias");
}

static void norm(sd_param_table *t, const char *prefix, int64_t c)
{
    vec(t, c, prefix, "weight");
    vec(t, c, prefix, "bias");
}

/* ResnetBlock2D; `temb` = width of the time embedding, 0 in the VAE. */
static void resnet(sd_param_table *t, const char *p, int64_t cin, int64_t cout, int64_t temb)
{
    char n[SD_PARAM_NAME_MAX];
    join(n, sizeof n, p, "norm1");
    norm(t, n, cin);
    join(n, sizeof n, p, "conv1");
    conv(t, n, cin, cout, 3);
    if (temb) {
        join(n, sizeof n, p, "time_emb_proj");
        linear(t, n, temb, cout, 1);
    }
    join(n, sizeof n, p, "norm2");
    norm(t, n, cout);
    join(n, sizeof n, p, "conv2");
    conv(t, n, cout, cout, 3);
    if (cin != cout) {
        join(n, sizeof n, p, "conv_shortcut");
        conv(t, n, cin, cout, 1);
    }
}

/* Transformer2DModel with BasicTransformerBlocks (self-attn, cross-attn, GEGLU feed-forward).
 * The blocks work at inner = heads * (c / heads), which is c unless heads does not divide c
 * (diffusers then projects to the smaller width). */
static void transformer(sd_param_table *t, const char *p, int64_t c, int heads, int64_t ctx, int layers,
                        int linear_proj)
{
    char n[SD_PARAM_NAME_MAX];
    const int64_t inner = heads * (c / heads);
    join(n, sizeof n, p, "norm");
    norm(t, n, c);
    join(n, sizeof n, p, "proj_in");
    if (linear_proj)
        linear(t, n, c, inner, 1);
    else
        conv(t, n, c, inner, 1);
    for (int l = 0; l < layers; l++) {
        char b[SD_PARAM_NAME_MAX], sfx[32];
        snprintf(sfx, sizeof sfx, "transformer_blocks.%d", l);
        join(b, sizeof b, p, sfx);
        for (int a = 1; a <= 2; a++) {
            static const char *proj[4] = {"to_q", "to_k", "to_v", "to_out.0"};
            char attn[SD_PARAM_NAME_MAX];
            snprintf(sfx, sizeof sfx, "norm%d", a);
            join(n, sizeof n, b, sfx);
            norm(t, n, inner);
            snprintf(sfx, sizeof sfx, "attn%d", a);
            join(attn, sizeof attn, b, sfx);
            for (int k = 0; k < 4; k++) {
                /* attn1 is self-attention; attn2's keys and values come from the text */
                int64_t in = (k == 1 || k == 2) && a == 2 ? ctx : inner;
                join(n, sizeof n, attn, proj[k]);
                linear(t, n, in, inner, k == 3);
            }
        }
        join(n, sizeof n, b, "norm3");
        norm(t, n, inner);
        join(n, sizeof n, b, "ff.net.0.proj");
        linear(t, n, inner, 8 * inner, 1);
        join(n, sizeof n, b, "ff.net.2");
        linear(t, n, 4 * inner, inner, 1);
    }
    join(n, sizeof n, p, "proj_out");
    if (linear_proj)
        linear(t, n, inner, c, 1);
    else
        conv(t, n, inner, c, 1);
}

void sd_unet_params(const sd_unet_config *c, sd_param_table *t)
{
    const int L = c->n_levels;
    const int64_t c0 = c->block_out_channels[0], temb = 4 * c0;
    char p[SD_PARAM_NAME_MAX];
    int64_t out = c0;
    memset(t, 0, sizeof *t);
    conv(t, "conv_in", c->in_channels, c0, c->conv_in_kernel);
    linear(t, "time_embedding.linear_1", c0, temb, 1);
    linear(t, "time_embedding.linear_2", temb, temb, 1);
    for (int i = 0; i < L; i++) {
        int64_t in = out;
        out = c->block_out_channels[i];
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(p, sizeof p, "down_blocks.%d.resnets.%d", i, j);
            resnet(t, p, j == 0 ? in : out, out, temb);
        }
        if (c->down_cross[i])
            for (int j = 0; j < c->layers_per_block; j++) {
                snprintf(p, sizeof p, "down_blocks.%d.attentions.%d", i, j);
                transformer(t, p, out, c->heads[i], c->cross_attention_dim, c->transformer_layers[i],
                            c->use_linear_projection);
            }
        if (i < L - 1) {
            snprintf(p, sizeof p, "down_blocks.%d.downsamplers.0.conv", i);
            conv(t, p, out, out, 3);
        }
    }
    /* diffusers builds attentions before resnets inside the mid block */
    transformer(t, "mid_block.attentions.0", c->block_out_channels[L - 1], c->heads[L - 1], c->cross_attention_dim,
                c->transformer_layers[L - 1], c->use_linear_projection);
    resnet(t, "mid_block.resnets.0", c->block_out_channels[L - 1], c->block_out_channels[L - 1], temb);
    resnet(t, "mid_block.resnets.1", c->block_out_channels[L - 1], c->block_out_channels[L - 1], temb);
    out = c->block_out_channels[L - 1];
    for (int i = 0; i < L; i++) {
        int64_t prev = out, skip_in;
        int lvl = L - 1 - i;
        out = c->block_out_channels[lvl];
        skip_in = c->block_out_channels[lvl > 0 ? lvl - 1 : 0];
        for (int j = 0; j <= c->layers_per_block; j++) {
            int64_t res_skip = j == c->layers_per_block ? skip_in : out;
            int64_t res_in = j == 0 ? prev : out;
            snprintf(p, sizeof p, "up_blocks.%d.resnets.%d", i, j);
            resnet(t, p, res_in + res_skip, out, temb);
        }
        if (c->up_cross[i])
            for (int j = 0; j <= c->layers_per_block; j++) {
                snprintf(p, sizeof p, "up_blocks.%d.attentions.%d", i, j);
                transformer(t, p, out, c->heads[lvl], c->cross_attention_dim, c->transformer_layers[lvl],
                            c->use_linear_projection);
            }
        if (i < L - 1) {
            snprintf(p, sizeof p, "up_blocks.%d.upsamplers.0.conv", i);
            conv(t, p, out, out, 3);
        }
    }
    norm(t, "conv_norm_out", c0);
    conv(t, "conv_out", c0, c->out_channels, c->conv_out_kernel);
}

/* The VAE mid block: resnet, single-head attention, resnet (at `ch` channels). */
static void vae_mid(sd_param_table *t, const char *side, int64_t ch, int attention)
{
    char p[SD_PARAM_NAME_MAX];
    if (attention) {
        join(p, sizeof p, side, "mid_block.attentions.0.group_norm");
        norm(t, p, ch);
        static const char *proj[4] = {"to_q", "to_k", "to_v", "to_out.0"};
        for (int k = 0; k < 4; k++) {
            char sfx[48];
        snprintf(sfx, sizeof sfx, "mid_block.attentions.0.%s", proj[k]);
        join(p, sizeof p, side, sfx);
            linear(t, p, ch, ch, 1);
        }
    }
    for (int j = 0; j < 2; j++) {
        char sfx[32];
        snprintf(sfx, sizeof sfx, "mid_block.resnets.%d", j);
        join(p, sizeof p, side, sfx);
        resnet(t, p, ch, ch, 0);
    }
}

void sd_vae_params(const sd_vae_config *c, sd_param_table *t)
{
    const int L = c->n_levels;
    const int64_t top = c->block_out_channels[L - 1];
    char p[SD_PARAM_NAME_MAX];
    int64_t out = c->block_out_channels[0];
    memset(t, 0, sizeof *t);
    conv(t, "encoder.conv_in", c->in_channels, out, 3);
    for (int i = 0; i < L; i++) {
        int64_t in = out;
        out = c->block_out_channels[i];
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.resnets.%d", i, j);
            resnet(t, p, j == 0 ? in : out, out, 0);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            conv(t, p, out, out, 3);
        }
    }
    vae_mid(t, "encoder", top, c->mid_block_add_attention);
    norm(t, "encoder.conv_norm_out", top);
    conv(t, "encoder.conv_out", top, 2 * c->latent_channels, 3);

    conv(t, "decoder.conv_in", c->latent_channels, top, 3);
    vae_mid(t, "decoder", top, c->mid_block_add_attention);
    out = top;
    for (int i = 0; i < L; i++) {
        int64_t prev = out;
        out = c->block_out_channels[L - 1 - i];
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.resnets.%d", i, j);
            resnet(t, p, j == 0 ? prev : out, out, 0);
        }
        if (i < L - 1) {
            snprintf(p, sizeof p, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            conv(t, p, out, out, 3);
        }
    }
    norm(t, "decoder.conv_norm_out", c->block_out_channels[0]);
    conv(t, "decoder.conv_out", c->block_out_channels[0], c->out_channels, 3);
    if (c->use_quant_conv)
        conv(t, "quant_conv", 2 * c->latent_channels, 2 * c->latent_channels, 1);
    if (c->use_post_quant_conv)
        conv(t, "post_quant_conv", c->latent_channels, c->latent_channels, 1);
}

void sd_clip_params(const sd_clip_config *c, sd_param_table *t)
{
    char p[SD_PARAM_NAME_MAX];
    const int64_t d = c->hidden_size;
    memset(t, 0, sizeof *t);
    add(t, SD_PARAM_EMBEDDING, 2, (int64_t[]){c->vocab_size, d},
        "text_model.embeddings.token_embedding.weight");
    add(t, SD_PARAM_EMBEDDING, 2, (int64_t[]){c->max_position_embeddings, d},
        "text_model.embeddings.position_embedding.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        static const char *proj[4] = {"k_proj", "v_proj", "q_proj", "out_proj"};
        for (int k = 0; k < 4; k++) {
            snprintf(p, sizeof p, "text_model.encoder.layers.%d.self_attn.%s", l, proj[k]);
            linear(t, p, d, d, 1);
        }
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm1", l);
        norm(t, p, d);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc1", l);
        linear(t, p, d, c->intermediate_size, 1);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc2", l);
        linear(t, p, c->intermediate_size, d, 1);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm2", l);
        norm(t, p, d);
    }
    norm(t, "text_model.final_layer_norm", d);
}

const sd_param *sd_param_find(const sd_param_table *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (strcmp(t->params[i].name, name) == 0)
            return &t->params[i];
    return NULL;
}

void sd_param_table_free(sd_param_table *t)
{
    free(t->params);
    memset(t, 0, sizeof *t);
}
