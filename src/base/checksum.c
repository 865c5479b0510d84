/*
 * Checksums: CRC-32 (the metadata blob's) through zlib's crc32_z, and CRC-32C (Castagnoli; the
 * optional per-block integrity check of transfers), kvx's own with the SSE4.2 instruction where
 * the CPU has it: zlib and libcrypto have no CRC-32C, and the one Debian library that has a
 * good one (ISA-L's crc32_iscsi, libisal-dev) would be a new dependency for this option alone.
 */
#include "base/kvx_base.h"

#include <string.h>
#include <zlib.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

uint32_t kvx_crc32(const void *buf, size_t len)
{
    return len == 0 ? 0 : (uint32_t)crc32_z(0, buf, len);
}

uint32_t kvx_crc32_parts(const kvx_iov_t *parts, size_t n)
{
    uLong crc = 0;
    for (size_t i = 0; i < n; i++)
        if (parts[i].len > 0) /* zlib answers 0 for a NULL buffer, whatever the crc so far */
            crc = crc32_z(crc, parts[i].base, parts[i].len);
    return (uint32_t)crc;
}

/* ---- CRC-32C -------------------------------------------------------------------------------- */

static uint32_t kvx_crc32c_table[8][256];

static void kvx_crc32c_init_table(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
        kvx_crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            kvx_crc32c_table[t][i] = (kvx_crc32c_table[t - 1][i] >> 8) ^
                                     kvx_crc32c_table[0][kvx_crc32c_table[t - 1][i] & 0xff];
}

/* Slicing-by-8, for CPUs without the instruction. */
static uint32_t kvx_crc32c_sw(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = kvx_crc32c_table[7][v & 0xff] ^ kvx_crc32c_table[6][(v >> 8) & 0xff] ^
              kvx_crc32c_table[5][(v >> 16) & 0xff] ^ kvx_crc32c_table[4][(v >> 24) & 0xff] ^
              kvx_crc32c_table[3][(v >> 32) & 0xff] ^ kvx_crc32c_table[2][(v >> 40) & 0xff] ^
              kvx_crc32c_table[1][(v >> 48) & 0xff] ^ kvx_crc32c_table[0][v >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ kvx_crc32c_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
/* The SSE4.2 instruction, 8 bytes per step. */
__attribute__((target("sse4.2"))) static uint32_t kvx_crc32c_hw(uint32_t crc, const uint8_t *p,
                                                                size_t len)
{
    uint64_t c = crc;

    while (len > 0 && ((uintptr_t)p & 7) != 0) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

static uint32_t (*kvx_crc32c_fn)(uint32_t, const uint8_t *, size_t);
static pthread_once_t kvx_crc32c_once = PTHREAD_ONCE_INIT;

static void kvx_crc32c_pick(void)
{
    kvx_crc32c_init_table();
    kvx_crc32c_fn = kvx_crc32c_sw;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        kvx_crc32c_fn = kvx_crc32c_hw;
#endif
}

uint32_t kvx_crc32c(const void *buf, size_t len)
{
    pthread_once(&kvx_crc32c_once, kvx_crc32c_pick);
    return ~kvx_crc32c_fn(~0u, buf, len);
}

uint32_t kvx_crc32c_parts(const kvx_iov_t *parts, size_t n)
{
    uint32_t crc = ~0u;

    pthread_once(&kvx_crc32c_once, kvx_crc32c_pick);
    for (size_t i = 0; i < n; i++)
        crc = kvx_crc32c_fn(crc, parts[i].base, parts[i].len);
    return ~crc;
}
