#!/bin/sh
# The job scripts users submit, slurm/process.sh and slurm/train.sh, run without Slurm: the
# launcher is the MPI launcher (their LAUNCH variable, which replaces srun), SLURM_NTASKS and
# SLURM_JOB_ID are set as sbatch sets them, and `scontrol` is a stand-in that records its
# arguments.
#   1. process.sh makes the shards with 2 ranks; run again (a requeued job) it finds them all
#      committed and writes nothing new; a failed run requeues its job;
#   2. a bad namelist stops either script at its --check, before any rank starts, with the file
#      and line named and a non-zero status;
#   3. train.sh, sent SIGUSR1 as Slurm's --signal=B:USR1 does before the time limit: the ranks
#      checkpoint at the next step boundary, the script exits 0 and requeues its job
#      (`scontrol requeue JOBID`, the failure count in its Comment reset); run again, as the
#      requeued job, it resumes from that checkpoint and finishes; without a signal it does not
#      requeue;
#   4. a failed run (a rank killed) is requeued with the failure counted in the job's Comment,
#      up to SDTRAIN_MAX_RESTARTS in a row; a run that ends with status 2 (bad input) is not;
#   5. srun gets the task's CPUs (SRUN_CPUS_PER_TASK), OMP_NUM_THREADS is left alone outside Slurm;
#   6. a launcher that ends right after SIGUSR1 is requeued for the time limit, not as a failure;
#   7. a launcher that is not there (srun outside Slurm) is named, status 2, nothing requeued;
#   8. process.sh sent SIGUSR1 ahead of the time limit: the ranks commit the shard encoded and
#      exit 0, the script requeues its job, and the requeued job commits the rest;
#   9. sample.sh likewise: the ranks stop after the batch they denoise, the script requeues its
#      job, and the requeued job keeps those images and makes the rest; a failed run is requeued.
. "$top_srcdir/tests/lib.sh"
need_mpi
command -v bash >/dev/null 2>&1 || skip "no bash (the job scripts are bash)"

mkdir -p "$TMP/bin"
# the stand-in keeps the job's Comment in a file, as Slurm keeps it across requeues
cat >"$TMP/bin/scontrol" <<EOF2
#!/bin/sh
echo "\$*" >>"$TMP/scontrol.log"
case "\$1" in
show) echo "JobId=\$3 JobName=sdtrain-train Comment=\$(cat "$TMP/comment" 2>/dev/null || echo '(null)')" ;;
update) for a in "\$@"; do case "\$a" in Comment=*) echo "\${a#Comment=}" >"$TMP/comment" ;; esac; done ;;
esac
EOF2
chmod +x "$TMP/bin/scontrol"
: >"$TMP/scontrol.log"
export SDTRAIN
# shellcheck disable=SC2086 # MPIEXEC holds a command and its flags
LAUNCH="$MPIEXEC $MPIEXEC_NP 2"
export LAUNCH

# usr1_when_exists FILE PID WHAT: once FILE exists, SIGUSR1 to PID (a job script in the
# background, as Slurm's --signal=B:USR1 sends it); PID's exit status in RC
usr1_when_exists() {
    waited=0
    while [ ! -e "$1" ]; do
        waited=$((waited + 1))
        [ $waited -lt 600 ] || { kill -KILL "$2"; fail "$3 within 60 s"; }
        sleep 0.1
    done
    kill -USR1 "$2"
    RC=0
    wait "$2" || RC=$?
}

# job NAME SCRIPT ARGS...: the script as the batch step of job 4242 with 2 tasks
job() {
    name=$1
    shift
    run "$name" env PATH="$TMP/bin:$PATH" SLURM_NTASKS=2 SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 \
        bash "$@"
}

# 1. preprocessing
run data "$SDTOOL" make-demo-data "$TMP/data" --count 48
expect_rc data 0
nml proc.nml <<EOF2
&run mode = 'train', output_dir = '$TMP/proc', seed = 5 /
&model $TINY_MODEL /
&data input = '$TMP/data', shard_dir = '$TMP/shards', samples_per_shard = 16, encode_batch_size = 8 /
EOF2
job proc "$top_srcdir/slurm/process.sh" "$TMP/proc.nml"
expect_rc proc 0
expect_in proc out "into 3 shard(s) of 16"
expect_in proc out "0 already committed"
[ "$(ls "$TMP/shards"/shard-*.h5 | wc -l)" = 3 ] || fail "process.sh: $(ls "$TMP/shards")"
cp "$TMP/shards/manifest.json" "$TMP/manifest-1.json"
job proc2 "$top_srcdir/slurm/process.sh" "$TMP/proc.nml"
expect_rc proc2 0
expect_in proc2 out "3 already committed"
cmp -s "$TMP/shards/manifest.json" "$TMP/manifest-1.json" || fail "process.sh again: the manifest changed"
pass "slurm/process.sh: shards with 2 ranks; again, everything already committed"
# a failed preprocessing run is requeued (the launcher fails before starting anything)
: >"$TMP/scontrol.log"
rm -f "$TMP/comment"
LAUNCH=false job procfail "$top_srcdir/slurm/process.sh" "$TMP/proc.nml"
expect_rc procfail 1
expect_in procfail out "sdtrain failed (exit 1); requeueing job 4242 to go on from the committed shards (failure 1 of at most 3 in a row)"
[ "$(tr '\n' ';' <"$TMP/scontrol.log")" = "show job 4242;update JobId=4242 Comment=sdtrain-failures=1;requeue 4242;" ] ||
    fail "process.sh: scontrol was called with: $(cat "$TMP/scontrol.log")"
rm -f "$TMP/comment"
pass "slurm/process.sh requeues a failed run"

# 2. a bad namelist: refused by --check, no rank started
printf "&run mode = 'train', output_dir = '%s/bad' /\n&train max_steps = -3 /\n" "$TMP" | nml bad.nml
for s in process train; do
    job "bad-$s" "$top_srcdir/slurm/$s.sh" "$TMP/bad.nml"
    [ "$RC" != 0 ] || fail "slurm/$s.sh accepted a bad namelist"
    expect_in "bad-$s" err "bad.nml:2:"
    expect_not_in "bad-$s" out "communicators:"
done
pass "a bad namelist stops both scripts at --check"

# 3. the time-limit signal and the requeue
: >"$TMP/scontrol.log"
nml train.nml <<EOF2
&run mode = 'process', output_dir = '$TMP/train', seed = 11 /
&model $TINY_MODEL /
&data shard_dir = '$TMP/shards', val_fraction = 0.2 /
&train max_steps = 1000000, batch_size_per_rank = 4, learning_rate = 1e-3, log_every = 1,
       val_every = 0 /
&checkpoint every_n_steps = 0 /
EOF2
env PATH="$TMP/bin:$PATH" SLURM_NTASKS=2 SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 \
    bash "$top_srcdir/slurm/train.sh" "$TMP/train.nml" >"$TMP/sig.out" 2>"$TMP/sig.err" &
usr1_after_first_step sig $! "$TMP/train/metrics.jsonl"
expect_rc sig 0
expect_in sig out "after SIGUSR1; resubmit to continue"
expect_in sig out "sdtrain stopped for the time limit with a checkpoint; requeueing job 4242"
[ "$(tr '\n' ';' <"$TMP/scontrol.log")" = "update JobId=4242 Comment=sdtrain-failures=0;requeue 4242;" ] ||
    fail "scontrol was called with: $(cat "$TMP/scontrol.log")"
k=$(sed -n 's/^checkpointed at step \([0-9]*\) after SIGUSR1.*/\1/p' "$TMP/sig.out")
[ -n "$k" ] && [ -d "$TMP/train/checkpoints/$(printf 'step-%08d' "$k")" ] ||
    fail "no checkpoint of step '$k' in $TMP/train/checkpoints"
pass "slurm/train.sh: SIGUSR1 checkpoints at step $k, exits 0 and requeues the job"

# the requeued job: the same script and namelist (a shorter run, so that it ends)
: >"$TMP/scontrol.log"
job resumed "$top_srcdir/slurm/train.sh" "$TMP/train.nml" --set train.max_steps=$((k + 2))
expect_rc resumed 0
expect_in resumed out "resuming from $TMP/train/checkpoints/$(printf 'step-%08d' "$k")"
[ -f "$TMP/train/unet_final.safetensors" ] || fail "the resumed job wrote no final weights"
[ ! -s "$TMP/scontrol.log" ] || fail "a job that ended by itself requeued: $(cat "$TMP/scontrol.log")"
pass "the requeued job resumes from that checkpoint and ends without requeueing"

# 4. failures: requeued while the count in the job's Comment is below SDTRAIN_MAX_RESTARTS
: >"$TMP/scontrol.log"
echo "sdtrain-failures=1" >"$TMP/comment"
SDTRAIN_FAULT="kill:rank=1:step=2" job failed "$top_srcdir/slurm/train.sh" "$TMP/train.nml" \
    --set run.output_dir="'$TMP/failed'"
[ "$RC" != 0 ] || fail "a killed rank, yet train.sh exited 0"
expect_in failed out "sdtrain failed (exit $RC); requeueing job 4242 to resume from its newest checkpoint (failure 2 of at most 3 in a row)"
[ "$(tr '\n' ';' <"$TMP/scontrol.log")" = "show job 4242;update JobId=4242 Comment=sdtrain-failures=2;requeue 4242;" ] ||
    fail "scontrol was called with: $(cat "$TMP/scontrol.log")"
: >"$TMP/scontrol.log"
SDTRAIN_MAX_RESTARTS=2 SDTRAIN_FAULT="kill:rank=1:step=2" job failed2 "$top_srcdir/slurm/train.sh" \
    "$TMP/train.nml" --set run.output_dir="'$TMP/failed2'"
[ "$RC" != 0 ] || fail "a killed rank, yet train.sh exited 0"
expect_in failed2 out "sdtrain failed (exit $RC) 3 times in a row; not requeueing (SDTRAIN_MAX_RESTARTS=2)"
grep -q requeue "$TMP/scontrol.log" && fail "requeued past SDTRAIN_MAX_RESTARTS"
: >"$TMP/scontrol.log"
job noshards "$top_srcdir/slurm/train.sh" "$TMP/train.nml" --set data.shard_dir="'$TMP/nowhere'" \
    --set run.output_dir="'$TMP/noshards'"
expect_rc noshards 2
[ ! -s "$TMP/scontrol.log" ] || fail "a run with bad input (exit 2) was requeued: $(cat "$TMP/scontrol.log")"
pass "failures requeue up to SDTRAIN_MAX_RESTARTS in a row (counted in the job's Comment); bad input does not"

# 5. the CPUs of a task: srun (Slurm >= 22.05) does not take --cpus-per-task from sbatch, so
#    the scripts pass SLURM_CPUS_PER_TASK on as SRUN_CPUS_PER_TASK (else every rank is bound to
#    one core and its OpenMP threads share it); outside Slurm OMP_NUM_THREADS is left alone
#    (not forced to 1). A stand-in srun records what it was given.
cat >"$TMP/bin/srun" <<EOF3
#!/bin/sh
echo "srun \$* SRUN_CPUS_PER_TASK=\${SRUN_CPUS_PER_TASK:-unset} OMP_NUM_THREADS=\${OMP_NUM_THREADS:-unset}" >>"$TMP/srun.log"
EOF3
chmod +x "$TMP/bin/srun"
for s in process train sample; do
    : >"$TMP/srun.log"
    run "cpus-$s" env -u LAUNCH -u OMP_NUM_THREADS PATH="$TMP/bin:$PATH" SLURM_NTASKS=2 \
        SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=12 bash "$top_srcdir/slurm/$s.sh" "$TMP/proc.nml"
    expect_rc "cpus-$s" 0
    grep -q "SRUN_CPUS_PER_TASK=12 OMP_NUM_THREADS=12\$" "$TMP/srun.log" ||
        fail "slurm/$s.sh: srun ran as: $(cat "$TMP/srun.log")"
    : >"$TMP/srun.log"
    run "nocpus-$s" env -u LAUNCH -u SLURM_CPUS_PER_TASK -u SLURM_JOB_ID -u SLURM_NTASKS \
        PATH="$TMP/bin:$PATH" OMP_NUM_THREADS=3 bash "$top_srcdir/slurm/$s.sh" "$TMP/proc.nml"
    expect_rc "nocpus-$s" 0
    grep -q "SRUN_CPUS_PER_TASK=unset OMP_NUM_THREADS=3\$" "$TMP/srun.log" ||
        fail "slurm/$s.sh outside Slurm: srun ran as: $(cat "$TMP/srun.log")"
done
pass "the scripts give srun the task's CPUs (SRUN_CPUS_PER_TASK) and leave OMP_NUM_THREADS alone outside Slurm"

# 6. a launcher that ends (status 0, checkpoint written) right after it is sent SIGUSR1: the
#    script takes its status, not the interrupted wait's (138), and requeues for the time limit.
#    The race is the script's; a few tries make a wrong status all but certain to show.
cat >"$TMP/bin/quick-launcher" <<EOF3
#!/bin/bash
sleep 600 &
trap "kill \$! 2>/dev/null; exit 0" USR1
touch "$TMP/quick.started"
wait
EOF3
chmod +x "$TMP/bin/quick-launcher"
for i in 1 2 3 4 5 6; do
    : >"$TMP/scontrol.log"
    rm -f "$TMP/quick.started" "$TMP/comment"
    env PATH="$TMP/bin:$PATH" LAUNCH="$TMP/bin/quick-launcher" SLURM_NTASKS=2 SLURM_JOB_ID=4242 \
        SLURM_CPUS_PER_TASK=1 bash "$top_srcdir/slurm/train.sh" "$TMP/train.nml" \
        >"$TMP/quick.out" 2>"$TMP/quick.err" &
    usr1_when_exists "$TMP/quick.started" $! "quick-launcher did not start"
    expect_rc quick 0
    expect_in quick out "sdtrain stopped for the time limit with a checkpoint; requeueing job 4242"
    expect_not_in quick out "sdtrain failed"
done
pass "slurm/train.sh: a launcher that ends right after SIGUSR1 is requeued for the time limit, not as a failure"

# 7. a launcher that does not exist (srun outside Slurm): named, with LAUNCH to set; status 2
for s in process train sample; do
    : >"$TMP/scontrol.log"
    LAUNCH="no-such-launcher --mpi=pmix" job "nolaunch-$s" "$top_srcdir/slurm/$s.sh" "$TMP/proc.nml"
    expect_rc "nolaunch-$s" 2
    expect_in "nolaunch-$s" err "slurm/$s.sh: the launcher 'no-such-launcher' is not found; outside Slurm set LAUNCH"
    [ ! -s "$TMP/scontrol.log" ] || fail "$s.sh without a launcher called scontrol: $(cat "$TMP/scontrol.log")"
done
pass "slurm/*.sh: a missing launcher is named with LAUNCH to set, status 2, nothing requeued"

# 8. process.sh and the time-limit signal: a shard boundary, status 0, requeued; the requeued
#    job writes the rest (the shards slowed down so that the signal comes mid-run)
: >"$TMP/scontrol.log"
rm -f "$TMP/comment"
env PATH="$TMP/bin:$PATH" SLURM_NTASKS=2 SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 \
    SDTRAIN_TEST_SHARD_DELAY_MS=400 bash "$top_srcdir/slurm/process.sh" "$TMP/proc.nml" \
    --set data.shard_dir="'$TMP/shards-sig'" --set data.samples_per_shard=4 \
    >"$TMP/psig.out" 2>"$TMP/psig.err" &
usr1_when_exists "$TMP/shards-sig/manifest.json" $! "process.sh: no shard committed"
expect_rc psig 0
expect_in psig out "stopped for SIGUSR1 after committing shard"
expect_in psig out "sdtrain stopped for the time limit after committing a shard; requeueing job 4242"
[ "$(tr '\n' ';' <"$TMP/scontrol.log")" = "update JobId=4242 Comment=sdtrain-failures=0;requeue 4242;" ] ||
    fail "process.sh: scontrol was called with: $(cat "$TMP/scontrol.log")"
n=$(grep -c '"index"' "$TMP/shards-sig/manifest.json")
[ "$n" -ge 1 ] && [ "$n" -lt 12 ] || fail "process.sh after SIGUSR1: $n of 12 shards committed"
: >"$TMP/scontrol.log"
job psig2 "$top_srcdir/slurm/process.sh" "$TMP/proc.nml" --set data.shard_dir="'$TMP/shards-sig'" \
    --set data.samples_per_shard=4
expect_rc psig2 0
expect_in psig2 out "$n already committed"
[ "$(grep -c '"index"' "$TMP/shards-sig/manifest.json")" = 12 ] || fail "the requeued process.sh did not finish"
[ ! -s "$TMP/scontrol.log" ] || fail "a process.sh job that ended by itself requeued: $(cat "$TMP/scontrol.log")"
pass "slurm/process.sh: SIGUSR1 commits the shard encoded, exits 0 and requeues; the requeued job commits the rest"

# 9. sample.sh and the time-limit signal: the ranks stop after their batch (each slowed to 0.4 s,
#    so that the signal comes mid-run), status 0, requeued; the requeued job keeps the images and
#    makes the rest, the bytes of an uninterrupted run; a failed run is requeued
nml samp.nml <<EOF2
&run mode = 'sample', output_dir = '$TMP/samp', seed = 7, device = 'cpu' /
&model pretrained = '$top_srcdir/tests/data/models/tiny-sd2',
       tokenizer = '$top_srcdir/tests/data/sample/tokenizer', resolution = 16 /
&sample prompts = 'a photo of the cat', 'red car at the sea', num_steps = 2,
        images_per_prompt = 4 /
EOF2
mpi sampref 1 "$SDTRAIN" "$TMP/samp.nml" --set "run.output_dir='$TMP/sampref'"
expect_rc sampref 0
: >"$TMP/scontrol.log"
rm -f "$TMP/comment"
env PATH="$TMP/bin:$PATH" SLURM_NTASKS=2 SLURM_JOB_ID=4242 SLURM_CPUS_PER_TASK=1 \
    SDTRAIN_TEST_SAMPLE_DELAY_MS=400 bash "$top_srcdir/slurm/sample.sh" "$TMP/samp.nml" \
    >"$TMP/ssig.out" 2>"$TMP/ssig.err" &
usr1_when_exists "$TMP/samp/samples/0-1.png" $! "sample.sh: no image written"
expect_rc ssig 0
expect_in ssig out "stopped for SIGUSR1: "
expect_in ssig out "sdtrain stopped for the time limit; requeueing job 4242 to go on from the images written"
[ "$(tr '\n' ';' <"$TMP/scontrol.log")" = "update JobId=4242 Comment=sdtrain-failures=0;requeue 4242;" ] ||
    fail "sample.sh: scontrol was called with: $(cat "$TMP/scontrol.log")"
n=$(ls "$TMP/samp/samples" | grep -c '\.png$')
[ "$n" -ge 1 ] && [ "$n" -lt 8 ] || fail "sample.sh after SIGUSR1: $n of 8 images"
: >"$TMP/scontrol.log"
job ssig2 "$top_srcdir/slurm/sample.sh" "$TMP/samp.nml"
expect_rc ssig2 0
expect_in ssig2 out "kept $n of the 8 image(s) from the run before"
for f in 0-0 0-1 0-2 0-3 1-0 1-1 1-2 1-3; do
    cmp -s "$TMP/sampref/samples/$f.png" "$TMP/samp/samples/$f.png" || fail "sample.sh requeued: $f.png differs"
done
[ ! -s "$TMP/scontrol.log" ] || fail "a sample.sh job that ended by itself requeued: $(cat "$TMP/scontrol.log")"
LAUNCH=false job sampfail "$top_srcdir/slurm/sample.sh" "$TMP/samp.nml"
expect_rc sampfail 1
expect_in sampfail out "sdtrain failed (exit 1); requeueing job 4242 to go on from the images written (failure 1 of at most 3 in a row)"
rm -f "$TMP/comment"
pass "slurm/sample.sh: SIGUSR1 stops after the batches, exits 0 and requeues; the requeued job keeps the images and makes the rest"
