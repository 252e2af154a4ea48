#!/bin/bash
# ThreadSanitizer over the threads sdtrain runs beside its main thread: mode 'process' (the shard
# writer thread, &data overlap_writes), mode 'train' (the loader's prefetch thread, checkpoints,
# also written in the background: &checkpoint async)
# and mode 'pipeline' (both at once, the trainers following the shards as they come), each with
# two ranks per half on the demo model.
#
#   bash scripts/tsan.sh
#
# Builds build/tsan with -fsanitize=thread and --disable-openmp: libgomp is not instrumented, so
# the OpenMP decode and op threads would only give false reports (they are covered by the
# thread-count tests of tests/mpi/process.sh, which must give the same bytes). Open MPI's own
# plugins (PMIx, ob1, the TCP transport: not instrumented either) report races and lock misuse of
# their own in every MPI program, ours or not; tests/tsan.supp sets those aside, by module, and
# nothing else (Debian's Open MPI 4 and HDF5; the launcher flags are Open MPI's). A report left
# is one whose stacks lie in our code. Exit status: 0 without
# reports, 1 with (their first lines are printed), 2 when the build or a run fails.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2
b=build/tsan
[ -x configure ] || autoreconf -fi >/dev/null 2>&1 || { echo "tsan: autoreconf failed" >&2; exit 2; }
mkdir -p "$b"
if [ ! -f "$b/Makefile" ]; then
    (cd "$b" && ../../configure --disable-openmp CFLAGS="-O1 -g -fsanitize=thread -fno-omit-frame-pointer" \
        LDFLAGS="-fsanitize=thread" >config.out 2>&1) ||
        { tail -20 "$b/config.out"; echo "tsan: configure failed" >&2; exit 2; }
fi
jobs=$(nproc 2>/dev/null || echo 2)
make -C "$b" -j"$jobs" sd_revision.h >"$b/build.out" 2>&1 &&
    make -C "$b" -j"$jobs" sdtrain sdtool >>"$b/build.out" 2>&1 ||
    { tail -20 "$b/build.out"; echo "tsan: the build failed" >&2; exit 2; }

work=$b/tsan-runs
rm -rf "$work"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export TSAN_OPTIONS="suppressions=$top/tests/tsan.supp history_size=4"
launch=(mpirun -q --oversubscribe -x TSAN_OPTIONS)
"$b/sdtool" make-demo-data "$work/data" --count 96 >/dev/null || { echo "tsan: no demo data" >&2; exit 2; }
common=(--set data.input="$work/data" --set data.samples_per_shard=16)
status=0
# run NAME NP ARGS...: one sdtrain run under TSan; its log is $work/NAME.log
run() {
    local name=$1 np=$2 rc=0
    shift 2
    timeout 1200 "${launch[@]}" -np "$np" "$b/sdtrain" inputs/demo.nml "$@" >"$work/$name.log" 2>&1 || rc=$?
    local n
    n=$(grep -c 'WARNING: ThreadSanitizer' "$work/$name.log")
    if [ "$n" != 0 ]; then
        status=1
        echo "$name: $n report(s) ($work/$name.log):"
        grep -A8 'WARNING: ThreadSanitizer' "$work/$name.log" | head -40 | sed 's/^/    /'
    elif [ "$rc" != 0 ]; then
        [ "$status" = 1 ] || status=2
        echo "$name: exit status $rc without a report ($work/$name.log):"
        tail -5 "$work/$name.log" | sed 's/^/    /'
    else
        echo "$name: no reports"
    fi
}
run process 2 --set run.mode=process --set run.output_dir="$work/proc" \
    --set data.shard_dir="$work/shards" "${common[@]}"
run train 2 --set run.mode=train --set run.output_dir="$work/train" \
    --set data.shard_dir="$work/shards" --set train.max_steps=6 --set checkpoint.every_n_steps=3
# checkpoints written in the background (&checkpoint async): the writer thread beside the
# steps and the loader's prefetch thread
run train-async 2 --set run.mode=train --set run.output_dir="$work/train-async" \
    --set data.shard_dir="$work/shards" --set train.max_steps=8 --set checkpoint.every_n_steps=2 \
    --set checkpoint.async=.true.
run pipeline 4 --set run.mode=pipeline --set run.n_process_ranks=2 \
    --set run.output_dir="$work/pipe" --set data.shard_dir="$work/shards-pipe" \
    --set train.max_steps=6 "${common[@]}"
exit $status
