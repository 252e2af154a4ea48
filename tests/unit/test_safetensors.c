/* Tests of the safetensors reader, sharded sets and writer (src/io/safetensors.c):
 *   - goldens written by the Python reference (tests/data/safetensors/, made by
 *     tests/reference/make_safetensors_goldens.py) read back exactly;
 *   - the writer's output is byte-identical to the reference's for the same tensors;
 *   - round trips, unaligned data, sharded index sets and their errors;
 *   - a corpus of malformed files built here: each is rejected with a message that starts with
 *     the file's path, contains the expected fragment and names the tensor concerned;
 *   - every truncation and many byte mutations of a golden never crash the reader.
 * Usage: test_safetensors             (data from $srcdir/tests/data/safetensors)
 *        test_safetensors --write DIR (writes DIR/c_written.safetensors for the reference
 *                                      script's --c-test check, then exits) */
#define _POSIX_C_SOURCE 200809L

#include "sdtrain/safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/tensor.h"
#include "tap.h"

static char tmpdir[64];
static const char *datadir;

/* ---- helpers ------------------------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, fp) != (size_t)n) {
        free(buf);
        fclose(fp);
        return NULL;
    }
    fclose(fp);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

static int write_bytes(const char *path, const void *data, size_t len)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    int ok = (len == 0 || fwrite(data, 1, len, fp) == len);
    return (fclose(fp) == 0 && ok) ? 0 : -1;
}

static const char *tmp_path(const char *name)
{
    static char buf[8][512];
    static int slot;
    char *p = buf[slot++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", tmpdir, name);
    return p;
}

/* le64(strlen(header)) + header + data. */
static int write_st(const char *path, const char *header, size_t hlen, const void *data,
                    size_t dlen)
{
    size_t n = 8 + hlen + dlen;
    unsigned char *b = calloc(1, n ? n : 1);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    if (dlen)
        memcpy(b + 8 + hlen, data, dlen);
    int rc = write_bytes(path, b, n);
    free(b);
    return rc;
}

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- goldens from the Python reference ----------------------------------------------------- */

static void test_golden(void)
{
    char path[1024], jpath[1024];
    snprintf(path, sizeof path, "%s/golden.safetensors", datadir);
    snprintf(jpath, sizeof jpath, "%s/golden.json", datadir);
    json_object *want = json_object_from_file(jpath);
    if (!tap_ok(want != NULL, "golden.json loads (%s)", jpath))
        return;
    sd_st_file f;
    sd_err err = {0};
    if (!tap_ok(sd_st_open(path, &f, &err) == 0, "reference-written golden opens: %s", err.msg)) {
        json_object_put(want);
        return;
    }
    json_object *order, *tensors, *meta;
    json_object_object_get_ex(want, "order", &order);
    json_object_object_get_ex(want, "tensors", &tensors);
    json_object_object_get_ex(want, "metadata", &meta);

    size_t n = json_object_array_length(order);
    tap_ok(sd_st_count(&f) == n && n == 10, "golden has %zu tensors (expected %zu)",
           sd_st_count(&f), n);
    int order_ok = 1;
    for (size_t i = 0; i < n && i < sd_st_count(&f); i++)
        order_ok &= strcmp(sd_st_tensor_at(&f, i)->name,
                           json_object_get_string(json_object_array_get_idx(order, i))) == 0;
    tap_ok(order_ok, "tensors iterate in data order, as in the file");
    tap_ok(sd_st_tensor_at(&f, n) == NULL, "tensor_at past the end is NULL");

    json_object_object_foreach(tensors, name, exp) {
        json_object *jd, *js, *jr, *jb;
        json_object_object_get_ex(exp, "dtype", &jd);
        json_object_object_get_ex(exp, "shape", &js);
        json_object_object_get_ex(exp, "raw", &jr);
        const sd_st_tensor *t = sd_st_find(&f, name);
        if (!tap_ok(t != NULL, "golden tensor '%s' found", name))
            continue;
        int shape_ok = t->ndim == (int)json_object_array_length(js);
        int64_t numel = 1;
        for (int d = 0; shape_ok && d < t->ndim; d++) {
            json_object *jdim = json_object_array_get_idx(js, (size_t)d);
            shape_ok = t->shape[d] == json_object_get_int64(jdim);
            numel *= t->shape[d];
        }
        tap_ok(shape_ok && t->numel == numel &&
                   strcmp(sd_st_dtype_name(t->dtype), json_object_get_string(jd)) == 0,
               "'%s': dtype %s and shape as written", name, json_object_get_string(jd));
        /* Raw bytes. */
        const char *hex = json_object_get_string(jr);
        size_t nb = strlen(hex) / 2;
        unsigned char *raw = malloc(nb + 1), *got = malloc(nb + 1);
        for (size_t i = 0; i < nb; i++) {
            unsigned v;
            sscanf(hex + 2 * i, "%2x", &v);
            raw[i] = (unsigned char)v;
        }
        tap_ok(t->nbytes == nb && sd_st_tensor_read_raw(t, got, nb, &err) == 0 &&
                   memcmp(raw, got, nb) == 0,
               "'%s': %zu raw bytes exact", name, nb);
        free(raw);
        free(got);
        /* Float conversion, bit-exact against numpy's. */
        if (json_object_object_get_ex(exp, "f32_bits", &jb)) {
            size_t m = json_object_array_length(jb);
            float *vals = malloc((m ? m : 1) * sizeof *vals);
            int rc = sd_st_tensor_read_f32(t, vals, m, &err);
            int bits_ok = rc == 0;
            for (size_t i = 0; bits_ok && i < m; i++) {
                unsigned long w = strtoul(json_object_get_string(json_object_array_get_idx(jb, i)),
                                          NULL, 16);
                bits_ok = f32_bits(vals[i]) == (uint32_t)w;
                if (!bits_ok)
                    tap_diag("'%s'[%zu]: %08" PRIx32 " != %08lx", name, i, f32_bits(vals[i]), w);
            }
            tap_ok(bits_ok, "'%s': %zu values converted to float bit-exactly %s", name, m, err.msg);
            free(vals);
        }
    }
    tap_ok(sd_st_find(&f, "nope") == NULL && sd_st_find(&f, "") == NULL &&
               sd_st_find(&f, NULL) == NULL,
           "unknown names are not found");
    tap_ok(sd_st_metadata_count(&f) == 1 && sd_st_metadata(&f, "format") &&
               strcmp(sd_st_metadata(&f, "format"), "pt") == 0 && !sd_st_metadata(&f, "nope"),
           "metadata {\"format\": \"pt\"}");
    const sd_st_tensor *ids = sd_st_find(&f, "i64_position_ids");
    float fv[4];
    tap_ok(ids && sd_st_tensor_read_f32(ids, fv, 4, &err) != 0 && strstr(err.msg, path) &&
               strstr(err.msg, "'i64_position_ids' is I64"),
           "I64 does not convert to float: %s", err.msg);
    const sd_st_tensor *m = sd_st_find(&f, "f32_matrix");
    float five[5];
    tap_ok(sd_st_read_f32(&f, "f32_matrix", five, 5, &err) != 0 &&
               strstr(err.msg, "'f32_matrix' has 6 elements but the destination holds 5"),
           "element count mismatch is an error: %s", err.msg);
    tap_ok(sd_st_read_f32(&f, "missing", five, 5, &err) != 0 && strstr(err.msg, path) &&
               strstr(err.msg, "no tensor 'missing'"),
           "reading a missing tensor names file and tensor: %s", err.msg);
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    tap_ok(sd_st_tensor_check_shape(m, 2, s23, &err) == 0, "check_shape accepts the right shape");
    tap_ok(sd_st_tensor_check_shape(m, 2, s32, &err) != 0 &&
               strstr(err.msg, "'f32_matrix' has shape [2, 3], expected [3, 2]"),
           "check_shape names the mismatch: %s", err.msg);
    const sd_st_tensor *sc = sd_st_find(&f, "f32_scalar"), *em = sd_st_find(&f, "f32_empty");
    tap_ok(sc && sc->ndim == 0 && sc->numel == 1 && sc->nbytes == 4 && em && em->numel == 0 &&
               em->nbytes == 0 && sd_st_tensor_read_f32(em, NULL, 0, &err) == 0,
           "scalar (shape []) and empty (shape [0, 3]) tensors");
    tap_ok(f.header_len % 8 == 0 && ids->file_offset == 8 + f.header_len,
           "reference pads the header to 8 bytes; offsets are absolute in file_offset");
    sd_st_close(&f);
    sd_st_close(&f);
    tap_ok(f.map == NULL && sd_st_count(&f) == 0, "close twice is harmless");
    json_object_put(want);
}

/* ---- writer ------------------------------------------------------------------------------- */

/* Mirrors writer_set() in tests/reference/make_safetensors_goldens.py. */
static float w_b[12], w_a[4], w_e = 42.0f, w_odd = 1.0f;
static uint16_t w_c[6], w_d[5];
static int64_t w_g[2] = {7, -9};
static unsigned char w_h[3] = {1, 2, 255};
static double w_z[2] = {0.1, -1e300};
#define ODD_NAME "odd \"name\"/\xc3\xa9\n\t\x01"

static sd_st_writer *build_writer_set(void)
{
    sd_err err;
    sd_st_writer *w = sd_st_writer_new();
    int64_t s34[2] = {3, 4}, s4 = 4, s23[2] = {2, 3}, s5 = 5, s0 = 0, s2 = 2, s3 = 3, s1 = 1;
    for (int i = 0; i < 12; i++)
        w_b[i] = (float)(i - 5) * 0.375f;
    for (int i = 0; i < 4; i++)
        w_a[i] = (float)i * 0.5f;
    for (int i = 0; i < 6; i++)
        w_c[i] = sd_f32_to_f16((float)i * 0.25f - 0.5f);
    for (int i = 0; i < 5; i++)
        w_d[i] = sd_f32_to_bf16((float)(i + 1) * 1.5f);
    int rc = 0;
    rc |= sd_st_writer_add(w, "b.weight", SD_ST_F32, 2, s34, w_b, sizeof w_b, &err);
    rc |= sd_st_writer_add(w, "a.bias", SD_ST_F32, 1, &s4, w_a, sizeof w_a, &err);
    rc |= sd_st_writer_add(w, "c", SD_ST_F16, 2, s23, w_c, sizeof w_c, &err);
    rc |= sd_st_writer_add(w, "d", SD_ST_BF16, 1, &s5, w_d, sizeof w_d, &err);
    rc |= sd_st_writer_add(w, "e_scalar", SD_ST_F32, 0, NULL, &w_e, sizeof w_e, &err);
    rc |= sd_st_writer_add(w, "f_empty", SD_ST_F16, 1, &s0, NULL, 0, &err);
    rc |= sd_st_writer_add(w, "g", SD_ST_I64, 1, &s2, w_g, sizeof w_g, &err);
    rc |= sd_st_writer_add(w, "h", SD_ST_U8, 1, &s3, w_h, sizeof w_h, &err);
    rc |= sd_st_writer_add(w, ODD_NAME, SD_ST_F32, 1, &s1, &w_odd, sizeof w_odd, &err);
    rc |= sd_st_writer_add(w, "z.f64", SD_ST_F64, 1, &s2, w_z, sizeof w_z, &err);
    rc |= sd_st_writer_set_metadata(w, "format", "pt", &err);
    if (rc) {
        fprintf(stderr, "building the writer set failed: %s\n", err.msg);
        sd_st_writer_free(w);
        return NULL;
    }
    return w;
}

static void test_writer_matches_reference(void)
{
    char exp_path[1024];
    sd_err err = {0};
    snprintf(exp_path, sizeof exp_path, "%s/writer_expected.safetensors", datadir);
    sd_st_writer *w = build_writer_set();
    if (!tap_ok(w != NULL, "writer set builds"))
        return;
    const char *out = tmp_path("c_writer.safetensors");
    tap_ok(sd_st_writer_write(w, out, &err) == 0, "writer writes %s: %s", out, err.msg);
    size_t n1 = 0, n2 = 0;
    char *a = read_all(out, &n1), *b = read_all(exp_path, &n2);
    tap_ok(a && b && n1 == n2 && memcmp(a, b, n1) == 0,
           "C writer output is byte-identical to safetensors.serialize_file (%zu vs %zu bytes)",
           n1, n2);
    free(a);
    free(b);

    /* ... and it reads back. */
    sd_st_file f;
    float vals[12];
    tap_ok(sd_st_open(out, &f, &err) == 0, "written file opens: %s", err.msg);
    tap_ok(sd_st_count(&f) == 10 && sd_st_read_f32(&f, "b.weight", vals, 12, &err) == 0 &&
               memcmp(vals, w_b, sizeof w_b) == 0,
           "values read back");
    const sd_st_tensor *odd = sd_st_find(&f, ODD_NAME);
    tap_ok(odd && odd->numel == 1, "name with quote, slash, non-ASCII and control characters");
    tap_ok(sd_st_read_f32(&f, "z.f64", vals, 2, &err) == 0 && vals[0] == (float)0.1 &&
               isinf(vals[1]) && vals[1] < 0,
           "F64 rounds to float (-1e300 -> -inf)");
    sd_st_close(&f);

    /* Replacing a file that is mapped: the old mapping keeps the old bytes. */
    tap_ok(sd_st_open(out, &f, &err) == 0, "reopen");
    sd_st_writer *w2 = sd_st_writer_new();
    float one = 5.0f;
    int64_t s1 = 1;
    sd_st_writer_add(w2, "new", SD_ST_F32, 1, &s1, &one, 4, &err);
    tap_ok(sd_st_writer_write(w2, out, &err) == 0, "overwrite by rename");
    tap_ok(sd_st_read_f32(&f, "b.weight", vals, 12, &err) == 0 &&
               memcmp(vals, w_b, sizeof w_b) == 0,
           "an open reader still sees the old file after the rename");
    sd_st_close(&f);
    tap_ok(sd_st_open(out, &f, &err) == 0 && sd_st_count(&f) == 1 && sd_st_find(&f, "new") &&
               sd_st_metadata_count(&f) == 0 && !f.has_meta,
           "a new open sees the new file (no metadata written when none was set)");
    sd_st_close(&f);
    sd_st_writer_free(w2);
    sd_st_writer_free(w);
}

static void test_writer_errors(void)
{
    sd_err err = {0};
    sd_st_writer *w = sd_st_writer_new();
    float x[4] = {0};
    int64_t s2 = 2, s4 = 4, neg = -1, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, s3 = 3;
    tap_ok(sd_st_writer_add(w, "a", SD_ST_F32, 1, &s4, x, 16, &err) == 0, "add a");
    tap_ok(sd_st_writer_add(w, "a", SD_ST_F32, 1, &s4, x, 16, &err) != 0 &&
               strstr(err.msg, "'a' added twice"),
           "duplicate name: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "b", SD_ST_F32, 1, &s4, x, 8, &err) != 0 &&
               strstr(err.msg, "'b'") && strstr(err.msg, "8 bytes were given"),
           "byte count mismatch: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "c", SD_ST_F32, 1, &neg, x, 0, &err) != 0 &&
               strstr(err.msg, "negative"),
           "negative dimension: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "d", SD_ST_F32, 9, nine, x, 4, &err) != 0 &&
               strstr(err.msg, "9 dimensions"),
           "too many dimensions: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "bad\xff", SD_ST_F32, 1, &s2, x, 8, &err) != 0 &&
               strstr(err.msg, "not valid UTF-8"),
           "invalid UTF-8 name: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "\xed\xa0\x80", SD_ST_F32, 1, &s2, x, 8, &err) != 0,
           "UTF-8-encoded surrogate rejected");
    tap_ok(sd_st_writer_add(w, "__metadata__", SD_ST_F32, 1, &s2, x, 8, &err) != 0,
           "__metadata__ is reserved: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "e", (sd_st_dtype)99, 1, &s2, x, 8, &err) != 0 &&
               strstr(err.msg, "invalid dtype"),
           "invalid dtype: %s", err.msg);
    tap_ok(sd_st_writer_add(w, "f", SD_ST_F4, 1, &s3, x, 2, &err) != 0,
           "F4 [3] (12 bits) is not a whole number of bytes");
    tap_ok(sd_st_writer_add(w, "g", SD_ST_F4, 1, &s4, x, 2, &err) == 0, "F4 [4] is 2 bytes");
    tap_ok(sd_st_writer_add(w, "h", SD_ST_F32, 1, &s2, NULL, 8, &err) != 0, "no data");
    tap_ok(sd_st_writer_set_metadata(w, "k", "\xc3", &err) != 0, "metadata must be UTF-8");
    tap_ok(sd_st_writer_set_metadata(w, "k", "1", &err) == 0 &&
               sd_st_writer_set_metadata(w, "k", "2", &err) == 0,
           "metadata set twice replaces");
    tap_ok(sd_st_writer_count(w) == 2, "failed adds leave nothing behind");

    const char *bad = "/nonexistent-sdtrain-dir/x.safetensors";
    tap_ok(sd_st_writer_write(w, bad, &err) != 0 && strncmp(err.msg, bad, strlen(bad)) == 0 &&
               strstr(err.msg, "temporary"),
           "write into a missing folder: %s", err.msg);
    const char *ok = tmp_path("w_errors.safetensors");
    tap_ok(sd_st_writer_write(w, ok, &err) == 0, "write succeeds: %s", err.msg);
    sd_st_file f;
    tap_ok(sd_st_open(ok, &f, &err) == 0 && sd_st_metadata(&f, "k") &&
               strcmp(sd_st_metadata(&f, "k"), "2") == 0 && sd_st_find(&f, "g") &&
               sd_st_find(&f, "g")->dtype == SD_ST_F4 && sd_st_find(&f, "g")->nbytes == 2,
           "metadata replaced; sub-byte tensor round-trips");
    sd_st_close(&f);
    /* No temporary file is left behind. */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp-", tmpdir);
    tap_ok(system(cmd) != 0, "no temporary files left in the folder");
    sd_st_writer_free(w);
}

/* Many tensors, all dtypes, multi-key metadata: write, read back, compare. */
static void test_round_trip(void)
{
    sd_err err = {0};
    sd_st_writer *w = sd_st_writer_new();
    enum { N = 40 };
    static unsigned char data[N][512];
    char names[N][32];
    int64_t shapes[N][3];
    int ndims[N];
    for (int i = 0; i < N; i++) {
        sd_st_dtype dt = (sd_st_dtype)(i % SD_ST_DTYPE_COUNT);
        unsigned bits = sd_st_dtype_bits(dt);
        ndims[i] = i % 4;
        int64_t numel = 1;
        for (int d = 0; d < ndims[i]; d++) {
            shapes[i][d] = (i + d) % 3 + (bits < 8 ? 1 : 0) * 1 + 1;
            numel *= shapes[i][d];
        }
        if (bits < 8 && (numel * bits) % 8) {
            ndims[i] = 1;
            shapes[i][0] = 4;
            numel = 4;
        }
        for (int b = 0; b < 512; b++)
            data[i][b] = (unsigned char)(i * 31 + b * 7);
        snprintf(names[i], sizeof names[i], "layer.%02d.%s", (i * 17) % N, sd_st_dtype_name(dt));
        tap_ok(sd_st_writer_add(w, names[i], dt, ndims[i], shapes[i], data[i],
                                (size_t)(numel * bits / 8), &err) == 0,
               "add %s %s: %s", names[i], sd_st_dtype_name(dt), err.msg);
    }
    sd_st_writer_set_metadata(w, "zeta", "last", &err);
    sd_st_writer_set_metadata(w, "alpha", "first \"quoted\" \\ /", &err);
    sd_st_writer_set_metadata(w, "empty", "", &err);
    const char *path = tmp_path("round.safetensors");
    tap_ok(sd_st_writer_write(w, path, &err) == 0, "round-trip file written: %s", err.msg);
    sd_st_file f;
    tap_ok(sd_st_open(path, &f, &err) == 0, "round-trip file opens: %s", err.msg);
    int all = sd_st_count(&f) == N;
    for (int i = 0; all && i < N; i++) {
        const sd_st_tensor *t = sd_st_find(&f, names[i]);
        all = t && t->ndim == ndims[i] && t->dtype == (sd_st_dtype)(i % SD_ST_DTYPE_COUNT) &&
              memcmp(t->data, data[i], t->nbytes) == 0;
        for (int d = 0; all && d < ndims[i]; d++)
            all = t->shape[d] == shapes[i][d];
    }
    tap_ok(all, "all %d tensors (every dtype, 0-3 dims) read back exactly", N);
    /* Reference layout: dtype alignment descending, then name; data 8-byte aligned. */
    int sorted = 1;
    for (size_t i = 1; i < sd_st_count(&f); i++) {
        const sd_st_tensor *a = sd_st_tensor_at(&f, i - 1), *b = sd_st_tensor_at(&f, i);
        sorted &= a->dtype > b->dtype || (a->dtype == b->dtype && strcmp(a->name, b->name) < 0);
    }
    tap_ok(sorted && f.header_len % 8 == 0, "written in the reference's order, header padded");
    tap_ok(sd_st_metadata_count(&f) == 3 && strcmp(sd_st_metadata_at(&f, 0)->key, "alpha") == 0 &&
               strcmp(sd_st_metadata(&f, "alpha"), "first \"quoted\" \\ /") == 0 &&
               strcmp(sd_st_metadata(&f, "empty"), "") == 0 &&
               strcmp(sd_st_metadata(&f, "zeta"), "last") == 0 && !sd_st_metadata_at(&f, 3),
           "metadata round-trips, iterated in key order");
    sd_st_close(&f);
    sd_st_writer_free(w);

    /* An empty file: no tensors. */
    w = sd_st_writer_new();
    path = tmp_path("empty.safetensors");
    tap_ok(sd_st_writer_write(w, path, &err) == 0 && sd_st_open(path, &f, &err) == 0 &&
               sd_st_count(&f) == 0 && f.size == 16,
           "a writer with no tensors writes '{}' padded to 8");
    sd_st_close(&f);
    sd_st_writer_free(w);
}

/* Headers of other writers need not be padded: data can be unaligned. */
static void test_unaligned(void)
{
    sd_err err = {0};
    uint16_t h[3] = {sd_f32_to_f16(1.5f), sd_f32_to_f16(-0.25f), sd_f32_to_f16(65504.0f)};
    uint16_t bf[2] = {sd_f32_to_bf16(3.0f), sd_f32_to_bf16(-1e30f)};
    float f4[2] = {1.25f, -7.0f};
    double d2[2] = {2.5, -0.1};
    unsigned char data[6 + 4 + 8 + 16];
    memcpy(data, h, 6);
    memcpy(data + 6, bf, 4);
    memcpy(data + 10, f4, 8);
    memcpy(data + 18, d2, 16);
    /* A 1-byte-longer header than a multiple of 8 makes every tensor misaligned. */
    char header[512];
    int n = snprintf(header, sizeof header,
                     "{\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                     "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[6,10]},"
                     "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[10,18]},"
                     "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[18,34]}}");
    while ((n + 8) % 8 != 1)
        header[n++] = ' ';
    const char *path = tmp_path("unaligned.safetensors");
    write_st(path, header, (size_t)n, data, sizeof data);
    sd_st_file f;
    float out[3];
    if (!tap_ok(sd_st_open(path, &f, &err) == 0, "unpadded header opens: %s", err.msg))
        return;
    tap_ok(((uintptr_t)sd_st_find(&f, "h")->data & 1) == 1, "F16 data really is unaligned");
    tap_ok(sd_st_read_f32(&f, "h", out, 3, &err) == 0 && out[0] == 1.5f && out[1] == -0.25f &&
               out[2] == 65504.0f,
           "unaligned F16");
    tap_ok(sd_st_read_f32(&f, "bf", out, 2, &err) == 0 && out[0] == 3.0f &&
               out[1] == sd_bf16_to_f32(bf[1]),
           "unaligned BF16");
    tap_ok(sd_st_read_f32(&f, "f", out, 2, &err) == 0 && out[0] == 1.25f && out[1] == -7.0f,
           "unaligned F32");
    tap_ok(sd_st_read_f32(&f, "d", out, 2, &err) == 0 && out[0] == 2.5f && out[1] == (float)-0.1,
           "unaligned F64");
    sd_st_close(&f);

    /* Longer than one conversion chunk, odd offset. */
    enum { M = 3000 };
    unsigned char *big = malloc(2 * M);
    for (int i = 0; i < M; i++) {
        uint16_t v = sd_f32_to_f16((float)(i % 200) - 100.0f);
        memcpy(big + 2 * i, &v, 2);
    }
    n = snprintf(header, sizeof header,
                 "{\"big\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[0,%d]}}", M, 2 * M);
    while ((n + 8) % 2 != 1)
        header[n++] = ' ';
    write_st(path, header, (size_t)n, big, 2 * M);
    float *fo = malloc(M * sizeof *fo);
    int ok = sd_st_open(path, &f, &err) == 0 && sd_st_read_f32(&f, "big", fo, M, &err) == 0;
    for (int i = 0; ok && i < M; i++)
        ok = fo[i] == (float)(i % 200) - 100.0f;
    tap_ok(ok, "unaligned F16 over several conversion chunks: %s", err.msg);
    sd_st_close(&f);
    free(fo);
    free(big);
}

/* ---- malformed files ---------------------------------------------------------------------- */

typedef struct {
    const char *label;
    const char *header; /* NULL: use raw/raw_len as the whole file */
    size_t data_len;    /* zero bytes of data after the header */
    const char *fragment;
    const char *tensor; /* a name the message must quote, or NULL */
    const char *raw;
    size_t raw_len;
} bad_case;

#define T1(dt, sh, off) "{\"a\":{\"dtype\":\"" dt "\",\"shape\":" sh ",\"data_offsets\":" off "}}"

static const bad_case bad_cases[] = {
    {"empty file", NULL, 0, "0 bytes, too short", NULL, "", 0},
    {"5-byte file", NULL, 0, "5 bytes, too short", NULL, "\x02\0\0\0\0", 5},
    {"header length only", NULL, 0, "runs past the end of the 8-byte file", NULL,
     "\x0a\0\0\0\0\0\0\0", 8},
    {"header length 100000001", NULL, 0, "exceeds the limit of 100000000", NULL,
     "\x01\xe1\xf5\x05\0\0\0\0{}", 10},
    {"header length 2^64-1", NULL, 0, "exceeds the limit", NULL,
     "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10},
    {"header length 0", NULL, 0, "header length is 0", NULL, "\0\0\0\0\0\0\0\0{}", 10},
    {"header longer than file", NULL, 0, "header length 3 runs past the end of the 10-byte file",
     NULL, "\x03\0\0\0\0\0\0\0{}", 10},
    {"truncated JSON", "{\"a\":", 0, "ends before the JSON value does", NULL, NULL, 0},
    {"not JSON", "hello", 0, "not valid JSON", NULL, NULL, 0},
    {"JSON array", "[1, 2]", 0, "not a JSON object", NULL, NULL, 0},
    {"JSON string", "\"x\"", 0, "not a JSON object", NULL, NULL, 0},
    {"NUL after JSON", NULL, 0, "byte 0x00 after the JSON value", NULL,
     "\x08\0\0\0\0\0\0\0{}\0\0\0\0\0\0", 16},
    {"text after JSON", "{}x", 0, "not valid JSON", NULL, NULL, 0},
    {"invalid UTF-8", "{\"\xff\":1}", 0, "not valid JSON", NULL, NULL, 0},
    {"overlong UTF-8", "{\"odd\xc1\xa9\":1}", 0, "invalid UTF-8 at byte 5", NULL, NULL, 0},
    {"UTF-8-encoded surrogate", "{\"\xed\xa0\x80\":1}", 0, "invalid UTF-8 at byte 2", NULL, NULL,
     0},
    {"code point past U+10FFFF", "{\"\xf4\x90\x80\x80\":1}", 0, "invalid UTF-8", NULL, NULL, 0},
    {"truncated UTF-8 sequence", "{\"\xe2\x82\":1}", 0, "invalid UTF-8", NULL, NULL, 0},
    {"UTF-8 BOM", "\xef\xbb\xbf{}", 0, "not valid JSON", NULL, NULL, 0},
    {"comment", "{/* c */}", 0, "not valid JSON", NULL, NULL, 0},
    {"single quotes", "{'a':1}", 0, "not valid JSON", NULL, NULL, 0},
    {"trailing comma", "{\"__metadata__\":{},}", 0, "not valid JSON", NULL, NULL, 0},
    {"nested too deep", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":"
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}",
     4, "nesting too deep", NULL, NULL, 0},
    {"NaN literal", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":NaN}}", 4,
     "NaN or Infinity", NULL, NULL, 0},
    {"-Infinity literal", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":"
     "-Infinity}}", 4, "NaN or Infinity", NULL, NULL, 0},
    {"raw tab in a name", "{\"a\tb\":1}", 0, "raw control character 0x09", NULL, NULL, 0},
    {"NUL in a name", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4,
     "key with a NUL character", "a\\x00b", NULL, 0},
    {"unpaired high surrogate", "{\"\\ud83d\":1}", 0, "unpaired surrogate \\ud83d", NULL, NULL, 0},
    {"high surrogate then non-surrogate", "{\"__metadata__\":{\"k\":\"\\ud83d\\u0041\"}}", 0,
     "unpaired surrogate", NULL, NULL, 0},
    {"unpaired low surrogate", "{\"__metadata__\":{\"k\":\"x\\udc00\"}}", 0,
     "unpaired surrogate \\udc00", NULL, NULL, 0},
    {"duplicate name", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "duplicate tensor name 'a'", NULL, NULL, 0},
    {"duplicate name, escaped", "{\"ab\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"\\u0061b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
     "duplicate tensor name 'ab'", NULL, NULL, 0},
    {"duplicate field", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":[1],"
     "\"data_offsets\":[0,4]}}", 4, "duplicate key 'dtype' in 'a'", NULL, NULL, 0},
    {"duplicate metadata key", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
     "duplicate key 'k' in '__metadata__'", NULL, NULL, 0},
    {"entry not an object", "{\"a\":[1]}", 0, "entry is not a JSON object", "a", NULL, 0},
    {"no dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "no \"dtype\"", "a", NULL, 0},
    {"no shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "no \"shape\"", "a", NULL,
     0},
    {"no data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "no \"data_offsets\"", "a",
     NULL, 0},
    {"empty dtype", T1("\",\"x\":\"", "[1]", "[0,4]"), 4, "unknown dtype ''", "a", NULL, 0},
    {"dtype a number", "{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
     "\"dtype\" is not a string", "a", NULL, 0},
    {"unknown dtype", T1("F99", "[1]", "[0,4]"), 4, "unknown dtype 'F99'", "a", NULL, 0},
    {"lower-case dtype", T1("f32", "[1]", "[0,4]"), 4, "unknown dtype 'f32'", "a", NULL, 0},
    {"shape not an array", T1("F32", "4", "[0,4]"), 4, "\"shape\" is not an array", "a", NULL, 0},
    {"negative dimension", T1("F32", "[-1]", "[0,4]"), 4, "shape[0] = -1 is negative", "a", NULL,
     0},
    {"float dimension", T1("F32", "[1.0]", "[0,4]"), 4, "shape[0] is not an integer", "a", NULL,
     0},
    {"string dimension", T1("F32", "[\"1\"]", "[0,4]"), 4, "shape[0] is not an integer", "a", NULL,
     0},
    {"null dimension", T1("F32", "[1,null]", "[0,4]"), 4, "shape[1] is not an integer", "a", NULL,
     0},
    {"9 dimensions", T1("F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, "9 dimensions", "a", NULL, 0},
    {"dimension 2^63-1", T1("F32", "[1,9223372036854775807]", "[0,4]"), 4, "shape[1] is too large",
     "a", NULL, 0},
    {"dimension 2^64", T1("F32", "[18446744073709551616]", "[0,4]"), 4, "shape[0] is too large",
     "a", NULL, 0},
    {"byte size overflows", T1("F32", "[4294967296,4294967296]", "[0,4]"), 4,
     "too large (its byte size overflows)", "a", NULL, 0},
    {"zero dim with huge dim", T1("F32", "[0,4611686018427387904]", "[0,0]"), 0,
     "too large (its byte size overflows)", "a", NULL, 0},
    {"sub-byte total", T1("F4", "[3]", "[0,2]"), 2, "12 bits, not a whole number of bytes", "a",
     NULL, 0},
    {"offsets not an array", T1("F32", "[1]", "4"), 4, "not an array of two integers", "a", NULL,
     0},
    {"three offsets", T1("F32", "[1]", "[0,4,4]"), 4, "not an array of two integers", "a", NULL,
     0},
    {"one offset", T1("F32", "[1]", "[4]"), 4, "not an array of two integers", "a", NULL, 0},
    {"negative offset", T1("F32", "[1]", "[-4,0]"), 4, "data_offsets[0] = -4 is negative", "a",
     NULL, 0},
    {"float offset", T1("F32", "[1]", "[0,4.0]"), 4, "data_offsets[1] is not an integer", "a",
     NULL, 0},
    {"huge offset", T1("F32", "[1]", "[0,99999999999999999999]"), 4, "data_offsets[1] is too large",
     "a", NULL, 0},
    {"end before begin", T1("F32", "[0]", "[4,0]"), 4, "end before they begin", "a", NULL, 0},
    {"end past the buffer", T1("F32", "[2]", "[0,8]"), 4,
     "run past the end of the 4-byte data buffer", "a", NULL, 0},
    {"size mismatch", T1("F32", "[2]", "[0,4]"), 4, "F32 [2] needs 8 bytes but data_offsets [0, 4] "
     "hold 4", "a", NULL, 0},
    {"scalar size mismatch", T1("F64", "[]", "[0,4]"), 4, "F64 [] needs 8 bytes", "a", NULL, 0},
    {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
     "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]", NULL, NULL, 0},
    {"same range twice", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "overlap tensor 'a'",
     "b", NULL, 0},
    {"empty tensor inside another", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]}}", 8, "overlap tensor 'a'", "e",
     NULL, 0},
    {"gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
     "tensor 'b': data_offsets [8, 12] leave a gap of 4 bytes after tensor 'a'", NULL, NULL, 0},
    {"first bytes unused", T1("F32", "[1]", "[4,8]"), 8, "leave the first 4 bytes", "a", NULL, 0},
    {"trailing bytes", T1("F32", "[1]", "[0,4]"), 6, "2 bytes after the last tensor", NULL, NULL,
     0},
    {"data but no tensors", "{}", 4, "4 bytes after the last tensor", NULL, NULL, 0},
    {"metadata not an object", "{\"__metadata__\":[\"a\"]}", 0, "not an object of strings", NULL,
     NULL, 0},
    {"metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0,
     "\"__metadata__\" value of 'k' is not a string", NULL, NULL, 0},
    {"metadata value with NUL", "{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0,
     "value of 'k' contains a NUL", NULL, NULL, 0},
};

static void check_bad(const char *label, const char *path, const char *fragment,
                      const char *tensor)
{
    sd_st_file f;
    sd_err err;
    memset(&err, 0, sizeof err);
    memset(&f, 0x5a, sizeof f); /* open must not rely on a zeroed struct */
    int rc = sd_st_open(path, &f, &err);
    char quoted[256] = "";
    if (tensor)
        snprintf(quoted, sizeof quoted, "'%s'", tensor);
    int ok = rc != 0 && strncmp(err.msg, path, strlen(path)) == 0 && strstr(err.msg, fragment) &&
             (!tensor || strstr(err.msg, quoted)) && f.map == NULL && f.tensors == NULL;
    tap_ok(ok, "rejects %s: %s", label, err.msg);
    if (!ok)
        tap_diag("expected fragment: %s", fragment);
    if (rc == 0)
        sd_st_close(&f);
}

static void test_malformed(void)
{
    const char *path = tmp_path("bad.safetensors");
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        if (c->header) {
            size_t hlen = strlen(c->header);
            unsigned char *zeros = calloc(1, c->data_len + 1);
            write_st(path, c->header, hlen, zeros, c->data_len);
            free(zeros);
        } else {
            write_bytes(path, c->raw, c->raw_len);
        }
        check_bad(c->label, path, c->fragment, c->tensor);
    }

    /* Not files. */
    check_bad("a folder", tmpdir, "not a regular file", NULL);
    check_bad("a missing file", tmp_path("missing.safetensors"), "cannot open: No such file",
              NULL);

    /* Header length exactly at the limit + 1 with a real file of that size is the limit test
     * above; here a header just within the file but not JSON, padded with spaces. */
    {
        char name[300];
        memset(name, 'n', sizeof name);
        name[sizeof name - 1] = '\0';
        char header[512];
        snprintf(header, sizeof header,
                 "{\"%s\x01\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", name);
        write_st(path, header, strlen(header), "\0\0\0\0", 4);
        sd_st_file f;
        sd_err err;
        tap_ok(sd_st_open(path, &f, &err) != 0 && strlen(err.msg) < 600,
               "a long name is cut in messages (%zu chars)", strlen(err.msg));
        snprintf(header, sizeof header,
                 "{\"%s\\u0001\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", name);
        write_st(path, header, strlen(header), "\0\0\0\0", 4);
        tap_ok(sd_st_open(path, &f, &err) != 0 && strstr(err.msg, "nnn...'") &&
                   !strchr(err.msg, '\x01'),
               "long names end with '...', control characters never printed raw: %.80s...",
               err.msg);
    }
}

/* Inputs the reference accepts and so must we. */
static void test_accepted_variants(void)
{
    static const struct {
        const char *label, *header;
        size_t data_len, count;
    } ok_cases[] = {
        {"no tensors", "{}", 0, 0},
        {"JSON whitespace around the object", " \n\t{}\r\n  \t", 0, 0},
        {"metadata null", "{\"__metadata__\":null}", 0, 0},
        {"empty metadata", "{\"__metadata__\":{}}", 0, 0},
        {"unknown fields in an entry",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":{\"y\":[1,2]}}}", 4,
         1},
        {"surrogate pair in a name",
         "{\"\\ud83d\\ude00\\\\u\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, 1},
        {"escaped name", "{\"\\u0061\\/\\n\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
         2, 1},
        {"tensors listed out of data order",
         "{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, 2},
        {"empty tensors at the same offset",
         "{\"e1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"e2\":{\"dtype\":\"F16\",\"shape\":[3,0],\"data_offsets\":[4,4]}}", 4, 3},
        {"huge dimension with a zero dimension (within limits)",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[0,1000000000000],\"data_offsets\":[0,0]}}", 0, 1},
        {"8 dimensions", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}",
         2, 1},
        {"sub-byte dtype", "{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]}}", 2, 1},
        {"name with 'null' and 'NaN' inside strings",
         "{\"__metadata__\":{\"null\":\"NaN Infinity\"},\"a NaN\":{\"dtype\":\"U8\",\"shape\":[],"
         "\"data_offsets\":[0,1]}}", 1, 1},
        {"same keys in different objects",
         "{\"dtype\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]},"
         "\"shape\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[1,2]}}", 2, 2},
    };
    const char *path = tmp_path("ok.safetensors");
    for (size_t i = 0; i < sizeof ok_cases / sizeof ok_cases[0]; i++) {
        unsigned char zeros[8] = {0};
        write_st(path, ok_cases[i].header, strlen(ok_cases[i].header), zeros,
                 ok_cases[i].data_len);
        sd_st_file f;
        sd_err err = {0};
        int rc = sd_st_open(path, &f, &err);
        tap_ok(rc == 0 && sd_st_count(&f) == ok_cases[i].count, "accepts %s %s", ok_cases[i].label,
               err.msg);
        if (rc == 0 && strstr(ok_cases[i].label, "out of data order"))
            tap_ok(strcmp(sd_st_tensor_at(&f, 0)->name, "a") == 0, "iteration follows the data");
        if (rc == 0 && strstr(ok_cases[i].label, "surrogate pair"))
            tap_ok(sd_st_find(&f, "\xf0\x9f\x98\x80\\u") != NULL,
                   "surrogate pair decoded to UTF-8");
        if (rc == 0 && strstr(ok_cases[i].label, "escaped"))
            tap_ok(sd_st_find(&f, "a/\n") != NULL, "escaped name decoded");
        if (rc == 0 && strstr(ok_cases[i].label, "same offset"))
            tap_ok(strcmp(sd_st_tensor_at(&f, 0)->name, "a") == 0 &&
                       strcmp(sd_st_tensor_at(&f, 1)->name, "e1") == 0 &&
                       strcmp(sd_st_tensor_at(&f, 2)->name, "e2") == 0,
                   "ties in offset keep header order");
        if (rc == 0 && strstr(ok_cases[i].label, "'null'"))
            tap_ok(strcmp(sd_st_metadata(&f, "null"), "NaN Infinity") == 0, "metadata read");
        if (rc == 0)
            sd_st_close(&f);
    }
}

/* Every prefix of a valid file is invalid (the buffer must be covered exactly), and byte
 * mutations either open cleanly or fail with a message; none may crash (run under ASan). */
static void test_mutations(void)
{
    char gpath[1024];
    snprintf(gpath, sizeof gpath, "%s/golden.safetensors", datadir);
    size_t n = 0;
    char *orig = read_all(gpath, &n);
    if (!tap_ok(orig != NULL, "golden read for mutations"))
        return;
    const char *path = tmp_path("mut.safetensors");
    sd_st_file f;
    sd_err err;
    int all = 1;
    for (size_t len = 0; len < n; len++) {
        write_bytes(path, orig, len);
        int rc = sd_st_open(path, &f, &err);
        all &= rc != 0 && strncmp(err.msg, path, strlen(path)) == 0;
        if (rc == 0)
            sd_st_close(&f);
    }
    tap_ok(all, "all %zu truncations rejected with a message naming the file", n);

    static const unsigned char vals[] = {0x00, 0x01, 0x20, '"', '\\', '{', '}', '[', ']', ',',
                                         ':',  '0',  '9',  '-', 'e',  'N', 'x', 0x7f, 0xc3, 0xff};
    size_t opened = 0, rejected = 0, bad_msg = 0;
    char *mut = malloc(n);
    for (size_t pos = 0; pos < n; pos++) {
        for (size_t v = 0; v < sizeof vals; v++) {
            if ((unsigned char)orig[pos] == vals[v])
                continue;
            memcpy(mut, orig, n);
            mut[pos] = (char)vals[v];
            write_bytes(path, mut, n);
            if (sd_st_open(path, &f, &err) == 0) {
                /* Touch every byte and convert what converts. */
                unsigned sum = 0;
                for (size_t i = 0; i < sd_st_count(&f); i++) {
                    const sd_st_tensor *t = sd_st_tensor_at(&f, i);
                    for (size_t b = 0; b < t->nbytes; b++)
                        sum += ((const unsigned char *)t->data)[b];
                    float *buf = malloc(((size_t)t->numel + 1) * sizeof *buf);
                    sd_st_tensor_read_f32(t, buf, (size_t)t->numel, &err);
                    free(buf);
                    if (sd_st_find(&f, t->name) != t)
                        bad_msg++;
                }
                (void)sum;
                opened++;
                sd_st_close(&f);
            } else {
                rejected++;
                if (strncmp(err.msg, path, strlen(path)) != 0)
                    bad_msg++;
            }
        }
    }
    tap_ok(bad_msg == 0 && rejected > 0,
           "%zu single-byte mutations: %zu opened, %zu rejected, every message names the file",
           opened + rejected, opened, rejected);
    free(mut);
    free(orig);
}

/* ---- sets: single files, index files, folders ---------------------------------------------- */

static int write_shard(const char *path, const char *const *names, size_t n, float base)
{
    sd_err err;
    sd_st_writer *w = sd_st_writer_new();
    static float vals[16][2];
    int64_t s2 = 2;
    for (size_t i = 0; i < n; i++) {
        vals[i][0] = base + (float)i;
        vals[i][1] = -(base + (float)i);
        sd_st_writer_add(w, names[i], SD_ST_F32, 1, &s2, vals[i], 8, &err);
    }
    int rc = sd_st_writer_write(w, path, &err);
    sd_st_writer_free(w);
    return rc;
}

static void write_text(const char *path, const char *text)
{
    write_bytes(path, text, strlen(text));
}

static void check_set_bad(const char *label, const char *index, const char *fragment)
{
    sd_st_set s;
    sd_err err = {0};
    memset(&s, 0x5a, sizeof s);
    int rc = sd_st_set_open_index(&s, index, &err);
    int ok = rc != 0 && strstr(err.msg, fragment) && s.files == NULL;
    tap_ok(ok, "index %s rejected: %s", label, err.msg);
    if (!ok)
        tap_diag("expected fragment: %s", fragment);
    if (rc == 0)
        sd_st_set_close(&s);
}

static void test_sets(void)
{
    sd_err err = {0};
    sd_st_set s;
    char dir[512], p[600];
    float v[2];

    /* A sharded "unet" folder: only the index, no single file. */
    snprintf(dir, sizeof dir, "%s/unet", tmpdir);
    mkdir(dir, 0755);
    static const char *const s1[] = {"down.0.weight", "down.0.bias", "mid.weight"};
    static const char *const s2[] = {"up.0.weight", "conv_out.bias"};
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00001-of-00002.safetensors", dir);
    write_shard(p, s1, 3, 10.0f);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model-00002-of-00002.safetensors", dir);
    write_shard(p, s2, 2, 20.0f);
    const char *index_text =
        "{\"metadata\": {\"total_size\": 40},\n \"weight_map\": {\n"
        "  \"conv_out.bias\": \"diffusion_pytorch_model-00002-of-00002.safetensors\",\n"
        "  \"down.0.bias\": \"diffusion_pytorch_model-00001-of-00002.safetensors\",\n"
        "  \"down.0.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\",\n"
        "  \"mid.weight\": \"diffusion_pytorch_model-00001-of-00002.safetensors\",\n"
        "  \"up.0.weight\": \"diffusion_pytorch_model-00002-of-00002.safetensors\"\n }\n}\n";
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors.index.json", dir);
    write_text(p, index_text);

    tap_ok(sd_st_set_open_dir(&s, dir, NULL, &err) == 0,
           "sharded folder opens through its index: %s", err.msg);
    tap_ok(sd_st_set_count(&s) == 5 && s.n_files == 2 &&
               strstr(sd_st_set_source(&s), ".index.json"),
           "5 tensors in 2 shards");
    tap_ok(sd_st_set_read_f32(&s, "up.0.weight", v, 2, &err) == 0 && v[0] == 20.0f &&
               sd_st_set_read_f32(&s, "mid.weight", v, 2, &err) == 0 && v[0] == 12.0f &&
               v[1] == -12.0f,
           "tensors found across shards");
    tap_ok(strcmp(sd_st_set_tensor_at(&s, 0)->name, "down.0.bias") == 0 &&
               strcmp(sd_st_set_tensor_at(&s, 3)->name, "conv_out.bias") == 0 &&
               sd_st_set_tensor_at(&s, 5) == NULL,
           "iteration: shards in name order, each in data order");
    tap_ok(sd_st_set_read_f32(&s, "nope", v, 2, &err) != 0 && strstr(err.msg, ".index.json: ") &&
               strstr(err.msg, "no tensor 'nope'"),
           "missing tensor names the index: %s", err.msg);
    tap_ok(sd_st_set_find(&s, "down.0.weight") &&
               strstr(sd_st_set_find(&s, "down.0.weight")->file, "00001-of-00002"),
           "a tensor knows its shard file");
    sd_st_set_close(&s);
    sd_st_set_close(&s);

    /* A single file wins over an index beside it. */
    static const char *const one[] = {"only"};
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    write_shard(p, one, 1, 1.0f);
    tap_ok(sd_st_set_open_dir(&s, dir, NULL, &err) == 0 && sd_st_set_count(&s) == 1 &&
               sd_st_set_find(&s, "only"),
           "the single file is preferred to the index");
    sd_st_set_close(&s);
    tap_ok(sd_st_set_open_file(&s, p, &err) == 0 && sd_st_set_count(&s) == 1 &&
               strcmp(sd_st_set_source(&s), p) == 0,
           "set from one file");
    sd_st_set_close(&s);

    /* text_encoder: model.safetensors. */
    snprintf(dir, sizeof dir, "%s/text_encoder", tmpdir);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    static const char *const te[] = {"text_model.final_layer_norm.weight"};
    write_shard(p, te, 1, 3.0f);
    tap_ok(sd_st_set_open_dir(&s, dir, NULL, &err) == 0 &&
               sd_st_set_find(&s, "text_model.final_layer_norm.weight"),
           "model.safetensors is found in a text-encoder folder");
    sd_st_set_close(&s);
    snprintf(p, sizeof p, "%s/model.fp16.safetensors", dir);
    write_shard(p, te, 1, 4.0f);
    tap_ok(sd_st_set_open_dir(&s, dir, "model.fp16.safetensors", &err) == 0 &&
               sd_st_set_read_f32(&s, te[0], v, 2, &err) == 0 && v[0] == 4.0f,
           "an explicit base name (variant)");
    sd_st_set_close(&s);
    snprintf(dir, sizeof dir, "%s/empty_component", tmpdir);
    mkdir(dir, 0755);
    tap_ok(sd_st_set_open_dir(&s, dir, NULL, &err) != 0 &&
               strncmp(err.msg, dir, strlen(dir)) == 0 &&
               strstr(err.msg, "diffusion_pytorch_model.safetensors[.index.json], "
                               "model.safetensors[.index.json]"),
           "a folder without weights: %s", err.msg);
    snprintf(p, sizeof p, "%s/diffusion_pytorch_model.safetensors", dir);
    write_text(p, "garbage!");
    tap_ok(sd_st_set_open_dir(&s, dir, NULL, &err) != 0 && strncmp(err.msg, p, strlen(p)) == 0 &&
               s.files == NULL,
           "a bad single file is reported by its path: %s", err.msg);

    /* Broken indexes. */
    snprintf(dir, sizeof dir, "%s/shards", tmpdir);
    mkdir(dir, 0755);
    static const char *const a_b[] = {"a", "b"};
    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    write_shard(p, a_b, 2, 0.0f);
    static const char *const c_only[] = {"c"};
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    write_shard(p, c_only, 1, 0.0f);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    static const struct {
        const char *label, *text, *fragment;
    } idx[] = {
        {"valid", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                  "\"c\":\"s2.safetensors\"}}", NULL},
        {"missing shard file", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                               "\"c\":\"s3.safetensors\"}}",
         "shard 's3.safetensors': "},
        {"tensor not in its shard", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                                    "\"c\":\"s2.safetensors\",\"d\":\"s2.safetensors\"}}",
         "lists tensor 'd' in shard "},
        {"tensor in a shard but not in the index",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}",
         "tensor 'b' is not listed in the index"},
        {"tensor listed for another shard",
         "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\",\"c\":\"s1.safetensors\"}}",
         "lists tensor 'c' in shard "},
        {"duplicate tensor", "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                             "\"c\":\"s2.safetensors\",\"c\":\"s1.safetensors\"}}",
         "duplicate key 'c' in 'weight_map'"},
        {"climbing out", "{\"weight_map\":{\"a\":\"../s1.safetensors\"}}",
         "tensor 'a': shard file name '../s1.safetensors' is not a name inside"},
        {"absolute shard path", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "is not a name inside"},
        {"no weight_map", "{\"metadata\":{}}", "no \"weight_map\""},
        {"weight_map not an object", "{\"weight_map\":[]}", "\"weight_map\" is not an object"},
        {"shard not a string", "{\"weight_map\":{\"a\":1}}", "entry of tensor 'a' is not a string"},
        {"not JSON", "{\"weight_map\":", "index is not valid JSON"},
        {"empty file", "", "index is not valid JSON"},
    };
    for (size_t i = 0; i < sizeof idx / sizeof idx[0]; i++) {
        write_text(p, idx[i].text);
        if (!idx[i].fragment) {
            tap_ok(sd_st_set_open_index(&s, p, &err) == 0 && sd_st_set_count(&s) == 3,
                   "index %s opens: %s", idx[i].label, err.msg);
            sd_st_set_close(&s);
            continue;
        }
        check_set_bad(idx[i].label, p, idx[i].fragment);
    }
    check_set_bad("missing index file", tmp_path("none.index.json"), "cannot read");
    check_set_bad("a folder", tmp_path(""), "not a regular file");
    /* a FIFO is refused at once, not waited on (the alarm turns a hang into a failure) */
    const char *fifo = tmp_path("fifo.index.json");
    unlink(fifo);
    if (mkfifo(fifo, 0600) == 0) {
        alarm(60);
        check_set_bad("a FIFO", fifo, "not a regular file");
        alarm(0);
        unlink(fifo);
    }
}

/* Real files from diffusers and transformers: the tiny snapshots another test commits under
 * tests/data/models/ (F32, F16 and BF16 variants). Every component folder must open as a set
 * and every tensor convert to float. */
static void test_real_snapshots(const char *srcdir)
{
    static const char *const components[] = {"unet", "vae", "text_encoder"};
    char models[1024], dir[1400];
    snprintf(models, sizeof models, "%s/tests/data/models", srcdir);
    struct dirent **list = NULL;
    int n = scandir(models, &list, NULL, alphasort);
    if (n < 0) {
        tap_diag("no %s: real-snapshot checks not run", models);
        return;
    }
    for (int k = 0; k < n; k++) {
        const struct dirent *e = list[k];
        if (e->d_name[0] == '.')
            continue;
        for (size_t c = 0; c < 3; c++) {
            struct stat st;
            snprintf(dir, sizeof dir, "%s/%s/%s", models, e->d_name, components[c]);
            if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
                continue;
            sd_st_set s;
            sd_err err = {0};
            int ok = sd_st_set_open_dir(&s, dir, NULL, &err) == 0 && sd_st_set_count(&s) > 0;
            for (size_t i = 0; ok && i < sd_st_set_count(&s); i++) {
                const sd_st_tensor *t = sd_st_set_tensor_at(&s, i);
                float *buf = malloc(((size_t)t->numel + 1) * sizeof *buf);
                ok = sd_st_tensor_read_f32(t, buf, (size_t)t->numel, &err) == 0 ||
                     t->dtype == SD_ST_I64; /* position_ids in older text encoders */
                free(buf);
            }
            tap_ok(ok, "%s/%s: %zu tensors open and convert %s", e->d_name, components[c],
                   sd_st_set_count(&s), err.msg);
            sd_st_set_close(&s);
        }
    }
    for (int k = 0; k < n; k++)
        free(list[k]);
    free(list);
}

/* The file the reference script loads with Python (tests/reference/make_safetensors_goldens.py
 * --c-test): the writer set with several metadata keys. */
static int write_for_python(const char *dir)
{
    char path[1024];
    sd_err err;
    sd_st_writer *w = build_writer_set();
    if (!w)
        return 1;
    sd_st_writer_set_metadata(w, "producer", "sdtrain test_safetensors", &err);
    sd_st_writer_set_metadata(w, "empty", "", &err);
    snprintf(path, sizeof path, "%s/c_written.safetensors", dir);
    int rc = sd_st_writer_write(w, path, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    sd_st_writer_free(w);
    return rc ? 1 : 0;
}

static void test_dtypes(void)
{
    int ok = 1;
    for (int d = 0; d < SD_ST_DTYPE_COUNT; d++) {
        sd_st_dtype back;
        ok &= sd_st_dtype_from_name(sd_st_dtype_name((sd_st_dtype)d), &back) == 0 && (int)back == d;
        sd_dtype sd;
        if (sd_st_dtype_to_sd((sd_st_dtype)d, &sd) == 0)
            ok &= (int)sd_st_dtype_from_sd(sd) == d &&
                  strcmp(sd_dtype_name(sd), sd_st_dtype_name((sd_st_dtype)d)) == 0;
    }
    tap_ok(ok, "dtype names round-trip; sd_dtype mapping agrees with tensor.h names");
    sd_st_dtype x;
    tap_ok(sd_st_dtype_from_name("bf16", &x) != 0 && sd_st_dtype_from_name(NULL, &x) != 0 &&
               strcmp(sd_st_dtype_name((sd_st_dtype)-1), "?") == 0 &&
               sd_st_dtype_bits(SD_ST_F4) == 4 && sd_st_dtype_bits(SD_ST_C64) == 64 &&
               sd_st_dtype_from_sd((sd_dtype)77) == SD_ST_DTYPE_COUNT,
           "dtype edge cases");
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--write") == 0)
        return write_for_python(argv[2]);
    const char *srcdir = getenv("srcdir");
    static char dd[1024];
    snprintf(dd, sizeof dd, "%s/tests/data/safetensors", srcdir ? srcdir : ".");
    datadir = dd;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/sdtrain-st-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    test_dtypes();
    test_golden();
    test_writer_matches_reference();
    test_writer_errors();
    test_round_trip();
    test_unaligned();
    test_malformed();
    test_accepted_variants();
    test_mutations();
    test_sets();
    test_real_snapshots(srcdir ? srcdir : ".");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", tmpdir);
    return tap_done();
}
