/* TAP tests of the Philox4x32-10 generator, its conversions and the stream convention. */
#include "sdtrain/rng.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

typedef struct {
    uint32_t ctr[4], key[2], expect[4];
} philox_vector;

/* Random123 tests/kat_vectors (DEShawResearch/random123 at 9545ff64, lines 27-29): the
 * zero, all-ones and pi-digits vectors for philox4x32 with 10 rounds. */
static const philox_vector kat[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000}, {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
};

/* Random counters and keys whose outputs were computed by the PyPI package randomgen 2.5.1
 * (Philox(number=4, width=32)) and, identically, by a Python transcription of the paper. */
static const philox_vector cross[] = {
    {{0x6aa79987, 0xbb91433a, 0x029a7245, 0xd1f6f86c}, {0xd340bbcd, 0xcd8778e7},
     {0x03e2a229, 0x21a59abb, 0x00a2ef81, 0x987a1a3d}},
    {{0x4c73a942, 0xdaea58ba, 0x5e503a67, 0xee897110}, {0x3193ca54, 0x452ec40a},
     {0x6129b832, 0x9af575a1, 0x47439f63, 0x11b873ab}},
    {{0x90e5e945, 0x6facaa50, 0x29645f8b, 0x5f811cb9}, {0x1fcff454, 0xdfc9e3b1},
     {0x5d3694ff, 0xd46d5433, 0x650af489, 0x0a9e2020}},
    {{0x6ed4e94b, 0x42d6cb5c, 0x8fe46024, 0xa091250e}, {0x2ca1c789, 0x9c9cea0c},
     {0xbeb30930, 0xe8c3a0d2, 0x088e41fd, 0x476f9fdb}},
    {{0x8d9fe5b9, 0x2fd2b7a4, 0x5adad121, 0xbcf74d7a}, {0xf543bbcf, 0xbb9d58e4},
     {0x8d71b995, 0xc321bb39, 0xbae4868c, 0x279e57ba}},
    {{0x175f0cd2, 0x87f26aee, 0xfa882692, 0xbc428d42}, {0x6980a81f, 0x95c5fb98},
     {0xf36bec08, 0xca0e0e8a, 0x879ed941, 0xe54f4ed5}},
};

static void test_philox_vectors(void)
{
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        sd_philox4x32_10(kat[i].ctr, kat[i].key, out);
        tap_ok(memcmp(out, kat[i].expect, sizeof out) == 0,
               "Random123 KAT philox4x32_10 #%zu -> %08" PRIx32 " %08" PRIx32 " %08" PRIx32
               " %08" PRIx32, i, out[0], out[1], out[2], out[3]);
    }
    for (size_t i = 0; i < sizeof cross / sizeof cross[0]; i++) {
        uint32_t out[4];
        sd_philox4x32_10(cross[i].ctr, cross[i].key, out);
        tap_ok(memcmp(out, cross[i].expect, sizeof out) == 0, "randomgen cross-check #%zu", i);
    }
    /* In-place use is documented. */
    uint32_t x[4];
    memcpy(x, kat[2].ctr, sizeof x);
    sd_philox4x32_10(x, kat[2].key, x);
    tap_ok(memcmp(x, kat[2].expect, sizeof x) == 0, "philox output may alias the counter");
}

static void test_conversions(void)
{
    const float two_m24 = 5.9604644775390625e-8f;
    tap_ok(sd_u32_to_unit_float_co(0) == 0.0f, "co(0) = 0");
    tap_ok(sd_u32_to_unit_float_co(0xFFFFFFFFu) == 1.0f - two_m24, "co(max) = 1 - 2^-24 < 1");
    tap_ok(sd_u32_to_unit_float_co(0x80000000u) == 0.5f, "co(2^31) = 0.5");
    tap_ok(sd_u32_to_unit_float_co(0xFFu) == 0.0f, "co uses the top 24 bits only");
    tap_ok(sd_u32_to_unit_float_oc(0) == two_m24, "oc(0) = 2^-24 > 0");
    tap_ok(sd_u32_to_unit_float_oc(0xFFFFFFFFu) == 1.0f, "oc(max) = 1");
    tap_ok(sd_u32_to_unit_float_oc(0x7FFFFFFFu) == 0.5f, "oc(2^31 - 1) = 0.5");
    tap_ok(sd_u32x2_to_unit_double_co(0, 0) == 0.0, "double co(0) = 0");
    tap_ok(sd_u32x2_to_unit_double_co(0xFFFFFFFFu, 0xFFFFFFFFu) == 1.0 - ldexp(1.0, -53),
           "double co(max) = 1 - 2^-53");
    tap_ok(sd_u32x2_to_unit_double_co(0, 0x800u) == ldexp(1.0, -53), "double co: lo word used");
    tap_ok(sd_u32x2_to_unit_double_oc(0, 0) == ldexp(1.0, -53), "double oc(0) = 2^-53");
    tap_ok(sd_u32x2_to_unit_double_oc(0xFFFFFFFFu, 0xFFFFFFFFu) == 1.0, "double oc(max) = 1");

    /* Every 24-bit value, by walking the top bits: co in [0,1), oc in (0,1], and oc = co + 2^-24. */
    int co_ok = 1, oc_ok = 1, step_ok = 1;
    for (uint32_t top = 0; top < (1u << 24); top++) {
        uint32_t x = (top << 8) | (top & 0xFFu);
        float co = sd_u32_to_unit_float_co(x), oc = sd_u32_to_unit_float_oc(x);
        if (!(co >= 0.0f && co < 1.0f))
            co_ok = 0;
        if (!(oc > 0.0f && oc <= 1.0f))
            oc_ok = 0;
        if (oc != co + two_m24 || co != (float)top * two_m24)
            step_ok = 0;
    }
    tap_ok(co_ok, "all 2^24 co values lie in [0, 1)");
    tap_ok(oc_ok, "all 2^24 oc values lie in (0, 1]");
    tap_ok(step_ok, "co and oc are exact multiples of 2^-24, oc = co + 2^-24");

    /* Box-Muller against a double-precision evaluation of the documented formula. */
    const uint32_t words[][4] = {{0, 0, 0xFFFFFFFFu, 0xFFFFFFFFu},
                                 {0x12345678u, 0x9abcdef0u, 0x0badf00du, 0xdeadbeefu},
                                 {0x00000100u, 0x40000000u, 0xFFFFFF00u, 0xC0000000u}};
    int bm_ok = 1;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        float z[4];
        sd_box_muller4(words[i], z);
        for (int pair = 0; pair < 2; pair++) {
            double u = ((words[i][2 * pair] >> 8) + 1.0) * ldexp(1.0, -24);
            double v = (words[i][2 * pair + 1] >> 8) * ldexp(1.0, -24);
            double r = sqrt(-2.0 * log(u)), th = 2.0 * 3.14159265358979323846 * v;
            if (fabs(z[2 * pair] - r * cos(th)) > 1e-5 * (1.0 + r) ||
                fabs(z[2 * pair + 1] - r * sin(th)) > 1e-5 * (1.0 + r)) {
                bm_ok = 0;
                tap_diag("words #%zu pair %d: %.9g %.9g vs %.9g %.9g", i, pair, z[2 * pair],
                         z[2 * pair + 1], r * cos(th), r * sin(th));
            }
        }
    }
    tap_ok(bm_ok, "Box-Muller matches its documented formula");
    float z[4];
    sd_box_muller4(words[0], z);
    tap_ok(isfinite(z[0]) && fabsf(z[0]) <= 5.7686f && fabsf(z[0]) > 5.76f,
           "smallest u gives the largest normal, sqrt(48 ln 2) = %.6f", z[0]);
    tap_ok(z[2] == 0.0f && z[3] == 0.0f, "u = 1 gives zero normals");
}

typedef struct {
    uint64_t seed;
    uint32_t purpose;
    uint64_t step, sample, word;
    uint32_t expect;
} word_golden;

/* From the Python reference with the documented key/counter layout: pins the convention. */
static const word_golden word_goldens[] = {
    {UINT64_C(0x123456789abcdef), 0x1, 7, 3, 0, 0x8d3af4af},
    {UINT64_C(0x123456789abcdef), 0x1, 7, 3, 5, 0xaf7d7e64},
    {UINT64_C(0x2a), 0x2, UINT64_C(4294967294), UINT64_C(0xabcdef012345), 1234567, 0xe551e55d},
    {UINT64_C(0xffffffffffffffff), 0x1203, 100000, UINT64_C(0x10000000000),
     UINT64_C(17179869183), 0xc70edea1},
};

static void test_convention(void)
{
    for (size_t i = 0; i < sizeof word_goldens / sizeof word_goldens[0]; i++) {
        const word_golden *g = &word_goldens[i];
        uint32_t w = sd_rng_uniform_u32(g->seed, g->purpose, g->step, g->sample, g->word);
        tap_ok(w == g->expect, "stream word golden #%zu: %08" PRIx32, i, w);
    }
    /* Normals of two blocks, reference evaluated in double precision. */
    const struct {
        uint64_t seed;
        uint32_t purpose, step, sample, block;
        double expect[4];
    } normals[] = {
        {UINT64_C(0x123456789abcdef), 1, 7, 3, 0, {-0.412279097, 1.009750979, -1.472078669, -0.641222007}},
        {UINT64_C(0x7e8), 1, 12, 99, 17, {1.988178292, -0.826515393, 0.005433717, 1.001991961}},
    };
    for (size_t i = 0; i < sizeof normals / sizeof normals[0]; i++) {
        float z[4], filled[4];
        int ok = 1;
        sd_rng_normal4(normals[i].seed, normals[i].purpose, normals[i].step, normals[i].sample,
                       normals[i].block, z);
        for (int k = 0; k < 4; k++)
            if (fabs(z[k] - normals[i].expect[k]) > 2e-6)
                ok = 0;
        tap_ok(ok, "normal golden #%zu: %.7f %.7f %.7f %.7f", i, z[0], z[1], z[2], z[3]);
        sd_rng_fill_normal_at(normals[i].seed, normals[i].purpose, normals[i].step,
                              normals[i].sample, 4u * normals[i].block, filled, 4);
        tap_ok(memcmp(z, filled, sizeof z) == 0, "fill at 4*block equals sd_rng_normal4 #%zu", i);
    }

    /* Bounded draws, reference from the Python transcription (incl. a retry into round 1). */
    const struct {
        uint64_t seed;
        uint32_t purpose, step, sample, draw, n, expect;
    } draws[] = {
        {1234, 2, 5, 0, 0, 1000, 417},
        {1234, 2, 5, 1, 0, 1000, 860},
        {1234, 2, 5, 2, 0, 1000, 631},
        {99, 2, 0, 7, 3, 1000, 847},
        {5, 128, 1, 2, 0, 0x80000001u, 458535577},  /* accepted on attempt 5 */
        {5, 128, 1, 3, 0, 0x80000001u, 195483947},  /* accepted on attempt 2 */
        {5, 128, 1, 4, 0, 0x80000001u, 1186188514},
    };
    for (size_t i = 0; i < sizeof draws / sizeof draws[0]; i++) {
        uint32_t v = sd_rng_below(draws[i].seed, draws[i].purpose, draws[i].step, draws[i].sample,
                                  draws[i].draw, draws[i].n);
        tap_ok(v == draws[i].expect, "bounded draw golden #%zu: %" PRIu32, i, v);
    }

    /* The key/counter layout itself. */
    uint32_t ctr[4], key[2];
    sd_rng_counter(0x1203, UINT64_C(0x89abcdef), UINT64_C(0x4567000000ff), 77, ctr);
    sd_rng_key(UINT64_C(0x0011223344556677), key);
    tap_ok(ctr[0] == 77 && ctr[1] == 0x45671203u && ctr[2] == 0xffu && ctr[3] == 0x89abcdefu,
           "counter = {block, purpose | sample_hi << 16, sample_lo, step}");
    tap_ok(key[0] == 0x44556677u && key[1] == 0x00112233u, "key = {seed_lo, seed_hi}");
    tap_ok(SD_RNG_PURPOSE(SD_RNG_DROPOUT, 5) == 0x503u, "SD_RNG_PURPOSE packs tag and site");
}

static void test_uniform_fill(void)
{
    const size_t n = 1000000;
    float *u = malloc(n * sizeof *u);
    if (!u)
        tap_skip_all("out of memory");
    tap_ok(sd_rng_fill_uniform(7, SD_RNG_DROPOUT, 3, 11, u, n) == 0, "uniform fill of 1e6");
    int in_range = 1;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(u[i] >= 0.0f && u[i] < 1.0f))
            in_range = 0;
        sum += u[i];
    }
    double mean = sum / (double)n, sigma = sqrt(1.0 / 12.0 / (double)n);
    tap_ok(in_range, "uniform fill stays in [0, 1)");
    tap_ok(fabs(mean - 0.5) < 5 * sigma, "uniform mean %.6f within 5 sigma of 1/2", mean);
    int same = 1;
    for (size_t i = 0; i < 1000; i++)
        if (u[i] != sd_rng_uniform_float(7, SD_RNG_DROPOUT, 3, 11, i) ||
            u[i] != sd_u32_to_unit_float_co(sd_rng_uniform_u32(7, SD_RNG_DROPOUT, 3, 11, i)))
            same = 0;
    tap_ok(same, "uniform fill element i = co(word i)");
    uint32_t w[7];
    tap_ok(sd_rng_fill_u32_at(7, SD_RNG_DROPOUT, 3, 11, 5, w, 7) == 0, "word fill at offset 5");
    same = 1;
    for (size_t i = 0; i < 7; i++)
        if (w[i] != sd_rng_uniform_u32(7, SD_RNG_DROPOUT, 3, 11, 5 + i))
            same = 0;
    tap_ok(same, "word fill agrees with sd_rng_uniform_u32");
    free(u);
}

static void test_normal_moments(void)
{
    const size_t n = 1000000;
    float *z = malloc(n * sizeof *z);
    if (!z)
        tap_skip_all("out of memory");
    tap_ok(sd_rng_fill_normal(0x5eed, SD_RNG_NOISE, 1, 0, z, n) == 0, "normal fill of 1e6");
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0, zmax = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double x = z[i];
        if (!isfinite(z[i]))
            finite = 0;
        s1 += x;
        s2 += x * x;
        s3 += x * x * x;
        s4 += x * x * x * x;
        if (fabs(x) > zmax)
            zmax = fabs(x);
    }
    double N = (double)n, mean = s1 / N, var = s2 / N - mean * mean;
    double skew = s3 / N, kurt = s4 / N;
    tap_ok(finite, "all normals finite");
    tap_ok(fabs(mean) < 5.0 / sqrt(N), "normal mean %.6f within 5 sigma of 0", mean);
    /* Var(sample variance) = 2/N for a normal. */
    tap_ok(fabs(var - 1.0) < 5.0 * sqrt(2.0 / N), "normal variance %.6f within 5 sigma of 1", var);
    /* Var(third moment) = 15/N, Var(fourth moment) = 96/N. */
    tap_ok(fabs(skew) < 5.0 * sqrt(15.0 / N), "third moment %.5f within 5 sigma of 0", skew);
    tap_ok(fabs(kurt - 3.0) < 5.0 * sqrt(96.0 / N), "fourth moment %.5f within 5 sigma of 3", kurt);
    tap_ok(zmax > 4.0 && zmax <= 5.7686, "largest |z| %.4f is in (4, sqrt(48 ln 2)]", zmax);

    /* Different streams are uncorrelated. */
    float *y = malloc(n * sizeof *y);
    if (!y)
        tap_skip_all("out of memory");
    sd_rng_fill_normal(0x5eed, SD_RNG_NOISE, 1, 1, y, n);
    double sxy = 0;
    for (size_t i = 0; i < n; i++)
        sxy += (double)z[i] * y[i];
    tap_ok(fabs(sxy / N) < 5.0 / sqrt(N), "adjacent samples' noise correlation %.6f ~ 0", sxy / N);
    free(y);
    free(z);
}

static void test_split_invariance(void)
{
    enum { N = 1031 };
    float whole[N], parts[N];
    uint32_t wwhole[N], wparts[N];
    float uwhole[N], uparts[N];
    const uint64_t seed = UINT64_C(0xfeedfacecafebeef);
    const uint32_t purpose = SD_RNG_PURPOSE(SD_RNG_NOISE, 2);
    sd_rng_fill_normal(seed, purpose, 99, 12345, whole, N);
    sd_rng_fill_u32_at(seed, purpose, 99, 12345, 0, wwhole, N);
    sd_rng_fill_uniform(seed, purpose, 99, 12345, uwhole, N);

    /* Cut points chosen to hit every lane alignment, including empty pieces. */
    const size_t cuts[] = {0, 1, 2, 2, 3, 7, 8, 13, 14, 64, 65, 66, 67, 500, 511, 1029, N};
    int ok = 1;
    for (size_t c = 0; c + 1 < sizeof cuts / sizeof cuts[0]; c++) {
        size_t lo = cuts[c], len = cuts[c + 1] - cuts[c];
        if (sd_rng_fill_normal_at(seed, purpose, 99, 12345, lo, parts + lo, len) ||
            sd_rng_fill_u32_at(seed, purpose, 99, 12345, lo, wparts + lo, len) ||
            sd_rng_fill_uniform_at(seed, purpose, 99, 12345, lo, uparts + lo, len))
            ok = 0;
    }
    tap_ok(ok, "piecewise fills succeed");
    tap_ok(memcmp(whole, parts, sizeof whole) == 0, "normal fill is independent of the split");
    tap_ok(memcmp(wwhole, wparts, sizeof wwhole) == 0, "word fill is independent of the split");
    tap_ok(memcmp(uwhole, uparts, sizeof uwhole) == 0, "uniform fill is independent of the split");

    /* As a rank would: every 3rd element range of 37 computed in reverse order. */
    memset(parts, 0, sizeof parts);
    for (size_t lo = (N / 37) * 37;; lo -= 37) {
        size_t len = lo + 37 <= N ? 37 : N - lo;
        sd_rng_fill_normal_at(seed, purpose, 99, 12345, lo, parts + lo, len);
        if (lo == 0)
            break;
    }
    tap_ok(memcmp(whole, parts, sizeof whole) == 0, "normal fill in reverse slices agrees");

    float again[N];
    sd_rng_fill_normal(seed, purpose, 99, 12345, again, N);
    tap_ok(memcmp(whole, again, sizeof whole) == 0, "fills are deterministic");
}

/* Number of equal elements between two 64-element normal fills. */
static int count_equal(uint64_t seed_a, uint32_t purpose_a, uint64_t step_a, uint64_t sample_a,
                       uint64_t seed_b, uint32_t purpose_b, uint64_t step_b, uint64_t sample_b)
{
    float a[64], b[64];
    int same = 0;
    sd_rng_fill_normal(seed_a, purpose_a, step_a, sample_a, a, 64);
    sd_rng_fill_normal(seed_b, purpose_b, step_b, sample_b, b, 64);
    for (int i = 0; i < 64; i++)
        same += a[i] == b[i];
    return same;
}

static void test_stream_independence(void)
{
    const uint64_t seed = 1, step = 10, sample = 20;
    const uint32_t p = SD_RNG_NOISE;
    tap_ok(count_equal(seed, p, step, sample, seed, p, step, sample) == 64, "same stream, same numbers");
    tap_ok(count_equal(seed, p, step, sample, seed + 1, p, step, sample) == 0, "seed changes the stream");
    tap_ok(count_equal(seed, p, step, sample, seed | (UINT64_C(1) << 40), p, step, sample) == 0,
           "high seed bits change the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, SD_RNG_TIMESTEP, step, sample) == 0,
           "purpose changes the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, SD_RNG_PURPOSE(p, 1), step, sample) == 0,
           "site changes the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, p, step + 1, sample) == 0, "step changes the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, p, step, sample + 1) == 0, "sample changes the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, p, step, sample + (UINT64_C(1) << 32)) == 0,
           "sample bits above 32 change the stream");
    tap_ok(count_equal(seed, p, step, sample, seed, p, sample, step) == 0,
           "swapping step and sample changes the stream");
}

static void test_limits(void)
{
    float z[8];
    sd_err err;
    tap_ok(sd_rng_check(SD_RNG_MAX_PURPOSE, SD_RNG_MAX_STEP, SD_RNG_MAX_SAMPLE,
                        SD_RNG_MAX_ELEMENTS, &err) == 0, "the limits themselves are accepted");
    tap_ok(sd_rng_check(SD_RNG_MAX_PURPOSE + 1, 0, 0, 0, &err) != 0 && strstr(err.msg, "purpose"),
           "purpose over 16 bits rejected: %s", err.msg);
    tap_ok(sd_rng_check(1, SD_RNG_MAX_STEP + 1, 0, 0, &err) != 0 && strstr(err.msg, "step"),
           "step of 2^32 rejected: %s", err.msg);
    tap_ok(sd_rng_check(1, 0, SD_RNG_MAX_SAMPLE + 1, 0, &err) != 0 && strstr(err.msg, "sample"),
           "sample of 2^48 rejected: %s", err.msg);
    tap_ok(sd_rng_check(1, 0, 0, SD_RNG_MAX_ELEMENTS + 1, &err) != 0,
           "more than 2^34 elements rejected: %s", err.msg);

    for (int i = 0; i < 8; i++)
        z[i] = 42.0f;
    tap_ok(sd_rng_fill_normal_at(1, 1, 0, 0, SD_RNG_MAX_ELEMENTS - 4, z, 4) == 0,
           "the last block of a stream can be filled");
    tap_ok(sd_rng_fill_normal_at(1, 1, 0, 0, SD_RNG_MAX_ELEMENTS - 4, z, 5) == -1 && z[4] == 42.0f,
           "a fill past the end fails and writes nothing there");
    tap_ok(sd_rng_fill_normal_at(1, 1, 0, 0, UINT64_MAX, z, SIZE_MAX) == -1,
           "offset + n overflow is rejected");
    for (int i = 0; i < 8; i++)
        z[i] = 42.0f;
    tap_ok(sd_rng_fill_normal(1, 1, SD_RNG_MAX_STEP + 1, 0, z, 8) == -1 && z[0] == 42.0f,
           "a fill with step 2^32 fails instead of wrapping");
    tap_ok(sd_rng_fill_uniform(1, 1, 0, SD_RNG_MAX_SAMPLE + 1, z, 8) == -1,
           "a fill with sample 2^48 fails instead of wrapping");
    tap_ok(sd_rng_fill_uniform(1, 0x10000, 0, 0, z, 8) == -1, "a fill with purpose 2^16 fails");
    tap_ok(sd_rng_fill_normal(1, 1, 0, 0, z, 0) == 0, "an empty fill succeeds");
}

static void test_below(void)
{
    enum { K = 1000 };
    const size_t draws = 1000000;
    static unsigned counts[K];
    int in_range = 1;
    for (size_t i = 0; i < draws; i++) {
        uint32_t t = sd_rng_below(77, SD_RNG_TIMESTEP, i / 64, i % 64, 0, K);
        if (t >= K)
            in_range = 0;
        else
            counts[t]++;
    }
    tap_ok(in_range, "timesteps lie in [0, 1000)");
    double expect = (double)draws / K, chi2 = 0;
    for (int k = 0; k < K; k++)
        chi2 += (counts[k] - expect) * (counts[k] - expect) / expect;
    /* chi-square with 999 degrees of freedom: mean 999, sd sqrt(2 * 999) ~= 44.7. */
    tap_ok(chi2 > 999 - 5 * 44.7 && chi2 < 999 + 5 * 44.7, "timestep chi-square %.1f (df 999)", chi2);

    int det = 1;
    for (uint32_t i = 0; i < 1000; i++)
        if (sd_rng_below(77, SD_RNG_TIMESTEP, 3, i, 0, K) != sd_rng_below(77, SD_RNG_TIMESTEP, 3, i, 0, K))
            det = 0;
    tap_ok(det, "bounded draws are deterministic");

    /* n = 2^31 + 1 rejects about half the words, exercising the retry rounds; the result must
     * still be uniform: both halves [0, 2^30) and [2^30, n) near 50%. */
    const uint32_t big = 0x80000001u;
    size_t low = 0, total = 200000;
    in_range = 1;
    for (size_t i = 0; i < total; i++) {
        uint32_t v = sd_rng_below(5, SD_RNG_USER, 1, i, (uint32_t)(i % 3), big);
        if (v >= big)
            in_range = 0;
        low += v < (1u << 30);
    }
    double frac = (double)low / (double)total, sd = sqrt(0.25 / (double)total);
    tap_ok(in_range, "draws below 2^31 + 1 lie in range");
    tap_ok(fabs(frac - 0.5) < 5 * sd, "draws below 2^31 + 1: %.4f in the lower half", frac);

    tap_ok(sd_rng_below(1, 1, 1, 1, 0, 1) == 0 && sd_rng_below(1, 1, 1, 1, 0, 0) == 0,
           "n = 1 and n = 0 give 0");
    int differ = 0;
    for (uint32_t d = 0; d < 16; d++)
        differ += sd_rng_below(1, SD_RNG_SHUFFLE, 0, 0, d, 0xFFFFFFFFu) !=
                  sd_rng_below(1, SD_RNG_SHUFFLE, 0, 0, d + 1, 0xFFFFFFFFu);
    tap_ok(differ == 16, "successive draws of a stream differ");
}

int main(void)
{
    test_philox_vectors();
    test_conversions();
    test_convention();
    test_uniform_fill();
    test_normal_moments();
    test_split_invariance();
    test_stream_independence();
    test_limits();
    test_below();
    return tap_done();
}
