#!/bin/sh
# Every shipped namelist validates, and the recipes say what ARCHITECTURE.md promises.
. "$top_srcdir/tests/lib.sh"

for f in "$top_srcdir"/inputs/*.nml; do
    b=$(basename "$f" .nml)
    run "$b" "$SDTRAIN" --check --np 4 "$f"
    expect_rc "$b" 0
    expect_in "$b" out "configuration is valid"
done
for r in 256 512; do
    expect_in "sd2-base-$r" out "learning_rate = 0.0001"
    expect_in "sd2-base-$r" out "weight_decay = 0.01"
    expect_in "sd2-base-$r" out "warmup_steps = 10000"
    expect_in "sd2-base-$r" out "lr_schedule = 'constant'"
    expect_in "sd2-base-$r" out "precision = 'bf16'"
    expect_in "sd2-base-$r" out "sharding = 'shard_grad_op'"
    expect_in "sd2-base-$r" out "resolution = $r"
done
expect_in sd2-base-sample out "mode = 'sample'"
expect_in sd2-base-sample out "scheduler = 'dpmpp_2m'"
pass "shipped inputs validate"
