#!/bin/sh
# mode = 'process' on the GPU (doc/architecture.md "Preprocessing"): the encoders on the CUDA
# backend, batches sent by sd_upload_async and results fetched by sd_download_async, against
# the same run on the CPU (tests/mpi/shard_compare: keys, captions and token ids equal):
#   1. one rank, fp32 (no TF32), shards stored in fp32: moments and embeddings within 1e-4;
#   2. the same GPU run again: the same shard checksums (deterministic);
#   3. bf16 encoders (the GPU default): within 5e-2 of the CPU;
#   4. two ranks sharing the GPU, 3 decode threads each, encoder batches of 3 (so batches
#      alternate many times, a partial batch at the end of every slice): within 1e-4 of the CPU;
#   5. the same skip counts as on the CPU.
# Skips without a CUDA build or a GPU.
SD_TEST_NAME=gpu-process # not the scratch directory of tests/mpi/process.sh
. "$top_srcdir/tests/lib.sh"

need_gpu
need_mpi
CMP="$top_builddir/tests/mpi/shard_compare"

run data "$SDTOOL" make-demo-data "$TMP/data" --count 40 --bad
expect_rc data 0

# proc NAME NP DEVICE PRECISION BATCH: mode 'process' of the demo data with the tiny encoders
proc() {
    nml "$1.nml" <<EOF2
&run mode = 'process', output_dir = '$TMP/run-$1', seed = 7, device = '$3' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards-$1', samples_per_shard = 16,
      encode_batch_size = $5, encode_precision = '$4', shard_dtype = 'fp32' /
EOF2
    mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1" 0
}
# compare NAME REF TOL: every shard of NAME against REF's
compare() {
    for f in "$TMP/shards-$2"/shard-*.h5; do
        b=$(basename "$f")
        run "cmp-$1-$b" "$CMP" "$TMP/shards-$1/$b" "$f" "$3"
        sed 's/^/  /' "$TMP/cmp-$1-$b.out"
        expect_rc "cmp-$1-$b" 0
    done
}
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }
counts() { grep -o '"read": [0-9]*, "kept": [0-9]*, "skipped": [0-9]*' "$1/preprocess_summary.json"; }

proc cpu 1 cpu fp32 4
proc gpu32 1 cuda fp32 4
expect_in gpu32 out "encoders on cuda in fp32"
compare gpu32 cpu 1e-4
[ "$(counts "$TMP/shards-gpu32")" = "$(counts "$TMP/shards-cpu")" ] ||
    fail "GPU skip counts differ: $(counts "$TMP/shards-gpu32") vs $(counts "$TMP/shards-cpu")"
pass "fp32 encoders on the GPU match the CPU (1e-4)"

proc gpu32b 1 cuda fp32 4
checksums "$TMP/shards-gpu32" >"$TMP/sum-a"
checksums "$TMP/shards-gpu32b" >"$TMP/sum-b"
diff "$TMP/sum-a" "$TMP/sum-b" || fail "two GPU runs wrote different shards"
pass "two GPU runs write the same shards"

proc gpu16 1 cuda bf16 4
expect_in gpu16 out "encoders on cuda in bf16"
compare gpu16 cpu 5e-2
pass "bf16 encoders on the GPU within 5e-2 of the CPU"

OMP_NUM_THREADS=3 proc gpu2 2 cuda fp32 3
compare gpu2 cpu 1e-4
[ "$(counts "$TMP/shards-gpu2")" = "$(counts "$TMP/shards-cpu")" ] || fail "2 ranks: skip counts differ"
pass "two ranks sharing the GPU, 3 threads, batches of 3: within 1e-4 of the CPU"
