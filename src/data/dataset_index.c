/* Builds the dataset index: img2dataset folders, webdataset tar shards, TSV manifests. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dataset_internal.h"
#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/progress.h"
#include "sdtrain/tar.h"
#include "sdtrain/utf8.h"

/* Longest key or member path we index; longer names are ignored with a note. */
#define KEY_MAX 4096
/* Deepest folder nesting walked (a guard against pathological trees, not a real limit). */
#define WALK_DEPTH_MAX 64

/* ---- pool, suffixes, notes ------------------------------------------------------------------ */

uint64_t sd_dataset_pool_add_(sd_dataset *ds, const char *s, size_t n)
{
    if (ds->pool_size + n + 1 > ds->pool_cap) {
        size_t cap = ds->pool_cap ? ds->pool_cap : 1 << 16;
        while (cap < ds->pool_size + n + 1)
            cap *= 2;
        ds->pool = sd_xrealloc(ds->pool, cap);
        ds->pool_cap = cap;
    }
    uint64_t off = ds->pool_size;
    memcpy(ds->pool + off, s, n);
    ds->pool[off + n] = '\0';
    ds->pool_size += n + 1;
    return off;
}

uint64_t sd_dataset_key_add_(sd_dataset *ds, const char *s, size_t n)
{
    uint64_t off = sd_dataset_pool_add_(ds, s, n);
    if (!sd_utf8_is_valid(s, n)) {
        char *t = sd_xmalloc(3 * n + 1);
        size_t m = sd_utf8_repair(s, n, t, NULL);
        sd_dataset_pool_add_(ds, t, m);
        free(t);
    }
    return off;
}

uint16_t sd_dataset_suffix_id_(sd_dataset *ds, const char *s, size_t n)
{
    if (n == 0)
        return SFX_EMPTY;
    for (int i = SFX_EMPTY + 1; i < ds->n_suffixes; i++) {
        const char *t = ds->pool + ds->suffixes[i];
        if (strncmp(t, s, n) == 0 && t[n] == '\0')
            return (uint16_t)i;
    }
    /* Only known extensions (with their dot) become suffixes, so the table stays a few dozen
     * entries even with every upper/lower-case spelling. */
    SD_CHECK(ds->n_suffixes < UINT16_MAX, "suffix table full (%d)", ds->n_suffixes);
    ds->suffixes = sd_xrealloc(ds->suffixes, (size_t)(ds->n_suffixes + 1) * sizeof *ds->suffixes);
    ds->suffixes[ds->n_suffixes] = sd_dataset_pool_add_(ds, s, n);
    return (uint16_t)ds->n_suffixes++;
}

void sd_dataset_note_(sd_dataset *ds, const char *fmt, ...)
{
    if (ds->n_notes < SD_DATASET_MAX_NOTES) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ds->notes[ds->n_notes], SD_DATASET_NOTE_MAX, fmt, ap);
        va_end(ap);
        ds->n_notes++;
    }
    ds->n_notes_total++;
}

uint64_t sd_dataset_new_id_(void)
{
    static atomic_uint_fast64_t next = 1;
    return (uint64_t)atomic_fetch_add(&next, 1);
}

static struct sd_dataset_entry *new_entry(sd_dataset *ds)
{
    if (ds->n_entries == ds->entries_cap) {
        ds->entries_cap = ds->entries_cap ? ds->entries_cap * 2 : 1024;
        ds->entries = sd_xrealloc(ds->entries, (size_t)ds->entries_cap * sizeof *ds->entries);
    }
    struct sd_dataset_entry *e = &ds->entries[ds->n_entries++];
    memset(e, 0, sizeof *e);
    return e;
}

/* ---- extensions ----------------------------------------------------------------------------- */

enum { KIND_OTHER = 0, KIND_IMAGE, KIND_CAPTION, KIND_JSON };

static int ext_is(const char *ext, size_t n, const char *lower)
{
    size_t m = strlen(lower);
    if (n != m)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)ext[i]) != lower[i])
            return 0;
    return 1;
}

/* What a file with extension ext[0..n) (no dot) is; *format for images. */
static int classify_ext(const char *ext, size_t n, sd_image_ext *format)
{
    static const char *const unsupported[] = {"webp", "gif", "bmp", "tif", "tiff", "avif", "heic",
                                               "heif", "jxl", "jp2", "j2k", "ppm", "pgm", "pbm",
                                               "pnm", "tga", "ico"};
    if (ext_is(ext, n, "jpg") || ext_is(ext, n, "jpeg")) {
        *format = SD_IMAGE_EXT_JPEG;
        return KIND_IMAGE;
    }
    if (ext_is(ext, n, "png")) {
        *format = SD_IMAGE_EXT_PNG;
        return KIND_IMAGE;
    }
    for (size_t i = 0; i < sizeof unsupported / sizeof *unsupported; i++)
        if (ext_is(ext, n, unsupported[i])) {
            *format = SD_IMAGE_EXT_UNSUPPORTED;
            return KIND_IMAGE;
        }
    if (ext_is(ext, n, "txt"))
        return KIND_CAPTION;
    if (ext_is(ext, n, "json"))
        return KIND_JSON;
    return KIND_OTHER;
}

/* ---- sorting by key ------------------------------------------------------------------------- */

/* Stable bottom-up merge sort of the entries by key (strcmp, i.e. byte order, which for UTF-8
 * is code point order: the same as Python's sorted() on the decoded keys). */
static void sort_entries_by_key(sd_dataset *ds)
{
    int64_t n = ds->n_entries;
    if (n < 2)
        return;
    int64_t *a = sd_xmalloc((size_t)n * sizeof *a), *b = sd_xmalloc((size_t)n * sizeof *b);
    const char **keys = sd_xmalloc((size_t)n * sizeof *keys);
    for (int64_t i = 0; i < n; i++) {
        a[i] = i;
        keys[i] = ds->pool + ds->entries[i].key;
    }
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            sd_progress_tick(); /* hundreds of millions of keys sort for minutes */
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                b[k++] = strcmp(keys[a[j]], keys[a[i]]) < 0 ? a[j++] : a[i++];
            while (i < mid)
                b[k++] = a[i++];
            while (j < hi)
                b[k++] = a[j++];
        }
        int64_t *t = a;
        a = b;
        b = t;
    }
    struct sd_dataset_entry *sorted = sd_xmalloc((size_t)n * sizeof *sorted);
    for (int64_t i = 0; i < n; i++)
        sorted[i] = ds->entries[a[i]];
    free(ds->entries);
    ds->entries = sorted;
    ds->entries_cap = n;
    free(a);
    free(b);
    free(keys);
}

/* ---- files: an img2dataset folder ------------------------------------------------------------ */

typedef struct name_rec {
    const char *name; /* set once the folder's name buffer stops moving */
    size_t off;       /* in the folder's name buffer */
    size_t len;
    size_t stem_len;  /* up to the last dot (the whole name when there is none) */
    int kind;
    sd_image_ext format;
} name_rec;

typedef struct walker {
    sd_dataset *ds;
    char rel[KEY_MAX + 1]; /* relative folder with a trailing '/', "" at the root */
    size_t rel_len;
    dev_t dev[WALK_DEPTH_MAX + 1];
    ino_t ino[WALK_DEPTH_MAX + 1];
    int depth;
    /* the first folder the storage failed to list (sd_input_storage_errno): the index would be
     * a part of the dataset, so the open fails instead and the walk stops there */
    int storage_errno;
    char storage_what[KEY_MAX + 256];
} walker;

/* Folder `name` (under w->rel) could not be opened or read, errno e: a failure of the storage is
 * recorded (returns 1); anything else is the dataset's (returns 0: skipped and counted). */
static int walk_storage_failed(walker *w, const char *name, int e)
{
    if (!sd_input_storage_errno(e))
        return 0;
    if (!w->storage_errno) {
        w->storage_errno = e;
        snprintf(w->storage_what, sizeof w->storage_what, "%s/%s%s", w->ds->root, w->rel, name);
    }
    return 1;
}

static int cmp_name_rec(const void *pa, const void *pb)
{
    const name_rec *a = pa, *b = pb;
    size_t m = a->stem_len < b->stem_len ? a->stem_len : b->stem_len;
    int c = memcmp(a->name, b->name, m);
    if (c)
        return c;
    if (a->stem_len != b->stem_len)
        return a->stem_len < b->stem_len ? -1 : 1;
    return strcmp(a->name + a->stem_len, b->name + b->stem_len);
}

static int cmp_str_ptr(const void *pa, const void *pb)
{
    return strcmp(*(const char *const *)pa, *(const char *const *)pb);
}

/* Emits the samples of one folder's files (sorted so that files of a stem are adjacent). */
static void emit_folder_samples(walker *w, const char *names, name_rec *recs, size_t n)
{
    sd_dataset *ds = w->ds;
    for (size_t k = 0; k < n; k++)
        recs[k].name = names + recs[k].off;
    qsort(recs, n, sizeof *recs, cmp_name_rec);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && recs[j].stem_len == recs[i].stem_len &&
               memcmp(names + recs[j].off, names + recs[i].off, recs[i].stem_len) == 0)
            j++;
        const name_rec *img = NULL, *cap = NULL, *json = NULL;
        for (size_t k = i; k < j; k++) {
            const name_rec *r = &recs[k];
            const name_rec **slot = r->kind == KIND_IMAGE ? &img : r->kind == KIND_CAPTION ? &cap
                                  : r->kind == KIND_JSON ? &json : NULL;
            if (!slot)
                ds->stats.n_ignored++;
            else if (*slot)
                ds->stats.n_duplicates++;
            else
                *slot = r;
        }
        if (img && w->rel_len + img->stem_len <= KEY_MAX) {
            struct sd_dataset_entry *e = new_entry(ds);
            char key[KEY_MAX + 1];
            memcpy(key, w->rel, w->rel_len);
            memcpy(key + w->rel_len, names + img->off, img->stem_len);
            e->key = sd_dataset_key_add_(ds, key, w->rel_len + img->stem_len);
            e->image_kind = (uint8_t)img->format;
            e->image_sfx = sd_dataset_suffix_id_(ds, names + img->off + img->stem_len,
                                                 img->len - img->stem_len);
            if (cap) {
                e->flags |= ENTRY_CAPTION;
                e->caption_sfx = sd_dataset_suffix_id_(ds, names + cap->off + cap->stem_len,
                                                       cap->len - cap->stem_len);
            }
            if (json) {
                e->flags |= ENTRY_JSON;
                e->json_sfx = sd_dataset_suffix_id_(ds, names + json->off + json->stem_len,
                                                    json->len - json->stem_len);
            }
        } else if (img) {
            ds->stats.n_ignored += (int64_t)(j - i);
            sd_dataset_note_(ds, "%s/%s%s: path longer than %d bytes, ignored", ds->root, w->rel,
                             names + img->off, KEY_MAX);
        } else {
            if (cap)
                ds->stats.n_orphan_captions++;
            if (json)
                ds->stats.n_ignored++;
        }
        i = j;
    }
}

/* Lists folder `dfd` (relative path w->rel), indexes its files and descends into its
 * subfolders. Takes ownership of dfd. */
static void walk_folder(walker *w, int dfd)
{
    sd_dataset *ds = w->ds;
    struct stat st;
    if (w->storage_errno) { /* the storage failed earlier: the open fails, read no further */
        close(dfd);
        return;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        const int e = errno;
        if (!walk_storage_failed(w, "", e)) {
            ds->stats.n_unreadable_dirs++;
            sd_dataset_note_(ds, "%s/%s: %s", ds->root, w->rel, strerror(e));
        }
        close(dfd);
        return;
    }
    if (sd_fstat(dfd, &st) == 0) {
        for (int k = 0; k < w->depth; k++)
            if (w->dev[k] == st.st_dev && w->ino[k] == st.st_ino) {
                sd_dataset_note_(ds, "%s/%s: symbolic link loop, not followed", ds->root, w->rel);
                closedir(d);
                return;
            }
        w->dev[w->depth] = st.st_dev;
        w->ino[w->depth] = st.st_ino;
    }

    char *names = NULL;
    size_t names_len = 0, names_cap = 0, n_recs = 0, recs_cap = 0, n_dirs = 0, dirs_cap = 0;
    name_rec *recs = NULL;
    size_t *dir_offs = NULL;
    struct dirent *de;
    errno = 0;
    while ((de = sd_readdir(d)) != NULL) {
        const char *name = de->d_name;
        sd_progress_tick(); /* a listing of millions of files is work (sdtrain/progress.h) */
        if (name[0] == '.') {
            /* ".", "..", and hidden entries (.git, .ipynb_checkpoints, .DS_Store) */
            if (strcmp(name, ".") && strcmp(name, "..") && de->d_type != DT_DIR)
                ds->stats.n_ignored++;
            continue;
        }
        int is_dir = de->d_type == DT_DIR, is_reg = de->d_type == DT_REG;
        if (de->d_type == DT_UNKNOWN || de->d_type == DT_LNK) {
            struct stat cs;
            if (sd_fstatat(dfd, name, &cs, 0) == 0) { /* follows links */
                is_dir = S_ISDIR(cs.st_mode);
                is_reg = S_ISREG(cs.st_mode);
            }
        }
        if (!is_dir && !is_reg) {
            ds->stats.n_ignored++;
            continue;
        }
        size_t len = strlen(name);
        if (names_len + len + 1 > names_cap) {
            names_cap = names_cap ? names_cap * 2 : 1 << 14;
            while (names_len + len + 1 > names_cap)
                names_cap *= 2;
            names = sd_xrealloc(names, names_cap);
        }
        memcpy(names + names_len, name, len + 1);
        if (is_dir) {
            if (n_dirs == dirs_cap) {
                dirs_cap = dirs_cap ? dirs_cap * 2 : 64;
                dir_offs = sd_xrealloc(dir_offs, dirs_cap * sizeof *dir_offs);
            }
            dir_offs[n_dirs++] = names_len;
        } else {
            const char *dot = strrchr(name, '.');
            name_rec r = {NULL, names_len, len, dot ? (size_t)(dot - name) : len, KIND_OTHER, SD_IMAGE_EXT_UNKNOWN};
            if (dot)
                r.kind = classify_ext(dot + 1, len - r.stem_len - 1, &r.format);
            if (n_recs == recs_cap) {
                recs_cap = recs_cap ? recs_cap * 2 : 256;
                recs = sd_xrealloc(recs, recs_cap * sizeof *recs);
            }
            recs[n_recs++] = r;
        }
        names_len += len + 1;
        errno = 0;
    }
    if (errno) {
        const int e = errno;
        if (!walk_storage_failed(w, "", e)) {
            ds->stats.n_unreadable_dirs++;
            sd_dataset_note_(ds, "%s/%s: reading the folder failed: %s (listed part kept)",
                             ds->root, w->rel, strerror(e));
        }
    }

    if (n_recs)
        emit_folder_samples(w, names, recs, n_recs);

    if (n_dirs) {
        const char **sub = sd_xmalloc(n_dirs * sizeof *sub);
        for (size_t k = 0; k < n_dirs; k++)
            sub[k] = names + dir_offs[k];
        qsort(sub, n_dirs, sizeof *sub, cmp_str_ptr);
        size_t saved = w->rel_len;
        for (size_t k = 0; k < n_dirs; k++) {
            size_t len = strlen(sub[k]);
            if (w->depth + 1 > WALK_DEPTH_MAX || saved + len + 1 > KEY_MAX) {
                sd_dataset_note_(ds, "%s/%s%s: folder nested too deep or path too long, not read",
                                 ds->root, w->rel, sub[k]);
                ds->stats.n_unreadable_dirs++;
                continue;
            }
            int cfd = sd_openat(dfd, sub[k], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (cfd < 0) {
                const int e = errno;
                if (!walk_storage_failed(w, sub[k], e)) {
                    ds->stats.n_unreadable_dirs++;
                    sd_dataset_note_(ds, "%s/%s%s: %s", ds->root, w->rel, sub[k], strerror(e));
                }
                continue;
            }
            memcpy(w->rel + saved, sub[k], len);
            w->rel[saved + len] = '/';
            w->rel_len = saved + len + 1;
            w->rel[w->rel_len] = '\0';
            w->depth++;
            walk_folder(w, cfd);
            w->depth--;
            w->rel_len = saved;
            w->rel[saved] = '\0';
        }
        free(sub);
    }
    free(names);
    free(recs);
    free(dir_offs);
    closedir(d);
}

static int index_files(sd_dataset *ds, sd_err *err)
{
    int dfd = sd_open(ds->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0) {
        const int e = errno;
        sd_err_set(err, "%s: %s", ds->root,
                   e == ENOTDIR ? "not a folder (input_format 'files' needs the img2dataset "
                                  "output folder)" : strerror(e));
        return sd_input_storage_errno(e) ? sd_err_storage_errno(err, e) : -1;
    }
    walker *w = sd_xcalloc(1, sizeof *w);
    w->ds = ds;
    walk_folder(w, dfd);
    if (w->storage_errno) {
        sd_err_errno(err, w->storage_errno, "%s", w->storage_what);
        free(w);
        return -1;
    }
    free(w);
    sort_entries_by_key(ds);
    if (ds->n_entries == 0)
        return sd_err_set(err, "%s: no samples: no image files (.jpg, .jpeg, .png, .webp, ...) in "
                          "it or its subfolders%s%s", ds->root, ds->n_notes ? "; first problem: " : "",
                          ds->n_notes ? ds->notes[0] : "");
    return 0;
}

/* ---- tsv: a manifest ------------------------------------------------------------------------ */

/* The whole regular file at `path`, NUL-terminated, malloc'd; NULL on failure (err says why). */
static char *read_whole(const char *path, size_t *len, sd_err *err)
{
    struct stat st;
    int fd = sd_open_regular(path, &st); /* a FIFO does not block the open: it is refused */
    if (fd == -1) {
        sd_err_input_errno(err, errno, "%s", path);
        return NULL;
    }
    if (fd < 0) {
        sd_err_set(err, "%s: not a regular file", path);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1;
    void *b = sd_xmalloc(cap);
    if (sd_read_to_end(fd, &b, &cap, len)) {
        sd_err_input_errno(err, errno, "%s", path);
        free(b);
        close(fd);
        return NULL;
    }
    close(fd);
    return b;
}

static int is_header_field(const char *f, size_t n)
{
    static const char *const names[] = {"path", "file", "filename", "filepath", "image", "image_path"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (ext_is(f, n, names[i]))
            return 1;
    return 0;
}

static int index_tsv(sd_dataset *ds, sd_err *err)
{
    size_t len = 0;
    char *text = read_whole(ds->input, &len, err);
    if (!text)
        return -1;
    if (len >= 2 && (memcmp(text, "\xFF\xFE", 2) == 0 || memcmp(text, "\xFE\xFF", 2) == 0)) {
        /* Windows PowerShell's `>` and Excel's "Unicode Text" write UTF-16: every line would
         * be a bad line for its NUL bytes, which says nothing about the cause */
        int le = (unsigned char)text[0] == 0xFF;
        free(text);
        return sd_err_set(err, "%s: UTF-16%s text (byte-order mark %s); save the manifest as UTF-8",
                          ds->input, le ? "LE" : "BE", le ? "FF FE" : "FE FF");
    }
    size_t pos = 0;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0)
        pos = 3; /* a UTF-8 byte-order mark, as spreadsheet exports write */
    int line_no = 0, seen_data = 0;
    while (pos < len) {
        char *line = text + pos;
        char *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + (nl ? 1 : 0);
        line_no++;
        sd_progress_tick();
        if (n && line[n - 1] == '\r')
            n--;
        if (n == 0 || line[0] == '#')
            continue;
        char *tab = memchr(line, '\t', n);
        size_t path_len = tab ? (size_t)(tab - line) : n;
        if (!seen_data) {
            seen_data = 1;
            if (tab && is_header_field(line, path_len))
                continue;
        }
        if (path_len == 0 || path_len > KEY_MAX || memchr(line, '\0', path_len)) {
            ds->stats.n_bad_lines++;
            sd_dataset_note_(ds, "%s:%d: %s, line ignored", ds->input, line_no,
                             path_len == 0 ? "empty path" : path_len > KEY_MAX ? "path too long"
                                                                                : "NUL byte in the path");
            continue;
        }
        /* The key drops a known image extension only, so that key + suffix is the path. */
        size_t key_len = path_len;
        sd_image_ext format = SD_IMAGE_EXT_UNKNOWN;
        size_t base = path_len, dot = 0;
        while (base > 0 && line[base - 1] != '/')
            base--;
        for (size_t k = base; k < path_len; k++)
            if (line[k] == '.')
                dot = k;
        if (dot > base) {
            sd_image_ext f;
            if (classify_ext(line + dot + 1, path_len - dot - 1, &f) == KIND_IMAGE) {
                key_len = dot;
                format = f;
            }
        }
        struct sd_dataset_entry *e = new_entry(ds);
        e->key = sd_dataset_key_add_(ds, line, key_len);
        e->image_sfx = sd_dataset_suffix_id_(ds, line + key_len, path_len - key_len);
        e->image_kind = (uint8_t)format;
        if (tab) {
            size_t cap_len = n - path_len - 1;
            if (cap_len > UINT32_MAX)
                cap_len = UINT32_MAX; /* a 4 GiB manifest line: keep what fits */
            e->flags |= ENTRY_CAPTION;
            e->caption_off = sd_dataset_pool_add_(ds, tab + 1, cap_len);
            e->caption_size = (uint32_t)cap_len;
        }
    }
    free(text);
    if (ds->n_entries == 0)
        return sd_err_set(err, "%s: no samples: the manifest lists no image paths%s%s", ds->input,
                          ds->n_notes ? "; first problem: " : "", ds->n_notes ? ds->notes[0] : "");
    return 0;
}

/* ---- webdataset: tar shards ------------------------------------------------------------------ */

/* Key -> entry lookup within one tar. Slots carry the tar's generation so that moving to the
 * next tar costs nothing, however big the table grew. */
typedef struct key_table {
    uint64_t *gen;
    int64_t *entry;
    size_t cap, used;
    uint64_t current;
} key_table;

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void key_table_grow(key_table *t, const sd_dataset *ds)
{
    size_t old_cap = t->cap;
    uint64_t *old_gen = t->gen;
    int64_t *old_entry = t->entry;
    t->cap = old_cap ? old_cap * 2 : 4096;
    t->gen = sd_xcalloc(t->cap, sizeof *t->gen);
    t->entry = sd_xmalloc(t->cap * sizeof *t->entry);
    for (size_t i = 0; i < old_cap; i++) {
        if (old_gen[i] != t->current)
            continue;
        const char *k = ds->pool + ds->entries[old_entry[i]].key;
        size_t h = (size_t)hash_bytes(k, strlen(k)) & (t->cap - 1);
        while (t->gen[h] == t->current)
            h = (h + 1) & (t->cap - 1);
        t->gen[h] = t->current;
        t->entry[h] = old_entry[i];
    }
    free(old_gen);
    free(old_entry);
}

/* The entry of key k[0..n) in the current tar, created when new. */
static struct sd_dataset_entry *key_table_get(key_table *t, sd_dataset *ds, const char *k, size_t n,
                                              uint32_t shard)
{
    if ((t->used + 1) * 2 > t->cap)
        key_table_grow(t, ds);
    size_t h = (size_t)hash_bytes(k, n) & (t->cap - 1);
    while (t->gen[h] == t->current) {
        const char *ek = ds->pool + ds->entries[t->entry[h]].key;
        if (strncmp(ek, k, n) == 0 && ek[n] == '\0')
            return &ds->entries[t->entry[h]];
        h = (h + 1) & (t->cap - 1);
    }
    struct sd_dataset_entry *e = new_entry(ds);
    e->key = sd_dataset_key_add_(ds, k, n);
    e->shard = shard;
    t->gen[h] = t->current;
    t->entry[h] = ds->n_entries - 1;
    t->used++;
    return e;
}

typedef struct tar_ctx {
    sd_dataset *ds;
    key_table *table;
    uint32_t shard;
    const char *path;
    int64_t n_members;
} tar_ctx;

static int on_tar_member(const sd_tar_member *m, void *arg)
{
    tar_ctx *c = arg;
    sd_dataset *ds = c->ds;
    c->n_members++;
    if (m->type == '5')
        return 0; /* folders are expected in tars and are not data */
    if (m->type != '0') {
        ds->stats.n_ignored++;
        return 0;
    }
    if (m->truncated)
        ds->stats.n_truncated++;
    const char *name = m->name;
    size_t len = m->name_len;
    while (len >= 2 && name[0] == '.' && name[1] == '/') { /* "tar cf x.tar ." writes ./a.jpg */
        name += 2;
        len -= 2;
    }
    if (len > KEY_MAX) {
        ds->stats.n_ignored++;
        sd_dataset_note_(ds, "%s: member name of %zu bytes ignored (longer than %d)", c->path, len, KEY_MAX);
        return 0;
    }
    /* webdataset's rule: key = folder + basename up to its first dot, extension = the rest
     * (so "a.seg.png" is field "seg.png" of key "a", not an image). */
    const char *slash = memrchr(name, '/', len);
    const char *base = slash ? slash + 1 : name;
    const char *dot = memchr(base, '.', (size_t)(name + len - base));
    if (!dot || dot == base) {
        ds->stats.n_ignored++;
        return 0;
    }
    sd_image_ext format = SD_IMAGE_EXT_UNKNOWN;
    size_t key_len = (size_t)(dot - name), ext_len = len - key_len - 1;
    int kind = classify_ext(dot + 1, ext_len, &format);
    if (kind == KIND_OTHER) {
        ds->stats.n_ignored++;
        return 0;
    }
    struct sd_dataset_entry *e = key_table_get(c->table, ds, name, key_len, c->shard);
    uint16_t *sfx = kind == KIND_IMAGE ? &e->image_sfx : kind == KIND_CAPTION ? &e->caption_sfx
                                                                               : &e->json_sfx;
    if (*sfx != SFX_NONE) {
        ds->stats.n_duplicates++;
        return 0;
    }
    *sfx = sd_dataset_suffix_id_(ds, dot, ext_len + 1);
    int bad = m->sparse || m->size > UINT32_MAX;
    uint32_t size = m->size > UINT32_MAX ? UINT32_MAX : (uint32_t)m->size;
    if (kind == KIND_IMAGE) {
        e->image_kind = (uint8_t)format;
        e->image_off = m->data_offset;
        e->image_size = size;
        e->flags |= (m->truncated ? ENTRY_IMAGE_TRUNC : 0) | (bad ? ENTRY_IMAGE_BAD : 0);
    } else if (kind == KIND_CAPTION) {
        e->caption_off = m->data_offset;
        e->caption_size = size;
        e->flags |= ENTRY_CAPTION | (m->truncated ? ENTRY_CAPTION_TRUNC : 0) | (bad ? ENTRY_CAPTION_BAD : 0);
    } else {
        e->json_off = m->data_offset;
        e->json_size = size;
        e->flags |= ENTRY_JSON | (m->truncated ? ENTRY_JSON_TRUNC : 0) | (bad ? ENTRY_JSON_BAD : 0);
    }
    return 0;
}

/* Drops the keys of entries [first, n) that have no image, keeping the order of the rest. */
static void drop_imageless(sd_dataset *ds, int64_t first)
{
    int64_t out = first;
    for (int64_t i = first; i < ds->n_entries; i++) {
        struct sd_dataset_entry *e = &ds->entries[i];
        if (e->image_sfx == SFX_NONE) {
            if (e->flags & ENTRY_CAPTION)
                ds->stats.n_orphan_captions++;
            if (e->flags & ENTRY_JSON)
                ds->stats.n_ignored++;
            continue;
        }
        if (out != i)
            ds->entries[out] = *e;
        out++;
    }
    ds->n_entries = out;
}

static int ends_with_ci(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && ext_is(s + n - m, m, suffix);
}

static int is_compressed_tar_name(const char *s)
{
    static const char *const names[] = {".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz",
                                        ".tar.zst", ".tar.lz4"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (ends_with_ci(s, names[i]))
            return 1;
    return 0;
}

typedef struct str_list {
    char **v;
    size_t n, cap;
} str_list;

static void str_list_push(str_list *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 16;
        l->v = sd_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n] = sd_xmalloc(n + 1);
    memcpy(l->v[l->n], s, n);
    l->v[l->n][n] = '\0';
    l->n++;
}

static void str_list_free(str_list *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

static void str_list_sort_unique(str_list *l)
{
    if (l->n < 2)
        return;
    qsort(l->v, l->n, sizeof *l->v, cmp_str_ptr);
    size_t out = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (out && strcmp(l->v[out - 1], l->v[i]) == 0) {
            free(l->v[i]);
            continue;
        }
        l->v[out++] = l->v[i];
    }
    l->n = out;
}

/* The .tar files directly in folder `dir` (not its subfolders); *n_compressed counts
 * .tar.gz-like names, for the error message when there is no plain .tar. */
static int list_tar_folder(const char *dir, str_list *out, int *n_compressed, sd_err *err)
{
    DIR *d = sd_opendir(dir);
    if (!d)
        return sd_err_input_errno(err, errno, "%s", dir);
    struct dirent *de;
    size_t dlen = strlen(dir);
    while ((de = sd_readdir(d)) != NULL) {
        sd_progress_tick();
        if (de->d_name[0] == '.')
            continue;
        int tar = ends_with_ci(de->d_name, ".tar"), comp = is_compressed_tar_name(de->d_name);
        if (!tar && !comp)
            continue;
        size_t n = strlen(de->d_name);
        char *p = sd_xmalloc(dlen + n + 2);
        memcpy(p, dir, dlen);
        p[dlen] = '/';
        memcpy(p + dlen + 1, de->d_name, n + 1);
        struct stat st;
        if (sd_stat(p, &st) == 0 && S_ISREG(st.st_mode)) {
            if (tar)
                str_list_push(out, p, strlen(p));
            else if (n_compressed)
                (*n_compressed)++;
        }
        free(p);
    }
    closedir(d);
    str_list_sort_unique(out);
    return 0;
}

static int has_pattern_chars(const char *s)
{
    return strpbrk(s, "*?[{") != NULL;
}

/* Expands the first {a,b,c} or {A..B} of pat (braceexpand semantics: a range is zero-padded to
 * the longer bound when either bound has a leading zero), recursively. */
static int brace_expand(const char *pat, str_list *out, size_t limit, sd_err *err)
{
    const char *open = strchr(pat, '{');
    const char *close = open ? strchr(open, '}') : NULL;
    if (!open || !close) {
        if (out->n >= limit)
            return sd_err_set(err, "pattern expands to more than %zu names", limit);
        str_list_push(out, pat, strlen(pat));
        return 0;
    }
    if (memchr(open + 1, '{', (size_t)(close - open - 1)))
        return sd_err_set(err, "'%s': nested braces are not supported", pat);
    size_t pre = (size_t)(open - pat);
    const char *post = close + 1;
    const char *body = open + 1;
    size_t blen = (size_t)(close - body);
    const char *dots = NULL;
    for (size_t i = 0; i + 1 < blen; i++)
        if (body[i] == '.' && body[i + 1] == '.')
            dots = body + i;
    size_t cap = strlen(pat) + 64;
    char *buf = sd_xmalloc(cap);
    int rc = 0;
    if (dots && !memchr(body, ',', blen)) {
        size_t alen = (size_t)(dots - body), zlen = blen - alen - 2;
        const char *a = body, *z = dots + 2;
        long long lo = 0, hi = 0;
        int ok = alen > 0 && zlen > 0 && alen < 19 && zlen < 19;
        for (size_t i = 0; ok && i < alen; i++)
            ok = isdigit((unsigned char)a[i]), lo = lo * 10 + (a[i] - '0');
        for (size_t i = 0; ok && i < zlen; i++)
            ok = isdigit((unsigned char)z[i]), hi = hi * 10 + (z[i] - '0');
        if (!ok) {
            free(buf);
            return sd_err_set(err, "'%s': a range must be {FIRST..LAST} with non-negative integers", pat);
        }
        int width = ((alen > 1 && a[0] == '0') || (zlen > 1 && z[0] == '0')) ? (int)(alen > zlen ? alen : zlen) : 0;
        long long step = lo <= hi ? 1 : -1;
        for (long long v = lo;; v += step) {
            snprintf(buf, cap, "%.*s%0*lld%s", (int)pre, pat, width, v, post);
            if ((rc = brace_expand(buf, out, limit, err)) != 0 || v == hi)
                break;
        }
    } else {
        const char *item = body;
        for (;;) {
            const char *comma = memchr(item, ',', (size_t)(close - item));
            const char *end = comma ? comma : close;
            snprintf(buf, cap, "%.*s%.*s%s", (int)pre, pat, (int)(end - item), item, post);
            if ((rc = brace_expand(buf, out, limit, err)) != 0 || !comma)
                break;
            item = comma + 1;
        }
    }
    free(buf);
    return rc;
}

static int expand_shard_pattern(const char *pat, str_list *out, sd_err *err)
{
    str_list names = {0};
    if (brace_expand(pat, &names, 10000000, err) != 0) {
        str_list_free(&names);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < names.n && rc == 0; i++) {
        const char *p = names.v[i];
        if (strpbrk(p, "*?[")) {
            glob_t g;
            int gr = sd_glob(p, 0, &g);
            if (gr == 0) {
                for (size_t k = 0; k < g.gl_pathc; k++) {
                    struct stat st;
                    if (sd_stat(g.gl_pathv[k], &st) == 0 && S_ISREG(st.st_mode))
                        str_list_push(out, g.gl_pathv[k], strlen(g.gl_pathv[k]));
                }
                globfree(&g);
            } else if (gr != GLOB_NOMATCH) {
                rc = sd_err_set(err, "%s: glob failed (%s)", p, gr == GLOB_ABORTED ? "read error" : "out of memory");
            }
        } else {
            struct stat st;
            if (sd_stat(p, &st) != 0)
                rc = sd_err_set(err, "%s: %s (named by the pattern '%s')", p, strerror(errno), pat);
            else
                str_list_push(out, p, strlen(p));
        }
    }
    str_list_free(&names);
    if (rc == 0 && out->n == 0)
        rc = sd_err_set(err, "%s: the pattern matches no files", pat);
    str_list_sort_unique(out);
    return rc;
}

static int resolve_shards(sd_dataset *ds, str_list *shards, sd_err *err)
{
    struct stat st;
    const char *in = ds->input;
    if (sd_stat(in, &st) == 0 && S_ISDIR(st.st_mode)) {
        int n_comp = 0;
        if (list_tar_folder(in, shards, &n_comp, err) != 0)
            return -1;
        if (shards->n == 0)
            return n_comp ? sd_err_set(err, "%s: holds %d compressed tar file(s) (.tar.gz, ...) but no "
                                       "plain .tar; shards must be uncompressed so that members can "
                                       "be read by offset (decompress them first)", in, n_comp)
                          : sd_err_set(err, "%s: no .tar files in this folder", in);
        if (n_comp)
            sd_dataset_note_(ds, "%s: %d compressed tar file(s) (.tar.gz, ...) ignored; only plain "
                             ".tar shards are read", in, n_comp);
        return 0;
    }
    if (sd_stat(in, &st) == 0) {
        str_list_push(shards, in, strlen(in));
        return 0;
    }
    if (has_pattern_chars(in))
        return expand_shard_pattern(in, shards, err);
    return sd_err_set(err, "%s: %s", in, strerror(errno));
}

static int index_webdataset(sd_dataset *ds, sd_err *err)
{
    str_list shards = {0};
    if (resolve_shards(ds, &shards, err) != 0) {
        str_list_free(&shards);
        return -1;
    }
    if (shards.n > UINT32_MAX) {
        str_list_free(&shards);
        return sd_err_set(err, "%s: more than %u shards", ds->input, UINT32_MAX);
    }
    ds->shards = sd_xmalloc(shards.n * sizeof *ds->shards);
    key_table table = {0};
    int rc = 0;
    for (size_t i = 0; i < shards.n && rc == 0; i++) {
        ds->shards[i] = sd_dataset_pool_add_(ds, shards.v[i], strlen(shards.v[i]));
        ds->n_shards = (int64_t)i + 1;
        table.current++;
        table.used = 0;
        tar_ctx c = {ds, &table, (uint32_t)i, shards.v[i], 0};
        int64_t first = ds->n_entries;
        sd_err terr = {0};
        int r = sd_tar_scan(shards.v[i], on_tar_member, &c, &terr);
        ds->stats.n_shards++;
        if (r == SD_TAR_COMPRESSED) {
            rc = sd_err_set(err, "%s", terr.msg);
        } else if (terr.storage) { /* the storage failed it, not damage: no partial index */
            rc = sd_err_set(err, "%s", terr.msg);
            err->storage = 1;
        } else if (r != SD_TAR_OK) {
            ds->stats.n_damaged_shards++;
            sd_dataset_note_(ds, "%s%s", terr.msg,
                             c.n_members ? " (members before it kept)" : " (shard skipped)");
        }
        drop_imageless(ds, first);
    }
    free(table.gen);
    free(table.entry);
    str_list_free(&shards);
    if (rc == 0 && ds->n_entries == 0)
        rc = sd_err_set(err, "%s: no samples: no image members (.jpg, .png, ...) in %" PRId64
                        " tar file(s)%s%s", ds->input, ds->n_shards, ds->n_notes ? "; first problem: " : "",
                        ds->n_notes ? ds->notes[0] : "");
    return rc;
}

/* ---- format choice and open ----------------------------------------------------------------- */

static int folder_has_tar(const char *dir)
{
    str_list l = {0};
    int n_comp = 0;
    int found = list_tar_folder(dir, &l, &n_comp, NULL) == 0 && (l.n > 0 || n_comp > 0);
    str_list_free(&l);
    return found;
}

static int detect_format(const char *in, sd_dataset_format *f, sd_err *err)
{
    struct stat st;
    if (sd_stat(in, &st) != 0) {
        if (errno == ENOENT && has_pattern_chars(in)) {
            *f = SD_DATASET_WEBDATASET;
            return 0;
        }
        return sd_err_set(err, "%s: %s", in, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        *f = folder_has_tar(in) ? SD_DATASET_WEBDATASET : SD_DATASET_FILES;
        return 0;
    }
    if (ends_with_ci(in, ".tar") || is_compressed_tar_name(in)) {
        *f = SD_DATASET_WEBDATASET;
        return 0;
    }
    if (ends_with_ci(in, ".tsv") || ends_with_ci(in, ".txt")) {
        *f = SD_DATASET_TSV;
        return 0;
    }
    /* No telling name: look for the ustar magic of a tar header. */
    unsigned char h[263];
    int fd = open(in, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        ssize_t k = pread(fd, h, sizeof h, 0);
        close(fd);
        if (k == (ssize_t)sizeof h && memcmp(h + 257, "ustar", 5) == 0) {
            *f = SD_DATASET_WEBDATASET;
            return 0;
        }
    }
    return sd_err_set(err, "%s: cannot tell the dataset format (expected a folder, a .tar shard or a "
                      ".tsv/.txt manifest); set data.input_format", in);
}

static char *dirname_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return sd_xstrdup(".");
    if (slash == path)
        return sd_xstrdup("/");
    size_t n = (size_t)(slash - path);
    char *d = sd_xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = '\0';
    return d;
}

int sd_dataset_open(const char *input, const char *format, sd_dataset *ds, sd_err *err)
{
    memset(ds, 0, sizeof *ds);
    sd_err_clear(err);
    if (!input || !*input)
        return sd_err_set(err, "no dataset given (data.input is empty)");
    sd_dataset_format f;
    if (!format || !*format || strcmp(format, "auto") == 0) {
        if (detect_format(input, &f, err) != 0)
            return -1;
    } else if (strcmp(format, "files") == 0) {
        f = SD_DATASET_FILES;
    } else if (strcmp(format, "webdataset") == 0) {
        f = SD_DATASET_WEBDATASET;
    } else if (strcmp(format, "tsv") == 0) {
        f = SD_DATASET_TSV;
    } else {
        return sd_err_set(err, "unknown dataset format '%s' (expected files, webdataset, tsv or auto)", format);
    }
    ds->format = f;
    ds->id = sd_dataset_new_id_();
    ds->input = sd_xstrdup(input);
    if (f == SD_DATASET_FILES) {
        size_t n = strlen(input);
        while (n > 1 && input[n - 1] == '/')
            n--;
        ds->root = sd_xmalloc(n + 1);
        memcpy(ds->root, input, n);
        ds->root[n] = '\0';
    } else if (f == SD_DATASET_TSV) {
        ds->root = dirname_of(input);
    } else {
        ds->root = sd_xstrdup("");
    }
    /* Suffix 0 (none) and 1 ("") share the empty string. */
    ds->suffixes = sd_xmalloc(2 * sizeof *ds->suffixes);
    ds->suffixes[0] = ds->suffixes[1] = sd_dataset_pool_add_(ds, "", 0);
    ds->n_suffixes = 2;

    int rc = f == SD_DATASET_FILES ? index_files(ds, err)
           : f == SD_DATASET_TSV   ? index_tsv(ds, err)
                                   : index_webdataset(ds, err);
    if (rc != 0) {
        sd_dataset_close(ds);
        return -1;
    }
    ds->count = ds->n_entries;
    ds->stats.n_indexed = ds->n_entries;
    return 0;
}
