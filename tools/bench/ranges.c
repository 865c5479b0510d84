/*
 * kvx-bench --regions: transfers of lists of byte ranges (kvx_xfer_write_ranges,
 * kvx_xfer_read_ranges) between --regions regions registered on each side (kvx_region_register,
 * the server's loaded from their blobs), each range --ranges MIN..MAX bytes long (log-uniform)
 * at any byte offset, seeded by --seed; every byte of every range moved is checked.
 *
 * The ranges come from slots: a slot is a run always moved the same way (the same source bytes
 * to the same destination), and no two slots' destinations overlap, so transfers in flight
 * together leave one expected content whatever order they land in. A write's destinations are
 * in the server's regions (this initiator's slice of each), a read's in this initiator's.
 */
#include "ranges.h"

#include "client.h"
#include "ctl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The main regions the pairing needs (client_open, MSG_REGION): 16 blocks of 4 KiB, unused. */
#define MAIN_BLOCK 4096u
#define MAIN_BLOCKS 16u

/* d: the destination side (disjoint between slots), s: the source side. */
typedef struct slot {
    uint32_t dk, sk; /* region indices */
    uint64_t doff, soff, len;
} slot_t;

/* One ranges run: the client, both sides' regions, the slots of the op being measured. */
typedef struct rrun {
    const struct opts *o;
    int *ctl;
    client_t cl;
    int n;          /* regions per side */
    uint64_t bytes; /* of each region */
    uint8_t *lbase[MAX_RREGIONS];
    uint32_t lid[MAX_RREGIONS];
    uint32_t handle[MAX_PEERS][MAX_RREGIONS];
    double reg_us; /* kvx_region_register of the local regions, mean */
    slot_t *slots;
    size_t nslots, *perm;
    uint64_t K; /* ranges per transfer */
    int total;  /* transfers per peer: warm-up and measured */
    kvx_range_t *rg;
    uint64_t *xbytes; /* of each transfer */
    uint8_t *used;    /* slots some transfer moved */
    uint64_t *lat;
    uint64_t rng;
} rrun_t;

static uint64_t rr_rnd(rrun_t *r)
{
    r->rng ^= r->rng << 13;
    r->rng ^= r->rng >> 7;
    r->rng ^= r->rng << 17;
    return r->rng;
}

/* A length log-uniform in MIN..MAX. */
static uint64_t rr_len(rrun_t *r)
{
    double lo = log((double)r->o->ranges_min), hi = log((double)r->o->ranges_max);
    double u = (double)(rr_rnd(r) >> 11) * 0x1p-53;
    uint64_t len = (uint64_t)exp(lo + u * (hi - lo));

    return len < r->o->ranges_min   ? r->o->ranges_min
           : len > r->o->ranges_max ? r->o->ranges_max
                                    : len;
}

/* Slots whose destinations tile [dlo, dhi) of every region (gaps of 0..63 bytes, none when
 * the length is fixed: then block-aligned) and whose sources lie anywhere in a random region. */
static void rr_slots(rrun_t *r, uint64_t dlo, uint64_t dhi)
{
    bool fixed = r->o->ranges_min == r->o->ranges_max;
    uint64_t min = r->o->ranges_min, cap = 1024;

    r->nslots = 0;
    r->slots = malloc(cap * sizeof(*r->slots));
    for (int dk = 0; dk < r->n && r->slots != NULL; dk++) {
        uint64_t off = fixed ? (dlo + min - 1) / min * min : dlo + rr_rnd(r) % 64;
        for (;;) {
            uint64_t len = fixed ? min : rr_len(r);
            if (off + len > dhi)
                break;
            if (r->nslots == cap &&
                (r->slots = realloc(r->slots, (cap *= 2) * sizeof(slot_t))) == NULL)
                break;
            slot_t *s = &r->slots[r->nslots++];
            s->dk = (uint32_t)dk;
            s->doff = off;
            s->len = len;
            s->sk = (uint32_t)(rr_rnd(r) % (uint64_t)r->n);
            s->soff = fixed ? rr_rnd(r) % (r->bytes / len) * len : rr_rnd(r) % (r->bytes - len + 1);
            off += len + (fixed ? 0 : rr_rnd(r) % 64);
        }
    }
    if (r->slots == NULL || r->nslots == 0)
        die("--regions: no range of %llu bytes fits a region slice of %llu bytes",
            (unsigned long long)r->o->ranges_max, (unsigned long long)(dhi - dlo));
    r->perm = malloc(r->nslots * sizeof(*r->perm));
    r->used = calloc(r->nslots, 1);
    if (r->perm == NULL || r->used == NULL)
        die("out of memory");
    for (size_t i = 0; i < r->nslots; i++)
        r->perm[i] = i;
    for (size_t i = r->nslots - 1; i > 0; i--) { /* Fisher-Yates */
        size_t j = rr_rnd(r) % (i + 1), x = r->perm[i];
        r->perm[i] = r->perm[j];
        r->perm[j] = x;
    }
}

/* Transfer k (peer k % npeers, map k / npeers) takes K slots of the permutation in turn. */
static void rr_transfers(rrun_t *r, int op)
{
    int npeers = r->cl.npeers, ntx = r->total * npeers;

    r->K = r->o->blocks ? r->o->blocks : 64;
    if (r->K > r->nslots)
        r->K = r->nslots;
    r->rg = malloc(sizeof(*r->rg) * r->K * (size_t)ntx);
    r->xbytes = calloc((size_t)ntx, sizeof(*r->xbytes));
    r->lat = malloc(sizeof(*r->lat) * (size_t)ntx);
    if (r->rg == NULL || r->xbytes == NULL || r->lat == NULL)
        die("out of memory");
    for (int k = 0; k < ntx; k++) {
        int pi = k % npeers, m = k / npeers;
        for (uint64_t j = 0; j < r->K; j++) {
            size_t si = r->perm[((uint64_t)m * r->K + j) % r->nslots];
            const slot_t *s = &r->slots[si];
            kvx_range_t *g = &r->rg[(size_t)k * r->K + j];
            r->used[si] = 1;
            g->len = s->len;
            if (op == OP_WRITE) {
                g->local_region = r->lid[s->sk];
                g->local_offset = s->soff;
                g->remote_region = r->handle[pi][s->dk];
                g->remote_offset = s->doff;
            } else {
                g->local_region = r->lid[s->dk];
                g->local_offset = s->doff;
                g->remote_region = r->handle[pi][s->sk];
                g->remote_offset = s->soff;
            }
            r->xbytes[k] += s->len;
        }
    }
}

/* The submit/poll loop over one op; the measured phase starts once the warm-up has drained.
 * Returns the measured bytes; *start, *end, *nlat, *sub_ns (CPU per range submitted). */
static uint64_t rr_loop(rrun_t *r, int op, const char *name, uint64_t *start, uint64_t *end,
                        int *nlat, double *sub_ns)
{
    int npeers = r->cl.npeers, ntx = r->total * npeers, window = r->o->inflight * npeers;
    int warm = r->o->warmup * npeers, submitted = 0, completed = 0;
    uint64_t bytes = 0, sub_cpu = 0, sub_ranges = 0;
    kvx_completion_t comp[64];

    *nlat = 0;
    while (completed < ntx) {
        while (submitted < ntx && submitted - completed < window &&
               !(submitted == warm && completed < warm)) {
            bool timed = submitted >= warm && ((submitted - warm) & 7) == 0;
            uint64_t id, c0 = timed ? kvx_tool_thread_cpu_ns() : 0;
            const kvx_range_t *g = &r->rg[(size_t)submitted * r->K];
            const char *peer = r->cl.peer[submitted % npeers];
            int rc = op == OP_WRITE ? kvx_xfer_write_ranges(r->cl.t, peer, g, r->K, NULL, &id)
                                    : kvx_xfer_read_ranges(r->cl.t, peer, g, r->K, NULL, &id);
            if (rc < 0)
                die("submit ranges: %s", kvx_strerror(rc));
            if (timed) {
                sub_cpu += kvx_tool_thread_cpu_ns() - c0;
                sub_ranges += r->K;
            }
            if (submitted == warm)
                *start = now_ns();
            if (submitted >= warm)
                bytes += r->xbytes[submitted];
            submitted++;
        }
        int n = kvx_transport_poll(r->cl.t, NULL, comp, 64);
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        if (n == 0 && r->o->wait)
            kvx_transport_wait(r->cl.t, NULL, 100);
        for (int i = 0; i < n; i++) {
            if (comp[i].status != 0)
                die("ranges transfer %llu failed: %s", (unsigned long long)comp[i].id,
                    kvx_strerror(comp[i].status));
            if (completed >= warm)
                r->lat[(*nlat)++] = comp[i].duration_ns;
            completed++;
        }
        progress_line(r->o->quiet, name, completed, ntx);
    }
    *end = now_ns();
    *sub_ns = sub_ranges ? (double)sub_cpu / (double)sub_ranges : 0;
    return bytes;
}

/* Every slot a transfer moved: a write's checked by each server, a read's here. */
static uint64_t rr_verify(const rrun_t *r, int op)
{
    uint64_t bad = 0;
    range_check_t *c;
    size_t n = 0;

    if (op == OP_READ) {
        for (size_t i = 0; i < r->nslots; i++) {
            const slot_t *s = &r->slots[i];
            if (r->used[i] && kvx_pattern_check_run(r->lbase[s->dk] + s->doff, s->len, SERVER_SALT,
                                                    RR_SRC + s->sk, 0, s->soff) != 0)
                bad++;
        }
        return bad;
    }
    if ((c = malloc(sizeof(*c) * r->nslots)) == NULL)
        die("out of memory");
    for (size_t i = 0; i < r->nslots; i++)
        if (r->used[i])
            c[n++] = (range_check_t){.region = r->slots[i].dk,
                                     .src = r->slots[i].sk,
                                     .off = r->slots[i].doff,
                                     .src_off = r->slots[i].soff,
                                     .len = r->slots[i].len};
    for (int i = 0; i < r->cl.npeers; i++) {
        verify_ranges_req_t q = {.block_len = MAIN_BLOCK,
                                 .num_blocks = MAIN_BLOCKS,
                                 .salt = CLIENT_SALT + (uint64_t)r->o->client_index};
        bad += ctl_verify_ranges(r->ctl[i], &q, c, n);
    }
    free(c);
    return bad;
}

static void rr_op_free(rrun_t *r)
{
    free(r->slots);
    free(r->perm);
    free(r->used);
    free(r->rg);
    free(r->xbytes);
    free(r->lat);
    r->slots = NULL, r->perm = NULL, r->used = NULL, r->rg = NULL, r->xbytes = NULL;
    r->lat = NULL;
}

static void rr_op(rrun_t *r, int op, result_t *res, int nres)
{
    const struct opts *o = r->o;
    int npeers = r->cl.npeers, nlat;
    uint64_t slice = r->bytes / (uint64_t)o->clients, start = 0, end = 0, cpu0, tcpu0 = 0,
             tcpu1 = 0, bytes, all = 0;
    double secs;

    memset(res, 0, sizeof(*res));
    res->op = op == OP_WRITE ? "wranges" : "rranges";
    r->rng = o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)op + 1;
    if (op == OP_WRITE) /* into this initiator's slice of the servers' regions */
        rr_slots(r, (uint64_t)o->client_index * slice, (uint64_t)(o->client_index + 1) * slice);
    else
        rr_slots(r, 0, r->bytes);
    r->total = o->warmup + o->iters;
    rr_transfers(r, op);
    if (op == OP_READ) {
        /* every initiator's writes checked before any refills the servers' regions */
        if (o->clients > 1)
            ctl_barrier(r->ctl[0], 1000u + (uint32_t)nres, (uint32_t)o->clients);
        for (int i = 0; i < npeers; i++)
            ctl_refill(r->ctl[i], MAIN_BLOCK, MAIN_BLOCKS);
    }
    if (o->clients > 1)
        ctl_barrier(r->ctl[0], (uint32_t)nres, (uint32_t)o->clients);
    cpu0 = kvx_tool_process_cpu_ns();
    for (int i = 0; i < npeers; i++)
        tcpu0 += ctl_cpu_ns(r->ctl[i]);
    bytes = rr_loop(r, op, res->op, &start, &end, &nlat, &res->submit_ns_per_block);
    for (int i = 0; i < r->total * npeers; i++)
        all += r->xbytes[i];
    res->init_cpu_s_per_gb = (double)(kvx_tool_process_cpu_ns() - cpu0) / (double)all;
    for (int i = 0; i < npeers; i++)
        tcpu1 += ctl_cpu_ns(r->ctl[i]);
    res->target_cpu_s_per_gb = (double)(tcpu1 - tcpu0) / (double)all;
    secs = (double)(end - start) / 1e9;
    sort_u64(r->lat, (uint64_t)nlat);
    res->bytes = bytes;
    res->size = bytes / ((uint64_t)o->iters * (uint64_t)npeers * r->K); /* mean range length */
    res->blocks = r->K;
    res->start_ns = start;
    res->end_ns = end;
    res->initiator = o->client_index;
    res->gbps = (double)bytes / secs / 1e9;
    res->xfers_per_s = (double)nlat / secs;
    res->p50_us = pct_us(r->lat, (uint64_t)nlat, 50);
    res->p99_us = pct_us(r->lat, (uint64_t)nlat, 99);
    res->max_us = nlat ? (double)r->lat[nlat - 1] / 1e3 : 0;
    res->lat_n = (uint64_t)nlat;
    res->create_ms = r->cl.create_ms;
    res->peer_add_ms = r->cl.peer_add_ms;
    res->md_bytes = r->cl.md_bytes;
    client_transport(&r->cl, res->transport, sizeof(res->transport));
    if (o->verify)
        res->bad = rr_verify(r, op);
    rr_op_free(r);
}

/* This initiator's regions, registered, and the servers' loaded from their blobs. */
static void rr_regions(rrun_t *r)
{
    const struct opts *o = r->o;
    uint8_t *blobs = malloc((size_t)r->n * RR_BLOB_MAX);
    size_t lens[MAX_RREGIONS];
    uint64_t t0, reg_ns = 0;

    if (blobs == NULL)
        die("out of memory");
    for (int k = 0; k < r->n; k++) {
        kvx_region_params_t rp = {0};
        r->lbase[k] = region_alloc(r->bytes);
        kvx_pattern_fill(r->lbase[k], r->bytes, CLIENT_SALT + (uint64_t)o->client_index,
                         RR_SRC + (uint64_t)k, 0);
        t0 = now_ns();
        CHECK_KVX(kvx_region_register(r->cl.t, r->lbase[k], r->bytes, &rp, &r->lid[k]));
        reg_ns += now_ns() - t0;
    }
    r->reg_us = (double)reg_ns / 1e3 / r->n;
    for (int i = 0; i < r->cl.npeers; i++) {
        ctl_regions(r->ctl[i], MAIN_BLOCK, MAIN_BLOCKS, (uint32_t)r->n, r->bytes, blobs, lens);
        for (int k = 0; k < r->n; k++)
            CHECK_KVX(kvx_region_load(r->cl.t, r->cl.peer[i], blobs + (size_t)k * RR_BLOB_MAX,
                                      lens[k], &r->handle[i][k]));
    }
    free(blobs);
}

void ranges_run(const struct opts *o, int *ctl, result_t *res_out, int *nres)
{
    rrun_t r = {.o = o, .ctl = ctl, .n = o->regions};

    /* each region a whole number of pages, so that the patterns' words tile it */
    r.bytes = o->region / (uint64_t)o->regions / 4096 * 4096;
    if (r.bytes < o->ranges_max * (uint64_t)o->clients)
        die("--regions: regions of %llu bytes hold no range of %llu per initiator",
            (unsigned long long)r.bytes, (unsigned long long)o->ranges_max);
    client_open(&r.cl, o, ctl, MAIN_BLOCK, (uint64_t)MAIN_BLOCK * MAIN_BLOCKS);
    rr_regions(&r);
    for (int op = OP_WRITE; op <= OP_READ; op <<= 1) {
        if (!(o->ops & op))
            continue;
        result_t *res = &res_out[(*nres)++];
        rr_op(&r, op, res, *nres);
    }
    for (int k = 0; k < r.n; k++) {
        CHECK_KVX(kvx_region_deregister(r.cl.t, r.lid[k]));
        munmap(r.lbase[k], r.bytes);
    }
    client_close(&r.cl);
}
