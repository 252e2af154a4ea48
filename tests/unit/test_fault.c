/* SDTRAIN_FAULT specifications: accepted forms, refused forms, and lookup. */
#include <string.h>

#include "sdtrain/fault.h"
#include "tap.h"

static int parses(const char *spec)
{
    sd_fault f[SD_FAULT_MAX];
    int n;
    sd_err err;
    return sd_fault_parse(spec, f, &n, &err) == 0;
}

static int refused_with(const char *spec, const char *needle)
{
    sd_fault f[SD_FAULT_MAX];
    int n;
    sd_err err;
    if (sd_fault_parse(spec, f, &n, &err) == 0)
        return 0;
    if (!strstr(err.msg, needle)) {
        tap_diag("'%s' -> %s", spec, err.msg);
        return 0;
    }
    return 1;
}

int main(void)
{
    sd_fault f[SD_FAULT_MAX];
    int n = 0;
    sd_err err;

    tap_ok(parses("kill:rank=2:step=7"), "kill at a step");
    tap_ok(parses("kill:rank=0:phase=ckpt-commit"), "kill at a phase");
    tap_ok(parses("nan:rank=1:step=5"), "nan at a step");
    tap_ok(sd_fault_parse("kill:rank=2:step=7,nan:rank=1:step=5", f, &n, &err) == 0 && n == 2 &&
               f[0].action == SD_FAULT_KILL && f[0].rank == 2 && f[0].step == 7 &&
               f[1].action == SD_FAULT_NAN && f[1].rank == 1 && f[1].step == 5,
           "two faults, fields parsed");
    tap_ok(refused_with("explode:rank=1:step=2", "unknown action 'explode'"), "unknown action");
    tap_ok(refused_with("kill:rank=x:step=2", "rank must be a non-negative integer"), "bad rank");
    tap_ok(refused_with("kill:rank=-1:step=2", "rank must be"), "negative rank");
    tap_ok(refused_with("kill:step=2", "needs rank=N"), "rank required");
    tap_ok(refused_with("kill:rank=1", "needs step=N or phase=NAME"), "trigger required");
    tap_ok(refused_with("kill:rank=1:phase=lunch", "unknown phase 'lunch'"), "unknown phase");
    tap_ok(refused_with("nan:rank=1:phase=ckpt-write", "nan faults need step=N"), "nan needs a step");
    tap_ok(parses("usr1:rank=0:step=5"), "usr1 at a step");
    tap_ok(refused_with("usr1:rank=0:phase=ckpt-write", "usr1 faults need step=N"), "usr1 needs a step");
    tap_ok(refused_with("usr1:rank=0:step=2:phase=ckpt-write", "only kill and nan faults take a phase"),
           "usr1 takes no phase");
    tap_ok(parses("usr1:rank=1:phase=encode:step=21"), "usr1 in the middle of a shard (preprocessing)");
    tap_ok(refused_with("usr1:rank=1:phase=encode", "usr1 faults at phase encode need step=N"),
           "usr1 at phase encode needs the sample");
    tap_ok(parses("usr1:rank=2:phase=shard-wait") && parses("usr1:rank=2:phase=shard-wait:step=1"),
           "usr1 while waiting for a shard (pipeline trainers), at any wait or at one step's");
    tap_ok(sd_fault_parse("flip:rank=1:phase=ckpt-write:step=4", f, &n, &err) == 0 && n == 1 &&
               f[0].action == SD_FAULT_FLIP && f[0].step == 4,
           "flip at the checkpoint write of one step");
    tap_ok(parses("flip:rank=0:phase=ckpt-write"), "flip at every checkpoint write");
    tap_ok(sd_fault_parse("nan:rank=0:phase=encode:step=3", f, &n, &err) == 0 && n == 1 &&
               f[0].action == SD_FAULT_NAN && f[0].step == 3 && !strcmp(f[0].phase, "encode"),
           "nan at the encoding of one sample");
    tap_ok(refused_with("nan:rank=0:phase=ckpt-write:step=3", "nan faults take no phase but 'encode'"),
           "nan at another phase");
    tap_ok(parses("eio:rank=1:phase=ckpt-load:step=8"), "eio at the load of one checkpoint");
    tap_ok(refused_with("eio:rank=1:phase=ckpt-write", "eio faults need phase=ckpt-load"),
           "eio only at ckpt-load");
    tap_ok(refused_with("flip:rank=0:step=3", "flip faults need phase=ckpt-write"),
           "flip needs the phase");
    tap_ok(refused_with("flip:rank=0:phase=shard-write", "flip faults need phase=ckpt-write"),
           "flip only at ckpt-write");
    tap_ok(sd_fault_parse("kill:rank=1:phase=ckpt-write:step=8", f, &n, &err) == 0 && n == 1 &&
               f[0].step == 8 && !strcmp(f[0].phase, "ckpt-write"),
           "kill at a phase of one step");
    tap_ok(sd_fault_parse("hang:rank=1:step=5", f, &n, &err) == 0 && n == 1 &&
               f[0].action == SD_FAULT_HANG && f[0].step == 5 && !f[0].phase[0],
           "hang at a step");
    tap_ok(parses("hang:rank=0:phase=ckpt-write") && parses("hang:rank=0:phase=ckpt-write:step=8") &&
               parses("hang:rank=1:phase=shard-write") && parses("hang:rank=1:phase=step:step=2"),
           "hang in a checkpoint write (of one step), a shard write, at a step by phase");
    tap_ok(refused_with("hang:rank=0:phase=ckpt-commit", "hang faults take step=N, or phase=step"),
           "hang only at its phases");
    tap_ok(refused_with("hang:rank=0:phase=step", "hang faults at phase step need step=N"),
           "hang at phase step needs the step");
    tap_ok(refused_with("hang:rank=0", "needs step=N or phase=NAME"), "hang needs a trigger");
    tap_ok(refused_with("kill:rank=1:when=3", "unknown key 'when'"), "unknown key");
    tap_ok(refused_with("kill:rank=1:step", "expected key=value"), "key without value");
    tap_ok(refused_with("kill:rank=1:step=3,,", "empty fault"), "empty element");

    setenv("SDTRAIN_FAULT", "kill:rank=2:step=7,kill:rank=0:phase=ckpt-commit", 1);
    tap_ok(sd_fault_init_from_env(&err) == 0, "environment parsed");
    tap_ok(sd_fault_armed(SD_FAULT_KILL, 2, 7, NULL), "armed at rank 2 step 7");
    tap_ok(!sd_fault_armed(SD_FAULT_KILL, 2, 8, NULL), "not at step 8");
    tap_ok(!sd_fault_armed(SD_FAULT_KILL, 1, 7, NULL), "not on rank 1");
    tap_ok(!sd_fault_armed(SD_FAULT_NAN, 2, 7, NULL), "not another action");
    tap_ok(sd_fault_armed(SD_FAULT_KILL, 0, 123, "ckpt-commit"), "armed at the phase, any step");
    tap_ok(!sd_fault_armed(SD_FAULT_KILL, 0, 123, "ckpt-write"), "not at another phase");
    setenv("SDTRAIN_FAULT", "hang:rank=1:step=5,hang:rank=0:phase=ckpt-write:step=8", 1);
    tap_ok(sd_fault_init_from_env(&err) == 0, "hang faults from the environment");
    tap_ok(sd_fault_armed(SD_FAULT_HANG, 1, 5, "step") && !sd_fault_armed(SD_FAULT_HANG, 1, 4, "step") &&
               !sd_fault_armed(SD_FAULT_KILL, 1, 5, "step"),
           "hang armed at rank 1's step 5 only");
    tap_ok(sd_fault_armed(SD_FAULT_HANG, 0, 8, "ckpt-write") &&
               !sd_fault_armed(SD_FAULT_HANG, 0, 4, "ckpt-write") &&
               !sd_fault_armed(SD_FAULT_HANG, 0, 8, "step"),
           "hang armed at the checkpoint write of step 8 only");
    unsetenv("SDTRAIN_FAULT");
    tap_ok(sd_fault_init_from_env(&err) == 0 && !sd_fault_armed(SD_FAULT_KILL, 2, 7, NULL),
           "unset variable disarms");
    return tap_done();
}
