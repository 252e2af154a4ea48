/* Bump allocator for activation memory: sized once by a dry run, then reused every step. */
#ifndef SDTRAIN_ARENA_H
#define SDTRAIN_ARENA_H

/*
 * An arena hands out aligned slices of one buffer by moving an offset forward; nothing is
 * freed individually. A training step marks the arena, allocates its activations, and resets
 * to the mark, so the same addresses come back every step and nothing is allocated in the loop.
 *
 * Three kinds of arena, one set of functions:
 *   - owning:    sd_arena_init() makes one aligned host allocation that sd_arena_free() releases;
 *   - external:  sd_arena_init_external() carves a buffer the caller owns (e.g. device memory
 *                from cudaMalloc); the arena never dereferences it, and sd_arena_free() leaves it;
 *   - measuring: sd_arena_init_measure() has no memory at all. It does the same offset
 *                arithmetic but sd_arena_alloc() always returns NULL, so a model's dry run (one
 *                that plans shapes without launching kernels) can size the real arena:
 *                capacity = sd_arena_high_water() after the dry run. Code that must tell "full"
 *                from "measuring" asks sd_arena_is_measuring(). NULL rather than a fake pointer,
 *                because a fake pointer that slipped into a kernel would corrupt memory instead
 *                of failing at once.
 * Every allocation starts at a multiple of the arena's alignment from its base, and the base is
 * itself aligned, so the offsets (and so the total) of a given sequence of allocations are the
 * same in all three kinds: a measured high-water mark is exactly the capacity needed.
 *
 * Not thread-safe: one arena per thread or per stream of work.
 */

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SD_ARENA_DEFAULT_ALIGNMENT 256 /* cudaMalloc's guarantee; also covers AVX-512 */
#define SD_ARENA_MIN_ALIGNMENT 64      /* a cache line */

typedef struct sd_arena {
    unsigned char *base; /* NULL when measuring */
    size_t capacity;     /* usable bytes; SIZE_MAX when measuring */
    size_t alignment;
    size_t used;         /* offset of the first free byte (end of the last allocation) */
    size_t high_water;   /* largest `used` since init */
    int owns_base;       /* base was allocated by sd_arena_init */
    int measuring;
} sd_arena;

/* One aligned allocation of `capacity` bytes. `alignment` 0 means SD_ARENA_DEFAULT_ALIGNMENT;
 * otherwise it must be a power of two >= SD_ARENA_MIN_ALIGNMENT. Capacity 0 is allowed: nothing
 * is allocated and every sd_arena_alloc returns NULL. Returns 0, or -1 for a bad alignment or
 * when memory cannot be had; on failure *a is left as an empty arena that sd_arena_free accepts. */
int sd_arena_init(sd_arena *a, size_t capacity, size_t alignment);

/* An arena over [base, base + capacity), owned by the caller. `base` must be aligned to
 * `alignment` (same rule as above). Returns 0 or -1. */
int sd_arena_init_external(sd_arena *a, void *base, size_t capacity, size_t alignment);

/* A measuring arena: see the top of this file. Returns 0 or -1 (bad alignment). */
int sd_arena_init_measure(sd_arena *a, size_t alignment);

/* `bytes` bytes at the next aligned offset, or NULL when they do not fit (the arena is then
 * unchanged) and always when measuring (which still advances the offsets). A 0-byte request
 * returns the aligned position without using memory beyond it. The caller reports failures:
 * sd_arena_used, sd_arena_capacity and the request size say by how much it missed. */
void *sd_arena_alloc(sd_arena *a, size_t bytes);

/* The current position, to return to with sd_arena_reset_to. */
size_t sd_arena_mark(const sd_arena *a);

/* Releases everything allocated since `mark`. A mark beyond the current position (one taken
 * before an earlier reset) is ignored, since moving forward would hand out memory twice. */
void sd_arena_reset_to(sd_arena *a, size_t mark);

/* Releases everything (sd_arena_reset_to(a, 0)); the high-water mark is kept. */
void sd_arena_reset(sd_arena *a);

size_t sd_arena_used(const sd_arena *a);
size_t sd_arena_high_water(const sd_arena *a);
size_t sd_arena_capacity(const sd_arena *a); /* SIZE_MAX when measuring */
int sd_arena_is_measuring(const sd_arena *a);

/* Releases the memory of an owning arena and empties any arena. Safe to call twice. */
void sd_arena_free(sd_arena *a);

#ifdef __cplusplus
}
#endif
#endif
