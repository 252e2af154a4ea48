/* Monotonic time and accumulating interval timers (see sdtrain/timer.h). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_gettime and CLOCK_MONOTONIC under -std=c11 */
#endif
#include "sdtrain/timer.h"

#include <time.h>

double sd_time_now(void)
{
    struct timespec ts;
    /* CLOCK_MONOTONIC cannot fail on Linux for a valid pointer; nothing to report. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sd_timer_reset(sd_timer *t)
{
    t->total = 0.0;
    t->started = 0.0;
    t->count = 0;
    t->running = 0;
}

void sd_timer_start(sd_timer *t)
{
    t->started = sd_time_now();
    t->running = 1;
}

double sd_timer_stop(sd_timer *t)
{
    if (!t->running)
        return 0.0;
    double elapsed = sd_time_now() - t->started;
    t->total += elapsed;
    t->count++;
    t->running = 0;
    return elapsed;
}

double sd_timer_total(const sd_timer *t)
{
    return t->total;
}

uint64_t sd_timer_count(const sd_timer *t)
{
    return t->count;
}

double sd_timer_mean(const sd_timer *t)
{
    return t->count ? t->total / (double)t->count : 0.0;
}
