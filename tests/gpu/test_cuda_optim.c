/* CUDA optimizer updates (optim_cuda.h) vs the CPU ones (optim.h): AdamW over several steps
 * (with the bf16 weight copy), sum of squares, scale, EMA, the non-finite check and the bf16
 * conversion, all compared bit for bit (the CUDA code is built to give the CPU's bits; see
 * optim_cuda.h). The sum of squares also reports its relative error against a 1e-12 bound,
 * which is what a tree-ordered sum would have to meet. */
#include "sd_config.h"

#include "cuda_compare.h"
#include "sdtrain/optim.h"
#include "sdtrain/optim_cuda.h"

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t rand_u32(void)
{
    return (uint32_t)(gpu_uniform() * 4294967296.0);
}

/* One TAP point: got and ref hold the same bits everywhere (the first difference is shown). */
static int check_bits(const char *what, const sd_backend *be, const float *got, const float *ref,
                      size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (f32_bits(got[i]) != f32_bits(ref[i]) && bad++ == 0)
            first = i;
    if (bad)
        tap_diag("%s: first difference at %zu: got %.9g (0x%08x), want %.9g (0x%08x)", what,
                 first, (double)got[first], f32_bits(got[first]), (double)ref[first],
                 f32_bits(ref[first]));
    return tap_ok(bad == 0, "%s [%s backend]: %zu of %zu values differ in bits", what,
                  sd_dtype_name(be->dtype), bad, n);
}

static int check_bits16(const char *what, const sd_backend *be, const uint16_t *got,
                        const uint16_t *ref, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (got[i] != ref[i] && bad++ == 0)
            first = i;
    if (bad)
        tap_diag("%s: first difference at %zu: got 0x%04x, want 0x%04x", what, first,
                 got[first], ref[first]);
    return tap_ok(bad == 0, "%s [%s backend]: %zu of %zu bf16 values differ", what,
                  sd_dtype_name(be->dtype), bad, n);
}

static float *dalloc32(const sd_backend *be, size_t n)
{
    float *d = sd_backend_alloc(be, (n ? n : 1) * sizeof(float));
    if (!d) {
        fprintf(stderr, "device allocation of %zu floats failed\n", n);
        exit(1);
    }
    return d;
}

static float *dget_raw32(const sd_backend *be, const float *d, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    sd_synchronize(be);
    if (n)
        sd_download(be, h, d, n * sizeof(float));
    return h;
}

/* AdamW state: p ~ N(0, 1), g ~ N(0, 1e-2) with a few tiny values (g*g underflows into the
 * denormals, which must not be flushed), m ~ N(0, 1e-3), v = (N(0, 1e-2))^2, and every 997th
 * element all zeros (padding between tensors). */
static void adamw_state(size_t n, float **p, float **g, float **m, float **v)
{
    *p = hrand((int64_t)n, 1.0f, 0.0f);
    *g = hrand((int64_t)n, 1e-2f, 0.0f);
    *m = hrand((int64_t)n, 1e-3f, 0.0f);
    *v = hrand((int64_t)n, 1e-2f, 0.0f);
    for (size_t i = 0; i < n; i++) {
        (*v)[i] *= (*v)[i];
        if (i % 997 == 3)
            (*g)[i] *= 1e-18f;
        if (i % 997 == 5)
            (*p)[i] = (*g)[i] = (*m)[i] = (*v)[i] = 0.0f;
    }
}

/* `steps` AdamW steps k = 1.. on n elements starting `offset` elements into the device buffers
 * (an unaligned ZeRO shard), lr changing every step, the bf16 copy on even steps. */
static void test_adamw(const sd_backend *be, const char *label, const sd_adamw_hparams *h,
                       size_t n, size_t offset, int steps)
{
    float *p, *g, *m, *v;
    adamw_state(n, &p, &g, &m, &v);
    float *dp = dalloc32(be, n + offset), *dg = dalloc32(be, n + offset);
    float *dm = dalloc32(be, n + offset), *dv = dalloc32(be, n + offset);
    uint16_t *dlow = sd_backend_alloc(be, (n + offset) * 2);
    uint16_t *low = malloc(n * 2), *low_ref = malloc(n * 2);
    if (!dlow) {
        fprintf(stderr, "device allocation failed\n");
        exit(1);
    }
    sd_upload(be, dp + offset, p, n * sizeof(float));
    sd_upload(be, dg + offset, g, n * sizeof(float));
    sd_upload(be, dm + offset, m, n * sizeof(float));
    sd_upload(be, dv + offset, v, n * sizeof(float));
    char what[160];
    for (int k = 1; k <= steps; k++) {
        const double lr = 1e-4 * (0.5 + 0.3 * k); /* a different lr every step */
        void *lowp = k % 2 == 0 ? (void *)(dlow + offset) : NULL;
        sd_adamw_update(h, lr, k, p, g, m, v, n);
        sd_cuda_adamw_update(be, h, lr, k, dp + offset, dg + offset, dm + offset, dv + offset,
                             n, lowp);
        float *gp = dget_raw32(be, dp + offset, n), *gm = dget_raw32(be, dm + offset, n);
        float *gv = dget_raw32(be, dv + offset, n);
        snprintf(what, sizeof what, "adamw %s n=%zu offset=%zu step %d p", label, n, offset, k);
        check_bits(what, be, gp, p, n);
        what[strlen(what) - 1] = 'm';
        check_bits(what, be, gm, m, n);
        what[strlen(what) - 1] = 'v';
        check_bits(what, be, gv, v, n);
        if (lowp) {
            sd_download(be, low, lowp, n * 2);
            for (size_t i = 0; i < n; i++)
                low_ref[i] = sd_f32_to_bf16(p[i]);
            snprintf(what, sizeof what, "adamw %s n=%zu step %d bf16 copy of p", label, n, k);
            check_bits16(what, be, low, low_ref, n);
        }
        free(gp), free(gm), free(gv);
    }
    sd_backend_free(be, dp), sd_backend_free(be, dg), sd_backend_free(be, dm);
    sd_backend_free(be, dv), sd_backend_free(be, dlow);
    free(p), free(g), free(m), free(v), free(low), free(low_ref);
}

static void test_sumsq(const sd_backend *be, size_t n, size_t offset)
{
    float *x = hrand((int64_t)(n + offset), 1.0f, 0.0f);
    float *dx = dput32(be, x, (int64_t)(n + offset));
    void *scratch = sd_backend_alloc(be, sd_cuda_sumsq_scratch(n));
    if (!scratch) {
        fprintf(stderr, "device allocation failed\n");
        exit(1);
    }
    const double ref = sd_sumsq(x + offset, n);
    double got = -1.0;
    sd_cuda_sumsq(be, dx + offset, n, &got, scratch);
    const double rel = ref > 0.0 ? fabs(got - ref) / ref : fabs(got - ref);
    tap_ok(rel <= 1e-12, "sumsq n=%zu offset=%zu [%s backend]: %.17g vs CPU %.17g, rel %.3g",
           n, offset, sd_dtype_name(be->dtype), got, ref, rel);
    tap_ok(memcmp(&got, &ref, sizeof got) == 0, "sumsq n=%zu offset=%zu: the CPU's bits", n,
           offset);
    sd_backend_free(be, scratch);
    sd_backend_free(be, dx);
    free(x);
}

static void test_nonfinite(const sd_backend *be, size_t n)
{
    float *x = hrand((int64_t)n, 3.0f, 0.0f);
    float *dx = dput32(be, x, (int64_t)n);
    void *scratch = sd_backend_alloc(be, sd_cuda_nonfinite_scratch());
    if (!scratch) {
        fprintf(stderr, "device allocation failed\n");
        exit(1);
    }
    tap_ok(sd_cuda_nonfinite(be, dx, n, scratch) == 0 && !sd_any_nonfinite(x, n),
           "nonfinite n=%zu: finite data gives 0", n);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const char *names[3] = {"NaN", "+Inf", "-Inf"};
    for (int b = 0; b < 3; b++) {
        for (int where = 0; where < 2; where++) {
            size_t pos = where == 0 ? (size_t)(gpu_uniform() * (double)n) % n : n - 1;
            sd_upload(be, dx + pos, &bad[b], sizeof(float));
            int got = sd_cuda_nonfinite(be, dx, n, scratch);
            tap_ok(got == 1, "nonfinite n=%zu: one %s at %zu gives %d", n, names[b], pos, got);
            sd_upload(be, dx + pos, &x[pos], sizeof(float));
        }
    }
    /* the largest finite float and a denormal are finite */
    const float edge[2] = {f32_from_bits(0x7f7fffffu), f32_from_bits(0x00000001u)};
    sd_upload(be, dx, edge, sizeof edge);
    tap_ok(sd_cuda_nonfinite(be, dx, n, scratch) == 0,
           "nonfinite n=%zu: FLT_MAX and the smallest denormal are finite", n);
    sd_backend_free(be, scratch);
    sd_backend_free(be, dx);
    free(x);
}

static void test_scale_ema(const sd_backend *be, size_t n, size_t offset)
{
    float *x = hrand((int64_t)(n + offset), 1.0f, 0.0f);
    float *p = hrand((int64_t)(n + offset), 1.0f, 0.5f);
    float *dx = dput32(be, x, (int64_t)(n + offset));
    float *dp = dput32(be, p, (int64_t)(n + offset));
    char what[128];

    const double coef = sd_clip_coef(12345.678, 1.0);
    sd_scale(x + offset, n, coef);
    sd_cuda_scale(be, dx + offset, n, (float)coef);
    float *got = dget_raw32(be, dx, n + offset);
    snprintf(what, sizeof what, "scale by %.9g n=%zu offset=%zu", coef, n, offset);
    check_bits(what, be, got, x, n + offset);
    free(got);

    /* x is now the EMA buffer: a decay from the schedule, then d = 0 (a copy of p) */
    const double decays[2] = {sd_ema_decay(137, 0.9999, 0), 0.0};
    for (int t = 0; t < 2; t++) {
        sd_ema_update(x + offset, p + offset, n, decays[t]);
        sd_cuda_ema_update(be, dx + offset, dp + offset, n, decays[t]);
        got = dget_raw32(be, dx, n + offset);
        snprintf(what, sizeof what, "ema d=%.9g n=%zu offset=%zu", decays[t], n, offset);
        check_bits(what, be, got, x, n + offset);
        free(got);
    }
    sd_backend_free(be, dx);
    sd_backend_free(be, dp);
    free(x), free(p);
}

/* Normals, random bit patterns (denormals included, NaN patterns replaced), and the edges of
 * rounding: ties to even both ways, the largest float (rounds to Inf), ±0, ±Inf. NaN is
 * checked to stay NaN. */
static void test_f32_to_bf16(const sd_backend *be, size_t n)
{
    float *x = hrand((int64_t)n, 10.0f, 0.0f);
    for (size_t i = 0; i < n; i += 3) {
        uint32_t u = rand_u32();
        if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
            u &= 0xff7fffffu;
        x[i] = f32_from_bits(u);
    }
    const uint32_t edges[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu, 0xff7fffffu,
                              0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x00000001u,
                              0x00008000u, 0x00018000u, 0x807fffffu, 0x7f7f8000u, 0x7f7f7fffu};
    const size_t ne = sizeof edges / sizeof edges[0];
    for (size_t i = 0; i < ne && i < n; i++)
        x[i] = f32_from_bits(edges[i]);
    float *dx = dput32(be, x, (int64_t)n);
    uint16_t *dy = sd_backend_alloc(be, (n + 1) * 2);
    uint16_t *got = malloc((n + 1) * 2), *ref = malloc(n * 2);
    if (!dy) {
        fprintf(stderr, "device allocation failed\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        ref[i] = sd_f32_to_bf16(x[i]);
    sd_cuda_f32_to_bf16(be, dx, dy, n);
    sd_synchronize(be);
    sd_download(be, got, dy, n * 2);
    char what[96];
    snprintf(what, sizeof what, "f32_to_bf16 n=%zu", n);
    check_bits16(what, be, got, ref, n);

    /* an odd destination offset (2-byte aligned only) and a NaN */
    const float nan = NAN;
    sd_upload(be, dx + n / 2, &nan, sizeof nan);
    sd_cuda_f32_to_bf16(be, dx, dy + 1, n);
    sd_synchronize(be);
    sd_download(be, got, dy + 1, n * 2);
    const uint16_t gn = got[n / 2];
    got[n / 2] = ref[n / 2];
    snprintf(what, sizeof what, "f32_to_bf16 n=%zu to an odd offset", n);
    check_bits16(what, be, got, ref, n);
    tap_ok((gn & 0x7f80u) == 0x7f80u && (gn & 0x007fu) != 0,
           "f32_to_bf16: NaN gives a NaN (0x%04x)", gn);
    sd_backend_free(be, dx);
    sd_backend_free(be, dy);
    free(x), free(got), free(ref);
}

int main(void)
{
    sd_backend *gpu[2];
    int n = gpu_backends(gpu);
    gpu_seed_from_env();
    /* SD2's settings, and a beta1 with 1 - beta1 >= 0.5 (torch's other lerp formula) without
     * weight decay */
    const sd_adamw_hparams sd2 = {0.9, 0.999, 1e-8, 1e-2};
    const sd_adamw_hparams other = {0.3, 0.95, 1e-6, 0.0};
    for (int i = 0; i < n; i++) {
        const sd_backend *be = gpu[i];
        test_adamw(be, "sd2", &sd2, 1000003, 0, 5);
        test_adamw(be, "sd2", &sd2, 7, 3, 5);
        test_adamw(be, "beta1=0.3 wd=0", &other, 1000003, 1, 3);
        test_adamw(be, "beta1=0.3 wd=0", &other, 7, 0, 3);
        test_sumsq(be, 1000003, 0);
        test_sumsq(be, 1000003, 5);
        test_sumsq(be, 4096, 0);
        test_sumsq(be, 4097, 1);
        test_sumsq(be, 7, 0);
        test_nonfinite(be, 1000003);
        test_nonfinite(be, 7);
        test_scale_ema(be, 1000003, 0);
        test_scale_ema(be, 7, 1);
        test_f32_to_bf16(be, 1000003);
        test_f32_to_bf16(be, 20);
    }
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    return tap_done();
}
