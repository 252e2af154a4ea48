# Shared helpers for the shell tests: paths, a scratch directory, the MPI launcher, assertions.
# Sourced by tests/*/*.sh, which automake runs with top_srcdir/top_builddir/MPIEXEC exported.
set -u
: "${top_srcdir:?run through make check}" "${top_builddir:?run through make check}"
SDTRAIN="$top_builddir/sdtrain"
SDTOOL="$top_builddir/sdtool"
# A test whose file name another test shares (tests/mpi/train.sh, tests/gpu/train.sh) sets
# SD_TEST_NAME before sourcing this, so that the two never share (and delete) a scratch directory.
TEST_NAME=${SD_TEST_NAME:-$(basename "$0" .sh)}
TMP="$top_builddir/tests/tmp/$TEST_NAME"
rm -rf "$TMP"
mkdir -p "$TMP"
# Open MPI as root needs these besides the launcher flags (singleton runs read them too).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Containers often forbid the cross-memory-attach copy; fall back to plain shared memory.
export OMPI_MCA_btl_vader_single_copy_mechanism=none
# The launcher's rank-count flag; srun users set MPIEXEC="srun" MPIEXEC_NP="-n".
MPIEXEC_NP=${MPIEXEC_NP:--np}

fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
pass() { echo "ok: $*"; }
need_mpi() { [ -n "${MPIEXEC:-}" ] || skip "no MPI launcher (MPIEXEC is empty)"; }
# need_gpu: skip without a CUDA build or a usable GPU ($TMP/device.out keeps `sdtool device`)
need_gpu() {
    [ "$SD_TEST_CUDA_BUILD" = yes ] || skip "built without CUDA (./configure --with-cuda)"
    "$SDTOOL" device >"$TMP/device.out" 2>&1 || skip "no usable GPU: $(grep gpus "$TMP/device.out")"
}

# run NAME CMD...: runs CMD with a time limit, stdout/stderr to $TMP/NAME.out/.err, status in RC.
run() {
    name=$1
    shift
    RC=0
    timeout 180 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || RC=$?
    [ "$RC" != 124 ] || fail "$name: timed out (hang?): $*"
}

# mpi NAME NP CMD...: like run, under the MPI launcher with NP ranks.
# Open MPI 4's mpirun now and then reports a rank that has finished normally as "rank N with
# PID 0 ... exiting improperly" and exits non-zero (a launcher race on loaded machines,
# open-mpi/ompi#7833 and #12607; seen once in CI's make distcheck, after every rank of the test
# had done its work). PID 0 is the launcher's bookkeeping, not a process of ours; a real early
# exit or crash names its PID or signal. Such a run is repeated once, saying so in the log.
mpi() {
    name=$1
    np=$2
    shift 2
    # shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
    run "$name" $MPIEXEC $MPIEXEC_NP "$np" "$@"
    if [ "$RC" != 0 ] && grep -q "with PID 0 on" "$TMP/$name.err" &&
        grep -q "exiting improperly" "$TMP/$name.err"; then
        echo "# $name: mpirun reported a rank with PID 0 exiting improperly (exit $RC; Open MPI's launcher race): running it again" >&2
        # shellcheck disable=SC2086
        run "$name" $MPIEXEC $MPIEXEC_NP "$np" "$@"
    fi
}

expect_rc() {
    [ "$RC" = "$2" ] || { cat "$TMP/$1.out" "$TMP/$1.err" >&2; fail "$1: exit status $RC, expected $2"; }
}

# expect_in NAME out|err FIXED-STRING
expect_in() {
    grep -qF -- "$3" "$TMP/$1.$2" || { cat "$TMP/$1.out" "$TMP/$1.err" >&2; fail "$1: '$3' not in std$2"; }
}
expect_not_in() {
    ! grep -qF -- "$3" "$TMP/$1.$2" || { cat "$TMP/$1.$2" >&2; fail "$1: '$3' unexpectedly in std$2"; }
}
# expect_count NAME out|err FIXED-STRING N: the string appears on exactly N lines.
expect_count() {
    n=$(grep -cF -- "$3" "$TMP/$1.$2" || true)
    [ "$n" = "$4" ] || { cat "$TMP/$1.$2" >&2; fail "$1: '$3' on $n lines of std$2, expected $4"; }
}

# usr1_after_first_step NAME PID METRICS: once METRICS (a metrics.jsonl) has a loss line, sends
# SIGUSR1 to PID (a background job of the caller: a launcher, a job script) and waits for it,
# at most 120 s; its status in RC.
usr1_after_first_step() {
    i=0
    while ! grep -q '"loss"' "$3" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 600 ] || { kill -KILL "$2"; fail "$1: no training step within 60 s"; }
        sleep 0.1
    done
    kill -USR1 "$2"
    ( sleep 120; kill -KILL "$2" 2>/dev/null ) &
    watchdog=$!
    RC=0
    wait "$2" || RC=$?
    kill $watchdog 2>/dev/null || true
}

# nml FILE <<EOF: writes a namelist into the scratch directory.
nml() { cat >"$TMP/$1"; }

# need_eio_shim: PRELOAD := the failing disk of the storage tests (tests/mpi/eio_preload.so,
# built by make check; doc/testing.md); skips without the shim. LD_PRELOAD reaches mpirun too:
# when sdtrain is built with ASan, its runtime is not preloaded (in mpirun it reported
# Open MPI's own use-after-free on the MPI_Abort path and killed the launcher, leaving a rank
# behind); the sanitizer is told instead not to insist on coming first in the library list.
need_eio_shim() {
    shim="$(cd "$top_builddir" && pwd)/tests/mpi/eio_preload.so"
    [ -f "$shim" ] || skip "no tests/mpi/eio_preload.so (built by make check)"
    PRELOAD=$shim
    if ldd "$SDTRAIN" 2>/dev/null | grep -q 'libasan[.]so'; then
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
        export ASAN_OPTIONS
    fi
}

# The tiny model of the end-to-end tests (the body of a &model group) and its tokenizer.
TINY_TOKENIZER="$top_srcdir/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz"
TINY_MODEL="resolution = 32, block_out_channels = 16, 32, attention_head_dim = 2, norm_num_groups = 8,
  cross_attention_dim = 32, text_hidden_size = 32, text_layers = 1, text_heads = 4,
  vae_block_out_channels = 8, 8, 16, 16, tokenizer = '$TINY_TOKENIZER', layers_per_block = 1"

# width_metadata DIR: the .json of the 48 samples of the demo folder DIR (make-demo-data --count
# 48) for the metadata filter 'original_width >= 512': sample i's original_width is 1024 when i %
# 4 is 0 or 2 (kept: 24), 300 when it is 1 (filtered: 12), and it has no .json when it is 3
# (no_metadata: 12); each shard of 16 then holds 8 kept samples
width_metadata() {
    i=0
    while [ $i -lt 48 ]; do
        j="$1/00000/$(printf %09d $i).json"
        case $((i % 4)) in
        0 | 2) echo '{"original_width": 1024}' >"$j" ;;
        1) echo '{"original_width": 300}' >"$j" ;;
        *) rm -f "$j" ;;
        esac
        i=$((i + 1))
    done
}

# tiny_train_nml NAME BATCH SHARDING [TRAIN-KEYS] [GROUPS]: $TMP/NAME.nml, the end-to-end tests'
# training run of the tiny model on $TMP/shards: 10 steps (STEPS=N to change), validation every
# 5 (VAL_EVERY=N; 0: none), on the CPU (DEVICE=cuda to change), AdamW with warmup, clipping,
# EMA, caption dropout and min-SNR.
# TRAIN-KEYS is appended to &train (", key = value, ..."), GROUPS after the last group.
tiny_train_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'train', output_dir = '$TMP/$1', seed = 11, device = '${DEVICE:-cpu}' /
&model $TINY_MODEL /
&data shard_dir = '$TMP/shards', val_fraction = 0.2 /
&train max_steps = ${STEPS:-10}, batch_size_per_rank = $2, learning_rate = 1e-3, warmup_steps = 3,
       sharding = '$3', grad_clip = 0.5, log_every = 5, val_every = ${VAL_EVERY:-5}, ema_decay = 0.9${4:-} /
&diffusion caption_dropout = 0.2, min_snr_gamma = 5.0 /
${5:-}
EOF2
}

# The training tests' comparisons of two runs under $TMP (NAME and REF).
# losses NAME [FROM]: the step and validation loss lines of a run's metrics after step FROM,
# timings left out
losses() {
    grep -o '"step": [0-9]*, \("epoch": [0-9]*, "loss"\|"val_loss"\): [^,}]*' "$TMP/$1/metrics.jsonl" |
        awk -v from="${2:--1}" '{ s = $2; sub(",", "", s); if (s + 0 > from) print }'
}
# same_weights NAME REF: the final weights and EMA, bit for bit
same_weights() {
    for f in unet_final unet_ema; do
        cmp -s "$TMP/$2/$f.safetensors" "$TMP/$1/$f.safetensors" ||
            fail "$1: $f.safetensors differs from $2's"
    done
}
# same_run NAME REF [FROM]: same_weights, and the same loss lines (those after step FROM)
same_run() {
    same_weights "$1" "$2"
    losses "$2" "${3:--1}" >"$TMP/l-$2"
    losses "$1" "${3:--1}" >"$TMP/l-$1"
    [ -s "$TMP/l-$1" ] || fail "$1: no loss lines in $TMP/$1/metrics.jsonl"
    cmp -s "$TMP/l-$2" "$TMP/l-$1" || { diff "$TMP/l-$2" "$TMP/l-$1" >&2; fail "$1: losses differ from $2's"; }
}
# latest_is NAME DIR: $TMP/NAME/checkpoints/latest names DIR (step-NNNNNNNN)
latest_is() {
    [ "$(cat "$TMP/$1/checkpoints/latest" 2>/dev/null)" = "$2" ] ||
        fail "$1: latest is '$(cat "$TMP/$1/checkpoints/latest" 2>/dev/null)', expected '$2'"
}
# flip_byte FILE [DATASET [BYTE]]: one byte of a checkpoint's state file changed: byte BYTE
# (default 1001) of DATASET's data (default adam_m), found with h5dump; without h5dump a byte of
# the middle of the file. $dataset says which dataset it hit, or is empty.
flip_byte() {
    if command -v h5dump >/dev/null 2>&1; then
        off=$(h5dump -p -H -d "${2:-adam_m}" "$1" | sed -n 's/^ *OFFSET \([0-9]*\).*/\1/p')
        off=$((off + ${3:-1001}))
        dataset=${2:-adam_m}
    else
        off=$(($(wc -c <"$1") / 2))
        dataset=
    fi
    byte=$(od -An -tu1 -j "$off" -N1 "$1" | tr -d ' ')
    printf "\\$(printf %03o $(((byte + 1) % 256)))" | dd of="$1" bs=1 seek="$off" conv=notrunc 2>/dev/null
}

# storage_train_nml NAME: $TMP/NAME.nml, the storage tests' training run of the tiny model on
# $TMP/shards into $TMP/NAME: 8 steps of 2 ranks x 4 with ZeRO-2, validation and a checkpoint
# every 4 steps, EMA.
storage_train_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'train', output_dir = '$TMP/$1', seed = 11 /
&model $TINY_MODEL /
&data shard_dir = '$TMP/shards', val_fraction = 0.2 /
&train max_steps = 8, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 3,
       sharding = 'shard_grad_op', log_every = 4, val_every = 4, ema_decay = 0.9 /
&checkpoint every_n_steps = 4 /
EOF2
}

# tiny_sample_nml NAME SCHEDULER [SAMPLE-KEYS] [GROUPS]: $TMP/NAME.nml, the sampling tests' run
# on the tiny-sd2 snapshot with the tiny tokenizer of tests/data/sample: 3 prompts x 2 images,
# 3 steps, guidance 7.5, on the CPU (DEVICE=cuda to change). SAMPLE-KEYS is appended to &sample
# (", key = value, ..."), GROUPS after the last group.
tiny_sample_nml() {
    nml "$1.nml" <<EOF2
&run mode = 'sample', output_dir = '$TMP/$1', seed = 7, device = '${DEVICE:-cpu}' /
&model pretrained = '$top_srcdir/tests/data/models/tiny-sd2',
       tokenizer = '$top_srcdir/tests/data/sample/tokenizer', resolution = 16 /
&sample prompts = 'a photo of the cat', 'red car at the sea', 'x "quoted" \\ back',
        num_steps = 3, guidance_scale = 7.5, scheduler = '$2', images_per_prompt = 2${3:-} /
${4:-}
EOF2
}

# tiny_shards COUNT NP: COUNT demo images into $TMP/data, encoded by mode 'process' on NP ranks
# into $TMP/shards (16 samples a shard, seed 5) on the CPU, so every machine gets the same bits.
tiny_shards() {
    run data "$SDTOOL" make-demo-data "$TMP/data" --count "$1"
    expect_rc data 0
    nml proc.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc', seed = 5, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards', samples_per_shard = 16, encode_batch_size = 8 /
EOF2
    mpi proc "$2" "$SDTRAIN" "$TMP/proc.nml"
    expect_rc proc 0
}
