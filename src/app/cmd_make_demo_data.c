/* sdtool make-demo-data: a small synthetic captioned image dataset (coloured shapes whose
 * captions say what they show), in any of the three input formats, optionally with planted
 * bad samples so the skip counts of a preprocessing run can be checked. */
#include "sd_config.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>

#include "sdtrain/check.h"
#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"
#include "sdtrain/rng.h"

static const struct {
    const char *name;
    uint8_t rgb[3];
} colours[] = {{"red", {220, 30, 30}},     {"green", {30, 180, 50}},  {"blue", {40, 60, 220}},
               {"yellow", {240, 220, 40}}, {"white", {245, 245, 245}}, {"black", {15, 15, 15}},
               {"purple", {140, 40, 170}}, {"orange", {250, 140, 20}}};
static const char *shapes[] = {"square", "circle", "triangle", "stripe"};
#define N_COLOURS (int)(sizeof colours / sizeof colours[0])

/* One sample: the picture and its caption, a pure function of (seed, index). Sides are drawn from
 * [40, 128] scaled by max_side / 128 (the default 128 keeps the original set). */
static void draw(uint64_t seed, int64_t i, int max_side, int *w_out, int *h_out, uint8_t **rgb, char *caption,
                 size_t cap)
{
    uint32_t r[8];
    for (int k = 0; k < 8; k++)
        r[k] = sd_rng_uniform_u32(seed, SD_RNG_PURPOSE(SD_RNG_USER, 1), 0, (uint64_t)i, (uint64_t)k);
    const int lo = (int)((int64_t)40 * max_side / 128), span = max_side - lo + 1;
    int w = lo + (int)(r[0] % (uint32_t)span), h = lo + (int)(r[1] % (uint32_t)span);
    int fg = (int)(r[2] % N_COLOURS), bg = (int)(r[3] % N_COLOURS), shape = (int)(r[4] % 4);
    if (bg == fg)
        bg = (bg + 1) % N_COLOURS;
    uint8_t *p = sd_xmalloc((size_t)w * (size_t)h * 3);
    int cx = w / 2, cy = h / 2, rad = (w < h ? w : h) / 3;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int in = 0;
            switch (shape) {
            case 0: in = abs(x - cx) < rad && abs(y - cy) < rad; break;
            case 1: in = (x - cx) * (x - cx) + (y - cy) * (y - cy) < rad * rad; break;
            case 2: in = y > cy - rad && y < cy + rad && abs(x - cx) < (y - (cy - rad)) / 2; break;
            default: in = (x / 6) % 2 == 0; break;
            }
            /* a little texture so JPEG and the resampling have something to work on */
            int noise = (int)((r[5] ^ ((uint32_t)x * 73856093u) ^ ((uint32_t)y * 19349663u)) % 17u) - 8;
            for (int c = 0; c < 3; c++) {
                int v = (in ? colours[fg].rgb[c] : colours[bg].rgb[c]) + noise;
                p[((size_t)y * (size_t)w + (size_t)x) * 3 + (size_t)c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    snprintf(caption, cap, "a %s %s on a %s background", colours[fg].name, shapes[shape], colours[bg].name);
    *w_out = w;
    *h_out = h;
    *rgb = p;
}

static int encode_jpeg(const uint8_t *rgb, int w, int h, unsigned char **out, unsigned long *size, sd_err *err)
{
    tjhandle tj = tjInitCompress();
    if (!tj)
        return sd_err_set(err, "TurboJPEG cannot initialise");
    *out = NULL;
    *size = 0;
    int rc = tjCompress2(tj, rgb, w, 0, h, TJPF_RGB, out, size, TJSAMP_420, 90, 0);
    tjDestroy(tj);
    return rc == 0 ? 0 : sd_err_set(err, "JPEG encoding failed");
}

static int write_file(const char *path, const void *data, size_t n, sd_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        return sd_err_set(err, "cannot write '%s': %s", path, strerror(errno));
    return 0;
}

static int read_file(const char *path, unsigned char **data, size_t *n, sd_err *err)
{
    uint8_t *b;
    if (sd_image_read_file(path, &b, n, err) != SD_IMG_OK)
        return -1;
    *data = b;
    return 0;
}

/* The planted bad samples (one of each), by index modulo 16 among the last ones. */
typedef enum { BAD_NONE = 0, BAD_TRUNCATED, BAD_ZERO, BAD_TEXT, BAD_WEBP, BAD_NO_CAPTION } bad_kind;

static bad_kind bad_for(int64_t i, int64_t count, int with_bad)
{
    if (!with_bad || i < count - 5)
        return BAD_NONE;
    return (bad_kind)(count - i); /* the last five samples, one of each kind */
}

typedef struct member {
    char name[64];
    unsigned char *data;
    size_t size;
} member;

static int add_tar_member(struct archive *a, const member *m, sd_err *err)
{
    struct archive_entry *e = archive_entry_new();
    archive_entry_set_pathname(e, m->name);
    archive_entry_set_size(e, (la_int64_t)m->size);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_mtime(e, 0, 0); /* reproducible archives */
    int ok = archive_write_header(a, e) == ARCHIVE_OK &&
             (m->size == 0 || archive_write_data(a, m->data, m->size) == (la_ssize_t)m->size);
    archive_entry_free(e);
    return ok ? 0 : sd_err_set(err, "tar: %s", archive_error_string(a));
}

static void demo_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool make-demo-data DIR [--count N] [--seed S] [--format files|webdataset|tsv]\n"
            "                             [--bad] [--max-side PX]\n"
            "\n"
            "Writes a small synthetic captioned image dataset into DIR: coloured squares, circles,\n"
            "triangles and stripes captioned \"a red square on a blue background\".\n"
            "\n"
            "  --count N      samples (default 64, 1 to 10000000)\n"
            "  --seed S       the pictures and captions are a function of S and the index (default 1234)\n"
            "  --format F     files (image + .txt), webdataset (tar shards) or tsv (manifest.tsv)\n"
            "  --bad          the last five samples are bad (truncated, empty, text, WebP, no caption)\n"
            "  --max-side PX  image sides drawn from [40, 128] scaled by PX/128 (16 to 8192; default 128)\n"
            "\n"
            "exit status: 0 written, 1 DIR cannot be written, 2 bad usage.\n");
}

int sd_cmd_make_demo_data(int argc, char **argv)
{
    const char *dir = NULL, *format = "files";
    long long count = 64, seed = 1234;
    int with_bad = 0, png_every = 3, max_side = 128;
    sd_err err;
    char path[4200];
    FILE *tsv = NULL;
    struct archive *tar = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            demo_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(a, "--count") || !strcmp(a, "--seed") || !strcmp(a, "--format") ||
                   !strcmp(a, "--max-side")) {
            const char *v = i + 1 < argc ? argv[++i] : NULL;
            char *end;
            long long n;
            if (!v) {
                fprintf(stderr, "sdtool make-demo-data: %s needs a value (see sdtool make-demo-data --help)\n", a);
                return SD_EXIT_USAGE;
            }
            if (!strcmp(a, "--format")) {
                format = v;
                continue;
            }
            /* a whole number, nothing after it ("5x" is no count; atoll took it for 5) */
            errno = 0;
            n = strtoll(v, &end, 10);
            if (errno || end == v || *end) {
                fprintf(stderr, "sdtool make-demo-data: %s '%s': expected a whole number\n", a, v);
                return SD_EXIT_USAGE;
            }
            if (!strcmp(a, "--count"))
                count = n;
            else if (!strcmp(a, "--seed"))
                seed = n;
            else
                max_side = n < 0 || n > 100000 ? 0 : (int)n; /* out of range: refused below */
        } else if (!strcmp(a, "--bad"))
            with_bad = 1;
        else if (a[0] == '-' || dir) {
            fprintf(stderr, "sdtool make-demo-data: unexpected argument '%s'\n"
                            "usage: sdtool make-demo-data DIR [--count N] [--seed S] [--format files|webdataset|tsv] [--bad] [--max-side PX]\n",
                    a);
            return SD_EXIT_USAGE;
        } else
            dir = a;
    }
    if (!dir || count < 1 || count > 10000000 || seed < 0 || max_side < 16 || max_side > 8192 ||
        (strcmp(format, "files") && strcmp(format, "webdataset") && strcmp(format, "tsv"))) {
        fprintf(stderr, "usage: sdtool make-demo-data DIR [--count N >= 1] [--seed S >= 0] [--format files|webdataset|tsv] [--bad] [--max-side 16..8192]\n");
        return SD_EXIT_USAGE;
    }
    if (sd_mkdir_p(dir, "directory", &err) != 0) {
        fprintf(stderr, "sdtool make-demo-data: %s\n", err.msg);
        return SD_EXIT_FAILURE;
    }
    if (!strcmp(format, "tsv")) {
        snprintf(path, sizeof path, "%s/manifest.tsv", dir);
        tsv = fopen(path, "w");
        if (!tsv) {
            fprintf(stderr, "sdtool make-demo-data: cannot write '%s': %s\n", path, strerror(errno));
            return SD_EXIT_FAILURE;
        }
        fprintf(tsv, "path\tcaption\n");
        snprintf(path, sizeof path, "%s/images", dir);
        mkdir(path, 0777);
    }

    for (int64_t i = 0; i < count; i++) {
        int w, h, shard = (int)(i / 10000);
        uint8_t *rgb;
        char caption[160], stem[32];
        unsigned char *img = NULL;
        unsigned long jsize = 0;
        size_t isize = 0;
        int png = i % png_every == 1;
        bad_kind bad = bad_for(i, count, with_bad);
        const char *ext = png ? "png" : "jpg";

        draw((uint64_t)seed, i, max_side, &w, &h, &rgb, caption, sizeof caption);
        if (png) {
            snprintf(path, sizeof path, "%s/.demo-%lld.png", dir, (long long)i);
            if (sd_image_write_png(path, rgb, w, h, &err) || read_file(path, &img, &isize, &err))
                goto fail;
            remove(path);
        } else {
            if (encode_jpeg(rgb, w, h, &img, &jsize, &err))
                goto fail;
            isize = jsize;
        }
        free(rgb);
        switch (bad) {
        case BAD_TRUNCATED: isize /= 2; break;
        case BAD_ZERO: isize = 0; break;
        case BAD_TEXT: memcpy(img, "<html>404 not found</html>\n", 27); isize = 27; break;
        case BAD_WEBP: memcpy(img, "RIFF\x10\0\0\0WEBPVP8 ", 16); isize = 16; ext = "webp"; break;
        default: break;
        }
        snprintf(stem, sizeof stem, "%09lld", (long long)i);
        if (!strcmp(format, "files")) {
            snprintf(path, sizeof path, "%s/%05d", dir, shard);
            mkdir(path, 0777);
            snprintf(path, sizeof path, "%s/%05d/%s.%s", dir, shard, stem, ext);
            if (write_file(path, img, isize, &err))
                goto fail;
            if (bad != BAD_NO_CAPTION) {
                snprintf(path, sizeof path, "%s/%05d/%s.txt", dir, shard, stem);
                if (write_file(path, caption, strlen(caption), &err))
                    goto fail;
            }
        } else if (tsv) {
            snprintf(path, sizeof path, "%s/images/%s.%s", dir, stem, ext);
            if (write_file(path, img, isize, &err))
                goto fail;
            if (bad == BAD_NO_CAPTION)
                fprintf(tsv, "images/%s.%s\n", stem, ext);
            else
                fprintf(tsv, "images/%s.%s\t%s\n", stem, ext, caption);
        } else {
            member m;
            if (i % 32 == 0) {
                if (tar && archive_write_free(tar) != ARCHIVE_OK) {
                    sd_err_set(&err, "cannot finish a tar shard");
                    goto fail;
                }
                tar = archive_write_new();
                archive_write_set_format_pax_restricted(tar);
                snprintf(path, sizeof path, "%s/%05lld.tar", dir, (long long)(i / 32));
                if (archive_write_open_filename(tar, path) != ARCHIVE_OK) {
                    sd_err_set(&err, "cannot write '%s': %s", path, archive_error_string(tar));
                    goto fail;
                }
            }
            snprintf(m.name, sizeof m.name, "%s.%s", stem, ext);
            m.data = img;
            m.size = isize;
            if (add_tar_member(tar, &m, &err))
                goto fail;
            if (bad != BAD_NO_CAPTION) {
                snprintf(m.name, sizeof m.name, "%s.txt", stem);
                m.data = (unsigned char *)caption;
                m.size = strlen(caption);
                if (add_tar_member(tar, &m, &err))
                    goto fail;
            }
        }
        if (png)
            free(img);
        else
            tjFree(img);
        continue;
    fail:
        fprintf(stderr, "sdtool make-demo-data: %s\n", err.msg);
        if (tsv)
            fclose(tsv);
        if (tar)
            archive_write_free(tar);
        return SD_EXIT_FAILURE;
    }
    if (tsv && fclose(tsv) != 0) {
        fprintf(stderr, "sdtool make-demo-data: cannot write the manifest: %s\n", strerror(errno));
        return SD_EXIT_FAILURE;
    }
    if (tar && archive_write_free(tar) != ARCHIVE_OK) {
        fprintf(stderr, "sdtool make-demo-data: cannot finish the last tar shard\n");
        return SD_EXIT_FAILURE;
    }
    printf("wrote %lld samples (%s layout%s) to %s\n", count, format,
           with_bad ? ", the last 5 bad: truncated JPEG/PNG, empty file, not an image, WebP, no caption" : "", dir);
    return SD_EXIT_OK;
}
