#!/bin/sh
# mode = 'sample' on the GPU (doc/sampling.md) against the CPU, on the tiny-sd2 snapshot at 16 px,
# 3 DDIM steps with classifier-free guidance 7.5, 3 prompts x 2 images:
#   1. fp32 (no TF32), the 6 images in one batch (the GPU default of &sample batch_size), decoded
#      by the VAE in one call (decode_batch_size's GPU default): every PNG within 2 levels (of
#      255) of the CPU's (tests/mpi/png_compare);
#   2. one image per call: the same PNG bytes at -np 1 and -np 2 on the GPU (images split over
#      ranks sharing it; the GPU's U-Net is not batch-invariant, so only equal batches give
#      equal bits);
#   3. bf16: runs and writes every image (the difference to the CPU is printed, not held to a
#      bound: with random tiny weights and guidance 7.5 it says little);
#   4. the sigma-space samplers and a non-square size in fp32: Euler ancestral (scaled model
#      input, per-image noise) at 24 x 16 px, DPM-Solver++ 2M with Karras sigmas, DDIM with eta
#      and guidance_rescale, DPM-Solver++ 2M SDE with exponential sigmas, UniPC with Karras
#      sigmas, Heun: every PNG within 2 levels of the CPU's.
# Skips without a CUDA build or a GPU.
SD_TEST_NAME=gpu-sample # not the scratch directory of tests/mpi/sample.sh
. "$top_srcdir/tests/lib.sh"

need_gpu
need_mpi
CMP="$top_builddir/tests/mpi/png_compare"

# sample NAME NP DEVICE PRECISION [BATCH [SCHEDULER [MORE &sample KEYS]]]
sample() {
    DEVICE=$3 tiny_sample_nml "$1" "${6:-ddim}" ", batch_size = ${5:-0}${7:-}" "&train precision = '$4' /"
    mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1" 0
    expect_in "$1" out "wrote 6 image(s)"
}
# compare NAME REF MAXDIFF: every image of NAME against REF's
compare() {
    for p in 0 1 2; do
        for j in 0 1; do
            f="samples/$p-$j.png"
            run "cmp-$1-$p-$j" "$CMP" "$TMP/$1/$f" "$TMP/$2/$f" "$3"
            sed 's/^/  /' "$TMP/cmp-$1-$p-$j.out"
            expect_rc "cmp-$1-$p-$j" 0
        done
    done
}

sample cpu 1 cpu fp32
sample gpu1 1 cuda fp32
expect_in gpu1 out "6 image(s) per denoising call"
expect_in gpu1 out "6 per VAE decode call"
compare gpu1 cpu 2
pass "fp32 on the GPU, 6 images a call: every image within 2 levels of the CPU's"

sample gpu1b1 1 cuda fp32 1
compare gpu1b1 cpu 2
sample gpu2b1 2 cuda fp32 1
for p in 0 1 2; do
    for j in 0 1; do
        cmp -s "$TMP/gpu1b1/samples/$p-$j.png" "$TMP/gpu2b1/samples/$p-$j.png" ||
            fail "GPU: samples/$p-$j.png differs between -np 1 and -np 2"
    done
done
pass "GPU, one image a call: the same PNG bytes at -np 1 and -np 2"

sample gpu16 1 cuda bf16
compare gpu16 cpu 255
pass "bf16 on the GPU writes every image (differences to the CPU printed above)"

for case in "eula euler_a , width = 24, height = 16" "dpmk dpmpp_2m , use_karras_sigmas = .true." \
    "ddimeta ddim , eta = 0.5, guidance_rescale = 0.7" \
    "dpmsde dpmpp_2m_sde , use_exponential_sigmas = .true." "unipc unipc , use_karras_sigmas = .true." \
    "heun heun" "lms lms" "dpm2a dpm2_a , use_karras_sigmas = .true." \
    "dpmppsde dpmpp_sde , use_karras_sigmas = .true."; do
    set -- $case
    gs_case=$1 gs_sched=$2 # lib.sh's helpers set $name
    shift 2
    sample "cpu-$gs_case" 1 cpu fp32 0 "$gs_sched" "$*"
    sample "gpu-$gs_case" 1 cuda fp32 0 "$gs_sched" "$*"
    compare "gpu-$gs_case" "cpu-$gs_case" 2
done
pass "Euler ancestral at 24x16, DPM-Solver++ 2M Karras, DDIM with eta and guidance_rescale, DPM-Solver++ 2M SDE with exponential sigmas, UniPC Karras, Heun, LMS, DPM2 ancestral Karras, DPM++ SDE Karras: fp32 on the GPU within 2 levels of the CPU"
