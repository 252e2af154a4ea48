/* TAP tests of the monotonic clock and the accumulating timers. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* nanosleep under -std=c11 */
#endif
#include "sdtrain/timer.h"

#include <time.h>

#include "tap.h"

static void sleep_seconds(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0) {
        /* interrupted: sleep the remainder */
    }
}

int main(void)
{
    struct timespec resolution;
    if (clock_getres(CLOCK_MONOTONIC, &resolution) != 0)
        tap_skip_all("CLOCK_MONOTONIC is not available");
    tap_diag("CLOCK_MONOTONIC resolution %ld ns", (long)resolution.tv_nsec);

    double t0 = sd_time_now();
    tap_ok(t0 > 0.0, "sd_time_now is positive (%.3f s)", t0);
    int monotonic = 1;
    double prev = t0;
    for (int i = 0; i < 100000; i++) {
        double now = sd_time_now();
        if (now < prev)
            monotonic = 0;
        prev = now;
    }
    tap_ok(monotonic, "100000 successive readings never go back");
    tap_ok(prev - t0 < 5.0, "reading the clock is cheap (%.4f s for 1e5)", prev - t0);

    double before = sd_time_now();
    sleep_seconds(0.02);
    double slept = sd_time_now() - before;
    /* Upper bound generous for loaded CI machines. */
    tap_ok(slept >= 0.0199 && slept < 2.0, "a 20 ms sleep measures %.4f s", slept);

    sd_timer t = {0};
    tap_ok(sd_timer_total(&t) == 0.0 && sd_timer_count(&t) == 0 && sd_timer_mean(&t) == 0.0,
           "a zeroed timer is empty");
    tap_ok(sd_timer_stop(&t) == 0.0 && sd_timer_count(&t) == 0, "stop without start is ignored");
    double sum = 0;
    for (int i = 0; i < 3; i++) {
        sd_timer_start(&t);
        sleep_seconds(0.01);
        sum += sd_timer_stop(&t);
    }
    tap_ok(sd_timer_count(&t) == 3, "three intervals counted");
    tap_ok(sd_timer_total(&t) == sum, "total is the sum of the returned intervals");
    tap_ok(sd_timer_total(&t) >= 0.0299 && sd_timer_total(&t) < 3.0,
           "three 10 ms intervals total %.4f s", sd_timer_total(&t));
    tap_ok(sd_timer_mean(&t) >= 0.00999 && sd_timer_mean(&t) * 3 == sd_timer_total(&t),
           "mean %.4f s", sd_timer_mean(&t));

    /* Time outside intervals is not counted. */
    double total = sd_timer_total(&t);
    sleep_seconds(0.02);
    sd_timer_start(&t);
    sd_timer_stop(&t);
    tap_ok(sd_timer_total(&t) - total < 0.015, "time between intervals is not counted");

    sd_timer_reset(&t);
    tap_ok(sd_timer_total(&t) == 0.0 && sd_timer_count(&t) == 0 && !t.running, "reset empties");
    return tap_done();
}
