/* Model configurations (from a diffusers snapshot's config.json files or from the namelist)
 * and parameter tables: every tensor's diffusers key, PyTorch shape and place in the model's
 * flat parameter buffer. */
#ifndef SDTRAIN_MODELS_H
#define SDTRAIN_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/config.h"
#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_MODEL_MAX_LEVELS 8

/* UNet2DConditionModel, the subset of its configuration space the SD family uses. */
typedef struct sd_unet_config {
    int in_channels, out_channels;
    int n_levels;                               /* len(block_out_channels) */
    int block_out_channels[SD_MODEL_MAX_LEVELS];
    int down_cross[SD_MODEL_MAX_LEVELS];        /* 1: CrossAttnDownBlock2D, 0: DownBlock2D */
    int up_cross[SD_MODEL_MAX_LEVELS];          /* 1: CrossAttnUpBlock2D, 0: UpBlock2D */
    int layers_per_block;
    int heads[SD_MODEL_MAX_LEVELS];             /* attention heads per level (diffusers'
                                                   attention_head_dim, or num_attention_heads) */
    int transformer_layers[SD_MODEL_MAX_LEVELS];/* BasicTransformerBlocks per Transformer2DModel */
    int cross_attention_dim;
    int norm_num_groups;
    double norm_eps;
    int flip_sin_to_cos;
    double freq_shift;
    int use_linear_projection;                  /* 0: proj_in/proj_out are 1x1 convs */
    int downsample_padding;
    int conv_in_kernel, conv_out_kernel;
    int sample_size;
    int upcast_attention;                       /* no effect in fp32 */
} sd_unet_config;

/* AutoencoderKL. */
typedef struct sd_vae_config {
    int in_channels, out_channels;
    int n_levels;
    int block_out_channels[SD_MODEL_MAX_LEVELS];
    int layers_per_block;
    int latent_channels;
    int norm_num_groups;
    double scaling_factor;
    int use_quant_conv, use_post_quant_conv;
    int mid_block_add_attention;
    int sample_size;
} sd_vae_config;

/* CLIPTextModel. */
typedef struct sd_clip_config {
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_attention_heads;
    int num_hidden_layers;
    int max_position_embeddings;
    int quick_gelu;                             /* hidden_act: 0 = "gelu" (erf), 1 = "quick_gelu" */
    double layer_norm_eps;
} sd_clip_config;

/* Parses <dir>/config.json. Settings outside what sdtrain implements are errors that name
 * the file and the key (never silently different numerics). */
int sd_unet_config_load(const char *path, sd_unet_config *c, sd_err *err);
int sd_vae_config_load(const char *path, sd_vae_config *c, sd_err *err);
int sd_clip_config_load(const char *path, sd_clip_config *c, sd_err *err);

/* The configuration as a diffusers unet/config.json (UNet2DConditionModel, every setting
 * sd_unet_config_load reads back to the same struct); malloc'ed text. */
char *sd_unet_config_to_json(const sd_unet_config *c);

/* Configurations from the namelist's &model shape keys (used when there is no snapshot). */
void sd_unet_config_from_namelist(const sd_config *cfg, sd_unet_config *c);
void sd_vae_config_from_namelist(const sd_config *cfg, sd_vae_config *c);
void sd_clip_config_from_namelist(const sd_config *cfg, sd_clip_config *c);

/* The published SD2-base configurations (spec §1.1, §2.1, §3.1). */
void sd_unet_config_sd2_base(sd_unet_config *c);
void sd_vae_config_sd2_base(sd_vae_config *c);
void sd_clip_config_sd2_base(sd_clip_config *c);

/* How a tensor is stored in the checkpoint (PyTorch layout), which decides how it is
 * converted to our layout at load and back at export. */
typedef enum {
    SD_PARAM_VECTOR = 0, /* bias, norm weight: [C] */
    SD_PARAM_LINEAR,     /* [out, in] */
    SD_PARAM_CONV,       /* [out, in, kh, kw] */
    SD_PARAM_EMBEDDING   /* [rows, width] */
} sd_param_kind;

#define SD_PARAM_NAME_MAX 96

typedef struct sd_param {
    char name[SD_PARAM_NAME_MAX]; /* diffusers / transformers key */
    sd_param_kind kind;
    int ndim;
    int64_t shape[4];             /* PyTorch shape */
    size_t numel;
    size_t offset;                /* in floats, from the start of the flat buffer */
} sd_param;

/* A model's parameters in checkpoint order; offsets are aligned to SD_PARAM_ALIGN floats so
 * every tensor starts on a 256-byte boundary (vector loads, cuBLAS, ZeRO shard edges). */
#define SD_PARAM_ALIGN 64
typedef struct sd_param_table {
    sd_param *params;
    size_t n, cap;
    size_t total_floats;          /* size of the flat buffer, padding included */
    size_t total_numel;           /* parameters without padding */
} sd_param_table;

void sd_unet_params(const sd_unet_config *c, sd_param_table *t);
void sd_vae_params(const sd_vae_config *c, sd_param_table *t);
void sd_clip_params(const sd_clip_config *c, sd_param_table *t);
const sd_param *sd_param_find(const sd_param_table *t, const char *name);
void sd_param_table_free(sd_param_table *t);

#ifdef __cplusplus
}
#endif
#endif
