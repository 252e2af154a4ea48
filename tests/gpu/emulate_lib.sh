# Sourced by the host-emulation scripts (tests/gpu/*_emulate.sh), which also run on their own,
# outside `make check`: skips in the CPU tree (the CUDA tree's run is enough) and without
# python3 / g++, then sets $top (the source tree) and $tmp (removed on exit); emulate_run
# builds and runs an emulation, emulate_extract copies the kernels it needs.
set -eu
if [ -n "${top_builddir:-}" ] && [ "${SD_TEST_CUDA_BUILD:-no}" != yes ]; then
    echo "SKIP: the emulation runs in the CUDA tree"
    exit 77
fi
command -v python3 >/dev/null 2>&1 && command -v "${CXX:-g++}" >/dev/null 2>&1 || {
    echo "SKIP: needs python3 and g++"
    exit 77
}
top=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# emulate_run NAME ASAN_VAR [FLAGS...]: compiles tests/gpu/NAME.cpp against $tmp/kernels.inc
# (with AddressSanitizer and UBSan when the variable named ASAN_VAR is 1) and runs it.
emulate_run() {
    name=$1
    eval "asan=\${$2:-0}"
    shift 2
    flags="-std=c++20 -O1 -fno-strict-aliasing -Wno-unknown-pragmas $*"
    [ "$asan" != 1 ] || flags="$flags -g -fsanitize=address,undefined"
    # shellcheck disable=SC2086 # $flags is a list of options
    ${CXX:-g++} $flags -I"$tmp" -o "$tmp/emu" "$top/tests/gpu/$name.cpp"
    "$tmp/emu"
}

# emulate_extract: runs the Python on standard input with macro() and definitions() of
# tests/gpu/extract_kernels.py, cuda_dir (src/nn/cuda) and out_path ($tmp/kernels.inc) defined.
emulate_extract() {
    python3 -c 'import sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv[1])
from extract_kernels import macro, definitions
cuda_dir, out_path = sys.argv[2], sys.argv[3]
exec(sys.stdin.read())' "$top/tests/gpu" "$top/src/nn/cuda" "$tmp/kernels.inc"
}
