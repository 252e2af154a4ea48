/* Gradient buckets (include/sdtrain/grad_buckets.h). */
#include "sdtrain/grad_buckets.h"

#include <stdlib.h>
#include <string.h>

#include "sdtrain/check.h"

void sd_grad_buckets_init(sd_grad_buckets *g, const size_t *bounds, int P, size_t max_floats,
                          size_t align, sd_grad_bucket_fn fn, void *user)
{
    int cap = 0;
    SD_CHECK(P >= 1 && bounds && bounds[0] == 0, "gradient buckets: %d ranks", P);
    if (align == 0)
        align = 1;
    max_floats = max_floats / align * align; /* so that rounding a piece up cannot pass it */
    if (max_floats < align)
        max_floats = align;
    memset(g, 0, sizeof *g);
    g->n = bounds[P];
    g->fn = fn;
    g->user = user;
    for (int r = 0; r < P; r++) {
        SD_CHECK(bounds[r] <= bounds[r + 1], "gradient buckets: shard %d ends before it begins",
                 r);
        cap += (int)((bounds[r + 1] - bounds[r] + max_floats - 1) / max_floats);
    }
    g->b = sd_xcalloc(cap > 0 ? (size_t)cap : 1, sizeof *g->b);
    /* shards from the last to the first, each cut from its end */
    for (int r = P - 1; r >= 0; r--) {
        const size_t a = bounds[r], len = bounds[r + 1] - a;
        size_t pieces, piece;
        if (len == 0)
            continue;
        pieces = (len + max_floats - 1) / max_floats;
        piece = (len + pieces - 1) / pieces;
        piece = (piece + align - 1) / align * align;
        /* pieces of `piece` from the shard's start; listing them backwards */
        for (size_t k = (len + piece - 1) / piece; k-- > 0;) {
            sd_grad_bucket *b = &g->b[g->count++];
            SD_CHECK(g->count <= cap, "gradient buckets: more pieces than planned");
            b->begin = a + k * piece;
            b->end = a + (k + 1) * piece < a + len ? a + (k + 1) * piece : a + len;
            b->owner = r;
        }
    }
    sd_grad_buckets_begin(g);
}

void sd_grad_buckets_free(sd_grad_buckets *g)
{
    if (!g)
        return;
    free(g->b);
    memset(g, 0, sizeof *g);
}

void sd_grad_buckets_begin(sd_grad_buckets *g)
{
    g->launched = 0;
    g->frontier = g->n;
}

void sd_grad_buckets_ready(void *user, size_t from)
{
    sd_grad_buckets *g = user;
    SD_CHECK(from <= g->frontier,
             "gradient buckets: the backward said [%zu, end) is final after [%zu, end)", from,
             g->frontier);
    g->frontier = from;
    while (g->launched < g->count && g->b[g->launched].begin >= from) {
        if (g->fn)
            g->fn(g->user, &g->b[g->launched]);
        g->launched++;
    }
}

void sd_grad_buckets_finish(sd_grad_buckets *g)
{
    sd_grad_buckets_ready(g, 0);
    SD_CHECK(g->launched == g->count, "gradient buckets: %d of %d launched", g->launched,
             g->count);
}
