/* Looking model parameters up by name once, checking their shapes against the configuration
 * and collecting every mismatch into one message (used by the CLIP and VAE builders). */
#ifndef SDTRAIN_MODELS_RESOLVER_H
#define SDTRAIN_MODELS_RESOLVER_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "sdtrain/error.h"
#include "sdtrain/models.h"

typedef struct sd_resolver {
    const sd_param_table *t;
    const unsigned char *base; /* the flat parameter buffer */
    size_t esize;              /* bytes per element of that buffer */
    unsigned char *used;       /* per table entry: looked up */
    int problems;
    char first[600];           /* the first problem, for the message */
} sd_resolver;

void sd_resolver_init(sd_resolver *r, const sd_param_table *t, const void *base, size_t esize);

/* The tensor named by fmt with PyTorch shape [ndim]shape (a linear weight may also be listed
 * as a 1x1 conv, same bytes), or NULL after recording the problem. */
const void *sd_resolver_vget(sd_resolver *r, int ndim, const int64_t *shape, const char *fmt, va_list ap);

/* 0 when every tensor was found with its shape and every table entry was used; else -1 with
 * "<what> parameters do not fit the configuration: ..." in err. Frees the resolver's memory
 * either way. */
int sd_resolver_finish(sd_resolver *r, const char *what, sd_err *err);

#endif
