/* libFuzzer harness: the latent shard directory's manifest.json (sd_shard_manifest_read) from
 * arbitrary bytes. Trainers and resumed preprocessing jobs read it first, so a damaged one must
 * be refused with a message naming it, never crash or be half-believed.
 * Invariants (include/sdtrain/shards.h):
 *   - a refusal names the manifest and leaves nothing allocated;
 *   - an accepted manifest has its entries sorted by index without repeats, each with the
 *     canonical file name of its index (a manifest cannot point outside its directory), a
 *     sample count of at least 0 (0: an empty shard, every sample of its range skipped), a
 *     resolution of at least 8, and total_samples their sum.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh shardmanifest [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/shards.h"

#define FUZZ_NAME "fuzz_shardmanifest"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char work[256], manifest[320];

static void cleanup(void)
{
    unlink(manifest);
    rmdir(work);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_shard_manifest m;
    sd_err err;

    if (!work[0]) {
        fuzz_scratch_dir(work, sizeof work, "fuzz-sm");
        snprintf(manifest, sizeof manifest, "%s/%s", work, SD_SHARD_MANIFEST);
        atexit(cleanup);
    }
    fuzz_put_file(manifest, data, size);

    memset(&err, 0, sizeof err);
    if (sd_shard_manifest_read(work, &m, &err) != 0) {
        fuzz_require(strstr(err.msg, manifest) != NULL, "a refusal names the manifest", err.msg);
        fuzz_require(m.n == 0 && m.entries == NULL, "a refusal leaves nothing allocated", NULL);
        return 0;
    }
    {
        int64_t total = 0;
        for (int64_t k = 0; k < m.n; k++) {
            const sd_shard_entry *e = &m.entries[k];
            char want[64];
            sd_shard_file_name(e->index, want, sizeof want);
            fuzz_require(strcmp(e->file, want) == 0, "the canonical file name of the index", e->file);
            fuzz_require(k == 0 || e->index > m.entries[k - 1].index, "sorted by index, no repeats", e->file);
            fuzz_require(e->samples >= 0 && e->resolution >= 8 && e->bytes >= 0, "entry fields", e->file);
            fuzz_require(!__builtin_add_overflow(total, e->samples, &total), "sum without overflow", e->file);
        }
        fuzz_require(total == m.total_samples, "total_samples is the sum", NULL);
    }
    sd_shard_manifest_free(&m);
    return 0;
}
