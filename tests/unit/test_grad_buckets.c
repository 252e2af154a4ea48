/* TAP tests of the gradient buckets (include/sdtrain/grad_buckets.h) and of the U-Net
 * backward's gradient-ready hook (sd_unet_trainer_set_ready_hook) that launches them.
 *
 * Buckets: for many buffer sizes, rank counts, alignments and bucket sizes, the buckets tile
 * the buffer from its end to its start without gap or overlap, each inside its owner's shard,
 * none longer than the limit, cut at aligned offsets, as few as the limit allows; a sequence of
 * ready calls launches exactly the buckets inside each announced range, in order, once.
 *
 * Hook: on the three small golden U-Nets, with and without recomputation, every range the
 * backward announces as final holds, at that moment, the bits the gradients have at the end of
 * the backward (a range announced too early would still change); the announcements fall, the
 * last is 0, and there is one per finished block. */
#include "sdtrain/grad_buckets.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/arena.h"
#include "sdtrain/check.h"
#include "sdtrain/collectives.h"
#include "sdtrain/snapshot.h"
#include "sdtrain/unet.h"
#include "sdtrain/weights.h"
#include "tap.h"

/* ---- buckets ------------------------------------------------------------------------------ */

typedef struct launch_log {
    const sd_grad_buckets *g;
    int n, order_ok;
} launch_log;

static void on_launch(void *user, const sd_grad_bucket *b)
{
    launch_log *l = user;
    /* launched in list order, each once */
    if (l->n >= l->g->count || b != &l->g->b[l->n])
        l->order_ok = 0;
    l->n++;
}

/* One plan: 1 if every property holds (diagnostics on the first failure). */
static int check_plan(size_t n, int P, size_t align, size_t max_floats)
{
    size_t bounds[65];
    sd_grad_buckets g;
    launch_log log = {&g, 0, 1};
    size_t expect = n, lim = max_floats / align * align, want = 0;
    int ok = 1;
    if (lim < align)
        lim = align;
    for (int r = 0; r <= P; r++) {
        size_t b, e;
        if (r == P) {
            bounds[r] = n;
            break;
        }
        sd_shard_range(n, P, r, align, &b, &e);
        bounds[r] = b;
        want += (e - b + lim - 1) / lim;
    }
    sd_grad_buckets_init(&g, bounds, P, max_floats, align, on_launch, &log);
    if (g.count != (int)want) {
        tap_diag("n %zu P %d align %zu max %zu: %d buckets, expected %zu", n, P, align,
                 max_floats, g.count, want);
        ok = 0;
    }
    for (int i = 0; ok && i < g.count; i++) {
        const sd_grad_bucket *b = &g.b[i];
        const int r = b->owner;
        if (b->end != expect || b->begin >= b->end || b->end - b->begin > lim || r < 0 ||
            r >= P || b->begin < bounds[r] || b->end > bounds[r + 1] ||
            (b->begin - bounds[r]) % align != 0) {
            tap_diag("n %zu P %d align %zu max %zu: bucket %d [%zu, %zu) of rank %d (shard "
                     "[%zu, %zu)) wrong", n, P, align, max_floats, i, b->begin, b->end, r,
                     r >= 0 && r < P ? bounds[r] : 0, r >= 0 && r < P ? bounds[r + 1] : 0);
            ok = 0;
        }
        expect = b->begin;
    }
    if (ok && expect != 0) {
        tap_diag("n %zu P %d: the buckets stop at %zu", n, P, expect);
        ok = 0;
    }
    /* ready calls at falling points launch exactly the buckets inside [from, n) */
    for (int round = 0; ok && round < 2; round++) {
        size_t from = n;
        uint64_t s = 0x9e3779b97f4a7c15ull * (n + 1) + (uint64_t)P + round;
        log.n = 0;
        sd_grad_buckets_begin(&g);
        while (ok && from > 0) {
            int inside = 0;
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            from = from > 0 ? (size_t)((s >> 33) % (from + 1)) : 0;
            if (round == 1 && from > 0)
                from = from - 1 < from / 2 ? 0 : from / 2; /* big strides */
            sd_grad_buckets_ready(&g, from);
            for (int i = 0; i < g.count; i++)
                inside += g.b[i].begin >= from;
            if (log.n != inside || !log.order_ok) {
                tap_diag("n %zu P %d: after ready(%zu) %d launched, %d inside", n, P, from, log.n,
                         inside);
                ok = 0;
            }
        }
        sd_grad_buckets_finish(&g);
        ok = ok && log.n == g.count && log.order_ok;
    }
    sd_grad_buckets_free(&g);
    return ok;
}

static void test_plans(void)
{
    static const size_t sizes[] = {1, 63, 64, 65, 1000, 4096, 100003, 1u << 20};
    static const int ranks[] = {1, 2, 3, 7, 64};
    static const size_t aligns[] = {1, 64};
    static const size_t maxes[] = {1, 100, 4096, 50000, (size_t)1 << 30};
    int plans = 0, bad = 0;
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof ranks / sizeof *ranks; b++)
            for (size_t c = 0; c < sizeof aligns / sizeof *aligns; c++)
                for (size_t d = 0; d < sizeof maxes / sizeof *maxes; d++) {
                    if (sizes[a] / (maxes[d] < aligns[c] ? aligns[c] : maxes[d]) > 200000)
                        continue; /* a million one-float buckets: slow, nothing new */
                    plans++;
                    bad += !check_plan(sizes[a], ranks[b], aligns[c], maxes[d]);
                }
    tap_ok(bad == 0, "%d bucket plans tile their buffer, inside shards, within the limit, "
           "launched in order exactly when complete (%d wrong)", plans, bad);
    {
        /* a hand-checked one: 1000 floats on 3 ranks (align 64: 384 / 320 / 296), max 200 */
        size_t bounds[4] = {0, 384, 704, 1000};
        sd_grad_buckets g;
        sd_grad_buckets_init(&g, bounds, 3, 200, 64, NULL, NULL);
        tap_ok(g.count == 6 && g.b[0].begin == 896 && g.b[0].end == 1000 && g.b[1].begin == 704 &&
               g.b[2].begin == 576 && g.b[2].end == 704 && g.b[3].begin == 384 &&
               g.b[4].begin == 192 && g.b[5].begin == 0 && g.b[5].owner == 0 && g.b[2].owner == 1,
               "1000 floats, 3 ranks, align 64, max 200 (128 used): 6 buckets at 896, 704, 576, "
               "384, 192, 0 (%d)", g.count);
        sd_grad_buckets_free(&g);
    }
}

/* ---- the U-Net's ready hook ------------------------------------------------------------------ */

typedef struct snap_log {
    const float *grads;
    size_t total;
    int n, cap, falls;
    size_t from[64];
    float *copy[64]; /* grads[from, total) when announced */
} snap_log;

static void on_ready(void *user, size_t from)
{
    snap_log *l = user;
    SD_CHECK(l->n < l->cap, "more ready calls than expected");
    if (l->n > 0 && from > l->from[l->n - 1])
        l->falls = 0;
    l->from[l->n] = from;
    l->copy[l->n] = sd_xmalloc((l->total - from) * sizeof(float) + 1);
    memcpy(l->copy[l->n], l->grads + from, (l->total - from) * sizeof(float));
    l->n++;
}

static void fill(float *x, size_t n, uint64_t seed, float scale)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = scale * ((float)(s >> 40) * (1.0f / 16777216.0f) - 0.5f);
    }
}

/* A trainer on one of the small golden U-Nets (batch 2, 5 context tokens) on the CPU, over the
 * snapshot's weights, with inputs drawn from `seed`. */
typedef struct fixture {
    sd_unet_config c;
    sd_weights wt;
    sd_unet *u;
    sd_unet_trainer *tr;
    sd_arena a;
    float *grads, *x, *ctx, *y, *dy;
    size_t total, nx;
} fixture;

static void fixture_open(fixture *f, const char *srcdir, const char *name, int h, int w,
                         int recompute, uint64_t seed)
{
    char dir[1024];
    sd_snapshot s;
    sd_err err;
    const int B = 2, T = 5;
    memset(f, 0, sizeof *f);
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", srcdir, name);
    SD_CHECK(sd_snapshot_open(&s, dir, &err) == 0, "%s", err.msg);
    SD_CHECK(sd_snapshot_load_unet(&s, NULL, &f->c, &f->wt, &err) == 0, "%s", err.msg);
    sd_snapshot_close(&s);
    SD_CHECK(sd_unet_create_from_weights(&f->u, &f->c, &f->wt, sd_backend_cpu(), &err) == 0,
             "%s", err.msg);
    f->total = f->wt.table.total_floats;
    f->grads = sd_xcalloc(f->total, sizeof *f->grads);
    SD_CHECK(sd_unet_trainer_create(&f->tr, f->u, &f->wt.table, f->grads, B, h, w, T, recompute,
                                    &err) == 0,
             "%s: %s", name, err.msg);
    SD_CHECK(sd_arena_init(&f->a, sd_unet_trainer_arena_bytes(f->tr), 0) == 0, "arena");
    f->nx = (size_t)B * h * w * f->c.in_channels;
    f->x = sd_xmalloc(f->nx * sizeof *f->x);
    f->y = sd_xmalloc(f->nx * sizeof *f->y);
    f->dy = sd_xmalloc(f->nx * sizeof *f->dy);
    f->ctx = sd_xmalloc((size_t)B * T * f->c.cross_attention_dim * sizeof *f->ctx);
    fill(f->x, f->nx, seed, 2.0f);
    fill(f->dy, f->nx, seed + 1, 0.1f);
    fill(f->ctx, (size_t)B * T * f->c.cross_attention_dim, seed + 2, 2.0f);
}

static void fixture_close(fixture *f)
{
    sd_arena_free(&f->a);
    sd_unet_trainer_free(f->tr);
    sd_unet_free(f->u);
    sd_weights_free(&f->wt);
    free(f->grads);
    free(f->x);
    free(f->y);
    free(f->dy);
    free(f->ctx);
}

static void test_hook(const char *srcdir, const char *name, int h, int w, int recompute)
{
    fixture f;
    float ts[2] = {17.0f, 901.0f};
    snap_log log;
    int good = 1, L;

    fixture_open(&f, srcdir, name, h, w, recompute, 1);
    L = f.c.n_levels;
    memset(&log, 0, sizeof log);
    log.grads = f.grads;
    log.total = f.total;
    log.cap = 64;
    log.falls = 1;
    /* a first backward adds into non-zero gradients, as micro-batches do; the second is logged */
    sd_unet_train_forward(f.tr, f.x, ts, f.ctx, f.y, &f.a);
    sd_unet_backward(f.tr, f.dy, &f.a);
    sd_unet_trainer_set_ready_hook(f.tr, on_ready, &log);
    fill(f.x, f.nx, 4, 2.0f);
    sd_unet_train_forward(f.tr, f.x, ts, f.ctx, f.y, &f.a);
    sd_unet_backward(f.tr, f.dy, &f.a);

    tap_ok(log.n == 2 * L + 3 && log.falls && log.from[log.n - 1] == 0 && log.from[0] < f.total,
           "%s%s: %d announcements (expected %d), falling, the last at 0", name,
           recompute ? " (recompute)" : "", log.n, 2 * L + 3);
    for (int i = 0; i < log.n; i++) {
        size_t len = f.total - log.from[i];
        if (memcmp(log.copy[i], f.grads + log.from[i], len * sizeof(float))) {
            size_t k = 0;
            while (log.copy[i][k] == f.grads[log.from[i] + k])
                k++;
            tap_diag("%s: announcement %d ([%zu, %zu)) changed later, first at float %zu", name,
                     i, log.from[i], f.total, log.from[i] + k);
            good = 0;
        }
        free(log.copy[i]);
    }
    tap_ok(good, "%s%s: every announced range already held its final gradients", name,
           recompute ? " (recompute)" : "");
    fixture_close(&f);
}

/* ---- the U-Net's parameter-need hook ------------------------------------------------------- */

typedef struct need_log {
    float *params;      /* the buffer the U-Net reads: NaN beyond what was announced */
    const float *orig;  /* its true values */
    size_t total, upto; /* upto: announced so far */
    int n, rises;
} need_log;

static void on_need(void *user, size_t upto)
{
    need_log *l = user;
    if (upto <= l->upto && l->n > 0)
        l->rises = 0;
    if (upto > l->total)
        upto = l->total;
    if (upto > l->upto)
        memcpy(l->params + l->upto, l->orig + l->upto, (upto - l->upto) * sizeof(float));
    if (upto > l->upto)
        l->upto = upto;
    l->n++;
}

/* The forward and backward with every parameter NaN until the forward announces it give the
 * same bits as with the true parameters throughout: nothing is read before its announcement. */
static void test_need(const char *srcdir, const char *name, int h, int w, int recompute)
{
    fixture f;
    float *g_ref, *orig, *y_ref, ts[2] = {33.0f, 640.0f};
    need_log log;
    int L;

    fixture_open(&f, srcdir, name, h, w, recompute, 5);
    L = f.c.n_levels;
    g_ref = sd_xmalloc(f.total * sizeof *g_ref);
    orig = sd_xmalloc(f.total * sizeof *orig);
    y_ref = sd_xmalloc(f.nx * sizeof *y_ref);
    memcpy(orig, f.wt.data, f.total * sizeof *orig);

    sd_unet_train_forward(f.tr, f.x, ts, f.ctx, y_ref, &f.a);
    sd_unet_backward(f.tr, f.dy, &f.a);
    memcpy(g_ref, f.grads, f.total * sizeof *g_ref);

    memset(&log, 0, sizeof log);
    log.params = f.wt.data;
    log.orig = orig;
    log.total = f.total;
    log.rises = 1;
    for (size_t i = 0; i < f.total; i++)
        f.wt.data[i] = NAN;
    memset(f.grads, 0, f.total * sizeof *f.grads);
    sd_unet_trainer_set_need_hook(f.tr, on_need, &log);
    sd_unet_train_forward(f.tr, f.x, ts, f.ctx, f.y, &f.a);
    sd_unet_backward(f.tr, f.dy, &f.a);
    sd_unet_trainer_set_need_hook(f.tr, NULL, NULL);

    tap_ok(log.n == 2 * L + 3 && log.rises && log.upto == f.total,
           "%s%s: %d announcements (expected %d), rising, the last at the end", name,
           recompute ? " (recompute)" : "", log.n, 2 * L + 3);
    tap_ok(!memcmp(f.y, y_ref, f.nx * sizeof *f.y) &&
               !memcmp(f.grads, g_ref, f.total * sizeof *f.grads),
           "%s%s: parameters hidden until announced: the same output and gradients", name,
           recompute ? " (recompute)" : "");
    free(g_ref);
    free(orig);
    free(y_ref);
    fixture_close(&f);
}

int main(void)
{
    const char *srcdir = getenv("srcdir");
    if (!srcdir)
        srcdir = ".";
    test_plans();
    test_hook(srcdir, "tiny-sd2", 8, 8, 0);
    test_hook(srcdir, "tiny-sd2", 8, 8, 1);
    test_hook(srcdir, "tiny-sd1", 8, 8, 0);
    test_hook(srcdir, "odd-train", 6, 10, 0);
    test_need(srcdir, "tiny-sd2", 8, 8, 0);
    test_need(srcdir, "tiny-sd2", 8, 8, 1);
    test_need(srcdir, "tiny-sd1", 8, 8, 0);
    test_need(srcdir, "odd-train", 6, 10, 0);
    return tap_done();
}
