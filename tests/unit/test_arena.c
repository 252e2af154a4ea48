/* TAP tests of the activation arena: alignment, exhaustion, marks, and the measuring mode. */
#include "sdtrain/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

static int aligned(const void *p, size_t alignment)
{
    return ((uintptr_t)p & (alignment - 1)) == 0;
}

static void test_basic(void)
{
    sd_arena a;
    tap_ok(sd_arena_init(&a, 4096, 0) == 0, "init 4096 bytes, default alignment");
    tap_ok(a.alignment == 256 && sd_arena_capacity(&a) == 4096, "default alignment is 256");
    void *p = sd_arena_alloc(&a, 10);
    void *q = sd_arena_alloc(&a, 300);
    void *r = sd_arena_alloc(&a, 1);
    tap_ok(p && q && r, "three allocations succeed");
    tap_ok(aligned(p, 256) && aligned(q, 256) && aligned(r, 256), "all are 256-byte aligned");
    tap_ok((char *)q - (char *)p == 256 && (char *)r - (char *)q == 512,
           "allocations are packed at the next aligned offset");
    tap_ok(sd_arena_used(&a) == 769, "used = end of the last allocation (%zu)", sd_arena_used(&a));
    /* Memory is really usable (ASan checks the whole range). */
    memset(p, 1, 10);
    memset(q, 2, 300);
    memset(r, 3, 1);
    tap_ok(((unsigned char *)p)[9] == 1 && ((unsigned char *)q)[299] == 2, "memory is writable");

    size_t mark = sd_arena_mark(&a);
    void *big = sd_arena_alloc(&a, 4096 - 1024);
    tap_ok(big != NULL && sd_arena_used(&a) == 4096, "an allocation may fill the arena exactly");
    memset(big, 4, 4096 - 1024);
    tap_ok(sd_arena_alloc(&a, 1) == NULL, "a full arena returns NULL");
    tap_ok(sd_arena_used(&a) == 4096, "a failed allocation changes nothing");
    tap_ok(sd_arena_high_water(&a) == 4096, "high water 4096");

    sd_arena_reset_to(&a, mark);
    tap_ok(sd_arena_used(&a) == 769, "reset_to restores the mark");
    void *again = sd_arena_alloc(&a, 100);
    tap_ok(again == big, "after reset_to the same address comes back");
    sd_arena_reset_to(&a, 4000);
    tap_ok(sd_arena_used(&a) == 1024 + 100, "a mark beyond the position is ignored");
    sd_arena_reset(&a);
    tap_ok(sd_arena_used(&a) == 0 && sd_arena_high_water(&a) == 4096,
           "reset empties the arena and keeps the high water");
    tap_ok(sd_arena_alloc(&a, 5000) == NULL && sd_arena_used(&a) == 0,
           "a request larger than the capacity fails");
    tap_ok(sd_arena_alloc(&a, SIZE_MAX) == NULL, "SIZE_MAX fails without overflow");
    sd_arena_alloc(&a, 1);
    tap_ok(sd_arena_alloc(&a, SIZE_MAX - 100) == NULL, "offset + size overflow fails");
    void *z = sd_arena_alloc(&a, 0);
    tap_ok(z != NULL && aligned(z, 256) && sd_arena_used(&a) == 256,
           "a 0-byte request returns the aligned position");
    sd_arena_free(&a);
    tap_ok(a.base == NULL && sd_arena_used(&a) == 0 && sd_arena_capacity(&a) == 0, "free empties");
    sd_arena_free(&a);
    tap_ok(1, "free twice is harmless");
}

static void test_alignment_rules(void)
{
    sd_arena a;
    tap_ok(sd_arena_init(&a, 100, 32) == -1, "alignment 32 (< 64) is rejected");
    sd_arena_free(&a);
    tap_ok(sd_arena_init(&a, 100, 96) == -1, "alignment 96 (not a power of two) is rejected");
    sd_arena_free(&a);
    tap_ok(sd_arena_init(&a, 100, 64) == 0, "alignment 64 is accepted");
    void *p = sd_arena_alloc(&a, 1), *q = sd_arena_alloc(&a, 1);
    tap_ok(aligned(p, 64) && (char *)q - (char *)p == 64, "64-byte packing");
    tap_ok(sd_arena_alloc(&a, 1) == NULL, "capacity 100 holds two 64-aligned bytes only");
    sd_arena_free(&a);
    tap_ok(sd_arena_init(&a, 3000, 4096) == 0, "alignment 4096 with a smaller capacity");
    p = sd_arena_alloc(&a, 3000);
    tap_ok(p && aligned(p, 4096), "page-aligned allocation");
    memset(p, 0, 3000);
    sd_arena_free(&a);
    tap_ok(sd_arena_init(&a, 0, 0) == 0 && sd_arena_alloc(&a, 1) == NULL &&
               sd_arena_alloc(&a, 0) == NULL,
           "capacity 0: every allocation returns NULL");
    sd_arena_free(&a);
    tap_ok(sd_arena_init(&a, SIZE_MAX, 0) == -1, "an impossible capacity fails cleanly");
    sd_arena_free(&a);
}

static void test_external(void)
{
    sd_arena a;
    unsigned char *buf = aligned_alloc(256, 2048);
    if (!buf)
        tap_skip_all("out of memory");
    tap_ok(sd_arena_init_external(&a, buf + 64, 1024, 256) == -1, "a misaligned base is rejected");
    tap_ok(sd_arena_init_external(&a, NULL, 1024, 256) == -1, "a NULL base with capacity is rejected");
    tap_ok(sd_arena_init_external(&a, buf, 2048, 0) == 0, "external buffer accepted");
    void *p = sd_arena_alloc(&a, 2000);
    tap_ok(p == buf, "first allocation is at the base");
    sd_arena_free(&a);
    buf[0] = 7; /* ASan would object if the arena had freed it */
    tap_ok(buf[0] == 7, "free leaves an external buffer alone");
    free(buf);
}

/* A pretend forward pass: the same allocation sequence for planning and for real. */
static int fake_forward(sd_arena *a, int batch)
{
    const size_t sizes[] = {4u * 64 * 64 * 4, 320u * 64 * 64 * 4, 17, 1, 640u * 32 * 32 * 4, 999};
    int failures = 0;
    size_t mark = sd_arena_mark(a);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = sd_arena_alloc(a, sizes[i] * (size_t)batch);
        if (!p && !sd_arena_is_measuring(a))
            failures++;
        if (i == 2) {
            /* a temporary released before the next layer */
            size_t inner = sd_arena_mark(a);
            void *tmp = sd_arena_alloc(a, 123456);
            if (!tmp && !sd_arena_is_measuring(a))
                failures++;
            sd_arena_reset_to(a, inner);
        }
    }
    sd_arena_reset_to(a, mark);
    return failures;
}

static void test_measure(void)
{
    sd_arena plan, real;
    tap_ok(sd_arena_init_measure(&plan, 0) == 0, "measuring arena");
    tap_ok(sd_arena_is_measuring(&plan) && sd_arena_capacity(&plan) == SIZE_MAX,
           "measuring arena has unbounded capacity");
    tap_ok(sd_arena_alloc(&plan, 100) == NULL && sd_arena_used(&plan) == 100,
           "measuring alloc returns NULL but counts");
    sd_arena_reset(&plan);
    tap_ok(fake_forward(&plan, 2) == 0, "dry run");
    size_t need = sd_arena_high_water(&plan);
    tap_diag("measured plan: %zu bytes", need);
    tap_ok(need > 0 && sd_arena_used(&plan) == 0, "dry run measured %zu bytes", need);

    tap_ok(sd_arena_init(&real, need, 0) == 0, "real arena of the measured size");
    tap_ok(fake_forward(&real, 2) == 0, "the real pass fits exactly");
    tap_ok(sd_arena_high_water(&real) == need, "same high water as measured");
    sd_arena_free(&real);

    tap_ok(sd_arena_init(&real, need - 1, 0) == 0, "arena one byte short");
    tap_ok(fake_forward(&real, 2) > 0, "one byte short fails");
    sd_arena_free(&real);
    sd_arena_free(&plan);
    tap_ok(sd_arena_init_measure(&plan, 48) == -1, "measuring arena checks alignment too");
}

int main(void)
{
    test_basic();
    test_alignment_rules();
    test_external();
    test_measure();
    return tap_done();
}
