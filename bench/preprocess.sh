#!/usr/bin/env bash
# Preprocessing throughput on the CPU with the demo's tiny encoders: images/s with 1 and 2
# ranks and where the time goes (read, decode, transform, tokenize, encode, write; summed over
# ranks). Usage: bench/preprocess.sh [BUILD_DIR] [SAMPLES] [RESOLUTION]
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build/cpu}
n=${2:-512}
res=${3:-64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
launch=(mpirun -q --oversubscribe)
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMP_WAIT_POLICY=passive

"$build/sdtool" make-demo-data "$work/data" --count "$n" >/dev/null
printf '%-6s %-8s %-10s %s\n' ranks images images/s "time by stage"
for np in 1 2; do
    out=$("${launch[@]}" -np "$np" "$build/sdtrain" "$top/inputs/demo.nml" \
        --set run.mode=process --set run.output_dir="$work/run$np" --set data.input="$work/data" \
        --set data.shard_dir="$work/shards$np" --set model.resolution="$res" \
        --set model.tokenizer="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz" \
        --set data.samples_per_shard=128 2>&1)
    line=$(grep '^throughput:' <<<"$out")
    rate=$(sed -n 's/^throughput: \([0-9.]*\) images.*/\1/p' <<<"$line")
    shares=$(sed -n 's/.*time by stage: //p' <<<"$line")
    printf '%-6s %-8s %-10s %s\n' "$np" "$n" "$rate" "$shares"
done
