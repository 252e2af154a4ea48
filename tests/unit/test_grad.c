/* TAP tests of sdtool grad (U-Net loss and parameter gradients) against PyTorch autograd goldens. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/check.h"
#include "sdtrain/commands.h"
#include "sdtrain/safetensors.h"
#include "tap.h"

/*
 * tests/data/grad/<case>/ holds batch.safetensors and expected.safetensors, written by
 * tests/reference/make_grad_goldens.py (torch 2.15.0, diffusers 0.42.1, CPU fp32): the loss
 * of diffusers' training objective and the autograd gradient of every U-Net parameter. For each
 * case sdtool grad runs through its command entry point and its output is compared by relative
 * error ||ours - ref|| / ||ref||: loss <= 1e-6, pred <= 1e-5, every gradient tensor <= 1e-4
 * (the tolerances; PyTorch itself moves gradients by up to ~1e-5 between kernel paths).
 * Then: the result does not depend on the thread count or on activation recomputation (same
 * bits), and every tensor of the reference is present with the same shape and nothing else.
 */
#define TOL_LOSS 1e-6
#define TOL_PRED 1e-5
#define TOL_GRAD 1e-4

static double rel_err(const float *a, const float *b, size_t n, double *ref_norm)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        r += (double)b[i] * b[i];
    }
    if (ref_norm)
        *ref_norm = sqrt(r);
    if (!(d == d))
        return INFINITY;
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static float *read_f32(const sd_st_tensor *t)
{
    sd_err err;
    float *x = sd_xmalloc((size_t)t->numel * sizeof *x + 1);
    SD_CHECK(sd_st_tensor_read_f32(t, x, (size_t)t->numel, &err) == 0, "%s", err.msg);
    return x;
}

static int run_grad(const char *snap, const char *batch, const char *out, int threads,
                    int recompute)
{
    char th[16];
    char *argv[12];
    int argc = 0;
    snprintf(th, sizeof th, "%d", threads);
    argv[argc++] = "grad";
    argv[argc++] = "--snapshot";
    argv[argc++] = (char *)snap;
    argv[argc++] = "--batch";
    argv[argc++] = (char *)batch;
    argv[argc++] = "--out";
    argv[argc++] = (char *)out;
    argv[argc++] = "--threads";
    argv[argc++] = th;
    if (recompute)
        argv[argc++] = "--recompute";
    argv[argc] = NULL;
    return sd_cmd_grad(argc, argv);
}

/* Same names, shapes and bytes. */
static int same_bits(const char *a, const char *b)
{
    sd_st_file fa, fb;
    sd_err err;
    int same = 1;
    SD_CHECK(sd_st_open(a, &fa, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_st_open(b, &fb, &err) == 0, "%s", err.msg);
    same = fa.n_tensors == fb.n_tensors;
    for (size_t i = 0; same && i < fa.n_tensors; i++) {
        const sd_st_tensor *x = &fa.tensors[i], *y = sd_st_find(&fb, x->name);
        same = y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
    }
    sd_st_close(&fa);
    sd_st_close(&fb);
    return same;
}

static void test_case(const char *srcdir, const char *name, const char *tmpdir)
{
    char snap[4096], batch[4096], expect[4096], out[4096], out2[4096];
    sd_st_file ex, got;
    sd_err err;
    int n_grads = 0, n_bad = 0, n_missing = 0, rc;
    double worst = 0;
    const char *worst_name = "";

    snprintf(snap, sizeof snap, "%s/tests/data/models/%s", srcdir, name);
    snprintf(batch, sizeof batch, "%s/tests/data/grad/%s/batch.safetensors", srcdir, name);
    snprintf(expect, sizeof expect, "%s/tests/data/grad/%s/expected.safetensors", srcdir, name);
    snprintf(out, sizeof out, "%s/%s.grad.safetensors", tmpdir, name);
    snprintf(out2, sizeof out2, "%s/%s.grad2.safetensors", tmpdir, name);

    rc = run_grad(snap, batch, out, 2, 0);
    if (!tap_ok(rc == 0, "%s: sdtool grad exits 0 (got %d)", name, rc))
        return;
    SD_CHECK(sd_st_open(expect, &ex, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_st_open(out, &got, &err) == 0, "%s", err.msg);

    for (size_t i = 0; i < ex.n_tensors; i++) {
        const sd_st_tensor *r = &ex.tensors[i], *o = sd_st_find(&got, r->name);
        int is_loss = !strcmp(r->name, "loss"), is_pred = !strcmp(r->name, "pred");
        float *a, *b;
        double e, norm;
        if (!strcmp(r->name, "noisy_latents") || !strcmp(r->name, "target"))
            continue;
        if (!o || o->ndim != r->ndim || memcmp(o->shape, r->shape, sizeof(int64_t) * r->ndim)) {
            if (n_missing++ < 5)
                tap_diag("%s: '%s' missing or shaped differently", name, r->name);
            continue;
        }
        a = read_f32(o);
        b = read_f32(r);
        e = rel_err(a, b, (size_t)r->numel, &norm);
        if (is_loss)
            tap_ok(e <= TOL_LOSS, "%s: loss %.9g vs %.9g, relative error %.2e <= %.0e", name,
                   a[0], b[0], e, TOL_LOSS);
        else if (is_pred)
            tap_ok(e <= TOL_PRED, "%s: pred relative error %.2e <= %.0e", name, e, TOL_PRED);
        else {
            n_grads++;
            if (!(e <= TOL_GRAD) && n_bad++ < 5)
                tap_diag("%s: grad '%s' relative error %.2e (|ref| %.3e)", name, r->name, e, norm);
            if (!(e <= worst)) {
                worst = e;
                worst_name = r->name;
            }
        }
        free(a);
        free(b);
    }
    tap_ok(n_missing == 0 && got.n_tensors == (size_t)n_grads + 2,
           "%s: %d gradient tensors, each present with the reference's shape, nothing extra "
           "(%zu written)", name, n_grads, got.n_tensors);
    tap_ok(n_bad == 0 && n_grads > 0,
           "%s: every gradient within %.0e (worst %.2e, %s)", name, TOL_GRAD, worst, worst_name);
    sd_st_close(&ex);
    sd_st_close(&got);

    rc = run_grad(snap, batch, out2, 1, 1);
    tap_ok(rc == 0 && same_bits(out, out2),
           "%s: 1 thread with recomputation gives the bits of 2 threads without", name);
    unlink(out);
    unlink(out2);
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    char tmpdir[] = "/tmp/sdtrain-test-grad-XXXXXX";
    static const char *const cases[] = {"tiny-sd2", "tiny-sd1", "odd-train"};
    if (!srcdir)
        srcdir = ".";
    SD_CHECK(mkdtemp(tmpdir) != NULL, "mkdtemp");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_case(srcdir, cases[i], tmpdir);
    rmdir(tmpdir);
    return tap_done();
}
