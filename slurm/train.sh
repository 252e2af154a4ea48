#!/bin/bash
# Training from latent shards (&run mode = 'train'), one rank per GPU.
#   sbatch slurm/train.sh inputs/sd2-base-256.nml [--set group.key=value ...]
# --requeue lets Slurm restart the job after a node failure; sdtrain then resumes from the
# newest complete checkpoint (&checkpoint resume = 'auto'). The signal asks sdtrain to
# checkpoint and exit cleanly 5 minutes before the time limit.
#SBATCH --job-name=sdtrain-train
#SBATCH --nodes=16
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=48:00:00
#SBATCH --requeue
#SBATCH --signal=USR1@300
#SBATCH --output=%x-%j.out
set -euo pipefail

input=${1:?usage: sbatch slurm/train.sh INPUT.nml [--set group.key=value ...]}
shift
sdtrain=${SDTRAIN:-$(command -v sdtrain || echo build/cuda/sdtrain)}
launch=${LAUNCH:-srun --mpi=pmix --cpu-bind=cores}
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}

# Refuse a bad configuration before the allocation's GPUs sit idle waiting for all ranks.
"$sdtrain" --check "$input" --np "${SLURM_NTASKS:-1}" --set run.mode=train "$@" >/dev/null
# shellcheck disable=SC2086 # $launch is a command with flags
exec $launch "$sdtrain" "$input" --set run.mode=train "$@"
