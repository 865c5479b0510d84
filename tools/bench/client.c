/*
 * kvx-bench's initiator: opens a transport per block size, pairs with the servers, runs the
 * measured transfers (write, read; contiguous, scattered or random), checks every byte that
 * landed, and prints the results (a table or JSON lines; several initiators aggregated).
 */
#include "bench.h"

#include <poll.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *pattern_name(int p)
{
    return p == PAT_CONTIG ? "contiguous" : p == PAT_SCATTER ? "scattered" : "random";
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
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

bool host_busy(void) { return o.load_1m > 0.5 * o.cores; }

void busy_warning(FILE *out)
{
    if (host_busy())
        fprintf(out,
                "warning: busy host: load average %.2f over the last minute on %d cores (over "
                "half of them) before this run: figures are low and noisy; compare only runs "
                "without this warning\n",
                o.load_1m, o.cores);
}

void progress_line(const char *what, int done, int total)
{
    static uint64_t last;
    uint64_t now = now_ns();
    if (o.quiet || !isatty(2) || (now - last < 100000000ull && done != total))
        return;
    last = now;
    fprintf(stderr, "\r  %s: %d/%d transfers%s", what, done, total,
            done == total ? "\r\033[K" : "");
}

void client_open(client_t *c, int *ctl, uint64_t size)
{
    uint64_t t0;

    memset(c, 0, sizeof(*c));
    c->size = size;
    c->nb = o.region / size;
    c->npeers = o.naddrs;
    if (c->nb == 0)
        die("region of %llu bytes holds no block of %llu", (unsigned long long)o.region,
            (unsigned long long)size);
    if (c->nb > UINT32_MAX)
        die("too many blocks");
    c->base = region_alloc(c->nb * size);
    for (uint64_t i = 0; i < c->nb; i++)
        kvx_pattern_fill(c->base + i * size, size, CLIENT_SALT + (uint64_t)o.client_index, i, 0);

    kvx_params_t p = {.field_mask = KVX_PARAM_REGION | KVX_PARAM_NUM_THREADS | KVX_PARAM_INTEGRITY |
                                    KVX_PARAM_RNDV,
                      .base = c->base,
                      .num_blocks = c->nb,
                      .block_len = size,
                      .num_threads = (unsigned)o.threads,
                      .integrity = o.integrity,
                      .rndv_mode = o.rndv_mode,
                      .rndv_thresh = o.rndv_thresh};
    t0 = now_ns();
    CHECK_KVX(kvx_transport_create(&p, &c->t));
    c->create_ms = (double)(now_ns() - t0) / 1e6;
    kvx_transport_metadata(c->t, NULL, &c->md_bytes);
    for (int i = 0; i < c->npeers; i++) {
        uint64_t geo[2] = {size, c->nb};
        msg_hdr_t h;
        uint8_t *reply;
        uint32_t port;
        char addr[300];
        const char *colon = strrchr(o.addrs[i], ':');
        snprintf(c->peer[i], sizeof(c->peer[i]), "target%d", i);
        msg_send(ctl[i], MSG_REGION, geo, sizeof(geo));
        reply = msg_recv(ctl[i], &h);
        if (h.len != sizeof(port))
            die("server: a REGION answer of %u bytes", h.len);
        memcpy(&port, reply, sizeof(port));
        free(reply);
        /* the server's transport listens at the control channel's host, on that port: kvx
         * pairs with it by address (kvx_peer_connect) and carries the metadata itself */
        snprintf(addr, sizeof(addr), "%.*s:%u",
                 (int)(colon != NULL ? (size_t)(colon - o.addrs[i]) : strlen(o.addrs[i])),
                 o.addrs[i], port);
        /* pairing is short and the machine noisy: the median of 5 (the last one stays) */
        double add_ms[5];
        for (int k = 0; k < 5; k++) {
            if (k > 0)
                CHECK_KVX(kvx_peer_remove(c->t, c->peer[i]));
            t0 = now_ns();
            CHECK_KVX(kvx_peer_connect(c->t, c->peer[i], addr, NULL));
            add_ms[k] = (double)(now_ns() - t0) / 1e6;
        }
        for (int a = 0; a < 5; a++) /* insertion sort of 5 */
            for (int b = a; b > 0 && add_ms[b] < add_ms[b - 1]; b--) {
                double x = add_ms[b];
                add_ms[b] = add_ms[b - 1];
                add_ms[b - 1] = x;
            }
        c->peer_add_ms += add_ms[2];
    }
    c->peer_add_ms /= c->npeers;
}

void client_close(client_t *c)
{
    kvx_transport_destroy(c->t);
    munmap(c->base, c->nb * c->size);
}

/* The servers' CPU time together (ns). */
static uint64_t servers_cpu_ns(int *ctl, int n)
{
    uint64_t sum = 0;

    for (int i = 0; i < n; i++) {
        msg_hdr_t h;
        uint64_t v = 0;
        uint8_t *rep;
        msg_send(ctl[i], MSG_CPU, NULL, 0);
        rep = msg_recv(ctl[i], &h);
        if (h.type != MSG_CPU || h.len != sizeof(v))
            die("the server does not report its CPU time");
        memcpy(&v, rep, sizeof(v));
        free(rep);
        sum += v;
    }
    return sum;
}

void run_size(int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    uint64_t span_l, span_r, B;
    uint64_t *scratch;
    client_t cl;

    client_open(&cl, ctl, size);
    uint64_t nb = cl.nb;
    uint8_t *base = cl.base;
    kvx_transport_t *t = cl.t;
    int npeers = cl.npeers;
    char(*peer)[24] = cl.peer;
    double create_ms = cl.create_ms, peer_add_ms = cl.peer_add_ms;
    size_t md_bytes = cl.md_bytes;

    span_l = o.same_block ? 1 : nb / (uint64_t)npeers;
    span_r = o.same_block ? 1 : nb / (uint64_t)o.clients;
    B = o.blocks ? o.blocks : (span_l < span_r ? span_l : span_r);
    if (o.same_block)
        B = 1;
    if (B > span_l || B > span_r || B == 0)
        die("%llu blocks per transfer do not fit a region slice of %llu blocks",
            (unsigned long long)B, (unsigned long long)(span_l < span_r ? span_l : span_r));

    int total = o.warmup + o.iters;
    int nmaps = o.pattern == PAT_RANDOM ? total : 1;
    uint32_t *L = malloc(sizeof(uint32_t) * B * (size_t)nmaps * (size_t)npeers);
    uint32_t *R = malloc(sizeof(uint32_t) * B * (size_t)nmaps * (size_t)npeers);
    uint64_t *lat = malloc(sizeof(uint64_t) * (size_t)total * (size_t)npeers);
    scratch = malloc(sizeof(uint64_t) * (span_l > span_r ? span_l : span_r));
    if (!L || !R || !lat || !scratch)
        die("out of memory");
    for (int m = 0; m < nmaps; m++)
        for (int i = 0; i < npeers; i++)
            kvx_index_map(L + ((size_t)m * npeers + i) * B, R + ((size_t)m * npeers + i) * B, B,
                          span_l < span_r ? span_l : span_r, (uint64_t)i * span_l,
                          (uint64_t)o.client_index * span_r, o.pattern, scratch);

    for (int op = OP_WRITE; op <= OP_READ; op <<= 1) {
        if (!(o.ops & op))
            continue;
        result_t *res = &res_out[(*nres)++];
        memset(res, 0, sizeof(*res));
        res->op = op == OP_WRITE ? "write" : "read";
        res->size = size;
        res->blocks = B;
        res->create_ms = create_ms;
        res->peer_add_ms = peer_add_ms;
        res->md_bytes = md_bytes;
        if (op == OP_READ)
            for (int i = 0; i < npeers; i++) {
                uint64_t geo[2] = {size, nb};
                msg_hdr_t h;
                msg_send(ctl[i], MSG_REFILL, geo, sizeof(geo));
                free(msg_recv(ctl[i], &h));
            }

        if (o.clients > 1) {
            uint32_t b[2] = {(uint32_t)(*nres), (uint32_t)o.clients};
            msg_hdr_t h;
            msg_send(ctl[0], MSG_BARRIER, b, sizeof(b));
            free(msg_recv(ctl[0], &h));
        }
        /* CPU time of this process and of the servers (all their threads) over the run */
        uint64_t cpu0 = kvx_tool_process_cpu_ns(), tcpu0 = servers_cpu_ns(ctl, npeers);
        /* transfers k = 0 .. total*npeers-1; k goes to peer k % npeers; a window of
         * inflight*npeers transfers stays in flight */
        int ntx = total * npeers, window = o.inflight * npeers, submitted = 0, completed = 0;
        int warm_tx = o.warmup * npeers, nlat = 0, nseen = 0, evfd = -1;
        uint64_t *seen = calloc((size_t)ntx, sizeof(*seen)), last_submit = 0;
        uint64_t start = 0, end, sub_cpu = 0, sub_blocks = 0;
        kvx_completion_t comp[64];
        while (completed < ntx) {
            while (submitted < ntx && submitted - completed < window) {
                if (submitted == warm_tx && completed < warm_tx)
                    break; /* the measured phase starts once the warm-up has drained */
                if (submitted == warm_tx)
                    start = now_ns();
                int pi = submitted % npeers, m = o.pattern == PAT_RANDOM ? submitted / npeers : 0;
                const uint32_t *l = L + ((size_t)m * npeers + pi) * B;
                const uint32_t *r = R + ((size_t)m * npeers + pi) * B;
                /* the CPU clock is a system call: sample one submission in 8 */
                bool timed = submitted >= warm_tx && ((submitted - warm_tx) & 7) == 0;
                uint64_t id, c0 = timed ? kvx_tool_thread_cpu_ns() : 0;
                int rc = op == OP_WRITE ? kvx_xfer_write(t, peer[pi], l, r, B, NULL, &id)
                                        : kvx_xfer_read(t, peer[pi], l, r, B, NULL, &id);
                if (rc < 0)
                    die("submit: %s", kvx_strerror(rc));
                if (timed) {
                    sub_cpu += kvx_tool_thread_cpu_ns() - c0;
                    sub_blocks += B;
                }
                submitted++;
                last_submit = now_ns();
            }
            int n = kvx_transport_poll(t, NULL, comp, 64);
            if (n < 0)
                die("poll: %s", kvx_strerror(n));
            if (n == 0 && o.wait)
                kvx_transport_wait(t, NULL, 100);
            if (n == 0 && o.wait_fd) {
                struct pollfd pfd = {.events = POLLIN};
                if (evfd < 0)
                    CHECK_KVX(kvx_transport_event_fd_ex(t, KVX_EVENT_COMPLETIONS, &evfd));
                pfd.fd = evfd;
                poll(&pfd, 1, 100);
            }
            if (n == 1 && window == 1 && completed >= warm_tx && seen != NULL)
                seen[nseen++] = now_ns() - last_submit;
            for (int i = 0; i < n; i++) {
                if (comp[i].status != 0)
                    die("transfer %llu failed: %s", (unsigned long long)comp[i].id,
                        kvx_strerror(comp[i].status));
                if (completed >= warm_tx)
                    lat[nlat++] = comp[i].duration_ns;
                completed++;
            }
            progress_line(res->op, completed, ntx);
        }
        end = now_ns();
        {
            double all_gb = (double)total * npeers * (double)B * (double)size / 1e9;
            res->init_cpu_s_per_gb = (double)(kvx_tool_process_cpu_ns() - cpu0) / 1e9 / all_gb;
            res->target_cpu_s_per_gb = (double)(servers_cpu_ns(ctl, npeers) - tcpu0) / 1e9 / all_gb;
        }

        uint64_t bytes = (uint64_t)o.iters * (uint64_t)npeers * B * size;
        double secs = (double)(end - start) / 1e9;
        qsort(lat, (size_t)nlat, sizeof(*lat), cmp_u64);
        res->bytes = bytes;
        res->start_ns = start;
        res->end_ns = end;
        res->initiator = o.client_index;
        res->gbps = (double)bytes / secs / 1e9;
        res->xfers_per_s = (double)nlat / secs;
        /* nearest rank: the smallest latency at or above p of the samples */
        res->p50_us = nlat ? (double)lat[(nlat * 50 + 99) / 100 - 1] / 1e3 : 0;
        res->p99_us = nlat ? (double)lat[(nlat * 99 + 99) / 100 - 1] / 1e3 : 0;
        res->max_us = nlat ? (double)lat[nlat - 1] / 1e3 : 0;
        res->lat_n = (uint64_t)nlat;
        res->submit_ns_per_block = sub_blocks ? (double)sub_cpu / (double)sub_blocks : 0;
        qsort(seen, (size_t)nseen, sizeof(*seen), cmp_u64);
        res->seen_p50_us = nseen ? (double)seen[(nseen * 50 + 99) / 100 - 1] / 1e3 : 0;
        res->seen_p99_us = nseen ? (double)seen[(nseen * 99 + 99) / 100 - 1] / 1e3 : 0;
        free(seen);

        kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};
        CHECK_KVX(kvx_peer_query(t, peer[0], &pa));
        snprintf(res->transport, sizeof(res->transport), "%s", pa.transport);

        if (o.verify) {
            int last = o.pattern == PAT_RANDOM ? total - 1 : 0;
            for (int i = 0; i < npeers; i++) {
                const uint32_t *l = L + ((size_t)last * npeers + i) * B;
                const uint32_t *r = R + ((size_t)last * npeers + i) * B;
                if (op == OP_WRITE) {
                    size_t len = sizeof(verify_req_t) + 8 * B;
                    uint8_t *buf = malloc(len);
                    verify_req_t q = {.block_len = size,
                                      .num_blocks = nb,
                                      .salt = CLIENT_SALT + (uint64_t)o.client_index,
                                      .round = 0,
                                      .n = (uint32_t)B};
                    uint32_t *pairs = (uint32_t *)(buf + sizeof(q));
                    msg_hdr_t h;
                    uint8_t *rep;
                    memcpy(buf, &q, sizeof(q));
                    for (uint64_t k = 0; k < B; k++) {
                        pairs[2 * k] = r[k];
                        pairs[2 * k + 1] = l[k];
                    }
                    msg_send(ctl[i], MSG_VERIFY, buf, (uint32_t)len);
                    rep = msg_recv(ctl[i], &h);
                    uint64_t bad;
                    memcpy(&bad, rep, sizeof(bad));
                    res->bad += bad;
                    free(rep);
                    free(buf);
                } else {
                    for (uint64_t k = 0; k < B; k++)
                        if (kvx_pattern_check(base + (uint64_t)l[k] * size, size, SERVER_SALT, r[k],
                                              0) != 0)
                            res->bad++;
                }
            }
        }
    }
    free(L);
    free(R);
    free(lat);
    free(scratch);
    client_close(&cl);
}

void print_results(const result_t *res, int n)
{
    char sz[24], op[24], rg[24], p50[32], p99[32];
    bool maxed = false;
    uint64_t fewest = UINT64_MAX;

    if (o.json) {
        for (int i = 0; i < n; i++) {
            const result_t *r = &res[i];
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
                   "\"cores\":%d,\"host_busy\":%s,\"verified\":%s,\"bad_blocks\":%llu}\n",
                   r->op, (unsigned long long)r->size, (unsigned long long)r->blocks,
                   (unsigned long long)o.region, pattern_name(o.pattern), o.iters, o.inflight,
                   o.naddrs, o.clients, r->initiator, o.threads, (unsigned long long)r->bytes,
                   r->gbps, r->xfers_per_s, r->p50_us, r->p99_us, r->max_us,
                   (unsigned long long)r->lat_n, r->seen_p50_us, r->seen_p99_us,
                   r->submit_ns_per_block, r->init_cpu_s_per_gb, r->target_cpu_s_per_gb,
                   r->create_ms, r->md_bytes, r->peer_add_ms, r->transport,
                   (unsigned long long)r->start_ns, (unsigned long long)r->end_ns,
                   (unsigned long long)r->xfers, o.load_1m, o.cores, host_busy() ? "true" : "false",
                   !o.verify ? "null"
                   : r->bad  ? "false"
                             : "true",
                   (unsigned long long)r->bad);
        }
        fflush(stdout);
        return;
    }
    busy_warning(stdout);
    fmt_size(o.region, rg, sizeof(rg));
    if (o.load_s > 0)
        printf("kvx-bench %s: load for %.0f s, random writes each read back and compared, a %s "
               "region on each side, %d peer(s), %d initiator(s), progress thread %s\n",
               kvx_version(), o.load_s, rg, o.naddrs, o.clients, o.threads ? "on" : "off");
    else
        printf("kvx-bench %s: %s blocks of a %s region on each side, %d iteration(s) after %d "
               "warm-up, %d in flight per peer, %d peer(s), %d initiator(s), progress thread "
               "%s\n",
               kvx_version(), pattern_name(o.pattern), rg, o.iters, o.warmup, o.inflight, o.naddrs,
               o.clients, o.threads ? "on" : "off");
    printf("%-8s %6s %8s %10s %10s %9s %10s %10s %8s %8s  %-10s %s\n", "op", "block", "blocks",
           "GB/s", "xfers/s", "p50 ms", "p99 ms", "sub ns/blk", "cpu s/GB", "tgt s/GB", "transport",
           "verified");
    for (int i = 0; i < n; i++) {
        const result_t *r = &res[i];
        if (o.clients > 1)
            snprintf(op, sizeof(op), "%s%s%.0d", r->op, r->initiator < 0 ? "*" : "#",
                     r->initiator < 0 ? 0 : r->initiator);
        else
            snprintf(op, sizeof(op), "%s", r->op);
        if (o.clients > 1 && r->initiator == 0)
            op[strlen(r->op) + 1] = '0', op[strlen(r->op) + 2] = '\0';
        if (r->lat_n > 0 && r->lat_n < P99_MIN_SAMPLES) {
            maxed = true;
            fewest = r->lat_n < fewest ? r->lat_n : fewest;
        }
        printf("%-8s %6s %8llu %10.3f %10.1f %9s %10s %10.1f %8.3f %8.3f  %-10s %s\n", op,
               fmt_size(r->size, sz, sizeof(sz)), (unsigned long long)r->blocks, r->gbps,
               r->xfers_per_s, r->lat_n ? fmt_ms(r->p50_us, p50, sizeof(p50)) : "-",
               fmt_p99(r->p99_us, r->max_us, r->lat_n, p99, sizeof(p99)), r->submit_ns_per_block,
               r->init_cpu_s_per_gb, r->target_cpu_s_per_gb, r->transport,
               !o.verify ? "off"
               : r->bad  ? "NO"
                         : "yes");
    }
    printf("p50/p99: submit to completion, ms. cpu s/GB, tgt s/GB: CPU seconds (all threads, "
           "warm-up included) of the initiator and of the target(s) per GB (10^9 bytes) moved\n");
    if (maxed)
        printf("max: %llu transfer(s) measured, under the %d a p99 needs: the p99 column shows "
               "the slowest (-n sets the count)\n",
               (unsigned long long)fewest, P99_MIN_SAMPLES);
    for (int i = 0; i < n && (o.wait || o.wait_fd); i++) /* the wake-up's cost, measured */
        if (res[i].seen_p50_us > 0)
            printf("%s %s: submit to seen by the application (one in flight, %s): p50 %s ms, "
                   "p99 %s ms\n",
                   res[i].op, fmt_size(res[i].size, sz, sizeof(sz)),
                   o.wait_fd ? "asleep on the event fd"
                   : o.wait  ? "asleep in kvx_transport_wait"
                             : "spinning on poll",
                   fmt_ms(res[i].seen_p50_us, p50, sizeof(p50)),
                   fmt_ms(res[i].seen_p99_us, p99, sizeof(p99)));
    if (n > 0)
        printf("set-up: create %.2f ms, metadata %zu bytes, pairing by address %.2f ms "
               "(kvx_peer_connect, median of 5)\n",
               res[0].create_ms, res[0].md_bytes, res[0].peer_add_ms);
    if (o.clients > 1)
        printf("rows op#k: initiator k; op*: all initiators together (their bytes over the span "
               "from the first start to the last end; latency: the worst initiator's)\n");
    for (int i = 0; i < n; i++)
        if (strcmp(res[i].op, "load") == 0 && (o.clients == 1 || res[i].initiator < 0))
            printf("load: %llu transfers (half writes, half reads of them back), %llu bytes, "
                   "%llu failed transfers or wrong blocks, each id completed once\n",
                   (unsigned long long)res[i].xfers, (unsigned long long)res[i].bytes,
                   (unsigned long long)res[i].bad);
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

/* Read the initiators' JSON lines, and add, per (op, size), their aggregate. */
int collect_initiators(FILE **outs, int m, result_t *res, int cap)
{
    static char opname[MAX_SIZES * 4][8];
    char line[2048];
    int n = 0, base;

    for (int k = 0; k < m; k++) {
        while (fgets(line, sizeof(line), outs[k]) != NULL && n < cap) {
            result_t *r = &res[n];
            if (line[0] != '{')
                continue;
            memset(r, 0, sizeof(*r));
            json_str(line, "op", opname[n], sizeof(opname[n]));
            r->op = opname[n];
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
            r->initiator = k;
            json_str(line, "transport", r->transport, sizeof(r->transport));
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
        a->bytes += res[i].bytes;
        a->xfers += res[i].xfers;
        a->bad += res[i].bad;
        a->xfers_per_s += res[i].xfers_per_s;
        a->p99_us = res[i].p99_us > a->p99_us ? res[i].p99_us : a->p99_us;
        a->max_us = res[i].max_us > a->max_us ? res[i].max_us : a->max_us;
        a->p50_us = res[i].p50_us > a->p50_us ? res[i].p50_us : a->p50_us;
        a->lat_n = res[i].lat_n < a->lat_n ? res[i].lat_n : a->lat_n;
        a->start_ns = res[i].start_ns < a->start_ns ? res[i].start_ns : a->start_ns;
        a->end_ns = res[i].end_ns > a->end_ns ? res[i].end_ns : a->end_ns;
        a->gbps = (double)a->bytes / (double)(a->end_ns - a->start_ns);
    }
    return n;
}

int client_run(void)
{
    int ctl[MAX_PEERS];
    result_t res[MAX_SIZES * 2];
    int nres = 0, bad = 0;

    for (int i = 0; i < o.naddrs; i++)
        ctl[i] = connect_to(o.addrs[i]);
    if (o.hol) {
        bad = run_hol(ctl);
        for (int i = 0; i < o.naddrs; i++) {
            msg_send(ctl[i], MSG_BYE, NULL, 0);
            close(ctl[i]);
        }
        if (bad)
            fprintf(stderr, "kvx-bench: verification FAILED\n");
        return bad;
    }
    for (int s = 0; s < o.nsizes; s++) {
        if (o.load_s > 0)
            run_load(ctl, o.sizes[s], res, &nres);
        else
            run_size(ctl, o.sizes[s], res, &nres);
    }
    for (int i = 0; i < o.naddrs; i++) {
        msg_send(ctl[i], MSG_BYE, NULL, 0);
        close(ctl[i]);
    }
    print_results(res, nres);
    for (int i = 0; i < nres; i++)
        if (res[i].bad)
            bad = 1;
    if (bad)
        fprintf(stderr, "kvx-bench: verification FAILED\n");
    return bad;
}
