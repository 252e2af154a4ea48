/* Statistics shared by the benchmarks. */
#ifndef SDTRAIN_BENCH_STATS_H
#define SDTRAIN_BENCH_STATS_H

/* The median of n >= 1 values sorted ascending: the middle one, or the mean of the middle two
 * (as Python's statistics.median, which the PyTorch peers use). */
static inline double bench_sorted_median(const double *v, int n)
{
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
