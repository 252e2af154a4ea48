/* The preprocessing transform: Pillow-exact antialiased bilinear resize, torchvision center crop, [-1, 1] floats. */
#ifndef SDTRAIN_TRANSFORM_H
#define SDTRAIN_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Size torchvision.transforms.functional.resize(img, size) gives a w x h image for an int size:
 * the shorter side becomes `size`, the longer int(size * long / short) (truncated, in double
 * precision as Python computes it); a square image stays square. */
void sd_resize_short_side_size(int w, int h, int size, int *out_w, int *out_h);

/* Offsets of torchvision's center_crop on a w x h image: top = int(round((h - ch) / 2.0)) with
 * Python's round-half-to-even (so (h - ch) = 3 gives 2, not 1), likewise left. The crop must fit. */
void sd_center_crop_offsets(int w, int h, int crop_w, int crop_h, int *left, int *top);

/* The order of Pillow's two resampling passes, which changed between versions (each pass rounds
 * to 8 bits, so the order shows in the result). Both passes run only when both sides change. */
typedef enum sd_pass_order {
    /* Pillow <= 12.1: horizontal first, always (the pinned reference, Pillow 9.4) */
    SD_PASS_ORDER_PILLOW_9 = 0,
    /* Pillow 12.2 .. 12.x (Image.resize): vertical first when h > 100 * w and the height shrinks */
    SD_PASS_ORDER_PILLOW_12_2 = 1,
    /* Pillow >= 13.0 (Resample.c): vertical first when the height shrinks and
     * h - out_h > 2 * (w - out_w); with torchvision's Resize that is most portrait images over 2:1
     * that are scaled down */
    SD_PASS_ORDER_PILLOW_13 = 2
} sd_pass_order;

/* Whether Pillow of that pass order resizes a w x h image to out_w x out_h vertically first. */
int sd_resize_vertical_first(int w, int h, int out_w, int out_h, sd_pass_order order);

/* Pillow's Image.resize(size, BILINEAR) of an RGB8 image (reducing_gap None, full box), computed
 * only for the output window [x0, x0 + win_w) x [y0, y0 + win_h) of the out_w x out_h result:
 * every value is bit-identical to the same pixel of Pillow's full result (fixed point with 22
 * fraction bits, two passes in the order `order` picks, each 8-bit clipped).
 * dst holds win_w * win_h * 3 bytes. Returns 0, or -1 with err set for invalid sizes or when
 * memory runs out. */
typedef struct sd_resize_ws {
    void *buf;   /* scratch reused between calls; free with sd_resize_ws_free */
    size_t cap;
} sd_resize_ws;
void sd_resize_ws_free(sd_resize_ws *ws);

int sd_resize_bilinear_rgb8(const uint8_t *src, int w, int h, int out_w, int out_h, int x0, int y0,
                            int win_w, int win_h, sd_pass_order order, uint8_t *dst, sd_resize_ws *ws,
                            sd_err *err);

/* The largest side sd_transform_rgb8 takes, before and after the resize. */
#define SD_TRANSFORM_MAX_SIDE (1 << 24)

/* Whether sd_transform_rgb8 takes a w x h image at this resolution (1 or 0): both sides, and the
 * long side once the short side is resized to `resolution`, at most SD_TRANSFORM_MAX_SIDE. The
 * decoder checks it from the header (sd_image_opts.resize_to), before anything is allocated. */
int sd_transform_size_ok(int64_t w, int64_t h, int resolution);

typedef struct sd_transform_opts {
    int resolution;         /* output is resolution x resolution */
    sd_pass_order pass_order; /* which Pillow's resize to reproduce; 0 = Pillow <= 12.1 */
} sd_transform_opts;

/* The seed path on an RGB8 w x h image: torchvision resize(resolution) (PIL antialiased bilinear)
 * then center_crop(resolution), writing resolution^2 * 3 bytes (RGB, HWC). Only the cropped
 * window is computed. ws may be NULL. Returns 0, or -1 with err set. */
int sd_transform_rgb8(const uint8_t *src, int w, int h, const sd_transform_opts *opts, uint8_t *dst,
                      sd_resize_ws *ws, sd_err *err);

typedef enum sd_pixel_layout {
    SD_LAYOUT_HWC = 0, /* channels last, as the models take it (NHWC) */
    SD_LAYOUT_CHW = 1  /* channels first, as torchvision's ToTensor gives it */
} sd_pixel_layout;

/* ToTensor + Normalize([0.5]*3, [0.5]*3) in float32: ((float)v / 255.0f - 0.5f) / 0.5f, the
 * exact floats torchvision produces (v / 127.5f - 1 gives the same 256 values; v * (2/255.f) - 1
 * does not, see doc/image-pipeline.md). rgb is w x h RGB8 (HWC); out gets w * h * 3 floats in the
 * given layout. */
void sd_normalize_rgb8(const uint8_t *rgb, int w, int h, sd_pixel_layout layout, float *out);

/* The float value of one 8-bit sample (the table sd_normalize_rgb8 uses). */
float sd_normalize_value(uint8_t v);

#ifdef __cplusplus
}
#endif
#endif
