/* Tests of src/train/optim.c: AdamW + clipping + LambdaLR + EMA against PyTorch/diffusers goldens
 * (tests/data/optim, written by tests/reference/make_optim_goldens.py), range splitting,
 * thread-count independence, schedules at key steps, EMA by hand, the non-finite check.
 * Usage: test_optim (data from $srcdir/tests/data/optim). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/optim.h"
#include "sdtrain/safetensors.h"
#include "tap.h"

#define TOL 1e-6
#define ALIGN 16 /* floats: tensors at 64-byte aligned offsets, zeros between them */
#define MAXT 8

static char data_dir[4096];

typedef struct layout {
    int nt;
    size_t off[MAXT], len[MAXT], total;
} layout;

/* Largest |a-b|/|b| over n values (|b| below 1e-30 counts as absolute error). */
static double max_rel(const float *a, const float *b, size_t n)
{
    if (n == 0)
        return 0.0;
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        double s = fabs((double)b[i]);
        double r = s > 1e-30 ? d / s : d;
        if (!(r <= w))
            w = r;
    }
    return w;
}

static const char *meta(const sd_st_file *f, const char *key)
{
    const char *v = sd_st_metadata(f, key);
    if (!v) {
        fprintf(stderr, "golden lacks metadata '%s'\n", key);
        exit(1);
    }
    return v;
}

static void read_flat(const sd_st_file *f, const layout *L, const char *prefix, float *dst)
{
    char name[128];
    sd_err err;
    memset(dst, 0, L->total * sizeof *dst);
    for (int t = 0; t < L->nt; t++) {
        snprintf(name, sizeof name, "%s.%d", prefix, t);
        if (sd_st_read_f32(f, name, dst + L->off[t], L->len[t], &err)) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
    }
}

static double read_scalar(const sd_st_file *f, const char *name)
{
    const sd_st_tensor *t = sd_st_find(f, name);
    if (!t || t->numel != 1) {
        fprintf(stderr, "golden lacks scalar '%s'\n", name);
        exit(1);
    }
    if (t->dtype == SD_ST_F64) {
        double d;
        sd_st_tensor_read_raw(t, &d, sizeof d, NULL);
        return d;
    }
    float x;
    sd_st_tensor_read_f32(t, &x, 1, NULL);
    return x;
}

static int padding_zero(const layout *L, const float *x)
{
    size_t pos = 0;
    for (int t = 0; t <= L->nt; t++) {
        size_t stop = t < L->nt ? L->off[t] : L->total;
        for (; pos < stop; pos++)
            if (x[pos] != 0.0f)
                return 0;
        if (t < L->nt)
            pos = L->off[t] + L->len[t];
    }
    return 1;
}

typedef struct state {
    float *p, *g, *m, *v, *e;
} state;

static void state_alloc(state *s, size_t n)
{
    s->p = calloc(n, sizeof(float));
    s->g = calloc(n, sizeof(float));
    s->m = calloc(n, sizeof(float));
    s->v = calloc(n, sizeof(float));
    s->e = calloc(n, sizeof(float));
}

static void state_free(state *s)
{
    free(s->p);
    free(s->g);
    free(s->m);
    free(s->v);
    free(s->e);
}

/* Largest over tensors of max|a-b| / max|b| (normwise relative error). */
static double max_normwise(const layout *L, const float *a, const float *b)
{
    double w = 0.0;
    for (int t = 0; t < L->nt; t++) {
        double d = 0.0, s = 0.0;
        for (size_t i = L->off[t]; i < L->off[t] + L->len[t]; i++) {
            double e = fabs((double)a[i] - (double)b[i]);
            if (!(e <= d))
                d = e;
            if (fabs((double)b[i]) > s)
                s = fabs((double)b[i]);
        }
        double r = s > 0 ? d / s : d;
        if (!(r <= w))
            w = r;
    }
    return w;
}

/* own_norm = 0: the clipping coefficient comes from torch's total norm (stored in the golden),
 * so AdamW/EMA are compared element by element. own_norm = 1: end to end, our sum of squares
 * gives the norm; the fp32 norm may then differ from torch's by an ulp, which moves the
 * coefficient by an ulp, and elements of m that are small through cancellation carry that as a
 * larger relative error, so that run asserts the normwise error (and reports both). */
static void golden_case(const char *name, int own_norm)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/adamw_%s.safetensors", data_dir, name);
    sd_st_file f;
    sd_err err;
    if (sd_st_open(path, &f, &err)) {
        tap_ok(0, "%s: open golden: %s", name, err.msg);
        return;
    }
    const double base_lr = strtod(meta(&f, "lr"), NULL);
    const int64_t warmup = strtoll(meta(&f, "warmup"), NULL, 10);
    const int64_t max_steps = strtoll(meta(&f, "max_steps"), NULL, 10);
    const double max_norm = strtod(meta(&f, "max_norm"), NULL);
    const double ema_decay = strtod(meta(&f, "ema_decay"), NULL);
    const int64_t ema_start = strtoll(meta(&f, "ema_start"), NULL, 10);
    const int steps = atoi(meta(&f, "steps"));
    sd_adamw_hparams h = {
        .beta1 = strtod(meta(&f, "beta1"), NULL),
        .beta2 = strtod(meta(&f, "beta2"), NULL),
        .eps = strtod(meta(&f, "eps"), NULL),
        .weight_decay = strtod(meta(&f, "wd"), NULL),
    };
    sd_lr_schedule sched;
    if (sd_lr_schedule_from_name(meta(&f, "schedule"), &sched, &err)) {
        tap_ok(0, "%s: %s", name, err.msg);
        sd_st_close(&f);
        return;
    }

    layout L = {.nt = atoi(meta(&f, "ntensors"))};
    size_t pos = 0;
    for (int t = 0; t < L.nt; t++) {
        char tn[32];
        snprintf(tn, sizeof tn, "p0.%d", t);
        const sd_st_tensor *tt = sd_st_find(&f, tn);
        L.off[t] = pos;
        L.len[t] = (size_t)tt->numel;
        pos = (pos + L.len[t] + ALIGN - 1) / ALIGN * ALIGN;
    }
    L.total = pos;

    /* Three copies of the state: whole range, split at an unaligned point, split in three. */
    state full, split, three;
    state_alloc(&full, L.total);
    state_alloc(&split, L.total);
    state_alloc(&three, L.total);
    read_flat(&f, &L, "p0", full.p);
    memcpy(full.e, full.p, L.total * sizeof(float)); /* EMAModel starts from a clone */
    memcpy(split.p, full.p, L.total * sizeof(float));
    memcpy(split.e, full.p, L.total * sizeof(float));
    memcpy(three.p, full.p, L.total * sizeof(float));
    memcpy(three.e, full.p, L.total * sizeof(float));
    const size_t cut = 19, c1 = 5, c2 = L.total - 3;

    float *want = malloc(L.total * sizeof(float));
    double worst[4] = {0, 0, 0, 0}; /* p, m, v, ema */
    double worst_norm = 0.0, worst_lr = 0.0, worst_nw[4] = {0, 0, 0, 0};
    int same_split = 1, pad_ok = 1;
    for (int s = 1; s <= steps; s++) {
        char pre[32];
        snprintf(pre, sizeof pre, "g.%d", s);
        read_flat(&f, &L, pre, full.g);
        if (sd_any_nonfinite(full.g, L.total))
            tap_ok(0, "%s: step %d gradients finite", name, s);
        if (max_norm > 0) {
            snprintf(pre, sizeof pre, "norm.%d", s);
            const double want_norm = read_scalar(&f, pre);
            const double ss = sd_sumsq(full.g, L.total);
            const double e = fabs(sqrt(ss) - want_norm) / want_norm;
            if (e > worst_norm)
                worst_norm = e;
            sd_scale(full.g, L.total,
                     sd_clip_coef(own_norm ? ss : want_norm * want_norm, max_norm));
        }
        memcpy(split.g, full.g, L.total * sizeof(float));
        memcpy(three.g, full.g, L.total * sizeof(float));
        snprintf(pre, sizeof pre, "lr.%d", s);
        const double lr = sd_lr_at(base_lr, sched, s - 1, warmup, max_steps);
        const double want_lr = read_scalar(&f, pre);
        const double elr = want_lr != 0 ? fabs(lr - want_lr) / want_lr : fabs(lr);
        if (elr > worst_lr)
            worst_lr = elr;

        sd_adamw_update(&h, lr, s, full.p, full.g, full.m, full.v, L.total);
        sd_adamw_update(&h, lr, s, split.p, split.g, split.m, split.v, cut);
        sd_adamw_update(&h, lr, s, split.p + cut, split.g + cut, split.m + cut, split.v + cut,
                        L.total - cut);
        const size_t b[4] = {0, c1, c2, L.total};
        for (int r = 0; r < 3; r++)
            sd_adamw_update(&h, lr, s, three.p + b[r], three.g + b[r], three.m + b[r],
                            three.v + b[r], b[r + 1] - b[r]);
        if (ema_decay > 0) {
            const double d = sd_ema_decay(s, ema_decay, ema_start);
            sd_ema_update(full.e, full.p, L.total, d);
            sd_ema_update(split.e, split.p, cut, d);
            sd_ema_update(split.e + cut, split.p + cut, L.total - cut, d);
            for (int r = 0; r < 3; r++)
                sd_ema_update(three.e + b[r], three.p + b[r], b[r + 1] - b[r], d);
        }

        const char *what[4] = {"p", "m", "v", "e"};
        float *got[4] = {full.p, full.m, full.v, full.e};
        for (int q = 0; q < (ema_decay > 0 ? 4 : 3); q++) {
            snprintf(pre, sizeof pre, "%s.%d", what[q], s);
            read_flat(&f, &L, pre, want);
            const double e = max_rel(got[q], want, L.total);
            if (e > worst[q])
                worst[q] = e;
            const double nw = max_normwise(&L, got[q], want);
            if (nw > worst_nw[q])
                worst_nw[q] = nw;
            pad_ok &= padding_zero(&L, got[q]);
        }
        size_t nb = L.total * sizeof(float);
        same_split &= !memcmp(full.p, split.p, nb) && !memcmp(full.m, split.m, nb) &&
                      !memcmp(full.v, split.v, nb) && !memcmp(full.e, split.e, nb) &&
                      !memcmp(full.p, three.p, nb) && !memcmp(full.m, three.m, nb) &&
                      !memcmp(full.v, three.v, nb) && !memcmp(full.e, three.e, nb);
    }
    tap_diag("%s (%s norm): max relative error vs torch over %d steps: p %.3g, m %.3g, v %.3g, "
             "ema %.3g, norm %.3g, lr %.3g; normwise: p %.3g, m %.3g, v %.3g, ema %.3g",
             name, own_norm ? "own" : "torch's", steps, worst[0], worst[1], worst[2], worst[3],
             worst_norm, worst_lr, worst_nw[0], worst_nw[1], worst_nw[2], worst_nw[3]);
    char label[96];
    if (own_norm) {
        for (int q = 0; q < 4; q++)
            worst[q] = worst_nw[q];
        snprintf(label, sizeof label, "%s (end to end, normwise)", name);
        name = label;
    }
    tap_ok(worst_lr <= 1e-15, "%s: learning rates match LambdaLR/diffusers", name);
    tap_ok(max_norm <= 0 || worst_norm <= TOL, "%s: total gradient norm matches clip_grad_norm_",
           name);
    tap_ok(worst[0] <= TOL, "%s: parameters match torch AdamW (rel %.3g)", name, worst[0]);
    tap_ok(worst[1] <= TOL && worst[2] <= TOL, "%s: moments match torch AdamW (rel %.3g, %.3g)",
           name, worst[1], worst[2]);
    if (ema_decay > 0)
        tap_ok(worst[3] <= TOL, "%s: EMA matches diffusers EMAModel (rel %.3g)", name, worst[3]);
    tap_ok(pad_ok, "%s: padding between tensors stays zero", name);
    tap_ok(same_split, "%s: updating split ranges is bit-identical to the whole range", name);
    free(want);
    state_free(&full);
    state_free(&split);
    state_free(&three);
    sd_st_close(&f);
}

static void schedules_golden(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/schedules.safetensors", data_dir);
    sd_st_file f;
    sd_err err;
    if (sd_st_open(path, &f, &err)) {
        tap_ok(0, "schedules: open golden: %s", err.msg);
        return;
    }
    const int64_t warmup = strtoll(meta(&f, "warmup"), NULL, 10);
    const int64_t T = strtoll(meta(&f, "max_steps"), NULL, 10);
    const int K = atoi(meta(&f, "count"));
    for (int si = 0; si < 3; si++) {
        sd_lr_schedule s = (sd_lr_schedule)si;
        char name[64];
        snprintf(name, sizeof name, "sched.%s", sd_lr_schedule_name(s));
        const sd_st_tensor *t = sd_st_find(&f, name);
        double want[64];
        if (!t || t->numel != K || K > 64 ||
            sd_st_tensor_read_raw(t, want, (size_t)K * sizeof(double), &err)) {
            tap_ok(0, "schedules: read %s", name);
            continue;
        }
        int ok = 1;
        for (int k = 0; k < K; k++) {
            double got = sd_lr_factor(s, k, warmup, T);
            /* diffusers' cosine rises again after T; ours stays 0 */
            double w = (s != SD_LR_CONSTANT && k > T) ? 0.0 : want[k];
            if (got != w) {
                tap_diag("%s k=%d: got %.17g want %.17g", name, k, got, w);
                ok = 0;
            }
        }
        tap_ok(ok, "schedule %s matches diffusers bit for bit for k = 0..%d", name, K - 1);
    }
    sd_st_close(&f);
}

/* lr_more.safetensors (make_lr_goldens.py): cosine_with_restarts and polynomial, the
 * optimizer's learning rate after k = 0 .. T + 5 steps, bit for bit */
static void schedules_more_golden(void)
{
    static const char *cases[] = {"restarts3", "restarts1", "poly2", "poly05"};
    char path[4200];
    snprintf(path, sizeof path, "%s/lr_more.safetensors", data_dir);
    sd_st_file f;
    sd_err err;
    if (sd_st_open(path, &f, &err)) {
        tap_ok(0, "schedules: open golden: %s", err.msg);
        return;
    }
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char key[64];
        sd_lr_params p;
        snprintf(key, sizeof key, "%s.schedule", cases[c]);
        if (sd_lr_schedule_from_name(meta(&f, key), &p.schedule, &err)) {
            tap_ok(0, "%s: %s", cases[c], err.msg);
            continue;
        }
        snprintf(key, sizeof key, "%s.warmup", cases[c]);
        p.warmup = strtoll(meta(&f, key), NULL, 10);
        snprintf(key, sizeof key, "%s.steps", cases[c]);
        p.max_steps = strtoll(meta(&f, key), NULL, 10);
        snprintf(key, sizeof key, "%s.cycles", cases[c]);
        p.num_cycles = strtoll(meta(&f, key), NULL, 10);
        snprintf(key, sizeof key, "%s.power", cases[c]);
        p.power = strtod(meta(&f, key), NULL);
        snprintf(key, sizeof key, "%s.lr", cases[c]);
        p.base_lr = strtod(meta(&f, key), NULL);
        const int K = (int)p.max_steps + 6;
        double want[64];
        snprintf(key, sizeof key, "lr.%s", cases[c]);
        const sd_st_tensor *t = sd_st_find(&f, key);
        if (!t || t->numel != K || K > 64 ||
            sd_st_tensor_read_raw(t, want, (size_t)K * sizeof(double), &err)) {
            tap_ok(0, "schedules: read %s", key);
            continue;
        }
        int same = 0;
        for (int k = 0; k < K; k++) {
            const double got = p.base_lr * sd_lr_factor_params(&p, k);
            same += got == want[k];
            if (got != want[k])
                tap_diag("%s k=%d: got %.17g want %.17g", cases[c], k, got, want[k]);
        }
        tap_ok(same == K, "schedule %s (%s, %lld cycles, power %g, warmup %lld of %lld): the "
               "learning rate of k = 0..%d equals diffusers' bit for bit", cases[c],
               sd_lr_schedule_name(p.schedule), (long long)p.num_cycles, p.power,
               (long long)p.warmup, (long long)p.max_steps, K - 1);
    }
    sd_st_close(&f);
}

static void schedules_key_steps(void)
{
    tap_ok(sd_lr_factor(SD_LR_CONSTANT, 0, 0, 100) == 1.0, "no warmup: first update uses lr");
    tap_ok(sd_lr_factor(SD_LR_LINEAR, 0, 0, 100) == 1.0, "linear, no warmup: factor 1 at k=0");
    tap_ok(sd_lr_factor(SD_LR_COSINE, 0, 10, 100) == 0.0, "warmup: first update uses lr 0");
    tap_ok(sd_lr_factor(SD_LR_COSINE, 5, 10, 100) == 0.5, "warmup: k=5 of 10 gives 0.5");
    tap_ok(sd_lr_factor(SD_LR_LINEAR, 10, 10, 100) == 1.0, "linear: 1 at the end of warmup");
    tap_ok(sd_lr_factor(SD_LR_LINEAR, 55, 10, 100) == 0.5, "linear: 0.5 halfway");
    tap_ok(sd_lr_factor(SD_LR_LINEAR, 100, 10, 100) == 0.0 &&
               sd_lr_factor(SD_LR_LINEAR, 150, 10, 100) == 0.0,
           "linear: 0 at and after max_steps");
    tap_ok(fabs(sd_lr_factor(SD_LR_COSINE, 55, 10, 100) - 0.5) < 1e-15,
           "cosine: 0.5 halfway");
    tap_ok(sd_lr_factor(SD_LR_COSINE, 10, 10, 100) == 1.0 &&
               sd_lr_factor(SD_LR_COSINE, 100, 10, 100) == 0.0 &&
               sd_lr_factor(SD_LR_COSINE, 190, 10, 100) == 0.0,
           "cosine: 1 after warmup, 0 at and after max_steps");
    tap_ok(sd_lr_factor(SD_LR_CONSTANT, 1000000, 10, 100) == 1.0, "constant stays 1");
    tap_ok(sd_lr_at(1e-4, SD_LR_CONSTANT, 3, 4, 10) == 1e-4 * 0.75, "sd_lr_at = lr * factor");
    sd_lr_schedule s;
    sd_err err;
    tap_ok(!sd_lr_schedule_from_name("cosine", &s, &err) && s == SD_LR_COSINE &&
               !sd_lr_schedule_from_name("cosine_with_restarts", &s, &err) &&
               s == SD_LR_COSINE_RESTARTS && !sd_lr_schedule_from_name("polynomial", &s, &err) &&
               s == SD_LR_POLYNOMIAL && sd_lr_schedule_from_name("piecewise_constant", &s, &err) == -1,
           "sd_lr_schedule_from_name");
}

static void ema_by_hand(void)
{
    tap_ok(sd_ema_decay(1, 0.9999, 0) == 0.0, "EMA decay 0 at the first step");
    tap_ok(sd_ema_decay(2, 0.9999, 0) == 2.0 / 11.0, "EMA decay (1+1)/(10+1) at step 2");
    tap_ok(sd_ema_decay(101, 0.9999, 0) == 101.0 / 110.0, "EMA decay 101/110 at step 101");
    tap_ok(sd_ema_decay(1000000, 0.9999, 0) == 0.9999, "EMA decay capped at 0.9999");
    tap_ok(sd_ema_decay(6, 0.9999, 5) == 0.0 && sd_ema_decay(7, 0.9999, 5) == 2.0 / 11.0,
           "EMA start step delays the warm-up of the decay");
    float ema[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    const float p[4] = {0.0f, 2.0f, 0.5f, 1.0f};
    sd_ema_update(ema, p, 4, 0.75);
    tap_ok(ema[0] == 0.75f && ema[1] == -1.0f && ema[2] == 0.5f && ema[3] == 2.5f,
           "EMA update ema - (1-d)(ema - p) by hand");
    sd_ema_update(ema, p, 4, 0.0);
    tap_ok(ema[0] == 0.0f && ema[1] == 2.0f && ema[2] == 0.5f && ema[3] == 1.0f,
           "EMA with decay 0 copies the parameters");
}

static void adamw_by_hand(void)
{
    /* One step, k = 1, no decay: m = 0.1 g, v = 0.001 g², update = lr · g/(|g| + eps) */
    sd_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.0};
    float p[2] = {1.0f, -1.0f}, g[2] = {0.5f, -2.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    sd_adamw_update(&h, 0.1, 1, p, g, m, v, 2);
    tap_ok(fabsf(p[0] - 0.9f) < 1e-6f && fabsf(p[1] + 0.9f) < 1e-6f,
           "AdamW first step moves by lr·sign(g)");
    /* Weight decay alone (zero gradient, zero moments): p·(1 - lr·wd) */
    h.weight_decay = 0.5;
    float q[1] = {2.0f}, z[1] = {0}, mz[1] = {0}, vz[1] = {0};
    sd_adamw_update(&h, 0.1, 3, q, z, mz, vz, 1);
    tap_ok(q[0] == 1.9f, "AdamW decoupled weight decay multiplies by 1 - lr·wd");
}

/* The vector (AVX2 + FMA) and the scalar AdamW give the same bits, tails and both lerp forms
 * included (SDTRAIN_CPU_ISA=baseline selects the scalar code). */
static void adamw_isa_bits(void)
{
    const size_t n = 3 * 4096 + 13;
    const double beta1s[2] = {0.9, 0.2}; /* lerp from m (|1 - b1| < 0.5) and from g */
    for (int c = 0; c < 2; c++) {
        sd_adamw_hparams h = {.beta1 = beta1s[c], .beta2 = 0.999, .eps = 1e-8,
                              .weight_decay = c ? 0.0 : 0.01};
        float *st[2][4];
        uint32_t x = 12345u + (uint32_t)c;
        for (int r = 0; r < 2; r++)
            for (int a = 0; a < 4; a++)
                st[r][a] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            float vals[4];
            for (int a = 0; a < 4; a++) {
                x = x * 1664525u + 1013904223u;
                vals[a] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (a == 3 ? 0.01f : 2.0f);
            }
            vals[3] = vals[3] * vals[3]; /* v >= 0 */
            for (int r = 0; r < 2; r++)
                for (int a = 0; a < 4; a++)
                    st[r][a][i] = vals[a];
        }
        for (int k = 1; k <= 3; k++) {
            unsetenv("SDTRAIN_CPU_ISA");
            sd_adamw_update(&h, 1e-3, k, st[0][0], st[0][1], st[0][2], st[0][3], n);
            setenv("SDTRAIN_CPU_ISA", "baseline", 1);
            sd_adamw_update(&h, 1e-3, k, st[1][0], st[1][1], st[1][2], st[1][3], n);
        }
        unsetenv("SDTRAIN_CPU_ISA");
        tap_ok(!memcmp(st[0][0], st[1][0], n * sizeof(float)) &&
                   !memcmp(st[0][2], st[1][2], n * sizeof(float)) &&
                   !memcmp(st[0][3], st[1][3], n * sizeof(float)),
               "AdamW: vector and scalar code give the same p, m, v bits (beta1 %g, wd %g)",
               h.beta1, h.weight_decay);
        for (int r = 0; r < 2; r++)
            for (int a = 0; a < 4; a++)
                free(st[r][a]);
    }
}

static void clip_and_checks(void)
{
    tap_ok(fabs(sd_clip_coef(4.0, 1.0) - 1.0 / (2.0 + 1e-6)) < 1e-7 &&
               sd_clip_coef(4.0, 0.5) == (double)((1.0f / (2.0f + (float)1e-6)) * 0.5f),
           "clip coef max_norm/(norm + 1e-6), in fp32 as torch");
    tap_ok(sd_clip_coef(0.25, 1.0) == 1.0, "clip coef capped at 1");
    tap_ok(sd_clip_coef(1e6, 0.0) == 1.0, "clip off at max_norm 0");
    const size_t n = 3 * SD_SUMSQ_BLOCK + 17;
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0f;
    double blocks[4];
    tap_ok(sd_sumsq(x, n) == (double)n && sd_sumsq_blocks(x, n, blocks) == 4 &&
               blocks[3] == 17.0,
           "sum of squares and its blocks");
    tap_ok(!sd_any_nonfinite(x, n), "finite buffer passes");
    x[n - 1] = NAN;
    int nan_found = sd_any_nonfinite(x, n);
    x[n - 1] = 1.0f;
    x[SD_SUMSQ_BLOCK + 3] = INFINITY;
    int inf_found = sd_any_nonfinite(x, n);
    x[SD_SUMSQ_BLOCK + 3] = -INFINITY;
    int ninf_found = sd_any_nonfinite(x, n);
    tap_ok(nan_found && inf_found && ninf_found, "NaN, +Inf and -Inf are found");
    tap_ok(sd_any_nonfinite(x, 0) == 0, "empty range is finite");
    free(x);
}

/* xorshift, for reproducible random buffers */
static uint64_t rng_state = 88172645463325252ull;
static float urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void thread_independence(void)
{
#ifdef _OPENMP
    const size_t n = 300007;
    const int threads[3] = {1, 2, 5};
    state st[3];
    double ss[3];
    float *g0 = malloc(n * sizeof *g0), *p0 = malloc(n * sizeof *p0);
    for (size_t i = 0; i < n; i++) {
        p0[i] = urand();
        g0[i] = urand() * 0.1f;
    }
    const int saved = omp_get_max_threads();
    sd_adamw_hparams h = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
    for (int r = 0; r < 3; r++) {
        omp_set_num_threads(threads[r]);
        state_alloc(&st[r], n);
        memcpy(st[r].p, p0, n * sizeof(float));
        memcpy(st[r].e, p0, n * sizeof(float));
        for (int k = 1; k <= 3; k++) {
            memcpy(st[r].g, g0, n * sizeof(float));
            ss[r] = sd_sumsq(st[r].g, n);
            sd_scale(st[r].g, n, sd_clip_coef(ss[r], 1.0));
            sd_adamw_update(&h, 1e-3, k, st[r].p, st[r].g, st[r].m, st[r].v, n);
            sd_ema_update(st[r].e, st[r].p, n, sd_ema_decay(k + 5, 0.999, 0));
        }
    }
    omp_set_num_threads(saved);
    size_t nb = n * sizeof(float);
    int same = 1;
    for (int r = 1; r < 3; r++)
        same &= ss[r] == ss[0] && !memcmp(st[r].p, st[0].p, nb) &&
                !memcmp(st[r].m, st[0].m, nb) && !memcmp(st[r].v, st[0].v, nb) &&
                !memcmp(st[r].e, st[0].e, nb);
    tap_ok(same, "results are bit-identical with 1, 2 and 5 threads");
    for (int r = 0; r < 3; r++)
        state_free(&st[r]);
    free(g0);
    free(p0);
#else
    tap_ok(1, "# SKIP built without OpenMP");
#endif
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    snprintf(data_dir, sizeof data_dir, "%s/tests/data/optim", srcdir ? srcdir : ".");
    golden_case("linear", 0);
    golden_case("cosine", 0);
    golden_case("constant", 0);
    golden_case("linear", 1);
    golden_case("cosine", 1);
    schedules_golden();
    schedules_more_golden();
    schedules_key_steps();
    ema_by_hand();
    adamw_by_hand();
    adamw_isa_bits();
    clip_and_checks();
    thread_independence();
    return tap_done();
}
