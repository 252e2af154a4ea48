/* Counter-based random numbers (Philox4x32-10) whose streams depend only on (seed, purpose, step, sample). */
#ifndef SDTRAIN_RNG_H
#define SDTRAIN_RNG_H

/*
 * Why counter-based: every random number used in training is a pure function of its
 * coordinates, so the noise, timestep and dropout of global sample i at step s come out the
 * same whatever the number of ranks, GPUs or threads, and whichever of them computes it.
 * There is no generator state to save in checkpoints or to keep in step across ranks.
 *
 * Generator: Philox4x32 with 10 rounds (Salmon, Moraes, Dror, Shaw, "Parallel random numbers:
 * as easy as 1, 2, 3", SC'11), bit-identical to Random123's philox4x32_10: it passes the
 * known-answer vectors of Random123's tests/kat_vectors (see tests/unit/test_rng.c).
 *
 * Stream convention (one Philox call = one "block" of four 32-bit words):
 *
 *   key[0] = seed bits 0..31          key[1] = seed bits 32..63
 *   ctr[0] = block index within the stream (word w lives in block w/4, lane w%4)
 *   ctr[1] = purpose (bits 0..15) | sample bits 32..47 (bits 16..31)
 *   ctr[2] = sample bits 0..31
 *   ctr[3] = step bits 0..31
 *
 * so a stream is named by (seed, purpose, step, sample), and holds 2^32 blocks. Limits:
 *   purpose < 2^16   (tag in bits 0..7, "site" in bits 8..15: SD_RNG_PURPOSE below)
 *   step    < 2^32   (SD_RNG_MAX_STEP; 4 billion optimizer steps)
 *   sample  < 2^48   (SD_RNG_MAX_SAMPLE; room for dataset indices beyond 2^32, e.g. LAION-5B)
 *   element < 2^34   (SD_RNG_MAX_ELEMENTS words, uniforms or normals per stream)
 * The fill functions check these and fail (return -1, write nothing) rather than wrap, since a
 * wrapped field would silently reuse another stream's numbers. The scalar and inline functions
 * cannot report errors (they also run on the GPU): they reduce each field modulo its width, so
 * validate the extremes of a run once with sd_rng_check() (largest step, largest sample
 * index, largest element count) before using them.
 *
 * Which numbers a request gets:
 *   - words: word w of a stream is lane w%4 of block w/4;
 *   - uniform floats: element e is sd_u32_to_unit_float_co(word e), in [0, 1);
 *   - normals: the four normals of block b are sd_box_muller4() of the four words of block b,
 *     so element e is lane e%4 of block e/4. A slice [k, k+m) is therefore the same whether it
 *     is generated alone (with offset k) or as part of a larger fill;
 *   - bounded integers: draw d, attempt a (Lemire's rejection) uses lane a%4 of block
 *     d + (a/4) * 2^24; see sd_rng_below().
 * Use one kind of request per (purpose, site) stream: a fill and bounded draws on the same
 * stream would reuse each other's words.
 *
 * Host/GPU agreement: the Philox words and the uniform floats are exact integer/power-of-two
 * arithmetic and agree bit for bit everywhere. Normals use logf, sqrtf, sinf, cosf: sqrtf is
 * correctly rounded on both sides (nvcc's default -prec-sqrt=true), but glibc's and CUDA's
 * logf/sinf/cosf may differ in the last unit in the last place (CUDA documents up to 1 ulp
 * for logf and 2 ulp for sinf/cosf), so GPU normals agree with CPU ones to a few ulp, not
 * bit for bit. glibc's logf/sinf/cosf are not guaranteed correctly rounded either, so CPU
 * normals are bit-reproducible for one libm: across the ranks and threads of a job (all run
 * the same binary and library), which is what the rank-independence above needs, but not
 * necessarily across glibc versions. Never compile kernels that use these with
 * --use_fast_math (it swaps in the __logf/__sinf intrinsics, which are much less accurate).
 * Every float operation is a single rounded * or library call with no a*b+c pattern, so FMA
 * contraction (on by default in nvcc, and in GCC outside strict ISO modes) cannot change
 * results.
 */

#include <stddef.h>
#include <stdint.h>

/* Marks inline functions that CUDA kernels call too. */
#ifndef SD_HOSTDEV
#ifdef __CUDACC__
#define SD_HOSTDEV __host__ __device__
#else
#define SD_HOSTDEV
#endif
#endif

#include <math.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a stream is for: the low 8 bits of a purpose. 0 is left unused so that no real stream
 * starts at the all-zero counter. Values 9..127 are free for future project use, 128..255 for
 * tests and experiments. */
enum sd_rng_tag {
    SD_RNG_NOISE = 1,        /* diffusion noise epsilon added to the latents */
    SD_RNG_TIMESTEP = 2,     /* diffusion timestep of each sample */
    SD_RNG_DROPOUT = 3,      /* dropout masks (site = which dropout layer) */
    SD_RNG_LATENT = 4,       /* sampling z = mean + std * eps from the VAE posterior */
    SD_RNG_SHUFFLE = 5,      /* data order */
    SD_RNG_INIT = 6,         /* parameter initialisation (sample = parameter tensor index) */
    SD_RNG_CAPTION_DROP = 7, /* replacing captions by the empty one (classifier-free guidance) */
    SD_RNG_AUGMENT = 8,      /* crops and flips */
    SD_RNG_USER = 128        /* first tag for tests and experiments */
};

/* A purpose = tag plus an 8-bit site, for when one tag needs several independent streams per
 * (step, sample), e.g. one per dropout layer. */
#define SD_RNG_PURPOSE(tag, site) ((uint32_t)(tag) | ((uint32_t)(site) << 8))

#define SD_RNG_MAX_PURPOSE UINT32_C(0xFFFF)
#define SD_RNG_MAX_STEP UINT64_C(0xFFFFFFFF)
#define SD_RNG_MAX_SAMPLE UINT64_C(0xFFFFFFFFFFFF)
/* Elements (words, uniforms, normals) per stream: 2^32 blocks of 4. */
#define SD_RNG_MAX_ELEMENTS (UINT64_C(1) << 34)
/* Bounded draws per stream: the top 8 bits of the block index count retry rounds. */
#define SD_RNG_MAX_DRAW (UINT32_C(1) << 24)

/* ---- Philox4x32-10 -------------------------------------------------------------------- */

#define SD_PHILOX_M0 UINT32_C(0xD2511F53)
#define SD_PHILOX_M1 UINT32_C(0xCD9E8D57)
#define SD_PHILOX_W0 UINT32_C(0x9E3779B9) /* golden ratio */
#define SD_PHILOX_W1 UINT32_C(0xBB67AE85) /* sqrt(3) - 1 */

/* One Philox S-box round on x, with round key k. */
static inline SD_HOSTDEV void sd_philox4x32_round(uint32_t x[4], const uint32_t k[2])
{
    uint64_t p0 = (uint64_t)SD_PHILOX_M0 * x[0];
    uint64_t p1 = (uint64_t)SD_PHILOX_M1 * x[2];
    uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k[0];
    uint32_t y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k[1];
    x[0] = y0;
    x[1] = (uint32_t)p1;
    x[2] = y2;
    x[3] = (uint32_t)p0;
}

/* Key schedule: the key for the next round (Weyl sequence). */
static inline SD_HOSTDEV void sd_philox4x32_bumpkey(uint32_t k[2])
{
    k[0] += SD_PHILOX_W0;
    k[1] += SD_PHILOX_W1;
}

/* Philox4x32-10 of counter `ctr` under `key`. `out` may alias `ctr`. */
static inline SD_HOSTDEV void sd_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                                                uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k[2] = {key[0], key[1]};
    sd_philox4x32_round(x, k);
    for (int r = 1; r < 10; r++) {
        sd_philox4x32_bumpkey(k);
        sd_philox4x32_round(x, k);
    }
    out[0] = x[0];
    out[1] = x[1];
    out[2] = x[2];
    out[3] = x[3];
}

/* ---- Words to uniform numbers ---------------------------------------------------------- */

/* [0, 1): the top 24 bits of x times 2^-24, i.e. one of the 2^24 multiples of 2^-24 below 1,
 * each with probability 2^-24. 24 bits because that is float's precision: the scaling is exact,
 * so the result is the same on every machine. Largest value 1 - 2^-24. */
static inline SD_HOSTDEV float sd_u32_to_unit_float_co(uint32_t x)
{
    return (float)(x >> 8) * 5.9604644775390625e-8f; /* 2^-24 */
}

/* (0, 1]: (top 24 bits of x, plus 1) times 2^-24, exact like the above. For log(u) in
 * Box-Muller: u is never 0 (smallest 2^-24, so |normal| <= sqrt(48 ln 2) ~= 5.77; the tail
 * beyond has probability ~8e-9 and is simply never produced). u = 1 gives a zero normal. */
static inline SD_HOSTDEV float sd_u32_to_unit_float_oc(uint32_t x)
{
    return (float)((x >> 8) + 1u) * 5.9604644775390625e-8f;
}

/* [0, 1) as a double: the 53 top bits of hi:lo times 2^-53, exact. */
static inline SD_HOSTDEV double sd_u32x2_to_unit_double_co(uint32_t hi, uint32_t lo)
{
    uint64_t bits = (((uint64_t)hi << 32) | lo) >> 11;
    return (double)bits * 1.1102230246251565404e-16; /* 2^-53 */
}

/* (0, 1] as a double: (53 top bits of hi:lo, plus 1) times 2^-53, exact. */
static inline SD_HOSTDEV double sd_u32x2_to_unit_double_oc(uint32_t hi, uint32_t lo)
{
    uint64_t bits = (((uint64_t)hi << 32) | lo) >> 11;
    return (double)(bits + 1u) * 1.1102230246251565404e-16;
}

/* ---- Normals ----------------------------------------------------------------------------
 * Box-Muller, in float, exactly as follows for each pair (a, b) = (w[0], w[1]), (w[2], w[3]):
 *   u     = sd_u32_to_unit_float_oc(a)            in (0, 1]
 *   v     = sd_u32_to_unit_float_co(b)            in [0, 1)
 *   r     = sqrtf(-2.0f * logf(u))
 *   theta = 6.28318530717958647692f * v           (2 pi rounded to float)
 *   out   = { r * cosf(theta), r * sinf(theta) }
 * A kernel that calls this function gets the same sequence of operations. */
static inline SD_HOSTDEV void sd_box_muller4(const uint32_t w[4], float out[4])
{
    for (int pair = 0; pair < 2; pair++) {
        float u = sd_u32_to_unit_float_oc(w[2 * pair]);
        float v = sd_u32_to_unit_float_co(w[2 * pair + 1]);
        float r = sqrtf(-2.0f * logf(u));
        float theta = 6.28318530717958647692f * v;
        out[2 * pair] = r * cosf(theta);
        out[2 * pair + 1] = r * sinf(theta);
    }
}

/* ---- The stream convention ------------------------------------------------------------- */

/* The Philox key of a run's seed. */
static inline SD_HOSTDEV void sd_rng_key(uint64_t seed, uint32_t key[2])
{
    key[0] = (uint32_t)seed;
    key[1] = (uint32_t)(seed >> 32);
}

/* The counter of block `block` of stream (purpose, step, sample). Fields beyond their limits
 * are reduced modulo their width (see the top of this file). */
static inline SD_HOSTDEV void sd_rng_counter(uint32_t purpose, uint64_t step, uint64_t sample,
                                             uint32_t block, uint32_t ctr[4])
{
    ctr[0] = block;
    ctr[1] = (purpose & 0xFFFFu) | ((uint32_t)(sample >> 32) << 16);
    ctr[2] = (uint32_t)sample;
    ctr[3] = (uint32_t)step;
}

/* The four words of one block of a stream. */
static inline SD_HOSTDEV void sd_rng_block(uint64_t seed, uint32_t purpose, uint64_t step,
                                           uint64_t sample, uint32_t block, uint32_t out[4])
{
    uint32_t ctr[4], key[2];
    sd_rng_counter(purpose, step, sample, block, ctr);
    sd_rng_key(seed, key);
    sd_philox4x32_10(ctr, key, out);
}

/* Normals 4*block .. 4*block+3 of a stream: what a GPU thread computes for its block. */
static inline SD_HOSTDEV void sd_rng_normal4(uint64_t seed, uint32_t purpose, uint64_t step,
                                             uint64_t sample, uint32_t block, float out[4])
{
    uint32_t w[4];
    sd_rng_block(seed, purpose, step, sample, block, w);
    sd_box_muller4(w, out);
}

/* Word `word` of a stream (word < SD_RNG_MAX_ELEMENTS). */
static inline SD_HOSTDEV uint32_t sd_rng_uniform_u32(uint64_t seed, uint32_t purpose,
                                                     uint64_t step, uint64_t sample,
                                                     uint64_t word)
{
    uint32_t w[4];
    sd_rng_block(seed, purpose, step, sample, (uint32_t)(word >> 2), w);
    return w[word & 3u];
}

/* Uniform float in [0, 1) for element `index` of a stream, as sd_rng_fill_uniform gives it. */
static inline SD_HOSTDEV float sd_rng_uniform_float(uint64_t seed, uint32_t purpose,
                                                    uint64_t step, uint64_t sample,
                                                    uint64_t index)
{
    return sd_u32_to_unit_float_co(sd_rng_uniform_u32(seed, purpose, step, sample, index));
}

/* Unbiased integer in [0, n) for bounded draw `draw` (< SD_RNG_MAX_DRAW) of a stream, e.g. a
 * timestep with n = 1000. Lemire's multiply-and-reject: attempt a takes word x from lane a%4
 * of block draw + (a/4) * 2^24, forms m = x * n, and accepts m >> 32 unless the low half of m
 * falls below 2^32 mod n. Each attempt is rejected with probability (2^32 mod n) / 2^32 < 1/2
 * (about 2.3e-7 for n = 1000), so the attempt that succeeds, and with it the result, is a
 * pure function of the arguments. After 1024 rejections (probability < 2^-1024) it returns the
 * last attempt's m >> 32. n = 0 gives 0. */
static inline SD_HOSTDEV uint32_t sd_rng_below(uint64_t seed, uint32_t purpose, uint64_t step,
                                               uint64_t sample, uint32_t draw, uint32_t n)
{
    uint32_t threshold = 0;
    int have_threshold = 0;
    uint64_t m = 0;
    if (n == 0)
        return 0;
    for (uint32_t round = 0; round < 256; round++) {
        uint32_t w[4];
        sd_rng_block(seed, purpose, step, sample, (draw & 0xFFFFFFu) | (round << 24), w);
        for (int lane = 0; lane < 4; lane++) {
            m = (uint64_t)w[lane] * n;
            if ((uint32_t)m >= n)
                return (uint32_t)(m >> 32); /* fast path: cannot be below the threshold */
            if (!have_threshold) {
                threshold = (0u - n) % n; /* 2^32 mod n, in 32-bit arithmetic */
                have_threshold = 1;
            }
            if ((uint32_t)m >= threshold)
                return (uint32_t)(m >> 32);
        }
    }
    return (uint32_t)(m >> 32);
}

/* ---- Host functions (src/core/rng.c) --------------------------------------------------- */

/* Checks that stream (purpose, step, sample) exists and holds elements [0, end): returns 0, or
 * -1 with a message naming the field and its limit. */
int sd_rng_check(uint32_t purpose, uint64_t step, uint64_t sample, uint64_t end, sd_err *err);

/* out[i] = normal element offset+i of the stream, i in [0, n). Returns 0, or -1 (writing
 * nothing) when the stream or the range [offset, offset+n) is beyond the limits. Filling
 * [0, n) equals filling [0, k) and then [k, n) with offset k, for any k. */
int sd_rng_fill_normal_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                          uint64_t offset, float *out, size_t n);
int sd_rng_fill_normal(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                       float *out, size_t n);

/* The same for uniform floats in [0, 1) (sd_u32_to_unit_float_co of each word). */
int sd_rng_fill_uniform_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                           uint64_t offset, float *out, size_t n);
int sd_rng_fill_uniform(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                        float *out, size_t n);

/* The same for raw 32-bit words. */
int sd_rng_fill_u32_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                       uint64_t offset, uint32_t *out, size_t n);

#ifdef __cplusplus
}
#endif
#endif
