/* AdamW, LR schedules, clipping helpers, non-finite check and EMA on flat fp32 ranges
 * (see include/sdtrain/optim.h and sd2-model-spec.md §6.4). */
#include "sdtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

/* Below this many elements a loop runs on one thread (the result is the same either way). */
#define OMP_MIN 32768

int sd_lr_schedule_from_name(const char *name, sd_lr_schedule *out, sd_err *err)
{
    if (name && strcmp(name, "constant") == 0)
        *out = SD_LR_CONSTANT;
    else if (name && strcmp(name, "linear") == 0)
        *out = SD_LR_LINEAR;
    else if (name && strcmp(name, "cosine") == 0)
        *out = SD_LR_COSINE;
    else
        return sd_err_set(err, "unknown lr_schedule '%s' (constant, linear or cosine)",
                          name ? name : "(null)");
    return 0;
}

const char *sd_lr_schedule_name(sd_lr_schedule s)
{
    switch (s) {
    case SD_LR_CONSTANT: return "constant";
    case SD_LR_LINEAR: return "linear";
    case SD_LR_COSINE: return "cosine";
    }
    return "?";
}

double sd_lr_factor(sd_lr_schedule s, int64_t k, int64_t warmup, int64_t max_steps)
{
    if (k < 0)
        k = 0;
    if (warmup < 0)
        warmup = 0;
    if (k < warmup)
        return (double)k / (double)(warmup > 1 ? warmup : 1);
    if (s == SD_LR_CONSTANT)
        return 1.0;
    if (k >= max_steps)
        return 0.0;
    int64_t span = max_steps - warmup;
    if (span < 1)
        span = 1;
    if (s == SD_LR_LINEAR) {
        double f = (double)(max_steps - k) / (double)span;
        return f > 0.0 ? f : 0.0;
    }
    /* diffusers: 0.5 * (1 + cos(pi * num_cycles * 2 * progress)), num_cycles = 0.5 */
    double progress = (double)(k - warmup) / (double)span;
    double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
    return f > 0.0 ? f : 0.0;
}

double sd_lr_at(double base_lr, sd_lr_schedule s, int64_t k, int64_t warmup, int64_t max_steps)
{
    return base_lr * sd_lr_factor(s, k, warmup, max_steps);
}

void sd_adamw_update(const sd_adamw_hparams *h, double lr, int64_t k, float *p, const float *g,
                     float *m, float *v, size_t n)
{
    SD_CHECK(k >= 1, "AdamW step number %lld, must be >= 1", (long long)k);
    /* The scalars as torch computes them in Python (double), rounded to fp32 where they meet
     * an fp32 tensor kernel. */
    const double bc1 = 1.0 - pow(h->beta1, (double)k);
    const double bc2 = 1.0 - pow(h->beta2, (double)k);
    const double step_size = lr / bc1;
    const float bc2_sqrt = (float)pow(bc2, 0.5);
    const float decay = (float)(1.0 - lr * h->weight_decay);
    const bool do_decay = h->weight_decay != 0.0;
    const float w1 = (float)(1.0 - h->beta1); /* lerp weight */
    const bool w1_small = fabsf(w1) < 0.5f;
    const float b2 = (float)h->beta2;
    const float one_m_b2 = (float)(1.0 - h->beta2);
    const float eps = (float)h->eps;
    const float neg_step = (float)(-step_size);
    const ptrdiff_t count = (ptrdiff_t)n;

#pragma omp parallel for schedule(static) if (count >= OMP_MIN)
    for (ptrdiff_t i = 0; i < count; i++) {
        float pi = p[i];
        const float gi = g[i];
        if (do_decay)
            pi = pi * decay; /* param.mul_(1 - lr*wd) */
        /* exp_avg.lerp_(grad, 1 - beta1): torch's vectorised lerp is one fused multiply-add */
        float mi = m[i];
        if (w1_small)
            mi = fmaf(w1, gi - mi, mi);
        else
            mi = fmaf(w1 - 1.0f, gi - mi, gi);
        /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2) */
        float vi = v[i] * b2;
        vi = vi + one_m_b2 * gi * gi;
        /* denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps) */
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        /* param.addcdiv_(exp_avg, denom, value=-step_size) */
        pi = pi + neg_step * mi / denom;
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
    }
}

static double block_sumsq(const float *x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

size_t sd_sumsq_blocks(const float *x, size_t n, double *out)
{
    const size_t nb = (n + SD_SUMSQ_BLOCK - 1) / SD_SUMSQ_BLOCK;
    const ptrdiff_t count = (ptrdiff_t)nb;
#pragma omp parallel for schedule(static) if (n >= OMP_MIN)
    for (ptrdiff_t b = 0; b < count; b++) {
        const size_t lo = (size_t)b * SD_SUMSQ_BLOCK;
        const size_t hi = lo + SD_SUMSQ_BLOCK < n ? lo + SD_SUMSQ_BLOCK : n;
        out[b] = block_sumsq(x + lo, hi - lo);
    }
    return nb;
}

double sd_sumsq(const float *x, size_t n)
{
    if (n <= SD_SUMSQ_BLOCK)
        return block_sumsq(x, n);
    const size_t nb = (n + SD_SUMSQ_BLOCK - 1) / SD_SUMSQ_BLOCK;
    double *blocks = sd_xmalloc(nb * sizeof *blocks);
    sd_sumsq_blocks(x, n, blocks);
    double s = 0.0;
    for (size_t b = 0; b < nb; b++)
        s += blocks[b];
    free(blocks);
    return s;
}

double sd_clip_coef(double sumsq, double max_norm)
{
    if (!(max_norm > 0.0))
        return 1.0;
    /* As torch computes it on an fp32 total norm: max_norm / (total_norm + 1e-6) is
     * Tensor.__rtruediv__, i.e. reciprocal(total_norm + 1e-6) * max_norm, in fp32. */
    const float norm = (float)sqrt(sumsq);
    const float denom = norm + (float)1e-6;
    const float coef = (1.0f / denom) * (float)max_norm;
    return coef < 1.0f ? (double)coef : 1.0;
}

void sd_scale(float *x, size_t n, double coef)
{
    if (coef == 1.0)
        return;
    const float c = (float)coef;
    const ptrdiff_t count = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (count >= OMP_MIN)
    for (ptrdiff_t i = 0; i < count; i++)
        x[i] *= c;
}

bool sd_any_nonfinite(const float *x, size_t n)
{
    int bad = 0;
    const ptrdiff_t count = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) reduction(| : bad) if (count >= OMP_MIN)
    for (ptrdiff_t i = 0; i < count; i++)
        bad |= !isfinite(x[i]);
    return bad != 0;
}

double sd_ema_decay(int64_t n, double decay, int64_t start_step)
{
    int64_t s = n - start_step - 1;
    if (s <= 0)
        return 0.0;
    double d = (1.0 + (double)s) / (10.0 + (double)s);
    if (d > decay)
        d = decay;
    return d > 0.0 ? d : 0.0;
}

void sd_ema_update(float *ema, const float *p, size_t n, double d)
{
    const float omd = (float)(1.0 - d);
    const ptrdiff_t count = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (count >= OMP_MIN)
    for (ptrdiff_t i = 0; i < count; i++) {
        const float diff = ema[i] - p[i];
        const float step = omd * diff;
        ema[i] = ema[i] - step;
    }
}
