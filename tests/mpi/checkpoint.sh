#!/bin/sh
# Checkpoints and resume of mode = 'train' (doc/checkpoints.md): a run killed at a step and
# resumed gives the same bits as an uninterrupted one (weights and every loss); a kill during the
# checkpoint write or between rename and `latest` leaves the previous checkpoint latest; SIGUSR1
# checkpoints and exits 0; another rank count or sharding resumes; a corrupt file is named, and
# with resume = 'auto' the checkpoint before it resumes; keep_last and resume = 'never'; a bit
# changed on disk after the write is caught by the read-back (&checkpoint verify); a run started
# over beside another run's later checkpoints neither prunes nor resumes them; other shards on
# resume are a warning.
. "$top_srcdir/tests/lib.sh"
need_mpi
COMPARE="${top_builddir:-.}/tests/mpi/st_compare"

model=$TINY_MODEL

tiny_shards 48 2 # demo images encoded on the CPU into $TMP/shards

# train_nml NAME BATCH SHARDING [CHECKPOINT-KEYS]: 12 steps (3 epochs of 4), a checkpoint
# every 4 steps
train_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'train', output_dir = '$TMP/$1', seed = 11 /
&model $model /
&data shard_dir = '$TMP/shards', val_fraction = 0.2 /
&train max_steps = 12, batch_size_per_rank = $2, learning_rate = 1e-3, warmup_steps = 3,
       sharding = '$3', grad_clip = 0.5, log_every = 5, val_every = 5, ema_decay = 0.9 /
&diffusion caption_dropout = 0.2, min_snr_gamma = 5.0 /
&checkpoint every_n_steps = 4 ${4:-} /
EOF2
}

# the uninterrupted reference: 2 ranks x 4, DDP
train_nml ref 4 none
mpi ref 2 "$SDTRAIN" "$TMP/ref.nml"
expect_rc ref 0
expect_in ref out "no checkpoint in $TMP/ref/checkpoints: starting from step 0"
latest_is ref step-00000012

# mode 'sample' reads checkpoints: the final checkpoint (step 12) holds the parameters of
# unet_final.safetensors and the EMA of unet_ema.safetensors, so both give the same images
sample_from() { # sample_from NAME CHECKPOINT USE_EMA
    nml "$1.nml" <<EOF2
&run mode = 'sample', output_dir = '$TMP/$1', seed = 3 /
&model $model /
&sample prompts = 'a red square', num_steps = 2, guidance_scale = 2.0, checkpoint = '$2',
        use_ema = $3 /
EOF2
    mpi "$1" 1 "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1" 0
}
sample_from s-final "$TMP/ref" .false.
expect_in s-final out "unet_final.safetensors"
sample_from s-ckpt "$TMP/ref/checkpoints" .false.
expect_in s-ckpt out "step-00000012 (parameters)"
cmp -s "$TMP/s-final/samples/0-0.png" "$TMP/s-ckpt/samples/0-0.png" ||
    fail "sampling from the final checkpoint differs from sampling from unet_final.safetensors"
sample_from s-ema "$TMP/ref" .true.
expect_in s-ema out "unet_ema.safetensors"
sample_from s-ckema "$TMP/ref/checkpoints/step-00000012" .true.
expect_in s-ckema out "step-00000012 (EMA)"
cmp -s "$TMP/s-ema/samples/0-0.png" "$TMP/s-ckema/samples/0-0.png" ||
    fail "sampling from the checkpoint's EMA differs from sampling from unet_ema.safetensors"
! cmp -s "$TMP/s-ema/samples/0-0.png" "$TMP/s-final/samples/0-0.png" ||
    fail "use_ema made no difference"
echo "ok: mode 'sample' from checkpoints (parameters and EMA)"
for s in 00000004 00000008 00000012; do
    [ -s "$TMP/ref/checkpoints/step-$s/state.h5" ] && [ -s "$TMP/ref/checkpoints/step-$s/manifest.json" ] ||
        fail "ref: checkpoint step-$s missing"
done
[ "$(grep -c '"loss"' "$TMP/ref/metrics.jsonl")" = 12 ] || fail "ref: expected 12 loss lines"
# metrics.jsonl has a line for each checkpoint: its step, times and the state file's bytes
for s in 4 8 12; do
    b=$(stat -c %s "$TMP/ref/checkpoints/step-$(printf %08d $s)/state.h5")
    grep -Eq "^\{\"step\": $s, \"checkpoint_step\": $s, \"checkpoint_s\": [0-9.]+, \"checkpoint_held_s\": [0-9.]+, \"checkpoint_bytes\": $b\}\$" "$TMP/ref/metrics.jsonl" ||
        fail "ref: no checkpoint line of step $s ($b bytes) in metrics.jsonl"
done
# sdtool plot --text lists them beside the step metrics (more than the 16 series it kept before)
run plotref "$SDTOOL" plot --text "$TMP/ref/metrics.jsonl"
expect_rc plotref 0
for want in "checkpoint_s +3 " "checkpoint_bytes +3 " "optimizer_s +12 " "data_wait_max_rank +3 "; do
    grep -Eq "^$want" "$TMP/plotref.out" || { cat "$TMP/plotref.out" >&2; fail "plotref: no line '$want'"; }
done

# (a) killed at the start of step 8 (7 steps done, the newest checkpoint is of step 4),
# resumed with resume = 'auto': the same bits; (f) keep_last = 2 leaves 2 checkpoints
train_nml kill 4 none ", keep_last = 2"
SDTRAIN_FAULT=kill:rank=1:step=7 mpi kill 2 "$SDTRAIN" "$TMP/kill.nml"
[ "$RC" != 0 ] || fail "kill: the killed run exited 0"
latest_is kill step-00000004
[ "$(grep -c '"loss"' "$TMP/kill/metrics.jsonl")" = 7 ] || fail "kill: expected 7 loss lines before the kill"
mpi kill 2 "$SDTRAIN" "$TMP/kill.nml"
expect_rc kill 0
expect_in kill out "resuming from $TMP/kill/checkpoints/step-00000004: step 4"
same_run kill ref
[ "$(grep -c '"loss"' "$TMP/kill/metrics.jsonl")" = 12 ] || fail "kill: metrics.jsonl should hold 12 loss lines"
latest_is kill step-00000012
kept=$(cd "$TMP/kill/checkpoints" && echo step-*)
[ "$kept" = "step-00000008 step-00000012" ] || fail "kill: keep_last = 2 left $kept"

# the same with ZeRO-2 (rank 0 killed at the start of step 6): the same bits as the DDP
# reference, since both compute the same
train_nml zkill 4 shard_grad_op
SDTRAIN_FAULT=kill:rank=0:step=5 mpi zkill 2 "$SDTRAIN" "$TMP/zkill.nml"
[ "$RC" != 0 ] || fail "zkill: the killed run exited 0"
latest_is zkill step-00000004
mpi zkill 2 "$SDTRAIN" "$TMP/zkill.nml"
expect_rc zkill 0
same_run zkill ref

# (b) killed while writing the checkpoint of step 8: step 4 stays latest, the leftover is
# removed on restart, the resumed run matches
train_nml wkill 4 none
SDTRAIN_FAULT=kill:rank=1:phase=ckpt-write:step=8 mpi wkill 2 "$SDTRAIN" "$TMP/wkill.nml"
[ "$RC" != 0 ] || fail "wkill: the killed run exited 0"
expect_in wkill err "killing this rank at phase 'ckpt-write'"
latest_is wkill step-00000004
[ -d "$TMP/wkill/checkpoints/.step-00000008.tmp" ] || fail "wkill: no temporary directory left"
[ ! -e "$TMP/wkill/checkpoints/step-00000008" ] || fail "wkill: a half-written checkpoint is visible"
mpi wkill 2 "$SDTRAIN" "$TMP/wkill.nml"
expect_rc wkill 0
expect_in wkill out "left by an interrupted checkpoint write"
expect_in wkill out "resuming from $TMP/wkill/checkpoints/step-00000004"
[ ! -e "$TMP/wkill/checkpoints/.step-00000008.tmp" ] || fail "wkill: leftover not removed"
same_run wkill ref

# killed between the rename and the update of `latest`: step 8 is complete but not latest;
# the resume starts at step 4 and replaces step 8
train_nml ckill 4 none
SDTRAIN_FAULT=kill:rank=0:phase=ckpt-commit:step=8 mpi ckill 2 "$SDTRAIN" "$TMP/ckill.nml"
[ "$RC" != 0 ] || fail "ckill: the killed run exited 0"
latest_is ckill step-00000004
mpi ckill 2 "$SDTRAIN" "$TMP/ckill.nml"
expect_rc ckill 0
expect_in ckill out "resuming from $TMP/ckill/checkpoints/step-00000004"
same_run ckill ref

# (c) SIGUSR1 (fault injection on rank 1 at the end of step 6): every rank agrees, checkpoints
# step 6, exits 0 with the message; the resumed run matches
train_nml usr1 4 none
SDTRAIN_FAULT=usr1:rank=1:step=5 mpi usr1 2 "$SDTRAIN" "$TMP/usr1.nml"
expect_rc usr1 0
expect_in usr1 out "checkpointed at step 6 after SIGUSR1; resubmit to continue"
latest_is usr1 step-00000006
[ ! -e "$TMP/usr1/unet_final.safetensors" ] || fail "usr1: final weights written by a stopped run"
mpi usr1 2 "$SDTRAIN" "$TMP/usr1.nml"
expect_rc usr1 0
expect_in usr1 out "resuming from $TMP/usr1/checkpoints/step-00000006: step 6"
same_run usr1 ref

# a signal during the last step: the run just ends normally (final checkpoint and weights)
train_nml usr1last 4 none
SDTRAIN_FAULT=usr1:rank=0:step=11 mpi usr1last 2 "$SDTRAIN" "$TMP/usr1last.nml"
expect_rc usr1last 0
expect_not_in usr1last out "resubmit to continue"
latest_is usr1last step-00000012
same_run usr1last ref

# SIGUSR1 from outside, to the launcher (as Slurm's --signal does): a long run stops at the next
# step boundary with a checkpoint of that step
train_nml sig 4 none
sed -i -e 's/max_steps = 12/max_steps = 1000000/' -e 's/val_every = 5/val_every = 0/' \
    -e 's/every_n_steps = 4/every_n_steps = 0/' "$TMP/sig.nml"
# shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
$MPIEXEC $MPIEXEC_NP 2 "$SDTRAIN" "$TMP/sig.nml" >"$TMP/sig.out" 2>"$TMP/sig.err" &
usr1_after_first_step sig $! "$TMP/sig/metrics.jsonl"
expect_rc sig 0
expect_in sig out "after SIGUSR1; resubmit to continue"
k=$(sed -n 's/^checkpointed at step \([0-9]*\) after SIGUSR1.*/\1/p' "$TMP/sig.out")
latest_is sig "$(printf 'step-%08d' "$k")"

# (d) the DDP checkpoint of step 4 resumed as ZeRO-2 on 2 ranks: the same bits (DDP and ZeRO-2
# compute the same); on 1 rank x 8 and on 4 ranks x 2 with ZeRO-2: the same within 1e-6
train_nml zero2 4 shard_grad_op ", resume = '$TMP/ref/checkpoints/step-00000004'"
mpi zero2 2 "$SDTRAIN" "$TMP/zero2.nml"
expect_rc zero2 0
expect_in zero2 out "written by 2 rank(s) with sharding 'none'"
same_run zero2 ref 4
train_nml np1 8 none ", resume = '$TMP/ref/checkpoints'"
mpi np1 1 "$SDTRAIN" "$TMP/np1.nml"
expect_rc np1 0
expect_in np1 out "resuming from $TMP/ref/checkpoints/step-00000012"
train_nml np1 8 none ", resume = '$TMP/ref/checkpoints/step-00000004'"
mpi np1 1 "$SDTRAIN" "$TMP/np1.nml" --set run.output_dir="$TMP/np1b"
expect_rc np1 0
train_nml np4 2 shard_grad_op ", resume = '$TMP/ref/checkpoints/step-00000004'"
mpi np4 4 "$SDTRAIN" "$TMP/np4.nml"
expect_rc np4 0
for r in np1b np4; do
    run "cmp-$r" "$COMPARE" "$TMP/ref/unet_final.safetensors" "$TMP/$r/unet_final.safetensors" 1e-6
    expect_rc "cmp-$r" 0
done
# another global batch or seed: a warning, a refusal
train_nml gb 2 none ", resume = '$TMP/ref/checkpoints/step-00000004'"
mpi gb 2 "$SDTRAIN" "$TMP/gb.nml"
expect_rc gb 0
expect_in gb err "global batch is 8, this run's 4"
mpi seed 2 "$SDTRAIN" "$TMP/gb.nml" --set run.seed=12 --set run.output_dir="$TMP/seed"
expect_rc seed 2
expect_in seed err "seed"

# (e) a flipped byte in the data of adam_m: an error naming the file and the dataset on every
# rank, no hang
mkdir -p "$TMP/bad"
cp -r "$TMP/ref/checkpoints/step-00000008" "$TMP/bad/"
h5="$TMP/bad/step-00000008/state.h5"
flip_byte "$h5"
train_nml bad 4 none ", resume = '$TMP/bad/step-00000008'"
mpi bad 2 "$SDTRAIN" "$TMP/bad.nml"
expect_rc bad 2
expect_in bad err "fails its checksum"
expect_in bad err "$h5"
[ -z "$dataset" ] || expect_in bad err "dataset '$dataset'"
expect_count bad err "sdtrain:" 1
# an incomplete checkpoint (no manifest) is refused by name too
rm "$TMP/bad/step-00000008/manifest.json"
mpi bad2 2 "$SDTRAIN" "$TMP/bad.nml" --set run.output_dir="$TMP/bad2"
expect_rc bad2 2
expect_in bad2 err "not a complete checkpoint directory"

# (f) resume = 'auto' (a requeued job) whose newest checkpoint is damaged: a warning naming the
# file and the problem, the damaged one moved aside (kept), the one before it resumed, and the
# run ends with the uninterrupted run's bits; the same when `latest` names a missing directory;
# with no older checkpoint left, one clear error
for v in flip missing; do
    train_nml "fb-$v" 4 none
    mkdir -p "$TMP/fb-$v"
    cp -r "$TMP/ref/checkpoints" "$TMP/fb-$v/"
    cp "$TMP/ref/metrics.jsonl" "$TMP/fb-$v/"
    if [ $v = flip ]; then
        flip_byte "$TMP/fb-$v/checkpoints/step-00000012/state.h5"
    else
        rm -r "$TMP/fb-$v/checkpoints/step-00000012"
    fi
    mpi "fb-$v" 2 "$SDTRAIN" "$TMP/fb-$v.nml"
    expect_rc "fb-$v" 0
    expect_in "fb-$v" out "resuming from $TMP/fb-$v/checkpoints/step-00000008: step 8"
    expect_in "fb-$v" err "continuing from the newest complete checkpoint before it"
    same_run "fb-$v" ref 8
    latest_is "fb-$v" step-00000012
done
expect_in fb-flip err "fails its checksum"
expect_in fb-flip err "moved aside to $TMP/fb-flip/checkpoints/step-00000012.damaged"
[ -f "$TMP/fb-flip/checkpoints/step-00000012.damaged/state.h5" ] ||
    fail "fb-flip: the damaged checkpoint was not kept"
expect_in fb-missing err "which is missing or incomplete"
# sdtool inspect of checkpoints: a root lists its step directories and details the latest; with
# --verify the damaged one moved aside fails with the dataset named, an intact one passes
run insp-root "$SDTOOL" inspect "$TMP/fb-flip/checkpoints"
expect_rc insp-root 0
expect_in insp-root out "latest: step-00000012"
expect_in insp-root out "step-00000012.damaged        moved aside (damaged)"
expect_in insp-root out "step 12 (optimizer steps 12, skipped 0)"
expect_in insp-root out "written by 2 rank(s), sharding 'none', batch 4 per rank (global 8), seed 11, EMA yes"
expect_in insp-root out "read back and checked when written: yes"
run insp-bad "$SDTOOL" inspect --verify --config "$TMP/fb-flip/checkpoints/step-00000012.damaged"
expect_rc insp-bad 1
expect_in insp-bad out "CHECKSUM MISMATCH"
expect_in insp-bad out "problems: 1 dataset(s) fail their checksum"
expect_in insp-bad out "seed = 11"
run insp-good "$SDTOOL" inspect --verify "$TMP/fb-flip/checkpoints/step-00000008"
expect_rc insp-good 0
[ "$(grep -c 'ok, checksum verified' "$TMP/insp-good.out")" = 4 ] ||
    fail "insp-good: expected 4 verified datasets"
# a manifest with numbers no writer makes (tests/fuzz/fuzz_checkpoint.c): refused, named
mkdir -p "$TMP/edited"
cp -r "$TMP/ref/checkpoints/step-00000008" "$TMP/edited/"
sed 's/"opt_step": 8,/"opt_step": 99,/' "$TMP/ref/checkpoints/step-00000008/manifest.json" \
    >"$TMP/edited/step-00000008/manifest.json"
run insp-edited "$SDTOOL" inspect "$TMP/edited/step-00000008"
expect_rc insp-edited 1
expect_in insp-edited err "$TMP/edited/step-00000008/manifest.json: not a consistent checkpoint manifest: opt_step outside 0..step"
# only a damaged checkpoint: an error, nothing started
train_nml fb-none 4 none
mkdir -p "$TMP/fb-none/checkpoints"
cp -r "$TMP/ref/checkpoints/step-00000004" "$TMP/fb-none/checkpoints/"
echo step-00000004 >"$TMP/fb-none/checkpoints/latest"
flip_byte "$TMP/fb-none/checkpoints/step-00000004/state.h5"
mpi fb-none 2 "$SDTRAIN" "$TMP/fb-none.nml"
expect_rc fb-none 2
expect_in fb-none err "holds no older complete checkpoint; start fresh with &checkpoint resume = 'never'"
expect_count fb-none err "sdtrain:" 1

# (i) a storage error while resuming (SDTRAIN_FAULT eio: rank 1's read of the state file fails
# as EIO, which a plain read of the same bytes would show too): not damage, so the checkpoint is
# neither set aside nor replaced by an older one; the run ends with status 1 (a requeued job
# retries) and, the storage back, the next run resumes from it with the reference's bits
train_nml eio 4 none
mkdir -p "$TMP/eio"
cp -r "$TMP/ref/checkpoints" "$TMP/eio/"
cp "$TMP/ref/metrics.jsonl" "$TMP/eio/"
rm -r "$TMP/eio/checkpoints/step-00000012"
echo step-00000008 >"$TMP/eio/checkpoints/latest"
SDTRAIN_FAULT=eio:rank=1:phase=ckpt-load mpi eio 2 "$SDTRAIN" "$TMP/eio.nml"
expect_rc eio 1
expect_in eio err "reading dataset 'params' failed: Input/output error (a storage error, not damage: the checkpoint may be intact)"
expect_in eio err "the checkpoint is left as it is, and the run ends with status 1 so that a retry reads it again"
expect_count eio err "sdtrain:" 1
[ ! -e "$TMP/eio/checkpoints/step-00000008.damaged" ] && [ -d "$TMP/eio/checkpoints/step-00000008" ] ||
    fail "eio: the checkpoint was set aside for a storage error"
latest_is eio step-00000008
mpi eio 2 "$SDTRAIN" "$TMP/eio.nml"
expect_rc eio 0
expect_in eio out "resuming from $TMP/eio/checkpoints/step-00000008: step 8"
same_run eio ref 8

# (h) &checkpoint verify (the default): a bit of rank 1's data changed on disk after the write
# of step 8 was synced (a silent storage fault) is found by the read-back; the checkpoint is not
# committed, step 4 stays latest meanwhile and is not pruned, training goes on with the bits of
# the reference. With verify = .false. the same fault commits a damaged checkpoint (so the
# fault does change the file), which sdtool inspect --verify then names.
train_nml vflip 4 none ", keep_last = 1"
SDTRAIN_FAULT=flip:rank=1:phase=ckpt-write:step=8 mpi vflip 2 "$SDTRAIN" "$TMP/vflip.nml"
expect_rc vflip 0
expect_in vflip err "SDTRAIN_FAULT: flipped a bit of dataset 'params'"
expect_in vflip err "checkpoint of step 8 into '$TMP/vflip/checkpoints' failed (the previous checkpoint stays the latest): read back, rank 1's part of dataset 'params' of $TMP/vflip/checkpoints/.step-00000008.tmp/state.h5 has checksum"
expect_in vflip out "step 4: checkpoint written to $TMP/vflip/checkpoints/step-00000004"
expect_in vflip out "read back and verified"
[ ! -e "$TMP/vflip/checkpoints/step-00000008" ] && [ ! -e "$TMP/vflip/checkpoints/.step-00000008.tmp" ] ||
    fail "vflip: the checkpoint that failed its read-back is visible or left over"
latest_is vflip step-00000012
same_run vflip ref
train_nml noverify 4 none ", verify = .false."
SDTRAIN_FAULT=flip:rank=1:phase=ckpt-write:step=8 mpi noverify 2 "$SDTRAIN" "$TMP/noverify.nml"
expect_rc noverify 0
expect_not_in noverify out "read back and verified"
run insp-noverify "$SDTOOL" inspect --verify "$TMP/noverify/checkpoints/step-00000008"
expect_rc insp-noverify 1
expect_in insp-noverify out "CHECKSUM MISMATCH"
# an incomplete checkpoint (its state file gone) is named so, whether given itself or as the
# root's latest (was read as a shard directory, or detailed as a whole checkpoint, exit 0); a
# root without latest is still a root (a resume takes its newest complete checkpoint)
mkdir -p "$TMP/inc"
cp -r "$TMP/ref/checkpoints" "$TMP/inc/"
rm "$TMP/inc/checkpoints/step-00000012/state.h5"
run insp-inc "$SDTOOL" inspect "$TMP/inc/checkpoints/step-00000012"
expect_rc insp-inc 1
expect_in insp-inc err "checkpoint $TMP/inc/checkpoints/step-00000012 is incomplete"
run insp-incroot "$SDTOOL" inspect "$TMP/inc/checkpoints"
expect_rc insp-incroot 1
expect_in insp-incroot out "INCOMPLETE (no manifest or state file)  <- latest"
rm -r "$TMP/inc/checkpoints/step-00000012" "$TMP/inc/checkpoints/latest"
run insp-nolatest "$SDTOOL" inspect "$TMP/inc/checkpoints"
expect_rc insp-nolatest 0
expect_in insp-nolatest out "latest: (none: a resume takes the newest complete checkpoint)"
expect_in insp-noverify out "read back and checked when written: no (&checkpoint verify off, or an older sdtrain)"

# (g) resume = 'never' in a directory with checkpoints: a warning, a fresh start, the same
# training as the reference
mpi never 2 "$SDTRAIN" "$TMP/kill.nml" --set checkpoint.resume=never
expect_rc never 0
expect_in never err "starting fresh although"
expect_not_in never out "resuming from"
same_run kill ref
[ "$(grep -c '"val_loss"' "$TMP/kill/metrics.jsonl")" = 4 ] || fail "never: metrics.jsonl not started over"
# (g2) a run started over (resume = 'never', 6 steps, a checkpoint every 2, keep_last = 2) in a
# directory holding the reference's checkpoints 4, 8 and 12: keep_last prunes only its own
# (steps up to the one just written), leaving the reference's later ones alone; its newest
# checkpoint damaged, resume = 'auto' falls back to its own step 4, never to the later step 12
# of the other run (which would give that run's weights, silently)
train_nml over 4 none
mkdir -p "$TMP/over"
cp -r "$TMP/ref/checkpoints" "$TMP/over/"
mpi over 2 "$SDTRAIN" "$TMP/over.nml" --set checkpoint.resume=never --set train.max_steps=6 \
    --set checkpoint.every_n_steps=2 --set checkpoint.keep_last=2
expect_rc over 0
latest_is over step-00000006
[ "$(cd "$TMP/over/checkpoints" && echo step-*)" = "step-00000004 step-00000006 step-00000008 step-00000012" ] ||
    fail "over: checkpoints left: $(cd "$TMP/over/checkpoints" && echo step-*), expected its own 4 and 6 and the other run's 8 and 12"
flip_byte "$TMP/over/checkpoints/step-00000006/state.h5"
mpi over2 2 "$SDTRAIN" "$TMP/over.nml" --set train.max_steps=6 --set checkpoint.every_n_steps=2 \
    --set checkpoint.keep_last=2
expect_rc over2 0
expect_in over2 out "resuming from $TMP/over/checkpoints/step-00000004: step 4"
# the summary counts this run's steps for the throughput (it divided all 6 by 2 steps' time)
expect_in over2 out "6 of 6, 2 of them in this run"
mpi over3 2 "$SDTRAIN" "$TMP/over.nml" --set train.max_steps=6 --set checkpoint.every_n_steps=2 \
    --set checkpoint.keep_last=2
expect_rc over3 0
expect_in over3 out "6 of 6, 0 of them in this run"
expect_in over3 out "none (no step in this run)"
expect_not_in over2 out "step-00000012"
latest_is over step-00000006

# (j) shards with other training samples than the checkpoint's (a subset here): the same global
# batch, other steps per epoch: a warning that the data order differs from here on
nml proc2.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc2', seed = 5, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards2', samples_per_shard = 16, encode_batch_size = 8,
      max_samples = 32 /
EOF2
mpi proc2 2 "$SDTRAIN" "$TMP/proc2.nml"
expect_rc proc2 0
train_nml other 4 none ", resume = '$TMP/ref/checkpoints/step-00000004'"
mpi other 2 "$SDTRAIN" "$TMP/other.nml" --set data.shard_dir="$TMP/shards2"
expect_rc other 0
expect_in other err "the training samples changed"
expect_not_in gb err "the training samples changed"

# &data shuffle_window = 1 (batches from windows of one shard): another data order than the
# global one; killed at step 7 and resumed, the uninterrupted run's bits; a resume with another
# window says that it was written with 1
train_nml win 4 none
mpi win 2 "$SDTRAIN" "$TMP/win.nml" --set data.shuffle_window=1
expect_rc win 0
expect_in win out "data order: windows of 1 shard(s) (&data shuffle_window)"
expect_not_in win err "is more than open_shards"
losses win >"$TMP/l-win"
losses ref >"$TMP/l-ref"
! cmp -s "$TMP/l-win" "$TMP/l-ref" || fail "shuffle_window = 1 trained on the global order"
train_nml wink 4 none
SDTRAIN_FAULT=kill:rank=1:step=7 mpi wink 2 "$SDTRAIN" "$TMP/wink.nml" --set data.shuffle_window=1
[ "$RC" != 0 ] || fail "wink: the killed run exited 0"
latest_is wink step-00000004
mpi wink 2 "$SDTRAIN" "$TMP/wink.nml" --set data.shuffle_window=1
expect_rc wink 0
expect_in wink out "resuming from $TMP/wink/checkpoints/step-00000004: step 4"
same_run wink win
train_nml winw 4 none ", resume = '$TMP/win/checkpoints/step-00000008'"
mpi winw 2 "$SDTRAIN" "$TMP/winw.nml"
expect_rc winw 0
expect_in winw err "resume: &data shuffle_window was 1 when the checkpoint was written, this run has 0"
# a window wider than the shards kept open: said
train_nml winwide 4 none
mpi winwide 2 "$SDTRAIN" "$TMP/winwide.nml" --set data.shuffle_window=4 --set data.open_shards=2 \
    --set train.max_steps=2
expect_rc winwide 0
expect_in winwide err "&data shuffle_window = 4 is more than open_shards = 2"
# &checkpoint every_n_minutes: an interval shorter than any step (6e-5 s) checkpoints at every
# step boundary by rank 0's clock, on every rank alike (2 ranks: a disagreement would hang or
# fail the collective write), and the training is the uninterrupted run's; killed with 7 steps
# done, the time-based checkpoint of step 7 resumes to the same bits
train_nml mins 4 none ", every_n_minutes = 1e-6, keep_last = 0"
mpi mins 2 "$SDTRAIN" "$TMP/mins.nml" --set checkpoint.every_n_steps=0
expect_rc mins 0
expect_in mins out "step 3: 0.0 min of training since the last checkpoint (&checkpoint every_n_minutes = 1e-06)"
n=$(ls -d "$TMP/mins/checkpoints"/step-* | wc -l)
[ "$n" = 12 ] || fail "mins: $n checkpoints, expected one after each of the 12 steps"
same_run mins ref
train_nml minsk 4 none ", every_n_minutes = 1e-6"
SDTRAIN_FAULT=kill:rank=1:step=7 mpi minsk 2 "$SDTRAIN" "$TMP/minsk.nml" --set checkpoint.every_n_steps=0
[ "$RC" != 0 ] || fail "minsk: the killed run exited 0"
latest_is minsk step-00000007
mpi minsk 2 "$SDTRAIN" "$TMP/minsk.nml" --set checkpoint.every_n_steps=0
expect_rc minsk 0
expect_in minsk out "resuming from $TMP/minsk/checkpoints/step-00000007: step 7"
same_run minsk ref
# written in the background (async), every step's too; an interval longer than the run adds
# nothing to every_n_steps (4, 8 and the final 12)
train_nml minsa 4 none ", every_n_minutes = 1e-6, keep_last = 0, async = .true."
mpi minsa 2 "$SDTRAIN" "$TMP/minsa.nml" --set checkpoint.every_n_steps=0 --set train.max_steps=5
expect_rc minsa 0
expect_in minsa out "step 4: checkpoint started in the background"
n=$(ls -d "$TMP/minsa/checkpoints"/step-* | wc -l)
[ "$n" = 5 ] || fail "minsa: $n checkpoints, expected 5"
train_nml minsl 4 none ", every_n_minutes = 600, keep_last = 0"
mpi minsl 2 "$SDTRAIN" "$TMP/minsl.nml"
expect_rc minsl 0
expect_not_in minsl out "min of training since the last checkpoint"
[ "$(cd "$TMP/minsl/checkpoints" && echo step-*)" = "step-00000004 step-00000008 step-00000012" ] ||
    fail "minsl: checkpoints $(cd "$TMP/minsl/checkpoints" && echo step-*), expected 4, 8, 12"
# &checkpoint keep_every_n_steps: milestones (5, 10) are written though every_n_steps (2) does
# not ask for them, and keep_last = 1 removes every other checkpoint but the newest
train_nml keepm 4 none ", keep_last = 1, keep_every_n_steps = 5"
mpi keepm 2 "$SDTRAIN" "$TMP/keepm.nml" --set checkpoint.every_n_steps=2
expect_rc keepm 0
[ "$(cd "$TMP/keepm/checkpoints" && echo step-*)" = "step-00000005 step-00000010 step-00000012" ] ||
    fail "keepm: checkpoints $(cd "$TMP/keepm/checkpoints" && echo step-*), expected 5, 10, 12"
latest_is keepm step-00000012
same_run keepm ref
pass "checkpoints and resume of mode = 'train'"
