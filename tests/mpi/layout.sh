#!/bin/sh
# The split of MPI_COMM_WORLD by &run mode and n_process_ranks, done for real under mpirun.
. "$top_srcdir/tests/lib.sh"
need_mpi

base() {
    cat <<EOF2
&run mode = '$1', n_process_ranks = $2, output_dir = '$TMP/out' /
&data input = 'images/', shard_dir = 'shards/' /
EOF2
}
base pipeline 2 | nml pipeline.nml
base process 0 | nml process.nml
base train 0 | nml train.nml

mpi pipe 5 "$SDTRAIN" --check "$TMP/pipeline.nml"
expect_rc pipe 0
expect_in pipe out "preprocessing communicator 2 ranks; training communicator 3 ranks"
# every rank reports its own communicator: ranks 0-1 preprocess (0/2, 1/2), 2-4 train (0/3..2/3)
for row in "0      preprocess  0/2" "1      preprocess  1/2" "2      train       0/3" \
           "3      train       1/3" "4      train       2/3"; do
    expect_in pipe out "  $row"
done
expect_count pipe out "configuration is valid" 1
expect_in pipe out "on 1 node(s)"

mpi proc 5 "$SDTRAIN" --check "$TMP/process.nml"
expect_rc proc 0
expect_in proc out "preprocessing communicator 5 ranks; training communicator 0 ranks"

mpi train 3 "$SDTRAIN" --check "$TMP/train.nml"
expect_rc train 0
expect_in train out "preprocessing communicator 0 ranks; training communicator 3 ranks"
expect_in train out "2      train       2/3"

# --np computes the layout of a job without running it (no launcher needed)
run np "$SDTRAIN" --check --np 8 "$TMP/pipeline.nml" --set run.n_process_ranks=3
expect_rc np 0
expect_in np out "communicators for 8 ranks: preprocessing communicator 3 ranks; training communicator 5 ranks"

# too few ranks for the pipeline: a clear error, once, exit 2, no hang
mpi few 2 "$SDTRAIN" --check "$TMP/pipeline.nml"
expect_rc few 2
expect_count few err "needs at least 3 ranks" 1
expect_not_in few err "MPI_ABORT"

# --check needs no data to show a layout: a namelist with only &run works, and the inputs the
# job will need are listed as a note; the job itself refuses to start without them.
printf "&run mode='pipeline', n_process_ranks=2 /\n" | nml minimal.nml
mpi minimal 5 "$SDTRAIN" --check "$TMP/minimal.nml"
expect_rc minimal 0
expect_in minimal out "preprocessing communicator 2 ranks; training communicator 3 ranks"
expect_count minimal out "missing required key 'input' in &data (needed when mode = 'pipeline')" 1
mpi minproc 5 "$SDTRAIN" --check "$TMP/minimal.nml" --set run.mode=process
expect_rc minproc 0
expect_in minproc out "preprocessing communicator 5 ranks; training communicator 0 ranks"
mpi minrun 3 "$SDTRAIN" "$TMP/minimal.nml"
expect_rc minrun 2
expect_count minrun err "minimal.nml:1:1: missing required key 'input' in &data (needed when mode = 'pipeline')" 1

# node-local ranks: all ranks of this test share one node
mpi node 4 "$SDTRAIN" --check "$TMP/train.nml"
expect_rc node 0
expect_in node out "3/4"
pass "communicator layouts"
