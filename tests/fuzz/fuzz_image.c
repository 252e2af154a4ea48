/* libFuzzer entry: decode an image from the input buffer, then resize, crop and normalize it.
 * Build and run: tests/fuzz/run_fuzz.sh image [SECONDS]. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/image.h"
#include "sdtrain/transform.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Invariants the library promises; a violation aborts so that libFuzzer keeps the input. */
#define FUZZ_ASSERT(c)                                                                         \
    do {                                                                                       \
        if (!(c)) {                                                                            \
            fprintf(stderr, "fuzz_image: invariant failed: %s (line %d)\n", #c, __LINE__);     \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static sd_image_decoder *dec;
    static sd_image img = SD_IMAGE_INIT;
    static sd_resize_ws ws;
    static uint8_t out[64 * 64 * 3];
    static float norm[64 * 64 * 3];
    sd_image_opts o;
    sd_image_info info;
    sd_image_status st, pst;
    sd_err err;

    if (!dec && !(dec = sd_image_decoder_new()))
        abort();
    sd_image_opts_default(&o);
    /* the options vary with the input length, so every input exercises one combination */
    o.exif_transpose = (int)(size & 1);
    o.alpha = (size >> 1) & 1 ? SD_ALPHA_WHITE : SD_ALPHA_DROP;
    o.strict_jpeg = !((size >> 2) & 1);
    o.max_pixels = 1 << 22; /* keeps each run small; the limit logic is what is exercised */
    o.resize_to = 64;       /* sizes the transform below refuses (1 x 600000) are refused here */

    memset(&err, 0, sizeof err);
    pst = sd_image_probe(data, size, "fuzz", &o, &info, &err);
    FUZZ_ASSERT(pst == SD_IMG_OK || err.msg[0] != 0);
    st = sd_image_decoder_run(dec, data, size, "fuzz", &o, &img, &err);
    FUZZ_ASSERT(st >= 0 && st < SD_IMG_STATUS_COUNT);
    FUZZ_ASSERT(strcmp(sd_image_status_name(st), "?") != 0);
    if (st != SD_IMG_OK) {
        FUZZ_ASSERT(img.width == 0 && img.height == 0);
        FUZZ_ASSERT(strncmp(err.msg, "fuzz: ", 6) == 0);
        return 0;
    }
    /* a decoded image passed the header checks the probe makes */
    FUZZ_ASSERT(pst == SD_IMG_OK);
    FUZZ_ASSERT(img.width >= 1 && img.height >= 1);
    FUZZ_ASSERT((int64_t)img.width * img.height <= o.max_pixels);
    FUZZ_ASSERT((img.width == info.width && img.height == info.height) ||
                (img.width == info.height && img.height == info.width && img.orientation >= 5));
    FUZZ_ASSERT(img.capacity >= (size_t)img.width * img.height * 3);
    {
        const int res[2] = {64, 7};
        for (int i = 0; i < 2; i++) {
            sd_transform_opts to = {res[i], (sd_pass_order)((size >> 3) % 3)};
            FUZZ_ASSERT(sd_transform_rgb8(img.data, img.width, img.height, &to, out, &ws, &err) == 0);
            sd_normalize_rgb8(out, res[i], res[i], i ? SD_LAYOUT_CHW : SD_LAYOUT_HWC, norm);
            for (int k = 0; k < res[i] * res[i] * 3; k++)
                FUZZ_ASSERT(norm[k] >= -1.0f && norm[k] <= 1.0f);
        }
    }
    return 0;
}
