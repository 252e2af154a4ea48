/* A model's parameters in one flat fp32 buffer: allocation, name index, loading from a
 * safetensors set (key spellings of real snapshots, dtype conversion, layout permutation) and
 * counter-based random initialization. */
#include "sdtrain/weights.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdtrain/check.h"
#include "sdtrain/ops.h"
#include "sdtrain/rng.h"

/* ---- allocation and the name index ------------------------------------------------------- */

static int cmp_param_by_name(const void *a, const void *b)
{
    return strcmp((*(const sd_param *const *)a)->name, (*(const sd_param *const *)b)->name);
}

int sd_weights_check_size(const sd_param_table *table, const char *what, sd_err *err)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double bytes = (double)table->total_floats * (double)sizeof(float);
    const double memory = pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
    if (table->total_floats > SIZE_MAX / sizeof(float) || (memory > 0.0 && bytes > memory))
        return sd_err_set(err, "%s has %.3g parameters: %.1f GB in fp32, more than the %.1f GB "
                          "of memory of this node", what, (double)table->total_floats, bytes * 1e-9,
                          memory * 1e-9);
    return 0;
}

void sd_weights_init(sd_weights *w, sd_param_table *table)
{
    size_t bytes;
    const sd_param **order;
    memset(w, 0, sizeof *w);
    w->table = *table;
    memset(table, 0, sizeof *table);
    /* 256-byte aligned like the offsets (SD_PARAM_ALIGN floats), and at least one line so that
     * an empty table still gets a valid pointer. */
    bytes = (w->table.total_floats * sizeof(float) + 255) / 256 * 256;
    if (bytes == 0)
        bytes = 256;
    w->data = aligned_alloc(256, bytes);
    SD_CHECK(w->data != NULL, "cannot allocate %zu bytes of parameters", bytes);
    memset(w->data, 0, bytes);
    /* the name index: sort pointers (no global comparator state), keep their indices */
    order = sd_xmalloc((w->table.n ? w->table.n : 1) * sizeof *order);
    for (size_t i = 0; i < w->table.n; i++)
        order[i] = &w->table.params[i];
    qsort(order, w->table.n, sizeof *order, cmp_param_by_name);
    w->by_name = sd_xmalloc((w->table.n ? w->table.n : 1) * sizeof *w->by_name);
    for (size_t i = 0; i < w->table.n; i++)
        w->by_name[i] = (size_t)(order[i] - w->table.params);
    free(order);
}

void sd_weights_free(sd_weights *w)
{
    if (!w)
        return;
    free(w->data);
    free(w->by_name);
    sd_param_table_free(&w->table);
    memset(w, 0, sizeof *w);
}

/* Index of `name` in the table, or -1. */
static long find_index(const sd_weights *w, const char *name)
{
    size_t lo = 0, hi = w->table.n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(w->table.params[w->by_name[mid]].name, name);
        if (c == 0)
            return (long)w->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

float *sd_weights_find(const sd_weights *w, const char *name)
{
    long i = w && w->by_name ? find_index(w, name) : -1;
    return i < 0 ? NULL : w->data + w->table.params[i].offset;
}

float *sd_weights_get(const sd_weights *w, const char *name)
{
    float *p = sd_weights_find(w, name);
    SD_CHECK(p != NULL, "the model has no parameter '%s'", name);
    return p;
}

/* ---- key spellings ------------------------------------------------------------------------ */

/* What a file's key means for this table: 1 = a tensor to ignore (transformers' old
 * position_ids buffer), 0 = *param receives the table index (or -1: not a parameter). */
static int resolve_key(const sd_weights *w, const char *key, long *param)
{
    char buf[SD_PARAM_NAME_MAX + 32];
    const char *dot;
    *param = find_index(w, key);
    if (*param >= 0)
        return 0;
    /* Text encoders: hub files carry "text_model.", transformers 5 writes the keys without it;
     * the old non-persistent position_ids buffer appears in files of transformers < 4.31. */
    if (find_index(w, "text_model.embeddings.position_embedding.weight") >= 0 &&
        (!strcmp(key, "text_model.embeddings.position_ids") || !strcmp(key, "embeddings.position_ids")))
        return 1;
    /* CLIPTextModelWithProjection's projection of the pooled output: SD conditions on the
     * hidden states and never uses it */
    if (find_index(w, "text_model.embeddings.position_embedding.weight") >= 0 &&
        !strcmp(key, "text_projection.weight"))
        return 1;
    if (strncmp(key, "text_model.", 11) != 0 && strlen(key) + 11 < sizeof buf) {
        snprintf(buf, sizeof buf, "text_model.%s", key);
        *param = find_index(w, buf);
        if (*param >= 0)
            return 0;
    }
    /* VAE mid-block attention in the AttentionBlock spelling (SD2 hub VAE files):
     * query/key/value/proj_attn -> to_q/to_k/to_v/to_out.0. */
    if ((!strncmp(key, "encoder.mid_block.attentions.0.", 31) ||
         !strncmp(key, "decoder.mid_block.attentions.0.", 31)) &&
        (dot = strrchr(key, '.')) != NULL && (!strcmp(dot, ".weight") || !strcmp(dot, ".bias"))) {
        static const char *const legacy[4][2] = {
            {"query", "to_q"}, {"key", "to_k"}, {"value", "to_v"}, {"proj_attn", "to_out.0"}};
        const char *leaf = key + 31;
        size_t leaf_len = (size_t)(dot - leaf);
        for (int k = 0; k < 4; k++)
            if (strlen(legacy[k][0]) == leaf_len && !strncmp(leaf, legacy[k][0], leaf_len)) {
                snprintf(buf, sizeof buf, "%.31s%s%s", key, legacy[k][1], dot);
                *param = find_index(w, buf);
                return 0;
            }
    }
    return 0;
}

/* ---- the error report --------------------------------------------------------------------- */

#define SHOW_MAX 20 /* entries listed per category */

/* One kind of problem: how many, and the text of the first SHOW_MAX. */
typedef struct category {
    const char *title;
    size_t count;
    char *items[SHOW_MAX];
} category;

static void cat_add(category *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void cat_add(category *c, const char *fmt, ...)
{
    char item[600];
    va_list ap;
    if (c->count < SHOW_MAX) {
        va_start(ap, fmt);
        vsnprintf(item, sizeof item, fmt, ap);
        va_end(ap);
        c->items[c->count] = sd_xstrdup(item);
    }
    c->count++;
}

/* One message: "source: the weights do not match ...: missing (n): a, b, ... and k more;
 * unexpected (m): ...". sd_err holds 1024 bytes, so every non-empty category gets an equal
 * share of the room after the header and says how many entries it could not show. */
static void report(sd_err *err, const char *source, size_t expected, const category *cats,
                   int ncat)
{
    char out[sizeof err->msg];
    size_t len, share;
    int nonempty = 0, k = 0;
    for (int i = 0; i < ncat; i++)
        nonempty += cats[i].count > 0;
    len = (size_t)snprintf(out, sizeof out, "%s: the weights do not match the model (%zu tensors "
                           "expected): ", source, expected);
    if (len >= sizeof out)
        len = sizeof out - 1;
    share = nonempty ? (sizeof out - 1 - len) / (size_t)nonempty : 0;
    for (int i = 0; i < ncat; i++) {
        const category *c = &cats[i];
        size_t end, shown = 0, avail = sizeof out - 1 - len;
        char tail[48];
        if (!c->count)
            continue;
        end = len + (share < avail ? share : avail); /* this category's last byte */
        len += (size_t)snprintf(out + len, sizeof out - len, "%s%s (%zu): ", k++ ? "; " : "",
                                c->title, c->count);
        if (len >= sizeof out)
            len = sizeof out - 1;
        for (size_t j = 0; j < c->count && j < SHOW_MAX; j++) {
            size_t need = strlen(c->items[j]) + (j ? 2 : 0);
            /* keep room for the ", ... and N more" that follows a cut */
            size_t reserve = j + 1 < c->count ? 24 : 0;
            if (len + need + reserve > end && j > 0)
                break;
            len += (size_t)snprintf(out + len, sizeof out - len, "%s%s", j ? ", " : "",
                                    c->items[j]);
            if (len >= sizeof out)
                len = sizeof out - 1;
            shown++;
        }
        if (shown < c->count) {
            snprintf(tail, sizeof tail, ", ... and %zu more", c->count - shown);
            len += (size_t)snprintf(out + len, sizeof out - len, "%s", tail);
            if (len >= sizeof out)
                len = sizeof out - 1;
        }
    }
    sd_err_set(err, "%s", out);
}

/* ---- loading ------------------------------------------------------------------------------ */

static int float_dtype(sd_st_dtype d)
{
    return d == SD_ST_F32 || d == SD_ST_F16 || d == SD_ST_BF16 || d == SD_ST_F64;
}

/* 0: the file's shape is acceptable for the parameter (identical, or a [o, i, 1, 1] 1x1 conv
 * for a linear weight: LDM-style VAE attention, the same bytes). */
static int shape_ok(const sd_param *p, const sd_st_tensor *t)
{
    if (t->ndim == p->ndim) {
        for (int i = 0; i < p->ndim; i++)
            if (t->shape[i] != p->shape[i])
                return 0;
        return 1;
    }
    if (p->kind == SD_PARAM_LINEAR && p->ndim == 2 && t->ndim == 4)
        return t->shape[0] == p->shape[0] && t->shape[1] == p->shape[1] && t->shape[2] == 1 &&
               t->shape[3] == 1;
    return 0;
}

int sd_weights_load(sd_weights *w, const sd_st_set *set, sd_err *err)
{
    enum { MISSING, UNEXPECTED, SHAPE, DTYPE, DUPLICATE, READ, NCAT };
    category cats[NCAT] = {
        [MISSING] = {"missing"},
        [UNEXPECTED] = {"unexpected"},
        [SHAPE] = {"wrong shape"},
        [DTYPE] = {"unsupported dtype"},
        [DUPLICATE] = {"given twice"},
        [READ] = {"unreadable"},
    };
    const sd_st_tensor **taken = sd_xcalloc(w->table.n ? w->table.n : 1, sizeof *taken);
    const char *source = sd_st_set_source(set);
    size_t n = sd_st_set_count(set), conv_max = 0;
    float *tmp;
    int failed = 0;

    for (size_t i = 0; i < w->table.n; i++)
        if (w->table.params[i].kind == SD_PARAM_CONV && w->table.params[i].numel > conv_max)
            conv_max = w->table.params[i].numel;
    tmp = sd_xmalloc((conv_max ? conv_max : 1) * sizeof *tmp);

    for (size_t i = 0; i < n; i++) {
        const sd_st_tensor *t = sd_st_set_tensor_at(set, i);
        const char *where = source && strcmp(t->file, source) ? t->file : NULL; /* a shard */
        char s1[160], s2[160];
        long pi;
        if (resolve_key(w, t->name, &pi) == 1)
            continue;
        if (pi < 0) {
            cat_add(&cats[UNEXPECTED], "'%s'", t->name);
            continue;
        }
        const sd_param *p = &w->table.params[pi];
        if (taken[pi]) {
            cat_add(&cats[DUPLICATE], "'%s' and '%s' both give '%s'", taken[pi]->name, t->name,
                    p->name);
            continue;
        }
        taken[pi] = t;
        if (!float_dtype(t->dtype)) {
            cat_add(&cats[DTYPE], "'%s' is %s%s%s (need F32, F16, BF16 or F64)", t->name,
                    sd_st_dtype_name(t->dtype), where ? " in " : "", where ? where : "");
            continue;
        }
        if (!shape_ok(p, t)) {
            cat_add(&cats[SHAPE], "'%s' is %s, expected %s%s%s", t->name,
                    sd_shape_str(t->ndim, t->shape, s1, sizeof s1),
                    sd_shape_str(p->ndim, p->shape, s2, sizeof s2), where ? " in " : "",
                    where ? where : "");
            continue;
        }
        {
            sd_err e;
            float *dst = w->data + p->offset;
            int rc;
            if (p->kind == SD_PARAM_CONV) {
                rc = sd_st_tensor_read_f32(t, tmp, p->numel, &e);
                if (rc == 0)
                    sd_weight_from_torch(4, p->shape, sizeof(float), tmp, dst, NULL);
            } else {
                rc = sd_st_tensor_read_f32(t, dst, p->numel, &e);
            }
            if (rc != 0)
                cat_add(&cats[READ], "%s", e.msg);
        }
    }
    for (size_t i = 0; i < w->table.n; i++)
        if (!taken[i])
            cat_add(&cats[MISSING], "'%s' %s", w->table.params[i].name,
                    sd_shape_str(w->table.params[i].ndim, w->table.params[i].shape,
                                 (char[64]){0}, 64));
    free(tmp);
    free(taken);
    for (int c = 0; c < NCAT; c++)
        failed |= cats[c].count > 0;
    if (failed) {
        report(err, source ? source : "(weights)", w->table.n, cats, NCAT);
        /* never leave half-loaded weights behind */
        memset(w->data, 0, w->table.total_floats * sizeof(float));
    }
    for (int c = 0; c < NCAT; c++)
        for (size_t j = 0; j < cats[c].count && j < SHOW_MAX; j++)
            free(cats[c].items[j]);
    return failed ? -1 : 0;
}

/* ---- random initialization ---------------------------------------------------------------- */

/* Normals of tensor `index` (PyTorch element order) times `stdev`, written in our layout. The
 * stream is (seed, SD_RNG_INIT, step 0, sample = tensor index), so a tensor's values do not
 * depend on the other tensors, the thread count or our internal layout. */
static void fill_normal(const sd_param *p, size_t index, uint64_t seed, float stdev, float *dst,
                        float *tmp)
{
    const size_t chunk = (size_t)1 << 16;
    const size_t n = p->numel;
    float *out = p->kind == SD_PARAM_CONV ? tmp : dst;
    const long nchunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < nchunks; c++) {
        size_t off = (size_t)c * chunk, m = n - off < chunk ? n - off : chunk;
        int rc = sd_rng_fill_normal_at(seed, SD_RNG_PURPOSE(SD_RNG_INIT, 0), 0, index, off,
                                       out + off, m);
        SD_CHECK(rc == 0, "random stream out of range for tensor %zu", index);
        for (size_t i = 0; i < m; i++)
            out[off + i] *= stdev;
    }
    if (p->kind == SD_PARAM_CONV)
        sd_weight_from_torch(4, p->shape, sizeof(float), tmp, dst, NULL);
}

void sd_weights_init_random(sd_weights *w, uint64_t seed)
{
    size_t conv_max = 0;
    float *tmp;
    for (size_t i = 0; i < w->table.n; i++)
        if (w->table.params[i].kind == SD_PARAM_CONV && w->table.params[i].numel > conv_max)
            conv_max = w->table.params[i].numel;
    tmp = sd_xmalloc((conv_max ? conv_max : 1) * sizeof *tmp);
    memset(w->data, 0, w->table.total_floats * sizeof(float));
    for (size_t i = 0; i < w->table.n; i++) {
        const sd_param *p = &w->table.params[i];
        float *dst = w->data + p->offset;
        size_t len = strlen(p->name);
        int is_weight = len >= 7 && !strcmp(p->name + len - 7, ".weight");
        switch (p->kind) {
        case SD_PARAM_LINEAR:
            fill_normal(p, i, seed, (float)(1.0 / sqrt((double)p->shape[1])), dst, tmp);
            break;
        case SD_PARAM_CONV:
            fill_normal(p, i, seed,
                        (float)(1.0 / sqrt((double)(p->shape[1] * p->shape[2] * p->shape[3]))),
                        dst, tmp);
            break;
        case SD_PARAM_EMBEDDING:
            fill_normal(p, i, seed, 0.02f, dst, tmp);
            break;
        case SD_PARAM_VECTOR:
            /* vectors named *.weight are norm scales; biases and norm shifts stay 0 */
            if (is_weight)
                for (size_t k = 0; k < p->numel; k++)
                    dst[k] = 1.0f;
            break;
        }
    }
    free(tmp);
}

/* ---- export ------------------------------------------------------------------------------- */

int sd_weights_save_torch(const sd_param_table *table, const float *data, const char *path,
                          sd_err *err)
{
    sd_st_writer *wr = sd_st_writer_new();
    float *torch = sd_xcalloc(table->total_floats ? table->total_floats : 1, sizeof *torch);
    int rc = 0;
    for (size_t i = 0; i < table->n && !rc; i++) {
        const sd_param *p = &table->params[i];
        sd_weight_to_torch(p->ndim, p->shape, sizeof(float), data + p->offset, torch + p->offset);
        rc = sd_st_writer_add(wr, p->name, SD_ST_F32, p->ndim, p->shape, torch + p->offset,
                              p->numel * sizeof(float), err);
    }
    if (!rc)
        rc = sd_st_writer_set_metadata(wr, "format", "pt", err);
    if (!rc)
        rc = sd_st_writer_write(wr, path, err);
    sd_st_writer_free(wr);
    free(torch);
    return rc;
}
