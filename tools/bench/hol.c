/*
 * kvx-bench --hol: head-of-line latency. Small urgent transfers are submitted at a fixed rate
 * while whole-region bulk writes stream to the same peer; each urgent transfer is timed from
 * submission to completion (kvx_completion_t.duration_ns), and the bulk's throughput is measured
 * over the same run. The same invocation also measures the urgent transfers with no bulk running
 * and the bulk alone, so that one command gives both sides of each ratio.
 *
 * Layout (the same on both sides): blocks [0, nbulk) are the bulk's (a whole region of --region
 * bytes, scattered), blocks [nbulk, nbulk + nslots * ublocks) the urgent transfers' slots, so the
 * two never overlap. Urgent transfer k takes slot k % nslots (a slot is used again only once its
 * last transfer completed); there are enough slots that, with the defaults, none is used twice in
 * a phase.
 *
 * Verification, every byte: the server's region is refilled before each phase; after it, one
 * VERIFY covers every urgent slot written (each holds its own local block's pattern) and every
 * block the bulk wrote; urgent reads are each checked on completion (their local slot is zeroed
 * before submission). The bulk writes the same blocks with the same bytes every time, as
 * kvx-bench's other modes do, so its check is of the final state after the phase (the last of its
 * transfers) plus each completion's status and byte count, not of every pass separately.
 */
#include "bench.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct hol_phase {
    uint64_t urgent, late, bad;
    double p50_us, p99_us, max_us;
    double submit_max_us, poll_max_us; /* the longest urgent submit call, and poll call */
    double bulk_gbps;
    uint64_t bulk_xfers;
} hol_phase_t;

typedef struct hol {
    int *ctl;
    client_t cl;
    uint64_t size, nbulk, nslots, ublocks, nmax;
    uint32_t *L, *R; /* the bulk's map */
    uint64_t bulk_id[MAX_INITIATORS];
    /* the urgent submitter's thread and the polling thread share these, under mu */
    pthread_mutex_t mu;
    uint64_t *slot_id;  /* in-flight urgent transfer per slot (0: free) */
    uint64_t *call_ns;  /* per slot: how long its submit call took */
    uint64_t *lat;      /* latencies of the completed urgent transfers */
    uint64_t nu, ndone; /* urgent submitted, completed */
    uint64_t used;      /* slots used this phase */
    uint64_t end_ns;    /* the phase's end: no submission after it */
    uint64_t late, submit_max_ns;
} hol_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void hol_refill(hol_t *h)
{
    uint64_t geo[2] = {h->size, h->cl.nb};
    msg_hdr_t mh;
    msg_send(h->ctl[0], MSG_REFILL, geo, sizeof(geo));
    free(msg_recv(h->ctl[0], &mh));
}

/* Ask the server to check n remote blocks against the patterns of their local sources. */
static uint64_t hol_verify(hol_t *h, const uint32_t *dst, const uint32_t *src, uint64_t n,
                           uint64_t first_dst)
{
    size_t len = sizeof(verify_req_t) + 8 * n;
    uint8_t *buf = malloc(len), *rep;
    uint32_t *pairs = (uint32_t *)(buf + sizeof(verify_req_t));
    verify_req_t q = {.block_len = h->size,
                      .num_blocks = h->cl.nb,
                      .salt = CLIENT_SALT + (uint64_t)o.client_index,
                      .n = (uint32_t)n};
    msg_hdr_t mh;
    uint64_t bad;

    if (buf == NULL)
        die("out of memory");
    memcpy(buf, &q, sizeof(q));
    for (uint64_t k = 0; k < n; k++) {
        pairs[2 * k] = dst ? dst[k] : (uint32_t)(first_dst + k);
        pairs[2 * k + 1] = src ? src[k] : (uint32_t)(first_dst + k);
    }
    msg_send(h->ctl[0], MSG_VERIFY, buf, (uint32_t)len);
    rep = msg_recv(h->ctl[0], &mh);
    memcpy(&bad, rep, sizeof(bad));
    free(rep);
    free(buf);
    return bad;
}

static double pct(const uint64_t *v, uint64_t n, int p)
{
    return n ? (double)v[(n * (uint64_t)p + 99) / 100 - 1] / 1e3 : 0;
}

/* The urgent transfers' own thread: one submission every --hol-every-us, asleep in between,
 * so that the rate holds whatever the polling thread is doing (a poll call can take tens of ms
 * under bulk traffic: poll_max_us). */
static void *hol_submitter(void *arg)
{
    hol_t *h = arg;
    uint64_t every = (uint64_t)(o.hol_every_us * 1e3), next = now_ns();
    uint32_t ul[64], ur[64];

    for (;;) {
        struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull),
                              .tv_nsec = (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
            ;
        uint64_t now = now_ns();
        if (now >= h->end_ns || h->nu >= h->nmax)
            break;
        uint64_t s = h->nu % h->nslots, first = h->nbulk + s * h->ublocks;
        pthread_mutex_lock(&h->mu);
        if (h->slot_id[s] != 0) { /* still in flight: try again shortly */
            pthread_mutex_unlock(&h->mu);
            next = now + 50000;
            continue;
        }
        /* Urgent transfers' parameters: their priority (--hol-prio on, the default) is the one
         * thing that tells them from the bulk; with --hol-prio off they are plain transfers,
         * and this measures the queue they wait behind. */
        kvx_xfer_params_t up = {.field_mask = o.hol_prio != 0 ? KVX_XFER_PARAM_PRIORITY : 0,
                                .priority = KVX_PRIO_HIGH};
        for (uint64_t k = 0; k < h->ublocks; k++)
            ul[k] = ur[k] = (uint32_t)(first + k);
        if (o.hol_op == OP_READ)
            memset(h->cl.base + first * h->size, 0, h->ublocks * h->size);
        /* the id is stored before the polling thread can look for it: it takes mu to */
        uint64_t c0 = now_ns();
        int rc =
            o.hol_op == OP_READ
                ? kvx_xfer_read(h->cl.t, h->cl.peer[0], ul, ur, h->ublocks, &up, &h->slot_id[s])
                : kvx_xfer_write(h->cl.t, h->cl.peer[0], ul, ur, h->ublocks, &up, &h->slot_id[s]);
        uint64_t c1 = now_ns();
        if (rc < 0)
            die("urgent submit: %s", kvx_strerror(rc));
        h->call_ns[s] = c1 - c0;
        if (c1 - c0 > h->submit_max_ns)
            h->submit_max_ns = c1 - c0;
        h->nu++;
        if (h->nu <= h->nslots)
            h->used = h->nu;
        pthread_mutex_unlock(&h->mu);
        /* a fixed rate: a submission more than a period behind its time (this thread was held
         * up, or its slot was still busy) restarts the schedule, with no burst to catch up */
        if (now - next > every) {
            h->late++;
            next = now;
        }
        next += every;
    }
    return NULL;
}

/* One phase of `seconds`: urgent transfers at the set rate (if urgent), o.hol_bulk bulk writes in
 * flight (if bulk). Then drain, and verify. An urgent transfer's latency is kvx's duration_ns
 * (submission to completion) plus the time its submit call took (it is not stamped before the
 * call has kvx's lock): from the moment the application asked to the completion. */
static void hol_run_phase(hol_t *h, bool urgent, bool bulk, double seconds, hol_phase_t *ph)
{
    uint64_t start, last_bulk = 0, bulk_bytes = 0, bulk_len = h->nbulk * h->size, poll_max = 0;
    int bulk_busy = 0;
    bool joined = !urgent;
    kvx_completion_t comp[64];
    pthread_t th;

    memset(ph, 0, sizeof(*ph));
    memset(h->slot_id, 0, sizeof(uint64_t) * h->nslots);
    memset(h->bulk_id, 0, sizeof(h->bulk_id));
    h->nu = h->ndone = h->used = h->late = h->submit_max_ns = 0;
    hol_refill(h);
    start = now_ns();
    h->end_ns = start + (uint64_t)(seconds * 1e9);
    if (urgent && pthread_create(&th, NULL, hol_submitter, h) != 0)
        die("pthread_create failed");
    for (;;) {
        bool running = now_ns() < h->end_ns;
        for (int b = 0; bulk && running && b < o.hol_bulk; b++) {
            if (h->bulk_id[b] != 0)
                continue;
            /* the bulk: KVX_PRIO_LOW (--hol-prio high or off: the default priority), whole
             * region, resubmitted at once */
            kvx_xfer_params_t bp = {.field_mask = o.hol_prio == 1 ? KVX_XFER_PARAM_PRIORITY : 0,
                                    .priority = KVX_PRIO_LOW};
            CHECK_KVX(
                kvx_xfer_write(h->cl.t, h->cl.peer[0], h->L, h->R, h->nbulk, &bp, &h->bulk_id[b]));
            bulk_busy++;
        }
        if (!running && !joined) {
            pthread_join(th, NULL);
            joined = true;
        }
        if (joined && bulk_busy == 0) {
            pthread_mutex_lock(&h->mu);
            bool idle = h->ndone == h->nu;
            pthread_mutex_unlock(&h->mu);
            if (idle)
                break;
        }
        uint64_t p0 = now_ns();
        int n = kvx_transport_poll(h->cl.t, NULL, comp, 64);
        if (now_ns() - p0 > poll_max)
            poll_max = now_ns() - p0;
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        for (int i = 0; i < n; i++) {
            const kvx_completion_t *c = &comp[i];
            bool found = false;
            if (c->status != 0)
                die("transfer %llu failed: %s", (unsigned long long)c->id, kvx_strerror(c->status));
            for (int b = 0; b < o.hol_bulk && !found; b++)
                if (h->bulk_id[b] == c->id) {
                    found = true;
                    if (c->bytes != bulk_len)
                        ph->bad++;
                    h->bulk_id[b] = 0;
                    bulk_busy--;
                    bulk_bytes += c->bytes;
                    ph->bulk_xfers++;
                    last_bulk = now_ns();
                }
            pthread_mutex_lock(&h->mu);
            for (uint64_t s = 0; s < h->used && !found; s++)
                if (h->slot_id[s] == c->id) {
                    uint64_t first = h->nbulk + s * h->ublocks;
                    found = true;
                    h->slot_id[s] = 0;
                    h->lat[h->ndone++] = c->duration_ns + h->call_ns[s];
                    if (c->bytes != h->ublocks * h->size)
                        ph->bad++;
                    if (o.hol_op == OP_READ)
                        for (uint64_t k = 0; k < h->ublocks; k++)
                            if (kvx_pattern_check(h->cl.base + (first + k) * h->size, h->size,
                                                  SERVER_SALT, first + k, 0) != 0)
                                ph->bad++;
                }
            pthread_mutex_unlock(&h->mu);
            if (!found)
                die("transfer %llu completed but nobody waits for it", (unsigned long long)c->id);
        }
    }
    if (o.verify && bulk)
        ph->bad += hol_verify(h, h->R, h->L, h->nbulk, 0);
    if (o.verify && urgent && o.hol_op == OP_WRITE && h->used > 0)
        ph->bad += hol_verify(h, NULL, NULL, h->used * h->ublocks, h->nbulk);
    uint64_t nlat = h->ndone;
    qsort(h->lat, nlat, sizeof(*h->lat), cmp_u64);
    ph->urgent = nlat;
    ph->late = h->late;
    ph->p50_us = pct(h->lat, nlat, 50);
    ph->p99_us = pct(h->lat, nlat, 99);
    ph->max_us = nlat ? (double)h->lat[nlat - 1] / 1e3 : 0;
    ph->submit_max_us = (double)h->submit_max_ns / 1e3;
    ph->poll_max_us = (double)poll_max / 1e3;
    ph->bulk_gbps = last_bulk > start ? (double)bulk_bytes / (double)(last_bulk - start) : 0;
}

int run_hol(int *ctl)
{
    hol_t h;
    uint64_t region = o.region, *scratch;
    hol_phase_t idle, alone, both, warm;
    char sz[24];
    kvx_peer_attr_t pa = {.field_mask = KVX_PEER_ATTR_TRANSPORT};

    memset(&h, 0, sizeof(h));
    h.ctl = ctl;
    h.size = o.nsizes ? o.sizes[0] : 64ull << 10;
    h.nbulk = o.region / h.size;
    h.ublocks = (uint64_t)o.hol_blocks;
    /* urgent transfers per phase at most, and slots for all of them within 1 GiB */
    h.nmax = (uint64_t)(o.hol_seconds * 1e6 / o.hol_every_us) + 1;
    h.nslots = h.nmax;
    if (h.nslots * h.ublocks * h.size > (1ull << 30))
        h.nslots = (1ull << 30) / (h.ublocks * h.size);
    if (h.nbulk == 0 || h.nslots == 0 || h.ublocks > 64)
        die("--hol: the region holds no block of that size, or too many urgent blocks (at most "
            "64, each at most 1 GiB / block size)");
    o.region = (h.nbulk + h.nslots * h.ublocks) * h.size;
    client_open(&h.cl, ctl, h.size);
    o.region = region;
    h.L = malloc(sizeof(uint32_t) * h.nbulk);
    h.R = malloc(sizeof(uint32_t) * h.nbulk);
    h.slot_id = calloc(h.nslots, sizeof(uint64_t));
    h.call_ns = calloc(h.nslots, sizeof(uint64_t));
    pthread_mutex_init(&h.mu, NULL);
    h.lat = malloc(sizeof(uint64_t) * h.nmax);
    scratch = malloc(sizeof(uint64_t) * h.nbulk);
    if (!h.L || !h.R || !h.slot_id || !h.call_ns || !h.lat || !scratch)
        die("out of memory");
    kvx_index_map(h.L, h.R, h.nbulk, h.nbulk, 0, 0, o.pattern, scratch);
    free(scratch);

    /* a short warm-up of both (connections, first touch), not reported */
    hol_run_phase(&h, true, true, 0.2, &warm);
    hol_run_phase(&h, true, false, o.hol_seconds, &idle);
    hol_run_phase(&h, false, true, o.hol_seconds, &alone);
    hol_run_phase(&h, true, true, o.hol_seconds, &both);
    CHECK_KVX(kvx_peer_query(h.cl.t, h.cl.peer[0], &pa));

    uint64_t bad = warm.bad + idle.bad + alone.bad + both.bad;
    const char *op = o.hol_op == OP_READ ? "read" : "write";
    const char *ver = !o.verify ? "null" : bad ? "false" : "true";
    if (o.json) {
        printf("{\"tool\":\"kvx-bench\",\"mode\":\"hol\",\"op\":\"%s\",\"block_size\":%llu,"
               "\"urgent_blocks\":%llu,\"bulk_blocks\":%llu,\"bulk_inflight\":%d,"
               "\"every_us\":%.1f,\"seconds\":%.3f,\"pattern\":\"%s\",\"urgent\":%llu,"
               "\"urgent_late\":%llu,\"p50_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f,"
               "\"bulk_gbps\":%.4f,\"bulk_xfers\":%llu,\"idle_urgent\":%llu,"
               "\"idle_p50_us\":%.2f,\"idle_p99_us\":%.2f,\"idle_max_us\":%.2f,"
               "\"bulk_alone_gbps\":%.4f,\"bulk_alone_xfers\":%llu,\"submit_max_us\":%.2f,"
               "\"poll_max_us\":%.2f,\"transport\":\"%s\",\"priorities\":%s,"
               "\"load_avg_1m\":%.2f,\"cores\":%d,\"host_busy\":%s,"
               "\"verified\":%s,\"bad_blocks\":%llu}\n",
               op, (unsigned long long)h.size, (unsigned long long)h.ublocks,
               (unsigned long long)h.nbulk, o.hol_bulk, o.hol_every_us, o.hol_seconds,
               o.pattern == PAT_CONTIG    ? "contiguous"
               : o.pattern == PAT_SCATTER ? "scattered"
                                          : "random",
               (unsigned long long)both.urgent, (unsigned long long)both.late, both.p50_us,
               both.p99_us, both.max_us, both.bulk_gbps, (unsigned long long)both.bulk_xfers,
               (unsigned long long)idle.urgent, idle.p50_us, idle.p99_us, idle.max_us,
               alone.bulk_gbps, (unsigned long long)alone.bulk_xfers, both.submit_max_us,
               both.poll_max_us, pa.transport,
               o.hol_prio == 1   ? "\"on\""
               : o.hol_prio == 2 ? "\"high\""
                                 : "\"off\"",
               o.load_1m, o.cores, host_busy() ? "true" : "false", ver, (unsigned long long)bad);
    } else {
        busy_warning(stdout);
        printf("kvx-bench %s --hol: %s urgent %s(s) of %llu block(s) every %.0f us, while %d "
               "whole-region writes (%llu blocks, %s) stream to the same peer; %.1f s per phase, "
               "transport %s, priorities %s\n",
               kvx_version(), fmt_size(h.size, sz, sizeof(sz)), op, (unsigned long long)h.ublocks,
               o.hol_every_us, o.hol_bulk, (unsigned long long)h.nbulk,
               o.pattern == PAT_SCATTER ? "scattered" : "other pattern", o.hol_seconds,
               pa.transport,
               o.hol_prio == 1   ? "urgent high, bulk low"
               : o.hol_prio == 2 ? "urgent high, bulk default"
                                 : "off");
        char a[32], b[32], c[32];
        printf("%-22s %9s %10s %10s %10s %9s %10s\n", "phase", "urgent", "p50 ms", "p99 ms",
               "max ms", "late", "bulk GB/s");
        printf("%-22s %9llu %10s %10s %10s %9llu %10s\n", "urgent, idle",
               (unsigned long long)idle.urgent,
               idle.urgent ? fmt_ms(idle.p50_us, a, sizeof(a)) : "-",
               fmt_p99(idle.p99_us, idle.max_us, idle.urgent, b, sizeof(b)),
               idle.urgent ? fmt_ms(idle.max_us, c, sizeof(c)) : "-", (unsigned long long)idle.late,
               "-");
        printf("%-22s %9s %10s %10s %10s %9s %10.3f\n", "bulk alone", "-", "-", "-", "-", "-",
               alone.bulk_gbps);
        printf("%-22s %9llu %10s %10s %10s %9llu %10.3f\n", "urgent with bulk",
               (unsigned long long)both.urgent,
               both.urgent ? fmt_ms(both.p50_us, a, sizeof(a)) : "-",
               fmt_p99(both.p99_us, both.max_us, both.urgent, b, sizeof(b)),
               both.urgent ? fmt_ms(both.max_us, c, sizeof(c)) : "-", (unsigned long long)both.late,
               both.bulk_gbps);
        if (idle.urgent < P99_MIN_SAMPLES || both.urgent < P99_MIN_SAMPLES)
            printf("max: under the %d urgent transfers a p99 needs: the p99 column shows the "
                   "slowest\n",
                   P99_MIN_SAMPLES);
        printf("with bulk: the longest urgent submit call %s ms, the longest poll call %s ms\n",
               fmt_ms(both.submit_max_us, a, sizeof(a)), fmt_ms(both.poll_max_us, b, sizeof(b)));
        printf("ratios: urgent p50 %.1fx, p99 %.1fx of idle; bulk %.2fx of alone; verified %s\n",
               idle.p50_us > 0 ? both.p50_us / idle.p50_us : 0,
               idle.p99_us > 0 ? both.p99_us / idle.p99_us : 0,
               alone.bulk_gbps > 0 ? both.bulk_gbps / alone.bulk_gbps : 0,
               !o.verify ? "off"
               : bad     ? "NO"
                         : "yes");
    }
    fflush(stdout);
    free(h.L);
    free(h.R);
    free(h.slot_id);
    free(h.call_ns);
    pthread_mutex_destroy(&h.mu);
    free(h.lat);
    client_close(&h.cl);
    return bad != 0;
}
