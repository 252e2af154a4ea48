/* Tensor descriptors and exact fp16/bf16 conversions (see sdtrain/tensor.h). */
#include "sdtrain/tensor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define SD_F16C_PATH 1
#endif

static const struct {
    const char *name;
    size_t size;
} dtype_info[SD_DTYPE_COUNT] = {
    [SD_F32] = {"F32", 4}, [SD_F16] = {"F16", 2}, [SD_BF16] = {"BF16", 2},
    [SD_I32] = {"I32", 4}, [SD_I64] = {"I64", 8}, [SD_U8] = {"U8", 1},
};

static int dtype_valid(sd_dtype dtype)
{
    return (int)dtype >= 0 && dtype < SD_DTYPE_COUNT;
}

size_t sd_dtype_size(sd_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_info[dtype].size : 0;
}

const char *sd_dtype_name(sd_dtype dtype)
{
    return dtype_valid(dtype) ? dtype_info[dtype].name : "?";
}

/* ASCII-only, so that the locale cannot change what names are accepted. */
static int same_ignoring_case(const char *a, const char *b)
{
    for (;; a++, b++) {
        char ca = (*a >= 'a' && *a <= 'z') ? (char)(*a - 'a' + 'A') : *a;
        char cb = (*b >= 'a' && *b <= 'z') ? (char)(*b - 'a' + 'A') : *b;
        if (ca != cb)
            return 0;
        if (ca == '\0')
            return 1;
    }
}

int sd_dtype_from_name(const char *name, sd_dtype *out)
{
    if (!name)
        return -1;
    for (int d = 0; d < SD_DTYPE_COUNT; d++) {
        if (same_ignoring_case(name, dtype_info[d].name)) {
            *out = (sd_dtype)d;
            return 0;
        }
    }
    return -1;
}

int64_t sd_tensor_numel(const sd_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

size_t sd_tensor_nbytes(const sd_tensor *t)
{
    return (size_t)sd_tensor_numel(t) * sd_dtype_size(t->dtype);
}

/* Element count of a shape, or -1 if a dimension is negative or the byte size of `elem_size`
 * bytes per element would not fit in both int64_t and size_t. */
static int64_t checked_numel(int ndim, const int64_t *shape, size_t elem_size)
{
    uint64_t limit = (uint64_t)INT64_MAX < (uint64_t)SIZE_MAX ? (uint64_t)INT64_MAX : (uint64_t)SIZE_MAX;
    uint64_t n = 1;
    limit /= elem_size ? elem_size : 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return -1;
        uint64_t d = (uint64_t)shape[i];
        if (d != 0 && n > limit / d)
            return -1;
        n *= d;
    }
    return (int64_t)n;
}

int sd_tensor_view(sd_tensor *t, void *data, sd_dtype dtype, sd_device device, int ndim,
                   const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    if (ndim < 0 || ndim > SD_TENSOR_MAX_DIMS || !dtype_valid(dtype) || (ndim > 0 && !shape) ||
        checked_numel(ndim, shape, sd_dtype_size(dtype)) < 0)
        return -1;
    t->data = data;
    t->dtype = dtype;
    t->device = device;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    return 0;
}

int sd_tensor_reshape(const sd_tensor *src, int ndim, const int64_t *shape, sd_tensor *out)
{
    int64_t resolved[SD_TENSOR_MAX_DIMS] = {0};
    int infer = -1;
    if (ndim < 0 || ndim > SD_TENSOR_MAX_DIMS || (ndim > 0 && !shape))
        return -1;
    for (int i = 0; i < ndim; i++) {
        resolved[i] = shape[i];
        if (shape[i] == -1) {
            if (infer >= 0)
                return -1; /* two unknowns are ambiguous */
            infer = i;
            resolved[i] = 1;
        }
    }
    int64_t known = checked_numel(ndim, resolved, 1);
    int64_t want = sd_tensor_numel(src);
    if (known < 0)
        return -1;
    if (infer >= 0) {
        if (known == 0 || want % known != 0)
            return -1; /* with a zero dimension elsewhere the unknown is undetermined */
        resolved[infer] = want / known;
    } else if (known != want) {
        return -1;
    }
    sd_tensor t = *src;
    t.ndim = ndim;
    memset(t.shape, 0, sizeof t.shape);
    for (int i = 0; i < ndim; i++)
        t.shape[i] = resolved[i];
    *out = t;
    return 0;
}

const char *sd_shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = 0;
    if (!buf || size == 0)
        return buf;
    buf[0] = '\0';
    /* snprintf returns what it wanted to write; clamping keeps `used` inside the buffer. */
#define SD_SHAPE_APPEND(...)                                                      \
    do {                                                                           \
        if (used < size) {                                                         \
            int wrote_ = snprintf(buf + used, size - used, __VA_ARGS__);           \
            used = wrote_ < 0 ? size : used + (size_t)wrote_;                      \
        }                                                                          \
    } while (0)
    SD_SHAPE_APPEND("[");
    for (int i = 0; i < ndim && shape; i++)
        SD_SHAPE_APPEND("%s%" PRId64, i ? ", " : "", shape[i]);
    SD_SHAPE_APPEND("]");
#undef SD_SHAPE_APPEND
    return buf;
}

int sd_tensor_same_shape(const sd_tensor *a, const sd_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

/* ---- fp16 / bf16 ---------------------------------------------------------------------- */

/* Bit moves through memcpy: the only type pun that is defined in C and that compilers turn
 * into a register move. */
static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float sd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0x1F) /* inf, or NaN made quiet with its payload kept */
        return f32_from_bits(sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0));
    if (exponent != 0) /* normal: rebias 15 -> 127 */
        return f32_from_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
    if (mantissa == 0)
        return f32_from_bits(sign);
    /* Subnormal m * 2^-24: shift the leading 1 up to the implicit position. f32 has room, so
     * the result is a normal float. */
    exponent = 113; /* biased exponent of 2^-14 */
    while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        exponent--;
    }
    return f32_from_bits(sign | (exponent << 23) | ((mantissa & 0x3FFu) << 13));
}

uint16_t sd_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {
        if (ax == 0x7F800000u)
            return sign | 0x7C00u;
        return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
    }
    /* 65520 = 65504 + half an ulp: the tie goes to the even neighbour, 2^16, i.e. infinity. */
    if (ax >= 0x477FF000u)
        return sign | 0x7C00u;
    if (ax >= 0x38800000u) { /* >= 2^-14: a normal half */
        uint32_t h = (ax - 0x38000000u) >> 13; /* rebias 127 -> 15, keep 10 mantissa bits */
        uint32_t rest = ax & 0x1FFFu;
        /* Rounding up may carry into the exponent, which is the right answer. */
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    /* Half subnormal range: the result is round(|f| / 2^-24). At or below 2^-25 (half the
     * smallest subnormal, a tie with zero) it is zero. */
    if (ax <= 0x33000000u)
        return sign;
    uint32_t exponent = ax >> 23;                      /* 103 .. 112 here */
    uint32_t mantissa = (ax & 0x7FFFFFu) | 0x800000u; /* with the implicit bit */
    uint32_t shift = 126u - exponent;                  /* |f| / 2^-24 = mantissa >> shift */
    uint32_t h = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u)))
        h++; /* may become 0x400, the smallest normal: also right */
    return (uint16_t)(sign | h);
}

float sd_bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

uint16_t sd_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)((x >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the lowest kept bit rounds to nearest, ties to even; a carry out of
     * the mantissa bumps the exponent, up to infinity, as it should. */
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* The array conversions use the x86 F16C instructions where the CPU has them (8 values an
 * instruction instead of a branchy scalar routine: loading fp16 weights, reading and writing fp16
 * shards). They give the scalar routines' bits for every input: round to nearest even by the
 * instruction's immediate (not MXCSR), overflow to infinity from 65520 on, NaNs made quiet with
 * the payload's top bits kept, subnormal halves both ways (MXCSR's FTZ does not apply to these
 * conversions; float subnormals, which DAZ would zero, become a signed zero half either way).
 * tests/unit/test_tensor.c checks every half and the rounding boundaries of every half against
 * the scalar routines. */
#ifdef SD_F16C_PATH
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = sd_f16_to_f32(src[i]);
}

__attribute__((target("avx,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < n; i++)
        dst[i] = sd_f32_to_f16(src[i]);
}

/* 1 with F16C and AVX usable (the OS saves the YMM registers), 0 without, -1 not yet asked;
 * SDTRAIN_NO_F16C=1 keeps the scalar routines (for comparisons). Races on the first calls only
 * store the same answer. */
static int f16c_state = -1;

static int f16c_usable(void)
{
    int v = __atomic_load_n(&f16c_state, __ATOMIC_RELAXED);
    if (v < 0) {
        unsigned a, b, c, d;
        const char *off = getenv("SDTRAIN_NO_F16C");
        v = 0;
        if (!(off && *off && strcmp(off, "0") != 0) && __get_cpuid(1, &a, &b, &c, &d) &&
            (c & bit_F16C) && (c & bit_AVX) && (c & bit_OSXSAVE)) {
            uint32_t lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            v = (lo & 6u) == 6u; /* XMM and YMM state enabled */
        }
        __atomic_store_n(&f16c_state, v, __ATOMIC_RELAXED);
    }
    return v;
}
#endif

void sd_f16_simd_enable(int on)
{
#ifdef SD_F16C_PATH
    __atomic_store_n(&f16c_state, -1, __ATOMIC_RELAXED); /* asked again below */
    if (!on)
        __atomic_store_n(&f16c_state, 0, __ATOMIC_RELAXED);
#else
    (void)on;
#endif
}

int sd_f16_simd(void)
{
#ifdef SD_F16C_PATH
    return f16c_usable();
#else
    return 0;
#endif
}

void sd_f16_to_f32_array(const uint16_t *src, float *dst, size_t n)
{
#ifdef SD_F16C_PATH
    if (f16c_usable()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = sd_f16_to_f32(src[i]);
}

void sd_f32_to_f16_array(const float *src, uint16_t *dst, size_t n)
{
#ifdef SD_F16C_PATH
    if (f16c_usable()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = sd_f32_to_f16(src[i]);
}

void sd_bf16_to_f32_array(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sd_bf16_to_f32(src[i]);
}

void sd_f32_to_bf16_array(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = sd_f32_to_bf16(src[i]);
}
