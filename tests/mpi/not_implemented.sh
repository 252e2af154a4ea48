#!/bin/sh
# Modes whose work has not landed say so and exit 3 on every rank, after setting up the run.
# None is left: 'pipeline' has landed (tests/mpi/pipeline.sh), and 'sample' has landed: it no longer refuses, and a namelist that gives it nothing to sample
# from is an input error (exit 2) that says what is missing.
. "$top_srcdir/tests/lib.sh"
need_mpi

nml sample.nml <<EOF2
&run mode = 'sample', n_process_ranks = 1, output_dir = '$TMP/sample' /
&data input = 'images', shard_dir = 'shards' /
&sample prompts = 'a photo of a cat' /
EOF2
mpi sample 2 "$SDTRAIN" "$TMP/sample.nml"
expect_rc sample 2
expect_not_in sample err "is not implemented in this build"
expect_count sample err "nothing to sample from" 1
[ -f "$TMP/sample/used.nml" ] || fail "sample: used.nml missing"
pass "mode 'sample' is implemented; no mode of the schema refuses"
