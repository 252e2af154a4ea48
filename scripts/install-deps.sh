#!/usr/bin/env bash
# Installs the Debian packages sdtrain needs to build and test, if any is missing (slurm-wlm:
# tests/mpi/slurm_cluster.sh runs the job scripts on a one-node Slurm of this machine).
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is not a Debian package: it is used when present.
set -euo pipefail

packages=(
    build-essential autoconf automake pkg-config
    openmpi-bin libopenmpi-dev
    libhdf5-openmpi-dev hdf5-tools
    libturbojpeg0-dev libpng-dev libopenblas-dev
    libjson-c-dev libarchive-dev zlib1g-dev
    slurm-wlm
)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
