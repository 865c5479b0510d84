/*
 * Block patterns shared by kvx-bench and the tests: every 8-byte word of a block is derived from
 * (salt, source block, round), so a block that travelled names its origin and its round.
 */
#ifndef KVX_TOOLS_PATTERN_H
#define KVX_TOOLS_PATTERN_H

#include <stdint.h>

void kvx_pattern_fill(uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                      uint64_t round);
/* 0 when the block holds the pattern, else 1 + the index of the first wrong word. */
uint64_t kvx_pattern_check(const uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                           uint64_t round);

#endif
