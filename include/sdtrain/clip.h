/* The CLIP text encoder (transformers CLIPTextModel) forward, written once on the op interface. */
#ifndef SDTRAIN_CLIP_H
#define SDTRAIN_CLIP_H

/*
 * Lifecycle as for the U-Net and the VAE: sd_clip_create() checks the parameter table against
 * the configuration and resolves every tensor pointer once; sd_clip_forward() runs with no
 * allocation and no name lookups, with activations from an arena sized by
 * sd_clip_scratch_bytes() (a dry run of the same code on a measuring arena).
 *
 * Dataflow (spec §3.3, transformers 5.23):
 *   x = token_embedding[ids] + position_embedding[0 .. t-1]
 *   per layer:  x = x + out_proj(causal MHA(layer_norm1(x)))     (q/k/v/out with bias,
 *               x = x + fc2(act(fc1(layer_norm2(x))))               scale head_dim^-0.5)
 *   last_hidden_state = final_layer_norm(x)
 * act = exact GELU ("gelu") or x * sigmoid(1.702 x) ("quick_gelu"); LayerNorm eps from the
 * config. No attention mask besides the causal one (the SD pipelines pass none).
 *
 * Tensors: ids [batch, t] int32 in the backend's memory, each in [0, vocab_size);
 * last_hidden [batch, t, hidden_size] (be->dtype).
 */

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/arena.h"
#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_clip sd_clip;

/* Resolves the text encoder's parameters (names with the "text_model." prefix, as
 * sd_clip_params lists them). `params` is the flat buffer in the backend's memory (be->dtype).
 * Returns 0 and a new model, or -1 with a message naming what does not match. */
int sd_clip_create(sd_clip **out, const sd_clip_config *c, const sd_param_table *table,
                   const void *params, const sd_backend *be, sd_err *err);
/* The same for host fp32 weights, used in place (CPU fp32 backend). */
int sd_clip_create_from_weights(sd_clip **out, const sd_clip_config *c, const sd_weights *w,
                                const sd_backend *be, sd_err *err);
void sd_clip_free(sd_clip *m);
const sd_clip_config *sd_clip_get_config(const sd_clip *m);

/* 0 when batch >= 1 and 1 <= t <= max_position_embeddings, else -1 and why. */
int sd_clip_check_shape(const sd_clip_config *c, int batch, int t, sd_err *err);

/* Arena bytes of one forward (the residual stream, each layer's temporaries and op scratch,
 * measured by a dry run, plus alignment slack), for an arena with alignment <=
 * SD_ARENA_DEFAULT_ALIGNMENT. Query after setting the thread count (CPU attention scratch). */
size_t sd_clip_scratch_bytes(const sd_clip_config *c, const sd_backend *be, int batch, int t);

/* 2 x the multiply-adds of the linear layers and of the causal attention matmuls (only the
 * t(t+1)/2 visible query-key pairs per head are counted). */
double sd_clip_forward_flops(const sd_clip_config *c, int batch, int t);

/* Debug hook, called after "embeddings", each "encoder.layers.L" and "final_layer_norm" with the
 * output as [n, 1, t, c] (h = 1, w = t), backend memory valid during the call. */
typedef void (*sd_clip_tap_fn)(void *user, const char *name, const void *x, int n, int h, int w,
                               int c);
typedef struct sd_clip_tap {
    sd_clip_tap_fn fn;
    void *user;
} sd_clip_tap;

/* last_hidden = CLIPTextModel(ids).last_hidden_state. Memory from `arena` above its current
 * position, given back on return (sd_clip_scratch_bytes() free bytes needed, else the job ends
 * with the numbers). ids outside [0, vocab_size) end the job (validate input first). CPU: the
 * result does not depend on the thread count. */
void sd_clip_forward(const sd_clip *m, int batch, int t, const int32_t *ids, void *last_hidden,
                     sd_arena *arena, const sd_clip_tap *tap);

/* transformers' pooler_output position for one sequence of host ids: with eos_token_id == 2
 * (configs from before transformers PR #24773) the first position of the largest id, else the
 * first position holding eos_token_id, or 0 when there is none (argmax of all zeros). */
int sd_clip_pooled_index(const int32_t *ids, int t, int eos_token_id);

/* pooled [batch, hidden] = last_hidden[b, sd_clip_pooled_index(ids_host + b t)] (backend memory
 * copies; ids_host are the same ids on the host). */
void sd_clip_pool(const sd_clip *m, int batch, int t, const int32_t *ids_host, int eos_token_id,
                  const void *last_hidden, void *pooled);

#ifdef __cplusplus
}
#endif
#endif
