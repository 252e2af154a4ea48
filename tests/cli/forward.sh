#!/bin/sh
# sdtool forward: every module runs on the golden inputs, the output does not depend on --threads,
# and bad inputs, snapshots and usage get clear messages and the documented exit status.
# (Parity with diffusers is tests/unit/test_models.c; tests/reference/verify_full_size.py checks
# this command at SD2 size.)
. "$top_srcdir/tests/lib.sh"
MODELS="$top_srcdir/tests/data/models"

run probe "$SDTOOL" forward --help
[ "$RC" != 3 ] || skip "sdtool forward is not hooked up in this build"
expect_rc probe 0
expect_in probe out "usage: sdtool forward --snapshot DIR --module MODULE"

# st FILE NAME DTYPE SHAPE NBYTES [BYTE]: a one-tensor safetensors file filled with BYTE (octal
# escape, default zero bytes).
st() {
    json="{\"$2\":{\"dtype\":\"$3\",\"shape\":$4,\"data_offsets\":[0,$5]}}"
    n=${#json}
    {
        printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))"
        printf '\000\000\000\000%s' "$json"
        if [ -n "${6:-}" ]; then head -c "$5" /dev/zero | tr '\000' "$6"; else head -c "$5" /dev/zero; fi
    } >"$1"
}

for m in text-encoder vae-encode vae-decode unet; do
    for t in 1 2; do
        run "$m-$t" "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module "$m" \
            --in "$MODELS/tiny-sd2/golden/$m.safetensors" --out "$TMP/$m-$t.safetensors" --threads "$t"
        expect_rc "$m-$t" 0
        expect_in "$m-$t" out "forward: $m"
    done
    cmp -s "$TMP/$m-1.safetensors" "$TMP/$m-2.safetensors" ||
        fail "$m: 1 and 2 threads give different files"
done
# a component folder given directly
run comp "$SDTOOL" forward --snapshot "$MODELS/odd/vae" --module vae-decode \
    --in "$MODELS/odd/golden/vae-decode.safetensors" --out "$TMP/comp.safetensors"
expect_rc comp 0

# input errors: exit 2, naming the file and the tensor
G="$MODELS/tiny-sd2/golden"
run noids "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module text-encoder \
    --in "$G/vae-encode.safetensors" --out "$TMP/x.safetensors"
expect_rc noids 2
expect_in noids err "no input tensor 'input_ids'"
st "$TMP/c4.safetensors" images F32 "[1,4,8,8]" 1024
run chan "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-encode \
    --in "$TMP/c4.safetensors" --out "$TMP/x.safetensors"
expect_rc chan 2
expect_in chan err "wants 3 channels"
st "$TMP/i32.safetensors" images I32 "[1,3,8,8]" 768
run dtype "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-encode \
    --in "$TMP/i32.safetensors" --out "$TMP/x.safetensors"
expect_rc dtype 2
expect_in dtype err "'images' is I32"
st "$TMP/rank.safetensors" latents F32 "[4,8,8]" 1024
run rank "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-decode \
    --in "$TMP/rank.safetensors" --out "$TMP/x.safetensors"
expect_rc rank 2
expect_in rank err "'latents' has shape [4, 8, 8]"
st "$TMP/neg.safetensors" input_ids I32 "[1,77]" 308 '\377'
run vocab "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module text-encoder \
    --in "$TMP/neg.safetensors" --out "$TMP/x.safetensors"
expect_rc vocab 2
expect_in vocab err "outside the vocabulary"
head -c 100 "$G/vae-decode.safetensors" >"$TMP/cut.safetensors"
run cut "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-decode \
    --in "$TMP/cut.safetensors" --out "$TMP/x.safetensors"
expect_rc cut 2
expect_in cut err "cut.safetensors"
[ ! -e "$TMP/x.safetensors" ] || fail "a refused input left an output file"

# snapshot errors: exit 1
run nosnap "$SDTOOL" forward --snapshot "$TMP/nowhere" --module vae-decode \
    --in "$G/vae-decode.safetensors" --out "$TMP/x.safetensors"
expect_rc nosnap 1
expect_in nosnap err "nowhere: no such snapshot folder"
run wrongcomp "$SDTOOL" forward --snapshot "$MODELS/odd/vae" --module text-encoder \
    --in "$G/text-encoder.safetensors" --out "$TMP/x.safetensors"
expect_rc wrongcomp 1
expect_in wrongcomp err "not a text_encoder folder"

# usage errors: exit 2
run nomod "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae --in "$G/vae-decode.safetensors" \
    --out "$TMP/x.safetensors"
expect_rc nomod 2
expect_in nomod err "unknown module 'vae'"
run noout "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-decode --in "$G/vae-decode.safetensors"
expect_rc noout 2
run threads "$SDTOOL" forward --snapshot "$MODELS/tiny-sd2" --module vae-decode \
    --in "$G/vae-decode.safetensors" --out "$TMP/x.safetensors" --threads 0
expect_rc threads 2
expect_in threads err "--threads '0'"
pass "sdtool forward"
