#!/bin/bash
# A resume on the GPU's device path, timed on its CPU emulation (SDTRAIN_EMULATE_DEVICE_PATH=1):
# a 211 M-parameter U-Net (SD2's layout at half width, tiny encoders) trains 2 steps on 2 ranks
# and checkpoints (EMA on, 3.4 GB), then each build resumes it REPS times, builds alternating:
# "loaded in" (the read, the checksums, the uploads into the device's buffers) and every rank's
# peak RSS. The resumed runs do no step; they end with the two exports (1.7 GB).
#
#   bash bench/resume_emulated.sh BUILD [OTHER-BUILD] [REPS] [SHARDINGS]
#   e.g. bash bench/resume_emulated.sh build/cpu /tmp/old/build/cpu 3 "none shard_grad_op"
#
# Needs about 8 GB of memory a rank on the way and 10 GB in $TMPDIR (default /tmp).
set -eu
new=$(cd "$1" && pwd)
old=${2:+$(cd "$2" && pwd)}
reps=${3:-3}
shardings=${4:-"none shard_grad_op"}
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/sdtrain-resume-XXXXXX")
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run_mpi() { mpirun -np 2 --oversubscribe "$@"; }

tok="$top/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
model="resolution = 32, block_out_channels = 160, 320, 640, 640, attention_head_dim = 5, 10, 20, 20,
  norm_num_groups = 8, cross_attention_dim = 32, text_hidden_size = 32, text_layers = 1,
  text_heads = 4, vae_block_out_channels = 8, 8, 16, 16, tokenizer = '$tok', layers_per_block = 2"
"$new/sdtool" make-demo-data "$work/data" --count 48 >/dev/null
cat >"$work/proc.nml" <<EOF
&run mode = 'process', output_dir = '$work/proc', seed = 5, device = 'cpu' /
&model $model /
&data input = '$work/data', shard_dir = '$work/shards', samples_per_shard = 16, encode_batch_size = 8 /
EOF
run_mpi "$new/sdtrain" "$work/proc.nml" >"$work/proc.log" 2>&1 || { tail "$work/proc.log"; exit 1; }

for sh in $shardings; do
    cat >"$work/train-$sh.nml" <<EOF
&run mode = 'train', output_dir = '$work/ck-$sh', seed = 11, device = 'cpu' /
&model $model /
&data shard_dir = '$work/shards' /
&train max_steps = 2, batch_size_per_rank = 2, sharding = '$sh', ema_decay = 0.999 /
&checkpoint every_n_steps = 2 /
EOF
    SDTRAIN_EMULATE_DEVICE_PATH=1 run_mpi "$new/sdtrain" "$work/train-$sh.nml" >"$work/ck-$sh.log" 2>&1 ||
        { tail "$work/ck-$sh.log"; exit 1; }
done

# one BUILD SHARDING TAG: a resume; prints "load_s rss0_MiB rss1_MiB"
one() {
    rm -rf "$work/r-$3"
    sync
    SDTRAIN_EMULATE_DEVICE_PATH=1 run_mpi sh -c "/usr/bin/time -f %M -o '$work/rss-$3-'\$OMPI_COMM_WORLD_RANK \
        '$1/sdtrain' '$work/train-$2.nml' --set run.output_dir=\"'$work/r-$3'\" \
        --set checkpoint.resume=\"'$work/ck-$2/checkpoints/step-00000002'\"" >"$work/r-$3.log" 2>&1 ||
        { tail "$work/r-$3.log" >&2; exit 1; }
    load=$(sed -n 's/.*resuming from .*(loaded in \([0-9.]*\) s).*/\1/p' "$work/r-$3.log")
    echo "${load:-?} $(($(cat "$work/rss-$3-0") / 1024)) $(($(cat "$work/rss-$3-1") / 1024))"
}
# stats FILE COLUMN [FORMAT]: median (min-max)
stats() {
    sort -g -k"$2" "$1" | awk -v c="$2" -v f="${3:-%.2f}" '{ v[NR] = $c } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf f " (" f "-" f ")", m, v[1], v[NR] }'
}

printf "%-40s %-14s %-26s %-14s %s\n" build sharding "load s, median (min-max)" "rank 0 MiB" "rank 1 MiB"
for sh in $shardings; do
    : >"$work/new-$sh"
    [ -z "$old" ] || : >"$work/old-$sh"
    for i in $(seq "$reps"); do
        [ -z "$old" ] || one "$old" "$sh" "old-$sh-$i" >>"$work/old-$sh"
        one "$new" "$sh" "new-$sh-$i" >>"$work/new-$sh"
    done
    for b in old new; do
        [ -s "$work/$b-$sh" ] || continue
        dir=$new
        [ $b = new ] || dir=$old
        printf "%-40s %-14s %-26s %-14s %s\n" "$dir" "$sh" "$(stats "$work/$b-$sh" 1)" \
            "$(stats "$work/$b-$sh" 2 %.0f | cut -d' ' -f1)" "$(stats "$work/$b-$sh" 3 %.0f | cut -d' ' -f1)"
    done
done
