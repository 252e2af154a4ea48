#!/bin/sh
# sdtool: every subcommand of ARCHITECTURE.md section 7 is implemented and answers --help,
# unknown ones are usage errors, device reports.
. "$top_srcdir/tests/lib.sh"

run help "$SDTOOL" --help
expect_rc help 0
expect_not_in help out "[not implemented yet]"
for c in tokenize transform inspect forward grad export make-demo-data plot score-demo filter; do
    grep -q "^  $c " "$TMP/help.out" || fail "sdtool --help does not list $c"
done
for c in export plot score-demo filter; do
    run "$c" "$SDTOOL" "$c" --help
    expect_rc "$c" 0
    expect_in "$c" out "usage: sdtool $c"
    # without arguments: a usage error, not "not implemented"
    run "$c-none" "$SDTOOL" "$c"
    expect_rc "$c-none" 2
    expect_not_in "$c-none" err "not implemented"
done
# inspect on a folder that is no shard directory, checkpoint or checkpoint root: exit 2, the
# folder and what was looked for named (not an empty "manifest")
mkdir -p "$TMP/empty"
run demo "$SDTOOL" make-demo-data "$TMP/imgs" --count 2
expect_rc demo 0
for d in "$TMP/empty" "$TMP/imgs"; do
    run insp-none "$SDTOOL" inspect "$d"
    expect_rc insp-none 2
    expect_in insp-none err "sdtool inspect: '$d' is no shard directory (no manifest.json"
    expect_in insp-none err "no checkpoint root (no latest)"
    expect_not_in insp-none out "manifest:"
done
# ... while a shard directory with an empty manifest, or with nothing committed yet, is one
mkdir -p "$TMP/shards0" "$TMP/shards1"
printf '{"format": "sdtrain-shard-manifest", "version": 1, "total_samples": 0, "shards": []}\n' \
    >"$TMP/shards0/manifest.json"
run insp-empty "$SDTOOL" inspect "$TMP/shards0"
expect_rc insp-empty 0
expect_in insp-empty out "manifest: $TMP/shards0/manifest.json"
expect_in insp-empty out "committed shards: 0, samples: 0"
: >"$TMP/shards1/.shard-000000.h5.tmp"
run insp-uncommitted "$SDTOOL" inspect "$TMP/shards1"
expect_rc insp-uncommitted 0
expect_in insp-uncommitted out "manifest: none (nothing committed)"
expect_in insp-uncommitted out "  .shard-000000.h5.tmp"

run unknown "$SDTOOL" frobnicate
expect_rc unknown 2
expect_in unknown err "unknown command 'frobnicate'"

run dev "$SDTOOL" device
expect_in dev out "build: cpu"
if [ "$SD_TEST_CUDA_BUILD" = no ]; then
    expect_rc dev 1
    expect_in dev out "gpus: 0 (this build has no CUDA support"
else
    # exit 0 with a GPU, 1 without; either way the reason is printed
    [ "$RC" = 0 ] || expect_in dev out "gpus: 0 (no usable GPU"
fi
pass "sdtool subcommands"
