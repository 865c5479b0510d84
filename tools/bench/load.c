/*
 * kvx-bench --load: random traffic for a set time, every block read back and compared.
 */
#include "load.h"

#include "client.h"
#include "ctl.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/*
 * --load: random traffic for a given time, every byte checked. Each peer gets `inflight` lanes;
 * a lane owns a slice of the peer's region (this initiator's share of it) and a scratch area
 * here, and loops: write a random number of random local blocks into random blocks of its slice,
 * read those blocks back into its scratch area, compare with what was written. Each completion
 * must name the id its lane waits for: an id that completes twice, or that nobody waits for,
 * fails the run, as does any failed transfer or any wrong byte.
 */
typedef struct lane {
    int peer;
    uint64_t id; /* 0: idle */
    int phase;   /* 0 write in flight, 1 read in flight */
    uint32_t n;
    uint32_t rbase, lscratch, span;
    uint32_t src[4096], dst[4096], scr[4096];
} lane_t;

/* One --load run at one block size. */
typedef struct load {
    const struct opts *o;
    client_t cl;
    lane_t *lanes;
    int nlanes, busy;
    uint64_t half; /* local blocks: sources below, scratch areas above */
    uint64_t blocks_max, rng;
    uint64_t writes, reads, bytes, bad;
} load_t;

static uint64_t rnd(load_t *ld)
{
    ld->rng ^= ld->rng << 13;
    ld->rng ^= ld->rng >> 7;
    ld->rng ^= ld->rng << 17;
    return ld->rng;
}

static void load_lanes(load_t *ld)
{
    const struct opts *o = ld->o;
    int lanes_per_peer = o->inflight < 2 ? 8 : o->inflight, npeers = ld->cl.npeers;
    uint64_t span_r, span, scratch_per_lane;

    ld->half = ld->cl.nb / 2;
    ld->nlanes = lanes_per_peer * npeers;
    span_r = ld->cl.nb / (uint64_t)o->clients;
    span = span_r / (uint64_t)lanes_per_peer;
    scratch_per_lane = (ld->cl.nb - ld->half) / (uint64_t)ld->nlanes;
    ld->blocks_max = o->blocks ? o->blocks : 64;
    if (ld->blocks_max > span)
        ld->blocks_max = span;
    if (ld->blocks_max > scratch_per_lane)
        ld->blocks_max = scratch_per_lane;
    if (ld->blocks_max > 4096)
        ld->blocks_max = 4096;
    if (ld->blocks_max == 0)
        die("--load: the region is too small for %d lanes x %d peers", lanes_per_peer, npeers);
    ld->lanes = calloc((size_t)ld->nlanes, sizeof(*ld->lanes));
    for (int i = 0; i < ld->nlanes; i++) {
        lane_t *l = &ld->lanes[i];
        l->peer = i % npeers;
        l->rbase = (uint32_t)((uint64_t)o->client_index * span_r + (uint64_t)(i / npeers) * span);
        l->lscratch = (uint32_t)(ld->half + (uint64_t)i * scratch_per_lane);
        l->span = (uint32_t)span;
    }
}

/* A new write of n random sources into n distinct random blocks of the lane's slice. */
static void lane_write(load_t *ld, lane_t *l)
{
    l->n = (uint32_t)(1 + rnd(ld) % ld->blocks_max);
    for (uint32_t k = 0; k < l->n; k++) {
        uint32_t d;
        bool dup;
        l->src[k] = (uint32_t)(rnd(ld) % ld->half);
        do {
            d = l->rbase + (uint32_t)(rnd(ld) % l->span);
            dup = false;
            for (uint32_t j = 0; j < k && !dup; j++)
                dup = l->dst[j] == d;
        } while (dup);
        l->dst[k] = d;
        l->scr[k] = l->lscratch + k;
    }
    CHECK_KVX(kvx_xfer_write(ld->cl.t, ld->cl.peer[l->peer], l->src, l->dst, l->n, NULL, &l->id));
    l->phase = 0;
    ld->busy++;
}

/* A completion: a write is read back, a read compared; anything else counts as bad. */
static void load_complete(load_t *ld, const kvx_completion_t *c)
{
    lane_t *l = NULL;

    for (int i = 0; i < ld->nlanes && l == NULL; i++)
        if (ld->lanes[i].id == c->id)
            l = &ld->lanes[i];
    if (l == NULL) {
        fprintf(stderr, "kvx-bench: id %llu completed but nobody waits for it\n",
                (unsigned long long)c->id);
        ld->bad++;
        return;
    }
    if (c->status != 0) {
        fprintf(stderr, "kvx-bench: transfer %llu failed: %s\n", (unsigned long long)c->id,
                kvx_strerror(c->status));
        ld->bad++;
        l->id = 0;
        ld->busy--;
        return;
    }
    ld->bytes += c->bytes;
    if (l->phase == 0) {
        ld->writes++;
        CHECK_KVX(
            kvx_xfer_read(ld->cl.t, ld->cl.peer[l->peer], l->scr, l->dst, l->n, NULL, &l->id));
        l->phase = 1;
        return;
    }
    ld->reads++;
    for (uint32_t k = 0; k < l->n; k++)
        if (kvx_pattern_check(ld->cl.base + (uint64_t)l->scr[k] * ld->cl.size, ld->cl.size,
                              CLIENT_SALT + (uint64_t)ld->o->client_index, l->src[k], 0) != 0)
            ld->bad++;
    l->id = 0;
    ld->busy--;
}

/* Until --load seconds have passed and every lane is idle again. */
static void load_loop(load_t *ld, uint64_t start)
{
    uint64_t end = start + (uint64_t)(ld->o->load_s * 1e9);
    kvx_completion_t comp[64];

    for (;;) {
        bool stopping = now_ns() >= end;
        for (int i = 0; i < ld->nlanes && !stopping; i++)
            if (ld->lanes[i].id == 0)
                lane_write(ld, &ld->lanes[i]);
        if (stopping && ld->busy == 0)
            break;
        int n = kvx_transport_poll(ld->cl.t, NULL, comp, 64);
        if (n < 0)
            die("poll: %s", kvx_strerror(n));
        if (n == 0 && ld->o->wait)
            kvx_transport_wait(ld->cl.t, NULL, 100);
        for (int c = 0; c < n; c++)
            load_complete(ld, &comp[c]);
        progress_line(ld->o->quiet, "load", (int)((now_ns() - start) / 1000000000ull),
                      (int)ld->o->load_s);
    }
}

void load_run(const struct opts *o, int *ctl, uint64_t size, result_t *res_out, int *nres)
{
    load_t ld = {.o = o};
    uint64_t start, stop;

    client_open(&ld.cl, o, ctl, size, o->region);
    load_lanes(&ld);
    ld.rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t)getpid() << 20) ^ now_ns();
    start = now_ns();
    load_loop(&ld, start);
    stop = now_ns();

    result_t *res = &res_out[(*nres)++];
    memset(res, 0, sizeof(*res));
    res->op = "load";
    res->size = size;
    res->blocks = ld.blocks_max;
    res->bytes = ld.bytes;
    res->gbps = (double)ld.bytes / (double)(stop - start);
    res->xfers_per_s = (double)(ld.writes + ld.reads) / ((double)(stop - start) / 1e9);
    res->xfers = ld.writes + ld.reads;
    res->bad = ld.bad;
    res->start_ns = start;
    res->end_ns = stop;
    res->initiator = o->client_index;
    res->create_ms = ld.cl.create_ms;
    res->peer_add_ms = ld.cl.peer_add_ms;
    res->md_bytes = ld.cl.md_bytes;
    client_transport(&ld.cl, res->transport, sizeof(res->transport));
    free(ld.lanes);
    client_close(&ld.cl);
}
