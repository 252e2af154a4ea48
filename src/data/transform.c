/* The preprocessing transform: Pillow-exact antialiased bilinear resize, torchvision center crop, [-1, 1] floats. */
#include "sdtrain/transform.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Pillow's Resample.c: coefficients are doubles normalised to sum 1, then fixed point with
 * PRECISION_BITS = 32 - 8 - 2 fraction bits; every pass starts its sum at half a unit and
 * shifts right, clipping to 0..255. Everything below evaluates the same expressions in the same
 * order and types, so the results are bit-identical. */
#define PRECISION_BITS (32 - 8 - 2)

static double bilinear_filter(double x)
{
    if (x < 0.0)
        x = -x;
    if (x < 1.0)
        return 1.0 - x;
    return 0.0;
}

/* Pillow's ksize for a resize of in_size to out_size with box [0, in_size] (in0, in1 floats). */
static int coeff_ksize(int in_size, int out_size)
{
    const float in0 = 0.0f, in1 = (float)in_size;
    double filterscale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    return (int)ceil(1.0 /* bilinear support */ * filterscale) * 2 + 1;
}

/* Coefficients of output indices [first, first + count) (precompute_coeffs followed by
 * normalize_coeffs_8bpc). bounds gets (xmin, n) pairs, kk gets ksize ints per index. pre holds
 * ksize doubles. */
static void coeffs_window(int in_size, int out_size, int first, int count, int ksize, int *bounds,
                          int32_t *kk, double *pre)
{
    const float in0 = 0.0f, in1 = (float)in_size;
    double support, scale, filterscale;
    filterscale = scale = (double)(in1 - in0) / out_size;
    if (filterscale < 1.0)
        filterscale = 1.0;
    support = 1.0 * filterscale;
    const double inv_filterscale = 1.0 / filterscale;
    for (int i = 0; i < count; i++) {
        const int xx = first + i;
        double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        int x, xmin, xmax;
        xmin = (int)(center - support + 0.5);
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (x = 0; x < xmax; x++) {
            double w = bilinear_filter((x + xmin - center + 0.5) * inv_filterscale);
            pre[x] = w;
            ww += w;
        }
        if (ww != 0.0) {
            for (x = 0; x < xmax; x++)
                pre[x] /= ww;
        }
        for (; x < ksize; x++)
            pre[x] = 0;
        for (x = 0; x < ksize; x++) {
            if (pre[x] < 0)
                kk[(size_t)i * ksize + x] = (int)(-0.5 + pre[x] * (1 << PRECISION_BITS));
            else
                kk[(size_t)i * ksize + x] = (int)(0.5 + pre[x] * (1 << PRECISION_BITS));
        }
        bounds[2 * i] = xmin;
        bounds[2 * i + 1] = xmax < 0 ? 0 : xmax;
    }
}

static inline uint8_t clip8(int32_t v)
{
    v >>= PRECISION_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

/* Makes every output column of a window use the same number of taps K (the largest), so the
 * inner loop has a fixed length: a column whose taps would run past the input's right edge
 * starts earlier and gets leading zero coefficients. Zero taps add nothing, so the sums are
 * unchanged. Needs K <= in_size, which holds since every column's taps lie inside the input. */
static int pad_taps(int *bounds, int32_t *kk, int ksize, int count, int in_size)
{
    int K = 0;
    for (int j = 0; j < count; j++)
        if (bounds[2 * j + 1] > K)
            K = bounds[2 * j + 1];
    for (int j = 0; j < count; j++) {
        int32_t *k = kk + (size_t)j * ksize;
        int xmin = bounds[2 * j], n = bounds[2 * j + 1];
        int shift = xmin + K > in_size ? xmin + K - in_size : 0;
        if (shift) {
            memmove(k + shift, k, (size_t)n * sizeof *k);
            memset(k, 0, (size_t)shift * sizeof *k);
        }
        for (int t = shift + n; t < K; t++)
            k[t] = 0;
        bounds[2 * j] = xmin - shift;
        bounds[2 * j + 1] = K;
    }
    return K;
}

/* One output row of the horizontal pass with K taps per column (K a constant after inlining). */
static inline void h_row(const uint8_t *restrict in, const int *bounds, const int32_t *kk, int ksize, int cols,
                         int K, uint8_t *restrict out)
{
    for (int j = 0; j < cols; j++) {
        const int32_t *k = kk + (size_t)j * ksize;
        const uint8_t *p = in + (size_t)bounds[2 * j] * 3;
        int32_t s0 = 1 << (PRECISION_BITS - 1), s1 = s0, s2 = s0;
        for (int t = 0; t < K; t++) {
            s0 += p[3 * t + 0] * k[t];
            s1 += p[3 * t + 1] * k[t];
            s2 += p[3 * t + 2] * k[t];
        }
        out[3 * j + 0] = clip8(s0);
        out[3 * j + 1] = clip8(s1);
        out[3 * j + 2] = clip8(s2);
    }
}

/* Scratch bytes h_pass needs for `cols` outputs of K taps over an input row of up to nin pixels. */
static size_t h_scratch_size(int K, int cols, int nin)
{
    const size_t G = (size_t)(K + 7) / 8, cols4 = ((size_t)cols + 3) & ~(size_t)3;
    return cols4 * G * 32 + cols4 * sizeof(int) + 3 * ((size_t)nin + 32) + 3 * cols4 + 64;
}

#if defined(__SSE2__)
/* The horizontal pass with SSE2, on planar copies of each row, exact like v_row_sse2: taps go in
 * groups of 8 with each coefficient split as hi * 2^15 + lo; pmaddwd forms the partial sums of
 * one output in 4 lanes and four outputs are reduced together. Input pixels are deinterleaved
 * into three zero-padded planes first (reads may run 7 bytes past the last tap). */
static inline __m128i hsum4(__m128i a, __m128i b, __m128i c, __m128i d)
{
    __m128i ab = _mm_add_epi32(_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
    __m128i cd = _mm_add_epi32(_mm_unpacklo_epi32(c, d), _mm_unpackhi_epi32(c, d));
    return _mm_add_epi32(_mm_unpacklo_epi64(ab, cd), _mm_unpackhi_epi64(ab, cd));
}

static inline __m128i h_one(const uint8_t *p, const __m128i *klo, const __m128i *khi, int G)
{
    const __m128i zero = _mm_setzero_si128();
    __m128i lo = zero, hi = zero;
    for (int g = 0; g < G; g++) {
        __m128i v = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(p + 8 * g)), zero);
        lo = _mm_add_epi32(lo, _mm_madd_epi16(v, klo[g]));
        hi = _mm_add_epi32(hi, _mm_madd_epi16(v, khi[g]));
    }
    return _mm_add_epi32(_mm_slli_epi32(hi, 15), lo);
}

/* 16 RGB pixels (48 bytes) to three planes of 16, with byte unpacks only (SSE2 has no pshufb):
 * four rounds of a three-way interleave, each moving every byte closer to its plane. */
static inline void deinterleave16(const uint8_t *p, uint8_t *r, uint8_t *g, uint8_t *b)
{
    __m128i t0 = _mm_loadu_si128((const __m128i *)p), t1 = _mm_loadu_si128((const __m128i *)(p + 16)),
            t2 = _mm_loadu_si128((const __m128i *)(p + 32));
    for (int round = 0; round < 4; round++) {
        __m128i u0 = _mm_unpacklo_epi8(t0, _mm_unpackhi_epi64(t1, t1));
        __m128i u1 = _mm_unpacklo_epi8(_mm_unpackhi_epi64(t0, t0), t2);
        __m128i u2 = _mm_unpacklo_epi8(t1, _mm_unpackhi_epi64(t2, t2));
        t0 = u0;
        t1 = u1;
        t2 = u2;
    }
    _mm_storeu_si128((__m128i *)r, t0);
    _mm_storeu_si128((__m128i *)g, t1);
    _mm_storeu_si128((__m128i *)b, t2);
}

static void h_pass_sse2(const uint8_t *src, size_t src_stride, int rows, const int *bounds, const int32_t *kk,
                        int ksize, int K, int cols, uint8_t *dst, size_t dst_stride, uint8_t *scratch)
{
    const int G = (K + 7) / 8, cols4 = (cols + 3) & ~3;
    const __m128i half = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
    __m128i *klo = (__m128i *)scratch, *khi;
    uint8_t *plane[3], *outp[3];
    int *offs;
    int c0 = INT_MAX, c1 = 0, nin;
    for (int j = 0; j < cols; j++) {
        if (bounds[2 * j] < c0)
            c0 = bounds[2 * j];
        if (bounds[2 * j] + K > c1)
            c1 = bounds[2 * j] + K;
    }
    nin = c1 - c0;
    khi = klo + (size_t)cols4 * G;
    offs = (int *)(khi + (size_t)cols4 * G);
    plane[0] = (uint8_t *)(offs + cols4);
    plane[1] = plane[0] + nin + 32;
    plane[2] = plane[1] + nin + 32;
    outp[0] = plane[2] + nin + 32;
    outp[1] = outp[0] + cols4;
    outp[2] = outp[1] + cols4;
    for (int c = 0; c < 3; c++)
        memset(plane[c] + nin, 0, 32);
    /* outputs past cols (up to a multiple of 4) repeat the last one; their results are unused */
    for (int j = 0; j < cols4; j++) {
        const int jj = j < cols ? j : cols - 1;
        const int32_t *k = kk + (size_t)jj * ksize;
        offs[j] = bounds[2 * jj] - c0;
        for (int g = 0; g < G; g++) {
            int16_t lo[8], hi[8];
            for (int i = 0; i < 8; i++) {
                int t = 8 * g + i;
                int32_t v = t < K ? k[t] : 0;
                lo[i] = (int16_t)(v & 0x7fff);
                hi[i] = (int16_t)(v >> 15);
            }
            klo[(size_t)j * G + g] = _mm_loadu_si128((const __m128i *)lo);
            khi[(size_t)j * G + g] = _mm_loadu_si128((const __m128i *)hi);
        }
    }
    for (int y = 0; y < rows; y++) {
        const uint8_t *in = src + (size_t)y * src_stride + (size_t)c0 * 3;
        uint8_t *out = dst + (size_t)y * dst_stride;
        int x = 0;
        for (; x + 16 <= nin; x += 16)
            deinterleave16(in + 3 * x, plane[0] + x, plane[1] + x, plane[2] + x);
        for (; x < nin; x++) {
            plane[0][x] = in[3 * x];
            plane[1][x] = in[3 * x + 1];
            plane[2][x] = in[3 * x + 2];
        }
        for (int c = 0; c < 3; c++) {
            const uint8_t *pl = plane[c];
            for (int j = 0; j < cols4; j += 4) {
                __m128i v0, v1, v2, v3, sum;
                int32_t four;
                if (G == 1) {
                    v0 = h_one(pl + offs[j], klo + j, khi + j, 1);
                    v1 = h_one(pl + offs[j + 1], klo + j + 1, khi + j + 1, 1);
                    v2 = h_one(pl + offs[j + 2], klo + j + 2, khi + j + 2, 1);
                    v3 = h_one(pl + offs[j + 3], klo + j + 3, khi + j + 3, 1);
                } else {
                    v0 = h_one(pl + offs[j], klo + (size_t)j * G, khi + (size_t)j * G, G);
                    v1 = h_one(pl + offs[j + 1], klo + (size_t)(j + 1) * G, khi + (size_t)(j + 1) * G, G);
                    v2 = h_one(pl + offs[j + 2], klo + (size_t)(j + 2) * G, khi + (size_t)(j + 2) * G, G);
                    v3 = h_one(pl + offs[j + 3], klo + (size_t)(j + 3) * G, khi + (size_t)(j + 3) * G, G);
                }
                sum = _mm_srai_epi32(_mm_add_epi32(hsum4(v0, v1, v2, v3), half), PRECISION_BITS);
                sum = _mm_packs_epi32(sum, sum);
                sum = _mm_packus_epi16(sum, sum);
                four = _mm_cvtsi128_si32(sum);
                memcpy(outp[c] + j, &four, 4);
            }
        }
        for (int j = 0; j < cols; j++) {
            out[3 * j] = outp[0][j];
            out[3 * j + 1] = outp[1][j];
            out[3 * j + 2] = outp[2][j];
        }
    }
}
#endif

/* Horizontal pass: `rows` rows of src (stride in bytes, pixel 0 = source column 0) to `cols`
 * output pixels per row. bounds/kk give the taps of each output column, padded to K each.
 * scratch holds h_scratch_size(K, cols, input width) bytes, 16-byte aligned. */
static void h_pass(const uint8_t *src, size_t src_stride, int rows, const int *bounds, const int32_t *kk,
                   int ksize, int K, int cols, uint8_t *dst, size_t dst_stride, uint8_t *scratch)
{
#if defined(__SSE2__)
    if (K >= 2 && K <= 256) { /* sums of v * lo stay below 2^31 up to 256 taps */
        h_pass_sse2(src, src_stride, rows, bounds, kk, ksize, K, cols, dst, dst_stride, scratch);
        return;
    }
#endif
    (void)scratch;
    for (int y = 0; y < rows; y++) {
        const uint8_t *in = src + (size_t)y * src_stride;
        uint8_t *out = dst + (size_t)y * dst_stride;
        switch (K) { /* common tap counts get loops of constant length */
        case 2: h_row(in, bounds, kk, ksize, cols, 2, out); break;
        case 3: h_row(in, bounds, kk, ksize, cols, 3, out); break;
        case 4: h_row(in, bounds, kk, ksize, cols, 4, out); break;
        case 5: h_row(in, bounds, kk, ksize, cols, 5, out); break;
        case 6: h_row(in, bounds, kk, ksize, cols, 6, out); break;
        case 7: h_row(in, bounds, kk, ksize, cols, 7, out); break;
        default: h_row(in, bounds, kk, ksize, cols, K, out); break;
        }
    }
}

/* Vertical pass: output row i sums rows bounds[2i] .. + bounds[2i+1] of src (row r at
 * src + r * src_stride), `bytes` samples per row. acc holds `bytes` ints. */
static void v_row_scalar(const uint8_t *src, size_t src_stride, int ymin, int n, const int32_t *k, size_t b0,
                         size_t bytes, uint8_t *restrict out, int32_t *restrict acc)
{
    for (size_t b = b0; b < bytes; b++)
        acc[b] = 1 << (PRECISION_BITS - 1);
    for (int t = 0; t < n; t++) {
        const uint8_t *restrict row = src + (size_t)(ymin + t) * src_stride;
        const int32_t kt = k[t];
        for (size_t b = b0; b < bytes; b++)
            acc[b] += row[b] * kt;
    }
    for (size_t b = b0; b < bytes; b++)
        out[b] = clip8(acc[b]);
}

#if defined(__SSE2__)
/* 16 samples at a time with SSE2 (every x86-64 has it), exact: each coefficient is split as
 * k = hi * 2^15 + lo with 0 <= lo < 2^15, so that pmaddwd (signed 16 x 16 -> 32 bits, two taps
 * summed per lane) computes sum(v * lo) and sum(v * hi) without rounding. Then
 * sum(v * k) = (sum(v * hi) << 15) + sum(v * lo), which is Pillow's int sum; it fits int32
 * (Pillow's own accumulator), so wrap-around in the partial sums cancels. sum(v * lo) stays
 * below 2^31 for up to 256 taps (255 * 32767 * 256); rows with more taps take the scalar path. */
static void v_row_sse2(const uint8_t *src, size_t src_stride, int ymin, int n, const int32_t *k, size_t bytes,
                       uint8_t *restrict out)
{
    const __m128i zero = _mm_setzero_si128();
    const __m128i half = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
    __m128i klo[128], khi[128]; /* pairs of taps: (k[2p], k[2p+1]) as 16-bit halves */
    const int pairs = (n + 1) / 2;
    for (int p = 0; p < pairs; p++) {
        int32_t a = k[2 * p], c = 2 * p + 1 < n ? k[2 * p + 1] : 0;
        uint32_t lo = (uint32_t)(a & 0x7fff) | (uint32_t)(c & 0x7fff) << 16;
        uint32_t hi = (uint32_t)(uint16_t)(int16_t)(a >> 15) | (uint32_t)(uint16_t)(int16_t)(c >> 15) << 16;
        klo[p] = _mm_set1_epi32((int32_t)lo);
        khi[p] = _mm_set1_epi32((int32_t)hi);
    }
    for (size_t b = 0; b + 16 <= bytes; b += 16) {
        __m128i lo0 = zero, lo1 = zero, lo2 = zero, lo3 = zero, hi0 = zero, hi1 = zero, hi2 = zero, hi3 = zero;
        for (int p = 0; p < pairs; p++) {
            const uint8_t *r0 = src + (size_t)(ymin + 2 * p) * src_stride + b;
            /* an odd last tap pairs with itself under a zero coefficient */
            const uint8_t *r1 = 2 * p + 1 < n ? r0 + src_stride : r0;
            __m128i a = _mm_loadu_si128((const __m128i *)r0), c = _mm_loadu_si128((const __m128i *)r1);
            __m128i al = _mm_unpacklo_epi8(a, zero), ah = _mm_unpackhi_epi8(a, zero);
            __m128i cl = _mm_unpacklo_epi8(c, zero), ch = _mm_unpackhi_epi8(c, zero);
            __m128i x0 = _mm_unpacklo_epi16(al, cl), x1 = _mm_unpackhi_epi16(al, cl);
            __m128i x2 = _mm_unpacklo_epi16(ah, ch), x3 = _mm_unpackhi_epi16(ah, ch);
            lo0 = _mm_add_epi32(lo0, _mm_madd_epi16(x0, klo[p]));
            lo1 = _mm_add_epi32(lo1, _mm_madd_epi16(x1, klo[p]));
            lo2 = _mm_add_epi32(lo2, _mm_madd_epi16(x2, klo[p]));
            lo3 = _mm_add_epi32(lo3, _mm_madd_epi16(x3, klo[p]));
            hi0 = _mm_add_epi32(hi0, _mm_madd_epi16(x0, khi[p]));
            hi1 = _mm_add_epi32(hi1, _mm_madd_epi16(x1, khi[p]));
            hi2 = _mm_add_epi32(hi2, _mm_madd_epi16(x2, khi[p]));
            hi3 = _mm_add_epi32(hi3, _mm_madd_epi16(x3, khi[p]));
        }
#define SD_FINISH(lo, hi)                                                                           \
    _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, 15), lo), half), PRECISION_BITS)
        {
            __m128i s0 = SD_FINISH(lo0, hi0), s1 = SD_FINISH(lo1, hi1);
            __m128i s2 = SD_FINISH(lo2, hi2), s3 = SD_FINISH(lo3, hi3);
            /* saturating packs clip to 0..255 exactly as clip8 does for these small values */
            __m128i w01 = _mm_packs_epi32(s0, s1), w23 = _mm_packs_epi32(s2, s3);
            _mm_storeu_si128((__m128i *)(out + b), _mm_packus_epi16(w01, w23));
        }
#undef SD_FINISH
    }
}
#endif

static void v_pass(const uint8_t *src, size_t src_stride, int out_rows, const int *bounds, const int32_t *kk,
                   int ksize, size_t bytes, uint8_t *dst, size_t dst_stride, int32_t *restrict acc)
{
    for (int i = 0; i < out_rows; i++) {
        const int ymin = bounds[2 * i], n = bounds[2 * i + 1];
        const int32_t *k = kk + (size_t)i * ksize;
        uint8_t *out = dst + (size_t)i * dst_stride;
        size_t done = 0;
#if defined(__SSE2__)
        if (n <= 256 && bytes >= 16) {
            v_row_sse2(src, src_stride, ymin, n, k, bytes, out);
            done = bytes - bytes % 16;
        }
#endif
        if (done < bytes)
            v_row_scalar(src, src_stride, ymin, n, k, done, bytes, out, acc);
    }
}

void sd_resize_ws_free(sd_resize_ws *ws)
{
    if (!ws)
        return;
    free(ws->buf);
    ws->buf = NULL;
    ws->cap = 0;
}

/* Carves aligned pieces out of one scratch block. */
typedef struct carve {
    size_t off;
} carve;
static size_t carve_add(carve *c, size_t bytes)
{
    size_t at = (c->off + 63) & ~(size_t)63;
    c->off = at + bytes;
    return at;
}

static int ws_reserve(sd_resize_ws *ws, size_t bytes, void **out)
{
    if (ws->cap < bytes || !ws->buf) {
        void *p = realloc(ws->buf, bytes ? bytes : 1);
        if (!p)
            return -1;
        ws->buf = p;
        ws->cap = bytes;
    }
    *out = ws->buf;
    return 0;
}

/* Range of input indices that the taps of a window of outputs touch. */
static void taps_range(const int *bounds, int count, int *lo, int *hi)
{
    int a = INT_MAX, b = 0;
    for (int i = 0; i < count; i++) {
        if (bounds[2 * i + 1] == 0)
            continue;
        if (bounds[2 * i] < a)
            a = bounds[2 * i];
        if (bounds[2 * i] + bounds[2 * i + 1] > b)
            b = bounds[2 * i] + bounds[2 * i + 1];
    }
    if (a == INT_MAX)
        a = b = 0;
    *lo = a;
    *hi = b;
}

int sd_resize_vertical_first(int w, int h, int out_w, int out_h, sd_pass_order order)
{
    if (out_h >= h)
        return 0; /* every version: horizontal first unless the height shrinks */
    if (order == SD_PASS_ORDER_PILLOW_12_2)
        return (long long)h > 100LL * w;
    if (order == SD_PASS_ORDER_PILLOW_13)
        return (long long)h - out_h > 2 * ((long long)w - out_w);
    return 0;
}

int sd_resize_bilinear_rgb8(const uint8_t *src, int w, int h, int out_w, int out_h, int x0, int y0,
                            int win_w, int win_h, sd_pass_order order, uint8_t *dst, sd_resize_ws *ws_in,
                            sd_err *err)
{
    int vertical_first;
    const int limit = 1 << 24; /* sizes stay exact as Pillow's float box */
    const int need_h = out_w != w, need_v = out_h != h;
    int ksh = 0, ksv = 0, kh_n = 0;
    size_t o_bh = 0, o_kh = 0, o_bv = 0, o_kv = 0, o_pre = 0, o_tmp = 0, o_acc = 0, o_hs = 0, tmp_bytes = 0,
           acc_n = 0;
    int *bh = NULL, *bv = NULL;
    int32_t *kh = NULL, *kv = NULL;
    double *pre;
    uint8_t *base, *tmp, *hs;
    int32_t *acc;
    carve c = {0};
    sd_resize_ws local = {0};
    sd_resize_ws *ws = ws_in ? ws_in : &local;
    int rc = 0;

    if (!src || !dst || w < 1 || h < 1 || out_w < 1 || out_h < 1 || w > limit || h > limit ||
        out_w > limit || out_h > limit)
        return sd_err_set(err, "resize: invalid sizes %dx%d -> %dx%d", w, h, out_w, out_h);
    if (x0 < 0 || y0 < 0 || win_w < 1 || win_h < 1 || x0 > out_w - win_w || y0 > out_h - win_h)
        return sd_err_set(err, "resize: window %dx%d at (%d, %d) is outside the %dx%d result", win_w,
                          win_h, x0, y0, out_w, out_h);
    vertical_first = sd_resize_vertical_first(w, h, out_w, out_h, order);

    /* scratch: coefficients of both directions, a temp image between passes, sums of one row */
    if (need_h) {
        ksh = coeff_ksize(w, out_w);
        o_bh = carve_add(&c, (size_t)win_w * 2 * sizeof(int));
        o_kh = carve_add(&c, (size_t)win_w * ksh * sizeof(int32_t));
    }
    if (need_v) {
        ksv = coeff_ksize(h, out_h);
        o_bv = carve_add(&c, (size_t)win_h * 2 * sizeof(int));
        o_kv = carve_add(&c, (size_t)win_h * ksv * sizeof(int32_t));
    }
    o_pre = carve_add(&c, (size_t)(ksh > ksv ? ksh : ksv) * sizeof(double) + sizeof(double));
    if (ws_reserve(ws, c.off, (void **)&base) != 0) {
        rc = sd_err_set(err, "resize: cannot allocate %zu bytes of coefficients", c.off);
        goto done;
    }
    pre = (double *)(base + o_pre);
    if (need_h) {
        bh = (int *)(base + o_bh);
        kh = (int32_t *)(base + o_kh);
        coeffs_window(w, out_w, x0, win_w, ksh, bh, kh, pre);
        kh_n = pad_taps(bh, kh, ksh, win_w, w);
    }
    if (need_v) {
        bv = (int *)(base + o_bv);
        kv = (int32_t *)(base + o_kv);
        coeffs_window(h, out_h, y0, win_h, ksv, bv, kv, pre);
    }

    if (!need_h && !need_v) {
        for (int y = 0; y < win_h; y++)
            memcpy(dst + (size_t)y * win_w * 3, src + ((size_t)(y0 + y) * w + x0) * 3, (size_t)win_w * 3);
        goto done;
    }

    if (!vertical_first) {
        /* Pillow's order: horizontal pass over the rows the vertical taps read, then vertical */
        int r0 = y0, r1 = y0 + win_h;
        if (need_v)
            taps_range(bv, win_h, &r0, &r1);
        if (need_h && need_v) {
            tmp_bytes = (size_t)(r1 - r0) * win_w * 3;
            acc_n = (size_t)win_w * 3;
        } else if (need_v) {
            acc_n = (size_t)win_w * 3;
        }
        o_tmp = carve_add(&c, tmp_bytes);
        o_acc = carve_add(&c, acc_n * sizeof(int32_t));
        o_hs = carve_add(&c, need_h ? h_scratch_size(kh_n, win_w, w) : 0);
        if (ws_reserve(ws, c.off, (void **)&base) != 0) {
            rc = sd_err_set(err, "resize: cannot allocate %zu bytes of scratch", c.off);
            goto done;
        }
        hs = base + o_hs;
        /* the block may have moved */
        bh = need_h ? (int *)(base + o_bh) : NULL;
        kh = need_h ? (int32_t *)(base + o_kh) : NULL;
        bv = need_v ? (int *)(base + o_bv) : NULL;
        kv = need_v ? (int32_t *)(base + o_kv) : NULL;
        tmp = base + o_tmp;
        acc = (int32_t *)(base + o_acc);
        if (need_h && need_v) {
            h_pass(src + (size_t)r0 * w * 3, (size_t)w * 3, r1 - r0, bh, kh, ksh, kh_n, win_w, tmp, (size_t)win_w * 3, hs);
            for (int i = 0; i < win_h; i++)
                bv[2 * i] -= r0;
            v_pass(tmp, (size_t)win_w * 3, win_h, bv, kv, ksv, (size_t)win_w * 3, dst, (size_t)win_w * 3, acc);
        } else if (need_h) {
            h_pass(src + (size_t)y0 * w * 3, (size_t)w * 3, win_h, bh, kh, ksh, kh_n, win_w, dst, (size_t)win_w * 3, hs);
        } else {
            v_pass(src + (size_t)x0 * 3, (size_t)w * 3, win_h, bv, kv, ksv, (size_t)win_w * 3, dst,
                   (size_t)win_w * 3, acc);
        }
    } else {
        /* Pillow >= 12.2 for some shapes (sd_resize_vertical_first): vertical pass over the
         * columns the horizontal taps read, then horizontal. need_v holds here (out_h < h). */
        int c0 = x0, c1 = x0 + win_w;
        if (need_h)
            taps_range(bh, win_w, &c0, &c1);
        tmp_bytes = need_h ? (size_t)win_h * (c1 - c0) * 3 : 0;
        acc_n = (size_t)(c1 - c0) * 3;
        o_tmp = carve_add(&c, tmp_bytes);
        o_acc = carve_add(&c, acc_n * sizeof(int32_t));
        o_hs = carve_add(&c, need_h ? h_scratch_size(kh_n, win_w, w) : 0);
        if (ws_reserve(ws, c.off, (void **)&base) != 0) {
            rc = sd_err_set(err, "resize: cannot allocate %zu bytes of scratch", c.off);
            goto done;
        }
        hs = base + o_hs;
        bh = need_h ? (int *)(base + o_bh) : NULL;
        kh = need_h ? (int32_t *)(base + o_kh) : NULL;
        bv = (int *)(base + o_bv);
        kv = (int32_t *)(base + o_kv);
        tmp = base + o_tmp;
        acc = (int32_t *)(base + o_acc);
        if (need_h) {
            v_pass(src + (size_t)c0 * 3, (size_t)w * 3, win_h, bv, kv, ksv, (size_t)(c1 - c0) * 3, tmp,
                   (size_t)(c1 - c0) * 3, acc);
            for (int j = 0; j < win_w; j++)
                bh[2 * j] -= c0;
            h_pass(tmp, (size_t)(c1 - c0) * 3, win_h, bh, kh, ksh, kh_n, win_w, dst, (size_t)win_w * 3, hs);
        } else {
            v_pass(src + (size_t)x0 * 3, (size_t)w * 3, win_h, bv, kv, ksv, (size_t)win_w * 3, dst,
                   (size_t)win_w * 3, acc);
        }
    }
done:
    if (!ws_in)
        sd_resize_ws_free(&local);
    return rc;
}

void sd_resize_short_side_size(int w, int h, int size, int *out_w, int *out_h)
{
    const int shrt = w <= h ? w : h, lng = w <= h ? h : w;
    /* Python: int(requested_new_short * long / short), double division, truncation */
    const int new_long = (int)((double)size * (double)lng / (double)shrt);
    if (w <= h) {
        *out_w = size;
        *out_h = new_long;
    } else {
        *out_w = new_long;
        *out_h = size;
    }
}

/* Python's round() of d / 2.0 for an integer d: halves go to the even neighbour. */
static int round_half_even_half(int d)
{
    int q = d / 2; /* d >= 0 here */
    if (d % 2 == 0)
        return q;
    return (q % 2 == 0) ? q : q + 1; /* q + 0.5 -> the even one of q, q + 1 */
}

void sd_center_crop_offsets(int w, int h, int crop_w, int crop_h, int *left, int *top)
{
    *top = h >= crop_h ? round_half_even_half(h - crop_h) : 0;
    *left = w >= crop_w ? round_half_even_half(w - crop_w) : 0;
}

int sd_transform_size_ok(int64_t w, int64_t h, int resolution)
{
    const int64_t shrt = w <= h ? w : h, lng = w <= h ? h : w;
    if (shrt < 1 || lng > SD_TRANSFORM_MAX_SIDE || resolution < 1 || resolution > SD_TRANSFORM_MAX_SIDE)
        return 0;
    /* the resized long side, int(resolution * long / short), in double: it may not fit an int */
    return (double)resolution * (double)lng / (double)shrt < SD_TRANSFORM_MAX_SIDE + 1.0;
}

int sd_transform_rgb8(const uint8_t *src, int w, int h, const sd_transform_opts *opts, uint8_t *dst,
                      sd_resize_ws *ws, sd_err *err)
{
    int r, nw, nh, left, top;
    if (!opts || opts->resolution < 1 || opts->resolution > (1 << 16))
        return sd_err_set(err, "transform: invalid resolution %d", opts ? opts->resolution : 0);
    if (w < 1 || h < 1 || w > SD_TRANSFORM_MAX_SIDE || h > SD_TRANSFORM_MAX_SIDE)
        return sd_err_set(err, "transform: invalid image size %dx%d", w, h);
    r = opts->resolution;
    if (!sd_transform_size_ok(w, h, r))
        return sd_err_set(err, "transform: a %dx%d image resized to short side %d is too large (a side over %d)",
                          w, h, r, SD_TRANSFORM_MAX_SIDE);
    sd_resize_short_side_size(w, h, r, &nw, &nh);
    sd_center_crop_offsets(nw, nh, r, r, &left, &top);
    return sd_resize_bilinear_rgb8(src, w, h, nw, nh, left, top, r, r, opts->pass_order, dst, ws, err);
}

float sd_normalize_value(uint8_t v)
{
    /* each step rounded to float32, as torch computes ToTensor's div(255) and Normalize's
     * sub_(0.5).div_(0.5) */
    float x = (float)v / 255.0f;
    x = x - 0.5f;
    return x / 0.5f;
}

void sd_normalize_rgb8(const uint8_t *rgb, int w, int h, sd_pixel_layout layout, float *out)
{
    float lut[256];
    const size_t n = (size_t)w * (size_t)h;
    for (int v = 0; v < 256; v++)
        lut[v] = sd_normalize_value((uint8_t)v);
    if (layout == SD_LAYOUT_HWC) {
        for (size_t i = 0; i < n * 3; i++)
            out[i] = lut[rgb[i]];
    } else {
        float *r = out, *g = out + n, *b = out + 2 * n;
        for (size_t i = 0; i < n; i++) {
            r[i] = lut[rgb[3 * i]];
            g[i] = lut[rgb[3 * i + 1]];
            b[i] = lut[rgb[3 * i + 2]];
        }
    }
}
