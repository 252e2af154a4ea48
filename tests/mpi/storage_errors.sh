#!/bin/sh
# Storage that fails underneath the libraries (doc/checkpoints.md, doc/loader.md,
# doc/datasets.md): tests/mpi/eio_preload.so (LD_PRELOAD) makes the reads of one file fail on one
# rank (or any), with a chosen errno, from a chosen byte, so HDF5, json-c and our own readers meet
# the error where a lost server or a bad sector would put it. Each case must be told apart from
# damage or bad input: the run ends with status 1 (a requeued job tries again), not 2, with a
# message that names the file and says it is a storage error.
# - Resuming: the checkpoint is neither set aside nor replaced by an older one, `latest` is
#   unchanged, and once the storage is back the next run resumes from it.
# - The shards the loader reads: at set-up, during training, in the step-0 validation.
# - Mode 'process': an input image stops the run (the committed shards kept; the rerun's shards
#   equal an undisturbed run's) instead of being skipped as damaged, while EACCES still is a skip;
#   a TSV manifest or a tar that fails while the dataset is indexed ends it before any shard.
. "$top_srcdir/tests/lib.sh"
need_mpi
need_eio_shim
command -v h5ls >/dev/null || skip "no h5ls (hdf5-tools) to find the datasets' addresses"

tiny_shards 48 2
storage_train_nml run
mpi first 2 "$SDTRAIN" "$TMP/run.nml"
expect_rc first 0
ck="$TMP/run/checkpoints/step-00000008"
[ -f "$ck/state.h5" ] || fail "no checkpoint of step 8"
# resume the finished run of 8 steps to 12: the checkpoint of step 8 is read
sed -i 's/max_steps = 8/max_steps = 12/' "$TMP/run.nml"

# where HDF5 keeps things in the state file: the data of 'params' (its bytes only: the datasets'
# attributes, added at the commit, lie after the data), the object header of 'adam_m'
data_at=$(h5ls -va "$ck/state.h5/params" | sed -n 's/.*Address: *\([0-9][0-9]*\).*/\1/p' | head -1)
data_bytes=$(h5ls -va "$ck/state.h5/params" | sed -n 's/.*Storage: *\([0-9][0-9]*\) logical bytes.*/\1/p' | head -1)
m_header=$(h5ls -v "$ck/state.h5/adam_m" | sed -n 's/.*Location: *[0-9]*:\([0-9][0-9]*\).*/\1/p' | head -1)
[ -n "$data_at" ] && [ -n "$data_bytes" ] && [ -n "$m_header" ] ||
    fail "h5ls gave no addresses (data '$data_at' + '$data_bytes', header '$m_header')"

# storage_case NAME RANK FILE ERRNO FROM END MESSAGE: one resume with the failing disk
storage_case() {
    SD_EIO_RANK=$2 SD_EIO_PATH=$3 SD_EIO_ERRNO=$4 SD_EIO_OFFSET=$5 SD_EIO_END=$6 \
        LD_PRELOAD="$PRELOAD" mpi "$1" 2 "$SDTRAIN" "$TMP/run.nml"
    expect_rc "$1" 1
    expect_in "$1" err "$7"
    expect_in "$1" err "(a storage error, not damage: the checkpoint may be intact)"
    expect_in "$1" err "the checkpoint is left as it is, and the run ends with status 1"
    [ -d "$ck" ] && [ ! -e "$ck.damaged" ] || fail "$1: the checkpoint was set aside for a storage error"
    [ "$(cat "$TMP/run/checkpoints/latest")" = step-00000008 ] || fail "$1: latest changed"
}
# every read of the state file on rank 1: HDF5 cannot open it
storage_case open 1 /state.h5 5 0 "" "cannot open checkpoint file $ck/state.h5: Input/output error"
# the data of 'params' on rank 0, a stale NFS handle: the file opens, the read fails
storage_case data 0 /state.h5 116 "$data_at" $((data_at + data_bytes)) "reading dataset 'params' failed: Stale file handle"
# only the object header of dataset 'adam_m' on rank 1: opening the dataset fails
storage_case header 1 /state.h5 5 "$m_header" $((m_header + 1)) "cannot open dataset 'adam_m'"
# the manifest on rank 0 (json-c reads it); the checkpoint's, not the shard directory's
storage_case manifest 0 /step-00000008/manifest.json 5 0 "" "cannot read checkpoint manifest '$ck/manifest.json': Input/output error"

# the shards, which the loader reads: every read of them on rank 0, which opens shards 0 and 2
# at set-up; then, on rank 1, their bytes from 4096 on, which it meets at set-up too (the ranks
# scan the shards together: rank 1 takes shard 1)
shard_case() {
    SD_EIO_RANK=$2 SD_EIO_PATH=/shards/shard- SD_EIO_ERRNO=5 SD_EIO_OFFSET=$3 \
        LD_PRELOAD="$PRELOAD" mpi "$1" 2 "$SDTRAIN" "$TMP/run.nml"
    expect_rc "$1" 1
    expect_in "$1" err "$4"
    expect_in "$1" err "Input/output error (a storage error, not damage: the shard may be intact)"
    [ "$(cat "$TMP/run/checkpoints/latest")" = step-00000008 ] || fail "$1: latest changed"
}
shard_case shard-open 0 0 "cannot open shard '$TMP/shards/shard-000000.h5'"
shard_case shard-read 1 4096 "$TMP/shards/shard-00000"
# the shard directory's manifest, which rank 0 reads with read(2) since 84032e2 (with stdio
# before, out of the shim's reach): a storage error, status 1, said as one
SD_EIO_RANK=0 SD_EIO_PATH=/shards/manifest.json SD_EIO_ERRNO=5 \
    LD_PRELOAD="$PRELOAD" mpi shard-manifest 2 "$SDTRAIN" "$TMP/run.nml"
expect_rc shard-manifest 1
expect_in shard-manifest err "cannot read shard manifest '$TMP/shards/manifest.json': Input/output error (a storage error: a retry may succeed)"
[ "$(cat "$TMP/run/checkpoints/latest")" = step-00000008 ] || fail "shard-manifest: latest changed"

# a fresh run reads the held-out samples first (the step-0 validation): rank 1's shard reads
# failing there end the run with status 1 as well, every rank together, no step taken. One shard
# of 48, so that rank 1 scans none at set-up and meets the failure in the validation read.
sed "s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards1'|; s|samples_per_shard = 16|samples_per_shard = 48|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/proc1'|" \
    "$TMP/proc.nml" >"$TMP/proc1.nml"
mpi proc1 2 "$SDTRAIN" "$TMP/proc1.nml"
expect_rc proc1 0
sed "s|output_dir = '$TMP/run'|output_dir = '$TMP/fresh'|; s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards1'|" \
    "$TMP/run.nml" >"$TMP/fresh.nml"
SD_EIO_RANK=1 SD_EIO_PATH=/shards1/shard- SD_EIO_ERRNO=5 SD_EIO_OFFSET=4096 \
    LD_PRELOAD="$PRELOAD" mpi fresh 2 "$SDTRAIN" "$TMP/fresh.nml"
expect_rc fresh 1
expect_in fresh err "validation read: $TMP/shards1/shard-000000"
expect_in fresh err "(a storage error, not damage: the shard may be intact)"
[ ! -d "$TMP/fresh/checkpoints" ] || [ -z "$(ls "$TMP/fresh/checkpoints")" ] ||
    fail "fresh: a checkpoint was written although no step was taken"

# preprocessing: the image of sample 25 (in shard 1 of 3) cannot be read, EIO, on whichever
# rank reads it. Skipping it would silently change the dataset, so the run stops: status 1,
# shard 0 stays committed, shard 1 is not written; the storage back, the rerun commits shards 1
# and 2, and all three hold what the undisturbed run of tiny_shards wrote
sed "s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards2'|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/proc2'|" \
    "$TMP/proc.nml" >"$TMP/proc2.nml"
SD_EIO_PATH=/00000/000000025. SD_EIO_ERRNO=5 LD_PRELOAD="$PRELOAD" mpi proc-eio 2 "$SDTRAIN" "$TMP/proc2.nml"
expect_rc proc-eio 1
expect_in proc-eio err "cannot read input $TMP/data/00000/000000025."
expect_in proc-eio err "Input/output error (a storage error: a retry may succeed); the shards committed so far are kept, shard 1 is not written"
[ -f "$TMP/shards2/shard-000000.h5" ] && [ ! -f "$TMP/shards2/shard-000001.h5" ] ||
    fail "proc-eio: expected shard 0 committed and shard 1 not written"
mpi proc-back 2 "$SDTRAIN" "$TMP/proc2.nml"
expect_rc proc-back 0
# the summary counts the samples of all three: the failed run wrote it for the shard it had
# committed, the rerun added its two (it counted 2 of the 3 before)
grep -q '"shards_committed": 3, "shards_counted": 3, ' "$TMP/shards2/preprocess_summary.json" ||
    fail "preprocessing rerun: summary $(head -n 1 "$TMP/shards2/preprocess_summary.json")"
COMPARE="${top_builddir:-.}/tests/mpi/shard_compare"
for k in 0 1 2; do
    f=shard-00000$k.h5
    "$COMPARE" "$TMP/shards2/$f" "$TMP/shards/$f" 0 >"$TMP/cmp$k.out" 2>&1 ||
        { cat "$TMP/cmp$k.out"; fail "preprocessing rerun: $f differs from the undisturbed run's"; }
done

# the dataset's index: a TSV manifest the storage cannot deliver fails the open with status 1
# (a retry), not 2 (bad input), and no shard is written
{
    printf 'path\tcaption\n'
    for f in "$TMP"/data/00000/*.jpg; do printf '%s\t%s\n' "$f" "$(cat "${f%.jpg}.txt")"; done
} >"$TMP/manifest.tsv"
sed "s|input = '$TMP/data'|input = '$TMP/manifest.tsv'|; s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards4'|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/proc4'|" \
    "$TMP/proc.nml" >"$TMP/proc4.nml"
SD_EIO_PATH=/manifest.tsv SD_EIO_ERRNO=5 LD_PRELOAD="$PRELOAD" mpi index-eio 2 "$SDTRAIN" "$TMP/proc4.nml"
expect_rc index-eio 1
expect_in index-eio err "$TMP/manifest.tsv: Input/output error (a storage error: a retry may succeed)"
[ ! -e "$TMP/shards4/shard-000000.h5" ] || fail "index-eio: a shard was written"
mpi index-back 2 "$SDTRAIN" "$TMP/proc4.nml"
expect_rc index-back 0

# a webdataset tar the storage cannot deliver while it is indexed: the same (not a damaged
# shard skipped)
mkdir -p "$TMP/wds"
tar -cf "$TMP/wds/part-000.tar" -C "$TMP/data/00000" .
sed "s|input = '$TMP/data'|input = '$TMP/wds'|; s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards5'|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/proc5'|" \
    "$TMP/proc.nml" >"$TMP/proc5.nml"
SD_EIO_PATH=/part-000.tar SD_EIO_ERRNO=116 LD_PRELOAD="$PRELOAD" mpi tar-eio 2 "$SDTRAIN" "$TMP/proc5.nml"
expect_rc tar-eio 1
expect_in tar-eio err "$TMP/wds/part-000.tar: read error at offset 0: Stale file handle (a storage error: a retry may succeed)"
mpi tar-back 2 "$SDTRAIN" "$TMP/proc5.nml"
expect_rc tar-back 0

# EACCES on that image is the file's own business, not the storage's: skipped as unreadable
sed "s|shard_dir = '$TMP/shards'|shard_dir = '$TMP/shards3'|; s|output_dir = '$TMP/proc'|output_dir = '$TMP/proc3'|" \
    "$TMP/proc.nml" >"$TMP/proc3.nml"
SD_EIO_PATH=/00000/000000025. SD_EIO_ERRNO=13 LD_PRELOAD="$PRELOAD" mpi proc-acces 2 "$SDTRAIN" "$TMP/proc3.nml"
expect_rc proc-acces 0
expect_in proc-acces out "unreadable"
[ -f "$TMP/shards3/shard-000002.h5" ] || fail "proc-acces: not every shard was written"

# the storage back: the checkpoint of step 8 resumes
mpi back 2 "$SDTRAIN" "$TMP/run.nml"
expect_rc back 0
expect_in back out "resuming from $ck: step 8"
pass "storage errors below HDF5 and json-c are told apart from damage"
