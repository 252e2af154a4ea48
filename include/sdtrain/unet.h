/* The U-Net (diffusers UNet2DConditionModel, SD family) forward pass, written once on the op interface. */
#ifndef SDTRAIN_UNET_H
#define SDTRAIN_UNET_H

/*
 * Lifecycle: sd_unet_create() checks the parameter table against the configuration (every
 * name and shape, nothing missing, nothing left over) and resolves every tensor pointer once;
 * sd_unet_forward() then runs with no allocation and no name lookups. Activation memory comes
 * from an arena sized by sd_unet_scratch_bytes(), which runs the same forward code in a
 * measuring arena (shapes only, no kernels). doc/unet.md is the long version of this comment.
 *
 * Tensors (all in the backend's memory, elements of be->dtype, channels last):
 *   sample  [batch, h, w, in_channels]          (the noisy latent; PyTorch's NCHW permuted)
 *   ctx     [batch, ctx_len, cross_attention_dim] (encoder_hidden_states, e.g. CLIP [77, 1024])
 *   out     [batch, h, w, out_channels]          (the model prediction)
 * Timesteps are host fp32 [batch] (integers 0..999 in SD training; fractions allowed).
 *
 * Any latent size >= 1 is accepted: when h or w is not a multiple of 2^(n_levels-1), every
 * upsampler resizes to the spatial size of the skip it meets next, as diffusers does
 * (downsampling gives ceil(h/2) with downsample_padding 1).
 *
 * Numerics follow diffusers 0.42.1 (spec §1, §8): fp32 time embedding [cos | sin] per
 * flip_sin_to_cos / freq_shift, SiLU(emb) before every ResNet's time_emb_proj, GroupNorm
 * eps = norm_eps in ResNets and conv_norm_out but 1e-6 in Transformer2DModel, LayerNorm eps
 * 1e-5, attention scale head_dim^-0.5, GEGLU gate = second half, skip concat [h, skip].
 * Transformer2DModel's width is heads * (channels / heads) (integer division, as diffusers),
 * which is the channel count whenever the heads divide it.
 */

#include <stddef.h>

#include "sdtrain/arena.h"
#include "sdtrain/error.h"
#include "sdtrain/models.h"
#include "sdtrain/ops.h"
#include "sdtrain/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest layers_per_block the forward supports (its skip stack lives on the C stack). */
#define SD_UNET_MAX_LAYERS_PER_BLOCK 8
/* Largest block_out_channels[0] (the sinusoid is built on the host, a few rows at a time, for
 * backends whose memory is not host fp32). */
#define SD_UNET_MAX_TIME_PROJ_DIM 4096

typedef struct sd_unet sd_unet;

/* Resolves a U-Net's parameters. `params` is the flat parameter buffer in the backend's memory
 * (elements of be->dtype; tensor i starts table->params[i].offset elements in, in our layouts:
 * conv [O, kh, kw, I], linear [out, in]). proj_in/proj_out may be stored as linear [O, I] or as
 * 1x1 conv [O, I, 1, 1] whatever use_linear_projection says (same bytes). Returns 0 and a new
 * model in *out, or -1 with one message listing what does not match (missing tensors, wrong
 * shapes, tensors the configuration does not use, unsupported settings). `table` is only read
 * during the call; `params` must outlive the model. */
int sd_unet_create(sd_unet **out, const sd_unet_config *c, const sd_param_table *table,
                   const void *params, const sd_backend *be, sd_err *err);

/* The same for weights in host fp32 (sd_weights), which a CPU fp32 backend uses in place. */
int sd_unet_create_from_weights(sd_unet **out, const sd_unet_config *c, const sd_weights *w,
                                const sd_backend *be, sd_err *err);

void sd_unet_free(sd_unet *u);

/* Batch invariance: sample b of a batch gives the same bits as that sample run alone. BLAS
 * GEMMs do not promise it (OpenBLAS on Zen rounds a row differently depending on how many rows
 * the call has and where the row sits among them), so in this mode every convolution and
 * linear layer runs one call per sample; norms and attention are per sample anyway. On by
 * default for CPU backends (cost: smaller GEMMs, measured in doc/unet.md), off for others. */
void sd_unet_set_batch_invariant(sd_unet *u, int on);

const sd_unet_config *sd_unet_get_config(const sd_unet *u);

/* 0 when the model runs on these sizes, else -1 and why (non-positive sizes, a configuration
 * this implementation does not support, sizes whose element counts overflow). */
int sd_unet_check_shape(const sd_unet_config *c, int batch, int h, int w, int ctx_len,
                        sd_err *err);

/* Bytes of arena one forward needs (activations, skip stack and op scratch, plus alignment
 * slack), measured by a dry run of the forward code (enough with batch invariance on or off). Depends on the backend and its settings
 * (the CPU attention keeps one score block per OpenMP thread): query after setting the thread
 * count. The shape must pass sd_unet_check_shape. */
size_t sd_unet_scratch_bytes(const sd_unet_config *c, const sd_backend *be, int batch, int h,
                             int w, int ctx_len);

/* Floating-point operations of one forward, counted by the same dry run: 2 x multiply-adds of
 * every convolution, linear layer and attention matmul (q k^T and p v); norms, activations,
 * softmax and additions are not counted. */
double sd_unet_forward_flops(const sd_unet_config *c, int batch, int h, int w, int ctx_len);

/* A debug hook: called after each named stage with its output [n, h, w, c] (backend memory,
 * valid during the call only). Names are the diffusers module names: "time_embedding" (h = w
 * = 1), "conv_in", "down_blocks.I", "mid_block", "up_blocks.I", and inside blocks
 * "down_blocks.I.resnets.J", "down_blocks.I.attentions.J", "down_blocks.I.downsamplers.0",
 * "mid_block.resnets.J", "mid_block.attentions.0", "up_blocks.I.resnets.J",
 * "up_blocks.I.attentions.J", "up_blocks.I.upsamplers.0", then "conv_norm_out" (after the
 * SiLU) and "conv_out". */
typedef void (*sd_unet_tap_fn)(void *user, const char *name, const void *x, int n, int h,
                               int w, int c);
typedef struct sd_unet_tap {
    sd_unet_tap_fn fn;
    void *user;
} sd_unet_tap;

/* out = unet(sample, timesteps, ctx). Allocates from `arena` above its current position and
 * returns it there (the arena needs sd_unet_scratch_bytes() free bytes, else the job ends with
 * a message saying by how much it missed). The shape must pass sd_unet_check_shape (checked).
 * `tap` may be NULL. The result depends on the inputs only (CPU: not on the thread count, and
 * sample b of a batch equals that sample run alone). */
void sd_unet_forward(const sd_unet *u, int batch, int h, int w, const void *sample,
                     const float *timesteps, const void *ctx, int ctx_len, void *out,
                     sd_arena *arena, const sd_unet_tap *tap);

/* ---- Training: forward keeping activations, backward into fp32 gradients ------------------ */

/*
 * A trainer binds a model to a gradient buffer and to one input shape, and plans the memory of
 * a training step once: sd_unet_trainer_arena_bytes() is measured by a dry run of the same
 * forward + backward code, so the step loop allocates nothing. The activations the backward
 * needs stay in the arena between sd_unet_train_forward() and sd_unet_backward().
 *
 * With `recompute` set only the inputs and outputs of every ResNet and Transformer2DModel block
 * are kept; the backward re-runs each block's forward just before back-propagating through it
 * (one extra forward of compute for a much smaller activation footprint). Both modes give the
 * same bits.
 *
 * `grads` is an fp32 flat buffer in the backend's memory laid out like the parameters (tensor i
 * at table->params[i].offset floats, in our layouts); sd_unet_backward() ACCUMULATES into it,
 * so a step zeroes it once and micro-batches add up. The gradient of the input sample and of the
 * context are not computed (the encoders are frozen).
 */
typedef struct sd_unet_trainer sd_unet_trainer;

int sd_unet_trainer_create(sd_unet_trainer **out, const sd_unet *u, const sd_param_table *table,
                           float *grads, int batch, int h, int w, int ctx_len, int recompute,
                           sd_err *err);
void sd_unet_trainer_free(sd_unet_trainer *t);

/* Arena bytes one sd_unet_train_forward + sd_unet_backward pair needs (with batch invariance on
 * or off, so it holds whatever sd_unet_set_batch_invariant says later). */
size_t sd_unet_trainer_arena_bytes(const sd_unet_trainer *t);
/* FLOPs of one forward + backward as the dry run counts them (forward as
 * sd_unet_forward_flops, backward twice the forward's matmuls, less the input gradient of
 * conv_in; recomputation not counted). */
double sd_unet_trainer_flops(const sd_unet_trainer *t);

/* out = unet(sample, timesteps, ctx) for the trainer's shape, keeping the activations in
 * `arena` (above its current position). sample, ctx and timesteps (host fp32) must stay
 * unchanged until sd_unet_backward() returns. */
void sd_unet_train_forward(sd_unet_trainer *t, const void *sample, const float *timesteps,
                           const void *ctx, void *out, sd_arena *arena);
/* The same, with the timestep sinusoids given instead of the timesteps: tsin [batch,
 * block_out_channels[0]] fp32 in the backend's memory, as sd_unet_time_sinusoid makes them
 * (cast to the compute type on the backend, so a GPU step needs no host copy of its own; same
 * result). tsin must stay unchanged until sd_unet_backward() returns. */
void sd_unet_train_forward_sin(sd_unet_trainer *t, const void *sample, const float *tsin,
                               const void *ctx, void *out, sd_arena *arena);
/* The U-Net's timestep sinusoids of n timesteps on the host, fp32: out [n,
 * block_out_channels[0]] (diffusers' Timesteps with the config's flip_sin_to_cos and
 * freq_shift). What the forward computes from its timesteps. */
void sd_unet_time_sinusoid(const sd_unet_config *c, int n, const float *timesteps, float *out);

/* Back-propagates dout [batch, h, w, out_channels] (the loss gradient w.r.t. out), adding every
 * parameter gradient into `grads`, then returns the arena to where the forward began. */
void sd_unet_backward(sd_unet_trainer *t, const void *dout, sd_arena *arena);

/* The gradient-ready hook, for reducing gradients while the backward still runs
 * (doc/training.md "Gradient reduction"). During sd_unet_backward, fn(user, from) says that the
 * gradients at floats [from, total_floats) of `grads` are final for this backward: nothing later
 * in it writes there. The backward finishes the blocks from the end of the buffer to its start,
 * so `from` falls from call to call: once after conv_norm_out / conv_out, after every up block,
 * the mid block and every down block, and a last time with from = 0. The calls come when the
 * block's work has been issued to the backend: on a GPU it is queued on the backend's stream,
 * not yet done, so fn must order what it does after that stream's work. NULL fn: no calls (the
 * default). */
typedef void (*sd_unet_ready_fn)(void *user, size_t from);
void sd_unet_trainer_set_ready_hook(sd_unet_trainer *t, sd_unet_ready_fn fn, void *user);

/* The parameter-need hook, its mirror for the forward, for gathering sharded parameters while
 * the forward already runs (doc/training.md "Gradient reduction"). During
 * sd_unet_train_forward[_sin], fn(user, upto) says that the forward is about to read the
 * parameters at floats [0, upto) of the table, and nothing beyond until the next call. The
 * forward reads the blocks in the buffer's order, so `upto` rises from call to call: before the
 * time embedding and conv_in, before every down block, the mid block, every up block, and a
 * last time with upto = total_floats before conv_norm_out / conv_out. The backward reads only
 * what the forward read. Calls come before the reads are issued to the backend: on a GPU, fn
 * may make the backend's stream wait for the copies that bring the range in. NULL fn: no calls
 * (the default). */
typedef void (*sd_unet_need_fn)(void *user, size_t upto);
void sd_unet_trainer_set_need_hook(sd_unet_trainer *t, sd_unet_need_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
