/* safetensors files: a validating memory-mapped reader, sharded (index.json) sets, and a writer. */
#ifndef SDTRAIN_SAFETENSORS_H
#define SDTRAIN_SAFETENSORS_H

/*
 * Format (huggingface/safetensors): u64 little-endian N, N bytes of UTF-8 JSON header
 * {name: {"dtype", "shape", "data_offsets": [begin, end]}, optional "__metadata__": {str: str}},
 * then the data buffer; offsets are relative to the buffer. doc/safetensors.md lists every
 * rule the reader enforces. In short: what the reference (safetensors 0.8) rejects is rejected
 * (but for odd number spellings inside fields both ignore), and also duplicate keys (the
 * reference keeps the last one silently), names with NUL characters, shapes whose non-zero
 * dimensions overflow, and more than SD_TENSOR_MAX_DIMS dimensions. Every message starts with
 * the file's path and names the tensor when one is concerned.
 *
 * Data pointers point into a read-only mapping and may be unaligned (files from writers that
 * do not pad the header): read through sd_st_tensor_read_f32 / _read_raw, or memcpy.
 * Truncating a file while it is mapped makes later accesses fault (SIGBUS); sdtrain never
 * rewrites a file in place (the writer renames a new file over the old one).
 */

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header the reader accepts, as in the reference implementation. */
#define SD_ST_MAX_HEADER 100000000u

/* Every dtype of the format, in the reference's order of increasing alignment (the writer
 * sorts by it, like the reference, so that our files are laid out as its files are). */
typedef enum {
    SD_ST_BOOL = 0,
    SD_ST_F4,
    SD_ST_F6_E2M3,
    SD_ST_F6_E3M2,
    SD_ST_U8,
    SD_ST_I8,
    SD_ST_F8_E5M2,
    SD_ST_F8_E4M3,
    SD_ST_F8_E8M0,
    SD_ST_F8_E4M3FNUZ,
    SD_ST_F8_E5M2FNUZ,
    SD_ST_I16,
    SD_ST_U16,
    SD_ST_F16,
    SD_ST_BF16,
    SD_ST_I32,
    SD_ST_U32,
    SD_ST_F32,
    SD_ST_C64,
    SD_ST_F64,
    SD_ST_I64,
    SD_ST_U64,
    SD_ST_DTYPE_COUNT
} sd_st_dtype;

/* "F32", "BF16", ...; "?" for an invalid value. */
const char *sd_st_dtype_name(sd_st_dtype dtype);
/* Exact, case-sensitive spelling (as the reference). Returns 0 and sets *out, or -1. */
int sd_st_dtype_from_name(const char *name, sd_st_dtype *out);
/* Bits per element (4 for F4, 6 for F6_*); 0 for an invalid value. */
unsigned sd_st_dtype_bits(sd_st_dtype dtype);
/* The project's dtype for the same element type: 0, or -1 when sd_dtype has none. */
int sd_st_dtype_to_sd(sd_st_dtype dtype, sd_dtype *out);
sd_st_dtype sd_st_dtype_from_sd(sd_dtype dtype); /* SD_ST_DTYPE_COUNT if invalid */

/* One tensor of an open file. All pointers stay valid until the file is closed. */
typedef struct sd_st_tensor {
    const char *name;  /* NUL-terminated; names never contain NUL (checked) */
    const char *file;  /* path of the file that holds it, for messages */
    sd_st_dtype dtype;
    int ndim;                          /* 0 for a scalar */
    int64_t shape[SD_TENSOR_MAX_DIMS]; /* entries past ndim are 0 */
    int64_t numel;                     /* 1 for a scalar, 0 for an empty tensor */
    const void *data;                  /* read-only, possibly unaligned */
    size_t nbytes;
    uint64_t file_offset; /* absolute offset of the data in the file */
} sd_st_tensor;

typedef struct sd_st_meta {
    const char *key;
    const char *value;
} sd_st_meta;

/* An open file. Zero-initialise it (or rely on sd_st_open doing so); the fields are private. */
typedef struct sd_st_file {
    char *path;
    const unsigned char *map; /* the whole file, PROT_READ; NULL when the file is empty */
    size_t size;
    uint64_t header_len; /* N */
    sd_st_tensor *tensors; /* in data order: sorted by begin offset, ties by header order */
    size_t n_tensors;
    const sd_st_tensor **by_name; /* sorted by strcmp, for sd_st_find */
    sd_st_meta *meta;             /* sorted by key */
    size_t n_meta;
    int has_meta;  /* the header had a "__metadata__" object (possibly empty) */
    char *strings; /* one allocation holding every name, key and value */
} sd_st_file;

/* Opens, maps and validates `path`. On failure returns -1 with a message naming the file (and
 * the tensor); *f is then zeroed and needs no close. */
int sd_st_open(const char *path, sd_st_file *f, sd_err *err);
/* Releases the mapping and memory; *f is zeroed. Safe on a zeroed or already closed file. */
void sd_st_close(sd_st_file *f);

size_t sd_st_count(const sd_st_file *f);
/* The i-th tensor in data order (the order of the bytes in the file), NULL if i >= count. */
const sd_st_tensor *sd_st_tensor_at(const sd_st_file *f, size_t i);
/* The tensor called `name`, or NULL. */
const sd_st_tensor *sd_st_find(const sd_st_file *f, const char *name);

/* "__metadata__" lookup: the value or NULL. Iteration is in key order (strcmp). */
const char *sd_st_metadata(const sd_st_file *f, const char *key);
size_t sd_st_metadata_count(const sd_st_file *f);
const sd_st_meta *sd_st_metadata_at(const sd_st_file *f, size_t i);

/* Converts a F32, F16, BF16 or F64 tensor to float: F16 and BF16 widen exactly, F64 rounds to
 * nearest. `n` must equal the tensor's element count (a mismatch is an error, so that a caller
 * never reads a tensor into a buffer of another size). */
int sd_st_tensor_read_f32(const sd_st_tensor *t, float *dst, size_t n, sd_err *err);
/* Copies the raw little-endian bytes; `nbytes` must equal t->nbytes. */
int sd_st_tensor_read_raw(const sd_st_tensor *t, void *dst, size_t nbytes, sd_err *err);
/* 0 when the tensor has exactly this shape, else -1 with "file: tensor 'x' has shape [..],
 * expected [..]". */
int sd_st_tensor_check_shape(const sd_st_tensor *t, int ndim, const int64_t *shape, sd_err *err);
/* sd_st_find + sd_st_tensor_read_f32; a missing tensor is an error naming file and tensor. */
int sd_st_read_f32(const sd_st_file *f, const char *name, float *dst, size_t n, sd_err *err);

/* ---- A model's weights as one set: a single file, or shards listed by an index ----------
 * Index files (diffusers "diffusion_pytorch_model.safetensors.index.json", transformers
 * "model.safetensors.index.json") map each tensor name to a shard file in the same folder:
 * {"metadata": {...}, "weight_map": {"name": "shard.safetensors", ...}}. Every listed shard is
 * opened and validated; a tensor listed but missing from its shard, a tensor in a shard but not
 * listed for it, a shard path that is absolute or climbs out with "..", and a missing shard file
 * are errors. */
typedef struct sd_st_set {
    char *source; /* the single file's or the index's path */
    sd_st_file *files;
    size_t n_files;
    const sd_st_tensor **order;   /* shards in file-name order, each in data order */
    const sd_st_tensor **by_name; /* sorted by strcmp */
    size_t n_tensors;
} sd_st_set;

int sd_st_set_open_file(sd_st_set *s, const char *path, sd_err *err);
int sd_st_set_open_index(sd_st_set *s, const char *index_path, sd_err *err);
/* The weights of one component folder (e.g. "<snapshot>/unet"). With basename NULL it tries
 * "diffusion_pytorch_model.safetensors", then "model.safetensors" (text encoders); otherwise
 * only `basename` (e.g. "diffusion_pytorch_model.fp16.safetensors"). For each name the single
 * file wins over "<name>.index.json" when both exist, as in transformers and diffusers. */
int sd_st_set_open_dir(sd_st_set *s, const char *dir, const char *basename, sd_err *err);
void sd_st_set_close(sd_st_set *s);

const char *sd_st_set_source(const sd_st_set *s);
size_t sd_st_set_count(const sd_st_set *s);
const sd_st_tensor *sd_st_set_tensor_at(const sd_st_set *s, size_t i);
const sd_st_tensor *sd_st_set_find(const sd_st_set *s, const char *name);
int sd_st_set_read_f32(const sd_st_set *s, const char *name, float *dst, size_t n, sd_err *err);

/* ---- Writer ---------------------------------------------------------------------------------
 * Collects tensors (the data is borrowed: keep it alive until sd_st_writer_write returns) and
 * writes a file the reference reads: header JSON as serde_json prints it, "__metadata__" first
 * (keys sorted), tensors sorted by decreasing dtype alignment then name, as the reference does,
 * header padded with spaces to a multiple of 8. With at most one metadata key the file is
 * byte-identical to what safetensors.serialize_file writes for the same tensors. The file is
 * written under a temporary name in the same folder, fsynced, renamed over `path`, and the
 * folder is fsynced, so readers see the old file or the complete new one. */
typedef struct sd_st_writer sd_st_writer;

sd_st_writer *sd_st_writer_new(void);
void sd_st_writer_free(sd_st_writer *w);
/* Rejects (-1, message) an invalid dtype, ndim outside [0, SD_TENSOR_MAX_DIMS], a negative or
 * overflowing shape, `nbytes` not matching the shape, a name that is not valid UTF-8, contains
 * NUL, is "__metadata__" or was added before. `data` may be NULL when nbytes is 0. */
int sd_st_writer_add(sd_st_writer *w, const char *name, sd_st_dtype dtype, int ndim,
                     const int64_t *shape, const void *data, size_t nbytes, sd_err *err);
/* Sets (or replaces) a metadata entry; key and value are copied and must be valid UTF-8. */
int sd_st_writer_set_metadata(sd_st_writer *w, const char *key, const char *value, sd_err *err);
size_t sd_st_writer_count(const sd_st_writer *w);
int sd_st_writer_write(const sd_st_writer *w, const char *path, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
