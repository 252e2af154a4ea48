#!/usr/bin/env bash
# Preprocessing throughput on the CPU with the demo's tiny encoders: images/s for several
# ranks x decode-threads layouts, the rate of the CPU stages alone (read, decode, transform,
# tokenize: what feeds a GPU encoder) and where the time goes (summed over ranks).
# Usage: [MAX_SIDE=PX] bench/preprocess.sh [BUILD_DIR] [SAMPLES] [RESOLUTION] [LAYOUTS]
#   MAX_SIDE: largest side of the generated images (sdtool make-demo-data --max-side; 128)
#   LAYOUTS: space-separated RANKSxTHREADS (default "1x1 1x2 2x1")
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build/cpu}
n=${2:-512}
res=${3:-64}
layouts=${4:-1x1 1x2 2x1}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=(mpirun -q --oversubscribe --bind-to none) # threads of a rank may use every core
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=passive

"$build/sdtool" make-demo-data "$work/data" --count "$n" --max-side "${MAX_SIDE:-128}" >/dev/null
printf '%-7s %-8s %-10s %-16s %-14s %s\n' layout images images/s "CPU stages/rank" "encode/rank" \
    "time by stage"
run=0
for l in $layouts; do
    run=$((run + 1))
    np=${l%x*}
    th=${l#*x}
    out=$(OMP_NUM_THREADS=$th "${launch[@]}" -np "$np" "$build/sdtrain" "$top/inputs/demo.nml" \
        --set run.mode=process --set run.output_dir="$work/run$run" --set data.input="$work/data" \
        --set data.shard_dir="$work/shards$run" --set model.resolution="$res" \
        --set model.tokenizer="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz" \
        --set data.samples_per_shard=128 2>&1)
    line=$(grep '^throughput:' <<<"$out")
    rate=$(sed -n 's/^throughput: \([0-9.]*\) images.*/\1/p' <<<"$line")
    shares=$(sed -n 's/.*time by stage: //p' <<<"$line")
    cpu=$(sed -n 's/^CPU stages (read to tokenize): \([0-9.]*\) .*/\1/p' <<<"$out")
    enc=$(sed -n 's/^CPU stages.*; encode: \([0-9.]*\) .*/\1/p' <<<"$out")
    printf '%-7s %-8s %-10s %-16s %-14s %s\n' "$l" "$n" "$rate" "$cpu" "$enc" "$shares"
done
