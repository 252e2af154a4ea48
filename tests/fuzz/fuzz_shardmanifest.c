/* libFuzzer harness: the latent shard directory's manifest.json (sd_shard_manifest_read) from
 * arbitrary bytes. Trainers and resumed preprocessing jobs read it first, so a damaged one must
 * be refused with a message naming it, never crash or be half-believed.
 * Invariants (include/sdtrain/shards.h):
 *   - a refusal names the manifest and leaves nothing allocated;
 *   - an accepted manifest has its entries sorted by index without repeats, each with the
 *     canonical file name of its index (a manifest cannot point outside its directory), a
 *     sample count of at least 0 (0: an empty shard, every sample of its range skipped), a
 *     resolution of at least 8, and total_samples their sum;
 *   - the json-c reader alone gives the same verdict and entries, and when the scanner of the
 *     writer's layout accepts the bytes it read the same entries (sd_shard_manifest_parse reads
 *     with the scanner first).
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
    const int rc = sd_shard_manifest_read(work, &m, &err);
    {
        /* the two readers agree (an empty file is refused before either reads it) */
        sd_shard_manifest j, c;
        sd_err ej;
        char *text = malloc(size + 1);
        memcpy(text, data, size);
        text[size] = '\0';
        memset(&ej, 0, sizeof ej);
        const int rj = size ? sd_shard_manifest_parse_json(manifest, text, size, &j, &ej) : -1;
        fuzz_require(rj == rc, "the json-c reader's verdict", ej.msg);
        fuzz_require(rc == 0 || size == 0 || strcmp(ej.msg, err.msg) == 0, "the json-c reader's message",
                     ej.msg);
        if (rj == 0) {
            fuzz_require(j.n == m.n && j.total_samples == m.total_samples &&
                             (m.n == 0 || memcmp(j.entries, m.entries, (size_t)m.n * sizeof *m.entries) == 0),
                         "the json-c reader's entries", NULL);
            sd_shard_manifest_free(&j);
        }
        if (sd_shard_manifest_scan(text, size, &c)) {
            fuzz_require(rc == 0 && c.n == m.n && c.total_samples == m.total_samples &&
                             (m.n == 0 || memcmp(c.entries, m.entries, (size_t)m.n * sizeof *m.entries) == 0),
                         "the scanner's entries are the json-c reader's", NULL);
            sd_shard_manifest_free(&c);
        }
        free(text);
    }
    if (rc != 0) {
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
