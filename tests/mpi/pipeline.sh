#!/bin/sh
# mode = 'pipeline' (online preprocessing) under MPI: 2 preprocessing + 2 training ranks on the
# tiny demo model. The trainers follow the shards as they are committed (doc/loader.md "Follow
# mode"): the job trains, writes metrics and weights, and its shards equal those of mode
# 'process'; the training does not depend on how fast the shards come (a run with slowed
# preprocessing, and one on an already complete shard directory, give the same weights and
# losses); a step that needs the next shard waits for it; a preprocessing half that dies or
# stalls ends the whole job with a non-zero status, without a hang; the training half on the
# emulated GPU device path trains the same; with &run pipeline_end = 'training' preprocessing stops
# at a shard boundary once training is done; SIGUSR1 to a rank of either half (or to training
# rank 0 waiting for a shard) stops both halves with status 0, and a rerun resumes to the same
# weights.
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
# the preprocessing half's 2 ranks share one copy of the dataset index (the trainers hold none)
grep -q "not in node-shared memory" "$TMP/pipe.err" ||
    expect_in pipe out "in node-shared memory, 1 copy for 2 rank(s) (one per node)"
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
# &data shuffle_window = 1: the second epoch by windows of one shard (doc/loader.md), still
# independent of timing (slowed preprocessing == every shard committed already); not the
# global order
pipe_nml wslow "$TMP/shards-wslow" 8
SDTRAIN_TEST_SHARD_DELAY_MS=1500 mpi wslow 4 "$SDTRAIN" "$TMP/wslow.nml" --set data.shuffle_window=1
expect_rc wslow 0
pipe_nml wdone "$TMP/shards-proc" 8
mpi wdone 4 "$SDTRAIN" "$TMP/wdone.nml" --set data.shuffle_window=1
expect_rc wdone 0
cmp -s "$TMP/wslow/unet_final.safetensors" "$TMP/wdone/unet_final.safetensors" ||
    fail "shuffle_window = 1: slowed preprocessing changed the trained weights"
! cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/wdone/unet_final.safetensors" ||
    fail "shuffle_window = 1: the global order in the second epoch"
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

# (f) SIGUSR1 (Slurm's notice before the time limit) reaching either half stops the whole job
# with status 0: the half that caught it stops at its next boundary and tells the other, which
# stops as well (preprocessing after committing the shard it has encoded, the trainers with a
# checkpoint); run again, the job resumes from both and trains what the uninterrupted run
# (pipe) trained, bit for bit.
# same_as_pipe NAME: NAME was stopped with a checkpoint; a rerun completes it and equals pipe
same_as_pipe() {
    k=$(sed -n 's/^checkpointed at step \([0-9]*\) after SIGUSR1.*/\1/p' "$TMP/$1.out")
    [ -n "$k" ] || fail "$1: no checkpoint step in the log"
    [ -d "$TMP/$1/checkpoints/step-$(printf %08d "$k")" ] || fail "$1: no checkpoint of step $k"
    [ ! -e "$TMP/$1/unet_final.safetensors" ] || fail "$1: final weights written by a stopped run"
    mpi "$1-rerun" 4 "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1-rerun" 0
    expect_in "$1-rerun" out "resuming from $TMP/$1/checkpoints/step-$(printf %08d "$k"): step $k"
    expect_in "$1-rerun" out "all 3 planned shards are committed"
    cmp -s "$TMP/pipe/unet_final.safetensors" "$TMP/$1/unet_final.safetensors" ||
        fail "$1: stopped at step $k and resumed, other weights than the uninterrupted run"
    losses "$TMP/$1" >"$TMP/l-$1"
    cmp -s "$TMP/l-pipe" "$TMP/l-$1" || fail "$1: stopped and resumed, other losses"
}
# SIGUSR1 to the launcher, which passes it to every rank (as srun does with Slurm's notice),
# after the first step, preprocessing slowed: every rank stops, none dies of the signal (the
# preprocessing ranks did before 2026-11-27, and the job ended non-zero)
pipe_nml all "$TMP/shards-all" 8
# shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
SDTRAIN_TEST_SHARD_DELAY_MS=2000 $MPIEXEC $MPIEXEC_NP 4 "$SDTRAIN" "$TMP/all.nml" >"$TMP/all.out" 2>"$TMP/all.err" &
usr1_after_first_step all $! "$TMP/all/metrics.jsonl"
expect_rc all 0
expect_in all out "stopped for SIGUSR1 after committing shard"
expect_in all out "after SIGUSR1; resubmit to continue"
same_as_pipe all
# a preprocessing rank (world rank 1) once shard 1 is encoded: preprocessing commits it and
# stops, the trainers checkpoint at their next step (or while they wait for shard 1)
pipe_nml pusr1 "$TMP/shards-pusr1" 8
SDTRAIN_FAULT=usr1:rank=1:step=1 mpi pusr1 4 "$SDTRAIN" "$TMP/pusr1.nml"
expect_rc pusr1 0
expect_in pusr1 out "stopped for SIGUSR1 after committing shard 1: 2 of the 3 shards are committed, and a rerun goes on from them; the training half is told to stop too"
expect_in pusr1 out "after SIGUSR1 (caught by the preprocessing half); resubmit to continue"
[ "$(checksums "$TMP/shards-pusr1" | wc -l)" = 2 ] || fail "pusr1: expected shards 0 and 1 committed"
same_as_pipe pusr1
# a training rank (world rank 3) at the end of step 0, preprocessing slowed: the trainers
# checkpoint step 1, preprocessing stops at its next shard instead of going on to the end
pipe_nml tusr1 "$TMP/shards-tusr1" 8
SDTRAIN_FAULT=usr1:rank=3:step=0 SDTRAIN_TEST_SHARD_DELAY_MS=2500 mpi tusr1 4 "$SDTRAIN" "$TMP/tusr1.nml"
expect_rc tusr1 0
expect_in tusr1 out "checkpointed at step 1 after SIGUSR1; resubmit to continue"
expect_in tusr1 out "stopped for SIGUSR1 (caught by the training half) after committing shard"
[ "$(checksums "$TMP/shards-tusr1" | wc -l)" -lt 3 ] || fail "tusr1: the preprocessing half went on to the end"
same_as_pipe tusr1
# training rank 0 signalled while it waits for shard 1 (preprocessing slowed by 3 s a shard, the
# wait limit 120 s): the trainers stop at once with a checkpoint of step 1, not when shard 1
# comes nor after the limit; preprocessing commits shard 1 and stops
pipe_nml wusr1 "$TMP/shards-wusr1" 8
t0=$(date +%s)
SDTRAIN_FAULT=usr1:rank=2:phase=shard-wait:step=1 SDTRAIN_TEST_SHARD_DELAY_MS=3000 \
    mpi wusr1 4 "$SDTRAIN" "$TMP/wusr1.nml" --set data.shard_wait_timeout=120
expect_rc wusr1 0
[ $(($(date +%s) - t0)) -lt 60 ] || fail "wusr1: the stop took $(($(date +%s) - t0)) s"
expect_in wusr1 out "stopped while waiting for shard 1 of 3 in $TMP/shards-wusr1"
expect_in wusr1 out "checkpointed at step 1 after SIGUSR1; resubmit to continue"
expect_in wusr1 out "stopped for SIGUSR1 (caught by the training half) after committing shard 1: 2 of the 3 shards"
same_as_pipe wusr1
# ... and while it waits for shard 0, before any step: no checkpoint, status 0, no hang
pipe_nml ousr1 "$TMP/shards-ousr1" 8
SDTRAIN_FAULT=usr1:rank=2:phase=shard-wait SDTRAIN_TEST_SHARD_DELAY_MS=1500 mpi ousr1 4 "$SDTRAIN" "$TMP/ousr1.nml"
expect_rc ousr1 0
expect_in ousr1 out "stopped for SIGUSR1 while waiting for the first shard, before any step of this run; resubmit to continue"
expect_in ousr1 out "stopped for SIGUSR1 (caught by the training half) after committing shard 0: 1 of the 3 shards"
[ ! -e "$TMP/ousr1/checkpoints/latest" ] || fail "ousr1: a checkpoint without a step"
# ... and preprocessing signalled too, once shard 0 is encoded (the trainers' word came before):
# it stops for its own signal, and says it told the trainers nothing (it said so before)
pipe_nml busr1 "$TMP/shards-busr1" 8
SDTRAIN_FAULT=usr1:rank=2:phase=shard-wait,usr1:rank=1:step=0 SDTRAIN_TEST_SHARD_DELAY_MS=1500 \
    mpi busr1 4 "$SDTRAIN" "$TMP/busr1.nml"
expect_rc busr1 0
expect_in busr1 out "stopped for SIGUSR1 after committing shard 0: 1 of the 3 shards are committed, and a rerun goes on from them"
expect_not_in busr1 out "the training half is told to stop too"
# ... with &run pipeline_end = 'training': the trainers' "trained" word follows their stop word,
# and preprocessing (slowed by 1.5 s before shard 0) finds both there: it stops for the signal
# and says so, not that training is done (it did before)
pipe_nml eusr1 "$TMP/shards-eusr1" 8
SDTRAIN_FAULT=usr1:rank=2:phase=shard-wait SDTRAIN_TEST_SHARD_DELAY_MS=1500 \
    mpi eusr1 4 "$SDTRAIN" "$TMP/eusr1.nml" --set run.pipeline_end=training
expect_rc eusr1 0
expect_in eusr1 out "stopped for SIGUSR1 while waiting for the first shard"
expect_in eusr1 out "stopped for SIGUSR1 (caught by the training half)"
expect_not_in eusr1 out "preprocessing stops before shard"
pass "SIGUSR1 to either half: both stop cleanly with status 0, and a rerun trains the same"

# &data filter in the preprocessing half: of the 48 samples, those with original_width 1024
# are kept (24), 300 filtered (12), no .json is no_metadata (12); the trainers follow the
# filtered shards, and the shards equal those of mode 'process' with the same filter
width_metadata "$TMP/data"
# (preprocessing slowed down, so that the trainers start on shard 0 alone, whose 8 kept samples
# less the held-out ones are less than the global batch of 8: 0 steps an epoch then; the final
# checkpoint divided by that until 2026-11-28 and the job ended with SIGFPE, now it records the
# epochs of the shards known when it is written)
pipe_nml pflt "$TMP/shards-pflt" 4
SDTRAIN_TEST_SHARD_DELAY_MS=1000 mpi pflt 4 "$SDTRAIN" "$TMP/pflt.nml" --set "data.filter='original_width >= 512'"
expect_rc pflt 0
expect_in pflt out "step 4/4"
expect_in pflt out "all 3 planned shards are committed"
expect_in pflt out "0 steps per epoch (in the shards committed so far)"
grep -q '"steps_per_epoch": [1-9]' "$TMP/pflt/checkpoints/step-00000004/manifest.json" ||
    fail "pflt: the final checkpoint's steps_per_epoch: $(grep steps_per_epoch "$TMP/pflt/checkpoints/step-00000004/manifest.json")"
s="$TMP/shards-pflt/preprocess_summary.json"
grep -q '"read": 48, "kept": 24, "skipped": 24' "$s" || fail "pflt: counts: $(head -n 1 "$s")"
grep -q '"filtered": 12' "$s" && grep -q '"no_metadata": 12' "$s" || fail "pflt: reasons: $(head -n 1 "$s")"
mpi pflt-proc 2 "$SDTRAIN" "$TMP/proc.nml" --set "data.shard_dir='$TMP/shards-pflt-proc'" \
    --set "data.filter='original_width >= 512'"
expect_rc pflt-proc 0
[ "$(checksums "$TMP/shards-pflt")" = "$(checksums "$TMP/shards-pflt-proc")" ] ||
    fail "pflt: the pipeline's filtered shards differ from mode 'process''s"
pass "&data filter in the pipeline's preprocessing half"
