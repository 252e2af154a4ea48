/* Monotonic wall-clock time and accumulating interval timers for step-time breakdowns. */
#ifndef SDTRAIN_TIMER_H
#define SDTRAIN_TIMER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on CLOCK_MONOTONIC: only differences mean anything, and they are immune to clock
 * adjustments (NTP, the user setting the date) that would corrupt step times. */
double sd_time_now(void);

/* Sums the lengths of start/stop intervals, e.g. the data-loading part of every step. It
 * measures host wall time: to time GPU work, synchronize (or use CUDA events) before stop. */
typedef struct sd_timer {
    double total;   /* seconds over all completed intervals */
    double started; /* sd_time_now() at the last start, when running */
    uint64_t count; /* completed intervals */
    int running;
} sd_timer;

/* Zero total and count, not running. A zero-initialised sd_timer is already in this state. */
void sd_timer_reset(sd_timer *t);

/* Begins an interval. Starting a running timer restarts the current interval. */
void sd_timer_start(sd_timer *t);

/* Ends the interval: adds its length to the total, counts it and returns it. Returns 0 and
 * changes nothing when the timer is not running. */
double sd_timer_stop(sd_timer *t);

double sd_timer_total(const sd_timer *t);
uint64_t sd_timer_count(const sd_timer *t);
/* total / count, or 0 before the first interval. */
double sd_timer_mean(const sd_timer *t);

#ifdef __cplusplus
}
#endif
#endif
