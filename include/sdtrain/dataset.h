/* Dataset readers: a sorted, deterministic index of image+caption samples and reads by index. */
#ifndef SDTRAIN_DATASET_H
#define SDTRAIN_DATASET_H

/*
 * Three input formats (doc/datasets.md has the full rules):
 *   files       an img2dataset folder: 00000/000000012.jpg + 000000012.txt (+ .json), any depth;
 *               samples sorted by key (byte-wise), key = relative path without the extension.
 *   webdataset  .tar shards (a directory of them, one .tar, or a glob / {a..b} pattern), sorted
 *               by path; members grouped by key (path up to the first dot of the basename),
 *               samples in tar order; each member's data offset is recorded for pread.
 *   tsv         a manifest "path<TAB>caption" per line, paths relative to the manifest's
 *               directory; samples in manifest order.
 * The index holds every sample that has an image, good or bad; problems (unsupported format,
 * missing caption, truncated member, invalid UTF-8...) are found and classified by
 * sd_dataset_read, so every rank counts the same reasons for the same samples whatever the
 * division of work. Strings live in one pool and each sample is one 56-byte record.
 *
 * Threads: a dataset is read-only after sd_dataset_open/truncate; reads from several threads
 * are safe when each thread uses its own sd_sample. Nothing writes into the records or the pool
 * after indexing, so processes can share one packed image of them (sd_dataset_view).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sd_dataset_format {
    SD_DATASET_FILES = 1,
    SD_DATASET_WEBDATASET = 2,
    SD_DATASET_TSV = 3
} sd_dataset_format;

/* Image format as the file name says it; decoders still check the bytes. */
typedef enum sd_image_ext {
    SD_IMAGE_EXT_UNKNOWN = 0,     /* tsv path without a known extension: read, the decoder decides */
    SD_IMAGE_EXT_JPEG = 1,        /* .jpg .jpeg */
    SD_IMAGE_EXT_PNG = 2,         /* .png */
    SD_IMAGE_EXT_UNSUPPORTED = 3  /* .webp .gif .bmp .tif .tiff .avif .heic .heif .jxl .jp2 ... */
} sd_image_ext;

/* The longest caption a sample may have, in bytes (a file, tar member or manifest field):
 * CLIP reads 77 tokens, a few hundred bytes; what is longer is a mislabelled file, and it would
 * widen every caption of its shard (a fixed-width string dataset) to its size. */
#define SD_CAPTION_MAX_BYTES 65536

/* What became of one sample. Each read sample counts under exactly one reason; the first four
 * keep the sample, the others skip it. Names (sd_sample_reason_name) are stable: they appear in
 * the end-of-run summary and in metrics. */
typedef enum sd_sample_reason {
    SD_SAMPLE_OK = 0,               /* "ok" */
    SD_SAMPLE_EMPTY_CAPTION,        /* "empty_caption": kept; caption is only whitespace */
    SD_SAMPLE_CAPTION_REPAIRED,     /* "caption_repaired": kept; bad UTF-8 replaced by U+FFFD */
    SD_SAMPLE_MISSING_CAPTION_KEPT, /* "missing_caption_kept": kept with "" (policy 'empty') */
    SD_SAMPLE_UNREADABLE,           /* "unreadable": open/read failed, not a regular file,
                                       sparse or > 4 GiB tar member */
    SD_SAMPLE_MISSING_CAPTION,      /* "missing_caption": no .txt (policy 'skip') */
    SD_SAMPLE_UNSUPPORTED_IMAGE,    /* "unsupported_image": e.g. .webp; never read */
    SD_SAMPLE_TRUNCATED,            /* "truncated": tar member cut short by the end of file */
    SD_SAMPLE_EMPTY_IMAGE,          /* "empty_image": 0-byte image */
    SD_SAMPLE_INVALID_UTF8,         /* "invalid_utf8": caption not UTF-8 (policy 'reject') */
    SD_SAMPLE_CAPTION_TOO_LONG,     /* "caption_too_long": more than SD_CAPTION_MAX_BYTES; never
                                       read (not a caption: CLIP reads 77 tokens of it) */
    SD_SAMPLE_N_REASONS
} sd_sample_reason;

/* What to do with a caption that is not valid UTF-8. */
typedef enum sd_utf8_policy {
    SD_UTF8_REPLACE = 0, /* default: like Python's bytes.decode('utf-8', errors='replace') */
    SD_UTF8_REJECT = 1   /* skip the sample (SD_SAMPLE_INVALID_UTF8) */
} sd_utf8_policy;

/* What to do with an image that has no caption. */
typedef enum sd_missing_caption_policy {
    SD_MISSING_CAPTION_SKIP = 0, /* default: skip (SD_SAMPLE_MISSING_CAPTION) */
    SD_MISSING_CAPTION_EMPTY = 1 /* keep with caption "" (SD_SAMPLE_MISSING_CAPTION_KEPT) */
} sd_missing_caption_policy;

/* Things found while indexing that are not samples (see doc/datasets.md). */
typedef struct sd_dataset_stats {
    int64_t n_indexed;         /* samples in the index before sd_dataset_truncate */
    int64_t n_shards;          /* webdataset: tar files scanned */
    int64_t n_damaged_shards;  /* tar files unreadable, not tar, or ending in a bad/truncated header */
    int64_t n_truncated;       /* tar members cut short by the end of their file */
    int64_t n_orphan_captions; /* captions whose key has no image */
    int64_t n_duplicates;      /* a second image, caption or json for one key (the first is used) */
    int64_t n_ignored;         /* other files/members: unknown extension, no extension, hidden,
                                  json without image, links and devices in tars */
    int64_t n_unreadable_dirs; /* files: subdirectories that could not be listed */
    int64_t n_bad_lines;       /* tsv: lines with an empty path */
} sd_dataset_stats;

#define SD_DATASET_MAX_NOTES 8
#define SD_DATASET_NOTE_MAX 512

struct sd_dataset_entry; /* one sample's record, private to dataset.c */

typedef struct sd_dataset {
    sd_dataset_format format;
    char *root;                       /* files: the folder; tsv: the manifest's folder; else "" */
    char *input;                      /* data.input as given */
    struct sd_dataset_entry *entries;
    int64_t n_entries;                /* indexed samples */
    int64_t count;                    /* samples in use (after sd_dataset_truncate) */
    int64_t entries_cap;
    char *pool;                       /* every string: keys, suffixes, tsv captions, shard paths */
    size_t pool_size, pool_cap;
    uint64_t *shards;                 /* webdataset: pool offsets of the tar paths, sorted */
    int64_t n_shards;
    uint64_t *suffixes;               /* pool offsets of the distinct file suffixes (".jpg"...);
                                         a sample refers to them by 16-bit number */
    int n_suffixes;
    uint64_t id;                      /* unique per open/unpack: tells a reader's cached shard
                                         descriptor apart from one of an earlier dataset */
    bool viewed;                      /* entries, pool, shards and suffixes lie in the image of
                                         sd_dataset_view (not freed by sd_dataset_close) */
    /* Policies applied by sd_dataset_read; set them after sd_dataset_open. */
    sd_utf8_policy utf8_policy;
    sd_missing_caption_policy missing_caption;
    sd_dataset_stats stats;
    /* The first problems met while indexing (damaged shards, unreadable folders, bad lines), each
     * naming the file, for the caller to log; n_notes_total counts all of them. */
    char notes[SD_DATASET_MAX_NOTES][SD_DATASET_NOTE_MAX];
    int n_notes;
    int64_t n_notes_total;
} sd_dataset;

/* Builds the index of `input` in `format` ("files", "webdataset", "tsv" or "auto"; NULL or ""
 * = "auto"). Fails (returns -1, *ds left empty and safe to close) when the input does not exist,
 * its format cannot be told, a shard is compressed, or no sample is found at all; damage inside
 * the data (bad shards, unreadable folders, bad lines) is counted in ds->stats and described in
 * ds->notes instead. "auto": a directory holding *.tar files -> webdataset, another directory ->
 * files, a .tar (or .tar.gz, to be rejected clearly) -> webdataset, a .tsv or .txt file -> tsv,
 * a name with * ? [ or { that does not exist as such -> webdataset pattern. */
int sd_dataset_open(const char *input, const char *format, sd_dataset *ds, sd_err *err);

/* Releases everything; safe on a zeroed or already closed dataset. */
void sd_dataset_close(sd_dataset *ds);

/* Keeps only the first max_samples samples of the index (0 = all; more than there are = all).
 * data.max_samples counts input samples, good or bad. */
void sd_dataset_truncate(sd_dataset *ds, int64_t max_samples);

int64_t sd_dataset_count(const sd_dataset *ds);
/* "files" | "webdataset" | "tsv". */
const char *sd_dataset_format_name(sd_dataset_format f);
/* The key of sample i (0 <= i < count): files: relative path without extension
 * ("00000/000000012"); webdataset: member path up to the first dot of its basename (webdataset's
 * __key__; unique within a shard, not across shards); tsv: the manifest path without its
 * extension. Always valid UTF-8 (a shard stores it as such): a name that is not (a Latin-1 file
 * name) has each ill-formed subsequence replaced by U+FFFD, as Python's
 * decode('utf-8', 'replace'); the files are still opened by their bytes. The same string is
 * sd_sample.key and sd_sample_info.key. Valid until sd_dataset_close. */
const char *sd_dataset_key(const sd_dataset *ds, int64_t i);

/* Where sample i's image is, for messages: "<root>/<key>.jpg" or "<shard.tar>:<member>".
 * Returns the length snprintf would write. */
int sd_dataset_describe(const sd_dataset *ds, int64_t i, char *buf, size_t size);

/* Everything the index knows about one sample (for tests, inspection tools and messages). */
typedef struct sd_sample_info {
    const char *key;
    const char *shard;          /* webdataset: the tar path; else NULL */
    const char *image_suffix;   /* ".jpg" as found (case kept); "" for a tsv path without one */
    const char *caption_suffix; /* ".txt" as found; NULL when there is no caption file or member,
                                   and always for tsv (the caption is in the manifest) */
    const char *json_suffix;    /* ".json" or NULL */
    sd_image_ext image_kind;
    bool has_caption, has_json;
    bool image_truncated, caption_truncated, json_truncated; /* webdataset */
    bool image_unreadable;      /* webdataset: sparse or > 4 GiB member */
    uint64_t image_offset, caption_offset, json_offset; /* webdataset: data offsets in the tar */
    uint64_t image_size, caption_size, json_size;       /* webdataset: member sizes;
                                                           tsv: caption_size = caption bytes */
} sd_sample_info;
void sd_dataset_info(const sd_dataset *ds, int64_t i, sd_sample_info *info);

/* One read sample plus reusable buffers and the open-shard cache of one reader. Zero it before
 * the first read, pass it to many reads, then sd_sample_free. Pointers stay valid until the next
 * read with the same sd_sample. */
typedef struct sd_sample {
    int64_t index;
    const char *key;              /* points into the dataset: sd_dataset_key */
    sd_sample_reason reason;
    bool keep;                    /* false: skip the sample and count `reason` */
    sd_image_ext image_kind;
    unsigned char *image;         /* the encoded image file's bytes */
    size_t image_size;
    char *caption;                /* valid UTF-8 (after the policy), NUL-terminated; may contain
                                     U+0000, so use caption_len */
    size_t caption_len;
    bool caption_missing, caption_empty, caption_repaired;
    size_t n_replaced;            /* U+FFFD inserted when caption_repaired */
    unsigned char *json;          /* sd_dataset_read_json */
    size_t json_size;
    /* private: buffers and the open shard */
    size_t image_cap_, caption_cap_, json_cap_, scratch_cap_;
    char *scratch_;
    uint64_t fd_id_;
    int64_t fd_shard_;
    int fd_;
} sd_sample;

/* Reads sample i (0 <= i < count; out of range is a programming error and ends the job).
 * Returns 0 when the sample is kept (reason OK or a kept reason; err then describes a kept
 * reason, or is cleared), -1 when it is skipped: out->reason says why and err names the file
 * and the problem. A skipped sample may have no image or caption bytes filled in. */
int sd_dataset_read(const sd_dataset *ds, int64_t i, sd_sample *out, sd_err *err);

/* Reads sample i's .json into out->json / json_size as raw bytes (not parsed, not
 * validated). Returns 1 when read, 0 when the sample has none, -1 on a read error or a .json of
 * more than SD_JSON_MAX_BYTES (err). */
#define SD_JSON_MAX_BYTES (16u << 20)
int sd_dataset_read_json(const sd_dataset *ds, int64_t i, sd_sample *out, sd_err *err);

void sd_sample_free(sd_sample *s);

/* ---- reasons and their end-of-run summary -------------------------------------------------- */

/* Stable lower_case name; "?" for a value out of range. */
const char *sd_sample_reason_name(sd_sample_reason r);
/* 1 for the reasons that keep the sample. */
int sd_sample_reason_keeps(sd_sample_reason r);

/* Per-reason counts; a plain array so ranks can sum them with one MPI_Reduce of
 * SD_SAMPLE_N_REASONS uint64 values. */
typedef struct sd_sample_counts {
    uint64_t n[SD_SAMPLE_N_REASONS];
} sd_sample_counts;
void sd_sample_counts_add(sd_sample_counts *c, sd_sample_reason r);
/* "1000 samples read: 990 kept (ok 985, empty_caption 5), 10 skipped (missing_caption 7,
 * unsupported_image 3)"; zero counts are left out. Returns the length snprintf would write. */
int sd_sample_counts_format(const sd_sample_counts *c, char *buf, size_t size);

/* ---- deterministic division of work -------------------------------------------------------- */

/* Shards of samples_per_shard samples covering n_samples: ceil(n / S); 0 for n = 0;
 * -1 for n < 0 or S < 1. */
int64_t sd_dataset_n_shards(int64_t n_samples, int64_t samples_per_shard);

/* The global samples [*begin, *end) that `rank` of `n_ranks` handles in `shard`. Shard k holds
 * [k*S, min((k+1)*S, N)); its L samples are cut into n_ranks contiguous slices in rank order,
 * the first L mod n_ranks ranks getting one more (sizes differ by at most 1; a rank may get an
 * empty slice). A pure function: the same arguments always give the same slice. Returns 0, or
 * -1 (begin = end = 0) for invalid arguments (n < 0, S < 1, n_ranks < 1, rank outside
 * [0, n_ranks), shard outside [0, n_shards)). */
int sd_dataset_partition(int64_t n_samples, int64_t samples_per_shard, int n_ranks, int rank,
                         int64_t shard, int64_t *begin, int64_t *end);

/* ---- one index for all ranks --------------------------------------------------------------- */

/* Serialises the index (samples in use, pool, shards, root, policies, stats; not the notes)
 * into one malloc'd buffer, so that one rank can index and MPI_Bcast it instead of every rank
 * walking the file system. An in-memory image for processes of one build on one kind of
 * machine, not a file format. */
int sd_dataset_pack(const sd_dataset *ds, void **blob, size_t *size);
/* The same image written into a buffer the caller has (an MPI shared-memory window), so that
 * the index is never held twice over while the image is made: sd_dataset_pack_size bytes
 * (a different size is a programming error and ends the job). */
size_t sd_dataset_pack_size(const sd_dataset *ds);
void sd_dataset_pack_into(const sd_dataset *ds, void *buf, size_t size);
/* sd_dataset_pack_into, then sd_dataset_close, freeing the records as soon as they are copied:
 * the index and its image together peak at the index plus its larger part (records or pool)
 * instead of twice the index. */
void sd_dataset_pack_close(sd_dataset *ds, void *buf, size_t size);
/* Rebuilds a dataset from sd_dataset_pack's bytes (checked: magic, version, lengths). */
int sd_dataset_unpack(const void *blob, size_t size, sd_dataset *ds, sd_err *err);
/* The same checks, but the records, pool, shard and suffix tables stay where they lie in
 * `image` instead of being copied (only root and input are): the ranks of a node share one
 * image in MPI shared memory (mode 'process'). `image` must be 8-byte aligned, must not change
 * and must outlive the dataset; sd_dataset_close leaves it alone. */
int sd_dataset_view(const void *image, size_t size, sd_dataset *ds, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
