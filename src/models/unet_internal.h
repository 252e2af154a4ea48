/* Private to src/models: the U-Net's resolved parameter tree and the forward helpers that the
 * inference forward (unet.c) and the training forward/backward (unet_train.c) share. */
#ifndef SDTRAIN_UNET_INTERNAL_H
#define SDTRAIN_UNET_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/unet.h"

/* Transformer2DModel's GroupNorm eps is hard-coded in diffusers; its LayerNorms use 1e-5. */
#define UNET_TRANSFORMER_GN_EPS 1e-6f
#define UNET_LAYER_NORM_EPS 1e-5f

/* ---- the model tree ------------------------------------------------------------------------ */

typedef struct ut_lin {
    const void *w, *b; /* linear [out, in] or conv [O, kh, kw, I]; b may be NULL */
} ut_lin;

typedef struct ut_norm {
    const void *g, *b;
} ut_norm;

typedef struct ut_resnet {
    int cin, cout;
    ut_norm norm1, norm2;
    ut_lin conv1, time_proj, conv2, shortcut; /* shortcut.w NULL when cin == cout */
} ut_resnet;

typedef struct ut_block {
    ut_norm norm1, norm2, norm3;
    const void *q1, *k1, *v1, *q2, *k2, *v2;
    ut_lin out1, out2, ff_in, ff_out;
} ut_block;

typedef struct ut_transformer {
    int c, heads, head_dim, inner, layers;
    ut_norm norm;
    ut_lin proj_in, proj_out;
    ut_block *blocks;
} ut_transformer;

/* One level of the down path (down_blocks.i) or of the up path (up_blocks.i). */
typedef struct ut_stage {
    int n_res;               /* layers_per_block down, layers_per_block + 1 up */
    ut_resnet *res;
    ut_transformer *attn;    /* n_res of them, or NULL (DownBlock2D / UpBlock2D) */
    int has_sampler;
    ut_lin sampler;          /* downsamplers.0.conv / upsamplers.0.conv */
} ut_stage;

struct sd_unet {
    sd_unet_config c;
    const sd_backend *be;
    int temb_dim;
    ut_lin conv_in, time1, time2, conv_out;
    ut_norm norm_out;
    ut_stage down[SD_MODEL_MAX_LEVELS], up[SD_MODEL_MAX_LEVELS];
    ut_resnet mid_res[2];
    ut_transformer mid_attn;
    int batch_invariant; /* run GEMM-based ops one sample at a time (see ufw_linear) */
};


/* One forward's state. In a dry run (measuring arena) every allocation and scratch request is
 * made exactly as in the real run, but no op is called. */
typedef struct ufw {
    const sd_unet *u;
    const sd_backend *be;
    sd_arena *a;
    int dry;
    size_t es;
    const sd_unet_tap *tap;
    double flops;
} ufw;


/* Builds the tree of `c` with every pointer resolved into `params` (elements of `elem_size`
 * bytes; 0 = the backend's dtype). With table == NULL a shape-only model (pointers NULL) for dry
 * runs. The gradient mirror of a model is the same call on the fp32 gradient buffer. */
int sd_unet_build_tree(sd_unet **out, const sd_unet_config *c, const sd_param_table *table,
                       const void *params, size_t elem_size, const sd_backend *be, sd_err *err);

void *ufw_alloc(ufw *f, int64_t elems);
sd_scratch ufw_scratch(ufw *f, size_t bytes);
void ufw_tap(ufw *f, const char *name, const void *x, int n, int h, int w, int c);
int ufw_tapping(const ufw *f);
void ufw_linear(ufw *f, int n, int64_t per, int in, int out, const void *x, const void *w,
                const void *b, void *y);
/* ufw_linear + z, the add in the GEMM's pass where the backend can (z must not alias y) */
void ufw_linear_add(ufw *f, int n, int64_t per, int in, int out, const void *x, const void *w,
                    const void *b, const void *z, void *y);
void ufw_conv(ufw *f, const sd_conv2d_desc *d, const void *x, ut_lin l, void *y);
/* y = conv(x) + z in one pass where the backend can (z must not alias y) */
void ufw_conv_add(ufw *f, const sd_conv2d_desc *d, const void *x, ut_lin l, const void *z,
                  void *y);
void ufw_group_norm(ufw *f, int n, int64_t hw, int c, float eps, int silu, const void *x,
                    ut_norm g, void *y);
void ufw_attention(ufw *f, const sd_attention_desc *d, const void *q, const void *k,
                   const void *v, void *o);
void ufw_add(ufw *f, int64_t n, const void *a, const void *b, void *y);
/* tsin [n, block_out_channels[0]] = the sinusoidal embedding of host fp32 timesteps [n]. */
void ufw_time_sinusoid(ufw *f, int n, const float *timesteps, void *tsin);

/* Downsample2D's 3x3 stride-2 convolution of [n, h, w, ch]: padding 1 all round, or with
 * downsample_padding 0 the right/bottom-only pad of diffusers. */
sd_conv2d_desc sd_unet_downsample_desc(const sd_unet_config *c, int n, int h, int w, int ch);

/* Spatial size of every level (hs[0] = h ... hs[L-1]) and whether the up path resizes to the
 * skips' sizes instead of doubling (diffusers' forward_upsample_size). */
void sd_unet_level_sizes(const sd_unet_config *c, int h, int w, int *hs, int *ws, int *forced);

#endif
