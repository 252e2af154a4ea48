#!/usr/bin/env bash
# Weak scaling of mode = 'train' on this machine: the same per-rank batch at -np 1, 2, ...
# (global batch grows with the ranks), DDP and ZeRO-2, on demo-shaped data and the demo's tiny
# U-Net. Prints images/s, the speed-up over one rank and the step-time breakdown from each
# run's metrics.jsonl (medians over the steps after the first 5).
# Usage: bench/train_scaling.sh [BUILD_DIR] [WORK_DIR]   (env: NPS="1 2", STEPS=60, BATCH=8,
# THREADS: OpenMP threads per rank, default cores / ranks)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build/cpu}" && pwd)
work=${2:-$top/runs/train-scaling}
NPS=${NPS:-"1 2"}
STEPS=${STEPS:-60}
BATCH=${BATCH:-8}
# the medians leave out the first 5 steps (start-up): fewer would leave nothing to measure
[ "$STEPS" -gt 5 ] || { echo "train_scaling.sh: STEPS=$STEPS: need more than 5 steps (the first 5 are left out of the medians)" >&2; exit 2; }
export OMPI_MCA_btl_vader_single_copy_mechanism=none
root=()
[ "$(id -u)" != 0 ] || root=(--allow-run-as-root)

rm -rf "$work"
mkdir -p "$work"
"$build/sdtool" make-demo-data "$work/data" --count 256 >/dev/null
tokenizer="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
nml() { # nml NAME MODE SHARDING
    cat >"$work/$1.nml" <<EOF2
&run mode = '$2', output_dir = '$work/run-$1', seed = 1234 /
&model resolution = 64, block_out_channels = 32, 64, layers_per_block = 1, attention_head_dim = 8,
       cross_attention_dim = 64, norm_num_groups = 32, vae_block_out_channels = 32, 32, 64, 64,
       text_hidden_size = 64, text_layers = 2, text_heads = 4, tokenizer = '$tokenizer' /
&data input = '$work/data', shard_dir = '$work/shards', val_fraction = 0.05 /
&train max_steps = $STEPS, batch_size_per_rank = $BATCH, sharding = '${3:-none}', log_every = 1000 /
EOF2
}
nml process process
mpirun -q --oversubscribe "${root[@]}" -np 2 "$build/sdtrain" "$work/process.nml" >"$work/process.log" 2>&1

# median of a metrics.jsonl key over the steps after the first 5
med() {
    grep '"loss"' "$1" | tail -n +6 | sed "s/.*\"$2\": \([^,}]*\).*/\1/" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
printf '%-8s %3s %7s %9s %8s %9s %9s %9s %9s %9s %9s\n' sharding np threads "img/s" speedup \
    "step ms" "data ms" "fwd ms" "bwd ms" "comm ms" "opt ms"
base=""
for sharding in none shard_grad_op; do
    for np in $NPS; do
        name="$sharding-np$np"
        nml "$name" train "$sharding"
        env=()
        [ -z "${THREADS:-}" ] || env=(-x OMP_NUM_THREADS="$THREADS")
        mpirun -q --oversubscribe "${root[@]}" "${env[@]}" -np "$np" "$build/sdtrain" \
            "$work/$name.nml" >"$work/$name.log" 2>&1
        m="$work/run-$name/metrics.jsonl"
        ips=$(med "$m" images_per_s)
        [ "$np" != "$(echo "$NPS" | awk '{ print $1 }')" ] || base=$ips
        th=$(sed -n 's/^OpenMP threads per rank: \([0-9]*\).*/\1/p' "$work/$name.log")
        printf '%-8s %3d %7s %9.1f %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f\n' \
            "${sharding%%_*}" "$np" "$th" "$ips" "$(awk -v a="$ips" -v b="$base" 'BEGIN { print a / b }')" \
            "$(awk -v s="$(med "$m" step_s)" 'BEGIN { print 1000 * s }')" \
            "$(awk -v s="$(med "$m" data_wait_s)" 'BEGIN { print 1000 * s }')" \
            "$(awk -v s="$(med "$m" forward_s)" 'BEGIN { print 1000 * s }')" \
            "$(awk -v s="$(med "$m" backward_s)" 'BEGIN { print 1000 * s }')" \
            "$(awk -v s="$(med "$m" comm_s)" 'BEGIN { print 1000 * s }')" \
            "$(awk -v s="$(med "$m" optimizer_s)" 'BEGIN { print 1000 * s }')"
    done
done
