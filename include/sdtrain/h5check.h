/* HDF5 checks: SD_H5_CHECK ends the job with the HDF5 error stack; helpers for returned errors. */
#ifndef SDTRAIN_H5CHECK_H
#define SDTRAIN_H5CHECK_H

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/fsutil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The header is self-contained (static inline) so that every module using HDF5 can include it
 * without a link dependency on the shard code. */

typedef struct sd_h5_errbuf {
    char *buf;
    size_t size;
} sd_h5_errbuf;

/* Keeps the innermost (first-pushed) message of the stack: it names the real cause ("unable to
 * open file", "no space left"), while the outer ones only repeat the API call. */
static inline herr_t sd_h5_walk_innermost_(unsigned n, const H5E_error2_t *e, void *data)
{
    sd_h5_errbuf *b = (sd_h5_errbuf *)data;
    if (n == 0 && b->size > 0)
        snprintf(b->buf, b->size, "%s (in %s)", e->desc ? e->desc : "unknown HDF5 error",
                 e->func_name ? e->func_name : "?");
    return 0;
}

static inline const char *sd_h5_stack_string_(hid_t stack, char *buf, size_t size)
{
    sd_h5_errbuf b = {buf, size};
    if (size)
        buf[0] = '\0';
    H5Ewalk2(stack, H5E_WALK_UPWARD, sd_h5_walk_innermost_, &b);
    if (size && !buf[0])
        snprintf(buf, size, "unknown HDF5 error");
    return buf;
}

/* Writes the innermost message of the current HDF5 error stack into buf and returns buf, for
 * sd_err messages of errors that are reported, not fatal. Call it right after the failing
 * call: the next HDF5 API call clears the stack. */
static inline const char *sd_h5_error_string(char *buf, size_t size)
{
    return sd_h5_stack_string_(H5E_DEFAULT, buf, size);
}

/* The errno a file driver put in the current HDF5 error stack ("..., errno = 5, error message =
 * 'Input/output error', ..." from sec2's failed reads, writes and opens), the innermost one; 0
 * when no entry carries one (the library refused what it read: a bad signature or checksum).
 * Call it right after the failing call, as sd_h5_error_string. */
static inline herr_t sd_h5_walk_errno_(unsigned n, const H5E_error2_t *e, void *data)
{
    int *out = (int *)data;
    const char *p = NULL;
    (void)n;
    /* the last "errno = " of the text: the file name comes before it and may contain one */
    for (const char *q = e->desc ? strstr(e->desc, "errno = ") : NULL; q; q = strstr(q + 1, "errno = "))
        p = q;
    if (!*out && p) {
        int v = 0;
        if (sscanf(p + 8, "%d", &v) == 1 && v > 0)
            *out = v;
    }
    return 0;
}

static inline int sd_h5_error_errno(void)
{
    int e = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, sd_h5_walk_errno_, &e);
    return e;
}

/* That errno when it is a storage failure (sd_storage_errno), else 0. */
static inline int sd_h5_storage_errno(void)
{
    const int e = sd_h5_error_errno();
    return sd_storage_errno(e) ? e : 0;
}

/* Prints the whole HDF5 error stack, then reports and ends the job through sd_fatal_report
 * (MPI_Abort under the MPI runtime, so no rank waits in a collective). */
static inline void sd_h5_fatal(const char *file, int line, const char *func, const char *stmt)
{
    char msg[512];
    H5E_auto2_t fn = NULL;
    void *data = NULL;
    /* A copy first: querying the automatic-printing setting may clear the live stack. */
    hid_t stack = H5Eget_current_stack();
    sd_h5_stack_string_(stack, msg, sizeof msg);
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    /* With automatic printing on, HDF5 has shown the stack already. */
    if (!fn) {
        fprintf(stderr, "HDF5 error stack:\n");
        H5Eprint2(stack, stderr);
    }
    H5Eclose_stack(stack);
    sd_fatal_report(file, line, func, stmt, msg, NULL);
}

/* SD_H5_CHECK(call): an HDF5 call that must not fail (negative hid_t/herr_t/htri_t). For
 * failures that bad input can cause (a missing or foreign file), test the value and return an
 * sd_err instead. */
#define SD_H5_CHECK(call)                                                                     \
    do {                                                                                      \
        if ((call) < 0)                                                                       \
            sd_h5_fatal(__FILE__, __LINE__, __func__, #call);                                 \
    } while (0)

/* Silences HDF5's automatic error printing while a library function handles errors itself;
 * the previous handler is restored by sd_h5_quiet_end so callers' settings survive. */
typedef struct sd_h5_quiet {
    H5E_auto2_t fn;
    void *data;
} sd_h5_quiet;

static inline void sd_h5_quiet_begin(sd_h5_quiet *q)
{
    q->fn = NULL;
    q->data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &q->fn, &q->data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

static inline void sd_h5_quiet_end(const sd_h5_quiet *q)
{
    H5Eset_auto2(H5E_DEFAULT, q->fn, q->data);
}

#ifdef __cplusplus
}
#endif
#endif
