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
#include "hol.h"

#include "client.h"
#include "ctl.h"

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
    const struct opts *o;
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
    /* the polling thread's, over one phase */
    int bulk_busy;
    uint64_t bulk_bytes, last_bulk, poll_max;
} hol_t;

/* Ask the server to check n remote blocks against the patterns of their local sources (dst and
 * src NULL: the blocks from first_dst on, each its own source). */
static uint64_t hol_verify(hol_t *h, const uint32_t *dst, const uint32_t *src, uint64_t n,
                           uint64_t first_dst)
{
    verify_req_t q = {.block_len = h->size,
                      .num_blocks = h->cl.nb,
                      .salt = CLIENT_SALT + (uint64_t)h->o->client_index,
                      .n = (uint32_t)n};
    uint32_t *idx = NULL;
    uint64_t bad;

    if (dst == NULL) {
        idx = malloc(sizeof(*idx) * (n ? n : 1));
        if (idx == NULL)
            die("out of memory");
        for (uint64_t k = 0; k < n; k++)
            idx[k] = (uint32_t)(first_dst + k);
        dst = src = idx;
    }
    bad = ctl_verify(h->ctl[0], &q, dst, src);
    free(idx);
    return bad;
}

/* Submit urgent transfer number h->nu into its slot s, under h->mu. */
static void hol_submit_urgent(hol_t *h, uint64_t s)
{
    const struct opts *o = h->o;
    uint64_t first = h->nbulk + s * h->ublocks;
    uint32_t ul[64], ur[64];
    /* Urgent transfers' parameters: their priority (--hol-prio on, the default) is the one
     * thing that tells them from the bulk; with --hol-prio off they are plain transfers,
     * and this measures the queue they wait behind. */
    kvx_xfer_params_t up = {.field_mask = o->hol_prio != 0 ? KVX_XFER_PARAM_PRIORITY : 0,
                            .priority = KVX_PRIO_HIGH};

    for (uint64_t k = 0; k < h->ublocks; k++)
        ul[k] = ur[k] = (uint32_t)(first + k);
    if (o->hol_op == OP_READ)
        memset(h->cl.base + first * h->size, 0, h->ublocks * h->size);
    /* the id is stored before the polling thread can look for it: it takes mu to */
    uint64_t c0 = now_ns();
    int rc = o->hol_op == OP_READ
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
}

/* The urgent transfers' own thread: one submission every --hol-every-us, asleep in between,
 * so that the rate holds whatever the polling thread is doing (a poll call can take tens of ms
 * under bulk traffic: poll_max_us). */
static void *hol_submitter(void *arg)
{
    hol_t *h = arg;
    uint64_t every = (uint64_t)(h->o->hol_every_us * 1e3), next = now_ns();

    for (;;) {
        struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull),
                              .tv_nsec = (long)(next % 1000000000ull)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
            ;
        uint64_t now = now_ns();
        if (now >= h->end_ns || h->nu >= h->nmax)
            break;
        uint64_t s = h->nu % h->nslots;
        pthread_mutex_lock(&h->mu);
        if (h->slot_id[s] != 0) { /* still in flight: try again shortly */
            pthread_mutex_unlock(&h->mu);
            next = now + 50000;
            continue;
        }
        hol_submit_urgent(h, s);
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

/* The bulk: KVX_PRIO_LOW (--hol-prio high or off: the default priority), whole region, each
 * write resubmitted as soon as it completed. */
static void hol_submit_bulk(hol_t *h)
{
    for (int b = 0; b < h->o->hol_bulk; b++) {
        if (h->bulk_id[b] != 0)
            continue;
        kvx_xfer_params_t bp = {.field_mask = h->o->hol_prio == 1 ? KVX_XFER_PARAM_PRIORITY : 0,
                                .priority = KVX_PRIO_LOW};
        CHECK_KVX(
            kvx_xfer_write(h->cl.t, h->cl.peer[0], h->L, h->R, h->nbulk, &bp, &h->bulk_id[b]));
        h->bulk_busy++;
    }
}

/* A completion, a bulk write's or an urgent transfer's; dies on a failed or a stray one. */
static void hol_complete(hol_t *h, const kvx_completion_t *c, hol_phase_t *ph)
{
    bool found = false;

    if (c->status != 0)
        die("transfer %llu failed: %s", (unsigned long long)c->id, kvx_strerror(c->status));
    for (int b = 0; b < h->o->hol_bulk && !found; b++)
        if (h->bulk_id[b] == c->id) {
            found = true;
            if (c->bytes != h->nbulk * h->size)
                ph->bad++;
            h->bulk_id[b] = 0;
            h->bulk_busy--;
            h->bulk_bytes += c->bytes;
            ph->bulk_xfers++;
            h->last_bulk = now_ns();
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
            if (h->o->hol_op == OP_READ)
                for (uint64_t k = 0; k < h->ublocks; k++)
                    if (kvx_pattern_check(h->cl.base + (first + k) * h->size, h->size, SERVER_SALT,
                                          first + k, 0) != 0)
                        ph->bad++;
        }
    pthread_mutex_unlock(&h->mu);
    if (!found)
        die("transfer %llu completed but nobody waits for it", (unsigned long long)c->id);
}

/* Poll until the phase has ended and everything in flight has completed. */
static void hol_poll_phase(hol_t *h, bool urgent, bool bulk, pthread_t th, hol_phase_t *ph)
{
    bool joined = !urgent;
    kvx_completion_t comp[64];

    for (;;) {
        bool running = now_ns() < h->end_ns;
        if (bulk && running)
            hol_submit_bulk(h);
        if (!running && !joined) {
            pthread_join(th, NULL);
            joined = true;
        }
        if (joined && h->bulk_busy == 0) {
            pthread_mutex_lock(&h->mu);
            bool idle = h->ndone == h->nu;
            pthread_mutex_unlock(&h->mu);
            if (idle)
                break;
        }
        uint64_t p0 = now_ns();
        int n = kvx_transport_poll(h->cl.t, NULL, comp, 64);
        if (now_ns() - p0 > h->poll_max)
            h->poll_max = now_ns() - p0;
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        for (int i = 0; i < n; i++)
            hol_complete(h, &comp[i], ph);
    }
}

/* One phase of `seconds`: urgent transfers at the set rate (if urgent), --hol-bulk bulk writes in
 * flight (if bulk). Then drain, and verify. An urgent transfer's latency is kvx's duration_ns
 * (submission to completion) plus the time its submit call took (it is not stamped before the
 * call has kvx's lock): from the moment the application asked to the completion. */
static void hol_run_phase(hol_t *h, bool urgent, bool bulk, double seconds, hol_phase_t *ph)
{
    const struct opts *o = h->o;
    uint64_t start;
    pthread_t th = 0;

    memset(ph, 0, sizeof(*ph));
    memset(h->slot_id, 0, sizeof(uint64_t) * h->nslots);
    memset(h->bulk_id, 0, sizeof(h->bulk_id));
    h->nu = h->ndone = h->used = h->late = h->submit_max_ns = 0;
    h->bulk_busy = 0;
    h->bulk_bytes = h->last_bulk = h->poll_max = 0;
    ctl_refill(h->ctl[0], h->size, h->cl.nb);
    start = now_ns();
    h->end_ns = start + (uint64_t)(seconds * 1e9);
    if (urgent && pthread_create(&th, NULL, hol_submitter, h) != 0)
        die("pthread_create failed");
    hol_poll_phase(h, urgent, bulk, th, ph);
    if (o->verify && bulk)
        ph->bad += hol_verify(h, h->R, h->L, h->nbulk, 0);
    if (o->verify && urgent && o->hol_op == OP_WRITE && h->used > 0)
        ph->bad += hol_verify(h, NULL, NULL, h->used * h->ublocks, h->nbulk);
    uint64_t nlat = h->ndone;
    sort_u64(h->lat, nlat);
    ph->urgent = nlat;
    ph->late = h->late;
    ph->p50_us = pct_us(h->lat, nlat, 50);
    ph->p99_us = pct_us(h->lat, nlat, 99);
    ph->max_us = nlat ? (double)h->lat[nlat - 1] / 1e3 : 0;
    ph->submit_max_us = (double)h->submit_max_ns / 1e3;
    ph->poll_max_us = (double)h->poll_max / 1e3;
    ph->bulk_gbps =
        h->last_bulk > start ? (double)h->bulk_bytes / (double)(h->last_bulk - start) : 0;
}

/* The layout, the client (its region holds the bulk's blocks and the urgent slots), the maps. */
static void hol_open(hol_t *h, const struct opts *o, int *ctl)
{
    uint64_t *scratch;

    memset(h, 0, sizeof(*h));
    h->o = o;
    h->ctl = ctl;
    h->size = o->nsizes ? o->sizes[0] : 64ull << 10;
    h->nbulk = o->region / h->size;
    h->ublocks = (uint64_t)o->hol_blocks;
    /* urgent transfers per phase at most, and slots for all of them within 1 GiB */
    h->nmax = (uint64_t)(o->hol_seconds * 1e6 / o->hol_every_us) + 1;
    h->nslots = h->nmax;
    if (h->nslots * h->ublocks * h->size > (1ull << 30))
        h->nslots = (1ull << 30) / (h->ublocks * h->size);
    if (h->nbulk == 0 || h->nslots == 0 || h->ublocks > 64)
        die("--hol: the region holds no block of that size, or too many urgent blocks (at most "
            "64, each at most 1 GiB / block size)");
    client_open(&h->cl, o, ctl, h->size, (h->nbulk + h->nslots * h->ublocks) * h->size);
    h->L = malloc(sizeof(uint32_t) * h->nbulk);
    h->R = malloc(sizeof(uint32_t) * h->nbulk);
    h->slot_id = calloc(h->nslots, sizeof(uint64_t));
    h->call_ns = calloc(h->nslots, sizeof(uint64_t));
    pthread_mutex_init(&h->mu, NULL);
    h->lat = malloc(sizeof(uint64_t) * h->nmax);
    scratch = malloc(sizeof(uint64_t) * h->nbulk);
    if (!h->L || !h->R || !h->slot_id || !h->call_ns || !h->lat || !scratch)
        die("out of memory");
    kvx_index_map(h->L, h->R, h->nbulk, h->nbulk, 0, 0, o->pattern, scratch);
    free(scratch);
}

static void hol_close(hol_t *h)
{
    free(h->L);
    free(h->R);
    free(h->slot_id);
    free(h->call_ns);
    pthread_mutex_destroy(&h->mu);
    free(h->lat);
    client_close(&h->cl);
}

/* The three phases reported: urgent idle, bulk alone, both. */
typedef struct hol_result {
    hol_phase_t idle, alone, both;
    uint64_t bad;
    char transport[KVX_TRANSPORT_NAME_MAX];
} hol_result_t;

static void hol_print_json(const hol_t *h, const hol_result_t *r)
{
    const struct opts *o = h->o;
    const hol_phase_t *idle = &r->idle, *alone = &r->alone, *both = &r->both;

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
           o->hol_op == OP_READ ? "read" : "write", (unsigned long long)h->size,
           (unsigned long long)h->ublocks, (unsigned long long)h->nbulk, o->hol_bulk,
           o->hol_every_us, o->hol_seconds, opts_pattern_name(o->pattern),
           (unsigned long long)both->urgent, (unsigned long long)both->late, both->p50_us,
           both->p99_us, both->max_us, both->bulk_gbps, (unsigned long long)both->bulk_xfers,
           (unsigned long long)idle->urgent, idle->p50_us, idle->p99_us, idle->max_us,
           alone->bulk_gbps, (unsigned long long)alone->bulk_xfers, both->submit_max_us,
           both->poll_max_us, r->transport,
           o->hol_prio == 1   ? "\"on\""
           : o->hol_prio == 2 ? "\"high\""
                              : "\"off\"",
           o->host.load_1m, o->host.cores, host_busy(&o->host) ? "true" : "false",
           !o->verify ? "null"
           : r->bad   ? "false"
                      : "true",
           (unsigned long long)r->bad);
}

/* A row of the table: a phase with urgent transfers. */
static void hol_print_urgent(const char *name, const hol_phase_t *ph, const char *bulk)
{
    char a[32], b[32], c[32];

    printf("%-22s %9llu %10s %10s %10s %9llu %10s\n", name, (unsigned long long)ph->urgent,
           ph->urgent ? fmt_ms(ph->p50_us, a, sizeof(a)) : "-",
           fmt_p99(ph->p99_us, ph->max_us, ph->urgent, b, sizeof(b)),
           ph->urgent ? fmt_ms(ph->max_us, c, sizeof(c)) : "-", (unsigned long long)ph->late, bulk);
}

static void hol_print_table(const hol_t *h, const hol_result_t *r)
{
    const struct opts *o = h->o;
    const hol_phase_t *idle = &r->idle, *alone = &r->alone, *both = &r->both;
    char sz[24], a[32], b[32];

    busy_warning(stdout, &o->host);
    printf("kvx-bench %s --hol: %s urgent %s(s) of %llu block(s) every %.0f us, while %d "
           "whole-region writes (%llu blocks, %s) stream to the same peer; %.1f s per phase, "
           "transport %s, priorities %s\n",
           kvx_version(), fmt_size(h->size, sz, sizeof(sz)),
           o->hol_op == OP_READ ? "read" : "write", (unsigned long long)h->ublocks, o->hol_every_us,
           o->hol_bulk, (unsigned long long)h->nbulk,
           o->pattern == PAT_SCATTER ? "scattered" : "other pattern", o->hol_seconds, r->transport,
           o->hol_prio == 1   ? "urgent high, bulk low"
           : o->hol_prio == 2 ? "urgent high, bulk default"
                              : "off");
    printf("%-22s %9s %10s %10s %10s %9s %10s\n", "phase", "urgent", "p50 ms", "p99 ms", "max ms",
           "late", "bulk GB/s");
    hol_print_urgent("urgent, idle", idle, "-");
    printf("%-22s %9s %10s %10s %10s %9s %10.3f\n", "bulk alone", "-", "-", "-", "-", "-",
           alone->bulk_gbps);
    snprintf(b, sizeof(b), "%10.3f", both->bulk_gbps);
    hol_print_urgent("urgent with bulk", both, b);
    if (idle->urgent < P99_MIN_SAMPLES || both->urgent < P99_MIN_SAMPLES)
        printf("max: under the %d urgent transfers a p99 needs: the p99 column shows the "
               "slowest\n",
               P99_MIN_SAMPLES);
    printf("with bulk: the longest urgent submit call %s ms, the longest poll call %s ms\n",
           fmt_ms(both->submit_max_us, a, sizeof(a)), fmt_ms(both->poll_max_us, b, sizeof(b)));
    printf("ratios: urgent p50 %.1fx, p99 %.1fx of idle; bulk %.2fx of alone; verified %s\n",
           idle->p50_us > 0 ? both->p50_us / idle->p50_us : 0,
           idle->p99_us > 0 ? both->p99_us / idle->p99_us : 0,
           alone->bulk_gbps > 0 ? both->bulk_gbps / alone->bulk_gbps : 0,
           !o->verify ? "off"
           : r->bad   ? "NO"
                      : "yes");
}

int hol_run(const struct opts *o, int *ctl)
{
    hol_t h;
    hol_result_t r;
    hol_phase_t warm;

    hol_open(&h, o, ctl);
    /* a short warm-up of both (connections, first touch), not reported */
    hol_run_phase(&h, true, true, 0.2, &warm);
    hol_run_phase(&h, true, false, o->hol_seconds, &r.idle);
    hol_run_phase(&h, false, true, o->hol_seconds, &r.alone);
    hol_run_phase(&h, true, true, o->hol_seconds, &r.both);
    client_transport(&h.cl, r.transport, sizeof(r.transport));
    r.bad = warm.bad + r.idle.bad + r.alone.bad + r.both.bad;
    if (o->json)
        hol_print_json(&h, &r);
    else
        hol_print_table(&h, &r);
    fflush(stdout);
    hol_close(&h);
    return r.bad != 0;
}
