/*
 * kvx-bench's results printed (a table or JSON lines, as bench/compare reads them), and several
 * initiators' JSON lines read back and aggregated (--initiators with --loopback).
 */
#include "report.h"

#include <stdlib.h>
#include <string.h>

static void print_json(const struct opts *o, const result_t *r)
{
    printf("{\"tool\":\"kvx-bench\",\"op\":\"%s\",\"block_size\":%llu,"
           "\"blocks_per_xfer\":%llu,\"region_bytes\":%llu,\"pattern\":\"%s\","
           "\"iters\":%d,\"inflight\":%d,\"peers\":%d,\"initiators\":%d,"
           "\"initiator\":%d,\"threads\":%d,\"bytes\":%llu,\"gbps\":%.4f,"
           "\"xfers_per_s\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f,"
           "\"latency_samples\":%llu,\"seen_p50_us\":%.2f,\"seen_p99_us\":%.2f,"
           "\"submit_ns_per_block\":%.1f,\"init_cpu_s_per_gb\":%.4f,"
           "\"target_cpu_s_per_gb\":%.4f,\"create_ms\":%.3f,"
           "\"metadata_bytes\":%zu,\"peer_add_ms\":%.3f,\"transport\":\"%s\","
           "\"start_ns\":%llu,\"end_ns\":%llu,\"xfers\":%llu,\"load_avg_1m\":%.2f,"
           "\"cores\":%d,\"host_busy\":%s,\"regions\":%d,\"ranges_min\":%llu,\"ranges_max\":%llu,"
           "\"verified\":%s,\"bad_blocks\":%llu}\n",
           r->op, (unsigned long long)r->size, (unsigned long long)r->blocks,
           (unsigned long long)o->region, opts_pattern_name(o->pattern), o->iters, o->inflight,
           o->naddrs, o->clients, r->initiator, o->threads, (unsigned long long)r->bytes, r->gbps,
           r->xfers_per_s, r->p50_us, r->p99_us, r->max_us, (unsigned long long)r->lat_n,
           r->seen_p50_us, r->seen_p99_us, r->submit_ns_per_block, r->init_cpu_s_per_gb,
           r->target_cpu_s_per_gb, r->create_ms, r->md_bytes, r->peer_add_ms, r->transport,
           (unsigned long long)r->start_ns, (unsigned long long)r->end_ns,
           (unsigned long long)r->xfers, o->host.load_1m, o->host.cores,
           host_busy(&o->host) ? "true" : "false", o->regions, (unsigned long long)o->ranges_min,
           (unsigned long long)o->ranges_max,
           !o->verify ? "null"
           : r->bad   ? "false"
                      : "true",
           (unsigned long long)r->bad);
}

static void print_title(const struct opts *o)
{
    char rg[24], lo[24], hi[24], rg2[64], each[24];

    busy_warning(stdout, &o->host);
    fmt_size(o->region, rg, sizeof(rg));
    snprintf(rg2, sizeof(rg2), "%s-%s", fmt_size(o->ranges_min, lo, sizeof(lo)),
             fmt_size(o->ranges_max, hi, sizeof(hi)));
    if (o->regions > 0)
        printf("kvx-bench %s: ranges of %s bytes (%s, seed %llu) between %d region(s) of %s on "
               "each side, %d iteration(s) after %d warm-up, %d in flight per peer, %d peer(s), "
               "%d initiator(s), progress thread %s\n",
               kvx_version(), o->ranges_min == o->ranges_max ? lo : rg2,
               o->ranges_min == o->ranges_max ? "block-aligned" : "log-uniform, any offset",
               (unsigned long long)o->seed, o->regions,
               fmt_size(o->region / (uint64_t)o->regions / 4096 * 4096, each, sizeof(each)),
               o->iters, o->warmup, o->inflight, o->naddrs, o->clients, o->threads ? "on" : "off");
    else if (o->load_s > 0)
        printf("kvx-bench %s: load for %.0f s, random writes each read back and compared, a %s "
               "region on each side, %d peer(s), %d initiator(s), progress thread %s\n",
               kvx_version(), o->load_s, rg, o->naddrs, o->clients, o->threads ? "on" : "off");
    else
        printf("kvx-bench %s: %s blocks of a %s region on each side, %d iteration(s) after %d "
               "warm-up, %d in flight per peer, %d peer(s), %d initiator(s), progress thread "
               "%s\n",
               kvx_version(), opts_pattern_name(o->pattern), rg, o->iters, o->warmup, o->inflight,
               o->naddrs, o->clients, o->threads ? "on" : "off");
    printf("%-8s %6s %8s %10s %10s %9s %10s %10s %8s %8s  %-10s %s\n", "op", "block", "blocks",
           "GB/s", "xfers/s", "p50 ms", "p99 ms", "sub ns/blk", "cpu s/GB", "tgt s/GB", "transport",
           "verified");
}

static void print_row(const struct opts *o, const result_t *r)
{
    char sz[24], op[24], p50[32], p99[32];

    if (o->clients > 1)
        snprintf(op, sizeof(op), "%s%s%.0d", r->op, r->initiator < 0 ? "*" : "#",
                 r->initiator < 0 ? 0 : r->initiator);
    else
        snprintf(op, sizeof(op), "%s", r->op);
    if (o->clients > 1 && r->initiator == 0)
        op[strlen(r->op) + 1] = '0', op[strlen(r->op) + 2] = '\0';
    printf("%-8s %6s %8llu %10.3f %10.1f %9s %10s %10.1f %8.3f %8.3f  %-10s %s\n", op,
           fmt_size(r->size, sz, sizeof(sz)), (unsigned long long)r->blocks, r->gbps,
           r->xfers_per_s, r->lat_n ? fmt_ms(r->p50_us, p50, sizeof(p50)) : "-",
           fmt_p99(r->p99_us, r->max_us, r->lat_n, p99, sizeof(p99)), r->submit_ns_per_block,
           r->init_cpu_s_per_gb, r->target_cpu_s_per_gb, r->transport,
           !o->verify ? "off"
           : r->bad   ? "NO"
                      : "yes");
}

/* The lines under the table: what its columns mean, and what the rows' figures rest on. */
static void print_notes(const struct opts *o, const result_t *res, int n)
{
    char sz[24], p50[32], p99[32];
    bool maxed = false;
    uint64_t fewest = UINT64_MAX;

    for (int i = 0; i < n; i++)
        if (res[i].lat_n > 0 && res[i].lat_n < P99_MIN_SAMPLES) {
            maxed = true;
            fewest = res[i].lat_n < fewest ? res[i].lat_n : fewest;
        }
    printf("p50/p99: submit to completion, ms. cpu s/GB, tgt s/GB: CPU seconds (all threads, "
           "warm-up included) of the initiator and of the target(s) per GB (10^9 bytes) moved\n");
    if (maxed)
        printf("max: %llu transfer(s) measured, under the %d a p99 needs: the p99 column shows "
               "the slowest (-n sets the count)\n",
               (unsigned long long)fewest, P99_MIN_SAMPLES);
    for (int i = 0; i < n && (o->wait || o->wait_fd); i++) /* the wake-up's cost, measured */
        if (res[i].seen_p50_us > 0)
            printf("%s %s: submit to seen by the application (one in flight, %s): p50 %s ms, "
                   "p99 %s ms\n",
                   res[i].op, fmt_size(res[i].size, sz, sizeof(sz)),
                   o->wait_fd ? "asleep on the event fd"
                   : o->wait  ? "asleep in kvx_transport_wait"
                              : "spinning on poll",
                   fmt_ms(res[i].seen_p50_us, p50, sizeof(p50)),
                   fmt_ms(res[i].seen_p99_us, p99, sizeof(p99)));
    if (n > 0)
        printf("set-up: create %.2f ms, metadata %zu bytes, pairing by address %.2f ms "
               "(kvx_peer_connect, median of 5)\n",
               res[0].create_ms, res[0].md_bytes, res[0].peer_add_ms);
    if (o->clients > 1)
        printf("rows op#k: initiator k; op*: all initiators together (their bytes over the span "
               "from the first start to the last end; latency: the worst initiator's)\n");
    if (o->regions > 0)
        printf("wranges, rranges: kvx_xfer_write_ranges / read_ranges between the regions; "
               "block: the mean range length, blocks: ranges per transfer, sub ns/blk: per range; "
               "verified: every byte of every range moved\n");
    for (int i = 0; i < n; i++)
        if (strcmp(res[i].op, "load") == 0 && (o->clients == 1 || res[i].initiator < 0))
            printf("load: %llu transfers (half writes, half reads of them back), %llu bytes, "
                   "%llu failed transfers or wrong blocks, each id completed once\n",
                   (unsigned long long)res[i].xfers, (unsigned long long)res[i].bytes,
                   (unsigned long long)res[i].bad);
}

void report_print(const struct opts *o, const result_t *res, int n)
{
    if (o->json) {
        for (int i = 0; i < n; i++)
            print_json(o, &res[i]);
        fflush(stdout);
        return;
    }
    print_title(o);
    for (int i = 0; i < n; i++)
        print_row(o, &res[i]);
    print_notes(o, res, n);
}

/* ---- several initiators (--initiators with --loopback) -------------------------------------- */

static double json_num(const char *line, const char *key)
{
    char pat[64];
    const char *p;
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(line, pat);
    return p ? strtod(p + strlen(pat), NULL) : 0;
}

static void json_str(const char *line, const char *key, char *out, size_t cap)
{
    char pat[64];
    const char *p, *e;
    snprintf(pat, sizeof(pat), "\"%s\":\"", key);
    out[0] = '\0';
    if ((p = strstr(line, pat)) == NULL || (e = strchr(p + strlen(pat), '"')) == NULL)
        return;
    p += strlen(pat);
    snprintf(out, cap, "%.*s", (int)(e - p), p);
}

/* One initiator's JSON line (print_json's) back into r; r->op is left to the caller. */
static void parse_line(const char *line, result_t *r)
{
    memset(r, 0, sizeof(*r));
    r->size = (uint64_t)json_num(line, "block_size");
    r->blocks = (uint64_t)json_num(line, "blocks_per_xfer");
    r->gbps = json_num(line, "gbps");
    r->xfers_per_s = json_num(line, "xfers_per_s");
    r->p50_us = json_num(line, "p50_us");
    r->p99_us = json_num(line, "p99_us");
    r->max_us = json_num(line, "max_us");
    r->lat_n = (uint64_t)json_num(line, "latency_samples");
    r->submit_ns_per_block = json_num(line, "submit_ns_per_block");
    r->init_cpu_s_per_gb = json_num(line, "init_cpu_s_per_gb");
    r->target_cpu_s_per_gb = json_num(line, "target_cpu_s_per_gb");
    r->create_ms = json_num(line, "create_ms");
    r->md_bytes = (size_t)json_num(line, "metadata_bytes");
    r->peer_add_ms = json_num(line, "peer_add_ms");
    r->bytes = (uint64_t)json_num(line, "bytes");
    r->start_ns = (uint64_t)json_num(line, "start_ns");
    r->end_ns = (uint64_t)json_num(line, "end_ns");
    r->bad = (uint64_t)json_num(line, "bad_blocks");
    r->xfers = (uint64_t)json_num(line, "xfers");
    json_str(line, "transport", r->transport, sizeof(r->transport));
}

/* Add one initiator's row r to a, the aggregate of its (op, size). */
static void aggregate(result_t *a, const result_t *r)
{
    a->bytes += r->bytes;
    a->xfers += r->xfers;
    a->bad += r->bad;
    a->xfers_per_s += r->xfers_per_s;
    a->p99_us = r->p99_us > a->p99_us ? r->p99_us : a->p99_us;
    a->max_us = r->max_us > a->max_us ? r->max_us : a->max_us;
    a->p50_us = r->p50_us > a->p50_us ? r->p50_us : a->p50_us;
    a->lat_n = r->lat_n < a->lat_n ? r->lat_n : a->lat_n;
    a->start_ns = r->start_ns < a->start_ns ? r->start_ns : a->start_ns;
    a->end_ns = r->end_ns > a->end_ns ? r->end_ns : a->end_ns;
    a->gbps = (double)a->bytes / (double)(a->end_ns - a->start_ns);
}

int report_collect(FILE **outs, int m, result_t *res, int cap)
{
    static char opname[(MAX_INITIATORS + 1) * MAX_SIZES * 2][8]; /* one per result line */
    char line[2048];
    int n = 0, base;

    if (cap > (int)(sizeof(opname) / sizeof(opname[0])))
        cap = (int)(sizeof(opname) / sizeof(opname[0]));
    for (int k = 0; k < m; k++) {
        while (fgets(line, sizeof(line), outs[k]) != NULL && n < cap) {
            if (line[0] != '{')
                continue;
            parse_line(line, &res[n]);
            json_str(line, "op", opname[n], sizeof(opname[n]));
            res[n].op = opname[n];
            res[n].initiator = k;
            n++;
        }
    }
    base = n;
    for (int i = 0; i < base && n < cap; i++) {
        result_t *a = NULL;
        for (int j = base; j < n; j++)
            if (res[j].size == res[i].size && strcmp(res[j].op, res[i].op) == 0)
                a = &res[j];
        if (a == NULL) {
            a = &res[n++];
            *a = res[i];
            a->initiator = -1;
            a->bytes = 0;
            a->xfers = 0;
            a->bad = 0;
            a->xfers_per_s = 0;
            a->start_ns = UINT64_MAX;
            a->end_ns = 0;
            a->lat_n = UINT64_MAX;
        }
        aggregate(a, &res[i]);
    }
    return n;
}
