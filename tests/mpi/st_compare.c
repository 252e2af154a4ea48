/* st_compare [--prefix P] [--per-tensor] A B TOL: relative difference of two safetensors files
 * (same names and sizes), for the training equivalence tests and the GPU module tests. Exit 0
 * when the whole set's ||a - b|| / ||b|| is <= TOL (with --per-tensor: every tensor's), 1
 * otherwise, 2 on bad input; the worst single tensor is reported too (tensors that start at
 * zero, such as biases, differ more in relative terms after a few steps). With --prefix, tensor
 * NAME of A is compared with P + NAME of B, and B may hold other tensors too (a golden file's
 * inputs and activations, whose outputs are stored as "out.NAME"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/safetensors.h"

int main(int argc, char **argv)
{
    sd_st_file a, b;
    sd_err err;
    double tol, worst = 0, dall = 0, rall = 0;
    const char *worst_name = "";
    int bad = 0, per_tensor = 0;
    const char *prefix = NULL;
    while (argc > 1 && argv[1][0] == '-' && argv[1][1] == '-') {
        if (!strcmp(argv[1], "--per-tensor")) {
            per_tensor = 1;
            argv++;
            argc--;
        } else if (!strcmp(argv[1], "--prefix") && argc > 2) {
            prefix = argv[2];
            argv += 2;
            argc -= 2;
        } else {
            break;
        }
    }
    if (argc != 4) {
        fprintf(stderr, "usage: st_compare [--prefix P] [--per-tensor] A.safetensors "
                        "B.safetensors TOL\n");
        return 2;
    }
    tol = atof(argv[3]);
    if (sd_st_open(argv[1], &a, &err) || sd_st_open(argv[2], &b, &err)) {
        fprintf(stderr, "st_compare: %s\n", err.msg);
        return 2;
    }
    if (!prefix && a.n_tensors != b.n_tensors) {
        fprintf(stderr, "st_compare: %zu vs %zu tensors\n", a.n_tensors, b.n_tensors);
        return 1;
    }
    for (size_t i = 0; i < a.n_tensors; i++) {
        const sd_st_tensor *x = &a.tensors[i], *y;
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", x->name);
        y = sd_st_find(&b, name);
        float *p, *q;
        double d = 0, r = 0, e;
        if (!y || y->numel != x->numel) {
            fprintf(stderr, "st_compare: '%s' missing or of another size in %s\n", name,
                    argv[2]);
            return 1;
        }
        p = sd_xmalloc((size_t)x->numel * sizeof *p + 1);
        q = sd_xmalloc((size_t)x->numel * sizeof *q + 1);
        SD_CHECK(sd_st_tensor_read_f32(x, p, (size_t)x->numel, &err) == 0, "%s", err.msg);
        SD_CHECK(sd_st_tensor_read_f32(y, q, (size_t)y->numel, &err) == 0, "%s", err.msg);
        for (int64_t k = 0; k < x->numel; k++) {
            double t = (double)p[k] - q[k];
            d += t * t;
            r += (double)q[k] * q[k];
        }
        dall += d;
        rall += r;
        e = r > 0 ? sqrt(d / r) : sqrt(d);
        if (!(e <= tol))
            bad++; /* reported, not gating */
        if (!(e <= worst)) {
            worst = e;
            worst_name = x->name;
        }
        free(p);
        free(q);
    }
    {
        const double all = rall > 0 ? sqrt(dall / rall) : sqrt(dall);
        printf("st_compare: %zu tensors, overall relative difference %.3e (tolerance %.1e), "
               "worst tensor %.3e (%s), %d tensors above the tolerance\n", a.n_tensors, all, tol,
               worst, worst_name, bad);
        sd_st_close(&a);
        sd_st_close(&b);
        return (per_tensor ? bad == 0 : all <= tol) ? 0 : 1;
    }
}
