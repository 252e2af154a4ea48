# Sourced by the host-emulation scripts (tests/gpu/*_emulate.sh), which also run on their own,
# outside `make check`: skips in the CPU tree (the CUDA tree's run is enough) and without
# python3 / g++, then sets $top (the source tree) and $tmp (removed on exit).
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
