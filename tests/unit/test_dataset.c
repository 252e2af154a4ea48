/* TAP tests of the dataset readers: files, webdataset and TSV indexes, reads, reasons, partition. */
#include "sdtrain/dataset.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/tar.h"
#include "sdtrain/utf8.h"
#include "tap.h"

static char tmpdir[256];

/* ---- fixture helpers ------------------------------------------------------------------------ */

/* Deterministic content for a member or file, so reads can be checked against what was written. */
static void fill(unsigned char *buf, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        buf[i] = (unsigned char)(x >> 24);
    }
}

static void mkdirs(const char *path)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        mkdirs(dir);
    }
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n)) {
        tap_diag("cannot write %s: %s", path, strerror(errno));
        exit(1);
    }
    fclose(f);
}

static void put(const char *root, const char *rel, const void *data, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    write_bytes(path, data, n);
}

static void put_str(const char *root, const char *rel, const char *s)
{
    put(root, rel, s, strlen(s));
}

/* A pseudo-image of n bytes whose content follows from the seed. */
static void put_image(const char *root, const char *rel, size_t n, uint32_t seed)
{
    unsigned char *b = malloc(n ? n : 1);
    fill(b, n, seed);
    put(root, rel, b, n);
    free(b);
}

static int read_back(const char *path, unsigned char **data, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)len + 1);
    *n = fread(*data, 1, (size_t)len, f);
    fclose(f);
    return 0;
}

typedef struct tar_member {
    const char *name;
    const char *text;   /* content when not NULL */
    size_t size;        /* else `size` bytes of fill(seed) */
    uint32_t seed;
    int is_dir;
} tar_member;

enum { TAR_PAX, TAR_GNU, TAR_USTAR };

/* Writes a tar with libarchive (format: TAR_*; gzip: compress the whole archive). */
static void write_tar(const char *path, const tar_member *m, size_t n, int format, int gzip)
{
    struct archive *a = archive_write_new();
    if (format == TAR_PAX)
        archive_write_set_format_pax_restricted(a);
    else if (format == TAR_GNU)
        archive_write_set_format_gnutar(a);
    else
        archive_write_set_format_ustar(a);
    if (gzip)
        archive_write_add_filter_gzip(a);
    if (archive_write_open_filename(a, path) != ARCHIVE_OK) {
        tap_diag("archive_write_open_filename %s: %s", path, archive_error_string(a));
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        size_t size = m[i].is_dir ? 0 : m[i].text ? strlen(m[i].text) : m[i].size;
        unsigned char *b = malloc(size ? size : 1);
        if (m[i].text)
            memcpy(b, m[i].text, size);
        else
            fill(b, size, m[i].seed);
        archive_entry_set_pathname(e, m[i].name);
        archive_entry_set_size(e, (la_int64_t)size);
        archive_entry_set_filetype(e, m[i].is_dir ? AE_IFDIR : AE_IFREG);
        archive_entry_set_perm(e, m[i].is_dir ? 0755 : 0644);
        archive_entry_set_mtime(e, 1700000000, 0);
        if (archive_write_header(a, e) != ARCHIVE_OK) {
            tap_diag("archive_write_header %s: %s", m[i].name, archive_error_string(a));
            exit(1);
        }
        if (size && archive_write_data(a, b, size) != (la_ssize_t)size) {
            tap_diag("archive_write_data %s: %s", m[i].name, archive_error_string(a));
            exit(1);
        }
        archive_entry_free(e);
        free(b);
    }
    archive_write_close(a);
    archive_write_free(a);
}

static const tar_member *find_member(const tar_member *m, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(m[i].name, name) == 0)
            return &m[i];
    return NULL;
}

/* 1 when buf[0..len) is what write_tar stored for member `name`. */
static int member_matches(const tar_member *m, size_t n, const char *name, const void *buf, size_t len)
{
    const tar_member *t = find_member(m, n, name);
    if (!t)
        return 0;
    if (t->text)
        return len == strlen(t->text) && memcmp(buf, t->text, len) == 0;
    unsigned char *b = malloc(t->size ? t->size : 1);
    fill(b, t->size, t->seed);
    int ok = len == t->size && memcmp(buf, b, len) == 0;
    free(b);
    return ok;
}

static int file_matches(const char *path, const void *buf, size_t len)
{
    unsigned char *d;
    size_t n;
    if (read_back(path, &d, &n) != 0)
        return 0;
    int ok = n == len && memcmp(d, buf, n) == 0;
    free(d);
    return ok;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------- */

static void test_utf8(void)
{
    /* Expected outputs and counts from CPython 3.11: b.decode('utf-8', 'replace').encode(). */
    static const struct {
        const char *in;
        size_t in_len;
        const char *out;
        size_t n_repl;
    } v[] = {
        {"abc", 3, "abc", 0},
        {"\xff", 1, "\xef\xbf\xbd", 1},
        {"a\xe2\x82", 3, "a\xef\xbf\xbd", 1},
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
        {"\xf0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 3},
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 2},
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 4},
        {"\xe0\xa0", 2, "\xef\xbf\xbd", 1},
        {"caf\xe9 au lait", 12, "caf\xef\xbf\xbd au lait", 1},
        {"\xf0\x9f\x98\x80ok", 6, "\xf0\x9f\x98\x80ok", 0},
        {"\xe2\x82\xac\x80\x80x", 6, "\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbdx", 2},
    };
    int all = 1;
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        char out[64];
        size_t n_repl;
        size_t n = sd_utf8_repair(v[i].in, v[i].in_len, out, &n_repl);
        int ok = n == strlen(v[i].out) && memcmp(out, v[i].out, n) == 0 && n_repl == v[i].n_repl &&
                 sd_utf8_is_valid(v[i].in, v[i].in_len) == (v[i].n_repl == 0) && out[n] == '\0';
        if (!ok)
            tap_diag("utf8 vector %zu differs from CPython", i);
        all &= ok;
    }
    tap_ok(all, "UTF-8 repair matches CPython's errors='replace' on %zu vectors", sizeof v / sizeof *v);
    tap_ok(sd_utf8_is_valid("a\0b", 3) && sd_utf8_valid_prefix("ab\xff" "c", 4) == 2,
           "NUL is valid UTF-8; valid_prefix stops at the first bad byte");
    {
        char out[32];
        size_t n = sd_utf8_nul_to_symbol("a\0b\0", 4, out);
        tap_ok(n == 8 && strcmp(out, "a\xE2\x90\x80" "b\xE2\x90\x80") == 0 &&
                   sd_utf8_nul_to_symbol("a\0b\0", 4, NULL) == 8 &&
                   sd_utf8_nul_to_symbol("ab", 2, out) == 2 && strcmp(out, "ab") == 0 &&
                   sd_utf8_nul_to_symbol("", 0, out) == 0 && out[0] == '\0',
               "NUL bytes become U+2400 SYMBOL FOR NULL for the shard's caption strings");
    }
}

/* ---- files layout --------------------------------------------------------------------------- */

static void make_files_fixture(const char *root)
{
    put_image(root, "00000/000000000.jpg", 1000, 1);
    put_str(root, "00000/000000000.txt", "a cat");
    put_str(root, "00000/000000000.json", "{\"url\": \"http://x\"}");
    put_image(root, "00000/000000001.jpg", 700, 2);             /* no caption */
    put_image(root, "00000/000000002.webp", 300, 3);            /* unsupported */
    put_str(root, "00000/000000002.txt", "webp picture");
    put_image(root, "00000/000000003.png", 500, 4);
    put(root, "00000/000000003.txt", "\xff\xfehello", 7);       /* not UTF-8 */
    put_image(root, "00000/000000004.jpg", 400, 5);
    put_str(root, "00000/000000004.txt", "");                   /* empty caption */
    put_image(root, "00000/000000005.JPG", 200, 6);             /* upper-case extensions */
    put_str(root, "00000/000000005.TXT", "upper");
    put_str(root, "00000/000000006.txt", "orphan caption");     /* no image */
    put_str(root, "00000/notes.md", "not data");
    put_image(root, "00000/.hidden.jpg", 10, 7);
    put_image(root, "00001/000010000.jpeg", 600, 8);
    put_str(root, "00001/000010000.txt", "  \r\n\t ");          /* whitespace only */
    put_image(root, "00001/000010001.png", 100, 9);             /* two images: .jpg wins */
    put_image(root, "00001/000010001.jpg", 101, 10);
    put_str(root, "00001/000010001.txt", "two images");
    put_image(root, "00001/000010002.jpg", 0, 11);              /* empty image */
    put_str(root, "00001/000010002.txt", "empty image");
    put_image(root, "00001/000010004.jpg", 50, 12);             /* removed after indexing */
    put_str(root, "00001/000010004.txt", "gone");
    put_image(root, "00001/sub/deep.jpg", 60, 13);
    put_str(root, "00001/sub/deep.txt", "deeper");
    put_image(root, "a/x.jpg", 70, 14);
    put_str(root, "a/x.txt", "in a");
    put_image(root, "a-b/x.jpg", 80, 15);
    put_str(root, "a-b/x.txt", "in a-b");
    put_str(root, "00000_stats.json", "{}");
    put_str(root, "00000.parquet", "PAR1");
    put_image(root, ".git/objects/x.jpg", 10, 16);               /* hidden folder: not walked */
    char link[700];
    snprintf(link, sizeof link, "%s/00001/sub/loop", root);     /* a link back up: not followed twice */
    if (symlink("..", link) != 0)
        tap_diag("symlink: %s", strerror(errno));
}

/* The index as ranks of a node see it (mode 'process'): a view of one packed image, no copy.
 * The image made in place (pack_into) and by pack_close (the build freed as it is copied) is
 * sd_dataset_pack's, byte for byte; the view reads what the index reads, points into the image,
 * is refused when unaligned, and closing it leaves the image alone. Closes *ds. */
static void check_view(sd_dataset *ds, const char *what)
{
    void *blob;
    size_t size, want;
    unsigned char *copy, *odd;
    sd_dataset v;
    sd_err err;
    sd_sample a = {0}, b = {0};
    int same = 1;
    const int64_t n = sd_dataset_count(ds);
    sd_err_clear(&err);
    sd_dataset_pack(ds, &blob, &size);
    want = sd_dataset_pack_size(ds);
    copy = malloc(size);
    sd_dataset_pack_into(ds, copy, size);
    tap_ok(want == size && !memcmp(copy, blob, size), "%s: pack_into writes sd_dataset_pack's image", what);
    tap_ok(sd_dataset_view(copy, size, &v, &err) == 0 && v.viewed && sd_dataset_count(&v) == n &&
               (unsigned char *)v.entries > copy && (unsigned char *)v.pool < copy + size,
           "%s: viewed in place (%s)", what, err.msg);
    for (int64_t i = 0; i < n && v.viewed; i++) {
        sd_err e1, e2;
        int r1 = sd_dataset_read(ds, i, &a, &e1), r2 = sd_dataset_read(&v, i, &b, &e2);
        same &= r1 == r2 && a.reason == b.reason && !strcmp(a.key, b.key) && a.image_size == b.image_size &&
                !strcmp(e1.msg, e2.msg) &&
                (r1 != 0 || (!memcmp(a.image, b.image, a.image_size) && a.caption_len == b.caption_len &&
                             !memcmp(a.caption, b.caption, a.caption_len)));
    }
    tap_ok(same, "%s: the view reads the same samples", what);
    sd_dataset_close(&v);
    tap_ok(!memcmp(copy, blob, size), "%s: closing a view leaves its image alone", what);
    odd = malloc(size + 1);
    memcpy(odd + 1, blob, size);
    tap_ok(sd_dataset_view(odd + 1, size, &v, &err) == -1 && strstr(err.msg, "aligned"),
           "%s: an unaligned image is not viewed (%s)", what, err.msg);
    tap_ok(sd_dataset_unpack(odd + 1, size, &v, &err) == 0 && !v.viewed, "%s: ... but unpacks (a copy)", what);
    sd_dataset_close(&v);
    memset(copy, 0, size);
    sd_dataset_pack_close(ds, copy, size);
    tap_ok(!memcmp(copy, blob, size) && ds->entries == NULL && ds->pool == NULL && ds->count == 0,
           "%s: pack_close writes the same image and closes the index", what);
    sd_sample_free(&a);
    sd_sample_free(&b);
    free(odd);
    free(copy);
    free(blob);
}

static void test_files(void)
{
    char root[512];
    snprintf(root, sizeof root, "%s/files", tmpdir);
    make_files_fixture(root);

    sd_dataset ds;
    sd_err err;
    tap_ok(sd_dataset_open(root, "files", &ds, &err) == 0, "files: open (%s)", err.msg);
    static const char *const keys[] = {
        "00000/000000000", "00000/000000001", "00000/000000002", "00000/000000003", "00000/000000004",
        "00000/000000005", "00001/000010000", "00001/000010001", "00001/000010002", "00001/000010004",
        "00001/sub/deep",  "a-b/x",           "a/x"};
    const int n = (int)(sizeof keys / sizeof *keys);
    tap_ok(sd_dataset_count(&ds) == n, "files: %d samples indexed (%" PRId64 ")", n, sd_dataset_count(&ds));
    int order = sd_dataset_count(&ds) == n;
    for (int i = 0; order && i < n; i++)
        if (strcmp(sd_dataset_key(&ds, i), keys[i]) != 0) {
            tap_diag("key %d: %s, expected %s", i, sd_dataset_key(&ds, i), keys[i]);
            order = 0;
        }
    tap_ok(order, "files: keys are relative paths without extension, sorted byte-wise ('a-b/' before 'a/')");
    tap_ok(ds.stats.n_orphan_captions == 1 && ds.stats.n_duplicates == 1 && ds.stats.n_ignored == 4 &&
               ds.stats.n_unreadable_dirs == 0,
           "files: stats orphan=1 duplicates=1 ignored=4 (%" PRId64 " %" PRId64 " %" PRId64 ")",
           ds.stats.n_orphan_captions, ds.stats.n_duplicates, ds.stats.n_ignored);
    tap_ok(ds.n_notes == 1 && strstr(ds.notes[0], "00001/sub/loop/") && strstr(ds.notes[0], "symbolic link loop"),
           "files: a symbolic link loop is noted, not followed (%s)", ds.n_notes ? ds.notes[0] : "");

    sd_sample_info info;
    sd_dataset_info(&ds, 0, &info);
    tap_ok(!strcmp(info.image_suffix, ".jpg") && !strcmp(info.caption_suffix, ".txt") &&
               info.json_suffix && !strcmp(info.json_suffix, ".json") && info.image_kind == SD_IMAGE_EXT_JPEG &&
               info.has_caption && info.has_json && info.shard == NULL,
           "files: sample 0 has .jpg, .txt and .json");
    sd_dataset_info(&ds, 1, &info);
    tap_ok(!info.has_caption && info.caption_suffix == NULL && !info.has_json, "files: sample 1 has no caption");
    sd_dataset_info(&ds, 2, &info);
    tap_ok(info.image_kind == SD_IMAGE_EXT_UNSUPPORTED && !strcmp(info.image_suffix, ".webp"),
           "files: .webp is indexed as an unsupported image");
    sd_dataset_info(&ds, 5, &info);
    tap_ok(!strcmp(info.image_suffix, ".JPG") && !strcmp(info.caption_suffix, ".TXT"),
           "files: upper-case extensions are found and kept as spelled");
    sd_dataset_info(&ds, 7, &info);
    tap_ok(!strcmp(info.image_suffix, ".jpg"), "files: of .jpg and .png for one stem, .jpg is the image");
    char desc[1024], path[1024];
    sd_dataset_describe(&ds, 10, desc, sizeof desc);
    snprintf(path, sizeof path, "%s/00001/sub/deep.jpg", root);
    tap_ok(strcmp(desc, path) == 0, "files: describe gives the image path (%s)", desc);

    /* Delete a file after indexing: the read reports it, nothing stops. */
    snprintf(path, sizeof path, "%s/00001/000010004.jpg", root);
    unlink(path);

    sd_sample s = {0};
    sd_sample_counts counts = {0};
    static const sd_sample_reason expect[] = {
        SD_SAMPLE_OK, SD_SAMPLE_MISSING_CAPTION, SD_SAMPLE_UNSUPPORTED_IMAGE, SD_SAMPLE_CAPTION_REPAIRED,
        SD_SAMPLE_EMPTY_CAPTION, SD_SAMPLE_OK, SD_SAMPLE_EMPTY_CAPTION, SD_SAMPLE_OK, SD_SAMPLE_EMPTY_IMAGE,
        SD_SAMPLE_UNREADABLE, SD_SAMPLE_OK, SD_SAMPLE_OK, SD_SAMPLE_OK};
    int reasons_ok = 1, bytes_ok = 1;
    for (int i = 0; i < n && i < sd_dataset_count(&ds); i++) {
        int rc = sd_dataset_read(&ds, i, &s, &err);
        sd_sample_counts_add(&counts, s.reason);
        if (s.reason != expect[i] || (rc == 0) != sd_sample_reason_keeps(expect[i]) ||
            s.keep != (rc == 0) || s.index != i || strcmp(s.key, keys[i]) != 0) {
            tap_diag("sample %d: reason %s rc %d (%s), expected %s", i, sd_sample_reason_name(s.reason), rc,
                     err.msg, sd_sample_reason_name(expect[i]));
            reasons_ok = 0;
        }
        if (rc == 0) {
            sd_dataset_info(&ds, i, &info);
            snprintf(path, sizeof path, "%s/%s%s", root, keys[i], info.image_suffix);
            if (!file_matches(path, s.image, s.image_size) || s.caption[s.caption_len] != '\0') {
                tap_diag("sample %d: image bytes differ from %s", i, path);
                bytes_ok = 0;
            }
        }
    }
    tap_ok(reasons_ok, "files: every sample gets the expected reason and keep flag");
    tap_ok(bytes_ok, "files: kept samples' image bytes equal the files");

    sd_dataset_read(&ds, 0, &s, &err);
    tap_ok(s.caption_len == 5 && !strcmp(s.caption, "a cat") && !s.caption_missing && !s.caption_empty,
           "files: caption read from the .txt");
    tap_ok(sd_dataset_read_json(&ds, 0, &s, &err) == 1 && s.json_size == 19 &&
               memcmp(s.json, "{\"url\": \"http://x\"}", 19) == 0,
           "files: .json read on demand as raw bytes");
    tap_ok(sd_dataset_read_json(&ds, 1, &s, &err) == 0 && s.json_size == 0, "files: no .json -> 0");
    {
        /* a .json of more than SD_JSON_MAX_BYTES is refused, not read (sparse: no disk used) */
        char jpath[4096];
        snprintf(jpath, sizeof jpath, "%s/%s.json", root, keys[0]);
        memset(&err, 0, sizeof err);
        tap_ok(truncate(jpath, (off_t)SD_JSON_MAX_BYTES + 1) == 0 &&
                   sd_dataset_read_json(&ds, 0, &s, &err) == -1 && strstr(err.msg, jpath) &&
                   strstr(err.msg, "more than the 16 MiB a .json may have"),
               "files: a .json of 16 MiB + 1 byte refused (%s)", err.msg);
        tap_ok(truncate(jpath, 19) == 0 && sd_dataset_read_json(&ds, 0, &s, &err) == 1 &&
                   s.json_size == 19, "files: and read again once cut back");
    }
    sd_dataset_read(&ds, 3, &s, &err);
    tap_ok(s.caption_repaired && s.n_replaced == 2 && !strcmp(s.caption, "\xef\xbf\xbd\xef\xbf\xbdhello") &&
               strstr(err.msg, "000000003.txt") != NULL,
           "files: invalid UTF-8 repaired with U+FFFD by default (%s)", err.msg);
    sd_dataset_read(&ds, 4, &s, &err);
    tap_ok(s.caption_empty && s.caption_len == 0 && s.keep, "files: empty caption kept and flagged");
    sd_dataset_read(&ds, 6, &s, &err);
    tap_ok(s.caption_empty && s.caption_len == 6 && s.keep, "files: whitespace-only caption counts as empty");
    sd_dataset_read(&ds, 1, &s, &err);
    tap_ok(strstr(err.msg, "000000001.jpg") && strstr(err.msg, "no caption"), "files: missing caption message: %s",
           err.msg);
    sd_dataset_read(&ds, 9, &s, &err);
    tap_ok(strstr(err.msg, "000010004.jpg") && strstr(err.msg, "No such file"),
           "files: unreadable message names the file: %s", err.msg);
    sd_dataset_read(&ds, 2, &s, &err);
    tap_ok(strstr(err.msg, ".webp") && strstr(err.msg, "unsupported"), "files: unsupported message: %s", err.msg);

    char summary[512];
    sd_sample_counts_format(&counts, summary, sizeof summary);
    tap_ok(strcmp(summary, "13 samples read: 9 kept (ok 6, empty_caption 2, caption_repaired 1), 4 skipped "
                           "(unreadable 1, missing_caption 1, unsupported_image 1, empty_image 1)") == 0 ||
               (tap_diag("summary: %s", summary), 0),
           "files: end-of-run summary line");

    /* Policies. */
    ds.utf8_policy = SD_UTF8_REJECT;
    tap_ok(sd_dataset_read(&ds, 3, &s, &err) == -1 && s.reason == SD_SAMPLE_INVALID_UTF8 &&
               strstr(err.msg, "not valid UTF-8"),
           "files: utf8 policy 'reject' skips the sample: %s", err.msg);
    ds.missing_caption = SD_MISSING_CAPTION_EMPTY;
    tap_ok(sd_dataset_read(&ds, 1, &s, &err) == 0 && s.reason == SD_SAMPLE_MISSING_CAPTION_KEPT &&
               s.caption_missing && s.caption_len == 0 && s.caption[0] == '\0' && s.image_size == 700,
           "files: missing-caption policy 'empty' keeps the sample with \"\"");
    ds.utf8_policy = SD_UTF8_REPLACE;
    ds.missing_caption = SD_MISSING_CAPTION_SKIP;

    sd_dataset_truncate(&ds, 4);
    tap_ok(sd_dataset_count(&ds) == 4 && ds.stats.n_indexed == n, "files: max_samples keeps the first 4");
    sd_dataset_truncate(&ds, 0);
    tap_ok(sd_dataset_count(&ds) == n, "files: max_samples 0 = all");

    sd_sample_free(&s);
    check_view(&ds, "files");

    /* Trailing slashes and auto. */
    char slashed[600];
    snprintf(slashed, sizeof slashed, "%s//", root);
    tap_ok(sd_dataset_open(slashed, "auto", &ds, &err) == 0 && ds.format == SD_DATASET_FILES &&
               strcmp(ds.root, root) == 0 && sd_dataset_count(&ds) == n - 1,
           "files: auto picks files for a folder of images; trailing slashes dropped; the deleted image is gone");
    sd_dataset_close(&ds);
}

/* ---- tsv ------------------------------------------------------------------------------------ */

static void test_tsv(void)
{
    char root[512], manifest[600], abs_img[700], text[8192];
    snprintf(root, sizeof root, "%s/tsv", tmpdir);
    put_image(root, "img/b.jpg", 123, 21);
    put_image(root, "img/a.png", 77, 22);
    put_image(root, "img/nocap.jpg", 10, 23);
    put_image(root, "img/c.jpg", 33, 24);
    put_image(root, "img/latin.jpg", 44, 25);
    put_image(root, "img/empty.jpg", 55, 26);
    put_image(root, "img/x.webp", 66, 27);
    put_image(root, "img/noext", 88, 28);
    snprintf(abs_img, sizeof abs_img, "%s/img/c", root);
    snprintf(text, sizeof text,
             "\xEF\xBB\xBFpath\tcaption\r\n"
             "# a comment\r\n"
             "img/b.jpg\tsecond image\r\n"
             "img/a.png\tfirst\twith\ttabs\n"
             "\r\n"
             "img/missing.jpg\tdoes not exist\n"
             "\tno path\n"
             "img/nocap.jpg\n"
             "%s.jpg\tabsolute\n"
             "img/latin.jpg\tcaf\xe9\n"
             "img/empty.jpg\t\n"
             "img/x.webp\twebp\n"
             "img/noext\tno extension\n"
             "img/b.jpg\tsame image again\n"
             "img/a.png\tno newline at the end",
             abs_img);
    snprintf(manifest, sizeof manifest, "%s/list.tsv", root);
    write_bytes(manifest, text, strlen(text));

    sd_dataset ds;
    sd_err err;
    tap_ok(sd_dataset_open(manifest, "auto", &ds, &err) == 0 && ds.format == SD_DATASET_TSV,
           "tsv: auto picks tsv for a .tsv file (%s)", err.msg);
    static const struct {
        const char *key, *sfx, *caption;
        sd_sample_reason reason;
    } want[] = {
        {"img/b", ".jpg", "second image", SD_SAMPLE_OK},
        {"img/a", ".png", "first\twith\ttabs", SD_SAMPLE_OK},
        {"img/missing", ".jpg", NULL, SD_SAMPLE_UNREADABLE},
        {"img/nocap", ".jpg", NULL, SD_SAMPLE_MISSING_CAPTION},
        {NULL, ".jpg", "absolute", SD_SAMPLE_OK},
        {"img/latin", ".jpg", "caf\xef\xbf\xbd", SD_SAMPLE_CAPTION_REPAIRED},
        {"img/empty", ".jpg", "", SD_SAMPLE_EMPTY_CAPTION},
        {"img/x", ".webp", NULL, SD_SAMPLE_UNSUPPORTED_IMAGE},
        {"img/noext", "", "no extension", SD_SAMPLE_OK},
        {"img/b", ".jpg", "same image again", SD_SAMPLE_OK},
        {"img/a", ".png", "no newline at the end", SD_SAMPLE_OK},
    };
    const int n = (int)(sizeof want / sizeof *want);
    tap_ok(sd_dataset_count(&ds) == n, "tsv: %d samples in manifest order (%" PRId64 ")", n, sd_dataset_count(&ds));
    tap_ok(ds.stats.n_bad_lines == 1 && ds.n_notes == 1 && strstr(ds.notes[0], "list.tsv:7: empty path"),
           "tsv: a line with an empty path is counted and noted (%s)", ds.n_notes ? ds.notes[0] : "");
    int ok = sd_dataset_count(&ds) == n;
    sd_sample s = {0};
    for (int i = 0; ok && i < n; i++) {
        sd_sample_info info;
        sd_dataset_info(&ds, i, &info);
        const char *key = want[i].key ? want[i].key : abs_img;
        int rc = sd_dataset_read(&ds, i, &s, &err);
        int good = !strcmp(info.key, key) && !strcmp(info.image_suffix, want[i].sfx) && s.reason == want[i].reason &&
                   (rc == 0) == sd_sample_reason_keeps(want[i].reason);
        if (good && want[i].caption && rc == 0)
            good = s.caption_len == strlen(want[i].caption) && !strcmp(s.caption, want[i].caption);
        if (good && rc == 0) {
            char path[4096];
            if (key[0] == '/')
                snprintf(path, sizeof path, "%s%s", key, want[i].sfx);
            else
                snprintf(path, sizeof path, "%s/%s%s", root, key, want[i].sfx);
            good = file_matches(path, s.image, s.image_size);
        }
        if (!good)
            tap_diag("tsv sample %d: key %s sfx %s reason %s caption '%s' (%s)", i, info.key, info.image_suffix,
                     sd_sample_reason_name(s.reason), s.caption, err.msg);
        ok &= good;
    }
    tap_ok(ok, "tsv: keys, suffixes, captions (tabs kept, CR dropped, BOM and header skipped), reasons, bytes");
    sd_sample_info info;
    sd_dataset_info(&ds, 8, &info);
    tap_ok(info.image_kind == SD_IMAGE_EXT_UNKNOWN, "tsv: a path without a known extension is read, kind unknown");
    sd_dataset_read(&ds, 2, &s, &err);
    tap_ok(strstr(err.msg, "img/missing.jpg") && strstr(err.msg, "No such file"),
           "tsv: a path that does not exist is 'unreadable': %s", err.msg);
    sd_dataset_read(&ds, 3, &s, &err);
    tap_ok(strstr(err.msg, "img/nocap.jpg: no caption (its manifest line has no tab)") != NULL,
           "tsv: missing caption message: %s", err.msg);
    sd_sample_free(&s);
    check_view(&ds, "tsv");

    /* A manifest without header whose first path is literally a header word is still data
     * only when it has no tab; and a .txt manifest is tsv under auto. */
    snprintf(manifest, sizeof manifest, "%s/list.txt", root);
    put_str(root, "list.txt", "img/b.jpg\tonly line\n");
    tap_ok(sd_dataset_open(manifest, NULL, &ds, &err) == 0 && ds.format == SD_DATASET_TSV &&
               sd_dataset_count(&ds) == 1 && !strcmp(sd_dataset_key(&ds, 0), "img/b"),
           "tsv: a .txt manifest without header, format NULL = auto");
    sd_dataset_close(&ds);

    put_str(root, "empty.tsv", "# nothing\n\n");
    snprintf(manifest, sizeof manifest, "%s/empty.tsv", root);
    tap_ok(sd_dataset_open(manifest, "tsv", &ds, &err) == -1 && strstr(err.msg, "no samples") &&
               strstr(err.msg, "empty.tsv"),
           "tsv: a manifest without samples is an error: %s", err.msg);

    /* A FIFO where an image should be, and as the manifest itself: refused at once, never
     * waited on (open without O_NONBLOCK blocks until a writer comes). An alarm turns a hang
     * into a failure of this program instead of a stuck test suite. */
    {
        char fifo[700];
        sd_sample fs = {0};
        snprintf(fifo, sizeof fifo, "%s/img/fifo.jpg", root);
        if (mkfifo(fifo, 0644) != 0) {
            tap_ok(0, "mkfifo: %s", strerror(errno));
        } else {
            alarm(60);
            put_str(root, "fifo.tsv", "img/fifo.jpg\ta pipe\n");
            snprintf(manifest, sizeof manifest, "%s/fifo.tsv", root);
            int rc = sd_dataset_open(manifest, "tsv", &ds, &err);
            int r = rc == 0 ? sd_dataset_read(&ds, 0, &fs, &err) : 0;
            tap_ok(rc == 0 && r == -1 && fs.reason == SD_SAMPLE_UNREADABLE && strstr(err.msg, "fifo.jpg") &&
                       strstr(err.msg, "not a regular file"),
                   "tsv: a FIFO as an image is skipped as unreadable, not waited on (%s)", err.msg);
            sd_sample_free(&fs);
            sd_dataset_close(&ds);
            rc = sd_dataset_open(fifo, "tsv", &ds, &err);
            tap_ok(rc == -1 && strstr(err.msg, "fifo.jpg"), "tsv: a FIFO as the manifest is refused (%s)",
                   err.msg);
            sd_dataset_close(&ds);
            alarm(0);
        }
    }
}

/* ---- tar scanner vs libarchive -------------------------------------------------------------- */

typedef struct scan_log {
    char names[64][320];
    uint64_t off[64], size[64];
    int truncated[64];
    int n;
} scan_log;

static int log_member(const sd_tar_member *m, void *ctx)
{
    scan_log *l = ctx;
    if (l->n < 64 && m->type == '0') {
        snprintf(l->names[l->n], sizeof l->names[0], "%s", m->name);
        l->off[l->n] = m->data_offset;
        l->size[l->n] = m->size;
        l->truncated[l->n] = m->truncated;
        l->n++;
    }
    return 0;
}

/* Every regular member libarchive sees must be one the scanner reported, at the offset where
 * libarchive's own reading stands after the header, with the same bytes there. */
static int compare_with_libarchive(const char *path, const scan_log *l, int *n_seen)
{
    struct archive *a = archive_read_new();
    archive_read_support_format_tar(a);
    archive_read_support_format_gnutar(a);
    if (archive_read_open_filename(a, path, 10240) != ARCHIVE_OK)
        return 0;
    int fd = open(path, O_RDONLY), ok = 1, k = 0;
    struct archive_entry *e;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
        if (archive_entry_filetype(e) != AE_IFREG)
            continue;
        la_int64_t pos = archive_filter_bytes(a, 0), size = archive_entry_size(e);
        unsigned char *lib = malloc((size_t)size + 1), *mine = malloc((size_t)size + 1);
        la_ssize_t got = archive_read_data(a, lib, (size_t)size);
        if (got != size) { /* the truncated last member: libarchive fails, the scanner flags it */
            free(lib);
            free(mine);
            break;
        }
        if (k >= l->n || strcmp(l->names[k], archive_entry_pathname(e)) != 0 || (la_int64_t)l->off[k] != pos ||
            (la_int64_t)l->size[k] != size || pread(fd, mine, (size_t)size, (off_t)l->off[k]) != size ||
            memcmp(lib, mine, (size_t)size) != 0) {
            tap_diag("%s: member %d (%s) differs from libarchive (offset %" PRIu64 " vs %lld)", path, k,
                     archive_entry_pathname(e), k < l->n ? l->off[k] : 0, (long long)pos);
            ok = 0;
        }
        free(lib);
        free(mine);
        k++;
    }
    close(fd);
    archive_read_free(a);
    *n_seen = k;
    return ok;
}

static char long_name[300];

static void test_tar_scanner(void)
{
    char path[600];
    snprintf(long_name, sizeof long_name, "%s/%s/long-sample.jpg",
             "a-folder-name-that-is-long-enough-to-need-an-extension-header-0123456789",
             "and-another-folder-to-pass-the-ustar-limits-of-one-hundred-and-fifty-five-bytes-abcdefghij");
    const tar_member m[] = {
        {"x/", NULL, 0, 0, 1},
        {"x/one.jpg", NULL, 1000, 31, 0},
        {"x/one.txt", "one", 0, 0, 0},
        {long_name, NULL, 513, 32, 0},
        {"x/zero.jpg", NULL, 0, 33, 0},
        {"x/big.png", NULL, 70000, 34, 0},
    };
    const int formats[] = {TAR_PAX, TAR_GNU, TAR_USTAR};
    const char *names[] = {"pax", "gnu", "ustar"};
    for (int f = 0; f < 3; f++) {
        snprintf(path, sizeof path, "%s/scan-%s.tar", tmpdir, names[f]);
        /* ustar cannot store the long name: leave that member out there. */
        const tar_member mu[] = {m[0], m[1], m[2], m[4], m[5]};
        write_tar(path, f == TAR_USTAR ? mu : m, f == TAR_USTAR ? 5 : 6, formats[f], 0);
        scan_log l;
        memset(&l, 0, sizeof l);
        sd_err err;
        int rc = sd_tar_scan(path, log_member, &l, &err);
        int n_seen = 0;
        int same = compare_with_libarchive(path, &l, &n_seen);
        tap_ok(rc == SD_TAR_OK && l.n == (f == TAR_USTAR ? 4 : 5) && same && n_seen == l.n,
               "tar scan (%s): %d regular members, offsets and bytes agree with libarchive", names[f], l.n);
    }

    /* Truncate the gnu tar inside big.png's data. */
    snprintf(path, sizeof path, "%s/scan-gnu.tar", tmpdir);
    scan_log l;
    memset(&l, 0, sizeof l);
    sd_err err;
    sd_tar_scan(path, log_member, &l, &err);
    uint64_t cut = l.off[4] + 1000;
    if (truncate(path, (off_t)cut) != 0)
        tap_diag("truncate: %s", strerror(errno));
    memset(&l, 0, sizeof l);
    int rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_DAMAGED && l.n == 5 && l.truncated[4] && !l.truncated[3] && strstr(err.msg, "big.png"),
           "tar scan: a member cut by the end of file is reported truncated (%s)", err.msg);
    /* Cut inside the data of the member with the pax long name (found by tests/fuzz/fuzz_tar.c:
     * the message read the name after it was freed; the ASan build catches that). */
    {
        char pax[600];
        scan_log lp;
        sd_err perr;
        int i_long = -1;
        snprintf(pax, sizeof pax, "%s/scan-pax.tar", tmpdir);
        memset(&lp, 0, sizeof lp);
        sd_tar_scan(pax, log_member, &lp, &perr);
        for (int i = 0; i < lp.n; i++)
            if (strcmp(lp.names[i], long_name) == 0)
                i_long = i;
        if (i_long >= 0 && truncate(pax, (off_t)(lp.off[i_long] + 100)) != 0)
            tap_diag("truncate: %s", strerror(errno));
        memset(&lp, 0, sizeof lp);
        int prc = sd_tar_scan(pax, log_member, &lp, &perr);
        tap_ok(i_long >= 0 && prc == SD_TAR_DAMAGED && lp.n == i_long + 1 && lp.truncated[i_long] &&
                   strstr(perr.msg, long_name) && strstr(perr.msg, "100 of 513 bytes present"),
               "tar scan: a truncated member with a pax long name is named in the message (%s)", perr.msg);
    }
    /* Cut inside a header block. */
    if (truncate(path, (off_t)(l.off[4] - 200)) != 0)
        tap_diag("truncate: %s", strerror(errno));
    memset(&l, 0, sizeof l);
    rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_DAMAGED && l.n == 4 && strstr(err.msg, "truncated tar header"),
           "tar scan: a cut header ends the scan after the members before it (%s)", err.msg);

    snprintf(path, sizeof path, "%s/garbage.tar", tmpdir);
    char junk[2048];
    memset(junk, 'x', sizeof junk);
    write_bytes(path, junk, sizeof junk);
    rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_DAMAGED && strstr(err.msg, "checksum") && strstr(err.msg, "offset 0"),
           "tar scan: not a tar -> damaged at offset 0 (%s)", err.msg);
    snprintf(path, sizeof path, "%s/empty.tar", tmpdir);
    write_bytes(path, "", 0);
    memset(&l, 0, sizeof l);
    tap_ok(sd_tar_scan(path, log_member, &l, &err) == SD_TAR_OK && l.n == 0, "tar scan: an empty file is an empty archive");
    snprintf(path, sizeof path, "%s/scan.tar.gz", tmpdir);
    write_tar(path, m, 3, TAR_PAX, 1);
    tap_ok(sd_tar_scan(path, log_member, &l, &err) == SD_TAR_COMPRESSED && strstr(err.msg, "gzip"),
           "tar scan: gzip data is rejected (%s)", err.msg);
    snprintf(path, sizeof path, "%s/does-not-exist.tar", tmpdir);
    tap_ok(sd_tar_scan(path, log_member, &l, &err) == SD_TAR_UNREADABLE && strstr(err.msg, "No such file"),
           "tar scan: a missing file is unreadable");
}

/* One hand-made tar header: magic 0 = v7 (none), 1 = POSIX ustar, 2 = old GNU. */
static void make_header(unsigned char *h, const char *name, char type, uint64_t size, int magic, int base256)
{
    memset(h, 0, 512);
    memcpy(h, name, strlen(name) < 100 ? strlen(name) : 100);
    memcpy(h + 100, "0000644", 8);
    memcpy(h + 108, "0000000", 8);
    memcpy(h + 116, "0000000", 8);
    if (base256) {
        h[124] = 0x80;
        for (int i = 0; i < 8; i++)
            h[135 - i] = (unsigned char)(size >> (8 * i));
    } else {
        snprintf((char *)h + 124, 12, "%011" PRIo64, size);
    }
    memcpy(h + 136, "14712345670", 12);
    h[156] = (unsigned char)type;
    if (magic == 1)
        memcpy(h + 257, "ustar\0" "00", 8);
    else if (magic == 2)
        memcpy(h + 257, "ustar  \0", 8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 7, "%06o", sum);
    h[155] = ' ';
}

static void test_tar_handmade(void)
{
    /* Blocks: pax global header + data, v7 file, base-256 size file, GNU sparse, long link +
     * symlink with a bogus size, end marker. */
    static unsigned char t[512 * 16];
    memset(t, 0, sizeof t);
    unsigned char *b = t;
    make_header(b, "pax_global_header", 'g', 20, 1, 0);
    memcpy(b + 512, "20 comment=fixture\n", 20);
    b += 1024;
    make_header(b, "v7.txt", '0', 5, 0, 0);          /* data at 1536 */
    memcpy(b + 512, "hello", 5);
    b += 1024;
    make_header(b, "b256.jpg", '0', 700, 1, 1);      /* data at 2560, two blocks */
    fill(b + 512, 700, 99);
    b += 512 + 1024;
    make_header(b, "sparse.jpg", 'S', 10, 2, 0);     /* data at 4096 */
    b += 1024;
    make_header(b, "././@LongLink", 'K', 30, 2, 0);
    memcpy(b + 512, "a-very-long-symlink-target.txt", 30);
    b += 1024;
    make_header(b, "link.txt", '2', 999, 1, 0);      /* symlinks have no data blocks */
    b += 512;
    make_header(b, "last.txt", '0', 3, 1, 0);        /* data at 6656 */
    memcpy(b + 512, "end", 3);
    char path[600];
    snprintf(path, sizeof path, "%s/handmade.tar", tmpdir);
    write_bytes(path, t, sizeof t);

    scan_log l;
    memset(&l, 0, sizeof l);
    sd_err err;
    int rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_OK && l.n == 4, "handmade tar: 4 regular members (rc %d, %d) %s", rc, l.n, rc ? err.msg : "");
    tap_ok(l.n == 4 && !strcmp(l.names[0], "v7.txt") && l.off[0] == 1536 && l.size[0] == 5 &&
               !strcmp(l.names[1], "b256.jpg") && l.off[1] == 2560 && l.size[1] == 700 &&
               !strcmp(l.names[2], "sparse.jpg") && l.off[2] == 4096 && !strcmp(l.names[3], "last.txt") &&
               l.off[3] == 6656 && l.size[3] == 3,
           "handmade tar: v7 header, base-256 size, global header and link skipped, offsets exact");

    /* Through the dataset: sparse members cannot be read by offset. */
    sd_dataset ds;
    tap_ok(sd_dataset_open(path, "webdataset", &ds, &err) == 0 && sd_dataset_count(&ds) == 2,
           "handmade tar: two image samples (%s)", err.msg);
    sd_sample s = {0};
    sd_sample_info info;
    ds.missing_caption = SD_MISSING_CAPTION_EMPTY;
    int r0 = sd_dataset_read(&ds, 0, &s, &err);
    unsigned char want[700];
    fill(want, 700, 99);
    tap_ok(r0 == 0 && s.image_size == 700 && !memcmp(s.image, want, 700) && s.caption_missing,
           "handmade tar: the base-256 member reads back");
    sd_dataset_info(&ds, 1, &info);
    tap_ok(info.image_unreadable && sd_dataset_read(&ds, 1, &s, &err) == -1 && s.reason == SD_SAMPLE_UNREADABLE &&
               strstr(err.msg, "sparse"),
           "handmade tar: a sparse member is unreadable: %s", err.msg);
    sd_sample_free(&s);
    sd_dataset_close(&ds);

    /* A damaged checksum in the middle keeps the members before it. */
    t[2048 + 10] ^= 0x55; /* inside b256.jpg's header */
    write_bytes(path, t, sizeof t);
    memset(&l, 0, sizeof l);
    rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_DAMAGED && l.n == 1 && strstr(err.msg, "checksum at offset 2048"),
           "handmade tar: a bad checksum mid-archive stops there (%s)", err.msg);
}

/* ---- webdataset ----------------------------------------------------------------------------- */

static const tar_member shard0[] = {
    {"./000000000.jpg", NULL, 900, 41, 0},
    {"./000000000.txt", "zero", 0, 0, 0},
    {"./000000000.json", "{\"k\":0}", 0, 0, 0},
    {"000000001.txt", "one, caption first", 0, 0, 0},
    {"000000002.jpg", NULL, 1500, 42, 0},
    {"000000001.jpg", NULL, 1100, 43, 0},
    {"000000002.txt", "two", 0, 0, 0},
    {"dir/", NULL, 0, 0, 1},
    {"dir/000000003.seg.png", NULL, 50, 44, 0},
    {"dir/000000003.png", NULL, 2000, 45, 0},
    {"dir/000000003.txt", "three in dir", 0, 0, 0},
    {"000000004.webp", NULL, 300, 46, 0},
    {"000000004.txt", "webp", 0, 0, 0},
    {"000000005.txt", "orphan", 0, 0, 0},
    {"README", "no extension", 0, 0, 0},
    {"000000006.jpg", NULL, 321, 47, 0},
    {"000000006.jpg", NULL, 322, 48, 0},
    {"000000006.txt", "\xff bad", 0, 0, 0},
    {"000000007.jpg", NULL, 100, 49, 0},
    {"000000007.txt", "", 0, 0, 0},
    {"000000008.png", NULL, 64, 50, 0}, /* no caption member */
};
#define N_SHARD0 (sizeof shard0 / sizeof *shard0)

static tar_member shard1[] = {
    {"000000100.jpg", NULL, 5000, 51, 0},
    {"000000100.txt", "hundred", 0, 0, 0},
    {NULL, NULL, 700, 52, 0}, /* long_name-based, set at run time */
    {NULL, "long", 0, 0, 0},
    {"000000101.txt", "cut", 0, 0, 0},
    {"000000101.jpg", NULL, 3000, 53, 0},
};
#define N_SHARD1 (sizeof shard1 / sizeof *shard1)

static void test_webdataset(void)
{
    char dir[512], path[700], long_txt[320];
    snprintf(dir, sizeof dir, "%s/wds", tmpdir);
    mkdirs(dir);
    snprintf(long_txt, sizeof long_txt, "%.*s.txt", (int)(strlen(long_name) - 4), long_name);
    shard1[2].name = long_name;
    shard1[3].name = long_txt;
    /* Written in reverse name order: the index must sort shards by path. */
    snprintf(path, sizeof path, "%s/shard-00001.tar", dir);
    write_tar(path, shard1, N_SHARD1, TAR_GNU, 0);
    scan_log l;
    memset(&l, 0, sizeof l);
    sd_err err;
    sd_tar_scan(path, log_member, &l, &err);
    if (truncate(path, (off_t)(l.off[l.n - 1] + 1234)) != 0) /* inside 000000101.jpg's data */
        tap_diag("truncate: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/shard-00000.tar", dir);
    write_tar(path, shard0, N_SHARD0, TAR_PAX, 0);
    snprintf(path, sizeof path, "%s/shard-00002.tar", dir);
    write_bytes(path, "this is not a tar file, it is far too short and has no header", 62);
    snprintf(path, sizeof path, "%s/old.tar.gz", dir);
    write_tar(path, shard0, 2, TAR_PAX, 1);
    put_str(dir, "notes.txt", "not a shard");

    sd_dataset ds;
    tap_ok(sd_dataset_open(dir, "auto", &ds, &err) == 0 && ds.format == SD_DATASET_WEBDATASET,
           "webdataset: auto picks webdataset for a folder of .tar (%s)", err.msg);
    static const struct {
        int shard;
        const char *key, *img, *img_member, *cap_member, *json_member;
        sd_sample_reason reason;
        const char *caption;
    } want[] = {
        {0, "000000000", ".jpg", "./000000000.jpg", "./000000000.txt", "./000000000.json", SD_SAMPLE_OK, "zero"},
        {0, "000000001", ".jpg", "000000001.jpg", "000000001.txt", NULL, SD_SAMPLE_OK, "one, caption first"},
        {0, "000000002", ".jpg", "000000002.jpg", "000000002.txt", NULL, SD_SAMPLE_OK, "two"},
        {0, "dir/000000003", ".png", "dir/000000003.png", "dir/000000003.txt", NULL, SD_SAMPLE_OK, "three in dir"},
        {0, "000000004", ".webp", NULL, NULL, NULL, SD_SAMPLE_UNSUPPORTED_IMAGE, NULL},
        {0, "000000006", ".jpg", "000000006.jpg", "000000006.txt", NULL, SD_SAMPLE_CAPTION_REPAIRED, "\xef\xbf\xbd bad"},
        {0, "000000007", ".jpg", "000000007.jpg", "000000007.txt", NULL, SD_SAMPLE_EMPTY_CAPTION, ""},
        {0, "000000008", ".png", "000000008.png", NULL, NULL, SD_SAMPLE_MISSING_CAPTION, NULL},
        {1, "000000100", ".jpg", "000000100.jpg", "000000100.txt", NULL, SD_SAMPLE_OK, "hundred"},
        {1, NULL, ".jpg", NULL, NULL, NULL, SD_SAMPLE_OK, "long"},
        {1, "000000101", ".jpg", NULL, NULL, NULL, SD_SAMPLE_TRUNCATED, NULL},
    };
    const int n = (int)(sizeof want / sizeof *want);
    tap_ok(sd_dataset_count(&ds) == n, "webdataset: %d samples (%" PRId64 ")", n, sd_dataset_count(&ds));
    tap_ok(ds.n_shards == 3 && ds.stats.n_shards == 3 && ds.stats.n_damaged_shards == 2 && ds.stats.n_truncated == 1 &&
               ds.stats.n_orphan_captions == 1 && ds.stats.n_duplicates == 1 && ds.stats.n_ignored == 2,
           "webdataset: stats shards=3 damaged=2 truncated=1 orphans=1 duplicates=1 ignored=2 "
           "(%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 ")",
           ds.stats.n_shards, ds.stats.n_damaged_shards, ds.stats.n_truncated, ds.stats.n_orphan_captions,
           ds.stats.n_duplicates, ds.stats.n_ignored);
    int notes_ok = ds.n_notes == 3 && strstr(ds.notes[0], "compressed") && strstr(ds.notes[1], "shard-00001.tar") &&
                   strstr(ds.notes[1], "truncated") && strstr(ds.notes[2], "shard-00002.tar");
    for (int i = 0; i < ds.n_notes; i++)
        tap_diag("note: %s", ds.notes[i]);
    tap_ok(notes_ok, "webdataset: notes name the ignored .tar.gz, the truncated and the damaged shard");

    char long_key[320];
    snprintf(long_key, sizeof long_key, "%.*s", (int)(strlen(long_name) - 4), long_name);
    sd_sample s = {0};
    int ok = sd_dataset_count(&ds) == n;
    for (int i = 0; ok && i < n; i++) {
        sd_sample_info info;
        sd_dataset_info(&ds, i, &info);
        const char *key = want[i].key ? want[i].key : long_key;
        char shard_path[700];
        snprintf(shard_path, sizeof shard_path, "%s/shard-0000%d.tar", dir, want[i].shard);
        int good = !strcmp(info.key, key) && !strcmp(info.shard, shard_path) && !strcmp(info.image_suffix, want[i].img);
        const tar_member *members = want[i].shard == 0 ? shard0 : shard1;
        size_t nm = want[i].shard == 0 ? N_SHARD0 : N_SHARD1;
        /* The recorded offsets, read by pread, give the bytes written. */
        int fd = open(shard_path, O_RDONLY);
        if (good && want[i].img_member) {
            unsigned char *b = malloc(info.image_size + 1);
            good = pread(fd, b, info.image_size, (off_t)info.image_offset) == (ssize_t)info.image_size &&
                   member_matches(members, nm, want[i].img_member, b, info.image_size);
            free(b);
        }
        if (good && want[i].cap_member) {
            unsigned char *b = malloc(info.caption_size + 1);
            good = pread(fd, b, info.caption_size, (off_t)info.caption_offset) == (ssize_t)info.caption_size &&
                   member_matches(members, nm, want[i].cap_member, b, info.caption_size);
            free(b);
        }
        if (good && want[i].json_member) {
            unsigned char *b = malloc(info.json_size + 1);
            good = pread(fd, b, info.json_size, (off_t)info.json_offset) == (ssize_t)info.json_size &&
                   member_matches(members, nm, want[i].json_member, b, info.json_size);
            free(b);
        }
        close(fd);
        int rc = sd_dataset_read(&ds, i, &s, &err);
        good = good && s.reason == want[i].reason && (rc == 0) == sd_sample_reason_keeps(want[i].reason);
        if (good && want[i].caption)
            good = s.caption_len == strlen(want[i].caption) && !strcmp(s.caption, want[i].caption);
        if (good && rc == 0 && want[i].img_member)
            good = member_matches(members, nm, want[i].img_member, s.image, s.image_size);
        if (!good)
            tap_diag("webdataset sample %d: key %s shard %s sfx %s reason %s (%s)", i, info.key, info.shard,
                     info.image_suffix, sd_sample_reason_name(s.reason), err.msg);
        ok &= good;
    }
    tap_ok(ok, "webdataset: keys, shard order, first-appearance order, offsets (pread == bytes written), reads");
    sd_sample_info info;
    sd_dataset_info(&ds, 10, &info);
    tap_ok(info.image_truncated && !info.caption_truncated && info.has_caption, "webdataset: truncated last member flagged");
    sd_dataset_read(&ds, 7, &s, &err);
    tap_ok(strstr(err.msg, "shard-00000.tar:000000008.png: no caption (no member 000000008.txt") != NULL,
           "webdataset: missing caption message: %s", err.msg);
    sd_dataset_read(&ds, 10, &s, &err);
    tap_ok(strstr(err.msg, "shard-00001.tar:000000101.jpg") && strstr(err.msg, "truncated"),
           "webdataset: truncated message names shard and member: %s", err.msg);
    tap_ok(sd_dataset_read_json(&ds, 0, &s, &err) == 1 && s.json_size == 7 && !memcmp(s.json, "{\"k\":0}", 7),
           "webdataset: .json member read on demand");
    char desc[1024];
    sd_dataset_describe(&ds, 3, desc, sizeof desc);
    snprintf(path, sizeof path, "%s/shard-00000.tar:dir/000000003.png", dir);
    tap_ok(!strcmp(desc, path), "webdataset: describe = shard:member (%s)", desc);

    /* The packed index, unpacked, reads the same. */
    void *blob;
    size_t blob_size;
    sd_dataset ds2;
    sd_dataset_pack(&ds, &blob, &blob_size);
    tap_ok(sd_dataset_unpack(blob, blob_size, &ds2, &err) == 0 && sd_dataset_count(&ds2) == n &&
               ds2.format == SD_DATASET_WEBDATASET && ds2.stats.n_truncated == 1 && ds2.id != ds.id,
           "webdataset: pack/unpack round trip (%zu bytes)", blob_size);
    int same = 1;
    sd_sample s2 = {0};
    for (int i = 0; i < n && sd_dataset_count(&ds2) == n; i++) {
        sd_err e1, e2;
        int r1 = sd_dataset_read(&ds, i, &s, &e1), r2 = sd_dataset_read(&ds2, i, &s2, &e2);
        same &= r1 == r2 && s.reason == s2.reason && !strcmp(s.key, s2.key) && s.image_size == s2.image_size &&
                (r1 != 0 || (!memcmp(s.image, s2.image, s.image_size) && !strcmp(s.caption, s2.caption)));
    }
    tap_ok(same, "webdataset: the unpacked index reads the same samples");
    tap_ok(!ds2.viewed, "webdataset: an unpacked index is a copy");
    sd_dataset_close(&ds2);
    ((unsigned char *)blob)[blob_size - 1] ^= 1;
    ((char *)blob)[0] = 'X';
    tap_ok(sd_dataset_unpack(blob, blob_size, &ds2, &err) == -1 && strstr(err.msg, "magic"),
           "webdataset: a damaged image is refused (%s)", err.msg);
    tap_ok(sd_dataset_unpack(blob, 10, &ds2, &err) == -1, "webdataset: a short image is refused");
    {
        /* A shard count 2^61 too large keeps the computed size (x 8 bytes, modulo 2^64): the
         * header check once accepted it and read past the image (tests/fuzz/fuzz_dataset.c).
         * The header: 8 bytes of magic, six uint32, then count, n_shards, n_suffixes (int64). */
        int64_t n_shards;
        ((char *)blob)[0] = 'S';
        memcpy(&n_shards, (unsigned char *)blob + 40, sizeof n_shards);
        n_shards += INT64_C(1) << 61;
        memcpy((unsigned char *)blob + 40, &n_shards, sizeof n_shards);
        tap_ok(sd_dataset_unpack(blob, blob_size, &ds2, &err) == -1 && strstr(err.msg, "too short for its header"),
               "webdataset: an image whose counts wrap its size around is refused (%s)", err.msg);
    }
    free(blob);
    sd_sample_free(&s);
    sd_sample_free(&s2);
    check_view(&ds, "webdataset");

    /* Single shard, glob and brace patterns. */
    snprintf(path, sizeof path, "%s/shard-00000.tar", dir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == 0 && ds.n_shards == 1 && sd_dataset_count(&ds) == 8,
           "webdataset: a single .tar (auto)");
    sd_dataset_close(&ds);
    snprintf(path, sizeof path, "%s/shard-0000[01].tar", dir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == 0 && ds.format == SD_DATASET_WEBDATASET && ds.n_shards == 2 &&
               sd_dataset_count(&ds) == n,
           "webdataset: a glob pattern (auto) (%s)", err.msg);
    sd_dataset_close(&ds);
    snprintf(path, sizeof path, "%s/shard-{00001..00000}.tar", dir);
    tap_ok(sd_dataset_open(path, "webdataset", &ds, &err) == 0 && ds.n_shards == 2 && sd_dataset_count(&ds) == n &&
               !strcmp(sd_dataset_key(&ds, 0), "000000000"),
           "webdataset: a {a..b} range (descending, zero-padded), shards sorted (%s)", err.msg);
    sd_dataset_close(&ds);
    snprintf(path, sizeof path, "%s/shard-{00000,00001}.tar", dir);
    tap_ok(sd_dataset_open(path, "webdataset", &ds, &err) == 0 && ds.n_shards == 2, "webdataset: a {a,b} list");
    sd_dataset_close(&ds);
    snprintf(path, sizeof path, "%s/shard-{00000..00003}.tar", dir);
    tap_ok(sd_dataset_open(path, "webdataset", &ds, &err) == -1 && strstr(err.msg, "shard-00003.tar") &&
               strstr(err.msg, "No such file"),
           "webdataset: a range naming a missing shard is an error: %s", err.msg);
    snprintf(path, sizeof path, "%s/nothing-*.tar", dir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "matches no files"),
           "webdataset: a glob matching nothing is an error: %s", err.msg);
    snprintf(path, sizeof path, "%s/old.tar.gz", dir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "gzip-compressed") &&
               strstr(err.msg, "old.tar.gz"),
           "webdataset: a compressed shard is refused clearly: %s", err.msg);
    snprintf(path, sizeof path, "%s/shard-00002.tar", dir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "no samples") &&
               strstr(err.msg, "truncated tar header at offset 0") && strstr(err.msg, "shard skipped"),
           "webdataset: only a damaged shard -> no samples, first problem quoted: %s", err.msg);

    char only_gz[600];
    snprintf(only_gz, sizeof only_gz, "%s/gzonly", tmpdir);
    mkdirs(only_gz);
    snprintf(path, sizeof path, "%s/a.tar.gz", only_gz);
    write_tar(path, shard0, 2, TAR_PAX, 1);
    tap_ok(sd_dataset_open(only_gz, "webdataset", &ds, &err) == -1 && strstr(err.msg, "compressed"),
           "webdataset: a folder of only .tar.gz is refused: %s", err.msg);
}

/* ---- auto detection and open errors --------------------------------------------------------- */

static void test_open_errors(void)
{
    sd_dataset ds;
    sd_err err;
    char path[600];
    tap_ok(sd_dataset_open("", "auto", &ds, &err) == -1 && strstr(err.msg, "data.input is empty"),
           "open: empty input (%s)", err.msg);
    snprintf(path, sizeof path, "%s/nope", tmpdir);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "No such file"),
           "open: missing input (%s)", err.msg);
    tap_ok(sd_dataset_open(tmpdir, "parquet", &ds, &err) == -1 && strstr(err.msg, "unknown dataset format"),
           "open: unknown format (%s)", err.msg);
    snprintf(path, sizeof path, "%s/tsv/list.tsv", tmpdir);
    tap_ok(sd_dataset_open(path, "files", &ds, &err) == -1 && strstr(err.msg, "not a folder"),
           "open: 'files' on a file (%s)", err.msg);
    snprintf(path, sizeof path, "%s/blob.bin", tmpdir);
    put_str(tmpdir, "blob.bin", "random bytes");
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "cannot tell"),
           "open: auto on an unknown file (%s)", err.msg);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/textonly", tmpdir);
    put_str(dir, "a.txt", "caption without image");
    tap_ok(sd_dataset_open(dir, "auto", &ds, &err) == -1 && strstr(err.msg, "no samples"),
           "open: a folder without images (%s)", err.msg);
    /* A tar without a telling name is recognised by its ustar magic. */
    snprintf(path, sizeof path, "%s/shard.data", tmpdir);
    const tar_member m[] = {{"k.jpg", NULL, 10, 1, 0}, {"k.txt", "c", 0, 0, 0}};
    write_tar(path, m, 2, TAR_PAX, 0);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == 0 && ds.format == SD_DATASET_WEBDATASET &&
               sd_dataset_count(&ds) == 1,
           "open: auto recognises a tar by its header (%s)", err.msg);
    sd_dataset_close(&ds);
    sd_dataset_close(&ds); /* twice is fine */
}

/* ---- division of work ----------------------------------------------------------------------- */

static void test_partition(void)
{
    int covered_ok = 1, balanced_ok = 1, contiguous_ok = 1, det_ok = 1, cases = 0;
    static int seen[64];
    for (int64_t N = 0; N <= 40; N++)
        for (int64_t S = 1; S <= 12; S++)
            for (int P = 1; P <= 7; P++) {
                int64_t ns = sd_dataset_n_shards(N, S);
                if (ns != (N + S - 1) / S)
                    covered_ok = 0;
                memset(seen, 0, sizeof seen);
                for (int64_t k = 0; k < ns; k++) {
                    int64_t lo = k * S, hi = (k + 1) * S < N ? (k + 1) * S : N, prev_end = lo;
                    int64_t min_len = INT64_MAX, max_len = 0;
                    for (int r = 0; r < P; r++) {
                        int64_t b, e, b2, e2;
                        if (sd_dataset_partition(N, S, P, r, k, &b, &e) != 0) {
                            covered_ok = 0;
                            continue;
                        }
                        sd_dataset_partition(N, S, P, r, k, &b2, &e2);
                        det_ok &= b == b2 && e == e2;
                        contiguous_ok &= b == prev_end && e >= b && e <= hi;
                        prev_end = e;
                        for (int64_t i = b; i < e; i++)
                            seen[i]++;
                        min_len = e - b < min_len ? e - b : min_len;
                        max_len = e - b > max_len ? e - b : max_len;
                    }
                    contiguous_ok &= prev_end == hi;
                    balanced_ok &= max_len - min_len <= 1;
                }
                for (int64_t i = 0; i < N; i++)
                    covered_ok &= seen[i] == 1;
                cases++;
            }
    tap_ok(covered_ok, "partition: every sample in exactly one (shard, rank) slice (%d cases)", cases);
    tap_ok(contiguous_ok, "partition: slices are contiguous, in rank order, inside their shard");
    tap_ok(balanced_ok, "partition: slice sizes within a shard differ by at most 1");
    tap_ok(det_ok, "partition: same arguments, same slice");
    int64_t b, e;
    sd_dataset_partition(10, 4, 3, 0, 2, &b, &e);
    int a0 = b == 8 && e == 9;
    sd_dataset_partition(10, 4, 3, 1, 2, &b, &e);
    int a1 = b == 9 && e == 10;
    sd_dataset_partition(10, 4, 3, 2, 2, &b, &e);
    tap_ok(a0 && a1 && b == 10 && e == 10, "partition: last shard [8,10) over 3 ranks = [8,9) [9,10) [10,10)");
    sd_dataset_partition(1000, 100, 3, 0, 1, &b, &e);
    int c0 = b == 100 && e == 134;
    sd_dataset_partition(1000, 100, 3, 2, 1, &b, &e);
    tap_ok(c0 && b == 167 && e == 200, "partition: shard 1 of 100 over 3 ranks = 34, 33, 33");
    tap_ok(sd_dataset_partition(10, 4, 3, 3, 0, &b, &e) == -1 && sd_dataset_partition(10, 4, 3, 0, 3, &b, &e) == -1 &&
               sd_dataset_partition(10, 0, 3, 0, 0, &b, &e) == -1 && sd_dataset_partition(-1, 4, 3, 0, 0, &b, &e) == -1 &&
               sd_dataset_partition(10, 4, 0, 0, 0, &b, &e) == -1 && sd_dataset_partition(0, 4, 1, 0, 0, &b, &e) == -1 &&
               b == 0 && e == 0,
           "partition: invalid arguments -> -1 and an empty range");
    tap_ok(sd_dataset_n_shards(0, 5) == 0 && sd_dataset_n_shards(10, 5) == 2 && sd_dataset_n_shards(11, 5) == 3 &&
               sd_dataset_n_shards(5, 0) == -1 && sd_dataset_n_shards(-1, 5) == -1,
           "n_shards: ceil(N/S), 0 for N = 0, -1 for invalid");
}

/* A caption longer than SD_CAPTION_MAX_BYTES is skipped as caption_too_long in every format,
 * without being read; one of exactly the limit is kept. */
static void test_caption_limit(void)
{
    char root[512], path[700], *big = malloc(SD_CAPTION_MAX_BYTES + 2), *line;
    const size_t line_size = 2 * SD_CAPTION_MAX_BYTES + 256;
    sd_dataset ds;
    sd_sample s = {0};
    sd_err err;
    memset(big, 'x', SD_CAPTION_MAX_BYTES + 1);
    big[SD_CAPTION_MAX_BYTES + 1] = '\0';
    snprintf(root, sizeof root, "%s/longcap", tmpdir);
    put_image(root, "files/00000/a.jpg", 100, 31);
    put(root, "files/00000/a.txt", big, SD_CAPTION_MAX_BYTES); /* exactly the limit */
    put_image(root, "files/00000/b.jpg", 100, 32);
    put(root, "files/00000/b.txt", big, SD_CAPTION_MAX_BYTES + 1);
    snprintf(path, sizeof path, "%s/files", root);
    tap_ok(sd_dataset_open(path, "files", &ds, &err) == 0 && sd_dataset_count(&ds) == 2,
           "caption limit: files indexed (%s)", err.msg);
    tap_ok(sd_dataset_read(&ds, 0, &s, &err) == 0 && s.caption_len == SD_CAPTION_MAX_BYTES,
           "caption limit: files: a caption of exactly %d bytes is kept", SD_CAPTION_MAX_BYTES);
    tap_ok(sd_dataset_read(&ds, 1, &s, &err) == -1 && s.reason == SD_SAMPLE_CAPTION_TOO_LONG &&
               strstr(err.msg, "00000/b.txt: a caption of 65537 bytes (at most 65536)"),
           "caption limit: files: one byte more is skipped as caption_too_long: %s", err.msg);
    sd_dataset_close(&ds);

    line = malloc(line_size);
    big[SD_CAPTION_MAX_BYTES] = '\0';
    snprintf(line, line_size, "files/00000/a.jpg\t%s\nfiles/00000/b.jpg\t%sy\n", big, big);
    snprintf(path, sizeof path, "%s/list.tsv", root);
    write_bytes(path, line, strlen(line));
    tap_ok(sd_dataset_open(path, "tsv", &ds, &err) == 0 && sd_dataset_count(&ds) == 2,
           "caption limit: tsv indexed (%s)", err.msg);
    tap_ok(sd_dataset_read(&ds, 0, &s, &err) == 0 && s.caption_len == SD_CAPTION_MAX_BYTES,
           "caption limit: tsv: a caption of exactly the limit is kept");
    tap_ok(sd_dataset_read(&ds, 1, &s, &err) == -1 && s.reason == SD_SAMPLE_CAPTION_TOO_LONG &&
               strstr(err.msg, "a caption of 65537 bytes"),
           "caption limit: tsv: one byte more is skipped: %s", err.msg);
    sd_dataset_close(&ds);

    {
        big[SD_CAPTION_MAX_BYTES] = 'x';
        tar_member m[] = {{"a.jpg", NULL, 100, 33, 0}, {"a.txt", "short", 0, 0, 0},
                          {"b.jpg", NULL, 100, 34, 0}, {"b.txt", big, 0, 0, 0}};
        snprintf(path, sizeof path, "%s/wds", root);
        mkdirs(path);
        snprintf(path, sizeof path, "%s/wds/shard-00000.tar", root);
        write_tar(path, m, 4, TAR_PAX, 0);
        snprintf(path, sizeof path, "%s/wds", root);
        tap_ok(sd_dataset_open(path, "webdataset", &ds, &err) == 0 && sd_dataset_count(&ds) == 2,
               "caption limit: webdataset indexed (%s)", err.msg);
        tap_ok(sd_dataset_read(&ds, 0, &s, &err) == 0 && !strcmp(s.caption, "short"),
               "caption limit: webdataset: a short caption is kept");
        tap_ok(sd_dataset_read(&ds, 1, &s, &err) == -1 && s.reason == SD_SAMPLE_CAPTION_TOO_LONG &&
                   strstr(err.msg, "b.txt") && strstr(err.msg, "a caption of 65537 bytes"),
               "caption limit: webdataset: a member of one byte more is skipped: %s", err.msg);
        sd_dataset_close(&ds);
    }
    sd_sample_free(&s);
    free(line);
    free(big);
}

/* ---- real-world variations: non-UTF-8 names, GNU sparse names, UTF-16 manifests ------------- */

/* A file or member named in Latin-1 ("caf\xe9"): the key callers see (and a shard stores, as a
 * UTF-8 string) has U+FFFD for the bad byte, while the bytes still open the file. Before, the
 * raw key reached the shard writer, which refused it and stopped mode 'process' (status 1, no
 * shard written) for one oddly named file. */
static void test_non_utf8_names(void)
{
    char root[512], path[700];
    const char *want = "caf" SD_UTF8_REPLACEMENT;
    sd_dataset ds, back;
    sd_sample s = {0};
    sd_sample_info info;
    sd_err err;
    snprintf(root, sizeof root, "%s/latin1", tmpdir);
    put_image(root, "files/00000/caf\xe9.jpg", 200, 61);
    put_str(root, "files/00000/caf\xe9.txt", "a cafe");
    put_image(root, "files/00000/plain.jpg", 100, 62);
    put_str(root, "files/00000/plain.txt", "plain");
    snprintf(path, sizeof path, "%s/files", root);
    int ok = sd_dataset_open(path, "files", &ds, &err) == 0 && sd_dataset_count(&ds) == 2;
    tap_ok(ok, "latin-1 names: files indexed (%s)", err.msg);
    if (ok) {
        char want_key[64];
        snprintf(want_key, sizeof want_key, "00000/%s", want);
        sd_dataset_info(&ds, 0, &info);
        int r = sd_dataset_read(&ds, 0, &s, &err);
        snprintf(path, sizeof path, "%s/files/00000/caf\xe9.jpg", root);
        tap_ok(r == 0 && !strcmp(sd_dataset_key(&ds, 0), want_key) && !strcmp(s.key, want_key) &&
                   info.key == sd_dataset_key(&ds, 0) && file_matches(path, s.image, s.image_size) &&
                   !strcmp(s.caption, "a cafe") && !strcmp(sd_dataset_key(&ds, 1), "00000/plain"),
               "latin-1 names: files: the key is UTF-8 (U+FFFD), the file is read by its bytes (%s)",
               err.msg);
        void *blob;
        size_t size;
        sd_dataset_pack(&ds, &blob, &size);
        tap_ok(sd_dataset_unpack(blob, size, &back, &err) == 0 && !strcmp(sd_dataset_key(&back, 0), want_key) &&
                   sd_dataset_read(&back, 0, &s, &err) == 0 && file_matches(path, s.image, s.image_size),
               "latin-1 names: the packed index keeps both the bytes and the UTF-8 key (%s)", err.msg);
        sd_dataset_close(&back);
        free(blob);
    }
    sd_dataset_close(&ds);

    snprintf(path, sizeof path, "%s/list.tsv", root);
    put_str(root, "list.tsv", "files/00000/caf\xe9.jpg\tfrom the manifest\n");
    ok = sd_dataset_open(path, "tsv", &ds, &err) == 0 && sd_dataset_count(&ds) == 1;
    tap_ok(ok && !strcmp(sd_dataset_key(&ds, 0), "files/00000/caf" SD_UTF8_REPLACEMENT) &&
               sd_dataset_read(&ds, 0, &s, &err) == 0 && s.image_size == 200 &&
               sd_utf8_is_valid(s.key, strlen(s.key)),
           "latin-1 names: tsv: UTF-8 key, image read (%s)", err.msg);
    sd_dataset_close(&ds);

    const tar_member m[] = {{"caf\xe9.jpg", NULL, 300, 63, 0}, {"caf\xe9.txt", "tar cafe", 0, 0, 0}};
    snprintf(path, sizeof path, "%s/latin1.tar", root);
    write_tar(path, m, 2, TAR_USTAR, 0);
    ok = sd_dataset_open(path, "webdataset", &ds, &err) == 0 && sd_dataset_count(&ds) == 1;
    tap_ok(ok && !strcmp(sd_dataset_key(&ds, 0), want) && sd_dataset_read(&ds, 0, &s, &err) == 0 &&
               member_matches(m, 2, "caf\xe9.jpg", s.image, s.image_size) && !strcmp(s.caption, "tar cafe"),
           "latin-1 names: webdataset: UTF-8 key, members paired and read (%s)", err.msg);
    sd_dataset_close(&ds);
    sd_sample_free(&s);
}

/* GNU tar --sparse in POSIX format (sparse formats 0.1 and 1.0) names the member
 * ./GNUSparseFile.PID/NAME in 'path' and the real name in 'GNU.sparse.name' (which Python's
 * tarfile uses). Before, the key was GNUSparseFile.PID/s: the sample lost its caption s.txt (an
 * orphan) and the message named a member no tool shows. */
static void test_tar_sparse_name(void)
{
    static unsigned char t[512 * 10];
    memset(t, 0, sizeof t);
    const char *recs = "38 path=./GNUSparseFile.123/dir/s.jpg\n"
                       "29 GNU.sparse.name=dir/s.jpg\n"
                       "22 GNU.sparse.major=1\n"
                       "22 GNU.sparse.minor=0\n"
                       "29 GNU.sparse.realsize=20000\n";
    unsigned char *b = t;
    make_header(b, "./PaxHeaders/s.jpg", 'x', strlen(recs), 1, 0);
    memcpy(b + 512, recs, strlen(recs));
    b += 1024;
    make_header(b, "./GNUSparseFile.123/s.jpg", '0', 1024, 1, 0); /* map block + one data block */
    memcpy(b + 512, "1\n0\n512\n", 8);
    b += 512 * 3;
    make_header(b, "dir/s.txt", '0', 6, 1, 0);
    memcpy(b + 512, "sparse", 6);
    char path[600];
    snprintf(path, sizeof path, "%s/sparse-pax.tar", tmpdir);
    write_bytes(path, t, sizeof t);
    scan_log l;
    memset(&l, 0, sizeof l);
    sd_err err;
    int rc = sd_tar_scan(path, log_member, &l, &err);
    tap_ok(rc == SD_TAR_OK && l.n == 2 && !strcmp(l.names[0], "dir/s.jpg"),
           "tar scan: a pax sparse member is named by GNU.sparse.name (%s)", l.n ? l.names[0] : "");
    sd_dataset ds;
    sd_sample s = {0};
    int ok = sd_dataset_open(path, "webdataset", &ds, &err) == 0 && sd_dataset_count(&ds) == 1;
    tap_ok(ok && !strcmp(sd_dataset_key(&ds, 0), "dir/s") && ds.stats.n_orphan_captions == 0 &&
               sd_dataset_read(&ds, 0, &s, &err) == -1 && s.reason == SD_SAMPLE_UNREADABLE &&
               strstr(err.msg, "sparse-pax.tar:dir/s.jpg: cannot be read by offset"),
           "webdataset: the sparse member keeps its key and caption, unreadable: %s", err.msg);
    sd_dataset_close(&ds);
    sd_sample_free(&s);
}

/* Windows PowerShell's `>` and Excel's "Unicode Text" write UTF-16. Before, each line was a bad
 * line ("NUL byte in the path"), which does not say what is wrong. */
static void test_tsv_utf16(void)
{
    char path[600];
    sd_dataset ds;
    sd_err err;
    snprintf(path, sizeof path, "%s/utf16.tsv", tmpdir);
    write_bytes(path, "\xff\xfe" "a\0.\0j\0p\0g\0\t\0c\0\n\0", 18);
    tap_ok(sd_dataset_open(path, "tsv", &ds, &err) == -1 && strstr(err.msg, "utf16.tsv: UTF-16LE text") &&
               strstr(err.msg, "save the manifest as UTF-8"),
           "tsv: a UTF-16 manifest is refused by name: %s", err.msg);
    write_bytes(path, "\xfe\xff" "\0a\0.\0j\0p\0g", 12);
    tap_ok(sd_dataset_open(path, "auto", &ds, &err) == -1 && strstr(err.msg, "UTF-16BE"),
           "tsv: UTF-16BE too: %s", err.msg);
}

static void test_reasons(void)
{
    int names_ok = 1;
    for (int r = 0; r < SD_SAMPLE_N_REASONS; r++)
        names_ok &= sd_sample_reason_name((sd_sample_reason)r)[0] != '?';
    tap_ok(names_ok && !strcmp(sd_sample_reason_name(SD_SAMPLE_UNSUPPORTED_IMAGE), "unsupported_image") &&
               !strcmp(sd_sample_reason_name(SD_SAMPLE_N_REASONS), "?"),
           "reasons: every reason has a name");
    sd_sample_counts c = {0};
    char buf[256];
    sd_sample_counts_format(&c, buf, sizeof buf);
    tap_ok(!strcmp(buf, "0 samples read: 0 kept, 0 skipped"), "reasons: empty summary (%s)", buf);
    sd_sample_counts_add(&c, SD_SAMPLE_OK);
    sd_sample_counts_add(&c, SD_SAMPLE_TRUNCATED);
    char small[16];
    int need = sd_sample_counts_format(&c, small, sizeof small);
    sd_sample_counts_format(&c, buf, sizeof buf);
    tap_ok(need == (int)strlen(buf) && strlen(small) == 15 && !strcmp(buf, "2 samples read: 1 kept (ok 1), 1 skipped (truncated 1)"),
           "reasons: summary truncates safely and returns the full length (%s)", buf);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/sdtrain-dataset-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    test_utf8();
    test_files();
    test_tsv();
    test_caption_limit();
    test_tar_scanner();
    test_tar_handmade();
    test_webdataset();
    test_open_errors();
    test_non_utf8_names();
    test_tar_sparse_name();
    test_tsv_utf16();
    test_partition();
    test_reasons();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", tmpdir);
    return tap_done();
}
