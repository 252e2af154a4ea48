#!/bin/sh
# sdtool filter: the counts of &data filter's verdicts over a dataset's .json metadata (those of
# mode 'process', tests/mpi/process.sh: 8 kept, 8 filtered, 8 no_metadata of the same 24), each
# condition alone, the first samples refused in index order whatever the threads; a tar of the
# same files gives the same counts; --max judges an even spread; bad usage and input exit 2.
. "$top_srcdir/tests/lib.sh"

run data "$SDTOOL" make-demo-data "$TMP/data" --count 24
expect_rc data 0
i=0
while [ $i -lt 24 ]; do
    j="$TMP/data/00000/$(printf %09d $i).json"
    case $((i % 6)) in
    0) ;;
    1) echo '{"original_width": 300, "status": "success"}' >"$j" ;;
    2) echo '{"original_width": 800, "status": "failed_to_download"}' >"$j" ;;
    3) echo '{"original_width": 800, "status": "success"' >"$j" ;;
    *) echo '{"original_width": 1024, "status": "success", "punsafe": 0.01}' >"$j" ;;
    esac
    i=$((i + 1))
done
flt='original_width >= 512 and status == "success"'
for th in 1 2; do
    run "all$th" "$SDTOOL" filter --filter "$flt" --threads $th "$TMP/data"
    expect_rc "all$th" 0
    expect_in "all$th" out "dataset: $TMP/data (files, 24 samples; 24 judged in "
    expect_in "all$th" out "  kept                    8   33.3 %"
    expect_in "all$th" out "  filtered                8   33.3 %"
    expect_in "all$th" out "  no_metadata             8   33.3 %"
    expect_in "all$th" out "  original_width >= 512                              12            4            8"
    expect_in "all$th" out '  status == "success"                                12            4            8'
    expect_in "all$th" out "  00000/000000001: filtered: original_width >= 512 is false (300)"
    expect_in "all$th" out '  00000/000000002: filtered: status == "success" is false ("failed_to_download")'
    expect_in "all$th" out "  00000/000000003: no_metadata: the .json metadata is not valid JSON (it ends inside the value)"
    expect_count "all$th" out "  00000/0000000" 8
    sed -n '/^first samples refused/,$p' "$TMP/all$th.out" >"$TMP/shown$th"
done
cmp -s "$TMP/shown1" "$TMP/shown2" || fail "the samples shown depend on the thread count"
(cd "$TMP/data" && find 00000 -type f | LC_ALL=C sort | tar cf "$TMP/data.tar" -T -) || fail "tar failed"
run tar "$SDTOOL" filter --filter "$flt" "$TMP/data.tar"
expect_rc tar 0
expect_in tar out "(webdataset, 24 samples; 24 judged in "
expect_in tar out "  kept                    8   33.3 %"
run max "$SDTOOL" filter --filter "$flt" --max 6 "$TMP/data"
expect_rc max 0
expect_in max out "24 samples; 6 judged, spread evenly in "
# samples 0, 4, 8, 12, 16, 20: none, kept, filtered, none, kept, filtered
expect_in max out "  kept                    2   33.3 %"
expect_in max out "  filtered                2   33.3 %"
expect_in max out "  00000/000000008: filtered: status == "'"success"'" is false"
# a .json that cannot be read (more than 16 MiB) answers no condition: counted so for each
truncate -s 16777217 "$TMP/data/00000/000000004.json"
run big "$SDTOOL" filter --filter "$flt" "$TMP/data"
expect_rc big 0
expect_in big out "  no_metadata             9   37.5 %"
expect_in big out "  original_width >= 512                              11            4            9"
expect_in big out "  00000/000000004: no_metadata: $TMP/data/00000/000000004.json: 16777217 bytes, more than the 16 MiB a .json may have"
echo '{"original_width": 1024, "status": "success", "punsafe": 0.01}' >"$TMP/data/00000/000000004.json"
# bad usage and input
run nofilter "$SDTOOL" filter "$TMP/data"
expect_rc nofilter 2
expect_in nofilter err "usage: sdtool filter"
run badfilter "$SDTOOL" filter --filter "width = 5" "$TMP/data"
expect_rc badfilter 2
expect_in badfilter err "sdtool filter: filter: '=' is no comparison (equal is '==') at '= 5'"
run empty "$SDTOOL" filter --filter " " "$TMP/data"
expect_rc empty 2
expect_in empty err "has no condition"
run missing "$SDTOOL" filter --filter "$flt" "$TMP/no-such"
expect_rc missing 2
expect_in missing err "no-such"
run data-tsv "$SDTOOL" make-demo-data "$TMP/tsv" --count 4 --format tsv
run tsv "$SDTOOL" filter --filter "$flt" "$TMP/tsv/manifest.tsv"
expect_rc tsv 2
expect_in tsv err "is a tsv manifest, which has no per-sample metadata"
run badmax "$SDTOOL" filter --filter "$flt" --max 0 "$TMP/data"
expect_rc badmax 2
expect_in badmax err "--max wants a positive integer, not '0'"
pass "sdtool filter"
