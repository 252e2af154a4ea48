/* Check macros: on failure print statement, function, file:line and rank, then end the whole job. */
#ifndef SDTRAIN_CHECK_H
#define SDTRAIN_CHECK_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* How a fatal error ends the job. The default exits the process; the MPI runtime installs a
 * handler that calls MPI_Abort so that no rank is left waiting in a collective. */
typedef void (*sd_abort_fn)(int exit_code);
void sd_set_abort_handler(sd_abort_fn fn);

/* Prints "[rank r] [t] file:func():line: what: detail (hint)" to stderr and ends the job.
 * `detail` and `hint` may be NULL. Never returns. */
void sd_fatal_report(const char *file, int line, const char *func, const char *what,
                     const char *detail, const char *hint)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;

/* Like sd_fatal_report with a printf-formatted detail. */
void sd_fatalf(const char *file, int line, const char *func, const char *what, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((noreturn, format(printf, 5, 6)))
#endif
    ;

/* Ends the job through the installed handler (after the message has been printed). */
void sd_abort(int exit_code)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;

/* SD_CHECK(cond, "printf format", ...): an invariant that must hold. */
#define SD_CHECK(cond, ...)                                                                   \
    do {                                                                                      \
        if (!(cond))                                                                          \
            sd_fatalf(__FILE__, __LINE__, __func__, "check failed: " #cond, __VA_ARGS__);     \
    } while (0)

/* SD_SYS_CHECK(call): a libc/POSIX call returning -1 (or NULL via SD_PTR_CHECK) with errno. */
void sd_fatal_errno(const char *file, int line, const char *func, const char *stmt, int err)
#if defined(__GNUC__)
    __attribute__((noreturn))
#endif
    ;
#define SD_SYS_CHECK(call)                                                                    \
    do {                                                                                      \
        if ((call) < 0)                                                                       \
            sd_fatal_errno(__FILE__, __LINE__, __func__, #call, errno);                       \
    } while (0)

/* Allocation that cannot fail silently: ends the job with the size that was asked for. */
void *sd_xmalloc_at(size_t bytes, const char *file, int line, const char *func);
void *sd_xcalloc_at(size_t n, size_t size, const char *file, int line, const char *func);
void *sd_xrealloc_at(void *p, size_t bytes, const char *file, int line, const char *func);
char *sd_xstrdup_at(const char *s, const char *file, int line, const char *func);
#define sd_xmalloc(bytes) sd_xmalloc_at((bytes), __FILE__, __LINE__, __func__)
#define sd_xcalloc(n, size) sd_xcalloc_at((n), (size), __FILE__, __LINE__, __func__)
#define sd_xrealloc(p, bytes) sd_xrealloc_at((p), (bytes), __FILE__, __LINE__, __func__)
#define sd_xstrdup(s) sd_xstrdup_at((s), __FILE__, __LINE__, __func__)

#ifdef __cplusplus
}
#endif
#endif
