/* Image decoding (JPEG via TurboJPEG, PNG via libpng) to RGB8, pixel for pixel as Pillow's convert('RGB'). */
#include "sdtrain/image.h"

#include <errno.h>
#include <limits.h>
#include <png.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

#include "sdtrain/transform.h"
#include "sdtrain/utf8.h"

/* ---- names ---------------------------------------------------------------------------- */

const char *sd_image_status_name(sd_image_status s)
{
    static const char *const names[SD_IMG_STATUS_COUNT] = {
        "ok",       "empty",     "not_image", "unsupported", "truncated", "corrupt",
        "zero_size", "too_large", "too_small", "io",          "nomem"};
    return (s >= 0 && s < SD_IMG_STATUS_COUNT) ? names[s] : "?";
}

const char *sd_image_format_name(sd_image_format f)
{
    static const char *const names[SD_IMG_FMT_COUNT] = {
        "unknown", "JPEG", "PNG", "WebP", "GIF", "BMP", "TIFF", "HEIF/AVIF", "JPEG 2000", "JPEG XL",
        "ICO", "PSD"};
    return (f >= 0 && f < SD_IMG_FMT_COUNT) ? names[f] : "?";
}

void sd_image_opts_default(sd_image_opts *o)
{
    memset(o, 0, sizeof *o);
    o->alpha = SD_ALPHA_DROP;
    o->max_pixels = SD_IMAGE_DEFAULT_MAX_PIXELS;
    o->min_side = 0;
    o->exif_transpose = 0;
    o->strict_jpeg = 1;
}

void sd_image_free(sd_image *img)
{
    if (!img)
        return;
    free(img->data);
    memset(img, 0, sizeof *img);
}

/* Sets the message "<name>: <text>" and returns the status, so `return fail(...)` reads well. */
static sd_image_status fail(sd_err *err, sd_image_status st, const char *name, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static sd_image_status fail(sd_err *err, sd_image_status st, const char *name, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        int n = snprintf(err->msg, sizeof err->msg, "%s: ", name ? name : "<image>");
        if (n < 0 || (size_t)n >= sizeof err->msg)
            n = 0;
        va_start(ap, fmt);
        vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
        va_end(ap);
        err->line = err->col = 0;
    }
    return st;
}

/* ---- magic bytes ---------------------------------------------------------------------- */

static int has_prefix(const uint8_t *b, size_t n, const void *magic, size_t m)
{
    return n >= m && memcmp(b, magic, m) == 0;
}

sd_image_format sd_image_sniff(const void *buf, size_t size)
{
    const uint8_t *b = buf;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const uint8_t jp2_sig[12] = {0, 0, 0, 12, 'j', 'P', ' ', ' ', '\r', '\n', 0x87, '\n'};
    static const uint8_t jxl_sig[12] = {0, 0, 0, 12, 'J', 'X', 'L', ' ', '\r', '\n', 0x87, '\n'};
    if (!b || size < 2)
        return SD_IMG_FMT_UNKNOWN;
    if (b[0] == 0xFF && b[1] == 0xD8)
        return SD_IMG_FMT_JPEG; /* SOI; a 2-byte file is a truncated JPEG */
    /* a prefix of the PNG signature of 4+ bytes is a truncated PNG */
    if (memcmp(b, png_sig, size < 8 ? size : 8) == 0 && size >= 4)
        return SD_IMG_FMT_PNG;
    if (size >= 12 && has_prefix(b, size, "RIFF", 4) && memcmp(b + 8, "WEBP", 4) == 0)
        return SD_IMG_FMT_WEBP;
    if (has_prefix(b, size, "GIF87a", 6) || has_prefix(b, size, "GIF89a", 6))
        return SD_IMG_FMT_GIF;
    if (has_prefix(b, size, "II*\0", 4) || has_prefix(b, size, "MM\0*", 4))
        return SD_IMG_FMT_TIFF;
    if (size >= 12 && memcmp(b + 4, "ftyp", 4) == 0)
        return SD_IMG_FMT_HEIF;
    if (has_prefix(b, size, jp2_sig, 12) || has_prefix(b, size, "\xFF\x4F\xFF\x51", 4))
        return SD_IMG_FMT_JP2;
    if (has_prefix(b, size, jxl_sig, 12) || has_prefix(b, size, "\xFF\x0A", 2))
        return SD_IMG_FMT_JXL;
    if (has_prefix(b, size, "8BPS", 4))
        return SD_IMG_FMT_PSD;
    if (size >= 18 && b[0] == 'B' && b[1] == 'M') {
        /* "BM" alone is too weak (a text file may start so): check the DIB header size */
        uint32_t dib = (uint32_t)b[14] | (uint32_t)b[15] << 8 | (uint32_t)b[16] << 16 |
                       (uint32_t)b[17] << 24;
        if (dib == 12 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 || dib == 124)
            return SD_IMG_FMT_BMP;
    }
    if (size >= 6 && b[0] == 0 && b[1] == 0 && b[2] == 1 && b[3] == 0 && (b[4] | b[5]) != 0)
        return SD_IMG_FMT_ICO;
    return SD_IMG_FMT_UNKNOWN;
}

/* ---- EXIF orientation ----------------------------------------------------------------- */

/* Orientation (tag 0x0112) from IFD0 of a TIFF structure ("II*\0" or "MM\0*", after an
 * optional "Exif\0\0" as Pillow's Exif.load strips it): the value as stored, 0 when the tag has
 * a type other than SHORT or LONG, -1 when there is no such tag (or no readable IFD0). Pillow
 * falls back to XMP only when the tag is absent; a value outside 2..8 transposes nothing. */
static int exif_orientation(const uint8_t *t, size_t n)
{
    int le;
    uint32_t ifd;
    unsigned count;
#define RD16(p) (le ? (unsigned)((p)[0] | (p)[1] << 8) : (unsigned)((p)[0] << 8 | (p)[1]))
#define RD32(p)                                                                                \
    (le ? ((uint32_t)(p)[0] | (uint32_t)(p)[1] << 8 | (uint32_t)(p)[2] << 16 | (uint32_t)(p)[3] << 24) \
        : ((uint32_t)(p)[0] << 24 | (uint32_t)(p)[1] << 16 | (uint32_t)(p)[2] << 8 | (uint32_t)(p)[3]))
    if (n >= 6 && memcmp(t, "Exif\0\0", 6) == 0)
        t += 6, n -= 6;
    if (n < 8)
        return -1;
    if (t[0] == 'I' && t[1] == 'I')
        le = 1;
    else if (t[0] == 'M' && t[1] == 'M')
        le = 0;
    else
        return -1;
    if (RD16(t + 2) != 42)
        return -1;
    ifd = RD32(t + 4);
    if (ifd > n - 2 || ifd < 8)
        return -1;
    count = RD16(t + ifd);
    for (unsigned i = 0; i < count; i++) {
        size_t e = (size_t)ifd + 2 + (size_t)i * 12;
        unsigned tag, type, v;
        if (e + 12 > n)
            return -1;
        tag = RD16(t + e);
        if (tag != 0x0112)
            continue;
        type = RD16(t + e + 2);
        if (type == 3)
            v = RD16(t + e + 8);
        else if (type == 4)
            v = (unsigned)RD32(t + e + 8);
        else
            return 0;
        return v > 0xFFFF ? 0 : (int)v;
    }
    return -1;
#undef RD16
#undef RD32
}

/* An orientation as sd_image reports it: 1..8, else 0 (none, or nothing to apply). */
static int orientation_usable(int v) { return v >= 1 && v <= 8 ? v : 0; }

/* Applies the transposition ImageOps.exif_transpose picks for an orientation. src is w x h RGB8;
 * dst gets the result (w and h swapped for 5..8). */
static void orient_rgb8(const uint8_t *src, int w, int h, int orientation, uint8_t *dst)
{
    const int swap = orientation >= 5;
    const int ow = swap ? h : w, oh = swap ? w : h;
    for (int y = 0; y < oh; y++) {
        uint8_t *d = dst + (size_t)y * ow * 3;
        for (int x = 0; x < ow; x++) {
            int sx, sy;
            switch (orientation) {
            case 2: sx = w - 1 - x; sy = y; break;              /* FLIP_LEFT_RIGHT */
            case 3: sx = w - 1 - x; sy = h - 1 - y; break;      /* ROTATE_180 */
            case 4: sx = x; sy = h - 1 - y; break;              /* FLIP_TOP_BOTTOM */
            case 5: sx = y; sy = x; break;                      /* TRANSPOSE */
            case 6: sx = y; sy = h - 1 - x; break;              /* ROTATE_270 (clockwise) */
            case 7: sx = w - 1 - y; sy = h - 1 - x; break;      /* TRANSVERSE */
            case 8: sx = w - 1 - y; sy = x; break;              /* ROTATE_90 (counter-clockwise) */
            default: sx = x; sy = y; break;
            }
            memcpy(d + (size_t)x * 3, src + ((size_t)sy * w + sx) * 3, 3);
        }
    }
}

/* ---- the decoder object --------------------------------------------------------------- */

struct sd_image_decoder {
    tjhandle tj;
    uint8_t *scratch; /* CMYK pixels, PNG rows that are not RGB8, orientation */
    size_t scratch_cap;
    png_bytep *rows;
    size_t rows_cap;
};

sd_image_decoder *sd_image_decoder_new(void)
{
    sd_image_decoder *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->tj = tjInitDecompress();
    if (!d->tj) {
        free(d);
        return NULL;
    }
    return d;
}

void sd_image_decoder_free(sd_image_decoder *d)
{
    if (!d)
        return;
    if (d->tj)
        tjDestroy(d->tj);
    free(d->scratch);
    free(d->rows);
    free(d);
}

static int grow(uint8_t **p, size_t *cap, size_t need)
{
    uint8_t *q;
    if (*cap >= need && *p)
        return 0;
    q = realloc(*p, need ? need : 1);
    if (!q)
        return -1;
    *p = q;
    *cap = need;
    return 0;
}

/* Checks the declared size against the options; SD_IMG_OK or the reason. */
static sd_image_status check_dims(const char *name, const char *fmt, uint64_t w, uint64_t h,
                                  const sd_image_opts *o, sd_err *err)
{
    int64_t maxp = o->max_pixels > 0 ? o->max_pixels : SD_IMAGE_DEFAULT_MAX_PIXELS;
    if (w == 0 || h == 0)
        return fail(err, SD_IMG_ZERO_SIZE, name, "%s header declares a %llux%llu image", fmt,
                    (unsigned long long)w, (unsigned long long)h);
    if (w > INT_MAX / 4 || h > INT_MAX / 4 || w * h > (uint64_t)maxp)
        return fail(err, SD_IMG_TOO_LARGE, name,
                    "%s header declares %llux%llu = %llu pixels, more than the limit of %lld", fmt,
                    (unsigned long long)w, (unsigned long long)h, (unsigned long long)(w * h),
                    (long long)maxp);
    if (o->resize_to > 0 && !sd_transform_size_ok((int64_t)w, (int64_t)h, o->resize_to))
        return fail(err, SD_IMG_TOO_LARGE, name,
                    "%s header declares %llux%llu, too large for the resize to %d (sides before and "
                    "after it at most %d)",
                    fmt, (unsigned long long)w, (unsigned long long)h, o->resize_to, SD_TRANSFORM_MAX_SIDE);
    if (o->min_side > 0 && (w < (uint64_t)o->min_side || h < (uint64_t)o->min_side))
        return fail(err, SD_IMG_TOO_SMALL, name,
                    "%llux%llu image is smaller than the minimum side of %d pixels",
                    (unsigned long long)w, (unsigned long long)h, o->min_side);
    return SD_IMG_OK;
}

/* ---- JPEG header walk ------------------------------------------------------------------
 * TurboJPEG's header call would also give the size, but this walk (markers up to the first
 * scan header) tells truncation from corruption, finds 12-bit and lossless files (which the
 * 8-bit library cannot decode) and the first EXIF segment, all before anything is allocated. */

typedef struct jpeg_header {
    int sof;          /* SOFn marker (0xC0..0xCF) */
    int precision, width, height, components;
    const uint8_t *exif; /* TIFF structure of the first APP1 "Exif\0\0" segment */
    size_t exif_len;
} jpeg_header;

static sd_image_status jpeg_walk(const uint8_t *b, size_t n, const char *name, jpeg_header *h,
                                 sd_err *err)
{
    size_t p = 2;
    memset(h, 0, sizeof *h);
    for (;;) {
        unsigned m;
        size_t len;
        while (p < n && b[p] != 0xFF)
            p++; /* extraneous bytes: libjpeg warns, the strict decode below decides */
        while (p < n && b[p] == 0xFF)
            p++; /* fill bytes */
        if (p >= n)
            return fail(err, SD_IMG_TRUNCATED, name, "truncated JPEG: data ends before the %s",
                        h->sof ? "first scan" : "frame header");
        m = b[p++];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD8))
            continue; /* markers without a length */
        if (m == 0xD9 || (m == 0xDA && !h->sof))
            return fail(err, SD_IMG_CORRUPT, name, "corrupt JPEG: %s before any %s",
                        m == 0xD9 ? "end of image" : "scan", h->sof ? "scan" : "frame header");
        if (p + 2 > n)
            return fail(err, SD_IMG_TRUNCATED, name, "truncated JPEG: data ends inside marker 0xFF%02X", m);
        len = (size_t)b[p] << 8 | b[p + 1];
        if (len < 2)
            return fail(err, SD_IMG_CORRUPT, name, "corrupt JPEG: marker 0xFF%02X has length %zu", m, len);
        if (m == 0xE1 && !h->exif && len >= 2 + 6 + 8 && p + len <= n &&
            memcmp(b + p + 2, "Exif\0\0", 6) == 0) {
            h->exif = b + p + 8;
            h->exif_len = len - 8;
        }
        if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
            if (p + 8 > n)
                return fail(err, SD_IMG_TRUNCATED, name, "truncated JPEG: data ends inside the frame header");
            if (len < 8)
                return fail(err, SD_IMG_CORRUPT, name, "corrupt JPEG: frame header of length %zu", len);
            if (h->sof)
                return fail(err, SD_IMG_CORRUPT, name, "corrupt JPEG: a second frame header");
            h->sof = (int)m;
            h->precision = b[p + 2];
            h->height = b[p + 3] << 8 | b[p + 4];
            h->width = b[p + 5] << 8 | b[p + 6];
            h->components = b[p + 7];
        }
        if (m == 0xDA) {
            /* the first scan header must be complete; the entropy-coded data is libjpeg's */
            if (p + len > n)
                return fail(err, SD_IMG_TRUNCATED, name, "truncated JPEG: data ends inside the first scan header");
            return SD_IMG_OK;
        }
        p += len;
    }
}

static sd_image_status jpeg_header_check(const jpeg_header *h, const char *name,
                                         const sd_image_opts *o, sd_err *err)
{
    sd_image_status st;
    if (h->sof == 0xC3 || (h->sof >= 0xC5 && h->sof <= 0xC7) || h->sof >= 0xCD)
        return fail(err, SD_IMG_UNSUPPORTED, name, "unsupported JPEG: %s coding (marker 0xFF%02X)",
                    h->sof == 0xC3 ? "lossless" : "hierarchical/differential", h->sof);
    if (h->precision != 8)
        return fail(err, SD_IMG_UNSUPPORTED, name, "unsupported JPEG: %d-bit samples (only 8-bit)",
                    h->precision);
    if (h->components != 1 && h->components != 3 && h->components != 4)
        return fail(err, SD_IMG_UNSUPPORTED, name,
                    "unsupported JPEG: %d components (Pillow reads 1, 3 or 4)", h->components);
    st = check_dims(name, "JPEG", (uint64_t)h->width, (uint64_t)h->height, o, err);
    return st;
}

/* libjpeg's own words decide between a truncated and a corrupt file: JWRN_JPEG_EOF is
 * "Premature end of JPEG file"; "Corrupt JPEG data: premature end of data segment" is a marker
 * inside the scan, i.e. corruption. */
static sd_image_status jpeg_classify(const char *msg)
{
    if (strstr(msg, "Premature end of JPEG file"))
        return SD_IMG_TRUNCATED;
    return SD_IMG_CORRUPT;
}

/* Pillow reads every 4-component JPEG as Adobe-inverted CMYK ("CMYK;I": each byte 255 - v) and
 * converts CMYK to RGB as CLIP8(nk - MULDIV255(c, nk)) with nk = 255 - k (Convert.c cmyk2rgb).
 * Here libjpeg's raw bytes are c' = 255 - c and k' = 255 - k, so nk = k'. */
static void cmyk_inverted_to_rgb(const uint8_t *in, size_t n, uint8_t *out)
{
    for (size_t i = 0; i < n; i++, in += 4, out += 3) {
        int nk = in[3];
        for (int c = 0; c < 3; c++) {
            int t = (255 - in[c]) * nk + 128;
            int v = nk - (((t >> 8) + t) >> 8);
            out[c] = (uint8_t)(v <= 0 ? 0 : v < 256 ? v : 255);
        }
    }
}

static sd_image_status decode_jpeg(sd_image_decoder *d, const uint8_t *b, size_t n, const char *name,
                                   const sd_image_opts *o, sd_image *out, int *orientation,
                                   sd_err *err)
{
    jpeg_header hdr;
    int w, h, subsamp, cs, flags, rc;
    int pf;
    size_t npix;
    uint8_t *dst;
    sd_image_status st = jpeg_walk(b, n, name, &hdr, err);
    if (st != SD_IMG_OK)
        return st;
    if ((st = jpeg_header_check(&hdr, name, o, err)) != SD_IMG_OK)
        return st;
    if (n > ULONG_MAX)
        return fail(err, SD_IMG_TOO_LARGE, name, "JPEG of %zu bytes is too large", n);
    if (tjDecompressHeader3(d->tj, b, (unsigned long)n, &w, &h, &subsamp, &cs) != 0) {
        const char *m = tjGetErrorStr2(d->tj);
        return fail(err, jpeg_classify(m), name, "corrupt JPEG header: %s", m);
    }
    if (w != hdr.width || h != hdr.height)
        return fail(err, SD_IMG_CORRUPT, name, "corrupt JPEG: frame header disagrees with libjpeg (%dx%d vs %dx%d)",
                    hdr.width, hdr.height, w, h);
    *orientation = hdr.exif ? orientation_usable(exif_orientation(hdr.exif, hdr.exif_len)) : 0;
    npix = (size_t)w * (size_t)h;
    if (grow(&out->data, &out->capacity, npix * 3) != 0)
        return fail(err, SD_IMG_NOMEM, name, "cannot allocate %zu bytes for a %dx%d image", npix * 3, w, h);
    if (cs == TJCS_CMYK || cs == TJCS_YCCK) {
        pf = TJPF_CMYK;
        if (grow(&d->scratch, &d->scratch_cap, npix * 4) != 0)
            return fail(err, SD_IMG_NOMEM, name, "cannot allocate %zu bytes for CMYK pixels", npix * 4);
        dst = d->scratch;
        snprintf(out->mode, sizeof out->mode, "CMYK");
    } else {
        /* libjpeg replicates gray into RGB itself, as Pillow's L -> RGB does */
        pf = TJPF_RGB;
        dst = out->data;
        snprintf(out->mode, sizeof out->mode, "%s", cs == TJCS_GRAY ? "L" : "RGB");
    }
    /* Pillow uses libjpeg's defaults: the accurate integer IDCT (JDCT_ISLOW) and fancy
     * upsampling. TurboJPEG's defaults are the same; ACCURATEDCT pins the first where a build
     * would default to the fast one. LIMITSCANS refuses progressive files with > 500 scans. */
    flags = TJFLAG_ACCURATEDCT;
#ifdef TJFLAG_LIMITSCANS
    flags |= TJFLAG_LIMITSCANS;
#endif
    rc = tjDecompress2(d->tj, b, (unsigned long)n, dst, w, 0, h, pf, flags);
    if (rc != 0) {
        const char *m = tjGetErrorStr2(d->tj);
        int warning = tjGetErrorCode(d->tj) == TJERR_WARNING;
        sd_image_status why = jpeg_classify(m);
        if (!warning || why == SD_IMG_TRUNCATED || o->strict_jpeg)
            return fail(err, why, name, "%s JPEG: %s%s", why == SD_IMG_TRUNCATED ? "truncated" : "corrupt", m,
                        !warning ? ""
                        : why == SD_IMG_TRUNCATED ? " (a libjpeg warning; Pillow refuses it too)"
                                                  : " (a libjpeg warning, an error with strict_jpeg)");
    }
    if (pf == TJPF_CMYK)
        cmyk_inverted_to_rgb(d->scratch, npix, out->data);
    out->width = w;
    out->height = h;
    out->bit_depth = 8;
    return SD_IMG_OK;
}

/* ---- PNG -------------------------------------------------------------------------------
 * libpng reports errors by longjmp. Everything the guarded function allocates hangs off the
 * context or the decoder (heap), and no local variable of it is read after a longjmp, so
 * nothing is lost or indeterminate when an error jumps back. */

typedef struct png_ctx {
    const uint8_t *buf;
    size_t size, pos;
    int truncated;
    char msg[200];
    png_structp png;
    png_infop info;
    /* results */
    png_uint_32 w, h;
    int color_type, bit_depth, channels, depth_out;
    int gray16; /* 16-bit gray: converted by hand (Pillow clips it, it does not scale it) */
    uint8_t *pixels; /* rows, rowbytes each */
    size_t rowbytes;
} png_ctx;

static void png_read_mem(png_structp png, png_bytep data, size_t len)
{
    png_ctx *c = png_get_io_ptr(png);
    if (len > c->size - c->pos) {
        c->truncated = 1;
        png_error(png, "data ends early");
    }
    memcpy(data, c->buf + c->pos, len);
    c->pos += len;
}

static void png_on_error(png_structp png, png_const_charp msg)
{
    png_ctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg)
{
    /* Warnings (unknown sRGB profile, extra compressed data, ancillary CRC errors) do not
     * change the pixels and Pillow ignores them too. */
    (void)png;
    (void)msg;
}

/* The most a compressed text chunk or ICC profile may inflate to inside libpng. */
#define PNG_INFLATE_MAX ((png_alloc_size_t)64 << 20)

static int png_guarded(png_ctx *c, sd_image_decoder *d, const sd_image_opts *o, sd_image *out)
{
    png_structp png = c->png;
    png_infop info = c->info;
    if (setjmp(png_jmpbuf(png)))
        return -1;
    png_set_read_fn(png, c, png_read_mem);
    /* sdtrain's max_pixels decides, not libpng's default 1e6 width/height limit */
    png_set_user_limits(png, 0x7fffffffU, 0x7fffffffU);
    /* A compressed text chunk or ICC profile that inflates past this is dropped with a warning
     * instead of taking the memory (the pixels do not depend on them; the orientation scan
     * reads the text chunks itself): bounds what a decompression bomb costs */
    png_set_chunk_malloc_max(png, PNG_INFLATE_MAX);
    /* Palette indices past the palette read as black (libpng's zeroed 256-entry palette, as in
     * Pillow >= 10; Pillow 9 gives a gray ramp there): no error about them. */
    png_set_check_for_invalid_index(png, -1);
    png_read_info(png, info);
    c->w = png_get_image_width(png, info);
    c->h = png_get_image_height(png, info);
    c->color_type = png_get_color_type(png, info);
    c->bit_depth = png_get_bit_depth(png, info);
    if (c->color_type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(png); /* adds alpha from tRNS; dropped below unless composited */
    if (c->color_type == PNG_COLOR_TYPE_GRAY && c->bit_depth < 8)
        png_set_expand_gray_1_2_4_to_8(png); /* 0/255, x*0x55, x*0x11: Pillow's "1", L;2, L;4 */
    if (o->alpha == SD_ALPHA_WHITE && c->color_type != PNG_COLOR_TYPE_PALETTE &&
        png_get_valid(png, info, PNG_INFO_tRNS))
        png_set_tRNS_to_alpha(png);
    c->gray16 = c->bit_depth == 16 && c->color_type == PNG_COLOR_TYPE_GRAY;
    if (c->bit_depth == 16 && !c->gray16)
        png_set_strip_16(png); /* the high byte: Pillow's ;16B unpackers take in[0] */
    if (png_get_interlace_type(png, info) != PNG_INTERLACE_NONE)
        png_set_interlace_handling(png);
    png_read_update_info(png, info);
    c->channels = png_get_channels(png, info);
    c->depth_out = png_get_bit_depth(png, info);
    c->rowbytes = png_get_rowbytes(png, info);
    if (c->rowbytes != (size_t)c->w * (size_t)c->channels * (size_t)(c->depth_out / 8) ||
        (c->channels < 1 || c->channels > 4))
        png_error(png, "unexpected row layout after transformations");
    if (c->channels == 3 && c->depth_out == 8) {
        if (grow(&out->data, &out->capacity, c->rowbytes * c->h) != 0)
            png_error(png, "out of memory");
        c->pixels = out->data;
    } else {
        if (grow(&out->data, &out->capacity, (size_t)c->w * c->h * 3) != 0 ||
            grow(&d->scratch, &d->scratch_cap, c->rowbytes * c->h) != 0)
            png_error(png, "out of memory");
        c->pixels = d->scratch;
    }
    if (d->rows_cap < c->h) {
        png_bytep *r = realloc(d->rows, c->h * sizeof *r);
        if (!r)
            png_error(png, "out of memory");
        d->rows = r;
        d->rows_cap = c->h;
    }
    for (png_uint_32 y = 0; y < c->h; y++)
        d->rows[y] = c->pixels + (size_t)y * c->rowbytes;
    png_read_image(png, d->rows);
    /* No png_read_end: like Pillow, a file whose pixels are complete is accepted even when the
     * chunks after the image data (or IEND) are missing. */
    return 0;
}

/* (c*a + 255*(255-a)) / 255 rounded to nearest, exactly: Pillow's paste-with-mask BLEND. */
static inline uint8_t over_white(unsigned c, unsigned a)
{
    unsigned t = c * a + 255u * (255u - a) + 128u;
    return (uint8_t)(((t >> 8) + t) >> 8);
}

/* Rows of 1..4 channels (8-bit, or 16-bit gray) to RGB8 by the alpha policy. */
static void png_to_rgb(const png_ctx *c, sd_alpha_policy alpha, uint8_t *dst)
{
    const size_t npix = (size_t)c->w * c->h;
    const uint8_t *s = c->pixels;
    const int white = alpha == SD_ALPHA_WHITE;
    if (c->gray16) {
        /* Pillow opens 16-bit gray as mode I (I;16 from 10.0); convert('RGB') clips the value
         * to 255 (i2rgb / I16_RGB): anything >= 256 becomes white. */
        for (size_t i = 0; i < npix; i++, dst += 3) {
            unsigned v = (unsigned)s[i * c->channels * 2] << 8 | s[i * c->channels * 2 + 1];
            uint8_t g = (uint8_t)(v > 255 ? 255 : v);
            if (c->channels == 2 && white)
                g = over_white(g, s[i * 4 + 2]);
            dst[0] = dst[1] = dst[2] = g;
        }
        return;
    }
    switch (c->channels) {
    case 1:
        for (size_t i = 0; i < npix; i++, dst += 3)
            dst[0] = dst[1] = dst[2] = s[i];
        break;
    case 2:
        for (size_t i = 0; i < npix; i++, dst += 3) {
            uint8_t g = white ? over_white(s[2 * i], s[2 * i + 1]) : s[2 * i];
            dst[0] = dst[1] = dst[2] = g;
        }
        break;
    case 3:
        if (dst != s)
            memcpy(dst, s, npix * 3);
        break;
    case 4:
        for (size_t i = 0; i < npix; i++, dst += 3, s += 4) {
            if (white) {
                dst[0] = over_white(s[0], s[3]);
                dst[1] = over_white(s[1], s[3]);
                dst[2] = over_white(s[2], s[3]);
            } else {
                dst[0] = s[0];
                dst[1] = s[1];
                dst[2] = s[2];
            }
        }
        break;
    }
}

static const char *png_pillow_mode(int color_type, int bit_depth)
{
    switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
        return bit_depth == 1 ? "1" : bit_depth == 16 ? "I;16" : "L";
    case PNG_COLOR_TYPE_RGB:
        return "RGB";
    case PNG_COLOR_TYPE_PALETTE:
        return "P";
    case PNG_COLOR_TYPE_GRAY_ALPHA:
        return bit_depth == 16 ? "RGBA" : "LA";
    default:
        return "RGBA";
    }
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* ---- PNG orientation ----------------------------------------------------------------- */

/* Pillow 9.4's ImageOps.exif_transpose on a loaded PNG takes the orientation from
 * Image.getexif(): the eXIf chunk (info["exif"]), else a text chunk "Raw profile type exif"
 * (ImageMagick's hex dump), and, when that EXIF has no Orientation tag, the first match of
 * tiff:Orientation(="|>)([0-9]) in the text chunk "XML:com.adobe.xmp" (XMP). Chunks on either
 * side of the image data count (the load reads those after it), the last of a kind wins as in
 * Pillow's info dictionary, and a chunk stream that ends early is read up to there. */

/* Pillow's limit on a decompressed text chunk (PngImagePlugin.MAX_TEXT_CHUNK, 1 MiB); a larger
 * one is not read here (Pillow refuses the image). */
#define PNG_TEXT_MAX ((size_t)1 << 20)

/* zlib-inflates src into a new buffer (*out, *out_len); -1 on an error or past PNG_TEXT_MAX. */
static int inflate_text(const uint8_t *src, size_t n, uint8_t **out, size_t *out_len)
{
    z_stream z;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    int rc;
    if (!buf)
        return -1;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK) {
        free(buf);
        return -1;
    }
    z.next_in = (Bytef *)(uintptr_t)src;
    z.avail_in = (uInt)(n > UINT_MAX ? UINT_MAX : n);
    do {
        if (len == cap) {
            uint8_t *b2;
            if (cap >= PNG_TEXT_MAX + 1 || !(b2 = realloc(buf, cap * 2))) {
                rc = Z_MEM_ERROR;
                break;
            }
            buf = b2;
            cap *= 2;
        }
        z.next_out = buf + len;
        z.avail_out = (uInt)(cap - len);
        rc = inflate(&z, Z_NO_FLUSH);
        len = cap - z.avail_out;
    } while (rc == Z_OK);
    inflateEnd(&z);
    /* Python's zlib.decompressobj().decompress takes what a stream holds, also one that ends
     * early (Z_BUF_ERROR with no input left) */
    if ((rc != Z_STREAM_END && !(rc == Z_BUF_ERROR && z.avail_in == 0)) || len > PNG_TEXT_MAX) {
        free(buf);
        return -1;
    }
    *out = buf;
    *out_len = len;
    return 0;
}

/* The XMP orientation: the digit of the first "tiff:Orientation=\"D" or "tiff:Orientation>D",
 * -1 when there is none. */
static int xmp_orientation(const uint8_t *t, size_t n)
{
    static const char key[] = "tiff:Orientation";
    const size_t k = sizeof key - 1;
    for (size_t i = 0; i + k < n; i++) {
        if (t[i] != 't' || memcmp(t + i, key, k) != 0)
            continue;
        const uint8_t *p = t + i + k;
        const size_t left = n - i - k;
        if (left >= 3 && p[0] == '=' && p[1] == '"' && p[2] >= '0' && p[2] <= '9')
            return p[2] - '0';
        if (left >= 2 && p[0] == '>' && p[1] >= '0' && p[1] <= '9')
            return p[1] - '0';
    }
    return -1;
}

static int hex_value(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* "Raw profile type exif" as Pillow reads it: the lines after the first three ("", "exif",
 * the length) joined and read as hex (whitespace between the pairs allowed, as bytes.fromhex
 * does), then the EXIF. -2 when the hex is not hex (Pillow raises; nothing is applied here),
 * else what exif_orientation says. */
static int raw_profile_orientation(const uint8_t *t, size_t n)
{
    size_t i = 0, m = 0;
    uint8_t *bin;
    int lines = 0, hi = -1, v;
    while (i < n && lines < 3)
        if (t[i++] == '\n')
            lines++;
    if (lines < 3)
        return -1; /* no data lines: b"" loads as an empty EXIF */
    if (!(bin = malloc((n - i) / 2 + 1)))
        return -2;
    for (; i < n; i++) {
        int h;
        if (t[i] == '\n') /* the split lines are joined without it */
            continue;
        if (t[i] == ' ' || t[i] == '\t' || t[i] == '\r' || t[i] == '\v' || t[i] == '\f') {
            if (hi >= 0)
                break; /* whitespace inside a pair */
            continue;
        }
        if ((h = hex_value(t[i])) < 0)
            break;
        if (hi < 0)
            hi = h;
        else {
            bin[m++] = (uint8_t)(hi << 4 | h);
            hi = -1;
        }
    }
    v = i < n || hi >= 0 ? -2 : exif_orientation(bin, m);
    free(bin);
    return v;
}

static int png_chunk_type_ok(const uint8_t *t)
{
    for (int i = 0; i < 4; i++)
        if (!((t[i] >= 'A' && t[i] <= 'Z') || (t[i] >= 'a' && t[i] <= 'z') ||
              (t[i] >= '0' && t[i] <= '9') || t[i] == '_'))
            return 0;
    return 1;
}

/* The orientation of a PNG held in b[0..n) (the file is known to decode): 1..8 or 0. */
static int png_orientation(const uint8_t *b, size_t n)
{
    int exif = -1, raw = -1, xmp = -1; /* orientation from each source; -1: none */
    int have_exif = 0, have_raw = 0;
    size_t pos = 8;
    while (pos + 12 <= n) {
        const uint32_t len = be32(b + pos);
        const uint8_t *type = b + pos + 4, *data = b + pos + 8;
        if (len > n - pos - 12)
            break; /* ends early: what was read stays */
        if (!png_chunk_type_ok(type))
            break; /* Pillow stops at a type that is not 4 word characters */
        pos += 12 + (size_t)len;
        if (!memcmp(type, "IEND", 4))
            break;
        if (!memcmp(type, "eXIf", 4)) {
            exif = exif_orientation(data, len);
            have_exif = 1;
            continue;
        }
        const int text = !memcmp(type, "tEXt", 4), ztxt = !memcmp(type, "zTXt", 4),
                  itxt = !memcmp(type, "iTXt", 4);
        if (!text && !ztxt && !itxt)
            continue;
        const uint8_t *nul = memchr(data, 0, len);
        const size_t klen = nul ? (size_t)(nul - data) : len;
        const int is_xmp = klen == 17 && !memcmp(data, "XML:com.adobe.xmp", 17),
                  is_raw = klen == 21 && !memcmp(data, "Raw profile type exif", 21);
        if (!is_xmp && !is_raw)
            continue;
        const uint8_t *v = nul ? nul + 1 : data + len;
        size_t vlen = nul ? len - klen - 1 : 0;
        uint8_t *inflated = NULL;
        if (ztxt) {
            /* a method other than 0 makes Pillow refuse the file; a zlib error gives "" */
            if (vlen > 0 && v[0] != 0)
                continue;
            if (vlen == 0 || inflate_text(v + 1, vlen - 1, &inflated, &vlen) != 0)
                vlen = 0;
            v = inflated;
        } else if (itxt) {
            /* compression flag, method, language tag \0, translated keyword \0, text; a
             * malformed or undecodable one is not stored (Pillow returns early) */
            const uint8_t *lang, *tk;
            if (vlen < 2)
                continue;
            const int cf = v[0], cm = v[1];
            lang = v + 2;
            if (!(tk = memchr(lang, 0, vlen - 2)) || !(nul = memchr(tk + 1, 0, (size_t)(v + vlen - tk - 1))))
                continue;
            if (!sd_utf8_is_valid((const char *)lang, (size_t)(tk - lang)) ||
                !sd_utf8_is_valid((const char *)tk + 1, (size_t)(nul - tk - 1)))
                continue;
            tk = nul + 1;
            vlen = (size_t)(v + vlen - tk);
            v = tk;
            if (cf != 0) {
                if (cm != 0 || inflate_text(v, vlen, &inflated, &vlen) != 0)
                    continue;
                v = inflated;
            }
            if (!sd_utf8_is_valid((const char *)v, vlen)) {
                free(inflated);
                continue;
            }
        }
        if (is_xmp) {
            xmp = v ? xmp_orientation(v, vlen) : -1;
        } else {
            raw = v ? raw_profile_orientation(v, vlen) : -1;
            have_raw = 1;
        }
        free(inflated);
    }
    if (!have_exif && have_raw)
        exif = raw < -1 ? 0 : raw; /* hex that is not hex: Pillow raises, nothing applied */
    return orientation_usable(exif == -1 ? xmp : exif);
}

static sd_image_status decode_png(sd_image_decoder *d, const uint8_t *b, size_t n, const char *name,
                                  const sd_image_opts *o, sd_image *out, int *orientation, sd_err *err)
{
    png_ctx c;
    sd_image_status st;
    int rc;
    /* IHDR by hand first: the declared size is judged before libpng allocates anything */
    if (n < 8 + 8 + 13)
        return fail(err, SD_IMG_TRUNCATED, name, "truncated PNG: %zu bytes, no complete header", n);
    if (memcmp(b + 12, "IHDR", 4) != 0 || be32(b + 8) != 13)
        return fail(err, SD_IMG_CORRUPT, name, "corrupt PNG: the first chunk is not a 13-byte IHDR");
    if ((st = check_dims(name, "PNG", be32(b + 16), be32(b + 20), o, err)) != SD_IMG_OK)
        return st;
    /* libpng allocates each chunk before the image data at its declared length and only then
     * reads it: a 9 KB file declaring a 1.9 GB text chunk took 1.9 GB (found by fuzzing). Such a
     * chunk runs past the end of the file, which is what libpng would report after the
     * allocation; say it first. (The image data is read in pieces, and nothing after it.) */
    for (size_t pos = 8; pos + 8 <= n && memcmp(b + pos + 4, "IDAT", 4) != 0;) {
        const uint32_t len = be32(b + pos);
        if (len > 0x7fffffffU)
            break; /* libpng refuses the length before allocating */
        if ((size_t)len + 12 > n - pos)
            return fail(err, SD_IMG_TRUNCATED, name, "truncated PNG: data ends before the image does");
        pos += (size_t)len + 12;
    }
    memset(&c, 0, sizeof c);
    c.buf = b;
    c.size = n;
    c.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, png_on_error, png_on_warning);
    if (!c.png)
        return fail(err, SD_IMG_NOMEM, name, "cannot create a libpng reader");
    c.info = png_create_info_struct(c.png);
    if (!c.info) {
        png_destroy_read_struct(&c.png, NULL, NULL);
        return fail(err, SD_IMG_NOMEM, name, "cannot create a libpng reader");
    }
    rc = png_guarded(&c, d, o, out);
    png_destroy_read_struct(&c.png, &c.info, NULL);
    if (rc != 0) {
        if (c.truncated)
            return fail(err, SD_IMG_TRUNCATED, name, "truncated PNG: data ends before the image does");
        if (strcmp(c.msg, "out of memory") == 0 || strstr(c.msg, "Out of Memory"))
            return fail(err, SD_IMG_NOMEM, name, "out of memory decoding the PNG");
        return fail(err, SD_IMG_CORRUPT, name, "corrupt PNG: %s", c.msg);
    }
    png_to_rgb(&c, o->alpha, out->data);
    snprintf(out->mode, sizeof out->mode, "%s", png_pillow_mode(c.color_type, c.bit_depth));
    out->width = (int)c.w;
    out->height = (int)c.h;
    out->bit_depth = c.bit_depth;
    *orientation = png_orientation(b, n);
    return SD_IMG_OK;
}

/* ---- entry points ---------------------------------------------------------------------- */

static sd_image_status unsupported_or_not(sd_image_format f, const uint8_t *b, size_t n, const char *name,
                                          sd_err *err)
{
    if (n == 0)
        return fail(err, SD_IMG_EMPTY, name, "empty file (0 bytes)");
    if (f != SD_IMG_FMT_UNKNOWN)
        return fail(err, SD_IMG_UNSUPPORTED, name, "unsupported image format %s (only JPEG and PNG are decoded)",
                    sd_image_format_name(f));
    {
        size_t k, text = 0, m = n < 64 ? n : 64;
        for (k = 0; k < m; k++)
            text += (b[k] >= 0x20 && b[k] < 0x7f) || b[k] == '\n' || b[k] == '\r' || b[k] == '\t';
        return fail(err, SD_IMG_NOT_IMAGE, name, "not an image (%s, first bytes %02x %02x %02x %02x)",
                    text == m ? "looks like text" : "no known signature", b[0], n > 1 ? b[1] : 0,
                    n > 2 ? b[2] : 0, n > 3 ? b[3] : 0);
    }
}

sd_image_status sd_image_probe(const void *buf, size_t size, const char *name, const sd_image_opts *opts,
                               sd_image_info *info, sd_err *err)
{
    sd_image_opts def;
    const uint8_t *b = buf;
    sd_image_format f = sd_image_sniff(buf, size);
    sd_image_status st;
    if (!opts) {
        sd_image_opts_default(&def);
        opts = &def;
    }
    memset(info, 0, sizeof *info);
    info->format = f;
    if (f == SD_IMG_FMT_JPEG) {
        jpeg_header h;
        if ((st = jpeg_walk(b, size, name, &h, err)) != SD_IMG_OK)
            return st;
        info->width = h.width;
        info->height = h.height;
        info->components = h.components;
        info->bit_depth = h.precision;
        return jpeg_header_check(&h, name, opts, err);
    }
    if (f == SD_IMG_FMT_PNG) {
        static const uint8_t ch[7] = {1, 0, 3, 1, 2, 0, 4};
        if (size < 8 + 8 + 13)
            return fail(err, SD_IMG_TRUNCATED, name, "truncated PNG: %zu bytes, no complete header", size);
        if (memcmp(b + 12, "IHDR", 4) != 0 || be32(b + 8) != 13)
            return fail(err, SD_IMG_CORRUPT, name, "corrupt PNG: the first chunk is not a 13-byte IHDR");
        info->width = (int)(be32(b + 16) > INT_MAX ? INT_MAX : be32(b + 16));
        info->height = (int)(be32(b + 20) > INT_MAX ? INT_MAX : be32(b + 20));
        info->bit_depth = b[24];
        info->components = b[25] < 7 ? ch[b[25]] : 0;
        return check_dims(name, "PNG", be32(b + 16), be32(b + 20), opts, err);
    }
    return unsupported_or_not(f, b, size, name, err);
}

sd_image_status sd_image_decoder_run(sd_image_decoder *d, const void *buf, size_t size, const char *name,
                                     const sd_image_opts *opts, sd_image *out, sd_err *err)
{
    sd_image_opts def;
    const uint8_t *b = buf;
    sd_image_format f = sd_image_sniff(buf, size);
    sd_image_status st;
    int orientation = 0;
    if (!opts) {
        sd_image_opts_default(&def);
        opts = &def;
    }
    out->width = out->height = 0;
    out->format = f;
    out->mode[0] = 0;
    out->bit_depth = 0;
    out->orientation = 0;
    if (f == SD_IMG_FMT_JPEG)
        st = decode_jpeg(d, b, size, name, opts, out, &orientation, err);
    else if (f == SD_IMG_FMT_PNG)
        st = decode_png(d, b, size, name, opts, out, &orientation, err);
    else
        return unsupported_or_not(f, b, size, name, err);
    if (st != SD_IMG_OK) {
        out->width = out->height = 0;
        return st;
    }
    out->orientation = orientation;
    if (opts->exif_transpose && orientation > 1) {
        size_t bytes = (size_t)out->width * out->height * 3;
        if (grow(&d->scratch, &d->scratch_cap, bytes) != 0) {
            out->width = out->height = 0;
            return fail(err, SD_IMG_NOMEM, name, "cannot allocate %zu bytes to apply the EXIF orientation", bytes);
        }
        memcpy(d->scratch, out->data, bytes);
        orient_rgb8(d->scratch, out->width, out->height, orientation, out->data);
        if (orientation >= 5) {
            int t = out->width;
            out->width = out->height;
            out->height = t;
        }
    }
    return SD_IMG_OK;
}

sd_image_status sd_image_decode(const void *buf, size_t size, const char *name, const sd_image_opts *opts,
                                sd_image *out, sd_err *err)
{
    sd_image_status st;
    sd_image_decoder *d = sd_image_decoder_new();
    if (!d)
        return fail(err, SD_IMG_NOMEM, name, "cannot initialise TurboJPEG: %s", tjGetErrorStr2(NULL));
    st = sd_image_decoder_run(d, buf, size, name, opts, out, err);
    sd_image_decoder_free(d);
    return st;
}

sd_image_status sd_image_read_file(const char *path, uint8_t **buf, size_t *size, sd_err *err)
{
    FILE *f = fopen(path, "rb");
    struct stat stt;
    uint8_t *b;
    size_t n, got;
    *buf = NULL;
    *size = 0;
    if (!f)
        return fail(err, SD_IMG_IO, path, "cannot open: %s", strerror(errno));
    if (fstat(fileno(f), &stt) != 0) {
        int e = errno;
        fclose(f);
        return fail(err, SD_IMG_IO, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(stt.st_mode)) {
        fclose(f);
        return fail(err, SD_IMG_IO, path, "%s",
                    S_ISDIR(stt.st_mode) ? "is a directory" : "not a regular file");
    }
    n = (size_t)stt.st_size;
    b = malloc(n ? n : 1);
    if (!b) {
        fclose(f);
        return fail(err, SD_IMG_NOMEM, path, "cannot allocate %zu bytes to read the file", n);
    }
    got = fread(b, 1, n, f);
    if (got != n || ferror(f)) {
        int e = errno;
        fclose(f);
        free(b);
        return fail(err, SD_IMG_IO, path, "read error: %s", e ? strerror(e) : "short read");
    }
    fclose(f);
    *buf = b;
    *size = n;
    return SD_IMG_OK;
}

sd_image_status sd_image_decode_file(const char *path, const sd_image_opts *opts, sd_image *out, sd_err *err)
{
    uint8_t *b;
    size_t n;
    sd_image_status st = sd_image_read_file(path, &b, &n, err);
    if (st != SD_IMG_OK)
        return st;
    st = sd_image_decode(b, n, path, opts, out, err);
    free(b);
    return st;
}

/* ---- PNG writer ------------------------------------------------------------------------ */

typedef struct png_wctx {
    char msg[200];
} png_wctx;

static void png_w_error(png_structp png, png_const_charp msg)
{
    png_wctx *c = png_get_error_ptr(png);
    snprintf(c->msg, sizeof c->msg, "%s", msg);
    png_longjmp(png, 1);
}

static int png_write_guarded(png_structp png, png_infop info, FILE *f, const uint8_t *rgb, int w, int h)
{
    if (setjmp(png_jmpbuf(png)))
        return -1;
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)w, (png_uint_32)h, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < h; y++)
        png_write_row(png, rgb + (size_t)y * w * 3);
    png_write_end(png, info);
    return 0;
}

int sd_image_write_png(const char *path, const uint8_t *rgb, int w, int h, sd_err *err)
{
    png_wctx c;
    png_structp png;
    png_infop info;
    FILE *f;
    char *tmp;
    size_t len = strlen(path) + 16;
    int rc;
    if (w <= 0 || h <= 0)
        return sd_err_set(err, "%s: cannot write a %dx%d PNG", path, w, h);
    tmp = malloc(len);
    if (!tmp)
        return sd_err_set(err, "%s: out of memory", path);
    snprintf(tmp, len, "%s.tmp%ld", path, (long)getpid());
    f = fopen(tmp, "wb");
    if (!f) {
        sd_err_set(err, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return -1;
    }
    memset(&c, 0, sizeof c);
    png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &c, png_w_error, png_on_warning);
    info = png ? png_create_info_struct(png) : NULL;
    rc = (png && info) ? png_write_guarded(png, info, f, rgb, w, h) : -1;
    if (png)
        png_destroy_write_struct(&png, info ? &info : NULL);
    if (rc == 0 && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        rc = -1, snprintf(c.msg, sizeof c.msg, "%s", strerror(errno));
    if (fclose(f) != 0 && rc == 0)
        rc = -1, snprintf(c.msg, sizeof c.msg, "%s", strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -1, snprintf(c.msg, sizeof c.msg, "rename: %s", strerror(errno));
    if (rc != 0) {
        unlink(tmp);
        sd_err_set(err, "%s: cannot write PNG: %s", path, c.msg[0] ? c.msg : "libpng failed");
    }
    free(tmp);
    return rc;
}
