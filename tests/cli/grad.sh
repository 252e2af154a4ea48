#!/bin/sh
# sdtool grad: runs on a golden batch (parity with PyTorch is tests/unit/test_grad.c), and bad
# batches, snapshots and usage get clear messages and the documented exit status.
. "$top_srcdir/tests/lib.sh"
MODELS="$top_srcdir/tests/data/models"
GRAD="$top_srcdir/tests/data/grad"

run help "$SDTOOL" grad --help
expect_rc help 0
expect_in help out "usage: sdtool grad --snapshot DIR --batch BATCH.safetensors"

run ok "$SDTOOL" grad --snapshot "$MODELS/odd-train" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/g.safetensors"
expect_rc ok 0
expect_in ok out "grad: batch 2, latent 4x6x10"
[ -s "$TMP/g.safetensors" ] || fail "ok: no output file"

# the AVX2 twins of the CPU kernels (softmax, exp) give the bits of the baseline SSE code
run base env SDTRAIN_CPU_ISA=baseline "$SDTOOL" grad --snapshot "$MODELS/odd-train" \
    --batch "$GRAD/odd-train/batch.safetensors" --out "$TMP/g-base.safetensors"
expect_rc base 0
cmp -s "$TMP/g.safetensors" "$TMP/g-base.safetensors" ||
    fail "SDTRAIN_CPU_ISA=baseline changed the gradients"

run noargs "$SDTOOL" grad
expect_rc noargs 2
expect_in noargs err "--snapshot, --batch and --out are required"
run badpred "$SDTOOL" grad --snapshot "$MODELS/odd-train" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/x.safetensors" --prediction-type sample
expect_rc badpred 2
expect_in badpred err "expected epsilon or v_prediction"
run nofile "$SDTOOL" grad --snapshot "$MODELS/odd-train" --batch "$TMP/none.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc nofile 2
expect_in nofile err "none.safetensors"
# the odd snapshot predicts 3 channels from 5: no MSE against the noise
run inout "$SDTOOL" grad --snapshot "$MODELS/odd" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc inout 2
expect_in inout err "in_channels == out_channels"
# a batch without noise
run nonoise "$SDTOOL" grad --snapshot "$MODELS/odd-train" --batch "$MODELS/tiny-sd2/golden/unet.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc nonoise 2
expect_in nonoise err "no tensor 'latents'"
run nosnap "$SDTOOL" grad --snapshot "$TMP/nowhere" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc nosnap 1
run badout "$SDTOOL" grad --snapshot "$MODELS/odd-train" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/no/such/dir/x.safetensors"
expect_rc badout 1
# the snapshot's scheduler_config.json: each key of its JSON type, named when not
mkdir -p "$TMP/snap/scheduler"
for part in "$MODELS/odd-train"/*; do ln -s "$part" "$TMP/snap/$(basename "$part")"; done
rm -f "$TMP/snap/scheduler"
mkdir -p "$TMP/snap/scheduler"
printf '{"beta_schedule": "scaled_linear", "num_train_timesteps": "1000"}\n' \
    >"$TMP/snap/scheduler/scheduler_config.json"
run badsched "$SDTOOL" grad --snapshot "$TMP/snap" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc badsched 2
expect_in badsched err "scheduler_config.json: 'num_train_timesteps' must be an integer"
printf '{"beta_schedule": "scaled_linear",\n "beta_end": }\n' >"$TMP/snap/scheduler/scheduler_config.json"
run badjson "$SDTOOL" grad --snapshot "$TMP/snap" --batch "$GRAD/odd-train/batch.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc badjson 2
expect_in badjson err "scheduler_config.json:2:14: invalid JSON"
pass "sdtool grad"
