/* sdtool transform: the preprocessing image path on one file, written as an 8-bit PNG. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/commands.h"
#include "sdtrain/error.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/image.h"
#include "sdtrain/transform.h"

static void transform_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool transform --resolution R [options] IN OUT.png\n"
            "\n"
            "Decodes IN (JPEG or PNG) to RGB as Pillow's convert('RGB') does, resizes the shorter side\n"
            "to R (Pillow's antialiased bilinear, as torchvision's Resize(R) on a PIL image), center\n"
            "crops R x R (torchvision's CenterCrop) and writes the 8-bit result, before normalization.\n"
            "\n"
            "options:\n"
            "  --resolution R      output side in pixels (required unless --decode-only)\n"
            "  --exif-transpose    apply the EXIF orientation (the seed pipeline does not)\n"
            "  --alpha drop|white  drop alpha as convert('RGB') does (default), or composite on white\n"
            "  --lenient-jpeg      accept JPEGs libjpeg only warns about (Pillow does); truncation stays an error\n"
            "  --max-pixels N      refuse images with more pixels (default %lld, Pillow's bomb limit)\n"
            "  --pillow-12.2       resize tall images (h > 100 w) vertically first, as Pillow 12.2 .. 12.x\n"
            "  --pillow-13         resize vertically first when h - h' > 2 (w - w'), as Pillow >= 13.0\n"
            "                      (default: horizontally first, as Pillow <= 12.1, the pinned 9.4)\n"
            "  --decode-only       write the decoded RGB image at full size, no resize or crop\n"
            "\n"
            "exit status: 0 written, 1 the image was refused (reason printed) or OUT cannot be written,\n"
            "2 bad usage (OUT the same file as IN included).\n",
            (long long)SD_IMAGE_DEFAULT_MAX_PIXELS);
}

int sd_cmd_transform(int argc, char **argv)
{
    sd_image_opts o;
    sd_transform_opts to = {0, SD_PASS_ORDER_PILLOW_9};
    const char *in = NULL, *out = NULL;
    int decode_only = 0, rc = 0;
    sd_image img = SD_IMAGE_INIT;
    sd_image_status st;
    sd_err err;

    sd_image_opts_default(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            transform_usage(stdout);
            return SD_EXIT_OK;
        } else if (!strcmp(a, "--resolution") || !strcmp(a, "--max-pixels") || !strcmp(a, "--alpha")) {
            char *end;
            long long v;
            if (i + 1 >= argc) {
                fprintf(stderr, "sdtool transform: %s needs a value\n", a);
                return SD_EXIT_USAGE;
            }
            if (!strcmp(a, "--alpha")) {
                const char *p = argv[++i];
                if (!strcmp(p, "drop"))
                    o.alpha = SD_ALPHA_DROP;
                else if (!strcmp(p, "white"))
                    o.alpha = SD_ALPHA_WHITE;
                else {
                    fprintf(stderr, "sdtool transform: --alpha takes 'drop' or 'white', not '%s'\n", p);
                    return SD_EXIT_USAGE;
                }
                continue;
            }
            v = strtoll(argv[++i], &end, 10);
            if (*argv[i] == 0 || *end != 0 || v < 1 || (!strcmp(a, "--resolution") && v > 16384)) {
                fprintf(stderr, "sdtool transform: %s takes a positive integer%s, not '%s'\n", a,
                        !strcmp(a, "--resolution") ? " up to 16384" : "", argv[i]);
                return SD_EXIT_USAGE;
            }
            if (!strcmp(a, "--resolution"))
                to.resolution = (int)v;
            else
                o.max_pixels = v;
        } else if (!strcmp(a, "--exif-transpose")) {
            o.exif_transpose = 1;
        } else if (!strcmp(a, "--lenient-jpeg")) {
            o.strict_jpeg = 0;
        } else if (!strcmp(a, "--pillow-12.2")) {
            to.pass_order = SD_PASS_ORDER_PILLOW_12_2;
        } else if (!strcmp(a, "--pillow-13")) {
            to.pass_order = SD_PASS_ORDER_PILLOW_13;
        } else if (!strcmp(a, "--decode-only")) {
            decode_only = 1;
        } else if (a[0] == '-' && a[1] != 0) {
            fprintf(stderr, "sdtool transform: unknown option '%s' (see sdtool transform --help)\n", a);
            return SD_EXIT_USAGE;
        } else if (!in) {
            in = a;
        } else if (!out) {
            out = a;
        } else {
            fprintf(stderr, "sdtool transform: unexpected argument '%s' (one input, one output)\n", a);
            return SD_EXIT_USAGE;
        }
    }
    if (!in || !out || (!decode_only && to.resolution == 0)) {
        fprintf(stderr, "sdtool transform: %s\n",
                !in || !out ? "needs an input and an output file" : "needs --resolution R");
        transform_usage(stderr);
        return SD_EXIT_USAGE;
    }

    if (sd_same_file(in, out)) {
        fprintf(stderr, "sdtool transform: the output '%s' is the input '%s': it would be overwritten\n", out,
                in);
        return SD_EXIT_USAGE;
    }
    if (!decode_only)
        o.resize_to = to.resolution; /* sizes the transform refuses are refused from the header */
    st = sd_image_decode_file(in, &o, &img, &err);
    if (st != SD_IMG_OK) {
        fprintf(stderr, "sdtool transform: %s [%s]\n", err.msg, sd_image_status_name(st));
        sd_image_free(&img);
        return SD_EXIT_FAILURE;
    }
    if (decode_only) {
        if (sd_image_write_png(out, img.data, img.width, img.height, &err) != 0)
            rc = 1;
    } else {
        uint8_t *px = malloc((size_t)to.resolution * to.resolution * 3);
        if (!px) {
            snprintf(err.msg, sizeof err.msg, "out of memory for a %dx%d result", to.resolution, to.resolution);
            rc = 1;
        } else if (sd_transform_rgb8(img.data, img.width, img.height, &to, px, NULL, &err) != 0 ||
                   sd_image_write_png(out, px, to.resolution, to.resolution, &err) != 0) {
            rc = 1;
        }
        free(px);
    }
    if (rc) {
        fprintf(stderr, "sdtool transform: %s\n", err.msg);
        sd_image_free(&img);
        return SD_EXIT_FAILURE;
    }
    printf("%s: %s %s %dx%d -> %s %dx%d\n", in, sd_image_format_name(img.format), img.mode, img.width,
           img.height, out, decode_only ? img.width : to.resolution, decode_only ? img.height : to.resolution);
    sd_image_free(&img);
    return SD_EXIT_OK;
}
