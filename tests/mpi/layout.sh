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
# --check of a training job says what its checkpoints take on disk: SD2's U-Net by the &model
# shape keys (865910784 floats with the alignment padding), checkpoints at 30, 40 (milestone),
# 60, 80 (milestone), 90 and the end: 6; keep_last = 1 keeps at most itself, 2 milestones and
# the one being written
set -- --set train.max_steps=100 --set checkpoint.every_n_steps=30 \
    --set checkpoint.keep_every_n_steps=40 --set checkpoint.keep_last=1
run ckplan "$SDTRAIN" --check --np 4 "$TMP/train.nml" "$@"
expect_rc ckplan 0
expect_in ckplan out "checkpoints: U-Net of 865.9 M parameters (the &model shape keys); each checkpoint 10.39 GB (parameters, AdamW moments: 3 x 865910784 floats)"
expect_in ckplan out "  6 written over max_steps = 100; at most 4 on disk at once (the newest keep_last = 1, 2 milestone(s) of keep_every_n_steps, the one being written): 41.56 GB in $TMP/out/checkpoints ("
expect_in ckplan out "free there now)"
mpi ckplan2 2 "$SDTRAIN" --check "$TMP/train.nml" "$@" --set train.ema_decay=0.99 --set checkpoint.keep_last=0
expect_rc ckplan2 0
expect_count ckplan2 out "each checkpoint 13.85 GB (parameters, AdamW moments, EMA: 4 x 865910784 floats)" 1
expect_in ckplan2 out "  6 written over max_steps = 100; all kept (keep_last = 0): 83.13 GB in $TMP/out/checkpoints"
# a snapshot's U-Net decides; one that cannot be read here falls back on the shape keys, said
run ckplan3 "$SDTRAIN" --check --np 4 "$TMP/train.nml" --set "model.pretrained='$top_srcdir/tests/data/models/tiny-sd2'"
expect_rc ckplan3 0
expect_in ckplan3 out "(the snapshot's unet/config.json); each checkpoint"
run ckplan4 "$SDTRAIN" --check --np 4 "$TMP/train.nml" --set "model.pretrained='$TMP/no-snapshot'"
expect_rc ckplan4 0
expect_in ckplan4 out "checkpoints: the snapshot's U-Net cannot be read here ($TMP/no-snapshot"
expect_in ckplan4 out "U-Net of 865.9 M parameters (the &model shape keys)"
run ckplan5 "$SDTRAIN" --check --np 4 "$TMP/process.nml"
expect_rc ckplan5 0
expect_not_in ckplan5 out "checkpoints:"
pass "communicator layouts"
