/* CUDA backend vs CPU backend: conv2d forward (with and without bias, with a residual) and
 * backward (dx written and added, dw and db accumulated onto preloaded values, each gradient left
 * out once), on the shapes SD2 uses scaled down, in F32 and BF16 mode; a repeated call must give
 * the same bits. Then again with cuDNN's timed algorithms, and with the forward through cuDNN's
 * graph API (SDTRAIN_CUDA_CONV_API=graph, the default; the rounds before set legacy). */
#include "cuda_compare.h"

typedef struct conv_case {
    const char *name;
    sd_conv2d_desc d;
} conv_case;

static int64_t x_count(const sd_conv2d_desc *d)
{
    return (int64_t)d->n * d->h * d->w * d->c_in;
}
static int64_t w_count(const sd_conv2d_desc *d)
{
    return (int64_t)d->c_out * d->kh * d->kw * d->c_in;
}
static int64_t y_count(const sd_conv2d_desc *d)
{
    return (int64_t)d->n * d->h_out * d->w_out * d->c_out;
}

/* ---- the CPU reference ---------------------------------------------------------------------- */

static void cpu_forward(const sd_conv2d_desc *d, const float *x, const float *w, const float *b,
                        float *y)
{
    const sd_backend *cpu = sd_backend_cpu();
    sd_scratch ws = hscratch(sd_conv2d_forward_scratch_bytes(cpu, d));
    sd_conv2d_forward(cpu, d, x, w, b, y, ws);
    free(ws.ptr);
}

static void cpu_forward_add(const sd_conv2d_desc *d, const float *x, const float *w,
                            const float *b, const float *z, float *y)
{
    const sd_backend *cpu = sd_backend_cpu();
    sd_scratch ws = hscratch(sd_conv2d_forward_scratch_bytes(cpu, d));
    sd_conv2d_forward_add(cpu, d, x, w, b, z, y, ws);
    free(ws.ptr);
}

static void cpu_backward(const sd_conv2d_desc *d, const float *x, const float *w, const float *dy,
                         float *dx, int accumulate, float *dw, float *db)
{
    const sd_backend *cpu = sd_backend_cpu();
    sd_scratch ws = hscratch(sd_conv2d_backward_scratch_bytes(cpu, d));
    sd_conv2d_backward(cpu, d, x, w, dy, dx, accumulate, dw, db, ws);
    free(ws.ptr);
}

/* ---- CUDA calls ----------------------------------------------------------------------------- */

/* Scratch filled with all-ones bytes (NaN as float and as bf16), so a piece the op reads
 * before writing shows up as NaN in the result. */
static sd_scratch poisoned_scratch(const sd_backend *be, size_t bytes)
{
    sd_scratch s = dscratch(be, bytes);
    if (bytes) {
        unsigned char *h = (unsigned char *)malloc(bytes);
        memset(h, 0xff, bytes);
        sd_upload(be, s.ptr, h, bytes);
        free(h);
    }
    return s;
}

static float *gpu_forward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                          const void *w, const void *b)
{
    void *y = dnan(be, y_count(d));
    sd_scratch ws = poisoned_scratch(be, sd_conv2d_forward_scratch_bytes(be, d));
    sd_conv2d_forward(be, d, x, w, b, y, ws);
    float *h = dget(be, y, y_count(d));
    sd_backend_free(be, y);
    if (ws.ptr)
        sd_backend_free(be, ws.ptr);
    return h;
}

/* y = conv + b + z (the residual form); z on the device */
static float *gpu_forward_add(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                              const void *w, const void *b, const void *z)
{
    void *y = dnan(be, y_count(d));
    sd_scratch ws = poisoned_scratch(be, sd_conv2d_forward_scratch_bytes(be, d));
    sd_conv2d_forward_add(be, d, x, w, b, z, y, ws);
    float *h = dget(be, y, y_count(d));
    sd_backend_free(be, y);
    if (ws.ptr)
        sd_backend_free(be, ws.ptr);
    return h;
}

typedef struct grads {
    float *dx, *dw, *db; /* host copies; NULL for a gradient left out */
} grads;

static void grads_free(grads *g)
{
    free(g->dx);
    free(g->dw);
    free(g->db);
}

/* One CUDA backward. dx starts as NaN (accumulate 0) or as dx0 (accumulate 1), dw as dw0, db as
 * db0; a zero want_* passes NULL for that gradient. */
static grads gpu_backward(const sd_backend *be, const sd_conv2d_desc *d, const void *x,
                          const void *w, const void *dy, int want_dx, int accumulate,
                          const float *dx0, int want_dw, const float *dw0, int want_db,
                          const float *db0)
{
    void *dx = NULL;
    if (want_dx)
        dx = accumulate ? dput(be, dx0, x_count(d)) : dnan(be, x_count(d));
    float *dw = want_dw ? dput32(be, dw0, w_count(d)) : NULL;
    float *db = want_db ? dput32(be, db0, d->c_out) : NULL;
    sd_scratch ws = poisoned_scratch(be, sd_conv2d_backward_scratch_bytes(be, d));
    if (dw)
        sd_conv2d_backward(be, d, x, w, dy, dx, accumulate, dw, db, ws);
    else /* the sd_* wrapper insists on dw; the backend entry takes NULL */
        be->ops->conv2d_backward(be, d, x, w, dy, dx, accumulate, dw, db, ws);
    grads g = {NULL, NULL, NULL};
    if (dx) {
        g.dx = dget(be, dx, x_count(d));
        sd_backend_free(be, dx);
    }
    if (dw) {
        g.dw = dget32(be, dw, w_count(d));
        sd_backend_free(be, dw);
    }
    if (db) {
        g.db = dget32(be, db, d->c_out);
        sd_backend_free(be, db);
    }
    if (ws.ptr)
        sd_backend_free(be, ws.ptr);
    return g;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return (a == NULL && b == NULL) ||
           (a != NULL && b != NULL && memcmp(a, b, (size_t)n * sizeof(float)) == 0);
}

/* ---- one shape on one backend ---------------------------------------------------------------- */

static void test_case(const sd_backend *be, const conv_case *c)
{
    const sd_conv2d_desc *d = &c->d;
    const int64_t nx = x_count(d), nw = w_count(d), ny = y_count(d), nb = d->c_out;
    const double tol = gpu_tol(be);
    char what[200];

    float *x = hrand(nx, 1.0f, 0.0f), *w = hrand(nw, 0.5f, 0.0f), *b = hrand(nb, 1.0f, 0.0f);
    float *dy = hrand(ny, 1.0f, 0.0f), *dx0 = hrand(nx, 1.0f, 0.0f);
    float *dw0 = hrand(nw, 1.0f, 0.0f), *db0 = hrand(nb, 1.0f, 0.0f);
    hround(be, x, nx);
    hround(be, w, nw);
    hround(be, b, nb);
    hround(be, dy, ny);
    hround(be, dx0, nx);

    /* references */
    float *y_ref = (float *)malloc((size_t)ny * sizeof(float));
    float *yb_ref = (float *)malloc((size_t)ny * sizeof(float));
    cpu_forward(d, x, w, NULL, y_ref);
    cpu_forward(d, x, w, b, yb_ref);
    float *dx_ref0 = (float *)calloc((size_t)nx, sizeof(float));
    float *dw_ref = hcopy(dw0, nw), *db_ref = hcopy(db0, nb);
    cpu_backward(d, x, w, dy, dx_ref0, 0, dw_ref, db_ref);
    float *dx_ref1 = hcopy(dx0, nx), *dw_scrap = hcopy(dw0, nw);
    cpu_backward(d, x, w, dy, dx_ref1, 1, dw_scrap, NULL);

    void *x_d = dput(be, x, nx), *w_d = dput(be, w, nw), *b_d = dput(be, b, nb);
    void *dy_d = dput(be, dy, ny);

    /* forward */
    float *y = gpu_forward(be, d, x_d, w_d, NULL);
    snprintf(what, sizeof what, "%s forward, no bias", c->name);
    check_close(be, what, y, y_ref, ny, tol);
    float *yb = gpu_forward(be, d, x_d, w_d, b_d);
    snprintf(what, sizeof what, "%s forward, bias", c->name);
    check_close(be, what, yb, yb_ref, ny, tol);
    float *yb2 = gpu_forward(be, d, x_d, w_d, b_d);
    tap_ok(same_bits(yb, yb2, ny), "%s forward twice: same bits [%s]", c->name,
           sd_dtype_name(be->dtype));

    /* forward with a residual (bias and none): cuDNN's fused epilogue where it applies */
    {
        float *z = hrand(ny, 1.0f, 0.0f), *yz_ref = (float *)malloc((size_t)ny * sizeof(float));
        hround(be, z, ny);
        void *z_d = dput(be, z, ny);
        for (int with_bias = 1; with_bias >= 0; with_bias--) {
            cpu_forward_add(d, x, w, with_bias ? b : NULL, z, yz_ref);
            float *yz = gpu_forward_add(be, d, x_d, w_d, with_bias ? b_d : NULL, z_d);
            snprintf(what, sizeof what, "%s forward + residual, %s", c->name,
                     with_bias ? "bias" : "no bias");
            check_close(be, what, yz, yz_ref, ny, tol);
            float *yz2 = gpu_forward_add(be, d, x_d, w_d, with_bias ? b_d : NULL, z_d);
            tap_ok(same_bits(yz, yz2, ny), "%s forward + residual twice: same bits [%s]",
                   c->name, sd_dtype_name(be->dtype));
            free(yz);
            free(yz2);
        }
        sd_backend_free(be, z_d);
        free(z);
        free(yz_ref);
    }

    /* backward: all three gradients, dx written */
    grads a = gpu_backward(be, d, x_d, w_d, dy_d, 1, 0, dx0, 1, dw0, 1, db0);
    snprintf(what, sizeof what, "%s backward dx (accumulate 0)", c->name);
    check_close(be, what, a.dx, dx_ref0, nx, tol);
    snprintf(what, sizeof what, "%s backward dw += (preloaded)", c->name);
    check_close(be, what, a.dw, dw_ref, nw, tol);
    snprintf(what, sizeof what, "%s backward db += (preloaded)", c->name);
    check_close(be, what, a.db, db_ref, nb, tol);

    grads a2 = gpu_backward(be, d, x_d, w_d, dy_d, 1, 0, dx0, 1, dw0, 1, db0);
    tap_ok(same_bits(a.dx, a2.dx, nx) && same_bits(a.dw, a2.dw, nw) &&
               same_bits(a.db, a2.db, nb),
           "%s backward twice: same bits in dx, dw, db [%s]", c->name, sd_dtype_name(be->dtype));

    /* dx added to a preload, db left out */
    grads g = gpu_backward(be, d, x_d, w_d, dy_d, 1, 1, dx0, 1, dw0, 0, db0);
    snprintf(what, sizeof what, "%s backward dx (accumulate 1), db NULL", c->name);
    check_close(be, what, g.dx, dx_ref1, nx, tol);
    snprintf(what, sizeof what, "%s backward dw, db NULL", c->name);
    check_close(be, what, g.dw, dw_ref, nw, tol);
    grads_free(&g);

    /* dx left out */
    g = gpu_backward(be, d, x_d, w_d, dy_d, 0, 0, dx0, 1, dw0, 1, db0);
    snprintf(what, sizeof what, "%s backward dw, dx NULL", c->name);
    check_close(be, what, g.dw, dw_ref, nw, tol);
    snprintf(what, sizeof what, "%s backward db, dx NULL", c->name);
    check_close(be, what, g.db, db_ref, nb, tol);
    grads_free(&g);

    /* dw left out (backend entry called directly) */
    g = gpu_backward(be, d, x_d, w_d, dy_d, 1, 1, dx0, 0, dw0, 1, db0);
    snprintf(what, sizeof what, "%s backward dx (accumulate 1), dw NULL", c->name);
    check_close(be, what, g.dx, dx_ref1, nx, tol);
    snprintf(what, sizeof what, "%s backward db, dw NULL", c->name);
    check_close(be, what, g.db, db_ref, nb, tol);
    grads_free(&g);

    grads_free(&a);
    grads_free(&a2);
    free(y);
    free(yb);
    free(yb2);
    sd_backend_free(be, x_d);
    sd_backend_free(be, w_d);
    sd_backend_free(be, b_d);
    sd_backend_free(be, dy_d);
    free(y_ref);
    free(yb_ref);
    free(dx_ref0);
    free(dx_ref1);
    free(dw_ref);
    free(dw_scrap);
    free(db_ref);
    free(x);
    free(w);
    free(b);
    free(dy);
    free(dx0);
    free(dw0);
    free(db0);
}

/* A backend is not made with `var` set to a value it does not know. */
static void bogus_refused(const char *var)
{
    sd_backend *bad = NULL;
    sd_err err;
    setenv(var, "bogus", 1);
    tap_ok(sd_backend_cuda_create(0, SD_F32, &bad, &err) != 0, "%s=bogus is refused: %s", var,
           bad ? "(accepted)" : err.msg);
    if (bad)
        sd_backend_cuda_destroy(bad);
    unsetenv(var);
}

int main(void)
{
    sd_backend *gpu[2];
    /* the legacy convolution calls first (graph is SDTRAIN_CUDA_CONV_API's default) */
    setenv("SDTRAIN_CUDA_CONV_API", "legacy", 1);
    int n = gpu_backends(gpu);
    gpu_seed_from_env();

    /* small enough for the CPU reference (about 1.5 GFLOP over both modes) */
    const conv_case cases[] = {
        {"3x3 pad 1, 2x9x7x5 -> 6", sd_conv2d_make(2, 9, 7, 5, 6, 3, 1, 1)},
        {"3x3 pad 1, 2x16x16x64 -> 64", sd_conv2d_make(2, 16, 16, 64, 64, 3, 1, 1)},
        {"3x3 pad 1, 2x8x8x320 -> 320", sd_conv2d_make(2, 8, 8, 320, 320, 3, 1, 1)},
        {"1x1, 2x8x8x32 -> 16", sd_conv2d_make(2, 8, 8, 32, 16, 1, 1, 0)},
        {"3x3 stride 2 pad 1, 2x9x10x8 -> 12", sd_conv2d_make(2, 9, 10, 8, 12, 3, 2, 1)},
        {"Downsample2D pad 0,1,0,1 stride 2, 2x9x9x16 -> 16",
         sd_conv2d_make_padded(2, 9, 9, 16, 16, 3, 3, 2, 0, 1, 0, 1)},
        {"Downsample2D pad 0,1,0,1 stride 2, 2x8x10x16 -> 16",
         sd_conv2d_make_padded(2, 8, 10, 16, 16, 3, 3, 2, 0, 1, 0, 1)},
        {"conv_in 3x3 pad 1, 2x12x12x4 -> 32", sd_conv2d_make(2, 12, 12, 4, 32, 3, 1, 1)},
        {"RGB 3x3 pad 1, 2x11x13x3 -> 8", sd_conv2d_make(2, 11, 13, 3, 8, 3, 1, 1)},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);

    for (int i = 0; i < n; i++)
        for (int k = 0; k < ncases; k++)
            test_case(gpu[i], &cases[k]);

    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);

    /* the algorithms of cuDNN's timed runs (SDTRAIN_CUDA_CONV_ALGO=find, read when a backend
     * is created): the same filters, so the same checks must hold */
    setenv("SDTRAIN_CUDA_CONV_ALGO", "find", 1);
    n = gpu_backends(gpu);
    tap_diag("convolutions with SDTRAIN_CUDA_CONV_ALGO=find");
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ncases; k++)
            test_case(gpu[i], &cases[k]);
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    /* cuDNN's graph API for the forward (SDTRAIN_CUDA_CONV_API: conv + bias (+ residual) as one
     * graph, asymmetric padding without a padded copy): precompiled engines from the heuristics,
     * the same timed, and engines compiled at run time (left out under compute-sanitizer,
     * SD_GPU_TEST_QUICK=1). Every case must pass the same checks against the CPU. A shape without
     * a plan falls back to the legacy calls, so the plans are listed, and the BF16 3x3 shapes of
     * the VAE and U-Net (what the graph API is for) must have both plans under one of the rounds
     * at least: which engines cuDNN offers for the fused graph is the card's and version's
     * business, not ours. */
    static const char *const graph_api[] = {"graph (the default)", "graph", "graph-rtc"};
    static const char *const graph_algo[] = {"heuristic", "find", "heuristic"};
    const char *quick = getenv("SD_GPU_TEST_QUICK");
    const int rounds = quick && strcmp(quick, "1") == 0 ? 2 : 3;
    int bf16_planned = 0;
    for (int r = 0; r < rounds; r++) {
        if (r == 0) /* the default */
            unsetenv("SDTRAIN_CUDA_CONV_API");
        else
            setenv("SDTRAIN_CUDA_CONV_API", graph_api[r], 1);
        setenv("SDTRAIN_CUDA_CONV_ALGO", graph_algo[r], 1);
        n = gpu_backends(gpu);
        tap_diag("convolutions with SDTRAIN_CUDA_CONV_API=%s, SDTRAIN_CUDA_CONV_ALGO=%s",
                 graph_api[r], graph_algo[r]);
        for (int i = 0; i < n; i++) {
            int planned = 0;
            for (int k = 0; k < ncases; k++) {
                const int p = sd_backend_cuda_conv_graph_plans(gpu[i], &cases[k].d);
                const int64_t runs0 = sd_backend_cuda_conv_graph_runs(gpu[i]);
                planned += (p & 1) + (p >> 1 & 1);
                tap_diag("%s %s: graph plans:%s%s", sd_dtype_name(gpu[i]->dtype), cases[k].name,
                         p & 1 ? " conv+bias" : "", p & 2 ? " conv+bias+residual" : " -");
                test_case(gpu[i], &cases[k]);
                /* test_case runs each planned form twice with a bias: every one of those calls
                 * must have gone through its plan (a plan cuDNN refuses at run time is dropped,
                 * and the call runs legacy: that fails here) */
                const int64_t ran = sd_backend_cuda_conv_graph_runs(gpu[i]) - runs0;
                const int64_t want = 2 * (p & 1) + 2 * (p >> 1 & 1);
                tap_ok(ran == want, "%s %s: %lld forward calls ran through graph plans, %lld "
                       "expected (%s)", sd_dtype_name(gpu[i]->dtype), cases[k].name,
                       (long long)ran, (long long)want, graph_api[r]);
            }
            tap_diag("%s: %d of %d graph plans", sd_dtype_name(gpu[i]->dtype), planned,
                     2 * ncases);
            if (gpu[i]->dtype == SD_BF16 &&
                sd_backend_cuda_conv_graph_plans(gpu[i], &cases[1].d) == 3 &&
                sd_backend_cuda_conv_graph_plans(gpu[i], &cases[2].d) == 3)
                bf16_planned = 1;
        }
        for (int i = 0; i < n; i++)
            sd_backend_cuda_destroy(gpu[i]);
    }
    if (n == 2 && rounds == 3)
        tap_ok(bf16_planned, "BF16 3x3 pad 1 shapes: the graph API made both plans (conv + bias, "
               "+ residual) in one of the rounds");
    else if (n == 2) /* without the run-time-compiled round (compute-sanitizer) */
        tap_diag("BF16 3x3 pad 1 shapes: graph plans %s in the precompiled rounds",
                 bf16_planned ? "made" : "not made");
    unsetenv("SDTRAIN_CUDA_CONV_API");
    unsetenv("SDTRAIN_CUDA_CONV_ALGO");
    bogus_refused("SDTRAIN_CUDA_CONV_API");
    bogus_refused("SDTRAIN_CUDA_CONV_BIAS");
    bogus_refused("SDTRAIN_CUDA_CONV_ALGO");
    return tap_done();
}
