#!/bin/sh
# Packs what bench/gpu-check.sh needs on a GPU machine that has the CUDA libraries but not this
# project's other dependencies (Open MPI, parallel HDF5, libjpeg-turbo, ...): the CUDA build's
# programs and GPU tests, and every shared library they load except the C runtime and the
# CUDA libraries, into one compressed archive.
#
#   bench/gpu-bundle.sh [BUILD_DIR [OUT_DIR]]     (defaults: build/cuda, .gpu)
#
# Builds BUILD_DIR first (it must be configured with --with-cuda). OUT_DIR/bundle.tar.xz is
# what a GPU session carries (OUT_DIR is git-ignored); there:
#   bash bench/gpu-check.sh --bundle OUT_DIR
set -eu
build=${1:-build/cuda}
out=${2:-.gpu}
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
[ -f "$build/Makefile" ] || { echo "gpu-bundle: $build is not a configured build tree (../../configure --with-cuda)" >&2; exit 2; }
grep -q '^SD_TEST_CUDA_BUILD = yes' "$build/Makefile" ||
    { echo "gpu-bundle: $build was not configured with --with-cuda" >&2; exit 2; }

jobs=$(nproc 2>/dev/null || echo 2)
make -C "$build" -j"$jobs" >/dev/null
# the check programs without running the tests
make -C "$build" -j"$jobs" check TESTS= >/dev/null

progs="sdtool sdtrain tests/mpi/st_compare tests/mpi/shard_compare tests/mpi/png_compare"
for p in "$build"/tests/gpu/* "$build"/bench/*; do
    [ -f "$p" ] && [ -x "$p" ] || continue
    case "$p" in *.o | *.sh | *.log | *.trs) continue ;; esac
    progs="$progs ${p#"$build"/}"
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/sdgpu/build" "$stage/sdgpu/lib"
for p in $progs; do
    mkdir -p "$stage/sdgpu/build/$(dirname "$p")"
    cp "$build/$p" "$stage/sdgpu/build/$p"
    strip --strip-debug "$stage/sdgpu/build/$p" 2>/dev/null || true
    # libraries: not the C runtime (the GPU machine has a newer one) nor CUDA's (its own)
    ldd "$build/$p" | awk '$3 ~ /^\// {print $3}' |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
        grep -v -E '/(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl)\.so' |
        while read -r lib; do
            [ -f "$stage/sdgpu/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/sdgpu/lib/"
        done
done

# ---- a relocatable Open MPI under sdgpu/ompi --------------------------------------------------
# sdtrain calls MPI_Init, which loads Open MPI's MCA components, PMIx and its plugins, help texts
# and openmpi-mca-params.conf from the install paths (a singleton MPI_Init also starts orted), and
# multi-rank runs need mpirun/orted. The GPU machine has none of it, so the Debian install is
# copied with its layout under sdgpu/ompi (= OPAL_PREFIX; PMIx's prefix is ompi/$pmix_rel) and
# ompi/env.sh sets the variables that point Open MPI and PMIx there. Components that need
# network/HPC hardware libraries (UCX, libfabric, verbs, PSM) or belong to OpenSHMEM are left
# out; the bundled openmpi-mca-params.conf selects the single-node shared-memory path.
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
sys_ompi=/usr/lib/$multiarch/openmpi
pmix_rel=lib/$multiarch/pmix2
ompi_rel=lib/$multiarch/openmpi
[ -d "$sys_ompi/lib/openmpi3" ] && [ -x /usr/bin/orterun ] && [ -x /usr/bin/orted ] ||
    { echo "gpu-bundle: Open MPI 4 (Debian: openmpi-bin, libopenmpi3) not found under $sys_ompi" >&2; exit 2; }
O="$stage/sdgpu/ompi"
mkdir -p "$O/bin" "$O/$ompi_rel/lib/openmpi3" "$O/share/openmpi" "$O/etc" \
    "$O/$pmix_rel/lib/pmix" "$O/$pmix_rel/share/pmix"
# libraries of what is bundled below: next to the programs' own, in sdgpu/lib
bundle_libs() {
    for f in "$@"; do
        ldd "$f" | awk '$3 ~ /^\// {print $3}' |
            grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
            while read -r lib; do
                [ -f "$stage/sdgpu/lib/$(basename "$lib")" ] || cp -L "$lib" "$stage/sdgpu/lib/"
            done
    done
}
cp /usr/bin/orterun /usr/bin/orted "$O/bin/"
command -v ompi_info >/dev/null && cp -L "$(command -v ompi_info)" "$O/bin/"
ln -s orterun "$O/bin/mpirun"
ln -s orterun "$O/bin/mpiexec"
ncomp=0
skipped=""
for c in "$sys_ompi"/lib/openmpi3/*.so; do
    n=$(basename "$c")
    case "$n" in
    *ucx* | *ofi* | *psm* | *openib* | *verbs* | mca_atomic_* | mca_memheap_* | mca_scoll_* | \
        mca_spml_* | mca_sshmem_* | mca_reachable_netlink.so | libompi_dbg_msgq.so)
        skipped="$skipped ${n%.so}"
        continue ;;
    esac
    cp "$c" "$O/$ompi_rel/lib/openmpi3/"
    ncomp=$((ncomp + 1))
done
bundle_libs "$O/bin/orterun" "$O/bin/orted" "$O/$ompi_rel"/lib/openmpi3/*.so
[ ! -x "$O/bin/ompi_info" ] || bundle_libs "$O/bin/ompi_info"
# PMIx: its plugins and help texts; its own component path is absolute in the Debian config
cp /usr/lib/"$multiarch"/pmix2/lib/pmix/*.so "$O/$pmix_rel/lib/pmix/"
cp /usr/lib/"$multiarch"/pmix2/share/pmix/help-*.txt "$O/$pmix_rel/share/pmix/"
bundle_libs "$O/$pmix_rel"/lib/pmix/*.so
echo "mca_base_component_path = /tmp/sdgpu/ompi/$pmix_rel/lib/pmix" >"$O/$pmix_rel/share/pmix-mca-params.conf"
cp /usr/share/openmpi/help-*.txt "$O/share/openmpi/"
cp -r /usr/share/openmpi/amca-param-sets "$O/share/openmpi/" 2>/dev/null || true
[ ! -f /etc/openmpi/openmpi-default-hostfile ] || cp /etc/openmpi/openmpi-default-hostfile "$O/etc/"
cat >"$O/etc/openmpi-mca-params.conf" <<'EOF'
# sdtrain's GPU bundle: one node, ranks talk through shared memory (the hardware-specific
# components -- UCX, libfabric, verbs, PSM -- are not in the bundle)
btl = self,vader
pml = ob1
mtl = ^ofi,psm,psm2
osc = ^ucx,pt2pt
# containers often forbid cross-memory attach; plain shared-memory copies work everywhere
btl_vader_single_copy_mechanism = none
btl_base_warn_component_unused = 0
# one node: start the local daemon (mpirun's, or orted for a singleton MPI_Init) without the rsh
# launcher, which fails outright where no ssh/rsh is installed
plm = isolated
EOF
cat >"$O/env.sh" <<'EOF'
# . ompi/env.sh: points the bundled Open MPI and PMIx at this directory (sh, bash)
sd_ompi=/tmp/sdgpu/ompi
[ -z "${BASH_SOURCE:-}" ] || sd_ompi=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$sd_ompi" OPAL_SYSCONFDIR="$sd_ompi/etc"
export PMIX_INSTALL_PREFIX="$sd_ompi/PMIX_REL" PMIX_MCA_mca_base_component_path="$sd_ompi/PMIX_REL/lib/pmix"
export PATH="$sd_ompi/bin:$PATH"
export LD_LIBRARY_PATH="$(dirname "$sd_ompi")/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset sd_ompi
EOF
sed -i "s|PMIX_REL|$pmix_rel|g" "$O/env.sh"
strip --strip-debug "$O/bin/orterun" "$O/bin/orted" "$O/$ompi_rel"/lib/openmpi3/*.so 2>/dev/null || true

# the build's identity, for the report
{
    echo "revision: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    "$build/sdtool" --version 2>/dev/null | head -3 || true
    grep -E '^(NVCC_GENCODE|CUDA_LIBS) =' "$build/Makefile"
} >"$stage/sdgpu/BUILD-INFO"
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz" sdgpu
echo "gpu-bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)): $(echo "$progs" | wc -w) programs, $(ls "$stage/sdgpu/lib" | wc -l) libraries, Open MPI with $ncomp MCA components under sdgpu/ompi"
echo "gpu-bundle: left out (hardware-specific or OpenSHMEM):$skipped"
