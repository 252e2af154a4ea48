#!/bin/sh
# &sample every_n_steps (doc/training.md "Images during training"): a training run makes the
# images of &sample prompts from its checkpoints at multiples of every_n_steps and from the last
# one, split over the training ranks; they are the PNG bytes mode 'sample' makes from the same
# checkpoint, and the training itself (weights, losses) is the same bits as without them. Also in
# mode 'pipeline' (its training ranks only); bad settings are refused at --check, naming the line.
. "$top_srcdir/tests/lib.sh"
need_mpi

snap="$top_srcdir/tests/data/models/tiny-sd2"
stok="$top_srcdir/tests/data/sample/tokenizer"
tiny_shards 24 1
nml base.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/plain', seed = 11, device = 'cpu' /
&model pretrained = '$snap', tokenizer = '$stok', resolution = 32, unet_init = 'pretrained' /
&data shard_dir = '$TMP/shards' /
&train max_steps = 5, batch_size_per_rank = 2, learning_rate = 1e-3, ema_decay = 0.9 /
&checkpoint every_n_steps = 2, keep_last = 0 /
&sample prompts = 'a red square on a blue background', 'a green circle', num_steps = 2,
        guidance_scale = 2.0, images_per_prompt = 2, scheduler = 'euler' /
EOF2
mpi plain 2 "$SDTRAIN" "$TMP/base.nml"
expect_rc plain 0
[ ! -e "$TMP/plain/samples" ] || fail "images without &sample every_n_steps"
expect_not_in plain err "whose scheduler has"
expect_not_in plain err "trains the U-Net without dropout"

# a snapshot whose training setup this run does not follow: a v-prediction scheduler (this run
# trains epsilon) and ResNet dropout (not implemented): warnings, the run goes on
cp -r "$snap" "$TMP/vsnap"
mkdir -p "$TMP/vsnap/scheduler"
printf '{"_class_name": "DDIMScheduler", "prediction_type": "v_prediction", "num_train_timesteps": 1000, "beta_schedule": "scaled_linear"}\n' \
    >"$TMP/vsnap/scheduler/scheduler_config.json"
sed -i 's/"dropout": 0.0/"dropout": 0.1/' "$TMP/vsnap/unet/config.json"
mpi vsnap 1 "$SDTRAIN" "$TMP/base.nml" --set "model.pretrained='$TMP/vsnap'" \
    --set "run.output_dir='$TMP/vsnap-run'" --set train.max_steps=1
expect_rc vsnap 0
expect_count vsnap err "whose scheduler has prediction_type 'v_prediction' (this run: 'epsilon')" 1
expect_count vsnap err "has dropout = 0.1: sdtrain trains the U-Net without dropout" 1
# the schedule's other keys: a zero terminal SNR snapshot (and another beta_end) continued on
# &diffusion's unrescaled schedule is warned about too; SD2's own values give no warning
cp -r "$snap" "$TMP/zsnap"
mkdir -p "$TMP/zsnap/scheduler"
printf '{"prediction_type": "v_prediction", "num_train_timesteps": 1000, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.02, "rescale_betas_zero_snr": true}\n' \
    >"$TMP/zsnap/scheduler/scheduler_config.json"
mpi zsnap 1 "$SDTRAIN" "$TMP/base.nml" --set "model.pretrained='$TMP/zsnap'" \
    --set "run.output_dir='$TMP/zsnap-run'" --set train.max_steps=1 \
    --set diffusion.prediction_type=v_prediction
expect_rc zsnap 0
expect_count zsnap err "whose scheduler has beta_end 0.02 (this run: 0.012), rescale_betas_zero_snr true (this run: .false.)" 1
expect_not_in zsnap err "prediction_type 'v_prediction' (this run"
printf '{"prediction_type": "epsilon", "num_train_timesteps": 1000, "beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012, "rescale_betas_zero_snr": false}\n' \
    >"$TMP/zsnap/scheduler/scheduler_config.json"
mpi sd2snap 1 "$SDTRAIN" "$TMP/base.nml" --set "model.pretrained='$TMP/zsnap'" \
    --set "run.output_dir='$TMP/sd2snap-run'" --set train.max_steps=1
expect_rc sd2snap 0
expect_not_in sd2snap err "whose scheduler has"

# the replicas start from the same pretrained weights: a rank that read other bytes (a bit of
# rank 1's copy flipped after the read) stops the job before training, status 1, named once
SDTRAIN_FAULT=flip:rank=1:phase=unet-load mpi flipped 2 "$SDTRAIN" "$TMP/base.nml" \
    --set "run.output_dir='$TMP/flipped'"
expect_rc flipped 1
expect_count flipped err "the training ranks read different U-Net weights from $snap (rank 1's differ" 1
[ ! -e "$TMP/flipped/metrics.jsonl" ] || fail "flipped: trained with replicas apart"

mpi withimg 2 "$SDTRAIN" "$TMP/base.nml" --set "run.output_dir='$TMP/img'" --set sample.every_n_steps=4
expect_rc withimg 0
expect_in withimg out "step 4: images of &sample prompts in $TMP/img/samples/step-00000004/samples"
expect_in withimg out "step 5: images of &sample prompts in $TMP/img/samples/step-00000005/samples"
for s in 00000004 00000005; do
    for p in 0-0 0-1 1-0 1-1; do
        [ -s "$TMP/img/samples/step-$s/samples/$p.png" ] || fail "no image $p at step $s"
    done
    [ "$(wc -l <"$TMP/img/samples/step-$s/samples.jsonl")" = 4 ] || fail "samples.jsonl of step $s"
done
[ ! -e "$TMP/img/samples/step-00000002" ] || fail "images at step 2 (not a multiple of 4)"
cmp -s "$TMP/plain/unet_final.safetensors" "$TMP/img/unet_final.safetensors" ||
    fail "the images changed the training's weights"
cmp -s "$TMP/plain/unet_ema.safetensors" "$TMP/img/unet_ema.safetensors" ||
    fail "the images changed the training's EMA"
# (timings, and the lines naming the slowest rank, left out)
grep -v 'max_rank"' "$TMP/plain/metrics.jsonl" |
    sed 's/"images_per_s": [^,]*,//; s/"tflops_per_rank": [^,]*,//; s/"[a-z_]*_s": [0-9.e-]*//g' >"$TMP/m1"
grep -v 'max_rank"' "$TMP/img/metrics.jsonl" |
    sed 's/"images_per_s": [^,]*,//; s/"tflops_per_rank": [^,]*,//; s/"[a-z_]*_s": [0-9.e-]*//g' >"$TMP/m2"
cmp -s "$TMP/m1" "$TMP/m2" || fail "the images changed the losses"
pass "images from the checkpoints at step 4 and the last (5), split over 2 ranks; the training's bits unchanged"

# the same images as mode 'sample' from the same checkpoint, on one rank
mpi sample4 1 "$SDTRAIN" "$TMP/base.nml" --set run.mode=sample --set "run.output_dir='$TMP/s4'" \
    --set "sample.checkpoint='$TMP/img/checkpoints/step-00000004'"
expect_rc sample4 0
for p in 0-0 0-1 1-0 1-1; do
    cmp -s "$TMP/s4/samples/$p.png" "$TMP/img/samples/step-00000004/samples/$p.png" ||
        fail "step 4, $p.png: not mode 'sample''s bytes"
done
pass "the images of step 4 are mode 'sample''s PNG bytes from that checkpoint"

# a job that ended during the images of a checkpoint (no samples.jsonl, an image missing) makes
# them when it resumes from that checkpoint, keeping the others (&sample resume): step 4, resumed
# from with max_steps 5, before its first step; then step 5, the last, by a rerun of the
# finished job
cp "$TMP/img/samples/step-00000004/samples.jsonl" "$TMP/jsonl-4"
rm "$TMP/img/samples/step-00000004/samples.jsonl" "$TMP/img/samples/step-00000004/samples/1-0.png"
mpi imgr 2 "$SDTRAIN" "$TMP/base.nml" --set "run.output_dir='$TMP/img'" --set sample.every_n_steps=4 \
    --set "checkpoint.resume='$TMP/img/checkpoints/step-00000004'"
expect_rc imgr 0
expect_in imgr out "resuming from $TMP/img/checkpoints/step-00000004: step 4"
expect_in imgr out "kept 3 of the 4 image(s) from the run before"
expect_in imgr out "step 4: images of &sample prompts in $TMP/img/samples/step-00000004/samples"
cmp -s "$TMP/jsonl-4" "$TMP/img/samples/step-00000004/samples.jsonl" || fail "imgr: samples.jsonl of step 4"
cmp -s "$TMP/s4/samples/1-0.png" "$TMP/img/samples/step-00000004/samples/1-0.png" ||
    fail "imgr: the image made again differs"
cmp -s "$TMP/plain/unet_final.safetensors" "$TMP/img/unet_final.safetensors" ||
    fail "imgr: the resumed training's weights differ"
for p in 0-0 0-1 1-0 1-1; do cp "$TMP/img/samples/step-00000005/samples/$p.png" "$TMP/s5-$p.png"; done
rm "$TMP/img/samples/step-00000005/samples.jsonl" "$TMP/img/samples/step-00000005/samples/0-1.png"
mpi imgl 2 "$SDTRAIN" "$TMP/base.nml" --set "run.output_dir='$TMP/img'" --set sample.every_n_steps=4
expect_rc imgl 0
expect_in imgl out "kept 3 of the 4 image(s) from the run before"
[ "$(wc -l <"$TMP/img/samples/step-00000005/samples.jsonl")" = 4 ] || fail "imgl: samples.jsonl of step 5"
for p in 0-0 0-1 1-0 1-1; do
    cmp -s "$TMP/s5-$p.png" "$TMP/img/samples/step-00000005/samples/$p.png" || fail "imgl: $p.png of step 5"
done
mpi imgl2 2 "$SDTRAIN" "$TMP/base.nml" --set "run.output_dir='$TMP/img'" --set sample.every_n_steps=4
expect_rc imgl2 0
expect_not_in imgl2 out "images of &sample prompts"
pass "a resumed job makes the images its checkpoint lacks (keeping those there); a finished one makes none"

# --check: prompts needed, a multiple of the checkpoint interval
sed '/^&sample/,$d' "$TMP/base.nml" >"$TMP/noprompt.nml"
echo "&sample every_n_steps = 4 /" >>"$TMP/noprompt.nml"
run nop "$SDTRAIN" --check "$TMP/noprompt.nml"
expect_rc nop 2
expect_in nop err "noprompt.nml:6:9: "
expect_in nop err "&sample every_n_steps = 4 needs &sample prompts"
run mult "$SDTRAIN" --check "$TMP/base.nml" --set sample.every_n_steps=3
expect_rc mult 2
expect_in mult err "&sample every_n_steps = 3 must be a multiple of &checkpoint every_n_steps = 2"
run noc "$SDTRAIN" --check "$TMP/base.nml" --set sample.every_n_steps=2 --set checkpoint.every_n_steps=0
expect_rc noc 2
expect_in noc err "must be a multiple of &checkpoint every_n_steps = 0"
pass "--check: every_n_steps must be a multiple of the checkpoint interval"

# mode 'pipeline' (a model from scratch: VAE and text encoder drawn from the seed, as the demo):
# the images on its training ranks while rank 0 preprocesses
nml pipe.nml <<EOF2
&run mode = 'pipeline', n_process_ranks = 1, output_dir = '$TMP/pipe', seed = 11, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/pshards', samples_per_shard = 16, encode_batch_size = 8 /
&train max_steps = 2, batch_size_per_rank = 2, learning_rate = 1e-3 /
&checkpoint every_n_steps = 2, keep_last = 0 /
&sample prompts = 'a red square on a blue background', num_steps = 2, guidance_scale = 2.0,
        images_per_prompt = 3, every_n_steps = 2 /
EOF2
mpi pipe 3 "$SDTRAIN" "$TMP/pipe.nml"
expect_rc pipe 0
for p in 0-0 0-1 0-2; do
    [ -s "$TMP/pipe/samples/step-00000002/samples/$p.png" ] || fail "pipeline: no image $p"
done
pass "mode 'pipeline': the images of its last checkpoint, made by its 2 training ranks"
