/* The DDPM training side of diffusion: noise schedules, the forward process, training targets,
 * min-SNR weighting, the MSE loss and its gradient, and the per-sample random numbers. */
#ifndef SDTRAIN_DIFFUSION_H
#define SDTRAIN_DIFFUSION_H

/*
 * Numerics follow diffusers 0.42 / torch 2.x in fp32 (spec sections 5.2, 5.3, 6.1):
 *
 *   betas   'scaled_linear': torch.linspace(sqrt(beta_start), sqrt(beta_end), N, float32) ** 2
 *           'linear':        torch.linspace(beta_start, beta_end, N, float32)
 *           sqrt(beta_*) is taken in double (Python) and rounded to float by linspace.
 *           torch's CPU linspace kernel computes, with start, end rounded to float and
 *           step = (end - start) / (float)(N - 1) in float,
 *               element i < N/2:  start + step * i
 *               element i >= N/2: end - step * (N - 1 - i)
 *           and the AVX2/AVX512 builds of that kernel (what torch picks on any current x86
 *           CPU) are compiled with FMA contraction, so each element is ONE rounding of the
 *           exact a*b + c; the default (no-SIMD) build rounds the product and the sum
 *           separately. The two results differ in the last bit for ~15% of the elements.
 *           SD_LINSPACE_FUSED (the default here) reproduces the AVX2/AVX512 result,
 *           SD_LINSPACE_UNFUSED the ATEN_CPU_CAPABILITY=default one; both are checked bit for
 *           bit against torch dumps (tests/data/diffusion/goldens.safetensors).
 *           'squaredcos_cap_v2' (the Glide / improved-DDPM cosine schedule, betas_for_alpha_bar):
 *           beta_i = min(1 - f((i+1)/T) / f(i/T), 0.999) in double with f(t) =
 *           cos((t + 0.008) / 1.008 * pi / 2) ** 2, rounded to float (beta_start / beta_end
 *           unused).
 *   zero terminal SNR (rescale_betas_zero_snr, Lin et al. 2023, diffusers'
 *           rescale_zero_terminal_snr, all in float): s = sqrt(cumprod(1 - beta)); s -= s[T-1];
 *           s *= s[0] / (s[0] - s[T-1]) (the old s[0] and s[T-1]); abar' = s * s; alpha'_0 =
 *           abar'_0, alpha'_i = abar'_i / abar'_{i-1}; beta = 1 - alpha'. The schedule below is
 *           then built from these betas: abar_{T-1} = 0 exactly (x_{T-1} is pure noise), so
 *           it needs v_prediction (an epsilon model cannot recover x0 there).
 *   alphas  1 - beta (float)
 *   abar    torch.cumprod on CPU accumulates a float tensor in DOUBLE (acc_type<float> is
 *           double on the CPU) and rounds each partial product to float: abar_t =
 *           (float)(prod_{i<=t} (double)alpha_i). (A float running product differs.)
 *   sqrt(abar_t), sqrt(1 - abar_t): gathered from the float abar, then sqrtf (torch's
 *           `** 0.5` is sqrt), 1 - abar in float first.
 *   add_noise  x_t = sa * x0 + sb * eps    (two float products, then a float sum)
 *   v target   v   = sa * eps - sb * x0
 *   SNR        diffusers.training_utils.compute_snr: (sa / sb) ** 2 in float, i.e.
 *              q = sa / sb; snr = q * q (not abar / (1 - abar), which differs in the ulps).
 *   min-SNR-g  w = min(snr, (float)g) / snr (epsilon), / (snr + 1) (v_prediction).
 *   loss       mean_b( w_b * mean_{chw} (pred - target)^2 ) (w_b = 1 without min-SNR);
 *              the per-sample mean is accumulated in double here (torch sums in float with
 *              a cascade), so losses agree with torch to ~1e-7 relative, not bit for bit.
 * All float expressions are written so that each operation rounds once with no a*b+c left
 * for the compiler to contract (the build uses -std=c11, i.e. -ffp-contract=off, and the
 * goldens would catch a contracted build).
 *
 * Random numbers (include/sdtrain/rng.h): every per-sample random quantity is a pure function
 * of (seed, step, sample), where `step` is the optimizer step and `sample` is the sample's
 * GLOBAL index within that step (e.g. its position in the global batch, the same on every
 * rank layout; with gradient accumulation, number the samples of all micro-batches of the
 * step consecutively). Streams, all with site 0 unless said otherwise:
 *
 *   timestep     SD_RNG_TIMESTEP site 0, bounded draw 0: t = sd_rng_below(.., n = T)
 *   noise eps    SD_RNG_NOISE    site 0, normal element e of the sample's latent in C,H,W
 *                order (e = c*H*W + y*W + x), so any slice [k, k+m) is filled alone
 *   noise offset SD_RNG_NOISE    site 1, normal element c (one per channel); eps[c,..] +=
 *                noise_offset * n_c (diffusers: noise += offset * randn(B, C, 1, 1))
 *   perturbation SD_RNG_NOISE    site 2, normal element e (C,H,W order): the model's input is
 *                add_noise(x0, eps + input_perturbation * n_e), the target still eps's
 *                (diffusers' train_text_to_image.py --input_perturbation; training steps only)
 *   latent       SD_RNG_LATENT   site 0, normal element e (C,H,W order of the latent):
 *                z = scale * (mean + exp(0.5 * clamp(logvar, -30, 20)) * eta)
 *   caption drop SD_RNG_CAPTION_DROP site 0, uniform element 0: dropped iff u < p
 *                (u in [0,1) on a 2^-24 grid, so p = 0 never drops and p = 1 always does)
 * The GPU can compute every one of these with the inline functions of rng.h (normals agree
 * with the CPU to a few ulp, timesteps/uniforms/decisions exactly).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sd_config;

typedef enum { SD_PRED_EPSILON = 0, SD_PRED_V = 1 } sd_prediction;
typedef enum {
    SD_BETAS_SCALED_LINEAR = 0,
    SD_BETAS_LINEAR = 1,
    SD_BETAS_SQUAREDCOS_CAP_V2 = 2
} sd_beta_schedule;
typedef enum { SD_LINSPACE_FUSED = 0, SD_LINSPACE_UNFUSED = 1 } sd_linspace_kind;

/* Upper bound on num_train_timesteps (a sanity limit, not a property of the method). */
#define SD_DIFFUSION_MAX_TIMESTEPS 100000

typedef struct sd_diffusion {
    int num_train_timesteps;     /* T */
    sd_prediction prediction;
    sd_beta_schedule schedule;
    float *betas;                /* [T] */
    float *alphas_cumprod;       /* [T] abar */
    float *sqrt_abar;            /* [T] sqrtf(abar) */
    float *sqrt_one_minus_abar;  /* [T] sqrtf(1 - abar) */
    float *snr;                  /* [T] compute_snr */
    int zero_snr;                /* rescaled to zero terminal SNR (sd_diffusion_rescale_zero_snr) */
    double min_snr_gamma;        /* <= 0: no min-SNR weighting */
    double noise_offset;         /* 0: off */
    double input_perturbation;   /* 0: off */
    double caption_dropout;      /* probability in [0, 1] */
    float latent_scale;          /* 0.18215 */
} sd_diffusion;

/* torch.linspace(start, end, n, dtype=float32) on the CPU (see the top of this file). n >= 1;
 * n = 1 gives start. */
void sd_linspace_f32(double start, double end, int64_t n, sd_linspace_kind kind, float *out);

/* The smallest alphas_cumprod a schedule may reach (sigma_max 1e10): the cosine schedule at
 * T = 100000 reaches 2.4e-13, SD's 0.0047; beta_end near 1 underflows to 0. */
#define SD_DIFFUSION_MIN_ABAR 1e-20

/* Builds the schedule. `schedule` is "scaled_linear", "linear" or "squaredcos_cap_v2"
 * (case-insensitive),
 * `prediction` "epsilon" or "v_prediction". T in [1, SD_DIFFUSION_MAX_TIMESTEPS], 0 <
 * beta_start <= beta_end < 1, alphas_cumprod below 1 at t = 0 (fp32) and at least
 * SD_DIFFUSION_MIN_ABAR at T - 1. Sets min_snr_gamma = noise_offset = caption_dropout = 0 and
 * latent_scale = 0.18215 (change the fields afterwards). Returns 0, or -1 with a message (and
 * *d zeroed, needing no free). */
int sd_diffusion_init(sd_diffusion *d, const char *schedule, double beta_start, double beta_end,
                      int64_t num_train_timesteps, const char *prediction, sd_linspace_kind kind,
                      sd_err *err);
/* Rescales a built schedule to zero terminal SNR in place (betas, alphas_cumprod and the
 * tables from them; sets d->zero_snr). Needs T >= 2. Returns 0, or -1 with a message (d
 * untouched). */
int sd_diffusion_rescale_zero_snr(sd_diffusion *d, sd_err *err);
/* The same from the &diffusion group of a configuration (fused linspace), including
 * rescale_betas_zero_snr (refused with prediction_type 'epsilon'), min_snr_gamma, noise_offset
 * and caption_dropout. */
int sd_diffusion_init_config(sd_diffusion *d, const struct sd_config *cfg, sd_err *err);
void sd_diffusion_free(sd_diffusion *d);

/* ---- Per-sample random numbers (pure functions of seed, step, global sample index) ------- */

/* Timestep of a sample, in [0, T). */
uint32_t sd_diffusion_timestep(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample);

/* Whether the sample's caption is replaced by the empty caption (caption_dropout). */
bool sd_diffusion_drop_caption(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample);

/* Elements [offset, offset + n) of the sample's noise eps, a C x HW latent in C,H,W order
 * (`hw` = H*W), noise offset included. offset + n <= C * hw. Returns 0, or -1 when the
 * range is out of the latent or beyond the RNG limits (out untouched). */
int sd_diffusion_noise(const sd_diffusion *d, uint64_t seed, uint64_t step, uint64_t sample,
                       int64_t channels, int64_t hw, uint64_t offset, float *out, size_t n,
                       sd_err *err);

/* Elements [offset, offset + n) of the input-perturbed noise of a sample: out = eps +
 * (float)input_perturbation * n_e, eps the sample's noise (sd_diffusion_noise, passed in: out
 * may alias it). A C x HW latent; offset + n <= C * hw. Returns 0, or -1 beyond the latent or
 * the RNG limits. */
int sd_diffusion_perturb_noise(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample, int64_t channels, int64_t hw, uint64_t offset,
                               const float *eps, float *out, size_t n, sd_err *err);

/* Elements [offset, offset + n) of the scaled posterior sample of a sample's latent:
 * out[i] = scale * (mean[i] + expf(0.5f * clamp(logvar[i], -30, 20)) * eta_{offset+i}),
 * where mean/logvar/out hold those n elements (the VAE moments are [2C, H, W]: the first C
 * channels are the mean, the last C the log-variance). `scale` = d->latent_scale normally.
 * Returns 0, or -1 beyond the RNG limits. */
int sd_diffusion_sample_latent(uint64_t seed, uint64_t step, uint64_t sample, float scale,
                               const float *mean, const float *logvar, uint64_t offset,
                               float *out, size_t n, sd_err *err);

/* The random numbers of samples [first, first + count) at one step: timesteps[count] and,
 * when not NULL, drop[count] (1 = drop the caption) and noise[count * C * hw]. Filling
 * [0, 8) equals filling [0, 4) and [4, 8), whatever rank does it. Returns 0 or -1. */
int sd_diffusion_batch_randoms(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t first, int64_t count, int64_t channels, int64_t hw,
                               int32_t *timesteps, unsigned char *drop, float *noise,
                               sd_err *err);

/* ---- Forward process, targets, loss ------------------------------------------------------
 * Batched arrays are [B, per] with per = C*H*W; t[b] must be in [0, T) (checked: a bad
 * timestep ends the job, it is a programming error). */

/* x_t = sqrt(abar_t) * x0 + sqrt(1 - abar_t) * eps. xt may alias x0 or eps. */
void sd_diffusion_add_noise(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                            const float *x0, const float *eps, float *xt);
/* v = sqrt(abar_t) * eps - sqrt(1 - abar_t) * x0 (diffusers get_velocity). */
void sd_diffusion_velocity(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                           const float *x0, const float *eps, float *v);
/* The training target for d->prediction: eps (copied) or v. */
void sd_diffusion_target(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                         const float *x0, const float *eps, float *target);

/* Per-sample loss weights w[b]: 1 without min-SNR (min_snr_gamma <= 0), else
 * min(snr, gamma) / snr (epsilon) or min(snr, gamma) / (snr + 1) (v_prediction). */
void sd_diffusion_loss_weights(const sd_diffusion *d, const int32_t *t, int64_t batch, float *w);

/* The loss contribution of a (local) batch:
 *     L = sum_b w_b * mse_b / batch_global,   mse_b = mean over per of (pred - target)^2,
 * so that summing L over the ranks of a step (whose batches add up to batch_global samples)
 * gives diffusers' loss. batch_global = 0 means `batch`. Optional outputs: mse[batch] (the
 * unweighted per-sample MSE, float), grad[batch * per] = dL/dpred = 2 w_b (pred - target) /
 * (per * batch_global), computed in float as diffusers' autograd does up to rounding. Returns
 * L (accumulated in double). */
double sd_diffusion_loss(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                         int64_t batch_global, const float *pred, const float *target,
                         float *mse, float *grad);

/* The same loss in two halves, for a backend that computes the per-sample MSE and the gradient
 * itself (sd_mse_loss): coef[b] = w_b / batch_global / per, in sd_diffusion_loss's float
 * steps, so that coef[b] * 2 (pred - target) is its grad bit for bit; and L from mse[batch] as
 * sd_diffusion_loss sums it. batch_global = 0 means `batch`. */
void sd_diffusion_loss_coef(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                            int64_t batch_global, float *coef);
double sd_diffusion_loss_from_mse(const sd_diffusion *d, const int32_t *t, int64_t batch,
                                  int64_t batch_global, const float *mse);

#ifdef __cplusplus
}
#endif
#endif
