/* Benchmark: CLIP tokenizer throughput (captions/s) on one core, one caption per line of a file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_stats.h"
#include "sdtrain/tokenizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: bench/tokenizer [--vocab PATH] [--min-time S] [--no-count] CAPTIONS.txt\n"
            "Tokenizes every line of CAPTIONS.txt (held in memory) to 77 ids on the calling thread,\n"
            "repeating passes for at least S seconds (default 3), and prints the load time and the\n"
            "median captions/s and microseconds per caption over the passes. PATH is a .gz merges\n"
            "file, a diffusers snapshot or a tokenizer folder (default $%s, else\n"
            "tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz under $srcdir or .). --no-count passes\n"
            "NULL for the length before truncation, so long captions stop after 75 ids.\n"
            "tests/reference/bench_tokenizer.py runs this against transformers' CLIPTokenizer.\n",
            SD_TOKENIZER_ENV);
}

int main(int argc, char **argv)
{
    const char *vocab = getenv(SD_TOKENIZER_ENV), *file = NULL;
    double min_time = 3.0;
    int count = 1;
    char deflt[4096];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--vocab") && i + 1 < argc)
            vocab = argv[++i];
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--no-count"))
            count = 0;
        else if (argv[i][0] != '-' && !file)
            file = argv[i];
        else {
            usage();
            return 2;
        }
    }
    if (!file) {
        usage();
        return 2;
    }
    if (!vocab || !*vocab) {
        const char *srcdir = getenv("srcdir");
        snprintf(deflt, sizeof deflt, "%s/tests/data/tokenizer/bpe_simple_vocab_16e6.txt.gz",
                 srcdir && *srcdir ? srcdir : ".");
        vocab = deflt;
    }

    FILE *f = fopen(file, "rb");
    if (!f) {
        perror(file);
        return 1;
    }
    size_t n = 0, cap = 1024, bytes = 0;
    char **lines = malloc(cap * sizeof *lines);
    size_t *lens = malloc(cap * sizeof *lens);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    while ((got = getline(&line, &lcap, f)) >= 0) {
        if (got > 0 && line[got - 1] == '\n')
            got--;
        if (n == cap) {
            cap *= 2;
            lines = realloc(lines, cap * sizeof *lines);
            lens = realloc(lens, cap * sizeof *lens);
        }
        lines[n] = malloc((size_t)got + 1);
        memcpy(lines[n], line, (size_t)got);
        lens[n++] = (size_t)got;
        bytes += (size_t)got;
    }
    free(line);
    fclose(f);
    if (n == 0) {
        fprintf(stderr, "%s: no captions\n", file);
        return 1;
    }

    sd_tokenizer *tok;
    sd_err err;
    double t0 = now_s();
    if (sd_tokenizer_load(vocab, &tok, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double load_s = now_s() - t0;

    int32_t ids[SD_TOKENIZER_LENGTH];
    long checksum = 0;
    int nt;
    for (size_t i = 0; i < n; i++) { /* warm-up pass */
        sd_tokenize(tok, lines[i], lens[i], ids, count ? &nt : NULL);
        checksum += ids[1];
    }
    /* as many passes as --min-time takes (the array grows: short files need many) */
    size_t rcap = 1024;
    double *rates = malloc(rcap * sizeof *rates);
    int passes = 0;
    double start = now_s();
    if (!rates)
        return 1;
    while (passes < 3 || now_s() - start < min_time) {
        if ((size_t)passes == rcap) {
            double *more = realloc(rates, 2 * rcap * sizeof *rates);
            if (!more)
                break;
            rates = more;
            rcap *= 2;
        }
        double p0 = now_s();
        for (size_t i = 0; i < n; i++) {
            sd_tokenize(tok, lines[i], lens[i], ids, count ? &nt : NULL);
            checksum += ids[1];
        }
        rates[passes++] = (double)n / (now_s() - p0);
    }
    qsort(rates, (size_t)passes, sizeof *rates, cmp_double);
    double med = bench_sorted_median(rates, passes);
    printf("vocabulary\t%s\nload_s\t%.3f\ncaptions\t%zu\nmean_bytes\t%.1f\npasses\t%d\n", vocab, load_s, n,
           (double)bytes / (double)n, passes);
    printf("captions_per_s\t%.0f\nus_per_caption\t%.3f\nmin_max_captions_per_s\t%.0f\t%.0f\nchecksum\t%ld\n", med,
           1e6 / med, rates[0], rates[passes - 1], checksum);
    free(rates);
    sd_tokenizer_free(tok);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
    free(lens);
    return 0;
}
