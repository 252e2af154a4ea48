#!/bin/sh
# mode = 'process' end to end under MPI: the three input formats with planted bad samples,
# skip counts, committed shards, identical data whatever the rank count, and resume after a
# rank is killed mid-run.
. "$top_srcdir/tests/lib.sh"
need_mpi

tokenizer="$top_srcdir/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
write_nml() { # write_nml NAME FORMAT INPUT SHARD_DIR
    cat >"$TMP/$1.nml" <<EOF2
&run mode = 'process', output_dir = '$TMP/run-$1', seed = 7 /
&model
  resolution = 32, block_out_channels = 32, 64, attention_head_dim = 8, norm_num_groups = 8,
  cross_attention_dim = 32, text_hidden_size = 32, text_layers = 2, text_heads = 4,
  vae_block_out_channels = 8, 8, 16, 16, tokenizer = '$tokenizer'
/
&data input = '$3', input_format = '$2', shard_dir = '$4', samples_per_shard = 16,
      encode_batch_size = 4 /
EOF2
}
# "index checksum" pairs of a manifest, one per line
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }
# the summary's counts over every run (its first line: the sums; the per-run lines follow)
dir_counts() {
    head -n 1 "$1/preprocess_summary.json" |
        grep -o -e '"shards_counted": [0-9]*' -e '"read": [0-9]*, "kept": [0-9]*, "skipped": [0-9]*' \
            -e '"reasons": {[^}]*}'
}

for fmt in files webdataset tsv; do
    run "data-$fmt" "$SDTOOL" make-demo-data "$TMP/data-$fmt" --count 40 --bad --format "$fmt"
    expect_rc "data-$fmt" 0
    input="$TMP/data-$fmt"
    [ "$fmt" = tsv ] && input="$TMP/data-$fmt/manifest.tsv"
    write_nml "$fmt" "$fmt" "$input" "$TMP/shards-$fmt"
    mpi "proc-$fmt" 3 "$SDTRAIN" "$TMP/$fmt.nml"
    expect_rc "proc-$fmt" 0
    s="$TMP/shards-$fmt/preprocess_summary.json"
    [ -f "$s" ] || fail "$fmt: no summary"
    grep -q '"read": 40, "kept": 35, "skipped": 5' "$s" || fail "$fmt: counts: $(cat "$s")"
    for reason in missing_caption unsupported_image; do
        grep -q "\"$reason\": 1" "$s" || fail "$fmt: $reason not counted once: $(cat "$s")"
    done
    [ "$(ls "$TMP/shards-$fmt" | grep -c '^shard-.*\.h5$')" = 3 ] || fail "$fmt: expected 3 shards: $(ls "$TMP/shards-$fmt")"
    [ "$(checksums "$TMP/shards-$fmt" | wc -l)" = 3 ] || fail "$fmt: manifest does not list 3 shards"
    ! ls -a "$TMP/shards-$fmt" | grep -q '\.tmp' || fail "$fmt: temporary files left"
done
# what indexing meets that is no sample (here a file named .tar that is none): a warning naming
# it on stderr, and the summary's "index" counts it (it was counted and said nowhere before)
cp -r "$TMP/data-webdataset" "$TMP/data-wdsbad"
i=0
while [ $i -lt 40 ]; do echo "this is not a tar file"; i=$((i + 1)); done >"$TMP/data-wdsbad/zz-bad.tar"
write_nml wdsbad webdataset "$TMP/data-wdsbad" "$TMP/shards-wdsbad"
mpi proc-wdsbad 2 "$SDTRAIN" "$TMP/wdsbad.nml"
expect_rc proc-wdsbad 0
expect_count proc-wdsbad err "warning: $TMP/data-wdsbad/zz-bad.tar: " 1
expect_in proc-wdsbad out "dataset index (not samples): damaged_shards 1"
grep -q '"index": {"damaged_shards": 1, ' "$TMP/shards-wdsbad/preprocess_summary.json" ||
    fail "wdsbad: index counts: $(cat "$TMP/shards-wdsbad/preprocess_summary.json")"
grep -q '"index": {"damaged_shards": 0, ' "$TMP/shards-webdataset/preprocess_summary.json" ||
    fail "webdataset: index counts: $(cat "$TMP/shards-webdataset/preprocess_summary.json")"
# the bad samples by reason (same planted set in every format)
for reason in image_truncated image_not_image; do
    grep -q "\"$reason\": 1" "$TMP/shards-files/preprocess_summary.json" || fail "$reason not counted"
done
# zero-byte image: the dataset layer or the decoder reports it, once
grep -Eq '"(empty_image|image_empty)": 1' "$TMP/shards-files/preprocess_summary.json" || fail "empty image not counted"

run inspect "$SDTOOL" inspect "$TMP/shards-files/shard-000000.h5"
expect_rc inspect 0
expect_in inspect out "image_latents_32"
expect_in inspect out "caption_embeddings"
run inspectdir "$SDTOOL" inspect "$TMP/shards-files"
expect_rc inspectdir 0

# the same inputs and rank count give the same data arrays, whether each shard is written on
# the writer thread while the next one is encoded (the default, the runs above) or by the main
# thread between encodings
# (an MPI without MPI_THREAD_SERIALIZED writes between encodings and says why); in the second
# run rank 2 takes 2 s longer for its part of every shard (the test hook): it is named for shards
# 0-1 and for shard 2 (rank 0 reports over intervals of a minute, here 3 s by a test hook: the
# first ends with shard 1, what is left is reported at the end) and in the summary, and the data
# are the same; the first run names no rank
grep -q "the MPI library lacks MPI_THREAD_SERIALIZED" "$TMP/proc-files.err" ||
    expect_in proc-files out "shard writes beside the encoding"
expect_not_in proc-files err "the others wait for it"
expect_in proc-files out "slowest rank: "
write_nml again files "$TMP/data-files" "$TMP/shards-again"
SDTRAIN_TEST_SHARD_DELAY_MS=2:2000 SDTRAIN_TEST_PART_REPORT_MS=3000 \
    mpi again 3 "$SDTRAIN" "$TMP/again.nml" --set data.overlap_writes=.false.
expect_rc again 0
expect_in again out "shard writes between encodings"
expect_count again err "shards 0-1: rank 2 took 4." 1
expect_count again err "shard 2: rank 2 took 2." 1
expect_count again err "the others wait for it at every shard" 2
expect_in again out "slowest rank: 2, 6."
checksums "$TMP/shards-files" >"$TMP/sum-np3"
checksums "$TMP/shards-again" >"$TMP/sum-again"
diff "$TMP/sum-np3" "$TMP/sum-again" || fail "two runs with 3 ranks wrote different data (writes beside / between the encodings)"
# the dataset index is one packed image per node in MPI shared memory, which every rank views
# (doc/datasets.md, "One index per node"); a node without it (SDTRAIN_TEST_NO_SHARED_INDEX=1, the
# test hook, or a shared-memory folder that cannot hold it) keeps a copy on each rank, says so
# with the size, and writes the same shards
if grep -q "not in node-shared memory" "$TMP/proc-files.err"; then
    echo "# this machine gave no node-shared memory: $(grep -m1 'not in node-shared memory' "$TMP/proc-files.err")" >&2
else
    expect_in proc-files out "in node-shared memory, 1 copy for 3 rank(s) (one per node)"
fi
write_nml noshm files "$TMP/data-files" "$TMP/shards-noshm"
SDTRAIN_TEST_NO_SHARED_INDEX=1 mpi noshm 3 "$SDTRAIN" "$TMP/noshm.nml"
expect_rc noshm 0
expect_in noshm err "bytes) not in node-shared memory (shared memory switched off): one copy on each of this node's 3 ranks"
expect_in noshm out "3 copies for 3 rank(s): one per rank on the 1 node(s) without node-shared memory"
checksums "$TMP/shards-noshm" >"$TMP/sum-noshm"
diff "$TMP/sum-np3" "$TMP/sum-noshm" || fail "3 ranks wrote other data with a copy of the index each"
# a shared-memory folder that is not there (Open MPI's osc_sm_backing_directory): the fallback,
# not a hang (Open MPI 4.1 leaves the other ranks waiting when the window's file cannot be made)
OMPI_MCA_osc_sm_backing_directory="$TMP/no-such-shm" mpi noshmdir 3 "$SDTRAIN" "$TMP/noshm.nml" \
    --set data.shard_dir="$TMP/shards-noshmdir"
expect_rc noshmdir 0
expect_in noshmdir err "not in node-shared memory ($TMP/no-such-shm: No such file or directory)"
checksums "$TMP/shards-noshmdir" | diff "$TMP/sum-np3" - || fail "3 ranks without a shared-memory folder wrote other data"
# decode threads per rank (OpenMP; the runs above have one thread per rank on 2 cores): 3 and
# 5 threads read and decode windows of 12 and 20 samples in parallel, bad samples among them,
# and must write the same data with the same counts
for th in 3 5; do
    write_nml "th$th" files "$TMP/data-files" "$TMP/shards-th$th"
    OMP_NUM_THREADS=$th mpi "th$th" 3 "$SDTRAIN" "$TMP/th$th.nml"
    expect_rc "th$th" 0
    expect_in "th$th" out "OpenMP threads per rank: $th"
    checksums "$TMP/shards-th$th" >"$TMP/sum-th$th"
    diff "$TMP/sum-np3" "$TMP/sum-th$th" || fail "$th decode threads per rank wrote other data"
    grep -o '"read": 40, "kept": 35, "skipped": 5' "$TMP/shards-th$th/preprocess_summary.json" \
        >/dev/null || fail "$th threads: counts: $(cat "$TMP/shards-th$th/preprocess_summary.json")"
    for reason in missing_caption unsupported_image image_truncated image_not_image; do
        grep -q "\"$reason\": 1" "$TMP/shards-th$th/preprocess_summary.json" ||
            fail "$th threads: $reason not counted once"
    done
done
# a sample whose encoding is not finite (the fault hook makes global sample 0's moments NaN on
# rank 0, which encodes it) is dropped before its shard is written and counted as
# non_finite_encoding instead of ok; the other shards are the same bytes as before
write_nml nanenc files "$TMP/data-files" "$TMP/shards-nanenc"
SDTRAIN_FAULT=nan:rank=0:phase=encode:step=0 mpi nanenc 3 "$SDTRAIN" "$TMP/nanenc.nml"
expect_rc nanenc 0
expect_in nanenc err "sample 0 ("
expect_in nanenc err "): its image encoding is not finite as fp16 (|x| < 65520): skipped"
s="$TMP/shards-nanenc/preprocess_summary.json"
grep -q '"read": 40, "kept": 34, "skipped": 6' "$s" || fail "nanenc: counts: $(cat "$s")"
grep -q '"non_finite_encoding": 1' "$s" || fail "nanenc: not counted: $(cat "$s")"
checksums "$TMP/shards-nanenc" | tail -n 2 >"$TMP/sum-nanenc"
tail -n 2 "$TMP/sum-np3" | diff - "$TMP/sum-nanenc" || fail "nanenc: shards 1 and 2 differ"
[ "$(grep -m1 '"samples"' "$TMP/shards-nanenc/manifest.json" | tr -dc 0-9)" = 15 ] ||
    fail "nanenc: shard 0 should hold 15 samples: $(cat "$TMP/shards-nanenc/manifest.json")"

# another rank count puts the same samples into the same shards in the same order (encoder
# outputs may then differ in the last bits: the encoder batches are cut differently)
write_nml np2 files "$TMP/data-files" "$TMP/shards-np2"
mpi np2 2 "$SDTRAIN" "$TMP/np2.nml"
expect_rc np2 0
if command -v h5dump >/dev/null; then
    for k in 0 1 2; do
        f=$(printf 'shard-%06d.h5' "$k")
        for ds in key caption caption_ids; do
            h5dump -d "$ds" "$TMP/shards-files/$f" | sed 1d >"$TMP/a"
            h5dump -d "$ds" "$TMP/shards-np2/$f" | sed 1d >"$TMP/b"
            cmp -s "$TMP/a" "$TMP/b" || fail "$f: $ds differs between 2 and 3 ranks"
        done
    done
fi
# ... and the encoder outputs of the two cuts agree to rounding (tests/mpi/shard_compare: keys,
# captions and ids equal, moments and embeddings within 1e-5)
for k in 0 1 2; do
    f=$(printf 'shard-%06d.h5' "$k")
    run "cmp2v3-$k" "$top_builddir/tests/mpi/shard_compare" "$TMP/shards-files/$f" \
        "$TMP/shards-np2/$f" 1e-5
    expect_rc "cmp2v3-$k" 0
    expect_in "cmp2v3-$k" out "keys, captions, token ids: equal"
done
# the comparer itself: other data is caught
run cmpother "$top_builddir/tests/mpi/shard_compare" "$TMP/shards-files/shard-000000.h5" \
    "$TMP/shards-files/shard-000001.h5" 1e-5
expect_rc cmpother 1
# the three formats hold the same images and captions in the same order: the same latents
# and embeddings (keys differ: files keys carry the folder)
if command -v h5dump >/dev/null; then
    for fmt in webdataset tsv; do
        for ds in image_latents_32 caption_embeddings caption_ids caption; do
            h5dump -d "$ds" "$TMP/shards-files/shard-000000.h5" | sed 1d >"$TMP/a"
            h5dump -d "$ds" "$TMP/shards-$fmt/shard-000000.h5" | sed 1d >"$TMP/b"
            cmp -s "$TMP/a" "$TMP/b" || fail "$fmt input gave another $ds than the files layout"
        done
    done
fi

# a rank killed while committing: the rerun finishes and the data equal an uninterrupted run
write_nml kill files "$TMP/data-files" "$TMP/shards-kill"
SDTRAIN_FAULT=kill:rank=1:phase=shard-commit mpi killed 3 "$SDTRAIN" "$TMP/kill.nml"
[ "$RC" != 0 ] || fail "the killed run exited 0"
[ "$(checksums "$TMP/shards-kill" 2>/dev/null | wc -l)" -lt 3 ] || fail "killed run committed everything"
mpi resume 3 "$SDTRAIN" "$TMP/kill.nml"
expect_rc resume 0
checksums "$TMP/shards-kill" >"$TMP/sum-kill"
diff "$TMP/sum-np3" "$TMP/sum-kill" || fail "resumed run wrote different data"

# a rerun whose plan the committed shards do not fit is refused before it writes anything
# (status 2): other shard sizes (the committed shards would have been skipped and their samples
# written again into the others), other encoder weights (latents of two spaces in one
# directory), and a committed shard changed on disk (no retry mends it)
mpi rerun-size 2 "$SDTRAIN" "$TMP/kill.nml" --set data.samples_per_shard=8
expect_rc rerun-size 2
expect_count rerun-size err "but this run plans 8 for it (40 samples of $TMP/data-files in shards of 8)" 1
mpi rerun-weights 2 "$SDTRAIN" "$TMP/kill.nml" --set run.seed=8
expect_rc rerun-weights 2
expect_in rerun-weights err "the committed shard-000000.h5 was encoded by other weights"
cp -r "$TMP/shards-kill" "$TMP/shards-cut"
truncate -s 1000 "$TMP/shards-cut/shard-000001.h5"
mpi rerun-cut 2 "$SDTRAIN" "$TMP/kill.nml" --set data.shard_dir="$TMP/shards-cut"
expect_rc rerun-cut 2
expect_in rerun-cut err "but the file has 1000 bytes"

# spoil_images FILE...: every file given but the captions overwritten with bytes no decoder takes
spoil_images() {
    for f in "$@"; do
        case $f in *.txt) ;; *) echo garbage >"$f" ;; esac
    done
}

# a shard all of whose samples are bad (a run of samples_per_shard corrupt images, here those of
# shards 0 and 1): committed empty (0 samples, datasets of zero rows), a warning naming each, and
# the run goes on with status 0 (it stopped at the first with status 2: a shard held one sample
# at least); the other shards are those of the same data undamaged, a rerun skips the empty
# ones, inspect verifies them
run data-allbad "$SDTOOL" make-demo-data "$TMP/data-allbad" --count 16
expect_rc data-allbad 0
cp -r "$TMP/data-allbad" "$TMP/data-allgood"
spoil_images "$TMP"/data-allbad/00000/00000000[0-7].*
write_nml allbad files "$TMP/data-allbad" "$TMP/shards-allbad"
mpi allbad 2 "$SDTRAIN" "$TMP/allbad.nml" --set data.samples_per_shard=4
expect_rc allbad 0
expect_count allbad err "warning: shard 0 is empty: each of its 4 samples (0 to 3 of $TMP/data-allbad, from '00000/000000000' on) was skipped" 1
expect_count allbad err "warning: shard 1 is empty: each of its 4 samples (4 to 7 of $TMP/data-allbad, from '00000/000000004' on) was skipped" 1
expect_in allbad out "shard 1/4 committed: 0 samples"
grep -q '"read": 16, "kept": 8, "skipped": 8' "$TMP/shards-allbad/preprocess_summary.json" ||
    fail "allbad: counts: $(cat "$TMP/shards-allbad/preprocess_summary.json")"
# (the entries' own "samples", not those of their planned "range", indented deeper)
[ "$(grep -E '^ {6}"samples"' "$TMP/shards-allbad/manifest.json" | tr -dc '0-9\n' | tr '\n' ' ')" = "0 0 4 4 " ] ||
    fail "allbad: not shards of 0, 0, 4 and 4 samples: $(cat "$TMP/shards-allbad/manifest.json")"
write_nml allgood files "$TMP/data-allgood" "$TMP/shards-allgood"
mpi allgood 2 "$SDTRAIN" "$TMP/allgood.nml" --set data.samples_per_shard=4
expect_rc allgood 0
[ "$(checksums "$TMP/shards-allbad" | tail -n 2)" = "$(checksums "$TMP/shards-allgood" | tail -n 2)" ] ||
    fail "allbad: shards 2 and 3 differ from those of the undamaged data"
mpi allbad-again 2 "$SDTRAIN" "$TMP/allbad.nml" --set data.samples_per_shard=4
expect_rc allbad-again 0
expect_in allbad-again out "4 already committed"
expect_in allbad-again out "0 new shard(s)"
expect_not_in allbad-again err "is empty"
# ... and keeps the counts of why shards 0 and 1 are empty (the rerun's were all it kept)
grep -q '"read": 16, "kept": 8, "skipped": 8' "$TMP/shards-allbad/preprocess_summary.json" ||
    fail "allbad-again: the rerun lost the counts: $(cat "$TMP/shards-allbad/preprocess_summary.json")"
run allbad-insp "$SDTOOL" inspect --verify "$TMP/shards-allbad"
expect_rc allbad-insp 0
expect_count allbad-insp out "ok, checksum verified" 4
expect_count allbad-insp out "ok, checksum verified, empty" 2
run allbad-inspf "$SDTOOL" inspect "$TMP/shards-allbad/shard-000000.h5"
expect_rc allbad-inspf 0
expect_in allbad-inspf out "shard 0, 0 samples"
expect_in allbad-inspf out "empty shard: each sample of its range was skipped"
# training on them passes over the empty shards (val_fraction 0.45 holds out keys 10 to 13)
TRAIN_SET="--set data.samples_per_shard=4 --set data.val_fraction=0.45 --set train.max_steps=2
 --set train.batch_size_per_rank=2 --set train.val_every=2"
sed "s/mode = 'process'/mode = 'train', device = 'cpu'/; s/run-allbad/run-allbad-train/" "$TMP/allbad.nml" \
    >"$TMP/allbad-train.nml"
# shellcheck disable=SC2086 # TRAIN_SET holds several options
mpi allbad-train 1 "$SDTRAIN" "$TMP/allbad-train.nml" $TRAIN_SET
expect_rc allbad-train 0
expect_in allbad-train out "4 training / 4 validation samples"
expect_in allbad-train out "step 2/2"
# ... and so does a pipeline's training half, as the shards come: the validation set (fixed at
# open) is the held-out samples of the first shard with samples, shard 2 (keys 10 and 11)
sed "s/mode = 'process'/mode = 'pipeline', n_process_ranks = 2, device = 'cpu'/; s/run-allbad/run-allbad-pipe/" \
    "$TMP/allbad.nml" >"$TMP/allbad-pipe.nml"
# shellcheck disable=SC2086
SDTRAIN_TEST_SHARD_DELAY_MS=200 mpi allbad-pipe 3 "$SDTRAIN" "$TMP/allbad-pipe.nml" $TRAIN_SET \
    --set data.shard_dir="'$TMP/shards-allbadpipe'"
expect_rc allbad-pipe 0
expect_in allbad-pipe out "validation: shards 0 to 1 are empty (each sample was skipped in preprocessing); the validation set is the held-out samples of shard 2"
expect_in allbad-pipe out "step 0: validation loss"
expect_in allbad-pipe out "over 2 samples"
expect_in allbad-pipe out "step 2/2"
[ "$(checksums "$TMP/shards-allbad")" = "$(checksums "$TMP/shards-allbadpipe")" ] ||
    fail "allbad: the pipeline wrote other shards than mode 'process'"
# nothing but empty shards: preprocessing goes through, training stops with a clear error,
# status 2, in mode 'train' and in a pipeline
run data-nogood "$SDTOOL" make-demo-data "$TMP/data-nogood" --count 4
expect_rc data-nogood 0
spoil_images "$TMP"/data-nogood/00000/*
write_nml nogood files "$TMP/data-nogood" "$TMP/shards-nogood"
mpi nogood 2 "$SDTRAIN" "$TMP/nogood.nml" --set data.samples_per_shard=4
expect_rc nogood 0
expect_count nogood err "warning: shard 0 is empty" 1
sed "s/mode = 'process'/mode = 'train', device = 'cpu'/; s/run-nogood/run-nogood-train/" "$TMP/nogood.nml" \
    >"$TMP/nogood-train.nml"
# shellcheck disable=SC2086
mpi nogood-train 2 "$SDTRAIN" "$TMP/nogood-train.nml" $TRAIN_SET
expect_rc nogood-train 2
expect_count nogood-train err "$TMP/shards-nogood: no training samples: the 1 committed shard(s) are all empty" 1
sed "s/mode = 'process'/mode = 'pipeline', n_process_ranks = 2, device = 'cpu'/; s/run-nogood/run-nogood-pipe/" \
    "$TMP/nogood.nml" >"$TMP/nogood-pipe.nml"
# shellcheck disable=SC2086
mpi nogood-pipe 3 "$SDTRAIN" "$TMP/nogood-pipe.nml" $TRAIN_SET --set data.shard_dir="'$TMP/shards-nogoodpipe'"
expect_rc nogood-pipe 2
expect_in nogood-pipe err "$TMP/shards-nogoodpipe: no training samples: the 1 committed shard(s) are all empty"
# a rerun into a directory of empty shards whose plan is another: the manifest records each
# shard's planned range (first sample, count, a hash of the first key), so another input (here
# keys from 000000001 on) or other shard sizes are refused, where the empty shards, holding no
# keys to compare, let it skip their samples without a word
[ "$(grep -c '"first_key_fnv1a"' "$TMP/shards-nogood/manifest.json")" = 1 ] ||
    fail "nogood: no planned range in the manifest: $(cat "$TMP/shards-nogood/manifest.json")"
run data-other "$SDTOOL" make-demo-data "$TMP/data-other" --count 5
expect_rc data-other 0
rm "$TMP"/data-other/00000/000000000.*
mpi nogood-other 2 "$SDTRAIN" "$TMP/nogood.nml" --set data.samples_per_shard=4 \
    --set data.input="'$TMP/data-other'"
expect_rc nogood-other 2
expect_in nogood-other err "the committed shard-000000.h5 was planned for samples 0 to 3 of its run's input"
expect_in nogood-other err "this run plans samples 0 to 3 for it, starting at '00000/000000001'"
mpi nogood-size 2 "$SDTRAIN" "$TMP/nogood.nml" --set data.samples_per_shard=2
expect_rc nogood-size 2
expect_in nogood-size err "this run plans samples 0 to 1 for it, starting at '00000/000000000'"
mpi nogood-same 2 "$SDTRAIN" "$TMP/nogood.nml" --set data.samples_per_shard=4
expect_rc nogood-same 0
expect_in nogood-same out "0 new shard(s)"

# a file name that is not UTF-8 (a Latin-1 byte): its sample is read and stored under the key
# with U+FFFD in its place (the shard's keys are UTF-8 text); it stopped the run with status 1
run data-latin1 "$SDTOOL" make-demo-data "$TMP/data-latin1" --count 6
expect_rc data-latin1 0
lat=$(printf 'caf\351')
cp "$TMP/data-latin1/00000/000000000.jpg" "$TMP/data-latin1/00000/$lat.jpg"
cp "$TMP/data-latin1/00000/000000000.txt" "$TMP/data-latin1/00000/$lat.txt"
write_nml latin1 files "$TMP/data-latin1" "$TMP/shards-latin1"
mpi latin1 2 "$SDTRAIN" "$TMP/latin1.nml"
expect_rc latin1 0
grep -q '"total_samples": 7' "$TMP/shards-latin1/manifest.json" ||
    fail "latin1: not 7 samples: $(cat "$TMP/shards-latin1/manifest.json")"
mpi latin1-again 2 "$SDTRAIN" "$TMP/latin1.nml"
expect_rc latin1-again 0

# signal_stop NAME SPS FAULT MESSAGE N: mode 'process' on 2 ranks with shards of SPS samples and
# SDTRAIN_FAULT=FAULT (a SIGUSR1) stops with status 0, saying MESSAGE once, with N shards
# committed; a rerun (NAME-2) commits the rest, and the shards and the summary's counts are those
# of an uninterrupted run (noNAME)
signal_stop() {
    write_nml "$1" files "$TMP/data-files" "$TMP/shards-$1"
    SDTRAIN_FAULT=$3 mpi "$1" 2 "$SDTRAIN" "$TMP/$1.nml" --set data.samples_per_shard="$2"
    expect_rc "$1" 0
    expect_count "$1" out "$4" 1
    [ "$(checksums "$TMP/shards-$1" | wc -l)" = "$5" ] || fail "$1: not $5 shard(s): $(checksums "$TMP/shards-$1")"
    mpi "$1-2" 2 "$SDTRAIN" "$TMP/$1.nml" --set data.samples_per_shard="$2"
    expect_rc "$1-2" 0
    write_nml "no$1" files "$TMP/data-files" "$TMP/shards-no$1"
    mpi "no$1" 2 "$SDTRAIN" "$TMP/no$1.nml" --set data.samples_per_shard="$2"
    expect_rc "no$1" 0
    [ "$(checksums "$TMP/shards-$1")" = "$(checksums "$TMP/shards-no$1")" ] ||
        fail "$1: stopped and rerun, the shards differ from an uninterrupted run's"
    # the summary counts the samples of every shard, those of both runs (not those of a dropped
    # shard twice), as the uninterrupted run's does
    [ "$(dir_counts "$TMP/shards-$1")" = "$(dir_counts "$TMP/shards-no$1")" ] ||
        fail "$1: summary $(dir_counts "$TMP/shards-$1") after the rerun, $(dir_counts "$TMP/shards-no$1") uninterrupted"
}

# SIGUSR1 (Slurm's notice ahead of the time limit) on one rank after a shard's encoding: every
# rank stops at the same shard boundary, the shard encoded is committed (tests/mpi/slurm_scripts.sh:
# process.sh requeues)
signal_stop sig 8 usr1:rank=1:step=1 \
    "stopped for SIGUSR1 after committing shard 1: 2 of the 5 shards are committed, and a rerun goes on from them" 2
expect_in sig-2 out "all runs ($TMP/shards-sig/preprocess_summary.json): 40 samples read, 35 kept, 5 skipped in 5 of the 5 committed shard(s)"

# ... in the middle of a shard: the signal comes while rank 0 reads shard 1 (global sample 21
# of 20-sample shards; one thread: windows of 4 samples); the ranks drop that shard's work at
# the next window instead of finishing it, commit nothing more, exit 0; the rerun encodes shard 1
OMP_NUM_THREADS=1 signal_stop sigmid 20 usr1:rank=0:phase=encode:step=21 \
    "stopped for SIGUSR1 before shard 1 (its encoding, under way, is dropped): 1 of the 2 shards are committed, and a rerun goes on from them" 1

# one job per output directory and per shard directory (a lock each, held as long as the job
# runs): a second job started while the first runs is refused (status 2) naming the holder,
# and the first finishes undisturbed
write_nml lock files "$TMP/data-files" "$TMP/shards-lock"
# shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
SDTRAIN_TEST_SHARD_DELAY_MS=1500 $MPIEXEC $MPIEXEC_NP 2 "$SDTRAIN" "$TMP/lock.nml" \
    >"$TMP/lock1.out" 2>&1 &
first=$!
i=0
while [ $i -lt 300 ] && ! grep -q "^pid " "$TMP/shards-lock/.sdtrain-writer.lock" 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
mpi lock2 2 "$SDTRAIN" "$TMP/lock.nml"
expect_rc lock2 2
expect_count lock2 err "another sdtrain job uses the output directory '$TMP/run-lock'" 1
mpi lock3 2 "$SDTRAIN" "$TMP/lock.nml" --set run.output_dir="$TMP/run-lock3"
expect_rc lock3 2
expect_count lock3 err "another sdtrain job uses the shard directory '$TMP/shards-lock'" 1
wait $first || fail "lock: the first job failed: $(tail -5 "$TMP/lock1.out")"
[ "$(checksums "$TMP/shards-lock" | wc -l)" = 3 ] || fail "lock: the first job did not commit its 3 shards"
mpi lock4 2 "$SDTRAIN" "$TMP/lock.nml"
expect_rc lock4 0

# mode = 'pipeline': the preprocessing ranks write the same shards while the training rank
# trains on them (tests/mpi/pipeline.sh checks the training half)
write_nml pipe files "$TMP/data-files" "$TMP/shards-pipe"
sed -i "s/mode = 'process'/mode = 'pipeline', n_process_ranks = 3, device = 'cpu'/" "$TMP/pipe.nml"
mpi pipe 4 "$SDTRAIN" "$TMP/pipe.nml" --set train.max_steps=2 --set train.batch_size_per_rank=2
expect_rc pipe 0
expect_in pipe out "training summary"
expect_not_in pipe err "not implemented"
checksums "$TMP/shards-pipe" >"$TMP/sum-pipe"
diff "$TMP/sum-np3" "$TMP/sum-pipe" || fail "pipeline preprocessing wrote other data than process mode"

# a caption with a NUL byte inside: the shard's caption string (a C string in HDF5) has U+2400
# in its place, the ids are the whole caption's; an image the transform cannot take (1 x 600000
# at resolution 32 is 32 x 19,200,000) is refused from its header as image_too_large, named
mkdir -p "$TMP/data-odd"
cp "$top_srcdir/tests/image/input/rgb_64x64_q90_420.jpg" "$TMP/data-odd/a.jpg"
printf 'a red square\0 on a blue background' >"$TMP/data-odd/a.txt"
cp "$top_srcdir/tests/image/input/gray_1x600000.png" "$TMP/data-odd/tall.png"
echo "a tall image" >"$TMP/data-odd/tall.txt"
write_nml odd files "$TMP/data-odd" "$TMP/shards-odd"
mpi odd 1 "$SDTRAIN" "$TMP/odd.nml" --set run.log_level=debug
expect_rc odd 0
s="$TMP/shards-odd/preprocess_summary.json"
grep -q '"read": 2, "kept": 1, "skipped": 1' "$s" || fail "odd: counts: $(cat "$s")"
grep -q '"image_too_large": 1' "$s" || fail "odd: the tall image is not counted as too large: $(cat "$s")"
! grep -q '"image_corrupt"' "$s" || fail "odd: counted as corrupt: $(cat "$s")"
expect_in odd out "tall: PNG header declares 1x600000, too large for the resize to 32"
if command -v h5dump >/dev/null; then
    h5dump -d caption -b NATIVE -o "$TMP/odd-caption.bin" "$TMP/shards-odd/shard-000000.h5" >/dev/null ||
        fail "odd: h5dump of the captions"
    printf 'a red square\342\220\200 on a blue background' >"$TMP/odd-want.bin"
    cmp -s "$TMP/odd-caption.bin" "$TMP/odd-want.bin" ||
        fail "odd: stored caption '$(od -c "$TMP/odd-caption.bin" | head -n 3)'"
    run odd-ids "$SDTOOL" tokenize --vocab "$tokenizer" "a red square on a blue background"
    h5dump -d caption_ids -c "1,77" "$TMP/shards-odd/shard-000000.h5" | sed -n 's/^ *(0,[0-9]*): //p' |
        tr -d ' \n' | tr ',' ' ' >"$TMP/odd-ids"
    [ "$(cat "$TMP/odd-ids")" = "$(tr -s ' \n' ' ' <"$TMP/odd-ids.out" | sed 's/ $//')" ] ||
        fail "odd: caption_ids $(cat "$TMP/odd-ids") are not the whole caption's: $(cat "$TMP/odd-ids.out")"
fi

# a missing input is a clear error, once
write_nml missing files "$TMP/no-such-dir" "$TMP/shards-missing"
mpi missing 2 "$SDTRAIN" "$TMP/missing.nml"
expect_rc missing 2
expect_count missing err "no-such-dir" 1

# bf16 encoders need a GPU: on the CPU a clear error, once, and nothing written
if ! "$SDTOOL" device >/dev/null 2>&1; then
    write_nml bf16 files "$TMP/data-files" "$TMP/shards-bf16"
    mpi bf16 2 "$SDTRAIN" "$TMP/bf16.nml" --set data.encode_precision=bf16 --set run.device=cpu
    expect_rc bf16 2
    expect_count bf16 err "encode_precision = 'bf16' needs a GPU" 1
    [ ! -e "$TMP/shards-bf16/manifest.json" ] || fail "bf16 on the CPU committed shards"
fi
# &data filter on the .json beside each image: of 24 samples, 4 without a .json and 4 whose
# .json is cut short cannot answer (no_metadata), 4 too small and 4 not downloaded are filtered,
# 8 are kept; the same from a webdataset tar of the same files (same keys and order): the same
# shards. A tsv manifest has no metadata: refused before any work.
run data-flt "$SDTOOL" make-demo-data "$TMP/data-flt" --count 24 --format files
expect_rc data-flt 0
i=0
while [ $i -lt 24 ]; do
    case $((i % 6)) in
    0) ;;
    1) echo '{"original_width": 300, "status": "success"}' ;;
    2) echo '{"original_width": 800, "status": "failed_to_download"}' ;;
    3) echo '{"original_width": 800, "status": "success"' ;;
    *) echo '{"original_width": 1024, "status": "success", "punsafe": 0.01}' ;;
    esac >"$TMP/data-flt/00000/$(printf %09d $i).json"
    [ -s "$TMP/data-flt/00000/$(printf %09d $i).json" ] || rm -f "$TMP/data-flt/00000/$(printf %09d $i).json"
    i=$((i + 1))
done
flt="data.filter='original_width >= 512 and status == \"success\"'"
write_nml flt files "$TMP/data-flt" "$TMP/shards-flt"
mpi flt 2 "$SDTRAIN" "$TMP/flt.nml" --set "$flt"
expect_rc flt 0
s="$TMP/shards-flt/preprocess_summary.json"
grep -q '"read": 24, "kept": 8, "skipped": 16' "$s" || fail "flt: counts: $(cat "$s")"
grep -q '"filtered": 8' "$s" && grep -q '"no_metadata": 8' "$s" || fail "flt: reasons: $(cat "$s")"
expect_in flt out "filtered"
# the shards say which filter chose their samples; a rerun with another one is refused
if command -v h5dump >/dev/null 2>&1; then
    h5dump -a filter "$TMP/shards-flt/shard-000000.h5" | grep -q 'original_width >= 512 and status == "success"' ||
        fail "flt: no filter attribute: $(h5dump -a filter "$TMP/shards-flt/shard-000000.h5" 2>&1 | head -n 12)"
fi
run flt-inspect "$SDTOOL" inspect "$TMP/shards-flt/shard-000000.h5"
expect_in flt-inspect out 'filter = "original_width >= 512 and status == \"success\""'
mpi flt-re 2 "$SDTRAIN" "$TMP/flt.nml" --set "data.filter='original_width >= 600'"
expect_rc flt-re 2
expect_in flt-re err "the committed shard-000000.h5 was made with &data filter = 'original_width >= 512 and status == \"success\"', this run has 'original_width >= 600'"
# the same conditions spaced and joined otherwise are the same filter
mpi flt-again 2 "$SDTRAIN" "$TMP/flt.nml" --set "data.filter='original_width>=512.0 , status==\"success\"'"
expect_rc flt-again 0
expect_in flt-again out "2 already committed"
(cd "$TMP/data-flt" && find 00000 -type f | LC_ALL=C sort | tar cf "$TMP/flt.tar" -T -) ||
    fail "flt: tar failed"
write_nml fltw webdataset "$TMP/flt.tar" "$TMP/shards-fltw"
mpi fltw 2 "$SDTRAIN" "$TMP/fltw.nml" --set "$flt"
expect_rc fltw 0
grep -q '"read": 24, "kept": 8, "skipped": 16' "$TMP/shards-fltw/preprocess_summary.json" ||
    fail "fltw: counts: $(cat "$TMP/shards-fltw/preprocess_summary.json")"
[ "$(checksums "$TMP/shards-fltw")" = "$(checksums "$TMP/shards-flt")" ] ||
    fail "fltw: the webdataset's shards differ from the folder's"
write_nml flttsv tsv "$TMP/data-tsv/manifest.tsv" "$TMP/shards-flttsv"
mpi flttsv 2 "$SDTRAIN" "$TMP/flttsv.nml" --set "$flt"
expect_rc flttsv 2
expect_count flttsv err "&data filter needs each sample's .json metadata, which input_format = 'tsv' has none of" 1
[ ! -e "$TMP/shards-flttsv" ] || fail "flttsv: made the shard directory"
write_nml flttsva auto "$TMP/data-tsv/manifest.tsv" "$TMP/shards-flttsva"
mpi flttsva 2 "$SDTRAIN" "$TMP/flttsva.nml" --set "$flt"
expect_rc flttsva 2
expect_count flttsva err "&data filter needs each sample's .json metadata, which the tsv manifest '$TMP/data-tsv/manifest.tsv' has none of" 1
[ ! -e "$TMP/shards-flttsva/manifest.json" ] || fail "flttsva: committed shards"
write_nml fltbad files "$TMP/data-flt" "$TMP/shards-fltbad"
mpi fltbad 2 "$SDTRAIN" "$TMP/fltbad.nml" --set "data.filter='width = 5'"
expect_rc fltbad 2
expect_count fltbad err "&data filter: '=' is no comparison (equal is '==') at '= 5'" 1

pass "preprocessing end to end"
