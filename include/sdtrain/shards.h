/* Latent shards: parallel HDF5 files of VAE moments and caption embeddings, committed by rename
 * and listed in the shard directory's manifest (format: doc/shards.md). */
#ifndef SDTRAIN_SHARDS_H
#define SDTRAIN_SHARDS_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SD_SHARD_FORMAT "sdtrain-latent-shard"
#define SD_SHARD_FORMAT_VERSION 1
#define SD_SHARD_MANIFEST "manifest.json"
#define SD_SHARD_MANIFEST_FORMAT "sdtrain-shard-manifest"
#define SD_SHARD_MANIFEST_VERSION 1
#define SD_SHARD_TEXT_LEN 77
#define SD_SHARD_LATENT_CHANNELS 4
#define SD_SHARD_SCALING_FACTOR 0.18215

/* What a shard may declare, written or read: readers size their buffers from these attributes,
 * so a file outside them is refused before any allocation. Per sample at most
 * SD_SHARD_MAX_SAMPLE_FLOATS floats of moments and embedding (1 GiB as fp32); strings of at
 * most SD_SHARD_MAX_STRING bytes. */
#define SD_SHARD_MAX_SAMPLES 2147483647LL
#define SD_SHARD_MAX_RESOLUTION 65536
#define SD_SHARD_MAX_CHANNELS 64
#define SD_SHARD_MAX_TEXT_LEN 4096
#define SD_SHARD_MAX_EMBED_DIM 65536
#define SD_SHARD_MAX_SAMPLE_FLOATS (1LL << 28)
#define SD_SHARD_MAX_STRING ((size_t)1 << 20)

/* Memory layout of latent moments handed to the writer or asked of the reader. On disk they
 * are always NCHW [N, 2C, h, w] like the seed pipeline; the models compute in NHWC. */
typedef enum { SD_LATENT_NCHW = 0, SD_LATENT_NHWC = 1 } sd_latent_layout;

/* What every sample of a shard shares; all ranks of a writing communicator pass the same. */
typedef struct sd_shard_meta {
    int resolution;          /* image side in pixels, a multiple of 8; latents are resolution/8 */
    int latent_channels;     /* C = 4; the moments have 2C channels: mean, then logvar */
    int text_len;            /* tokens per caption, 77 */
    int embed_dim;           /* D of the caption embeddings, 1024 for SD2 */
    double scaling_factor;   /* applied when a latent is sampled from the moments: 0.18215 */
    sd_dtype float_dtype;    /* how floats are stored: SD_F16 (default, RNE) or SD_F32 */
    char weights_path[1024]; /* the snapshot whose VAE and text encoder made the shard */
    char weights_hash[128];  /* a hash string identifying those weights */
    char filter[1024];       /* &data filter that chose the samples; "" = none (no attribute) */
} sd_shard_meta;

/* SD2 defaults: 512 px, C 4, 77 x 1024, 0.18215, fp16, no weights named. */
void sd_shard_meta_defaults(sd_shard_meta *m);

/* One rank's contiguous slice of a shard's samples (n may be 0: the pointers are then unused). */
/* What a shard was planned to hold: the samples [first, first + samples) of the dataset, whose
 * first has a key of FNV-1a 64 hash key_hash. Recorded in the manifest entry, so that a rerun can
 * tell whether a committed shard belongs to its own plan, also a shard left empty. */
typedef struct sd_shard_range {
    int64_t first, samples;
    uint64_t key_hash;
} sd_shard_range;

/* FNV-1a 64 of a key's bytes (sd_shard_range.key_hash). */
uint64_t sd_shard_key_hash(const char *key);

typedef struct sd_shard_batch {
    int64_t n;
    sd_latent_layout layout;     /* of `moments` */
    const float *moments;        /* [n, 2C, h, w] (NCHW) or [n, h, w, 2C] (NHWC) */
    const float *embeddings;     /* [n, L, D] */
    const int32_t *ids;          /* [n, L] CLIP token ids */
    const char *const *captions; /* n NUL-terminated UTF-8 strings */
    const char *const *keys;     /* n NUL-terminated UTF-8 strings (sample names) */
    const sd_shard_range *range; /* the shard's planned range, the same on every rank; NULL:
                                    not recorded */
} sd_shard_batch;

/* One committed shard as the manifest lists it. */
typedef struct sd_shard_entry {
    int64_t index;
    int64_t samples;    /* 0 for an empty shard (every sample of its range was skipped) */
    int64_t bytes;      /* file size at commit */
    uint64_t checksum;  /* content hash of the data arrays (sd_shard_checksum) */
    int resolution;
    char file[64];      /* "shard-000012.h5", always the canonical name of `index` */
    int has_range;      /* the manifest records `range` (writers since 2026-11-27) */
    sd_shard_range range;
} sd_shard_entry;

typedef struct sd_shard_manifest {
    int64_t n;               /* entries, sorted by index */
    sd_shard_entry *entries;
    int64_t total_samples;
} sd_shard_manifest;

/* "shard-000012.h5" (six digits or more). */
void sd_shard_file_name(int64_t index, char *buf, size_t size);

/* ---- writing (collective over comm) ----------------------------------------------------------
 * Writes shard `index` into `dir` (created if missing): every rank of comm contributes its
 * slice `mine`, in rank order. The file is written under ".shard-NNNNNN.h5.tmp", closed and
 * fsynced by every rank, renamed to "shard-NNNNNN.h5" once every rank has succeeded, then
 * entered into dir/manifest.json by rank 0 (temporary file, fsync, rename, directory fsync).
 * Only then is the shard committed. `empty_embedding` ([L, D], the encoding of the empty caption) is read on
 * rank 0 only. Every rank may contribute 0 samples: the shard is then committed empty
 * (num_samples 0, every per-sample dataset of zero rows), so that a range whose every sample
 * was skipped keeps the shards numbered without gaps. Refuses a shard that is already
 * committed (committed files are immutable: readers hold them open without locks). On success every rank gets the manifest entry in `committed`
 * (may be NULL). On failure every rank returns -1 with the same message. Failures of HDF5 calls
 * that no input can cause end the job (SD_H5_CHECK). A shard that does not fit in the free space
 * of dir's file system is not started (an error as above; SDTRAIN_TEST_NO_ROOM_CHECK=1 skips the
 * check, for tests of the failed write). Fault points (SDTRAIN_FAULT, world rank):
 * "shard-write" kills a rank after its first data is written, "shard-commit" after the rename
 * and before the manifest update. */
int sd_shard_write(MPI_Comm comm, const char *dir, int64_t index, const sd_shard_meta *meta,
                   const float *empty_embedding, const sd_shard_batch *mine,
                   sd_shard_entry *committed, sd_err *err);

/* The bytes of data a shard of n samples holds on disk: latent moments, caption embeddings and
 * ids, the captions and keys at their fixed widths (cap_w, key_w bytes; 0 for a lower bound when
 * the strings are not known yet) and the empty-caption embedding; HDF5's metadata not included. */
double sd_shard_data_bytes(const sd_shard_meta *meta, int64_t n, size_t cap_w, size_t key_w);

/* 1 when every value of x[0..n) stays finite stored as `dtype` (SD_F32: finite; SD_F16: |x| <
 * 65520, which round-to-nearest-even keeps at most 65504 instead of making infinite). */
int sd_shard_storable(const float *x, size_t n, sd_dtype dtype);

/* ---- the manifest (any process, no MPI) ------------------------------------------------------ */

/* Reads dir/manifest.json. A missing manifest is an empty one (nothing committed yet); a
 * malformed one is an error naming the file and the problem. */
int sd_shard_manifest_read(const char *dir, sd_shard_manifest *m, sd_err *err);

/* The manifest in `text` (len bytes; `path` names it in messages). The writer's own layout
 * (sd_shard_manifest_text) is read by a scanner of that layout; any other text, valid JSON of
 * another layout or not, by json-c (sd_shard_manifest_parse_json), which says what is wrong with
 * it. Both give the same result for any text the scanner accepts. */
int sd_shard_manifest_parse(const char *path, const char *text, size_t len, sd_shard_manifest *m,
                            sd_err *err);
int sd_shard_manifest_parse_json(const char *path, const char *text, size_t len,
                                 sd_shard_manifest *m, sd_err *err);
/* The scanner alone: 1 with *m filled when `text` is the writer's layout of a valid manifest,
 * else 0 with *m empty (nothing said: the json-c reader says why). */
int sd_shard_manifest_scan(const char *text, size_t len, sd_shard_manifest *m);

/* The manifest as the writers print it (malloc'ed, *len bytes, NUL-terminated; total_samples
 * the entries' sum). */
char *sd_shard_manifest_text(const sd_shard_manifest *m, size_t *len);

/* The committed shards of dir: the manifest, with every listed file checked to exist with its
 * recorded size. Writers skip these indices when they resume; readers open only these. Temporary
 * files and shard files the manifest does not list are never committed. */
int sd_shards_committed(const char *dir, sd_shard_manifest *m, sd_err *err);

/* The entry for `index`, or NULL. */
const sd_shard_entry *sd_shard_manifest_find(const sd_shard_manifest *m, int64_t index);
void sd_shard_manifest_free(sd_shard_manifest *m);

/* ---- reading (one process, independent of MPI; the file is opened read-only, sec2 driver) --- */

typedef struct sd_shard sd_shard;

typedef struct sd_shard_info {
    char path[4096];
    int format_version;
    int64_t shard_index;
    int64_t n_samples;       /* 0 for an empty shard: datasets of zero rows */
    int resolution;
    int latent_channels;     /* C: moments have 2C channels */
    int latent_size;         /* h = w = resolution / 8 */
    int text_len, embed_dim; /* L, D */
    sd_dtype float_dtype;    /* as stored; reads always return fp32 */
    double scaling_factor;
    size_t caption_width, key_width; /* bytes of the fixed-length string datasets */
    char latents_name[32];   /* "image_latents_<res>" */
    char weights_path[1024], weights_hash[128], created[64], creator[128];
    char filter[1024];       /* the "filter" attribute; "" when the shard has none */
} sd_shard_info;

/* Opens and validates a shard (format name and version, datasets and their shapes agree). */
int sd_shard_open(const char *path, sd_shard **out, sd_err *err);
/* Opens dir/e->file and checks it against the manifest entry (size, samples, resolution). */
int sd_shard_open_entry(const char *dir, const sd_shard_entry *e, sd_shard **out, sd_err *err);
const sd_shard_info *sd_shard_get_info(const sd_shard *s);
void sd_shard_close(sd_shard *s);

/* Each read takes samples start, start + stride, ... (count of them, stride >= 1) and checks
 * they lie inside the shard. Floats come back as fp32 (fp16 widened exactly).
 * moments: count x 2C x h x w floats in `layout`; embeddings: count x L x D; ids: count x L;
 * captions/keys: count rows of `width` bytes, each NUL-terminated (width must exceed the stored
 * string width); empty embedding: L x D. */
int sd_shard_read_moments(sd_shard *s, int64_t start, int64_t count, int64_t stride,
                          sd_latent_layout layout, float *dst, sd_err *err);
int sd_shard_read_embeddings(sd_shard *s, int64_t start, int64_t count, int64_t stride, float *dst,
                             sd_err *err);
int sd_shard_read_ids(sd_shard *s, int64_t start, int64_t count, int64_t stride, int32_t *dst,
                      sd_err *err);
int sd_shard_read_captions(sd_shard *s, int64_t start, int64_t count, int64_t stride, char *dst,
                           size_t width, sd_err *err);
int sd_shard_read_keys(sd_shard *s, int64_t start, int64_t count, int64_t stride, char *dst,
                       size_t width, sd_err *err);
int sd_shard_read_empty_embedding(sd_shard *s, float *dst, sd_err *err);

/* Reading around HDF5 (the training loader's hot path: no HDF5 open per shard). A shard whose
 * moments and caption embeddings are contiguous datasets of raw little-endian floats (every shard
 * written since 2026-11-27; older ones are chunked) has each row at a fixed file offset:
 * row r of a dataset of `row_floats` floats a row lies at offset + r * row_floats * (2 or 4). */
typedef struct sd_shard_direct {
    int32_t ok;                   /* 0: read this shard through HDF5 */
    int32_t f16;                  /* stored as fp16 (else fp32) */
    uint64_t moments, embeddings; /* file offsets of row 0 */
} sd_shard_direct;

/* The direct layout of an open shard; d->ok = 0 when it has none (chunked datasets, another
 * byte order, a big-endian host). */
void sd_shard_get_direct(const sd_shard *s, sd_shard_direct *d);

/* Rows [row, row + count) of `row_floats` floats each, stored from `offset` in the file open as
 * fd (path names it in errors), into dst as fp32: the floats sd_shard_read_moments (NCHW) or
 * sd_shard_read_embeddings give. `scratch` holds count * row_floats fp16 values when f16 (NULL:
 * allocated here). A failed or short read is an error naming the file (a storage error when the
 * errno is one: sd_err.storage). */
int sd_shard_direct_read(int fd, const char *path, uint64_t offset, int f16, size_t row_floats,
                         int64_t row, int64_t count, float *dst, uint16_t *scratch, sd_err *err);

/* Recomputes the content hash the manifest records (reads the whole shard). */
int sd_shard_checksum(sd_shard *s, uint64_t *out, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
