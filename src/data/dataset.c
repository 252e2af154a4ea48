/* Dataset access: reading samples by index, reason codes, division of work, index broadcast. */
#include "sdtrain/dataset.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/fsutil.h"

#include "dataset_internal.h"
#include "sdtrain/check.h"
#include "sdtrain/utf8.h"

/* Root (<= 4096) + key (<= 4096) + suffix: every path the index can produce fits. */
#define SD_PATH_BUF 8448

_Static_assert(sizeof(struct sd_dataset_entry) == 56, "index record grew: keep it compact");

void sd_dataset_close(sd_dataset *ds)
{
    if (!ds)
        return;
    free(ds->root);
    free(ds->input);
    if (!ds->viewed) { /* else they lie in the caller's image (sd_dataset_view) */
        free(ds->entries);
        free(ds->pool);
        free(ds->shards);
        free(ds->suffixes);
    }
    memset(ds, 0, sizeof *ds);
}

void sd_dataset_truncate(sd_dataset *ds, int64_t max_samples)
{
    ds->count = (max_samples > 0 && max_samples < ds->n_entries) ? max_samples : ds->n_entries;
}

int64_t sd_dataset_count(const sd_dataset *ds)
{
    return ds->count;
}

const char *sd_dataset_format_name(sd_dataset_format f)
{
    switch (f) {
    case SD_DATASET_FILES: return "files";
    case SD_DATASET_WEBDATASET: return "webdataset";
    case SD_DATASET_TSV: return "tsv";
    }
    return "?";
}

static const struct sd_dataset_entry *entry_at(const sd_dataset *ds, int64_t i)
{
    SD_CHECK(i >= 0 && i < ds->count, "sample index %" PRId64 " outside [0, %" PRId64 ")", i, ds->count);
    return &ds->entries[i];
}

const char *sd_dataset_key_(const sd_dataset *ds, uint64_t off)
{
    const char *k = sd_dataset_str_(ds, off);
    size_t n = strlen(k);
    return sd_utf8_is_valid(k, n) ? k : k + n + 1;
}

const char *sd_dataset_key(const sd_dataset *ds, int64_t i)
{
    return sd_dataset_key_(ds, entry_at(ds, i)->key);
}

/* root + "/" + key + suffix, or key + suffix for an absolute tsv path. */
static int file_path(const sd_dataset *ds, const struct sd_dataset_entry *e, uint16_t sfx, char *buf,
                     size_t size)
{
    const char *key = sd_dataset_str_(ds, e->key);
    const char *s = sd_dataset_suffix_(ds, sfx);
    if (key[0] == '/')
        return snprintf(buf, size, "%s%s", key, s ? s : "");
    return snprintf(buf, size, "%s/%s%s", ds->root, key, s ? s : "");
}

static int member_name(const sd_dataset *ds, const struct sd_dataset_entry *e, uint16_t sfx, char *buf,
                       size_t size)
{
    const char *s = sd_dataset_suffix_(ds, sfx);
    return snprintf(buf, size, "%s:%s%s", sd_dataset_str_(ds, ds->shards[e->shard]),
                    sd_dataset_str_(ds, e->key), s ? s : "");
}

static int describe_part(const sd_dataset *ds, const struct sd_dataset_entry *e, uint16_t sfx, char *buf,
                         size_t size)
{
    return ds->format == SD_DATASET_WEBDATASET ? member_name(ds, e, sfx, buf, size)
                                               : file_path(ds, e, sfx, buf, size);
}

int sd_dataset_describe(const sd_dataset *ds, int64_t i, char *buf, size_t size)
{
    const struct sd_dataset_entry *e = entry_at(ds, i);
    return describe_part(ds, e, e->image_sfx, buf, size);
}

void sd_dataset_info(const sd_dataset *ds, int64_t i, sd_sample_info *info)
{
    const struct sd_dataset_entry *e = entry_at(ds, i);
    memset(info, 0, sizeof *info);
    info->key = sd_dataset_key_(ds, e->key);
    info->shard = ds->format == SD_DATASET_WEBDATASET ? sd_dataset_str_(ds, ds->shards[e->shard]) : NULL;
    info->image_suffix = sd_dataset_suffix_(ds, e->image_sfx);
    info->caption_suffix = sd_dataset_suffix_(ds, e->caption_sfx);
    info->json_suffix = sd_dataset_suffix_(ds, e->json_sfx);
    info->image_kind = (sd_image_ext)e->image_kind;
    info->has_caption = (e->flags & ENTRY_CAPTION) != 0;
    info->has_json = (e->flags & ENTRY_JSON) != 0;
    info->image_truncated = (e->flags & ENTRY_IMAGE_TRUNC) != 0;
    info->caption_truncated = (e->flags & ENTRY_CAPTION_TRUNC) != 0;
    info->json_truncated = (e->flags & ENTRY_JSON_TRUNC) != 0;
    info->image_unreadable = (e->flags & ENTRY_IMAGE_BAD) != 0;
    info->image_offset = e->image_off;
    info->caption_offset = e->caption_off;
    info->json_offset = e->json_off;
    info->image_size = e->image_size;
    info->caption_size = e->caption_size;
    info->json_size = e->json_size;
}

/* ---- reading -------------------------------------------------------------------------------- */

static void ensure_cap(void **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    *buf = sd_xrealloc(*buf, c);
    *cap = c;
}

/* err after an input read failed with errno e: a failure of the storage (EIO, ESTALE, a lost
 * server, no descriptors or memory; sd_storage_errno less EACCES / EPERM, which for an input
 * file mean the file itself is not ours to read) marks err->storage, so that the caller stops
 * instead of skipping the sample: a skip would silently change the dataset. */
static int input_read_failed(sd_err *err, const char *path, int e)
{
    return sd_err_input_errno(err, e, "%s", path);
}

/* Reads the whole regular file at `path` into *buf (one spare byte for a NUL). */
/* Reads a whole regular file into *buf (NUL-terminated). A file of more than `limit` bytes is
 * not read: returns 1 with *len its size. */
static int read_file(const char *path, unsigned char **buf, size_t *cap, size_t *len, size_t limit,
                     sd_err *err)
{
    /* a FIFO named by a manifest does not block the open: it is refused */
    struct stat st;
    int fd = sd_open_regular(path, &st);
    if (fd == -1)
        return input_read_failed(err, path, errno);
    if (fd < 0)
        return sd_err_set(err, "%s: not a regular file", path);
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        close(fd);
        *len = (size_t)st.st_size;
        return 1;
    }
    ensure_cap((void **)buf, cap, (size_t)st.st_size + 1);
    if (sd_read_to_end(fd, (void **)buf, cap, len)) {
        const int e = errno;
        close(fd);
        return input_read_failed(err, path, e);
    }
    close(fd);
    return *len > limit; /* it grew past the limit since fstat */
}

enum { MEMBER_OK = 0, MEMBER_UNREADABLE = -1, MEMBER_TRUNCATED = -2 };

/* Reads `size` bytes at `off` of shard `shard` through the reader's cached descriptor. */
static int read_member(const sd_dataset *ds, sd_sample *s, const struct sd_dataset_entry *e, uint16_t sfx,
                       uint64_t off, uint32_t size, unsigned char **buf, size_t *cap, sd_err *err)
{
    const char *path = sd_dataset_str_(ds, ds->shards[e->shard]);
    if (s->fd_id_ != ds->id || s->fd_shard_ != (int64_t)e->shard) {
        if (s->fd_id_)
            close(s->fd_);
        s->fd_id_ = 0;
        int fd = sd_open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
        if (fd < 0) {
            input_read_failed(err, path, errno);
            return MEMBER_UNREADABLE;
        }
        s->fd_ = fd;
        s->fd_id_ = ds->id;
        s->fd_shard_ = e->shard;
    }
    ensure_cap((void **)buf, cap, (size_t)size + 1);
    size_t n = 0;
    if (sd_pio_all(s->fd_, *buf, size, off, 0, &n)) {
        const int en = errno;
        char name[SD_PATH_BUF];
        describe_part(ds, e, sfx, name, sizeof name);
        if (en) {
            input_read_failed(err, name, en);
            return MEMBER_UNREADABLE;
        }
        sd_err_set(err, "%s: truncated: %zu of %" PRIu32 " bytes (the tar is shorter than when it "
                   "was indexed)", name, n, size);
        return MEMBER_TRUNCATED;
    }
    (*buf)[n] = 0;
    return MEMBER_OK;
}

static int skip(sd_sample *s, sd_sample_reason r)
{
    s->reason = r;
    s->keep = false;
    return -1;
}

static int only_ascii_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == ' ' || (s[i] >= '\t' && s[i] <= '\r')))
            return 0;
    return 1;
}

int sd_dataset_read(const sd_dataset *ds, int64_t i, sd_sample *s, sd_err *err)
{
    const struct sd_dataset_entry *e = entry_at(ds, i);
    int tar = ds->format == SD_DATASET_WEBDATASET;
    char path[SD_PATH_BUF];
    size_t len = 0;

    sd_err_clear(err);
    s->index = i;
    s->key = sd_dataset_key_(ds, e->key);
    s->reason = SD_SAMPLE_OK;
    s->keep = true;
    s->image_kind = (sd_image_ext)e->image_kind;
    s->image_size = 0;
    s->caption_len = 0;
    s->caption_missing = s->caption_empty = s->caption_repaired = false;
    s->n_replaced = 0;
    s->json_size = 0;
    ensure_cap((void **)&s->caption, &s->caption_cap_, 1);
    s->caption[0] = '\0';

    /* What the index already knows costs no I/O. */
    if (e->image_kind == SD_IMAGE_EXT_UNSUPPORTED) {
        describe_part(ds, e, e->image_sfx, path, sizeof path);
        sd_err_set(err, "%s: unsupported image format (only JPEG and PNG are decoded)", path);
        return skip(s, SD_SAMPLE_UNSUPPORTED_IMAGE);
    }
    if (tar && (e->flags & (ENTRY_IMAGE_BAD | ENTRY_IMAGE_TRUNC))) {
        describe_part(ds, e, e->image_sfx, path, sizeof path);
        if (e->flags & ENTRY_IMAGE_TRUNC) {
            sd_err_set(err, "%s: truncated: the tar ends inside this member", path);
            return skip(s, SD_SAMPLE_TRUNCATED);
        }
        sd_err_set(err, "%s: cannot be read by offset (sparse member or 4 GiB or more)", path);
        return skip(s, SD_SAMPLE_UNREADABLE);
    }
    if (!(e->flags & ENTRY_CAPTION) && ds->missing_caption == SD_MISSING_CAPTION_SKIP) {
        describe_part(ds, e, e->image_sfx, path, sizeof path);
        const char *key = sd_dataset_str_(ds, e->key);
        if (ds->format == SD_DATASET_TSV)
            sd_err_set(err, "%s: no caption (its manifest line has no tab)", path);
        else if (tar)
            sd_err_set(err, "%s: no caption (no member %s.txt in the shard)", path, key);
        else
            sd_err_set(err, "%s: no caption (%s.txt is missing)", path, key);
        return skip(s, SD_SAMPLE_MISSING_CAPTION);
    }

    /* The image. */
    if (tar) {
        int r = read_member(ds, s, e, e->image_sfx, e->image_off, e->image_size, &s->image,
                            &s->image_cap_, err);
        if (r != MEMBER_OK)
            return skip(s, r == MEMBER_TRUNCATED ? SD_SAMPLE_TRUNCATED : SD_SAMPLE_UNREADABLE);
        len = e->image_size;
    } else {
        file_path(ds, e, e->image_sfx, path, sizeof path);
        if (read_file(path, &s->image, &s->image_cap_, &len, SIZE_MAX, err) != 0)
            return skip(s, SD_SAMPLE_UNREADABLE);
    }
    s->image_size = len;
    if (len == 0) {
        describe_part(ds, e, e->image_sfx, path, sizeof path);
        sd_err_set(err, "%s: empty image file", path);
        return skip(s, SD_SAMPLE_EMPTY_IMAGE);
    }

    /* The caption, raw, into s->caption. */
    if (!(e->flags & ENTRY_CAPTION)) {
        s->caption_missing = true;
        s->caption_empty = true;
        s->reason = SD_SAMPLE_MISSING_CAPTION_KEPT;
        describe_part(ds, e, e->image_sfx, path, sizeof path);
        sd_err_set(err, "%s: no caption, kept with an empty one", path);
        return 0;
    }
    if ((tar || ds->format == SD_DATASET_TSV) && e->caption_size > SD_CAPTION_MAX_BYTES) {
        /* tsv: the caption is in the manifest line of this image */
        describe_part(ds, e, tar ? e->caption_sfx : e->image_sfx, path, sizeof path);
        sd_err_set(err, "%s: a caption of %llu bytes (at most %d)", path,
                   (unsigned long long)e->caption_size, SD_CAPTION_MAX_BYTES);
        return skip(s, SD_SAMPLE_CAPTION_TOO_LONG);
    }
    if (tar) {
        if (e->flags & (ENTRY_CAPTION_TRUNC | ENTRY_CAPTION_BAD)) {
            describe_part(ds, e, e->caption_sfx, path, sizeof path);
            if (e->flags & ENTRY_CAPTION_TRUNC) {
                sd_err_set(err, "%s: truncated: the tar ends inside this member", path);
                return skip(s, SD_SAMPLE_TRUNCATED);
            }
            sd_err_set(err, "%s: cannot be read by offset (sparse member or 4 GiB or more)", path);
            return skip(s, SD_SAMPLE_UNREADABLE);
        }
        int r = read_member(ds, s, e, e->caption_sfx, e->caption_off, e->caption_size,
                            (unsigned char **)&s->caption, &s->caption_cap_, err);
        if (r != MEMBER_OK)
            return skip(s, r == MEMBER_TRUNCATED ? SD_SAMPLE_TRUNCATED : SD_SAMPLE_UNREADABLE);
        len = e->caption_size;
    } else if (ds->format == SD_DATASET_TSV) {
        len = e->caption_size;
        ensure_cap((void **)&s->caption, &s->caption_cap_, len + 1);
        memcpy(s->caption, sd_dataset_str_(ds, e->caption_off), len);
        s->caption[len] = '\0';
    } else {
        file_path(ds, e, e->caption_sfx, path, sizeof path);
        int r = read_file(path, (unsigned char **)&s->caption, &s->caption_cap_, &len,
                          SD_CAPTION_MAX_BYTES, err);
        if (r == 1) {
            sd_err_set(err, "%s: a caption of %zu bytes (at most %d)", path, len,
                       SD_CAPTION_MAX_BYTES);
            return skip(s, SD_SAMPLE_CAPTION_TOO_LONG);
        }
        if (r != 0)
            return skip(s, SD_SAMPLE_UNREADABLE);
    }
    s->caption_len = len;

    size_t valid = sd_utf8_valid_prefix(s->caption, len);
    if (valid < len) {
        describe_part(ds, e, e->caption_sfx ? e->caption_sfx : e->image_sfx, path, sizeof path);
        if (ds->utf8_policy == SD_UTF8_REJECT) {
            sd_err_set(err, "%s: caption is not valid UTF-8 (byte %zu of %zu)", path, valid, len);
            return skip(s, SD_SAMPLE_INVALID_UTF8);
        }
        ensure_cap((void **)&s->scratch_, &s->scratch_cap_, 3 * len + 1);
        s->caption_len = sd_utf8_repair(s->caption, len, s->scratch_, &s->n_replaced);
        char *t = s->caption;
        size_t tc = s->caption_cap_;
        s->caption = s->scratch_;
        s->caption_cap_ = s->scratch_cap_;
        s->scratch_ = t;
        s->scratch_cap_ = tc;
        s->caption_repaired = true;
        s->reason = SD_SAMPLE_CAPTION_REPAIRED;
        sd_err_set(err, "%s: caption is not valid UTF-8 (byte %zu of %zu); %zu replacement "
                   "character(s) inserted", path, valid, len, s->n_replaced);
    }
    if (only_ascii_space(s->caption, s->caption_len)) {
        s->caption_empty = true;
        if (s->reason == SD_SAMPLE_OK) {
            s->reason = SD_SAMPLE_EMPTY_CAPTION;
            describe_part(ds, e, e->caption_sfx ? e->caption_sfx : e->image_sfx, path, sizeof path);
            sd_err_set(err, "%s: empty caption, kept", path);
        }
    }
    return 0;
}

int sd_dataset_read_json(const sd_dataset *ds, int64_t i, sd_sample *s, sd_err *err)
{
    const struct sd_dataset_entry *e = entry_at(ds, i);
    s->json_size = 0;
    if (!(e->flags & ENTRY_JSON))
        return 0;
    if (ds->format == SD_DATASET_WEBDATASET) {
        if (e->flags & (ENTRY_JSON_TRUNC | ENTRY_JSON_BAD)) {
            char path[SD_PATH_BUF];
            describe_part(ds, e, e->json_sfx, path, sizeof path);
            return sd_err_set(err, "%s: %s", path, (e->flags & ENTRY_JSON_TRUNC)
                                  ? "truncated: the tar ends inside this member"
                                  : "cannot be read by offset (sparse member or 4 GiB or more)");
        }
        if (e->json_size > SD_JSON_MAX_BYTES) {
            char path[SD_PATH_BUF];
            describe_part(ds, e, e->json_sfx, path, sizeof path);
            return sd_err_set(err, "%s: %llu bytes, more than the %u MiB a .json may have", path,
                              (unsigned long long)e->json_size, SD_JSON_MAX_BYTES >> 20);
        }
        if (read_member(ds, s, e, e->json_sfx, e->json_off, e->json_size, &s->json, &s->json_cap_, err) != 0)
            return -1;
        s->json_size = e->json_size;
        return 1;
    }
    char path[SD_PATH_BUF];
    file_path(ds, e, e->json_sfx, path, sizeof path);
    size_t len;
    const int rc = read_file(path, &s->json, &s->json_cap_, &len, SD_JSON_MAX_BYTES, err);
    if (rc < 0)
        return -1;
    if (rc > 0)
        return sd_err_set(err, "%s: %zu bytes, more than the %u MiB a .json may have", path, len,
                          SD_JSON_MAX_BYTES >> 20);
    s->json_size = len;
    return 1;
}

void sd_sample_free(sd_sample *s)
{
    if (!s)
        return;
    if (s->fd_id_)
        close(s->fd_);
    free(s->image);
    free(s->caption);
    free(s->json);
    free(s->scratch_);
    memset(s, 0, sizeof *s);
}

/* ---- reasons -------------------------------------------------------------------------------- */

static const char *const reason_names[SD_SAMPLE_N_REASONS] = {
    [SD_SAMPLE_OK] = "ok",
    [SD_SAMPLE_EMPTY_CAPTION] = "empty_caption",
    [SD_SAMPLE_CAPTION_REPAIRED] = "caption_repaired",
    [SD_SAMPLE_MISSING_CAPTION_KEPT] = "missing_caption_kept",
    [SD_SAMPLE_UNREADABLE] = "unreadable",
    [SD_SAMPLE_MISSING_CAPTION] = "missing_caption",
    [SD_SAMPLE_UNSUPPORTED_IMAGE] = "unsupported_image",
    [SD_SAMPLE_TRUNCATED] = "truncated",
    [SD_SAMPLE_EMPTY_IMAGE] = "empty_image",
    [SD_SAMPLE_INVALID_UTF8] = "invalid_utf8",
    [SD_SAMPLE_CAPTION_TOO_LONG] = "caption_too_long",
};

const char *sd_sample_reason_name(sd_sample_reason r)
{
    return ((unsigned)r < SD_SAMPLE_N_REASONS) ? reason_names[r] : "?";
}

int sd_sample_reason_keeps(sd_sample_reason r)
{
    return r == SD_SAMPLE_OK || r == SD_SAMPLE_EMPTY_CAPTION || r == SD_SAMPLE_CAPTION_REPAIRED ||
           r == SD_SAMPLE_MISSING_CAPTION_KEPT;
}

void sd_sample_counts_add(sd_sample_counts *c, sd_sample_reason r)
{
    SD_CHECK((unsigned)r < SD_SAMPLE_N_REASONS, "reason %d out of range", (int)r);
    c->n[r]++;
}

/* Appends to buf at *pos like snprintf, keeping *pos the length that would have been written. */
static void append(char *buf, size_t size, size_t *pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(*pos < size ? buf + *pos : NULL, *pos < size ? size - *pos : 0, fmt, ap);
    va_end(ap);
    if (k > 0)
        *pos += (size_t)k;
}

int sd_sample_counts_format(const sd_sample_counts *c, char *buf, size_t size)
{
    uint64_t total = 0, kept = 0;
    for (int r = 0; r < SD_SAMPLE_N_REASONS; r++) {
        total += c->n[r];
        if (sd_sample_reason_keeps((sd_sample_reason)r))
            kept += c->n[r];
    }
    size_t pos = 0;
    if (size)
        buf[0] = '\0';
    append(buf, size, &pos, "%" PRIu64 " samples read: %" PRIu64 " kept", total, kept);
    for (int pass = 0; pass < 2; pass++) {
        int first = 1;
        if (pass == 1)
            append(buf, size, &pos, ", %" PRIu64 " skipped", total - kept);
        for (int r = 0; r < SD_SAMPLE_N_REASONS; r++) {
            if (!c->n[r] || sd_sample_reason_keeps((sd_sample_reason)r) != (pass == 0))
                continue;
            append(buf, size, &pos, "%s%s %" PRIu64, first ? " (" : ", ", reason_names[r], c->n[r]);
            first = 0;
        }
        if (!first)
            append(buf, size, &pos, ")");
    }
    return (int)pos;
}

/* ---- division of work ----------------------------------------------------------------------- */

int64_t sd_dataset_n_shards(int64_t n_samples, int64_t samples_per_shard)
{
    if (n_samples < 0 || samples_per_shard < 1)
        return -1;
    return n_samples / samples_per_shard + (n_samples % samples_per_shard != 0);
}

int sd_dataset_partition(int64_t n_samples, int64_t samples_per_shard, int n_ranks, int rank,
                         int64_t shard, int64_t *begin, int64_t *end)
{
    *begin = *end = 0;
    int64_t n_shards = sd_dataset_n_shards(n_samples, samples_per_shard);
    if (n_shards < 0 || n_ranks < 1 || rank < 0 || rank >= n_ranks || shard < 0 || shard >= n_shards)
        return -1;
    int64_t first = shard * samples_per_shard;
    int64_t len = n_samples - first < samples_per_shard ? n_samples - first : samples_per_shard;
    int64_t base = len / n_ranks, extra = len % n_ranks;
    *begin = first + rank * base + (rank < extra ? rank : extra);
    *end = *begin + base + (rank < extra ? 1 : 0);
    return 0;
}

/* ---- pack / unpack -------------------------------------------------------------------------- */

#define PACK_MAGIC "SDDSIDX"
#define PACK_VERSION 1u

typedef struct pack_header {
    char magic[8];
    uint32_t version, entry_size, stats_size, format;
    uint32_t utf8_policy, missing_caption;
    int64_t count, n_shards, n_suffixes;
    uint64_t pool_size, root_len, input_len;
    sd_dataset_stats stats;
} pack_header;

/* Appends bytes at p; memcpy wants a valid pointer even for 0 bytes (a dataset without shards
 * has none). */
static unsigned char *put_bytes(unsigned char *p, const void *src, size_t bytes)
{
    if (bytes)
        memcpy(p, src, bytes);
    return p + bytes;
}

static void pack_header_of(const sd_dataset *ds, pack_header *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, PACK_MAGIC, sizeof PACK_MAGIC);
    h->version = PACK_VERSION;
    h->entry_size = sizeof(struct sd_dataset_entry);
    h->stats_size = sizeof(sd_dataset_stats);
    h->format = (uint32_t)ds->format;
    h->utf8_policy = (uint32_t)ds->utf8_policy;
    h->missing_caption = (uint32_t)ds->missing_caption;
    h->count = ds->count;
    h->n_shards = ds->n_shards;
    h->n_suffixes = ds->n_suffixes;
    h->pool_size = ds->pool_size;
    h->root_len = strlen(ds->root);
    h->input_len = strlen(ds->input);
    h->stats = ds->stats;
}

/* The header is a multiple of 8 bytes and so is each record: in an 8-byte aligned image the
 * records and the shard and suffix offsets are aligned, so sd_dataset_view can use them where
 * they lie. */
_Static_assert(sizeof(pack_header) % 8 == 0 && sizeof(struct sd_dataset_entry) % 8 == 0,
               "the packed arrays must stay 8-byte aligned");

size_t sd_dataset_pack_size(const sd_dataset *ds)
{
    pack_header h;
    pack_header_of(ds, &h);
    return sizeof h + (size_t)h.count * sizeof(struct sd_dataset_entry) +
           (size_t)(h.n_shards + h.n_suffixes) * sizeof(uint64_t) + h.pool_size + h.root_len + h.input_len;
}

/* Writes the image; with `release`, frees each array of ds once copied and closes ds. */
static void pack(sd_dataset *ds, void *buf, size_t size, int release)
{
    pack_header h;
    unsigned char *p = buf;
    SD_CHECK(size == sd_dataset_pack_size(ds), "a dataset index image of %zu bytes, not %zu", size,
             sd_dataset_pack_size(ds));
    pack_header_of(ds, &h);
#define PUT(src, bytes) (p = put_bytes(p, (src), (bytes)))
#define GONE(array)                                                                                \
    do {                                                                                           \
        if (release && !ds->viewed) {                                                              \
            free(array);                                                                           \
            (array) = NULL;                                                                        \
        }                                                                                          \
    } while (0)
    PUT(&h, sizeof h);
    PUT(ds->entries, (size_t)h.count * sizeof(struct sd_dataset_entry));
    GONE(ds->entries);
    PUT(ds->shards, (size_t)h.n_shards * sizeof(uint64_t));
    PUT(ds->suffixes, (size_t)h.n_suffixes * sizeof(uint64_t));
    PUT(ds->pool, h.pool_size);
    GONE(ds->pool);
    PUT(ds->root, h.root_len);
    PUT(ds->input, h.input_len);
#undef GONE
#undef PUT
    if (release)
        sd_dataset_close(ds);
}

void sd_dataset_pack_into(const sd_dataset *ds, void *buf, size_t size)
{
    pack((sd_dataset *)ds, buf, size, 0); /* not written: release is 0 */
}

void sd_dataset_pack_close(sd_dataset *ds, void *buf, size_t size)
{
    pack(ds, buf, size, 1);
}

int sd_dataset_pack(const sd_dataset *ds, void **blob, size_t *size)
{
    const size_t n = sd_dataset_pack_size(ds);
    void *b = sd_xmalloc(n);
    sd_dataset_pack_into(ds, b, n);
    *blob = b;
    *size = n;
    return 0;
}

/* The next `bytes` bytes at *p, advancing *p: a malloc'd copy (never NULL), or with `view` the
 * bytes where they lie. */
static void *take(const unsigned char **p, size_t bytes, int view)
{
    void *d;
    if (view)
        d = (void *)*p; /* the dataset never writes through it (sd_dataset_view) */
    else {
        d = sd_xmalloc(bytes ? bytes : 1);
        memcpy(d, *p, bytes);
    }
    *p += bytes;
    return d;
}

static int unpack(const void *blob, size_t size, int view, sd_dataset *ds, sd_err *err)
{
    pack_header h;
    const unsigned char *p = blob;
    memset(ds, 0, sizeof *ds);
    if (size < sizeof h)
        return sd_err_set(err, "dataset index image: %zu bytes, too short", size);
    if (view && (uintptr_t)blob % 8 != 0)
        return sd_err_set(err, "dataset index image: not 8-byte aligned, cannot be viewed in place");
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, PACK_MAGIC, sizeof PACK_MAGIC) != 0 || h.version != PACK_VERSION ||
        h.entry_size != sizeof(struct sd_dataset_entry) || h.stats_size != sizeof(sd_dataset_stats))
        return sd_err_set(err, "dataset index image: wrong magic, version or build");
    if (h.count < 0 || h.n_shards < 0 || h.n_suffixes < 2 || h.n_suffixes > UINT16_MAX ||
        h.format < SD_DATASET_FILES || h.format > SD_DATASET_TSV || h.pool_size == 0 ||
        h.utf8_policy > SD_UTF8_REJECT || h.missing_caption > SD_MISSING_CAPTION_EMPTY)
        return sd_err_set(err, "dataset index image: bad header");
    /* Each part within the image first, so that the sum below cannot wrap around (found by
     * tests/fuzz/fuzz_dataset.c: a huge shard count made it equal the size again). */
    if ((uint64_t)h.count > size / sizeof(struct sd_dataset_entry) || (uint64_t)h.n_shards > size / 8 ||
        (uint64_t)h.n_suffixes > size / 8 || h.pool_size > size || h.root_len > size || h.input_len > size)
        return sd_err_set(err, "dataset index image: %zu bytes, too short for its header", size);
    uint64_t need = sizeof h + (uint64_t)h.count * sizeof(struct sd_dataset_entry) +
                    (uint64_t)(h.n_shards + h.n_suffixes) * sizeof(uint64_t) + h.pool_size + h.root_len +
                    h.input_len;
    if (need != size)
        return sd_err_set(err, "dataset index image: %zu bytes, expected %" PRIu64, size, need);
    p += sizeof h;
    ds->format = (sd_dataset_format)h.format;
    ds->utf8_policy = (sd_utf8_policy)h.utf8_policy;
    ds->missing_caption = (sd_missing_caption_policy)h.missing_caption;
    ds->stats = h.stats;
    ds->n_entries = ds->count = ds->entries_cap = h.count;
    ds->n_shards = h.n_shards;
    ds->n_suffixes = (int)h.n_suffixes;
    ds->pool_size = ds->pool_cap = h.pool_size;
    ds->viewed = view != 0;
    ds->entries = take(&p, (size_t)h.count * sizeof(struct sd_dataset_entry), view);
    ds->shards = take(&p, (size_t)h.n_shards * sizeof(uint64_t), view);
    ds->suffixes = take(&p, (size_t)h.n_suffixes * sizeof(uint64_t), view);
    ds->pool = take(&p, h.pool_size, view);
    ds->root = sd_xmalloc(h.root_len + 1);
    memcpy(ds->root, p, h.root_len);
    ds->root[h.root_len] = '\0';
    p += h.root_len;
    ds->input = sd_xmalloc(h.input_len + 1);
    memcpy(ds->input, p, h.input_len);
    ds->input[h.input_len] = '\0';

    /* Every offset must land inside the pool, NUL-terminated, so a bad image cannot make a
     * reader run off the end. */
    int bad = ds->pool[ds->pool_size - 1] != '\0';
    for (int64_t k = 0; !bad && k < ds->n_suffixes; k++)
        bad = ds->suffixes[k] >= ds->pool_size;
    for (int64_t k = 0; !bad && k < ds->n_shards; k++)
        bad = ds->shards[k] >= ds->pool_size;
    for (int64_t k = 0; !bad && k < ds->count; k++) {
        const struct sd_dataset_entry *e = &ds->entries[k];
        bad = e->key >= ds->pool_size || e->image_sfx >= ds->n_suffixes || e->caption_sfx >= ds->n_suffixes ||
              e->json_sfx >= ds->n_suffixes || e->image_kind > SD_IMAGE_EXT_UNSUPPORTED ||
              (ds->format == SD_DATASET_WEBDATASET && e->shard >= ds->n_shards) ||
              (ds->format == SD_DATASET_TSV && (e->flags & ENTRY_CAPTION) &&
               (e->caption_off >= ds->pool_size || e->caption_size >= ds->pool_size - e->caption_off));
        if (!bad) { /* a key that is not UTF-8 has its repaired copy after it (sd_dataset_key_add_) */
            const char *key = ds->pool + e->key;
            size_t n = strlen(key);
            if (!sd_utf8_is_valid(key, n)) {
                const uint64_t rep = e->key + n + 1;
                bad = rep >= ds->pool_size || !sd_utf8_is_valid(ds->pool + rep, strlen(ds->pool + rep));
            }
        }
    }
    if (bad) {
        sd_dataset_close(ds);
        return sd_err_set(err, "dataset index image: offsets outside the string pool");
    }
    ds->id = sd_dataset_new_id_();
    return 0;
}

int sd_dataset_unpack(const void *blob, size_t size, sd_dataset *ds, sd_err *err)
{
    return unpack(blob, size, 0, ds, err);
}

int sd_dataset_view(const void *image, size_t size, sd_dataset *ds, sd_err *err)
{
    return unpack(image, size, 1, ds, err);
}
