#!/bin/sh
# mode = 'train' on the GPU (doc/training.md "On the GPU"), on shards made by mode = 'process':
#   1. one rank, fp32 (no TF32), 10 steps: every step's loss within 1e-4 (relative) of the CPU's,
#      the final weights and EMA within 1e-3 overall; every step's compute_s (CUDA events) in
#      (0, step_s];
#   2. the same GPU run again gives the same files; the host path (SDTRAIN_GPU_COMM=host) gives
#      the same files as the device path (the CUDA optimizer is the CPU's bit for bit);
#   3. bf16: 10 finite steps, losses within 5e-2 (relative) of fp32's, weights within 1e-2;
#   4. two ranks sharing one GPU (host path): DDP and ZeRO-2 byte-identical, within 1e-3 of one
#      rank with the same global batch; a rank whose forward is late is named for its compute;
#      with two GPUs or more also the NCCL path, DDP and ZeRO-2 within 1e-3 of one rank;
#   5. SDTRAIN_GPU_COMM=device with two ranks on one GPU fails at once with a clear message;
#      gradient accumulation (4 x 2) trains like batch 8; gradients reduced during the backward
#      (grad_reduce = 'overlap', NCCL with one rank) give the same files; a wait for the GPU
#      past SDTRAIN_NCCL_TIMEOUT ends the job with a message; an injected NaN skips its step;
#   6. checkpoints on the GPU (device and host paths): killed at the start of step 7 with a
#      checkpoint of step 4, the resumed run gives the same weights as the uninterrupted one;
#      background checkpoints (&checkpoint async) on the device path: the same training and
#      checkpoint data;
#   7. images during training (&sample every_n_steps) beside the training state on the GPU.
# Skips without a CUDA build or a GPU.
SD_TEST_NAME=gpu-train # not the scratch directory of tests/mpi/train.sh
. "$top_srcdir/tests/lib.sh"

need_gpu
need_mpi
ngpus=$(sed -n 's/^gpus: \([0-9]*\),.*/\1/p' "$TMP/device.out")
COMPARE="$top_builddir/tests/mpi/st_compare"

tiny_shards 48 2 # demo images encoded on the CPU into $TMP/shards

# train NAME NP BATCH SHARDING DEVICE PRECISION [EXTRA]: a 10-step run (the namelist of
# tests/mpi/train.sh); EXTRA is appended to the namelist (another group); $ACCUM, when set, is
# the run's grad_accum_steps; $TRAIN_EXTRA, when set, is appended to the &train group
train() {
    DEVICE=$5 tiny_train_nml "$1" "$3" "$4" \
        ", precision = '$6', grad_accum_steps = ${ACCUM:-1}${TRAIN_EXTRA:-}" "${7:-}"
    mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
}

# losses A B TOL: the 10 step losses of run A within TOL (relative) of run B's, all finite
losses() {
    grep -o '"loss": [^,]*' "$TMP/$1/metrics.jsonl" | sed 's/"loss": //' >"$TMP/loss-$1"
    grep -o '"loss": [^,]*' "$TMP/$2/metrics.jsonl" | sed 's/"loss": //' >"$TMP/loss-$2"
    paste "$TMP/loss-$1" "$TMP/loss-$2" | awk -v tol="$3" -v a="$1" -v b="$2" '
        { n++; d = $1 - $2; if (d < 0) d = -d; r = $2 < 0 ? -$2 : $2; rel = d / (r > 0 ? r : 1e-30)
          if (rel > worst) worst = rel
          if ($1 < 0 || $2 < 0 || rel > tol) { bad = 1; printf "step %d: %s %s, %s %s\n", n, a, $1, b, $2 } }
        END { printf "losses %s vs %s: %d steps, worst relative difference %.3g (tolerance %s)\n", a, b, n, worst, tol
              exit (bad || n != 10) }' || fail "losses of $1 and $2 differ (see above)"
}

# weights A B TOL: final weights and EMA of run A within TOL of run B's (overall relative norm)
weights() {
    for f in unet_final unet_ema; do
        run "cmp-$1-$2-$f" "$COMPARE" "$TMP/$1/$f.safetensors" "$TMP/$2/$f.safetensors" "$3"
        echo "$f $1 vs $2: $(cat "$TMP/cmp-$1-$2-$f.out" "$TMP/cmp-$1-$2-$f.err")"
        [ "$RC" = 0 ] || fail "$f of $1 and $2 differ by more than $3"
    done
}

# identical A B: byte-identical weight files
identical() {
    for f in unet_final unet_ema; do
        cmp -s "$TMP/$1/$f.safetensors" "$TMP/$2/$f.safetensors" || fail "$3: $f differs"
    done
    echo "ok: $3"
}

# 1. the GPU against the CPU, one rank, fp32
train cpu1 1 8 none cpu fp32
expect_rc cpu1 0
train gpu1 1 8 none cuda fp32
expect_rc gpu1 0
expect_in gpu1 out "compute: CUDA"
expect_in gpu1 out "on the GPU (one rank"
expect_in gpu1 out "(0 skipped: non-finite)"
losses gpu1 cpu1 1e-4
weights gpu1 cpu1 1e-3
# the stream clock: each step's compute_s is the GPU's time of its forward and backward (CUDA
# events), above zero and within the step; the summary gives its share by the GPU's clock
expect_in gpu1 out "(the GPU's clock;"
awk '/"loss"/ { match($0, /"compute_s": [0-9.e+-]+/); c = substr($0, RSTART + 13, RLENGTH - 13)
        match($0, /"step_s": [0-9.e+-]+/); s = substr($0, RSTART + 10, RLENGTH - 10)
        if (!(c > 0 && c <= s)) bad++; n++ }
    END { exit !(n == 10 && bad == 0) }' "$TMP/gpu1/metrics.jsonl" ||
    fail "gpu1: a step's compute_s not in (0, step_s]: $(grep -o '"step_s": [^}]*' "$TMP/gpu1/metrics.jsonl" | head -3)"
echo "ok: gpu1: compute_s in (0, step_s] on every step line"

# 2. repeatable, and the host path's optimizer equals the device path's
train gpu1b 1 8 none cuda fp32
expect_rc gpu1b 0
identical gpu1 gpu1b "the GPU run repeated gives the same weights"
SDTRAIN_GPU_COMM=host train gpu1host 1 8 none cuda fp32
expect_rc gpu1host 0
expect_in gpu1host out "on the host"
identical gpu1 gpu1host "host path == device path (one rank)"

# 3. bf16 against fp32
train bf16 1 8 none cuda bf16
expect_rc bf16 0
expect_in bf16 out "precision bf16"
expect_in bf16 out "(0 skipped: non-finite)"
losses bf16 gpu1 5e-2
weights bf16 gpu1 1e-2

# 4. two ranks on one GPU through the host: DDP == ZeRO-2, and the same training as one rank
SDTRAIN_GPU_COMM=host train hddp2 2 4 none cuda fp32
expect_rc hddp2 0
expect_in hddp2 out "SDTRAIN_GPU_COMM=host"
SDTRAIN_GPU_COMM=host train hzero2 2 4 shard_grad_op cuda fp32
expect_rc hzero2 0
identical hddp2 hzero2 "two ranks, host path: DDP == ZeRO-2"
losses hddp2 gpu1 1e-4
weights hddp2 gpu1 1e-3
# a compute straggler on the GPU: rank 1's forward 700 ms late at every step (test hook; its GPU
# idles between the stream marks) is named for its compute at both progress lines; same bits
SDTRAIN_TEST_COMPUTE_DELAY=1:700 SDTRAIN_GPU_COMM=host train hslow 2 4 none cuda fp32
expect_rc hslow 0
expect_in hslow err "steps 1-5: rank 1 computed"
expect_in hslow err "steps 6-10: rank 1 computed"
identical hddp2 hslow "two ranks, host path, rank 1 late: the same weights"

# gradient accumulation on the GPU: 1 rank x 4 x 2 micro-batches trains like 1 x 8
ACCUM=2
train acc1 1 4 none cuda fp32
ACCUM=1
expect_rc acc1 0
losses acc1 gpu1 1e-4
weights acc1 gpu1 1e-3

# the gradients reduced bucket by bucket during the backward (grad_reduce = 'overlap'): NCCL
# with one rank, on the communicator's own stream after events on the backend's: the same files
# as after the backward, DDP and ZeRO-2, and with micro-batches
TRAIN_EXTRA=", grad_reduce = 'overlap', grad_bucket_mb = 0.02"
train ov1 1 8 none cuda fp32
expect_rc ov1 0
expect_in ov1 out "gradient reduction: overlapped with the backward"
expect_in ov1 out "NCCL on a stream of its own"
identical gpu1 ov1 "grad_reduce = 'overlap', one rank, DDP: the bits of the reduction after"
train ovz1 1 8 shard_grad_op cuda fp32
expect_rc ovz1 0
identical gpu1 ovz1 "grad_reduce = 'overlap', one rank, ZeRO-2: the bits of DDP"
# SDTRAIN_CUDA_SYNC=1 (debugging) waits for every op and every NCCL call at once: the same bits
export SDTRAIN_CUDA_SYNC=1
train ovsync1 1 8 shard_grad_op cuda fp32
unset SDTRAIN_CUDA_SYNC
expect_rc ovsync1 0
identical gpu1 ovsync1 "SDTRAIN_CUDA_SYNC=1 with NCCL on its own stream: the same bits"
ACCUM=2
train ovacc1 1 4 none cuda fp32
ACCUM=1
expect_rc ovacc1 0
identical acc1 ovacc1 "grad_reduce = 'overlap' with 2 micro-batches: the bits of the reduction after"
# the watch over the GPU waits while an NCCL communicator lives: a limit of 1 ns ends the job at
# the first wait the GPU is not done with, with the message, instead of a hang
export SDTRAIN_NCCL_TIMEOUT=1e-9
train ovto 1 8 none cuda fp32
unset SDTRAIN_NCCL_TIMEOUT
[ "$RC" != 0 ] || fail "ovto: SDTRAIN_NCCL_TIMEOUT=0.00001 did not end the run"
expect_in ovto err "waiting for the GPU timed out"
expect_in ovto err "SDTRAIN_NCCL_TIMEOUT"
TRAIN_EXTRA=

# a NaN written into the first micro-batch's loss gradient on the GPU (2 micro-batches): the
# step is skipped (the device path's non-finite check), counted, training goes on
ACCUM=2
SDTRAIN_FAULT=nan:rank=0:step=3 train nan1 1 4 none cuda fp32
ACCUM=1
expect_rc nan1 0
expect_in nan1 err "non-finite loss or gradients"
expect_in nan1 out "(1 skipped: non-finite)"
grep -q '"skipped": 1' "$TMP/nan1/metrics.jsonl" || fail "GPU nan: skipped count not in metrics"

if [ "${ngpus:-1}" -ge 2 ]; then
    # NCCL: one GPU per rank
    SDTRAIN_GPU_COMM=device train nddp2 2 4 none cuda fp32
    expect_rc nddp2 0
    expect_in nddp2 out "on the GPU (NCCL)"
    SDTRAIN_GPU_COMM=device train nzero2 2 4 shard_grad_op cuda fp32
    expect_rc nzero2 0
    losses nddp2 gpu1 1e-4
    losses nzero2 gpu1 1e-4
    weights nddp2 gpu1 1e-3
    weights nzero2 gpu1 1e-3
    # several ranks reduce during the backward by default; after it, the same training
    expect_in nzero2 out "gradient reduction: overlapped with the backward, and the parameters' all-gather with the next forward"
    TRAIN_EXTRA=", grad_reduce = 'after_backward'"
    SDTRAIN_GPU_COMM=device train nzero2a 2 4 shard_grad_op cuda fp32
    TRAIN_EXTRA=
    expect_rc nzero2a 0
    expect_not_in nzero2a out "gradient reduction: overlapped"
    losses nzero2a nzero2 1e-5
    weights nzero2a nzero2 1e-5
    # bf16 ZeRO-2: the ranks all-gather the bf16 compute copy, the fp32 master shards only for
    # the checkpoints (every 4 steps) and the final weights: close to one bf16 rank
    SDTRAIN_GPU_COMM=device train nzero2bf 2 4 shard_grad_op cuda bf16 \
        "&checkpoint every_n_steps = 4 /"
    expect_rc nzero2bf 0
    expect_in nzero2bf out "each rank holds its shard of the fp32 master"
    losses nzero2bf bf16 5e-2
    weights nzero2bf bf16 1e-2
    # the same after the backward: whole reduce-scatter and all-gather instead of the buckets
    # (reduced to their owners, broadcast ahead of the forward): the order of the fp32 sums
    # differs, nothing else
    TRAIN_EXTRA=", grad_reduce = 'after_backward'"
    SDTRAIN_GPU_COMM=device train nzero2bfa 2 4 shard_grad_op cuda bf16 \
        "&checkpoint every_n_steps = 4 /"
    TRAIN_EXTRA=
    expect_rc nzero2bfa 0
    losses nzero2bfa nzero2bf 1e-2
    weights nzero2bfa nzero2bf 1e-3
else
    # 5. NCCL cannot put two ranks on one GPU: a clear error on every rank, no hang
    SDTRAIN_GPU_COMM=device train dev2 2 4 shard_grad_op cuda fp32
    expect_rc dev2 2
    expect_in dev2 err "SDTRAIN_GPU_COMM=device with 2 training ranks needs NCCL"
    expect_count dev2 err "sdtrain:" 1
fi
# 6. checkpoint and resume on the GPU: the device path (moments and EMA on the GPU, written
#    from there through the host) and the host path
for p in device host; do
    SDTRAIN_GPU_COMM=$p SDTRAIN_FAULT=kill:rank=0:step=7 \
        train "ck$p" 1 8 none cuda fp32 "&checkpoint every_n_steps = 4 /"
    [ "$RC" != 0 ] || fail "ck$p: the killed run exited 0"
    SDTRAIN_GPU_COMM=$p train "ck$p" 1 8 none cuda fp32 "&checkpoint every_n_steps = 4 /"
    expect_rc "ck$p" 0
    expect_in "ck$p" out "resuming from"
    identical gpu1 "ck$p" "GPU $p path: killed at step 7 and resumed == uninterrupted"
done
# background checkpoints on the device path (each rank's parts downloaded straight into the
# writer's page-locked copy): the training unchanged, the same checkpoint data as written at once
# (a block at a time)
SDTRAIN_GPU_COMM=device train ckbg 1 8 none cuda fp32 \
    "&checkpoint every_n_steps = 4, async = .true. /"
expect_rc ckbg 0
expect_in ckbg out "of page-locked host memory on rank 0"
expect_in ckbg out "checkpoint of step 4 written to $TMP/ckbg/checkpoints/step-00000004 in the background"
identical gpu1 ckbg "GPU background checkpoints: the training unchanged"
for s in 4 8; do
    d=$(printf 'step-%08d' "$s")
    a=$(sed -n '/"checksums"/,/}/p' "$TMP/ckdevice/checkpoints/$d/manifest.json")
    b=$(sed -n '/"checksums"/,/}/p' "$TMP/ckbg/checkpoints/$d/manifest.json")
    [ -n "$a" ] && [ "$a" = "$b" ] ||
        fail "GPU background checkpoint $d: other data than written at once"
done
echo "ok: GPU background checkpoints hold the data of checkpoints written at once"
# 7. images during training (&sample every_n_steps) on the GPU, beside the training state: the
#    weights those of the run without them, the images mode 'sample''s from the same checkpoint
train gpuimg 1 8 none cuda fp32 "&checkpoint every_n_steps = 5 /
&sample prompts = 'a red square', 'a blue circle', num_steps = 3, guidance_scale = 2.0,
        every_n_steps = 5 /"
expect_rc gpuimg 0
expect_in gpuimg out "step 5: images of &sample prompts in $TMP/gpuimg/samples/step-00000005/samples"
expect_in gpuimg out "step 10: images of &sample prompts"
identical gpu1 gpuimg "images during training on the GPU: the training's weights unchanged"
mpi gpuimg-s 1 "$SDTRAIN" "$TMP/gpuimg.nml" --set run.mode=sample --set "run.output_dir='$TMP/gpuimg-s'" \
    --set "sample.checkpoint='$TMP/gpuimg/checkpoints/step-00000005'"
expect_rc gpuimg-s 0
for p in 0-0 1-0; do
    cmp -s "$TMP/gpuimg-s/samples/$p.png" "$TMP/gpuimg/samples/step-00000005/samples/$p.png" ||
        fail "GPU images during training: $p.png is not mode 'sample''s"
done
echo "ok: images during training on the GPU: mode 'sample''s PNG bytes"
pass "mode = 'train' on the GPU"
