/* Host-side fills of the counter-based random streams declared in sdtrain/rng.h. */
#include "sdtrain/rng.h"

#include <inttypes.h>
#include <string.h>

int sd_rng_check(uint32_t purpose, uint64_t step, uint64_t sample, uint64_t end, sd_err *err)
{
    if (purpose > SD_RNG_MAX_PURPOSE)
        return sd_err_set(err, "random stream purpose %" PRIu32 " is beyond the limit %" PRIu32,
                          purpose, (uint32_t)SD_RNG_MAX_PURPOSE);
    if (step > SD_RNG_MAX_STEP)
        return sd_err_set(err, "random stream step %" PRIu64 " is beyond the limit %" PRIu64,
                          step, (uint64_t)SD_RNG_MAX_STEP);
    if (sample > SD_RNG_MAX_SAMPLE)
        return sd_err_set(err, "random stream sample index %" PRIu64 " is beyond the limit %" PRIu64,
                          sample, (uint64_t)SD_RNG_MAX_SAMPLE);
    if (end > SD_RNG_MAX_ELEMENTS)
        return sd_err_set(err, "random stream of %" PRIu64 " elements is longer than the limit %" PRIu64,
                          end, (uint64_t)SD_RNG_MAX_ELEMENTS);
    return 0;
}

/* Range check shared by the fills; written so that offset + n cannot overflow. */
static int range_ok(uint32_t purpose, uint64_t step, uint64_t sample, uint64_t offset, size_t n)
{
    if (offset > SD_RNG_MAX_ELEMENTS || (uint64_t)n > SD_RNG_MAX_ELEMENTS - offset)
        return 0;
    return sd_rng_check(purpose, step, sample, offset + n, NULL) == 0;
}

int sd_rng_fill_normal_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                          uint64_t offset, float *out, size_t n)
{
    size_t done = 0;
    if (!range_ok(purpose, step, sample, offset, n))
        return -1;
    /* Whole blocks are written directly; the partial blocks at either end of an unaligned
     * slice are computed in full and only their wanted lanes copied, which is what makes a
     * slice identical to the same elements of a larger fill. */
    while (done < n) {
        uint64_t element = offset + done;
        uint32_t block = (uint32_t)(element >> 2);
        unsigned lane = (unsigned)(element & 3u);
        size_t take = n - done < 4u - lane ? n - done : 4u - lane;
        if (lane == 0 && take == 4) {
            sd_rng_normal4(seed, purpose, step, sample, block, out + done);
        } else {
            float z[4];
            sd_rng_normal4(seed, purpose, step, sample, block, z);
            memcpy(out + done, z + lane, take * sizeof *z);
        }
        done += take;
    }
    return 0;
}

int sd_rng_fill_normal(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                       float *out, size_t n)
{
    return sd_rng_fill_normal_at(seed, purpose, step, sample, 0, out, n);
}

/* Words [offset, offset+n) of a stream, block by block, as raw words or as uniform floats
 * (exactly one of `words`, `uniforms` is not NULL). */
static int fill_words(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                      uint64_t offset, uint32_t *words, float *uniforms, size_t n)
{
    size_t done = 0;
    if (!range_ok(purpose, step, sample, offset, n))
        return -1;
    while (done < n) {
        uint64_t element = offset + done;
        unsigned lane = (unsigned)(element & 3u);
        size_t take = n - done < 4u - lane ? n - done : 4u - lane;
        uint32_t w[4];
        sd_rng_block(seed, purpose, step, sample, (uint32_t)(element >> 2), w);
        for (size_t i = 0; i < take; i++) {
            if (words)
                words[done + i] = w[lane + i];
            else
                uniforms[done + i] = sd_u32_to_unit_float_co(w[lane + i]);
        }
        done += take;
    }
    return 0;
}

int sd_rng_fill_u32_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                       uint64_t offset, uint32_t *out, size_t n)
{
    return fill_words(seed, purpose, step, sample, offset, out, NULL, n);
}

int sd_rng_fill_uniform_at(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                           uint64_t offset, float *out, size_t n)
{
    return fill_words(seed, purpose, step, sample, offset, NULL, out, n);
}

int sd_rng_fill_uniform(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                        float *out, size_t n)
{
    return sd_rng_fill_uniform_at(seed, purpose, step, sample, 0, out, n);
}
