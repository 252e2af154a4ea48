/* Training data loader benchmark (MPI): how many samples a second each rank's loader delivers
 * from latent shards of SD2's shapes, against what a GPU training step consumes.
 *
 * Usage:
 *   mpirun -np N bench/loader_io --make DIR [--shards S] [--per-shard P] [--res R] [--dim D]
 *   mpirun -np N bench/loader_io --read DIR [--batch B] [--steps K] [--reps R] [--open M ...]
 *                                 [--window W ...]
 *
 * --make writes S shards of P samples (default 64 x 256) at R px (default 256: moments
 * 8 x 32 x 32) with D-wide caption embeddings (default 1024), fp16 as mode 'process' stores
 * them, random values, into DIR (which must not hold a manifest yet). About 170 KiB a sample at
 * 256 px: the default is 2.7 GiB.
 *
 * --read opens the loader on DIR and times K steps (default 200) of B samples a rank (default
 * 16), prefetch on (as training runs it) and off (the reads alone), for each value of --open
 * (the loader's max_open_shards; default "8 64") and of --window (&data shuffle_window; default
 * 0, the global order), R repetitions each (default 3), alternating.
 * Rank 0 prints per variant the median / min / max of the samples a second a rank delivers
 * (prefetch off: the read rate; prefetch on: the rate a consumer that takes no time sees, i.e.
 * the same bound) and the shard opens a step (from the loader's order: the distinct shards of
 * a rank's batch not among its M most recently used).
 *
 * The files come from the page cache after the first pass unless the machine has too little
 * memory: this measures the CPU side of reading (HDF5, fp16 widening), not the storage.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"
#include "sdtrain/check.h"
#include "sdtrain/loader.h"
#include "sdtrain/rng.h"
#include "sdtrain/shards.h"
#include "sdtrain/timer.h"

#define MAX_REPS 16
#define MAX_OPEN_VARIANTS 8
#define MAX_WINDOW_VARIANTS 4

static void usage(void)
{
    fprintf(stderr, "usage: loader_io --make DIR [--shards S] [--per-shard P] [--res R] [--dim D]\n"
                    "       loader_io --read DIR [--batch B] [--steps K] [--reps R] [--open M ...] "
                    "[--window W ...]\n");
}

static int make_shards(const char *dir, int n_shards, int per_shard, int res, int dim)
{
    int rank, size;
    sd_shard_meta m;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    sd_shard_meta_defaults(&m);
    m.resolution = res;
    m.embed_dim = dim;
    snprintf(m.weights_path, sizeof m.weights_path, "bench/loader_io");
    snprintf(m.weights_hash, sizeof m.weights_hash, "random");
    const int hs = res / 8, L = m.text_len;
    const size_t mom_n = (size_t)2 * m.latent_channels * hs * hs, emb_n = (size_t)L * dim;
    /* this rank's slice of each shard: contiguous, in rank order */
    const int mine = per_shard / size + (rank < per_shard % size ? 1 : 0);
    const int first = rank * (per_shard / size) + (rank < per_shard % size ? rank : per_shard % size);
    float *mom = sd_xmalloc((size_t)(mine ? mine : 1) * mom_n * sizeof *mom);
    float *emb = sd_xmalloc((size_t)(mine ? mine : 1) * emb_n * sizeof *emb);
    float *empty = sd_xcalloc(emb_n, sizeof *empty);
    int32_t *ids = sd_xcalloc((size_t)(mine ? mine : 1) * L, sizeof *ids);
    char **keys = sd_xcalloc((size_t)(mine ? mine : 1), sizeof *keys);
    const char **caps = sd_xcalloc((size_t)(mine ? mine : 1), sizeof *caps);
    double t0 = sd_time_now();
    for (int s = 0; s < n_shards; s++) {
        sd_shard_entry e;
        sd_err err;
        for (int i = 0; i < mine; i++) {
            const uint64_t sample = (uint64_t)s * per_shard + first + i;
            free(keys[i]);
            keys[i] = sd_xmalloc(32);
            snprintf(keys[i], 32, "%05d/%09llu", s, (unsigned long long)sample);
            caps[i] = "a random caption of a benchmark sample";
            SD_CHECK(sd_rng_fill_normal(7, 1, 0, sample, mom + (size_t)i * mom_n, mom_n) == 0 &&
                         sd_rng_fill_normal(7, 2, 0, sample, emb + (size_t)i * emb_n, emb_n) == 0,
                     "sample %llu", (unsigned long long)sample);
        }
        sd_shard_batch b = {mine, SD_LATENT_NCHW, mom, emb, ids, caps, (const char *const *)keys, NULL};
        if (sd_shard_write(MPI_COMM_WORLD, dir, s, &m, empty, &b, &e, &err) != 0) {
            if (rank == 0)
                fprintf(stderr, "loader_io: %s\n", err.msg);
            return 1;
        }
    }
    if (rank == 0)
        printf("wrote %d shards of %d samples (%d px, embeddings %d x %d, fp16) to %s in %.1f s\n",
               n_shards, per_shard, res, L, dim, dir, sd_time_now() - t0);
    for (int i = 0; i < mine; i++)
        free(keys[i]);
    free(keys);
    free(caps);
    free(ids);
    free(empty);
    free(emb);
    free(mom);
    return 0;
}

/* Shard opens a step of an LRU of `cap` files over this rank's batches of steps [0, steps). */
static double opens_per_step(sd_loader *l, int steps, int cap)
{
    int64_t lru[256];
    int n = 0;
    int64_t opens = 0;
    sd_err err;
    const sd_loader_batch *b;
    double wait;
    SD_CHECK(cap <= 256, "cap %d", cap);
    SD_CHECK(sd_loader_seek(l, 0, &err) == 0, "%s", err.msg);
    for (int s = 0; s < steps; s++) {
        SD_CHECK(sd_loader_next(l, &b, &wait, &err) == 0, "%s", err.msg);
        for (int i = 0; i < b->count; i++) {
            const int64_t shard = b->ids[i].shard;
            int at = -1;
            for (int k = 0; k < n; k++)
                if (lru[k] == shard)
                    at = k;
            if (at < 0) {
                opens++;
                at = n < cap ? n++ : cap - 1; /* the least recent goes */
            }
            memmove(lru + 1, lru, (size_t)at * sizeof *lru);
            lru[0] = shard;
        }
    }
    return (double)opens / steps;
}

static int read_shards(const char *dir, int batch, int steps, int reps, const int *open, int n_open,
                       const int *window, int n_window)
{
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double rate[MAX_WINDOW_VARIANTS][MAX_OPEN_VARIANTS][2][MAX_REPS];
    double per_step[MAX_WINDOW_VARIANTS][MAX_OPEN_VARIANTS];
    sd_loader_info info = {0};
    for (int r = 0; r < reps; r++)
        for (int w = 0; w < n_window; w++)
            for (int v = 0; v < n_open; v++)
                for (int pf = 0; pf < 2; pf++) {
                    sd_loader_options o;
                    sd_loader *l;
                    sd_err err;
                    const sd_loader_batch *b;
                    double wait;
                    sd_loader_options_defaults(&o);
                    o.shard_dir = dir;
                    o.val_fraction = 0;
                    o.batch_per_rank = batch;
                    o.seed = 1234 + (uint64_t)r;
                    o.prefetch = pf;
                    o.max_open_shards = open[v];
                    o.shuffle_window = window[w];
                    if (sd_loader_open(MPI_COMM_WORLD, &o, &l, &err) != 0) {
                        if (rank == 0)
                            fprintf(stderr, "loader_io: %s\n", err.msg);
                        return 1;
                    }
                    info = *sd_loader_get_info(l);
                    if (r == 0 && pf == 0) {
                        double mine = opens_per_step(l, steps, open[v]), all;
                        MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
                        per_step[w][v] = all / size;
                        SD_CHECK(sd_loader_seek(l, 0, &err) == 0, "%s", err.msg);
                    }
                    MPI_Barrier(MPI_COMM_WORLD);
                    const double t0 = sd_time_now();
                    for (int s = 0; s < steps; s++)
                        SD_CHECK(sd_loader_next(l, &b, &wait, &err) == 0, "%s", err.msg);
                    double t = sd_time_now() - t0, slowest;
                    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                    rate[w][v][pf][r] = (double)steps * batch / slowest;
                    sd_loader_close(l);
                }
    if (rank == 0) {
        printf("%lld samples in %lld shards (%d px, embeddings %d x %d); %d rank(s) x %d samples, "
               "%d steps, %d repetitions\n\n",
               (long long)info.n_samples, (long long)info.n_shards, info.resolution, info.text_len,
               info.embed_dim, size, batch, steps, reps);
        printf("| shuffle window | open shards | prefetch | samples/s a rank: median | min | max | "
               "shard opens a step |\n|---|---|---|---|---|---|---|\n");
        for (int w = 0; w < n_window; w++)
            for (int v = 0; v < n_open; v++)
                for (int pf = 0; pf < 2; pf++) {
                    double sorted[MAX_REPS];
                    memcpy(sorted, rate[w][v][pf], (size_t)reps * sizeof *sorted);
                    for (int i = 1; i < reps; i++)
                        for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
                            const double x = sorted[j];
                            sorted[j] = sorted[j - 1];
                            sorted[j - 1] = x;
                        }
                    printf("| %d | %d | %s | %.0f | %.0f | %.0f | %.2f |\n", window[w], open[v],
                           pf ? "on" : "off", bench_sorted_median(sorted, reps), sorted[0],
                           sorted[reps - 1], per_step[w][v]);
                }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *make = NULL, *read = NULL;
    int n_shards = 64, per_shard = 256, res = 256, dim = 1024;
    int batch = 16, steps = 200, reps = 3, open[MAX_OPEN_VARIANTS] = {8, 64}, n_open = 0, rank, rc;
    int window[MAX_WINDOW_VARIANTS] = {0}, n_window = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    for (int i = 1; i < argc; i++) {
        const int more = i + 1 < argc;
        if (!strcmp(argv[i], "--make") && more)
            make = argv[++i];
        else if (!strcmp(argv[i], "--read") && more)
            read = argv[++i];
        else if (!strcmp(argv[i], "--shards") && more)
            n_shards = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--per-shard") && more)
            per_shard = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--res") && more)
            res = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dim") && more)
            dim = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--batch") && more)
            batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && more)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && more)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--open") && more && n_open < MAX_OPEN_VARIANTS)
            open[n_open++] = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--window") && more && n_window < MAX_WINDOW_VARIANTS)
            window[n_window++] = atoi(argv[++i]);
        else {
            make = read = NULL;
            break;
        }
    }
    if (n_open == 0)
        n_open = 2;
    if (n_window == 0)
        n_window = 1;
    int bad = (!make) == (!read) || n_shards < 1 || per_shard < 1 || res < 8 || res % 8 ||
              dim < 1 || batch < 1 || steps < 1 || reps < 1 || reps > MAX_REPS;
    for (int v = 0; v < n_open; v++)
        bad |= open[v] < 1 || open[v] > 256;
    for (int w = 0; w < n_window; w++)
        bad |= window[w] < 0 || window[w] > SD_LOADER_MAX_SHUFFLE_WINDOW;
    if (bad) {
        if (rank == 0)
            usage();
        MPI_Finalize();
        return 2;
    }
    rc = make ? make_shards(make, n_shards, per_shard, res, dim)
              : read_shards(read, batch, steps, reps, open, n_open, window, n_window);
    MPI_Finalize();
    return rc;
}
