/* A diffusers snapshot as one "original" Stable Diffusion checkpoint: the CompVis / LDM key
 * names (model.diffusion_model.*, first_stage_model.*, cond_stage_model.*) in one safetensors
 * file, the layout of the original checkpoints, which diffusers' from_single_file reads
 * (doc/export.md "One file"). */
#ifndef SDTRAIN_SINGLE_FILE_H
#define SDTRAIN_SINGLE_FILE_H

#include <stddef.h>

#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_LDM_UNET_PREFIX "model.diffusion_model."
#define SD_LDM_VAE_PREFIX "first_stage_model."
#define SD_LDM_OPENCLIP_PREFIX "cond_stage_model.model."
#define SD_LDM_CLIP_PREFIX "cond_stage_model.transformer."

/* The LDM name (without the prefix above) of a U-Net tensor's diffusers name into out.
 * Returns 0, or -1 for a name the mapping does not know. */
int sd_ldm_unet_key(const sd_unet_config *c, const char *key, char *out, size_t size);

/* The same for the VAE; *conv_1x1 is set to 1 for the mid-block attention's projection weights,
 * which LDM stores as 1x1 convolutions ([C, C, 1, 1]; diffusers: [C, C]), else 0. */
int sd_ldm_vae_key(const sd_vae_config *c, const char *key, char *out, size_t size, int *conv_1x1);

/* The text encoder: SD 2's OpenCLIP ViT-H (hidden_act "gelu") under SD_LDM_OPENCLIP_PREFIX,
 * where the q, k and v projections are one in_proj tensor (*part = 0, 1, 2: which third of its
 * rows; -1 for every other tensor); SD 1's OpenAI CLIP (quick_gelu) keeps the transformers
 * names under SD_LDM_CLIP_PREFIX (*part = -1). `out` receives the name with its prefix. */
int sd_ldm_clip_key(const sd_clip_config *c, const char *key, char *out, size_t size, int *part);

/* What sd_single_file_write wrote. */
typedef struct sd_single_file_info {
    size_t tensors[3];    /* U-Net, VAE, text encoder: tensors written */
    size_t numel[3];      /* their parameters */
    int open_clip;        /* the text encoder went out in OpenCLIP form */
} sd_single_file_info;

/* Reads the snapshot's unet/, vae/ and text_encoder/ (each checked against its config.json as
 * the trainer's loader checks it) and writes them to `path` in LDM names and PyTorch layouts,
 * every tensor as `dtype` (SD_ST_F32, SD_ST_F16 or SD_ST_BF16, rounded to nearest even),
 * metadata {"format": "pt"} plus `note` under "sdtrain" when not NULL. The file is written
 * atomically (a temporary name, then a rename). Returns 0; -1 when the snapshot cannot be read
 * or does not fit its configuration; -2 when the file cannot be written (messages name the
 * file and the problem). */
int sd_single_file_write(const char *snapshot, const char *path, sd_st_dtype dtype,
                         const char *note, sd_single_file_info *info, sd_err *err);

/* The three models read back from such a file. */
typedef struct sd_single_file_models {
    sd_unet_config unet;
    sd_vae_config vae;
    sd_clip_config clip;
    sd_weights w[3]; /* U-Net, VAE, text encoder (sd_component order), our layouts */
    int have;        /* bit c: w[c] initialized */
} sd_single_file_models;

/* Reads an original-layout file (any of F32/F16/BF16/F64) into the models that the
 * config.json files of `config_snapshot`'s unet/, vae/ and text_encoder/ describe (e.g. the
 * diffusers snapshot of the same model). `ema`: the U-Net from the file's model_ema.* copy.
 * Every tensor of those models must be in the file with the model's shape (1x1-convolution VAE
 * projections and fused in_proj accepted), and every tensor of the file under the three
 * prefixes must be used, except the parts SD never runs (the original OpenCLIP's last layer,
 * text_projection, logit_scale; position_ids); tensors outside the models (EMA copies, the
 * schedule's buffers) are skipped. `notes` receives what was read and left out. Returns 0, or -1
 * with a message naming the file and the first problems (free with
 * sd_single_file_models_free, also after an error). */
int sd_single_file_read(const char *file, const char *config_snapshot, int ema,
                        sd_single_file_models *m, char *notes, size_t notes_size, sd_err *err);
void sd_single_file_models_free(sd_single_file_models *m);

#ifdef __cplusplus
}
#endif
#endif
