#!/bin/sh
# sdtool: every subcommand of ARCHITECTURE.md section 7 is implemented and answers --help,
# unknown ones are usage errors, device reports.
. "$top_srcdir/tests/lib.sh"

run help "$SDTOOL" --help
expect_rc help 0
expect_not_in help out "[not implemented yet]"
for c in tokenize transform inspect forward grad export make-demo-data plot score-demo; do
    grep -q "^  $c " "$TMP/help.out" || fail "sdtool --help does not list $c"
done
for c in export plot score-demo; do
    run "$c" "$SDTOOL" "$c" --help
    expect_rc "$c" 0
    expect_in "$c" out "usage: sdtool $c"
    # without arguments: a usage error, not "not implemented"
    run "$c-none" "$SDTOOL" "$c"
    expect_rc "$c-none" 2
    expect_not_in "$c-none" err "not implemented"
done
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
