#!/bin/sh
# Runs the host emulation (tests/gpu/norm_emulate.cpp) of the group-norm statistics and apply
# kernels of src/nn/cuda/ops_cuda_norm.cu and of the objective / cast kernels of
# ops_cuda_elem.cu, on the current sources: the definitions are extracted by name, so what runs
# is the code the GPU would run (with threads of a block as OS threads and a real barrier where
# the kernel synchronizes). It checks the indexing and the "same bits" claims of the variants
# (SDTRAIN_CUDA_GN_APPLY=regs|fast, SDTRAIN_CUDA_GN_STATS=wide) where there is no GPU; it says
# nothing about speed, resources or the hardware intrinsics (__expf is expf here).
# Needs python3 and g++ >= 11 (C++20 <barrier>). Also run by `make check` in the CUDA tree;
# skipped in the CPU tree (one run is enough).
. "$(dirname "$0")/emulate_lib.sh" # skips, $top, $tmp
emulate_extract <<'PY'
out = []
norm = open(cuda_dir + '/ops_cuda_norm.cu').read().split('\n')
for m in ('NORM_ROWS', 'NORM_THREADS', 'NORM_LOOP', 'GN_STAT_THREADS', 'GN_WIDE'):
    out += macro(norm, m)
for name in ('norm_chunks', 'norm_silu', 'norm_silu_fast', 'norm_silu_grad', 'gn_apply_one',
             'gn_dz_one', 'gn_dx_one', 'gn_dz',
             'gn_moments', 'gn_merge',
             'gn_moments_partial_kernel', 'gn_load4', 'gn_moments_partial_wide_kernel',
             'gn_moments_group_kernel', 'gn_apply_kernel', 'pack16', 'gn_sample',
             'gn_sample_at', 'gn_apply_vec_kernel', 'gn_apply_regs_kernel', 'gn_gcd',
             'gn_regs_grid', 'gn_vec_grid', 'gn_vec_ok', 'gn_dx_kernel', 'gn_dx_vec_kernel',
             'gn_dx_regs_kernel'):
    for d in definitions(norm, name):
        out += d + ['']
elem = open(cuda_dir + '/ops_cuda_elem.cu').read().split('\n')
for m in ('GRID_STRIDE_LOOP', 'MSE_THREADS'):
    out += macro(elem, m)
for name in ('cast_f32_kernel', 'cast_to_f32_kernel', 'mse_loss_kernel'):
    for d in definitions(elem, name):
        out += d + ['']
open(out_path, 'w').write('\n'.join(out) + '\n')
PY
emulate_run norm_emulate NORM_EMU_ASAN -pthread
