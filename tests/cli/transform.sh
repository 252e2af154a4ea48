#!/bin/sh
# sdtool transform: output equals the Pillow + torchvision reference; bad inputs and usage errors.
. "$top_srcdir/tests/lib.sh"
IMG="$top_srcdir/tests/image"

run probe "$SDTOOL" transform --help
[ "$RC" != 3 ] || skip "sdtool transform is not hooked up in this build"
expect_rc probe 0
expect_in probe out "usage: sdtool transform --resolution R"

# The result is compared pixel for pixel through our own PNG writer: the reference (written by
# Pillow) is re-encoded with --decode-only, and the same pixels give the same bytes.
check() { # check INPUT REF FLAGS...
    in=$1 ref=$2
    shift 2
    run "t_$ref" "$SDTOOL" transform "$@" "$IMG/input/$in" "$TMP/$ref"
    expect_rc "t_$ref" 0
    run "r_$ref" "$SDTOOL" transform --decode-only "$IMG/ref/$ref" "$TMP/ref_$ref"
    expect_rc "r_$ref" 0
    cmp -s "$TMP/$ref" "$TMP/ref_$ref" || fail "$in: sdtool transform $* differs from $ref"
}
check rgb_160x120_q90_420.jpg rgb_160x120_q90_420_r64.png --resolution 64
check rgb_250x61_q85_420.jpg rgb_250x61_q85_420_r256.png --resolution 256
check cmyk_80x60_q90.jpg cmyk_80x60_q90_r64.png --resolution 64
check exif6_96x64_q90.jpg exif6_96x64_q90_exif_r64.png --resolution 64 --exif-transpose
check rgba_90x110.png rgba_90x110_alpha-white_r64.png --resolution 64 --alpha white
check gray16_48x40.png gray16_48x40_decode.png --decode-only
# the pass order of the Pillow to match: the pinned one (horizontal first) by default, Pillow
# >= 13.0's (vertical first for this 90x260 image) with --pillow-13; the two differ by 1 in 21%
check portrait_90x260_q85.jpg portrait_90x260_q85_r64.png --resolution 64
check portrait_90x260_q85.jpg portrait_90x260_q85_pillow13_r64.png --resolution 64 --pillow-13
check tall_66x6700.jpg tall_66x6700_tall_r64.png --resolution 64 --pillow-12.2

# refused images: exit 1 with the reason
head -c 2000 "$IMG/input/rgb_160x120_q90_420.jpg" >"$TMP/cut.jpg"
run cut "$SDTOOL" transform --resolution 64 "$TMP/cut.jpg" "$TMP/cut.png"
expect_rc cut 1
expect_in cut err "[truncated]"
[ ! -e "$TMP/cut.png" ] || fail "a refused image left an output file"
printf 'RIFF\044\000\000\000WEBPVP8 ' >"$TMP/x.webp"
run webp "$SDTOOL" transform --resolution 64 "$TMP/x.webp" "$TMP/x.png"
expect_rc webp 1
expect_in webp err "[unsupported]"
run missing "$SDTOOL" transform --resolution 64 "$TMP/nope.jpg" "$TMP/x.png"
expect_rc missing 1
expect_in missing err "nope.jpg"
run devnull "$SDTOOL" transform --resolution 64 /dev/null "$TMP/x.png"
expect_rc devnull 1
expect_in devnull err "/dev/null: not a regular file [io]"
# 1 x 600000: resized to 32 it would be 32 x 19,200,000, more than the transform takes (2^24 a
# side): refused from the header, as too_large, the file named
run tall "$SDTOOL" transform --resolution 32 "$IMG/input/gray_1x600000.png" "$TMP/x.png"
expect_rc tall 1
expect_in tall err "sdtool transform: $IMG/input/gray_1x600000.png: PNG header declares 1x600000, too large"
expect_in tall err "[too_large]"
[ ! -e "$TMP/x.png" ] || fail "a refused image left an output file"
# the output is the input: refused, the input kept
cp "$IMG/input/rgb_110x90.png" "$TMP/same.png"
run same "$SDTOOL" transform --resolution 32 "$TMP/same.png" "$TMP/same.png"
expect_rc same 2
expect_in same err "the output '$TMP/same.png' is the input '$TMP/same.png'"
cmp -s "$IMG/input/rgb_110x90.png" "$TMP/same.png" || fail "transform overwrote its input"

# usage errors
run nores "$SDTOOL" transform "$IMG/input/rgb_1x1.png" "$TMP/y.png"
expect_rc nores 2
expect_in nores err "needs --resolution"
run badres "$SDTOOL" transform --resolution 0 "$IMG/input/rgb_1x1.png" "$TMP/y.png"
expect_rc badres 2
run badopt "$SDTOOL" transform --resolution 64 --frob "$IMG/input/rgb_1x1.png" "$TMP/y.png"
expect_rc badopt 2
expect_in badopt err "unknown option '--frob'"
pass "sdtool transform"
