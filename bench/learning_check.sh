#!/usr/bin/env bash
# The learning check of the training issue (a benchmark, not a CI test): on a synthetic captioned
# dataset (sdtool make-demo-data: coloured shapes on coloured backgrounds, captions that say
# which), the tiny demo-shaped U-Net is trained twice with identical settings, once on the true
# captions and once on the same captions shuffled between images. It prints the validation loss
# before training and at the end of each run and checks that
#   1. with true captions the validation loss falls to <= 50% of its initial value, and
#   2. it ends measurably lower with true captions than with shuffled ones (the model uses the
#      text; shuffled captions carry no information about their image).
# The demo encoders are untrained (random weights), which shapes three settings:
#   - latent_sample = .false.: the random VAE's posterior std (~1.1) is larger than the spread
#     of its means (~0.5), so sampled latents would be mostly posterior noise; the mean is used.
#   - latent_scale = 2.0: SD's 0.18215 is for SD's VAE; ~1 / std of these means gives latents of
#     unit variance, as the factor is meant to.
#   - v_prediction: the caption tells what the image is, which matters where the noise hides
#     the image; the epsilon loss barely weighs those timesteps (there both runs end within
#     0.5%), the v loss does.
# Usage: bench/learning_check.sh [BUILD_DIR] [WORK_DIR]
#   (env: NP ranks, STEPS, COUNT samples, PRED prediction type, SCALE latent scale)
# Defaults: build/cpu, runs/learning-check, NP=2, STEPS=2400, COUNT=2048, v_prediction, 2.0.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build/cpu}" && pwd)
work=${2:-$top/runs/learning-check}
NP=${NP:-2}
STEPS=${STEPS:-2400}
COUNT=${COUNT:-2048}
PRED=${PRED:-v_prediction}
SCALE=${SCALE:-2.0}
launch=(mpirun -q --oversubscribe -np "$NP")
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none

rm -rf "$work"
mkdir -p "$work"
"$build/sdtool" make-demo-data "$work/data-true" --count "$COUNT" >/dev/null
# the same images, captions permuted between them with a fixed seed
cp -r "$work/data-true" "$work/data-shuffled"
find "$work/data-true" -name '*.txt' | sort >"$work/txt.list"
while read -r f; do cat "$f"; echo; done <"$work/txt.list" |
    shuf --random-source=<(yes 20261122) >"$work/captions.shuffled"
paste -d '\t' "$work/txt.list" "$work/captions.shuffled" | while IFS=$'\t' read -r f c; do
    printf '%s' "$c" >"${f/data-true/data-shuffled}"
done

tokenizer="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
write_nml() { # write_nml NAME MODE
    cat >"$work/$1-$2.nml" <<EOF2
&run mode = '$2', output_dir = '$work/run-$1', seed = 1234 /
&model resolution = 64, block_out_channels = 32, 64, layers_per_block = 1, attention_head_dim = 8,
       cross_attention_dim = 64, norm_num_groups = 32, latent_channels = 4,
       vae_block_out_channels = 32, 32, 64, 64, text_hidden_size = 64, text_layers = 2,
       text_heads = 4, tokenizer = '$tokenizer' /
&data input = '$work/data-$1', shard_dir = '$work/shards-$1', samples_per_shard = 128,
      val_fraction = 0.1 /
&train max_steps = $STEPS, batch_size_per_rank = $((16 / NP)), learning_rate = 1e-3,
       warmup_steps = 20, sharding = 'shard_grad_op', grad_clip = 1.0, log_every = 100,
       val_every = $((STEPS / 4 > 0 ? STEPS / 4 : 1)), latent_sample = .false., latent_scale = $SCALE /
&diffusion prediction_type = '$PRED', caption_dropout = 0 /
EOF2
}

declare -A init final secs
for c in true shuffled; do
    write_nml "$c" process
    write_nml "$c" train
    "${launch[@]}" "$build/sdtrain" "$work/$c-process.nml" >"$work/$c-process.log" 2>&1
    t0=$(date +%s)
    "${launch[@]}" "$build/sdtrain" "$work/$c-train.nml" >"$work/$c-train.log" 2>&1
    secs[$c]=$(($(date +%s) - t0))
    m="$work/run-$c/metrics.jsonl"
    init[$c]=$(grep '"step": 0, "val_loss"' "$m" | sed 's/.*"val_loss": \([^,]*\),.*/\1/')
    final[$c]=$(grep '"val_loss"' "$m" | tail -n 1 | sed 's/.*"val_loss": \([^,]*\),.*/\1/')
done

printf '\nlearning check: %d samples (10%% held out), %d steps of global batch %d (%d x %d) on %d rank(s)\n' \
    "$COUNT" "$STEPS" $((16 / NP * NP)) "$NP" $((16 / NP)) "$NP"
printf '%-18s %14s %14s %10s %10s\n' captions "val loss t=0" "val loss end" "end/start" "train s"
for c in true shuffled; do
    printf '%-18s %14.6f %14.6f %10.3f %10d\n' "$c" "${init[$c]}" "${final[$c]}" \
        "$(awk -v a="${final[$c]}" -v b="${init[$c]}" 'BEGIN { print a / b }')" "${secs[$c]}"
done
pct=$(awk -v a="${final[true]}" -v b="${init[true]}" 'BEGIN { print 100 * a / b }')
gain=$(awk -v t="${final[true]}" -v s="${final[shuffled]}" 'BEGIN { print 100 * (s - t) / s }')
ok=0
if awk -v p="$pct" 'BEGIN { exit !(p <= 50) }'; then
    printf 'PASS: true captions: validation loss at %.1f%% of its initial value (<= 50%%)\n' "$pct"
else
    printf 'FAIL: true captions: validation loss at %.1f%% of its initial value (> 50%%)\n' "$pct"
    ok=1
fi
if awk -v g="$gain" 'BEGIN { exit !(g > 0) }'; then
    printf 'PASS: true captions end %.1f%% below shuffled captions\n' "$gain"
else
    printf 'FAIL: true captions do not end below shuffled captions (%.1f%%)\n' "$gain"
    ok=1
fi
exit "$ok"
