/* Bump allocator for activation memory (see sdtrain/arena.h). */
#include "sdtrain/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int alignment_ok(size_t alignment)
{
    return alignment >= SD_ARENA_MIN_ALIGNMENT && (alignment & (alignment - 1)) == 0;
}

static void set_empty(sd_arena *a, size_t alignment)
{
    memset(a, 0, sizeof *a);
    a->alignment = alignment;
}

int sd_arena_init(sd_arena *a, size_t capacity, size_t alignment)
{
    if (alignment == 0)
        alignment = SD_ARENA_DEFAULT_ALIGNMENT;
    set_empty(a, alignment);
    if (!alignment_ok(alignment))
        return -1;
    if (capacity == 0)
        return 0;
    /* C11 aligned_alloc wants a size that is a multiple of the alignment. */
    if (capacity > SIZE_MAX - (alignment - 1))
        return -1;
    size_t rounded = (capacity + alignment - 1) & ~(alignment - 1);
    unsigned char *base = aligned_alloc(alignment, rounded);
    if (!base)
        return -1;
    a->base = base;
    a->capacity = capacity;
    a->owns_base = 1;
    return 0;
}

int sd_arena_init_external(sd_arena *a, void *base, size_t capacity, size_t alignment)
{
    if (alignment == 0)
        alignment = SD_ARENA_DEFAULT_ALIGNMENT;
    set_empty(a, alignment);
    if (!alignment_ok(alignment) || (!base && capacity > 0) ||
        ((uintptr_t)base & (alignment - 1)) != 0)
        return -1;
    a->base = base;
    a->capacity = capacity;
    return 0;
}

int sd_arena_init_measure(sd_arena *a, size_t alignment)
{
    if (alignment == 0)
        alignment = SD_ARENA_DEFAULT_ALIGNMENT;
    set_empty(a, alignment);
    if (!alignment_ok(alignment))
        return -1;
    a->capacity = SIZE_MAX;
    a->measuring = 1;
    return 0;
}

void *sd_arena_alloc(sd_arena *a, size_t bytes)
{
    size_t mask = a->alignment - 1;
    /* Overflow checks first: a wrapped offset would pass the capacity test. */
    if (a->used > SIZE_MAX - mask)
        return NULL;
    size_t start = (a->used + mask) & ~mask;
    if (bytes > a->capacity || start > a->capacity - bytes)
        return NULL;
    a->used = start + bytes;
    if (a->used > a->high_water)
        a->high_water = a->used;
    if (a->measuring || !a->base)
        return NULL;
    return a->base + start;
}

size_t sd_arena_mark(const sd_arena *a)
{
    return a->used;
}

void sd_arena_reset_to(sd_arena *a, size_t mark)
{
    if (mark <= a->used)
        a->used = mark;
}

void sd_arena_reset(sd_arena *a)
{
    a->used = 0;
}

size_t sd_arena_used(const sd_arena *a)
{
    return a->used;
}

size_t sd_arena_high_water(const sd_arena *a)
{
    return a->high_water;
}

size_t sd_arena_capacity(const sd_arena *a)
{
    return a->capacity;
}

int sd_arena_is_measuring(const sd_arena *a)
{
    return a->measuring;
}

void sd_arena_free(sd_arena *a)
{
    size_t alignment = a->alignment ? a->alignment : SD_ARENA_DEFAULT_ALIGNMENT;
    if (a->owns_base)
        free(a->base);
    set_empty(a, alignment);
}
