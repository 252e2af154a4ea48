#!/bin/sh
# Builds tests/fuzz/fuzz_image.c with clang's libFuzzer + ASan + UBSan and fuzzes the image decoder
# and transform for a bounded time, seeded with the golden inputs (tests/image/input).
#
#   tests/fuzz/run_fuzz_image.sh [SECONDS] [extra libFuzzer flags...]     (default 60 s)
#
# Environment: CC (default clang), FUZZ_DIR (build + corpus + crash artifacts; default a fresh
# mktemp -d directory, kept and printed at the end). Exit status: 0 no crash, 1 a crash or leak
# (the reproducer is in FUZZ_DIR/crash-*), 77 no clang with libFuzzer here.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
secs=${1:-60}
[ $# -gt 0 ] && shift
CC=${CC:-clang}
dir=${FUZZ_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sdtrain-fuzz-image.XXXXXX")}
mkdir -p "$dir/corpus"

command -v "$CC" >/dev/null 2>&1 || { echo "SKIP: $CC not found"; exit 77; }
flags="-std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
# shellcheck disable=SC2046,SC2086
if ! $CC $flags -I"$top/include" $(pkg-config --cflags libturbojpeg libpng) \
    "$here/fuzz_image.c" "$top/src/data/image.c" "$top/src/data/transform.c" "$top/src/core/error.c" \
    -o "$dir/fuzz_image" $(pkg-config --libs libturbojpeg libpng) -lm 2>"$dir/build.log"; then
    if grep -q "fuzzer" "$dir/build.log"; then
        cat "$dir/build.log" >&2
        echo "SKIP: $CC cannot link libFuzzer (install clang with its runtime)"
        exit 77
    fi
    cat "$dir/build.log" >&2
    exit 1
fi

echo "fuzzing for ${secs}s in $dir (seeds: $top/tests/image/input)"
rc=0
"$dir/fuzz_image" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=131072 \
    -dict="$here/image.dict" -artifact_prefix="$dir/" -print_final_stats=1 "$@" \
    "$dir/corpus" "$top/tests/image/input" >"$dir/fuzz.log" 2>&1 || rc=$?
tail -n 25 "$dir/fuzz.log"
runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$dir/fuzz.log" | tail -n 1 || true)
echo "fuzz_image: ${runs:-no summary} ; corpus $(ls "$dir/corpus" | wc -l) files; artifacts: $(ls "$dir" | grep -c -E '^(crash|leak|timeout|oom)-' || true)"
[ "$rc" = 0 ] || { echo "fuzz_image: libFuzzer exit status $rc; reproducers in $dir" >&2; exit 1; }
