#!/bin/sh
# Packs what bench/gpu-check.sh needs on a GPU machine that has the CUDA libraries but not this
# project's other dependencies (Open MPI, parallel HDF5, libjpeg-turbo, ...): the CUDA build's
# programs and GPU tests, and every shared library they load except the C runtime and the
# CUDA libraries, into one compressed archive.
#
#   bench/gpu-bundle.sh [BUILD_DIR [OUT_DIR]]     (defaults: build/cuda, .gpu)
#
# Builds BUILD_DIR first (it must be configured with --with-cuda). OUT_DIR/bundle.tar.xz is
# what a GPU session carries (OUT_DIR is git-ignored); there:
#   bash bench/gpu-check.sh --bundle OUT_DIR
set -eu
build=${1:-build/cuda}
out=${2:-.gpu}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
[ -f "$build/Makefile" ] || { echo "gpu-bundle: $build is not a configured build tree (../../configure --with-cuda)" >&2; exit 2; }
grep -q '^SD_TEST_CUDA_BUILD = yes' "$build/Makefile" ||
    { echo "gpu-bundle: $build was not configured with --with-cuda" >&2; exit 2; }

jobs=$(nproc 2>/dev/null || echo 2)
make -C "$build" -j"$jobs" >/dev/null
# the check programs without running the tests
make -C "$build" -j"$jobs" check TESTS= >/dev/null

progs="sdtool sdtrain tests/mpi/st_compare"
for p in "$build"/tests/gpu/* "$build"/bench/*; do
    [ -f "$p" ] && [ -x "$p" ] || continue
    case "$p" in *.o | *.sh | *.log | *.trs) continue ;; esac
    progs="$progs ${p#"$build"/}"
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/sdgpu/build" "$stage/sdgpu/lib"
for p in $progs; do
    mkdir -p "$stage/sdgpu/build/$(dirname "$p")"
    cp "$build/$p" "$stage/sdgpu/build/$p"
    strip --strip-debug "$stage/sdgpu/build/$p" 2>/dev/null || true
    # libraries: not the C runtime (the GPU machine has a newer one) nor CUDA's (its own)
    ldd "$build/$p" | awk '$3 ~ /^\// {print $3}' |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        grep -v -E '/(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl)\.so' |
        while read -r lib; do
            [ -f "$stage/sdgpu/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/sdgpu/lib/"
        done
done
# the build's identity, for the report
{
    echo "revision: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    "$build/sdtool" --version 2>/dev/null | head -3 || true
    grep -E '^(NVCC_GENCODE|CUDA_LIBS) =' "$build/Makefile"
} >"$stage/sdgpu/BUILD-INFO"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz" sdgpu
echo "gpu-bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)): $(echo "$progs" | wc -w) programs, $(ls "$stage/sdgpu/lib" | wc -l) libraries"
