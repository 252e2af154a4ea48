#!/bin/sh
# Builds the safetensors libFuzzer harness with clang (fuzzer + ASan + UBSan) and runs it for a
# bounded time, seeded with the committed goldens.
#
# Usage: tests/fuzz/run_fuzz_safetensors.sh [SECONDS] [extra libFuzzer options...]
#   SECONDS  total fuzzing time (default 60)
# Environment: CLANG (default clang), SD_FUZZ_DIR (build + corpus folder, default
# build/fuzz/safetensors), SD_FUZZ_JOBS (parallel fuzzing processes, default 1; with more,
# libFuzzer writes each one's output to fuzz-N.log in the current folder).
# Exit status: 0 no crash, 1 crash or build failure, 77 clang with libFuzzer unavailable.
# A crash leaves its input in $SD_FUZZ_DIR/artifacts/; replay it with
#   build/fuzz/safetensors/fuzz_safetensors build/fuzz/safetensors/artifacts/crash-...
set -eu

top=$(cd "$(dirname "$0")/../.." && pwd)
secs=${1:-60}
[ $# -gt 0 ] && shift
CLANG=${CLANG:-clang}
dir=${SD_FUZZ_DIR:-$top/build/fuzz/safetensors}
jobs=${SD_FUZZ_JOBS:-1}

if ! command -v "$CLANG" >/dev/null 2>&1; then
    # Debian's clang (14 on bookworm) ships libFuzzer in libclang-rt-dev.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "run_fuzz_safetensors: installing clang with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >/dev/null || true
    fi
fi
if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "run_fuzz_safetensors: $CLANG not found (apt-get install clang)" >&2
    exit 77
fi

mkdir -p "$dir/corpus" "$dir/artifacts"
json_cflags=$(pkg-config --cflags json-c 2>/dev/null || echo "")
json_libs=$(pkg-config --libs json-c 2>/dev/null || echo "-ljson-c")
# shellcheck disable=SC2086
if ! "$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -I"$top/include" $json_cflags \
    -o "$dir/fuzz_safetensors" \
    "$top/tests/fuzz/fuzz_safetensors.c" "$top/src/io/safetensors.c" \
    "$top/src/core/error.c" "$top/src/core/check.c" "$top/src/core/log.c" \
    "$top/src/core/timer.c" "$top/src/core/tensor.c" $json_libs -lm; then
    if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){return 0;}' |
        "$CLANG" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
        echo "run_fuzz_safetensors: $CLANG cannot link libFuzzer (apt-get install libclang-rt-dev)" >&2
        exit 77
    fi
    exit 1
fi

# Seeds: the goldens (files and golden.json, which also seeds the index path) and a valid index.
cp "$top"/tests/data/safetensors/* "$dir/corpus/" 2>/dev/null || true
printf '{"metadata":{"total_size":10},"weight_map":{"t":"a.safetensors","u":"a.safetensors"}}' \
    > "$dir/corpus/seed-index.json"
# Small valid files, whose length field and data size mutation rarely gets right by itself:
# no tensors; one U8 tensor; an unpadded header (unaligned F16 data) with metadata.
printf '\010\000\000\000\000\000\000\000{}      ' > "$dir/corpus/seed-empty.safetensors"
printf '\065\000\000\000\000\000\000\000{"t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}\001\002' \
    > "$dir/corpus/seed-u8.safetensors"
printf '\116\000\000\000\000\000\000\000{"__metadata__":{"k":"v"},"h":{"dtype":"F16","shape":[],"data_offsets":[0,2]}}\000\074' \
    > "$dir/corpus/seed-unaligned.safetensors"

parallel=""
[ "$jobs" -gt 1 ] && parallel="-jobs=$jobs -workers=$jobs"
echo "run_fuzz_safetensors: fuzzing for $secs s, corpus $dir/corpus"
# shellcheck disable=SC2086
"$dir/fuzz_safetensors" -max_total_time="$secs" -timeout=10 -max_len=4096 \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 -dict="$top/tests/fuzz/safetensors.dict" \
    -artifact_prefix="$dir/artifacts/" $parallel "$@" "$dir/corpus"
