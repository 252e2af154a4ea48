/* The VAE (diffusers AutoencoderKL) encoder and decoder forward, written once on the op interface. */
#ifndef SDTRAIN_VAE_H
#define SDTRAIN_VAE_H

/*
 * Lifecycle as for the U-Net (unet.h): sd_vae_create() checks the parameter table against the
 * configuration and resolves every tensor pointer once; sd_vae_encode() / sd_vae_decode() run
 * with no allocation and no name lookups, taking activation memory from an arena sized by
 * sd_vae_{encode,decode}_scratch_bytes(), which run the same forward code on a measuring arena
 * (shapes only, no kernels). doc/models.md is the long version of this comment.
 *
 * Tensors (backend memory, elements of be->dtype, channels last):
 *   images   [batch, H, W, in_channels]          (RGB in [-1, 1]; PyTorch's NCHW permuted)
 *   moments  [batch, h, w, 2 * latent_channels]  = [mean | logvar before clamping]: diffusers'
 *            latent_dist.parameters (after quant_conv), h = H / 2^(n_levels-1) rounded down
 *   latents  [batch, h, w, latent_channels]      decoder input, ALREADY divided by the scaling
 *            factor (what diffusers' AutoencoderKL.decode takes)
 *   decoded  [batch, h * 2^(n_levels-1), w * 2^(n_levels-1), out_channels]
 * The posterior is applied with sd_diag_gaussian_sample (ops.h) on the moments.
 *
 * Numerics follow diffusers 0.42.1 (spec §2): GroupNorm eps 1e-6 everywhere, ResNets
 * conv1(SiLU(norm1 x)), conv2(SiLU(norm2 h)), shortcut 1x1 conv when channels change,
 * (shortcut + h); encoder Downsample2D pads right/bottom by one then 3x3 stride 2; decoder
 * Upsample2D nearest x2 then 3x3; mid block resnet, single-head attention (scale C^-0.5,
 * residual added after to_out), resnet; no skip connections; conv_norm_out + SiLU + conv_out.
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

typedef struct sd_vae sd_vae;

/* Resolves a VAE's parameters. `params` is the flat parameter buffer in the backend's memory
 * (elements of be->dtype, tensor i at table->params[i].offset elements, our layouts). Linear
 * attention weights may be listed as [C, C] or [C, C, 1, 1]. Returns 0 and a new model, or -1
 * with one message listing what does not match (missing, wrong shape, unused tensors).
 * `table` is only read during the call; `params` must outlive the model. */
int sd_vae_create(sd_vae **out, const sd_vae_config *c, const sd_param_table *table,
                  const void *params, const sd_backend *be, sd_err *err);
/* The same for host fp32 weights, used in place (CPU fp32 backend). */
int sd_vae_create_from_weights(sd_vae **out, const sd_vae_config *c, const sd_weights *w,
                               const sd_backend *be, sd_err *err);
void sd_vae_free(sd_vae *m);
const sd_vae_config *sd_vae_get_config(const sd_vae *m);

/* 0 when the encoder runs on [batch, h, w] images (every level before the last needs a side
 * of at least 2), with the latent size in *lh, *lw; else -1 and why. */
int sd_vae_check_image_shape(const sd_vae_config *c, int batch, int h, int w, int *lh, int *lw,
                             sd_err *err);
/* The same for the decoder on [batch, h, w] latents; *oh, *ow receive the image size. */
int sd_vae_check_latent_shape(const sd_vae_config *c, int batch, int h, int w, int *oh, int *ow,
                              sd_err *err);

/* Arena bytes one encode (of images [batch, h, w]) / decode (of latents [batch, h, w]) needs:
 * two ping-pong activation buffers of the largest feature map plus each block's temporaries
 * and op scratch, measured by a dry run, plus alignment slack, for an arena with alignment
 * <= SD_ARENA_DEFAULT_ALIGNMENT. Depends on the backend's settings (CPU: the thread count).
 * The shape must pass the check above. */
size_t sd_vae_encode_scratch_bytes(const sd_vae_config *c, const sd_backend *be, int batch,
                                   int h, int w);
size_t sd_vae_decode_scratch_bytes(const sd_vae_config *c, const sd_backend *be, int batch,
                                   int h, int w);

/* The largest convolution tensor (input as padded, or output) of one sample of an encode
 * (decode = 0, images [h, w]) or decode (decode = 1, latents [h, w]), in elements. */
int64_t sd_vae_conv_elems(const sd_vae_config *c, int decode, int h, int w);
/* How many samples of a batch one pass of the model takes on `be`: the whole batch, unless a
 * convolution tensor of it would exceed what the backend's convolutions take (cuDNN's
 * descriptors: 2^31 - 1 elements; the CPU has no limit), then the most that fit.
 * sd_vae_encode / sd_vae_decode split such a batch into passes themselves (the samples are
 * independent: the outputs are those of one pass) and the scratch queries size one pass. */
int sd_vae_pass_batch(const sd_vae_config *c, const sd_backend *be, int decode, int batch, int h,
                      int w);

/* Floating-point operations of one encode / decode, counted by the same dry run: 2 x the
 * multiply-adds of convolutions, linear layers and the two attention matmuls. */
double sd_vae_encode_flops(const sd_vae_config *c, int batch, int h, int w);
double sd_vae_decode_flops(const sd_vae_config *c, int batch, int h, int w);

/* A debug hook called after each named stage with its output [n, h, w, c] (backend memory,
 * valid during the call). Encoder: "encoder.conv_in", "encoder.down_blocks.I",
 * "encoder.mid_block", "encoder" (after conv_out), "quant_conv"; decoder: "post_quant_conv",
 * "decoder.conv_in", "decoder.mid_block", "decoder.up_blocks.I", "decoder". */
typedef void (*sd_vae_tap_fn)(void *user, const char *name, const void *x, int n, int h, int w,
                              int c);
typedef struct sd_vae_tap {
    sd_vae_tap_fn fn;
    void *user;
} sd_vae_tap;

/* moments = quant_conv(encoder(images)). Takes its memory from `arena` above the current
 * position and gives it back (needs sd_vae_encode_scratch_bytes() free bytes; less ends the
 * job with the numbers). `tap` may be NULL (and must be when the batch is split into passes,
 * sd_vae_pass_batch). CPU: the result does not depend on the thread count. */
void sd_vae_encode(const sd_vae *m, int batch, int h, int w, const void *images, void *moments,
                   sd_arena *arena, const sd_vae_tap *tap);
/* images = decoder(post_quant_conv(latents)). Same memory rules. */
void sd_vae_decode(const sd_vae *m, int batch, int h, int w, const void *latents, void *images,
                   sd_arena *arena, const sd_vae_tap *tap);

/* Host helper: DiagonalGaussianDistribution's mean and logvar from host fp32 moments
 * [rows, 2c]: mean = first half, logvar = clamp(second half, -30, 20) (NaN stays NaN, as
 * torch.clamp). Either output may be NULL. */
void sd_vae_moments_split_host(int64_t rows, int c, const float *moments, float *mean,
                               float *logvar);

#ifdef __cplusplus
}
#endif
#endif
