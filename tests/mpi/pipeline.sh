#!/bin/sh
# mode = 'pipeline' (online preprocessing) under MPI: 2 preprocessing + 2 training ranks on the
# tiny demo model. The trainers follow the shards as they are committed (doc/loader.md "Follow
# mode"): the job trains, writes metrics and weights, and its shards equal those of mode
# 'process'; the training does not depend on how fast the shards come (a run with slowed
# preprocessing, and one on an already complete shard directory, give the same weights and
# losses); a step that needs the next shard waits for it; a preprocessing half that dies or
# stalls ends the whole job with a non-zero status, without a hang; the training half on the
# emulated GPU device path trains the same; with &run pipeline_end = 'training' preprocessing stops
# at a shard boundary once training is done.
. "$top_srcdir/tests/lib.sh"
need_mpi
# 4 ranks: the default launcher passes --oversubscribe for machines with fewer cores

model=$TINY_MODEL

run data "$SDTOOL" make-demo-data "$TMP/data" --count 48
expect_rc data 0

# pipe_nml NAME SHARD_DIR MAX_STEPS: 2 ranks preprocess into SHARD_DIR (3 shards of 16), the
# others train with a global batch of 8 (2 x 4): a shard holds ~13 training samples, so every
# second step needs a new shard during the first pass; 8 steps reach into the second epoch.
pipe_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$TMP/$1', seed = 11, device = 'cpu' /
&model $model /
&data input = '$TMP/data', shard_dir = '$2', samples_per_shard = 16, encode_batch_size = 8,
      val_fraction = 0.2 /
&train max_steps = $3, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 2,
       log_every = 2, val_every = 4 /
&diffusion caption_dropout = 0.2 /
EOF2
}
losses() { grep -o '"loss": [^,]*' "$1/metrics.jsonl"; }

# (a) the pipeline trains and commits the same shards as mode 'process'
pipe_nml pipe "$TMP/shards-pipe" 8
mpi pipe 4 "$SDTRAIN" "$TMP/pipe.nml"
expect_rc pipe 0
expect_in pipe out "step 8/8"
expect_in pipe out "training summary"
expect_in pipe out "following the shards of $TMP/shards-pipe"
expect_in pipe out "all 3 planned shards are committed"
m="$TMP/pipe/metrics.jsonl"
[ "$(grep -c '"loss"' "$m")" = 8 ] || fail "pipe: expected 8 step lines in $m"
[ "$(grep -c '"val_loss"' "$m")" = 3 ] || fail "pipe: expected 3 validation lines (steps 0, 4, 8) in $m"
grep -q '"epoch": 1' "$m" || fail "pipe: 8 steps should reach the second epoch"
[ -s "$TMP/pipe/unet_final.safetensors" ] || fail "pipe: unet_final.safetensors missing"
checksums() { grep -E '"(index|checksum)"' "$1/manifest.json" | tr -d ' ",' | paste - -; }
nml proc.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc', seed = 11 /
&model $model /
&data input = '$TMP/data', shard_dir = '$TMP/shards-proc', samples_per_shard = 16, encode_batch_size = 8 /
EOF2
mpi proc 2 "$SDTRAIN" "$TMP/proc.nml"
expect_rc proc 0
checksums "$TMP/shards-proc" >"$TMP/sum-proc"
checksums "$TMP/shards-pipe" >"$TMP/sum-pipe"
[ "$(wc -l <"$TMP/sum-proc")" = 3 ] || fail "process wrote $(wc -l <"$TMP/sum-proc") shards, expected 3"
diff "$TMP/sum-proc" "$TMP/sum-pipe" || fail "the pipeline's shards differ from mode 'process'"
pass "pipeline trains; its shards equal mode 'process'"

# (b, c) slowed preprocessing: the trainers wait for shards, and train the same bits
pipe_nml slow "$TMP/shards-slow" 8
SDTRAIN_TEST_SHARD_DELAY_MS=1500 mpi slow 4 "$SDTRAIN" "$TMP/slow.nml"
expect_rc slow 0
expect_in slow out "waiting for shard 1 (shard-000001.h5) to be committed in $TMP/shards-slow: 1 of 3 shards known"
cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/slow/unet_final.safetensors" ||
    fail "slowed preprocessing changed the trained weights"
losses "$TMP/pipe" >"$TMP/l-pipe"
losses "$TMP/slow" >"$TMP/l-slow"
cmp -s "$TMP/l-pipe" "$TMP/l-slow" || fail "slowed preprocessing changed the losses"
grep '"val_loss"' "$TMP/pipe/metrics.jsonl" >"$TMP/v-pipe"
grep '"val_loss"' "$TMP/slow/metrics.jsonl" >"$TMP/v-slow"
cmp -s "$TMP/v-pipe" "$TMP/v-slow" || fail "slowed preprocessing changed the validation lines"
# every shard already committed (by mode 'process'): nothing to wait for, the same training
pipe_nml done "$TMP/shards-proc" 8
mpi done 4 "$SDTRAIN" "$TMP/done.nml"
expect_rc done 0
expect_not_in done out "waiting for shard"
cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/done/unet_final.safetensors" ||
    fail "a complete shard directory changed the trained weights"
# the training half on the GPU's device path, emulated on the CPU (tests/mpi/device_path.sh),
# ZeRO-2 with its gradient buckets during the backward: the same training as the host path
pipe_nml emu "$TMP/shards-proc" 8
SDTRAIN_EMULATE_DEVICE_PATH=1 mpi emu 4 "$SDTRAIN" "$TMP/emu.nml" --set train.sharding=shard_grad_op
expect_rc emu 0
expect_in emu out "emulating the GPU's device path"
run cmp-emu "$top_builddir/tests/mpi/st_compare" "$TMP/pipe/unet_final.safetensors" "$TMP/emu/unet_final.safetensors" 1e-6
expect_rc cmp-emu 0
# one training rank with the whole global batch of 8: the same samples per step, the same
# training up to the order of the gradient sums
pipe_nml one "$TMP/shards-one" 8
mpi one 3 "$SDTRAIN" "$TMP/one.nml" --set train.batch_size_per_rank=8
expect_rc one 0
run cmp-one "$top_builddir/tests/mpi/st_compare" "$TMP/pipe/unet_final.safetensors" "$TMP/one/unet_final.safetensors" 1e-6
expect_rc cmp-one 0
pass "the training does not depend on when the shards come, nor on the split of the global batch"

# (e) &run pipeline_end = 'training': one step needs shard 0 only; preprocessing (slowed by 4 s a
# shard) learns before shard 2 that training is done and stops there; a 'process' run commits
# the rest, and the directory equals mode 'process''s
pipe_nml early "$TMP/shards-early" 1
SDTRAIN_TEST_SHARD_DELAY_MS=4000 mpi early 4 "$SDTRAIN" "$TMP/early.nml" --set run.pipeline_end=training
expect_rc early 0
expect_in early out "mode 'pipeline': training is done; preprocessing stops at its next shard"
# (before shard 2 unless the one step took more than 4 s: a loaded machine may make it shard 3)
expect_in early out "preprocessing stops before shard"
n_early=$(checksums "$TMP/shards-early" | wc -l)
[ "$n_early" -lt 3 ] || fail "early: all 3 shards committed, though training was done after the first"
grep -q "preprocessing stops before shard $((n_early + 1)) of 3" "$TMP/early.out" ||
    fail "early: $n_early shard(s) committed, not what the log says"
sed "s|shards-proc|shards-early|" "$TMP/proc.nml" >"$TMP/rest.nml"
mpi rest 2 "$SDTRAIN" "$TMP/rest.nml"
expect_rc rest 0
checksums "$TMP/shards-early" >"$TMP/sum-early"
diff "$TMP/sum-proc" "$TMP/sum-early" || fail "pipeline_end 'training' + process: other shards than mode 'process'"
# with every shard done before training ends, the trainers' message is still taken: no hang
pipe_nml late "$TMP/shards-proc" 2
mpi late 4 "$SDTRAIN" "$TMP/late.nml" --set run.pipeline_end=training
expect_rc late 0
expect_not_in late out "preprocessing stops before shard"
pass "pipeline_end = 'training': preprocessing stops at a shard boundary, the rest comes later"

# (d) a preprocessing rank killed while writing: the whole job ends, non-zero, no hang
pipe_nml kill "$TMP/shards-kill" 8
SDTRAIN_FAULT=kill:rank=1:phase=shard-write mpi kill 4 "$SDTRAIN" "$TMP/kill.nml"
[ "$RC" != 0 ] || fail "kill: the job exited 0"
[ ! -e "$TMP/kill/unet_final.safetensors" ] || fail "kill: the trainers finished"
# a training rank killed at step 0 (after shard 0): the preprocessing half does not go on alone
pipe_nml tkill "$TMP/shards-tkill" 8
SDTRAIN_FAULT=kill:rank=3:step=0 SDTRAIN_TEST_SHARD_DELAY_MS=2500 mpi tkill 4 "$SDTRAIN" "$TMP/tkill.nml"
[ "$RC" != 0 ] || fail "tkill: the job exited 0"
expect_in tkill err "killing this rank at step 0"
[ "$(checksums "$TMP/shards-tkill" | wc -l)" -lt 3 ] || fail "tkill: the preprocessing half went on to the end"
# a stalled preprocessing half: the trainers give up after shard_wait_timeout, the job ends
pipe_nml stall "$TMP/shards-stall" 8
SDTRAIN_TEST_SHARD_DELAY_MS=20000 mpi stall 4 "$SDTRAIN" "$TMP/stall.nml" --set data.shard_wait_timeout=2
[ "$RC" != 0 ] || fail "stall: the job exited 0"
expect_in stall err "no shard 0 committed in $TMP/shards-stall after waiting 2 s"
expect_in stall err "the training half failed"
# (e) all the shards together hold fewer training samples than one global batch (8 images,
# 2 x 16 a step): the configuration error of mode 'train', status 2 (was an internal check
# failure, status 1, which job scripts retry), with the shards complete before training starts
# and with the trainers waiting for them
pipe_nml small "$TMP/shards-small" 4
sed -i "s|input = '$TMP/data'|input = '$TMP/data', max_samples = 8|; s/batch_size_per_rank = 4/batch_size_per_rank = 16/" "$TMP/small.nml"
mpi small 4 "$SDTRAIN" "$TMP/small.nml"
expect_rc small 2
expect_in small err "fewer than one global batch of 32 (2 ranks x 16)"
expect_not_in small err "check failed"
SDTRAIN_TEST_SHARD_DELAY_MS=500 mpi small2 4 "$SDTRAIN" "$TMP/small.nml" --set data.shard_dir="$TMP/shards-small2"
expect_rc small2 2
expect_in small2 err "fewer than one global batch of 32 (2 ranks x 16)"
pass "a failing half ends the whole job"
