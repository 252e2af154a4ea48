#!/bin/sh
# Storage that fails the job's writes, syncs, listings and looks (doc/checkpoints.md,
# doc/shards.md), through the LD_PRELOAD shim tests/mpi/eio_preload.so (SD_EIO_OPS = write, sync,
# list, stat; SD_EIO_AFTER = how many of them pass first). What each case must show: a message
# naming the file and the errno, never a hang; what was committed before stays usable; what the
# message says stays is what stays; and once the storage is back the rerun finishes with the
# bits of an undisturbed run.
# - Checkpoints: the state file's data (rank 1), its metadata (rank 1, rank 0), its fsync or the
#   manifest's write fail only that checkpoint (a failed close of rank 0's new file ends the job,
#   with the reason); the checkpoint folder's sync after `latest` moved says the checkpoint is
#   committed (it is), not that the previous one stays the latest; every folder sync failing
#   leaves complete checkpoints and no `latest`, which the rerun resumes (it started over before
#   2026-11-27); the final weights' write.
# - Resuming: a look (stat) at the checkpoint `latest` names, and the listing of a checkpoint
#   folder without `latest`, fail with status 1 rather than taking an older checkpoint or a
#   fresh start.
# - Shards: the data (rank 1), the metadata (rank 1, and rank 0, which hung before 2026-11-27), the
#   file's fsync, the folder's sync after the manifest named the
#   shard (the shard was removed then, leaving a manifest that listed a missing file: no rerun
#   got past it before 2026-11-27), a dataset folder's listing.
# - metrics.jsonl that cannot be written; mode 'pipeline' with either half's storage failing.
. "$top_srcdir/tests/lib.sh"
need_mpi
need_eio_shim
COMPARE="${top_builddir:-.}/tests/mpi/shard_compare"

tiny_shards 48 2
failing() { # failing NAME NML RANK PATH OPS [AFTER [FROM END]]: one run with the failing storage
    SD_EIO_RANK=$3 SD_EIO_PATH=$4 SD_EIO_OPS=$5 SD_EIO_AFTER=${6:-0} SD_EIO_ERRNO=5 \
        SD_EIO_OFFSET=${7:-0} SD_EIO_END=${8:-} LD_PRELOAD="$PRELOAD" mpi "$1" 2 "$SDTRAIN" "$2"
}
storage_train_nml ref
mpi ref 2 "$SDTRAIN" "$TMP/ref.nml"
expect_rc ref 0
ck=checkpoints

# the data of the final checkpoint's state file, on rank 1: that checkpoint fails on every rank
# with rank 1's message (each rank writes its part with pwrite: no collective call is left
# half-way), the final weights are written all the same, status 1; step 4 stays the latest, the
# temporary folder is removed, and the rerun resumes step 4
storage_train_nml cdata
failing cdata "$TMP/cdata.nml" 1 .step-00000008.tmp/state.h5 write
expect_rc cdata 1
expect_in cdata err "checkpoint of step 8 into '$TMP/cdata/$ck' failed (the previous checkpoint stays the latest): writing dataset 'params' of $TMP/cdata/$ck/.step-00000008.tmp/state.h5 failed on rank 1: Input/output error (a storage error: a retry may succeed); the final weights are written all the same"
latest_is cdata step-00000004
[ ! -e "$TMP/cdata/$ck/step-00000008" ] && [ ! -e "$TMP/cdata/$ck/.step-00000008.tmp" ] ||
    fail "cdata: the failed checkpoint was committed, or its temporary folder left"
same_weights cdata ref
mpi cdata 2 "$SDTRAIN" "$TMP/cdata.nml"
expect_rc cdata 0
expect_in cdata out "resuming from $TMP/cdata/$ck/step-00000004"
latest_is cdata step-00000008
same_weights cdata ref
pass "a failed write of checkpoint data is not committed; the rerun resumes the one before"

# the same under the file's metadata (its first 2 KiB), on rank 1 and on rank 0: before
# 2026-11-27 the ranks then waited for each other in parallel HDF5's close forever. The state
# file's structure is now made by rank 0 alone: rank 1 writes only data, which the failure does
# not reach; on rank 0 the creation fails (its superblock), the checkpoint is not written and
# training goes on; a failure of the metadata written when rank 0 closes the file ends the job
# with the reason (HDF5 cannot let go of such a file), step 4 latest
storage_train_nml metaclose
failing metaclose "$TMP/metaclose.nml" 0 .step-00000008.tmp/state.h5 write 1 0 2048
[ "$RC" != 0 ] && [ "$RC" != 124 ] || fail "metaclose: exit status $RC"
expect_in metaclose err "sdtrain: creating '$TMP/metaclose/$ck/.step-00000008.tmp/state.h5' failed: "
expect_in metaclose err "ending the job (HDF5 cannot let go of a file whose metadata it could not write); the checkpoints committed before are intact"
latest_is metaclose step-00000004
for r in 1 0; do
    storage_train_nml "meta$r"
    failing "meta$r" "$TMP/meta$r.nml" "$r" .step-00000004.tmp/state.h5 write 0 0 2048
    if [ "$r" = 0 ]; then
        expect_in "meta$r" err "checkpoint of step 4 into '$TMP/meta$r/$ck' failed (the previous checkpoint stays the latest): cannot create '$TMP/meta$r/$ck/.step-00000004.tmp/state.h5'"
        expect_in "meta$r" err "training goes on"
        [ ! -e "$TMP/meta$r/$ck/step-00000004" ] || fail "meta$r: the failed checkpoint was committed"
    fi
    expect_rc "meta$r" 0
    latest_is "meta$r" step-00000008
    same_weights "meta$r" ref
done
pass "a storage error under a checkpoint's metadata: no hang"

# the fsync of step 4's state file on rank 1: that checkpoint fails, on every rank together,
# training goes on and the final checkpoint commits (status 0)
storage_train_nml sync
failing sync "$TMP/sync.nml" 1 .step-00000004.tmp/state.h5 sync
expect_rc sync 0
expect_in sync err "checkpoint of step 4 into '$TMP/sync/$ck' failed (the previous checkpoint stays the latest): cannot sync '$TMP/sync/$ck/.step-00000004.tmp/state.h5': Input/output error (a storage error: a retry may succeed); training goes on"
[ ! -e "$TMP/sync/$ck/step-00000004" ] && [ ! -e "$TMP/sync/$ck/.step-00000004.tmp" ] ||
    fail "sync: step 4 committed, or its temporary folder left"
latest_is sync step-00000008
same_weights sync ref
pass "a checkpoint whose fsync fails is not committed; training goes on"

# the final checkpoint's manifest (rank 0): status 1, the final weights written all the same,
# step 4 stays the latest
storage_train_nml man
failing man "$TMP/man.nml" 0 .step-00000008.tmp/manifest.json write
expect_rc man 1
expect_in man err "checkpoint of step 8 into '$TMP/man/$ck' failed (the previous checkpoint stays the latest): cannot write '$TMP/man/$ck/.step-00000008.tmp/manifest.json.tmp': Input/output error (a storage error: a retry may succeed); the final weights are written all the same"
latest_is man step-00000004
same_weights man ref
pass "a checkpoint whose manifest cannot be written is not committed"

# the checkpoint folder's syncs (rank 0): per checkpoint one after the rename, one after
# `latest` moved. The fourth failing (step 8's `latest`): the message says step 8 is committed
# and named, which it is; the rerun resumes it
storage_train_nml lsync
failing lsync "$TMP/lsync.nml" 0 "/$ck\$" sync 3
expect_rc lsync 1
expect_in lsync err "checkpoint of step 8 into '$TMP/lsync/$ck' is committed and 'latest' names it, but the storage failed at the end (it may not hold the commit durably): cannot sync '$TMP/lsync/$ck': Input/output error"
expect_not_in lsync err "the previous checkpoint stays the latest"
latest_is lsync step-00000008
mpi lsync 2 "$SDTRAIN" "$TMP/lsync.nml"
expect_rc lsync 0
expect_in lsync out "resuming from $TMP/lsync/$ck/step-00000008: step 8"
same_weights lsync ref
# the third (step 8's, after its rename): step 8 is in place, `latest` still names step 4,
# and the message says so
storage_train_nml rsync8
failing rsync8 "$TMP/rsync8.nml" 0 "/$ck\$" sync 2
expect_rc rsync8 1
expect_in rsync8 err "checkpoint of step 8 into '$TMP/rsync8/$ck' is in place as step-00000008, but 'latest' still names step-00000004, which a resume takes: cannot sync '$TMP/rsync8/$ck': Input/output error"
latest_is rsync8 step-00000004
# every one failing: steps 4 and 8 are renamed into place but `latest` is never written; the
# rerun resumes the newest complete one (it started over before, replacing them)
storage_train_nml nolatest
failing nolatest "$TMP/nolatest.nml" 0 "/$ck\$" sync
expect_rc nolatest 1
expect_in nolatest err "checkpoint of step 4 into '$TMP/nolatest/$ck' is in place as step-00000004, but no 'latest' names it (a resume takes the newest complete checkpoint: this one): cannot sync"
expect_in nolatest err "checkpoint of step 8 into '$TMP/nolatest/$ck' is in place as step-00000008, but no 'latest' names it"
expect_not_in nolatest err "the previous checkpoint stays the latest"
[ -f "$TMP/nolatest/$ck/step-00000008/state.h5" ] && [ ! -e "$TMP/nolatest/$ck/latest" ] ||
    fail "nolatest: expected step 8 in place and no latest"
mpi nolatest 2 "$SDTRAIN" "$TMP/nolatest.nml"
expect_rc nolatest 0
expect_in nolatest err "resume: $TMP/nolatest/$ck has no 'latest' but holds the complete checkpoint step-00000008 (a commit interrupted before 'latest' was written?); resuming from it"
expect_in nolatest out "resuming from $TMP/nolatest/$ck/step-00000008: step 8"
expect_not_in nolatest out "starting from step 0"
latest_is nolatest step-00000008
same_weights nolatest ref
pass "what a failed folder sync leaves is what the message says, and the rerun resumes it"

# the final weights (rank 0): status 1, no file and no temporary left; the rerun writes them
storage_train_nml final
failing final "$TMP/final.nml" 0 /unet_final.safetensors write
expect_rc final 1
expect_in final err "$TMP/final/unet_final.safetensors: cannot write $TMP/final/unet_final.safetensors.tmp-"
expect_in final err ": Input/output error"
[ -z "$(ls "$TMP/final" | grep unet_final)" ] || fail "final: a final weights file or temporary was left"
latest_is final step-00000008
mpi final 2 "$SDTRAIN" "$TMP/final.nml"
expect_rc final 0
same_weights final ref
pass "final weights that cannot be written end the run with status 1; the rerun writes them"

# resuming (the finished reference run, to 12 steps): a look at the checkpoint `latest` names
# fails (EIO) on rank 0: status 1, nothing set aside or replaced by step 4
sed 's/max_steps = 8/max_steps = 12/' "$TMP/ref.nml" >"$TMP/ref12.nml"
failing look "$TMP/ref12.nml" 0 step-00000008/manifest.json stat
expect_rc look 1
expect_in look err "cannot look at '$TMP/ref/$ck/step-00000008/manifest.json': Input/output error (a storage error: a retry may succeed)"
expect_not_in look err "newest complete checkpoint before it"
latest_is ref step-00000008
[ -d "$TMP/ref/$ck/step-00000008" ] || fail "look: step 8 was set aside"
# without `latest`, the listing of the folder fails: status 1, not a fresh start
rm "$TMP/ref/$ck/latest"
failing list "$TMP/ref12.nml" 0 "/$ck\$" list
expect_rc list 1
expect_in list err "cannot list checkpoint directory '$TMP/ref/$ck': Input/output error (a storage error: a retry may succeed)"
expect_not_in list out "starting from step 0"
[ ! -e "$TMP/ref/$ck/step-00000012" ] || fail "list: the run went on"
pass "a look or a listing the storage fails while resolving the resume ends with status 1"

# shards: mode 'process' into a fresh folder each, compared with tiny_shards' at tolerance 0
proc_nml() { # proc_nml NAME: $TMP/NAME.nml writing into $TMP/NAME-shards
    sed "s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/$1-shards'|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/$1'|" \
        "$TMP/proc.nml" >"$TMP/$1.nml"
}
rerun_equal() { # rerun_equal NAME: the storage back, the rerun completes the undisturbed shards
    mpi "$1-back" 2 "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1-back" 0
    for k in 0 1 2; do
        f=shard-00000$k.h5
        "$COMPARE" "$TMP/$1-shards/$f" "$TMP/shards/$f" 0 >"$TMP/$1-cmp$k.out" 2>&1 ||
            { cat "$TMP/$1-cmp$k.out"; fail "$1: $f differs from the undisturbed run's"; }
    done
}
committed_only() { # committed_only NAME FILES...: the shard folder holds just these
    name=$1
    shift
    want=$(for f in "$@"; do echo "$f"; done | sort | tr '\n' ' ')
    have=$(ls -A "$TMP/$name-shards" | grep -v '^\.sdtrain-writer\.lock$' | sort | tr '\n' ' ')
    [ "$have" = "$want" ] || fail "$name: the shard folder holds '$have', expected '$want'"
}
# shard 1's data on rank 1: the job ends, shard 0 stays committed
proc_nml sdata
failing sdata "$TMP/sdata.nml" 1 shard-000001 write
[ "$RC" = 1 ] || { cat "$TMP/sdata.err"; fail "sdata: status $RC, expected 1"; }
expect_in sdata err "writing /image_latents_32 of $TMP/sdata-shards/.shard-000001.h5.tmp failed on rank 1"
expect_in sdata err "the shards committed before are intact and a rerun goes on from them"
rerun_equal sdata
# the metadata of shard 1 (its first 2 KiB; the pattern ends with the file's name: Open MPI names
# a semaphore after it): on rank 1 nothing (rank 1 writes rows only), on rank 0 the creation
# fails, the shard is not written; before 2026-11-27 rank 0's failure hung the job in parallel
# HDF5's close (rank 0 in a metadata write of the cache's sync point, rank 1 in its barrier)
for r in 1 0; do
    proc_nml "smeta$r"
    failing "smeta$r" "$TMP/smeta$r.nml" "$r" "smeta$r-shards/.shard-000001.h5.tmp\$" write 0 0 2048
    if [ "$r" = 0 ]; then
        expect_rc "smeta$r" 1
        expect_in "smeta$r" err "cannot create '$TMP/smeta$r-shards/.shard-000001.h5.tmp'"
        expect_in "smeta$r" err "the shard is not written, the shards committed before are intact and a rerun goes on from them"
        rerun_equal "smeta$r"
    else
        expect_rc "smeta$r" 0
    fi
done
# shard 1's fsync on rank 1: that shard is not written, every rank stops
proc_nml ssync
failing ssync "$TMP/ssync.nml" 1 .shard-000001.h5.tmp sync
expect_rc ssync 1
expect_in ssync err "cannot sync '$TMP/ssync-shards/.shard-000001.h5.tmp': Input/output error (a storage error: a retry may succeed); the shard is not written, the shards committed before are intact and a rerun goes on from them"
# (the summary counts the committed shard: a failed run writes it too, since 2026-11-27)
committed_only ssync manifest.json preprocess_summary.json shard-000000.h5
rerun_equal ssync
# the folder's second sync (rank 0): after the manifest listing shard 0 replaced the old one.
# The shard stays (removing it left a manifest naming a missing file)
proc_nml msync
failing msync "$TMP/msync.nml" 0 "/msync-shards\$" sync 1
expect_rc msync 1
expect_in msync err "cannot sync '$TMP/msync-shards': Input/output error (a storage error: a retry may succeed); the manifest listing shard-000000.h5 had replaced the old one: the shard stays committed, though the storage may not hold it durably, and a rerun goes on from it"
# (not in the summary: the run took its commit for failed; shards_counted says so on the rerun)
committed_only msync manifest.json shard-000000.h5
rerun_equal msync
# the folder's first sync (after the rename, before the manifest): the shard is removed again
proc_nml rsync
failing rsync "$TMP/rsync.nml" 0 "/rsync-shards\$" sync
expect_rc rsync 1
expect_in rsync err "cannot sync '$TMP/rsync-shards': Input/output error (a storage error: a retry may succeed); the shard is not written"
committed_only rsync
rerun_equal rsync
pass "a shard whose write, fsync or commit fails: what the message says stays, and the rerun completes"

# a folder of the dataset whose listing fails (readdir: EIO) while it is indexed: status 1
# before any shard, not a dataset with that folder left out
proc_nml dlist
failing dlist "$TMP/dlist.nml" 0 "00000\$" list
expect_rc dlist 1
expect_in dlist err "$TMP/data/00000/: Input/output error (a storage error: a retry may succeed)"
[ ! -e "$TMP/dlist-shards/shard-000000.h5" ] || fail "dlist: a shard was written"
rerun_equal dlist
pass "a dataset folder whose listing fails ends the run before any shard"

# metrics.jsonl that cannot be written (here /dev/full: every flush fails with ENOSPC): one
# warning naming the file, the step and the errno; training goes on and ends with the
# undisturbed run's weights; the summary says the metrics are incomplete
if [ -c /dev/full ]; then
    storage_train_nml metrics
    mkdir -p "$TMP/metrics"
    ln -s /dev/full "$TMP/metrics/metrics.jsonl"
    mpi metrics 2 "$SDTRAIN" "$TMP/metrics.nml"
    expect_rc metrics 0
    expect_count metrics err "cannot write $TMP/metrics/metrics.jsonl at step 0: No space left on device; training goes on without it" 1
    expect_in metrics out "INCOMPLETE"
    expect_in metrics out "$TMP/metrics/metrics.jsonl from step 0 on: writing it failed"
    same_weights metrics ref
    pass "metrics.jsonl that cannot be written: one warning, training goes on"
fi

# mode 'pipeline' (2 preprocessing + 2 training ranks): a storage failure on either half ends
# the whole job with status 1 and the half's message, no hang. The preprocessing half: shard 1's
# fsync on rank 0 (shard 0 stays committed); the training half: rank 3's reads of shard 0 from
# byte 4096 (its step-0 validation)
pipe_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$TMP/$1', seed = 11, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/$1-shards', samples_per_shard = 16,
      encode_batch_size = 8, val_fraction = 0.2 /
&train max_steps = 8, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 2,
       log_every = 2, val_every = 4 /
EOF2
}
pipe_nml psync
SD_EIO_RANK=0 SD_EIO_PATH=.shard-000001.h5.tmp SD_EIO_OPS=sync LD_PRELOAD="$PRELOAD" \
    mpi psync 4 "$SDTRAIN" "$TMP/psync.nml"
expect_rc psync 1
expect_in psync err "cannot sync '$TMP/psync-shards/.shard-000001.h5.tmp': Input/output error (a storage error: a retry may succeed); the shard is not written"
expect_in psync err "mode 'pipeline': the preprocessing half failed (exit status 1); ending the whole job"
committed_only psync manifest.json preprocess_summary.json shard-000000.h5
pipe_nml pread
SD_EIO_RANK=3 SD_EIO_PATH=/pread-shards/shard-000000 SD_EIO_OFFSET=4096 LD_PRELOAD="$PRELOAD" \
    mpi pread 4 "$SDTRAIN" "$TMP/pread.nml"
expect_rc pread 1
expect_in pread err "$TMP/pread-shards/shard-000000.h5"
expect_in pread err "Input/output error (a storage error, not damage: the shard may be intact)"
expect_in pread err "mode 'pipeline': the training half failed (exit status 1); ending the whole job"
pass "a storage failure in either half of mode 'pipeline' ends the whole job with status 1"
