/* CUDA backend vs CPU backend: activations, norms, elementwise arithmetic, data movement.
 * Every op forward and backward on random inputs (rounded to bf16 first in BF16 mode), odd
 * sizes, written and accumulated gradients over random preloads, optional outputs NULL,
 * outputs aliasing inputs where ops.h allows it, and one determinism check per reduction. */
#include "cuda_compare.h"
#include "sdtrain/timer.h"

static const sd_backend *cpu;

/* SD_GPU_TEST_QUICK=1 (bench/gpu-check.sh under compute-sanitizer): the largest cases left out */
static int quick(void)
{
    const char *q = getenv("SD_GPU_TEST_QUICK");
    return q && strcmp(q, "1") == 0;
}

/* random host data as the backend under test can hold it */
static float *hr(const sd_backend *g, int64_t n, float scale, float shift)
{
    float *h = hrand(n, scale, shift);
    hround(g, h, n);
    return h;
}

/* compares a device tensor of the backend's dtype with a host reference, frees nothing */
static int cmp_dev(const sd_backend *g, const char *what, const void *d, const float *ref,
                   int64_t n)
{
    float *got = dget(g, d, n);
    int ok = check_close(g, what, got, ref, n, gpu_tol(g));
    free(got);
    return ok;
}

static int cmp_dev32(const sd_backend *g, const char *what, const float *d, const float *ref,
                     int64_t n)
{
    float *got = dget32(g, d, n);
    int ok = check_close(g, what, got, ref, n, gpu_tol(g));
    free(got);
    return ok;
}

/* two device buffers hold the same bits */
static int same_bits(const sd_backend *g, const char *what, const void *a, const void *b,
                     size_t bytes)
{
    unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
    sd_synchronize(g);
    sd_download(g, ha, a, bytes);
    sd_download(g, hb, b, bytes);
    int ok = memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    return tap_ok(ok, "%s [%s]: two runs give the same bits", what, sd_dtype_name(g->dtype));
}

/* ---- unary activations ----------------------------------------------------------------- */

typedef void (*unary_fwd_fn)(const sd_backend *, int64_t, const void *, void *);
typedef void (*unary_bwd_fn)(const sd_backend *, int64_t, const void *, const void *, void *,
                             int);

static void test_unary(const sd_backend *g, const char *name, unary_fwd_fn fwd, unary_bwd_fn bwd,
                       int64_t n)
{
    char what[128];
    float *x = hr(g, n, 3.0f, 0.0f), *dy = hr(g, n, 1.0f, 0.0f), *pre = hr(g, n, 1.0f, 0.0f);
    x[0] = -100.0f, x[1] = 100.0f, x[2] = 0.0f;
    float *ref = malloc((size_t)n * sizeof(float));
    void *xd = dput(g, x, n), *dyd = dput(g, dy, n);

    fwd(cpu, n, x, ref);
    void *y = dnan(g, n);
    fwd(g, n, xd, y);
    snprintf(what, sizeof what, "%s forward n=%lld", name, (long long)n);
    cmp_dev(g, what, y, ref, n);
    void *xa = dput(g, x, n);
    fwd(g, n, xa, xa);
    snprintf(what, sizeof what, "%s forward in place (y == x)", name);
    cmp_dev(g, what, xa, ref, n);

    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)n * sizeof(float));
        bwd(cpu, n, x, dy, ref, acc);
        void *dx = acc ? dput(g, pre, n) : dnan(g, n);
        bwd(g, n, xd, dyd, dx, acc);
        snprintf(what, sizeof what, "%s backward, %s", name, acc ? "accumulated" : "written");
        cmp_dev(g, what, dx, ref, n);
        sd_backend_free(g, dx);
    }
    /* dx == dy, written */
    bwd(cpu, n, x, dy, ref, 0);
    void *da = dput(g, dy, n);
    bwd(g, n, xd, da, da, 0);
    snprintf(what, sizeof what, "%s backward in place (dx == dy)", name);
    cmp_dev(g, what, da, ref, n);

    sd_backend_free(g, xd), sd_backend_free(g, dyd), sd_backend_free(g, y);
    sd_backend_free(g, xa), sd_backend_free(g, da);
    free(x), free(dy), free(pre), free(ref);
}

static void test_geglu(const sd_backend *g, int64_t rows, int inner)
{
    const int64_t nx = rows * 2 * inner, ny = rows * inner;
    float *x = hr(g, nx, 2.0f, 0.0f), *dy = hr(g, ny, 1.0f, 0.0f), *pre = hr(g, nx, 1.0f, 0.0f);
    float *ref = malloc((size_t)nx * sizeof(float));
    void *xd = dput(g, x, nx), *dyd = dput(g, dy, ny), *y = dnan(g, ny);
    sd_geglu_forward(cpu, rows, inner, x, ref);
    sd_geglu_forward(g, rows, inner, xd, y);
    cmp_dev(g, "GEGLU forward rows=1001 inner=37", y, ref, ny);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)nx * sizeof(float));
        sd_geglu_backward(cpu, rows, inner, x, dy, ref, acc);
        void *dx = acc ? dput(g, pre, nx) : dnan(g, nx);
        sd_geglu_backward(g, rows, inner, xd, dyd, dx, acc);
        cmp_dev(g, acc ? "GEGLU backward, accumulated" : "GEGLU backward, written", dx, ref, nx);
        sd_backend_free(g, dx);
    }
    sd_backend_free(g, xd), sd_backend_free(g, dyd), sd_backend_free(g, y);
    free(x), free(dy), free(pre), free(ref);
}

/* ---- arithmetic ------------------------------------------------------------------------- */

static void test_add_axpby(const sd_backend *g, int64_t n)
{
    float *a = hr(g, n, 1.0f, 0.0f), *b = hr(g, n, 1.0f, 0.5f);
    float *ref = malloc((size_t)n * sizeof(float));
    void *ad = dput(g, a, n), *bd = dput(g, b, n), *y = dnan(g, n);
    const float divisors[2] = {1.0f, 1.41421356f};
    for (int k = 0; k < 2; k++) {
        sd_add_scaled(cpu, n, a, b, divisors[k], ref);
        sd_add_scaled(g, n, ad, bd, divisors[k], y);
        cmp_dev(g, k ? "add, divisor sqrt 2" : "add", y, ref, n);
    }
    void *aa = dput(g, a, n);
    sd_add(cpu, n, a, b, ref);
    sd_add(g, n, aa, bd, aa);
    cmp_dev(g, "add in place (y == a)", aa, ref, n);

    /* beta = 0 ignores the NaN in y */
    sd_axpby(cpu, n, 0.75f, a, 0.0f, memcpy(ref, b, (size_t)n * sizeof(float)));
    void *yn = dnan(g, n);
    sd_axpby(g, n, 0.75f, ad, 0.0f, yn);
    cmp_dev(g, "axpby beta = 0 over NaN", yn, ref, n);
    memcpy(ref, b, (size_t)n * sizeof(float));
    sd_axpby(cpu, n, 0.75f, a, -1.25f, ref);
    void *yb = dput(g, b, n);
    sd_axpby(g, n, 0.75f, ad, -1.25f, yb);
    cmp_dev(g, "axpby alpha 0.75 beta -1.25", yb, ref, n);

    sd_backend_free(g, ad), sd_backend_free(g, bd), sd_backend_free(g, y);
    sd_backend_free(g, aa), sd_backend_free(g, yn), sd_backend_free(g, yb);
    free(a), free(b), free(ref);
}

static void test_add_bcast(const sd_backend *g, int n, int64_t rows, int c)
{
    const int64_t nx = (int64_t)n * rows * c, nv = (int64_t)n * c;
    float *x = hr(g, nx, 1.0f, 0.0f), *v = hr(g, nv, 1.0f, 0.0f), *pre = hr(g, nv, 1.0f, 0.0f);
    float *ref = malloc((size_t)nx * sizeof(float));
    void *xd = dput(g, x, nx), *vd = dput(g, v, nv), *y = dnan(g, nx);
    sd_add_bcast_forward(cpu, n, rows, c, x, v, ref);
    sd_add_bcast_forward(g, n, rows, c, xd, vd, y);
    char what[96];
    snprintf(what, sizeof what, "add_bcast forward n=%d rows=%lld c=%d", n, (long long)rows, c);
    cmp_dev(g, what, y, ref, nx);
    void *xa = dput(g, x, nx);
    sd_add_bcast_forward(g, n, rows, c, xa, vd, xa);
    cmp_dev(g, "add_bcast forward in place (y == x)", xa, ref, nx);

    sd_scratch ws = dscratch(g, sd_add_bcast_backward_scratch_bytes(g, n, rows, c));
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)nv * sizeof(float));
        sd_add_bcast_backward(cpu, n, rows, c, x, ref, acc, sd_scratch_none());
        void *dv = acc ? dput(g, pre, nv) : dnan(g, nv);
        sd_add_bcast_backward(g, n, rows, c, xd, dv, acc, ws);
        cmp_dev(g, acc ? "add_bcast backward, accumulated" : "add_bcast backward, written", dv,
                ref, nv);
        sd_backend_free(g, dv);
    }
    void *d1 = dnan(g, nv), *d2 = dnan(g, nv);
    sd_add_bcast_backward(g, n, rows, c, xd, d1, 0, ws);
    sd_add_bcast_backward(g, n, rows, c, xd, d2, 0, ws);
    same_bits(g, "add_bcast backward", d1, d2, (size_t)nv * sd_dtype_size(g->dtype));
    sd_backend_free(g, d1), sd_backend_free(g, d2), sd_backend_free(g, ws.ptr);
    sd_backend_free(g, xd), sd_backend_free(g, vd), sd_backend_free(g, y), sd_backend_free(g, xa);
    free(x), free(v), free(pre), free(ref);
}

/* ---- data movement ---------------------------------------------------------------------- */

static void test_concat_split(const sd_backend *g, int64_t rows, int c1, int c2)
{
    const int64_t na = rows * c1, nb = rows * c2, ny = rows * (c1 + c2);
    float *a = hr(g, na, 1.0f, 0.0f), *b = hr(g, nb, 1.0f, 0.0f), *x = hr(g, ny, 1.0f, 0.0f);
    float *pa = hr(g, na, 1.0f, 0.0f), *pb = hr(g, nb, 1.0f, 0.0f);
    float *ref = malloc((size_t)ny * sizeof(float)), *refb = malloc((size_t)nb * sizeof(float));
    void *ad = dput(g, a, na), *bd = dput(g, b, nb), *y = dnan(g, ny), *xd = dput(g, x, ny);
    sd_concat_channels(cpu, rows, c1, c2, a, b, ref);
    sd_concat_channels(g, rows, c1, c2, ad, bd, y);
    cmp_dev(g, "concat_channels rows=333 17+40", y, ref, ny);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pa, (size_t)na * sizeof(float));
        memcpy(refb, pb, (size_t)nb * sizeof(float));
        sd_split_channels(cpu, rows, c1, c2, x, ref, refb, acc);
        void *da = acc ? dput(g, pa, na) : dnan(g, na), *db = acc ? dput(g, pb, nb) : dnan(g, nb);
        sd_split_channels(g, rows, c1, c2, xd, da, db, acc);
        cmp_dev(g, acc ? "split_channels a, accumulated" : "split_channels a, written", da, ref,
                na);
        cmp_dev(g, acc ? "split_channels b, accumulated" : "split_channels b, written", db, refb,
                nb);
        sd_backend_free(g, da), sd_backend_free(g, db);
    }
    /* a not wanted: b alone */
    sd_split_channels(cpu, rows, c1, c2, x, NULL, refb, 0);
    void *db = dnan(g, nb);
    sd_split_channels(g, rows, c1, c2, xd, NULL, db, 0);
    cmp_dev(g, "split_channels with a NULL", db, refb, nb);
    sd_backend_free(g, db);
    sd_backend_free(g, ad), sd_backend_free(g, bd), sd_backend_free(g, y), sd_backend_free(g, xd);
    free(a), free(b), free(x), free(pa), free(pb), free(ref), free(refb);
}

static void test_permute(const sd_backend *g, int n, int c, int h, int w)
{
    const int64_t m = (int64_t)n * c * h * w;
    float *x = hr(g, m, 1.0f, 0.0f), *ref = malloc((size_t)m * sizeof(float));
    void *xd = dput(g, x, m), *y = dnan(g, m);
    sd_nchw_to_nhwc(cpu, n, c, h, w, x, ref);
    sd_nchw_to_nhwc(g, n, c, h, w, xd, y);
    cmp_dev(g, "nchw_to_nhwc 2x5x7x9", y, ref, m);
    sd_nhwc_to_nchw(cpu, n, c, h, w, x, ref);
    sd_nhwc_to_nchw(g, n, c, h, w, xd, y);
    cmp_dev(g, "nhwc_to_nchw 2x7x9x5", y, ref, m);
    sd_backend_free(g, xd), sd_backend_free(g, y);
    free(x), free(ref);
}

static void test_upsample(const sd_backend *g, int n, int h, int w, int c, int ho, int wo)
{
    char what[128];
    const int64_t nx = (int64_t)n * h * w * c, ny = (int64_t)n * ho * wo * c;
    float *x = hr(g, nx, 1.0f, 0.0f), *dy = hr(g, ny, 1.0f, 0.0f), *pre = hr(g, nx, 1.0f, 0.0f);
    float *ref = malloc((size_t)(nx > ny ? nx : ny) * sizeof(float));
    void *xd = dput(g, x, nx), *dyd = dput(g, dy, ny), *y = dnan(g, ny);
    sd_upsample_nearest_forward(cpu, n, h, w, c, ho, wo, x, ref);
    sd_upsample_nearest_forward(g, n, h, w, c, ho, wo, xd, y);
    snprintf(what, sizeof what, "nearest %dx%d -> %dx%d forward", h, w, ho, wo);
    cmp_dev(g, what, y, ref, ny);
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)nx * sizeof(float));
        sd_upsample_nearest_backward(cpu, n, h, w, c, ho, wo, dy, ref, acc);
        void *dx = acc ? dput(g, pre, nx) : dnan(g, nx);
        sd_upsample_nearest_backward(g, n, h, w, c, ho, wo, dyd, dx, acc);
        snprintf(what, sizeof what, "nearest %dx%d -> %dx%d backward, %s", h, w, ho, wo,
                 acc ? "accumulated" : "written");
        cmp_dev(g, what, dx, ref, nx);
        sd_backend_free(g, dx);
    }
    sd_backend_free(g, xd), sd_backend_free(g, dyd), sd_backend_free(g, y);
    free(x), free(dy), free(pre), free(ref);
}

static void test_timestep(const sd_backend *g, int n, sd_timestep_embedding_desc d,
                          const char *name)
{
    char what[128];
    float *t = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < n; i++)
        t[i] = (float)(gpu_uniform() * 1000.0);
    t[0] = 0.0f, t[1] = 999.0f, t[2] = 0.5f;
    const int64_t ny = (int64_t)n * d.dim;
    float *ref = malloc((size_t)ny * sizeof(float));
    sd_timestep_embedding(cpu, n, &d, t, ref);
    float *td = dput32(g, t, n);
    void *y = dnan(g, ny);
    sd_timestep_embedding(g, n, &d, td, y);
    snprintf(what, sizeof what, "timestep embedding %s", name);
    cmp_dev(g, what, y, ref, ny);
    sd_backend_free(g, td), sd_backend_free(g, y);
    free(t), free(ref);
}

static void test_embedding(const sd_backend *g, int batch, int t, int c, int vocab)
{
    const int64_t ntok = (int64_t)batch * t, ny = ntok * c;
    int32_t *ids = malloc((size_t)ntok * sizeof(int32_t));
    for (int64_t i = 0; i < ntok; i++)
        ids[i] = (int32_t)(gpu_uniform() * vocab);
    ids[0] = 0, ids[1] = vocab - 1;
    float *table = hr(g, (int64_t)vocab * c, 1.0f, 0.0f);
    float *pos = hr(g, (int64_t)(t + 3) * c, 1.0f, 0.0f);
    float *ref = malloc((size_t)ny * sizeof(float));
    int32_t *idd = sd_backend_alloc(g, (size_t)ntok * sizeof(int32_t));
    sd_upload(g, idd, ids, (size_t)ntok * sizeof(int32_t));
    void *td = dput(g, table, (int64_t)vocab * c), *pd = dput(g, pos, (int64_t)(t + 3) * c);
    void *y = dnan(g, ny);
    sd_embedding_forward(cpu, batch, t, c, vocab, ids, table, NULL, ref);
    sd_embedding_forward(g, batch, t, c, vocab, idd, td, NULL, y);
    cmp_dev(g, "embedding, no position table", y, ref, ny);
    sd_embedding_forward(cpu, batch, t, c, vocab, ids, table, pos, ref);
    sd_embedding_forward(g, batch, t, c, vocab, idd, td, pd, y);
    cmp_dev(g, "embedding + position table", y, ref, ny);
    sd_backend_free(g, idd), sd_backend_free(g, td), sd_backend_free(g, pd), sd_backend_free(g, y);
    free(ids), free(table), free(pos), free(ref);
}

static void test_gaussian(const sd_backend *g, int64_t rows, int c)
{
    float *m = hr(g, rows * 2 * c, 12.0f, -4.0f), *eps = hr(g, rows * c, 1.0f, 0.0f);
    for (int64_t r = 0; r < rows; r++) /* small means, so the noise term counts */
        for (int j = 0; j < c; j++)
            m[r * 2 * c + j] *= 0.1f;
    hround(g, m, rows * 2 * c);
    float *ref = malloc((size_t)(rows * c) * sizeof(float));
    void *md = dput(g, m, rows * 2 * c), *ed = dput(g, eps, rows * c), *z = dnan(g, rows * c);
    sd_diag_gaussian_sample(cpu, rows, c, m, eps, 0.18215f, ref);
    sd_diag_gaussian_sample(g, rows, c, md, ed, 0.18215f, z);
    cmp_dev(g, "diag_gaussian_sample with eps (logvar clamped)", z, ref, rows * c);
    sd_diag_gaussian_sample(cpu, rows, c, m, NULL, 0.18215f, ref);
    sd_diag_gaussian_sample(g, rows, c, md, NULL, 0.18215f, z);
    cmp_dev(g, "diag_gaussian_sample mode (eps NULL)", z, ref, rows * c);
    sd_backend_free(g, md), sd_backend_free(g, ed), sd_backend_free(g, z);
    free(m), free(eps), free(ref);
}

/* ---- the training loop's transport and objective ----------------------------------------- */

/* sd_cast_f32 rounds like sd_upload_f32 (bit for bit); sd_upload_async from pinned host memory
 * is seen by the ops issued after it, while a long op issued before it still runs. */
static void test_cast_upload(const sd_backend *g, int64_t n)
{
    float *h = hrand(n, 8.0f, -4.0f);
    float *pin = sd_host_alloc(g, (size_t)n * sizeof(float));
    tap_ok(pin != NULL, "sd_host_alloc of %lld floats [%s]", (long long)n, sd_dtype_name(g->dtype));
    if (!pin) {
        free(h);
        return;
    }
    memcpy(pin, h, (size_t)n * sizeof(float));
    float *d32 = dput32(g, NULL, n);
    void *a = dnan(g, n), *b = dput(g, h, n);
    /* some work in flight on the compute stream first: a cast of a large buffer */
    const int64_t big = quick() ? 1 << 18 : 1 << 24;
    float *bigx = dput32(g, NULL, big);
    void *bigy = dnan(g, big);
    sd_zero(g, bigx, (size_t)big * sizeof(float));
    sd_cast_f32(g, big, bigx, bigy);
    sd_upload_async(g, d32, pin, (size_t)n * sizeof(float));
    sd_cast_f32(g, n, d32, a);
    sd_synchronize(g);
    memset(pin, 0, (size_t)n * sizeof(float)); /* after the synchronize: the copy is done */
    same_bits(g, "sd_upload_async + sd_cast_f32 == sd_upload_f32", a, b,
              (size_t)n * sd_dtype_size(g->dtype));
    /* and back: sd_cast_to_f32 + sd_download_async (queued behind a long op) give the values
     * sd_download_f32 gives */
    float *back = dget(g, b, n);
    sd_cast_f32(g, big, bigx, bigy);
    sd_cast_to_f32(g, n, a, d32);
    sd_download_async(g, pin, d32, (size_t)n * sizeof(float));
    sd_download_wait(g);
    tap_ok(memcmp(pin, back, (size_t)n * sizeof(float)) == 0,
           "sd_cast_to_f32 + sd_download_async == sd_download_f32 [%s]", sd_dtype_name(g->dtype));
    free(back);
    sd_host_free(g, pin);
    sd_backend_free(g, d32), sd_backend_free(g, a), sd_backend_free(g, b);
    sd_backend_free(g, bigx), sd_backend_free(g, bigy);
    free(h);
}

/* The stream clock on the GPU: unset marks give NAN; marks around queued work give the GPU's
 * time of it, which the host's wall time from before the first mark to the end of the
 * synchronize bounds; a later mark is later. Run first on a fresh backend (no marks yet). */
static void test_stream_clock(const sd_backend *g)
{
    const int64_t big = quick() ? 1 << 18 : 1 << 24;
    float *x = dput32(g, NULL, big);
    void *y = dnan(g, big);
    double host, gpu, gpu2;
    tap_ok(isnan(sd_stream_elapsed(g, 0, 1)), "stream clock: NAN before any mark [%s]",
           sd_dtype_name(g->dtype));
    sd_zero(g, x, (size_t)big * sizeof(float));
    sd_synchronize(g);
    host = sd_time_now();
    sd_stream_mark(g, 0);
    for (int i = 0; i < 8; i++)
        sd_cast_f32(g, big, x, y);
    sd_stream_mark(g, 1);
    sd_cast_f32(g, big, x, y);
    sd_stream_mark(g, 2);
    sd_synchronize(g);
    host = sd_time_now() - host;
    gpu = sd_stream_elapsed(g, 0, 1);
    gpu2 = sd_stream_elapsed(g, 0, 2);
    tap_ok(gpu > 0.0 && gpu <= host && gpu2 >= gpu,
           "stream clock: 8 casts of %lld floats took %.3f ms of GPU time, within the host's "
           "%.3f ms; one more, %.3f ms [%s]", (long long)big, gpu * 1e3, host * 1e3, gpu2 * 1e3,
           sd_dtype_name(g->dtype));
    sd_backend_free(g, x), sd_backend_free(g, y);
}

/* sd_mse_loss against the CPU backend: mse (fp32) and dy, with and without the gradient. */
static void test_mse_loss(const sd_backend *g, int n, int64_t hw, int c)
{
    const int64_t per = hw * c, nx = n * per;
    char what[128];
    float *pred = hr(g, nx, 4.0f, -2.0f), *target = hrand(nx, 4.0f, -2.0f);
    float *coef = hrand(n, 1e-3f, 1e-4f);
    float *rm = malloc((size_t)n * sizeof(float)), *rdy = malloc((size_t)nx * sizeof(float));
    sd_mse_loss(cpu, n, hw, c, pred, target, coef, rm, rdy);
    void *pd = dput(g, pred, nx), *dy = dnan(g, nx);
    float *td = dput32(g, target, nx), *cd = dput32(g, coef, n), *md = dput32(g, NULL, n);
    sd_mse_loss(g, n, hw, c, pd, td, cd, md, dy);
    snprintf(what, sizeof what, "mse_loss n=%d hw=%lld c=%d: per-sample mse", n, (long long)hw, c);
    float *got = dget32(g, md, n);
    /* the mse is of the same inputs, summed in double: fp32-close in both modes */
    check_close(g, what, got, rm, n, GPU_TOL_F32);
    free(got);
    snprintf(what, sizeof what, "mse_loss n=%d hw=%lld c=%d: dy", n, (long long)hw, c);
    cmp_dev(g, what, dy, rdy, nx);
    float *md2 = dput32(g, NULL, n);
    sd_mse_loss(g, n, hw, c, pd, td, NULL, md2, NULL);
    same_bits(g, "mse_loss without dy: the same mse", md, md2, (size_t)n * sizeof(float));
    sd_backend_free(g, pd), sd_backend_free(g, dy), sd_backend_free(g, td);
    sd_backend_free(g, cd), sd_backend_free(g, md), sd_backend_free(g, md2);
    free(pred), free(target), free(coef), free(rm), free(rdy);
}

/* ---- group norm --------------------------------------------------------------------------- */

/* x of the group norm cases: 2 * uniform + gn_shift (a large shift relative to the spread tests
 * the numerics of the statistics) */
static float gn_shift = 0.5f;

/* affine: 0 = gamma and beta NULL, 1 = both given */
static void test_group_norm(const sd_backend *g, int n, int hw, int c, int groups, int silu,
                            int affine, int stats_null)
{
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "group norm n=%d hw=%d c=%d groups=%d%s%s", n, hw, c, groups,
             silu ? " +SiLU" : "", affine ? "" : " no gamma/beta");
    sd_group_norm_desc d = {n, hw, c, groups, 1e-5f, silu};
    const int64_t nx = (int64_t)n * hw * c, ns = (int64_t)n * groups;
    float *x = hr(g, nx, 2.0f, gn_shift), *dy = hr(g, nx, 1.0f, 0.0f);
    float *pre = hr(g, nx, 1.0f, 0.0f);
    float *gm = hr(g, c, 0.5f, 1.0f), *bt = hr(g, c, 0.5f, 0.0f);
    float *pg = hrand(c, 1.0f, 0.0f), *pb = hrand(c, 1.0f, 0.0f);
    const float *gam = affine ? gm : NULL, *bet = affine ? bt : NULL;

    float *ref = malloc((size_t)nx * sizeof(float)), *rm = malloc((size_t)ns * sizeof(float));
    float *rr = malloc((size_t)ns * sizeof(float));
    sd_scratch hs = hscratch(sd_group_norm_forward_scratch_bytes(cpu, &d));
    sd_group_norm_forward(cpu, &d, x, gam, bet, ref, rm, rr, hs);
    free(hs.ptr);

    void *xd = dput(g, x, nx), *dyd = dput(g, dy, nx), *y = dnan(g, nx);
    void *gd = dput(g, gm, c), *bd = dput(g, bt, c);
    const void *gamd = affine ? gd : NULL, *betd = affine ? bd : NULL;
    float *md = dput32(g, NULL, ns), *rd = dput32(g, NULL, ns);
    sd_scratch ws = dscratch(g, sd_group_norm_forward_scratch_bytes(g, &d));
    sd_group_norm_forward(g, &d, xd, gamd, betd, y, stats_null ? NULL : md,
                          stats_null ? NULL : rd, ws);
    snprintf(what, sizeof what, "%s forward%s", tag, stats_null ? " (mean/rstd NULL)" : "");
    cmp_dev(g, what, y, ref, nx);
    if (!stats_null) {
        snprintf(what, sizeof what, "%s mean", tag);
        cmp_dev32(g, what, md, rm, ns);
        snprintf(what, sizeof what, "%s rstd", tag);
        cmp_dev32(g, what, rd, rr, ns);
    }
    sd_backend_free(g, ws.ptr);

    /* backward from the CPU's statistics, so both sides see the same ones */
    sd_upload(g, md, rm, (size_t)ns * sizeof(float));
    sd_upload(g, rd, rr, (size_t)ns * sizeof(float));
    hs = hscratch(sd_group_norm_backward_scratch_bytes(cpu, &d));
    ws = dscratch(g, sd_group_norm_backward_scratch_bytes(g, &d));
    float *rg = malloc((size_t)c * sizeof(float)), *rb = malloc((size_t)c * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)nx * sizeof(float));
        memcpy(rg, pg, (size_t)c * sizeof(float));
        memcpy(rb, pb, (size_t)c * sizeof(float));
        sd_group_norm_backward(cpu, &d, x, gam, bet, rm, rr, dy, ref, acc, rg, rb, hs);
        void *dx = acc ? dput(g, pre, nx) : dnan(g, nx);
        float *dg = dput32(g, pg, c), *db = dput32(g, pb, c);
        sd_group_norm_backward(g, &d, xd, gamd, betd, md, rd, dyd, dx, acc, dg, db, ws);
        snprintf(what, sizeof what, "%s backward dx %s", tag, acc ? "accumulated" : "written");
        cmp_dev(g, what, dx, ref, nx);
        snprintf(what, sizeof what, "%s backward dgamma (added to a preload)", tag);
        cmp_dev32(g, what, dg, rg, c);
        snprintf(what, sizeof what, "%s backward dbeta (added to a preload)", tag);
        cmp_dev32(g, what, db, rb, c);
        sd_backend_free(g, dx), sd_backend_free(g, dg), sd_backend_free(g, db);
    }
    /* dgamma/dbeta not wanted */
    sd_group_norm_backward(cpu, &d, x, gam, bet, rm, rr, dy, ref, 0, NULL, NULL, hs);
    void *dx = dnan(g, nx);
    sd_group_norm_backward(g, &d, xd, gamd, betd, md, rd, dyd, dx, 0, NULL, NULL, ws);
    snprintf(what, sizeof what, "%s backward dx, dgamma/dbeta NULL", tag);
    cmp_dev(g, what, dx, ref, nx);
    /* dx not wanted; determinism of the reductions */
    float *dg1 = dput32(g, pg, c), *dg2 = dput32(g, pg, c);
    sd_group_norm_backward(g, &d, xd, gamd, betd, md, rd, dyd, NULL, 0, dg1, NULL, ws);
    sd_group_norm_backward(g, &d, xd, gamd, betd, md, rd, dyd, dx, 0, dg2, NULL, ws);
    snprintf(what, sizeof what, "%s backward dgamma (dx NULL in one run)", tag);
    same_bits(g, what, dg1, dg2, (size_t)c * sizeof(float));
    sd_backend_free(g, dx), sd_backend_free(g, dg1), sd_backend_free(g, dg2);

    free(hs.ptr), sd_backend_free(g, ws.ptr);
    sd_backend_free(g, xd), sd_backend_free(g, dyd), sd_backend_free(g, y);
    sd_backend_free(g, gd), sd_backend_free(g, bd), sd_backend_free(g, md), sd_backend_free(g, rd);
    free(x), free(dy), free(pre), free(gm), free(bt), free(pg), free(pb);
    free(ref), free(rm), free(rr), free(rg), free(rb);
}

/* ---- layer norm --------------------------------------------------------------------------- */

static void test_layer_norm(const sd_backend *g, int64_t rows, int c, int affine, int stats_null)
{
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "layer norm rows=%lld c=%d%s", (long long)rows, c,
             affine ? "" : " no gamma/beta");
    const int64_t nx = rows * c;
    const float eps = 1e-5f;
    float *x = hr(g, nx, 2.0f, -0.5f), *dy = hr(g, nx, 1.0f, 0.0f), *pre = hr(g, nx, 1.0f, 0.0f);
    float *gm = hr(g, c, 0.5f, 1.0f), *bt = hr(g, c, 0.5f, 0.0f);
    float *pg = hrand(c, 1.0f, 0.0f), *pb = hrand(c, 1.0f, 0.0f);
    const float *gam = affine ? gm : NULL, *bet = affine ? bt : NULL;
    float *ref = malloc((size_t)nx * sizeof(float)), *rm = malloc((size_t)rows * sizeof(float));
    float *rr = malloc((size_t)rows * sizeof(float));
    sd_layer_norm_forward(cpu, rows, c, eps, x, gam, bet, ref, rm, rr);

    void *xd = dput(g, x, nx), *dyd = dput(g, dy, nx), *y = dnan(g, nx);
    void *gd = dput(g, gm, c), *bd = dput(g, bt, c);
    const void *gamd = affine ? gd : NULL, *betd = affine ? bd : NULL;
    float *md = dput32(g, NULL, rows), *rd = dput32(g, NULL, rows);
    sd_layer_norm_forward(g, rows, c, eps, xd, gamd, betd, y, stats_null ? NULL : md,
                          stats_null ? NULL : rd);
    snprintf(what, sizeof what, "%s forward%s", tag, stats_null ? " (mean/rstd NULL)" : "");
    cmp_dev(g, what, y, ref, nx);
    if (!stats_null) {
        snprintf(what, sizeof what, "%s mean", tag);
        cmp_dev32(g, what, md, rm, rows);
        snprintf(what, sizeof what, "%s rstd", tag);
        cmp_dev32(g, what, rd, rr, rows);
    }

    sd_upload(g, md, rm, (size_t)rows * sizeof(float));
    sd_upload(g, rd, rr, (size_t)rows * sizeof(float));
    sd_scratch ws = dscratch(g, sd_layer_norm_backward_scratch_bytes(g, rows, c));
    sd_scratch hs = hscratch(sd_layer_norm_backward_scratch_bytes(cpu, rows, c));
    float *rg = malloc((size_t)c * sizeof(float)), *rb = malloc((size_t)c * sizeof(float));
    for (int acc = 0; acc < 2; acc++) {
        memcpy(ref, pre, (size_t)nx * sizeof(float));
        memcpy(rg, pg, (size_t)c * sizeof(float));
        memcpy(rb, pb, (size_t)c * sizeof(float));
        sd_layer_norm_backward(cpu, rows, c, x, gam, rm, rr, dy, ref, acc, rg, rb, hs);
        void *dx = acc ? dput(g, pre, nx) : dnan(g, nx);
        float *dg = dput32(g, pg, c), *db = dput32(g, pb, c);
        sd_layer_norm_backward(g, rows, c, xd, gamd, md, rd, dyd, dx, acc, dg, db, ws);
        snprintf(what, sizeof what, "%s backward dx %s", tag, acc ? "accumulated" : "written");
        cmp_dev(g, what, dx, ref, nx);
        snprintf(what, sizeof what, "%s backward dgamma (added to a preload)", tag);
        cmp_dev32(g, what, dg, rg, c);
        snprintf(what, sizeof what, "%s backward dbeta (added to a preload)", tag);
        cmp_dev32(g, what, db, rb, c);
        sd_backend_free(g, dx), sd_backend_free(g, dg), sd_backend_free(g, db);
    }
    /* dx NULL, dbeta alone; then dgamma/dbeta NULL */
    memcpy(rb, pb, (size_t)c * sizeof(float));
    sd_layer_norm_backward(cpu, rows, c, x, gam, rm, rr, dy, NULL, 0, NULL, rb, hs);
    float *db = dput32(g, pb, c);
    sd_layer_norm_backward(g, rows, c, xd, gamd, md, rd, dyd, NULL, 0, NULL, db, ws);
    snprintf(what, sizeof what, "%s backward dbeta alone (dx, dgamma NULL)", tag);
    cmp_dev32(g, what, db, rb, c);
    sd_layer_norm_backward(cpu, rows, c, x, gam, rm, rr, dy, ref, 0, NULL, NULL, hs);
    void *dx = dnan(g, nx);
    sd_layer_norm_backward(g, rows, c, xd, gamd, md, rd, dyd, dx, 0, NULL, NULL, ws);
    snprintf(what, sizeof what, "%s backward dx alone (dgamma, dbeta NULL)", tag);
    cmp_dev(g, what, dx, ref, nx);
    sd_backend_free(g, db), sd_backend_free(g, dx);

    free(hs.ptr), sd_backend_free(g, ws.ptr);
    sd_backend_free(g, xd), sd_backend_free(g, dyd), sd_backend_free(g, y);
    sd_backend_free(g, gd), sd_backend_free(g, bd), sd_backend_free(g, md), sd_backend_free(g, rd);
    free(x), free(dy), free(pre), free(gm), free(bt), free(pg), free(pb);
    free(ref), free(rm), free(rr), free(rg), free(rb);
}

static void run_group_norms(const sd_backend *g)
{
    gn_shift = 0.5f;
    test_group_norm(g, 2, 37, 24, 4, 0, 1, 0);
    test_group_norm(g, 2, 37, 24, 4, 1, 1, 0);
    test_group_norm(g, 2, 37, 24, 4, 1, 0, 1);
    test_group_norm(g, 2, 256, 320, 32, 1, 1, 0);
    test_group_norm(g, 1, 600, 40, 8, 1, 1, 1); /* three row chunks, the last one partial */
    test_group_norm(g, 2, 1100, 128, 32, 1, 1, 0); /* VAE-like: 4 channels a group, 5 chunks */
    /* large enough that the 16-byte kernels' grid-stride loops wrap (the grid is capped near 16
     * blocks per SM), with the channels a multiple (128) and not a multiple (320) of the
     * vectors a block covers; left out under compute-sanitizer (SD_GPU_TEST_QUICK=1), where
     * the smaller cases above already cover every kernel */
    if (!quick()) {
        test_group_norm(g, 32, 4096, 128, 32, 1, 1, 0);
        test_group_norm(g, 16, 1024, 320, 32, 1, 1, 0);
    }
    gn_shift = 40.0f; /* mean 35 times the spread */
    test_group_norm(g, 2, 600, 40, 8, 1, 1, 0);
    gn_shift = 0.5f;
}

static void run_all(const sd_backend *g)
{
    const int64_t big = 1000003;
    test_stream_clock(g);
    test_unary(g, "SiLU", sd_silu_forward, sd_silu_backward, big);
    test_unary(g, "GELU", sd_gelu_forward, sd_gelu_backward, big);
    test_unary(g, "QuickGELU", sd_quick_gelu_forward, sd_quick_gelu_backward, big);
    test_geglu(g, 1001, 37);
    test_add_axpby(g, big);
    test_add_bcast(g, 3, 1000, 70);
    test_concat_split(g, 333, 17, 40);
    test_permute(g, 2, 5, 7, 9);
    test_upsample(g, 2, 5, 7, 3, 10, 14);
    test_upsample(g, 2, 5, 7, 3, 11, 9);
    test_upsample(g, 1, 7, 6, 4, 3, 4); /* shrinking: some input cells receive nothing */
    /* the row-wise kernels with more rows than a grid's y dimension (65535): their row loops
     * wrap; a channel count (VAE-like 128, bf16: 16-byte chunks) and a 32-bit-odd one */
    if (!quick()) {
        test_geglu(g, 70001, 8);
        test_add_bcast(g, 2, 70001, 5);
        test_concat_split(g, 70001, 3, 8);
    }
    test_upsample(g, 2, 16, 16, 128, 32, 32);

    sd_timestep_embedding_desc d = sd_timestep_embedding_sd2(320);
    test_timestep(g, 9, d, "SD2 dim 320 (flip_sin_to_cos)");
    d.dim = 33, d.flip_sin_to_cos = 0, d.downscale_freq_shift = 1.0f, d.scale = 0.5f;
    test_timestep(g, 9, d, "dim 33, sin first, shift 1, scale 0.5");
    test_embedding(g, 3, 11, 40, 100);
    test_gaussian(g, 333, 4);
    test_cast_upload(g, 100003);
    test_mse_loss(g, 5, 32 * 32, 4);
    test_mse_loss(g, 3, 77, 3);

    run_group_norms(g);
    test_layer_norm(g, 333, 77, 1, 0);
    test_layer_norm(g, 64, 1280, 1, 1);
    test_layer_norm(g, 300, 24, 0, 0);
}

/* The group norms again on fresh backends made with SDTRAIN_CUDA_GN_STATS = stats and
 * SDTRAIN_CUDA_GN_APPLY = apply (NULL: unset, the default; both are read when a backend is
 * created). */
static void group_norm_round(const char *stats, const char *apply)
{
    sd_backend *gpu[2];
    if (stats)
        setenv("SDTRAIN_CUDA_GN_STATS", stats, 1);
    else
        unsetenv("SDTRAIN_CUDA_GN_STATS");
    if (apply)
        setenv("SDTRAIN_CUDA_GN_APPLY", apply, 1);
    else
        unsetenv("SDTRAIN_CUDA_GN_APPLY");
    int n = gpu_backends(gpu);
    tap_diag("group norm with SDTRAIN_CUDA_GN_STATS=%s SDTRAIN_CUDA_GN_APPLY=%s",
             stats ? stats : "(default)", apply ? apply : "(default)");
    for (int i = 0; i < n; i++)
        run_group_norms(gpu[i]);
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    unsetenv("SDTRAIN_CUDA_GN_STATS");
    unsetenv("SDTRAIN_CUDA_GN_APPLY");
}

/* Group norm forward (+SiLU) on a backend made with `var` = `a` and on one made with `var` = `b`,
 * same inputs: the same bits (the variants that promise it). For the dtypes in `dts` (SD_F32,
 * SD_BF16 or both); a shape whose grid-stride loops wrap. */
static void variants_same_bits(const char *var, const char *a_value, const char *b_value, int dts_mask)
{
    const sd_dtype dts[2] = {SD_F32, SD_BF16};
    for (int k = 0; k < 2; k++) {
        if (!(dts_mask & (1 << k)))
            continue;
        sd_backend *bes[2] = {NULL, NULL};
        const char *values[2] = {a_value, b_value};
        sd_err err;
        int made = 1;
        for (int j = 0; j < 2 && made; j++) {
            setenv(var, values[j], 1);
            made = sd_backend_cuda_create(0, dts[k], &bes[j], &err) == 0;
            unsetenv(var);
            tap_ok(made, "%s=%s backend [%s]: %s", var, values[j], sd_dtype_name(dts[k]),
                   made ? "made" : err.msg);
        }
        if (!made) {
            if (bes[0])
                sd_backend_cuda_destroy(bes[0]);
            continue;
        }
        sd_group_norm_desc d = {16, quick() ? 64 : 1024, 320, 32, 1e-5f, 1};
        const int64_t nx = (int64_t)d.n * d.hw * d.c;
        float *x = hr(bes[0], nx, 2.0f, 0.5f), *gm = hr(bes[0], d.c, 0.5f, 1.0f),
              *bt = hr(bes[0], d.c, 0.5f, 0.0f);
        void *outs[2];
        for (int j = 0; j < 2; j++) {
            void *xd = dput(bes[j], x, nx), *gd = dput(bes[j], gm, d.c), *bd = dput(bes[j], bt, d.c);
            sd_scratch ws = dscratch(bes[j], sd_group_norm_forward_scratch_bytes(bes[j], &d));
            outs[j] = dnan(bes[j], nx);
            sd_group_norm_forward(bes[j], &d, xd, gd, bd, outs[j], NULL, NULL, ws);
            sd_synchronize(bes[j]);
            sd_backend_free(bes[j], xd), sd_backend_free(bes[j], gd), sd_backend_free(bes[j], bd);
            sd_backend_free(bes[j], ws.ptr);
        }
        const size_t bytes = (size_t)nx * sd_dtype_size(dts[k]);
        unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
        sd_download(bes[0], ha, outs[0], bytes);
        sd_download(bes[1], hb, outs[1], bytes);
        tap_ok(memcmp(ha, hb, bytes) == 0, "group norm: %s=%s gives the bits of %s [%s]", var,
               b_value, a_value, sd_dtype_name(dts[k]));
        free(ha), free(hb), free(x), free(gm), free(bt);
        for (int j = 0; j < 2; j++) {
            sd_backend_free(bes[j], outs[j]);
            sd_backend_cuda_destroy(bes[j]);
        }
    }
}

/* A backend with `var` = `value` must not be created. */
static void refused(const char *var, const char *value)
{
    sd_backend *bad = NULL;
    sd_err err;
    setenv(var, value, 1);
    tap_ok(sd_backend_cuda_create(0, SD_F32, &bad, &err) != 0, "%s=%s is refused: %s", var, value,
           bad ? "(accepted)" : err.msg);
    if (bad)
        sd_backend_cuda_destroy(bad);
    unsetenv(var);
}

int main(void)
{
    sd_backend *gpu[2];
    int n = gpu_backends(gpu);
    gpu_seed_from_env();
    cpu = sd_backend_cpu();
    for (int i = 0; i < n; i++)
        run_all(gpu[i]);
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);

    /* the group norm's other statistics modes (wide is the default) and apply kernels (auto,
     * fast for bf16 and regs for fp32, is the default): regs gives the bits of loads, fast the
     * approximate SiLU, wide the bits of onepass */
    group_norm_round("onepass", "loads");
    group_norm_round("twopass", NULL);
    group_norm_round("twopass", "loads");
    group_norm_round(NULL, "loads");
    group_norm_round(NULL, "regs");
    group_norm_round(NULL, "fast");
    group_norm_round("onepass", NULL);
    /* the asynchronous copies in order on the compute stream */
    setenv("SDTRAIN_CUDA_COPY_STREAM", "off", 1);
    n = gpu_backends(gpu);
    tap_diag("asynchronous copies with SDTRAIN_CUDA_COPY_STREAM=off");
    for (int i = 0; i < n; i++)
        test_cast_upload(gpu[i], 100003);
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    unsetenv("SDTRAIN_CUDA_COPY_STREAM");
    refused("SDTRAIN_CUDA_COPY_STREAM", "bogus");
    variants_same_bits("SDTRAIN_CUDA_GN_APPLY", "loads", "regs", 3);
    variants_same_bits("SDTRAIN_CUDA_GN_APPLY", "regs", "auto", 1); /* fp32 */
    variants_same_bits("SDTRAIN_CUDA_GN_APPLY", "fast", "auto", 2); /* bf16 */
    variants_same_bits("SDTRAIN_CUDA_GN_STATS", "onepass", "wide", 3);
    refused("SDTRAIN_CUDA_GN_APPLY", "bogus");
    refused("SDTRAIN_CUDA_GN_STATS", "bogus");
    return tap_done();
}
