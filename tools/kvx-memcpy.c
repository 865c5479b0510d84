/*
 * kvx-memcpy: the memory-copy limit for bench/compare. One thread copies the same scattered
 * blocks kvx-bench moves (same index map, same region size, out of cache) from one region into
 * another, and prints GB/s (10^9 bytes/s) per block size as JSON lines.
 *   kvx-memcpy [--region 256M] [--iters 5] [--pattern scattered] SIZE...
 */
#define _GNU_SOURCE
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

int main(int argc, char **argv)
{
    uint64_t region = 256ull << 20;
    int iters = 5, kind = PAT_SCATTER, i = 1;

    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--region") && i + 1 < argc)
            region = kvx_tool_parse_size(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--pattern") && i + 1 < argc) {
            i++;
            kind = !strncmp(argv[i], "contig", 6) ? PAT_CONTIG : PAT_SCATTER;
        } else {
            fprintf(stderr,
                    "usage: kvx-memcpy [--region BYTES] [--iters N] [--pattern P] SIZE...\n");
            return 2;
        }
    }
    uint8_t *src = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *dst = mmap(NULL, region, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED)
        return 1;
    memset(src, 1, region); /* fault both regions in: no page faults inside the timing */
    memset(dst, 2, region);
    for (; i < argc; i++) {
        uint64_t size = kvx_tool_parse_size(argv[i]), nb = region / size, best = UINT64_MAX,
                 sum = 0;
        uint32_t *L = malloc(nb * 4), *R = malloc(nb * 4);
        if (size == 0 || nb == 0 || !L || !R)
            return 1;
        kvx_index_map(L, R, nb, nb, 0, 0, kind, NULL);
        for (int it = 0; it <= iters; it++) {
            uint64_t t0 = kvx_tool_now_ns();
            for (uint64_t b = 0; b < nb; b++)
                memcpy(dst + (uint64_t)R[b] * size, src + (uint64_t)L[b] * size, size);
            uint64_t dt = kvx_tool_now_ns() - t0;
            if (it == 0)
                continue; /* warm-up */
            sum += dt;
            if (dt < best)
                best = dt;
        }
        /* a sample of the copy, so the compiler cannot drop it */
        if (dst[(uint64_t)R[0] * size] != 1)
            return 1;
        printf("{\"tool\":\"memcpy\",\"block_size\":%llu,\"blocks\":%llu,\"iters\":%d,"
               "\"gbps\":%.4f,\"gbps_best\":%.4f}\n",
               (unsigned long long)size, (unsigned long long)nb, iters,
               (double)(nb * size) * iters / (double)sum, (double)(nb * size) / (double)best);
        free(L);
        free(R);
    }
    return 0;
}
