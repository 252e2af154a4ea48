#!/bin/sh
# sdtool: pending subcommands say so (exit 3), unknown ones are usage errors, device reports.
. "$top_srcdir/tests/lib.sh"

for c in export plot score-demo; do
    run "$c" "$SDTOOL" "$c" x
    expect_rc "$c" 3
    expect_in "$c" err "not implemented in this build yet"
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
