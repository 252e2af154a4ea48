#!/bin/sh
# tests/fuzz/run_fuzz.sh keeps, per fuzzing target, the list of library sources its clang build
# links. CI has no clang, so a list that lacks a file (a new dependency of a library file) would
# only show on the next fuzzing run. This links every target's harness from the ordinary build's
# objects with exactly that list (run_fuzz.sh --link-check), and checks that every harness
# tests/fuzz/fuzz_*.c is a target there.
. "$top_srcdir/tests/lib.sh"
script="$top_srcdir/tests/fuzz/run_fuzz.sh"
targets=$(sed -n 's/^    for t in \(.*\); do$/\1/p' "$script")
[ -n "$targets" ] || fail "no target list found in run_fuzz.sh's 'all' loop"
for f in "$top_srcdir"/tests/fuzz/fuzz_*.c; do
    t=$(basename "$f" .c)
    t=${t#fuzz_}
    case " $targets " in
    *" $t "*) ;;
    *) fail "$t: tests/fuzz/fuzz_$t.c is not a target of run_fuzz.sh" ;;
    esac
done
pass "every harness is a run_fuzz.sh target ($(echo $targets | wc -w))"
for t in $targets; do
    SD_FUZZ_DIR="$TMP/$t" SD_LINK_CC="$SD_TEST_CC" SD_LINK_FLAGS="$SD_TEST_LINK_FLAGS" \
        run "$t" sh "$script" --link-check "$top_builddir" "$t"
    [ "$RC" = 0 ] || { cat "$TMP/$t.err" >&2; fail "$t: exit status $RC"; }
    pass "$(cat "$TMP/$t.out" | sed 's/^run_fuzz: //')"
done
