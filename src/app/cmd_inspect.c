/* sdtool inspect: schema, attributes and value statistics of an HDF5 file, a safetensors file, a
 * shard directory, or a training checkpoint (one step's directory, or a checkpoint root with
 * `latest`). */
#include "sdtrain/commands.h"

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>

#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/error.h"
#include "sdtrain/h5check.h"
#include "sdtrain/safetensors.h"
#include "sdtrain/shards.h"
#include "sdtrain/tensor.h"

/* sdtool is serial: files are opened with HDF5's default sec2 driver, which the parallel build
 * allows without MPI_Init (MPI is never started here). */

#define STATS_BLOCK_BYTES ((size_t)32 << 20)
/* Statistics read the values; a dataset declared larger than this (a chunked dataset can declare
 * any extent without storing it) or with a row larger than a block gets none, with a note. */
#define STATS_MAX_VALUES ((uint64_t)1 << 34)
#define STATS_MAX_ROW (STATS_BLOCK_BYTES / sizeof(double))

typedef struct inspect_opts {
    int stats;
    int verify;
    int config; /* checkpoints: print the writing run's namelist */
} inspect_opts;

static int is_f16(hid_t t)
{
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_class(t) != H5T_FLOAT || H5Tget_size(t) != 2 || H5Tget_order(t) != H5T_ORDER_LE)
        return 0;
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0)
        return 0;
    return spos == 15 && epos == 10 && esize == 5 && mpos == 0 && msize == 10 && H5Tget_ebias(t) == 15;
}

static const char *type_str(hid_t t, char *buf, size_t size)
{
    switch (H5Tget_class(t)) {
    case H5T_FLOAT:
        if (is_f16(t))
            snprintf(buf, size, "float16");
        else
            snprintf(buf, size, "float%zu", 8 * H5Tget_size(t));
        break;
    case H5T_INTEGER:
        snprintf(buf, size, "%sint%zu", H5Tget_sign(t) == H5T_SGN_NONE ? "u" : "", 8 * H5Tget_size(t));
        break;
    case H5T_STRING:
        if (H5Tis_variable_str(t) > 0)
            snprintf(buf, size, "string (variable length, %s)",
                     H5Tget_cset(t) == H5T_CSET_UTF8 ? "UTF-8" : "ASCII");
        else
            snprintf(buf, size, "string (fixed %zu bytes, %s)", H5Tget_size(t),
                     H5Tget_cset(t) == H5T_CSET_UTF8 ? "UTF-8" : "ASCII");
        break;
    default:
        snprintf(buf, size, "other (HDF5 type class %d, %zu bytes)", (int)H5Tget_class(t), H5Tget_size(t));
    }
    return buf;
}

static const char *dims_str(hid_t space, char *buf, size_t size)
{
    hsize_t dims[H5S_MAX_RANK];
    int64_t d[SD_TENSOR_MAX_DIMS];
    int nd = H5Sget_simple_extent_ndims(space);
    if (nd < 0 || nd > SD_TENSOR_MAX_DIMS) {
        snprintf(buf, size, "?");
        return buf;
    }
    if (H5Sget_simple_extent_type(space) == H5S_SCALAR) {
        snprintf(buf, size, "scalar");
        return buf;
    }
    H5Sget_simple_extent_dims(space, dims, NULL);
    for (int k = 0; k < nd; k++)
        d[k] = (int64_t)dims[k];
    return sd_shape_str(nd, d, buf, size);
}

/* ---- attributes ---------------------------------------------------------------------------- */

/* s in double quotes, with " and \ escaped and control bytes as \xNN, so that a value holding
 * quotes (a &data filter's strings) or line breaks reads unambiguously on one line */
static void print_quoted(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static void print_attr_value(hid_t a, hid_t t, hid_t space)
{
    hssize_t n = H5Sget_simple_extent_npoints(space);
    H5T_class_t cls = H5Tget_class(t);
    if (n == 1 && cls == H5T_STRING) {
        if (H5Tis_variable_str(t) > 0) {
            char *v = NULL;
            hid_t mt = H5Tcopy(H5T_C_S1);
            H5Tset_size(mt, H5T_VARIABLE);
            H5Tset_cset(mt, H5Tget_cset(t));
            if (H5Aread(a, mt, &v) >= 0)
                print_quoted(v ? v : "");
            H5free_memory(v);
            H5Tclose(mt);
        } else {
            size_t w = H5Tget_size(t);
            char *v = sd_xcalloc(w + 1, 1);
            if (H5Aread(a, t, v) >= 0)
                print_quoted(v);
            free(v);
        }
        return;
    }
    if (n >= 1 && n <= 16 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) {
        double v[16];
        long long iv[16];
        herr_t rc = cls == H5T_INTEGER ? H5Aread(a, H5T_NATIVE_LLONG, iv) : H5Aread(a, H5T_NATIVE_DOUBLE, v);
        if (rc < 0) {
            printf("(unreadable)");
            return;
        }
        if (n > 1)
            printf("[");
        for (hssize_t k = 0; k < n; k++) {
            char num[32];
            if (cls == H5T_INTEGER) {
                snprintf(num, sizeof num, "%lld", iv[k]);
            } else {
                /* the shortest decimal that reads back as the same double */
                for (int prec = 6; prec <= 17; prec++) {
                    snprintf(num, sizeof num, "%.*g", prec, v[k]);
                    if (strtod(num, NULL) == v[k])
                        break;
                }
            }
            printf("%s%s", k ? ", " : "", num);
        }
        if (n > 1)
            printf("]");
        return;
    }
    {
        char ts[128], ds[128];
        printf("(%s %s)", type_str(t, ts, sizeof ts), dims_str(space, ds, sizeof ds));
    }
}

static herr_t print_attr(hid_t loc, const char *name, const H5A_info_t *info, void *data)
{
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT), t, space;
    (void)info;
    (void)data;
    if (a < 0)
        return 0;
    t = H5Aget_type(a);
    space = H5Aget_space(a);
    printf("    %s = ", name);
    print_attr_value(a, t, space);
    printf("\n");
    H5Sclose(space);
    H5Tclose(t);
    H5Aclose(a);
    return 0;
}

static void print_attrs(hid_t obj)
{
    H5O_info_t oi;
    if (H5Oget_info2(obj, &oi, H5O_INFO_NUM_ATTRS) < 0 || oi.num_attrs == 0)
        return;
    H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, NULL, print_attr, NULL);
}

/* ---- datasets ------------------------------------------------------------------------------- */

typedef struct stats {
    double min, max, sum, sumsq;
    int64_t n, nan, inf;
} stats;

/* The mean and the (population) standard deviation of the finite values added (n > 0). */
static void stats_mean_std(const stats *s, double *mean, double *std)
{
    const double m = s->sum / (double)s->n, var = s->sumsq / (double)s->n - m * m;
    *mean = m;
    *std = var > 0 ? sqrt(var) : 0.0;
}

static void stats_add(stats *s, double v)
{
    if (isnan(v)) {
        s->nan++;
        return;
    }
    if (isinf(v)) {
        s->inf++;
        return;
    }
    if (s->n == 0 || v < s->min)
        s->min = v;
    if (s->n == 0 || v > s->max)
        s->max = v;
    s->sum += v;
    s->sumsq += v * v;
    s->n++;
}

/* Statistics over a numeric dataset, read in blocks of rows so any size fits in memory. fp16 is
 * read raw and widened exactly; other numbers are converted to double by HDF5. Returns 0, -1
 * (unreadable: why) or 1 (too large for statistics: why). */
static int dataset_stats(hid_t d, hid_t t, hid_t space, stats *st, char *why, size_t why_size)
{
    hsize_t dims[H5S_MAX_RANK], start[H5S_MAX_RANK] = {0}, count[H5S_MAX_RANK];
    int nd = H5Sget_simple_extent_ndims(space), f16 = is_f16(t);
    size_t row = 1, rows_per_block;
    void *buf;
    float *wide = NULL;
    memset(st, 0, sizeof *st);
    if (nd == 0) {
        double v;
        if (H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v) < 0)
            return snprintf(why, why_size, "%s", "unreadable"), -1;
        stats_add(st, v);
        return 0;
    }
    H5Sget_simple_extent_dims(space, dims, NULL);
    {
        uint64_t total = 1;
        int over = 0;
        for (int k = 0; k < nd; k++)
            if (dims[k] == 0)
                return 0;
        for (int k = 0; k < nd; k++)
            over |= __builtin_mul_overflow(total, (uint64_t)dims[k], &total);
        for (int k = 1; k < nd; k++)
            over |= __builtin_mul_overflow(row, (size_t)dims[k], &row);
        if (over || total > STATS_MAX_VALUES || row > STATS_MAX_ROW) {
            char values[32];
            if (over)
                snprintf(values, sizeof values, "more than 2^64");
            else
                snprintf(values, sizeof values, "%llu", (unsigned long long)total);
            snprintf(why, why_size, "no statistics: %s values (they are read for them: at most "
                     "%llu, in rows of at most %zu)", values, (unsigned long long)STATS_MAX_VALUES,
                     STATS_MAX_ROW);
            return 1;
        }
    }
    rows_per_block = STATS_BLOCK_BYTES / (row * sizeof(double));
    if (rows_per_block < 1)
        rows_per_block = 1;
    buf = sd_xmalloc(rows_per_block * row * sizeof(double));
    if (f16)
        wide = sd_xmalloc(rows_per_block * row * sizeof(float));
    for (hsize_t lo = 0; lo < dims[0]; lo += rows_per_block) {
        hsize_t cnt = dims[0] - lo < rows_per_block ? dims[0] - lo : rows_per_block;
        hid_t fs = H5Scopy(space), ms;
        herr_t rc;
        size_t n = (size_t)cnt * row;
        for (int k = 0; k < nd; k++)
            count[k] = dims[k];
        start[0] = lo;
        count[0] = cnt;
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
        ms = H5Screate_simple(nd, count, NULL);
        rc = H5Dread(d, f16 ? t : H5T_NATIVE_DOUBLE, ms, fs, H5P_DEFAULT, buf);
        if (rc < 0) {
            char h5msg[256];
            snprintf(why, why_size, "unreadable: %s", sd_h5_error_string(h5msg, sizeof h5msg));
        }
        H5Sclose(ms);
        H5Sclose(fs);
        if (rc < 0) {
            free(buf);
            free(wide);
            return -1;
        }
        if (f16) {
            sd_f16_to_f32_array(buf, wide, n);
            for (size_t i = 0; i < n; i++)
                stats_add(st, wide[i]);
        } else {
            for (size_t i = 0; i < n; i++)
                stats_add(st, ((double *)buf)[i]);
        }
    }
    free(buf);
    free(wide);
    return 0;
}

static void print_dataset(hid_t d, const char *name, const inspect_opts *o, int *failures)
{
    hid_t t = H5Dget_type(d), space = H5Dget_space(d), dcpl = H5Dget_create_plist(d);
    char ts[96], ds[96], cs[96] = "contiguous";
    H5T_class_t cls = H5Tget_class(t);
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
        hsize_t ch[H5S_MAX_RANK];
        int64_t c[SD_TENSOR_MAX_DIMS];
        int nd = H5Pget_chunk(dcpl, SD_TENSOR_MAX_DIMS, ch);
        for (int k = 0; k < nd && k < SD_TENSOR_MAX_DIMS; k++)
            c[k] = (int64_t)ch[k];
        memcpy(cs, "chunks ", 7);
        sd_shape_str(nd, c, cs + 7, sizeof cs - 7);
    }
    printf("  %-28s %-18s %-34s %s\n", name, dims_str(space, ds, sizeof ds), type_str(t, ts, sizeof ts), cs);
    if (o->stats && (cls == H5T_FLOAT || cls == H5T_INTEGER)) {
        stats st;
        char why[320];
        const int rc = dataset_stats(d, t, space, &st, why, sizeof why);
        if (rc) {
            printf("      %s\n", why);
            *failures += rc < 0;
        } else if (st.n > 0) {
            double mean, std;
            stats_mean_std(&st, &mean, &std);
            if (cls == H5T_FLOAT)
                printf("      min %.6g  max %.6g  mean %.6g  std %.6g", st.min, st.max, mean,
                       std);
            else
                printf("      min %.0f  max %.0f", st.min, st.max);
            if (st.nan || st.inf)
                printf("  nan %lld  inf %lld", (long long)st.nan, (long long)st.inf);
            printf("\n");
        } else if (st.nan || st.inf) {
            printf("      nan %lld  inf %lld (no finite values)\n", (long long)st.nan, (long long)st.inf);
        }
    }
    print_attrs(d);
    H5Pclose(dcpl);
    H5Sclose(space);
    H5Tclose(t);
}

typedef struct visit_ctx {
    const inspect_opts *o;
    int failures;
    int64_t n_datasets;
} visit_ctx;

static herr_t visit(hid_t root, const char *name, const H5O_info_t *info, void *data)
{
    visit_ctx *c = data;
    hid_t obj;
    if (!strcmp(name, "."))
        return 0;
    obj = H5Oopen(root, name, H5P_DEFAULT);
    if (obj < 0) {
        printf("  %s: cannot open\n", name);
        c->failures++;
        return 0;
    }
    if (info->type == H5O_TYPE_DATASET) {
        c->n_datasets++;
        print_dataset(obj, name, c->o, &c->failures);
    } else if (info->type == H5O_TYPE_GROUP) {
        printf("  %s/ (group)\n", name);
        print_attrs(obj);
    }
    H5Oclose(obj);
    return 0;
}

static int inspect_file(const char *path, const inspect_opts *o)
{
    struct stat st;
    hid_t f, fapl;
    visit_ctx c = {o, 0, 0};
    htri_t is_shard;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "sdtool inspect: cannot open '%s': %s\n", path, strerror(errno));
        return SD_EXIT_FAILURE;
    }
    SD_H5_CHECK(fapl = H5Pcreate(H5P_FILE_ACCESS));
#if (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7) || H5_VERSION_GE(1, 12, 1)
    /* Reading needs no lock, and flock is missing on some parallel file systems. */
    SD_H5_CHECK(H5Pset_file_locking(fapl, 0, 1));
#endif
    f = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (f < 0) {
        char h5msg[256];
        sd_h5_error_string(h5msg, sizeof h5msg);
        H5Pclose(fapl);
        if (H5Fis_hdf5(path) == 0)
            fprintf(stderr, "sdtool inspect: '%s' is neither an HDF5 nor a safetensors file (inspect "
                            "reads latent shards, shard directories, checkpoints, other HDF5 files and "
                            "safetensors files)\n", path);
        else
            fprintf(stderr, "sdtool inspect: cannot open '%s': %s\n", path, h5msg);
        return SD_EXIT_FAILURE;
    }
    H5Pclose(fapl);
    printf("file: %s (%lld bytes)\n", path, (long long)st.st_size);
    printf("attributes:\n");
    print_attrs(f);
    printf("datasets:\n");
    H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_INC, visit, &c, H5O_INFO_BASIC);
    is_shard = H5Aexists(f, "format");
    H5Fclose(f);
    printf("%lld dataset(s)\n", (long long)c.n_datasets);

    if (is_shard > 0) {
        /* A file that says it is a shard is validated like a reader would. */
        sd_shard *s;
        sd_err err;
        if (sd_shard_open(path, &s, &err)) {
            printf("latent shard: INVALID: %s\n", err.msg);
            return SD_EXIT_FAILURE;
        } else {
            const sd_shard_info *in = sd_shard_get_info(s);
            printf("latent shard: format %s version %d, shard %lld, %lld samples, %d px (latents %d x %d x "
                   "%d x %d %s), captions %d x %d, scaling factor %g\n",
                   SD_SHARD_FORMAT, in->format_version, (long long)in->shard_index, (long long)in->n_samples,
                   in->resolution, (int)in->n_samples, 2 * in->latent_channels, in->latent_size,
                   in->latent_size, in->float_dtype == SD_F16 ? "float16" : "float32", in->text_len,
                   in->embed_dim, in->scaling_factor);
            if (in->n_samples == 0)
                printf("empty shard: each sample of its range was skipped when it was preprocessed "
                       "(training skips it)\n");
            if (o->verify) {
                uint64_t sum;
                if (sd_shard_checksum(s, &sum, &err)) {
                    printf("checksum: ERROR: %s\n", err.msg);
                    c.failures++;
                } else {
                    printf("checksum: %016llx\n", (unsigned long long)sum);
                }
            }
            sd_shard_close(s);
        }
    }
    return c.failures ? SD_EXIT_FAILURE : SD_EXIT_OK;
}

/* A name a shard writer leaves: a shard, its temporary file, the manifest's temporary file. */
static int is_shard_name(const char *nm)
{
    return !strncmp(nm, "shard-", 6) || !strncmp(nm, ".shard-", 7) || !strcmp(nm, SD_SHARD_MANIFEST ".tmp");
}

/* "step-N" (N starting with a digit): a checkpoint directory's name, complete or not. */
static int is_step_name(const char *nm)
{
    return !strncmp(nm, "step-", 5) && nm[5] >= '0' && nm[5] <= '9';
}

/* 1 when some name in dir passes `pred`. */
static int dir_has_name(const char *dir, int (*pred)(const char *))
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;
    if (!d)
        return 0;
    while (!found && (de = readdir(d)) != NULL)
        found = pred(de->d_name);
    closedir(d);
    return found;
}

/* Whether path's last component (trailing slashes aside) is step-N: a checkpoint directory,
 * complete or not. */
static int is_step_dir(const char *path)
{
    char last[256];
    size_t n = strlen(path), b;
    while (n > 1 && path[n - 1] == '/')
        n--;
    for (b = n; b > 0 && path[b - 1] != '/'; b--)
        ;
    snprintf(last, sizeof last, "%.*s", (int)(n - b), path + b);
    return is_step_name(last);
}

/* Names in dir that look like shards or their temporary files but are not committed. */
static void list_uncommitted(const char *dir, const sd_shard_manifest *m)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int header = 0;
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        const char *nm = de->d_name;
        const sd_shard_entry *e;
        if (!is_shard_name(nm))
            continue;
        /* a committed shard's name is that of its index: looked up, not searched for (a linear
         * search per file took 84 s at 200,000 shards) */
        e = strncmp(nm, "shard-", 6) ? NULL : sd_shard_manifest_find(m, strtoll(nm + 6, NULL, 10));
        if (e && !strcmp(e->file, nm))
            continue;
        if (!header)
            printf("not committed (readers ignore these; a rerun rewrites them):\n");
        header = 1;
        printf("  %s\n", nm);
    }
    closedir(d);
}

static int file_in(const char *dir, const char *name)
{
    char path[4600];
    struct stat st;
    if (strlen(dir) + strlen(name) + 2 > sizeof path)
        return 0;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0;
}

/* A shard directory: one with a manifest, or (nothing committed yet) with a writer's leftovers. */
static int inspect_dir(const char *dir, const inspect_opts *o)
{
    sd_shard_manifest m;
    sd_err err;
    int problems = 0, has_manifest = file_in(dir, SD_SHARD_MANIFEST);
    int64_t empty = 0;
    if (sd_shard_manifest_read(dir, &m, &err)) {
        fprintf(stderr, "sdtool inspect: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    printf("shard directory: %s\n", dir);
    if (has_manifest)
        printf("manifest: %s/%s (%s version %d)\n", dir, SD_SHARD_MANIFEST, SD_SHARD_MANIFEST_FORMAT,
               SD_SHARD_MANIFEST_VERSION);
    else
        printf("manifest: none (nothing committed)\n");
    printf("committed shards: %lld, samples: %lld\n", (long long)m.n, (long long)m.total_samples);
    if (m.n > 0)
        printf("  %-8s %-18s %10s %14s %6s  %-16s  %s\n", "index", "file", "samples", "bytes", "res",
               "checksum", "status");
    for (int64_t k = 0; k < m.n; k++) {
        const sd_shard_entry *e = &m.entries[k];
        char status[1200];
        sd_shard *s;
        if (sd_shard_open_entry(dir, e, &s, &err)) {
            snprintf(status, sizeof status, "ERROR: %s", err.msg);
            problems++;
        } else {
            snprintf(status, sizeof status, "ok");
            if (o->verify) {
                uint64_t sum;
                if (sd_shard_checksum(s, &sum, &err)) {
                    snprintf(status, sizeof status, "ERROR: %s", err.msg);
                    problems++;
                } else if (sum != e->checksum) {
                    snprintf(status, sizeof status, "CHECKSUM MISMATCH: the data hash to %016llx",
                             (unsigned long long)sum);
                    problems++;
                } else {
                    snprintf(status, sizeof status, "ok, checksum verified");
                }
            }
            if (e->samples == 0 && !strncmp(status, "ok", 2)) {
                const size_t len = strlen(status);
                snprintf(status + len, sizeof status - len, ", empty");
                empty++;
            }
            sd_shard_close(s);
        }
        printf("  %-8lld %-18s %10lld %14lld %6d  %016llx  %s\n", (long long)e->index, e->file,
               (long long)e->samples, (long long)e->bytes, e->resolution, (unsigned long long)e->checksum,
               status);
    }
    if (empty)
        printf("empty shards: %lld (each sample of their ranges was skipped when they were "
               "preprocessed; training skips them)\n", (long long)empty);
    list_uncommitted(dir, &m);
    sd_shard_manifest_free(&m);
    if (problems)
        printf("problems: %d committed shard(s) failed the checks\n", problems);
    return problems ? SD_EXIT_FAILURE : SD_EXIT_OK;
}

/* One checkpoint directory: its scalars, the writer's configuration in short, the datasets with
 * their checksums (recomputed with --verify). */
static int inspect_checkpoint(const char *dir, const inspect_opts *o)
{
    sd_ckpt_info info;
    sd_ckpt_dataset_check ds[4];
    sd_err err;
    int n = 0, problems = 0;
    if (!sd_ckpt_is_complete(dir)) {
        fprintf(stderr, "sdtool inspect: checkpoint %s is incomplete: it needs %s and %s (a write "
                "that did not finish; a resume takes the checkpoint before it)\n", dir,
                SD_CKPT_MANIFEST, SD_CKPT_STATE_FILE);
        return SD_EXIT_FAILURE;
    }
    if (o->verify ? sd_ckpt_verify(dir, &info, ds, &n, &err) : sd_ckpt_peek(dir, &info, &err)) {
        fprintf(stderr, "sdtool inspect: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    printf("checkpoint: %s (written by sdtrain %s)\n", dir, info.sdtrain_version);
    printf("  step %lld (optimizer steps %lld, skipped %lld), epoch %lld of %lld steps\n",
           (long long)info.s.step, (long long)info.s.opt_step, (long long)info.s.skipped,
           (long long)info.s.epoch, (long long)info.s.steps_per_epoch);
    printf("  written by %lld rank(s), sharding '%s', batch %lld per rank (global %lld), seed "
           "%lld, EMA %s\n", (long long)info.s.n_ranks, info.s.sharding,
           (long long)info.s.batch_per_rank, (long long)info.s.global_batch,
           (long long)info.s.seed, info.s.has_ema ? "yes" : "no");
    printf("  read back and checked when written: %s\n",
           info.verified_after_write ? "yes" : "no (&checkpoint verify off, or an older sdtrain)");
    if (o->verify) {
        printf("  %-8s %12s  %-16s  %-16s  %s\n", "dataset", "floats", "manifest", "data",
               "status");
        for (int i = 0; i < n; i++) {
            int ok = ds[i].expected == ds[i].actual;
            problems += !ok;
            printf("  %-8s %12llu  %016llx  %016llx  %s\n", ds[i].name,
                   (unsigned long long)ds[i].n, (unsigned long long)ds[i].expected,
                   (unsigned long long)ds[i].actual, ok ? "ok, checksum verified" : "CHECKSUM MISMATCH");
        }
    } else {
        printf("  datasets: params, adam_m, adam_v%s (checksums not verified: --verify)\n",
               info.s.has_ema ? ", ema" : "");
    }
    if (!o->config) {
        printf("  the writing run's namelist: --config\n");
    } else if (info.config_text && info.config_text[0]) {
        printf("  the writing run's namelist:\n");
        for (const char *l = info.config_text; *l;) {
            const char *e = strchr(l, '\n');
            int len = e ? (int)(e - l) : (int)strlen(l);
            if (len > 0)
                printf("    %.*s\n", len, l);
            l += len + (e != NULL);
        }
    }
    sd_ckpt_info_free(&info);
    if (problems)
        printf("problems: %d dataset(s) fail their checksum: the checkpoint is damaged\n",
               problems);
    return problems ? SD_EXIT_FAILURE : SD_EXIT_OK;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A checkpoint root: what `latest` names, every step directory (complete or not, moved aside
 * as damaged), then the latest one in detail. */
static int inspect_ckpt_root(const char *dir, const inspect_opts *o)
{
    char latest[128], path[4400];
    char **names = NULL;
    size_t n = 0, cap = 0;
    DIR *d;
    struct dirent *de;
    sd_err err;
    int rc = SD_EXIT_OK;
    printf("checkpoint root: %s\n", dir);
    if (sd_ckpt_read_latest(dir, latest, sizeof latest, &err)) {
        printf("latest: unreadable (%s)\n", err.msg);
        latest[0] = '\0';
        rc = SD_EXIT_FAILURE;
    } else {
        printf("latest: %s\n",
               latest[0] ? latest : "(none: a resume takes the newest complete checkpoint)");
    }
    if (!(d = opendir(dir))) {
        fprintf(stderr, "sdtool inspect: cannot list '%s': %s\n", dir, strerror(errno));
        return SD_EXIT_FAILURE;
    }
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "step-", 5)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 16;
                names = sd_xrealloc(names, cap * sizeof *names);
            }
            names[n++] = sd_xstrdup(de->d_name);
        }
    closedir(d);
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 0; i < n; i++) {
        char sub[4400];
        snprintf(sub, sizeof sub, "%s/%s", dir, names[i]);
        printf("  %-28s %s%s\n", names[i],
               strchr(names[i], '.') ? "moved aside (damaged)"
               : sd_ckpt_is_complete(sub) ? "complete" : "INCOMPLETE (no manifest or state file)",
               !strcmp(names[i], latest) ? "  <- latest" : "");
        free(names[i]);
    }
    free(names);
    if (latest[0]) {
        snprintf(path, sizeof path, "%s/%s", dir, latest);
        rc = inspect_checkpoint(path, o);
    }
    return rc;
}

/* ---- safetensors files ------------------------------------------------------------------------ */

/* Whether `path` starts as a safetensors file does: an 8-byte little-endian header length
 * that fits the file, then '{'. */
static int looks_like_safetensors(const char *path)
{
    unsigned char b[9];
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    int ok = fread(b, 1, 9, f) == 9 && fstat(fileno(f), &st) == 0;
    fclose(f);
    if (!ok)
        return 0;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    return b[8] == '{' && n >= 2 && n <= (uint64_t)st.st_size - 8;
}

/* One tensor's statistics over its floating-point elements (F64/F32/F16/BF16), 0 otherwise. */
static int tensor_stats(const sd_st_tensor *t, stats *st)
{
    const unsigned char *p = t->data;
    memset(st, 0, sizeof *st);
    for (int64_t i = 0; i < t->numel; i++) {
        double v;
        if (t->dtype == SD_ST_F32) {
            float f;
            memcpy(&f, p + 4 * i, 4);
            v = f;
        } else if (t->dtype == SD_ST_F64) {
            memcpy(&v, p + 8 * i, 8);
        } else if (t->dtype == SD_ST_F16 || t->dtype == SD_ST_BF16) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            v = t->dtype == SD_ST_F16 ? sd_f16_to_f32(h) : sd_bf16_to_f32(h);
        } else {
            return 0;
        }
        stats_add(st, v);
    }
    return 1;
}

static int inspect_safetensors(const char *path, const inspect_opts *o)
{
    sd_st_file f;
    sd_err err;
    if (sd_st_open(path, &f, &err)) {
        fprintf(stderr, "sdtool inspect: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    const size_t n = sd_st_count(&f);
    size_t per_dtype[SD_ST_DTYPE_COUNT] = {0};
    int64_t params = 0;
    for (size_t i = 0; i < n; i++) {
        per_dtype[f.tensors[i].dtype]++;
        params += f.tensors[i].numel;
    }
    printf("%s: safetensors, %zu tensors, %lld elements, header %llu bytes, file %zu bytes\n", path,
           n, (long long)params, (unsigned long long)f.header_len, f.size);
    printf("dtypes:");
    for (int d = 0; d < SD_ST_DTYPE_COUNT; d++)
        if (per_dtype[d])
            printf(" %s %zu", sd_st_dtype_name((sd_st_dtype)d), per_dtype[d]);
    printf("\n");
    for (size_t i = 0; i < sd_st_metadata_count(&f); i++) {
        const sd_st_meta *m = sd_st_metadata_at(&f, i);
        printf("metadata %s = %s\n", m->key, m->value);
    }
    /* the top-level groups (the name up to the first '.'), in name order */
    printf("groups:");
    for (size_t i = 0; i < n;) {
        const char *a = f.by_name[i]->name, *dot = strchr(a, '.');
        const size_t len = dot ? (size_t)(dot - a) : strlen(a);
        size_t j = i, count = 0;
        int64_t numel = 0;
        for (; j < n && !strncmp(f.by_name[j]->name, a, len) &&
               (f.by_name[j]->name[len] == '.' || f.by_name[j]->name[len] == '\0');
             j++) {
            count++;
            numel += f.by_name[j]->numel;
        }
        printf(" %.*s (%zu tensors, %lld elements)%s", (int)len, a, count, (long long)numel,
               j < n ? "," : "");
        i = j;
    }
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        const sd_st_tensor *t = f.by_name[i];
        char shape[160];
        size_t len = 0;
        shape[0] = '\0';
        for (int d = 0; d < t->ndim && len < sizeof shape - 24; d++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, "%s%lld", d ? "x" : "",
                                    (long long)t->shape[d]);
        stats s;
        const int with = o->stats && t->numel > 0 && tensor_stats(t, &s);
        printf(with ? "  %-60s %-5s %-18s" : "  %-60s %-5s %s", t->name,
               sd_st_dtype_name(t->dtype), t->ndim ? shape : "scalar");
        if (with) {
            if (s.n) {
                double mean, std;
                stats_mean_std(&s, &mean, &std);
                printf(" min %.6g max %.6g mean %.6g std %.6g", s.min, s.max, mean, std);
            }
            if (s.nan || s.inf)
                printf(" (%lld NaN, %lld inf)", (long long)s.nan, (long long)s.inf);
        }
        printf("\n");
    }
    sd_st_close(&f);
    return SD_EXIT_OK;
}

int sd_cmd_inspect(int argc, char **argv)
{
    inspect_opts o = {1, 0, 0};
    const char *path = NULL;
    struct stat st;
    sd_h5_quiet q;
    int rc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--verify"))
            o.verify = 1;
        else if (!strcmp(argv[i], "--no-stats"))
            o.stats = 0;
        else if (!strcmp(argv[i], "--config"))
            o.config = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: sdtool inspect [--verify] [--no-stats] [--config] FILE|SHARD_DIR|CHECKPOINT\n"
                   "  FILE.h5    datasets (shape, dtype, chunks, min/max/mean/std), attributes; a latent\n"
                   "             shard is also validated as training would read it\n"
                   "  FILE.safetensors  metadata, dtypes, top-level groups, every tensor (dtype,\n"
                   "             shape, min/max/mean/std)\n"
                   "  SHARD_DIR  the manifest: committed shards, their checks, uncommitted leftovers\n"
                   "  CHECKPOINT a checkpoint directory (step-N: step, ranks, sharding, datasets, the\n"
                   "             writer's configuration) or a checkpoint root (its step directories\n"
                   "             and the one `latest` names)\n"
                   "  --verify   recompute each shard's or checkpoint dataset's checksum\n"
                   "  --no-stats skip the value statistics (a pass over all data)\n"
                   "  --config   a checkpoint's run namelist (the configuration that wrote it)\n"
                   "exit status: 0 described, 1 a check failed or PATH cannot be read, 2 bad usage or a\n"
                   "folder that is no shard directory (manifest.json), checkpoint (state.h5) or\n"
                   "checkpoint root (latest)\n");
            return SD_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "sdtool inspect: unknown option '%s' (see sdtool inspect --help)\n", argv[i]);
            return SD_EXIT_USAGE;
        } else if (path) {
            fprintf(stderr, "sdtool inspect: one FILE or DIR at a time (got '%s' and '%s')\n", path, argv[i]);
            return SD_EXIT_USAGE;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "usage: sdtool inspect [--verify] [--no-stats] [--config] FILE|SHARD_DIR|CHECKPOINT\n");
        return SD_EXIT_USAGE;
    }
    if (stat(path, &st) != 0) {
        fprintf(stderr, "sdtool inspect: cannot open '%s': %s\n", path, strerror(errno));
        return SD_EXIT_FAILURE;
    }
    if (!S_ISDIR(st.st_mode) && looks_like_safetensors(path))
        return inspect_safetensors(path, &o);
    sd_h5_quiet_begin(&q);
    if (!S_ISDIR(st.st_mode))
        rc = inspect_file(path, &o);
    else if (file_in(path, SD_CKPT_STATE_FILE) || is_step_dir(path))
        rc = inspect_checkpoint(path, &o);
    /* a root without latest: a first commit interrupted before it, which a resume still takes */
    else if (file_in(path, SD_CKPT_LATEST) || dir_has_name(path, is_step_name))
        rc = inspect_ckpt_root(path, &o);
    /* leftovers of a shard writer: a shard directory that has nothing committed */
    else if (file_in(path, SD_SHARD_MANIFEST) || dir_has_name(path, is_shard_name))
        rc = inspect_dir(path, &o);
    else {
        fprintf(stderr,
                "sdtool inspect: '%s' is no shard directory (no %s, no shard-* files), no checkpoint "
                "(no %s) and no checkpoint root (no %s)\n",
                path, SD_SHARD_MANIFEST, SD_CKPT_STATE_FILE, SD_CKPT_LATEST);
        rc = SD_EXIT_USAGE;
    }
    sd_h5_quiet_end(&q);
    fflush(stdout);
    return rc;
}
