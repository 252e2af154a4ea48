/* Error values for library code that meets bad input, and the check macros that end the job. */
#ifndef SDTRAIN_ERROR_H
#define SDTRAIN_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes of sdtrain and sdtool (documented in doc/sdtrain.1). */
enum {
    SD_EXIT_OK = 0,
    SD_EXIT_FAILURE = 1,       /* runtime failure (I/O, MPI, CUDA...) */
    SD_EXIT_USAGE = 2,         /* bad command line or configuration */
    SD_EXIT_NOT_IMPLEMENTED = 3 /* a mode or feature this build cannot run yet */
};

/* An error value: code that can meet bad input (parsers, decoders, loaders) fills one of
 * these and returns non-zero, so that the caller decides to skip, report or stop.
 * The message is complete and self-contained, e.g. "input.nml:3:7: unknown key 'lr'". */
typedef struct sd_err {
    char msg[1024];
    int line; /* 1-based source line when the error is about a text file, else 0 */
    int col;  /* 1-based column, else 0 */
    int storage; /* 1: the storage failed a read (EIO, ESTALE, ...), not the input: a retry may
                  * succeed (mode 'train' ends with status 1, not 2). sd_err_set clears it;
                  * sd_err_set_storage sets it. */
    int input;   /* 1: a file the command reads is at fault (missing, not readable, not a regular
                  * file or a folder), not what it writes: commands that tell the two apart end
                  * with status 2, not 1. sd_err_set clears it (sd_copy_tree sets it). */
} sd_err;

/* Sets the message (printf-style) and returns -1, so `return sd_err_set(e, ...)` reads well.
 * `e` may be NULL (the message is then dropped). */
int sd_err_set(sd_err *e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int sd_err_vset(sd_err *e, const char *fmt, va_list ap);
/* sd_err_set for a failure of the storage: sets e->storage */
int sd_err_set_storage(sd_err *e, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Sets the message prefixed with "source:line:col: " and records line/col; returns -1. */
int sd_err_at(sd_err *e, const char *source, int line, int col, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

void sd_err_clear(sd_err *e);

#ifdef __cplusplus
}
#endif
#endif
