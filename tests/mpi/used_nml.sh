#!/bin/sh
# used.nml: written once by rank 0 into output_dir with the overrides, and re-usable as input.
. "$top_srcdir/tests/lib.sh"
need_mpi

nml in.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/run', seed = 7 /
&data shard_dir = 'shards' /
&train max_steps = 100, learning_rate = 2e-4 /
&sample prompts = 'a cat', 'it''s a dog' /
EOF2
mpi job 3 "$SDTRAIN" "$TMP/in.nml" --set train.max_steps=7 --set "run.log_level=warn"
# there are no shards to train on (exit 2, one message) but the configuration was written first
expect_rc job 2
expect_count job err "cannot read shard directory 'shards'" 1
[ -f "$TMP/run/used.nml" ] || fail "used.nml not written"
u="$TMP/run/used.nml"
grep -q "max_steps = 7 .*! --set #1" "$u" || fail "override not recorded: $(cat "$u")"
grep -q "learning_rate = 0.0002 .*! .*in.nml:3" "$u" || fail "file value not recorded"
grep -q "seed = 7" "$u" || fail "seed missing"
grep -q "prompts = 'a cat', 'it''s a dog'" "$u" || fail "string list not quoted right"
grep -q "^! --set #2: run.log_level=warn" "$u" || fail "--set list missing"
[ "$(ls "$TMP/run" | wc -l)" = 1 ] || fail "stray files in output_dir: $(ls "$TMP/run")"
expect_count job out "effective configuration written to" 1

# used.nml reproduces the same effective configuration
run again "$SDTRAIN" --check --np 3 "$u"
expect_rc again 0
run first "$SDTRAIN" --check --np 3 "$TMP/in.nml" --set train.max_steps=7 --set "run.log_level=warn"
expect_rc first 0
strip() { sed -e 's/ *!.*//' -e '/configuration is valid/d' "$1"; }
strip "$TMP/again.out" >"$TMP/a"
strip "$TMP/first.out" >"$TMP/b"
diff -u "$TMP/b" "$TMP/a" || fail "used.nml does not reproduce the configuration"

# a line break in the input's path or in a --set argument stays inside used.nml's comments
# (it ended the comment, and used.nml did not read back)
nl='
'
cp "$TMP/in.nml" "$TMP/in${nl}&bogus x=1.nml"
mpi brk 1 "$SDTRAIN" "$TMP/in${nl}&bogus x=1.nml" --set "run.output_dir=$TMP/brk" \
    --set "train.max_steps=${nl}5"
expect_rc brk 2
grep -q "^! input: .*/in?&bogus x=1.nml$" "$TMP/brk/used.nml" || fail "input path: $(cat "$TMP/brk/used.nml")"
run brk2 "$SDTRAIN" --check --np 1 "$TMP/brk/used.nml"
expect_rc brk2 0
expect_in brk2 out "max_steps = 5 "

# an OMP_NUM_THREADS the OpenMP runtime rejects is taken as unset (it would run a thread per
# visible core in every rank), with a warning, not credited in the thread count's line
OMP_NUM_THREADS=abc mpi omp 2 "$SDTRAIN" "$TMP/in.nml" --set "run.output_dir=$TMP/omp"
expect_count omp err "OMP_NUM_THREADS = 'abc' is not a positive number of threads: taken as unset" 1
expect_in omp out "OpenMP threads per rank: "
expect_not_in omp out "(OMP_NUM_THREADS)"

# an output directory that cannot be created is an error for every rank, once: the
# configuration's (status 2, no retry), as a file in its place is
mpi badout 2 "$SDTRAIN" "$TMP/in.nml" --set "run.output_dir=/proc/sdtrain-cannot/x"
expect_rc badout 2
expect_count badout err "cannot create directory" 1
: >"$TMP/afile"
mpi fileout 2 "$SDTRAIN" "$TMP/in.nml" --set "run.output_dir=$TMP/afile"
expect_rc fileout 2
expect_count fileout err "directory '$TMP/afile' exists and is not a directory" 1
pass "used.nml"
