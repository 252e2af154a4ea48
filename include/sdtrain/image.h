/* Image decoding (JPEG via TurboJPEG, PNG via libpng) to RGB8, pixel for pixel as Pillow's convert('RGB'). */
#ifndef SDTRAIN_IMAGE_H
#define SDTRAIN_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why an image was not decoded. The data pipeline skips the sample and counts it under
 * sd_image_status_name(status); the message in the sd_err names the file and the problem. */
typedef enum sd_image_status {
    SD_IMG_OK = 0,
    SD_IMG_EMPTY,       /* zero bytes */
    SD_IMG_NOT_IMAGE,   /* no image signature at all (text, HTML error page, random bytes) */
    SD_IMG_UNSUPPORTED, /* an image format or variant not decoded here (WebP, GIF, 12-bit JPEG, ...) */
    SD_IMG_TRUNCATED,   /* the data ends before the image does */
    SD_IMG_CORRUPT,     /* the decoder failed, or (strict JPEG) libjpeg warned about corrupt data */
    SD_IMG_ZERO_SIZE,   /* the header declares a width or height of 0 */
    SD_IMG_TOO_LARGE,   /* the header declares more than max_pixels pixels, or a size the transform
                           refuses (resize_to); nothing was allocated */
    SD_IMG_TOO_SMALL,   /* the shorter side is below min_side (a policy of the caller) */
    SD_IMG_IO,          /* the file could not be read */
    SD_IMG_NOMEM,       /* an allocation failed */
    SD_IMG_STATUS_COUNT
} sd_image_status;

/* Short stable name for counting and reports: "ok", "empty", "not_image", "unsupported",
 * "truncated", "corrupt", "zero_size", "too_large", "too_small", "io", "nomem". */
const char *sd_image_status_name(sd_image_status s);

/* Container formats recognised from their magic bytes. Only JPEG and PNG are decoded. */
typedef enum sd_image_format {
    SD_IMG_FMT_UNKNOWN = 0,
    SD_IMG_FMT_JPEG,
    SD_IMG_FMT_PNG,
    SD_IMG_FMT_WEBP,
    SD_IMG_FMT_GIF,
    SD_IMG_FMT_BMP,
    SD_IMG_FMT_TIFF,
    SD_IMG_FMT_HEIF, /* ISO-BMFF 'ftyp' images: HEIC, AVIF */
    SD_IMG_FMT_JP2,
    SD_IMG_FMT_JXL,
    SD_IMG_FMT_ICO,
    SD_IMG_FMT_PSD,
    SD_IMG_FMT_COUNT
} sd_image_format;

const char *sd_image_format_name(sd_image_format f); /* "JPEG", "PNG", "WebP", ... */
sd_image_format sd_image_sniff(const void *buf, size_t size);

/* What to do with an alpha channel (RGBA, LA, or a tRNS chunk). */
typedef enum sd_alpha_policy {
    /* Drop it, as Pillow's convert('RGB') does (the seed pipeline). Colours under fully
     * transparent pixels then show through as they are stored. */
    SD_ALPHA_DROP = 0,
    /* Composite on white: round((c*a + 255*(255-a)) / 255) exactly, which equals Pillow's
     * Image.new('RGB', size, 'white').paste(im.convert('RGB'), mask=alpha). tRNS colour
     * keys and palette alpha count as alpha. */
    SD_ALPHA_WHITE = 1
} sd_alpha_policy;

/* Pillow's Image.MAX_IMAGE_PIXELS is 89,478,485; above twice that it raises
 * DecompressionBombError. The same default keeps the two pipelines' skip sets equal. */
#define SD_IMAGE_DEFAULT_MAX_PIXELS 178956970LL

typedef struct sd_image_opts {
    /* Apply the orientation like Pillow 9.4's ImageOps.exif_transpose: the EXIF tag of the
     * first JPEG APP1 "Exif" segment; for PNG the eXIf chunk, else a "Raw profile type exif"
     * text chunk, and an XMP tiff:Orientation when that EXIF has none (doc/image-pipeline.md).
     * Default 0: the seed pipeline (Image.open(...).convert('RGB')) ignores it. */
    int exif_transpose;
    sd_alpha_policy alpha;
    int64_t max_pixels; /* width*height above this: SD_IMG_TOO_LARGE from the header; <= 0: default */
    int min_side;       /* min(width, height) below this: SD_IMG_TOO_SMALL; 0: no limit */
    /* The resolution the image is transformed to next (sd_transform_rgb8): a size the transform
     * refuses (sd_transform_size_ok) is SD_IMG_TOO_LARGE from the header. 0: not checked. */
    int resize_to;
    /* JPEG: libjpeg warnings (corrupt data, extraneous bytes, bad Huffman code...) are errors
     * (SD_IMG_CORRUPT). Default 1. With 0 they are ignored as Pillow ignores them; a JPEG that
     * ends early is always SD_IMG_TRUNCATED, as Pillow raises "image file is truncated". */
    int strict_jpeg;
} sd_image_opts;

/* Defaults: exif_transpose 0, SD_ALPHA_DROP, SD_IMAGE_DEFAULT_MAX_PIXELS, min_side 0,
 * resize_to 0, strict_jpeg 1. */
void sd_image_opts_default(sd_image_opts *o);

/* A decoded image: RGB8, rows of width*3 bytes, no padding. Start from SD_IMAGE_INIT (or
 * zeroes); a decode into an image that already holds a large enough buffer reuses it. */
typedef struct sd_image {
    uint8_t *data;
    size_t capacity;     /* bytes allocated at data */
    int width, height;   /* after EXIF transposition, if any */
    sd_image_format format;
    char mode[8];        /* the source as Pillow names it: "RGB", "L", "CMYK", "P", "RGBA", "LA",
                            "I", "I;16", "1" (informational) */
    int bit_depth;       /* bits per source sample (8 for JPEG) */
    int orientation;     /* orientation found (1..8; EXIF, or for PNG also XMP), 0 when none;
                            applied only with exif_transpose */
} sd_image;
#define SD_IMAGE_INIT {0}

void sd_image_free(sd_image *img);

/* Header facts, read without decoding the pixels. */
typedef struct sd_image_info {
    sd_image_format format;
    int width, height; /* as stored (before EXIF orientation) */
    int components;    /* JPEG components or PNG channels */
    int bit_depth;
} sd_image_info;

/* Reads the header: format, dimensions. Checks zero size, max_pixels, resize_to and min_side (opts may be
 * NULL for the defaults). `name` (a path or tar member name) prefixes every message. */
sd_image_status sd_image_probe(const void *buf, size_t size, const char *name,
                               const sd_image_opts *opts, sd_image_info *info, sd_err *err);

/* A decoder owns its TurboJPEG handle and scratch buffers: one per thread, reused for every
 * image. Returns NULL only when TurboJPEG cannot initialise. */
typedef struct sd_image_decoder sd_image_decoder;
sd_image_decoder *sd_image_decoder_new(void);
void sd_image_decoder_free(sd_image_decoder *dec);

/* Decodes a JPEG or PNG held in memory into out (RGB8). On failure out keeps its buffer,
 * width = height = 0, and err says "<name>: <problem>". */
sd_image_status sd_image_decoder_run(sd_image_decoder *dec, const void *buf, size_t size,
                                     const char *name, const sd_image_opts *opts, sd_image *out,
                                     sd_err *err);

/* One-shot helpers (create and free a decoder). */
sd_image_status sd_image_decode(const void *buf, size_t size, const char *name,
                                const sd_image_opts *opts, sd_image *out, sd_err *err);
sd_image_status sd_image_decode_file(const char *path, const sd_image_opts *opts, sd_image *out,
                                     sd_err *err);

/* Reads a whole file into a malloc'd buffer (for callers that decode paths). */
sd_image_status sd_image_read_file(const char *path, uint8_t **buf, size_t *size, sd_err *err);

/* Writes RGB8 as an 8-bit PNG (temporary file + rename, so a reader never sees half a file).
 * Returns 0, or -1 with err set. */
int sd_image_write_png(const char *path, const uint8_t *rgb, int width, int height, sd_err *err);

#ifdef __cplusplus
}
#endif
#endif
