/* Logging with rank prefixes and elapsed time since start-up. */
#include "sdtrain/log.h"

#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "sdtrain/timer.h"

static int log_rank = 0;
static int log_size = 1;
static double log_t0 = -1.0;
static sd_log_level log_level = SD_LOG_INFO;
static int log_leader = -1; /* -1: world rank 0 prints sd_info */

void sd_log_init(int rank, int size)
{
    log_rank = rank;
    log_size = size;
    log_t0 = sd_time_now();
}

int sd_log_rank(void) { return log_rank; }
void sd_log_set_info_leader(int leader) { log_leader = leader != 0; }
void sd_log_set_level(sd_log_level level) { log_level = level; }
sd_log_level sd_log_get_level(void) { return log_level; }

int sd_log_level_from_name(const char *name)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcasecmp(name, names[i]) == 0)
            return i;
    return -1;
}

double sd_log_elapsed(void)
{
    if (log_t0 < 0.0)
        log_t0 = sd_time_now();
    return sd_time_now() - log_t0;
}

static void log_emit(FILE *f, const char *kind, const char *fmt, va_list ap)
{
    char buf[4096];
    int n = 0;
    if (log_size > 1 || f == stderr)
        n = snprintf(buf, sizeof buf, "[rank %d] [%9.3fs] %s", log_rank, sd_log_elapsed(), kind);
    else
        n = snprintf(buf, sizeof buf, "[%9.3fs] %s", sd_log_elapsed(), kind);
    if (n < 0)
        n = 0;
    if ((size_t)n < sizeof buf)
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    /* One fputs per line keeps lines from different ranks from interleaving mid-line. */
    size_t len = strlen(buf);
    if (len + 1 < sizeof buf && (len == 0 || buf[len - 1] != '\n')) {
        buf[len] = '\n';
        buf[len + 1] = '\0';
    }
    fputs(buf, f);
    fflush(f);
}

void sd_info(const char *fmt, ...)
{
    va_list ap;
    if ((log_leader < 0 ? log_rank != 0 : !log_leader) || log_level > SD_LOG_INFO)
        return;
    va_start(ap, fmt);
    log_emit(stdout, "", fmt, ap);
    va_end(ap);
}

void sd_debug(const char *fmt, ...)
{
    va_list ap;
    if (log_level > SD_LOG_DEBUG)
        return;
    va_start(ap, fmt);
    log_emit(stdout, "debug: ", fmt, ap);
    va_end(ap);
}

void sd_warn(const char *fmt, ...)
{
    va_list ap;
    if (log_level > SD_LOG_WARN)
        return;
    va_start(ap, fmt);
    log_emit(stderr, "warning: ", fmt, ap);
    va_end(ap);
}

void sd_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_emit(stderr, "error: ", fmt, ap);
    va_end(ap);
}
