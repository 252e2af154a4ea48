/* Inference noise schedulers (DDIM, PNDM/PLMS, DDPM ancestral) over host fp32 arrays, as
 * diffusers' StableDiffusionPipeline drives them. */
#ifndef SDTRAIN_SAMPLER_H
#define SDTRAIN_SAMPLER_H
/*
 * Numerics follow diffusers 0.42.1 in fp32 (doc/sampling.md; spec §5.4-5.8), checked against
 * tests/data/sample/goldens.safetensors:
 *
 *   timesteps  'leading' spacing: ratio = T / N (integer division), t_i = (N-1-i) * ratio +
 *              steps_offset (diffusers does this in numpy float64/int64; every value is an
 *              exact integer, so int64 arithmetic gives the same). PNDM with skip_prk_steps
 *              repeats the second timestep: N + 1 model calls (N = 1: one).
 *   schedule   alphas_cumprod of the training schedule (sd_diffusion, bit-exact with torch);
 *              final_alpha_cumprod = abar[0] (set_alpha_to_one false, SD2's config).
 *   arithmetic every scalar coefficient is a 0-d fp32 torch tensor in diffusers (abar[t],
 *              1 - abar, ** 0.5), every tensor op one fp32 rounding in the order diffusers
 *              writes it; nothing is computed in double. Python float constants (1/24, the
 *              guidance scale) are rounded to float first, as torch does. ** 0.5 is sqrtf
 *              (correctly rounded); torch's CPU sqrt (MKL) is one ulp off for ~15% of
 *              inputs, so results agree to ~1e-7 rather than bit for bit (doc/sampling.md).
 *   options    clip_sample (DDIM, DDPM: sd_sampler.clip_sample_range) and set_alpha_to_one
 *              (DDIM: sd_sampler.final_alpha_cumprod = 1) are off by default, as in SD2's
 *              scheduler config; thresholding is not implemented; eta = 0 (DDIM).
 *
 * The DDPM step adds sqrt(variance) * z for every t > 0 (the last step of 'leading' spacing
 * has t = steps_offset = 1: variance clamped to 1e-20); z comes from the caller (the `noise`
 * argument of sd_sampler_step), so the scheduler stays a pure function of its inputs.
 */
#include <stddef.h>
#include <stdint.h>
#include "sdtrain/diffusion.h"
#include "sdtrain/error.h"
#include "sdtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SD_SAMPLER_DDIM = 0, SD_SAMPLER_PNDM = 1, SD_SAMPLER_DDPM = 2 } sd_sampler_kind;

/* "ddim", "pndm", "ddpm" (case-insensitive) -> kind; -1 for anything else. */
int sd_sampler_kind_from_name(const char *name);
const char *sd_sampler_kind_name(sd_sampler_kind kind);

/* The timesteps a scheduler visits (scheduler.timesteps after set_timesteps(N)), at most
 * N + 1 values into out[]. Returns how many, or -1 with a message when N < 1, N > T, or a
 * timestep would fall outside [0, T) (e.g. N = T with steps_offset 1). */
int sd_sampler_timesteps(sd_sampler_kind kind, int num_steps, int num_train_timesteps,
                         int steps_offset, int64_t *out, sd_err *err);

/* ---- One step, pure functions (out may alias sample; every array has n elements) -------- */

/* DDIMScheduler.step with eta = 0: t -> prev_t (prev_t < 0: final_alpha_cumprod). clip > 0
 * clamps the predicted x0 to [-clip, clip] (clip_sample with clip_sample_range); 0 = off. */
void sd_ddim_step(const float *alphas_cumprod, float final_alpha_cumprod, sd_prediction pred,
                  float clip, int64_t t, int64_t prev_t, int64_t n, const float *model_out,
                  const float *sample, float *out);
/* DDPMScheduler.step (variance_type fixed_small): prev_t < 0 means abar_prev = 1. noise is
 * used when t > 0 (may be NULL otherwise). clip as for DDIM. */
void sd_ddpm_step(const float *alphas_cumprod, sd_prediction pred, float clip, int64_t t,
                  int64_t prev_t, int64_t n, const float *model_out, const float *sample,
                  const float *noise, float *out);
/* PNDMScheduler._get_prev_sample (the PLMS update for an already combined model output). */
void sd_pndm_prev_sample(const float *alphas_cumprod, float final_alpha_cumprod,
                         sd_prediction pred, int64_t t, int64_t prev_t, int64_t n,
                         const float *model_out, const float *sample, float *out);
/* Classifier-free guidance: out = uncond + g * (cond - uncond), g rounded to float. */
void sd_guidance_combine(int64_t n, const float *uncond, const float *cond, double g, float *out);
/* The pipeline's image post-processing: x in [-1, 1]-ish -> round(clamp(x*0.5 + 0.5, 0, 1) *
 * 255) (round half to even, numpy's round) as uint8. */
void sd_image_to_u8(int64_t n, const float *x, uint8_t *out);

/* ---- A scheduler with its state, for one image at a time --------------------------------- */

typedef struct sd_sampler {
    sd_sampler_kind kind;
    sd_prediction prediction;
    int num_train_timesteps;
    const float *alphas_cumprod; /* [T], borrowed (sd_diffusion.alphas_cumprod) */
    /* abar[0] (set_alpha_to_one false, SD2) after init; set it to 1 for set_alpha_to_one */
    float final_alpha_cumprod;
    float clip_sample_range;     /* 0 after init (clip_sample false); DDIM and DDPM only */
    int num_steps;               /* N */
    int ratio;                   /* T / N */
    int n_timesteps;             /* model calls: N (PNDM: N + 1 when N > 1) */
    int64_t *timesteps;          /* [n_timesteps], in order of use */
    int64_t n;                   /* elements of one latent */
    /* PNDM state (PNDMScheduler.ets, cur_sample, counter) */
    float *ets[4];
    int n_ets;
    float *cur_sample, *tmp;
    int counter;
} sd_sampler;

/* Sets up `kind` for N steps over the schedule `d` (its prediction type and T),
 * with steps_offset (1 for SD) and latents of n elements. Returns 0, or -1 with a message. */
int sd_sampler_init(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d, int num_steps,
                    int steps_offset, int64_t n, sd_err *err);
void sd_sampler_free(sd_sampler *s);
/* Forgets the PNDM history: call before each new image (set_timesteps does it in diffusers). */
void sd_sampler_reset(sd_sampler *s);
/* scheduler.step(model_out, timesteps[i], sample) for the i-th model call (calls must come in
 * order i = 0, 1, ... after a reset). Updates sample in place. noise: the DDPM step's z
 * (n values) or NULL for the other schedulers. */
void sd_sampler_step(sd_sampler *s, int i, const float *model_out, float *sample,
                     const float *noise);

/* ---- Random numbers of sampling ------------------------------------------------------------
 * Image j of prompt p with seed s (rng.h streams; independent of ranks and threads):
 *   initial latents  purpose SD_SAMPLER_RNG_INIT, step = j, sample = p: normal element e
 *                    of the latent in C,H,W order (e = c*H*W + y*W + x), times
 *                    init_noise_sigma = 1;
 *   DDPM noise z_k   purpose SD_SAMPLER_RNG_DDPM, step = j, sample = p: normal elements
 *                    [k*C*H*W, (k+1)*C*H*W) for model call k, same C,H,W order. */
#define SD_SAMPLER_RNG_INIT SD_RNG_PURPOSE(SD_RNG_NOISE, 16)
#define SD_SAMPLER_RNG_DDPM SD_RNG_PURPOSE(SD_RNG_NOISE, 17)

/* Normals of one stream, elements [offset, offset + c*h*w) in C,H,W order, written
 * channels-last (out[(y*w + x)*c + ch]). Returns 0 or -1 beyond the RNG limits. */
int sd_sampler_normals_nhwc(uint64_t seed, uint32_t purpose, uint64_t image, uint64_t prompt,
                            uint64_t offset, int c, int h, int w, float *out, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
