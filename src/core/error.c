/* Error values (sd_err) for code that reports bad input to its caller. */
#include "sdtrain/error.h"

#include <stdio.h>
#include <string.h>

int sd_err_vset(sd_err *e, const char *fmt, va_list ap)
{
    if (e) {
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        e->line = 0;
        e->col = 0;
        e->storage = 0;
        e->input = 0;
    }
    return -1;
}

int sd_err_set_storage(sd_err *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sd_err_vset(e, fmt, ap);
    va_end(ap);
    if (e)
        e->storage = 1;
    return -1;
}

int sd_err_set(sd_err *e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sd_err_vset(e, fmt, ap);
    va_end(ap);
    return -1;
}

int sd_err_at(sd_err *e, const char *source, int line, int col, const char *fmt, ...)
{
    va_list ap;
    size_t n;
    if (!e)
        return -1;
    n = (size_t)snprintf(e->msg, sizeof e->msg, "%s:%d:%d: ", source ? source : "<input>", line, col);
    if (n >= sizeof e->msg)
        n = sizeof e->msg - 1;
    va_start(ap, fmt);
    vsnprintf(e->msg + n, sizeof e->msg - n, fmt, ap);
    va_end(ap);
    e->line = line;
    e->col = col;
    e->storage = 0;
    e->input = 0;
    return -1;
}

void sd_err_clear(sd_err *e)
{
    if (e)
        memset(e, 0, sizeof *e);
}
