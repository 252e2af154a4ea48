/* The stall watchdog's marks (sdtrain/progress.h, &run stall_timeout): what the work pays for
 * them. Every op and file block ticks, every MPI call and file-system call (pread, pwrite, fsync)
 * is marked on entry and exit, every step and shard sets a phase; the watchdog thread runs beside them as in sdtrain (timeout 1800 s).
 *
 *   bench/progress_marks [--reps R] [--n N]     (default: 7 repetitions of 2e7 marks)
 *
 * Prints, per mark, the median (min-max) nanoseconds a call, and for scale the marks an SD2
 * training step makes (a few thousand ops, some dozen MPI calls) times that, in microseconds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_stats.h"
#include "sdtrain/progress.h"
#include "sdtrain/timer.h"

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void quiet(const char *message, void *user)
{
    (void)message;
    (void)user;
}

enum { TICK, MPI_PAIR, IO_PAIR, PHASE, N_KINDS };

/* ns per call of one kind of mark over n calls */
static double run(int kind, long n)
{
    const double t0 = sd_time_now();
    for (long i = 0; i < n; i++) {
        if (kind == TICK) {
            sd_progress_tick();
        } else if (kind == MPI_PAIR) {
            sd_progress_mpi_enter("MPI_Allreduce(a, b, 1, MPI_INT, MPI_SUM, comm)", __FILE__,
                                  __LINE__);
            sd_progress_mpi_leave();
        } else if (kind == IO_PAIR) {
            sd_progress_io_enter("pread", 0);
            sd_progress_io_leave();
        } else {
            sd_progress_phase("training step", i);
        }
    }
    return (sd_time_now() - t0) / (double)n * 1e9;
}

int main(int argc, char **argv)
{
    int reps = 7;
    long n = 20000000;
    static const char *const names[N_KINDS] = {"tick (op, file block)", "MPI call enter+leave",
                                               "file call enter+leave", "phase (step, shard)"};
    /* marks per SD2 training step, for scale (an estimate of the order: about 1000 ops in the
     * U-Net's forward, twice that in the backward; some 20 MPI calls of the boundary's
     * agreements, the loader and the metrics; a pread or two a sample of a batch of 32 from
     * the loader's threads; one phase) */
    static const double per_step[N_KINDS] = {3000, 20, 64, 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps R] [--n N]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || n < 1) {
        fprintf(stderr, "%s: --reps and --n must be positive\n", argv[0]);
        return 2;
    }
    if (sd_watchdog_start(1800, -1, "&run stall_timeout", quiet, NULL) != 0) {
        perror("sd_watchdog_start");
        return 1;
    }
    printf("%-24s %12s %12s %12s %18s\n", "mark", "ns median", "min", "max", "us per SD2 step");
    for (int k = 0; k < N_KINDS; k++) {
        double *v = malloc((size_t)reps * sizeof *v);
        run(k, n / 10); /* warm-up */
        for (int r = 0; r < reps; r++)
            v[r] = run(k, k == PHASE ? n / 10 : n);
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        const double med = bench_sorted_median(v, reps);
        printf("%-24s %12.2f %12.2f %12.2f %18.3f\n", names[k], med, v[0], v[reps - 1],
               med * per_step[k] * 1e-3);
        free(v);
    }
    sd_watchdog_stop();
    return 0;
}
