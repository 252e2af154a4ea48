#!/bin/sh
# mode = 'pipeline' (online preprocessing) on the GPU, never run there before: one preprocessing
# rank encoding on the GPU while one training rank trains on it (both on GPU 0 when there is one
# GPU), on the tiny demo model in fp32:
#   1. the job trains 8 steps following the shards as they are committed, and its shards are the
#      bytes mode 'process' writes on the GPU with the same rank count and batch;
#   2. the same job on the complete shard directory (nothing to wait for) gives the same
#      weights and losses, and so does one with slowed preprocessing (the trainer waits for
#      shards): when the shards come does not change the training (doc/loader.md "Follow
#      mode"; epoch 0 follows the shards, so mode 'train' orders it otherwise).
# Skips without a CUDA build or a GPU.
SD_TEST_NAME=gpu-pipeline # not the scratch directory of tests/mpi/pipeline.sh
. "$top_srcdir/tests/lib.sh"

need_gpu
need_mpi

run data "$SDTOOL" make-demo-data "$TMP/data" --count 48
expect_rc data 0

# job_nml NAME MODE SHARD_DIR: the namelist of a pipeline (1 + 1 ranks) or process run
job_nml() {
    nml "$1.nml" <<EOF2
&run mode = '$2', n_process_ranks = $([ "$2" = pipeline ] && echo 1 || echo 0), output_dir = '$TMP/$1',
     seed = 11, device = '${DEVICE:-cuda}' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$3', samples_per_shard = 16, encode_batch_size = 8,
      encode_precision = 'fp32', val_fraction = 0.2 /
&train max_steps = 8, batch_size_per_rank = 8, learning_rate = 1e-3, warmup_steps = 2,
       log_every = 2, val_every = 4, precision = 'fp32' /
&diffusion caption_dropout = 0.2 /
EOF2
}
losses() { grep -o '"[a-z_]*loss": [^,}]*' "$1/metrics.jsonl"; }
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }

job_nml pipe pipeline "$TMP/shards-pipe"
mpi pipe 2 "$SDTRAIN" "$TMP/pipe.nml"
expect_rc pipe 0
expect_in pipe out "step 8/8"
expect_in pipe out "following the shards of $TMP/shards-pipe"
expect_in pipe out "all 3 planned shards are committed"
[ -s "$TMP/pipe/unet_final.safetensors" ] || fail "pipe: unet_final.safetensors missing"
job_nml proc process "$TMP/shards-proc"
mpi proc 1 "$SDTRAIN" "$TMP/proc.nml"
expect_rc proc 0
checksums "$TMP/shards-proc" >"$TMP/sum-proc"
checksums "$TMP/shards-pipe" >"$TMP/sum-pipe"
[ "$(wc -l <"$TMP/sum-proc")" = 3 ] || fail "process wrote $(wc -l <"$TMP/sum-proc") shards, expected 3"
diff "$TMP/sum-proc" "$TMP/sum-pipe" || fail "the pipeline's shards differ from mode 'process'"
pass "pipeline on the GPU: trains 8 steps, its shards are mode 'process''s bytes"

# on the complete shard directory of mode 'process' (nothing to wait for): the same training
job_nml done pipeline "$TMP/shards-proc"
mpi done 2 "$SDTRAIN" "$TMP/done.nml"
expect_rc done 0
expect_not_in done out "waiting for shard"
cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/done/unet_final.safetensors" ||
    fail "a complete shard directory changed the trained weights"
losses "$TMP/pipe" >"$TMP/l-pipe"
losses "$TMP/done" >"$TMP/l-done"
cmp -s "$TMP/l-pipe" "$TMP/l-done" || fail "a complete shard directory changed the losses"
job_nml slow pipeline "$TMP/shards-slow"
SDTRAIN_TEST_SHARD_DELAY_MS=1500 mpi slow 2 "$SDTRAIN" "$TMP/slow.nml"
expect_rc slow 0
expect_in slow out "waiting for shard"
cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/slow/unet_final.safetensors" ||
    fail "slowed preprocessing changed the trained weights"
pass "pipeline on the GPU: the training does not depend on when the shards come"
