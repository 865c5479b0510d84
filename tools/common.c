/*
 * What kvx-bench, kvx-memcpy and the tests share (see common.h).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "common.h"

#include <stdlib.h>
#include <time.h>

#define KVX_PATTERN_STEP 0x9e3779b97f4a7c15ull

/* Under ThreadSanitizer (KVX_TSAN) the pattern's reads and writes of a region go unchecked. They
 * are the application's side of a transfer, and what orders them with kvx's side is the peer's
 * word: its acknowledgement, then the harness's socket, crossing another process or UCX's
 * shared-memory FIFOs, neither of which ThreadSanitizer sees. Checked, every block a peer wrote
 * read as a race (tests/tsan.supp), and even suppressed their reports made test_xfer shm take
 * 75 s instead of 9. Whether the bytes are right is what the pattern itself checks. */
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

KVX_PATTERN_UNCHECKED void kvx_pattern_fill(uint8_t *block, uint64_t block_len, uint64_t salt,
                                            uint64_t src, uint64_t round)
{
    uint64_t *w = (uint64_t *)block, s = kvx_pattern_seed(salt, src, round);

    for (uint64_t i = 0; i < block_len / 8; i++)
        w[i] = s + i * KVX_PATTERN_STEP;
}

KVX_PATTERN_UNCHECKED uint64_t kvx_pattern_check(const uint8_t *block, uint64_t block_len,
                                                 uint64_t salt, uint64_t src, uint64_t round)
{
    const uint64_t *w = (const uint64_t *)block;
    uint64_t s = kvx_pattern_seed(salt, src, round);

    for (uint64_t i = 0; i < block_len / 8; i++)
        if (w[i] != s + i * KVX_PATTERN_STEP)
            return i + 1;
    return 0;
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
