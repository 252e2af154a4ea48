#!/bin/bash
# Timing stress of mode 'pipeline' (not part of the test suite: about 3 minutes on 2 cores):
# 2 preprocessing + 2 training ranks of the tiny model, plain and with a metadata filter that
# leaves the first shards short of a global batch, DDP and ZeRO-2; against a reference run, 15
# variants each: preprocessing slowed on every rank or on one (SDTRAIN_TEST_SHARD_DELAY_MS = MS
# or RANK:MS), checkpoints every step, every 3 in the background, every 2 read back. Every run
# must end with status 0 and give the reference's unet_final.safetensors bit for bit (the data
# order does not depend on timing, doc/loader.md "Follow mode"). It found the SIGFPE fixed on
# 2026-11-28 (a checkpoint's epoch divided by 0 steps an epoch).
#
#   bash scripts/stress-pipeline.sh [BUILD_DIR]     # default build/cpu; prints bad=0 when all hold
top=$(cd "$(dirname "$0")/.." && pwd)
# the test suite's helpers (tests/lib.sh: the tiny model, the filter's metadata, the launcher's
# environment); the runs go to BUILD_DIR/tests/tmp/stress-pipeline
top_srcdir=$top
top_builddir=$(cd "${1:-$top/build/cpu}" && pwd)
SD_TEST_NAME=stress-pipeline
MPIEXEC=${MPIEXEC:-mpirun --oversubscribe}
. "$top/tests/lib.sh"
T=$TMP
$SDTOOL make-demo-data $T/data --count 48 >/dev/null
cp -r $T/data $T/dataf
width_metadata $T/dataf
mk() { # name data shard_dir train-extra ckpt-extra filter
cat > $T/$1.nml <<EOF
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$T/$1', seed = 11, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$2', shard_dir = '$3', samples_per_shard = 16, encode_batch_size = 8, val_fraction = 0.2 $6 /
&train max_steps = 8, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 2, log_every = 2, val_every = 4 $4 /
&diffusion caption_dropout = 0.2 /
&checkpoint $5 /
EOF
}
go() { # name [env...]
    local n=$1; shift
    env "$@" timeout 300 $MPIEXEC $MPIEXEC_NP 4 $SDTRAIN $T/$n.nml >$T/$n.out 2>$T/$n.err
    echo $?
}
bad=0
for f in plain filt; do
  data=$T/data; filt=""
  [ $f = filt ] && { data=$T/dataf; filt=", filter = 'original_width >= 512'"; }
  for sh in none shard_grad_op; do
    ref=ref-$f-$sh
    mk $ref $data $T/shards-$ref ", sharding = '$sh'" "" "$filt"
    rc=$(go $ref); echo "$ref rc=$rc"
    v=0
    for d in "" 250 1:900 0:1500 1:0; do
      for ck in "every_n_steps = 1" "every_n_steps = 3, async = .true." "every_n_steps = 2, verify = .true."; do
        v=$((v+1)); n=v-$f-$sh-$v
        mk $n $data $T/shards-$n ", sharding = '$sh'" "$ck" "$filt"
        rc=$(go $n SDTRAIN_TEST_SHARD_DELAY_MS=$d)
        same=same; cmp -s $T/$ref/unet_final.safetensors $T/$n/unet_final.safetensors || { same=DIFF; bad=1; }
        [ "$rc" = 0 ] || bad=1
        echo "$n delay='$d' ckpt='$ck' rc=$rc $same"
      done
    done
  done
done
echo "bad=$bad"
[ "$bad" = 0 ]
