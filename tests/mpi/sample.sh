#!/bin/sh
# mode = 'sample' end to end on the tiny-sd2 snapshot (with the tiny tokenizer of
# tests/data/sample): the same PNG bytes at -np 1 and -np 2, one samples.jsonl line per image,
# a training output directory (unet_final.safetensors) as &sample checkpoint, use_ema without
# EMA weights refused, invalid UTF-8 of a prompt as U+FFFD in samples.jsonl, and bad set-ups
# (no prompts, a missing snapshot or snapshot part, a tokenizer that does not fit the text
# encoder) end every rank with exit 2 and one clear message.
. "$top_srcdir/tests/lib.sh"
need_mpi

snap="$top_srcdir/tests/data/models/tiny-sd2"

# sample_nml NAME SCHEDULER [EXTRA &sample KEYS]: tiny_sample_nml on the CPU
sample_nml() { tiny_sample_nml "$1" "$2" "${3:-}"; }
same_pngs() { # same_pngs A B WHAT: runs A and B wrote the same 6 PNG files, byte for byte
    for p in 0 1 2; do
        for j in 0 1; do
            cmp -s "$TMP/$1/samples/$p-$j.png" "$TMP/$2/samples/$p-$j.png" || fail "$3: $p-$j.png differs"
        done
    done
}

for sched in ddim pndm ddpm euler euler_a heun lms dpm2 dpm2_a dpmpp_2m dpmpp_2m_sde dpmpp_sde unipc; do
    sample_nml "${sched}1" "$sched"
    mpi "${sched}1" 1 "$SDTRAIN" "$TMP/${sched}1.nml"
    expect_rc "${sched}1" 0
    sample_nml "${sched}2" "$sched"
    mpi "${sched}2" 2 "$SDTRAIN" "$TMP/${sched}2.nml"
    expect_rc "${sched}2" 0
    for p in 0 1 2; do
        for j in 0 1; do
            f="samples/$p-$j.png"
            [ -s "$TMP/${sched}1/$f" ] || fail "$sched: $f missing"
            cmp -s "$TMP/${sched}1/$f" "$TMP/${sched}2/$f" || fail "$sched: $f differs between -np 1 and -np 2"
        done
    done
    cmp -s "$TMP/${sched}1/samples/0-0.png" "$TMP/${sched}1/samples/0-1.png" &&
        fail "$sched: two images of one prompt are identical (same noise?)"
    [ "$(wc -l <"$TMP/${sched}1/samples.jsonl")" = 6 ] || fail "$sched: samples.jsonl has not 6 lines"
    cmp -s "$TMP/${sched}1/samples.jsonl" "$TMP/${sched}2/samples.jsonl" || fail "$sched: samples.jsonl differs"
    expect_in "${sched}1" out "wrote 6 image(s)"
    [ -f "$TMP/${sched}1/used.nml" ] || fail "$sched: used.nml missing"
done
line=$(sed -n 5p "$TMP/ddim1/samples.jsonl")
want='{"prompt_index": 2, "image_index": 0, "prompt": "x \"quoted\" \\ back", "seed": 7, "steps": 3, "scheduler": "ddim", "timestep_spacing": "leading", "guidance_scale": 7.5, "width": 16, "height": 16, "file": "samples/2-0.png"}'
[ "$line" = "$want" ] || fail "samples.jsonl line 5: $line"
# Euler ancestral is DDPM's ancestral step written in sigma space (sigma_up^2 is the posterior
# variance over abar_prev): with the same noise the same images, up to rounding
run ddpmeula "$top_builddir/tests/mpi/png_compare" "$TMP/ddpm1/samples/0-0.png" "$TMP/euler_a1/samples/0-0.png" 1
expect_rc ddpmeula 0
for a in ddim pndm ddpm euler euler_a heun dpmpp_2m dpmpp_2m_sde unipc; do
    for b in ddim pndm ddpm euler euler_a heun dpmpp_2m dpmpp_2m_sde unipc; do
        [ "$a" \< "$b" ] && [ "$a$b" != ddpmeuler_a ] || continue
        cmp -s "$TMP/${a}1/samples/0-0.png" "$TMP/${b}1/samples/0-0.png" && fail "$a and $b gave the same image"
    done
done
expect_in euler1 out "with euler, 3 steps (3 U-Net calls per image, 'leading' spacing)"
expect_in heun1 out "with heun, 3 steps (5 U-Net calls per image, 'leading' spacing)"
# tests/mpi/png_compare (tests/gpu/sample.sh compares GPU and CPU images with it): the same
# image is within 0 levels, the two schedulers' are not
run pngsame "$top_builddir/tests/mpi/png_compare" "$TMP/ddim1/samples/0-0.png" "$TMP/ddim2/samples/0-0.png" 0
expect_rc pngsame 0
expect_in pngsame out "largest difference 0, mean 0.000"
run pngother "$top_builddir/tests/mpi/png_compare" "$TMP/ddim1/samples/0-0.png" "$TMP/pndm1/samples/0-0.png" 0
expect_rc pngother 1
pass "ddim, pndm, ddpm, euler, euler_a, heun, lms, dpm2, dpm2_a, dpmpp_2m, dpmpp_2m_sde, dpmpp_sde, unipc: same PNG bytes at -np 1 and 2, samples.jsonl"

# A rerun keeps the images of the same settings (&sample resume = 'auto'): a job that ended
# during its images (here: one image gone, one cut short as a node crash can leave it, a
# temporary file of a write that never finished, no samples.jsonl) makes only the batches that
# are not whole, and ends with the bytes of an uninterrupted run. Batches of 2 on one rank:
# {0-0, 0-1}, {1-0, 1-1}, {2-0, 2-1}
ino() { stat -c %i "$TMP/res/samples/$1.png"; }
sample_nml res ddim ", batch_size = 2"
mpi res 1 "$SDTRAIN" "$TMP/res.nml"
expect_rc res 0
[ -s "$TMP/res/samples.settings" ] || fail "resume: no samples.settings"
grep -qF "  guidance_scale = 7.5" "$TMP/res/samples.settings" || fail "resume: samples.settings lacks guidance_scale"
grep -qF "output_dir" "$TMP/res/samples.settings" && fail "resume: samples.settings holds output_dir"
same_pngs ddim1 res "resume: the first run"
i00=$(ino 0-0) i10=$(ino 1-0) i20=$(ino 2-0)
rm "$TMP/res/samples/1-1.png" "$TMP/res/samples.jsonl"
head -c 100 "$TMP/res/samples/2-1.png" >"$TMP/cut.png" && mv "$TMP/cut.png" "$TMP/res/samples/2-1.png"
echo partial >"$TMP/res/samples/0-0.png.tmp4242"
echo "kept by the user" >"$TMP/res/samples/notes.txt"
mpi res 1 "$SDTRAIN" "$TMP/res.nml"
expect_rc res 0
expect_in res out "kept 2 of the 6 image(s) from the run before"
expect_in res out "wrote 4 image(s)"
same_pngs ddim1 res "resume: after the rerun"
cmp -s "$TMP/ddim1/samples.jsonl" "$TMP/res/samples.jsonl" || fail "resume: samples.jsonl differs"
[ "$(ino 0-0)" = "$i00" ] || fail "resume: the whole batch {0-0, 0-1} was written again"
[ "$(ino 1-0)" != "$i10" ] && [ "$(ino 2-0)" != "$i20" ] ||
    fail "resume: a batch with a missing or cut image was not made again"
[ ! -e "$TMP/res/samples/0-0.png.tmp4242" ] || fail "resume: the temporary file is left"
[ -f "$TMP/res/samples/notes.txt" ] || fail "resume: a file of the user's was removed"
# other settings: the images there are removed first (the message names the first difference),
# then all made; the same again for the way back
mpi res 1 "$SDTRAIN" "$TMP/res.nml" --set sample.guidance_scale=3.0
expect_rc res 0
expect_in res out "removed the 6 image(s) in $TMP/res/samples: other settings than those of the images there (first difference: '  guidance_scale = 3.0')"
expect_in res out "wrote 6 image(s)"
cmp -s "$TMP/ddim1/samples/0-0.png" "$TMP/res/samples/0-0.png" && fail "resume: guidance 3 gave the image of 7.5"
mpi res 1 "$SDTRAIN" "$TMP/res.nml"
expect_rc res 0
expect_in res out "(first difference: '  guidance_scale = 7.5')"
same_pngs ddim1 res "resume: back to the first settings"
# other prompts (the same count) are other settings too
mpi resp 1 "$SDTRAIN" "$TMP/res.nml" --set "sample.prompts='a photo of the dog', 'red car at the sea', 'x'"
expect_rc resp 0
expect_in resp out "removed the 6 image(s)"
expect_in resp out "(first difference: 'prompts: 3, fnv1a64 "
# &sample resume = 'never': every image made again, also with the same settings
mpi res 1 "$SDTRAIN" "$TMP/res.nml"
expect_rc res 0
mpi resn 1 "$SDTRAIN" "$TMP/res.nml" --set "sample.resume='never'"
expect_rc resn 0
expect_in resn out "removed the 6 image(s) in $TMP/res/samples: &sample resume = 'never'"
expect_in resn out "wrote 6 image(s)"
expect_not_in resn out "kept"
same_pngs ddim1 res "resume: never"
# a rerun on 2 ranks with all images there: nothing made
mpi resall 2 "$SDTRAIN" "$TMP/res.nml"
expect_rc resall 0
expect_in resall out "kept 6 of the 6 image(s) from the run before"
expect_in resall out "wrote 0 image(s)"
pass "a rerun keeps the images of the same settings (a missing, a cut one made again with their batch), removes those of others"
# SIGUSR1 (Slurm's warning before the time limit; here SDTRAIN_FAULT makes rank 1 send it to
# itself once image 3 is written): rank 1 stops before its next batch, rank 0 makes all of its
# images, the job ends with status 0 and no samples.jsonl; the rerun keeps the 5 images and
# makes the sixth: the bytes of the uninterrupted run
sample_nml sig ddim
SDTRAIN_FAULT=usr1:rank=1:step=3 mpi sig 2 "$SDTRAIN" "$TMP/sig.nml"
expect_rc sig 0
expect_in sig out "stopped for SIGUSR1: 5 of the 6 image(s) are in $TMP/sig/samples (5 made now, 0 kept), and a rerun with the same settings goes on from them"
[ ! -e "$TMP/sig/samples.jsonl" ] || fail "sig: samples.jsonl written although an image is missing"
[ ! -e "$TMP/sig/samples/2-1.png" ] || fail "sig: rank 1 made image 5 after SIGUSR1"
mpi sig 2 "$SDTRAIN" "$TMP/sig.nml"
expect_rc sig 0
expect_in sig out "kept 5 of the 6 image(s) from the run before"
expect_in sig out "wrote 1 image(s)"
same_pngs ddim1 sig "SIGUSR1, then the rerun"
cmp -s "$TMP/ddim1/samples.jsonl" "$TMP/sig/samples.jsonl" || fail "sig: samples.jsonl differs"
pass "SIGUSR1 stops mode 'sample' at a batch boundary with status 0; the rerun makes the rest, the same bytes"

# several images per U-Net call (&sample batch_size): the CPU's U-Net is batch-invariant, so the
# same bytes; 6 images as 4 + 2 on one rank, and as 2 + 1 on each of two ranks (the last batch
# smaller: the scheduler is remade for it); DDPM and Euler ancestral draw their noise per image
for sched in ddim pndm ddpm euler euler_a heun dpmpp_2m dpmpp_2m_sde unipc; do
    sample_nml "${sched}b4" "$sched" ", batch_size = 4"
    mpi "${sched}b4" 1 "$SDTRAIN" "$TMP/${sched}b4.nml"
    expect_rc "${sched}b4" 0
    expect_in "${sched}b4" out "4 image(s) per denoising call (&sample batch_size 4): a U-Net batch of 8"
    sample_nml "${sched}b2" "$sched" ", batch_size = 2"
    mpi "${sched}b2" 2 "$SDTRAIN" "$TMP/${sched}b2.nml"
    expect_rc "${sched}b2" 0
    same_pngs "${sched}1" "${sched}b4" "$sched, batch_size 4"
    same_pngs "${sched}1" "${sched}b2" "$sched, batch_size 2 at -np 2"
done
expect_in ddim1 out "1 image(s) per denoising call (&sample batch_size 0: 1 on the CPU): a U-Net batch of 2; 1 per VAE decode call"
expect_in ddimb4 out "a U-Net batch of 8; 1 per VAE decode call"
pass "batch_size 4 and 2: the same PNG bytes as one image at a time"

# several images per VAE decode (&sample decode_batch_size, at most batch_size): the same bytes;
# 4 + 2 images denoised, decoded as 3 + 1 and 2
sample_nml ddimd3 ddim ", batch_size = 4, decode_batch_size = 3"
mpi ddimd3 1 "$SDTRAIN" "$TMP/ddimd3.nml"
expect_rc ddimd3 0
expect_in ddimd3 out "a U-Net batch of 8; 3 per VAE decode call"
mpi ddimd9 1 "$SDTRAIN" "$TMP/ddimd3.nml" --set sample.decode_batch_size=9 --set run.output_dir="'$TMP/ddimd9'"
expect_rc ddimd9 0
expect_in ddimd9 out "a U-Net batch of 8; 4 per VAE decode call"
same_pngs ddim1 ddimd3 "decode_batch_size 3"
same_pngs ddim1 ddimd9 "decode_batch_size 9 (4)"
pass "decode_batch_size 3 and 9 (capped at 4): the same PNG bytes as one image at a time"

# guidance 1: no unconditional pass, and a different image
sample_nml g1 ddim
mpi g1 2 "$SDTRAIN" "$TMP/g1.nml" --set sample.guidance_scale=1.0
expect_rc g1 0
expect_in g1 out "(no unconditional pass)"
mpi g1b3 1 "$SDTRAIN" "$TMP/g1.nml" --set sample.guidance_scale=1.0 --set sample.batch_size=3 \
    --set run.output_dir="'$TMP/g1b3'"
expect_rc g1b3 0
expect_in g1b3 out "a U-Net batch of 3"
for f in 0-0 1-1 2-1; do
    cmp -s "$TMP/g1b3/samples/$f.png" "$TMP/g1/samples/$f.png" || fail "guidance 1, batch 3: $f differs"
done
cmp -s "$TMP/g1/samples/0-0.png" "$TMP/ddim1/samples/0-0.png" && fail "guidance 1 gave the guided image"
pass "guidance_scale 1 skips the unconditional pass"

# negative prompts (diffusers' negative_prompt): the unconditional half of the guided batch is
# conditioned on them instead of on "". An explicit '' is the default. Each prompt as its own
# negative makes the two halves equal, so guidance changes nothing: the images of guidance 1
# (which makes no unconditional pass; the CPU's U-Net is batch-invariant), also with 2 images a
# call. One negative for every prompt == that string once per prompt; a real negative changes
# the images and is recorded in samples.jsonl; with guidance 1 it is unused, with a warning.
sample_nml negempty ddim ", negative_prompts = ''"
mpi negempty 2 "$SDTRAIN" "$TMP/negempty.nml"
expect_rc negempty 0
same_pngs negempty ddim1 "negative_prompts = '' vs none"
sample_nml negself ddim ", negative_prompts = 'a photo of the cat', 'red car at the sea', 'x \"quoted\" \\ back'"
mpi negself 2 "$SDTRAIN" "$TMP/negself.nml"
expect_rc negself 0
same_pngs negself g1 "each prompt as its own negative vs guidance 1"
mpi negselfb2 1 "$SDTRAIN" "$TMP/negself.nml" --set sample.batch_size=2 --set run.output_dir="'$TMP/negselfb2'"
expect_rc negselfb2 0
same_pngs negselfb2 g1 "each prompt as its own negative, 2 images a call, vs guidance 1"
sample_nml negone ddim ", negative_prompts = 'blurry, low quality'"
mpi negone 1 "$SDTRAIN" "$TMP/negone.nml"
expect_rc negone 0
sample_nml negall ddim ", negative_prompts = 'blurry, low quality', 'blurry, low quality', 'blurry, low quality'"
mpi negall 2 "$SDTRAIN" "$TMP/negall.nml"
expect_rc negall 0
same_pngs negone negall "one negative for every prompt vs the same one per prompt"
cmp -s "$TMP/negone/samples/0-0.png" "$TMP/ddim1/samples/0-0.png" && fail "a negative prompt changed nothing"
grep -q '"prompt": "red car at the sea", "negative_prompt": "blurry, low quality", "seed"' "$TMP/negone/samples.jsonl" ||
    fail "samples.jsonl does not record the negative prompt: $(sed -n 3p "$TMP/negone/samples.jsonl")"
grep -q negative_prompt "$TMP/ddim1/samples.jsonl" && fail "samples.jsonl names a negative prompt that was not given"
mpi negg1 1 "$SDTRAIN" "$TMP/negone.nml" --set sample.guidance_scale=1.0 --set run.output_dir="'$TMP/negg1'"
expect_rc negg1 0
expect_in negg1 err "negative_prompts are not used: guidance_scale 1 <= 1"
same_pngs negg1 g1 "a negative prompt with guidance 1 (unused)"
sample_nml negtwo ddim ", negative_prompts = 'a', 'b'"
mpi negtwo 2 "$SDTRAIN" "$TMP/negtwo.nml"
expect_rc negtwo 2
expect_count negtwo err "&sample negative_prompts has 2 entries for 3 prompts: give one (for every prompt) or one per prompt" 1
expect_in negtwo err "negtwo.nml:"
pass "negative prompts"

# a training output directory: unet_final.safetensors (diffusers names) + &model pretrained for
# the U-Net config, VAE, text encoder and tokenizer; the same weights give the same bytes
mkdir -p "$TMP/trainout"
cp "$snap/unet/diffusion_pytorch_model.safetensors" "$TMP/trainout/unet_final.safetensors"
sample_nml ckpt ddim ", checkpoint = '$TMP/trainout'"
mpi ckpt 2 "$SDTRAIN" "$TMP/ckpt.nml"
expect_rc ckpt 0
expect_in ckpt out "U-Net $TMP/trainout/unet_final.safetensors"
for f in 0-0 1-1 2-1; do
    cmp -s "$TMP/ckpt/samples/$f.png" "$TMP/ddim1/samples/$f.png" || fail "checkpoint dir: $f differs"
done
# &sample use_ema where the source has no EMA weights: an error naming it, not the parameters
sample_nml noema1 ddim ", checkpoint = '$TMP/trainout/unet_final.safetensors', use_ema = .true."
mpi noema1 2 "$SDTRAIN" "$TMP/noema1.nml"
expect_rc noema1 2
expect_count noema1 err "checkpoint = '$TMP/trainout/unet_final.safetensors' is a U-Net .safetensors file, which has no EMA weights" 1
sample_nml noema2 ddim ", use_ema = .true."
mpi noema2 1 "$SDTRAIN" "$TMP/noema2.nml"
expect_rc noema2 2
expect_in noema2 err "the U-Net comes from &model pretrained = '$snap', a diffusers snapshot, which has no EMA weights"
sample_nml noema3 ddim ", checkpoint = '$TMP/trainout', use_ema = .true."
mpi noema3 1 "$SDTRAIN" "$TMP/noema3.nml"
expect_rc noema3 2
expect_in noema3 err "checkpoint = '$TMP/trainout' is a training output directory without EMA weights"
[ ! -e "$TMP/noema1/samples" ] && [ ! -e "$TMP/noema3/samples" ] || fail "use_ema without EMA: images written"
pass "a training output directory as &sample checkpoint; use_ema where there is no EMA"

# a snapshot with scheduler/scheduler_config.json: SD2's values sample exactly as the built-in
# defaults; the file's prediction_type is used; what is not implemented is refused by name
# sched_snap NAME JSON-BODY: a snapshot of links to tiny-sd2 plus that scheduler config
sched_snap() {
    mkdir -p "$TMP/$1/scheduler"
    for part in unet vae text_encoder model_index.json; do ln -sf "$snap/$part" "$TMP/$1/$part"; done
    printf '{"_class_name": "PNDMScheduler", "num_train_timesteps": 1000, "beta_start": 0.00085,
 "beta_end": 0.012, "beta_schedule": "scaled_linear", "set_alpha_to_one": false,
 "skip_prk_steps": true, "steps_offset": 1, "clip_sample": false %s}\n' "$2" \
        >"$TMP/$1/scheduler/scheduler_config.json"
}
sched_snap snap-sd2 ""
sample_nml schedcfg ddim ", checkpoint = '$TMP/snap-sd2'"
mpi schedcfg 1 "$SDTRAIN" "$TMP/schedcfg.nml"
expect_rc schedcfg 0
expect_in schedcfg out "schedule from $TMP/snap-sd2/scheduler/scheduler_config.json (epsilon, scaled_linear"
cmp -s "$TMP/schedcfg/samples/1-0.png" "$TMP/ddim1/samples/1-0.png" || fail "SD2 scheduler config: other image"
sched_snap snap-v ', "prediction_type": "v_prediction"'
sample_nml schedv ddim ", checkpoint = '$TMP/snap-v'"
mpi schedv 1 "$SDTRAIN" "$TMP/schedv.nml"
expect_rc schedv 0
expect_in schedv out "(v_prediction, scaled_linear"
cmp -s "$TMP/schedv/samples/1-0.png" "$TMP/ddim1/samples/1-0.png" && fail "v_prediction config ignored"
# the file's timestep_spacing, or &sample timestep_spacing over it: the same bytes either way
sched_snap snap-trailing ', "timestep_spacing": "trailing"'
sample_nml schedt ddim ", checkpoint = '$TMP/snap-trailing'"
mpi schedt 2 "$SDTRAIN" "$TMP/schedt.nml"
expect_rc schedt 0
expect_in schedt out "'trailing' spacing"
cmp -s "$TMP/schedt/samples/1-0.png" "$TMP/ddim1/samples/1-0.png" && fail "trailing spacing ignored"
sample_nml schedt2 ddim ", checkpoint = '$TMP/snap-sd2', timestep_spacing = 'trailing'"
mpi schedt2 1 "$SDTRAIN" "$TMP/schedt2.nml"
expect_rc schedt2 0
same_pngs schedt schedt2 "trailing from the file vs &sample timestep_spacing"
grep -q '"timestep_spacing": "trailing"' "$TMP/schedt2/samples.jsonl" || fail "samples.jsonl: spacing not recorded"
# without the key a class's own default: linspace for euler (EulerDiscreteScheduler.from_config)
sample_nml schede euler ", checkpoint = '$TMP/snap-sd2'"
mpi schede 1 "$SDTRAIN" "$TMP/schede.nml"
expect_rc schede 0
expect_in schede out "'linspace' spacing"
cmp -s "$TMP/schede/samples/1-0.png" "$TMP/euler1/samples/1-0.png" && fail "euler: linspace gave leading's image"
mpi schedel 1 "$SDTRAIN" "$TMP/schede.nml" --set sample.timestep_spacing=leading --set run.output_dir="'$TMP/schedel'"
expect_rc schedel 0
cmp -s "$TMP/schedel/samples/1-0.png" "$TMP/euler1/samples/1-0.png" || fail "euler, leading: other image than without a config"
# StableDiffusionPipeline sets steps_offset 1 and clip_sample false whatever the file says
sched_snap snap-old '' 
sed -i 's/"steps_offset": 1, "clip_sample": false/"steps_offset": 0/' "$TMP/snap-old/scheduler/scheduler_config.json"
sample_nml schedold ddim ", checkpoint = '$TMP/snap-old'"
mpi schedold 1 "$SDTRAIN" "$TMP/schedold.nml"
expect_rc schedold 0
expect_in schedold out "as StableDiffusionPipeline: steps_offset 1 (the file: 0), clip_sample false"
same_pngs schedold ddim1 "an outdated scheduler config (steps_offset 0, clip_sample unset)"
# beta sigmas from the file, or from &sample use_beta_sigmas: the same bytes, not the plain ones
sched_snap snap-beta ', "use_beta_sigmas": true'
sample_nml schedb dpmpp_2m ", checkpoint = '$TMP/snap-beta'"
mpi schedb 2 "$SDTRAIN" "$TMP/schedb.nml"
expect_rc schedb 0
expect_in schedb out ", beta sigmas"
cmp -s "$TMP/schedb/samples/1-0.png" "$TMP/dpmpp_2m1/samples/1-0.png" && fail "beta sigmas changed nothing"
sample_nml schedb2 dpmpp_2m ", checkpoint = '$TMP/snap-sd2', use_beta_sigmas = .true."
mpi schedb2 1 "$SDTRAIN" "$TMP/schedb2.nml"
expect_rc schedb2 0
cmp -s "$TMP/schedb/samples/1-0.png" "$TMP/schedb2/samples/1-0.png" ||
    fail "beta sigmas: the file's and the namelist's give other images"
# PNDM's Runge-Kutta warm-up (skip_prk_steps false, PNDMScheduler's default): 5 steps are
# 14 U-Net calls; other images than PLMS's; fewer than 4 steps refused by name
sched_snap snap-prk ', "skip_prk_steps": false'
sample_nml schedprk pndm ", checkpoint = '$TMP/snap-prk'"
mpi schedprk 2 "$SDTRAIN" "$TMP/schedprk.nml" --set sample.num_steps=5
expect_rc schedprk 0
expect_in schedprk out "5 steps (14 U-Net calls per image"
expect_in schedprk out "Runge-Kutta warm-up (skip_prk_steps false)"
sample_nml schedplms pndm ", checkpoint = '$TMP/snap-sd2'"
mpi schedplms 1 "$SDTRAIN" "$TMP/schedplms.nml" --set sample.num_steps=5
expect_rc schedplms 0
cmp -s "$TMP/schedprk/samples/1-0.png" "$TMP/schedplms/samples/1-0.png" && fail "the warm-up changed nothing"
sample_nml schedprk3 pndm ", checkpoint = '$TMP/snap-prk'"
mpi schedprk3 1 "$SDTRAIN" "$TMP/schedprk3.nml"
expect_rc schedprk3 2
expect_in schedprk3 err "needs at least 4 steps"
# two sigma schedules at once, and what is not implemented, are refused by name
sched_snap snap-beta2 ', "use_beta_sigmas": true, "use_karras_sigmas": true'
sample_nml schedx dpmpp_2m ", checkpoint = '$TMP/snap-beta2'"
mpi schedx 2 "$SDTRAIN" "$TMP/schedx.nml"
expect_rc schedx 2
expect_count schedx err "$TMP/snap-beta2/scheduler/scheduler_config.json: more than one of use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas is set" 1
sample_nml schedx2 euler ", checkpoint = '$TMP/snap-sd2', use_beta_sigmas = .true., use_exponential_sigmas = .true."
mpi schedx2 1 "$SDTRAIN" "$TMP/schedx2.nml"
expect_rc schedx2 2
expect_in schedx2 err "more than one of use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas is .true."
sched_snap snap-order ', "solver_order": 4'
sample_nml schedo dpmpp_2m ", checkpoint = '$TMP/snap-order'"
mpi schedo 1 "$SDTRAIN" "$TMP/schedo.nml"
expect_rc schedo 2
expect_count schedo err "solver_order 4 is not implemented for 'dpmpp_2m' (1 to 3)" 1
# DPMSolverMultistep's other options from the file: each one changes the images
sched_snap snap-dpmopts ', "solver_type": "heun", "final_sigmas_type": "sigma_min", "solver_order": 1'
sample_nml dpmopts dpmpp_2m ", checkpoint = '$TMP/snap-dpmopts'"
mpi dpmopts 2 "$SDTRAIN" "$TMP/dpmopts.nml"
expect_rc dpmopts 0
expect_in dpmopts out "final sigma_min, solver_order 1, heun)"
cmp -s "$TMP/dpmopts/samples/1-0.png" "$TMP/dpmpp_2m1/samples/1-0.png" && fail "DPM-Solver++ options ignored"
sched_snap snap-bhx ', "solver_type": "bh3"'
sample_nml schedbhx unipc ", checkpoint = '$TMP/snap-bhx'"
mpi schedbhx 1 "$SDTRAIN" "$TMP/schedbhx.nml"
expect_rc schedbhx 2
expect_count schedbhx err "solver_type 'bh3' is not implemented for 'unipc' (bh1 or bh2)" 1
sched_snap snap-badsp ', "timestep_spacing": "quadratic"'
sample_nml schedb ddim ", checkpoint = '$TMP/snap-badsp'"
mpi schedb 1 "$SDTRAIN" "$TMP/schedb.nml"
expect_rc schedb 2
expect_count schedb err "timestep_spacing 'quadratic' is not one of leading, trailing, linspace" 1
sched_snap snap-t0 ''
sed -i 's/"num_train_timesteps": 1000/"num_train_timesteps": 0/' "$TMP/snap-t0/scheduler/scheduler_config.json"
sample_nml schedt0 ddim ", checkpoint = '$TMP/snap-t0'"
mpi schedt0 2 "$SDTRAIN" "$TMP/schedt0.nml"
expect_rc schedt0 2
expect_count schedt0 err "$TMP/snap-t0/scheduler/scheduler_config.json: diffusion: num_train_timesteps 0 out of" 1
pass "scheduler_config.json of a snapshot"

# zero terminal SNR (rescale_betas_zero_snr with v_prediction, sampled with 'trailing' spacing,
# whose first step is the pure-noise timestep 999) and the cosine schedule: from a snapshot's
# scheduler config or from &diffusion (tiny-sd2 has no scheduler/), the same bytes either way;
# the schedulers diffusers has no zero-SNR schedule for (heun, pndm) and an epsilon model are
# refused by name
zsnr_keys='"prediction_type": "v_prediction", "rescale_betas_zero_snr": true, "timestep_spacing": "trailing"'
sched_snap snap-zsnr ", $zsnr_keys"
sched_snap snap-vt ', "prediction_type": "v_prediction", "timestep_spacing": "trailing"'
for k in euler ddim dpmpp_2m; do
    sample_nml "zs$k" $k ", checkpoint = '$TMP/snap-zsnr'"
    mpi "zs$k" 2 "$SDTRAIN" "$TMP/zs$k.nml"
    expect_rc "zs$k" 0
    expect_in "zs$k" out "'trailing' spacing"
    expect_in "zs$k" out "steps_offset 1, zero terminal SNR"
    sample_nml "vt$k" $k ", checkpoint = '$TMP/snap-vt'"
    mpi "vt$k" 1 "$SDTRAIN" "$TMP/vt$k.nml"
    expect_rc "vt$k" 0
    cmp -s "$TMP/zs$k/samples/0-0.png" "$TMP/vt$k/samples/0-0.png" && fail "$k: zero terminal SNR changed nothing"
    sample_nml "zn$k" $k ", timestep_spacing = 'trailing'"
    mpi "zn$k" 1 "$SDTRAIN" "$TMP/zn$k.nml" --set diffusion.prediction_type=v_prediction \
        --set diffusion.rescale_betas_zero_snr=.true.
    expect_rc "zn$k" 0
    expect_in "zn$k" out "schedule from &diffusion (v_prediction, scaled_linear"
    same_pngs "zs$k" "zn$k" "$k, zero terminal SNR from the snapshot vs &diffusion"
done
sched_snap snap-cos ', "beta_schedule": "squaredcos_cap_v2"'
sample_nml cos euler ", checkpoint = '$TMP/snap-cos'"
mpi cos 1 "$SDTRAIN" "$TMP/cos.nml"
expect_rc cos 0
expect_in cos out "(epsilon, squaredcos_cap_v2"
cmp -s "$TMP/cos/samples/1-0.png" "$TMP/schede/samples/1-0.png" && fail "the cosine schedule changed nothing"
sample_nml cosn euler ", timestep_spacing = 'linspace'"
mpi cosn 1 "$SDTRAIN" "$TMP/cosn.nml" --set diffusion.beta_schedule=squaredcos_cap_v2
expect_rc cosn 0
same_pngs cos cosn "the cosine schedule from the snapshot vs &diffusion"
sample_nml zsheun heun ", checkpoint = '$TMP/snap-zsnr'"
mpi zsheun 2 "$SDTRAIN" "$TMP/zsheun.nml"
expect_rc zsheun 2
expect_count zsheun err "$TMP/snap-zsnr/scheduler/scheduler_config.json: rescale_betas_zero_snr is set, which diffusers' HeunDiscreteScheduler would ignore" 1
sample_nml znpndm pndm
mpi znpndm 1 "$SDTRAIN" "$TMP/znpndm.nml" --set diffusion.prediction_type=v_prediction \
    --set diffusion.rescale_betas_zero_snr=.true.
expect_rc znpndm 2
expect_count znpndm err "'pndm' has no zero-terminal-SNR schedule (diffusers' PNDMScheduler has no rescale_betas_zero_snr)" 1
sample_nml znlms lms
mpi znlms 1 "$SDTRAIN" "$TMP/znlms.nml" --set diffusion.prediction_type=v_prediction \
    --set diffusion.rescale_betas_zero_snr=.true.
expect_rc znlms 2
expect_count znlms err "'lms' has no zero-terminal-SNR schedule (diffusers' LMSDiscreteScheduler" 1
sched_snap snap-zeps ', "rescale_betas_zero_snr": true'
sample_nml zseps ddim ", checkpoint = '$TMP/snap-zeps'"
mpi zseps 2 "$SDTRAIN" "$TMP/zseps.nml"
expect_rc zseps 2
expect_count zseps err "$TMP/snap-zeps/scheduler/scheduler_config.json: rescale_betas_zero_snr with prediction_type 'epsilon'" 1
sample_nml zneps ddim
run zneps "$SDTRAIN" --check "$TMP/zneps.nml" --set diffusion.rescale_betas_zero_snr=.true.
expect_rc zneps 2
expect_in zneps err "rescale_betas_zero_snr needs prediction_type = 'v_prediction'"
pass "zero terminal SNR and the cosine schedule: from a snapshot or &diffusion, refused where diffusers has none"

# DPM-Solver++ of order 3 ("DPM++ 3M SDE Karras"): &sample solver_order or the snapshot's
# config, the same bytes either way and at -np 1 and 2, other images than order 2; refused for
# the schedulers without it
# (6 steps: with lower_order_final the orders are 1, 2, 3, 3, 2, 1)
sample_nml o3 dpmpp_2m_sde ", use_karras_sigmas = .true., solver_order = 3"
sed -i 's/num_steps = 3/num_steps = 6/' "$TMP/o3.nml"
mpi o3 2 "$SDTRAIN" "$TMP/o3.nml"
expect_rc o3 0
expect_in o3 out "solver_order 3, midpoint"
mpi o3np1 1 "$SDTRAIN" "$TMP/o3.nml" --set run.output_dir="'$TMP/o3np1'"
expect_rc o3np1 0
same_pngs o3 o3np1 "solver_order 3 at -np 2 vs 1"
mpi o2 1 "$SDTRAIN" "$TMP/o3.nml" --set run.output_dir="'$TMP/o2'" --set sample.solver_order=2
expect_rc o2 0
cmp -s "$TMP/o3/samples/0-0.png" "$TMP/o2/samples/0-0.png" && fail "solver_order 3 gave order 2's image"
sched_snap snap-o3 ', "solver_order": 3, "use_karras_sigmas": true'
sample_nml o3snap dpmpp_2m_sde ", checkpoint = '$TMP/snap-o3', timestep_spacing = 'leading'"
sed -i 's/num_steps = 3/num_steps = 6/' "$TMP/o3snap.nml"
mpi o3snap 1 "$SDTRAIN" "$TMP/o3snap.nml"
expect_rc o3snap 0
same_pngs o3 o3snap "solver_order 3 from the snapshot's config vs &sample"
sample_nml o3ddim ddim ", solver_order = 3"
mpi o3ddim 1 "$SDTRAIN" "$TMP/o3ddim.nml"
expect_rc o3ddim 2
expect_count o3ddim err "&sample solver_order = 3 needs scheduler = 'dpmpp_2m', 'dpmpp_2m_sde' or 'unipc', not 'ddim'" 1
# UniPC of order 3 likewise; its bh1 from the config (with final_sigmas_type sigma_min: to
# sigma 0 diffusers' bh1 ends in NaN, which sdtrain refuses, as UniPC without lower_order_final)
sample_nml u3 unipc ", solver_order = 3"
sed -i 's/num_steps = 3/num_steps = 6/' "$TMP/u3.nml"
mpi u3 2 "$SDTRAIN" "$TMP/u3.nml"
expect_rc u3 0
mpi u2 1 "$SDTRAIN" "$TMP/u3.nml" --set run.output_dir="'$TMP/u2'" --set sample.solver_order=2
expect_rc u2 0
cmp -s "$TMP/u3/samples/0-0.png" "$TMP/u2/samples/0-0.png" && fail "unipc: solver_order 3 gave order 2's image"
sched_snap snap-u3 ', "solver_order": 3'
sample_nml u3snap unipc ", checkpoint = '$TMP/snap-u3', timestep_spacing = 'leading'"
sed -i 's/num_steps = 3/num_steps = 6/' "$TMP/u3snap.nml"
mpi u3snap 1 "$SDTRAIN" "$TMP/u3snap.nml"
expect_rc u3snap 0
same_pngs u3 u3snap "unipc solver_order 3 from the snapshot's config vs &sample"
sched_snap snap-bh1 ', "solver_type": "bh1", "final_sigmas_type": "sigma_min"'
sample_nml bh1 unipc ", checkpoint = '$TMP/snap-bh1'"
mpi bh1 1 "$SDTRAIN" "$TMP/bh1.nml"
expect_rc bh1 0
sched_snap snap-bh2 ', "final_sigmas_type": "sigma_min"'
sample_nml bh2 unipc ", checkpoint = '$TMP/snap-bh2'"
mpi bh2 1 "$SDTRAIN" "$TMP/bh2.nml"
expect_rc bh2 0
cmp -s "$TMP/bh1/samples/0-0.png" "$TMP/bh2/samples/0-0.png" && fail "unipc: bh1 gave bh2's image"
sched_snap snap-bh1z ', "solver_type": "bh1"'
sample_nml bh1z unipc ", checkpoint = '$TMP/snap-bh1z'"
mpi bh1z 2 "$SDTRAIN" "$TMP/bh1z.nml"
expect_rc bh1z 2
expect_count bh1z err "UniPC to a final sigma of 0: with solver_type 'bh1'" 1
sched_snap snap-nolof ', "lower_order_final": false'
sample_nml nolof unipc ", checkpoint = '$TMP/snap-nolof'"
mpi nolof 1 "$SDTRAIN" "$TMP/nolof.nml"
expect_rc nolof 2
expect_count nolof err "UniPC to a final sigma of 0: without lower_order_final" 1
# Karras sigmas end at the smallest sigma, which sigma_min repeats: an order-3 last step would
# divide by h = 0 (NaN in diffusers): refused naming the file
sched_snap snap-h0 ', "solver_order": 3, "use_karras_sigmas": true, "final_sigmas_type": "sigma_min", "lower_order_final": false'
sample_nml h0 dpmpp_2m ", checkpoint = '$TMP/snap-h0'"
mpi h0 2 "$SDTRAIN" "$TMP/h0.nml"
expect_rc h0 2
expect_count h0 err "$TMP/snap-h0/scheduler/scheduler_config.json: dpmpp_2m with Karras sigmas and final_sigmas_type 'sigma_min': the last two sigmas are equal" 1
# UniPC's predict_x0 false (with sigma_min; to sigma 0 refused: NaN in diffusers) and
# disable_corrector from the config: each changes the images (the corrector of step 1, [0]: the
# last step's would not, its output being the x0 prediction whatever the sample); a malformed
# list is refused
sched_snap snap-px0f ', "predict_x0": false, "final_sigmas_type": "sigma_min"'
sample_nml px0f unipc ", checkpoint = '$TMP/snap-px0f'"
mpi px0f 1 "$SDTRAIN" "$TMP/px0f.nml"
expect_rc px0f 0
cmp -s "$TMP/px0f/samples/0-0.png" "$TMP/bh2/samples/0-0.png" && fail "unipc: predict_x0 false changed nothing"
sched_snap snap-px0fz ', "predict_x0": false'
sample_nml px0fz unipc ", checkpoint = '$TMP/snap-px0fz'"
mpi px0fz 1 "$SDTRAIN" "$TMP/px0fz.nml"
expect_rc px0fz 2
expect_count px0fz err "UniPC to a final sigma of 0: with predict_x0 false" 1
sched_snap snap-nocorr ', "disable_corrector": [0]'
sample_nml nocorr unipc ", checkpoint = '$TMP/snap-nocorr'"
mpi nocorr 1 "$SDTRAIN" "$TMP/nocorr.nml"
expect_rc nocorr 0
sample_nml ubase unipc ", checkpoint = '$TMP/snap-sd2'"
mpi ubase 1 "$SDTRAIN" "$TMP/ubase.nml"
expect_rc ubase 0
cmp -s "$TMP/nocorr/samples/0-0.png" "$TMP/ubase/samples/0-0.png" && fail "unipc: disable_corrector changed nothing"
# as in Python, 0.0 is the step index 0 (and numbers matching no step change nothing)
sched_snap snap-nocorrf ', "disable_corrector": [0.0, 7.5, -1, 100000]'
sample_nml nocorrf unipc ", checkpoint = '$TMP/snap-nocorrf'"
mpi nocorrf 1 "$SDTRAIN" "$TMP/nocorrf.nml"
expect_rc nocorrf 0
same_pngs nocorr nocorrf "disable_corrector [0] vs [0.0, 7.5, -1, 100000]"
sched_snap snap-badcorr ', "disable_corrector": [1, "1"]'
sample_nml badcorr unipc ", checkpoint = '$TMP/snap-badcorr'"
mpi badcorr 1 "$SDTRAIN" "$TMP/badcorr.nml"
expect_rc badcorr 2
expect_count badcorr err "disable_corrector[1] is not a step index" 1
pass "DPM-Solver++ and UniPC of order 3 (&sample solver_order or the snapshot's config), UniPC's bh1, predict_x0 false, disable_corrector"

# Karras sigmas ("DPM++ 2M Karras"): from &sample use_karras_sigmas or the snapshot's config, the
# same bytes; other images than without; refused for a scheduler without the option
sample_nml karras dpmpp_2m ", use_karras_sigmas = .true."
mpi karras 2 "$SDTRAIN" "$TMP/karras.nml"
expect_rc karras 0
expect_in karras out "'leading' spacing, Karras sigmas)"
cmp -s "$TMP/karras/samples/1-0.png" "$TMP/dpmpp_2m1/samples/1-0.png" && fail "Karras sigmas changed nothing"
sched_snap snap-karras ', "use_karras_sigmas": true'
sample_nml karrascfg dpmpp_2m ", checkpoint = '$TMP/snap-karras'"
mpi karrascfg 1 "$SDTRAIN" "$TMP/karrascfg.nml"
expect_rc karrascfg 0
same_pngs karras karrascfg "Karras sigmas from the namelist vs from scheduler_config.json"
sample_nml expo dpmpp_2m ", use_exponential_sigmas = .true."
mpi expo 1 "$SDTRAIN" "$TMP/expo.nml"
expect_rc expo 0
expect_in expo out "exponential sigmas)"
cmp -s "$TMP/expo/samples/1-0.png" "$TMP/karras/samples/1-0.png" && fail "exponential sigmas gave Karras' image"
sched_snap snap-expo ', "use_exponential_sigmas": true'
sample_nml expocfg dpmpp_2m ", checkpoint = '$TMP/snap-expo'"
mpi expocfg 2 "$SDTRAIN" "$TMP/expocfg.nml"
expect_rc expocfg 0
same_pngs expo expocfg "exponential sigmas from the namelist vs from scheduler_config.json"
sample_nml both dpmpp_2m ", use_karras_sigmas = .true., use_exponential_sigmas = .true."
mpi both 1 "$SDTRAIN" "$TMP/both.nml"
expect_rc both 2
expect_count both err "more than one of use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas is .true." 1
sample_nml karrasddim ddim ", use_karras_sigmas = .true."
mpi karrasddim 2 "$SDTRAIN" "$TMP/karrasddim.nml"
expect_rc karrasddim 2
expect_count karrasddim err "&sample use_karras_sigmas = .true. needs scheduler = 'euler', 'heun', 'lms', 'dpm2', 'dpm2_a', 'dpmpp_2m', 'dpmpp_2m_sde', 'dpmpp_sde' or 'unipc', not 'ddim'" 1
pass "Karras and exponential sigmas"

# DDIM's eta draws noise per image (the same bytes at -np 1 and 2 with batches) and changes the
# images; guidance_rescale changes them too; each is recorded in samples.jsonl; unused, warned
sample_nml eta1 ddim ", eta = 0.5"
mpi eta1 1 "$SDTRAIN" "$TMP/eta1.nml"
expect_rc eta1 0
expect_in eta1 out "'leading' spacing, eta 0.5)"
mpi eta2 2 "$SDTRAIN" "$TMP/eta1.nml" --set sample.batch_size=2 --set run.output_dir="'$TMP/eta2'"
expect_rc eta2 0
same_pngs eta1 eta2 "eta 0.5 at -np 1 vs -np 2 with 2 images a call"
cmp -s "$TMP/eta1/samples/0-0.png" "$TMP/ddim1/samples/0-0.png" && fail "eta changed nothing"
grep -q '"scheduler": "ddim", "timestep_spacing": "leading", "eta": 0.5, "guidance_scale": 7.5,' "$TMP/eta1/samples.jsonl" ||
    fail "samples.jsonl: eta not recorded: $(sed -n 1p "$TMP/eta1/samples.jsonl")"
sample_nml resc ddim ", guidance_rescale = 0.7"
mpi resc 2 "$SDTRAIN" "$TMP/resc.nml"
expect_rc resc 0
expect_in resc out "guidance_rescale 0.7"
cmp -s "$TMP/resc/samples/0-0.png" "$TMP/ddim1/samples/0-0.png" && fail "guidance_rescale changed nothing"
mpi resc4 1 "$SDTRAIN" "$TMP/resc.nml" --set sample.batch_size=4 --set run.output_dir="'$TMP/resc4'"
expect_rc resc4 0
same_pngs resc resc4 "guidance_rescale, 4 + 2 images a call (rescaled per image)"
grep -q '"guidance_scale": 7.5, "guidance_rescale": 0.7, "width"' "$TMP/resc/samples.jsonl" ||
    fail "samples.jsonl: guidance_rescale not recorded"
mpi etaeuler 1 "$SDTRAIN" "$TMP/euler1.nml" --set sample.eta=0.5 --set sample.guidance_scale=1 \
    --set sample.guidance_rescale=0.5 --set run.output_dir="'$TMP/etaeuler'"
expect_rc etaeuler 0
expect_in etaeuler err "&sample eta = 0.5 is not used: only scheduler = 'ddim' takes it"
expect_in etaeuler err "&sample guidance_rescale = 0.5 is not used: guidance_scale 1 <= 1"
grep -q '"eta"\|"guidance_rescale"' "$TMP/etaeuler/samples.jsonl" && fail "samples.jsonl records unused options"
pass "eta and guidance_rescale"

# non-square images (&sample width / height over &model resolution): 24 x 16 px PNGs, the same
# bytes at -np 1 and -np 2 with batches, listed with their size
sample_nml wide1 euler_a ", width = 24, height = 16"
mpi wide1 1 "$SDTRAIN" "$TMP/wide1.nml"
expect_rc wide1 0
expect_in wide1 out "at 24x16 px with euler_a"
mpi wide2 2 "$SDTRAIN" "$TMP/wide1.nml" --set sample.batch_size=2 --set run.output_dir="'$TMP/wide2'"
expect_rc wide2 0
same_pngs wide1 wide2 "24x16 at -np 1 vs -np 2 with 2 images a call"
# PNG IHDR: width and height, big-endian, at bytes 16..23
[ "$(od -An -tu1 -j16 -N8 "$TMP/wide1/samples/1-1.png" | tr -s ' ')" = " 0 0 0 24 0 0 0 16" ] ||
    fail "24x16: the PNG is $(od -An -tu1 -j16 -N8 "$TMP/wide1/samples/1-1.png")"
grep -q '"width": 24, "height": 16, "file": "samples/0-0.png"' "$TMP/wide1/samples.jsonl" ||
    fail "samples.jsonl: the size is not recorded"
pass "non-square images"

# &sample prompts_file: the same prompts as lines (CRLF, blank lines, no final newline) make the
# same images; samples.jsonl gives each prompt's line
printf 'a photo of the cat\r\n\n  \t\nred car at the sea\nx "quoted" \\ back' >"$TMP/prompts.txt"
pfile_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'sample', output_dir = '$TMP/$1', seed = 7, device = 'cpu' /
&model pretrained = '$top_srcdir/tests/data/models/tiny-sd2',
       tokenizer = '$top_srcdir/tests/data/sample/tokenizer', resolution = 16 /
&sample prompts_file = '$2', num_steps = 3, guidance_scale = 7.5, scheduler = 'ddim',
        images_per_prompt = 2${3:-} /
EOF2
}
pfile_nml pfile "$TMP/prompts.txt"
mpi pfile 2 "$SDTRAIN" "$TMP/pfile.nml"
expect_rc pfile 0
expect_in pfile out "sampling 6 image(s) (3 prompt(s) x 2)"
same_pngs pfile ddim1 "prompts_file vs the same prompts in the namelist"
grep -q '"prompt_index": 1, "image_index": 0, "prompt_line": 4, "prompt": "red car at the sea"' \
    "$TMP/pfile/samples.jsonl" || fail "prompts_file: samples.jsonl lacks the prompt's line"
pass "prompts_file: the same PNG bytes as the namelist's prompts"
# a prompt that is not UTF-8 (a Latin-1 e-acute): samples.jsonl stays UTF-8, U+FFFD in its place
printf 'caf\351 latte\n' >"$TMP/latin1.txt"
pfile_nml platin "$TMP/latin1.txt"
mpi platin 1 "$SDTRAIN" "$TMP/platin.nml"
expect_rc platin 0
expect_in platin err "latin1.txt:1: the prompt is not valid UTF-8"
grep -qF "\"prompt\": \"caf$(printf '\357\277\275') latte\"" "$TMP/platin/samples.jsonl" ||
    fail "samples.jsonl: the bad byte is not U+FFFD: $(head -1 "$TMP/platin/samples.jsonl")"
if command -v iconv >/dev/null 2>&1; then
    iconv -f UTF-8 -t UTF-8 "$TMP/platin/samples.jsonl" >/dev/null 2>&1 || fail "samples.jsonl is not UTF-8"
fi
pass "prompts_file: invalid UTF-8 written to samples.jsonl as U+FFFD"
awk 'BEGIN { s = ""; for (i = 0; i < 1100; i++) s = s "a"; print "ok"; print s }' >"$TMP/long.txt"
pfile_nml plong "$TMP/long.txt"
mpi plong 2 "$SDTRAIN" "$TMP/plong.nml"
expect_rc plong 2
expect_count plong err "long.txt:2:1: a prompt of 1100 bytes (at most 1023)" 1
printf '\n \n\n' >"$TMP/blank.txt"
pfile_nml pblank "$TMP/blank.txt"
mpi pblank 2 "$SDTRAIN" "$TMP/pblank.nml"
expect_rc pblank 2
expect_count pblank err "blank.txt: no prompts (the file has only blank lines)" 1
pfile_nml pnone "$TMP/none.txt"
mpi pnone 2 "$SDTRAIN" "$TMP/pnone.nml"
expect_rc pnone 2
expect_count pnone err "none.txt: cannot read: No such file or directory" 1
pfile_nml pneg "$TMP/prompts.txt" ", negative_prompts = 'a', 'b', 'c'"
mpi pneg 1 "$SDTRAIN" --check "$TMP/pneg.nml"
expect_rc pneg 2
expect_in pneg err "with prompts_file it takes one (for every prompt)"
sample_nml pboth ddim ", prompts_file = '$TMP/prompts.txt'"
mpi pboth 1 "$SDTRAIN" --check "$TMP/pboth.nml"
expect_rc pboth 2
expect_in pboth err "&sample has both prompts and prompts_file"
pass "prompts_file: long, blank, missing, with three negative prompts, beside prompts: refused"

# bad inputs: exit 2, one message, on every rank count
printf "&run mode = 'sample', output_dir = '$TMP/noprompt' /\n&model pretrained = '$snap' /\n" | nml noprompt.nml
mpi noprompt 2 "$SDTRAIN" "$TMP/noprompt.nml"
expect_rc noprompt 2
expect_count noprompt err "missing required key 'prompts' in &sample" 1

sample_nml nosnap ddim ", checkpoint = '$TMP/nowhere'"
mpi nosnap 2 "$SDTRAIN" "$TMP/nosnap.nml"
expect_rc nosnap 2
expect_count nosnap err "&sample checkpoint = '$TMP/nowhere': no such file or directory" 1

mkdir -p "$TMP/novae"
cp -r "$snap/unet" "$snap/text_encoder" "$TMP/novae/"
sample_nml novae ddim ", checkpoint = '$TMP/novae'"
mpi novae 2 "$SDTRAIN" "$TMP/novae.nml"
expect_rc novae 2
expect_count novae err "mode 'sample':" 1
expect_in novae err "$TMP/novae"
expect_in novae err "vae"

sample_nml nothing ddim
mpi nothing 1 "$SDTRAIN" "$TMP/nothing.nml" --set "model.pretrained=''"
expect_rc nothing 2
expect_count nothing err "nothing to sample from" 1

sample_nml badtok ddim
mpi badtok 2 "$SDTRAIN" "$TMP/badtok.nml" \
    --set "model.tokenizer='$top_srcdir/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz'"
expect_rc badtok 2
expect_count badtok err "beyond the text encoder's vocabulary of 1000" 1

sample_nml toomany ddim
mpi toomany 1 "$SDTRAIN" "$TMP/toomany.nml" --set sample.num_steps=1000
expect_rc toomany 2
expect_count toomany err "outside the schedule" 1
pass "bad set-ups end with exit 2 and one message"
