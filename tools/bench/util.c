/*
 * kvx-bench's helpers: what several of its files use, and nothing of theirs (util.h).
 */
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvx-bench: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    exit(1);
}

void *region_alloc(uint64_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap %llu bytes: %s", (unsigned long long)bytes, strerror(errno));
    return p;
}

const char *fmt_size(uint64_t v, char *buf, size_t len)
{
    if (v >= (1ull << 30) && v % (1ull << 30) == 0)
        snprintf(buf, len, "%lluG", (unsigned long long)(v >> 30));
    else if (v >= (1ull << 20) && v % (1ull << 20) == 0)
        snprintf(buf, len, "%lluM", (unsigned long long)(v >> 20));
    else if (v >= 1024 && v % 1024 == 0)
        snprintf(buf, len, "%lluK", (unsigned long long)(v >> 10));
    else
        snprintf(buf, len, "%llu", (unsigned long long)v);
    return buf;
}

const char *fmt_ms(double us, char *buf, size_t len)
{
    double ms = us / 1e3;
    int dec = ms >= 100 ? 0 : ms >= 10 ? 1 : ms >= 1 ? 2 : ms >= 0.1 ? 3 : 4;

    snprintf(buf, len, "%.*f", dec, ms);
    return buf;
}

const char *fmt_p99(double p99_us, double max_us, uint64_t samples, char *buf, size_t len)
{
    char v[24]; /* the figure, and " max" after it, fit a 32-byte cell */

    if (samples == 0)
        snprintf(buf, len, "-");
    else if (samples < P99_MIN_SAMPLES)
        snprintf(buf, len, "%s max", fmt_ms(max_us, v, sizeof(v)));
    else
        fmt_ms(p99_us, buf, len);
    return buf;
}

void host_sample(bench_host_t *h)
{
    double load[1];

    h->load_1m = getloadavg(load, 1) == 1 ? load[0] : 0;
    h->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (h->cores < 1)
        h->cores = 1;
}

bool host_busy(const bench_host_t *h) { return h->load_1m > 0.5 * h->cores; }

void busy_warning(FILE *out, const bench_host_t *h)
{
    if (host_busy(h))
        fprintf(out,
                "warning: busy host: load average %.2f over the last minute on %d cores (over "
                "half of them) before this run: figures are low and noisy; compare only runs "
                "without this warning\n",
                h->load_1m, h->cores);
}

void progress_line(bool quiet, const char *what, int done, int total)
{
    static uint64_t last;
    uint64_t now = now_ns();
    if (quiet || !isatty(2) || (now - last < 100000000ull && done != total))
        return;
    last = now;
    fprintf(stderr, "\r  %s: %d/%d transfers%s", what, done, total,
            done == total ? "\r\033[K" : "");
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void sort_u64(uint64_t *v, size_t n) { qsort(v, n, sizeof(*v), cmp_u64); }

double pct_us(const uint64_t *sorted, uint64_t n, int p)
{
    return n ? (double)sorted[(n * (uint64_t)p + 99) / 100 - 1] / 1e3 : 0;
}
