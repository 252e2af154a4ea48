/* libFuzzer harness: what a resumed job reads of a checkpoint before the tensors, from arbitrary
 * bytes: the step directory's manifest.json (sd_ckpt_peek, the checks sd_ckpt_load makes first)
 * and the root's `latest` pointer (sd_ckpt_read_latest).
 * Invariants (include/sdtrain/checkpoint.h):
 *   - a refusal names the file;
 *   - an accepted manifest has the numbers any writer's have: 0 <= opt_step, skipped <= step,
 *     positive batch sizes, rank count and epoch length, a seed of the namelist's range, has_ema
 *     0 or 1, and a configuration text;
 *   - an accepted `latest` names "step-" and digits only, and fits the buffer.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh checkpoint [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/checkpoint.h"

#define FUZZ_NAME "fuzz_checkpoint"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[256], step_dir[320], manifest[400], latest[320];

static void cleanup(void)
{
    unlink(manifest);
    rmdir(step_dir);
    unlink(latest);
    rmdir(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_ckpt_info info;
    sd_err err;
    char name[64];

    if (!root[0]) {
        fuzz_scratch_dir(root, sizeof root, "fuzz-ck");
        snprintf(step_dir, sizeof step_dir, "%s/step-00000008", root);
        snprintf(manifest, sizeof manifest, "%s/%s", step_dir, SD_CKPT_MANIFEST);
        snprintf(latest, sizeof latest, "%s/%s", root, SD_CKPT_LATEST);
        fuzz_require(mkdir(step_dir, 0755) == 0, "mkdir", step_dir);
        atexit(cleanup);
    }

    /* 1. the manifest */
    fuzz_put_file(manifest, data, size);
    memset(&err, 0, sizeof err);
    if (sd_ckpt_peek(step_dir, &info, &err) == 0) {
        const sd_ckpt_scalars *s = &info.s;
        fuzz_require(s->step >= 0 && s->opt_step >= 0 && s->opt_step <= s->step && s->skipped >= 0 &&
                    s->skipped <= s->step,
                "step counters", NULL);
        fuzz_require(s->steps_per_epoch >= 1 && s->global_batch >= 1 && s->batch_per_rank >= 1 &&
                    s->n_ranks >= 1,
                "batch sizes and ranks", NULL);
        fuzz_require(s->seed >= 0 && s->seed <= 4294967295LL && (s->has_ema == 0 || s->has_ema == 1),
                "seed and has_ema", NULL);
        fuzz_require(info.config_text != NULL, "a configuration text", NULL);
        fuzz_require(memchr(s->sharding, 0, sizeof s->sharding) != NULL, "sharding is a string", NULL);
        sd_ckpt_info_free(&info);
    } else {
        fuzz_require(strstr(err.msg, step_dir) != NULL, "a refused manifest is named", err.msg);
    }

    /* 2. the latest pointer */
    fuzz_put_file(latest, data, size);
    memset(&err, 0, sizeof err);
    if (sd_ckpt_read_latest(root, name, sizeof name, &err) == 0) {
        size_t n = strlen(name);
        fuzz_require(n < sizeof name, "the name fits", NULL);
        if (n > 0)
            fuzz_require(strncmp(name, "step-", 5) == 0 && n > 5 && strspn(name + 5, "0123456789") == n - 5,
                    "latest names step-NNNNNNNN", name);
    } else {
        fuzz_require(strstr(err.msg, latest) != NULL, "a refused latest is named", err.msg);
    }
    return 0;
}
