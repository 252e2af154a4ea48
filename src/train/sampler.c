/* Inference schedulers: diffusers' DDIM, PNDM (PLMS, with or without its Runge-Kutta warm-up), DDPM
 * steps in fp32, in diffusers' order of operations (see include/sdtrain/sampler.h). */
#include "sdtrain/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/check.h"

static const char *const kind_names[SD_SAMPLER_N_KINDS] = {
    "ddim", "pndm", "ddpm", "euler", "euler_a", "dpmpp_2m", "dpmpp_2m_sde", "heun", "unipc",
    "lms", "dpm2", "dpm2_a", "dpmpp_sde"};
static const char *const spacing_names[] = {"leading", "trailing", "linspace"};
/* the diffusers class of each kind (dpmpp_2m_sde: the same class, another algorithm_type) */
static const char *const class_names[SD_SAMPLER_N_KINDS] = {
    "DDIMScheduler", "PNDMScheduler", "DDPMScheduler", "EulerDiscreteScheduler",
    "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
    "DPMSolverMultistepScheduler", "HeunDiscreteScheduler", "UniPCMultistepScheduler",
    "LMSDiscreteScheduler", "KDPM2DiscreteScheduler", "KDPM2AncestralDiscreteScheduler",
    "DPMSolverSDEScheduler"};

int sd_sampler_kind_from_name(const char *name)
{
    for (int k = 0; name && k < SD_SAMPLER_N_KINDS; k++)
        if (!strcasecmp(name, kind_names[k]))
            return k;
    return -1;
}

const char *sd_sampler_kind_name(sd_sampler_kind kind)
{
    return (unsigned)kind < SD_SAMPLER_N_KINDS ? kind_names[kind] : "?";
}

const char *sd_sampler_class_name(sd_sampler_kind kind)
{
    return (unsigned)kind < SD_SAMPLER_N_KINDS ? class_names[kind] : "?";
}

int sd_sampler_takes_zero_snr(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_DDIM || kind == SD_SAMPLER_DDPM || kind == SD_SAMPLER_EULER ||
           kind == SD_SAMPLER_EULER_A || kind == SD_SAMPLER_DPMPP_2M ||
           kind == SD_SAMPLER_DPMPP_2M_SDE || kind == SD_SAMPLER_UNIPC;
}

int sd_spacing_from_name(const char *name)
{
    for (int k = 0; name && k < 3; k++)
        if (!strcasecmp(name, spacing_names[k]))
            return k;
    return -1;
}

const char *sd_spacing_name(sd_spacing spacing)
{
    return (unsigned)spacing < 3 ? spacing_names[spacing] : "?";
}

static int is_dpm(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_DPMPP_2M || kind == SD_SAMPLER_DPMPP_2M_SDE;
}

/* DPM-Solver++ and UniPC: N + 1 spaced points, the schedule's own sigma range for Karras and
 * exponential sigmas, integer timesteps */
static int is_multistep(sd_sampler_kind kind)
{
    return is_dpm(kind) || kind == SD_SAMPLER_UNIPC;
}

/* KDPM2 and its ancestral variant: 2 N - 1 calls over interleaved schedules */
static int is_dpm2(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_DPM2 || kind == SD_SAMPLER_DPM2_A;
}

/* DPM++ SDE: 2 N - 1 calls too, with its own midpoints and Brownian noise */
static int is_sde(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_DPMPP_SDE;
}

/* the k-diffusion samplers: fp32 timesteps, scaled model input, init_noise_sigma */
static int is_k(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_EULER || kind == SD_SAMPLER_EULER_A || kind == SD_SAMPLER_HEUN ||
           kind == SD_SAMPLER_LMS || is_dpm2(kind) || is_sde(kind);
}

static int uses_sigmas(sd_sampler_kind kind)
{
    return is_k(kind) || is_dpm(kind) || kind == SD_SAMPLER_UNIPC;
}

int sd_sampler_takes_sigma_schedule(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_EULER || kind == SD_SAMPLER_HEUN || kind == SD_SAMPLER_LMS ||
           is_dpm2(kind) || is_sde(kind) || is_multistep(kind);
}

int sd_sampler_takes_final_sigma_min(sd_sampler_kind kind)
{
    return kind == SD_SAMPLER_EULER || is_multistep(kind);
}

sd_spacing sd_sampler_default_spacing(sd_sampler_kind kind)
{
    return uses_sigmas(kind) ? SD_SPACING_LINSPACE : SD_SPACING_LEADING;
}

/* numpy.linspace(0, stop, num)[i] in float64: i * (stop / (num - 1)), the last one exactly
 * stop. */
static double np_linspace_at(double stop, int num, int i)
{
    if (num == 1)
        return 0.0;
    if (i == num - 1)
        return stop;
    return (double)i * (stop / (double)(num - 1));
}

/* numpy.arange(start, 0, step) for a float step < 0: ceil((0 - start) / step) elements; element
 * i >= 2 is start + i * d with d = (start + step) - start (numpy's fill of float arrays). */
static int64_t np_arange_len(double start, double step)
{
    double v = ceil((0.0 - start) / step);
    return v > 0 ? (int64_t)v : 0;
}

static double np_arange_at(double start, double step, int64_t i)
{
    const double second = start + step;
    if (i == 0)
        return start;
    if (i == 1)
        return second;
    return start + (double)i * (second - start);
}

/* The first `keep` values of a spacing's descending timesteps over `pts` points (trailing:
 * numpy's arange with step T / keep, all of its elements, at most keep + 1); linspace values
 * rounded when `round`. Returns how many. */
static int spaced(sd_spacing spacing, int pts, int keep, int T, int offset, int round,
                  double *out)
{
    int n = 0;
    if (spacing == SD_SPACING_LINSPACE) {
        for (int k = 0; k < keep; k++) {
            const double v = np_linspace_at((double)T - 1.0, pts, pts - 1 - k);
            out[n++] = round ? nearbyint(v) : (double)(float)v;
        }
    } else if (spacing == SD_SPACING_LEADING) {
        const int64_t ratio = T / pts;
        for (int k = 0; k < keep; k++)
            out[n++] = (double)((int64_t)(pts - 1 - k) * ratio + offset);
    } else {
        const double r = (double)T / (double)keep;
        const int64_t len = np_arange_len((double)T, -r);
        for (int64_t k = 0; k < len && k <= keep; k++)
            out[n++] = nearbyint(np_arange_at((double)T, -r, k)) - 1.0;
    }
    return n;
}

int sd_sampler_timesteps(sd_sampler_kind kind, sd_spacing spacing, int num_steps,
                         int num_train_timesteps, int steps_offset, double *out, sd_err *err)
{
    const int N = num_steps, T = num_train_timesteps;
    const int euler = is_k(kind);
    int n = 0;
    if ((unsigned)kind >= SD_SAMPLER_N_KINDS || (unsigned)spacing > SD_SPACING_LINSPACE)
        return sd_err_set(err, "sampler: unknown scheduler %d or spacing %d", (int)kind,
                          (int)spacing);
    if (N < 1 || N > T)
        return sd_err_set(err, "sampler: %d inference steps for a schedule of %d training "
                               "timesteps (need 1 <= steps <= %d)", N, T, T);
    /* the descending base list; DPM-Solver++ spaces N + 1 points (lambda_min_clipped = -inf:
     * last_timestep = T) and drops the last */
    double *base = sd_xmalloc(((size_t)N + 2) * sizeof *base);
    const int nb = spaced(spacing, is_multistep(kind) ? N + 1 : N, N, T, steps_offset,
                          !euler, base);
    /* PNDM: plms = concat(a[:-1], a[-2:-1], a[-1:])[::-1] of the ascending a, i.e. the
     * second-largest timestep twice; Heun: cat(t[:1], t[1:].repeat_interleave(2)) */
    for (int k = 0; k < nb; k++) {
        out[n++] = base[k];
        if ((kind == SD_SAMPLER_PNDM && k == 1) || (kind == SD_SAMPLER_HEUN && k >= 1))
            out[n++] = base[k];
    }
    free(base);
    for (int i = 0; i < n; i++)
        if (!(out[i] >= 0.0 && out[i] <= (double)T - 1.0))
            return sd_err_set(err, "sampler: %s with %d steps, '%s' spacing and steps_offset %d "
                                   "gives timestep %g, outside the schedule's [0, %d): use "
                                   "fewer steps or another spacing", sd_sampler_kind_name(kind),
                              N, sd_spacing_name(spacing), steps_offset, out[i], T);
    /* index_for_timestep takes the second of two equal first timesteps (skipping a step) */
    if (euler || is_multistep(kind))
        for (int i = 1; i < n; i++)
            if (out[i] == out[0])
                return sd_err_set(err, "sampler: %s with %d steps and '%s' spacing repeats "
                                       "its first timestep %g: use fewer steps",
                                  sd_sampler_kind_name(kind), N, sd_spacing_name(spacing),
                                  out[i]);
    /* a repeated timestep later on: the multistep solvers divide by the step's log-SNR
     * difference h = 0 (NaN in diffusers too) */
    if (is_multistep(kind))
        for (int i = 1; i < n; i++)
            if (out[i] == out[i - 1])
                return sd_err_set(err, "sampler: %s with %d steps and '%s' spacing repeats "
                                       "timestep %g (calls %d and %d), where the solver would "
                                       "divide by a zero step: use fewer steps",
                                  sd_sampler_kind_name(kind), N, sd_spacing_name(spacing),
                                  out[i], i - 1, i);
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

void sd_ddim_step_eta(const float *alphas_cumprod, float final_alpha_cumprod,
                      sd_prediction pred, float clip, double eta, int64_t t, int64_t prev_t,
                      int64_t n, const float *model_out, const float *sample,
                      const float *noise, float *out)
{
    const float a_t = alphas_cumprod[t];
    const float a_p = prev_t >= 0 ? alphas_cumprod[prev_t] : final_alpha_cumprod;
    const float b_t = 1.0f - a_t;
    const float b_p = 1.0f - a_p;
    const float sa = sqrtf(a_t), sb = sqrtf(b_t);
    /* _get_variance and std_dev_t = eta * variance ** 0.5 */
    const float ratio = b_p / b_t, frac = a_t / a_p;
    const float variance = ratio * (1.0f - frac);
    const float std_dev = (float)eta * sqrtf(variance);
    const float sq = std_dev * std_dev;
    const float dir_coeff = sqrtf((1.0f - a_p) - sq);
    const float sa_p = sqrtf(a_p);
    SD_CHECK(eta <= 0.0 || noise != NULL, "DDIM step with eta %g needs noise", eta);
    for (int64_t i = 0; i < n; i++) {
        float x0, eps;
        predict_x0_eps(pred, sa, sb, model_out[i], sample[i], &x0, &eps);
        x0 = clamp_x0(x0, clip); /* use_clipped_model_output is off: eps stays */
        float dir = dir_coeff * eps;
        float p = sa_p * x0;
        float r = p + dir;
        if (eta > 0.0) {
            float z = std_dev * noise[i];
            r = r + z;
        }
        out[i] = r;
    }
}

void sd_ddim_step(const float *alphas_cumprod, float final_alpha_cumprod, sd_prediction pred,
                  float clip, int64_t t, int64_t prev_t, int64_t n, const float *model_out,
                  const float *sample, float *out)
{
    sd_ddim_step_eta(alphas_cumprod, final_alpha_cumprod, pred, clip, 0.0, t, prev_t, n,
                     model_out, sample, NULL, out);
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

/* Unbiased standard deviation of n values (torch.std), in double, rounded to float. */
static float std_unbiased(int64_t n, const float *x)
{
    double mean = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; i++)
        mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - mean;
        ss += d * d;
    }
    return (float)sqrt(ss / (double)(n - 1));
}

void sd_guidance_rescale(int64_t n, float *x, const float *cond, double r)
{
    const float std_text = std_unbiased(n, cond), std_cfg = std_unbiased(n, x);
    const float factor = std_text / std_cfg;
    const float rf = (float)r, keep = (float)(1.0 - r);
    for (int64_t i = 0; i < n; i++) {
        float rescaled = x[i] * factor;
        float a = rf * rescaled, b = keep * x[i];
        x[i] = a + b;
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

/* numpy.interp(x, arange(T), fp) in float64 for 0 <= x <= T - 1: fp[j] at a grid point, else
 * slope * (x - j) + fp[j]. */
static double interp_grid(const float *fp, int T, double x)
{
    const int64_t j = (int64_t)floor(x);
    if (j >= T - 1)
        return fp[T - 1];
    if ((double)j == x)
        return fp[j];
    const double slope = ((double)fp[j + 1] - (double)fp[j]) / 1.0;
    return slope * (x - (double)j) + (double)fp[j];
}

static double sigma_to_t(double sigma, const float *log_sigmas, int T);

/* The ancestral split of a step from sigma `from` to `to` in fp32, as diffusers writes it:
 * sigma_up = (to^2 (from^2 - to^2) / from^2) ** 0.5, sigma_down = (to^2 - up^2) ** 0.5 (Euler
 * ancestral's step, KDPM2 ancestral's schedule). */
static void ancestral_sigmas(float from, float to, float *up, float *down)
{
    const float to2 = to * to, from2 = from * from, diff = from2 - to2;
    const float num = to2 * diff, up2 = num / from2;
    *up = sqrtf(up2);
    const float upsq = *up * *up;
    *down = sqrtf(to2 - upsq);
}

/* x[:1], x[1:].repeat_interleave(2), x[-1:] of x[0..N] into out[0..2N+1] */
static void interleave(const float *x, int N, float *out)
{
    out[0] = x[0];
    for (int k = 1; k <= N; k++)
        out[2 * k - 1] = out[2 * k] = x[k];
    out[2 * N + 1] = x[N];
}

/* exp(torch.lerp(log a, log b, 0.5)) in fp32: end - (end - start) * 0.5; 0 when a is 0 */
static float log_midpoint(float a, float b)
{
    if (a == 0.0f || b == 0.0f)
        return 0.0f;
    const float start = logf(a), end = logf(b), diff = end - start, half = diff * 0.5f,
                l = end - half;
    return expf(l);
}

/* KDPM2DiscreteScheduler.set_timesteps after its base schedule: from N base timesteps bt (the
 * model's fp32 values) and N + 1 base sigmas bs (the last 0), the log-midpoints
 * sigmas_interpol[k] = exp(lerp(log bs[k], log bs[k - 1], 0.5)) (0 for k = N), their timesteps
 * by _sigma_to_t, and the interleaved lists as diffusers keeps them: sigmas and sigmas_interpol
 * as cat(x[:1], x[1:].repeat_interleave(2), x[-1:]), the model's timesteps [bt0, ti1, bt1, ti2,
 * ..., ti(N-1), bt(N-1)].
 * KDPM2AncestralDiscreteScheduler instead: sigma_up[k] = (s'^2 (s^2 - s'^2) / s^2) ** 0.5 and
 * sigma_down[k] = (s'^2 - up^2) ** 0.5 with s = bs[k], s' = bs[k + 1] (down 0 at k = N), the
 * midpoints between bs[k] and sigma_down[k] (0 for the last two), the model's timesteps [bt0,
 * ti0, bt1, ti1, ..., ti(N-2), bt(N-1)]. `full` is the schedule's sigma table. bt and bs may
 * be s->model_t and s->sigmas (copied first). */
static void dpm2_finish(sd_sampler *s, const float *full, const float *bt, const float *bs, int N)
{
    const int T = s->num_train_timesteps, anc = s->kind == SD_SAMPLER_DPM2_A;
    const size_t m = (size_t)N + 1;
    float *b = sd_xmalloc(m * sizeof *b), *it = sd_xmalloc(m * sizeof *it);
    float *up = sd_xmalloc(m * sizeof *up), *down = sd_xmalloc(m * sizeof *down);
    float *t = sd_xmalloc((size_t)N * sizeof *t), *logs = sd_xmalloc((size_t)T * sizeof *logs);
    memcpy(b, bs, m * sizeof *b);
    memcpy(t, bt, (size_t)N * sizeof *t);
    for (int k = 0; k < T; k++)
        logs[k] = logf(full[k]);
    if (!anc) {
        it[0] = 0.0f; /* never used (torch's lerp gives NaN there: log 0 at roll(1)) */
        for (int k = 1; k <= N; k++)
            it[k] = log_midpoint(b[k], b[k - 1]);
    } else {
        for (int k = 0; k <= N; k++) {
            /* to the next base sigma (0 after the last); the last (0 / 0) is never used */
            up[k] = down[k] = 0.0f;
            if (b[k] > 0.0f)
                ancestral_sigmas(b[k], k < N ? b[k + 1] : 0.0f, &up[k], &down[k]);
            it[k] = k >= N - 1 ? 0.0f : log_midpoint(b[k], down[k]);
        }
    }
    s->model_t[0] = t[0];
    for (int k = 1; k < N; k++) {
        s->model_t[2 * k - 1] = (float)sigma_to_t((double)it[anc ? k - 1 : k], logs, T);
        s->model_t[2 * k] = t[k];
    }
    s->n_timesteps = 2 * N - 1;
    for (int k = 0; k < s->n_timesteps; k++)
        s->timesteps[k] = (int64_t)llround((double)s->model_t[k]);
    interleave(b, N, s->sigmas);
    interleave(it, N, s->sigmas_interp);
    if (anc) {
        interleave(up, N, s->sigmas_up);
        interleave(down, N, s->sigmas_down);
    }
    free(b);
    free(it);
    free(up);
    free(down);
    free(t);
    free(logs);
}

/* DPMSolverSDEScheduler's midpoint of sigmas a > b in float64 (its second-order timesteps):
 * sigma_fn(t + (t_next - t) * 0.5) with t = -log(sigma), i.e. exp(-t_proposed). */
static double sde_mid64(double a, double b)
{
    const double t = -log(a), tn = -log(b), tp = t + (tn - t) * 0.5;
    return exp(-tp);
}

/* The same in fp32 as its step computes it from the fp32 sigmas (torch scalars): the sigma its
 * second-order call scales the input by and evaluates x0 at. *t_out / *tp_out get t and
 * t_proposed. */
static float sde_mid32(float a, float b, float *t_out, float *tp_out)
{
    const float t = -logf(a), tn = -logf(b), delta = tn - t, half = delta * 0.5f, tp = t + half;
    if (t_out)
        *t_out = t;
    if (tp_out)
        *tp_out = tp;
    return expf(-tp);
}

/* The scalars of one half of a DPM++ SDE step from sigma to next (> 0), in diffusers' fp32
 * order of operations. */
typedef struct sde_coeffs {
    float sin;           /* sigma_input of x0: sigma, or the midpoint on the second half */
    float c_out, c_skip; /* k_x0's */
    float up, down;      /* sigma_up, sigma_down */
    float ratio, em;     /* sigma_fn(ancestral_t) / sigma_fn(t), expm1(t - ancestral_t) */
    float wa, wb, w;     /* the second half's noise weights */
} sde_coeffs;

static void sde_half(float sigma, float next, int first, sde_coeffs *c)
{
    float t, tp;
    const float mid = sde_mid32(sigma, next, &t, &tp);
    const float tn = -logf(next);
    c->sin = first ? sigma : mid;
    const float sq = c->sin * c->sin;
    c->c_skip = sq + 1.0f;
    c->c_out = -c->sin / sqrtf(c->c_skip);
    const float t_to = first ? tp : tn;
    const float from = expf(-t), to = expf(-t_to);
    const float to2 = to * to, from2 = from * from, diff = from2 - to2, num = to2 * diff,
                up2 = num / from2, up_c = sqrtf(up2);
    c->up = to < up_c ? to : up_c;
    const float upsq = c->up * c->up;
    c->down = sqrtf(to2 - upsq);
    const float anc_t = -logf(c->down);
    c->ratio = expf(-anc_t) / expf(-t);
    c->em = expm1f(t - anc_t);
    /* start, midpoint, end of the step */
    const float a = from, m = mid, b = expf(-tn);
    c->wa = sqrtf(a - m);
    c->wb = sqrtf(m - b);
    c->w = sqrtf(a - b);
}

/* DPMSolverSDEScheduler.set_timesteps after its base schedule: from the N base timesteps bt
 * (fp32) and the N base sigmas b (float64, before the fp32 cast), the second-order timesteps
 * _sigma_to_t(sde_mid64(b[k], b[k + 1])) and the interleaved lists as diffusers keeps them:
 * sigmas cat(b[:1], b[1:].repeat_interleave(2), [0]) in fp32 (2 N entries), timesteps [bt0,
 * mid0, bt1, mid1, ..., mid(N-2), bt(N-1)] (2 N - 1 calls). sigmas_interp[i] at odd i: the fp32
 * midpoint of sigmas[i - 1] and sigmas[i]. */
static void sde_finish(sd_sampler *s, const float *full, const float *bt, const double *b, int N)
{
    const int T = s->num_train_timesteps;
    float *t = sd_xmalloc((size_t)N * sizeof *t), *logs = sd_xmalloc((size_t)T * sizeof *logs);
    double *bb = sd_xmalloc((size_t)N * sizeof *bb);
    memcpy(t, bt, (size_t)N * sizeof *t);
    memcpy(bb, b, (size_t)N * sizeof *bb);
    for (int k = 0; k < T; k++)
        logs[k] = logf(full[k]);
    s->model_t[0] = t[0];
    s->sigmas[0] = (float)bb[0];
    for (int k = 1; k < N; k++) {
        s->model_t[2 * k - 1] = (float)sigma_to_t(sde_mid64(bb[k - 1], bb[k]), logs, T);
        s->model_t[2 * k] = t[k];
        s->sigmas[2 * k - 1] = s->sigmas[2 * k] = (float)bb[k];
    }
    s->n_timesteps = 2 * N - 1;
    s->sigmas[2 * N - 1] = 0.0f;
    for (int i = 0; i < s->n_timesteps; i++) {
        s->timesteps[i] = (int64_t)llround((double)s->model_t[i]);
        s->sigmas_interp[i] = i % 2 ? sde_mid32(s->sigmas[i - 1], s->sigmas[i], NULL, NULL) : 0.0f;
    }
    free(t);
    free(logs);
    free(bb);
}

/* Euler ancestral's and DPM2 ancestral's sigma_down = (to^2 - up^2) ** 0.5 cancel in fp32 by
 * (from / to)^2: when a sigma is over ~3000 times the next (the cosine schedule's first,
 * 20291, with few 'trailing' or 'linspace' steps; zero terminal SNR's 4096) to^2 - up^2 is
 * within rounding of 0.
 * - Euler ancestral only subtracts it from a far larger sigma, so only a negative (NaN, which
 *   diffusers computes there or within an ulp of it) is refused.
 * - DPM2 ancestral divides by the midpoint (sigma sigma_down) ** 0.5: refused once to^2 - up^2
 *   is within 16 ulps of 0 (diffusers' value is NaN or rounding there).
 * Returns 0, or -1 with a message. */
static int check_ancestral(const sd_sampler *s, sd_err *err)
{
    int bad = -1;
    float at = 0.0f;
    if (s->kind == SD_SAMPLER_EULER_A) {
        for (int i = 0; i < s->n_timesteps && bad < 0; i++) {
            float up, down;
            ancestral_sigmas(s->sigmas[i], s->sigmas[i + 1], &up, &down);
            if (!isfinite(down) || !isfinite(up)) {
                bad = i;
                at = s->sigmas[i];
            }
        }
    } else if (is_sde(s->kind)) {
        /* both halves of every step but the last: sigma_down, its log and the noise weights */
        for (int i = 0; i + 1 < s->n_timesteps && bad < 0; i++) {
            const int k = i % 2 ? i - 1 : i;
            sde_coeffs c;
            sde_half(s->sigmas[k], s->sigmas[k + 1], i % 2 == 0, &c);
            if (!isfinite(c.ratio) || !isfinite(c.em) || !isfinite(c.up) || !(c.w > 0.0f) ||
                !isfinite(c.wa) || !isfinite(c.wb)) {
                bad = i;
                at = s->sigmas[k];
            }
        }
    } else if (s->kind == SD_SAMPLER_DPM2_A) {
        /* the second-order call i (odd) uses sigmas[i - 1], sigmas_up / _down / _interp[i - 1]
         * and the next base sigma sigmas[i] */
        for (int i = 1; i < s->n_timesteps && bad < 0; i += 2) {
            const float next = s->sigmas[i], up = s->sigmas_up[i - 1];
            const float to2 = next * next, upsq = up * up, rest = to2 - upsq;
            if (!(rest > 16.0f * FLT_EPSILON * to2) || !(s->sigmas_interp[i - 1] > 0.0f) ||
                !isfinite(s->sigmas_interp[i - 1]) || !isfinite(s->sigmas_down[i - 1])) {
                bad = i;
                at = s->sigmas[i - 1];
            }
        }
    }
    if (bad < 0)
        return 0;
    return sd_err_set(err, "sampler: %s with %d steps: at model call %d the next sigma is so much "
                           "smaller than this one (%g) that sigma_down = (next^2 - up^2) ** 0.5 "
                           "is within fp32 rounding of 0 (%s, in diffusers too): use more steps "
                           "or 'leading' spacing", sd_sampler_kind_name(s->kind), s->num_steps,
                      bad, (double)at,
                      s->kind == SD_SAMPLER_EULER_A ? "NaN"
                                                    : "NaN or meaningless, and divided by");
}

int sd_sampler_init(sd_sampler *s, sd_sampler_kind kind, const sd_diffusion *d, int num_steps,
                    sd_spacing spacing, int steps_offset, int64_t n, sd_err *err)
{
    double *ts;
    int count;
    const int T = d->num_train_timesteps;
    memset(s, 0, sizeof *s);
    if ((unsigned)kind >= SD_SAMPLER_N_KINDS)
        return sd_err_set(err, "sampler: unknown scheduler %d", (int)kind);
    if (n < 1)
        return sd_err_set(err, "sampler: latents of %lld elements", (long long)n);
    ts = sd_xmalloc((2 * (size_t)num_steps + 2) * sizeof *ts);
    count = sd_sampler_timesteps(kind, spacing, num_steps, T, steps_offset, ts, err);
    if (count < 0) {
        free(ts);
        return -1;
    }
    if (d->zero_snr && !sd_sampler_takes_zero_snr(kind)) {
        free(ts);
        return sd_err_set(err, "sampler: '%s' has no zero-terminal-SNR schedule (diffusers' %s "
                               "has no rescale_betas_zero_snr): use ddim, ddpm, euler, euler_a, "
                               "dpmpp_2m, dpmpp_2m_sde or unipc", sd_sampler_kind_name(kind),
                          sd_sampler_class_name(kind));
    }
    /* the 2^-24 below must stay the smallest abar, or the noise levels stop increasing at the
     * end (a long schedule whose rescaled abar at T - 2 is already tinier: NaN in diffusers) */
    if (d->zero_snr && uses_sigmas(kind) && T >= 2 && !(d->alphas_cumprod[T - 2] > 0x1p-24f)) {
        free(ts);
        return sd_err_set(err, "sampler: '%s' on this zero-terminal-SNR schedule: alphas_cumprod "
                               "at t = %d is %g, below the 2^-24 the last timestep is given, so "
                               "the noise levels would not increase to the end (use fewer "
                               "num_train_timesteps or a smaller beta_end, or ddim / ddpm)",
                          sd_sampler_kind_name(kind), T - 2, (double)d->alphas_cumprod[T - 2]);
    }
    s->kind = kind;
    s->spacing = spacing;
    s->prediction = d->prediction;
    s->num_train_timesteps = T;
    s->alphas_cumprod = d->alphas_cumprod;
    if (d->zero_snr && uses_sigmas(kind)) {
        /* abar[T-1] = 0 would make the first sigma infinite: diffusers' Euler, Euler ancestral,
         * DPM-Solver++ and UniPC set it to 2^-24 (DDIM and DDPM keep the 0) */
        s->own_abar = sd_xmalloc((size_t)T * sizeof *s->own_abar);
        memcpy(s->own_abar, d->alphas_cumprod, (size_t)T * sizeof *s->own_abar);
        s->own_abar[T - 1] = 0x1p-24f;
        s->alphas_cumprod = s->own_abar;
    }
    s->karras_trunc = is_dpm(kind) && d->schedule == SD_BETAS_SQUAREDCOS_CAP_V2;
    s->final_alpha_cumprod = d->alphas_cumprod[0]; /* set_alpha_to_one = false */
    s->num_steps = num_steps;
    s->ratio = T / num_steps;
    s->n_timesteps = count;
    /* DPM2: count = N base timesteps here, 2 N - 1 model calls after dpm2_finish */
    const size_t cap = is_dpm2(kind) || is_sde(kind) ? 2 * (size_t)count : (size_t)count;
    s->timesteps = sd_xmalloc(cap * sizeof *s->timesteps);
    s->model_t = sd_xmalloc(cap * sizeof *s->model_t);
    for (int i = 0; i < count; i++) {
        s->timesteps[i] = (int64_t)llround(ts[i]);
        s->model_t[i] = (float)ts[i];
    }
    s->init_noise_sigma = 1.0f;
    s->dpm_order = 2;
    s->lower_order_final = 1;
    s->n = n;
    if (uses_sigmas(kind)) {
        /* sigmas = ((1 - abar) / abar) ** 0.5 in fp32, interpolated at the timesteps (float64),
         * cast to fp32, and the final sigma 0 (final_sigmas_type 'zero') */
        float *full = sd_xmalloc((size_t)T * sizeof *full), mx = 0.0f;
        for (int t = 0; t < T; t++) {
            const float a = s->alphas_cumprod[t], b = 1.0f - a, q = b / a;
            full[t] = sqrtf(q);
        }
        /* DPM++ SDE's second-order timesteps come from the float64 sigmas: kept in b64 */
        double *b64 = is_sde(kind) ? sd_xmalloc((size_t)count * sizeof *b64) : NULL;
        s->sigmas = sd_xmalloc((cap + 2) * sizeof *s->sigmas);
        for (int i = 0; i < count; i++) {
            const double v = interp_grid(full, T, ts[i]);
            s->sigmas[i] = (float)v;
            if (b64)
                b64[i] = v;
        }
        s->sigmas[count] = 0.0f;
        if (b64) {
            s->sigmas_interp = sd_xmalloc((cap + 2) * sizeof *s->sigmas_interp);
            sde_finish(s, full, s->model_t, b64, count);
            free(b64);
        }
        if (is_dpm2(kind)) {
            s->sigmas_interp = sd_xmalloc((cap + 2) * sizeof *s->sigmas_interp);
            if (kind == SD_SAMPLER_DPM2_A) {
                s->sigmas_up = sd_xmalloc((cap + 2) * sizeof *s->sigmas_up);
                s->sigmas_down = sd_xmalloc((cap + 2) * sizeof *s->sigmas_down);
            }
            dpm2_finish(s, full, s->model_t, s->sigmas, count);
        }
        free(full);
        for (int i = 0; i <= count; i++)
            mx = s->sigmas[i] > mx ? s->sigmas[i] : mx;
        if (is_k(kind)) {
            /* init_noise_sigma: max sigma ('linspace', 'trailing') or (max^2 + 1) ** 0.5 */
            if (spacing == SD_SPACING_LEADING) {
                const float sq = mx * mx, p = sq + 1.0f;
                s->init_noise_sigma = sqrtf(p);
            } else {
                s->init_noise_sigma = mx;
            }
        }
    }
    free(ts);
    if (kind == SD_SAMPLER_PNDM) {
        for (int k = 0; k < 4; k++)
            s->ets[k] = sd_xmalloc((size_t)n * sizeof(float));
        s->cur_sample = sd_xmalloc((size_t)n * sizeof(float));
    }
    if (kind == SD_SAMPLER_PNDM || is_dpm(kind) || kind == SD_SAMPLER_UNIPC)
        s->tmp = sd_xmalloc((size_t)n * sizeof(float));
    if (is_dpm(kind) || kind == SD_SAMPLER_UNIPC)
        s->x0_prev = sd_xmalloc((size_t)n * sizeof(float));
    if (is_dpm(kind) || kind == SD_SAMPLER_UNIPC) /* model_outputs[-3]: DPM order 3 */
        s->x0_prev2 = sd_xmalloc((size_t)n * sizeof(float));
    if (kind == SD_SAMPLER_UNIPC) {
        s->x0_prev3 = sd_xmalloc((size_t)n * sizeof(float));
        s->last_sample = sd_xmalloc((size_t)n * sizeof(float));
    }
    if (kind == SD_SAMPLER_HEUN)
        s->heun_der = sd_xmalloc((size_t)n * sizeof(float));
    if (kind == SD_SAMPLER_HEUN || is_dpm2(kind) || is_sde(kind)) /* the kept sample */
        s->heun_sample = sd_xmalloc((size_t)n * sizeof(float));
    if (is_sde(kind))
        s->sde_z = sd_xmalloc((size_t)n * sizeof(float));
    if (kind == SD_SAMPLER_LMS)
        for (int k = 0; k < 4; k++)
            s->lms_der[k] = sd_xmalloc((size_t)n * sizeof(float));
    if (check_ancestral(s, err) != 0) {
        sd_sampler_free(s);
        return -1;
    }
    return 0;
}

/* _sigma_to_t: the fractional timestep whose log-sigma interpolates log(sigma) between the
 * neighbouring entries of log_sigmas (fp32, increasing), clamped to [0, T - 1]. */
static double sigma_to_t(double sigma, const float *log_sigmas, int T)
{
    const double ls = log(sigma > 1e-10 ? sigma : 1e-10);
    int lo = 0;
    for (int t = 0; t < T; t++) /* the last t with log_sigmas[t] <= ls (0 when none) */
        if ((double)log_sigmas[t] <= ls)
            lo = t;
    if (lo > T - 2)
        lo = T - 2;
    const float low = log_sigmas[lo], high = log_sigmas[lo + 1], span = low - high;
    double w = ((double)low - ls) / (double)span;
    w = w < 0.0 ? 0.0 : w > 1.0 ? 1.0 : w;
    return (1.0 - w) * (double)lo + w * (double)(lo + 1);
}

/* numpy.linspace(start, stop, num)[i] in float64 for num >= 1: i * step + start, the last one
 * exactly stop. */
static double np_linspace2_at(double start, double stop, int num, int i)
{
    if (num == 1)
        return start;
    if (i == num - 1)
        return stop;
    return (double)i * ((stop - start) / (double)(num - 1)) + start;
}

/* The regularized incomplete beta function I_x(a, b): its continued fraction (modified Lentz),
 * on the side of x where it converges fast, to about 1e-15. */
static double ibeta_cf(double a, double b, double x)
{
    const double tiny = 1e-300;
    double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0), h;
    d = 1.0 / (fabs(d) < tiny ? tiny : d);
    h = d;
    for (int m = 1; m <= 2000; m++) {
        const double m2 = 2.0 * m;
        /* the even and the odd term of the fraction */
        for (int odd = 0; odd < 2; odd++) {
            const double num = odd ? -(a + m) * (a + b + m) * x / ((a + m2) * (a + 1.0 + m2))
                                   : m * (b - m) * x / ((a - 1.0 + m2) * (a + m2));
            d = 1.0 + num * d;
            c = 1.0 + num / c;
            d = 1.0 / (fabs(d) < tiny ? tiny : d);
            c = fabs(c) < tiny ? tiny : c;
            h *= d * c;
            if (odd && fabs(d * c - 1.0) < 1e-16)
                return h;
        }
    }
    return h;
}

static double ibeta(double a, double b, double x)
{
    if (x <= 0.0)
        return 0.0;
    if (x >= 1.0)
        return 1.0;
    const double front = exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * log(x) + b * log1p(-x));
    if (x < (a + 1.0) / (a + b + 2.0))
        return front * ibeta_cf(a, b, x) / a;
    return 1.0 - front * ibeta_cf(b, a, 1.0 - x) / b;
}

/* The beta distribution's quantile (scipy.stats.beta.ppf): the x in [0, 1] with I_x(a, b) = p,
 * by bisection down to adjacent doubles (I is increasing). */
double sd_beta_ppf(double p, double a, double b)
{
    if (p <= 0.0)
        return 0.0;
    if (p >= 1.0)
        return 1.0;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 200; it++) {
        const double mid = 0.5 * (lo + hi);
        if (mid <= lo || mid >= hi)
            break;
        if (ibeta(a, b, mid) < p)
            lo = mid;
        else
            hi = mid;
    }
    return 0.5 * (lo + hi);
}

/* Karras (rho 7), exponential or beta sigmas between the spacing's smallest and largest sigma (Euler)
 * or the schedule's (DPM-Solver++), each timestep where log(sigma) interpolates in the
 * schedule's log-sigmas: DPM-Solver++ rounds Karras timesteps and truncates exponential ones
 * (its int64 cast), Euler keeps them fractional. */
enum { SIGMAS_KARRAS, SIGMAS_EXPONENTIAL, SIGMAS_BETA };

static int convert_sigmas(sd_sampler *s, int which, sd_err *err)
{
    const int T = s->num_train_timesteps, N = s->num_steps;
    /* beta sigmas take their timesteps as exponential ones do */
    const int expo = which != SIGMAS_KARRAS;
    const char *what = which == SIGMAS_KARRAS        ? "Karras"
                       : which == SIGMAS_EXPONENTIAL ? "exponential"
                                                     : "beta";
    double smin, smax;
    const int heun = s->kind == SD_SAMPLER_HEUN, dpm2 = is_dpm2(s->kind), sde = is_sde(s->kind);
    if (!sd_sampler_takes_sigma_schedule(s->kind))
        return sd_err_set(err, "sampler: %s sigmas are implemented for euler, heun, lms, dpm2(_a), unipc, "
                               "dpmpp_2m, dpmpp_2m_sde and dpmpp_sde, not %s", what,
                          sd_sampler_kind_name(s->kind));
    SD_CHECK(s->n_timesteps == (heun || dpm2 || sde ? 2 * N - 1 : N), "%s: %d timesteps for %d steps",
             sd_sampler_kind_name(s->kind), s->n_timesteps, N);
    float *full = sd_xmalloc((size_t)T * sizeof *full), *logs = sd_xmalloc((size_t)T * sizeof *logs);
    for (int t = 0; t < T; t++) {
        const float a = s->alphas_cumprod[t], b = 1.0f - a, q = b / a;
        full[t] = sqrtf(q);
        logs[t] = logf(full[t]);
    }
    if (is_multistep(s->kind)) {
        /* the whole table, flipped: sigma_min = sigmas[0], sigma_max = sigmas[T - 1] */
        smin = full[0];
        smax = full[T - 1];
    } else {
        /* the spacing's sigmas (float64 interpolation): its last and first */
        smin = interp_grid(full, T, (double)s->model_t[s->n_timesteps - 1]);
        smax = interp_grid(full, T, (double)s->model_t[0]);
    }
    /* _convert_to_karras, rho = 7: (max^(1/rho) + ramp (min^(1/rho) - max^(1/rho)))^rho;
     * _convert_to_exponential: exp(linspace(log(max), log(min), N)) */
    const double rho = 7.0, min_inv = pow(smin, 1.0 / rho), max_inv = pow(smax, 1.0 / rho);
    const double lmax = log(smax), lmin = log(smin);
    float *bsig = dpm2 ? sd_xmalloc(((size_t)N + 1) * sizeof *bsig) : NULL;
    float *bt = dpm2 || sde ? sd_xmalloc((size_t)N * sizeof *bt) : NULL;
    double *b64 = sde ? sd_xmalloc((size_t)N * sizeof *b64) : NULL;
    for (int i = 0; i < N; i++) {
        /* _convert_to_beta: sigma_min + ppf(1 - linspace(0, 1, N), 0.6, 0.6) (max - min) */
        const double sig =
            which == SIGMAS_BETA ? smin + sd_beta_ppf(1.0 - np_linspace_at(1.0, N, i), 0.6, 0.6) * (smax - smin)
            : expo     ? exp(np_linspace2_at(lmax, lmin, N, i))
                       : pow(max_inv + np_linspace_at(1.0, N, i) * (min_inv - max_inv), rho);
        double t = sigma_to_t(sig, logs, T);
        if (is_multistep(s->kind))
            t = expo || s->karras_trunc ? trunc(t) : nearbyint(t);
        if (sde) { /* DPM++ SDE keeps them fractional, and its sigmas in float64 */
            b64[i] = sig;
            bt[i] = (float)t;
            continue;
        }
        if (dpm2) { /* KDPM2 rounds its Karras timesteps, not its exponential ones */
            bsig[i] = (float)sig;
            bt[i] = (float)(expo ? t : nearbyint(t));
            continue;
        }
        /* Heun: every entry but the first twice */
        for (int r = 0; r < (heun && i > 0 ? 2 : 1); r++) {
            const int k = heun ? (i == 0 ? 0 : 2 * i - 1 + r) : i;
            s->sigmas[k] = (float)sig;
            s->model_t[k] = (float)t;
            s->timesteps[k] = (int64_t)llround(t);
        }
    }
    if (dpm2) {
        bsig[N] = 0.0f;
        dpm2_finish(s, full, bt, bsig, N);
        free(bsig);
        free(bt);
    } else if (sde) {
        sde_finish(s, full, bt, b64, N);
        free(b64);
        free(bt);
    } else {
        s->sigmas[s->n_timesteps] = s->final_sigma;
    }
    free(full);
    free(logs);
    for (int i = 1; i < s->n_timesteps; i++)
        if (s->model_t[i] == s->model_t[0])
            return sd_err_set(err, "sampler: %s with %s sigmas and %d steps repeats its first "
                                   "timestep (its largest sigmas lie too close together): use fewer steps or "
                                   "other sigmas", sd_sampler_kind_name(s->kind),
                              what, N);
    if (s->kind == SD_SAMPLER_EULER || s->kind == SD_SAMPLER_LMS || heun || dpm2 || sde) {
        float mx = 0.0f;
        for (int i = 0; i <= s->n_timesteps; i++)
            mx = s->sigmas[i] > mx ? s->sigmas[i] : mx;
        if (s->spacing == SD_SPACING_LEADING) {
            const float sq = mx * mx, p = sq + 1.0f;
            s->init_noise_sigma = sqrtf(p);
        } else {
            s->init_noise_sigma = mx;
        }
    }
    s->sigma_schedule = what;
    return check_ancestral(s, err);
}

int sd_sampler_use_karras(sd_sampler *s, sd_err *err)
{
    return convert_sigmas(s, SIGMAS_KARRAS, err);
}

int sd_sampler_use_exponential(sd_sampler *s, sd_err *err)
{
    return convert_sigmas(s, SIGMAS_EXPONENTIAL, err);
}

int sd_sampler_use_beta(sd_sampler *s, sd_err *err)
{
    return convert_sigmas(s, SIGMAS_BETA, err);
}

int sd_sampler_final_sigma_min(sd_sampler *s, sd_err *err)
{
    if (!sd_sampler_takes_final_sigma_min(s->kind))
        return sd_err_set(err, "sampler: final_sigmas_type 'sigma_min' is for euler, unipc and "
                               "dpmpp_2m(_sde), not %s", sd_sampler_kind_name(s->kind));
    /* ((1 - abar[0]) / abar[0]) ** 0.5 in fp32 */
    const float a = s->alphas_cumprod[0], b = 1.0f - a, q = b / a;
    s->final_sigma = sqrtf(q);
    s->sigmas[s->n_timesteps] = s->final_sigma;
    return 0;
}

int sd_sampler_check_options(const sd_sampler *s, sd_err *err)
{
    const int n = s->n_timesteps, unipc = s->kind == SD_SAMPLER_UNIPC;
    if (!is_multistep(s->kind))
        return 0;
    /* UniPC to a final sigma of 0: h = inf at the last step */
    if (unipc && s->final_sigma == 0.0f) {
        const char *why = NULL, *alt = "";
        if (s->unipc_eps) {
            why = "with predict_x0 false its last step multiplies sigma = 0 by expm1(h) = inf";
            alt = " or keep predict_x0";
        } else if (s->unipc_bh1) {
            why = "with solver_type 'bh1' its last step multiplies B(h) = -h = -inf by a zero "
                  "update";
            alt = " or use bh2";
        } else if (!s->lower_order_final && s->dpm_order >= 2 && n >= 2) {
            why = "without lower_order_final its last step is of order >= 2 and divides by "
                  "h = inf (or, at order 3, solves a singular system)";
            alt = " or keep lower_order_final";
        }
        if (why)
            return sd_err_set(err, "UniPC to a final sigma of 0: %s (NaN, in diffusers too); set "
                                   "final_sigmas_type 'sigma_min'%s", why, alt);
    }
    /* Karras / exponential sigmas end at the schedule's smallest sigma, which final_sigmas_type
     * 'sigma_min' repeats: h = 0 at the last step, where a third-order step (and DPM-Solver++'s
     * second-order 'heun') divides 0 by 0 */
    if (n >= 2 && s->final_sigma != 0.0f && s->sigmas[n - 1] == s->sigmas[n]) {
        int order;
        if (unipc)
            order = s->lower_order_final ? 1 : (s->dpm_order < n ? s->dpm_order : n);
        else
            order = s->euler_at_final || (s->lower_order_final && n < 15)
                        ? 1
                        : (s->dpm_order < n ? s->dpm_order : n);
        if (order >= 3 || (!unipc && order == 2 && s->dpm_heun))
            return sd_err_set(err, "%s with %s sigmas and final_sigmas_type 'sigma_min': the last "
                                   "two sigmas are equal, and its last step, of order %d%s, "
                                   "divides by h = 0 (NaN, in diffusers too); keep "
                                   "lower_order_final%s or set final_sigmas_type 'zero'",
                              sd_sampler_kind_name(s->kind),
                              s->sigma_schedule ? s->sigma_schedule : "these",
                              order, order == 2 ? " with solver_type 'heun'" : "",
                              unipc ? "" : " (under 15 steps), euler_at_final");
    }
    return 0;
}

void sd_sampler_free(sd_sampler *s)
{
    for (int k = 0; k < 4; k++)
        free(s->ets[k]);
    free(s->cur_sample);
    free(s->tmp);
    free(s->prk_acc);
    free(s->x0_prev);
    free(s->x0_prev2);
    free(s->x0_prev3);
    free(s->last_sample);
    free(s->heun_der);
    free(s->heun_sample);
    free(s->sde_z);
    for (int k = 0; k < 4; k++)
        free(s->lms_der[k]);
    free(s->own_abar);
    free(s->timesteps);
    free(s->model_t);
    free(s->sigmas);
    free(s->sigmas_interp);
    free(s->sigmas_up);
    free(s->sigmas_down);
    memset(s, 0, sizeof *s);
}

void sd_sampler_reset(sd_sampler *s)
{
    s->n_ets = 0;
    s->counter = 0;
    s->lower_order_nums = 0;
    s->unipc_order = 0;
    s->n_lms_der = 0;
}

int sd_sampler_scales_input(const sd_sampler *s)
{
    return is_k(s->kind);
}

void sd_sampler_scale_input(const sd_sampler *s, int i, int64_t n, const float *x, float *out)
{
    SD_CHECK(i >= 0 && i < s->n_timesteps, "sampler step %d of %d", i, s->n_timesteps);
    if (!sd_sampler_scales_input(s)) {
        if (out != x)
            memmove(out, x, (size_t)n * sizeof *out);
        return;
    }
    /* sample / ((sigma**2 + 1) ** 0.5); DPM2's second-order calls at sigmas_interpol (the
     * ancestral variant's at index i - 1) */
    const float sigma = !(is_dpm2(s->kind) || is_sde(s->kind)) || i % 2 == 0 ? s->sigmas[i]
                        : s->kind == SD_SAMPLER_DPM2_A ? s->sigmas_interp[i - 1]
                                                       : s->sigmas_interp[i];
    const float sq = sigma * sigma, p = sq + 1.0f, den = sqrtf(p);
    for (int64_t j = 0; j < n; j++)
        out[j] = x[j] / den;
}

int sd_sampler_step_noise(const sd_sampler *s, int i)
{
    switch (s->kind) {
    case SD_SAMPLER_DDPM:
        return s->timesteps[i] > 0;
    case SD_SAMPLER_DDIM:
        return s->eta > 0.0;
    case SD_SAMPLER_EULER_A:
    case SD_SAMPLER_DPMPP_2M_SDE:
        return 1;
    case SD_SAMPLER_DPM2_A: /* its second-order calls */
        return i % 2 == 1;
    case SD_SAMPLER_DPMPP_SDE: /* both halves of every step but the last (plain Euler) */
        return i < s->n_timesteps - 1;
    default:
        return 0;
    }
}

/* x0 of the k-diffusion parameterisation (Euler, Euler ancestral): epsilon: x - sigma * m;
 * v: m * (-sigma / (sigma**2 + 1) ** 0.5) + x / (sigma**2 + 1). */
static inline float k_x0(sd_prediction pred, float sigma, float c_out, float c_skip, float m,
                         float x)
{
    if (pred == SD_PRED_V) {
        float a = m * c_out, b = x / c_skip;
        return a + b;
    }
    float a = sigma * m;
    return x - a;
}

/* EulerDiscreteScheduler.step (s_churn 0: sigma_hat = sigma) and
 * EulerAncestralDiscreteScheduler.step. */
static void euler_step(const sd_sampler *s, int i, const float *mo, float *x, const float *noise)
{
    const float sigma = s->sigmas[i], next = s->sigmas[i + 1];
    const float sq = sigma * sigma, c_skip = sq + 1.0f, c_out = -sigma / sqrtf(c_skip);
    if (s->kind == SD_SAMPLER_EULER) {
        const float dt = next - sigma;
        for (int64_t j = 0; j < s->n; j++) {
            float x0 = k_x0(s->prediction, sigma, c_out, c_skip, mo[j], x[j]);
            float der = (x[j] - x0) / sigma;
            float step = der * dt;
            x[j] = x[j] + step;
        }
        return;
    }
    float up, down;
    ancestral_sigmas(sigma, next, &up, &down);
    const float dt = down - sigma;
    SD_CHECK(noise != NULL, "Euler ancestral step needs noise");
    for (int64_t j = 0; j < s->n; j++) {
        float x0 = k_x0(s->prediction, sigma, c_out, c_skip, mo[j], x[j]);
        float der = (x[j] - x0) / sigma;
        float step = der * dt;
        float y = x[j] + step;
        float z = noise[j] * up;
        x[j] = y + z;
    }
}

/* LMSDiscreteScheduler.get_lms_coefficient: the integral over [sigmas[i], sigmas[i + 1]] of the
 * Lagrange basis polynomial of node `cur` over the nodes sigmas[i], ..., sigmas[i - order + 1]
 * (diffusers integrates it numerically with scipy's quad; the polynomial has degree <= 3, which
 * 3-point Gauss-Legendre integrates exactly, here in double). */
static double lms_coefficient(const float *sigmas, int order, int i, int cur)
{
    static const double node[3] = {-0.7745966692414834, 0.0, 0.7745966692414834};
    static const double weight[3] = {5.0 / 9.0, 8.0 / 9.0, 5.0 / 9.0};
    const double a = sigmas[i], b = sigmas[i + 1], mid = 0.5 * (a + b), half = 0.5 * (b - a);
    double sum = 0.0;
    for (int q = 0; q < 3; q++) {
        const double tau = mid + half * node[q];
        double prod = 1.0;
        for (int k = 0; k < order; k++)
            if (k != cur)
                prod *= (tau - (double)sigmas[i - k]) /
                        ((double)sigmas[i - cur] - (double)sigmas[i - k]);
        sum += weight[q] * prod;
    }
    return half * sum;
}

/* LMSDiscreteScheduler.step (order 4): the derivative (x - x0) / sigma joins the last three,
 * then x += sum_k c_k d_k over the min(i + 1, 4) newest, newest first, each coefficient
 * rounded to fp32 (a Python float times an fp32 tensor). */
static void lms_step(sd_sampler *s, int i, const float *mo, float *x)
{
    const int64_t n = s->n;
    const float sigma = s->sigmas[i];
    const float sq = sigma * sigma, c_skip = sq + 1.0f, c_out = -sigma / sqrtf(c_skip);
    if (s->n_lms_der == 4) { /* derivatives.pop(0) after the append */
        float *oldest = s->lms_der[0];
        memmove(s->lms_der, s->lms_der + 1, 3 * sizeof s->lms_der[0]);
        s->lms_der[3] = oldest;
        s->n_lms_der = 3;
    }
    float *der = s->lms_der[s->n_lms_der++];
    for (int64_t j = 0; j < n; j++) {
        const float x0 = k_x0(s->prediction, sigma, c_out, c_skip, mo[j], x[j]);
        der[j] = (x[j] - x0) / sigma;
    }
    const int order = i + 1 < 4 ? i + 1 : 4;
    float c[4];
    for (int k = 0; k < order; k++)
        c[k] = (float)lms_coefficient(s->sigmas, order, i, k);
    for (int64_t j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int k = 0; k < order; k++) {
            const float term = c[k] * s->lms_der[s->n_lms_der - 1 - k][j];
            acc = k == 0 ? term : acc + term;
        }
        x[j] = x[j] + acc;
    }
}

/* KDPM2DiscreteScheduler.step (DPM-Solver-2): even calls are Euler steps from sigmas[i] to the
 * log-midpoint sigmas_interpol[i + 1], keeping the sample; odd calls take the whole step from
 * sigmas[i - 1] to sigmas[i] from that kept sample with the derivative at the midpoint. The
 * last call (even) ends at the midpoint of the last sigma and 0, which is 0. */
static void dpm2_step(sd_sampler *s, int i, const float *mo, float *x, const float *noise)
{
    const int first = i % 2 == 0, anc = s->kind == SD_SAMPLER_DPM2_A;
    /* KDPM2: first order from sigmas[i] to sigmas_interpol[i + 1], second order by the
     * midpoint sigmas_interpol[i] from the kept sample to sigmas[i]. KDPM2AncestralDiscrete-
     * Scheduler indexes its schedule at k (i, or i - 1 on a second-order call): first order
     * to sigmas_interpol[k], second order to sigmas_down[k], plus noise * sigmas_up[k]. */
    const int k = first ? i : i - 1;
    const float sigma = s->sigmas[k];
    const float interp = s->sigmas_interp[anc ? k : first ? i + 1 : i];
    const float end = first ? interp : anc ? s->sigmas_down[k] : s->sigmas[i];
    const float up = anc && !first ? s->sigmas_up[k] : 0.0f;
    const float sin = first ? sigma : interp; /* sigma_input */
    const float sq = sin * sin, c_skip = sq + 1.0f, c_out = -sin / sqrtf(c_skip);
    const float dt = end - sigma;
    SD_CHECK(!anc || first || noise != NULL, "KDPM2 ancestral step needs noise");
    for (int64_t j = 0; j < s->n; j++) {
        const float x0 = k_x0(s->prediction, sin, c_out, c_skip, mo[j], x[j]);
        const float der = (x[j] - x0) / sin;
        const float base = first ? x[j] : s->heun_sample[j];
        if (first)
            s->heun_sample[j] = x[j];
        const float step = der * dt;
        float y = base + step;
        if (anc && !first) {
            const float z = noise[j] * up;
            y = y + z;
        }
        x[j] = y;
    }
}

/* DPMSolverSDEScheduler.step in fp32, as diffusers computes it (t = -log sigma): even calls
 * go from sigmas[i] to the midpoint sigma_fn(t_proposed), keeping the sample; odd calls take the
 * whole step from sigmas[i - 1] to sigmas[i], from the kept sample with x0 evaluated at the
 * midpoint. Each half is an ancestral step: to sigma_down by the exponential integrator, plus
 * noise * sigma_up. The last call (to 0) is an Euler step without noise.
 * The noise: diffusers draws it from a Brownian tree over sigma, so that the second half's
 * increment over [sigma_next, sigma] contains the first half's over [midpoint, sigma]. Here
 * call i's own normals z_i (counter-based, as every sampler's) make the same Brownian motion: the
 * first half uses z_i, the second (z_(i-1) (a - m)^1/2 + z_i (m - b)^1/2) / (a - b)^1/2 with
 * a, m, b the sigmas at the step's start, midpoint and end; equal in distribution to the tree's,
 * not its values (torchsde's seeds are its own). */
static void sde_step(sd_sampler *s, int i, const float *mo, float *x, const float *noise)
{
    const int first = i % 2 == 0;
    const int k = first ? i : i - 1; /* the step's start */
    const float sigma = s->sigmas[k], next = s->sigmas[k + 1];
    if (first && next == 0.0f) { /* the last call: Euler to 0 */
        const float sq = sigma * sigma, c_skip = sq + 1.0f, c_out = -sigma / sqrtf(c_skip);
        const float dt = next - sigma;
        for (int64_t j = 0; j < s->n; j++) {
            const float x0 = k_x0(s->prediction, sigma, c_out, c_skip, mo[j], x[j]);
            const float der = (x[j] - x0) / sigma, step = der * dt;
            x[j] = x[j] + step;
        }
        return;
    }
    sde_coeffs c;
    sde_half(sigma, next, first, &c);
    SD_CHECK(noise != NULL, "DPM++ SDE step %d needs noise", i);
    for (int64_t j = 0; j < s->n; j++) {
        const float x0 = k_x0(s->prediction, c.sin, c.c_out, c.c_skip, mo[j], x[j]);
        const float base = first ? x[j] : s->heun_sample[j];
        float z;
        if (first) {
            s->heun_sample[j] = x[j];
            s->sde_z[j] = noise[j];
            z = noise[j];
        } else {
            const float p = c.wa * s->sde_z[j], q = c.wb * noise[j], pq = p + q;
            z = pq / c.w;
        }
        const float u = c.ratio * base, v = c.em * x0, y = u - v, zn = z * c.up;
        x[j] = y + zn;
    }
}

/* HeunDiscreteScheduler.step: even calls are Euler steps that keep their derivative, dt and
 * sample; odd calls correct them with the mean of the two derivatives (x0 from the model at
 * sigma_next). */
static void heun_step(sd_sampler *s, int i, const float *mo, float *x)
{
    const int first = i % 2 == 0;
    const float sigma = first ? s->sigmas[i] : s->sigmas[i - 1];
    const float next = first ? s->sigmas[i + 1] : s->sigmas[i];
    const float sin = first ? sigma : next; /* sigma_input */
    const float sq = sin * sin, c_skip = sq + 1.0f, c_out = -sin / sqrtf(c_skip);
    if (first) {
        const float dt = next - sigma;
        for (int64_t j = 0; j < s->n; j++) {
            float x0 = k_x0(s->prediction, sin, c_out, c_skip, mo[j], x[j]);
            float der = (x[j] - x0) / sigma;
            s->heun_der[j] = der;
            s->heun_sample[j] = x[j];
            float step = der * dt;
            x[j] = x[j] + step;
        }
        s->heun_dt = dt;
    } else {
        const float dt = s->heun_dt;
        for (int64_t j = 0; j < s->n; j++) {
            float x0 = k_x0(s->prediction, sin, c_out, c_skip, mo[j], x[j]);
            float d2 = (x[j] - x0) / next;
            float sum = s->heun_der[j] + d2, der = sum / 2.0f;
            float step = der * dt;
            x[j] = s->heun_sample[j] + step;
        }
    }
}

/* _sigma_to_alpha_sigma_t: alpha = 1 / (sigma**2 + 1) ** 0.5, sigma_t = sigma * alpha */
static void dpm_alpha_sigma(float sigma, float *alpha, float *sig)
{
    const float sq = sigma * sigma, p = sq + 1.0f;
    *alpha = 1.0f / sqrtf(p);
    *sig = sigma * *alpha;
}

/* lambda = log(alpha) - log(sigma_t) of a k-diffusion sigma */
static float dpm_lambda(float sigma, float *alpha, float *sig)
{
    dpm_alpha_sigma(sigma, alpha, sig);
    return logf(*alpha) - logf(*sig);
}

/* convert_model_output of DPM-Solver++ and UniPC (predict_x0): the data prediction x0 of the
 * model output at sigmas[i]: (x - sigma_t m) / alpha_t (epsilon) or alpha_t x - sigma_t m (v). */
static void multistep_x0(const sd_sampler *s, int i, const float *mo, const float *x, float *x0)
{
    float a, sg;
    dpm_alpha_sigma(s->sigmas[i], &a, &sg);
    for (int64_t j = 0; j < s->n; j++) {
        if (s->prediction == SD_PRED_V) {
            float p = a * x[j], q = sg * mo[j];
            x0[j] = p - q;
        } else {
            float q = sg * mo[j], d = x[j] - q;
            x0[j] = d / a;
        }
    }
}

/* DPMSolverMultistepScheduler.multistep_dpm_solver_third_order_update: D0 = m0, D1_0 = (m0 -
 * m1) / r0, D1_1 = (m1 - m2) / r1, D1 = D1_0 + r0 / (r0 + r1) (D1_0 - D1_1), D2 = (D1_0 - D1_1)
 * / (r0 + r1), with r0 = h_0 / h, r1 = h_1 / h; every scalar coefficient a 0-d fp32 tensor,
 * the tensor terms summed left to right, as diffusers writes them. */
static void dpm_third_order(sd_sampler *s, int i, const float *x0, float *x, const float *noise,
                            float lambda_s0, float lambda_t, float a_t, float c_x, float c_d,
                            float c_z)
{
    const int sde = s->kind == SD_SAMPLER_DPMPP_2M_SDE;
    float a_s1, s_s1, a_s2, s_s2;
    const float lambda_s1 = dpm_lambda(s->sigmas[i - 1], &a_s1, &s_s1);
    const float lambda_s2 = dpm_lambda(s->sigmas[i - 2], &a_s2, &s_s2);
    const float h = lambda_t - lambda_s0, h0 = lambda_s0 - lambda_s1, h1 = lambda_s1 - lambda_s2;
    const float r0 = h0 / h, r1 = h1 / h, inv_r0 = 1.0f / r0, inv_r1 = 1.0f / r1;
    const float r01 = r0 + r1, w1 = r0 / r01, inv_r01 = 1.0f / r01;
    const float e1 = expf(-h), e2 = expf(-2.0f * h);
    float c_1, c_2;
    if (sde) {
        /* alpha_t ((1 - exp(-2h)) / (-2h) + 1), alpha_t ((1 - exp(-2h) - 2h) / (2h)^2 - 0.5) */
        const float one_m = 1.0f - e2, m2h = -2.0f * h, q1 = one_m / m2h, p1 = q1 + 1.0f;
        const float h2 = 2.0f * h, num = one_m - h2, den = h2 * h2, q2 = num / den;
        c_1 = a_t * p1;
        c_2 = a_t * (q2 - 0.5f);
    } else {
        /* alpha_t ((exp(-h) - 1) / h + 1), alpha_t ((exp(-h) - 1 + h) / h^2 - 0.5) */
        const float em = e1 - 1.0f, q1 = em / h, p1 = q1 + 1.0f;
        const float num = em + h, hh = h * h, q2 = num / hh;
        c_1 = a_t * p1;
        c_2 = a_t * (q2 - 0.5f);
    }
    for (int64_t j = 0; j < s->n; j++) {
        const float m0 = x0[j], m1 = s->x0_prev[j], m2 = s->x0_prev2[j];
        const float dm0 = m0 - m1, dm1 = m1 - m2;
        const float d10 = inv_r0 * dm0, d11 = inv_r1 * dm1, dd = d10 - d11;
        const float wd = w1 * dd, d1 = d10 + wd, d2 = inv_r01 * dd;
        const float a = c_x * x[j], b = c_d * m0, c = c_1 * d1, d = c_2 * d2;
        float r;
        if (sde) { /* a + b + c + d + z */
            r = a + b;
            r = r + c;
            r = r + d;
            const float z = c_z * noise[j];
            r = r + z;
        } else { /* a - b + c - d */
            r = a - b;
            r = r + c;
            r = r - d;
        }
        x[j] = r;
    }
}

/* DPMSolverMultistepScheduler.step: dpmsolver++ or sde-dpmsolver++ (noise at every step),
 * solver_order 1, 2 or 3, midpoint or heun (order 2); the last step first order when
 * final_sigmas_type is 'zero', or with lower_order_final and fewer than 15 steps, or with
 * euler_at_final; the one before it at most second order with lower_order_final and fewer
 * than 15 steps. */
static void dpm_step(sd_sampler *s, int i, const float *mo, float *x, const float *noise)
{
    const int64_t n = s->n;
    const int sde = s->kind == SD_SAMPLER_DPMPP_2M_SDE;
    float a_s0, s_s0, a_t, s_t;
    float *x0 = s->tmp;
    multistep_x0(s, i, mo, x, x0);
    const float lambda_s0 = dpm_lambda(s->sigmas[i], &a_s0, &s_s0);
    const float lambda_t = dpm_lambda(s->sigmas[i + 1], &a_t, &s_t);
    const float h = lambda_t - lambda_s0;
    /* dpmsolver++: (sigma_t / sigma_s) x - (alpha_t (exp(-h) - 1)) D0 ...;
     * sde-dpmsolver++: (sigma_t / sigma_s exp(-h)) x + (alpha_t (1 - exp(-2h))) D0 ...
     *                  + sigma_t sqrt(1 - exp(-2h)) z */
    const float e1 = expf(-h), e2 = expf(-2.0f * h);
    const float ratio = s_t / s_s0;
    const float c_x = sde ? ratio * e1 : ratio;
    const float c_d = sde ? a_t * (1.0f - e2) : a_t * (e1 - 1.0f);
    const float c_z = sde ? s_t * sqrtf(1.0f - e2) : 0.0f;
    const int last = i == s->n_timesteps - 1;
    const int lower_final = last && (s->euler_at_final || (s->lower_order_final &&
                                                           s->n_timesteps < 15) ||
                                     s->final_sigma == 0.0f);
    const int lower_second = i == s->n_timesteps - 2 && s->lower_order_final &&
                             s->n_timesteps < 15;
    SD_CHECK(!sde || noise != NULL, "sde-dpmsolver++ step needs noise");
    if (s->dpm_order == 1 || s->lower_order_nums < 1 || lower_final) {
        for (int64_t j = 0; j < n; j++) {
            float a = c_x * x[j], b = c_d * x0[j];
            float r = sde ? a + b : a - b;
            if (sde) {
                float z = c_z * noise[j];
                r = r + z;
            }
            x[j] = r;
        }
    } else if (!(s->dpm_order == 2 || s->lower_order_nums < 2 || lower_second)) {
        dpm_third_order(s, i, x0, x, noise, lambda_s0, lambda_t, a_t, c_x, c_d, c_z);
    } else {
        /* second order: D0 = m0, D1 = (1 / r0) (m0 - m1), r0 = h_0 / h; the D1 coefficient is
         * 0.5 c_d (midpoint) or alpha_t ((exp(-h) - 1) / h + 1) (heun; sde: alpha_t ((1 -
         * exp(-2h)) / (-2h) + 1)) */
        float a_s1, s_s1;
        const float lambda_s1 = dpm_lambda(s->sigmas[i - 1], &a_s1, &s_s1);
        const float h0 = lambda_s0 - lambda_s1, r0 = h0 / h, inv_r0 = 1.0f / r0;
        float c_1;
        if (!s->dpm_heun)
            c_1 = 0.5f * c_d;
        else if (sde)
            c_1 = a_t * ((1.0f - e2) / (-2.0f * h) + 1.0f);
        else
            c_1 = a_t * ((e1 - 1.0f) / h + 1.0f);
        for (int64_t j = 0; j < n; j++) {
            float dm = x0[j] - s->x0_prev[j], d1 = inv_r0 * dm;
            float a = c_x * x[j], b = c_d * x0[j], c = c_1 * d1;
            float r;
            if (sde) { /* a + b + c + z */
                r = a + b;
                r = r + c;
                float z = c_z * noise[j];
                r = r + z;
            } else if (s->dpm_heun) { /* a - b + c */
                r = a - b;
                r = r + c;
            } else { /* a - b - c */
                r = a - b;
                r = r - c;
            }
            x[j] = r;
        }
    }
    if (s->lower_order_nums < s->dpm_order)
        s->lower_order_nums++;
    if (s->dpm_order == 3) { /* model_outputs shift: [-3] <- [-2] */
        float *t = s->x0_prev2;
        s->x0_prev2 = s->x0_prev;
        s->x0_prev = t;
    }
    memcpy(s->x0_prev, x0, (size_t)n * sizeof *x0);
}

int sd_sampler_pndm_prk(sd_sampler *s, sd_err *err)
{
    if (s->kind != SD_SAMPLER_PNDM)
        return sd_err_set(err, "sampler: the Runge-Kutta warm-up (skip_prk_steps false) is "
                               "PNDM's, not %s's", sd_sampler_kind_name(s->kind));
    if (s->n_prk > 0)
        return 0;
    const int N = s->num_steps, T = s->num_train_timesteps;
    if (N < 4)
        return sd_err_set(err, "sampler: pndm with the Runge-Kutta warm-up (skip_prk_steps "
                               "false) needs at least 4 steps (it replaces the last three base "
                               "steps; diffusers fails with fewer): %d given", N);
    /* b, the base timesteps descending, from the PLMS list [b0, b1, b1, b2, ...]; the warm-up
     * takes the steps b0 -> b1 -> b2 -> b3, each as 4 calls at b_k, b_(k+1) + T // N // 2 twice
     * and b_(k+1) (PNDMScheduler's prk_timesteps); then PLMS from b3 on */
#define BASE(k) s->timesteps[(k) == 0 ? 0 : (k) + 1]
    const int64_t half = (int64_t)(T / N) / 2;
    const int n_prk = 12, n_plms = N - 3;
    int64_t *ts = sd_xmalloc(((size_t)n_prk + (size_t)n_plms + 1) * sizeof *ts);
    for (int k = 0; k < 3; k++) {
        ts[4 * k] = BASE(k);
        ts[4 * k + 1] = ts[4 * k + 2] = BASE(k + 1) + half;
        ts[4 * k + 3] = BASE(k + 1);
    }
    for (int j = 0; j < n_plms; j++)
        ts[n_prk + j] = BASE(3 + j);
#undef BASE
    for (int j = 0; j < n_prk + n_plms; j++)
        if (ts[j] < 0 || ts[j] > T - 1) {
            const int64_t bad = ts[j];
            free(ts);
            return sd_err_set(err, "sampler: pndm with the Runge-Kutta warm-up (skip_prk_steps "
                                   "false), %d steps and '%s' spacing visits timestep %lld, outside "
                                   "the schedule's [0, %d) (diffusers fails there too): use "
                                   "skip_prk_steps, another spacing or other steps", N,
                              sd_spacing_name(s->spacing), (long long)bad, T);
        }
    free(s->timesteps);
    free(s->model_t);
    s->timesteps = ts;
    s->n_timesteps = n_prk + n_plms;
    s->model_t = sd_xmalloc(((size_t)s->n_timesteps + 1) * sizeof *s->model_t);
    for (int j = 0; j < s->n_timesteps; j++)
        s->model_t[j] = (float)ts[j];
    s->n_prk = n_prk;
    s->prk_acc = sd_xcalloc((size_t)s->n ? (size_t)s->n : 1, sizeof *s->prk_acc);
    return 0;
}

/* PNDMScheduler.step_prk: four model calls per Runge-Kutta step (counter % 4); each call's
 * sample from the step's starting sample, the fourth with the weighted sum (1/6, 1/3, 1/3, 1/6,
 * each weight an fp32 multiplier, summed in order). The first call's output joins ets. */
static void pndm_prk_step(sd_sampler *s, int i, const float *mo, float *sample)
{
    const int64_t n = s->n;
    const int64_t diff = s->counter % 2 ? 0 : (int64_t)(s->num_train_timesteps / s->num_steps) / 2;
    const int64_t prev_t = s->timesteps[i] - diff, t = s->timesteps[s->counter / 4 * 4];
    const float sixth = (float)(1.0 / 6.0), third = (float)(1.0 / 3.0);
    const float *m = mo;
    switch (s->counter % 4) {
    case 0:
        for (int64_t j = 0; j < n; j++)
            s->prk_acc[j] = sixth * mo[j];
        memcpy(s->ets[s->n_ets++], mo, (size_t)n * sizeof(float));
        memcpy(s->cur_sample, sample, (size_t)n * sizeof(float));
        break;
    case 1:
    case 2:
        for (int64_t j = 0; j < n; j++) {
            const float w = third * mo[j];
            s->prk_acc[j] = s->prk_acc[j] + w;
        }
        break;
    default:
        for (int64_t j = 0; j < n; j++) {
            const float w = sixth * mo[j];
            s->tmp[j] = s->prk_acc[j] + w;
        }
        m = s->tmp;
        break;
    }
    sd_pndm_prev_sample(s->alphas_cumprod, s->final_alpha_cumprod, s->prediction, t, prev_t, n,
                        m, s->cur_sample, sample);
    s->counter++;
}

/* PNDMScheduler.step_plms (skip_prk_steps, or after the warm-up). ets[0..n_ets) oldest first. */
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

/* torch.linalg.solve of a k x k fp32 system (k <= 3) as LAPACK's sgesv computes it: LU with
 * partial pivoting (the first largest |pivot|; the column below the pivot scaled by its
 * reciprocal), then the unit-lower and the upper triangular solves column by column. */
static void lapack_solve(int k, float a[3][3], float *x)
{
    int piv[3];
    for (int c = 0; c < k; c++) {
        int p = c;
        for (int r = c + 1; r < k; r++)
            if (fabsf(a[r][c]) > fabsf(a[p][c]))
                p = r;
        piv[c] = p;
        if (p != c)
            for (int j = 0; j < k; j++) {
                const float t = a[c][j];
                a[c][j] = a[p][j];
                a[p][j] = t;
            }
        const float inv = 1.0f / a[c][c];
        for (int r = c + 1; r < k; r++)
            a[r][c] = a[r][c] * inv;
        for (int r = c + 1; r < k; r++)
            for (int j = c + 1; j < k; j++) {
                const float m = a[r][c] * a[c][j];
                a[r][j] = a[r][j] - m;
            }
    }
    for (int c = 0; c < k; c++)
        if (piv[c] != c) {
            const float t = x[c];
            x[c] = x[piv[c]];
            x[piv[c]] = t;
        }
    for (int j = 0; j < k; j++) /* L y = b */
        for (int r = j + 1; r < k; r++) {
            const float m = x[j] * a[r][j];
            x[r] = x[r] - m;
        }
    for (int j = k - 1; j >= 0; j--) { /* U x = y */
        x[j] = x[j] / a[j][j];
        for (int r = 0; r < j; r++) {
            const float m = x[j] * a[r][j];
            x[r] = x[r] - m;
        }
    }
}

/* The rhos of UniPC's B(h) update of order `order` (1..3) from rks[0..order-2] (the last rk is
 * 1): b_i = h_phi_i i! / B_h with h_phi_1 = expm1(hh) / hh - 1, h_phi_{i+1} = h_phi_i / hh -
 * 1 / (i+1)!; the predictor (order >= 3) solves R[:-1, :-1] rhos = b[:-1], the corrector
 * (order >= 2) R rhos = b, R[i][k] = rks[k]^i; otherwise rhos = 0.5. */
static void unipc_rhos(int order, int corrector, const float *rks_in, float hh, float b_h,
                       float *rhos)
{
    float rks[3], bv[3], r[3][3];
    const int k = corrector ? order : order - 1;
    if ((corrector && order == 1) || (!corrector && order == 2)) {
        rhos[0] = 0.5f;
        return;
    }
    for (int i = 0; i < order - 1; i++)
        rks[i] = rks_in[i];
    rks[order - 1] = 1.0f;
    float h_phi = expm1f(hh) / hh - 1.0f, fact = 1.0f;
    for (int i = 1; i <= order; i++) {
        const float num = h_phi * fact;
        bv[i - 1] = num / b_h;
        fact = fact * (float)(i + 1);
        const float q = h_phi / hh;
        h_phi = q - (float)(1.0 / (double)fact);
    }
    for (int i = 0; i < k; i++)
        for (int c = 0; c < k; c++)
            r[i][c] = i == 0 ? 1.0f : i == 1 ? rks[c] : rks[c] * rks[c];
    for (int i = 0; i < k; i++)
        rhos[i] = bv[i];
    lapack_solve(k, r, rhos);
}

/* The scalars of one UniPC B(h) update from sigmas[i0] to sigmas[it] (the corrector: i - 1 to
 * i; the predictor: i to i + 1), with the D1s' nodes at sigmas[i0 - 1], sigmas[i0 - 2]:
 * predict_x0: hh = -h, x_t = (sigma_t / sigma_s0) x - alpha_t h_phi_1 m0 - alpha_t B_h res;
 * the noise form: hh = h, (alpha_t / alpha_s0) x - sigma_t h_phi_1 m0 - sigma_t B_h res. */
typedef struct unipc_coef {
    float c_x, c_m, c_r; /* the factors of x, m0 and res */
    float rks[2], rhos[3];
} unipc_coef;

static void unipc_coefs(const sd_sampler *s, int it, int i0, int order, int corrector,
                        unipc_coef *c)
{
    float a_t, s_t, a_0, s_0;
    const float lt = dpm_lambda(s->sigmas[it], &a_t, &s_t);
    const float l0 = dpm_lambda(s->sigmas[i0], &a_0, &s_0);
    const float h = lt - l0, hh = (s->unipc_eps ? 1.0f : -1.0f) * h, phi1 = expm1f(hh);
    const float bh = s->unipc_bh1 ? hh : phi1;
    for (int k = 1; k < order; k++) {
        float a_q, s_q;
        const float lk = dpm_lambda(s->sigmas[i0 - k], &a_q, &s_q), dl = lk - l0;
        c->rks[k - 1] = dl / h;
    }
    if (corrector || order >= 2)
        unipc_rhos(order, corrector, c->rks, hh, bh, c->rhos);
    c->c_x = s->unipc_eps ? a_t / a_0 : s_t / s_0;
    c->c_m = (s->unipc_eps ? s_t : a_t) * phi1;
    c->c_r = (s->unipc_eps ? s_t : a_t) * bh;
}

/* einsum("k,bkc...->bc...", rhos, D1s) at element j: sum over k of rhos[k - 1] (m_k - m0) / rk,
 * in order (order >= 2) */
static inline float unipc_d1_sum(const float *const m[3], int64_t j, int order,
                                 const unipc_coef *c)
{
    float sum = 0.0f;
    for (int k = 1; k < order; k++) {
        const float d = m[k][j] - m[0][j], d1 = d / c->rks[k - 1], term = c->rhos[k - 1] * d1;
        sum = k == 1 ? term : sum + term;
    }
    return sum;
}

/* UniPCMultistepScheduler (predict_x0 or the noise form; bh2 or bh1; solver_order 1, 2 or 3):
 * at step i, the corrector UniC refines the sample with the model output just computed (from
 * step 1 on, but at disable_corrector's steps), then the predictor UniP steps to
 * sigmas[i + 1]. x0_prev, x0_prev2, x0_prev3 hold model_outputs[-1], [-2], [-3]. */
static void unipc_step(sd_sampler *s, int i, const float *mo, float *x)
{
    const int64_t n = s->n;
    float *cur = s->tmp;
    const float *m[3];
    unipc_coef c;
    int use_corrector = i > 0 && s->unipc_order > 0;
    if (use_corrector && i - 1 < SD_SAMPLER_MAX_DISABLE &&
        (s->unipc_nocorr[(i - 1) / 8] >> ((i - 1) % 8) & 1))
        use_corrector = 0;
    if (!s->unipc_eps) {
        multistep_x0(s, i, mo, x, cur);
    } else { /* predict_x0 false: the model output as epsilon */
        float a, sg;
        dpm_alpha_sigma(s->sigmas[i], &a, &sg);
        for (int64_t j = 0; j < n; j++) {
            if (s->prediction == SD_PRED_V) {
                const float p = a * mo[j], q = sg * x[j];
                cur[j] = p + q;
            } else {
                cur[j] = mo[j];
            }
        }
    }
    if (use_corrector) {
        /* multistep_uni_c_bh_update from last_sample to this sample */
        const int order = s->unipc_order;
        unipc_coefs(s, i, i - 1, order, 1, &c);
        const float rho_last = c.rhos[order - 1];
        m[0] = s->x0_prev;
        m[1] = s->x0_prev2;
        m[2] = s->x0_prev3;
        for (int64_t j = 0; j < n; j++) {
            float p = c.c_x * s->last_sample[j], q = c.c_m * m[0][j];
            float base = p - q;
            float corr = order >= 2 ? unipc_d1_sum(m, j, order, &c) : 0.0f;
            float dt = cur[j] - m[0][j], e = rho_last * dt;
            float sum = corr + e, r = c.c_r * sum;
            x[j] = base - r;
        }
    }
    /* model_outputs = model_outputs[1:] + [cur] */
    float *old = s->x0_prev3;
    s->x0_prev3 = s->x0_prev2;
    s->x0_prev2 = s->x0_prev;
    s->x0_prev = old;
    memcpy(s->x0_prev, cur, (size_t)n * sizeof *cur);
    int order = s->lower_order_final && s->n_timesteps - i < s->dpm_order ? s->n_timesteps - i
                                                                         : s->dpm_order;
    if (order > s->lower_order_nums + 1)
        order = s->lower_order_nums + 1;
    s->unipc_order = order;
    memcpy(s->last_sample, x, (size_t)n * sizeof *x);
    /* multistep_uni_p_bh_update to sigmas[i + 1] */
    unipc_coefs(s, i + 1, i, order, 0, &c);
    m[0] = s->x0_prev;
    m[1] = s->x0_prev2;
    m[2] = s->x0_prev3;
    for (int64_t j = 0; j < n; j++) {
        float p = c.c_x * x[j], q = c.c_m * m[0][j];
        float r = p - q;
        if (order >= 2) { /* pred_res */
            float pr = unipc_d1_sum(m, j, order, &c), cr = c.c_r * pr;
            r = r - cr;
        }
        x[j] = r;
    }
    if (s->lower_order_nums < s->dpm_order)
        s->lower_order_nums++;
}

void sd_sampler_step(sd_sampler *s, int i, const float *model_out, float *sample,
                     const float *noise)
{
    SD_CHECK(i >= 0 && i < s->n_timesteps, "sampler step %d of %d", i, s->n_timesteps);
    const int64_t t = s->timesteps[i];
    switch (s->kind) {
    case SD_SAMPLER_DDIM:
        sd_ddim_step_eta(s->alphas_cumprod, s->final_alpha_cumprod, s->prediction,
                         s->clip_sample_range, s->eta, t, t - s->ratio, s->n, model_out, sample,
                         noise, sample);
        break;
    case SD_SAMPLER_DDPM: {
        /* previous_timestep: the next entry of the list, -1 after the last */
        int64_t prev_t = i + 1 < s->n_timesteps ? s->timesteps[i + 1] : -1;
        sd_ddpm_step(s->alphas_cumprod, s->prediction, s->clip_sample_range, t, prev_t, s->n,
                     model_out, sample, noise, sample);
        break;
    }
    case SD_SAMPLER_PNDM:
        if (s->counter < s->n_prk)
            pndm_prk_step(s, i, model_out, sample);
        else
            pndm_step(s, i, model_out, sample);
        break;
    case SD_SAMPLER_EULER:
    case SD_SAMPLER_EULER_A:
        euler_step(s, i, model_out, sample, noise);
        break;
    case SD_SAMPLER_HEUN:
        heun_step(s, i, model_out, sample);
        break;
    case SD_SAMPLER_LMS:
        lms_step(s, i, model_out, sample);
        break;
    case SD_SAMPLER_DPM2:
    case SD_SAMPLER_DPM2_A:
        dpm2_step(s, i, model_out, sample, noise);
        break;
    case SD_SAMPLER_DPMPP_SDE:
        sde_step(s, i, model_out, sample, noise);
        break;
    case SD_SAMPLER_UNIPC:
        unipc_step(s, i, model_out, sample);
        break;
    case SD_SAMPLER_DPMPP_2M:
    case SD_SAMPLER_DPMPP_2M_SDE:
        dpm_step(s, i, model_out, sample, noise);
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
