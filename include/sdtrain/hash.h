/* The 64-bit mixing function of the project's hashes and checksums. */
#ifndef SDTRAIN_HASH_H
#define SDTRAIN_HASH_H

#include <stdint.h>

/* MurmurHash3's 64-bit finalizer (fmix64): every input bit flips each output bit with
 * probability about 1/2. Files depend on it (the sd-keyhash-v1 validation split, checkpoint
 * and shard checksums): never change it. The tokenizer's in-memory tables use it too. */
static inline uint64_t sd_fmix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

#endif
