/* Benchmark: decode + resize + center crop (+ normalize) throughput on one core, per input file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_stats.h"
#include "sdtrain/image.h"
#include "sdtrain/transform.h"

/* CPU time of the process by default: on a shared 2-core machine other jobs steal the core
 * and wall time says more about them than about us (--clock wall for elapsed time). */
static clockid_t bench_clock = CLOCK_PROCESS_CPUTIME_ID;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return bench_sorted_median(v, n);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench/transform [--resolution R] [--repeat N] [--min-time S] [--clock cpu|wall] FILE...\n"
            "Times, per file held in memory, on the calling thread: decode (to RGB8), decode + resize +\n"
            "center crop, and that + normalization to float NHWC. Prints one TSV line per file:\n"
            "file  width  height  decode_ms  transform_ms  normalize_ms  (medians)\n");
}

int main(int argc, char **argv)
{
    int res = 512, repeat = 15, nfiles = 0;
    double min_time = 0.3;
    char **files = calloc((size_t)argc, sizeof *files);
    sd_image_decoder *dec = sd_image_decoder_new();
    sd_image img = SD_IMAGE_INIT;
    sd_resize_ws ws = {0};
    sd_image_opts o;
    uint8_t *out;
    float *fout;
    sd_err err;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--resolution") && i + 1 < argc)
            res = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--clock") && i + 1 < argc)
            bench_clock = !strcmp(argv[++i], "wall") ? CLOCK_MONOTONIC : CLOCK_PROCESS_CPUTIME_ID;
        else if (argv[i][0] == '-') {
            usage();
            return 2;
        } else
            files[nfiles++] = argv[i];
    }
    if (!nfiles || res < 1 || repeat < 1 || !dec) {
        usage();
        return 2;
    }
    sd_image_opts_default(&o);
    out = malloc((size_t)res * res * 3);
    fout = malloc((size_t)res * res * 3 * sizeof(float));
    printf("file\twidth\theight\tdecode_ms\ttransform_ms\tnormalize_ms\n");
    for (int f = 0; f < nfiles; f++) {
        uint8_t *buf;
        size_t n;
        double *t_dec = calloc((size_t)repeat, sizeof(double)), *t_tr = calloc((size_t)repeat, sizeof(double)),
               *t_nm = calloc((size_t)repeat, sizeof(double));
        sd_transform_opts to = {res, 0};
        if (sd_image_read_file(files[f], &buf, &n, &err) != SD_IMG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        /* warm-up: buffers reach their size, caches fill */
        if (sd_image_decoder_run(dec, buf, n, files[f], &o, &img, &err) != SD_IMG_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        sd_transform_rgb8(img.data, img.width, img.height, &to, out, &ws, &err);
        for (int r = 0; r < repeat; r++) {
            /* each sample repeats its loop until min_time/repeat has passed, for short images */
            int iters = 0;
            double t0 = now_s(), t1, t2, t3, budget = min_time / repeat;
            do {
                sd_image_decoder_run(dec, buf, n, files[f], &o, &img, &err);
                iters++;
            } while ((t1 = now_s()) - t0 < budget);
            t_dec[r] = (t1 - t0) / iters;
            iters = 0;
            do {
                sd_image_decoder_run(dec, buf, n, files[f], &o, &img, &err);
                sd_transform_rgb8(img.data, img.width, img.height, &to, out, &ws, &err);
                iters++;
            } while ((t2 = now_s()) - t1 < budget);
            t_tr[r] = (t2 - t1) / iters;
            iters = 0;
            do {
                sd_image_decoder_run(dec, buf, n, files[f], &o, &img, &err);
                sd_transform_rgb8(img.data, img.width, img.height, &to, out, &ws, &err);
                sd_normalize_rgb8(out, res, res, SD_LAYOUT_HWC, fout);
                iters++;
            } while ((t3 = now_s()) - t2 < budget);
            t_nm[r] = (t3 - t2) / iters;
        }
        printf("%s\t%d\t%d\t%.4f\t%.4f\t%.4f\n", files[f], img.width, img.height, 1e3 * median(t_dec, repeat),
               1e3 * median(t_tr, repeat), 1e3 * median(t_nm, repeat));
        fflush(stdout);
        free(buf);
        free(t_dec);
        free(t_tr);
        free(t_nm);
    }
    free(out);
    free(fout);
    free(files);
    sd_image_free(&img);
    sd_resize_ws_free(&ws);
    sd_image_decoder_free(dec);
    return 0;
}
