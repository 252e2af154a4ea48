#!/bin/sh
# device = 'cuda' without a usable GPU fails clearly; 'auto' falls back to the CPU with a notice.
. "$top_srcdir/tests/lib.sh"
need_mpi

if "$SDTOOL" device >/dev/null 2>&1; then
    skip "a GPU is present: the no-GPU behaviour cannot be tested here"
fi
nml dev.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/out' /
&data shard_dir = 'shards' /
EOF2
mpi cuda 2 "$SDTRAIN" --check "$TMP/dev.nml" --set run.device=cuda
expect_rc cuda 2
if [ "$SD_TEST_CUDA_BUILD" = no ]; then
    expect_count cuda err "device = 'cuda' but this sdtrain was built without CUDA" 1
else
    expect_count cuda err "device = 'cuda' but no usable GPU" 1
fi
mpi auto 2 "$SDTRAIN" --check "$TMP/dev.nml" --set run.device=auto
expect_rc auto 0
expect_count auto out "using the CPU" 1
mpi cpu 2 "$SDTRAIN" --check "$TMP/dev.nml" --set run.device=cpu
expect_rc cpu 0
expect_in cpu out "rank 0 computes on cpu"
pass "device selection without a GPU"
