#!/bin/sh
# Checkpoints written in the background (&checkpoint async, doc/checkpoints.md): the same
# training bits and the same checkpoint data as checkpoints written at once (DDP and ZeRO-2, and
# the device path's CPU emulation), committed at a later step boundary; a writer slower than the
# checkpoint interval is waited for; a rank killed while its writer runs or at the commit, a
# signal while a write is in flight, a read-back that finds other data and a storage error under
# the writer: the previous checkpoint stays the latest and a rerun gives the uninterrupted bits;
# a rank without the memory for its copy turns the background writes off, with one warning.
. "$top_srcdir/tests/lib.sh"
need_mpi

tiny_shards 48 2

# train_nml NAME BATCH SHARDING ASYNC [CHECKPOINT-KEYS]: 12 steps, a checkpoint every 4
train_nml() {
    STEPS=12 tiny_train_nml "$1" "$2" "$3" "" "&checkpoint every_n_steps = 4, async = $4 ${5:-} /"
}
# sums NAME STEP: the checksums of a checkpoint's manifest (what its data is)
sums() {
    sed -n '/"checksums"/,/}/p' "$TMP/$1/checkpoints/$(printf 'step-%08d' "$2")/manifest.json"
}
# same_checkpoints NAME REF: steps 4, 8 and 12 hold the same data (checksums, and the datasets
# themselves with h5diff when there is one) and pass sdtool inspect --verify
same_checkpoints() {
    for s in 4 8 12; do
        d=$(printf 'step-%08d' "$s")
        [ -n "$(sums "$1" "$s")" ] && [ "$(sums "$1" "$s")" = "$(sums "$2" "$s")" ] ||
            fail "$1: the checksums of $d differ from $2's: $(sums "$1" "$s") / $(sums "$2" "$s")"
        if command -v h5diff >/dev/null; then
            h5diff "$TMP/$2/checkpoints/$d/state.h5" "$TMP/$1/checkpoints/$d/state.h5" >"$TMP/h5diff.out" 2>&1 ||
                fail "$1: $d's state.h5 differs from $2's: $(head -5 "$TMP/h5diff.out")"
        fi
        run "verify-$1-$s" "$SDTOOL" inspect --verify "$TMP/$1/checkpoints/$d"
        expect_rc "verify-$1-$s" 0
    done
}

# the references, written at once: DDP 2 x 4, and ZeRO-2
train_nml ref 4 none .false.
mpi ref 2 "$SDTRAIN" "$TMP/ref.nml"
expect_rc ref 0
train_nml zref 4 shard_grad_op .false.
mpi zref 2 "$SDTRAIN" "$TMP/zref.nml"
expect_rc zref 0

# 1. in the background: the same bits, the same checkpoints, each committed at a later boundary
train_nml bg 4 none .true.
mpi bg 2 "$SDTRAIN" "$TMP/bg.nml"
expect_rc bg 0
expect_in bg out "&checkpoint async: the copy of the state that background checkpoints write takes 1.6 MiB of host memory on rank 0"
expect_in bg out "step 4: checkpoint started in the background (training held"
expect_in bg out "checkpoint of step 4 written to $TMP/bg/checkpoints/step-00000004 in the background"
expect_in bg out "checkpoint of step 8 written to $TMP/bg/checkpoints/step-00000008 in the background"
# the final checkpoint is written at once
expect_in bg out "step 12: checkpoint written to $TMP/bg/checkpoints/step-00000012 ("
expect_count bg out "checkpoint started in the background" 2
same_run bg ref
same_checkpoints bg ref
latest_is bg step-00000012
expect_in verify-bg-4 out "read back and checked when written: yes"
train_nml zbg 4 shard_grad_op .true.
mpi zbg 2 "$SDTRAIN" "$TMP/zbg.nml"
expect_rc zbg 0
same_run zbg zref
same_checkpoints zbg zref
pass "background checkpoints: the same training and checkpoint data (DDP and ZeRO-2)"

# the device path (its CPU emulation: the state downloaded for the checkpoint), ZeRO-2
SDTRAIN_EMULATE_DEVICE_PATH=1 mpi ezref 2 "$SDTRAIN" "$TMP/zref.nml" --set "run.output_dir='$TMP/ezref'"
expect_rc ezref 0
SDTRAIN_EMULATE_DEVICE_PATH=1 mpi ezbg 2 "$SDTRAIN" "$TMP/zbg.nml" --set "run.output_dir='$TMP/ezbg'"
expect_rc ezbg 0
expect_in ezbg out "checkpoint of step 8 written to $TMP/ezbg/checkpoints/step-00000008 in the background"
expect_not_in ezbg out "page-locked" # the CPU backend's memory is not, whatever the path
same_run ezbg ezref
same_checkpoints ezbg ezref
# and the device path's checkpoints, written from its buffers through the copy hook (at once: a
# host block at a time; in the background: straight into the copy), hold the host path's data
same_checkpoints ezref zref
pass "background checkpoints on the emulated device path; its checkpoints are the host path's"

# 2. a slow writer (each starts 1.5 s late): still in flight when the next checkpoint is due, it
# is waited for and committed first; the run's bits do not change
train_nml slow 4 none .true.
SDTRAIN_TEST_CKPT_DELAY_MS=1500 mpi slow 2 "$SDTRAIN" "$TMP/slow.nml" --set checkpoint.every_n_steps=2
expect_rc slow 0
expect_in slow out "step 4: checkpoint of step 2 written to $TMP/slow/checkpoints/step-00000002 in the background"
expect_in slow out "step 12: checkpoint of step 10 written to $TMP/slow/checkpoints/step-00000010 in the background"
same_run slow ref
kept=$(cd "$TMP/slow/checkpoints" && echo step-*)
[ "$kept" = "step-00000008 step-00000010 step-00000012" ] || fail "slow: keep_last = 3 left $kept"
pass "a writer slower than the interval is waited for"

# 3. a rank killed while its writer writes step 8's data: step 4 stays the latest, the leftover
# goes at the rerun, which gives the uninterrupted bits
train_nml wkill 4 none .true.
SDTRAIN_FAULT=kill:rank=1:phase=ckpt-write:step=8 mpi wkill 2 "$SDTRAIN" "$TMP/wkill.nml"
[ "$RC" != 0 ] || fail "wkill: the killed run exited 0"
expect_in wkill err "killing this rank at phase 'ckpt-write'"
latest_is wkill step-00000004
[ ! -e "$TMP/wkill/checkpoints/step-00000008" ] || fail "wkill: a half-written checkpoint is visible"
mpi wkill 2 "$SDTRAIN" "$TMP/wkill.nml"
expect_rc wkill 0
expect_in wkill out "left by an interrupted checkpoint write"
expect_in wkill out "resuming from $TMP/wkill/checkpoints/step-00000004"
same_run wkill ref
# ... and killed at the commit of step 8 (rank 0, after the rename, before `latest`)
train_nml ckill 4 none .true.
SDTRAIN_FAULT=kill:rank=0:phase=ckpt-commit:step=8 mpi ckill 2 "$SDTRAIN" "$TMP/ckill.nml"
[ "$RC" != 0 ] || fail "ckill: the killed run exited 0"
latest_is ckill step-00000004
mpi ckill 2 "$SDTRAIN" "$TMP/ckill.nml"
expect_rc ckill 0
expect_in ckill out "resuming from $TMP/ckill/checkpoints/step-00000004"
same_run ckill ref
pass "a rank killed during a background write or its commit"

# 4. SIGUSR1 (rank 1, end of step 6) while step 4's writer is still at work: it is committed,
# then step 6 is written at once; the rerun resumes step 6
train_nml usr1 4 none .true.
SDTRAIN_TEST_CKPT_DELAY_MS=1500 SDTRAIN_FAULT=usr1:rank=1:step=5 mpi usr1 2 "$SDTRAIN" "$TMP/usr1.nml"
expect_rc usr1 0
expect_in usr1 out "step 6: checkpoint of step 4 written to $TMP/usr1/checkpoints/step-00000004 in the background"
expect_in usr1 out "checkpointed at step 6 after SIGUSR1; resubmit to continue"
latest_is usr1 step-00000006
mpi usr1 2 "$SDTRAIN" "$TMP/usr1.nml"
expect_rc usr1 0
expect_in usr1 out "resuming from $TMP/usr1/checkpoints/step-00000006: step 6"
same_run usr1 ref
pass "a signal while a background write is in flight"

# 5. the read-back finds other data (a bit flipped on disk after rank 1's write): step 4 is not
# committed, every rank reports it, training goes on and the later checkpoints commit
train_nml flip 4 none .true.
SDTRAIN_FAULT=flip:rank=1:phase=ckpt-write:step=4 mpi flip 2 "$SDTRAIN" "$TMP/flip.nml"
expect_rc flip 0
expect_in flip err "SDTRAIN_FAULT: flipped a bit of dataset 'params'"
expect_in flip err "checkpoint of step 4 into '$TMP/flip/checkpoints' failed (the previous checkpoint stays the latest): read back, rank 1's part of dataset 'params' of $TMP/flip/checkpoints/.step-00000004.tmp/state.h5 has checksum"
expect_in flip err "the file system returned other data than was written; training goes on"
[ ! -e "$TMP/flip/checkpoints/step-00000004" ] && [ ! -e "$TMP/flip/checkpoints/.step-00000004.tmp" ] ||
    fail "flip: step 4 committed, or its temporary folder left"
latest_is flip step-00000012
same_run flip ref
pass "a background write whose read-back differs is not committed"

# 6. the storage fails rank 1's writes of step 4's state file (the failing disk of
# tests/mpi/storage_writes.sh): not committed, training goes on (with checkpoints written at
# once such a failure ends the job: HDF5's collective write cannot be left half-way)
if [ -f "$top_builddir/tests/mpi/eio_preload.so" ]; then
    need_eio_shim
    train_nml eio 4 none .true.
    SD_EIO_RANK=1 SD_EIO_PATH=.step-00000004.tmp/state.h5 SD_EIO_OPS=write SD_EIO_ERRNO=28 \
        LD_PRELOAD="$PRELOAD" mpi eio 2 "$SDTRAIN" "$TMP/eio.nml"
    expect_rc eio 0
    expect_in eio err "checkpoint of step 4 into '$TMP/eio/checkpoints' failed (the previous checkpoint stays the latest): writing dataset 'params' of $TMP/eio/checkpoints/.step-00000004.tmp/state.h5 failed on rank 1: No space left on device"
    expect_in eio err "training goes on"
    [ ! -e "$TMP/eio/checkpoints/step-00000004" ] || fail "eio: step 4 committed"
    latest_is eio step-00000012
    same_run eio ref
    pass "a background write the storage fails is not committed; training goes on"
fi

# 7. a rank without the memory for its copy (reserved at the start): one warning, the
# checkpoints written at once
train_nml nomem 4 none .true.
SDTRAIN_TEST_CKPT_NO_MEMORY=1 mpi nomem 2 "$SDTRAIN" "$TMP/nomem.nml"
expect_rc nomem 0
expect_count nomem err "rank 1 has no room in host memory for its copy of the state" 1
expect_count nomem err "&checkpoint async is off for this run; checkpoints are written at once" 1
expect_not_in nomem out "in the background"
same_run nomem ref
same_checkpoints nomem ref
pass "no memory for the copy: checkpoints written at once"
