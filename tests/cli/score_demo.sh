#!/bin/sh
# sdtool score-demo: on the images make-demo-data draws (files and tsv layouts, and as a
# samples.jsonl the way mode 'sample' lists its images) the scorer reads nearly every caption
# right; with the captions shuffled it falls to about chance; bad input ends with exit 2.
. "$top_srcdir/tests/lib.sh"

run probe "$SDTOOL" score-demo --help
[ "$RC" != 3 ] || skip "sdtool score-demo is not hooked up in this build"
expect_rc probe 0
expect_in probe out "usage: sdtool score-demo --samples DIR"

# overall ACCURACY-LINE-FILE: the overall accuracy, as a number in thousandths
overall() {
    sed -n 's/^overall accuracy \([0-9]\)\.\([0-9][0-9][0-9]\),.*/\1\2/p' "$1" | sed 's/^0*\([0-9]\)/\1/'
}

run data "$SDTOOL" make-demo-data "$TMP/data" --count 96
expect_rc data 0
run files "$SDTOOL" score-demo --samples "$TMP/data"
expect_rc files 0
expect_in files out "score-demo: 96 images from $TMP/data (images with .txt captions), 96 with a demo caption"
expect_in files out "chance level 0.00"
a=$(overall "$TMP/files.out")
[ -n "$a" ] && [ "$a" -ge 950 ] || { cat "$TMP/files.out"; fail "training images: overall accuracy below 0.950"; }
grep -q '^accuracy: colours 0.9[5-9][0-9] (chance 0.0[0-9]*), shape 0.9[5-9][0-9] (chance 0.250)' "$TMP/files.out" ||
    grep -q '^accuracy: colours 1.000 (chance 0.0[0-9]*), shape 1.000' "$TMP/files.out" ||
    { cat "$TMP/files.out"; fail "training images: colour or shape accuracy below 0.95"; }
pass "the training images: $(grep '^overall' "$TMP/files.out")"

# the same images and captions listed as mode 'sample' does (samples.jsonl, files relative to DIR)
mkdir -p "$TMP/samples/samples"
i=0
for img in "$TMP"/data/00000/*.jpg "$TMP"/data/00000/*.png; do
    stem=${img%.*}
    cp "$img" "$TMP/samples/samples/$i.${img##*.}"
    printf '{"prompt_index": %d, "image_index": 0, "prompt": "%s", "seed": 1, "file": "samples/%d.%s"}\n' \
        "$i" "$(cat "$stem.txt")" "$i" "${img##*.}" >>"$TMP/samples/samples.jsonl"
    i=$((i + 1))
done
run jsonl "$SDTOOL" score-demo --samples "$TMP/samples"
expect_rc jsonl 0
expect_in jsonl out "96 images from $TMP/samples/samples.jsonl"
[ "$(overall "$TMP/jsonl.out")" = "$a" ] || fail "samples.jsonl: another accuracy than the files layout"
run json "$SDTOOL" score-demo --samples "$TMP/samples" --json
expect_rc json 0
expect_in json out '"scored": 96'
expect_in json out '"accuracy": { "colours": '
expect_in json out '"chance": { "colours": '
expect_in json out '"prompt": "a '
[ "$(wc -l <"$TMP/json.out")" = 1 ] || fail "--json: not one line"

# tsv layout through --captions, and the captions shuffled (each image gets the caption of
# the image 7 places on): about chance
run tsvdata "$SDTOOL" make-demo-data "$TMP/tsv" --count 96 --format tsv
expect_rc tsvdata 0
run tsv "$SDTOOL" score-demo --samples "$TMP/tsv" --captions "$TMP/tsv/manifest.tsv"
expect_rc tsv 0
[ "$(overall "$TMP/tsv.out")" = "$a" ] || fail "tsv layout: another accuracy than the files layout"
tail -n +2 "$TMP/tsv/manifest.tsv" | cut -f1 >"$TMP/paths"
tail -n +2 "$TMP/tsv/manifest.tsv" | cut -f2 >"$TMP/caps"
{ tail -n +8 "$TMP/caps"; head -n 7 "$TMP/caps"; } | paste "$TMP/paths" - >"$TMP/shuffled.tsv"
run shuffled "$SDTOOL" score-demo --samples "$TMP/tsv" --captions "$TMP/shuffled.tsv"
expect_rc shuffled 0
s=$(overall "$TMP/shuffled.out")
[ -n "$s" ] && [ "$s" -le 60 ] || { cat "$TMP/shuffled.out"; fail "shuffled captions: overall accuracy above 0.060"; }
grep -q '^accuracy: colours 0.[01][0-9][0-9] ' "$TMP/shuffled.out" ||
    { cat "$TMP/shuffled.out"; fail "shuffled captions: colour accuracy not near chance"; }
pass "shuffled captions (about chance): $(grep '^overall' "$TMP/shuffled.out")"

# bad input: exit 2
run nodir "$SDTOOL" score-demo --samples "$TMP/nowhere"
expect_rc nodir 2
expect_in nodir err "$TMP/nowhere: no such folder"
run noarg "$SDTOOL" score-demo
expect_rc noarg 2
mkdir -p "$TMP/bad"
printf '{"prompt": "a red square", "file": "x.png"}\nnot json\n' >"$TMP/bad/samples.jsonl"
run badline "$SDTOOL" score-demo --samples "$TMP/bad"
expect_rc badline 2
expect_in badline err "$TMP/bad/samples.jsonl:2:"
printf '{"prompt": "a red square", "file": "missing.png"}\n' >"$TMP/bad/samples.jsonl"
run noimg "$SDTOOL" score-demo --samples "$TMP/bad"
expect_rc noimg 2
expect_in noimg err "missing.png"
printf '{"prompt": "a photo of a cat", "file": "missing.png"}\n' >"$TMP/bad/samples.jsonl"
run nocap "$SDTOOL" score-demo --samples "$TMP/bad"
expect_rc nocap 2
expect_in nocap err "none of the 1 captions reads as"
mkdir -p "$TMP/none"
run none "$SDTOOL" score-demo --samples "$TMP/none"
expect_rc none 2
expect_in none err "no images to score"
pass "score-demo: bad input ends with exit 2"

# make-demo-data --max-side: the same pictures drawn larger (benchmarks), still read right
png_width() { od -An -tu1 -j16 -N4 "$1" | awk '{print (($1 * 256 + $2) * 256 + $3) * 256 + $4}'; }
run big "$SDTOOL" make-demo-data "$TMP/big" --count 12 --max-side 512
expect_rc big 0
for img in "$TMP"/data/00000/*.png; do
    w=$(png_width "$img")
    [ "$w" -ge 40 ] && [ "$w" -le 128 ] || fail "default demo image $img is $w px wide"
done
for img in "$TMP"/big/00000/*.png; do
    w=$(png_width "$img")
    [ "$w" -ge 160 ] && [ "$w" -le 512 ] || fail "--max-side 512 image $img is $w px wide"
done
run bigscore "$SDTOOL" score-demo --samples "$TMP/big"
expect_rc bigscore 0
a=$(overall "$TMP/bigscore.out")
[ -n "$a" ] && [ "$a" -ge 900 ] || { cat "$TMP/bigscore.out"; fail "--max-side 512: accuracy"; }
run badside "$SDTOOL" make-demo-data "$TMP/bad-side" --max-side 8
expect_rc badside 2
expect_in badside err "--max-side 16..8192"
pass "make-demo-data --max-side draws larger images"

# numbers with something after them are refused naming the option (atoll took "5x" for 5), as is
# an option without its value
for a in "--count 5x" "--seed 1e3" "--max-side 64abc"; do
    # shellcheck disable=SC2086 # option and value
    run badnum "$SDTOOL" make-demo-data "$TMP/bad-num" $a
    expect_rc badnum 2
    expect_in badnum err "sdtool make-demo-data: ${a%% *} '${a#* }': expected a whole number"
done
run noval "$SDTOOL" make-demo-data "$TMP/bad-num" --count
expect_rc noval 2
expect_in noval err "sdtool make-demo-data: --count needs a value"
[ ! -e "$TMP/bad-num" ] || fail "a refused make-demo-data wrote $TMP/bad-num"
# a folder where a list file is expected: the read error, not "no images to score"
mkdir -p "$TMP/capdir" "$TMP/jsonldir/samples.jsonl"
run capdir "$SDTOOL" score-demo --samples "$TMP/big" --captions "$TMP/capdir"
expect_rc capdir 2
expect_in capdir err "$TMP/capdir: cannot read: Is a directory"
run jsonldir "$SDTOOL" score-demo --samples "$TMP/jsonldir"
expect_rc jsonldir 2
expect_in jsonldir err "$TMP/jsonldir/samples.jsonl: cannot read: Is a directory"
pass "make-demo-data and score-demo: bad numbers and folders for files are named"
