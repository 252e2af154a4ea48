#!/bin/sh
# Replays every fuzzing target's committed corpus (tests/fuzz/corpus/TARGET: seeds, a coverage-
# minimised corpus from tests/fuzz/run_fuzz.sh, and the inputs that once broke an invariant, named
# crash-*) and the target's golden inputs through the harness built without libFuzzer. Each
# harness aborts on a broken invariant, so an input that crashed once cannot crash again unseen;
# under scripts/sanitize.sh the replays also run with ASan and UBSan.
. "$top_srcdir/tests/lib.sh"
corpus="$top_srcdir/tests/fuzz/corpus"
export SD_FUZZ_TOKENIZER="$top_srcdir/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
for target in safetensors image namelist tar tokenizer modelconfig dataset shardmanifest checkpoint tokenizerfiles schedconfig shardfile ckptstate metafilter; do
    case $target in
    safetensors) extra="$top_srcdir/tests/data/safetensors" ;;
    image) extra="$top_srcdir/tests/image/input" ;;
    namelist) extra="$top_srcdir/tests/config/invalid $top_srcdir/inputs $top_srcdir/tests/namelist/valid $top_srcdir/tests/namelist/invalid" ;;
    dataset) extra="$corpus/tar" ;;
    *) extra="" ;;
    esac
    dirs=""
    [ -d "$corpus/$target" ] && dirs="$corpus/$target"
    for d in $extra; do [ -d "$d" ] && dirs="$dirs $d"; done
    [ -n "$dirs" ] || fail "$target: no corpus"
    # shellcheck disable=SC2086
    run "$target" "$top_builddir/tests/fuzz/replay_$target" $dirs
    [ "$RC" = 0 ] || { tail -n 20 "$TMP/$target.err" >&2; fail "$target: replay exited $RC"; }
    n=$(sed -n 's/^replay: \([0-9]*\) inputs$/\1/p' "$TMP/$target.out")
    [ "${n:-0}" -gt 0 ] || fail "$target: no input replayed"
    pass "$target: $n inputs keep every invariant"
done
