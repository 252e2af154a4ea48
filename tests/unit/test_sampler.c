/* Sampling against diffusers 0.42.1 (tests/data/sample/goldens.safetensors, written by
 * tests/reference/make_sample_goldens.py):
 *   - scheduler.timesteps of DDIM, PNDM (skip_prk_steps) and DDPM for several (N, T);
 *   - every scheduler's step sequence (5 steps, epsilon and v_prediction) on random inputs,
 *     bit for bit where our arithmetic is diffusers' (it is, in fp32: reported as exact count);
 *   - the whole StableDiffusionPipeline loop on the tiny-sd2 snapshot from prompt strings
 *     (tokenizer, text encoder, guided U-Net, scheduler, VAE decode), guidance 7.5 and 1.0, for
 *     each scheduler: relative error of latents and decoded images <= 1e-5, uint8 within 1;
 *   - the sampling random streams: rank- and order-independent slices, NHWC layout. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/diffusion.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/sampler.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/text2img.h"
#include "sdtrain/tokenizer.h"
#include "tap.h"

#define TOL 1e-5

static sd_st_file gold;
static char top[4096];

static sd_st_file gold2; /* schedulers.safetensors */

static float *read_from(sd_st_file *f, const char *name, size_t n)
{
    sd_err err;
    const sd_st_tensor *t = sd_st_find(f, name);
    float *buf = malloc((n ? n : 1) * sizeof(float));
    if (!t || (size_t)t->numel != n || sd_st_read_f32(f, name, buf, n, &err) != 0) {
        tap_diag("golden %s: %s", name, t ? "wrong size or unreadable" : "missing");
        free(buf);
        return NULL;
    }
    return buf;
}

static float *read_gold(const char *name, size_t n)
{
    return read_from(&gold, name, n);
}

static double rel_err(const float *y, const float *ref, int64_t n, double *max_abs)
{
    double num = 0.0, den = 0.0, mx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)y[i] - (double)ref[i];
        if (isnan(d))
            return INFINITY;
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (fabs(d) > mx)
            mx = fabs(d);
    }
    if (max_abs)
        *max_abs = mx;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int init_sd2_schedule(sd_diffusion *d, const char *pred, int T)
{
    sd_err err;
    if (sd_diffusion_init(d, "scaled_linear", 0.00085, 0.012, T, pred, SD_LINSPACE_FUSED, &err)) {
        tap_diag("%s", err.msg);
        return -1;
    }
    return 0;
}

static void test_timesteps(void)
{
    static const int Ts[] = {1000, 10, 500};
    static const int Ns[] = {1, 2, 4, 5, 7, 10, 50, 999, 1000};
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_DDIM, SD_SAMPLER_PNDM, SD_SAMPLER_DDPM};
    double ts[1002];
    int checked = 0, bad = 0, rejected = 0;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
            for (size_t k = 0; k < 3; k++) {
                char name[64];
                const int T = Ts[a], N = Ns[b];
                sd_err err;
                snprintf(name, sizeof name, "ts_%s_%d_%d", sd_sampler_kind_name(kinds[k]), N, T);
                const sd_st_tensor *t = sd_st_find(&gold, name);
                if (!t)
                    continue; /* N > T: diffusers refuses, so do we */
                float *ref = read_gold(name, (size_t)t->numel);
                int n = sd_sampler_timesteps(kinds[k], SD_SPACING_LEADING, N, T, 1, ts, &err);
                int in_range = 1;
                for (int64_t i = 0; ref && i < t->numel; i++)
                    in_range &= ref[i] < T;
                if (!in_range) {
                    /* diffusers lists t = T (N = T with steps_offset 1) and fails at the first
                     * step; we refuse up front */
                    rejected += n < 0;
                    bad += n >= 0;
                } else if (!ref || n != (int)t->numel) {
                    bad++;
                    tap_diag("%s: %d timesteps, expected %lld", name, n, (long long)t->numel);
                } else {
                    for (int i = 0; i < n; i++)
                        if ((float)ts[i] != ref[i]) {
                            bad++;
                            tap_diag("%s[%d] = %g, expected %g", name, i, ts[i], ref[i]);
                            break;
                        }
                }
                checked++;
                free(ref);
            }
    tap_ok(checked >= 60 && bad == 0, "timesteps of %d (scheduler, N, T) cases equal diffusers' "
           "(%d cases with t = T refused)", checked, rejected);
    {
        sd_err err;
        double out[8];
        tap_ok(sd_sampler_timesteps(SD_SAMPLER_DDIM, SD_SPACING_LEADING, 0, 1000, 1, out, &err) < 0 &&
                   sd_sampler_timesteps(SD_SAMPLER_DDIM, SD_SPACING_LEADING, 1001, 1000, 1, ts,
                                        &err) < 0,
               "0 steps and more steps than training timesteps are errors: %s", err.msg);
    }
}

static void test_steps(void)
{
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_DDIM, SD_SAMPLER_PNDM, SD_SAMPLER_DDPM};
    static const char *preds[] = {"epsilon", "v_prediction"}, *tags[] = {"eps", "v"};
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_gold("step_sample", (size_t)n);
    float *mo = read_gold("step_model_out", 6 * (size_t)n);
    float *z = read_gold("step_noise", 6 * (size_t)n);
    if (!tap_ok(x0 && mo && z, "step goldens present"))
        goto out;
    for (int p = 0; p < 2; p++) {
        sd_diffusion d;
        if (init_sd2_schedule(&d, preds[p], 1000))
            continue;
        for (int k = 0; k < 3; k++) {
            sd_sampler s;
            sd_err err;
            char name[64];
            float *x = malloc((size_t)n * sizeof *x), *ref;
            size_t exact = 0, total = 0;
            double worst = 0;
            if (sd_sampler_init(&s, kinds[k], &d, 5, SD_SPACING_LEADING, 1, n, &err)) {
                tap_ok(0, "sampler init: %s", err.msg);
                free(x);
                continue;
            }
            snprintf(name, sizeof name, "step_%s_%s", sd_sampler_kind_name(kinds[k]), tags[p]);
            ref = read_gold(name, (size_t)s.n_timesteps * (size_t)n);
            memcpy(x, x0, (size_t)n * sizeof *x);
            sd_sampler_reset(&s);
            for (int i = 0; ref && i < s.n_timesteps; i++) {
                sd_sampler_step(&s, i, mo + (size_t)i * n, x, z + (size_t)i * n);
                double e = rel_err(x, ref + (size_t)i * n, n, NULL);
                worst = e > worst ? e : worst;
                for (int64_t j = 0; j < n; j++, total++)
                    exact += memcmp(&x[j], &ref[(size_t)i * n + j], sizeof(float)) == 0;
            }
            tap_ok(ref && worst <= 1e-6, "%s: %d steps, relative error %.3g, %zu of %zu values "
                   "bit-identical", name, s.n_timesteps, worst, exact, total);
            if (ref && exact != total)
                tap_diag("%s: %zu values differ in the last bits", name, total - exact);
            free(ref);
            free(x);
            sd_sampler_free(&s);
        }
        sd_diffusion_free(&d);
    }
    /* clip_sample (DDIM, DDPM) and set_alpha_to_one (DDIM), as a scheduler_config.json sets */
    for (int k = 0; k < 2; k++) {
        sd_diffusion d;
        sd_sampler s;
        sd_err err;
        const sd_sampler_kind kind = k ? SD_SAMPLER_DDPM : SD_SAMPLER_DDIM;
        char name[64];
        float *x = malloc((size_t)n * sizeof *x), *ref;
        double worst = 0;
        size_t clipped = 0;
        if (init_sd2_schedule(&d, "epsilon", 1000) ||
            sd_sampler_init(&s, kind, &d, 5, SD_SPACING_LEADING, 1, n, &err)) {
            tap_ok(0, "clip sampler init");
            free(x);
            continue;
        }
        s.clip_sample_range = 1.0f;
        if (kind == SD_SAMPLER_DDIM)
            s.final_alpha_cumprod = 1.0f;
        snprintf(name, sizeof name, "step_%s_clip", sd_sampler_kind_name(kind));
        ref = read_gold(name, (size_t)s.n_timesteps * (size_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] = x0[j] * 3.0f;
        for (int i = 0; ref && i < s.n_timesteps; i++) {
            sd_sampler_step(&s, i, mo + (size_t)i * n, x, z + (size_t)i * n);
            double e = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = e > worst ? e : worst;
        }
        /* the option must matter: without clipping the first step differs */
        {
            float y[2 * 3 * 5 * 4], w0[2 * 3 * 5 * 4];
            for (int64_t j = 0; j < n; j++)
                w0[j] = x0[j] * 3.0f;
            if (kind == SD_SAMPLER_DDIM)
                sd_ddim_step(d.alphas_cumprod, 1.0f, SD_PRED_EPSILON, 0.0f, s.timesteps[0],
                             s.timesteps[0] - s.ratio, n, mo, w0, y);
            else
                sd_ddpm_step(d.alphas_cumprod, SD_PRED_EPSILON, 0.0f, s.timesteps[0],
                             s.timesteps[1], n, mo, w0, z, y);
            for (int64_t j = 0; ref && j < n; j++)
                clipped += fabsf(y[j] - ref[j]) > 1e-4f;
        }
        tap_ok(ref && worst <= 1e-6 && clipped > 0, "%s: relative error %.3g (%zu values changed "
               "by the clipping)", name, worst, clipped);
        free(ref);
        free(x);
        sd_sampler_free(&s);
        sd_diffusion_free(&d);
    }
out:
    free(x0);
    free(mo);
    free(z);
}

/* schedulers.safetensors: timesteps of every scheduler with every spacing and offset, the
 * sigmas and init_noise_sigma of the sigma schedulers */
static void test_spacings(void)
{
    static const struct {
        int T, nn, Ns[9];
    } grid[] = {{1000, 9, {1, 2, 3, 4, 7, 10, 50, 999, 1000}},
                {10, 7, {1, 2, 3, 4, 7, 9, 10}},
                {500, 5, {1, 3, 7, 50, 500}}};
    static double ts[2002];
    int checked = 0, bad = 0, refused = 0, sig_cases = 0, sig_bad = 0, sig_exact = 0, sig_total = 0;
    double sig_worst = 0.0;
    for (size_t a = 0; a < sizeof grid / sizeof grid[0]; a++) {
        const int T = grid[a].T;
        sd_diffusion d;
        if (init_sd2_schedule(&d, "epsilon", T))
            continue;
        for (int b = 0; b < grid[a].nn; b++)
            for (int k = 0; k < SD_SAMPLER_N_KINDS; k++)
                for (int sp = 0; sp < 3; sp++)
                    for (int off = 0; off < 2; off++) {
                        const int N = grid[a].Ns[b], sig = k >= SD_SAMPLER_EULER;
                        /* Heun's goldens have keys of their own and a smaller grid; the SDE
                         * variant spaces as dpmpp_2m does */
                        const char *pre = k == SD_SAMPLER_HEUN ? "h" : "";
                        char tag[96], name[112];
                        sd_err err;
                        if (k == SD_SAMPLER_DPMPP_2M_SDE || k == SD_SAMPLER_LMS ||
                            k == SD_SAMPLER_DPM2 || k == SD_SAMPLER_DPM2_A ||
                            k == SD_SAMPLER_DPMPP_SDE)
                            continue; /* test_lms, test_dpm2, test_dpmsde */
                        snprintf(tag, sizeof tag, "%s_%s_%d_%d_%d",
                                 sd_sampler_kind_name((sd_sampler_kind)k),
                                 sd_spacing_name((sd_spacing)sp), N, T, off);
                        snprintf(name, sizeof name, "%sts_%s", pre, tag);
                        const sd_st_tensor *t = sd_st_find(&gold2, name);
                        if (!t && k == SD_SAMPLER_HEUN)
                            continue;
                        float *ref = t ? read_from(&gold2, name, (size_t)t->numel) : NULL;
                        if (!ref) {
                            bad++;
                            tap_diag("%s: no golden", name);
                            continue;
                        }
                        int valid = 1;
                        const int multistep = k == SD_SAMPLER_DPMPP_2M || k == SD_SAMPLER_UNIPC;
                        for (int64_t i = 0; i < t->numel; i++)
                            valid &= ref[i] >= 0.0f && ref[i] <= (float)(T - 1) &&
                                     (!sig || i == 0 || ref[i] != ref[0]) &&
                                     (!multistep || i == 0 || ref[i] != ref[i - 1]);
                        int n = sd_sampler_timesteps((sd_sampler_kind)k, (sd_spacing)sp, N, T,
                                                     off, ts, &err);
                        checked++;
                        if (!valid) {
                            /* diffusers would index alphas_cumprod with it (wrapping around),
                             * find the wrong step, or (a repeat in a multistep solver) divide
                             * by a zero step: refused up front */
                            if (n >= 0) {
                                bad++;
                                tap_diag("%s: accepted, diffusers gives an unusable schedule", name);
                            } else {
                                refused++;
                            }
                            free(ref);
                            continue;
                        }
                        if (n != (int)t->numel) {
                            bad++;
                            tap_diag("%s: %d timesteps, expected %lld (%s)", name, n,
                                     (long long)t->numel, n < 0 ? err.msg : "");
                            free(ref);
                            continue;
                        }
                        for (int i = 0; i < n; i++)
                            if ((float)ts[i] != ref[i]) {
                                bad++;
                                tap_diag("%s[%d] = %.9g, expected %.9g", name, i, ts[i], ref[i]);
                                break;
                            }
                        free(ref);
                        if (!sig)
                            continue;
                        sd_sampler s;
                        snprintf(name, sizeof name, "%ssig_%s", pre, tag);
                        float *rs = read_from(&gold2, name, (size_t)n + 1);
                        snprintf(name, sizeof name, "%sins_%s", pre, tag);
                        float *ri = read_from(&gold2, name, 1);
                        if (!rs || !ri ||
                            sd_sampler_init(&s, (sd_sampler_kind)k, &d, N, (sd_spacing)sp, off, 1,
                                            &err)) {
                            sig_bad++;
                        } else {
                            double w = 0.0;
                            for (int i = 0; i <= n; i++) {
                                double e = fabs((double)s.sigmas[i] - rs[i]) /
                                           (rs[i] != 0.0f ? fabs((double)rs[i]) : 1.0);
                                w = e > w ? e : w;
                                sig_exact += s.sigmas[i] == rs[i];
                                sig_total++;
                            }
                            double e = fabs((double)s.init_noise_sigma - ri[0]) / fabs((double)ri[0]);
                            w = e > w ? e : w;
                            sig_worst = w > sig_worst ? w : sig_worst;
                            if (w > 1e-6) {
                                sig_bad++;
                                tap_diag("%s: sigmas / init_noise_sigma relative error %.3g", tag, w);
                            }
                            sig_cases++;
                            sd_sampler_free(&s);
                        }
                        free(rs);
                        free(ri);
                    }
        sd_diffusion_free(&d);
    }
    tap_ok(checked >= 800 && bad == 0, "timesteps of %d (scheduler, spacing, N, T, steps_offset) "
           "cases equal diffusers' (%d unusable schedules refused)", checked, refused);
    tap_ok(sig_cases >= 400 && sig_bad == 0, "sigmas and init_noise_sigma of %d Euler / Euler "
           "ancestral / Heun / DPM-Solver++ / UniPC schedules: relative error <= %.3g (%d of %d "
           "sigmas bit-identical)", sig_cases, sig_worst, sig_exact, sig_total);
}

/* How far a sampler's schedule is from diffusers' (rt, rs, ri: its timesteps [nt], sigmas
 * [nt + 1], init_noise_sigma): the largest timestep difference (*wt) and relative error of the
 * sigmas and init_noise_sigma (*ws); counts the bit-identical sigmas when exact / total are given. */
static void schedule_err(const sd_sampler *s, const float *rt, const float *rs, const float *ri,
                         int nt, double *wt, double *ws, int *exact, int *total)
{
    *wt = *ws = 0.0;
    for (int i = 0; i < nt; i++) {
        const double e = fabs((double)s->model_t[i] - rt[i]);
        *wt = e > *wt ? e : *wt;
    }
    for (int i = 0; i <= nt; i++) {
        const double e = fabs((double)s->sigmas[i] - rs[i]) / (rs[i] != 0.0f ? rs[i] : 1.0f);
        *ws = e > *ws ? e : *ws;
        if (exact)
            *exact += s->sigmas[i] == rs[i];
        if (total)
            (*total)++;
    }
    const double e = fabs((double)s->init_noise_sigma - ri[0]) / ri[0];
    *ws = e > *ws ? e : *ws;
}

/* schedulers.safetensors: Karras sigmas (Euler after each spacing, DPM-Solver++), T = 1000 */
static void test_karras(int expo)
{
    static const int Ns[] = {1, 2, 3, 4, 7, 10, 25, 50, 100, 500};
    const char pre = expo ? 'e' : 'k';
    sd_diffusion d;
    int cases = 0, bad = 0, exact = 0, total = 0;
    double worst_t = 0.0, worst_s = 0.0;
    if (init_sd2_schedule(&d, "epsilon", 1000))
        return;
    for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
        for (int k = 0; k < 4; k++) {
            const sd_sampler_kind kind = k < 3 ? SD_SAMPLER_EULER : SD_SAMPLER_DPMPP_2M;
            const sd_spacing sp = k < 3 ? (sd_spacing)((k + 2) % 3) : SD_SPACING_LINSPACE;
            const int N = Ns[b];
            char tag[64], name[80];
            sd_sampler s;
            sd_err err;
            snprintf(tag, sizeof tag, "%s_%s_%d", sd_sampler_kind_name(kind), sd_spacing_name(sp), N);
            snprintf(name, sizeof name, "%cts_%s", pre, tag);
            float *rt = read_from(&gold2, name, (size_t)N);
            snprintf(name, sizeof name, "%csig_%s", pre, tag);
            float *rs = read_from(&gold2, name, (size_t)N + 1);
            snprintf(name, sizeof name, "%cins_%s", pre, tag);
            float *ri = read_from(&gold2, name, 1);
            if (!rt || !rs || !ri || sd_sampler_init(&s, kind, &d, N, sp, 1, 1, &err) ||
                (expo ? sd_sampler_use_exponential(&s, &err) : sd_sampler_use_karras(&s, &err))) {
                bad++;
                tap_diag("%s: %s", tag, rt && rs && ri ? err.msg : "no golden");
            } else {
                double wt, ws;
                schedule_err(&s, rt, rs, ri, N, &wt, &ws, &exact, &total);
                /* DPM-Solver++ rounds its timesteps: they must be equal */
                if (ws > 1e-6 || wt > (kind == SD_SAMPLER_DPMPP_2M ? 0.0 : 1e-3)) {
                    bad++;
                    tap_diag("%s: timesteps off by %.3g, sigmas relative error %.3g", tag, wt, ws);
                }
                worst_t = wt > worst_t ? wt : worst_t;
                worst_s = ws > worst_s ? ws : worst_s;
                cases++;
                sd_sampler_free(&s);
            }
            free(rt);
            free(rs);
            free(ri);
        }
    tap_ok(cases == 40 && bad == 0, "%s sigmas of %d schedules (Euler after three spacings, "
           "DPM-Solver++; N 1..500): timesteps within %.3g (DPM-Solver++'s equal), sigmas and "
           "init_noise_sigma relative error <= %.3g (%d of %d sigmas bit-identical)",
           expo ? "exponential" : "Karras", cases, worst_t, worst_s, exact, total);
    if (!expo) {
        sd_sampler s;
        sd_err err;
        int ok = sd_sampler_init(&s, SD_SAMPLER_EULER_A, &d, 5, SD_SPACING_LINSPACE, 1, 1, &err) == 0 &&
                 sd_sampler_use_karras(&s, &err) < 0;
        tap_ok(ok, "Karras sigmas for euler_a are refused: %s", err.msg);
        sd_sampler_free(&s);
    }
    sd_diffusion_free(&d);
}

/* schedulers.safetensors: 5 steps of every new case on random inputs */
static void test_steps_more(void)
{
    typedef struct {
        char name[48];
        sd_sampler_kind kind;
        sd_spacing spacing;
        int offset, v;
        double eta;
        int karras; /* 1: Karras sigmas, 2: exponential */
        /* DPM-Solver++ options and final_sigmas_type 'sigma_min' */
        int order, heun, sigma_min, lof, eaf;
    } step_case;
    step_case cases[48];
    int nc = 0;
    static const sd_sampler_kind sk[] = {SD_SAMPLER_EULER, SD_SAMPLER_EULER_A,
                                         SD_SAMPLER_DPMPP_2M};
    static const sd_sampler_kind ik[] = {SD_SAMPLER_DDIM, SD_SAMPLER_PNDM, SD_SAMPLER_DDPM};
    for (int k = 0; k < 3; k++)
        for (int sp = 0; sp < 2; sp++)
            for (int v = 0; v < 2; v++) {
                step_case *c = &cases[nc++];
                c->kind = sk[k];
                c->spacing = sp ? SD_SPACING_LEADING : SD_SPACING_LINSPACE;
                c->offset = sp;
                c->v = v;
                c->eta = 0.0;
                c->karras = 0;
                c->order = 2;
                c->heun = c->sigma_min = c->eaf = 0;
                c->lof = 1;
                snprintf(c->name, sizeof c->name, "step_%s_%s_%s", sd_sampler_kind_name(sk[k]),
                         sd_spacing_name(c->spacing), v ? "v" : "eps");
            }
    for (int k = 0; k < 2; k++) {
        step_case *c = &cases[nc++];
        *c = (step_case){"", k ? SD_SAMPLER_DPMPP_2M : SD_SAMPLER_EULER, SD_SPACING_LINSPACE, 1,
                         0, 0.0, 1, 2, 0, 0, 1, 0};
        snprintf(c->name, sizeof c->name, "step_%s_karras_eps", sd_sampler_kind_name(c->kind));
    }
    for (int v = 0; v < 2; v++) {
        step_case *c = &cases[nc++];
        *c = (step_case){"", SD_SAMPLER_DDIM, SD_SPACING_LEADING, 1, v, 0.8, 0, 2, 0, 0, 1, 0};
        snprintf(c->name, sizeof c->name, "step_ddim_eta_%s", v ? "v" : "eps");
    }
    for (int k = 0; k < 3; k++)
        for (int sp = 0; sp < 2; sp++) {
            step_case *c = &cases[nc++];
            *c = (step_case){"", ik[k], sp ? SD_SPACING_LINSPACE : SD_SPACING_TRAILING, 1, 0, 0, 0,
                             2, 0, 0, 1, 0};
            snprintf(c->name, sizeof c->name, "step_%s_%s_eps", sd_sampler_kind_name(ik[k]),
                     sd_spacing_name(c->spacing));
        }
    {
        static const struct {
            const char *name;
            sd_sampler_kind kind;
            int karras, order, heun, sigma_min, lof, eaf;
        } dpm[] = {
            {"step_dpmpp_2m_sde_eps", SD_SAMPLER_DPMPP_2M_SDE, 0, 2, 0, 0, 1, 0},
            {"step_dpmpp_2m_sde_karras_eps", SD_SAMPLER_DPMPP_2M_SDE, 1, 2, 0, 0, 1, 0},
            {"step_dpmpp_2m_heun_eps", SD_SAMPLER_DPMPP_2M, 0, 2, 1, 0, 1, 0},
            {"step_dpmpp_2m_sde_heun_eps", SD_SAMPLER_DPMPP_2M_SDE, 0, 2, 1, 0, 1, 0},
            {"step_dpmpp_2m_order1_eps", SD_SAMPLER_DPMPP_2M, 0, 1, 0, 0, 1, 0},
            {"step_dpmpp_2m_sigma_min_eps", SD_SAMPLER_DPMPP_2M, 0, 2, 0, 1, 1, 0},
            {"step_dpmpp_2m_sigma_min_nolof_eps", SD_SAMPLER_DPMPP_2M, 0, 2, 0, 1, 0, 0},
            {"step_dpmpp_2m_sigma_min_eaf_eps", SD_SAMPLER_DPMPP_2M, 0, 2, 0, 1, 0, 1},
            {"step_euler_sigma_min_eps", SD_SAMPLER_EULER, 0, 2, 0, 1, 1, 0},
            {"step_euler_expo_eps", SD_SAMPLER_EULER, 2, 2, 0, 0, 1, 0},
            {"step_dpmpp_2m_expo_eps", SD_SAMPLER_DPMPP_2M, 2, 2, 0, 0, 1, 0},
            {"step_heun_linspace_eps", SD_SAMPLER_HEUN, 0, 2, 0, 0, 1, 0},
            {"step_heun_karras_eps", SD_SAMPLER_HEUN, 1, 2, 0, 0, 1, 0},
            {"step_unipc_eps", SD_SAMPLER_UNIPC, 0, 2, 0, 0, 1, 0},
            {"step_unipc_karras_eps", SD_SAMPLER_UNIPC, 1, 2, 0, 0, 1, 0},
            {"step_unipc_order1_eps", SD_SAMPLER_UNIPC, 0, 1, 0, 0, 1, 0},
            {"step_unipc_sigma_min_eps", SD_SAMPLER_UNIPC, 0, 2, 0, 1, 1, 0},
        };
        for (size_t k = 0; k < sizeof dpm / sizeof dpm[0]; k++) {
            step_case *c = &cases[nc++];
            *c = (step_case){"", dpm[k].kind, SD_SPACING_LINSPACE, 1, 0, 0.0, dpm[k].karras,
                             dpm[k].order, dpm[k].heun, dpm[k].sigma_min, dpm[k].lof, dpm[k].eaf};
            snprintf(c->name, sizeof c->name, "%s", dpm[k].name);
        }
    }
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold2, "step_sample", (size_t)n);
    float *mo = read_from(&gold2, "step_model_out", 6 * (size_t)n);
    float *z = read_from(&gold2, "step_noise", 6 * (size_t)n);
    sd_diffusion dd[2];
    if (!tap_ok(x0 && mo && z && !init_sd2_schedule(&dd[0], "epsilon", 1000) &&
                    !init_sd2_schedule(&dd[1], "v_prediction", 1000),
                "schedulers.safetensors step goldens present"))
        goto out;
    /* Heun's v_prediction and leading spacing */
    {
        step_case *c = &cases[nc++];
        *c = (step_case){"step_heun_linspace_v", SD_SAMPLER_HEUN, SD_SPACING_LINSPACE, 1, 1, 0.0,
                         0, 2, 0, 0, 1, 0};
        c = &cases[nc++];
        *c = (step_case){"step_heun_leading_eps", SD_SAMPLER_HEUN, SD_SPACING_LEADING, 1, 0, 0.0,
                         0, 2, 0, 0, 1, 0};
        c = &cases[nc++];
        *c = (step_case){"step_unipc_v", SD_SAMPLER_UNIPC, SD_SPACING_LINSPACE, 1, 1, 0.0, 0, 2,
                         0, 0, 1, 0};
        c = &cases[nc++];
        *c = (step_case){"step_unipc_leading_eps", SD_SAMPLER_UNIPC, SD_SPACING_LEADING, 1, 0, 0.0,
                         0, 2, 0, 0, 1, 0};
    }
    float *mo_heun = read_from(&gold2, "step_model_out_heun", 9 * (size_t)n);
    for (int ci = 0; ci < nc; ci++) {
        const step_case *c = &cases[ci];
        const float *m_all = c->kind == SD_SAMPLER_HEUN ? mo_heun : mo;
        sd_sampler s;
        sd_err err;
        float x[2 * 3 * 5 * 4], *ref;
        size_t exact = 0, total = 0;
        double worst = 0;
        if (sd_sampler_init(&s, c->kind, &dd[c->v], 5, c->spacing, c->offset, n, &err) ||
            (c->sigma_min && sd_sampler_final_sigma_min(&s, &err)) ||
            (c->karras == 1 && sd_sampler_use_karras(&s, &err)) ||
            (c->karras == 2 && sd_sampler_use_exponential(&s, &err))) {
            tap_ok(0, "%s: %s", c->name, err.msg);
            continue;
        }
        s.eta = c->eta;
        s.dpm_order = c->order;
        s.dpm_heun = c->heun;
        s.lower_order_final = c->lof;
        s.euler_at_final = c->eaf;
        ref = read_from(&gold2, c->name, (size_t)s.n_timesteps * (size_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] = x0[j] * s.init_noise_sigma;
        sd_sampler_reset(&s);
        for (int i = 0; ref && m_all && i < s.n_timesteps; i++) {
            sd_sampler_step(&s, i, m_all + (size_t)i * n, x,
                            sd_sampler_step_noise(&s, i) ? z + (size_t)i * n : NULL);
            double e = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = e > worst ? e : worst;
            for (int64_t j = 0; j < n; j++, total++)
                exact += memcmp(&x[j], &ref[(size_t)i * n + j], sizeof(float)) == 0;
        }
        tap_ok(ref && worst <= 1e-6, "%s: %d steps, relative error %.3g, %zu of %zu values "
               "bit-identical", c->name, s.n_timesteps, worst, exact, total);
        free(ref);
        sd_sampler_free(&s);
    }
    {
        /* 16 steps ending at sigma_min: from 15 steps on the last step is second order */
        float *mo16 = read_from(&gold2, "step16_model_out", 16 * (size_t)n);
        for (int k = 0; k < 2; k++) {
            const char *name = k ? "step16_unipc_eps" : "step16_dpmpp_2m_sigma_min_eps";
            float *ref = read_from(&gold2, name, 16 * (size_t)n);
            sd_sampler s;
            sd_err err;
            float x[2 * 3 * 5 * 4];
            double worst = 0.0;
            int ok = mo16 && ref &&
                     sd_sampler_init(&s, k ? SD_SAMPLER_UNIPC : SD_SAMPLER_DPMPP_2M, &dd[0], 16,
                                     SD_SPACING_LINSPACE, 1, n, &err) == 0 &&
                     (k || sd_sampler_final_sigma_min(&s, &err) == 0);
            if (ok) {
                memcpy(x, x0, sizeof x);
                sd_sampler_reset(&s);
                for (int i = 0; i < 16; i++) {
                    sd_sampler_step(&s, i, mo16 + (size_t)i * n, x, NULL);
                    double e = rel_err(x, ref + (size_t)i * n, n, NULL);
                    worst = e > worst ? e : worst;
                }
                sd_sampler_free(&s);
            }
            tap_ok(ok && worst <= 1e-6, "%s: 16 steps, relative error %.3g", name, worst);
            free(ref);
        }
        free(mo16);
    }
    free(mo_heun);
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
out:
    free(x0);
    free(mo);
    free(z);
}

/* zero_snr.safetensors: the cosine schedule and zero terminal SNR (make_zero_snr_goldens.py) */
static sd_st_file gold3;

/* schedule `which`: 0 cos, 1 zsnr (SD2 rescaled), 2 cos_zsnr, 3 linear_zsnr */
static int zsnr_schedule(sd_diffusion *d, int which, const char *pred, sd_err *err)
{
    const int lin = which == 3, cosine = which == 0 || which == 2;
    if (sd_diffusion_init(d, cosine ? "squaredcos_cap_v2" : lin ? "linear" : "scaled_linear",
                          lin ? 0.0001 : 0.00085, lin ? 0.02 : 0.012, 1000, pred,
                          SD_LINSPACE_FUSED, err))
        return -1;
    if (which >= 1 && sd_diffusion_rescale_zero_snr(d, err)) {
        sd_diffusion_free(d);
        return -1;
    }
    return 0;
}

static void test_zero_snr(void)
{
    static const char *sched_names[4] = {"cos", "zsnr", "cos_zsnr", "linear_zsnr"};
    for (int w = 0; w < 4; w++) {
        sd_diffusion d;
        sd_err err;
        char name[64];
        size_t bad_b = 0, bad_a = 0;
        double rb = 0.0, ra = 0.0;
        if (zsnr_schedule(&d, w, "v_prediction", &err) != 0) {
            tap_ok(0, "schedule %s: %s", sched_names[w], err.msg);
            continue;
        }
        snprintf(name, sizeof name, "betas_%s", sched_names[w]);
        float *gb = read_from(&gold3, name, 1000);
        snprintf(name, sizeof name, "abar_%s", sched_names[w]);
        float *ga = read_from(&gold3, name, 1000);
        for (int i = 0; gb && ga && i < 1000; i++) {
            bad_b += memcmp(&d.betas[i], &gb[i], sizeof(float)) != 0;
            bad_a += memcmp(&d.alphas_cumprod[i], &ga[i], sizeof(float)) != 0;
            const double eb = fabs((double)d.betas[i] - gb[i]) / gb[i],
                         ea = ga[i] > 0.0f ? fabs((double)d.alphas_cumprod[i] - ga[i]) / ga[i]
                                           : fabs((double)d.alphas_cumprod[i]);
            rb = eb > rb ? eb : rb;
            ra = ea > ra ? ea : ra;
        }
        /* the cosine schedule bit for bit; the rescaled ones within torch's sqrt (above) */
        tap_ok(gb && ga && (w == 0 ? bad_b == 0 && bad_a == 0 : ra <= 1e-5) &&
                   d.zero_snr == (w >= 1) &&
                   (w == 0 || (d.alphas_cumprod[999] == 0.0f && d.snr[999] == 0.0f &&
                               d.sqrt_one_minus_abar[999] == 1.0f)),
               "schedule %s: betas / alphas_cumprod %zu / %zu of 1000 differ from diffusers' "
               "(max relative error %.3g / %.3g%s)%s", sched_names[w], bad_b, bad_a, rb, ra,
               w ? ", abar within 1e-5" : ", bit-identical",
               w ? "; abar, SNR 0 at t = 999" : "");
        free(gb);
        free(ga);
        sd_diffusion_free(&d);
    }

    typedef struct {
        const char *name;
        sd_sampler_kind kind;
        sd_spacing spacing;
        int which, v, karras;
    } zcase;
    static const zcase cases[] = {
        {"zsnr_ddim_trailing_v", SD_SAMPLER_DDIM, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_ddpm_trailing_v", SD_SAMPLER_DDPM, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_euler_trailing_v", SD_SAMPLER_EULER, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_euler_a_trailing_v", SD_SAMPLER_EULER_A, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_dpmpp_2m_trailing_v", SD_SAMPLER_DPMPP_2M, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_dpmpp_2m_sde_trailing_v", SD_SAMPLER_DPMPP_2M_SDE, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_unipc_trailing_v", SD_SAMPLER_UNIPC, SD_SPACING_TRAILING, 1, 1, 0},
        {"zsnr_ddim_leading_v", SD_SAMPLER_DDIM, SD_SPACING_LEADING, 1, 1, 0},
        {"zsnr_euler_leading_v", SD_SAMPLER_EULER, SD_SPACING_LEADING, 1, 1, 0},
        {"zsnr_dpmpp_2m_karras_v", SD_SAMPLER_DPMPP_2M, SD_SPACING_LINSPACE, 1, 1, 1},
        {"zsnr_euler_karras_v", SD_SAMPLER_EULER, SD_SPACING_LINSPACE, 1, 1, 1},
        {"cos_ddim_eps", SD_SAMPLER_DDIM, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_pndm_eps", SD_SAMPLER_PNDM, SD_SPACING_LEADING, 0, 0, 0},
        {"cos_euler_eps", SD_SAMPLER_EULER, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_euler_a_eps", SD_SAMPLER_EULER_A, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_heun_eps", SD_SAMPLER_HEUN, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_dpmpp_2m_eps", SD_SAMPLER_DPMPP_2M, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_unipc_eps", SD_SAMPLER_UNIPC, SD_SPACING_LINSPACE, 0, 0, 0},
        {"cos_unipc_karras_eps", SD_SAMPLER_UNIPC, SD_SPACING_LINSPACE, 0, 0, 1},
    };
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold3, "in_sample", (size_t)n);
    float *mo = read_from(&gold3, "in_model_out", 9 * (size_t)n);
    float *z = read_from(&gold3, "in_noise", 9 * (size_t)n);
    /* Zero-SNR cases run twice: on diffusers' own alphas_cumprod (the scheduler code alone)
     * and on sdtrain's. The two schedules differ by up to 4e-6 relative: this torch's float
     * sqrt on the CPU is not correctly rounded (1 ulp off for ~20 % of inputs, MKL's vector
     * sqrt; sdtrain's sqrtf is), and the rescale's s - s[T-1] cancels near T. The same sqrt
     * gives diffusers' sigma table ((1 - abar) / abar) ** 0.5, 1 ulp off here and there. Where
     * the first sigma is 4096 (Euler and Euler ancestral, 'trailing': abar[T-1] = 2^-24) the
     * first step cancels latents of size ~4096 down to ~7, which turns such an ulp into 3e-5 of
     * the result (torch's own float ops are reproduced exactly, checked with numpy): tolerance
     * 1e-4 there and on sdtrain's schedule, 1e-6 otherwise. */
    for (size_t ci = 0; x0 && mo && z && ci < sizeof cases / sizeof cases[0]; ci++) {
        const zcase *c = &cases[ci];
        for (int own = c->which == 0; own < 2; own++) {
            sd_diffusion d;
            sd_sampler s;
            sd_err err;
            char name[80];
            float x[2 * 3 * 5 * 4];
            double worst = 0.0, wt = 0.0, ws = 0.0;
            const int big_sigma = c->which && c->spacing == SD_SPACING_TRAILING &&
                                  (c->kind == SD_SAMPLER_EULER || c->kind == SD_SAMPLER_EULER_A);
            const double tol = (own && c->which) || big_sigma ? 1e-4 : 1e-6;
            if (zsnr_schedule(&d, c->which, c->v ? "v_prediction" : "epsilon", &err)) {
                tap_ok(0, "%s: %s", c->name, err.msg);
                continue;
            }
            if (!own) {
                float *ga = read_from(&gold3, "abar_zsnr", 1000);
                if (ga)
                    memcpy(d.alphas_cumprod, ga, 1000 * sizeof *ga);
                free(ga);
            }
            if (sd_sampler_init(&s, c->kind, &d, 5, c->spacing, 1, n, &err) ||
                (c->karras && sd_sampler_use_karras(&s, &err))) {
                tap_ok(0, "%s: %s", c->name, err.msg);
                sd_sampler_free(&s);
                sd_diffusion_free(&d);
                continue;
            }
            const int nt = s.n_timesteps;
            snprintf(name, sizeof name, "ts_%s", c->name);
            float *rt = read_from(&gold3, name, (size_t)nt);
            snprintf(name, sizeof name, "step_%s", c->name);
            float *ref = read_from(&gold3, name, (size_t)nt * (size_t)n);
            snprintf(name, sizeof name, "ins_%s", c->name);
            float *ri = read_from(&gold3, name, 1);
            float *rs = NULL;
            if (s.sigmas) {
                snprintf(name, sizeof name, "sig_%s", c->name);
                rs = read_from(&gold3, name, (size_t)nt + 1);
            }
            int ok = rt && ref && ri && (!s.sigmas || rs);
            for (int i = 0; ok && i < nt; i++) {
                const double e = fabs((double)s.model_t[i] - rt[i]);
                wt = e > wt ? e : wt;
            }
            for (int i = 0; ok && rs && i <= nt; i++) {
                const double e = fabs((double)s.sigmas[i] - rs[i]) / (rs[i] != 0.0f ? rs[i] : 1.0f);
                ws = e > ws ? e : ws;
            }
            if (ok) {
                const double e = fabs((double)s.init_noise_sigma - ri[0]) / ri[0];
                ws = e > ws ? e : ws;
                for (int64_t j = 0; j < n; j++)
                    x[j] = x0[j] * s.init_noise_sigma;
                sd_sampler_reset(&s);
                for (int i = 0; i < nt; i++) {
                    sd_sampler_step(&s, i, mo + (size_t)i * n, x,
                                    sd_sampler_step_noise(&s, i) ? z + (size_t)i * n : NULL);
                    const double e2 = rel_err(x, ref + (size_t)i * n, n, NULL);
                    worst = e2 > worst ? e2 : worst;
                }
            }
            tap_ok(ok && wt <= 1e-3 && ws <= (own ? 1e-5 : 1e-6) && worst <= tol,
                   "%s%s: %d model calls, timesteps within %.3g, sigmas / init_noise_sigma "
                   "relative error %.3g, samples %.3g (<= %g)", c->name,
                   own ? "" : " on diffusers' alphas_cumprod", nt, wt, ws, worst, tol);
            free(rt);
            free(ref);
            free(ri);
            free(rs);
            sd_sampler_free(&s);
            sd_diffusion_free(&d);
        }
    }
    free(x0);
    free(mo);
    free(z);

    /* DPM-Solver++ with Karras sigmas on the cosine schedule: diffusers truncates the
     * timesteps (rounds them on other schedules), and then repeats its first timestep 998 at
     * every N, which its step cannot run (it starts at the second 998 and indexes past its
     * sigmas). sdtrain computes the same timesteps and refuses the schedule. */
    {
        sd_diffusion d;
        sd_err err;
        int ok = zsnr_schedule(&d, 0, "epsilon", &err) == 0;
        double wt = 0.0, ws = 0.0;
        for (int k = 0; ok && k < 3; k++) {
            static const int Ns[3] = {5, 10, 25};
            const int N = Ns[k];
            char name[64];
            sd_sampler s;
            snprintf(name, sizeof name, "ts_cos_dpmpp_2m_karras_%d", N);
            float *rt = read_from(&gold3, name, (size_t)N);
            snprintf(name, sizeof name, "sig_cos_dpmpp_2m_karras_%d", N);
            float *rs = read_from(&gold3, name, (size_t)N + 1);
            ok = rt && rs && rt[0] == rt[1] &&
                 sd_sampler_init(&s, SD_SAMPLER_DPMPP_2M, &d, N, SD_SPACING_LINSPACE, 1, 1, &err) == 0;
            if (ok) {
                ok = sd_sampler_use_karras(&s, &err) < 0 && strstr(err.msg, "repeats") != NULL;
                for (int i = 0; i < N; i++) {
                    const double e = fabs((double)s.model_t[i] - rt[i]);
                    wt = e > wt ? e : wt;
                }
                for (int i = 0; i <= N; i++) {
                    const double e = fabs((double)s.sigmas[i] - rs[i]) / (rs[i] != 0.0f ? rs[i] : 1.0f);
                    ws = e > ws ? e : ws;
                }
                sd_sampler_free(&s);
            }
            free(rt);
            free(rs);
        }
        tap_ok(ok && wt == 0.0 && ws <= 1e-6,
               "dpmpp_2m, Karras sigmas on squaredcos_cap_v2 (N 5, 10, 25): diffusers' truncated "
               "timesteps (equal; sigmas within %.3g), whose repeated first timestep is refused: "
               "%s", ws, err.msg);
        sd_diffusion_free(&d);
    }

    /* the ancestral samplers on the cosine schedule with few trailing / linspace steps: its
     * first sigma (20291) is over 4096 times the next, sigma_down cancels to 0 or NaN in fp32
     * (diffusers: NaN): refused; 'leading' (a smaller first sigma) and more steps work */
    {
        sd_diffusion d;
        sd_sampler s;
        sd_err err, err2;
        int ok = zsnr_schedule(&d, 0, "epsilon", &err) == 0;
        ok = ok && sd_sampler_init(&s, SD_SAMPLER_EULER_A, &d, 3, SD_SPACING_TRAILING, 1, 4, &err) < 0 &&
             strstr(err.msg, "sigma_down") != NULL &&
             sd_sampler_init(&s, SD_SAMPLER_DPM2_A, &d, 2, SD_SPACING_TRAILING, 1, 4, &err2) < 0 &&
             strstr(err2.msg, "sigma_down") != NULL;
        int fine = ok && sd_sampler_init(&s, SD_SAMPLER_EULER_A, &d, 3, SD_SPACING_LEADING, 1, 4, &err2) == 0;
        if (fine)
            sd_sampler_free(&s);
        fine = fine && sd_sampler_init(&s, SD_SAMPLER_EULER_A, &d, 50, SD_SPACING_TRAILING, 1, 4, &err2) == 0;
        if (fine)
            sd_sampler_free(&s);
        tap_ok(ok && fine, "euler_a / dpm2_a on the cosine schedule with 3 / 2 trailing steps "
               "refused, with leading spacing or 50 steps accepted: %s", err.msg);
        sd_diffusion_free(&d);
    }
    /* sd_sampler_check_options: the last step's h = 0 (Karras / exponential sigmas end at the
     * smallest sigma, which sigma_min repeats) at order 3 or DPM's heun; UniPC to sigma 0 */
    {
        static const struct {
            sd_sampler_kind kind;
            int order, heun, lof, eaf, bh1, eps, sigma_min, karras, steps, refused;
        } oc[] = {
            {SD_SAMPLER_DPMPP_2M, 3, 0, 0, 0, 0, 0, 1, 1, 6, 1},
            {SD_SAMPLER_DPMPP_2M_SDE, 3, 0, 1, 0, 0, 0, 1, 1, 20, 1},
            {SD_SAMPLER_DPMPP_2M, 3, 0, 1, 0, 0, 0, 1, 1, 6, 0},   /* lower_order_final */
            {SD_SAMPLER_DPMPP_2M, 3, 0, 0, 1, 0, 0, 1, 1, 6, 0},   /* euler_at_final */
            {SD_SAMPLER_DPMPP_2M, 3, 0, 0, 0, 0, 0, 1, 0, 6, 0},   /* no Karras: h > 0 */
            {SD_SAMPLER_DPMPP_2M, 2, 1, 0, 0, 0, 0, 1, 1, 6, 1},   /* heun */
            {SD_SAMPLER_DPMPP_2M, 2, 0, 0, 0, 0, 0, 1, 1, 6, 0},   /* midpoint: finite */
            {SD_SAMPLER_UNIPC, 3, 0, 0, 0, 0, 0, 1, 1, 6, 1},
            {SD_SAMPLER_UNIPC, 3, 0, 1, 0, 0, 0, 1, 1, 6, 0},
            {SD_SAMPLER_UNIPC, 2, 0, 1, 0, 1, 0, 0, 0, 6, 1},      /* bh1 to sigma 0 */
            {SD_SAMPLER_UNIPC, 2, 0, 1, 0, 0, 1, 0, 0, 6, 1},      /* predict_x0 false */
            {SD_SAMPLER_UNIPC, 2, 0, 0, 0, 0, 0, 0, 0, 6, 1},      /* no lower_order_final */
            {SD_SAMPLER_UNIPC, 2, 0, 1, 0, 1, 1, 1, 0, 6, 0},      /* both with sigma_min */
        };
        sd_diffusion d;
        sd_err err;
        int right = 0, total = 0;
        if (init_sd2_schedule(&d, "epsilon", 1000) == 0) {
            for (size_t k = 0; k < sizeof oc / sizeof oc[0]; k++) {
                sd_sampler s;
                total++;
                if (sd_sampler_init(&s, oc[k].kind, &d, oc[k].steps, SD_SPACING_LINSPACE, 1, 4, &err) ||
                    (oc[k].sigma_min && sd_sampler_final_sigma_min(&s, &err)) ||
                    (oc[k].karras && sd_sampler_use_karras(&s, &err))) {
                    tap_diag("check_options case %zu: %s", k, err.msg);
                    continue;
                }
                s.dpm_order = oc[k].order;
                s.dpm_heun = oc[k].heun;
                s.lower_order_final = oc[k].lof;
                s.euler_at_final = oc[k].eaf;
                s.unipc_bh1 = oc[k].bh1;
                s.unipc_eps = oc[k].eps;
                const int rc = sd_sampler_check_options(&s, &err);
                if ((rc < 0) == oc[k].refused)
                    right++;
                else
                    tap_diag("check_options case %zu: rc %d (%s)", k, rc, rc ? err.msg : "");
                sd_sampler_free(&s);
            }
            sd_diffusion_free(&d);
        }
        tap_ok(right == total && total == (int)(sizeof oc / sizeof oc[0]),
               "sd_sampler_check_options: %d of %d combinations judged right (refused: the last "
               "step's h = 0 at order 3 or DPM heun, UniPC's NaN ends at sigma 0)", right, total);
    }
    /* refusals: Heun and PNDM have no zero-SNR schedule in diffusers; too short a schedule */
    {
        sd_diffusion d;
        sd_sampler s;
        sd_err err, err2;
        int ok = zsnr_schedule(&d, 1, "v_prediction", &err) == 0;
        ok = ok && sd_sampler_init(&s, SD_SAMPLER_HEUN, &d, 5, SD_SPACING_TRAILING, 1, 4, &err) < 0 &&
             strstr(err.msg, "HeunDiscreteScheduler") &&
             sd_sampler_init(&s, SD_SAMPLER_PNDM, &d, 5, SD_SPACING_TRAILING, 1, 4, &err2) < 0 &&
             strstr(err2.msg, "PNDMScheduler");
        tap_ok(ok, "zero terminal SNR refused for heun and pndm: %s", err.msg);
        sd_diffusion_free(&d);
        ok = sd_diffusion_init(&d, "linear", 0.0001, 0.02, 1, "v_prediction", SD_LINSPACE_FUSED,
                               &err) == 0 &&
             sd_diffusion_rescale_zero_snr(&d, &err) < 0 && d.zero_snr == 0;
        tap_ok(ok, "zero terminal SNR of a 1-step schedule refused: %s", err.msg);
        sd_diffusion_free(&d);
    }
}

/* order3.safetensors: DPM-Solver++ and UniPC of order 3, UniPC's bh1 (make_order3_goldens.py) */
static sd_st_file gold4;

static void test_order3(void)
{
    static const struct {
        const char *name;
        sd_sampler_kind kind;
        int steps, v, karras, sigma_min, lof;
        sd_spacing spacing;
        int order, bh1; /* 3 and 0 unless said */
        int eps, nocorr; /* UniPC's predict_x0 false; disable_corrector [1, 2] */
    } cases[] = {
        {"dpm3_eps", SD_SAMPLER_DPMPP_2M, 5, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_v", SD_SAMPLER_DPMPP_2M, 5, 1, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_sde_eps", SD_SAMPLER_DPMPP_2M_SDE, 5, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_karras_eps", SD_SAMPLER_DPMPP_2M, 5, 0, 1, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_sigma_min_nolof_eps", SD_SAMPLER_DPMPP_2M, 5, 0, 0, 1, 0, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_16_eps", SD_SAMPLER_DPMPP_2M, 16, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_sde_16_eps", SD_SAMPLER_DPMPP_2M_SDE, 16, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"dpm3_trailing_eps", SD_SAMPLER_DPMPP_2M, 5, 0, 0, 0, 1, SD_SPACING_TRAILING, 3, 0, 0, 0},
        {"unipc3_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"unipc3_v", SD_SAMPLER_UNIPC, 5, 1, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"unipc3_16_eps", SD_SAMPLER_UNIPC, 16, 0, 0, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"unipc3_karras_eps", SD_SAMPLER_UNIPC, 5, 0, 1, 0, 1, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"unipc3_sigma_min_nolof_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 0, SD_SPACING_LINSPACE, 3, 0, 0, 0},
        {"unipc_bh1_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 1, SD_SPACING_LINSPACE, 2, 1, 0, 0},
        {"unipc3_bh1_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 1, SD_SPACING_LINSPACE, 3, 1, 0, 0},
        {"unipc_bh1_order1_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 1, SD_SPACING_LINSPACE, 1, 1, 0, 0},
        {"unipc_px0f_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 1, SD_SPACING_LINSPACE, 2, 0, 1, 0},
        {"unipc3_px0f_v", SD_SAMPLER_UNIPC, 5, 1, 0, 1, 1, SD_SPACING_LINSPACE, 3, 0, 1, 0},
        {"unipc_px0f_bh1_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 1, 1, SD_SPACING_LINSPACE, 2, 1, 1, 0},
        {"unipc_nocorr_eps", SD_SAMPLER_UNIPC, 5, 0, 0, 0, 1, SD_SPACING_LINSPACE, 2, 0, 0, 1},
    };
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold4, "in_sample", (size_t)n);
    float *mo = read_from(&gold4, "in_model_out", 16 * (size_t)n);
    float *z = read_from(&gold4, "in_noise", 16 * (size_t)n);
    sd_diffusion dd[2];
    if (!tap_ok(x0 && mo && z && !init_sd2_schedule(&dd[0], "epsilon", 1000) &&
                    !init_sd2_schedule(&dd[1], "v_prediction", 1000),
                "order3.safetensors inputs present"))
        goto out;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        sd_sampler s, s2;
        sd_err err;
        char name[64];
        float x[2 * 3 * 5 * 4], y[2 * 3 * 5 * 4];
        double worst = 0.0, moved = 0.0;
        const int N = cases[ci].steps;
        if (sd_sampler_init(&s, cases[ci].kind, &dd[cases[ci].v], N, cases[ci].spacing, 1, n,
                            &err) ||
            sd_sampler_init(&s2, cases[ci].kind, &dd[cases[ci].v], N, cases[ci].spacing, 1, n,
                            &err) ||
            (cases[ci].karras && (sd_sampler_use_karras(&s, &err) || sd_sampler_use_karras(&s2, &err))) ||
            (cases[ci].sigma_min &&
             (sd_sampler_final_sigma_min(&s, &err) || sd_sampler_final_sigma_min(&s2, &err)))) {
            tap_ok(0, "%s: %s", cases[ci].name, err.msg);
            continue;
        }
        /* s: the case; s2: order 2 and bh2 (order 1 for the order-1 case), to show that the
         * case's option is taken */
        const int order = cases[ci].order ? cases[ci].order : 3;
        s.dpm_order = order;
        s2.dpm_order = order == 1 || cases[ci].eps || cases[ci].nocorr ? order : 2;
        s.unipc_bh1 = cases[ci].bh1;
        s.unipc_eps = cases[ci].eps;
        if (cases[ci].nocorr)
            s.unipc_nocorr[0] = 1u << 1 | 1u << 2; /* steps 1 and 2 */
        s.lower_order_final = s2.lower_order_final = cases[ci].lof;
        snprintf(name, sizeof name, "step_%s", cases[ci].name);
        float *ref = read_from(&gold4, name, (size_t)N * (size_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] = y[j] = x0[j] * s.init_noise_sigma;
        sd_sampler_reset(&s);
        sd_sampler_reset(&s2);
        for (int i = 0; ref && i < N; i++) {
            const float *zi = sd_sampler_step_noise(&s, i) ? z + (size_t)i * n : NULL;
            sd_sampler_step(&s, i, mo + (size_t)i * n, x, zi);
            sd_sampler_step(&s2, i, mo + (size_t)i * n, y, zi);
            const double e = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = e > worst ? e : worst;
        }
        moved = ref ? rel_err(y, ref + (size_t)(N - 1) * n, n, NULL) : 0.0;
        tap_ok(ref && worst <= 1e-6 && moved > 1e-4,
               "%s: %d steps at solver_order %d%s%s%s, relative error %.3g (%s ends %.3g away)",
               cases[ci].name, N, order, cases[ci].bh1 ? ", bh1" : "",
               cases[ci].eps ? ", predict_x0 false" : "",
               cases[ci].nocorr ? ", disable_corrector [1, 2]" : "", worst,
               cases[ci].eps || cases[ci].nocorr ? "the default UniPC"
               : cases[ci].bh1                   ? "bh2"
                                                 : "order 2", moved);
        free(ref);
        sd_sampler_free(&s);
        sd_sampler_free(&s2);
    }
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
out:
    free(x0);
    free(mo);
    free(z);
}

/* lms.safetensors: LMSDiscreteScheduler (make_lms_goldens.py) */
static sd_st_file gold5;

static void test_lms(void)
{
    static const int Ns[] = {1, 2, 3, 4, 7, 10, 50, 999, 1000};
    sd_diffusion dd[2];
    int cases = 0, bad = 0, refused = 0;
    double wt = 0.0, ws = 0.0;
    if (init_sd2_schedule(&dd[0], "epsilon", 1000) || init_sd2_schedule(&dd[1], "v_prediction", 1000))
        return;
    for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
        for (int sp = 0; sp < 3; sp++)
            for (int off = 0; off < 2; off++) {
                const int N = Ns[b];
                char tag[64], name[80];
                sd_sampler s;
                sd_err err;
                snprintf(tag, sizeof tag, "%s_%d_%d", sd_spacing_name((sd_spacing)sp), N, off);
                snprintf(name, sizeof name, "ts_%s", tag);
                float *rt = read_from(&gold5, name, (size_t)N);
                snprintf(name, sizeof name, "sig_%s", tag);
                float *rs = read_from(&gold5, name, (size_t)N + 1);
                snprintf(name, sizeof name, "ins_%s", tag);
                float *ri = read_from(&gold5, name, 1);
                int usable = rt && rs && ri;
                for (int i = 0; usable && i < N; i++)
                    usable = rt[i] >= 0.0f && rt[i] <= 999.0f && (i == 0 || rt[i] != rt[0]);
                const int rc = rt && rs && ri
                                   ? sd_sampler_init(&s, SD_SAMPLER_LMS, &dd[0], N, (sd_spacing)sp,
                                                     off, 1, &err)
                                   : -1;
                if (!rt || !rs || !ri) {
                    bad++;
                } else if (!usable) {
                    refused += rc < 0;
                    bad += rc == 0;
                    if (rc == 0)
                        sd_sampler_free(&s);
                } else if (rc < 0) {
                    bad++;
                    tap_diag("lms %s: %s", tag, err.msg);
                } else {
                    double t1, s1;
                    schedule_err(&s, rt, rs, ri, N, &t1, &s1, NULL, NULL);
                    if (t1 > 0.0 || s1 > 1e-6) {
                        bad++;
                        tap_diag("lms %s: timesteps off by %.3g, sigmas %.3g", tag, t1, s1);
                    }
                    wt = t1 > wt ? t1 : wt;
                    ws = s1 > ws ? s1 : ws;
                    cases++;
                    sd_sampler_free(&s);
                }
                free(rt);
                free(rs);
                free(ri);
            }
    tap_ok(bad == 0 && refused > 0 && cases + refused == 54, "lms: timesteps of %d schedules equal diffusers', "
           "sigmas and init_noise_sigma within %.3g; the %d unusable ones refused", cases, ws,
           refused);

    static const struct {
        const char *name;
        int v, karras; /* karras 1: Karras sigmas, 2: exponential */
        sd_spacing spacing;
        int offset;
    } steps[] = {
        {"linspace_eps", 0, 0, SD_SPACING_LINSPACE, 0}, {"linspace_v", 1, 0, SD_SPACING_LINSPACE, 0},
        {"leading_eps", 0, 0, SD_SPACING_LEADING, 1},   {"trailing_eps", 0, 0, SD_SPACING_TRAILING, 0},
        {"karras_eps", 0, 1, SD_SPACING_LINSPACE, 0},   {"expo_eps", 0, 2, SD_SPACING_LINSPACE, 0},
    };
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold5, "in_sample", (size_t)n);
    float *mo = read_from(&gold5, "in_model_out", 8 * (size_t)n);
    for (size_t c = 0; x0 && mo && c < sizeof steps / sizeof steps[0]; c++) {
        sd_sampler s, e;
        sd_err err;
        char name[64];
        float x[2 * 3 * 5 * 4], y[2 * 3 * 5 * 4];
        double worst = 0.0;
        if (sd_sampler_init(&s, SD_SAMPLER_LMS, &dd[steps[c].v], 8, steps[c].spacing,
                            steps[c].offset, n, &err) ||
            sd_sampler_init(&e, SD_SAMPLER_EULER, &dd[steps[c].v], 8, steps[c].spacing,
                            steps[c].offset, n, &err) ||
            (steps[c].karras == 1 && (sd_sampler_use_karras(&s, &err) || sd_sampler_use_karras(&e, &err))) ||
            (steps[c].karras == 2 &&
             (sd_sampler_use_exponential(&s, &err) || sd_sampler_use_exponential(&e, &err)))) {
            tap_ok(0, "lms step_%s: %s", steps[c].name, err.msg);
            continue;
        }
        snprintf(name, sizeof name, "step_%s", steps[c].name);
        float *ref = read_from(&gold5, name, 8 * (size_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] = y[j] = x0[j] * s.init_noise_sigma;
        sd_sampler_reset(&s);
        sd_sampler_reset(&e);
        int euler_first = 1; /* LMS's first step (order 1) is Euler's */
        for (int i = 0; ref && i < 8; i++) {
            sd_sampler_step(&s, i, mo + (size_t)i * n, x, NULL);
            if (i == 0) {
                sd_sampler_step(&e, i, mo, y, NULL);
                euler_first = rel_err(x, y, n, NULL) <= 1e-6;
            }
            const double r = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = r > worst ? r : worst;
        }
        tap_ok(ref && worst <= 1e-6 && euler_first,
               "lms step_%s: 8 steps (order 4 from the fourth), relative error %.3g; the first "
               "equals Euler's", steps[c].name, worst);
        free(ref);
        sd_sampler_free(&s);
        sd_sampler_free(&e);
    }
    free(x0);
    free(mo);
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
}

/* One golden step sequence of an interleaved sampler (DPM2, DPM2 ancestral, DPM++ SDE): 8 steps
 * of dd[c->v] with c's spacing, offset and sigmas (1 Karras, 2 exponential) on latents of
 * STEP_N elements, from x0 * init_noise_sigma with model output i and, where the sampler asks
 * for noise, z[i] at call i; scale_model_input first, as the pipeline calls it. Compares each
 * call's sample with gf's step_<name>. Returns the worst relative error, or -1 (with a
 * diagnostic) when the sampler or the golden cannot be had; *calls and *noisy get the number of
 * calls and of those that took noise. */
#define STEP_N (2 * 3 * 5 * 4)
typedef struct step_case {
    const char *name;
    int v, sigmas;
    sd_spacing spacing;
    int offset;
} step_case;

static double golden_steps(sd_st_file *gf, sd_sampler_kind kind, const sd_diffusion *dd,
                           const step_case *c, const float *x0, const float *mo, const float *z,
                           int *calls, int *noisy)
{
    sd_sampler s;
    sd_err err;
    char name[64];
    float x[STEP_N], scaled[STEP_N];
    double worst = 0.0;
    *calls = *noisy = 0;
    if (sd_sampler_init(&s, kind, &dd[c->v], 8, c->spacing, c->offset, STEP_N, &err) ||
        (c->sigmas == 1 && sd_sampler_use_karras(&s, &err)) ||
        (c->sigmas == 2 && sd_sampler_use_exponential(&s, &err))) {
        tap_diag("%s step_%s: %s", sd_sampler_kind_name(kind), c->name, err.msg);
        return -1.0;
    }
    snprintf(name, sizeof name, "step_%s", c->name);
    float *ref = read_from(gf, name, (size_t)s.n_timesteps * STEP_N);
    for (int64_t j = 0; j < STEP_N; j++)
        x[j] = x0[j] * s.init_noise_sigma;
    sd_sampler_reset(&s);
    for (int i = 0; ref && i < s.n_timesteps; i++) {
        const int noise = sd_sampler_step_noise(&s, i);
        *noisy += noise;
        sd_sampler_scale_input(&s, i, STEP_N, x, scaled);
        sd_sampler_step(&s, i, mo + (size_t)i * STEP_N, x, noise && z ? z + (size_t)i * STEP_N : NULL);
        const double r = rel_err(x, ref + (size_t)i * STEP_N, STEP_N, NULL);
        worst = r > worst ? r : worst;
    }
    *calls = s.n_timesteps;
    free(ref);
    sd_sampler_free(&s);
    return ref ? worst : -1.0;
}

/* dpm2.safetensors: KDPM2DiscreteScheduler (make_dpm2_goldens.py) */
static sd_st_file gold6;

/* compares an interleaved schedule with gf's <pre>ts_<tag> and <pre>sig_<tag> (n_timesteps + 3
 * sigmas for DPM2, + 1 for DPM++ SDE) and, for DPM2, <pre>sigi_<tag>; returns 0 when within
 * tolerance (timesteps 1e-3: the midpoints' come from torch's log / exp or from float64
 * midpoints through _sigma_to_t; sigmas 1e-6 relative) */
static int interleaved_schedule_ok(sd_st_file *gf, const sd_sampler *s, const char *pre,
                                   const char *tag, double *wt, double *ws)
{
    char name[96];
    const int nt = s->n_timesteps, dpm2 = s->kind != SD_SAMPLER_DPMPP_SDE;
    const int nsig = nt + (dpm2 ? 3 : 1);
    snprintf(name, sizeof name, "%sts_%s", pre, tag);
    float *rt = read_from(gf, name, (size_t)nt);
    snprintf(name, sizeof name, "%ssig_%s", pre, tag);
    float *rs = read_from(gf, name, (size_t)nsig);
    snprintf(name, sizeof name, "%ssigi_%s", pre, tag);
    float *ri = dpm2 ? read_from(gf, name, (size_t)nsig) : NULL;
    int ok = rt && rs && (ri || !dpm2);
    for (int i = 0; ok && i < nt; i++) {
        const double e = fabs((double)s->model_t[i] - rt[i]);
        *wt = e > *wt ? e : *wt;
    }
    for (int i = 0; ok && i < nsig; i++) {
        const double e1 = fabs((double)s->sigmas[i] - rs[i]) / (rs[i] != 0.0f ? rs[i] : 1.0f);
        /* sigmas_interpol[0] is never used (torch's is NaN there) */
        const double e2 = !dpm2 || i == 0 ? 0.0
                                          : fabs((double)s->sigmas_interp[i] - ri[i]) /
                                                (ri[i] != 0.0f ? ri[i] : 1.0f);
        *ws = e1 > *ws ? e1 : *ws;
        *ws = e2 > *ws ? e2 : *ws;
    }
    free(rt);
    free(rs);
    free(ri);
    return ok && *wt <= 1e-3 && *ws <= 1e-6 ? 0 : -1;
}

static void test_dpm2(void)
{
    static const int Ns[] = {1, 2, 3, 4, 7, 10, 50, 1000};
    sd_diffusion dd[2];
    int cases = 0, bad = 0, refused = 0;
    double wt = 0.0, ws = 0.0;
    if (init_sd2_schedule(&dd[0], "epsilon", 1000) || init_sd2_schedule(&dd[1], "v_prediction", 1000))
        return;
    for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
        for (int sp = 0; sp < 3; sp++)
            for (int off = 0; off < 2; off++) {
                const int N = Ns[b];
                char tag[64];
                sd_sampler s;
                sd_err err;
                if (N == 1000 && !(sp == SD_SPACING_LEADING && off == 1))
                    continue;
                snprintf(tag, sizeof tag, "%s_%d_%d", sd_spacing_name((sd_spacing)sp), N, off);
                const int rc = sd_sampler_init(&s, SD_SAMPLER_DPM2, &dd[0], N, (sd_spacing)sp,
                                               off, 1, &err);
                if (N == 1000) { /* its timestep 1000 is outside the schedule */
                    refused += rc < 0;
                    bad += rc == 0;
                } else if (rc < 0) {
                    bad++;
                    tap_diag("dpm2 %s: %s", tag, err.msg);
                } else {
                    if (s.n_timesteps != 2 * N - 1 ||
                        interleaved_schedule_ok(&gold6, &s, "", tag, &wt, &ws)) {
                        bad++;
                        tap_diag("dpm2 %s: %d calls, timesteps off by %.3g, sigmas %.3g", tag,
                                 s.n_timesteps, wt, ws);
                    }
                    cases++;
                }
                if (rc == 0)
                    sd_sampler_free(&s);
            }
    for (int k = 0; k < 2; k++)
        for (int m = 0; m < 4; m++) {
            static const int KN[4] = {2, 5, 10, 25};
            char tag[16];
            sd_sampler s;
            sd_err err;
            snprintf(tag, sizeof tag, "%d", KN[m]);
            if (sd_sampler_init(&s, SD_SAMPLER_DPM2, &dd[0], KN[m], SD_SPACING_LINSPACE, 1, 1, &err) ||
                (k ? sd_sampler_use_exponential(&s, &err) : sd_sampler_use_karras(&s, &err))) {
                bad++;
                tap_diag("dpm2 %s %s: %s", k ? "exponential" : "Karras", tag, err.msg);
                continue;
            }
            if (interleaved_schedule_ok(&gold6, &s, k ? "e" : "k", tag, &wt, &ws)) {
                bad++;
                tap_diag("dpm2 %s %s: timesteps off by %.3g, sigmas %.3g", k ? "exp" : "Karras",
                         tag, wt, ws);
            }
            cases++;
            sd_sampler_free(&s);
        }
    tap_ok(bad == 0 && refused == 1 && cases == 50,
           "dpm2: 2 N - 1 interleaved timesteps, sigmas and log-midpoint sigmas of %d schedules "
           "(three spacings, Karras, exponential) within %.3g / %.3g of diffusers'; the unusable "
           "one refused", cases, wt, ws);

    static const step_case steps[] = {
        {"linspace_eps", 0, 0, SD_SPACING_LINSPACE, 0}, {"linspace_v", 1, 0, SD_SPACING_LINSPACE, 0},
        {"leading_eps", 0, 0, SD_SPACING_LEADING, 1},   {"trailing_eps", 0, 0, SD_SPACING_TRAILING, 0},
        {"karras_eps", 0, 1, SD_SPACING_LINSPACE, 0},   {"expo_eps", 0, 2, SD_SPACING_LINSPACE, 0},
    };
    const int64_t n = STEP_N;
    float *x0 = read_from(&gold6, "in_sample", (size_t)n);
    float *mo = read_from(&gold6, "in_model_out", 15 * (size_t)n);
    for (size_t c = 0; x0 && mo && c < sizeof steps / sizeof steps[0]; c++) {
        int calls, noisy;
        const double worst = golden_steps(&gold6, SD_SAMPLER_DPM2, dd, &steps[c], x0, mo, NULL,
                                          &calls, &noisy);
        tap_ok(worst >= 0.0 && calls == 15 && noisy == 0 && worst <= 1e-6,
               "dpm2 step_%s: 8 steps (15 calls), relative error %.3g", steps[c].name, worst);
    }

    /* the ancestral variant: schedules (sigmas, midpoints, up, down), then 8 steps with noise */
    {
        static const int AN[] = {1, 2, 3, 5, 10};
        int acases = 0, abad = 0;
        double awt = 0.0, aws = 0.0;
        for (size_t b = 0; b < sizeof AN / sizeof AN[0]; b++)
            for (int sp = 0; sp < 3; sp++) {
                const int N = AN[b];
                char tag[48], name[64];
                sd_sampler s;
                sd_err err;
                snprintf(tag, sizeof tag, "%s_%d", sd_spacing_name((sd_spacing)sp), N);
                if (sd_sampler_init(&s, SD_SAMPLER_DPM2_A, &dd[0], N, (sd_spacing)sp, 1, 1, &err)) {
                    abad++;
                    tap_diag("dpm2_a %s: %s", tag, err.msg);
                    continue;
                }
                const int nt = s.n_timesteps;
                snprintf(name, sizeof name, "ats_%s", tag);
                float *rt = read_from(&gold6, name, (size_t)nt);
                const float *mine[4] = {s.sigmas, s.sigmas_interp, s.sigmas_up, s.sigmas_down};
                static const char *keys[4] = {"asig_", "asigi_", "asigu_", "asigd_"};
                int ok = rt != NULL;
                /* sigma_down[k] = (s'^2 - up^2) ** 0.5 ~ s'^2 / s cancels in fp32 (s = base
                 * sigma k, s' = k + 1), by (s / s')^2: torch's 1-ulp-off sqrt of up moves it and
                 * its midpoint by about 2e-7 (s / s')^2 relative (for N = 2, 0.029 after 14.6:
                 * 2 %), and that midpoint's timestep with them. They are held to that (at least
                 * 1e-6; timesteps to 500 times it, between 1e-3 and 0.05); everything else to
                 * 1e-6. The steps do not feel it: they agree within 1e-6 (below). */
                double cwt = 0.0, cws = 0.0;
                for (int i = 0; ok && i < nt; i++) {
                    double tol = 1e-3;
                    if (i % 2 == 1) { /* the midpoint of base (i - 1) / 2 */
                        const int k = (i - 1) / 2;
                        const double r = (double)s.sigmas[2 * k] / s.sigmas[2 * k + 1];
                        const double rel = fmax(1e-6, 2e-7 * r * r);
                        tol = fmin(0.05, fmax(1e-3, 500.0 * rel));
                    }
                    const double e = fabs((double)s.model_t[i] - rt[i]);
                    ok = e <= tol;
                    cwt = e > cwt ? e : cwt;
                }
                for (int q = 0; q < 4; q++) {
                    snprintf(name, sizeof name, "%s%s", keys[q], tag);
                    float *r = read_from(&gold6, name, (size_t)nt + 3);
                    ok = ok && r;
                    /* entry 0 of the midpoints and the last ones of up are NaN in torch */
                    for (int i = 0; r && i < nt + 3; i++) {
                        if ((q == 1 && i == 0) || (q == 2 && i >= nt))
                            continue;
                        const int k = (i + 1) / 2; /* the base sigma of entry i */
                        double tol = 1e-6;
                        if ((q == 1 || q == 3) && k < N) {
                            const double sn = k + 1 <= N ? s.sigmas[2 * k + 1] : 0.0;
                            const double ratio = sn > 0.0 ? (double)s.sigmas[i] / sn : 1.0;
                            tol = fmax(1e-6, 2e-7 * ratio * ratio);
                        }
                        const double e = fabs((double)mine[q][i] - r[i]) / (r[i] != 0.0f ? r[i] : 1.0f);
                        ok = ok && e <= tol;
                        cws = e > cws ? e : cws;
                    }
                    free(r);
                }
                awt = cwt > awt ? cwt : awt;
                aws = cws > aws ? cws : aws;
                if (!ok) {
                    abad++;
                    tap_diag("dpm2_a %s: timesteps off by %.3g, sigmas %.3g", tag, cwt, cws);
                }
                acases++;
                free(rt);
                sd_sampler_free(&s);
            }
        tap_ok(abad == 0 && acases == 15,
               "dpm2_a: interleaved timesteps, sigmas, midpoints, sigma_up and sigma_down of %d "
               "schedules within diffusers' up to fp32 cancellation in sigma_down (max %.3g / "
               "%.3g)", acases, awt, aws);
    }
    {
        static const step_case asteps[] = {
            {"a_linspace_eps", 0, 0, SD_SPACING_LINSPACE, 0},
            {"a_linspace_v", 1, 0, SD_SPACING_LINSPACE, 0},
            {"a_leading_eps", 0, 0, SD_SPACING_LEADING, 1},
            {"a_karras_eps", 0, 1, SD_SPACING_LINSPACE, 0},
        };
        float *z = read_from(&gold6, "in_noise", 15 * (size_t)n);
        for (size_t c = 0; x0 && mo && z && c < sizeof asteps / sizeof asteps[0]; c++) {
            int calls, noisy;
            const double worst = golden_steps(&gold6, SD_SAMPLER_DPM2_A, dd, &asteps[c], x0, mo,
                                              z, &calls, &noisy);
            tap_ok(worst >= 0.0 && calls == 15 && noisy == 7 && worst <= 1e-6,
                   "dpm2_a step_%s: 8 steps (15 calls, noise at the 7 second-order ones), "
                   "relative error %.3g", asteps[c].name, worst);
        }
        free(z);
    }
    free(x0);
    free(mo);
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
}

typedef struct fixed_noise {
    const float *z; /* [steps, 2 images, n] */
    int image;
    int64_t n;
} fixed_noise;

static void give_noise(void *user, int k, float *out, int64_t n)
{
    const fixed_noise *f = user;
    memcpy(out, f->z + ((size_t)k * 2 + (size_t)f->image) * (size_t)f->n, (size_t)n * sizeof *out);
}

typedef struct pipe_ctx {
    sd_t2i *g;
    const sd_diffusion *d;
    const float *init, *dnoise, *emb, *uemb; /* [2 nl], [4, 2, nl], [2 ne], [ne] */
    int64_t nl, ni, ne;
    double scaling;
} pipe_ctx;

/* The pipeline for both prompts with one scheduler, against <f>'s goldens named by the three
 * formats applied to `name`. */
static void pipeline_case(const pipe_ctx *c, sd_sampler_kind kind, sd_spacing spacing,
                          double eta, double rescale, double gs, sd_st_file *f,
                          const char *lat_fmt, const char *img_fmt, const char *u8_fmt,
                          const char *name, int must_match, int karras)
{
    const int64_t nl = c->nl, ni = c->ni, ne = c->ne;
    sd_sampler s;
    sd_err err;
    float *lat = malloc(2 * (size_t)nl * sizeof *lat), *img = malloc(2 * (size_t)ni * sizeof *img);
    uint8_t *u8 = malloc((size_t)ni);
    char key[96];
    int u8_off = 0;
    if (sd_sampler_init(&s, kind, c->d, 4, spacing, 1, nl, &err) ||
        (karras && sd_sampler_use_karras(&s, &err))) {
        tap_ok(0, "%s: %s", name, err.msg);
        free(lat);
        free(img);
        free(u8);
        return;
    }
    s.eta = eta;
    c->g->guidance_rescale = rescale;
    for (int p = 0; p < 2; p++) {
        fixed_noise fn = {c->dnoise, p, nl};
        for (int64_t e = 0; e < nl; e++)
            lat[p * nl + e] = c->init[p * nl + e] * s.init_noise_sigma;
        sd_t2i_denoise(c->g, &s, c->emb + (size_t)p * ne, gs > 1.0 ? c->uemb : NULL, gs,
                       lat + (size_t)p * nl, give_noise, &fn);
        sd_t2i_decode(c->g, lat + (size_t)p * nl, c->scaling, img + (size_t)p * ni);
    }
    c->g->guidance_rescale = 0.0;
    snprintf(key, sizeof key, lat_fmt, name);
    float *rl = read_from(f, key, 2 * (size_t)nl);
    snprintf(key, sizeof key, img_fmt, name);
    float *ri = read_from(f, key, 2 * (size_t)ni);
    snprintf(key, sizeof key, u8_fmt, name);
    float *ru = read_from(f, key, 2 * (size_t)ni);
    double el = 0, ei = 0, ml = 0, mi = 0;
    if (rl && ri && ru) {
        el = rel_err(lat, rl, 2 * nl, &ml);
        ei = rel_err(img, ri, 2 * ni, &mi);
        for (int p = 0; p < 2; p++) {
            sd_image_to_u8(ni, img + (size_t)p * ni, u8);
            for (int64_t i = 0; i < ni; i++) {
                int diff = abs((int)u8[i] - (int)ru[(size_t)p * ni + i]);
                u8_off = diff > u8_off ? diff : u8_off;
            }
        }
    }
    if (!must_match) { /* an option left out must change the result */
        tap_ok(rl && el > 1e-3, "pipeline %s with only eta %g, guidance_rescale %g: latents "
               "relative error %.3g (the option left out matters)", name, eta, rescale, el);
        goto out;
    }
    tap_ok(rl && el <= TOL, "pipeline %s (%d model calls, '%s' spacing): latents relative error "
           "%.3g (max |diff| %.3g)", name, s.n_timesteps, sd_spacing_name(spacing), el, ml);
    tap_ok(ri && ei <= TOL, "pipeline %s: decoded image relative error %.3g (max |diff| %.3g)",
           name, ei, mi);
    tap_ok(ru && u8_off <= 1, "pipeline %s: uint8 image within %d of diffusers' "
           "post-processing", name, u8_off);
out:
    free(rl);
    free(ri);
    free(ru);
    free(lat);
    free(img);
    free(u8);
    sd_sampler_free(&s);
}

/* A text-to-image generator on the CPU for tiny-sd2 with the tiny tokenizer, images of
 * height x width. Returns 0 (scaling = the VAE's scaling_factor) or -1 (reported). */
static int open_tiny(sd_t2i *g, int height, int width, double *scaling)
{
    char path[4200];
    sd_err err;
    sd_snapshot snap;
    sd_unet_config uc;
    sd_vae_config vc;
    sd_clip_config cc;
    sd_weights uw, vw, cw;
    sd_tokenizer *tok = NULL;
    int eos;
    memset(&uw, 0, sizeof uw);
    memset(&vw, 0, sizeof vw);
    memset(&cw, 0, sizeof cw);
    memset(g, 0, sizeof *g);
    snprintf(path, sizeof path, "%s/tests/data/models/tiny-sd2", top);
    if (!tap_ok(sd_snapshot_open(&snap, path, &err) == 0 &&
                    sd_snapshot_load_unet(&snap, NULL, &uc, &uw, &err) == 0 &&
                    sd_snapshot_load_vae(&snap, NULL, &vc, &vw, &err) == 0 &&
                    sd_snapshot_load_text_encoder(&snap, NULL, &cc, &eos, &cw, &err) == 0,
                "load %s", path)) {
        tap_diag("%s", err.msg);
        return -1;
    }
    sd_snapshot_close(&snap);
    snprintf(path, sizeof path, "%s/tests/data/sample/tokenizer", top);
    if (!tap_ok(sd_tokenizer_load(path, &tok, &err) == 0, "tokenizer %s", path)) {
        tap_diag("%s", err.msg);
        sd_weights_free(&uw);
        sd_weights_free(&vw);
        sd_weights_free(&cw);
        return -1;
    }
    *scaling = vc.scaling_factor;
    if (!tap_ok(sd_t2i_open(g, "cpu", 0, "fp32", &uc, &uw, &vc, &vw, &cc, &cw, tok, height, width,
                            1, 1, &err) == 0,
                "text-to-image on the CPU backend, %dx%d px", width, height)) {
        tap_diag("%s", err.msg);
        sd_t2i_close(g);
        return -1;
    }
    return 0;
}

static void test_pipeline(void)
{
    static const char *prompts[2] = {"a photo of the cat", "red car at the sea"};
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_DDIM, SD_SAMPLER_PNDM, SD_SAMPLER_DDPM};
    sd_err err;
    sd_t2i g;
    sd_diffusion d;
    double scaling;
    const int64_t nl = 8 * 8 * 4, ni = 16 * 16 * 3, ne = 77 * 32;
    float *init = NULL, *dnoise = NULL, *ids_c = NULL, *ids_u = NULL, *emb = NULL, *uemb = NULL;

    if (open_tiny(&g, 16, 16, &scaling))
        return;
    init = read_gold("init_latents", 2 * (size_t)nl);
    dnoise = read_gold("ddpm_noise", 4 * 2 * (size_t)nl);
    ids_c = read_gold("ids_cond", 2 * 77);
    ids_u = read_gold("ids_uncond", 77);
    emb = malloc(2 * (size_t)ne * sizeof *emb);
    uemb = malloc((size_t)ne * sizeof *uemb);
    if (!init || !dnoise || !ids_c || !ids_u || init_sd2_schedule(&d, "epsilon", 1000))
        goto out;

    {
        int32_t ids[77];
        int same = 1;
        for (int p = 0; p < 2; p++) {
            if (sd_t2i_encode(&g, prompts[p], ids, emb + (size_t)p * ne, &err)) {
                tap_diag("%s", err.msg);
                same = 0;
            }
            for (int i = 0; i < 77; i++)
                same &= ids[i] == (int32_t)ids_c[p * 77 + i];
        }
        sd_t2i_encode(&g, "", ids, uemb, &err);
        for (int i = 0; i < 77; i++)
            same &= ids[i] == (int32_t)ids_u[i];
        tap_ok(same, "token ids of the prompts and of \"\" equal CLIPTokenizer's");
    }

    {
        pipe_ctx c = {&g, &d, init, dnoise, emb, uemb, nl, ni, ne, scaling};
        for (int k = 0; k < 3; k++)
            for (int gi = 0; gi < 2; gi++) {
                char name[64];
                snprintf(name, sizeof name, "%s_g%s", sd_sampler_kind_name(kinds[k]),
                         gi ? "10" : "75");
                pipeline_case(&c, kinds[k], SD_SPACING_LEADING, 0.0, 0.0, gi ? 1.0 : 7.5, &gold,
                              "latents_%s", "image_%s", "u8_%s", name, 1, 0);
            }
        /* schedulers.safetensors: the second set (guidance 7.5; the pipeline sets steps_offset
         * 1) */
        static const struct {
            const char *name;
            sd_sampler_kind kind;
            sd_spacing spacing;
            double eta, rescale;
            int karras;
        } more[] = {
            {"euler", SD_SAMPLER_EULER, SD_SPACING_LINSPACE, 0, 0, 0},
            {"euler_a", SD_SAMPLER_EULER_A, SD_SPACING_LINSPACE, 0, 0, 0},
            {"dpmpp_2m", SD_SAMPLER_DPMPP_2M, SD_SPACING_LINSPACE, 0, 0, 0},
            {"euler_leading", SD_SAMPLER_EULER, SD_SPACING_LEADING, 0, 0, 0},
            {"ddim_eta_rescale", SD_SAMPLER_DDIM, SD_SPACING_LEADING, 0.5, 0.7, 0},
            {"pndm_trailing", SD_SAMPLER_PNDM, SD_SPACING_TRAILING, 0, 0, 0},
            {"dpmpp_2m_karras", SD_SAMPLER_DPMPP_2M, SD_SPACING_LINSPACE, 0, 0, 1},
            {"dpmpp_2m_sde_karras", SD_SAMPLER_DPMPP_2M_SDE, SD_SPACING_LINSPACE, 0, 0, 1},
            {"heun", SD_SAMPLER_HEUN, SD_SPACING_LINSPACE, 0, 0, 0},
            {"unipc", SD_SAMPLER_UNIPC, SD_SPACING_LINSPACE, 0, 0, 0},
        };
        for (size_t k = 0; k < sizeof more / sizeof more[0]; k++)
            pipeline_case(&c, more[k].kind, more[k].spacing, more[k].eta, more[k].rescale, 7.5,
                          &gold2, "p_%s_latents", "p_%s_image", "p_%s_u8", more[k].name, 1, more[k].karras);
        /* pipelines_more.safetensors: LMS, DPM2 and zero terminal SNR's recipe (DDIM, v,
         * rescaled schedule, 'trailing', guidance_rescale 0.7) */
        {
            sd_st_file g7;
            sd_err err7;
            char path7[4200];
            sd_diffusion dz;
            snprintf(path7, sizeof path7, "%s/tests/data/sample/pipelines_more.safetensors", top);
            if (tap_ok(sd_st_open(path7, &g7, &err7) == 0, "open %s", path7)) {
                pipeline_case(&c, SD_SAMPLER_LMS, SD_SPACING_LINSPACE, 0, 0, 7.5, &g7,
                              "p_%s_latents", "p_%s_image", "p_%s_u8", "lms", 1, 0);
                pipeline_case(&c, SD_SAMPLER_DPM2, SD_SPACING_LINSPACE, 0, 0, 7.5, &g7,
                              "p_%s_latents", "p_%s_image", "p_%s_u8", "dpm2", 1, 0);
                if (init_sd2_schedule(&dz, "v_prediction", 1000) == 0 &&
                    sd_diffusion_rescale_zero_snr(&dz, &err7) == 0) {
                    pipe_ctx cz = c;
                    cz.d = &dz;
                    pipeline_case(&cz, SD_SAMPLER_DDIM, SD_SPACING_TRAILING, 0, 0.7, 7.5, &g7,
                                  "p_%s_latents", "p_%s_image", "p_%s_u8", "zsnr_ddim", 1, 0);
                    sd_diffusion_free(&dz);
                } else {
                    tap_ok(0, "zero-SNR schedule: %s", err7.msg);
                }
                sd_st_close(&g7);
            } else {
                tap_diag("%s", err7.msg);
            }
        }
        /* eta and guidance_rescale must each matter */
        pipeline_case(&c, SD_SAMPLER_DDIM, SD_SPACING_LEADING, 0.5, 0.0, 7.5, &gold2,
                      "p_%s_latents", "p_%s_image", "p_%s_u8", "ddim_eta_rescale", 0, 0);
        pipeline_case(&c, SD_SAMPLER_DDIM, SD_SPACING_LEADING, 0.0, 0.7, 7.5, &gold2,
                      "p_%s_latents", "p_%s_image", "p_%s_u8", "ddim_eta_rescale", 0, 0);
    }
    {
        /* a non-square image: 24 x 16 px (latents 12 x 8) */
        sd_t2i g2;
        float *init2 = read_from(&gold2, "p_euler_a_24x16_init", 2 * 8 * 12 * 4);
        float *noise2 = read_from(&gold2, "p_euler_a_24x16_noise", 4 * 2 * 8 * 12 * 4);
        if (init2 && noise2 && open_tiny(&g2, 16, 24, &scaling) == 0) {
            pipe_ctx c = {&g2, &d, init2, noise2, emb, uemb, 8 * 12 * 4, 16 * 24 * 3, ne, scaling};
            pipeline_case(&c, SD_SAMPLER_EULER_A, SD_SPACING_LINSPACE, 0.0, 0.0, 7.5, &gold2,
                          "p_%s_latents", "p_%s_image", "p_%s_u8", "euler_a_24x16", 1, 0);
            sd_t2i_close(&g2);
        } else {
            tap_ok(0, "non-square goldens and generator");
        }
        free(init2);
        free(noise2);
    }
    sd_diffusion_free(&d);
out:
    free(init);
    free(dnoise);
    free(ids_c);
    free(ids_u);
    free(emb);
    free(uemb);
    sd_t2i_close(&g);
}

static void test_rng_and_u8(void)
{
    sd_err err;
    float a[4 * 3 * 5], b[4 * 3 * 5], c[4 * 3 * 5];
    float chw[4 * 3 * 5];
    int ok = sd_sampler_normals_nhwc(42, SD_SAMPLER_RNG_INIT, 1, 2, 0, 4, 3, 5, a, &err) == 0 &&
             sd_sampler_normals_nhwc(42, SD_SAMPLER_RNG_INIT, 1, 2, 0, 4, 3, 5, b, &err) == 0 &&
             sd_sampler_normals_nhwc(42, SD_SAMPLER_RNG_INIT, 2, 1, 0, 4, 3, 5, c, &err) == 0 &&
             sd_rng_fill_normal(42, SD_SAMPLER_RNG_INIT, 1, 2, chw, 60) == 0;
    int layout = 1;
    for (int ch = 0; ch < 4; ch++)
        for (int p = 0; p < 15; p++)
            layout &= a[p * 4 + ch] == chw[ch * 15 + p];
    tap_ok(ok && !memcmp(a, b, sizeof a) && memcmp(a, c, sizeof a) && layout,
           "initial latents: a pure function of (seed, image, prompt), C,H,W stream order "
           "stored channels-last");
    {
        const float x[] = {-2.0f, -1.0f, 0.0f, 1.0f, 3.0f, 1.0f / 255.0f, -0.998039f, NAN};
        uint8_t u[8];
        sd_image_to_u8(8, x, u);
        tap_ok(u[0] == 0 && u[1] == 0 && u[2] == 128 && u[3] == 255 && u[4] == 255 && u[5] == 128 &&
                   u[6] == 0 && u[7] == 0,
               "uint8 post-processing: clamp, x*0.5+0.5, round half to even "
               "(%d %d %d %d %d %d %d %d)",
               u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7]);
    }
}

/* tests/data/sample/beta.safetensors: beta sigmas (use_beta_sigmas), their quantile function
 * against scipy's, the schedules of five schedulers and 5 steps of seven. */
static sd_st_file gold7;

static void test_beta(void)
{
    static const int Ns[] = {1, 2, 3, 4, 7, 10, 25, 50, 100};
    static const struct {
        sd_sampler_kind kind;
        sd_spacing spacing;
    } sched[] = {{SD_SAMPLER_EULER, SD_SPACING_LINSPACE}, {SD_SAMPLER_EULER, SD_SPACING_LEADING},
                 {SD_SAMPLER_EULER, SD_SPACING_TRAILING}, {SD_SAMPLER_DPMPP_2M, SD_SPACING_LINSPACE},
                 {SD_SAMPLER_UNIPC, SD_SPACING_LINSPACE},  {SD_SAMPLER_HEUN, SD_SPACING_LINSPACE},
                 {SD_SAMPLER_LMS, SD_SPACING_LINSPACE}};
    sd_diffusion d;
    /* the quantile function: scipy's float64 values as float32 pairs */
    float *hi = read_from(&gold7, "ppf_hi", 101), *lo = read_from(&gold7, "ppf_lo", 101);
    double worst_ppf = 0.0;
    for (int i = 0; hi && lo && i < 101; i++) {
        const double want = (double)hi[i] + (double)lo[i];
        const double p = 1.0 - (i == 100 ? 1.0 : (double)i * (1.0 / 100.0));
        const double e = fabs(sd_beta_ppf(p, 0.6, 0.6) - want);
        worst_ppf = e > worst_ppf ? e : worst_ppf;
    }
    tap_ok(hi && lo && worst_ppf <= 1e-13, "Beta(0.6, 0.6) quantiles at 101 points within %.3g "
           "of scipy.stats.beta.ppf", worst_ppf);
    free(hi);
    free(lo);
    if (init_sd2_schedule(&d, "epsilon", 1000))
        return;
    int cases = 0, bad = 0, exact = 0, total = 0, refused = 0;
    double worst_t = 0.0, worst_s = 0.0;
    for (size_t k = 0; k < sizeof sched / sizeof sched[0]; k++)
        for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++) {
            const int N = Ns[b];
            char tag[64], name[80];
            sd_sampler s;
            sd_err err;
            snprintf(tag, sizeof tag, "%s_%s_%d", sd_sampler_kind_name(sched[k].kind),
                     sd_spacing_name(sched[k].spacing), N);
            snprintf(name, sizeof name, "ts_%s", tag);
            const sd_st_tensor *tt = sd_st_find(&gold7, name);
            const size_t nt = tt ? (size_t)tt->numel : 0;
            float *rt = tt ? read_from(&gold7, name, nt) : NULL;
            snprintf(name, sizeof name, "sig_%s", tag);
            float *rs = read_from(&gold7, name, nt + 1);
            snprintf(name, sizeof name, "ins_%s", tag);
            float *ri = read_from(&gold7, name, 1);
            int repeats = 0; /* diffusers' schedule visits its first timestep twice */
            for (size_t i = 1; rt && i < nt; i++)
                repeats |= rt[i] == rt[0];
            const int rc = rt && rs && ri ? sd_sampler_init(&s, sched[k].kind, &d, N,
                                                            sched[k].spacing, 1, 1, &err)
                                          : -1;
            const int rc2 = rc ? -1 : sd_sampler_use_beta(&s, &err);
            if (rc == 0 && rc2 != 0 && repeats && strstr(err.msg, "repeats its first timestep")) {
                refused++; /* unusable (the multistep solvers divide by h = 0): refused */
                sd_sampler_free(&s);
            } else if (rc || rc2 || (size_t)s.n_timesteps != nt) {
                bad++;
                tap_diag("beta %s: %s", tag, rt && rs && ri ? err.msg : "no golden");
                if (rc == 0)
                    sd_sampler_free(&s);
            } else {
                double wt, ws;
                schedule_err(&s, rt, rs, ri, (int)nt, &wt, &ws, &exact, &total);
                if (ws > 1e-6 || wt > 1e-3) {
                    bad++;
                    tap_diag("beta %s: timesteps off by %.3g, sigmas relative error %.3g", tag, wt,
                             ws);
                }
                worst_t = wt > worst_t ? wt : worst_t;
                worst_s = ws > worst_s ? ws : worst_s;
                cases++;
                sd_sampler_free(&s);
            }
            free(rt);
            free(rs);
            free(ri);
        }
    tap_ok(cases + refused == 63 && cases >= 59 && bad == 0,
           "beta sigmas of %d schedules (Euler after three spacings, DPM-Solver++, UniPC, Heun, "
           "LMS; N 1..100): timesteps within %.3g, sigmas and init_noise_sigma relative error <= "
           "%.3g (%d of %d sigmas bit-identical); %d that repeat their first timestep refused",
           cases, worst_t, worst_s, exact, total, refused);

    /* 5 steps on random inputs */
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_EULER, SD_SAMPLER_DPMPP_2M,
                                            SD_SAMPLER_DPMPP_2M_SDE, SD_SAMPLER_UNIPC,
                                            SD_SAMPLER_HEUN, SD_SAMPLER_LMS, SD_SAMPLER_DPM2};
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold7, "in_sample", (size_t)n);
    float *mo = read_from(&gold7, "in_model_out", 9 * (size_t)n);
    float *z = read_from(&gold7, "in_noise", 9 * (size_t)n);
    for (size_t k = 0; x0 && mo && z && k < sizeof kinds / sizeof kinds[0]; k++) {
        sd_sampler s;
        sd_err err;
        char name[64];
        float x[2 * 3 * 5 * 4];
        double worst = 0.0;
        snprintf(name, sizeof name, "step_%s", sd_sampler_kind_name(kinds[k]));
        if (sd_sampler_init(&s, kinds[k], &d, 5, SD_SPACING_LINSPACE, 1, n, &err) ||
            sd_sampler_use_beta(&s, &err)) {
            tap_ok(0, "beta %s: %s", name, err.msg);
            continue;
        }
        float *ref = read_from(&gold7, name, (size_t)s.n_timesteps * (size_t)n);
        for (int64_t j = 0; j < n; j++)
            x[j] = x0[j] * s.init_noise_sigma;
        sd_sampler_reset(&s);
        for (int i = 0; ref && i < s.n_timesteps; i++) {
            sd_sampler_step(&s, i, mo + (size_t)i * n, x,
                            sd_sampler_step_noise(&s, i) ? z + (size_t)i * n : NULL);
            const double e = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = e > worst ? e : worst;
        }
        tap_ok(ref && worst <= 1e-6, "beta sigmas, %s: %d calls, relative error %.3g", name,
               s.n_timesteps, worst);
        free(ref);
        sd_sampler_free(&s);
    }
    free(x0);
    free(mo);
    free(z);
    {
        sd_sampler s;
        sd_err err;
        const int ok = sd_sampler_init(&s, SD_SAMPLER_DDIM, &d, 5, SD_SPACING_LINSPACE, 1, 1,
                                       &err) == 0 &&
                       sd_sampler_use_beta(&s, &err) < 0 && strstr(err.msg, "beta");
        tap_ok(ok, "beta sigmas for ddim are refused: %s", err.msg);
        sd_sampler_free(&s);
    }
    sd_diffusion_free(&d);
}

/* tests/data/sample/prk.safetensors: PNDM with its Runge-Kutta warm-up (skip_prk_steps false):
 * the timesteps of every spacing, steps_offset and N that diffusers can run (the others refused),
 * and whole step sequences. */
/* dpmsde.safetensors: DPMSolverSDEScheduler (make_dpmsde_goldens.py), the noise of call i being
 * in_noise[i] combined as sde_step does */
static sd_st_file gold9;

static void test_dpmsde(void)
{
    static const int Ns[] = {1, 2, 3, 4, 7, 10, 50};
    sd_diffusion dd[2];
    int cases = 0, bad = 0;
    double wt = 0.0, ws = 0.0, wi = 0.0;
    if (init_sd2_schedule(&dd[0], "epsilon", 1000) || init_sd2_schedule(&dd[1], "v_prediction", 1000))
        return;
    for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
        for (int sp = 0; sp < 3; sp++)
            for (int off = 0; off < 2; off++) {
                const int N = Ns[b];
                char tag[64], name[80];
                sd_sampler s;
                sd_err err;
                snprintf(tag, sizeof tag, "%s_%d_%d", sd_spacing_name((sd_spacing)sp), N, off);
                if (sd_sampler_init(&s, SD_SAMPLER_DPMPP_SDE, &dd[0], N, (sd_spacing)sp, off, 1,
                                    &err)) {
                    bad++;
                    tap_diag("dpmpp_sde %s: %s", tag, err.msg);
                    continue;
                }
                snprintf(name, sizeof name, "ins_%s", tag);
                float *ins = read_from(&gold9, name, 1);
                if (ins) {
                    const double e = fabs((double)s.init_noise_sigma - ins[0]) / ins[0];
                    wi = e > wi ? e : wi;
                }
                if (!ins || s.n_timesteps != 2 * N - 1 ||
                    interleaved_schedule_ok(&gold9, &s, "", tag, &wt, &ws)) {
                    bad++;
                    tap_diag("dpmpp_sde %s: %d calls, timesteps off by %.3g, sigmas %.3g", tag,
                             s.n_timesteps, wt, ws);
                }
                free(ins);
                cases++;
                sd_sampler_free(&s);
            }
    for (int k = 0; k < 3; k++)
        for (int m = 0; m < 4; m++) {
            static const int KN[4] = {2, 5, 10, 25};
            static const char *pre[3] = {"k", "e", "b"};
            char tag[16];
            sd_sampler s;
            sd_err err;
            snprintf(tag, sizeof tag, "%d", KN[m]);
            if (sd_sampler_init(&s, SD_SAMPLER_DPMPP_SDE, &dd[0], KN[m], SD_SPACING_LINSPACE, 1, 1, &err) ||
                (k == 0 ? sd_sampler_use_karras(&s, &err)
                 : k == 1 ? sd_sampler_use_exponential(&s, &err)
                          : sd_sampler_use_beta(&s, &err))) {
                bad++;
                tap_diag("dpmpp_sde %s %s: %s", pre[k], tag, err.msg);
                continue;
            }
            if (interleaved_schedule_ok(&gold9, &s, pre[k], tag, &wt, &ws)) {
                bad++;
                tap_diag("dpmpp_sde %s %s: timesteps off by %.3g, sigmas %.3g", pre[k], tag, wt, ws);
            }
            cases++;
            sd_sampler_free(&s);
        }
    tap_ok(bad == 0 && cases == 54 && wi <= 1e-6,
           "dpmpp_sde: 2 N - 1 interleaved timesteps and sigmas of %d schedules (three spacings, "
           "Karras, exponential, beta) within %.3g / %.3g of diffusers', init_noise_sigma %.3g",
           cases, wt, ws, wi);

    static const step_case steps[] = {
        {"linspace_eps", 0, 0, SD_SPACING_LINSPACE, 0}, {"linspace_v", 1, 0, SD_SPACING_LINSPACE, 0},
        {"leading_eps", 0, 0, SD_SPACING_LEADING, 1},   {"trailing_eps", 0, 0, SD_SPACING_TRAILING, 0},
        {"karras_eps", 0, 1, SD_SPACING_LINSPACE, 0},
    };
    const int64_t n = STEP_N;
    float *x0 = read_from(&gold9, "in_sample", (size_t)n);
    float *mo = read_from(&gold9, "in_model_out", 15 * (size_t)n);
    float *z = read_from(&gold9, "in_noise", 15 * (size_t)n);
    for (size_t c = 0; x0 && mo && z && c < sizeof steps / sizeof steps[0]; c++) {
        int calls, noisy;
        const double worst = golden_steps(&gold9, SD_SAMPLER_DPMPP_SDE, dd, &steps[c], x0, mo, z,
                                          &calls, &noisy);
        tap_ok(worst >= 0.0 && calls == 15 && noisy == 14 && worst <= 1e-6,
               "dpmpp_sde step_%s: 8 steps (15 calls, noise at all but the last), relative error "
               "%.3g", steps[c].name, worst);
    }
    free(x0);
    free(mo);
    free(z);
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
}

static sd_st_file gold8;

static void test_prk(void)
{
    static const int Ns[] = {4, 5, 10, 50};
    sd_diffusion dd[2];
    int cases = 0, bad = 0, refused = 0;
    if (init_sd2_schedule(&dd[0], "epsilon", 1000) || init_sd2_schedule(&dd[1], "v_prediction", 1000))
        return;
    for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
        for (int sp = 0; sp < 3; sp++)
            for (int off = 0; off < 2; off++) {
                char name[80];
                sd_sampler s;
                sd_err err;
                snprintf(name, sizeof name, "ts_%s_%d_%d", sd_spacing_name((sd_spacing)sp), Ns[b],
                         off);
                const sd_st_tensor *tt = sd_st_find(&gold8, name);
                if (sd_sampler_init(&s, SD_SAMPLER_PNDM, &dd[0], Ns[b], (sd_spacing)sp, off, 1,
                                    &err)) {
                    /* the PLMS list itself outside the schedule: diffusers' too */
                    bad += tt != NULL;
                    refused += tt == NULL;
                    continue;
                }
                const int rc = sd_sampler_pndm_prk(&s, &err);
                if (!tt) { /* diffusers steps outside the schedule: refused */
                    refused += rc != 0;
                    bad += rc == 0;
                    if (rc == 0)
                        tap_diag("prk %s: accepted, diffusers fails", name);
                } else {
                    float *rt = read_from(&gold8, name, (size_t)tt->numel);
                    int same = rc == 0 && rt && s.n_timesteps == (int)tt->numel;
                    for (int i = 0; same && i < s.n_timesteps; i++)
                        same = (float)s.timesteps[i] == rt[i] && s.model_t[i] == rt[i];
                    if (!same)
                        tap_diag("prk %s: %s", name, rc ? err.msg : "other timesteps");
                    bad += !same;
                    cases++;
                    free(rt);
                }
                sd_sampler_free(&s);
            }
    tap_ok(cases + refused == 24 && cases >= 20 && bad == 0, "pndm with the Runge-Kutta warm-up: timesteps of %d "
           "(spacing, N, steps_offset) cases equal diffusers' (N + 9 calls); %d that step "
           "outside the schedule refused", cases, refused);
    {
        sd_sampler s;
        sd_err err;
        const int ok = sd_sampler_init(&s, SD_SAMPLER_PNDM, &dd[0], 3, SD_SPACING_LEADING, 1, 1,
                                       &err) == 0 &&
                       sd_sampler_pndm_prk(&s, &err) < 0 && strstr(err.msg, "at least 4 steps");
        tap_ok(ok, "pndm's warm-up with 3 steps is refused: %s", err.msg);
        sd_sampler_free(&s);
        const int ok2 = sd_sampler_init(&s, SD_SAMPLER_DDIM, &dd[0], 5, SD_SPACING_LEADING, 1, 1,
                                        &err) == 0 &&
                        sd_sampler_pndm_prk(&s, &err) < 0;
        tap_ok(ok2, "the warm-up for ddim is refused: %s", err.msg);
        sd_sampler_free(&s);
    }

    static const struct {
        const char *name;
        int N, v;
        sd_spacing spacing;
        int offset;
    } steps[] = {{"step_leading_eps_4", 4, 0, SD_SPACING_LEADING, 1},
                 {"step_leading_eps_5", 5, 0, SD_SPACING_LEADING, 1},
                 {"step_leading_eps_8", 8, 0, SD_SPACING_LEADING, 1},
                 {"step_leading_v_5", 5, 1, SD_SPACING_LEADING, 1},
                 {"step_trailing_eps_5", 5, 0, SD_SPACING_TRAILING, 0}};
    const int64_t n = 2 * 3 * 5 * 4;
    float *x0 = read_from(&gold8, "in_sample", (size_t)n);
    float *mo = read_from(&gold8, "in_model_out", 20 * (size_t)n);
    for (size_t c = 0; x0 && mo && c < sizeof steps / sizeof steps[0]; c++) {
        sd_sampler s;
        sd_err err;
        float x[2 * 3 * 5 * 4];
        double worst = 0.0;
        if (sd_sampler_init(&s, SD_SAMPLER_PNDM, &dd[steps[c].v], steps[c].N, steps[c].spacing,
                            steps[c].offset, n, &err) ||
            sd_sampler_pndm_prk(&s, &err)) {
            tap_ok(0, "prk %s: %s", steps[c].name, err.msg);
            continue;
        }
        float *ref = read_from(&gold8, steps[c].name, (size_t)s.n_timesteps * (size_t)n);
        memcpy(x, x0, sizeof x);
        sd_sampler_reset(&s);
        for (int i = 0; ref && i < s.n_timesteps; i++) {
            sd_sampler_step(&s, i, mo + (size_t)i * n, x, NULL);
            const double e = rel_err(x, ref + (size_t)i * n, n, NULL);
            worst = e > worst ? e : worst;
        }
        tap_ok(ref && worst <= 1e-6, "pndm with the warm-up, %s: %d calls (12 Runge-Kutta), "
               "relative error %.3g", steps[c].name, s.n_timesteps, worst);
        free(ref);
        sd_sampler_free(&s);
    }
    free(x0);
    free(mo);
    sd_diffusion_free(&dd[0]);
    sd_diffusion_free(&dd[1]);
}

/* goldens.safetensors: the first goldens' timesteps, steps and pipelines */
static void test_goldens(void)
{
    test_timesteps();
    test_steps();
    test_pipeline();
}

/* Opens tests/data/sample/<file> into *f, runs `test` when it opens (a failed TAP line with the
 * reason otherwise) and closes it. */
static void with_golden(sd_st_file *f, const char *file, void (*test)(void))
{
    char path[4200];
    sd_err err;
    snprintf(path, sizeof path, "%s/tests/data/sample/%s", top, file);
    if (tap_ok(sd_st_open(path, f, &err) == 0, "open %s", path)) {
        test();
        sd_st_close(f);
    } else {
        tap_diag("%s", err.msg);
    }
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    char path[4200];
    sd_err err;
    snprintf(top, sizeof top, "%s",
             srcdir ? srcdir : (getenv("top_srcdir") ? getenv("top_srcdir") : "."));
    snprintf(path, sizeof path, "%s/tests/data/sample/schedulers.safetensors", top);
    if (tap_ok(sd_st_open(path, &gold2, &err) == 0, "open %s", path)) {
        test_spacings();
        test_karras(0);
        test_karras(1);
        test_steps_more();
    } else {
        tap_diag("%s", err.msg);
    }
    with_golden(&gold3, "zero_snr.safetensors", test_zero_snr);
    with_golden(&gold4, "order3.safetensors", test_order3);
    with_golden(&gold5, "lms.safetensors", test_lms);
    with_golden(&gold6, "dpm2.safetensors", test_dpm2);
    with_golden(&gold7, "beta.safetensors", test_beta);
    with_golden(&gold8, "prk.safetensors", test_prk);
    with_golden(&gold9, "dpmsde.safetensors", test_dpmsde);
    with_golden(&gold, "goldens.safetensors", test_goldens); /* test_pipeline reads gold2 too */
    sd_st_close(&gold2);
    test_rng_and_u8();
    return tap_done();
}
