/* png_compare A B MAXDIFF: two images (PNG or JPEG) of the same size, decoded to RGB8. Prints the
 * largest and the mean absolute difference of their samples; exit 0 when the largest is
 * <= MAXDIFF (0..255), 1 when it is larger, 2 on bad input (a file that does not decode, other
 * sizes). For comparing images generated on the GPU with the CPU's (tests/gpu/sample.sh). */
#include <stdio.h>
#include <stdlib.h>

#include "sdtrain/image.h"

int main(int argc, char **argv)
{
    sd_image a = SD_IMAGE_INIT, b = SD_IMAGE_INIT;
    sd_err err;
    char *end;
    if (argc != 4) {
        fprintf(stderr, "usage: png_compare A B MAXDIFF\n");
        return 2;
    }
    const long maxdiff = strtol(argv[3], &end, 10);
    if (*end || maxdiff < 0 || maxdiff > 255) {
        fprintf(stderr, "png_compare: MAXDIFF '%s' is not a whole number from 0 to 255\n", argv[3]);
        return 2;
    }
    if (sd_image_decode_file(argv[1], NULL, &a, &err) != SD_IMG_OK ||
        sd_image_decode_file(argv[2], NULL, &b, &err) != SD_IMG_OK) {
        fprintf(stderr, "png_compare: %s\n", err.msg);
        return 2;
    }
    if (a.width != b.width || a.height != b.height) {
        fprintf(stderr, "png_compare: %s is %dx%d, %s is %dx%d\n", argv[1], a.width, a.height,
                argv[2], b.width, b.height);
        return 2;
    }
    const size_t n = (size_t)a.width * (size_t)a.height * 3;
    int worst = 0;
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        const int d = abs((int)a.data[i] - (int)b.data[i]);
        worst = d > worst ? d : worst;
        sum += d;
    }
    printf("%s vs %s: %dx%d, largest difference %d, mean %.3f (of 255)\n", argv[1], argv[2],
           a.width, a.height, worst, n ? sum / (double)n : 0.0);
    sd_image_free(&a);
    sd_image_free(&b);
    return worst <= maxdiff ? 0 : 1;
}
