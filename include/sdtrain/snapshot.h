/* A diffusers snapshot (or one component folder of it) opened for loading one model at a time. */
#ifndef SDTRAIN_SNAPSHOT_H
#define SDTRAIN_SNAPSHOT_H

/*
 * Layout (spec §7.2):  <snapshot>/model_index.json              (optional here)
 *                      <snapshot>/unet/config.json + diffusion_pytorch_model.safetensors
 *                      <snapshot>/vae/config.json  + diffusion_pytorch_model.safetensors
 *                      <snapshot>/text_encoder/config.json + model.safetensors
 * Weights may also be sharded (<name>.safetensors.index.json); see sd_st_set_open_dir.
 * A component folder may be given directly (e.g. ".../vae"): its config.json says which
 * component it is (_class_name, or model_type / architectures for a text encoder).
 *
 * Loading reads config.json with sd_*_config_load, builds the parameter table from it, and
 * fills an sd_weights with sd_weights_load, so a weight file that does not fit its config
 * (shape mismatch, missing or extra tensors) is an error that names both files. Only the
 * component asked for is read: memory holds one model's weights at a time.
 */

#include <stddef.h>

#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SD_COMPONENT_UNET = 0,
    SD_COMPONENT_VAE,
    SD_COMPONENT_TEXT_ENCODER,
    SD_COMPONENT_COUNT
} sd_component;

/* "unet", "vae", "text_encoder" (the folder names); "?" for an invalid value. */
const char *sd_component_name(sd_component c);

typedef struct sd_snapshot {
    char *path;            /* as given, without trailing slashes */
    int is_component;      /* the path is one component's folder */
    sd_component component; /* which, when is_component */
    int has_model_index;
    /* model_index.json lists the component with a non-null class (when has_model_index) */
    int listed[SD_COMPONENT_COUNT];
} sd_snapshot;

/* Opens `path`: a snapshot folder (model_index.json, or at least one of unet/, vae/,
 * text_encoder/) or a component folder (config.json). model_index.json, when present, must be
 * a JSON object, and the classes it names for our components must be the ones we implement
 * (UNet2DConditionModel, AutoencoderKL, CLIPTextModel[WithProjection]). Returns 0, or -1 with a
 * message naming the path and the problem. */
int sd_snapshot_open(sd_snapshot *s, const char *path, sd_err *err);
void sd_snapshot_close(sd_snapshot *s);

/* The folder of a component (snapshot/<name>, or the path itself for a component folder) into
 * buf; -1 with a message when the snapshot has no such component. */
int sd_snapshot_component_dir(const sd_snapshot *s, sd_component c, char *buf, size_t size,
                              sd_err *err);

/* One component's configuration (`config`: the sd_unet_config, sd_vae_config or
 * sd_clip_config of `c`) and the parameter table it makes, from its config.json checked as the
 * loaders below check it, without reading its weights. Returns 0, or -1 with a message. */
int sd_snapshot_component_table(const sd_snapshot *s, sd_component c, void *config,
                                sd_param_table *table, sd_err *err);

/* Loads one component: config and weights. `weights_name` selects a file name inside the
 * component folder (e.g. "diffusion_pytorch_model.fp16.safetensors"); NULL takes the default
 * names (diffusion_pytorch_model, then model; .safetensors or .safetensors.index.json).
 * On success *w is initialized (free with sd_weights_free); on failure *w is left zeroed. */
int sd_snapshot_load_unet(const sd_snapshot *s, const char *weights_name, sd_unet_config *c,
                          sd_weights *w, sd_err *err);
int sd_snapshot_load_vae(const sd_snapshot *s, const char *weights_name, sd_vae_config *c,
                         sd_weights *w, sd_err *err);
/* `eos_token_id` (may be NULL) receives config.json's eos_token_id, which decides how
 * transformers picks pooler_output (sd_clip_pooled_index): 49407 when absent (transformers'
 * default), -1 when null. */
int sd_snapshot_load_text_encoder(const sd_snapshot *s, const char *weights_name,
                                  sd_clip_config *c, int *eos_token_id, sd_weights *w,
                                  sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
