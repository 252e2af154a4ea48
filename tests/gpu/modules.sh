#!/bin/sh
# Whole modules on the CUDA backend against the same goldens as the CPU: sdtool forward (every
# module of the three golden snapshots) and sdtool grad (the three gradient goldens).
#   fp32 (no TF32): every output tensor within 1e-5 of diffusers, every gradient within 1e-4;
#   bf16: reported, and held to a loose sanity bound (5e-2 forward, 1e-1 gradients overall),
#         since bf16 rounding of weights and activations alone moves outputs by ~1e-2;
#   --recompute on the GPU gives the same bits as without.
# Skips without a CUDA build or a GPU.
. "$top_srcdir/tests/lib.sh"

need_gpu
CMP="$top_builddir/tests/mpi/st_compare"
MODELS="$top_srcdir/tests/data/models"
GRAD="$top_srcdir/tests/data/grad"
bad=0

for snap in tiny-sd2 tiny-sd1 odd; do
    for m in text-encoder vae-encode vae-decode unet; do
        g="$MODELS/$snap/golden/$m.safetensors"
        [ -f "$g" ] || continue
        for p in fp32 bf16; do
            tag="$snap-$m-$p"
            run "$tag" "$SDTOOL" forward --snapshot "$MODELS/$snap" --module "$m" --in "$g" \
                --out "$TMP/$tag.safetensors" --device cuda --precision "$p"
            if [ "$RC" != 0 ]; then
                echo "FAIL: $tag: sdtool forward exited $RC"; cat "$TMP/$tag.err"; bad=1; continue
            fi
            if [ "$p" = fp32 ]; then set -- --per-tensor; tol=1e-5; else set --; tol=5e-2; fi
            if "$CMP" "$@" --prefix out. "$TMP/$tag.safetensors" "$g" "$tol" >"$TMP/$tag.cmp" 2>&1; then
                echo "ok: forward $tag: $(cat "$TMP/$tag.cmp")"
            else
                echo "FAIL: forward $tag: $(cat "$TMP/$tag.cmp")"; bad=1
            fi
        done
    done
done

for case in tiny-sd2:tiny-sd2 tiny-sd1:tiny-sd1 odd-train:odd-train; do
    snap=${case%%:*}
    gold=${case#*:}
    for p in fp32 bf16; do
        tag="grad-$gold-$p"
        run "$tag" "$SDTOOL" grad --snapshot "$MODELS/$snap" --batch "$GRAD/$gold/batch.safetensors" \
            --out "$TMP/$tag.safetensors" --device cuda --precision "$p"
        if [ "$RC" != 0 ]; then
            echo "FAIL: $tag: sdtool grad exited $RC"; cat "$TMP/$tag.err"; bad=1; continue
        fi
        if [ "$p" = fp32 ]; then set -- --per-tensor; tol=1e-4; else set --; tol=1e-1; fi
        if "$CMP" "$@" --prefix '' "$TMP/$tag.safetensors" "$GRAD/$gold/expected.safetensors" "$tol" \
            >"$TMP/$tag.cmp" 2>&1; then
            echo "ok: $tag: $(cat "$TMP/$tag.cmp")"
        else
            echo "FAIL: $tag: $(cat "$TMP/$tag.cmp")"; bad=1
        fi
    done
done

run recompute "$SDTOOL" grad --snapshot "$MODELS/tiny-sd2" --batch "$GRAD/tiny-sd2/batch.safetensors" \
    --out "$TMP/recompute.safetensors" --device cuda --precision fp32 --recompute
if [ "$RC" = 0 ] && cmp -s "$TMP/recompute.safetensors" "$TMP/grad-tiny-sd2-fp32.safetensors"; then
    echo "ok: --recompute on the GPU gives the same bits"
else
    echo "FAIL: --recompute on the GPU (exit $RC) differs from the plain step"; bad=1
fi

[ "$bad" = 0 ] || fail "CUDA modules differ from the goldens (see above)"
pass "CUDA modules match the goldens"
