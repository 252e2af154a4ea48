#!/bin/sh
# compute-sanitizer memcheck over whole sdtrain runs on the GPU, one rank each (the op tests get
# theirs in bench/gpu-check.sh --parts sanitizer). Each run must exit 0 with "ERROR SUMMARY: 0
# errors", leaks included:
#   1. mode 'train', device path, fp32: pinned input blocks on the copy stream, the objective on
#      the GPU, validation, checkpoints (staged out of and back into device memory), EMA;
#   2. the same in bf16 with ZeRO-2 and the gradient buckets reduced during the backward (an
#      NCCL communicator of one rank on its side stream), 2 micro-batches a step;
#   3. mode 'sample': Euler ancestral at 24 x 16 px, 2 images a U-Net call, with guidance;
#   4. mode 'process': the tiny encoders on the GPU, the pipelined encoder batches.
# Skips without a CUDA build, a GPU or compute-sanitizer. SD_MEMCHECK overrides the sanitizer
# command (a stand-in for dry runs on the CPU).
SD_TEST_NAME=gpu-memcheck
. "$top_srcdir/tests/lib.sh"

need_gpu
need_mpi
CS=${SD_MEMCHECK:-$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)}
[ -n "$CS" ] || skip "no compute-sanitizer"
DEV=${SD_MEMCHECK_DEVICE:-cuda}

# nccl_probe_only FILE: whether every error memcheck counted in FILE (one rank's run) is an API
# error cudaErrorNoKernelImageForDevice from cudaFuncGetAttributes met inside libnccl's
# ncclCommInitRank. NCCL's ncclCommInitRank asks
# cudaFuncGetAttributes about kernels of its own that have no image for the device's
# architecture and handles the answer itself (seen with NCCL 2.28 on an H200: 4 such errors, each
# backtrace ending in pncclCommInitRank); memcheck counts them all the same. Anything else (a
# memory error, a leak, an API error with no NCCL frame) makes it false.
nccl_probe_only() {
    awk '
        function close_block() { if (inblk && nccl && init) probes++; inblk = 0 }
        /^=+ Program hit cudaErrorNoKernelImageForDevice .*cudaFuncGetAttributes/ {
            close_block(); inblk = 1; nccl = 0; init = 0; hits++; next }
        /^=+ Program hit / { close_block(); other++; next }
        /^=+ (Invalid|Uninitialized|Leaked|Race|Barrier|Unused)/ { close_block(); other++; next }
        /^=+ (ERROR|LEAK) SUMMARY/ { close_block() }
        /^=+ ERROR SUMMARY: [0-9]+ error/ { total = $4 }
        inblk && /libnccl\.so/ { nccl = 1 }
        inblk && /ncclCommInitRank/ { init = 1 }
        inblk && /^=+ *$/ { close_block() }
        END { close_block(); exit !(hits > 0 && probes == hits && other == 0 && total == hits) }' "$1"
}

# memcheck NAME NML: the run under memcheck, clean (NCCL's own probing aside, above)
memcheck() {
    # shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
    RC=0
    timeout 900 $MPIEXEC $MPIEXEC_NP 1 "$CS" --tool memcheck --leak-check full --error-exitcode 99 \
        --print-limit 20 "$SDTRAIN" "$TMP/$2" >"$TMP/$1.out" 2>"$TMP/$1.err" || RC=$?
    [ "$RC" != 124 ] || fail "$1: timed out under memcheck"
    grep -E '^=+ (ERROR SUMMARY|LEAK SUMMARY|Invalid|Program hit)' "$TMP/$1.out" | sed 's/^/  /' | head -8
    if [ "$RC" = 99 ] && nccl_probe_only "$TMP/$1.out"; then
        echo "  $1: the errors counted are NCCL's probing of kernel images inside ncclCommInitRank," \
            "handled by NCCL (not ours); no memory error, no leak"
        expect_in "$1" out "LEAK SUMMARY: 0 bytes leaked"
        # the exit status was memcheck's: the program's own must have been 0
        expect_not_in "$1" out "Target application returned an error"
        return 0
    fi
    expect_rc "$1" 0
    expect_in "$1" out "ERROR SUMMARY: 0 errors"
}

tiny_shards 24 1 # demo images encoded on the CPU into $TMP/shards

STEPS=3 VAL_EVERY=2 DEVICE=$DEV tiny_train_nml train32 4 none ", precision = 'fp32'" \
    "&checkpoint every_n_steps = 2 /"
memcheck train32 train32.nml
expect_in train32 out "checkpoint written"
pass "memcheck: training on the device path in fp32 with validation and checkpoints"

STEPS=3 VAL_EVERY=2 DEVICE=$DEV tiny_train_nml train16 4 shard_grad_op \
    ", precision = 'bf16', grad_reduce = 'overlap', grad_accum_steps = 2" \
    "&checkpoint every_n_steps = 2 /"
memcheck train16 train16.nml
expect_in train16 out "training summary"
expect_in train16 out "checkpoint written"
pass "memcheck: bf16, ZeRO-2, buckets reduced during the backward, 2 micro-batches"

DEVICE=$DEV tiny_sample_nml sample euler_a ", width = 24, height = 16, batch_size = 2" \
    "&train precision = 'fp32' /"
memcheck sample sample.nml
expect_in sample out "wrote 6 image(s)"
pass "memcheck: mode 'sample' (Euler ancestral, 24x16, 2 images a call)"

run data2 "$SDTOOL" make-demo-data "$TMP/data2" --count 12
expect_rc data2 0
nml process.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc2', seed = 7, device = '$DEV' /
&model $TINY_MODEL /
&data input = '$TMP/data2', shard_dir = '$TMP/shards2', samples_per_shard = 8,
      encode_batch_size = 4 /
EOF2
memcheck process process.nml
pass "memcheck: mode 'process' with the encoders on the GPU"
