#!/bin/sh
# GPU self-test (Philox on the device == on the host, device discovery); skips without a GPU.
. "$top_srcdir/tests/lib.sh"

need_gpu
"$top_builddir/tests/gpu/gpu_selftest" >"$TMP/selftest.out" 2>&1 || { cat "$TMP/selftest.out"; fail "GPU self-test"; }
cat "$TMP/selftest.out"
! grep -q "^not ok" "$TMP/selftest.out" || fail "GPU self-test has failures"
pass "GPU self-test"
