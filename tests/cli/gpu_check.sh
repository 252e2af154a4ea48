#!/bin/sh
# bench/gpu-check.sh without a GPU: its argument checks, and its deadline on a stand-in build
# tree (a Makefile that builds nothing, an sdtool that reports a GPU, one op test that passes and
# one that hangs): parts run in the order given, a command is cut at the deadline and marked
# "cut", what could not start is marked "not run", and the table still comes.
. "$top_srcdir/tests/lib.sh"
command -v bash >/dev/null || skip "no bash"
GC="$top_srcdir/bench/gpu-check.sh"

run unknown bash "$GC" --build "$TMP/none" --parts tests,frob
expect_rc unknown 2
expect_in unknown err "unknown part 'frob'"
run baddl bash "$GC" --build "$TMP/none" --deadline 5m
expect_rc baddl 2
expect_in baddl err "--deadline wants whole seconds"
run help bash "$GC" --help
expect_rc help 0
expect_in help out "--deadline S"

B="$TMP/fake"
mkdir -p "$B/tests/gpu"
printf 'all:\ncheck:\n' >"$B/Makefile"
cat >"$B/sdtool" <<'EOF'
#!/bin/sh
case "$1" in
--version) echo "sdtool (stand-in)" ;;
device) echo "gpus: 1, device 0: stand-in" ;;
esac
EOF
printf '#!/bin/sh\necho "1..1"\necho "ok 1 - fine"\n' >"$B/tests/gpu/test_cuda_a"
printf '#!/bin/sh\necho "1..1"\nexec sleep 300\n' >"$B/tests/gpu/test_cuda_b"
printf '#!/bin/sh\necho "1..1"\necho "ok 1 - never reached"\n' >"$B/tests/gpu/test_cuda_c"
chmod +x "$B/sdtool" "$B"/tests/gpu/*

run dl bash "$GC" --build "$B" --parts tests,modules --deadline 40 --log "$TMP/logs"
expect_rc dl 0
expect_in dl out "==== tests ("
grep -q '^test_cuda_a  *pass ' "$TMP/dl.out" || { cat "$TMP/dl.out"; fail "test_cuda_a not passed"; }
grep -q '^test_cuda_b  *cut  *at the deadline' "$TMP/dl.out" || { cat "$TMP/dl.out"; fail "test_cuda_b not cut"; }
grep -q '^test_cuda_c  *not run ' "$TMP/dl.out" || { cat "$TMP/dl.out"; fail "test_cuda_c started after the deadline"; }
grep -q '^modules  *not run ' "$TMP/dl.out" || { cat "$TMP/dl.out"; fail "modules started after the deadline"; }
expect_in dl out "==== gpu-check summary"
[ -f "$TMP/logs/test_cuda_a.log" ] || fail "no log of test_cuda_a"
# the peer's variants of our side (gpu_vs_torch.py --variant), checked before torch is imported
if command -v python3 >/dev/null; then
    run var python3 "$top_srcdir/bench/gpu_vs_torch.py" --variant nonsense
    expect_rc var 2
    expect_in var err "want NAME=VAR=value"
fi
pass "bench/gpu-check.sh: arguments, part order and deadline"
