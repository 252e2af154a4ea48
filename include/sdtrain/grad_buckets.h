/* Gradient buckets: the flat gradient buffer cut into pieces that are reduced between the ranks
 * while the backward still runs (doc/training.md "Gradient reduction").
 *
 * The U-Net's backward finishes its gradients from the end of the buffer towards the start and
 * says so through sd_unet_trainer_set_ready_hook ("[from, n) is final"). The buckets are cut
 * so that each one lies inside one rank's shard (ZeRO-2 reduces a bucket to the rank that owns
 * it) and holds at most a given number of floats; they are listed from the end of the buffer to
 * its start, the order in which they become complete, and handed to a launch function in that
 * order, each as soon as the backward has finished all of it. Every rank cuts the same buckets
 * and launches them in the same order, as collectives need. */
#ifndef SDTRAIN_GRAD_BUCKETS_H
#define SDTRAIN_GRAD_BUCKETS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sd_grad_bucket {
    size_t begin, end; /* floats of the flat buffer, begin < end */
    int owner;         /* the rank whose shard holds it */
} sd_grad_bucket;

typedef void (*sd_grad_bucket_fn)(void *user, const sd_grad_bucket *b);

typedef struct sd_grad_buckets {
    sd_grad_bucket *b; /* from the end of the buffer to its start */
    int count;
    int launched;      /* buckets handed to fn since sd_grad_buckets_begin */
    size_t frontier;   /* everything from here on is final */
    size_t n;
    sd_grad_bucket_fn fn;
    void *user;
} sd_grad_buckets;

/* Cuts [0, bounds[P]) with the shards [bounds[r], bounds[r+1]) of P ranks (bounds[0] = 0,
 * non-decreasing; empty shards get no bucket): each shard into the fewest pieces of at most
 * max_floats (at least `align`), of equal length rounded up to a multiple of `align` from the
 * shard's start (the last piece takes the rest). */
void sd_grad_buckets_init(sd_grad_buckets *g, const size_t *bounds, int P, size_t max_floats,
                          size_t align, sd_grad_bucket_fn fn, void *user);
void sd_grad_buckets_free(sd_grad_buckets *g);

/* A new backward: nothing is final, nothing launched. */
void sd_grad_buckets_begin(sd_grad_buckets *g);
/* [from, n) is final: launches, in order, every bucket that now lies wholly inside it. `from`
 * may not grow within one backward (checked). A function of the sd_unet_ready_fn type. */
void sd_grad_buckets_ready(void *g, size_t from);
/* The backward is over: launches what is left (nothing when the last ready call said 0). */
void sd_grad_buckets_finish(sd_grad_buckets *g);

#ifdef __cplusplus
}
#endif
#endif
