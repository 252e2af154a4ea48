/* DDPM schedules, forward process, targets, min-SNR weights, MSE loss (see diffusion.h). */
#include "sdtrain/diffusion.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/rng.h"

/* a*b + c rounded once (fused) or twice (unfused). fmaf is exact in glibc with or without a
 * hardware FMA. The unfused product is stored in a variable first; with -ffp-contract=off
 * (implied by -std=c11) the compiler keeps the two roundings. */
static float mul_add(float a, float b, float c, sd_linspace_kind kind)
{
    if (kind == SD_LINSPACE_FUSED)
        return fmaf(a, b, c);
    float p = a * b;
    return p + c;
}

void sd_linspace_f32(double start, double end, int64_t n, sd_linspace_kind kind, float *out)
{
    float s = (float)start, e = (float)end;
    if (n <= 0)
        return;
    if (n == 1) {
        out[0] = s;
        return;
    }
    float step = (e - s) / (float)(n - 1);
    int64_t half = n / 2;
    for (int64_t i = 0; i < n; i++) {
        if (i < half)
            out[i] = mul_add(step, (float)i, s, kind);
        else
            out[i] = mul_add(-step, (float)(n - 1 - i), e, kind);
    }
}

void sd_diffusion_free(sd_diffusion *d)
{
    if (!d)
        return;
    free(d->betas);
    free(d->alphas_cumprod);
    free(d->sqrt_abar);
    free(d->sqrt_one_minus_abar);
    free(d->snr);
    memset(d, 0, sizeof *d);
}

/* betas -> alphas_cumprod (torch CPU cumprod: double accumulator, float results) and the tables
 * from it. */
static void tables_from_betas(sd_diffusion *d)
{
    const int T = d->num_train_timesteps;
    double acc = 1.0;
    for (int i = 0; i < T; i++) {
        float alpha = 1.0f - d->betas[i];
        acc *= (double)alpha;
        d->alphas_cumprod[i] = (float)acc;
    }
    for (int i = 0; i < T; i++) {
        float a = d->alphas_cumprod[i];
        d->sqrt_abar[i] = sqrtf(a);
        d->sqrt_one_minus_abar[i] = sqrtf(1.0f - a);
        float q = d->sqrt_abar[i] / d->sqrt_one_minus_abar[i];
        d->snr[i] = q * q;
    }
}

/* diffusers' betas_for_alpha_bar(T) with the cosine transform and max_beta 0.999, in double as
 * Python computes it (math.cos, i / T true division), then float32. */
static double cos_alpha_bar(double t)
{
    const double pi = 3.141592653589793; /* math.pi */
    const double c = cos((t + 0.008) / 1.008 * pi / 2);
    return c * c;
}

int sd_diffusion_init(sd_diffusion *d, const char *schedule, double beta_start, double beta_end,
                      int64_t num_train_timesteps, const char *prediction, sd_linspace_kind kind,
                      sd_err *err)
{
    memset(d, 0, sizeof *d);
    if (!schedule || (strcasecmp(schedule, "scaled_linear") != 0 &&
                      strcasecmp(schedule, "linear") != 0 &&
                      strcasecmp(schedule, "squaredcos_cap_v2") != 0))
        return sd_err_set(err, "diffusion: unknown beta_schedule '%s' (scaled_linear | linear | "
                               "squaredcos_cap_v2)", schedule ? schedule : "(null)");
    if (!prediction ||
        (strcasecmp(prediction, "epsilon") != 0 && strcasecmp(prediction, "v_prediction") != 0))
        return sd_err_set(err, "diffusion: unknown prediction_type '%s' (epsilon | v_prediction)",
                          prediction ? prediction : "(null)");
    if (num_train_timesteps < 1 || num_train_timesteps > SD_DIFFUSION_MAX_TIMESTEPS)
        return sd_err_set(err, "diffusion: num_train_timesteps %lld out of [1, %d]",
                          (long long)num_train_timesteps, SD_DIFFUSION_MAX_TIMESTEPS);
    if (strcasecmp(schedule, "squaredcos_cap_v2") != 0 && /* uses neither end */
        !(beta_start > 0.0 && beta_start <= beta_end && beta_end < 1.0))
        return sd_err_set(err, "diffusion: need 0 < beta_start (%g) <= beta_end (%g) < 1",
                          beta_start, beta_end);
    int T = (int)num_train_timesteps;
    d->num_train_timesteps = T;
    d->schedule = strcasecmp(schedule, "linear") == 0          ? SD_BETAS_LINEAR
                  : strcasecmp(schedule, "scaled_linear") == 0 ? SD_BETAS_SCALED_LINEAR
                                                               : SD_BETAS_SQUAREDCOS_CAP_V2;
    d->prediction = strcasecmp(prediction, "epsilon") == 0 ? SD_PRED_EPSILON : SD_PRED_V;
    d->latent_scale = 0.18215f;
    d->betas = sd_xmalloc((size_t)T * sizeof(float));
    d->alphas_cumprod = sd_xmalloc((size_t)T * sizeof(float));
    d->sqrt_abar = sd_xmalloc((size_t)T * sizeof(float));
    d->sqrt_one_minus_abar = sd_xmalloc((size_t)T * sizeof(float));
    d->snr = sd_xmalloc((size_t)T * sizeof(float));

    if (d->schedule == SD_BETAS_LINEAR) {
        sd_linspace_f32(beta_start, beta_end, T, kind, d->betas);
    } else if (d->schedule == SD_BETAS_SCALED_LINEAR) {
        /* Python: beta_start**0.5 in double, then torch.linspace(..., float32) ** 2 (x*x) */
        sd_linspace_f32(sqrt(beta_start), sqrt(beta_end), T, kind, d->betas);
        for (int i = 0; i < T; i++)
            d->betas[i] = d->betas[i] * d->betas[i];
    } else {
        for (int i = 0; i < T; i++) {
            const double t1 = (double)i / (double)T, t2 = (double)(i + 1) / (double)T;
            const double b = 1.0 - cos_alpha_bar(t2) / cos_alpha_bar(t1);
            d->betas[i] = (float)(b < 0.999 ? b : 0.999);
        }
    }
    tables_from_betas(d);
    /* Samplers start from sigma_max = sqrt((1 - abar) / abar) of the last timestep; their fp32
     * arithmetic (sigma^2 + 1, the first steps' x0) overflows long before abar underflows. */
    /* 1 - beta rounding to 1 makes a noise level of 0, which DDIM's variance (0 / 0), the
     * sigma samplers' log-sigmas and the SNR divide by (diffusers too gives NaN there) */
    if (!(d->alphas_cumprod[0] < 1.0f)) {
        const double b0 = d->betas[0];
        sd_diffusion_free(d);
        return sd_err_set(err, "diffusion: beta_start %g is too small: the first beta (%g in "
                               "fp32) leaves alphas_cumprod at 1, a noise level of 0",
                          beta_start, b0);
    }
    if (!(d->alphas_cumprod[T - 1] >= SD_DIFFUSION_MIN_ABAR)) {
        const double last = d->alphas_cumprod[T - 1];
        sd_diffusion_free(d);
        return sd_err_set(err, "diffusion: the schedule's alphas_cumprod falls to %g at the last "
                               "timestep (below %g, the noise level would overflow in sampling): "
                               "lower beta_end or num_train_timesteps", last,
                          SD_DIFFUSION_MIN_ABAR);
    }
    return 0;
}

int sd_diffusion_rescale_zero_snr(sd_diffusion *d, sd_err *err)
{
    const int T = d->num_train_timesteps;
    if (T < 2)
        return sd_err_set(err, "diffusion: rescale_betas_zero_snr needs num_train_timesteps >= 2 "
                               "(has %d)", T);
    float *s = sd_xmalloc((size_t)T * sizeof *s), *betas = sd_xmalloc((size_t)T * sizeof *betas);
    for (int i = 0; i < T; i++)
        s[i] = sqrtf(d->alphas_cumprod[i]);
    const float s0 = s[0], sT = s[T - 1], span = s0 - sT, scale = s0 / span;
    int ok = span > 0.0f;
    for (int i = 0; i < T; i++) {
        const float shifted = s[i] - sT, scaled = shifted * scale;
        s[i] = scaled * scaled; /* abar' */
    }
    for (int i = 0; i < T && ok; i++) {
        float alpha = s[i];
        if (i > 0) {
            ok = s[i - 1] > 0.0f;
            alpha = s[i] / s[i - 1];
        }
        betas[i] = 1.0f - alpha;
        ok = ok && isfinite(betas[i]);
    }
    free(s);
    if (!ok) {
        free(betas);
        return sd_err_set(err, "diffusion: this schedule cannot be rescaled to zero terminal SNR "
                               "(its cumulative alphas do not decrease)");
    }
    memcpy(d->betas, betas, (size_t)T * sizeof *betas);
    free(betas);
    tables_from_betas(d);
    d->zero_snr = 1;
    return 0;
}

int sd_diffusion_init_config(sd_diffusion *d, const struct sd_config *cfg, sd_err *err)
{
    if (sd_diffusion_init(d, cfg->diffusion.beta_schedule, cfg->diffusion.beta_start,
                          cfg->diffusion.beta_end, cfg->diffusion.num_train_timesteps,
                          cfg->diffusion.prediction_type, SD_LINSPACE_FUSED, err) != 0)
        return -1;
    if (cfg->diffusion.rescale_betas_zero_snr) {
        if (d->prediction == SD_PRED_EPSILON) {
            sd_diffusion_free(d);
            return sd_err_set(err, "diffusion: rescale_betas_zero_snr needs prediction_type = "
                                   "'v_prediction' (at zero SNR the last timestep's input is "
                                   "pure noise, from which an epsilon prediction gives no x0)");
        }
        if (sd_diffusion_rescale_zero_snr(d, err) != 0) {
            sd_diffusion_free(d);
            return -1;
        }
    }
    if (!(cfg->diffusion.caption_dropout >= 0.0 && cfg->diffusion.caption_dropout <= 1.0)) {
        sd_diffusion_free(d);
        return sd_err_set(err, "diffusion: caption_dropout %g out of [0, 1]",
                          cfg->diffusion.caption_dropout);
    }
    d->min_snr_gamma = cfg->diffusion.min_snr_gamma;
    d->noise_offset = cfg->diffusion.noise_offset;
    d->input_perturbation = cfg->diffusion.input_perturbation;
    d->caption_dropout = cfg->diffusion.caption_dropout;
    return 0;
}

/* ---- Random numbers --------------------------------------------------------------------- */

#define PURPOSE_TIMESTEP SD_RNG_PURPOSE(SD_RNG_TIMESTEP, 0)
#define PURPOSE_NOISE SD_RNG_PURPOSE(SD_RNG_NOISE, 0)
#define PURPOSE_NOISE_OFFSET SD_RNG_PURPOSE(SD_RNG_NOISE, 1)
#define PURPOSE_PERTURB SD_RNG_PURPOSE(SD_RNG_NOISE, 2)
#define PURPOSE_LATENT SD_RNG_PURPOSE(SD_RNG_LATENT, 0)
#define PURPOSE_CAPTION SD_RNG_PURPOSE(SD_RNG_CAPTION_DROP, 0)

uint32_t sd_diffusion_timestep(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample)
{
    return sd_rng_below(seed, PURPOSE_TIMESTEP, step, sample, 0,
                        (uint32_t)d->num_train_timesteps);
}

bool sd_diffusion_drop_caption(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample)
{
    if (!(d->caption_dropout > 0.0))
        return false;
    float u = sd_rng_uniform_float(seed, PURPOSE_CAPTION, step, sample, 0);
    return (double)u < d->caption_dropout;
}

int sd_diffusion_noise(const sd_diffusion *d, uint64_t seed, uint64_t step, uint64_t sample,
                       int64_t channels, int64_t hw, uint64_t offset, float *out, size_t n,
                       sd_err *err)
{
    if (channels < 1 || hw < 1 || offset > (uint64_t)(channels * hw) ||
        n > (uint64_t)(channels * hw) - offset)
        return sd_err_set(err, "diffusion noise: elements [%llu, %llu) outside a %lld x %lld latent",
                          (unsigned long long)offset, (unsigned long long)(offset + n),
                          (long long)channels, (long long)hw);
    if (sd_rng_check(PURPOSE_NOISE, step, sample, offset + n, err) != 0)
        return -1;
    if (sd_rng_fill_normal_at(seed, PURPOSE_NOISE, step, sample, offset, out, n) != 0)
        return sd_err_set(err, "diffusion noise: RNG fill failed");
    if (d->noise_offset != 0.0 && n > 0) {
        float off = (float)d->noise_offset;
        int64_t c0 = (int64_t)(offset / (uint64_t)hw);
        int64_t c1 = (int64_t)((offset + n - 1) / (uint64_t)hw);
        float nc[1];
        for (int64_t c = c0; c <= c1; c++) {
            if (sd_rng_fill_normal_at(seed, PURPOSE_NOISE_OFFSET, step, sample, (uint64_t)c, nc,
                                      1) != 0)
                return sd_err_set(err, "diffusion noise offset: RNG fill failed");
            float add = off * nc[0];
            uint64_t b = (uint64_t)c * (uint64_t)hw, e = b + (uint64_t)hw;
            if (b < offset)
                b = offset;
            if (e > offset + n)
                e = offset + n;
            for (uint64_t k = b; k < e; k++)
                out[k - offset] = out[k - offset] + add;
        }
    }
    return 0;
}

int sd_diffusion_perturb_noise(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t sample, int64_t channels, int64_t hw, uint64_t offset,
                               const float *eps, float *out, size_t n, sd_err *err)
{
    if (channels < 1 || hw < 1 || offset > (uint64_t)(channels * hw) ||
        n > (uint64_t)(channels * hw) - offset)
        return sd_err_set(err, "input perturbation: elements [%llu, %llu) outside a %lld x %lld "
                               "latent", (unsigned long long)offset,
                          (unsigned long long)(offset + n), (long long)channels, (long long)hw);
    if (sd_rng_check(PURPOSE_PERTURB, step, sample, offset + n, err) != 0)
        return -1;
    const float p = (float)d->input_perturbation;
    float z[256];
    for (size_t k = 0; k < n; k += 256) { /* in blocks: any slice is filled alone */
        const size_t m = n - k < 256 ? n - k : 256;
        if (sd_rng_fill_normal_at(seed, PURPOSE_PERTURB, step, sample, offset + k, z, m) != 0)
            return sd_err_set(err, "input perturbation: RNG fill failed");
        for (size_t i = 0; i < m; i++) {
            const float add = p * z[i]; /* noise + (p * randn_like(noise)) */
            out[k + i] = eps[k + i] + add;
        }
    }
    return 0;
}

int sd_diffusion_sample_latent(uint64_t seed, uint64_t step, uint64_t sample, float scale,
                               const float *mean, const float *logvar, uint64_t offset,
                               float *out, size_t n, sd_err *err)
{
    if (sd_rng_check(PURPOSE_LATENT, step, sample, offset + n, err) != 0)
        return -1;
    float eta[256];
    for (size_t done = 0; done < n;) {
        size_t m = n - done < 256 ? n - done : 256;
        if (sd_rng_fill_normal_at(seed, PURPOSE_LATENT, step, sample, offset + done, eta, m) != 0)
            return sd_err_set(err, "diffusion latent: RNG fill failed");
        for (size_t i = 0; i < m; i++) {
            float lv = logvar[done + i];
            lv = lv < -30.0f ? -30.0f : (lv > 20.0f ? 20.0f : lv);
            float sd = expf(0.5f * lv);
            float noise = sd * eta[i];
            float z = mean[done + i] + noise;
            out[done + i] = z * scale;
        }
        done += m;
    }
    return 0;
}

int sd_diffusion_batch_randoms(const sd_diffusion *d, uint64_t seed, uint64_t step,
                               uint64_t first, int64_t count, int64_t channels, int64_t hw,
                               int32_t *timesteps, unsigned char *drop, float *noise,
                               sd_err *err)
{
    if (count < 0)
        return sd_err_set(err, "diffusion: negative sample count %lld", (long long)count);
    if (count > 0 && sd_rng_check(PURPOSE_TIMESTEP, step, first + (uint64_t)count - 1, 0, err) != 0)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        uint64_t s = first + (uint64_t)i;
        timesteps[i] = (int32_t)sd_diffusion_timestep(d, seed, step, s);
        if (drop)
            drop[i] = sd_diffusion_drop_caption(d, seed, step, s) ? 1 : 0;
        if (noise && sd_diffusion_noise(d, seed, step, s, channels, hw, 0,
                                        noise + (size_t)i * (size_t)(channels * hw),
                                        (size_t)(channels * hw), err) != 0)
            return -1;
    }
    return 0;
}

/* ---- Forward process, targets, loss ------------------------------------------------------ */

static int32_t checked_t(const sd_diffusion *d, const int32_t *t, int64_t b)
{
    SD_CHECK(t[b] >= 0 && t[b] < d->num_train_timesteps, "timestep %d of sample %lld not in [0, %d)",
             (int)t[b], (long long)b, d->num_train_timesteps);
    return t[b];
}

void sd_diffusion_add_noise(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                            const float *x0, const float *eps, float *xt)
{
    for (int64_t b = 0; b < batch; b++) {
        int32_t tb = checked_t(d, t, b);
        float sa = d->sqrt_abar[tb], sb = d->sqrt_one_minus_abar[tb];
        size_t o = (size_t)b * (size_t)per;
        for (int64_t i = 0; i < per; i++) {
            float p = sa * x0[o + i];
            float q = sb * eps[o + i];
            xt[o + i] = p + q;
        }
    }
}

void sd_diffusion_velocity(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                           const float *x0, const float *eps, float *v)
{
    for (int64_t b = 0; b < batch; b++) {
        int32_t tb = checked_t(d, t, b);
        float sa = d->sqrt_abar[tb], sb = d->sqrt_one_minus_abar[tb];
        size_t o = (size_t)b * (size_t)per;
        for (int64_t i = 0; i < per; i++) {
            float p = sa * eps[o + i];
            float q = sb * x0[o + i];
            v[o + i] = p - q;
        }
    }
}

void sd_diffusion_target(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                         const float *x0, const float *eps, float *target)
{
    if (d->prediction == SD_PRED_V) {
        sd_diffusion_velocity(d, t, batch, per, x0, eps, target);
    } else {
        for (int64_t b = 0; b < batch; b++)
            (void)checked_t(d, t, b);
        if (target != eps)
            memmove(target, eps, (size_t)batch * (size_t)per * sizeof(float));
    }
}

void sd_diffusion_loss_weights(const sd_diffusion *d, const int32_t *t, int64_t batch, float *w)
{
    for (int64_t b = 0; b < batch; b++) {
        int32_t tb = checked_t(d, t, b);
        if (!(d->min_snr_gamma > 0.0)) {
            w[b] = 1.0f;
            continue;
        }
        float snr = d->snr[tb];
        float g = (float)d->min_snr_gamma;
        float m = snr < g ? snr : g; /* torch.min of the stacked pair */
        w[b] = d->prediction == SD_PRED_V ? m / (snr + 1.0f) : m / snr;
    }
}

/* w_b / batch_global / per in float, as torch's backward scales: 1/B (the batch mean) times
 * w_b, over per (the mean over C, H, W). */
static float grad_coef(float w, int64_t per, int64_t batch_global)
{
    float g = (1.0f / (float)batch_global) * w;
    return g / (float)per;
}

double sd_diffusion_loss(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                         int64_t batch_global, const float *pred, const float *target,
                         float *mse, float *grad)
{
    if (batch_global <= 0)
        batch_global = batch;
    double total = 0.0;
    for (int64_t b = 0; b < batch; b++) {
        float w;
        sd_diffusion_loss_weights(d, t + b, 1, &w);
        size_t o = (size_t)b * (size_t)per;
        double sum = 0.0;
        for (int64_t i = 0; i < per; i++) {
            double e = (double)pred[o + i] - (double)target[o + i];
            sum += e * e;
        }
        float m = (float)(sum / (double)per);
        if (mse)
            mse[b] = m;
        total += (double)(m * w);
        if (grad) {
            /* then mse_loss_backward's 2 * (pred - target) * grad */
            float g = grad_coef(w, per, batch_global);
            for (int64_t i = 0; i < per; i++) {
                float diff = pred[o + i] - target[o + i];
                float two = 2.0f * diff;
                grad[o + i] = two * g;
            }
        }
    }
    return total / (double)batch_global;
}

void sd_diffusion_loss_coef(const sd_diffusion *d, const int32_t *t, int64_t batch, int64_t per,
                            int64_t batch_global, float *coef)
{
    if (batch_global <= 0)
        batch_global = batch;
    for (int64_t b = 0; b < batch; b++) {
        float w;
        sd_diffusion_loss_weights(d, t + b, 1, &w);
        coef[b] = grad_coef(w, per, batch_global);
    }
}

double sd_diffusion_loss_from_mse(const sd_diffusion *d, const int32_t *t, int64_t batch,
                                  int64_t batch_global, const float *mse)
{
    double total = 0.0;
    if (batch_global <= 0)
        batch_global = batch;
    for (int64_t b = 0; b < batch; b++) {
        float w;
        sd_diffusion_loss_weights(d, t + b, 1, &w);
        total += (double)(mse[b] * w);
    }
    return total / (double)batch_global;
}
