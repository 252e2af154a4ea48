/* CUDA backend vs CPU backend: linear forward/backward (cuBLASLt) and attention
 * forward/backward, in F32 and BF16 mode; backward results must repeat bit for bit. */
#include "cuda_compare.h"

static const sd_backend *cpu;

/* n random values rounded to what `be` stores (both backends then see the same inputs). */
static float *hrand_for(const sd_backend *be, int64_t n, float scale)
{
    float *h = hrand(n, scale, 0.0f);
    hround(be, h, n);
    return h;
}

/* rows x width values at column `offset` of a buffer with row stride ld, made contiguous. */
static float *gather(const float *buf, int64_t rows, int ld, int offset, int width)
{
    float *h = (float *)malloc((size_t)(rows * width > 0 ? rows * width : 1) * sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        memcpy(h + r * width, buf + r * ld + offset, (size_t)width * sizeof(float));
    return h;
}

static int same_bits(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* ---- linear ----------------------------------------------------------------------------- */

/* bias_mode: 0 none, 1 bias in its own allocation, 2 bias one element into a buffer (not
 * 16-byte aligned: the path without the cuBLASLt epilogue). */
static void test_linear_forward(const sd_backend *g, int64_t rows, int in, int out, int bias_mode)
{
    float *x = hrand_for(g, rows * in, 1.0f);
    float *w = hrand_for(g, (int64_t)out * in, 1.0f / sqrtf((float)in));
    float *b = hrand_for(g, out + 1, 1.0f);
    const float *hb = bias_mode ? b + 1 : NULL;
    float *ref = (float *)malloc((size_t)(rows * out) * sizeof(float));
    sd_linear_forward(cpu, rows, in, out, x, w, hb, ref);

    void *gx = dput(g, x, rows * in), *gw = dput(g, w, (int64_t)out * in);
    void *gy = dnan(g, rows * out);
    void *gb = NULL, *gbias = NULL;
    if (bias_mode == 1) {
        gb = dput(g, b + 1, out);
        gbias = gb;
    } else if (bias_mode == 2) {
        gb = dput(g, b, out + 1);
        gbias = (char *)gb + sd_dtype_size(g->dtype);
    }
    sd_linear_forward(g, rows, in, out, gx, gw, gbias, gy);
    float *got = dget(g, gy, rows * out);
    char what[128];
    snprintf(what, sizeof what, "linear forward rows %lld in %d out %d bias %s", (long long)rows,
             in, out, bias_mode == 0 ? "none" : bias_mode == 1 ? "aligned" : "unaligned");
    check_close(g, what, got, ref, rows * out, gpu_tol(g));

    /* with a residual z (cuBLASLt's C input): against the CPU's linear then add */
    float *z = hrand_for(g, rows * out, 1.0f);
    float *zref = (float *)malloc((size_t)(rows * out) * sizeof(float));
    sd_linear_forward_add(cpu, rows, in, out, x, w, hb, z, zref);
    void *gz = dput(g, z, rows * out), *gy2 = dnan(g, rows * out);
    sd_linear_forward_add(g, rows, in, out, gx, gw, gbias, gz, gy2);
    float *got2 = dget(g, gy2, rows * out);
    snprintf(what, sizeof what, "linear forward + residual rows %lld in %d out %d bias %s",
             (long long)rows, in, out,
             bias_mode == 0 ? "none" : bias_mode == 1 ? "aligned" : "unaligned");
    check_close(g, what, got2, zref, rows * out, gpu_tol(g));
    free(z);
    free(zref);
    free(got2);
    sd_backend_free(g, gz);
    sd_backend_free(g, gy2);

    free(x);
    free(w);
    free(b);
    free(ref);
    free(got);
    sd_backend_free(g, gx);
    sd_backend_free(g, gw);
    sd_backend_free(g, gy);
    if (gb)
        sd_backend_free(g, gb);
}

static void test_linear_backward(const sd_backend *g, int64_t rows, int in, int out,
                                 int accumulate, int with_dx, int with_db)
{
    float *x = hrand_for(g, rows * in, 1.0f);
    float *w = hrand_for(g, (int64_t)out * in, 1.0f / sqrtf((float)in));
    float *dy = hrand_for(g, rows * out, 1.0f);
    float *dx0 = hrand_for(g, rows * in, 1.0f); /* preload of dx (stored in the dtype) */
    float *dw0 = hrand(out * (int64_t)in, 1.0f, 0.0f), *db0 = hrand(out, 1.0f, 0.0f); /* fp32 */

    float *dx_ref = hcopy(dx0, rows * in), *dw_ref = hcopy(dw0, (int64_t)out * in);
    float *db_ref = hcopy(db0, out);
    sd_scratch hs = hscratch(sd_linear_backward_scratch_bytes(cpu, rows, in, out));
    sd_linear_backward(cpu, rows, in, out, x, w, dy, with_dx ? dx_ref : NULL, accumulate, dw_ref,
                       with_db ? db_ref : NULL, hs);
    free(hs.ptr);

    void *gx = dput(g, x, rows * in), *gw = dput(g, w, (int64_t)out * in);
    void *gdy = dput(g, dy, rows * out);
    void *gdx = accumulate ? dput(g, dx0, rows * in) : dnan(g, rows * in);
    float *gdw = dput32(g, dw0, (int64_t)out * in), *gdb = dput32(g, db0, out);
    sd_scratch ws = dscratch(g, sd_linear_backward_scratch_bytes(g, rows, in, out));
    sd_linear_backward(g, rows, in, out, gx, gw, gdy, with_dx ? gdx : NULL, accumulate, gdw,
                       with_db ? gdb : NULL, ws);
    float *dx = dget(g, gdx, rows * in), *dw = dget32(g, gdw, (int64_t)out * in);
    float *db = dget32(g, gdb, out);

    /* the same call again on the same preloads gives the same bits */
    if (accumulate)
        sd_upload_f32(g, gdx, dx0, rows * in);
    sd_upload(g, gdw, dw0, (size_t)out * in * sizeof(float));
    sd_upload(g, gdb, db0, (size_t)out * sizeof(float));
    sd_linear_backward(g, rows, in, out, gx, gw, gdy, with_dx ? gdx : NULL, accumulate, gdw,
                       with_db ? gdb : NULL, ws);
    float *dx2 = dget(g, gdx, rows * in), *dw2 = dget32(g, gdw, (int64_t)out * in);
    float *db2 = dget32(g, gdb, out);
    tap_ok((!with_dx || same_bits(dx, dx2, rows * in)) && same_bits(dw, dw2, (int64_t)out * in) &&
               same_bits(db, db2, out),
           "linear backward repeats bit for bit (rows %lld in %d out %d) [%s]", (long long)rows,
           in, out, sd_dtype_name(g->dtype));
    free(dx2);
    free(dw2);
    free(db2);

    char what[160];
    const char *tag = accumulate ? "accumulate" : "write";
    if (with_dx) {
        snprintf(what, sizeof what, "linear backward dx (%s) rows %lld in %d out %d", tag,
                 (long long)rows, in, out);
        check_close(g, what, dx, dx_ref, rows * in, gpu_tol(g));
    }
    snprintf(what, sizeof what, "linear backward dw += (rows %lld in %d out %d%s)",
             (long long)rows, in, out, with_dx ? "" : ", no dx");
    check_close(g, what, dw, dw_ref, (int64_t)out * in, gpu_tol(g));
    if (with_db) {
        snprintf(what, sizeof what, "linear backward db += (rows %lld out %d)", (long long)rows,
                 out);
        check_close(g, what, db, db_ref, out, gpu_tol(g));
    } else {
        tap_ok(same_bits(db, db0, out), "linear backward with db NULL leaves the db buffer alone [%s]",
               sd_dtype_name(g->dtype));
    }

    free(x);
    free(w);
    free(dy);
    free(dx0);
    free(dw0);
    free(db0);
    free(dx_ref);
    free(dw_ref);
    free(db_ref);
    free(dx);
    free(dw);
    free(db);
    sd_backend_free(g, gx);
    sd_backend_free(g, gw);
    sd_backend_free(g, gdy);
    sd_backend_free(g, gdx);
    sd_backend_free(g, gdw);
    sd_backend_free(g, gdb);
    if (ws.ptr)
        sd_backend_free(g, ws.ptr);
}

/* ---- attention -------------------------------------------------------------------------- */

typedef struct attn_case {
    const char *name;
    int batch, heads, head_dim, t_q, t_kv, causal;
    int fused;      /* q, k, v (and dq, dk, dv) in one [batch, t, 3C] buffer, ld = 3C */
    int accumulate; /* backward: add onto random preloads */
    int null_grad;  /* backward: 0 none, 1 dq, 2 dk, 3 dv passed as NULL */
} attn_case;

/* Host tensors of one case: q, k, v in `qkv` (fused) or three buffers; everything sized by the
 * row strides of the descriptor. */
typedef struct attn_host {
    sd_attention_desc d;
    int64_t nq, nk, nv, no; /* elements of the q, k, v, o buffers (fused: nq = whole buffer) */
    int off_k, off_v;       /* fused: column offsets of k and v in the q buffer */
} attn_host;

static attn_host attn_layout(const attn_case *c)
{
    attn_host a;
    a.d = sd_attention_make(c->batch, c->heads, c->head_dim, c->t_q, c->t_kv, c->causal);
    const int C = c->heads * c->head_dim;
    if (c->fused) {
        a.d.ld_q = a.d.ld_k = a.d.ld_v = 3 * C;
        a.nq = (int64_t)c->batch * c->t_q * 3 * C;
        a.nk = a.nv = 0;
        a.off_k = C;
        a.off_v = 2 * C;
    } else {
        a.nq = (int64_t)c->batch * c->t_q * C;
        a.nk = a.nv = (int64_t)c->batch * c->t_kv * C;
        a.off_k = a.off_v = 0;
    }
    a.no = (int64_t)c->batch * c->t_q * C;
    return a;
}

/* The (sub)tensor of q, k or v (which = 0, 1, 2) made contiguous, from a host buffer laid out
 * as the case says. */
static float *attn_part(const attn_case *c, const attn_host *a, int which, const float *buf)
{
    const int C = c->heads * c->head_dim;
    const int64_t rows = (int64_t)c->batch * (which == 0 ? c->t_q : c->t_kv);
    if (!c->fused)
        return gather(buf, rows, C, 0, C);
    return gather(buf, rows, 3 * C, which == 0 ? 0 : which == 1 ? a->off_k : a->off_v, C);
}

static void test_attention(const sd_backend *g, const attn_case *c)
{
    attn_host a = attn_layout(c);
    const sd_attention_desc *d = &a.d;
    const int C = c->heads * c->head_dim;
    const int64_t nlse = (int64_t)c->batch * c->heads * c->t_q;
    const double tol = gpu_tol(g);
    char what[200];

    /* inputs: q buffer (fused: all three), k and v buffers otherwise */
    float *hq = hrand_for(g, a.nq, 1.0f);
    float *hk = a.nk ? hrand_for(g, a.nk, 1.0f) : NULL;
    float *hv = a.nv ? hrand_for(g, a.nv, 1.0f) : NULL;
    const float *q = hq, *k = c->fused ? hq + a.off_k : hk, *v = c->fused ? hq + a.off_v : hv;

    /* forward on the CPU */
    float *o_ref = (float *)malloc((size_t)a.no * sizeof(float));
    float *lse_ref = (float *)malloc((size_t)nlse * sizeof(float));
    sd_scratch hs = hscratch(sd_attention_forward_scratch_bytes(cpu, d));
    sd_attention_forward(cpu, d, q, k, v, o_ref, lse_ref, hs);
    free(hs.ptr);

    /* forward on the GPU, twice (same bits) */
    void *gq = dput(g, hq, a.nq);
    void *gkb = a.nk ? dput(g, hk, a.nk) : NULL, *gvb = a.nv ? dput(g, hv, a.nv) : NULL;
    const size_t es = sd_dtype_size(g->dtype);
    const void *gk = c->fused ? (const char *)gq + (size_t)a.off_k * es : gkb;
    const void *gv = c->fused ? (const char *)gq + (size_t)a.off_v * es : gvb;
    void *go = dnan(g, a.no);
    float *glse = dput32(g, NULL, nlse);
    sd_scratch ws = dscratch(g, sd_attention_forward_scratch_bytes(g, d));
    sd_attention_forward(g, d, gq, gk, gv, go, glse, ws);
    float *o1 = dget(g, go, a.no), *lse1 = dget32(g, glse, nlse);
    snprintf(what, sizeof what, "attention forward o, %s", c->name);
    check_close(g, what, o1, o_ref, a.no, tol);
    snprintf(what, sizeof what, "attention forward lse, %s", c->name);
    check_close(g, what, lse1, lse_ref, nlse, tol);
    sd_attention_forward(g, d, gq, gk, gv, go, NULL, ws); /* lse optional */
    float *o2 = dget(g, go, a.no);
    tap_ok(same_bits(o1, o2, a.no), "attention forward repeats bit for bit, %s [%s]", c->name,
           sd_dtype_name(g->dtype));
    if (ws.ptr)
        sd_backend_free(g, ws.ptr);

    /* backward: o as stored by the backend (rounded) and the CPU's lse go to both */
    float *o_in = hcopy(o_ref, a.no);
    hround(g, o_in, a.no);
    float *dout = hrand_for(g, a.no, 1.0f);
    /* gradient buffers: same layout as q (fused: one buffer) and k, v */
    float *pq = hrand_for(g, a.nq, 1.0f);
    float *pk = a.nk ? hrand_for(g, a.nk, 1.0f) : NULL;
    float *pv = a.nv ? hrand_for(g, a.nv, 1.0f) : NULL;
    float *rq = hcopy(pq, a.nq);
    float *rk = a.nk ? hcopy(pk, a.nk) : NULL, *rv = a.nv ? hcopy(pv, a.nv) : NULL;
    float *rdq = rq, *rdk = c->fused ? rq + a.off_k : rk, *rdv = c->fused ? rq + a.off_v : rv;
    hs = hscratch(sd_attention_backward_scratch_bytes(cpu, d));
    sd_attention_backward(cpu, d, q, k, v, o_in, lse_ref, dout, c->null_grad == 1 ? NULL : rdq,
                          c->null_grad == 2 ? NULL : rdk, c->null_grad == 3 ? NULL : rdv,
                          c->accumulate, hs);
    free(hs.ptr);

    void *gdo = dput(g, dout, a.no), *goi = dput(g, o_in, a.no);
    float *glse_ref = dput32(g, lse_ref, nlse);
    ws = dscratch(g, sd_attention_backward_scratch_bytes(g, d));
    float *got[2][3];
    for (int run = 0; run < 2; run++) {
        /* preloads (accumulate) or NaN (write) */
        void *gdq = c->accumulate ? dput(g, pq, a.nq) : dnan(g, a.nq);
        void *gdkb = a.nk ? (c->accumulate ? dput(g, pk, a.nk) : dnan(g, a.nk)) : NULL;
        void *gdvb = a.nv ? (c->accumulate ? dput(g, pv, a.nv) : dnan(g, a.nv)) : NULL;
        void *gdk = c->fused ? (char *)gdq + (size_t)a.off_k * es : gdkb;
        void *gdv = c->fused ? (char *)gdq + (size_t)a.off_v * es : gdvb;
        sd_attention_backward(g, d, gq, gk, gv, goi, glse_ref, gdo, c->null_grad == 1 ? NULL : gdq,
                              c->null_grad == 2 ? NULL : gdk, c->null_grad == 3 ? NULL : gdv,
                              c->accumulate, ws);
        float *hdq = dget(g, gdq, a.nq);
        float *hdk = a.nk ? dget(g, gdkb, a.nk) : NULL, *hdv = a.nv ? dget(g, gdvb, a.nv) : NULL;
        for (int which = 0; which < 3; which++) {
            const float *buf = c->fused || which == 0 ? hdq : which == 1 ? hdk : hdv;
            got[run][which] = attn_part(c, &a, which, buf);
        }
        free(hdq);
        free(hdk);
        free(hdv);
        sd_backend_free(g, gdq);
        if (gdkb)
            sd_backend_free(g, gdkb);
        if (gdvb)
            sd_backend_free(g, gdvb);
    }
    static const char *names[3] = {"dq", "dk", "dv"};
    for (int which = 0; which < 3; which++) {
        if (c->null_grad == which + 1)
            continue;
        const float *refbuf = c->fused || which == 0 ? rq : which == 1 ? rk : rv;
        float *ref = attn_part(c, &a, which, refbuf);
        const int64_t n = (int64_t)c->batch * (which == 0 ? c->t_q : c->t_kv) * C;
        snprintf(what, sizeof what, "attention backward %s (%s), %s", names[which],
                 c->accumulate ? "accumulate" : "write", c->name);
        check_close(g, what, got[0][which], ref, n, tol);
        tap_ok(same_bits(got[0][which], got[1][which], n),
               "attention backward %s repeats bit for bit, %s [%s]", names[which], c->name,
               sd_dtype_name(g->dtype));
        free(ref);
    }
    for (int run = 0; run < 2; run++)
        for (int which = 0; which < 3; which++)
            free(got[run][which]);

    free(hq);
    free(hk);
    free(hv);
    free(o_ref);
    free(lse_ref);
    free(o1);
    free(o2);
    free(lse1);
    free(o_in);
    free(dout);
    free(pq);
    free(pk);
    free(pv);
    free(rq);
    free(rk);
    free(rv);
    sd_backend_free(g, gq);
    if (gkb)
        sd_backend_free(g, gkb);
    if (gvb)
        sd_backend_free(g, gvb);
    sd_backend_free(g, go);
    sd_backend_free(g, glse);
    sd_backend_free(g, gdo);
    sd_backend_free(g, goi);
    sd_backend_free(g, glse_ref);
    if (ws.ptr)
        sd_backend_free(g, ws.ptr);
}

int main(void)
{
    sd_backend *gpu[2];
    int n = gpu_backends(gpu);
    gpu_seed_from_env();
    cpu = sd_backend_cpu();

    static const attn_case cases[] = {
        {"self-attention b2 h2 d8 t17", 2, 2, 8, 17, 17, 0, 0, 0, 0},
        {"cross-attention b2 h5 d64 tq33 tkv7, accumulate", 2, 5, 64, 33, 7, 0, 0, 1, 0},
        {"causal b2 h4 d16 t13, dk NULL", 2, 4, 16, 13, 13, 1, 0, 0, 2},
        {"fused QKV b2 h2 d16 t9 ld 3C", 2, 2, 16, 9, 9, 0, 1, 0, 0},
        {"fused QKV causal b1 h3 d8 t11, accumulate, dv NULL", 1, 3, 8, 11, 11, 1, 1, 1, 3},
        {"VAE mid-block b1 h1 d512 t64, dq NULL", 1, 1, 512, 64, 64, 0, 0, 0, 1},
        /* one head, several batch elements: the forward folds the batch into one GEMM */
        {"VAE mid-block b3 h1 d512 t40", 3, 1, 512, 40, 40, 0, 0, 0, 0},
        {"one head b4 h1 d16 t9 fused QKV", 4, 1, 16, 9, 9, 0, 1, 0, 0},
        {"one head causal b3 h1 d8 t7", 3, 1, 8, 7, 7, 1, 0, 0, 0},
    };

    for (int i = 0; i < n; i++) {
        const sd_backend *g = gpu[i];
        test_linear_forward(g, 37, 19, 23, 0);
        test_linear_forward(g, 37, 19, 23, 1);
        test_linear_forward(g, 37, 19, 23, 2);
        test_linear_forward(g, 256, 320, 1280, 1);
        test_linear_forward(g, 256, 320, 1280, 0);
        test_linear_forward(g, 5, 1, 3, 1);
        test_linear_forward(g, 5, 1, 3, 2);

        test_linear_backward(g, 37, 19, 23, 0, 1, 1);
        test_linear_backward(g, 37, 19, 23, 1, 1, 1);
        test_linear_backward(g, 256, 320, 1280, 0, 1, 1);
        test_linear_backward(g, 256, 320, 1280, 1, 1, 1);
        test_linear_backward(g, 5, 1, 3, 1, 1, 1);
        test_linear_backward(g, 37, 19, 23, 0, 0, 1); /* dx NULL */
        test_linear_backward(g, 37, 19, 23, 1, 1, 0); /* db NULL */

        for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++)
            test_attention(g, &cases[j]);
    }
    for (int i = 0; i < n; i++)
        sd_backend_cuda_destroy(gpu[i]);
    return tap_done();
}
