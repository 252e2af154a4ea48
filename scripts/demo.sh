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

rm -rf runs/demo
build/cpu/sdtool make-demo-data runs/demo/data --count 256
# The main job: the pipeline of inputs/demo.nml, rank 0 preprocessing while ranks 1-3 train
# (ZeRO-2) on the shards as they are committed.
echo "+ ${launch[*]} build/cpu/sdtrain inputs/demo.nml"
"${launch[@]}" build/cpu/sdtrain inputs/demo.nml
build/cpu/sdtool inspect runs/demo/shards | head -n 20
# Then images from the trained U-Net for the namelist's &sample prompts, split over the ranks.
echo "+ ${launch[*]} build/cpu/sdtrain inputs/demo.nml --set run.mode=sample"
"${launch[@]}" build/cpu/sdtrain inputs/demo.nml --set run.mode=sample
# Then numbers: does each image show what its prompt says (colours, shape; against chance), and
# how the loss went.
echo "+ build/cpu/sdtool score-demo --samples runs/demo"
build/cpu/sdtool score-demo --samples runs/demo
echo "+ build/cpu/sdtool plot runs/demo/metrics.jsonl --text"
build/cpu/sdtool plot runs/demo/metrics.jsonl --text --metric loss,val_loss,lr,grad_norm
build/cpu/sdtool plot runs/demo/metrics.jsonl --metric loss,val_loss,lr --out runs/demo/metrics.png
# And the trained U-Net as a diffusers snapshot (U-Net and scheduler: the demo has no pretrained
# VAE or text encoder; doc/export.md).
build/cpu/sdtool export --from runs/demo --out runs/demo/export --force
echo
echo "Done: runs/demo/metrics.jsonl has the loss of every step and the validation losses"
echo "(drawn in runs/demo/metrics.png), runs/demo/unet_final.safetensors the trained U-Net"
echo "(diffusers names; runs/demo/export as a diffusers snapshot), runs/demo/samples/*.png images"
echo "generated from it (listed in runs/demo/samples.jsonl, scored above)."
