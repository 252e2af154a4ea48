/* libFuzzer harness: the tensors of a checkpoint's state.h5, read by one process the way
 * `sdtool export` (sd_ckpt_read_dataset) and `sdtool inspect --verify` (sd_ckpt_verify) read
 * them; sd_ckpt_load's reads and the write's read-back go through the same read_range. As in
 * fuzz_shardfile.c the input drives a generator (tests/fuzz/fuzz_h5gen.h) that writes a
 * well-formed HDF5 file: the four datasets params, adam_m, adam_v and ema of a small parameter
 * table, each as written by sdtrain or changed (omitted, a group, another length or rank, huge
 * and unallocated, float64, big-endian, a 16-bit float, integers), with a manifest.json that
 * matches it or not (its checksums, the file size, has_ema).
 * Invariants (include/sdtrain/checkpoint.h):
 *   - a refusal names the checkpoint;
 *   - a dataset sd_ckpt_read_dataset accepts has the manifest's checksum, and is the data the
 *     generator wrote when it wrote it as sdtrain does;
 *   - sd_ckpt_verify accepts exactly when the file opens and every listed dataset reads, and
 *     then reports the manifest's and the data's checksums, equal for datasets written as
 *     sdtrain does with a correct manifest entry;
 *   - no HDF5 call on a bad file ends the process.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh ckptstate [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <hdf5.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/checkpoint.h"
#include "sdtrain/models.h"

#define FUZZ_NAME "fuzz_ckptstate"
#include "fuzz_util.h"
#include "fuzz_h5gen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[256], step_dir[320], state[400], manifest[400];

static void cleanup(void)
{
    unlink(state);
    unlink(manifest);
    rmdir(step_dir);
    rmdir(root);
}

/* Two tensors at SD_PARAM_ALIGN offsets: 70 floats with the padding, as sd_unet_params lays
 * out a real table. */
static sd_param params[2];
static sd_param_table table = {params, 2, 2, 70, 11};

static void make_table(void)
{
    snprintf(params[0].name, sizeof params[0].name, "conv_in.weight");
    params[0].ndim = 2, params[0].shape[0] = 3, params[0].shape[1] = 2, params[0].numel = 6;
    params[0].offset = 0;
    snprintf(params[1].name, sizeof params[1].name, "conv_in.bias");
    params[1].ndim = 1, params[1].shape[0] = 5, params[1].numel = 5;
    params[1].offset = SD_PARAM_ALIGN;
}

static const char *const names[4] = {"params", "adam_m", "adam_v", "ema"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size, 0};
    const size_t n = table.total_floats;
    float written[4][70];
    int clean[4] = {0}, right_sum[4] = {0};
    uint64_t sums[4] = {0};
    sd_ckpt_dataset_check checks[4];
    sd_ckpt_info info;
    sd_err err;
    struct stat st;
    hid_t f;
    int has_ema, n_checks = 0;
    unsigned flags;

    if (!root[0]) {
        fuzz_scratch_dir(root, sizeof root, "fuzz-cs");
        snprintf(step_dir, sizeof step_dir, "%s/step-00000008", root);
        snprintf(state, sizeof state, "%s/%s", step_dir, SD_CKPT_STATE_FILE);
        snprintf(manifest, sizeof manifest, "%s/%s", step_dir, SD_CKPT_MANIFEST);
        fuzz_require(mkdir(step_dir, 0755) == 0, "mkdir", step_dir);
        make_table();
        atexit(cleanup);
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* the generator's refused calls are expected */
    }

    /* 1. state.h5 */
    flags = byte(&in);
    has_ema = flags & 1;
    f = H5Fcreate(state, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    fuzz_require(f >= 0, "create the scratch HDF5 file", state);
    for (int ds = 0; ds < 4; ds++) {
        const hsize_t dims[1] = {n};
        if (ds == 3 && !has_ema && !(flags & 2))
            continue;
        clean[ds] = put_dataset(f, names[ds], D_F, 4, 0, 1, dims, &in, written[ds]);
        if (clean[ds]) {
            sums[ds] = sd_ckpt_checksum(written[ds], 0, n);
            right_sum[ds] = (byte(&in) & 7) != 0;
            if (!right_sum[ds])
                sums[ds] ^= 1;
        }
    }
    H5Fclose(f);
    fuzz_require(stat(state, &st) == 0, "stat the scratch file", state);

    /* 2. manifest.json, matching the file or not */
    {
        char text[4096], sum_text[4][40];
        for (int ds = 0; ds < 4; ds++)
            snprintf(sum_text[ds], sizeof sum_text[ds], "\"%s\": \"%016llx\"", names[ds],
                     (unsigned long long)sums[ds]);
        snprintf(text, sizeof text,
                 "{\"format\": \"%s\", \"version\": %d, \"sdtrain_version\": \"fuzz\", "
                 "\"git_revision\": \"fuzz\", \"created\": \"2026-11-27T00:00:00Z\", \"step\": 8, "
                 "\"opt_step\": 8, \"skipped\": 0, \"epoch\": 2, \"steps_per_epoch\": 4, "
                 "\"global_batch\": 8, \"batch_size_per_rank\": 4, \"seed\": 11, \"n_ranks\": 2, "
                 "\"sharding\": \"none\", \"has_ema\": %s, \"file\": \"state.h5\", \"bytes\": %lld, "
                 "\"n_floats\": %zu, \"checksum_algorithm\": \"%s\", \"checksums\": {%s, %s, %s%s%s}, "
                 "\"parameters\": [{\"name\": \"conv_in.weight\", \"offset\": 0, \"shape\": [3, 2]}, "
                 "{\"name\": \"conv_in.bias\", \"offset\": %d, \"shape\": [5]}], \"config\": \"\"}",
                 SD_CKPT_FORMAT, SD_CKPT_FORMAT_VERSION, has_ema ? "true" : "false",
                 (long long)st.st_size + (flags & 4 ? 1 : 0), n, SD_CKPT_CHECKSUM_ALGORITHM,
                 sum_text[0], sum_text[1], sum_text[2], has_ema ? ", " : "",
                 has_ema ? sum_text[3] : "", SD_PARAM_ALIGN);
        fuzz_put_file(manifest, text, strlen(text));
    }
    const int size_ok = !(flags & 4);

    /* 3. sdtool export's read of each dataset */
    for (int ds = 0; ds < 4; ds++) {
        float dst[70];
        memset(&err, 0, sizeof err);
        if (sd_ckpt_read_dataset(step_dir, &table, names[ds], dst, &info, &err) != 0) {
            if (getenv("SD_FUZZ_VERBOSE"))
                fprintf(stderr, "%s refused: %s\n", names[ds], err.msg);
            fuzz_require(strstr(err.msg, step_dir) != NULL, "a refusal names the checkpoint", err.msg);
            fuzz_require(!(size_ok && clean[ds] && right_sum[ds] && (ds < 3 || has_ema)),
                         "a dataset written as sdtrain writes it is read", err.msg);
            continue;
        }
        sd_ckpt_info_free(&info);
        if (getenv("SD_FUZZ_VERBOSE"))
            fprintf(stderr, "%s read\n", names[ds]);
        fuzz_require(ds < 3 || has_ema, "no EMA is read from a checkpoint without one", names[ds]);
        fuzz_require(sd_ckpt_checksum(dst, 0, n) == sums[ds], "what is read has the manifest's checksum",
                     names[ds]);
        if (clean[ds])
            fuzz_require(memcmp(dst, written[ds], sizeof dst) == 0, "what is read is what was written",
                         names[ds]);
    }

    /* 4. sdtool inspect --verify */
    memset(&err, 0, sizeof err);
    if (sd_ckpt_verify(step_dir, &info, checks, &n_checks, &err) != 0) {
        if (getenv("SD_FUZZ_VERBOSE"))
            fprintf(stderr, "verify refused: %s\n", err.msg);
        fuzz_require(strstr(err.msg, step_dir) != NULL, "a refusal names the checkpoint", err.msg);
        int all_clean = size_ok;
        for (int ds = 0; ds < 3 + has_ema; ds++)
            all_clean &= clean[ds];
        fuzz_require(!all_clean, "a checkpoint written as sdtrain writes it verifies", err.msg);
        return 0;
    }
    sd_ckpt_info_free(&info);
    if (getenv("SD_FUZZ_VERBOSE"))
        fprintf(stderr, "verify accepted\n");
    fuzz_require(n_checks == 3 + has_ema, "one check per listed dataset", NULL);
    for (int k = 0; k < n_checks; k++) {
        fuzz_require(checks[k].n == n && checks[k].expected == sums[k], "the manifest's checksum",
                     checks[k].name);
        if (clean[k] && right_sum[k])
            fuzz_require(checks[k].actual == checks[k].expected, "a correct entry verifies",
                         checks[k].name);
    }
    return 0;
}
