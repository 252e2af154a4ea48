/* A model's parameters in one flat fp32 buffer (our layouts), loaded from a diffusers
 * snapshot component, initialized at random, or exported back to PyTorch layouts. */
#ifndef SDTRAIN_WEIGHTS_H
#define SDTRAIN_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The flat buffer holds table.total_floats floats; tensor i lives at data + params[i].offset
 * in OUR layout (sd_weight_from_torch: conv weights [O, kh, kw, I], everything else as in
 * PyTorch). Alignment padding between tensors is zero. One allocation: all-reduce, ZeRO
 * shards and checkpoints work on contiguous ranges of it. */
typedef struct sd_weights {
    sd_param_table table;
    float *data;
    size_t *by_name; /* indices into table.params sorted by name, for sd_weights_find */
} sd_weights;

/* Refuses (-1, err naming `what`) a table whose fp32 parameters alone would not fit the memory
 * of this node: a configuration's sizes, checked before sd_weights_init asks for the bytes. */
int sd_weights_check_size(const sd_param_table *table, const char *what, sd_err *err);
/* Takes ownership of `table` (moved in) and allocates a zeroed buffer. */
void sd_weights_init(sd_weights *w, sd_param_table *table);
void sd_weights_free(sd_weights *w);

/* The tensor `name` (our layout), or NULL. */
float *sd_weights_find(const sd_weights *w, const char *name);
/* Like sd_weights_find, but a missing name is a bug in the model code (SD_CHECK). */
float *sd_weights_get(const sd_weights *w, const char *name);

/* Fills every expected tensor from a safetensors set: F32/F16/BF16 converted to fp32, conv
 * weights permuted to our layout. Accepts the key spellings real snapshots use (see
 * sd_weights_load's implementation notes: VAE legacy attention names, optional
 * "text_model." prefix, 1x1-conv / linear squeeze). Every problem is reported in one error
 * naming the file: missing tensors and unexpected ones (first 20 each + counts), shape
 * mismatches with the configuration, unsupported dtypes. */
int sd_weights_load(sd_weights *w, const sd_st_set *set, sd_err *err);

/* Deterministic random initialization for training from scratch (counter-based, seed and
 * tensor index only): linear/conv weights N(0, 1/fan_in), norms weight 1 bias 0, biases 0,
 * embeddings N(0, 0.02^2). */
void sd_weights_init_random(sd_weights *w, uint64_t seed);

/* Writes `data` (a flat buffer laid out by `table`, our layouts) as a safetensors file in
 * diffusers' key names and PyTorch's layouts, F32, metadata {"format": "pt"} (what
 * unet_final.safetensors and `sdtool export` hold; written atomically by the safetensors
 * writer). The same table and data give the same bytes. */
int sd_weights_save_torch(const sd_param_table *table, const float *data, const char *path,
                          sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
