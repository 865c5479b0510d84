/*
 * kvx-bench's helpers, the lowest of its files: dying with a message, clocks, regions, how sizes
 * and latencies read, the busy-host rule, the progress display, percentiles.
 */
#ifndef KVX_BENCH_UTIL_H
#define KVX_BENCH_UTIL_H

#include "common.h"
#include "kvx.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define CHECK_KVX(expr)                                                                            \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ < 0)                                                                               \
            die("%s: %s", #expr, kvx_strerror(rc_));                                               \
    } while (0)

static inline uint64_t now_ns(void) { return kvx_tool_now_ns(); }
/* Anonymous memory, zeroed; dies when there is none. munmap frees it. */
void *region_alloc(uint64_t bytes);
/* "64K", "1M", "3G", or the bare number when no unit divides it. */
const char *fmt_size(uint64_t v, char *buf, size_t len);

/* Fewer latency samples than this make no p99: the tables show the slowest one instead, marked
 * "max" (with 5 samples, "p99" is the maximum anyway; with 99 it is the second slowest). */
#define P99_MIN_SAMPLES 100

/* A latency given in us, as ms with 3 significant digits: 201867.5 -> "202", 8.5 -> "0.0085". */
const char *fmt_ms(double us, char *buf, size_t len);
/* The p99 cell of a table: the p99 in ms, or with fewer than P99_MIN_SAMPLES samples the
 * maximum followed by " max"; "-" with no sample. */
const char *fmt_p99(double p99_us, double max_us, uint64_t samples, char *buf, size_t len);

/* The host as kvx-bench found it at its start, before its own processes added to the load. */
typedef struct bench_host {
    double load_1m; /* the 1-minute load average */
    int cores;      /* online CPUs */
} bench_host_t;

void host_sample(bench_host_t *h);
/* The host is busy, by bench/compare's rule: its 1-minute load average when kvx-bench started
 * is over half its cores. busy_warning prints the warning line, if so, to out. */
bool host_busy(const bench_host_t *h);
void busy_warning(FILE *out, const bench_host_t *h);

/* "what: done/total transfers" on stderr, at most every 100 ms, when it is a terminal and not
 * quiet; the line is erased once done == total. */
void progress_line(bool quiet, const char *what, int done, int total);

/* Latencies in ns: sorted in place, then the nearest-rank percentile p (the smallest sample at
 * or above p of them) in us; 0 with no sample. */
void sort_u64(uint64_t *v, size_t n);
double pct_us(const uint64_t *sorted, uint64_t n, int p);

#endif
