/* Logging: rank-0 information, any-rank warnings and errors with "[rank r]" and elapsed time. */
#ifndef SDTRAIN_LOG_H
#define SDTRAIN_LOG_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SD_LOG_DEBUG = 0, SD_LOG_INFO = 1, SD_LOG_WARN = 2, SD_LOG_ERROR = 3 } sd_log_level;

/* Records this process's rank (for prefixes and rank-0 filtering) and starts the clock.
 * Before it is called the process counts as rank 0 of 1 (single-process tools). */
void sd_log_init(int rank, int size);
int sd_log_rank(void);
void sd_log_set_level(sd_log_level level);
sd_log_level sd_log_get_level(void);
/* "debug", "info", "warn", "error" -> level; returns -1 for anything else. */
int sd_log_level_from_name(const char *name);
double sd_log_elapsed(void);

/* Which rank prints sd_info: world rank 0 by default; in a pipeline job rank 0 of each half
 * (both report progress), so the caller passes 1 there and 0 elsewhere. */
void sd_log_set_info_leader(int leader);

/* Rank 0 only (see sd_log_set_info_leader), stdout: progress and results. */
void sd_info(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Any rank, stdout, only at debug level. */
void sd_debug(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Any rank, stderr, prefixed "[rank r] [t] warning: ". */
void sd_warn(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
/* Any rank, stderr, prefixed "[rank r] [t] error: ". Does not stop anything. */
void sd_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

#ifdef __cplusplus
}
#endif
#endif
