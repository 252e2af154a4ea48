#!/bin/sh
# Modes whose work has not landed say so and exit 3 on every rank, after setting up the run.
. "$top_srcdir/tests/lib.sh"
need_mpi

for mode in sample; do
    nml "$mode.nml" <<EOF2
&run mode = '$mode', n_process_ranks = 1, output_dir = '$TMP/$mode' /
&data input = 'images', shard_dir = 'shards' /
&sample prompts = 'a photo of a cat' /
EOF2
    mpi "$mode" 3 "$SDTRAIN" "$TMP/$mode.nml"
    expect_rc "$mode" 3
    expect_count "$mode" err "mode '$mode' is not implemented in this build yet" 1
    [ -f "$TMP/$mode/used.nml" ] || fail "$mode: used.nml missing"
done
pass "unimplemented modes refuse honestly"
