/* The cuDNN graph-API convolution forward (SDTRAIN_CUDA_CONV_API=graph) up to the choice of an
 * engine, without a GPU: for every conv shape of the SD2 VAE encoder and U-Net at batch 32
 * (256 px), including the VAE's Downsample2D with its asymmetric padding, and in both dtypes,
 * the operation graph conv -> + bias (-> + residual) must build and finalize (cuDNN >= 9.8
 * finalizes it without a handle). This is what runs in CI; the engines, plans and results need a
 * GPU (tests/gpu/test_cuda_conv). Skips without CUDA in the build or with an older cuDNN. */
#include <stdio.h>

#include "sdtrain/ops.h"
#include "tap.h"

typedef struct shape {
    const char *name;
    sd_conv2d_desc d;
} shape;

int main(void)
{
    const int n = 32;
    const shape shapes[] = {
        /* VAE encoder, 256 px */
        {"VAE conv_in 256x256x3 -> 128", sd_conv2d_make(n, 256, 256, 3, 128, 3, 1, 1)},
        {"VAE 3x3 256x256x128", sd_conv2d_make(n, 256, 256, 128, 128, 3, 1, 1)},
        {"VAE Downsample2D 256x256x128", sd_conv2d_make_padded(n, 256, 256, 128, 128, 3, 3, 2, 0, 1, 0, 1)},
        {"VAE 3x3 128x128x128 -> 256", sd_conv2d_make(n, 128, 128, 128, 256, 3, 1, 1)},
        {"VAE 1x1 shortcut 128x128x128 -> 256", sd_conv2d_make(n, 128, 128, 128, 256, 1, 1, 0)},
        {"VAE 3x3 128x128x256", sd_conv2d_make(n, 128, 128, 256, 256, 3, 1, 1)},
        {"VAE Downsample2D 128x128x256", sd_conv2d_make_padded(n, 128, 128, 256, 256, 3, 3, 2, 0, 1, 0, 1)},
        {"VAE 3x3 64x64x512", sd_conv2d_make(n, 64, 64, 512, 512, 3, 1, 1)},
        {"VAE Downsample2D 64x64x512", sd_conv2d_make_padded(n, 64, 64, 512, 512, 3, 3, 2, 0, 1, 0, 1)},
        {"VAE conv_out 32x32x512 -> 8", sd_conv2d_make(n, 32, 32, 512, 8, 3, 1, 1)},
        {"VAE quant_conv 1x1 32x32x8", sd_conv2d_make(n, 32, 32, 8, 8, 1, 1, 0)},
        /* U-Net, 32x32 latents */
        {"U-Net conv_in 32x32x4 -> 320", sd_conv2d_make(n, 32, 32, 4, 320, 3, 1, 1)},
        {"U-Net 3x3 32x32x320", sd_conv2d_make(n, 32, 32, 320, 320, 3, 1, 1)},
        {"U-Net downsample 32x32x320 stride 2", sd_conv2d_make(n, 32, 32, 320, 320, 3, 2, 1)},
        {"U-Net 3x3 8x8x1280", sd_conv2d_make(n, 8, 8, 1280, 1280, 3, 1, 1)},
        {"U-Net 3x3 4x4x1280", sd_conv2d_make(n, 4, 4, 1280, 1280, 3, 1, 1)},
        {"U-Net conv_out 32x32x320 -> 4", sd_conv2d_make(n, 32, 32, 320, 4, 3, 1, 1)},
    };
    const int count = (int)(sizeof shapes / sizeof shapes[0]);
    char why[400];
    const int probe = sd_cuda_conv_graph_check(&shapes[1].d, SD_BF16, 0, why, sizeof why);
    if (probe == 1)
        tap_skip_all(why);
    for (int k = 0; k < count; k++)
        for (int t = 0; t < 2; t++)
            for (int z = 0; z < 2; z++) {
                const sd_dtype dt = t ? SD_BF16 : SD_F32;
                const int r = sd_cuda_conv_graph_check(&shapes[k].d, dt, z, why, sizeof why);
                tap_ok(r == 0, "%s, %s, conv + bias%s: the operation graph finalizes%s%s",
                       shapes[k].name, sd_dtype_name(dt), z ? " + residual" : "",
                       r ? ": " : "", r ? why : "");
            }
    /* the check has teeth: cuDNN validates the shapes it is given (an output one row short) */
    sd_conv2d_desc bad = shapes[1].d;
    bad.h_out -= 1;
    const int r = sd_cuda_conv_graph_check(&bad, SD_BF16, 0, why, sizeof why);
    tap_ok(r == -1, "an output height that does not follow from the convolution is refused (%s)",
           r == -1 ? why : "accepted");
    return tap_done();
}
