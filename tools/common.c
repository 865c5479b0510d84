/*
 * What kvx-bench, kvx-memcpy and the tests share (see common.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KVX_PATTERN_STEP 0x9e3779b97f4a7c15ull

/* A target's fills and checks of its own region (the _target functions) go unchecked under
 * ThreadSanitizer (KVX_TSAN): what orders them with kvx's side, which peers' writes and reads go
 * through, is a word from another process (the peer's acknowledgement, then the harness's
 * socket) crossing UCX's shared memory, which ThreadSanitizer cannot see. Checked, every block a
 * peer wrote read as a race, and even with the reports suppressed test_xfer shm took 75 s
 * instead of 9 (tests/tsan.supp). An initiator's own fills and checks stay checked: kvx's lock
 * orders them with what its transfers do. Whether the bytes are right is what the pattern itself
 * checks. */
#if defined(__SANITIZE_THREAD__)
#define KVX_PATTERN_UNCHECKED __attribute__((no_sanitize("thread")))
#else
#define KVX_PATTERN_UNCHECKED
#endif

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

#define KVX_PATTERN_FILL(block, block_len, salt, src, round)                                       \
    do {                                                                                           \
        uint64_t *w_ = (uint64_t *)(block), s_ = kvx_pattern_seed(salt, src, round);               \
        for (uint64_t i_ = 0; i_ < (block_len) / 8; i_++)                                          \
            w_[i_] = s_ + i_ * KVX_PATTERN_STEP;                                                   \
    } while (0)
#define KVX_PATTERN_CHECK(block, block_len, salt, src, round)                                      \
    do {                                                                                           \
        const uint64_t *w_ = (const uint64_t *)(block);                                            \
        uint64_t s_ = kvx_pattern_seed(salt, src, round);                                          \
        for (uint64_t i_ = 0; i_ < (block_len) / 8; i_++)                                          \
            if (w_[i_] != s_ + i_ * KVX_PATTERN_STEP)                                              \
                return i_ + 1;                                                                     \
        return 0;                                                                                  \
    } while (0)

/* Byte by byte only at the run's unaligned ends; whole words in between. */
#define KVX_PATTERN_CHECK_RUN(p, len, salt, src, round, off)                                       \
    do {                                                                                           \
        uint64_t s_ = kvx_pattern_seed(salt, src, round), k_ = 0;                                  \
        while (k_ < (len)) {                                                                       \
            uint64_t x_ = (off) + k_, w_ = s_ + (x_ / 8) * KVX_PATTERN_STEP;                       \
            if (x_ % 8 == 0 && (len)-k_ >= 8) {                                                    \
                if (memcmp((p) + k_, &w_, 8) != 0)                                                 \
                    break;                                                                         \
                k_ += 8;                                                                           \
                continue;                                                                          \
            }                                                                                      \
            if ((p)[k_] != ((const uint8_t *)&w_)[x_ % 8])                                         \
                return k_ + 1;                                                                     \
            k_++;                                                                                  \
        }                                                                                          \
        for (; k_ < (len); k_++) { /* the word that differed: its first wrong byte */              \
            uint64_t x_ = (off) + k_, w_ = s_ + (x_ / 8) * KVX_PATTERN_STEP;                       \
            if ((p)[k_] != ((const uint8_t *)&w_)[x_ % 8])                                         \
                return k_ + 1;                                                                     \
        }                                                                                          \
        return 0;                                                                                  \
    } while (0)

void kvx_pattern_fill(uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                      uint64_t round)
{
    KVX_PATTERN_FILL(block, block_len, salt, src, round);
}

uint64_t kvx_pattern_check(const uint8_t *block, uint64_t block_len, uint64_t salt, uint64_t src,
                           uint64_t round)
{
    KVX_PATTERN_CHECK(block, block_len, salt, src, round);
}

KVX_PATTERN_UNCHECKED void kvx_pattern_fill_target(uint8_t *block, uint64_t block_len,
                                                   uint64_t salt, uint64_t src, uint64_t round)
{
    KVX_PATTERN_FILL(block, block_len, salt, src, round);
}

KVX_PATTERN_UNCHECKED uint64_t kvx_pattern_check_target(const uint8_t *block, uint64_t block_len,
                                                        uint64_t salt, uint64_t src, uint64_t round)
{
    KVX_PATTERN_CHECK(block, block_len, salt, src, round);
}

uint64_t kvx_pattern_check_run(const uint8_t *p, uint64_t len, uint64_t salt, uint64_t src,
                               uint64_t round, uint64_t off)
{
    KVX_PATTERN_CHECK_RUN(p, len, salt, src, round, off);
}

KVX_PATTERN_UNCHECKED uint64_t kvx_pattern_check_run_target(const uint8_t *p, uint64_t len,
                                                            uint64_t salt, uint64_t src,
                                                            uint64_t round, uint64_t off)
{
    KVX_PATTERN_CHECK_RUN(p, len, salt, src, round, off);
}

static uint64_t kvx_gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* A multiplier a with gcd(a, n) == 1: i -> a*i mod n is a bijection that sends neighbours far
 * apart. */
static uint64_t kvx_scatter_mult(uint64_t n)
{
    uint64_t a = n / 2 + 1;
    while (n > 2 && (kvx_gcd(a, n) != 1 || a % n == 1))
        a++;
    return a;
}

static uint64_t kvx_rng(void)
{
    static uint64_t x = 0x2545f4914f6cdd1dull;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

void kvx_index_map(uint32_t *local, uint32_t *remote, uint64_t n, uint64_t span, uint64_t lbase,
                   uint64_t rbase, int kind, uint64_t *scratch)
{
    uint64_t a = kvx_scatter_mult(span);

    if (kind == PAT_RANDOM) {
        /* n distinct random picks of [0, span): a partial Fisher-Yates shuffle */
        for (uint64_t i = 0; i < span; i++)
            scratch[i] = i;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t j = i + kvx_rng() % (span - i), tmp = scratch[i];
            scratch[i] = scratch[j];
            scratch[j] = tmp;
        }
    }
    for (uint64_t i = 0; i < n; i++) {
        uint64_t l = kind == PAT_CONTIG ? i : kind == PAT_SCATTER ? (a * i) % span : scratch[i];
        uint64_t r = kind == PAT_CONTIG ? l : (a * l + span / 3) % span;
        local[i] = (uint32_t)(lbase + l);
        remote[i] = (uint32_t)(rbase + r);
    }
}

uint64_t kvx_tool_parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    uint64_t m = 1;

    if (end == s || v <= 0)
        return 0;
    switch (*end) {
    case 'k':
    case 'K':
        m = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        m = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        m = 1ull << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B')
        end++;
    return *end == '\0' ? (uint64_t)(v * (double)m) : 0;
}

static uint64_t kvx_tool_clock(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kvx_tool_now_ns(void) { return kvx_tool_clock(CLOCK_MONOTONIC); }

uint64_t kvx_tool_thread_cpu_ns(void) { return kvx_tool_clock(CLOCK_THREAD_CPUTIME_ID); }
uint64_t kvx_tool_process_cpu_ns(void) { return kvx_tool_clock(CLOCK_PROCESS_CPUTIME_ID); }
