#!/bin/sh
# sdtool tokenize: both vocabulary formats, --file/--escaped/--count, the environment default,
# golden parity through the command line, and its errors.
. "$top_srcdir/tests/lib.sh"

DATA="$top_srcdir/tests/data/tokenizer"
GZ="$DATA/bpe_simple_vocab_16e6.txt.gz"
CAT="49406 320 1125 539 320 2368 49407"
PADS=$(printf ' 0%.0s' $(seq 70))

run gz "$SDTOOL" tokenize --vocab "$GZ" "a photo of a cat"
expect_rc gz 0
[ "$(cat "$TMP/gz.out")" = "$CAT$PADS" ] || fail "gz: wrong ids: $(cat "$TMP/gz.out")"

# an unpacked SD2 snapshot gives the same ids
mkdir -p "$TMP/snap/tokenizer"
gzip -dc "$DATA/sd2-base/vocab.json.gz" >"$TMP/snap/tokenizer/vocab.json"
gzip -dc "$DATA/sd2-base/merges.txt.gz" >"$TMP/snap/tokenizer/merges.txt"
cp "$DATA/sd2-base/special_tokens_map.json" "$DATA/sd2-base/tokenizer_config.json" "$TMP/snap/tokenizer/"
run snap "$SDTOOL" tokenize --snapshot "$TMP/snap" "a photo of a cat"
expect_rc snap 0
cmp -s "$TMP/gz.out" "$TMP/snap.out" || fail "snapshot and gz differ"

# added_tokens.json (tokenizers saved before transformers 4.34, e.g. textual inversion): its
# token is one id, as transformers loads it, not BPE pieces
cp -r "$TMP/snap" "$TMP/snap-at"
printf '{"<cat-toy>": 49408}\n' >"$TMP/snap-at/tokenizer/added_tokens.json"
run added "$SDTOOL" tokenize --snapshot "$TMP/snap-at" "a photo of <cat-toy>"
expect_rc added 0
[ "$(cut -d' ' -f1-6 "$TMP/added.out")" = "49406 320 1125 539 49408 49407" ] ||
    fail "added_tokens.json: wrong ids: $(cut -d' ' -f1-8 "$TMP/added.out")"

# --file: one line per caption; --count; the environment variable as the default vocabulary
printf 'a photo of a cat\nHello, world!\n\n' >"$TMP/caps.txt"
SDTRAIN_TOKENIZER="$TMP/snap/tokenizer"
export SDTRAIN_TOKENIZER
run file "$SDTOOL" tokenize --count --file "$TMP/caps.txt"
unset SDTRAIN_TOKENIZER
expect_rc file 0
expect_count file out "	49406 " 3
expect_in file out "7	$CAT$PADS"
expect_in file out "6	49406 3306 267 1002 0 49407 0"
expect_in file out "2	49406 49407 0 0"

# golden parity through the command line (escaped captions on standard input)
grep -v '^#' "$DATA/golden.tsv" | cut -f1 >"$TMP/golden.in"
grep -v '^#' "$DATA/golden.tsv" | cut -f2,3 | awk -F '\t' '{print $2 "\t" $1}' >"$TMP/golden.want"
run golden "$SDTOOL" tokenize --vocab "$GZ" --escaped --count --file - <"$TMP/golden.in"
expect_rc golden 0
cmp -s "$TMP/golden.out" "$TMP/golden.want" || { diff "$TMP/golden.want" "$TMP/golden.out" | head; fail "golden ids differ"; }

# ill-formed UTF-8 is dropped with a note
printf 'caf\351\n' >"$TMP/bad.txt"
run bad "$SDTOOL" tokenize --vocab "$GZ" --file "$TMP/bad.txt"
expect_rc bad 0
expect_in bad err "bad.txt:1: 1 ill-formed UTF-8 sequence dropped"

# errors
run novocab "$SDTOOL" tokenize "x"
expect_rc novocab 2
expect_in novocab err "no vocabulary"
run missing "$SDTOOL" tokenize --snapshot "$TMP/nowhere" "x"
expect_rc missing 1
expect_in missing err "nowhere: no tokenizer/vocab.json"
run nocap "$SDTOOL" tokenize --vocab "$GZ"
expect_rc nocap 2
run badesc "$SDTOOL" tokenize --vocab "$GZ" --escaped 'a\qb'
expect_rc badesc 2
expect_in badesc err "bad escape"
run help "$SDTOOL" tokenize --help
expect_rc help 0
expect_in help out "SDTRAIN_TOKENIZER"
pass "sdtool tokenize"
