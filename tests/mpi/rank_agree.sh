#!/bin/sh
# Decisions one rank could take on its own while the others take another (doc/architecture.md,
# "Failure model"): under the failing-disk shim (tests/mpi/eio_preload.so) one rank meets an
# error the others do not, and the job must either agree on it (the same status and one message)
# or not depend on it; never go on with ranks that did different things, never hang.
# (a) mode 'sample': what to sample from (&sample checkpoint, a snapshot's scheduler config) is
#     decided by rank 0 for every rank: a stat that fails on rank 1 alone gave rank 1's images
#     another schedule (exit 0, three of six PNGs other than at -np 1);
# (b) the same for a training output directory: rank 1, not seeing its unet_final.safetensors,
#     took the newest checkpoint of its checkpoints/ instead (here one that does not load, so the
#     job failed on rank 1's choice).
. "$top_srcdir/tests/lib.sh"
need_mpi
need_eio_shim

snap="$top_srcdir/tests/data/models/tiny-sd2"
# same_pngs A B WHAT: the six images of runs A and B (3 prompts x 2) are the same bytes
same_pngs() {
    for p in 0 1 2; do
        for j in 0 1; do
            cmp -s "$TMP/$1/samples/$p-$j.png" "$TMP/$2/samples/$p-$j.png" ||
                fail "sample: $p-$j.png $3"
        done
    done
}

# a snapshot of links to tiny-sd2 whose scheduler config changes the images (v-prediction)
mkdir -p "$TMP/snap-v/scheduler"
for part in unet vae text_encoder model_index.json; do ln -sf "$snap/$part" "$TMP/snap-v/$part"; done
printf '{"_class_name": "PNDMScheduler", "num_train_timesteps": 1000, "beta_start": 0.00085,
 "beta_end": 0.012, "beta_schedule": "scaled_linear", "set_alpha_to_one": false,
 "skip_prk_steps": true, "steps_offset": 1, "clip_sample": false, "prediction_type": "v_prediction"}\n' \
    >"$TMP/snap-v/scheduler/scheduler_config.json"
tiny_sample_nml v1 ddim ", checkpoint = '$TMP/snap-v'"
mpi v1 1 "$SDTRAIN" "$TMP/v1.nml"
expect_rc v1 0
tiny_sample_nml v2 ddim ", checkpoint = '$TMP/snap-v'"
SD_EIO_RANK=1 SD_EIO_OPS=stat SD_EIO_PATH=/scheduler_config.json SD_EIO_ERRNO=5 \
    LD_PRELOAD="$PRELOAD" mpi v2 2 "$SDTRAIN" "$TMP/v2.nml"
if [ "$RC" = 0 ]; then
    same_pngs v1 v2 "made with another schedule when rank 1 could not stat the scheduler config"
else
    expect_count v2 err "sdtrain: mode 'sample':" 1
fi
pass "sample: the scheduler config is rank 0's decision"

# (b) a training output directory with final weights and a checkpoint root beside them
mkdir -p "$TMP/trainout/checkpoints/step-00000001"
cp "$snap/unet/diffusion_pytorch_model.safetensors" "$TMP/trainout/unet_final.safetensors"
echo step-00000001 >"$TMP/trainout/checkpoints/latest"
echo '{}' >"$TMP/trainout/checkpoints/step-00000001/manifest.json"
tiny_sample_nml t1 ddim ", checkpoint = '$TMP/trainout'"
mpi t1 1 "$SDTRAIN" "$TMP/t1.nml"
expect_rc t1 0
expect_in t1 out "U-Net $TMP/trainout/unet_final.safetensors"
tiny_sample_nml t2 ddim ", checkpoint = '$TMP/trainout'"
SD_EIO_RANK=1 SD_EIO_OPS=stat SD_EIO_PATH=/unet_final.safetensors SD_EIO_ERRNO=5 \
    LD_PRELOAD="$PRELOAD" mpi t2 2 "$SDTRAIN" "$TMP/t2.nml"
expect_rc t2 0
same_pngs t1 t2 "differs when rank 1 cannot stat unet_final.safetensors"
pass "sample: the U-Net's source is rank 0's decision"
