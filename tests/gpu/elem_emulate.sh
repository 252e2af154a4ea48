#!/bin/sh
# Runs the host emulation (tests/gpu/elem_emulate.cpp) of the row-wise kernels (cuda_internal.h
# "row-wise kernels"): the convolution's padding and cropping and bias (ops_cuda_conv.cu,
# cuda_internal.h), nearest upsampling forward and backward, GEGLU forward and backward, the
# broadcast add, channel concat and split (ops_cuda_elem.cu). Their definitions are extracted by
# name from the current sources, so what runs is the code the GPU would run, launched with the
# backend's own grid helpers and also with a tiny grid-y limit, so the row loops wrap. Each is
# compared with a plain loop over the flat index (the kernels' former form) on shapes with odd
# sizes, 1-16-byte copy chunks and both element types; it says nothing about speed.
# Needs python3 and g++. Run by `make check` in the CUDA tree; skipped in the CPU tree.
. "$(dirname "$0")/emulate_lib.sh" # skips, $top, $tmp
emulate_extract <<'PY'
out = []
src = lambda f: open(cuda_dir + '/' + f).read().split('\n')
internal, elem, conv = src('cuda_internal.h'), src('ops_cuda_elem.cu'), src('ops_cuda_conv.cu')
for m in ('SD_GRID_Y_MAX', 'SD_COL_INDEX', 'SD_ROW_LOOP', 'SD_CUDA_CHUNK_DISPATCH'):
    out += macro(internal, m)
for m in ('SD_SQRT1_2F', 'SD_INV_SQRT_2PIF'):
    out += macro(elem, m)
for lines, names in ((internal, ('sd_cuda_row_threads', 'sd_cuda_row_grid',
                                 'sd_bias_rows_kernel', 'sd_cuda_chunk_bytes')),
                     (elem, ('gelu_f', 'gelu_grad_f', 'nearest_src', 'nearest_first_dst',
                             'geglu_fwd_kernel', 'geglu_bwd_kernel', 'upsample_fwd_kernel',
                             'upsample_bwd_kernel', 'add_bcast_kernel', 'concat_kernel',
                             'split_kernel')),
                     (conv, ('conv_pad_kernel', 'conv_crop_kernel'))):
    for name in names:
        for d in definitions(lines, name):
            out += d + ['']
open(out_path, 'w').write('\n'.join(out) + '\n')
PY
emulate_run elem_emulate ELEM_EMU_ASAN
