#!/usr/bin/env bash
# Preprocessing throughput (mode 'process'): images/s for several ranks x decode-threads layouts,
# the rate once set up (encoder weights loaded, device ready: what a long run approaches) and the
# set-up's seconds, the rate of the CPU stages alone (read, decode, transform, tokenize: what
# feeds an encoder), of the encoders and of the shard writes (per rank; by default the writes run
# beside the encoding, OVERLAP=0 puts them between encodings), and where the time goes (summed
# over ranks and threads).
# Usage: [MAX_SIDE=PX] [DEVICE=cpu|cuda] [MODEL=demo|sd2] [BATCH=N] [OVERLAP=1|0] [SHARD=N] \
#          [LAUNCH="mpirun ..."] bench/preprocess.sh [BUILD_DIR] [SAMPLES] [RESOLUTION] [LAYOUTS]
#   LAYOUTS: space-separated RANKSxTHREADS (default "1x1 1x2 2x1")
#   MAX_SIDE: largest side of the generated images (sdtool make-demo-data --max-side; 128)
#   DEVICE: where the encoders run (cpu; cuda: bf16 encoders on the GPU, ranks share it)
#   MODEL: demo = the demo's tiny encoders (default); sd2 = SD2's VAE encoder and OpenCLIP
#          ViT-H text encoder shapes with random weights (the cost of the real models)
#   BATCH: &data encode_batch_size (default 8; 32 suits a GPU)
#   OVERLAP: 1 (default) writes each shard beside the next one's encoding, 0 (or false, no, off)
#            between encodings
#   SHARD: &data samples_per_shard (default 128)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build/cpu}
n=${2:-512}
res=${3:-64}
layouts=${4:-1x1 1x2 2x1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# threads of a rank may use every core
case "${OVERLAP:-1}" in
0 | false | no | off | .false.) overlap=.false. ;;
*) overlap=.true. ;;
esac
read -r -a launch <<<"${LAUNCH:-mpirun -q --oversubscribe --bind-to none}"
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=passive
model=()
if [ "${MODEL:-demo}" = sd2 ]; then
    model=(--set model.vae_block_out_channels=128,256,512,512 --set model.norm_num_groups=32
           --set model.text_hidden_size=1024 --set model.text_layers=23 --set model.text_heads=16
           --set model.cross_attention_dim=1024)
fi

"$build/sdtool" make-demo-data "$work/data" --count "$n" --max-side "${MAX_SIDE:-128}" >/dev/null
echo "# $n images of up to ${MAX_SIDE:-128} px -> $res px, encoders ${MODEL:-demo} on ${DEVICE:-cpu}, batch ${BATCH:-8}, shards of ${SHARD:-128}, writes $([ "$overlap" = .false. ] && echo "between encodings" || echo "beside the encoding")"
printf '%-7s %-8s %-10s %-13s %-10s %-16s %-14s %-14s %s\n' layout images images/s "after set-up" \
    "set-up s" "CPU stages/rank" "encode/rank" "writes/rank" "time by stage"
run=0
for l in $layouts; do
    run=$((run + 1))
    np=${l%x*}
    th=${l#*x}
    out=$(OMP_NUM_THREADS=$th "${launch[@]}" -np "$np" "$build/sdtrain" "$top/inputs/demo.nml" \
        --set run.mode=process --set run.output_dir="$work/run$run" --set data.input="$work/data" \
        --set data.shard_dir="$work/shards$run" --set model.resolution="$res" \
        --set model.tokenizer="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz" \
        --set run.device="${DEVICE:-cpu}" --set data.encode_batch_size="${BATCH:-8}" \
        --set data.overlap_writes="$overlap" \
        "${model[@]}" --set data.samples_per_shard="${SHARD:-128}" 2>&1) || { echo "$out" | tail -20; exit 1; }
    line=$(grep '^throughput:' <<<"$out")
    rate=$(sed -n 's/^throughput: \([0-9.]*\) images.*/\1/p' <<<"$line")
    shares=$(sed -n 's/.*time by stage: //p' <<<"$line")
    cpu=$(sed -n 's/^CPU stages (read to tokenize): \([0-9.]*\) .*/\1/p' <<<"$out")
    enc=$(sed -n 's/^CPU stages.*; encode: \([0-9.]*\) .*/\1/p' <<<"$out")
    steady=$(sed -n 's/^after set-up (\([0-9.]*\) s[^)]*): \([0-9.]*\) images.*/\2/p' <<<"$out")
    setup=$(sed -n 's/^after set-up (\([0-9.]*\) s.*/\1/p' <<<"$out")
    wr=$(sed -n 's/^after set-up.*shard writes [a-z ]*: \([0-9.]*\) images.*/\1/p' <<<"$out")
    printf '%-7s %-8s %-10s %-13s %-10s %-16s %-14s %-14s %s\n' "$l" "$n" "$rate" "$steady" "$setup" \
        "$cpu" "$enc" "$wr" "$shares"
done
