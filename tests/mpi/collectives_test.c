/* Helper for collectives.sh: the deterministic fp32 collectives and the ZeRO-2 helpers, checked
 * bit for bit against serial sums in rank order, under any number of ranks (TAP on rank 0).
 *   collectives_test            run the checks
 *   collectives_test hash       print a hash of fixed reductions (run-to-run determinism)
 *   collectives_test bench MB   all-reduce bandwidth for a buffer of MB megabytes */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/collectives.h"
#include "sdtrain/runtime.h"
#include "tap.h"

static int g_rank, g_size;

static uint64_t splitmix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* Element i of rank r's data for stream `seed`: signed values spread over 2^-12..2^12 so that
 * the order of summation changes the rounded result. */
static float gen(uint64_t seed, int r, size_t i)
{
    uint64_t h = splitmix(seed * 1000003ULL + (uint64_t)r * 7919ULL + splitmix(i));
    float mant = (float)(h >> 40) / (float)(1 << 24); /* [0, 1) */
    int e = (int)((h >> 8) % 25) - 12;
    float v = ldexpf(1.0f + mant, e);
    return (h & 1) ? -v : v;
}

static void fill(float *x, size_t n, uint64_t seed, int r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = gen(seed, r, i);
}

/* The serial reference: sum over ranks 0..P-1, left to right (then / P for the average). */
static void serial_sum(float *out, size_t n, uint64_t seed, int P, int avg)
{
    for (size_t i = 0; i < n; i++) {
        float acc = gen(seed, 0, i);
        for (int q = 1; q < P; q++)
            acc += gen(seed, q, i);
        out[i] = avg ? acc / (float)P : acc;
    }
}

static int same(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

/* A test point that holds when it holds on every rank; rank 0 reports it. */
static int check(int cond, const char *fmt, const char *what)
{
    int all = 0, mine = cond ? 1 : 0;
    SD_MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (g_rank == 0)
        tap_ok(all, fmt, what);
    return all;
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001B3ULL;
    return h;
}

/* Every rank holds the same bytes. */
static int same_everywhere(sd_comm *c, const void *p, size_t n)
{
    int64_t h[2];
    h[0] = (int64_t)(hash_bytes(p, n, 0xcbf29ce484222325ULL) >> 1);
    h[1] = -h[0];
    sd_allreduce_i64(c, h, 2, SD_RED_MAX);
    return h[0] == -h[1];
}

static void test_shard_ranges(void)
{
    static const size_t ns[] = {0, 1, 2, 3, 5, 63, 64, 65, 127, 128, 129, 1000, 4097, 100003,
                                (size_t)INT_MAX + 77, (size_t)1 << 40};
    static const size_t aligns[] = {0, 1, 3, 64, 1000};
    int ok = 1;
    for (size_t a = 0; a < sizeof aligns / sizeof *aligns; a++)
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int P = 1; P <= 9; P++) {
                size_t n = ns[ni], al = aligns[a] ? aligns[a] : 1, prev_end = 0, lo = SIZE_MAX,
                       hi = 0;
                for (int r = 0; r < P; r++) {
                    size_t b, e;
                    sd_shard_range(n, P, r, aligns[a], &b, &e);
                    int good = b == prev_end && e >= b && e <= n && (b == n || b % al == 0) &&
                               (e == n || e % al == 0);
                    if (!good && ok)
                        fprintf(stderr, "shard n=%zu P=%d r=%d align=%zu: [%zu, %zu)\n", n, P, r,
                                al, b, e);
                    ok &= good;
                    prev_end = e;
                    if (e - b < lo)
                        lo = e - b;
                    if (e - b > hi)
                        hi = e - b;
                }
                if (prev_end != n || hi - lo >= 2 * al) {
                    if (ok)
                        fprintf(stderr, "shard n=%zu P=%d align=%zu: end %zu, sizes %zu..%zu\n",
                                n, P, al, prev_end, lo, hi);
                    ok = 0;
                }
            }
    check(ok, "%s", "shard ranges: exact, ordered, aligned, balanced cover (P 1..9, n 0..2^40)");
}

/* All-reduce (sum, average), reduce-scatter (separate and in place) + all-gather, for one size,
 * with the default chunk and with small chunks; all bit-identical to the serial sums. */
static void test_reductions(sd_comm *c, size_t n, size_t align)
{
    static const size_t chunks[] = {0, 1, 7, 64, 1000};
    const int P = c->size;
    uint64_t seed = 11 + n * 31 + align;
    size_t cap = n ? n : 1;
    float *x = sd_xmalloc(cap * sizeof(float)), *a = sd_xmalloc(cap * sizeof(float));
    float *ref_sum = sd_xmalloc(cap * sizeof(float)), *ref_avg = sd_xmalloc(cap * sizeof(float));
    float *shard = sd_xmalloc(cap * sizeof(float));
    char why[256] = "";
    fill(x, n, seed, c->rank);
    serial_sum(ref_sum, n, seed, P, 0);
    serial_sum(ref_avg, n, seed, P, 1);
    size_t default_chunk = c->chunk_elems;
    sd_comm_set_align(c, align);
    size_t b, e;
    sd_comm_shard(c, n, &b, &e);
    int ok = 1, rounds_tested = 0;
    for (size_t ci = 0; ci < sizeof chunks / sizeof *chunks; ci++) {
        size_t ch = chunks[ci] ? chunks[ci] : default_chunk;
        if (n / ch > 3000)
            continue; /* keep the oversubscribed run fast */
        sd_comm_set_chunk_elems(c, ch);
        rounds_tested++;

        memcpy(a, x, n * sizeof(float));
        sd_allreduce_f32(c, a, n, SD_RED_SUM);
        if (!same(a, ref_sum, n) && ok) {
            ok = 0;
            snprintf(why, sizeof why, "allreduce sum (chunk %zu)", ch);
        }
        memcpy(a, x, n * sizeof(float));
        sd_allreduce_f32(c, a, n, SD_RED_AVG);
        if (!same(a, ref_avg, n) && ok) {
            ok = 0;
            snprintf(why, sizeof why, "allreduce average (chunk %zu)", ch);
        }
        /* reduce-scatter into a separate buffer, then all-gather into a buffer full of NaN */
        sd_reduce_scatter_f32(c, x, shard, n, SD_RED_SUM);
        if (!same(shard, ref_sum + b, e - b) && ok) {
            ok = 0;
            snprintf(why, sizeof why, "reduce-scatter shard [%zu, %zu) (chunk %zu)", b, e, ch);
        }
        for (size_t i = 0; i < n; i++)
            a[i] = NAN;
        if (e > b)
            memcpy(a + b, shard, (e - b) * sizeof(float));
        sd_allgather_f32(c, a, n);
        if (!same(a, ref_sum, n) && ok) {
            ok = 0;
            snprintf(why, sizeof why, "reduce-scatter + allgather (chunk %zu)", ch);
        }
        /* reduce to each root in turn, in place: the whole buffer, then a middle range (the
         * gradient buckets); the other ranks' buffers stay as they were */
        for (int root = 0; root < P; root++) {
            const size_t lo = n / 3, hi = n - n / 5;
            memcpy(a, x, n * sizeof(float));
            sd_reduce_f32(c, a, n, root == 1 ? SD_RED_AVG : SD_RED_SUM, root);
            if (!same(a, c->rank != root ? x : root == 1 ? ref_avg : ref_sum, n) && ok) {
                ok = 0;
                snprintf(why, sizeof why, "reduce to rank %d (chunk %zu)", root, ch);
            }
            memcpy(a, x, n * sizeof(float));
            sd_reduce_f32(c, a + lo, hi - lo, SD_RED_SUM, root);
            if ((!same(a + lo, (c->rank == root ? ref_sum : x) + lo, hi - lo) ||
                 !same(a, x, lo) || !same(a + hi, x + hi, n - hi)) && ok) {
                ok = 0;
                snprintf(why, sizeof why, "reduce of [%zu, %zu) to rank %d (chunk %zu)", lo, hi,
                         root, ch);
            }
        }
        /* in place, averaged (the ZeRO-2 gradient path) */
        memcpy(a, x, n * sizeof(float));
        sd_reduce_scatter_f32(c, a, a + b, n, SD_RED_AVG);
        if (!same(a + b, ref_avg + b, e - b) && ok) {
            ok = 0;
            snprintf(why, sizeof why, "in-place reduce-scatter average (chunk %zu)", ch);
        }
    }
    if (P >= 3 && n == 100003) {
        /* the data are order-sensitive: summing in reverse rank order changes some bits, so a
         * reduction that does not keep the rank order would be caught */
        int differs = 0;
        for (size_t i = 0; i < n && !differs; i++) {
            float acc = gen(seed, P - 1, i);
            for (int q = P - 2; q >= 0; q--)
                acc += gen(seed, q, i);
            differs = memcmp(&acc, &ref_sum[i], sizeof acc) != 0;
        }
        check(differs, "%s", "the test data are sensitive to the summation order");
    }
    if (!ok)
        fprintf(stderr, "[rank %d] n=%zu align=%zu: %s differs from the serial sum\n", c->rank, n,
                align, why);
    char label[160];
    snprintf(label, sizeof label,
             "n=%zu align=%zu: allreduce = RS+AG = reduce = serial rank-order sum, bit for bit (%d chunk sizes)",
             n, align, rounds_tested);
    check(ok, "%s", label);
    sd_comm_set_chunk_elems(c, default_chunk);
    sd_comm_set_align(c, SD_SHARD_ALIGN);
    free(x);
    free(a);
    free(ref_sum);
    free(ref_avg);
    free(shard);
}

/* One AdamW-like step on a range (element-wise, so any split gives the same bits). */
static void toy_adam(float *p, const float *g, float *m, float *v, size_t len, int step)
{
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-2f;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    for (size_t i = 0; i < len; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * g[i];
        v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
        float mh = m[i] / c1, vh = v[i] / c2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

/* DDP (average the full gradient, every rank updates everything) against ZeRO-2 (average into
 * the shard, update the shard, all-gather) and against a serial run: identical after 10 steps. */
static void test_ddp_vs_zero2(sd_comm *c, size_t n, size_t chunk)
{
    const int P = c->size, steps = 10;
    size_t cap = n ? n : 1;
    float *p_ddp = sd_xmalloc(cap * sizeof(float)), *p_z = sd_xmalloc(cap * sizeof(float));
    float *p_ser = sd_xmalloc(cap * sizeof(float)), *g = sd_xmalloc(cap * sizeof(float));
    float *m_ddp = sd_xcalloc(cap, sizeof(float)), *v_ddp = sd_xcalloc(cap, sizeof(float));
    float *m_ser = sd_xcalloc(cap, sizeof(float)), *v_ser = sd_xcalloc(cap, sizeof(float));
    size_t default_chunk = c->chunk_elems;
    if (chunk)
        sd_comm_set_chunk_elems(c, chunk);
    sd_zero2 z;
    sd_zero2_init(&z, c, n);
    size_t sl = sd_zero2_shard_len(&z);
    float *m_z = sd_xcalloc(sl ? sl : 1, sizeof(float)), *v_z = sd_xcalloc(sl ? sl : 1, sizeof(float));
    fill(p_ddp, n, 999, 0); /* the same initial parameters on every rank */
    memcpy(p_z, p_ddp, n * sizeof(float));
    memcpy(p_ser, p_ddp, n * sizeof(float));
    for (int s = 1; s <= steps; s++) {
        uint64_t seed = 5000 + (uint64_t)s;
        /* DDP */
        fill(g, n, seed, c->rank);
        sd_allreduce_f32(c, g, n, SD_RED_AVG);
        toy_adam(p_ddp, g, m_ddp, v_ddp, n, s);
        /* ZeRO-2: the averaged gradient shard lands in place */
        fill(g, n, seed, c->rank);
        sd_zero2_reduce_grads(&z, g, g + z.begin);
        toy_adam(p_z + z.begin, g + z.begin, m_z, v_z, sl, s);
        sd_zero2_gather_params(&z, p_z);
        /* serial: one process that sees every rank's gradient */
        serial_sum(g, n, seed, P, 1);
        toy_adam(p_ser, g, m_ser, v_ser, n, s);
    }
    char label[160];
    snprintf(label, sizeof label, "n=%zu chunk=%zu: DDP and ZeRO-2 parameters identical after %d steps",
             n, c->chunk_elems, steps);
    check(same(p_ddp, p_z, n), "%s", label);
    snprintf(label, sizeof label, "n=%zu: ZeRO-2 parameters equal a serial run and agree on every rank", n);
    check(same(p_z, p_ser, n) && same_everywhere(c, p_z, n * sizeof(float)), "%s", label);
    int moved = 0;
    float p0 = 0;
    for (size_t i = 0; i < n; i++) {
        p0 = gen(999, 0, i);
        moved |= p0 != p_z[i];
    }
    if (n > 0)
        check(moved, "%s", "the toy optimizer changed the parameters");
    sd_comm_set_chunk_elems(c, default_chunk);
    free(p_ddp), free(p_z), free(p_ser), free(g), free(m_ddp), free(v_ddp), free(m_ser),
        free(v_ser), free(m_z), free(v_z);
}

static void test_small_and_bcast(sd_comm *c)
{
    const int P = c->size, r = c->rank;
    /* f64 vectors: sum in rank order, average, max, min */
    double v[4], ref[4];
    int ok = 1;
    for (sd_red_op op = SD_RED_SUM; op <= SD_RED_MIN; op++) {
        for (int i = 0; i < 4; i++) {
            v[i] = (double)gen(77 + (uint64_t)i, r, 0) * 1e-3 + (double)gen(88, r, (size_t)i);
            double acc = 0;
            for (int q = 0; q < P; q++) {
                double x = (double)gen(77 + (uint64_t)i, q, 0) * 1e-3 + (double)gen(88, q, (size_t)i);
                if (q == 0)
                    acc = x;
                else if (op == SD_RED_SUM || op == SD_RED_AVG)
                    acc += x;
                else if (op == SD_RED_MAX)
                    acc = x > acc ? x : acc;
                else
                    acc = x < acc ? x : acc;
            }
            ref[i] = op == SD_RED_AVG ? acc / P : acc;
        }
        sd_allreduce_f64(c, v, 4, op);
        ok &= memcmp(v, ref, sizeof v) == 0;
    }
    check(ok, "%s", "allreduce f64 sum/avg/max/min equal the serial rank-order result");
    /* a NaN on one rank reaches every rank through max (the non-finite gradient flag) */
    double nanv[1] = {r == P - 1 ? NAN : 1.0};
    sd_allreduce_f64(c, nanv, 1, SD_RED_MAX);
    check(isnan(nanv[0]), "%s", "allreduce f64 max propagates NaN");
    int64_t iv[3] = {r + 1, r == 1 ? -5 : r, (int64_t)1 << 40};
    sd_allreduce_i64(c, iv, 3, SD_RED_SUM);
    check(iv[0] == (int64_t)P * (P + 1) / 2 && iv[2] == ((int64_t)1 << 40) * P, "%s",
          "allreduce i64 sum");
    int64_t fl[1] = {r == P - 1};
    sd_allreduce_i64(c, fl, 1, SD_RED_MAX);
    check(fl[0] == 1, "%s", "allreduce i64 max (a flag set on one rank)");

    /* broadcast, odd size, from the last rank, in small chunks */
    size_t nb = 1000003, dc = c->chunk_elems;
    unsigned char *buf = sd_xmalloc(nb);
    for (size_t i = 0; i < nb; i++)
        buf[i] = r == P - 1 ? (unsigned char)(splitmix(i) & 0xff) : 0;
    sd_comm_set_chunk_elems(c, 1001);
    sd_broadcast(c, buf, nb, P - 1);
    sd_comm_set_chunk_elems(c, dc);
    int bok = 1;
    for (size_t i = 0; i < nb; i++)
        bok &= buf[i] == (unsigned char)(splitmix(i) & 0xff);
    check(bok, "%s", "broadcast of 1000003 bytes from the last rank in 4004-byte chunks");
    free(buf);

    /* the message size is clamped so that no MPI count exceeds INT_MAX */
    sd_comm_set_chunk_elems(c, (size_t)INT_MAX + 5);
    int clamp = c->chunk_elems == (size_t)INT_MAX;
    sd_comm_set_chunk_elems(c, 0);
    clamp &= c->chunk_elems == 1;
    sd_comm_set_chunk_elems(c, dc);
    check(clamp, "%s", "chunk size clamped to [1, INT_MAX]");
}

/* The collectives on a sub-communicator (odd and even world ranks). */
static void test_subcomm(void)
{
    MPI_Comm sub;
    SD_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_rank, &sub));
    sd_comm *c = sd_comm_create_mpi(sub);
    size_t n = 5003;
    float *a = sd_xmalloc(n * sizeof(float)), *ref = sd_xmalloc(n * sizeof(float));
    fill(a, n, 3, c->rank);
    serial_sum(ref, n, 3, c->size, 0);
    sd_allreduce_f32(c, a, n, SD_RED_SUM);
    check(same(a, ref, n) && c->size == (g_size + 1 - g_rank % 2) / 2, "%s",
          "allreduce on a split communicator");
    sd_comm_destroy(c);
    SD_MPI_CHECK(MPI_Comm_free(&sub));
    free(a);
    free(ref);
}

static void print_hash(sd_comm *c)
{
    size_t n = 300007;
    float *a = sd_xmalloc(n * sizeof(float));
    fill(a, n, 42, c->rank);
    sd_allreduce_f32(c, a, n, SD_RED_AVG);
    uint64_t h = hash_bytes(a, n * sizeof(float), 0xcbf29ce484222325ULL);
    fill(a, n, 43, c->rank);
    sd_comm_set_chunk_elems(c, 4096);
    sd_allreduce_f32(c, a, n, SD_RED_SUM);
    h = hash_bytes(a, n * sizeof(float), h);
    if (c->rank == 0)
        printf("hash np=%d %016llx\n", c->size, (unsigned long long)h);
    free(a);
}

static void bench(sd_comm *c, double mb)
{
    size_t n = (size_t)(mb * 1e6 / sizeof(float));
    float *a = sd_xmalloc(n * sizeof(float));
    fill(a, n, 1, c->rank);
    const int reps = 5;
    double t_ours = 1e30, t_mpi = 1e30;
    for (int k = 0; k < reps; k++) {
        sd_comm_barrier(c);
        double t0 = MPI_Wtime();
        sd_allreduce_f32(c, a, n, SD_RED_AVG);
        double t = MPI_Wtime() - t0;
        sd_allreduce_f64(c, &t, 1, SD_RED_MAX);
        t_ours = t < t_ours ? t : t_ours;
    }
    /* MPI_Allreduce (not deterministic across algorithms) for comparison; n fits in an int here */
    for (int k = 0; k < reps && n <= INT_MAX; k++) {
        SD_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        double t0 = MPI_Wtime();
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, a, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
        double t = MPI_Wtime() - t0;
        SD_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
        t_mpi = t < t_mpi ? t : t_mpi;
    }
    if (c->rank == 0) {
        double bytes = (double)n * sizeof(float), bus = 2.0 * (c->size - 1) / c->size;
        printf("allreduce %.1f MB np=%d: sd %.4f s (%.2f GB/s alg, %.2f GB/s bus); "
               "MPI_Allreduce %.4f s (%.2f GB/s alg)\n",
               bytes / 1e6, c->size, t_ours, bytes / t_ours / 1e9, bus * bytes / t_ours / 1e9,
               t_mpi, bytes / t_mpi / 1e9);
    }
    free(a);
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "check";
    sd_mpi_start(&argc, &argv);
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank));
    SD_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &g_size));
    sd_comm *c = sd_comm_create_mpi(MPI_COMM_WORLD);
    SD_CHECK(c->rank == g_rank && c->size == g_size, "communicator %d/%d", c->rank, c->size);
    if (!strcmp(what, "hash")) {
        print_hash(c);
    } else if (!strcmp(what, "bench")) {
        bench(c, argc > 2 ? atof(argv[2]) : 100.0);
    } else {
        static const size_t sizes[] = {0, 1, 2, 3, 5, 63, 64, 65, 127, 200, 1000, 4097, 100003,
                                       ((size_t)1 << 20) + 13};
        test_shard_ranges();
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
            test_reductions(c, sizes[i], SD_SHARD_ALIGN);
            if (sizes[i] < 100000)
                test_reductions(c, sizes[i], 1);
        }
        test_ddp_vs_zero2(c, 10007, 0);
        test_ddp_vs_zero2(c, 10007, 97);
        test_ddp_vs_zero2(c, 3, 0);
        test_ddp_vs_zero2(c, 0, 0);
        test_small_and_bcast(c);
        test_subcomm();
    }
    sd_comm_destroy(c);
    int rc = g_rank == 0 && strcmp(what, "hash") && strcmp(what, "bench") ? tap_done() : 0;
    MPI_Finalize();
    return rc;
}
