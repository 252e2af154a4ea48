#!/usr/bin/env bash
# What a rerun of mode 'sample' pays to keep the images already written (&sample resume,
# doc/sampling.md "Resuming"): IMAGES images of 16 x 16 px from the tiny-sd2 snapshot (prompts
# from a prompts_file, 4 images each, batches of 1 on 1 rank). The first run is stopped by
# SIGUSR1 once image 0 is written (SDTRAIN_FAULT), which leaves samples.settings and one image;
# the other images are then copies of it (the rerun checks each file's PNG signature, size and
# IEND chunk, not its pixels), so the reruns find every image there and make none. Prints the
# median, min and max over REPS reruns of the whole job's wall time and of the time sdtrain
# reports for its sampling (the models loaded, the settings compared, every batch checked), and the same
# for a rerun that makes one image (the last one removed) as the scale of one image's cost. With
# FULL=1, one run with &sample resume = 'never' (every image made again) follows, and the ratio
# of its wall time to the all-kept rerun's median.
# Usage: [WORK=DIR] [FULL=1] bench/sample_resume.sh BUILDDIR [IMAGES] [REPS]
set -euo pipefail
build=$(cd "${1:?usage: bench/sample_resume.sh BUILDDIR [IMAGES] [REPS]}" && pwd)
images=${2:-20000}
reps=${3:-5}
top=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/sdtrain-sample-resume}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$work"
mkdir -p "$work"
prompts=$((images / 4))
awk -v n="$prompts" 'BEGIN { for (i = 0; i < n; i++) printf "a photo of thing number %d\n", i }' \
    >"$work/prompts.txt"
cat >"$work/run.nml" <<EOF
&run mode = 'sample', output_dir = '$work/out', seed = 7, device = 'cpu' /
&model pretrained = '$top/tests/data/models/tiny-sd2',
       tokenizer = '$top/tests/data/sample/tokenizer', resolution = 16 /
&sample prompts_file = '$work/prompts.txt', num_steps = 2, images_per_prompt = 4,
        batch_size = 1 /
EOF
run() { mpirun -np 1 "$build/sdtrain" "$work/run.nml" >"$work/log" 2>&1; }
SDTRAIN_FAULT=usr1:rank=0:step=0 run
grep -q "stopped for SIGUSR1: 1 of the $((prompts * 4)) image" "$work/log" ||
    { cat "$work/log" >&2; echo "sample_resume: the first run did not stop after image 0" >&2; exit 1; }
(cd "$work/out/samples" && for ((p = 0; p < prompts; p++)); do
    for j in 0 1 2 3; do [ "$p-$j" = 0-0 ] || cp 0-0.png "$p-$j.png"; done
done)
# seconds of the images as sdtrain reports them ("wrote K image(s) ... in T s")
took() { sed -n 's/.*image(s) to .* in \([0-9.]*\) s$/\1/p' "$work/log" | tail -1; }
stats() { sort -n | awk '{ v[NR] = $1 } END { printf "%10.3f %10.3f %10.3f", v[int((NR + 1) / 2)], v[1], v[NR] }'; }
: >"$work/all" && : >"$work/one"
for ((r = 0; r < reps; r++)); do
    t0=$(date +%s.%N)
    run
    t1=$(date +%s.%N)
    grep -q "kept $((prompts * 4)) of the $((prompts * 4)) image(s)" "$work/log" ||
        { cat "$work/log" >&2; echo "sample_resume: the rerun did not keep every image" >&2; exit 1; }
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') $(took)" >>"$work/all"
    rm "$work/out/samples/$((prompts - 1))-3.png"
    t0=$(date +%s.%N)
    run
    t1=$(date +%s.%N)
    echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }') $(took)" >>"$work/one"
done
printf "%-34s %10s %10s %10s\n" "rerun of $((prompts * 4)) images, $reps times" median min max
printf "%-34s %s\n" "all kept: job wall s" "$(cut -d' ' -f1 "$work/all" | stats)"
printf "%-34s %s\n" "all kept: sampling s (sdtrain)" "$(cut -d' ' -f2 "$work/all" | stats)"
printf "%-34s %s\n" "one made: job wall s" "$(cut -d' ' -f1 "$work/one" | stats)"
printf "%-34s %s\n" "one made: sampling s (sdtrain)" "$(cut -d' ' -f2 "$work/one" | stats)"
if [ "${FULL:-0}" = 1 ]; then
    t0=$(date +%s.%N)
    mpirun -np 1 "$build/sdtrain" "$work/run.nml" --set "sample.resume='never'" >"$work/log" 2>&1
    t1=$(date +%s.%N)
    full=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
    kept=$(cut -d' ' -f1 "$work/all" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    printf "%-34s %10.3f   (%.0fx the all-kept rerun)\n" "every image made: job wall s" "$full" \
        "$(awk -v f="$full" -v k="$kept" 'BEGIN { print f / k }')"
fi
