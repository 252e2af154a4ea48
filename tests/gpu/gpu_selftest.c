/* GPU self-test: Philox words computed on the GPU equal the host's bit for bit; Box-Muller
 * normals agree to a few ulps (device logf/sinf/cosf may round differently). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "sdtrain/device.h"
#include "sdtrain/rng.h"
#include "tap.h"

int sd_cuda_rng_selftest(uint64_t seed, uint32_t purpose, uint64_t step, uint64_t sample,
                         uint32_t *words, float *normals, size_t n_blocks, char *msg, size_t cap);

int main(void)
{
    enum { BLOCKS = 1 << 16 };
    sd_device_info dev;
    sd_err err;
    char msg[256] = "";
    uint32_t *words = malloc(4 * sizeof(uint32_t) * BLOCKS);
    float *normals = malloc(4 * sizeof(float) * BLOCKS);
    size_t word_mismatch = 0;
    double max_abs = 0.0;

    if (sd_device_resolve("auto", 0, &dev, &err) != 0 || !dev.use_cuda)
        tap_skip_all("no usable GPU");
    tap_diag("device: %s", dev.name);
    tap_ok(sd_cuda_rng_selftest(0x123456789abcdefULL, SD_RNG_PURPOSE(SD_RNG_NOISE, 0), 7, 12345,
                                words, normals, BLOCKS, msg, sizeof msg) == 0,
           "RNG kernel ran (%s)", msg);
    for (uint32_t b = 0; b < BLOCKS; b++) {
        uint32_t w[4];
        float z[4];
        sd_rng_block(0x123456789abcdefULL, SD_RNG_PURPOSE(SD_RNG_NOISE, 0), 7, 12345, b, w);
        sd_rng_normal4(0x123456789abcdefULL, SD_RNG_PURPOSE(SD_RNG_NOISE, 0), 7, 12345, b, z);
        for (int i = 0; i < 4; i++) {
            word_mismatch += w[i] != words[4 * b + i];
            double d = fabs((double)z[i] - (double)normals[4 * b + i]);
            if (d > max_abs)
                max_abs = d;
        }
    }
    tap_ok(word_mismatch == 0, "Philox words identical on GPU and CPU (%zu of %d differ)", word_mismatch,
           4 * BLOCKS);
    tap_ok(max_abs <= 1e-5, "Box-Muller normals agree (max |diff| %.3g)", max_abs);
    free(words);
    free(normals);
    return tap_done();
}
