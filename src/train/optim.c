/* AdamW, LR schedules, clipping helpers, non-finite check and EMA on flat fp32 ranges
 * (see include/sdtrain/optim.h and sd2-model-spec.md §6.4). */
#include "sdtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

/* Below this many elements a loop runs on one thread (the result is the same either way). */
#define OMP_MIN 32768
#define ADAMW_BLOCK 4096

int sd_lr_schedule_from_name(const char *name, sd_lr_schedule *out, sd_err *err)
{
    if (name && strcmp(name, "constant") == 0)
        *out = SD_LR_CONSTANT;
    else if (name && strcmp(name, "linear") == 0)
        *out = SD_LR_LINEAR;
    else if (name && strcmp(name, "cosine") == 0)
        *out = SD_LR_COSINE;
    else if (name && strcmp(name, "cosine_with_restarts") == 0)
        *out = SD_LR_COSINE_RESTARTS;
    else if (name && strcmp(name, "polynomial") == 0)
        *out = SD_LR_POLYNOMIAL;
    else
        return sd_err_set(err, "unknown lr_schedule '%s' (constant, linear, cosine, "
                               "cosine_with_restarts or polynomial)", name ? name : "(null)");
    return 0;
}

const char *sd_lr_schedule_name(sd_lr_schedule s)
{
    switch (s) {
    case SD_LR_CONSTANT: return "constant";
    case SD_LR_LINEAR: return "linear";
    case SD_LR_COSINE: return "cosine";
    case SD_LR_COSINE_RESTARTS: return "cosine_with_restarts";
    case SD_LR_POLYNOMIAL: return "polynomial";
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

double sd_lr_factor_params(const sd_lr_params *p, int64_t k)
{
    int64_t warmup = p->warmup < 0 ? 0 : p->warmup;
    const int64_t T = p->max_steps;
    if (k < 0)
        k = 0;
    if (p->schedule != SD_LR_COSINE_RESTARTS && p->schedule != SD_LR_POLYNOMIAL)
        return sd_lr_factor(p->schedule, k, warmup, T);
    if (k < warmup)
        return (double)k / (double)(warmup > 1 ? warmup : 1);
    if (p->schedule == SD_LR_COSINE_RESTARTS) {
        const int64_t span = T - warmup > 1 ? T - warmup : 1;
        const double progress = (double)(k - warmup) / (double)span;
        if (progress >= 1.0)
            return 0.0;
        /* Python's float % 1.0 is fmod for these non-negative values */
        const double f = 0.5 * (1.0 + cos(M_PI * fmod((double)p->num_cycles * progress, 1.0)));
        return f > 0.0 ? f : 0.0;
    }
    const double lr_init = p->base_lr, lr_end = SD_LR_POLYNOMIAL_END;
    if (k > T)
        return lr_end / lr_init;
    const double lr_range = lr_init - lr_end;
    const double decay_steps = (double)(T - warmup);
    const double pct_remaining = 1.0 - (double)(k - warmup) / decay_steps;
    const double decay = lr_range * pow(pct_remaining, p->power) + lr_end;
    return decay / lr_init;
}

/* One AdamW update of elements [0, n) with the scalars of the step; the loop bodies below do
 * the same IEEE operations in the same order (torch's: decay multiply, lerp as one fused
 * multiply-add, v * b2 + (1 - b2) g g, sqrt / bc2_sqrt + eps, p + (-step m) / denom). */
typedef struct adamw_scalars {
    float decay, lerp_w, bc2_sqrt, b2, one_m_b2, eps, neg_step;
    int lerp_from_m; /* torch's lerp: m + w (g - m) when |w| < 0.5, else g + (w - 1)(g - m) */
} adamw_scalars;

static void adamw_span_base(const adamw_scalars *c, float *p, const float *g, float *m,
                            float *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i];
        const float pi = p[i] * c->decay; /* param.mul_(1 - lr*wd); 1.0f when wd = 0 (exact) */
        const float mi = fmaf(c->lerp_w, gi - m[i], c->lerp_from_m ? m[i] : gi);
        float vi = v[i] * c->b2; /* exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2) */
        vi = vi + c->one_m_b2 * gi * gi;
        const float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
        p[i] = pi + c->neg_step * mi / denom; /* param.addcdiv_(exp_avg, denom, -step_size) */
        m[i] = mi;
        v[i] = vi;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SD_ADAMW_AVX2 1
/* 8 elements at a time with AVX2 + FMA intrinsics: every intrinsic is the correctly rounded
 * operation of the scalar code (vfmadd = fmaf, vsqrtps = sqrtf), so the bits are the same. */
__attribute__((target("avx2,fma"))) static void adamw_span_avx2(const adamw_scalars *c,
                                                                 float *p, const float *g,
                                                                 float *m, float *v, size_t n)
{
    const __m256 decay = _mm256_set1_ps(c->decay), w = _mm256_set1_ps(c->lerp_w);
    const __m256 bc2 = _mm256_set1_ps(c->bc2_sqrt), b2 = _mm256_set1_ps(c->b2);
    const __m256 omb2 = _mm256_set1_ps(c->one_m_b2), eps = _mm256_set1_ps(c->eps);
    const __m256 step = _mm256_set1_ps(c->neg_step);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_loadu_ps(g + i), mo = _mm256_loadu_ps(m + i);
        const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
        const __m256 mi = _mm256_fmadd_ps(w, _mm256_sub_ps(gi, mo), c->lerp_from_m ? mo : gi);
        __m256 vi = _mm256_mul_ps(_mm256_loadu_ps(v + i), b2);
        vi = _mm256_add_ps(vi, _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
        const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        _mm256_storeu_ps(p + i, _mm256_add_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), denom)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
    }
    adamw_span_base(c, p + i, g + i, m + i, v + i, n - i);
}

/* AVX2 + FMA when the CPU has them, unless SDTRAIN_CPU_ISA=baseline (read at every call, so a
 * test can compare the two paths in one process). */
static int adamw_use_avx2(void)
{
    const char *isa = getenv("SDTRAIN_CPU_ISA");
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           !(isa && strcmp(isa, "baseline") == 0);
}
#endif

void sd_adamw_update(const sd_adamw_hparams *h, double lr, int64_t k, float *p, const float *g,
                     float *m, float *v, size_t n)
{
    SD_CHECK(k >= 1, "AdamW step number %lld, must be >= 1", (long long)k);
    /* The scalars as torch computes them in Python (double), rounded to fp32 where they meet
     * an fp32 tensor kernel. */
    const double bc1 = 1.0 - pow(h->beta1, (double)k);
    const double bc2 = 1.0 - pow(h->beta2, (double)k);
    const double step_size = lr / bc1;
    const float w1 = (float)(1.0 - h->beta1); /* lerp weight */
    adamw_scalars c;
    int avx2 = 0;
    c.bc2_sqrt = (float)pow(bc2, 0.5);
    c.decay = h->weight_decay != 0.0 ? (float)(1.0 - lr * h->weight_decay) : 1.0f;
    c.lerp_from_m = fabsf(w1) < 0.5f;
    c.lerp_w = c.lerp_from_m ? w1 : w1 - 1.0f;
    c.b2 = (float)h->beta2;
    c.one_m_b2 = (float)(1.0 - h->beta2);
    c.eps = (float)h->eps;
    c.neg_step = (float)(-step_size);
#ifdef SD_ADAMW_AVX2
    avx2 = adamw_use_avx2();
#endif
    /* blocks of a fixed size, so the split over threads never changes a result */
    const ptrdiff_t blocks = (ptrdiff_t)((n + ADAMW_BLOCK - 1) / ADAMW_BLOCK);
#pragma omp parallel for schedule(static) if (n >= OMP_MIN)
    for (ptrdiff_t b = 0; b < blocks; b++) {
        const size_t i0 = (size_t)b * ADAMW_BLOCK;
        const size_t len = n - i0 < ADAMW_BLOCK ? n - i0 : ADAMW_BLOCK;
#ifdef SD_ADAMW_AVX2
        if (avx2) {
            adamw_span_avx2(&c, p + i0, g + i0, m + i0, v + i0, len);
            continue;
        }
#endif
        (void)avx2;
        adamw_span_base(&c, p + i0, g + i0, m + i0, v + i0, len);
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
