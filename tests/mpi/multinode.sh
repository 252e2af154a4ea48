#!/bin/sh
# Jobs that span nodes, on one machine: Open MPI's mpirun is given two hosts that are not this
# one (--host sdnodeA:2,sdnodeB:2) and a remote-shell agent that runs the daemon it is asked to
# start on "sdnodeB" here instead (plm_rsh_agent, below). Each daemon is a node to the MPI:
# MPI_COMM_TYPE_SHARED splits the ranks by daemon, so sdtrain sees two nodes of two ranks, with
# its node leaders, per-node shared memory and the leaders' broadcasts between them, the code
# that a one-node test never reaches. Ranks of different daemons talk over TCP (btl tcp,self:
# Open MPI's shared-memory transport between "nodes" on one host is not meant to work).
#   1. the communicator report: 2 nodes, node ranks per node;
#   2. mode 'process' on 2 + 2 and on 1 + 3 ranks: the dataset index once per node (2 copies),
#      sent from the first node's leader to the other's; the shards have the same bits as on one
#      node of 4 ranks; the index without node-shared memory: one warning per node, 4 copies;
#   3. mode 'train' (ZeRO-2) on 2 + 2: the same weights and losses, bit for bit, as on one node;
#      a checkpoint written on one node of 4 ranks resumed on 2 + 2 gives the uninterrupted run's
#      bits (a requeued job lands on other nodes);
#   4. mode 'pipeline' with the preprocessing half on one node and the training half on the
#      other: the shards of mode 'process', the job ends with status 0.
# Skips when the launcher is not Open MPI's mpirun or it cannot start the emulated nodes here.
. "$top_srcdir/tests/lib.sh"
need_mpi

# shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
set -- $MPIEXEC
$1 --version 2>&1 | grep -q "Open MPI\|OpenRTE" || skip "the launcher is not Open MPI's mpirun: $MPIEXEC"

# The agent: mpirun calls it as `AGENT [options] HOST COMMAND` to start its daemon on HOST; it
# runs COMMAND here (a child of mpirun, so with mpirun's environment), with a temporary directory
# of HOST's own, as on a real node: two daemons in one session directory overwrite each other's
# shared-memory files (hwloc's topology, PMIx's store) and crash. The directory is short (Unix
# socket paths are made in it).
nodes=$(mktemp -d /tmp/sdmn.XXXXXX) || fail "mktemp -d /tmp/sdmn.XXXXXX"
trap 'rm -rf "$nodes"' EXIT
agent="$TMP/here-agent"
cat >"$agent" <<EOF2
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
mkdir -p "$nodes/\$1" || exit 1
dir="$nodes/\$1"
shift
exec /bin/sh -c "\$* -mca orte_tmpdir_base \$dir"
EOF2
chmod +x "$agent"

# mn NAME HOSTS NP CMD...: CMD under mpirun on the emulated nodes HOSTS (e.g. sdnodeA:2,sdnodeB:2)
mn() {
    name=$1
    hosts=$2
    np=$3
    shift 3
    # shellcheck disable=SC2086
    run "$name" $MPIEXEC --host "$hosts" --mca plm_rsh_agent "$agent" --mca routed direct \
        --mca btl tcp,self $MPIEXEC_NP "$np" "$@"
}

mn probe sdnodeA:1,sdnodeB:1 2 hostname
[ "$RC" = 0 ] || skip "mpirun cannot start two emulated nodes here: $(head -c 400 "$TMP/probe.err")"

# 1. the report
nml check.nml <<EOF2
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$TMP/out' /
&data input = 'images/', shard_dir = 'shards/' /
EOF2
mn check sdnodeA:2,sdnodeB:2 4 "$SDTRAIN" --check "$TMP/check.nml"
expect_rc check 0
expect_in check out "world 4 ranks on 2 node(s)"
# ranks 0-1 on the first node, 2-3 on the second: node ranks 0/2 1/2 0/2 1/2
[ "$(grep -c -E '^  [0-3] +(preprocess|train) .* [01]/2$' "$TMP/check.out")" = 4 ] ||
    fail "check: node ranks: $(cat "$TMP/check.out")"
mn check13 sdnodeA:1,sdnodeB:3 4 "$SDTRAIN" --check "$TMP/check.nml"
expect_rc check13 0
expect_in check13 out "world 4 ranks on 2 node(s)"
expect_in check13 out "  0      preprocess  0/2        "
grep -q -E '^  0 .* 0/1$' "$TMP/check13.out" || fail "check13: rank 0 is alone on its node: $(cat "$TMP/check13.out")"
grep -q -E '^  3 .* 2/3$' "$TMP/check13.out" || fail "check13: rank 3 is third on its node: $(cat "$TMP/check13.out")"

# 2. mode 'process'
run data "$SDTOOL" make-demo-data "$TMP/data" --count 48
expect_rc data 0
proc_nml() { # proc_nml NAME
    nml "$1.nml" <<EOF2
&run mode = 'process', output_dir = '$TMP/run-$1', seed = 5, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards-$1', samples_per_shard = 16,
      encode_batch_size = 4 /
EOF2
}
# same_shards A B: every shard of A equals B's (keys, captions, ids; latents and embeddings
# within 0, that is bit for bit)
same_shards() {
    for k in 0 1 2; do
        f=$(printf 'shard-%06d.h5' "$k")
        run "cmp-$2-$k" "$top_builddir/tests/mpi/shard_compare" "$TMP/shards-$1/$f" "$TMP/shards-$2/$f" 0
        expect_rc "cmp-$2-$k" 0
    done
}
proc_nml one
mpi one 4 "$SDTRAIN" "$TMP/one.nml"
expect_rc one 0
proc_nml two
mn two sdnodeA:2,sdnodeB:2 4 "$SDTRAIN" "$TMP/two.nml"
expect_rc two 0
expect_in two out "world 4 ranks on 2 node(s)"
expect_in two out "in node-shared memory, 2 copies for 4 rank(s) (one per node)"
expect_not_in two err "warning"
same_shards one two
proc_nml odd
mn odd sdnodeA:1,sdnodeB:3 4 "$SDTRAIN" "$TMP/odd.nml"
expect_rc odd 0
expect_in odd out "in node-shared memory, 2 copies for 4 rank(s) (one per node)"
# the cores are shared out per node: the rank alone on its node gets more threads than the 3 of
# the other, and the report gives the range
if [ -z "${OMP_NUM_THREADS:-}" ] && [ "$(nproc)" -ge 2 ] && grep -q "^OpenMP threads" "$TMP/one.out"; then
    expect_in odd out "OpenMP threads per rank: $(($(nproc) / 3 > 1 ? $(nproc) / 3 : 1)) to $(nproc) (cores visible / ranks on the node, which differ between nodes"
fi
same_shards one odd
# each node falls back on its own (its leader says so): one copy per rank
proc_nml noshm
mn noshm sdnodeA:2,sdnodeB:2 4 -x SDTRAIN_TEST_NO_SHARED_INDEX=1 "$SDTRAIN" "$TMP/noshm.nml"
expect_rc noshm 0
expect_count noshm err "not in node-shared memory (shared memory switched off): one copy on each of this node's 2 ranks" 2
expect_in noshm out "4 copies for 4 rank(s): one per rank on the 2 node(s) without node-shared memory"
same_shards one noshm

# 3. mode 'train' on the shards, 8 steps of 4 ranks x 2 with ZeRO-2, a checkpoint every 4
train_nml() { # train_nml NAME [CHECKPOINT-KEYS]
    nml "$1.nml" <<EOF2
&run mode = 'train', output_dir = '$TMP/$1', seed = 11, device = 'cpu' /
&model $TINY_MODEL /
&data shard_dir = '$TMP/shards-one', val_fraction = 0.2 /
&train max_steps = 8, batch_size_per_rank = 2, learning_rate = 1e-3, warmup_steps = 3,
       sharding = 'shard_grad_op', grad_clip = 0.5, log_every = 4, val_every = 4, ema_decay = 0.9 /
&checkpoint every_n_steps = 4 ${2:-} /
EOF2
}
train_nml tone
mpi tone 4 "$SDTRAIN" "$TMP/tone.nml"
expect_rc tone 0
train_nml ttwo
mn ttwo sdnodeA:2,sdnodeB:2 4 "$SDTRAIN" "$TMP/ttwo.nml"
expect_rc ttwo 0
expect_in ttwo out "step 8/8"
same_run ttwo tone # 2 nodes as 1
# the step-4 checkpoint of the one-node run resumed on two nodes
train_nml tres ", resume = '$TMP/tone/checkpoints/step-00000004'"
mn tres sdnodeA:2,sdnodeB:2 4 "$SDTRAIN" "$TMP/tres.nml"
expect_rc tres 0
expect_in tres out "resuming from $TMP/tone/checkpoints/step-00000004: step 4"
same_weights tres tone

# 4. mode 'pipeline': preprocessing on sdnodeA, training on sdnodeB
nml pipe.nml <<EOF2
&run mode = 'pipeline', n_process_ranks = 2, output_dir = '$TMP/pipe', seed = 5, device = 'cpu' /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards-pipe', samples_per_shard = 16,
      encode_batch_size = 4, val_fraction = 0.2 /
&train max_steps = 6, batch_size_per_rank = 4, learning_rate = 1e-3, warmup_steps = 2,
       log_every = 2, val_every = 3 /
EOF2
mn pipe sdnodeA:2,sdnodeB:2 4 "$SDTRAIN" "$TMP/pipe.nml"
expect_rc pipe 0
expect_in pipe out "step 6/6"
expect_in pipe out "all 3 planned shards are committed"
expect_in pipe out "in node-shared memory, 1 copy for 2 rank(s) (one per node)"
[ "$(grep -c '"loss"' "$TMP/pipe/metrics.jsonl")" = 6 ] || fail "pipe: expected 6 step lines"
# 2 preprocessing ranks cut the encoder batches as 'process' on 2 ranks does: compare with that
proc_nml p2
mpi p2 2 "$SDTRAIN" "$TMP/p2.nml"
expect_rc p2 0
same_shards p2 pipe

# no daemon of ours is left behind
! pgrep -f "plm_rsh_agent $agent" >/dev/null || fail "an emulated node's daemon is still running"
pass "multinode"
