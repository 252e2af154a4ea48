#!/bin/bash
# One command that verifies the CUDA backend on a GPU machine: every GPU test (op by op against
# the CPU backend, whole modules against the goldens), compute-sanitizer memcheck over the op
# tests and over whole sdtrain runs (tests/gpu/memcheck.sh), and the CUDA op benchmark, ending
# with a short table.
#
#   bash bench/gpu-check.sh [--bundle DIR | --build DIR] [--parts LIST] [--deadline S] [--log DIR]
#
#   --bundle DIR  use DIR/bundle.tar.xz made by bench/gpu-bundle.sh (for GPU machines without
#                 MPI / HDF5 / ...; default when .gpu/bundle.tar.xz exists)
#   --build DIR   use (and first build) a tree configured with --with-cuda (default build/cuda)
#   --parts LIST  comma-separated subset of: tests, modules, sanitizer, bench, models, profile,
#                 variants, preprocess, peer, train, run in the order given
#                 (default: tests,modules,sanitizer,bench; "models" times whole SD2-base models
#                 (bench/models_cuda), "peer" runs bench/gpu_vs_torch.py: the same models in
#                 diffusers + PyTorch on the same GPU, with the diffusers wheel from .gpu/whl;
#                 "train" runs tests/gpu/train.sh, process.sh, sample.sh and pipeline.sh under
#                 MPI, with the bundle's mpirun;
#                 "variants" times the VAE and U-Net with each SDTRAIN_CUDA_* alternative;
#                 "preprocess" runs mode 'process' end to end with SD2-sized encoders)
#   --deadline S  finish within S seconds of the start, so that the table and the logs come
#                 back within a call's time limit: nothing starts with less than 30 s left,
#                 every command is cut 10 s before; the table marks what was cut ("cut") and
#                 what never started ("not run"). Default: 540 when $OUT is set (the device
#                 tool, whose calls last at most 600 s), else none; 0: none
#   --peer-what L the cases of "peer" (bench/gpu_vs_torch.py --what; default all:
#                 vae-encode,unet-train,unet-fwd; vae-encode alone takes about 90 s)
#   --peer-variants L  our side of "peer" once more per variant against the same torch
#                 measurement: ';'-separated NAME=VAR=value[ VAR=value...] (gpu_vs_torch.py
#                 --variant), e.g. "legacy=SDTRAIN_CUDA_CONV_API=legacy"
#   --log DIR     logs and CSV files (default gpu-check-logs; with $OUT set (the device tool)
#                 they are also packed into $OUT/gpu-check-logs.tgz, one file to fetch)
# Exit status: 0 when every part that ran passed (cut or not run ones included), 1 otherwise, 77
# without a usable GPU.
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 2
bundle=""
build=""
parts="tests,modules,sanitizer,bench"
logdir="gpu-check-logs"
deadline=""
peer_what="vae-encode,unet-train,unet-fwd"
peer_variants=""
while [ $# -gt 0 ]; do
    case "$1" in
    --bundle) bundle=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --log) logdir=$2; shift 2 ;;
    --peer-what) peer_what=$2; shift 2 ;;
    --peer-variants) peer_variants=$2; shift 2 ;;
    -h | --help) sed -n '2,/^[^#]/p' "$0" | grep '^#'; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ -n "$bundle$build" ] || { [ -f .gpu/bundle.tar.xz ] && bundle=.gpu || build=build/cuda; }
known="tests modules sanitizer bench models profile variants preprocess peer train"
for p in ${parts//,/ }; do
    case " $known " in *" $p "*) ;; *) echo "gpu-check: unknown part '$p' (known: $known)" >&2; exit 2 ;; esac
done
[ -n "$deadline" ] || { [ -n "${OUT:-}" ] && deadline=540 || deadline=0; }
case "$deadline" in '' | *[!0-9]*) echo "gpu-check: --deadline wants whole seconds" >&2; exit 2 ;; esac
t_begin=$(date +%s)
mkdir -p "$logdir"
summary=()
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the launcher for the shell tests that run under MPI (the "train" part); a build tree uses the
# system's mpirun
MPIEXEC="mpirun --oversubscribe"
add() { summary+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")"); }
status=0
# the deadline: seconds left before it (large without one), whether too few are left to start
# something (the table and the packing of the logs need a few), and a command's time limit cut
# at it
left() { if [ "$deadline" = 0 ]; then echo 999999; else echo $((t_begin + deadline - $(date +%s))); fi; }
late() { [ "$(left)" -lt 30 ]; }
cap() { local l; l=$(($(left) - 10)); [ "$l" -lt "$1" ] && echo $((l > 1 ? l : 1)) || echo "$1"; }
# late_note NAME: records that NAME was not started for want of time
late_note() { add "$1" "not run" "deadline (--deadline $deadline) reached"; }
# failed NAME RC DETAIL: a failure, or a command cut at the deadline (exit 124 with no time left)
failed() {
    # 124: timeout's SIGTERM; 137: its SIGKILL (-k) of a command that ignored the SIGTERM
    if { [ "$2" = 124 ] || [ "$2" = 137 ]; } && [ "$(left)" -le 15 ]; then add "$1" "cut" "at the deadline; partial log"
    else status=1; add "$1" "FAIL" "$3"; fi
}

# ---- the programs ----------------------------------------------------------------------------
if [ -n "$bundle" ]; then
    rm -rf /tmp/sdgpu
    tar -C /tmp -xJf "$bundle/bundle.tar.xz" || { echo "gpu-check: cannot unpack $bundle/bundle.tar.xz" >&2; exit 2; }
    B=/tmp/sdgpu/build
    export LD_LIBRARY_PATH="/tmp/sdgpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # the bundled, relocated Open MPI (sdgpu/ompi, see bench/gpu-bundle.sh): MPI_Init and mpirun
    if [ -f /tmp/sdgpu/ompi/env.sh ]; then
        O=/tmp/sdgpu/ompi
        export OPAL_PREFIX=$O OPAL_SYSCONFDIR=$O/etc
        export PMIX_INSTALL_PREFIX=$O/lib/x86_64-linux-gnu/pmix2
        export PMIX_MCA_mca_base_component_path=$PMIX_INSTALL_PREFIX/lib/pmix
        export PATH="$O/bin:$PATH"
        MPIEXEC="$O/bin/mpirun --oversubscribe"
    fi
    cat /tmp/sdgpu/BUILD-INFO
else
    B=$build
    jobs=$(nproc 2>/dev/null || echo 4)
    make -C "$B" -j"$jobs" >"$logdir/build.log" 2>&1 && make -C "$B" -j"$jobs" check TESTS= >>"$logdir/build.log" 2>&1 ||
        { tail -30 "$logdir/build.log"; echo "gpu-check: the build failed" >&2; exit 1; }
fi
# CUDA's libraries: the system's, else the ones pip wheels put under site-packages/nvidia/*/lib
for lib in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
    if ldd "$B/sdtool" >/dev/null 2>&1 && ! ldd "$B/sdtool" | grep -q "$lib => /"; then
        dir=$(find /usr /opt -name "$lib" -print 2>/dev/null | head -1)
        [ -n "$dir" ] && LD_LIBRARY_PATH="$(dirname "$dir")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" && export LD_LIBRARY_PATH
    fi
done
if ldd "$B/sdtool" | grep -q "not found"; then
    ldd "$B/sdtool" | grep "not found"
    echo "gpu-check: libraries missing (above)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null
"$B/sdtool" --version | head -2
if ! "$B/sdtool" device >"$logdir/device.txt" 2>&1; then
    cat "$logdir/device.txt"
    echo "gpu-check: no usable GPU" >&2
    exit 77
fi
cat "$logdir/device.txt"

# ---- op tests (TAP) -------------------------------------------------------------------------
tap_run() { # NAME CMD...: runs a TAP program, records ok/not ok counts
    local name=$1 t0 t1 ok nok skip
    shift
    t0=$(date +%s)
    timeout -k 10 "$(cap 600)" "$@" >"$logdir/$name.log" 2>&1
    local rc=$?
    t1=$(date +%s)
    ok=$(grep -c '^ok' "$logdir/$name.log")
    nok=$(grep -c '^not ok' "$logdir/$name.log")
    skip=$(grep -c '# SKIP' "$logdir/$name.log")
    grep '^not ok' "$logdir/$name.log" | head -20
    if [ "$nok" != 0 ]; then
        status=1
        add "$name" "FAIL" "$ok ok, $nok not ok, $skip skipped, exit $rc, $((t1 - t0)) s"
    elif [ "$rc" != 0 ] || [ "$ok" = 0 ]; then
        failed "$name" "$rc" "$ok ok, $skip skipped, exit $rc, $((t1 - t0)) s"
    else
        add "$name" "pass" "$ok ok, $((t1 - t0)) s"
    fi
}
optests=""
for p in "$B"/tests/gpu/gpu_selftest "$B"/tests/gpu/test_cuda_*; do
    [ -x "$p" ] && optests="$optests $p"
done
part_tests() {
    # test_cuda_flash also prints fused-vs-math attention timings (TAP diagnostics)
    for p in $optests; do
        late && { late_note "$(basename "$p")"; continue; }
        SDTRAIN_FLASH_BENCH=1 tap_run "$(basename "$p")" "$p"
    done
}

# ---- whole modules against the goldens --------------------------------------------------------
part_modules() {
    t0=$(date +%s)
    top_srcdir="$top" top_builddir="$B" SD_TEST_CUDA_BUILD=yes MPIEXEC="" \
        timeout -k 10 "$(cap 600)" sh tests/gpu/modules.sh >"$logdir/modules.log" 2>&1
    rc=$?
    grep -E '^(ok|FAIL)' "$logdir/modules.log" | sed 's/^/  /' | cut -c1-200
    nok=$(grep -c '^ok' "$logdir/modules.log")
    nfail=$(grep -c '^FAIL' "$logdir/modules.log")
    if [ "$rc" = 0 ]; then add modules.sh pass "$nok checks, $(($(date +%s) - t0)) s"
    elif [ "$nfail" != 0 ]; then status=1; add modules.sh FAIL "$nfail failed, $nok ok, exit $rc"
    else failed modules.sh "$rc" "$nfail failed, $nok ok, exit $rc"; fi
    # a VAE batch past cuDNN's 2^31 - 1 tensor elements ([32, 768, 768, 128] at the first level):
    # sd_vae_encode runs it in passes of 28 + 4 (doc/models.md); it failed in planning before
    [ -x "$B/bench/models_cuda" ] || return
    late && { late_note "vae-encode 768 px batch 32"; return; }
    timeout -k 10 "$(cap 300)" "$B/bench/models_cuda" --what vae-encode --res 768 --batch 32 \
        --reps 2 --warmup 1 >"$logdir/vae768.txt" 2>&1
    rc=$?
    grep '^RESULT' "$logdir/vae768.txt" | sed 's/^/  /'
    if [ "$rc" = 0 ]; then add "vae-encode 768 px x 32 (passes)" pass "$(grep -o 'img_s=[0-9.]*' "$logdir/vae768.txt")"
    else failed "vae-encode 768 px x 32 (passes)" "$rc" "exit $rc: $(tail -1 "$logdir/vae768.txt" | cut -c1-80)"; fi
}

# ---- compute-sanitizer memcheck over the op tests -------------------------------------------
part_sanitizer() {
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
    if [ -z "$cs" ]; then
        add "compute-sanitizer" "n/a" "not installed"
    else
        for p in $optests; do
            n=$(basename "$p")
            late && { late_note "memcheck $n"; continue; }
            SD_GPU_TEST_QUICK=1 timeout -k 10 "$(cap 900)" "$cs" --tool memcheck --leak-check full --error-exitcode 99 "$p" \
                >"$logdir/memcheck-$n.log" 2>&1
            rc=$?
            errs=$(grep -E -o 'ERROR SUMMARY: [0-9]+' "$logdir/memcheck-$n.log" | tail -1)
            if [ "$rc" = 0 ]; then add "memcheck $n" "clean" "${errs:-no summary}"
            else failed "memcheck $n" "$rc" "exit $rc, ${errs:-no summary}"
                grep -m5 -E '=========' "$logdir/memcheck-$n.log"; fi
        done
        # whole sdtrain runs (training, sampling, preprocessing) under memcheck
        gpu_script memcheck
    fi
}

# ---- benchmark ---------------------------------------------------------------------------------
part_bench() {
    [ -x "$B/bench/ops_cuda" ] || { add "bench" "n/a" "no bench/ops_cuda in the build"; return; }
    # bf16 with the math attention, bf16 with the fused one, fp32
    for v in bf16:math bf16:flash f32:math; do
        dt=${v%%:*}
        att=${v#*:}
        late && { late_note "bench ops_cuda $dt $att"; continue; }
        SDTRAIN_CUDA_ATTENTION=$att timeout -k 10 "$(cap 600)" "$B/bench/ops_cuda" --batch 32 --res both --dtype "$dt" \
            --csv "$logdir/ops_${dt}_$att.csv" >"$logdir/ops_${dt}_$att.txt" 2>&1
        rc=$?
        cat "$logdir/ops_${dt}_$att.txt"
        if [ "$rc" = 0 ]; then add "bench ops_cuda $dt $att" "done" "$logdir/ops_${dt}_$att.csv"
        else failed "bench ops_cuda $dt $att" "$rc" "exit $rc"; fi
    done
}

part_models() {
    [ -x "$B/bench/models_cuda" ] || { add "models" "n/a" "no bench/models_cuda in the build"; return; }
    for p in bf16 fp32; do
        late && { late_note "bench models_cuda $p"; continue; }
        timeout -k 10 "$(cap 900)" "$B/bench/models_cuda" --precision "$p" >"$logdir/models_$p.txt" 2>&1
        rc=$?
        cat "$logdir/models_$p.txt"
        if [ "$rc" = 0 ]; then add "bench models_cuda $p" "done" "$logdir/models_$p.txt"
        else failed "bench models_cuda $p" "$rc" "exit $rc"; fi
    done
}

# per-op GPU time of whole models (SDTRAIN_CUDA_PROFILE=1: the backend's op profile, printed when
# the benchmark closes its backend; warm-up runs included)
part_profile() {
    [ -x "$B/bench/models_cuda" ] || { add "profile" "n/a" "no bench/models_cuda in the build"; return; }
    for w in vae-encode:256 unet-train:256 unet-fwd:256 unet-train:512; do
        what=${w%%:*}
        res=${w#*:}
        f="$logdir/profile_${what}_$res.txt"
        late && { late_note "profile $what $res"; continue; }
        SDTRAIN_CUDA_PROFILE=1 SDTRAIN_CUDA_CONV_LOG=1 timeout -k 10 "$(cap 600)" "$B/bench/models_cuda" --what "$what" --res "$res" \
            --reps 5 --warmup 2 >"$f" 2>&1
        rc=$?
        grep -v -e '^RESULT' -e '^sdtrain conv' "$f" | head -70
        if [ "$rc" = 0 ]; then add "profile $what $res" "done" "$f"
        else failed "profile $what $res" "$rc" "exit $rc"; fi
    done
}

# the backend's switchable variants on the models they matter for (bf16, batch 32, median of
# 10): which of the alternatives should become the default
part_variants() {
    [ -x "$B/bench/models_cuda" ] || { add "variants" "n/a" "no bench/models_cuda in the build"; return; }
    f="$logdir/variants.txt"
    : >"$f"
    printf '%-44s %-12s %-5s %10s %10s %9s\n' "variant" "model" "res" "ms" "img/s" "set-up s" | tee -a "$f"
    # the default is GN_STATS=wide, GN_APPLY=auto (fast for bf16) since 2026-11-26; "loads+onepass"
    # is the default before; CONV_API=graph is the default since 2026-11-27 (legacy before)
    for v in "default:" "loads+onepass:SDTRAIN_CUDA_GN_APPLY=loads SDTRAIN_CUDA_GN_STATS=onepass" \
        "GN_APPLY=regs:SDTRAIN_CUDA_GN_APPLY=regs" \
        "CONV_ALGO=find:SDTRAIN_CUDA_CONV_ALGO=find" \
        "CONV_API=legacy:SDTRAIN_CUDA_CONV_API=legacy" \
        "CONV_API=legacy+find:SDTRAIN_CUDA_CONV_API=legacy SDTRAIN_CUDA_CONV_ALGO=find" \
        "CONV_API=graph-rtc:SDTRAIN_CUDA_CONV_API=graph-rtc"; do
        name=${v%%:*}
        envs=${v#*:}
        # one process for every model at 256 px (the weights are made once), one for the VAE at
        # 512 px
        for w in all:256 vae-encode:512; do
            what=${w%%:*}
            res=${w#*:}
            late && { late_note "variant $name $what $res"; continue; }
            # shellcheck disable=SC2086 # envs is a list of VAR=value words
            out=$(env $envs timeout -k 10 "$(cap 300)" "$B/bench/models_cuda" --what "$what" --res "$res" \
                --reps 10 --warmup 3 2>&1)
            rc=$?
            if [ "$rc" != 0 ]; then
                v="FAIL($rc)"
                if [ "$rc" = 124 ] && [ "$(left)" -le 15 ]; then v="cut"; else status=1; fi
                printf '%-44s %-12s %-5s %10s\n' "$name" "$what" "$res" "$v" | tee -a "$f"
            fi
            grep '^RESULT' <<<"$out" | while read -r line; do
                m=$(sed -n 's/.* what=\([^ ]*\).*/\1/p' <<<"$line")
                r=$(sed -n 's/.* res=\([0-9]*\).*/\1/p' <<<"$line")
                ms=$(sed -n 's/.* ms=\([0-9.]*\).*/\1/p' <<<"$line")
                ips=$(sed -n 's/.* img_s=\([0-9.]*\).*/\1/p' <<<"$line")
                su=$(sed -n 's/.* setup_s=\([0-9.]*\).*/\1/p' <<<"$line")
                printf '%-44s %-12s %-5s %10s %10s %9s\n' "$name" "$m" "$r" "$ms" "$ips" "${su:--}" | tee -a "$f"
            done
        done
    done
    # the group norm alone at the U-Net's and the VAE's shapes (bench/ops_cuda), per variant
    for v in "default:" "loads+onepass:SDTRAIN_CUDA_GN_APPLY=loads SDTRAIN_CUDA_GN_STATS=onepass" \
        "GN_APPLY=regs:SDTRAIN_CUDA_GN_APPLY=regs"; do
        name=${v%%:*}
        envs=${v#*:}
        late && { late_note "variant $name groupnorm"; continue; }
        echo "# ops_cuda groupnorm, $name" | tee -a "$f"
        # shellcheck disable=SC2086 # envs is a list of VAR=value words
        env $envs timeout -k 10 "$(cap 300)" "$B/bench/ops_cuda" --batch 32 --res both --only groupnorm 2>&1 |
            grep -v '^#' | tee -a "$f"
    done
    add "variants (models_cuda)" "done" "$f"
}

# preprocessing end to end on the GPU: SD2-sized encoders (random weights) in bf16, batches of
# 32, 4096 demo images of up to 512 px to 256 px in shards of 512, one rank with 16 decode
# threads and two ranks with 8 sharing the GPU, the shard writes beside the encoding (the
# default), then one rank with the writes between encodings (bench/preprocess.sh; the rate
# "after set-up" is the one to compare); compare with the VAE-alone rate of "models"
# preprocess_run LIMIT LAYOUTS: one bench/preprocess.sh run (OVERLAP from the caller)
preprocess_run() {
    LAUNCH="$MPIEXEC --bind-to none" DEVICE=cuda MODEL=sd2 BATCH=32 MAX_SIDE=512 SHARD=512 \
        timeout -k 10 "$(cap "$1")" bash bench/preprocess.sh "$B" 4096 256 "$2"
}
part_preprocess() {
    f="$logdir/preprocess.txt"
    preprocess_run 600 "1x16 2x8" >"$f" 2>&1
    rc=$?
    [ "$rc" != 0 ] || late || OVERLAP=0 preprocess_run 300 "1x16" >>"$f" 2>&1 || rc=$?
    cat "$f"
    if [ "$rc" = 0 ]; then add "preprocess (mode process)" "done" "$f"
    else failed "preprocess (mode process)" "$rc" "exit $rc"; fi
}

part_peer() {
    if ls .gpu/whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/whl/*.whl &&
            export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    fi
    vargs=()
    IFS=';' read -r -a vlist <<<"$peer_variants"
    for v in ${vlist[@]+"${vlist[@]}"}; do [ -n "$v" ] && vargs+=(--variant "$v"); done
    PYTHONUNBUFFERED=1 timeout -k 10 "$(cap 1800)" python3 bench/gpu_vs_torch.py --bin "$B/bench/models_cuda" \
        --what "$peer_what" ${vargs[@]+"${vargs[@]}"} >"$logdir/peer.txt" 2>&1
    rc=$?
    # the rows measured so far (a cut run has no table), then the table
    grep '^PEER ' "$logdir/peer.txt"
    sed -n '/^what /,$p' "$logdir/peer.txt"
    tail -3 "$logdir/peer.txt"
    if [ "$rc" = 0 ]; then add "bench gpu_vs_torch" "done" "$logdir/peer.txt"
    else failed "bench gpu_vs_torch" "$rc" "exit $rc"; fi
}

# ---- training and preprocessing under MPI on the GPU -------------------------------------------
# gpu_script NAME: tests/gpu/NAME.sh under MPI on the GPU, one row of the table
gpu_script() {
    t=$1
    if [ ! -f "tests/gpu/$t.sh" ]; then
        add "$t.sh" "n/a" "tests/gpu/$t.sh not in this tree"
        return
    fi
    late && { late_note "$t.sh"; return; }
    t0=$(date +%s)
    top_srcdir="$top" top_builddir="$B" SD_TEST_CUDA_BUILD=yes MPIEXEC="$MPIEXEC" \
        timeout -k 10 "$(cap 600)" sh "tests/gpu/$t.sh" >"$logdir/$t.log" 2>&1
    rc=$?
    grep -E '^(ok|FAIL|SKIP)' "$logdir/$t.log" | sed 's/^/  /' | cut -c1-200
    nok=$(grep -c '^ok' "$logdir/$t.log")
    nfail=$(grep -c '^FAIL' "$logdir/$t.log")
    if [ "$rc" = 0 ]; then add "$t.sh" pass "$nok checks, $(($(date +%s) - t0)) s"
    elif [ "$rc" = 77 ]; then add "$t.sh" skip "$(grep -m1 '^SKIP' "$logdir/$t.log" | cut -c1-60)"
    elif [ "$nfail" != 0 ]; then status=1; add "$t.sh" FAIL "$nfail failed, $nok ok, exit $rc"
    else failed "$t.sh" "$rc" "$nfail failed, $nok ok, exit $rc"; fi
}

part_train() {
    for t in train process sample pipeline; do
        gpu_script "$t"
    done
}

# ---- the parts, in the order asked for, while time is left -----------------------------------
for p in ${parts//,/ }; do
    if late; then
        late_note "$p"
        continue
    fi
    echo "==== $p ($(left) s left before the deadline)" | sed 's/ (999999 s left before the deadline)//'
    "part_$p"
    # the logs so far, in case the device tool's own limit ends the script before its end
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
        tar -C "$logdir" -czf "$OUT/gpu-check-logs.tgz" . 2>/dev/null || true
    fi
done

echo
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
echo "==== gpu-check summary ($(date -u +%Y-%m-%d), ${gpu:-GPU name unknown (no nvidia-smi)}, $(($(date +%s) - t_begin)) s) ===="
for line in "${summary[@]}"; do echo "$line"; done
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    tar -C "$logdir" -czf "$OUT/gpu-check-logs.tgz" . && echo "logs: \$OUT/gpu-check-logs.tgz"
fi
exit $status
