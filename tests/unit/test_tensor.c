/* TAP tests of tensor descriptors, dtype names and the fp16/bf16 conversions. */
#include "sdtrain/tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

/* GCC on x86_64 (12+) and aarch64 has _Float16 with correctly rounded conversions in libgcc or
 * hardware: an independent reference. Without it the nearest-value search below still runs. */
#if defined(__FLT16_MAX__) && defined(__GNUC__)
#define HAVE_REF_HALF 1
__extension__ typedef _Float16 ref_half;
#endif

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* xorshift64*: test inputs only. */
static uint64_t rng_state = UINT64_C(0x9E3779B97F4A7C15);
static uint32_t next_u32(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * UINT64_C(0x2545F4914F6CDD1D)) >> 32);
}

/* ---- references ---- */

/* Values of the non-negative finite halves 0x0000..0x7BFF decoded from the definition, plus
 * 2^16 at 0x7C00 standing for infinity: ties at 65520 then go to the even pattern, 0x7C00. */
static double half_value[0x7C01];
/* The same for bfloat16: 0x0000..0x7F7F, plus 2^128 at 0x7F80. */
static double bf16_value[0x7F81];

static void build_tables(void)
{
    for (uint32_t h = 0; h <= 0x7C00; h++) {
        uint32_t e = h >> 10, m = h & 0x3FF;
        half_value[h] = e == 0 ? ldexp((double)m, -24) : ldexp((double)(m + 1024), (int)e - 25);
    }
    for (uint32_t b = 0; b <= 0x7F80; b++) {
        uint32_t e = b >> 7, m = b & 0x7F;
        bf16_value[b] = e == 0 ? ldexp((double)m, -133) : ldexp((double)(m + 128), (int)e - 134);
    }
}

/* Round-to-nearest-even by searching the table of representable values. */
static uint32_t nearest_pattern(const double *table, uint32_t last, double x)
{
    uint32_t lo = 0, hi = last; /* table[lo] <= x < table[hi] once x is in range */
    if (x >= table[last])
        return last;
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (table[mid] <= x)
            lo = mid;
        else
            hi = mid;
    }
    double below = x - table[lo], above = table[hi] - x;
    if (below < above)
        return lo;
    if (above < below)
        return hi;
    return (lo & 1) ? hi : lo;
}

static uint16_t ref_f32_to_f16(float f)
{
    uint16_t sign = (bits_of(f) >> 31) ? 0x8000 : 0;
    return (uint16_t)(sign | nearest_pattern(half_value, 0x7C00, fabs((double)f)));
}

static uint16_t ref_f32_to_bf16(float f)
{
    uint16_t sign = (bits_of(f) >> 31) ? 0x8000 : 0;
    return (uint16_t)(sign | nearest_pattern(bf16_value, 0x7F80, fabs((double)f)));
}

/* ---- checks of one input; each returns 1 when all references agree ---- */

static long f16_mismatches = 0;
static int check_f32_to_f16(float f)
{
    uint16_t got = sd_f32_to_f16(f);
    int ok = 1;
    if (isnan(f)) {
        ok = (got & 0x7C00) == 0x7C00 && (got & 0x200) && (got >> 15) == (bits_of(f) >> 31);
    } else {
        ok = got == ref_f32_to_f16(f);
    }
#ifdef HAVE_REF_HALF
    ref_half h = (ref_half)f;
    uint16_t hw;
    memcpy(&hw, &h, sizeof hw);
    if (hw != got)
        ok = 0;
#endif
    if (!ok && f16_mismatches++ < 5)
        tap_diag("f32 %08" PRIx32 " -> f16 %04x (reference %04x)", bits_of(f), got,
                 isnan(f) ? 0 : ref_f32_to_f16(f));
    return ok;
}

static long bf16_mismatches = 0;
static int check_f32_to_bf16(float f)
{
    uint16_t got = sd_f32_to_bf16(f);
    int ok;
    if (isnan(f))
        ok = got == (uint16_t)((bits_of(f) >> 16) | 0x40);
    else
        ok = got == ref_f32_to_bf16(f);
    if (!ok && bf16_mismatches++ < 5)
        tap_diag("f32 %08" PRIx32 " -> bf16 %04x", bits_of(f), got);
    return ok;
}

static void test_half_exhaustive(void)
{
    int widen_ok = 1, trip_ok = 1, nan_ok = 1, hw_ok = 1;
    for (uint32_t h = 0; h <= 0xFFFF; h++) {
        float f = sd_f16_to_f32((uint16_t)h);
        uint32_t mag = h & 0x7FFF;
        int is_nan = mag > 0x7C00;
        if (!is_nan) {
            double want = mag == 0x7C00 ? INFINITY : half_value[mag];
            if (h & 0x8000)
                want = -want;
            if ((double)f != want || !signbit(f) != !signbit(want))
                widen_ok = 0;
            if (sd_f32_to_f16(f) != h)
                trip_ok = 0;
        } else {
            /* quiet, same sign, same payload */
            uint16_t back = sd_f32_to_f16(f);
            if (!isnan(f) || back != (uint16_t)(h | 0x200))
                nan_ok = 0;
        }
#ifdef HAVE_REF_HALF
        ref_half r;
        uint16_t hh = (uint16_t)h;
        memcpy(&r, &hh, sizeof r);
        if (bits_of((float)r) != bits_of(f))
            hw_ok = 0;
#endif
    }
    tap_ok(widen_ok, "all non-NaN f16 widen to their exact value");
    tap_ok(trip_ok, "all non-NaN f16 survive f16 -> f32 -> f16");
    tap_ok(nan_ok, "f16 NaNs come back as quiet NaNs with sign and payload kept");
#ifdef HAVE_REF_HALF
    tap_ok(hw_ok, "f16 -> f32 matches _Float16 for all 65536 patterns");
#else
    (void)hw_ok;
    tap_ok(1, "f16 -> f32 vs _Float16 # SKIP no _Float16");
#endif
}

static void test_bf16_exhaustive(void)
{
    int widen_ok = 1, trip_ok = 1, nan_ok = 1;
    for (uint32_t b = 0; b <= 0xFFFF; b++) {
        float f = sd_bf16_to_f32((uint16_t)b);
        uint32_t mag = b & 0x7FFF;
        if (bits_of(f) != b << 16)
            widen_ok = 0;
        if (mag > 0x7F80) {
            if (!isnan(f) || sd_f32_to_bf16(f) != (uint16_t)(b | 0x40))
                nan_ok = 0;
        } else {
            double want = mag == 0x7F80 ? INFINITY : bf16_value[mag];
            if (fabs((double)f) != want || sd_f32_to_bf16(f) != b)
                trip_ok = 0;
        }
    }
    tap_ok(widen_ok, "all bf16 widen by a 16-bit shift");
    tap_ok(trip_ok, "all non-NaN bf16 have their exact value and survive the round trip");
    tap_ok(nan_ok, "bf16 NaNs come back as quiet NaNs with sign and payload kept");
}

static void test_narrowing(void)
{
    /* Named edge cases with their expected half patterns. */
    const struct {
        uint32_t f32;
        uint16_t f16;
        const char *what;
    } edges[] = {
        {0x00000000, 0x0000, "+0"},
        {0x80000000, 0x8000, "-0"},
        {0x3F800000, 0x3C00, "1"},
        {0xC0000000, 0xC000, "-2"},
        {0x477FE000, 0x7BFF, "65504, the largest half"},
        {0x477FEFFF, 0x7BFF, "just below 65520 rounds down"},
        {0x477FF000, 0x7C00, "65520 ties to infinity"},
        {0x47800000, 0x7C00, "65536 overflows"},
        {0x7F7FFFFF, 0x7C00, "FLT_MAX overflows"},
        {0xFF7FFFFF, 0xFC00, "-FLT_MAX overflows to -inf"},
        {0x7F800000, 0x7C00, "+inf"},
        {0xFF800000, 0xFC00, "-inf"},
        {0x38800000, 0x0400, "2^-14, the smallest normal"},
        {0x387FC000, 0x03FF, "largest subnormal"},
        {0x387FE000, 0x0400, "tie between largest subnormal and smallest normal goes even"},
        {0x33800000, 0x0001, "2^-24, the smallest subnormal"},
        {0x33000000, 0x0000, "2^-25 ties to zero"},
        {0x33000001, 0x0001, "just above 2^-25 rounds up"},
        {0xB3000001, 0x8001, "negative, just above 2^-25"},
        {0x33C00000, 0x0002, "1.5 * 2^-24 ties to even (2)"},
        {0x34200000, 0x0002, "2.5 * 2^-24 ties to even (2)"},
        {0x00000001, 0x0000, "the smallest f32 subnormal"},
        {0x3F801000, 0x3C00, "1 + 2^-11 ties to even (1)"},
        {0x3F803000, 0x3C02, "1 + 3 * 2^-11 ties to even (1 + 2^-9)"},
        {0x3F801001, 0x3C01, "just above a tie rounds up"},
        {0x7FC00000, 0x7E00, "quiet NaN"},
        {0x7F800001, 0x7E00, "signalling NaN with a low payload stays NaN"},
        {0xFFA00000, 0xFF00, "negative signalling NaN keeps its top payload"},
    };
    int edges_ok = 1;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        uint16_t got = sd_f32_to_f16(float_of(edges[i].f32));
        if (got != edges[i].f16 || !check_f32_to_f16(float_of(edges[i].f32))) {
            edges_ok = 0;
            tap_diag("%s: f32 %08" PRIx32 " -> %04x, expected %04x", edges[i].what, edges[i].f32,
                     got, edges[i].f16);
        }
    }
    tap_ok(edges_ok, "f32 -> f16 edge cases (%zu)", sizeof edges / sizeof edges[0]);

    /* Every f32 whose dropped bits sit at or next to a rounding tie, for every sign, exponent
     * and kept mantissa that lands in or near the half range (normal and subnormal). */
    long count = 0;
    int ties_ok = 1;
    for (uint32_t e = 96; e <= 144; e++) {
        uint32_t shift = e >= 113 ? 13 : (e >= 103 ? 126 - e : 24); /* dropped mantissa bits */
        uint32_t half = 1u << (shift - 1);
        for (uint32_t kept = 0; kept < (1u << (23 - (shift < 23 ? shift : 23))); kept++) {
            for (int d = -1; d <= 1; d++) {
                uint32_t mant = ((kept << shift) + half + (uint32_t)d) & 0x7FFFFF;
                uint32_t x = (e << 23) | mant;
                count += 2;
                ties_ok &= check_f32_to_f16(float_of(x));
                ties_ok &= check_f32_to_f16(float_of(x | 0x80000000u));
            }
        }
    }
    tap_ok(ties_ok, "f32 -> f16 at and beside every rounding tie (%ld values)", count);

    int stride_ok = 1;
    count = 0;
    for (uint64_t x = 0; x <= 0xFFFFFFFFu; x += 4099, count++)
        stride_ok &= check_f32_to_f16(float_of((uint32_t)x));
    tap_ok(stride_ok, "f32 -> f16 on every 4099th bit pattern (%ld values)", count);

    int random_ok = 1;
    for (int i = 0; i < 1000000; i++) {
        /* random bit patterns with the exponent steered into [-30, 17] half the time */
        uint32_t x = next_u32();
        if (i & 1)
            x = (x & 0x807FFFFFu) | ((uint32_t)(97 + next_u32() % 48) << 23);
        random_ok &= check_f32_to_f16(float_of(x));
    }
    tap_ok(random_ok, "f32 -> f16 on 1e6 random floats");
#ifdef HAVE_REF_HALF
    tap_ok(1, "f32 -> f16 was compared with _Float16 conversion as well");
#else
    tap_ok(1, "f32 -> f16 vs _Float16 # SKIP no _Float16");
#endif
}

static void test_bf16_narrowing(void)
{
    const struct {
        uint32_t f32;
        uint16_t bf16;
        const char *what;
    } edges[] = {
        {0x3F800000, 0x3F80, "1"},
        {0x3F808000, 0x3F80, "1 + 2^-8 ties to even (1)"},
        {0x3F818000, 0x3F82, "1 + 3 * 2^-8 ties to even"},
        {0x3F808001, 0x3F81, "just above a tie rounds up"},
        {0x3F807FFF, 0x3F80, "just below a tie rounds down"},
        {0x7F7F7FFF, 0x7F7F, "below the overflow tie"},
        {0x7F7F8000, 0x7F80, "the overflow tie goes to infinity"},
        {0x7F7FFFFF, 0x7F80, "FLT_MAX overflows"},
        {0xFF800000, 0xFF80, "-inf"},
        {0x00008000, 0x0000, "subnormal tie to zero"},
        {0x00018000, 0x0002, "subnormal tie to even"},
        {0x80000001, 0x8000, "tiny negative rounds to -0"},
        {0x7FC00000, 0x7FC0, "quiet NaN"},
        {0x7F800001, 0x7FC0, "NaN with a low payload stays NaN"},
        {0xFF810000, 0xFFC1, "negative signalling NaN keeps its payload"},
    };
    int edges_ok = 1;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        uint16_t got = sd_f32_to_bf16(float_of(edges[i].f32));
        if (got != edges[i].bf16 || !check_f32_to_bf16(float_of(edges[i].f32))) {
            edges_ok = 0;
            tap_diag("%s: f32 %08" PRIx32 " -> %04x, expected %04x", edges[i].what,
                     edges[i].f32, got, edges[i].bf16);
        }
    }
    tap_ok(edges_ok, "f32 -> bf16 edge cases (%zu)", sizeof edges / sizeof edges[0]);

    int ties_ok = 1;
    for (uint32_t top = 0; top <= 0xFFFF; top++)
        for (int d = -1; d <= 1; d++)
            ties_ok &= check_f32_to_bf16(float_of((top << 16) + 0x8000u + (uint32_t)d));
    tap_ok(ties_ok, "f32 -> bf16 at and beside every tie");
    int random_ok = 1;
    for (int i = 0; i < 1000000; i++)
        random_ok &= check_f32_to_bf16(float_of(next_u32()));
    tap_ok(random_ok, "f32 -> bf16 on 1e6 random floats");
}

static void test_arrays(void)
{
    float src[5] = {1.0f, -0.5f, 65504.0f, 1e-8f, 3.14159265f};
    uint16_t h[5], b[5];
    float back[5];
    sd_f32_to_f16_array(src, h, 5);
    sd_f32_to_bf16_array(src, b, 5);
    int ok = 1;
    for (int i = 0; i < 5; i++)
        ok &= h[i] == sd_f32_to_f16(src[i]) && b[i] == sd_f32_to_bf16(src[i]);
    tap_ok(ok, "array narrowing = scalar narrowing");
    sd_f16_to_f32_array(h, back, 5);
    ok = back[0] == 1.0f && back[1] == -0.5f && back[2] == 65504.0f && back[4] == 3.140625f;
    tap_ok(ok, "f16 array round trip");
    sd_bf16_to_f32_array(b, back, 5);
    tap_ok(back[0] == 1.0f && back[4] == 3.140625f, "bf16 array round trip (pi -> %g)", back[4]);
}

/* The array conversions (F16C where the CPU has it) against the scalar routines, bit for bit:
 * every half at every alignment of the 8-wide loop and its tail; for narrowing, every half's
 * value, the midpoints (ties) to its neighbours and the floats one and two ulps either side, both
 * signs, then 1e6 random floats (NaNs with all kinds of payloads, subnormals, overflow). */
static void test_arrays_simd_once(void)
{
    enum { N = 65536 + 11 };
    uint16_t *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f);
    int ok = 1;
    tap_diag("fp16 array conversions on %s", sd_f16_simd() ? "F16C" : "the scalar routines");
    for (uint32_t i = 0; i < N; i++)
        h[i] = (uint16_t)(i * 40503u); /* every pattern, shuffled; the last 11 again */
    for (int off = 0; off < 8; off++) {
        sd_f16_to_f32_array(h + off, f, N - (size_t)off);
        for (size_t i = 0; i + (size_t)off < N; i++)
            ok &= bits_of(f[i]) == bits_of(sd_f16_to_f32(h[i + (size_t)off]));
    }
    tap_ok(ok, "f16 -> f32 array = scalar for every half, at every offset");

    size_t n = 0;
    float *in = malloc((size_t)0x7C00 * 2 * 7 * sizeof *in);
    uint16_t *out = malloc((size_t)0x7C00 * 2 * 7 * sizeof *out);
    for (uint32_t hv = 0; hv < 0x7C00; hv++)
        for (int neg = 0; neg < 2; neg++) {
            const uint32_t sign = neg ? 0x80000000u : 0u;
            uint32_t b = bits_of(sd_f16_to_f32((uint16_t)hv));
            /* the next half up; past the largest, 2^16 (the tie at 65520 goes to infinity) */
            double up = hv + 1 < 0x7C00 ? (double)sd_f16_to_f32((uint16_t)(hv + 1)) : 65536.0;
            uint32_t mid = bits_of((float)(((double)sd_f16_to_f32((uint16_t)hv) + up) / 2));
            in[n++] = float_of(b | sign);
            for (int d = -2; d <= 2; d++)
                in[n++] = float_of((uint32_t)((int64_t)mid + d) | sign);
            in[n++] = float_of((b ? b - 1u : 0u) | sign);
        }
    ok = 1;
    sd_f32_to_f16_array(in, out, n);
    for (size_t i = 0; i < n; i++)
        ok &= out[i] == sd_f32_to_f16(in[i]);
    tap_ok(ok, "f32 -> f16 array = scalar at every half, tie and neighbour (%zu values)", n);
    ok = 1;
    for (int rep = 0; rep < 16; rep++) {
        for (size_t i = 0; i < N; i++)
            f[i] = float_of(next_u32());
        sd_f32_to_f16_array(f + rep % 8, h2, N - (size_t)(rep % 8));
        for (size_t i = 0; i + (size_t)(rep % 8) < N; i++)
            ok &= h2[i] == sd_f32_to_f16(f[i + (size_t)(rep % 8)]);
    }
    tap_ok(ok, "f32 -> f16 array = scalar on 1e6 random floats");
    free(h);
    free(h2);
    free(f);
    free(in);
    free(out);
}

/* Both array paths, where the CPU has F16C: the scalar loops (as without it) and F16C. */
static void test_arrays_simd(void)
{
    const int had = sd_f16_simd();
    sd_f16_simd_enable(0);
    test_arrays_simd_once();
    sd_f16_simd_enable(1);
    if (had)
        test_arrays_simd_once();
    else /* the same count of test points everywhere */
        for (int i = 0; i < 3; i++)
            tap_ok(1, "# SKIP fp16 array conversions on F16C: the CPU has no F16C (or SDTRAIN_NO_F16C)");
}

static void test_dtypes(void)
{
    const char *names[] = {"F32", "F16", "BF16", "I32", "I64", "U8"};
    const size_t sizes[] = {4, 2, 2, 4, 8, 1};
    int ok = 1;
    for (int d = 0; d < SD_DTYPE_COUNT; d++) {
        sd_dtype back;
        if (strcmp(sd_dtype_name((sd_dtype)d), names[d]) != 0 || sd_dtype_size((sd_dtype)d) != sizes[d] ||
            sd_dtype_from_name(names[d], &back) != 0 || back != (sd_dtype)d)
            ok = 0;
    }
    tap_ok(ok, "dtype names, sizes and parsing round-trip");
    sd_dtype d = SD_U8;
    tap_ok(sd_dtype_from_name("bf16", &d) == 0 && d == SD_BF16, "lower-case names accepted");
    tap_ok(sd_dtype_from_name("F64", &d) == -1 && d == SD_BF16, "F64 rejected, output untouched");
    tap_ok(sd_dtype_from_name("F3", &d) == -1 && sd_dtype_from_name("F322", &d) == -1 &&
               sd_dtype_from_name("", &d) == -1 && sd_dtype_from_name(NULL, &d) == -1,
           "prefixes, extensions, empty and NULL rejected");
    tap_ok(sd_dtype_size((sd_dtype)99) == 0 && strcmp(sd_dtype_name((sd_dtype)-1), "?") == 0,
           "invalid dtype: size 0, name ?");
}

static void test_shapes(void)
{
    static float storage[2 * 4 * 64 * 64];
    sd_tensor t, r;
    char buf[64];
    const int64_t shape[] = {2, 4, 64, 64};
    tap_ok(sd_tensor_view(&t, storage, SD_F32, SD_DEV_CPU, 4, shape) == 0, "view");
    tap_ok(sd_tensor_numel(&t) == 32768 && sd_tensor_nbytes(&t) == 131072, "numel and nbytes");
    tap_ok(strcmp(sd_shape_str(t.ndim, t.shape, buf, sizeof buf), "[2, 4, 64, 64]") == 0,
           "shape string %s", buf);
    tap_ok(t.shape[4] == 0 && t.data == storage && t.device == SD_DEV_CPU, "fields set, rest zero");

    tap_ok(sd_tensor_reshape(&t, 3, (const int64_t[]){2, 4, 4096}, &r) == 0 &&
               r.ndim == 3 && r.shape[2] == 4096 && r.data == storage && r.dtype == SD_F32,
           "reshape to [2, 4, 4096]");
    tap_ok(sd_tensor_reshape(&t, 2, (const int64_t[]){-1, 64}, &r) == 0 && r.shape[0] == 512,
           "reshape with -1 infers 512");
    tap_ok(sd_tensor_reshape(&t, 2, (const int64_t[]){-1, 100}, &r) == -1, "-1 that cannot divide fails");
    tap_ok(sd_tensor_reshape(&t, 2, (const int64_t[]){-1, -1}, &r) == -1, "two -1 fail");
    tap_ok(sd_tensor_reshape(&t, 2, (const int64_t[]){2, 100}, &r) == -1 && r.shape[0] == 512,
           "wrong count fails, output untouched");
    tap_ok(sd_tensor_reshape(&t, 2, (const int64_t[]){-2, -16384}, &r) == -1, "negative dims fail");
    tap_ok(sd_tensor_reshape(&t, 9, shape, &r) == -1, "more than 8 dims fail");
    r = t;
    tap_ok(sd_tensor_reshape(&r, 1, (const int64_t[]){32768}, &r) == 0 && r.ndim == 1 &&
               r.shape[1] == 0,
           "in-place reshape to 1-D clears the old dims");

    sd_tensor s;
    tap_ok(sd_tensor_view(&s, storage, SD_BF16, SD_DEV_CUDA, 0, NULL) == 0 &&
               sd_tensor_numel(&s) == 1 && sd_tensor_nbytes(&s) == 2,
           "a scalar has one element");
    tap_ok(strcmp(sd_shape_str(0, NULL, buf, sizeof buf), "[]") == 0, "scalar shape string []");
    tap_ok(sd_tensor_reshape(&s, 3, (const int64_t[]){1, 1, -1}, &r) == 0 && r.shape[2] == 1,
           "scalar reshapes to [1, 1, 1]");
    tap_ok(sd_tensor_view(&s, storage, SD_F32, SD_DEV_CPU, 2, (const int64_t[]){0, 5}) == 0 &&
               sd_tensor_numel(&s) == 0,
           "a zero dimension gives an empty tensor");
    tap_ok(sd_tensor_reshape(&s, 2, (const int64_t[]){-1, 0}, &r) == -1,
           "-1 next to a zero dimension is undetermined");

    tap_ok(sd_tensor_view(&s, storage, SD_F32, SD_DEV_CPU, 9, shape) == -1 && s.ndim == 0 &&
               s.data == NULL,
           "view with 9 dims fails and zeroes the tensor");
    tap_ok(sd_tensor_view(&s, storage, SD_F32, SD_DEV_CPU, 1, (const int64_t[]){-3}) == -1,
           "view with a negative dimension fails");
    tap_ok(sd_tensor_view(&s, storage, SD_I64, SD_DEV_CPU, 2,
                          (const int64_t[]){INT64_C(1) << 31, INT64_C(1) << 31}) == -1,
           "view whose byte size overflows fails");
    tap_ok(sd_tensor_view(&s, storage, (sd_dtype)42, SD_DEV_CPU, 1, shape) == -1,
           "view with an invalid dtype fails");

    sd_tensor u;
    sd_tensor_view(&u, NULL, SD_F16, SD_DEV_CUDA, 4, shape);
    tap_ok(sd_tensor_same_shape(&t, &u), "same shape ignores dtype and device");
    sd_tensor_view(&u, NULL, SD_F32, SD_DEV_CPU, 4, (const int64_t[]){2, 4, 64, 32});
    tap_ok(!sd_tensor_same_shape(&t, &u), "different last dim");
    sd_tensor_view(&u, NULL, SD_F32, SD_DEV_CPU, 3, shape);
    tap_ok(!sd_tensor_same_shape(&t, &u), "different ndim");

    char small[8];
    sd_shape_str(4, shape, small, sizeof small);
    tap_ok(strcmp(small, "[2, 4, ") == 0, "shape string truncates to the buffer (%s)", small);
    const int64_t big[8] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX,
                            INT64_MAX, INT64_MAX};
    char large[256];
    sd_shape_str(8, big, large, sizeof large);
    tap_ok(strlen(large) == 1 + 8 * 19 + 7 * 2 + 1, "8 dims of INT64_MAX fit in 256 bytes");
    sd_shape_str(8, big, large, 5);
    tap_ok(strcmp(large, "[922") == 0, "tiny buffer holds a prefix");
    tap_ok(sd_shape_str(4, shape, NULL, 0) == NULL, "NULL buffer is tolerated");
}

int main(void)
{
    /* The bit-level tests below assume IEEE binary32 floats. */
    if (bits_of(1.0f) != 0x3F800000u || bits_of(-2.5f) != 0xC0200000u)
        tap_skip_all("float is not IEEE binary32");
    build_tables();
    test_dtypes();
    test_shapes();
    test_half_exhaustive();
    test_bf16_exhaustive();
    test_narrowing();
    test_bf16_narrowing();
    test_arrays();
    test_arrays_simd();
    return tap_done();
}
