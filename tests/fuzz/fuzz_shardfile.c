/* libFuzzer harness: the contents of a latent shard file (sd_shard_open and every read). The
 * input bytes are not the file: they drive a generator that writes a well-formed HDF5 file (with
 * the HDF5 library, so the fuzzing goes into sdtrain's checks, not into libhdf5's parser of
 * corrupt files) starting from a valid shard and changing its attributes (omitted, another
 * class, another size, unusual values: 0, negative, 2^31, 2^32 + 8, NaN, ...) and its datasets
 * (omitted, a group in their place, other dimensions, other element types: 8-byte floats,
 * big-endian, a 16-bit float that is not binary16, variable-length strings; huge declared
 * dimensions without storage), with the data from the input. These are the files other tools or
 * other versions could leave in a shard directory.
 * Invariants (include/sdtrain/shards.h):
 *   - sd_shard_open either refuses with a message naming the file, or accepts a shard whose
 *     attributes are in the ranges the readers' buffers assume (SD_SHARD_MAX_* and a positive
 *     finite scaling factor) and whose string widths are positive;
 *   - on an accepted shard every read of every sample succeeds (the datasets' shapes were
 *     checked), moments NCHW and NHWC agree, the checksum can be computed, and a read past the
 *     last sample is refused;
 *   - no HDF5 call on a bad file ends the process (SD_H5_CHECK would abort: a crash here).
 * Any broken invariant calls abort(), which libFuzzer reports as a crash.
 * Build and run: tests/fuzz/run_fuzz.sh shardfile [SECONDS]. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/shards.h"

#define FUZZ_NAME "fuzz_shardfile"
#include "fuzz_util.h"
#include "fuzz_h5gen.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char work[256], path[320];

static void cleanup(void)
{
    unlink(path);
    rmdir(work);
}

/* ---- attributes ----------------------------------------------------------------------------- */

enum { A_STR, A_INT, A_REAL };

typedef struct {
    const char *name;
    int kind;
    const char *s;
    int64_t i;
    double r;
} attr_spec;

static const int64_t odd_ints[] = {0, -1, 1, 7, 9, 2147483647, 2147483648LL, 4294967304LL,
                                   INT64_MAX, INT64_MIN, 65536, 1 << 20, 100000};
static const double odd_reals[] = {0.0, -1.0, 1e300, 0.18215, 1e-300, 3.0};
static const char *const odd_strs[] = {"", "float64", "float16", "sdtrain-latent-shard", "bfloat16",
                                       "x"};

static void put_attr(hid_t f, const attr_spec *a, input *in)
{
    unsigned op = byte(in) % 16;
    hid_t type, space, h;
    hsize_t two[1] = {2};
    int kind = a->kind;
    const char *s = a->s;
    int64_t i = a->i;
    double r = a->r;
    if (op == 9)
        return; /* omitted */
    if (op == 10) { /* another class */
        kind = (kind + 1 + byte(in) % 2) % 3;
        i = 8;
        r = 8.0;
        s = "8";
    } else if (op == 11) { /* an unusual value */
        unsigned k = byte(in);
        i = odd_ints[k % (sizeof odd_ints / sizeof odd_ints[0])];
        r = k % 7 == 6 ? (k & 8 ? NAN : INFINITY) : odd_reals[k % (sizeof odd_reals / sizeof odd_reals[0])];
        s = odd_strs[k % (sizeof odd_strs / sizeof odd_strs[0])];
    }
    space = op == 12 ? H5Screate_simple(1, two, NULL) : H5Screate(H5S_SCALAR);
    if (kind == A_STR) {
        type = H5Tcopy(H5T_C_S1);
        if (op == 13) {
            H5Tset_size(type, H5T_VARIABLE);
        } else {
            H5Tset_size(type, strlen(s) + 1 + (op == 14 ? 300 : 0));
        }
    } else if (kind == A_INT) {
        type = H5Tcopy(op == 13 ? H5T_STD_U8BE : op == 14 ? H5T_STD_I32BE : H5T_STD_I64LE);
        if (op == 15) /* an integer of 16 bytes */
            H5Tset_precision(type, 64), H5Tset_size(type, 16);
    } else {
        type = H5Tcopy(op == 13 ? H5T_IEEE_F32BE : H5T_IEEE_F64LE);
    }
    h = H5Acreate2(f, a->name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (h >= 0) {
        if (kind == A_STR) {
            if (H5Tis_variable_str(type) > 0) {
                const char *v[2] = {s, s};
                H5Awrite(h, type, v);
            } else {
                size_t w = H5Tget_size(type);
                char *buf = calloc(2, w);
                memcpy(buf, s, strlen(s) < w ? strlen(s) : w);
                memcpy(buf + w, s, strlen(s) < w ? strlen(s) : w);
                H5Awrite(h, type, buf);
                free(buf);
            }
        } else if (kind == A_INT) {
            int64_t v[2] = {i, i};
            H5Awrite(h, H5T_NATIVE_INT64, v);
        } else {
            double v[2] = {r, r};
            H5Awrite(h, H5T_NATIVE_DOUBLE, v);
        }
        H5Aclose(h);
    }
    H5Tclose(type);
    H5Sclose(space);
}

/* ---- the harness ---------------------------------------------------------------------------- */

static void make_file(input *in)
{
    const int n = 1 + (int)(byte(in) % 4), res = 8 * (1 + (int)(byte(in) % 3));
    const int c = 1 + (int)(byte(in) % 4), l = 1 + (int)(byte(in) % 5), dd = 1 + (int)(byte(in) % 6);
    const int fsz = byte(in) & 1 ? 4 : 2;
    const size_t cap_w = 1 + byte(in) % 24, key_w = 1 + byte(in) % 12;
    char lname[64];
    hsize_t dims[4];
    hid_t f;
    const attr_spec attrs[] = {
        {"format", A_STR, "sdtrain-latent-shard", 0, 0},
        {"format_version", A_INT, NULL, 1, 0},
        {"shard_index", A_INT, NULL, 0, 0},
        {"num_samples", A_INT, NULL, n, 0},
        {"resolution", A_INT, NULL, res, 0},
        {"latent_channels", A_INT, NULL, c, 0},
        {"text_len", A_INT, NULL, l, 0},
        {"embed_dim", A_INT, NULL, dd, 0},
        {"latent_scaling_factor", A_REAL, NULL, 0, 0.18215},
        {"float_dtype", A_STR, fsz == 2 ? "float16" : "float32", 0, 0},
        {"weights_path", A_STR, "random(seed=1)", 0, 0},
        {"weights_hash", A_STR, "fnv1a64:0123456789abcdef", 0, 0},
        {"created", A_STR, "2026-11-27T00:00:00Z", 0, 0},
        {"creator", A_STR, "fuzz", 0, 0},
    };
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    fuzz_require(f >= 0, "create the scratch HDF5 file", path);
    for (size_t k = 0; k < sizeof attrs / sizeof attrs[0]; k++)
        put_attr(f, &attrs[k], in);
    snprintf(lname, sizeof lname, "image_latents_%d", byte(in) == 255 ? 16 : res);
    dims[0] = (hsize_t)n, dims[1] = (hsize_t)(2 * c), dims[2] = dims[3] = (hsize_t)(res / 8);
    put_dataset(f, lname, D_F, fsz, 0, 4, dims, in, NULL);
    dims[1] = (hsize_t)l, dims[2] = (hsize_t)dd;
    put_dataset(f, "caption_embeddings", D_F, fsz, 0, 3, dims, in, NULL);
    put_dataset(f, "caption_ids", D_I32, 4, 0, 2, dims, in, NULL);
    put_dataset(f, "caption", D_STR, 0, cap_w, 1, dims, in, NULL);
    put_dataset(f, "key", D_STR, 0, key_w, 1, dims, in, NULL);
    dims[0] = (hsize_t)l, dims[1] = (hsize_t)dd;
    put_dataset(f, "empty_caption_embedding", D_F, fsz, 0, 2, dims, in, NULL);
    H5Fclose(f);
}

static void check_reads(sd_shard *s)
{
    const sd_shard_info *i = sd_shard_get_info(s);
    const int64_t n = i->n_samples, hw = (int64_t)i->latent_size * i->latent_size;
    const int64_t mom = 2 * (int64_t)i->latent_channels * hw, emb = (int64_t)i->text_len * i->embed_dim;
    const size_t cw = i->caption_width + 1, kw = i->key_width + 1;
    /* (one sample more: an empty shard's buffers are not NULL, and the empty embedding fits) */
    float *a = malloc((size_t)((n + 1) * mom) * sizeof(float));
    float *b = malloc((size_t)((n + 1) * mom) * sizeof(float));
    float *e = malloc((size_t)((n + 1) * emb) * sizeof(float));
    int32_t *ids = malloc((size_t)((n + 1) * i->text_len) * sizeof(int32_t));
    char *caps = malloc((size_t)(n + 1) * cw), *keys = malloc((size_t)(n + 1) * kw);
    uint64_t sum;
    sd_err err;
    fuzz_require(a && b && e && ids && caps && keys, "buffers of an accepted shard fit in memory", i->path);
    fuzz_require(sd_shard_read_moments(s, 0, n, 1, SD_LATENT_NCHW, a, &err) == 0, "read moments NCHW", err.msg);
    fuzz_require(sd_shard_read_moments(s, 0, n, 1, SD_LATENT_NHWC, b, &err) == 0, "read moments NHWC", err.msg);
    for (int64_t k = 0; k < n; k++)
        for (int64_t ch = 0; ch < 2 * i->latent_channels; ch++)
            for (int64_t p = 0; p < hw; p++) {
                const float x = a[k * mom + ch * hw + p], y = b[k * mom + p * 2 * i->latent_channels + ch];
                fuzz_require(memcmp(&x, &y, sizeof x) == 0, "NCHW and NHWC reads agree", i->path);
            }
    fuzz_require(sd_shard_read_embeddings(s, 0, n, 1, e, &err) == 0, "read embeddings", err.msg);
    fuzz_require(sd_shard_read_ids(s, 0, n, 1, ids, &err) == 0, "read ids", err.msg);
    fuzz_require(sd_shard_read_captions(s, 0, n, 1, caps, cw, &err) == 0, "read captions", err.msg);
    fuzz_require(sd_shard_read_keys(s, 0, n, 1, keys, kw, &err) == 0, "read keys", err.msg);
    for (int64_t k = 0; k < n; k++)
        fuzz_require(memchr(caps + k * cw, 0, cw) && memchr(keys + k * kw, 0, kw),
                     "strings come back terminated", i->path);
    fuzz_require(sd_shard_read_empty_embedding(s, e, &err) == 0, "read the empty embedding", err.msg);
    fuzz_require(sd_shard_checksum(s, &sum, &err) == 0, "checksum", err.msg);
    fuzz_require(sd_shard_read_embeddings(s, n, 1, 1, e, &err) != 0, "a read past the end is refused", i->path);
    fuzz_require(sd_shard_read_moments(s, n - 1, 2, 1, SD_LATENT_NCHW, a, &err) != 0,
                 "a read over the end is refused", i->path);
    free(a);
    free(b);
    free(e);
    free(ids);
    free(caps);
    free(keys);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input in = {data, size, 0};
    sd_shard *s = NULL;
    sd_err err;
    if (!work[0]) {
        fuzz_scratch_dir(work, sizeof work, "fuzz-sf");
        snprintf(path, sizeof path, "%s/shard-000000.h5", work);
        atexit(cleanup);
        H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* the generator's refused calls are expected */
    }
    make_file(&in);
    memset(&err, 0, sizeof err);
    if (sd_shard_open(path, &s, &err) != 0) {
        if (getenv("SD_FUZZ_VERBOSE"))
            fprintf(stderr, "refused: %s\n", err.msg);
        fuzz_require(strstr(err.msg, path) != NULL, "a refusal names the file", err.msg);
        fuzz_require(s == NULL, "a refusal returns no shard", err.msg);
        return 0;
    }
    {
        const sd_shard_info *i = sd_shard_get_info(s);
        /* 0: an empty shard (every sample of its range was skipped), datasets of zero rows */
        fuzz_require(i->n_samples >= 0 && i->n_samples <= SD_SHARD_MAX_SAMPLES, "num_samples in range", path);
        fuzz_require(i->resolution >= 8 && i->resolution % 8 == 0 && i->resolution <= SD_SHARD_MAX_RESOLUTION &&
                         i->latent_size == i->resolution / 8,
                     "resolution in range", path);
        fuzz_require(i->latent_channels >= 1 && i->latent_channels <= SD_SHARD_MAX_CHANNELS &&
                         i->text_len >= 1 && i->text_len <= SD_SHARD_MAX_TEXT_LEN && i->embed_dim >= 1 &&
                         i->embed_dim <= SD_SHARD_MAX_EMBED_DIM,
                     "shape attributes in range", path);
        fuzz_require(isfinite(i->scaling_factor) && i->scaling_factor > 0, "a positive finite scaling factor",
                     path);
        fuzz_require(i->caption_width >= 1 && i->key_width >= 1 && i->caption_width <= SD_SHARD_MAX_STRING &&
                         i->key_width <= SD_SHARD_MAX_STRING,
                     "string widths in range", path);
        if (getenv("SD_FUZZ_VERBOSE"))
            fprintf(stderr, "accepted: %lld samples, %d px, C %d, L %d, D %d\n", (long long)i->n_samples,
                    i->resolution, i->latent_channels, i->text_len, i->embed_dim);
        /* the generator makes small shards: an accepted one is small too */
        if (i->n_samples <= 4 && i->resolution <= 24 && i->text_len <= 5 && i->embed_dim <= 6)
            check_reads(s);
    }
    sd_shard_close(s);
    return 0;
}
