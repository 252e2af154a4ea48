/* Image decode + transform: parity with Pillow/torchvision goldens, mode conversions, bad inputs, normalization. */
#include <errno.h>
#include <math.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdtrain/image.h"
#include "sdtrain/transform.h"
#include "tap.h"

static const char *srcdir(void)
{
    const char *s = getenv("srcdir");
    return s && *s ? s : ".";
}

static char *path_join(const char *a, const char *b, const char *c)
{
    size_t n = strlen(a) + strlen(b) + (c ? strlen(c) : 0) + 3;
    char *p = malloc(n);
    if (c)
        snprintf(p, n, "%s/%s/%s", a, b, c);
    else
        snprintf(p, n, "%s/%s", a, b);
    return p;
}

static uint8_t *read_all(const char *path, size_t *n)
{
    uint8_t *b = NULL;
    sd_err e;
    if (sd_image_read_file(path, &b, n, &e) != SD_IMG_OK) {
        tap_diag("%s", e.msg);
        return NULL;
    }
    return b;
}

/* ---- comparison ---------------------------------------------------------------------- */

typedef struct diffstat {
    size_t n, exact, within1;
    int maxdiff;
} diffstat;

static diffstat compare(const uint8_t *a, const uint8_t *b, size_t n)
{
    diffstat d = {n, 0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        int x = abs((int)a[i] - (int)b[i]);
        d.exact += x == 0;
        d.within1 += x <= 1;
        if (x > d.maxdiff)
            d.maxdiff = x;
    }
    return d;
}

static void add_stat(diffstat *t, diffstat d)
{
    t->n += d.n;
    t->exact += d.exact;
    t->within1 += d.within1;
    if (d.maxdiff > t->maxdiff)
        t->maxdiff = d.maxdiff;
}

static double pct(size_t a, size_t n)
{
    return n ? 100.0 * (double)a / (double)n : 100.0;
}

/* The parity requirement: >= 99.9% of values within 1/255, none further than 2/255. */
static int parity_ok(diffstat d)
{
    return d.maxdiff <= 2 && d.within1 * 1000 >= d.n * 999;
}

/* ---- golden set ---------------------------------------------------------------------- */

static void opts_from_flags(const char *flags, sd_image_opts *o, sd_pass_order *order)
{
    sd_image_opts_default(o);
    *order = SD_PASS_ORDER_PILLOW_9;
    if (strstr(flags, "exif"))
        o->exif_transpose = 1;
    if (strstr(flags, "alpha=white"))
        o->alpha = SD_ALPHA_WHITE;
    if (strstr(flags, "tall"))
        *order = SD_PASS_ORDER_PILLOW_12_2;
    if (strstr(flags, "pillow13"))
        *order = SD_PASS_ORDER_PILLOW_13;
}

static void golden_set(void)
{
    char *dir = path_join(srcdir(), "tests", "image");
    char *mpath = path_join(dir, "manifest.tsv", NULL);
    FILE *f = fopen(mpath, "r");
    char line[1024];
    diffstat dec_total = {0, 0, 0, 0}, tr_total = {0, 0, 0, 0}, rs_total = {0, 0, 0, 0};
    int n_dec = 0, n_tr = 0, n_rs = 0, dec_exact_imgs = 0, tr_exact_imgs = 0, rs_exact_imgs = 0;
    sd_image_decoder *dec = sd_image_decoder_new();
    sd_image img = SD_IMAGE_INIT, ref = SD_IMAGE_INIT, refdec = SD_IMAGE_INIT;
    sd_resize_ws ws = {0};
    if (!tap_ok(f != NULL, "golden manifest %s opens", mpath)) {
        free(mpath);
        free(dir);
        sd_image_decoder_free(dec);
        return;
    }
    while (fgets(line, sizeof line, f)) {
        char kind[32], input[256], flags[64], refname[256];
        int res = 0;
        sd_image_opts o;
        sd_pass_order vfirst;
        sd_err e;
        char *ipath, *rpath;
        uint8_t *buf;
        size_t n;
        sd_image_status st;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%31s %255s %63s %255s %d", kind, input, flags, refname, &res) < 4) {
            tap_ok(0, "manifest line parses: %s", line);
            continue;
        }
        opts_from_flags(flags, &o, &vfirst);
        ipath = path_join(dir, "input", input);
        rpath = path_join(dir, "ref", refname);
        buf = read_all(ipath, &n);
        st = buf ? sd_image_decoder_run(dec, buf, n, input, &o, &img, &e) : SD_IMG_IO;
        if (!tap_ok(st == SD_IMG_OK, "%s %s [%s] decodes", kind, input, flags)) {
            tap_diag("%s: %s", sd_image_status_name(st), st == SD_IMG_IO ? "" : e.msg);
            free(buf);
            free(ipath);
            free(rpath);
            continue;
        }
        if (sd_image_decode_file(rpath, NULL, &ref, &e) != SD_IMG_OK) {
            tap_ok(0, "reference %s decodes: %s", refname, e.msg);
        } else if (!strcmp(kind, "decode")) {
            diffstat d;
            if (!tap_ok(img.width == ref.width && img.height == ref.height,
                        "decode %s: size %dx%d matches Pillow's %dx%d", input, img.width, img.height,
                        ref.width, ref.height)) {
                free(buf);
                free(ipath);
                free(rpath);
                continue;
            }
            d = compare(img.data, ref.data, (size_t)img.width * img.height * 3);
            tap_ok(parity_ok(d), "decode %s (%s, mode %s): %.3f%% exact, %.3f%% within 1, max diff %d", input,
                   sd_image_format_name(img.format), img.mode, pct(d.exact, d.n), pct(d.within1, d.n), d.maxdiff);
            add_stat(&dec_total, d);
            n_dec++;
            dec_exact_imgs += d.exact == d.n;
        } else {
            sd_transform_opts to = {res, vfirst};
            uint8_t *out = malloc((size_t)res * res * 3);
            diffstat d;
            int rc = sd_transform_rgb8(img.data, img.width, img.height, &to, out, &ws, &e);
            if (!tap_ok(rc == 0 && ref.width == res && ref.height == res, "transform %s r%d [%s] runs", input,
                        res, flags)) {
                tap_diag("%s", rc ? e.msg : "reference has another size");
            } else {
                d = compare(out, ref.data, (size_t)res * res * 3);
                tap_ok(parity_ok(d), "transform %s r%d [%s] from %dx%d: %.3f%% exact, %.3f%% within 1, max diff %d",
                       input, res, flags, img.width, img.height, pct(d.exact, d.n), pct(d.within1, d.n), d.maxdiff);
                add_stat(&tr_total, d);
                n_tr++;
                tr_exact_imgs += d.exact == d.n;
                /* resize alone: start from Pillow's own decode, so decode differences cannot
                 * hide or excuse resize differences. Integer math: this must be bit-exact. */
                if (!strcmp(flags, "-") || !strcmp(flags, "tall") || !strcmp(flags, "pillow13")) {
                    char stem[256], dname[300];
                    char *dpath;
                    snprintf(stem, sizeof stem, "%s", input);
                    if (strrchr(stem, '.'))
                        *strrchr(stem, '.') = 0;
                    snprintf(dname, sizeof dname, "%s_decode.png", stem);
                    dpath = path_join(dir, "ref", dname);
                    if (access(dpath, R_OK) == 0 && sd_image_decode_file(dpath, NULL, &refdec, &e) == SD_IMG_OK &&
                        sd_transform_rgb8(refdec.data, refdec.width, refdec.height, &to, out, &ws, &e) == 0) {
                        d = compare(out, ref.data, (size_t)res * res * 3);
                        tap_ok(d.exact == d.n, "resize+crop alone %s r%d: %.3f%% exact, max diff %d", input, res,
                               pct(d.exact, d.n), d.maxdiff);
                        add_stat(&rs_total, d);
                        n_rs++;
                        rs_exact_imgs += d.exact == d.n;
                    }
                    free(dpath);
                }
            }
            free(out);
        }
        free(buf);
        free(ipath);
        free(rpath);
    }
    fclose(f);
    tap_ok(n_dec > 20 && n_tr > 40, "golden set has %d decode and %d transform cases", n_dec, n_tr);
    tap_diag("SUMMARY decode (vs Pillow Image.open().convert('RGB')): %d images, %d bit-exact; values %.4f%% exact, "
             "%.4f%% within 1, max diff %d",
             n_dec, dec_exact_imgs, pct(dec_total.exact, dec_total.n), pct(dec_total.within1, dec_total.n),
             dec_total.maxdiff);
    tap_diag("SUMMARY resize+crop alone (from Pillow's decode): %d cases, %d bit-exact; values %.4f%% exact, max diff %d",
             n_rs, rs_exact_imgs, pct(rs_total.exact, rs_total.n), rs_total.maxdiff);
    tap_diag("SUMMARY full path decode+resize+crop: %d cases, %d bit-exact; values %.4f%% exact, %.4f%% within 1, "
             "max diff %d",
             n_tr, tr_exact_imgs, pct(tr_total.exact, tr_total.n), pct(tr_total.within1, tr_total.n),
             tr_total.maxdiff);
    sd_image_free(&img);
    sd_image_free(&ref);
    sd_image_free(&refdec);
    sd_resize_ws_free(&ws);
    sd_image_decoder_free(dec);
    free(mpath);
    free(dir);
}

/* ---- an in-memory PNG writer for crafted modes ---------------------------------------- */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static void mem_write(png_structp png, png_bytep data, size_t len)
{
    membuf *m = png_get_io_ptr(png);
    if (m->n + len > m->cap) {
        m->cap = (m->n + len) * 2;
        m->p = realloc(m->p, m->cap);
    }
    memcpy(m->p + m->n, data, len);
    m->n += len;
}
static void mem_flush(png_structp png)
{
    (void)png;
}

typedef struct png_spec {
    int w, h, bit_depth, color_type;
    const uint8_t *rows; /* packed rows as PNG stores them (big-endian 16-bit) */
    const png_color *palette;
    int n_palette;
    const uint8_t *trns_alpha; /* palette alpha */
    int n_trns;
    const png_color_16 *trns_color;
    int interlace;
} png_spec;

/* Returns a malloc'd PNG file in *out (size *n). */
static int make_png(const png_spec *s, uint8_t **out, size_t *n)
{
    membuf m = {NULL, 0, 0};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    int channels = s->color_type == 0 ? 1 : s->color_type == 2 ? 3 : s->color_type == 3 ? 1
                 : s->color_type == 4 ? 2 : 4;
    size_t rowbytes = ((size_t)s->w * channels * s->bit_depth + 7) / 8;
    if (setjmp(png_jmpbuf(png))) {
        png_destroy_write_struct(&png, &info);
        free(m.p);
        return -1;
    }
    png_set_write_fn(png, &m, mem_write, mem_flush);
    png_set_IHDR(png, info, s->w, s->h, s->bit_depth, s->color_type,
                 s->interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    if (s->palette)
        png_set_PLTE(png, info, s->palette, s->n_palette);
    if (s->trns_alpha || s->trns_color)
        png_set_tRNS(png, info, s->trns_alpha, s->n_trns, s->trns_color);
    png_write_info(png, info);
    {
        int passes = png_set_interlace_handling(png);
        for (int p = 0; p < passes; p++)
            for (int y = 0; y < s->h; y++)
                png_write_row(png, s->rows + rowbytes * y);
    }
    png_write_end(png, info);
    png_destroy_write_struct(&png, &info);
    *out = m.p;
    *n = m.n;
    return 0;
}

static sd_image_status decode_mem(const uint8_t *b, size_t n, const char *name, const sd_image_opts *o,
                                  sd_image *img, sd_err *e)
{
    return sd_image_decode(b, n, name, o, img, e);
}

static void conversions(void)
{
    sd_image_opts drop, white;
    sd_image img = SD_IMAGE_INIT;
    sd_err e;
    uint8_t *png = NULL, *rows;
    size_t n;
    int bad;
    sd_image_opts_default(&drop);
    sd_image_opts_default(&white);
    white.alpha = SD_ALPHA_WHITE;

    /* RGBA 8-bit: every (colour, alpha) pair */
    rows = malloc(256 * 256 * 4);
    for (int a = 0; a < 256; a++)
        for (int c = 0; c < 256; c++) {
            uint8_t *p = rows + ((size_t)a * 256 + c) * 4;
            p[0] = (uint8_t)c;
            p[1] = (uint8_t)(255 - c);
            p[2] = (uint8_t)(c / 2);
            p[3] = (uint8_t)a;
        }
    {
        png_spec s = {256, 256, 8, PNG_COLOR_TYPE_RGBA, rows, NULL, 0, NULL, 0, NULL, 0};
        make_png(&s, &png, &n);
    }
    bad = decode_mem(png, n, "rgba.png", &drop, &img, &e) != SD_IMG_OK;
    for (int i = 0; !bad && i < 256 * 256; i++)
        bad = memcmp(img.data + 3 * i, rows + 4 * i, 3) != 0;
    tap_ok(!bad && !strcmp(img.mode, "RGBA"), "RGBA, alpha dropped: RGB kept as stored (Pillow convert('RGB'))");
    bad = decode_mem(png, n, "rgba.png", &white, &img, &e) != SD_IMG_OK;
    for (int i = 0; !bad && i < 256 * 256; i++)
        for (int k = 0; k < 3; k++) {
            unsigned c = rows[4 * i + k], a = rows[4 * i + 3];
            unsigned num = c * a + 255u * (255u - a);
            unsigned want = (2 * num + 255) / 510; /* round(num / 255), no ties for integers */
            if (img.data[3 * i + k] != want) {
                tap_diag("c=%u a=%u got %u want %u", c, a, img.data[3 * i + k], want);
                bad = 1;
                break;
            }
        }
    tap_ok(!bad, "RGBA on white: round((c*a + 255*(255-a))/255) exactly, all 65536 (c, a) pairs");
    free(png);
    free(rows);

    /* 16-bit gray: Pillow clips to 255 (mode I / I;16 -> RGB), it does not scale */
    rows = malloc(256 * 256 * 2);
    for (int v = 0; v < 65536; v++) {
        rows[2 * v] = (uint8_t)(v >> 8);
        rows[2 * v + 1] = (uint8_t)v;
    }
    {
        png_spec s = {256, 256, 16, PNG_COLOR_TYPE_GRAY, rows, NULL, 0, NULL, 0, NULL, 0};
        make_png(&s, &png, &n);
    }
    bad = decode_mem(png, n, "g16.png", &drop, &img, &e) != SD_IMG_OK;
    for (int v = 0; !bad && v < 65536; v++)
        bad = img.data[3 * v] != (v > 255 ? 255 : v) || img.data[3 * v + 1] != img.data[3 * v] ||
              img.data[3 * v + 2] != img.data[3 * v];
    tap_ok(!bad && !strcmp(img.mode, "I;16"), "16-bit gray: min(v, 255) in all three channels, all 65536 values");
    free(png);

    /* 16-bit RGB: the high byte (Pillow's RGB;16B unpacker), not a rounded v/257 */
    {
        png_spec s = {256, 256 / 3 + 1, 16, PNG_COLOR_TYPE_RGB, rows, NULL, 0, NULL, 0, NULL, 0};
        /* reuse the 16-bit ramp bytes as RGB samples: 256 * 86 * 6 bytes fit in 131072? no: use a fresh buffer */
        uint8_t *r16 = malloc((size_t)256 * 86 * 6);
        for (size_t i = 0; i < (size_t)256 * 86 * 3; i++) {
            unsigned v = (unsigned)(i * 2654435761u) & 0xffff;
            r16[2 * i] = (uint8_t)(v >> 8);
            r16[2 * i + 1] = (uint8_t)v;
        }
        s.h = 86;
        s.rows = r16;
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "rgb16.png", &drop, &img, &e) != SD_IMG_OK;
        for (size_t i = 0; !bad && i < (size_t)256 * 86 * 3; i++)
            bad = img.data[i] != r16[2 * i];
        tap_ok(!bad, "16-bit RGB: the high byte of each sample");
        free(png);
        free(r16);
    }
    free(rows);

    /* 1, 2, 4-bit gray: 0/255, v*0x55, v*0x11 */
    for (int bd = 1; bd <= 4; bd *= 2) {
        int levels = 1 << bd, w = 16;
        uint8_t packed[16];
        png_spec s = {w, 1, bd, PNG_COLOR_TYPE_GRAY, packed, NULL, 0, NULL, 0, NULL, 0};
        memset(packed, 0, sizeof packed);
        for (int x = 0; x < w; x++) {
            int v = x % levels;
            int bitpos = x * bd;
            packed[bitpos / 8] |= (uint8_t)(v << (8 - bd - bitpos % 8));
        }
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "lowbit.png", &drop, &img, &e) != SD_IMG_OK;
        for (int x = 0; !bad && x < w; x++)
            bad = img.data[3 * x] != (x % levels) * 255 / (levels - 1);
        tap_ok(!bad, "%d-bit gray scales to 0..255 by bit replication", bd);
        free(png);
    }

    /* palette with tRNS: dropped by default, composited with white; index past the palette */
    {
        png_color pal[4] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {10, 20, 30}};
        uint8_t trns[4] = {0, 128, 255, 255};
        uint8_t idx[6] = {0, 1, 2, 3, 4, 5};
        png_spec s = {6, 1, 8, PNG_COLOR_TYPE_PALETTE, idx, pal, 4, trns, 4, NULL, 0};
        const uint8_t want_drop[18] = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30, 0, 0, 0, 0, 0, 0};
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "pal.png", &drop, &img, &e) != SD_IMG_OK || memcmp(img.data, want_drop, 18);
        tap_ok(!bad && !strcmp(img.mode, "P"), "palette: lookup, tRNS dropped, indices past the palette are black");
        bad = decode_mem(png, n, "pal.png", &white, &img, &e) != SD_IMG_OK;
        /* green at alpha 128: red and blue are 255 * 127 / 255 = 127 exactly */
        tap_ok(!bad && img.data[0] == 255 && img.data[1] == 255 && img.data[2] == 255 && img.data[3] == 127 &&
                   img.data[4] == 255 && img.data[5] == 127 && img.data[8] == 255,
               "palette on white: alpha 0 -> white, alpha 128 -> half way (got %d %d %d)", img.data[3], img.data[4],
               img.data[5]);
        free(png);
    }

    /* gray and RGB colour keys (tRNS) */
    {
        uint8_t g[3] = {7, 50, 7};
        png_color_16 key = {0, 0, 0, 0, 7};
        png_spec s = {3, 1, 8, PNG_COLOR_TYPE_GRAY, g, NULL, 0, NULL, 0, &key, 0};
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "gkey.png", &drop, &img, &e) != SD_IMG_OK || img.data[0] != 7 || img.data[3] != 50;
        tap_ok(!bad, "gray colour key dropped by default");
        bad = decode_mem(png, n, "gkey.png", &white, &img, &e) != SD_IMG_OK || img.data[0] != 255 ||
              img.data[3] != 50 || img.data[6] != 255;
        tap_ok(!bad, "gray colour key is transparent on white");
        free(png);
    }

    /* gray + alpha 8-bit */
    {
        uint8_t ga[4] = {100, 0, 100, 255};
        png_spec s = {2, 1, 8, PNG_COLOR_TYPE_GRAY_ALPHA, ga, NULL, 0, NULL, 0, NULL, 0};
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "la.png", &drop, &img, &e) != SD_IMG_OK || img.data[0] != 100 || img.data[3] != 100;
        tap_ok(!bad && !strcmp(img.mode, "LA"), "LA: gray replicated, alpha dropped");
        bad = decode_mem(png, n, "la.png", &white, &img, &e) != SD_IMG_OK || img.data[0] != 255 || img.data[3] != 100;
        tap_ok(!bad, "LA on white");
        free(png);
    }

    /* interlaced equals non-interlaced */
    {
        uint8_t px[37 * 23 * 3];
        sd_image b = SD_IMAGE_INIT;
        for (size_t i = 0; i < sizeof px; i++)
            px[i] = (uint8_t)(i * 31 + (i >> 5));
        png_spec s = {37, 23, 8, PNG_COLOR_TYPE_RGB, px, NULL, 0, NULL, 0, NULL, 0};
        make_png(&s, &png, &n);
        decode_mem(png, n, "a.png", &drop, &img, &e);
        free(png);
        s.interlace = 1;
        make_png(&s, &png, &n);
        bad = decode_mem(png, n, "b.png", &drop, &b, &e) != SD_IMG_OK || memcmp(b.data, px, sizeof px) ||
              memcmp(img.data, px, sizeof px);
        tap_ok(!bad, "Adam7-interlaced PNG decodes to the same pixels");
        free(png);
        sd_image_free(&b);
    }
    sd_image_free(&img);
}

/* ---- bad inputs ---------------------------------------------------------------------- */

static void expect(const uint8_t *b, size_t n, const sd_image_opts *o, sd_image_status want, const char *what)
{
    sd_image img = SD_IMAGE_INIT;
    sd_err e;
    sd_image_status st;
    memset(&e, 0, sizeof e);
    st = sd_image_decode(b, n, "bad.img", o, &img, &e);
    tap_ok(st == want && (want == SD_IMG_OK || (strstr(e.msg, "bad.img") && img.width == 0)),
           "%s -> %s (got %s: %s)", what, sd_image_status_name(want), sd_image_status_name(st),
           st == SD_IMG_OK ? "decoded" : e.msg);
    sd_image_free(&img);
}

/* CRC-32 of PNG chunks (type + data), bitwise: tests only */
static uint32_t crc32_png(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static size_t find_marker(const uint8_t *b, size_t n, uint8_t m)
{
    for (size_t i = 2; i + 1 < n; i++)
        if (b[i] == 0xFF && b[i + 1] == m)
            return i;
    return 0;
}

static void bad_inputs(const char *tmpdir)
{
    char *dir = path_join(srcdir(), "tests", "image");
    char *jp = path_join(dir, "input", "rgb_160x120_q90_420.jpg");
    char *pp = path_join(dir, "input", "rgb_110x90.png");
    size_t jn = 0, pn = 0;
    uint8_t *jpg = read_all(jp, &jn), *pngb = read_all(pp, &pn), *b;
    sd_image_opts o;
    sd_image_opts_default(&o);
    if (!tap_ok(jpg && pngb, "bad-input seeds load")) {
        free(jpg);
        free(pngb);
        free(jp);
        free(pp);
        free(dir);
        return;
    }
    b = malloc(jn > pn ? jn + 64 : pn + 64);

    /* truncation at several cut points */
    {
        size_t sos = find_marker(jpg, jn, 0xDA);
        size_t cuts[] = {2, 3, 20, sos + 4, sos + 40, jn / 2, jn * 9 / 10, jn - 3};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "JPEG truncated to %zu of %zu bytes", cuts[i], jn);
            expect(jpg, cuts[i], &o, SD_IMG_TRUNCATED, what);
        }
        /* lenient mode still refuses truncation, as Pillow does */
        o.strict_jpeg = 0;
        expect(jpg, jn / 2, &o, SD_IMG_TRUNCATED, "JPEG truncated (non-strict)");
        o.strict_jpeg = 1;
    }
    {
        size_t cuts[] = {4, 8, 20, 33, 60, pn / 2, pn - 13};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            char what[96];
            snprintf(what, sizeof what, "PNG truncated to %zu of %zu bytes", cuts[i], pn);
            expect(pngb, cuts[i], &o, SD_IMG_TRUNCATED, what);
        }
        /* only IEND missing: the pixels are complete, Pillow reads it, so do we */
        expect(pngb, pn - 12, &o, SD_IMG_OK, "PNG without IEND");
    }
    {
        /* A text chunk before the image data that declares 1.9 GB in a 5 KB file: truncated,
         * found without allocating the declared length (libpng allocates and zeroes it before
         * reading; found by fuzzing). Decoded in a child, whose peak memory is its own. */
        const size_t at = 33, n = pn + 12;
        uint8_t *big = malloc(n);
        pid_t pid;
        int status = -1;
        memcpy(big, pngb, at);
        put_be32(big + at, 0x74530000u);
        memcpy(big + at + 4, "iTXtXML:com.adobe.xmp", 21);
        memcpy(big + at + 25, pngb + at, pn - at - 13);
        fflush(NULL);
        if ((pid = fork()) == 0) {
            sd_image img = SD_IMAGE_INIT;
            sd_err e;
            struct rusage ru;
            sd_image_status st = sd_image_decode(big, n, "big.png", &o, &img, &e);
            getrusage(RUSAGE_SELF, &ru);
            _exit(st != SD_IMG_TRUNCATED ? 2 : ru.ru_maxrss > 512L * 1024 ? 3 : 0);
        }
        if (pid > 0)
            waitpid(pid, &status, 0);
        tap_ok(pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "PNG with a chunk declaring 1.9 GB before the image data -> truncated, peak memory "
               "under 512 MB (child status %d: 2 another status, 3 the memory)",
               WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        free(big);
    }

    /* corrupted bytes */
    {
        size_t sos = find_marker(jpg, jn, 0xDA), mid = sos + (jn - sos) / 2;
        memcpy(b, jpg, jn);
        for (size_t i = 0; i < 48; i++)
            b[mid + i] = (uint8_t)(0x5A ^ (i * 37));
        expect(b, jn, &o, SD_IMG_CORRUPT, "JPEG with 48 garbage bytes in the scan (strict)");
        o.strict_jpeg = 0;
        expect(b, jn, &o, SD_IMG_OK, "the same JPEG, non-strict (Pillow ignores libjpeg warnings)");
        o.strict_jpeg = 1;
        memcpy(b, jpg, jn);
        b[mid] = 0xFF;
        b[mid + 1] = 0xD9; /* EOI in the middle of the scan */
        expect(b, jn, &o, SD_IMG_CORRUPT, "JPEG with an EOI marker in the middle of the scan");
        memcpy(b, jpg, jn);
        {
            size_t dqt = find_marker(jpg, jn, 0xDB);
            b[dqt + 2] = 0;
            b[dqt + 3] = 1; /* length 1 */
        }
        expect(b, jn, &o, SD_IMG_CORRUPT, "JPEG with a DQT length of 1");
        memcpy(b, jpg, jn);
        {
            size_t dht = find_marker(jpg, jn, 0xC4);
            memset(b + dht + 4, 0xFF, 16); /* absurd Huffman code counts */
        }
        expect(b, jn, &o, SD_IMG_CORRUPT, "JPEG with a broken Huffman table");
        memcpy(b, pngb, pn);
        b[pn / 2] ^= 0x55; /* in IDAT: zlib data or its CRC no longer checks */
        expect(b, pn, &o, SD_IMG_CORRUPT, "PNG with a flipped byte in IDAT");
        memcpy(b, pngb, pn);
        b[29] ^= 1; /* IHDR CRC */
        expect(b, pn, &o, SD_IMG_CORRUPT, "PNG with a bad IHDR CRC");
        memcpy(b, pngb, pn);
        b[24] = 3; /* bit depth 3, with a valid CRC */
        put_be32(b + 29, crc32_png(b + 12, 17));
        expect(b, pn, &o, SD_IMG_CORRUPT, "PNG with bit depth 3");
    }

    /* not images, unsupported formats */
    expect((const uint8_t *)"", 0, &o, SD_IMG_EMPTY, "zero bytes");
    {
        const char *txt = "<html><body>404 Not Found</body></html>\n";
        expect((const uint8_t *)txt, strlen(txt), &o, SD_IMG_NOT_IMAGE, "an HTML error page");
        expect((const uint8_t *)"\x01", 1, &o, SD_IMG_NOT_IMAGE, "one byte");
    }
    {
        uint8_t webp[32] = "RIFF\x24\x00\x00\x00WEBPVP8 ";
        uint8_t gif[16] = "GIF89a\x01\x00\x01\x00";
        uint8_t tiff[16] = "II*\x00\x08\x00\x00\x00";
        uint8_t heic[24] = "\x00\x00\x00\x18" "ftypheic";
        uint8_t bmp[32] = "BM\x00\x00\x00\x00\x00\x00\x00\x00\x36\x00\x00\x00\x28\x00\x00\x00";
        expect(webp, sizeof webp, &o, SD_IMG_UNSUPPORTED, "WebP");
        expect(gif, sizeof gif, &o, SD_IMG_UNSUPPORTED, "GIF");
        expect(tiff, sizeof tiff, &o, SD_IMG_UNSUPPORTED, "TIFF");
        expect(heic, sizeof heic, &o, SD_IMG_UNSUPPORTED, "HEIC");
        expect(bmp, sizeof bmp, &o, SD_IMG_UNSUPPORTED, "BMP");
        tap_ok(sd_image_sniff(webp, sizeof webp) == SD_IMG_FMT_WEBP, "WebP recognised from its magic bytes");
    }

    /* crafted headers: huge, zero, 12-bit, lossless */
    {
        size_t sof = find_marker(jpg, jn, 0xC0);
        memcpy(b, jpg, jn);
        b[sof + 5] = 0xFD;
        b[sof + 6] = 0xE8;
        b[sof + 7] = 0xFD;
        b[sof + 8] = 0xE8; /* 65000 x 65000 */
        expect(b, jn, &o, SD_IMG_TOO_LARGE, "JPEG declaring 65000x65000");
        memcpy(b, jpg, jn);
        b[sof + 5] = 0;
        b[sof + 6] = 0;
        b[sof + 7] = 0;
        b[sof + 8] = 0;
        expect(b, jn, &o, SD_IMG_ZERO_SIZE, "JPEG declaring 0x0");
        memcpy(b, jpg, jn);
        b[sof + 4] = 12;
        expect(b, jn, &o, SD_IMG_UNSUPPORTED, "12-bit JPEG");
        memcpy(b, jpg, jn);
        b[sof + 1] = 0xC3;
        expect(b, jn, &o, SD_IMG_UNSUPPORTED, "lossless JPEG (SOF3)");
        memcpy(b, pngb, pn);
        b[16] = 0;
        b[17] = 1;
        b[18] = 0x86;
        b[19] = 0xA0; /* width 100000 */
        b[20] = 0;
        b[21] = 1;
        b[22] = 0x86;
        b[23] = 0xA0;
        expect(b, pn, &o, SD_IMG_TOO_LARGE, "PNG declaring 100000x100000");
        memcpy(b, pngb, pn);
        memset(b + 16, 0, 8);
        expect(b, pn, &o, SD_IMG_ZERO_SIZE, "PNG declaring 0x0");
        {
            sd_image_opts small;
            sd_image_opts_default(&small);
            small.max_pixels = 160 * 120 - 1;
            expect(jpg, jn, &small, SD_IMG_TOO_LARGE, "160x120 JPEG with max_pixels 19199");
            small.max_pixels = 0;
            small.min_side = 121;
            expect(jpg, jn, &small, SD_IMG_TOO_SMALL, "160x120 JPEG with min_side 121");
            small.min_side = 120;
            expect(jpg, jn, &small, SD_IMG_OK, "160x120 JPEG with min_side 120");
        }
    }

    /* 1x1 images decode, and the min-size policy is the caller's */
    {
        char *p1 = path_join(dir, "input", "rgb_1x1_q90.jpg");
        char *p2 = path_join(dir, "input", "rgb_1x1.png");
        size_t n1, n2;
        uint8_t *b1 = read_all(p1, &n1), *b2 = read_all(p2, &n2);
        sd_image_opts m;
        sd_image_opts_default(&m);
        expect(b1, n1, &o, SD_IMG_OK, "1x1 JPEG");
        expect(b2, n2, &o, SD_IMG_OK, "1x1 PNG");
        m.min_side = 2;
        expect(b1, n1, &m, SD_IMG_TOO_SMALL, "1x1 JPEG with min_side 2");
        expect(b2, n2, &m, SD_IMG_TOO_SMALL, "1x1 PNG with min_side 2");
        free(b1);
        free(b2);
        free(p1);
        free(p2);
    }

    /* files: missing, directory, zero-byte on disk */
    {
        sd_image img = SD_IMAGE_INIT;
        sd_err e;
        char *missing = path_join(tmpdir, "missing.jpg", NULL);
        char *zero = path_join(tmpdir, "zero.jpg", NULL);
        FILE *f = fopen(zero, "wb");
        if (f)
            fclose(f);
        tap_ok(sd_image_decode_file(missing, NULL, &img, &e) == SD_IMG_IO && strstr(e.msg, "missing.jpg"),
               "missing file -> io (%s)", e.msg);
        tap_ok(sd_image_decode_file(tmpdir, NULL, &img, &e) == SD_IMG_IO, "a directory -> io (%s)", e.msg);
        errno = 0; /* no stale errno in the message ("Success") */
        tap_ok(sd_image_decode_file("/dev/null", NULL, &img, &e) == SD_IMG_IO &&
                   !strcmp(e.msg, "/dev/null: not a regular file"),
               "a character device -> io, not a regular file (%s)", e.msg);
        tap_ok(sd_image_decode_file(zero, NULL, &img, &e) == SD_IMG_EMPTY, "zero-byte file -> empty (%s)", e.msg);
        unlink(zero);
        free(missing);
        free(zero);
        sd_image_free(&img);
    }

    /* every status has a distinct name */
    {
        int distinct = 1;
        for (int i = 0; i < SD_IMG_STATUS_COUNT; i++)
            for (int j = 0; j < i; j++)
                distinct &= strcmp(sd_image_status_name((sd_image_status)i), sd_image_status_name((sd_image_status)j)) != 0;
        tap_ok(distinct && !strcmp(sd_image_status_name(SD_IMG_TRUNCATED), "truncated"), "status names are distinct");
    }
    free(b);
    free(jpg);
    free(pngb);
    free(jp);
    free(pp);
    free(dir);
}

/* ---- geometry and normalization ------------------------------------------------------ */

static void geometry(void)
{
    int w, h, l, t;
    sd_resize_short_side_size(3, 7, 64, &w, &h);
    tap_ok(w == 64 && h == 149, "3x7 at 64 -> 64x149 (int(64*7/3) truncates 149.33)");
    sd_resize_short_side_size(250, 61, 64, &w, &h);
    tap_ok(w == 262 && h == 64, "250x61 at 64 -> 262x64 (got %dx%d)", w, h);
    sd_resize_short_side_size(100, 100, 64, &w, &h);
    tap_ok(w == 64 && h == 64, "square stays square");
    {
        static const int d[][2] = {{0, 0}, {1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 2}, {6, 3}, {7, 4}, {9, 4}, {11, 6}};
        int ok = 1;
        for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
            sd_center_crop_offsets(64, 64 + d[i][0], 64, 64, &l, &t);
            ok &= t == d[i][1] && l == 0;
        }
        tap_ok(ok, "center crop offsets use Python's round-half-even: extra 1->0, 3->2, 5->2, 7->4, 11->6");
    }
    {
        uint8_t src[5 * 4 * 3], dst[5 * 4 * 3];
        sd_transform_opts o = {4, 0};
        sd_err e;
        for (size_t i = 0; i < sizeof src; i++)
            src[i] = (uint8_t)(i * 7);
        /* 5x4 at 4: no resize (short side is already 4), crop 4 columns starting at round(0.5) = 0 */
        tap_ok(sd_transform_rgb8(src, 5, 4, &o, dst, NULL, &e) == 0 && memcmp(dst, src, 12) == 0 &&
                   memcmp(dst + 12, src + 15, 12) == 0,
               "no-resize case is a pure crop");
        o.resolution = 0;
        tap_ok(sd_transform_rgb8(src, 5, 4, &o, dst, NULL, &e) == -1, "resolution 0 is an error (%s)", e.msg);
    }
}

/* Sizes the transform refuses (a side, or the resized long side, over 2^24) are refused from the
 * header when the decoder knows the resolution (resize_to): too_large, the file named, nothing
 * decoded. The crafted PNGs are a few KB whatever they declare. */
static void transform_limits(void)
{
    const int tall = 600000; /* 1 x 600000: resized to 32 it would be 32 x 19,200,000 */
    uint8_t *rows = calloc(tall, 1), *png = NULL, *b;
    size_t n;
    sd_image_opts o;
    sd_image_info info;
    sd_image img = SD_IMAGE_INIT;
    sd_err e;
    sd_image_status st;
    tap_ok(sd_transform_size_ok(1, 1 << 24, 1) && !sd_transform_size_ok(1, (1 << 24) + 1, 1) &&
               !sd_transform_size_ok(1, 1 << 24, 2) && sd_transform_size_ok(1 << 12, 1 << 24, 1 << 12) &&
               !sd_transform_size_ok(1, 600000, 32) && sd_transform_size_ok(1, 524288, 32) &&
               sd_transform_size_ok(1, 1, 16384) && !sd_transform_size_ok(0, 5, 4) &&
               !sd_transform_size_ok(2000000000, 2000000000, 1) && !sd_transform_size_ok(1, 1 << 24, 65536),
           "sd_transform_size_ok: sides and the resized long side at most 2^24, no int overflow");
    {
        png_spec s = {1, tall, 8, PNG_COLOR_TYPE_GRAY, rows, NULL, 0, NULL, 0, NULL, 0};
        make_png(&s, &png, &n);
    }
    sd_image_opts_default(&o);
    o.resize_to = 32;
    memset(&e, 0, sizeof e);
    st = sd_image_decode(png, n, "tall.png", &o, &img, &e);
    tap_ok(st == SD_IMG_TOO_LARGE && strncmp(e.msg, "tall.png: ", 10) == 0 && strstr(e.msg, "1x600000") &&
               img.width == 0 && img.data == NULL,
           "a 1x600000 PNG for resolution 32 -> too_large from the header, nothing allocated (%s)", e.msg);
    tap_ok(sd_image_probe(png, n, "tall.png", &o, &info, &e) == SD_IMG_TOO_LARGE, "the probe says the same");
    o.resize_to = 0;
    st = sd_image_decode(png, n, "tall.png", &o, &img, &e);
    tap_ok(st == SD_IMG_OK && img.width == 1 && img.height == tall, "without resize_to it decodes");
    if (st == SD_IMG_OK) {
        uint8_t dst[32 * 32 * 3];
        sd_transform_opts to = {32, 0};
        tap_ok(sd_transform_rgb8(img.data, img.width, img.height, &to, dst, NULL, &e) == -1 &&
                   strstr(e.msg, "too large"),
               "and the transform refuses it (%s)", e.msg);
    }
    /* the same file declaring 1 x 178,956,970 (just under max_pixels; a side over 2^24): refused
     * before libpng allocates its 1.4 GB of row pointers and 0.7 GB of pixels */
    b = malloc(n);
    memcpy(b, png, n);
    put_be32(b + 20, 178956970u);
    put_be32(b + 29, crc32_png(b + 12, 17));
    o.resize_to = 512;
    memset(&e, 0, sizeof e);
    st = sd_image_decode(b, n, "bomb.png", &o, &img, &e);
    tap_ok(st == SD_IMG_TOO_LARGE && strncmp(e.msg, "bomb.png: ", 10) == 0 && strstr(e.msg, "1x178956970"),
           "a PNG header declaring 1x178956970 -> too_large before decoding (%s)", e.msg);
    /* a normal image at the same setting decodes */
    {
        png_spec s = {4, 3, 8, PNG_COLOR_TYPE_GRAY, rows, NULL, 0, NULL, 0, NULL, 0};
        free(png);
        make_png(&s, &png, &n);
    }
    tap_ok(sd_image_decode(png, n, "small.png", &o, &img, &e) == SD_IMG_OK && img.width == 4,
           "a 4x3 PNG with resize_to 512 decodes (upscaled later)");
    free(b);
    free(png);
    free(rows);
    sd_image_free(&img);
}

/* A plain transcription of Pillow's two-pass 8-bit resample (whole image, horizontal then
 * vertical, or vertical then horizontal), as an oracle for the windowed, padded, SSE2 version. */
static void ref_coeffs(int in_size, int out_size, int **bounds, int32_t **kk, int *ksize)
{
    double scale = (double)((float)in_size - 0.0f) / out_size, fs = scale < 1.0 ? 1.0 : scale, support = fs;
    int ks = (int)ceil(support) * 2 + 1;
    *bounds = malloc(sizeof(int) * 2 * out_size);
    *kk = calloc((size_t)out_size * ks, sizeof(int32_t));
    *ksize = ks;
    for (int xx = 0; xx < out_size; xx++) {
        double center = 0.0f + (xx + 0.5) * scale, ww = 0.0, k[4096];
        int xmin = (int)(center - support + 0.5), xmax;
        if (xmin < 0)
            xmin = 0;
        xmax = (int)(center + support + 0.5);
        if (xmax > in_size)
            xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double t = fabs((x + xmin - center + 0.5) * (1.0 / fs));
            k[x] = t < 1.0 ? 1.0 - t : 0.0;
            ww += k[x];
        }
        for (int x = 0; x < xmax; x++) {
            double v = ww != 0.0 ? k[x] / ww : k[x];
            (*kk)[(size_t)xx * ks + x] = (int32_t)(v < 0 ? -0.5 + v * (1 << 22) : 0.5 + v * (1 << 22));
        }
        (*bounds)[2 * xx] = xmin;
        (*bounds)[2 * xx + 1] = xmax;
    }
}

static uint8_t ref_clip(int32_t v)
{
    v >>= 22;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static uint8_t *ref_resize(const uint8_t *src, int w, int h, int ow, int oh, int vfirst)
{
    int *bh, *bv, ksh, ksv;
    int32_t *kh, *kv;
    uint8_t *tmp, *out = malloc((size_t)ow * oh * 3);
    ref_coeffs(w, ow, &bh, &kh, &ksh);
    ref_coeffs(h, oh, &bv, &kv, &ksv);
    if (!vfirst) {
        tmp = malloc((size_t)ow * h * 3);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    int32_t ss = 1 << 21;
                    for (int t = 0; t < bh[2 * x + 1]; t++)
                        ss += src[((size_t)y * w + bh[2 * x] + t) * 3 + c] * kh[(size_t)x * ksh + t];
                    tmp[((size_t)y * ow + x) * 3 + c] = ow == w ? src[((size_t)y * w + x) * 3 + c] : ref_clip(ss);
                }
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    int32_t ss = 1 << 21;
                    for (int t = 0; t < bv[2 * y + 1]; t++)
                        ss += tmp[((size_t)(bv[2 * y] + t) * ow + x) * 3 + c] * kv[(size_t)y * ksv + t];
                    out[((size_t)y * ow + x) * 3 + c] = oh == h ? tmp[((size_t)y * ow + x) * 3 + c] : ref_clip(ss);
                }
    } else {
        tmp = malloc((size_t)w * oh * 3);
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < w; x++)
                for (int c = 0; c < 3; c++) {
                    int32_t ss = 1 << 21;
                    for (int t = 0; t < bv[2 * y + 1]; t++)
                        ss += src[((size_t)(bv[2 * y] + t) * w + x) * 3 + c] * kv[(size_t)y * ksv + t];
                    tmp[((size_t)y * w + x) * 3 + c] = ref_clip(ss);
                }
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++)
                for (int c = 0; c < 3; c++) {
                    int32_t ss = 1 << 21;
                    for (int t = 0; t < bh[2 * x + 1]; t++)
                        ss += tmp[((size_t)y * w + bh[2 * x] + t) * 3 + c] * kh[(size_t)x * ksh + t];
                    out[((size_t)y * ow + x) * 3 + c] = ow == w ? tmp[((size_t)y * w + x) * 3 + c] : ref_clip(ss);
                }
    }
    free(tmp);
    free(bh);
    free(bv);
    free(kh);
    free(kv);
    return out;
}

static void resize_oracle(void)
{
    /* fixed shapes that reach the edges of the fast paths, then random ones */
    static const int fixed[][5] = {
        {3, 3000, 3, 10, 0},   /* ~600 vertical taps: the scalar fallback */
        {3000, 4, 9, 4, 0},    /* ~670 horizontal taps */
        {517, 5, 17, 5, 0},    /* 61 taps, no vertical pass */
        {5, 517, 5, 17, 0},    /* 61 vertical taps, width 15 bytes (< 16: scalar tail only) */
        {40, 4100, 33, 1000, 1}, /* Pillow 12.2 order */
        {40, 4100, 33, 1000, 0},
        {90, 260, 64, 184, 2},   /* Pillow 13 order: vertical first */
        {18, 466, 8, 207, 2},
        {1, 1, 64, 64, 0},
        {16, 16, 512, 300, 0},
        {300, 2, 7, 1, 0},
    };
    uint32_t seed = 12345;
    int bad = 0, cases = 0;
    sd_resize_ws ws = {0};
    for (int it = 0; it < 11 + 90; it++) {
        int w, h, ow, oh, vf, x0, y0, ww, wh, ref_vf;
        uint8_t *src, *ref, *win;
        sd_err e;
#define RND() (seed = seed * 1664525u + 1013904223u, seed >> 8)
        if (it < 11) {
            w = fixed[it][0], h = fixed[it][1], ow = fixed[it][2], oh = fixed[it][3], vf = fixed[it][4];
        } else {
            w = 1 + (int)(RND() % 300), h = 1 + (int)(RND() % 300);
            ow = 1 + (int)(RND() % 200), oh = 1 + (int)(RND() % 200);
            vf = (int)(RND() % 3);
            if (vf == 1) /* w <= 30 keeps h, the most taps ref_coeffs takes, under 4096 */
                w = 1 + (int)(RND() % 30), h = 101 * w + (int)(RND() % 50),
                oh = 1 + (int)(RND() % (h - 1 > 400 ? 400 : h - 1));
        }
        src = malloc((size_t)w * h * 3);
        for (size_t i = 0; i < (size_t)w * h * 3; i++)
            src[i] = (uint8_t)(RND() & 0xff);
        /* the orders as Pillow 12.2's Image.resize and Pillow 13's Resample.c pick them */
        ref_vf = oh < h && (vf == 1 ? (long long)h > 100LL * w : vf == 2 ? h - oh > 2 * (w - ow) : 0);
        ref = ref_resize(src, w, h, ow, oh, ref_vf);
        ww = 1 + (int)(RND() % ow), wh = 1 + (int)(RND() % oh);
        if (it < 11)
            ww = ow, wh = oh;
        x0 = (int)(RND() % (ow - ww + 1)), y0 = (int)(RND() % (oh - wh + 1));
        win = malloc((size_t)ww * wh * 3);
        if (sd_resize_bilinear_rgb8(src, w, h, ow, oh, x0, y0, ww, wh, (sd_pass_order)vf, win, &ws, &e) != 0) {
            tap_diag("%dx%d -> %dx%d: %s", w, h, ow, oh, e.msg);
            bad++;
        } else {
            for (int y = 0; y < wh; y++)
                if (memcmp(win + (size_t)y * ww * 3, ref + ((size_t)(y0 + y) * ow + x0) * 3, (size_t)ww * 3)) {
                    tap_diag("%dx%d -> %dx%d window %dx%d at %d,%d (vertical first %d): row %d differs", w, h, ow,
                             oh, ww, wh, x0, y0, vf, y);
                    bad++;
                    break;
                }
        }
        cases++;
        free(src);
        free(ref);
        free(win);
#undef RND
    }
    sd_resize_ws_free(&ws);
    tap_ok(bad == 0, "windowed resize equals a plain transcription of Pillow's algorithm (%d shapes, %d differ)",
           cases, bad);
}

/* The pass order each Pillow picks, on shapes measured with PyPI's Pillow 13.0.0 (Image.resize
 * against the two single-direction resizes in a row). */
static void pass_orders(void)
{
    static const int shapes[][6] = {
        /* w, h, out_w, out_h, vertical first in Pillow 13, in Pillow 12.2 */
        {18, 466, 8, 207, 1, 0},   /* torchvision Resize(8) of 18x466: 259 > 2 * 10 */
        {90, 260, 64, 184, 1, 0},  /* Resize(64), 76 > 52 */
        {120, 160, 64, 85, 0, 0},  /* Resize(64), 75 > 112 fails: horizontal first */
        {100, 100, 50, 25, 0, 0},  /* the height shrinks more, but 75 > 100 fails */
        {100, 100, 120, 50, 1, 0}, /* width grows, height shrinks */
        {40, 40, 22, 2, 1, 0},     /* 38 > 36 */
        {40, 40, 22, 4, 0, 0},     /* 36 > 36 fails: strict */
        {40, 40, 80, 42, 0, 0},    /* the height grows: horizontal first */
        {66, 6700, 64, 6496, 1, 1},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int *c = shapes[i];
        int v13 = sd_resize_vertical_first(c[0], c[1], c[2], c[3], SD_PASS_ORDER_PILLOW_13);
        int v122 = sd_resize_vertical_first(c[0], c[1], c[2], c[3], SD_PASS_ORDER_PILLOW_12_2);
        int v9 = sd_resize_vertical_first(c[0], c[1], c[2], c[3], SD_PASS_ORDER_PILLOW_9);
        if (v13 != c[4] || v122 != c[5] || v9 != 0) {
            tap_diag("%dx%d -> %dx%d: vertical first %d/%d/%d (Pillow 13/12.2/9), expected %d/%d/0", c[0], c[1],
                     c[2], c[3], v13, v122, v9, c[4], c[5]);
            bad++;
        }
    }
    tap_ok(bad == 0, "pass order: Pillow <= 12.1 always horizontal first, 12.2 for h > 100 w, 13 for "
                     "h - h' > 2 (w - w') (%d shapes)", (int)(sizeof shapes / sizeof shapes[0]));
}

static void normalization(void)
{
    char *p = path_join(srcdir(), "tests", "image/normalize_torch.txt");
    FILE *f = fopen(p, "r");
    char line[128];
    int v = 0, bad = 0;
    float hwc[2 * 1 * 3], chw[2 * 1 * 3];
    const uint8_t px[6] = {0, 128, 255, 1, 2, 3};
    if (tap_ok(f != NULL, "torch normalization table opens")) {
        while (fgets(line, sizeof line, f)) {
            uint32_t want, got;
            float x;
            if (line[0] == '#')
                continue;
            want = (uint32_t)strtoul(line, NULL, 16);
            x = sd_normalize_value((uint8_t)v);
            memcpy(&got, &x, 4);
            if (got != want) {
                tap_diag("v=%d got %08x want %08x", v, got, want);
                bad++;
            }
            v++;
        }
        fclose(f);
        tap_ok(v == 256 && bad == 0, "normalization is bit-identical to torch ToTensor+Normalize(0.5, 0.5) for all 256 values");
    }
    free(p);
    {
        int same127 = 1;
        for (int i = 0; i < 256; i++)
            same127 &= sd_normalize_value((uint8_t)i) == (float)i / 127.5f - 1.0f;
        tap_ok(same127, "x/127.5 - 1 gives the same floats (documented equivalence)");
    }
    tap_ok(sd_normalize_value(0) == -1.0f && sd_normalize_value(255) == 1.0f, "0 -> -1 and 255 -> 1 exactly");
    sd_normalize_rgb8(px, 2, 1, SD_LAYOUT_HWC, hwc);
    sd_normalize_rgb8(px, 2, 1, SD_LAYOUT_CHW, chw);
    tap_ok(hwc[1] == sd_normalize_value(128) && hwc[3] == sd_normalize_value(1) && chw[1] == sd_normalize_value(1) &&
               chw[2] == sd_normalize_value(128) && chw[5] == sd_normalize_value(3),
           "HWC and CHW layouts place the channels as documented");
}

/* the PNG writer round-trips */
static void writer(const char *tmpdir)
{
    uint8_t px[13 * 7 * 3];
    sd_image img = SD_IMAGE_INIT;
    sd_err e;
    char *p = path_join(tmpdir, "w.png", NULL);
    for (size_t i = 0; i < sizeof px; i++)
        px[i] = (uint8_t)(i * 13 + 5);
    tap_ok(sd_image_write_png(p, px, 13, 7, &e) == 0, "PNG writer writes");
    tap_ok(sd_image_decode_file(p, NULL, &img, &e) == SD_IMG_OK && img.width == 13 && img.height == 7 &&
               memcmp(img.data, px, sizeof px) == 0,
           "and the file reads back identically");
    tap_ok(sd_image_write_png("/nonexistent-dir/x.png", px, 13, 7, &e) == -1 && strstr(e.msg, "nonexistent"),
           "an unwritable path is an error naming it (%s)", e.msg);
    unlink(p);
    free(p);
    sd_image_free(&img);
}

int main(void)
{
    char tmpl[] = "/tmp/sdtrain-test-image-XXXXXX";
    const char *tmpdir = mkdtemp(tmpl);
    if (!tmpdir)
        tap_skip_all("cannot create a temporary directory");
    golden_set();
    conversions();
    bad_inputs(tmpdir);
    transform_limits();
    geometry();
    resize_oracle();
    pass_orders();
    normalization();
    writer(tmpdir);
    rmdir(tmpdir);
    return tap_done();
}
