#!/bin/sh
# sdtool export (doc/export.md): a tiny training run's checkpoint and final weights exported as a
# diffusers snapshot hold the training weights bit for bit (params and --ema), `sdtool forward`
# on the export equals the forward on the original weights, a run that trained from a snapshot
# gets its unet config and other parts, and `&sample checkpoint = <export>` samples the same PNG
# bytes as the training output (also with a &diffusion other than the snapshot's scheduler, and
# with &checkpoint dir elsewhere); bad input, and an --out that is, holds or lies in the source,
# end with exit 2 and a message naming the file.
. "$top_srcdir/tests/lib.sh"
need_mpi

run probe "$SDTOOL" export --help
[ "$RC" != 3 ] || skip "sdtool export is not hooked up in this build"
expect_rc probe 0
expect_in probe out "usage: sdtool export --from SRC --out DIR"

model=$TINY_MODEL
snap="$top_srcdir/tests/data/models/tiny-sd2"
stok="$top_srcdir/tests/data/sample/tokenizer"
golden="$snap/golden/unet.safetensors"


# ---- a run from scratch (no snapshot): 4 steps, a checkpoint every 2, an EMA ------------------
tiny_shards 24 1
nml train.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/run', seed = 11, device = 'cpu' /
&model $model /
&data shard_dir = '$TMP/shards' /
&train max_steps = 4, batch_size_per_rank = 4, learning_rate = 1e-3, ema_decay = 0.9 /
&checkpoint every_n_steps = 2, keep_last = 0 /
EOF2
mpi train 1 "$SDTRAIN" "$TMP/train.nml"
expect_rc train 0

# a training output directory -> its checkpoints/latest (step 4): the final weights' bytes
run out "$SDTOOL" export --from "$TMP/run" --out "$TMP/exp"
expect_rc out 0
expect_in out out "step 4 (parameters) of checkpoint $TMP/run/checkpoints/step-00000004"
for f in unet/config.json unet/diffusion_pytorch_model.safetensors model_index.json \
    scheduler/scheduler_config.json; do
    [ -s "$TMP/exp/$f" ] || fail "export: $f missing"
done
[ ! -e "$TMP/exp/vae" ] && [ ! -e "$TMP/exp.tmp" ] || fail "export: a vae/ or exp.tmp left"
grep -q '"UNet2DConditionModel"' "$TMP/exp/unet/config.json" || fail "export: config.json class"
grep -q 'not included (no pretrained snapshot' "$TMP/exp/model_index.json" ||
    fail "export: model_index.json does not say that the other parts are missing"
cmp -s "$TMP/exp/unet/diffusion_pytorch_model.safetensors" "$TMP/run/unet_final.safetensors" ||
    fail "export: the exported weights differ from unet_final.safetensors"
# --ema: the EMA's bytes; a step directory and a checkpoint root work too
run ema "$SDTOOL" export --from "$TMP/run/checkpoints" --out "$TMP/exp-ema" --ema
expect_rc ema 0
expect_in ema out "(EMA)"
cmp -s "$TMP/exp-ema/unet/diffusion_pytorch_model.safetensors" "$TMP/run/unet_ema.safetensors" ||
    fail "export --ema: differs from unet_ema.safetensors"
run step2 "$SDTOOL" export --from "$TMP/run/checkpoints/step-00000002" --out "$TMP/exp2"
expect_rc step2 0
cmp -s "$TMP/exp2/unet/diffusion_pytorch_model.safetensors" "$TMP/run/unet_final.safetensors" &&
    fail "export of step 2 equals the final weights"
# a source whose path is not UTF-8 (a Latin-1 name): model_index.json, which quotes it, stays
# UTF-8 JSON (json-c copied the byte)
if command -v iconv >/dev/null 2>&1; then
    lat=$(printf '%s/run-caf\351' "$TMP")
    ln -s "$TMP/run" "$lat"
    run lat "$SDTOOL" export --from "$lat" --out "$TMP/exp-lat"
    expect_rc lat 0
    iconv -f UTF-8 -t UTF-8 "$TMP/exp-lat/model_index.json" >/dev/null 2>&1 ||
        fail "export: model_index.json is not UTF-8"
    grep -q "run-caf$(printf '\357\277\275')" "$TMP/exp-lat/model_index.json" ||
        fail "export: the Latin-1 byte is not U+FFFD in model_index.json"
fi
# no checkpoints: unet_final.safetensors + used.nml
mkdir -p "$TMP/final"
cp "$TMP/run/unet_final.safetensors" "$TMP/run/unet_ema.safetensors" "$TMP/run/used.nml" "$TMP/final/"
run final "$SDTOOL" export --from "$TMP/final" --out "$TMP/exp-final"
expect_rc final 0
cmp -s "$TMP/exp-final/unet/diffusion_pytorch_model.safetensors" "$TMP/run/unet_final.safetensors" ||
    fail "export of unet_final.safetensors: other bytes"
cmp -s "$TMP/exp-final/unet/config.json" "$TMP/exp/unet/config.json" ||
    fail "export: the config from used.nml differs from the checkpoint's"
pass "export of a checkpoint, a checkpoint root, --ema and final weights: the training bytes"

# forward on the export == forward on the original weights (a snapshot made of the same
# config.json and unet_final.safetensors)
mkdir -p "$TMP/orig/unet"
cp "$TMP/exp/unet/config.json" "$TMP/orig/unet/"
cp "$TMP/run/unet_final.safetensors" "$TMP/orig/unet/diffusion_pytorch_model.safetensors"
for s in orig exp; do
    run "fwd-$s" "$SDTOOL" forward --snapshot "$TMP/$s" --module unet --in "$golden" \
        --out "$TMP/fwd-$s.safetensors"
    expect_rc "fwd-$s" 0
done
cmp -s "$TMP/fwd-orig.safetensors" "$TMP/fwd-exp.safetensors" ||
    fail "forward on the export differs from the forward on the training weights"
pass "sdtool forward on the export equals the forward on the training weights"

# ---- a run from the tiny-sd2 snapshot: its unet config and parts, sampling from the export ---
# (mode 'process' wants a full CLIP vocabulary, which tiny-sd2 lacks: the U-Net trains on the
# shards above, whose latents and caption embeddings have the widths tiny-sd2's U-Net takes)
smodel="pretrained = '$snap', tokenizer = '$stok', resolution = 32"
nml strain.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/srun', seed = 11, device = 'cpu' /
&model $smodel, unet_init = 'pretrained' /
&data shard_dir = '$TMP/shards' /
&train max_steps = 2, batch_size_per_rank = 4, learning_rate = 1e-3 /
&sample prompts = 'a red square on a blue background', num_steps = 2, guidance_scale = 2.0 /
EOF2
mpi strain 1 "$SDTRAIN" "$TMP/strain.nml"
expect_rc strain 0
run sexp "$SDTOOL" export --from "$TMP/srun" --out "$TMP/sexp"
expect_rc sexp 0
cmp -s "$TMP/sexp/unet/config.json" "$snap/unet/config.json" || fail "pretrained: other unet config"
cmp -s "$TMP/sexp/unet/diffusion_pytorch_model.safetensors" "$TMP/srun/unet_final.safetensors" ||
    fail "pretrained: other weights"
for d in vae text_encoder; do
    diff -r "$snap/$d" "$TMP/sexp/$d" >/dev/null || fail "pretrained: $d not copied"
done
diff -r "$stok" "$TMP/sexp/tokenizer" >/dev/null || fail "pretrained: &model tokenizer not copied"
for k in '"vae"' '"text_encoder"' '"tokenizer"' '"scheduler"' '"PNDMScheduler"'; do
    grep -qF "$k" "$TMP/sexp/model_index.json" || fail "pretrained: $k not in model_index.json"
done
# sampling: the training output directory and the export give the same PNG bytes
for s in srun sexp; do
    mpi "sample-$s" 1 "$SDTRAIN" "$TMP/strain.nml" --set run.mode=sample \
        --set "run.output_dir='$TMP/samples-$s'" --set "sample.checkpoint='$TMP/$s'"
    expect_rc "sample-$s" 0
done
cmp -s "$TMP/samples-srun/samples/0-0.png" "$TMP/samples-sexp/samples/0-0.png" ||
    fail "sampling from the export differs from sampling from the training output"
pass "a run from a snapshot: its unet config, vae, text encoder, tokenizer; sampling from the export"

# the export as one original-layout checkpoint (sdtool single-file; the names and bytes are
# checked against diffusers' conversion by tests/unit/test_single_file)
run sf "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/sexp.safetensors"
expect_rc sf 0
expect_in sf out "text encoder 40 (60160, OpenCLIP names, q/k/v fused)"
[ -s "$TMP/sexp.safetensors" ] || fail "single-file: no file"
run sf-inspect "$SDTOOL" inspect "$TMP/sexp.safetensors"
expect_rc sf-inspect 0
expect_in sf-inspect out "$TMP/sexp.safetensors: safetensors, 500 tensors"
expect_in sf-inspect out "groups: cond_stage_model (40 tensors, 60160 elements), first_stage_model (156 tensors"
expect_in sf-inspect out "metadata sdtrain = written by sdtool single-file from the snapshot $TMP/sexp"
expect_in sf-inspect out "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight F32   96x32"
head -c 200 "$TMP/sexp.safetensors" >"$TMP/cut.safetensors"
run sf-cut "$SDTOOL" inspect "$TMP/cut.safetensors"
expect_rc sf-cut 1
expect_in sf-cut err "'$TMP/cut.safetensors' is neither an HDF5 nor a safetensors file"
run sf-again "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/sexp.safetensors"
expect_rc sf-again 2
expect_in sf-again err "already exists (give --force"
run sf-half "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/sexp.safetensors" --dtype F16 --force
expect_rc sf-half 0
expect_in sf-half out "(F16)"
run sf-dtype "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/y.safetensors" --dtype F64
expect_rc sf-dtype 2
expect_in sf-dtype err "--dtype F64: expected F32, F16 or BF16"
# --out inside the snapshot read (with --force, its own U-Net weights): refused, nothing changed
cp "$TMP/sexp/unet/diffusion_pytorch_model.safetensors" "$TMP/unet-before.safetensors"
run sf-inside "$SDTOOL" single-file --snapshot "$TMP/sexp" \
    --out "$TMP/sexp/unet/diffusion_pytorch_model.safetensors" --force
expect_rc sf-inside 2
expect_in sf-inside err "lies in the snapshot $TMP/sexp that it is written from"
cmp -s "$TMP/unet-before.safetensors" "$TMP/sexp/unet/diffusion_pytorch_model.safetensors" ||
    fail "single-file --force replaced the snapshot's own weights"
run sf-run "$SDTOOL" single-file --snapshot "$TMP/run" --out "$TMP/y.safetensors"
expect_rc sf-run 2
[ ! -e "$TMP/y.safetensors" ] || fail "single-file: a failed conversion left a file"
run sf-noargs "$SDTOOL" single-file --snapshot "$TMP/sexp"
expect_rc sf-noargs 2
expect_in sf-noargs err "--snapshot and --out are required"
run sf-bogus "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/y.safetensors" --bogus
expect_rc sf-bogus 2
expect_in sf-bogus err "unknown argument '--bogus' (see sdtool single-file --help)"
run imp-noval "$SDTOOL" import-single-file --file "$TMP/y.safetensors" --config
expect_rc imp-noval 2
expect_in imp-noval err "--config needs a value (see sdtool import-single-file --help)"
pass "sdtool single-file: the export in one file (F32, F16), errors with exit 2"

# and back: import-single-file with the export as the configuration; sampling from the imported
# snapshot gives the PNG bytes of sampling from the export
run sf32 "$SDTOOL" single-file --snapshot "$TMP/sexp" --out "$TMP/sexp32.safetensors"
expect_rc sf32 0
run imp "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" --config "$TMP/sexp" --out "$TMP/simp"
expect_rc imp 0
expect_in imp out "500 tensors of the file read"
mpi sample-simp 1 "$SDTRAIN" "$TMP/strain.nml" --set run.mode=sample \
    --set "run.output_dir='$TMP/samples-simp'" --set "sample.checkpoint='$TMP/simp'"
expect_rc sample-simp 0
cmp -s "$TMP/samples-simp/samples/0-0.png" "$TMP/samples-sexp/samples/0-0.png" ||
    fail "sampling from the imported single file differs from sampling from the export"
run imp-again "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" --config "$TMP/sexp" --out "$TMP/simp"
expect_rc imp-again 2
expect_in imp-again err "already exists (give --force"
run imp-ema "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" --config "$TMP/sexp" \
    --out "$TMP/simp2" --ema
expect_rc imp-ema 2
expect_in imp-ema err "no model_ema.* tensors"
run imp-wrong "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" \
    --config "$top_srcdir/tests/data/models/tiny-sd1" --out "$TMP/simp2"
expect_rc imp-wrong 2
expect_in imp-wrong err "does not fit the configuration of $top_srcdir/tests/data/models/tiny-sd1"
[ ! -e "$TMP/simp2" ] && [ ! -e "$TMP/simp2.tmp" ] || fail "a failed import left a folder"
# a configuration snapshot holding something that is neither a file nor a folder (a FIFO, which
# the copy's plain read waited on forever): refused by name, nothing left
cp -r "$TMP/sexp" "$TMP/fcfg"
mkfifo "$TMP/fcfg/tokenizer/pipe"
run imp-fifo timeout 60 "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" \
    --config "$TMP/fcfg" --out "$TMP/simp3"
expect_rc imp-fifo 2 # the input is at fault, not --out
expect_in imp-fifo err "cannot copy '$TMP/fcfg/tokenizer/pipe': not a regular file or a folder"
[ ! -e "$TMP/simp3" ] && [ ! -e "$TMP/simp3.tmp" ] || fail "a failed import (FIFO) left a folder"
# the storage failing the reads of a file of the configuration snapshot (EIO under the test
# shim): not the input's fault, so status 1 (a retry may succeed), said so, nothing left
if [ -f "$top_builddir/tests/mpi/eio_preload.so" ]; then
    need_eio_shim
    cp -r "$TMP/sexp" "$TMP/ecfg"
    run imp-eio env SD_EIO_PATH=/ecfg/tokenizer/ SD_EIO_ERRNO=5 LD_PRELOAD="$PRELOAD" \
        "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" --config "$TMP/ecfg" \
        --out "$TMP/simp4"
    expect_rc imp-eio 1
    expect_in imp-eio err "cannot read '$TMP/ecfg/tokenizer/"
    expect_in imp-eio err "(a storage error: a retry may succeed)"
    [ ! -e "$TMP/simp4" ] && [ ! -e "$TMP/simp4.tmp" ] || fail "a failed import (EIO) left a folder"
fi
# --out that holds the file or the configuration snapshot read: refused before anything is
# removed (with --force it replaced the folder, deleting the single file given)
cp "$TMP/sexp32.safetensors" "$TMP/simp/in.safetensors"
run imp-holds "$SDTOOL" import-single-file --file "$TMP/simp/in.safetensors" --config "$TMP/sexp" \
    --out "$TMP/simp" --force
expect_rc imp-holds 2
expect_in imp-holds err "--out $TMP/simp would replace --file $TMP/simp/in.safetensors"
[ -f "$TMP/simp/in.safetensors" ] || fail "import-single-file --force deleted its --file"
run imp-holds2 "$SDTOOL" import-single-file --file "$TMP/sexp32.safetensors" --config "$TMP/sexp" \
    --out "$TMP/sexp" --force
expect_rc imp-holds2 2
expect_in imp-holds2 err "--out $TMP/sexp would replace --config $TMP/sexp"
[ -f "$TMP/sexp/model_index.json" ] || fail "import-single-file --force replaced its --config"
pass "sdtool import-single-file: the file back as a snapshot that samples the same bytes; errors"

# export --single-file: the snapshot and, from it, the same tensors as sdtool single-file's
run exsf "$SDTOOL" export --from "$TMP/srun" --out "$TMP/sexp2" --single-file "$TMP/sexp2.safetensors"
expect_rc exsf 0
expect_in exsf out "and $TMP/sexp2.safetensors: one checkpoint in the original layout (304 + 156 + 40 tensors)"
run exsf-cmp "$top_builddir/tests/mpi/st_compare" "$TMP/sexp2.safetensors" "$TMP/sexp32.safetensors" 0
expect_rc exsf-cmp 0
run exsf-none "$SDTOOL" export --from "$TMP/run" --out "$TMP/x3" --single-file "$TMP/x3.safetensors"
expect_rc exsf-none 2
expect_in exsf-none err "--single-file $TMP/x3.safetensors needs the VAE and text encoder of a pretrained snapshot"
[ ! -e "$TMP/x3" ] && [ ! -e "$TMP/x3.safetensors" ] || fail "export --single-file without parts wrote something"
# the single file may not overwrite what the export reads (the run's weights, the snapshot)
cp "$TMP/srun/unet_final.safetensors" "$TMP/srun-unet-copy.safetensors"
run exsf-self "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/srun/used.nml" \
    --out "$TMP/x4" --single-file "$TMP/srun/unet_final.safetensors" --force
expect_rc exsf-self 2
expect_in exsf-self err "would overwrite $TMP/srun/unet_final.safetensors, which the export reads"
cmp -s "$TMP/srun/unet_final.safetensors" "$TMP/srun-unet-copy.safetensors" ||
    fail "export --single-file overwrote the run's weights"
pass "sdtool export --single-file: the tensors of sdtool single-file; refused without a VAE and text encoder"

# zero terminal SNR: the scheduler is written from &diffusion as DDIMScheduler (PNDMScheduler has
# no rescale_betas_zero_snr: diffusers would sample another schedule) with 'trailing' spacing,
# also over a pretrained snapshot's own scheduler; sampling from the export == from the run
mkdir -p "$TMP/zsnap/scheduler"
for part in unet vae text_encoder; do ln -s "$snap/$part" "$TMP/zsnap/$part"; done
sed 's/"unet": \[/"scheduler": ["diffusers", "PNDMScheduler"],\n "unet": [/' "$snap/model_index.json" \
    >"$TMP/zsnap/model_index.json"
printf '{"_class_name": "PNDMScheduler", "beta_schedule": "scaled_linear", "beta_start": 0.00085,
 "beta_end": 0.012, "skip_prk_steps": true, "steps_offset": 1}\n' >"$TMP/zsnap/scheduler/scheduler_config.json"
sed -e "s/prediction_type = 'epsilon'/prediction_type = 'v_prediction'/" \
    -e "s/rescale_betas_zero_snr = .false./rescale_betas_zero_snr = .true./" "$TMP/srun/used.nml" >"$TMP/zs.nml"
grep -q "rescale_betas_zero_snr = .true." "$TMP/zs.nml" || fail "used.nml: no rescale_betas_zero_snr"
run zexp "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/zs.nml" \
    --pretrained "$TMP/zsnap" --out "$TMP/zexp"
expect_rc zexp 0
expect_in zexp err "scheduler/ written from &diffusion (DDIMScheduler, rescale_betas_zero_snr, 'trailing'), not copied from $TMP/zsnap"
z="$TMP/zexp/scheduler/scheduler_config.json"
for k in '"_class_name": "DDIMScheduler"' '"rescale_betas_zero_snr": true' '"timestep_spacing": "trailing"' \
    '"prediction_type": "v_prediction"'; do
    grep -qF "$k" "$z" || fail "zero-SNR export: $k not in $z: $(cat "$z")"
done
grep -qF '"DDIMScheduler"' "$TMP/zexp/model_index.json" || fail "zero-SNR export: model_index.json"
mpi zs-run 1 "$SDTRAIN" "$TMP/zs.nml" --set run.mode=sample --set "run.output_dir='$TMP/zs-run'" \
    --set "sample.checkpoint='$TMP/srun'" --set sample.timestep_spacing=trailing
mpi zs-exp 1 "$SDTRAIN" "$TMP/zs.nml" --set run.mode=sample --set "run.output_dir='$TMP/zs-exp'" \
    --set "sample.checkpoint='$TMP/zexp'"
expect_rc zs-run 0
expect_rc zs-exp 0
expect_in zs-exp out "schedule from $TMP/zexp/scheduler/scheduler_config.json (v_prediction"
expect_in zs-exp out "zero terminal SNR"
cmp -s "$TMP/zs-run/samples/0-0.png" "$TMP/zs-exp/samples/0-0.png" ||
    fail "zero SNR: sampling from the export differs from sampling from the training output"
pass "zero terminal SNR: exported as DDIMScheduler with rescale_betas_zero_snr and 'trailing'; same samples"

# the schedule the run trained with over the snapshot's: a v-prediction fine-tune of an epsilon
# snapshot exports prediction_type v_prediction, the snapshot's class and other options kept;
# sampling from the export == from the run (an unreadable scheduler config: from &diffusion)
mkdir -p "$TMP/esnap/scheduler"
for part in unet vae text_encoder model_index.json; do ln -s "$TMP/zsnap/$part" "$TMP/esnap/$part"; done
printf '{"_class_name": "PNDMScheduler", "num_train_timesteps": 1000, "beta_start": 0.00085,
 "beta_end": 0.012, "beta_schedule": "scaled_linear", "set_alpha_to_one": false,
 "skip_prk_steps": true, "steps_offset": 1, "clip_sample": false, "prediction_type": "epsilon"}\n' \
    >"$TMP/esnap/scheduler/scheduler_config.json"
sed "s/prediction_type = 'epsilon'/prediction_type = 'v_prediction'/" "$TMP/srun/used.nml" >"$TMP/vs.nml"
run vexp "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/vs.nml" \
    --pretrained "$TMP/esnap" --out "$TMP/vexp"
expect_rc vexp 0
expect_in vexp err "copied from $TMP/esnap with the run's &diffusion for prediction_type"
v="$TMP/vexp/scheduler/scheduler_config.json"
for k in '"_class_name": "PNDMScheduler"' '"prediction_type": "v_prediction"' '"steps_offset": 1' \
    '"skip_prk_steps": true' '"beta_start": 0.00085'; do
    grep -qF "$k" "$v" || fail "v-prediction export: $k not in $v: $(cat "$v")"
done
mpi vs-run 1 "$SDTRAIN" "$TMP/vs.nml" --set run.mode=sample --set "run.output_dir='$TMP/vs-run'" \
    --set "sample.checkpoint='$TMP/srun'"
mpi vs-exp 1 "$SDTRAIN" "$TMP/vs.nml" --set run.mode=sample --set "run.output_dir='$TMP/vs-exp'" \
    --set "sample.checkpoint='$TMP/vexp'"
expect_rc vs-run 0
expect_rc vs-exp 0
expect_in vs-exp out "schedule from $v (v_prediction"
cmp -s "$TMP/vs-run/samples/0-0.png" "$TMP/vs-exp/samples/0-0.png" ||
    fail "v-prediction: sampling from the export differs from sampling from the training output"
rm "$TMP/esnap/scheduler/scheduler_config.json"
printf '{"_class_name": "PNDMScheduler", "steps_offset": 1,' >"$TMP/esnap/scheduler/scheduler_config.json"
run vexp2 "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/vs.nml" \
    --pretrained "$TMP/esnap" --out "$TMP/vexp2"
expect_rc vexp2 0
expect_in vexp2 err "scheduler/ written from &diffusion instead"
grep -qF '"prediction_type": "v_prediction"' "$TMP/vexp2/scheduler/scheduler_config.json" ||
    fail "an unreadable scheduler config: not written from &diffusion"
pass "the run's &diffusion over the snapshot's scheduler config (v_prediction from epsilon); same samples"

# &checkpoint dir elsewhere (read from used.nml) and no unet_final.safetensors: export and
# &sample checkpoint = <output_dir> both take its latest checkpoint
mkdir -p "$TMP/crun"
cp -r "$TMP/run/checkpoints" "$TMP/cdir"
sed "s|^  dir = ''|  dir = '$TMP/cdir'|" "$TMP/run/used.nml" >"$TMP/crun/used.nml"
grep -q "dir = '$TMP/cdir'" "$TMP/crun/used.nml" || fail "used.nml: no &checkpoint dir line"
run cexp "$SDTOOL" export --from "$TMP/crun" --out "$TMP/cexp"
expect_rc cexp 0
expect_in cexp out "of checkpoint $TMP/cdir/step-00000004"
for s in run crun; do
    mpi "csample-$s" 1 "$SDTRAIN" "$TMP/run/used.nml" --set run.mode=sample \
        --set "run.output_dir='$TMP/csample-$s'" --set "sample.checkpoint='$TMP/$s'" \
        --set "sample.prompts='a red square'" --set sample.num_steps=2
    expect_rc "csample-$s" 0
done
expect_in csample-crun out "U-Net $TMP/cdir/step-00000004 (parameters)"
cmp -s "$TMP/csample-run/samples/0-0.png" "$TMP/csample-crun/samples/0-0.png" ||
    fail "&checkpoint dir: sampling its checkpoint differs from sampling unet_final.safetensors"
rm -r "$TMP/cdir"
mpi csample-none 1 "$SDTRAIN" "$TMP/run/used.nml" --set run.mode=sample \
    --set "run.output_dir='$TMP/csample-none'" --set "sample.checkpoint='$TMP/crun'" \
    --set "sample.prompts='a red square'" --set sample.num_steps=2
expect_rc csample-none 2
expect_in csample-none err "&sample checkpoint = '$TMP/crun' is a training output directory with nothing to sample from"
pass "&checkpoint dir from used.nml: export and sampling take its checkpoint"

# ---- errors -----------------------------------------------------------------------------------
run exists "$SDTOOL" export --from "$TMP/run" --out "$TMP/exp"
expect_rc exists 2
expect_in exists err "$TMP/exp already exists (give --force"
run force "$SDTOOL" export --from "$TMP/run/checkpoints/step-00000002" --out "$TMP/exp" --force
expect_rc force 0
cmp -s "$TMP/exp/unet/diffusion_pytorch_model.safetensors" "$TMP/exp2/unet/diffusion_pytorch_model.safetensors" ||
    fail "--force did not replace the export"
# --out must not be the source or hold it (--force would delete the run); inside it is fine
# (scripts/demo.sh exports runs/demo into runs/demo/export)
run self "$SDTOOL" export --from "$TMP/run" --out "$TMP/run" --force
expect_rc self 2
expect_in self err "--out $TMP/run would replace the source $TMP/run"
run self2 "$SDTOOL" export --from "$TMP/run/checkpoints/step-00000002" --out "$TMP/./run/" --force
expect_rc self2 2
run self3 "$SDTOOL" export --from "$TMP/run/checkpoints/step-00000002" --out "$TMP/run/checkpoints/../checkpoints" --force
expect_rc self3 2
run self4 "$SDTOOL" export --from "$TMP/run/checkpoints" --out "$TMP/run/checkpoints/step-00000004.tmp/.." --force
expect_rc self4 2
run inside "$SDTOOL" export --from "$TMP/run" --out "$TMP/run/export"
expect_rc inside 0
[ -s "$TMP/run/export/unet/diffusion_pytorch_model.safetensors" ] || fail "inside: no export in the run's folder"
ln -s "$TMP/run" "$TMP/runlink"
run self5 "$SDTOOL" export --from "$TMP/runlink/unet_final.safetensors" --out "$TMP/run" --force
expect_rc self5 2
run self6 "$SDTOOL" export --from "$TMP/srun" --pretrained "$TMP/zsnap" --out "$TMP/zsnap" --force
expect_rc self6 2
expect_in self6 err "--out $TMP/zsnap would replace the pretrained snapshot $TMP/zsnap"
[ -s "$TMP/run/unet_final.safetensors" ] && [ -f "$TMP/run/checkpoints/latest" ] &&
    [ -f "$TMP/run/checkpoints/step-00000002/state.h5" ] && [ -d "$TMP/zsnap/scheduler" ] ||
    fail "an export over its source removed or wrote something"
run missing "$SDTOOL" export --from "$TMP/nowhere" --out "$TMP/x"
expect_rc missing 2
expect_in missing err "--from $TMP/nowhere: no such file or directory"
mkdir -p "$TMP/empty"
run empty "$SDTOOL" export --from "$TMP/empty" --out "$TMP/x"
expect_rc empty 2
expect_in empty err "not a checkpoint directory"
run usage "$SDTOOL" export --from "$TMP/run"
expect_rc usage 2
expect_in usage err "--from and --out are required"
# a flipped byte in the parameters: the checksum names file and dataset
mkdir -p "$TMP/bad"
cp -r "$TMP/run/checkpoints/step-00000004" "$TMP/bad/"
h5="$TMP/bad/step-00000004/state.h5"
if command -v h5dump >/dev/null 2>&1; then
    off=$(h5dump -p -H -d params "$h5" | sed -n 's/^ *OFFSET \([0-9]*\).*/\1/p')
    off=$((off + 1001))
else
    off=$(($(wc -c <"$h5") / 8))
fi
byte=$(od -An -tu1 -j "$off" -N1 "$h5" | tr -d ' ')
printf "\\$(printf %03o $(((byte + 1) % 256)))" | dd of="$h5" bs=1 seek="$off" conv=notrunc 2>/dev/null
run corrupt "$SDTOOL" export --from "$TMP/bad/step-00000004" --out "$TMP/x"
expect_rc corrupt 2
expect_in corrupt err "fails its checksum"
expect_in corrupt err "$h5"
# another model's configuration: the parameter table does not match (names the checkpoint)
sed 's/block_out_channels = 16, 32/block_out_channels = 32, 32/' "$TMP/run/used.nml" >"$TMP/other.nml"
run shape "$SDTOOL" export --from "$TMP/run/checkpoints/step-00000004" --out "$TMP/x" --nml "$TMP/other.nml"
expect_rc shape 2
expect_in shape err "$TMP/run/checkpoints/step-00000004"
expect_in shape err "different"
run shape2 "$SDTOOL" export --from "$TMP/final/unet_final.safetensors" --out "$TMP/x" --nml "$TMP/other.nml"
expect_rc shape2 2
expect_in shape2 err "unet_final.safetensors"
# no EMA in a weight-file directory without unet_ema.safetensors
rm "$TMP/final/unet_ema.safetensors"
run noema "$SDTOOL" export --from "$TMP/final" --out "$TMP/x" --ema
expect_rc noema 2
expect_in noema err "unet_ema.safetensors"
# a snapshot run whose snapshot moved away: --pretrained supplies it
sed "s|$snap|$TMP/moved|" "$TMP/srun/used.nml" >"$TMP/moved.nml"
run moved "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/moved.nml" --out "$TMP/x"
expect_rc moved 2
expect_in moved err "give the snapshot with --pretrained"
run moved2 "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/moved.nml" \
    --pretrained "$snap" --out "$TMP/x"
expect_rc moved2 0
# a part of the snapshot that cannot be copied (a FIFO): the input is at fault, not --out:
# exit 2 naming it, nothing left
cp -r "$snap" "$TMP/fsnap"
mkfifo "$TMP/fsnap/vae/pipe"
run fsnap timeout 60 "$SDTOOL" export --from "$TMP/srun/unet_final.safetensors" --nml "$TMP/moved.nml" \
    --pretrained "$TMP/fsnap" --out "$TMP/fx"
expect_rc fsnap 2
expect_in fsnap err "cannot copy '$TMP/fsnap/vae/pipe': not a regular file or a folder"
[ ! -e "$TMP/fx" ] && [ ! -e "$TMP/fx.tmp" ] || fail "a failed export (FIFO) left a folder"
[ ! -e "$TMP/x.tmp" ] || fail "a failed export left x.tmp"
chmod 555 "$TMP/empty"
if ! touch "$TMP/empty/probe" 2>/dev/null; then
    run ro "$SDTOOL" export --from "$TMP/run" --out "$TMP/empty/x"
    expect_rc ro 1
    expect_in ro err "$TMP/empty/x.tmp"
fi
chmod 755 "$TMP/empty"
pass "export errors: exit 2 naming the file, exit 1 when DIR cannot be written"
