#!/bin/sh
# Builds one libFuzzer harness (tests/fuzz/fuzz_TARGET.c) with clang, ASan and UBSan and fuzzes
# it for a bounded time, seeded with its committed corpus (tests/fuzz/corpus/TARGET) and the
# target's golden inputs.
#
# Usage: tests/fuzz/run_fuzz.sh TARGET [SECONDS] [extra libFuzzer options...]
#        tests/fuzz/run_fuzz.sh --link-check BUILDDIR TARGET
#   TARGET   safetensors | image | namelist | tar | tokenizer | modelconfig | dataset | shardmanifest |
#            checkpoint | tokenizerfiles | schedconfig | shardfile | ckptstate | metafilter | all
#            (all: every target, SECONDS each)
#   SECONDS  fuzzing time (default 60)
#   --link-check  links TARGET's harness from BUILDDIR's objects (an ordinary build: no clang) with
#            exactly the source list and packages below, to prove the list complete; SD_LINK_CC and
#            SD_LINK_FLAGS name the compiler and flags (default cc, -fopenmp). make check runs it
#            (tests/fuzz/sources.sh), so a list that lacks a file fails CI, which has no clang.
# Environment: CLANG (default clang), SD_FUZZ_DIR (build + corpus + artifacts, default
# build/fuzz/TARGET), SD_FUZZ_JOBS (parallel fuzzing processes, default 1).
# Exit status: 0 no crash, 1 a crash, leak, timeout or build failure, 77 no clang with libFuzzer.
# A crash leaves its input in $SD_FUZZ_DIR/artifacts/; replay it with the same binary:
#   build/fuzz/TARGET/fuzz_TARGET build/fuzz/TARGET/artifacts/crash-...
# and, once fixed, copy it (minimised: -minimize_crash=1) into tests/fuzz/corpus/TARGET/, which
# `make check` replays with the ordinary build (tests/fuzz/replay.sh).
set -eu

top=$(cd "$(dirname "$0")/../.." && pwd)
link_check=""
if [ "${1:-}" = --link-check ]; then
    [ $# -eq 3 ] || { echo "run_fuzz: usage: run_fuzz.sh --link-check BUILDDIR TARGET" >&2; exit 2; }
    link_check=$(cd "$2" && pwd)
    shift 2
fi
target=${1:-}
[ -n "$target" ] || { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
shift
secs=${1:-60}
[ $# -gt 0 ] && shift

if [ "$target" = all ]; then
    status=0
    for t in safetensors image namelist tar tokenizer modelconfig dataset shardmanifest checkpoint tokenizerfiles schedconfig shardfile ckptstate metafilter; do
        if [ -n "$link_check" ]; then
            "$0" --link-check "$link_check" "$t" || status=1
        else
            SD_FUZZ_DIR="$top/build/fuzz/$t" "$0" "$t" "$secs" "$@" || status=1
        fi
    done
    exit $status
fi

CLANG=${CLANG:-clang}
dir=${SD_FUZZ_DIR:-$top/build/fuzz/$target}
[ -n "$link_check" ] && dir=${SD_FUZZ_DIR:-$link_check/tests/fuzz/link/$target}
jobs=${SD_FUZZ_JOBS:-1}
src=$top/src
core="$src/core/error.c $src/core/check.c $src/core/log.c $src/core/timer.c $src/core/progress.c"

# Per target: the library sources the harness needs, pkg-config packages, libFuzzer options
# and extra seed folders.
case $target in
safetensors)
    sources="$src/io/safetensors.c $src/core/tensor.c $src/core/fsutil.c"
    pkgs=json-c opts="-max_len=4096" seeds="$top/tests/data/safetensors" ;;
image)
    sources="$src/data/image.c $src/data/transform.c $src/data/utf8.c"
    pkgs="libturbojpeg libpng zlib" opts="-max_len=131072 -rss_limit_mb=2048" seeds="$top/tests/image/input" ;;
namelist)
    sources="$src/config/namelist.c $src/config/schema.c $src/config/config.c $src/config/metafilter.c $src/core/fault.c $src/data/utf8.c"
    pkgs="" opts="-max_len=8192" seeds="$top/tests/config/invalid $top/inputs" ;;
tar)
    sources="$src/data/tar.c $src/core/fsutil.c"
    pkgs="" opts="-max_len=16384" seeds="" ;;
tokenizer | tokenizerfiles)
    sources="$src/data/tokenizer.c $src/data/unicode_tables.c $src/data/utf8.c $src/io/json_file.c $src/core/fsutil.c"
    opts="-max_len=4096"
    [ "$target" = tokenizerfiles ] && opts="-max_len=16384"
    pkgs="zlib json-c" seeds="" ;;
modelconfig)
    # snapshot.c links the weight loader, whose layout conversions (src/nn/ops.c, with the whole
    # backend table) the harness never reaches: stand-ins that abort
    mkdir -p "$dir"
    printf '%s\n' '#include <stdint.h>' '#include <stdlib.h>' \
        'void sd_weight_from_torch(int n, const int64_t *s, size_t e, const void *a, void *b, int64_t *o) { abort(); }' \
        'void sd_weight_to_torch(int n, const int64_t *s, size_t e, const void *a, void *b) { abort(); }' \
        >"$dir/layout_stub.c"
    sources="$src/models/model_config.c $src/models/params.c $src/core/tensor.c $src/io/json_file.c $src/core/fsutil.c
        $src/models/snapshot.c $src/models/weights.c $src/io/safetensors.c $src/core/rng.c
        $dir/layout_stub.c"
    pkgs=json-c opts="-max_len=8192" seeds="" ;;
schedconfig)
    sources="$src/app/sched_config.c $src/io/json_file.c $src/core/fsutil.c $src/train/sampler.c $src/train/diffusion.c
        $src/core/rng.c $src/core/tensor.c"
    pkgs=json-c opts="-max_len=4096" seeds="" ;;
shardmanifest | checkpoint | shardfile | ckptstate)
    # the version strings come from configure's build tree: a stand-in here
    mkdir -p "$dir"
    printf '%s\n' 'const char *sd_version(void); const char *sd_git_revision(void);' \
        'const char *sd_version(void) { return "fuzz"; }' \
        'const char *sd_git_revision(void) { return "fuzz"; }' >"$dir/version_stub.c"
    # h5util.c takes &run io_hints through config.c's parser
    sources="$src/io/h5util.c $src/core/fsutil.c $src/core/fault.c $src/core/tensor.c
        $src/dist/runtime.c $dir/version_stub.c $src/config/config.c $src/config/schema.c
        $src/config/namelist.c $src/config/metafilter.c $src/data/utf8.c"
    if [ "$target" = shardmanifest ] || [ "$target" = shardfile ]; then
        # runtime.c's pipeline stop asks checkpoint.c for a caught signal, never in these harnesses
        printf '%s\n' 'int sd_ckpt_signal_pending(void); int sd_ckpt_signal_pending(void) { return 0; }' \
            >"$dir/signal_stub.c"
        sources="$sources $src/io/shards.c $dir/signal_stub.c"
    else
        sources="$sources $src/io/checkpoint.c $src/dist/collectives.c"
    fi
    pkgs="json-c hdf5-openmpi ompi-c" opts="-max_len=8192" seeds="" ;;
metafilter)
    sources="$src/config/metafilter.c $src/data/metafilter_eval.c"
    pkgs=json-c opts="-max_len=2048" seeds="" ;;
dataset)
    sources="$src/data/dataset.c $src/data/dataset_index.c $src/data/tar.c $src/data/utf8.c $src/core/fsutil.c"
    pkgs="" opts="-max_len=16384" seeds="$top/tests/fuzz/corpus/tar" ;;
*)
    echo "run_fuzz: unknown target '$target' (safetensors, image, namelist, tar, tokenizer, modelconfig, dataset, shardmanifest, checkpoint, tokenizerfiles, schedconfig, shardfile, ckptstate, metafilter, all)" >&2
    exit 2 ;;
esac

if [ -n "$link_check" ]; then
    # The library's sources map to the build tree's objects (automake's subdir-objects names);
    # the stand-ins written above are compiled here.
    cc=${SD_LINK_CC:-cc}
    flags=${SD_LINK_FLAGS:--fopenmp}
    mkdir -p "$dir"
    objs=""
    for f in $sources $core; do
        case $f in
        "$src"/*)
            o="$link_check/src/${f#"$src"/}"
            o="${o%.c}.o"
            [ -f "$o" ] || { echo "run_fuzz: $target: $o not built (make first)" >&2; exit 1; } ;;
        *)
            o="$dir/$(basename "${f%.c}").o"
            # shellcheck disable=SC2086
            $cc $flags -std=c11 -c -o "$o" "$f" || exit 1 ;;
        esac
        objs="$objs $o"
    done
    libs=""
    # shellcheck disable=SC2086
    [ -z "$pkgs" ] || libs=$(pkg-config --libs $pkgs)
    # shellcheck disable=SC2086
    if ! $cc $flags -o "$dir/link_$target" "$link_check/tests/fuzz/fuzz_$target.o" \
        "$link_check/tests/fuzz/replay_main.o" $objs $libs -lm 2>"$dir/link.log"; then
        grep -E "undefined reference|error" "$dir/link.log" | head -n 20 >&2
        echo "run_fuzz: $target: the harness does not link from its source list (tests/fuzz/run_fuzz.sh)" >&2
        exit 1
    fi
    echo "run_fuzz: $target links from $(echo $sources $core | wc -w) sources"
    exit 0
fi

if ! command -v "$CLANG" >/dev/null 2>&1; then
    # Debian's clang (14 on bookworm) ships libFuzzer in libclang-rt-dev.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "run_fuzz: installing clang with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang >/dev/null || true
    fi
fi
command -v "$CLANG" >/dev/null 2>&1 || { echo "run_fuzz: $CLANG not found (apt-get install clang)" >&2; exit 77; }

mkdir -p "$dir/corpus" "$dir/artifacts"
cflags="" libs=""
if [ -n "$pkgs" ]; then
    # shellcheck disable=SC2086
    cflags=$(pkg-config --cflags $pkgs) libs=$(pkg-config --libs $pkgs)
fi
# shellcheck disable=SC2086
if ! "$CLANG" -std=c11 -D_GNU_SOURCE -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -Wall -Wextra -Wno-unused-parameter -I"$top/include" -I"$top/src" $cflags \
    -DSD_FUZZ_TOP="\"$top\"" -o "$dir/fuzz_$target" "$top/tests/fuzz/fuzz_$target.c" \
    $sources $core $libs -lm 2>"$dir/build.log"; then
    if ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){return 0;}' |
        "$CLANG" -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
        echo "run_fuzz: $CLANG cannot link libFuzzer (apt-get install libclang-rt-dev)" >&2
        exit 77
    fi
    cat "$dir/build.log" >&2
    exit 1
fi

dict=""
[ -f "$top/tests/fuzz/$target.dict" ] && dict="-dict=$top/tests/fuzz/$target.dict"
parallel=""
[ "$jobs" -gt 1 ] && parallel="-jobs=$jobs -workers=$jobs"
corpora="$dir/corpus"
[ -d "$top/tests/fuzz/corpus/$target" ] && corpora="$corpora $top/tests/fuzz/corpus/$target"
for s in $seeds; do [ -d "$s" ] && corpora="$corpora $s"; done
echo "run_fuzz: $target for $secs s, corpus $dir/corpus"
rc=0
# The first folder is where libFuzzer adds new inputs; the others are read-only seeds.
# shellcheck disable=SC2086
"$dir/fuzz_$target" -max_total_time="$secs" -timeout=10 $opts $dict \
    -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" $parallel "$@" $corpora >"$dir/fuzz.log" 2>&1 || rc=$?
tail -n 30 "$dir/fuzz.log"
runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$dir/fuzz.log" | tail -n 1 || true)
echo "run_fuzz: $target: ${runs:-no summary}; corpus $(ls "$dir/corpus" | wc -l) files; artifacts $(ls "$dir/artifacts" | wc -l)"
[ "$rc" = 0 ] || { echo "run_fuzz: $target: libFuzzer exit status $rc; reproducers in $dir/artifacts" >&2; exit 1; }
