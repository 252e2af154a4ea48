/* Fatal-error reporting behind the SD_CHECK family; ends the job through a replaceable handler. */
#include "sdtrain/check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/log.h"

static void default_abort(int exit_code)
{
    exit(exit_code);
}

static sd_abort_fn abort_handler = default_abort;

void sd_set_abort_handler(sd_abort_fn fn)
{
    abort_handler = fn ? fn : default_abort;
}

void sd_abort(int exit_code)
{
    abort_handler(exit_code);
    exit(exit_code); /* a handler must not return; make sure of it */
}

void sd_fatal_report(const char *file, int line, const char *func, const char *what,
                     const char *detail, const char *hint)
{
    fprintf(stderr, "[rank %d] [%9.3fs] fatal: %s:%s():%d: %s%s%s%s%s%s\n", sd_log_rank(),
            sd_log_elapsed(), file, func, line, what, detail ? ": " : "", detail ? detail : "",
            hint ? " (" : "", hint ? hint : "", hint ? ")" : "");
    fflush(stderr);
    fflush(stdout);
    sd_abort(1);
}

void sd_fatalf(const char *file, int line, const char *func, const char *what, const char *fmt, ...)
{
    char detail[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    sd_fatal_report(file, line, func, what, detail[0] ? detail : NULL, NULL);
}

void sd_fatal_errno(const char *file, int line, const char *func, const char *stmt, int err)
{
    sd_fatal_report(file, line, func, stmt, strerror(err), NULL);
}

static void out_of_memory(size_t bytes, const char *file, int line, const char *func)
{
    char detail[128];
    snprintf(detail, sizeof detail, "cannot allocate %zu bytes", bytes);
    sd_fatal_report(file, line, func, "out of memory", detail, NULL);
}

void *sd_xmalloc_at(size_t bytes, const char *file, int line, const char *func)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        out_of_memory(bytes, file, line, func);
    return p;
}

void *sd_xcalloc_at(size_t n, size_t size, const char *file, int line, const char *func)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        out_of_memory(n * size, file, line, func);
    return p;
}

void *sd_xrealloc_at(void *p, size_t bytes, const char *file, int line, const char *func)
{
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q)
        out_of_memory(bytes, file, line, func);
    return q;
}

char *sd_xstrdup_at(const char *s, const char *file, int line, const char *func)
{
    size_t n = strlen(s) + 1;
    char *p = sd_xmalloc_at(n, file, line, func);
    memcpy(p, s, n);
    return p;
}
