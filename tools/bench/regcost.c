/*
 * kvx-bench --reg-cost N: the cost of kvx_region_register and kvx_region_deregister per call, in
 * us, on a transport with no peer (the calls touch no network): N pairs (each region
 * deregistered at once), then N regions registered together and deregistered in turn (the table
 * holding N). Each call is timed alone; the table gives p50, p99 and the mean.
 */
#include "regcost.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* One phase's samples: register and deregister times, ns. */
typedef struct phase {
    const char *name;
    uint64_t *reg, *dereg;
} phase_t;

static double mean_us(const uint64_t *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)v[i];
    return n ? s / n / 1e3 : 0;
}

static void phase_print(const struct opts *o, phase_t *ph, int n, uint64_t bytes)
{
    double rm = mean_us(ph->reg, n), dm = mean_us(ph->dereg, n);

    sort_u64(ph->reg, (uint64_t)n);
    sort_u64(ph->dereg, (uint64_t)n);
    if (o->json) {
        printf("{\"tool\":\"kvx-bench\",\"mode\":\"reg-cost\",\"phase\":\"%s\",\"calls\":%d,"
               "\"region_bytes\":%llu,\"register_p50_us\":%.3f,\"register_p99_us\":%.3f,"
               "\"register_mean_us\":%.3f,\"deregister_p50_us\":%.3f,"
               "\"deregister_p99_us\":%.3f,\"deregister_mean_us\":%.3f,\"load_avg_1m\":%.2f,"
               "\"cores\":%d,\"host_busy\":%s}\n",
               ph->name, n, (unsigned long long)bytes, pct_us(ph->reg, (uint64_t)n, 50),
               pct_us(ph->reg, (uint64_t)n, 99), rm, pct_us(ph->dereg, (uint64_t)n, 50),
               pct_us(ph->dereg, (uint64_t)n, 99), dm, o->host.load_1m, o->host.cores,
               host_busy(&o->host) ? "true" : "false");
        return;
    }
    printf("%-10s %8d %12.3f %12.3f %12.3f %12.3f %12.3f %12.3f\n", ph->name, n,
           pct_us(ph->reg, (uint64_t)n, 50), pct_us(ph->reg, (uint64_t)n, 99), rm,
           pct_us(ph->dereg, (uint64_t)n, 50), pct_us(ph->dereg, (uint64_t)n, 99), dm);
}

int regcost_run(const struct opts *o)
{
    kvx_params_t p = {.field_mask = KVX_PARAM_NUM_THREADS, .num_threads = (unsigned)o->threads};
    kvx_region_params_t rp = {0};
    kvx_transport_t *t;
    int n = o->reg_cost;
    uint64_t bytes = o->sizes[0], t0, t1;
    uint8_t *buf = region_alloc(bytes);
    uint32_t *ids = malloc(sizeof(*ids) * (size_t)n), id;
    phase_t ph[2] = {{"pairs", malloc(8 * (size_t)n), malloc(8 * (size_t)n)},
                     {"n at once", malloc(8 * (size_t)n), malloc(8 * (size_t)n)}};
    char sz[24];

    if (ids == NULL || !ph[0].reg || !ph[0].dereg || !ph[1].reg || !ph[1].dereg)
        die("out of memory");
    /* no main region: regions only (KVX_PARAM_REGION is optional); a core that still wants
     * one gets a page, which the calls timed here never touch */
    int rc = kvx_transport_create(&p, &t);
    uint8_t *page = NULL;
    if (rc == -EINVAL) {
        page = region_alloc(4096);
        p.field_mask |= KVX_PARAM_REGION;
        p.base = page;
        p.num_blocks = 1;
        p.block_len = 4096;
        rc = kvx_transport_create(&p, &t);
    }
    if (rc < 0)
        die("kvx_transport_create: %s", kvx_strerror(rc));
    for (int i = 0; i < 100; i++) { /* warm-up: the table's first growth, the caches */
        CHECK_KVX(kvx_region_register(t, buf, bytes, &rp, &id));
        CHECK_KVX(kvx_region_deregister(t, id));
    }
    for (int i = 0; i < n; i++) {
        t0 = now_ns();
        CHECK_KVX(kvx_region_register(t, buf, bytes, &rp, &id));
        t1 = now_ns();
        CHECK_KVX(kvx_region_deregister(t, id));
        ph[0].reg[i] = t1 - t0;
        ph[0].dereg[i] = now_ns() - t1;
    }
    for (int i = 0; i < n; i++) { /* overlapping regions of the same memory: allowed */
        t0 = now_ns();
        CHECK_KVX(kvx_region_register(t, buf, bytes, &rp, &ids[i]));
        ph[1].reg[i] = now_ns() - t0;
    }
    for (int i = 0; i < n; i++) {
        t0 = now_ns();
        CHECK_KVX(kvx_region_deregister(t, ids[i]));
        ph[1].dereg[i] = now_ns() - t0;
    }
    kvx_transport_destroy(t);
    if (page != NULL)
        munmap(page, 4096);
    if (!o->json) {
        busy_warning(stdout, &o->host);
        printf("kvx-bench %s --reg-cost: kvx_region_register / kvx_region_deregister of a %s "
               "region, each call timed alone, us; a transport with no peer%s\n",
               kvx_version(), fmt_size(bytes, sz, sizeof(sz)),
               page != NULL ? " (and a one-page main region: this libkvx requires one)" : "");
        printf("%-10s %8s %12s %12s %12s %12s %12s %12s\n", "phase", "calls", "reg p50", "reg p99",
               "reg mean", "dereg p50", "dereg p99", "dereg mean");
    }
    for (int k = 0; k < 2; k++) {
        phase_print(o, &ph[k], n, bytes);
        free(ph[k].reg);
        free(ph[k].dereg);
    }
    if (!o->json)
        printf("pairs: each region deregistered right after its registration; n at once: n "
               "registered, then deregistered in the same order\n");
    free(ids);
    munmap(buf, bytes);
    return 0;
}
