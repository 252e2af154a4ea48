/* Parameter lookup by name with shape checks, shared by the model builders. */
#include "resolver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"
#include "sdtrain/tensor.h"

void sd_resolver_init(sd_resolver *r, const sd_param_table *t, const void *base, size_t esize)
{
    memset(r, 0, sizeof *r);
    r->t = t;
    r->base = base;
    r->esize = esize;
    r->used = sd_xcalloc(t->n ? t->n : 1, 1);
}

const void *sd_resolver_vget(sd_resolver *r, int ndim, const int64_t *shape, const char *fmt, va_list ap)
{
    char name[SD_PARAM_NAME_MAX + 16], s1[96], s2[96];
    const sd_param *p = NULL;
    int ok;
    vsnprintf(name, sizeof name, fmt, ap);
    for (size_t i = 0; i < r->t->n; i++)
        if (!strcmp(r->t->params[i].name, name)) {
            p = &r->t->params[i];
            r->used[i] = 1;
            break;
        }
    if (!p) {
        if (!r->problems++)
            snprintf(r->first, sizeof r->first, "no tensor '%s'", name);
        return NULL;
    }
    ok = p->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = p->shape[i] == shape[i];
    /* a linear weight may be listed as a 1x1 conv (same bytes) */
    if (!ok && ndim == 2 && p->ndim == 4)
        ok = p->shape[0] == shape[0] && p->shape[1] == shape[1] && p->shape[2] == 1 &&
             p->shape[3] == 1;
    if (!ok) {
        if (!r->problems++)
            snprintf(r->first, sizeof r->first, "tensor '%s' is %s, the configuration needs %s",
                     name, sd_shape_str(p->ndim, p->shape, s1, sizeof s1),
                     sd_shape_str(ndim, shape, s2, sizeof s2));
        return NULL;
    }
    return r->base + p->offset * r->esize;
}

int sd_resolver_finish(sd_resolver *r, const char *what, sd_err *err)
{
    size_t unused = 0;
    const char *first_unused = NULL;
    for (size_t i = 0; i < r->t->n; i++)
        if (!r->used[i] && !unused++)
            first_unused = r->t->params[i].name;
    free(r->used);
    r->used = NULL;
    if (r->problems)
        return sd_err_set(err, "%s parameters do not fit the configuration: %s (%d problem%s, %zu unused tensor%s)",
                          what, r->first, r->problems, r->problems == 1 ? "" : "s", unused,
                          unused == 1 ? "" : "s");
    if (unused)
        return sd_err_set(err, "%s parameters do not fit the configuration: '%s' is not used (%zu unused tensor%s)",
                          what, first_unused, unused, unused == 1 ? "" : "s");
    return 0;
}
