#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what is missing, builds the CPU
# tree and runs `make check` (unit, MPI and CLI tests), builds the --with-cuda tree beside it
# and runs its GPU tests (they skip without a GPU), checks `make distcheck`, and ends with
# "N passed, N failed, N skipped".
#   SD_SKIP_DISTCHECK=1  skip the distcheck step;  JOBS=N  parallel make (default: nproc)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=${JOBS:-$(nproc)}
passed=0 failed=0 skipped=0
log_dir="$top/build/logs"

step() { # step NAME LOG CMD...: a build step counted as one test
    local name=$1 log=$2
    shift 2
    echo "== $name"
    if "$@" >"$log" 2>&1; then
        passed=$((passed + 1))
        echo "   ok ($log)"
        return 0
    fi
    failed=$((failed + 1))
    echo "   FAILED: $name; last lines of $log:"
    tail -n 40 "$log"
    return 1
}

count_check() { # adds automake's "# PASS: n" style totals from a make check log
    local log=$1 n
    for kind in PASS XFAIL; do
        n=$(sed -n "s/^# $kind: *\([0-9]*\).*/\1/p" "$log" | tail -n 1)
        passed=$((passed + ${n:-0}))
    done
    for kind in FAIL XPASS ERROR; do
        n=$(sed -n "s/^# $kind: *\([0-9]*\).*/\1/p" "$log" | tail -n 1)
        failed=$((failed + ${n:-0}))
    done
    n=$(sed -n "s/^# SKIP: *\([0-9]*\).*/\1/p" "$log" | tail -n 1)
    skipped=$((skipped + ${n:-0}))
    if ! grep -q "^# TOTAL:" "$log"; then
        failed=$((failed + 1))
        echo "   no test summary in $log"
    fi
}

failed_logs=() # the logs of failed tests, shown again (shorter) at the very end
show_failures() { # prints the logs of failed tests of a tree
    local tree=$1 f
    while read -r f; do
        [ -n "$f" ] || continue
        echo "---- $f"
        tail -n 60 "$f"
        failed_logs+=("$f")
    done < <(grep -l -E "^(FAIL|ERROR|not ok)" "$tree"/tests/*/*.log 2>/dev/null)
}

mkdir -p "$log_dir"
step "install dependencies" "$log_dir/deps.log" "$top/scripts/install-deps.sh" || true
step "bootstrap (autoreconf)" "$log_dir/autoreconf.log" autoreconf -fi || { echo "0 passed, 1 failed"; exit 1; }

# CPU tree: build and run everything
mkdir -p build/cpu
if step "configure CPU tree" "$log_dir/configure-cpu.log" \
        sh -c "cd build/cpu && ../../configure --enable-werror" &&
   step "build CPU tree" "$log_dir/build-cpu.log" make -C build/cpu -j"$jobs"; then
    echo "== make check (CPU tree)"
    make -C build/cpu -j"$jobs" check >"$log_dir/check-cpu.log" 2>&1
    grep -E "^(PASS|FAIL|SKIP|ERROR|XFAIL|XPASS):" "$log_dir/check-cpu.log" | grep -v "^PASS:" || true
    grep -E "^# (TOTAL|PASS|SKIP|FAIL|ERROR):" "$log_dir/check-cpu.log" || true
    count_check "$log_dir/check-cpu.log"
    show_failures build/cpu
fi

# CUDA tree: must compile and link wherever the toolkit is installed; GPU tests skip without a GPU.
# The host emulations of the group-norm / objective kernels, the row-wise kernels and the fused
# attention run the CUDA kernels' own code on the CPU (tests/gpu/*_emulate.sh): what CI can
# execute of them; test_cuda_conv_graph finalizes the cuDNN graphs of the graph-API convolution
# without a device and asks cuDNN's heuristics for their engines on an H100 described in JSON.
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    mkdir -p build/cuda
    if step "configure CUDA tree (--with-cuda)" "$log_dir/configure-cuda.log" \
            sh -c "cd build/cuda && ../../configure --with-cuda --enable-werror" &&
       step "build CUDA tree" "$log_dir/build-cuda.log" make -C build/cuda -j"$jobs"; then
        echo "== GPU tests (CUDA tree)"
        make -C build/cuda -j"$jobs" check \
            TESTS="tests/gpu/gpu_selftest.sh tests/cli/sdtool.sh tests/mpi/device.sh \
                   tests/gpu/norm_emulate.sh tests/gpu/flash_emulate.sh tests/gpu/elem_emulate.sh \
                   tests/gpu/test_cuda_conv_graph" \
            >"$log_dir/check-cuda.log" 2>&1
        grep -E "^(PASS|FAIL|SKIP|ERROR):" "$log_dir/check-cuda.log" || true
        count_check "$log_dir/check-cuda.log"
        show_failures build/cuda
    fi
else
    echo "== CUDA toolkit not found: CUDA tree not built"
    skipped=$((skipped + 1))
fi

if [ "${SD_SKIP_DISTCHECK:-0}" != 1 ]; then
    if ! step "make distcheck" "$log_dir/distcheck.log" make -C build/cpu -j"$jobs" distcheck; then
        # a failed distcheck leaves its build tree (read-only): the failed tests' logs are there
        for sub in build/cpu/sdtrain-*/_build/sub; do
            [ -d "$sub" ] && show_failures "$sub"
        done
    fi
else
    skipped=$((skipped + 1))
fi

if [ ${#failed_logs[@]} -gt 0 ]; then
    echo
    echo "== failed tests (the last lines of each log; whole logs above)"
    for f in "${failed_logs[@]}"; do
        echo "---- $f"
        grep -E "^(FAIL|ERROR|not ok)" "$f" | head -n 5
        tail -n 12 "$f"
    done
fi
echo
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
