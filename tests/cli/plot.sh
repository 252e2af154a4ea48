#!/bin/sh
# sdtool plot: a synthetic metrics.jsonl becomes a PNG of the asked size with drawn pixels (the
# same raster as a PPM, whose pixels a shell can count), --text prints the numbers and a
# sparkline, and malformed files end with exit 2 and file:line.
. "$top_srcdir/tests/lib.sh"

run probe "$SDTOOL" plot --help
[ "$RC" != 3 ] || skip "sdtool plot is not hooked up in this build"
expect_rc probe 0
expect_in probe out "usage: sdtool plot METRICS.jsonl"

# 100 steps: loss falls from 1.0 to 0.0100, lr warms up to 0.001, validation every 25 steps
m="$TMP/metrics.jsonl"
awk 'BEGIN { for (s = 1; s <= 100; s++) {
    printf "{\"step\": %d, \"epoch\": 0, \"loss\": %.4f, \"lr\": %g, \"grad_norm\": %.3f, \"images_per_s\": 50.5}\n",
        s, 1.0 / s, (s < 10 ? s / 10.0 : 1) * 0.001, 2 + (s % 7) / 10.0
    if (s % 25 == 0) printf "{\"step\": %d, \"val_loss\": %.4f}\n", s, 2.0 / s } }' >"$m"

run png "$SDTOOL" plot "$m" --out "$TMP/plot.png" --metric loss,val_loss,lr --size 640x400
expect_rc png 0
expect_in png out "wrote $TMP/plot.png (640x400): loss (100 points), val_loss (4 points), lr (100 points)"
[ -s "$TMP/plot.png" ] || fail "no PNG"
# the IHDR chunk: width and height, big-endian, at bytes 16..23
[ "$(od -An -tu1 -j 16 -N 8 "$TMP/plot.png" | tr -s ' ' | sed 's/^ //;s/ $//')" = "0 0 2 128 0 0 1 144" ] ||
    fail "the PNG is not 640x400"
run decode "$SDTOOL" transform --decode-only "$TMP/plot.png" "$TMP/decoded.png"
expect_rc decode 0
# the same plot as a PPM: count the bytes that are not white background
run ppm "$SDTOOL" plot "$m" --out "$TMP/plot.ppm" --metric loss,val_loss,lr --size 640x400
expect_rc ppm 0
[ "$(head -c 15 "$TMP/plot.ppm" | head -n 2 | tail -n 1)" = "640 400" ] || fail "PPM size"
drawn=$(tail -c $((640 * 400 * 3)) "$TMP/plot.ppm" | od -An -v -tu1 | tr -s ' ' '\n' | grep -cv '^255$\|^$')
[ "$drawn" -gt 5000 ] || fail "only $drawn non-background bytes: nothing drawn?"
[ "$drawn" -lt $((640 * 400 * 3 / 2)) ] || fail "$drawn non-background bytes: mostly not background?"
# the default output name and metrics, --logy, --smooth
cp "$m" "$TMP/run.jsonl"
run def "$SDTOOL" plot "$TMP/run.jsonl" --logy --smooth 5
expect_rc def 0
[ -s "$TMP/run.png" ] || fail "default output run.png missing"
expect_in def out "loss (100 points), val_loss (4 points)"
expect_not_in def out "lr ("
pass "plot: a PNG of the asked size with axes and curves drawn"

run text "$SDTOOL" plot "$m" --text
expect_rc text 0
expect_in text out "104 lines" # 100 steps and 4 validation lines
expect_in text out "steps 1..100"
for k in loss val_loss lr grad_norm images_per_s; do
    grep -q "^$k " "$TMP/text.out" || fail "--text: no line for $k"
done
grep -q '^loss  *100  *0.01  *1  *0.01  |' "$TMP/text.out" || { cat "$TMP/text.out"; fail "--text: loss min/max/last"; }
grep -q '^val_loss  *4  *0.02  *0.08  *0.02  |' "$TMP/text.out" || { cat "$TMP/text.out"; fail "--text: val_loss numbers"; }
grep -q '^lr  *100  *1.00e-04  *0.001  *0.001  |' "$TMP/text.out" || { cat "$TMP/text.out"; fail "--text: lr numbers"; }
expect_not_in text out "epoch"
run text2 "$SDTOOL" plot "$m" --text --metric lr
expect_rc text2 0
expect_not_in text2 out "grad_norm"
# a skipped step's stand-in -1 (loss, grad_norm: non-finite) is no point
printf '%s\n' '{"step": 1, "loss": 0.5, "grad_norm": 2}' '{"step": 2, "loss": -1, "grad_norm": -1}' \
    '{"step": 3, "loss": 0.25, "grad_norm": 1.5}' '{"step": 3, "val_loss": -1}' >"$TMP/skip.jsonl"
run skip "$SDTOOL" plot "$TMP/skip.jsonl" --text
expect_rc skip 0
grep -q '^loss  *2  *0.25  *0.5  *0.25  |' "$TMP/skip.out" || { cat "$TMP/skip.out"; fail "--text: the -1 of a skipped step drawn"; }
grep -q '^grad_norm  *2  *1.5  *2  *1.5  |' "$TMP/skip.out" || { cat "$TMP/skip.out"; fail "--text: grad_norm -1 drawn"; }
pass "plot --text: min, max, last and a sparkline per metric"

# bad files: exit 2 with file:line
printf '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4\n' >"$TMP/cut.jsonl"
run cut "$SDTOOL" plot "$TMP/cut.jsonl" --out "$TMP/x.png"
expect_rc cut 2
expect_in cut err "$TMP/cut.jsonl:2:"
printf '{"step": 1, "loss": 0.5}\n\n{"loss": 0.4}\n' >"$TMP/nostep.jsonl"
run nostep "$SDTOOL" plot "$TMP/nostep.jsonl" --text
expect_rc nostep 2
expect_in nostep err "$TMP/nostep.jsonl:3:"
expect_in nostep err "step"
printf '[1, 2]\n' >"$TMP/array.jsonl"
run array "$SDTOOL" plot "$TMP/array.jsonl" --text
expect_rc array 2
expect_in array err "$TMP/array.jsonl:1:"
: >"$TMP/empty.jsonl"
run empty "$SDTOOL" plot "$TMP/empty.jsonl"
expect_rc empty 2
expect_in empty err "no metrics lines"
run nometric "$SDTOOL" plot "$m" --metric accuracy
expect_rc nometric 2
expect_in nometric err "none of the metrics 'accuracy'"
run missing "$SDTOOL" plot "$TMP/nowhere.jsonl"
expect_rc missing 2
expect_in missing err "nowhere.jsonl: cannot read"
run badarg "$SDTOOL" plot "$m" --smooth 0
expect_rc badarg 2
# a --size with trailing junk, --out with --text (nothing would be written), an overlong list
run badsize "$SDTOOL" plot "$m" --size 300x200junk
expect_rc badsize 2
expect_in badsize err "--size wants WxH"
run textout "$SDTOOL" plot "$m" --text --out "$TMP/never.png"
expect_rc textout 2
expect_in textout err "--text prints to standard output"
[ ! -e "$TMP/never.png" ] || fail "plot --text --out wrote a file"
run longlist "$SDTOOL" plot "$m" --metric "loss,$(printf 'x%.0s' $(seq 600))"
expect_rc longlist 2
expect_in longlist err "--metric: a list of 605 bytes"
[ ! -e "$TMP/x.png" ] || fail "a refused file left a PNG"
pass "plot: malformed files end with exit 2 and file:line"

# --out the metrics file itself (or another name of it): refused, the log left as it was
cp "$m" "$TMP/keep.jsonl"
ln -s keep.jsonl "$TMP/link.png"
for out in "$TMP/keep.jsonl" "$TMP/link.png"; do
    run same "$SDTOOL" plot "$TMP/keep.jsonl" --out "$out"
    expect_rc same 2
    expect_in same err "the output '$out' is the input '$TMP/keep.jsonl'"
    cmp -s "$m" "$TMP/keep.jsonl" || fail "plot --out $out overwrote its input"
done
pass "plot: an output that is the input is refused"

# a folder for METRICS.jsonl: the read error, not "no metrics lines"
mkdir -p "$TMP/dir.jsonl"
run dir "$SDTOOL" plot "$TMP/dir.jsonl" --text
expect_rc dir 2
expect_in dir err "$TMP/dir.jsonl: cannot read: Is a directory"
pass "plot: a folder given for the metrics is named as such"
