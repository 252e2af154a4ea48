/* Inference schedulers: diffusers' DDIM (eta 0), PNDM (skip_prk_steps, i.e. PLMS) and DDPM
 * steps in fp32, in diffusers' order of operations (see include/sdtrain/sampler.h). */
#include "sdtrain/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/check.h"

int sd_sampler_kind_from_name(const char *name)
{
    if (!name)
        return -1;
    if (!strcasecmp(name, "ddim"))
        return SD_SAMPLER_DDIM;
    if (!strcasecmp(name, "pndm"))
        return SD_SAMPLER_PNDM;
    if (!strcasecmp(name, "ddpm"))
        return SD_SAMPLER_DDPM;
    return -1;
}

const char *sd_sampler_kind_name(sd_sampler_kind kind)
{
    switch (kind) {
    case SD_SAMPLER_DDIM:
        return "ddim";
    case SD_SAMPLER_PNDM:
        return "pndm";
    case SD_SAMPLER_DDPM:
        return "ddpm";
    }
    return "?";
}

int sd_sampler_timesteps(sd_sampler_kind kind, int num_steps, int num_train_timesteps,
                         int steps_offset, int64_t *out, sd_err *err)
{
    const int N = num_steps, T = num_train_timesteps;
    int n = 0;
    if (N < 1 || N > T)
        return sd_err_set(err, "sampler: %d inference steps for a schedule of %d training "
                               "timesteps (need 1 <= steps <= %d)", N, T, T);
    const int64_t ratio = T / N;
    if (kind == SD_SAMPLER_PNDM) {
        /* _timesteps = arange(N) * ratio + offset (ascending); plms = concat(_t[:-1],
         * _t[-2:-1], _t[-1:])[::-1]: the second-largest timestep twice. */
        out[n++] = (int64_t)(N - 1) * ratio + steps_offset;
        if (N > 1) {
            out[n++] = (int64_t)(N - 2) * ratio + steps_offset;
            for (int i = N - 2; i >= 0; i--)
                out[n++] = (int64_t)i * ratio + steps_offset;
        }
    } else {
        for (int i = N - 1; i >= 0; i--)
            out[n++] = (int64_t)i * ratio + steps_offset;
    }
    for (int i = 0; i < n; i++)
        if (out[i] < 0 || out[i] >= T)
            return sd_err_set(err, "sampler: %d steps with steps_offset %d give timestep %lld, "
                                   "outside the schedule's [0, %d): use fewer steps",
                              N, steps_offset, (long long)out[i], T);
    return n;
}

/* x0 and eps from the model output, as DDIM/DDPM write them. */
static inline void predict_x0_eps(sd_prediction pred, float sa, float sb, float mo, float x,
                                  float *x0, float *eps)
{
    if (pred == SD_PRED_V) {
        float p = sa * x, q = sb * mo;
        *x0 = p - q;
        if (eps) {
            float r = sa * mo, s = sb * x;
            *eps = r + s;
        }
    } else {
        float p = sb * mo;
        float d = x - p;
        *x0 = d / sa;
        if (eps)
            *eps = mo;
    }
}

static inline float clamp_x0(float x0, float clip)
{
    if (clip > 0.0f) {
        if (x0 < -clip)
            x0 = -clip;
        if (x0 > clip)
            x0 = clip;
    }
    return x0;
}

void sd_ddim_step(const float *alphas_cumprod, float final_alpha_cumprod, sd_prediction pred,
                  float clip, int64_t t, int64_t prev_t, int64_t n, const float *model_out,
                  const float *sample, float *out)
{
    const float a_t = alphas_cumprod[t];
    const float a_p = prev_t >= 0 ? alphas_cumprod[prev_t] : final_alpha_cumprod;
    const float b_t = 1.0f - a_t;
    const float b_p = 1.0f - a_p;
    const float sa = sqrtf(a_t), sb = sqrtf(b_t);
    /* _get_variance and std_dev_t = eta * variance ** 0.5 with eta = 0 */
    const float ratio = b_p / b_t, frac = a_t / a_p;
    const float variance = ratio * (1.0f - frac);
    const float std_dev = 0.0f * sqrtf(variance);
    const float sq = std_dev * std_dev;
    const float dir_coeff = sqrtf((1.0f - a_p) - sq);
    const float sa_p = sqrtf(a_p);
    for (int64_t i = 0; i < n; i++) {
        float x0, eps;
        predict_x0_eps(pred, sa, sb, model_out[i], sample[i], &x0, &eps);
        x0 = clamp_x0(x0, clip); /* use_clipped_model_output is off: eps stays */
        float dir = dir_coeff * eps;
        float p = sa_p * x0;
        out[i] = p + dir;
    }
}

void sd_ddpm_step(const float *alphas_cumprod, sd_prediction pred, float clip, int64_t t,
                  int64_t prev_t, int64_t n, const float *model_out, const float *sample,
                  const float *noise, float *out)
{
    const float a_t = alphas_cumprod[t];
    const float a_p = prev_t >= 0 ? alphas_cumprod[prev_t] : 1.0f;
    const float b_t = 1.0f - a_t;
    const float b_p = 1.0f - a_p;
    const float cur_alpha = a_t / a_p;
    const float cur_beta = 1.0f - cur_alpha;
    const float sa = sqrtf(a_t), sb = sqrtf(b_t);
    const float x0_num = sqrtf(a_p) * cur_beta;
    const float x0_coeff = x0_num / b_t;
    const float x_num = sqrtf(cur_alpha) * b_p;
    const float x_coeff = x_num / b_t;
    float std_dev = 0.0f;
    if (t > 0) {
        /* _get_variance: recomputed from abar as diffusers does (same values) */
        float beta = 1.0f - a_t / a_p;
        float v = (1.0f - a_p) / (1.0f - a_t);
        float variance = v * beta;
        if (!(variance >= 1e-20f))
            variance = 1e-20f;
        std_dev = sqrtf(variance);
        SD_CHECK(noise != NULL, "DDPM step at t = %lld needs noise", (long long)t);
    }
    for (int64_t i = 0; i < n; i++) {
        float x0;
        predict_x0_eps(pred, sa, sb, model_out[i], sample[i], &x0, NULL);
        x0 = clamp_x0(x0, clip);
        float p = x0_coeff * x0, q = x_coeff * sample[i];
        float r = p + q;
        if (t > 0) {
            float z = std_dev * noise[i];
            r = r + z;
        }
        out[i] = r;
    }
}

void sd_pndm_prev_sample(const float *alphas_cumprod, float final_alpha_cumprod,
                         sd_prediction pred, int64_t t, int64_t prev_t, int64_t n,
                         const float *model_out, const float *sample, float *out)
{
    const float a_t = alphas_cumprod[t];
    const float a_p = prev_t >= 0 ? alphas_cumprod[prev_t] : final_alpha_cumprod;
    const float b_t = 1.0f - a_t;
    const float b_p = 1.0f - a_p;
    const float sa = sqrtf(a_t), sb = sqrtf(b_t);
    const float sample_coeff = sqrtf(a_p / a_t);
    const float d1 = a_t * sqrtf(b_p);
    const float ab = a_t * b_t;
    const float d2 = sqrtf(ab * a_p);
    const float denom = d1 + d2;
    const float diff = a_p - a_t;
    for (int64_t i = 0; i < n; i++) {
        float mo = model_out[i], x = sample[i];
        if (pred == SD_PRED_V) {
            float p = sa * mo, q = sb * x;
            mo = p + q;
        }
        float p = sample_coeff * x;
        float q = diff * mo;
        float r = q / denom;
        out[i] = p - r;
    }
}

void sd_guidance_combine(int64_t n, const float *uncond, const float *cond, double g, float *out)
{
    const float gf = (float)g;
    for (int64_t i = 0; i < n; i++) {
        float d = cond[i] - uncond[i];
        float s = gf * d;
        out[i] = uncond[i] + s;
    }
}

void sd_image_to_u8(int64_t n, const float *x, uint8_t *out)
{
    for (int64_t i = 0; i < n; i++) {
        float h = x[i] * 0.5f;
        float v = h + 0.5f;
        if (!(v >= 0.0f))
            v = 0.0f; /* NaN too: torch.clamp keeps NaN, numpy's cast of NaN is undefined */
        if (v > 1.0f)
            v = 1.0f;
        float s = v * 255.0f;
        out[i] = (uint8_t)rintf(s); /* round half to even in the default rounding mode */
    }
}

int sd_sampler_init(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d, int num_steps,
                    int steps_offset, int64_t n, sd_err *err)
{
    int64_t *ts;
    int count;
    memset(s, 0, sizeof *s);
    if (kind != SD_SAMPLER_DDIM && kind != SD_SAMPLER_PNDM && kind != SD_SAMPLER_DDPM)
        return sd_err_set(err, "sampler: unknown scheduler %d", (int)kind);
    if (n < 1)
        return sd_err_set(err, "sampler: latents of %lld elements", (long long)n);
    ts = sd_xmalloc(((size_t)num_steps + 2) * sizeof *ts);
    count = sd_sampler_timesteps(kind, num_steps, d->num_train_timesteps, steps_offset, ts, err);
    if (count < 0) {
        free(ts);
        return -1;
    }
    s->kind = kind;
    s->prediction = d->prediction;
    s->num_train_timesteps = d->num_train_timesteps;
    s->alphas_cumprod = d->alphas_cumprod;
    s->final_alpha_cumprod = d->alphas_cumprod[0]; /* set_alpha_to_one = false */
    s->num_steps = num_steps;
    s->ratio = d->num_train_timesteps / num_steps;
    s->n_timesteps = count;
    s->timesteps = ts;
    s->n = n;
    if (kind == SD_SAMPLER_PNDM) {
        for (int k = 0; k < 4; k++)
            s->ets[k] = sd_xmalloc((size_t)n * sizeof(float));
        s->cur_sample = sd_xmalloc((size_t)n * sizeof(float));
        s->tmp = sd_xmalloc((size_t)n * sizeof(float));
    }
    return 0;
}

void sd_sampler_free(sd_sampler *s)
{
    for (int k = 0; k < 4; k++)
        free(s->ets[k]);
    free(s->cur_sample);
    free(s->tmp);
    free(s->timesteps);
    memset(s, 0, sizeof *s);
}

void sd_sampler_reset(sd_sampler *s)
{
    s->n_ets = 0;
    s->counter = 0;
}

/* PNDMScheduler.step_plms (skip_prk_steps). ets[0..n_ets) oldest first. */
static void pndm_step(sd_sampler *s, int i, const float *mo, float *sample)
{
    const int64_t n = s->n;
    int64_t t = s->timesteps[i], prev_t = t - s->ratio;
    const float *x = sample;
    float *m = s->tmp;
    if (s->counter != 1) {
        /* ets = ets[-3:] + [model_output] */
        if (s->n_ets == 4) {
            float *oldest = s->ets[0];
            memmove(s->ets, s->ets + 1, 3 * sizeof s->ets[0]);
            s->ets[3] = oldest;
            s->n_ets = 3;
        }
        memcpy(s->ets[s->n_ets++], mo, (size_t)n * sizeof(float));
    } else {
        prev_t = t;
        t = t + s->ratio;
    }
    float *const *e = s->ets;
    const int k = s->n_ets;
    if (k == 1 && s->counter == 0) {
        memcpy(m, mo, (size_t)n * sizeof(float));
        memcpy(s->cur_sample, sample, (size_t)n * sizeof(float));
    } else if (k == 1 && s->counter == 1) {
        for (int64_t j = 0; j < n; j++) {
            float a = mo[j] + e[0][j];
            m[j] = a / 2.0f;
        }
        x = s->cur_sample;
    } else if (k == 2) {
        for (int64_t j = 0; j < n; j++) {
            float a = 3.0f * e[1][j];
            float b = a - e[0][j];
            m[j] = b / 2.0f;
        }
    } else if (k == 3) {
        for (int64_t j = 0; j < n; j++) {
            float a = 23.0f * e[2][j], b = 16.0f * e[1][j], c = 5.0f * e[0][j];
            float r = a - b;
            r = r + c;
            m[j] = r / 12.0f;
        }
    } else {
        const float w = (float)(1.0 / 24.0);
        for (int64_t j = 0; j < n; j++) {
            float a = 55.0f * e[3][j], b = 59.0f * e[2][j], c = 37.0f * e[1][j],
                  d = 9.0f * e[0][j];
            float r = a - b;
            r = r + c;
            r = r - d;
            m[j] = w * r;
        }
    }
    sd_pndm_prev_sample(s->alphas_cumprod, s->final_alpha_cumprod, s->prediction, t, prev_t, n,
                        m, x, sample);
    s->counter++;
}

void sd_sampler_step(sd_sampler *s, int i, const float *model_out, float *sample,
                     const float *noise)
{
    SD_CHECK(i >= 0 && i < s->n_timesteps, "sampler step %d of %d", i, s->n_timesteps);
    const int64_t t = s->timesteps[i];
    switch (s->kind) {
    case SD_SAMPLER_DDIM:
        sd_ddim_step(s->alphas_cumprod, s->final_alpha_cumprod, s->prediction,
                     s->clip_sample_range, t, t - s->ratio, s->n, model_out, sample, sample);
        break;
    case SD_SAMPLER_DDPM: {
        /* previous_timestep: the next entry of the list, -1 after the last */
        int64_t prev_t = i + 1 < s->n_timesteps ? s->timesteps[i + 1] : -1;
        sd_ddpm_step(s->alphas_cumprod, s->prediction, s->clip_sample_range, t, prev_t, s->n,
                     model_out, sample, noise, sample);
        break;
    }
    case SD_SAMPLER_PNDM:
        pndm_step(s, i, model_out, sample);
        break;
    }
}

int sd_sampler_normals_nhwc(uint64_t seed, uint32_t purpose, uint64_t image, uint64_t prompt,
                            uint64_t offset, int c, int h, int w, float *out, sd_err *err)
{
    const size_t n = (size_t)c * (size_t)h * (size_t)w, hw = (size_t)h * (size_t)w;
    float *chw = sd_xmalloc(n * sizeof *chw);
    if (sd_rng_check(purpose, image, prompt, offset + n, err) != 0 ||
        sd_rng_fill_normal_at(seed, purpose, image, prompt, offset, chw, n) != 0) {
        free(chw);
        return sd_err_set(err, "sampler: random stream (image %llu, prompt %llu) beyond the RNG "
                               "limits", (unsigned long long)image, (unsigned long long)prompt);
    }
    for (int ch = 0; ch < c; ch++)
        for (size_t p = 0; p < hw; p++)
            out[p * (size_t)c + (size_t)ch] = chw[(size_t)ch * hw + p];
    free(chw);
    return 0;
}
