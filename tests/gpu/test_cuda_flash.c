/* Fused ("flash") attention of the CUDA backend (SDTRAIN_CUDA_ATTENTION=flash): forward (o,
 * lse) and backward (dq, dk, dv; write and accumulate; each NULL once) against the CPU backend,
 * against the math path on the same GPU inputs, and bit for bit against itself. Ragged tiles,
 * the 77-token text context, causal CLIP shapes, fused-QKV and unaligned row strides, head_dim
 * 32/64/128, and descriptors the fused kernels leave to the math path.
 * SDTRAIN_FLASH_BENCH=1 adds timings of flash vs math for SD2 shapes as TAP diagnostics. */
#include <time.h>

#include "cuda_compare.h"

static const sd_backend *cpu;

typedef struct flash_case {
    const char *name;
    int batch, heads, head_dim, t_q, t_kv, causal;
    int layout;     /* 0 contiguous, 1 fused QKV (q, k, v and their gradients in one [b, t, 3C]
                     * buffer), 2 padded rows (every ld = C + 3: no 16-byte loads) */
    int accumulate; /* backward adds onto random preloads */
    int null_mask;  /* backward: 1 dq, 2 dk, 4 dv passed as NULL */
} flash_case;

/* One set of q, k, v (or dq, dk, dv) buffers laid out as the case says: `base` is what gets
 * allocated (one buffer when fused, else three), part[i] the start of q, k, v. */
typedef struct qkv_bufs {
    float *base[3];
    float *part[3];
} qkv_bufs;

typedef struct flash_layout {
    sd_attention_desc d;
    int C;
    int64_t n[3]; /* elements of base[0..2] (fused: n[0] only) */
    int64_t off[3];
    int64_t no;   /* elements of o (row stride ld_o) */
} flash_layout;

static flash_layout flash_make_layout(const flash_case *c)
{
    flash_layout a;
    memset(&a, 0, sizeof a);
    a.d = sd_attention_make(c->batch, c->heads, c->head_dim, c->t_q, c->t_kv, c->causal);
    a.C = c->heads * c->head_dim;
    const int64_t rq = (int64_t)c->batch * c->t_q, rk = (int64_t)c->batch * c->t_kv;
    if (c->layout == 1) {
        a.d.ld_q = a.d.ld_k = a.d.ld_v = 3 * a.C;
        a.n[0] = rq * 3 * a.C;
        a.off[1] = a.C;
        a.off[2] = 2 * a.C;
    } else {
        if (c->layout == 2)
            a.d.ld_q = a.d.ld_k = a.d.ld_v = a.d.ld_o = a.C + 3;
        a.n[0] = rq * a.d.ld_q;
        a.n[1] = rk * a.d.ld_k;
        a.n[2] = rk * a.d.ld_v;
    }
    a.no = rq * a.d.ld_o;
    return a;
}

static int flash_fused(const flash_case *c)
{
    return c->layout == 1;
}

/* Host buffers of random values rounded to bf16 (NaN when nan_fill). */
static qkv_bufs host_qkv(const flash_case *c, const flash_layout *a, const sd_backend *g)
{
    qkv_bufs h;
    memset(&h, 0, sizeof h);
    for (int i = 0; i < 3; i++) {
        if (!a->n[i])
            continue;
        h.base[i] = hrand(a->n[i], 1.0f, 0.0f);
        hround(g, h.base[i], a->n[i]);
    }
    for (int i = 0; i < 3; i++)
        h.part[i] = flash_fused(c) ? h.base[0] + a->off[i] : h.base[i];
    return h;
}

static void host_free(qkv_bufs *h)
{
    for (int i = 0; i < 3; i++)
        free(h->base[i]);
}

/* Device copies of host buffers (nan: NaN-filled instead). */
static qkv_bufs dev_qkv(const sd_backend *g, const flash_case *c, const flash_layout *a,
                        const qkv_bufs *h, int nan)
{
    qkv_bufs d;
    memset(&d, 0, sizeof d);
    const size_t es = sd_dtype_size(g->dtype);
    for (int i = 0; i < 3; i++)
        if (a->n[i])
            d.base[i] = nan ? dnan(g, a->n[i]) : dput(g, h->base[i], a->n[i]);
    for (int i = 0; i < 3; i++)
        d.part[i] = flash_fused(c) ? (float *)((char *)d.base[0] + (size_t)a->off[i] * es)
                                   : d.base[i];
    return d;
}

static void dev_free(const sd_backend *g, qkv_bufs *d)
{
    for (int i = 0; i < 3; i++)
        if (d->base[i])
            sd_backend_free(g, d->base[i]);
}

/* The rows x C values of a strided tensor, made contiguous. */
static float *gather_rows(const float *buf, int64_t rows, int ld, int C)
{
    float *h = (float *)malloc((size_t)(rows * C > 0 ? rows * C : 1) * sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        memcpy(h + r * C, buf + r * ld, (size_t)C * sizeof(float));
    return h;
}

/* Tensor `which` (0 q, 1 k, 2 v) of a device set, downloaded and made contiguous. */
static float *dev_part(const sd_backend *g, const flash_case *c, const flash_layout *a,
                       const qkv_bufs *d, int which)
{
    const int base = flash_fused(c) ? 0 : which;
    float *all = dget(g, d->base[base], a->n[base]);
    const int64_t rows = (int64_t)c->batch * (which == 0 ? c->t_q : c->t_kv);
    const int ld = which == 0 ? a->d.ld_q : which == 1 ? a->d.ld_k : a->d.ld_v;
    float *r = gather_rows(all + (flash_fused(c) ? a->off[which] : 0), rows, ld, a->C);
    free(all);
    return r;
}

static float *host_part(const flash_case *c, const flash_layout *a, const qkv_bufs *h, int which)
{
    const int64_t rows = (int64_t)c->batch * (which == 0 ? c->t_q : c->t_kv);
    const int ld = which == 0 ? a->d.ld_q : which == 1 ? a->d.ld_k : a->d.ld_v;
    return gather_rows(h->part[which], rows, ld, a->C);
}

static int same_bits(const float *x, const float *y, int64_t n)
{
    return memcmp(x, y, (size_t)n * sizeof(float)) == 0;
}

/* A gradient passed as NULL keeps its preload (NaN in write mode). */
static int untouched(const float *got, const float *pre, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (isnan(pre[i]) ? !isnan(got[i]) : got[i] != pre[i])
            return 0;
    return 1;
}

/* One case on `g` (SDTRAIN_CUDA_ATTENTION=flash); with `m` (the same dtype, math path) the
 * results are also compared with the math path's. */
static void test_case(const sd_backend *g, const sd_backend *m, const flash_case *c)
{
    const flash_layout a = flash_make_layout(c);
    const sd_attention_desc *d = &a.d;
    const int64_t nlse = (int64_t)c->batch * c->heads * c->t_q;
    const int64_t rq = (int64_t)c->batch * c->t_q;
    const double tol = gpu_tol(g);
    const char *dt = sd_dtype_name(g->dtype);
    char what[256];

    qkv_bufs hin = host_qkv(c, &a, g);

    /* ---- forward */
    float *o_ref = hrand(a.no, 1.0f, 0.0f), *lse_ref = (float *)malloc((size_t)nlse * 4);
    sd_scratch hs = hscratch(sd_attention_forward_scratch_bytes(cpu, d));
    sd_attention_forward(cpu, d, hin.part[0], hin.part[1], hin.part[2], o_ref, lse_ref, hs);
    free(hs.ptr);
    float *o_ref_c = gather_rows(o_ref, rq, d->ld_o, a.C);

    const sd_backend *bes[2] = {g, m};
    float *o_got[2] = {NULL, NULL}, *lse_got[2] = {NULL, NULL};
    for (int w = 0; w < 2; w++) {
        const sd_backend *be = bes[w];
        if (!be)
            continue;
        qkv_bufs din = dev_qkv(be, c, &a, &hin, 0);
        void *go = dnan(be, a.no);
        float *glse = dput32(be, NULL, nlse);
        sd_scratch ws = dscratch(be, sd_attention_forward_scratch_bytes(be, d));
        sd_attention_forward(be, d, din.part[0], din.part[1], din.part[2], go, glse, ws);
        float *o_all = dget(be, go, a.no);
        o_got[w] = gather_rows(o_all, rq, d->ld_o, a.C);
        lse_got[w] = dget32(be, glse, nlse);
        if (w == 0) {
            sd_attention_forward(be, d, din.part[0], din.part[1], din.part[2], go, NULL, ws);
            float *o_all2 = dget(be, go, a.no);
            tap_ok(same_bits(o_all, o_all2, a.no),
                   "flash forward repeats bit for bit (lse NULL the 2nd time), %s [%s]", c->name,
                   dt);
            free(o_all2);
        }
        free(o_all);
        if (ws.ptr)
            sd_backend_free(be, ws.ptr);
        sd_backend_free(be, go);
        sd_backend_free(be, glse);
        dev_free(be, &din);
    }
    snprintf(what, sizeof what, "flash forward o vs CPU, %s", c->name);
    check_close(g, what, o_got[0], o_ref_c, rq * a.C, tol);
    snprintf(what, sizeof what, "flash forward lse vs CPU, %s", c->name);
    check_close(g, what, lse_got[0], lse_ref, nlse, tol);
    if (m) {
        snprintf(what, sizeof what, "flash forward o vs math path, %s", c->name);
        check_close(g, what, o_got[0], o_got[1], rq * a.C, tol);
        snprintf(what, sizeof what, "flash forward lse vs math path, %s", c->name);
        check_close(g, what, lse_got[0], lse_got[1], nlse, tol);
    }

    /* ---- backward: o as the backend stores it and the CPU's lse go to every backend */
    float *o_in = hcopy(o_ref, a.no);
    hround(g, o_in, a.no);
    float *dout = hrand(a.no, 1.0f, 0.0f);
    hround(g, dout, a.no);
    qkv_bufs pre = host_qkv(c, &a, g); /* preloads (accumulate) */
    if (!c->accumulate)
        for (int i = 0; i < 3; i++)
            for (int64_t j = 0; j < a.n[i]; j++)
                pre.base[i][j] = NAN;
    qkv_bufs ref;
    memset(&ref, 0, sizeof ref);
    for (int i = 0; i < 3; i++)
        ref.base[i] = a.n[i] ? hcopy(pre.base[i], a.n[i]) : NULL;
    for (int i = 0; i < 3; i++)
        ref.part[i] = flash_fused(c) ? ref.base[0] + a.off[i] : ref.base[i];
    hs = hscratch(sd_attention_backward_scratch_bytes(cpu, d));
    sd_attention_backward(cpu, d, hin.part[0], hin.part[1], hin.part[2], o_in, lse_ref, dout,
                          c->null_mask & 1 ? NULL : ref.part[0],
                          c->null_mask & 2 ? NULL : ref.part[1],
                          c->null_mask & 4 ? NULL : ref.part[2], c->accumulate, hs);
    free(hs.ptr);

    /* runs 0 and 1 on the flash backend, 2 on the math backend */
    float *got[3][3];
    memset(got, 0, sizeof got);
    for (int run = 0; run < 3; run++) {
        const sd_backend *be = run < 2 ? g : m;
        if (!be)
            continue;
        qkv_bufs din = dev_qkv(be, c, &a, &hin, 0);
        qkv_bufs dgr = dev_qkv(be, c, &a, &pre, !c->accumulate);
        void *goi = dput(be, o_in, a.no), *gdo = dput(be, dout, a.no);
        float *glse = dput32(be, lse_ref, nlse);
        sd_scratch ws = dscratch(be, sd_attention_backward_scratch_bytes(be, d));
        sd_attention_backward(be, d, din.part[0], din.part[1], din.part[2], goi, glse, gdo,
                              c->null_mask & 1 ? NULL : dgr.part[0],
                              c->null_mask & 2 ? NULL : dgr.part[1],
                              c->null_mask & 4 ? NULL : dgr.part[2], c->accumulate, ws);
        for (int which = 0; which < 3; which++)
            got[run][which] = dev_part(be, c, &a, &dgr, which);
        if (ws.ptr)
            sd_backend_free(be, ws.ptr);
        sd_backend_free(be, goi);
        sd_backend_free(be, gdo);
        sd_backend_free(be, glse);
        dev_free(be, &din);
        dev_free(be, &dgr);
    }
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; which++) {
        const int64_t n = (int64_t)c->batch * (which == 0 ? c->t_q : c->t_kv) * a.C;
        float *r = host_part(c, &a, &ref, which);
        if (c->null_mask & (1 << which)) {
            float *p0 = host_part(c, &a, &pre, which);
            tap_ok(untouched(got[0][which], p0, n), "flash backward %s NULL: buffer untouched, %s [%s]",
                   names[which], c->name, dt);
            free(p0);
        } else {
            const char *mode = c->accumulate ? "accumulate" : "write";
            snprintf(what, sizeof what, "flash backward %s (%s) vs CPU, %s", names[which], mode,
                     c->name);
            check_close(g, what, got[0][which], r, n, tol);
            tap_ok(same_bits(got[0][which], got[1][which], n),
                   "flash backward %s repeats bit for bit, %s [%s]", names[which], c->name, dt);
            if (m) {
                snprintf(what, sizeof what, "flash backward %s (%s) vs math path, %s",
                         names[which], mode, c->name);
                check_close(g, what, got[0][which], got[2][which], n, tol);
            }
        }
        free(r);
    }

    for (int run = 0; run < 3; run++)
        for (int which = 0; which < 3; which++)
            free(got[run][which]);
    for (int w = 0; w < 2; w++) {
        free(o_got[w]);
        free(lse_got[w]);
    }
    host_free(&hin);
    host_free(&pre);
    host_free(&ref);
    free(o_ref);
    free(o_ref_c);
    free(lse_ref);
    free(o_in);
    free(dout);
}

/* ---- timing ------------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Milliseconds per call of forward (backward = 0) or backward on `be`, after one warm-up. */
static double time_attention(const sd_backend *be, const sd_attention_desc *d, int backward,
                             void *q, void *k, void *v, void *o, float *lse, void *dout,
                             void *dq, void *dk, void *dv, int reps)
{
    size_t need = backward ? sd_attention_backward_scratch_bytes(be, d)
                           : sd_attention_forward_scratch_bytes(be, d);
    sd_scratch ws = dscratch(be, need);
    double t0 = 0.0;
    for (int r = 0; r <= reps; r++) {
        if (r == 1) {
            sd_synchronize(be);
            t0 = now_s();
        }
        if (backward)
            sd_attention_backward(be, d, q, k, v, o, lse, dout, dq, dk, dv, 0, ws);
        else
            sd_attention_forward(be, d, q, k, v, o, lse, ws);
    }
    sd_synchronize(be);
    const double ms = (now_s() - t0) * 1e3 / reps;
    if (ws.ptr)
        sd_backend_free(be, ws.ptr);
    return ms;
}

static void bench(const sd_backend *g, const sd_backend *m)
{
    static const struct {
        const char *name;
        int batch, heads, t_q, t_kv;
    } shapes[] = {
        {"SD2 level 1 self (512 px)", 8, 5, 4096, 4096},
        {"SD2 level 2 self (512 px)", 8, 10, 1024, 1024},
        {"SD2 level 1 cross (text 77)", 8, 5, 4096, 77},
        {"SD2 level 2 cross (text 77)", 8, 10, 1024, 77},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const sd_attention_desc d = sd_attention_make(shapes[i].batch, shapes[i].heads, 64,
                                                      shapes[i].t_q, shapes[i].t_kv, 0);
        const int C = shapes[i].heads * 64;
        const int64_t nq = (int64_t)d.batch * d.t_q * C, nk = (int64_t)d.batch * d.t_kv * C;
        const int64_t nlse = (int64_t)d.batch * d.heads * d.t_q;
        float *hq = hrand(nq, 1.0f, 0.0f), *hk = hrand(nk, 1.0f, 0.0f);
        const double flops = 4.0 * d.batch * d.heads * (double)d.t_q * d.t_kv * 64;
        double ms[2][2];
        for (int w = 0; w < 2; w++) {
            const sd_backend *be = w ? m : g;
            void *q = dput(be, hq, nq), *k = dput(be, hk, nk), *v = dput(be, hk, nk);
            void *o = dnan(be, nq), *dout = dput(be, hq, nq);
            void *dq = dnan(be, nq), *dk = dnan(be, nk), *dv = dnan(be, nk);
            float *lse = dput32(be, NULL, nlse);
            ms[w][0] = time_attention(be, &d, 0, q, k, v, o, lse, NULL, NULL, NULL, NULL, 5);
            ms[w][1] = time_attention(be, &d, 1, q, k, v, o, lse, dout, dq, dk, dv, 5);
            sd_backend_free(be, q);
            sd_backend_free(be, k);
            sd_backend_free(be, v);
            sd_backend_free(be, o);
            sd_backend_free(be, dout);
            sd_backend_free(be, dq);
            sd_backend_free(be, dk);
            sd_backend_free(be, dv);
            sd_backend_free(be, lse);
        }
        tap_diag("bench %s b%d h%d d64 tq %d tkv %d: forward flash %.3f ms (%.1f TFLOP/s), math "
                 "%.3f ms; backward flash %.3f ms (%.1f TFLOP/s), math %.3f ms",
                 shapes[i].name, d.batch, d.heads, d.t_q, d.t_kv, ms[0][0],
                 flops / ms[0][0] * 1e-9, ms[1][0], ms[0][1], 2.5 * flops / ms[0][1] * 1e-9,
                 ms[1][1]);
        free(hq);
        free(hk);
    }
}

int main(void)
{
    /* read once at backend creation: one backend per setting */
    sd_backend *flash16, *math16, *flash32;
    sd_err err;
    setenv("SDTRAIN_CUDA_ATTENTION", "flash", 1);
    if (sd_backend_cuda_create(0, SD_BF16, &flash16, &err) != 0)
        tap_skip_all(err.msg);
    if (sd_backend_cuda_create(0, SD_F32, &flash32, &err) != 0) {
        tap_ok(0, "F32 backend: %s", err.msg);
        return tap_done();
    }
    setenv("SDTRAIN_CUDA_ATTENTION", "math", 1);
    if (sd_backend_cuda_create(0, SD_BF16, &math16, &err) != 0) {
        tap_ok(0, "BF16 math backend: %s", err.msg);
        return tap_done();
    }
    setenv("SDTRAIN_CUDA_ATTENTION", "bogus", 1);
    sd_backend *bad = NULL;
    tap_ok(sd_backend_cuda_create(0, SD_BF16, &bad, &err) != 0,
           "SDTRAIN_CUDA_ATTENTION=bogus is refused: %s", bad ? "(accepted)" : err.msg);
    if (bad)
        sd_backend_cuda_destroy(bad);
    unsetenv("SDTRAIN_CUDA_ATTENTION");
    gpu_seed_from_env();
    cpu = sd_backend_cpu();

    static const flash_case cases[] = {
        {"self b2 h2 d64 t17", 2, 2, 64, 17, 17, 0, 0, 0, 0},
        {"self b1 h2 d64 t200, accumulate", 1, 2, 64, 200, 200, 0, 0, 1, 0},
        {"cross b2 h5 d64 tq130 tkv77", 2, 5, 64, 130, 77, 0, 0, 0, 0},
        {"cross b2 h5 d64 tq130 tkv77, accumulate, dq NULL", 2, 5, 64, 130, 77, 0, 0, 1, 1},
        {"causal b2 h4 d64 t77 (CLIP), dk NULL", 2, 4, 64, 77, 77, 1, 0, 0, 2},
        {"causal b1 h4 d64 t77, accumulate", 1, 4, 64, 77, 77, 1, 0, 1, 0},
        {"fused QKV ld 3C b2 h2 d64 t90, dv NULL", 2, 2, 64, 90, 90, 0, 1, 0, 4},
        {"fused QKV causal b1 h4 d64 t77, accumulate", 1, 4, 64, 77, 77, 1, 1, 1, 0},
        {"b3 h5 d64 t150", 3, 5, 64, 150, 150, 0, 0, 0, 0},
        {"padded ld C+3 b2 h2 d64 tq70 tkv45, dk and dv NULL", 2, 2, 64, 70, 45, 0, 2, 0, 6},
        {"padded ld C+3 causal b1 h2 d64 t100, accumulate", 1, 2, 64, 100, 100, 1, 2, 1, 0},
        {"tiny b1 h1 d64 t1", 1, 1, 64, 1, 1, 0, 0, 0, 0},
        {"head_dim 32 b2 h3 t100", 2, 3, 32, 100, 100, 0, 0, 0, 0},
        {"head_dim 32 causal b1 h2 t65, accumulate", 1, 2, 32, 65, 65, 1, 0, 1, 0},
        {"head_dim 128 b1 h2 t130", 1, 2, 128, 130, 130, 0, 0, 0, 0},
        {"head_dim 128 causal b1 h2 t70, accumulate", 1, 2, 128, 70, 70, 1, 0, 1, 0},
        {"head_dim 128 cross b2 h1 tq33 tkv77", 2, 1, 128, 33, 77, 0, 0, 0, 0},
        {"VAE d512 (math path under flash) b1 h1 t64", 1, 1, 512, 64, 64, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_case(flash16, math16, &cases[i]);
    /* F32 under flash keeps the math path */
    test_case(flash32, NULL, &cases[0]);
    test_case(flash32, NULL, &cases[4]);

    const char *b = getenv("SDTRAIN_FLASH_BENCH");
    if (b && strcmp(b, "1") == 0)
        bench(flash16, math16);

    sd_backend_cuda_destroy(flash16);
    sd_backend_cuda_destroy(math16);
    sd_backend_cuda_destroy(flash32);
    return tap_done();
}
