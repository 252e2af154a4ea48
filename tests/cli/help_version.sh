#!/bin/sh
# --help and --version of both programs, and command-line usage errors (exit 2).
. "$top_srcdir/tests/lib.sh"

run h "$SDTRAIN" --help
expect_rc h 0
expect_in h out "usage: sdtrain INPUT.nml"
expect_in h out "train.learning_rate"
expect_in h out "--check"

run v "$SDTRAIN" --version
expect_rc v 0
expect_in v out "sdtrain 0.1.0 (git "
expect_in v out "features: cpu"

run th "$SDTOOL" --help
expect_rc th 0
for c in tokenize transform inspect forward grad export make-demo-data plot score-demo filter; do
    expect_in th out "  $c "
done
# every subcommand sdtool --help lists: help on stdout, exit 0, nothing run (make-demo-data
# writes no folder, device prints no build line)
cmds=$(sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p' "$TMP/th.out")
[ -n "$cmds" ] || fail "sdtool --help lists no subcommands"
for c in $cmds; do
    run "h-$c" "$SDTOOL" "$c" --help
    expect_rc "h-$c" 0
    expect_in "h-$c" out "usage: sdtool $c"
    [ ! -s "$TMP/h-$c.err" ] || { cat "$TMP/h-$c.err" >&2; fail "sdtool $c --help: output on stderr"; }
done
run h-demo-dir "$SDTOOL" make-demo-data "$TMP/demo" --help
expect_rc h-demo-dir 0
[ ! -e "$TMP/demo" ] || fail "sdtool make-demo-data DIR --help wrote DIR"
expect_not_in h-device out "build:"
run tv "$SDTOOL" --version
expect_rc tv 0
expect_in tv out "sdtool 0.1.0 (git "

run noarg "$SDTRAIN"
expect_rc noarg 2
expect_in noarg err "no input namelist given"

run badopt "$SDTRAIN" --frobnicate x.nml
expect_rc badopt 2
expect_in badopt err "unknown option '--frobnicate'"

run twoin "$SDTRAIN" a.nml b.nml
expect_rc twoin 2
expect_in twoin err "more than one input file"

run npnocheck "$SDTRAIN" --np 4 a.nml
expect_rc npnocheck 2
expect_in npnocheck err "--np only makes sense with --check"

run missing "$SDTRAIN" --check "$TMP/does-not-exist.nml"
expect_rc missing 2
expect_in missing err "does-not-exist.nml"
pass "help, version and usage errors"
