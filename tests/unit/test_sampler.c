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

static float *read_gold(const char *name, size_t n)
{
    sd_err err;
    const sd_st_tensor *t = sd_st_find(&gold, name);
    float *buf = malloc((n ? n : 1) * sizeof(float));
    if (!t || (size_t)t->numel != n || sd_st_read_f32(&gold, name, buf, n, &err) != 0) {
        tap_diag("golden %s: %s", name, t ? "wrong size or unreadable" : "missing");
        free(buf);
        return NULL;
    }
    return buf;
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
    int64_t ts[1002];
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
                int n = sd_sampler_timesteps(kinds[k], N, T, 1, ts, &err);
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
                            tap_diag("%s[%d] = %lld, expected %g", name, i, (long long)ts[i],
                                     ref[i]);
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
        int64_t out[8];
        tap_ok(sd_sampler_timesteps(SD_SAMPLER_DDIM, 0, 1000, 1, out, &err) < 0 &&
                   sd_sampler_timesteps(SD_SAMPLER_DDIM, 1001, 1000, 1, ts, &err) < 0,
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
            if (sd_sampler_init(&s, kinds[k], &d, 5, 1, n, &err)) {
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
            sd_sampler_init(&s, kind, &d, 5, 1, n, &err)) {
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

static void test_pipeline(void)
{
    static const char *prompts[2] = {"a photo of the cat", "red car at the sea"};
    static const sd_sampler_kind kinds[] = {SD_SAMPLER_DDIM, SD_SAMPLER_PNDM, SD_SAMPLER_DDPM};
    char path[4200];
    sd_err err;
    sd_snapshot snap;
    sd_unet_config uc;
    sd_vae_config vc;
    sd_clip_config cc;
    sd_weights uw, vw, cw;
    sd_tokenizer *tok = NULL;
    sd_t2i g;
    sd_diffusion d;
    int eos;
    const int64_t nl = 8 * 8 * 4, ni = 16 * 16 * 3, ne = 77 * 32;
    float *init = NULL, *dnoise = NULL, *ids_c = NULL, *ids_u = NULL, *emb = NULL, *uemb = NULL;

    memset(&uw, 0, sizeof uw);
    memset(&vw, 0, sizeof vw);
    memset(&cw, 0, sizeof cw);
    snprintf(path, sizeof path, "%s/tests/data/models/tiny-sd2", top);
    if (!tap_ok(sd_snapshot_open(&snap, path, &err) == 0 &&
                    sd_snapshot_load_unet(&snap, NULL, &uc, &uw, &err) == 0 &&
                    sd_snapshot_load_vae(&snap, NULL, &vc, &vw, &err) == 0 &&
                    sd_snapshot_load_text_encoder(&snap, NULL, &cc, &eos, &cw, &err) == 0,
                "load %s", path)) {
        tap_diag("%s", err.msg);
        return;
    }
    sd_snapshot_close(&snap);
    snprintf(path, sizeof path, "%s/tests/data/sample/tokenizer", top);
    if (!tap_ok(sd_tokenizer_load(path, &tok, &err) == 0, "tokenizer %s", path)) {
        tap_diag("%s", err.msg);
        return;
    }
    if (!tap_ok(sd_t2i_open(&g, "cpu", 0, "fp32", &uc, &uw, &vc, &vw, &cc, &cw, tok, 16, 1, 1, &err) == 0,
                "text-to-image on the CPU backend")) {
        tap_diag("%s", err.msg);
        sd_t2i_close(&g);
        return;
    }
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

    for (int k = 0; k < 3; k++)
        for (int gi = 0; gi < 2; gi++) {
            const double gs = gi == 0 ? 7.5 : 1.0;
            char name[64];
            sd_sampler s;
            float lat[2 * 8 * 8 * 4], img[2 * 16 * 16 * 3];
            uint8_t u8[16 * 16 * 3];
            int u8_off = 0;
            if (sd_sampler_init(&s, kinds[k], &d, 4, 1, nl, &err)) {
                tap_ok(0, "%s", err.msg);
                continue;
            }
            snprintf(name, sizeof name, "%s_g%s", sd_sampler_kind_name(kinds[k]), gi ? "10" : "75");
            for (int p = 0; p < 2; p++) {
                fixed_noise fn = {dnoise, p, nl};
                memcpy(lat + (size_t)p * nl, init + (size_t)p * nl, (size_t)nl * sizeof(float));
                sd_t2i_denoise(&g, &s, emb + (size_t)p * ne, gs > 1.0 ? uemb : NULL, gs,
                               lat + (size_t)p * nl, give_noise, &fn);
                sd_t2i_decode(&g, lat + (size_t)p * nl, vc.scaling_factor, img + (size_t)p * ni);
            }
            char key[80];
            snprintf(key, sizeof key, "latents_%s", name);
            float *rl = read_gold(key, 2 * (size_t)nl);
            snprintf(key, sizeof key, "image_%s", name);
            float *ri = read_gold(key, 2 * (size_t)ni);
            snprintf(key, sizeof key, "u8_%s", name);
            float *ru = read_gold(key, 2 * (size_t)ni);
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
            tap_ok(rl && el <= TOL, "pipeline %s (%d model calls): latents relative error %.3g "
                   "(max |diff| %.3g)", name, s.n_timesteps, el, ml);
            tap_ok(ri && ei <= TOL, "pipeline %s: decoded image relative error %.3g (max |diff| "
                   "%.3g)", name, ei, mi);
            tap_ok(ru && u8_off <= 1, "pipeline %s: uint8 image within %d of diffusers' "
                   "post-processing", name, u8_off);
            free(rl);
            free(ri);
            free(ru);
            sd_sampler_free(&s);
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

int main(void)
{
    const char *srcdir = getenv("srcdir");
    char path[4200];
    sd_err err;
    snprintf(top, sizeof top, "%s",
             srcdir ? srcdir : (getenv("top_srcdir") ? getenv("top_srcdir") : "."));
    snprintf(path, sizeof path, "%s/tests/data/sample/goldens.safetensors", top);
    if (tap_ok(sd_st_open(path, &gold, &err) == 0, "open %s", path)) {
        test_timesteps();
        test_steps();
        test_pipeline();
        sd_st_close(&gold);
    } else {
        tap_diag("%s", err.msg);
    }
    test_rng_and_u8();
    return tap_done();
}
