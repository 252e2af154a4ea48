#!/bin/sh
# The GPU's device path (doc/training.md "On the GPU": NCCL, equal padded shards, the optimizer on
# the GPU over this rank's range, ZeRO-2's all-gathers of the parameters and of the EMA at the end,
# checkpoints written from its buffers, resumes uploaded into them a block at a time) emulated on
# the CPU with several ranks (SDTRAIN_EMULATE_DEVICE_PATH=1: the same code with MPI in place of
# NCCL and the CPU optimizer in place of the CUDA kernels). CI has no GPU and the GPU sessions
# have one, so this is where the multi-rank bookkeeping of that path is tested: against the CPU's
# host path, DDP == ZeRO-2, gradient buckets during the backward == after it, accumulation, a NaN,
# kill + resume (blocks of a few thousand floats), and resumes of its checkpoint on the host path
# with another rank count and on the device path with DDP, and a damaged one refused.
. "$top_srcdir/tests/lib.sh"
need_mpi
COMPARE="${top_builddir:-.}/tests/mpi/st_compare"

tiny_shards 48 2 # demo images encoded on the CPU into $TMP/shards

# train NAME NP BATCH SHARDING [TRAIN-KEYS] [GROUPS]: 10 steps on the CPU (tiny_train_nml);
# EMU=1 emulates the device path
train() {
    tiny_train_nml "$1" "$3" "$4" "${5:-}" "${6:-}"
    if [ "${EMU:-0}" = 1 ]; then
        SDTRAIN_EMULATE_DEVICE_PATH=1 mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
    else
        mpi "$1" "$2" "$SDTRAIN" "$TMP/$1.nml"
    fi
}
same() { # same A B WHAT: byte-identical final weights and EMA
    for f in unet_final unet_ema; do
        cmp -s "$TMP/$1/$f.safetensors" "$TMP/$2/$f.safetensors" || fail "$3: $f differs"
    done
    echo "ok: $3"
}
same_losses() { # same_losses A B WHAT: the same training and validation losses, step by step
    grep -o '"[a-z_]*loss": [^,}]*' "$TMP/$1/metrics.jsonl" >"$TMP/$1.losses"
    grep -o '"[a-z_]*loss": [^,}]*' "$TMP/$2/metrics.jsonl" >"$TMP/$2.losses"
    grep -q val_loss "$TMP/$1.losses" || fail "$3: no validation loss in $1/metrics.jsonl"
    cmp -s "$TMP/$1.losses" "$TMP/$2.losses" || { diff "$TMP/$1.losses" "$TMP/$2.losses" | head;
        fail "$3: the losses differ"; }
    echo "ok: $3 (losses)"
}
close() { # close A B WHAT: final weights and EMA within 1e-6
    for f in unet_final unet_ema; do
        run "cmp-$1-$2-$f" "$COMPARE" "$TMP/$1/$f.safetensors" "$TMP/$2/$f.safetensors" 1e-6
        [ "$RC" = 0 ] || { cat "$TMP/cmp-$1-$2-$f.out" "$TMP/cmp-$1-$2-$f.err"; fail "$3: $f"; }
    done
    echo "ok: $3"
}

# the CPU's host path: the reference
train cpu1 1 8 none
expect_rc cpu1 0
train cpu2 2 4 none
expect_rc cpu2 0
train cpu3 3 4 none
expect_rc cpu3 0

# one rank: the device path's buffers and optimizer give the CPU's bits
EMU=1 train e1 1 8 none
expect_rc e1 0
expect_in e1 out "emulating the GPU's device path"
expect_in e1 out "(0 skipped: non-finite)"
same e1 cpu1 "one rank: device path == host path"

# two and three ranks: equal padded shards, NCCL's calls done by MPI; DDP == ZeRO-2 (the EMA
# of ZeRO-2 gathered through the spent gradient buffer), the same training as the host path;
# by default the buckets are reduced during the backward and ZeRO-2's parameters gathered bucket by
# bucket as the next forward asks for them (until then the emulation holds NaN where other ranks'
# parameters go, so a block read before it was asked for would show); 'after_backward' gives the
# same bits, validation losses (read after an update) included
# ZeRO-2's runs have rank 1's forward start 600 ms late at every step (a test hook): its
# compute is named at both progress lines, and no other rank's, although the emulation's
# bucket reductions and parameter broadcasts inside the others' forward and backward wait for it
# there (they are blocking MPI calls, taken out of the compute's time)
for np in 2 3; do
    bs=4
    EMU=1 train "ed$np" "$np" "$bs" none
    expect_rc "ed$np" 0
    expect_in "ed$np" out "gradient reduction: overlapped with the backward"
    expect_not_in "ed$np" err "the others wait for it"
    SDTRAIN_TEST_COMPUTE_DELAY=1:600 EMU=1 train "ez$np" "$np" "$bs" shard_grad_op
    expect_rc "ez$np" 0
    expect_in "ez$np" out "and the parameters' all-gather with the next forward"
    expect_in "ez$np" err "steps 1-5: rank 1 computed"
    expect_in "ez$np" err "steps 6-10: rank 1 computed"
    expect_not_in "ez$np" err "for its inputs"
    same "ed$np" "ez$np" "$np ranks, device path: DDP == ZeRO-2"
    same_losses "ed$np" "ez$np" "$np ranks, device path: DDP == ZeRO-2"
    EMU=1 train "eza$np" "$np" "$bs" shard_grad_op ", grad_reduce = 'after_backward'"
    expect_rc "eza$np" 0
    expect_not_in "eza$np" out "overlapped"
    same "ez$np" "eza$np" "$np ranks, device path, ZeRO-2: buckets during the backward == after it"
    same_losses "ez$np" "eza$np" "$np ranks, device path, ZeRO-2: overlapped == after the backward"
done
close ed2 cpu2 "2 ranks: device path within 1e-6 of the host path"
# memory: ZeRO-2 keeps its shard of the master and of the optimizer state (the emulation, like
# bf16 on a GPU, keeps a master apart from the compute copy): less than DDP's whole buffers
mem() { sed -n 's/.*memory of training rank 0: \([0-9.]*\) MB of parameters.*/\1/p' "$TMP/$1.out"; }
for np in 2 3; do
    d=$(mem "ed$np")
    z=$(mem "ez$np")
    [ -n "$d" ] && [ -n "$z" ] || fail "no memory line in ed$np / ez$np"
    # DDP: parameters (= master), gradients, m, v, EMA: 5 buffers; ZeRO-2: parameters and
    # gradients whole, master, m, v, EMA a 1/np shard each: (2 + 4 / np) buffers
    awk -v d="$d" -v z="$z" -v np="$np" 'BEGIN { exit !(z <= d * (2 + 4.0 / np) / 5 * 1.02 + 0.1) }' ||
        fail "$np ranks: ZeRO-2 holds $z MB, DDP $d MB: not the sharded share"
    echo "ok: $np ranks: device-path state per rank, DDP $d MB, ZeRO-2 $z MB"
done
expect_in ez2 out "device-path memory, rank 0"
# without validation, with checkpoints after steps 3, 6 and 9: what the final weights and the
# checkpoints read after an update must wait for the gather (ZeRO-2, overlapped)
VAL_EVERY=0 EMU=1 train eznv 2 4 shard_grad_op "" "&checkpoint every_n_steps = 3 /"
expect_rc eznv 0
same eznv eza2 "device path, ZeRO-2 overlapped, no validation, checkpoints: the same weights"
close ez3 cpu3 "3 ranks: device path within 1e-6 of the host path"

# gradient accumulation (2 ranks x 2 x 2, ZeRO-2): the same training as 2 x 4
EMU=1 train eacc 2 2 shard_grad_op ", grad_accum_steps = 2, grad_bucket_mb = 0.02"
expect_rc eacc 0
close eacc cpu2 "device path, 2 x 2 x 2 micro-batches, small buckets: as 2 x 4"

# a NaN on rank 1 at step 3: the step is skipped on every rank
SDTRAIN_FAULT=nan:rank=1:step=3 EMU=1 train enan 2 4 shard_grad_op
expect_rc enan 0
expect_in enan out "(1 skipped: non-finite)"

# killed at step 7 with a checkpoint of step 4, resumed: the uninterrupted run's bits. The
# checkpoints move the device's buffers a block at a time (64 MiB; here 4099 floats, so that the
# tiny model's state crosses many blocks and ends in a part of one): written a block downloaded
# at a time, and read back a block uploaded at a time into the moments and the EMA
export SDTRAIN_TEST_CKPT_BLOCK_FLOATS=4099
SDTRAIN_FAULT=kill:rank=1:step=7 EMU=1 train ekill 2 4 shard_grad_op "" "&checkpoint every_n_steps = 4 /"
[ "$RC" != 0 ] || fail "ekill: the killed run exited 0"
[ "$(cat "$TMP/ekill/checkpoints/latest")" = step-00000004 ] || fail "ekill: no checkpoint of step 4"
cp -r "$TMP/ekill/checkpoints" "$TMP/ckpt4"
EMU=1 train ekill 2 4 shard_grad_op "" "&checkpoint every_n_steps = 4 /"
expect_rc ekill 0
expect_in ekill out "resuming from"
same ekill ed2 "device path, ZeRO-2: killed at step 7 and resumed == uninterrupted"
# its checkpoint of step 4 (padding not stored) on the host path with 1 rank x 8 and with the
# device path on 4 ranks x 2: within 1e-6 of the uninterrupted run
train hres 1 8 none "" "&checkpoint resume = '$TMP/ckpt4/step-00000004' /"
expect_rc hres 0
expect_in hres out "written by 2 rank(s) with sharding 'shard_grad_op'"
close hres ed2 "a device-path checkpoint resumed on the host path, 1 rank"
EMU=1 train eres4 4 2 shard_grad_op "" "&checkpoint resume = '$TMP/ckpt4/step-00000004' /"
expect_rc eres4 0
close eres4 ed2 "a device-path checkpoint resumed on the device path, 4 ranks"
# DDP on the device path: every rank holds the whole moments and uploads them all, each rank's
# checksum counting its own disjoint part of them
EMU=1 train eresd 2 4 none "" "&checkpoint resume = '$TMP/ckpt4/step-00000004' /"
expect_rc eresd 0
close eresd ed2 "a ZeRO-2 device-path checkpoint resumed with DDP on the device path, 2 ranks"
# a bit changed in the moments on disk: the blockwise checksum finds it, naming the dataset
cp -r "$TMP/ckpt4/step-00000004" "$TMP/ckflip"
flip_byte "$TMP/ckflip/state.h5" adam_v 20002
EMU=1 train eflip 2 4 shard_grad_op "" "&checkpoint resume = '$TMP/ckflip' /"
[ "$RC" != 0 ] || fail "eflip: a damaged checkpoint resumed"
expect_in eflip err "fails its checksum"
[ -z "$dataset" ] || expect_in eflip err "dataset '$dataset'"
unset SDTRAIN_TEST_CKPT_BLOCK_FLOATS
pass "the device path, emulated on the CPU with 1-4 ranks"

# a tiny grad_bucket_mb on a wider model is raised so that a step cuts about 1024 buckets
STEPS=2 VAL_EVERY=0 tiny_train_nml ecap 4 shard_grad_op ", grad_reduce = 'overlap', grad_bucket_mb = 0.001"
SDTRAIN_EMULATE_DEVICE_PATH=1 mpi ecap 2 "$SDTRAIN" "$TMP/ecap.nml" --set "model.block_out_channels=32,64"
expect_rc ecap 0
expect_in ecap err "&train grad_bucket_mb = 0.001 would cut the 795264 gradients into more than 1024 buckets"
n_b=$(sed -n 's/.*overlapped with the backward.*, \([0-9]*\) buckets of up to.*/\1/p' "$TMP/ecap.out")
[ -n "$n_b" ] && [ "$n_b" -le 1026 ] && [ "$n_b" -ge 900 ] || fail "ecap: $n_b buckets"
pass "grad_bucket_mb raised to about 1024 buckets ($n_b)"

# training ranks on different kinds of device (device = 'auto' left one on the CPU): a clear
# error on every rank, not a hang in the GPU path's collectives (Open MPI's MPMD syntax)
case "$MPIEXEC" in
*mpirun* | *mpiexec*)
    tiny_train_nml mixed 4 none
    # shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
    run mixed $MPIEXEC $MPIEXEC_NP 1 env SDTRAIN_EMULATE_DEVICE_PATH=1 "$SDTRAIN" "$TMP/mixed.nml" : \
        $MPIEXEC_NP 1 "$SDTRAIN" "$TMP/mixed.nml"
    expect_rc mixed 2
    expect_count mixed err "training rank 1 computes on the CPU (its device resolved to the CPU) while other training ranks use GPUs" 1
    pass "training ranks on a GPU and on the CPU: one error, exit 2"
    ;;
esac
