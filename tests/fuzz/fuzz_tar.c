/* libFuzzer harness: the tar scanner (webdataset shards) on arbitrary bytes.
 *
 * The input is written to a memfd and scanned through its /proc name, so open/fstat/pread run
 * as for a file on disk. Invariants of sd_tar_scan (include/sdtrain/tar.h):
 *   - the status is one of the documented codes, and every status but OK and STOPPED comes with
 *     a message that starts with the path;
 *   - headers and data start on 512-byte blocks, each member after the one before it, and its
 *     header before its data;
 *   - `truncated` says exactly whether the data runs past the end of the file, and only the last
 *     member reported can be truncated (the scan then ends DAMAGED);
 *   - name_len is the name's length, the type is never the raw '\0' / '7' / 'S';
 *   - a scan stopped after k members reports the same k members first (the scanner keeps no
 *     state that depends on how far the caller reads).
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh tar [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sdtrain/tar.h"

#define FUZZ_NAME "fuzz_tar"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEEN 64

typedef struct {
    uint64_t header_offset, data_offset, size;
    char type;
    int truncated, sparse;
    uint64_t name_hash;
} seen_member;

typedef struct {
    uint64_t file_size;
    size_t n, stop_after; /* stop_after 0: never stop */
    seen_member m[MAX_SEEN];
} scan_state;

static int memfd = -1;
static char memfd_path[64];

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int on_member(const sd_tar_member *m, void *ctx)
{
    scan_state *st = ctx;
    fuzz_require(m->name != NULL && strlen(m->name) == m->name_len, "name_len is the name's length", NULL);
    fuzz_require(m->type != '\0' && m->type != '7' && m->type != 'S', "raw type flags are reported as '0'",
            NULL);
    fuzz_require(m->header_offset % 512 == 0 && m->data_offset % 512 == 0, "block alignment", m->name);
    fuzz_require(m->header_offset < m->data_offset, "the header comes before the data", m->name);
    fuzz_require(m->truncated == (m->data_offset + m->size > st->file_size),
            "truncated says whether the data runs past the end", m->name);
    if (st->n > 0) {
        const seen_member *p = &st->m[(st->n - 1) % MAX_SEEN];
        fuzz_require(!p->truncated, "only the last member can be truncated", m->name);
        fuzz_require(m->header_offset >= p->data_offset + p->size, "members do not overlap", m->name);
    }
    seen_member *s = &st->m[st->n % MAX_SEEN];
    s->header_offset = m->header_offset;
    s->data_offset = m->data_offset;
    s->size = m->size;
    s->type = m->type;
    s->truncated = m->truncated;
    s->sparse = m->sparse;
    s->name_hash = hash_bytes(m->name, m->name_len);
    st->n++;
    return st->stop_after && st->n == st->stop_after;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static scan_state full, part;
    sd_err err;
    int rc;

    if (memfd < 0)
        memfd = fuzz_memfd("fuzz.tar", memfd_path, sizeof memfd_path);
    fuzz_put_fd(memfd, data, size);

    memset(&full, 0, sizeof full);
    full.file_size = size;
    memset(&err, 0, sizeof err);
    rc = sd_tar_scan(memfd_path, on_member, &full, &err);
    fuzz_require(rc == SD_TAR_OK || rc == SD_TAR_DAMAGED || rc == SD_TAR_COMPRESSED, "status", err.msg);
    if (rc != SD_TAR_OK)
        fuzz_require(strncmp(err.msg, memfd_path, strlen(memfd_path)) == 0, "the message names the file",
                err.msg);
    if (full.n > 0 && full.m[(full.n - 1) % MAX_SEEN].truncated)
        fuzz_require(rc == SD_TAR_DAMAGED, "a truncated member ends the scan as damaged", err.msg);
    if (rc == SD_TAR_COMPRESSED)
        fuzz_require(full.n == 0, "a compressed file reports no member", NULL);

    /* stopped scans: after the first member and after the middle one */
    for (int pass = 0; pass < 2 && full.n > 0 && full.n <= MAX_SEEN; pass++) {
        size_t k = pass == 0 ? 1 : (full.n + 1) / 2;
        memset(&part, 0, sizeof part);
        part.file_size = size;
        part.stop_after = k;
        rc = sd_tar_scan(memfd_path, on_member, &part, &err);
        fuzz_require(part.n == k, "a stopped scan reports up to where it stopped", NULL);
        fuzz_require(memcmp(part.m, full.m, k * sizeof full.m[0]) == 0,
                "a stopped scan reports the same members first", NULL);
        fuzz_require(rc == SD_TAR_STOPPED || (part.m[k - 1].truncated && rc == SD_TAR_DAMAGED),
                "a stopped scan says so", err.msg);
    }
    return 0;
}
