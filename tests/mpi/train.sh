#!/bin/sh
# mode = 'train' end to end under MPI on shards made by mode = 'process': DDP and ZeRO-2 give
# the same bits at -np 1..4, 2 ranks x batch 4 equals 1 rank x batch 8 (and 4 x 2, and gradient
# accumulation over micro-batches) within 1e-6, metrics.jsonl and validation lines, gradients
# reduced during the backward give the bits of the reduction after it, a NaN injected on one
# rank skips the step everywhere, and bad set-ups end every rank with one clear message.
. "$top_srcdir/tests/lib.sh"
need_mpi
COMPARE="${top_builddir:-.}/tests/mpi/st_compare"

tiny_shards 48 2 # demo images encoded on the CPU into $TMP/shards

# train_nml NAME BATCH SHARDING: the namelist of a 10-step run, on the CPU whatever the machine
# has (tests/gpu/train.sh trains on the GPU)
train_nml() { tiny_train_nml "$1" "$2" "$3"; }
# train NAME NP BATCH SHARDING
train() {
    train_nml "$1" "$3" "$4"
    mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
}

train np1 1 8 none
expect_rc np1 0
expect_in np1 out "step 10/10"
expect_in np1 out "training summary"
expect_in np1 out "validation loss"
m="$TMP/np1/metrics.jsonl"
[ "$(grep -c '"loss"' "$m")" = 10 ] || fail "np1: expected 10 step lines in $m"
[ "$(grep -c '"val_loss"' "$m")" = 3 ] || fail "np1: expected 3 validation lines (steps 0, 5, 10) in $m"
for key in '"step": 1,' '"lr":' '"images_per_s":' '"tflops_per_rank":' '"grad_norm":' '"data_wait_s":' '"comm_s":' '"compute_s":'; do
    grep -qF "$key" "$m" || fail "np1: $key missing from metrics.jsonl"
done
[ -s "$TMP/np1/unet_final.safetensors" ] && [ -s "$TMP/np1/unet_ema.safetensors" ] ||
    fail "np1: final weights missing"
# the summary's forward + backward by the stream clock: a share of the steps' time, and the
# model's rate while computing at least its rate over the steps
own=$(sed -n 's/.*forward + backward, own *[0-9.]* s *\([0-9.]*\)%  (the host.s clock; \([0-9.e+-]*\) TFLOP\/s while computing)/\1 \2/p' "$TMP/np1.out")
rate=$(sed -n 's/.*model compute *\([0-9.e+-]*\) TFLOP\/s a rank.*/\1/p' "$TMP/np1.out")
echo "$own $rate" | awk 'NF == 3 && $1 > 1 && $1 <= 100 && $2 >= $3 { ok = 1 } END { exit !ok }' ||
    fail "np1: summary's own compute '$own' (share %, TFLOP/s) against the steps' '$rate' TFLOP/s"

# recomputing activations in the backward changes memory, not bits
train_nml recompute 8 none
sed -i 's/ema_decay = 0.9/ema_decay = 0.9, recompute_activations = .true./' "$TMP/recompute.nml"
mpi recompute 1 "$SDTRAIN" "$TMP/recompute.nml"
expect_rc recompute 0
cmp -s "$TMP/np1/unet_final.safetensors" "$TMP/recompute/unet_final.safetensors" ||
    fail "recompute_activations changed the trained weights"

# latent_sample = .false. trains on the posterior means, latent_scale replaces the shards'
# factor: each changes the trained weights, and .false. with the shards' own factor is stable
for v in "latent_sample = .false." "latent_scale = 0.5" ; do
    name=$(echo "$v" | cut -d' ' -f1)
    train_nml "$name" 8 none
    sed -i "s/ema_decay = 0.9/ema_decay = 0.9, $v/" "$TMP/$name.nml"
    mpi "$name" 1 "$SDTRAIN" "$TMP/$name.nml"
    expect_rc "$name" 0
    ! cmp -s "$TMP/np1/unet_final.safetensors" "$TMP/$name/unet_final.safetensors" ||
        fail "$v did not change the training"
done
mpi latent_sample2 1 "$SDTRAIN" "$TMP/latent_sample.nml" --set run.output_dir="$TMP/latent_sample2"
expect_rc latent_sample2 0
cmp -s "$TMP/latent_sample/unet_final.safetensors" "$TMP/latent_sample2/unet_final.safetensors" ||
    fail "latent_sample = .false.: two runs differ"

# zero terminal SNR (v_prediction) on the cosine schedule with min-SNR weights: the last
# timestep's SNR is 0 (weight 0, no division by it), every loss finite, another training than
# the default schedule's; the GPU's device path (emulated on the CPU) trains the same
ZSNR="--set diffusion.prediction_type=v_prediction --set diffusion.rescale_betas_zero_snr=.true.
 --set diffusion.beta_schedule=squaredcos_cap_v2 --set diffusion.min_snr_gamma=5"
train_nml zsnr 8 none
# shellcheck disable=SC2086 # ZSNR holds several options
mpi zsnr 1 "$SDTRAIN" "$TMP/zsnr.nml" $ZSNR
expect_rc zsnr 0
grep -q "rescale_betas_zero_snr = .true." "$TMP/zsnr/used.nml" || fail "zsnr: not in used.nml"
[ "$(grep -c '"loss"' "$TMP/zsnr/metrics.jsonl")" = 10 ] || fail "zsnr: expected 10 step lines"
grep -qi 'nan\|inf' "$TMP/zsnr/metrics.jsonl" && fail "zsnr: a non-finite value in metrics.jsonl"
! cmp -s "$TMP/np1/unet_final.safetensors" "$TMP/zsnr/unet_final.safetensors" ||
    fail "zero terminal SNR did not change the training"
# shellcheck disable=SC2086
SDTRAIN_EMULATE_DEVICE_PATH=1 mpi zsnr-emu 2 "$SDTRAIN" "$TMP/zsnr.nml" $ZSNR \
    --set run.output_dir="'$TMP/zsnr-emu'" --set train.batch_size_per_rank=4
expect_rc zsnr-emu 0
expect_in zsnr-emu out "emulating the GPU's device path"
run cmp-zsnr "$COMPARE" "$TMP/zsnr/unet_final.safetensors" "$TMP/zsnr-emu/unet_final.safetensors" 1e-6
expect_rc cmp-zsnr 0

# input perturbation: another training; validation is not perturbed (the same loss at step 0,
# before any update); 2 ranks x 4 train like 1 x 8 (the draws are the samples', not the ranks')
train_nml pert 8 none
mpi pert 1 "$SDTRAIN" "$TMP/pert.nml" --set diffusion.input_perturbation=0.1
expect_rc pert 0
! cmp -s "$TMP/np1/unet_final.safetensors" "$TMP/pert/unet_final.safetensors" ||
    fail "input_perturbation did not change the training"
[ "$(grep -m1 '"val_loss"' "$TMP/np1/metrics.jsonl" | sed 's/.*"val_loss": *\([^,}]*\).*/\1/')" = \
  "$(grep -m1 '"val_loss"' "$TMP/pert/metrics.jsonl" | sed 's/.*"val_loss": *\([^,}]*\).*/\1/')" ] ||
    fail "input_perturbation changed the validation loss at step 0"
mpi pert2 2 "$SDTRAIN" "$TMP/pert.nml" --set diffusion.input_perturbation=0.1 \
    --set run.output_dir="'$TMP/pert2'" --set train.batch_size_per_rank=4
expect_rc pert2 0
run cmp-pert "$COMPARE" "$TMP/pert/unet_final.safetensors" "$TMP/pert2/unet_final.safetensors" 1e-6
expect_rc cmp-pert 0

# the schedules beyond diffusers' three (cosine_with_restarts, polynomial): metrics.jsonl's lr is
# diffusers' LambdaLR (test_optim checks the formulas bit for bit); 2 cycles over steps 4..10 of
# warmup 3 restart at the peak between steps 7 and 8 (updates k = 6 and 7)
train_nml restarts 8 none
mpi restarts 1 "$SDTRAIN" "$TMP/restarts.nml" --set "train.lr_schedule='cosine_with_restarts'" \
    --set train.lr_num_cycles=2
expect_rc restarts 0
lr_of() { sed -n "s/^{\"step\": $2, .*\"lr\": \([^,]*\),.*/\1/p" "$TMP/$1/metrics.jsonl"; }
awk -v a="$(lr_of restarts 7)" -v b="$(lr_of restarts 8)" 'BEGIN { exit !(a + 0 < 0.0002 && b + 0 > 0.0009) }' ||
    fail "cosine_with_restarts: lr $(lr_of restarts 7) at step 7, $(lr_of restarts 8) at step 8"
train_nml poly 8 none
mpi poly 1 "$SDTRAIN" "$TMP/poly.nml" --set "train.lr_schedule='polynomial'" --set train.lr_power=2
expect_rc poly 0
[ "$(lr_of poly 10)" != "$(lr_of np1 10)" ] || fail "polynomial: the constant schedule's lr"
mpi polybad 1 "$SDTRAIN" "$TMP/poly.nml" --set "train.lr_schedule='polynomial'" --set train.learning_rate=1e-8
expect_rc polybad 2
expect_in polybad err "decays to 1e-7: learning_rate must be larger"

for np in 1 2 3 4; do
    bs=$((np == 3 ? 4 : 8 / np))
    train "ddp$np" "$np" "$bs" none
    expect_rc "ddp$np" 0
    train "zero$np" "$np" "$bs" shard_grad_op
    expect_rc "zero$np" 0
    for f in unet_final unet_ema; do
        cmp -s "$TMP/ddp$np/$f.safetensors" "$TMP/zero$np/$f.safetensors" ||
            fail "np $np: DDP and ZeRO-2 $f differ"
    done
    # the same losses, step by step
    grep -o '"loss": [^,]*' "$TMP/ddp$np/metrics.jsonl" >"$TMP/l-ddp"
    grep -o '"loss": [^,]*' "$TMP/zero$np/metrics.jsonl" >"$TMP/l-zero"
    cmp -s "$TMP/l-ddp" "$TMP/l-zero" || fail "np $np: DDP and ZeRO-2 losses differ"
done
# model compute: the summary's FLOPs a sample do not depend on the split of the batch, and
# every step line's tflops_per_rank is them times the step's images / step_s / ranks
gflop() { sed -n 's/.*TFLOP\/s a rank (\([0-9.e+-]*\) GFLOP a sample.*/\1/p' "$TMP/$1.out"; }
g1=$(gflop ddp1)
[ -n "$g1" ] && [ "$g1" = "$(gflop ddp2)" ] && [ "$g1" = "$(gflop ddp4)" ] && [ "$g1" = "$(gflop zero3)" ] ||
    fail "model compute: GFLOP a sample '$g1' (1 x 8), '$(gflop ddp2)' (2 x 4), '$(gflop ddp4)' (4 x 2), '$(gflop zero3)' (3 x 4)"
awk -v g="$g1" -v np=2 '/"loss"/ {
        match($0, /"tflops_per_rank": [0-9.e+-]+/); tf = substr($0, RSTART + 19, RLENGTH - 19)
        match($0, /"step_s": [0-9.e+-]+/); dt = substr($0, RSTART + 10, RLENGTH - 10)
        want = g * 1e9 * 8 / dt / np * 1e-12
        if (tf <= 0 || (tf - want) / want > 0.01 || (want - tf) / want > 0.01) bad++; n++ }
    END { exit !(n == 10 && bad == 0) }' "$TMP/ddp2/metrics.jsonl" ||
    fail "ddp2: tflops_per_rank is not $g1 GFLOP x 8 images / step_s / 2 ranks on every step line"
# a straggler: rank 1's inputs come 700 ms late at every step (test hook); the others wait for
# it, and each progress line's interval names it (a warning and a metrics line); the training's
# bits are those of the undisturbed run, which names no rank
train_nml strag 4 none
SDTRAIN_TEST_LOAD_DELAY=1:700 mpi strag 2 "$SDTRAIN" "$TMP/strag.nml"
expect_rc strag 0
expect_in strag err "steps 1-5: rank 1 waited"
expect_in strag err "steps 6-10: rank 1 waited"
expect_in strag err "for its inputs, the training ranks' mean"
[ "$(grep -c '"data_wait_max_rank": 1,' "$TMP/strag/metrics.jsonl")" = 2 ] ||
    fail "strag: expected 2 metrics lines naming rank 1: $(grep data_wait "$TMP/strag/metrics.jsonl")"
grep -q '"compute_max_rank": ' "$TMP/strag/metrics.jsonl" || fail "strag: no compute_max_rank"
same_weights strag ddp2
expect_not_in strag err " computed "
# a compute straggler: rank 0's forward starts 700 ms late at every step (test hook, between the
# stream marks that time the forward and backward): named for its compute, not its inputs, and
# each of its step lines' compute_s holds the delay
train_nml cstrag 4 none
SDTRAIN_TEST_COMPUTE_DELAY=0:700 mpi cstrag 2 "$SDTRAIN" "$TMP/cstrag.nml"
expect_rc cstrag 0
expect_in cstrag err "steps 1-5: rank 0 computed"
expect_in cstrag err "steps 6-10: rank 0 computed"
expect_in cstrag err "a slow or busy node, or a throttled GPU?"
expect_not_in cstrag err "for its inputs"
[ "$(grep -c '"compute_max_rank": 0,' "$TMP/cstrag/metrics.jsonl")" = 2 ] ||
    fail "cstrag: expected 2 metrics lines naming rank 0: $(grep compute_max "$TMP/cstrag/metrics.jsonl")"
awk '/"loss"/ { match($0, /"compute_s": [0-9.e+-]+/); c = substr($0, RSTART + 13, RLENGTH - 13)
        if (c < 0.7) bad++; n++ }
    END { exit !(n == 10 && bad == 0) }' "$TMP/cstrag/metrics.jsonl" ||
    fail "cstrag: a step line's compute_s below the 0.7 s delay"
same_weights cstrag ddp2
expect_not_in ddp2 err "the others wait for it"
[ "$(grep -c '"data_wait_max_rank"' "$TMP/ddp2/metrics.jsonl")" = 2 ] ||
    fail "ddp2: expected a ranks line at steps 5 and 10"
! grep -q '"data_wait_max_rank"' "$TMP/ddp1/metrics.jsonl" || fail "ddp1: a ranks line with one rank"
# the global batch of 8 split 1 x 8, 2 x 4 and 4 x 2: the same training within 1e-6
for np in 2 4; do
    run "cmp$np" "$COMPARE" "$TMP/ddp1/unet_final.safetensors" "$TMP/ddp$np/unet_final.safetensors" 1e-6
    expect_rc "cmp$np" 0
done
# and as gradient accumulation: 1 rank x 4 x 2 micro-batches, 2 ranks x 2 x 2 (ZeRO-2), and
# 1 x 2 x 4: the same samples per step, the same training within 1e-6
for v in "acc1x4x2 1 4 none 2" "acc2x2x2 2 2 shard_grad_op 2" "acc1x2x4 1 2 none 4"; do
    set -- $v
    train_nml "$1" "$3" "$4"
    sed -i "s/ema_decay = 0.9/ema_decay = 0.9, grad_accum_steps = $5/" "$TMP/$1.nml"
    mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
    expect_rc "$1" 0
    expect_in "$1" out "x $5 accumulated micro-batches (global 8)"
    run "cmp-$1" "$COMPARE" "$TMP/ddp1/unet_final.safetensors" "$TMP/$1/unet_final.safetensors" 1e-6
    expect_rc "cmp-$1" 0
done

# a NaN gradient on rank 1 at step 3: skipped on every rank, counted, training goes on
SDTRAIN_FAULT=nan:rank=1:step=3 train nan 2 4 shard_grad_op
expect_rc nan 0
expect_in nan err "non-finite loss or gradients"
expect_in nan out "(1 skipped: non-finite)"
grep -q '"skipped": 1' "$TMP/nan/metrics.jsonl" || fail "nan: skipped count not in metrics"

# the gradients reduced bucket by bucket during the backward (grad_reduce = 'overlap', buckets
# of 5242 floats: dozens, most inside one block, some cut by shard ends) give the bits of the
# whole-buffer reduction after it: DDP and ZeRO-2 at 1-3 ranks, and with micro-batches (only
# the last one's backward reduces)
for v in "ddp1 1 8 none" "ddp2 2 4 none" "zero2 2 4 shard_grad_op" "ddp3 3 4 none" \
         "zero3 3 4 shard_grad_op" "acc2x2x2 2 2 shard_grad_op 2"; do
    set -- $v
    train_nml "ov-$1" "$3" "$4"
    sed -i "s/ema_decay = 0.9/ema_decay = 0.9, grad_reduce = 'overlap', grad_bucket_mb = 0.02${5:+, grad_accum_steps = $5}/" \
        "$TMP/ov-$1.nml"
    mpi "ov-$1" "$2" "$SDTRAIN" "$TMP/ov-$1.nml"
    expect_rc "ov-$1" 0
    expect_in "ov-$1" out "gradient reduction: overlapped with the backward"
    for f in unet_final unet_ema; do
        cmp -s "$TMP/$1/$f.safetensors" "$TMP/ov-$1/$f.safetensors" ||
            fail "$1: grad_reduce = 'overlap' changed $f"
    done
done
grep -o '"loss": [^,]*' "$TMP/zero3/metrics.jsonl" >"$TMP/l-a"
grep -o '"loss": [^,]*' "$TMP/ov-zero3/metrics.jsonl" >"$TMP/l-b"
cmp -s "$TMP/l-a" "$TMP/l-b" || fail "zero3: grad_reduce = 'overlap' changed the losses"

# bad set-ups: one message, every rank ends
train_nml noshards 4 none
sed -i "s#shard_dir = '$TMP/shards'#shard_dir = '$TMP/none'#" "$TMP/noshards.nml"
mpi noshards 2 "$SDTRAIN" "$TMP/noshards.nml"
expect_rc noshards 2
expect_count noshards err "sdtrain:" 1
sed "s/cross_attention_dim = 32, text_hidden_size = 32/cross_attention_dim = 24, text_hidden_size = 24/" "$TMP/np1.nml" >"$TMP/width.nml"
mpi width 2 "$SDTRAIN" "$TMP/width.nml"
expect_rc width 2
expect_in width err "cross_attention_dim is 24"
pass "mode = 'train' under MPI"
