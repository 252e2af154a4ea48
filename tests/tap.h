/* Minimal TAP producer for the C unit tests (run by automake's tap-driver.sh). */
#ifndef SDTRAIN_TESTS_TAP_H
#define SDTRAIN_TESTS_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int tap_count_ = 0;
static int tap_failed_ = 0;

/* Reports one test point; returns cond so callers can chain diagnostics. */
static inline int tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    tap_count_++;
    if (!cond)
        tap_failed_++;
    printf("%s %d - ", cond ? "ok" : "not ok", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return cond;
}

/* A diagnostic line, shown in the test log. */
static inline void tap_diag(const char *fmt, ...)
{
    va_list ap;
    printf("# ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* One test point skipped: "ok N # SKIP <why>" (automake counts it as a skip). */
static inline void tap_skip(const char *fmt, ...)
{
    va_list ap;
    tap_count_++;
    printf("ok %d # SKIP ", tap_count_);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* Skips the whole program: the plan says 0 tests and why. */
static inline void tap_skip_all(const char *why)
{
    printf("1..0 # SKIP %s\n", why);
    fflush(stdout);
    exit(0);
}

/* Prints the trailing plan and returns the exit status for main(). */
static inline int tap_done(void)
{
    printf("1..%d\n", tap_count_);
    fflush(stdout);
    return tap_failed_ ? 1 : 0;
}

#endif
