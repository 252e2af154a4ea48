#!/usr/bin/env bash
# On a fresh Debian machine: installs what is missing, builds sdtrain and runs the main job on
# the bundled demo inputs with 4 MPI ranks (mpirun -np 4 ./sdtrain inputs/demo.nml).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
"$top/scripts/install-deps.sh"
[ -x configure ] || autoreconf -fi
mkdir -p build/cpu
[ -f build/cpu/Makefile ] || (cd build/cpu && ../../configure)
make -C build/cpu -j"$(nproc)" >build/demo-build.log 2>&1 || { tail -n 40 build/demo-build.log; exit 1; }

launch=(mpirun -q --oversubscribe -np 4)
[ "$(id -u)" != 0 ] || launch+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none

if ! build/cpu/sdtool make-demo-data runs/demo/data; then
    echo "(the demo dataset generator arrives with the preprocessing issue; continuing without data)"
fi
echo "+ ${launch[*]} build/cpu/sdtrain inputs/demo.nml"
status=0
"${launch[@]}" build/cpu/sdtrain inputs/demo.nml || status=$?
if [ "$status" = 3 ]; then
    echo
    echo "sdtrain validated the demo configuration, split the 4 ranks into its preprocessing and"
    echo "training communicators and wrote runs/demo/used.nml. Preprocessing and training are not"
    echo "implemented yet in this build, so it stopped there (exit status 3)."
fi
exit "$status"
