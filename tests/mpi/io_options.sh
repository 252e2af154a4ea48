#!/bin/sh
# &run io_hints and io_alignment (doc/checkpoints.md "Parallel file systems"): the hints reach
# MPI_File_open of the shards and checkpoints, the log says what MPI-IO reports for each, and the
# datasets of a checkpoint and of a shard at least one alignment unit long start on
# a multiple of it. None of it changes a value: shards and weights are the same bits as with HDF5's
# packing, and a checkpoint written aligned resumes. Bad hints are a configuration error.
. "$top_srcdir/tests/lib.sh"
need_mpi
COMPARE="${top_builddir:-.}/tests/mpi/st_compare"
SHARDCMP="${top_builddir:-.}/tests/mpi/shard_compare"
command -v h5dump >/dev/null 2>&1 || skip "no h5dump (Debian: hdf5-tools)"

run data "$SDTOOL" make-demo-data "$TMP/data" --count 32
expect_rc data 0
# proc_nml NAME RUN-KEYS: the demo images into $TMP/NAME-shards
proc_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'process', output_dir = '$TMP/$1', seed = 5, device = 'cpu' $2 /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/$1-shards', samples_per_shard = 16,
      encode_batch_size = 8, shard_dtype = 'fp32' /
EOF2
}
# offsets FILE DATASET...: the file offset of each dataset's data (contiguous datasets)
offsets() {
    f=$1
    shift
    for d in "$@"; do
        h5dump -p -H -d "$d" "$f" | sed -n 's/^ *OFFSET \([0-9]*\).*/\1/p'
    done
}

# (a) shards: packed (0) and with 4 KiB units; a shard of 16 tiny samples has contiguous latents
# of 16 x 2 x 4 x 4 x 4 floats (4 KiB) and embeddings of 16 x 77 x 32 floats (154 KiB), both
# aligned, and caption_ids of 16 x 77 int32 (4.8 KiB), aligned too
proc_nml packed ", io_alignment = 0"
mpi packed 2 "$SDTRAIN" "$TMP/packed.nml"
expect_rc packed 0
expect_not_in packed out "parallel HDF5 files: io_hints"
proc_nml aligned ", io_alignment = 4096,
     io_hints = 'romio_cb_write = enable, cb_buffer_size=1048576, sdtrain_test_unknown=1'"
mpi aligned 2 "$SDTRAIN" "$TMP/aligned.nml"
expect_rc aligned 0
expect_count aligned out "parallel HDF5 files: io_hints romio_cb_write=enable (reported: " 1
expect_in aligned out "sdtrain_test_unknown=1 (reported: "
for f in "$TMP/packed-shards"/shard-*.h5; do
    b=$(basename "$f")
    "$SHARDCMP" "$f" "$TMP/aligned-shards/$b" 0 >"$TMP/cmp.out" 2>&1 ||
        { cat "$TMP/cmp.out" >&2; fail "$b: the aligned shard's contents differ from the packed one"; }
done
a=$(wc -c <"$TMP/aligned-shards/shard-000000.h5")
p=$(wc -c <"$TMP/packed-shards/shard-000000.h5")
[ "$a" -gt "$p" ] || fail "the aligned shard ($a bytes) is not larger than the packed one ($p)"
# every dataset of a shard is contiguous (written with pwrite at its offset since 2026-11-27):
# the latents, the embeddings and the caption ids (16 x 77 x 4 bytes) are at least one unit
n=0
for off in $(offsets "$TMP/aligned-shards/shard-000000.h5" image_latents_32 caption_embeddings caption_ids); do
    n=$((n + 1))
    [ $((off % 4096)) = 0 ] || fail "aligned shard: a dataset starts at $off, not a multiple of 4096"
done
[ "$n" = 3 ] || fail "found $n dataset offsets in the aligned shard, expected 3"
pass "shards: the same contents packed and aligned; hints reported"

# (b) checkpoints: training from the packed shards, packed and aligned (64 KiB units); the
# checkpoint's four datasets start on a multiple of 65536; weights and losses the same bits;
# the aligned checkpoint resumes to the same end
train() {
    nml "$1.nml" <<EOF2
&run mode = 'train', output_dir = '$TMP/$1', seed = 11, device = 'cpu' $2 /
&model $TINY_MODEL /
&data shard_dir = '$TMP/packed-shards' /
&train max_steps = 6, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 2,
       sharding = 'shard_grad_op', log_every = 2, ema_decay = 0.9 /
&checkpoint every_n_steps = 3 /
EOF2
}
train tpacked ", io_alignment = 0"
mpi tpacked 2 "$SDTRAIN" "$TMP/tpacked.nml"
expect_rc tpacked 0
train taligned ", io_alignment = 65536, io_hints = 'romio_no_indep_rw=true'"
mpi taligned 2 "$SDTRAIN" "$TMP/taligned.nml"
expect_rc taligned 0
expect_count taligned out "parallel HDF5 files: io_hints romio_no_indep_rw=true (reported: " 1
h5="$TMP/taligned/checkpoints/step-00000006/state.h5"
n=0
for off in $(offsets "$h5" params adam_m adam_v ema); do
    n=$((n + 1))
    [ $((off % 65536)) = 0 ] || fail "a dataset of $h5 starts at $off, not a multiple of 65536"
done
[ "$n" = 4 ] || fail "found $n dataset offsets in $h5, expected 4"
unaligned=0
for off in $(offsets "$TMP/tpacked/checkpoints/step-00000006/state.h5" params adam_m adam_v ema); do
    [ $((off % 65536)) = 0 ] || unaligned=$((unaligned + 1))
done
[ "$unaligned" -gt 0 ] || fail "io_alignment = 0: every dataset on a 64 KiB boundary by chance?"
for f in unet_final unet_ema; do
    cmp -s "$TMP/tpacked/$f.safetensors" "$TMP/taligned/$f.safetensors" ||
        fail "$f.safetensors differs between the packed and the aligned run"
done
grep -o '"step": [0-9]*, "epoch": [0-9]*, "loss": [^,]*' "$TMP/tpacked/metrics.jsonl" >"$TMP/l1"
grep -o '"step": [0-9]*, "epoch": [0-9]*, "loss": [^,]*' "$TMP/taligned/metrics.jsonl" >"$TMP/l2"
[ -s "$TMP/l1" ] && cmp -s "$TMP/l1" "$TMP/l2" || fail "the losses differ between packed and aligned"
# resume from the aligned step-3 checkpoint (the later one removed), packed this time
rm -rf "$TMP/taligned/checkpoints/step-00000006" "$TMP/taligned"/unet_*.safetensors
echo step-00000003 >"$TMP/taligned/checkpoints/latest"
mpi resume 2 "$SDTRAIN" "$TMP/taligned.nml" --set run.io_alignment=0 --set run.io_hints=''
expect_rc resume 0
expect_in resume out "resum"
for f in unet_final unet_ema; do
    cmp -s "$TMP/tpacked/$f.safetensors" "$TMP/taligned/$f.safetensors" ||
        fail "$f.safetensors after resuming from the aligned checkpoint differs"
done
pass "checkpoints: datasets on 64 KiB boundaries, the same bits, resumable"

# a semaphore that Open MPI's OMPIO left at 0 for files named state.h5 (a process killed while it
# opened one: /dev/shm/sem.OMPIO_state.h5, glibc's 32-byte sem_t, all zero): before 2026-11-27
# the next checkpoint with io_hints waited on it forever; sdtrain leaves that component out
sem=/dev/shm/sem.OMPIO_state.h5
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ ! -e "$sem" ]; then
    trap 'rm -f "$sem"' EXIT
    head -c 32 /dev/zero >"$sem"
    train tsem ", io_hints = 'romio_no_indep_rw=true'"
    mpi tsem 2 "$SDTRAIN" "$TMP/tsem.nml"
    rm -f "$sem"
    expect_rc tsem 0
    [ -f "$TMP/tsem/checkpoints/step-00000006/state.h5" ] || fail "tsem: no checkpoint"
    pass "a stale OMPIO semaphore of the checkpoints' file name: no hang"
fi

# (c) bad hints: a configuration error naming the key and its line, exit 2, no rank hangs (a
# value longer than Open MPI takes once passed and ended the job at the first shard it wrote)
for bad in "a=1,,b=2|an empty entry" "=1|has an empty key" "a=|has an empty value" \
    "a=1, a=2|'a' is given twice" "novalue|is not key=value" "a b=1|holds a blank" \
    "cb_config_list=$(printf 'h%03d:1,' $(seq 1 45))x:1|longer than MPI's 255 bytes"; do
    hints=${bad%%|*}
    why=${bad#*|}
    nml bad.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/bad',
     io_hints = '$hints' /
&data shard_dir = '$TMP/packed-shards' /
EOF2
    mpi bad 2 "$SDTRAIN" "$TMP/bad.nml"
    expect_rc bad 2
    expect_in bad err "bad.nml:2:"
    expect_in bad err "io_hints"
    expect_in bad err "$why"
done
pass "bad io_hints: exit 2 with the line and the reason"
