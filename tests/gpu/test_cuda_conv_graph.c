/* The cuDNN graph-API convolution forward (SDTRAIN_CUDA_CONV_API=graph) up to the choice of an
 * engine, without a GPU, for every conv shape of the SD2 VAE encoder and U-Net at batch 32
 * (256 px), including the VAE's Downsample2D with its asymmetric padding, BF16 (the dtype the
 * path serves; F32 keeps the legacy API), with and without the residual:
 * - the operation graph must build and finalize (cuDNN >= 9.8 finalizes it without a handle);
 * - cuDNN's heuristics for an H100 described in JSON (no device needed) must list at least one
 *   engine configuration the path takes (precompiled, deterministic, no FFT / Winograd /
 *   reduced precision) whose plan finalizes for that device within the 1 GiB workspace cap.
 *   This is the check that found the residual graph built as (conv + bias) + z getting no
 *   engine at all (2026-11-27, before it ever ran on a GPU); it is built as (conv + z) + bias.
 * The timings and results need a GPU (tests/gpu/test_cuda_conv). Skips without CUDA in the
 * build or with an older cuDNN; the engine checks skip where cuDNN takes no device
 * description. */
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
    /* an H100 SXM (80 GB HBM3) as cuDNN describes a device: from cudaGetDeviceProperties */
    static const char h100[] =
        "{\"schemaVersion\": 1, \"deviceVer\": 900, \"driverVer\": 13000, "
        "\"maxGridSize\": [2147483647, 65535, 65535], \"maxBlockSize\": [1024, 1024, 64], "
        "\"regsPerBlock\": 65536, \"multiProcessorCount\": 132, \"warpSize\": 32, "
        "\"maxSharedMemoryPerBlock\": 49152, \"maxSharedMemoryPerBlockOptin\": 232448, "
        "\"reservedSharedMemoryPerBlock\": 1024, \"maxRegistersPerSM\": 65536, "
        "\"maxCtasPerSM\": 32, \"maxThreadsPerBlock\": 1024, \"maxThreadsPerSM\": 2048, "
        "\"pciDeviceId\": 0, \"isTccDriver\": 0, \"supportCoopLaunch\": 1, "
        "\"totalGlobalMem\": 85017755648, \"smClockRateKHz\": 1980000, "
        "\"memClockRateKHz\": 2619000, \"l2CacheSize\": 52428800, \"cudaDeviceId\": 0, "
        "\"deviceName\": \"NVIDIA H100 80GB HBM3\"}";
    const size_t ws_cap = (size_t)1 << 30;
    char why[400];
    const int probe = sd_cuda_conv_graph_check(&shapes[1].d, SD_BF16, 0, why, sizeof why);
    if (probe == 1)
        tap_skip_all(why);
    for (int k = 0; k < count; k++)
        for (int z = 0; z < 2; z++) {
            const char *what = z ? "conv + residual + bias" : "conv + bias";
            int r = sd_cuda_conv_graph_check(&shapes[k].d, SD_BF16, z, why, sizeof why);
            tap_ok(r == 0, "%s, BF16, %s: the operation graph finalizes%s%s", shapes[k].name, what,
                   r ? ": " : "", r ? why : "");
            int usable = 0, listed = 0;
            r = sd_cuda_conv_graph_engines(&shapes[k].d, SD_BF16, z, h100, ws_cap, &usable,
                                           &listed, why, sizeof why);
            if (r == 1)
                tap_skip("%s, BF16, %s: engines for an H100 not checked: %s", shapes[k].name,
                         what, why);
            else
                tap_ok(r == 0 && usable > 0, "%s, BF16, %s: %d of the %d engine configurations "
                       "cuDNN lists for an H100 are usable%s%s", shapes[k].name, what, usable,
                       listed, why[0] ? "; " : "", why);
        }
    /* the check has teeth: cuDNN validates the shapes it is given (an output one row short) */
    sd_conv2d_desc bad = shapes[1].d;
    bad.h_out -= 1;
    const int r = sd_cuda_conv_graph_check(&bad, SD_BF16, 0, why, sizeof why);
    tap_ok(r == -1, "an output height that does not follow from the convolution is refused (%s)",
           r == -1 ? why : "accepted");
    return tap_done();
}
