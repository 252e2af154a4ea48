#!/bin/bash
# The writeback of checkpoint files block by block (doc/checkpoints.md "Writeback") against
# leaving it to the kernel and the final fsync (SDTRAIN_WRITEBACK=off): bench/ckpt_io's write
# times, and the peak of the node's dirty page cache (Dirty + Writeback of /proc/meminfo,
# sampled every 50 ms) while each invocation runs. Invocations alternate off / on, so that a slow
# period of the disk falls on both.
#
#   bash bench/ckpt_writeback.sh [BUILD_DIR] [DIR] [INVOCATIONS] [CONFIG]
#
# Defaults: build/cpu, /tmp (the checkpoints go to DIR/ckpt_writeback.run, removed after each
# invocation), 3 invocations of each, sd2-narrow (6.70 GB a checkpoint without an EMA; sd2 needs
# about 14 GB of memory a rank). Each invocation is `mpirun -np 2 bench/ckpt_io --config CONFIG
# --reps 2 --no-ema` (ZeRO-2: each rank writes half of the moments). Prints one row an
# invocation and the medians over them.
set -eu
build=${1:-build/cpu}
dir=${2:-/tmp}
n=${3:-3}
config=${4:-sd2-narrow}
bin="$build/bench/ckpt_io"
[ -x "$bin" ] || { echo "ckpt_writeback: no $bin (make -C $build bench/ckpt_io)" >&2; exit 2; }
work="$dir/ckpt_writeback.run"
[ ! -e "$work" ] || { echo "ckpt_writeback: $work exists" >&2; exit 2; }
launch=${MPIEXEC:-mpirun}
[ "$(id -u)" != 0 ] || launch="$launch --allow-run-as-root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$work"' EXIT

dirty_kb() { awk '/^(Dirty|Writeback):/ { s += $2 } END { print s }' /proc/meminfo; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

printf '| writeback | invocation | write s (median of 2) | write + read-back s | peak dirty GB |\n|---|---|---|---|---|\n'
for i in $(seq 1 "$n"); do
    for mode in off on; do
        mkdir -p "$work"
        echo 0 >"$tmp/peak"
        (
            peak=0
            while :; do
                v=$(dirty_kb)
                [ "$v" -le "$peak" ] || { peak=$v; echo "$peak" >"$tmp/peak"; }
                sleep 0.05
            done
        ) &
        sampler=$!
        SDTRAIN_WRITEBACK=$mode $launch -np 2 -x SDTRAIN_WRITEBACK "$bin" --config "$config" \
            --dir "$work" --reps 2 --no-ema >"$tmp/out" 2>&1 || { cat "$tmp/out" >&2; kill $sampler; exit 1; }
        kill $sampler
        wait $sampler 2>/dev/null || true
        rm -rf "$work"
        w=$(awk -F'|' '$2 ~ /^ write $/ { gsub(/ /, "", $3); print $3 }' "$tmp/out")
        wv=$(awk -F'|' '$2 ~ /read-back/ { gsub(/ /, "", $3); print $3 }' "$tmp/out")
        gb=$(awk '{ printf "%.2f", $1 * 1024 / 1e9 }' "$tmp/peak")
        printf '| %s | %d | %s | %s | %s |\n' "$mode" "$i" "$w" "$wv" "$gb"
        printf '%s %s %s %s\n' "$mode" "$w" "$wv" "$gb" >>"$tmp/all"
    done
done
echo
for mode in off on; do
    printf '%s: medians write %s s, write + read-back %s s, peak dirty %s GB\n' "$mode" \
        "$(awk -v m=$mode '$1 == m { print $2 }' "$tmp/all" | median)" \
        "$(awk -v m=$mode '$1 == m { print $3 }' "$tmp/all" | median)" \
        "$(awk -v m=$mode '$1 == m { print $4 }' "$tmp/all" | median)"
done
