#!/usr/bin/env bash
# Memory of the dataset index in mode 'process': a TSV manifest of LINES samples (8 real tiny
# images at the start, then paths that are never read, each with a caption of ~70 bytes, as
# LAION's are), of which only the first 8 are preprocessed (&data max_samples), so that the index
# is what the ranks hold. For each rank count, samples every rank's PSS (proportional set size
# from /proc/PID/smaps_rollup: a page shared by N processes counts 1/N to each, so the ranks'
# sum is what the node holds, where RSS would count a shared page N times) every 0.1 s, and
# prints each rank's peak, the peak of the sum, and the sum while the first shard is being
# encoded (the index built and handed out).
# Usage: [WORK=DIR] [LAUNCH="mpirun ..."] bench/index_memory.sh [BUILD_DIR] [LINES] [RANKS]
#   RANKS: space-separated rank counts (default "2 4")
#   extra environment reaches the ranks, e.g. SDTRAIN_TEST_NO_SHARED_INDEX=1 (the fallback of a
#   node without MPI shared memory: one copy of the index on each rank)
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build/cpu}" && pwd)
lines=${2:-3000000}
ranks=${3:-2 4}
work=${WORK:-/tmp/sdtrain-index-memory}
read -r -a launch <<<"${LAUNCH:-mpirun -q --oversubscribe}"
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
mkdir -p "$work"
manifest=$work/manifest-$lines.tsv
if [ ! -s "$manifest" ]; then
    rm -rf "$work/img"
    "$build/sdtool" make-demo-data "$work/img" --count 8 >/dev/null
    (cd "$work" && find img -name '*.jpg' -o -name '*.png' | sort) |
        awk -v n="$lines" 'BEGIN { nw = split("a photo of the red cat sitting on a wooden table next to blue window in the morning light", w, " ") }
            { img[NR - 1] = $0 }
            END {
                for (i = 0; i < n; i++) {
                    p = i < NR ? img[i] : sprintf("img/%05d/%09d.jpg", int(i / 10000), i)
                    c = ""
                    for (k = 0; k < 12; k++) c = c (k ? " " : "") w[(i + k) % nw + 1]
                    printf "%s\t%s #%d\n", p, c, i
                }
            }' >"$manifest.tmp"
    mv "$manifest.tmp" "$manifest"
fi
for np in $ranks; do
    out=$work/run-$np
    rm -rf "$out"
    mkdir -p "$out"
    cat >"$out/in.nml" <<EOF
&run mode = 'process', output_dir = '$out/run', seed = 7 /
&model
  resolution = 32, block_out_channels = 32, 64, attention_head_dim = 8, norm_num_groups = 8,
  cross_attention_dim = 32, text_hidden_size = 32, text_layers = 2, text_heads = 4,
  vae_block_out_channels = 8, 8, 16, 16,
  tokenizer = '$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz'
/
&data input = '$manifest', input_format = 'tsv', shard_dir = '$out/shards',
      samples_per_shard = 4, max_samples = 8, encode_batch_size = 4 /
EOF
    # a pause per shard keeps the ranks alive, the index handed out, while the sums are taken
    SDTRAIN_TEST_SHARD_DELAY_MS=1500 "${launch[@]}" -np "$np" "$build/sdtrain" "$out/in.nml" \
        >"$out/log.out" 2>"$out/log.err" &
    pid=$!
    declare -A peak=()
    max_sum=0 steady=""
    while kill -0 "$pid" 2>/dev/null; do
        sum=0
        for p in $(pgrep -x sdtrain -P "$pid" || true); do
            v=$(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null || true)
            [ -n "$v" ] || continue
            sum=$((sum + v))
            [ "${peak[$p]:-0}" -ge "$v" ] || peak[$p]=$v
        done
        [ "$sum" -le "$max_sum" ] || max_sum=$sum
        [ -n "$steady" ] || [ ! -f "$out/shards/shard-000000.h5" ] || steady=$sum
        sleep 0.1
    done
    rc=0
    wait "$pid" || rc=$?
    per=""
    for p in $(printf '%s\n' "${!peak[@]}" | sort -n); do per="$per $((peak[$p] / 1024))"; done
    echo "-np $np, $lines samples (exit $rc): peak PSS per rank (MiB):$per; peak of the sum $((max_sum / 1024)) MiB;" \
        "sum after the index is out $((${steady:-0} / 1024)) MiB"
    grep -h "dataset index" "$out/log.out" "$out/log.err" | sed 's/^/  /' || true
    unset peak
done
