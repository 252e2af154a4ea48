/* The shard manifest's read, as a follow-mode trainer's rank 0 does it at every commit: a
 * manifest of N shards (each with its planned range, as the writers print it since 2026-11-27)
 * written to a folder, then read with sd_shard_manifest_read (the scanner of the writer's layout)
 * and, for comparison in the same run, the same file's bytes given to the json-c reader.
 *
 *   bench/manifest_read [N ...] [--reps R]      (default: 1000 10000 50000, 7 repetitions)
 *
 * Prints, per N: the file's size, the median (min-max) of each reader and their ratio. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_stats.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/shards.h"
#include "sdtrain/timer.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(sd_shard_manifest *m, int64_t n)
{
    memset(m, 0, sizeof *m);
    m->n = n;
    m->entries = calloc((size_t)n + 1, sizeof *m->entries);
    for (int64_t k = 0; k < n; k++) {
        sd_shard_entry *e = &m->entries[k];
        e->index = k;
        e->samples = 4096;
        e->bytes = 1385000000 + k;
        e->resolution = 512;
        e->checksum = 0x9e3779b97f4a7c15ULL * (uint64_t)(k + 1);
        sd_shard_file_name(k, e->file, sizeof e->file);
        e->has_range = 1;
        e->range.first = 4096 * k;
        e->range.samples = 4096;
        e->range.key_hash = 0xcbf29ce484222325ULL ^ (uint64_t)k;
        m->total_samples += e->samples;
    }
}

int main(int argc, char **argv)
{
    int64_t sizes[16];
    int n_sizes = 0, reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (n_sizes < 16)
            sizes[n_sizes++] = atoll(argv[i]);
    }
    if (!n_sizes) {
        sizes[0] = 1000, sizes[1] = 10000, sizes[2] = 50000;
        n_sizes = 3;
    }
    if (reps < 1 || reps > 1000) {
        fprintf(stderr, "manifest_read: --reps from 1 to 1000\n");
        return 2;
    }
    char dir[] = "/tmp/sdtrain-manifest-XXXXXX", path[64];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/%s", dir, SD_SHARD_MANIFEST);
    printf("%-8s %-9s %-28s %-28s %s\n", "shards", "MB", "scanner s, median (min-max)",
           "json-c s, median (min-max)", "json-c / scanner");
    double *t[2];
    t[0] = calloc((size_t)reps, sizeof(double));
    t[1] = calloc((size_t)reps, sizeof(double));
    for (int s = 0; s < n_sizes; s++) {
        sd_shard_manifest m, r;
        sd_err err;
        size_t len;
        fill(&m, sizes[s]);
        char *text = sd_shard_manifest_text(&m, &len);
        if (sd_write_file_atomic(path, text, len, &err)) {
            fprintf(stderr, "manifest_read: %s\n", err.msg);
            return 1;
        }
        for (int k = 0; k < reps; k++) {
            double t0 = sd_time_now();
            if (sd_shard_manifest_read(dir, &r, &err) || r.n != m.n) {
                fprintf(stderr, "manifest_read: %s\n", err.msg);
                return 1;
            }
            t[0][k] = sd_time_now() - t0;
            sd_shard_manifest_free(&r);
            /* the same work without the scanner: the file's bytes, then json-c */
            char *buf;
            size_t blen;
            t0 = sd_time_now();
            if (sd_read_regular_file(path, (size_t)1 << 30, "a manifest", &buf, &blen, &err) ||
                sd_shard_manifest_parse_json(path, buf, blen, &r, &err) || r.n != m.n) {
                fprintf(stderr, "manifest_read: %s\n", err.msg);
                return 1;
            }
            t[1][k] = sd_time_now() - t0;
            free(buf);
            sd_shard_manifest_free(&r);
        }
        char col[2][64];
        for (int w = 0; w < 2; w++) {
            qsort(t[w], (size_t)reps, sizeof(double), cmp_double);
            snprintf(col[w], sizeof col[w], "%.4f (%.4f-%.4f)", bench_sorted_median(t[w], reps),
                     t[w][0], t[w][reps - 1]);
        }
        printf("%-8lld %-9.2f %-28s %-28s %.1fx\n", (long long)sizes[s], (double)len / 1e6, col[0],
               col[1], bench_sorted_median(t[1], reps) / bench_sorted_median(t[0], reps));
        free(text);
        free(m.entries);
    }
    unlink(path);
    rmdir(dir);
    free(t[0]);
    free(t[1]);
    return 0;
}
