#!/bin/bash
# Images from a trained model (&run mode = 'sample'): the prompts' images are split over the ranks.
#   sbatch slurm/sample.sh inputs/sd2-base-sample.nml [--set group.key=value ...]
# Image j of prompt p depends on (seed, p, j) only. A rerun with the same settings keeps the
# images already written and makes the rest (&sample resume = 'auto', doc/sampling.md
# "Resuming"), so a long evaluation set needs no more than requeues: five minutes before the
# time limit Slurm sends SIGUSR1 to this script (B:), which passes it on to the ranks; they stop
# after the batch they are denoising and exit 0 ("stopped for SIGUSR1: K of the N image(s) are
# in ..."), and the script requeues the job, which goes on from those images. When the run fails
# (a rank killed, out of memory, a stall that &run stall_timeout ended: any exit status but 0
# and 2, the status of bad input, which a retry would not mend) the script requeues the job too,
# at most SDTRAIN_MAX_RESTARTS (default 3) times in a row; the count lives in the job's Comment
# (sdtrain-failures=N), as in slurm/train.sh.
#SBATCH --job-name=sdtrain-sample
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=%x-%j.out
set -euo pipefail

input=${1:?usage: sbatch slurm/sample.sh INPUT.nml [--set group.key=value ...]}
shift
# The installed binary, or the one of a build tree (SDTRAIN=/path/to/sdtrain to choose).
sdtrain=${SDTRAIN:-$(command -v sdtrain || echo build/cuda/sdtrain)}
# srun starts the MPI ranks through Slurm's PMIx; set LAUNCH="mpirun" where that is missing.
launch=${LAUNCH:-srun --mpi=pmix --cpu-bind=cores --kill-on-bad-exit=1}
# a launcher that is not there (outside Slurm: no srun) is named, with what to set instead
command -v "${launch%% *}" >/dev/null 2>&1 || {
    echo "slurm/sample.sh: the launcher '${launch%% *}' is not found; outside Slurm set LAUNCH," \
        "e.g. LAUNCH='mpirun -np 4'" >&2
    exit 2
}
# One OpenMP thread per CPU of the task. srun (Slurm >= 22.05) no longer takes --cpus-per-task
# from sbatch: without SRUN_CPUS_PER_TASK each rank would get (and be bound to) one core.
# Outside Slurm OMP_NUM_THREADS is left as it is (unset: sdtrain shares the node's cores).
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then
    export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
fi

"$sdtrain" --check "$input" --np "${SLURM_NTASKS:-1}" --set run.mode=sample "$@" >/dev/null
stop=0
pid=""
caught=0
# a signal after the run has ended (it finished just before the time limit) requeues nothing
trap 'caught=1; if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then stop=1; kill -USR1 "$pid" 2>/dev/null || true; fi' USR1
# shellcheck disable=SC2086 # $launch is a command with flags
$launch "$sdtrain" "$input" --set run.mode=sample "$@" &
pid=$!
# wait returns early (status > 128) when the trap runs; the launcher (srun forwards SIGUSR1 to
# every task) goes on until the ranks' batches are written: wait again for its own status
while :; do
    caught=0
    rc=0
    wait "$pid" || rc=$?
    if [ "$caught" = 0 ] || [ "$rc" -le 128 ]; then
        break
    fi
done
if [ -n "${SLURM_JOB_ID:-}" ] && [ "$stop" = 1 ] && [ "$rc" = 0 ]; then
    echo "sdtrain stopped for the time limit; requeueing job $SLURM_JOB_ID to go on from the" \
        "images written"
    scontrol update JobId="$SLURM_JOB_ID" Comment=sdtrain-failures=0 || true
    scontrol requeue "$SLURM_JOB_ID" || true
elif [ -n "${SLURM_JOB_ID:-}" ] && [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
    max=${SDTRAIN_MAX_RESTARTS:-3}
    failures=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
        sed -n 's/.*Comment=sdtrain-failures=\([0-9]*\).*/\1/p' || true)
    failures=${failures:-0}
    if [ "$failures" -lt "$max" ]; then
        echo "sdtrain failed (exit $rc); requeueing job $SLURM_JOB_ID to go on from the images" \
            "written (failure $((failures + 1)) of at most $max in a row)"
        scontrol update JobId="$SLURM_JOB_ID" Comment="sdtrain-failures=$((failures + 1))" || true
        scontrol requeue "$SLURM_JOB_ID" || true
    else
        echo "sdtrain failed (exit $rc) $((failures + 1)) times in a row; not requeueing" \
            "(SDTRAIN_MAX_RESTARTS=$max)"
    fi
fi
exit "$rc"
