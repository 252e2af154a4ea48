/* Latent shards: the collective parallel-HDF5 writer with its commit protocol, the manifest, and
 * the serial reader used by training ranks and sdtool. */
#include "sdtrain/shards.h"
#include "sdtrain/fsutil.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <hdf5.h>
#include <json-c/json.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/config.h"
#include "sdtrain/fault.h"
#include "sdtrain/h5check.h"
#include "sdtrain/h5util.h"
#include "sdtrain/hash.h"
#include "sdtrain/log.h"
#include "sdtrain/progress.h"
#include "sdtrain/runtime.h"
#include "sdtrain/version.h"

#if !defined(H5_HAVE_PARALLEL)
#error "latent shards need a parallel HDF5 build (H5_HAVE_PARALLEL)"
#endif

/* Rows of the small per-sample datasets (ids, strings) per chunk: about this many bytes, so a
 * shard of thousands of samples does not carry thousands of tiny chunks. */
#define SMALL_CHUNK_BYTES 65536
/* Bytes of samples a rank converts and writes per collective round: bounds the writer's scratch
 * memory whatever the slice size. */
#define ROUND_BYTES ((size_t)64 << 20)
#define CHECKSUM_ALGORITHM "sd-hash64-v1"
/* The datasets of a shard file (doc/shards.md); the latents' name carries the resolution. */
#define DS_LATENTS_FMT "image_latents_%d"
#define DS_EMB "caption_embeddings"
#define DS_IDS "caption_ids"
#define DS_CAP "caption"
#define DS_KEY "key"
#define DS_EMPTY "empty_caption_embedding"

/* ---- small helpers ------------------------------------------------------------------------- */

void sd_shard_meta_defaults(sd_shard_meta *m)
{
    memset(m, 0, sizeof *m);
    m->resolution = 512;
    m->latent_channels = SD_SHARD_LATENT_CHANNELS;
    m->text_len = SD_SHARD_TEXT_LEN;
    m->embed_dim = 1024;
    m->scaling_factor = SD_SHARD_SCALING_FACTOR;
    m->float_dtype = SD_F16;
}

void sd_shard_file_name(int64_t index, char *buf, size_t size)
{
    snprintf(buf, size, "shard-%06lld.h5", (long long)index);
}

static int join_path(char *out, size_t size, const char *dir, const char *name, sd_err *err)
{
    int n = snprintf(out, size, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= size)
        return sd_err_set(err, "path too long: '%s/%s'", dir, name);
    return 0;
}

/* Returns 1 and the byte length when s is valid UTF-8 (no overlongs, no surrogates). */
static int utf8_valid(const char *s, size_t *len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (p[i]) {
        unsigned c = p[i], need, min;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            need = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            need = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            need = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        for (unsigned k = 1; k <= need; k++) {
            if ((p[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += need + 1;
    }
    *len = i;
    return 1;
}

/* Ends this process the way a node failure would: no MPI_Finalize, no flush of HDF5 state. */
static void fault_kill(const char *phase)
{
    fprintf(stderr, "[rank %d] fault injection: killing this rank at phase '%s'\n", sd_log_rank(),
            phase);
    fflush(stderr);
    raise(SIGKILL);
    _exit(137);
}

/* ---- content hash (sd-hash64-v1, doc/shards.md) ---------------------------------------------
 * Per sample, a 64-bit hash chained over the stored bytes of its moments, embedding, ids,
 * caption and key; the shard checksum is a wrapping sum of mixed per-sample terms, so ranks
 * hash their own slices and one MPI sum combines them in any order. */
#define HASH_K1 0x9E3779B97F4A7C15ULL
#define HASH_K2 0xC2B2AE3D27D4EB4FULL

static uint64_t load_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t hash_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    h ^= (uint64_t)n * HASH_K1;
    for (; n >= 8; n -= 8, p += 8) {
        h ^= sd_fmix64(load_le64(p));
        h = ((h << 27) | (h >> 37)) * HASH_K1 + HASH_K2;
    }
    if (n) {
        unsigned char t[8] = {0};
        memcpy(t, p, n);
        h ^= sd_fmix64(load_le64(t));
        h = ((h << 27) | (h >> 37)) * HASH_K1 + HASH_K2;
    }
    return sd_fmix64(h);
}

static uint64_t sample_term(int64_t i, uint64_t h)
{
    return sd_fmix64(h + (uint64_t)(i + 1) * HASH_K1);
}

static uint64_t shard_terms(int64_t n, uint64_t empty_hash)
{
    return sd_fmix64((uint64_t)n ^ HASH_K2) + sd_fmix64(empty_hash);
}

/* Stored string bytes: up to the first NUL of the fixed-width field. */
static size_t field_len(const char *s, size_t width)
{
    const char *z = memchr(s, '\0', width);
    return z ? (size_t)(z - s) : width;
}

/* ---- HDF5 types ----------------------------------------------------------------------------- */

/* IEEE binary16 built exactly as h5py does, so numpy users get dtype float16. */
static hid_t make_f16_type(void)
{
    hid_t t;
    SD_H5_CHECK(t = H5Tcopy(H5T_IEEE_F32LE));
    SD_H5_CHECK(H5Tset_fields(t, 15, 10, 5, 0, 10));
    SD_H5_CHECK(H5Tset_size(t, 2));
    SD_H5_CHECK(H5Tset_ebias(t, 15));
    return t;
}

static hid_t make_str_type(size_t width)
{
    hid_t t;
    SD_H5_CHECK(t = H5Tcopy(H5T_C_S1));
    SD_H5_CHECK(H5Tset_size(t, width));
    SD_H5_CHECK(H5Tset_strpad(t, H5T_STR_NULLPAD));
    SD_H5_CHECK(H5Tset_cset(t, H5T_CSET_UTF8));
    return t;
}

/* ---- the manifest --------------------------------------------------------------------------- */

static int entry_cmp(const void *a, const void *b)
{
    const sd_shard_entry *x = a, *y = b;
    return (x->index > y->index) - (x->index < y->index);
}

void sd_shard_manifest_free(sd_shard_manifest *m)
{
    if (!m)
        return;
    free(m->entries);
    m->entries = NULL;
    m->n = 0;
    m->total_samples = 0;
}

const sd_shard_entry *sd_shard_manifest_find(const sd_shard_manifest *m, int64_t index)
{
    sd_shard_entry key;
    key.index = index;
    if (!m || m->n == 0)
        return NULL;
    return bsearch(&key, m->entries, (size_t)m->n, sizeof key, entry_cmp);
}

uint64_t sd_shard_key_hash(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    return h;
}

static int json_int_field(json_object *o, const char *name, int64_t lo, int64_t hi, int64_t *out,
                          const char *path, int64_t k, sd_err *err)
{
    json_object *v;
    if (!json_object_object_get_ex(o, name, &v))
        return sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld has no '%s'", path,
                          (long long)k, name);
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < lo ||
        json_object_get_int64(v) > hi)
        return sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld: '%s' must be an "
                               "integer from %lld to %lld", path, (long long)k, name, (long long)lo,
                          (long long)hi);
    *out = json_object_get_int64(v);
    return 0;
}

int sd_shard_manifest_parse_json(const char *path, const char *text, size_t len,
                                 sd_shard_manifest *m, sd_err *err)
{
    json_tokener *tok = json_tokener_new();
    json_object *root, *v, *shards;
    enum json_tokener_error jerr;
    size_t end;
    int rc = -1;
    memset(m, 0, sizeof *m);
    if (!tok)
        return sd_err_set(err, "%s: out of memory parsing the manifest", path);
    root = json_tokener_parse_ex(tok, text, (int)len);
    jerr = json_tokener_get_error(tok);
    end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || jerr != json_tokener_success) {
        sd_err_set(err, "%s: not a valid shard manifest: JSON error at byte %zu: %s", path, end,
                   jerr == json_tokener_continue ? "unexpected end of the file"
                                                 : json_tokener_error_desc(jerr));
        json_object_put(root);
        return -1;
    }
    while (end < len && (text[end] == ' ' || text[end] == '\n' || text[end] == '\t' || text[end] == '\r'))
        end++;
    if (end < len) {
        sd_err_set(err, "%s: not a valid shard manifest: unexpected data after the JSON object at byte %zu",
                   path, end);
        goto out;
    }
    if (!json_object_is_type(root, json_type_object) || !json_object_object_get_ex(root, "format", &v) ||
        !json_object_is_type(v, json_type_string) ||
        strcmp(json_object_get_string(v), SD_SHARD_MANIFEST_FORMAT) != 0) {
        sd_err_set(err, "%s: not a valid shard manifest: 'format' must be \"%s\"", path,
                   SD_SHARD_MANIFEST_FORMAT);
        goto out;
    }
    if (!json_object_object_get_ex(root, "version", &v) || !json_object_is_type(v, json_type_int)) {
        sd_err_set(err, "%s: not a valid shard manifest: no integer 'version'", path);
        goto out;
    }
    if (json_object_get_int64(v) != SD_SHARD_MANIFEST_VERSION) {
        sd_err_set(err, "%s: manifest version %lld is not one this sdtrain reads (%d)", path,
                   (long long)json_object_get_int64(v), SD_SHARD_MANIFEST_VERSION);
        goto out;
    }
    if (!json_object_object_get_ex(root, "shards", &shards) ||
        !json_object_is_type(shards, json_type_array)) {
        sd_err_set(err, "%s: not a valid shard manifest: no 'shards' array", path);
        goto out;
    }
    m->n = (int64_t)json_object_array_length(shards);
    m->entries = sd_xcalloc((size_t)m->n + 1, sizeof *m->entries);
    m->total_samples = 0;
    for (int64_t k = 0; k < m->n; k++) {
        json_object *o = json_object_array_get_idx(shards, (size_t)k), *f;
        sd_shard_entry *e = &m->entries[k];
        int64_t res;
        char want[64];
        const char *hex;
        char *hend;
        if (!json_object_is_type(o, json_type_object)) {
            sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld is not an object", path,
                       (long long)k);
            goto out;
        }
        /* Bounds no real shard comes near, so that sums and int conversions cannot overflow:
         * 2^40 samples would be a shard of petabytes; resolutions are the namelist's. */
        if (json_int_field(o, "index", 0, INT64_C(1) << 40, &e->index, path, k, err) ||
            json_int_field(o, "samples", 0, INT64_C(1) << 40, &e->samples, path, k, err) ||
            json_int_field(o, "bytes", 0, INT64_MAX, &e->bytes, path, k, err) ||
            json_int_field(o, "resolution", 8, 4096, &res, path, k, err))
            goto out;
        e->resolution = (int)res;
        sd_shard_file_name(e->index, want, sizeof want);
        /* The name is derived, never trusted: a manifest cannot point outside its directory. */
        if (!json_object_object_get_ex(o, "file", &f) || !json_object_is_type(f, json_type_string) ||
            strcmp(json_object_get_string(f), want) != 0) {
            sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld: 'file' must be \"%s\"",
                       path, (long long)k, want);
            goto out;
        }
        snprintf(e->file, sizeof e->file, "%s", want);
        if (!json_object_object_get_ex(o, "checksum", &f) || !json_object_is_type(f, json_type_string) ||
            strlen(hex = json_object_get_string(f)) != 16 || strspn(hex, "0123456789abcdef") != 16) {
            sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld: 'checksum' must be 16 "
                            "lower-case hex digits", path, (long long)k);
            goto out;
        }
        e->checksum = strtoull(hex, &hend, 16);
        if (json_object_object_get_ex(o, "range", &f)) {
            /* the planned range (optional: writers before 2026-11-27 leave it out) */
            json_object *kh;
            if (!json_object_is_type(f, json_type_object)) {
                sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld: 'range' must be "
                                "an object", path, (long long)k);
                goto out;
            }
            if (json_int_field(f, "first", 0, INT64_C(1) << 40, &e->range.first, path, k, err) ||
                json_int_field(f, "samples", 0, INT64_C(1) << 40, &e->range.samples, path, k, err))
                goto out;
            if (!json_object_object_get_ex(f, "first_key_fnv1a", &kh) ||
                !json_object_is_type(kh, json_type_string) ||
                strlen(hex = json_object_get_string(kh)) != 16 ||
                strspn(hex, "0123456789abcdef") != 16) {
                sd_err_set(err, "%s: not a valid shard manifest: shard entry %lld: "
                                "'range.first_key_fnv1a' must be 16 lower-case hex digits", path,
                           (long long)k);
                goto out;
            }
            e->range.key_hash = strtoull(hex, &hend, 16);
            e->has_range = 1;
        }
        if (m->total_samples > INT64_MAX - e->samples) {
            sd_err_set(err, "%s: not a valid shard manifest: more than 2^63 samples in all", path);
            goto out;
        }
        m->total_samples += e->samples;
    }
    /* The writer records the sum too; a file where they disagree was edited or damaged. */
    if (json_object_object_get_ex(root, "total_samples", &v) &&
        (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) != m->total_samples)) {
        sd_err_set(err, "%s: not a valid shard manifest: 'total_samples' is not the sum of the "
                        "shards' samples (%lld)", path, (long long)m->total_samples);
        goto out;
    }
    qsort(m->entries, (size_t)m->n, sizeof *m->entries, entry_cmp);
    for (int64_t k = 1; k < m->n; k++)
        if (m->entries[k].index == m->entries[k - 1].index) {
            sd_err_set(err, "%s: not a valid shard manifest: shard %lld is listed twice", path,
                       (long long)m->entries[k].index);
            goto out;
        }
    rc = 0;
out:
    json_object_put(root);
    if (rc)
        sd_shard_manifest_free(m);
    return rc;
}

/* ---- the manifest as manifest_write prints it, read without json-c --------------------------
 * A follow-mode trainer rereads the whole manifest at every commit: json-c's tree of 50,000
 * entries took 0.33 s of it, the scanner 0.024 s (bench/manifest_read). The scanner accepts exactly the writer's layout with valid entries
 * (every check of the json-c reader: bounds, canonical names, hex digits, the sum, order without
 * repeats) and declines anything else, which the json-c reader then reads or refuses with its
 * message: so the result never depends on which of the two read it. */
typedef struct scan {
    const char *p, *end;
} scan;

static int scan_lit(scan *c, const char *w)
{
    const size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0)
        return 0;
    c->p += n;
    return 1;
}

/* A non-negative decimal integer as %lld prints it (no sign, no leading zero) in [lo, hi]. */
static int scan_int(scan *c, int64_t lo, int64_t hi, int64_t *out)
{
    uint64_t v = 0;
    const char *q = c->p;
    while (q < c->end && *q >= '0' && *q <= '9' && q - c->p < 19)
        v = v * 10 + (uint64_t)(*q++ - '0');
    if (q == c->p || (q < c->end && *q >= '0' && *q <= '9') || (c->p[0] == '0' && q - c->p > 1) ||
        v > (uint64_t)INT64_MAX || (int64_t)v < lo || (int64_t)v > hi)
        return 0;
    c->p = q;
    *out = (int64_t)v;
    return 1;
}

/* "<16 lower-case hex digits>" */
static int scan_hex16(scan *c, uint64_t *out)
{
    uint64_t v = 0;
    if (c->end - c->p < 18 || c->p[0] != '"' || c->p[17] != '"')
        return 0;
    for (int k = 1; k <= 16; k++) {
        const char h = c->p[k];
        if (h >= '0' && h <= '9')
            v = v << 4 | (uint64_t)(h - '0');
        else if (h >= 'a' && h <= 'f')
            v = v << 4 | (uint64_t)(h - 'a' + 10);
        else
            return 0;
    }
    c->p += 18;
    *out = v;
    return 1;
}

/* One entry from its "{" line; 1, or 0 when the text is not the writer's valid entry. */
static int scan_entry(scan *c, sd_shard_entry *e)
{
    char want[64];
    int64_t res;
    memset(e, 0, sizeof *e);
    if (!scan_lit(c, "    {\n      \"index\": ") || !scan_int(c, 0, INT64_C(1) << 40, &e->index) ||
        !scan_lit(c, ",\n      \"file\": \""))
        return 0;
    sd_shard_file_name(e->index, want, sizeof want);
    if (!scan_lit(c, want) || !scan_lit(c, "\",\n      \"samples\": ") ||
        !scan_int(c, 0, INT64_C(1) << 40, &e->samples) ||
        !scan_lit(c, ",\n      \"bytes\": ") || !scan_int(c, 0, INT64_MAX, &e->bytes) ||
        !scan_lit(c, ",\n      \"resolution\": ") || !scan_int(c, 8, 4096, &res) ||
        !scan_lit(c, ",\n      \"checksum\": ") || !scan_hex16(c, &e->checksum))
        return 0;
    snprintf(e->file, sizeof e->file, "%s", want);
    e->resolution = (int)res;
    if (scan_lit(c, ",\n      \"range\": {\n        \"first\": ")) {
        if (!scan_int(c, 0, INT64_C(1) << 40, &e->range.first) ||
            !scan_lit(c, ",\n        \"samples\": ") ||
            !scan_int(c, 0, INT64_C(1) << 40, &e->range.samples) ||
            !scan_lit(c, ",\n        \"first_key_fnv1a\": ") || !scan_hex16(c, &e->range.key_hash) ||
            !scan_lit(c, "\n      }"))
            return 0;
        e->has_range = 1;
    }
    return scan_lit(c, "\n    }");
}

int sd_shard_manifest_scan(const char *text, size_t len, sd_shard_manifest *m)
{
    scan c = {text, text + len};
    char head[256];
    int64_t total, sum = 0;
    size_t cap = 0;
    memset(m, 0, sizeof *m);
    snprintf(head, sizeof head, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  "
             "\"checksum_algorithm\": \"%s\",\n  \"total_samples\": ", SD_SHARD_MANIFEST_FORMAT,
             SD_SHARD_MANIFEST_VERSION, CHECKSUM_ALGORITHM);
    if (!scan_lit(&c, head) || !scan_int(&c, 0, INT64_MAX, &total) ||
        !scan_lit(&c, ",\n  \"shards\": [\n"))
        return 0;
    if (!scan_lit(&c, "  ]")) {
        for (;;) {
            if ((size_t)m->n == cap) {
                cap = cap ? 2 * cap : 64;
                m->entries = sd_xrealloc(m->entries, cap * sizeof *m->entries);
            }
            sd_shard_entry *e = &m->entries[m->n];
            if (!scan_entry(&c, e) || (m->n > 0 && e->index <= m->entries[m->n - 1].index) ||
                __builtin_add_overflow(sum, e->samples, &sum))
                goto no;
            m->n++;
            if (scan_lit(&c, "\n  ]"))
                break;
            if (!scan_lit(&c, ",\n"))
                goto no;
        }
    }
    if (!scan_lit(&c, "\n}") || sum != total)
        goto no;
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\n' || *c.p == '\t' || *c.p == '\r'))
        c.p++;
    if (c.p != c.end)
        goto no;
    if (!m->entries)
        m->entries = sd_xcalloc(1, sizeof *m->entries);
    m->total_samples = total;
    return 1;
no:
    sd_shard_manifest_free(m);
    return 0;
}

int sd_shard_manifest_parse(const char *path, const char *text, size_t len, sd_shard_manifest *m,
                            sd_err *err)
{
    if (sd_shard_manifest_scan(text, len, m))
        return 0;
    return sd_shard_manifest_parse_json(path, text, len, m, err);
}

int sd_shard_manifest_read(const char *dir, sd_shard_manifest *m, sd_err *err)
{
    char path[SD_PATH_MAX + 32];
    struct stat st;
    void *text;
    size_t cap, len = 0;
    int fd, rc;
    memset(m, 0, sizeof *m);
    if (join_path(path, sizeof path, dir, SD_SHARD_MANIFEST, err))
        return -1;
    /* not fopen: a FIFO in its place (no writer) would hold the open, and the job with it */
    fd = sd_open_regular(path, &st);
    if (fd == -1) /* No manifest (or no directory yet): nothing is committed. */
        return errno == ENOENT ? 0 : sd_err_errno(err, errno, "cannot read shard manifest '%s'", path);
    if (fd < 0)
        return sd_err_set(err, "cannot read shard manifest '%s': not a regular file", path);
    if (st.st_size > (1L << 30)) {
        close(fd);
        return sd_err_set(err, "cannot read shard manifest '%s': %lld bytes, more than 1 GiB",
                          path, (long long)st.st_size);
    }
    cap = (size_t)st.st_size + 1; /* one read call when the size holds; more if it grew */
    text = sd_xmalloc(cap);
    if (sd_read_to_end(fd, &text, &cap, &len)) {
        const int e = errno;
        close(fd);
        free(text);
        return sd_err_errno(err, e, "cannot read shard manifest '%s'", path);
    }
    close(fd);
    if (len == 0) {
        free(text);
        return sd_err_set(err, "%s: not a valid shard manifest: the file is empty", path);
    }
    rc = sd_shard_manifest_parse(path, text, len, m, err);
    free(text);
    return rc;
}

int sd_shards_committed(const char *dir, sd_shard_manifest *m, sd_err *err)
{
    char path[SD_PATH_MAX + 80];
    if (sd_shard_manifest_read(dir, m, err))
        return -1;
    for (int64_t k = 0; k < m->n; k++) {
        const sd_shard_entry *e = &m->entries[k];
        struct stat st;
        if (join_path(path, sizeof path, dir, e->file, err))
            goto fail;
        if (sd_stat(path, &st) != 0) {
            sd_err_errno(err, errno, "%s/%s lists %s as committed, but it cannot be read", dir,
                         SD_SHARD_MANIFEST, path);
            goto fail;
        }
        if ((int64_t)st.st_size != e->bytes) {
            sd_err_set(err, "%s/%s lists %s with %lld bytes, but the file has %lld bytes (changed "
                            "after it was committed?)", dir, SD_SHARD_MANIFEST, path,
                       (long long)e->bytes, (long long)st.st_size);
            goto fail;
        }
    }
    return 0;
fail:
    sd_shard_manifest_free(m);
    return -1;
}

/* The manifest rank 0 of the writers last wrote, and the identity of that file (device, inode,
 * size, modification time). Each commit is a read-modify-write of the whole manifest, checked
 * before the data is written and redone at the commit: parsing it twice took most of a commit
 * once a directory held tens of thousands of shards (0.7 s of 1.3 s at 50,000, growing with
 * each). A manifest replaced since (every commit renames a new file over it), or one this
 * process did not write, has another identity and is read again. */
static struct {
    pthread_mutex_t mu;
    char dir[SD_PATH_MAX];
    struct stat st;
    sd_shard_manifest m;
} written = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino != 0 && a->st_ino == b->st_ino && a->st_dev == b->st_dev &&
           a->st_size == b->st_size && a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
           a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* After manifest_write: m is what dir's manifest, of identity *st (st_ino 0: unknown), holds. */
static void manifest_remember(const char *dir, const sd_shard_manifest *m, const struct stat *st)
{
    SD_CHECK(pthread_mutex_lock(&written.mu) == 0, "manifest cache lock");
    sd_shard_manifest_free(&written.m);
    written.dir[0] = '\0';
    if (st->st_ino != 0 && strlen(dir) < sizeof written.dir) {
        snprintf(written.dir, sizeof written.dir, "%s", dir);
        written.st = *st;
        written.m.n = m->n;
        written.m.total_samples = 0;
        written.m.entries = sd_xmalloc(((size_t)m->n + 1) * sizeof *m->entries);
        memcpy(written.m.entries, m->entries, (size_t)m->n * sizeof *m->entries);
        for (int64_t k = 0; k < m->n; k++)
            written.m.total_samples += m->entries[k].samples;
    }
    SD_CHECK(pthread_mutex_unlock(&written.mu) == 0, "manifest cache unlock");
}

/* sd_shard_manifest_read for the writer: a copy of the remembered manifest when dir's is still
 * the one this process wrote. */
static int manifest_read_writer(const char *dir, sd_shard_manifest *m, sd_err *err)
{
    char path[SD_PATH_MAX + 32];
    struct stat st;
    int hit = 0;
    if (join_path(path, sizeof path, dir, SD_SHARD_MANIFEST, err))
        return -1;
    SD_CHECK(pthread_mutex_lock(&written.mu) == 0, "manifest cache lock");
    if (written.dir[0] && strcmp(written.dir, dir) == 0 && sd_stat(path, &st) == 0 &&
        same_file(&st, &written.st)) {
        m->n = written.m.n;
        m->total_samples = written.m.total_samples;
        m->entries = sd_xmalloc(((size_t)m->n + 1) * sizeof *m->entries);
        memcpy(m->entries, written.m.entries, (size_t)m->n * sizeof *m->entries);
        hit = 1;
    }
    SD_CHECK(pthread_mutex_unlock(&written.mu) == 0, "manifest cache unlock");
    return hit ? 0 : sd_shard_manifest_read(dir, m, err);
}

char *sd_shard_manifest_text(const sd_shard_manifest *m, size_t *len)
{
    char *text = NULL;
    int64_t total = 0;
    FILE *f;
    for (int64_t k = 0; k < m->n; k++)
        total += m->entries[k].samples;
    /* Printed directly, as json-c's pretty printer lays it out: a json-c tree of every entry
     * cost more than the data (0.6 s per commit at 50,000 shards). The names and hex digits
     * need no escaping. sd_shard_manifest_scan reads this layout back. */
    f = open_memstream(&text, len);
    SD_CHECK(f != NULL, "open_memstream: %s", strerror(errno));
    fprintf(f, "{\n  \"format\": \"%s\",\n  \"version\": %d,\n  \"checksum_algorithm\": \"%s\",\n"
               "  \"total_samples\": %lld,\n  \"shards\": [\n",
            SD_SHARD_MANIFEST_FORMAT, SD_SHARD_MANIFEST_VERSION, CHECKSUM_ALGORITHM, (long long)total);
    for (int64_t k = 0; k < m->n; k++) {
        const sd_shard_entry *e = &m->entries[k];
        fprintf(f, "    {\n      \"index\": %lld,\n      \"file\": \"%s\",\n      \"samples\": %lld,\n"
                   "      \"bytes\": %lld,\n      \"resolution\": %d,\n      \"checksum\": \"%016llx\"",
                (long long)e->index, e->file, (long long)e->samples, (long long)e->bytes,
                e->resolution, (unsigned long long)e->checksum);
        if (e->has_range)
            fprintf(f, ",\n      \"range\": {\n        \"first\": %lld,\n        \"samples\": %lld,\n"
                       "        \"first_key_fnv1a\": \"%016llx\"\n      }",
                    (long long)e->range.first, (long long)e->range.samples,
                    (unsigned long long)e->range.key_hash);
        fprintf(f, "\n    }%s", k + 1 < m->n ? ",\n" : "\n");
    }
    fprintf(f, "  ]\n}\n");
    SD_CHECK(fclose(f) == 0, "printing the shard manifest: %s", strerror(errno));
    return text;
}

/* Writes the manifest atomically: readers see the old one or the new one, never a mix. *replaced
 * says whether the new one took the old one's place, which it has when only the final sync of the
 * directory fails. */
static int manifest_write(const char *dir, const sd_shard_manifest *m, int *replaced, sd_err *err)
{
    char path[SD_PATH_MAX + 32], tmp[SD_PATH_MAX + 48];
    char *text = NULL;
    size_t len = 0;
    struct stat st;
    int fd, rc = -1;
    if (join_path(path, sizeof path, dir, SD_SHARD_MANIFEST, err) ||
        join_path(tmp, sizeof tmp, dir, SD_SHARD_MANIFEST ".tmp", err))
        goto out;
    text = sd_shard_manifest_text(m, &len);
    fd = sd_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) {
        sd_err_set(err, "cannot write shard manifest '%s': %s", tmp, strerror(errno));
        goto out;
    }
    if (sd_pio_all(fd, text, len, 0, 1, NULL)) {
        sd_err_set(err, "cannot write shard manifest '%s': %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (sd_fsync_fd(fd) != 0) {
        sd_err_set(err, "cannot write shard manifest '%s': %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto out;
    }
    if (sd_fstat(fd, &st) != 0)
        memset(&st, 0, sizeof st); /* not remembered (manifest_remember) */
    if (close(fd) != 0 || sd_rename(tmp, path) != 0) {
        sd_err_set(err, "cannot replace shard manifest '%s': %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    *replaced = 1;
    manifest_remember(dir, m, &st);
    rc = sd_fsync_path(dir, err);
out:
    free(text);
    return rc;
}

/* ---- the collective writer ------------------------------------------------------------------ */

typedef struct writer {
    MPI_Comm comm;
    int rank, size, world_rank;
    const char *dir;
    int64_t index;
    const sd_shard_meta *meta;
    const sd_shard_batch *mine;
    const float *empty;
    /* geometry, identical on all ranks */
    int C2, hs, L, D;
    size_t fsz;            /* stored float bytes */
    size_t m_elems, e_elems;
    size_t cap_w, key_w;
    int64_t n_total, offset, round_samples, rounds;
    int64_t created;
    char file_name[64], final_path[SD_PATH_MAX + 80], tmp_path[SD_PATH_MAX + 80];
    uint64_t checksum_part;
    hid_t file, t_float, t_cap, t_key, dxpl;
    hid_t d_mom, d_emb, d_ids, d_cap, d_key, d_empty;
    /* direct: rank 0 made the file's structure alone, every rank pwrites its rows at the
     * datasets' offsets (addr, in the order of d_mom .. d_empty) through fd */
    int direct, fd;
    sd_writeback wb; /* the rows' writeback as they are written (fd) */
    uint64_t addr[6];
} writer;

/* Floats of one sample: moments (2C x h x w) and caption embedding (L x D); no overflow for
 * values within the SD_SHARD_MAX_* limits of each factor. */
static int64_t sample_floats(int64_t resolution, int64_t channels, int64_t text_len, int64_t dim)
{
    return 2 * channels * (resolution / 8) * (resolution / 8) + text_len * dim;
}

static int validate_local(writer *w, sd_err *e)
{
    const sd_shard_meta *m = w->meta;
    const sd_shard_batch *b = w->mine;
    char name[64];
    size_t len;
    if (!w->dir || !w->dir[0])
        return sd_err_set(e, "shard %lld: no shard directory given", (long long)w->index);
    if (w->index < 0)
        return sd_err_set(e, "shard index %lld in '%s' is negative", (long long)w->index, w->dir);
    sd_shard_file_name(w->index, name, sizeof name);
    if (!m || !b)
        return sd_err_set(e, "%s/%s: rank %d passed no metadata or no batch", w->dir, name, w->rank);
    if (m->resolution < 8 || m->resolution % 8 != 0 || m->resolution > SD_SHARD_MAX_RESOLUTION)
        return sd_err_set(e, "%s/%s: resolution %d is not a positive multiple of 8 up to %d", w->dir,
                          name, m->resolution, SD_SHARD_MAX_RESOLUTION);
    if (m->latent_channels < 1 || m->latent_channels > SD_SHARD_MAX_CHANNELS || m->text_len < 1 ||
        m->text_len > SD_SHARD_MAX_TEXT_LEN || m->embed_dim < 1 ||
        m->embed_dim > SD_SHARD_MAX_EMBED_DIM ||
        sample_floats(m->resolution, m->latent_channels, m->text_len, m->embed_dim) >
            SD_SHARD_MAX_SAMPLE_FLOATS)
        return sd_err_set(e, "%s/%s: invalid shapes: latent_channels %d, text_len %d, embed_dim %d",
                          w->dir, name, m->latent_channels, m->text_len, m->embed_dim);
    if (!(m->scaling_factor > 0) || !isfinite(m->scaling_factor))
        return sd_err_set(e, "%s/%s: invalid latent scaling factor %g", w->dir, name, m->scaling_factor);
    if (m->float_dtype != SD_F16 && m->float_dtype != SD_F32)
        return sd_err_set(e, "%s/%s: floats can be stored as F16 or F32, not %s", w->dir, name,
                          sd_dtype_name(m->float_dtype));
    if (!memchr(m->weights_path, '\0', sizeof m->weights_path) ||
        !memchr(m->weights_hash, '\0', sizeof m->weights_hash) ||
        !memchr(m->filter, '\0', sizeof m->filter) || !utf8_valid(m->weights_path, &len) ||
        !utf8_valid(m->weights_hash, &len) || !utf8_valid(m->filter, &len))
        return sd_err_set(e, "%s/%s: weights_path, weights_hash or filter is not a NUL-terminated "
                          "UTF-8 string", w->dir, name);
    if (b->n < 0)
        return sd_err_set(e, "%s/%s: rank %d contributes %lld samples", w->dir, name, w->rank,
                          (long long)b->n);
    if (b->layout != SD_LATENT_NCHW && b->layout != SD_LATENT_NHWC)
        return sd_err_set(e, "%s/%s: rank %d: unknown latent layout %d", w->dir, name, w->rank,
                          (int)b->layout);
    if (b->n > 0 && (!b->moments || !b->embeddings || !b->ids || !b->captions || !b->keys))
        return sd_err_set(e, "%s/%s: rank %d contributes %lld samples but a data pointer is NULL",
                          w->dir, name, w->rank, (long long)b->n);
    if (w->rank == 0 && !w->empty)
        return sd_err_set(e, "%s/%s: rank 0 must pass the empty-caption embedding", w->dir, name);
    w->cap_w = w->key_w = 1;
    for (int64_t i = 0; i < b->n; i++) {
        const char *what = !b->captions[i] ? "caption" : !b->keys[i] ? "key" : NULL;
        if (what)
            return sd_err_set(e, "%s/%s: rank %d: the %s of its sample %lld is NULL", w->dir, name,
                              w->rank, what, (long long)i);
        if (!utf8_valid(b->captions[i], &len))
            return sd_err_set(e, "%s/%s: rank %d: the caption of its sample %lld (key '%.200s') is "
                                 "not valid UTF-8", w->dir, name, w->rank, (long long)i, b->keys[i]);
        if (len > w->cap_w)
            w->cap_w = len;
        if (!utf8_valid(b->keys[i], &len))
            return sd_err_set(e, "%s/%s: rank %d: the key of its sample %lld is not valid UTF-8",
                              w->dir, name, w->rank, (long long)i);
        if (len > w->key_w)
            w->key_w = len;
    }
    if (w->cap_w > SD_SHARD_MAX_STRING || w->key_w > SD_SHARD_MAX_STRING)
        return sd_err_set(e, "%s/%s: rank %d: a caption or key of its samples is longer than %zu "
                          "bytes", w->dir, name, w->rank, SD_SHARD_MAX_STRING);
    return 0;
}

/* A fingerprint of everything the ranks must agree on, to catch callers that pass different
 * metadata on different ranks (that would corrupt the file or hang parallel HDF5). */
static uint64_t meta_fingerprint(const writer *w)
{
    const sd_shard_meta *m = w->meta;
    int64_t v[6] = {m->resolution, m->latent_channels, m->text_len, m->embed_dim, (int64_t)m->float_dtype,
                    w->index};
    uint64_t h = hash_bytes(0, v, sizeof v);
    h = hash_bytes(h, &m->scaling_factor, sizeof m->scaling_factor);
    h = hash_bytes(h, m->weights_path, strlen(m->weights_path));
    h = hash_bytes(h, m->weights_hash, strlen(m->weights_hash));
    h = hash_bytes(h, m->filter, strlen(m->filter));
    return hash_bytes(h, w->dir, strlen(w->dir));
}

static int64_t creation_time(void)
{
    /* Reproducible-builds convention: lets tests (and users who want it) pin the attribute. */
    const char *s = getenv("SOURCE_DATE_EPOCH");
    if (s && *s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (!*end && v >= 0)
            return v;
    }
    return (int64_t)time(NULL);
}

/* Rank 0's checks of the directory before anything is written. */
static int prepare_dir(writer *w, sd_err *e)
{
    sd_shard_manifest m;
    if (sd_mkdir_p(w->dir, "shard directory", e))
        return -1;
    if (manifest_read_writer(w->dir, &m, e))
        return -1;
    if (sd_shard_manifest_find(&m, w->index)) {
        sd_shard_manifest_free(&m);
        return sd_err_set(e, "%s is already committed in %s/%s: committed shards are never "
                             "rewritten (skip it, or remove its entry from the manifest first)",
                          w->final_path, w->dir, SD_SHARD_MANIFEST);
    }
    sd_shard_manifest_free(&m);
    if (access(w->dir, W_OK) != 0)
        return sd_err_set(e, "cannot write shards into '%s': %s", w->dir, strerror(errno));
    return 0;
}

int sd_shard_storable(const float *x, size_t n, sd_dtype dtype)
{
    const float limit = dtype == SD_F16 ? 65520.0f : INFINITY;
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= fabsf(x[i]) < limit; /* false for NaN */
    return ok;
}

double sd_shard_data_bytes(const sd_shard_meta *m, int64_t n, size_t cap_w, size_t key_w)
{
    const double fsz = m->float_dtype == SD_F16 ? 2.0 : 4.0;
    const double floats = (double)sample_floats(m->resolution, m->latent_channels, m->text_len,
                                                m->embed_dim);
    const double sample = floats * fsz + (double)m->text_len * 4.0 + (double)cap_w + (double)key_w;
    return (double)n * sample + (double)m->text_len * (double)m->embed_dim * fsz; /* + empty */
}

/* Rank 0, before the file is created: a write that fails half-way on a full disk cannot be
 * cleaned up and ends the job (sd_h5_end_job_if_write_failed); this refusal ends the run with
 * the committed shards intact and nothing half-written. The need is the data (the string widths
 * agreed over the ranks), 1 % and 1 MiB for HDF5's chunk index and headers (about 25 KiB for a
 * shard of 16 samples), and what &run io_alignment can add (a unit before each dataset that
 * reaches one). */
static int check_room(const writer *w, sd_err *e)
{
    const sd_shard_meta *m = w->meta;
    const double fsz = m->float_dtype == SD_F16 ? 2.0 : 4.0, n = (double)w->n_total;
    const double emb = (double)m->text_len * (double)m->embed_dim * fsz;
    const double small = n * ((double)m->text_len * 4.0 + (double)w->cap_w + (double)w->key_w);
    /* &run io_alignment: the contiguous latents and embeddings, the rows of the small datasets
     * in chunks of at most SMALL_CHUNK_BYTES, the empty caption's embedding */
    const double slack =
        sd_h5_alignment_slack(n * 2.0 * m->latent_channels * (double)(m->resolution / 8) *
                              (double)(m->resolution / 8) * fsz, 1.0) +
        sd_h5_alignment_slack(n * emb, 1.0) + sd_h5_alignment_slack(emb, 1.0) +
        sd_h5_alignment_slack(SMALL_CHUNK_BYTES, small / SMALL_CHUNK_BYTES + 3.0);
    const double need = 1.01 * sd_shard_data_bytes(m, w->n_total, w->cap_w, w->key_w) +
                        1048576.0 + slack;
    sd_err room;
    if (sd_fs_check_room(w->dir, need, &room) == 0)
        return 0;
    return sd_err_set(e, "%s not written: %s; the shards committed before are intact and a "
                      "rerun with room goes on from them", w->final_path, room.msg);
}

/* After a failure that leaves nothing of the shard (its temporary file removed, or the commit
 * undone): says what stays. -1. */
static int nothing_of_it(sd_err *e)
{
    const size_t len = strlen(e->msg);
    snprintf(e->msg + len, sizeof e->msg - len, "; the shard is not written, the shards committed "
             "before are intact and a rerun goes on from them");
    return -1;
}

static hid_t create_dataset(writer *w, const char *name, hid_t type, int nd, const hsize_t *dims,
                            const hsize_t *chunk)
{
    hid_t space, dcpl, d;
    SD_H5_CHECK(space = H5Screate_simple(nd, dims, NULL));
    SD_H5_CHECK(dcpl = H5Pcreate(H5P_DATASET_CREATE));
    if (chunk)
        SD_H5_CHECK(H5Pset_chunk(dcpl, nd, chunk));
    /* Parallel HDF5 allocates early anyway; skipping the fill saves writing every byte twice,
     * and every byte is written by exactly one rank. */
    SD_H5_CHECK(H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY));
    SD_H5_CHECK(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER));
    SD_H5_CHECK(d = H5Dcreate2(w->file, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT));
    SD_H5_CHECK(H5Pclose(dcpl));
    SD_H5_CHECK(H5Sclose(space));
    return d;
}

/* Rows per chunk of a small per-sample dataset of n rows; 0 for an empty shard, whose datasets
 * are contiguous (HDF5 refuses a chunk larger than a fixed dimension of 0). */
static hsize_t small_chunk_rows(size_t row_bytes, int64_t n)
{
    hsize_t rows = (hsize_t)(SMALL_CHUNK_BYTES / (row_bytes ? row_bytes : 1));
    if (rows < 1)
        rows = 1;
    if (rows > (hsize_t)n)
        rows = (hsize_t)n;
    return rows;
}

static void write_header(writer *w)
{
    const sd_shard_meta *m = w->meta;
    char created[64], latents[32], creator[160];
    const int empty = w->n_total == 0;
    time_t t = (time_t)w->created;
    struct tm tm;
    hsize_t dims[4], chunk[4];
    gmtime_r(&t, &tm);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(creator, sizeof creator, "sdtrain %s (git %s)", sd_version(), sd_git_revision());
    sd_h5_attr_str(w->file, "format", SD_SHARD_FORMAT);
    sd_h5_attr_i32(w->file, "format_version", SD_SHARD_FORMAT_VERSION);
    sd_h5_attr_i64(w->file, "shard_index", w->index);
    sd_h5_attr_i64(w->file, "num_samples", w->n_total);
    sd_h5_attr_i32(w->file, "resolution", m->resolution);
    sd_h5_attr_i32(w->file, "latent_channels", m->latent_channels);
    sd_h5_attr_i32(w->file, "latent_size", w->hs);
    sd_h5_attr_str(w->file, "latent_layout", "NCHW");
    sd_h5_attr_str(w->file, "latent_moments", "mean,logvar");
    sd_h5_attr_f64(w->file, "latent_scaling_factor", m->scaling_factor);
    sd_h5_attr_i32(w->file, "text_len", m->text_len);
    sd_h5_attr_i32(w->file, "embed_dim", m->embed_dim);
    sd_h5_attr_str(w->file, "float_dtype", m->float_dtype == SD_F16 ? "float16" : "float32");
    sd_h5_attr_str(w->file, "weights_path", m->weights_path);
    sd_h5_attr_str(w->file, "weights_hash", m->weights_hash);
    if (m->filter[0]) /* written by &data filter only: shards without one are as before */
        sd_h5_attr_str(w->file, "filter", m->filter);
    sd_h5_attr_str(w->file, "created", created);
    sd_h5_attr_str(w->file, "creator", creator);

    w->t_float = m->float_dtype == SD_F16 ? make_f16_type() : H5Tcopy(H5T_IEEE_F32LE);
    SD_H5_CHECK(w->t_float);
    w->t_cap = make_str_type(w->cap_w);
    w->t_key = make_str_type(w->key_w);

    snprintf(latents, sizeof latents, DS_LATENTS_FMT, m->resolution);
    dims[0] = (hsize_t)w->n_total, dims[1] = (hsize_t)w->C2, dims[2] = dims[3] = (hsize_t)w->hs;
    /* contiguous: each sample's row at a fixed offset, which the training loader reads without
     * HDF5 (sd_shard_direct; until 2026-11-27 one chunk a sample, which gave readers nothing
     * more). An empty shard (every sample of its range skipped) has zero rows, and its small
     * datasets are contiguous too. */
    {
        /* Test hook: SDTRAIN_TEST_SHARD_CHUNKED=1 writes the layout of the shards before, for
         * the tests of readers that meet them */
        const int old = !w->direct && !empty;
        chunk[0] = 1, chunk[1] = dims[1], chunk[2] = dims[2], chunk[3] = dims[3];
        w->d_mom = create_dataset(w, latents, w->t_float, 4, dims, old ? chunk : NULL);
        dims[1] = (hsize_t)w->L, dims[2] = (hsize_t)w->D;
        chunk[1] = dims[1], chunk[2] = dims[2];
        w->d_emb = create_dataset(w, DS_EMB, w->t_float, 3, dims, old ? chunk : NULL);
    }
    chunk[1] = dims[1];
    chunk[0] = small_chunk_rows((size_t)w->L * 4, w->n_total);
    w->d_ids = create_dataset(w, DS_IDS, H5T_STD_I32LE, 2, dims,
                              empty || w->direct ? NULL : chunk);
    chunk[0] = small_chunk_rows(w->cap_w, w->n_total);
    w->d_cap = create_dataset(w, DS_CAP, w->t_cap, 1, dims, empty || w->direct ? NULL : chunk);
    chunk[0] = small_chunk_rows(w->key_w, w->n_total);
    w->d_key = create_dataset(w, DS_KEY, w->t_key, 1, dims, empty || w->direct ? NULL : chunk);
    dims[0] = (hsize_t)w->L, dims[1] = (hsize_t)w->D;
    w->d_empty = create_dataset(w, DS_EMPTY, w->t_float, 2, dims, NULL);
}

/* Writes rows [row, row + cnt) of a dataset collectively; cnt may be 0 (an empty selection still
 * takes part in the collective). Returns -1 on failure and keeps the HDF5 message in e. */
static int write_rows_hdf5(writer *w, hid_t d, hid_t memtype, int64_t row, int64_t cnt,
                           const void *buf, sd_err *e);

/* Dataset k (0..5: latents, embeddings, ids, caption, key, empty caption's embedding): rows
 * [row, row + cnt) of row_bytes each, from buf. Direct: pwrite at the dataset's offset (the
 * stored bytes are the memory's: little-endian floats and ids, fixed-width strings); else a
 * collective HDF5 write (cnt may be 0: an empty selection still takes part). */
static int put_rows(writer *w, int k, hid_t d, hid_t memtype, int64_t row, int64_t cnt,
                    size_t row_bytes, const void *buf, sd_err *e)
{
    if (!w->direct)
        return write_rows_hdf5(w, d, memtype, row, cnt, buf, e);
    if (cnt <= 0)
        return 0;
    const int rc = sd_pwrite_streamed(&w->wb, buf, (size_t)cnt * row_bytes,
                                      w->addr[k] + (uint64_t)row * row_bytes);
    if (rc == -2) {
        if (!e->msg[0])
            sd_err_errno(e, errno, "cannot sync '%s'", w->tmp_path);
        return -1;
    }
    if (rc) {
        /* the dataset's name, as HDF5's message gives it (in the order of w->addr) */
        static const char *const names[6] = {NULL, DS_EMB, DS_IDS, DS_CAP, DS_KEY, DS_EMPTY};
        char name[64];
        const int en = errno;
        if (k == 0)
            snprintf(name, sizeof name, DS_LATENTS_FMT, w->meta->resolution);
        else
            snprintf(name, sizeof name, "%s", names[k]);
        if (!e->msg[0])
            sd_err_errno(e, en, "writing /%s of %s failed on rank %d", name, w->tmp_path,
                         w->rank);
        return -1;
    }
    return 0;
}

static int write_rows_hdf5(writer *w, hid_t d, hid_t memtype, int64_t row, int64_t cnt,
                           const void *buf, sd_err *e)
{
    hsize_t dims[4], start[4] = {0}, count[4];
    hid_t fspace, mspace;
    int nd;
    herr_t rc;
    static const char dummy[16];
    SD_H5_CHECK(fspace = H5Dget_space(d));
    SD_H5_CHECK(nd = H5Sget_simple_extent_dims(fspace, dims, NULL));
    for (int k = 0; k < nd; k++)
        count[k] = dims[k];
    count[0] = cnt > 0 ? (hsize_t)cnt : 1;
    SD_H5_CHECK(mspace = H5Screate_simple(nd, count, NULL));
    if (cnt > 0) {
        start[0] = (hsize_t)row;
        SD_H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, NULL, count, NULL));
    } else {
        SD_H5_CHECK(H5Sselect_none(fspace));
        SD_H5_CHECK(H5Sselect_none(mspace));
    }
    rc = H5Dwrite(d, memtype, mspace, fspace, w->dxpl, cnt > 0 ? buf : (const void *)dummy);
    if (rc < 0 && !e->msg[0]) {
        char name[128], h5msg[512];
        sd_h5_error_string(h5msg, sizeof h5msg); /* before H5Iget_name clears the stack */
        H5Iget_name(d, name, sizeof name);
        sd_err_set(e, "writing %s of %s failed on rank %d: %s", name, w->tmp_path, w->rank, h5msg);
    }
    SD_H5_CHECK(H5Sclose(mspace));
    SD_H5_CHECK(H5Sclose(fspace));
    return rc < 0 ? -1 : 0;
}

static void nhwc_to_nchw(const float *src, float *dst, int64_t n, int c, size_t hw)
{
    for (int64_t s = 0; s < n; s++, src += (size_t)c * hw, dst += (size_t)c * hw)
        for (size_t p = 0; p < hw; p++)
            for (int k = 0; k < c; k++)
                dst[(size_t)k * hw + p] = src[p * (size_t)c + (size_t)k];
}

static void nchw_to_nhwc(const float *src, float *dst, int64_t n, int c, size_t hw)
{
    for (int64_t s = 0; s < n; s++, src += (size_t)c * hw, dst += (size_t)c * hw)
        for (int k = 0; k < c; k++)
            for (size_t p = 0; p < hw; p++)
                dst[p * (size_t)c + (size_t)k] = src[(size_t)k * hw + p];
}

/* Converts, hashes and writes this rank's slice in rounds of round_samples; every rank runs the
 * same number of rounds, so the collective writes pair up. */
static int write_data(writer *w, sd_err *e)
{
    const sd_shard_batch *b = w->mine;
    int64_t B = w->round_samples;
    int failed = 0;
    int f16 = w->meta->float_dtype == SD_F16;
    float *mom_f32 = b->layout == SD_LATENT_NHWC ? sd_xmalloc((size_t)B * w->m_elems * sizeof(float)) : NULL;
    uint16_t *mom_f16 = f16 ? sd_xmalloc((size_t)B * w->m_elems * 2) : NULL;
    uint16_t *emb_f16 = f16 ? sd_xmalloc((size_t)B * w->e_elems * 2) : NULL;
    char *caps = sd_xmalloc((size_t)B * w->cap_w), *keys = sd_xmalloc((size_t)B * w->key_w);
    hid_t mt_float = f16 ? w->t_float : H5T_NATIVE_FLOAT;
    size_t mbytes = w->m_elems * w->fsz, ebytes = w->e_elems * w->fsz;

    for (int64_t r = 0; r < w->rounds; r++) {
        int64_t lo = r * B, cnt = b->n - lo < B ? b->n - lo : B;
        const void *mom = NULL, *emb = NULL;
        const int32_t *ids = NULL;
        if (cnt < 0)
            cnt = 0;
        if (cnt > 0) {
            const float *src = b->moments + (size_t)lo * w->m_elems;
            if (mom_f32) {
                nhwc_to_nchw(src, mom_f32, cnt, w->C2, (size_t)w->hs * (size_t)w->hs);
                src = mom_f32;
            }
            if (f16) {
                sd_f32_to_f16_array(src, mom_f16, (size_t)cnt * w->m_elems);
                mom = mom_f16;
                sd_f32_to_f16_array(b->embeddings + (size_t)lo * w->e_elems, emb_f16,
                                    (size_t)cnt * w->e_elems);
                emb = emb_f16;
            } else {
                mom = src;
                emb = b->embeddings + (size_t)lo * w->e_elems;
            }
            ids = b->ids + (size_t)lo * (size_t)w->L;
            memset(caps, 0, (size_t)cnt * w->cap_w);
            memset(keys, 0, (size_t)cnt * w->key_w);
            for (int64_t i = 0; i < cnt; i++) {
                const char *c = b->captions[lo + i], *k = b->keys[lo + i];
                size_t lc = strlen(c), lk = strlen(k);
                uint64_t h;
                memcpy(caps + (size_t)i * w->cap_w, c, lc);
                memcpy(keys + (size_t)i * w->key_w, k, lk);
                h = hash_bytes(0, (const char *)mom + (size_t)i * mbytes, mbytes);
                h = hash_bytes(h, (const char *)emb + (size_t)i * ebytes, ebytes);
                h = hash_bytes(h, ids + (size_t)i * (size_t)w->L, (size_t)w->L * 4);
                h = hash_bytes(h, c, lc);
                h = hash_bytes(h, k, lk);
                w->checksum_part += sample_term(w->offset + lo + i, h);
            }
        }
        failed |= put_rows(w, 0, w->d_mom, mt_float, w->offset + lo, cnt, mbytes, mom, e);
        /* A node failure in the middle of a shard: the temporary file holds part of the data. */
        if (r == 0 && sd_fault_armed(SD_FAULT_KILL, w->world_rank, -1, "shard-write"))
            fault_kill("shard-write");
        if (r == 0 && sd_fault_armed(SD_FAULT_HANG, w->world_rank, -1, "shard-write"))
            sd_fault_hang(w->world_rank, "writing a shard", -1);
        failed |= put_rows(w, 1, w->d_emb, mt_float, w->offset + lo, cnt, ebytes, emb, e);
        failed |= put_rows(w, 2, w->d_ids, H5T_NATIVE_INT32, w->offset + lo, cnt,
                           (size_t)w->L * 4, ids, e);
        failed |= put_rows(w, 3, w->d_cap, w->t_cap, w->offset + lo, cnt, w->cap_w, caps, e);
        failed |= put_rows(w, 4, w->d_key, w->t_key, w->offset + lo, cnt, w->key_w, keys, e);
    }

    {
        /* The empty-caption embedding: rank 0 selects it, the others take part with nothing. */
        int64_t cnt = w->rank == 0 ? w->L : 0;
        void *buf = NULL;
        uint16_t *e16 = NULL;
        if (w->rank == 0) {
            if (f16) {
                e16 = sd_xmalloc(w->e_elems * 2);
                sd_f32_to_f16_array(w->empty, e16, w->e_elems);
                buf = e16;
            } else {
                buf = (void *)w->empty;
            }
            w->checksum_part += shard_terms(w->n_total, hash_bytes(0, buf, w->e_elems * w->fsz));
        }
        failed |= put_rows(w, 5, w->d_empty, mt_float, 0, cnt, ebytes / (size_t)w->L, buf, e);
        free(e16);
    }
    free(mom_f32);
    free(mom_f16);
    free(emb_f16);
    free(caps);
    free(keys);
    return failed ? -1 : 0;
}

static void close_objects(writer *w)
{
    hid_t *ids[] = {&w->d_mom, &w->d_emb, &w->d_ids, &w->d_cap, &w->d_key, &w->d_empty};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++)
        if (*ids[k] > 0) {
            SD_H5_CHECK(H5Dclose(*ids[k]));
            *ids[k] = -1;
        }
    if (w->t_float > 0)
        SD_H5_CHECK(H5Tclose(w->t_float));
    if (w->t_cap > 0)
        SD_H5_CHECK(H5Tclose(w->t_cap));
    if (w->t_key > 0)
        SD_H5_CHECK(H5Tclose(w->t_key));
    if (w->dxpl > 0)
        SD_H5_CHECK(H5Pclose(w->dxpl));
    w->t_float = w->t_cap = w->t_key = w->dxpl = -1;
}

/* Rank 0, once every rank has closed and synced the temporary file: rename it, and enter it
 * into the manifest. */
static int commit(writer *w, sd_shard_entry *entry, sd_err *e)
{
    struct stat st;
    sd_shard_manifest m;
    sd_shard_entry *grown;
    int replaced = 0;
    if (sd_stat(w->tmp_path, &st) != 0) {
        sd_err_set(e, "cannot stat '%s': %s", w->tmp_path, strerror(errno));
        goto drop_tmp;
    }
    entry->bytes = (int64_t)st.st_size;
    if (sd_rename(w->tmp_path, w->final_path) != 0) {
        sd_err_set(e, "cannot rename '%s' to '%s': %s", w->tmp_path, w->final_path, strerror(errno));
        goto drop_tmp;
    }
    if (sd_fsync_path(w->dir, e))
        goto drop_final;
    /* A node failure between rename and manifest: a complete file that no reader may use. */
    if (sd_fault_armed(SD_FAULT_KILL, w->world_rank, -1, "shard-commit"))
        fault_kill("shard-commit");
    if (manifest_read_writer(w->dir, &m, e))
        goto drop_final;
    grown = sd_xrealloc(m.entries, ((size_t)m.n + 1) * sizeof *grown);
    grown[m.n] = *entry;
    m.entries = grown;
    m.n++;
    qsort(m.entries, (size_t)m.n, sizeof *m.entries, entry_cmp);
    if (manifest_write(w->dir, &m, &replaced, e)) {
        sd_shard_manifest_free(&m);
        if (!replaced)
            goto drop_final;
        /* the manifest names the shard already: removing the file would leave a manifest that
         * lists a missing shard, which no rerun gets past */
        const size_t len = strlen(e->msg);
        snprintf(e->msg + len, sizeof e->msg - len, "; the manifest listing %s had replaced the "
                 "old one: the shard stays committed, though the storage may not hold it durably, "
                 "and a rerun goes on from it", w->file_name);
        return -1;
    }
    sd_shard_manifest_free(&m);
    return 0;
drop_tmp:
    unlink(w->tmp_path);
    return nothing_of_it(e);
drop_final:
    unlink(w->final_path);
    return nothing_of_it(e);
}

static int shard_write(writer *w, sd_shard_entry *out, sd_err *e)
{
    const sd_shard_meta *m;
    int64_t *counts, maxv[4], v[4];
    uint64_t fp, checksum = 0;
    size_t sample_bytes;
    sd_shard_entry entry;

    SD_MPI_CHECK(MPI_Comm_rank(w->comm, &w->rank));
    SD_MPI_CHECK(MPI_Comm_size(w->comm, &w->size));
    SD_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w->world_rank));
    w->file = w->t_float = w->t_cap = w->t_key = w->dxpl = -1;
    w->d_mom = w->d_emb = w->d_ids = w->d_cap = w->d_key = w->d_empty = -1;

    /* 1. Inputs, checked on every rank; then every rank must hold the same metadata. */
    if (sd_agree(w->comm, validate_local(w, e) != 0, e))
        return -1;
    m = w->meta;
    fp = meta_fingerprint(w);
    v[0] = (int64_t)w->cap_w, v[1] = (int64_t)w->key_w, v[2] = (int64_t)(fp >> 2), v[3] = -(int64_t)(fp >> 2);
    SD_MPI_CHECK(MPI_Allreduce(v, maxv, 4, MPI_INT64_T, MPI_MAX, w->comm));
    sd_shard_file_name(w->index, w->file_name, sizeof w->file_name);
    if (maxv[2] != -maxv[3])
        return sd_err_set(e, "%s/%s: the ranks passed different shard metadata (resolution, shapes, "
                             "dtype, weights or directory must be the same on every rank)",
                          w->dir, w->file_name);
    w->cap_w = (size_t)maxv[0];
    w->key_w = (size_t)maxv[1];
    w->C2 = 2 * m->latent_channels;
    w->hs = m->resolution / 8;
    w->L = m->text_len;
    w->D = m->embed_dim;
    w->fsz = m->float_dtype == SD_F16 ? 2 : 4;
    w->m_elems = (size_t)w->C2 * (size_t)w->hs * (size_t)w->hs;
    w->e_elems = (size_t)w->L * (size_t)w->D;
    {
        char tmp_name[80];
        snprintf(tmp_name, sizeof tmp_name, ".%s.tmp", w->file_name);
        if (join_path(w->final_path, sizeof w->final_path, w->dir, w->file_name, e) ||
            join_path(w->tmp_path, sizeof w->tmp_path, w->dir, tmp_name, e))
            return -1; /* the same on every rank */
    }

    /* 2. Rank 0 checks the directory and that the shard is not committed yet. */
    if (sd_agree(w->comm, w->rank == 0 && prepare_dir(w, e) != 0, e))
        return -1;
    w->created = creation_time();
    SD_MPI_CHECK(MPI_Bcast(&w->created, 1, MPI_INT64_T, 0, w->comm));

    /* 3. Where each rank's slice goes. */
    counts = sd_xmalloc((size_t)w->size * sizeof *counts);
    SD_MPI_CHECK(MPI_Allgather(&w->mine->n, 1, MPI_INT64_T, counts, 1, MPI_INT64_T, w->comm));
    w->offset = w->n_total = 0;
    {
        int64_t max_n = 0;
        for (int r = 0; r < w->size; r++) {
            if (r < w->rank)
                w->offset += counts[r];
            w->n_total += counts[r];
            if (counts[r] > max_n)
                max_n = counts[r];
        }
        sample_bytes = (w->m_elems + w->e_elems) * (w->fsz + 4) + (size_t)w->L * 4 + w->cap_w + w->key_w;
        w->round_samples = (int64_t)(ROUND_BYTES / sample_bytes);
        if (w->round_samples < 1)
            w->round_samples = 1;
        w->rounds = (max_n + w->round_samples - 1) / w->round_samples;
    }
    free(counts);
    /* n_total may be 0: an empty shard (every sample of its range was skipped) keeps the shards
     * numbered without gaps; its datasets have zero rows and no rank writes a round */
    if (sd_agree(w->comm, w->rank == 0 && check_room(w, e) != 0, e))
        return -1;

    {
        /* Test hook: SDTRAIN_TEST_SHARD_CHUNKED=1 writes the layout of the shards before
         * 2026-11-27 (latents and embeddings in a chunk a sample), collectively through parallel
         * HDF5 as they were written, for the tests of readers that meet such shards */
        const char *hook = getenv("SDTRAIN_TEST_SHARD_CHUNKED");
        w->direct = !(hook && *hook && strcmp(hook, "0") != 0 && w->n_total > 0);
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        w->direct = 0; /* the direct writes store the memory's bytes: little-endian only */
#endif
    }
    w->fd = -1;
    if (w->direct) {
        int failed = 0;
        /* 4. Rank 0 alone makes the file's structure (the datasets contiguous, allocated at
         * their offsets, no data), which every rank then fills with pwrite: a storage error
         * fails one rank's call, agreed below, never a collective half-way (a failure of the
         * metadata written at the close excepted: HDF5 cannot let go of that file) */
        if (w->rank == 0) {
            /* HDF5's own writes of the structure (at the create and the close) as one marked
             * call: a hang in them is reported with the file */
            sd_progress_io_enter_path("HDF5 write", w->tmp_path);
            w->file = sd_h5_create_local(w->tmp_path, e);
            failed = w->file < 0;
            if (!failed) {
                const hid_t *ds[6] = {&w->d_mom, &w->d_emb, &w->d_ids, &w->d_cap, &w->d_key,
                                      &w->d_empty};
                write_header(w);
                for (int k = 0; k < 6; k++) {
                    const haddr_t a = H5Dget_offset(*ds[k]);
                    w->addr[k] = a == HADDR_UNDEF ? UINT64_MAX : (uint64_t)a;
                }
                close_objects(w);
                sd_h5_close_local(w->file, w->tmp_path, "the shards committed before are intact "
                                  "and a rerun goes on from them");
                w->file = -1;
                for (int k = 0; k < 6 && !failed; k++)
                    if (w->addr[k] == UINT64_MAX && (k == 5 || w->n_total > 0))
                        failed = sd_err_set(e, "'%s': a dataset has no place in the file",
                                            w->tmp_path) != 0;
            }
            sd_progress_io_leave();
        }
        if (sd_agree(w->comm, failed, e)) {
            if (w->rank == 0)
                unlink(w->tmp_path);
            return nothing_of_it(e);
        }
        SD_MPI_CHECK(MPI_Bcast(w->addr, 6, MPI_UINT64_T, 0, w->comm));
        /* 5. Every rank writes its rows and syncs them on the descriptor that wrote them. */
        w->fd = sd_open(w->tmp_path, O_WRONLY | O_CLOEXEC, 0);
        if (w->fd < 0)
            failed = sd_err_errno(e, errno, "cannot open '%s' to write rank %d's rows",
                                  w->tmp_path, w->rank) != 0;
        else
            sd_writeback_init(&w->wb, w->fd);
        if (!failed) /* direct: write_data's HDF5 types go unused */
            failed = write_data(w, e) != 0;
        if (w->fd >= 0) {
            failed = sd_fsync_close(w->fd, w->tmp_path, failed, e);
            w->fd = -1;
        }
        if (sd_agree(w->comm, failed, e)) {
            if (w->rank == 0)
                unlink(w->tmp_path);
            return nothing_of_it(e);
        }
    } else {
        /* 4. Create the temporary file together. MPI_File_open is collective, so it fails
         * everywhere or nowhere; a split outcome cannot be cleaned up without a hang and ends
         * the job. */
        w->file = sd_h5_create_parallel(w->tmp_path, w->comm, e);
        if (w->file < 0) {
            sd_agree(w->comm, w->rank == 0, e);
            return -1;
        }
        /* 5. Attributes and datasets (collective metadata), then the data in collective
         * rounds. */
        write_header(w);
        SD_H5_CHECK(w->dxpl = H5Pcreate(H5P_DATASET_XFER));
        SD_H5_CHECK(H5Pset_dxpl_mpio(w->dxpl, H5FD_MPIO_COLLECTIVE));
        int failed = write_data(w, e) != 0;
        /* a failed write (a full disk) cannot be followed by more collective HDF5 calls */
        sd_h5_end_job_if_write_failed(w->comm, failed, e, w->tmp_path,
                                      "the shards committed before are intact and a rerun "
                                      "goes on from them");
        close_objects(w);
        if (H5Fclose(w->file) < 0 && !failed) {
            char h5msg[512];
            sd_err_set(e, "closing '%s' failed on rank %d: %s", w->tmp_path, w->rank,
                       sd_h5_error_string(h5msg, sizeof h5msg));
            failed = 1;
        }
        /* Every rank syncs the closed file: on a parallel file system each client flushes the
         * pages it wrote, so all of the data is on stable storage before rank 0 renames it. */
        if (!failed && sd_fsync_path(w->tmp_path, e))
            failed = 1;
        w->file = -1;
        if (sd_agree(w->comm, failed, e)) {
            if (w->rank == 0)
                unlink(w->tmp_path);
            return nothing_of_it(e);
        }
    }

    /* 6. Every rank succeeded: rank 0 commits. */
    SD_MPI_CHECK(MPI_Reduce(&w->checksum_part, &checksum, 1, MPI_UINT64_T, MPI_SUM, 0, w->comm));
    memset(&entry, 0, sizeof entry);
    entry.index = w->index;
    entry.samples = w->n_total;
    entry.resolution = m->resolution;
    entry.checksum = checksum;
    snprintf(entry.file, sizeof entry.file, "%s", w->file_name);
    if (w->mine->range) { /* rank 0's is the one committed */
        entry.has_range = 1;
        entry.range = *w->mine->range;
    }
    if (w->rank != 0 && sd_fault_armed(SD_FAULT_KILL, w->world_rank, -1, "shard-commit"))
        fault_kill("shard-commit");
    if (sd_agree(w->comm, w->rank == 0 && commit(w, &entry, e) != 0, e))
        return -1; /* commit said what stays */
    SD_MPI_CHECK(MPI_Bcast(&entry, (int)sizeof entry, MPI_BYTE, 0, w->comm));
    if (out)
        *out = entry;
    return 0;
}

int sd_shard_write(MPI_Comm comm, const char *dir, int64_t index, const sd_shard_meta *meta,
                   const float *empty_embedding, const sd_shard_batch *mine,
                   sd_shard_entry *committed, sd_err *err)
{
    writer w;
    sd_err e;
    sd_h5_quiet q;
    int rc;
    memset(&w, 0, sizeof w);
    sd_err_clear(&e);
    w.comm = comm;
    w.dir = dir;
    w.index = index;
    w.meta = meta;
    w.mine = mine;
    w.empty = empty_embedding;
    sd_h5_quiet_begin(&q);
    rc = shard_write(&w, committed, &e);
    sd_h5_quiet_end(&q);
    if (rc)
        sd_err_set(err, "%s", e.msg);
    return rc;
}

/* ---- the reader ----------------------------------------------------------------------------- */

struct sd_shard {
    hid_t file;
    hid_t d_mom, d_emb, d_ids, d_cap, d_key, d_empty;
    hid_t t_float;  /* memory type for raw stored floats */
    sd_shard_info info;
};

/* err after a failed HDF5 call on a shard (call it right after): when the file driver reported
 * a storage failure (sd_h5_storage_errno) the message says so and err->storage is set, for a
 * retry may read the shard; otherwise HDF5's own message (the data is damaged or foreign). */
static int h5_fail(sd_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static int h5_fail(sd_err *err, const char *fmt, ...)
{
    char h5msg[512], what[SD_PATH_MAX + 200];
    va_list ap;
    const int e = sd_h5_storage_errno();
    sd_h5_error_string(h5msg, sizeof h5msg);
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (e)
        return sd_err_set_storage(err, "%s: %s (a storage error, not damage: the shard may be "
                                  "intact)", what, strerror(e));
    return sd_err_set(err, "%s: %s", what, h5msg);
}

/* A failed attribute read (a damaged heap, or the storage failing) is an error naming the file,
 * not the end of the job. */
static int attr_read_failed(const char *name, sd_shard *s, hid_t a, hid_t t, hid_t mt, sd_err *err)
{
    h5_fail(err, "%s: cannot read attribute '%s'", s->info.path, name);
    if (mt >= 0)
        H5Tclose(mt);
    H5Tclose(t);
    H5Aclose(a);
    return -1;
}

static int read_attr_raw(hid_t loc, const char *name, hid_t want_class, sd_shard *s, hid_t *attr,
                         hid_t *type, sd_err *err)
{
    htri_t exists = H5Aexists(loc, name);
    hid_t space;
    if (exists < 0)
        return h5_fail(err, "%s: cannot look up attribute '%s'", s->info.path, name);
    if (exists == 0)
        return sd_err_set(err, "%s: attribute '%s' is missing", s->info.path, name);
    *attr = H5Aopen(loc, name, H5P_DEFAULT);
    *type = *attr < 0 ? -1 : H5Aget_type(*attr);
    space = *type < 0 ? -1 : H5Aget_space(*attr);
    if (space < 0) {
        h5_fail(err, "%s: cannot open attribute '%s'", s->info.path, name);
        if (*type >= 0)
            H5Tclose(*type);
        if (*attr >= 0)
            H5Aclose(*attr);
        return -1;
    }
    if (H5Tget_class(*type) != want_class || H5Sget_simple_extent_npoints(space) != 1) {
        SD_H5_CHECK(H5Sclose(space));
        SD_H5_CHECK(H5Tclose(*type));
        SD_H5_CHECK(H5Aclose(*attr));
        return sd_err_set(err, "%s: attribute '%s' has the wrong type or shape", s->info.path, name);
    }
    SD_H5_CHECK(H5Sclose(space));
    return 0;
}

static int read_attr_str(hid_t loc, const char *name, char *buf, size_t size, sd_shard *s, sd_err *err)
{
    hid_t a, t, mt;
    if (read_attr_raw(loc, name, H5T_STRING, s, &a, &t, err))
        return -1;
    if (H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        SD_H5_CHECK(mt = H5Tcopy(H5T_C_S1));
        SD_H5_CHECK(H5Tset_size(mt, H5T_VARIABLE));
        SD_H5_CHECK(H5Tset_cset(mt, H5Tget_cset(t)));
        if (H5Aread(a, mt, &v) < 0)
            return attr_read_failed(name, s, a, t, mt, err);
        snprintf(buf, size, "%s", v ? v : "");
        H5free_memory(v);
    } else {
        size_t w = H5Tget_size(t);
        char *tmp = sd_xcalloc(w + 1, 1);
        SD_H5_CHECK(mt = H5Tcopy(t));
        if (H5Aread(a, mt, tmp) < 0) {
            free(tmp);
            return attr_read_failed(name, s, a, t, mt, err);
        }
        snprintf(buf, size, "%s", tmp);
        free(tmp);
    }
    SD_H5_CHECK(H5Tclose(mt));
    SD_H5_CHECK(H5Tclose(t));
    SD_H5_CHECK(H5Aclose(a));
    return 0;
}

static int read_attr_i64(hid_t loc, const char *name, int64_t *out, sd_shard *s, sd_err *err)
{
    hid_t a, t;
    if (read_attr_raw(loc, name, H5T_INTEGER, s, &a, &t, err))
        return -1;
    if (H5Aread(a, H5T_NATIVE_INT64, out) < 0)
        return attr_read_failed(name, s, a, t, -1, err);
    SD_H5_CHECK(H5Tclose(t));
    SD_H5_CHECK(H5Aclose(a));
    return 0;
}

static int read_attr_f64(hid_t loc, const char *name, double *out, sd_shard *s, sd_err *err)
{
    hid_t a, t;
    if (read_attr_raw(loc, name, H5T_FLOAT, s, &a, &t, err))
        return -1;
    if (H5Aread(a, H5T_NATIVE_DOUBLE, out) < 0)
        return attr_read_failed(name, s, a, t, -1, err);
    SD_H5_CHECK(H5Tclose(t));
    SD_H5_CHECK(H5Aclose(a));
    return 0;
}

/* Opens a dataset and checks its type class, element size and dimensions (-1 = any, then
 * returned in dims). */
static int open_dataset(sd_shard *s, const char *name, H5T_class_t cls, size_t elem, int nd,
                        hsize_t *dims, hid_t *out, sd_err *err)
{
    hid_t d, t, space;
    hsize_t got[8], want_dims[8];
    int gnd, ok;
    htri_t exists = H5Lexists(s->file, name, H5P_DEFAULT);
    memcpy(want_dims, dims, (size_t)nd * sizeof *dims);
    if (exists < 0)
        return h5_fail(err, "%s: cannot look up dataset '%s'", s->info.path, name);
    if (exists == 0)
        return sd_err_set(err, "%s: dataset '%s' is missing", s->info.path, name);
    d = H5Dopen2(s->file, name, H5P_DEFAULT);
    if (d < 0) {
        /* the storage failing to deliver its header, or something else under that name */
        if (sd_h5_storage_errno())
            return h5_fail(err, "%s: cannot open dataset '%s'", s->info.path, name);
        return sd_err_set(err, "%s: '%s' is not a dataset", s->info.path, name);
    }
    SD_H5_CHECK(t = H5Dget_type(d));
    SD_H5_CHECK(space = H5Dget_space(d));
    gnd = H5Sget_simple_extent_ndims(space);
    ok = H5Tget_class(t) == cls && (elem == 0 || H5Tget_size(t) == elem) && gnd == nd;
    if (ok && cls == H5T_STRING)
        ok = H5Tis_variable_str(t) == 0;
    if (ok) {
        SD_H5_CHECK(H5Sget_simple_extent_dims(space, got, NULL));
        for (int k = 0; k < nd; k++) {
            if (dims[k] != (hsize_t)-1 && dims[k] != got[k])
                ok = 0;
            dims[k] = got[k];
        }
    }
    if (!ok) {
        char want[160], have[160];
        int64_t wd[8], hd[8];
        for (int k = 0; k < nd; k++)
            wd[k] = (int64_t)want_dims[k];
        sd_shape_str(nd, wd, want, sizeof want);
        if (gnd < 0 || gnd > 8 || H5Sget_simple_extent_dims(space, got, NULL) < 0) {
            snprintf(have, sizeof have, "?");
        } else {
            for (int k = 0; k < gnd; k++)
                hd[k] = (int64_t)got[k];
            sd_shape_str(gnd, hd, have, sizeof have);
        }
        H5Sclose(space);
        H5Tclose(t);
        H5Dclose(d);
        return sd_err_set(err, "%s: dataset '%s' has the wrong type or shape %s (expected %s%s "
                               "elements, shape %s)", s->info.path, name, have,
                          elem == 2 ? "16-bit " : elem == 4 ? "32-bit " : "",
                          cls == H5T_FLOAT ? "float" : cls == H5T_INTEGER ? "integer" : "fixed-length string",
                          want);
    }
    if (cls == H5T_FLOAT && elem == 2) {
        size_t spos, epos, esize, mpos, msize;
        /* Raw reads reinterpret the bits as IEEE binary16: make sure that is what they are. */
        SD_H5_CHECK(H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize));
        if (spos != 15 || epos != 10 || esize != 5 || mpos != 0 || msize != 10 || H5Tget_ebias(t) != 15 ||
            H5Tget_order(t) != H5T_ORDER_LE) {
            H5Sclose(space);
            H5Tclose(t);
            H5Dclose(d);
            return sd_err_set(err, "%s: dataset '%s' is a 16-bit float that is not IEEE binary16",
                              s->info.path, name);
        }
    }
    SD_H5_CHECK(H5Sclose(space));
    SD_H5_CHECK(H5Tclose(t));
    *out = d;
    return 0;
}

void sd_shard_close(sd_shard *s)
{
    hid_t ids[] = {s ? s->d_mom : -1, s ? s->d_emb : -1, s ? s->d_ids : -1,
                   s ? s->d_cap : -1, s ? s->d_key : -1, s ? s->d_empty : -1};
    if (!s)
        return;
    for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++)
        if (ids[k] >= 0)
            SD_H5_CHECK(H5Dclose(ids[k]));
    if (s->t_float >= 0)
        SD_H5_CHECK(H5Tclose(s->t_float));
    if (s->file >= 0)
        SD_H5_CHECK(H5Fclose(s->file));
    free(s);
}

static int shard_open(sd_shard *s, const char *path, sd_err *err)
{
    sd_shard_info *in = &s->info;
    hid_t fapl;
    int64_t v;
    char dtype[32];
    hsize_t dims[4];
    size_t fsz;
    htri_t is_h5;

    if (snprintf(in->path, sizeof in->path, "%s", path) >= (int)sizeof in->path)
        return sd_err_set(err, "path too long: '%s'", path);
    if (access(path, R_OK) != 0) {
        const int e = errno;
        if (sd_storage_errno(e))
            return sd_err_set_storage(err, "cannot open shard '%s': %s (a storage error, not "
                                      "damage: the shard may be intact)", path, strerror(e));
        return sd_err_set(err, "cannot open shard '%s': %s", path, strerror(e));
    }
    SD_H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
    SD_H5_CHECK(H5Pset_fapl_sec2(fapl));
#if (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7) || H5_VERSION_GE(1, 12, 1)
    /* Committed shards never change, so readers need no lock; and flock is unavailable on some
     * parallel file systems, where it would make every open fail. */
    SD_H5_CHECK(H5Pset_file_locking(fapl, 0, 1));
#endif
    /* No chunk cache: a reader takes each sample's chunks once (training reads each sample once
     * an epoch, in random order), so HDF5's default 1 MiB per dataset only held copies, 4 MiB
     * and more per open shard, and the loader keeps many shards open. */
    SD_H5_CHECK(H5Pset_cache(fapl, 0, 0, 0, 0.75));
    s->file = sd_h5_fopen(path, H5F_ACC_RDONLY, fapl);
    if (s->file < 0) {
        h5_fail(err, "cannot open shard '%s'", path);
        SD_H5_CHECK(H5Pclose(fapl));
        if (err->storage)
            return -1;
        /* Only now ask whether it is HDF5 at all: H5Fis_hdf5 opens with default (locking)
         * settings, which some parallel file systems refuse. */
        is_h5 = H5Fis_hdf5(path);
        if (is_h5 == 0)
            sd_err_set(err, "'%s' is not an HDF5 file (a latent shard is one)", path);
        return -1;
    }
    SD_H5_CHECK(H5Pclose(fapl));
    {
        const htri_t has_format = H5Aexists(s->file, "format");
        if (has_format < 0)
            return h5_fail(err, "%s: cannot look up attribute 'format'", path);
        if (has_format == 0)
            return sd_err_set(err, "'%s' is not an sdtrain latent shard (no 'format' attribute)",
                              path);
    }
    {
        char format[64];
        if (read_attr_str(s->file, "format", format, sizeof format, s, err))
            return -1;
        if (strcmp(format, SD_SHARD_FORMAT) != 0)
            return sd_err_set(err, "'%s' is not an sdtrain latent shard (format '%s', expected '%s')", path,
                              format, SD_SHARD_FORMAT);
    }
    if (read_attr_i64(s->file, "format_version", &v, s, err))
        return -1;
    if (v < 1 || v > SD_SHARD_FORMAT_VERSION)
        return sd_err_set(err, "%s: latent shard format version %lld is not one this sdtrain reads (%d%s)",
                          path, (long long)v, SD_SHARD_FORMAT_VERSION,
                          v > SD_SHARD_FORMAT_VERSION ? "; the file is newer than this program" : "");
    in->format_version = (int)v;
    {
        int64_t res, ch, len, dim;
        if (read_attr_i64(s->file, "shard_index", &in->shard_index, s, err) ||
            read_attr_i64(s->file, "num_samples", &in->n_samples, s, err) ||
            read_attr_i64(s->file, "resolution", &res, s, err) ||
            read_attr_i64(s->file, "latent_channels", &ch, s, err) ||
            read_attr_i64(s->file, "text_len", &len, s, err) ||
            read_attr_i64(s->file, "embed_dim", &dim, s, err))
            return -1;
        if (in->shard_index < 0 || in->n_samples < 0 || in->n_samples > SD_SHARD_MAX_SAMPLES ||
            res < 8 || res % 8 || res > SD_SHARD_MAX_RESOLUTION || ch < 1 ||
            ch > SD_SHARD_MAX_CHANNELS || len < 1 || len > SD_SHARD_MAX_TEXT_LEN || dim < 1 ||
            dim > SD_SHARD_MAX_EMBED_DIM || sample_floats(res, ch, len, dim) > SD_SHARD_MAX_SAMPLE_FLOATS)
            return sd_err_set(err, "%s: invalid shard attributes (shard_index %lld, num_samples "
                                   "%lld, resolution %lld, latent_channels %lld, text_len %lld, "
                                   "embed_dim %lld)", path, (long long)in->shard_index,
                              (long long)in->n_samples, (long long)res, (long long)ch,
                              (long long)len, (long long)dim);
        in->resolution = (int)res;
        in->latent_channels = (int)ch;
        in->text_len = (int)len;
        in->embed_dim = (int)dim;
    }
    if (read_attr_f64(s->file, "latent_scaling_factor", &in->scaling_factor, s, err) ||
        read_attr_str(s->file, "float_dtype", dtype, sizeof dtype, s, err) ||
        read_attr_str(s->file, "weights_path", in->weights_path, sizeof in->weights_path, s, err) ||
        read_attr_str(s->file, "weights_hash", in->weights_hash, sizeof in->weights_hash, s, err) ||
        read_attr_str(s->file, "created", in->created, sizeof in->created, s, err) ||
        read_attr_str(s->file, "creator", in->creator, sizeof in->creator, s, err))
        return -1;
    in->filter[0] = '\0';
    {
        const htri_t has = H5Aexists(s->file, "filter");
        if (has < 0)
            return sd_err_set(err, "%s: cannot look up the attribute 'filter'", path);
        if (has > 0 && read_attr_str(s->file, "filter", in->filter, sizeof in->filter, s, err))
            return -1;
    }
    if (!(in->scaling_factor > 0) || !isfinite(in->scaling_factor))
        return sd_err_set(err, "%s: invalid latent_scaling_factor %g (a positive finite number)",
                          path, in->scaling_factor);
    if (!strcmp(dtype, "float16"))
        in->float_dtype = SD_F16, fsz = 2;
    else if (!strcmp(dtype, "float32"))
        in->float_dtype = SD_F32, fsz = 4;
    else
        return sd_err_set(err, "%s: unknown float_dtype '%s' (expected float16 or float32)", path, dtype);
    in->latent_size = in->resolution / 8;
    snprintf(in->latents_name, sizeof in->latents_name, DS_LATENTS_FMT, in->resolution);

    dims[0] = (hsize_t)in->n_samples, dims[1] = (hsize_t)(2 * in->latent_channels);
    dims[2] = dims[3] = (hsize_t)in->latent_size;
    if (open_dataset(s, in->latents_name, H5T_FLOAT, fsz, 4, dims, &s->d_mom, err))
        return -1;
    dims[1] = (hsize_t)in->text_len, dims[2] = (hsize_t)in->embed_dim;
    if (open_dataset(s, DS_EMB, H5T_FLOAT, fsz, 3, dims, &s->d_emb, err) ||
        open_dataset(s, DS_IDS, H5T_INTEGER, 4, 2, dims, &s->d_ids, err))
        return -1;
    if (open_dataset(s, DS_CAP, H5T_STRING, 0, 1, dims, &s->d_cap, err) ||
        open_dataset(s, DS_KEY, H5T_STRING, 0, 1, dims, &s->d_key, err))
        return -1;
    dims[0] = (hsize_t)in->text_len, dims[1] = (hsize_t)in->embed_dim;
    if (open_dataset(s, DS_EMPTY, H5T_FLOAT, fsz, 2, dims, &s->d_empty, err))
        return -1;
    {
        hid_t t;
        SD_H5_CHECK(t = H5Dget_type(s->d_cap));
        in->caption_width = H5Tget_size(t);
        SD_H5_CHECK(H5Tclose(t));
        SD_H5_CHECK(t = H5Dget_type(s->d_key));
        in->key_width = H5Tget_size(t);
        SD_H5_CHECK(H5Tclose(t));
        if (in->caption_width > SD_SHARD_MAX_STRING || in->key_width > SD_SHARD_MAX_STRING)
            return sd_err_set(err, "%s: strings of %zu (caption) and %zu (key) bytes; at most %zu",
                              path, in->caption_width, in->key_width, SD_SHARD_MAX_STRING);
    }
    if (in->float_dtype == SD_F16)
        s->t_float = make_f16_type();
    else
        SD_H5_CHECK(s->t_float = H5Tcopy(H5T_NATIVE_FLOAT));
    return 0;
}

int sd_shard_open(const char *path, sd_shard **out, sd_err *err)
{
    sd_shard *s = sd_xcalloc(1, sizeof *s);
    sd_h5_quiet q;
    int rc;
    s->file = s->d_mom = s->d_emb = s->d_ids = s->d_cap = s->d_key = s->d_empty = s->t_float = -1;
    sd_h5_quiet_begin(&q);
    rc = shard_open(s, path, err);
    if (rc) {
        /* Partially opened objects: close quietly, the error is already in err. */
        hid_t ids[] = {s->d_mom, s->d_emb, s->d_ids, s->d_cap, s->d_key, s->d_empty};
        for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++)
            if (ids[k] >= 0)
                H5Dclose(ids[k]);
        if (s->t_float >= 0)
            H5Tclose(s->t_float);
        if (s->file >= 0)
            H5Fclose(s->file);
        free(s);
        s = NULL;
    }
    sd_h5_quiet_end(&q);
    *out = s;
    return rc;
}

int sd_shard_open_entry(const char *dir, const sd_shard_entry *e, sd_shard **out, sd_err *err)
{
    char path[SD_PATH_MAX + 80];
    struct stat st;
    *out = NULL;
    if (join_path(path, sizeof path, dir, e->file, err))
        return -1;
    if (sd_stat(path, &st) != 0)
        return sd_err_set(err, "cannot open committed shard '%s': %s", path, strerror(errno));
    if ((int64_t)st.st_size != e->bytes)
        return sd_err_set(err, "%s has %lld bytes but the manifest recorded %lld at commit", path,
                          (long long)st.st_size, (long long)e->bytes);
    if (sd_shard_open(path, out, err))
        return -1;
    if ((*out)->info.n_samples != e->samples || (*out)->info.resolution != e->resolution ||
        (*out)->info.shard_index != e->index) {
        sd_err_set(err, "%s holds shard %lld with %lld samples at %d px, but the manifest lists shard "
                        "%lld with %lld samples at %d px", path, (long long)(*out)->info.shard_index,
                   (long long)(*out)->info.n_samples, (*out)->info.resolution, (long long)e->index,
                   (long long)e->samples, e->resolution);
        sd_shard_close(*out);
        *out = NULL;
        return -1;
    }
    return 0;
}

const sd_shard_info *sd_shard_get_info(const sd_shard *s)
{
    return &s->info;
}

/* Reads rows start, start+stride, ... (count) of dataset d in memory type mt into dst. */
static int read_rows(sd_shard *s, hid_t d, const char *name, hid_t mt, int64_t start, int64_t count,
                     int64_t stride, void *dst, sd_err *err)
{
    hsize_t dims[4], hstart[4] = {0}, hcount[4];
    hid_t fspace, mspace;
    herr_t rc = 0;
    int nd;
    size_t row_bytes;
    int64_t runs, run_len;
    sd_h5_quiet q;
    if (count < 0 || stride < 1 || start < 0 ||
        (count > 0 && (start >= s->info.n_samples || (s->info.n_samples - 1 - start) / stride < count - 1)))
        return sd_err_set(err, "%s: cannot read %lld samples of '%s' from %lld with stride %lld: the "
                               "shard has %lld", s->info.path, (long long)count, name, (long long)start,
                          (long long)stride, (long long)s->info.n_samples);
    if (count == 0)
        return 0;
    SD_H5_CHECK(fspace = H5Dget_space(d));
    SD_H5_CHECK(nd = H5Sget_simple_extent_dims(fspace, dims, NULL));
    row_bytes = H5Tget_size(mt);
    for (int k = 1; k < nd; k++) {
        hcount[k] = dims[k];
        row_bytes *= (size_t)dims[k];
    }
    /* Strided hyperslabs over chunked data are slow in HDF5 1.10 (about 2 ms per sample at
     * 512 px against 0.02 ms for a single-row read), so a stride becomes one read per row. */
    runs = stride == 1 ? 1 : count;
    run_len = stride == 1 ? count : 1;
    hcount[0] = (hsize_t)run_len;
    SD_H5_CHECK(mspace = H5Screate_simple(nd, hcount, NULL));
    sd_h5_quiet_begin(&q);
    for (int64_t r = 0; r < runs && rc >= 0; r++) {
        hstart[0] = (hsize_t)(start + r * stride);
        SD_H5_CHECK(H5Sselect_hyperslab(fspace, H5S_SELECT_SET, hstart, NULL, hcount, NULL));
        rc = H5Dread(d, mt, mspace, fspace, H5P_DEFAULT, (char *)dst + (size_t)r * row_bytes);
        if (rc < 0) {
            h5_fail(err, "%s: reading '%s' failed", s->info.path, name);
        }
    }
    sd_h5_quiet_end(&q);
    SD_H5_CHECK(H5Sclose(mspace));
    SD_H5_CHECK(H5Sclose(fspace));
    return rc < 0 ? -1 : 0;
}

/* Floats as fp32: fp16 is read raw and widened exactly (not by HDF5's generic conversion). */
static int read_floats(sd_shard *s, hid_t d, const char *name, int64_t start, int64_t count,
                       int64_t stride, size_t per_sample, float *dst, sd_err *err)
{
    uint16_t *raw;
    int rc;
    if (s->info.float_dtype == SD_F32)
        return read_rows(s, d, name, s->t_float, start, count, stride, dst, err);
    raw = sd_xmalloc((size_t)(count > 0 ? count : 1) * per_sample * 2);
    rc = read_rows(s, d, name, s->t_float, start, count, stride, raw, err);
    if (rc == 0)
        sd_f16_to_f32_array(raw, dst, (size_t)count * per_sample);
    free(raw);
    return rc;
}

/* The file offset of dataset d's raw data when it is contiguous and stored as raw little-endian
 * IEEE floats of the shard's float type, else 0 (no dataset's data starts at offset 0: the
 * superblock does). */
static uint64_t direct_offset(const sd_shard *s, hid_t d)
{
    hid_t dcpl, t;
    H5D_layout_t layout;
    haddr_t at;
    int fits;
    SD_H5_CHECK(dcpl = H5Dget_create_plist(d));
    layout = H5Pget_layout(dcpl);
    SD_H5_CHECK(H5Pclose(dcpl));
    if (layout != H5D_CONTIGUOUS)
        return 0;
    SD_H5_CHECK(t = H5Dget_type(d));
    fits = H5Tget_class(t) == H5T_FLOAT && H5Tget_order(t) == H5T_ORDER_LE &&
           H5Tget_size(t) == (s->info.float_dtype == SD_F16 ? 2u : 4u);
    SD_H5_CHECK(H5Tclose(t));
    at = H5Dget_offset(d); /* HADDR_UNDEF without storage (zero rows) */
    return fits && at != HADDR_UNDEF ? (uint64_t)at : 0;
}

void sd_shard_get_direct(const sd_shard *s, sd_shard_direct *d)
{
    memset(d, 0, sizeof *d);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (s->info.n_samples > 0) {
        d->moments = direct_offset(s, s->d_mom);
        d->embeddings = direct_offset(s, s->d_emb);
        d->f16 = s->info.float_dtype == SD_F16;
        d->ok = d->moments != 0 && d->embeddings != 0;
    }
#else
    (void)s;
#endif
    if (!d->ok)
        memset(d, 0, sizeof *d);
}

int sd_shard_direct_read(int fd, const char *path, uint64_t offset, int f16, size_t row_floats,
                         int64_t row, int64_t count, float *dst, uint16_t *scratch, sd_err *err)
{
    const size_t fsz = f16 ? 2 : 4, bytes = (size_t)count * row_floats * fsz;
    uint16_t *own = NULL;
    char *buf;
    if (count <= 0)
        return 0;
    if (f16 && !scratch)
        scratch = own = sd_xmalloc(bytes);
    buf = f16 ? (char *)scratch : (char *)dst;
    if (sd_pio_all(fd, buf, bytes, offset + (uint64_t)row * row_floats * fsz, 0, NULL)) {
        const int e = errno;
        free(own);
        if (e && sd_storage_errno(e))
            return sd_err_set_storage(err, "%s: reading rows %lld to %lld failed: %s (a storage "
                                      "error, not damage: the shard may be intact)", path,
                                      (long long)row, (long long)(row + count - 1), strerror(e));
        return sd_err_set(err, "%s: reading rows %lld to %lld failed: %s", path, (long long)row,
                          (long long)(row + count - 1),
                          e ? strerror(e) : "the file ends before them (truncated?)");
    }
    if (f16)
        sd_f16_to_f32_array(scratch, dst, (size_t)count * row_floats);
    free(own);
    return 0;
}

int sd_shard_read_moments(sd_shard *s, int64_t start, int64_t count, int64_t stride,
                          sd_latent_layout layout, float *dst, sd_err *err)
{
    size_t hw = (size_t)s->info.latent_size * (size_t)s->info.latent_size;
    size_t per = (size_t)(2 * s->info.latent_channels) * hw;
    float *nchw;
    if (layout == SD_LATENT_NCHW)
        return read_floats(s, s->d_mom, s->info.latents_name, start, count, stride, per, dst, err);
    if (layout != SD_LATENT_NHWC)
        return sd_err_set(err, "%s: unknown latent layout %d", s->info.path, (int)layout);
    nchw = sd_xmalloc((size_t)(count > 0 ? count : 1) * per * sizeof(float));
    if (read_floats(s, s->d_mom, s->info.latents_name, start, count, stride, per, nchw, err)) {
        free(nchw);
        return -1;
    }
    nchw_to_nhwc(nchw, dst, count, 2 * s->info.latent_channels, hw);
    free(nchw);
    return 0;
}

int sd_shard_read_embeddings(sd_shard *s, int64_t start, int64_t count, int64_t stride, float *dst,
                             sd_err *err)
{
    return read_floats(s, s->d_emb, DS_EMB, start, count, stride,
                       (size_t)s->info.text_len * (size_t)s->info.embed_dim, dst, err);
}

int sd_shard_read_ids(sd_shard *s, int64_t start, int64_t count, int64_t stride, int32_t *dst,
                      sd_err *err)
{
    return read_rows(s, s->d_ids, DS_IDS, H5T_NATIVE_INT32, start, count, stride, dst, err);
}

static int read_strings(sd_shard *s, hid_t d, const char *name, size_t stored, int64_t start,
                        int64_t count, int64_t stride, char *dst, size_t width, sd_err *err)
{
    hid_t t;
    char *raw;
    int rc;
    if (width <= stored)
        return sd_err_set(err, "%s: '%s' holds strings of up to %zu bytes; rows of %zu bytes cannot "
                               "hold them with a NUL", s->info.path, name, stored, width);
    SD_H5_CHECK(t = H5Dget_type(d));
    raw = sd_xmalloc((size_t)(count > 0 ? count : 1) * stored);
    rc = read_rows(s, d, name, t, start, count, stride, raw, err);
    SD_H5_CHECK(H5Tclose(t));
    if (rc == 0)
        for (int64_t i = 0; i < count; i++) {
            size_t n = field_len(raw + (size_t)i * stored, stored);
            memcpy(dst + (size_t)i * width, raw + (size_t)i * stored, n);
            memset(dst + (size_t)i * width + n, 0, width - n);
        }
    free(raw);
    return rc;
}

int sd_shard_read_captions(sd_shard *s, int64_t start, int64_t count, int64_t stride, char *dst,
                           size_t width, sd_err *err)
{
    return read_strings(s, s->d_cap, DS_CAP, s->info.caption_width, start, count, stride, dst, width, err);
}

int sd_shard_read_keys(sd_shard *s, int64_t start, int64_t count, int64_t stride, char *dst,
                       size_t width, sd_err *err)
{
    return read_strings(s, s->d_key, DS_KEY, s->info.key_width, start, count, stride, dst, width, err);
}

int sd_shard_read_empty_embedding(sd_shard *s, float *dst, sd_err *err)
{
    hsize_t n = (hsize_t)s->info.text_len * (hsize_t)s->info.embed_dim;
    herr_t rc;
    sd_h5_quiet q;
    uint16_t *raw = s->info.float_dtype == SD_F16 ? sd_xmalloc(n * 2) : NULL;
    sd_h5_quiet_begin(&q);
    rc = H5Dread(s->d_empty, s->t_float, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw ? (void *)raw : (void *)dst);
    if (rc < 0) {
        h5_fail(err, "%s: reading 'empty_caption_embedding' failed", s->info.path);
    } else if (raw) {
        sd_f16_to_f32_array(raw, dst, n);
    }
    sd_h5_quiet_end(&q);
    free(raw);
    return rc < 0 ? -1 : 0;
}

int sd_shard_checksum(sd_shard *s, uint64_t *out, sd_err *err)
{
    const sd_shard_info *in = &s->info;
    size_t fsz = in->float_dtype == SD_F16 ? 2 : 4;
    size_t m_el = (size_t)(2 * in->latent_channels) * (size_t)in->latent_size * (size_t)in->latent_size;
    size_t e_el = (size_t)in->text_len * (size_t)in->embed_dim, L = (size_t)in->text_len;
    size_t per = (m_el + e_el) * fsz + L * 4 + in->caption_width + in->key_width;
    int64_t B = (int64_t)(ROUND_BYTES / per);
    char *mom, *emb, *cap, *key;
    int32_t *ids;
    hid_t tc, tk;
    uint64_t sum = 0;
    int rc = 0;
    if (B > in->n_samples)
        B = in->n_samples;
    if (B < 1)
        B = 1; /* (an empty shard: no rows, the loop below does not run) */
    mom = sd_xmalloc((size_t)B * m_el * fsz);
    emb = sd_xmalloc((size_t)B * e_el * fsz);
    ids = sd_xmalloc((size_t)B * L * 4);
    cap = sd_xmalloc((size_t)B * in->caption_width);
    key = sd_xmalloc((size_t)B * in->key_width);
    SD_H5_CHECK(tc = H5Dget_type(s->d_cap));
    SD_H5_CHECK(tk = H5Dget_type(s->d_key));
    for (int64_t lo = 0; lo < in->n_samples && rc == 0; lo += B) {
        int64_t cnt = in->n_samples - lo < B ? in->n_samples - lo : B;
        rc = read_rows(s, s->d_mom, in->latents_name, s->t_float, lo, cnt, 1, mom, err) ||
             read_rows(s, s->d_emb, DS_EMB, s->t_float, lo, cnt, 1, emb, err) ||
             read_rows(s, s->d_ids, DS_IDS, H5T_NATIVE_INT32, lo, cnt, 1, ids, err) ||
             read_rows(s, s->d_cap, DS_CAP, tc, lo, cnt, 1, cap, err) ||
             read_rows(s, s->d_key, DS_KEY, tk, lo, cnt, 1, key, err);
        for (int64_t i = 0; rc == 0 && i < cnt; i++) {
            const char *c = cap + (size_t)i * in->caption_width, *k = key + (size_t)i * in->key_width;
            uint64_t h = hash_bytes(0, mom + (size_t)i * m_el * fsz, m_el * fsz);
            h = hash_bytes(h, emb + (size_t)i * e_el * fsz, e_el * fsz);
            h = hash_bytes(h, ids + (size_t)i * L, L * 4);
            h = hash_bytes(h, c, field_len(c, in->caption_width));
            h = hash_bytes(h, k, field_len(k, in->key_width));
            sum += sample_term(lo + i, h);
        }
    }
    if (rc == 0) {
        char *empty = sd_xmalloc(e_el * fsz);
        sd_h5_quiet q;
        herr_t hr;
        sd_h5_quiet_begin(&q);
        hr = H5Dread(s->d_empty, s->t_float, H5S_ALL, H5S_ALL, H5P_DEFAULT, empty);
        if (hr < 0) {
            rc = h5_fail(err, "%s: reading 'empty_caption_embedding' failed", in->path);
        } else {
            sum += shard_terms(in->n_samples, hash_bytes(0, empty, e_el * fsz));
        }
        sd_h5_quiet_end(&q);
        free(empty);
    }
    SD_H5_CHECK(H5Tclose(tc));
    SD_H5_CHECK(H5Tclose(tk));
    free(mom);
    free(emb);
    free(ids);
    free(cap);
    free(key);
    if (rc == 0)
        *out = sum;
    return rc ? -1 : 0;
}
