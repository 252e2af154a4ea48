#!/bin/sh
# The job scripts on a real Slurm: a one-node cluster of this machine (slurmctld and slurmd of
# Debian's slurm-wlm, auth/none, private ports and state in the scratch directory), the scripts
# submitted with sbatch as users do, their #SBATCH sizes overridden on the command line (one node,
# 2 tasks, no GPUs), the ranks started by srun --mpi=pmix:
#   1. sbatch slurm/process.sh: the shards, with 2 ranks; sbatch slurm/sample.sh: images;
#   2. sbatch slurm/train.sh, then SIGUSR1 to the batch script (scancel --signal=USR1 --batch,
#      what --signal=B:USR1@300 does before the time limit): the ranks checkpoint, the script
#      requeues the job, Slurm starts it again (its requeue delay skipped with scontrol update
#      StartTime=now) and it resumes from the checkpoint and completes: JobState COMPLETED,
#      Restarts 1;
#   3. a rank killed during the first run (SDTRAIN_FAULT): srun --kill-on-bad-exit ends the
#      step at once, the script requeues the job, which resumes from its last checkpoint and
#      completes (Restarts 1);
#   4. the same with SDTRAIN_MAX_RESTARTS=0: FAILED, not requeued.
# Skips without the Slurm daemons, as non-root, or when the cluster does not come up.
. "$top_srcdir/tests/lib.sh"
for c in slurmctld slurmd sbatch scontrol scancel sinfo srun; do
    command -v "$c" >/dev/null 2>&1 || skip "no $c (Debian: slurm-wlm)"
done
[ "$(id -u)" = 0 ] || skip "the test cluster's slurmd runs as root"

# Configuration and logs in the scratch directory; the controller's state and slurmd's spool
# (where slurmstepd and the pmix plugin make their Unix sockets, named after the host, the job and
# the step) in a short directory of /tmp: a socket path has at most 107 bytes, which a make
# distcheck tree under a long host name exceeds.
S="$TMP/slurm"
R=$(mktemp -d /tmp/sdslurm.XXXXXX) || fail "mktemp -d /tmp/sdslurm.XXXXXX"
mkdir -p "$S" "$R/state" "$R/spool"
host=$(hostname -s)
port=$((20000 + $$ % 20000))
cat >"$S/slurm.conf" <<EOF2
ClusterName=sdtraintest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$R/state
SlurmdSpoolDir=$R/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobRequeue=1
ReturnToService=2
KillWait=2
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF2
export SLURM_CONF="$S/slurm.conf"
stop_cluster() {
    st=$?
    if [ "$st" != 0 ] && [ "$st" != 77 ]; then
        for f in "$S/slurmctld.log" "$S/slurmd.log"; do
            [ -f "$f" ] && { echo "---- the last lines of $f" >&2; tail -n 15 "$f" >&2; }
        done
    fi
    scontrol shutdown >/dev/null 2>&1 || true
    for f in "$S/slurmd.pid" "$S/slurmctld.pid"; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 20 ]; do
            i=$((i + 1))
            sleep 0.25
        done
        kill -KILL "$p" 2>/dev/null || true
    done
    rm -rf "$R"
}
trap stop_cluster EXIT
slurmctld -c -i >"$S/ctld.out" 2>&1 || skip "slurmctld does not start: $(tail -1 "$S/ctld.out")"
slurmd >"$S/d.out" 2>&1 || skip "slurmd does not start: $(tail -1 "$S/d.out")"
i=0
until [ "$(sinfo -h -o %t 2>/dev/null)" = idle ]; do
    i=$((i + 1))
    [ $i -lt 60 ] || skip "the test cluster did not come up: $(sinfo -h 2>&1 | head -1)"
    sleep 0.5
done

export SDTRAIN
SIZE="--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 --time=10"
# job_state ID: "JobState=... Restarts=N"
job_state() { scontrol show job "$1" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*\|Restarts=[0-9]*' | tr '\n' ' '; }
# wait_state ID PATTERN SECONDS: until the job's state matches the shell pattern
wait_state() {
    i=0
    while :; do
        st=$(job_state "$1")
        # shellcheck disable=SC2254 # the pattern is the caller's
        case "$st" in $2) return 0 ;; esac
        i=$((i + 1))
        [ $i -lt $(($3 * 5)) ] || fail "job $1: '$st' after $3 s, waiting for '$2' (see $TMP/*.out, $S/*.log)"
        sleep 0.2
    done
}

# release ID: start a requeued job now rather than after Slurm's two-minute requeue delay; a
# launch within the second of the requeue would meet its revoked credential ("Job credential
# revoked"), which is what the delay is for, so wait a little first
release() {
    sleep 2
    scontrol update JobId="$1" StartTime=now
}

# 1. preprocessing
run data "$SDTOOL" make-demo-data "$TMP/data" --count 48
expect_rc data 0
nml proc.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/proc', seed = 5 /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards', samples_per_shard = 16, encode_batch_size = 8 /
EOF2
# shellcheck disable=SC2086 # SIZE holds several options
pid_=$(sbatch --parsable $SIZE -o "$TMP/proc-%j.out" "$top_srcdir/slurm/process.sh" "$TMP/proc.nml") ||
    fail "sbatch slurm/process.sh refused"
wait_state "$pid_" "*COMPLETED*" 90
grep -q "preprocessing summary: 48 samples read, 48 kept, 0 skipped, 3 new shard(s)" "$TMP"/proc-*.out ||
    fail "process.sh under sbatch: $(tail -5 "$TMP"/proc-*.out)"
grep -q "on 2 rank(s)" "$TMP"/proc-*.out || fail "process.sh under sbatch did not run 2 ranks"
pass "sbatch slurm/process.sh: 3 shards from 2 ranks started by srun --mpi=pmix"

# sampling: sbatch slurm/sample.sh on the tiny-sd2 snapshot, 6 images from 2 ranks
DEVICE=cpu tiny_sample_nml samp ddim
# shellcheck disable=SC2086
sid=$(sbatch --parsable $SIZE -o "$TMP/samp-%j.out" "$top_srcdir/slurm/sample.sh" "$TMP/samp.nml") ||
    fail "sbatch slurm/sample.sh refused"
wait_state "$sid" "*COMPLETED*" 90
grep -q "wrote 6 image(s)" "$TMP"/samp-*.out || fail "sample.sh under sbatch: $(tail -3 "$TMP"/samp-*.out)"
[ "$(ls "$TMP/samp/samples"/*.png | wc -l)" = 6 ] || fail "sample.sh: $(ls "$TMP/samp/samples")"
pass "sbatch slurm/sample.sh: 6 images from 2 ranks"

# 2. the time-limit signal, the requeue, the resumed job
nml train.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/train', seed = 11 /
&model $TINY_MODEL /
&data shard_dir = '$TMP/shards', val_fraction = 0.2 /
&train max_steps = 1000000, batch_size_per_rank = 4, learning_rate = 1e-3, log_every = 1,
       val_every = 0 /
&checkpoint every_n_steps = 0 /
EOF2
# shellcheck disable=SC2086
id=$(sbatch --parsable $SIZE --open-mode=append -o "$TMP/train.out" "$top_srcdir/slurm/train.sh" \
    "$TMP/train.nml") || fail "sbatch slurm/train.sh refused"
i=0
while ! grep -q '"loss"' "$TMP/train/metrics.jsonl" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 600 ] || fail "job $id: no training step within 60 s: $(job_state "$id"); $(tail -3 "$TMP/train.out")"
    sleep 0.1
done
scancel --signal=USR1 --batch "$id" || fail "scancel --signal=USR1 --batch $id"
wait_state "$id" "*PENDING*Restarts=1*" 60
grep -q "after SIGUSR1; resubmit to continue" "$TMP/train.out" || fail "no checkpoint after SIGUSR1: $(tail -5 "$TMP/train.out")"
grep -q "requeueing job $id" "$TMP/train.out" || fail "the script did not requeue"
k=$(sed -n 's/^checkpointed at step \([0-9]*\) after SIGUSR1.*/\1/p' "$TMP/train.out")
# the requeued job reads the namelist again: let it end two steps after the checkpoint (the first
# run had a step budget it could not reach before the signal, however fast the machine)
sed -i "s/max_steps = 1000000/max_steps = $((k + 2))/" "$TMP/train.nml"
release "$id"
wait_state "$id" "*COMPLETED*Restarts=1*" 90
grep -q "resuming from $TMP/train/checkpoints/$(printf 'step-%08d' "$k")" "$TMP/train.out" ||
    fail "the requeued job did not resume from step $k: $(grep -m3 resum "$TMP/train.out")"
[ -f "$TMP/train/unet_final.safetensors" ] || fail "the resumed job wrote no final weights"
pass "sbatch slurm/train.sh: SIGUSR1 -> checkpoint at step $k, requeued, resumed, completed"

# 3. a rank killed in the first run only (the launcher below injects the fault while
#    SLURM_RESTART_COUNT is 0): srun --kill-on-bad-exit ends the step at once, the script
#    requeues the failed job, and the restarted job resumes from the checkpoint of step 2
sed -e 's/every_n_steps = 0/every_n_steps = 2/' -e 's/max_steps = [0-9]*/max_steps = 8/' \
    "$TMP/train.nml" >"$TMP/retry.nml"
cat >"$TMP/launch.sh" <<EOF2
#!/bin/sh
[ "\${SLURM_RESTART_COUNT:-0}" != 0 ] || export SDTRAIN_FAULT="kill:rank=1:step=3"
exec srun --mpi=pmix --cpu-bind=cores --kill-on-bad-exit=1 "\$@"
EOF2
chmod +x "$TMP/launch.sh"
# shellcheck disable=SC2086
rid=$(LAUNCH="$TMP/launch.sh" sbatch --parsable $SIZE --open-mode=append -o "$TMP/retry.out" \
    "$top_srcdir/slurm/train.sh" "$TMP/retry.nml" --set run.output_dir="'$TMP/retry'") ||
    fail "sbatch slurm/train.sh refused"
wait_state "$rid" "*PENDING*Restarts=1*" 60
grep -q "killing this rank at step 3" "$TMP/retry.out" || fail "the fault was not injected: $(tail -3 "$TMP/retry.out")"
grep -q "requeueing job $rid to resume from its newest checkpoint (failure 1 of at most 3 in a row)" \
    "$TMP/retry.out" || fail "the failed job was not requeued: $(tail -3 "$TMP/retry.out")"
release "$rid"
wait_state "$rid" "*COMPLETED*Restarts=1*" 90
grep -q "resuming from $TMP/retry/checkpoints/step-00000002" "$TMP/retry.out" ||
    fail "the requeued job did not resume from step 2: $(grep -m3 resum "$TMP/retry.out")"
[ -f "$TMP/retry/unet_final.safetensors" ] || fail "the resumed job wrote no final weights"
pass "a rank killed at step 3: the job is requeued, resumes from step 2 and completes"

# 4. the same with SDTRAIN_MAX_RESTARTS=0: FAILED, not requeued
# shellcheck disable=SC2086
kid=$(SDTRAIN_MAX_RESTARTS=0 SDTRAIN_FAULT="kill:rank=1:step=3" sbatch --parsable $SIZE \
    -o "$TMP/kill.out" "$top_srcdir/slurm/train.sh" "$TMP/retry.nml" \
    --set run.output_dir="'$TMP/kill'") || fail "sbatch slurm/train.sh refused"
wait_state "$kid" "*FAILED*Restarts=0*" 60
grep -q "not requeueing (SDTRAIN_MAX_RESTARTS=0)" "$TMP/kill.out" || fail "$(tail -3 "$TMP/kill.out")"
[ ! -f "$TMP/kill/unet_final.safetensors" ] || fail "a job with a killed rank wrote final weights"
pass "with SDTRAIN_MAX_RESTARTS=0 a killed rank ends the job FAILED at once, not requeued"
