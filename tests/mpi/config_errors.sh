#!/bin/sh
# Configuration errors under mpirun: file:line:col, one message, exit 2, no hang, no abort spam.
. "$top_srcdir/tests/lib.sh"
need_mpi

nml typo.nml <<'EOF2'
&run mode = 'train' /
&data shard_dir = 'shards' /
&train
  max_steps = 10
  lerning_rate = 1e-4   ! misspelled
/
EOF2
mpi typo 4 "$SDTRAIN" "$TMP/typo.nml"
expect_rc typo 2
expect_count typo err "typo.nml:5:3: unknown key 'lerning_rate' in &train (did you mean 'learning_rate'?)" 1
[ "$(wc -l <"$TMP/typo.err")" -le 12 ] || fail "typo: too much on stderr"
expect_not_in typo err "MPI_ABORT"
expect_not_in typo err "[rank 1]"
expect_not_in typo out "configuration is valid"

nml badmode.nml <<'EOF2'
&run mode = 'trian' /
EOF2
mpi badmode 3 "$SDTRAIN" --check "$TMP/badmode.nml"
expect_rc badmode 2
expect_count badmode err "badmode.nml:1:13: invalid value 'trian' for &run mode: expected one of 'process', 'train', 'pipeline', 'sample' (did you mean 'train'?)" 1

nml syntax.nml <<'EOF2'
&run mode = 'train
/
EOF2
mpi syntax 2 "$SDTRAIN" "$TMP/syntax.nml"
expect_rc syntax 2
expect_count syntax err "syntax.nml:1:13: " 1

# --set is validated like the file
nml ok.nml <<'EOF2'
&run mode = 'train', output_dir = 'unused' /
&data shard_dir = 'shards' /
EOF2
mpi set 2 "$SDTRAIN" --check "$TMP/ok.nml" --set train.batch_size_per_rank=0
expect_rc set 2
expect_count set err "command line: --set 'train.batch_size_per_rank=0': value out of range for &train batch_size_per_rank: 0 (allowed: 1 to 2147483647)" 1
mpi setkey 2 "$SDTRAIN" --check "$TMP/ok.nml" --set train.lr=1e-3
expect_rc setkey 2
expect_in setkey err "unknown key 'lr' in &train"

# a bad SDTRAIN_FAULT is refused before anything runs
SDTRAIN_FAULT="kill:rank=x" mpi fault 2 "$SDTRAIN" --check "$TMP/ok.nml"
expect_rc fault 2
expect_count fault err "SDTRAIN_FAULT" 1
# noise schedules the samplers cannot run (NaN or overflow), located at the key
nml sched.nml <<'EOF2'
&run mode = 'train' /
&data shard_dir = 'shards' /
&diffusion
  beta_schedule = 'linear'
  beta_end = 0.95
/
EOF2
mpi sched 2 "$SDTRAIN" --check "$TMP/sched.nml"
expect_rc sched 2
expect_count sched err "sched.nml:5:3: &diffusion: the schedule's alphas_cumprod falls to 0 at the last timestep" 1
run schednp "$SDTRAIN" --check "$TMP/sched.nml" --np 4 --set diffusion.beta_end=0.02 \
    --set diffusion.beta_start=1e-16
expect_rc schednp 2
expect_in schednp err "command line: --set #2: &diffusion: beta_start 1e-16 is too small"
pass "configuration errors under MPI"
