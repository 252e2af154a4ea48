/* Private layout of the dataset index, shared by the index builder and the reader. */
#ifndef SDTRAIN_DATASET_INTERNAL_H
#define SDTRAIN_DATASET_INTERNAL_H

#include <stdint.h>

#include "sdtrain/dataset.h"

/* One sample in 56 bytes; every string is an offset into ds->pool. Sizes are 32-bit because
 * no image or caption of 4 GiB is worth reading (bigger tar members are flagged unreadable). */
struct sd_dataset_entry {
    uint64_t key;          /* pool offset of the NUL-terminated key */
    uint64_t image_off;    /* webdataset: data offset in the tar */
    uint64_t caption_off;  /* webdataset: data offset in the tar; tsv: pool offset of the text */
    uint64_t json_off;     /* webdataset: data offset in the tar */
    uint32_t image_size, caption_size, json_size; /* webdataset; tsv: caption_size */
    uint32_t shard;        /* webdataset: index into ds->shards */
    uint16_t image_sfx, caption_sfx, json_sfx;    /* ds->suffixes index; SFX_NONE = absent */
    uint8_t image_kind;  /* sd_image_ext */
    uint8_t flags;         /* ENTRY_* */
};

#define SFX_NONE 0   /* suffix index 0: no such file or member */
#define SFX_EMPTY 1  /* suffix index 1: "" (a tsv path without a known image extension) */

enum {
    ENTRY_CAPTION = 1 << 0,       /* a caption file/member/manifest field exists */
    ENTRY_JSON = 1 << 1,
    ENTRY_IMAGE_TRUNC = 1 << 2,   /* webdataset: member data runs past the end of the tar */
    ENTRY_CAPTION_TRUNC = 1 << 3,
    ENTRY_JSON_TRUNC = 1 << 4,
    ENTRY_IMAGE_BAD = 1 << 5,     /* webdataset: sparse or >= 4 GiB: cannot be read by offset */
    ENTRY_CAPTION_BAD = 1 << 6,
    ENTRY_JSON_BAD = 1 << 7
};

/* Appends s[0..n) plus a NUL to the pool; returns its offset. */
uint64_t sd_dataset_pool_add_(sd_dataset *ds, const char *s, size_t n);
/* Appends key s[0..n) (no NUL inside; not in the pool) as found, which is what file and member
 * access use, and when it is not valid UTF-8 a repaired copy right after it (each ill-formed
 * subsequence replaced by U+FFFD, as for captions): the key callers see (sd_dataset_key_). A
 * shard stores keys as UTF-8 strings, so a file named in Latin-1 would otherwise stop the run.
 * Returns the offset of the key as found. */
uint64_t sd_dataset_key_add_(sd_dataset *ds, const char *s, size_t n);
/* The key at pool offset `off` as callers see it: valid UTF-8 (see sd_dataset_key_add_). */
const char *sd_dataset_key_(const sd_dataset *ds, uint64_t off);
/* Index of suffix s[0..n) in ds->suffixes, added when new. */
uint16_t sd_dataset_suffix_id_(sd_dataset *ds, const char *s, size_t n);
/* Records an indexing problem for the caller (first SD_DATASET_MAX_NOTES kept). */
void sd_dataset_note_(sd_dataset *ds, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A fresh identity for a dataset being opened or unpacked. */
uint64_t sd_dataset_new_id_(void);

static inline const char *sd_dataset_str_(const sd_dataset *ds, uint64_t off)
{
    return ds->pool + off;
}

static inline const char *sd_dataset_suffix_(const sd_dataset *ds, uint16_t id)
{
    return id == SFX_NONE ? NULL : ds->pool + ds->suffixes[id];
}

#endif
