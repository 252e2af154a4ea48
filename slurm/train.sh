#!/bin/bash
# Training from latent shards (&run mode = 'train'), one rank per GPU.
#   sbatch slurm/train.sh inputs/sd2-base-256.nml [--set group.key=value ...]
# --requeue lets Slurm restart the job after a node failure; sdtrain then resumes from the
# newest complete checkpoint (&checkpoint resume = 'auto', doc/checkpoints.md). Five minutes
# before the time limit Slurm sends SIGUSR1 to this script (B:), which passes it on to the
# ranks: they checkpoint at the next step boundary and exit 0 ("checkpointed at step K after
# SIGUSR1; resubmit to continue"), and the script requeues the job, which then resumes.
# When the run fails (a rank killed, out of memory, an NCCL error: any exit status but 0 and 2,
# the status of bad input, which a retry would not mend) the script requeues the job too, at
# most SDTRAIN_MAX_RESTARTS (default 3) times in a row; the count lives in the job's Comment
# (sdtrain-failures=N) and a time-limit requeue, which means progress, resets it. A job that
# stops making progress without dying (a hung file system, a stuck rank) ends itself with status 1
# after &run stall_timeout (default 30 min) and is requeued the same way.
# A pipeline job (online preprocessing, doc/training.md) runs the same way with
# --set run.mode=pipeline --set run.n_process_ranks=P after the input (a later --set wins): both
# halves stop cleanly on SIGUSR1 (doc/checkpoints.md "Signals and Slurm"), and the requeued job
# resumes from the committed shards and the newest checkpoint.
#SBATCH --job-name=sdtrain-train
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=%x-%j.out
set -euo pipefail

input=${1:?usage: sbatch slurm/train.sh INPUT.nml [--set group.key=value ...]}
shift
sdtrain=${SDTRAIN:-$(command -v sdtrain || echo build/cuda/sdtrain)}
# --kill-on-bad-exit: a rank that dies (OOM killer, a lost node) ends the whole step at once;
# without it the other ranks would wait in their next collective until the time limit (on the
# GPU they also watch NCCL: SDTRAIN_NCCL_TIMEOUT, doc/training.md). --gpus-per-task=1 (with
# --gpus-per-node removed) works as well: the ranks tell GPUs apart by UUID.
launch=${LAUNCH:-srun --mpi=pmix --cpu-bind=cores --kill-on-bad-exit=1}
# a launcher that is not there (outside Slurm: no srun) is named, with what to set instead
command -v "${launch%% *}" >/dev/null 2>&1 || {
    echo "slurm/train.sh: the launcher '${launch%% *}' is not found; outside Slurm set LAUNCH," \
        "e.g. LAUNCH='mpirun -np 4'" >&2
    exit 2
}
# One OpenMP thread per CPU of the task. srun (Slurm >= 22.05) no longer takes --cpus-per-task
# from sbatch: without SRUN_CPUS_PER_TASK each rank would get (and be bound to) one core.
# Outside Slurm OMP_NUM_THREADS is left as it is (unset: sdtrain shares the node's cores).
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi

# Refuse a bad configuration before the allocation's GPUs sit idle waiting for all ranks.
"$sdtrain" --check "$input" --np "${SLURM_NTASKS:-1}" --set run.mode=train "$@" >/dev/null
stop=0
pid=""
caught=0
# a signal after the run has ended (it finished just before the time limit) requeues nothing
trap 'caught=1; if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then stop=1; kill -USR1 "$pid" 2>/dev/null || true; fi' USR1
# shellcheck disable=SC2086 # $launch is a command with flags
$launch "$sdtrain" "$input" --set run.mode=train "$@" &
pid=$!
# wait returns early (status > 128) when the trap runs; the launcher (srun forwards SIGUSR1 to
# every task) goes on until the checkpoint is written, or has just ended: wait again for its own
# status (the shell keeps it), so that an exit 0 right after the signal is not taken for a failure
while :; do
    caught=0
    rc=0
    wait "$pid" || rc=$?
    if [ "$caught" = 0 ] || [ "$rc" -le 128 ]; then
        break
    fi
done
if [ -n "${SLURM_JOB_ID:-}" ]; then
    if [ "$stop" = 1 ] && [ "$rc" = 0 ]; then
        echo "sdtrain stopped for the time limit with a checkpoint; requeueing job $SLURM_JOB_ID"
        scontrol update JobId="$SLURM_JOB_ID" Comment=sdtrain-failures=0 || true
        scontrol requeue "$SLURM_JOB_ID" || true
    elif [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
        max=${SDTRAIN_MAX_RESTARTS:-3}
        failures=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
            sed -n 's/.*Comment=sdtrain-failures=\([0-9]*\).*/\1/p' || true)
        failures=${failures:-0}
        if [ "$failures" -lt "$max" ]; then
            echo "sdtrain failed (exit $rc); requeueing job $SLURM_JOB_ID to resume from its newest" \
                "checkpoint (failure $((failures + 1)) of at most $max in a row)"
            scontrol update JobId="$SLURM_JOB_ID" Comment="sdtrain-failures=$((failures + 1))" || true
            scontrol requeue "$SLURM_JOB_ID" || true
        else
            echo "sdtrain failed (exit $rc) $((failures + 1)) times in a row; not requeueing" \
                "(SDTRAIN_MAX_RESTARTS=$max)"
        fi
    fi
fi
exit "$rc"
