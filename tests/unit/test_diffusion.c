/* Tests of src/train/diffusion.c: schedules and targets against diffusers 0.42.1 / torch 2.15
 * goldens (tests/reference/make_diffusion_goldens.py), RNG invariance and distributions.
 *
 * Betas and alphas_cumprod are compared bit for bit. Everything downstream of a square root is
 * compared to 1e-6 relative: torch's CPU float sqrt (this build, AVX2 and default kernels) is
 * not correctly rounded (errors up to ~0.75 ulp on ~15-20% of inputs, depending on tensor size
 * and CPU), while sd_diffusion uses the correctly rounded sqrtf (as CUDA's sqrtf is). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/diffusion.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"
#include "sdtrain/safetensors.h"
#include "tap.h"

static sd_st_file gold;
static int have_gold;

static float *read_gold(const char *name, size_t n)
{
    sd_err err;
    float *buf = malloc(n * sizeof(float));
    if (!buf || sd_st_read_f32(&gold, name, buf, n, &err) != 0) {
        tap_diag("golden %s: %s", name, buf ? err.msg : "out of memory");
        free(buf);
        return NULL;
    }
    return buf;
}

/* Number of elements that are not bit-identical; the largest relative difference in *maxrel. */
static size_t compare(const float *a, const float *b, size_t n, double *maxrel)
{
    size_t bad = 0;
    *maxrel = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            bad++;
        double den = fabs((double)b[i]) > 1e-30 ? fabs((double)b[i]) : 1e-30;
        double r = fabs((double)a[i] - (double)b[i]) / den;
        if (r > *maxrel)
            *maxrel = r;
    }
    return bad;
}

/* max |a - b| / max(max |b|, 1e-30): the error relative to the array's scale (elementwise
 * relative errors blow up where a difference of products cancels). */
static double normwise(const float *a, const float *b, size_t n)
{
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (e > num)
            num = e;
        if (fabs((double)b[i]) > den)
            den = fabs((double)b[i]);
    }
    return num / den;
}

static void test_schedules(void)
{
    static const char *scheds[2] = {"scaled_linear", "linear"};
    static const double ranges[2][2] = {{0.00085, 0.012}, {0.0001, 0.02}};
    static const char *caps[2] = {"avx2", "default"};
    for (int s = 0; s < 2; s++) {
        for (int k = 0; k < 2; k++) {
            sd_diffusion d;
            sd_err err;
            char name[96];
            double rel = 0;
            if (!tap_ok(sd_diffusion_init(&d, scheds[s], ranges[s][0], ranges[s][1], 1000,
                                          "epsilon", k == 0 ? SD_LINSPACE_FUSED
                                                            : SD_LINSPACE_UNFUSED,
                                          &err) == 0,
                        "init %s", scheds[s]))
                continue;
            snprintf(name, sizeof name, "betas_%s_%s", scheds[s], caps[k]);
            float *g = read_gold(name, 1000);
            size_t bad = g ? compare(d.betas, g, 1000, &rel) : 1000;
            tap_ok(g && bad == 0, "%s: bit-identical to torch (%zu differ, max rel %.3g)", name,
                   bad, g ? rel : 0.0);
            free(g);
            snprintf(name, sizeof name, "alphas_cumprod_%s_%s", scheds[s], caps[k]);
            g = read_gold(name, 1000);
            bad = g ? compare(d.alphas_cumprod, g, 1000, &rel) : 1000;
            tap_ok(g && bad == 0, "%s: bit-identical to torch (%zu differ, max rel %.3g)", name,
                   bad, g ? rel : 0.0);
            free(g);
            sd_diffusion_free(&d);
        }
    }
    /* the two torch flavours do differ, so the test above can tell them apart */
    float a[1000], b[1000];
    sd_linspace_f32(sqrt(0.00085), sqrt(0.012), 1000, SD_LINSPACE_FUSED, a);
    sd_linspace_f32(sqrt(0.00085), sqrt(0.012), 1000, SD_LINSPACE_UNFUSED, b);
    int ndiff = 0;
    for (int i = 0; i < 1000; i++)
        ndiff += a[i] != b[i];
    tap_ok(ndiff > 0 && a[0] == (float)sqrt(0.00085) && a[999] == (float)sqrt(0.012),
           "fused and unfused linspace differ in %d elements; endpoints exact", ndiff);

    /* spec 5.2 anchors (double precision values) */
    sd_diffusion d;
    sd_err err;
    sd_diffusion_init(&d, "SCALED_LINEAR", 0.00085, 0.012, 1000, "epsilon", SD_LINSPACE_FUSED,
                      &err);
    static const int at[] = {0, 20, 250, 500, 750, 981, 999};
    static const double val[] = {0.99915, 0.981314, 0.673793, 0.276333, 0.0561698, 0.0057755,
                                 0.0046601};
    double worst = 0;
    for (int i = 0; i < 7; i++) {
        double r = fabs(d.alphas_cumprod[at[i]] - val[i]) / val[i];
        if (r > worst)
            worst = r;
    }
    tap_ok(worst < 2e-5, "spec 5.2 abar anchors (max rel %.3g)", worst);
    tap_ok(fabs(d.sqrt_abar[999] - 0.068265) < 1e-6 &&
               fabs(d.sqrt_one_minus_abar[999] - 0.997667) < 1e-6,
           "sqrt(abar_999) %.7f, sqrt(1-abar_999) %.7f", d.sqrt_abar[999],
           d.sqrt_one_minus_abar[999]);
    sd_diffusion_free(&d);

    tap_ok(sd_diffusion_init(&d, "cosine", 0.1, 0.2, 1000, "epsilon", 0, &err) == -1 &&
               strstr(err.msg, "cosine") != NULL,
           "unknown schedule rejected: %s", err.msg);
    tap_ok(sd_diffusion_init(&d, "linear", 0.1, 0.2, 1000, "sample", 0, &err) == -1,
           "unknown prediction type rejected: %s", err.msg);
    tap_ok(sd_diffusion_init(&d, "linear", 0.3, 0.2, 1000, "epsilon", 0, &err) == -1 &&
               sd_diffusion_init(&d, "linear", 0.1, 0.2, 0, "epsilon", 0, &err) == -1,
           "bad beta range and T = 0 rejected");
}

static void test_targets_and_loss(void)
{
    enum { B = 4, PER = 4 * 3 * 5, N = B * PER };
    const int32_t t[B] = {0, 17, 500, 999};
    int64_t traw[B];
    sd_err err;
    const sd_st_tensor *tt = sd_st_find(&gold, "timesteps");
    tap_ok(tt && sd_st_tensor_read_raw(tt, traw, sizeof traw, &err) == 0 && traw[0] == t[0] &&
               traw[1] == t[1] && traw[2] == t[2] && traw[3] == t[3],
           "golden timesteps are 0, 17, 500, 999");
    float *x0 = read_gold("x0", N), *eps = read_gold("noise", N), *pred = read_gold("pred", N);
    if (!x0 || !eps || !pred) {
        tap_ok(0, "golden inputs");
        return;
    }
    for (int p = 0; p < 2; p++) {
        sd_diffusion d;
        const char *sfx = p == 0 ? "eps" : "v";
        sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000,
                          p == 0 ? "epsilon" : "v_prediction", SD_LINSPACE_FUSED, &err);
        float xt[N], v[N], target[N], grad[N];
        char name[64];
        double rel = 0;
        size_t bad;
        sd_diffusion_add_noise(&d, t, B, PER, x0, eps, xt);
        snprintf(name, sizeof name, "noisy_%s", sfx);
        float *g = read_gold(name, N);
        bad = g ? compare(xt, g, N, &rel) : N;
        tap_ok(g && rel <= 1e-6, "add_noise (%s) within 1e-6 (%zu of %d not bit-identical, max "
               "rel %.3g)", sfx, bad, N, rel);
        free(g);
        /* with torch's square roots in place, the arithmetic itself is bit-identical */
        float tsa[B], tsb[B], xt2[N], v2[N];
        float *gn = read_gold(p == 0 ? "noisy_eps" : "noisy_v", N);
        float *gv = read_gold(p == 0 ? "velocity" : "velocity_v", N);
        sd_diffusion dt = d;
        dt.sqrt_abar = calloc(1000, sizeof(float));
        dt.sqrt_one_minus_abar = calloc(1000, sizeof(float));
        sd_err e2;
        int ok = dt.sqrt_abar && dt.sqrt_one_minus_abar && gn && gv &&
                 sd_st_read_f32(&gold, "torch_sqrt_abar_t", tsa, B, &e2) == 0 &&
                 sd_st_read_f32(&gold, "torch_sqrt_1m_abar_t", tsb, B, &e2) == 0;
        if (ok) {
            for (int b = 0; b < B; b++) {
                dt.sqrt_abar[t[b]] = tsa[b];
                dt.sqrt_one_minus_abar[t[b]] = tsb[b];
            }
            sd_diffusion_add_noise(&dt, t, B, PER, x0, eps, xt2);
            sd_diffusion_velocity(&dt, t, B, PER, x0, eps, v2);
            ok = memcmp(xt2, gn, sizeof xt2) == 0 && memcmp(v2, gv, sizeof v2) == 0;
        }
        tap_ok(ok, "add_noise and get_velocity (%s) bit-identical given torch's sqrt factors", sfx);
        free(dt.sqrt_abar);
        free(dt.sqrt_one_minus_abar);
        free(gn);
        free(gv);
        sd_diffusion_velocity(&d, t, B, PER, x0, eps, v);
        g = read_gold(p == 0 ? "velocity" : "velocity_v", N);
        bad = g ? compare(v, g, N, &rel) : N;
        tap_ok(g && normwise(v, g, N) <= 1e-6, "get_velocity (%s) within 1e-6 of max |v| (%zu "
               "of %d not bit-identical, max elementwise rel %.3g)", sfx, bad, N, rel);
        free(g);

        g = read_gold("snr", 1000);
        bad = g ? compare(d.snr, g, 1000, &rel) : 1000;
        tap_ok(g && rel <= 1e-6, "compute_snr within 1e-6 (%zu of 1000 not bit-identical, max "
               "rel %.3g)", bad, rel);
        free(g);

        d.min_snr_gamma = 5.0;
        int32_t all_t[1000];
        float w[1000];
        for (int i = 0; i < 1000; i++)
            all_t[i] = i;
        sd_diffusion_loss_weights(&d, all_t, 1000, w);
        snprintf(name, sizeof name, "minsnr_%s_g5", sfx);
        g = read_gold(name, 1000);
        bad = g ? compare(w, g, 1000, &rel) : 1000;
        tap_ok(g && rel <= 1e-6, "min-SNR weights (%s, gamma 5) within 1e-6 (%zu of 1000 not "
               "bit-identical, max rel %.3g)", sfx, bad, rel);
        free(g);

        /* with torch's SNR in place, the min-SNR weights are bit-identical */
        float *gsnr = read_gold("snr", 1000);
        if (gsnr) {
            float *own = d.snr;
            d.snr = gsnr;
            sd_diffusion_loss_weights(&d, all_t, 1000, w);
            d.snr = own;
            g = read_gold(name, 1000);
            bad = g ? compare(w, g, 1000, &rel) : 1000;
            tap_ok(g && bad == 0, "min-SNR weights (%s) bit-identical given torch's SNR", sfx);
            free(g);
        } else {
            tap_ok(0, "golden snr");
        }
        free(gsnr);

        sd_diffusion_target(&d, t, B, PER, x0, eps, target);
        float mse[B];
        double loss = sd_diffusion_loss(&d, t, B, PER, 0, pred, target, mse, grad);
        snprintf(name, sizeof name, "loss_%s_g5", sfx);
        g = read_gold(name, 1);
        rel = g ? fabs(loss - g[0]) / fabs(g[0]) : 1;
        tap_ok(g && rel <= 1e-6, "weighted loss (%s) %.9g vs torch %.9g (rel %.3g)", sfx, loss,
               g ? g[0] : 0.0, rel);
        free(g);
        snprintf(name, sizeof name, "grad_%s_g5", sfx);
        g = read_gold(name, N);
        bad = g ? compare(grad, g, N, &rel) : N;
        tap_ok(g && normwise(grad, g, N) <= 1e-6, "d loss / d pred (%s) within 1e-6 of max |g| "
               "(%zu not bit-identical, max elementwise rel %.3g)", sfx, bad, rel);
        free(g);

        /* two ranks holding 2 samples each add up to the whole batch's loss and gradient */
        float grad2[N];
        double l0 = sd_diffusion_loss(&d, t, 2, PER, B, pred, target, NULL, grad2);
        double l1 = sd_diffusion_loss(&d, t + 2, 2, PER, B, pred + 2 * PER, target + 2 * PER,
                                      NULL, grad2 + 2 * PER);
        tap_ok(fabs(l0 + l1 - loss) <= 1e-12 * fabs(loss) &&
                   memcmp(grad, grad2, sizeof grad) == 0,
               "split batch (batch_global = 4): losses add up, gradients identical");
        sd_diffusion_free(&d);
    }

    sd_diffusion d;
    sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, "epsilon", SD_LINSPACE_FUSED,
                      &err);
    float grad[N], w[B];
    double loss = sd_diffusion_loss(&d, t, B, PER, 0, pred, eps, NULL, grad);
    sd_diffusion_loss_weights(&d, t, B, w);
    float *g = read_gold("loss_plain", 1);
    double rel = g ? fabs(loss - g[0]) / fabs(g[0]) : 1;
    tap_ok(g && rel <= 1e-6 && w[0] == 1 && w[3] == 1,
           "plain MSE (no min-SNR) %.9g vs torch %.9g (rel %.3g)", loss, g ? g[0] : 0.0, rel);
    free(g);
    g = read_gold("grad_plain", N);
    size_t bad = g ? compare(grad, g, N, &rel) : N;
    tap_ok(g && rel <= 1e-6, "plain MSE gradient within 1e-6 (%zu not bit-identical, max rel "
           "%.3g)", bad, rel);
    free(g);
    sd_diffusion_free(&d);
    free(x0);
    free(eps);
    free(pred);
}

static void test_invariance(void)
{
    enum { C = 4, HW = 6 * 5, PER = C * HW };
    sd_diffusion d;
    sd_err err;
    sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, "epsilon", SD_LINSPACE_FUSED,
                      &err);
    d.caption_dropout = 0.5;
    d.noise_offset = 0.1;
    const uint64_t seed = 0x1234567890abcdefULL, step = 77;
    int32_t t8[8], t4[8];
    unsigned char dr8[8], dr4[8];
    static float n8[8 * PER], n4[8 * PER];
    int ok = sd_diffusion_batch_randoms(&d, seed, step, 100, 8, C, HW, t8, dr8, n8, &err) == 0 &&
             sd_diffusion_batch_randoms(&d, seed, step, 100, 4, C, HW, t4, dr4, n4, &err) == 0 &&
             sd_diffusion_batch_randoms(&d, seed, step, 104, 4, C, HW, t4 + 4, dr4 + 4,
                                        n4 + 4 * PER, &err) == 0;
    tap_ok(ok && memcmp(t8, t4, sizeof t8) == 0 && memcmp(dr8, dr4, sizeof dr8) == 0 &&
               memcmp(n8, n4, sizeof n8) == 0,
           "samples [100,108) = [100,104) u [104,108): timesteps, drops, noise identical");
    int32_t t1[8];
    unsigned char dr1[8];
    ok = 1;
    for (int i = 7; i >= 0; i--) /* one at a time, in reverse order */
        ok &= sd_diffusion_batch_randoms(&d, seed, step, 100 + (uint64_t)i, 1, C, HW, &t1[i],
                                         &dr1[i], NULL, &err) == 0;
    tap_ok(ok && memcmp(t8, t1, sizeof t8) == 0 && memcmp(dr8, dr1, sizeof dr8) == 0,
           "per-sample draws in any order give the same timesteps and drops");

    /* slices of one sample's noise, cutting through channels, with the noise offset */
    float part[PER];
    size_t cuts[] = {0, 7, 29, 30, 31, 95, PER};
    ok = 1;
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++)
        ok &= sd_diffusion_noise(&d, seed, step, 103, C, HW, cuts[i], part + cuts[i],
                                 cuts[i + 1] - cuts[i], &err) == 0;
    tap_ok(ok && memcmp(part, n8 + 3 * PER, sizeof part) == 0,
           "noise slices cut at 7, 29, 30, 31, 95 equal the whole fill");
    /* the offset term is one constant per (sample, channel) */
    float plain[PER];
    d.noise_offset = 0.0;
    sd_diffusion_noise(&d, seed, step, 103, C, HW, 0, plain, PER, &err);
    int consistent = 1;
    for (int c = 0; c < C; c++) {
        float delta = part[c * HW] - plain[c * HW];
        for (int k = 1; k < HW; k++)
            consistent &= fabsf((part[c * HW + k] - plain[c * HW + k]) - delta) < 1e-6f;
        consistent &= fabsf(delta) > 0.0f && fabsf(delta) < 0.6f;
    }
    tap_ok(consistent, "noise offset adds one constant per channel");
    tap_ok(sd_diffusion_noise(&d, seed, step, 103, C, HW, 100, part, 21, &err) == -1,
           "noise range beyond the latent rejected: %s", err.msg);

    /* timesteps and noise change with seed, step and sample */
    tap_ok(sd_diffusion_timestep(&d, seed, step, 100) == (uint32_t)t8[0] &&
               sd_diffusion_timestep(&d, seed, step, 100) ==
                   sd_rng_below(seed, SD_RNG_PURPOSE(SD_RNG_TIMESTEP, 0), step, 100, 0, 1000),
           "timestep = sd_rng_below(TIMESTEP site 0, draw 0, n = T)");
    int differ = 0;
    for (uint64_t s = 0; s < 16; s++)
        differ += sd_diffusion_timestep(&d, seed, step, s) != sd_diffusion_timestep(&d, seed, step + 1, s);
    tap_ok(differ >= 14, "timesteps differ between steps (%d of 16)", differ);

    /* latent sampling: slices match, formula, clamp */
    float mean[PER], logvar[PER], z[PER], z2[PER], eta[PER];
    for (int i = 0; i < PER; i++) {
        mean[i] = 0.01f * (float)i - 0.5f;
        logvar[i] = -40.0f + 0.6f * (float)i; /* crosses both clamps */
    }
    ok = sd_diffusion_sample_latent(seed, step, 9, 0.18215f, mean, logvar, 0, z, PER, &err) == 0 &&
         sd_diffusion_sample_latent(seed, step, 9, 0.18215f, mean, logvar, 0, z2, 50, &err) == 0 &&
         sd_diffusion_sample_latent(seed, step, 9, 0.18215f, mean + 50, logvar + 50, 50, z2 + 50,
                                    PER - 50, &err) == 0;
    tap_ok(ok && memcmp(z, z2, sizeof z) == 0, "latent sample slices equal the whole");
    sd_rng_fill_normal(seed, SD_RNG_PURPOSE(SD_RNG_LATENT, 0), step, 9, eta, PER);
    int formula = 1;
    for (int i = 0; i < PER; i++) {
        double lv = logvar[i] < -30 ? -30 : (logvar[i] > 20 ? 20 : logvar[i]);
        double want = 0.18215 * (mean[i] + exp(0.5 * lv) * eta[i]);
        formula &= fabs(z[i] - want) <= 1e-5 * (fabs(want) + 1e-3);
    }
    tap_ok(formula, "z = 0.18215 * (mean + exp(0.5 clamp(logvar, -30, 20)) * eta)");
    sd_diffusion_free(&d);
}

static void test_distributions(void)
{
    sd_diffusion d;
    sd_err err;
    sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, "epsilon", SD_LINSPACE_FUSED,
                      &err);
    enum { NS = 200000 };
    static int hist[1000];
    for (uint64_t s = 0; s < NS; s++)
        hist[sd_diffusion_timestep(&d, 42, 3, s)]++;
    double chi2 = 0, e = NS / 1000.0;
    for (int i = 0; i < 1000; i++)
        chi2 += (hist[i] - e) * (hist[i] - e) / e;
    /* df 999: mean 999, sd sqrt(2 * 999) ~ 44.7; accept within 5 sd */
    tap_ok(chi2 > 999 - 5 * 44.7 && chi2 < 999 + 5 * 44.7,
           "timestep histogram chi-square %.1f (df 999)", chi2);

    d.caption_dropout = 0.1;
    int drops = 0;
    for (uint64_t s = 0; s < NS; s++)
        drops += sd_diffusion_drop_caption(&d, 42, 3, s);
    double sd = sqrt(NS * 0.1 * 0.9);
    tap_ok(fabs(drops - NS * 0.1) < 5 * sd, "caption dropout 0.1: %d of %d dropped", drops, NS);
    d.caption_dropout = 0.0;
    int none = 0;
    for (uint64_t s = 0; s < 1000; s++)
        none += sd_diffusion_drop_caption(&d, 42, 3, s);
    d.caption_dropout = 1.0;
    int all = 0;
    for (uint64_t s = 0; s < 1000; s++)
        all += sd_diffusion_drop_caption(&d, 42, 3, s);
    tap_ok(none == 0 && all == 1000, "caption dropout 0 never drops, 1 always drops");

    /* noise moments over 64 samples of a 4 x 64 x 64 latent */
    enum { C = 4, HW = 64 * 64 };
    static float nz[C * HW];
    double m1 = 0, m2 = 0, m3 = 0, m4 = 0;
    long cnt = 0;
    d.noise_offset = 0.0;
    for (uint64_t s = 0; s < 64; s++) {
        sd_diffusion_noise(&d, 42, 3, s, C, HW, 0, nz, C * HW, &err);
        for (int i = 0; i < C * HW; i++) {
            double x = nz[i];
            m1 += x;
            m2 += x * x;
            m3 += x * x * x;
            m4 += x * x * x * x;
            cnt++;
        }
    }
    m1 /= cnt;
    m2 /= cnt;
    m3 /= cnt;
    m4 /= cnt;
    double se = 1.0 / sqrt((double)cnt);
    tap_ok(fabs(m1) < 5 * se && fabs(m2 - 1) < 5 * sqrt(2.0) * se &&
               fabs(m3) < 5 * sqrt(15.0) * se && fabs(m4 - 3) < 5 * sqrt(96.0) * se,
           "noise moments over %ld normals: mean %.4f, E x^2 %.4f, E x^3 %.4f, E x^4 %.4f", cnt,
           m1, m2, m3, m4);

    /* noise offset: the per-channel mean has variance offset^2 + 1/HW */
    d.noise_offset = 0.5;
    double v = 0;
    int nch = 0;
    for (uint64_t s = 0; s < 256; s++) {
        sd_diffusion_noise(&d, 42, 4, s, C, HW, 0, nz, C * HW, &err);
        for (int c = 0; c < C; c++) {
            double mc = 0;
            for (int k = 0; k < HW; k++)
                mc += nz[c * HW + k];
            mc /= HW;
            v += mc * mc;
            nch++;
        }
    }
    v /= nch;
    double want = 0.25 + 1.0 / HW;
    tap_ok(fabs(v - want) < 5 * want * sqrt(2.0 / nch),
           "noise offset 0.5: channel-mean variance %.4f (expected %.4f)", v, want);
    sd_diffusion_free(&d);
}

static void test_config(void)
{
    sd_run_config rc;
    sd_diffusion d, ref;
    sd_err err;
    sd_run_config_init(&rc);
    int ok = sd_config_apply_set(&rc, "diffusion.min_snr_gamma=5", 1, &err) == 0 &&
             sd_config_apply_set(&rc, "diffusion.caption_dropout=0.1", 2, &err) == 0 &&
             sd_config_apply_set(&rc, "diffusion.prediction_type='v_prediction'", 3, &err) == 0;
    ok = ok && sd_diffusion_init_config(&d, &rc.cfg, &err) == 0;
    ok = ok && sd_diffusion_init(&ref, "scaled_linear", 0.00085, 0.012, 1000, "v_prediction",
                                 SD_LINSPACE_FUSED, &err) == 0;
    tap_ok(ok && d.num_train_timesteps == 1000 && d.prediction == SD_PRED_V &&
               d.min_snr_gamma == 5.0 && d.caption_dropout == 0.1 && d.noise_offset == 0.0 &&
               memcmp(d.alphas_cumprod, ref.alphas_cumprod, 1000 * sizeof(float)) == 0,
           "init from the &diffusion defaults plus --set overrides%s%s", ok ? "" : ": ",
           ok ? "" : err.msg);
    if (ok) {
        sd_diffusion_free(&d);
        sd_diffusion_free(&ref);
    }
    sd_run_config_free(&rc);
}

/* Zero terminal SNR in training (the schedule itself is checked against diffusers in
 * test_sampler): at t = T - 1 the input is the noise, the v target -x0, the SNR and the min-SNR
 * weight (v_prediction) 0, the loss and its gradient finite; &diffusion refuses it with an
 * epsilon model. */
static void test_zero_snr_training(void)
{
    sd_run_config rc;
    sd_diffusion d;
    sd_err err;
    sd_run_config_init(&rc);
    int ok = sd_config_apply_set(&rc, "diffusion.rescale_betas_zero_snr=.true.", 1, &err) == 0 &&
             sd_config_apply_set(&rc, "diffusion.min_snr_gamma=5", 2, &err) == 0;
    const int refused = ok && sd_diffusion_init_config(&d, &rc.cfg, &err) < 0 &&
                        strstr(err.msg, "v_prediction") != NULL;
    tap_ok(refused, "zero terminal SNR with prediction_type 'epsilon' refused: %s", err.msg);
    ok = ok && sd_config_apply_set(&rc, "diffusion.prediction_type='v_prediction'", 3, &err) == 0 &&
         sd_diffusion_init_config(&d, &rc.cfg, &err) == 0;
    if (!tap_ok(ok && d.zero_snr, "zero terminal SNR from &diffusion%s%s", ok ? "" : ": ",
                ok ? "" : err.msg)) {
        sd_run_config_free(&rc);
        return;
    }
    enum { B = 3, PER = 8 };
    const int32_t t[B] = {999, 500, 0};
    float x0[B * PER], eps[B * PER], xt[B * PER], v[B * PER], pred[B * PER], grad[B * PER],
        w[B], mse[B];
    for (int i = 0; i < B * PER; i++) {
        x0[i] = (float)((i * 37) % 17) / 8.0f - 1.0f;
        eps[i] = (float)((i * 11) % 13) / 6.0f - 1.0f;
        pred[i] = 0.5f * eps[i];
    }
    sd_diffusion_add_noise(&d, t, B, PER, x0, eps, xt);
    sd_diffusion_target(&d, t, B, PER, x0, eps, v);
    sd_diffusion_loss_weights(&d, t, B, w);
    const double loss = sd_diffusion_loss(&d, t, B, PER, 0, pred, v, mse, grad);
    int exact = 1, finite = isfinite(loss);
    for (int i = 0; i < PER; i++)
        exact = exact && xt[i] == eps[i] && v[i] == -x0[i];
    for (int i = 0; i < B * PER; i++)
        finite = finite && isfinite(grad[i]);
    tap_ok(exact && d.snr[999] == 0.0f && w[0] == 0.0f && w[1] > 0.0f && w[2] > 0.0f && finite &&
               grad[0] == 0.0f,
           "zero terminal SNR: x_999 = eps, v = -x0, SNR 0, min-SNR weights %g %g %g, loss %.6g "
           "and gradient finite (0 at t = 999)", w[0], w[1], w[2], loss);
    sd_diffusion_free(&d);
    sd_run_config_free(&rc);
}

/* Input perturbation: out = eps + p * n with n the stream SD_RNG_NOISE site 2, element by
 * element in C,H,W order; slices fill alone; 0 = eps; out may alias eps. */
static void test_input_perturbation(void)
{
    sd_diffusion d;
    sd_err err;
    enum { C = 4, HW = 300, N = C * HW };
    static float eps[N], out[N], a[N], z[N];
    if (sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, "epsilon", SD_LINSPACE_FUSED,
                          &err)) {
        tap_ok(0, "init: %s", err.msg);
        return;
    }
    d.input_perturbation = 0.25;
    int ok = sd_diffusion_noise(&d, 7, 3, 11, C, HW, 0, eps, N, &err) == 0 &&
             sd_diffusion_perturb_noise(&d, 7, 3, 11, C, HW, 0, eps, out, N, &err) == 0 &&
             sd_rng_fill_normal_at(7, SD_RNG_PURPOSE(SD_RNG_NOISE, 2), 3, 11, 0, z, N) == 0;
    int exact = ok;
    double mean = 0.0, var = 0.0;
    for (int i = 0; ok && i < N; i++) {
        const float add = 0.25f * z[i];
        exact = exact && out[i] == eps[i] + add;
        const double r = ((double)out[i] - eps[i]) / 0.25;
        mean += r;
        var += r * r;
    }
    mean /= N;
    var = var / N - mean * mean;
    /* slices [0, 257) and [257, N) fill alone; in place */
    memcpy(a, eps, sizeof a);
    ok = ok && sd_diffusion_perturb_noise(&d, 7, 3, 11, C, HW, 0, a, a, 257, &err) == 0 &&
         sd_diffusion_perturb_noise(&d, 7, 3, 11, C, HW, 257, a + 257, a + 257, N - 257, &err) == 0;
    const int sliced = ok && memcmp(a, out, sizeof a) == 0;
    d.input_perturbation = 0.0;
    ok = ok && sd_diffusion_perturb_noise(&d, 7, 3, 11, C, HW, 0, eps, a, N, &err) == 0;
    const int zero = ok && memcmp(a, eps, sizeof a) == 0;
    const int refused = sd_diffusion_perturb_noise(&d, 7, 3, 11, C, HW, 1, eps, a, N, &err) < 0;
    tap_ok(ok && exact && sliced && zero && refused && fabs(mean) < 0.1 && fabs(var - 1.0) < 0.1,
           "input perturbation: eps + 0.25 n (stream NOISE site 2) exactly, slices and in place "
           "alike, 0 = eps, out of range refused; n mean %.3f, variance %.3f", mean, var);
    sd_diffusion_free(&d);
}

/* The backend objective (sd_mse_loss on the CPU backend, NHWC, with sd_diffusion_loss_coef and
 * sd_diffusion_loss_from_mse) against sd_diffusion_loss on the NCHW arrays: the same bits. */
static void test_backend_objective(void)
{
    enum { B = 5, C = 4, H = 6, W = 7, HW = H * W, PER = C * HW };
    const sd_backend *be = sd_backend_cpu();
    static float pred[B * PER], target[B * PER], ph[B * PER], th[B * PER], grad[B * PER],
        gh[B * PER], dy[B * PER];
    float mse[B], mse2[B], mse3[B], coef[B];
    int32_t t[B] = {0, 17, 250, 600, 999};
    sd_diffusion d;
    sd_err err;
    int ok = 1;
    for (int pi = 0; pi < 2; pi++) {
        const char *pred_type = pi ? "v_prediction" : "epsilon";
        SD_CHECK(sd_diffusion_init(&d, "scaled_linear", 0.00085, 0.012, 1000, pred_type,
                                   SD_LINSPACE_FUSED, &err) == 0, "%s", err.msg);
        d.min_snr_gamma = 5.0; /* weights other than 1 */
        for (int i = 0; i < B * PER; i++) {
            pred[i] = sd_rng_uniform_float(11, 1, 0, (uint64_t)pi, (uint64_t)i) * 4.0f - 2.0f;
            target[i] = sd_rng_uniform_float(11, 2, 0, (uint64_t)pi, (uint64_t)i) * 4.0f - 2.0f;
        }
        double l = sd_diffusion_loss(&d, t, B, PER, 16, pred, target, mse, grad);
        sd_nchw_to_nhwc(be, B, C, H, W, pred, ph);
        sd_nchw_to_nhwc(be, B, C, H, W, target, th);
        sd_nchw_to_nhwc(be, B, C, H, W, grad, gh);
        sd_diffusion_loss_coef(&d, t, B, PER, 16, coef);
        sd_mse_loss(be, B, HW, C, ph, th, coef, mse2, dy);
        sd_mse_loss(be, B, HW, C, ph, th, NULL, mse3, NULL);
        double l2 = sd_diffusion_loss_from_mse(&d, t, B, 16, mse2);
        ok = ok && memcmp(mse, mse2, sizeof mse) == 0 && memcmp(mse, mse3, sizeof mse) == 0 &&
             memcmp(gh, dy, sizeof dy) == 0 && l == l2 && l > 0;
        sd_diffusion_free(&d);
    }
    tap_ok(ok, "sd_mse_loss (CPU, NHWC) + loss_coef + loss_from_mse == sd_diffusion_loss bit for bit "
               "(epsilon and v, min-SNR 5)");
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    char path[4096];
    sd_err err;
    snprintf(path, sizeof path, "%s/tests/data/diffusion/goldens.safetensors",
             srcdir ? srcdir : (getenv("top_srcdir") ? getenv("top_srcdir") : "."));
    have_gold = sd_st_open(path, &gold, &err) == 0;
    if (tap_ok(have_gold, "open %s", path)) {
        test_schedules();
        test_targets_and_loss();
    } else {
        tap_diag("%s", err.msg);
    }
    test_config();
    test_zero_snr_training();
    test_input_perturbation();
    test_invariance();
    test_distributions();
    test_backend_objective();
    if (have_gold)
        sd_st_close(&gold);
    return tap_done();
}
