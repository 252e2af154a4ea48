/* sdtool filter: what &data filter would keep of a dataset, before a preprocessing job spends
 * its allocation finding out. Reads every sample's .json (or an even spread of --max of them),
 * counts the verdicts of the whole filter and of each condition alone, and names the first
 * samples refused. The verdicts are those of mode 'process' (the same sd_meta_filter_eval on the
 * same bytes). */
#include "sd_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "sdtrain/commands.h"
#include "sdtrain/dataset.h"
#include "sdtrain/error.h"
#include "sdtrain/metafilter.h"
#include "sdtrain/timer.h"

#define N_SHOWN 8

static void filter_usage(FILE *f)
{
    fprintf(f,
            "usage: sdtool filter --filter TEXT [--format auto|files|webdataset] [--max N]\n"
            "                     [--threads N] INPUT\n"
            "\n"
            "Counts what &data filter = TEXT would keep of the dataset INPUT (an img2dataset folder,\n"
            "a webdataset tar, folder or pattern, as &data input): every sample's .json is read\n"
            "and judged as mode 'process' judges it. Prints how many pass, are filtered and have\n"
            "metadata that cannot answer (no .json, no such field, another kind), the same for\n"
            "each condition alone, and the first samples refused with the reason.\n"
            "\n"
            "  --filter TEXT   the filter, as in the namelist (doc/datasets.md)\n"
            "  --format F      &data input_format (default auto; tsv has no metadata)\n"
            "  --max N         judge N samples spread evenly over the dataset (a preview of a\n"
            "                  large one), not all\n"
            "  --threads N     OpenMP threads (default: OMP_NUM_THREADS or the cores)\n"
            "\n"
            "exit status: 0 counted, 1 the storage failed a read, 2 bad usage or input (a filter\n"
            "that does not parse, a dataset that cannot be opened or has no metadata).\n");
}

static double pct(int64_t a, int64_t n)
{
    return n > 0 ? 100.0 * (double)a / (double)n : 0.0;
}

int sd_cmd_filter(int argc, char **argv)
{
    const char *text = NULL, *format = "auto", *input = NULL;
    int64_t max = 0;
    int threads = 0;
    sd_meta_filter f;
    sd_dataset ds;
    sd_err err;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            filter_usage(stdout);
            return SD_EXIT_OK;
        }
        if (!strcmp(a, "--filter") || !strcmp(a, "--format") || !strcmp(a, "--max") ||
            !strcmp(a, "--threads")) {
            char *end;
            if (i + 1 >= argc) {
                fprintf(stderr, "sdtool filter: %s needs a value\n", a);
                return SD_EXIT_USAGE;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--filter")) {
                text = v;
            } else if (!strcmp(a, "--format")) {
                format = v;
            } else {
                errno = 0;
                const long long x = strtoll(v, &end, 10);
                if (errno || end == v || *end || x < 1 || (!strcmp(a, "--threads") && x > 4096)) {
                    fprintf(stderr, "sdtool filter: %s wants a positive integer, not '%s'\n", a, v);
                    return SD_EXIT_USAGE;
                }
                if (!strcmp(a, "--max"))
                    max = x;
                else
                    threads = (int)x;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "sdtool filter: unknown option '%s'\n", a);
            filter_usage(stderr);
            return SD_EXIT_USAGE;
        } else if (input) {
            fprintf(stderr, "sdtool filter: one INPUT only ('%s', then '%s')\n", input, a);
            return SD_EXIT_USAGE;
        } else {
            input = a;
        }
    }
    if (!text || !input) {
        filter_usage(stderr);
        return SD_EXIT_USAGE;
    }
    memset(&err, 0, sizeof err);
    if (sd_meta_filter_parse(text, &f, &err)) {
        fprintf(stderr, "sdtool filter: %s\n", err.msg);
        return SD_EXIT_USAGE;
    }
    if (f.n == 0) {
        fprintf(stderr, "sdtool filter: the filter '%s' has no condition\n", text);
        return SD_EXIT_USAGE;
    }
    memset(&ds, 0, sizeof ds);
    if (sd_dataset_open(input, format, &ds, &err)) {
        fprintf(stderr, "sdtool filter: %s\n", err.msg);
        return err.storage ? SD_EXIT_FAILURE : SD_EXIT_USAGE;
    }
    if (ds.format == SD_DATASET_TSV) {
        fprintf(stderr, "sdtool filter: %s is a tsv manifest, which has no per-sample metadata\n",
                input);
        sd_dataset_close(&ds);
        return SD_EXIT_USAGE;
    }
    const int64_t n = sd_dataset_count(&ds), m = max > 0 && max < n ? max : n;
#ifdef _OPENMP
    if (threads > 0)
        omp_set_num_threads(threads);
#endif
    /* counts: [0] passes, [1] filtered, [2] cannot answer; per condition the same */
    int64_t all[3] = {0, 0, 0}, each[SD_FILTER_MAX_CONDS][3];
    int64_t shown_at[N_SHOWN];
    char shown[N_SHOWN][600];
    int n_shown = 0, storage = 0;
    sd_err storage_err;
    memset(each, 0, sizeof each);
    memset(&storage_err, 0, sizeof storage_err);
    const double t0 = sd_time_now();
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        sd_sample s;
        int64_t mine[3] = {0, 0, 0}, mine_each[SD_FILTER_MAX_CONDS][3];
        memset(&s, 0, sizeof s);
        memset(mine_each, 0, sizeof mine_each);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 64)
#endif
        for (int64_t j = 0; j < m; j++) {
            /* an even spread: j * n / m, without overflow for any count */
            const int64_t i = m == n ? j : (int64_t)((double)j * (double)n / (double)m);
            char why[400];
            sd_err e;
            int has, v, vc[SD_FILTER_MAX_CONDS];
            memset(&e, 0, sizeof e);
            has = sd_dataset_read_json(&ds, i, &s, &e);
            if (has < 0) {
                if (e.storage) {
#ifdef _OPENMP
#pragma omp critical(filter_storage)
#endif
                    if (!storage) {
                        storage = 1;
                        storage_err = e;
                    }
                }
                snprintf(why, sizeof why, "%.390s", e.msg);
                v = -1; /* no condition can be answered: counted so below */
                for (int c = 0; c < f.n; c++)
                    vc[c] = -1;
            } else {
                v = sd_meta_filter_eval_each(&f, has ? (const char *)s.json : NULL, s.json_size,
                                             vc, why, sizeof why);
            }
            mine[v == 1 ? 0 : v == 0 ? 1 : 2]++;
            for (int c = 0; c < f.n; c++)
                mine_each[c][vc[c] == 1 ? 0 : vc[c] == 0 ? 1 : 2]++;
            if (v != 1) {
#ifdef _OPENMP
#pragma omp critical(filter_shown)
#endif
                {
                    /* the N_SHOWN refused samples of lowest index, whatever the threads did */
                    int at = n_shown;
                    while (at > 0 && shown_at[at - 1] > i)
                        at--;
                    if (at < N_SHOWN) {
                        if (n_shown == N_SHOWN)
                            n_shown--;
                        memmove(&shown_at[at + 1], &shown_at[at],
                                (size_t)(n_shown - at) * sizeof shown_at[0]);
                        memmove(&shown[at + 1], &shown[at], (size_t)(n_shown - at) * sizeof shown[0]);
                        shown_at[at] = i;
                        snprintf(shown[at], sizeof shown[at], "%s: %s: %s", sd_dataset_key(&ds, i),
                                 v == 0 ? "filtered" : "no_metadata", why);
                        n_shown++;
                    }
                }
            }
        }
#ifdef _OPENMP
#pragma omp critical(filter_sum)
#endif
        {
            for (int k = 0; k < 3; k++)
                all[k] += mine[k];
            for (int c = 0; c < f.n; c++)
                for (int k = 0; k < 3; k++)
                    each[c][k] += mine_each[c][k];
        }
        sd_sample_free(&s);
    }
    const double secs = sd_time_now() - t0;
    if (storage) {
        fprintf(stderr, "sdtool filter: %s\n", storage_err.msg);
        sd_dataset_close(&ds);
        return SD_EXIT_FAILURE;
    }
    printf("dataset: %s (%s, %lld samples; %lld judged%s in %.2f s)\n", input,
           sd_dataset_format_name(ds.format), (long long)n, (long long)m,
           m < n ? ", spread evenly" : "", secs);
    printf("filter: %s\n", text);
    printf("  %-12s %12lld  %5.1f %%\n", "kept", (long long)all[0], pct(all[0], m));
    printf("  %-12s %12lld  %5.1f %%\n", "filtered", (long long)all[1], pct(all[1], m));
    printf("  %-12s %12lld  %5.1f %%\n", "no_metadata", (long long)all[2], pct(all[2], m));
    printf("each condition alone: true / false / cannot answer\n");
    for (int c = 0; c < f.n; c++) {
        char cond[SD_FILTER_KEY_MAX + SD_FILTER_STR_MAX + 40];
        const sd_filter_cond *x = &f.c[c];
        if (x->is_string)
            snprintf(cond, sizeof cond, "%s %s \"%s\"", x->key, sd_filter_op_name(x->op), x->str);
        else
            snprintf(cond, sizeof cond, "%s %s %.10g", x->key, sd_filter_op_name(x->op), x->num);
        printf("  %-40s %12lld %12lld %12lld\n", cond, (long long)each[c][0], (long long)each[c][1],
               (long long)each[c][2]);
    }
    if (n_shown) {
        printf("first samples refused:\n");
        for (int k = 0; k < n_shown; k++)
            printf("  %s\n", shown[k]);
    }
    sd_dataset_close(&ds);
    return SD_EXIT_OK;
}
