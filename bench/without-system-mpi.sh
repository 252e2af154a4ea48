#!/bin/sh
# Runs CMD... as on the lent GPU machine, which has no Open MPI, PMIx, HDF5 or image libraries:
# in a private mount namespace (unshare -m, needs root) in which this machine's Open MPI, PMIx,
# hwloc plugins, ssh/rsh and the libraries that only sdtrain's MPI/HDF5/image stack brings are
# hidden by binding an empty directory or file over them. Tests the bundle of bench/gpu-bundle.sh:
#
#   bench/without-system-mpi.sh bash bench/gpu-check.sh --bundle .gpu --parts train
#   bench/without-system-mpi.sh sh -c '. /tmp/sdgpu/ompi/env.sh && mpirun -np 2 /tmp/sdgpu/build/sdtrain --check inputs/demo.nml'
set -eu
[ $# -gt 0 ] || { sed -n '2,8p' "$0"; exit 2; }
[ "${SD_WITHOUT_SYSTEM_MPI:-}" = 1 ] || exec unshare -m env SD_WITHOUT_SYSTEM_MPI=1 sh "$0" "$@"
la=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
e=$(mktemp -d)
f=$(mktemp)
for d in "$la/openmpi" "$la/pmix2" "$la/hwloc" /usr/share/openmpi /etc/openmpi; do
    [ ! -d "$d" ] || mount --bind "$e" "$d"
done
for b in orterun orted mpirun mpiexec ompi_info ssh rsh; do
    p=$(command -v "$b" 2>/dev/null) || continue
    mount --bind "$f" "$(readlink -f "$p")"
done
for n in $(cd "$la" && ls libmpi*.so* libopen-rte.so* libopen-pal.so* libpmix.so* libmca_common_*.so* \
    libhdf5*.so* libevent*.so* libhwloc.so* libmunge.so* libturbojpeg.so* libpng16.so* libjson-c.so* \
    libopenblas.so* libsz.so* libaec.so* libcurl.so* 2>/dev/null); do
    mount --bind "$f" "$(readlink -f "$la/$n")" 2>/dev/null || true
done
exec "$@"
