/*
 * kvx-bench's results: what a measured run yields, printed as a table or JSON lines, and several
 * initiators' JSON lines read back and aggregated.
 */
#ifndef KVX_BENCH_REPORT_H
#define KVX_BENCH_REPORT_H

#include "opts.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct result {
    const char *op;
    uint64_t size, blocks;
    double gbps, xfers_per_s, p50_us, p99_us, max_us, submit_ns_per_block;
    uint64_t lat_n; /* latency samples behind p50/p99 (an aggregate: the fewest of its rows') */
    double seen_p50_us, seen_p99_us; /* submit to the poll that returned it (one in flight) */
    double init_cpu_s_per_gb, target_cpu_s_per_gb; /* both processes, warm-up included */
    double create_ms, peer_add_ms;
    size_t md_bytes;
    char transport[KVX_TRANSPORT_NAME_MAX];
    uint64_t bad;
    uint64_t bytes;
    uint64_t xfers;            /* transfers completed (load mode) */
    uint64_t start_ns, end_ns; /* CLOCK_MONOTONIC: comparable between processes of one host */
    int initiator;             /* -1: the aggregate of several initiators */
} result_t;

/* The results on stdout: one JSON object per line with --json, else the table and its notes. */
void report_print(const struct opts *o, const result_t *res, int n);
/* Read m initiators' JSON lines into res, and add, per (op, size), their aggregate (initiator
 * -1). Returns the count of results; res[k].op stays valid until the next call. */
int report_collect(FILE **outs, int m, result_t *res, int cap);

#endif
