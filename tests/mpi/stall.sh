#!/bin/sh
# The stall watchdog (&run stall_timeout, doc/checkpoints.md "Stalls"): a rank that stops making
# progress without dying (SDTRAIN_FAULT=hang) ends the whole job with status 1 and a report
# naming the rank and what it was doing, within seconds of the timeout instead of at the time
# limit; the run then resumes from its newest checkpoint to the bits of an uninterrupted one
# (a stall at a step, and in the middle of a checkpoint write, which stays uncommitted, also
# inside a file-system call that never returns, which the report names); a stall
# in a shard write ends mode 'process', whose rerun commits the same shards. Waits with limits
# of their own do not count: a pipeline's trainers waiting longer than the timeout for shards,
# and for the preprocessing half at the end, and ranks waiting for rank 0's long index, finish
# normally; a file-system call in such a wait that never returns (a listing of the input, the
# trainers' poll of the shard manifest) does not. SIGUSR2 makes every rank report what it is
# doing, without stopping.
. "$top_srcdir/tests/lib.sh"
need_mpi

tiny_shards 48 2 # $TMP/shards, 3 shards of 16

# stall_nml NAME: 12 steps on 2 ranks, a checkpoint every 4
stall_nml() {
    STEPS=12 tiny_train_nml "$1" 4 none "" "&checkpoint every_n_steps = 4 /"
}
# stalled NAME [WHAT]: the job ended with status 1 within the run's time limit (no hang), saying
# what a rerun keeps (WHAT; default: a training job's checkpoints)
stalled() {
    expect_rc "$1" 1
    expect_in "$1" err "the job stalled: no progress on this rank for"
    expect_in "$1" err "(&run stall_timeout = 3 s)"
    expect_in "$1" err "ending the job with status 1; ${2:-a restart resumes from the newest checkpoint}"
}

stall_nml ref
mpi ref 2 "$SDTRAIN" "$TMP/ref.nml"
expect_rc ref 0
expect_in ref out "stall_timeout = 1.8e+03"

# (a) rank 1 stops at the start of step 6: it reports itself (outside MPI); rank 0 waits inside
# MPI with the grace, so the report is rank 1's; the resume gives the reference bits
stall_nml step
SDTRAIN_FAULT=hang:rank=1:step=5 mpi step 2 "$SDTRAIN" "$TMP/step.nml" --set run.stall_timeout=3
stalled step
expect_in step err "[rank 1] SDTRAIN_FAULT: this rank stops making progress (training, steps done: 5)"
grep -F "[rank 1]" "$TMP/step.err" | grep -F "its work: training step 6 (for" |
    grep -qF "outside MPI: this rank is stuck" || { cat "$TMP/step.err" >&2; fail "step: no report of rank 1 stuck in step 6"; }
latest_is step step-00000004
mpi step 2 "$SDTRAIN" "$TMP/step.nml"
expect_rc step 0
expect_in step out "resuming from $TMP/step/checkpoints/step-00000004: step 4"
same_run step ref
pass "a rank stalled at a step ends the job with status 1, naming itself; the resume is bit-identical"

# (b) rank 0 stops in the middle of the step-8 checkpoint's write: the checkpoint stays
# uncommitted, step 4 the latest, and the resume gives the reference bits
stall_nml ckpt
SDTRAIN_FAULT=hang:rank=0:phase=ckpt-write:step=8 mpi ckpt 2 "$SDTRAIN" "$TMP/ckpt.nml" --set run.stall_timeout=3
stalled ckpt
grep -F "[rank 0]" "$TMP/ckpt.err" | grep -qF "its work: writing the checkpoint of step 8 (for" ||
    { cat "$TMP/ckpt.err" >&2; fail "ckpt: no report of rank 0 stuck in the checkpoint write"; }
latest_is ckpt step-00000004
mpi ckpt 2 "$SDTRAIN" "$TMP/ckpt.nml"
expect_rc ckpt 0
expect_in ckpt out "resuming from $TMP/ckpt/checkpoints/step-00000004: step 4"
same_run ckpt ref
pass "a rank stalled in a checkpoint write: the checkpoint is not committed, the resume is bit-identical"

# (b2) a file system that never answers (the LD_PRELOAD shim's SD_EIO_HANG): rank 1's sync of the
# step-8 checkpoint's state file does not return. Its report names the call and the file and
# says the rank is stuck in the file system; rank 0 waits inside MPI with the grace. The
# checkpoint stays uncommitted and the resume gives the reference bits
need_eio_shim
stall_nml fs
SD_EIO_HANG=1 SD_EIO_RANK=1 SD_EIO_PATH=.step-00000008.tmp/state.h5 SD_EIO_OPS=sync \
    LD_PRELOAD="$PRELOAD" mpi fs 2 "$SDTRAIN" "$TMP/fs.nml" --set run.stall_timeout=3
stalled fs
grep -F "[rank 1]" "$TMP/fs.err" | grep -F "its work: writing the checkpoint of step 8 (for" |
    grep -E "outside MPI, in (sync_file_range|fsync) of '$TMP/fs/checkpoints/.step-00000008.tmp/state.h5' for" |
    grep -qF ": this rank is stuck in the file system" ||
    { cat "$TMP/fs.err" >&2; fail "fs: no report of rank 1 stuck in the state file's sync"; }
latest_is fs step-00000004
mpi fs 2 "$SDTRAIN" "$TMP/fs.nml"
expect_rc fs 0
expect_in fs out "resuming from $TMP/fs/checkpoints/step-00000004: step 4"
same_run fs ref
pass "a file-system call that never returns: the report names it and its file; the resume is bit-identical"
# ... and an open that never returns (a metadata server that does not answer): rank 1's open of
# shard 1 at the training set-up, named with the path although no descriptor exists yet
stall_nml open
SD_EIO_HANG=1 SD_EIO_RANK=1 SD_EIO_PATH=/shards/shard-000001.h5 SD_EIO_OPS=open \
    LD_PRELOAD="$PRELOAD" mpi open 2 "$SDTRAIN" "$TMP/open.nml" --set run.stall_timeout=3
stalled open
grep -F "[rank 1]" "$TMP/open.err" | grep -E "in (H5Fopen|open|HDF5 read) of '$TMP/shards/shard-000001.h5' for" |
    grep -qF ": this rank is stuck in the file system" ||
    { cat "$TMP/open.err" >&2; fail "open: no report of rank 1 stuck opening shard 1"; }
pass "an open that never returns: the report names the call and the path"
# ... and HDF5's own writes (not calls of ours): rank 0's writes of the step-8 checkpoint's file
# never return after the first $after. With HDF5 1.10 (Debian 12) the structure takes writes 0-5
# (0 inside H5Fcreate, 1-5 at the close), the parts 6-9 (our pwrite), the checksum attributes
# 10-12 (10 inside H5Fopen). The structure and the attributes are each marked as one call from
# the open to the close, so the report names the file; unmarked, writes 1 and 11 gave "outside
# MPI: this rank is stuck" without one. The checkpoint stays uncommitted
for after in 1 11; do
    stall_nml h5w
    SD_EIO_HANG=1 SD_EIO_RANK=0 SD_EIO_PATH=.step-00000008.tmp/state.h5 SD_EIO_OPS=write \
        SD_EIO_AFTER=$after LD_PRELOAD="$PRELOAD" mpi h5w 2 "$SDTRAIN" "$TMP/h5w.nml" \
        --set run.stall_timeout=3
    stalled h5w
    grep -F "[rank 0]" "$TMP/h5w.err" | grep -F "its work: writing the checkpoint of step 8 (for" |
        grep -F "outside MPI, in HDF5 write of '$TMP/h5w/checkpoints/.step-00000008.tmp/state.h5' for" |
        grep -qF ": this rank is stuck in the file system" ||
        { cat "$TMP/h5w.err" >&2; fail "h5w ($after writes pass): no report of rank 0 stuck in HDF5's writes of the state file"; }
    latest_is h5w step-00000004
    rm -rf "$TMP/h5w"
done
pass "HDF5's own writes of a checkpoint's structure and checksums that never return: the report names the file"

# (c) SIGUSR2 to the launcher (mpirun forwards it; Slurm: scancel --signal=USR2): every rank
# says what it is doing and the job goes on, here until the watchdog ends it: rank 1 stalled at
# step 6 outside MPI, rank 0 waiting inside an MPI call
stall_nml usr2
SDTRAIN_FAULT=hang:rank=1:step=5 $MPIEXEC $MPIEXEC_NP 2 "$SDTRAIN" "$TMP/usr2.nml" \
    --set run.stall_timeout=12 >"$TMP/usr2.out" 2>"$TMP/usr2.err" &
pid=$!
i=0
while ! grep -q "this rank stops making progress" "$TMP/usr2.err" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 600 ] || { kill -KILL $pid; fail "usr2: rank 1 did not stop within 60 s"; }
    sleep 0.1
done
kill -USR2 $pid
i=0
while [ "$(grep -c '\] progress: its work' "$TMP/usr2.err")" -lt 2 ]; do
    i=$((i + 1))
    [ $i -lt 100 ] || break
    sleep 0.1
done
( sleep 120; kill -KILL $pid 2>/dev/null ) &
guard=$!
RC=0
wait $pid || RC=$?
kill $guard 2>/dev/null || true
grep -F "[rank 1]" "$TMP/usr2.err" | grep -F "progress: its work: training step 6 (for" |
    grep -qF "outside MPI; the last progress" || { cat "$TMP/usr2.err" >&2; fail "usr2: no report of rank 1"; }
grep -F "[rank 0]" "$TMP/usr2.err" | grep -F "progress: its work: training step 6 (for" |
    grep -qF ", inside MPI_" || { cat "$TMP/usr2.err" >&2; fail "usr2: no report of rank 0 inside MPI"; }
[ "$RC" = 1 ] && grep -qF "the job stalled" "$TMP/usr2.err" ||
    { cat "$TMP/usr2.err" >&2; fail "usr2: the job went on and ended by the watchdog (status $RC)"; }
pass "SIGUSR2: each rank reports its work and MPI call, and the job goes on"

# (d) mode 'process': rank 1's shard writer (a thread of its own) stops in shard 0; the main
# thread waiting for it reports; the rerun commits the shards tiny_shards made
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }
sed "s|$TMP/shards'|$TMP/shards-w'|; s|$TMP/proc'|$TMP/procw'|" "$TMP/proc.nml" >"$TMP/procw.nml"
SDTRAIN_FAULT=hang:rank=1:phase=shard-write mpi procw 2 "$SDTRAIN" "$TMP/procw.nml" --set run.stall_timeout=3
stalled procw "a rerun goes on from the shards committed"
expect_in procw err "[rank 1] SDTRAIN_FAULT: this rank stops making progress (writing a shard)"
grep -F "[rank 1]" "$TMP/procw.err" | grep -qF "its work: waiting for the writer of shard 0 (for" ||
    { cat "$TMP/procw.err" >&2; fail "procw: no report of rank 1 waiting for its shard writer"; }
[ ! -e "$TMP/shards-w/manifest.json" ] || [ "$(checksums "$TMP/shards-w" | wc -l)" = 0 ] ||
    fail "procw: a shard was committed although a rank's writer stalled"
mpi procw 2 "$SDTRAIN" "$TMP/procw.nml"
expect_rc procw 0
checksums "$TMP/shards" >"$TMP/sum-ref"
checksums "$TMP/shards-w" >"$TMP/sum-w"
[ -s "$TMP/sum-ref" ] && diff "$TMP/sum-ref" "$TMP/sum-w" || fail "procw: the rerun's shards differ"
pass "a stalled shard writer ends mode 'process' with status 1; the rerun commits the same shards"
# ... and HDF5's own writes of a shard's structure (rank 0's writer thread, the second write of
# the temporary file hangs: at its close), marked as one call: the report names the file
SD_EIO_HANG=1 SD_EIO_RANK=0 SD_EIO_PATH=/.shard-000000.h5.tmp SD_EIO_OPS=write SD_EIO_AFTER=1 \
    LD_PRELOAD="$PRELOAD" mpi proch 2 "$SDTRAIN" "$TMP/procw.nml" --set run.stall_timeout=3 \
    --set "data.shard_dir='$TMP/shards-h'" --set "run.output_dir='$TMP/proch'"
stalled proch "a rerun goes on from the shards committed"
grep -F "[rank 0]" "$TMP/proch.err" | grep -F "its work: waiting for the writer of shard 0 (for" |
    grep -F "in HDF5 write of '$TMP/shards-h/.shard-000000.h5.tmp' for" |
    grep -qF ": this rank is stuck in the file system" ||
    { cat "$TMP/proch.err" >&2; fail "proch: no report of rank 0 stuck in HDF5's writes of shard 0"; }
[ ! -e "$TMP/shards-h/manifest.json" ] || fail "proch: a manifest was written although a write hung"
pass "HDF5's own writes of a shard's structure that never return: the report names the file"
# ... and the other ranks' wait for rank 0's own work is no stall: an index that takes rank 0
# 6 s (test hook) under a 2 s timeout (the others would end the job after 2 + 2 s of grace);
# the shards are those of the run before
SDTRAIN_TEST_INDEX_DELAY_MS=6000 mpi procx 2 "$SDTRAIN" "$TMP/procw.nml" --set run.stall_timeout=2 \
    --set "data.shard_dir='$TMP/shards-x'" --set "run.output_dir='$TMP/procx'"
expect_rc procx 0
expect_not_in procx err "stalled"
checksums "$TMP/shards-x" >"$TMP/sum-x"
diff "$TMP/sum-ref" "$TMP/sum-x" || fail "procx: other shards"
# ... but a listing of the input that never returns is (a metadata server that does not answer):
# rank 0's readdir of the input folder, while it indexes it; its report names the call and the
# folder, and nothing is committed
SD_EIO_HANG=1 SD_EIO_RANK=0 SD_EIO_PATH="$TMP/data\$" SD_EIO_OPS=list LD_PRELOAD="$PRELOAD" \
    mpi procl 2 "$SDTRAIN" "$TMP/procw.nml" --set run.stall_timeout=3 \
    --set "data.shard_dir='$TMP/shards-l'" --set "run.output_dir='$TMP/procl'"
stalled procl "a rerun goes on from the shards committed"
grep -F "[rank 0]" "$TMP/procl.err" | grep -F "in readdir of '$TMP/data' for" |
    grep -qF ": this rank is stuck in the file system" ||
    { cat "$TMP/procl.err" >&2; fail "procl: no report of rank 0 stuck listing the input folder"; }
[ ! -e "$TMP/shards-l/manifest.json" ] || fail "procl: a manifest was written although the listing hung"
pass "a listing of the input that never returns: the report names readdir and the folder"

# (d2) mode 'sample': rank 1 stops before image 3 (its second batch; rank 0 makes its 3 and waits
# inside MPI); the report is rank 1's and says a rerun keeps the images; the rerun keeps the 4
# there and makes 2: the bytes of an undisturbed run
tiny_sample_nml sref ddim
mpi sref 1 "$SDTRAIN" "$TMP/sref.nml"
expect_rc sref 0
tiny_sample_nml samp ddim
SDTRAIN_FAULT=hang:rank=1:step=3 mpi samp 2 "$SDTRAIN" "$TMP/samp.nml" --set run.stall_timeout=3
stalled samp "a rerun keeps the images already written"
expect_in samp err "[rank 1] SDTRAIN_FAULT: this rank stops making progress (sampling, image 3)"
grep -F "[rank 1]" "$TMP/samp.err" | grep -F "its work: sampling: the batch of images from image 3 (for" |
    grep -qF "outside MPI: this rank is stuck" ||
    { cat "$TMP/samp.err" >&2; fail "samp: no report of rank 1 stuck at image 3"; }
mpi samp 2 "$SDTRAIN" "$TMP/samp.nml"
expect_rc samp 0
expect_in samp out "kept 4 of the 6 image(s) from the run before"
for f in 0-0 0-1 1-0 1-1 2-0 2-1; do
    cmp -s "$TMP/sref/samples/$f.png" "$TMP/samp/samples/$f.png" || fail "samp: $f.png differs after the rerun"
done
pass "a stalled sampling rank ends mode 'sample' with status 1; the rerun keeps the images and makes the rest"

# (e) no stall where nothing is stuck: a pipeline (2 + 2 ranks) whose preprocessing takes 4 s a
# shard, with a 2 s timeout: the trainers wait 4 s for shard 0 and, their one step done, for the
# preprocessing half to commit the other two shards; the job ends normally
nml pipe.nml <<EOF2
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$TMP/pipe', seed = 11, device = 'cpu',
     stall_timeout = 2 /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards-pipe', samples_per_shard = 16,
      encode_batch_size = 8, val_fraction = 0.2 /
&train max_steps = 1, batch_size_per_rank = 4, learning_rate = 1e-3 /
EOF2
SDTRAIN_TEST_SHARD_DELAY_MS=4000 mpi pipe 4 "$SDTRAIN" "$TMP/pipe.nml"
expect_rc pipe 0
expect_not_in pipe err "stalled"
expect_in pipe out "waiting for shard 0"
expect_in pipe out "mode 'pipeline': the training half is done; waiting for the preprocessing half"
[ "$(checksums "$TMP/shards-pipe" | wc -l)" = 3 ] || fail "pipe: expected 3 committed shards"
pass "waits bounded by their own limits (a pipeline's trainers) do not count as stalls"
# ... but a file-system call made in such a wait that never returns does count: the trainers'
# rank 0 (world rank 2) polls the shard manifest while it waits for shard 0, and its third
# stat of it hangs (the wait's own limit, &data shard_wait_timeout, cannot end a call the kernel
# holds: without the watchdog the whole job would wait for good)
sed "s|$TMP/shards-pipe'|$TMP/shards-pipew'|; s|$TMP/pipe'|$TMP/pipew'|" "$TMP/pipe.nml" >"$TMP/pipew.nml"
SDTRAIN_TEST_SHARD_DELAY_MS=4000 SD_EIO_HANG=1 SD_EIO_RANK=2 SD_EIO_AFTER=3 \
    SD_EIO_PATH=/shards-pipew/manifest.json SD_EIO_OPS=stat LD_PRELOAD="$PRELOAD" \
    mpi pipew 4 "$SDTRAIN" "$TMP/pipew.nml"
expect_rc pipew 1
expect_in pipew err "the job stalled: no progress on this rank for"
grep -F "[rank 2]" "$TMP/pipew.err" | grep -F "in stat of '$TMP/shards-pipew/manifest.json' for" |
    grep -F ": this rank is stuck in the file system" |
    grep -qF "; in a bounded wait: waiting for the preprocessing half's shards" ||
    { cat "$TMP/pipew.err" >&2; fail "pipew: no report of rank 2 stuck polling the manifest"; }
pass "a file-system call that never returns inside a bounded wait is a stall, named with the wait"
# ... and so does HDF5's own read of a new shard in that wait (not a call of ours: the scan of
# the shard is marked as one call): rank 2's reads of shard 0 never return after the first 6,
# which its H5Fopen makes (with them a hang is in H5Fopen, marked anyway; without the scan's mark
# the job waited for good)
sed "s|$TMP/shards-pipe'|$TMP/shards-pipeh'|; s|$TMP/pipe'|$TMP/pipeh'|" "$TMP/pipe.nml" >"$TMP/pipeh.nml"
SDTRAIN_TEST_SHARD_DELAY_MS=2000 SD_EIO_HANG=1 SD_EIO_RANK=2 SD_EIO_AFTER=6 \
    SD_EIO_PATH=/shards-pipeh/shard-000000.h5 SD_EIO_OPS=read LD_PRELOAD="$PRELOAD" \
    mpi pipeh 4 "$SDTRAIN" "$TMP/pipeh.nml"
expect_rc pipeh 1
grep -F "[rank 2]" "$TMP/pipeh.err" | grep -F "in HDF5 read of '$TMP/shards-pipeh/shard-000000.h5' for" |
    grep -F ": this rank is stuck in the file system" |
    grep -qF "; in a bounded wait: waiting for the preprocessing half's shards" ||
    { cat "$TMP/pipeh.err" >&2; fail "pipeh: no report of rank 2 stuck reading shard 0's header"; }
pass "HDF5's read of a new shard's header that never returns inside the wait: named with the shard"
