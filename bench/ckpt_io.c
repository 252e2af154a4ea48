/* Checkpoint write benchmark (MPI): the time of sd_ckpt_write for a real parameter table, with
 * and without the read-back of &checkpoint verify, on the file system of --dir.
 *
 * Usage: mpirun -np N bench/ckpt_io [--config sd2|sd2-narrow|tiny] [--dir DIR] [--reps R] [--no-ema]
 *                                   [--ddp] [--alignment BYTES] [--hints 'k=v, ...']
 * Defaults: the SD2-base U-Net's table (865.9 M parameters: 3.46 GB a dataset; sd2-narrow: its
 * shape at 0.8x the width, 0.64x the parameters), DIR . (the
 * checkpoints go to DIR/ckpt_io.run, which must not exist and is removed at the end; nothing
 * else in DIR is touched), 3 repetitions of each variant, an EMA, ZeRO-2 ranges (each
 * rank holds the whole parameter buffer and its shard of the moments and the EMA, as training
 * does). --ddp: every rank holds everything (more memory: four full buffers a rank).
 * --alignment and --hints: &run io_alignment (default 1048576; 0 = packed) and io_hints.
 * --async: instead, each repetition writes one checkpoint at once and one in the background
 * (&checkpoint async), both with the read-back, and the table gives what training waits for
 * (the whole write at once; the start of the background write: the copy of each rank's part and
 * the file's creation) beside the time until the background checkpoint is committed (polled
 * every 10 ms, as training polls at its step boundaries); the copy is reserved first, as
 * training reserves it at its start, and that time is printed apart.
 *
 * Each repetition writes one checkpoint without the read-back and one with it, alternating (so
 * a slow period of the disk falls on both), keep_last = 1. The buffers hold deterministic
 * non-constant values (the checksum does real work). Rank 0 prints the median / min / max
 * seconds of each variant, the GB/s of the file (bytes over the median), and the read-back's
 * share of the time. Note: on a machine whose page cache holds the file, the read-back measures
 * memory, not the disk, unless the kernel drops the pages (POSIX_FADV_DONTNEED, which the
 * read-back asks for; Linux drops clean pages of a local file system).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "bench_stats.h"
#include "sdtrain/check.h"
#include "sdtrain/checkpoint.h"
#include "sdtrain/collectives.h"
#include "sdtrain/fsutil.h"
#include "sdtrain/h5util.h"
#include "sdtrain/models.h"
#include "sdtrain/timer.h"

#include "unet_configs.h"

#define MAX_REPS 100

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void fill(float *x, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((first + i) % 1000003) * 1e-6f - 0.5f;
}

static void usage(void)
{
    fprintf(stderr, "usage: ckpt_io [--config sd2|sd2-narrow|tiny] [--dir DIR] [--reps R] [--no-ema] [--ddp] "
                    "[--alignment BYTES] [--hints 'k=v, ...'] [--async]\n");
}

/* --async: per repetition a checkpoint at once and one in the background, both verified. */
static void bench_async(sd_ckpt_scalars *s, const sd_ckpt_tensors *t, const char *work, int reps,
                        double bytes, int rank)
{
    double at_once[MAX_REPS], held[MAX_REPS], done[MAX_REPS];
    sd_ckpt_async *a = NULL;
    sd_err err;
    size_t copy_bytes = 0;
    /* the copy, allocated and touched as training does at its start */
    MPI_Barrier(MPI_COMM_WORLD);
    const double t_res = sd_time_now();
    if (sd_ckpt_async_reserve(&a, MPI_COMM_WORLD, t, s->has_ema != 0, &copy_bytes, &err)) {
        if (rank == 0)
            fprintf(stderr, "ckpt_io: %s\n", err.msg);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("  the copy of rank 0's part: %.1f MiB, allocated and touched in %.3f s (once, at "
               "the start)\n", (double)copy_bytes / 1048576.0, sd_time_now() - t_res);
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = sd_time_now();
        s->step = s->opt_step = 2 * r + 1;
        if (sd_ckpt_write(MPI_COMM_WORLD, work, s, t, "", (sd_ckpt_keep){1, 0}, 1, NULL, 0,
                          &err)) {
            if (rank == 0)
                fprintf(stderr, "ckpt_io: %s\n", err.msg);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        at_once[r] = sd_time_now() - t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = sd_time_now();
        s->step = s->opt_step = 2 * r + 2;
        if (sd_ckpt_async_start(&a, MPI_COMM_WORLD, work, s, t, "", (sd_ckpt_keep){1, 0}, 1,
                                &err)) {
            if (rank == 0)
                fprintf(stderr, "ckpt_io: %s\n", err.msg);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        held[r] = sd_time_now() - t0;
        while (!sd_ckpt_async_ready(a, MPI_COMM_WORLD)) {
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
        if (sd_ckpt_async_finish(a, NULL, 0, NULL, &err)) {
            if (rank == 0)
                fprintf(stderr, "ckpt_io: %s\n", err.msg);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        done[r] = sd_time_now() - t0;
        if (rank == 0)
            printf("  rep %d  at once %8.3f s   background: held %8.3f s, committed after %8.3f s\n",
                   r + 1, at_once[r], held[r], done[r]);
    }
    sd_ckpt_async_free(a);
    if (rank == 0) {
        double *v[3] = {at_once, held, done}, med[3];
        const char *name[3] = {"at once: training waits for all of it",
                               "background: training waits for the start",
                               "background: committed after"};
        printf("\n| with the read-back (verify) | median s | min s | max s |\n|---|---|---|---|\n");
        for (int i = 0; i < 3; i++) {
            qsort(v[i], (size_t)reps, sizeof(double), cmp_double);
            med[i] = bench_sorted_median(v[i], reps);
            printf("| %s | %.3f | %.3f | %.3f |\n", name[i], med[i], v[i][0], v[i][reps - 1]);
        }
        printf("\ntraining held %.1fx shorter (medians); the checkpoint file is %.2f GB\n",
               med[0] / med[1], bytes / 1e9);
    }
}

int main(int argc, char **argv)
{
    const char *config = "sd2", *dir = ".", *hints = "";
    long long alignment = 1048576;
    char work[4200];
    int reps = 3, ema = 1, ddp = 0, async = 0, rank, size;
    sd_unet_config uc;
    sd_param_table tab;
    sd_ckpt_scalars s;
    sd_ckpt_tensors t;
    double times[2][MAX_REPS];
    sd_err err;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-ema"))
            ema = 0;
        else if (!strcmp(argv[i], "--ddp"))
            ddp = 1;
        else if (!strcmp(argv[i], "--alignment") && i + 1 < argc)
            alignment = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--hints") && i + 1 < argc)
            hints = argv[++i];
        else if (!strcmp(argv[i], "--async"))
            async = 1;
        else {
            if (rank == 0)
                usage();
            MPI_Finalize();
            return 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS ||
        (strcmp(config, "sd2") && strcmp(config, "sd2-narrow") && strcmp(config, "tiny")) ||
        alignment < 0) {
        if (rank == 0)
            usage();
        MPI_Finalize();
        return 2;
    }
    if (sd_h5_set_file_options(hints, alignment, &err) != 0) {
        if (rank == 0)
            fprintf(stderr, "ckpt_io: --hints: %s\n", err.msg);
        MPI_Finalize();
        return 2;
    }
    /* a folder of our own inside DIR: removing it at the end must not take anything else */
    snprintf(work, sizeof work, "%s/ckpt_io.run", dir);
    {
        struct stat st;
        int exists = rank == 0 && stat(work, &st) == 0;
        MPI_Bcast(&exists, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (exists) {
            if (rank == 0)
                fprintf(stderr, "ckpt_io: %s exists (a run going on there, or an interrupted one): "
                        "remove it or give another --dir\n", work);
            MPI_Finalize();
            return 2;
        }
    }
    if (!strcmp(config, "sd2"))
        sd_unet_config_sd2_base(&uc);
    else if (!strcmp(config, "sd2-narrow"))
        bench_sd2_narrow_unet_config(&uc);
    else
        bench_tiny_unet_config(&uc);
    memset(&tab, 0, sizeof tab);
    sd_unet_params(&uc, &tab);

    memset(&t, 0, sizeof t);
    t.table = &tab;
    t.n = tab.total_floats;
    if (ddp) {
        t.begin = 0;
        t.end = t.n;
    } else {
        sd_shard_range(t.n, size, rank, SD_SHARD_ALIGN, &t.begin, &t.end);
    }
    t.params = sd_xmalloc(t.n * sizeof(float));
    t.m = sd_xmalloc((t.end - t.begin + 1) * sizeof(float));
    t.v = sd_xmalloc((t.end - t.begin + 1) * sizeof(float));
    t.ema = ema ? sd_xmalloc((t.end - t.begin + 1) * sizeof(float)) : NULL;
    fill(t.params, 0, t.n);
    fill(t.m, t.begin + 1, t.end - t.begin);
    fill(t.v, t.begin + 2, t.end - t.begin);
    if (t.ema)
        fill(t.ema, t.begin + 3, t.end - t.begin);

    memset(&s, 0, sizeof s);
    s.steps_per_epoch = 1000;
    s.global_batch = size;
    s.batch_per_rank = 1;
    s.seed = 1;
    s.n_ranks = size;
    s.has_ema = ema;
    snprintf(s.sharding, sizeof s.sharding, "%s", ddp ? "none" : "shard_grad_op");

    const double bytes = (3.0 + ema) * (double)t.n * 4.0;
    if (rank == 0)
        printf("checkpoint of %s (%zu floats a dataset, %d datasets, %.2f GB) by %d rank(s), %s, "
               "into %s\n", config, t.n, 3 + ema, bytes / 1e9, size, ddp ? "DDP" : "ZeRO-2",
               work);
    if (async) {
        bench_async(&s, &t, work, reps, bytes, rank);
        reps = 0;
    }
    for (int r = 0; r < reps; r++) {
        for (int verify = 0; verify < 2; verify++) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double t0 = sd_time_now();
            s.step = s.opt_step = 2 * r + verify + 1;
            if (sd_ckpt_write(MPI_COMM_WORLD, work, &s, &t, "", (sd_ckpt_keep){1, 0}, verify,
                              NULL, 0, &err)) {
                if (rank == 0)
                    fprintf(stderr, "ckpt_io: %s\n", err.msg);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            times[verify][r] = sd_time_now() - t0;
            if (rank == 0)
                printf("  rep %d %-26s %8.3f s\n", r + 1, verify ? "write + read-back" : "write",
                       times[verify][r]);
        }
    }
    if (rank == 0 && reps > 0) {
        double med[2];
        printf("\n| variant | median s | min s | max s | GB/s (file / median) |\n|---|---|---|---|---|\n");
        for (int v = 0; v < 2; v++) {
            qsort(times[v], (size_t)reps, sizeof(double), cmp_double);
            med[v] = bench_sorted_median(times[v], reps);
            printf("| %s | %.3f | %.3f | %.3f | %.2f |\n", v ? "write + read-back (verify)" : "write",
                   med[v], times[v][0], times[v][reps - 1], bytes / 1e9 / med[v]);
        }
        printf("\nread-back: +%.3f s a checkpoint (%.0f %% of the write)\n", med[1] - med[0],
               100.0 * (med[1] - med[0]) / med[0]);
    }
    if (rank == 0)
        sd_remove_tree(work, &err);
    free(t.params);
    free(t.m);
    free(t.v);
    free(t.ema);
    sd_param_table_free(&tab);
    MPI_Finalize();
    return 0;
}
