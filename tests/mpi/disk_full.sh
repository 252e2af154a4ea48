#!/bin/sh
# A full disk under the writers (each rank writes its part of a checkpoint or shard with pwrite, a
# failure is that rank's, agreed by all; never a hang): a checkpoint whose data write fails
# (ENOSPC) is not committed and training goes on; a shard that fails is not committed and the
# run ends with status 1; what was committed before stays usable and a rerun goes on from it. A read-only
# checkpoint or shard directory is refused when the job starts. Needs a small file system: a
# tmpfs mounted for the test (root); skipped where mounting is refused.
. "$top_srcdir/tests/lib.sh"
need_mpi
full="$TMP/full"
mkdir -p "$full"
mount -t tmpfs -o size=1M sdtrain-test "$full" 2>/dev/null ||
    skip "cannot mount a 1 MiB tmpfs for the full disk (needs root)"
trap 'umount "$full" 2>/dev/null' EXIT

tiny_shards 48 2

# a checkpoint (parameters, moments and EMA: 3.2 MB) on the 1 MiB file system: not started
# (the room is checked first), training goes on, the final weights are written, status 1
STEPS=4 tiny_train_nml ckroom 4 none "" "&checkpoint dir = '$full/ck', every_n_steps = 2 /"
mpi ckroom 2 "$SDTRAIN" "$TMP/ckroom.nml"
expect_rc ckroom 1
expect_in ckroom err "checkpoint of step 2 into '$full/ck' not written (the previous checkpoint stays the latest): it needs 7.2 MiB, and the file system of '$full/ck' has 1.0 MiB free; training goes on"
expect_in ckroom err "checkpoint of step 4 into '$full/ck' not written"
expect_in ckroom err "the final weights are written all the same"
grep -q '^{"step": 2, "checkpoint_step": 2, "checkpoint_failed": 1}$' "$TMP/ckroom/metrics.jsonl" ||
    fail "ckroom: no failed-checkpoint line in metrics.jsonl"
[ -s "$TMP/ckroom/unet_final.safetensors" ] && [ -s "$TMP/ckroom/unet_ema.safetensors" ] ||
    fail "ckroom: the final weights are missing"
pass "a checkpoint that does not fit is not started; training goes on and the weights are written"

# the same with the room check off (a disk filled by something else during the write): each
# rank writes its part with pwrite, which fails cleanly (before 2026-11-27 the collective HDF5
# write ended the job): the checkpoint of step 2 is not committed, its temporary folder is
# removed, training goes on; the final one fails too: the weights are written, status 1
STEPS=4 tiny_train_nml ck 4 none "" "&checkpoint dir = '$full/ck', every_n_steps = 2 /"
SDTRAIN_TEST_NO_ROOM_CHECK=1 mpi ck 2 "$SDTRAIN" "$TMP/ck.nml"
expect_rc ck 1
expect_in ck err "checkpoint of step 2 into '$full/ck' failed (the previous checkpoint stays the latest): writing dataset '"
expect_in ck err "of $full/ck/.step-00000002.tmp/state.h5 failed on rank "
expect_in ck err ": No space left on device; training goes on"
expect_in ck err "checkpoint of step 4 into '$full/ck' failed"
expect_in ck err "the final weights are written all the same"
expect_not_in ck err "ending the job"
[ ! -d "$full/ck/step-00000002" ] && [ ! -d "$full/ck/.step-00000002.tmp" ] ||
    fail "ck: a checkpoint was committed from a failed write, or its temporary folder left"
[ -s "$TMP/ck/unet_final.safetensors" ] || fail "ck: the final weights are missing"
pass "a checkpoint on a full disk is not committed and training goes on, no hang"

# once there is room again the same job starts afresh and finishes
mount -o remount,size=16M "$full" || fail "cannot grow the tmpfs"
STEPS=4 tiny_train_nml ck2 4 none "" "&checkpoint dir = '$full/ck', every_n_steps = 0 /"
mpi ck2 2 "$SDTRAIN" "$TMP/ck2.nml"
expect_rc ck2 0
[ -f "$full/ck/step-00000004/state.h5" ] || fail "ck2: no final checkpoint"
pass "with room again the job runs to its end"

# shards (114 KiB each here, 92 KiB of data) on a 160 KiB file system: a warning before the
# first (the three need 275 KiB), which is then not started either (its room check allows 1 MiB
# for HDF5's metadata): status 1, nothing half-written
rm -rf "${full:?}"/*
mount -o remount,size=160k "$full" || fail "cannot shrink the tmpfs"
nml proc.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc-full', seed = 5, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$full/shards', samples_per_shard = 16, encode_batch_size = 8 /
EOF2
mpi shroom 2 "$SDTRAIN" "$TMP/proc.nml"
expect_rc shroom 1
expect_in shroom err "the 3 shard(s) still to write need about 0.3 MiB (latents, embeddings and token ids), and the file system of '$full/shards' has 0.2 MiB free"
expect_count shroom err "$full/shards/shard-000000.h5 not written: it needs 1.1 MiB, and the file system of '$full/shards' has 0.2 MiB free; the shards committed before are intact" 1
expect_not_in shroom err "ending the job"
[ -z "$(ls -A "$full/shards" 2>/dev/null | grep -v -e manifest -e '^\.sdtrain-writer\.lock$')" ] ||
    fail "shroom: something was left in the shard directory"
pass "a shard that does not fit is not started; a warning says so before the first"

# the same with the room check off (the disk filled by something else during the write): the
# first shard is committed, the second fails (not committed, status 1); with room again the
# rerun goes on from the first
SDTRAIN_TEST_NO_ROOM_CHECK=1 mpi sh 2 "$SDTRAIN" "$TMP/proc.nml"
expect_rc sh 1
expect_in sh err "of $full/shards/.shard-000001.h5.tmp failed on rank "
expect_in sh err ": No space left on device; the shard is not written, the shards committed before are intact and a rerun goes on from them"
expect_not_in sh err "ending the job"
grep -q '"index": 0' "$full/shards/manifest.json" || fail "sh: shard 0 is not committed"
grep -q '"index": 1' "$full/shards/manifest.json" && fail "sh: shard 1 committed from a failed write"
mount -o remount,size=16M "$full" || fail "cannot grow the tmpfs"
mpi sh2 2 "$SDTRAIN" "$TMP/proc.nml"
expect_rc sh2 0
expect_in sh2 out "1 already committed"
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }
checksums "$TMP/shards" >"$TMP/sum-ref"
checksums "$full/shards" >"$TMP/sum-full"
diff "$TMP/sum-ref" "$TMP/sum-full" || fail "the shards finished after the full disk differ"
pass "a shard write on a full disk fails with a message, no hang; the rerun completes it"

# a read-only file system under the checkpoints or the shards: refused when the job starts,
# before any training or encoding (exit 2)
rm -rf "${full:?}"/*
mkdir -p "$full/ro-existing"
mount -o remount,ro "$full" || fail "cannot make the tmpfs read-only"
STEPS=4 tiny_train_nml rock 4 none "" "&checkpoint dir = '$full/ck', every_n_steps = 2 /"
mpi rock 2 "$SDTRAIN" "$TMP/rock.nml"
expect_rc rock 2
expect_count rock err "cannot create checkpoint directory '$full/ck': Read-only file system" 1
expect_not_in rock out "step 1/4"
STEPS=4 tiny_train_nml rock2 4 none "" "&checkpoint dir = '$full/ro-existing' /"
mpi rock2 2 "$SDTRAIN" "$TMP/rock2.nml"
expect_rc rock2 2
expect_count rock2 err "checkpoint directory '$full/ro-existing' is not writable: Read-only file system" 1
mpi rosh 2 "$SDTRAIN" "$TMP/proc.nml" --set data.shard_dir="'$full/ro-existing'"
expect_rc rosh 2
expect_count rosh err "shard directory '$full/ro-existing' is not writable: Read-only file system" 1
expect_not_in rosh out "preprocessing 48 samples"
pass "a read-only checkpoint or shard directory is refused before any work"
