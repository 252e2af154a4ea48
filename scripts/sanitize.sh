#!/bin/sh
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer: configures and builds
# build/asan (-fsanitize=address,undefined, -O1 -g) and runs `make check` there, then lists every
# sanitizer report the tests left in their logs (a test can pass and still have triggered one).
#
#   bash scripts/sanitize.sh                 # every test (about 15 minutes on 2 cores)
#   bash scripts/sanitize.sh TEST...         # some, e.g. tests/unit/test_unet tests/mpi/train.sh
#
# Leak checking is off (Open MPI's own allocations would drown the report); a failed allocation
# returns NULL instead of aborting, because tests/mpi/check_abort.sh asks for 2^62 bytes on
# purpose. Not part of .ci/run (too slow beside it); run it after changing memory-handling code.
# Exit status: 0 when every test passed and no report was found, 1 otherwise.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2
b=build/asan
[ -x configure ] || autoreconf -fi >/dev/null 2>&1 || { echo "sanitize: autoreconf failed" >&2; exit 2; }
mkdir -p "$b"
if [ ! -f "$b/Makefile" ]; then
    (cd "$b" && ../../configure CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
        LDFLAGS="-fsanitize=address,undefined" >config.out 2>&1) ||
        { tail -20 "$b/config.out"; echo "sanitize: configure failed" >&2; exit 2; }
fi
jobs=$(nproc 2>/dev/null || echo 2)
make -C "$b" -j"$jobs" >"$b/build.out" 2>&1 && make -C "$b" -j"$jobs" check TESTS= >>"$b/build.out" 2>&1 ||
    { tail -20 "$b/build.out"; echo "sanitize: the build failed" >&2; exit 2; }
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1
rm -rf "$b/tests/tmp"
status=0
if [ $# -gt 0 ]; then
    make -C "$b" -k check TESTS="$*" >"$b/check.out" 2>&1 || status=1
else
    make -C "$b" -k check >"$b/check.out" 2>&1 || status=1
fi
grep -E '^# (TOTAL|PASS|SKIP|FAIL|ERROR)' "$b/check.out"
grep -E '^(FAIL|ERROR):' "$b/check.out" | grep -v ' [0-9]* - ' | head -20
reports=$(grep -l -E 'ERROR: AddressSanitizer|runtime error:' "$b"/tests/*/*.log "$b"/tests/tmp/*/* 2>/dev/null)
if [ -n "$reports" ]; then
    status=1
    echo "sanitizer reports in:"
    for f in $reports; do
        echo "  $f"
        grep -m3 -E 'ERROR: AddressSanitizer|runtime error:' "$f" | sed 's/^/    /'
    done
else
    echo "no sanitizer reports"
fi
exit $status
