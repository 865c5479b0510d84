/*
 * What kvx-bench, kvx-memcpy and the tests share: block patterns (every 8-byte word of a block is
 * derived from (salt, source block, round), so a block that travelled names its origin and its
 * round), index maps, sizes and clocks.
 */
#ifndef KVX_TOOLS_COMMON_H
#define KVX_TOOLS_COMMON_H

#include <stddef.h>
#include <stdint.h>

void kvx_pattern_fill(uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                      uint64_t round);
/* 0 when the block holds the pattern, else 1 + the index of the first wrong word. */
uint64_t kvx_pattern_check(const uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                           uint64_t round);
/* The same, for a target's own region, which peers write into and read from: unchecked under
 * ThreadSanitizer (common.c says why). */
void kvx_pattern_fill_target(uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                             uint64_t round);
uint64_t kvx_pattern_check_target(const uint8_t *block, uint64_t block_len, uint64_t salt,
                                  uint64_t src, uint64_t round);

/* A run of len bytes at byte offset off of a region filled with kvx_pattern_fill (salt, src,
 * round) as one block: byte x of that region is byte x % 8 of its word x / 8, so a range that
 * travelled at any offset and length names where it came from. 0 when p holds those bytes, else
 * 1 + the index of the first wrong byte. The _target form is unchecked under ThreadSanitizer, as
 * kvx_pattern_check_target. */
uint64_t kvx_pattern_check_run(const uint8_t *p, uint64_t len, uint64_t salt, uint64_t src,
                               uint64_t round, uint64_t off);
uint64_t kvx_pattern_check_run_target(const uint8_t *p, uint64_t len, uint64_t salt, uint64_t src,
                                      uint64_t round, uint64_t off);

/* Index maps shared by kvx-bench and kvx-memcpy, so both move the very same blocks. */
enum kvx_pattern_kind { PAT_CONTIG, PAT_SCATTER, PAT_RANDOM };

/*
 * n local blocks in [lbase, lbase + span) mapped to remote blocks in [rbase, rbase + span).
 * Scattered: neighbours land far apart on both sides, so nothing coalesces. Random: n distinct
 * random picks (uses scratch, span entries). The remote index is always the same function of
 * the local one, so overlapping transfers leave every remote block one expected content.
 */
void kvx_index_map(uint32_t *local, uint32_t *remote, uint64_t n, uint64_t span, uint64_t lbase,
                   uint64_t rbase, int kind, uint64_t *scratch);

/* "64K", "1M", "4096", "1.5G" -> bytes; 0 when s is not a size. */
uint64_t kvx_tool_parse_size(const char *s);
/* CLOCK_MONOTONIC (comparable between processes of one host) in ns. */
uint64_t kvx_tool_now_ns(void);
/* This thread's CPU time in ns (a system call). */
uint64_t kvx_tool_thread_cpu_ns(void);
uint64_t kvx_tool_process_cpu_ns(void); /* every thread of this process */

#endif
