#!/bin/sh
# Runs the host emulation of the fused attention kernels (tests/gpu/flash_emulate.cpp) on the
# current src/nn/cuda/ops_cuda_attention.cu. Needs python3 and g++ >= 11 (C++20 <barrier>).
# FLASH_EMU_TSAN=1 builds with ThreadSanitizer (slower) to catch missing __syncthreads; the
# emulation runs every shape twice, with cp.async copies landing at issue and at the wait.
# FLASH_EMU_ASAN=1: AddressSanitizer (shared memory is a heap buffer of the launch size).
# Also run by `make check` in the CUDA tree (SD_TEST_CUDA_BUILD=yes), where it is the only
# execution of the fused kernels' code that CI has; skipped in the CPU tree (one run is enough).
. "$(dirname "$0")/emulate_lib.sh" # skips, $top, $tmp
python3 - "$top/src/nn/cuda/ops_cuda_attention.cu" "$tmp/kernels.inc" <<'PY'
import sys
src = open(sys.argv[1]).read().split('\n')
start = next(i for i, l in enumerate(src) if l.startswith('/* ---- tiling'))
end = next(i for i, l in enumerate(src) if l.startswith('/* ---- host side'))
emulated = ('fa_mma(', 'fa_ldsm4(', 'fa_ldsm4t(', 'fa_cp_async16(', 'fa_cp_commit(',
            'fa_cp_wait1(')
out, skip = [], False
for l in src[start:end]:
    if l.startswith('static __device__ __forceinline__ void ') and any(e in l for e in emulated):
        skip = True
    if skip:
        skip = l != '}'
        continue
    if 'extern __shared__' in l:
        l = '    unsigned char *fa_smem = emu_smem();'
    out.append(l)
open(sys.argv[2], 'w').write('\n'.join(out) + '\n')
PY
if [ "${FLASH_EMU_TSAN:-0}" = 1 ]; then
    emulate_run flash_emulate FLASH_EMU_ASAN -pthread -g -fsanitize=thread
else
    emulate_run flash_emulate FLASH_EMU_ASAN -pthread
fi
