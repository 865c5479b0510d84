/*
 * Block patterns shared by kvx-bench and the tests (see pattern.h).
 */
#include "pattern.h"

#define KVX_PATTERN_STEP 0x9e3779b97f4a7c15ull

static uint64_t kvx_pattern_mix(uint64_t z)
{
    z += KVX_PATTERN_STEP;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t kvx_pattern_seed(uint64_t salt, uint64_t src, uint64_t round)
{
    return kvx_pattern_mix(kvx_pattern_mix(kvx_pattern_mix(salt) ^ src) ^ round);
}

void kvx_pattern_fill(uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                      uint64_t round)
{
    uint64_t *w = (uint64_t *)block, s = kvx_pattern_seed(salt, src, round);

    for (uint64_t i = 0; i < block_len / 8; i++)
        w[i] = s + i * KVX_PATTERN_STEP;
}

uint64_t kvx_pattern_check(const uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                           uint64_t round)
{
    const uint64_t *w = (const uint64_t *)block;
    uint64_t s = kvx_pattern_seed(salt, src, round);

    for (uint64_t i = 0; i < block_len / 8; i++)
        if (w[i] != s + i * KVX_PATTERN_STEP)
            return i + 1;
    return 0;
}
