/* Inference noise schedulers (DDIM, PNDM/PLMS, DDPM ancestral, Euler, Euler ancestral, Heun,
 * LMS, DPM2 and DPM2 ancestral, DPM-Solver++ 2M / 3M and SDE, DPM++ SDE, UniPC) over host fp32
 * arrays, as diffusers' StableDiffusionPipeline drives them. */
#ifndef SDTRAIN_SAMPLER_H
#define SDTRAIN_SAMPLER_H
/*
 * Numerics follow diffusers 0.42.1 in fp32 (doc/sampling.md; spec §5.4-5.8), checked against
 * tests/data/sample/goldens.safetensors and schedulers.safetensors:
 *
 *   timesteps  set_timesteps(N) with the three spacings of diffusers (Table 2 of "Common
 *              Diffusion Noise Schedules and Sample Steps are Flawed"):
 *                leading   ratio = T / N (integer division), t_i = (N-1-i) * ratio + offset;
 *                trailing  round(arange(T, 0, -T/N)) - 1 (numpy's float arange, its length
 *                          and element arithmetic reproduced: some N give N + 1 values, the
 *                          last -1, which is refused);
 *                linspace  round(linspace(0, T - 1, N)) reversed (Euler, Heun: not rounded).
 *              DPM-Solver++ spaces N + 1 points and drops the last. PNDM with skip_prk_steps
 *              repeats the second timestep: N + 1 model calls (N = 1: one); Heun every one but
 *              the first: 2 N - 1. Euler's and Heun's timesteps are fp32 values (fractional
 *              with linspace); the U-Net gets them as they are.
 *   sigmas     Euler, Euler ancestral, DPM-Solver++: sqrt((1 - abar) / abar) in fp32,
 *              numpy.interp (float64) at the timesteps, cast to fp32, then a final 0.
 *   schedule   alphas_cumprod of the training schedule (sd_diffusion, bit-exact with torch);
 *              final_alpha_cumprod = abar[0] (set_alpha_to_one false, SD2's config).
 *   arithmetic every scalar coefficient is a 0-d fp32 torch tensor in diffusers (abar[t],
 *              1 - abar, ** 0.5), every tensor op one fp32 rounding in the order diffusers
 *              writes it; nothing is computed in double. Python float constants (1/24, the
 *              guidance scale) are rounded to float first, as torch does. ** 0.5 is sqrtf
 *              (correctly rounded); torch's CPU sqrt (MKL) is one ulp off for ~15% of
 *              inputs, so results agree to ~1e-7 rather than bit for bit (doc/sampling.md).
 *   options    clip_sample (DDIM, DDPM: sd_sampler.clip_sample_range) and set_alpha_to_one
 *              (DDIM, PNDM: sd_sampler.final_alpha_cumprod = 1) are off by default, as in SD2's
 *              scheduler config; DDIM's eta (sd_sampler.eta); Karras, exponential and beta
 *              sigmas (sd_sampler_use_karras / _exponential / _beta); DPM-Solver++ and UniPC of
 *              orders 1-3; PNDM's Runge-Kutta warm-up (sd_sampler_pndm_prk); thresholding is
 *              not implemented.
 *
 * Stochastic steps take their noise from the caller (the `noise` argument of sd_sampler_step,
 * asked for by sd_sampler_step_noise), so the scheduler stays a pure function of its inputs:
 * DDPM for every t > 0 (the last step of 'leading' spacing has t = steps_offset = 1: variance
 * clamped to 1e-20), DDIM with eta > 0 and Euler ancestral at every step, DPM2 ancestral at
 * its second-order calls, DPM++ SDE at every call but the last (its second halves combine the
 * two calls' normals into one Brownian increment).
 */
#include <stddef.h>
#include <stdint.h>
#include "sdtrain/diffusion.h"
#include "sdtrain/error.h"
#include "sdtrain/rng.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    SD_SAMPLER_DDIM = 0,
    SD_SAMPLER_PNDM = 1,
    SD_SAMPLER_DDPM = 2,
    SD_SAMPLER_EULER = 3,    /* EulerDiscreteScheduler */
    SD_SAMPLER_EULER_A = 4,  /* EulerAncestralDiscreteScheduler */
    SD_SAMPLER_DPMPP_2M = 5, /* DPMSolverMultistepScheduler (dpmsolver++, order 2, midpoint) */
    SD_SAMPLER_DPMPP_2M_SDE = 6, /* the same with algorithm_type sde-dpmsolver++ */
    SD_SAMPLER_HEUN = 7,     /* HeunDiscreteScheduler: 2 N - 1 model calls */
    SD_SAMPLER_UNIPC = 8,    /* UniPCMultistepScheduler (predict_x0; bh2 or bh1; order 1-3) */
    SD_SAMPLER_LMS = 9,      /* LMSDiscreteScheduler (linear multistep of order 4) */
    SD_SAMPLER_DPM2 = 10,    /* KDPM2DiscreteScheduler (DPM-Solver-2): 2 N - 1 model calls */
    SD_SAMPLER_DPM2_A = 11,  /* KDPM2AncestralDiscreteScheduler: the same with noise */
    SD_SAMPLER_DPMPP_SDE = 12, /* DPMSolverSDEScheduler ("DPM++ SDE"): 2 N - 1 calls, Brownian
                                * noise at all but the last */
} sd_sampler_kind;
#define SD_SAMPLER_N_KINDS 13

typedef enum { SD_SPACING_LEADING = 0, SD_SPACING_TRAILING = 1, SD_SPACING_LINSPACE = 2 } sd_spacing;

/* "ddim", "pndm", "ddpm", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_sde", "heun", "unipc",
 * "lms", "dpm2", "dpm2_a", "dpmpp_sde" (case-insensitive) -> kind; -1 for anything else. */
int sd_sampler_kind_from_name(const char *name);
const char *sd_sampler_kind_name(sd_sampler_kind kind);
/* The diffusers class a kind reproduces ("DDIMScheduler", ...). */
const char *sd_sampler_class_name(sd_sampler_kind kind);
/* Whether that class has rescale_betas_zero_snr (ddim, ddpm, euler, euler_a, the two
 * DPM-Solver++, unipc); the others would sample the unrescaled schedule. */
int sd_sampler_takes_zero_snr(sd_sampler_kind kind);
/* "leading", "trailing", "linspace" -> spacing; -1 for anything else. */
int sd_spacing_from_name(const char *name);
const char *sd_spacing_name(sd_spacing spacing);
/* The spacing a diffusers class has by default: leading (DDIM, PNDM, DDPM) or linspace (Euler,
 * Euler ancestral, DPM-Solver++). */
sd_spacing sd_sampler_default_spacing(sd_sampler_kind kind);
/* Whether a scheduler takes Karras / exponential sigmas (euler, heun, lms, dpm2(_a),
 * dpmpp_2m(_sde), unipc), and final_sigmas_type 'sigma_min' (the same but heun, lms, dpm2(_a)). */
int sd_sampler_takes_sigma_schedule(sd_sampler_kind kind);
int sd_sampler_takes_final_sigma_min(sd_sampler_kind kind);

/* The timesteps a scheduler visits (scheduler.timesteps after set_timesteps(N)), at most
 * N + 1 values into out[] (Heun: 2 N - 1), integers but for Euler's and Heun's fp32 values.
 * Returns how many, or -1 with a message when N < 1, N > T, a timestep falls outside [0, T)
 * (e.g. N = T with steps_offset 1), or (Euler, Heun, DPM-Solver++, which find their first step
 * by the timestep) the first timestep repeats. */
int sd_sampler_timesteps(sd_sampler_kind kind, sd_spacing spacing, int num_steps,
                         int num_train_timesteps, int steps_offset, double *out, sd_err *err);

/* ---- One step, pure functions (out may alias sample; every array has n elements) -------- */

/* DDIMScheduler.step with eta = 0: t -> prev_t (prev_t < 0: final_alpha_cumprod). clip > 0
 * clamps the predicted x0 to [-clip, clip] (clip_sample with clip_sample_range); 0 = off. */
void sd_ddim_step(const float *alphas_cumprod, float final_alpha_cumprod, sd_prediction pred,
                  float clip, int64_t t, int64_t prev_t, int64_t n, const float *model_out,
                  const float *sample, float *out);
/* The same with eta (rounded to float): eta > 0 adds eta * sqrt(variance) * noise. */
void sd_ddim_step_eta(const float *alphas_cumprod, float final_alpha_cumprod,
                      sd_prediction pred, float clip, double eta, int64_t t, int64_t prev_t,
                      int64_t n, const float *model_out, const float *sample,
                      const float *noise, float *out);
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
/* The pipeline's guidance_rescale r (rescale_noise_cfg) for one image of n elements:
 * x = r * x * (std(cond) / std(x)) + (1 - r) * x, std the unbiased standard deviation over the
 * image (computed in double, rounded to float), r and 1 - r rounded to float. */
void sd_guidance_rescale(int64_t n, float *x, const float *cond, double r);
/* The pipeline's image post-processing: x in [-1, 1]-ish -> round(clamp(x*0.5 + 0.5, 0, 1) *
 * 255) (round half to even, numpy's round) as uint8. */
void sd_image_to_u8(int64_t n, const float *x, uint8_t *out);

/* ---- A scheduler with its state, for one image at a time --------------------------------- */

/* UniPC's disable_corrector holds step indices below this (more steps than sdtrain takes). */
#define SD_SAMPLER_MAX_DISABLE 1024

typedef struct sd_sampler {
    sd_sampler_kind kind;
    sd_prediction prediction;
    int num_train_timesteps;
    const float *alphas_cumprod; /* [T], borrowed (sd_diffusion.alphas_cumprod), or own_abar */
    float *own_abar;             /* zero terminal SNR, Euler / DPM / UniPC: abar with
                                  * abar[T-1] = 2^-24 (diffusers': the first sigma finite) */
    int karras_trunc;            /* DPM-Solver++ on 'squaredcos_cap_v2': Karras timesteps
                                  * truncated, not rounded (diffusers' int64 cast) */
    /* abar[0] (set_alpha_to_one false, SD2) after init; set it to 1 for set_alpha_to_one */
    float final_alpha_cumprod;
    float clip_sample_range;     /* 0 after init (clip_sample false); DDIM and DDPM only */
    double eta;                  /* 0 after init; DDIM only (the pipeline's eta) */
    sd_spacing spacing;
    int num_steps;               /* N */
    int ratio;                   /* T / N */
    int n_timesteps;             /* model calls: N (PNDM: N + 1 when N > 1) */
    int64_t *timesteps;          /* [n_timesteps], in order of use (Euler: rounded) */
    float *model_t;              /* [n_timesteps] the timestep the U-Net gets (Euler's fp32) */
    float *sigmas;               /* [n_timesteps + 1] Euler, Euler ancestral, DPM-Solver++;
                                  * DPM2: KDPM2's interleaved sigmas [n_timesteps + 3] */
    float *sigmas_interp;        /* DPM2: the interleaved log-midpoints [n_timesteps + 3];
                                  * DPM++ SDE: at odd calls i, the midpoint between sigmas[i - 1]
                                  * and sigmas[i] its second-order call scales its input by */
    float *sigmas_up, *sigmas_down; /* DPM2 ancestral: interleaved [n_timesteps + 3] */
    float init_noise_sigma;      /* the initial latents' scale: 1, or Euler's */
    const char *sigma_schedule;  /* "Karras", "exponential" or "beta" after sd_sampler_use_karras /
                                  * _exponential / _beta, else NULL (the spacing's sigmas) */
    float final_sigma;           /* the sigma after the last step: 0, or sigma_min */
    /* DPMSolverMultistepScheduler's (and UniPC's) options (set after init; the defaults are
     * diffusers') */
    int dpm_order;               /* solver_order: 1, 2 or 3 (DPM-Solver++; UniPC 1 or 2) (2) */
    int dpm_heun;                /* solver_type 'heun' rather than 'midpoint' (0) */
    int lower_order_final;       /* (1) */
    int euler_at_final;          /* (0) */
    int64_t n;                   /* elements of one latent */
    /* PNDM state (PNDMScheduler.ets, cur_sample, counter) */
    float *ets[4];
    int n_ets;
    float *cur_sample, *tmp;
    int counter;
    int n_prk;                   /* PNDM's Runge-Kutta warm-up calls (sd_sampler_pndm_prk), or 0 */
    float *prk_acc;              /* its weighted sum of the model outputs (cur_model_output) */
    /* DPM-Solver++ state: the previous step's x0 (model_outputs[-2]), lower_order_nums */
    float *x0_prev;
    int lower_order_nums;
    /* model_outputs[-3] of DPM-Solver++ of order 3 and [-2] of UniPC (x0_prev2); UniPC's
     * last_sample and this_order */
    float *x0_prev2, *last_sample;
    float *x0_prev3;             /* UniPC's model_outputs[-3] (order 3) */
    int unipc_bh1;               /* UniPC's solver_type 'bh1' (B(h) = h) rather than 'bh2' (0) */
    int unipc_eps;               /* UniPC's predict_x0 false: the noise-prediction form (0) */
    /* UniPC's disable_corrector: bit k set = no corrector at the step after step k */
    unsigned char unipc_nocorr[SD_SAMPLER_MAX_DISABLE / 8];
    int unipc_order;
    /* Heun state between its first- and second-order call: derivative, dt, sample */
    float *heun_der, *heun_sample;
    float heun_dt;
    float *sde_z;                /* DPM++ SDE: the noise of the first half of the step */
    /* LMS state: the last derivatives (x - x0) / sigma, newest last */
    float *lms_der[4];
    int n_lms_der;
} sd_sampler;

/* Sets up `kind` for N steps over the schedule `d` (its prediction type and T), with the
 * spacing, steps_offset (1 for SD) and latents of n elements. Returns 0, or -1 with a message
 * (as sd_sampler_timesteps). */
int sd_sampler_init(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d, int num_steps,
                    sd_spacing spacing, int steps_offset, int64_t n, sd_err *err);
/* use_karras_sigmas (euler, dpmpp_2m), after init: N sigmas on the Karras et al. ramp (rho 7)
 * between the spacing's smallest and largest sigma (Euler) or the schedule's (DPM-Solver++),
 * each timestep where log(sigma) interpolates in the schedule's log-sigmas (DPM-Solver++:
 * rounded). Returns 0, or -1 with a message for another scheduler or when the first timestep
 * would repeat. */
int sd_sampler_use_karras(sd_sampler *s, sd_err *err);
/* use_exponential_sigmas (the same schedulers): exp(linspace(log(sigma_max), log(sigma_min),
 * N)) with the same endpoints; DPM-Solver++ truncates the timesteps (diffusers' int64 cast). */
int sd_sampler_use_exponential(sd_sampler *s, sd_err *err);
/* use_beta_sigmas (the same schedulers; Lee et al. 2024, "Beta Sampling is All You Need"):
 * sigma_min + ppf_Beta(0.6, 0.6)(1 - linspace(0, 1, N)) (sigma_max - sigma_min), the quantile
 * computed in double to about 1e-15 (scipy.stats.beta.ppf in diffusers); timesteps as for
 * exponential sigmas. */
int sd_sampler_use_beta(sd_sampler *s, sd_err *err);
/* The beta distribution's quantile function (scipy.stats.beta.ppf): x with I_x(a, b) = p. */
double sd_beta_ppf(double p, double a, double b);
/* final_sigmas_type 'sigma_min' (euler, dpmpp_2m, dpmpp_2m_sde): the last step ends at the
 * schedule's smallest sigma instead of 0 (and DPM-Solver++ may then take it at second order).
 * Call after init (before or after sd_sampler_use_karras). */
int sd_sampler_final_sigma_min(sd_sampler *s, sd_err *err);
/* PNDM with skip_prk_steps false (PNDMScheduler's default): the Runge-Kutta warm-up first,
 * 4 model calls (at t, twice at the next base timestep + T // N // 2, at the next base timestep)
 * for each of the 3 steps between the 4 largest base timesteps, then the PLMS steps from the fourth
 * largest on: N + 9 calls. Call after init; -1 with a message for another scheduler, fewer than
 * 4 steps (diffusers fails there too) or a timestep outside [0, T). */
int sd_sampler_pndm_prk(sd_sampler *s, sd_err *err);
/* After the options (dpm_order, dpm_heun, lower_order_final, euler_at_final, unipc_*) are set:
 * refuses the combinations whose last step diffusers computes as NaN, with a message saying
 * which option to change. Returns 0 or -1. */
int sd_sampler_check_options(const sd_sampler *s, sd_err *err);
void sd_sampler_free(sd_sampler *s);
/* Forgets the PNDM / DPM-Solver history: call before each new image (set_timesteps does it in
 * diffusers). */
void sd_sampler_reset(sd_sampler *s);
/* scheduler.scale_model_input for model call i: out = x / sqrt(sigma_i^2 + 1) for Euler and
 * Euler ancestral, a copy otherwise (out may alias x). sd_sampler_scales_input says whether it
 * is more than a copy. */
void sd_sampler_scale_input(const sd_sampler *s, int i, int64_t n, const float *x, float *out);
int sd_sampler_scales_input(const sd_sampler *s);
/* Whether step i takes noise: DDPM with t > 0, DDIM with eta > 0, Euler ancestral,
 * DPM-Solver++ SDE. */
int sd_sampler_step_noise(const sd_sampler *s, int i);
/* scheduler.step(model_out, timesteps[i], sample) for the i-th model call (calls must come in
 * order i = 0, 1, ... after a reset). Updates sample in place. noise: n values where
 * sd_sampler_step_noise(s, i), else ignored (may be NULL). */
void sd_sampler_step(sd_sampler *s, int i, const float *model_out, float *sample,
                     const float *noise);

/* ---- Random numbers of sampling ------------------------------------------------------------
 * Image j of prompt p with seed s (rng.h streams; independent of ranks and threads):
 *   initial latents  purpose SD_SAMPLER_RNG_INIT, step = j, sample = p: normal element e
 *                    of the latent in C,H,W order (e = c*H*W + y*W + x), times the
 *                    sampler's init_noise_sigma;
 *   step noise z_k   purpose SD_SAMPLER_RNG_DDPM, step = j, sample = p: normal elements
 *                    [k*C*H*W, (k+1)*C*H*W) for model call k, same C,H,W order (DDPM,
 *                    DDIM with eta > 0, Euler ancestral). */
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
