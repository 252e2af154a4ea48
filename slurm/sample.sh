#!/bin/bash
# Images from a trained model (&run mode = 'sample'): the prompts' images are split over the ranks.
#   sbatch slurm/sample.sh inputs/sd2-base-sample.nml [--set group.key=value ...]
# Image j of prompt p depends on (seed, p, j) only; a rerun writes the same files again.
#SBATCH --job-name=sdtrain-sample
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
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
# shellcheck disable=SC2086 # $launch is a command with flags
exec $launch "$sdtrain" "$input" --set run.mode=sample "$@"
