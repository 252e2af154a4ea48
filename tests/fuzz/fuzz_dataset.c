/* libFuzzer harness: the dataset index (include/sdtrain/dataset.h) from arbitrary bytes.
 *
 * Each input is tried three ways:
 *   1. as the bytes of sd_dataset_pack (what rank 0 broadcasts): sd_dataset_unpack must refuse it
 *      with a message, or give a dataset whose every sample can be described and looked up;
 *      sd_dataset_view (the ranks' view of the node's one copy, no copy) of the same bytes in
 *      an aligned buffer must decide the same and give the same keys;
 *   2. as a TSV manifest (path<TAB>caption lines) in a scratch folder: the samples it indexes are
 *      read (their images mostly do not exist: skipped with a reason and a message), and the
 *      index survives sd_dataset_pack / sd_dataset_unpack with the same keys and captions;
 *   3. as the one .tar of a webdataset folder: every sample whose image member is whole reads
 *      back exactly the bytes at the offset and size the index recorded.
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh dataset [SECONDS]. */
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

#include "sdtrain/dataset.h"
#include "sdtrain/utf8.h"

#define FUZZ_NAME "fuzz_dataset"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_READ 32 /* samples read per input */

static char work[256], tsv_path[320], wds_dir[320], tar_path[384];

static void cleanup(void)
{
    unlink(tar_path);
    rmdir(wds_dir);
    unlink(tsv_path);
    rmdir(work);
}

static void setup(void)
{
    fuzz_scratch_dir(work, sizeof work, "fuzz-ds");
    snprintf(tsv_path, sizeof tsv_path, "%s/manifest.tsv", work);
    snprintf(wds_dir, sizeof wds_dir, "%s/wds", work);
    snprintf(tar_path, sizeof tar_path, "%s/shard-00000.tar", wds_dir);
    fuzz_require(mkdir(wds_dir, 0755) == 0, "mkdir", wds_dir);
    atexit(cleanup);
}

static void describe_all(const sd_dataset *ds)
{
    char buf[1024];
    for (int64_t i = 0; i < sd_dataset_count(ds); i++) {
        sd_sample_info info;
        const char *key = sd_dataset_key(ds, i);
        fuzz_require(key != NULL, "every sample has a key", NULL);
        sd_dataset_info(ds, i, &info);
        fuzz_require(info.key == key, "info and key agree", key);
        /* a shard stores keys as UTF-8: a name that is not has its repaired copy */
        fuzz_require(sd_utf8_is_valid(key, strlen(key)), "the key is UTF-8", key);
        sd_dataset_describe(ds, i, buf, sizeof buf);
    }
}

static void pack_round_trip(const sd_dataset *ds)
{
    void *blob = NULL;
    size_t n = 0;
    sd_dataset back;
    sd_err err;
    fuzz_require(sd_dataset_pack(ds, &blob, &n) == 0, "pack", NULL);
    memset(&back, 0, sizeof back);
    fuzz_require(sd_dataset_unpack(blob, n, &back, &err) == 0, "a packed index unpacks", err.msg);
    fuzz_require(sd_dataset_count(&back) == sd_dataset_count(ds) && back.format == ds->format,
            "the unpacked index has the same samples", NULL);
    for (int64_t i = 0; i < sd_dataset_count(ds); i++) {
        sd_sample_info a, b;
        fuzz_require(strcmp(sd_dataset_key(ds, i), sd_dataset_key(&back, i)) == 0, "same keys",
                sd_dataset_key(ds, i));
        sd_dataset_info(ds, i, &a);
        sd_dataset_info(&back, i, &b);
        fuzz_require(a.has_caption == b.has_caption && a.caption_size == b.caption_size &&
                    a.image_offset == b.image_offset && a.image_size == b.image_size &&
                    a.image_kind == b.image_kind,
                "same sample records", a.key);
    }
    sd_dataset_close(&back);
    fuzz_require(sd_dataset_view(blob, n, &back, &err) == 0 && back.viewed &&
                     sd_dataset_count(&back) == sd_dataset_count(ds),
                 "a packed index is viewed in place", err.msg);
    for (int64_t i = 0; i < sd_dataset_count(ds); i++)
        fuzz_require(strcmp(sd_dataset_key(ds, i), sd_dataset_key(&back, i)) == 0, "same keys in the view",
                     sd_dataset_key(ds, i));
    sd_dataset_close(&back);
    free(blob);
}

static void read_samples(const sd_dataset *ds, const uint8_t *tar, size_t tar_size)
{
    sd_sample s;
    sd_err err;
    memset(&s, 0, sizeof s);
    for (int64_t i = 0; i < sd_dataset_count(ds) && i < MAX_READ; i++) {
        sd_sample_info info;
        int rc;
        memset(&err, 0, sizeof err);
        rc = sd_dataset_read(ds, i, &s, &err);
        fuzz_require(s.reason >= 0 && s.reason < SD_SAMPLE_N_REASONS, "a known reason", NULL);
        fuzz_require((rc == 0) == (s.keep != 0), "kept samples return 0", NULL);
        fuzz_require(rc == 0 || err.msg[0] != 0, "a skipped sample says why", NULL);
        if (rc != 0)
            continue;
        fuzz_require(s.caption != NULL && strlen(s.caption) <= s.caption_len, "the caption is there", s.key);
        sd_dataset_info(ds, i, &info);
        if (tar && s.image_size > 0) {
            fuzz_require(!info.image_truncated && info.image_offset + info.image_size <= tar_size &&
                        s.image_size == info.image_size &&
                        memcmp(s.image, tar + info.image_offset, s.image_size) == 0,
                    "a webdataset image is the member's bytes at the recorded offset", s.key);
        }
        sd_dataset_read_json(ds, i, &s, &err);
    }
    sd_sample_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sd_dataset ds;
    sd_err err;

    if (!work[0])
        setup();

    /* 1. as packed index bytes, unpacked and viewed */
    memset(&ds, 0, sizeof ds);
    memset(&err, 0, sizeof err);
    {
        uint64_t *aligned = malloc((size / 8 + 1) * 8);
        sd_dataset view;
        sd_err verr;
        int unpacked = sd_dataset_unpack(data, size, &ds, &err) == 0, viewed;
        fuzz_require(aligned != NULL, "malloc", NULL);
        if (size)
            memcpy(aligned, data, size);
        memset(&verr, 0, sizeof verr);
        viewed = sd_dataset_view(aligned, size, &view, &verr) == 0;
        fuzz_require(viewed == unpacked, "a view takes what unpack takes", verr.msg);
        if (unpacked) {
            describe_all(&ds);
            describe_all(&view);
            for (int64_t i = 0; i < sd_dataset_count(&ds); i++)
                fuzz_require(strcmp(sd_dataset_key(&ds, i), sd_dataset_key(&view, i)) == 0,
                             "the view has the copy's keys", sd_dataset_key(&ds, i));
            sd_dataset_close(&view);
            fuzz_require(size == 0 || memcmp(aligned, data, size) == 0, "a view leaves its image alone", NULL);
            sd_dataset_close(&ds);
        } else {
            fuzz_require(err.msg[0] != 0 && verr.msg[0] != 0, "a refused index says why", NULL);
        }
        free(aligned);
    }

    /* 2. as a TSV manifest */
    fuzz_put_file(tsv_path, data, size);
    memset(&ds, 0, sizeof ds);
    if (sd_dataset_open(tsv_path, "tsv", &ds, &err) == 0) {
        describe_all(&ds);
        read_samples(&ds, NULL, 0);
        pack_round_trip(&ds);
    } else {
        fuzz_require(strstr(err.msg, tsv_path) != NULL, "a refused manifest is named", err.msg);
    }
    sd_dataset_close(&ds);

    /* 3. as the shard of a webdataset folder */
    fuzz_put_file(tar_path, data, size);
    memset(&ds, 0, sizeof ds);
    if (sd_dataset_open(wds_dir, "webdataset", &ds, &err) == 0) {
        describe_all(&ds);
        read_samples(&ds, data, size);
        pack_round_trip(&ds);
    } else {
        fuzz_require(err.msg[0] != 0, "a refused webdataset says why", NULL);
    }
    sd_dataset_close(&ds);
    return 0;
}
