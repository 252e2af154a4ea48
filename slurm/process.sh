#!/bin/bash
# Offline preprocessing: images + captions -> HDF5 latent shards (&run mode = 'process').
#   sbatch slurm/process.sh INPUT.nml [--set group.key=value ...]
# All ranks preprocess; shards already committed in &data shard_dir are skipped on a rerun.
#SBATCH --job-name=sdtrain-process
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=8
#SBATCH --time=12:00:00
#SBATCH --requeue
#SBATCH --output=%x-%j.out
set -euo pipefail

input=${1:?usage: sbatch slurm/process.sh INPUT.nml [--set group.key=value ...]}
shift
# The installed binary, or the one of a build tree (SDTRAIN=/path/to/sdtrain to choose).
sdtrain=${SDTRAIN:-$(command -v sdtrain || echo build/cpu/sdtrain)}
# srun starts the MPI ranks through Slurm's PMIx; set LAUNCH="mpirun" where that is missing.
# --kill-on-bad-exit: a rank that dies (OOM killer, a lost node) ends the whole step at once;
# without it the other ranks would wait in their next collective until the time limit.
launch=${LAUNCH:-srun --mpi=pmix --cpu-bind=cores --kill-on-bad-exit=1}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

"$sdtrain" --check "$input" --np "${SLURM_NTASKS:-1}" --set run.mode=process "$@" >/dev/null
# shellcheck disable=SC2086 # $launch is a command with flags
exec $launch "$sdtrain" "$input" --set run.mode=process "$@"
