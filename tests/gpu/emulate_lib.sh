# Sourced by the host-emulation scripts (tests/gpu/*_emulate.sh), which also run on their own,
# outside `make check`: skips in the CPU tree (the CUDA tree's run is enough) and without
# python3 / g++, then sets $top (the source tree) and $tmp (removed on exit); emulate_run
# builds and runs an emulation.
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
