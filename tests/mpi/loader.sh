#!/bin/sh
# The training data loader under mpirun with 1, 2 and 3 ranks: each rank's batches are its slice
# of the seeded global batch with the exact stored data, every training sample once per epoch,
# the validation split is the key-hash one; the global batch sequence is the same for any split
# of the global batch over ranks and for fp16 or fp32 shards; seek and synchronous reads give the
# same batches; bad shard directories and shards that break after open give an error on every
# rank, without a hang.
. "$top_srcdir/tests/lib.sh"
need_mpi
prog="$top_builddir/tests/mpi/loader_test"
# Shard indices with a gap; 48 samples, 11 held out at 0.2, so 37 train: with a global batch of
# 6 an epoch is 6 steps and drops one sample. 16 steps cross two epoch boundaries.
SPEC=0:13,1:5,2:19,4:11
G=6
K=16

for dt in f16 f32; do
    mpi "w-$dt" 2 "$prog" write "$TMP/$dt" "$dt" "$SPEC"
    expect_rc "w-$dt" 0
    expect_count "w-$dt" out "committed shard-" 4
    for np in 1 2 3; do
        mpi "c-$dt-$np" "$np" "$prog" check "$TMP/$dt" "$dt" "$SPEC" $((G / np)) 0.2 77 "$K" "$TMP/digest-$dt-$np"
        expect_rc "c-$dt-$np" 0
        expect_not_in "c-$dt-$np" out "not ok"
        grep -q '^1\.\.[0-9]' "$TMP/c-$dt-$np.out" || fail "c-$dt-$np: no TAP plan (crashed?)"
        [ "$(wc -l <"$TMP/digest-$dt-$np")" = "$K" ] || fail "c-$dt-$np: digest has not $K steps"
    done
done
expect_in c-f16-1 out "48 samples: 37 train, 11 validation; global batch 6, 6 steps per epoch"
expect_in c-f16-1 out "direct reads: 4 of 4 shards"
# The same data through HDF5 (the test hook), and from shards in the chunked layout written
# before 2026-11-27 (which have no direct layout): the same batches, the exact data
mpi c-hdf5 2 env SDTRAIN_TEST_LOADER_HDF5=1 "$prog" check "$TMP/f16" f16 "$SPEC" $((G / 2)) 0.2 77 "$K" "$TMP/digest-hdf5"
expect_rc c-hdf5 0
expect_not_in c-hdf5 out "not ok"
expect_in c-hdf5 out "direct reads: 0 of 4 shards"
mpi w-chunked 2 env SDTRAIN_TEST_SHARD_CHUNKED=1 "$prog" write "$TMP/chunked" f16 "$SPEC"
expect_rc w-chunked 0
mpi c-chunked 3 "$prog" check "$TMP/chunked" f16 "$SPEC" $((G / 3)) 0.2 77 "$K" "$TMP/digest-chunked"
expect_rc c-chunked 0
expect_not_in c-chunked out "not ok"
expect_in c-chunked out "direct reads: 0 of 4 shards"
for d in hdf5 chunked; do
    cmp -s "$TMP/digest-f16-1" "$TMP/digest-$d" || fail "global batches of f16 and $d differ"
done
pass "reads without HDF5 (contiguous shards), through HDF5, and of chunked shards: the same"
for d in f16-2 f16-3 f32-1 f32-2 f32-3; do
    cmp -s "$TMP/digest-f16-1" "$TMP/digest-$d" || fail "global batches of f16 at 1 rank and $d differ"
done
pass "the same global batches at 1, 2, 3 ranks, fp16 and fp32"

# The open shards need file descriptors: a soft limit too low for the default 64 (plus the
# loader's reserve of 256) is raised to fit; a hard limit too low keeps fewer shards open, with
# a warning, and the same batches
mpi fd-soft 1 sh -c "ulimit -S -n 290 && exec \"$prog\" check \"$TMP/f16\" f16 $SPEC $G 0.2 77 $K \"$TMP/digest-fd-soft\""
expect_rc fd-soft 0
expect_not_in fd-soft err "shards open instead of"
mpi fd-hard 1 sh -c "ulimit -n 290 && exec \"$prog\" check \"$TMP/f16\" f16 $SPEC $G 0.2 77 $K \"$TMP/digest-fd-hard\""
expect_rc fd-hard 0
expect_in fd-hard err "the loader keeps 34 shards open instead of 64 (&data open_shards)"
for d in fd-soft fd-hard; do
    cmp -s "$TMP/digest-f16-1" "$TMP/digest-$d" || fail "$d: other global batches"
done
pass "open shards fit the limit of open files: raised, or fewer with a warning"

# Empty shards (mode 'process' commits one when every sample of its range was skipped), written
# by 2 ranks with no sample at all: the loader passes over them, so the same data plus empty
# shards 3 and 5 gives the global batches of the data without them, bit for bit; an empty
# shard 0 (the empty-caption embedding read from it) and shards that are all empty
ESPEC=0:13,1:5,2:19,3:0,4:11,5:0
mpi w-empty 2 "$prog" write "$TMP/eshards" f16 "$ESPEC"
expect_rc w-empty 0
expect_count w-empty out "committed shard-000003.h5: 0 samples" 1
mpi c-empty 3 "$prog" check "$TMP/eshards" f16 "$ESPEC" 2 0.2 77 "$K" "$TMP/digest-empty"
expect_rc c-empty 0
expect_not_in c-empty out "not ok"
cmp -s "$TMP/digest-f16-1" "$TMP/digest-empty" || fail "empty shards changed the global batches"
ESPEC0=0:0,1:13,2:0,3:24
mpi w-empty0 2 "$prog" write "$TMP/eshards0" f32 "$ESPEC0"
expect_rc w-empty0 0
mpi c-empty0 2 "$prog" check "$TMP/eshards0" f32 "$ESPEC0" 3 0.2 77 "$K" "$TMP/digest-empty0"
expect_rc c-empty0 0
expect_not_in c-empty0 out "not ok"
mpi w-allempty 2 "$prog" write "$TMP/allempty" f16 0:0,1:0
expect_rc w-allempty 0
pass "empty shards: passed over, the same global batches"

# A shuffle window (&data shuffle_window = W): loader.h's order built from windows of W shards.
# Every step is the model's (written from loader.h apart from the loader), at 1, 2 and 3 ranks
# the same global batches, each from at most 2 W shards, every sample once an epoch; not the
# global order. With empty shards among them too.
for w in 1 2; do
    for np in 1 2 3; do
        mpi "win$w-$np" "$np" "$prog" check "$TMP/f16" f16 "$SPEC" $((G / np)) 0.2 77 "$K" \
            "$TMP/digest-win$w-$np" "$w"
        expect_rc "win$w-$np" 0
        expect_not_in "win$w-$np" out "not ok"
        grep -q '^1\.\.[0-9]' "$TMP/win$w-$np.out" || fail "win$w-$np: no TAP plan (crashed?)"
    done
    for np in 2 3; do
        cmp -s "$TMP/digest-win$w-1" "$TMP/digest-win$w-$np" ||
            fail "window $w: the global batches at 1 and $np ranks differ"
    done
    ! cmp -s "$TMP/digest-f16-1" "$TMP/digest-win$w-1" || fail "window $w: the global order"
done
mpi win-empty 3 "$prog" check "$TMP/eshards" f16 "$ESPEC" 2 0.2 77 "$K" "$TMP/digest-win-empty" 2
expect_rc win-empty 0
expect_not_in win-empty out "not ok"
pass "shuffle windows of 1 and 2 shards: the order of loader.h, the same at any rank count"

# Another seed, another order; no validation set at all.
mpi seed 2 "$prog" check "$TMP/f16" f16 "$SPEC" 3 0.2 78 "$K" "$TMP/digest-seed"
expect_rc seed 0
cmp -s "$TMP/digest-f16-1" "$TMP/digest-seed" && fail "seeds 77 and 78 give the same order"
mpi noval 3 "$prog" check "$TMP/f32" f32 "$SPEC" 2 0 77 "$K" "$TMP/digest-noval"
expect_rc noval 0
expect_not_in noval out "not ok"
expect_in noval out "48 samples: 48 train, 0 validation"
pass "seed and validation fraction"

# Errors found at open: every rank returns the same message, exit status 1, no hang.
errcase() { # errcase NAME NP DIR B FRAC MESSAGE
    mpi "$1" "$2" "$prog" open "$3" "$4" "$5"
    expect_rc "$1" 1
    expect_count "$1" err "loader error: " "$2"
    expect_count "$1" err "$6" "$2"
}
errcase missing 3 "$TMP/nonexistent" 2 0.2 "cannot read shard directory '$TMP/nonexistent': No such file"
mkdir -p "$TMP/empty"
errcase empty 3 "$TMP/empty" 2 0.2 "no committed shards in '$TMP/empty'"
errcase notdir 2 "$TMP/digest-seed" 2 0.2 "is not a directory"
errcase nodir 2 "" 2 0.2 "needs a shard directory"
errcase allempty 2 "$TMP/allempty" 1 0.2 "$TMP/allempty: no training samples: the 2 committed shard(s) are all empty (each sample of their ranges was skipped"
errcase toofew 3 "$TMP/f16" 13 0.2 "37 training samples (of 48; 11 held out for validation) are fewer than one global batch of 39 (3 ranks x 13)"
errcase toofew1 1 "$TMP/f16" 38 0.2 "are fewer than one global batch of 38"
mpi enough 1 "$prog" open "$TMP/f16" 37 0.2
expect_rc enough 0
expect_in enough out "opened: 37 train, 11 validation samples"

cp -r "$TMP/f16" "$TMP/truncated"
truncate -s -100 "$TMP/truncated/shard-000002.h5"
errcase truncated 3 "$TMP/truncated" 2 0.2 "lists $TMP/truncated/shard-000002.h5 with"
expect_in truncated err "bytes, but the file has"

# the same size, but not an HDF5 file any more
cp -r "$TMP/f16" "$TMP/corrupt"
dd if=/dev/zero of="$TMP/corrupt/shard-000001.h5" bs=512 count=1 conv=notrunc 2>/dev/null
errcase corrupt 2 "$TMP/corrupt" 2 0.2 "$TMP/corrupt/shard-000001.h5"
expect_in corrupt err "HDF5"

# shards that disagree (another embedding width)
mpi w-mixed 2 "$prog" write "$TMP/mixed" f16 0:7,1:7
expect_rc w-mixed 0
mpi w-mixed2 2 "$prog" write "$TMP/mixed" f16 2:7 16
expect_rc w-mixed2 0
errcase mixed 3 "$TMP/mixed" 1 0.2 "shard-000002.h5: resolution 16, latent channels 4, latent size 2, text_len 77, embed_dim 16"
expect_in mixed err "all shards of a training set must agree"
# shards of other encoder weights (the same shapes): latents of two spaces, refused by name
mpi w-mixhash 2 "$prog" write "$TMP/mixhash" f16 0:7,1:7 8 fnv1a64:00000000000000aa
expect_rc w-mixhash 0
mpi w-mixhash2 2 "$prog" write "$TMP/mixhash" f16 2:7 8 fnv1a64:00000000000000bb
expect_rc w-mixhash2 0
errcase mixhash 3 "$TMP/mixhash" 1 0.2 "shard-000002.h5 was encoded by other weights (fnv1a64:00000000000000bb"
expect_in mixhash err "all shards of a training set must come from the same VAE and text encoder"
pass "open errors reach every rank"

# A shard that becomes unreadable after open: next fails on every rank, with and without prefetch.
for np in 1 3; do
    cp -r "$TMP/f32" "$TMP/unreadable-$np"
    mpi "unreadable-$np" "$np" "$prog" unreadable "$TMP/unreadable-$np" 2
    expect_rc "unreadable-$np" 0
    expect_not_in "unreadable-$np" out "not ok"
    expect_count "unreadable-$np" out "ok " 2
done
pass "training data loader"

# Follow mode (&run mode = 'pipeline'): world rank 0 writes shards 0..3 one by one while the
# other ranks read; the first pass goes shard by shard, later epochs are the usual permutations,
# validation is shard 0's held-out part. The same global batches for 1 x 6, 2 x 3 and 3 x 2
# readers, with and without prefetch, and whether the writer is fast or slow.
FSPEC=0:13,1:5,2:19,3:11
mpi fol-1 2 "$prog" follow "$TMP/fol-1" f16 "$FSPEC" 6 0.2 77 "$K" 0 1 "$TMP/fdigest-1"
expect_rc fol-1 0
mpi fol-2 3 "$prog" follow "$TMP/fol-2" f16 "$FSPEC" 3 0.2 77 "$K" 300 1 "$TMP/fdigest-2"
expect_rc fol-2 0
expect_in fol-2 out "waiting for shard 2 (shard-000002.h5) to be committed in $TMP/fol-2"
mpi fol-3 4 "$prog" follow "$TMP/fol-3" f32 "$FSPEC" 2 0.2 77 "$K" 100 0 "$TMP/fdigest-3"
expect_rc fol-3 0
for n in 1 2 3; do
    expect_not_in "fol-$n" out "not ok"
    grep -q '^1\.\.[0-9]' "$TMP/fol-$n.out" || fail "fol-$n: no TAP plan (crashed?)"
    [ "$(wc -l <"$TMP/fdigest-$n")" = "$K" ] || fail "fol-$n: digest has not $K steps"
done
cmp -s "$TMP/fdigest-1" "$TMP/fdigest-2" && cmp -s "$TMP/fdigest-1" "$TMP/fdigest-3" ||
    fail "follow mode: the global batches depend on the reader split or the writer's speed"
pass "follow mode: the same global batches for any split and any writer speed"
# Empty shards as they come: an empty shard 0 (the validation set is then the first shard with
# samples, fixed at open; open waits for it), one in the middle, one at the end; and a dataset of
# nothing but empty shards, where the first step fails with a clear message on every rank
mpi fol-empty 3 "$prog" follow "$TMP/fol-empty" f16 0:0,1:13,2:5,3:0,4:19,5:0 3 0.2 77 "$K" 100 1 "$TMP/fdigest-e"
expect_rc fol-empty 0
expect_not_in fol-empty out "not ok"
expect_in fol-empty out "validation: shard 0 is empty (each sample was skipped in preprocessing); the validation set is the held-out samples of shard 1, the first holding samples"
expect_in fol-empty out "in shard 1, the validation set"
mpi fol-allempty 3 "$prog" follow "$TMP/fol-allempty" f16 0:0,1:0 2 0.2 77 2 50 1 "$TMP/fdigest-ae"
expect_rc fol-allempty 0
expect_not_in fol-allempty out "not ok"
expect_in fol-allempty out "every shard empty: $TMP/fol-allempty: no training samples"
pass "follow mode: empty shards"
